"""Defects found by trying kvops as a new user would (2026-12-07), each as the command that showed it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvops.model import load_model
from tests.support.paths import FIXTURES


def model_dir(tmp_path: Path, name: str, **fields) -> str:
    """Llama-3-8B's config.json with `fields` replaced (None removes one), in its own folder."""
    config = dict(load_model("llama-3-8b").config_json)
    for key, value in fields.items():
        if value is None:
            config.pop(key, None)
        else:
            config[key] = value
    folder = tmp_path / name
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config))
    return str(folder)


def plan_doc(run_kvops, *args: str, expect: int = 0) -> dict:
    return json.loads(run_kvops("plan", *args, "--format", "json", expect=expect).stdout)


@pytest.mark.parametrize("engine", ["vllm", "tgi"])
def test_a_given_max_model_len_stands_where_the_config_names_no_context(run_kvops, tmp_path, engine):
    """The plan asked for --max-model-len although it was given."""
    model = model_dir(tmp_path, "m", max_position_embeddings=0)
    doc = plan_doc(run_kvops, "-m", model, "--gpu", "L40S", "--max-model-len", "4096", "--engine", engine)
    assert doc["capacity"]["max_model_len"] == 4096
    if engine == "tgi":
        ran = run_kvops("plan", "-m", model, "--gpu", "L40S", "--engine", engine, expect=2)
        assert "has no max_position_embeddings: give --max-model-len N" in ran.stderr
        return
    # vLLM runs 2,048 where the config names no context (vllm/config/model.py _get_and_verify_max_len)
    doc = plan_doc(run_kvops, "-m", model, "--gpu", "L40S", "--engine", engine)
    assert doc["capacity"]["max_model_len"] == 2048
    assert any(note.startswith("max-model-len 2048: the config names no context") for note in doc["notes"])


def test_max_replicas_below_replicas_is_one_line_not_a_scaled_object_keda_rejects(run_kvops, tmp_path):
    """minReplicaCount 3 above maxReplicaCount 1 had been written."""
    ran = run_kvops(
        "manifests", "-m", "llama-3.1-8b", "--gpu", "H100", "--max-model-len", "8192", "--autoscale", "keda",
        "--max-replicas", "1", "--replicas", "3", "-o", str(tmp_path / "out"), expect=2,
    )  # fmt: skip
    assert ran.stderr.splitlines()[-1] == (
        "kvops: error: --max-replicas 1 is below --replicas 3, the fewest pods the autoscaler keeps; give 3 or more"
    )
    assert not (tmp_path / "out").exists()


def test_a_logs_device_total_names_the_nearest_gpu_and_a_profile_without_gpu_records_it(run_kvops, tmp_path):
    """An H100's 79.19 GiB had been named an A100-80GB (the first part within the driver's share), and a profile
    saved without --gpu recorded 'custom', so every plan with it warned of another GPU."""
    from kvops.engines.device_total import engine_total
    from kvops.engines.vllm.calibrate import gpu_of_total

    h100 = engine_total("H100-80GB")
    assert h100 is not None and gpu_of_total(h100.bytes) == "H100-80GB"
    log = FIXTURES / "corpus" / "vllm" / "vllm-0.19.0-h100-llama-3.1-8b-instruct-tp1-8192-llmd.log"
    profile = tmp_path / "p.yaml"
    run_kvops("calibrate", "--vllm-log", str(log), "--save", str(profile))
    assert "gpu: H100-80GB\n" in profile.read_text()


def test_more_pipeline_stages_than_layers_is_one_line(run_kvops):
    """--pp 100 on a 16-layer model had planned 100 GPUs of KV, 84 stages holding no layer."""
    ran = run_kvops("plan", "-m", "llama-3.2-1b-instruct", "--gpu", "H100", "--pp", "100", expect=2)
    assert "--pipeline-parallel-size 100: meta-llama/Llama-3.2-1B-Instruct has 16 decoder layers" in ran.stderr
    assert "give at most 16" in ran.stderr
    run_kvops("plan", "-m", "llama-3.2-1b-instruct", "--gpu", "H100", "--pp", "16")


