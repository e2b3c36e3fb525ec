"""kvops simulate against public `vllm bench serve` runs it was never fitted on: held out entirely.

    python bench/simulate_public_bench.py [--only ID[,ID]] [--draws 1] [--save FILE] [--write-held-out]

The runs: bench/data/public_bench.json, each with its source, the date it was posted and what bounds its vLLM
release (numbers only). None of them is in bench/data/sim_to_real.json, the step time's fit (24 runs of vLLM 0.15.1
on H100-80GB): other releases, other GPUs, other models, published elsewhere. Nothing here is fitted on them; the
shipped coefficients (kvops/catalog/step_time.json) price every step.

Each run is simulated as a user would type it: `kvops simulate` with the run's model, --gpu, --tp, the engine flags
the run names (its release's vLLM default for --gpu-memory-utilization, 0.9), the pool planned by --engine-version
of the run's release, and synthetic traffic shaped as the benchmark sent it:

- `--dataset-name random` (range ratio 0): --prompt-tokens fixed:N, N the run's input tokens over its requests (the
  random prompts retokenize a few tokens short of --random-input-len), --output-tokens fixed:--random-output-len,
  --max-tokens exact (kept only where the run's generated tokens are within 1% of prompts x output length);
- `--dataset-name sharegpt`: log-normal lengths at the run's own mean prompt and output tokens (its totals over its
  requests) and the spread of kvops' `sharegpt` model (sigma 1.2 and 1.0), --max-tokens exact (the benchmark sends
  each request's ShareGPT output length as max_tokens, and these runs' models answer up to it);
- `--request-rate inf` (every request sent at once): --concurrency N for N requests, the same schedule;
  `--max-concurrency C`: --concurrency C.

Arrivals are never random here (all at once, or a closed loop); ShareGPT lengths are, so --draws N runs the
runs of 100 requests at seeds 0..N-1 and takes each figure's median (`seeds`). Figures: mean TTFT, mean TPOT, mean E2E where the run printed it, output
throughput; each error signed, simulated over measured minus 1 (negative: the simulator is fast, or for throughput,
low). The summary is the median absolute error, over all runs, per GPU, per release, dense against mixtures of
experts.

--write-held-out writes, into the gpu profile of kvops/catalog/step_time.json, the range of measured mean TPOT over
the simulated on the runs of mixtures of more routed experts than any the step time is fitted on (`held_out`,
`experts_from`: the fewest experts among them), which `kvops simulate` warns with on such models. Runs whose requests
stream fewer than FEW_OUTPUTS tokens each are left out of it: their TPOT is a burst's few gaps, the API server's
time more than the GPU's. The entries bench/simulate_accuracy.py writes are kept, and it keeps these.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from collections.abc import Callable, Iterable
from datetime import date
from typing import Any

DATA = os.path.join(os.path.dirname(__file__), "data", "public_bench.json")
FEW_OUTPUTS = 16  # output tokens a request below which its TPOT is not read as the GPU's
SHAREGPT_SIGMA = (1.2, 1.0)
SMALL_RUN = 100  # kvops' sharegpt model's spread of prompt and output lengths (synthetic.py)
VLLM_DEFAULT_GPU_MEMORY_UTILIZATION = 0.9  # vllm/config/cache.py of the releases scored (0.10-0.13)
# (figure, the measured field, the simulated arm's field and key)
FIGURES: tuple[tuple[str, str, str, str | None], ...] = (
    ("TTFT", "mean_ttft_ms", "ttft_ms", "mean"),
    ("TPOT", "mean_tpot_ms", "tpot_ms", "mean"),
    ("E2E", "mean_e2el_ms", "e2e_ms", "mean"),
    ("throughput", "output_throughput", "output_tokens_per_s", None),
)


def load(path: str = DATA) -> list[dict[str, Any]]:
    with open(path) as handle:
        runs: list[dict[str, Any]] = json.load(handle)["runs"]
    return runs


def traffic_args(run: dict[str, Any]) -> list[str]:
    """The synthetic traffic of `kvops simulate` that matches the run's benchmark."""
    traffic, measured = run["traffic"], run["measured"]
    count = int(measured["completed"])
    if traffic["dataset"] == "random":
        prompt = f"fixed:{round(measured['total_input_tokens'] / count)}"
        output = f"fixed:{traffic['random_output_len']}"
    else:
        prompt = f"lognormal:mean={measured['total_input_tokens'] / count:.1f},sigma={SHAREGPT_SIGMA[0]}"
        output = f"lognormal:mean={measured['total_output_tokens'] / count:.1f},sigma={SHAREGPT_SIGMA[1]}"
    clients = traffic["max_concurrency"] or count
    return [
        *("--requests", str(count), "--prompt-tokens", prompt, "--output-tokens", output),
        *("--max-tokens", "exact", "--concurrency", str(clients)),
    ]


