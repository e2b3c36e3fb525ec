"""`kvops simulate`: what a deployment's traffic will see, through vLLM's own scheduler on a simulated clock."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import click

from kvops.cli.config_file import file_option
from kvops.cli.options import (
    POSITIVE,
    Finite,
    RequestRate,
    engine_options,
    json_option,
    names,
    policy_option,
    print_json,
    warn,
)
from kvops.errors import UsageError
from kvops.files import write_text
from kvops.units import parse_duration

FORMATS = ("kvops", "timed_trace", "mooncake", "burstgpt", "azure", "sharegpt", "vllm_bench")


@click.command()
@engine_options
@file_option
@click.option(
    "--trace", type=click.Path(dir_okay=False), help="Requests to replay: a file in any format --trace-format names."
)
@click.option("--trace-format", type=click.Choice(FORMATS), help="The trace's format [default: read from the file].")
@click.option("--trace-model", metavar="NAME", help="BurstGPT: only this Model column's rows.")
@click.option("--requests", type=POSITIVE, help="The trace's first N arrivals; synthetic: how many [default 1000].")
@click.option(
    "--rate",
    type=RequestRate(),
    help="Requests per second: synthetic or untimed arrivals, or a timed trace scaled to it; inf sends every request "
    "at once (vllm bench serve's default).",
)
@click.option(
    "--burstiness",
    type=Finite(0, 100, "the gamma shape", low_open=True),
    help="Arrival burstiness of the gaps drawn at --rate: 1 is Poisson, below 1 burstier (vLLM's benchmark's gamma "
    "shape) [default: 1].",
)
@click.option(
    "--prompt-tokens",
    "prompt_spec",
    default="sharegpt",
    show_default=True,
    help="Synthetic prompt lengths: sharegpt, fixed:N, uniform:A-B, normal:mean=M,std=S, lognormal:mean=M,sigma=S.",
)
@click.option(
    "--output-tokens",
    "output_spec",
    default="sharegpt",
    show_default=True,
    help="Synthetic output lengths, as --prompt-tokens.",
)
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the synthetic lengths and arrivals.")
@click.option(
    "--draws",
    type=click.IntRange(1, 100),
    default=1,
    show_default=True,
    help="Run the traffic drawn at N seeds (--seed, --seed+1, ...) and report each figure's median and range over "
    "them: near saturation one draw of arrivals queues where another does not.",
)
@click.option(
    "--concurrency", type=POSITIVE, help="Clients: at most this many requests in flight, each sent when one ends."
)
@click.option(
    "--max-tokens",
    "max_tokens_mode",
    default="trace",
    show_default=True,
    metavar="MODE",
    help="What clients send as max_tokens: trace (each request's own, else its length), exact (its length, ignore_eos), none (omitted), cap:N.",
)
@click.option("--max-num-seqs", type=POSITIVE, help="vLLM --max-num-seqs [its default for the device].")
@click.option(
    "--scheduling-policy",
    type=click.Choice(("fcfs", "priority")),
    default="fcfs",
    show_default=True,
    help="vLLM --scheduling-policy.",
)
@click.option(
    "--watermark",
    type=Finite(0, 1, "a share of the blocks"),
    default=0.0,
    show_default=True,
    help="vLLM --watermark: blocks kept free when admitting.",
)
@click.option("--max-num-active-seqs", type=POSITIVE, help="vLLM --max-num-active-seqs (0.31 and later).")
@click.option(
    "--max-num-scheduled-tokens",
    type=POSITIVE,
    help="vLLM --max-num-scheduled-tokens: the scheduler's tokens per step [default: --max-num-batched-tokens].",
)
@click.option(
    "--long-prefill-token-threshold",
    type=click.IntRange(min=0),
    default=0,
    show_default=True,
    help="vLLM --long-prefill-token-threshold.",
)
@click.option(
    "--cache-aware-admission-window",
    type=click.IntRange(min=0),
    default=0,
    show_default=True,
    help="vLLM --cache-aware-admission-window (0.34 and later): within the first N waiting, requests whose prefix is "
    "cached are admitted first.",
)
@click.option(
    "--cache-aware-admission-threshold",
    type=Finite(0, 1, "a share of the KV cache"),
    help="vLLM --cache-aware-admission-threshold (0.34 and later): the KV usage below which the window is not "
    "applied [vLLM's default: 0.5].",
)
@click.option("--scheduler-cls", metavar="CLASS", help="vLLM --scheduler-cls: a scheduler class importable here.")
@click.option(
    "--step-time",
    "step_time_file",
    type=click.Path(exists=True, dir_okay=False),
    help="Step-time coefficients (bench/fit_steptime.py's format) [default: the shipped fit].",
)
@click.option(
    "--calibrate",
    "calibrate_path",
    type=click.Path(exists=True, dir_okay=False),
    metavar="RESULT",
    help="Fit the step time to a `vllm bench serve --save-result --save-detailed` RESULT from this deployment: "
    "its requests replayed, one factor on the step time fitted to the TPOT its clients measured.",
)
@click.option(
    "--save-step-time",
    "save_step_time",
    type=click.Path(dir_okay=False),
    metavar="FILE",
    help="With --calibrate: write the fitted step time to FILE, for --step-time FILE.",
)
@click.option(
    "--slo-ttft", default="2s", show_default=True, help="The TTFT target a request must meet for goodput (e.g. 500ms)."
)
@click.option("--slo-tpot", default="100ms", show_default=True, help="The TPOT target a request must meet for goodput.")
@click.option(
    "--compare",
    "arms_text",
    metavar="ARMS",
    help="Arms side by side on the same trace: stock, plan, guard, guard-v1, watermark[:F], active:N, cache-aware:N (vLLM 0.34); ARM+degrade runs "
    "ARM behind kvops' degrade policy in vLLM's API server (--policy) [default: stock].",
)
@click.option(
    "--max-rate",
    is_flag=True,
    help="Find the highest request rate one replica serves at the SLO attainment (--attainment).",
)
@click.option(
    "--replicas",
    "target_rate",
    type=Finite(0, 1e9, "requests per second", low_open=True),
    metavar="RATE",
    help="The fewest replicas that serve this traffic at RATE requests per second at the SLO attainment, each an "
    "equal share (as a random split gives it), checked on the trace twice over and one replica fewer.",
)
@click.option(
    "--attainment",
    type=Finite(0, 1, "a share of the requests", low_open=True),
    default=0.9,
    show_default=True,
    help="The share of requests that must meet the SLO (--max-rate, --replicas).",
)
@click.option(
    "--csv",
    "csv_path",
    type=click.Path(dir_okay=False),
    help="Write one row per request of every arm (its first column names the arm) to this CSV file.",
)
@click.option(
    "--plot",
    "plot_path",
    type=click.Path(dir_okay=False),
    help="Write KV usage and the queue over time to this PNG (kvops[plot]).",
)
@click.option(
    "--tokenizer",
    type=click.Path(exists=True),
    help="A local tokenizer folder ShareGPT's texts are counted with (kvops[hub]) [default: 4 characters a token].",
)
@click.option(
    "--progress/--no-progress", default=None, help="A progress line on stderr [default: when stderr is a terminal]."
)
@policy_option
@json_option
@click.pass_context
def simulate(ctx: click.Context, as_json: bool, **params: Any) -> None:
    """What a deployment's traffic will see: TTFT, TPOT, ITL, E2E, goodput, preemptions, replicas.

    The trace runs through the installed vLLM's own scheduler and KV cache manager over the pool `kvops plan`
    sizes for this deployment; each scheduled batch costs what the GPU step-time model (fitted on public
    measurements) says. Needs vLLM installed (the CPU build works: no GPU is used).
    """
    from kvops.cli.options import deployment_options
    from kvops.simulate import session
    from kvops.simulate.traffic import Traffic

    _check_synthetic_options(ctx, params["trace"])
    traffic = Traffic(
        trace=params.pop("trace"),
        trace_format=params.pop("trace_format"),
        trace_model=params.pop("trace_model"),
        requests=params.pop("requests"),
        rate=params.pop("rate"),
        burstiness=params.pop("burstiness"),
        prompt_tokens=params.pop("prompt_spec"),
        output_tokens=params.pop("output_spec"),
        seed=params.pop("seed"),
        concurrency=params.pop("concurrency"),
    )
    in_file, scheduler_flags = _scheduler_flags(ctx, params)
    deployment = deployment_options(ctx, params)
    request = session.Request(
        traffic=traffic,
        max_tokens=params.pop("max_tokens_mode"),
        scheduler_flags={**in_file, **dict(deployment.scheduler_flags), **scheduler_flags},
        step_time_file=params.pop("step_time_file"),
        slo_ttft_s=parse_duration(params.pop("slo_ttft"), "--slo-ttft"),
        slo_tpot_s=parse_duration(params.pop("slo_tpot"), "--slo-tpot"),
        arms=tuple(names(params.pop("arms_text") or "stock", "--compare")),
        max_rate=params.pop("max_rate"),
        target_rate=params.pop("target_rate"),
        attainment=params.pop("attainment"),
        tokenizer=params.pop("tokenizer"),
        policy_path=params.pop("policy_path"),
        calibrate=params.pop("calibrate_path"),
        draws=params.pop("draws"),
    )
    save_step_time = params.pop("save_step_time")
    if save_step_time and not request.calibrate:
        raise UsageError("--save-step-time writes what --calibrate fits: give --calibrate RESULT too")
    csv_path, plot_path = params.pop("csv_path"), params.pop("plot_path")
    _check_outputs(csv_path, plot_path, save_step_time)
    progress = _Progress() if _show_progress(params.pop("progress"), as_json) else None
    answer = session.run(request, deployment, progress)
    if progress is not None:
        progress.close()
    _outputs(answer, as_json, csv_path, plot_path)
    if save_step_time and answer.calibration is not None:
        write_text(save_step_time, json.dumps(answer.calibration.profile(), indent=2) + "\n", "--save-step-time")
        if not as_json:
            click.echo(f"saved the step time to {save_step_time}: simulate with --step-time {save_step_time}")


# the scheduler's options: this command's parameter -> SchedulerOptions field
SCHEDULER_OPTIONS = {
    "scheduling_policy": "policy",
    "watermark": "watermark",
    "max_num_active_seqs": "max_num_active_seqs",
    "long_prefill_token_threshold": "long_prefill_token_threshold",
    "max_num_scheduled_tokens": "max_num_scheduled_tokens",
    "cache_aware_admission_window": "cache_aware_admission_window",
    "cache_aware_admission_threshold": "cache_aware_admission_threshold",
    "scheduler_cls": "scheduler_cls",
}


def _scheduler_flags(ctx: click.Context, params: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The scheduler's options from the -f file, and those typed here, as deployment_options ranks every option:
    typed wins over a --from-command line's, which wins over the file's, which win over the defaults."""
    from click.core import ParameterSource

    pasted = bool(params.get("from_command"))
    in_file, flags = {}, {}
    for parameter, field in SCHEDULER_OPTIONS.items():
        value = params.pop(parameter)
        if pasted and ctx.get_parameter_source(parameter) == ParameterSource.DEFAULT_MAP:
            in_file[field] = value
        elif not pasted or ctx.get_parameter_source(parameter) == ParameterSource.COMMANDLINE:
            flags[field] = value
    # --num-gpu-blocks-override comes with the engine options (cli/options.py): the KV pool a run logged; the plan
    # takes it too (its capacity is then that pool)
    flags["num_gpu_blocks_override"] = params.get("num_gpu_blocks_override")
    return in_file, flags


