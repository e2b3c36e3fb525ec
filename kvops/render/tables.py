"""The KV table (token tax per batch, KV per context length), built with pandas (imported here only, never on the `kvops kv` path)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from kvops.dtypes import KvDtype
from kvops.formula import kv_cost
from kvops.model.spec import ModelSpec
from kvops.units import format_bytes

if TYPE_CHECKING:
    import pandas

BYTE_COLUMNS = ("token_tax_bytes", "kv_bytes_no_window", "kv_bytes")
TABLE_FORMATS = ("text", "csv", "json", "markdown")


def kv_table(
    spec: ModelSpec,
    *,
    batches: list[int],
    tokens: list[int],
    dtype: KvDtype,
    tp: int = 1,
    block_size: int | None = None,
) -> pandas.DataFrame:
    """One row per (batch, T): the token tax, the cache if no layer slid, and the cache with windows applied."""
    import pandas

    rows = []
    for batch in batches:
        for count in tokens:
            windowed = kv_cost(spec, tokens=count, dtype=dtype, batch=batch, tp=tp, block_size=block_size)
            unwindowed = kv_cost(
                spec, tokens=count, dtype=dtype, batch=batch, tp=tp, block_size=block_size, apply_windows=False
            )
            rows.append(
                {
                    "batch": batch,
                    "tokens": count,
                    "token_tax_bytes": windowed.token_tax_bytes,
                    "kv_bytes_no_window": unwindowed.total_bytes,
                    "kv_bytes": windowed.total_bytes,
                }
            )
    return pandas.DataFrame(rows, columns=["batch", "tokens", *BYTE_COLUMNS])


def table_header(spec: ModelSpec, dtype: KvDtype, tp: int, block_size: int | None) -> dict[str, Any]:
    """What the rows were computed for: the text's first line, and the top of the JSON."""
    return {
        "model": spec.name,
        "kv_dtype": dtype.name,
        "tp": tp,
        "layer_pattern": spec.layer_pattern(),
        "block_size": block_size,
    }


def render_table(frame: pandas.DataFrame, table_format: str, header: dict[str, Any]) -> str:
    """The table in `table_format`; JSON is the header's fields and `rows`, one object per row; text starts with
    the header's line; CSV and markdown are the rows alone."""
    if table_format == "csv":
        return frame.to_csv(index=False).rstrip("\n")
    if table_format == "json":
        return json.dumps({**header, "rows": json.loads(frame.to_json(orient="records"))}, indent=2)
    human = frame.copy()
    for column in ("batch", "tokens"):
        human[column] = human[column].map("{:,}".format)
    for column in BYTE_COLUMNS:
        human[column] = human[column].map(format_bytes)
    human = human.rename(
        columns={"token_tax_bytes": "token tax", "kv_bytes_no_window": "KV (no window)", "kv_bytes": "KV (windowed)"}
    )
    if table_format == "markdown":
        return _markdown(human)
    block = f"   block size {header['block_size']:,}" if header["block_size"] else ""
    title = f"{header['model']}   kv dtype {header['kv_dtype']}   tp {header['tp']}{block}   {header['layer_pattern']}"
    return title + "\n" + human.to_string(index=False)


def _markdown(frame: pandas.DataFrame) -> str:
    header = "| " + " | ".join(map(str, frame.columns)) + " |"
    rule = "|" + "|".join("---:" for _ in frame.columns) + "|"
    body = ["| " + " | ".join(map(str, row)) + " |" for row in frame.itertuples(index=False)]
    return "\n".join([header, rule, *body])
