"""One saturation policy for every gateway: the kvops levels as llm-d's, Dynamo's and production-stack's settings.

kvops degrades in steps (warn caps max_tokens, degrade forces one sequence, critical refuses); a gateway in front
of several replicas can only route away, queue or shed. The mapping keeps them in one order:

- llm-d's utilization detector (llm-d/llm-d-router, pkg/epp/framework/plugins/flowcontrol/saturationdetector/
  utilization/config.go) scores an endpoint max(waiting / queueDepthThreshold, kv / kvCacheUtilThreshold) and sheds
  sheddable requests (priority < 0) when the pool's mean score reaches 1.0 (pkg/epp/requestcontrol/admission.go);
  its filter stops routing to an endpoint past threshold x (1 + headroom). So kvCacheUtilThreshold is the degrade
  level (sheddable traffic goes first, when kvops starts cutting requests down), queueDepthThreshold the queue
  growth at which kvops raises warn, and headroom puts the filter's limit at the critical level, where kvops
  refuses everything.
- Dynamo's frontend (ai-dynamo/dynamo, components/src/dynamo/common/configuration/groups/router_args.py) marks a
  worker busy above --active-decode-blocks-threshold (a KV fraction) and rejects with 529 when every worker is
  busy: the critical level.

Pure: the watcher computes the same score per replica, the deploy package writes the settings.
"""

from __future__ import annotations

from kvops.frozen import frozen
from kvops.policy import Level, Policy

LLMD_DEFAULT_QUEUE_DEPTH = 5  # llm-d's DefaultQueueDepthThreshold, when the policy has no queue_growth signal


@frozen
class GatewayLevels:
    kv_cache_util_threshold: float  # sheddable traffic is shed from here on
    queue_depth_threshold: int
    headroom: float  # the endpoint filter's limit: kv_cache_util_threshold x (1 + headroom) = critical
    busy_kv_fraction: float  # a worker refuses new work from here on

    @classmethod
    def from_policy(cls, policy: Policy) -> GatewayLevels:
        degrade, critical = policy.thresholds[Level.DEGRADE], policy.thresholds[Level.CRITICAL]
        growth = policy.signals.get("queue_growth")
        depth = max(1, round(growth.min_growth)) if growth and growth.min_growth >= 1 else LLMD_DEFAULT_QUEUE_DEPTH
        return cls(degrade, depth, round(critical / degrade - 1, 4), critical)

    def score(self, kv_usage: float, waiting: float | None) -> float:
        """llm-d's endpoint score at these thresholds: >= 1.0 is saturated."""
        queue = (waiting or 0.0) / self.queue_depth_threshold
        return max(queue, kv_usage / self.kv_cache_util_threshold)
