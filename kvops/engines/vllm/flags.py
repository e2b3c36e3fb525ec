"""`vllm serve` flags (vLLM 0.32.0, `vllm/engine/arg_utils.py`): names, value spellings, the argv and images."""

from __future__ import annotations

from kvops.dtypes import KvDtype
from kvops.engines.flags import flag_args
from kvops.errors import UsageError

PROGRAM = ("vllm", "serve")
IMAGE = "vllm/vllm-openai:v0.32.0"  # docs.vllm.ai deployment/docker: the official image, entrypoint `vllm serve`
ROCM_IMAGE = "vllm/vllm-openai-rocm:v0.32.0"
PORT = 8000
GUARD_SCHEDULER = "kvops_vllm.scheduler.KVGuardScheduler"  # the KV-guard scheduler plugin (plugins/kvops_vllm)
# A default must not cost goodput against stock vLLM: the plan names the guard unasked only while guard v2 holds
# >= 0.95 x stock's goodput on bench/guard_goodput.py (docs/kv-guard.md has the run).
GUARD_BY_DEFAULT = False
GUARD_DEFAULT_REASON = (
    "guard v2 at 0.75 to 1.03 x stock vLLM's goodput on bench/guard_goodput.py, lowest with exact lengths on its "
    "larger shape; a default needs 0.95"
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


def arguments(flags: dict[str, object], program: tuple[str, ...]) -> list[str]:
    """The argv after the program. `vllm serve` takes the model as its positional argument (`--model` is
    deprecated there: vllm/utils/argparse_utils.py); a launcher that is not `... serve`, such as
    `python -m vllm.entrypoints.openai.api_server`, reads only `--model` (its positional model_tag is ignored)."""
    if program[-1:] != ("serve",):
        return flag_args(flags)
    rest = {name: value for name, value in flags.items() if name != "model"}
    return [str(flags["model"]), *flag_args(rest)]


def image(vendor: str | None) -> str:
    """The official image for the device's vendor."""
    return ROCM_IMAGE if vendor == "amd" else IMAGE
