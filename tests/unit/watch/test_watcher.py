"""The watcher in-process against real HTTP servers: levels, limits, events, alerts, endpoints, record, report."""

import asyncio
import io
import json
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from kvops.policy import Level, load_policy
from kvops.watch.connection import serve
from kvops.watch.server import REGISTRY, WATCHER, create_app
from kvops.watch.sources import ScrapeSource
from kvops.watch.watcher import EventLog, Watcher
from tests.support.extras import needs
from tests.support.metrics_server import MetricsServer, vllm_exposition
from tests.support.receiver import WebhookReceiver
from tests.support.vllm_server import free_port

RUNBOOKS = "https://runbooks.example.org/kvops"


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def policy_file(tmp_path: Path, text: str = "min_dwell_seconds: 5\n") -> Path:
    path = tmp_path / "policy.yaml"
    path.write_text(text)
    return path


def make_watcher(
    server,
    tmp_path,
    *,
    webhook=None,
    policy_text="min_dwell_seconds: 5\nunknown:\n  grace_polls: 0\n",
    timeout=10.0,
    recorder=None,
):
    clock, log = Clock(), io.StringIO()
    watcher = Watcher(
        load_policy(policy_file(tmp_path, policy_text)),
        "vllm",
        ScrapeSource("vllm", server.url, timeout=timeout),
        webhook=webhook,
        runbook_url=RUNBOOKS,
        recorder=recorder,
        log=EventLog(log, wall=clock),
        clock=clock,
        wall=clock,
    )
    return watcher, clock, log


def events(log: io.StringIO, name: str | None = None) -> list[dict]:
    lines = [json.loads(line) for line in log.getvalue().splitlines()]
    return [e for e in lines if name is None or e["event"] == name]


async def walk(watcher, clock, server, steps):
    """Set the served usage, advance the clock, poll: [(seconds, usage), ...] -> the levels seen."""
    seen = []
    for at, usage in steps:
        clock.now = 1000.0 + at
        server.set(vllm_exposition(usage) if isinstance(usage, float) else usage)
        seen.append((await watcher.poll()).level.label)
    return seen


def test_levels_limits_events_and_alertmanager_payloads(tmp_path):
    with MetricsServer() as server, WebhookReceiver() as receiver:
        watcher, clock, log = make_watcher(server, tmp_path, webhook=receiver.url)

        async def run():
            seen = await walk(watcher, clock, server, [(0, 0.50), (1, 0.72), (2, 0.90), (3, 0.97)])
            critical = watcher.current.policy_document()
            seen += await walk(watcher, clock, server, [(4, 0.92), (6, 0.20), (9, 0.20)])
            await watcher.close()
            return seen, critical

        seen, critical = asyncio.run(run())
    assert seen == [
        "ok",
        "warn",
        "degrade",
        "critical",
        "critical",
        "critical",
        "ok",
    ]  # hysteresis at 0.92, dwell until t=8
    assert critical == {
        "level": "critical",
        "kv_usage": 0.97,
        "limits": {
            "level": "critical",
            "max_tokens_cap": 512,
            "single_sequence": True,
            "reject": True,
            "retry_after_seconds": 10,
        },
        "updated_at": 1003.0,
        "source": server.url,
    }
    changes = [(e["from"], e["to"], e["kv_usage"]) for e in events(log, "level_changed")]
    assert changes == [
        ("ok", "warn", 0.72),
        ("warn", "degrade", 0.90),
        ("degrade", "critical", 0.97),
        ("critical", "ok", 0.20),
    ]
    assert events(log, "level_changed")[2]["actions"] == [
        "log_warning",
        "cap_max_tokens:512",
        "single_sequence",
        "reject_503:retry_after=10",
    ]

    alerts = receiver.alerts()
    firing = {a["labels"]["alertname"]: a for a in alerts if "endsAt" not in a}
    resolved = {a["labels"]["alertname"]: a for a in alerts if "endsAt" in a}
    assert set(firing) == set(resolved) == {"KVCacheWarn", "KVCacheDegrade", "KVCacheCritical"}
    critical_alert = firing["KVCacheCritical"]
    assert critical_alert["labels"] == {
        "alertname": "KVCacheCritical",
        "severity": "critical",
        "serving_engine": "vllm",
        "instance": server.target,
    }
    assert critical_alert["annotations"] == {
        "summary": f"KV cache of {server.target} is 95% full or more",
        "description": f"KV cache usage on {server.target} is 97.0% (critical at 95%): new requests are rejected with 503 and Retry-After: 10.",
        "runbook_url": f"{RUNBOOKS}/kvcachecritical.md",
    }
    assert critical_alert["startsAt"] == "1970-01-01T00:16:43.000Z"  # unix 1003
    assert (
        resolved["KVCacheCritical"]["startsAt"] == critical_alert["startsAt"]
        and resolved["KVCacheCritical"]["endsAt"] == "1970-01-01T00:16:49.000Z"
    )
    assert all(
        post["content_type"] == "application/json" and post["path"] == "/api/v2/alerts" for post in receiver.posts
    )


