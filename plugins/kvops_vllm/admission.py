"""Admission by projected KV: how many blocks a request will hold at its peak, per KV-cache group.

Pure arithmetic (no vLLM import), so it can be checked against vLLM's own bounds in tests.

A request that may generate `max_tokens` tokens after a `prompt`-token prompt caches at most prompt + max_tokens
tokens. In a paged cache each group holds whole blocks: ceil(tokens / block_size) (kvops.formula.token_slots).
A sliding-window group frees the blocks that fall behind its window, so one request never holds more than the
window less one token, plus the tokens scheduled but not yet processed (their blocks are freed only after the
step settles), plus one block because the window rarely starts on a block boundary; vLLM sizes its pool and its
own admission cap the same way (SlidingWindowSpec.max_admission_blocks_per_request). Once its prompt is computed,
a decoding request has one token in flight, so it holds at most ceil(window / block_size) + 1 blocks
(`GroupShape.decode_blocks`), the figure `kvops plan` counts too.

Guard v2 admits by the future peak of the whole batch (`future_peak`): every request's course through the pool,
one token per step from what it holds now to its projected end (`Course`), then nothing; the batch's peak is
the largest sum over future steps, far below the sum of the requests' own peaks when they finish at different
times. A request whose length is known (ignore_eos, no stop tokens or strings) ends at its max_tokens, and the peak of
such a batch is exact (`future_peak`). A request that may stop at any step ends by the output lengths this engine
produced recently (`OutputLengths`, a Kaplan-Meier survival curve: a request cut by its max_tokens says only that
its natural length was longer), given what it has generated: at every future step it is still running with the
curve's probability (past the longest length seen, by the curve's exponential tail), never past its max_tokens.
Such a batch is admitted by risk (`risk_prefix`): at every future step, the blocks the batch is expected to hold
plus z standard deviations (z for the configured quantile, the requests' ends taken as independent) must fit.
Summing every request's own high quantile instead would count each one at its unlikely longest, all at once: the
batch's total is far more predictable than any one request.
"""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right, insort
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from statistics import NormalDist

import numpy as np

from kvops.formula import token_slots


def whole_blocks(tokens: int, block_size: int) -> int:
    """Blocks that hold `tokens` tokens."""
    return token_slots(tokens, block_size) // block_size


def window_blocks(window: int, block_size: int, in_flight_tokens: int, extra_retained_tokens: int = 0) -> int:
    """The most blocks one request holds in a sliding-window group, however long it grows."""
    return whole_blocks(window - 1 + extra_retained_tokens + in_flight_tokens, block_size) + 1


@dataclass(frozen=True)
class GroupShape:
    """One KV-cache group as admission sees it."""

    block_size: int
    max_blocks: int | None = None  # blocks one request holds at most (groups that free blocks behind a window)
    window: int | None = None  # sliding window in tokens, for the log line
    decode_blocks: int | None = None  # blocks it holds at most once its prompt is computed (one token in flight)

    def blocks(self, tokens: int) -> int:
        """Blocks one request of `tokens` cached tokens holds at its peak."""
        grown = whole_blocks(tokens, self.block_size)
        return grown if self.max_blocks is None else min(grown, self.max_blocks)

    def cap(self, prefilling: bool) -> int | None:
        """The most blocks one request holds in this group, while its prompt is computed or after."""
        if prefilling or self.decode_blocks is None:
            return self.max_blocks
        return self.decode_blocks

    def describe(self) -> str:
        if self.window is not None:
            return (
                f"sliding window {self.window} ({self.block_size}-token blocks, at most {self.max_blocks} per request)"
            )
        if self.max_blocks is not None:
            return f"{self.block_size}-token blocks, at most {self.max_blocks} per request"
        return f"full attention ({self.block_size}-token blocks)"


def projected_blocks(shapes: Sequence[GroupShape], tokens: int) -> int:
    """Blocks a request of `tokens` cached tokens holds at its peak, all groups together (they share one pool)."""
    return sum(shape.blocks(tokens) for shape in shapes)


