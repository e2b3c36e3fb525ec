"""`kvops plan --engine-version <release> --json` against that release's own KV cache arithmetic, for vLLM 0.33 and
0.34 (run by .ci/newer_vllm with the release's wheel ahead of the installed CPU build; skipped on other releases).

For every catalog model, at a few context lengths and pinned KV budgets (--kv-cache-memory-bytes, which 0.34 sizes
without the extensible KV cache), the release's own planner (v1/core/kv_cache_planning.py get_global_kv_cache_groups
and get_kv_cache_configs, as v1/engine/core.py calls them) and capacity report (v1/core/kv_cache_utils.py
get_kv_cache_capacity) give the block count, block sizes, bytes per block, groups, KV tokens and max concurrency
that the plan's capacity must repeat. The specs are the release's own: each layer's `get_kv_cache_spec` from the
model it builds on the meta device, as a GPU engine holds them (no --block-size given: the block the release's
platform code picks from its own default, 16 in 0.33 and 64 in 0.34, with FlashAttention, FlashMLA for MLA, and its
hybrid block alignment: tests/support/vllm_specs.py). Models the CPU build cannot instantiate take their specs from the release's spec
classes and state-shape calculator. Beside the catalog, Jamba's and Falcon-H1's configs (tests/fixtures/models).
"""

from __future__ import annotations

import contextlib
import json
import warnings
from dataclasses import replace
from pathlib import Path

import pytest

from kvops.dtypes import KV_DTYPES
from kvops.engines.vllm.layout import LayoutOptions, aligned_block_size
from kvops.engines.vllm.plan import mm_prefix_head
from kvops.model.catalog import catalog
from kvops.model.locate import catalog_spec, load_model
from kvops.model.spec import ModelSpec
from tests.engine.test_vllm_view import UNBUILDABLE
from tests.support.cuda_backends import picked_backend
from tests.support.paths import REPO
from tests.support.vllm_specs import BuiltModel, engine_config, specs_from_classes

NEWER = ("0.33.0", "0.34.0")
ENTRIES = {entry.id: entry for entry in catalog()}
# hybrids beside the catalog's: Jamba's Mamba-1 layers, Falcon-H1's Mamba-2 ones beside attention on every layer
FIXTURES = [str(REPO / "tests" / "fixtures" / "models" / name) for name in ("jamba-1.5-mini", "falcon-h1-7b-instruct")]
# (max_model_len, KV bytes): a roomy pool, a tight one, and one that holds a request only at the shortest length
POINTS = ((4096, 40 * 2**30 + 777), (8192, 7 * 2**30 + 12345), (1024, 2**27 + 5))
BATCHED, SEQUENCES = 8192, 1024
HOPPER, AMPERE = "H100-80GB", "A100-80GB"
REFUSALS = ("No available memory", "To serve at least one request")


def model_config(model: str) -> dict:
    """The config.json of a catalog model or a fixture folder."""
    return ENTRIES[model].config if model in ENTRIES else json.loads((Path(model) / "config.json").read_text())


def model_spec(model: str) -> ModelSpec:
    return catalog_spec(ENTRIES[model]) if model in ENTRIES else load_model(model)


