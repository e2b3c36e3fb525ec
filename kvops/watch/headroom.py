"""KV headroom: the KV tokens a replica has left against the demand it is serving, in flight and queued.

    in flight = max(tokens in use, running x R)    the running requests as they are now, or as they will be at R
    demand    = in flight + waiting x R            every queued request will need R more
    headroom  = usable - demand                    usable: the tokens kv_usage is a fraction of

R, the KV tokens one request holds at its peak, is the policy's `headroom.request_tokens` (`kvops manifests`
writes the plan's prompt + generated tokens), else the engine's max-model-len: the most a request can take, so
the headroom errs low. Demand counts a request at R from the moment it is queued or admitted, while its KV
blocks fill only as it is prefilled and decoded: the demand rises before the KV usage does, which is what an
autoscaler needs (a new replica takes minutes to start). The recording rules of `kvops alerts` compute the same
per replica in PromQL (`kvops:kv_demand_tokens`, `kvops:kv_headroom_tokens`); the watcher exports it on
/kvops/metrics.
"""

from __future__ import annotations

from kvops.engines.metrics import Reading
from kvops.frozen import frozen


@frozen
class Headroom:
    usable_tokens: int
    used_tokens: float
    request_tokens: int
    in_flight_tokens: float
    queued_tokens: float

    @property
    def demand_tokens(self) -> float:
        return self.in_flight_tokens + self.queued_tokens

    @property
    def headroom_tokens(self) -> float:
        return self.usable_tokens - self.demand_tokens

    @property
    def demand_ratio(self) -> float:
        """Demand over the pool: what autoscaling targets (the warn level: scale before the first limit)."""
        return self.demand_tokens / self.usable_tokens

    def to_dict(self) -> dict:
        return {
            "usable_tokens": self.usable_tokens,
            "used_tokens": round(self.used_tokens),
            "request_tokens": self.request_tokens,
            "demand_tokens": round(self.demand_tokens),
            "headroom_tokens": round(self.headroom_tokens),
            "demand_ratio": self.demand_ratio,
        }


def headroom(reading: Reading, request_tokens: int | None) -> Headroom | None:
    """The replica's headroom, or None when the reading lacks the pool, the counts, or a request size."""
    tokens = request_tokens or reading.max_model_len
    if not (tokens and reading.usable_tokens and reading.used_tokens is not None):
        return None
    if reading.running is None or reading.waiting is None:
        return None
    return Headroom(
        usable_tokens=reading.usable_tokens,
        used_tokens=reading.used_tokens,
        request_tokens=tokens,
        in_flight_tokens=max(reading.used_tokens, reading.running * tokens),
        queued_tokens=reading.waiting * tokens,
    )
