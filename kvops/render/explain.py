"""`kvops explain` as text: the memory split with its sources, KV now, the level and the one next action."""

from __future__ import annotations

from kvops.engines.common import paging_note
from kvops.explain import TERM_LABELS, Diagnosis, Explanation, Figure, KvNow
from kvops.units import format_bytes

ROW_NAMES = {
    "total": "device total",
    "used": "used",
    "before_engine": "held before startup",
    "requested": "budget",
    "weights": "weights",
    "weights+non_torch": "weights + non-torch",
    "non_torch": "non-torch",
    "activation": "activation peak",
    "cuda_graphs": "CUDA graphs",
    "kv_cache": "KV cache",
    "overhead": "  overhead (sum)",
    "weights+overhead": "  weights + overhead",
    "engine": "engine total",
    "outside_engine": "not the engine's",
    "free": "free",
}
HEADLINES = {
    "other_processes": "memory other processes hold",
    "unknown": "out of memory (the log does not show in which phase)",
}
BASIS_NAMES = {
    "reported": "engine",
    "derived": "engine (derived)",
    "nvidia-smi": "nvidia-smi",
    "input": "input",
    "computed": "plan (computed)",
    "estimate": "plan ESTIMATE",
    "measured": "profile",
    "exact": "exact",
    "missing": "-",
    "n/a": "n/a",
}


def explanation_text(result: Explanation) -> str:
    where = "CPU (host memory)" if result.device == "cpu" else "GPU"
    head = f"vLLM{' ' + result.version if result.version else ''} on {where}: {result.state}"
    lines = [head, f"  from {', '.join(result.sources)}", ""]
    if result.diagnosis:
        lines += _diagnosis_lines(result.diagnosis) + [""]
    lines += _memory_lines(result)
    if result.kv:
        lines += [""] + _kv_lines(result.kv)
    lines += [""] + _level_lines(result)
    if result.notes:
        lines += ["", "notes"] + [f"  {note}" for note in result.notes]
    return "\n".join(lines)


def _diagnosis_lines(diagnosis: Diagnosis) -> list[str]:
    headline = HEADLINES.get(diagnosis.term) or f"the {TERM_LABELS.get(diagnosis.term, diagnosis.term)} ran out"
    return [
        f"FAILED: {headline}",
        f"  {diagnosis.summary}",
        f"  {diagnosis.basis}",
        f"  log: {_short(diagnosis.line, 220)}",
    ]


def _memory_lines(result: Explanation) -> list[str]:
    total = result.figure("total")
    title = "memory per GPU" if result.device == "gpu" else "memory (CPU build: host memory)"
    lines = [title]
    rows = [
        (
            ROW_NAMES.get(item.name, item.name),
            _bytes(item),
            _share(item, total),
            BASIS_NAMES.get(item.basis, item.basis),
            item.source,
        )
        for item in result.figures
    ]
    widths = [max(len(row[column]) for row in rows) for column in range(4)]
    for name, amount, share, basis, source in rows:
        lines.append(
            f"  {name:<{widths[0]}}  {amount:>{widths[1]}}  {share:>{widths[2]}}  {basis:<{widths[3]}}  {_short(source)}".rstrip()
        )
    return lines


def _bytes(item: Figure) -> str:
    return "-" if item.bytes is None else format_bytes(item.bytes)


def _share(item: Figure, total: Figure | None) -> str:
    if item.bytes is None or total is None or not total.bytes or item.name == "total":
        return ""
    return f"{item.bytes / total.bytes:.1%}"


def _short(text: str, width: int = 150) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 3] + "..."


def _kv_lines(kv: KvNow) -> list[str]:
    in_use = f", {format_bytes(kv.in_use_bytes)}" if kv.in_use_bytes is not None else ""
    pool = f" ({format_bytes(kv.pool_bytes)})" if kv.pool_bytes is not None else ""
    return [
        "KV cache now",
        f"  in use     {kv.used_blocks} of {kv.usable_blocks} usable blocks of {kv.block_size} tokens{pool}: {kv.usage:.1%}{in_use}, {kv.in_use_tokens:,} token slots",
        f"  headroom   {kv.free_blocks} blocks = {kv.headroom_tokens:,} tokens" + _requests(kv),
        f"  requests   {_count(kv.running)} running, {_count(kv.waiting)} waiting, {_count(kv.preemptions_total)} preemptions so far",
        f"  read from  {kv.source}; block size {kv.bytes_per_block_source}",
        f"  paging     {_paging(kv)}",
    ]


def _paging(kv) -> str:
    pool = kv.num_blocks * kv.bytes_per_block if kv.bytes_per_block is not None else None
    return paging_note(kv.num_blocks, kv.block_size, pool, kv.groups)


def _requests(kv) -> str:
    if kv.request_blocks is None:
        return f" (request size {kv.request_source})"
    size = f"{kv.request_tokens:,} tokens" if kv.request_tokens else "the planned size"
    return (
        f" = {kv.headroom_requests} more request(s) of {size} ({kv.request_blocks} blocks each, {kv.request_source}); "
        f"{kv.headroom_requests_to_warn} before the warn level ({kv.warn_level:.0%}, {kv.warn_headroom_blocks} blocks)"
    )


def _count(value) -> str:
    return "?" if value is None else f"{value:,}"


def _level_lines(result: Explanation) -> list[str]:
    lines = []
    if result.level is not None:
        effects = result.limits.effects() if result.limits else []
        lines.append(
            f"level      {result.level.label}: " + (f"new requests {' and '.join(effects)}" if effects else "no limits")
        )
    action = result.action
    if action.change:
        lines.append(f"next       {action.change}  ({action.source})")
        lines.append(f"           {action.result}" + (f" ({action.warning})" if action.warning else ""))
    else:
        lines.append(
            f"next       {action.result}" + (f" ({action.source})" if action.source not in ("none", "policy") else "")
        )
    if action.problem:
        lines.append(f"           the run as it is: {action.problem}")
    return lines
