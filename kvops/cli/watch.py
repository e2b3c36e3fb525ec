"""`kvops watch`, `kvops alerts`, `kvops report`: sense KV pressure, emit the matching alert rules, plot a recording."""

from __future__ import annotations

import math
from pathlib import Path

import click

from kvops.cli.options import POSITIVE, json_option, print_json

ENGINES = click.Choice(("vllm", "tgi"))


class Seconds(click.ParamType):
    """A finite number of seconds within [low, high]: 'nan', 'inf' and out-of-range values are one clear error."""

    name = "seconds"

    def __init__(self, low: float, high: float):
        self.low, self.high = low, high

    def convert(self, value, param, ctx) -> float:
        try:
            number = float(value)
        except (TypeError, ValueError):
            number = math.nan
        valid = f"seconds, from {self.low:g} to {self.high:g}"
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number ({valid})", param, ctx)
        if number < self.low:
            self.fail(f"{number!r} is not in the range x>={self.low:g} ({valid})", param, ctx)
        if number > self.high:
            self.fail(f"{number!r} is not in the range x<={self.high:g} ({valid})", param, ctx)
        return number


MAX_BODY_LIMIT = 1 << 30  # the proxy holds a guarded body in memory


def engine_option(function):
    return click.option("--engine", required=True, type=ENGINES, help="The serving engine whose metrics are read.")(
        function
    )


def policy_option(function):
    return click.option(
        "--policy",
        "policy_path",
        type=click.Path(dir_okay=False),
        metavar="FILE",
        help="Degrade policy YAML (default: the shipped configs/policy.yaml).",
    )(function)


def runbook_option(function):
    return click.option(
        "--runbook-url",
        default="runbooks",
        show_default=True,
        metavar="BASE",
        help="Where the runbooks are published; each alert links BASE/<alertname, lowercased>.md.",
    )(function)


def capacity_options(function):
    """TGI's batch token capacity (max_batch_total_tokens), the denominator of its KV usage."""
    function = click.option(
        "--startup-log",
        type=click.Path(dir_okay=False),
        metavar="FILE",
        help="TGI: read the capacity from its startup log ('Setting max batch total tokens to N').",
    )(function)
    function = click.option(
        "--plan",
        type=click.Path(dir_okay=False),
        metavar="FILE",
        help="TGI: read the capacity from a kvops plan (JSON with max_batch_total_tokens).",
    )(function)
    return click.option(
        "--max-batch-total-tokens",
        type=POSITIVE,
        metavar="N",
        help="TGI: the batch token capacity (its KV pool in tokens).",
    )(function)