def live_blocks(blocks: Sequence) -> int:
    """Blocks a request really holds: a sliding-window group swaps the blocks behind its window for vLLM's
    null block, always a prefix of the request's block list, so binary search finds where the live ones start."""
    if not blocks or not blocks[0].is_null:
        return len(blocks)
    return len(blocks) - bisect_left(blocks, True, key=lambda block: not block.is_null)


def admissible_prefix(needs: Iterable[int], slack: int, idle: bool) -> int:
    """How many requests, in queue order, fit in `slack` blocks: first come, first served, so the first one
    that does not fit stops the rest (a large request is not starved by smaller ones behind it). `needs` is
    consumed lazily: nothing past the first request that does not fit is computed.

    `idle`: nothing runs, so nothing will free blocks; the first request is admitted whatever its size (vLLM
    still checks that it fits the pool), or a request larger than the pool minus the headroom would wait forever.
    """
    admitted = 0
    for need in needs:
        if need > slack and not (idle and admitted == 0):
            break
        slack -= need
        admitted += 1
    return admitted


# --- guard v2: the future peak of the whole batch -------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Course:
    """One request's projected course through the pool: it holds `held` tokens once this step is scheduled, grows
    by one token per step up to `end`, keeps its blocks `linger` steps more (outputs still in flight, steps lost
    to prefills), then frees them all."""

    held: int
    end: int
    linger: int = 0
    prefilling: bool = False  # its prompt is still to be computed: a sliding window also holds the chunk in flight
    # None: its length is known, it ends at `end`. Else it may stop at any step: the output tokens it has, and
    # those it generates at least (min_tokens); `end` is then where max_tokens stops it at the latest.
    generated: int | None = None
    at_least: int = 0
    # blocks of its prompt prefix that another request counts (prefix caching: one block, several holders), left
    # out of its own up to future step `shared_until` (None: its whole course), after which it holds them alone
    shared: int = 0
    shared_until: int | None = None

    @property
    def last_shared_step(self) -> int:
        """The last future step at which its shared blocks are left out."""
        last = self.last_step
        return last if self.shared_until is None else min(self.shared_until, last)

    @property
    def last_step(self) -> int:
        """The last future step (0 = this one) at which it still holds blocks."""
        return max(self.end - self.held, 0) + self.linger


def blocks_at(course: Course, shape: GroupShape, step: int) -> int:
    """Blocks `course` holds in `shape`'s group at future `step`: the definition `future_peak` computes fast."""
    if step > course.last_step:
        return 0
    grown = whole_blocks(min(course.held + step, course.end), shape.block_size)
    cap = shape.cap(course.prefilling)
    return grown if cap is None else min(grown, cap)


def future_peak(courses: Sequence[Course], shapes: Sequence[GroupShape], delay: int = 0) -> int:
    """max over future steps k of the blocks all `courses` hold at k, all groups together (they share one pool);
    `delay` more steps of holding for every course (steps they may lose to a prefill taking the token budget).

    Between two steps at which some request frees its blocks, every request only grows, so the maximum is at
    some request's last step: only those are evaluated, each in O(log n) (`_usage_at_last_steps`), so the whole
    is O(n log n) per group instead of n x steps.
    """
    if not courses:
        return 0
    steps = sorted({course.last_step + delay for course in courses}, reverse=True)
    totals = [0] * len(steps)
    for shape in shapes:
        for index, used in enumerate(_usage_at_last_steps(courses, shape, steps, delay)):
            totals[index] += used
    sharing = sorted(
        ((course.last_shared_step + delay, course.shared) for course in courses if course.shared), reverse=True
    )
    if sharing:  # a course's shared blocks are left out up to its last shared step (its holder's last step)
        left_out = entered = 0
        for index, step in enumerate(steps):
            while entered < len(sharing) and sharing[entered][0] >= step:
                left_out += sharing[entered][1]
                entered += 1
            totals[index] -= left_out
    return max(totals)


