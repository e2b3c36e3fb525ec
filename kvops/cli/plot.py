"""`kvops plot`: KV bytes against context length."""

from __future__ import annotations

import click

from kvops.cli.options import (
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
@click.option("--gpu-memory", metavar="SIZE", help="Draw a capacity line, e.g. 24GiB or 80GB.")
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
def plot(model, compare, batches, max_tokens, gpu_memory, tp, kv_dtype, out, as_json):
    """Plot KV bytes against context length: windows as plateaus, GQA against MHA, GPU capacity."""
    batch_values = int_list(batches, "--batches")
    capacity = parse_bytes(gpu_memory, "--gpu-memory") if gpu_memory else None
    specs = [load_model(name) for name in (model, *compare)]
    dtypes = {spec.name: resolve_kv_dtype(kv_dtype, spec.dtype) for spec in specs}
    longest = max_tokens or min(131072, max(spec.max_position_embeddings or 32768 for spec in specs))
    needs("plot", "matplotlib")
    from kvops.render.plots import plot_kv

    plot_kv(specs, dtype_for=dtypes, batches=batch_values, longest=longest, tp=tp, gpu_memory=capacity, out=out)
    if as_json:
        print_json(
            {
                "out": out,
                "models": [spec.name for spec in specs],
                "batches": batch_values,
                "max_tokens": longest,
                "tp": tp,
                "gpu_memory_bytes": capacity,
            }
        )
    else:
        click.echo(f"wrote {out}")