def test_a_request_of_no_prompt_is_refused_in_a_workload_file_and_by_flag(run_kvops, tmp_path):
    """Zero-token requests had planned 'fits yes, 0 requests at once, each holding 0 KV tokens'."""
    workload = tmp_path / "w.jsonl"
    workload.write_text('{"prompt_tokens": 12, "gen_tokens": 5}\n{"prompt_tokens": 0, "gen_tokens": 0}\n')
    args = ("plan", "-m", "llama-3.1-8b", "--gpu", "H100", "--max-model-len", "8192")
    ran = run_kvops(*args, "--workload", str(workload), expect=2)
    assert ran.stderr.strip().endswith(
        f"{workload}:2: prompt length 0; a request has at least 1 prompt token (the engines refuse an empty prompt)"
    )
    assert "--prompt-tokens" in run_kvops(*args, "--prompt-tokens", "0", expect=2).stderr


def test_a_size_reads_the_same_typed_or_pasted_as_vllm_reads_it(run_kvops):
    """`--kv-cache-memory-bytes 20G` typed had been 20,000,000,000 bytes, pasted in a command 20 GiB (vLLM's)."""
    args = ("-m", "llama-3.1-8b", "--gpu", "H100", "--max-model-len", "8192")
    typed = plan_doc(run_kvops, *args, "--kv-cache-memory-bytes", "20G")
    pasted = plan_doc(
        run_kvops,
        "--gpu",
        "H100",
        "--from-command",
        "vllm serve meta-llama/Llama-3.1-8B --max-model-len 8192 --kv-cache-memory-bytes 20G",
    )
    assert typed["flags"]["kv-cache-memory-bytes"] == pasted["flags"]["kv-cache-memory-bytes"] == 20 << 30
    ran = run_kvops("plan", *args, "--gpu-memory", "80", expect=2)
    assert "--gpu-memory '80' is 80 bytes; give the device's memory with a unit, e.g. 80GiB" in ran.stderr


@pytest.mark.parametrize(
    "command, typed, planned",
    [
        ("docker run --gpus all vllm/vllm-openai:v0.8.5 --model meta-llama/Llama-3.1-8B --max-model-len 8192", (), "0.8.5"),
        ("docker run --gpus all vllm/vllm-openai:v0.8.5 --model meta-llama/Llama-3.1-8B --max-model-len 8192", ("--engine-version", "0.19.0"), "0.19.0"),
        ("docker run --gpus all ghcr.io/huggingface/text-generation-inference:3.0.1 --model-id meta-llama/Llama-3.1-8B", (), "3.0.1"),
    ],
)  # fmt: skip
def test_a_docker_lines_image_tag_is_the_release_planned(run_kvops, command, typed, planned):
    """vllm/vllm-openai:v0.8.5 had been planned as 0.34.0, 14% more KV than 0.8.5 gives."""
    doc = plan_doc(run_kvops, "--gpu", "H100", "--from-command", command, *typed)
    assert doc["engine_version"]["version"] == planned
    latest = command.replace(":v0.8.5", ":latest").replace(":3.0.1", ":latest")
    newest = plan_doc(run_kvops, "--gpu", "H100", "--from-command", latest)["engine_version"]["version"]
    assert newest != "0.8.5" and newest != "3.0.1"


def test_a_local_model_folder_is_mounted_at_an_absolute_path_the_engine_is_given(run_kvops, tmp_path, monkeypatch):
    """`-v m4:m4:ro` had been emitted: docker reads m4 as a named volume and a relative container path fails."""
    monkeypatch.chdir(tmp_path)
    model_dir(tmp_path, "m4")
    args = ("-m", "m4", "--gpu", "H100", "--max-model-len", "4096")
    line = run_kvops("plan", *args, "--format", "docker").stdout
    assert f"-v {tmp_path / 'm4'}:/models/m4:ro vllm/vllm-openai:" in line
    assert line.split("vllm/vllm-openai:")[1].split()[1] == "/models/m4"
    run_kvops("manifests", *args, "-t", "compose", "-o", "out")
    compose = (tmp_path / "out" / "compose.yaml").read_text()
    assert f"- {tmp_path / 'm4'}:/models/m4:ro" in compose and "- /models/m4\n" in compose


