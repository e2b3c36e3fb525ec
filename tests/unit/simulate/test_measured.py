"""A `vllm bench serve --save-result --save-detailed` file read back: its requests as a trace in the order they were
sent, what its clients measured of each, and every malformed file as one line naming what is wrong."""

from __future__ import annotations

import json

import pytest

from kvops.simulate.formats import detect_format, read_bench_result, read_trace
from kvops.simulate.trace import TraceError

# The keys vLLM 0.32 writes, in its order (vllm/benchmarks/serve.py: `main` puts the run's settings first, then
# `benchmark`'s result dict; the per-request lists are the order the requests were sent). Request 2 failed: vLLM
# records it with output_lens 0 and its error text.
RESULT = {
    "date": "20261205-101500",
    "endpoint_type": "vllm",
    "backend": "vllm",
    "label": None,
    "model_id": "meta-llama/Llama-3.1-8B-Instruct",
    "tokenizer_id": "meta-llama/Llama-3.1-8B-Instruct",
    "num_prompts": 4,
    "request_rate": 2.0,
    "burstiness": 1.0,
    "max_concurrency": None,
    "duration": 2.5,
    "completed": 3,
    "failed": 1,
    "total_input_tokens": 1536,
    "total_output_tokens": 448,
    "request_throughput": 1.2,
    "request_goodput": None,
    "output_throughput": 179.2,
    "total_token_throughput": 793.6,
    "input_lens": [512, 512, 256, 512],
    "output_lens": [128, 64, 0, 256],
    "ttfts": [0.031, 0.029, 0.0, 0.042],
    "itls": [[0.01] * 127, [0.01] * 63, [], [0.01] * 255],
    "latencies": [1.301, 0.659, 0.0, 2.592],
    "start_times": [5000.25, 5000.0, 5000.9, 5001.5],
    "queue_times": [0.0, 0.0, 0.0, 0.0],
    "generated_texts": ["...", "...", "", "..."],
    "errors": ["", "", "ClientResponseError: 500", ""],
    "max_output_tokens_per_s": 300.0,
    "max_concurrent_requests": 3,
    "rtfx": 0.0,
}


@pytest.fixture(params=[None, 4], ids=["one line", "indented"])
def result_file(request, tmp_path):
    path = tmp_path / "vllm-bench.json"
    path.write_text(json.dumps(RESULT, indent=request.param))
    return path


def test_the_requests_are_replayed_when_they_were_sent_and_the_failed_one_left_out(result_file):
    assert detect_format(str(result_file)) == "vllm_bench"
    measured = read_bench_result(result_file)
    trace = measured.trace
    assert [request.arrival_s for request in trace.requests] == [0.0, 0.25, 1.5]
    assert [(request.prompt_tokens, request.output_tokens) for request in trace.requests] == [
        (512, 64),
        (512, 128),
        (512, 256),
    ]
    assert trace.timed and trace.skipped == measured.failed == 1
    assert "vLLM bench serve result, 3 requests, 1 failed requests left out" in trace.source
    assert read_trace(result_file).requests == trace.requests  # --trace takes it as well


def test_the_measurements_follow_vllms_own_definitions(result_file):
    measured = read_bench_result(result_file)
    assert [request.ttft_s for request in measured.requests] == [0.029, 0.031, 0.042]
    # TPOT = (latency - TTFT) / (output tokens - 1), vllm/benchmarks/serve.py calculate_metrics
    assert measured.requests[0].tpot_s == pytest.approx((0.659 - 0.029) / 63)
    figures = measured.figures()
    assert figures.ttft.mean == pytest.approx((0.029 + 0.031 + 0.042) / 3)
    assert figures.e2e.p50 == pytest.approx(1.301)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"start_times": None}, "no start_times: run `vllm bench serve` with --save-result --save-detailed"),
        ({"latencies": [1.3, 0.6]}, "latencies hold(s) a different number of requests than start_times (4)"),
        ({"ttfts": [0.03, -1, 0, 0.04]}, "ttfts[1]: expected a number of seconds of at least 0, got -1"),
        ({"input_lens": [512, 1.5, 256, 512]}, "input_lens[1]: expected a positive number of tokens, got 1.5"),
        ({"latencies": [1.3, 0.01, 0, 2.5]}, "request 1: latencies 0.01 is below its ttfts 0.029"),
        ({"errors": ["x", "x", "x", "x"]}, "no request succeeded (4 in the file, 4 failed)"),
        ({"errors": "none"}, "errors: expected a list of 4 strings, one per request"),
    ],
)
def test_a_malformed_result_is_one_line_naming_the_field(tmp_path, change, message):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps({**RESULT, **change}))
    with pytest.raises(TraceError) as error:
        read_bench_result(path)
    assert message in str(error.value) and str(path) in str(error.value)


def test_not_json_is_one_line(tmp_path):
    path = tmp_path / "cut.json"
    path.write_text(json.dumps(RESULT)[:200])
    with pytest.raises(TraceError, match=r"cut\.json: not JSON"):
        read_bench_result(path)
