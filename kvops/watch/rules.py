"""`kvops alerts`: Prometheus alerting rules for the watcher's alerts, thresholds from the same policy.

Each alert of `alerts.catalogue` becomes a rule whose expression computes what the watcher computes (see
`signals`): usage >= threshold for the levels, the queue-growth, preemption, stall, hit-rate and host-tier windows
of the policy, and a metrics-stale rule (target down, or up without the KV usage series). Level rules fire after
`min_dwell_seconds` and keep firing `min_dwell_seconds` after usage drops (`for`, `keep_firing_for`), the
policy's own guard against flapping.

A range shorter than a few scrapes cannot fire: `increase(x[30s])` over samples 60 s apart holds at most one
sample and returns nothing. Every window is therefore at least MIN_SCRAPES scrape intervals (the policy's window
when it is longer); the watcher, which polls every `--interval`, keeps the policy's.

With a plan's figures (`kvops manifests`, or `kvops alerts --plan FILE`), a second group records the KV headroom
per replica (kvops/watch/headroom.py: `kvops:kv_usable_tokens`, `kvops:kv_demand_tokens`,
`kvops:kv_headroom_tokens`, `kvops:kv_demand_ratio`), what KEDA and the HPA scale on, and the GPU memory in use
(`kvops:gpu_memory_in_use_ratio`, kvops/engines/targets.py) with its GPUMemoryHigh alert.
"""

from __future__ import annotations

import re
from dataclasses import replace
from typing import Any

from kvops.engines.metrics import PromQL, duration, series
from kvops.errors import UsageError
from kvops.frozen import frozen
from kvops.policy import GRADED, Level, Policy, SignalRule
from kvops.watch.alerts import (
    LEVEL_ALERTS,
    REFUSAL_ALERT,
    REFUSAL_WINDOW,
    SIGNAL_ALERTS,
    STALE_ALERT,
    AlertKind,
    catalogue,
    gpu_memory_kind,
)

MIN_SCRAPES = 4  # a range holds at least this many scrape intervals
REPLICA = "namespace, pod, job, instance"  # a replica's labels: a pod in Kubernetes, a target elsewhere
LABEL = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")  # a matcher's label name (selector_matchers: no leading space)
DEMAND = "kvops:kv_demand_tokens"
USABLE = "kvops:kv_usable_tokens"
HEADROOM = "kvops:kv_headroom_tokens"
DEMAND_RATIO = "kvops:kv_demand_ratio"
GPU_MEMORY = "kvops:gpu_memory_in_use_ratio"


@frozen
class PlanFigures:
    """What the recording rules take from a plan: one replica's pool and request, and its memory split."""

    usable_tokens: int  # the tokens the usage gauge is a fraction of, per engine
    request_tokens: int  # R: KV tokens one request of the planned workload holds at its peak
    non_kv_bytes: int  # weights and overheads, per GPU
    kv_bytes: int  # the KV pool, per GPU
    total_bytes: int  # the device

    @classmethod
    def from_plan(cls, engine_name: str, plan: dict[str, Any], where: str = "the plan") -> PlanFigures:
        """From a plan as `kvops plan --json` prints it (Plan.to_dict())."""
        from kvops import engines
        from kvops.engines.targets import non_kv_bytes

        capacity = plan.get("capacity") or {}
        try:
            terms = {term["name"]: int(term["bytes"]) for term in plan["memory"]["terms"]}
            usable = engines.get(engine_name).metrics.usage_pool_tokens(capacity)
            request = min(
                plan["workload"]["tokens_per_request"] or capacity["max_model_len"], capacity["max_model_len"]
            )
            return cls(
                usable,
                int(request),
                non_kv_bytes(terms.items()),
                int(plan["memory"].get("capacity_kv_bytes", plan["memory"]["kv_cache_bytes"])),
                terms["total"],
            )
        except (KeyError, TypeError, ValueError, ZeroDivisionError):
            raise UsageError(
                f"{where}: not a kvops plan that fits (`kvops plan --json` of a plan with a KV pool)"
            ) from None

    def memory_at_usage(self, kv_usage: float) -> float:
        """The share of the device in use (weights, overheads and the KV blocks in use) at this KV usage."""
        return (self.non_kv_bytes + kv_usage * self.kv_bytes) / self.total_bytes

    def gpu_memory_at(self, below: float) -> float | None:
        from kvops.engines.targets import kv_usage_at_target

        return kv_usage_at_target(self.non_kv_bytes, self.kv_bytes, self.total_bytes, below)


def widened(policy: Policy, scrape_interval: float) -> Policy:
    """The policy with every signal window at least MIN_SCRAPES scrapes long (what the rules evaluate)."""
    least = MIN_SCRAPES * scrape_interval

    def widen(rule: SignalRule) -> SignalRule:
        return replace(rule, window_seconds=max(rule.window_seconds, least), seconds=max(rule.seconds, least))

    return replace(policy, signals={name: widen(rule) for name, rule in policy.signals.items()})