@click.command()
@engine_option
@click.option(
    "--metrics-url", metavar="URL", help="Scrape this engine's /metrics directly, e.g. http://127.0.0.1:8000/metrics."
)
@click.option(
    "--prometheus",
    metavar="URL",
    help="Query a Prometheus server instead: one level per replica, and the fleet's worst.",
)
@click.option(
    "--selector",
    metavar="SELECTOR",
    help="With --prometheus: label selector for the engine's series, e.g. '{job=\"vllm\"}'.",
)
@click.option(
    "--replica-label",
    default="instance",
    show_default=True,
    metavar="LABEL",
    help="With --prometheus: the label that tells replicas apart (instance, pod, ...).",
)
@policy_option
@click.option(
    "--interval",
    default=1.0,
    show_default=True,
    type=Seconds(0.05, 3600),
    metavar="SECONDS",
    help="Seconds between polls.",
)
@click.option(
    "--timeout",
    type=Seconds(0.05, 3600),
    metavar="SECONDS",
    help="Give up on a poll after this long; a busy engine's /metrics can take seconds  [default: the interval, within 5-10]",
)
@click.option(
    "--listen",
    metavar="HOST:PORT",
    help="Serve /kvops/metrics, /kvops/policy, /kvops/status and /kvops/healthz here (':PORT': on 127.0.0.1).",
)
@click.option(
    "--admin-token-file",
    type=click.Path(dir_okay=False),
    metavar="FILE",
    help="Require 'Authorization: Bearer <token>' on /kvops/* but /kvops/healthz; the token is the file's first "
    "line  [default: $KVOPS_ADMIN_TOKEN, else no token]",
)
@click.option(
    "--header-timeout",
    default=20.0,
    show_default=True,
    type=Seconds(0.1, 3600),
    metavar="SECONDS",
    help="Answer 408 and close a connection whose request headers are not complete in this time.",
)
@click.option(
    "--webhook",
    metavar="URL",
    help="POST alerts here in Alertmanager's format, e.g. http://alertmanager:9093/api/v2/alerts.",
)
@runbook_option
@click.option(
    "--record",
    type=click.Path(dir_okay=False),
    metavar="FILE.csv",
    help="Append one CSV row per poll and replica (plot it with kvops report).",
)
@capacity_options
@click.option(
    "--proxy",
    "upstream",
    metavar="UPSTREAM_URL",
    help="Also serve the engine's API, forwarding to UPSTREAM_URL with the level's limits applied.",
)
@click.option(
    "--proxy-listen",
    metavar="HOST:PORT",
    help="With --proxy: serve the engine's API here, apart from the /kvops/* endpoints  [default: on --listen]",
)
@click.option(
    "--max-body-size",
    default="8MiB",
    show_default=True,
    metavar="SIZE",
    help="With --proxy: refuse larger request bodies with 413.",
)
@click.option(
    "--body-timeout",
    default=20.0,
    show_default=True,
    type=Seconds(0.1, 3600),
    metavar="SECONDS",
    help="With --proxy: answer 408 when a client's request body stalls this long.",
)
@click.option(
    "--upstream-first-byte-timeout",
    default=600.0,
    show_default=True,
    type=Seconds(0.1, 86400),
    metavar="SECONDS",
    help="With --proxy: answer 504 when the upstream sends no response headers in this time (a whole "
    "non-streamed generation).",
)
@click.option(
    "--upstream-idle-timeout",
    default=300.0,
    show_default=True,
    type=Seconds(0.1, 86400),
    metavar="SECONDS",
    help="With --proxy: end a response whose upstream sends nothing for this long (a stream with an error event).",
)
@click.option(
    "--upstream-connect-timeout",
    default=5.0,
    show_default=True,
    type=Seconds(0.1, 600),
    metavar="SECONDS",
    help="With --proxy: answer 502 when the upstream does not accept the connection in time.",
)
@click.option("--once", is_flag=True, help="Poll once, print the level, usage and actions, and exit.")
@json_option
def watch(
    engine,
    metrics_url,
    prometheus,
    selector,
    replica_label,
    policy_path,
    interval,
    timeout,
    listen,
    admin_token_file,
    header_timeout,
    webhook,
    runbook_url,
    record,
    max_batch_total_tokens,
    plan,
    startup_log,
    upstream,
    proxy_listen,
    max_body_size,
    body_timeout,
    upstream_first_byte_timeout,
    upstream_idle_timeout,
    upstream_connect_timeout,
    once,
    as_json,
):
    """Watch an engine's KV-cache pressure and degrade in three steps: warn, degrade, critical.

    Each poll reads KV usage and the saturation signals, sets the level (with the policy's hysteresis and
    dwell) and the request limits it implies, logs one JSON line per level change, and alerts. The limits are
    served at /kvops/policy for the admission proxy and the vLLM scheduler plugin.
    """
    from kvops.policy import load_policy
    from kvops.watch.service import WatchOptions, admin_token, run
    from kvops.watch.service import once as poll_once
    from kvops.watch.service import watch as run_watch
    from kvops.watch.watcher import EventLog

    listen_at = _listen(listen, "--listen") if listen else None
    proxy_at = _listen(proxy_listen, "--proxy-listen") if proxy_listen else None
    if (metrics_url is None) == (prometheus is None):
        raise click.UsageError("give exactly one of --metrics-url URL (one engine) or --prometheus URL (a fleet)")
    if selector and not prometheus:
        raise click.UsageError("--selector applies to --prometheus only")
    if once and (listen or proxy_listen):
        raise click.UsageError("--once polls once and exits: drop --listen and --proxy-listen")
    if upstream and not (listen or proxy_listen):
        raise click.UsageError("--proxy serves the engine's API on --proxy-listen HOST:PORT (or --listen): add one")
    if proxy_listen and not upstream:
        raise click.UsageError("--proxy-listen is where --proxy serves: add --proxy UPSTREAM_URL")
    if listen_at and proxy_at and listen_at == proxy_at:
        raise click.UsageError(f"--listen and --proxy-listen are both {listen}: give them different ports")
    for option, url in (
        ("--metrics-url", metrics_url),
        ("--prometheus", prometheus),
        ("--webhook", webhook),
        ("--proxy", upstream),
    ):
        if url is not None and not url.startswith(("http://", "https://")):
            raise click.BadParameter(f"{url!r} is not an http(s) URL", param_hint=option)
    options = WatchOptions(
        engine=engine,
        policy=load_policy(policy_path),
        metrics_url=metrics_url,
        prometheus=prometheus,
        selector=_selector(selector),
        replica_label=replica_label,
        interval=interval,
        timeout=timeout if timeout is not None else min(max(interval, 5.0), 10.0),
        listen=listen_at,
        webhook=webhook,
        runbook_url=runbook_url,
        record=Path(record) if record else None,
        capacity_tokens=_capacity(engine, max_batch_total_tokens, plan, startup_log),
        proxy=_proxy_settings(
            upstream,
            engine,
            max_body_size,
            upstream_connect_timeout,
            upstream_first_byte_timeout,
            upstream_idle_timeout,
            body_timeout,
        ),
        proxy_listen=proxy_at,
        header_timeout=header_timeout,
        admin_token=admin_token(admin_token_file),
    )
    if once:
        snapshot = run(poll_once(options))
        if as_json:
            print_json(snapshot.to_dict())
        else:
            click.echo(once_text(snapshot))
        return
    run(run_watch(options, EventLog()))


