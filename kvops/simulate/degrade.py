"""kvops' degrade policy at the API server, on the simulated clock: what the in-process middleware
(`vllm serve --middleware kvops_vllm.middleware.KVOpsMiddleware`) and the admission proxy do to each request.

As the middleware does, each request sent moves the policy's LevelTracker with the engine's KV usage at that moment
(thresholds, hysteresis and the admission's dwell, `Policy.for_admission`, in simulated seconds), and the level's limits answer it: refused with its
Retry-After where the level refuses a standard request, else served with its new tokens capped at the level's cap.
Every simulated request is standard: a class comes from a priority header that only a trusted gateway sets, and n,
best_of and beams are 1 in a trace, so single_sequence changes nothing here.
"""

from __future__ import annotations

from kvops.errors import UsageError
from kvops.policy import LevelTracker, Policy, RequestClass
from kvops.simulate.run import Admission, Door

SUFFIX = "+degrade"


def door(policy: Policy) -> Door:
    """A fresh API server's answers under `policy` (its level starts unread, as a started server's does)."""
    tracker = LevelTracker(policy.for_admission())

    def answer(now: float, usage: float) -> Admission:
        tracker.update(usage, now)
        limits = tracker.limits()
        refusal = limits.refusal(RequestClass.STANDARD)
        if refusal is not None:
            return Admission(retry_after_s=float(refusal.retry_after_seconds))
        return Admission(max_tokens=limits.max_tokens_cap)

    return answer


def split_arm(text: str) -> tuple[str, bool]:
    """`ARM+degrade` as (ARM, True); an arm without a suffix as (arm, False)."""
    base, plus, rest = text.strip().partition("+")
    if not plus:
        return text, False
    if "+" + rest.strip().lower() != SUFFIX:
        raise UsageError(
            f"--compare {text!r}: the one suffix an arm takes is {SUFFIX} (kvops' degrade policy in front)"
        )
    return base.strip(), True