def _release() -> str:
    """The vLLM on the path, read from its metadata (the wheel's tree put ahead carries its own)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("vllm")
    except PackageNotFoundError:
        return ""


RELEASE = _release()
pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(
        RELEASE not in NEWER,
        reason=f"needs the wheel of vLLM {' or '.join(NEWER)} ahead (.ci/newer_vllm), not {RELEASE or 'this build'}",
    ),
]


@pytest.fixture(autouse=True)
def quiet(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    warnings.simplefilter("ignore")


@pytest.fixture(autouse=True)
def triton_cpu_waived(monkeypatch):
    """0.34's CPU platform refuses an x86 host without triton-cpu (platforms/cpu.py check_and_update_config); here
    the model is only built on the meta device and asked for its specs, which run no kernel: that check alone is
    told Triton is there, the rest of vLLM still sees it missing."""
    import vllm.triton_utils
    from vllm.platforms.cpu import CpuPlatform

    check = CpuPlatform.check_and_update_config.__func__

    def with_triton_said(cls, vllm_config):
        present = vllm.triton_utils.HAS_TRITON
        vllm.triton_utils.HAS_TRITON = True
        try:
            return check(cls, vllm_config)
        finally:
            vllm.triton_utils.HAS_TRITON = present

    monkeypatch.setattr(CpuPlatform, "check_and_update_config", classmethod(with_triton_said))


def vllm_pool(config, specs: dict, length: int, memory: int) -> dict | None:
    """What the release reports for this KV memory at `length` (None where it refuses to start)."""
    from vllm.v1.core import kv_cache_planning, kv_cache_utils

    config.model_config.max_model_len = length
    groups = kv_cache_planning.get_global_kv_cache_groups(config, [dict(specs)])
    try:
        configs = kv_cache_planning.get_kv_cache_configs(config, [dict(specs)], [memory], groups)
    except ValueError as refused:
        assert any(reason in str(refused) for reason in REFUSALS), refused
        return None
    scheduler = kv_cache_utils.generate_scheduler_kv_cache_config(configs)
    tokens, concurrency = kv_cache_utils.get_kv_cache_capacity(config, scheduler)
    paged = [group for group in scheduler.kv_cache_groups if _paged(group.kv_cache_spec, config)]
    shared = [group for group in paged if group.kv_cache_spec.prefix_cacheable]
    return {
        "num_blocks": configs[0].num_blocks,
        "kv_cache_size_tokens": tokens,
        "max_concurrency": round(concurrency, 4),
        "block_size": min(group.kv_cache_spec.block_size for group in shared or paged),
        "bytes_per_block": kv_cache_planning._pool_bytes_per_block(config, configs[0].kv_cache_groups),
        "group_block_sizes": sorted(group.kv_cache_spec.block_size for group in paged),
    }


def _paged(spec, config) -> bool:
    """Whether a group's block size counts tokens: not a state group outside align mode, whose block size vLLM sets
    to the max_model_len the engine was built with (model_executor/models/config.py, `mamba_block_size`; the engine's
    block size is then the smaller of it and the attention's), where kvops reports the attention block size (left
    open: no pool figure depends on it)."""
    from vllm.v1.kv_cache_interface import MambaSpec

    return not isinstance(spec, MambaSpec) or config.cache_config.mamba_cache_mode == "align"


def planned(run_kvops, model: str, gpu: str, length: int, memory: int, tp: int, dtype: str, caching: bool) -> dict:
    """The plan's capacity for the same model, GPU, length, pinned KV memory, batch and tensor parallelism (the GPU's
    memory raised so that every model's weights fit: only the KV memory is compared) and prefix caching."""
    ran = run_kvops(
        "plan", "-m", model, "--engine-version", RELEASE, "--gpu", gpu, "--gpu-memory", "8TiB", "--tp", str(tp),
        "--kv-dtype", dtype, "--kv-cache-memory-bytes", str(memory), "--max-model-len", str(length),
        "--max-num-batched-tokens", str(BATCHED), "--max-num-seqs", str(SEQUENCES), "--format", "json",
        "--enable-prefix-caching" if caching else "--no-enable-prefix-caching", expect=None,
    )  # fmt: skip
    assert ran.exit_code in (0, 3), ran.stderr
    return json.loads(ran.stdout)


def compare(run_kvops, model: str, gpu: str, config, specs: dict, tp: int = 1, dtype: str = "bf16") -> int:
    """Each point's figures, the release's against the plan's; the points the release accepts."""
    checked = 0
    caching = config.cache_config.enable_prefix_caching
    for length, memory in POINTS:
        theirs = vllm_pool(config, specs, length, memory)
        plan = planned(run_kvops, model, gpu, length, memory, tp, dtype, caching)
        capacity = plan["capacity"]
        if theirs is None:
            assert plan["fits"] is False, (model, tp, dtype, length, "vLLM refuses to start; the plan fits")
            continue
        assert capacity is not None, (model, tp, dtype, length, plan.get("problem"))
        assert capacity["max_in_flight_tokens"] == config.max_in_flight_tokens
        ours = {
            "num_blocks": capacity["num_blocks"],
            "kv_cache_size_tokens": capacity["kv_cache_size_tokens"],
            "max_concurrency": round(capacity["max_concurrency"], 4),
            "block_size": capacity["block_size"],
            "bytes_per_block": capacity["bytes_per_block"],
            "group_block_sizes": sorted(
                group["block_size"]
                for group in capacity["kv_cache_group_specs"]
                if group.get("mamba_cache_mode", "align") == "align"
            ),
        }
        assert ours == theirs, (model, RELEASE, gpu, tp, dtype, caching, length, memory)
        checked += 1
    return checked


