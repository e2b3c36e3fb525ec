"""Metric sources: a recorded vLLM /metrics, TGI's wire format, faults over real HTTP, Prometheus query results."""

import asyncio
import json
import re

import pytest

from kvops.engines.metrics import MetricsError, Samples, selector_matchers
from kvops.engines.tgi import metrics as tgi
from kvops.engines.vllm import metrics as vllm
from kvops.errors import UsageError
from kvops.watch.sources import PrometheusSource, ScrapeSource
from tests.support.extras import needs
from tests.support.metrics_server import VLLM_RECORDED, MetricsServer, vllm_exposition
from tests.support.tgi_fake import TgiFake, TgiMetrics, write_startup_log


def test_vllm_reading_from_a_recorded_exposition():
    reading = vllm.reading(Samples.from_exposition(VLLM_RECORDED.read_text()))
    assert reading.kv_usage == pytest.approx(28 / 31)  # 28 of the 31 usable blocks
    assert reading.basis == "vllm:kv_cache_usage_perc"
    assert (reading.running, reading.waiting, reading.preemptions_total, reading.progress_total) == (4, 4, 27, 19776)
    assert (reading.prefix_hits_total, reading.prefix_queries_total) == (0, 1176)
    assert (reading.capacity_tokens, reading.block_size) == (4096, 128)


def test_skipping_the_lines_the_watcher_does_not_read_changes_nothing():
    text = VLLM_RECORDED.read_text()
    assert vllm.reading(Samples.from_exposition(text, only=vllm.SERIES)) == vllm.reading(Samples.from_exposition(text))
    renamed = vllm_exposition(0.5, rename={"vllm:kv_cache_usage_perc": "vllm:kv_cache_usage_ratio"})
    with pytest.raises(
        MetricsError, match=re.escape("among 130 metric names; found vllm:kv_cache_usage_ratio: renamed?")
    ):
        vllm.reading(Samples.from_exposition(renamed, only=vllm.SERIES))
    with pytest.raises(MetricsError, match="not the Prometheus text format"):
        Samples.from_exposition("<html>oops</html>\n", only=vllm.SERIES)


def test_vllm_removed_alias_is_read_when_the_new_name_is_absent():
    text = vllm_exposition(0.42, rename={"vllm:kv_cache_usage_perc": "vllm:gpu_cache_usage_perc"})
    reading = vllm.reading(Samples.from_exposition(text))
    assert reading.kv_usage == 0.42 and reading.basis == "vllm:gpu_cache_usage_perc (removed alias)"


def test_vllm_data_parallel_engines_take_the_highest_usage_and_sum_the_counts():
    line = 'vllm:{name}{{engine="{engine}",model_name="m"}} {value}\n'
    text = "".join(
        line.format(name=n, engine=e, value=v)
        for n, e, v in [
            ("kv_cache_usage_perc", 0, 0.5),
            ("kv_cache_usage_perc", 1, 0.8),
            ("num_requests_running", 0, 3),
            ("num_requests_running", 1, 4),
        ]
    )
    reading = vllm.reading(Samples.from_exposition(text))
    assert reading.kv_usage == 0.8 and reading.running == 7 and reading.preemptions_total is None


@pytest.mark.parametrize(
    "text, message",
    [
        (vllm_exposition("NaN"), "vllm:kv_cache_usage_perc is NaN"),
        (vllm_exposition(1.7), "vllm:kv_cache_usage_perc is 1.7, outside 0-1"),
        (
            vllm_exposition(0.5, rename={"vllm:kv_cache_usage_perc": "vllm:kv_cache_usage_ratio"}),
            "found vllm:kv_cache_usage_ratio: renamed?",
        ),
        ("<html><body>502 Bad Gateway</body></html>\n", "not the Prometheus text format"),
        ('{"detail": "Not Found"}', "not the Prometheus text format"),
        ("", "no samples at all (expected vllm:kv_cache_usage_perc)"),
        (
            "process_open_fds 12\n",
            "no vllm:kv_cache_usage_perc (nor the removed vllm:gpu_cache_usage_perc) among 1 metric names: not a vLLM /metrics",
        ),
    ],
    ids=["nan", "out-of-range", "renamed", "html", "json", "empty", "other-exporter"],
)
def test_vllm_unusable_metrics_say_why(text, message):
    with pytest.raises(MetricsError) as error:
        vllm.reading(Samples.from_exposition(text))
    assert message in str(error.value)


