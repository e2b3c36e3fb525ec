"""`kvops kv`: KV-cache bytes for one model and workload point."""

from __future__ import annotations

import click

from kvops.cli.options import (
    POSITIVE,
    TOKEN_COUNT,
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
@click.option("--tokens", "-t", type=TOKEN_COUNT, help="Cached tokens per sequence (prompt + generated; 32K, 32k).")
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
    warnings = [*spec.warnings, *context_warnings(spec, tokens)]
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
