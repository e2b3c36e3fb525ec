"""The KV-guard scheduler: `--scheduler-cls kvops_vllm.scheduler.KVGuardScheduler`.

vLLM's own admission checks that a waiting request's prompt fits the free blocks, then lets it grow; when the
pool runs out it preempts the newest request and later recomputes it from scratch. The guard admits a request
only when its projected KV, prompt + max_tokens at its peak in every KV-cache group, fits in what is left of
the free blocks once every admitted request's remaining growth is reserved (minus KVOPS_HEADROOM_BLOCKS). The
rest wait in vLLM's own queue, in order, and show as vllm:num_requests_waiting.

It also applies the kvops degrade policy to each new request, by the level of its own live KV usage (or the
watcher's, when KVOPS_POLICY_URL is set and it is higher): warn caps max_tokens, degrade also serves n>1 as one
sequence, critical finishes new requests at once with a reason the client receives. See config.py for the
settings and README.md, "KV guard", for what clients see.
"""

from __future__ import annotations

import re
import time
import weakref
from dataclasses import dataclass, fields
from itertools import islice

from vllm.logger import init_logger
from vllm.sampling_params import RequestOutputKind
from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.engine import EngineCoreOutput, EngineCoreOutputs
from vllm.v1.kv_cache_interface import SlidingWindowSpec
from vllm.v1.request import Request, RequestStatus

from kvops.errors import KvopsError
from kvops.policy import Level, LevelTracker, Limits, RequestParams, clamp
from kvops_vllm.admission import GroupShape, admissible_prefix, live_blocks, projected_blocks, window_blocks
from kvops_vllm.config import GuardConfig
from kvops_vllm.follow import PolicyFollower

# Under vLLM's logger tree, so the lines come out in the engine's own log format.
logger = init_logger("vllm.kvops_guard")

# vLLM fans a request with n > 1 out into n requests "{index}_{parent id}" (vllm/v1/engine/parallel_sampling.py).
SIBLING_ID = re.compile(r"(\d+)_")


