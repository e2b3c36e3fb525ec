"""`kvops plan`: every input, every output format, the does-not-fit path and the inverse questions."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys

import pytest
import yaml

from kvops.engines.device_total import engine_total
from kvops.gpus import find_gpu
from kvops.units import format_bytes

MiB = 1 << 20


def plan_doc(run_kvops, *args: str, expect: int | None = 0) -> dict:
    return json.loads(run_kvops("plan", *args, "--format", "json", expect=expect).stdout)


def term(doc: dict, name: str) -> dict:
    return next(item for item in doc["memory"]["terms"] if item["name"] == name)


def test_vllm_json_carries_flags_command_every_term_and_capacity(run_kvops):
    doc = plan_doc(
        run_kvops, "-m", "llama-3-8b", "--gpu", "h100", "--max-model-len", "8192", "--engine-version", "0.32.0"
    )
    assert {"engine", "model", "gpu", "flags", "command", "memory", "capacity", "warnings"} <= set(doc)
    flags = doc["flags"]
    for name in (
        "gpu-memory-utilization",
        "max-num-seqs",
        "max-model-len",
        "max-num-batched-tokens",
        "kv-cache-dtype",
        "block-size",
        "tensor-parallel-size",
    ):
        assert name in flags, name
    assert (flags["gpu-memory-utilization"], flags["block-size"], flags["max-num-batched-tokens"]) == (0.92, 16, 8192)
    assert doc["command"]["argv"][:3] == ["vllm", "serve", "meta-llama/Meta-Llama-3-8B"]  # the model: positional
    assert "--model" not in doc["command"]["argv"] and doc["flags"]["model"] == "meta-llama/Meta-Llama-3-8B"
    assert doc["gpu"]["memory_bytes"] == 81559 * MiB
    # vLLM sizes from the total torch reports (kvops/catalog/device_totals.json), not nvidia-smi's
    assert term(doc, "total")["bytes"] == engine_total("H100-80GB").bytes < 81559 * MiB
    # requested - weights - activation - non-torch - CUDA graphs == the engine's KV, every figure an integer of bytes;
    # kvops' margin below it apart (issue 22, defect 8), the capacity sized on KV - margin, and the JSON says so
    requested = term(doc, "requested")["bytes"]
    assert requested == -(-engine_total("H100-80GB").bytes * 92 // 100)
    spent = ("weights", "activation", "non_torch", "cuda_graphs")
    others = sum(term(doc, name)["bytes"] for name in spent)
    memory = doc["memory"]
    assert memory["kv_cache_bytes"] == requested - others == term(doc, "kv_cache")["bytes"]
    assert memory["margin_bytes"] == term(doc, "margin")["bytes"] > 0
    assert memory["capacity_kv_bytes"] == memory["kv_cache_bytes"] - memory["margin_bytes"]
    assert memory["capacity_uses"] == "capacity_kv_bytes = kv_cache_bytes - margin_bytes"
    cap = doc["capacity"]
    assert cap["num_blocks"] == memory["capacity_kv_bytes"] // (2 * MiB)  # 32 layers x 16 tokens x 128 KiB / 16
    assert cap["kv_tokens"] == int(cap["num_blocks"] / 512 * 8192)
    assert {estimate["term"] for estimate in doc["estimates"]} == {"activation", "non_torch", "cuda_graphs", "margin"}
    assert all(estimate["measure"] and "kvops calibrate" in estimate["measure"] for estimate in doc["estimates"])


def test_max_num_seqs_is_vllms_default_and_the_notes_count_the_requests_under_the_warn_level(run_kvops):
    """A cap at the warn level left the pool's last 30% idle at peak: sized for 2,000 + 500-token requests of
    Llama-3-8B on an H100 it ran at 0.67 x stock vLLM's SLO goodput at stock's saturation rate and 0.47-0.58 x past
    it (kvops simulate with and without the cap, 1,000 requests, Dec 5; docs/measured.md). The plan runs vLLM's default and says how many
    requests of the stated size stay under the warn level."""
    doc = plan_doc(
        run_kvops,
        "-m",
        "llama-3-8b",
        "--gpu",
        "l4",
        "--max-model-len",
        "8192",
        "--prompt-tokens",
        "1000",
        "--gen-tokens",
        "500",
    )
    cap = doc["capacity"]
    assert cap["block_size"] == 64  # vLLM 0.34's default block (16 through 0.33)
    assert cap["blocks_per_request"] == -(-1500 // 64)
    under = cap["requests_under_warn"]
    assert under * cap["blocks_per_request"] <= 0.70 * cap["usable_blocks"] < (under + 1) * cap["blocks_per_request"]
    assert doc["flags"]["max-num-seqs"] == 256  # vLLM's default on an L4
    assert any(f"of the stated requests, {under} sequences stay under the warn level" in note for note in doc["notes"])


def test_n_and_beams_share_the_prompt_blocks_and_multiply_sequences(run_kvops):
    one = plan_doc(run_kvops, "-m", "llama-3-8b", "--gpu", "h100", "--prompt-tokens", "1600", "--gen-tokens", "400")
    four = plan_doc(
        run_kvops, "-m", "llama-3-8b", "--gpu", "h100", "--prompt-tokens", "1600", "--gen-tokens", "400", "--n", "4"
    )
    # vLLM 0.34's 64-token blocks: 2,000 tokens in 32; the 1,600-token prompt's 25 full blocks held once, each
    # sample its own 7 for its 400 tokens
    assert one["capacity"]["blocks_per_request"] == 32
    assert four["capacity"]["blocks_per_request"] == 25 + 4 * 7


def test_shell_line_is_the_argv_shell_quoted(run_kvops, tmp_path):
    folder = tmp_path / "my model"
    folder.mkdir()
    (folder / "config.json").write_text(
        json.dumps(
            {
                "model_type": "llama",
                "num_hidden_layers": 2,
                "num_attention_heads": 4,
                "hidden_size": 256,
                "vocab_size": 512,
                "max_position_embeddings": 2048,
                "torch_dtype": "bfloat16",
            }
        )
    )
    line = run_kvops("plan", "-m", str(folder), "--gpu", "l4", "--format", "shell").stdout.strip()
    argv = shlex.split(line)
    assert argv[:3] == ["vllm", "serve", str(folder)]
    assert f"'{folder}'" in line
    assert argv == plan_doc(run_kvops, "-m", str(folder), "--gpu", "l4")["command"]["argv"]


def test_yaml_env_docker_and_k8s_forms(run_kvops):
    args = ("-m", "qwen3-8b", "--gpu", "a100-80gb", "--tp", "2", "--gpus", "4")
    doc = plan_doc(run_kvops, *args)
    assert doc["flags"]["data-parallel-size"] == 2
    assert yaml.safe_load(run_kvops("plan", *args, "--format", "yaml").stdout) == doc
    env = run_kvops("plan", *args, "--format", "env").stdout
    assert "VLLM_ARGS=" in env and "--tensor-parallel-size 2" in env
    docker = run_kvops("plan", *args, "--format", "docker").stdout.strip()
    assert (
        docker.startswith("docker run --rm --gpus 4 --ipc=host -p 8000:8000")
        and " vllm/vllm-openai:v0.34.0 Qwen/Qwen3-8B --tensor-parallel-size 2 " in docker  # the image runs `vllm serve`
    )
    container = yaml.safe_load(run_kvops("plan", *args, "--format", "k8s").stdout)
    assert container["image"] == "vllm/vllm-openai:v0.34.0"  # the planned release's own tag (the newest by default)
    assert container["args"] == doc["command"]["argv"][2:]
    assert container["resources"]["limits"] == {"nvidia.com/gpu": 4}
    rocm = yaml.safe_load(run_kvops("plan", "-m", "qwen3-8b", "--gpu", "mi300x", "--format", "k8s").stdout)
    assert rocm["resources"]["limits"] == {"amd.com/gpu": 1} and rocm["image"] == "vllm/vllm-openai-rocm:v0.34.0"


def test_guard_names_the_kv_guard_scheduler_and_max_queued_the_admission_valve(run_kvops):
    plain = plan_doc(run_kvops, "-m", "llama-3-8b", "--gpu", "h100", "--no-guard")
    assert "scheduler-cls" not in plain["flags"]
    guarded = plan_doc(run_kvops, "-m", "llama-3-8b", "--gpu", "h100", "--guard", "--max-queued", "64")
    argv = guarded["command"]["argv"]
    assert argv[argv.index("--scheduler-cls") + 1] == "kvops_vllm.scheduler.KVGuardScheduler"
    assert argv[argv.index("--max-num-queued-reqs") + 1] == "64"


def test_chunked_prefill_off_plans_whole_prompts_in_a_step(run_kvops):
    """Without chunked prefill vLLM raises a default token budget to max_model_len (EngineArgs
    _set_default_max_num_seqs_and_batched_tokens_args), so its profile forward runs that many tokens: the activation
    term grows with it and the KV cache shrinks by as much; a stated budget below the context is refused in one line,
    as vLLM refuses to start (SchedulerConfig.verify_max_model_len)."""
    base = ("-m", "llama-3.1-8b", "--gpu", "h100", "--max-model-len", "32768")
    chunked, whole = plan_doc(run_kvops, *base), plan_doc(run_kvops, *base, "--no-enable-chunked-prefill")
    assert chunked["flags"]["max-num-batched-tokens"] == 8192 and "no-enable-chunked-prefill" not in chunked["flags"]
    assert whole["flags"]["max-num-batched-tokens"] == 32768 and whole["flags"]["no-enable-chunked-prefill"] is True
    assert "--no-enable-chunked-prefill" in whole["command"]["argv"]
    grown = term(whole, "activation")["bytes"] - term(chunked, "activation")["bytes"]
    assert grown > 0 and term(chunked, "kv_cache")["bytes"] - term(whole, "kv_cache")["bytes"] >= grown
    refused = run_kvops("plan", *base, "--no-enable-chunked-prefill", "--max-num-batched-tokens", "8192", expect=None)
    assert refused.exit_code != 0 and len(refused.stderr.strip().splitlines()) == 1
    assert (
        "--max-num-batched-tokens 8192 is smaller than --max-model-len 32768 with chunked prefill off" in refused.stderr
    )
    old = run_kvops("plan", *base, "--no-enable-chunked-prefill", "--engine-version", "0.15.0", expect=None)
    assert old.exit_code != 0 and "kvops has read that option in the wheels of vLLM 0.32.0 and later only" in old.stderr


def test_performance_mode_doubles_the_batching_defaults_or_captures_every_small_batch(run_kvops):
    """vLLM 0.32-0.34 --performance-mode: throughput doubles the default max_num_batched_tokens and max_num_seqs
    (EngineArgs._set_default_max_num_seqs_and_batched_tokens_args), so the profile's activation peak; interactivity
    captures a CUDA graph at every size up to 32 (VllmConfig._set_cudagraph_sizes): 76 sizes up to 512, not 51, and
    the graphs' estimate grows by as much. Emitted as given; a release whose wheel kvops has not read for the
    option is one line."""
    base = ("-m", "llama-3.1-8b", "--gpu", "h100", "--max-model-len", "32768")
    balanced = plan_doc(run_kvops, *base)
    throughput = plan_doc(run_kvops, *base, "--performance-mode", "throughput")
    interactive = plan_doc(run_kvops, *base, "--performance-mode", "interactivity")
    assert "performance-mode" not in balanced["flags"]
    assert (throughput["flags"]["max-num-seqs"], throughput["flags"]["max-num-batched-tokens"]) == (2048, 16384)
    assert term(throughput, "activation")["bytes"] > term(balanced, "activation")["bytes"]
    argv = throughput["command"]["argv"]
    assert argv[argv.index("--performance-mode") + 1] == "throughput"
    assert interactive["flags"]["performance-mode"] == "interactivity"
    graphs = term(interactive, "cuda_graphs")["bytes"] / term(balanced, "cuda_graphs")["bytes"]
    assert graphs == pytest.approx(76 / 51, rel=1e-3)
    stated = plan_doc(
        run_kvops, "--gpu", "h100", "--from-command", "vllm serve Qwen/Qwen3-8B --performance-mode throughput"
    )
    assert stated["flags"]["performance-mode"] == "throughput" and not stated["from_command"]
    old = run_kvops("plan", *base, "--performance-mode", "throughput", "--engine-version", "0.20.0", expect=None)
    assert old.exit_code != 0 and len(old.stderr.strip().splitlines()) == 1
    assert "--performance-mode: kvops has read that option in the wheels of vLLM 0.32.0 and later only" in old.stderr


def test_without_async_scheduling_one_batch_is_in_flight(run_kvops):
    """vLLM's async scheduling (on by default on a GPU) keeps two batches in flight, and a sliding-window layer holds
    its window plus the tokens in flight (VllmConfig.max_in_flight_tokens); --no-async-scheduling keeps one, so a
    request holds fewer blocks and more fit. Emitted as given; read from a pasted command too."""
    base = ("-m", "gemma-3-27b", "--gpu", "h100", "--max-model-len", "32768")
    on, off = plan_doc(run_kvops, *base), plan_doc(run_kvops, *base, "--no-async-scheduling")
    assert on["capacity"]["max_in_flight_tokens"] == 2 * off["capacity"]["max_in_flight_tokens"] == 16384
    assert off["capacity"]["num_blocks"] == on["capacity"]["num_blocks"]
    assert off["capacity"]["max_concurrency"] > on["capacity"]["max_concurrency"]
    assert off["flags"]["no-async-scheduling"] is True and "no-async-scheduling" not in on["flags"]
    stated = plan_doc(run_kvops, "--gpu", "h100", "--from-command", "vllm serve Qwen/Qwen3-8B --no-async-scheduling")
    assert stated["flags"]["no-async-scheduling"] is True and not stated["from_command"]


def test_disable_sliding_window_plans_full_attention_within_the_window(run_kvops):
    """vLLM's --disable-sliding-window (ModelConfig, vllm/config/model.py): the derived context is cut to the
    config's sliding window, then every layer attends to the whole context; Gemma-3-27B (window 1024) runs one
    full-attention KV cache group at 1,024 tokens, and a longer --max-model-len is refused in one line, as vLLM
    refuses it. A model without a window is planned as before."""
    gemma = ("-m", "gemma-3-27b", "--gpu", "h100")
    windowed = plan_doc(run_kvops, *gemma, "--max-model-len", "1024")
    full = plan_doc(run_kvops, *gemma, "--disable-sliding-window")
    assert {group["kind"] for group in windowed["capacity"]["kv_cache_group_specs"]} == {"sliding", "full"}
    assert [group["kind"] for group in full["capacity"]["kv_cache_group_specs"]] == ["full"]
    assert full["flags"]["max-model-len"] == 1024 and full["flags"]["disable-sliding-window"] is True
    refused = run_kvops("plan", *gemma, "--max-model-len", "8192", "--disable-sliding-window", expect=None)
    assert refused.exit_code != 0 and len(refused.stderr.strip().splitlines()) == 1
    assert "vLLM caps google/gemma-3-27b-it's context at its sliding window, 1024 tokens" in refused.stderr
    plain = ("-m", "llama-3.1-8b", "--gpu", "h100", "--max-model-len", "8192")
    assert (
        plan_doc(run_kvops, *plain)["capacity"] == plan_doc(run_kvops, *plain, "--disable-sliding-window")["capacity"]
    )


def test_kv_cache_dtype_skip_layers_keep_the_models_dtype(run_kvops):
    """vLLM's attention layer keeps kv_cache_dtype "auto" (the model's dtype) for the layer indices
    --kv-cache-dtype-skip-layers names, and for every sliding-window layer with `sliding_window`
    (model_executor/layers/attention/attention.py): Llama-3.1-8B in fp8 with layers 0 and 31 skipped holds 30
    layers at 1 B a value and 2 at 2 B per block; the list is emitted as vLLM reads it (one value per argument)."""
    base = ("-m", "llama-3.1-8b", "--gpu", "h100", "--max-model-len", "8192", "--kv-dtype", "fp8")
    fp8, skipped = plan_doc(run_kvops, *base), plan_doc(run_kvops, *base, "--kv-cache-dtype-skip-layers", "0,31")
    per_layer = fp8["capacity"]["bytes_per_block"] // 32
    assert skipped["capacity"]["bytes_per_block"] == 30 * per_layer + 2 * 2 * per_layer
    argv = skipped["command"]["argv"]
    start = argv.index("--kv-cache-dtype-skip-layers")
    assert argv[start + 1 : start + 3] == ["0", "31"] and argv[start + 3].startswith("--")
    stated = plan_doc(
        run_kvops,
        "--gpu",
        "h100",
        "--from-command",
        "vllm serve meta-llama/Llama-3.1-8B --kv-cache-dtype fp8 "
        "--kv-cache-dtype-skip-layers 0 31 --max-model-len 8192",
    )
    assert (
        stated["capacity"]["bytes_per_block"] == skipped["capacity"]["bytes_per_block"] and not stated["from_command"]
    )
    gemma = ("-m", "gemma-3-27b", "--gpu", "h100", "--max-model-len", "8192", "--kv-dtype", "fp8")
    sliding_kept = plan_doc(run_kvops, *gemma, "--kv-cache-dtype-skip-layers", "sliding_window")
    assert sliding_kept["capacity"]["bytes_per_block"] == 2 * plan_doc(run_kvops, *gemma)["capacity"]["bytes_per_block"]
    bad = run_kvops("plan", *base, "--kv-cache-dtype-skip-layers", "0,full", expect=None)
    assert bad.exit_code != 0 and "valid: layer indices (0, 1, ...) and sliding_window" in bad.stderr


def test_enable_lora_takes_its_slots_from_the_kv_cache_and_captures_each_graph_twice(run_kvops):
    """vLLM allocates the LoRA slots inside the load 'Model loading took' measures, before it sizes the KV cache,
    and captures each CUDA-graph size with and without adapters (`CudagraphDispatcher._get_lora_cases`): on vLLM
    0.33 (KV = requested - weights - overheads) the KV cache is smaller by exactly the slots and the graphs' second
    copy. The flags are emitted as given, and read back from a pasted command."""
    base = ("-m", "llama-3.1-8b", "--gpu", "h100", "--max-model-len", "8192", "--engine-version", "0.33.0")
    lora = ("--enable-lora", "--max-loras", "4", "--max-lora-rank", "64", "--lora-dtype", "bfloat16")
    plain, served = plan_doc(run_kvops, *base), plan_doc(run_kvops, *base, *lora)
    slots = 4 * 4 * 2 * (32 * 1_310_720 + 2 * 16 * (128_256 + 4_096))  # tests/unit/engines/vllm/test_lora.py
    assert term(served, "weights")["bytes"] - term(plain, "weights")["bytes"] == slots
    assert term(served, "cuda_graphs")["bytes"] == 2 * term(plain, "cuda_graphs")["bytes"]
    assert "each twice, with and without LoRA" in term(served, "cuda_graphs")["formula"]
    lost = term(plain, "kv_cache")["bytes"] - term(served, "kv_cache")["bytes"]
    assert lost == slots + term(plain, "cuda_graphs")["bytes"]
    argv = served["command"]["argv"]
    given = ["--max-loras", "4", "--max-lora-rank", "64", "--lora-dtype", "bfloat16"]
    assert argv[argv.index("--enable-lora") + 1 :][:6] == given
    stated = plan_doc(
        run_kvops,
        "--gpu",
        "h100",
        "--engine-version",
        "0.33.0",
        "--from-command",
        "vllm serve meta-llama/Llama-3.1-8B --max-model-len 8192 --enable-lora --max-loras 4 --max-lora-rank 64 "
        "--lora-dtype bfloat16 --max-cpu-loras 16",
    )
    assert term(stated, "kv_cache")["bytes"] == term(served, "kv_cache")["bytes"]
    host = "--max-cpu-loras 16: ignored: LoRA adapters cached in host memory"
    assert any(host in line for line in stated["from_command"])
    bad = run_kvops("plan", *base, "--enable-lora", "--max-lora-rank", "12", expect=None)
    assert bad.exit_code != 0 and "--max-lora-rank 12; valid: 1, 8, 16, 32, 64, 128, 256, 320, 512" in bad.stderr
    mla = plan_doc(run_kvops, "-m", "deepseek-v2-lite", "--gpu", "h100", "--max-model-len", "8192", "--enable-lora")
    assert any("the LoRA slots of DeepseekV2ForCausalLM are not counted" in line for line in mla["warnings"])


def test_decode_context_parallel_splits_the_latent_cache_by_tokens(run_kvops):
    """Every tp rank holds an MLA model's whole latent; --decode-context-parallel-size N spreads a block's tokens
    over N of them (`resolve_dcp_kv_block_size`): the same blocks of the same bytes, N times the tokens. vLLM
    requires N to divide tp; kvops lays it out for dense MLA models only, and simulate does not run it."""
    base = ("-m", "deepseek-v3", "--gpu", "h200", "--gpus", "8", "--max-model-len", "131072")
    plain, split = plan_doc(run_kvops, *base), plan_doc(run_kvops, *base, "--decode-context-parallel-size", "8")
    assert split["capacity"]["num_blocks"] == plain["capacity"]["num_blocks"]
    assert split["capacity"]["bytes_per_block"] == plain["capacity"]["bytes_per_block"]
    assert split["capacity"]["kv_cache_size_tokens"] == 8 * plain["capacity"]["kv_cache_size_tokens"]
    argv = split["command"]["argv"]
    assert argv[argv.index("--decode-context-parallel-size") + 1] == "8"
    assert argv[argv.index("--block-size") + 1] == "64"  # the block size flag is each rank's, as vLLM takes it
    stated = plan_doc(
        run_kvops,
        "--gpu",
        "h200",
        "--from-command",
        "vllm serve deepseek-ai/DeepSeek-V3 -tp 8 -dcp 8 --max-model-len 128K",
    )
    assert stated["capacity"]["kv_cache_size_tokens"] == split["capacity"]["kv_cache_size_tokens"]
    odd = run_kvops("plan", *base, "-dcp", "3", expect=None)
    assert odd.exit_code != 0 and "--decode-context-parallel-size 3 must divide --tensor-parallel-size 8" in odd.stderr
    gqa = run_kvops("plan", "-m", "llama-3.1-8b", "--gpu", "h100", "--tp", "2", "-dcp", "2", expect=None)
    assert gqa.exit_code != 0 and "every layer caches a dense MLA latent" in gqa.stderr
    simulated = run_kvops("simulate", *base, "-dcp", "8", "--rate", "1", "--requests", "10", expect=None)
    assert simulated.exit_code != 0 and "kvops simulate does not run it" in simulated.stderr


def test_a_pasted_command_keeps_every_option_kvops_does_not_read(run_kvops):
    """The plan's command is the pasted one with kvops' sizing: options that do not change memory, are not modelled
    or are unknown are appended as given (a rope-scaling override that a 128K context needs, a chat template, the
    scheduling policy), and --port moves the plan's port, which its docker mapping and probes follow."""
    pasted = (
        "vllm serve Qwen/Qwen3-8B --port 9000 --max-model-len 131072 --served-model-name q --scheduling-policy "
        'priority --hf-overrides \'{"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}\' --trust-remote-code'
    )
    doc = plan_doc(run_kvops, "--gpu", "h100", "--from-command", pasted)
    argv = doc["command"]["argv"]
    kept = argv[argv.index("--kv-cache-dtype") + 2 :]
    assert kept == [
        "--port",
        "9000",
        "--served-model-name",
        "q",
        "--scheduling-policy",
        "priority",
        "--hf-overrides",
        '{"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}',
        "--trust-remote-code",
    ]
    assert doc["command"]["port"] == 9000 and argv.count("--max-model-len") == 1
    docker = run_kvops("plan", "--gpu", "h100", "--from-command", pasted, "--format", "docker").stdout
    assert "-p 8000:9000" in docker
    tgi = plan_doc(
        run_kvops,
        "--gpu",
        "h100",
        "--from-command",
        "text-generation-launcher --model-id Qwen/Qwen3-8B --port 3000",
    )
    assert tgi["command"]["port"] == 3000 and tgi["command"]["argv"][-2:] == ["--port", "3000"]
    # an option typed beside the command wins over the one it kept, through the host KV tier's re-plan too
    tier = "vllm serve meta-llama/Llama-3.1-8B --kv-offloading-size 64 --max-model-len 8192 --api-key k"
    typed = plan_doc(run_kvops, "--gpu", "h100", "--kv-offloading-size", "32", "--from-command", tier)["command"]
    assert typed["argv"].count("--kv-offloading-size") == 1 and typed["argv"][-2:] == ["--api-key", "k"]
    assert typed["argv"][typed["argv"].index("--kv-offloading-size") + 1] == "32"


