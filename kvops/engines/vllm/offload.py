"""vLLM's host (CPU) KV tier, planned: what `--kv-offloading-size GiB --kv-offloading-backend native` holds, the
host RAM it pins, and what reloading a request costs over the GPU's host link.

The native backend (vLLM 0.32.0) sizes the tier as `vllm/v1/kv_offload/cpu/spec.py` (CPUOffloadingSpec) does:

    copies       = 1 for MLA models under tensor parallelism (one latent copy serves every rank), else the ranks
    chunk bytes  = round_up(bytes per GPU block x copies x blocks_per_chunk, the host page size 4096)
    chunks       = floor(size GiB x 2^30 / chunk bytes)          (the size is all ranks' together)
    tokens       = chunks x blocks_per_chunk x block size / KV cache groups

with `blocks_per_chunk` 1 (`kv_connector_extra_config`, offloading/config.py). The per-GPU bytes per block are the
plan's (`worker_kv_bytes_per_block`: the GPU pool over its blocks). vLLM does not export the tier's capacity
(vllm-project/vllm#49307); `vllm:cache_config_info` states the size in GiB. With `lmcache` the size is the LMCache
server's (vllm/config/vllm.py does not pass it on), so kvops cannot count its tokens.

A reload moves a request's blocks from host memory to every GPU, each over its own link, in parallel:

    reload seconds = blocks per request x bytes per GPU block / (the link's x16 rate x EFFICIENCY)

The link is the GPU's PCIe generation (vendor datasheets); copies reach about 80% of its raw rate (an estimate,
erring slow): measure it with vLLM's own counters, rate(vllm:kv_offload_load_bytes) / rate(_load_time).
The CPU build has no tier: the native worker refuses non-CUDA devices ("CPU Offloading is currently only supported
on CUDA-alike and XPU GPUs", CPUOffloadingSpec.get_worker in vllm/v1/kv_offload/cpu/spec.py). Checked: the 0.32.0
CPU build started with `--kv-offloading-size 1` exits 1 with that error from its worker.
"""

from __future__ import annotations

from dataclasses import replace

from kvops.engines.vllm import flags
from kvops.engines.vllm.capacity import VllmCapacity
from kvops.errors import UsageError
from kvops.frozen import frozen
from kvops.plan import Plan, PlanInputs
from kvops.units import GiB, format_bytes

BACKENDS = ("native", "lmcache")
HOST_PAGE = 4096  # mmap.PAGESIZE: SharedOffloadRegion.BLOCK_SIZE_ALIGNMENT
BLOCKS_PER_CHUNK = 1
EFFICIENCY = 0.8  # what host-to-device copies reach of the link's raw rate (an estimate)
LOAD_TARGET_MS = 5.0  # the policy's offload_load_latency.above_ms default: kvops' original target for swapped contexts
# PCIe x16 raw rate per direction: 16 GT/s (Gen4) or 32 GT/s (Gen5) x 16 lanes x 128/130 encoding / 8 bits.
PCIE_X16 = {4: 16e9 * 16 * 128 / 130 / 8, 5: 32e9 * 16 * 128 / 130 / 8}
PCIE_GENERATION = {  # the GPU's host link, from each vendor's datasheet
    "A10G": 4,
    "L4": 4,
    "L40S": 4,
    "A100-40GB": 4,
    "A100-80GB": 4,
    "H100-80GB": 5,
    "H200": 5,
    "B200": 5,
    "RTX-3090": 4,
    "RTX-4090": 4,
    "MI300X": 5,
}
UNKNOWN_GENERATION = 4  # a device the catalog lacks: the slower link, so the reload cost errs long


