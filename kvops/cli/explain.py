"""`kvops explain`: where a vLLM engine's GPU memory went, what its KV cache holds now, and the one next action."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from kvops.cli.options import json_option, print_json
from kvops.cli.plan import engine_options, fetch_metrics, run_plan_inputs
from kvops.errors import KvopsError


def explain_options(function):
    return engine_options(function, model_required=False, engine=False)


@click.command()
@click.option(
    "--metrics",
    "metrics_url",
    metavar="URL",
    help="A live vLLM /metrics: KV usage now, the cache config, requests running and waiting.",
)
@click.option(
    "--vllm-log",
    "log_path",
    metavar="FILE",
    help="The engine's log (startup, or the traceback of a failed start): the memory it measured, or what ran out.",
)
@click.option(
    "--nvidia-smi",
    "smi_path",
    metavar="FILE",
    help="`nvidia-smi` output (its table, or --query-gpu=memory.total,memory.used --format=csv): device total and used.",
)
@click.option(
    "--gpu-index",
    type=click.IntRange(min=0),
    default=0,
    show_default=True,
    help="The device in --nvidia-smi output the engine runs on (its rank 0).",
)
@click.option(
    "--prompt-tokens",
    type=click.IntRange(min=0),
    help="Planned prompt tokens per request (headroom in requests of this size).",
)
@click.option("--gen-tokens", type=click.IntRange(min=0), help="Planned generated tokens per request.")
@click.option(
    "--workload",
    type=click.Path(exists=True, dir_okay=False),
    help="JSONL of requests, as `kvops plan --workload` reads (sized at its p95).",
)
@click.option(
    "--policy",
    "policy_path",
    type=click.Path(exists=True, dir_okay=False),
    help="Degrade policy for the level [default: the shipped one].",
)
@json_option
@click.pass_context
@explain_options
def explain(
    ctx,
    metrics_url,
    log_path,
    smi_path,
    gpu_index,
    prompt_tokens,
    gen_tokens,
    workload,
    policy_path,
    as_json,
    **options,
):
    """Where the GPU memory of a running or failed vLLM engine went: weights, activation peak, non-torch, CUDA graphs
    and KV; KV in use and the headroom; the level that applies and the one next action.

    Terms come from what the engine reported (its log, its /metrics), the device total from nvidia-smi, and only
    the terms it did not report from the planner (give --model), each marked with its source.
    """
    from kvops.calibrate import vllm_plan_options
    from kvops.explain import Run, device_total
    from kvops.explain import explain as make_explanation
    from kvops.policy import load_policy
    from kvops.render.explain import explanation_text
    from kvops.workload import Workload, parse_workload

    if not (metrics_url or log_path):
        raise click.UsageError("give --metrics URL and/or --vllm-log FILE")
    if workload and (prompt_tokens is not None or gen_tokens is not None):
        raise click.UsageError("give either --workload FILE or --prompt-tokens/--gen-tokens, not both")
    run = Run(device_option=options.get("device") if _given(ctx, "device") else None)
    if log_path:
        run.log, run.log_source = read_log(log_path), log_path
    if metrics_url:
        run.labels, run.reading = read_metrics(metrics_url)
        run.metrics_source = metrics_url
    if smi_path:
        run.smi, run.smi_source = read_smi(smi_path, gpu_index), smi_path
    load = (
        parse_workload(Path(workload).read_text().splitlines(), workload)
        if workload
        else Workload(
            prompt_tokens, gen_tokens, 1, "flags" if prompt_tokens is not None or gen_tokens is not None else "none"
        )
    )
    derived = vllm_plan_options(run.log, run.labels)
    total = device_total(run) if run.device == "gpu" else None
    if total and not _given(ctx, "gpu_memory"):
        derived["gpu_memory"] = str(total)
    if run.device == "cpu":
        derived["device"] = "cpu"
    inputs, notes = _plan_inputs(ctx, options, policy_path, derived, load, run.known_kv_pool)
    result = make_explanation(run, inputs, load_policy(policy_path), notes)
    if as_json:
        print_json(result.to_dict())
    else:
        click.echo(explanation_text(result))


def _plan_inputs(ctx, options, policy_path, derived, load, pool):
    """The run as the planner sees it. Without a device total the plan is for the run's own KV pool (`pool`, when
    the run states one); a model named only by the run's own args that cannot be loaded here (an HF id not in the
    local cache) leaves the explanation without a plan. Either way it says so."""
    from kvops.errors import UsageError

    options = {**options, "policy_path": policy_path}
    try:
        return run_plan_inputs(ctx, options, derived, workload=load), []
    except UsageError as exc:
        if "missing --gpu" not in str(exc):
            raise
        if not pool:
            return None, ["no plan: no device total (give --gpu NAME, --gpu-memory SIZE or --nvidia-smi FILE)"]
        inputs = run_plan_inputs(ctx, options, {**derived, "kv_cache_memory_bytes": pool}, workload=load)
        return inputs, [
            f"no device total: the plan models the run's own KV pool ({pool} B); give --gpu NAME or --nvidia-smi FILE for the rest"
        ]
    except KvopsError as exc:
        if _given(ctx, "model"):
            raise
        return None, [f"no plan: the run's model could not be loaded ({exc}); give --model"]


def _given(ctx: click.Context, name: str) -> bool:
    from click.core import ParameterSource

    return ctx.get_parameter_source(name) == ParameterSource.COMMANDLINE


def read_log(path: str):
    from kvops.engines.vllm.logs import parse_vllm_log

    text = _read(path, "--vllm-log")
    log = parse_vllm_log(text)
    if not log.facts and log.failure is None:
        raise KvopsError(
            f"--vllm-log {path}: no vLLM lines found (looked for 'Model loading took', 'Available KV cache memory', 'KV cache size', "
            "'non-default args', out-of-memory and KV-cache errors)"
        )
    return log


def read_metrics(url: str) -> tuple[dict[str, str] | None, Any]:
    from kvops.calibrate import cache_config_info
    from kvops.engines.metrics import MetricsError, Samples
    from kvops.engines.vllm import metrics

    text = fetch_metrics(url)
    try:
        reading = metrics.reading(Samples.from_exposition(text, only=metrics.SERIES))
    except MetricsError as exc:
        raise KvopsError(f"--metrics {url}: {exc}") from None
    labels = cache_config_info(text)
    if labels is None:
        raise KvopsError(
            f"--metrics {url}: no vllm:cache_config_info sample (the KV pool's size); is this a vLLM /metrics endpoint?"
        )
    return labels, reading


def read_smi(path: str, index: int):
    from kvops.nvidia_smi import parse_nvidia_smi

    devices = parse_nvidia_smi(_read(path, "--nvidia-smi"), f"--nvidia-smi {path}")
    for device in devices:
        if device.index == index:
            return device
    raise KvopsError(
        f"--gpu-index {index}: not in --nvidia-smi {path} (devices: {', '.join(str(device.index) for device in devices)})"
    )


def _read(path: str, option: str) -> str:
    """A text file, gzip-compressed or not; one line naming the file when it cannot be read."""
    import gzip

    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise KvopsError(f"{option} {path}: cannot read ({exc.strerror or exc})") from None
    if data[:2] == b"\x1f\x8b":
        try:
            data = gzip.decompress(data)
        except (OSError, EOFError) as exc:
            raise KvopsError(f"{option} {path}: a damaged gzip file ({exc})") from None
    if b"\x00" in data[:4096]:
        raise KvopsError(f"{option} {path}: not a text file")
    return data.decode("utf-8", errors="replace")
