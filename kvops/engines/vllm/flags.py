"""`vllm serve` flags (vLLM 0.32.0, `vllm/engine/arg_utils.py`): names, value spellings, the argv and images."""

from __future__ import annotations

import json
from functools import lru_cache

from kvops.dtypes import KvDtype
from kvops.engines.flags import flag_args, with_kept
from kvops.engines.release import Version, newest_read
from kvops.errors import UsageError
from kvops.frozen import frozen
from kvops.packaged import packaged_text

PROGRAM = ("vllm", "serve")
IMAGE = "vllm/vllm-openai:v0.32.0"  # docs.vllm.ai deployment/docker: the official image, entrypoint `vllm serve`
ROCM_IMAGE = "vllm/vllm-openai-rocm:v0.32.0"
PORT = 8000
GUARD_SCHEDULER = "kvops_vllm.scheduler.KVGuardScheduler"  # the KV-guard scheduler plugin (plugins/kvops_vllm)
# The degrade policy in vLLM's own API server (`--middleware`, vllm/entrypoints/serve/middleware/register.py): warn
# caps, degrade n=1, critical 503/429 with Retry-After, with no second process or hop (plugins/kvops_vllm/middleware.py)
MIDDLEWARE = "kvops_vllm.middleware.KVOpsMiddleware"
# A default must not cost goodput against stock vLLM. Where the KV pool binds, guard v3 ran at stock's goodput
# on the median, not at every point nor from a cold start: 0.99 x on the CPU engine's pool of about 8 requests
# (freshly started: 0.86-1.06 x, medians of six runs whose repetitions spread 0.61-2.18 x; bench/guard_goodput.py)
# and 0.97-1.16 x (medians 0.99-1.04) its SLO goodput in simulated time for an 8B model on one L4 over six traces
# (bench/guard_simulated.py), preempting 0-8% as often; where it does not bind (H100 pools under ShareGPT-like
# traffic) it schedules exactly as stock. And it loads from vLLM's own Python, which the official image lacks. So the
# plan names it only when asked, and says which measured pool a plan's pool is like.
GUARD_BY_DEFAULT = False
PERFORMANCE_MODES = ("balanced", "interactivity", "throughput")  # --performance-mode (config/vllm.py PerformanceMode)
LORA_DTYPES = ("auto", "float16", "bfloat16")  # --lora-dtype (vllm/config/lora.py LoRADType)


def skip_layers(text: str, where: str) -> tuple[str, ...]:
    """--kv-cache-dtype-skip-layers: layer indices, or `sliding_window` for every sliding-window layer (the two
    patterns vLLM's attention layers match, model_executor/layers/attention/attention.py); comma or space apart."""
    items = tuple(item for item in text.replace(",", " ").split() if item)
    bad = [item for item in items if not item.isdigit() and item != "sliding_window"]
    if bad or not items:
        raise UsageError(f"{where} {text!r}; valid: layer indices (0, 1, ...) and sliding_window")
    return items


GUARD_POOL_REQUESTS = 32  # requests of the planned size the pool holds at once, from which it is like the larger pool
GUARD_LARGE_POOL = (
    "like the CPU benchmark's larger pool (about 35), where guard v2 ran at 1.01 to 1.28 x stock vLLM's goodput "
    "(bench/guard_goodput.py)"
)
GUARD_SMALL_POOL = (
    "like the CPU benchmark's pool of about 8 and an 8B model's on one L4, where the guard ran at 0.99 x (freshly "
    "started, 0.86 to 1.06 x in six runs) and at 0.97 to 1.16 x (a median of 0.99 to 1.04) stock "
    "vLLM's goodput, preempting a tenth as often or less "
    "(bench/guard_goodput.py, bench/guard_simulated.py)"
)

