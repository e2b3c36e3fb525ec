"""A checkpoint's own bytes: the safetensors headers (every tensor's dtype, shape and byte range) and what a serving
engine loads of them on one GPU. Pure: the bytes come in from `kvops.model.hub` (HTTP range reads, the Hub's
cache) or from files on disk (`read_local`).

The safetensors format (huggingface/safetensors, docs "Format"): 8 bytes little-endian u64 N, then N bytes of a
JSON header {tensor name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {...}}, then the
data. A tensor's stored bytes are end - begin, whatever its dtype (packed 4-bit, fp8, scales), so the sum per
dtype is exact for MXFP4, NVFP4, FP8 with block or channel scales, AWQ, GPTQ, AutoRound, bitsandbytes and
compressed-tensors alike.

What an engine loads on one GPU (vLLM's loaders and parallel layers):
- float tensors that are weights are cast to the serving dtype (--dtype, auto: the config's, float32 -> bf16);
  quantized tensors and their scales, zero points and packing metadata keep their stored bytes;
- a vision or audio tower is left out when serving text only (`--language-model-only`), the MTP layers unless
  MTP speculative decoding is on, a stored copy of tied embeddings (lm_head.weight) always;
- tensor parallelism splits every linear layer, the embeddings and the LM head by tp; norms, the MoE router and
  its correction bias are replicated; K and V projections are replicated once tp exceeds the KV heads;
- routed experts split over the expert ranks (vLLM: tp x dp, `FusedMoEParallelConfig.make`; whole experts per
  rank under --enable-expert-parallel, so a rank holds ceil(E / ranks) of E);
- pipeline parallelism gives each stage its layers, the embeddings to the first stage and the final norm and LM
  head to the last (a tied LM head is then a second copy on the last stage).
"""

from __future__ import annotations

import re
import struct
from collections.abc import Iterable
from dataclasses import field
from math import ceil, prod
from pathlib import Path, PurePosixPath
from typing import Any

from kvops.errors import ConfigError
from kvops.files import DOCUMENT_LIMIT, load_json, open_regular, read_json
from kvops.frozen import frozen

HEADER_PREFIX = 8  # the u64 header length
MAX_BYTES = 1 << 50  # data offsets and dimensions past a PiB are not a checkpoint's
SAFETENSORS_INDEX = "model.safetensors.index.json"
SAFETENSORS_SINGLE = "model.safetensors"

# bytes per element of the safetensors dtypes a serving engine may cast (float weights)
FLOAT_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2}
SERVING_DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}

# tensors that are part of a quantization format, kept as stored (scales, zero points, packing metadata)
_QUANT_AUX = re.compile(
    r"(scale|scale_inv|scales|scale_2|qzeros|zeros|g_idx|absmax|quant_map|quant_state\..*|nested_absmax|"
    r"nested_quant_map|_blocks|input_global_scale|weight_global_scale|weight_packed|weight_shape|zero_point|"
    r"e_score_correction_bias)$"
)
_VISION = re.compile(
    r"(^|\.)(vision_tower|vision_model|visual|vision_encoder|vision_embed|embed_vision|multi_modal_projector|"
    r"mm_projector|image_newline|audio_tower|audio_model|embed_audio|vision)\."
)
_MTP = re.compile(r"(^|\.)mtp(\.|_)")
_LAYER = re.compile(r"(?:^|\.)(?:layers|h|blocks|decoder\.layers)\.(\d+)\.")
_EXPERTS = re.compile(r"\.experts\.(\d+\.|gate_up_proj|down_proj|w1|w2|w3|gate_proj|up_proj)")
_EMBEDDINGS = re.compile(r"(^|\.)(embed_tokens|wte|word_embeddings|tok_embeddings|embeddings)\.weight$")
_LM_HEAD = re.compile(r"(^|\.)(lm_head|embed_out)\.weight$|^output\.weight$")
_REPLICATED = re.compile(
    r"(norm|ln_f|ln_\d|layernorm)[^.]*\.(weight|bias)$|\.gate\.weight$|\.router\.(weight|bias)$|e_score_correction_bias$"
)
_KV_PROJ = re.compile(r"\.(k_proj|v_proj)\.")


