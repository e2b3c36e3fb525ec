"""Synthetic workloads: arrivals with vLLM's gamma parametrisation, length specs, the ShareGPT-like pairs' means."""

from __future__ import annotations

import math
import random
import statistics

import pytest

from kvops.errors import UsageError
from kvops.simulate.formats import vllm_valid_sequence
from kvops.simulate.synthetic import (
    Fixed,
    LogNormal,
    Normal,
    ShareGPTLike,
    Uniform,
    arrivals,
    parse_lengths,
    synthetic_trace,
)
from kvops.simulate.trace import TraceRequest


def gaps(times: tuple[float, ...]) -> list[float]:
    return [later - earlier for earlier, later in zip((0.0, *times), times)]


def test_arrivals_are_seeded_sorted_and_end_at_n_over_rate():
    times = arrivals(500, 4.0, seed=7)
    assert times == arrivals(500, 4.0, seed=7)
    assert times != arrivals(500, 4.0, seed=8)
    assert list(times) == sorted(times)
    assert times[0] > 0  # vLLM waits one gap before the first request too
    assert times[-1] == pytest.approx(500 / 4.0)  # vLLM's normalisation of the last arrival


@pytest.mark.parametrize("burstiness", [0.25, 1.0, 4.0])
def test_gap_spread_is_the_gamma_shape(burstiness):
    """Gamma gaps with shape b have a squared coefficient of variation of 1 / b: 1 is Poisson (exponential)."""
    spread = gaps(arrivals(40_000, 10.0, burstiness, seed=1))
    cv2 = statistics.pvariance(spread) / statistics.fmean(spread) ** 2
    assert cv2 == pytest.approx(1 / burstiness, rel=0.06)


@pytest.mark.parametrize("burstiness", [0.5, 1.0, 3.0])
def test_mean_rate_over_many_samples(burstiness):
    """Requests in the first 20 s of 300 seeded runs at 5/s: 100 a run on average, whatever the burstiness."""
    counts = [sum(time < 20 for time in arrivals(200, 5.0, burstiness, seed)) for seed in range(300)]
    assert statistics.fmean(counts) == pytest.approx(100, rel=0.03)


def test_poisson_counts_have_the_variance_of_their_mean():
    times = arrivals(50_000, 20.0, 1.0, seed=3)
    counts = [0] * math.ceil(times[-1])
    for time in times:
        counts[min(int(time), len(counts) - 1)] += 1
    assert statistics.pvariance(counts) / statistics.fmean(counts) == pytest.approx(1.0, abs=0.08)


def test_limits_of_rate_and_burstiness():
    assert arrivals(3, math.inf) == (0.0, 0.0, 0.0)
    assert arrivals(4, 2.0, math.inf) == pytest.approx((0.5, 1.0, 1.5, 2.0))
    assert arrivals(0, 2.0) == ()
    with pytest.raises(UsageError, match=r"^rate 0: expected requests a second above 0 \(inf: all at once\)$"):
        arrivals(3, 0)
    with pytest.raises(UsageError, match=r"^burstiness -1: expected a number above 0"):
        arrivals(3, 1.0, -1)


def draws(spec: str, count: int = 20_000) -> list[int]:
    sampler = parse_lengths(spec)
    assert not isinstance(sampler, ShareGPTLike)
    rng = random.Random(11)
    return [sampler.draw(rng) for _ in range(count)]


def test_length_specs():
    assert parse_lengths("fixed:512") == Fixed(512)
    assert parse_lengths(" uniform:100-900 ") == Uniform(100, 900)
    assert parse_lengths("normal:mean=500,std=100") == Normal(500.0, 100.0)
    assert parse_lengths("lognormal:mean=300,sigma=0.8") == LogNormal(300.0, 0.8)
    assert parse_lengths("sharegpt") == ShareGPTLike()
    assert set(draws("fixed:512", 10)) == {512}
    uniform = draws("uniform:100-900")
    assert (min(uniform), max(uniform)) == (100, 900)
    assert statistics.fmean(uniform) == pytest.approx(500, rel=0.02)
    assert statistics.fmean(draws("normal:mean=500,std=100")) == pytest.approx(500, rel=0.01)
    assert min(draws("normal:mean=5,std=50")) == 1


