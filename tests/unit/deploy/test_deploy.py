"""`kvops manifests` and `kvops dashboard`: the checked-in configs/ are what they emit; every Kubernetes object passes
the Kubernetes schemas (kubernetes-validate, strict) and kubernetes-models' bundled ones (node, prometheus-operator
CRDs included); the compose stack passes `docker compose config` (Docker Compose v2) and promtool; the pieces are
kvops' own: the plan's container, `kvops alerts`' rules, arguments the real `kvops watch` accepts; and the KV guard's
init step gives a Python with only the copied packages a working `kvops_vllm`."""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest
import yaml

from tests.support.daemons import PROMTOOL
from tests.support.paths import REPO

EXAMPLE = [
    "--model",
    "llama-3-8b",
    "--gpu",
    "H100-80GB",
    "--max-model-len",
    "8192",
    "--prompt-tokens",
    "2000",
    "--gen-tokens",
    "500",
]
GUARD = {"vllm": ["--guard"], "tgi": []}  # the checked-in vLLM stacks show the KV guard: named only when asked
GENERATED = {
    f"configs/{target}/{engine}": ["manifests", "--engine", engine, "--target", target, *EXAMPLE, *GUARD[engine]]
    for target in ("k8s", "compose")
    for engine in ("vllm", "tgi")
}
K8S_VERSIONS = (
    "1.30",
    "1.37",
)  # the oldest and newest Kubernetes releases of the supported window kubernetes-validate ships
NODE = shutil.which("node")
NODE_MODULES = REPO / "tests" / "k8s" / "node_modules"


def k8s_objects(text: str) -> list[dict]:
    return [document for document in yaml.safe_load_all(text) if document]


def manifest_text(run_kvops, *args: str) -> str:
    return run_kvops("manifests", *EXAMPLE, *args).stdout


# Deployments that cover each branch: guard or not, AMD, tensor parallel, a policy file, a name, replicas.
VARIANTS = {
    "vllm": ["--guard"],
    "vllm-no-guard": ["--no-guard", "--name", "llama-unguarded", "--replicas", "3"],
    "vllm-amd-tp2": ["--gpu", "MI300X", "--tp", "2", "--kvops-port", "9500", "--scrape-interval", "30"],
    "tgi": ["--engine", "tgi"],
}


@pytest.mark.parametrize("directory", sorted(GENERATED))
def test_checked_in_configs_are_what_kvops_manifests_emits(run_kvops, tmp_path, directory):
    args = GENERATED[directory]
    run_kvops(*args, "--out", str(tmp_path))
    checked_in = REPO / directory
    regenerate = f"kvops {' '.join(args)} --out {directory}"
    assert sorted(p.name for p in checked_in.iterdir()) == sorted(p.name for p in tmp_path.iterdir()), (
        f"{directory} is stale: {regenerate}"
    )
    for path in tmp_path.iterdir():
        assert (checked_in / path.name).read_text() == path.read_text(), (
            f"{directory}/{path.name} is stale: {regenerate}"
        )


def test_checked_in_dashboard_is_what_kvops_dashboard_emits(run_kvops):
    assert (REPO / "configs" / "grafana" / "kvops.json").read_text() == run_kvops("dashboard").stdout, (
        "regenerate: kvops dashboard --out configs/grafana/kvops.json"
    )


def test_printed_manifests_are_the_files_in_order(run_kvops, tmp_path):
    run_kvops("manifests", *EXAMPLE, "--out", str(tmp_path))
    names = ["policy-configmap.yaml", "deployment.yaml", "service.yaml", "podmonitor.yaml", "prometheusrule.yaml"]
    assert manifest_text(run_kvops) == "---\n".join((tmp_path / name).read_text() for name in names)


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_core_objects_pass_the_strict_kubernetes_schemas(run_kvops, variant):
    kubernetes_validate = pytest.importorskip(
        "kubernetes_validate", reason="kubernetes-validate is not installed (pip install -e '.[test]'; .ci/run does)"
    )

    objects = k8s_objects(manifest_text(run_kvops, *VARIANTS[variant]))
    core = [o for o in objects if o["apiVersion"] in ("v1", "apps/v1")]
    assert sorted(o["kind"] for o in core) == ["ConfigMap", "Deployment", "Service"]
    for version in K8S_VERSIONS:
        for document in core:
            assert kubernetes_validate.validate(document, version, strict=True) == version


