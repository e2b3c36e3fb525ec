"""`kvops plan --from-command`: launch lines as users paste them from issue threads (bench/launches.json holds the
real ones), read into the plan's options; every option not read gets its own line; bad input is one line."""

from __future__ import annotations

import json

import pytest


def plan(run_kvops, *args: str) -> dict:
    return json.loads(run_kvops("plan", "--format", "json", *args).stdout)


def test_a_vllm_serve_line_sets_the_plan(run_kvops):
    stated = plan(
        run_kvops,
        "--gpu",
        "NVIDIA H100 80GB HBM3",
        "--from-command",
        "CUDA_VISIBLE_DEVICES=0,1 vllm serve Qwen/Qwen3-32B -tp 2 --max-model-len 32K"
        " --gpu-memory-utilization 0.85 --max-num-seqs 8 --port 8000 --no-such-flag",
    )
    assert (stated["model"], stated["tp"], stated["gpu"]["id"]) == ("Qwen/Qwen3-32B", 2, "H100-80GB")
    assert stated["flags"]["max-model-len"] == 32768
    assert stated["flags"]["gpu-memory-utilization"] == 0.85
    assert stated["flags"]["max-num-seqs"] == 8
    assert stated["command"]["port"] == 8000  # read: the plan serves on it
    # vLLM 0.34.0 (planned) refuses an option of no release: named, and left out so the command starts
    assert any(line.startswith("--no-such-flag: unknown") for line in stated["from_command"])
    assert stated["command"]["argv"][-2:] == ["--port", "8000"]  # kept as given


def test_options_given_beside_the_command_win(run_kvops):
    stated = plan(
        run_kvops,
        "--gpu",
        "h100",
        "--max-model-len",
        "8192",
        "--from-command",
        "vllm serve Qwen/Qwen3-32B --max-model-len 32768",
    )
    assert stated["flags"]["max-model-len"] == 8192


def test_the_api_server_modules_of_older_threads_are_read(run_kvops):
    stated = plan(
        run_kvops,
        "--gpu",
        "T4",
        "--from-command",
        'python -m vllm.entrypoints.api_server --model="meta-llama/Llama-3.2-3B-Instruct" --dtype=float16 --max-model-len 4096',
    )
    assert stated["model"] == "meta-llama/Llama-3.2-3B-Instruct" and stated["gpu"]["id"] == "T4"


def test_a_tgi_docker_line_sets_shards_fraction_quantize_and_speculate(run_kvops):
    stated = plan(
        run_kvops,
        "--gpu",
        "A100 80 GB",
        "--from-command",
        "docker run --gpus all ghcr.io/huggingface/text-generation-inference:3.3.7 --model-id"
        " meta-llama/Llama-3.1-70B-Instruct --num-shard 2 --cuda-memory-fraction 0.9 --quantize fp8 --speculate 2",
    )
    assert stated["engine"] == "tgi" and stated["tp"] == 2
    flags = stated["flags"]
    assert (flags["cuda-memory-fraction"], flags["quantize"], flags["speculate"]) == (0.9, "fp8", 2)
    budget = next(term for term in stated["memory"]["terms"] if term["name"] == "budget")
    assert "cuda_memory_fraction 0.9" in budget["formula"]
    assert any("--speculate 2" in note for note in stated["notes"])


@pytest.mark.parametrize(
    "command, says",
    [
        ("vllm serve Qwen/Qwen3-32B --quantization bitsandbytes", "vLLM 0.32 has no bitsandbytes quantization"),
        ("vllm serve Qwen/Qwen3-32B --quantization nope", "is not a vLLM 0.32 quantization"),
        ("python train.py --model Qwen/Qwen3-32B", "starts no engine kvops plans"),
        ("vllm serve Qwen/Qwen3-32B --max-model-len lots", "--max-model-len"),
        ("vllm serve Qwen/Qwen3-32B --scheduling-policy lifo", "--scheduling-policy 'lifo'; valid: fcfs, priority"),
        ("vllm serve Qwen/Qwen3-32B --watermark 1", "--watermark '1' must be in [0, 1)"),
        (
            "vllm serve Qwen/Qwen3-32B --cache-aware-admission-window -1",
            "--cache-aware-admission-window '-1' must be 0",
        ),
    ],
)
def test_bad_launch_lines_are_one_line(run_kvops, command, says):
    ran = run_kvops("plan", "--gpu", "h100", "--from-command", command, expect=None)
    assert ran.exit_code != 0 and len(ran.stderr.strip().splitlines()) == 1
    assert says in ran.stderr and "Traceback" not in ran.stderr


