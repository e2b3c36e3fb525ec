"""`kvops plot`: KV bytes against context length, and the KV budget a plan leaves on a device."""

from __future__ import annotations

import click

from kvops.cli.options import (
    FRACTION,
    POSITIVE,
    int_list,
    json_option,
    kv_dtype_option,
    model_option,
    needs,
    print_json,
    tp_option,
)
from kvops.dtypes import resolve_kv_dtype
from kvops.model import load_model
from kvops.units import parse_bytes


@click.command()
@model_option
@click.option(
    "--compare",
    multiple=True,
    metavar="MODEL",
    help="Another model on the same axes (repeatable), e.g. an MHA model against a GQA one.",
)
@click.option("--batches", default="1,8", show_default=True, help="Comma-separated batch sizes, one line each.")
@click.option(
    "--max-tokens",
    type=POSITIVE,
    help="Right end of the context axis [default: the longest max_position_embeddings, capped at 131072].",
)
@click.option(
    "--gpu", "gpu_name", metavar="NAME", help="Draw the KV budget the plan leaves on this catalog GPU, per model."
)
@click.option(
    "--gpu-memory",
    metavar="SIZE",
    help="Device memory, e.g. 24GiB: the KV budget on a device of this size (overrides the catalog figure).",
)
@click.option(
    "--engine",
    "-e",
    default="vllm",
    show_default=True,
    metavar="ENGINE",
    help="The engine whose budget is drawn (vllm, tgi).",
)
@click.option(
    "--gpu-memory-utilization",
    "--cuda-memory-fraction",
    "memory_fraction",
    type=FRACTION,
    help="vLLM --gpu-memory-utilization / TGI --cuda-memory-fraction for the budget [default: the engine's].",
)
@tp_option
@kv_dtype_option
@click.option(
    "--out",
    "-o",
    required=True,
    type=click.Path(dir_okay=False, writable=True),
    help="PNG (or any matplotlib format) to write.",
)
@json_option
def plot(
    model, compare, batches, max_tokens, gpu_name, gpu_memory, engine, memory_fraction, tp, kv_dtype, out, as_json
):
    """Plot KV bytes against context length: windows as plateaus, GQA against MHA, and the KV budget per model."""
    batch_values = int_list(batches, "--batches")
    memory = parse_bytes(gpu_memory, "--gpu-memory") if gpu_memory else None
    needs("plot", "matplotlib")  # after the arguments: a mistyped one is said first, whatever is installed
    from kvops.planner import kv_budget
    from kvops.render.plots import Budget, plot_kv

    specs = [load_model(name) for name in (model, *compare)]
    dtypes = {spec.name: resolve_kv_dtype(kv_dtype, spec.dtype) for spec in specs}
    longest = max_tokens or min(131072, max(spec.max_position_embeddings or 32768 for spec in specs))
    budgets = []
    if gpu_name or memory:
        from kvops.gpus import resolve_gpu

        gpu = resolve_gpu(gpu_name, memory)
        budgets = [kv_budget(spec, gpu, engine, tp, kv_dtype, memory_fraction, longest) for spec in specs]
    lines = [Budget(item.model, item.kv_cache_bytes, item.label) for item in budgets]
    plot_kv(specs, dtype_for=dtypes, batches=batch_values, longest=longest, tp=tp, budgets=lines, out=out)
    if as_json:
        print_json(
            {
                "out": out,
                "models": [spec.name for spec in specs],
                "batches": batch_values,
                "max_tokens": longest,
                "tp": tp,
                "gpu_memory_bytes": memory,
                "kv_budgets": [item.to_dict() for item in budgets],
            }
        )
    else:
        click.echo(f"wrote {out}")
