"""kvops simulate against the real vLLM engine on this machine: the same traces through the vLLM CPU engine and
through the simulator with the CPU step time fitted for the test model.

    python bench/simulate_vs_engine.py [--fit] [--reps 3] [--measured bench/data/simulate_vs_engine.json]

The engine is vLLM's CPU build serving the test model (tests/support/tiny_model.py, dummy weights) on a 4 MiB KV
pool (31 usable blocks of 128 tokens, so a burst preempts). Six traces of exact-length streamed requests:
  burst      24 requests sent at once (they preempt)
  burst-12   12 requests sent at once (they fit)
  steady     60 requests, Poisson arrivals at 3/s
  busy       60 requests, Poisson arrivals at 5/s
  overload   60 requests, Poisson arrivals at 8/s
  long       30 requests of 400-600 new tokens on 64-384-token prompts, Poisson at 2/s (contexts up to ~1,000
             tokens, as the guard's benchmark grows them)
Each runs --reps times through one engine; its figures, each request's among them, are saved to
bench/data/simulate_vs_engine.json, which --measured reads back instead of running the engine. Each trace is
simulated with the times the client really sent its requests (the median over the repetitions).

Without --fit each trace is simulated with the shipped CPU profile (kvops/catalog/step_time.json, profile "cpu").
With --fit, leave-one-out: each trace is simulated with coefficients fitted on the other five alone, and then the
profile fitted on all but overload (FITTED) is written: overload stays held out of what ships. The profile's
`held_out` (how other machines' engines ran against it: runs saved with --measured files from them, scored without
--fit) is dropped by a refit until measured again. The fit is
bench/fit_steptime.py's linearization around each schedule: the step's terms on the engine's own mean TTFT, TPOT
and E2E of each trace (vLLM's latency histograms, read from /metrics before and after each run: the API server's
arrival stamp and the engine core's token stamps), the API server's time on the clients' TTFT (the median gap),
and the API server's hand-off to the engine core (input_s, per request: the API server hands requests in one at a
time, so a burst reaches the core spread out) searched on a grid, the one whose fit leaves the least loss kept
(--no-handoff: none, as before it was priced).

Printed per trace: preemptions (engine, simulated), how alike the completion orders are (Kendall's tau over the
requests both completed, the median over the repetitions), the mean TTFT, TPOT and E2E and the median TTFT and
E2E of each as the client saw them: the engine's median over the repetitions [its range], the simulator's, and
their ratio; then the engine's own means beside the simulated engine's (its TTFT and E2E less the API server's
time); then the engine core's alone (vLLM's queue, prefill and inference histograms: from the QUEUED stamp its
scheduler puts on a request), beside the simulated core's (from when the simulated scheduler received it), with
the hand-offs the engine measured (its TTFT less queue and prefill). The range is the machine's noise: the engine
runs alone, but its 2 cores are shared with the client, which at times reads a stream hundreds of ms late (a long
TTFT, then the whole answer at once): the engine's own stamps do not see that.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "plugins"), str(REPO / "bench")]

import numpy as np  # noqa: E402
from fit_steptime import coefficient_vector, recorded_run, request_rows, update_step_time  # noqa: E402
from guard_goodput import Job, run  # noqa: E402

from kvops.simulate import steptime  # noqa: E402
from kvops.simulate.trace import Trace, TraceRequest  # noqa: E402

KV_BYTES = 4 * 1024 * 1024
MAX_MODEL_LEN = 1024
SAVED = REPO / "bench" / "data" / "simulate_vs_engine.json"
# what the shipped CPU profile is fitted on; overload is held out
FITTED = ("burst", "burst-12", "steady", "busy", "long")
CPU_HARDWARE = {
    "name": "cpu",
    "memory_bandwidth": 2.0e10,
    "flops": 2.0e11,
    "link_bandwidth": 0.0,
    "source": "nominal figures for a 2-core x86 virtual machine (20 GB/s, 200 GFLOP/s): the fitted coefficients absorb the difference",
}
# what the fit may move of the CPU step time: a step's fixed cost, the matrix multiplies, the KV read and attention
# (the rest stays 0); the API server's time (api_s) is fitted apart, on the clients' TTFT
CPU_FREE = ("step_s", "linear", "compute", "kv", "attention")
ROBUST = 0.1  # relative errors up to this weigh as squares, larger ones about linearly (the fit's soft L1 loss)
# the API server's hand-off to the engine core the fit tries (seconds): from none to a few of the CPU engine's steps
INPUT_GRID_S = (0.0, 0.001, 0.002, 0.003, 0.004, 0.006)


def traces(seed: int) -> dict[str, list[Job]]:
    rng = random.Random(f"simulate-vs-engine-{seed}")

    def job(at: float) -> Job:
        return Job(at, [rng.randrange(20, 500) for _ in range(rng.randint(32, 320))], rng.randint(16, 256), stream=True)

    def long_job(at: float) -> Job:
        return Job(
            at, [rng.randrange(20, 500) for _ in range(rng.randint(64, 384))], rng.randint(400, 600), stream=True
        )

    def poisson(count: int, rate: float, make=job) -> list[Job]:
        at, jobs = 0.0, []
        for _ in range(count):
            jobs.append(make(at))
            at += rng.expovariate(rate)
        return jobs

    return {  # in this order: each trace draws from the generator after the ones before it
        "burst": [job(0.0) for _ in range(24)],
        "burst-12": [job(0.0) for _ in range(12)],
        "steady": poisson(60, 3.0),
        "busy": poisson(60, 5.0),
        "overload": poisson(60, 8.0),
        "long": poisson(30, 2.0, long_job),
    }


def as_trace(name: str, jobs: list[Job], sent: list[float]) -> Trace:
    """The jobs as a trace sent when the client sent them (`sent`, seconds from the first; kept in job order)."""
    arrivals = np.maximum.accumulate(np.asarray(sent, dtype=float))
    requests = [
        TraceRequest(float(at), len(job.prompt), job.max_tokens, max_tokens=job.max_tokens)
        for at, job in zip(arrivals, jobs)
    ]
    return Trace(tuple(requests), name)


# the engine's own means (vLLM's latency histograms, guard_goodput.ENGINE_LATENCIES): what the client's read of the
# stream adds is not in them
ENGINE_SIDE = ("ttft_engine_mean_ms", "tpot_engine_mean_ms", "e2e_engine_mean_ms")
# the engine core's alone, from when its scheduler received each request (queue + prefill, TPOT, queue + inference):
# what the simulator computes, the hand-offs between the API server and the engine core left out
# (the engine's key, the simulated row's)
CORE_SIDE = {
    "ttft_core_mean_ms": "ttft_core_mean_ms",
    "tpot_engine_mean_ms": "tpot_mean_ms",
    "e2e_core_mean_ms": "e2e_core_mean_ms",
}
METRICS = (
    "preemptions",
    "ttft_mean_ms",
    "ttft_p50_ms",
    "tpot_mean_ms",
    "e2e_mean_ms",
    "e2e_p50_ms",
    "completed",
    *ENGINE_SIDE,
    "ttft_core_mean_ms",
    "e2e_core_mean_ms",
)
LATENCIES = ("ttft_mean_ms", "ttft_p50_ms", "tpot_mean_ms", "e2e_mean_ms", "e2e_p50_ms")
PER_REQUEST = ("sent", "ttft", "e2e", "tpot")  # seconds; None where the request did not complete


def measure(result) -> dict:
    outcomes = result.outcomes
    origin = min(o.sent for o in outcomes)
    each = {
        "sent": [o.sent - origin for o in outcomes],
        "ttft": [o.ttft if o.complete else None for o in outcomes],
        "e2e": [o.e2e if o.complete else None for o in outcomes],
        "tpot": [o.tpot if o.complete and o.tokens > 1 else None for o in outcomes],
    }
    engine = result.engine_means
    core = {}
    if {"queue", "prefill", "inference"} <= engine.keys():
        core = {
            "ttft_core_mean_ms": 1000 * (engine["queue"] + engine["prefill"]),
            "e2e_core_mean_ms": 1000 * (engine["queue"] + engine["inference"]),
        }
    return {
        "requests": each,
        "preemptions": result.preemptions,
        "order": [index for index, _ in sorted(enumerate(outcomes), key=lambda item: item[1].done or 1e9)],
        "ttft_mean_ms": 1000 * statistics.mean(o.ttft for o in outcomes if o.complete),
        "ttft_p50_ms": 1000 * statistics.median(o.ttft for o in outcomes if o.complete),
        "tpot_mean_ms": 1000 * statistics.mean(o.tpot for o in outcomes if o.complete and o.tokens > 1),
        "e2e_mean_ms": 1000 * statistics.mean(o.e2e for o in outcomes if o.complete),
        "e2e_p50_ms": 1000 * statistics.median(o.e2e for o in outcomes if o.complete),
        "completed": sum(o.complete for o in outcomes),
        **{f"{key}_engine_mean_ms": 1000 * value for key, value in engine.items()},
        **core,
    }


def engine_runs(model: Path, folder: Path, chosen: dict[str, list[Job]], reps: int) -> dict[str, dict]:
    """Each trace `reps` times through one engine, the traces taken in turn so that a busy spell of the shared
    machine slows them alike; per trace the median of each figure, its range over the repetitions, and each
    repetition's completion order."""
    from tests.support.vllm_server import VllmServer

    runs: dict[str, list[dict]] = {name: [] for name in chosen}
    args = ["--max-model-len", str(MAX_MODEL_LEN), "--kv-cache-memory-bytes", str(KV_BYTES)]
    with VllmServer(model, folder / "vllm.log", args=args) as server:
        run(server, "warm-up", [Job(0, [5, 6, 7], 4, stream=True)])
        for rep in range(reps):
            for name, jobs in chosen.items():
                runs[name].append(measure(run(server, name, jobs)))
                shown = {key: round(runs[name][-1][key], 2) for key in METRICS}
                print(f"  engine {name} #{rep + 1}: {json.dumps(shown)}", flush=True)
    measured = {}
    for name, each in runs.items():
        measured[name] = {key: statistics.median(rep[key] for rep in each) for key in METRICS}
        measured[name]["range"] = {
            key: (min(rep[key] for rep in each), max(rep[key] for rep in each)) for key in METRICS
        }
        measured[name]["orders"] = [rep["order"] for rep in each]
        measured[name]["requests"] = {
            key: per_request_medians([rep["requests"][key] for rep in each]) for key in PER_REQUEST
        }
    return measured


