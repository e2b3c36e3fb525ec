"""Every query of the Grafana dashboard against a real Prometheus (Debian's package) run with the compose stack's own
prometheus.yml and rule files (targets moved to 127.0.0.1, 1 s scrapes), scraping the real vLLM engine with kvops'
admission middleware (as the compose file runs it), the FAKE TGI router (TGI's /metrics wire format; TGI cannot run
here) and, beside each, `kvops watch` started with the compose file's own sidecar arguments (TGI's with `--proxy`).
Each expression evaluates without error; those about the engine and the watcher return data (but the GPU's DCGM
series and vLLM's host KV tier, which cannot exist here), after a real load has put the vLLM sidecar at warn and one
request was clamped by vLLM's middleware and one through TGI's proxy."""

from __future__ import annotations

import json
import math
import time
import urllib.error
import urllib.request
from email.message import Message
from pathlib import Path

import pytest
import yaml

from kvops.deploy.grafana import queries
from tests.support.daemons import PROMETHEUS, PrometheusServer
from tests.support.kv_load import WARN, KvLoad
from tests.support.paths import REPO
from tests.support.tgi_fake import TgiFake
from tests.support.watch_process import WatchProcess

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(
        PROMETHEUS is None, reason="prometheus not installed (apt-get install prometheus; .ci/run does)"
    ),
]

COMPOSE = REPO / "configs" / "compose"
DASHBOARD = json.loads((REPO / "configs" / "grafana" / "kvops.json").read_text())


# Series this machine cannot have: NVIDIA's DCGM exporter needs a GPU, vLLM's host KV tier a CUDA device (the CPU
# build refuses --kv-offloading-size; tests/unit/watch/test_offload.py reads the tier from a stand-in).
ABSENT_HERE = ("DCGM_FI_DEV_", "vllm:kv_offload_")


def sidecar_args(engine: str, engine_url: str) -> list[str]:
    """The compose file's `kvops watch` arguments, the engine and policy file moved here (WatchProcess adds --listen,
    which a proxy then shares: the compose file's fixed --proxy-listen port is dropped)."""
    stack = COMPOSE / engine
    command = yaml.safe_load((stack / "compose.yaml").read_text())["services"]["kvops"]["command"]
    compose_url = f"http://{engine}:{8000 if engine == 'vllm' else 80}"
    args = [
        arg.replace(compose_url, engine_url).replace("/etc/kvops/policy.yaml", str(stack / "policy.yaml"))
        for arg in command
    ]
    for option in ("--listen", "--proxy-listen"):
        if option in args:
            at = args.index(option)
            del args[at : at + 2]
    assert args[0] == "watch"
    return args[1:]


def prometheus_config(workdir: Path, targets: dict[str, dict[str, str]]) -> dict:
    """Both compose stacks' prometheus.yml in one: their jobs (targets moved) and their rule files."""
    config: dict = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [],
        "scrape_configs": [],
    }
    for engine, moved in targets.items():
        stack = yaml.safe_load((COMPOSE / engine / "prometheus.yml").read_text())
        for rules in stack["rule_files"]:
            (workdir / f"{engine}-{rules}").write_text((COMPOSE / engine / rules).read_text())
            config["rule_files"].append(f"{engine}-{rules}")
        for job in stack["scrape_configs"]:
            job["static_configs"] = [
                {"targets": [moved[target] for target in group["targets"]]} for group in job["static_configs"]
            ]
            config["scrape_configs"].append(job)
    return config


def post(url: str, body: dict) -> Message:
    """POST and return the response headers, names read in any case (a stream: headers come first; the rest is not
    awaited). The proxy spells them X-KVops-Level, the middleware, as ASGI servers send them, x-kvops-level."""
    request = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            return response.headers
    except urllib.error.HTTPError as exc:
        return exc.headers


def expression(expr: str, job: str) -> str:
    """What Grafana sends: $job as the selected value(s) (All: the regex of every option), $namespace as All (its
    allValue; compose's series have no namespace), $__rate_interval as a range."""
    return expr.replace("$job", job).replace("$namespace", ".*").replace("$__rate_interval", "30s")