def test_endpoints_and_a_route_added_by_another_module(tmp_path):
    with MetricsServer(vllm_exposition(0.88, running=3, waiting=1)) as server:
        watcher, _clock, _ = make_watcher(server, tmp_path)
        port = free_port()

        async def limits_in_process(request: web.Request) -> web.Response:  # what the admission proxy does
            return web.json_response(request.app[WATCHER].current.limits.to_dict())

        async def run():
            app = create_app(watcher, interval=1.0)
            app.router.add_get("/guard/limits", limits_in_process)
            from prometheus_client import Counter

            Counter(
                "kvops_guard_requests", "Requests seen by a module mounted on the same server.", registry=app[REGISTRY]
            ).inc(3)
            listener = await serve(app, "127.0.0.1", port, header_timeout=20, log=EventLog(None))
            try:
                await watcher.poll()
                async with aiohttp.ClientSession() as session:
                    answers = {}
                    for path in ("/kvops/policy", "/kvops/status", "/kvops/healthz", "/kvops/metrics", "/guard/limits"):
                        async with session.get(f"http://127.0.0.1:{port}{path}") as response:
                            answers[path] = (response.status, response.headers["Content-Type"], await response.text())
                    return answers
            finally:
                await listener.close()
                await watcher.close()

        answers = asyncio.run(run())
    status, content_type, body = answers["/kvops/policy"]
    policy = json.loads(body)
    assert status == 200 and content_type.startswith("application/json")
    assert list(policy) == ["level", "kv_usage", "limits", "updated_at", "source"]
    assert policy["level"] == "degrade" and policy["kv_usage"] == 0.88 and policy["limits"]["single_sequence"] is True
    assert json.loads(answers["/guard/limits"][2]) == policy["limits"]
    status_doc = json.loads(answers["/kvops/status"][2])
    assert status_doc["actions"] == ["log_warning", "cap_max_tokens:512", "single_sequence"]
    assert status_doc["replicas"][0]["reading"]["running"] == 3 and status_doc["alerts"] == [
        "KVCacheDegrade",
        "KVCacheWarn",
    ]
    assert json.loads(answers["/kvops/healthz"][2])["status"] == "ok"
    status, content_type, text = answers["/kvops/metrics"]
    assert content_type.startswith("text/plain; version=0.0.4")
    for line in (
        "kvops_level 2.0",
        "kvops_kv_cache_usage_ratio 0.88",
        'kvops_action_in_force{action="single_sequence"} 1.0',
        'kvops_action_in_force{action="reject_503"} 0.0',
        "kvops_max_tokens_cap 512.0",
        "kvops_polls_total 1.0",
        f'kvops_replica_level{{instance="{server.target}"}} 2.0',
        f'kvops_poll_failures_total{{instance="{server.target}"}} 0.0',
        'kvops_level_changes_total{level="degrade"} 1.0',
        "kvops_alerts_firing 2.0",
        "kvops_guard_requests_total 3.0",
    ):
        assert line in text.splitlines(), line


