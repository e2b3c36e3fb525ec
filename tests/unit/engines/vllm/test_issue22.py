"""Issue 22: vLLM 0.33 and 0.34 (the extensible KV cache), the planned release's own option set, and the defects
found on held-out launches, each as the command that showed it."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from kvops.deployment import DeploymentOptions
from kvops.dtypes import KV_DTYPES
from kvops.engines.vllm import budget, options, releases
from kvops.errors import UsageError
from kvops.plan import Speculative
from kvops.planner import predict
from kvops.units import GiB

FIXTURES = Path(__file__).resolve().parents[3] / "fixtures"
E4B = str(FIXTURES / "models" / "gemma-4-E4B-it")


def doc(run_kvops, *args: str, expect: int = 0) -> dict:
    return json.loads(run_kvops("plan", *args, "--format", "json", expect=expect).stdout)


def term(plan: dict, name: str) -> dict:
    return next(item for item in plan["memory"]["terms"] if item["name"] == name)


def plan_of(**values):
    return predict(DeploymentOptions(**values).plan_inputs())


# --- the 0.34 path: the extensible KV cache --------------------------------------------------------------------


def measure_kv_cache_bytes(
    *, init_free_memory, free_memory, committed_bytes, requested_memory, transient_peak_bytes, margin_floor_bytes
):
    """vLLM 0.34.0's rule as v1/worker/extensible_kv_cache.py l.592-618 states it (margin fraction 0.75)."""
    non_kv_used = init_free_memory - free_memory - committed_bytes
    headroom = free_memory + committed_bytes
    margin = max(margin_floor_bytes, int(transient_peak_bytes * 0.75))
    available = min(requested_memory - non_kv_used, headroom - margin)
    return max(available - transient_peak_bytes, 0)


@pytest.mark.parametrize(("gpu", "floor"), [("H100-80GB", 1 * GiB), ("MI300X", 3 * GiB)])
def test_the_034_path_is_vllms_measure_kv_cache_bytes_on_the_plans_own_terms(run_kvops, gpu, floor):
    """The plan's resident and transient terms, put through vLLM's own rule as if measured after warmup, give the
    plan's KV; the margin's floor is 1 GiB on CUDA and 3 GiB on ROCm (KV_CACHE_MARGIN_FLOOR_BYTES)."""
    plan = doc(run_kvops, "-m", "llama-3-8b", "--gpu", gpu, "--max-model-len", "8192")
    bytes_of = {item["name"]: item["bytes"] for item in plan["memory"]["terms"]}
    total, startup = bytes_of["total"], bytes_of["startup_used"]
    resident = bytes_of["weights"] + bytes_of["non_torch"] + bytes_of["cuda_graphs"]  # no MoE workspace here
    transient = bytes_of["activation"]  # no CUDA-graph estimate kept free: the captured graphs are resident
    assert "cuda_graph_estimate" not in bytes_of
    committed = 2 * GiB  # whatever warmup committed: the rule takes it back into the headroom
    measured = measure_kv_cache_bytes(
        init_free_memory=total - startup,
        free_memory=total - startup - resident - committed,
        committed_bytes=committed,
        requested_memory=bytes_of["requested"],
        transient_peak_bytes=transient,
        margin_floor_bytes=floor,
    )
    assert plan["memory"]["kv_cache_bytes"] == measured == bytes_of["kv_cache"]
    assert bytes_of["vllm_margin"] == max(floor, int(transient * 0.75))
    assert bytes_of["requested"] == total  # --gpu-memory-utilization unset resolves to 1.0
    assert "gpu-memory-utilization" not in plan["flags"]  # an emitted 0.92 would cap the engine
    assert plan["engine_version"]["family"] == releases.EXTENSIBLE
    assert any(note.startswith("KV sizing: extensible:") for note in plan["notes"])


def test_a_given_utilization_caps_the_034_engine_as_requested(run_kvops):
    plan = doc(
        run_kvops, "-m", "llama-3-8b", "--gpu", "h100", "--max-model-len", "8192", "--gpu-memory-utilization", "0.9"
    )
    bytes_of = {item["name"]: item["bytes"] for item in plan["memory"]["terms"]}
    resident = bytes_of["weights"] + bytes_of["non_torch"] + bytes_of["cuda_graphs"]
    transient = bytes_of["activation"]
    assert plan["flags"]["gpu-memory-utilization"] == 0.9
    assert bytes_of["kv_cache"] == bytes_of["requested"] - resident - transient  # the requested budget binds