def engine_args(run: dict[str, Any]) -> list[str]:
    """The deployment: model, GPU, tp, the release whose pool rules apply, the engine flags the run names. vLLM
    before 0.32 ran without async scheduling unless asked; kvops plans --[no-]async-scheduling from 0.32 only and
    simulates it on, which `caveats` says."""
    flags = run["engine_flags"]
    args = ["-m", run["kvops_model"], "--gpu", run["gpu"], "--tp", str(run["tp"])]
    args += ["--engine-version", run["release"]]
    args += ["--gpu-memory-utilization", str(flags.get("gpu_memory_utilization", VLLM_DEFAULT_GPU_MEMORY_UTILIZATION))]
    if "max_model_len" in flags:
        args += ["--max-model-len", str(flags["max_model_len"])]
    return args


def kvops_args(run: dict[str, Any], seed: int = 0) -> list[str]:
    """The `kvops simulate` arguments for one run at one seed."""
    return ["simulate", *engine_args(run), *traffic_args(run), "--seed", str(seed), "--json"]


def caveats(run: dict[str, Any]) -> list[str]:
    """What kvops could not express of the run's setup."""
    if run["engine_flags"].get("async_scheduling") is False:
        return ["ran without async scheduling; kvops simulates it on (no --no-async-scheduling before vLLM 0.32)"]
    return []


class Refused(Exception):
    """`kvops simulate` would not simulate the run: its one-line reason."""


