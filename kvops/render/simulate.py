"""`kvops simulate`'s outputs: the text report, the per-request CSV and the KV-usage and queue plot."""

from __future__ import annotations

import csv
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from kvops.errors import KvopsError
from kvops.files import make_folder
from kvops.simulate.measured import Figures
from kvops.simulate.results import SPREAD_FIGURES, Spread, Summary, request_rows
from kvops.units import format_bytes

if TYPE_CHECKING:
    from kvops.simulate.calibration import Calibration
    from kvops.simulate.session import Answer
    from kvops.simulate.simulation import ArmResult, RateSearch, Replicas
    from kvops.simulate.steptime import StepTime


def text(answer: Answer) -> str:
    lines = _header(answer)
    if answer.arms:
        lines += ["", *_arms_table(answer.arms)]
        lines += _pools(answer.arms, answer.plan.capacity.num_blocks if answer.plan.capacity else None)
        lines += _ratios(answer.arms)
    if answer.spreads:
        lines += ["", *_spread_lines(answer.spreads)]
    elif answer.one_draw is not None and answer.arms:
        lines.append(
            f"one draw of this synthetic traffic (seed {answer.one_draw}): --draws 5 shows how far other seeds move "
            "these figures"
        )
    if answer.measured is not None and answer.arms:
        lines += ["", *_against_measured(answer.measured, answer.arms)]
    if answer.rate_search is not None:
        lines += ["", *_rate_lines(answer.rate_search, answer)]
    if answer.calibration is not None:
        lines += ["", *_calibration_lines(answer.calibration)]
    if answer.replicas is not None:
        lines += _replicas_lines(answer.replicas)
    return "\n".join(lines)


def _replicas_lines(replicas: Replicas) -> list[str]:
    """The answer, each replica's share checked on the trace twice over, and the same check one replica fewer."""
    point, fewer = replicas.per_replica, replicas.fewer
    target = replicas.search.attainment
    lines = [
        f"replicas         {replicas.replicas} for {replicas.target_rps:g} requests/s: each at {point.rate_rps:.3g}/s "
        f"(an equal share), the trace twice over ({point.summary.requests:,} requests): {point.attainment:.0%} meet "
        f"the SLO (target {target:.0%})"
    ]
    if fewer is not None:
        lines.append(
            f"  one fewer: {replicas.replicas - 1} at {fewer.rate_rps:.3g}/s each, {fewer.attainment:.0%} meet the SLO"
        )
    return lines


def _header(answer: Answer) -> list[str]:
    setup, plan = answer.setup, answer.plan
    inputs, capacity = plan.inputs, plan.capacity
    gpu = f"{inputs.devices} x {inputs.gpu.id}" if inputs.gpu else inputs.device
    step_time = setup.step_time
    hardware = step_time.hardware
    summary = setup.trace.summary()
    prompt, output = summary["prompt_tokens"], summary["output_tokens"]
    lengths = f"prompt mean {prompt['mean']:.0f} / p99 {prompt['p99']:,.0f}, output mean {output['mean']:.0f} / p99 {output['p99']:,.0f} tokens"
    clients = f"max_tokens: {_max_tokens_words(setup.clients.max_tokens)}"
    if setup.clients.max_concurrency:
        clients += f"; {setup.clients.max_concurrency} clients at a time"
    fitted_on = step_time.coefficients.fitted_on.split(" (")[0]  # the whole provenance is in --json
    steps = f"{step_time.coefficients.name} profile, fitted on {fitted_on} (--json: each coefficient's source)"
    if inputs.lora is not None:
        steps += "; LoRA adapters' kernels not priced (their slots are out of the pool)"
    return [
        f"kvops simulate: {inputs.spec.name} on {gpu}, tp {inputs.tp}",
        "",
        f"pool             {capacity.num_blocks:,} blocks of {capacity.block_size} tokens ({format_bytes(plan.kv_cache_bytes)} of KV memory), max-model-len {capacity.max_model_len:,}"
        if capacity
        else "pool             none",
        f"traffic          {setup.trace.source}",
        f"lengths          {lengths}",
        f"clients send     {clients}",
        f"step time        {steps}",
        f"device           {hardware.name}: {hardware.memory_bandwidth / 1e12:.3g} TB/s, {_tflops(hardware.flops)} TFLOP/s dense{_scale_words(step_time)}",
        f"SLO              TTFT <= {_ms(setup.slo.ttft_s)}, TPOT <= {_ms(setup.slo.tpot_s)}",
    ]