@pytest.mark.parametrize(
    ("extra", "path"),
    [
        (("--kv-cache-memory-bytes", "20GiB"), "pinned"),
        (("--num-gpu-blocks-override", "4000"), "blocks"),
        (("--no-vmm",), "profiler"),
        (("--no-enable-extensible-kv-cache",), "profiler"),
        (("--engine-version", "0.33.0"), "profiler"),
    ],
)
def test_the_extensible_kv_cache_is_off_where_vllm_turns_it_off(run_kvops, extra, path):
    """vllm/config/vllm.py `_resolve_extensible_kv_cache`: a fixed size or block count overrides the measurement; a
    driver without VMM falls back to profiling (then the default utilization is 0.92); 0.33 has no extensible cache."""
    plan = doc(run_kvops, "-m", "llama-3-8b", "--gpu", "h100", "--max-model-len", "8192", *extra)
    assert any(note.startswith(f"KV sizing: {path}:") for note in plan["notes"]), plan["notes"]
    assert plan["engine_version"]["family"] != releases.EXTENSIBLE
    if path == "profiler":
        assert plan["flags"]["gpu-memory-utilization"] == 0.92 and "startup_used" not in {
            item["name"] for item in plan["memory"]["terms"]
        }
    if path == "blocks":
        assert plan["flags"]["num-gpu-blocks-override"] == 4000 and plan["capacity"]["num_blocks"] == 4000


def test_asking_for_the_extensible_kv_cache_where_vllm_refuses_it_is_its_error(run_kvops):
    args = ("-m", "llama-3-8b", "--gpu", "h100", "--max-model-len", "8192", "--enable-extensible-kv-cache")
    err = run_kvops("plan", *args, "--kv-cache-memory-bytes", "20GiB", expect=2).stderr
    assert "enable_extensible_kv_cache: it sizes the KV cache from measured memory" in err
    assert "has no extensible KV cache" in run_kvops("plan", *args, "--engine-version", "0.33.0", expect=2).stderr


def test_034_holds_more_kv_than_031_on_the_l40s_as_a_public_planner_measured():
    """gpu-fit v1.2 measured 8.7% (Qwen3-8B) to 16.7% (Qwen3-14B) more KV tokens on 0.34 than on 0.31 on an L40S:
    kvops plans more on 0.34 too, and no more than was measured (it errs toward less KV)."""
    for model, measured in (("qwen3-8b", 0.087), ("qwen3-14b", 0.167)):
        tokens = {
            version: plan_of(model=model, gpu="L40S", max_model_len=8192, engine_version=version).capacity.kv_tokens
            for version in ("0.31.0", "0.34.0")
        }
        gain = tokens["0.34.0"] / tokens["0.31.0"] - 1
        assert 0 < gain <= measured, (model, gain)


def test_the_committed_blocks_are_whole_granules_per_layer():
    """The extensible cache maps each layer's segment in 2 MiB granules (ExtensibleKVCache.blocks_within): with
    64 KiB per layer per block, 32 layers, 1 GiB + 31 MiB commits 512 blocks, not the 527 the bytes would hold."""
    from kvops.engines.vllm import layout

    spec = plan_of(model="llama-3-8b", gpu="h100").inputs.spec
    kv = layout.kv_layout(spec, KV_DTYPES["bf16"], 1, 16)
    assert kv.bytes_per_block == 32 * 64 * 1024
    assert layout.committed_blocks(kv, GiB + 31 * (1 << 20)) == 512 < (GiB + 31 * (1 << 20)) // kv.bytes_per_block


# --- the new KV dtypes' exact bytes ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "slot"),
    [
        # head 128, K + V per token per KV head, as each release's backend packs it (kvops/dtypes.py names the
        # source): NVFP4 2 x (64 + 8); TurboQuant key + value + scales, rounded up to even (the 0.20-0.34 wheels
        # give 196/134/118/102: ceil(128 x bits / 8) + 2 for MSE keys, + 4 for values); UltraQuant 2 x (64 + 4)
        ("nvfp4", 144),
        ("nvfp4_4over6", 144),
        ("turboquant_k8v4", 196),
        ("turboquant_4bit_nc", 134),
        ("turboquant_k3v4_nc", 118),
        ("turboquant_3bit_nc", 102),
        ("ultraquant_4bit", 136),
        ("octave_k3v4", 136),
        ("octave_k3v3_compact", 100),
    ],
)
def test_packed_kv_dtypes_take_their_backends_slot_bytes(name, slot):
    assert KV_DTYPES[name].slot_bytes(128, 128) == slot


def test_turboquant_keeps_the_boundary_layers_at_the_models_dtype():
    """TurboQuant's first and last two layers stay 16-bit (get_boundary_skip_layers, from 0.20.0): 28 of 32 layers
    at 196 B per KV head, 4 at 512 B, 8 KV heads, one uniform-type group summing the pages."""
    plan = plan_of(model="llama-3-8b", gpu="h100", kv_dtype="turboquant_k8v4", max_model_len=8192)
    assert plan.flags["kv-cache-dtype"] == "turboquant_k8v4"
    # 64 tokens a block, vLLM 0.34's default (TurboQuant's kernels take 16, 32, 64 and 128)
    assert plan.capacity.block_size == 64
    assert plan.capacity.bytes_per_block == 64 * 8 * (28 * 196 + 4 * 512)


