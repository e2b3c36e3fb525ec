"""Figures, with matplotlib (imported here only): KV bytes against context length, the sweep's heatmaps."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from kvops import engines
from kvops.dtypes import KvDtype
from kvops.errors import KvopsError
from kvops.formula import kv_cost
from kvops.frozen import frozen
from kvops.model.spec import ModelSpec
from kvops.policy import GRADED, Level, Policy
from kvops.units import format_bytes

if TYPE_CHECKING:
    import pandas

MIN_POINTS = 8  # a short context axis still draws a line, not a dot


@frozen
class Budget:
    """A horizontal line: the KV memory a plan leaves for one model on the device, and what it is."""

    model: str
    bytes: int
    label: str


def context_points(longest: int) -> list[int]:
    """Context lengths to draw: powers of two up to `longest` (from 128 when the axis is long), or, for a short axis,
    evenly spaced integers, so there are always several points."""
    start = 128 if longest >= 128 * MIN_POINTS else 1
    points, count = [], start
    while count < longest:
        points.append(count)
        count *= 2
    points.append(longest)
    if len(points) >= MIN_POINTS:
        return points
    step = max(1, longest // (2 * MIN_POINTS))
    return sorted({*range(step, longest, step), longest})


def kv_figure(
    specs: list[ModelSpec],
    *,
    dtype_for: dict[str, KvDtype],
    batches: list[int],
    longest: int,
    tp: int,
    budgets: list[Budget],
):
    """One colour per model, one line style per batch: KV bytes against tokens, both axes log2, the y axis in binary
    units. Sliding windows show as plateaus (a dotted line marks a window every layer shares); each budget is a
    horizontal line in its model's colour."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, LogLocator

    figure, axes = plt.subplots(figsize=(9, 5.5), dpi=120)
    points = context_points(longest)
    styles = ["-", "--", ":", "-."]
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for index, spec in enumerate(specs):
        dtype = dtype_for[spec.name]
        color = colors[index % len(colors)]
        for batch_index, batch in enumerate(batches):
            values = [kv_cost(spec, tokens=t, dtype=dtype, batch=batch, tp=tp).total_bytes for t in points]
            label = f"{spec.name} ({_attention(spec)}, {dtype.name}) batch {batch}"
            axes.plot(points, values, styles[batch_index % len(styles)], color=color, marker=".", label=label)
        if spec.sliding_window and all(layer.kind == "sliding" for layer in spec.layers):
            axes.axvline(spec.sliding_window, color=color, linewidth=0.6, linestyle=":")
        for budget in budgets:
            if budget.model == spec.name:
                axes.axhline(budget.bytes, color=color, linewidth=4, alpha=0.3, label=budget.label)
    axes.set_xscale("log", base=2)
    axes.set_yscale("log", base=2)
    axes.yaxis.set_major_locator(LogLocator(base=2, numticks=24))
    axes.yaxis.set_major_formatter(FuncFormatter(lambda value, _: format_bytes(value)))
    axes.xaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:,.0f}"))
    axes.set_xlabel("cached tokens per sequence (T)")
    axes.set_ylabel(f"KV cache per GPU, tp {tp}")
    axes.set_title("KV cache = 2 x L x B x T x Hkv x D x s  (windows applied)")
    axes.grid(True, which="both", alpha=0.3)
    axes.legend(fontsize=7)
    figure.tight_layout()
    return figure


def plot_kv(specs: list[ModelSpec], *, out: str, **options) -> None:
    """Write `kv_figure` to `out` (the format from its extension)."""
    import matplotlib.pyplot as plt

    figure = kv_figure(specs, **options)
    try:
        save(figure, out)
    finally:
        plt.close(figure)


def save(figure, out: str) -> None:
    """Save a figure (its folder made if missing); a bad path or an unknown extension is one line naming what would
    work, and so is a name without an extension (matplotlib would write NAME.png, not NAME)."""
    if not Path(out).suffix:
        kinds = ", ".join(sorted(figure.canvas.get_supported_filetypes()))
        raise KvopsError(f"--out {out}: name the file with its format's extension, one of: {kinds}")
    try:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        figure.savefig(out)
    except OSError as exc:
        raise KvopsError(f"--out {out}: cannot write ({exc.strerror or exc})") from None
    except ValueError:
        kinds = ", ".join(sorted(figure.canvas.get_supported_filetypes()))
        raise KvopsError(
            f"--out {out}: not an image format matplotlib writes; name the file with one of: {kinds}"
        ) from None


def _attention(spec: ModelSpec) -> str:
    if spec.is_mla:
        return "MLA"
    return "MHA" if spec.num_kv_heads == spec.num_attention_heads else f"GQA {spec.num_kv_heads} KV heads"