# kvops KV dtype -> `--kv-cache-dtype` (CacheDType in vllm/config/cache.py)
_KV_CACHE_DTYPES = {
    "bf16": "bfloat16",
    "fp16": "float16",
    "fp8": "fp8",
    "fp8_e4m3": "fp8_e4m3",
    "fp8_e5m2": "fp8_e5m2",
    "int8": "int8_per_token_head",
    "int4": "int4_per_token_head",
}
# `--kv-cache-dtype` -> kvops KV dtype: how a run's own args name it
KV_DTYPE_OF_FLAG = {"auto": "auto", **{flag: name for name, flag in _KV_CACHE_DTYPES.items()}}
CPU_KV_CACHE_DTYPES = ("auto", "fp8", "fp8_e4m3", "fp8_e5m2")  # CPUAttentionBackend.supported_kv_cache_dtypes


def kv_cache_dtype(dtype: KvDtype, model_dtype: str, device: str) -> str:
    """The `--kv-cache-dtype` value: 'auto' when the cache keeps the model's own dtype."""
    value = "auto" if dtype.name == model_dtype else _KV_CACHE_DTYPES.get(dtype.name)
    if value is None:
        raise UsageError(
            f"--kv-dtype {dtype.name}: vLLM has no {dtype.name} KV cache; valid: auto, {', '.join(_KV_CACHE_DTYPES)}"
        )
    if device == "cpu" and value not in CPU_KV_CACHE_DTYPES:
        raise UsageError(
            f"--kv-dtype {dtype.name}: vLLM's CPU attention takes --kv-cache-dtype {', '.join(CPU_KV_CACHE_DTYPES)} only"
        )
    return value


def middleware(plugin: bool, data_parallel: int) -> str | None:
    """`--middleware`'s value in a plan: kvops' degrade in vLLM's API server where it applies, else None.

    plugin: the plan already loads kvops from vLLM's own Python (it names the KV guard), which the middleware needs
    too. data_parallel: vLLM starts one API server per data-parallel rank by default (`--api-server-count`,
    vllm/entrypoints/cli/serve.py), and each levels on the scheduler stats the engine core sends it alone
    (vllm/v1/core/sched/scheduler.py, update_from_output): one API server sees every step's, so the plan names it
    only there; with data parallelism the watcher's proxy levels on the engines' /metrics."""
    return MIDDLEWARE if plugin and data_parallel <= 1 else None


def arguments(flags: dict[str, object], program: tuple[str, ...], kept: tuple[tuple[str, ...], ...] = ()) -> list[str]:
    """The argv after the program, then a pasted command's options kept as given. `vllm serve` takes the model as
    its positional argument (`--model` is deprecated there: vllm/utils/argparse_utils.py); a launcher that is not
    `... serve`, such as `python -m vllm.entrypoints.openai.api_server`, reads only `--model` (its positional
    model_tag is ignored)."""
    if program[-1:] != ("serve",):
        return with_kept(flag_args(flags), flags, kept)
    rest = {name: value for name, value in flags.items() if name != "model"}
    return with_kept([str(flags["model"]), *flag_args(rest)], flags, kept)


def image(vendor: str | None) -> str:
    """The official image for the device's vendor."""
    return ROCM_IMAGE if vendor == "amd" else IMAGE


# --- reading a `vllm serve` command line -----------------------------------------------------------------------