def test_a_kv_dtype_the_release_does_not_take_names_the_release_that_adds_it():
    with pytest.raises(UsageError, match=r"vLLM 0\.31\.0 has no --kv-cache-dtype octave_k3v4 \(added in 0\.33\.0\)"):
        plan_of(model="llama-3-8b", gpu="mi300x", kv_dtype="octave_k3v4", engine_version="0.31.0")
    with pytest.raises(UsageError, match=r"ultraquant_4bit \(added in 0\.32\.0\)"):
        plan_of(model="llama-3-8b", gpu="h100", kv_dtype="ultraquant_4bit", engine_version="0.31.0")


# --- the defects, each as the command that showed it --------------------------------------------------------------


def test_defect1_gemma4_e4b_counts_its_per_layer_embeddings_and_towers(run_kvops):
    """kvops plan -m google/gemma-4-E4B-it --gpu L40S --gpu-memory-utilization 0.85 --max-model-len 16384
    --engine-version 0.25.1 counted 4.34B parameters; the bf16 checkpoint is ~15 GiB."""
    plan = doc(run_kvops, "-m", E4B, "--gpu", "L40S", "--gpu-memory-utilization", "0.85", "--max-model-len", "16384",
               "--engine-version", "0.25.1")  # fmt: skip
    weights = term(plan, "weights")
    assert 14.5 * GiB < weights["bytes"] < 15.5 * GiB
    spec = plan_of(model=E4B, gpu="L40S").inputs.spec
    assert spec.parameters > 4.34e9 + 262_144 * 42 * 256  # the per-layer embedding table alone is 2.8B
    text_only = plan_of(model=E4B, gpu="L40S", text_only=True).term("weights").bytes
    assert text_only < weights["bytes"]  # --language-model-only leaves the vision and audio towers out


def test_defect2_release_boundaries_are_the_wheels(run_kvops):
    args = ("-m", "llama-3-8b", "--gpu", "h100", "--max-model-len", "8192")
    v20 = doc(run_kvops, *args, "--engine-version", "0.20.0")
    assert v20["flags"]["gpu-memory-utilization"] == 0.92 and term(v20, "cuda_graphs")["bytes"] > 0
    v19 = doc(run_kvops, *args, "--engine-version", "0.19.1")
    assert v19["flags"]["gpu-memory-utilization"] == 0.9 and term(v19, "cuda_graphs")["bytes"] == 0
    sliding = ("-m", "gemma-2-9b", "--gpu", "h100", "--max-model-len", "8192")
    assert doc(run_kvops, *sliding, "--engine-version", "0.25.1")["capacity"]["max_in_flight_tokens"] == 8192
    assert doc(run_kvops, *sliding, "--engine-version", "0.26.0")["capacity"]["max_in_flight_tokens"] == 16384


def test_hybrid_pools_follow_the_releases_prefix_caching_and_kv_size_line(run_kvops):
    """Two public 0.20.0 launches of Qwen3.5-9B (a Gated DeltaNet hybrid) on RTX 5090s print 53,328 and 246,576 KV
    tokens and 36.91x and 169.82x concurrency: 11 blocks per request (8 attention blocks, one state page in each of
    the 3 state groups: hybrid models ran without prefix caching before 0.28.0) and blocks // groups x block size
    tokens (through 0.20.0). kvops had planned 2 state pages per group from every release and concurrency x
    max-model-len tokens from 0.20.0: 119,076 tokens and 29.07x with the same KV pinned."""
    args = ("-m", "Qwen/Qwen3.5-9B", "--gpu", "RTX-5090", "--max-model-len", "4096", "--max-num-batched-tokens", "8192")
    for tp, kv_gib, tokens, concurrency in ((1, 6.56, 53_328, 36.91), (2, 15.06, 246_576, 169.82)):
        pinned = ("--tp", str(tp), "--kv-cache-memory-bytes", str(round(kv_gib * GiB)))
        capacity = doc(run_kvops, *args, *pinned, "--engine-version", "0.20.0")["capacity"]
        assert capacity["blocks_per_request_at_max_model_len"] == 11 and capacity["kv_tokens"] == tokens
        assert capacity["max_concurrency"] == pytest.approx(concurrency, rel=0.005)  # the logged GiB's rounding
    newer = doc(run_kvops, *args, "--kv-cache-memory-bytes", str(round(6.56 * GiB)), "--engine-version", "0.28.0")
    assert newer["capacity"]["blocks_per_request_at_max_model_len"] == 14  # 'align': two state pages per group
    # 0.30.0 (align), Qwen3.5-27B FP8 and AWQ on two RTX 4090s (Leroyyyyyyyyy/locnvda, the engine's figures tabulated):
    # 6.1 and 11.25 GiB of KV, 122,398 and 226,484 tokens, 14.94x and 27.65x at 8,192 tokens
    for quantization, kv_gib, tokens, concurrency in (("fp8", 6.1, 122_398, 14.94), ("awq", 11.25, 226_484, 27.65)):
        launch = ("-m", "Qwen/Qwen3.5-27B", "--gpu", "RTX-4090", "--tp", "2", "--max-model-len", "8192")
        flags = ("--max-num-seqs", "64", "--language-model-only", "--quantization", quantization)
        pinned = ("--kv-cache-memory-bytes", str(round(kv_gib * GiB)), "--engine-version", "0.30.0")
        capacity = doc(run_kvops, *launch, *flags, *pinned)["capacity"]
        assert capacity["kv_tokens"] == tokens and round(capacity["max_concurrency"], 2) == concurrency
    asked = doc(run_kvops, *args, "--enable-prefix-caching", "--engine-version", "0.27.0")
    assert asked["capacity"]["blocks_per_request_at_max_model_len"] == 14


