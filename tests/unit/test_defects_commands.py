"""Launch lines from vLLM's and TGI's docs and recipes, pasted into `kvops plan --from-command`, and what kvops emits
for them in every format: each test replays a defect a new user met."""

from __future__ import annotations

import pytest

from tests.unit.cli.test_plan import plan_doc


@pytest.mark.parametrize(
    "command, release",
    [
        # vLLM's hotfix releases carry a fourth number (PyPI: vllm 0.9.0.1, 0.10.1.1): the tag named no release and
        # the line was planned for the newest, 0.34.0, without a word
        ("docker run --gpus all --ipc=host vllm/vllm-openai:v0.10.1.1 --model Qwen/Qwen3-8B", "0.10.1.1"),
        # TGI's images for other devices suffix the release (2.4.1-rocm): planned for 3.3.7, without a word
        (
            "docker run ghcr.io/huggingface/text-generation-inference:2.4.1-rocm --model-id Qwen/Qwen2.5-7B-Instruct",
            "2.4.1",
        ),
    ],
)
def test_a_docker_tag_with_a_hotfix_number_or_a_device_suffix_plans_its_release(run_kvops, command, release):
    doc = plan_doc(run_kvops, "--gpu", "h100", "--from-command", command)
    assert doc["engine_version"]["version"] == release
    assert any(
        line.endswith(f"planned for the release its tag names, {release} (--engine-version overrides it)")
        for line in doc["from_command"]
    )


def test_a_hotfix_release_is_a_release_and_its_image_is_its_own(run_kvops):
    """`--engine-version 0.10.1.1` was "not a release"; its docker line now runs the hotfix's own image."""
    ran = run_kvops("plan", "-m", "qwen3-8b", "--gpu", "h100", "--engine-version", "0.10.1.1", "--format", "docker")
    assert " vllm/vllm-openai:v0.10.1.1 " in ran.stdout
    assert (
        plan_doc(run_kvops, "-m", "qwen3-8b", "--gpu", "h100", "--engine-version", "0.10.1.1")["engine_version"][
            "family"
        ]
        == plan_doc(run_kvops, "-m", "qwen3-8b", "--gpu", "h100", "--engine-version", "0.10.1")["engine_version"][
            "family"
        ]
    )


@pytest.mark.parametrize("written, level", [("-O3", "3"), ("-O 0", "0"), ("-O=1", "1")])
def test_the_short_optimization_level_is_read_as_vllm_reads_it(run_kvops, written, level):
    """vLLM's recipes write -O3 (FlexibleArgumentParser turns -ON, -O=N and -O N into --optimization-level N:
    vllm/utils/argparse_utils.py, 0.32.0); kvops called it "unknown: not a vllm serve option", though -O0 captures no
    CUDA graphs at all."""
    doc = plan_doc(run_kvops, "--gpu", "h100", "--from-command", f"vllm serve Qwen/Qwen3-8B {written} --port 8001")
    says = "not modelled: the compilation level changes the CUDA graphs' memory; measure the run (kvops calibrate)"
    assert f"-O {level}: {says}" in doc["from_command"]
    kept = [*written.split(), "--port", "8001"]
    assert doc["command"]["argv"][-len(kept) :] == kept  # kept as written


def test_production_stack_values_keep_the_pasted_commands_options(run_kvops):
    """`manifests -t production-stack --from-command ...` wrote extraArgs from the plan's own flags alone: the served
    name, chat template and --hf-overrides of the pasted line were gone, without a word. The chart passes its own
    --port and --host (helm/templates/deployment-vllm-multi.yaml), so those stay out."""
    import yaml

    command = (
        "vllm serve Qwen/Qwen3-8B --served-model-name qwen 'my model' --chat-template /t/chat.jinja --port 9000 "
        """--host 0.0.0.0 --hf-overrides '{"architectures": ["Qwen3ForCausalLM"]}' --max-num-seqs 64"""
    )
    ran = run_kvops("manifests", "-t", "production-stack", "--gpu", "h100", "--from-command", command)
    values = next(yaml.safe_load_all(ran.stdout))["servingEngineSpec"]["modelSpec"][0]["vllmConfig"]
    extra = values["extraArgs"]
    assert extra[extra.index("--served-model-name") :] == [
        "--served-model-name",
        "qwen",
        "my model",
        "--chat-template",
        "/t/chat.jinja",
        "--hf-overrides",
        '{"architectures": ["Qwen3ForCausalLM"]}',
    ]
    assert values["maxNumSeqs"] == 64 and "--port" not in extra and "--host" not in extra


def test_a_dollar_in_a_pasted_value_reaches_the_engine_through_compose(run_kvops, tmp_path):
    """Compose interpolates `$VAR` in the whole file and reads `$$` as one `$` (the Compose specification,
    "Interpolation"): a chat template path or JSON value with a `$` in it was written as is, so Compose would have
    put its own $HOME in the engine's arguments (or refused an unset variable's)."""
    import re

    import yaml

    command = """vllm serve Qwen/Qwen3-8B --chat-template '/t/$HOME.jinja' --hf-overrides '{"note": "$PATH"}'"""
    run_kvops("manifests", "-t", "compose", "--out", str(tmp_path), "--gpu", "h100", "--from-command", command)
    written = yaml.safe_load((tmp_path / "compose.yaml").read_text())["services"]["vllm"]["command"]
    assert not [word for word in written if re.search(r"(?<!\$)\$(?!\$)", word.replace("$$", ""))]
    engine = [word.replace("$$", "$") for word in written]  # what Compose passes
    assert engine[engine.index("--chat-template") + 1] == "/t/$HOME.jinja"
    assert engine[engine.index("--hf-overrides") + 1] == '{"note": "$PATH"}'