def release_block_size(spec, gpu: str = HOPPER, dtype: str = "bf16") -> int:
    """The block size a GPU engine of the release takes when no --block-size is given, before any hybrid
    alignment: its `CacheConfig.DEFAULT_BLOCK_SIZE` (16 in 0.33, 64 in 0.34) as the backend the GPU picks prefers
    it (`get_preferred_block_size`: FlashAttention runs multiples of 16; dense MLA the GPU's MLA backend; sparse
    MLA FlashMLA's 64, which the indexer's kernel requires)."""
    from vllm.config.cache import CacheConfig

    return gpu_backend(spec, gpu, dtype).get_preferred_block_size(CacheConfig.DEFAULT_BLOCK_SIZE)


def gpu_backend(spec, gpu: str, dtype: str) -> type:
    """The attention backend whose block preference decides the model's block on this GPU: the release's pick for a
    dense MLA model and for a multimodal model's mm-prefix attention (tests/support/cuda_backends.py), FlashMLA for
    sparse MLA (the indexer's [64] and every sparse backend's multiples of 32 or 64 meet at 64), FlashAttention for
    the rest (which runs any multiple of 16, as FlashInfer and Triton run the defaults)."""
    from vllm.v1.attention.backends.flash_attn import FlashAttentionBackend
    from vllm.v1.attention.backends.mla.flashmla import FlashMLABackend

    cache_dtype = "fp8" if dtype == "fp8" else "auto"
    if head := mm_prefix_head(spec, False):
        return picked_backend(gpu, False, cache_dtype, head, spec.num_attention_heads, use_mm_prefix=True)
    if not spec.is_mla:
        return FlashAttentionBackend
    if any(getattr(layer, "sparse", False) for _, layer in spec.caches()):
        return FlashMLABackend
    return picked_backend(gpu, True, cache_dtype, 576, spec.num_attention_heads)


def gpu_config(built: BuiltModel, block: int | None = None, backend: type | None = None):
    """The engine config a GPU engine would have: its block sizes (None: the release's own pick with `backend`, no
    --block-size given) and hybrid alignment, the batch asked for (the CPU build lowers it for MLA models), two
    batches in flight (async scheduling)."""
    built.as_gpu(block, backend)
    config = built.vllm_config
    config.cache_config.kv_cache_layout = "LBHNC"
    config.scheduler_config.max_num_batched_tokens = BATCHED
    config.scheduler_config.async_scheduling = True
    return config


def gdn_prefill(gpu: str):
    """The GDN prefill kernel the release picks on this GPU (`_resolve_gdn_prefill_backend`,
    model_executor/layers/mamba/gdn/qwen_gdn_linear_attn.py): FlashInfer on Hopper (SM90), whose align-mode prefill
    checkpoints add a state page and a 64-token block alignment; Triton on an A100, as on this CPU build."""
    from unittest import mock

    if gpu == AMPERE:
        return contextlib.nullcontext()
    return mock.patch(
        "vllm.model_executor.layers.mamba.gdn.qwen_gdn_linear_attn._resolve_gdn_prefill_backend",
        return_value=("auto", "flashinfer"),
    )


def gpus(model: str) -> list[str]:
    """Hopper for every model; an A100 as well for Gated DeltaNet models, whose state layout depends on the GPU."""
    spec = model_spec(model)
    gated_delta_net = any(getattr(layer, "variant", "") == "gdn" for _, layer in spec.caches())
    return [HOPPER, AMPERE] if gated_delta_net else [HOPPER]