@dataclass
class GuardCounts:
    """What the guard did since the engine started."""

    queued_for_kv: int = 0  # requests next in line whose projected KV did not fit (each counted once)
    capped: int = 0  # requests whose max_tokens the level capped
    siblings_dropped: int = 0  # n>1 siblings finished at degrade (index >= 1)
    rejected: int = 0  # new requests finished at once at critical

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
        self.kv_shapes = tuple(
            _group_shape(manager, self.vllm_config.max_in_flight_tokens)
            for manager in self.kv_cache_manager.coordinator.single_type_managers
        )
        self.level_tracker = LevelTracker(self.guard_config.policy)
        self.guard_counts = GuardCounts()
        self.in_force: tuple[Limits, str] = (self.guard_config.policy.limits(Level.OK), "own KV usage")
        self.follower: PolicyFollower | None = None
        if self.guard_config.policy_url:
            config = self.guard_config
            self.follower = PolicyFollower(
                config.policy_url,
                interval=config.poll_seconds,
                timeout=config.timeout_seconds,
                max_age=config.max_age_seconds,
                logger=logger,
            ).start()
        self._finished_at_admission: list[Request] = []
        self._waited_for_kv: weakref.WeakSet[Request] = weakref.WeakSet()
        self._logged_counts = GuardCounts()
        self._summary_since = time.monotonic()
        self._next_summary = self._summary_since + self.guard_config.log_seconds
        logger.info("kvops guard: %s", self._describe())

    # --- admission by projected KV -----------------------------------------------------------------------

    def schedule(self, *args, **kwargs):
        self._limits_in_force()
        held = self._hold_back_unfit()
        try:
            return super().schedule(*args, **kwargs)
        finally:
            if held is not None:
                self._release(held)
            self._maybe_log_summary()

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

    def _hold_back_unfit(self):
        """Leave in self.waiting only the requests, in order, whose projected KV fits; return the rest.

        vLLM's own admission pass then runs on that prefix unchanged (its token budget, max_num_seqs, LoRA and
        prefill rules still apply). Allocations for running requests during the pass lower the free blocks and
        their remaining need alike, so the slack computed here holds for the whole pass.
        """
        if not self.waiting:
            return None
        idle = not self.running and not self.kv_holding_waiting
        admitted = admissible_prefix(map(self.projected_blocks, self.waiting), self.kv_slack(), idle)
        if admitted == len(self.waiting):
            return None
        head = next(islice(self.waiting, admitted, None))
        if head not in self._waited_for_kv:
            self._waited_for_kv.add(head)
            self.guard_counts.queued_for_kv += 1
        held = self.waiting
        self.waiting = type(held)()
        for _ in range(admitted):
            self.waiting.add_request(held.pop_request())
        return held

    def _release(self, held) -> None:
        """Put the held-back requests behind whatever the pass left waiting (or preempted), in order."""
        left = list(self.waiting)
        self.waiting = held
        self.waiting.prepend_requests(reversed(left))

    # --- the policy at admission ---------------------------------------------------------------------------

    def add_request(self, request: Request) -> None:
        if request.request_id in self.requests or request.sampling_params is None:
            super().add_request(request)  # a streaming-input update of a running session, or a pooling request
            return
        limits, source = self._limits_in_force()
        if limits.reject:
            self._finish_at_admission(request, _reject_status(request), self._rejection(limits, source))
            self.guard_counts.rejected += 1
            return
        sibling = SIBLING_ID.match(request.request_id)
        if limits.single_sequence and sibling and int(sibling.group(1)) > 0:
            reason = f"kvops: KV cache {limits.level.label} ({source}): n>1 served as one sequence"
            self._finish_at_admission(request, RequestStatus.FINISHED_ABORTED, reason)
            self.guard_counts.siblings_dropped += 1
            return
        self._cap_max_tokens(request, limits)
        super().add_request(request)

    def _cap_max_tokens(self, request: Request, limits: Limits) -> None:
        clamped, _ = clamp(RequestParams(max_tokens=request.max_tokens), limits)
        if clamped.max_tokens is None or clamped.max_tokens >= request.max_tokens:
            return
        params = request.sampling_params
        # The scheduler's stop check reads request.max_tokens; the model runner reads the sampling params.
        request.max_tokens = params.max_tokens = clamped.max_tokens
        params.min_tokens = min(params.min_tokens, clamped.max_tokens)
        self.guard_counts.capped += 1

    def _finish_at_admission(self, request: Request, status: RequestStatus, reason: str) -> None:
        """Register the request, finish it before it is scheduled, and send its output at the next step.

        Raising here would kill the engine core; vLLM sends a finished request's output only from
        update_from_output, so it waits in _finished_at_admission until then (a step follows at once:
        finishing it leaves finished_req_ids non-empty).
        """
        super().add_request(request)
        request.stop_reason = reason
        self.finish_requests(request.request_id, status)
        self._finished_at_admission.append(request)

    def _rejection(self, limits: Limits, source: str) -> str:
        retry = f"; retry after {limits.retry_after_seconds} s" if limits.retry_after_seconds else ""
        return f"kvops: KV cache critical ({source}): request rejected{retry}"

    def update_from_output(self, scheduler_output, model_runner_output):
        outputs = super().update_from_output(scheduler_output, model_runner_output)
        finished, self._finished_at_admission = self._finished_at_admission, []
        for request in finished:
            outputs.setdefault(request.client_index, EngineCoreOutputs()).outputs.append(
                EngineCoreOutput(
                    request_id=request.request_id,
                    new_token_ids=[],
                    finish_reason=request.get_finished_reason(),
                    stop_reason=request.stop_reason,
                    events=request.take_events(),
                    trace_headers=request.trace_headers,
                )
            )
        return outputs

    def has_requests(self) -> bool:
        return super().has_requests() or bool(self._finished_at_admission)

    # --- levels ---------------------------------------------------------------------------------------------

    def _limits_in_force(self) -> tuple[Limits, str]:
        """The stricter of the level from own live usage and the watcher's (when followed and fresh)."""
        usage = self.kv_cache_manager.usage
        own = self.level_tracker.update(usage, time.monotonic())
        reading = self.follower.reading() if self.follower else None
        if reading is not None and reading.level != Level.UNKNOWN and reading.level >= own:
            watched = "" if reading.kv_usage is None else f" at {reading.kv_usage:.1%}"
            in_force = (reading.limits, f"watcher{watched}")
        else:
            in_force = (self.level_tracker.limits(), f"own KV usage {usage:.1%}")
        if in_force[0].level != self.in_force[0].level:
            logger.info(
                "kvops guard: level %s -> %s (%s): %s",
                self.in_force[0].level.label,
                in_force[0].level.label,
                in_force[1],
                _effect(in_force[0]),
            )
        self.in_force = in_force
        return in_force

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
        logger.info(
            "kvops guard: in the last %.0f s: %d queued for KV, %d max_tokens capped, %d n>1 siblings dropped, %d rejected; "
            "now %d running, %d waiting, %d blocks free, %d reserved for admitted requests",
            since,
            delta.queued_for_kv,
            delta.capped,
            delta.siblings_dropped,
            delta.rejected,
            len(self.running),
            len(self.waiting),
            self.kv_cache_manager.block_pool.get_num_free_blocks(),
            sum(map(self.blocks_still_needed, self.running)),
        )

    def _describe(self) -> str:
        config = self.guard_config
        policy = config.policy
        usable = self.kv_cache_config.num_blocks - 1  # block 0 is vLLM's null block
        groups = "; ".join(shape.describe() for shape in self.kv_shapes)
        thresholds = ", ".join(f"{level.label} {policy.thresholds[level]:.0%}" for level in sorted(policy.thresholds))
        follow = f", and the watcher at {config.policy_url}" if config.policy_url else ""
        return (
            f"admitting by projected KV (prompt + max_tokens) over {usable} usable blocks, headroom {config.headroom_blocks}; "
            f"groups: {groups}; policy {config.policy_source} ({thresholds}); levels from own KV usage{follow}"
        )

    def shutdown(self) -> None:
        if self.follower:
            self.follower.stop()
        super().shutdown()


