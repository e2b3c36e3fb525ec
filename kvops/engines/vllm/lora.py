"""The LoRA adapter slots vLLM allocates at load (--enable-lora), per GPU: pure arithmetic on the model's shapes.

vLLM wraps every LoRA-capable layer when it loads the model (`LoRAModelManager._create_lora_modules`,
vllm/lora/model_manager.py) and gives each wrapper `max_loras` zeroed A and B matrices at `max_lora_rank`
(`create_lora_weights`, vllm/lora/layers/): allocated inside the load that vLLM's "Model loading took" measures
(`GPUModelRunner.load_model`, v1/worker/gpu/model_runner.py in the 0.34.0 wheel), so before the KV cache is sized.
The shapes below are those of the 0.32.0-0.34.0 wheels, where the layers' code is the same for these modules.
"""

from __future__ import annotations

from kvops.engines.vllm.flags import LORA_DTYPES
from kvops.errors import UsageError
from kvops.frozen import frozen
from kvops.model.checkpoint import pipeline_partition
from kvops.model.spec import FullAttention, ModelSpec
from kvops.plan import LoraSlots

RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)  # vLLM's MaxLoRARanks (vllm/config/lora.py)
# vLLM caps the LM head's LoRA at this vocabulary (LogitsProcessorWithLoRA.create_lora_weights)
MAX_HEAD_VOCAB = 258048

# Text models whose decoder layers vLLM builds as packed q/k/v and gate/up projections (packed_modules_mapping
# {"qkv_proj": [q, k, v], "gate_up_proj": [gate, up]}) beside o_proj and down_proj: the layout this module counts.
# True where the architecture also lists `embedding_modules` (embed_tokens and lm_head get slots of their own);
# model_executor/models/{llama,mistral,qwen2,qwen3,gemma2,gemma3,granite,glm4,exaone}.py, 0.34.0.
PACKED_DENSE = {
    "LlamaForCausalLM": True,
    "MistralForCausalLM": True,  # a LlamaForCausalLM
    "Qwen3ForCausalLM": True,
    "GraniteForCausalLM": True,
    "ExaoneForCausalLM": True,
    "Qwen2ForCausalLM": False,
    "Gemma2ForCausalLM": False,
    "Gemma3ForCausalLM": False,
    "Glm4ForCausalLM": False,
}
# Mixtures of experts with the same attention, a router (`gate`, a ReplicatedLinear) and gated routed experts (w1/w3
# and w2, FusedMoEWithLoRA, vllm/lora/layers/fused_moe.py), no shared experts; both list embedding modules
# (model_executor/models/{mixtral,qwen3_moe}.py, 0.34.0). Qwen3-MoE's dense layers (mlp_only_layers) are counted as
# the dense models' MLP.
GATED_MOE = {"MixtralForCausalLM": True, "Qwen3MoeForCausalLM": True}
ADAPTER_FLAG = 4  # FusedMoEWithLoRA.adapter_enabled: one int32 per slot and one more, per MoE layer


@frozen
class LoraBytes:
    """The slots' bytes on one GPU (the stage holding the most, with pipeline parallelism) and how they add up."""

    bytes: int
    formula: str


def lora_bytes(
    spec: ModelSpec, slots: LoraSlots, tp: int, pp: int, width: int, expert_parallel: bool = False
) -> LoraBytes | None:
    """The A and B matrices of every slot on the busiest GPU, `width` bytes a value (the serving dtype's under
    --lora-dtype auto); None for a model whose LoRA layers kvops does not lay out (expert parallelism's among them)."""
    if spec.num_experts:
        layout = {} if expert_parallel else GATED_MOE
    else:
        layout = PACKED_DENSE
    architecture = next((name for name in spec.architectures if name in layout), None)
    # attention layers all (SlidingWindow and ChunkedLocal are FullAttention's kinds): no state, no latent
    layers = [layer for layer in spec.layers if isinstance(layer, FullAttention)]
    if architecture is None or spec.extra_caches or len(layers) != len(spec.layers):
        return None
    check(slots, tp)
    routed = [bool(spec.num_experts)] * len(layers)
    if spec.num_experts and spec.count and spec.count.layer_experts:
        routed = [experts > 0 for experts in spec.count.layer_experts]
    per_layer = [
        _attention(spec, layer, slots, tp) * width
        + (_experts(spec, slots, tp, width) if experts else _mlp(spec, slots, tp) * width)
        for layer, experts in zip(layers, routed)
    ]
    stages = pipeline_partition(len(per_layer), pp)
    starts = [sum(stages[:index]) for index in range(pp)]
    stage_bytes = [sum(per_layer[start : start + size]) for start, size in zip(starts, stages)]
    embedding = layout[architecture]
    if embedding:
        stage_bytes[0] += _embedding(spec, slots) * width
        stage_bytes[-1] += _head(spec, slots) * width
    total = max(stage_bytes)
    where = f"stage {stage_bytes.index(total)} of {pp}: " if pp > 1 else ""
    parts = "q/k/v and o projections, " + (
        "router and routed experts (w1, w3, w2)" if spec.num_experts else "gate/up and down projections"
    )
    parts += ", embed_tokens and lm_head" if embedding else ""
    sharded = ", fully sharded" if slots.fully_sharded else ""
    plural = "s" if slots.max_loras > 1 else ""
    return LoraBytes(
        total,
        f"{where}{slots.max_loras} LoRA slot{plural} at rank {slots.max_rank}{sharded}, {width} B a value, on the "
        f"{parts} of {architecture} (vLLM's create_lora_weights, vllm/lora/layers)",
    )