def per_request_medians(reps: list[list[float | None]]) -> list[float | None]:
    """Each request's median over the repetitions it completed in (None if it completed in none)."""
    return [
        statistics.median(known) if (known := [v for v in values if v is not None]) else None for values in zip(*reps)
    ]


def cpu_plan(model: Path, kv_bytes: int = KV_BYTES):
    """The test model on vLLM's CPU build over `kv_bytes` of KV cache, as the benchmarks run the engine."""
    from kvops.deployment import DeploymentOptions
    from kvops.planner import plan

    options = DeploymentOptions(
        model=str(model), device="cpu", max_model_len=MAX_MODEL_LEN, kv_cache_memory_bytes=kv_bytes
    )
    return plan(options.plan_inputs())


def profile_from(vector, fitted_on: str, input_s: float = 0.0) -> steptime.Coefficients:
    source = "fitted: bench/simulate_vs_engine.py --fit (see fitted_on)"
    terms = {name: steptime.Coefficient(float(value), source) for name, value in zip(steptime.TERMS, vector)}
    hardware = steptime.Hardware(**CPU_HARDWARE)
    api = steptime.Coefficient(float(vector[-1]), source)
    handoff = steptime.Coefficient(input_s, source) if input_s else None
    return steptime.Coefficients("cpu", terms, api, fitted_on, hardware, input_s=handoff)