# `vllm serve` options that change memory but that kvops does not model: named, so a plan read from a command line
# says which of its figures they would move (vllm/engine/arg_utils.py, vLLM 0.32.0)
NOT_MODELLED = {
    "--enable-tower-connector-lora": "LoRA slots on the vision tower and connector",
    "--enable-moe-shared-loras": "LoRA slots on the shared experts",
    "--compilation-config": "CUDA graph capture sizes change the graphs' memory",
    "--optimization-level": "the compilation level changes the CUDA graphs' memory",
    "--hf-overrides": "overrides the config.json fields the plan read",
    "--num-gpu-blocks-override": "fixes the KV block count instead of sizing it",
    "--prefill-context-parallel-size": "prefill context parallelism shards the KV cache by tokens",
    "--enable-eplb": "expert load balancing adds redundant experts",
    "--eplb-config": "redundant experts take GPU memory",
    "--all2all-backend": "expert-parallel all-to-all buffers take GPU memory",
    "--enable-dbo": "dual-batch overlap changes the activation peak",
    "--ubatch-size": "micro-batches change the activation peak",
    "--kv-transfer-config": "a KV connector may turn the hybrid KV cache manager off and holds buffers",
    "--offload-backend": "weights offloaded to host memory",
    "--offload-group-size": "weights offloaded to host memory",
    "--offload-num-in-group": "weights offloaded to host memory",
    "--offload-prefetch-step": "weights offloaded to host memory",
    "--offload-params": "weights offloaded to host memory",
    "--cpu-offload-params": "weights offloaded to host memory",
    "--attention-backend": "the backend decides the block size",
    "--mamba-block-size": "the state models' block alignment",
    "--quantization-config": "an online quantization's settings",
    "--moe-backend": "the experts' kernel layout",
    "--kernel-config": "kernel workspaces",
    "--mm-processor-cache-gb": "the multimodal processor cache (host memory)",
    "--mm-encoder-tp-mode": "how the vision encoder is split",
    "--mm-ipc-gpu-memory-gb": "multimodal tensors held in GPU memory",
    "--runner": "a pooling runner keeps no KV cache",
    "--convert": "a pooling model keeps no KV cache",
    "--max-num-active-seqs": "bounds the running sequences",
    "--enable-sleep-mode": "sleep mode frees memory while asleep",
}
# options that hold host memory or network state, named so their line says why the GPU budget is unchanged
HOST_MEMORY = {
    "--max-cpu-loras": "LoRA adapters cached in host memory: on the GPU they take the --max-loras slots planned",
    "--lora-modules": "LoRA adapters loaded into host memory: on the GPU they take the --max-loras slots planned",
    "--kv-offloading-size": "host memory for evicted KV blocks: the GPU budget is unchanged",
    "--kv-offloading-backend": "host memory for evicted KV blocks: the GPU budget is unchanged",
}


@frozen
class Removed:
    """An option of older vLLM releases users still pass: the first release whose `vllm serve` refuses it (None:
    not read, only known to be before 0.32.0) and what it was."""

    since: Version | None
    what: str


# options of older vLLM releases users still pass, and what they were: said when the planned release refuses them.
# `since` is read in the PyPI wheels' vllm/engine/arg_utils.py: --num-scheduler-steps is in 0.10.0's (l.803) and
# not in 0.10.1's; --rope-scaling and --rope-theta are in 0.11.0's (l.541, l.543) and not in 0.11.1's.
REMOVED = {
    "--swap-space": Removed(None, "it was the CPU swap space (host memory) of the V0 engine"),
    "--disable-log-requests": Removed(None, "requests are not logged unless --enable-log-requests"),
    "--num-lookahead-slots": Removed(None, "removed with the V0 engine"),
    "--use-v2-block-manager": Removed(None, "removed with the V0 engine"),
    "--num-scheduler-steps": Removed(Version(0, 10, 1), "multi-step scheduling, removed with the V0 engine"),
    "--rope-scaling": Removed(
        Version(0, 11, 1), "a model config field: give it as --hf-overrides '{\"rope_scaling\": ...}'"
    ),
    "--rope-theta": Removed(
        Version(0, 11, 1), "a model config field: give it as --hf-overrides '{\"rope_theta\": ...}'"
    ),
}


def removed_by(spelling: str, planned: Version) -> Removed | None:
    """The removal of `spelling` when the planned release is at or after the first one that refuses it."""
    removed = REMOVED.get(spelling)
    return removed if removed is not None and removed.since is not None and planned >= removed.since else None


