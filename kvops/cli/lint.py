"""`kvops lint FILE|DIR...`: engine metric names the target release no longer exports (or never did), and PromQL
ranges that cannot fire at the scrape interval. Exits 1 on findings (CI), 0 when clean."""

from __future__ import annotations

import json
import re
from pathlib import Path

import click

from kvops.cli.options import Finite


def _releases(values: tuple[str, ...]) -> dict[str, str]:
    from kvops import engines

    releases = {}
    for value in values:
        engine, _, release = value.partition("=")
        if engine not in engines.NAMES or not re.fullmatch(r"\d+(\.\d+)*", release):
            raise click.BadParameter(
                f"{value!r}: want ENGINE=RELEASE, ENGINE one of {', '.join(engines.NAMES)} (e.g. vllm=0.11)",
                param_hint="--release",
            )
        releases[engine] = release
    return releases


@click.command()
@click.argument("paths", nargs=-1, required=True, type=click.Path(exists=True, path_type=Path), metavar="FILE|DIR...")
@click.option(
    "--release",
    "release_values",
    multiple=True,
    metavar="ENGINE=X.Y",
    help="The engine release to check against, per engine [default: the one kvops targets: vllm=0.32, tgi=3.3.7].",
)
@click.option(
    "--scrape-interval",
    type=Finite(0.1, 86400),
    default=15,
    show_default=True,
    metavar="SECONDS",
    help="How often Prometheus scrapes the engines: ranges shorter than two of these never fire.",
)
@click.option("--json", "as_json", is_flag=True, help="Every finding as JSON.")
def lint(paths, release_values, scrape_interval, as_json):
    """Find engine metric names the target release does not export, with the replacement and the release that removed each, in rule files, PrometheusRules, Grafana dashboards, KEDA, HPA and prometheus-adapter configs, production-stack and AIBrix values; and ranges too short for the scrape interval."""
    from kvops.watch.lint import lint as run

    findings = run(paths, _releases(release_values), scrape_interval)
    failing = [finding for finding in findings if finding.fails]
    if as_json:
        click.echo(json.dumps({"findings": [f.to_dict() for f in findings], "failing": len(failing)}, indent=2))
    else:
        for finding in findings:
            click.echo(finding.text())
        click.echo(f"{len(failing)} finding(s) that fail, {len(findings) - len(failing)} note(s)")
    raise SystemExit(1 if failing else 0)