def test_fp8_asked_of_an_unquantized_checkpoint_is_emitted_as_vllm_quantizes_at_load(run_kvops):
    """vLLM quantizes a 16-bit checkpoint to FP8 as it loads it with --quantization fp8 (the plan sized those
    weights, so the command says it); a pre-quantized checkpoint's own quantization_config needs no flag; any other
    format asked of a 16-bit checkpoint is a quantized copy the plan says to serve; a pasted value is kept as given."""
    base = ("-m", "llama-3.1-8b", "--gpu", "h100", "--max-model-len", "8192")
    online = plan_doc(run_kvops, *base, "--quantization", "fp8")["command"]["argv"]
    assert online[online.index("--quantization") + 1] == "fp8"
    copy = plan_doc(run_kvops, *base, "--quantization", "awq")
    assert "--quantization" not in copy["command"]["argv"]
    assert any("vLLM reads awq weights only from a checkpoint quantized so" in line for line in copy["warnings"])
    assert "--quantization" not in plan_doc(run_kvops, "-m", "qwen3-30b-a3b-fp8", "--gpu", "h100")["command"]["argv"]
    pasted = plan_doc(
        run_kvops, "--gpu", "h100", "--from-command", "vllm serve Qwen/Qwen3-8B --quantization fp8_per_block"
    )["command"]["argv"]
    assert pasted[pasted.index("--quantization") + 1] == "fp8_per_block"
    typed = plan_doc(
        run_kvops,
        "--gpu",
        "h100",
        "--quantization",
        "fp8",
        "--from-command",
        "vllm serve Qwen/Qwen3-8B --quantization awq",
    )["command"]["argv"]
    assert typed[typed.index("--quantization") + 1] == "fp8"  # typed beside the command, it wins
    assert "--quantization" not in plan_doc(run_kvops, *base, "--quantization", "fp16")["command"]["argv"]


