"""The plan counts requests as the KV guard admits them: `requests_under_warn` (and so --max-num-seqs) is the most
requests whose blocks, by the guard's own arithmetic (plugins/kvops_vllm/admission.py), stay under the warn level
with one of them still computing its prompt."""

from __future__ import annotations

import pytest

from kvops.dtypes import resolve_kv_dtype
from kvops.engines.vllm import layout
from kvops.gpus import find_gpu
from kvops.model import load_model
from kvops.plan import PlanInputs
from kvops.planner import plan
from kvops.workload import Workload

pytest.importorskip(
    "numpy", reason="numpy is not installed: the KV guard's admission needs it (pip install -e '.[test]')"
)
from kvops_vllm.admission import Course, GroupShape, future_peak, whole_blocks, window_blocks


def guard_shapes(result) -> list[GroupShape]:
    """The KV-cache groups as the guard reads them from vLLM's managers (scheduler._group_shape)."""
    inputs, capacity = result.inputs, result.capacity
    kv = layout.kv_layout(
        inputs.spec, resolve_kv_dtype(inputs.kv_dtype, inputs.spec.dtype), inputs.tp, capacity.block_size
    )
    shapes = []
    for group in kv.groups:
        if group.kind == "sliding":
            blocks = window_blocks(group.window, group.block_size, capacity.max_in_flight_tokens)
            decode = min(blocks, whole_blocks(group.window, group.block_size) + 1)
            shapes.append(GroupShape(group.block_size, blocks, group.window, decode))
        else:
            shapes.append(GroupShape(group.block_size))
    return shapes


@pytest.mark.parametrize(
    ("model", "context", "workload"),
    [
        ("llama-3-8b", 8192, None),  # one full-attention group
        ("mistral-7b-v0.1", 32768, None),  # one sliding-window group (4096): the 80 against 23
        ("mistral-7b-v0.1", 32768, Workload(2000, 500, source="flags")),  # inside the window
        ("gemma-2-9b", 8192, Workload(6000, 1000, source="flags")),  # sliding and full groups sharing the pool
    ],
)
def test_requests_under_warn_are_what_the_guard_admits_under_the_warn_level(model, context, workload):
    extra = {} if workload is None else {"workload": workload}
    inputs = PlanInputs("vllm", load_model(model), find_gpu("H100-80GB"), max_model_len=context, **extra)
    result = plan(inputs)
    capacity, shapes = result.capacity, guard_shapes(result)
    tokens = capacity.tokens_per_request
    budget = capacity.warn_level * capacity.usable_blocks

    def batch(count: int) -> list[Course]:
        """`count` requests of the workload's size: one admitted as its prompt is computed, the rest decoding."""
        return [Course(tokens, tokens, prefilling=True)] + [Course(tokens, tokens)] * (count - 1)

    admitted = capacity.requests_under_warn
    assert future_peak(batch(admitted), shapes) <= budget < future_peak(batch(admitted + 1), shapes)
    # vLLM's default, not a cap at the warn level (it cost goodput at saturation): the notes give the count
    assert result.flags["max-num-seqs"] > admitted
    assert any(f"{admitted} sequences stay under the warn level" in note for note in result.notes)
    assert capacity.blocks_per_request == future_peak([Course(tokens, tokens)], shapes)
    assert capacity.blocks_per_request_in_prefill == future_peak([Course(tokens, tokens, prefilling=True)], shapes)