@pytest.mark.parametrize(
    ("model", "gpu"),
    [(model, gpu) for model in [*ENTRIES, *FIXTURES] if model not in UNBUILDABLE for gpu in gpus(model)],
    ids=lambda value: Path(value).name if value.startswith("/") else value,
)
def test_plan_repeats_the_release_pool(model, gpu, run_kvops, tiny_model, tmp_path):
    """bf16 and fp8 caches at tp 1 (a hybrid model built again for fp8, and without prefix caching: its block
    alignment and state pages depend on both), tp 2 where the model's attention specs allow (state shapes split by
    tp are not rebuilt here)."""
    spec = model_spec(model)
    checked = 0
    for tp, dtype, caching in ((1, "bf16", True), (1, "fp8", True), (2, "bf16", True), (1, "bf16", False)):
        if spec.num_attention_heads % tp or (tp > 1 and (spec.has_state or _heterogeneous(spec))):
            continue
        if not caching and not spec.has_state:
            continue
        if spec.has_state or (tp, dtype) == (1, "bf16"):
            cache_dtype = "fp8" if spec.has_state and dtype == "fp8" else "auto"
            with gdn_prefill(gpu):
                built = BuiltModel(
                    model_config(model), tmp_path / f"model-{dtype}-{caching}", tiny_model, max_model_len=1024,
                    max_num_batched_tokens=BATCHED, kv_cache_dtype=cache_dtype, enable_prefix_caching=caching,
                )  # fmt: skip
                config = gpu_config(built, backend=gpu_backend(spec, gpu, dtype))
        elif spec.is_mla:  # the GPU's MLA backend, and so the block, follows the cache dtype
            config = gpu_config(built, backend=gpu_backend(spec, gpu, dtype))
        specs = built.specs() if spec.has_state else _attention_as(built, config, tp, dtype)
        config.parallel_config.tensor_parallel_size = tp
        checked += compare(run_kvops, model, gpu, config, specs, tp, dtype)
    assert checked


# a full-attention model, an MLA one and a hybrid (Mamba-2 beside attention)
DEFAULT_BLOCK_MODELS = (
    "meta-llama/Llama-3.1-8B-Instruct",
    "deepseek-ai/DeepSeek-V2-Lite",
    "ibm-granite/granite-4.0-h-small",
)


# (model, GPU, KV dtype): each catalog GPU family's pick for a dense MLA model, beside Hopper's for the others
DEFAULT_BLOCK_CASES = (
    *((model, HOPPER, "bf16") for model in DEFAULT_BLOCK_MODELS),
    ("deepseek-ai/DeepSeek-V2-Lite", HOPPER, "fp8"),
    ("deepseek-ai/DeepSeek-V2-Lite", "B200", "bf16"),
    ("deepseek-ai/DeepSeek-V2-Lite", AMPERE, "bf16"),
    ("deepseek-ai/DeepSeek-V2-Lite", "L40S", "fp8"),
    ("google/gemma-3-12b-it", "B200", "bf16"),  # mm-prefix attention at head size 256: TRITON_FLASHINFER
    ("google/gemma-3-12b-it", HOPPER, "fp8"),
)


@pytest.mark.parametrize(("model", "gpu", "dtype"), DEFAULT_BLOCK_CASES)
def test_the_plan_takes_the_release_default_block(model, gpu, dtype, run_kvops, tiny_model, tmp_path):
    """No --block-size given: the command the plan emits names the block the release picks from its own default
    with the backend the GPU runs (0.34: 64 on every backend; kvops emitted 16 until 2026-12-07), and the plan's
    pool is the one the release builds at it, the hybrid's alignment from that block included. Dense MLA through
    0.33 (default 16): FLASH_ATTN_MLA's 16 on Hopper (FLASHMLA's 64 with fp8), FLASHINFER_MLA's 32 on SM100,
    TRITON_MLA's 16 elsewhere, where kvops planned FlashMLA's 64 on every GPU until 2026-12-08; Gemma 3's mm-prefix
    attention on SM100 through 0.33: TRITON_FLASHINFER's 64, where kvops planned 16 until 2026-12-08."""
    spec = model_spec(model)
    cache_dtype = "fp8" if dtype == "fp8" and spec.has_state else "auto"
    built = BuiltModel(
        model_config(model), tmp_path / "model", tiny_model, max_model_len=1024, max_num_batched_tokens=BATCHED,
        kv_cache_dtype=cache_dtype,
    )  # fmt: skip
    config = gpu_config(built, backend=gpu_backend(spec, gpu, dtype))
    length, memory = POINTS[0]
    plan = planned(run_kvops, model, gpu, length, memory, 1, dtype, True)
    assert plan["flags"]["block-size"] == release_block_size(spec, gpu, dtype), (model, RELEASE, gpu, dtype)
    assert plan["capacity"]["block_size"] == config.cache_config.block_size, (model, RELEASE, gpu, dtype)
    specs = built.specs() if spec.has_state else _attention_as(built, config, 1, dtype)
    assert compare(run_kvops, model, gpu, config, specs, 1, dtype)


