"""What one engine step costs on a GPU: roofline terms of the scheduled batch, each times a fitted coefficient.

For a batch whose request r computes q_r new tokens over c_r tokens already cached (T = sum of q_r tokens, S of
them sampled; a batch within the engine's CUDA graphs runs as the next captured size, so T there is that size:
`graph_sizes`), per GPU:

    t_step = step_s + layer_s x L + tp_step_s x [tp > 1]
           + linear    x max(W_dense / BW, F_dense / FLOPS)       the dense matrix multiplies: weights read or computed
           + experts   x max(W_experts / BW, F_experts / FLOPS)   the routed experts' (MoE kernels), alike
           + compute   x (F_dense + F_experts) / FLOPS            what reading and computing do not overlap
           + kv        x KV_read / BW                             every scheduled request's cache read once
           + attention x F_attention / FLOPS                      QK^T and PV over the causal pairs
           + comm      x AR_bytes / LINK                          tensor parallel: two all-reduces per layer,
           + comm_latency_s x 2L x (tp - 1)                       each a hop to every other GPU
           + expert_elements x N_experts / BW                    the routed experts' work per weight element
           + moe_layer_s x L_moe                                  each MoE layer's small kernels, a floor each

    W_dense     the weights outside the routed experts
    W_experts   of the routed experts, the share T tokens touch: 1 - (1 - k/E)^T of E experts at k per token
                (uniform routing; a CUDA graph's padding rows are routed too: Llama 4 Scout, top-1 of 16,
                decoding 11 requests in the graph of 16 touches 64% of its experts, not 51%)
    F_dense     2 x (P_dense x T + P_head x S): the dense matrix parameters per token, the LM head only for the
                sampled tokens (vLLM computes logits for those alone); F_experts = 2 x P_experts x T, k of E each
    KV_read     sum over r and cache kinds of bytes per token x min(c_r + q_r, window)
    F_attention 4 x heads x head dim x the causal (query, key) pairs of each layer kind, windows applied
    AR_bytes    2 (tp - 1) / tp x T x hidden x 2 B per all-reduce (ring), 2 per layer
    N_experts   the weight elements (parameters) of the routed experts W_experts counts, as if one byte each:
                the MoE kernels' work per element whatever its width (loads, scales, dequantization), so that
                8-bit experts do not run twice as fast as 16-bit ones (one per-byte efficiency cannot price both
                Mixtral 8x7B in bf16 and Llama 4 Scout in FP8). Optional: a profile without it prices nothing
    L_moe       the layers with routed experts. Besides its two expert matrix multiplies a MoE layer runs a
                handful of small kernels whatever the batch (vLLM 0.15.1's fused_moe: the router's top-k, the
                tokens sorted by expert, activations quantized for FP8 experts, the activation, the weighted
                sum back), each taking a few microseconds at least; the floor the fit finds, about 20 us a layer,
                is what lets a lightly loaded MoE model (Llama 4 Scout at 8 requests) cost more than its bytes.
                Optional, like expert_elements

On a GPU whose public runs ran slower (or faster) than these efficiencies price it through its datasheet, every
term is times that GPU's scale (`gpu_scales`), fitted on its runs by bench/fit_gpu_scale.py; 1 elsewhere.

BW, FLOPS and LINK are the datasheet's memory bandwidth, dense tensor throughput for the serving dtype and the
GPU-to-GPU link per direction (kvops/catalog/gpu_performance.json). The coefficients are efficiencies (a value of
1.25 on `linear` means 80% of the datasheet) and fixed costs in seconds (tp_step_s: what a step costs more when
the engine drives several GPU workers), fitted by bench/fit_steptime.py on
public measurements and kept with their provenance in kvops/catalog/step_time.json. A request also spends
api_s in the API server (parsing, tokenizing, the first chunk out), which the client sees in TTFT and E2E, and
input_s (optional) from the API server's arrival stamp until the engine core can schedule it, one request at a
time (a burst reaches the core spread out), which an idle core waits out and a busy one hides behind the step it
is running.
"""

from __future__ import annotations

import bisect
import json
from collections.abc import Mapping, Sequence
from dataclasses import field, replace
from functools import lru_cache
from typing import Any

from kvops.errors import KvopsError
from kvops.frozen import frozen
from kvops.packaged import packaged_text

TERMS = (
    "step_s",
    "layer_s",
    "tp_step_s",
    "linear",
    "experts",
    "compute",
    "kv",
    "attention",
    "comm",
    "comm_latency_s",
    "expert_elements",
    "moe_layer_s",
)
OPTIONAL_TERMS = ("expert_elements", "moe_layer_s")  # a profile may leave these out: they then cost nothing
ACTIVATION_BYTES = 2  # all-reduces move 16-bit activations


