"""`kvops simulate`'s figures against their definitions, and its answers against each other: what a capacity
planner reads off one run must be what another run of the same question gives."""

from __future__ import annotations

import csv
import json

import pytest

from kvops.simulate.simulation import at_rate
from kvops.simulate.traffic import Traffic, build_trace

L4 = ("-m", "llama-3.1-8b", "--gpu", "L4", "--max-model-len", "4096")


def arrivals(trace) -> list[float]:
    return [request.arrival_s for request in trace.requests]


@pytest.mark.parametrize("requests", [30, 200])
def test_a_rate_the_search_tries_replays_as_rate_replays_it(requests):
    """`--max-rate` scaled drawn arrivals to a mean rate of (n - 1) / span, where `--rate R` draws them as vLLM's
    benchmark does (the last at n / R): its answer R, typed back as --rate R, replayed other arrivals (200 requests
    at --rate 5: the search's 7.144/s was --rate 7.116; 30 requests, 1.6% apart)."""
    drawn = build_trace(Traffic(rate=5.0, requests=requests))
    for rate in (2.5, 7.1441, 11.0):
        wanted = arrivals(build_trace(Traffic(rate=rate, requests=requests)))
        assert arrivals(at_rate(drawn, rate)) == pytest.approx(wanted, rel=1e-9)


def test_an_untimed_trace_sent_at_a_rate_is_searched_in_the_rates_rate_names(tmp_path):
    path = tmp_path / "untimed.jsonl"
    path.write_text("".join(json.dumps({"prompt_tokens": 100, "output_tokens": 20}) + "\n" for _ in range(40)))
    sent = build_trace(Traffic(trace=str(path), rate=3.0))
    wanted = arrivals(build_trace(Traffic(trace=str(path), rate=9.0)))
    assert arrivals(at_rate(sent, 9.0)) == pytest.approx(wanted, rel=1e-9)


def test_a_timed_trace_is_searched_at_its_mean_rate_as_rate_scales_it(tmp_path):
    path = tmp_path / "timed.jsonl"
    lines = [{"arrival_s": 1.0 + 0.3 * index**1.1, "prompt_tokens": 100, "output_tokens": 20} for index in range(40)]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    own = build_trace(Traffic(trace=str(path)))
    wanted = arrivals(build_trace(Traffic(trace=str(path), rate=6.0)))
    assert arrivals(at_rate(own, 6.0)) == pytest.approx(wanted, rel=1e-9)


@pytest.mark.vllm
def test_a_rate_search_on_latencies_read_as_a_lower_bound_says_its_answers_are_bounds_too(run_kvops):
    """On a GPU no public run scores, the latencies were said to be a lower bound and the max rate and the replicas
    were printed as plain answers: a step time that runs fast finds a rate too high and too few replicas."""
    ran = run_kvops("simulate", *L4, "--requests", "80", "--rate", "2", "--replicas", "20")
    doc = ran.stdout.splitlines()
    rate = next(line for line in doc if line.startswith("max rate")).split()[2]
    replicas = next(line for line in doc if line.startswith("replicas")).split()[1]
    assert "read its latencies as a lower bound" in ran.stderr
    assert (
        f"with latencies read as a lower bound, read the max rate ({rate} requests/s) as an upper bound and the "
        f"replicas ({replicas}) as a lower bound" in ran.stderr
    )


@pytest.mark.vllm
def test_a_max_rate_a_short_trace_meets_only_while_its_queue_builds_is_said_not_to_hold(run_kvops):
    """80 requests at --rate 2 on an L4 searched 25.9/s: the trace arrives in 3 s and drains long after; the same
    traffic twice over at that rate meets the SLO for 44% (1,000 requests at the 7.1/s 200 requests found: 21%)."""
    ran = run_kvops("simulate", *L4, "--requests", "80", "--rate", "2", "--max-rate", "--json")
    search = json.loads(ran.stdout)["max_rate"]
    twice = search["twice_over"]
    assert twice["rate_rps"] == search["max_rate_rps"] and twice["slo_attainment"] < 0.9
    assert search["sustained"] is False
    warning = next(line for line in json.loads(ran.stdout)["warnings"] if line.startswith("--max-rate: at "))
    assert "the trace twice over (160 requests back to back) meets the SLO for" in warning
    assert "read the max rate as an upper bound and the replicas from it as a lower one" in warning
    text = run_kvops("simulate", *L4, "--requests", "80", "--rate", "2", "--max-rate").stdout
    assert "the max rate does not hold: read it as an upper bound" in text


@pytest.mark.vllm
def test_throughput_and_goodput_are_over_the_first_send_to_the_last_answer(run_kvops, tmp_path):
    """The span ended at the last step, before the API server's time on its answer (8 ms on the gpu profile)."""
    path = tmp_path / "rows.csv"
    ran = run_kvops("simulate", *L4, "--requests", "30", "--rate", "4", "--csv", str(path), "--json")
    arm = json.loads(ran.stdout)["arms"][0]
    rows = list(csv.DictReader(path.open()))
    first = min(float(row["sent_ms"]) for row in rows)
    last = max(float(row["sent_ms"]) + float(row["e2e_ms"]) for row in rows if row["e2e_ms"])
    assert arm["duration_s"] == pytest.approx((last - first) / 1000, abs=2e-3)
    met = sum(row["slo_met"] == "True" for row in rows)
    assert arm["goodput_rps"] == pytest.approx(met / ((last - first) / 1000), rel=1e-3)