def _attention_as(built: BuiltModel, config, tp: int, dtype: str) -> dict:
    """The model's specs with its attention caches in `dtype` and split over `tp` ranks."""
    import torch
    from vllm.config import ParallelConfig
    from vllm.v1.kv_cache_interface import AttentionSpec, MLAAttentionSpec

    kv_heads = config.model_config.get_num_kv_heads(ParallelConfig(tensor_parallel_size=tp))
    torch_dtype = {"bf16": torch.bfloat16, "fp8": torch.uint8}[dtype]
    specs = {}
    for name, layer in built.specs().items():
        if isinstance(layer, AttentionSpec) and not str(getattr(layer, "cache_role", "")).endswith("INDEXER"):
            heads = layer.num_kv_heads if isinstance(layer, MLAAttentionSpec) or tp == 1 else kv_heads
            layer = replace(layer, dtype=torch_dtype, num_kv_heads=heads)
        specs[name] = layer
    return specs


def _heterogeneous(spec) -> bool:
    return len({(layer.num_kv_heads, layer.head_dim) for layer in spec.attention_layers()}) > 1


@pytest.mark.parametrize("model", sorted(UNBUILDABLE))
def test_plan_repeats_the_release_pool_of_models_the_cpu_build_cannot_build(model, run_kvops, tiny_model, tmp_path):
    """Their specs from the release's spec classes and MambaStateShapeCalculator, fed the layer facts kvops read
    (checked against the release's ModelConfig in test_vllm_view.py); a GPU engine's block size and hybrid
    alignment, on an A100 (no GDN prefill checkpoints: the test above checks those on the Qwen3-Next model the CPU
    build instantiates, whose layer class Qwen3.5 shares)."""
    spec = model_spec(model)
    config = engine_config(
        {"architectures": ["LlamaForCausalLM"], **_tiny_text()},
        tmp_path / "m",
        tiny_model,
        max_num_batched_tokens=BATCHED,
    )
    config.cache_config.kv_cache_layout = "LBHNC"
    config.cache_config.mamba_cache_mode = "align" if spec.has_state else "none"
    config.scheduler_config.async_scheduling = True
    assert compare(run_kvops, model, AMPERE, config, _specs_from_classes(spec))


def _specs_from_classes(spec) -> dict:
    block = aligned_block_size(spec, KV_DTYPES["bf16"], 1, release_block_size(spec), LayoutOptions())
    return specs_from_classes(spec, block)


def _tiny_text() -> dict:
    from tests.support.tiny_model import TINY_LLAMA

    return dict(TINY_LLAMA)


# Hybrid, sliding-window, chunked, MLA and plain models: the layouts whose segments differ
EXTENSIBLE_MODELS = (
    "ibm-granite/granite-4.0-h-small",
    "nvidia/NVIDIA-Nemotron-Nano-9B-v2",
    "Qwen/Qwen3-Next-80B-A3B-Instruct",
    "google/gemma-3-12b-it",
    "openai/gpt-oss-20b",
    "meta-llama/Llama-4-Scout-17B-16E-Instruct",
    "deepseek-ai/DeepSeek-V2-Lite",
    "meta-llama/Llama-3.1-8B-Instruct",
)


