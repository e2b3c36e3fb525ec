"""The watcher against hostile inputs (issue 11): expositions larger than one read, scrapes that fail every other
time, option values that are not numbers, a busy --listen, secrets in headers. Real HTTP on 127.0.0.1."""

from __future__ import annotations

import asyncio
import io
import json
import math
import os
import socket
import subprocess
import sys

import pytest

from kvops.cli.watch import once_text
from kvops.policy import Level, load_policy
from kvops.watch.sources import MAX_BODY_BYTES, PrometheusSource, ScrapeSource
from kvops.watch.watcher import EventLog, Watcher
from tests.support.aio import ServerThread
from tests.support.metrics_server import MetricsServer, data_parallel_exposition, vllm_exposition
from tests.support.processes import REPO, checkout_env
from tests.support.raw_http import exchange, request_bytes, status_of
from tests.support.upstream import RecordingUpstream
from tests.support.watch_process import WatchProcess


def poll_once(url: str, timeout: float = 10):
    async def run():
        source = ScrapeSource("vllm", url, timeout=timeout)
        try:
            return await source.poll()
        finally:
            await source.close()

    return asyncio.run(run())


def test_kv_gauge_after_200_kb_of_other_series_is_read_not_unknown():
    text = data_parallel_exposition([0.42])
    assert text.index("vllm:kv_cache_usage_perc{") > 200_000
    with MetricsServer(text) as server:
        server.trickle = True  # the body arrives in pieces: what one buffered read returns is its first 16 KiB
        poll = poll_once(server.url)
    assert poll.failures == {} and poll.readings[server.target].kv_usage == 0.42


def test_two_engines_the_busy_one_after_200_kb_sets_the_level():
    """Engine 0 at 10%, engine 1 at 97%, in the Prometheus text format (each family once, its samples together),
    200 KB of histograms ahead: the replica reads 97%, not 10% and not unknown."""
    text = data_parallel_exposition([0.10, 0.97])
    with MetricsServer(text) as server:
        server.trickle = True
        poll = poll_once(server.url)
    assert poll.readings[server.target].kv_usage == 0.97


def test_two_engines_split_across_the_body_as_measured_in_the_issue():
    """The shape the issue measured: engine 0's gauge first, engine 1's after 200 KB of other series."""
    first, rest = vllm_exposition(0.10), data_parallel_exposition([0.97], padding_bytes=200_000)
    text = first + rest.replace('engine="0"', 'engine="1"')
    with MetricsServer(text) as server:
        server.trickle = True
        poll = poll_once(server.url)
    assert poll.readings[server.target].kv_usage == 0.97


def test_a_10_mb_exposition_is_read_to_its_end():
    text = data_parallel_exposition([0.10, 0.91], padding_bytes=10_000_000)
    assert len(text) > 10_000_000
    with MetricsServer(text) as server:
        poll = poll_once(server.url, timeout=30)
    assert poll.failures == {} and poll.readings[server.target].kv_usage == 0.91


@pytest.mark.parametrize("declared", [True, False], ids=["content-length", "chunked"])
def test_an_exposition_past_the_limit_is_a_failure_never_a_partial_reading(declared):
    text = data_parallel_exposition([0.97], padding_bytes=MAX_BODY_BYTES + 1)

    async def serve(request):
        from aiohttp import web

        if declared:
            return web.Response(text=text)
        response = web.StreamResponse()
        await response.prepare(request)
        for start in range(0, len(text), 1 << 20):
            await response.write(text[start : start + (1 << 20)].encode())
        return response

    def make_app():
        from aiohttp import web

        app = web.Application()
        app.router.add_get("/metrics", serve)
        return app

    with ServerThread(make_app) as server:
        poll = poll_once(server.url + "/metrics", timeout=60)
    assert poll.readings == {}
    assert list(poll.failures.values()) == [f"{server.url}/metrics sent more than 32 MiB: not an engine's /metrics"]


def test_every_other_scrape_failing_at_97_percent_never_lifts_the_limits():
    """The default policy's grace keeps the level through isolated failures: reject stays on in every sample."""
    with MetricsServer(vllm_exposition(0.97)) as server:
        watcher = Watcher(load_policy(), "vllm", ScrapeSource("vllm", server.url, timeout=10), log=EventLog(None))

        async def run():
            rejects = []
            for index in range(40):
                server.set(status=500 if index % 2 else 200)
                rejects.append((await watcher.poll()).limits.reject)
            await watcher.close()
            return rejects

        rejects = asyncio.run(run())
    assert rejects == [True] * 40


