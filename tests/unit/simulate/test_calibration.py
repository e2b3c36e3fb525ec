"""The step time calibrated to a benchmark result: on a result the simulator itself produced with a GPU 30% slower
than the shipped fit says, the fit finds the factor; the profile it writes is the one `--step-time` reads."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from kvops.deployment import DeploymentOptions
from kvops.simulate import session, steptime
from kvops.simulate.calibration import calibrate, scaled
from kvops.simulate.measured import parse_result
from kvops.simulate.simulation import run_arm
from kvops.simulate.steptime import Coefficient, StepTime
from kvops.simulate.traffic import Traffic

pytestmark = pytest.mark.vllm

DEPLOYMENT = DeploymentOptions(model="llama-3.1-8b-instruct", gpu="H100-80GB", max_model_len=8192)
SLOWER = 1.3


def bench_result(setup: session.Setup) -> dict:
    """What `vllm bench serve --save-detailed` would have recorded on that slower GPU (the lists it writes)."""
    base = setup.step_time.coefficients
    terms = {name: Coefficient(term.value * SLOWER, "test") for name, term in base.terms.items()}
    truth = replace(base, terms=terms)
    slower = replace(setup, step_time=StepTime(setup.step_time.cost, setup.step_time.hardware, truth))
    requests = run_arm(slower, "stock").log.requests
    return {
        "input_lens": [entry.prompt_tokens for entry in requests],
        "output_lens": [entry.tokens for entry in requests],
        "ttfts": [entry.first_token - entry.sent for entry in requests],
        "latencies": [entry.finished - entry.sent for entry in requests],
        "start_times": [100.0 + entry.sent for entry in requests],
        "errors": [""] * len(requests),
    }


@pytest.fixture(scope="module")
def calibrated():
    setup = session.prepare(session.Request(Traffic(requests=150, rate=20, seed=5)), DEPLOYMENT)
    measured = parse_result(bench_result(setup), "bench.json")
    return calibrate(session.prepare(session.Request(Traffic()), DEPLOYMENT, measured.trace), measured)


def test_the_fit_finds_the_slower_gpu(calibrated):
    assert calibrated.scale == pytest.approx(SLOWER, rel=0.01)
    assert calibrated.before.tpot.mean < 0.8 * calibrated.measured.tpot.mean  # the shipped fit is too fast here
    assert calibrated.after.tpot.mean == pytest.approx(calibrated.measured.tpot.mean, rel=0.002)
    assert calibrated.after.e2e.mean == pytest.approx(calibrated.measured.e2e.mean, rel=0.01)
    # the first token follows the queue and the step boundaries it meets, which a factor within 0.2% of the truth
    # moves by more (3.8% on the profile of 2026-12-06)
    assert calibrated.after.ttft.mean == pytest.approx(calibrated.measured.ttft.mean, rel=0.05)


def test_every_coefficient_keeps_its_share_and_says_where_it_came_from(calibrated):
    base, fitted = calibrated.base, calibrated.coefficients
    assert fitted.terms.keys() == base.terms.keys()
    for name, term in fitted.terms.items():
        assert term.value == pytest.approx(base.terms[name].value * calibrated.scale)
        assert "calibrated on bench.json" in term.source
    assert (fitted.api_s, fitted.input_s) == (base.api_s, base.input_s)  # what one run cannot tell apart stays


def test_the_profile_it_writes_is_what_step_time_reads(calibrated):
    again = steptime.read_coefficients(json.dumps(calibrated.profile()), "saved.json")
    assert again.values() == calibrated.coefficients.values()
    assert again.api_s.value == calibrated.coefficients.api_s.value


def test_a_calibrated_profile_drops_the_public_runs_verdict():
    gpu = steptime.coefficients("gpu")
    assert gpu.held_out
    calibrated = scaled(gpu, 1.2, "fitted on a run of your own")
    assert calibrated.held_out == () and calibrated.terms["kv"].value == pytest.approx(gpu.terms["kv"].value * 1.2)
    # the factor is measured against the base as it prices the user's GPU, its scale there included
    assert calibrated.gpu_scales == gpu.gpu_scales and calibrated.fitted_gpus == ()