@pytest.mark.skipif(RELEASE != "0.34.0", reason="the extensible KV cache is 0.34's")
@pytest.mark.parametrize("model", EXTENSIBLE_MODELS)
def test_the_extensible_cache_commits_the_release_blocks(model, run_kvops, tiny_model, tmp_path):
    """0.34 on a GPU sizes KV after warmup and commits whole blocks within it, each layer's segment mapped in 2 MiB
    granules (v1/worker/extensible_kv_cache.py ExtensibleKVCache._segments and blocks_within): the plan's blocks
    for its KV bytes are the ones the release's code commits for them, in the reservation `get_kv_cache_configs`
    lays out (block-compact, layer-outermost: FlashAttention declares no layout, the default preference's first)."""
    from types import SimpleNamespace

    from vllm.v1.core import kv_cache_planning
    from vllm.v1.worker.extensible_kv_cache import ExtensibleKVCache

    with gdn_prefill(HOPPER):
        built = BuiltModel(
            model_config(model), tmp_path / "model", tiny_model, max_model_len=1024, max_num_batched_tokens=BATCHED
        )
        config = gpu_config(built)
    config.cache_config.kv_cache_layout = "LBNHC"
    length = 4096
    ran = run_kvops(
        "plan", "-m", model, "--engine-version", RELEASE, "--gpu", HOPPER, "--gpu-memory", "2TiB",
        "--max-model-len", str(length), "--max-num-batched-tokens", str(BATCHED), "--max-num-seqs", str(SEQUENCES),
        "--format", "json",
    )  # fmt: skip
    plan = json.loads(ran.stdout)
    assert plan["engine_version"]["extensible_kv_cache"] is True
    kv_bytes = plan["memory"]["capacity_kv_bytes"]  # the engine's predicted KV less kvops' own margin
    config.model_config.max_model_len = length
    specs = built.specs()
    groups = kv_cache_planning.get_global_kv_cache_groups(config, [dict(specs)])
    reservation = kv_cache_planning.get_kv_cache_configs(config, [dict(specs)], [2 * kv_bytes], groups)[0]
    cache = object.__new__(ExtensibleKVCache)
    cache.size = reservation.kv_cache_tensors[0].size
    cache.capacity_blocks = reservation.num_blocks
    cache._is_block_outermost = False
    cache.segment_offsets, cache.segment_strides = cache._segments(
        reservation.kv_cache_tensors, config.cache_config.get_resolved_kv_cache_layout()
    )
    cache.bytes_per_block = sum(cache.segment_strides)
    cache.buffer = SimpleNamespace(granularity=2 << 20)
    assert plan["capacity"]["num_blocks"] == cache.blocks_within(kv_bytes), (model, kv_bytes)


