"""Plans for every catalog model on every catalog GPU, and the monotonic sense they must make."""

from __future__ import annotations

import pytest

from kvops.engines.vllm import releases
from kvops.engines.vllm.layout import VMM_GRANULE, gdn_key_head_dim
from kvops.gpus import custom_gpu, gpu_catalog
from kvops.model import load_model
from kvops.model.catalog import catalog
from kvops.sweep import sweep_frame, sweep_rows
from kvops.units import GiB

pandas = pytest.importorskip("pandas", reason="pandas is not installed (pip install -e '.[test]'; .ci/run does)")


@pytest.fixture(scope="module")
def frame() -> pandas.DataFrame:
    specs = [load_model(entry.id) for entry in catalog()]
    return sweep_frame(
        sweep_rows(specs, gpu_catalog(), engines=("vllm", "tgi"), kv_dtypes=("auto", "fp8"), tps=(1, 2, 4, 8))
    )


def test_every_catalog_model_meets_every_catalog_gpu(frame):
    vllm = frame[frame.engine == "vllm"]
    assert set(vllm.model) == {entry.id for entry in catalog()}
    assert set(vllm.gpu) == {gpu.id for gpu in gpu_catalog()}
    assert vllm.groupby(["model", "gpu"]).size().min() >= 2  # at least tp 1 in both KV dtypes
    assert frame.fits.any() and (~frame.fits).any()


def test_more_memory_never_lowers_capacity(frame):
    # at the same batch size: vLLM gives an H100 (79.19 GiB as torch sees it) 8192 batched tokens and an A100-80GB
    # (79.15 GiB) 2048, so the H100's larger profile run can leave it less KV than the A100 (get_batch_defaults);
    # and per vendor: the engines run other kernels on ROCm (TGI's paged attention, 16-token blocks). A launch the
    # engine refuses serves nothing: its capacity is 0 (its KV figure is of a start that fails), so a larger GPU
    # may not refuse where a smaller one starts. And per kernel: from vLLM 0.33 a Gated DeltaNet model (Qwen3.5) runs
    # FlashInfer's prefill on Hopper and Blackwell, which keeps a checkpoint page per request, and Triton's elsewhere
    # (a 16.7 GB RTX 5060 Ti holds fewer of Qwen3.5-9B's tokens than a 15.8 GB T4).
    vendors = {gpu.id: gpu.vendor for gpu in gpu_catalog()}
    release = releases.release(None)
    checkpoints = {
        (model, gpu): release.gdn_prefill_checkpoints(gpu, gdn_key_head_dim(load_model(model)))
        for model, gpu in set(zip(frame.model, frame.gpu, strict=True))
    }
    frame = frame.assign(
        vendor=frame.gpu.map(vendors),
        served=frame.kv_tokens.where(frame.fits, 0),
        gdn_checkpoints=[checkpoints[pair] for pair in zip(frame.model, frame.gpu, strict=True)],
    )
    keys = ["engine", "vendor", "gdn_checkpoints", "model", "tp", "kv_dtype", "batched_tokens"]
    for key, group in frame.groupby(keys):
        tokens = group.sort_values("gpu_memory_bytes").served.tolist()
        assert tokens == sorted(tokens), key


def test_more_memory_never_lowers_capacity_at_fixed_engine_settings():
    spec = load_model("gemma-2-9b")  # hybrid: sliding and full groups
    gpus = [custom_gpu(size * GiB) for size in range(20, 200, 7)]
    rows = sweep_rows([spec], gpus, kv_dtypes=("auto",), tps=(1,))
    tokens = [row["kv_tokens"] for row in rows]
    assert tokens == sorted(tokens) and tokens[-1] > 0