@pytest.mark.parametrize(
    "options, says",
    [
        (
            "--max-num-active-seqs 2048",
            "--max-num-active-seqs 2048 is above --max-num-seqs 1024: vLLM refuses to start",
        ),
        (
            "--max-model-len 8192 --long-prefill-token-threshold 16384",
            "--long-prefill-token-threshold 16384 is above --max-model-len 8192: vLLM refuses to start",
        ),
    ],
)
def test_scheduler_flags_vllm_refuses_beside_the_plan_are_one_line(run_kvops, options, says):
    """vLLM's SchedulerConfig.verify_max_model_len (vllm/config/scheduler.py, 0.32.0-0.34.0) raises on both; the plan
    emitted them beside its own --max-num-seqs and --max-model-len as a command that would not start."""
    ran = run_kvops("plan", "--gpu", "h100", "--from-command", f"vllm serve Qwen/Qwen3-8B {options}", expect=2)
    assert says in ran.stderr and len(ran.stderr.strip().splitlines()) == 1


def test_scheduler_flags_within_the_plan_still_plan(run_kvops):
    command = (
        "vllm serve Qwen/Qwen3-8B --max-model-len 8192 --long-prefill-token-threshold 2048 --max-num-active-seqs 64"
    )
    doc = plan_doc(run_kvops, "--gpu", "h100", "--from-command", command)
    assert doc["command"]["argv"][-4:] == ["--long-prefill-token-threshold", "2048", "--max-num-active-seqs", "64"]


def test_the_environment_a_pasted_line_sets_is_named_not_dropped(run_kvops):
    """`VLLM_ALLOW_LONG_MAX_MODEL_LEN=1 vllm serve ...` (and docker's -e) vanished without a word: the plan's command
    lacks the variable, so vLLM refuses the longer context it started with; VLLM_USE_V1=0 picked the V0 engine the
    plan did not model. Each is named (never its value: a token stays out of the plan)."""
    command = (
        "VLLM_ALLOW_LONG_MAX_MODEL_LEN=1 docker run --gpus all -e VLLM_USE_V1=0 --env=HF_TOKEN=hf_secret "
        "vllm/vllm-openai:v0.9.2 Qwen/Qwen3-8B --max-model-len 8192"
    )
    doc = plan_doc(run_kvops, "--gpu", "h100", "--from-command", command)
    lines = doc["from_command"]
    assert "VLLM_ALLOW_LONG_MAX_MODEL_LEN: the environment: not in the plan's command" in "\n".join(lines)
    assert any(line.startswith("VLLM_USE_V1: picks vLLM's engine") and "0.8.5-v0" in line for line in lines)
    assert any(line.startswith("HF_TOKEN: the Hub token") for line in lines)
    assert "hf_secret" not in str(doc)


@pytest.mark.parametrize(
    "fields, config",
    [
        ("--compilation-config.cudagraph_mode NONE", {"cudagraph_mode": "NONE"}),
        (
            "-cc.cudagraph_mode=PIECEWISE -cc.max_cudagraph_capture_size 64",
            {"cudagraph_mode": "PIECEWISE", "max_cudagraph_capture_size": 64},
        ),
        ("--compilation-config.cudagraph_capture_sizes+ 1,2,4", {"cudagraph_capture_sizes": [1, 2, 4]}),
    ],
)
def test_a_compilation_configs_dotted_fields_are_read_as_vllm_reads_them(run_kvops, fields, config):
    """vLLM's parser takes a config option's fields dotted (vllm/utils/argparse_utils.py, 0.32.0: the value as JSON,
    `+` a comma list; -cc is --compilation-config): kvops refused the first ("--compilation-config 'NONE' is not a
    JSON object") and called -cc.* unknown, so a run without CUDA graphs was planned with them."""
    import json

    doc = plan_doc(run_kvops, "--gpu", "h100", "--from-command", f"vllm serve Qwen/Qwen3-8B {fields}")
    assert json.loads(doc["flags"]["compilation-config"]) == config
    assert not [line for line in doc["from_command"] if "cc." in line or "compilation" in line]
    if config == {"cudagraph_mode": "NONE"}:
        assert next(term for term in doc["memory"]["terms"] if term["name"] == "cuda_graphs")["bytes"] == 0


def test_a_speculative_configs_dotted_number_is_a_number(run_kvops):
    import json

    command = "vllm serve Qwen/Qwen3-8B --speculative-config.method ngram --speculative-config.prompt_lookup_max 3"
    doc = plan_doc(
        run_kvops, "--gpu", "h100", "--from-command", command + " --speculative-config.num_speculative_tokens 4"
    )
    assert json.loads(doc["flags"]["speculative-config"]) == {
        "method": "ngram",
        "prompt_lookup_max": 3,
        "num_speculative_tokens": 4,
    }