@frozen
class CacheRead:
    """One cache kind's reads: bytes per cached token per GPU over all its layers, the tokens it keeps (None:
    all), its layers and their query heads per GPU; a recurrent state instead reads `state_bytes` per request."""

    bytes_per_token: int
    window: int | None
    layers: int
    query_heads: int
    head_dim: int
    state_bytes: int = 0


@frozen
class ModelCost:
    """One model's per-GPU costs at a tensor-parallel size: what the roofline terms are computed from."""

    name: str
    layers: int
    hidden: int
    tp: int
    weight_bytes: int  # per GPU
    expert_bytes: int  # per GPU, the routed experts' share of weight_bytes
    num_experts: int
    experts_per_token: int
    dense_parameters: int  # matrix parameters outside the routed experts per token per GPU, the LM head apart
    expert_parameters: int  # routed-expert parameters a token passes through (k of E), per GPU
    head_parameters: int  # the LM head's, per GPU
    caches: tuple[CacheRead, ...]
    moe_layers: int = 0  # the layers with routed experts

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": self.name,
            "layers": self.layers,
            "hidden": self.hidden,
            "tp": self.tp,
            "weight_bytes_per_gpu": self.weight_bytes,
            "expert_bytes_per_gpu": self.expert_bytes,
            "experts": self.num_experts,
            "experts_per_token": self.experts_per_token,
            "dense_matrix_parameters_per_gpu": self.dense_parameters,
            "active_expert_parameters_per_gpu": self.expert_parameters,
            "lm_head_parameters_per_gpu": self.head_parameters,
            "moe_layers": self.moe_layers,
            "caches": [vars(cache) for cache in self.caches],
        }


@frozen
class Hardware:
    """The datasheet figures the terms divide by."""

    name: str
    memory_bandwidth: float  # bytes/s
    flops: float  # dense tensor FLOP/s for the serving dtype
    link_bandwidth: float  # bytes/s per direction between GPUs (0: none)
    source: str


@frozen
class Coefficient:
    value: float
    source: str

    @classmethod
    def parse(cls, data: Mapping[str, Any]) -> Coefficient:
        return cls(float(data["value"]), str(data["source"]))


@frozen
class HeldOut:
    """How a profile did on runs it was not fitted on, of one GPU (or machine), one tensor-parallel size, or models
    of at least `experts_from` routed experts: the range of their measured mean TPOT over the simulated."""

    runs: int
    low: float
    high: float
    source: str
    gpu: str | None = None
    tp: int | None = None
    experts_from: int | None = None
    runs_of: str = "public vLLM"  # what the runs were, as the warning names them

    def applies(self, gpu: str, tp: int, experts: int = 0) -> bool:
        many = self.experts_from is None or experts >= self.experts_from
        return self.gpu in (None, gpu) and self.tp in (None, tp) and many

    def describe(self, scaled: bool = False) -> str:
        """`scaled`: its GPU has a scale (gpu_scales), fitted on these runs, each scored at the scale fitted without
        it (bench/fit_gpu_scale.py and bench/simulate_accuracy.py hold out the same runs)."""
        subject = (
            f"on {self.gpu}"
            if self.gpu
            else f"at tp {self.tp}"
            if self.tp
            else f"for models of {self.experts_from} routed experts or more"
        )
        runs = f"{self.runs} {self.runs_of} run{'s' if self.runs > 1 else ''}"
        spread = f"{self.low:.2f}" if self.low == self.high else f"{self.low:.2f}-{self.high:.2f}"
        how = ", each simulated at the GPU's scale fitted on the others," if scaled else " it was not fitted on"
        return f"the step time {subject}: {runs}{how} ran at {spread} x its TPOT ({self.source})"