def test_a_larger_gpu_way_out_says_to_drop_the_memory_override_it_needs(run_kvops):
    """'+ --gpu L40S: fits' had been offered where --gpu L40S --gpu-memory 20GiB still does not fit."""
    ran = run_kvops("plan", "-m", "llama-3.1-8b", "--gpu", "H100", "--gpu-memory", "20GiB", expect=3)
    assert "+ --gpu L40S without --gpu-memory: fits" in ran.stdout + ran.stderr


def test_explain_with_nvidia_smi_takes_held_before_startup_from_torchs_own_total(run_kvops, tmp_path):
    """nvidia-smi's total less torch's free had read 990.68 MiB held before startup where the log says 522 MiB
    (two totals 460 MiB apart); more used than the device holds had printed a negative free."""
    log = FIXTURES / "corpus" / "vllm" / "vllm-0.19.0-h100-llama-3.1-8b-instruct-tp1-8192-llmd.log"
    smi = tmp_path / "smi.csv"
    smi.write_text("memory.total [MiB], memory.used [MiB]\n81559 MiB, 78500 MiB\n")
    ran = run_kvops("explain", "--vllm-log", str(log), "--nvidia-smi", str(smi))
    assert "held before startup  ~522.24 MiB" in ran.stdout
    smi.write_text("memory.total [MiB], memory.used [MiB]\n81559 MiB, 90000 MiB\n")
    ran = run_kvops("explain", "--vllm-log", str(log), "--nvidia-smi", str(smi), expect=None)
    assert ran.exit_code != 0 and "more used than the device holds" in ran.stderr.strip().splitlines()[-1]


@pytest.mark.parametrize(
    "option, words",
    [
        (("--num-gpu-blocks-override", "100"), "--num-gpu-blocks-override is a vLLM option"),
        (("--enforce-eager",), "TGI runs without CUDA graphs with --cuda-graphs 0"),
        (("--enable-lora",), "--enable-lora is a vLLM option"),
        (("-dcp", "2"), "--decode-context-parallel-size is a vLLM option"),
        (("--compilation-config", "{}"), "--compilation-config is a vLLM option"),
        (("--disable-sliding-window",), "--disable-sliding-window is a vLLM option"),
    ],
)
def test_a_vllm_option_on_a_tgi_plan_is_one_line_not_a_plan_that_ignores_it(run_kvops, option, words):
    ran = run_kvops("plan", "-m", "llama-3.1-8b", "--gpu", "H100", "--engine", "tgi", *option, expect=2)
    assert words in ran.stderr


def test_a_pasted_option_without_its_value_says_so(run_kvops):
    """'--gpu-memory-utilization None is not a number between 0 and 1' had named a value never given."""
    command = "vllm serve meta-llama/Llama-3.1-8B --gpu-memory-utilization"
    ran = run_kvops("plan", "--gpu", "H100", "--from-command", command, expect=2)
    assert "--from-command: --gpu-memory-utilization needs a value; the engine refuses it without one" in ran.stderr


@pytest.mark.parametrize(
    "engine, version, words",
    [
        ("vllm", "0.19.0-foo", "'0.19.0-foo' is not a release"),
        ("vllm", "0.0.1", "vLLM's first release is 0.1.0"),
        ("tgi", "0.19.0", "TGI has no release 0.19.0 (0.9.4, then 1.0.0)"),
    ],
)
def test_a_release_that_does_not_exist_is_one_line_not_a_plan_headed_with_it(run_kvops, engine, version, words):
    ran = run_kvops(
        "plan", "-m", "llama-3.1-8b", "--gpu", "H100", "--engine", engine, "--engine-version", version, expect=2
    )
    assert words in ran.stderr


@pytest.mark.parametrize("version", ["0.8.5.post1", "0.10.1.dev101+gbda9d0535", "0.19.0rc1", "v0.19.0", "0.8.5-v0"])
def test_releases_as_engines_print_them_still_plan(run_kvops, version):
    run_kvops("plan", "-m", "llama-3.1-8b", "--gpu", "H100", "--max-model-len", "8192", "--engine-version", version)


