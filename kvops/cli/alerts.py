"""`kvops alerts`: Prometheus alerting rules for the levels, the saturation signals and stale metrics."""

from __future__ import annotations

import click

from kvops.cli.options import (
    Finite,
    capacity_options,
    checked_selector,
    engine_option,
    policy_option,
    runbook_option,
    watch_capacity,
)
from kvops.watch.rules import alert_rules


@click.command()
@engine_option
@click.option(
    "--format",
    "fmt",
    default="rules",
    show_default=True,
    type=click.Choice(("rules", "prometheusrule")),
    help="A plain Prometheus rule file, or a Kubernetes PrometheusRule resource.",
)
@runbook_option
@policy_option
@click.option(
    "--selector",
    metavar="SELECTOR",
    callback=checked_selector,
    help='Label selector for the engine\'s series  [default: {job="<engine>"}]',
)
@click.option(
    "--scrape-interval",
    default=60.0,
    show_default=True,
    type=Finite(0.1, 86400),
    metavar="SECONDS",
    help="Prometheus' scrape interval: the stale rule fires after the policy's stale_after_failures scrapes.",
)
@capacity_options
def alerts(engine, fmt, runbook_url, policy_path, selector, scrape_interval, max_batch_total_tokens, plan, startup_log):
    """Prometheus alerting rules for the three levels, the saturation signals and stale metrics, from the policy.

    With --plan FILE (`kvops plan --json`, any engine), also the recording rules of the KV headroom per replica,
    what `kvops manifests --autoscale` scales on, and the GPU memory in use with its GPUMemoryHigh alert.
    """
    from kvops import engines

    needs_plan = engines.get(engine).needs_capacity
    capacity = watch_capacity(engine, max_batch_total_tokens, plan if needs_plan else None, startup_log)
    sources = {"--max-batch-total-tokens": max_batch_total_tokens, "--plan": plan, "--startup-log": startup_log}
    click.echo(
        alert_rules(
            engine,
            fmt,
            runbook_url=runbook_url,
            policy_path=policy_path,
            selector=selector,
            scrape_interval=scrape_interval,
            capacity=capacity,
            capacity_options=sources,
            plan=plan_figures(engine, plan) if plan else None,
        ),
        nl=False,
    )


def plan_figures(engine: str, path: str):
    """The headroom and memory figures of a `kvops plan --json` file."""
    from kvops.files import read_json
    from kvops.watch.rules import PlanFigures

    data = read_json(path, "--plan")  # a regular file, bounded in size and depth
    return PlanFigures.from_plan(engine, data, f"--plan {path}")
