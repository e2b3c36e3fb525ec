"""The attention backend a vLLM release's CUDA platform picks for a model on a GPU, found on this CPU host: the
release's own priority list (`_get_backend_priorities`, platforms/cuda.py) walked in order, each backend class
loaded from the release (its CUDA extension and FlashInfer stood in for, as neither loads here) and asked what it
declares: compute capability, KV cache dtype, head size, MLA and sparse kind. `supports_combination`, which asks the
CUDA libraries and the model's dims, is not run: on a CUDA host FLASH_ATTN_MLA passes it on Hopper (FA3 ships in
the wheel, `_vllm_fa3_C`), and the catalog's MLA models have the qk_nope_head_dim 128 FLASHINFER_MLA requires."""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types
from typing import Any
from unittest import mock

# catalog GPU -> the capability major vLLM's choices test
CAPABILITY = {"A100-80GB": 8, "L40S": 8, "H100-80GB": 9, "H200": 9, "B200": 10}


class _FlashInferStandIn(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Any `flashinfer` module as a mock: its Python kernels' imports only, which the classes' declarations never
    call."""

    def find_spec(self, name: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if name == "flashinfer" or name.startswith("flashinfer."):
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> Any:
        module = mock.MagicMock(name=spec.name)
        module.__path__, module.__spec__ = [], spec
        return module

    def exec_module(self, module: Any) -> None:
        return None


def _stand_ins() -> None:
    if not any(isinstance(finder, _FlashInferStandIn) for finder in sys.meta_path):
        sys.meta_path.insert(0, _FlashInferStandIn())
    sys.modules.setdefault("vllm._C_stable_libtorch", types.ModuleType("vllm._C_stable_libtorch"))
    import vllm.v1.attention.backends.fa_utils as fa_utils

    for name in ("flash_attn_varlen_func", "get_scheduler_metadata", "reshape_and_cache_flash"):
        setattr(fa_utils, name, getattr(fa_utils, name, None))


def picked_backend(
    gpu: str, use_mla: bool, kv_cache_dtype: str, head_size: int, num_heads: int, use_mm_prefix: bool = False
) -> type:
    """The class of the first backend in the release's order for this GPU that declares it serves the model (dense
    attention or dense MLA, not sparse; `use_mm_prefix`: a multimodal model's bidirectional image-token attention)."""
    _stand_ins()
    from vllm.platforms import cuda
    from vllm.platforms.interface import DeviceCapability

    capability = DeviceCapability(CAPABILITY[gpu], 0)
    order = cuda._get_backend_priorities.__wrapped__(
        use_mla=use_mla, device_capability=capability, num_heads=num_heads, kv_cache_dtype=kv_cache_dtype,
        head_size=head_size, use_mm_prefix=use_mm_prefix,
    )  # fmt: skip
    for backend in order:
        cls = backend.get_class()
        if (
            cls.is_mla() == use_mla
            and not cls.is_sparse()
            and cls.supports_compute_capability(capability)
            and cls.supports_kv_cache_dtype(kv_cache_dtype)
            and cls.supports_head_size(head_size)
            and (cls.supports_mm_prefix() or not use_mm_prefix)
        ):
            return cls
    raise AssertionError(f"no backend for {gpu}, mla {use_mla}, {kv_cache_dtype}, head size {head_size}")
