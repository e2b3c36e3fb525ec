"""The KV-guard scheduler: `--scheduler-cls kvops_vllm.scheduler.KVGuardScheduler`.

vLLM's own admission checks that a waiting request's prompt fits the free blocks, then lets it grow; when the
pool runs out it preempts the newest running request and later recomputes it from scratch. The guard admits
waiting requests, in vLLM's queue order, only while the whole batch still fits at its future peak
(KVOPS_ADMISSION=peak, guard v2): every admitted request's course through the pool is projected step by step,
growing one token per step to its projected end and then freeing everything, and the largest sum over future
steps must fit the pool less KVOPS_HEADROOM_BLOCKS. A request's end is its max_tokens when its length is known
(ignore_eos and no stop tokens or strings); otherwise it is drawn from the output lengths this engine produced
recently (beyond the longest of them, by their tail), given what it has generated so far, never beyond
max_tokens, and the batch must fit at the KVOPS_OUTPUT_QUANTILE of those lengths (admission.risk_prefix). Until
KVOPS_OUTPUT_MIN_ENDS requests have ended there are no lengths: the engine is cold, and requests of unknown length
are admitted and preempted as stock vLLM does (KVOPS_COLD_START=stock). KVOPS_ADMISSION=reserve is guard v1: every
admitted request's whole prompt + max_tokens reserved at once. The rest wait in vLLM's own queue, in order, and
show as vllm:num_requests_waiting.

When a projection falls short and a step's new blocks exceed the free ones, the requests that would run short
sit the step out holding their blocks (paused in place, no recompute) and resume as soon as a request ends; only
when none of the running could go on, or one has sat out KVOPS_PAUSE_STEPS steps in a row, does vLLM preempt, and
the guard picks the victim (FCFS policy; KVOPS_PREEMPT): the request that has computed most of those not
preempted before, which frees the most blocks (guard v3, the default), or the one that has computed least (guard
v2); it counts the tokens to recompute. A preempted request waits behind the requests not started yet, for a while
(KVOPS_RESUME=after-new: it has streamed its first tokens, they have not), or at the queue's head, where vLLM puts
it. Under load the admission is weighed again only when a request frees blocks or every RECHECK_STEPS steps, so
most steps cost it nothing.

It also applies the kvops degrade policy to each new request, by the watcher's level (KVOPS_POLICY_URL; with
KVOPS_LEVELS=own, also by its own KV usage): warn caps max_tokens; a level that refuses a request's class
(sheddable first, then standard; protected never) and, from degrade, the n>1 siblings after the first, keep
it waiting in the queue until the level relaxes. The guard never finishes a request it has not served: a
refusal the client can retry (503/429 with Retry-After) is the admission proxy's or vLLM's queue caps'.
See config.py for the settings and docs/kv-guard.md for what clients see.
"""

from __future__ import annotations

import re
import time
import weakref
from dataclasses import dataclass, fields, replace

from vllm.logger import init_logger
from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.request_queue import SchedulingPolicy, create_request_queue
from vllm.v1.kv_cache_interface import SlidingWindowSpec
from vllm.v1.request import Request, RequestStatus

from kvops.errors import KvopsError
from kvops.policy import Level, LevelTracker, Limits, RequestParams, clamp
from kvops_vllm.admission import (
    Course,
    GroupShape,
    OutputLengths,
    admissible_prefix,
    fitting_prefix,
    future_peak,
    live_blocks,
    projected_blocks,
    risk_margin,
    risk_peak,
    risk_prefix,
    whole_blocks,
    window_blocks,
)
from kvops_vllm.config import GuardConfig
from kvops_vllm.follow import PolicyFollower

# Under vLLM's logger tree, so the lines come out in the engine's own log format.
logger = init_logger("vllm.kvops_guard")

# vLLM fans a request with n > 1 out into n requests "{index}_{parent id}" (vllm/v1/engine/parallel_sampling.py).
SIBLING_ID = re.compile(r"(\d+)_")

# A blocked queue head is weighed again at once when a request frees blocks, else after this many steps (a later
# start lowers its own course a little): most steps under load then cost no admission arithmetic.
RECHECK_STEPS = 16

# How a cold engine (fewer than KVOPS_OUTPUT_MIN_ENDS ended) projects a request of unknown length, for the log line.
COLD_PHRASES = {"stock": "by what they hold now, as stock vLLM admits,", "max_tokens": "max_tokens"}


@dataclass(frozen=True)
class Blocked:
    """A queue head that did not fit: the requests freed so far and the step, when it was weighed."""

    head: Request
    frees: int
    step: int


# How a finished request's length feeds OutputLengths: an end, a cut (censored), or nothing (it never ran).
_ENDED = {RequestStatus.FINISHED_STOPPED, RequestStatus.FINISHED_ABORTED, RequestStatus.FINISHED_REPETITION}