def test_the_mamba_cache_mode_is_the_releases(run_kvops):
    """State pages per request of Granite-4.0-H (Mamba-2, 9 state groups) at 32,768 tokens, 63 attention blocks of
    528: 'none' (1 page) where prefix caching is off, 'align' (2; a Mamba-2 mixer's prefill checkpoint makes it 3
    from 0.32.0), and 'all' (a page per block of tokens), which prefix caching chose for the models that support it
    through 0.27 and which 0.32.0 no longer takes. `--mamba-cache-mode all` had raised a KeyError."""
    args = ("-m", "ibm-granite/granite-4.0-h-small", "--gpu", "h100", "--max-model-len", "32768")

    def blocks(*extra: str) -> int:
        return doc(run_kvops, *args, *extra)["capacity"]["blocks_per_request_at_max_model_len"]

    assert blocks("--engine-version", "0.27.0") == 63 + 9
    assert blocks("--engine-version", "0.27.0", "--enable-prefix-caching") == 63 + 9 * 63
    assert blocks("--engine-version", "0.31.0") == 63 + 9 * 2
    assert blocks("--engine-version", "0.31.0", "--mamba-cache-mode", "all") == 63 + 9 * 63
    # 0.34 aligns the hybrid block from its 64-token default: 576 tokens, 57 attention blocks at 32,768
    assert blocks("--engine-version", "0.34.0") == 57 + 9 * 3
    assert blocks("--engine-version", "0.34.0", "--block-size", "16") == 63 + 9 * 3
    qwen = ("-m", "Qwen/Qwen3.5-9B", "--gpu", "h100", "--max-model-len", "4096", "--engine-version", "0.27.0")
    asked_all = doc(run_kvops, *qwen, "--mamba-cache-mode", "all")  # Gated DeltaNet: vLLM falls back to align
    assert asked_all["capacity"]["blocks_per_request_at_max_model_len"] == 8 + 3 * 2
    err = run_kvops("plan", *args, "--mamba-cache-mode", "all", "--engine-version", "0.32.0", expect=2).stderr
    assert "--mamba-cache-mode all: vLLM 0.32.0 takes align or none" in err and "Traceback" not in err


def test_defect3_v1_before_0111_plans_with_v1_overheads_and_a_sorting_sampler(run_kvops):
    """V1 0.8-0.11.0 borrowed V0's overheads (non-torch 0.35 GiB at tp 4); it falls back to the V1 family's, with
    V0's sorting sampler; 0.7.x with VLLM_USE_V1=1 is planned as V1 (--engine-version 0.7.3-v1)."""
    from kvops.overheads import shipped_fit

    fit = shipped_fit("vllm")
    v1_early, v1, v0 = (fit.family(name) for name in ("V1 < 0.11.1", "V1 0.11.1-0.19", "V0"))
    assert v1_early.non_torch == v1.non_torch != v0.non_torch
    assert v1_early.sampler_bytes_per_logit == v0.sampler_bytes_per_logit != v1.sampler_bytes_per_logit
    plan = doc(run_kvops, "-m", "llama-3-8b", "--gpu", "h100", "--tp", "4", "--engine-version", "0.10.1")
    assert term(plan, "non_torch")["bytes"] == v1.non_torch[1]
    opt_in = doc(run_kvops, "-m", "llama-3-8b", "--gpu", "h100", "--engine-version", "0.7.3-v1")
    assert opt_in["engine_version"]["family"] == "V1 < 0.11.1" and "VLLM_USE_V1=1" in opt_in["notes"][0]