@frozen
class Coefficients:
    """A fitted set: each term's coefficient and where it came from, and the API server's time per request."""

    name: str
    terms: Mapping[str, Coefficient]
    api_s: Coefficient
    fitted_on: str
    hardware: Hardware | None = None  # a profile fitted on one machine carries that machine's figures
    input_s: Coefficient | None = None  # the API server's hand-off to the engine core (None: none priced)
    held_out: tuple[HeldOut, ...] = ()  # how it did where it was not fitted (bench/simulate_accuracy.py)
    gpu_scales: Mapping[str, Coefficient] = field(default_factory=dict)  # GPU id -> every term's factor there
    fitted_gpus: tuple[str, ...] = ()  # the GPUs of the public runs it was fitted on (none named: no claim)

    def unscored(self, gpu: str) -> bool:
        """No public run on `gpu` was fitted or scored: its step time is the profile through its datasheet alone."""
        held = any(entry.gpu == gpu for entry in self.held_out)
        return bool(self.fitted_gpus) and gpu not in self.fitted_gpus and gpu not in self.gpu_scales and not held

    def gpu_scale(self, gpu: str) -> float:
        """What every term costs on `gpu` against the GPU the profile was fitted on, its datasheet apart."""
        scale = self.gpu_scales.get(gpu)
        return scale.value if scale is not None else 1.0

    @property
    def input_seconds(self) -> float:
        return self.input_s.value if self.input_s is not None else 0.0

    def values(self) -> tuple[float, ...]:
        """Each term's coefficient in TERMS order; a term the profile leaves out (OPTIONAL_TERMS) costs nothing."""
        return tuple(self.terms[name].value if name in self.terms else 0.0 for name in TERMS)

    def to_dict(self) -> dict[str, Any]:
        return {
            "profile": self.name,
            "fitted_on": self.fitted_on,
            **({"fitted_gpus": list(self.fitted_gpus)} if self.fitted_gpus else {}),
            "terms": {name: vars(term) for name, term in self.terms.items()},
            "api_s": vars(self.api_s),
            **({"input_s": vars(self.input_s)} if self.input_s else {}),
            **({"held_out": [vars(entry) for entry in self.held_out]} if self.held_out else {}),
            **({"gpu_scales": {gpu: vars(scale) for gpu, scale in self.gpu_scales.items()}} if self.gpu_scales else {}),
        }


class StepTimeError(KvopsError):
    """The step-time data cannot be used for this device."""


@frozen
class StepTime:
    """A model on a device: seconds per step from the batch."""

    cost: ModelCost
    hardware: Hardware
    coefficients: Coefficients
    graph_sizes: tuple[int, ...] = ()  # ascending: the CUDA-graph sizes a step's tokens are padded to (none: eager)
    decode_graph_sizes: tuple[int, ...] = ()  # where a step of decodes alone pads otherwise (none: graph_sizes)

    def padded(self, tokens: int, decodes_only: bool = False) -> int:
        """The rows the forward runs for `tokens` scheduled tokens: the next captured size, up to the largest."""
        sizes = self.decode_graph_sizes if decodes_only and self.decode_graph_sizes else self.graph_sizes
        index = bisect.bisect_left(sizes, tokens)
        return sizes[index] if index < len(sizes) else tokens

    def seconds(self, new_tokens: Sequence[int], context: Sequence[int], samples: int) -> float:
        values = self.features(new_tokens, context, samples)
        return sum(coefficient * value for coefficient, value in zip(self.coefficients.values(), values))

    def features(self, new_tokens: Sequence[int], context: Sequence[int], samples: int) -> tuple[float, ...]:
        """Each term's basis for one batch, in TERMS order (seconds at 100% of the datasheet, or counts), times the
        GPU's scale."""
        scale = self.coefficients.gpu_scale(self.hardware.name)
        return tuple(scale * value for value in self._basis(new_tokens, context, samples))

    def _basis(self, new_tokens: Sequence[int], context: Sequence[int], samples: int) -> tuple[float, ...]:
        cost, hardware = self.cost, self.hardware
        tokens = self.padded(sum(new_tokens), all(count == 1 for count in new_tokens))
        dense_s = 2.0 * (cost.dense_parameters * tokens + cost.head_parameters * samples) / hardware.flops
        experts_s = 2.0 * cost.expert_parameters * tokens / hardware.flops
        dense_read_s = (cost.weight_bytes - cost.expert_bytes) / hardware.memory_bandwidth
        touched = _touched(cost, tokens)
        experts_read_s = cost.expert_bytes * touched / hardware.memory_bandwidth
        kv_bytes, attention_flops = 0.0, 0.0
        for cache in cost.caches:
            kv_bytes += _cache_bytes(cache, new_tokens, context)
            if cache.query_heads:
                attention_flops += (
                    4.0 * cache.query_heads * cache.head_dim * cache.layers * _pairs(cache, new_tokens, context)
                )
        comm_s, hops = 0.0, 0.0
        if cost.tp > 1:
            collectives = 2.0 * cost.layers
            ring = 2.0 * (cost.tp - 1) / cost.tp
            comm_s = collectives * ring * tokens * cost.hidden * ACTIVATION_BYTES / (hardware.link_bandwidth or 1.0)
            hops = collectives * (cost.tp - 1)
        return (
            1.0,
            float(cost.layers),
            1.0 if cost.tp > 1 else 0.0,
            max(dense_read_s, dense_s),
            max(experts_read_s, experts_s) if cost.num_experts else 0.0,
            dense_s + experts_s,
            kv_bytes / hardware.memory_bandwidth,
            attention_flops / hardware.flops,
            comm_s,
            hops,
            _expert_elements(cost) * touched / hardware.memory_bandwidth,
            float(cost.moe_layers),
        )

    def with_graphs(self, sizes: Sequence[int], decode_sizes: Sequence[int] = ()) -> StepTime:
        """The same model with the engine's CUDA-graph sizes (each arm's: they follow its max_num_seqs), and the
        decode graphs' where they differ."""
        return replace(self, graph_sizes=tuple(sorted(sizes)), decode_graph_sizes=tuple(sorted(decode_sizes)))

    def to_dict(self) -> dict[str, Any]:
        terms = " + ".join(f"{name} x f_{name}" for name in TERMS if name in self.coefficients.terms)
        scale = self.coefficients.gpu_scales.get(self.hardware.name)
        return {
            "formula": f"t_step = {scale.value:g} x ({terms})" if scale else f"t_step = {terms}",
            **({"gpu_scale": vars(scale)} if scale else {}),
            "model": self.cost.to_dict(),
            "hardware": vars(self.hardware),
            "coefficients": self.coefficients.to_dict(),
        }


