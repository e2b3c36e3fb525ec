"""`kvops report`: a `kvops watch --record` CSV summarised, and plotted with --out."""

from __future__ import annotations

from pathlib import Path

import click

from kvops.cli.options import json_option, needs, policy_option, print_json


@click.command()
@click.argument("csv_file", metavar="FILE.csv", type=click.Path(dir_okay=False))
@click.option(
    "--out",
    type=click.Path(dir_okay=False),
    metavar="FILE.png",
    help="Plot KV usage over time with the level bands and level changes.",
)
@policy_option
@json_option
def report(csv_file, out, policy_path, as_json):
    """Summarise a `kvops watch --record` CSV: time in each level, level changes, peak usage; plot it with --out."""
    needs("plot", "pandas", "matplotlib")
    from kvops.policy import load_policy
    from kvops.render.plots import plot_report
    from kvops.watch.report import load, summarise

    policy = load_policy(policy_path)
    frame = load(csv_file)
    summaries = summarise(frame)
    if out:
        plot_report(frame, policy, out, f"KV-cache usage, {Path(csv_file).name}")
    if as_json:
        print_json({"file": str(csv_file), "plot": out, "replicas": [s.to_dict() for s in summaries]})
        return
    for summary in summaries:
        peak = "n/a" if summary.max_kv_usage is None else f"{summary.max_kv_usage:.1%}"
        click.echo(f"{summary.replica}: {summary.polls} polls ({summary.unknown_polls} unknown), peak KV usage {peak}")
        click.echo(
            "  time in level: "
            + ", ".join(f"{level} {seconds:g} s" for level, seconds in summary.seconds_in_level.items())
        )
        if summary.runs > 1:
            click.echo(
                f"  not watched: {summary.unwatched_seconds:g} s between {summary.runs} runs (counted in no level)"
            )
        for at, before, after in summary.level_changes:
            click.echo(f"  {at:9.3f} s  {before} -> {after}")
    if out:
        click.echo(f"plot: {out}")