def test_the_strict_schemas_catch_a_misspelt_field(run_kvops):
    kubernetes_validate = pytest.importorskip(
        "kubernetes_validate", reason="kubernetes-validate is not installed (pip install -e '.[test]'; .ci/run does)"
    )

    deployment = next(o for o in k8s_objects(manifest_text(run_kvops)) if o["kind"] == "Deployment")
    deployment["spec"]["template"]["spec"]["containers"][1]["readinesProbe"] = deployment["spec"]["template"]["spec"][
        "containers"
    ][1].pop("readinessProbe")
    with pytest.raises(kubernetes_validate.ValidationError, match="'readinesProbe' was unexpected"):
        kubernetes_validate.validate(deployment, K8S_VERSIONS[-1], strict=True)


def validate_with_kubernetes_models(objects: list[dict]) -> tuple[int, list[dict]]:
    if NODE is None or not NODE_MODULES.is_dir():
        pytest.skip("node or tests/k8s/node_modules missing (cd tests/k8s && npm ci; .ci/run does)")
    ran = subprocess.run(
        [NODE, str(REPO / "tests" / "k8s" / "validate.mjs")],
        input=json.dumps(objects),
        capture_output=True,
        text=True,
        timeout=60,
    )
    return ran.returncode, [json.loads(line) for line in ran.stdout.splitlines()]


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_every_object_passes_kubernetes_models_schemas(run_kvops, variant):
    objects = k8s_objects(manifest_text(run_kvops, *VARIANTS[variant]))
    status, results = validate_with_kubernetes_models(objects)
    assert [(r["kind"], r["errors"]) for r in results] == [(o["kind"], []) for o in objects]
    assert status == 0
    assert {r["kind"] for r in results} == {"ConfigMap", "Deployment", "Service", "PodMonitor", "PrometheusRule"}


def test_kubernetes_models_catch_wrong_types_in_the_crds(run_kvops):
    objects = k8s_objects(manifest_text(run_kvops))
    monitor = next(o for o in objects if o["kind"] == "PodMonitor")
    rule = next(o for o in objects if o["kind"] == "PrometheusRule")
    monitor["spec"]["podMetricsEndpoints"][0]["relabelings"] = "job=vllm"
    del rule["spec"]["groups"][0]["name"]
    status, results = validate_with_kubernetes_models([monitor, rule])
    assert status == 1
    assert results[0]["errors"] == ["/spec/podMetricsEndpoints/0/relabelings must be array"]
    assert results[1]["errors"] == ["/spec/groups/0 must have required property name"]


