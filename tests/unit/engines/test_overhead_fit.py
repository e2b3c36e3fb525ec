"""The overheads kvops plans with: fitted on the corpus of public startup logs, each release family from its own logs
(below three, the family it falls back to, else the pooled fit), the sampler's bytes per logit from the logs whose
profile peaked in the sampler, a margin from leave-one-out residuals; the shipped fit is the corpus fit."""

from __future__ import annotations

from dataclasses import replace

import pytest

from kvops.engines.overhead_fit import _median, fit_overheads
from kvops.overheads import POOLED, Observation, shipped_fit
from kvops.units import GiB
from tests.support.corpus import fit_corpus, observations

MiB = 1 << 20
FAMILIES = ("V0", "V1 < 0.11.1", "V1 0.11.1-0.20", "V1 >= 0.21")
FALLBACKS = {"V1 >= 0.21": "V1 0.11.1-0.20"}


def logged(
    source: str, family: str, model: int, activation: int, non_torch: int, tp: int = 1, logits: int = 0
) -> Observation:
    return Observation(source, family, tp, model, logits, activation=activation, non_torch=non_torch)


def test_each_family_takes_the_median_excess_over_kvops_model():
    items = [logged(f"v0-{i}", "V0", GiB, GiB + extra * MiB, 100 * MiB) for i, extra in enumerate((100, 200, 900))]
    fit = fit_overheads("vllm", items, FAMILIES)
    v0 = fit.family("V0")
    assert v0.activation_excess == 200 * MiB and v0.activation(GiB) == GiB + 200 * MiB  # the median, not the mean
    assert v0.non_torch == (100 * MiB, 100 * MiB) and v0.logs == 3


def test_a_fit_on_fewer_than_three_logs_takes_the_largest_excess_never_below_zero():
    """One or two logs say nothing of where the next launch lands among them: err toward less KV."""
    two = [logged("a", "V0", GiB, GiB - 300 * MiB, 0), logged("b", "V0", GiB, GiB + 150 * MiB, 0)]
    assert fit_overheads("vllm", two, FAMILIES).families[POOLED].activation_excess == 150 * MiB  # not the median
    below = [logged("a", "V0", GiB, GiB - 300 * MiB, 0)]
    assert fit_overheads("vllm", below, FAMILIES).families[POOLED].activation_excess == 0  # not credited back
    three = [*two, logged("c", "V0", GiB, GiB + 900 * MiB, 0)]
    assert fit_overheads("vllm", three, FAMILIES).families[POOLED].activation_excess == 150 * MiB  # the median


def test_an_engine_s_non_torch_prior_stands_where_no_log_of_that_tp_measures_it():
    items = [Observation("t", "V0", 2, GiB, overhead=3 * GiB)]  # a tp 2 log that measures only the sum
    fit = fit_overheads("tgi", items, FAMILIES, non_torch_prior=(2 * GiB, GiB)).families[POOLED]
    assert fit.non_torch == (2 * GiB, GiB) and fit.activation_excess == GiB
    assert fit_overheads("tgi", items, FAMILIES).families[POOLED].non_torch == (512 * MiB, GiB)  # kvops' V0 priors


def test_a_family_with_fewer_than_three_logs_plans_with_the_pooled_fit():
    items = [logged(f"v0-{i}", "V0", GiB, GiB + 100 * MiB, 50 * MiB) for i in range(3)]
    items.append(logged("v1-0", "V1 < 0.11.1", GiB, GiB + 900 * MiB, 10 * MiB))
    fit = fit_overheads("vllm", items, FAMILIES)
    assert "V1 < 0.11.1" not in fit.families and fit.family("V1 < 0.11.1") is fit.families[POOLED]
    assert fit.family("V1 >= 0.21").family == POOLED


def test_a_family_with_fewer_than_three_logs_plans_with_the_family_it_falls_back_to():
    items = [logged(f"v1-{i}", "V1 0.11.1-0.20", GiB, GiB + 100 * MiB, 50 * MiB) for i in range(3)]
    items.append(logged("v0-0", "V0", GiB, GiB + 900 * MiB, 10 * MiB))
    fit = fit_overheads("vllm", items, FAMILIES, FALLBACKS)
    assert fit.family("V1 >= 0.21") is fit.families["V1 0.11.1-0.20"]
    assert fit.family("V0") is fit.families[POOLED]  # no fallback named: the pooled fit


