"""KV bytes against context length, with matplotlib (imported here only)."""

from __future__ import annotations

from kvops.dtypes import KvDtype
from kvops.formula import kv_cost
from kvops.model.spec import ModelSpec
from kvops.units import format_bytes

GIB = 1 << 30


def context_points(longest: int) -> list[int]:
    """Powers of two from 128 up to and including `longest`."""
    points, count = [], 128
    while count < longest:
        points.append(count)
        count *= 2
    return points + [longest]


def plot_kv(
    specs: list[ModelSpec],
    *,
    dtype_for: dict[str, KvDtype],
    batches: list[int],
    longest: int,
    tp: int,
    gpu_memory: int | None,
    out: str,
) -> None:
    """One colour per model, one line style per batch: KV GiB against tokens, both axes log2.

    Sliding windows show as plateaus (a dotted line marks a window every layer shares).
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(9, 5.5), dpi=120)
    points = context_points(longest)
    styles = ["-", "--", ":", "-."]
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for index, spec in enumerate(specs):
        dtype = dtype_for[spec.name]
        color = colors[index % len(colors)]
        attention = (
            "MLA"
            if spec.is_mla
            else ("MHA" if spec.num_kv_heads == spec.num_attention_heads else f"GQA {spec.num_kv_heads} KV heads")
        )
        for batch_index, batch in enumerate(batches):
            values = [kv_cost(spec, tokens=t, dtype=dtype, batch=batch, tp=tp).total_bytes / GIB for t in points]
            axes.plot(
                points,
                values,
                styles[batch_index % len(styles)],
                color=color,
                marker=".",
                label=f"{spec.name} ({attention}, {dtype.name}) batch {batch}",
            )
        if spec.sliding_window and all(layer.kind == "sliding" for layer in spec.layers):
            axes.axvline(spec.sliding_window, color=color, linewidth=0.6, linestyle=":")
    if gpu_memory:
        axes.axhline(gpu_memory / GIB, color="red", linewidth=1.2, label=f"GPU memory {format_bytes(gpu_memory)}")
    axes.set_xscale("log", base=2)
    axes.set_yscale("log", base=2)
    axes.set_xlabel("cached tokens per sequence (T)")
    axes.set_ylabel(f"KV cache per GPU (GiB), tp {tp}")
    axes.set_title("KV cache = 2 x L x B x T x Hkv x D x s  (windows applied)")
    axes.grid(True, which="both", alpha=0.3)
    axes.legend(fontsize=7)
    figure.tight_layout()
    figure.savefig(out)
    plt.close(figure)