@pytest.mark.parametrize("mode, cap", [("fail-open", None), ("fail-closed", 512)])
def test_unknown_counts_failures_then_alerts_stale_and_recovers(tmp_path, mode, cap):
    with MetricsServer() as server, WebhookReceiver() as receiver:
        watcher, clock, log = make_watcher(
            server,
            tmp_path,
            webhook=receiver.url,
            policy_text=f"min_dwell_seconds: 5\nunknown:\n  mode: {mode}\n  grace_polls: 0\n  stale_after_failures: 3\n",
        )

        async def run():
            seen = await walk(watcher, clock, server, [(0, 0.90)])
            documents = []
            for at in (1, 2, 3):
                clock.now = 1000.0 + at
                server.set("Internal Server Error", status=500)
                documents.append((await watcher.poll()).policy_document())
            stale_alerts = {a.labels["alertname"] for a in watcher.book.firing.values()}
            await watcher.flush()  # deliver the firing alert before recovery resolves it (else only "resolved" is sent)
            seen += await walk(watcher, clock, server, [(4, 0.10), (10, 0.10)])
            await watcher.close()
            return seen, documents, stale_alerts

        seen, documents, stale_alerts = asyncio.run(run())
    assert seen == ["degrade", "ok"] or seen == ["degrade", "degrade", "ok"]
    assert [d["level"] for d in documents] == ["unknown"] * 3 and all(d["kv_usage"] is None for d in documents)
    assert documents[0]["limits"]["max_tokens_cap"] == cap and documents[0]["limits"]["level"] == "unknown"
    assert stale_alerts == {"KVCacheWarn", "KVCacheDegrade", "KVMetricsStale"}  # unknown holds the level alerts
    assert [
        (e["event"], e["consecutive_failures"]) for e in events(log) if e["event"] in ("poll_failed", "metrics_stale")
    ] == [("poll_failed", 1), ("metrics_stale", 3)]
    assert events(log, "poll_failed")[0]["error"] == f"{server.url} answered HTTP 500 Internal Server Error"
    assert events(log, "poll_recovered")[0]["after_failures"] == 3
    assert watcher.replicas[server.target].failures_total == 3 and watcher.poll_failures_total == 3
    stale = [a for a in receiver.alerts() if a["labels"]["alertname"] == "KVMetricsStale"]
    assert [("endsAt" in a) for a in stale] == [False, True]  # fired after 3 failures, resolved on recovery
    assert stale[0]["annotations"]["description"].startswith(
        f"No usable KV metrics from {server.target} for 3 consecutive polls (3 failed, last: {server.url} answered HTTP 500"
    )


def test_alerts_wait_in_the_outbox_while_the_webhook_fails(tmp_path):
    with MetricsServer() as server, WebhookReceiver(status=503) as receiver:
        watcher, clock, log = make_watcher(server, tmp_path, webhook=receiver.url)

        async def run():
            await walk(watcher, clock, server, [(0, 0.96)])
            await watcher.flush()
            receiver.status = 200
            await walk(watcher, clock, server, [(1, 0.96)])
            await watcher.close()

        asyncio.run(run())
    assert events(log, "webhook_failed")[0]["error"].startswith("RuntimeError: HTTP 503")
    delivered = [a["labels"]["alertname"] for a in receiver.posts[-1]["body"]]
    assert sorted(delivered) == ["KVCacheCritical", "KVCacheDegrade", "KVCacheWarn"] and watcher.webhook_failures >= 1