def test_defect4_tensor_parallel_overheads_follow_the_interconnect_and_the_graphs(run_kvops):
    """PCIe cards beyond two run without vLLM's custom all-reduce, NVLink ones with it; --compilation-config with
    cudagraph_mode NONE captures no graphs, fewer capture sizes scale the estimate."""
    assert budget.custom_all_reduce(plan_of(model="qwen3-8b", gpu="H100-80GB", tp=4).inputs)[0]
    pcie, why = budget.custom_all_reduce(plan_of(model="qwen3-8b", gpu="L40S", tp=4).inputs)
    assert not pcie and "more than two PCIe-only GPUs" in why
    assert not budget.custom_all_reduce(plan_of(model="qwen3-8b", gpu="RTX-4090", tp=2).inputs)[0]
    l40s = doc(run_kvops, "-m", "qwen3-8b", "--gpu", "L40S", "--tp", "4", "--engine-version", "0.32.0")
    assert (
        "without custom all-reduce" in term(l40s, "non_torch")["formula"]
        or "no log without it" in term(l40s, "non_torch")["formula"]
    )
    args = ("-m", "llama-3-8b", "--gpu", "h100", "--max-model-len", "8192", "--engine-version", "0.32.0")
    none = doc(run_kvops, *args, "--compilation-config", '{"cudagraph_mode": "NONE"}')
    assert term(none, "cuda_graphs")["bytes"] == 0 and none["flags"]["compilation-config"]
    few = doc(run_kvops, *args, "--compilation-config", '{"max_cudagraph_capture_size": 64}')
    full = doc(run_kvops, *args)
    assert term(few, "cuda_graphs")["bytes"] * budget.DEFAULT_CAPTURES // 11 <= term(full, "cuda_graphs")["bytes"]


def test_the_graph_estimate_follows_the_capture_sizes_vllm_picks_for_the_launch(run_kvops):
    """vLLM captures sizes up to min(max-num-batched-tokens, 2 x max-num-seqs, 512; 1024 on data-center Blackwell
    from 0.28): an H200 on vLLM 0.31.0 logged a 0.52 GiB estimate for the default 51 sizes and 0.11 GiB for the 11
    of --max-num-seqs 32 (tests/fixtures/corpus: vllm-0.31.0-h200-llama-3.2-1b-instruct-fp16-*)."""
    args = ("-m", "llama-3.2-1b-instruct", "--gpu", "H200", "--max-model-len", "16384", "--engine-version", "0.31.0")
    full = term(doc(run_kvops, *args), "cuda_graphs")
    few = term(doc(run_kvops, *args, "--max-num-seqs", "32"), "cuda_graphs")
    assert few["bytes"] == full["bytes"] * 11 // budget.DEFAULT_CAPTURES
    assert "x 11/51 capture sizes (vLLM's default capture sizes up to 64" in few["formula"]
    assert "capture sizes" not in full["formula"]
    inputs = plan_of(model="qwen3-8b", gpu="B200").inputs
    assert budget.default_captures(inputs, releases.release("0.28.0"), 8192, 1024).captures == 83  # up to 1024
    assert budget.default_captures(inputs, releases.release("0.27.0"), 8192, 1024).captures == 51
    # max-num-batched-tokens and max-num-seqs below the ceiling are captured too
    assert budget.default_captures(inputs, releases.release("0.31.0"), 100, 6).captures == len({1, 2, 4, 8, 6})
    # speculative decoding widens the decode query (1 + 3 tokens): sizes up to 2 x 32 x 4 = 256, not 64
    drafted = replace(inputs, speculative=Speculative("mtp", 3))
    assert budget.default_captures(drafted, releases.release("0.31.0"), 8192, 32).captures == 35


def test_a_profiles_graph_estimate_is_scaled_to_the_plans_capture_sizes(run_kvops, tmp_path):
    """A profile keeps the capture sizes its run captured: calibrated on the H200 run at --max-num-seqs 32 (11 sizes,
    0.11 GiB), a plan at vLLM's default (51 sizes) scales it to what the default run logged (0.52 GiB)."""
    log = Path("tests/fixtures/corpus/vllm/vllm-0.31.0-h200-llama-3.2-1b-instruct-fp16-32seqs-tp1.log")
    profile = tmp_path / "h200.yaml"
    run_kvops(
        "calibrate", "--vllm-log", str(log), "-m", "llama-3.2-1b-instruct", "--gpu", "H200", "--save", str(profile)
    )
    saved = yaml.safe_load(profile.read_text())
    assert saved["cudagraph_captures"] == 11 and saved["cudagraph_bytes"] == round(0.11 * GiB)
    args = ("-m", "llama-3.2-1b-instruct", "--gpu", "H200", "--max-model-len", "16384", "--engine-version", "0.31.0")
    same = term(doc(run_kvops, *args, "--max-num-seqs", "32", "--profile", str(profile)), "cuda_graphs")
    assert same["bytes"] == round(0.11 * GiB) and same["basis"] == "measured"
    default = term(doc(run_kvops, *args, "--profile", str(profile)), "cuda_graphs")
    assert default["bytes"] == round(0.11 * GiB) * 51 // 11 and default["basis"] == "estimate"
    assert abs(default["bytes"] - 0.52 * GiB) < 0.02 * GiB  # the default run's own estimate
    assert "for its 11 capture sizes, x 51/11" in default["formula"]


