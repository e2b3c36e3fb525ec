"""The commands the manual shows that tests/unit/test_doc_samples.py does not run (`kvops manifests`, `alerts`, `watch
--once`, `models`, ...), run as a new user runs them: each test replays a defect found that way, a command that did
not do what its page or its own output said."""

from __future__ import annotations

import json
import re
import shlex

import pytest
import yaml

from tests.support.daemons import PROMETHEUS, PrometheusServer
from tests.support.metrics_server import MetricsServer, vllm_exposition
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


def _console_sample(doc: str, starts: str) -> tuple[str, list[str]]:
    """The `$ ` command of a console block of a document that starts with `starts`, and the lines under it."""
    lines = (REPO / doc).read_text().splitlines()
    number = next(n for n, line in enumerate(lines) if line.startswith(f"$ {starts}"))
    shown = []
    for line in lines[number + 1 :]:
        if line.startswith(("$ ", "```")):
            break
        shown.append(line)
    return lines[number][2:], shown


def _rows_sorted(lines: list[str]) -> list[str]:
    """A `--once` table's replica rows in name order: ephemeral ports order the live replicas as they fall."""
    head = next(n for n, line in enumerate(lines) if line.startswith("replica "))
    return lines[: head + 1] + sorted(lines[head + 1 :])


@pytest.mark.skipif(PROMETHEUS is None, reason="prometheus not installed (apt-get install prometheus; .ci/run does)")
def test_the_once_sample_through_prometheus_is_what_it_prints(run_kvops, tmp_path):
    """docs/watching.md's `kvops watch --prometheus ... --once` showed no `headroom:` line, which the command prints
    whenever the engines export their pool (vllm:cache_config_info): run as shown, through a real Prometheus scraping
    an idle recorded vLLM 0.32 exposition and one at 72%, its output (addresses mapped to the page's) is the page's."""
    command, shown = _console_sample("docs/watching.md", "kvops watch --engine vllm --prometheus")
    documented = re.search(r"--prometheus (\S+)", command).group(1)
    idle_name, loaded_name = (line.split()[0] for line in shown[-2:])
    with (
        MetricsServer(vllm_exposition(0.0)) as idle,
        MetricsServer(vllm_exposition(0.72)) as loaded,
        PrometheusServer(tmp_path / "prometheus", {"vllm": [idle.target, loaded.target]}) as prometheus,
    ):
        prometheus.wait_for_series("vllm:kv_cache_usage_perc", count=2)
        words = shlex.split(command.replace(documented, prometheus.url))
        printed = run_kvops(*words[1:], expect=1).stdout  # warn: exit 1
    for live, page in ((prometheus.url, documented), (idle.target, idle_name), (loaded.target, loaded_name)):
        printed = printed.replace(live, page)
    assert _rows_sorted(printed.rstrip("\n").splitlines()) == _rows_sorted(shown)


def _section(doc: str, heading: str) -> str:
    text = (REPO / doc).read_text()
    start = text.index(heading)
    end = text.find("\n## ", start + len(heading))
    return text[start : end if end > 0 else None]


def test_the_alerts_page_names_every_alert_the_command_writes(run_kvops, tmp_path):
    """docs/watching.md's table of `kvops alerts` lacked KVOffloadSaturated and KVOffloadLoadSlow (in every vLLM rule
    file) and GPUMemoryHigh (with --plan), and its synopsis showed `--engine tgi` without the capacity it requires
    (exit 2: 'needs the batch token capacity')."""
    section = _section("docs/watching.md", "## Alert rules and runbooks: `kvops alerts`")
    for engine in ("vllm", "tgi"):
        plan = tmp_path / f"{engine}.json"
        plan.write_text(run_kvops("plan", "--engine", engine, *EXAMPLE, "--json").stdout)
        written = re.findall(
            r"^  - alert: (\w+)$", run_kvops("alerts", "--engine", engine, "--plan", str(plan)).stdout, re.M
        )
        assert written and [name for name in written if f"`{name}`" not in section] == [], engine
    refused = run_kvops("alerts", "--engine", "tgi", expect=2).stderr
    synopsis = next(line for line in section.splitlines() if line.startswith("kvops alerts --engine tgi "))
    for option in ("--max-batch-total-tokens", "--plan", "--startup-log"):
        assert option in refused and option in synopsis


def test_every_written_file_names_its_command_as_the_page_says(run_kvops, tmp_path):
    """docs/deploying.md said every file `kvops manifests` writes starts with the command that generated it: compose's
    policy.yaml is the policy file as given, and the dashboard is JSON; the page now says so, and the rest hold."""
    page = " ".join((REPO / "docs/deploying.md").read_text().split())
    assert "every YAML file starts with the command that generated it, but compose's `policy.yaml`" in page
    for target in ("k8s", "compose"):
        run_kvops("manifests", *EXAMPLE, "--target", target, "--out", str(tmp_path / target))
        for path in sorted((tmp_path / target).iterdir()):
            if path.name == "kvops-dashboard.json":
                assert "Generated by `kvops dashboard`" in json.loads(path.read_text())["description"]
            elif path.name != "policy.yaml":
                assert re.match(r"# .*generated by `kvops (manifests|alerts) ", path.read_text()), path.name