def plot_sweep(frame: pandas.DataFrame, out: str, tp: int) -> None:
    """Heatmaps of KV tokens (log scale) per model and GPU at one tp: a row per engine, a panel per KV dtype;
    '-' = does not fit (or the model does not split over this tp)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    subset = frame[frame.tp == tp]
    engine_names = list(dict.fromkeys(subset.engine))
    dtypes = list(dict.fromkeys(subset.kv_dtype))
    models = list(dict.fromkeys(subset.model))
    gpus = list(dict.fromkeys(subset.sort_values("gpu_memory_bytes").gpu))
    figure, axes = plt.subplots(
        len(engine_names),
        len(dtypes),
        figsize=(1.0 * len(gpus) * len(dtypes) + 4, (0.42 * len(models) + 2.5) * len(engine_names)),
        squeeze=False,
        sharey=True,
    )
    try:
        for row, engine in enumerate(engine_names):
            for axis, dtype in zip(axes[row], dtypes):
                cells = subset[(subset.engine == engine) & (subset.kv_dtype == dtype)]
                title = f"{engines.get(engine).title}, tp {tp}, KV {dtype}" + (
                    " (the model's)" if dtype == "auto" else ""
                )
                _heatmap(figure, axis, cells, models, gpus, title)
        figure.tight_layout()
        save(figure, out)
    finally:
        plt.close(figure)


def _heatmap(figure, axis, cells: pandas.DataFrame, models: list[str], gpus: list[str], title: str) -> None:
    import numpy
    from matplotlib.colors import LogNorm

    def table(column: str) -> pandas.DataFrame:
        return cells.pivot_table(index="model", columns="gpu", values=column, aggfunc="first").reindex(
            index=models, columns=gpus
        )

    values = table("kv_tokens").where(table("fits").fillna(False).astype(bool)).to_numpy(dtype=float)
    finite = numpy.isfinite(values) & (values > 0)
    masked = numpy.ma.masked_invalid(numpy.where(finite, values, numpy.nan))
    top = max(1e4, float(values[finite].max())) if finite.any() else 1e4
    image = axis.imshow(masked, aspect="auto", cmap="viridis", norm=LogNorm(vmin=1e3, vmax=top))
    for (row, column), value in numpy.ndenumerate(values):
        fits = finite[row, column]
        label = f"{value / 1000:.0f}k" if fits else "-"
        axis.text(column, row, label, ha="center", va="center", fontsize=7, color="white" if fits else "black")
    axis.set_xticks(range(len(gpus)), gpus, rotation=60, ha="right", fontsize=8)
    axis.set_yticks(range(len(models)), models, fontsize=8)
    axis.set_title(title, fontsize=9)
    figure.colorbar(image, ax=axis, shrink=0.6, label="KV cache size (tokens)")


REPORT_BANDS = {Level.OK: "#e8f5e9", Level.WARN: "#fff8e1", Level.DEGRADE: "#ffe0b2", Level.CRITICAL: "#ffcdd2"}
REPORT_LEVELS = {"ok": "#2e7d32", "warn": "#f9a825", "degrade": "#ef6c00", "critical": "#c62828", "unknown": "#616161"}


def plot_report(frame: pandas.DataFrame, policy: Policy, out: str, title: str) -> None:
    """Each replica's KV usage over time on the policy's bands, a vertical line at every level change."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(10, 4.5), dpi=120)
    edges = [0.0] + [policy.thresholds[level] * 100 for level in GRADED] + [100.0]
    for level, low, high in zip((Level.OK, *GRADED), edges, edges[1:]):
        axes.axhspan(low, high, color=REPORT_BANDS[level], zorder=0)
        axes.text(1.005, (low + high) / 2, level.label, transform=axes.get_yaxis_transform(), va="center", fontsize=8)
    for replica, rows in frame.groupby("replica", sort=True):
        rows = rows.sort_values("time")
        axes.plot(
            rows["seconds"],
            rows["kv_usage"] * 100,
            marker=".",
            markersize=3,
            linewidth=1.2,
            label=str(replica),
            zorder=3,
        )
        for at, before, after in zip(rows["seconds"], rows["level"].shift(), rows["level"]):
            if isinstance(before, str) and before != after:
                axes.axvline(at, color=REPORT_LEVELS.get(after, "black"), linestyle="--", linewidth=0.8, zorder=2)
                axes.text(
                    at,
                    101,
                    after,
                    rotation=90,
                    va="bottom",
                    ha="center",
                    fontsize=7,
                    color=REPORT_LEVELS.get(after, "black"),
                )
    axes.set_ylim(0, 100)
    axes.set_xlim(left=0)
    axes.set_xlabel("seconds since the first poll")
    axes.set_ylabel("KV-cache usage (%)")
    axes.set_title(title, fontsize=10, pad=28)
    if frame["replica"].nunique() > 1:
        axes.legend(fontsize=8, loc="upper left")
    figure.tight_layout()
    try:
        save(figure, out)
    finally:
        plt.close(figure)