def test_the_engine_container_is_the_plans_and_the_sidecar_runs_kvops_watch(run_kvops):
    from kvops.cli.watch import watch

    plan_container = yaml.safe_load(run_kvops("plan", *EXAMPLE, "--guard", "--format", "k8s").stdout)
    objects = {o["kind"]: o for o in k8s_objects(manifest_text(run_kvops, "--guard"))}
    pod = objects["Deployment"]["spec"]["template"]["spec"]
    engine, sidecar = pod["containers"]
    added_env = [
        {"name": "PYTHONPATH", "value": "/opt/kvops/python"},
        {"name": "KVOPS_POLICY", "value": "/etc/kvops/policy.yaml"},
    ]  # no KVOPS_POLICY_URL: the middleware applies the levels, by the header a gateway sets
    assert engine["env"] == plan_container["env"] + added_env
    assert {key: value for key, value in engine.items() if key not in ("env", "volumeMounts", "args")} == {
        key: value for key, value in plan_container.items() if key not in ("env", "volumeMounts", "args")
    }
    # the plan's container has no plugin, so it leaves the guard's flag out; the Deployment adds it, and the
    # admission middleware (the levels in vLLM's own API server)
    guard_flag = ["--scheduler-cls", "kvops_vllm.scheduler.KVGuardScheduler"]
    middleware_flag = ["--middleware", "kvops_vllm.middleware.KVOpsMiddleware"]
    at = engine["args"].index(guard_flag[0])
    assert engine["args"][at : at + 2] == guard_flag and engine["args"][-2:] == middleware_flag
    assert engine["args"][:at] + engine["args"][at + 2 : -2] == plan_container["args"]
    assert sidecar["command"] == ["kvops"] and sidecar["args"][:2] == ["watch", "--engine"]
    context = watch.make_context("kvops watch", sidecar["args"][1:])  # the real command accepts them
    assert (context.params["metrics_url"], context.params["upstream"], context.params["listen"]) == (
        "http://127.0.0.1:8000/metrics",
        None,  # no proxy: the middleware applies the levels in the engine
        "0.0.0.0:9400",
    )
    assert (
        sidecar["readinessProbe"]["httpGet"]
        == sidecar["livenessProbe"]["httpGet"]
        == {"path": "/kvops/healthz", "port": "kvops"}
    )
    # every mount has its volume, the init step fills the one the engine imports from, the Service reaches the engine
    volumes = {v["name"] for v in pod["volumes"]}
    assert (
        {m["name"] for c in pod["containers"] + pod["initContainers"] for m in c["volumeMounts"]}
        == volumes
        == {"shm", "kvops-python", "kvops-policy"}
    )
    assert (
        pod["initContainers"][0]["command"][:2] == ["python", "-c"]
        and "/opt/kvops/python" in pod["initContainers"][0]["command"][2]
    )
    assert objects["Service"]["spec"]["ports"] == [  # the engine's own port, no second hop: /kvops/* is not on it
        {"name": "http", "port": 8000, "targetPort": "http", "protocol": "TCP"}
    ]
    assert {p["name"]: p["containerPort"] for p in sidecar["ports"]} == {"kvops": 9400}
    ports = {p["name"] for c in pod["containers"] for p in c["ports"]}
    endpoints = objects["PodMonitor"]["spec"]["podMetricsEndpoints"]
    assert [(e["port"], e["path"], e["relabelings"][0]["replacement"]) for e in endpoints] == [
        ("http", "/metrics", "vllm"),
        ("kvops", "/kvops/metrics", "kvops-vllm"),
    ]
    assert {e["port"] for e in endpoints} <= ports
    assert objects["ConfigMap"]["data"]["policy.yaml"] == (REPO / "configs" / "policy.yaml").read_text()


def test_tgi_gets_no_plugin_and_the_plans_capacity(run_kvops):
    from kvops.cli.watch import watch

    plan = json.loads(run_kvops("plan", "--engine", "tgi", *EXAMPLE, "--json").stdout)
    capacity = plan["capacity"]["max_batch_total_tokens"]
    objects = {o["kind"]: o for o in k8s_objects(manifest_text(run_kvops, "--engine", "tgi"))}
    pod = objects["Deployment"]["spec"]["template"]["spec"]
    assert "initContainers" not in pod and [v["name"] for v in pod["volumes"]] == ["kvops-policy"]
    engine, sidecar = pod["containers"]
    assert engine == yaml.safe_load(run_kvops("plan", "--engine", "tgi", *EXAMPLE, "--format", "k8s").stdout)
    context = watch.make_context("kvops watch", sidecar["args"][1:])
    assert (context.params["engine"], context.params["max_batch_total_tokens"], context.params["upstream"]) == (
        "tgi",
        capacity,
        "http://127.0.0.1:80",
    )
    assert (
        objects["PrometheusRule"]["spec"]["groups"][0]["rules"][0]["expr"]
        == f'(tgi_batch_current_max_tokens{{job="tgi"}} / {capacity}) >= 0.7'
    )


@pytest.mark.parametrize("engine", ["vllm", "tgi"])
def test_the_rules_are_kvops_alerts_output(run_kvops, tmp_path, monkeypatch, engine):
    """The rules name the plan they were computed from as plan.json: `kvops plan ... --json` of the same options."""
    (tmp_path / "plan.json").write_text(run_kvops("plan", "--engine", engine, *EXAMPLE, "--json").stdout)
    monkeypatch.chdir(tmp_path)
    emitted = {
        fmt: run_kvops(
            "alerts", "--engine", engine, "--format", fmt, "--scrape-interval", "15", "--plan", "plan.json"
        ).stdout
        for fmt in ("prometheusrule", "rules")
    }
    k8s_rule = (REPO / "configs" / "k8s" / engine / "prometheusrule.yaml").read_text()
    assert k8s_rule.split("\n", 1)[1] == emitted["prometheusrule"]  # below the file's own header line
    assert (REPO / "configs" / "compose" / engine / "kvops-rules.yaml").read_text() == emitted["rules"]


