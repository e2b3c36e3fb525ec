"""What the local CPU offers vLLM's CPU build (vllm/platforms/cpu.py, `CpuPlatform.check_and_update_config`). AMX
tiles decide its MLA kernel, and with it the KV block size: a host with them runs the AMX MLA kernel at the default
128-token blocks, one without runs the reference kernel, which only compiles for 16. AVX-512 BF16 decides the
recurrent states' dtype: on a host with it vLLM resets the SSM state to float32 (but for its accelerated Gated
DeltaNet kernel at an explicit 16-bit dtype); without it the state keeps its configured dtype. An fp8 KV cache needs
AVX-512 or AMX tiles: vLLM refuses it on a host with neither."""

from __future__ import annotations

from pathlib import Path

CPUINFO = Path("/proc/cpuinfo")


def has_amx_tiles(cpuinfo: Path | None = None) -> bool:
    """Whether this CPU has AMX tiles (torch.cpu._is_amx_tile_supported, which vLLM asks)."""
    return _has_flag("amx_tile", cpuinfo)


def has_avx512(cpuinfo: Path | None = None) -> bool:
    """Whether this CPU has AVX-512 (torch.cpu._is_avx512_supported): with AMX tiles, what vLLM's CPU attention needs
    for an fp8 KV cache (v1/attention/backends/cpu_attn.py `_get_attn_isa`, 0.32; `supports_kv_cache_dtype`, 0.34)."""
    return _has_flag("avx512f", cpuinfo)


def has_avx512_bf16(cpuinfo: Path | None = None) -> bool:
    """Whether this CPU has AVX-512 BF16 (torch.cpu._is_avx512_bf16_supported, which vLLM asks)."""
    return _has_flag("avx512_bf16", cpuinfo)


def _has_flag(flag: str, cpuinfo: Path | None) -> bool:
    """Whether the kernel lists `flag` among this CPU's flags (False where /proc/cpuinfo cannot be read: not Linux,
    or not x86, where vLLM takes the plain kernels too)."""
    try:
        text = (cpuinfo or CPUINFO).read_text(errors="replace")
    except OSError:
        return False
    return any(line.partition(":")[2].split().count(flag) for line in text.splitlines() if line.startswith("flags"))
