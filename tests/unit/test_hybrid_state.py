"""Recurrent state beside attention, replayed against vLLM's own figures: Jamba's Mamba-1 layers and Falcon-H1's
Mamba-2 ones at tp 1, 2 and 4, bf16 and fp8 KV.

vLLM's figures come from the 0.32.0 CPU build: the model built on the meta device (tests/support/vllm_specs.py), its
state shapes at tp N from the model class (`get_mamba_state_shape_from_config`, as `_align_hybrid_block_size` reads
them), the attention block size raised by `Platform._align_hybrid_block_size` (FlashAttention's kernel blocks), and
the pool from `kv_cache_utils.get_kv_cache_configs` / `get_kv_cache_capacity`, for --kv-cache-memory-bytes
3 GiB + 12,345, --max-model-len 4096, --max-num-batched-tokens 2048 (async scheduling). The state shapes and pages
are the same in the 0.33.0 and 0.34.0 wheels (their `MambaStateShapeCalculator` and `MambaSpec`, replayed below).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from dataclasses import replace
from pathlib import Path

import pytest

from kvops.dtypes import KV_DTYPES
from kvops.engines.vllm.layout import LayoutOptions, kv_layout, pool, state_page_bytes
from kvops.model.locate import load_model
from kvops.model.spec import Mamba1State, MambaState
from tests.support.paths import REPO

MODELS = REPO / "tests" / "fixtures" / "models"
JAMBA = MODELS / "jamba-1.5-mini"  # ai21labs/AI21-Jamba-1.5-Mini's config.json
FALCON_H1 = MODELS / "falcon-h1-7b-instruct"  # tiiuae/Falcon-H1-7B-Instruct's config.json, the fields sizing reads
MEMORY = 3 * 2**30 + 12345
POINT = ("--kv-cache-memory-bytes", str(MEMORY), "--max-model-len", "4096", "--max-num-batched-tokens", "2048")

# (model, tp, KV dtype): vLLM 0.32.0's attention block size, blocks, kv_cache_size_tokens, max concurrency at 4096.
# Jamba: 4 attention layers (i % 8 == 4), 28 Mamba-1 mixers; 8 groups of 4 (one attention, seven state), so a
# request holds 52 attention blocks + 7 x 2 state pages. Falcon-H1: 44 attention + 44 Mamba-2 layers, 2 groups.
VLLM_POOLS = [
    ("jamba", 1, "bf16", 80, 2457, 152482, 37.2273),
    ("jamba", 1, "fp8", 160, 2457, 251596, 61.425),
    ("jamba", 2, "bf16", 80, 4915, 305027, 74.4697),
    ("jamba", 2, "fp8", 160, 4915, 503296, 122.875),
    ("jamba", 4, "bf16", 80, 9830, 610055, 148.9394),
    ("jamba", 4, "fp8", 160, 9830, 1006592, 245.75),
    ("falcon-h1", 2, "bf16", 1568, 91, 62122, 15.1667),
    ("falcon-h1", 2, "fp8", 3120, 91, 74547, 18.2),
    ("falcon-h1", 4, "bf16", 784, 182, 82830, 20.2222),
    ("falcon-h1", 4, "fp8", 1568, 182, 124245, 30.3333),
]
FOLDERS = {"jamba": JAMBA, "falcon-h1": FALCON_H1}


def plan(run_kvops, model: Path, *args: str) -> dict:
    return json.loads(run_kvops("plan", "--model", str(model), "--json", *POINT, *args).stdout)["capacity"]


@pytest.mark.parametrize(("model", "tp", "dtype", "block", "blocks", "tokens", "concurrency"), VLLM_POOLS)
def test_the_pool_is_vllms(model, tp, dtype, block, blocks, tokens, concurrency, run_kvops):
    # Jamba: kvops had refused it (0019f79), and before that read 32 full-attention layers (128 KiB a token)
    # the figures are vLLM 0.32.0's (16-token default block; 0.34's 64 is checked in tests/engine/test_newer_release_kv.py)
    capacity = plan(run_kvops, FOLDERS[model], "--tp", str(tp), "--kv-dtype", dtype, "--engine-version", "0.32.0")
    assert (capacity["block_size"], capacity["num_blocks"], capacity["kv_cache_size_tokens"]) == (block, blocks, tokens)
    assert capacity["max_concurrency"] == pytest.approx(concurrency, abs=1e-4)


@pytest.mark.parametrize("tp", [1, 2, 4])
def test_jamba_state_per_sequence(tp, run_kvops):
    # MambaStateShapeCalculator.mamba1_state_shape (0.32.0-0.34.0): conv (3, 8192 / tp), ssm (8192 / tp, 16), both
    # in the model's bf16 (mamba1_state_dtype: --mamba-ssm-cache-dtype auto follows the conv state)
    kv = json.loads(run_kvops("kv", "--model", str(JAMBA), "--tokens", "8192", "--tp", str(tp), "--json").stdout)
    state = next(group for group in kv["layer_groups"] if group["kind"] == "mamba")
    attention = next(group for group in kv["layer_groups"] if group["kind"] == "full")
    assert (state["layers"], attention["layers"]) == (28, 4)
    assert state["bytes_per_sequence"] == 28 * (3 * 8192 + 8192 * 16) * 2 // tp
    assert kv["bytes_per_token"] == 4 * 2 * (8 // tp) * 128 * 2


def test_jamba_refuses_a_tp_its_mixer_does_not_split(run_kvops):
    # MambaMixer splits its 8192 channels by tp (vllm.distributed.divide asserts); 3 splits neither them nor the heads
    ran = run_kvops("kv", "--model", str(JAMBA), "--tokens", "4096", "--tp", "3", expect=None)
    assert ran.exit_code != 0 and "valid: 1, 2, 4, 8" in ran.stderr


@pytest.mark.parametrize(
    ("model", "published"),
    [
        (JAMBA, 51.6e9),  # AI21-Jamba-1.5-Mini: 52B total, 12B active (its model card; the Hub's 51.6B)
        (FALCON_H1, 7.6e9),  # Falcon-H1-7B: about 7.6B (tiiuae's model card)
    ],
)
def test_parameters_count_the_recurrent_mixers(model, published):
    # kvops had counted Falcon-H1-7B without its 44 Mamba-2 mixers: 6.27B; Jamba's 28 Mamba-1 mixers and its
    # experts on every second layer (expert_layer_period 2, offset 1) are counted as vLLM's jamba.py builds them
    spec = load_model(str(model))
    assert spec.parameters == pytest.approx(published, rel=0.005)


def test_mamba1_pages_as_vllm_computes_them():
    spec = load_model(str(JAMBA))
    state = next(layer for _, layer in spec.caches() if isinstance(layer, Mamba1State))
    assert state == Mamba1State(conv_kernel=4, intermediate=8192, state_size=16)
    gpu, cpu = LayoutOptions(), LayoutOptions(device="cpu", cpu_avx512_bf16=True)
    assert [state_page_bytes(spec, state, tp, gpu) for tp in (1, 2, 4)] == [311296, 155648, 77824]
    # the CPU build on an AVX-512 BF16 host keeps SSM states in float32 (platforms/cpu.py)
    assert state_page_bytes(spec, state, 1, cpu) == 3 * 8192 * 2 + 8192 * 16 * 4
    # no conv row per speculative token: mamba1_state_shape takes none (mamba2_state_shape does)
    assert state_page_bytes(spec, state, 1, replace(gpu, speculative_tokens=2)) == 311296


NEWER = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "kvops-ci"
PAGES_SCRIPT = """
import json, torch
from vllm.model_executor.layers.mamba.mamba_utils import MambaStateDtypeCalculator, MambaStateShapeCalculator
from vllm.v1.kv_cache_interface import MambaSpec
dtypes = MambaStateDtypeCalculator.mamba1_state_dtype(torch.bfloat16, "auto", "auto")
pages = {}
for tp in (1, 2, 4):
    jamba = MambaStateShapeCalculator.mamba1_state_shape(tp, 8192, 16, 4)
    falcon = MambaStateShapeCalculator.mamba2_state_shape(tp, 3072, 1, 24, 128, 256, 4)
    fields = MambaSpec.__dataclass_fields__
    aligned = {"state_alignment": 16} if "state_alignment" in fields else {}  # 0.34: FlashInfer's ReplaySSM
    pages[tp] = [MambaSpec(shapes=s, dtypes=dtypes, block_size=16, **a).page_size_bytes
                 for s in (jamba, falcon) for a in ({}, aligned)]
