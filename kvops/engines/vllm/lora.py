"""The LoRA adapter slots vLLM allocates at load (--enable-lora), per GPU: pure arithmetic on the model's shapes.

vLLM wraps every LoRA-capable layer when it loads the model (`LoRAModelManager._create_lora_modules`,
vllm/lora/model_manager.py) and gives each wrapper `max_loras` zeroed A and B matrices at `max_lora_rank`
(`create_lora_weights`, vllm/lora/layers/): allocated inside the load that vLLM's "Model loading took" measures
(`GPUModelRunner.load_model`, v1/worker/gpu/model_runner.py in the 0.34.0 wheel), so before the KV cache is sized.
The shapes below are those of the 0.32.0-0.34.0 wheels, where the layers' code is the same for these modules.
"""

from __future__ import annotations

from kvops.errors import UsageError
from kvops.frozen import frozen
from kvops.model.checkpoint import pipeline_partition
from kvops.model.spec import FullAttention, ModelSpec
from kvops.plan import LoraSlots

RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)  # vLLM's MaxLoRARanks (vllm/config/lora.py)
DTYPES = ("auto", "float16", "bfloat16")  # vLLM's LoRADType
# vLLM caps the LM head's LoRA at this vocabulary (LogitsProcessorWithLoRA.create_lora_weights)
MAX_HEAD_VOCAB = 258048

# Text models whose decoder layers vLLM builds as packed q/k/v and gate/up projections (packed_modules_mapping
# {"qkv_proj": [q, k, v], "gate_up_proj": [gate, up]}) beside o_proj and down_proj, no routed experts: the layout this
# module counts. True where the architecture also lists `embedding_modules` (embed_tokens and lm_head get slots of
# their own); model_executor/models/{llama,mistral,qwen2,qwen3,gemma2,gemma3,granite,glm4,exaone}.py, 0.34.0.
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


@frozen
class LoraBytes:
    """The slots' bytes on one GPU (the stage holding the most, with pipeline parallelism) and how they add up."""

    bytes: int
    formula: str


def lora_bytes(spec: ModelSpec, slots: LoraSlots, tp: int, pp: int, width: int) -> LoraBytes | None:
    """The A and B matrices of every slot on the busiest GPU, `width` bytes a value (the serving dtype's under
    --lora-dtype auto); None for an architecture whose LoRA layers kvops does not lay out."""
    architecture = next((name for name in spec.architectures if name in PACKED_DENSE), None)
    layers = [layer for layer in spec.layers if isinstance(layer, FullAttention)]  # sliding and chunked are too
    if architecture is None or spec.num_experts or spec.extra_caches or len(layers) != len(spec.layers):
        return None
    check(slots, tp)
    per_layer = [_decoder_layer(spec, layer, slots, tp) for layer in layers]
    stages = pipeline_partition(len(per_layer), pp)
    starts = [sum(stages[:index]) for index in range(pp)]
    stage_values = [sum(per_layer[start : start + size]) for start, size in zip(starts, stages)]
    embedding = PACKED_DENSE[architecture]
    if embedding:
        stage_values[0] += _embedding(spec, slots)
        stage_values[-1] += _head(spec, slots)
    values = max(stage_values)
    where = f"stage {stage_values.index(values)} of {pp}: " if pp > 1 else ""
    parts = "q/k/v, o, gate/up and down projections" + (", embed_tokens and lm_head" if embedding else "")
    sharded = ", fully sharded" if slots.fully_sharded else ""
    plural = "s" if slots.max_loras > 1 else ""
    return LoraBytes(
        values * width,
        f"{where}{values:,} values x {width} B: {slots.max_loras} LoRA slot{plural} at rank {slots.max_rank}{sharded} on "
        f"the {parts} of {architecture} (vLLM's create_lora_weights, vllm/lora/layers)",
    )


def check(slots: LoraSlots, tp: int) -> None:
    """vLLM's own refusals, as one line each (vllm/config/lora.py; `divide` in the fully sharded layers)."""
    if slots.max_rank not in RANKS:
        raise UsageError(f"--max-lora-rank {slots.max_rank}; valid: {', '.join(map(str, RANKS))}")
    if slots.max_loras < 1:
        raise UsageError(f"--max-loras {slots.max_loras}; valid: 1 or more")
    if slots.dtype not in DTYPES:
        raise UsageError(f"--lora-dtype {slots.dtype!r}; valid: {', '.join(DTYPES)}")
    if slots.fully_sharded and slots.max_rank % tp:
        raise UsageError(
            f"--fully-sharded-loras splits --max-lora-rank {slots.max_rank} over tp {tp}, which does not divide it"
        )


def _decoder_layer(spec: ModelSpec, layer: FullAttention, slots: LoraSlots, tp: int) -> int:
    """One decoder layer's A and B values: column-parallel A matrices hold the whole input (the rank split by tp
    when fully sharded) and B the output's tp share; row-parallel A matrices hold the input's tp share and B the
    whole output (its tp share when fully sharded)."""
    hidden, intermediate, rank = spec.hidden_size, spec.intermediate_size, slots.max_rank
    head_dim, kv_heads = layer.head_dim, layer.num_kv_heads
    column_rank = rank // tp if slots.fully_sharded else rank
    row_output = hidden // tp if slots.fully_sharded else hidden
    query = spec.num_attention_heads // tp * head_dim
    # QKVParallelLinear replicates the KV heads when tp exceeds them: one head per GPU
    kv = (kv_heads // tp if kv_heads >= tp else 1) * head_dim
    qkv = 3 * column_rank * hidden + rank * (query + 2 * kv)
    out = rank * query + row_output * rank
    gate_up = 2 * column_rank * hidden + 2 * rank * (intermediate // tp)
    down = rank * (intermediate // tp) + row_output * rank
    return slots.max_loras * (qkv + out + gate_up + down)


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
