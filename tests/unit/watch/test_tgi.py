"""The TGI path against the fake router (tests/support/tgi_fake.py: TGI's exact /metrics, since TGI cannot run
here): usage = tgi_batch_current_max_tokens / max_batch_total_tokens, the capacity from each of its sources."""

import json

from tests.support.receiver import WebhookReceiver
from tests.support.tgi_fake import TgiFake, write_startup_log
from tests.support.watch_process import WatchProcess

CAPACITY = 16000


def test_tgi_levels_in_turn_with_the_capacity_from_the_startup_log(tmp_path):
    (tmp_path / "policy.yaml").write_text("min_dwell_seconds: 1\nsignals:\n  stall: {seconds: 4, raise_to: critical}\n")
    log = write_startup_log(tmp_path / "tgi.log", CAPACITY)
    with (
        TgiFake() as tgi,
        WebhookReceiver() as receiver,
        WatchProcess(
            "--engine",
            "tgi",
            "--metrics-url",
            tgi.url,
            "--startup-log",
            str(log),
            "--policy",
            str(tmp_path / "policy.yaml"),
            "--interval",
            "0.2",
            "--timeout",
            "5",
            "--webhook",
            receiver.url,
        ) as watch,
    ):
        assert watch.wait_level("ok")["kv_usage"] == 0.0  # a fresh router exports nothing yet
        tgi.metrics.request()
        decode_steps = 0
        for reserved, level in ((11520, "warn"), (14080, "degrade"), (15360, "critical"), (2048, "ok")):
            tgi.metrics.batch(size=reserved // 1024, max_tokens=reserved, queue=0, decode_steps=50)
            tgi.metrics.prefill()
            decode_steps += 50
            document = watch.wait_level(level)
            assert document["kv_usage"] == reserved / CAPACITY
        status = json.loads(watch.get("/kvops/status")[1])
        reading = status["replicas"][0]["reading"]
        assert reading["basis"] == "tgi_batch_current_max_tokens 2048 / 16000 max batch total tokens"
        assert (reading["running"], reading["waiting"], reading["progress_total"], reading["preemptions_total"]) == (
            2,
            0,
            decode_steps,
            None,
        )
        assert [s["name"] for s in status["replicas"][0]["signals"]] == [
            "queue_growth",
            "preemptions",
            "stall",
            "prefix_cache_hit_rate",
            "offload_usage",
            "offload_load_latency",
        ]

        # a stall: 2 requests in the batch, no decode step for 4 s -> critical at 12.8% usage
        stalled = watch.wait_level("critical", timeout=20)
        assert stalled["kv_usage"] == 2048 / CAPACITY
        tgi.metrics.batch(size=0, max_tokens=0, queue=0, decode_steps=1)
        watch.wait_level("ok", timeout=20)
    names = [(e["to"], e["signals"]) for e in watch.events("level_changed")]
    assert names[:4] == [("warn", []), ("degrade", []), ("critical", []), ("ok", [])]
    assert names[4] == ("critical", ["stall"])
    firing = {a["labels"]["alertname"] for a in receiver.alerts() if "endsAt" not in a}
    assert {"KVCacheWarn", "KVCacheDegrade", "KVCacheCritical", "EngineStalled"} <= firing
    stall = next(a for a in receiver.alerts() if a["labels"]["alertname"] == "EngineStalled")
    assert stall["labels"]["serving_engine"] == "tgi" and stall["annotations"]["description"].startswith(
        f"2 requests are running on {tgi.url.split('/')[2]}"
    )


def test_tgi_once_with_the_capacity_from_a_plan_and_from_the_flag(tmp_path, run_kvops):
    plan = tmp_path / "plan.json"
    plan.write_text(
        json.dumps(
            {"engine": "tgi", "flags": {"max-batch-total-tokens": 32768}, "capacity": {"max_batch_total_tokens": 32768}}
        )
    )
    with TgiFake() as tgi:
        tgi.metrics.request()
        tgi.metrics.batch(size=8, max_tokens=24576, queue=5)
        from_plan = json.loads(
            run_kvops(
                "watch", "--engine", "tgi", "--metrics-url", tgi.url, "--plan", str(plan), "--once", "--json", expect=1
            ).stdout
        )
        from_flag = json.loads(
            run_kvops(
                "watch",
                "--engine",
                "tgi",
                "--metrics-url",
                tgi.url,
                "--max-batch-total-tokens",
                "24576",
                "--once",
                "--json",
                expect=2,
            ).stdout
        )
    assert (
        from_plan["level"] == "warn"
        and from_plan["kv_usage"] == 0.75
        and from_plan["actions"] == ["log_warning", "cap_max_tokens:512"]
    )
    assert from_flag["level"] == "critical" and from_flag["kv_usage"] == 1.0
    assert from_flag["replicas"][0]["reading"]["capacity_tokens"] == 24576
