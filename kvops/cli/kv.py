"""`kvops kv`, `kvops table`, `kvops plot`, `kvops models`: the formula, for one model or the catalog."""

from __future__ import annotations

import click

from kvops.cli.options import (
    POSITIVE,
    int_list,
    json_option,
    kv_dtype_option,
    model_option,
    print_json,
    tp_option,
    warn,
)
from kvops.dtypes import resolve_kv_dtype
from kvops.formula import MemoryFit, context_warnings, kv_cost, tokens_per_sequence_fit
from kvops.model import load_model
from kvops.units import parse_bytes


@click.command()
@model_option
@click.option("--tokens", "-t", type=POSITIVE, help="Cached tokens per sequence (prompt + generated).")
@click.option(
    "--prompt-tokens", type=click.IntRange(min=0), help="Prompt tokens; with --gen-tokens, stands for --tokens P+G."
)
@click.option(
    "--gen-tokens", type=click.IntRange(min=0), help="Generated tokens; with --prompt-tokens, stands for --tokens P+G."
)
@click.option("--batch", "-b", default=1, show_default=True, type=POSITIVE, help="Concurrent sequences.")
@click.option(
    "--beams",
    default=1,
    show_default=True,
    type=POSITIVE,
    help="Beams (or n) per request; effective batch = batch x beams.",
)
@tp_option
@kv_dtype_option
@click.option(
    "--block-size",
    type=POSITIVE,
    help="Round each sequence up to whole blocks of N tokens per layer group (paged cache).",
)
@click.option("--memory", metavar="SIZE", help="Also say how many tokens fit in SIZE per GPU (e.g. 17.8GiB).")
@json_option
def kv(model, tokens, prompt_tokens, gen_tokens, batch, beams, tp, kv_dtype, block_size, memory, as_json):
    """KV-cache bytes for one workload point: bytes per token, token tax, total per GPU."""
    tokens = _tokens(tokens, prompt_tokens, gen_tokens)
    memory_bytes = parse_bytes(memory, "--memory") if memory else None
    spec = load_model(model)
    dtype = resolve_kv_dtype(kv_dtype, spec.dtype)
    cost = kv_cost(spec, tokens=tokens, dtype=dtype, batch=batch, beams=beams, tp=tp, block_size=block_size)
    fit = None
    if memory_bytes:
        longest = tokens_per_sequence_fit(
            spec, memory_bytes, dtype=dtype, batch=batch, beams=beams, tp=tp, block_size=block_size
        )
        fit = MemoryFit(memory_bytes, memory_bytes // cost.bytes_per_token, longest)
    warnings = context_warnings(spec, tokens)
    from kvops.render.kv import kv_document, kv_text

    if as_json:
        print_json(kv_document(spec, cost, warnings, fit))
    else:
        click.echo(kv_text(spec, cost, fit))
        for message in warnings:
            warn(message)


def _tokens(tokens: int | None, prompt: int | None, generated: int | None) -> int:
    split = prompt is not None or generated is not None
    if tokens is not None and split:
        raise click.UsageError("give either --tokens or --prompt-tokens/--gen-tokens, not both")
    if tokens is not None:
        return tokens
    if not split:
        raise click.UsageError("missing --tokens (or --prompt-tokens and --gen-tokens)")
    total = (prompt or 0) + (generated or 0)
    if total < 1:
        raise click.UsageError("--prompt-tokens + --gen-tokens must be at least 1")
    return total


TABLE_BATCHES = "1,4,8"
TABLE_TOKENS = "1024,4096,8192,16384"


@click.command()
@model_option
@click.option("--batches", default=TABLE_BATCHES, show_default=True, help="Comma-separated batch sizes.")
@click.option(
    "--tokens", "tokens_list", default=TABLE_TOKENS, show_default=True, help="Comma-separated context lengths T."
)
@tp_option
@kv_dtype_option
@click.option("--block-size", type=POSITIVE, help="Round to whole blocks of N tokens.")
@click.option(
    "--format",
    "table_format",
    default="text",
    show_default=True,
    type=click.Choice(("text", "csv", "json", "markdown")),
)
def table(model, batches, tokens_list, tp, kv_dtype, block_size, table_format):
    """The seed calculator's table: token tax per batch, full and window-capped KV per T."""
    batch_values = int_list(batches, "--batches")
    token_values = int_list(tokens_list, "--tokens")
    spec = load_model(model)
    dtype = resolve_kv_dtype(kv_dtype, spec.dtype)
    from kvops.tables import kv_table, render_table

    frame = kv_table(spec, batches=batch_values, tokens=token_values, dtype=dtype, tp=tp, block_size=block_size)
    if table_format == "text":
        click.echo(f"{spec.name}   kv dtype {dtype.name}   tp {tp}   {spec.layer_pattern()}")
    click.echo(render_table(frame, table_format))


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
    from kvops.plots import plot_kv

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


@click.command()
@json_option
def models(as_json):
    """The catalog, with the fields that decide KV cost: read num_key_value_heads and sliding_window first."""
    from kvops.dtypes import KV_DTYPES
    from kvops.model.catalog import catalog
    from kvops.render.models import models_document, models_text

    specs = [load_model(entry.id) for entry in catalog()]
    rows = models_document(specs, KV_DTYPES["bf16"])
    if as_json:
        print_json(rows)
    else:
        click.echo(models_text(rows))