def fit_with_handoff(
    plan, chosen: dict[str, Trace], measured: dict[str, dict], start: steptime.Coefficients, grid: tuple[float, ...]
):
    """The CPU coefficients (fit) at each candidate input_s of `grid`, and the one whose fit leaves the least loss on
    these traces' engine means: the hand-off is not linear in the schedule, so it is searched, not solved."""
    best = None
    for input_s in grid:
        begin = profile_from(coefficient_vector(start), "", input_s)
        vector = fit(plan, chosen, measured, begin)
        loss = engine_loss(plan, chosen, measured, profile_from(vector, "", input_s))
        if best is None or loss < best[0]:
            best = (loss, vector, input_s)
    assert best is not None
    return best[1], best[2]


def engine_loss(plan, chosen: dict[str, Trace], measured: dict[str, dict], profile: steptime.Coefficients) -> float:
    """The fit's soft L1 loss of the simulated engine's mean TTFT, TPOT and E2E against the engine's own."""
    total = 0.0
    for name, trace in chosen.items():
        row = compare(name, measured[name], recorded_run(plan, trace, profile, {})[0], profile.api_s.value)
        for key, simulated in simulated_engine_means(row, profile).items():
            relative = (simulated - measured[name][key]) / measured[name][key] / ROBUST
            total += 2.0 * ((1.0 + relative * relative) ** 0.5 - 1.0)
    return total


