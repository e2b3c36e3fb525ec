"""The planner's ways out, in the order a user should try them: lossless first (more tensor parallelism, more
replicas, a larger GPU, a shorter context that still holds the planned requests), then quantized KV from the least
lossy, each with its quality warning and the engine's spelling, then host memory."""

from __future__ import annotations

import re

import pytest
from click.testing import CliRunner

from kvops.cli import main
from kvops.deployment import load_profile
from kvops.gpus import find_gpu
from kvops.model import load_model
from kvops.plan import PlanInputs
from kvops.planner import plan
from kvops.workload import Workload

LONG_REQUESTS = Workload(8000, 2000, source="flags")


def changes(result) -> list[str]:
    return [
        way.change.split()[0] + (" " + way.change.split()[1] if way.change.startswith("--kv-dtype") else "")
        for way in result.ways_out
    ]


def test_lossless_ways_come_first_then_int8_fp8_int4_then_host_memory():
    inputs = PlanInputs(
        "vllm", load_model("llama-3-8b"), find_gpu("L40S"), max_model_len=32768, workload=LONG_REQUESTS, concurrency=64
    )
    result = plan(inputs)
    assert not result.fits
    order = changes(result)
    assert order.index("--tp") < order.index("--gpus") < order.index("--gpu") < order.index("--max-model-len")
    assert (
        order.index("--max-model-len")
        < order.index("--kv-dtype int8")
        < order.index("--kv-dtype fp8")
        < order.index("--kv-dtype int4")
    )
    assert order[-1] == "--kv-offloading-size"
    quantized = {way.change: way.warning for way in result.ways_out if way.change.startswith("--kv-dtype")}
    assert quantized["--kv-dtype int8"].startswith(
        "int8 KV, vLLM --kv-cache-dtype int8_per_token_head: quantized KV costs quality"
    )
    assert quantized["--kv-dtype fp8"].startswith("fp8 KV, vLLM --kv-cache-dtype fp8: quantized KV costs quality")


def test_a_shorter_context_that_drops_the_planned_requests_is_not_a_way_out():
    inputs = PlanInputs(
        "vllm", load_model("llama-3-8b"), find_gpu("L40S"), max_model_len=32768, workload=LONG_REQUESTS, concurrency=64
    )
    shorter = next(way for way in plan(inputs).ways_out if way.change == "--max-model-len auto")
    assert shorter.fits is False
    assert "requests of 10000 tokens (prompt + gen) exceed --max-model-len" in shorter.result


@pytest.mark.parametrize(
    ("engine", "model", "gpu", "length", "concurrency"),
    [
        ("vllm", "llama-3-8b", "L40S", 32768, 64),  # the KV runs out
        ("vllm", "llama-3.1-70b", "L40S", 8192, 4),  # the weights alone do not fit: no KV offloading
        ("vllm", "qwen3-30b-a3b", "A100-40GB", 16384, 16),
        ("tgi", "llama-3-8b", "L4", 8192, 64),
        ("tgi", "llama-3.1-70b", "A100-80GB", 8192, 8),
    ],
)
def test_no_way_out_marked_fits_contradicts_the_plan(engine, model, gpu, length, concurrency):
    """A way out marked "fits" holds the planned requests: its max-model-len is not below them; and KV offloading
    is no way out when the weights themselves do not fit (it frees no GPU memory for them)."""
    inputs = PlanInputs(
        engine,
        load_model(model),
        find_gpu(gpu),
        max_model_len=length,
        workload=Workload(length - 2000, 2000, source="flags"),
        concurrency=concurrency,
    )
    result = plan(inputs)
    assert not result.fits
    for way in result.ways_out:
        if way.fits and way.flags:
            key = "max-model-len" if engine == "vllm" else "max-total-tokens"
            assert way.flags[key] >= length, way
    if "the weights alone" in (result.verdict.problem or ""):
        assert not any("offloading" in way.change for way in result.ways_out)


def test_tgi_offers_fp8_only_in_its_own_spelling():
    inputs = PlanInputs(
        "tgi",
        load_model("llama-3-8b"),
        find_gpu("L4"),
        max_model_len=8192,
        workload=Workload(4000, 1000, source="flags"),
        concurrency=64,
    )
    quantized = [way for way in plan(inputs).ways_out if way.change.startswith("--kv-dtype")]
    assert [way.change for way in quantized] == ["--kv-dtype fp8"]
    assert quantized[0].warning.startswith("fp8 KV, TGI --kv-cache-dtype fp8_e4m3fn: ")


