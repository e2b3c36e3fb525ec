"""Autoscaling on KV headroom and the gateway exports, through a real Prometheus (Debian's package) scraping two
replicas: the real vLLM CPU engine, and a STAND-IN (a real HTTP server serving the vLLM 0.32.0 CPU build's recorded
/metrics exposition, its values set: KV at 30%, 1 running, 2 waiting) because the 2 shared cores run one engine.

`kvops manifests` plans the engine's own pool (4 MiB, blocks of 128 tokens: 31 usable, as the CPU engine has) for
requests of 650 + 100 tokens, and writes the recording rules, the KEDA ScaledObject, the HPA with its
prometheus-adapter rule, and the llm-d, Dynamo and production-stack settings. Prometheus evaluates those rules on
the two replicas; every query the objects hold runs against it, under staged load: idle, then 5 requests that
start at 300 tokens and grow to 750 (the plan's request), 5 x 6 blocks = 97% of the pool. The demand counts each at
750 from its admission (5 x 750 = 95% of the pool), so it passes the scaling target (warn, 70%) while the blocks
still fill (5 x 3 blocks = 48% at admission), which KV usage reaches only past 512 tokens (5 x 5 blocks = 81%): the
signal leads the KV level. The lead is read inside each rule group, which records the engine's KV usage beside the
demand from the same scrape: a signal past the warn level while KV usage reads below 70%. Every round of the load
offers one, for its first 212 tokens of 450; the test waits across rounds, since a busy engine can answer only one
scrape a second. KV usage stays past 70% for the other 238 tokens of every round, so Prometheus samples that too.
(With rounds of 100 + 650 tokens, past 70% for a third of each, Prometheus twice read no KV usage past 70% in
240 s while other work shared the 2 cores.)
"""

from __future__ import annotations

import math
import time
from pathlib import Path

import pytest
import yaml

from kvops.watch.rules import REPLICA
from tests.support.daemons import PROMETHEUS, PrometheusServer
from tests.support.kv_load import KvLoad, Stage
from tests.support.metrics_server import MetricsServer, vllm_exposition
from tests.support.watch_process import WatchProcess

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(
        PROMETHEUS is None, reason="prometheus not installed (apt-get install prometheus; .ci/run does)"
    ),
]

POOL_BLOCKS, BLOCK = 32, 128
USABLE = (POOL_BLOCKS - 1) * BLOCK  # vLLM keeps one null block
REQUEST = 650 + 100
PLAN = [
    "--gpu",
    "L4",
    "--kv-cache-memory-bytes",
    "4194304",
    "--block-size",
    str(BLOCK),
    "--max-model-len",
    "1024",
    "--prompt-tokens",
    "650",
    "--gen-tokens",
    "100",
    "--concurrency",
    "3",
    "--replicas",
    "2",
]
GROWING = Stage(5, 300, 450)  # 5 x 3 blocks at admission (48%), growing to 5 x 6 blocks (97%) as they decode
STAND_IN = {"kv_usage": 0.30, "running": 1, "waiting": 2}
K8S_KV, STACK_KV = "test:kv_usage_k8s", "test:kv_usage_stack"  # the test's own records, beside the demand's
ENGINE = '{job="vllm",pod="vllm-0"}'  # the real engine's series (vllm-1 is the stand-in)
STAND_IN_DEMAND = max(0.30 * USABLE, 1 * REQUEST) + 2 * REQUEST  # 1190.4 in use + 2 queued x 750


def manifests(run_kvops, model: Path, out: Path, *args: str) -> dict[str, str]:
    run_kvops("manifests", "--model", str(model), *PLAN, *args, "--out", str(out))
    return {path.name: path.read_text() for path in out.iterdir()}


def documents(text: str) -> list[dict]:
    return [d for d in yaml.safe_load_all(text) if d]