print(json.dumps(pages))
"""


@pytest.mark.parametrize("release", ["0.33.0", "0.34.0"])
def test_newer_releases_shape_and_pad_the_states_alike(release):
    """The 0.33.0 and 0.34.0 wheels (unpacked by .ci/newer_vllm) compute the same state pages: their shape and dtype
    calculators are unchanged for Mamba-1 and Mamba-2, and 0.34's 16-byte state alignment (FlashInfer ReplaySSM,
    `mamba_state_alignment`) pads nothing here, every state being a multiple of 16 bytes already."""
    tree = NEWER / f"vllm-{release}"
    if not (tree / "vllm").is_dir():
        pytest.skip(f"vLLM {release}'s wheel is not unpacked (.ci/newer_vllm does it)")
    env = {**os.environ, "PYTHONPATH": str(tree), "VLLM_TARGET_DEVICE": "cpu"}
    ran = subprocess.run([sys.executable, "-c", PAGES_SCRIPT], capture_output=True, text=True, env=env, timeout=300)
    pages = json.loads(ran.stdout.strip().splitlines()[-1])
    jamba, falcon = load_model(str(JAMBA)), load_model(str(FALCON_H1))
    for tp in (1, 2, 4):
        ours = [
            state_page_bytes(model, layer, tp, LayoutOptions())
            for model in (jamba, falcon)
            for layer in [next(s for _, s in model.caches() if isinstance(s, (Mamba1State, MambaState)))] * 2
        ]
        assert pages[str(tp)] == ours


@pytest.mark.vllm
@pytest.mark.parametrize(
    ("model", "tp", "dtype", "block", "blocks", "tokens", "concurrency"), VLLM_POOLS[:2] + VLLM_POOLS[4:7]
)
def test_the_figures_above_from_vllm_itself(
    model, tp, dtype, block, blocks, tokens, concurrency, tiny_model, tmp_path, monkeypatch
):
    """vLLM 0.32.0 builds the model on the meta device at tp 1; at tp N its platform aligns the block size with
    tensor_parallel_size N (attention KV heads and the model class's state shapes per rank), each layer's spec
    takes that rank's shapes, and its pool arithmetic sizes the cache."""
    import torch
    from vllm.model_executor.models import ModelRegistry
    from vllm.v1.core import kv_cache_utils
    from vllm.v1.kv_cache_interface import AttentionSpec, MambaSpec

    from tests.support.vllm_specs import BuiltModel

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    warnings.simplefilter("ignore")
    config = json.loads((FOLDERS[model] / "config.json").read_text())
    built = BuiltModel(config, tmp_path / "model", tiny_model, max_model_len=4096, max_num_batched_tokens=2048)
    vllm_config = built.vllm_config
    vllm_config.parallel_config.tensor_parallel_size = tp
    vllm_config.cache_config.cache_dtype = "fp8" if dtype == "fp8" else "auto"
    built.as_gpu(16)
    vllm_config.cache_config.kv_cache_layout = "LBHNC"
    vllm_config.scheduler_config.async_scheduling = True
    model_config = vllm_config.model_config
    heads = model_config.get_num_kv_heads(vllm_config.parallel_config)
    model_class, _ = ModelRegistry.resolve_model_cls(model_config.architecture, model_config=model_config)
    shapes = tuple(model_class.get_mamba_state_shape_from_config(vllm_config))
    kv_dtype = torch.uint8 if dtype == "fp8" else torch.bfloat16
    specs = {
        name: replace(spec, num_kv_heads=heads, dtype=kv_dtype)
        if isinstance(spec, AttentionSpec)
        else replace(spec, shapes=shapes)
        if isinstance(spec, MambaSpec)
        else spec
        for name, spec in built.specs().items()
    }
    configs = kv_cache_utils.get_kv_cache_configs(vllm_config, [specs], [MEMORY])
    scheduler = kv_cache_utils.generate_scheduler_kv_cache_config(configs)
    found, concurrency_found = kv_cache_utils.get_kv_cache_capacity(vllm_config, scheduler)
    block_found = min(group.kv_cache_spec.block_size for group in scheduler.kv_cache_groups)
    assert (block_found, configs[0].num_blocks, found) == (block, blocks, tokens)
    assert concurrency_found == pytest.approx(concurrency, abs=1e-4)

    spec = load_model(str(FOLDERS[model]))
    ours = pool(kv_layout(spec, KV_DTYPES[dtype], tp, 16), MEMORY, 4096, vllm_config.max_in_flight_tokens)
    assert (ours.block_size, ours.num_blocks, ours.kv_cache_size_tokens) == (block, blocks, tokens)