def test_a_cpu_plan_offers_no_more_devices():
    inputs = PlanInputs(
        "vllm",
        load_model("llama-3-8b"),
        None,
        device="cpu",
        max_model_len=8192,
        kv_cache_memory_bytes=64 << 20,
        workload=LONG_REQUESTS,
        concurrency=8,
    )
    result = plan(inputs)
    assert not result.fits and not any(way.change.startswith(("--tp", "--gpus", "--gpu ")) for way in result.ways_out)
    assert [way.change for way in result.ways_out if way.change.startswith("--kv-dtype")] == ["--kv-dtype fp8"]


def test_plans_say_paging_does_not_add_memory_with_their_own_numbers():
    for engine, gpu in (("vllm", "L40S"), ("tgi", "L40S")):
        result = plan(PlanInputs(engine, load_model("llama-3-8b"), find_gpu(gpu), max_model_len=8192))
        cap = result.capacity
        slots = f"{cap.num_blocks:,} blocks x {cap.block_size} tokens = {cap.num_blocks * cap.block_size:,} token slots"
        assert any("removes fragmentation, not the limit" in note and slots in note for note in result.notes), engine


def test_tgi_warns_beyond_the_models_trained_context(run_kvops):
    ran = run_kvops(
        "plan", "-e", "tgi", "-m", "llama-3-8b", "--gpu", "L40S", "--max-model-len", "100000", "--format", "shell"
    )
    assert "--max-total-tokens 100000 exceeds meta-llama/Meta-Llama-3-8B's max_position_embeddings 8192" in ran.stderr


def test_weights_that_do_not_fit_are_named_and_not_blamed_on_the_workload(run_kvops):
    ran = run_kvops(
        "plan", "-m", "llama-3.1-70b", "--gpu", "L40S", "--max-model-len", "8192", "--format", "shell", expect=3
    )
    # 70,553,706,496 parameters x 2 B + vLLM's 32 MiB rotary cos/sin cache (131072 positions x 128 x 2 B)
    assert "does not fit: the weights alone (~131.45 GiB) exceed the budget" in ran.stderr
    assert "not one request" not in ran.stderr
    tgi = run_kvops(
        "plan",
        "-e",
        "tgi",
        "-m",
        "llama-3-8b",
        "--gpu",
        "L4",
        "--max-model-len",
        "8192",
        "--gpu-memory",
        "17GiB",
        expect=3,
    )
    # the overheads are the fitted terms of the shipped fit (kvops/catalog/overheads.json, issue 13)
    assert re.search(
        r"does not fit: weights \(~14\.96 GiB\) and overheads \(activation ~[\d.]+ GiB, non_torch ~?[\d.]+ [MG]iB\) "
        r"need ~[\d.]+ GiB per shard but TGI may use ~15\.3 GiB; nothing is left for the KV cache",
        tgi.stderr,
    )


def test_ways_out_hold_a_planned_request_on_a_card_of_the_users_vendor_and_class():
    """Issue 23: a way out marked "fits" holds at least one planned request under the warn level, a larger GPU is
    one the user's fleet can swap in (same vendor; no GeForce card for a data-center one), and a host KV tier is
    not offered when one request does not fit the GPU's blocks."""
    too_long = plan(PlanInputs("vllm", load_model("qwen3-8b"), find_gpu("L4"), max_model_len=32768, concurrency=8))
    assert not too_long.fits
    assert not any(way.change.startswith("--kv-offloading-size") for way in too_long.ways_out)
    for way in too_long.ways_out:
        if way.fits:
            assert "0 requests" not in way.result
    weights = plan(PlanInputs("vllm", load_model("llama-3.1-70b"), find_gpu("L4")))
    larger = [way.change for way in weights.ways_out if way.change.startswith("--gpu ")]
    assert larger and all(not re.search(r"MI\d|RTX-\d{4}$", change) for change in larger)


def test_a_profile_from_another_model_lends_its_device_figures_not_its_weights(tmp_path):
    """Issue 23: a profile calibrated on Qwen3-8B put an 8B model's weights in a 70B plan (exit 0, --max-num-seqs 18)."""
    log = "tests/fixtures/corpus/vllm/vllm-0.10.2-l4-qwen3-8b-fp8-unsloth-tp1.log"
    profile_path = tmp_path / "q3.yaml"
    saved = CliRunner().invoke(main, ["calibrate", "--vllm-log", log, "-m", "Qwen/Qwen3-8B", "--gpu", "l4",
                                      "--save", str(profile_path)])  # fmt: skip
    assert saved.exit_code == 0, saved.output
    profile = load_profile(str(profile_path))
    result = plan(PlanInputs("vllm", load_model("llama-3.1-70b"), find_gpu("L4"), profile=profile))
    weights = result.term("weights")
    assert not result.fits and weights is not None and weights.bytes > 100 * (1 << 30)
    assert weights.basis != "measured"
    assert any("--profile was measured on model" in warning for warning in result.warnings)
