"""`kvops alerts`: Prometheus alerting rules for the watcher's alerts, thresholds from the same policy.

Each alert of `alerts.catalogue` becomes a rule whose expression computes what the watcher computes (see
`signals`): usage >= threshold for the levels, the queue-growth, preemption, stall and hit-rate windows of the
policy, and a metrics-stale rule (target down, or up without the KV usage series). Level rules fire after
`min_dwell_seconds` and keep firing `min_dwell_seconds` after usage drops (`for`, `keep_firing_for`), the
policy's own guard against flapping.
"""

from __future__ import annotations

from kvops.engines.metrics import PromQL, duration
from kvops.errors import UsageError
from kvops.policy import GRADED, Policy
from kvops.watch.alerts import LEVEL_ALERTS, SIGNAL_ALERTS, STALE_ALERT, AlertKind, catalogue

WHERE = "{{ $labels.instance }}"
VALUE = {
    "ratio": "{{ $value | humanizePercentage }}",
    "count": "{{ $value }}",
    "text": "target down, or up without the KV usage series",
}


def rule_groups(policy: Policy, engine: str, promql: PromQL, *, runbook_url: str, scrape_interval: float) -> list[dict]:
    kinds = {kind.name: kind for kind in catalogue(policy, engine)}
    dwell = duration(policy.min_dwell_seconds) if policy.min_dwell_seconds > 0 else None
    rules = []
    for level in GRADED:
        expr = f"{promql.usage} >= {policy.thresholds[level]:g}"
        rules.append(_rule(kinds[LEVEL_ALERTS[level]], expr, engine, runbook_url, hold=dwell, keep_firing=dwell))
    for name, rule in policy.signals.items():
        if SIGNAL_ALERTS[name] in kinds:
            expr = _signal_expr(name, rule, promql)
            if expr:
                rules.append(_rule(kinds[SIGNAL_ALERTS[name]], expr, engine, runbook_url))
    stale = f"{promql.up} == 0 or ({promql.up} == 1 unless on (job, instance) {promql.usage})"
    rules.append(
        _rule(
            kinds[STALE_ALERT], stale, engine, runbook_url, hold=duration(policy.stale_after_failures * scrape_interval)
        )
    )
    return [{"name": f"kvops-{engine}", "rules": rules}]


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
    policy: Policy, engine: str, promql: PromQL, *, fmt: str, runbook_url: str, scrape_interval: float, header: str
) -> str:
    import yaml

    groups = rule_groups(policy, engine, promql, runbook_url=runbook_url, scrape_interval=scrape_interval)
    if fmt == "rules":
        document = {"groups": groups}
    else:
        document = {
            "apiVersion": "monitoring.coreos.com/v1",
            "kind": "PrometheusRule",
            "metadata": {
                "name": f"kvops-{engine}",
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
) -> str:
    """What `kvops alerts` prints (also the rules `kvops manifests` deploys), headed by the command that prints it."""
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
        f"level alerts hold for min_dwell_seconds {policy.min_dwell_seconds:g} both ways; stale after {policy.stale_after_failures} scrapes of {scrape_interval:g}s.",
    ]
    formula = engine.usage_formula(capacity)
    header = "\n".join([*lines, *filter(None, [formula])])
    promql = engine.metrics.promql(matchers, capacity)
    return render(
        policy, engine.name, promql, fmt=fmt, runbook_url=runbook_url, scrape_interval=scrape_interval, header=header
    )
