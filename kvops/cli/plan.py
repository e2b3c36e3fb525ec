"""`kvops plan`, `kvops calibrate`, `kvops sweep`: engine launch plans, measured against reality, over the catalog."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from kvops.cli.options import POSITIVE, json_option, model_option, print_json, warn
from kvops.errors import KvopsError
from kvops.units import parse_bytes


class IntOrAuto(click.ParamType):
    """A positive integer, or 'auto' (also vLLM's -1) for 'let the planner find it'."""

    name = "N|auto"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int | str:
        if isinstance(value, int) or value == "auto":
            return value
        text = str(value).strip().lower()
        if text in ("auto", "-1"):
            return "auto"
        if text.isdigit() and int(text) > 0:
            return int(text)
        self.fail(f"{value!r} is not a positive integer or 'auto'", param, ctx)
        return None


INT_OR_AUTO = IntOrAuto()
FRACTION = click.FloatRange(min=0.0, max=1.0, min_open=True)


def engine_options(function: Callable, model_required: bool = True, engine: bool = True) -> Callable:
    """The deployment a plan is for: shared by `plan`, `calibrate` and `explain` (vLLM only: no --engine)."""
    from kvops.budget import WEIGHT_FORMAT_CHOICES
    from kvops.gpus import gpu_catalog

    gpus = ", ".join(gpu.id for gpu in gpu_catalog())
    options = [
        click.option(
            "--engine",
            "-e",
            type=click.Choice(("vllm", "tgi"), case_sensitive=False),
            default="vllm",
            show_default=True,
            help="Serving engine.",
        ),
        click.option("--gpu", "gpu_name", metavar="NAME", help=f"GPU from the catalog (any case): {gpus}."),
        click.option(
            "--gpu-memory",
            metavar="SIZE",
            help="Device memory, e.g. 80GiB: overrides the catalog figure or stands alone.",
        ),
        click.option(
            "--gpus", type=POSITIVE, help="GPUs in all [default: --tp]; vLLM runs gpus/tp data-parallel replicas."
        ),
        click.option(
            "--tp",
            type=POSITIVE,
            help="Tensor-parallel size (vLLM --tensor-parallel-size, TGI --num-shard) [default: --gpus or 1].",
        ),
        click.option(
            "--device",
            type=click.Choice(("gpu", "cpu")),
            default="gpu",
            show_default=True,
            help="cpu: vLLM's CPU build (block size 128, no async scheduling, no CUDA graphs).",
        ),
        click.option(
            "--max-model-len",
            type=INT_OR_AUTO,
            help="Context per request (TGI --max-total-tokens); auto: the longest at --concurrency [default: the model's max_position_embeddings].",
        ),
        click.option(
            "--kv-dtype",
            default="auto",
            show_default=True,
            help="KV cache type: auto, bf16, fp16, fp8, fp8_e4m3, fp8_e5m2, int8, int4.",
        ),
        click.option(
            "--quantization",
            type=click.Choice(WEIGHT_FORMAT_CHOICES, case_sensitive=False),
            default="auto",
            show_default=True,
            help="Weight format; auto reads the config's quantization_config.",
        ),
        click.option(
            "--gpu-memory-utilization",
            "--cuda-memory-fraction",
            "memory_fraction",
            type=FRACTION,
            help="vLLM --gpu-memory-utilization [0.92] / TGI --cuda-memory-fraction [1.0].",
        ),
        click.option(
            "--kv-cache-memory-bytes",
            metavar="SIZE",
            help="vLLM: pin the KV cache to SIZE per GPU instead of profiling (exact).",
        ),
        click.option(
            "--max-num-batched-tokens",
            "--max-batch-prefill-tokens",
            "batched_tokens",
            type=POSITIVE,
            help="vLLM --max-num-batched-tokens / TGI --max-batch-prefill-tokens [default: the engine's].",
        ),
        click.option("--block-size", type=POSITIVE, help="vLLM --block-size [16 on GPU, 64 for MLA, 128 on CPU]."),
        click.option("--enforce-eager", is_flag=True, help="vLLM: no CUDA graphs (their memory goes to KV)."),
    ]
    for option in reversed(options if engine else options[1:]):
        function = option(function)
    if model_required:
        return model_option(function)
    return click.option(
        "--model",
        "-m",
        metavar="MODEL",
        help="The model the run served [default: read from the log's non-default args].",
    )(function)


def workload_options(function: Callable) -> Callable:
    """What the deployment must serve and how: shared by `plan` and `manifests`."""
    options = [
        click.option("--prompt-tokens", type=click.IntRange(min=0), help="Expected prompt tokens per request."),
        click.option("--gen-tokens", type=click.IntRange(min=0), help="Expected generated tokens per request."),
        click.option(
            "--workload",
            type=click.Path(exists=True, dir_okay=False),
            help='JSONL of requests ({"prompt_tokens": P, "gen_tokens": G} per line): sized at its p95.',
        ),
        click.option("--beams", type=POSITIVE, default=1, show_default=True, help="Beam width per request."),
        click.option(
            "--n", "n", type=POSITIVE, default=1, show_default=True, help="Parallel samples per request (n / best_of)."
        ),
        click.option(
            "--concurrency",
            type=INT_OR_AUTO,
            help="Requests that must run at once under the warn level; auto: as many as fit.",
        ),
        click.option(
            "--max-num-seqs",
            "--max-concurrent-requests",
            "max_num_seqs",
            type=POSITIVE,
            help="Override vLLM --max-num-seqs / TGI --max-concurrent-requests.",
        ),
        click.option(
            "--max-input-tokens", type=POSITIVE, help="TGI --max-input-tokens [default: max-total-tokens - 1]."
        ),
        click.option(
            "--guard/--no-guard",
            default=None,
            help="vLLM: name the KV-guard scheduler (--scheduler-cls kvops_vllm.scheduler.KVGuardScheduler; needs kvops installed beside vLLM)  [default: guard]",
        ),
        click.option(
            "--max-queued",
            type=click.IntRange(min=0),
            help="vLLM --max-num-queued-reqs: answer 503 beyond this many requests in flight.",
        ),
        click.option(
            "--profile",
            "profile_path",
            type=click.Path(exists=True, dir_okay=False),
            help="Calibration profile (`kvops calibrate --save`): measured terms replace estimates.",
        ),
        click.option(
            "--policy",
            "policy_path",
            type=click.Path(exists=True, dir_okay=False),
            help="Degrade policy whose warn level sizes max-num-seqs [default: the shipped one, 70%].",
        ),
    ]
    for option in reversed(options):
        function = option(function)
    return engine_options(function)


@click.command()
@workload_options
@click.option(
    "--format",
    "-f",
    "out_format",
    type=click.Choice(("text", "shell", "json", "yaml", "env", "docker", "k8s")),
    default="text",
    show_default=True,
    help="Output.",
)
@click.option(
    "--launcher",
    metavar="COMMAND",
    help="What starts the engine, instead of `vllm serve` / `text-generation-launcher`, e.g. 'python -m vllm.entrypoints.openai.api_server' where the console script is missing.",
)
@json_option
def plan(out_format, launcher, as_json, **options):
    """Engine launch flags that keep the KV cache inside its budget, with every memory term and the capacity.

    Exits 3 when the workload does not fit, with need against have and the ways out the planner computed.
    """
    from kvops.render.plan import does_not_fit_message, render

    result = make_plan(**options, launcher=_launcher(launcher))
    out_format = "json" if as_json else out_format
    if result.fits or out_format in ("json", "yaml"):
        click.echo(render(result, out_format))
    if out_format != "text":
        for message in result.warnings:
            warn(message)
    if not result.fits:
        from kvops.plan import PlanError

        raise PlanError(does_not_fit_message(result))


def _launcher(text: str | None) -> tuple[str, ...]:
    import shlex

    if text is None:
        return ()
    try:
        words = tuple(shlex.split(text))
    except ValueError as exc:
        raise click.BadParameter(f"{text!r} is not a shell command ({exc})", param_hint="--launcher") from None
    if not words:
        raise click.BadParameter(
            "give the command that starts the engine, e.g. 'python -m vllm.entrypoints.openai.api_server'",
            param_hint="--launcher",
        )
    return words


def make_plan(
    model,
    engine,
    gpu_name,
    gpu_memory,
    gpus,
    tp,
    device,
    max_model_len,
    kv_dtype,
    quantization,
    memory_fraction,
    kv_cache_memory_bytes,
    batched_tokens,
    block_size,
    enforce_eager,
    prompt_tokens,
    gen_tokens,
    workload,
    beams,
    n,
    concurrency,
    max_num_seqs,
    max_input_tokens,
    guard,
    max_queued,
    profile_path,
    policy_path,
    launcher=(),
):
    """The plan for the options of `workload_options`, fitting or not."""
    from kvops.plan import plan as plan_deployment
    from kvops.workload import Workload, parse_workload

    if workload and (prompt_tokens is not None or gen_tokens is not None):
        raise click.UsageError("give either --workload FILE or --prompt-tokens/--gen-tokens, not both")
    sequences = beams * n
    if workload:
        load = parse_workload(Path(workload).read_text().splitlines(), workload, sequences)
    else:
        load = Workload(
            prompt_tokens,
            gen_tokens,
            sequences,
            "flags" if prompt_tokens is not None or gen_tokens is not None else "none",
        )
    inputs = plan_inputs(
        model,
        engine,
        gpu_name,
        gpu_memory,
        gpus,
        tp,
        device,
        max_model_len,
        kv_dtype,
        quantization,
        memory_fraction,
        kv_cache_memory_bytes,
        batched_tokens,
        block_size,
        enforce_eager,
        profile_path,
        policy_path,
        workload=load,
        concurrency=concurrency,
        max_num_seqs=max_num_seqs,
        max_input_tokens=max_input_tokens,
        guard=guard,
        max_queued=max_queued,
        launcher=launcher,
    )
    return plan_deployment(inputs)


def plan_inputs(
    model,
    engine,
    gpu_name,
    gpu_memory,
    gpus,
    tp,
    device,
    max_model_len,
    kv_dtype,
    quantization,
    memory_fraction,
    kv_cache_memory_bytes,
    batched_tokens,
    block_size,
    enforce_eager,
    profile_path=None,
    policy_path=None,
    **extra,
):
    """The CLI's options as PlanInputs: the model loaded, the GPU resolved, files read."""
    from kvops.gpus import resolve_gpu
    from kvops.model import load_model
    from kvops.plan import PlanInputs

    spec = load_model(model)
    memory = parse_bytes(gpu_memory, "--gpu-memory") if gpu_memory else None
    pinned = parse_bytes(kv_cache_memory_bytes, "--kv-cache-memory-bytes") if kv_cache_memory_bytes else None
    gpu = resolve_gpu(gpu_name, memory) if gpu_name or memory or (device == "gpu" and pinned is None) else None
    tp = tp or gpus or 1
    profile = load_profile(profile_path) if profile_path else None
    return PlanInputs(
        engine=engine.lower(),
        spec=spec,
        gpu=gpu,
        tp=tp,
        gpus=gpus,
        device=device,
        max_model_len=max_model_len,
        kv_dtype=kv_dtype,
        quantization=quantization,
        memory_fraction=memory_fraction,
        kv_cache_memory_bytes=pinned,
        batched_tokens=batched_tokens,
        block_size=block_size,
        enforce_eager=enforce_eager,
        profile=profile,
        warn_level=warn_level(policy_path),
        **extra,
    )


def warn_level(policy_path: str | None) -> float:
    from kvops.policy import Level, load_policy

    return load_policy(policy_path).thresholds[Level.WARN]


def load_profile(path: str):
    import yaml

    from kvops.errors import ConfigError
    from kvops.profile import Profile

    try:
        data = yaml.safe_load(Path(path).read_text())
    except yaml.YAMLError:
        raise ConfigError(f"{path}: not valid YAML or JSON") from None
    return Profile.from_dict(data, path)


def run_options(function: Callable) -> Callable:
    """The plan options, for the run being calibrated: the model may come from the log."""
    return engine_options(function, model_required=False)


@click.command()
@click.option(
    "--vllm-log",
    type=click.Path(exists=True, dir_okay=False),
    help="A vLLM startup log (any release: old and new wordings).",
)
@click.option(
    "--tgi-log", type=click.Path(exists=True, dir_okay=False), help="A TGI launcher log (plain or --json-output)."
)
@click.option(
    "--metrics", "metrics_url", metavar="URL", help="A live vLLM /metrics endpoint: its vllm:cache_config_info labels."
)
@click.option(
    "--save",
    "save_path",
    metavar="PROFILE",
    help="Write the measured terms as a profile (YAML, or JSON for *.json) for `kvops plan --profile`.",
)
@json_option
@click.pass_context
@run_options
def calibrate(ctx, vllm_log, tgi_log, metrics_url, save_path, as_json, **options):
    """Predicted against actual, term by term, for an engine run; save what it measured as a profile."""
    from kvops.calibrate import cache_config_info, calibrate_tgi, calibrate_vllm, tgi_plan_options, vllm_plan_options
    from kvops.render.plan import calibration_text

    if tgi_log and (vllm_log or metrics_url):
        raise click.UsageError("--tgi-log cannot be combined with --vllm-log or --metrics (one engine per calibration)")
    if not (vllm_log or tgi_log or metrics_url):
        raise click.UsageError("give --vllm-log FILE, --tgi-log FILE or --metrics URL")
    sources = [source for source in (vllm_log, tgi_log, metrics_url) if source]
    source = " + ".join(str(item) for item in sources)
    if tgi_log:
        from kvops.engines.tgi.logs import parse_tgi_log

        log = parse_tgi_log(Path(tgi_log).read_text(errors="replace"))
        if log.get("max_batch_total_tokens") is None:
            raise KvopsError(
                f"{tgi_log}: no 'Setting max batch total tokens to N' line: is this a TGI launcher log of a started server?"
            )
        plan = _calibration_plan(ctx, options, tgi_plan_options(log))
        result = calibrate_tgi(log, plan, source)
    else:
        from kvops.engines.vllm.logs import parse_vllm_log

        log = parse_vllm_log(Path(vllm_log).read_text(errors="replace")) if vllm_log else None
        if log is not None and not log.facts:
            raise KvopsError(
                f"{vllm_log}: no vLLM startup lines found (looked for 'Available KV cache memory', 'KV cache size', 'Model loading took', ...)"
            )
        labels = None
        if metrics_url:
            labels = cache_config_info(fetch_metrics(metrics_url))
            if labels is None:
                raise KvopsError(f"{metrics_url}: no vllm:cache_config_info sample; is this a vLLM /metrics endpoint?")
        derived = vllm_plan_options(log, labels)
        if log is not None and log.get("total_memory_bytes") and log.device != "cpu":
            derived.setdefault("gpu_memory", str(log.get("total_memory_bytes")))
        plan = _calibration_plan(ctx, options, derived)
        result = calibrate_vllm(log, labels, plan, source)
    if as_json:
        print_json(result.to_dict())
    else:
        click.echo(calibration_text(result))
    if save_path:
        save_profile(result.profile, save_path)
        if not as_json:
            click.echo(f"saved profile {save_path}: use it with kvops plan --profile {save_path}")


def _calibration_plan(ctx: click.Context, options: dict[str, Any], derived: dict[str, Any]):
    """The plan for the run being calibrated: options given on the command line win over what the run states."""
    from kvops.plan import predict

    try:
        inputs = run_plan_inputs(ctx, options, derived)
        return predict(inputs) if inputs else None
    except KvopsError as exc:
        warn(f"no prediction for this run: {exc}")
        return None


def run_plan_inputs(ctx: click.Context, options: dict[str, Any], derived: dict[str, Any], **extra):
    """PlanInputs for a run: what the run states (`derived`), overridden by options given on the command line;
    None without a model."""
    from click.core import ParameterSource

    merged = dict(options)
    for name, value in derived.items():
        if name not in merged or ctx.get_parameter_source(name) != ParameterSource.COMMANDLINE:
            merged[name] = value
    if not merged.get("model"):
        return None
    return plan_inputs(
        merged["model"],
        merged.get("engine", "vllm"),
        merged.get("gpu_name"),
        merged.get("gpu_memory"),
        merged.get("gpus"),
        merged.get("tp"),
        merged.get("device", "gpu"),
        merged.get("max_model_len"),
        merged.get("kv_dtype", "auto"),
        merged.get("quantization", "auto"),
        merged.get("memory_fraction"),
        str(merged["kv_cache_memory_bytes"]) if merged.get("kv_cache_memory_bytes") else None,
        merged.get("batched_tokens"),
        merged.get("block_size"),
        merged.get("enforce_eager", False),
        policy_path=merged.get("policy_path"),
        max_num_seqs=merged.get("max_num_seqs"),
        **extra,
    )


def fetch_metrics(url: str) -> str:
    import urllib.error
    import urllib.request

    target = url if url.rstrip("/").endswith("/metrics") else url.rstrip("/") + "/metrics"
    try:
        with urllib.request.urlopen(target, timeout=10) as response:
            return response.read().decode("utf-8", errors="replace")
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise KvopsError(f"--metrics {url}: cannot read {target} ({getattr(exc, 'reason', exc)})") from None


def save_profile(profile, path: str) -> None:
    import json

    import yaml

    data = profile.to_dict()
    text = json.dumps(data, indent=2) + "\n" if path.endswith(".json") else yaml.safe_dump(data, sort_keys=False)
    try:
        Path(path).write_text(text)
    except OSError as exc:
        raise KvopsError(f"--save {path}: cannot write ({exc.strerror or exc})") from None


@click.command()
@click.option(
    "--out",
    "-o",
    required=True,
    type=click.Path(dir_okay=False, writable=True),
    help="CSV to write (one row per engine, model, GPU, tp, KV dtype).",
)
@click.option(
    "--plot",
    "plot_path",
    type=click.Path(dir_okay=False, writable=True),
    help="Heatmap image [default: the CSV's name with .png].",
)
@click.option("--no-plot", is_flag=True, help="Write only the CSV.")
@click.option("--engines", default="vllm", show_default=True, help="Comma-separated: vllm, tgi.")
@click.option("--kv-dtypes", default="auto,fp8", show_default=True, help="Comma-separated KV dtypes.")
@click.option(
    "--tps",
    default="1,2,4,8",
    show_default=True,
    help="Comma-separated tensor-parallel sizes (sizes a model cannot split by are skipped).",
)
@click.option(
    "--max-model-len",
    type=POSITIVE,
    default=8192,
    show_default=True,
    help="Context per request (capped at each model's max_position_embeddings).",
)
@click.option("--models", help="Comma-separated catalog models [default: the whole catalog].")
@click.option("--gpus", "gpu_names", help="Comma-separated catalog GPUs [default: the whole catalog].")
@json_option
def sweep(out, plot_path, no_plot, engines, kv_dtypes, tps, max_model_len, models, gpu_names, as_json):
    """Plans for every catalog model on every catalog GPU: capacity table (CSV) and heatmap."""
    from kvops.cli.options import int_list
    from kvops.gpus import find_gpu, gpu_catalog
    from kvops.model import load_model
    from kvops.model.catalog import catalog
    from kvops.sweep import plot_sweep, sweep_frame, sweep_rows

    engine_names = _names(engines, "--engines", ("vllm", "tgi"))
    specs = [load_model(name) for name in (_names(models, "--models") if models else [entry.id for entry in catalog()])]
    gpus = [find_gpu(name) for name in _names(gpu_names, "--gpus")] if gpu_names else list(gpu_catalog())
    rows = sweep_rows(
        specs,
        gpus,
        engines=engine_names,
        kv_dtypes=_names(kv_dtypes, "--kv-dtypes"),
        tps=int_list(tps, "--tps"),
        max_model_len=max_model_len,
        warn_level=warn_level(None),
    )
    frame = sweep_frame(rows)
    try:
        frame.to_csv(out, index=False)
    except OSError as exc:
        raise KvopsError(f"--out {out}: cannot write ({exc.strerror or exc})") from None
    image = None
    if not no_plot:
        image = plot_path or str(Path(out).with_suffix(".png"))
        plot_sweep(frame, image, engine=engine_names[0], tp=1)
    fits = int(frame.fits.sum())
    if as_json:
        print_json({"out": out, "plot": image, "rows": len(frame), "fits": fits})
    else:
        click.echo(f"wrote {out}: {len(frame)} plans, {fits} fit" + (f"; plot {image}" if image else ""))


def _names(text: str, option: str, valid: tuple[str, ...] | None = None) -> list[str]:
    names = [part.strip() for part in text.split(",") if part.strip()]
    if not names:
        raise click.BadParameter(f"{text!r} names nothing", param_hint=option)
    if valid:
        for name in names:
            if name not in valid:
                raise click.BadParameter(f"{name!r}; valid: {', '.join(valid)}", param_hint=option)
    return names