def test_lognormal_mean_is_the_arithmetic_mean_of_the_tokens():
    values = draws("lognormal:mean=300,sigma=0.8", 50_000)
    assert statistics.fmean(values) == pytest.approx(300, rel=0.03)
    assert statistics.median(values) == pytest.approx(300 * math.exp(-(0.8**2) / 2), rel=0.03)


@pytest.mark.parametrize(
    "spec, problem",
    [
        ("fixed:0", '"0" is not a positive number of tokens'),
        ("uniform:900-100", "LOW is above HIGH"),
        ("uniform:100", "expected LOW-HIGH"),
        ("normal:mean=500", "expected mean=... and std=..."),
        ("normal:mean=500,std=x", '"std=x" is not NAME=NUMBER'),
        ("lognormal:mean=0,sigma=1", "mean must be above 0 and sigma at least 0"),
        ("zipf:1.1", 'unknown kind "zipf"'),
        ("sharegpt:v3", "sharegpt takes no arguments"),
    ],
)
def test_bad_specs_are_one_line_naming_the_value_and_the_forms(spec, problem):
    with pytest.raises(UsageError) as caught:
        parse_lengths(spec, "--prompt-tokens")
    assert str(caught.value) == (
        f'--prompt-tokens "{spec}": {problem}; valid forms: fixed:N, uniform:LOW-HIGH, normal:mean=M,std=S,'
        " lognormal:mean=M,sigma=S (M: mean tokens) or sharegpt"
    )


def test_sharegpt_like_pairs_have_the_published_means_inside_vllms_filter():
    """Means 220 prompt and 189 output tokens (the synthetic module's docstring has the sources)."""
    sampler = ShareGPTLike()
    rng = random.Random(5)
    pairs = [sampler.draw_pair(rng) for _ in range(40_000)]
    assert all(vllm_valid_sequence(prompt, output) for prompt, output in pairs)
    assert statistics.fmean(prompt for prompt, _ in pairs) == pytest.approx(220, rel=0.03)
    assert statistics.fmean(output for _, output in pairs) == pytest.approx(189, rel=0.03)


def test_synthetic_trace():
    trace = synthetic_trace(200, 8.0, 0.5, seed=2)
    assert trace == synthetic_trace(200, 8.0, 0.5, seed=2)
    assert trace.timed and len(trace) == 200
    assert trace.source == (
        "synthetic (200 requests, gamma arrivals at 8/s, burstiness 0.5, prompt sharegpt, output sharegpt, seed 2)"
    )
    assert all(request.max_tokens == request.output_tokens for request in trace.requests)
    assert trace.requests[-1].arrival_s == pytest.approx(25.0)
    faster = synthetic_trace(200, 80.0, 0.5, seed=2)
    assert [r.prompt_tokens for r in faster.requests] == [r.prompt_tokens for r in trace.requests]


def test_max_tokens_modes_and_untimed():
    omitted = synthetic_trace(50, None, prompt="fixed:100", output="uniform:1-40", max_tokens_mode="none")
    assert not omitted.timed
    assert {request.arrival_s for request in omitted.requests} == {0.0}
    assert {request.max_tokens for request in omitted.requests} == {None}
    capped = synthetic_trace(50, None, prompt="fixed:100", output="uniform:1-40", max_tokens_mode="cap:20")
    assert {request.max_tokens for request in capped.requests} == {20}
    assert max(request.output_tokens for request in capped.requests) == 20
    one_side = synthetic_trace(3, 1.0, prompt="fixed:7", output="sharegpt")
    assert all(isinstance(request, TraceRequest) and request.prompt_tokens == 7 for request in one_side.requests)
    with pytest.raises(UsageError, match=r'^max_tokens mode "cap:0": expected exact'):
        synthetic_trace(3, 1.0, max_tokens_mode="cap:0")
    with pytest.raises(UsageError, match=r'^output lengths "fixed:-1"'):
        synthetic_trace(3, 1.0, output="fixed:-1")