def _proxy_settings(upstream, engine, max_body_size, connect, first_byte, idle, body):
    if not upstream:
        return None
    from kvops.units import format_bytes, parse_bytes
    from kvops.watch.proxy import ProxySettings

    limit = parse_bytes(max_body_size, "--max-body-size")
    if limit > MAX_BODY_LIMIT:
        raise click.BadParameter(
            f"{max_body_size!r} is more than {format_bytes(MAX_BODY_LIMIT)} (the proxy holds a body in memory)",
            param_hint="--max-body-size",
        )
    return ProxySettings(
        upstream.rstrip("/"),
        engine,
        limit,
        connect_timeout=connect,
        first_byte_timeout=first_byte,
        idle_timeout=idle,
        body_timeout=body,
    )


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
    "--selector", metavar="SELECTOR", help='Label selector for the engine\'s series  [default: {job="<engine>"}]'
)
@click.option(
    "--scrape-interval",
    default=60.0,
    show_default=True,
    type=click.FloatRange(min=0.1),
    metavar="SECONDS",
    help="Prometheus' scrape interval: the stale rule fires after the policy's stale_after_failures scrapes.",
)
@capacity_options
def alerts(engine, fmt, runbook_url, policy_path, selector, scrape_interval, max_batch_total_tokens, plan, startup_log):
    """Prometheus alerting rules for the three levels, the saturation signals and stale metrics, from the policy."""
    capacity = _capacity(engine, max_batch_total_tokens, plan, startup_log)
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
        ),
        nl=False,
    )