@pytest.mark.parametrize("gpu", ["h100", "b200"])
@pytest.mark.parametrize("extra", [(), ("--enable-lora",)])
def test_a_compilation_config_that_is_not_a_json_object_is_one_line(run_kvops, gpu, extra):
    """Read where the B200's 0.34 grids and LoRA's graph cases are decided too: still one line, no traceback."""
    for text in ("{bad", "[1]"):
        ran = run_kvops("plan", "-m", "llama-3.1-8b", "--gpu", gpu, *extra, "--compilation-config", text, expect=None)
        assert (
            ran.exit_code != 0
            and ran.stderr.strip() == f"kvops: error: --compilation-config {text!r} is not a JSON object"
        )


def test_does_not_fit_exits_3_with_need_have_and_computed_ways_out(run_kvops):
    ran = run_kvops(
        "plan", "-m", "llama-3-8b", "--gpu", "l4", "--max-model-len", "8192", "--concurrency", "4", expect=3
    )
    assert ran.stdout == ""
    first, *rest = ran.stderr.strip().splitlines()
    # 4 x 8192 tokens in vLLM 0.34's 64-token blocks
    assert first.startswith("kvops: error: does not fit: 4 concurrent requests of 8192 tokens need 512 blocks")
    assert "of KV cache; the plan has" in first
    ways = "\n".join(rest)
    assert "+ --kv-dtype fp8: fits" in ways and "quantized KV costs quality" in ways
    # the longest context that fits is shorter than the 8192-token requests: not a way out that fits (issue 13)
    # the smallest larger catalog GPU that fits, of the L4's vendor and class: the A100-40GB, not a GeForce card
    assert "--max-model-len auto" not in ways and "+ --tp 2: fits" in ways and "+ --gpu A100-40GB: fits" in ways
    assert "RTX-5090" not in ways
    assert "--kv-offloading-size" in ways and "does not raise how many sequences run at once" in ways
    doc = plan_doc(
        run_kvops, "-m", "llama-3-8b", "--gpu", "l4", "--max-model-len", "8192", "--concurrency", "4", expect=3
    )
    assert doc["fits"] is False and doc["need_bytes"] > doc["have_bytes"] > 0
    fp8 = next(way for way in doc["ways_out"] if way["change"] == "--kv-dtype fp8")
    assert fp8["fits"] and fp8["flags"]["kv-cache-dtype"] == "fp8"
    shorter = next(way for way in doc["ways_out"] if way["change"] == "--max-model-len auto")
    assert shorter["fits"] is False and "shorter than the planned requests of 8192 tokens" in shorter["result"]