def _touched(cost: ModelCost, tokens: int) -> float:
    """The share of routed experts `tokens` tokens touch, each choosing k of E uniformly."""
    if not cost.num_experts:
        return 0.0
    return 1.0 - (1.0 - cost.experts_per_token / cost.num_experts) ** tokens


def _expert_elements(cost: ModelCost) -> float:
    """The routed experts' weight elements per GPU: k of E per token, all E of them."""
    if not cost.num_experts or not cost.experts_per_token:
        return 0.0
    return float(cost.expert_parameters) * cost.num_experts / cost.experts_per_token


def _cache_bytes(cache: CacheRead, new_tokens: Sequence[int], context: Sequence[int]) -> float:
    if cache.state_bytes:
        return float(cache.state_bytes * len(new_tokens))
    window = cache.window
    if window is None:
        return float(cache.bytes_per_token * (sum(new_tokens) + sum(context)))
    return float(cache.bytes_per_token * sum(min(q + c, window) for q, c in zip(new_tokens, context)))


def _pairs(cache: CacheRead, new_tokens: Sequence[int], context: Sequence[int]) -> float:
    """Causal (query, key) pairs: new token i of a request attends to c + i + 1 keys, at most the window."""
    window = cache.window
    total = 0.0
    for q, c in zip(new_tokens, context):
        first, last = c + 1, c + q
        if window is None or last <= window:
            total += (first + last) * q / 2.0
        elif first >= window:
            total += q * window
        else:
            total += (first + window) * (window - first + 1) / 2.0 + (last - window) * window
    return total


# --- the coefficient data ------------------------------------------------------------------------------------


@lru_cache(maxsize=1)
def _data() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(packaged_text("kvops.catalog", "step_time.json"))
    return data


def profiles() -> tuple[str, ...]:
    return tuple(_data()["profiles"])


def coefficients(profile: str) -> Coefficients:
    """A fitted coefficient set by name (kvops/catalog/step_time.json)."""
    data = _data()["profiles"].get(profile)
    if data is None:
        raise StepTimeError(f"step-time profile {profile!r}; valid: {', '.join(profiles())}")
    return _parse(profile, data)


def read_coefficients(text: str, where: str) -> Coefficients:
    """A coefficient set from a file (`--step-time FILE`, as bench/fit_steptime.py writes it)."""
    try:
        data = json.loads(text)
        return _parse(data.get("profile", where), data)
    except KeyError as exc:
        raise StepTimeError(f"--step-time {where}: not a step-time profile (no {exc.args[0]!r})") from None
    except (ValueError, TypeError, AttributeError) as exc:
        raise StepTimeError(f"--step-time {where}: not a step-time profile ({exc})") from None


def _parse(name: str, data: Mapping[str, Any]) -> Coefficients:
    terms = data["terms"]
    missing = [term for term in TERMS if term not in terms and term not in OPTIONAL_TERMS]
    if missing:
        raise ValueError(f"missing terms: {', '.join(missing)}")
    present = [term for term in TERMS if term in terms]
    return Coefficients(
        name=name,
        terms={term: Coefficient.parse(terms[term]) for term in present},
        api_s=Coefficient.parse(data["api_s"]),
        fitted_on=str(data.get("fitted_on", "")),
        fitted_gpus=tuple(data.get("fitted_gpus", ())),
        hardware=Hardware(**data["hardware"]) if data.get("hardware") else None,
        input_s=Coefficient.parse(data["input_s"]) if data.get("input_s") else None,
        held_out=tuple(HeldOut(**entry) for entry in data.get("held_out", ())),
        gpu_scales={gpu: Coefficient.parse(scale) for gpu, scale in data.get("gpu_scales", {}).items()},
    )