def test_no_guard_and_a_policy_file(run_kvops, tmp_path):
    policy = tmp_path / "policy.yaml"
    policy.write_text("levels: {warn: 0.6, degrade: 0.8, critical: 0.9}\n")
    objects = {o["kind"]: o for o in k8s_objects(manifest_text(run_kvops, "--no-guard", "--policy", str(policy)))}
    pod = objects["Deployment"]["spec"]["template"]["spec"]
    engine = pod["containers"][0]
    # no guard: no scheduler and no watcher levels; the middleware still reads the same policy file
    assert "--scheduler-cls" not in engine["args"] and engine["args"][-1] == "kvops_vllm.middleware.KVOpsMiddleware"
    assert [e["name"] for e in engine["env"] if "KVOPS" in e["name"]] == ["KVOPS_POLICY"]
    assert objects["ConfigMap"]["data"]["policy.yaml"] == policy.read_text()
    assert objects["PrometheusRule"]["spec"]["groups"][0]["rules"][0]["expr"].endswith(">= 0.6")


@pytest.mark.parametrize(
    ("args", "why"),
    [
        (["--data-parallel-size", "2"], "an API server per data-parallel rank"),
        (["--target", "llm-d"], "a gateway routes over the fleet"),
    ],
)
def test_the_proxy_stays_where_the_middleware_does_not_apply(run_kvops, tmp_path, args, why):
    run_kvops("manifests", *EXAMPLE, *args, "--out", str(tmp_path))
    deployment = yaml.safe_load((tmp_path / "deployment.yaml").read_text())
    engine, sidecar = deployment["spec"]["template"]["spec"]["containers"]
    assert "--middleware" not in engine["args"], why
    assert "--proxy" in sidecar["args"] and "kvops-proxy" in {p["name"] for p in sidecar["ports"]}, why


@pytest.mark.parametrize(
    "args, code, message",
    [
        (
            ["--target", "compose"],
            2,
            "--target compose writes compose.yaml and the files it mounts (Prometheus, Grafana, rules, policy): give --out DIR",
        ),
        (["--device", "cpu"], 2, "--device cpu plans the CPU build"),
        (["--name", "Llama_3"], 2, "'Llama_3' must be lowercase letters, digits and '-'"),
        (["--kvops-port", "8000"], 2, "8000 is the engine's port"),
        (["--gpu-memory", "16GiB"], 3, "does not fit"),
    ],
)
def test_user_mistakes_are_one_line(run_kvops, args, code, message):
    result = run_kvops("manifests", *EXAMPLE, *args, expect=code)
    assert message in result.stderr and "Traceback" not in result.stderr
    assert not result.stdout


def parse_compose(text: str) -> dict:
    """A compose file through the compose_spec validator (Rust, from PyPI): ValueError names what is wrong."""
    compose_spec = pytest.importorskip(
        "compose_spec", reason="compose-spec is not installed (pip install -e '.[test]'; .ci/run does)"
    )
    return compose_spec.PyCompose.from_yaml(text).to_dict()


@pytest.mark.parametrize("engine", ["vllm", "tgi"])
def test_compose_stack_passes_the_compose_specification(engine):
    directory = REPO / "configs" / "compose" / engine
    services = parse_compose((directory / "compose.yaml").read_text())["services"]
    expected = {engine, "kvops", "prometheus", "grafana"} | ({"kvops-plugin"} if engine == "vllm" else set())
    assert set(services) == expected
    assert services["kvops"]["command"][:3] == ["watch", "--engine", engine]
    if engine == "vllm":  # the middleware applies the levels in the engine: clients reach its port, no second hop
        assert services[engine]["ports"] == ["8000:8000"] and "--middleware" in services[engine]["command"]
        assert "ports" not in services["kvops"] and "--proxy" not in services["kvops"]["command"]
    else:  # clients reach the proxy, and only the proxy
        assert services["kvops"]["ports"] == ["80:9401"] and "ports" not in services[engine]
        assert services["kvops"]["command"][services["kvops"]["command"].index("--proxy-listen") + 1] == "0.0.0.0:9401"
    mounts = [volume.split(":")[:2] for volume in services["prometheus"]["volumes"]]
    assert mounts == [
        ["./prometheus.yml", "/etc/prometheus/prometheus.yml"],
        ["./kvops-rules.yaml", "/etc/prometheus/kvops-rules.yaml"],
    ]
    for source, _ in mounts:
        assert (directory / source).is_file()
    assert any(volume.startswith("./kvops-dashboard.json:") for volume in services["grafana"]["volumes"])
    assert (directory / "kvops-dashboard.json").read_text() == (REPO / "configs" / "grafana" / "kvops.json").read_text()
    if engine == "vllm":
        assert services["vllm"]["depends_on"]["kvops-plugin"]["condition"] == "service_completed_successfully"
        assert not any(name.startswith("KVOPS_POLICY_URL") for name in services["vllm"]["environment"])