def _check_synthetic_options(ctx: click.Context, trace: str | None) -> None:
    """The synthetic lengths are not drawn for a trace, which has its own."""
    from kvops.cli.options import typed

    for parameter, option in (("prompt_spec", "--prompt-tokens"), ("output_spec", "--output-tokens")):
        if trace is not None and typed(ctx, parameter):
            raise UsageError(f"{option} draws synthetic lengths; --trace {trace} has its own: leave it out")


def _check_outputs(csv_path: str | None, plot_path: str | None, save_step_time: str | None) -> None:
    """Every file to write, checked before the simulation runs (it may take minutes)."""
    from kvops.files import check_output_path

    for path, option, suffix in (
        (csv_path, "--csv", None),
        (plot_path, "--plot", ".png"),
        (save_step_time, "--save-step-time", None),
    ):
        if path is not None:
            check_output_path(path, option, suffix)
    if csv_path and plot_path and Path(csv_path).resolve() == Path(plot_path).resolve():
        raise UsageError(f"--csv and --plot both name {csv_path}: give each its own file")


def _outputs(answer, as_json: bool, csv_path: str | None, plot_path: str | None) -> None:
    from kvops.render import simulate as render

    if csv_path:
        render.write_csv(answer, csv_path)
    if plot_path:
        render.write_plot(answer, Path(plot_path))
    if as_json:
        print_json(answer.to_dict())
    else:
        click.echo(render.text(answer))
    for message in answer.warnings:
        warn(message)


def _show_progress(asked: bool | None, as_json: bool) -> bool:
    return asked if asked is not None else sys.stderr.isatty()


class _Progress:
    """One line on stderr, rewritten at most twice a second: which run, and how many of its requests ended."""

    def __init__(self) -> None:
        self.shown = 0.0
        self.width = 0

    def __call__(self, what: str, done: int, total: int) -> None:
        now = time.monotonic()
        if now - self.shown < 0.5 and done < total:
            return
        self.shown = now
        line = f"simulating {what}: {done:,} of {total:,} requests ended"
        sys.stderr.write("\r" + line.ljust(self.width))
        sys.stderr.flush()
        self.width = len(line)

    def close(self) -> None:
        if self.width:
            sys.stderr.write("\r" + " " * self.width + "\r")
            sys.stderr.flush()