@dataclass
class GuardCounts:
    """What the guard did since the engine started."""

    queued_for_kv: int = 0  # requests next in line whose projected KV did not fit (each counted once)
    capped: int = 0  # requests whose max_tokens the level capped
    held_by_level: int = 0  # requests the level kept waiting (a class it refuses, or n>1 siblings; each once)
    preempted: int = 0  # vLLM's fallback when a projection fell short
    recomputed_tokens: int = 0  # tokens the preempted had computed, to compute again (before prefix-cache hits)
    paused: int = 0  # request-steps that sat out, holding their blocks, because the pool ran short
    mispredicted: int = 0  # requests that generated more than their projected length at admission

    def minus(self, other: GuardCounts) -> GuardCounts:
        return GuardCounts(**{f.name: getattr(self, f.name) - getattr(other, f.name) for f in fields(self)})


class KVGuardScheduler(AsyncScheduler):
    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        try:
            self.guard_config = GuardConfig.from_env()
        except KvopsError as exc:
            # Fail the engine's startup, with the reason as one line above vLLM's traceback.
            logger.error("kvops guard: %s", exc)
            raise
        config = self.guard_config
        self.kv_shapes = tuple(
            _group_shape(manager, self.vllm_config.max_in_flight_tokens, self.num_lookahead_tokens)
            for manager in self.kv_cache_manager.coordinator.single_type_managers
        )
        self.usable_blocks = self.kv_cache_config.num_blocks - 1  # block 0 is vLLM's null block
        # A request's last output is read one step after it is scheduled (async scheduling): its blocks stay
        # held through the next step, which Course already counts; more batches in flight hold them longer.
        self.linger_steps = max(0, self.vllm_config.max_concurrent_batches - 2)
        self.output_lengths = OutputLengths(
            config.output_history, config.output_quantile, config.output_min_ends, self._generated_so_far
        )
        self.risk_margin = risk_margin(config.output_quantile)
        self.level_tracker = LevelTracker(config.policy)
        self.guard_counts = GuardCounts()
        self.in_force: tuple[Limits, str] = (config.policy.limits(Level.OK), "no watcher")
        self.follower: PolicyFollower | None = None
        if config.policy_url:
            self.follower = PolicyFollower(
                config.policy_url,
                interval=config.poll_seconds,
                timeout=config.timeout_seconds,
                max_age=config.max_age_seconds,
                logger=logger,
                fallback="levels from own KV usage" if config.levels == "own" else "no level",
            ).start()
        self._projected_at_admission: dict[str, int] = {}
        self._frees = 0  # requests that freed their blocks (finished or preempted) since the engine started
        self._blocked: Blocked | None = None
        self._pause_streaks: dict[str, int] = {}  # paused requests: steps in a row they have sat out
        self._preempted_at: weakref.WeakKeyDictionary[Request, int] = weakref.WeakKeyDictionary()  # step of it
        self._fixed_ends: dict[str, int] = {}  # known lengths: the end tokens, computed once per request
        self._waited_for_kv: weakref.WeakSet[Request] = weakref.WeakSet()
        self._held_once: weakref.WeakSet[Request] = weakref.WeakSet()
        self._logged_counts = GuardCounts()
        self._fewest_free = self.usable_blocks  # since the last summary: its peak KV usage
        self._summary_since = time.monotonic()
        self._next_summary = self._summary_since + config.log_seconds
        logger.info("kvops guard: %s", self._describe())

    # --- one scheduling step --------------------------------------------------------------------------------

    def schedule(self, *args, **kwargs):
        limits, _ = self._limits_in_force()
        running = self.running
        paused = self._make_room()
        held = self._hold_all() if paused else self._hold_back(limits)
        try:
            return super().schedule(*args, **kwargs)
        finally:
            if paused:
                self._resume(running, paused)
            if held is not None:
                self._release(held)
            free = self.kv_cache_manager.block_pool.get_num_free_blocks()
            if free < self._fewest_free:
                self._fewest_free = free
            self._maybe_log_summary()

    def _hold_back(self, limits: Limits):
        """Leave in self.waiting only the requests, in order, that the level serves and whose KV fits; return
        the original queue holding the rest.

        vLLM's own admission pass then runs on that prefix unchanged (its token budget, max_num_seqs, LoRA and
        prefill rules still apply). Allocations for running requests during the pass are part of every running
        request's projected course, so what fitted before the pass still fits after it. Only as many requests
        are weighed as vLLM could start this step: free seats, and prompts within one step's token budget.
        """
        seats = self.max_num_active_reqs - len(self.running)
        if not self.waiting or seats <= 0:
            return None
        held = self.waiting
        if self._still_blocked(held):
            return self._hold_all()
        popped: list[Request] = []
        candidates: list[Request] = []
        budget = self.max_num_scheduled_tokens
        while held and len(candidates) < seats and budget > 0:
            request = held.pop_request()
            popped.append(request)
            if self._kept_waiting(request, limits):
                if request not in self._held_once:
                    self._held_once.add(request)
                    self.guard_counts.held_by_level += 1
            else:
                candidates.append(request)
                budget -= _prefill_tokens(request)
        head = candidates[0] if candidates else None
        if self.guard_config.resume == "after-new" and not self.cold():
            candidates.sort(key=self._resumes_after_new)  # stable: queue order otherwise
        admitted = self._admissible(candidates) if candidates else 0
        if admitted < len(candidates) and candidates[admitted] not in self._waited_for_kv:
            self._waited_for_kv.add(candidates[admitted])
            self.guard_counts.queued_for_kv += 1
        self._blocked = Blocked(head, self._frees, self.current_step) if head and not admitted else None
        picked = candidates[:admitted]
        chosen = set(picked)
        for request in picked:
            self._projected_at_admission.setdefault(request.request_id, self.projected_output(request))
        held.prepend_requests(reversed([request for request in popped if request not in chosen]))
        self.waiting = create_request_queue(self.policy)
        for request in picked:
            self.waiting.add_request(request)
        return held

    def _resumes_after_new(self, request: Request) -> bool:
        """KVOPS_RESUME=after-new: a preempted request waits behind those not started yet. It streamed its first
        tokens before it was preempted; they wait for theirs (time to first token, what a queue costs first). For at
        most KVOPS_RESUME_WAIT_STEPS steps, so that new requests arriving without end cannot keep it waiting."""
        preempted = self._preempted_at.get(request)
        return preempted is not None and self.current_step - preempted < self.guard_config.resume_wait_steps

    def _hold_all(self):
        """Keep the whole queue from vLLM's admission pass this step; return it."""
        held, self.waiting = self.waiting, create_request_queue(self.policy)
        return held

    def _still_blocked(self, queue) -> bool:
        """The queue's head did not fit at a recent step and no request has freed blocks since: it still does not
        fit (the batch only grows until a request ends), so the admission need not be weighed again. Weighed
        anyway every RECHECK_STEPS steps: a later start lowers the head's own course a little."""
        blocked = self._blocked
        return (
            blocked is not None
            and blocked.frees == self._frees
            and self.current_step - blocked.step < RECHECK_STEPS
            and queue.peek_request() is blocked.head
        )

    def _release(self, held) -> None:
        """Put the held-back requests behind whatever the pass left waiting (or preempted), in order."""
        left = list(self.waiting)
        self.waiting = held
        self.waiting.prepend_requests(reversed(left))

    def _admissible(self, candidates: list[Request]) -> int:
        """How many of `candidates` (in queue order) may start now; an idle engine starts its first whatever its
        size (vLLM still checks that it fits the pool), or a request larger than pool less headroom would wait
        forever."""
        admitted = [*self.running, *self.kv_holding_waiting]
        idle = not admitted
        if self.guard_config.admission == "reserve":
            return admissible_prefix(map(self.projected_blocks, candidates), self.kv_slack(), idle)
        survival = self.output_lengths.survival()
        capacity = self.peak_capacity(admitted)
        prefill = [_prefill_tokens(request) for request in admitted]
        prefill_waiting = [_prefill_tokens(request) for request in candidates]
        chunk = max(1, self.max_num_scheduled_tokens - sum(1 for tokens in prefill if tokens <= 1))
        backlog = sum(prefill)
        running, waiting = self.shared(
            admitted, self.courses(admitted), candidates, self.courses(candidates), max(0, chunk - backlog)
        )
        if any(course.generated is not None for course in (*running, *waiting)):
            delay = -(-(backlog + sum(prefill_waiting)) // chunk)  # all of them: an upper bound for every prefix
            count = risk_prefix(running, waiting, self.kv_shapes, capacity, survival, self.risk_margin, delay)
            return max(count, 1) if idle else count

        def fits(count: int) -> bool:
            # steps the prefill backlog may take the whole token budget: a decode behind it can lose a step
            delay = -(-(backlog + sum(prefill_waiting[:count])) // chunk)
            return future_peak(running + waiting[:count], self.kv_shapes, delay=delay) <= capacity

        count = fitting_prefix(fits, len(candidates))
        return max(count, 1) if idle and candidates else count

    # --- guard v2: courses and the future peak ------------------------------------------------------------------

    def projected_output(self, request: Request) -> int:
        """Output tokens the request is projected to end with: max_tokens when its length is known, else the
        quantile of recent lengths given what it has generated (never more than max_tokens, never less than
        min_tokens or one more than it has)."""
        limit = max(0, min(request.max_tokens, self.max_model_len - request.num_prompt_tokens))
        params = request.sampling_params
        if params is None or _known_length(params):
            return limit
        generated = request.num_output_tokens + request.num_output_placeholders
        projected = self.output_lengths.projected_end(generated)
        if projected is None:
            return limit
        return min(limit, max(projected, generated + 1, params.min_tokens))

    def _generated_so_far(self) -> list[int]:
        """What each running request of unknown length has generated: a length cut there for the curve, so that the
        first requests to end (the short ones) do not alone make the past."""
        return [
            request.num_output_tokens
            for request in self.running
            if request.sampling_params is not None and not _known_length(request.sampling_params)
        ]

    def courses(self, requests: list[Request]) -> list[Course]:
        """Each request's course from this step: it holds every token it has (its whole prompt if still
        prefilling: conservative) and grows one token per step up to prompt + max_tokens; one that may stop
        earlier carries what it generated, for the output lengths' survival curve (until enough requests ended
        for one, it counts to its max_tokens)."""
        lookahead, longest, linger = self.num_lookahead_tokens, self.max_model_len, self.linger_steps
        survival = self.output_lengths.survival()
        fixed = self._fixed_ends
        courses = []
        for request in requests:  # runs at every scheduling step: plain arithmetic
            pending = request.num_tokens + request.num_output_placeholders
            held = min(pending + lookahead, longest)
            prefilling = pending - request.num_computed_tokens > 1
            end = fixed.get(request.request_id)
            if end is not None:
                courses.append(Course(held, end if end > held else held, linger, prefilling))
                continue
            params = request.sampling_params
            limit = max(0, min(request.max_tokens, longest - request.num_prompt_tokens))
            end = min(request.num_prompt_tokens + limit + lookahead, longest)
            if params is None or _known_length(params):
                fixed[request.request_id] = end
                courses.append(Course(held, end if end > held else held, linger, prefilling))
                continue
            if survival is None:
                courses.append(self._cold_course(held, end, prefilling))
                continue
            generated = request.num_output_tokens + request.num_output_placeholders
            courses.append(Course(held, end if end > held else held, linger, prefilling, generated, params.min_tokens))
        return courses

    def _cold_course(self, held: int, end: int, prefilling: bool) -> Course:
        """A request of unknown length before any lengths were learned (fewer than KVOPS_OUTPUT_MIN_ENDS ended).

        KVOPS_COLD_START=stock: it holds what it has now for as long as any course runs, and its growth is not
        reserved: a request is admitted while its prompt fits beside what the others hold, as stock vLLM admits it,
        and where the pool then runs short vLLM preempts (`_make_room`). Requests of known length keep their exact
        courses beside them. Projected at its max_tokens instead (KVOPS_COLD_START=max_tokens, guard v2 before), a
        cold engine served its first requests a few at a time, one at a time without max_tokens (the whole context):
        a burst of 28 on 11 blocks in 3.1-4.2 times stock's steps (bench/guard_replay.py --cold --burst 28 --blocks
        11)."""
        if self.guard_config.cold_start == "max_tokens":
            return Course(held, end if end > held else held, self.linger_steps, prefilling)
        return Course(held, held, self.max_model_len + self.linger_steps, prefilling)

    def shared(
        self,
        admitted: list[Request],
        running: list[Course],
        candidates: list[Request],
        waiting: list[Course],
        new_tokens: int,
    ) -> tuple[list[Course], list[Course]]:
        """The courses with the prompt prefixes they share left out where another course counts them (prefix
        caching: one block, several holders; counted once per holder, a pool of requests with one system prompt
        looked many times fuller than it is). A block held by several admitted requests is counted by the one
        that may hold it longest (its last step); a waiting request's prefix hit on blocks admitted requests hold
        is left out of its course until the earliest of their last steps, after which it counts them; so are the
        blocks an earlier candidate caches in this step (`new_tokens`: the step's tokens left for new requests),
        see `_among_candidates`. Full-attention groups only (a sliding window drops a prefix's blocks)."""
        groups = [
            (index, manager)
            for index, (shape, manager) in enumerate(
                zip(self.kv_shapes, self.kv_cache_manager.coordinator.single_type_managers)
            )
            if shape.max_blocks is None
        ]
        if not groups or not self.kv_cache_manager.enable_caching:
            return running, waiting
        if not admitted:
            return running, self._among_candidates(candidates, waiting, groups, new_tokens)
        holder_end: dict[int, int] = {}  # shared block -> the last step of the admitted request that counts it
        shared = [0] * len(admitted)
        for position in sorted(range(len(admitted)), key=lambda position: -running[position].last_step):
            for _, manager in groups:
                for block in manager.req_to_blocks.get(admitted[position].request_id, ()):
                    if block.ref_cnt < 2:
                        break  # a prefix hit is a prefix of the block list: the rest are the request's own
                    if block.block_id in holder_end:
                        shared[position] += 1
                    else:
                        holder_end[block.block_id] = running[position].last_step
        soonest = min(course.last_step for course in running)  # a block one admitted request holds: at least this
        held = [
            self._with_hits_held(request, course, groups, holder_end, soonest)
            for request, course in zip(candidates, waiting)
        ]
        return (
            [replace(course, shared=count) if count else course for course, count in zip(running, shared)],
            self._among_candidates(candidates, held, groups, new_tokens),
        )

    def _among_candidates(
        self, candidates: list[Request], waiting: list[Course], groups, new_tokens: int
    ) -> list[Course]:
        """Each candidate's course less the prompt blocks an earlier candidate caches in this step: vLLM registers a
        block's hash when it allocates it for the tokens it schedules (KVCacheManager.allocate_slots ->
        cache_blocks, vllm/v1/core/kv_cache_manager.py), so a request scheduled after it in the same step hits it.
        An earlier candidate caches its prompt up to the tokens the step has left for new requests, in queue
        order (`new_tokens`); the later one leaves those blocks out up to the earlier one's last step. A burst of
        requests with a prompt not yet cached then starts as stock vLLM starts it, not over several steps."""
        size = self.kv_cache_manager.block_pool.hash_block_size
        if any(manager.block_size != size for _, manager in groups):
            return waiting
        holder_end: dict[object, int] = {}  # block hash -> the last step of the earliest candidate caching it
        left = new_tokens
        out = []
        for request, course in zip(candidates, waiting):
            if not request.block_hashes or request.num_computed_tokens:
                left -= min(left, _prefill_tokens(request))  # it takes its share of the step all the same
                out.append(course)
                continue
            hashes = request.block_hashes[: (request.num_tokens - 1) // size]  # a hit leaves the last token out
            start = course.shared // len(groups)  # its hit on admitted requests' blocks, a prefix of its blocks
            matched, until = 0, course.last_shared_step if course.shared else course.last_step
            for block_hash in hashes[start:]:
                if block_hash not in holder_end:
                    break
                matched, until = matched + 1, min(until, holder_end[block_hash])
            if matched:
                course = replace(course, shared=course.shared + matched * len(groups), shared_until=until)
            reused = (start + matched) * size
            scheduled = min(max(0, request.num_tokens - reused), left)
            left -= scheduled
            for block_hash in request.block_hashes[: (reused + scheduled) // size]:
                holder_end.setdefault(block_hash, course.last_step)
            out.append(course)
        return out

    def _with_hits_held(
        self, request: Request, course: Course, groups, holder_end: dict[int, int], soonest: int
    ) -> Course:
        """The waiting `request`'s course less the blocks of its prefix-cache hit that admitted requests hold, up to
        the earliest of their last steps (then it holds them alone; a block one admitted request holds, whose
        holder this pass did not look up, up to the soonest last step of any)."""
        if not request.block_hashes or request.num_computed_tokens:
            return course
        found = self.kv_cache_manager.coordinator.find_longest_cache_hit(request.block_hashes, request.num_tokens - 1)
        held, until = 0, course.last_step
        for index, _ in groups:
            for block in found[0][index]:
                if block.ref_cnt == 0:
                    break  # cached but free: taking it takes a free block
                held, until = held + 1, min(until, holder_end.get(block.block_id, soonest))
        return replace(course, shared=held, shared_until=until) if held else course

    def peak_capacity(self, admitted: list[Request]) -> int:
        """Blocks the admitted requests' courses may use at their peak: the usable pool less the headroom, and less
        what holders outside them keep (a finished request whose blocks a KV connector or a copy still holds)."""
        capacity = self.usable_blocks - self.guard_config.headroom_blocks
        if self.connector is None and not self.deferred_frees:
            return capacity  # every block in use belongs to an admitted request
        used = self.usable_blocks - self.kv_cache_manager.block_pool.get_num_free_blocks()
        modeled = sum(self.live_blocks_held(request) for request in admitted)
        return capacity - max(0, used - modeled)

    def live_blocks_held(self, request: Request) -> int:
        """Blocks the request holds now, all groups together (a sliding window's null blocks behind it not counted)."""
        managers = self.kv_cache_manager.coordinator.single_type_managers
        return sum(live_blocks(manager.req_to_blocks.get(request.request_id, ())) for manager in managers)

    # --- guard v1: the whole prompt + max_tokens reserved ---------------------------------------------------------

    def projected_tokens(self, request: Request) -> int:
        """The most tokens the request will ever cache: prompt + max_tokens (+ speculative lookahead)."""
        return min(request.num_prompt_tokens + request.max_tokens + self.num_lookahead_tokens, self.max_model_len)

    def projected_blocks(self, request: Request) -> int:
        return projected_blocks(self.kv_shapes, self.projected_tokens(request))

    def blocks_still_needed(self, request: Request) -> int:
        """Blocks an admitted request will still allocate before it finishes."""
        tokens = self.projected_tokens(request)
        needed = 0
        for shape, manager in zip(self.kv_shapes, self.kv_cache_manager.coordinator.single_type_managers):
            held = live_blocks(manager.req_to_blocks.get(request.request_id, ()))
            needed += max(0, shape.blocks(tokens) - held)
        return needed

    def kv_slack(self) -> int:
        """Free blocks less the headroom and less what every admitted request will still allocate."""
        admitted = [*self.running, *self.kv_holding_waiting]
        committed = sum(self.blocks_still_needed(request) for request in admitted)
        return self.kv_cache_manager.block_pool.get_num_free_blocks() - self.guard_config.headroom_blocks - committed

    # --- the fallback: preemption ---------------------------------------------------------------------------------

    def _make_room(self) -> list[Request]:
        """When this step's new blocks would exceed the free ones, the running requests that would run short sit
        the step out, holding their blocks, instead of vLLM preempting one and recomputing it later: they resume
        as soon as a request ends and frees blocks (no admission meanwhile). The first served are those vLLM would
        preempt last: the most computed (FCFS) or the most urgent (priority). Only when none of them could run, or
        one has sat out KVOPS_PAUSE_STEPS steps in a row (in bench/guard_replay.py, a longer stall cost the batch more
        than a recompute), does vLLM preempt, and then its FCFS victim (the last running) is made the one that computed
        least.

        Returns the paused requests, taken out of self.running for this step (`_resume` puts them back).
        """
        running = self.running
        sat_out, self._pause_streaks = self._pause_streaks, {}
        if len(running) < 2 or self.connector is not None:
            return []  # a KV connector may hold or free blocks outside this count: vLLM's own handling
        if self.cold():
            # A pause bets that a request ends and frees blocks within a few steps. A cold engine admitted by what
            # its requests hold now, knowing the pool may not hold their growth, and has no lengths to judge the
            # bet by: vLLM preempts its own victim, as it would without the guard. In the replay, pausing there
            # cost bursts on a fresh engine 5-11% more steps, and preempting the least computed instead the same
            # steps with 13% more preemptions (tests/engine/test_kv_guard_scheduler.py's bursts).
            return []
        free = self.kv_cache_manager.block_pool.get_num_free_blocks()
        if free >= len(self.kv_shapes) * (len(running) + self.max_num_scheduled_tokens):
            return []  # every running request could take more blocks than this step can fill: none runs short
        needs: dict[Request, int] = {}
        budget = self.max_num_scheduled_tokens
        for request in running:  # in vLLM's order, which spends the token budget
            if budget <= 0:
                break  # vLLM schedules no more this step: the rest allocate nothing
            pending = request.num_tokens_with_spec + request.num_output_placeholders - request.num_computed_tokens
            tokens = min(pending, budget)
            needs[request] = self._new_blocks(request, request.num_computed_tokens + tokens)
            budget -= tokens
        if sum(needs.values()) <= free:
            return []
        if self.policy == SchedulingPolicy.PRIORITY:
            order = sorted(needs, key=lambda request: (request.priority, request.arrival_time))
        else:  # vLLM's FCFS victim is the last running
            running.sort(key=self._victim_last)
            order = [request for request in running if request in needs]
        paused: list[Request] = []
        for request in order:
            if needs[request] > free:
                paused.append(request)
            else:
                free -= needs[request]
        if not paused or len(paused) == len(needs):
            return []  # all fit, or none could run: vLLM preempts
        streaks = {request.request_id: sat_out.get(request.request_id, 0) + 1 for request in paused}
        if max(streaks.values()) > self.guard_config.pause_steps:
            return []  # short for longer than a recompute costs: vLLM preempts
        self._pause_streaks = streaks
        self.guard_counts.paused += len(paused)
        gone = set(paused)
        self.running = [request for request in running if request not in gone]
        return paused

    def _victim_last(self, request: Request) -> tuple[bool, int]:
        """The sort key that puts vLLM's victim last: the request that computed least (KVOPS_PREEMPT=least-computed),
        or the one that computed most of those never preempted (most-computed), which frees the most blocks: the
        pool then runs short again later, so fewer requests are preempted, each recomputing more (on a GPU a short
        prefill). A request preempted before goes first, so that it is not the victim again."""
        if self.guard_config.preempt == "least-computed":
            return False, -request.num_computed_tokens
        return request.num_preemptions == 0, request.num_computed_tokens

    def cold(self) -> bool:
        """No lengths learned yet (fewer than KVOPS_OUTPUT_MIN_ENDS ended), and KVOPS_COLD_START=stock: requests of
        unknown length are admitted and preempted as stock vLLM does (`_cold_course`, `_make_room`)."""
        return self.guard_config.cold_start == "stock" and self.output_lengths.survival() is None

    def _new_blocks(self, request: Request, tokens: int) -> int:
        """Blocks vLLM allocates for `request` to hold `tokens` tokens (plus the speculative lookahead), all
        groups together; a sliding-window group's blocks behind its window count as held (they are freed after
        this count is taken: conservative)."""
        tokens = min(tokens + self.num_lookahead_tokens, self.max_model_len)
        managers = self.kv_cache_manager.coordinator.single_type_managers
        need = 0
        for shape, manager in zip(self.kv_shapes, managers):
            held = len(manager.req_to_blocks.get(request.request_id, ()))
            need += max(0, whole_blocks(tokens, shape.block_size) - held)
        return need

    def _resume(self, running: list[Request], paused: list[Request]) -> None:
        """Put the paused requests back in their places: the running list as it was, less those vLLM preempted or
        finished in the pass, then those it admitted."""
        before = set(running)
        kept = set(self.running) | set(paused)
        self.running = [request for request in running if request in kept] + [
            request for request in self.running if request not in before
        ]

    def _preempt_request(self, request: Request, timestamp: float, drop_stale_output: bool = False) -> None:
        self._frees += 1
        self._preempted_at[request] = self.current_step
        self.guard_counts.preempted += 1
        self.guard_counts.recomputed_tokens += request.num_computed_tokens - request.num_output_placeholders
        super()._preempt_request(request, timestamp, drop_stale_output)

    # --- learning output lengths ------------------------------------------------------------------------------------

    def _free_request(self, request: Request, delay_free_blocks: bool = False):
        self._frees += 1
        self._learn(request)
        return super()._free_request(request, delay_free_blocks)

    def _learn(self, request: Request) -> None:
        """Record a finished request's length (an end, or a cut by its limit), and whether it ran past the end
        projected at its admission."""
        self._fixed_ends.pop(request.request_id, None)
        projected = self._projected_at_admission.pop(request.request_id, None)
        params = request.sampling_params
        generated = request.num_output_tokens
        if params is None or _known_length(params) or generated == 0:
            return
        if request.status in _ENDED:
            self.output_lengths.record(generated, ended=True)
        elif request.status == RequestStatus.FINISHED_LENGTH_CAPPED:
            self.output_lengths.record(generated, ended=False)
        if projected is not None and generated > projected:
            self.guard_counts.mispredicted += 1

    # --- the policy at admission ---------------------------------------------------------------------------------

    def add_request(self, request: Request) -> None:
        if request.request_id in self.requests or request.sampling_params is None:
            self._fixed_ends.pop(request.request_id, None)  # a session's next input changes its prompt and limit
            super().add_request(request)  # a streaming-input update of a running session, or a pooling request
            return
        limits, _ = self._limits_in_force()
        self._cap_max_tokens(request, limits)
        super().add_request(request)

    def _kept_waiting(self, request: Request, limits: Limits) -> bool:
        """The level does not serve this request now: its class is refused, or it is an n>1 sibling after the
        first at a single-sequence level. It waits in the queue instead of being finished empty."""
        if request.sampling_params is None or request.num_computed_tokens or request.num_output_tokens:
            return False  # pooling, or already under way (a preempted request resumes)
        if limits.refusal(self.guard_config.policy.priorities.request_class(request.priority)) is not None:
            return True
        sibling = SIBLING_ID.match(request.request_id)
        return limits.single_sequence and sibling is not None and int(sibling.group(1)) > 0

    def _cap_max_tokens(self, request: Request, limits: Limits) -> None:
        clamped, _ = clamp(RequestParams(max_tokens=request.max_tokens), limits)
        if clamped.max_tokens is None or clamped.max_tokens >= request.max_tokens:
            return
        params = request.sampling_params
        if params is None:
            return  # pooling: add_request passes it on untouched
        # The scheduler's stop check reads request.max_tokens; the model runner reads the sampling params.
        request.max_tokens = params.max_tokens = clamped.max_tokens
        params.min_tokens = min(params.min_tokens, clamped.max_tokens)
        self.guard_counts.capped += 1

    # --- levels ---------------------------------------------------------------------------------------------

    def _limits_in_force(self) -> tuple[Limits, str]:
        """The watcher's level when followed and fresh; with KVOPS_LEVELS=own, the stricter of it and the level
        of the engine's own live KV usage (the watcher's when they tie)."""
        reading = self.follower.reading() if self.follower else None
        if reading is not None and reading.level == Level.UNKNOWN:
            reading = None
        if self.guard_config.levels == "own":
            usage = self.kv_cache_manager.usage
            own = self.level_tracker.update(usage, time.monotonic())
            if reading is None or reading.level < own:
                return self._enforce(self.level_tracker.limits(), f"own KV usage {usage:.1%}")
        if reading is not None:
            watched = "" if reading.kv_usage is None else f" at {reading.kv_usage:.1%}"
            return self._enforce(reading.limits, f"watcher{watched}")
        return self._enforce(
            self.guard_config.policy.limits(Level.OK), "watcher unusable" if self.follower else "no watcher"
        )

    def _enforce(self, limits: Limits, source: str) -> tuple[Limits, str]:
        if limits.level != self.in_force[0].level:
            logger.info(
                "kvops guard: level %s -> %s (%s): %s",
                self.in_force[0].level.label,
                limits.level.label,
                source,
                ", ".join(limits.effects(held=True)) or "no limits",
            )
        self.in_force = (limits, source)
        return self.in_force

    # --- reporting ------------------------------------------------------------------------------------------

    def _maybe_log_summary(self) -> None:
        """At most one line per KVOPS_LOG_SECONDS, and one when the engine drains (it may then idle for long)."""
        now = time.monotonic()
        drained = not self.running and not self.waiting
        if now < self._next_summary and not drained:
            return
        delta = self.guard_counts.minus(self._logged_counts)
        if delta == GuardCounts():
            return
        self._next_summary = now + self.guard_config.log_seconds
        since, self._summary_since = now - self._summary_since, now
        self._logged_counts = GuardCounts(**vars(self.guard_counts))
        peak_used, self._fewest_free = self.usable_blocks - self._fewest_free, self.usable_blocks
        logger.info(
            "kvops guard: in the last %.0f s: %d queued for KV, %d max_tokens capped, %d kept waiting by the level, "
            "%d paused a step for blocks, %d preempted (%d tokens to recompute), %d past their projected length; "
            "peak KV usage %.1f%% (%d of %d blocks); "
            "now %d running, %d waiting, %d blocks free, %s",
            since,
            delta.queued_for_kv,
            delta.capped,
            delta.held_by_level,
            delta.paused,
            delta.preempted,
            delta.recomputed_tokens,
            delta.mispredicted,
            100 * peak_used / self.usable_blocks,
            peak_used,
            self.usable_blocks,
            len(self.running),
            len(self.waiting),
            self.kv_cache_manager.block_pool.get_num_free_blocks(),
            self._commitment(),
        )

    def _commitment(self) -> str:
        if self.guard_config.admission == "reserve":
            return f"{sum(map(self.blocks_still_needed, self.running))} reserved for admitted requests"
        survival = self.output_lengths.survival()
        courses = self.courses([*self.running, *self.kv_holding_waiting])
        if any(course.generated is not None for course in courses):
            peak = risk_peak(courses, self.kv_shapes, survival, self.risk_margin)
            return f"projected peak {peak:.0f} of {self.usable_blocks} usable (p{self.guard_config.output_quantile * 100:g})"
        return f"projected peak {future_peak(courses, self.kv_shapes)} of {self.usable_blocks} usable"

    def _describe(self) -> str:
        config = self.guard_config
        policy = config.policy
        groups = "; ".join(shape.describe() for shape in self.kv_shapes)
        thresholds = ", ".join(f"{level.label} {policy.thresholds[level]:.0%}" for level in sorted(policy.thresholds))
        if config.admission == "reserve":
            how = "projected KV (prompt + max_tokens)"
        else:
            how = (
                f"the future peak of the whole batch (lengths: max_tokens where known, else the last "
                f"{config.output_history} finished, the batch within the pool at p{config.output_quantile * 100:g}; "
                f"{COLD_PHRASES[config.cold_start]} until {config.output_min_ends} ended)"
            )
        watcher = f"the watcher at {config.policy_url}" if config.policy_url else ""
        if config.levels == "own":
            levels = f"levels from own KV usage{', and ' + watcher if watcher else ''}"
        else:
            levels = f"levels from {watcher}" if watcher else "no levels (no watcher)"
        pause = f"requests pause up to {config.pause_steps} steps, then " if config.pause_steps else ""
        victim = (
            "the least computed" if config.preempt == "least-computed" else "the most computed not preempted before"
        )
        resume = (
            f"after new requests (for up to {config.resume_wait_steps} steps)"
            if config.resume == "after-new"
            else "at the queue's head"
        )
        return (
            f"admitting by {how} over {self.usable_blocks} usable blocks, headroom {config.headroom_blocks}; "
            f"groups: {groups}; policy {config.policy_source} ({thresholds}); {levels}; "
            f"short of blocks, {pause}vLLM preempts {victim}, which waits {resume}"
        )

    def shutdown(self) -> None:
        if self.follower:
            self.follower.stop()
        super().shutdown()


def _group_shape(manager, in_flight_tokens: int, lookahead: int) -> GroupShape:
    """A KV-cache group's shape from its manager (its block size includes any context-parallel split)."""
    spec = manager.kv_cache_spec
    if isinstance(spec, SlidingWindowSpec):
        extra = spec.extra_retained_tokens
        blocks = window_blocks(spec.sliding_window, manager.block_size, in_flight_tokens, extra)
        # decoding: one token in flight, so blocks behind (window + that token) are freed
        decode = min(blocks, whole_blocks(spec.sliding_window + extra + lookahead, manager.block_size) + 1)
        return GroupShape(manager.block_size, blocks, spec.sliding_window, decode)
    # Other groups that recycle blocks (chunked local attention) carry vLLM's own per-request cap.
    return GroupShape(manager.block_size, getattr(manager, "max_admission_blocks_per_request", None))


def _prefill_tokens(request: Request) -> int:
    """Tokens still to schedule before it decodes one token per step (1 for a decoding request)."""
    return request.num_tokens + request.num_output_placeholders - request.num_computed_tokens


def _known_length(params) -> bool:
    """It generates exactly max_tokens: nothing can stop it earlier (EOS ignored, no stop tokens or strings)."""
    return params.eos_token_id is None and not params.stop_token_ids and not params.stop