@needs("pandas")
def test_record_and_report(tmp_path, run_kvops):
    from kvops.watch.record import Recorder

    csv_path, png = tmp_path / "watch.csv", tmp_path / "watch.png"
    with MetricsServer() as server:
        watcher, clock, _ = make_watcher(server, tmp_path, recorder=Recorder(csv_path))

        async def run():
            await walk(watcher, clock, server, [(0, 0.3), (1, 0.75), (2, 0.9), (3, 0.97), (4, 0.5)])
            server.set("garbage", status=200)
            clock.now = 1005.0
            await watcher.poll()
            await walk(watcher, clock, server, [(9, 0.2), (15, 0.1)])  # dwell restarts on return from unknown
            await watcher.close()
            watcher.recorder.close()

        asyncio.run(run())
    rows = csv_path.read_text().splitlines()
    assert (
        rows[0]
        == "time,replica,level,kv_usage,running,waiting,preemptions_total,progress_total,signals,fleet_level,error,"
        "run_started,interval"
    )
    assert len(rows) == 1 + 8
    assert rows[6].startswith(f"1005.000,{server.target},unknown,,") and "not the Prometheus text format" in rows[6]
    report = json.loads(run_kvops("report", str(csv_path), "--out", str(png), "--json").stdout)
    summary = report["replicas"][0]
    assert summary["polls"] == 8 and summary["unknown_polls"] == 1 and summary["max_kv_usage"] == 0.97
    assert [(c["from"], c["to"]) for c in summary["level_changes"]] == [
        ("ok", "warn"),
        ("warn", "degrade"),
        ("degrade", "critical"),
        ("critical", "unknown"),
        ("unknown", "critical"),
        ("critical", "ok"),
    ]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 20_000
    text = run_kvops("report", str(csv_path)).stdout
    assert f"{server.target}: 8 polls (1 unknown), peak KV usage 97.0%" in text and "degrade -> critical" in text


@needs("pandas")
def test_record_refuses_a_foreign_csv(tmp_path, run_kvops):
    path = tmp_path / "other.csv"
    path.write_text("a,b\n1,2\n")
    with MetricsServer(vllm_exposition(0.1)) as server:
        result = run_kvops(
            "watch", "--engine", "vllm", "--metrics-url", server.url, "--once", "--record", str(path), expect=4
        )
    assert (
        result.stderr.strip()
        == f"kvops: error: --record {path}: exists with other columns; give a new file (columns: time,replica,level,kv_usage,running,waiting,preemptions_total,progress_total,signals,fleet_level,error,run_started,interval)"
    )
    assert run_kvops("report", str(path), expect=2).stderr.startswith(
        f"kvops: error: {path}: not a kvops watch --record CSV"
    )


def test_once_json_and_text(run_kvops):
    with MetricsServer(
        vllm_exposition(0.9032258064516129, running=4, waiting=4, preemptions=27, generated=19776)
    ) as server:
        document = json.loads(
            run_kvops("watch", "--engine", "vllm", "--metrics-url", server.url, "--once", "--json", expect=1).stdout
        )
        text = run_kvops("watch", "--engine", "vllm", "--metrics-url", server.url, "--once", expect=1).stdout
    assert document["level"] == "degrade" and document["kv_usage"] == 0.9032258064516129
    assert document["actions"] == ["log_warning", "cap_max_tokens:512", "single_sequence"]
    assert (
        document["replicas"][0]["name"] == server.target
        and document["replicas"][0]["reading"]["preemptions_total"] == 27
    )
    assert text.splitlines()[0] == f"level degrade   kv usage 90.3%   source {server.url}"
    assert f"{server.target:<28} degrade      90.3%        4        4  vllm:kv_cache_usage_perc" in text


def test_once_against_a_dead_engine_says_unknown(run_kvops):
    with MetricsServer() as server:
        url = server.url
    document = json.loads(
        run_kvops("watch", "--engine", "vllm", "--metrics-url", url, "--once", "--json", expect=3).stdout
    )
    assert document["level"] == "unknown" and document["kv_usage"] is None
    # never read: the shipped policy fails closed on the critical level's limits (before issue 20: none)
    assert document["actions"] == ["cap_max_tokens:512", "single_sequence", "reject_503:retry_after=10"]
    assert document["replicas"][0]["error"].startswith(f"cannot read {url}: ClientConnectorError")