def simulated_engine_means(row: dict, profile: steptime.Coefficients) -> dict[str, float]:
    """The simulated engine's mean TTFT, TPOT and E2E (ms, keyed as ENGINE_SIDE): what the simulated clients saw
    less the API server's time, which the engine's own stamps do not include."""
    api_ms = 1000 * profile.api_s.value
    return {
        key: row[client][1] - (0.0 if client == "tpot_mean_ms" else api_ms)
        for key, client in zip(ENGINE_SIDE, ("ttft_mean_ms", "tpot_mean_ms", "e2e_mean_ms"))
    }


def fit(plan, chosen: dict[str, Trace], measured: dict[str, dict], start: steptime.Coefficients, iterations: int = 4):
    """The CPU coefficients by bench/fit_steptime.py's method, linear around each trace's schedule and iterated.
    The step's terms are fitted on the engine's own means (ENGINE_SIDE: vLLM's latency histograms, stamped as the
    engine core made each token), each as a relative error, each trace alike: on 2 shared cores the client reads
    some streams hundreds of ms late, which no step time explains and the engine's stamps do not see. The API
    server's time (api_s) is then the median over every request of its client TTFT less the simulated engine's,
    which those late reads do not move."""
    names = [*steptime.TERMS, "api_s"]
    api = names.index("api_s")
    free = [names.index(name) for name in CPU_FREE]
    vector = coefficient_vector(start)
    for _ in range(iterations):
        matrix, target, runs = [], [], []
        for name, trace in chosen.items():
            log, features = recorded_run(plan, trace, profile_from(vector, "", start.input_seconds), {})
            runs.append((name, log))
            for metric, (constants, rows) in request_rows(log, features, vector).items():
                engine = measured[name][f"{metric}_engine_mean_ms"] / 1000
                matrix.append(rows.mean(axis=0)[free] / engine)  # the engine's stamps: without api_s
                target.append((engine - constants.mean()) / engine)
        weights = np.ones(len(target))
        vector[free] = robust_solve(np.array(matrix), np.array(target), vector[free], weights)
        vector[api] = client_api_seconds(runs, measured, vector[api])
    return vector


def client_api_seconds(runs: list, measured: dict[str, dict], api_s: float) -> float:
    """The median over the requests of the client's TTFT less the simulated engine's (the log's, less api_s)."""
    gaps = []
    for name, log in runs:
        client = measured[name]["requests"]["ttft"]
        for position, entry in enumerate(log.requests):
            if entry.finished >= 0 and client[position] is not None:
                gaps.append(client[position] - (entry.first_token - api_s - entry.sent))
    return max(0.0, statistics.median(gaps))


