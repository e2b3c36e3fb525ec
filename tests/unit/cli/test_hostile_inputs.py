"""Hostile files through the commands a user runs (issue 23): `kv`, `plan`, `explain`, `calibrate`, `alerts` and
`watch --once`, each given config.json files, policies, profiles, `-f` files, logs, nvidia-smi output, plans and
workloads that are wrong in every way the issue measured. Whatever a file holds, the command ends (a FIFO or a
device is refused, not read), and says so in one line naming the file; it never prints a Python traceback."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
import traceback

import pytest
from click.testing import CliRunner

from kvops.cli import main
from tests.support.hostile import HOSTILE_YAML, MISTRAL_CONFIG, deadline
from tests.support.paths import FIXTURES
from tests.support.processes import REPO, checkout_env

PROFILE = "kvops_profile: 1\nengine: vllm\nsource: run.log\n"
WATCH_ONCE = ["watch", "--engine", "vllm", "--metrics-url", "http://127.0.0.1:9/metrics", "--once", "--timeout", "1"]


def run(*args: str):
    """The command in-process; a hang fails the test instead of stalling the suite."""
    with deadline(120):
        return CliRunner().invoke(main, list(args), catch_exceptions=True)


def one_line_or_result(result, *args: str) -> str:
    """No traceback; a failure is one line on stderr (warnings aside). Returns that line ('' on success)."""
    exception = result.exception
    if exception is not None and not isinstance(exception, SystemExit):
        shown = "".join(traceback.format_exception(type(exception), exception, exception.__traceback__))
        pytest.fail(f"kvops {' '.join(args)} raised a traceback:\n{shown}")
    assert "Traceback" not in result.output
    lines = [line for line in result.stderr.splitlines() if line.strip() and not line.startswith("kvops: warning:")]
    if result.exit_code in (0, 3) and not lines:  # a result (plan exits 3 when the workload does not fit)
        return ""
    assert result.exit_code != 0 and len(lines) == 1, f"kvops {' '.join(args)}: exit {result.exit_code}\n{lines}"
    return lines[0]


def refused(*args: str) -> str:
    line = one_line_or_result(run(*args), *args)
    assert line, f"kvops {' '.join(args)} accepted its hostile input"
    return line


# --- config.json ------------------------------------------------------------------------------------------------

CONFIG_CASES = {
    "numbers as strings": {"num_hidden_layers": "32"},
    "1e308": {"hidden_size": 1e308},
    "Infinity": {"num_attention_heads": float("inf")},
    "NaN": {"intermediate_size": float("nan")},
    "negative vocab": {"vocab_size": -5},
    "a billion layers": {"num_hidden_layers": 10**9},
    "7 KV heads for 32": {"num_key_value_heads": 7},
    "quantization_config as a list": {"quantization_config": [1]},
    "architectures as a number": {"architectures": 5},
    "a block size of zero": {"quantization_config": {"quant_method": "fp8", "weight_block_size": [0, 0]}},
    "layer_types of numbers": {"layer_types": [1] * 32},
}


@pytest.mark.parametrize("fields", list(CONFIG_CASES.values()), ids=list(CONFIG_CASES))
@pytest.mark.parametrize("command", ["kv", "plan"])
def test_a_hostile_config_json_is_one_line_naming_the_file(tmp_path, fields, command):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**MISTRAL_CONFIG, **fields}))  # json writes inf and nan as Infinity and NaN
    args = ["kv", "-m", str(path), "-t", "128"] if command == "kv" else ["plan", "-m", str(path), "--gpu", "H100"]
    assert str(path) in refused(*args)


def test_a_config_json_without_num_hidden_layers_plans_with_a_warning(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({key: value for key, value in MISTRAL_CONFIG.items() if key != "num_hidden_layers"}))
    result = run("plan", "-m", str(path), "--gpu", "H100")
    assert result.exit_code == 0 and "no num_hidden_layers; mistral's default of 32 layers is used" in result.stderr


def test_bad_safetensors_headers_in_a_model_folder_are_one_line(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(MISTRAL_CONFIG))
    raw = json.dumps({"w": {"dtype": "BF16", "shape": [1], "data_offsets": ["a", "b"]}}).encode()
    (tmp_path / "model.safetensors").write_bytes(struct.pack("<Q", len(raw)) + raw)
    assert "tensor 'w' has no dtype, shape and data_offsets" in refused("plan", "-m", str(tmp_path), "--gpu", "H100")


# --- policy, profile and -f YAML ---------------------------------------------------------------------------------

POLICIES = {
    **HOSTILE_YAML,
    "levels as a list": "levels: [1, 2]\n",
    "levels as null": "levels:\n",
    "actions as a list": "actions: [1]\n",
    "an action as a list": "actions:\n  warn: [1]\n",
    "signals as a list": "signals: [1]\n",
    "a signal as a number": "signals:\n  stall: 5\n",
    "unknown as a list": "unknown: [1]\n",
    "gpu_memory as a list": "gpu_memory: [1]\n",
    "priorities as a list": "priorities: [1]\n",
    "keys that are numbers": "1: x\nfoo: 2\n",
    "a cap past any context": "actions:\n  warn:\n    max_tokens_cap: 1000000000000000000000000\n",
    "a retry of 10**20 s": "actions:\n  critical:\n    reject: true\n    retry_after_seconds: 100000000000000000000\n",
}


@pytest.mark.parametrize("text", list(POLICIES.values()), ids=list(POLICIES))
@pytest.mark.parametrize("command", ["alerts", "plan", "watch"])
def test_a_hostile_policy_is_one_line(tmp_path, text, command):
    path = tmp_path / "policy.yaml"
    path.write_text(text)
    args = {
        "alerts": ["alerts", "--engine", "vllm"],
        "plan": ["plan", "-m", "qwen3-8b", "--gpu", "L4"],
        "watch": WATCH_ONCE,
    }[command]
    result = run(*args, "--policy", str(path))
    assert str(path) in one_line_or_result(result, *args)
    if command == "watch":
        assert result.exit_code == 4  # --once: an error, apart from the levels' 1-3


PROFILES = {
    **HOSTILE_YAML,
    "utilization as a string": PROFILE + "gpu_memory_utilization: '0.9'\n",
    "utilization 1e308": PROFILE + "gpu_memory_utilization: 1e308\n",
    "a KV cache of 10**30 bytes": PROFILE + "kv_cache_bytes: 1000000000000000000000000000000\n",
    "tp 0": PROFILE + "tp: 0\n",
    "the model as a mapping": PROFILE + "model: {a: 1}\n",
    "the version as a list": PROFILE + "engine_version: [1]\n",
    "no source": "kvops_profile: 1\nengine: vllm\nkv_cache_bytes: [1]\n",
    "keys that are numbers": PROFILE + "1: 2\n",
}


@pytest.mark.parametrize("text", list(PROFILES.values()), ids=list(PROFILES))
def test_a_hostile_profile_is_one_line(tmp_path, text):
    path = tmp_path / "profile.yaml"
    path.write_text(text)
    assert str(path) in refused("plan", "-m", "qwen3-8b", "--gpu", "L4", "--profile", str(path))


KVOPS_YAML = {
    **HOSTILE_YAML,
    "kv_cache as a list": "kv_cache: [1]\n",
    "compression as a list": "kv_cache:\n  compression: [1]\n",
    "keys that are numbers in kv_cache": "kv_cache:\n  1: 2\n  foo: 3\n",
    "max-model-len as a list": "max-model-len: [1]\n",
    "a swap size that is no size": "kv_cache:\n  swap:\n    enabled: true\n    max_size: lots\n",
}


@pytest.mark.parametrize("text", list(KVOPS_YAML.values()), ids=list(KVOPS_YAML))
def test_a_hostile_kvops_yaml_is_one_line(tmp_path, text):
    path = tmp_path / "kvops.yaml"
    path.write_text("model: qwen3-8b\ngpu: L4\n" + text if not text.startswith(("[", "a0", "levels")) else text)
    refused("plan", "-f", str(path))


# --- logs, nvidia-smi, plans, workloads --------------------------------------------------------------------------

LOGS = {
    "64 KiB of digits": "1" * 65536,
    "a repeated memory snapshot": "memory snapshot: " * 4000,
    "a repeated non-default args": "non-default args: {" * 4000,
    "a repeated engine banner": "LLM engine (v" * 5000,
    "a version banner of digits": "vLLM: 1." + "1" * 65536 + ":",
    "args of the wrong types": "non-default args: {'max_model_len': 'x', 'tensor_parallel_size': -1, 'model': 5, "
    "'gpu_memory_utilization': 'a', 'block_size': 0, 'kv_cache_dtype': [5]}",
    "sizes with two points": "CUDA out of memory. Tried to allocate 1.2.3 GiB",
    "a device of 0 GiB": "Free memory on device (0.0/0.0 GiB) on startup is less than desired GPU memory "
    "utilization (0.9, 0.0 GiB)",
    "NUL bytes": "\x00" * 100,
    "a 5000-digit capacity": "Setting max batch total tokens to " + "9" * 5000,
}


@pytest.mark.parametrize("text", list(LOGS.values()), ids=list(LOGS))
@pytest.mark.parametrize("command", ["explain", "calibrate", "calibrate-tgi", "alerts-tgi"])
def test_a_hostile_log_ends_in_a_result_or_one_line(tmp_path, text, command):
    path = tmp_path / "run.log"
    path.write_text(text)
    args = {
        "explain": ["explain", "--vllm-log", str(path), "-m", "qwen3-8b", "--gpu", "L4"],
        "calibrate": ["calibrate", "--vllm-log", str(path), "-m", "qwen3-8b", "--gpu", "L4"],
        "calibrate-tgi": ["calibrate", "--engine", "tgi", "--tgi-log", str(path), "-m", "qwen3-8b", "--gpu", "L4"],
        "alerts-tgi": ["alerts", "--engine", "tgi", "--startup-log", str(path)],
    }[command]
    one_line_or_result(run(*args), *args)


@pytest.mark.parametrize(
    "text",
    ["| 0 " + " " * 65536 + "x\n", "GPU 0: x\n| 0 N/A |\n", "memory.total, memory.used\n" + "9" * 5000 + ", 1\n"],
    ids=["a row of blanks", "garbage", "a 5000-digit figure"],
)
def test_hostile_nvidia_smi_output_is_one_line(tmp_path, text):
    path = tmp_path / "smi.txt"
    path.write_text(text)
    log = FIXTURES / "logs" / "vllm-v1-2025-gpu-blocks.log"
    assert str(path) in refused("explain", "--vllm-log", str(log), "--nvidia-smi", str(path))


PLANS = {
    "nested 100000 deep": "[" * 100_000 + "]" * 100_000,
    "a 5000-digit capacity": '{"max_batch_total_tokens": ' + "9" * 5000 + "}",
    "a 5000-digit flag": '{"flags": "--max-batch-total-tokens ' + "9" * 5000 + '"}',
    "a list": "[1]",
    "NaN": '{"max_batch_total_tokens": NaN}',
}


@pytest.mark.parametrize("text", list(PLANS.values()), ids=list(PLANS))
@pytest.mark.parametrize("command", ["alerts", "watch"])
def test_a_hostile_plan_file_is_one_line(tmp_path, text, command):
    path = tmp_path / "plan.json"
    path.write_text(text)
    args = ["alerts", "--engine", "tgi"] if command == "alerts" else [*WATCH_ONCE[:2], "tgi", *WATCH_ONCE[3:]]
    result = run(*args, "--plan", str(path))
    assert str(path) in one_line_or_result(result, *args)


WORKLOADS = {
    "nested 100000 deep": "[" * 100_000 + "]" * 100_000,
    "a 5000-digit prompt": '{"prompt_tokens": ' + "9" * 5000 + ', "gen_tokens": 1}',
    "10**21 tokens": '{"prompt_tokens": 1000000000000000000000, "gen_tokens": 1}',
    "1e308 tokens": '{"prompt_tokens": 1e308, "gen_tokens": 1}',
}


@pytest.mark.parametrize("text", list(WORKLOADS.values()), ids=list(WORKLOADS))
def test_a_hostile_workload_is_one_line(tmp_path, text):
    path = tmp_path / "requests.jsonl"
    path.write_text(text + "\n")
    assert str(path) in refused("plan", "-m", "qwen3-8b", "--gpu", "L4", "--workload", str(path))


@pytest.mark.parametrize(
    "config",
    [
        "[1]",
        '{"method": "ngram", "num_speculative_tokens": "3"}',
        '{"method": "eagle3", "model": "qwen3-0.6b", "num_speculative_tokens": 3, "draft_tensor_parallel_size": "x"}',
        '{"model": 5, "num_speculative_tokens": 3}',
        '{"method": "ngram", "num_speculative_tokens": 100000000000000}',
    ],
)
def test_a_hostile_speculative_config_is_one_line(config):
    refused("plan", "-m", "qwen3-8b", "--gpu", "H100", "--speculative-config", config)


# --- files that are not files --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "args",
    [
        ["kv", "-m", "{}", "-t", "128"],
        ["plan", "-m", "qwen3-8b", "--gpu", "L4", "--policy", "{}"],
        ["plan", "-m", "qwen3-8b", "--gpu", "L4", "--profile", "{}"],
        ["plan", "-f", "{}"],
        ["plan", "-m", "qwen3-8b", "--gpu", "L4", "--workload", "{}"],
        ["explain", "--vllm-log", "{}"],
        ["calibrate", "--vllm-log", "{}", "-m", "qwen3-8b", "--gpu", "L4"],
        ["alerts", "--engine", "vllm", "--policy", "{}"],
        ["alerts", "--engine", "tgi", "--plan", "{}"],
        [*WATCH_ONCE, "--policy", "{}"],
        [*WATCH_ONCE, "--admin-token-file", "{}"],
    ],
    ids=lambda args: " ".join(word for word in args if word != "{}")[:40],
)
def test_a_fifo_is_refused_not_waited_on(tmp_path, args):
    fifo = tmp_path / "input"
    os.mkfifo(fifo)  # reading it would wait for a writer that never comes
    line = refused(*[str(fifo) if word == "{}" else word for word in args])
    assert "FIFO" in line


def test_dev_zero_is_refused_not_read_forever():
    """In a process of its own: were it read, it would never end."""
    for args in (["kv", "-m", "/dev/zero", "-t", "1"], ["alerts", "--engine", "vllm", "--policy", "/dev/zero"]):
        done = subprocess.run(
            [sys.executable, "-m", "kvops", *args],
            cwd=REPO,
            env=checkout_env(),
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 1 and done.stderr.strip().endswith(
            "/dev/zero: a device, which may never end; kvops reads regular files only"
        )
