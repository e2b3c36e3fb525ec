"""`kvops models`: the embedded catalog and the fields that decide KV cost."""

from __future__ import annotations

import click

from kvops.cli.options import json_option, print_json
from kvops.model import load_model


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
