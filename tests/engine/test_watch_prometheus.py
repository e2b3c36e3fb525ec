"""Through a real Prometheus (Debian's package) scraping the real vLLM engine and a second replica (a real HTTP
server serving a recorded vLLM exposition at 72%, nothing running): one level per replica, the fleet's worst, `--once --json`
per replica, and the `kvops alerts` rules evaluated by that Prometheus on the same series."""

import json

import pytest

from tests.support.daemons import PROMETHEUS, PrometheusServer
from tests.support.kv_load import DEGRADE, FULL, STAGED_POLICY, WARN, KvLoad
from tests.support.metrics_server import MetricsServer, vllm_exposition
from tests.support.watch_process import WatchProcess

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(
        PROMETHEUS is None, reason="prometheus not installed (apt-get install prometheus; .ci/run does)"
    ),
]


def test_fleet_levels_per_replica_and_the_worst(vllm_engine, tmp_path, run_kvops):
    policy, rules_policy, rules = tmp_path / "policy.yaml", tmp_path / "rules-policy.yaml", tmp_path / "rules.yaml"
    policy.write_text(STAGED_POLICY)
    rules_policy.write_text(STAGED_POLICY.replace("min_dwell_seconds: 15", "min_dwell_seconds: 1"))  # rules: for 1s
    rules.write_text(
        run_kvops("alerts", "--engine", "vllm", "--policy", str(rules_policy), "--scrape-interval", "2").stdout
    )
    engine = f"127.0.0.1:{vllm_engine.port}"
    # 2 s scrapes: a timeout as long as the interval, for an engine busy on 2 shared cores
    with (
        MetricsServer(vllm_exposition(0.72)) as second,
        PrometheusServer(
            tmp_path / "prometheus",
            {"vllm": [engine, second.target]},
            scrape_interval="2s",
            rule_files=[rules],
        ) as prometheus,
    ):
        prometheus.wait_for_series('up{job="vllm"} == 1', count=2)
        prometheus.wait_for_series("vllm:kv_cache_usage_perc", count=2)

        once = json.loads(
            run_kvops(
                "watch",
                "--engine",
                "vllm",
                "--prometheus",
                prometheus.url,
                "--selector",
                '{job="vllm"}',
                "--once",
                "--json",
                expect=1,  # warn: serving, with limits
            ).stdout
        )
        assert once["level"] == "warn" and once["kv_usage"] == 0.72 and once["source"] == prometheus.url
        assert {r["name"]: (r["level"], r["kv_usage"]) for r in once["replicas"]} == {
            engine: ("ok", 0.0),
            second.target: ("warn", 0.72),
        }
        assert once["actions"] == ["log_warning", "cap_max_tokens:512"]

        with WatchProcess(
            "--engine",
            "vllm",
            "--prometheus",
            prometheus.url,
            "--selector",
            '{job="vllm"}',
            "--policy",
            str(policy),
            "--interval",
            "0.5",
            "--timeout",
            "5",
        ) as watch:
            watch.wait_level("warn")
            load = KvLoad(vllm_engine.url, str(vllm_engine.model)).start(WARN)
            try:
                # critical on a pool held at 97%: the pool that fills and preempts (CRITICAL) reads 95% or more only
                # for a moment before each preemption, which 2 s scrapes can miss for minutes on a busy machine
                for stage, level in ((DEGRADE, "degrade"), (FULL, "critical")):
                    load.switch(stage)
                    watch.wait_level(level, timeout=180)
                watch.wait_replicas({engine: "critical", second.target: "warn"})
                # Prometheus' own rule, from the same policy, matches the engine's real usage while the burst lasts:
                # pending or firing. Firing needs two evaluations in a row at 95% or more, and a request's end dips
                # the usage between them; a pending evaluation can also come and go before the watcher's critical is
                # read (on the loaded 2-core machine a live poll saw none in 120 s), so Prometheus' own record of
                # the rule's states over the burst is read, not its state now
                prometheus.wait_for_series(
                    f'max_over_time(ALERTS{{alertname="KVCacheCritical",alertstate=~"pending|firing",'
                    f'instance="{engine}"}}[15m])',
                    timeout=120,
                )
            finally:
                load.stop()
            # the engine is back to ok, the fleet to the second's warn (the engine's last scrape of the burst may
            # show it at warn a moment first: 0.74 as its requests end)
            watch.wait_level("warn", timeout=120, kv_usage=0.72)
            assert (
                watch.metric("kvops_replica_level", instance=engine) == 0
                and watch.metric("kvops_replica_level", instance=second.target) == 1
            )

            second.set("", status=503)  # the second replica's target goes down: Prometheus marks it up == 0
            watch.wait_event(
                lambda e: (
                    e["event"] == "poll_failed"
                    and e["replica"] == second.target
                    and e["error"] == "target down in Prometheus (up == 0)"
                ),
                timeout=30,
            )
            assert (
                watch.wait_level("ok", timeout=30)["kv_usage"] == 0.0
            )  # the fleet's worst of the replicas still known

        watch.first_rises("fleet_level_changed", ["warn", "degrade", "critical"])
        assert watch.events("fleet_level_changed")[-1]["to"] == "ok"

        prometheus.wait_for_series(
            f'ALERTS{{alertname="KVMetricsStale",alertstate="firing",instance="{second.target}"}}', timeout=60
        )
        warned = prometheus.query(
            f'max_over_time(ALERTS{{alertname="KVCacheWarn",alertstate="firing",instance="{second.target}"}}[10m])'
        )
        assert warned and warned[0]["value"][1] == "1"