def _usage_at_last_steps(courses: Sequence[Course], shape: GroupShape, steps: list[int], delay: int) -> list[int]:
    """Blocks in use in one group at each of `steps` (descending), by a sweep from the far future back to now.

    A course holds a plateau (its last block count) from the step it reaches it until its last step, and grows
    before: ceil((held + k) / B) = q + K + [m >= B - j] with held + B - 1 = qB + m and k = KB + j, so the growing
    courses sum to sum(q) + count x K + #(m >= B - j): a sorted list of the m answers the last term.
    """
    size = shape.block_size
    caps = {True: shape.cap(True), False: shape.cap(False)}
    entering: list[tuple[int, int]] = []  # (last step, plateau blocks)
    growing: list[tuple[int, int, int, int]] = []  # (plateau start step, plateau, q, m)
    for course in courses:  # blocks_at and last_step, inlined: this loop runs at every scheduling step
        held, end = course.held, course.end
        top = -(-end // size)
        cap = caps[course.prefilling]
        if cap is not None and cap < top:
            top = cap
        if top == 0:
            continue
        entering.append(((end - held if end > held else 0) + course.linger + delay, top))
        start = (top - 1) * size + 1 - held
        if start > 0:
            q, m = divmod(held + size - 1, size)
            growing.append((start, top, q, m))
    entering.sort(reverse=True)
    growing.sort(reverse=True)
    plateau = growth_q = growth_count = 0
    residues: list[int] = []
    entered = moved = 0
    used = []
    for step in steps:
        while entered < len(entering) and entering[entered][0] >= step:
            plateau += entering[entered][1]
            entered += 1
        while moved < len(growing) and growing[moved][0] > step:
            _, top, q, m = growing[moved]
            plateau -= top
            growth_q += q
            growth_count += 1
            insort(residues, m)
            moved += 1
        whole, part = divmod(step, size)
        crossed = growth_count - bisect_left(residues, size - part)
        used.append(plateau + growth_q + growth_count * whole + crossed)
    return used


# --- guard v2 with lengths unknown: the batch's usage by risk --------------------------------------------------


def risk_margin(quantile: float) -> float:
    """Standard deviations above the expected usage that the batch's usage stays under with `quantile`
    probability at a future step (normal approximation of a sum of many independent requests)."""
    return NormalDist().inv_cdf(quantile)


def future_grid(horizon: int, fine: int = 16, ratio: float = 1.125) -> np.ndarray:
    """Future steps 0..horizon at which a batch is weighed: every step up to `fine`, then each about 1/8 further
    than the last (about 50 points for 1,000 steps), and `horizon`. Each point stands for the steps up to the
    next one (`risk_prefix` bounds the usage over that whole interval)."""
    steps = list(range(min(fine, horizon + 1)))
    step = float(fine)
    while step < horizon:
        steps.append(int(step))
        step *= ratio
    steps.append(horizon)
    return np.unique(np.array(steps, dtype=np.int64))


class Survival:
    """S(t) = P(a request's output length > t): a Kaplan-Meier step curve (`lengths` where it steps, ascending,
    `values` the curve just after each) up to `observed`, the longest length seen (ended or cut), and beyond it an
    exponential tail at `hazard` ends per token (`OutputLengths` fits it to the longer half of the lengths seen;
    0: no tail known, the curve stays flat)."""

    def __init__(self, lengths: Sequence[int], values: Sequence[float], observed: int = 0, hazard: float = 0.0):
        self.lengths = np.asarray(lengths, dtype=np.int64)
        self.values = np.asarray(values, dtype=np.float64)
        self.observed = max(observed, int(self.lengths[-1]) if len(self.lengths) else 0)
        self.hazard = hazard

    def at(self, tokens: np.ndarray) -> np.ndarray:
        index = np.searchsorted(self.lengths, tokens, side="right")
        curve = np.where(index == 0, 1.0, self.values[np.maximum(index - 1, 0)])
        if not self.hazard:
            return curve
        return curve * np.exp(-self.hazard * np.maximum(np.asarray(tokens) - self.observed, 0))

    def chance(self, now: np.ndarray, later: np.ndarray) -> np.ndarray:
        """P(a request still runs at `later` tokens | it ran at `now`). One that outlived every length that ended
        (the curve is 0 at `now`) goes on by the tail alone: memoryless, so its hazard from `now`; with no tail
        known, it runs to its max_tokens (chance 1)."""
        base, ahead = self.at(now), self.at(later)
        tail = np.exp(-self.hazard * np.maximum(later - now, 0))
        return np.where(base > 0, ahead / np.where(base > 0, base, 1.0), tail)


def _rows(courses: Sequence[Course], shapes: Sequence[GroupShape], survival: Survival | None, delay: int, grid):
    """Per course and grid interval [grid[j], grid[j + 1]): the most blocks it may hold in the interval (it
    grows) and the chance it still runs at the interval's start (that chance only falls)."""
    held = np.fromiter((course.held for course in courses), np.int64, len(courses))
    end = np.fromiter((course.end for course in courses), np.int64, len(courses))
    linger = np.fromiter((course.linger for course in courses), np.int64, len(courses))
    prefilling = np.fromiter((course.prefilling for course in courses), bool, len(courses))
    latest = np.append(grid[1:] - 1, grid[-1])  # each interval's last step
    tokens = np.minimum(held[:, None] + latest[None, :], end[:, None])
    blocks = np.zeros(tokens.shape, dtype=np.int64)
    for shape in shapes:
        grown = -(-tokens // shape.block_size)
        caps = (shape.cap(True), shape.cap(False))
        if caps != (None, None):
            unbounded = np.iinfo(np.int64).max
            cap = np.where(prefilling, caps[0] or unbounded, caps[1] or unbounded)
            grown = np.minimum(grown, cap[:, None])
        blocks += grown
    shared = np.fromiter((course.shared for course in courses), np.int64, len(courses))
    if shared.any():  # left out over the intervals that end by its last shared step (while its holder holds them)
        until = np.fromiter((course.last_shared_step for course in courses), np.int64, len(courses)) + delay
        blocks = np.maximum(blocks - shared[:, None] * (latest[None, :] <= until[:, None]), 0)
    last = (end - held) + linger + delay  # the last step it may hold blocks
    alive = (grid[None, :] <= last[:, None]).astype(np.float64)
    unknown = [index for index, course in enumerate(courses) if course.generated is not None]
    if unknown and survival is not None:
        rows = np.array(unknown)
        floor = np.array([courses[index].at_least - 1 for index in unknown])[:, None]
        generated = np.array([courses[index].generated for index in unknown])[:, None]
        shifted = np.maximum(grid[None, :] - delay - linger[rows][:, None], 0)  # steps it may have lost
        alive[rows] *= survival.chance(np.maximum(generated, floor), np.maximum(generated + shifted, floor))
    return blocks, alive


def risk_prefix(
    running: Sequence[Course],
    waiting: Sequence[Course],
    shapes: Sequence[GroupShape],
    capacity: int,
    survival: Survival | None,
    margin: float,
    delay: int = 0,
) -> int:
    """How many of `waiting`, in order, may join `running` while at every future step the batch's expected
    blocks plus `margin` standard deviations fit `capacity`. A course's blocks are bounded over each grid
    interval by its blocks at the interval's end and its chance to run at its start: conservative between the
    points (a course of known length runs with chance 1 up to its end, as in `future_peak`). `delay`: steps of
    holding more for every course, as there."""
    courses = [*running, *waiting]
    if not waiting:
        return 0
    horizon = max(max(course.end - course.held, 0) + course.linger for course in courses) + delay
    grid = future_grid(horizon)
    blocks, alive = _rows(courses, shapes, survival, delay, grid)
    expected = blocks * alive
    spread = blocks * blocks * alive * (1.0 - alive)
    split = len(running)
    mean = expected[:split].sum(axis=0) + np.cumsum(expected[split:], axis=0)
    variance = spread[:split].sum(axis=0) + np.cumsum(spread[split:], axis=0)
    peaks = (mean + margin * np.sqrt(variance)).max(axis=1)
    too_many = np.flatnonzero(peaks > capacity + 1e-9)
    return int(too_many[0]) if too_many.size else len(waiting)


def expected_usage(
    courses: Sequence[Course], shapes: Sequence[GroupShape], survival: Survival | None, delay: int = 0
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(grid, mean, variance): over each interval of the future grid, the blocks the batch is expected to hold
    and their variance, bounded as `risk_prefix` bounds them."""
    grid = future_grid(max(max(course.end - course.held, 0) + course.linger for course in courses) + delay)
    blocks, alive = _rows(courses, shapes, survival, delay, grid)
    return grid, (blocks * alive).sum(axis=0), (blocks * blocks * alive * (1.0 - alive)).sum(axis=0)


def risk_peak(
    courses: Sequence[Course], shapes: Sequence[GroupShape], survival: Survival | None, margin: float
) -> float:
    """The largest, over future steps, of the batch's expected blocks plus `margin` standard deviations."""
    if not courses:
        return 0.0
    _, mean, variance = expected_usage(courses, shapes, survival)
    return float((mean + margin * np.sqrt(variance)).max())


def fitting_prefix(fits: Callable[[int], bool], count: int) -> int:
    """The longest prefix 0..count of a queue for which `fits(n)` holds, `fits` being monotone (a longer prefix
    never fits where a shorter one does not). Galloping from 1 (1, 2, 4, ...) then halving: a step that admits
    nothing, the common case under load, costs one call; one that admits a items, O(log a)."""
    if count == 0 or not fits(1):
        return 0
    low, high, stride = 1, count, 1
    while low < high:
        probe = min(high, low + stride)
        if not fits(probe):
            high = probe - 1
            break
        low, stride = probe, stride * 2
    while low < high:
        middle = (low + high + 1) // 2
        low, high = (middle, high) if fits(middle) else (low, middle - 1)
    return low


class OutputLengths:
    """The output lengths this engine produced recently, and the end they project for a request under way.

    A Kaplan-Meier survival curve over the last `capacity` finished requests: a request that stopped (EOS, a
    stop token or string, a client that went away) is an end at its length; one cut by its max_tokens (or the
    model length) only says that its natural length was longer (censored). The projected end of a request that
    has generated g tokens is the `quantile` of its length given that it passed g: the smallest t > g with
    S(t) <= (1 - quantile) S(g). Beyond the longest length seen the curve knows nothing: there it goes on as an
    exponential tail whose hazard is fitted to the longer half of the lengths (their ends per token past the
    median: the maximum-likelihood rate of a memoryless tail, censoring included), so a request that outlived
    every length seen, or one sent without max_tokens, is projected by the lengths' own tail, not at its
    max_tokens or the whole context. With no end in that half (no tail known), or before `min_ends` ends were
    seen, there is no projection (None: the caller falls back to max_tokens).
    """

    def __init__(
        self,
        capacity: int = 1000,
        quantile: float = 0.8,
        min_ends: int = 32,
        in_flight: Callable[[], Iterable[int]] | None = None,
    ):
        self.quantile = quantile
        self.min_ends = min_ends
        self.in_flight = in_flight  # the tokens each request under way has generated: cut there, for the curve
        self._samples: deque[tuple[int, bool]] = deque(maxlen=capacity)
        self._since_rebuild = 0
        self._built = False
        self._lengths: list[int] = []  # distinct lengths at which some request ended, ascending
        self._survival: list[float] = []  # S(t) at each of them
        self._ends = 0
        self._observed = 0  # the longest length seen, ended or cut: where the curve ends and the tail begins
        self._hazard = 0.0  # the tail's ends per token
        self._curve: Survival | None = None

    def record(self, length: int, ended: bool) -> None:
        """One finished request: `ended` when it stopped by itself, False when its limit cut it."""
        self._samples.append((length, ended))
        self._since_rebuild += 1

    def survival(self) -> Survival | None:
        """The curve, or None before `min_ends` requests ended by themselves."""
        self._refresh()
        if self._ends < self.min_ends:
            return None
        if self._curve is None:
            self._curve = Survival(self._lengths, self._survival, self._observed, self._hazard)
        return self._curve

    def projected_end(self, generated: int) -> int | None:
        """Tokens the request will have generated when it ends, at the quantile, given `generated` so far."""
        self._refresh()
        if self._ends < self.min_ends:
            return None
        lengths, survival = self._lengths, self._survival
        passed = bisect_right(lengths, generated)  # ends at or before `generated`: behind us
        alive = survival[passed - 1] if passed else 1.0
        if alive <= 0.0 or generated >= self._observed:
            return self._on_tail(generated, 1.0)  # past every length seen: the tail alone, memoryless
        target = (1.0 - self.quantile) * alive * (1 + 1e-9)  # products of fractions: spare them rounding
        # survival is non-increasing: the first index at or after `passed` where it is <= target
        low, high = passed, len(survival)
        while low < high:
            middle = (low + high) // 2
            if survival[middle] <= target:
                high = middle
            else:
                low = middle + 1
        if low < len(lengths):
            return lengths[low]
        return self._on_tail(self._observed, (survival[-1] if survival else 1.0) / alive)

    def _running(self) -> list[tuple[int, bool]]:
        """The requests under way, each cut at what it has generated, while the window has forgotten none: then
        every request that started is either in it or running, and the first to end, the short ones, do not
        alone make the curve (a freshly started engine's first ends are its shortest requests). Once the window
        forgets, the running are the long ones of requests whose short peers it no longer holds: left out."""
        if self.in_flight is None or len(self._samples) == self._samples.maxlen:
            return []
        return [(tokens, False) for tokens in self.in_flight() if tokens > 0]

    def _on_tail(self, start: int, remaining: float) -> int | None:
        """Where the tail, from `start` (at which a share `remaining` of the request's chances is left), falls to
        1 - quantile; None with no tail known."""
        if not self._hazard:
            return None
        return start + max(1, math.ceil(math.log(remaining / (1.0 - self.quantile)) / self._hazard))

    def _refresh(self) -> None:
        """Rebuild the curve once 5% of the window is new (and at the first query): O(n log n), rarely."""
        if self._since_rebuild == 0 or (self._built and self._since_rebuild * 20 < len(self._samples)):
            return
        self._since_rebuild, self._built = 0, True
        self._ends = sum(ended for _, ended in self._samples)
        ordered = sorted([*self._samples, *self._running()])
        at_risk = len(ordered)
        survival = 1.0
        lengths: list[int] = []
        curve: list[float] = []
        index = 0
        while index < len(ordered):
            length = ordered[index][0]
            ended = gone = 0
            while index < len(ordered) and ordered[index][0] == length:
                ended += ordered[index][1]
                gone += 1
                index += 1
            if ended:
                survival *= 1.0 - ended / at_risk
                lengths.append(length)
                curve.append(survival)
            at_risk -= gone
        self._lengths, self._survival, self._curve = lengths, curve, None
        self._observed = ordered[-1][0] if ordered else 0
        self._hazard = _tail_hazard(ordered)


def _tail_hazard(ordered: Sequence[tuple[int, bool]]) -> float:
    """Ends per token among the samples (length, ended), ascending, longer than their median, counted from the
    median: the rate of an exponential tail fitted to the longer half (0 when none of them ended)."""
    if not ordered:
        return 0.0
    median = ordered[len(ordered) // 2][0]
    ends = exposure = 0
    for length, ended in ordered[bisect_right(ordered, (median, True)) :]:
        ends += ended
        exposure += length - median
    return ends / exposure if exposure else 0.0