def test_the_sampler_bytes_per_logit_come_from_logs_that_peaked_in_the_sampler():
    logits = 1024 * 128256
    sampler = [  # the forward pass (200 MiB) is far below the peak: the sampler's logits set it
        logged(f"s-{i}", "V1 0.11.1-0.20", 200 * MiB, round(logits * per_logit), 0, logits=logits)
        for i, per_logit in enumerate((15.0, 15.5, 16.0))
    ]
    forward = logged("f", "V1 0.11.1-0.20", 3 * GiB, 3 * GiB + 10 * MiB, 0, logits=logits)  # the forward pass peaked
    fit = fit_overheads("vllm", [*sampler, forward], FAMILIES).family("V1 0.11.1-0.20")
    assert fit.sampler_bytes_per_logit == pytest.approx(15.5, abs=1e-6)  # the median, of the sampler logs only
    assert fit.activation(200 * MiB, logits) == fit.sampler(logits) + fit.activation_excess
    assert fit.activation(4 * GiB, logits) == 4 * GiB + fit.activation_excess  # a longer forward pass wins


def test_margin_is_the_90th_percentile_of_leave_one_out_residuals_and_the_band_their_spread():
    extras = (0, 100, 200, 300, 400, 500, 600, 700, 800, 3000)
    items = [logged(f"v0-{i}", "V0", GiB, GiB + extra * MiB, 0) for i, extra in enumerate(extras)]
    fit = fit_overheads("vllm", items, FAMILIES).family("V0")
    assert fit.bounded and fit.residuals == 10
    # each residual is the log's own excess less the median of the other nine
    residuals = sorted(extra * MiB - _median([other * MiB for other in extras if other != extra]) for extra in extras)
    assert fit.margin == residuals[8]  # nearest rank: 9 of 10 at or below
    assert fit.spread == (residuals[-1] - residuals[8], residuals[8] - residuals[0])


def test_too_few_logs_bound_nothing():
    items = [logged(f"v0-{i}", "V0", GiB, GiB, 0) for i in range(3)]
    fit = fit_overheads("vllm", items, FAMILIES).family("V0")
    assert not fit.bounded and fit.residuals == 3


def test_an_overhead_the_budget_cannot_leave_is_excluded_and_listed():
    odd = Observation("odd", "V0", 1, GiB, overhead=40 * GiB, budget=60 * GiB)
    also = Observation("odd-terms", "V0", 1, GiB, activation=30 * GiB, non_torch=GiB, budget=60 * GiB)
    assert also.implausible and "does not match the log" in also.implausible  # itemised terms are checked too
    fit = fit_overheads("vllm", [odd, logged("ok", "V0", GiB, GiB, 0)], FAMILIES)
    assert fit.sources == ("ok",) and fit.excluded[0][0] == "odd" and "does not match the log" in fit.excluded[0][1]


def test_leave_one_out_never_fits_a_log_on_itself():
    found = observations()
    for source in found:
        engine = "tgi" if source.startswith("tgi-") else "vllm"
        held_out = fit_corpus(engine, {key: item for key, item in found.items() if key != source})
        assert source not in held_out.sources


def test_the_shipped_fit_is_the_corpus_fit():
    found = observations()
    for engine in ("vllm", "tgi"):
        shipped = shipped_fit(engine)
        missing = sorted((set(shipped.sources) | {source for source, _ in shipped.excluded}) - set(found))
        if missing:
            pytest.skip(
                f"the shipped {engine} fit includes logs whose models this catalog cannot plan yet ({', '.join(missing)}): "
                "it was fitted with the models branch's catalog (issue 12); after it merges this test is strict"
            )
        assert fit_corpus(engine, found).to_dict() == shipped.to_dict(), (
            f"kvops/catalog/overheads.json is stale for {engine}: python bench/accuracy.py --refit"
        )


def test_a_release_that_takes_the_graph_estimate_borrows_logs_that_print_it():
    """0.21+ takes the CUDA-graph estimate from the KV budget; with too few logs of its own it plans with 0.11.1-0.20
    logs that print the estimate, as if applied: the graphs term is their median, and their spread is in the margin."""
    items = [
        Observation(f"v19-{i}", "V1 0.11.1-0.20", 1, GiB, activation=GiB, non_torch=0, cuda_graphs=graphs * MiB)
        for i, graphs in enumerate((600, 800, 840, 900, 1900))
    ]
    fit = fit_overheads("vllm", items, FAMILIES, FALLBACKS, ("V1 >= 0.21",))
    newest = fit.family("V1 >= 0.21")
    assert newest.borrowed == "V1 0.11.1-0.20" and newest.logs == 5
    assert newest.cuda_graph_bytes(1) == 840 * MiB  # the median estimate at tp 1
    assert newest.margin > 0 and newest.bounded  # one log's estimate ran 1060 MiB above the median
    assert fit.family("V1 0.11.1-0.20").margin == 0  # its own launches did not take the estimate


