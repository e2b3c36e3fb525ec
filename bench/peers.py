"""vllm-wizard 0.2.0 and vramscout 0.7.0 on the corpus launches kvops planned (bench/accuracy.py --peers VENV).

Both run offline on a local config.json of the same model (the catalog's, written to a scratch folder), with the
launch's tp, context, utilization, weight format and KV dtype, and the GPU as a user gives it: its name and
nvidia-smi's total. Their KV prediction is the memory each says the engine leaves for the KV cache:
- vllm-wizard: `vram_target_alloc_gb - weights_gb - overhead_gb` of `plan --json` (its GB are GiB);
- vramscout: `memory_budget_gib` less every part of `parts_gib` but the KV cache (`--engine vllm --json`).
Install them apart from kvops: `python -m venv VENV && VENV/bin/pip install vllm-wizard==0.2.0 vramscout==0.7.0`.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from kvops.model import catalog
from kvops.units import GiB

if TYPE_CHECKING:
    from bench.rows import Row

OVER_PROMISE = 0.02  # as bench/accuracy.py: more than 2% more KV than logged
PEERS = ("vllm-wizard", "vramscout")
WEIGHT_FLAGS = {"fp8": "fp8", "awq": "awq", "gptq": "gptq", "int8": "int8"}


@dataclass
class Guess:
    """What one planner said of one launch: the KV it leaves, whether it starts, max concurrency when it says."""

    kv_bytes: float
    fits: bool | None
    concurrency: float | None = None


def peer_report(rows: list[Row], venv: Path) -> str:
    # a negative logged KV (the launch failed for it) has no relative error: such logs count in kvops' agreement only
    planned = [row for row in rows if row.planned and row.entry.engine == "vllm" and (row.logged.kv_bytes or 0) > 0]
    guesses: dict[str, dict[str, Guess]] = {"kvops": {}, **{peer: {} for peer in PEERS}}
    failures: dict[str, list[str]] = {peer: [] for peer in PEERS}
    with tempfile.TemporaryDirectory() as scratch:
        for row in planned:
            config = _config_dir(row, Path(scratch))
            guesses["kvops"][row.entry.id] = Guess(row.predicted["kv_bytes"], row.fits, row.predicted["concurrency"])
            for peer in PEERS:
                try:
                    guesses[peer][row.entry.id] = _run(peer, venv, row, config)
                except PeerFailed as exc:
                    failures[peer].append(f"{row.entry.id}: {exc}")
    lines = [
        "peers on the same launches (the KV memory each says the engine leaves; errors against the logged KV)",
        "",
        *_per_log(planned, guesses),
        "",
        *_grouped("by release family", planned, guesses, lambda row: row.family),
        "",
        *_grouped("by GPU", planned, guesses, lambda row: row.gpu),
    ]
    common = set.intersection(*(set(found) for found in guesses.values()))
    lines += [
        "",
        f"| planner | KV MAPE (launches it ran) | KV MAPE on the {len(common)} launches all three ran |",
        "|---|---|---|",
    ]
    by_id = {row.entry.id: row for row in planned}
    for name, found in guesses.items():
        ran = [by_id[key] for key in found]
        both = [by_id[key] for key in sorted(common)]
        lines.append(
            f"| {name} | {_mape(_errors(ran, found))} ({len(found)} of {len(planned)}) | {_mape(_errors(both, found))} |"
        )
    for peer, failed in failures.items():
        lines += ["", f"{peer} could not run:", *(f"- {item}" for item in failed)] if failed else []
    return "\n".join(lines)


def _per_log(planned: list[Row], guesses: dict[str, dict[str, Guess]]) -> list[str]:
    head = ["entry", "logged KV GiB", *(f"{name} KV GiB" for name in guesses)]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in planned:
        logged = row.logged.kv_bytes
        cells = [row.entry.id, f"{logged / GiB:.2f}"]
        for found in guesses.values():
            guess = found.get(row.entry.id)
            cells.append(
                f"{guess.kv_bytes / GiB:.2f} ({(guess.kv_bytes - logged) / abs(logged):+.1%})" if guess else "failed"
            )
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def _grouped(title: str, planned: list[Row], guesses: dict[str, dict[str, Guess]], key) -> list[str]:
    """Per group, for each planner: KV MAE / MAPE (n), the over-promise share and the fit/no-fit agreement."""
    groups: dict[str, list[Row]] = {}
    for row in planned:
        groups.setdefault(key(row), []).append(row)
    head = ["group", *(f"{name}: KV MAE GiB / MAPE (n), over-promise, fit agrees" for name in guesses)]
    lines = [f"peers {title}", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, members in sorted(groups.items()):
        cells = [name]
        for found in guesses.values():
            ran = [row for row in members if row.entry.id in found]
            if not ran:
                cells.append("-")
                continue
            errors = _errors(ran, found)
            mae = statistics.mean(abs(found[row.entry.id].kv_bytes - row.logged.kv_bytes) for row in ran) / GiB
            over = sum(found[row.entry.id].kv_bytes > (1 + OVER_PROMISE) * row.logged.kv_bytes for row in ran)
            judged = [row for row in ran if found[row.entry.id].fits is not None]
            agree = sum(found[row.entry.id].fits == row.entry.started for row in judged)
            cells.append(f"{mae:.2f} / {_mape(errors)} ({len(ran)}), {over}/{len(ran)}, {agree}/{len(judged)}")
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def _errors(rows: list[Row], found: dict[str, Guess]) -> list[float]:
    return [abs(found[row.entry.id].kv_bytes - row.logged.kv_bytes) / abs(row.logged.kv_bytes) for row in rows]


class PeerFailed(Exception):
    pass


def _mape(found: list[float]) -> str:
    return f"{sum(found) / len(found):.1%}" if found else "-"


def _config_dir(row: Row, scratch: Path) -> Path:
    spec = row.inputs.spec
    entry = catalog.find(spec.name)
    config = entry.config if entry is not None else json.loads(Path(spec.source_path).read_text())
    folder = scratch / row.entry.id
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def _run(peer: str, venv: Path, row: Row, config: Path) -> Guess:
    inputs, plan_len = row.inputs, row.predicted_len
    gpu = inputs.gpu
    utilization = inputs.memory_fraction or 0.9
    vram = gpu.memory_bytes / GiB
    weights = WEIGHT_FLAGS.get(str(inputs.quantization))
    if peer == "vllm-wizard":
        command = [
            str(venv / "bin" / "vllm-wizard"), "plan", "--model", str(config), "--gpu", gpu.id,
            "--vram-gb", f"{vram:.2f}", "--gpus", str(inputs.tp), "--tensor-parallel-size", str(inputs.tp),
            "--max-model-len", str(plan_len), "--gpu-memory-utilization", f"{utilization:g}", "--json",
        ]  # fmt: skip
        if weights in ("awq", "gptq", "int8", "fp8"):
            command += ["--quantization", weights]
        data = _json(command)
        report = data["feasibility"]
        kv = (report["vram_target_alloc_gb"] - report["weights_gb"] - report["overhead_gb"]) * GiB
        return Guess(kv, report.get("fits"), report.get("max_concurrency_at_context"))
    command = [
        str(venv / "bin" / "vramscout"), str(config), "--context", str(plan_len), "--engine", "vllm",
        "--tp", str(inputs.tp), "--gpu-memory-utilization", f"{utilization:g}", "--vram-gib", f"{vram:.2f}", "--json",
    ]  # fmt: skip
    if weights in ("fp8", "int8"):
        command += ["--dtype", weights]
    elif weights in ("awq", "gptq"):
        command += ["--dtype", "int4"]
    if inputs.kv_dtype == "fp8":
        command += ["--kv-dtype", "fp8"]
    data = _json(command)
    if "parts_gib" not in data:
        raise PeerFailed(str(data.get("error") or data)[:160])
    spent = sum(size for name, size in data["parts_gib"].items() if name != "KV cache")
    return Guess((data["memory_budget_gib"] - spent) * GiB, data.get("fits"))


def _json(command: list[str]) -> dict:
    result = subprocess.run(
        command,
        capture_output=True,
        text=True,
        timeout=120,
        env={"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin", "COLUMNS": "100000", "TERM": "dumb"},
    )
    try:
        return json.loads(result.stdout, strict=False)  # vramscout's notes may hold control characters
    except json.JSONDecodeError:
        message = (result.stderr or result.stdout).strip().splitlines()
        raise PeerFailed(message[-1][:160] if message else f"exit {result.returncode}") from None
