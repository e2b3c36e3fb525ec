"""`kvops models` output: the catalog with the fields that decide KV cost."""

from __future__ import annotations

from typing import Any

from kvops.dtypes import KvDtype
from kvops.formula import kv_cost
from kvops.model.spec import ModelSpec, MultiLatentAttention
from kvops.units import format_bytes


def models_document(specs: list[ModelSpec], dtype: KvDtype) -> list[dict[str, Any]]:
    rows = []
    for spec in specs:
        latent = next((layer for layer in spec.layers if isinstance(layer, MultiLatentAttention)), None)
        rows.append(
            {
                "id": spec.name,
                "aliases": list(spec.aliases),
                "model_type": spec.model_type,
                "dtype": spec.dtype,
                "layers": spec.num_layers,
                "attention_heads": spec.num_attention_heads,
                "kv_heads": spec.num_kv_heads,
                "head_dim": spec.head_dim,
                "sliding_window": spec.sliding_window,
                "layer_pattern": spec.layer_pattern(),
                "mla": None
                if latent is None
                else {"kv_lora_rank": latent.kv_lora_rank, "qk_rope_head_dim": latent.qk_rope_head_dim},
                "max_position_embeddings": spec.max_position_embeddings,
                "parameters": spec.parameters,
                "parameters_source": spec.parameters_source,
                f"bytes_per_token_{dtype.name}": kv_cost(spec, tokens=1, dtype=dtype).bytes_per_token,
            }
        )
    return rows


def models_text(rows: list[dict[str, Any]]) -> str:
    key = next(name for name in rows[0] if name.startswith("bytes_per_token_")) if rows else "bytes_per_token_bf16"
    header = f"{'model':<38} {'alias':<24} {'layers':>6} {'heads':>5} {'kv':>4} {'dim':>4} {'params':>8} {key.split('_')[-1] + '/token':>11}  layers / window / MLA"
    lines = [header]
    for row in rows:
        alias = row["aliases"][0] if row["aliases"] else ""
        params = f"{row['parameters'] / 1e9:.2f}B" if row["parameters"] >= 1e9 else f"{row['parameters'] / 1e6:.0f}M"
        kind = row["layer_pattern"]
        if row["mla"]:
            kind = f"MLA latent {row['mla']['kv_lora_rank']}+{row['mla']['qk_rope_head_dim']} on all {row['layers']} layers"
        lines.append(
            f"{row['id']:<38} {alias:<24} {row['layers']:>6} {row['attention_heads']:>5} {row['kv_heads']:>4} {row['head_dim']:>4} "
            f"{params:>8} {format_bytes(row[key]):>11}  {kind}"
        )
    return "\n".join(lines)
