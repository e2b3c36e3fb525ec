"""Guard v2's arithmetic: the future peak of a batch against a step-by-step simulation, per KV-cache group kind;
the admission prefix; output lengths learned from the past (Kaplan-Meier)."""

from __future__ import annotations

import math
import random

import pytest

from kvops_vllm.admission import (
    Course,
    GroupShape,
    OutputLengths,
    blocks_at,
    fitting_prefix,
    future_peak,
    whole_blocks,
    window_blocks,
)


def simulated_peak(courses: list[Course], shapes: list[GroupShape], delay: int = 0) -> int:
    """Brute force: walk every future step, each request growing one token per step from what it holds to its
    end, holding its blocks `linger` + `delay` steps more, then none; sum the blocks of every group; keep the
    largest."""
    peak = 0
    for step in range(max(course.last_step for course in courses) + delay + 1):
        used = 0
        for course in courses:
            if step > max(course.end - course.held, 0) + course.linger + delay:
                continue
            tokens = min(course.held + step, course.end)
            for shape in shapes:
                blocks = math.ceil(tokens / shape.block_size)
                cap = shape.max_blocks if course.prefilling or shape.decode_blocks is None else shape.decode_blocks
                used += blocks if cap is None else min(blocks, cap)
        peak = max(peak, used)
    return peak


def random_batch(rng: random.Random, size: int, longest: int = 700) -> list[Course]:
    courses = []
    for _ in range(size):
        held = rng.randint(1, longest)
        end = held + rng.choice([0, rng.randint(0, 40), rng.randint(0, longest)])
        courses.append(Course(held, end, linger=rng.choice([0, 0, 1, 2, 5]), prefilling=rng.random() < 0.2))
    return courses


FULL = [GroupShape(16)]
SLIDING = [GroupShape(16, max_blocks=window_blocks(128, 16, 96), window=128, decode_blocks=whole_blocks(128, 16) + 1)]
HYBRID = [GroupShape(16), *SLIDING]  # one full and one sliding group sharing the pool, as Gemma-2 has
ODD = [GroupShape(7), GroupShape(128, max_blocks=3, window=200, decode_blocks=2)]  # block sizes that do not divide


@pytest.mark.parametrize(("kind", "shapes"), [("full", FULL), ("sliding", SLIDING), ("hybrid", HYBRID), ("odd", ODD)])
@pytest.mark.parametrize("seed", range(40))
def test_the_future_peak_equals_a_step_by_step_simulation(kind, shapes, seed):
    rng = random.Random(f"{kind}-{seed}")
    courses = random_batch(rng, rng.choice([1, 2, 5, 17, 60]))
    delay = rng.choice([0, 0, 1, 3])
    assert future_peak(courses, shapes, delay) == simulated_peak(courses, shapes, delay)


def test_requests_that_finish_at_different_times_peak_far_below_the_sum_of_their_peaks():
    # 8 requests ending at 144 tokens (9 blocks of 16 each), one block apart: what v1 reserves is the sum, 72
    courses = [Course(held=16 + 16 * i, end=144) for i in range(8)]
    assert sum(whole_blocks(course.end, 16) for course in courses) == 72
    # the batch peaks when the furthest ends (step 16): then request i holds 2 + i blocks
    assert future_peak(courses, FULL) == simulated_peak(courses, FULL) == sum(2 + i for i in range(8)) == 44


def test_a_request_holds_its_blocks_while_it_lingers_then_frees_them_all():
    course = Course(held=30, end=40, linger=2)
    assert [blocks_at(course, GroupShape(16), step) for step in range(14)] == [2] * 3 + [3] * 10 + [0]


def test_a_sliding_window_caps_a_decoding_request_lower_than_one_in_its_prefill():
    (shape,) = SLIDING
    long = Course(held=600, end=900)
    assert blocks_at(long, shape, 0) == shape.decode_blocks == 9  # window 128 in 16-token blocks, + 1
    assert blocks_at(Course(600, 900, prefilling=True), shape, 0) == shape.max_blocks == 15  # + the chunk in flight
    assert blocks_at(Course(held=40, end=90), shape, 0) == 3  # still inside the window