# vLLM's --quantization names -> kvops's weight formats (`QuantizationMethods`, vLLM 0.32.0)
QUANTIZATION_OF_FLAG = {
    "fp8": "fp8",
    "fp8_per_tensor": "fp8",
    "fp8_per_block": "fp8",
    "fp8_per_channel": "fp8",
    "fbgemm_fp8": "fp8",
    "awq": "awq",
    "auto_awq": "awq",
    "awq_marlin": "awq",
    "gptq": "gptq",
    "auto_gptq": "gptq",
    "gptq_marlin": "gptq",
    "mxfp4": "mxfp4",
    "gpt_oss_mxfp4": "mxfp4",
    "modelopt_fp4": "nvfp4",
    "nvfp4_per_token": "nvfp4",
    "int8_per_channel_weight_only": "int8",
    "experts_int8": "int8",
    "modelopt": "auto",
    "compressed-tensors": "auto",
    "inc": "auto",
}
# spellings earlier vLLM releases took, read as vLLM 0.32 reads the same checkpoints
RENAMED_QUANTIZATION = {"auto_round": "inc", "auto-round": "inc"}
REMOVED_QUANTIZATION = {"bitsandbytes", "gguf", "deepspeedfp", "hqq", "tpu_int8", "ptpc_fp8", "bitblas", "marlin"}


SERVE_FLAGS = "serve_flags.json"  # each release's full `vllm serve` option table (tests/support/vllm_flags.py)


@frozen
class ServeTable:
    """The full `vllm serve` option table kvops reads a planned release with: the newest table at or before it.
    `full`: the release is at or after the table's, so an option not in it is one the release's parser refuses
    (False for a release older than every table: 0.32.0's is read, and an option not in it may be the release's)."""

    release: Version
    full: bool
    spellings: dict[str, tuple[str, str]]  # every spelling -> (its first long spelling, how many words follow it)

    def get(self, spelling: str) -> tuple[str, str] | None:
        return self.spellings.get(spelling)


@lru_cache(maxsize=1)
def _serve_tables() -> dict[str, dict]:
    tables: dict[str, dict] = json.loads(packaged_text("kvops.engines.vllm", SERVE_FLAGS))["releases"]
    return tables


@lru_cache(maxsize=16)
def serve_table(version: Version) -> ServeTable:
    """The option table a plan for `version` reads a pasted command with."""
    tables = _serve_tables()
    chosen = newest_read(tables, version)
    spellings = {
        spelling: (canonical, option["kind"])
        for canonical, option in tables[chosen.text]["options"].items()
        for spelling in option["spellings"]
    }
    return ServeTable(chosen, chosen <= version, spellings)


def tables_with(spelling: str) -> list[Version]:
    """The releases whose full table takes `spelling`, oldest first."""
    found = [
        Version.parse(name)
        for name, table in _serve_tables().items()
        if any(spelling in option["spellings"] for option in table["options"].values())
    ]
    return sorted(found)


def table_releases() -> str:
    """The releases kvops has a full table of, as a range: 0.32.0-0.34.0."""
    names = sorted(Version.parse(name) for name in _serve_tables())
    return f"{names[0]}-{names[-1]}" if len(names) > 1 else str(names[0])


def check_weight_format(name: str) -> None:
    """vLLM 0.32 serves every weight format kvops models but bitsandbytes (removed) and EETQ (TGI's)."""
    if name.startswith("bitsandbytes"):
        raise UsageError(
            f"{name} weights: vLLM 0.32 has no bitsandbytes quantization (removed); serve an AWQ, GPTQ or FP8 checkpoint, or plan --engine tgi (--quantize {name})"
        )
    if name == "eetq":
        raise UsageError("eetq weights are TGI's (--quantize eetq); plan --engine tgi, or vLLM with --quantization fp8")


def quantization(value: str) -> str:
    """kvops's weight format for vLLM's --quantization value."""
    key = value.strip().lower()
    if key in QUANTIZATION_OF_FLAG:
        return QUANTIZATION_OF_FLAG[key]
    if key in RENAMED_QUANTIZATION:  # the checkpoint's own config names its format; the plan emits no --quantization
        return QUANTIZATION_OF_FLAG[RENAMED_QUANTIZATION[key]]
    if key in REMOVED_QUANTIZATION:
        raise UsageError(
            f"--quantization {value}: vLLM 0.32 has no {value} quantization (removed); serve an AWQ, GPTQ or FP8 checkpoint, or plan --engine tgi, which takes --quantize bitsandbytes"
        )
    raise UsageError(
        f"--quantization {value!r} is not a vLLM 0.32 quantization; valid: {', '.join(QUANTIZATION_OF_FLAG)}"
    )
