"""`kvops lint` on real public files (tests/fixtures/lint, sources in SOURCES.md) and on kvops's own configs/."""

from __future__ import annotations

import json

import pytest

from tests.support.paths import REPO

FIXTURES = REPO / "tests" / "fixtures" / "lint"
DASHBOARD = FIXTURES / "production-stack-vllm-dashboard.json"


def findings(run_kvops, *args: str, expect: int) -> list[dict]:
    return json.loads(run_kvops("lint", "--json", *args, expect=expect).stdout)["findings"]


def test_finds_the_removed_kv_usage_in_production_stacks_dashboard(run_kvops):
    found = {(f["line"], f["name"], f["problem"]) for f in findings(run_kvops, str(DASHBOARD), expect=1)}
    assert found == {
        (93, "vllm:healthy_pods_total", "another component's"),
        (308, "vllm:current_qps", "another component's"),
        (372, "vllm:time_per_output_token_seconds", "removed"),
        (732, "vllm:gpu_cache_usage_perc", "removed"),
        (825, "vllm:gpu_prefix_cache_hits", "removed"),
        (825, "vllm:gpu_prefix_cache_queries", "removed"),
        (892, "vllm:num_requests_swapped", "removed"),
        (998, "vllm:gpu_cache_usage_perc", "removed"),
    }
    text = run_kvops("lint", str(DASHBOARD), expect=1).stdout
    assert (
        f"{DASHBOARD}:732: vllm:gpu_cache_usage_perc: removed in vLLM 0.34 (deprecated in 0.10, hidden in 0.11, "
        "removed in 0.12: vllm-project/vllm#18354, hidden #24245, removed #29330); use vllm:kv_cache_usage_perc"
    ) in text
    assert text.splitlines()[-1] == "6 finding(s) that fail, 2 note(s)"


def test_the_release_decides_removed_hidden_or_fine(run_kvops):
    def state(release: str) -> set[str]:
        rows = findings(run_kvops, "--release", f"vllm={release}", str(DASHBOARD), expect=None)
        return {f["problem"] for f in rows if f["name"] == "vllm:gpu_cache_usage_perc"}

    assert (state("0.9"), state("0.10"), state("0.11"), state("0.12")) == (
        set(),
        {"deprecated"},
        {"hidden"},
        {"removed"},
    )


def test_router_metrics_are_notes_not_failures(run_kvops):
    rows = findings(run_kvops, str(FIXTURES / "production-stack-prom-adapter.yaml"), expect=0)
    assert {(f["name"], f["fails"]) for f in rows} == {("vllm:num_incoming_requests", False)}


def test_kvops_own_configs_are_clean(run_kvops):
    assert run_kvops("lint", str(REPO / "configs")).stdout == "0 finding(s) that fail, 0 note(s)\n"


def test_a_fallback_beside_its_replacement_and_short_ranges(run_kvops, tmp_path):
    rules = tmp_path / "rules.yaml"
    rules.write_text(
        "groups:\n- name: g\n  rules:\n"
        "  - alert: A\n    expr: vllm:kv_cache_usage_perc or vllm:gpu_cache_usage_perc > 0.9\n"
        "  - alert: EngineStalled\n    expr: increase(vllm:generation_tokens_total[30s]) == 0\n"
        "  - alert: B\n    expr: tgi_queue_size > 3 and tgi_kv_cache_usage > 0.9\n"
    )
    rows = findings(run_kvops, "--scrape-interval", "60", str(rules), expect=1)
    assert [(f["line"], f["name"], f["problem"]) for f in rows] == [
        (7, "[30s]", "range too short"),
        (9, "tgi_kv_cache_usage", "not exported"),
    ]
    assert "use at least [240s]" in rows[0]["message"]
    assert findings(run_kvops, "--scrape-interval", "15", str(rules), expect=1)[0]["line"] == 9


@pytest.mark.parametrize(
    "args, message",
    [
        (["--release", "vllm=x"], "'vllm=x': want ENGINE=RELEASE, ENGINE one of vllm, tgi"),
        (["--release", "sglang=1.0"], "'sglang=1.0': want ENGINE=RELEASE"),
        (["/no/such/file"], "'/no/such/file' does not exist"),
    ],
)
def test_mistakes_are_one_line(run_kvops, args, message):
    result = run_kvops("lint", *args, *([] if args[0].startswith("/") else [str(DASHBOARD)]), expect=2)
    assert message in result.stderr and "Traceback" not in result.stderr


def test_the_metrics_added_in_032_to_034_are_known_and_watermark_requests_is_no_kv_headroom(run_kvops, tmp_path):
    """vLLM 0.32-0.34 add admission_rejections, num_requests_waiting_by_reason, prompt_tokens_cached_by_source and
    kv_offload_config_info (the 0.34.0 wheel registers them); vllm:watermark_requests counts output-text watermarking,
    so a rule reading it as KV headroom fails, and a plain mention is a note."""
    rules = tmp_path / "rules.yaml"
    rules.write_text(
        "- expr: sum(rate(vllm:admission_rejections_total[5m])) > 0\n"
        '- expr: vllm:num_requests_waiting_by_reason{reason="capacity"} > 0\n'
        "- expr: rate(vllm:prompt_tokens_cached_by_source_total[5m])\n"
        "- expr: vllm:kv_offload_config_info\n"
        "- alert: KVHeadroomLow\n  expr: rate(vllm:watermark_requests_total[5m]) < 1 # KV headroom\n"
        "- expr: sum by (status) (rate(vllm:watermark_requests_total[5m]))\n"
    )
    rows = findings(run_kvops, str(rules), expect=1)
    assert {(f["line"], f["name"], f["problem"], f["fails"]) for f in rows} == {
        (6, "vllm:watermark_requests", "misread", True),
        (7, "vllm:watermark_requests", "misread", False),
    }
    assert "output-text watermark status" in rows[0]["message"]