WHERE = "{{ $labels.instance }}"
VALUE = {
    "ratio": "{{ $value | humanizePercentage }}",
    "count": "{{ $value }}",
    "ms": '{{ $value | printf "%.3g" }} ms',
    "text": "target down, or up without the KV usage series",
}


def rule_groups(
    policy: Policy,
    engine: str,
    promql: PromQL,
    *,
    runbook_url: str,
    scrape_interval: float,
    plan: PlanFigures | None = None,
) -> list[dict]:
    policy = widened(policy, scrape_interval)
    kinds = {kind.name: kind for kind in catalogue(policy, engine)}
    dwell = duration(policy.min_dwell_seconds) if policy.min_dwell_seconds > 0 else None
    rules = []
    for level in GRADED:
        expr = f"{promql.usage} >= {policy.thresholds[level]:g}"
        rules.append(_rule(kinds[LEVEL_ALERTS[level]], expr, engine, runbook_url, hold=dwell, keep_firing=dwell))
    for name, rule in policy.signals.items():
        if SIGNAL_ALERTS[name] in kinds:
            signal_expr = _signal_expr(name, rule, promql)
            if signal_expr:
                rules.append(_rule(kinds[SIGNAL_ALERTS[name]], signal_expr, engine, runbook_url))
    if REFUSAL_ALERT in kinds and promql.refusals_increase:
        refused = f"{PromQL.window(promql.refusals_increase, REFUSAL_WINDOW)} > 0"
        rules.append(_rule(kinds[REFUSAL_ALERT], refused, engine, runbook_url))
    stale = f"{promql.up} == 0 or ({promql.up} == 1 unless on (job, instance) {promql.usage})"
    rules.append(
        _rule(
            kinds[STALE_ALERT], stale, engine, runbook_url, hold=duration(policy.stale_after_failures * scrape_interval)
        )
    )
    if plan is None:
        return [{"name": f"kvops-{engine}", "rules": rules}]
    at = plan.gpu_memory_at(policy.gpu_memory_below)
    if at is not None and 0 < at < 1:
        # where the target falls below the warn level (a big model on a small card), an alert at the target would
        # fire under the load the plan sizes for: it fires where KV usage reaches the warn level instead
        warn = policy.thresholds[Level.WARN]
        threshold = policy.gpu_memory_below if at >= warn else plan.memory_at_usage(warn)
        kind = gpu_memory_kind(policy, max(at, warn), threshold)
        rules.append(
            _rule(kind, f"{_recorded(GPU_MEMORY, promql)} >= {threshold:.4g}", engine, runbook_url, hold=dwell)
        )
    return [{"name": f"kvops-{engine}", "rules": rules}, _recording_group(engine, promql, plan)]


def _recording_group(engine: str, promql: PromQL, plan: PlanFigures) -> dict:
    """The headroom per replica (kvops/watch/headroom.py) and the GPU memory in use, from the plan's figures."""
    r, by = plan.request_tokens, _replica_labels(promql)
    used = f"sum by ({by}) ({promql.usage}) * {plan.usable_tokens}"
    running = f"sum by ({by}) ({promql.running}) * {r}"
    waiting = f"sum by ({by}) ({promql.waiting}) * {r}"
    memory = f"({plan.non_kv_bytes} + max by ({by}) ({promql.usage}) * {plan.kv_bytes}) / {plan.total_bytes}"
    usable, demand = _recorded(USABLE, promql), _recorded(DEMAND, promql)
    records = [
        (USABLE, f"count by ({by}) ({promql.usage}) * {plan.usable_tokens}"),
        (DEMAND, f"(({used}) >= ({running}) or ({running})) + ({waiting})"),
        (HEADROOM, f"{usable} - {demand}"),
        (DEMAND_RATIO, f"{demand} / {usable}"),
        (GPU_MEMORY, memory),
    ]
    return {
        "name": f"kvops-{engine}-headroom",
        "rules": [{"record": name, "expr": expr, "labels": {"serving_engine": engine}} for name, expr in records],
    }


def _replica_labels(promql: PromQL) -> str:
    """A replica's labels and every label the selector names, so that its recorded series answer the selector."""
    named = [found.group(0) for matcher in promql.matchers if (found := LABEL.match(matcher))]
    return ", ".join(dict.fromkeys([*REPLICA.split(", "), *named]))


def _recorded(name: str, promql: PromQL) -> str:
    """A series these rules record, through the deployment's selector: another deployment's rules record the same
    names (with its own plan's figures) into the same Prometheus."""
    return series(name, list(promql.matchers))


