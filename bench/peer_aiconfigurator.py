"""NVIDIA AIConfigurator, run live on the measured points kvops simulate is scored on, with the same accuracy table.

    python bench/peer_aiconfigurator.py [--aiconfigurator-python PATH] [--kvops-json /tmp/accuracy.json]

AIConfigurator (PyPI `aiconfigurator`, written against 0.12.0) lives in its own environment; this bench runs in
kvops' interpreter and calls it in a subprocess (this same file with --worker). Without --aiconfigurator-python it
must be importable here; else: python -m venv v && v/bin/pip install aiconfigurator==0.12.0, and pass
--aiconfigurator-python v/bin/python.

What is run: the experiments bench/simulate_accuracy.py scores (bench/data/sim_to_real.json, vLLM 0.15.1 on H100,
those kvops can plan), each stage through `aiconfigurator.cli.api.cli_estimate` in aggregated (IFB) mode: system
h100_sxm, backend vllm (its newest H100 database; trtllm only where vllm fails, and the output says so), the run's
tp (MoE experts TP-sharded, as vLLM does without expert parallelism), the workload's fixed prompt and output
lengths, its shared system prompt as `prefix`, vLLM's max_num_batched_tokens as `ctx_tokens`. The model is the
published config.json: AIConfigurator's own cached copy where it has one, else kvops' catalog copy of the same
file in a local folder (what AIConfigurator would download from Hugging Face, which this machine cannot reach).

AIConfigurator has no queueing model: it predicts latency at a given batch size. Each stage's batch is found as its
user would, from the stage's offered rate and AIConfigurator's own predicted request latency, never the measured
one: concurrency = rate x E2E(concurrency) (Little's law), iterated to a fixed point from 1, capped at 512 and at
the engine's max_num_seqs, and where AIConfigurator finds that many requests' KV out of GPU memory, the largest
batch that fits (bisected; the stage is then marked memory-limited). Its figures at that batch: TTFT its prefill
latency, TPOT its decode step time, E2E its request latency, throughput min(rate, concurrency / E2E). Stages are
combined as simulate_accuracy.py does (means weighted by requests per stage; throughput = completed / run length).

What is not: E2E p90 (AIConfigurator gives means only); models it cannot build (an architecture outside its
families, no config) are skipped, counted and named. kvops' leave-one-out errors on the same experiments are shown
beside it when the JSON of `python bench/simulate_accuracy.py --json /tmp/accuracy.json` exists.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

SYSTEM = "h100_sxm"
BACKENDS = ("vllm", "trtllm")
CONCURRENCY_CAP = 512
MAX_ITERATIONS = 40
MARK = "@@aic "  # the worker's result lines, apart from whatever AIConfigurator prints
INSTALL = "python -m venv v && v/bin/pip install aiconfigurator==0.12.0, then pass --aiconfigurator-python v/bin/python"


# ---- the worker: runs in AIConfigurator's interpreter, one JSON job per stdin line, one result line per job ----


def worker() -> None:
    import logging

    logging.disable(logging.WARNING)
    folders = tempfile.TemporaryDirectory()
    for line in sys.stdin:
        job = json.loads(line)
        try:
            result = settle(job, model_path(job, Path(folders.name)))
        except Exception as exc:  # AIConfigurator's errors name what it cannot do: reported, the job skipped
            result = {"error": f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:200]}"}
        print(MARK + json.dumps({"key": job["key"], **result}), flush=True)


def model_path(job: dict[str, Any], folders: Path) -> str:
    """AIConfigurator's cached config where it has one, else the job's config.json in a local folder."""
    from aiconfigurator_core.sdk.common import ARCHITECTURE_TO_MODEL_FAMILY, DefaultHFModels

    config = job["config"]
    if job["model"] in DefaultHFModels or not config:
        return job["model"]
    architectures = config.get("architectures") or []
    if not any(name in ARCHITECTURE_TO_MODEL_FAMILY for name in architectures):
        named = (
            ", ".join(architectures) or f"model_type {config.get('model_type')!r} (its config names no architecture)"
        )
        raise ValueError(f"no aiconfigurator model family for {named}")
    folder = folders / job["model"].replace("/", "--")
    folder.mkdir(exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config))
    return str(folder)


def estimate(job: dict[str, Any], path: str, batch: int, backend: str) -> Any:
    from aiconfigurator.cli.api import cli_estimate

    moe = {"moe_tp_size": job["tp"], "moe_ep_size": 1} if job["moe"] else {}
    return cli_estimate(
        path,
        SYSTEM,
        backend_name=backend,
        isl=job["isl"],
        osl=job["osl"],
        prefix=job["prefix"],
        ctx_tokens=job["ctx_tokens"],
        batch_size=batch,
        tp_size=job["tp"],
        **moe,
    )


def first_backend(job: dict[str, Any], path: str) -> tuple[str, Any]:
    """vllm, or the first backend whose database serves the job; the error is vllm's when none does."""
    failure: Exception | None = None
    for backend in BACKENDS:
        try:
            return backend, estimate(job, path, 1, backend)
        except Exception as exc:
            failure = failure or exc
    assert failure is not None
    raise failure


