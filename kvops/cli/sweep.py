"""`kvops sweep`: plans for every catalog model on every catalog GPU, as a capacity table and a heatmap."""

from __future__ import annotations

from pathlib import Path

import click

from kvops.cli.options import POSITIVE, int_list, json_option, names, needs, print_json


@click.command()
@click.option(
    "--out",
    "-o",
    required=True,
    type=click.Path(dir_okay=False, writable=True),
    help="CSV to write (one row per engine, model, GPU, tp, KV dtype).",
)
@click.option(
    "--plot",
    "plot_path",
    type=click.Path(dir_okay=False, writable=True),
    help="Heatmap image [default: the CSV's name with .png].",
)
@click.option("--no-plot", is_flag=True, help="Write only the CSV.")
@click.option("--engines", "engine_names", default="vllm", show_default=True, help="Comma-separated: vllm, tgi.")
@click.option("--kv-dtypes", default="auto,fp8", show_default=True, help="Comma-separated KV dtypes.")
@click.option(
    "--tps",
    default="1,2,4,8",
    show_default=True,
    help="Comma-separated tensor-parallel sizes (sizes a model cannot split by are skipped).",
)
@click.option(
    "--max-model-len",
    type=POSITIVE,
    default=8192,
    show_default=True,
    help="Context per request (capped at each model's max_position_embeddings).",
)
@click.option("--models", help="Comma-separated catalog models [default: the whole catalog].")
@click.option("--gpus", "gpu_names", help="Comma-separated catalog GPUs [default: the whole catalog].")
@json_option
def sweep(
    out: str,
    plot_path: str | None,
    no_plot: bool,
    engine_names: str,
    kv_dtypes: str,
    tps: str,
    max_model_len: int,
    models: str | None,
    gpu_names: str | None,
    as_json: bool,
) -> None:
    """Plans for every catalog model on every catalog GPU: capacity table (CSV) and heatmap."""
    needs("plot", "pandas", "matplotlib")
    from kvops import engines
    from kvops.deployment import warn_level
    from kvops.dtypes import KV_DTYPE_CHOICES
    from kvops.errors import KvopsError
    from kvops.gpus import find_gpu, gpu_catalog
    from kvops.model import load_model
    from kvops.model.catalog import catalog
    from kvops.render.plots import plot_sweep
    from kvops.sweep import sweep_frame, sweep_rows

    engine_list = names(engine_names, "--engines", engines.NAMES)
    tp_sizes = int_list(tps, "--tps")
    specs = [load_model(name) for name in (names(models, "--models") if models else [entry.id for entry in catalog()])]
    gpus = [find_gpu(name) for name in names(gpu_names, "--gpus")] if gpu_names else list(gpu_catalog())
    rows = sweep_rows(
        specs,
        gpus,
        engines=engine_list,
        kv_dtypes=names(kv_dtypes, "--kv-dtypes", KV_DTYPE_CHOICES),
        tps=tp_sizes,
        max_model_len=max_model_len,
        warn_level=warn_level(None),
    )
    frame = sweep_frame(rows)
    try:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        frame.to_csv(out, index=False)
    except OSError as exc:
        raise KvopsError(f"--out {out}: cannot write ({exc.strerror or exc})") from None
    image = None
    if not no_plot:
        image = plot_path or str(Path(out).with_suffix(".png"))
        plot_sweep(frame, image, tp=tp_sizes[0])
    fits = int(frame.fits.sum())
    if as_json:
        print_json({"out": out, "plot": image, "rows": len(frame), "fits": fits})
    else:
        click.echo(f"wrote {out}: {len(frame)} plans, {fits} fit" + (f"; plot {image}" if image else ""))
