"""A run's summary as vLLM's serving benchmark computes it, and DistServe goodput."""

from __future__ import annotations

import pytest

from kvops.simulate.results import Slo, distribution, quantile, request_rows, summarize
from kvops.simulate.run import RequestLog, RunLog, Timeline


def entry(sent: float, first: float, finished: float, tokens: int, **extra) -> RequestLog:
    return RequestLog(sent, 100, tokens, first_token=first, finished=finished, tokens=tokens, outcome="length", **extra)


def test_quantiles_interpolate_as_numpy_does():
    numpy = pytest.importorskip("numpy")
    values = sorted([0.3, 0.1, 2.5, 0.7, 0.9, 1.1, 0.2])
    for q in (50, 90, 99):
        assert quantile(values, q) == pytest.approx(numpy.percentile(values, q))
    assert distribution([]).p99 == 0.0


def test_ttft_tpot_e2e_and_goodput():
    requests = [
        entry(0.0, 0.1, 1.1, 11),  # TTFT 100 ms, TPOT 100 ms: meets 200 ms / 100 ms
        entry(0.0, 0.5, 1.5, 11),  # TTFT 500 ms: misses
        entry(1.0, 1.05, 3.05, 11),  # TPOT 200 ms: misses
        RequestLog(2.0, 100, 10, outcome="unserved"),
    ]
    log = RunLog(requests, gaps=__import__("array").array("d", [0.1] * 10), timeline=Timeline(), end_s=4.0)
    summary = summarize(log, Slo(ttft_s=0.2, tpot_s=0.1))
    assert summary.requests == 4 and summary.completed == 3 and summary.unserved == 1
    assert summary.ttft.mean == pytest.approx((0.1 + 0.5 + 0.05) / 3)
    assert summary.tpot.mean == pytest.approx((0.1 + 0.1 + 0.2) / 3)
    assert summary.e2e.p50 == pytest.approx(1.5)
    assert summary.slo_met == 1
    assert summary.goodput_rps == pytest.approx(1 / 4.0)
    assert summary.attainment == pytest.approx(1 / 4)
    assert summary.throughput_rps == pytest.approx(3 / 4.0)
    rows = request_rows(log, Slo(0.2, 0.1))
    assert rows[0]["ttft_ms"] == 100.0 and rows[0]["slo_met"] is True
    assert rows[3]["e2e_ms"] == "" and rows[3]["outcome"] == "unserved"


def test_a_single_token_request_has_no_tpot_and_meets_any_tpot_target():
    log = RunLog([entry(0.0, 0.1, 0.1, 1)], gaps=__import__("array").array("d"), timeline=Timeline(), end_s=0.1)
    summary = summarize(log, Slo(ttft_s=1.0, tpot_s=0.001))
    assert summary.slo_met == 1
    assert summary.tpot.mean == 0.0
