"""Options several commands share, named as users say them, and the one place they become `DeploymentOptions`."""

from __future__ import annotations

import json
import math
import re
import shlex
import sys
from collections.abc import Callable
from importlib.util import find_spec
from typing import TYPE_CHECKING, Any

import click

from kvops.dtypes import KV_DTYPE_CHOICES
from kvops.errors import KvopsError
from kvops.units import GiB, parse_bytes, parse_count

if TYPE_CHECKING:
    from kvops.deployment import DeploymentOptions

POSITIVE = click.IntRange(min=1)


class Finite(click.ParamType):
    """A finite number within [low, high] (low excluded when `low_open`): 'nan', 'inf' and out-of-range values are
    one clear error that says what is valid."""

    name = "number"

    def __init__(self, low: float, high: float, what: str = "seconds", low_open: bool = False):
        self.low, self.high, self.what, self.low_open = low, high, what, low_open

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> float:
        try:
            number = float(value)
        except (TypeError, ValueError):
            number = math.nan
        valid = f"{self.what}, from {self.low:g}{' (excluded)' if self.low_open else ''} to {self.high:g}"
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number ({valid})", param, ctx)
        if number < self.low or (self.low_open and number == self.low):
            self.fail(
                f"{number!r} is not in the range x{'>' if self.low_open else '>='}{self.low:g} ({valid})", param, ctx
            )
        if number > self.high:
            self.fail(f"{number!r} is not in the range x<={self.high:g} ({valid})", param, ctx)
        return number


class RequestRate(Finite):
    """Requests a second, or 'inf': every request sent at once, as `vllm bench serve --request-rate inf` (its
    default) sends them."""

    def __init__(self) -> None:
        super().__init__(0, 1e6, "requests per second, or inf: all at once", low_open=True)

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> float:
        if isinstance(value, str) and value.strip().lower() in ("inf", "infinity"):
            return math.inf
        return super().convert(value, param, ctx)


FRACTION = Finite(0.0, 1.0, "a share of the device", low_open=True)
# --dtype as vLLM and TGI spell it -> kvops's dtype names
SERVING_DTYPES = {"auto": "auto", "bf16": "bf16", "bfloat16": "bf16", "fp16": "fp16", "float16": "fp16", "half": "fp16"}
SERVING_DTYPES |= {"fp32": "fp32", "float32": "fp32", "float": "fp32"}


def model_option(function: Callable) -> Callable:
    return click.option(
        "--model",
        "-m",
        required=True,
        metavar="MODEL",
        help="config.json file or folder, a model id in the local HF cache, or a catalog id/alias (`kvops models`).",
    )(function)


def kv_dtype_option(function: Callable) -> Callable:
    return click.option(
        "--kv-dtype",
        default="auto",
        show_default=True,
        type=click.Choice(KV_DTYPE_CHOICES, case_sensitive=False),
        help="KV cache element type; auto is the model's own dtype.",
    )(function)


def tp_option(function: Callable) -> Callable:
    return click.option(
        "--tp", default=1, show_default=True, type=POSITIVE, help="Tensor-parallel size (GPUs sharing one replica)."
    )(function)


def json_option(function: Callable) -> Callable:
    return click.option("--json", "as_json", is_flag=True, help="Print JSON (every byte figure an exact integer).")(
        function
    )


class IntOrAuto(click.ParamType):
    """A positive count as vLLM writes it (32K, 32k, 1M), or 'auto' (also vLLM's -1) for 'let the planner find it'."""

    name = "N|auto"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int | str:
        if isinstance(value, int) or value == "auto":
            return value
        text = str(value).strip()
        if text.lower() in ("auto", "-1"):
            return "auto"
        try:
            return parse_count(text, param.opts[0] if param else "value", or_auto=True)
        except KvopsError as exc:
            self.fail(str(exc), param, ctx)


INT_OR_AUTO = IntOrAuto()


class TokenCount(click.ParamType):
    """A positive count of tokens as vLLM writes it: 32K (32768), 32k (32000), 1M, or a plain integer."""

    name = "N"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        if isinstance(value, int) and value > 0:
            return value
        try:
            return parse_count(str(value), param.opts[0] if param else "value")
        except KvopsError as exc:
            self.fail(str(exc), param, ctx)