def settle(job: dict[str, Any], path: str) -> dict[str, Any]:
    """The stage at the concurrency where rate x predicted E2E gives back the same concurrency; where that many
    requests' KV does not fit (AIConfigurator's OOM), the largest batch that does."""
    backend, result = first_backend(job, path)
    batch, seen, limited = 1, {1}, False
    for _ in range(MAX_ITERATIONS):
        wanted = min(job["cap"], max(1, round(job["rate"] * result.raw["request_latency"] / 1000)))
        if wanted in seen:
            break
        seen.add(wanted)
        bigger = fitting(job, path, wanted, backend)
        if bigger is None:
            batch, result = largest_fitting(job, path, backend, (batch, result), wanted)
            limited = True
            break
        batch, result = wanted, bigger
    return {
        "concurrency": batch,
        "ttft_ms": float(result.ttft),
        "tpot_ms": float(result.tpot),
        "e2e_ms": float(result.raw["request_latency"]),
        "backend": f"{backend} {result.backend_version}",
        "memory_limited": limited,
    }


def fitting(job: dict[str, Any], path: str, batch: int, backend: str) -> Any | None:
    """The estimate at this batch, None where AIConfigurator finds it out of GPU memory."""
    try:
        return estimate(job, path, batch, backend)
    except RuntimeError as exc:
        if str(exc).startswith("OOM"):
            return None
        raise


def largest_fitting(job: dict[str, Any], path: str, backend: str, low: tuple[int, Any], high: int) -> tuple[int, Any]:
    """Bisection between a batch that fits (with its estimate) and one that does not."""
    while high - low[0] > 1:
        middle = (low[0] + high) // 2
        found = fitting(job, path, middle, backend)
        if found is None:
            high = middle
        else:
            low = (middle, found)
    return low


# ---- the bench: runs in kvops' interpreter ----


def aiconfigurator_python(given: str | None) -> str:
    if given:
        return given
    if importlib.util.find_spec("aiconfigurator") is None:
        sys.exit(f"aiconfigurator is not importable here: {INSTALL}")
    return sys.executable


def stage_jobs(experiment: Any) -> list[dict[str, Any]]:
    from kvops.model.catalog import find

    entry = find(experiment.model)
    engine = experiment.engine
    return [
        {
            "key": f"{experiment.id}#{stage.index}",
            "model": experiment.model,
            "config": entry.config if entry else None,
            "tp": experiment.tp,
            "moe": experiment.kind == "moe",
            "isl": experiment.prompt_tokens,
            "osl": experiment.output_tokens,
            "prefix": experiment.prefix_tokens,
            "ctx_tokens": engine.get("max_num_batched_tokens"),
            "rate": stage.rate_rps,
            "cap": min(CONCURRENCY_CAP, engine.get("max_num_seqs") or CONCURRENCY_CAP),
        }
        for stage in experiment.stages
    ]