def test_weights_too_big_says_so_and_finds_the_tp_that_fits(run_kvops):
    ran = run_kvops(
        "plan", "-m", "llama-3.1-70b", "--gpu", "a100-80gb", "--max-model-len", "32768", "--concurrency", "8", expect=3
    )
    assert "weights and overheads need" in ran.stderr and "+ --tp 4: fits" in ran.stderr


def test_max_model_len_auto_is_the_longest_context_at_the_target_concurrency(run_kvops):
    doc = plan_doc(run_kvops, "-m", "llama-3-8b", "--gpu", "l4", "--max-model-len", "auto", "--concurrency", "4")
    cap = doc["capacity"]
    length, block = doc["flags"]["max-model-len"], cap["block_size"]
    assert block == 64  # vLLM 0.34's default block
    assert 4 * -(-length // block) <= 0.70 * cap["usable_blocks"] < 4 * -(-(length + block) // block)
    assert cap["requests_under_warn"] >= 4


def test_concurrency_auto_is_the_most_sequences_at_the_context(run_kvops):
    doc = plan_doc(run_kvops, "-m", "llama-3-8b", "--gpu", "h100", "--max-model-len", "32768", "--concurrency", "auto")
    cap = doc["capacity"]
    assert cap["requests_under_warn"] == int(0.70 * cap["usable_blocks"] // (32768 // 64))  # 0.34's 64-token blocks
    assert doc["flags"]["max-num-seqs"] == cap["requests_under_warn"]


def test_workload_file_is_sized_at_its_p95(run_kvops, tmp_path):
    lines = [json.dumps({"prompt_tokens": 100 * i, "output_tokens": 10 * i}) for i in range(1, 21)]
    path = tmp_path / "requests.jsonl"
    path.write_text("\n".join(lines) + "\n")
    doc = plan_doc(run_kvops, "-m", "llama-3-8b", "--gpu", "h100", "--workload", str(path))
    load = doc["workload"]
    assert (load["prompt_tokens"], load["gen_tokens"], load["p50_tokens"], load["p95_tokens"], load["requests"]) == (
        1900,
        190,
        1100,
        2090,
        20,
    )
    assert doc["capacity"]["tokens_per_request"] == 2090
    words = run_kvops("plan", "-m", "llama-3-8b", "--gpu", "h100", "--workload", str(path)).stdout.split()
    assert f"workload from {path} (20 requests, p95): 1,900 prompt + 190 generated tokens per request" in " ".join(
        words
    )


def test_tgi_plan_uses_tgi_flags_rules_and_reservations(run_kvops):
    doc = plan_doc(
        run_kvops,
        "--engine",
        "tgi",
        "-m",
        "llama-3-8b",
        "--gpu",
        "h100",
        "--max-model-len",
        "8192",
        "--prompt-tokens",
        "2000",
        "--gen-tokens",
        "3000",
    )
    flags = doc["flags"]
    assert list(flags) == [
        "model-id",
        "num-shard",
        "max-input-tokens",
        "max-total-tokens",
        "max-concurrent-requests",
        "cuda-memory-fraction",
    ]
    assert flags["max-input-tokens"] < flags["max-total-tokens"] <= doc["capacity"]["max_batch_total_tokens"]
    assert doc["capacity"]["reservation_tokens_per_request"] == 2000 + 1024 - 1  # max_new_tokens counted up to 1024
    assert doc["command"]["argv"][0] == "text-generation-launcher"
    assert term(doc, "budget")["bytes"] == int(engine_total("H100-80GB").bytes * 0.9)
    env = run_kvops("plan", "--engine", "tgi", "-m", "llama-3-8b", "--gpu", "h100", "--format", "env").stdout
    assert "MAX_TOTAL_TOKENS=" in env and "NUM_SHARD=1" in env
    docker = run_kvops("plan", "--engine", "tgi", "-m", "llama-3-8b", "--gpu", "h100", "--format", "docker").stdout
    assert "ghcr.io/huggingface/text-generation-inference:3.3.7 --model-id meta-llama/Meta-Llama-3-8B" in docker


def test_tgi_sliding_window_models_reserve_the_full_context(run_kvops):
    doc = plan_doc(run_kvops, "--engine", "tgi", "-m", "mistral-7b-v0.1", "--gpu", "h100", "--max-model-len", "16384")
    assert doc["capacity"]["kv_bytes_per_token"] == 2 * 32 * 8 * 128 * 2
    assert any("still reserves and caches the full context" in note for note in doc["notes"])


def test_tgi_refusal_uses_tgis_own_message(run_kvops):
    ran = run_kvops("plan", "--engine", "tgi", "-m", "llama-3-8b", "--gpu", "l4", "--max-model-len", "65536", expect=3)
    assert "Backend failed: Not enough memory to handle `max_total_tokens=65536`" in ran.stderr


@pytest.mark.parametrize(
    "args, words",
    [
        (
            ("--engine", "tgi", "-m", "llama-3-8b", "--gpu", "h100", "--kv-dtype", "int8"),
            "[possible values: fp8_e4m3fn, fp8_e5m2]",
        ),
        (
            ("--engine", "tgi", "-m", "llama-3-8b", "--gpu", "h100", "--kv-cache-memory-bytes", "1GiB"),
            "--kv-cache-memory-bytes is a vLLM option",
        ),
        (
            ("--engine", "tgi", "-m", "llama-3.1-70b", "--gpu", "h100", "--tp", "16"),
            "`num_key_value_heads` must be divisible by `num_shards`",
        ),
        (("-m", "llama-3-8b", "--gpu", "h300"), "--gpu 'h300' is not in the GPU catalog"),
        (("-m", "llama-3-8b", "--gpu", "h100", "--gpus", "3", "--tp", "2"), "--gpus 3 is not a multiple of --tp 2"),
        (("-m", "llama-3-8b", "--gpu", "h100", "--kv-dtype", "fp6"), "--kv-dtype 'fp6' is not a KV dtype"),
        (
            ("-m", "llama-3-8b", "--gpu", "h100", "--max-model-len", "lots"),
            "'lots' is not a positive integer or 'auto'",
        ),
        (("-m", "llama-3-8b"), "missing --gpu NAME"),
    ],
)
def test_bad_input_is_one_line(run_kvops, args, words):
    ran = run_kvops("plan", *args, expect=None)
    assert ran.exit_code in (1, 2)
    assert len(ran.stderr.strip().splitlines()) == 1 and words in ran.stderr


def test_profile_replaces_estimates_with_measurements(run_kvops, tmp_path):
    profile = tmp_path / "h100.yaml"
    profile.write_text(
        yaml.safe_dump(
            {
                "kvops_profile": 1,
                "engine": "vllm",
                "source": "run.log",
                "model": "meta-llama/Meta-Llama-3-8B",
                "tp": 1,
                "weights_bytes": 16_060_522_496,
                "overhead_bytes": 3 * 2**30,
            }
        )
    )
    args = ("-m", "llama-3-8b", "--gpu", "h100", "--max-model-len", "8192", "--profile", str(profile))
    newest = plan_doc(run_kvops, *args)  # 0.34's extensible KV cache: only the memory in use before its snapshot
    assert [estimate["term"] for estimate in newest["estimates"]] == ["startup_used"]
    doc = plan_doc(run_kvops, *args, "--engine-version", "0.32.0")
    assert term(doc, "weights") == {**term(doc, "weights"), "bytes": 16_060_522_496, "basis": "measured"}
    assert term(doc, "overhead")["basis"] == "measured" and doc["estimates"] == []
    assert doc["memory"]["kv_cache_bytes"] == term(doc, "requested")["bytes"] - 16_060_522_496 - 3 * 2**30
    bad = tmp_path / "bad.yaml"
    bad.write_text("engine: vllm\n")
    assert (
        "not a kvops profile"
        in run_kvops("plan", "-m", "llama-3-8b", "--gpu", "h100", "--profile", str(bad), expect=1).stderr
    )


def test_a_profile_of_another_engine_is_refused_by_the_engine_planned(run_kvops, tmp_path):
    """The profile file names no engine list of its own: a foreign engine is refused by the adapter that plans."""
    plan = ("plan", "-m", "llama-3-8b", "--gpu", "h100", "--max-model-len", "8192", "--profile")
    for engine, said in (("tgi", "--profile is a tgi profile"), ("sglang", "--profile is a sglang profile")):
        profile = tmp_path / f"{engine}.yaml"
        profile.write_text(yaml.safe_dump({"kvops_profile": 1, "engine": engine, "source": "run.log"}))
        error = run_kvops(*plan, str(profile), expect=2).stderr
        assert said in error and "Traceback" not in error
    nameless = tmp_path / "nameless.yaml"
    nameless.write_text(yaml.safe_dump({"kvops_profile": 1, "engine": 7, "source": "run.log"}))
    error = run_kvops(*plan, str(nameless), expect=1).stderr
    assert "engine 7 is not an engine name" in error and "Traceback" not in error


def test_h200_plan_uses_the_total_the_engine_sees(run_kvops):
    doc = plan_doc(run_kvops, "-m", "llama-3.1-70b", "--gpu", "H200", "--tp", "2")
    assert find_gpu("h200").memory_bytes == 143771 * MiB  # nvidia-smi's, in the catalog
    total = term(doc, "total")
    assert total["bytes"] == engine_total("H200").bytes == 150109880320  # measured on an H200
    assert "139.80 GiB as torch reports it" in total["formula"] and "143771 MiB" in total["formula"]


def test_plan_does_not_import_pandas_or_matplotlib():
    code = "import sys; from kvops.cli import main; sys.argv=['kvops','plan','-m','llama-3-8b','--gpu','h100','-f','shell']\ntry:\n main()\nexcept SystemExit: pass\nprint(sorted(m for m in ('pandas','matplotlib','numpy','vllm') if m in sys.modules))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip().splitlines()[-1] == "[]"


def test_launcher_replaces_only_the_program(run_kvops):
    args = ["-m", "llama-3-8b", "--gpu", "h100", "--max-model-len", "8192"]
    default = plan_doc(run_kvops, *args)["command"]
    module = plan_doc(run_kvops, *args, "--launcher", "python -m vllm.entrypoints.openai.api_server")["command"]
    assert default["program"] == ["vllm", "serve"] and module["program"] == [
        "python",
        "-m",
        "vllm.entrypoints.openai.api_server",
    ]
    # `vllm serve` takes the model as its positional argument; the API server module takes --model
    assert module["argv"][3:] == ["--model", *default["argv"][2:]]
    assert "'unclosed" in run_kvops("plan", *args, "--launcher", "'unclosed", expect=2).stderr


def test_the_default_plan_names_no_scheduler_and_the_text_says_where_the_guard_goes(run_kvops):
    """The KV guard is opt-in while it costs goodput against stock vLLM (bench/guard_goodput.py, docs/kv-guard.md)."""
    args = ("-m", "qwen3-8b", "--gpu", "L40S", "--max-model-len", "8192", "--engine-version", "0.32.0")
    doc = plan_doc(run_kvops, *args)
    assert "scheduler-cls" not in doc["flags"]
    [note] = [note for note in doc["notes"] if note.startswith("KV guard: ")]
    assert note.startswith("KV guard: not named by default; this pool holds 21 requests of the planned size at once, ")
    assert "like the CPU benchmark's pool of about 8" in note and "--compare stock,guard; --guard names it" in note
    large = plan_doc(run_kvops, "-m", "mistral-7b-v0.1", "--gpu", "H100-80GB", "--engine-version", "0.32.0")
    assert any("holds 109 requests of the planned size at once, like the CPU benchmark's larger pool" in note
               for note in large["notes"])  # fmt: skip
    guarded = run_kvops("plan", *args, "--guard", "--explain").stdout  # a note: the default text counts them
    assert "--scheduler-cls kvops_vllm.scheduler.KVGuardScheduler loads a plugin from vLLM's own Python" in guarded
    k8s = run_kvops("plan", *args, "--guard", "--format", "k8s")
    assert "kvops_vllm" not in k8s.stdout and "--format k8s leaves out --scheduler-cls" in k8s.stderr


PLAN_8B = ("-m", "llama-3.1-8b-instruct", "--gpu", "h100", "--max-model-len", "8192")


def test_the_default_text_is_one_screen_with_one_figure_per_concept_each_in_the_json(run_kvops):
    """Issue 23: the header, the launch, fits, KV bytes, KV tokens, the requests held and the workload; no terms."""
    text = run_kvops("plan", *PLAN_8B).stdout
    doc = plan_doc(run_kvops, *PLAN_8B)
    lines = text.rstrip("\n").splitlines()
    assert len(lines) <= 20 and max(len(line) for line in lines) <= 120
    cap, total = doc["capacity"], term(doc, "total")["bytes"]
    assert lines[0].startswith(f"vLLM plan: {doc['model']} on 1 x H100-80GB ({format_bytes(total)} each")
    assert text.count("GiB each") == 1 and "nvidia-smi" not in text  # one GPU total: the one the plan sizes from
    rows = {line.split("  ")[0]: line for line in lines if line and not line.startswith(" ")}
    assert rows["fits"].split() == ["fits", "yes"]
    assert rows["KV cache"].endswith(f"{format_bytes(doc['memory']['capacity_kv_bytes'])} per GPU")
    assert rows["KV tokens"].endswith(f"{cap['kv_tokens']:,}")
    assert (
        f"{cap['requests_under_warn']} at once under the warn level (70%), {cap['requests_at_full']} at 100%, "
        f"each holding {cap['tokens_per_request']:,} KV tokens" in rows["requests"]
    )
    assert rows["workload"] == (
        "workload   assumed 8,192 tokens per request (the whole context); give --prompt-tokens/--gen-tokens"
    )
    assert "memory per GPU" not in text and "max concurrency" not in text and "token slots" not in text
    assert "--explain: every memory term and its source" in text


def test_the_launch_line_folds_at_120_columns_and_pastes_back_as_the_argv(run_kvops):
    text = run_kvops("plan", *PLAN_8B, "--guard").stdout
    launch = text.split("\n\n")[1]
    assert len(launch.splitlines()) > 1 and all(line.endswith(" \\") for line in launch.splitlines()[:-1])
    assert shlex.split(launch.replace("\\\n", "")) == plan_doc(run_kvops, *PLAN_8B, "--guard")["command"]["argv"]


def test_a_stated_workload_is_said_in_one_line_and_warnings_wrap_at_120_columns(run_kvops):
    args = ("-m", "qwen3-8b", "--gpu", "L4", "--max-model-len", "4096", "--concurrency", "4")
    text = run_kvops("plan", *args, "--prompt-tokens", "1000", "--gen-tokens", "500", "--n", "2").stdout
    assert (
        "\nworkload   stated: 1,000 prompt + 500 generated tokens per request, 2 sequences each (--n x --beams)\n"
        in text
    )
    warnings = text.split("\nwarnings\n")[1].split("\n\n")[0].splitlines()
    assert all(len(line) <= 120 for line in warnings) and warnings[-1].startswith("    ")  # a wrapped item indents
    assert "estimated, not measured: activation, non_torch" in text


def test_explain_adds_every_term_with_its_source_the_capacity_and_the_notes(run_kvops):
    short = run_kvops("plan", *PLAN_8B).stdout
    text = run_kvops("plan", *PLAN_8B, "--explain").stdout
    doc = plan_doc(run_kvops, *PLAN_8B, "--explain")
    assert text.startswith(short.split("\n--explain: ")[0])  # the same summary, then the detail
    assert "\nmemory per GPU\n" in text and "\ncapacity\n" in text and "\nnotes\n" in text
    for item in doc["memory"]["terms"]:
        assert f"  {item['name']} " in text and item["formula"] in text
    assert all(note in text for note in doc["notes"])
