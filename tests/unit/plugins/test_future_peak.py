"""Guard v2's arithmetic: the future peak of a batch against a step-by-step simulation, per KV-cache group kind;
the admission prefix; output lengths learned from the past (Kaplan-Meier)."""

from __future__ import annotations

import itertools
import math
import random

import pytest

pytest.importorskip(
    "numpy", reason="numpy is not installed: the KV guard's admission needs it (pip install -e '.[test]')"
)
from kvops_vllm.admission import (
    Course,
    GroupShape,
    OutputLengths,
    Survival,
    blocks_at,
    expected_usage,
    fitting_prefix,
    future_grid,
    future_peak,
    risk_peak,
    risk_prefix,
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
            if step <= course.last_shared_step + delay:
                used -= course.shared
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


@pytest.mark.parametrize("seed", range(20))
def test_blocks_a_course_shares_are_left_out_for_its_whole_course(seed):
    """Prefix caching: a prompt prefix held by several requests is one set of blocks; each sharer but the one
    that counts it carries `shared`, left out up to its holder's last step (the brute force subtracts it step by
    step)."""
    rng = random.Random(f"shared-{seed}")
    courses = [
        Course(
            c.held,
            c.end,
            c.linger,
            c.prefilling,
            shared=rng.randint(0, whole_blocks(c.held, 16)),
            shared_until=rng.choice([None, rng.randint(0, 50)]),
        )
        for c in random_batch(rng, rng.choice([2, 5, 17, 60]))
    ]
    delay = rng.choice([0, 1, 3])
    assert future_peak(courses, FULL, delay) == simulated_peak(courses, FULL, delay)
    unshared = [Course(c.held, c.end, c.linger, c.prefilling) for c in courses]
    assert future_peak(courses, FULL, delay) <= future_peak(unshared, FULL, delay)
    assert risk_peak(courses, FULL, None, 1.0) <= risk_peak(unshared, FULL, None, 1.0)


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
    lengths = OutputLengths(quantile=0.95, min_ends=5)
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
    # past everything seen: the tail, fitted to the longer half (52..100 end 49 times in 1 + ... + 49 = 1225 tokens
    # past the median, 51): 100 + ln(10) / 0.04 tokens
    assert lengths.projected_end(100) == 158


def test_a_request_cut_by_its_limit_only_says_it_was_longer():
    """Kaplan-Meier: censored at its max_tokens, a request leaves the curve without counting as an end."""
    lengths = OutputLengths(quantile=0.5, min_ends=1)
    for _ in range(5):
        lengths.record(10, ended=True)
    for _ in range(5):
        lengths.record(20, ended=False)  # hit max_tokens 20: natural length unknown, > 20
    assert lengths.projected_end(0) == 10  # S(10) = 0.5
    assert lengths.projected_end(10) is None  # beyond 10, only censored requests: the curve never falls, no tail
    naive = OutputLengths(quantile=0.75, min_ends=1)
    for length in [10] * 5 + [20] * 5:
        naive.record(length, ended=True)
    assert naive.projected_end(0) == 20


def test_the_tail_hazard_of_memoryless_lengths_is_their_rate():
    rng = random.Random(3)
    lengths = OutputLengths(capacity=4000, quantile=0.8, min_ends=1)
    for _ in range(4000):
        lengths.record(1 + int(rng.expovariate(1 / 170)), ended=True)
    survival = lengths.survival()
    assert survival is not None and survival.hazard == pytest.approx(1 / 170, rel=0.1)
    # a request past every length seen: the p80 of what remains, memoryless, about 170 x ln 5 = 274 tokens more
    assert lengths.projected_end(survival.observed + 100) - (survival.observed + 100) == pytest.approx(274, rel=0.1)


def test_requests_cut_by_their_limit_leave_the_tail_beyond_them():
    """The past's clients sent max_tokens 150 and a tenth of them were cut there: a request sent without one,
    past 150, is projected by the tail (a rate fitted to the ends and the cuts), not at the whole context."""
    rng = random.Random(5)
    lengths = OutputLengths(quantile=0.8, min_ends=1)
    for _ in range(1000):
        natural = 1 + int(rng.expovariate(1 / 65))
        lengths.record(min(natural, 150), ended=natural < 150)
    survival = lengths.survival()
    assert survival is not None and survival.observed == 150 and float(survival.at(150)) > 0.05
    assert survival.hazard == pytest.approx(1 / 65, rel=0.15)
    assert lengths.projected_end(200) - 200 == pytest.approx(65 * math.log(5), rel=0.15)


def test_requests_under_way_count_as_cut_while_the_window_forgets_none():
    """A fresh engine's first ends are its shortest requests: the ones still running say the rest are longer."""
    running = [300] * 20
    with_running = OutputLengths(capacity=100, quantile=0.8, min_ends=1, in_flight=lambda: running)
    alone = OutputLengths(capacity=100, quantile=0.8, min_ends=1)
    for lengths in (with_running, alone):
        for length in range(1, 11):
            lengths.record(length, ended=True)
    assert alone.projected_end(0) == 8
    # 20 of the 30 started ran past 300, and nothing is known past it: no projection short of max_tokens
    assert with_running.projected_end(0) is None
    for _ in range(90):  # the window is full: running requests are the long ones of a past it forgot
        with_running.record(5, ended=True)
    assert with_running.projected_end(0) == 5


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


# --- lengths unknown: the batch by risk ---------------------------------------------------------------------


def curve_of(samples: list[int]) -> Survival:
    lengths = OutputLengths(capacity=len(samples), min_ends=1)
    for length in samples:
        lengths.record(length, ended=True)
    survival = lengths.survival()
    assert survival is not None
    return survival


def enumerated_usage(courses, shapes, samples, step, delay=0):
    """Brute force at one future step: each course's blocks there and the chance it still runs, counted from the
    raw samples (with no request cut short, Kaplan-Meier is the share of samples longer than t)."""
    mean = variance = 0.0
    for course in courses:
        if step > max(course.end - course.held, 0) + course.linger + delay:
            continue
        tokens = min(course.held + step, course.end)
        blocks = 0
        for shape in shapes:
            cap = shape.cap(course.prefilling)
            grown = math.ceil(tokens / shape.block_size)
            blocks += grown if cap is None else min(grown, cap)
        chance = 1.0
        if course.generated is not None:
            floor = course.at_least - 1
            base = max(course.generated, floor)
            later = max(course.generated + max(step - delay - course.linger, 0), floor)
            alive = sum(1 for length in samples if length > base)
            # past every length seen: the tail's rate from `base` on
            tail = math.exp(-tail_rate(samples) * (later - base))
            chance = sum(1 for length in samples if length > later) / alive if alive else tail
        mean += blocks * chance
        variance += blocks * blocks * chance * (1 - chance)
    return mean, variance


def tail_rate(samples: list[int]) -> float:
    """Ends per token past the median among the samples longer than it (every sample an end)."""
    median = sorted(samples)[len(samples) // 2]
    longer = [length - median for length in samples if length > median]
    return len(longer) / sum(longer) if longer else 0.0


def random_unknown_batch(rng: random.Random, size: int, longest: int = 700) -> list[Course]:
    courses = []
    for course in random_batch(rng, size, longest):
        if rng.random() < 0.7:
            generated = rng.randint(0, 300)
            at_least = rng.choice([0, 0, 0, rng.randint(1, 400)])
            course = Course(course.held, course.end, course.linger, course.prefilling, generated, at_least)
        courses.append(course)
    return courses


@pytest.mark.parametrize(("kind", "shapes"), [("full", FULL), ("sliding", SLIDING), ("hybrid", HYBRID), ("odd", ODD)])
@pytest.mark.parametrize("seed", range(25))
def test_the_expected_usage_bounds_an_enumeration_at_every_future_step(kind, shapes, seed):
    """Exact over the first 16 steps (one point each), and above the enumeration at every step after: each point
    bounds its interval by the blocks at the interval's end and the chance to run at its start."""
    rng = random.Random(f"risk-{kind}-{seed}")
    samples = [rng.choice([rng.randint(1, 60), rng.randint(1, 800)]) for _ in range(rng.choice([5, 40, 300]))]
    courses = random_unknown_batch(rng, rng.choice([1, 3, 12, 40]))
    delay = rng.choice([0, 0, 2])
    grid, mean, variance = expected_usage(courses, shapes, curve_of(samples), delay)
    for index, start in enumerate(grid):
        stop = grid[index + 1] if index + 1 < len(grid) else start + 1
        for step in range(start, stop):
            exact_mean, exact_variance = enumerated_usage(courses, shapes, samples, step, delay)
            if stop == start + 1:
                assert mean[index] == pytest.approx(exact_mean) and variance[index] == pytest.approx(exact_variance)
            else:
                assert mean[index] >= exact_mean - 1e-9


@pytest.mark.parametrize("seed", range(20))
def test_with_every_length_known_the_risk_is_the_exact_future_peak_near_and_above_it_later(seed):
    rng = random.Random(f"known-{seed}")
    courses = random_batch(rng, rng.choice([1, 5, 17]), longest=rng.choice([12, 700]))
    peak = future_peak(courses, HYBRID)
    assert risk_peak(courses, HYBRID, None, margin=1.645) >= peak
    if max(course.last_step for course in courses) < 16:  # every step a point of its own: exact
        assert risk_peak(courses, HYBRID, None, margin=1.645) == peak


def test_the_future_grid_is_fine_now_and_coarser_later():
    assert list(future_grid(5)) == [0, 1, 2, 3, 4, 5]
    grid = list(future_grid(1000))
    assert grid[:17] == list(range(17)) and grid[-1] == 1000 and len(grid) < 60
    assert all(later <= 1.13 * earlier + 1 for earlier, later in itertools.pairwise(grid[16:]))


@pytest.mark.parametrize("seed", range(10))
def test_the_risk_prefix_is_the_longest_that_fits_and_admitting_more_never_helps(seed):
    rng = random.Random(f"prefix-{seed}")
    samples = [rng.randint(1, 400) for _ in range(100)]
    survival = curve_of(samples)
    running, waiting = random_unknown_batch(rng, 15, 300), random_unknown_batch(rng, 15, 300)
    peaks = [risk_peak(running + waiting[:count], FULL, survival, 1.645) for count in range(len(waiting) + 1)]
    assert peaks == sorted(peaks)
    for capacity in (peaks[0] - 1, peaks[3], peaks[7] + 0.5, peaks[-1] + 1):
        admitted = risk_prefix(running, waiting, FULL, capacity, survival, 1.645)
        assert admitted == sum(1 for peak in peaks[1:] if peak <= capacity + 1e-9)


def test_a_request_that_outlived_every_length_seen_goes_on_by_the_tail():
    survival = curve_of([10, 20, 30])  # past the median, 20: one end in 10 tokens
    course = Course(held=100, end=1024, generated=40)  # 40 > 30, the longest seen; the whole context to go
    grid, mean, _ = expected_usage([course], FULL, survival)
    chance = [math.exp(-0.1 * step) for step in grid]
    blocks = [whole_blocks(min(100 + int(step), 1024), 16) for step in [*grid[1:] - 1, grid[-1]]]
    assert list(mean) == pytest.approx([held * alive for held, alive in zip(blocks, chance)])


def test_with_no_tail_known_a_request_that_outlived_every_length_seen_runs_to_its_max_tokens():
    lengths = OutputLengths(min_ends=1)
    for length, ended in ((10, True), (20, True), (30, False), (30, False)):  # past the median, only cuts
        lengths.record(length, ended)
    course = Course(held=100, end=164, generated=40)
    _, mean, variance = expected_usage([course], FULL, lengths.survival())
    _, known, _ = expected_usage([Course(held=100, end=164)], FULL, None)  # as if its length were its max_tokens
    assert list(mean) == list(known) and not variance.any()


def test_min_tokens_keep_a_request_running_until_it_has_them():
    past = [1] * 50 + [10] * 49 + [500]  # half stop after 1 token, nearly all the others after 10
    survival = curve_of(past)
    free = Course(held=20, end=600, generated=0)
    held = Course(held=20, end=600, generated=0, at_least=8)
    _, mean, _ = expected_usage([free], FULL, survival)
    assert list(mean[:11]) == [2.0] + [1.0] * 9 + [pytest.approx(0.02)]  # 20 + 10 tokens: 2 blocks of 16
    _, mean, _ = expected_usage([held], FULL, survival)
    assert list(mean[:11]) == [2.0] * 10 + [pytest.approx(0.04)]  # certain to pass its 8 tokens: only 10 or 500
    assert enumerated_usage([held], FULL, past, 10)[0] == pytest.approx(0.04)


def test_the_normal_approximation_keeps_a_large_batch_within_its_risk():
    """200 requests whose lengths are drawn from the same past: at the p95 margin, their simulated usage exceeds
    expected + 1.645 sd at a given step in about 5% of the draws (seeded)."""
    rng = random.Random(7)
    past = [int(rng.expovariate(1 / 170)) + 1 for _ in range(1000)]
    survival = curve_of(past)
    courses = [Course(held=rng.randint(16, 128), end=1024, generated=0) for _ in range(200)]
    grid, mean, variance = expected_usage(courses, FULL, survival)
    step = int(grid[20])
    index = list(grid).index(step)
    limit = mean[index] + 1.645 * math.sqrt(variance[index])
    over = 0
    for _ in range(400):
        used = 0
        for course in courses:
            length = rng.choice(past)
            if length > step:
                used += whole_blocks(min(course.held + step, course.end), 16)
        over += used > limit
    assert over / 400 < 0.09