def test_auto_round_as_earlier_vllm_spelled_it_plans(run_kvops):
    stated = plan(
        run_kvops, "--gpu", "h100", "--from-command", "vllm serve Qwen/Qwen3-32B -tp 2 --quantization auto_round"
    )
    assert "quantization" not in stated["flags"]  # vLLM 0.32 reads the format from the checkpoint's config


def test_tgi_refuses_vllm_only_options_in_one_line(run_kvops):
    ran = run_kvops("plan", "--engine", "tgi", "--gpu", "h100", "-m", "Qwen/Qwen3-32B", "--pp", "2", expect=None)
    assert ran.exit_code != 0 and len(ran.stderr.strip().splitlines()) == 1
    assert "TGI has no pipeline parallelism" in ran.stderr


@pytest.mark.parametrize("name, gpu", [("A100 80 GB", "A100-80GB"), ("A100 80G", "A100-80GB"), ("Tesla T4", "T4")])
def test_gpu_names_as_threads_write_them(run_kvops, name, gpu):
    assert plan(run_kvops, "--gpu", name, "-m", "Qwen/Qwen3-0.6B")["gpu"]["id"] == gpu


@pytest.mark.parametrize("model", ["nvidia/Qwen3.6-35B-A3B-NVFP4", "nvidia/Qwen3.6-27B-NVFP4"])
def test_modelopt_mixed_precision_is_counted_at_the_wider_format_and_says_so(run_kvops, model):
    stated = plan(run_kvops, "--gpu", "h100", "-m", model, "--max-model-len", "32768")
    weights = next(term for term in stated["memory"]["terms"] if term["name"] == "weights")
    assert "ModelOpt mixed precision" in weights["formula"] and "an overestimate" in weights["formula"]


@pytest.mark.parametrize(
    "args",
    [
        ("-m", "deepseek-ai/DeepSeek-V3", "-dp", "8", "-ep"),
        ("--from-command", "vllm serve deepseek-ai/DeepSeek-V3 -dp=8 --enable-expert-parallel"),
    ],
    ids=["options", "command"],
)
def test_data_parallel_alone_is_replicas_of_one_gpu(run_kvops, args):
    stated = plan(run_kvops, "--gpu", "h200", "--max-model-len", "32768", *args)
    assert (stated["tp"], stated["gpus"]) == (1, 8)
    assert stated["flags"]["data-parallel-size"] == 8 and stated["flags"]["enable-expert-parallel"] is True
    weights = next(term for term in stated["memory"]["terms"] if term["name"] == "weights")
    assert "experts / 8 ranks, the rest / tp 1" in weights["formula"]


def test_the_schedulers_flags_are_named_as_simulated_not_planned(run_kvops):
    stated = plan(
        run_kvops,
        "--gpu",
        "h100",
        "--from-command",
        "vllm serve Qwen/Qwen3-8B --watermark 0.05 --scheduling-policy priority --no-enable-chunked-prefill"
        " --cache-aware-admission-window 8 --max-num-active-seqs 64 --max-num-scheduled-tokens 1024",
    )
    says = "the scheduler's: does not change memory (kvops simulate runs it)"
    for flag in ("--watermark 0.05", "--scheduling-policy priority", "--max-num-scheduled-tokens 1024"):
        assert f"{flag}: {says}" in stated["from_command"]
    # chunked prefill off raises the token budget, so the profile's activation peak: planned, not set aside
    assert not any("chunked" in line for line in stated["from_command"])
    assert stated["flags"]["no-enable-chunked-prefill"] is True
    assert stated["flags"]["max-num-batched-tokens"] >= stated["flags"]["max-model-len"]
    assert f"--cache-aware-admission-window 8: {says}" in stated["from_command"]  # 0.34's, read though 0.32 lacks it
    assert any(line.startswith("--max-num-active-seqs 64: not modelled") for line in stated["from_command"])