def test_defect6_the_multimodal_encoders_profile_pass_is_in_the_activation(run_kvops):
    """A VL model's profile runs its encoder over the encoder budget (max-num-batched-tokens of tokens, here 16
    SigLIP patches each) before the decoder: the activation term takes it; --language-model-only does not."""
    args = ("-m", "gemma-3-4b-it", "--gpu", "h100", "--max-model-len", "8192", "--max-num-seqs", "64")
    vl = term(doc(run_kvops, *args), "activation")
    text = term(doc(run_kvops, *args, "--language-model-only"), "activation")
    assert "multimodal encoder's profile pass over 8192 tokens' 131,072 patches" in vl["formula"]
    assert vl["bytes"] > text["bytes"] + 2 * GiB


def test_the_encoder_budget_is_the_largest_image_where_that_is_more_and_splits_by_tp(run_kvops):
    """vLLM's encoder budget is max(max-num-batched-tokens, the most tokens one image yields)
    (compute_mm_encoder_budget): a public 0.19.0 log of Qwen3.5-9B on an L40S at 8,192 batched tokens prints 'Encoder
    cache will be initialized with a budget of 16384 tokens' and logged 20.27 GiB of KV, where kvops had planned
    21.16 (the sampler's 0.92 GiB the peak); now 20.40. The tower's attention and MLP split by tp."""
    args = ("-m", "Qwen/Qwen3.5-9B", "--gpu", "L40S", "--engine-version", "0.19.0", "--max-num-batched-tokens", "8192")
    plan = doc(run_kvops, *args)
    assert "multimodal encoder's profile pass over 16384 tokens' 65,536 patches" in term(plan, "activation")["formula"]
    assert 20.27 * GiB < term(plan, "kv_cache")["bytes"] < 20.27 * 1.02 * GiB
    tp1, tp2 = (term(doc(run_kvops, *args, "--tp", tp), "activation")["bytes"] for tp in "12")
    assert tp2 < tp1


def test_defect7_a_launch_vllm_refuses_does_not_fit_and_the_sampler_is_sized_for_the_emitted_seqs(run_kvops):
    state = (
        "-m",
        "ibm-granite/granite-4.0-h-small",
        "--gpu",
        "h100",
        "--max-model-len",
        "32768",
        "--max-num-seqs",
        "2000",
    )
    refused = doc(run_kvops, *state, expect=3)
    assert refused["fits"] is False and "exceeds available Mamba cache blocks" in refused["problem"]
    # 0.19 has no such check (config/compilation.py: first in the 0.20.0 wheel)
    assert doc(run_kvops, *state, "--engine-version", "0.19.1")["fits"] is True
    plan = doc(run_kvops, "-m", "qwen3-8b", "--gpu", "L40S", "--max-model-len", "32768")
    assert plan["capacity"]["sampler_sequences"] == plan["flags"]["max-num-seqs"] < 1024


def test_defect7_the_seqs_kvops_chooses_for_a_hybrid_model_settle_within_its_state_blocks(run_kvops):
    """The plan holds --max-num-seqs to the state blocks and sizes the profile's sampler for the seqs it emits;
    re-planning with each pass's choice can swing (the sampler for 700 sequences leaves 699 blocks on a GB300,
    for 23 leaves 15 on four RTX 3090s and for 15 more): the plan settles on the most sequences it can size for
    and still choose, so the emitted line starts, and a larger card never plans less."""
    plan = doc(run_kvops, "-m", "Qwen/Qwen3.5-122B-A10B", "--gpu", "GB300", "--kv-dtype", "fp8")
    assert plan["fits"] is True
    assert plan["flags"]["max-num-seqs"] == plan["capacity"]["sampler_sequences"] <= plan["capacity"]["num_blocks"]
    small, large = (
        doc(
            run_kvops,
            "-m",
            "Qwen/Qwen3.5-35B-A3B",
            "--gpu",
            gpu,
            "--tp",
            "4",
            "--kv-dtype",
            "fp8",
            "--max-model-len",
            "2048",
            "--language-model-only",  # the vision tower's profile pass over a 16,384-token image leaves no KV here
        )
        for gpu in ("RTX-3090", "RTX-4090")  # 23.58 and 23.63 GiB as torch sees them
    )
    assert 0 < small["capacity"]["kv_cache_size_tokens"] <= large["capacity"]["kv_cache_size_tokens"]


def test_defect8_the_engines_kv_and_kvops_margin_are_apart(run_kvops):
    memory = doc(run_kvops, "-m", "llama-3-8b", "--gpu", "h100", "--max-model-len", "8192")["memory"]
    assert memory["kv_cache_bytes"] == term({"memory": memory}, "kv_cache")["bytes"]
    assert memory["capacity_kv_bytes"] == memory["kv_cache_bytes"] - memory["margin_bytes"]
    assert memory["capacity_uses"].startswith("capacity_kv_bytes")