def test_calibrating_a_run_against_another_model_says_whose_differences_they_are(run_kvops):
    """--model llama-3.1-70b on an 8B run had printed a KV error of -199% as the plan's."""
    log = FIXTURES / "corpus" / "vllm" / "vllm-0.19.0-h100-llama-3.1-8b-instruct-tp1-8192-llmd.log"
    ran = run_kvops("calibrate", "--vllm-log", str(log), "-m", "llama-3.1-70b", "--gpu", "H100")
    assert (
        "the run loaded meta-llama/Llama-3.1-8B-Instruct, the prediction is for --model meta-llama/Llama-3.1-70B"
        in ran.stderr
    )
    assert "the run loaded" not in run_kvops("calibrate", "--vllm-log", str(log)).stderr


def test_a_missing_choice_is_one_line(run_kvops):
    """click lists an option's choices over three lines."""
    ran = run_kvops("alerts", expect=2)
    line = ran.stderr.strip().replace("main", "kvops")  # main: CliRunner's name for the program
    assert line == "kvops alerts: error: Missing option '--engine'. Choose from: vllm, tgi (see `kvops alerts --help`)"


def test_an_a100_without_its_size_is_one_line_not_the_80gb_part(run_kvops):
    """--gpu A100 had meant the 80 GB part: an A100-40GB user's plan promised twice the memory."""
    ran = run_kvops("plan", "-m", "llama-3.1-8b", "--gpu", "A100", expect=2)
    assert "--gpu 'A100' names two parts, A100-40GB and A100-80GB: give one" in ran.stderr
    assert (
        plan_doc(run_kvops, "-m", "llama-3.1-8b", "--gpu", "NVIDIA A100-SXM4-40GB", "--max-model-len", "8192")["gpu"][
            "id"
        ]
        == "A100-40GB"
    )


@pytest.mark.parametrize(
    "config, words",
    [
        ('{"cudagraph_mode": "BOGUS"}', "cudagraph_mode 'BOGUS' is not a mode vLLM has; valid: NONE, PIECEWISE"),
        ('{"cudagraph_capture_sizes": [-1, 0]}', "cudagraph_capture_sizes [-1, 0]: each is a batch size, 1 or more"),
    ],
)
def test_a_compilation_config_vllm_refuses_is_one_line(run_kvops, config, words):
    ran = run_kvops("plan", "-m", "llama-3.1-8b", "--gpu", "H100", "--compilation-config", config, expect=2)
    assert words in ran.stderr


def _mixed_requests(path: Path) -> Path:
    """Long prompts with short answers and short prompts with long ones: every request 3,050 tokens."""
    lines = [
        {
            "arrival_s": 0.5 * index,
            "prompt_tokens": 3000 if index % 2 else 50,
            "output_tokens": 50 if index % 2 else 3000,
        }
        for index in range(20)
    ]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def test_a_workload_is_sized_at_its_p95_request_not_the_p95_prompt_plus_the_p95_output(run_kvops, tmp_path):
    """Every request 3,050 tokens had been sized as 6,000 (p95 prompt 3,000 + p95 output 3,000): beyond a 4,096
    context, 'vLLM rejects every one of them'; and `kvops simulate` refused the trace."""
    trace = _mixed_requests(tmp_path / "mix.jsonl")
    args = ("-m", "llama-3.1-8b", "--gpu", "L4", "--max-model-len", "4096")
    doc = plan_doc(run_kvops, *args, "--workload", str(trace))
    assert doc["capacity"]["tokens_per_request"] == 3050
    ran = run_kvops("simulate", *args, "--trace", str(trace), "--json")
    assert json.loads(ran.stdout)["arms"][0]["completed"] == 20


def test_max_num_seqs_stays_within_the_token_budget_as_vllm_requires(run_kvops):
    """--max-num-batched-tokens 100 had been emitted beside --max-num-seqs 256, a line vLLM refuses to start."""
    args = ("-m", "llama-3.1-8b", "--gpu", "L4", "--max-model-len", "4096", "--max-num-batched-tokens", "100")
    assert plan_doc(run_kvops, *args)["flags"]["max-num-seqs"] == 100
    ran = run_kvops("plan", *args, "--max-num-seqs", "200", expect=2)
    assert "--max-num-seqs 200 is above --max-num-batched-tokens 100: vLLM refuses to start" in ran.stderr