def test_a_dead_metrics_endpoint_keeps_the_last_limits_after_the_grace():
    """Past the grace the replica is unknown; the shipped policy is fail-closed, so critical's limits stay."""
    with MetricsServer(vllm_exposition(0.97)) as server:
        log = io.StringIO()
        watcher = Watcher(load_policy(), "vllm", ScrapeSource("vllm", server.url, timeout=10), log=EventLog(log))

        async def run():
            await watcher.poll()
            server.set(status=500)
            snapshots = [await watcher.poll() for _ in range(4)]
            await watcher.close()
            return snapshots

        snapshots = asyncio.run(run())
    assert [s.level for s in snapshots] == [Level.CRITICAL, Level.CRITICAL, Level.UNKNOWN, Level.UNKNOWN]
    assert all(s.limits.reject for s in snapshots)
    failed = [json.loads(line) for line in log.getvalue().splitlines() if '"poll_failed"' in line]
    assert failed[0]["level"] == "critical" and failed[0]["consecutive_failures"] == 1


@pytest.mark.parametrize(
    "option, value, message",
    [
        (
            "--interval",
            "nan",
            "Invalid value for '--interval': 'nan' is not a finite number (seconds, from 0.05 to 3600)",
        ),
        (
            "--interval",
            "inf",
            "Invalid value for '--interval': 'inf' is not a finite number (seconds, from 0.05 to 3600)",
        ),
        ("--interval", "1e9", "Invalid value for '--interval': 1000000000.0 is not in the range x<=3600"),
        ("--timeout", "nan", "Invalid value for '--timeout': 'nan' is not a finite number"),
        ("--timeout", "-1", "Invalid value for '--timeout': -1.0 is not in the range x>=0.05"),
        ("--header-timeout", "inf", "Invalid value for '--header-timeout': 'inf' is not a finite number"),
        ("--body-timeout", "0", "Invalid value for '--body-timeout': 0.0 is not in the range x>=0.1"),
        ("--upstream-first-byte-timeout", "nan", "Invalid value for '--upstream-first-byte-timeout': 'nan'"),
        ("--upstream-idle-timeout", "-inf", "Invalid value for '--upstream-idle-timeout': '-inf'"),
        ("--upstream-connect-timeout", "1e400", "Invalid value for '--upstream-connect-timeout': '1e400'"),
        ("--max-body-size", "2GiB", "'2GiB' is more than 1 GiB"),
    ],
)
def test_number_options_that_are_not_finite_or_out_of_range_are_one_line(run_kvops, option, value, message):
    args = ["watch", "--engine", "vllm", "--metrics-url", "http://127.0.0.1:1/metrics"]
    args += ["--listen", ":1", "--proxy", "http://127.0.0.1:1"]
    result = run_kvops(*args, option, value, expect=2)
    assert message in result.stderr and len(result.stderr.strip().splitlines()) == 1, result.stderr