def robust_solve(matrix: np.ndarray, target: np.ndarray, start: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """x >= 0 minimizing the soft L1 loss of matrix @ x - target, inliers within ROBUST (in the rows' weights)."""
    from scipy.optimize import least_squares

    return least_squares(
        lambda x: matrix @ x - target,
        np.maximum(start, 1e-9),
        jac=lambda _: matrix,
        bounds=(0.0, np.inf),
        loss="soft_l1",
        f_scale=ROBUST * float(np.median(weights)),
        x_scale="jac",
    ).x


def kendall_tau(first: list[int], second: list[int]) -> float:
    common = [index for index in first if index in set(second)]
    where = {index: position for position, index in enumerate(second)}
    pairs = concordant = 0
    for i in range(len(common)):
        for j in range(i + 1, len(common)):
            pairs += 1
            concordant += where[common[i]] < where[common[j]]
    return (2 * concordant - pairs) / pairs if pairs else 1.0


def compare(name: str, engine: dict, log, api_s: float) -> dict:
    """The simulated figures beside the engine's, keyed as METRICS: (engine, simulated); the engine core's means
    (CORE_SIDE) from when the simulated scheduler received each request to its step's end (without api_s)."""
    from kvops.simulate.results import Slo, completed, summarize

    summary = summarize(log, Slo(1e9, 1e9))
    done = [entry for entry in log.requests if completed(entry)]
    order = [index for index, _ in sorted(enumerate(log.requests), key=lambda item: item[1].finished)]
    simulated = {
        "preemptions": summary.preemptions,
        "ttft_mean_ms": summary.ttft.mean * 1000,
        "ttft_p50_ms": summary.ttft.p50 * 1000,
        "tpot_mean_ms": summary.tpot.mean * 1000,
        "e2e_mean_ms": summary.e2e.mean * 1000,
        "e2e_p50_ms": summary.e2e.p50 * 1000,
        "ttft_core_mean_ms": 1000 * statistics.mean(entry.first_token - api_s - entry.queued for entry in done),
        "e2e_core_mean_ms": 1000 * statistics.mean(entry.finished - api_s - entry.queued for entry in done),
    }
    row = {"trace": name, "tau": statistics.median(kendall_tau(each, order) for each in engine["orders"])}
    for key, value in simulated.items():
        row[key] = (engine.get(key), value)
    return row


def write_profile(profile: steptime.Coefficients) -> None:
    written = {key: value for key, value in profile.to_dict().items() if key != "profile"}
    update_step_time("the cpu profile", lambda profiles: profiles.update(cpu={**written, "hardware": CPU_HARDWARE}))


def print_rows(plan, sim_traces: dict[str, Trace], measured: dict[str, dict], profiles: dict, note: str) -> None:
    """One row per trace, each simulated with its own profile (`profiles[name]`)."""
    heads = {"ttft_mean_ms": "TTFT mean", "ttft_p50_ms": "TTFT p50", "tpot_mean_ms": "TPOT mean"}
    heads |= {"e2e_mean_ms": "E2E mean", "e2e_p50_ms": "E2E p50"}
    print(f"{'trace':<9} {'tau':>5} {'preempted':>13} " + " ".join(f"{heads[key] + ' ms':>33}" for key in LATENCIES))
    rows = {}
    for name, trace in sim_traces.items():
        row = rows[name] = compare(
            name, measured[name], recorded_run(plan, trace, profiles[name], {})[0], profiles[name].api_s.value
        )
        cells = [f"{row['preemptions'][0]:>6g} {row['preemptions'][1]:>6}"]
        for key in LATENCIES:
            engine, simulated = row[key]
            low, high = measured[name]["range"][key]
            cells.append(f"{engine:>6.1f} [{low:.1f}-{high:.1f}] {simulated:>6.1f} {simulated / engine:>4.2f}x")
        print(f"{name:<9} {row['tau']:>5.2f} " + " ".join(cells) + note)
    if all(key in measured[name] for name in rows for key in ENGINE_SIDE):
        print_engine_side(rows, measured, profiles, note)
    if all(key in measured[name] for name in rows for key in CORE_SIDE):
        print_core_side(rows, measured, note)


def print_engine_side(rows: dict[str, dict], measured: dict[str, dict], profiles: dict, note: str) -> None:
    """The simulated engine beside the engine's own means (its latency histograms: the API server's arrival stamp
    and the engine core's token stamps), which the client's read of the stream does not reach: on a shared 2-core
    machine the client loses the cores for 0.2-0.5 s at times, and a stream read late shows a long TTFT and a
    near-zero TPOT that no step time explains. The simulated TTFT and E2E are the engine's here: less api_s."""
    print("\nthe engine's own means (vLLM's latency histograms: its arrival and token stamps, not the client's read)")
    print(f"{'trace':<9} " + " ".join(f"{head + ' mean ms':>33}" for head in ("TTFT", "TPOT", "E2E")))
    for name, row in rows.items():
        cells = []
        for key, simulated in simulated_engine_means(row, profiles[name]).items():
            engine, (low, high) = measured[name][key], measured[name]["range"][key]
            cells.append(f"{engine:>6.1f} [{low:.1f}-{high:.1f}] {simulated:>6.1f} {simulated / engine:>4.2f}x")
        print(f"{name:<9} " + " ".join(cells) + note)


def print_core_side(rows: dict[str, dict], measured: dict[str, dict], note: str) -> None:
    """The simulated engine core beside the engine core's own means (vLLM's queue, prefill and inference
    histograms: from its scheduler's QUEUED stamp to its token stamps), and the hand-offs between the API server
    and the engine core the engine measured (its TTFT less queue and prefill), which these leave out."""
    print("\nthe engine core's own means (from its scheduler's receipt of each request; vLLM's queue + prefill and")
    print("queue + inference histograms), and the two hand-offs the engine's TTFT adds to them (request in, token out)")
    print(
        f"{'trace':<9} " + " ".join(f"{head + ' mean ms':>33}" for head in ("TTFT", "TPOT", "E2E")) + "  hand-offs ms"
    )
    for name, row in rows.items():
        cells = []
        for key, simulated_key in CORE_SIDE.items():
            engine, simulated = measured[name][key], row[simulated_key][1]
            low, high = measured[name]["range"][key]
            cells.append(f"{engine:>6.1f} [{low:.1f}-{high:.1f}] {simulated:>6.1f} {simulated / engine:>4.2f}x")
        handoffs = measured[name]["ttft_engine_mean_ms"] - measured[name]["ttft_core_mean_ms"]
        print(f"{name:<9} " + " ".join(cells) + f"  {handoffs:>11.1f}" + note)


def leave_one_out(
    plan, sim_traces: dict[str, Trace], measured: dict[str, dict], start, grid: tuple[float, ...]
) -> dict:
    """Each trace's profile fitted on the other traces alone."""
    profiles = {}
    for held in sim_traces:
        others = {name: trace for name, trace in sim_traces.items() if name != held}
        vector, input_s = fit_with_handoff(plan, others, measured, start, grid)
        profiles[held] = profile_from(vector, f"fitted without {held}", input_s)
    return profiles


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--fit",
        action="store_true",
        help=f"score each trace fitted without it, then fit on {', '.join(FITTED)} and write the profile",
    )
    parser.add_argument(
        "--no-handoff",
        action="store_true",
        help="fit without the API server's hand-off to the engine core (input_s 0), as before it was priced",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--reps", type=int, default=3, help="runs of each trace through the engine (default 3)")
    parser.add_argument(
        "--measured",
        type=Path,
        help=f"the engine's figures from an earlier run [run it; saved to {SAVED.relative_to(REPO)}]",
    )
    options = parser.parse_args()
    from tests.support.tiny_model import build_model

    chosen = traces(options.seed)
    with tempfile.TemporaryDirectory(prefix="simulate-vs-engine-") as scratch:
        folder = Path(scratch)
        model = build_model(folder / "model")
        if options.measured:
            measured = json.loads(options.measured.read_text())["traces"]
        else:
            started = time.monotonic()
            measured = engine_runs(model, folder, chosen, options.reps)
            print(f"engine runs: {time.monotonic() - started:.0f} s", flush=True)
            save(measured, options)
        plan = cpu_plan(model)
        sim_traces = {name: as_trace(name, jobs, measured[name]["requests"]["sent"]) for name, jobs in chosen.items()}
        if not options.fit:
            shipped = steptime.coefficients("cpu")
            print_rows(plan, sim_traces, measured, dict.fromkeys(sim_traces, shipped), "")
            return
        start = steptime.coefficients("cpu") if "cpu" in steptime.profiles() else steptime.coefficients("gpu")
        print("leave-one-out: each trace simulated with the profile fitted on the other traces")
        grid = (0.0,) if options.no_handoff else INPUT_GRID_S
        held_out = leave_one_out(plan, sim_traces, measured, start, grid)
        print_rows(plan, sim_traces, measured, held_out, " (held out)")
        print(
            "input_s fitted without each trace (ms): "
            + ", ".join(f"{name} {1000 * p.input_seconds:g}" for name, p in held_out.items())
        )
        fitted_on = (
            f"the test model on one {os.cpu_count()}-core machine's vLLM {__import__('vllm').__version__} CPU engine "
            f"(bench/simulate_vs_engine.py --fit, traces {', '.join(FITTED)}, {time.strftime('%Y-%m-%d')})"
        )
        fitted = {name: sim_traces[name] for name in FITTED}
        vector, input_s = fit_with_handoff(plan, fitted, measured, start, grid)
        print(f"fitted on {', '.join(FITTED)}: the API server's hand-off input_s = {1000 * input_s:g} ms")
        write_profile(profile_from(vector, fitted_on, input_s))


def save(measured: dict[str, dict], options) -> None:
    """The engine's figures, with when and how they were taken, for --measured."""
    about = {
        "date": time.strftime("%Y-%m-%d"),
        "vllm": __import__("vllm").__version__,
        "seed": options.seed,
        "reps": options.reps,
        "machine": f"{os.cpu_count()} cores, shared",
    }
    SAVED.write_text(json.dumps({"about": about, "traces": measured}, indent=1) + "\n")
    print(f"saved the engine's figures to {SAVED.relative_to(REPO)}")


if __name__ == "__main__":
    main()
