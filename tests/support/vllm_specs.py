"""vLLM's own KV-cache specs for a config.json: the model built by vLLM on the meta device (no weights, no
memory), its attention and state layers asked `get_kv_cache_spec`, as the model runner asks them.

The vLLM CPU build instantiates most architectures; where it cannot (`unbuildable`), the caller says why and
checks what it can from vLLM's ModelConfig. Nothing is downloaded: the config is written to a folder and the
tokenizer is not initialised.
"""

from __future__ import annotations

import json
import os
import socket
import warnings
from functools import cache
from pathlib import Path
from typing import Any

# The language model's own architecture, for configs that nest it under text_config (the multimodal wrappers
# need torchvision, which does not import beside this torch build) or that lack `architectures`.
TEXT_ARCHITECTURES = {
    "cohere": "CohereForCausalLM",
    "deepseek_v3": "DeepseekV3ForCausalLM",
    "gemma2": "Gemma2ForCausalLM",
    "gemma3_text": "Gemma3ForCausalLM",
    "gemma4_text": "Gemma4ForCausalLM",
    "glm4_moe": "Glm4MoeForCausalLM",
    "granite": "GraniteForCausalLM",
    "granitemoehybrid": "GraniteMoeHybridForCausalLM",
    "kimi_k2": "DeepseekV3ForCausalLM",
    "llama": "LlamaForCausalLM",
    "llama4_text": "Llama4ForCausalLM",
    "ministral3": "Ministral3ForCausalLM",
    "mistral": "MistralForCausalLM",
    "nemotron_h": "NemotronHForCausalLM",
    "qwen3_next": "Qwen3NextForCausalLM",
}

# Weight formats whose CPU kernels need hardware this machine lacks (AMX) or that the CPU build does not
# build at all; the KV-cache specs do not depend on them, so they are left out when building on the meta device.
_CPU_UNBUILDABLE_QUANT = ("fp8", "modelopt", "compressed-tensors", "mxfp4", "awq", "gptq", "bitsandbytes")


def text_model_config(config: dict[str, Any]) -> dict[str, Any]:
    """The language model's config as vLLM's CausalLM class reads it."""
    if "text_config" in config:
        text = dict(config["text_config"])
        for key in ("torch_dtype", "dtype", "tie_word_embeddings"):
            if key in config and key not in text:
                text[key] = config[key]
        return {**text, "architectures": [TEXT_ARCHITECTURES[text["model_type"]]]}
    if not config.get("architectures"):
        return {**config, "architectures": [TEXT_ARCHITECTURES[config["model_type"]]]}
    return config


def without_weight_quantization(config: dict[str, Any]) -> dict[str, Any]:
    quant = config.get("quantization_config") or {}
    if str(quant.get("quant_method", "modelopt")).lower() in _CPU_UNBUILDABLE_QUANT:
        return {key: value for key, value in config.items() if key != "quantization_config"}
    return config


@cache
def _distributed() -> None:
    """One process group of one rank (gloo), with the expert-parallel group MoE layers ask for."""
    warnings.simplefilter("ignore")
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.distributed import init_distributed_environment, initialize_model_parallel

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with set_current_vllm_config(VllmConfig()):  # no model config: every group is created, the EP group too
        init_distributed_environment(
            world_size=1, rank=0, distributed_init_method=f"tcp://127.0.0.1:{port}", local_rank=0, backend="gloo"
        )
        initialize_model_parallel(1, 1)


def engine_config(config: dict[str, Any], folder: Path, tokenizer: Path, **engine_args: Any):
    """vLLM's VllmConfig for this config.json, as `vllm serve` would build it on this machine."""
    from vllm.engine.arg_utils import EngineArgs

    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config))
    os.environ["HF_HUB_OFFLINE"] = "1"
    args = EngineArgs(
        model=str(folder),
        tokenizer=str(tokenizer),
        skip_tokenizer_init=True,
        load_format="dummy",
        dtype="bfloat16",
        **engine_args,
    )
    return args.create_engine_config()


def _any_cpu_isa():
    """A build that does not depend on this host's vector instructions: vLLM 0.34's CPU attention takes an fp8 cache
    only where the host has AVX-512 or AMX tiles (CPUAttentionBackend.supports_kv_cache_dtype,
    v1/attention/backends/cpu_attn.py) and refuses the model otherwise, while the layers and their KV-cache specs are
    the same on any host. So the meta-device build runs as on an AVX-512 host (the specs compared are a GPU's)."""
    from unittest import mock

    import torch

    return mock.patch.object(torch.cpu, "_is_avx512_supported", return_value=True)


