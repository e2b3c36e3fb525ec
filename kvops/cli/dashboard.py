"""`kvops dashboard`: the Grafana dashboard, from the policy."""

from __future__ import annotations

import click


@click.command()
@click.option(
    "--policy",
    "policy_path",
    type=click.Path(exists=True, dir_okay=False),
    metavar="FILE",
    help="Degrade policy whose levels draw the bands [default: the shipped one].",
)
@click.option(
    "--out",
    "-o",
    type=click.Path(dir_okay=False),
    metavar="FILE.json",
    help="Write the dashboard here instead of printing it.",
)
def dashboard(policy_path, out):
    """The Grafana dashboard: KV usage on the policy's bands, level, queue, preemptions, tokens/s, proxy clamps and rejections, KV demand against the pool, prefix-cache hit rate, GPU memory, TTFT and TPOT, the host KV tier."""
    from kvops.deploy.grafana import dashboard as render
    from kvops.files import check_output_path, write_text
    from kvops.policy import load_policy

    if out:
        check_output_path(out, "--out")
    text = render(load_policy(policy_path))
    if out:
        write_text(out, text, "--out")
        click.echo(f"wrote {out}")
    else:
        click.echo(text, nl=False)