def test_listen_on_a_busy_port_is_one_line_and_no_traceback():
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        ran = subprocess.run(
            [sys.executable, "-m", "kvops", "watch", "--engine", "vllm", "--metrics-url", "http://127.0.0.1:1/metrics"]
            + ["--listen", f"127.0.0.1:{port}"],
            cwd=REPO,
            env=checkout_env(),
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert ran.returncode == 1 and ran.stdout == ""
    assert ran.stderr == (
        f"kvops: error: --listen 127.0.0.1:{port}: cannot listen there (address already in use); choose another address\n"
    )


SECRET = "sk-live-8c1f0e2d"


@pytest.mark.parametrize(
    "value",
    [
        f"Bearer {SECRET}",
        f"Bearer {SECRET}" + "x" * 9000,  # past aiohttp's 8190-byte field limit: its error quotes the field
        f"Bearer {SECRET}\x01tail",  # a control byte: aiohttp's error quotes the whole line
        f"Bearer {SECRET}\x00tail",
        f"Bearer {SECRET}\rInjected: 1",
    ],
    ids=["plain", "over-8190-bytes", "control-byte", "nul", "bare-cr"],
)
def test_no_header_value_is_ever_logged(value):
    """Whatever the size or bytes of an Authorization header, kvops watch's whole output (stdout and stderr) never
    contains it, and holds nothing but JSON event lines."""
    with (
        MetricsServer(vllm_exposition(0.2)) as metrics,
        ServerThread(RecordingUpstream().app) as upstream,
        WatchProcess("--engine", "vllm", "--metrics-url", metrics.url, "--proxy", upstream.url) as watch,
    ):
        raw = request_bytes("POST", "/v1/completions", b'{"prompt": "x"}', {"Authorization": "PLACEHOLDER"})
        answer = exchange(watch.port, raw.replace(b"PLACEHOLDER", value.encode("latin-1")), timeout=10)
        assert status_of(answer) in (200, 400, 431)
        watch.stop()
    everything = json.dumps(watch.events()) + "".join(watch.other_output)
    assert SECRET not in everything and not watch.other_output


def test_the_proxy_on_its_own_address_keeps_the_admin_endpoints_off_it():
    from tests.support.vllm_server import free_port

    proxy_port = free_port()
    with (
        MetricsServer(vllm_exposition(0.2)) as metrics,
        ServerThread(RecordingUpstream().app) as upstream,
        WatchProcess(
            "--engine",
            "vllm",
            "--metrics-url",
            metrics.url,
            "--proxy",
            upstream.url,
            "--proxy-listen",
            f"127.0.0.1:{proxy_port}",
        ) as watch,
    ):
        admin_models = exchange(watch.port, request_bytes("GET", "/v1/models"))
        proxied_policy = exchange(proxy_port, request_bytes("GET", "/kvops/policy"))
        proxied_models = exchange(proxy_port, request_bytes("GET", "/v1/models"))
    assert watch.events("started")[0]["proxy_listen"] == f"127.0.0.1:{proxy_port}"
    assert status_of(admin_models) == 404  # the admin address serves /kvops/* only
    assert status_of(proxied_models) == 200 and b"X-KVops-Level: ok" in proxied_models
    assert b'"level"' not in proxied_policy  # forwarded to the engine, which has no such endpoint


# --- readings the watcher cannot use (issue 23): missing data with the grace, never an exit ---------------------


class ScriptedPrometheus(PrometheusSource):
    """A Prometheus source whose answers are scripted: each poll takes the next list of result rows."""

    def __init__(self, answers: list):
        super().__init__("vllm", "http://prometheus:9090", selector=None, replica_label="pod", timeout=1)
        self.answers = list(answers)

    def _query(self):
        return self.answers.pop(0)


def prometheus_row(name: str, value: str, pod: str = "a") -> dict:
    return {"metric": {"__name__": name, "pod": pod, "engine": "0"}, "value": [1.7e9, value]}


GOOD_ROWS = [prometheus_row("vllm:kv_cache_usage_perc", "0.97"), prometheus_row("vllm:num_requests_running", "3")]
MALFORMED_ANSWERS = {
    "a row without metric": [{"value": [1.7e9, "0.5"]}],
    "a row without value": [{"metric": {"__name__": "vllm:kv_cache_usage_perc", "pod": "a"}}],
    "metric as a list": [{"metric": ["vllm:kv_cache_usage_perc"], "value": [1.7e9, "0.5"]}],
    "value of one item": [{"metric": {"__name__": "vllm:kv_cache_usage_perc", "pod": "a"}, "value": [1.7e9]}],
    "a row that is null": [None],
    "a result that is a string": "vector",
    "a finite huge gauge": [*GOOD_ROWS[:1], prometheus_row("vllm:num_requests_running", "1e306")],
    "a huge integer": [*GOOD_ROWS[:1], prometheus_row("vllm:num_requests_waiting", "9" * 400)],
}


def poll_all(watcher: Watcher, polls: int) -> list:
    async def run():
        snapshots = [await watcher.poll() for _ in range(polls)]
        await watcher.close()
        return snapshots

    return asyncio.run(run())


@pytest.mark.parametrize("answer", list(MALFORMED_ANSWERS.values()), ids=list(MALFORMED_ANSWERS))
def test_a_malformed_prometheus_answer_is_missing_data_held_through_the_grace(answer):
    """97% (critical), then three malformed answers: critical through the shipped grace (2 polls), then unknown
    with critical's limits (fail-closed), and the watcher still polls; a good answer brings the level back."""
    source = ScriptedPrometheus([GOOD_ROWS, answer, answer, answer, GOOD_ROWS])
    watcher = Watcher(load_policy(), "vllm", source, log=EventLog(None), request_tokens=4096)
    snapshots = poll_all(watcher, 5)
    assert [s.level for s in snapshots] == [
        Level.CRITICAL,
        Level.CRITICAL,
        Level.CRITICAL,
        Level.UNKNOWN,
        Level.CRITICAL,
    ]
    assert all(s.limits.reject for s in snapshots)
    for snapshot in snapshots:  # what /kvops/status and --once print never fails on it either
        json.dumps(snapshot.to_dict())
        once_text(snapshot)


def test_labels_that_are_not_strings_name_a_replica_as_strings_do():
    """A replica label of 7 beside one of "a": both replicas, sorted, no comparison of an int with a str."""
    source = ScriptedPrometheus([])
    rows = [prometheus_row("vllm:kv_cache_usage_perc", "0.5", pod=7), prometheus_row("vllm:kv_cache_usage_perc", "0.2")]
    assert sorted(source.group(rows).readings) == ["7", "a"]


def test_a_huge_finite_gauge_in_a_scrape_is_missing_data_not_an_overflow():
    """`vllm:num_requests_running 1e306` times a request's tokens is Inf, which round() refuses: the reading is
    refused first, the replica fails as on a bad scrape, and the watcher goes on."""
    with MetricsServer(vllm_exposition(0.5, running=1e306)) as server:
        source = ScrapeSource("vllm", server.url, timeout=10)
        watcher = Watcher(load_policy(), "vllm", source, log=EventLog(None), request_tokens=4096)
        snapshots = poll_all(watcher, 2)
    replica = snapshots[-1].replicas[0]
    assert snapshots[-1].level == Level.UNKNOWN and "1e+306" in replica["error"]
    once_text(snapshots[-1])


class BrokenSource:
    """A source whose poll raises what no source should: the watcher takes it as missing data."""

    url = "http://broken/metrics"
    replica_label = "instance"

    async def poll(self):
        raise KeyError("metric")

    async def close(self) -> None:
        return None


def test_a_source_that_raises_is_missing_data_not_an_exit():
    snapshots = poll_all(Watcher(load_policy(), "vllm", BrokenSource(), log=EventLog(None)), 3)
    assert [s.level for s in snapshots] == [Level.UNKNOWN] * 3
    assert "the source failed: KeyError" in snapshots[-1].replicas[0]["error"]


def test_a_reading_with_a_value_no_engine_reports_is_refused_whatever_its_field():
    """Every number a Reading carries is checked, fields the engines add later too."""
    from kvops.engines.metrics import Reading
    from kvops.watch.watcher import unusable_reading

    assert unusable_reading(Reading(0.5, "x", running=3, waiting=0)) is None
    assert "waiting is inf" in unusable_reading(Reading(0.5, "x", waiting=math.inf))
    assert "used_tokens is 1e+300" in unusable_reading(Reading(0.5, "x", used_tokens=1e300))
    assert "kv_usage is nan" in unusable_reading(Reading(math.nan, "x"))


# --- `kvops watch --once`: errors exit 4, apart from the levels' 1-3 -------------------------------------------

ONCE = ["watch", "--engine", "vllm", "--metrics-url", "http://127.0.0.1:9/metrics", "--once", "--timeout", "1"]


def test_once_exit_codes_tell_an_error_from_a_level(tmp_path, run_kvops):
    from kvops.cli.watch import ONCE_ERROR

    fifo = tmp_path / "policy.yaml"
    os.mkfifo(fifo)
    assert ONCE_ERROR == 4
    assert run_kvops(*ONCE, expect=3).exit_code == 3  # nothing listening: unknown, a level
    bad_policy = run_kvops(*ONCE, "--policy", str(fifo), expect=ONCE_ERROR)  # a FIFO: refused, not waited on
    assert "FIFO" in bad_policy.stderr and len(bad_policy.stderr.strip().splitlines()) == 1
    assert run_kvops(*ONCE, "--interval", "nan", expect=ONCE_ERROR).stderr.count("\n") == 1  # a usage error: not 2
    run_kvops(*ONCE[:-3], "--interval", "nan", expect=2)  # without --once, click's usage code


def test_once_exits_4_on_a_fault_of_kvops_itself(monkeypatch):
    """A crash under --once is an error for the probe (4), not warn (1); its traceback stays on stderr."""
    from click.testing import CliRunner

    from kvops.cli import main
    from kvops.watch import service

    async def crash(options):
        raise RuntimeError("a bug")

    monkeypatch.setattr(service, "once", crash)
    with pytest.raises(SystemExit) as done:
        main.main(args=ONCE, prog_name="kvops")
    assert done.value.code == 4
    assert CliRunner().invoke(main, ["watch", "--help"]).output.count("4 error") == 1
