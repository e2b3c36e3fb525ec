"""`kvops plot` as a user reads it: the y axis in binary units, the KV budget the planner computes per model (its
engine and share of the device named), several points on a short context axis."""

from __future__ import annotations

import json

import pytest

from kvops.dtypes import KV_DTYPES
from kvops.gpus import find_gpu
from kvops.model import load_model
from kvops.planner import kv_budget
from kvops.render.plots import Budget, context_points, kv_figure
from kvops.units import format_bytes

pytest.importorskip("matplotlib", reason="matplotlib is not installed (pip install -e '.[test]'; .ci/run does)")

BF16 = KV_DTYPES["bf16"]


def figure_for(spec, budgets=(), longest=32768):
    import matplotlib.pyplot as plt

    figure = kv_figure(
        [spec], dtype_for={spec.name: BF16}, batches=[1, 8], longest=longest, tp=1, budgets=list(budgets)
    )
    figure.canvas.draw()
    try:
        axes = figure.axes[0]
        ticks = [label.get_text() for label in axes.get_yticklabels() if label.get_text()]
        legend = [text.get_text() for text in axes.get_legend().get_texts()]
        return ticks, legend, axes
    finally:
        plt.close(figure)


def test_the_y_axis_reads_in_binary_units():
    ticks, _, _ = figure_for(load_model("llama-2-7b"))
    assert {"64 MiB", "512 MiB", "1 GiB", "16 GiB"} <= set(ticks)
    assert not any("^" in tick or (tick[:1] == "2" and "^" in tick) for tick in ticks)


def test_the_budget_line_is_the_plans_kv_budget_with_its_engine_and_share():
    spec = load_model("mistral-7b-v0.1")
    budget = kv_budget(spec, find_gpu("L40S"), "vllm", 1, "auto", None, 32768)
    from kvops.plan import PlanInputs
    from kvops.planner import predict

    expected = predict(PlanInputs("vllm", spec, find_gpu("L40S"), max_model_len=32768)).kv_cache_bytes
    assert budget.kv_cache_bytes == expected < find_gpu("L40S").memory_bytes  # less than the device: the room for KV
    _, legend, axes = figure_for(spec, [Budget(spec.name, budget.kv_cache_bytes, budget.label)])
    assert any(line.get_ydata()[0] == expected for line in axes.get_lines())
    # the budget on the L40S torch sees (44.42 GiB, kvops/catalog/device_totals.json) with fitted overheads (issue 13)
    assert (
        f"KV budget: vLLM --gpu-memory-utilization unset (1) on L40S: {format_bytes(expected)} for mistralai/Mistral-7B-v0.1"
        in legend
    )


@pytest.mark.parametrize("longest", [1, 7, 100, 500, 131072])
def test_short_context_axes_still_draw_lines(longest):
    points = context_points(longest)
    assert points[-1] == longest and points == sorted(set(points))
    assert len(points) >= min(longest, 8)


def test_plot_json_names_the_budgets(run_kvops, tmp_path):
    out = tmp_path / "kv.png"
    document = json.loads(
        run_kvops("plot", "-m", "llama-2-7b", "--gpu", "L40S", "-e", "tgi", "--out", str(out), "--json").stdout
    )
    (budget,) = document["kv_budgets"]
    assert budget["engine"] == "tgi" and budget["memory_fraction"] == 1.0 and budget["kv_cache_bytes"] > 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_missing_output_folder_is_made(run_kvops, tmp_path):
    run_kvops("plot", "-m", "llama-2-7b", "--out", str(tmp_path / "figures" / "kv.png"))
    assert (tmp_path / "figures" / "kv.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize(
    "out, message",
    [("a-file/kv.png", "cannot write"), ("kv.nosuchformat", "not an image format matplotlib writes")],
)
def test_a_bad_output_path_is_one_line(run_kvops, tmp_path, out, message):
    (tmp_path / "a-file").write_text("not a folder")
    ran = run_kvops("plot", "-m", "llama-2-7b", "--out", str(tmp_path / out), expect=1)
    assert message in ran.stderr and len(ran.stderr.strip().splitlines()) == 1