@frozen
class Tensor:
    name: str
    dtype: str  # as safetensors names it: BF16, F8_E4M3, U8, I32, ...
    shape: tuple[int, ...]
    nbytes: int  # stored bytes (end - begin of its data offsets)

    @property
    def numel(self) -> int:
        return prod(self.shape)


@frozen
class Checkpoint:
    """Every tensor of a checkpoint's safetensors files, and where they were read."""

    tensors: tuple[Tensor, ...]
    source: str  # e.g. "Qwen/Qwen3-8B@9c925d6: 5 safetensors files, headers read by HTTP range"
    files: int = 1
    total_size: int | None = None  # model.safetensors.index.json metadata.total_size, when there is an index

    @property
    def stored_bytes(self) -> int:
        return sum(tensor.nbytes for tensor in self.tensors)

    def bytes_by_dtype(self) -> dict[str, int]:
        return _by_dtype(self.tensors, lambda tensor: tensor.nbytes)

    def to_dict(self) -> dict:
        return {
            "source": self.source,
            "files": self.files,
            "total_size": self.total_size,
            "tensors": [[t.name, t.dtype, list(t.shape), t.nbytes] for t in self.tensors],
        }

    @classmethod
    def from_dict(cls, data: dict) -> Checkpoint:
        tensors = tuple(Tensor(name, dtype, tuple(shape), nbytes) for name, dtype, shape, nbytes in data["tensors"])
        return cls(tensors, data["source"], data.get("files", 1), data.get("total_size"))


# --- reading headers ----------------------------------------------------------------------------------------


def header_length(prefix: bytes, where: str) -> int:
    """The header's length from a file's first 8 bytes."""
    if len(prefix) < HEADER_PREFIX:
        raise ConfigError(f"{where}: not a safetensors file (fewer than 8 bytes)")
    (length,) = struct.unpack("<Q", prefix[:HEADER_PREFIX])
    if length > 100 * (1 << 20):
        raise ConfigError(f"{where}: not a safetensors file (a header of {length} bytes)")
    return length


def parse_header(raw: bytes, where: str) -> tuple[Tensor, ...]:
    """The tensors a safetensors JSON header lists, each typed: a dtype name, a shape of whole numbers, data offsets
    [begin, end] with begin <= end."""
    header = load_json(raw.decode("utf-8", errors="replace"), f"{where}: its safetensors header", ConfigError)
    if not isinstance(header, dict):
        raise ConfigError(f"{where}: its safetensors header is not a JSON object")
    return tuple(_tensor(name, entry, where) for name, entry in header.items() if name != "__metadata__")


def _tensor(name: str, entry: Any, where: str) -> Tensor:
    valid = (
        f"{where}: tensor {name!r} has no dtype, shape and data_offsets as safetensors writes them "
        "(a dtype name, whole-number dims, [begin, end] byte offsets)"
    )
    if not isinstance(entry, dict) or not isinstance(entry.get("dtype"), str) or len(entry["dtype"]) > 32:
        raise ConfigError(valid)
    shape, offsets = entry.get("shape"), entry.get("data_offsets")
    if not isinstance(shape, list) or not all(_whole(n, MAX_BYTES) for n in shape) or len(shape) > 16:
        raise ConfigError(valid)
    if not isinstance(offsets, list) or len(offsets) != 2 or not all(_whole(n, MAX_BYTES) for n in offsets):
        raise ConfigError(valid)
    if offsets[1] < offsets[0]:
        raise ConfigError(f"{where}: tensor {name!r} ends (data_offsets {offsets[1]}) before it begins ({offsets[0]})")
    return Tensor(name, entry["dtype"], tuple(shape), offsets[1] - offsets[0])


