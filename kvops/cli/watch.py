"""`kvops watch`: the sidecar that senses KV pressure, sets the level, alerts, and (with --proxy) admits requests."""

from __future__ import annotations

import os
from pathlib import Path

import click

from kvops.cli.options import (
    POSITIVE,
    Finite,
    capacity_options,
    checked_selector,
    engine_option,
    json_option,
    policy_option,
    print_json,
    runbook_option,
    watch_capacity,
)

MAX_BODY_LIMIT = 1 << 30  # the proxy holds a guarded body in memory
# `--once` as a probe: 0 ok, 1 warn or degrade (serving, with limits), 2 critical (refusing), 3 unknown (no usable
# reading: the engine is down or its metrics are garbage), 4 an error (kvops could not poll at all)
ONCE_EXIT = {"ok": 0, "warn": 1, "degrade": 1, "critical": 2, "unknown": 3}
ONCE_ERROR = 4


class ProbeCommand(click.Command):
    """`kvops watch`. With --once it is a probe whose 1-3 are levels, so its errors get a code of their own:
    click's usage errors exit 2 and kvops' errors 1 elsewhere, the codes of critical and warn."""

    def error_exit_code(self, args: list[str]) -> int | None:
        return ONCE_ERROR if "--once" in args else None


@click.command(cls=ProbeCommand)
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
    callback=checked_selector,
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
    type=Finite(0.05, 3600),
    metavar="SECONDS",
    help="Seconds between polls.",
)
@click.option(
    "--timeout",
    type=Finite(0.05, 3600),
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
    type=Finite(0.1, 3600),
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
    type=Finite(0.1, 3600),
    metavar="SECONDS",
    help="With --proxy: answer 408 when a client's request body stalls this long.",
)
@click.option(
    "--upstream-first-byte-timeout",
    default=600.0,
    show_default=True,
    type=Finite(0.1, 86400),
    metavar="SECONDS",
    help="With --proxy: answer 504 when the upstream sends no response headers in this time (a whole "
    "non-streamed generation).",
)
@click.option(
    "--upstream-idle-timeout",
    default=300.0,
    show_default=True,
    type=Finite(0.1, 86400),
    metavar="SECONDS",
    help="With --proxy: end a response whose upstream sends nothing for this long (a stream with an error event).",
)
@click.option(
    "--upstream-connect-timeout",
    default=5.0,
    show_default=True,
    type=Finite(0.1, 600),
    metavar="SECONDS",
    help="With --proxy: answer 502 when the upstream does not accept the connection in time.",
)
@click.option(
    "--trust-priority-from",
    envvar="KVOPS_TRUST_PRIORITY_FROM",
    callback=lambda ctx, param, value: _networks(value),
    metavar="CIDR[,CIDR]",
    help="With --proxy: read X-KVops-Priority (a vLLM priority: the request's class) only from clients in these "
    "networks, the gateway that sets it; from others it is ignored and dropped  [default: "
    "$KVOPS_TRUST_PRIORITY_FROM, else no one: every request is standard]",
)
@click.option(
    "--request-tokens",
    type=POSITIVE,
    metavar="N",
    help="KV tokens one request holds at its peak, for the headroom signal  [default: the policy's "
    "headroom.request_tokens, else the engine's max-model-len]",
)
@click.option(
    "--once",
    is_flag=True,
    help="Poll once, print the level, usage and actions, and exit 0 ok, 1 warn or degrade, 2 critical, 3 unknown "
    "(no usable reading), 4 error (a bad option or file, or a fault of kvops: nothing was polled); a readiness or "
    "liveness probe.",
)
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
    trust_priority_from,
    request_tokens,
    once,
    as_json,
):
    """Watch an engine's KV-cache pressure and degrade in three steps: warn, degrade, critical.

    Each poll reads KV usage and the saturation signals, sets the level (with the policy's hysteresis and
    dwell) and the request limits it implies, logs one JSON line per level change, and alerts. The limits are
    served at /kvops/policy for the admission proxy and the vLLM scheduler plugin.
    """
    from kvops.files import is_http_url
    from kvops.policy import load_policy
    from kvops.settings import check_names
    from kvops.watch.service import WatchOptions, admin_token, run
    from kvops.watch.service import once as poll_once
    from kvops.watch.service import watch as run_watch
    from kvops.watch.watcher import EventLog

    check_names(os.environ)
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
    if trust_priority_from and not upstream:
        raise click.UsageError("--trust-priority-from applies to --proxy: add --proxy UPSTREAM_URL")
    if listen_at and proxy_at and listen_at == proxy_at:
        raise click.UsageError(f"--listen and --proxy-listen are both {listen}: give them different ports")
    for option, url in (
        ("--metrics-url", metrics_url),
        ("--prometheus", prometheus),
        ("--webhook", webhook),
        ("--proxy", upstream),
    ):
        if url is not None and not is_http_url(url):
            raise click.BadParameter(
                f"{url!r} is not an http(s) URL with a host (and a port 1-65535)", param_hint=option
            )
    options = WatchOptions(
        engine=engine,
        policy=load_policy(policy_path),
        metrics_url=metrics_url,
        prometheus=prometheus,
        selector=selector,
        replica_label=replica_label,
        interval=interval,
        timeout=timeout if timeout is not None else min(max(interval, 5.0), 10.0),
        listen=listen_at,
        webhook=webhook,
        runbook_url=runbook_url,
        record=Path(record) if record else None,
        capacity_tokens=watch_capacity(engine, max_batch_total_tokens, plan, startup_log),
        proxy=_proxy_settings(
            upstream,
            engine,
            max_body_size,
            upstream_connect_timeout,
            upstream_first_byte_timeout,
            upstream_idle_timeout,
            body_timeout,
            trust_priority_from,
        ),
        proxy_listen=proxy_at,
        header_timeout=header_timeout,
        admin_token=admin_token(admin_token_file),
        request_tokens=request_tokens,
    )
    if once:
        snapshot = run(poll_once(options))
        if as_json:
            print_json(snapshot.to_dict())
        else:
            click.echo(once_text(snapshot))
        raise click.exceptions.Exit(ONCE_EXIT[snapshot.level.label])
    run(run_watch(options, EventLog()))