@pytest.mark.parametrize(
    "args, message",
    [
        (["--engine", "vllm"], "give exactly one of --metrics-url URL (one engine) or --prometheus URL (a fleet)"),
        (
            ["--engine", "vllm", "--metrics-url", "http://a/metrics", "--prometheus", "http://p:9090"],
            "give exactly one of",
        ),
        (
            ["--engine", "vllm", "--metrics-url", "localhost:8000/metrics"],
            "'localhost:8000/metrics' is not an http(s) URL",
        ),
        (["--engine", "vllm", "--metrics-url", "http://[::1"], "'http://[::1' is not an http(s) URL with a host"),
        (["--engine", "vllm", "--metrics-url", "http://"], "'http://' is not an http(s) URL with a host"),
        (
            ["--engine", "vllm", "--metrics-url", "http://127.0.0.1:99999/metrics"],
            "(and a port 1-65535)",
        ),
        (
            ["--engine", "vllm", "--metrics-url", "http://a/metrics", "--selector", '{job="x"}'],
            "--selector applies to --prometheus only",
        ),
        (
            ["--engine", "vllm", "--prometheus", "http://p:9090", "--selector", "job=x"],
            "'job=x' is not a label selector",
        ),
        (["--engine", "vllm", "--metrics-url", "http://a/metrics", "--listen", "9400"], "'9400' is not HOST:PORT"),
        (
            ["--engine", "vllm", "--metrics-url", "http://a/metrics", "--once", "--listen", ":9400"],
            "--once polls once and exits: drop --listen",
        ),
        (
            ["--engine", "tgi", "--metrics-url", "http://a/metrics"],
            "--engine tgi needs the batch token capacity from exactly one of --max-batch-total-tokens N, --plan FILE, --startup-log FILE",
        ),
        (
            ["--engine", "vllm", "--metrics-url", "http://a/metrics", "--max-batch-total-tokens", "100"],
            "--max-batch-total-tokens applies to --engine tgi only",
        ),
        (
            ["--engine", "vllm", "--metrics-url", "http://a/metrics", "--interval", "0"],
            "0.0 is not in the range x>=0.05",
        ),
        (["--engine", "sglang", "--metrics-url", "http://a/metrics"], "'sglang' is not one of 'vllm', 'tgi'"),
    ],
)
def test_watch_usage_errors_are_one_line(run_kvops, args, message):
    """Under --once (a probe, whose 2 is critical) a usage error exits ONCE_ERROR; without it, click's 2."""
    from kvops.cli.watch import ONCE_ERROR

    result = run_kvops("watch", *args, "--once", expect=ONCE_ERROR) if "--once" not in args else None
    result = result or run_kvops("watch", *args, expect=ONCE_ERROR)
    assert message in result.stderr and len(result.stderr.strip().splitlines()) == 1
    if "--once" not in args:
        plain = run_kvops("watch", *args, expect=2)
        assert message in plain.stderr and len(plain.stderr.strip().splitlines()) == 1


def test_policy_errors_are_one_line(tmp_path, run_kvops):
    path = policy_file(tmp_path, "levels:\n  warn: 0.9\n")
    result = run_kvops(
        "watch",
        "--engine",
        "vllm",
        "--metrics-url",
        "http://127.0.0.1:1/metrics",
        "--policy",
        str(path),
        "--once",
        expect=4,  # ONCE_ERROR: not 1, which is warn
    )
    assert result.stderr.strip() == f"kvops: error: {path}: levels.warn 0.9 must be below levels.degrade 0.85"


def test_level_numbers_match_the_policy():
    assert [int(level) for level in (Level.UNKNOWN, Level.OK, Level.WARN, Level.DEGRADE, Level.CRITICAL)] == [
        -1,
        0,
        1,
        2,
        3,
    ]