def rule_file(path: Path, prometheus_rule: str, kv_record: str) -> Path:
    """The rules' groups, the demand's group recording the engine's KV usage too, as its last rule: each evaluation
    reads the demand and the KV usage from the same scrape (or the KV from a later one), so a reading of the demand
    past 70% while KV usage reads below is a lead, not two scrapes' timing."""
    (rule,) = documents(prometheus_rule)
    groups = rule["spec"]["groups"]
    (headroom,) = (g for g in groups if any(r.get("record") == "kvops:kv_demand_tokens" for r in g["rules"]))
    headroom["rules"].append({"record": kv_record, "expr": f"max by ({REPLICA}) (vllm:kv_cache_usage_perc)"})
    path.write_text(yaml.safe_dump({"groups": groups}))
    return path


def lead_queries(keda_query: str, stack_query: str) -> dict[str, tuple[str, str]]:
    """Each signal with the KV usage its own rule group recorded at the same evaluation."""
    return {
        "demand": (f"kvops:kv_demand_ratio{ENGINE}", f"{K8S_KV}{ENGINE}"),
        "keda": (keda_query, f"{K8S_KV}{ENGINE}"),
        "stack": (stack_query, f'{STACK_KV}{{job="stack"}}'),
    }


def value(prometheus: PrometheusServer, expr: str) -> float:
    (sample,) = prometheus.wait_for_series(expr)
    return float(sample["value"][1])


def at(prometheus: PrometheusServer, expr: str, when: float) -> list[float]:
    """The query's values at one evaluation time (several queries compared at the same instant)."""
    return [float(s["value"][1]) for s in prometheus.get_json("/api/v1/query", query=expr, time=when)["data"]["result"]]


def first_at_or_above(prometheus: PrometheusServer, expr: str, level: float, since: float) -> float | None:
    """When `expr` first reached `level` since the wall-clock time `since`, from the samples Prometheus scraped: a
    peak shorter than the poll's period (the requests' last block lasts a fraction of a second) is still seen."""
    for series in prometheus.query(f"{expr}[1m]"):
        for stamp, sample in series["values"]:
            if stamp >= since and float(sample) >= level:
                return stamp
    return None


def engine_seen(prometheus: PrometheusServer, seconds: int) -> dict[str, list[float]]:
    """For a failure message: what Prometheus scraped from the engine over the load, its scrapes that answered
    and its highest KV usage (a scrape that timed out on a starved engine records nothing)."""
    queries = {
        "scrapes answered": f"sum_over_time(up{ENGINE}[{seconds}s])",
        "scrapes tried": f"count_over_time(up{ENGINE}[{seconds}s])",
        "highest KV usage": f"max_over_time(vllm:kv_cache_usage_perc{ENGINE}[{seconds}s])",
    }
    return {name: [float(s["value"][1]) for s in prometheus.query(expr)] for name, expr in queries.items()}


def adapter_query(config: dict, namespace: str, pods: list[str]) -> str:
    """prometheus-adapter's query for the HPA's pods: its metricsQuery template filled as the adapter fills it."""
    (rule,) = yaml.safe_load(config["data"]["config.yaml"])["rules"]
    series = rule["seriesQuery"].split("{", 1)[0]
    matchers = f'namespace="{namespace}",pod=~"{"|".join(pods)}"'
    return (
        rule["metricsQuery"]
        .replace("<<.Series>>", series)
        .replace("<<.LabelMatchers>>", matchers)
        .replace("<<.GroupBy>>", "pod")
    )


def short_of(leads: dict[str, float], target: float, low: int, high: int) -> list[str]:
    """The signals whose lead has not yet read past the warn level: the demand (a share of the pool), KEDA's trigger
    (the replicas it asks for) and production-stack's (tokens)."""
    passed = {
        "demand": leads.get("demand", 0) >= 0.70,
        "keda": desired(leads.get("keda", 0), target, low, high) > low,
        "stack": leads.get("stack", 0) >= 0.70 * USABLE,
    }
    return [name for name, ok in passed.items() if not ok]


def desired(total: float, per_replica_target: float, low: int, high: int) -> int:
    """The HPA's replica count for an AverageValue target (KEDA's ScaledObject drives the same HPA)."""
    return min(high, max(low, math.ceil(total / per_replica_target)))