@frozen
class HostTier:
    """The tier of one replica, as the native backend sizes it."""

    size_bytes: int  # all tensor-parallel ranks together: the host RAM it pins
    chunk_bytes: int
    chunks: int
    tokens: int
    link: str
    link_bytes_per_second: float  # effective, per GPU
    request_blocks: int
    request_bytes_per_gpu: int

    @property
    def reload_ms(self) -> float:
        return self.request_bytes_per_gpu / self.link_bytes_per_second * 1000

    def note(self, replicas: int, request_tokens: int) -> str:
        host = format_bytes(self.size_bytes * replicas)
        per_node = f" ({host} for the {replicas} replicas of this launch)" if replicas > 1 else ""
        verdict = "within" if self.reload_ms <= LOAD_TARGET_MS else "over"
        return (
            f"host KV tier (--kv-offloading-size {self.size_bytes / GiB:g}, native): {self.chunks:,} chunks of "
            f"{format_bytes(self.chunk_bytes)} ({self.chunk_bytes} B) = {self.tokens:,} KV tokens of evicted blocks per "
            f"replica, pinning {format_bytes(self.size_bytes)} of host RAM{per_node}; reloading a planned request "
            f"({request_tokens:,} tokens, {self.request_blocks} blocks, {format_bytes(self.request_bytes_per_gpu)} per "
            f"GPU) takes ~{self.reload_ms:.2g} ms over {self.link} at ~{self.link_bytes_per_second / 1e9:.0f} GB/s "
            f"(an estimate: {EFFICIENCY:.0%} of its raw rate), {verdict} the {LOAD_TARGET_MS:g} ms load target; vLLM "
            "measures it: rate(vllm:kv_offload_load_time_total) / rate(vllm:kv_offload_load_size_count)"
        )


def link(inputs: PlanInputs) -> tuple[str, float]:
    """The GPU's host link and its effective rate per direction."""
    gpu = inputs.gpu
    generation = PCIE_GENERATION.get(gpu.id if gpu else "", UNKNOWN_GENERATION)
    known = gpu is not None and gpu.id in PCIE_GENERATION
    name = f"PCIe Gen{generation} x16" + ("" if known else " (assumed: the device is not in the catalog)")
    return name, PCIE_X16[generation] * EFFICIENCY


def host_tier(inputs: PlanInputs, plan: Plan, size_bytes: int) -> HostTier:
    """The native tier `size_bytes` makes for this plan's pool."""
    capacity = plan.capacity
    assert isinstance(capacity, VllmCapacity)  # a vLLM plan that sized its pool
    copies = 1 if inputs.spec.is_mla and inputs.tp > 1 else inputs.tp
    per_block = capacity.bytes_per_block
    chunk = -(-(per_block * copies * BLOCKS_PER_CHUNK) // HOST_PAGE) * HOST_PAGE
    chunks = size_bytes // chunk
    name, rate = link(inputs)
    return HostTier(
        size_bytes=size_bytes,
        chunk_bytes=chunk,
        chunks=chunks,
        tokens=chunks * BLOCKS_PER_CHUNK * capacity.block_size // capacity.kv_cache_groups,
        link=name,
        link_bytes_per_second=rate,
        request_blocks=capacity.blocks_per_request,
        request_bytes_per_gpu=capacity.blocks_per_request * per_block,
    )


def with_tier(inputs: PlanInputs, plan: Plan) -> Plan:
    """The plan with the host tier the inputs ask for: its flags, and a note of what it holds and costs."""
    size = inputs.kv_offloading_size
    if size is None:
        return plan
    if inputs.device == "cpu":
        raise UsageError(
            "--kv-offloading-size: vLLM's CPU build has no host KV tier (its native offloading worker refuses "
            "non-CUDA devices: 'CPU Offloading is currently only supported on CUDA-alike and XPU GPUs')"
        )
    backend = inputs.kv_offloading_backend or "native"
    if backend not in BACKENDS:
        raise UsageError(f"--kv-offloading-backend {backend!r}; valid: {', '.join(BACKENDS)}")
    if not plan.flags:
        return plan
    engine_flags = {**plan.flags, "kv-offloading-size": size, "kv-offloading-backend": backend}
    notes = list(plan.notes)
    if backend == "native" and isinstance(plan.capacity, VllmCapacity):
        tier = host_tier(inputs, plan, round(size * GiB))
        notes.append(tier.note(inputs.replicas, plan.capacity.request_tokens))
    else:
        notes.append(
            f"host KV tier through LMCache: its server holds the blocks and sets its own size (vLLM does not pass "
            f"--kv-offloading-size {size:g} on), so kvops cannot count the tokens it holds"
        )
    return replace(
        plan,
        flags=engine_flags,
        args=tuple(flags.arguments(engine_flags, plan.program, inputs.kept_options)),
        notes=tuple(notes),
    )
