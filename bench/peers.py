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
import subprocess
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from kvops.model import catalog

if TYPE_CHECKING:
    from accuracy import Row

GiB = 1 << 30
PEERS = ("vllm-wizard", "vramscout")
WEIGHT_FLAGS = {"fp8": "fp8", "awq": "awq", "gptq": "gptq", "int8": "int8"}


def peer_report(rows: list[Row], venv: Path) -> str:
    planned = [row for row in rows if row.planned and row.entry.engine == "vllm" and row.logged.kv_bytes]
    lines = [
        "peers on the same launches (KV memory the engine leaves for the cache; MAPE against the logged KV)",
        "",
        "| entry | logged KV | kvops | vllm-wizard 0.2.0 | vramscout 0.7.0 |",
        "|---|---|---|---|---|",
    ]
    errors: dict[str, dict[str, float]] = {"kvops": {}, **{peer: {} for peer in PEERS}}
    failures: dict[str, list[str]] = {peer: [] for peer in PEERS}
    with tempfile.TemporaryDirectory() as scratch:
        for row in planned:
            config = _config_dir(row, Path(scratch))
            logged = row.logged.kv_bytes
            cells = [row.entry.id, f"{logged / GiB:.2f}", _cell(row, row.predicted["kv_bytes"], errors["kvops"])]
            for peer in PEERS:
                try:
                    guess = _run(peer, venv, row, config)
                except PeerFailed as exc:
                    failures[peer].append(f"{row.entry.id}: {exc}")
                    cells.append("failed")
                    continue
                cells.append(_cell(row, guess, errors[peer]))
            lines.append("| " + " | ".join(cells) + " |")
    common = set.intersection(*(set(found) for found in errors.values()))
    lines += [
        "",
        f"| planner | KV MAPE (launches it ran) | KV MAPE on the {len(common)} launches all three ran |",
        "|---|---|---|",
    ]
    for name, found in errors.items():
        lines.append(
            f"| {name} | {_mape(list(found.values()))} ({len(found)} of {len(planned)}) | {_mape([found[key] for key in common])} |"
        )
    for peer, failed in failures.items():
        lines += ["", f"{peer} could not run:", *(f"- {item}" for item in failed)] if failed else []
    return "\n".join(lines)


class PeerFailed(Exception):
    pass


def _cell(row: Row, guess: float | None, errors: dict[str, float]) -> str:
    if guess is None:
        return "-"
    logged = row.logged.kv_bytes
    error = (guess - logged) / logged
    errors[row.entry.id] = abs(error)
    return f"{guess / GiB:.2f} ({error:+.1%})"


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


def _run(peer: str, venv: Path, row: Row, config: Path) -> float:
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
        return (report["vram_target_alloc_gb"] - report["weights_gb"] - report["overhead_gb"]) * GiB
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
    return (data["memory_budget_gib"] - spent) * GiB


def _json(command: list[str]) -> dict:
    result = subprocess.run(
        command,
        capture_output=True,
        text=True,
        timeout=120,
        env={"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin", "COLUMNS": "100000", "TERM": "dumb"},
    )
    try:
        return json.loads(result.stdout)
    except json.JSONDecodeError:
        message = (result.stderr or result.stdout).strip().splitlines()
        raise PeerFailed(message[-1][:160] if message else f"exit {result.returncode}") from None