def test_headroom_scales_and_gateways_shed_at_kvops_levels(vllm_engine, tmp_path, run_kvops, tiny_model):
    keda = manifests(run_kvops, tiny_model, tmp_path / "keda", "--autoscale", "keda")
    hpa = manifests(run_kvops, tiny_model, tmp_path / "hpa", "--autoscale", "hpa")
    stack = manifests(run_kvops, tiny_model, tmp_path / "stack", "--target", "production-stack", "--release", "prod")
    llm_d = manifests(run_kvops, tiny_model, tmp_path / "llm-d", "--target", "llm-d")
    dynamo = manifests(run_kvops, tiny_model, tmp_path / "dynamo", "--target", "dynamo")
    assert vllm_engine.cache_config()["num_gpu_blocks"] == str(POOL_BLOCKS)  # the plan's pool is the engine's

    scaled = documents(keda["scaledobject.yaml"])[0]["spec"]
    trigger = scaled["triggers"][0]["metadata"]
    target = float(trigger["threshold"])
    assert target == int(0.70 * USABLE)
    autoscaler = documents(hpa["hpa.yaml"])[0]["spec"]
    assert float(autoscaler["metrics"][0]["pods"]["target"]["averageValue"]) == target
    low, high = scaled["minReplicaCount"], scaled["maxReplicaCount"]
    assert (low, high) == (autoscaler["minReplicas"], autoscaler["maxReplicas"]) == (2, 8)
    adapter = documents(hpa["prometheus-adapter.yaml"])[0]
    stack_query = documents(stack["scaledobject.yaml"])[0]["spec"]["triggers"][0]["metadata"]["query"]
    sidecar = next(
        c["args"]
        for c in documents(keda["deployment.yaml"])[0]["spec"]["template"]["spec"]["containers"]
        if "--request-tokens" in c.get("args", [])
    )
    request_tokens = sidecar[sidecar.index("--request-tokens") + 1]
    assert int(request_tokens) == REQUEST
    policy = tmp_path / "policy.yaml"
    policy.write_text(documents(keda["policy-configmap.yaml"])[0]["data"]["policy.yaml"])

    engine = f"127.0.0.1:{vllm_engine.port}"
    with MetricsServer(vllm_exposition(**STAND_IN)) as second:
        pods = {"vllm-0": engine, "vllm-1": second.target}
        config = {
            "global": {"scrape_interval": "250ms", "evaluation_interval": "250ms"},
            "rule_files": [
                str(rule_file(tmp_path / "k8s-rules.yaml", keda["prometheusrule.yaml"], K8S_KV)),
                str(rule_file(tmp_path / "stack-rules.yaml", stack["prometheusrule.yaml"], STACK_KV)),
            ],
            "scrape_configs": [
                {
                    "job_name": "vllm",
                    "static_configs": [
                        {"targets": [host], "labels": {"namespace": "default", "pod": pod}}
                        for pod, host in pods.items()
                    ],
                },
                {  # the same engine as production-stack's chart names its pod, scraped under its own job
                    "job_name": "stack",
                    "static_configs": [
                        {"targets": [engine], "labels": {"namespace": "default", "pod": "prod-vllm-deployment-vllm-0"}}
                    ],
                },
            ],
        }
        with (
            PrometheusServer(tmp_path / "prometheus", config=config) as prometheus,
            WatchProcess(
                "--engine",
                "vllm",
                "--prometheus",
                prometheus.url,
                "--selector",
                '{job="vllm"}',
                "--policy",
                str(policy),
                "--request-tokens",
                request_tokens,  # as the manifests' sidecar is started
                "--interval",
                "0.5",
                "--timeout",
                "5",
            ) as watch,
        ):
            demand = 'kvops:kv_demand_tokens{job="vllm",pod="%s"}'
            prometheus.wait_for_series('kvops:kv_demand_tokens{job="vllm"}', count=2)
            assert value(prometheus, 'kvops:kv_usable_tokens{pod="vllm-1"}') == USABLE
            assert value(prometheus, demand % "vllm-1") == pytest.approx(STAND_IN_DEMAND)
            assert value(prometheus, demand % "vllm-0") == 0  # idle
            # the watcher computes the same per replica from the same series
            deadline = time.monotonic() + 60
            while watch.metric("kvops_replica_kv_demand_tokens", instance=second.target) is None:
                assert time.monotonic() < deadline, "the watcher exports no demand"
                time.sleep(0.25)
            assert watch.metric("kvops_replica_kv_demand_tokens", instance=second.target) == pytest.approx(
                STAND_IN_DEMAND
            )
            assert watch.metric("kvops_replica_kv_usable_tokens", instance=second.target) == USABLE
            # llm-d's score at the EPP config's thresholds, from Prometheus' series and from the watcher
            detector = next(
                p["parameters"]
                for p in documents(llm_d["epp-config.yaml"])[0]["plugins"]
                if p["type"] == "utilization-detector"
            )
            score = max(2 / detector["queueDepthThreshold"], 0.30 / detector["kvCacheUtilThreshold"])
            assert watch.metric("kvops_replica_saturation", instance=second.target) == pytest.approx(score)

            idle = value(prometheus, trigger["query"])
            assert idle == pytest.approx(STAND_IN_DEMAND) and desired(idle, target, low, high) == 2
            assert value(prometheus, stack_query) == 0

            load = KvLoad(vllm_engine.url, str(vllm_engine.model)).start(GROWING)
            leads: dict[str, float] = {}
            asked: dict[str, float] = {}
            kv: float | None = None
            start = time.time()
            try:
                # every signal's lead is read anew each turn until each has passed its level (or time is up): on a
                # busy machine a rule group can record its first readings of a round before the load has grown
                while (short_of(leads, target, low, high) or not asked or not kv) and time.time() - start < 240:
                    # the most each signal read while its own group's KV usage was below 70%, over the load so far
                    window = f"[{math.ceil(time.time() - start)}s:50ms]"
                    for name, (signal, usage) in lead_queries(trigger["query"], stack_query).items():
                        reading = at(
                            prometheus, f"max_over_time(({signal} and on() (max({usage}) < 0.70)){window})", time.time()
                        )
                        if reading:
                            leads[name] = reading[0]
                    if not asked:
                        # the queries compared at one instant; each replica's rules are evaluated on its own
                        # scrape, so on a busy machine one can lag the other: read again next turn
                        when = time.time()
                        stack_total = at(prometheus, stack_query, when)
                        totals = at(prometheus, trigger["query"], when)  # none yet where a rule has not run
                        if (
                            stack_total
                            and totals
                            and stack_total[0] >= 0.70 * USABLE
                            and desired(totals[0], target, low, high) > low
                        ):
                            per_pod = at(prometheus, adapter_query(adapter, "default", list(pods)), when)
                            asked.update(at=when - start, total=totals[0], hpa=sum(per_pod) / len(per_pod))
                    kv = kv or first_at_or_above(prometheus, f"vllm:kv_cache_usage_perc{ENGINE}", 0.70, start)
                    time.sleep(0.25)
            finally:
                load.stop()
            seen = engine_seen(prometheus, math.ceil(time.time() - start))
    assert not load.errors, load.errors[:3]
    assert asked and kv is not None, (asked, kv, leads, load.report(), seen)
    print(
        f"while KV usage read below 70% the demand read {leads.get('demand', 0):.0%} of the pool, KEDA's trigger"
        f" {leads.get('keda', 0):.0f} tokens, production-stack's {leads.get('stack', 0):.0f}; KV usage passed 70%"
        f" at {kv - start:.1f} s"
    )
    # the demand, KEDA and the HPA (through the adapter), and production-stack's trigger all read past the warn
    # level while the same engine's KV usage, from the same scrape, still read below 70%: the signal leads the KV
    assert not short_of(leads, target, low, high), leads
    assert asked["hpa"] * len(pods) == pytest.approx(asked["total"])

    env = dict(
        line.split("=", 1) for line in dynamo["dynamo-frontend.env"].splitlines() if "=" in line and line[0] != "#"
    )
    assert env["DYN_ACTIVE_PREFILL_TOKENS_THRESHOLD"] == str(int(0.95 * USABLE))  # the engine's real pool
