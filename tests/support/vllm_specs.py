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


def kv_cache_specs(config: dict[str, Any], folder: Path, tokenizer: Path, **engine_args: Any):
    """(VllmConfig, {layer name: KVCacheSpec}) from the model vLLM builds on the meta device."""
    import torch
    from vllm.config import get_layers_from_vllm_config, set_current_vllm_config
    from vllm.model_executor.layers.attention_layer_base import AttentionLayerBase
    from vllm.model_executor.model_loader.utils import initialize_model

    _distributed()
    vllm_config = engine_config(
        without_weight_quantization(text_model_config(config)), folder, tokenizer, **engine_args
    )
    with set_current_vllm_config(vllm_config):
        with torch.device("meta"):
            initialize_model(vllm_config=vllm_config)
        layers = get_layers_from_vllm_config(vllm_config, AttentionLayerBase)
        specs = {name: layer.get_kv_cache_spec(vllm_config) for name, layer in layers.items()}
    return vllm_config, {name: spec for name, spec in specs.items() if spec is not None}
