"""The host's AMX tiles, which choose vLLM's CPU MLA kernel and its block size, and its AVX-512 BF16, which
chooses the CPU build's recurrent-state dtype."""

from __future__ import annotations

from kvops.cpu_features import has_amx_tiles, has_avx512_bf16
from kvops.engines.vllm.layout import LayoutOptions, default_block_size, state_dtypes
from kvops.model import load_model
from kvops.model.spec import RecurrentState


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


def test_avx512_bf16_is_read_from_the_flags_line(tmp_path):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nflags\t\t: fpu avx2 avx512f avx512_bf16 avx512_vnni\n\n")
    assert has_avx512_bf16(cpuinfo) and not has_amx_tiles(cpuinfo)
    cpuinfo.write_text("processor\t: 0\nflags\t\t: fpu avx2 fma f16c\n\n")  # an AMD EPYC of AVX2 alone
    assert not has_avx512_bf16(cpuinfo)
    assert not has_avx512_bf16(tmp_path / "absent")


def test_the_cpu_builds_ssm_state_is_float32_only_on_a_host_with_avx512_bf16():
    """vLLM's CPU build resets the SSM state to float32 on a host with AVX-512 BF16 (platforms/cpu.py) and keeps
    its dtype on one without: kvops took float32 on every host, and on an AVX2 host planned Granite-4.0-H-Small's
    CPU pool at 2,275 blocks of 1,024 where vLLM 0.32's own gave 4,096 (tests/engine/test_budget_vllm.py)."""
    granite, qwen_next = load_model("granite-4.0-h-small"), load_model("Qwen/Qwen3-Next-80B-A3B-Instruct")
    (state,) = {layer for _, layer in granite.caches() if isinstance(layer, RecurrentState)}
    avx512 = LayoutOptions(device="cpu", cpu_avx512_bf16=True)
    assert state_dtypes(granite, state, avx512) == (2, 4)
    assert state_dtypes(granite, state, LayoutOptions(device="cpu")) == (2, 2)  # AVX2 alone: the model's bf16
    assert state_dtypes(granite, state, LayoutOptions(device="gpu", cpu_avx512_bf16=True)) == (2, 2)
    half = LayoutOptions(device="cpu", cpu_avx512_bf16=True, mamba_ssm_cache_dtype="bfloat16")
    assert state_dtypes(granite, state, half) == (2, 4)  # Mamba-2: no accelerated kernel keeps it
    (gdn,) = {layer for _, layer in qwen_next.caches() if isinstance(layer, RecurrentState)}
    assert state_dtypes(qwen_next, gdn, half) == (2, 2)  # Gated DeltaNet's kernel keeps an explicit 16-bit state
    assert state_dtypes(qwen_next, gdn, avx512) == (2, 4)


def test_a_cpu_plan_with_an_fp8_cache_warns_where_the_host_cannot_hold_it(run_kvops, monkeypatch, tmp_path):
    """vLLM's CPU build refuses an fp8 KV cache on a host with neither AVX-512 nor AMX tiles (cpu_attn.py): kvops
    emitted the command on such a host (an AMD EPYC of AVX2 alone) without a word."""
    import kvops.cpu_features as features

    args = (
        "plan",
        "-m",
        "llama-3.2-1b-instruct",
        "--device",
        "cpu",
        "--kv-cache-memory-bytes",
        "4GiB",
        "--max-model-len",
        "4096",
    )
    for flags, warned in (("fpu avx2 fma", True), ("fpu avx2 avx512f", False), ("fpu avx2 amx_tile", False)):
        cpuinfo = tmp_path / "cpuinfo"
        cpuinfo.write_text(f"processor\t: 0\nflags\t\t: {flags}\n\n")
        monkeypatch.setattr(features, "CPUINFO", cpuinfo)
        assert ("neither AVX-512 nor AMX tiles" in run_kvops(*args, "--kv-dtype", "fp8").stdout) is warned
    assert "AVX-512" not in run_kvops(*args).stdout  # a 16-bit cache runs on any host