def _group_shape(manager, in_flight_tokens: int) -> GroupShape:
    """A KV-cache group's shape from its manager (its block size includes any context-parallel split)."""
    spec = manager.kv_cache_spec
    if isinstance(spec, SlidingWindowSpec):
        blocks = window_blocks(spec.sliding_window, manager.block_size, in_flight_tokens, spec.extra_retained_tokens)
        return GroupShape(manager.block_size, blocks, spec.sliding_window)
    # Other groups that recycle blocks (chunked local attention) carry vLLM's own per-request cap.
    return GroupShape(manager.block_size, getattr(manager, "max_admission_blocks_per_request", None))


def _reject_status(request: Request) -> RequestStatus:
    """What reaches the client (verified on vLLM 0.32.0's OpenAI server): a finished-with-no-tokens "abort"
    carries our reason in `stop_reason` of a 200 response, but a stream drops it silently; so a streaming
    request is finished as an error instead, which streams an error event ("Internal server error", 500)."""
    if request.sampling_params.output_kind == RequestOutputKind.DELTA:
        return RequestStatus.FINISHED_ERROR
    return RequestStatus.FINISHED_ABORTED


def _effect(limits: Limits) -> str:
    effects = []
    if limits.max_tokens_cap is not None:
        effects.append(f"max_tokens capped at {limits.max_tokens_cap}")
    if limits.single_sequence:
        effects.append("n>1 served as one sequence")
    if limits.reject:
        effects.append("new requests rejected")
    return ", ".join(effects) or "no limits"