def test_defect9_flags_images_and_ways_out_are_the_planned_releases(run_kvops):
    old = ("-m", "llama-3-8b", "--gpu", "h100", "--max-model-len", "8192", "--engine-version", "0.10.1")
    assert "added in 0.20.0" in run_kvops("plan", *old, "--kv-dtype", "int8", expect=2).stderr
    plan = doc(run_kvops, *old)
    assert plan["command"]["image"] == "vllm/vllm-openai:v0.10.1"
    short = ("-m", "llama-3.1-70b", "--gpu", "h100", "--max-model-len", "32768", "--engine-version", "0.6.4")
    ways = [way["change"] for way in doc(run_kvops, *short, expect=3)["ways_out"]]
    assert not any("int4" in way or "int8" in way or "kv-offloading" in way for way in ways), ways
    tgi = doc(run_kvops, "--engine", "tgi", "-m", "llama-3-8b", "--gpu", "a10g", "--max-model-len", "4096",
              "--engine-version", "0.9.3")  # fmt: skip
    assert "max-input-length" in tgi["flags"] and "max-input-tokens" not in tgi["flags"]
    assert not any("--cuda-graphs" in warning for warning in tgi["warnings"])
    assert tgi["command"]["image"] == "ghcr.io/huggingface/text-generation-inference:0.9.3"


def test_bitsandbytes_is_served_by_the_releases_that_served_it():
    release_options = options.for_version(releases.release("0.26.0").version)
    options.check_weight_format(release_options, "bitsandbytes-nf4", "vLLM 0.26.0")
    with pytest.raises(UsageError, match=r"served from 0\.5\.0"):
        options.check_weight_format(options.for_version(releases.release("0.28.0").version), "bitsandbytes", "x")


def test_every_emitted_option_is_in_the_planned_releases_own_table():
    """Each option a plan emits is one its release's wheel spells (release_options.json, from the wheels)."""
    for version in ("0.8.5", "0.10.1", "0.19.1", "0.26.0", "0.32.0", "0.33.0", "0.34.0"):
        plan = plan_of(model="llama-3-8b", gpu="h100", max_model_len=8192, engine_version=version)
        table = options.for_version(releases.release(version).version)
        for name in plan.flags:
            assert name == "model" or table.has(f"--{name}"), (version, name)


@pytest.mark.vllm
def test_emitted_commands_parse_with_the_installed_vllms_own_parser():
    """The installed vLLM parses what a plan for its release emits, `vllm serve` as its own subcommand parses it,
    into the values planned: 0.32.0 in the suite, 0.33.0 and 0.34.0 where .ci/newer_vllm runs it against their
    wheels (other releases are checked against their option tables above)."""
    vllm = pytest.importorskip("vllm")
    import warnings

    warnings.simplefilter("ignore")
    from vllm.entrypoints.cli.serve import ServeSubcommand
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser()
    ServeSubcommand().subparser_init(parser.add_subparsers(dest="subparser"))
    for values in (
        {"model": "llama-3-8b", "gpu": "h100", "max_model_len": 8192},
        {
            "model": "qwen3-8b",
            "gpu": "L40S",
            "tp": 4,
            "kv_dtype": "fp8",
            "compilation_config": '{"cudagraph_mode": "NONE"}',
        },
        {"model": "gemma-2-9b", "gpu": "h100", "kv_dtype": "int8", "num_gpu_blocks_override": 3000},
    ):
        plan = plan_of(**values, engine_version=vllm.__version__.split("+")[0])
        args = parser.parse_args(["serve", *plan.args])
        assert args.max_model_len == plan.flags["max-model-len"]
        assert args.max_num_seqs == plan.flags["max-num-seqs"]
        assert args.kv_cache_dtype == plan.flags["kv-cache-dtype"]


def test_a_034_log_is_read_as_the_extensible_kv_cache_sized_it():
    from kvops.engines.vllm.logs import parse_vllm_log

    log = parse_vllm_log(
        "INFO [api_server.py:1] vLLM API server version 0.34.0\n"
        "INFO [gpu_worker.py:812] Available KV cache memory: 70.10 GiB\n"
        "INFO [extensible_kv_cache.py:713] Memory after warmup: 60.50 GiB free, 0.01 GiB committed to the KV cache, "
        "1.68 GiB kept for transient activations (1.68 GiB allocated at peak, 0.50 GiB of torch reservation growth); "
        "28000 KV cache blocks (54.69 GiB) fit within the requested 79.19 GiB. Torch may reserve up to 3.00 GiB.\n"
        "INFO [extensible_kv_cache.py:512] Extended KV cache to 28000 blocks (54.69 GiB).\n"
    )
    assert log.facts["kv_cache_bytes"] == round(54.69 * GiB) and log.facts["num_gpu_blocks"] == 28000
    assert log.facts["reserved_kv_bytes"] == round(70.10 * GiB)  # the reservation, not the KV it kept
    assert log.release().family == releases.EXTENSIBLE