TOKEN_COUNT = TokenCount()


def _apply(function: Callable, options: list[Callable]) -> Callable:
    for option in reversed(options):
        function = option(function)
    return function


def engine_options(function: Callable, model_required: bool = True, engine: bool = True) -> Callable:
    """The deployment a plan is for: shared by `plan`, `calibrate`, `manifests` and `explain` (vLLM only: no --engine)."""
    from kvops import engines
    from kvops.engines.vllm.flags import LORA_DTYPES, PERFORMANCE_MODES
    from kvops.engines.weights import WEIGHT_FORMAT_CHOICES
    from kvops.gpus import gpu_catalog

    gpus = ", ".join(gpu.id for gpu in gpu_catalog())
    options = [
        click.option(
            "--engine",
            "-e",
            type=click.Choice(engines.NAMES, case_sensitive=False),
            default="vllm",
            show_default=True,
            help="Serving engine.",
        ),
        click.option(
            "--engine-version",
            metavar="VERSION",
            help="The engine release whose rules to plan with, e.g. 0.19.0, 0.8.5-v0 (vLLM's V0 engine) or 2.4.1 (TGI) "
            "[default: the newest; calibrate and explain read it from the run].",
        ),
        click.option("--gpu", "gpu_name", metavar="NAME", help=f"GPU from the catalog (any case): {gpus}."),
        click.option(
            "--gpu-memory",
            metavar="SIZE",
            help="Device memory, e.g. 80GiB: overrides the catalog figure or stands alone.",
        ),
        click.option(
            "--gpus",
            type=POSITIVE,
            help="GPUs in all [default: tp x pp]; vLLM runs gpus/(tp x pp) data-parallel replicas.",
        ),
        click.option(
            "--tp",
            "--tensor-parallel-size",
            "-tp",
            "--num-shard",
            "tp",
            type=POSITIVE,
            help="Tensor-parallel size (vLLM --tensor-parallel-size, TGI --num-shard) [default: --gpus or 1].",
        ),
        click.option(
            "--pp",
            "--pipeline-parallel-size",
            "-pp",
            "pp",
            type=POSITIVE,
            help="vLLM pipeline-parallel stages: each holds its share of the layers [default: 1].",
        ),
        click.option(
            "--decode-context-parallel-size",
            "-dcp",
            "dcp",
            type=POSITIVE,
            default=1,
            show_default=True,
            help="vLLM: an MLA model's latent cache split by tokens over this many of the tp ranks (it divides tp).",
        ),
        click.option(
            "--data-parallel-size",
            "-dp",
            "data_parallel",
            type=POSITIVE,
            help="vLLM data-parallel replicas (sets --gpus to dp x tp x pp); MoE experts split over tp x dp ranks.",
        ),
        click.option(
            "--enable-expert-parallel/--no-enable-expert-parallel",
            "-ep",
            "expert_parallel",
            default=False,
            help="vLLM: whole experts per rank over tp x dp ranks instead of every expert split by tp.",
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
            help="vLLM --gpu-memory-utilization [unset: 1.0 with 0.34's extensible KV cache, 0.92 without] / TGI --cuda-memory-fraction [1.0].",
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
        click.option(
            "--enforce-eager/--no-enforce-eager", default=False, help="vLLM: no CUDA graphs (their memory goes to KV)."
        ),
        click.option(
            "--num-gpu-blocks-override",
            type=POSITIVE,
            help="vLLM: fix the KV cache at this many blocks (turns vLLM 0.34's extensible KV cache off).",
        ),
        click.option(
            "--enable-extensible-kv-cache/--no-enable-extensible-kv-cache",
            "extensible_kv_cache",
            default=None,
            help="vLLM 0.34+: size KV from the memory free after warmup (on by default on CUDA/ROCm) or from the profile.",
        ),
        click.option(
            "--vmm/--no-vmm",
            "vmm",
            default=True,
            help="vLLM 0.34+: --no-vmm, the driver has no virtual memory management (WSL2): vLLM falls back to profiling [default: vmm].",
        ),
        click.option(
            "--compilation-config",
            metavar="JSON",
            help="vLLM --compilation-config: cudagraph_mode NONE, cudagraph_capture_sizes or max_cudagraph_capture_size change the CUDA graphs' memory.",
        ),
        click.option(
            "--no-disable-custom-all-reduce/--disable-custom-all-reduce",
            "custom_all_reduce",
            default=True,
            help="vLLM --disable-custom-all-reduce: tensor parallelism over NCCL alone (no custom all-reduce buffers) [default: no-disable].",
        ),
        click.option(
            "--kv-offloading-size",
            type=Finite(0, 1 << 20, "GiB of host memory, all tensor-parallel ranks together", low_open=True),
            metavar="GiB",
            help="vLLM: a host (CPU) KV tier of this size; the plan says the tokens it holds and what a reload costs.",
        ),
        click.option(
            "--kv-offloading-backend",
            type=click.Choice(("native", "lmcache")),
            help="vLLM: the host tier's backend  [default: native, with --kv-offloading-size]",
        ),
        click.option(
            "--dtype",
            type=click.Choice(tuple(SERVING_DTYPES), case_sensitive=False),
            default="auto",
            show_default=True,
            help="The weights' and activations' dtype (vLLM/TGI --dtype); auto: the checkpoint's (float32 served as bf16).",
        ),
        click.option(
            "--speculative-config",
            "-sc",
            metavar="JSON",
            help='vLLM speculative decoding, e.g. \'{"method": "eagle3", "model": "ORG/HEAD", "num_speculative_tokens": 3}\': the drafter\'s layers share the KV pool.',
        ),
        click.option(
            "--language-model-only/--no-language-model-only",
            "text_only",
            default=False,
            help="vLLM: text only; the vision tower is not loaded (its weights leave the budget).",
        ),
        click.option(
            "--cpu-offload-gb",
            type=click.FloatRange(min=0),
            help="vLLM: GiB of weights per GPU kept in host memory.",
        ),
        click.option(
            "--no-disable-hybrid-kv-cache-manager/--disable-hybrid-kv-cache-manager",
            "hybrid_manager",
            default=True,
            help="vLLM --disable-hybrid-kv-cache-manager: one block table for all layers (sliding and chunked layers cache the whole context) [default: no-disable].",
        ),
        click.option(
            "--enable-prefix-caching/--no-enable-prefix-caching",
            "prefix_caching",
            default=None,
            help="vLLM prefix caching [default: on; for models with state layers from vLLM 0.28]; off, they keep one state page per request.",
        ),
        click.option(
            "--enable-chunked-prefill/--no-enable-chunked-prefill",
            "chunked_prefill",
            default=True,
            help="vLLM chunked prefill [default: on]; off, each step takes whole prompts: max-num-batched-tokens rises to max-model-len, and the profile's activation peak with it.",
        ),
        click.option(
            "--performance-mode",
            type=click.Choice(PERFORMANCE_MODES),
            default="balanced",
            show_default=True,
            help="vLLM: throughput doubles the default max-num-batched-tokens and max-num-seqs; interactivity captures a CUDA graph at every batch size up to 32.",
        ),
        click.option(
            "--async-scheduling/--no-async-scheduling",
            "async_scheduling",
            default=None,
            help="vLLM async scheduling [default: on, off on the CPU]; off, one batch is in flight, not two (a sliding window's blocks, the simulated steps).",
        ),
        click.option(
            "--disable-sliding-window/--no-disable-sliding-window",
            default=False,
            help="vLLM: sliding-window layers attend to the whole context and cache it; the context is cut to the window.",
        ),
        click.option(
            "--kv-cache-dtype-skip-layers",
            "kv_skip_layers",
            metavar="LAYERS",
            callback=_skip_layers,
            help="vLLM: layers whose KV cache keeps the model's dtype under --kv-dtype: indices and/or sliding_window, comma-separated.",
        ),
        click.option(
            "--enable-lora/--no-enable-lora",
            default=False,
            help="vLLM: serve LoRA adapters; their slots are allocated at load.",
        ),
        click.option(
            "--max-loras",
            type=POSITIVE,
            default=1,
            show_default=True,
            help="vLLM: adapters served at once, one slot each (with --enable-lora).",
        ),
        click.option(
            "--max-lora-rank",
            type=POSITIVE,
            default=16,
            show_default=True,
            help="vLLM: the rank every slot is allocated at: 1, 8, 16, 32, 64, 128, 256, 320 or 512.",
        ),
        click.option(
            "--fully-sharded-loras/--no-fully-sharded-loras",
            default=False,
            help="vLLM: split the slots' rank and output by tensor parallel.",
        ),
        click.option(
            "--lora-dtype",
            type=click.Choice(LORA_DTYPES),
            default="auto",
            show_default=True,
            help="vLLM: the slots' dtype; auto is the serving dtype.",
        ),
        click.option(
            "--mamba-cache-mode",
            type=click.Choice(("align", "none", "all")),
            help="vLLM: state pages kept per request [default: align with prefix caching (all for Mamba-2 models through 0.27), else none].",
        ),
        click.option("--mamba-cache-dtype", default="auto", show_default=True, help="vLLM: the conv state's dtype."),
        click.option("--mamba-ssm-cache-dtype", default="auto", show_default=True, help="vLLM: the SSM state's dtype."),
        click.option(
            "--from-command",
            metavar="COMMAND",
            help="A pasted launch command ('vllm serve MODEL ...', 'text-generation-launcher ...', docker run ...): its flags become the plan's; options given here win.",
        ),
    ]
    function = _apply(function, options if engine else options[1:])
    if model_required:
        return click.option(
            "--model",
            "-m",
            metavar="MODEL",
            help="config.json file or folder, a model in the local HF cache, a catalog id/alias (`kvops models`), or a Hub id ORG/NAME[@REVISION] (hf://ORG/NAME reads the Hub first) [required unless --from-command names it].",
        )(function)
    return click.option(
        "--model",
        "-m",
        metavar="MODEL",
        help="The model the run served [default: read from the log's non-default args].",
    )(function)


def engine_option(function: Callable) -> Callable:
    """--engine for the commands that read an engine's metrics (required: the metric names differ)."""
    from kvops import engines

    choice = click.Choice(engines.NAMES, case_sensitive=False)
    return click.option("--engine", required=True, type=choice, help="The serving engine whose metrics are read.")(
        function
    )


def policy_option(function: Callable) -> Callable:
    return click.option(
        "--policy",
        "policy_path",
        type=click.Path(dir_okay=False),
        metavar="FILE",
        help="Degrade policy YAML (default: the shipped configs/policy.yaml).",
    )(function)


def runbook_option(function: Callable) -> Callable:
    return click.option(
        "--runbook-url",
        default="runbooks",
        show_default=True,
        metavar="BASE",
        help="Where the runbooks are published; each alert links BASE/<alertname, lowercased>.md.",
    )(function)


def capacity_options(function: Callable) -> Callable:
    """The KV capacity an engine that does not export its KV usage needs (TGI's max batch total tokens)."""
    options = [
        click.option(
            "--max-batch-total-tokens",
            type=POSITIVE,
            metavar="N",
            help="TGI: the batch token capacity (its KV pool in tokens).",
        ),
        click.option(
            "--plan",
            type=click.Path(dir_okay=False),
            metavar="FILE",
            help="TGI: read the capacity from a kvops plan (JSON with max_batch_total_tokens).",
        ),
        click.option(
            "--startup-log",
            type=click.Path(dir_okay=False),
            metavar="FILE",
            help="TGI: read the capacity from its startup log ('Setting max batch total tokens to N').",
        ),
    ]
    return _apply(function, options)


def watch_capacity(engine_name: str, tokens: int | None, plan: str | None, startup_log: str | None) -> int | None:
    """The capacity from the one capacity option given, for an engine that needs one; for others, none may be."""
    from kvops import engines

    engine = engines.get(engine_name)
    given = [
        name
        for name, value in (("--max-batch-total-tokens", tokens), ("--plan", plan), ("--startup-log", startup_log))
        if value is not None
    ]
    if not engine.needs_capacity:
        if given:
            needing = ", ".join(name for name in engines.NAMES if engines.get(name).needs_capacity)
            raise click.UsageError(
                f"{given[0]} applies to --engine {needing} only ({engine.title} exports its KV usage)"
            )
        return None
    if len(given) != 1:
        raise click.UsageError(
            f"--engine {engine.name} needs the batch token capacity from exactly one of --max-batch-total-tokens N, --plan FILE, --startup-log FILE"
        )
    return tokens if tokens is not None else engine.capacity_from(plan=plan, startup_log=startup_log)


def checked_selector(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """A click callback: --selector must be a PromQL label selector naming the engine's scrape job: `up` is read
    through it too (KVMetricsStale, the watcher's replicas), and without a job it holds every other target's."""
    from kvops.engines.metrics import selector_matchers

    try:
        matchers = selector_matchers(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None
    if value is not None and not any(re.match(r"job\s*=", matcher) for matcher in matchers):
        raise click.BadParameter(
            f'{value!r} names no job: add the engine\'s scrape job, e.g. \'{{job="vllm", namespace="llm"}}\' '
            "(up{...} read through it would hold every other target's too)"
        )
    return value


def run_options(function: Callable) -> Callable:
    """The deployment options of a run being read (`calibrate`): the model may come from the run's own log."""
    return engine_options(function, model_required=False)


def workload_options(function: Callable) -> Callable:
    """What the deployment must serve and how: shared by `plan` and `manifests`."""
    options = [
        click.option("--prompt-tokens", type=click.IntRange(min=1), help="Expected prompt tokens per request."),
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
            help="vLLM: name the KV-guard scheduler (--scheduler-cls kvops_vllm.scheduler.KVGuardScheduler; needs kvops installed in vLLM's own Python)  [default: no-guard, while it costs goodput against stock vLLM]",
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
    return engine_options(_apply(function, options))


# click parameter name -> DeploymentOptions field, where they differ
_FIELDS = {"gpu_name": "gpu", "profile_path": "profile", "policy_path": "policy"}
_SIZES = {"gpu_memory": "--gpu-memory", "kv_cache_memory_bytes": "--kv-cache-memory-bytes"}


def deployment_options(ctx: click.Context, params: dict[str, Any], launcher: tuple[str, ...] = ()) -> DeploymentOptions:
    """The deployment options the command's parameters state; `given` holds those the user stated: typed, in the -f
    file, or in a pasted launch command (--from-command), which states the rest. Typed options win over the pasted
    command, which wins over the file (flags override the file)."""
    from dataclasses import replace

    from click.core import ParameterSource

    from kvops.deployment import DeploymentOptions

    params, derived = _vllm_spellings(dict(params))
    known = set(DeploymentOptions().field_names())
    values: dict[str, Any] = {}
    typed_here, in_file = set(), set()
    for name, value in params.items():
        field = _FIELDS.get(name, name)
        if field not in known:
            continue
        if name in _SIZES and value is not None:
            value = _size(name, value)
        values[field] = value
        if name in derived or ctx.get_parameter_source(name) == ParameterSource.COMMANDLINE:
            typed_here.add(field)
        elif ctx.get_parameter_source(name) == ParameterSource.DEFAULT_MAP:
            in_file.add(field)
    if values.get("workload") and (values.get("prompt_tokens") is not None or values.get("gen_tokens") is not None):
        raise click.UsageError("give either --workload FILE or --prompt-tokens/--gen-tokens, not both")
    if launcher:
        values["launcher"] = launcher
        typed_here.add("launcher")
    options = DeploymentOptions(**values, given=frozenset(typed_here))
    if params.get("from_command"):
        typed_version = values.get("engine_version") if "engine_version" in typed_here else None
        file_version = values.get("engine_version") if "engine_version" in in_file else None
        options = options.under(_from_command(params["from_command"], typed_version, file_version))
    return replace(options, given=options.given | in_file)


def _size(name: str, text: str) -> int:
    value = parse_bytes(text, _SIZES[name])
    if name == "gpu_memory" and value < GiB:  # "80" is 80 bytes: a unit left out, not a GPU
        raise click.UsageError(
            f"--gpu-memory {text!r} is {value:,} bytes; give the device's memory with a unit, e.g. 80GiB"
        )
    return value


def _skip_layers(ctx: click.Context, param: click.Parameter, value: str | None) -> tuple[str, ...]:
    from kvops.engines.vllm.flags import skip_layers

    if value is None:
        return ()
    try:
        return skip_layers(value, "--kv-cache-dtype-skip-layers")
    except KvopsError as exc:
        raise click.BadParameter(str(exc)) from None


def typed(ctx: click.Context, name: str) -> bool:
    """The user stated this parameter: on the command line or in the -f file (click's default map)."""
    from click.core import ParameterSource

    return ctx.get_parameter_source(name) in (ParameterSource.COMMANDLINE, ParameterSource.DEFAULT_MAP)


def _vllm_spellings(params: dict[str, Any]) -> tuple[dict[str, Any], set[str]]:
    """vLLM's option forms as DeploymentOptions fields (--data-parallel-size as GPUs in all, --cpu-offload-gb in
    bytes, --dtype canonical), and the fields so given."""
    derived = set()
    data_parallel = params.pop("data_parallel", None)
    if data_parallel:
        if params.get("gpus"):
            raise click.UsageError("give --gpus or --data-parallel-size, not both")
        if not params.get("tp"):  # vLLM's default: each replica on one GPU
            params["tp"] = 1
            derived.add("tp")
        params["gpus"] = data_parallel * params["tp"] * (params.get("pp") or 1)
        derived.add("gpus")
    offload = params.pop("cpu_offload_gb", None)
    if offload:
        params["cpu_offload_bytes"] = int(offload * (1 << 30))
        derived.add("cpu_offload_bytes")
    if "dtype" in params:
        params["dtype"] = SERVING_DTYPES[str(params["dtype"]).lower()]
    return params, derived


def _from_command(text: str, version: str | None, fallback: str | None) -> DeploymentOptions:
    """The options a pasted launch command states to the release planned (`version` typed, else the line's image
    tag, else `fallback`, the file's), with a line for each flag it does not use."""
    from kvops.deployment import DeploymentOptions
    from kvops.engines import read_command

    stated = read_command(text, version, fallback)
    return DeploymentOptions.stated(
        engine=stated.engine, **stated.values, command_lines=tuple(stated.lines), kept_options=tuple(stated.kept)
    )


def launcher_words(text: str | None) -> tuple[str, ...]:
    """--launcher COMMAND as the words of a shell command."""
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


def int_list(text: str, option: str) -> list[int]:
    """'1,4,8' -> [1, 4, 8], each a positive integer."""
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise click.BadParameter(
            f"{text!r} is not a comma-separated list of integers, e.g. 1,4,8", param_hint=option
        ) from None
    if not values or any(value < 1 for value in values):
        raise click.BadParameter(f"{text!r} must list positive integers, e.g. 1,4,8", param_hint=option)
    return values


def names(text: str, option: str, valid: tuple[str, ...] | None = None) -> list[str]:
    """'a, b' -> ['a', 'b'], each one of `valid` when given, and each once (a second would run or print again)."""
    found = [part.strip() for part in text.split(",") if part.strip()]
    if not found:
        raise click.BadParameter(f"{text!r} names nothing", param_hint=option)
    for index, name in enumerate(found):
        if valid and name not in valid:
            raise click.BadParameter(f"{name!r}; valid: {', '.join(valid)}", param_hint=option)
        if name in found[:index]:
            raise click.BadParameter(f"{name!r} is named twice; name each once", param_hint=option)
    return found


def needs(extra: str, *modules: str) -> None:
    """Stop with one line when a command's optional dependencies are not installed."""
    missing = [module for module in modules if find_spec(module) is None]
    if missing:
        command = click.get_current_context().command_path
        raise KvopsError(f"{command} needs {', '.join(missing)}: pip install 'kvops[{extra}]'")


def print_json(data: Any) -> None:
    json.dump(data, sys.stdout, indent=2)
    sys.stdout.write("\n")


def warn(message: str) -> None:
    click.echo(f"kvops: warning: {message}", err=True)


def running_version(url: str) -> DeploymentOptions:
    """The release a running vLLM states at /version (nothing when it does not answer: older builds, other engines)."""
    from kvops.deployment import DeploymentOptions
    from kvops.engines.vllm.run import version_from_endpoint
    from kvops.files import fetch_endpoint

    try:
        version = version_from_endpoint(fetch_endpoint(url, "/version", "--metrics"))
    except KvopsError:
        return DeploymentOptions.stated()
    return DeploymentOptions.stated(engine_version=version) if version else DeploymentOptions.stated()
