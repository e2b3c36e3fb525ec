"""Plans for every catalog model on every catalog GPU: a pandas table and a plot (pandas and matplotlib load here only)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from kvops import engines
from kvops.dtypes import resolve_kv_dtype
from kvops.engines.device_total import device_total
from kvops.errors import KvopsError
from kvops.formula import check_tp
from kvops.gpus import Gpu
from kvops.model.spec import ModelSpec
from kvops.plan import PlanInputs
from kvops.planner import predict

if TYPE_CHECKING:
    import pandas

COLUMNS = [
    "engine",
    "model",
    "gpu",
    "gpu_memory_bytes",
    "tp",
    "kv_dtype",
    "kv_dtype_resolved",
    "max_model_len",
    "batched_tokens",
    "fits",
    "problem",
    "weights_bytes",
    "kv_cache_bytes",
    "margin_bytes",
    "capacity_kv_bytes",
    "kv_bytes_per_token_per_gpu",
    "num_blocks",
    "kv_tokens",
    "max_concurrency",
    "requests_under_warn",
]
DEFAULT_MAX_MODEL_LEN = 8192


def sweep_rows(
    specs: Iterable[ModelSpec],
    gpus: Iterable[Gpu],
    *,
    engines: Iterable[str] = ("vllm",),
    kv_dtypes: Iterable[str] = ("auto", "fp8"),
    tps: Iterable[int] = (1, 2, 4, 8),
    max_model_len: int = DEFAULT_MAX_MODEL_LEN,
    warn_level: float = 0.70,
    base: PlanInputs | None = None,
) -> list[dict[str, Any]]:
    """One row per (engine, model, GPU, tp, KV dtype); tensor-parallel sizes a model cannot split by are left out."""
    rows = []
    gpus, kv_dtypes, tps, engines = list(gpus), list(kv_dtypes), list(tps), list(engines)
    for spec in specs:
        length = min(max_model_len, spec.max_position_embeddings or max_model_len)
        for engine in engines:
            for gpu in gpus:
                for tp in tps:
                    for kv_dtype in kv_dtypes:
                        inputs = PlanInputs(
                            engine=engine,
                            spec=spec,
                            gpu=gpu,
                            tp=tp,
                            max_model_len=length,
                            kv_dtype=kv_dtype,
                            warn_level=warn_level,
                        )
                        if base is not None:
                            inputs = replace(
                                base,
                                engine=engine,
                                spec=spec,
                                gpu=gpu,
                                tp=tp,
                                gpus=None,
                                max_model_len=length,
                                kv_dtype=kv_dtype,
                                warn_level=warn_level,
                            )
                        row = _row(inputs)
                        if row is not None:
                            rows.append(row)
    return rows


def _row(inputs: PlanInputs) -> dict[str, Any] | None:
    spec, gpu = inputs.spec, inputs.gpu
    try:
        dtype = resolve_kv_dtype(inputs.kv_dtype, spec.dtype)
        check_tp(spec, inputs.tp)
        # as the engine lays the cache out, whether or not it plans: TGI caches MLA models' full K/V heads
        per_token = engines.get(inputs.engine).kv_bytes_per_token(spec, dtype, inputs.tp)
    except KvopsError:
        return None  # a tp the model's heads do not split by
    row: dict[str, Any] = {
        "engine": inputs.engine,
        "model": spec.name,
        "gpu": gpu.id if gpu else None,
        "gpu_memory_bytes": device_total(inputs),  # as the engine sees it
        "tp": inputs.tp,
        "kv_dtype": inputs.kv_dtype,
        "kv_dtype_resolved": dtype.name,
        "max_model_len": inputs.max_model_len,
        "kv_bytes_per_token_per_gpu": per_token,
    }
    try:
        plan = predict(inputs)
    except KvopsError as exc:
        return {
            **row,
            "batched_tokens": None,
            "fits": False,
            "problem": str(exc),
            "weights_bytes": None,
            "kv_cache_bytes": None,
            "margin_bytes": None,
            "capacity_kv_bytes": None,
            "num_blocks": 0,
            "kv_tokens": 0,
            "max_concurrency": 0.0,
            "requests_under_warn": 0,
        }
    cap = plan.capacity
    weights = plan.term("weights")
    assert cap is not None  # a sweep plans a fixed context, so the pool is always sized
    batch = cap.to_dict()
    return {
        **row,
        # vLLM's max-num-batched-tokens / TGI's max-batch-prefill-tokens: the activation peak grows with it
        "batched_tokens": batch.get("max_num_batched_tokens") or batch.get("max_batch_prefill_tokens"),
        "fits": plan.fits,
        "problem": plan.problem,
        "weights_bytes": weights.bytes if weights else None,
        # as `kvops plan --json` names them: the engine's predicted KV, kvops' margin, what the capacity is sized on
        "kv_cache_bytes": plan.engine_kv_bytes,
        "margin_bytes": plan.kv_margin_bytes,
        "capacity_kv_bytes": plan.kv_cache_bytes,
        "num_blocks": cap.num_blocks,
        "kv_tokens": cap.kv_tokens,
        "max_concurrency": cap.max_concurrency,
        "requests_under_warn": cap.requests_under_warn,
    }


def sweep_frame(rows: list[dict[str, Any]]) -> pandas.DataFrame:
    import pandas

    frame = pandas.DataFrame(rows, columns=COLUMNS)
    for column in ("weights_bytes", "kv_cache_bytes", "margin_bytes", "capacity_kv_bytes"):
        frame[column] = frame[column].astype("Int64")
    return frame