def _whole(value: Any, high: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= high


def index_entries(data: Any, where: str) -> tuple[list[str], int | None]:
    """The shard files a model.safetensors.index.json names (its weight_map's values, each a file in the model's
    folder) and its metadata.total_size."""
    weight_map, metadata = (data.get("weight_map"), data.get("metadata")) if isinstance(data, dict) else (None, None)
    if not isinstance(data, dict) or not isinstance(weight_map or {}, dict) or not isinstance(metadata or {}, dict):
        raise ConfigError(f"{where}: a safetensors index needs a weight_map object (tensor -> file) and metadata")
    names = set((weight_map or {}).values())
    if not all(isinstance(name, str) and _plain_file(name) for name in names):
        raise ConfigError(f"{where}: weight_map names a file outside the model's folder, or a value that is not one")
    total = (metadata or {}).get("total_size")
    return sorted(names), total if _whole(total, MAX_BYTES) else None


def _plain_file(name: str) -> bool:
    path = PurePosixPath(name)
    return bool(name) and not path.is_absolute() and ".." not in path.parts and "\\" not in name


def read_local(folder: Path) -> Checkpoint | None:
    """The checkpoint of a local model folder (its safetensors headers), or None when it has no safetensors. Each
    file is opened as a regular file only (a FIFO named model.safetensors is refused, not waited on) and only its
    header is read."""
    index = folder / SAFETENSORS_INDEX
    total = None
    if index.is_file():
        names, total = index_entries(read_json(index, "", DOCUMENT_LIMIT, ConfigError), str(index))
    else:
        names = sorted(path.name for path in folder.glob("*.safetensors"))
    files = [folder / name for name in names]
    if not files or not all(path.is_file() for path in files):
        return None
    tensors: list[Tensor] = []
    for path in files:
        with open_regular(path, "", ConfigError) as handle:
            length = header_length(handle.read(HEADER_PREFIX), str(path))
            raw = handle.read(length)
            if len(raw) < length:
                raise ConfigError(f"{path}: not a safetensors file (it ends inside its {length}-byte header)")
            tensors += parse_header(raw, str(path))
    return Checkpoint(tuple(tensors), f"{folder}: {len(files)} safetensors file(s), headers read", len(files), total)


# --- what one GPU loads -----------------------------------------------------------------------------------


@frozen
class Parallel:
    """How the engine splits the weights: tensor-parallel size, pipeline stages, the ranks routed experts are
    spread over (vLLM: tp x dp), and whether each rank holds whole experts (--enable-expert-parallel)."""

    tp: int = 1
    pp: int = 1
    expert_ranks: int = 1
    whole_experts: bool = False


@frozen
class Loading:
    """What the engine leaves out or converts."""

    serving_dtype: str = "bf16"  # float weights are cast to it
    text_only: bool = False  # the vision/audio tower is not loaded
    load_mtp: bool = False  # the MTP layers are loaded (MTP speculative decoding)
    tie_word_embeddings: bool = False
    num_layers: int = 0  # decoder layers; layers.N with N >= this are MTP layers (DeepSeek, GLM)
    num_kv_heads: int = 0
    num_experts: int = 0


@frozen
class LoadedWeights:
    """The weights one GPU holds (on the stage that holds the most), per dtype as loaded, and what was left out."""

    bytes: int
    by_dtype: dict[str, int]
    stage: int  # the pipeline stage these are of
    stage_bytes: tuple[int, ...]  # every stage's bytes
    left_out: dict[str, int] = field(default_factory=dict)  # stored bytes not loaded, by reason
    converted: dict[str, int] = field(default_factory=dict)  # stored dtype -> bytes before casting


def loaded_weights(checkpoint: Checkpoint, loading: Loading, parallel: Parallel) -> LoadedWeights:
    """The weights per GPU the engine loads from this checkpoint."""
    left_out: dict[str, int] = {}
    converted: dict[str, int] = {}
    stages = [dict[str, float]() for _ in range(parallel.pp)]
    serving = loading.serving_dtype
    for tensor in checkpoint.tensors:
        reason = _left_out(tensor.name, loading)
        if reason:
            left_out[reason] = left_out.get(reason, 0) + tensor.nbytes
            continue
        dtype, size = _as_loaded(tensor, serving)
        if dtype != tensor.dtype:
            converted[tensor.dtype] = converted.get(tensor.dtype, 0) + tensor.nbytes
        share = _share(tensor.name, loading, parallel)
        for stage in _stages(tensor.name, loading, parallel.pp):
            stages[stage][dtype] = stages[stage].get(dtype, 0) + size * share
    totals = [sum(ceil(value) for value in stage.values()) for stage in stages]
    worst = max(range(parallel.pp), key=lambda index: totals[index])
    by_dtype = {dtype: ceil(value) for dtype, value in sorted(stages[worst].items())}
    return LoadedWeights(totals[worst], by_dtype, worst, tuple(totals), left_out, converted)


def _left_out(name: str, loading: Loading) -> str | None:
    if loading.text_only and _VISION.search(name):
        return "vision/audio tower (--language-model-only)"
    if not loading.load_mtp and _is_mtp(name, loading):
        return "MTP layers (loaded only for MTP speculative decoding)"
    if loading.tie_word_embeddings and _LM_HEAD.search(name) and not _VISION.search(name):
        return "lm_head.weight, tied to the embeddings (loaded once)"
    return None


def _is_mtp(name: str, loading: Loading) -> bool:
    if _MTP.search(name):
        return True
    layer = _layer_index(name)
    return layer is not None and loading.num_layers > 0 and layer >= loading.num_layers and not _VISION.search(name)


def _as_loaded(tensor: Tensor, serving: str) -> tuple[str, int]:
    """The dtype and bytes the tensor takes once loaded: float weights cast to the serving dtype."""
    if tensor.dtype in FLOAT_BYTES and not _QUANT_AUX.search(tensor.name):
        target = {"bf16": "BF16", "fp16": "F16", "fp32": "F32"}.get(serving, "BF16")
        return target, tensor.numel * FLOAT_BYTES[target]
    return tensor.dtype, tensor.nbytes


def _share(name: str, loading: Loading, parallel: Parallel) -> float:
    """The fraction of the tensor one GPU holds."""
    if _EXPERTS.search(name) and "shared_expert" not in name:
        ranks = parallel.expert_ranks
        if parallel.whole_experts and loading.num_experts:
            return ceil(loading.num_experts / ranks) / loading.num_experts
        return 1 / ranks
    if _REPLICATED.search(name):
        return 1.0
    if _KV_PROJ.search(name) and loading.num_kv_heads and parallel.tp > loading.num_kv_heads:
        return 1 / loading.num_kv_heads  # one KV head per rank: replicated beyond Hkv ranks
    return 1 / parallel.tp


def _stages(name: str, loading: Loading, pp: int) -> list[int]:
    """The pipeline stages that hold the tensor (vLLM's get_pp_indices for decoder layers)."""
    if pp == 1:
        return [0]
    layer = _layer_index(name)
    if layer is not None and not _VISION.search(name):
        return [stage_of_layer(layer, loading.num_layers, pp)]
    if _EMBEDDINGS.search(name):
        return [0, pp - 1] if loading.tie_word_embeddings else [0]
    if _VISION.search(name):
        return [0]
    return [pp - 1]  # final norm, LM head


def _layer_index(name: str) -> int | None:
    match = _LAYER.search(name)
    return int(match.group(1)) if match else None


def pipeline_partition(num_layers: int, pp: int) -> list[int]:
    """Layers per stage as vLLM splits them (`get_pp_indices`): even, the remainder one each to the stages before
    the last, counting back from the second to last."""
    sizes = [num_layers // pp] * pp
    for i in range(2, num_layers % pp + 2):
        sizes[-i] += 1
    return sizes


def stage_of_layer(layer: int, num_layers: int, pp: int) -> int:
    start = 0
    for stage, size in enumerate(pipeline_partition(num_layers, pp)):
        if layer < start + size:
            return stage
        start += size
    return pp - 1  # beyond the decoder layers (MTP): vLLM places them with the last stage


def _by_dtype(tensors: Iterable[Tensor], size) -> dict[str, int]:
    totals: dict[str, int] = {}
    for tensor in tensors:
        totals[tensor.dtype] = totals.get(tensor.dtype, 0) + size(tensor)
    return dict(sorted(totals.items()))
