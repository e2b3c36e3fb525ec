"""What the local CPU offers vLLM's CPU build. AMX tiles decide its MLA kernel, and with it the KV block size
(vllm/platforms/cpu.py, `CpuPlatform.check_and_update_config`): a host with them runs the AMX MLA kernel at the
default 128-token blocks, one without runs the reference kernel, which only compiles for 16."""

from __future__ import annotations

from pathlib import Path

CPUINFO = Path("/proc/cpuinfo")


def has_amx_tiles(cpuinfo: Path = CPUINFO) -> bool:
    """Whether the kernel lists `amx_tile` among this CPU's flags (False where /proc/cpuinfo cannot be read: not
    Linux, or not x86, where vLLM takes the reference kernel too)."""
    try:
        text = cpuinfo.read_text(errors="replace")
    except OSError:
        return False
    return any(
        line.partition(":")[2].split().count("amx_tile") for line in text.splitlines() if line.startswith("flags")
    )