def _networks(text: str | None) -> tuple:
    """--trust-priority-from's networks; one error line naming the one that is not a network."""
    from kvops.watch.guard import parse_networks

    try:
        return parse_networks(text or "")
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--trust-priority-from") from None


def _proxy_settings(upstream, engine, max_body_size, connect, first_byte, idle, body, trusted):
    if not upstream:
        return None
    from urllib.parse import urlsplit

    from kvops.units import format_bytes, parse_bytes
    from kvops.watch.proxy import ProxySettings

    parts = urlsplit(upstream)
    if "@" in parts.netloc or parts.query or parts.fragment or upstream.endswith(("?", "#")):
        raise click.BadParameter(
            f"{upstream!r}: the proxy sends no credentials, query or fragment of its own (each client's headers and "
            "query go through); give scheme://host:port[/prefix]",
            param_hint="--proxy",
        )
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
        trust_priority_from=trusted,
    )


def once_text(snapshot) -> str:
    usage = "n/a" if snapshot.kv_usage is None else f"{snapshot.kv_usage:.1%}"
    lines = [
        f"level {snapshot.level.label}   kv usage {usage}   source {snapshot.source}",
        f"actions: {', '.join(snapshot.actions) or 'none'}",
        f"alerts:  {', '.join(snapshot.alerts) or 'none'}",
        f"headroom: {_headroom_text(snapshot.headroom)}",
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


def _headroom_text(fleet: dict | None) -> str:
    if fleet is None:
        return "n/a (no pool size or request size)"
    return (
        f"{fleet['headroom_tokens']:,} KV tokens free of {fleet['usable_tokens']:,} "
        f"(demand {fleet['demand_tokens']:,}, {fleet['demand_ratio']:.1%} of the pool)"
    )


def _count(value) -> str:
    return "-" if value is None else f"{value:g}"


def _listen(text: str, option: str) -> tuple[str, int]:
    """'HOST:PORT' (IPv6 in brackets); ':PORT' listens on 127.0.0.1 only."""
    from kvops.watch.service import DEFAULT_HOST

    host, colon, port = text.rpartition(":")
    if not colon or not port.isdigit() or not 0 < int(port) < 65536:
        raise click.BadParameter(
            f"{text!r} is not HOST:PORT with a port in 1-65535, e.g. 0.0.0.0:9400 or :9400", param_hint=option
        )
    return (host.strip("[]") or DEFAULT_HOST), int(port)