def test_fp8_doubles_kv_tokens(frame):
    vllm = frame[(frame.engine == "vllm") & frame.fits]
    index = ["model", "gpu", "tp"]
    blocks = vllm.pivot_table(index=index, columns="kv_dtype_resolved", values="num_blocks", aggfunc="first")
    kv = vllm.pivot_table(index=index, columns="kv_dtype_resolved", values="capacity_kv_bytes", aggfunc="first")
    checked = 0
    # caches fp8 does not halve: recurrent state (vLLM pads it to the attention page), the sparse indexer's fp8 keys
    stateful = {
        entry.id
        for entry in catalog()
        if (spec := load_model(entry.id)).has_state or any(layer.kind == "indexer" for _, layer in spec.caches())
    }
    for (model, gpu, tp), row in blocks.iterrows():
        if model in stateful:
            continue
        sixteen = "bf16" if pandas.notna(row.get("bf16")) else "fp16"
        if pandas.isna(row.get(sixteen)) or pandas.isna(row.get("fp8")):
            continue
        # same KV bytes, half the page: floor() may add one. Two rules move it: the sampler is sized for the seqs the
        # larger pool emits (so fp8 keeps slightly less KV), and vLLM 0.34's extensible KV cache maps every layer's
        # slots in whole 2 MiB granules, each losing under one granule (layout.committed_blocks)
        pages = len(load_model(model).caches())
        half, full = kv.loc[(model, gpu, tp), "fp8"], kv.loc[(model, gpu, tp), sixteen]
        low = 2 * row[sixteen] * (half / full) * (1 - pages * VMM_GRANULE / half) - 1
        high = 2 * row[sixteen] / (1 - pages * VMM_GRANULE / full) + 1
        assert low <= row["fp8"] <= high, (model, gpu, tp)
        checked += 1
    assert checked > 100
    # and the tokens follow the blocks: a quantized KV dtype changes the page, not the tokens a block holds
    tokens = vllm.pivot_table(index=index, columns="kv_dtype", values="kv_tokens", aggfunc="first").dropna()
    tokens = tokens[~tokens.index.get_level_values("model").isin(stateful)]
    per_block = vllm.assign(per_block=vllm.kv_tokens / vllm.num_blocks).pivot_table(
        index=index, columns="kv_dtype", values="per_block", aggfunc="first"
    )
    per_block = per_block.loc[tokens.index]
    assert (per_block["fp8"] / per_block["auto"]).between(0.99, 1.01).all()


def test_tp2_halves_per_gpu_kv_for_gqa_models(frame):
    gqa = [
        entry.id
        for entry in catalog()
        if not load_model(entry.id).is_mla
        and 2 <= load_model(entry.id).num_kv_heads < load_model(entry.id).num_attention_heads
    ]
    assert len(gqa) >= 10
    vllm = frame[(frame.engine == "vllm") & (frame.kv_dtype == "auto") & frame.model.isin(gqa)]
    per_token = vllm.pivot_table(
        index=["model", "gpu"], columns="tp", values="kv_bytes_per_token_per_gpu", aggfunc="first"
    )
    assert (per_token[2] * 2 == per_token[1]).all()
    tgi = frame[(frame.engine == "tgi") & (frame.kv_dtype == "auto") & frame.model.isin(gqa)]
    tgi_per_token = tgi.pivot_table(
        index=["model", "gpu"], columns="tp", values="kv_bytes_per_token_per_gpu", aggfunc="first"
    ).dropna()
    assert (tgi_per_token[2] * 2 == tgi_per_token[1]).all()


def test_sweep_command_writes_csv_and_plot(run_kvops, tmp_path):
    out = tmp_path / "sweep.csv"
    ran = run_kvops(
        "sweep",
        "--out",
        str(out),
        "--models",
        "llama-3-8b,gemma-2-9b",
        "--gpus",
        "l4,h100,h200",
        "--engines",
        "vllm,tgi",
    )
    assert f"wrote {out}" in ran.stdout
    table = pandas.read_csv(out)
    assert set(table.engine) == {"vllm", "tgi"} and set(table.gpu) == {"L4", "H100-80GB", "H200"}
    png = out.with_suffix(".png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_sweep_plots_every_engine_at_the_first_tp_and_checks_its_names(run_kvops, tmp_path):
    out = tmp_path / "new-folder" / "sweep.csv"
    args = [
        "sweep",
        "--out",
        str(out),
        "--engines",
        "vllm,tgi",
        "--tps",
        "2",
        "--models",
        "qwen3-8b,llama-3-8b",
        "--gpus",
        "L40S,H100-80GB",
    ]
    assert "16 plans" in run_kvops(*args).stdout
    assert out.with_suffix(".png").read_bytes()[:4] == b"\x89PNG"
    ran = run_kvops("sweep", "--out", str(out), "--kv-dtypes", "fp7", expect=2)
    assert "'fp7'; valid: auto" in ran.stderr