def test_a_profile_calibrated_without_a_model_keeps_its_gpus_total_to_that_gpu(run_kvops, tmp_path):
    """docs/planning.md's `kvops calibrate --vllm-log vllm.log --gpu h100 --save h100.yaml` (no --model), on a log of
    an RTX 3090 (23.56 GiB), saved a profile naming no GPU: `kvops plan -m llama-3-8b --gpu h100 --profile h100.yaml`
    then planned "1 x H100-80GB (~23.56 GiB each)". The profile now names the part the log's total is, and an H100
    plan keeps the H100's total."""
    log = REPO / "tests/fixtures/logs/vllm-v1-2026-startup-summary.log"  # Free memory on device (22.93/23.56 GiB)
    profile = tmp_path / "h100.yaml"
    run_kvops("calibrate", "--vllm-log", str(log), "--gpu", "h100", "--save", str(profile))
    assert yaml.safe_load(profile.read_text())["gpu"] == "RTX-3090"
    for gpu, total in (("h100", "~79.19 GiB"), ("rtx-3090", "~23.56 GiB")):
        head = run_kvops("plan", "-m", "llama-3-8b", "--gpu", gpu, "--profile", str(profile)).stdout.splitlines()[0]
        assert f"({total} each, as the engine sees it)" in head, head


def test_the_front_page_of_the_manual_links_every_page_and_the_core_commands():
    """docs/index.md, the manual's front page, listed neither Simulating traffic nor Accuracy (both in mkdocs.yml's
    nav), its install table left out `kvops lint` (core) and `kvops simulate` (vLLM beside kvops)."""
    pages = re.findall(r"^  - [^:]+: (\S+\.md)$", (REPO / "mkdocs.yml").read_text(), re.M)
    manual = _section("docs/index.md", "## The manual")
    assert [page for page in pages if page != "index.md" and f"]({page})" not in manual] == []
    install = _section("docs/index.md", "## Install")
    core = next(line for line in install.splitlines() if line.startswith("| `kvops` |"))
    assert "`lint`" in core and "`kvops simulate`" in install


def test_the_readmes_first_plan_does_not_say_a_windowed_request_holds_its_whole_context(run_kvops):
    """README's first command, `kvops plan --model mistral-7b-v0.1 --gpu H100-80GB`, said "118 at 100%, each holding
    32,768 KV tokens" under "KV tokens 807,100": 118 such requests would hold 3.9 million. Mistral's sliding layers
    keep 4,096 tokens: a 32,768-token request held 257 blocks of 16 (what 118 x 257 of 31,551 usable blocks say);
    at vLLM 0.34's 64-token default block, 4,096 / 64 + 1 = 65."""
    summary = " ".join(run_kvops("plan", "--model", "mistral-7b-v0.1", "--gpu", "H100-80GB").stdout.split())
    capacity = json.loads(run_kvops("plan", "--model", "mistral-7b-v0.1", "--gpu", "H100-80GB", "--json").stdout)[
        "capacity"
    ]
    assert (capacity["tokens_per_request"], capacity["blocks_per_request"], capacity["block_size"]) == (32768, 65, 64)
    assert capacity["requests_at_full"] * capacity["blocks_per_request"] <= capacity["usable_blocks"]
    assert (
        f"{capacity['requests_at_full']} at 100%, each of 32,768 tokens in 65 blocks (sliding layers keep 4,096 of "
        "them)" in summary
    )
    assert "each holding 32,768 KV tokens" not in summary
    # a full-attention model's request holds its tokens, as before
    assert "each holding 2,500 KV tokens" in run_kvops("plan", *EXAMPLE).stdout


def test_the_failed_runs_next_action_holds_the_blocks_its_log_states(run_kvops):
    """docs/explain.md's failed run (a v0.6.4 log: '# GPU blocks: 80', vLLM's own 'maximum number of tokens that can
    be stored in KV cache (1280)') re-planned the run on its 'kv_cache_size=0.39GiB', rounded to two decimals: "the KV
    cache holds 79 (1,264 tokens): ... refuses to start: '... (1264)'", three lines under the log's 1280. The block
    count the log states narrows the rounded GiB."""
    log = "tests/fixtures/logs/vllm-v0-kv-too-small.log"
    args = ("explain", "--vllm-log", str(REPO / log), "-m", "qwen2.5-72b-instruct", "--quantization", "gptq")
    problem = json.loads(run_kvops(*args, "--enforce-eager", "--json").stdout)["action"]["problem"]
    assert "the KV cache holds 80 (1,280 tokens)" in problem and "stored in KV cache (1280)'" in problem