def run_worker(python: str, jobs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Every job through one AIConfigurator process; its stderr is shown only if it dies."""
    command = [python, str(Path(__file__).resolve()), "--worker"]
    results: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryFile("w+") as errors_file:
        process = subprocess.Popen(
            command,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=errors_file,
            text=True,
            cwd=tempfile.gettempdir(),
        )
        assert process.stdin is not None and process.stdout is not None
        process.stdin.write("".join(json.dumps(job) + "\n" for job in jobs))
        process.stdin.close()
        for line in process.stdout:
            if line.startswith(MARK):
                result = json.loads(line[len(MARK) :])
                results[result.pop("key")] = result
                if len(results) % 10 == 0:
                    print(f"  {len(results)}/{len(jobs)} stages estimated", flush=True)
        if process.wait() != 0:
            errors_file.seek(0)
            sys.exit(f"the aiconfigurator worker failed ({process.returncode}):\n{errors_file.read()[-3000:]}")
    return results


def whole_run(experiment: Any, stages: list[dict[str, Any]]) -> dict[str, float]:
    """The stages as one run: means weighted by the requests each sent; completed requests over the run's length."""
    weights = [stage.rate_rps * stage.duration_s for stage in experiment.stages]
    share = [weight / sum(weights) for weight in weights]
    completed = sum(
        min(stage.rate_rps, figures["concurrency"] / (figures["e2e_ms"] / 1000)) * stage.duration_s
        for stage, figures in zip(experiment.stages, stages)
    )
    return {
        "e2e_mean_ms": sum(part * figures["e2e_ms"] for part, figures in zip(share, stages)),
        "ttft_mean_ms": sum(part * figures["ttft_ms"] for part, figures in zip(share, stages)),
        "tpot_mean_ms": sum(part * figures["tpot_ms"] for part, figures in zip(share, stages)),
        "throughput_rps": completed / sum(stage.duration_s for stage in experiment.stages),
    }


def score(
    chosen: list[Any], results: dict[str, dict[str, Any]]
) -> tuple[dict[str, dict[str, float]], dict[str, str], list[str]]:
    """Errors per predicted experiment id, the backend each used, and a line per skipped experiment."""
    from simulate_accuracy import errors

    scored, backends, skipped = {}, {}, []
    for experiment in chosen:
        stages = [results[f"{experiment.id}#{stage.index}"] for stage in experiment.stages]
        failed = next((stage["error"] for stage in stages if "error" in stage), None)
        if failed:
            skipped.append(f"{experiment.short} ({experiment.model}): {failed}")
            continue
        scored[experiment.id] = errors(whole_run(experiment, stages), experiment.measured)
        backends[experiment.id] = stages[0]["backend"]
        batches = "/".join(str(stage["concurrency"]) for stage in stages)
        warned = " [batch limited by KV memory]" if any(stage["memory_limited"] for stage in stages) else ""
        shown = ", ".join(f"{metric} {100 * error:.1f}%" for metric, error in scored[experiment.id].items())
        print(f"  {experiment.short} ({backends[experiment.id]}, concurrency {batches}){warned}: {shown}")
    return scored, backends, skipped


def kvops_errors(path: Path) -> dict[str, dict[str, float]]:
    """kvops' errors per experiment id from simulate_accuracy.py --json; empty when the file is absent."""
    if not path.exists():
        return {}
    return {row["id"]: row["errors"] for row in json.loads(path.read_text())}


def recorded_peer(chosen: list[Any], ids: set[str]) -> list[dict[str, float]]:
    """sim-to-real's recorded AIConfigurator 0.9.0 figures, on those of the experiments that have them."""
    from simulate_accuracy import errors

    found = []
    for experiment in chosen:
        figures = experiment.peers.get("aiconfigurator-estimate")
        if experiment.id in ids and figures:
            found.append(errors(figures, experiment.measured))
    return found


TITLES = {  # queued: the table's title, kvops' row
    False: ("the experiments simulate_accuracy.py scores", "kvops simulate, leave-one-out"),
    True: ("the queue-dominated runs it scores apart", "kvops simulate, shipped coefficients"),
}


def tables(
    chosen: list[Any], scored: dict[str, dict[str, float]], kvops: dict[str, dict[str, float]], backend: str
) -> None:
    from simulate_accuracy import median_table

    for queued, (title, kvops_name) in TITLES.items():
        group = [experiment for experiment in chosen if experiment.queued == queued and experiment.id in scored]
        if group:
            print(f"\n{title}, those aiconfigurator predicted (median absolute percentage error over experiments):")
            print(
                "\n".join(
                    median_table(group_rows(group, {f"aiconfigurator live ({backend})": scored, kvops_name: kvops}))
                )
            )


def group_rows(group: list[Any], sources: dict[str, dict[str, dict[str, float]]]) -> dict[str, list[dict[str, float]]]:
    """Each source's errors (AIConfigurator's, kvops'), all and by model kind, where it has every experiment."""
    rows: dict[str, list[dict[str, float]]] = {}
    for name, found in sources.items():
        if not all(item.id in found for item in group):
            print(f"  ({name}: no figures for some of these; run simulate_accuracy.py --json without --no-queued)")
            continue
        rows[name] = [found[item.id] for item in group]
        for kind in ("dense", "moe"):
            rows[f"  {name.split()[0]}, {kind}"] = [found[item.id] for item in group if item.kind == kind]
    recorded = recorded_peer(group, {item.id for item in group})
    if recorded:
        rows["aiconfigurator 0.9.0 (sim-to-real's recorded)"] = recorded
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--aiconfigurator-python", help="an interpreter with aiconfigurator installed")
    parser.add_argument("--kvops-json", default="/tmp/accuracy.json", help="simulate_accuracy.py --json output")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    options = parser.parse_args()
    if options.worker:
        worker()
        return
    python = aiconfigurator_python(options.aiconfigurator_python)
    from fit_steptime import plannable
    from sim_experiments import experiments

    started = time.monotonic()
    chosen = [experiment for experiment in experiments() if plannable(experiment)]
    jobs = [job for experiment in chosen for job in stage_jobs(experiment)]
    print(f"{len(chosen)} experiments, {len(jobs)} stages through aiconfigurator ({python})", flush=True)
    scored, backends, skipped = score(chosen, run_worker(python, jobs))
    used = sorted(set(backends.values()))
    if any(not name.startswith("vllm") for name in used):
        print(f"\nnote: vllm's database did not serve every model; backends used: {', '.join(used)}")
    tables(chosen, scored, kvops_errors(Path(options.kvops_json)), " / ".join(used))
    print(f"\nskipped {len(skipped)} of {len(chosen)} experiments (aiconfigurator could not build the model):")
    print("\n".join(f"  {line}" for line in skipped) or "  none")
    print(f"\nwall time {time.monotonic() - started:.0f} s")


if __name__ == "__main__":
    main()