def test_a_cpu_deployment_says_how_its_kv_cache_is_sized_and_takes_no_gpu(run_kvops):
    """--device cpu --gpu L4 had headed a CPU run 'on 1 x L4'; without --gpu it had asked for one."""
    args = ("-m", "llama-3.1-8b", "--device", "cpu", "--max-model-len", "4096")
    assert (
        "--device cpu: give the KV cache's size with --kv-cache-memory-bytes"
        in run_kvops("plan", *args, expect=2).stderr
    )
    ran = run_kvops("plan", *args, "--gpu", "L4", expect=2)
    assert "--gpu L4 with --device cpu: the CPU build keeps its KV cache in host memory" in ran.stderr


@pytest.mark.parametrize(
    "extra, words",
    [
        (
            ("-e", "tgi", "-t", "production-stack"),
            "--target production-stack serves vLLM; for tgi give --target k8s or compose",
        ),
        (("-t", "production-stack", "--release", "My.Release"), "'My.Release' must be lowercase letters"),
        (("-t", "dynamo", "--guard"), "--guard: --target dynamo runs its own vLLM image, without the kvops plugin"),
        (("--autoscale", "keda", "--prometheus-url", "not a url"), "'not a url' is not an http(s) URL with a host"),
        (("--kvops-image", "Bad Image::"), "'Bad Image::' is not an image reference"),
        (("--name", ""), "'' must be lowercase letters"),
    ],
)
def test_manifests_refuse_what_the_target_cannot_deploy_in_one_line(run_kvops, tmp_path, extra, words):
    """A TGI production-stack had been a KeyError traceback; a release 'My.Release' named a ScaledObject Kubernetes
    refuses; --guard on a target whose image has no plugin, a Prometheus URL and an image that are none, and an
    empty --name had been taken as given or dropped."""
    args = (
        "manifests",
        "-m",
        "llama-3.1-8b",
        "--gpu",
        "H100",
        "--max-model-len",
        "8192",
        *extra,
        "-o",
        str(tmp_path / "o"),
    )
    ran = run_kvops(*args, expect=2)
    assert words in ran.stderr.strip().splitlines()[-1]


@pytest.mark.parametrize(
    "selector, words",
    [
        ('{namespace="prod"}', "names no job: add the engine's scrape job"),
        ("", "names no job"),
        ('{__name__="foo", job="vllm"}', "names a metric (__name__)"),
    ],
)
def test_a_selector_names_the_engines_job_and_no_metric(run_kvops, selector, words):
    """Without a job, KVMetricsStale's up{...} had fired for every other target in the namespace (the sidecar's own
    among them); a __name__ matcher had written rules promtool rejects."""
    ran = run_kvops("alerts", "--engine", "vllm", "--selector", selector, expect=2)
    assert words in ran.stderr


def test_a_signals_share_above_one_is_refused(run_kvops, tmp_path):
    """prefix_cache_hit_rate.below 1.5 had written an alert that always fires."""
    policy = tmp_path / "q.yaml"
    policy.write_text("signals:\n  prefix_cache_hit_rate: {below: 1.5}\n")
    ran = run_kvops("alerts", "--engine", "vllm", "--policy", str(policy), expect=None)
    assert ran.exit_code != 0 and "signals.prefix_cache_hit_rate.below 1.5 must be a number in [0, 1]" in ran.stderr


def test_plot_names_its_file_with_a_formats_extension(run_kvops, tmp_path):
    """`-o x` had printed 'wrote x' where matplotlib wrote x.png."""
    pytest.importorskip("matplotlib")
    ran = run_kvops("plot", "-m", "llama-3.1-8b", "-o", str(tmp_path / "x"), expect=1)
    assert "name the file with its format's extension, one of: " in ran.stderr and "png" in ran.stderr
    assert not list(tmp_path.iterdir())