def test_tgi_usage_is_the_batch_reservation_over_the_capacity():
    metrics = TgiMetrics()
    metrics.request()
    metrics.prefill()
    metrics.batch(size=6, max_tokens=12288, queue=3, decode_steps=40)
    text = metrics.render()
    assert "# TYPE tgi_request_count counter\ntgi_request_count 1\n" in text  # no _total, an integer
    assert "tgi_batch_current_max_tokens 12288\n" in text  # Rust prints the f64 without .0
    reading = tgi.reading(Samples.from_exposition(text), 16000)
    assert reading.kv_usage == 12288 / 16000
    assert reading.basis == "tgi_batch_current_max_tokens 12288 / 16000 max batch total tokens"
    assert (reading.running, reading.waiting, reading.progress_total, reading.preemptions_total) == (6, 3, 40, None)


def test_tgi_fresh_router_serves_nothing_and_reads_as_empty():
    assert TgiMetrics().render() == ""
    reading = tgi.reading(Samples.from_exposition(""), 16000)
    assert reading.kv_usage == 0.0 and "no batch has run yet" in reading.basis
    first = TgiMetrics()
    first.request()  # queued, no batch yet: still nothing to measure, not a renamed metric
    assert tgi.reading(Samples.from_exposition(first.render()), 16000).kv_usage == 0.0


@pytest.mark.parametrize(
    "change, message",
    [
        (
            lambda t: t.replace("tgi_batch_current_max_tokens", "tgi_batch_current_reserved_tokens"),
            "no tgi_batch_current_max_tokens among",
        ),
        (
            lambda t: t.replace("tgi_batch_current_max_tokens 12288", "tgi_batch_current_max_tokens -5"),
            "-5 is below 0",
        ),
        (
            lambda t: t.replace("tgi_batch_current_max_tokens 12288", "tgi_batch_current_max_tokens NaN"),
            "tgi_batch_current_max_tokens is NaN",
        ),
    ],
)
def test_tgi_unusable_metrics_say_why(change, message):
    metrics = TgiMetrics()
    metrics.request()
    metrics.prefill()
    metrics.batch(size=6, max_tokens=12288, queue=0)
    with pytest.raises(MetricsError) as error:
        tgi.reading(Samples.from_exposition(change(metrics.render())), 16000)
    assert message in str(error.value)


def test_tgi_capacity_from_the_startup_log_and_from_a_plan(tmp_path):
    assert tgi.capacity_from_log(write_startup_log(tmp_path / "tgi.log", 16000)) == 16000
    json_log = tmp_path / "json.log"
    json_log.write_text(
        '{"timestamp":"2026-01-08T10:00:09Z","level":"INFO","fields":{"message":"Setting max batch total tokens to 123456"},"target":"text_generation_router_v3"}\n'
    )
    assert tgi.capacity_from_log(json_log) == 123456
    plans = {
        "nested.json": {"engine": "tgi", "capacity": {"max_batch_total_tokens": 98304, "kv_bytes": 12884901888}},
        "flags.json": {"flags": ["--max-batch-total-tokens", "65536", "--max-total-tokens", "4096"]},
        "equals.json": {"flags": ["--max-batch-total-tokens=32768"]},
        "command.json": {"command": "text-generation-launcher --model-id m --max-batch-total-tokens 8192"},
    }
    for name, plan in plans.items():
        (tmp_path / name).write_text(json.dumps(plan))
    assert [tgi.capacity_from_plan(tmp_path / name) for name in plans] == [98304, 65536, 32768, 8192]


@pytest.mark.parametrize(
    "content, message",
    [
        ('{"flags": []}', "--plan {path}: no max_batch_total_tokens (a positive integer key"),
        (
            '{"a": {"max_batch_total_tokens": 1}, "b": {"max_batch_total_tokens": 2}}',
            "--plan {path}: conflicting (1, 2) max_batch_total_tokens",
        ),
        ("{not json", "--plan {path}: not valid JSON (line 1"),
    ],
)
def test_tgi_plan_errors_are_one_line(tmp_path, content, message):
    path = tmp_path / "plan.json"
    path.write_text(content)
    with pytest.raises(UsageError) as error:
        tgi.capacity_from_plan(path)
    assert message.format(path=path) in str(error.value) and "\n" not in str(error.value)


def test_tgi_log_without_the_line(tmp_path):
    path = tmp_path / "tgi.log"
    path.write_text("INFO text_generation_launcher: Starting shard\n")
    with pytest.raises(UsageError, match="no line 'Setting max batch total tokens to N'"):
        tgi.capacity_from_log(path)


def _poll(source):
    async def run():
        try:
            return await source.poll()
        finally:
            await source.close()

    return asyncio.run(run())


def test_scrape_source_reads_a_real_http_endpoint():
    with MetricsServer(vllm_exposition(0.73, running=5)) as server:
        poll = _poll(ScrapeSource("vllm", server.url, timeout=10))
    assert poll.failures == {} and poll.readings[server.target].kv_usage == 0.73