def simulate(run: dict[str, Any], seed: int) -> dict[str, float]:
    """One run's simulated figures at one seed (the stock arm of `kvops simulate --json`)."""
    done = subprocess.run(
        [sys.executable, "-m", "kvops", *kvops_args(run, seed)], capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        raise Refused(done.stderr.strip().splitlines()[-1])
    arm = json.loads(done.stdout)["arms"][0]
    return {name: arm[field][key] if key else arm[field] for name, _, field, key in FIGURES}


def seeds(run: dict[str, Any], draws: int) -> range:
    """The seeds a run is drawn at: --draws where its lengths are ShareGPT-like draws of at most SMALL_RUN
    requests, whose mean output moves by about 13% from one draw to the next (a log-normal of sigma 1.0 has a
    coefficient of variation of 1.31); once otherwise (1,000 requests: about 4%; fixed lengths: none)."""
    drawn = run["traffic"]["dataset"] == "sharegpt" and run["measured"]["completed"] <= SMALL_RUN
    return range(draws if drawn else 1)


def simulated(run: dict[str, Any], cache: dict[str, dict[str, Any]], draws: int) -> dict[str, Any]:
    """Each figure's median over the run's seeds, or {"refused": why}; each seed's figures kept in `cache`, by
    seed, and simulated only where it has none."""
    for seed in seeds(run, draws):
        if str(seed) not in cache and "refused" not in cache:
            try:
                cache[str(seed)] = simulate(run, seed)
            except Refused as refused:
                cache["refused"] = str(refused)
    if "refused" in cache:
        return {"refused": cache["refused"]}
    each = [cache[str(seed)] for seed in seeds(run, draws)]
    return {name: statistics.median(one[name] for one in each) for name, _, _, _ in FIGURES}


def signed_errors(run: dict[str, Any], sim: dict[str, float]) -> dict[str, float]:
    """Simulated over measured minus 1, per figure the run printed."""
    measured = run["measured"]
    return {name: sim[name] / measured[field] - 1 for name, field, _, _ in FIGURES if measured.get(field)}


def family(run: dict[str, Any]) -> str:
    return "vLLM " + ".".join(run["release"].split(".")[:2])


GROUPINGS: tuple[tuple[str, Callable[[dict[str, Any]], str]], ...] = (
    ("all", lambda run: "all"),
    ("GPU", lambda run: run["gpu"]),
    ("release", family),
    ("kind", lambda run: "mixture of experts" if run["moe"] else "dense"),
    ("load", lambda run: "closed loop, 1-8 clients" if run["traffic"]["max_concurrency"] else "all sent at once"),
)


def medians(errors: Iterable[dict[str, float]], name: str) -> str:
    """The median absolute error and, in brackets, the median signed one."""
    values = [one[name] for one in errors if name in one]
    if not values:
        return "-"
    return f"{statistics.median(map(abs, values)):.1%} ({statistics.median(values):+.0%})"


def summary_lines(runs: list[dict[str, Any]], errors: dict[str, dict[str, float]]) -> list[str]:
    names = [name for name, _, _, _ in FIGURES]
    lines = [f"{'group':<26}{'n':>4}  " + "".join(f"{name:>16}" for name in names)]
    for _, key in GROUPINGS:
        groups: dict[str, list[dict[str, float]]] = {}
        for run in runs:
            if run["id"] in errors:
                groups.setdefault(key(run), []).append(errors[run["id"]])
        for group, members in sorted(groups.items()):
            cells = "".join(f"{medians(members, name):>16}" for name in names)
            lines.append(f"{group:<26}{len(members):>4}  {cells}")
    return lines


def run_line(run: dict[str, Any], sim: dict[str, float], error: dict[str, float]) -> str:
    measured = run["measured"]
    cells = []
    for name, field, _, _ in FIGURES:
        if name in error:
            cells.append(f"{name} {sim[name]:.4g}/{measured[field]:.4g} {error[name]:+.0%}")
    return f"{run['id']:<38}{family(run):<11}" + "  ".join(cells)


def report(runs: list[dict[str, Any]], sims: dict[str, dict[str, Any]]) -> None:
    scored = [run for run in runs if run["id"] in sims and "refused" not in sims[run["id"]]]
    errors = {run["id"]: signed_errors(run, sims[run["id"]]) for run in scored}
    print("held out entirely: public vllm bench serve runs, none fitted on (newer or older releases than the fit's")
    print("0.15.1, other GPUs and models); simulated/measured, signed error (negative: the simulator is faster,")
    print("or for throughput lower); TTFT, TPOT, E2E in ms, throughput in output tokens/s")
    for run in scored:
        print(run_line(run, sims[run["id"]], errors[run["id"]]))
        for note in caveats(run):
            print(f"{'':<49}{note}")
    for run in runs:
        if "refused" in sims.get(run["id"], {}):
            print(f"{run['id']:<38}not simulated: {sims[run['id']]['refused']}")
    print("\nmedian absolute error (median signed error)")
    print("\n".join(summary_lines(scored, errors)))


def routed_experts(run: dict[str, Any]) -> int:
    """The routed experts of the run's model, as kvops reads its config (0: dense)."""
    from kvops.model.locate import load_model

    return load_model(run["kvops_model"]).num_experts


def held_out_entry(runs: list[dict[str, Any]], sims: dict[str, dict[str, Any]], fitted_experts: int) -> dict | None:
    """The profile's `held_out` entry for models of more routed experts than `fitted_experts`, the most of any model
    the step time is fitted on: their runs' measured mean TPOT over the simulated."""
    many = [
        run
        for run in runs
        if "refused" not in sims.get(run["id"], {"refused": "not run"})
        and run["measured"]["total_output_tokens"] >= FEW_OUTPUTS * run["measured"]["completed"]
        and routed_experts(run) > fitted_experts
    ]
    if not many:
        return None
    ratios = [run["measured"]["mean_tpot_ms"] / sims[run["id"]]["TPOT"] for run in many]
    models = sorted({run["model"].split("/")[-1] for run in many})
    releases = sorted({run["release"] for run in many})
    gpus = sorted({run["gpu"] for run in many})
    return {
        "experts_from": min(routed_experts(run) for run in many),
        "runs": len(many),
        "low": round(min(ratios), 2),
        "high": round(max(ratios), 2),
        "source": f"GPUStack's performance lab, vLLM {', '.join(releases)} on {', '.join(gpus)}: {', '.join(models)}; "
        f"bench/simulate_public_bench.py, {date.today().isoformat()}",
        "runs_of": "public vllm bench serve",
    }


def fitted_experts() -> int:
    """The most routed experts of any model the gpu profile is fitted on (bench/data/sim_to_real.json's runs)."""
    from sim_experiments import experiments

    from kvops.model.locate import load_model

    return max(load_model(experiment.model).num_experts for experiment in experiments())


def write_held_out(entry: dict | None) -> None:
    """Replace the profile's experts entry with `entry`, keeping the GPU and tp ones (bench/simulate_accuracy.py's)."""
    from fit_steptime import update_step_time

    def change(profiles: dict[str, Any]) -> None:
        kept = [held for held in profiles["gpu"].get("held_out", []) if "experts_from" not in held]
        profiles["gpu"]["held_out"] = kept + ([entry] if entry else [])

    update_step_time("the gpu profile's held-out figures for many experts", change)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", help="comma-separated run ids")
    parser.add_argument("--draws", type=int, default=1, help="seeds 0..N-1 per run, each figure's median")
    parser.add_argument("--save", help="keep each run's figures, per seed, in this JSON file; a rerun reuses them")
    parser.add_argument(
        "--write-held-out", action="store_true", help="write the many-experts runs' range into the gpu profile"
    )
    options = parser.parse_args()
    runs = load()
    if options.only:
        wanted = set(options.only.split(","))
        runs = [run for run in runs if run["id"] in wanted]
    cache: dict[str, dict[str, Any]] = {}
    if options.save and os.path.exists(options.save):
        with open(options.save) as handle:
            cache = json.load(handle)
    sims = {}
    for run in runs:
        sims[run["id"]] = simulated(run, cache.setdefault(run["id"], {}), options.draws)
        if options.save:
            with open(options.save, "w") as handle:
                json.dump(cache, handle, indent=1)
    report(runs, sims)
    if options.write_held_out:
        write_held_out(held_out_entry(runs, sims, fitted_experts()))


if __name__ == "__main__":
    main()