def test_no_courses_no_peak():
    assert future_peak([], FULL) == 0


def test_the_fitting_prefix_is_the_longest_that_fits():
    calls = []

    def fits(count):
        calls.append(count)
        return count <= 37

    assert fitting_prefix(fits, 100) == 37
    assert calls[:7] == [1, 2, 4, 8, 16, 32, 64]  # galloping, then halving between 32 and 63
    assert len(calls) <= 13
    calls.clear()
    assert fitting_prefix(lambda count: calls.append(count) or count < 1, 100) == 0
    assert calls == [1]  # a step that admits nothing costs one evaluation
    assert fitting_prefix(lambda count: count == 0, 5) == 0
    assert fitting_prefix(lambda count: True, 5) == 5
    assert fitting_prefix(lambda count: True, 0) == 0


@pytest.mark.parametrize("seed", range(10))
def test_admitting_more_never_lowers_the_peak(seed):
    """fitting_prefix needs it: a longer prefix of the queue never fits where a shorter one does not."""
    rng = random.Random(seed)
    running, waiting = random_batch(rng, 20), random_batch(rng, 20)
    peaks = [future_peak(running + waiting[:count], HYBRID) for count in range(len(waiting) + 1)]
    assert peaks == sorted(peaks)


# --- output lengths from the past ---------------------------------------------------------------------------


def test_no_projection_before_enough_requests_ended():
    lengths = OutputLengths(min_ends=5)
    for length in (10, 20, 30, 40):
        lengths.record(length, ended=True)
    assert lengths.projected_end(0) is None
    lengths.record(50, ended=True)
    assert lengths.projected_end(0) == 50


def test_the_projection_is_a_quantile_of_what_remains_given_what_was_generated():
    lengths = OutputLengths(quantile=0.9, min_ends=1)
    for length in range(1, 101):  # 1..100 tokens, each once
        lengths.record(length, ended=True)
    assert lengths.projected_end(0) == 90  # P(L <= 90) = 0.9
    assert lengths.projected_end(50) == 95  # of the 50 longer than 50, 45 end by 95
    assert lengths.projected_end(99) == 100
    assert lengths.projected_end(100) is None  # past everything seen: no projection


def test_a_request_cut_by_its_limit_only_says_it_was_longer():
    """Kaplan-Meier: censored at its max_tokens, a request leaves the curve without counting as an end."""
    lengths = OutputLengths(quantile=0.5, min_ends=1)
    for _ in range(5):
        lengths.record(10, ended=True)
    for _ in range(5):
        lengths.record(20, ended=False)  # hit max_tokens 20: natural length unknown, > 20
    assert lengths.projected_end(0) == 10  # S(10) = 0.5
    assert lengths.projected_end(10) is None  # beyond 10, only censored requests: the curve never falls
    naive = OutputLengths(quantile=0.75, min_ends=1)
    for length in [10] * 5 + [20] * 5:
        naive.record(length, ended=True)
    assert naive.projected_end(0) == 20


def test_the_window_forgets_the_oldest_requests():
    lengths = OutputLengths(capacity=50, quantile=0.5, min_ends=1)
    for _ in range(50):
        lengths.record(500, ended=True)
    assert lengths.projected_end(0) == 500
    for _ in range(50):
        lengths.record(5, ended=True)
    assert lengths.projected_end(0) == 5


@pytest.mark.parametrize("seed", range(5))
def test_the_projection_matches_the_empirical_quantile_without_censoring(seed):
    rng = random.Random(seed)
    samples = [rng.randint(1, 900) for _ in range(400)]
    lengths = OutputLengths(capacity=400, quantile=0.95, min_ends=1)
    for length in samples:
        lengths.record(length, ended=True)
    for generated in (0, 100, 500):
        longer = sorted(length for length in samples if length > generated)
        expected = longer[math.ceil(0.95 * len(longer)) - 1]
        assert lengths.projected_end(generated) == expected