def _tflops(flops: float) -> str:
    """Whole TFLOP/s for a GPU; two figures below one (a CPU's 0.2)."""
    tflops = flops / 1e12
    return f"{tflops:,.0f}" if tflops >= 1 else f"{tflops:.2g}"


def _scale_words(step_time: StepTime) -> str:
    scale = step_time.coefficients.gpu_scale(step_time.hardware.name)
    return f"; its steps x {scale:.2f}, fitted on its public runs" if scale != 1.0 else ""


FIGURE_COLUMNS = ("TTFT mean", "p90", "TPOT mean", "p90", "E2E mean", "p90")


def _calibration_lines(calibration: Calibration) -> list[str]:
    """The benchmark's figures beside the simulation's, before and after the fit, and what was fitted."""
    rows = [
        _figure_row("measured", calibration.measured),
        _figure_row("simulated, as shipped", calibration.before, calibration.measured),
        _figure_row("simulated, calibrated", calibration.after, calibration.measured),
    ]
    base = calibration.base
    return [
        *table(("", *FIGURE_COLUMNS), rows),
        "",
        f"step time        x {calibration.scale:.4f} on every coefficient of the {base.name} profile (the mean TPOT, "
        f"{calibration.rounds} rounds); the API server's {_ms(base.api_s.value)} a request kept",
    ]


def _against_measured(measured: Figures, arms: tuple[ArmResult, ...]) -> list[str]:
    """A benchmark's own figures beside each arm's, where the trace is that benchmark's requests."""
    rows = [_figure_row("measured", measured)]
    rows += [_figure_row(f"simulated, {arm.arm}", Figures.of(arm.summary), measured) for arm in arms]
    return table(("the benchmark", *FIGURE_COLUMNS), rows)


def _figure_row(name: str, figures: Figures, measured: Figures | None = None) -> tuple[str, ...]:
    """Mean and p90 of TTFT, TPOT and E2E, each with its ratio to the measured one where that is given."""
    cells = [name]
    for metric in ("ttft", "tpot", "e2e"):
        for stat in ("mean", "p90"):
            mine = getattr(getattr(figures, metric), stat)
            theirs = getattr(getattr(measured, metric), stat) if measured is not None else 0.0
            cells.append(_ms(mine) + (f" {mine / theirs:.2f}x" if theirs else ""))
    return tuple(cells)


def _max_tokens_words(mode: str) -> str:
    return {
        "trace": "the trace's (its length where it has none)",
        "exact": "each request's length, ignore_eos (the engine knows every length)",
        "none": "omitted (the engine allows up to max-model-len; requests stop by themselves)",
    }.get(mode, mode.replace("cap:", "") + ", requests stopping by themselves within it")


def _arms_table(arms: tuple[ArmResult, ...]) -> list[str]:
    header = (
        "arm",
        "done",
        "TTFT mean",
        "p99",
        "TPOT mean",
        "p99",
        "E2E p50",
        "p99",
        "req/s",
        "goodput",
        "SLO met",
        "preemptions",
        "recomputed",
        "peak KV",
    )
    rows = []
    for arm in arms:
        summary = arm.summary
        rows.append(
            (
                arm.arm,
                f"{summary.completed:,}/{summary.requests:,}",
                _ms(summary.ttft.mean),
                _ms(summary.ttft.p99),
                _ms(summary.tpot.mean),
                _ms(summary.tpot.p99),
                _ms(summary.e2e.p50),
                _ms(summary.e2e.p99),
                f"{summary.throughput_rps:.3g}",
                f"{summary.goodput_rps:.3g}/s",
                f"{summary.attainment:.0%}",
                _preemptions(summary),
                f"{summary.recomputed_tokens:,}",
                f"{summary.peak_usage:.0%}",
            )
        )
    lines = table(header, rows)
    for arm in arms:
        if arm.change:
            lines.append(f"  {arm.arm}: {arm.change}")
        if arm.summary.refusals or arm.summary.capped:
            lines.append(f"  {arm.arm}: {_degraded(arm.summary)}")
    lines.append(f"  scheduler: {arms[0].label}")
    return lines


