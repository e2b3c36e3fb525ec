"""The commands agree with each other and with docs/formula.md: the same point gives the same figures in kv, table,
models, plan and sweep, and every figure of `kvops kv --json` is recomputed here from the formula and the inputs it
names, independently of kvops/formula.py (2 x L x B x T x Hkv x D x s, window caps, MLA latents, tp, blocks)."""

from __future__ import annotations

import json
from math import ceil
from typing import Any

import pytest

from kvops.dtypes import resolve_kv_dtype
from kvops.formula import kv_cost, tp_fits
from kvops.gpus import find_gpu
from kvops.model import load_model
from kvops.model.catalog import catalog
from kvops.render.kv import kv_document
from kvops.render.models import models_document

SCALE = 4  # fp32 scale bytes (int8/int4 per token per KV head, for K and for V)
CATALOG = [load_model(entry.id) for entry in catalog()]
MODELS = {row["id"]: row for row in models_document(CATALOG, resolve_kv_dtype("bf16", "bf16"))}


def expected_group_bytes_per_token(group: dict[str, Any], value_bytes: float, scaled: bool) -> int | None:
    """docs/formula.md per layer group: 2 x Hkv x D x s per layer (K and V), an MLA latent D x s once; None where
    the group's JSON does not carry what the formula needs (a V narrower than K, packed slots, the indexer)."""
    kind, layers, heads, dim = group["kind"], group["layers"], group["kv_heads"], group["head_dim"]
    if (
        kind in ("full", "sliding", "chunked")
        and "K+V dims" not in group["formula"]
        and "packed" not in group["formula"]
    ):
        return layers * (ceil(2 * heads * dim * value_bytes) + (2 * heads * SCALE if scaled else 0))
    if kind == "mla":
        return layers * (ceil(dim * value_bytes) + (SCALE if scaled else 0))
    if group["bytes_per_token"] == 0 and group["cached_tokens"] == 0:  # recurrent state: nothing per token
        return 0
    return None