def test_tokens_out_needs_the_output_length_plan_sizes_by(run_kvops, tmp_path):
    """`kvops tokens -o w.jsonl` had written prompt-only lines that `kvops plan --workload` then refused."""
    prompt = tmp_path / "p.txt"
    prompt.write_text("hello world\n")
    ran = run_kvops("tokens", "--tokenizer", str(tmp_path), "-o", str(tmp_path / "w.jsonl"), str(prompt), expect=2)
    assert "--out writes a workload for kvops plan, which sizes each request by its prompt and its output" in ran.stderr


def test_a_named_deployments_rules_and_jobs_follow_its_name(run_kvops, tmp_path):
    """--name foo had still written the PrometheusRule kvops-vllm over {job="vllm"}: two deployments in a namespace
    replaced each other's rules (their plan's headroom among them) and merged their series."""
    import yaml

    args = ("manifests", "-m", "llama-3.1-8b", "--gpu", "H100", "--max-model-len", "8192", "--name", "foo")
    run_kvops(*args, "-o", str(tmp_path / "o"))
    rule = yaml.safe_load((tmp_path / "o" / "prometheusrule.yaml").read_text())
    assert rule["metadata"]["name"] == "kvops-foo"
    exprs = [item["expr"] for group in rule["spec"]["groups"] for item in group["rules"]]
    assert all('job="vllm"' not in expr for expr in exprs) and any('job="foo"' in expr for expr in exprs)
    monitor = yaml.safe_load((tmp_path / "o" / "podmonitor.yaml").read_text())
    jobs = [endpoint["relabelings"][0]["replacement"] for endpoint in monitor["spec"]["podMetricsEndpoints"]]
    assert jobs == ["foo", "kvops-foo"]


def test_a_local_model_folder_in_pods_is_warned_of(run_kvops, tmp_path, monkeypatch):
    """A Deployment whose engine loads a folder of this machine, which no volume holds, had been written silently."""
    monkeypatch.chdir(tmp_path)
    model_dir(tmp_path, "lm")
    ran = run_kvops("manifests", "-m", "lm", "--gpu", "H100", "--max-model-len", "4096", "-o", "out")
    assert "the engine loads lm, a folder on this machine: a pod sees it only where a volume holds it" in ran.stderr


def test_explain_says_when_a_logs_figures_cannot_all_be_true(run_kvops, tmp_path):
    """Weights of 99.99 GiB on a 79.19 GiB device had been explained as 'started', free -82 GiB."""
    log = FIXTURES / "corpus" / "vllm" / "vllm-0.19.0-h100-llama-3.1-8b-instruct-tp1-8192-bf16-llmd.log"
    edited = tmp_path / "edited.log"
    edited.write_text(log.read_text().replace("Model loading took 14.99 GiB", "Model loading took 99.99 GiB"))
    text = run_kvops("explain", "--vllm-log", str(edited)).stdout
    assert "the figures do not add up: weights ~99.99 GiB is more than the device total ~79.19 GiB" in text
    assert "do not add up" not in run_kvops("explain", "--vllm-log", str(log)).stdout


def _file(tmp_path: Path, body: str) -> str:
    path = tmp_path / "kvops.yaml"
    path.write_text("model: llama-3-8b\ngpu: H100-80GB\n" + body)
    return str(path)


@pytest.mark.parametrize(
    "body, typed",
    [
        ("no-vmm: true\n", ("--no-vmm",)),  # had turned VMM on: the file's true was the parameter's value
        ("no-vmm: false\n", ()),
        ("engine-version: 0.10\n", ("--engine-version", "0.10")),  # YAML had read the float 0.1
        ("max-model-len: 010\n", ("--max-model-len", "010")),  # and 8, octal
        ("tp: 2\ndisable-custom-all-reduce: true\n", ("--tp", "2", "--disable-custom-all-reduce")),
        # a bare max_size had been bytes (5.96e-08 GiB) where --kv-offloading-size takes GiB
        ("kv_cache: {swap: {enabled: true, max_size: 64}}\n", ("--kv-offloading-size", "64")),
    ],
)
def test_a_file_value_plans_as_the_same_option_typed(run_kvops, tmp_path, body, typed):
    from_file = plan_doc(run_kvops, "-f", _file(tmp_path, body))
    assert from_file["flags"] == plan_doc(run_kvops, "-m", "llama-3-8b", "--gpu", "H100-80GB", *typed)["flags"]