def _spread_lines(spreads: tuple[Spread, ...]) -> list[str]:
    """Each arm's figures over the draws of the traffic: the median, and the lowest and highest in brackets."""
    seeds = spreads[0].seeds
    header = ("arm", *(column for _, column, _, _ in SPREAD_FIGURES))
    rows = [
        (item.arm, *(_spread_cell(item.values[name], unit) for name, _, _, unit in SPREAD_FIGURES)) for item in spreads
    ]
    return [
        f"over {len(seeds)} draws of the traffic (seeds {seeds[0]}-{seeds[-1]}): median [lowest-highest]",
        *table(header, rows),
    ]


def _spread_cell(values: tuple[float, ...], unit: str) -> str:
    low, middle, high = min(values), statistics.median(values), max(values)
    if unit == "share":
        return f"{middle:.0%} [{low:.0%}-{high:.0%}]"
    if unit == "count":
        return f"{middle:,.0f} [{low:,.0f}-{high:,.0f}]"
    if unit == "ms":
        return f"{_ms(middle / 1000)} [{_ms(low / 1000)}-{_ms(high / 1000)}]"
    return f"{middle:.3g}/s [{low:.3g}-{high:.3g}]"


def _preemptions(summary: Summary) -> str:
    """The preemptions (events), and how many requests they hit where fewer (`preempted_requests` in --json)."""
    events = f"{summary.preemptions:,}"
    if summary.preempted_requests == summary.preemptions:
        return events
    return f"{events} ({summary.preempted_requests:,} req)"


def _degraded(summary: Summary) -> str:
    """What a degrade policy did to the requests: refusals (each sent again after its Retry-After) and caps."""
    return (
        f"{summary.refusals:,} refusals with Retry-After, {summary.refused:,} requests given up after their "
        f"retries; {summary.capped:,} served with their new tokens capped"
    )


def _pools(arms: tuple[ArmResult, ...], planned_blocks: int | None) -> list[str]:
    """Each arm's pool where one is not the plan's: vLLM sizes its KV cache after its sampler and CUDA graphs, which
    follow --max-num-seqs, so an arm at vLLM's default runs on the pool stock vLLM would size."""
    runs: dict[tuple[int, int], list[str]] = {}
    for arm in arms:
        runs.setdefault((arm.settings["num_blocks"], arm.settings["max_num_seqs"]), []).append(arm.arm)
    if all(blocks == planned_blocks for blocks, _ in runs):
        return []
    each = "; ".join(
        f"{', '.join(names)} {blocks:,} blocks at --max-num-seqs {seqs}" for (blocks, seqs), names in runs.items()
    )
    return [f"  pool per arm: {each} (KV is sized after the sampler and CUDA graphs, which follow --max-num-seqs)"]


def _ratios(arms: tuple[ArmResult, ...]) -> list[str]:
    if len(arms) < 2:
        return []
    base = arms[0]
    parts = []
    for arm in arms[1:]:
        ratio = arm.summary.goodput_rps / base.summary.goodput_rps if base.summary.goodput_rps else float("nan")
        parts.append(f"{arm.arm} {ratio:.2f}x")
    return [f"goodput against {base.arm}: {', '.join(parts)}"]


