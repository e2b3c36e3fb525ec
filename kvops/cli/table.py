"""`kvops table`: token tax per batch, full and window-capped KV per context length."""

from __future__ import annotations

import click

from kvops.cli.options import POSITIVE, int_list, kv_dtype_option, model_option, needs, tp_option
from kvops.dtypes import resolve_kv_dtype
from kvops.model import load_model

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
    """Token tax per batch, full and window-capped KV per context length T."""
    batch_values = int_list(batches, "--batches")
    token_values = int_list(tokens_list, "--tokens")
    spec = load_model(model)
    dtype = resolve_kv_dtype(kv_dtype, spec.dtype)
    needs("plot", "pandas")
    from kvops.render.tables import kv_table, render_table, table_header

    frame = kv_table(spec, batches=batch_values, tokens=token_values, dtype=dtype, tp=tp, block_size=block_size)
    click.echo(render_table(frame, table_format, table_header(spec, dtype, tp, block_size)))
