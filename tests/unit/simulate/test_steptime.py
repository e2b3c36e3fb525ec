"""The step-time arithmetic on constructed numbers: each roofline term as its formula says."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from kvops.simulate import steptime
from kvops.simulate.steptime import CacheRead, Coefficient, Coefficients, Hardware, ModelCost, StepTime, StepTimeError

GB = 1e9
HARDWARE = Hardware("test", memory_bandwidth=1000 * GB, flops=100e12, link_bandwidth=100 * GB, source="constructed")


FULL = CacheRead(1000, None, 10, 8, 64)


def dense(tp: int = 1, caches: tuple[CacheRead, ...] = (FULL,)) -> ModelCost:
    return ModelCost(
        name="dense",
        layers=10,
        hidden=1024,
        tp=tp,
        weight_bytes=2_000_000_000,
        expert_bytes=0,
        num_experts=0,
        experts_per_token=0,
        dense_parameters=900_000_000,
        expert_parameters=0,
        head_parameters=100_000_000,
        caches=caches,
    )


def moe(expert_parameters: int = 1, moe_layers: int = 10) -> ModelCost:
    """8 experts, 2 a token, 8e9 bytes of them beside 2e9 of dense weights."""
    return ModelCost(
        name="moe",
        layers=10,
        hidden=1024,
        tp=1,
        weight_bytes=10_000_000_000,
        expert_bytes=8_000_000_000,
        num_experts=8,
        experts_per_token=2,
        dense_parameters=1,
        expert_parameters=expert_parameters,
        head_parameters=0,
        caches=(),
        moe_layers=moe_layers,
    )


def unit_coefficients() -> Coefficients:
    terms = {name: Coefficient(1.0, "test") for name in steptime.TERMS}
    return Coefficients("unit", terms, Coefficient(0.0, "test"), "constructed")


def test_decode_batch_terms():
    model = StepTime(dense(), HARDWARE, unit_coefficients())
    # two decoding requests at 100 and 300 cached tokens, both sampling
    features = dict(zip(steptime.TERMS, model.features([1, 1], [100, 300], 2)))
    linear_flops = 2 * (900e6 * 2 + 100e6 * 2)
    assert features["step_s"] == 1.0
    assert features["layer_s"] == 10.0
    assert features["linear"] == pytest.approx(max(2e9 / 1000e9, linear_flops / 100e12))
    assert features["compute"] == pytest.approx(linear_flops / 100e12)
    assert features["kv"] == pytest.approx(1000 * (101 + 301) / 1000e9)
    # each new token attends to c + 1 keys: 101 + 301 pairs, 4 x heads x head_dim x layers FLOPs each
    assert features["attention"] == pytest.approx(4 * 8 * 64 * 10 * (101 + 301) / 100e12)
    assert features["comm"] == 0.0 and features["comm_latency_s"] == 0.0 and features["tp_step_s"] == 0.0
    assert features["experts"] == 0.0


def test_prefill_pairs_are_causal_and_the_lm_head_counts_only_samples():
    model = StepTime(dense(), HARDWARE, unit_coefficients())
    features = dict(zip(steptime.TERMS, model.features([512], [0], 0)))  # a prefill chunk that samples nothing
    assert features["compute"] == pytest.approx(2 * 900e6 * 512 / 100e12)
    assert features["attention"] == pytest.approx(4 * 8 * 64 * 10 * (512 * 513 / 2) / 100e12)


def test_a_sliding_window_caps_reads_and_pairs():
    window = CacheRead(1000, 128, 10, 8, 64)
    model = StepTime(dense(caches=(window,)), HARDWARE, unit_coefficients())
    features = dict(zip(steptime.TERMS, model.features([1, 200], [1000, 0], 1)))
    assert features["kv"] == pytest.approx(1000 * (128 + 128) / 1000e9)
    # the decode token sees 128 keys; the 200-token prefill: queries 1..128 see 1..128 keys, the rest 128 each
    pairs = 128 + (128 * 129 / 2 + (200 - 128) * 128)
    assert features["attention"] == pytest.approx(4 * 8 * 64 * 10 * pairs / 100e12)


def test_routed_experts_are_read_as_the_tokens_touch_them():
    model = StepTime(moe(), HARDWARE, unit_coefficients())
    one = dict(zip(steptime.TERMS, model.features([1], [0], 1)))
    many = dict(zip(steptime.TERMS, model.features([1] * 64, [0] * 64, 64)))
    assert one["linear"] == pytest.approx(2e9 / 1000e9)  # the dense weights, read whatever the batch
    assert one["experts"] == pytest.approx(8e9 * 2 / 8 / 1000e9)
    assert many["experts"] == pytest.approx(8e9 * (1 - (6 / 8) ** 64) / 1000e9)


def test_a_batch_within_the_cuda_graphs_runs_as_the_next_captured_size():
    """Padding rows are computed, all-reduced and routed; they read no KV cache and sample nothing."""
    eager = StepTime(moe(), HARDWARE, unit_coefficients())
    graphs = eager.with_graphs((16, 1, 8, 2, 4))
    assert graphs.graph_sizes == (1, 2, 4, 8, 16)
    assert [graphs.padded(tokens) for tokens in (1, 3, 8, 11, 16, 17)] == [1, 4, 8, 16, 16, 17]
    eleven = dict(zip(steptime.TERMS, graphs.features([1] * 11, [100] * 11, 11)))
    assert eleven["experts"] == pytest.approx(8e9 * (1 - (6 / 8) ** 16) / 1000e9)  # 16 rows routed, not 11
    sixteen_rows = dict(zip(steptime.TERMS, eager.features([1] * 16, [100] * 16, 11)))
    eleven_rows = dict(zip(steptime.TERMS, eager.features([1] * 11, [100] * 11, 11)))
    for name, value in eleven.items():
        assert value == pytest.approx((eleven_rows if name in ("kv", "attention") else sixteen_rows)[name]), name
    assert graphs.features([1] * 17, [0] * 17, 17) == eager.features([1] * 17, [0] * 17, 17)  # past the largest


def test_tensor_parallel_all_reduces():
    model = StepTime(dense(tp=4), HARDWARE, unit_coefficients())
    features = dict(zip(steptime.TERMS, model.features([10], [0], 1)))
    assert features["comm_latency_s"] == 60.0  # two all-reduces per layer, each reaching the 3 other GPUs
    assert features["tp_step_s"] == 1.0
    assert features["comm"] == pytest.approx(20 * (2 * 3 / 4) * 10 * 1024 * 2 / 100e9)


def test_seconds_are_the_coefficients_times_the_features():
    coefficients = steptime.coefficients("gpu")
    model = StepTime(dense(), HARDWARE, coefficients)
    features = model.features([1, 64], [500, 0], 1)
    terms = coefficients.terms
    expected = sum(terms[name].value * value for name, value in zip(steptime.TERMS, features) if name in terms)
    assert model.seconds([1, 64], [500, 0], 1) == pytest.approx(expected)


def test_expert_elements_count_parameters_not_bytes_and_are_optional():
    # 8-bit experts: 8e9 bytes for 8e9 elements, of which 2 of 8 per token are 2e9 a token passes through
    eight_bit = moe(expert_parameters=2_000_000_000)
    model = StepTime(eight_bit, HARDWARE, unit_coefficients())
    one = dict(zip(steptime.TERMS, model.features([1], [0], 1)))
    assert one["expert_elements"] == pytest.approx(8e9 * 2 / 8 / 1000e9)
    data = steptime.coefficients("gpu").to_dict()
    data["terms"].pop("expert_elements", None)
    without = steptime.read_coefficients(json.dumps(data), "fit.json")  # a profile may leave it out: it costs 0
    data["terms"]["expert_elements"] = {"value": 0.5, "source": "test"}
    priced = steptime.read_coefficients(json.dumps(data), "fit.json")
    extra = StepTime(eight_bit, HARDWARE, priced).seconds([1], [0], 1) - StepTime(eight_bit, HARDWARE, without).seconds(
        [1], [0], 1
    )
    assert extra == pytest.approx(0.5 * one["expert_elements"])


def test_each_moe_layer_costs_a_floor_whatever_the_batch_and_the_term_is_optional():
    model = StepTime(moe(moe_layers=7), HARDWARE, unit_coefficients())
    one = dict(zip(steptime.TERMS, model.features([1], [0], 1)))
    many = dict(zip(steptime.TERMS, model.features([1] * 64, [0] * 64, 64)))
    assert one["moe_layer_s"] == many["moe_layer_s"] == 7.0
    dense_model = StepTime(dense(), HARDWARE, unit_coefficients())
    assert dict(zip(steptime.TERMS, dense_model.features([1], [0], 1)))["moe_layer_s"] == 0.0
    data = steptime.coefficients("gpu").to_dict()
    data["terms"].pop("moe_layer_s", None)
    without = steptime.read_coefficients(json.dumps(data), "fit.json")
    assert StepTime(moe(moe_layers=7), HARDWARE, without).seconds([1], [0], 1) == pytest.approx(
        StepTime(moe(moe_layers=0), HARDWARE, without).seconds([1], [0], 1)
    )


def test_a_gpu_scale_multiplies_every_term_on_that_gpu_alone_and_round_trips():
    base = unit_coefficients()
    scaled = replace(base, gpu_scales={"test": Coefficient(1.25, "fitted on its runs")})
    batch = ([1, 64], [500, 0], 1)
    plain, on_it = StepTime(dense(tp=2), HARDWARE, base), StepTime(dense(tp=2), HARDWARE, scaled)
    assert on_it.features(*batch) == pytest.approx([1.25 * value for value in plain.features(*batch)])
    assert on_it.seconds(*batch) == pytest.approx(1.25 * plain.seconds(*batch))
    elsewhere = StepTime(dense(tp=2), replace(HARDWARE, name="other"), scaled)
    assert elsewhere.seconds(*batch) == pytest.approx(plain.seconds(*batch))
    shown = on_it.to_dict()
    assert shown["formula"].startswith("t_step = 1.25 x (step_s x f_step_s + ")
    assert shown["gpu_scale"] == {"value": 1.25, "source": "fitted on its runs"}
    assert "gpu_scale" not in elsewhere.to_dict() and "gpu_scales" not in base.to_dict()
    assert steptime.read_coefficients(json.dumps(scaled.to_dict()), "fit.json").gpu_scales == scaled.gpu_scales


def test_the_shipped_a100_scale_is_fitted_on_its_public_runs_and_scored_leave_one_out():
    gpu = steptime.coefficients("gpu")
    a100 = gpu.gpu_scales["A100-80GB"]
    assert 1.1 < a100.value < 1.4 and gpu.gpu_scale("H100-80GB") == 1.0 and gpu.gpu_scale("L40S") == 1.0
    assert a100.source.startswith("fitted: bench/fit_gpu_scale.py on inference-sim's A100-80GB runs 36, 38, 40, 41")
    assert "leave-one-out median absolute error e2e_mean " in a100.source


def test_a_gpu_is_unscored_where_no_public_run_on_it_was_fitted_or_held_out():
    gpu = steptime.coefficients("gpu")
    assert gpu.fitted_gpus == ("H100-80GB",)
    assert not any(gpu.unscored(name) for name in ("H100-80GB", "A100-80GB", "L40S"))
    assert gpu.unscored("A100-40GB") and gpu.unscored("L4")
    assert not steptime.coefficients("cpu").unscored("L4")  # fitted on no public run: it claims nothing
    assert steptime.read_coefficients(json.dumps(gpu.to_dict()), "fit.json").fitted_gpus == gpu.fitted_gpus


def test_every_shipped_coefficient_says_where_it_came_from():
    for profile in steptime.profiles():
        coefficients = steptime.coefficients(profile)
        assert coefficients.fitted_on
        assert all(term.source for term in coefficients.terms.values())
        assert coefficients.api_s.source
        assert coefficients.input_s is None or coefficients.input_s.source


def test_the_hand_off_is_optional_and_round_trips():
    cpu = steptime.coefficients("cpu")
    assert cpu.input_seconds > 0  # fitted on the CPU engine (bench/simulate_vs_engine.py --fit)
    read = steptime.read_coefficients(json.dumps(cpu.to_dict()), "fit.json")
    assert read.input_s == cpu.input_s
    gpu = steptime.coefficients("gpu")
    assert gpu.input_s is None and gpu.input_seconds == 0.0 and "input_s" not in gpu.to_dict()


def test_a_profile_file_round_trips_and_a_bad_one_is_one_line():
    shipped = steptime.coefficients("gpu").to_dict()
    read = steptime.read_coefficients(json.dumps(shipped), "fit.json")
    assert read.terms == steptime.coefficients("gpu").terms
    with pytest.raises(StepTimeError, match=r"^--step-time fit.json: not a step-time profile \(missing terms: "):
        steptime.read_coefficients(json.dumps({"terms": {}, "api_s": {"value": 0, "source": "x"}}), "fit.json")
    with pytest.raises(StepTimeError, match=r"^--step-time fit\.json: not a step-time profile"):
        steptime.read_coefficients("[1, 2]", "fit.json")
    with pytest.raises(StepTimeError, match="step-time profile 'tpu'; valid: "):
        steptime.coefficients("tpu")


def test_held_out_runs_apply_by_gpu_or_tensor_parallel_size_and_round_trip():
    gpu = steptime.coefficients("gpu")
    by_gpu = {held.gpu: held for held in gpu.held_out if held.gpu}
    a100 = by_gpu["A100-80GB"]
    assert a100.applies("A100-80GB", 2) and not a100.applies("H100-80GB", 1)
    assert a100.low < 1 < a100.high and "A100-80GB" in gpu.gpu_scales and "bench/simulate_accuracy.py" in a100.source
    assert a100.describe(scaled=True).startswith(
        "the step time on A100-80GB: 4 public vLLM runs, each simulated at the GPU's scale fitted on the others, ran at "
    )
    l40s = by_gpu["L40S"]
    assert "L40S" not in gpu.gpu_scales and l40s.describe().startswith(
        "the step time on L40S: 1 public vLLM run it was not fitted on"
    )
    (tp8,) = [held for held in gpu.held_out if held.tp]
    assert tp8.applies("H100-80GB", 8) and not tp8.applies("H100-80GB", 4) and tp8.high < 1
    assert not any(held.applies("H100-80GB", 1) for held in gpu.held_out)  # what the profile is fitted on
    (many,) = [held for held in gpu.held_out if held.experts_from]  # more routed experts than the fit's models
    assert many.experts_from == 32 and many.applies("H100-80GB", 1, 128) and many.applies("A100-80GB", 8, 32)
    assert not many.applies("H100-80GB", 2, 8) and not many.applies("H100-80GB", 1) and many.low > 1
    assert many.describe().startswith("the step time for models of 32 routed experts or more: 17 public vllm bench")
    assert steptime.read_coefficients(json.dumps(gpu.to_dict()), "fit.json").held_out == gpu.held_out
    (other_machines,) = steptime.coefficients("cpu").held_out  # a CPU step time is its machine's
    assert other_machines.applies("cpu", 1) and other_machines.low < 1 < other_machines.high
    assert other_machines.describe().startswith("the step time on cpu: 2 vLLM CPU engine runs it was not fitted on")


def test_a_step_of_decodes_alone_pads_to_the_decode_graphs_where_they_differ():
    """vLLM 0.34 on data-center Blackwell captures decode graphs by request count and prefill graphs by token count:
    eleven decodes run the decode graph of 12, a chunk of 10 tokens beside one decode the prefill graph of 16."""
    graphs = StepTime(moe(), HARDWARE, unit_coefficients()).with_graphs((1, 2, 4, 8, 16, 24), (1, 2, 4, 6, 8, 10, 12))
    assert graphs.padded(11, decodes_only=True) == 12 and graphs.padded(11) == 16
    routed = dict(zip(steptime.TERMS, graphs.features([1] * 11, [100] * 11, 11)))
    assert routed["experts"] == pytest.approx(8e9 * (1 - (6 / 8) ** 12) / 1000e9)
    mixed = dict(zip(steptime.TERMS, graphs.features([10, 1], [0, 100], 2)))
    assert mixed["experts"] == pytest.approx(8e9 * (1 - (6 / 8) ** 16) / 1000e9)