def _rate_lines(search: RateSearch, answer: Answer) -> list[str]:
    rows = [
        (
            f"{point.rate_rps:.3g}",
            f"{point.attainment:.0%}",
            f"{point.goodput_rps:.3g}",
            _ms(point.summary.ttft.p99),
            _ms(point.summary.tpot.p99),
            _preemptions(point.summary),
        )
        for point in sorted(search.points, key=lambda point: point.rate_rps)
    ]
    lines = table(("rate/s", "SLO met", "goodput/s", "TTFT p99", "TPOT p99", "preemptions"), rows)
    verdict = (
        f"max rate         {search.max_rate_rps:.3g} requests/s on one replica meet the SLO for {search.attainment:.0%} of requests ({search.arm})"
        if search.max_rate_rps > 0
        else f"max rate         none of the rates tried meets the SLO for {search.attainment:.0%} of requests ({search.arm})"
    )
    return [
        *lines,
        f"  saturation: {search.saturation_rps:.3g} requests/s with every request sent at once",
        *_twice_over_lines(search),
        verdict,
    ]


def _twice_over_lines(search: RateSearch) -> list[str]:
    """The trace twice over at the max rate: whether that rate holds for longer than the trace lasts."""
    point = search.twice_over
    if point is None:
        return []
    held = "holds" if search.sustained else "does not hold: read it as an upper bound"
    return [
        f"  twice over: {point.summary.requests:,} requests at {point.rate_rps:.3g}/s, {point.attainment:.0%} meet "
        f"the SLO; the max rate {held}"
    ]


def table(header: tuple[str, ...], rows: Sequence[tuple[str, ...]]) -> list[str]:
    """Columns padded to their widest cell: the first left-aligned, the figures right-aligned."""
    widths = [max(len(row[index]) for row in (header, *rows)) for index in range(len(header))]

    def line(cells: tuple[str, ...]) -> str:
        first = cells[0].ljust(widths[0])
        return "  ".join([first, *(cell.rjust(width) for cell, width in zip(cells[1:], widths[1:]))]).rstrip()

    return [line(header), *(line(row) for row in rows)]


def _ms(seconds: float) -> str:
    if seconds >= 10:
        return f"{seconds:,.1f} s"
    if seconds >= 1:
        return f"{seconds:.2f} s"
    return f"{seconds * 1000:.3g} ms"


def write_csv(answer: Answer, path: str) -> None:
    """One row per request of every arm (the first column names the arm)."""
    try:
        make_folder(path)
        with open(path, "w", newline="") as stream:
            writer = None
            for arm in answer.arms:
                for row in request_rows(arm.log, answer.setup.slo):
                    if writer is None:
                        writer = csv.DictWriter(stream, fieldnames=["arm", *row])
                        writer.writeheader()
                    writer.writerow({"arm": arm.arm, **row})
    except OSError as exc:
        raise KvopsError(f"--csv {path}: cannot write ({exc.strerror or exc})") from None


def write_plot(answer: Answer, path: Path) -> None:
    """KV usage and the waiting queue against time, one line per arm."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise KvopsError("--plot needs matplotlib: pip install 'kvops[plot]'") from None
    figure, (usage, queue) = plt.subplots(2, 1, sharex=True, figsize=(9, 6))
    for arm in answer.arms:
        timeline = arm.log.timeline
        usage.plot(timeline.time, [value * 100 for value in timeline.usage], label=arm.arm, linewidth=0.8)
        queue.plot(timeline.time, timeline.waiting, label=arm.arm, linewidth=0.8)
    usage.set_ylabel("KV cache usage (%)")
    usage.set_ylim(0, 102)
    queue.set_ylabel("requests waiting")
    queue.set_xlabel("seconds from the first request")
    usage.legend(loc="upper right")
    usage.set_title(f"{answer.plan.inputs.spec.name}: {answer.setup.trace.source}", fontsize=9)
    figure.tight_layout()
    try:
        make_folder(path)
        figure.savefig(path, dpi=110)
    except OSError as exc:
        raise KvopsError(f"--plot {path}: cannot write ({exc.strerror or exc})") from None
    finally:
        plt.close(figure)