def test_release_options_table_is_read_from_the_wheels():
    data = json.loads((Path(options.__file__).parent / options.OPTIONS_FILE).read_text())["releases"]
    assert {"0.20.0", "0.33.0", "0.34.0"} <= set(data)
    assert data["0.34.0"]["options"]["--enable-extensible-kv-cache"].startswith("vllm/engine/arg_utils.py:")
    assert "--enable-extensible-kv-cache" not in data["0.33.0"]["options"]
    assert replace(releases.release("0.34.0"), extensible=True).default_gpu_memory_utilization == 1.0


def test_the_watcher_reads_the_metrics_032_to_034_added():
    """A 0.34 /metrics: the refusals of vLLM's own queue limit, the host tier's tokens (kv_offload_config_info,
    summed over engines) and the prefix-cache hit tokens by tier; vllm:watermark_requests is not read."""
    from kvops.engines.metrics import Samples
    from kvops.engines.vllm import metrics

    text = "\n".join(
        (
            "# TYPE vllm:kv_cache_usage_perc gauge",
            'vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.5',
            "# TYPE vllm:admission_rejections counter",
            'vllm:admission_rejections_total{model_name="m",reason="max_num_queued_reqs"} 3',
            'vllm:admission_rejections_total{model_name="m",reason="max_num_queued_tokens"} 2',
            "# TYPE vllm:kv_offload_config_info gauge",
            'vllm:kv_offload_config_info{engine="0",cpu_num_chunks="100",cpu_kv_cache_size_tokens="409600"} 1',
            "# TYPE vllm:prompt_tokens_cached_by_source counter",
            'vllm:prompt_tokens_cached_by_source_total{engine="0",model_name="m",source="device"} 900',
            'vllm:prompt_tokens_cached_by_source_total{engine="0",model_name="m",source="host"} 100',
            "# TYPE vllm:watermark_requests counter",
            'vllm:watermark_requests_total{engine="0",model_name="m",status="watermarked"} 7',
            "",
        )
    )
    reading = metrics.reading(Samples.from_exposition(text, metrics.SERIES))
    assert reading.admission_rejections_total == 5 and reading.offload_capacity_tokens == 409600
    assert reading.cached_tokens_by_source == {"device": 900.0, "host": 100.0}
    assert reading.to_dict()["admission_rejections_total"] == 5 and reading.kv_usage == 0.5
    assert metrics.WATERMARK_REQUESTS not in metrics.SERIES


def test_data_center_blackwell_on_034_pads_decodes_and_mixed_steps_to_their_own_grids():
    """vLLM 0.34 on a B200 with no capture size set: decode graphs by request count (64 counts to 1,024), prefill
    graphs by token count (54 to 8,192), as its docstrings count them; the simulator pads a step of decodes alone to
    the first and any other step to the second. Where the installed vLLM has the grids (0.34's wheel, run by
    .ci/newer_vllm), kvops' are its own to the last size. Elsewhere, and before 0.34, one shared list."""
    options_ = DeploymentOptions(model="llama-3.1-8b", gpu="B200", max_model_len=32768)
    inputs = options_.plan_inputs()
    new, old = releases.release("0.34.0"), releases.release("0.33.0")
    decode, prefill = budget.wide_grids(inputs, new, 8192, 1024)
    assert len(decode) == 64 and decode[:8] == [1, 2, 3, 4, 5, 6, 8, 10] and decode[-1] == 1024
    assert len(prefill) == 54 and prefill[-1] == 8192 and prefill[:10] == [1, 2, 4, 8, 16, 24, 32, 40, 48, 56]
    assert budget.graph_sizes(inputs, new, 8192, 1024) == (tuple(prefill), tuple(decode))
    assert budget.graph_sizes(inputs, old, 8192, 1024)[1] == () and budget.wide_grids(inputs, old, 8192, 1024)[0] == []
    h100 = DeploymentOptions(model="llama-3.1-8b", gpu="H100", max_model_len=32768).plan_inputs()
    assert budget.wide_grids(h100, new, 8192, 1024) == ([], [])
    try:
        from vllm.config.compilation import decode_cudagraph_capture_grid, prefill_cudagraph_capture_grid
    except ImportError:
        return  # the installed 0.32 has one shared list
    assert decode == decode_cudagraph_capture_grid(1024) and prefill == prefill_cudagraph_capture_grid(8192)
    for seqs, batched in ((256, 2048), (48, 8192), (1024, 16384)):
        kvops_decode, kvops_prefill = budget.wide_grids(inputs, new, batched, seqs)
        assert kvops_prefill == prefill_cudagraph_capture_grid(min(8192, batched))
        assert kvops_decode == [min(count, batched) for count in decode_cudagraph_capture_grid(seqs)]