@pytest.mark.parametrize(
    "body, words",
    [
        ("max-model-len: true\n", "max-model-len is true; --max-model-len takes a value, not a switch"),
        ("max-model-len: 4096\nmax-model-len: 8192\n", "the key 'max-model-len' is given twice"),
        ("enforce-eager: 3\n", "enforce-eager '3': a switch, true or false"),
    ],
)
def test_a_file_value_no_option_takes_is_one_line(run_kvops, tmp_path, body, words):
    """max-model-len: true had emitted '--max-model-len' without a value (false: a ZeroDivisionError traceback)."""
    ran = run_kvops("plan", "-f", _file(tmp_path, body), expect=2)
    assert words in ran.stderr and len(ran.stderr.strip().splitlines()) == 1


def test_a_pasted_command_wins_over_the_file_and_a_typed_option_over_both(run_kvops, tmp_path):
    """The file's tp 2 had replaced the pasted command's -tp 8."""
    path = tmp_path / "kvops.yaml"
    path.write_text("tp: 2\nmax-model-len: 4096\ngpu-memory-utilization: 0.8\n")
    command = "vllm serve meta-llama/Meta-Llama-3-8B -tp 8 --max-model-len 16384"
    flags = plan_doc(run_kvops, "-f", str(path), "--gpu", "H100-80GB", "--from-command", command)["flags"]
    assert (flags["tensor-parallel-size"], flags["max-model-len"], flags["gpu-memory-utilization"]) == (8, 16384, 0.8)
    typed = plan_doc(run_kvops, "-f", str(path), "--gpu", "H100-80GB", "--tp", "4", "--from-command", command)
    assert typed["flags"]["tensor-parallel-size"] == 4


def test_a_relative_path_in_the_file_is_read_beside_the_file(run_kvops, tmp_path, monkeypatch):
    """From another folder, `policy: policy.yaml` had read ./policy.yaml (or failed), not the one beside the file."""
    project = tmp_path / "project"
    project.mkdir()
    (project / "policy.yaml").write_text(
        (Path(__file__).resolve().parents[3] / "kvops" / "data" / "policy.yaml")
        .read_text()
        .replace("warn: 0.7", "warn: 0.5")
    )
    (project / "kvops.yaml").write_text("model: llama-3-8b\ngpu: H100-80GB\nmax-model-len: 8192\npolicy: policy.yaml\n")
    monkeypatch.chdir(tmp_path)
    beside = plan_doc(run_kvops, "-f", "project/kvops.yaml")
    typed = plan_doc(
        run_kvops,
        "-m",
        "llama-3-8b",
        "--gpu",
        "H100-80GB",
        "--max-model-len",
        "8192",
        "--policy",
        str(project / "policy.yaml"),
    )
    assert beside["capacity"]["requests_under_warn"] == typed["capacity"]["requests_under_warn"]
    default = plan_doc(run_kvops, "-m", "llama-3-8b", "--gpu", "H100-80GB", "--max-model-len", "8192")
    assert beside["capacity"]["requests_under_warn"] < default["capacity"]["requests_under_warn"]


def test_explain_says_which_typed_options_the_run_states_otherwise(run_kvops):
    """--tp 4 and --max-model-len 32768 beside a tp-2, 8,192-token run had changed nothing and said nothing."""
    log = FIXTURES / "corpus" / "vllm" / "vllm-0.19.0-h100-llama-3.1-8b-instruct-tp2-8192-llmd.log"
    text = run_kvops("explain", "--vllm-log", str(log), "--tp", "4", "--max-model-len", "32768").stdout
    assert "--tp 4 is not the run's own (2): the figures the run reports are for its own" in " ".join(text.split())
    assert "not the run's own" not in run_kvops("explain", "--vllm-log", str(log), "-m", "llama-3.1-8b-instruct").stdout
