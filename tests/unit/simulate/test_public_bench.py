"""bench/data/public_bench.json: every run cites its source and carries what bench/simulate_public_bench.py needs;
the script's arguments for `kvops simulate` are the run's setup."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

from kvops.model.catalog import find

BENCH = Path(__file__).resolve().parents[3] / "bench"


def _script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("simulate_public_bench", BENCH / "simulate_public_bench.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("simulate_public_bench", module)
    spec.loader.exec_module(module)
    return module


SCRIPT = _script()
RUNS = SCRIPT.load()


def test_runs_are_many_and_distinct() -> None:
    ids = [run["id"] for run in RUNS]
    assert len(ids) >= 10 and len(set(ids)) == len(ids)


@pytest.mark.parametrize("run", RUNS, ids=lambda run: run["id"])
def test_run_cites_its_source_and_setup(run: dict) -> None:
    assert run["source"].startswith("https://")
    assert run["posted"][:2] == "20" and run["release"] and run["release_bound"]
    assert run["gpu"] and run["tp"] >= 1 and isinstance(run["moe"], bool)
    assert find(run["kvops_model"]) is not None
    traffic, measured = run["traffic"], run["measured"]
    assert traffic["dataset"] in ("random", "sharegpt") and traffic["request_rate"] == "inf"
    if traffic["dataset"] == "random":
        expected = traffic["num_prompts"] * traffic["random_output_len"]
        assert measured["total_output_tokens"] >= 0.99 * expected  # --max-tokens exact holds
    for field in ("completed", "total_input_tokens", "total_output_tokens", "mean_ttft_ms", "mean_tpot_ms"):
        assert measured[field] > 0
    assert measured["output_throughput"] == pytest.approx(
        measured["total_output_tokens"] / measured["duration_s"], rel=0.01
    )


def test_random_run_arguments() -> None:
    run = next(run for run in RUNS if run["id"] == "qwen3-14b-h100-random-4k")
    args = SCRIPT.kvops_args(run, seed=2)
    assert args[:7] == ["simulate", "-m", "qwen3-14b", "--gpu", "H100-80GB", "--tp", "1"]
    pairs = dict(zip(args[1::2], args[2::2], strict=False))
    assert pairs["--engine-version"] == "0.11.0" and pairs["--gpu-memory-utilization"] == "0.9"
    assert args[args.index("--prompt-tokens") + 1] == "fixed:3996"  # 1,997,942 input tokens over 500 requests
    assert args[args.index("--output-tokens") + 1] == "fixed:200"
    assert args[args.index("--concurrency") + 1] == "500"  # --request-rate inf: all sent at once
    assert args[args.index("--max-tokens") + 1] == "exact" and args[-3:] == ["--seed", "2", "--json"]
    assert SCRIPT.caveats(run)  # vLLM 0.11.0 ran without async scheduling


def test_sharegpt_run_arguments() -> None:
    run = next(run for run in RUNS if run["id"] == "qwen3-8b-h100-sharegpt-c8")
    args = SCRIPT.kvops_args(run)
    assert args[args.index("--prompt-tokens") + 1] == "lognormal:mean=232.6,sigma=1.2"
    assert args[args.index("--output-tokens") + 1] == "lognormal:mean=220.6,sigma=1.0"
    assert args[args.index("--concurrency") + 1] == "8" and args[args.index("--requests") + 1] == "100"


def test_flags_the_run_names_are_passed() -> None:
    run = next(run for run in RUNS if run["id"] == "gpt-oss-120b-h100-tp2-sharegpt")
    args = SCRIPT.kvops_args(run)
    assert args[args.index("--tp") + 1] == "2" and args[args.index("--max-model-len") + 1] == "32768"
    assert not SCRIPT.caveats(run)  # it asked for --async-scheduling, as kvops simulates


def test_signed_errors_and_summary() -> None:
    run = {"id": "x", "gpu": "H100-80GB", "release": "0.11.0", "moe": False, "traffic": {"max_concurrency": 4}}
    run["measured"] = {"mean_ttft_ms": 100.0, "mean_tpot_ms": 10.0, "output_throughput": 1000.0}
    sim = {"TTFT": 90.0, "TPOT": 11.0, "E2E": 5.0, "throughput": 1000.0}
    errors = SCRIPT.signed_errors(run, sim)
    assert errors == pytest.approx({"TTFT": -0.1, "TPOT": 0.1, "throughput": 0.0})  # no E2E measured: none scored
    lines = SCRIPT.summary_lines([run], {"x": errors})
    assert any(line.startswith("vLLM 0.11") and "10.0% (-10%)" in line for line in lines)
    assert any(line.startswith("closed loop") for line in lines)