def test_the_compose_validator_catches_a_bad_file():
    text = (
        (REPO / "configs" / "compose" / "vllm" / "compose.yaml")
        .read_text()
        .replace("    ipc: host\n", "    ipc: host\n    shm-size: 1g\n")
    )
    with pytest.raises(ValueError, match="shm-size"):
        parse_compose(text)


@pytest.mark.skipif(PROMTOOL is None, reason="promtool not installed (apt-get install prometheus; .ci/run does)")
@pytest.mark.parametrize("engine, rules", [("vllm", 17), ("tgi", 12)])  # alerts, GPUMemoryHigh, 5 recorded
def test_compose_prometheus_config_and_rules_pass_promtool(engine, rules):
    directory = REPO / "configs" / "compose" / engine
    ran = subprocess.run(
        [PROMTOOL, "check", "config", str(directory / "prometheus.yml")], capture_output=True, text=True, timeout=60
    )
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert "SUCCESS: 1 rule files found" in ran.stdout and f"SUCCESS: {rules} rules found" in ran.stdout


def test_dashboard_bands_are_the_policys_levels(run_kvops, tmp_path):
    policy = tmp_path / "policy.yaml"
    policy.write_text("levels: {warn: 0.6, degrade: 0.8, critical: 0.9}\n")
    for args, bands in (([], [0.7, 0.85, 0.95]), (["--policy", str(policy)], [0.6, 0.8, 0.9])):
        document = json.loads(run_kvops("dashboard", *args).stdout)
        usage = document["panels"][0]
        steps = usage["fieldConfig"]["defaults"]["thresholds"]["steps"]
        assert [(s["color"], s["value"]) for s in steps] == list(
            zip(["green", "yellow", "orange", "red"], [None, *bands])
        )
        assert usage["fieldConfig"]["defaults"]["custom"]["thresholdsStyle"] == {"mode": "line+area"}
    cells = set()
    for panel in document["panels"]:  # one datasource variable, no two panels on the same grid cell
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        grid = panel["gridPos"]
        area = {
            (x, y) for x in range(grid["x"], grid["x"] + grid["w"]) for y in range(grid["y"], grid["y"] + grid["h"])
        }
        assert not area & cells and max(x for x, _ in area) < 24
        cells |= area
    assert len({panel["id"] for panel in document["panels"]}) == len(document["panels"]) == 14
    levels = document["panels"][1]["fieldConfig"]["defaults"]["mappings"][0]["options"]
    assert {value: option["text"] for value, option in levels.items()} == {
        "-1": "unknown",
        "0": "ok",
        "1": "warn",
        "2": "degrade",
        "3": "critical",
    }


def test_every_dashboard_query_that_selects_a_job_selects_the_namespace_too(run_kvops):
    """A deployment's name, and so its job, can run in several namespaces one Prometheus scrapes; the panels that
    sum over replicas (requests by level, clamps, rejections, the demand) summed both. Every job selector now comes
    with $namespace (tests/engine/test_defects_tools_engine.py reads it from a real Prometheus)."""
    import re

    from kvops.deploy.grafana import queries

    document = json.loads(run_kvops("dashboard").stdout)
    selectors = [s for expr in queries(document) for s in re.findall(r"\{[^{}]*\}", expr) if "job=~" in s]
    assert selectors and all('namespace=~"$namespace"' in s for s in selectors), selectors
    (variable,) = [v for v in document["templating"]["list"] if v["name"] == "namespace"]
    assert variable["includeAll"] and variable["allValue"] == ".*"  # All matches compose's series, which have none