def alert_rules(
    engine: str,
    fmt: str,
    *,
    runbook_url: str = "runbooks",
    policy_path: str | None = None,
    selector: str | None = None,
    scrape_interval: float = 60.0,
    capacity: int | None = None,
    capacity_options: dict | None = None,
) -> str:
    """What `kvops alerts` prints, headed by the command that prints it (also used by `kvops manifests`)."""
    from kvops.engines.metrics import selector_matchers
    from kvops.policy import GRADED, load_policy
    from kvops.watch.rules import render
    from kvops.watch.sources import engine_module

    policy = load_policy(policy_path)
    selector = selector if selector is not None else f'{{job="{engine}"}}'
    promql = engine_module(engine).promql(selector_matchers(_selector(selector)), capacity)
    given = {
        "--policy": policy_path,
        "--runbook-url": runbook_url if runbook_url != "runbooks" else None,
        "--selector": f"'{selector}'" if selector != f'{{job="{engine}"}}' else None,
        "--scrape-interval": f"{scrape_interval:g}" if scrape_interval != 60 else None,
        **(capacity_options or {}),
    }
    command = f"kvops alerts --engine {engine} --format {fmt}" + "".join(
        f" {option} {value}" for option, value in given.items() if value is not None
    )
    header = "\n".join(
        [
            f"kvops alert rules for {engine}, generated by `{command}`; regenerate rather than edit.",
            "Thresholds from the policy: "
            + ", ".join(f"{level.label} {policy.thresholds[level]:g}" for level in GRADED)
            + " (KV usage 0-1);",
            f"level alerts hold for min_dwell_seconds {policy.min_dwell_seconds:g} both ways; stale after {policy.stale_after_failures} scrapes of {scrape_interval:g}s.",
        ]
        + (
            [f"KV usage = tgi_batch_current_max_tokens / {capacity} (max batch total tokens)."]
            if engine == "tgi"
            else []
        )
    )
    return render(
        policy, engine, promql, fmt=fmt, runbook_url=runbook_url, scrape_interval=scrape_interval, header=header
    )


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
    from kvops.policy import load_policy
    from kvops.report import load, plot, summarise

    policy = load_policy(policy_path)
    frame = load(csv_file)
    summaries = summarise(frame)
    if out:
        plot(frame, policy, Path(out), f"KV-cache usage, {Path(csv_file).name}")
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
        for at, before, after in summary.level_changes:
            click.echo(f"  {at:9.3f} s  {before} -> {after}")
    if out:
        click.echo(f"plot: {out}")


def once_text(snapshot) -> str:
    usage = "n/a" if snapshot.kv_usage is None else f"{snapshot.kv_usage:.1%}"
    lines = [
        f"level {snapshot.level.label}   kv usage {usage}   source {snapshot.source}",
        f"actions: {', '.join(snapshot.actions) or 'none'}",
        f"alerts:  {', '.join(snapshot.alerts) or 'none'}",
        "",
        f"{'replica':<28} {'level':<9} {'kv usage':>8} {'running':>8} {'waiting':>8}  note",
    ]
    for replica in snapshot.replicas:
        reading = replica["reading"] or {}
        share = "n/a" if replica["kv_usage"] is None else f"{replica['kv_usage']:.1%}"
        firing = [s["name"] for s in replica["signals"] if s["firing"]]
        note = replica["error"] or (f"signals: {', '.join(firing)}" if firing else reading.get("basis", ""))
        lines.append(
            f"{replica['name']:<28} {replica['level']:<9} {share:>8} {_count(reading.get('running')):>8} {_count(reading.get('waiting')):>8}  {note}"
        )
    return "\n".join(lines)


def _count(value) -> str:
    return "-" if value is None else f"{value:g}"


def _selector(selector: str | None) -> str | None:
    from kvops.engines.metrics import selector_matchers

    try:
        selector_matchers(selector)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--selector") from None
    return selector


def _listen(text: str, option: str) -> tuple[str, int]:
    """'HOST:PORT' (IPv6 in brackets); ':PORT' listens on 127.0.0.1 only."""
    from kvops.watch.service import DEFAULT_HOST

    host, colon, port = text.rpartition(":")
    if not colon or not port.isdigit() or not 0 < int(port) < 65536:
        raise click.BadParameter(
            f"{text!r} is not HOST:PORT with a port in 1-65535, e.g. 0.0.0.0:9400 or :9400", param_hint=option
        )
    return (host.strip("[]") or DEFAULT_HOST), int(port)


def _capacity(engine: str, tokens: int | None, plan: str | None, startup_log: str | None) -> int | None:
    given = [
        name
        for name, value in (("--max-batch-total-tokens", tokens), ("--plan", plan), ("--startup-log", startup_log))
        if value is not None
    ]
    if engine != "tgi":
        if given:
            raise click.UsageError(f"{given[0]} applies to --engine tgi only (vLLM exports its KV usage)")
        return None
    if len(given) != 1:
        raise click.UsageError(
            "--engine tgi needs the batch token capacity from exactly one of --max-batch-total-tokens N, --plan FILE, --startup-log FILE"
        )
    from kvops.engines.tgi.metrics import capacity_from_log, capacity_from_plan

    if tokens is not None:
        return tokens
    return capacity_from_plan(plan) if plan else capacity_from_log(startup_log)