def test_the_graph_estimate_is_fitted_at_the_default_capture_sizes():
    """A log that captured fewer sizes (its config line lists 11 where vLLM's default is 51) enters the median at
    what it would have estimated at 51, and its own residual is taken at its 11."""
    share = 11 / 51
    items = [
        Observation(f"v19-{i}", "V1 0.11.1-0.20", 1, GiB, activation=GiB, non_torch=0, cuda_graphs=graphs * MiB)
        for i, graphs in enumerate((600, 800, 900, 1900))
    ] + [
        Observation(
            "few",
            "V1 0.11.1-0.20",
            1,
            GiB,
            activation=GiB,
            non_torch=0,
            cuda_graphs=round(850 * MiB * share),
            graph_share=share,
        )
    ]
    newest = fit_overheads("vllm", items, FAMILIES, FALLBACKS, ("V1 >= 0.21",)).family("V1 >= 0.21")
    assert abs(newest.cuda_graph_bytes(1) - 850 * MiB) < 8  # not 600 MiB: 183 MiB at 11 sizes is 850 at 51
    few = replace(items[-1], family="V1 >= 0.21", cuda_graphs_applied=True)
    assert abs(newest.total(few) - few.total) < 8  # planned at its own 11 sizes: no residual from the graphs


def test_a_launch_with_lora_adapters_never_trains_the_fit():
    """Adapters take memory kvops has no input for (slots, the profile's dummy LoRA run): a LoRA launch's overheads
    would pass for the engine's own in every other plan, so they are neither observed nor in the shipped fit."""
    from tests.support.corpus import entries

    lora = {item.id for item in entries() if item.lora}
    assert lora, "the corpus holds LoRA launches (Unsloth notebooks)"
    assert not lora & set(observations())
    assert not lora & set(shipped_fit("vllm").sources)


def test_an_overhead_read_on_an_estimated_device_total_is_no_measurement():
    """A log that prints no total, on a GPU whose total kvops estimates (nvidia-smi's less a driver share), gives no
    overhead to fit: budget - weights - KV would carry the total's error (an RTX PRO 6000 MiniMax launch: 1.4 GiB)."""
    from kvops.engines.vllm.calibrate import observation
    from tests.support.corpus import entry, plan_entry

    item = entry("vllm-0.1x-rtxpro6000x4-minimax-m2.5-fp8-tp4")
    plan = plan_entry(item)
    assert item.log.get("total_memory_bytes") is None and plan.term("total").basis == "input"  # 94.97 GiB, logged
    assert observation(item.log, plan, item.id) is not None
    estimated = tuple(replace(term, basis="estimate") if term.name == "total" else term for term in plan.memory)
    assert observation(item.log, replace(plan, memory=estimated), item.id) is None
    known = entry("vllm-0.19.0-h100-llama-3.1-8b-instruct-tp1-8192-llmd")  # the H100's total is known
    assert observation(known.log, plan_entry(known), known.id) is not None


def test_a_pipeline_parallel_log_gives_no_stage_terms_to_fit():
    """A pipeline-parallel log quotes the first worker's memory lines: one stage's layers and no logits, where kvops
    models the stage that binds the pool. At most its CUDA-graph estimate is an observation (none on 0.19, which
    does not take it before KV); the plan still matches the engine's pool (the smallest stage's KV tokens)."""
    from kvops.engines.vllm.calibrate import observation
    from tests.support.corpus import entry, plan_entry

    item = entry("vllm-0.19.0-h100-llama-3.1-8b-instruct-tp1pp2-8192-llmd")
    plan = plan_entry(item)
    assert plan.inputs.pp == 2
    assert observation(item.log, plan, item.id) is None
    tokens = plan.capacity.to_dict()["kv_tokens"]
    assert abs(tokens - item.log.kv_cache_size_tokens) / item.log.kv_cache_size_tokens < 0.01
