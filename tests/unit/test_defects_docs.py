"""The commands the manual shows that tests/unit/test_doc_samples.py does not run (`kvops manifests`, `alerts`, `watch
--once`, `models`, ...), run as a new user runs them: each test replays a defect found that way, a command that did
not do what its page or its own output said."""

from __future__ import annotations

import json
import re

import yaml

from tests.support.paths import REPO
from tests.unit.deploy.test_deploy import EXAMPLE, k8s_objects


def _service_and_header(run_kvops, *args: str) -> tuple[dict, str]:
    text = run_kvops("manifests", *EXAMPLE, *args).stdout
    document = next(part for part in text.split("---\n") if "kind: Service\n" in part)
    return yaml.safe_load(document), document.splitlines()[0]


def test_the_service_file_says_where_it_sends_clients(run_kvops):
    """The vLLM Service went to the engine's own port (its middleware applies the levels), under a header saying
    "clients go through the kvops admission proxy"; behind llm-d's gateway it said the middleware applied them, where
    the proxy does."""
    service, header = _service_and_header(run_kvops)
    assert service["spec"]["ports"][0]["targetPort"] == "http"
    assert header.startswith("# clients reach the engine's own port: its admission middleware")
    for args in (["--engine", "tgi"], ["--target", "llm-d"]):
        service, header = _service_and_header(run_kvops, *args)
        assert service["spec"]["ports"][0]["targetPort"] == "kvops-proxy", args
        assert header.startswith("# clients go through the kvops admission proxy"), args


def test_behind_a_gateway_the_service_goes_through_the_proxy_the_pod_runs(run_kvops, tmp_path):
    """--target llm-d ran the admission proxy in the pod (no middleware: the gateway routes over a fleet) but its
    Service targeted the engine's own port, so a client of the Service bypassed every level."""
    run_kvops("manifests", *EXAMPLE, "--target", "llm-d", "--out", str(tmp_path))
    deployment = yaml.safe_load((tmp_path / "deployment.yaml").read_text())
    engine, sidecar = deployment["spec"]["template"]["spec"]["containers"]
    assert "--middleware" not in engine["args"] and "--proxy" in sidecar["args"]
    service = yaml.safe_load((tmp_path / "service.yaml").read_text())
    assert service["spec"]["ports"][0]["targetPort"] == "kvops-proxy"


def test_the_proxys_port_is_checked_like_the_sidecars(run_kvops):
    """The admission proxy listens on --kvops-port + 1: --kvops-port 65535 wrote containerPort 65536 (which the API
    server refuses) and --kvops-port 79 for TGI put the proxy on the engine's port 80 (the sidecar cannot bind it);
    only --kvops-port 80 itself was refused."""
    for args, message in (
        (["--engine", "tgi", "--kvops-port", "65535"], "listens on the next port, 65536, past 65535"),
        (["--engine", "tgi", "--kvops-port", "79"], "listens on the next port, 80, the engine's port"),
        (["-dp", "2", "--kvops-port", "7999"], "listens on the next port, 8000, the engine's port"),
        (["--engine", "tgi", "--kvops-port", "80"], "80 is the engine's port"),
    ):
        ran = run_kvops("manifests", *EXAMPLE, *args, expect=2)
        assert message in ran.stderr and len(ran.stderr.strip().splitlines()) == 1 and not ran.stdout, args
    # the middleware's deployment runs no proxy: the next port is nobody's
    objects = k8s_objects(run_kvops("manifests", *EXAMPLE, "--kvops-port", "7999").stdout)
    sidecar = next(o for o in objects if o["kind"] == "Deployment")["spec"]["template"]["spec"]["containers"][1]
    assert [port["containerPort"] for port in sidecar["ports"]] == [7999]


def test_the_help_says_who_applies_the_levels(run_kvops):
    """`kvops manifests --help` said the sidecar's proxy admits requests and the Service goes through it, and that
    --kvops-port is the proxy's port too; vLLM's middleware applies them by default, and the proxy is on the next
    port."""
    text = " ".join(run_kvops("manifests", "--help").stdout.split())
    assert "vLLM's own API server (--middleware)" in text
    assert "its admission proxy, where it applies the levels, listens on the next one" in text


def _claimed(doc: str, pattern: str) -> int:
    match = re.search(pattern, (REPO / doc).read_text())
    assert match, f"{doc} no longer says {pattern!r}"
    return int(match.group(1))


def test_the_catalog_sizes_the_planning_page_gives_are_the_catalogs(run_kvops):
    """docs/planning.md said `--gpu` takes "the 29 parts of kvops/catalog/gpus.json" and `kvops models` lists "the
    89 entries": `kvops plan --help` names 31 GPUs and `kvops models --json` lists 94 models."""
    from kvops.gpus import gpu_catalog

    models = json.loads(run_kvops("models", "--json").stdout)
    assert _claimed("docs/planning.md", r"`kvops models` lists the\s+(\d+) entries") == len(models)
    assert _claimed("docs/planning.md", r"the (\d+) parts of `kvops/catalog/gpus.json`") == len(gpu_catalog())


def test_the_sweep_page_gives_its_default_engines(run_kvops):
    """docs/planning.md listed `--engines vllm,tgi` beside the other options' defaults; the default is vLLM alone."""
    text = " ".join((REPO / "docs/planning.md").read_text().split())
    assert "by default vLLM, `--engines vllm,tgi` adds TGI" in text
    assert "[default: vllm]" in " ".join(run_kvops("sweep", "--help").stdout.split())
