"""The host's AMX tiles, which choose vLLM's CPU MLA kernel and its block size."""

from __future__ import annotations

from kvops.cpu_features import has_amx_tiles
from kvops.engines.vllm.layout import default_block_size
from kvops.model import load_model


def test_amx_tiles_are_read_from_the_flags_line(tmp_path):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nflags\t\t: fpu avx2 avx512f amx_bf16 amx_tile amx_int8\n\n")
    assert has_amx_tiles(cpuinfo)
    cpuinfo.write_text("processor\t: 0\nflags\t\t: fpu avx2 avx512f amx_bf16\n\n")  # AMX-BF16 alone: no tiles named
    assert not has_amx_tiles(cpuinfo)
    cpuinfo.write_text("processor\t: 0\nFeatures\t: fp asimd amx_tile\n")  # an ARM host lists Features, not flags
    assert not has_amx_tiles(cpuinfo)
    assert not has_amx_tiles(tmp_path / "absent")


def test_cpu_mla_block_size_follows_the_hosts_amx_tiles():
    mla, dense = load_model("deepseek-ai/DeepSeek-V2-Lite"), load_model("llama-3-8b")
    assert default_block_size(mla, "cpu", cpu_amx=False) == 16  # the reference kernel compiles for 16 alone
    assert default_block_size(mla, "cpu", cpu_amx=True) == 128  # the AMX kernel: vLLM's CPU default
    assert default_block_size(dense, "cpu", cpu_amx=False) == default_block_size(dense, "cpu", cpu_amx=True) == 128
    assert default_block_size(mla, "gpu", cpu_amx=True) == 64