def check(slots: LoraSlots, tp: int) -> None:
    """vLLM's own refusals, as one line each (vllm/config/lora.py; `divide` in the fully sharded layers)."""
    if slots.max_rank not in RANKS:
        raise UsageError(f"--max-lora-rank {slots.max_rank}; valid: {', '.join(map(str, RANKS))}")
    if slots.max_loras < 1:
        raise UsageError(f"--max-loras {slots.max_loras}; valid: 1 or more")
    if slots.dtype not in LORA_DTYPES:
        raise UsageError(f"--lora-dtype {slots.dtype!r}; valid: {', '.join(LORA_DTYPES)}")
    if slots.fully_sharded and slots.max_rank % tp:
        raise UsageError(
            f"--fully-sharded-loras splits --max-lora-rank {slots.max_rank} over tp {tp}, which does not divide it"
        )


def _attention(spec: ModelSpec, layer: FullAttention, slots: LoraSlots, tp: int) -> int:
    """One layer's q/k/v and o values. A column-parallel A matrix holds the whole input (the rank split by tp when
    fully sharded) and its B the output's tp share; a row-parallel A holds the input's tp share and its B the whole
    output (its tp share when fully sharded)."""
    hidden, rank = spec.hidden_size, slots.max_rank
    query = spec.num_attention_heads // tp * layer.head_dim
    # QKVParallelLinear replicates the KV heads when tp exceeds them: one head per GPU
    kv = (layer.num_kv_heads // tp if layer.num_kv_heads >= tp else 1) * layer.head_dim
    qkv = 3 * _column_rank(slots, tp) * hidden + rank * (query + 2 * kv)
    out = rank * query + _row_output(hidden, slots, tp) * rank
    return slots.max_loras * (qkv + out)


def _mlp(spec: ModelSpec, slots: LoraSlots, tp: int) -> int:
    """A dense layer's gate/up (column-parallel, two slices) and down (row-parallel) values."""
    hidden, share, rank = spec.hidden_size, spec.intermediate_size // tp, slots.max_rank
    gate_up = 2 * _column_rank(slots, tp) * hidden + 2 * rank * share
    down = rank * share + _row_output(hidden, slots, tp) * rank
    return slots.max_loras * (gate_up + down)


def _experts(spec: ModelSpec, slots: LoraSlots, tp: int, width: int) -> int:
    """A MoE layer's bytes: the router (whole on every GPU: A rank x hidden, B experts x rank) and, for every expert,
    w1 and w3 like a column-parallel slice and w2 like a row-parallel layer (the experts' intermediate size split by
    tp), and the adapter flags."""
    hidden, rank, experts = spec.hidden_size, slots.max_rank, spec.num_experts
    share = (spec.moe_intermediate_size or spec.intermediate_size) // tp
    router = rank * hidden + experts * rank
    w13 = 2 * experts * (_column_rank(slots, tp) * hidden + share * rank)
    w2 = experts * (rank * share + _row_output(hidden, slots, tp) * rank)
    return slots.max_loras * (router + w13 + w2) * width + (slots.max_loras + 1) * ADAPTER_FLAG


def _column_rank(slots: LoraSlots, tp: int) -> int:
    return slots.max_rank // tp if slots.fully_sharded else slots.max_rank


def _row_output(hidden: int, slots: LoraSlots, tp: int) -> int:
    return hidden // tp if slots.fully_sharded else hidden


def _embedding(spec: ModelSpec, slots: LoraSlots) -> int:
    """VocabParallelEmbeddingWithLoRA: A holds the whole vocabulary, B the hidden size, on every GPU."""
    return slots.max_loras * slots.max_rank * (spec.vocab_size + spec.hidden_size)


def _head(spec: ModelSpec, slots: LoraSlots) -> int:
    """LogitsProcessorWithLoRA: A the hidden size, B the whole vocabulary, on every GPU."""
    if spec.vocab_size > MAX_HEAD_VOCAB:
        raise UsageError(
            f"--enable-lora: {spec.name}'s vocabulary of {spec.vocab_size:,} is above the {MAX_HEAD_VOCAB:,} vLLM "
            "serves LoRA with (LogitsProcessorWithLoRA)"
        )
    return slots.max_loras * slots.max_rank * (spec.hidden_size + spec.vocab_size)