def test_scrape_source_reads_the_tgi_fake():
    with TgiFake() as fake:
        fake.metrics.request()
        fake.metrics.batch(size=2, max_tokens=4096, queue=0)
        poll = _poll(ScrapeSource("tgi", fake.url, timeout=10, capacity_tokens=16384))
    assert next(iter(poll.readings.values())).kv_usage == 0.25


@pytest.mark.parametrize(
    "fault, message",
    [
        (dict(status=500, body="Internal Server Error"), "answered HTTP 500 Internal Server Error"),
        (dict(status=200, delay=2.0), "no answer from http://127.0.0.1:{port}/metrics within 0.5 s"),
        (dict(status=200, body="\x00\x01\x02 garbage {{{"), "not the Prometheus text format"),
        (dict(status=200, body=vllm_exposition("NaN")), "vllm:kv_cache_usage_perc is NaN"),
        (
            dict(status=200, body=vllm_exposition(0.5, rename={"vllm:kv_cache_usage_perc": "vllm:kv_cache_usage"})),
            "renamed?",
        ),
    ],
    ids=["500", "hang", "garbage", "nan", "renamed"],
)
def test_scrape_source_faults_become_replica_failures(fault, message):
    with MetricsServer() as server:
        server.set(fault.get("body", vllm_exposition(0.5)), status=fault["status"], delay=fault.get("delay", 0.0))
        poll = _poll(ScrapeSource("vllm", server.url, timeout=0.5))
        assert poll.readings == {}
        assert message.format(port=server.server_address[1]) in poll.failures[server.target]


def test_scrape_source_engine_not_listening():
    with MetricsServer() as server:
        url, target = server.url, server.target
    poll = _poll(ScrapeSource("vllm", url, timeout=1))
    assert poll.failures[target].startswith(f"cannot read {url}: ClientConnectorError")


def test_prometheus_rows_group_into_replicas():
    source = PrometheusSource("vllm", "http://prometheus:9090", selector='{job="vllm"}', replica_label="pod", timeout=1)
    assert source.query.startswith(
        '{__name__=~"vllm:kv_cache_usage_perc|vllm:gpu_cache_usage_perc|'
    ) and source.query.endswith('|up",job="vllm"}')

    def row(name, pod, value, **labels):
        return {"metric": {"__name__": name, "pod": pod, "job": "vllm", **labels}, "value": [1.7e9, value]}

    poll = source.group(
        [
            row("vllm:kv_cache_usage_perc", "a", "0.9", engine="0"),
            row("vllm:num_preemptions_total", "a", "3", engine="0"),
            row("up", "a", "1"),
            row("vllm:kv_cache_usage_perc", "b", "0.2", engine="0"),
            row("up", "b", "1"),
            row("up", "c", "0"),
            row("vllm:kv_cache_usage_perc", "d", "NaN", engine="0"),
            row("up", "d", "1"),
            row("vllm:num_requests_running", "e", "2"),
            row("up", "e", "1"),
        ]
    )
    assert {k: v.kv_usage for k, v in poll.readings.items()} == {"a": 0.9, "b": 0.2}
    assert poll.readings["a"].preemptions_total == 3
    assert poll.failures == {
        "c": "target down in Prometheus (up == 0)",
        "d": "vllm:kv_cache_usage_perc is NaN",
        "e": "no vllm:kv_cache_usage_perc (nor the removed vllm:gpu_cache_usage_perc) among 1 metric names: not a vLLM /metrics, or the metric was renamed",
    }


@needs("prometheus_api_client")
def test_prometheus_unreachable_is_a_source_error():
    with MetricsServer() as server:
        url = server.url.removesuffix("/metrics")
    poll = _poll(PrometheusSource("vllm", url, selector=None, replica_label="instance", timeout=1))
    assert poll.readings == {} and poll.error.startswith(f"cannot query Prometheus {url}: ConnectionError")


def test_selectors():
    assert selector_matchers('{job="vllm", namespace=~"llm-.*",}') == ['job="vllm"', 'namespace=~"llm-.*"']
    assert selector_matchers(None) == [] and selector_matchers("{}") == []
    for bad in ('job="vllm"', "{job=vllm}", '{job="vllm" pod="a"}'):
        with pytest.raises(ValueError, match="is not a label selector"):
            selector_matchers(bad)


def test_tgi_tokens_past_the_capacity_read_as_full_and_say_why():
    """With prefix caching TGI's batch max_tokens counts a shared prompt block once per request holding it, so it can
    pass max_batch_total_tokens while the router serves: full, not an unknown level (it had been an error)."""
    metrics = TgiMetrics()
    metrics.request()
    metrics.prefill()
    metrics.batch(size=6, max_tokens=20000, queue=0)
    reading = tgi.reading(Samples.from_exposition(metrics.render()), 16000)
    assert reading.kv_usage == 1.0
    assert "read as full: TGI counts a block the prefix cache shares once per request" in reading.basis