def check_document(document: dict[str, Any], spec_row: dict[str, Any]) -> None:
    """Every figure of one `kvops kv --json` document, from the formula and the inputs it names."""
    tokens, block, tp = document["tokens"], document["block_size"], document["tp"]
    value_bytes, scaled = document["dtype_bytes"], "per token per KV head" in (document["scales"] or "")
    per_token = per_sequence = 0
    for group in document["layer_groups"]:
        expected = expected_group_bytes_per_token(group, value_bytes, scaled)
        if expected is not None:
            assert group["bytes_per_token"] == expected, group
        if group["kind"] in ("full", "sliding", "chunked") and len(document["layer_groups"]) == 1:
            assert group["kv_heads"] == max(1, spec_row["kv_heads"] // tp), group  # split, or one per GPU
        if group["kind"] == "mla":
            assert group["kv_heads"] == 1 and group["head_dim"] == sum(spec_row["mla"].values())  # whatever the tp
        if group["bytes_per_token"]:
            cached = min(tokens, group["window"]) if group["window"] else tokens
            slots = ceil(cached / block) * block if block else cached
            assert (group["cached_tokens"], group["token_slots"]) == (cached, slots), group
            assert group["bytes_per_sequence"] == group["bytes_per_token"] * slots, group
        per_token += group["bytes_per_token"]
        per_sequence += group["bytes_per_sequence"]
    batch = document["batch"] * document["beams"]
    assert document["effective_batch"] == batch
    assert document["bytes_per_token"] == per_token and document["bytes_per_sequence"] == per_sequence
    assert document["token_tax_bytes"] == batch * per_token
    assert document["total_bytes"] == batch * per_sequence
    assert document["total_bytes_all_gpus"] == tp * batch * per_sequence
    assert all(type(value) is int for key, value in document.items() if key.endswith("_bytes") and key != "dtype_bytes")


def points(spec) -> list[tuple[int, int, int, str, int | None]]:
    """(tokens, batch, tp, kv dtype, block size): context 1, past the window, the model's limit; batch 1 and a
    batch past 2**63 bytes; every tp the model splits by, KV heads fewer than tp included; fp8 and int8."""
    limit = spec.max_position_embeddings or 32768
    window = spec.sliding_window or 4096
    tps = [tp for tp in (1, 2, 4, 8, 16, 32) if tp_fits(spec, tp)]
    return [
        (tokens, batch, tp, dtype, block)
        for tokens in sorted({1, window - 1, window + 1, limit})
        for batch, tp, dtype, block in [
            (1, tps[0], "auto", None),
            (10**15, tps[-1], "fp8", 16),
            (3, tps[len(tps) // 2], "int8", 64),
        ]
    ]


@pytest.mark.parametrize("spec", CATALOG, ids=lambda spec: spec.name)
def test_every_kv_figure_recomputes_from_the_formula(spec):
    for tokens, batch, tp, kv_dtype, block in points(spec):
        dtype = resolve_kv_dtype(kv_dtype, spec.dtype)
        try:
            cost = kv_cost(spec, tokens=tokens, dtype=dtype, batch=batch, tp=tp, block_size=block)
        except Exception as exc:  # int8 of a layout that refuses it: one line, never a figure
            assert "kv-dtype" in str(exc), exc
            continue
        document = json.loads(json.dumps(kv_document(spec, cost, []), allow_nan=False))
        check_document(document, MODELS[spec.name])


def test_models_bytes_per_token_is_kvs(run_kvops):
    rows = json.loads(run_kvops("models", "--json").stdout)
    for row in rows:
        kv = json.loads(run_kvops("kv", "-m", row["id"], "-t", "1", "--kv-dtype", "bf16", "--json").stdout)
        assert row["bytes_per_token_bf16"] == kv["bytes_per_token"], row["id"]


def test_sweep_bytes_per_token_is_the_engines_whether_or_not_it_plans():
    """kvops sweep --engines tgi printed DeepSeek-V2-Lite's fp8 row (refused by TGI) at 15,552 B per token, vLLM's
    MLA latent, beside its bf16 row at TGI's 331,776 (full K/V heads); every row now has the engine's own figure."""
    from kvops.engines.tgi.budget import kv_bytes_per_token
    from kvops.sweep import sweep_rows

    spec = load_model("deepseek-v2-lite")
    rows = sweep_rows([spec], [find_gpu("t4"), find_gpu("h200")], engines=("tgi",), kv_dtypes=("auto", "fp8"), tps=(1,))
    assert any(not row["fits"] for row in rows) and any(row["fits"] for row in rows)
    for row in rows:
        dtype = resolve_kv_dtype(row["kv_dtype"], spec.dtype)
        assert row["kv_bytes_per_token_per_gpu"] == kv_bytes_per_token(spec, dtype, 1), row


@pytest.mark.parametrize("engine", ["vllm", "tgi"])
def test_sweep_and_plot_name_the_kv_figures_as_plan_json_does(run_kvops, tmp_path, engine):
    """kvops sweep's kv_cache_bytes column and kvops plot --json's kv_budgets[].kv_cache_bytes were the KV after kvops'
    margin (Mistral-7B-v0.1 on an H100: 66,228,931,140), which `kvops plan --json` calls capacity_kv_bytes, beside
    its kv_cache_bytes, the engine's predicted 66,861,538,673; all three now carry the plan's three figures."""
    from kvops.sweep import sweep_rows

    args = ["-m", "mistral-7b-v0.1", "--gpu", "h100", "--max-model-len", "8192", "-e", engine, "--json"]
    memory = json.loads(run_kvops("plan", *args).stdout)["memory"]
    wanted = {key: memory[key] for key in ("kv_cache_bytes", "margin_bytes", "capacity_kv_bytes")}
    (row,) = sweep_rows(
        [load_model("mistral-7b-v0.1")], [find_gpu("h100")], engines=(engine,), kv_dtypes=("auto",), tps=(1,)
    )
    assert {key: row[key] for key in wanted} == wanted
    plot = json.loads(
        run_kvops("plot", *args[:4], *args[6:], "--max-tokens", "8192", "--out", str(tmp_path / "kv.png")).stdout
    )
    (budget,) = plot["kv_budgets"]
    assert {key: budget[key] for key in wanted} == wanted


def test_kv_text_writes_counts_with_thousands_separators_as_plan_does(run_kvops):
    """kvops kv -m gemma-2-9b -t 100000 -b 10000 printed "cached 100000", "window 4096", "effective batch 10000" and
    "of 100000 tokens" beside its own "tokens that fit 145,817" and plan's "8,192"; every count now has separators
    (the exact byte counts in parentheses stay bare, as plan writes them)."""
    import re

    ran = run_kvops("kv", "-m", "gemma-2-9b", "-t", "100000", "-b", "10000", "--memory", "17.8GiB")
    text = re.sub(r"\(\d+ B\)|\(\d+ B / \d+ B\)", "", ran.stdout + ran.stderr)
    assert not re.findall(r"\d{4,}", text), text
    assert "100,000 tokens" in text and "10,000" in text and "4,096" in text