class BuiltModel:
    """The model vLLM builds for a config.json on the meta device, and the KV-cache specs of its layers."""

    def __init__(self, config: dict[str, Any], folder: Path, tokenizer: Path, **engine_args: Any):
        import torch
        from vllm.config import get_layers_from_vllm_config, set_current_vllm_config
        from vllm.model_executor.layers.attention_layer_base import AttentionLayerBase
        from vllm.model_executor.model_loader.utils import initialize_model
        from vllm.platforms import current_platform

        _distributed()
        self.vllm_config = engine_config(
            without_weight_quantization(text_model_config(config)), folder, tokenizer, **engine_args
        )
        with set_current_vllm_config(self.vllm_config), _any_cpu_isa():
            with torch.device("meta"):
                initialize_model(vllm_config=self.vllm_config)
            current_platform.update_block_size_for_backend(self.vllm_config)
            self.layers = get_layers_from_vllm_config(self.vllm_config, AttentionLayerBase)
        self.gpu = False

    def specs(self) -> dict[str, Any]:
        """Each layer's `get_kv_cache_spec`; layers that read another layer's KV (kv sharing) keep no cache of
        their own and are left out, as the model runner leaves them out. After `as_gpu`, sliding-window layers
        take the primary block size, as they do on FlashAttention (which runs every multiple of 16; the CPU
        attention's kernels are multiples of 32, so on the CPU they may choose a larger block)."""
        from dataclasses import replace

        from vllm.config import set_current_vllm_config
        from vllm.model_executor.layers.attention import Attention
        from vllm.v1.kv_cache_interface import SlidingWindowSpec

        with set_current_vllm_config(self.vllm_config):
            specs = {
                name: layer.get_kv_cache_spec(self.vllm_config)
                for name, layer in self.layers.items()
                if not (isinstance(layer, Attention) and layer.kv_sharing_target_layer_name)
            }
        if self.gpu:
            block = self.vllm_config.cache_config.block_size
            specs = {
                name: replace(spec, block_size=block) if isinstance(spec, SlidingWindowSpec) else spec
                for name, spec in specs.items()
            }
        return {name: spec for name, spec in specs.items() if spec is not None}

    def as_gpu(self, block_size: int | None, backend: type | None = None) -> None:
        """The cache settings a GPU engine would have: its block size, the SSM state dtype vLLM's model config
        rules choose (not the CPU build's float32), and the hybrid block alignment vLLM's platform base class
        computes with FlashAttention's kernel block sizes in place of the CPU attention's. `block_size` None: no
        --block-size given, the release's own pick (its platform base class's `update_block_size_for_backend` from
        `CacheConfig.DEFAULT_BLOCK_SIZE`, 16 through 0.33 and 64 from 0.34) with `backend`, the attention backend
        the GPU picks (tests/support/cuda_backends.py; None: FlashAttention, or FlashMLA for an MLA model)."""
        from unittest import mock

        from vllm.config import set_current_vllm_config
        from vllm.config.cache import CacheConfig
        from vllm.platforms.interface import Platform
        from vllm.v1.attention.backends.flash_attn import FlashAttentionBackend

        self.gpu = True
        cache = self.vllm_config.cache_config
        hf = self.vllm_config.model_config.hf_text_config
        cache.block_size = CacheConfig.DEFAULT_BLOCK_SIZE if block_size is None else block_size
        cache.mamba_page_size_padded = None
        cache.mamba_ssm_cache_dtype = (
            getattr(hf, "mamba_ssm_cache_dtype", None) or "float32"
            if hf.model_type == "nemotron_h"
            else getattr(hf, "mamba_ssm_dtype", None) or "auto"
        )
        if block_size is None:
            from vllm.v1.attention.backends.mla.flashmla import FlashMLABackend

            cache.user_specified_block_size = False
            default = FlashMLABackend if self.vllm_config.model_config.use_mla else FlashAttentionBackend
            backend = backend or default
            backends = mock.patch.object(Platform, "_find_non_ssm_backends", return_value=[backend])
            with set_current_vllm_config(self.vllm_config), backends:
                Platform.update_block_size_for_backend.__func__(Platform, self.vllm_config)
            return
        if self.vllm_config.model_config.is_hybrid:
            backends = mock.patch.object(Platform, "_find_non_ssm_backends", return_value=[FlashAttentionBackend])
            with set_current_vllm_config(self.vllm_config), backends:
                Platform._align_hybrid_block_size.__func__(Platform, self.vllm_config, FlashAttentionBackend)