def test_every_dashboard_query_runs_against_the_engines_and_the_watchers(middleware_engine, tmp_path):
    vllm_engine = middleware_engine  # vLLM as the compose file runs it: --middleware kvops_vllm.middleware...
    engine_target = f"127.0.0.1:{vllm_engine.port}"
    with (
        TgiFake() as tgi,
        WatchProcess(*sidecar_args("vllm", vllm_engine.url)) as vllm_watch,
        WatchProcess(*sidecar_args("tgi", tgi.url.removesuffix("/metrics"))) as tgi_watch,
    ):
        tgi_target = tgi.url.removeprefix("http://").removesuffix("/metrics")
        targets = {
            "vllm": {"vllm:8000": engine_target, "kvops:9400": f"127.0.0.1:{vllm_watch.port}"},
            "tgi": {"tgi:80": tgi_target, "kvops:9400": f"127.0.0.1:{tgi_watch.port}"},
        }
        workdir = tmp_path / "prometheus"
        workdir.mkdir()
        with PrometheusServer(workdir, config=prometheus_config(workdir, targets)) as prometheus:
            groups = prometheus.get_json("/api/v1/rules")["data"]["groups"]
            assert sorted((g["name"], len(g["rules"])) for g in groups) == [
                ("kvops-tgi", 7),
                ("kvops-tgi-headroom", 5),
                ("kvops-vllm", 12),
                ("kvops-vllm-headroom", 5),
            ]  # the stacks' rule files load: alerts, and the headroom recorded from the plan
            prometheus.wait_for_series("up == 1", count=4)

            # TGI: a batch reserving 80% of the plan's capacity (warn), a queue, decode steps; then a clamped request
            tgi_args = sidecar_args("tgi", tgi.url)
            capacity = int(tgi_args[tgi_args.index("--max-batch-total-tokens") + 1])
            tgi.metrics.request()
            tgi.metrics.prefill()
            tgi.metrics.batch(size=3, max_tokens=int(capacity * 0.8), queue=2, decode_steps=40)
            tgi_watch.wait_level("warn")
            clamped = post(tgi_watch.url + "/generate", {"inputs": "hello", "parameters": {"max_new_tokens": 900}})
            assert clamped["X-KVops-Level"] == "warn" and clamped["X-KVops-Clamped"] == "max_tokens 900->512"

            # vLLM: real KV pressure (4 requests of 6 blocks of 31: 77%) puts the sidecar at warn, and the engine's
            # middleware, levelling on the same usage in-process, clamps a request sent to the engine itself
            load = KvLoad(vllm_engine.url, str(vllm_engine.model)).start(WARN)
            try:
                vllm_watch.wait_level("warn", timeout=180)
                body = {"model": str(vllm_engine.model), "prompt": "hello", "max_tokens": 900, "stream": True}
                clamped = post(vllm_engine.url + "/v1/completions", body)
                deadline = time.monotonic() + 60
                while clamped["X-KVops-Clamped"] is None and time.monotonic() < deadline:  # its level is its own
                    time.sleep(0.5)
                    clamped = post(vllm_engine.url + "/v1/completions", body)
                assert clamped["X-KVops-Level"] in ("warn", "degrade")
                assert clamped["X-KVops-Clamped"] == "max_tokens 900->512"
            finally:
                load.stop()
            assert not load.errors and load.completed > 0

            every = "(vllm|tgi)"  # Grafana's All of the job variable
            for expr in queries(DASHBOARD):
                if any(name in expr for name in ABSENT_HERE):
                    assert prometheus.query(expression(expr, every)) == [], expr  # evaluates: no series here
                    continue
                # None: the watchers', both jobs; the middleware's counters are vLLM's, the proxy's TGI's sidecar's
                about = (
                    "vllm"
                    if "vllm:" in expr or "kvops_middleware_" in expr
                    else "tgi"
                    if "tgi_" in expr or "kvops_proxy_" in expr
                    else None
                )
                for job in ("vllm", "tgi"):
                    if about in (None, job):
                        prometheus.wait_for_series(
                            expression(expr, job), timeout=60
                        )  # evaluates (a bad one raises), and has data
                    else:
                        assert prometheus.query(expression(expr, job)) == [], (
                            expr,
                            job,
                        )  # the other engine's panel: empty
                result = prometheus.wait_for_series(expression(expr, every))
                # a quantile over a window without requests is NaN (Grafana draws a gap); every other value is >= 0
                quantile = expr.startswith("histogram_quantile(")
                assert all(
                    float(s["value"][1]) >= 0 or (quantile and math.isnan(float(s["value"][1]))) for s in result
                ), (expr, result)

            levels = {
                s["metric"]["job"]: s["value"][1]
                for s in prometheus.query(expression(DASHBOARD["panels"][1]["targets"][0]["expr"], every))
            }
            assert levels["kvops-tgi"] == "1" and levels["kvops-vllm"] in (
                "1",
                "2",
            )  # warn (degrade if the clamped request pushed it)
            clamps = prometheus.query(
                expression('sum by (job, field) (kvops_proxy_clamped_total{job=~"kvops-$job"})', every)
            )
            assert {(s["metric"]["job"], s["metric"]["field"], s["value"][1]) for s in clamps} == {
                ("kvops-tgi", "max_tokens", "1"),
            }
            clamps = prometheus.query(
                expression('sum by (job, field) (kvops_middleware_clamped_total{job=~"$job"})', every)
            )  # the engine is the session's: other tests' clamps count too
            assert {s["metric"]["job"] for s in clamps} == {"vllm"} and any(
                s["metric"]["field"] == "max_tokens" and float(s["value"][1]) >= 1 for s in clamps
            )