# DeepSeek-V3.2's attention facts the sparse MLA backends check (config.json)
SPARSE_MLA_TEXT = {"qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "kv_lora_rank": 512, "index_topk": 2048}


def sparse_mla_backend(major: int):
    """The sparse MLA backend the release's CUDA platform picks for an fp8 cache on a GPU of this capability major:
    the first in `_get_backend_priorities` (platforms/cuda.py, imported past its CUDA extension) whose
    `validate_configuration` accepts DeepSeek-V3.2. The dense MLA backends ahead of them refuse a sparse model
    ('sparse not supported', v1/attention/backend.py) and are not loaded here (some need CUDA to import); a sparse one
    this CPU host cannot import (FLASH_ATTN_MLA_SPARSE, which lists no fp8 cache dtype) is passed over, as vLLM
    passes over a backend it cannot load."""
    import sys
    import types
    from types import SimpleNamespace
    from unittest import mock

    import torch
    from vllm.platforms.interface import DeviceCapability

    sys.modules.setdefault("vllm._C_stable_libtorch", types.ModuleType("vllm._C_stable_libtorch"))
    from vllm.platforms import cuda

    capability = DeviceCapability(major, 0)
    config = SimpleNamespace(
        parallel_config=SimpleNamespace(prefill_context_parallel_size=1, decode_context_parallel_size=1),
        model_config=SimpleNamespace(hf_text_config=SimpleNamespace(**SPARSE_MLA_TEXT)),
    )
    order = cuda._get_backend_priorities.__wrapped__(True, capability, 16, "fp8", False, 576, False)
    with mock.patch("vllm.config.get_current_vllm_config", return_value=config):
        for backend in (backend for backend in order if "SPARSE" in backend.name):
            try:
                cls = backend.get_class()
            except ImportError:
                continue
            reasons = cls.validate_configuration(
                head_size=576, dtype=torch.bfloat16, kv_cache_dtype="fp8", block_size=None, use_mla=True,
                has_sink=False, use_sparse=True, use_mm_prefix=False, use_per_head_quant_scales=False,
                device_capability=capability, attn_type="decoder",
            )  # fmt: skip
            if not reasons:
                return cls
    raise AssertionError(f"no sparse MLA backend for capability {major}")


@pytest.mark.parametrize(("gpu", "major"), [(HOPPER, 9), ("B200", 10)])
def test_sparse_mla_fp8_bytes_follow_the_backend_the_gpu_picks(gpu, major, run_kvops):
    """FLASHMLA_SPARSE on Hopper stores fp8 as fp8_ds_mla (656 B a token), FLASHINFER_MLA_SPARSE on SM100 as plain
    fp8 (576 B): the latent's page as the MLA layer builds it from the backend's dtype
    (`_canonicalize_sparse_mla_kv_cache_dtype` and MLAAttention.get_kv_cache_spec, mla_attention.py); kvops planned
    656 on a B200 too until 2026-12-08."""
    import torch
    from vllm.model_executor.layers.attention.mla_attention import _canonicalize_sparse_mla_kv_cache_dtype
    from vllm.v1.kv_cache_interface import MLAAttentionSpec

    backend = sparse_mla_backend(major)
    stored = _canonicalize_sparse_mla_kv_cache_dtype(backend, "fp8")
    latent = MLAAttentionSpec(
        block_size=64, num_kv_heads=1, head_size=576, dtype=torch.uint8, cache_dtype_str=stored,
        state_content_bytes=656 if stored == "fp8_ds_mla" else None,
    )  # fmt: skip
    plan = planned(run_kvops, "deepseek-ai/DeepSeek-V3.2", gpu, 8192, 40 * 2**30, 1, "fp8", True)
    layers, indexer_page = 61, 64 * 132
    assert plan["capacity"]["block_size"] == 64
    assert plan["capacity"]["bytes_per_block"] == layers * (latent.page_size_bytes + indexer_page), (gpu, stored)


def test_no_sparse_mla_backend_below_hopper(run_kvops):
    """On an A100 (capability 8) no sparse MLA backend of the release's list validates, so vLLM does not start; the
    plan warns so (kvops said nothing until 2026-12-08)."""
    with pytest.raises(AssertionError, match="no sparse MLA backend"):
        sparse_mla_backend(8)
    plan = planned(run_kvops, "deepseek-ai/DeepSeek-V3.2", AMPERE, 8192, 40 * 2**30, 1, "bf16", True)
    assert any("no sparse MLA attention backend" in warning for warning in plan["warnings"])


@pytest.mark.parametrize("dtype", ["bf16", "fp8"])
def test_sparse_mla_on_sm120_stores_fp8_ds_mla(dtype, run_kvops):
    """Capability 12's list holds one sparse backend, FLASHINFER_MLA_SPARSE_SM120, which keeps an auto cache as
    fp8_ds_mla as well as an fp8 one; the plan's latent page is that spec's (MLAAttention.get_kv_cache_spec)."""
    import sys
    import types

    import torch
    from vllm.model_executor.layers.attention.mla_attention import _canonicalize_sparse_mla_kv_cache_dtype
    from vllm.platforms.interface import DeviceCapability
    from vllm.v1.kv_cache_interface import MLAAttentionSpec

    sys.modules.setdefault("vllm._C_stable_libtorch", types.ModuleType("vllm._C_stable_libtorch"))
    from vllm.platforms import cuda

    cache = "fp8" if dtype == "fp8" else "auto"
    order = cuda._get_backend_priorities.__wrapped__(True, DeviceCapability(12, 0), 16, cache, False, 576, False)
    (sparse,) = [backend for backend in order if "SPARSE" in backend.name]
    stored = _canonicalize_sparse_mla_kv_cache_dtype(sparse.get_class(), cache)
    assert stored == "fp8_ds_mla"
    latent = MLAAttentionSpec(
        block_size=64, num_kv_heads=1, head_size=576, dtype=torch.uint8, cache_dtype_str=stored,
        state_content_bytes=656,
    )  # fmt: skip
    plan = planned(run_kvops, "deepseek-ai/DeepSeek-V3.2", "RTX-PRO-6000", 8192, 40 * 2**30, 1, dtype, True)
    assert plan["capacity"]["bytes_per_block"] == 61 * (latent.page_size_bytes + 64 * 132)