def kv_cache_specs(config: dict[str, Any], folder: Path, tokenizer: Path, **engine_args: Any):
    """(VllmConfig, {layer name: KVCacheSpec}) from the model vLLM builds on the meta device, after the platform
    has aligned the block sizes of hybrid state models (`update_block_size_for_backend`, as the executor does
    after loading the model)."""
    model = BuiltModel(config, folder, tokenizer, **engine_args)
    return model.vllm_config, model.specs()


def specs_from_classes(spec: Any, block: int) -> dict[str, Any]:
    """{layer name: KVCacheSpec} for a model the CPU build cannot instantiate: vLLM's own spec classes (and, for
    state layers, its MambaStateShapeCalculator) fed the layer facts kvops read, every layer at `block` tokens, as a
    GPU engine in bf16 holds it (checked against the release's ModelConfig in tests/engine/test_vllm_view.py)."""
    import torch
    from vllm.model_executor.layers.mamba.mamba_utils import MambaStateShapeCalculator
    from vllm.v1.kv_cache_interface import (
        FullAttentionSpec,
        MambaSpec,
        MLAAttentionSpec,
        SlidingWindowSpec,
        SparseCacheRole,
    )

    from kvops.dtypes import KV_DTYPES
    from kvops.engines.vllm.layout import LayoutOptions, state_dtypes

    specs: dict[str, Any] = {}
    for index, layer in spec.caches():
        common = {"block_size": block, "dtype": torch.bfloat16}
        if layer.kind == "mamba":
            if layer.variant == "gdn":
                shapes = MambaStateShapeCalculator.gated_delta_net_state_shape(
                    1, layer.groups, layer.heads, layer.group_dim, layer.head_dim, layer.conv_kernel
                )
            else:
                shapes = MambaStateShapeCalculator.mamba2_state_shape(
                    1, layer.conv_channels, layer.groups, layer.heads, layer.head_dim, layer.group_dim,
                    layer.conv_kernel,
                )  # fmt: skip
            conv, ssm = state_dtypes(spec, layer, LayoutOptions())
            dtypes = tuple({2: torch.bfloat16, 4: torch.float32}[size] for size in (conv, ssm))
            page = block * spec.attention_layers()[0].bytes_per_token(KV_DTYPES["bf16"], 1)
            # MambaMixer2.get_kv_cache_spec adds one prefill checkpoint page; GDN layers do not
            checkpoint = {"num_prefill_checkpoint_blocks": 1} if layer.variant == "mamba2" else {}
            specs[f"layers.{index}.mixer"] = MambaSpec(
                **checkpoint, shapes=shapes, dtypes=dtypes, block_size=block, page_size_padded=page,
                mamba_cache_mode="align",
            )  # fmt: skip
        elif layer.kind == "indexer":
            specs[f"layers.{index}.indexer"] = MLAAttentionSpec(
                block_size=block, num_kv_heads=1, head_size=layer.head_dim, dtype=torch.uint8,
                cache_role=SparseCacheRole.INDEXER,
            )  # fmt: skip
        elif layer.kind == "mla":
            specs[f"layers.{index}.attn"] = MLAAttentionSpec(num_kv_heads=1, head_size=layer.head_dim, **common)
        elif layer.kind == "sliding":
            specs[f"layers.{index}.attn"] = SlidingWindowSpec(
                num_kv_heads=layer.num_kv_heads, head_size=layer.head_dim, sliding_window=layer.window, **common
            )
        else:
            specs[f"layers.{index}.attn"] = FullAttentionSpec(
                num_kv_heads=layer.num_kv_heads, head_size=layer.head_dim, head_size_v=layer.value_dim, **common
            )
    return specs


def vllm_pool(vllm_config: Any, specs: dict[str, Any], memory: int) -> tuple[int, int, float]:
    """(blocks, KV tokens, max concurrency) vLLM's own KV planner gives these specs in `memory` bytes, on a GPU
    engine's layout with async scheduling (kv_cache_utils.get_kv_cache_configs and get_kv_cache_capacity)."""
    from vllm.v1.core import kv_cache_utils

    vllm_config.cache_config.kv_cache_layout = "LBHNC"
    vllm_config.scheduler_config.async_scheduling = True
    configs = kv_cache_utils.get_kv_cache_configs(vllm_config, [specs], [memory])
    scheduler = kv_cache_utils.generate_scheduler_kv_cache_config(configs)
    tokens, concurrency = kv_cache_utils.get_kv_cache_capacity(vllm_config, scheduler)
    return configs[0].num_blocks, tokens, concurrency