def _signal_expr(name: str, rule, promql: PromQL) -> str | None:
    window = rule.window_seconds
    if name == "queue_growth":
        least = f">= {rule.min_growth:g}" if rule.min_growth > 0 else "> 0"
        return f"({promql.waiting} - min_over_time({promql.waiting}[{duration(window)}])) {least}"
    if name == "preemptions" and promql.preemptions_increase:
        return f"{PromQL.window(promql.preemptions_increase, window)} > 0"
    if name == "stall":
        return f"{promql.running} > 0 and {PromQL.window(promql.progress_increase, rule.seconds)} == 0"
    if name == "prefix_cache_hit_rate" and promql.prefix_hits_increase and promql.prefix_queries_increase:
        hits, queries = (
            PromQL.window(promql.prefix_hits_increase, window),
            PromQL.window(promql.prefix_queries_increase, window),
        )
        return f"{hits} / {queries} < {rule.below:g}"
    if name == "offload_usage" and promql.offload_usage:
        return f"{promql.offload_usage} > {rule.above:g}"
    if name == "offload_load_latency" and promql.offload_load_seconds_increase and promql.offload_loads_increase:
        seconds = PromQL.window(promql.offload_load_seconds_increase, window)
        loads = PromQL.window(promql.offload_loads_increase, window)
        return f"1000 * {seconds} / ({loads} > 0) > {rule.above_ms:g}"
    return None


def _rule(
    kind: AlertKind,
    expr: str,
    engine: str,
    runbook_url: str,
    *,
    hold: str | None = None,
    keep_firing: str | None = None,
) -> dict:
    rule: dict = {"alert": kind.name, "expr": expr}
    if hold:
        rule["for"] = hold
    if keep_firing:
        rule["keep_firing_for"] = keep_firing
    rule["labels"] = {"severity": kind.severity, "serving_engine": engine}
    rule["annotations"] = kind.annotations(WHERE, VALUE[kind.unit], runbook_url)
    return rule


def render(
    policy: Policy,
    engine: str,
    promql: PromQL,
    *,
    fmt: str,
    runbook_url: str,
    scrape_interval: float,
    header: str,
    plan: PlanFigures | None = None,
    resource_name: str | None = None,
) -> str:
    import yaml

    groups = rule_groups(policy, engine, promql, runbook_url=runbook_url, scrape_interval=scrape_interval, plan=plan)
    document: dict[str, Any]
    if fmt == "rules":
        document = {"groups": groups}
    else:
        document = {
            "apiVersion": "monitoring.coreos.com/v1",
            "kind": "PrometheusRule",
            "metadata": {
                "name": resource_name or f"kvops-{engine}",
                "labels": {
                    "app.kubernetes.io/name": "kvops",
                    "app.kubernetes.io/component": "alert-rules",
                    "prometheus": "k8s",
                    "role": "alert-rules",
                },
            },
            "spec": {"groups": groups},
        }
    comments = "".join(f"# {line}\n" if line else "#\n" for line in header.splitlines())
    return comments + yaml.safe_dump(document, sort_keys=False, width=1000, allow_unicode=True)


def alert_rules(
    engine_name: str,
    fmt: str,
    *,
    runbook_url: str = "runbooks",
    policy_path: str | None = None,
    selector: str | None = None,
    scrape_interval: float = 60.0,
    capacity: int | None = None,
    capacity_options: dict[str, object] | None = None,
    plan: PlanFigures | None = None,
    resource_name: str | None = None,
) -> str:
    """What `kvops alerts` prints (also the rules `kvops manifests` deploys, as the PrometheusRule `resource_name`),
    headed by the command that prints it."""
    from kvops import engines
    from kvops.engines.metrics import selector_matchers
    from kvops.policy import load_policy
    from kvops.render.quote import shell_word

    engine = engines.get(engine_name)
    policy = load_policy(policy_path)
    default_selector = f'{{job="{engine.name}"}}'
    selector = selector if selector is not None else default_selector
    try:
        matchers = selector_matchers(selector)
    except ValueError as exc:
        raise UsageError(f"--selector: {exc}") from None
    given = {
        "--policy": policy_path,
        "--runbook-url": runbook_url if runbook_url != "runbooks" else None,
        "--selector": selector if selector != default_selector else None,
        "--scrape-interval": f"{scrape_interval:g}" if scrape_interval != 60 else None,
        **(capacity_options or {}),
    }
    command = f"kvops alerts --engine {engine.name} --format {fmt}" + "".join(
        f" {option} {shell_word(str(value))}" for option, value in given.items() if value is not None
    )
    thresholds = ", ".join(f"{level.label} {policy.thresholds[level]:g}" for level in GRADED)
    lines = [
        f"kvops alert rules for {engine.name}, generated by `{command}`; regenerate rather than edit.",
        f"Thresholds from the policy: {thresholds} (KV usage 0-1);",
        f"level alerts hold for min_dwell_seconds {policy.min_dwell_seconds:g} both ways; stale after {policy.stale_after_failures} scrapes of {scrape_interval:g}s;",
        f"every range spans at least {MIN_SCRAPES} scrapes ({duration(MIN_SCRAPES * scrape_interval)}): a shorter one cannot fire.",
    ]
    if plan is not None:
        lines.append(
            f"Headroom from the plan: {plan.usable_tokens} KV tokens per engine, {plan.request_tokens} tokens per request (R)."
        )
    formula = engine.usage_formula(capacity)
    header = "\n".join([*lines, *filter(None, [formula])])
    promql = engine.metrics.promql(matchers, capacity)
    return render(
        policy,
        engine.name,
        promql,
        fmt=fmt,
        runbook_url=runbook_url,
        scrape_interval=scrape_interval,
        header=header,
        plan=plan,
        resource_name=resource_name,
    )
