"""A plan's model as the step time reads it: the MoE layers counted by each family's rule."""

from __future__ import annotations

import pytest

from kvops.deployment import DeploymentOptions
from kvops.planner import plan
from kvops.simulate import cost


@pytest.mark.parametrize(
    ("model", "tp", "layers", "moe_layers"),
    [
        ("deepseek-v3", 8, 61, 58),  # first_k_dense_replace 3
        ("llama-4-maverick", 8, 48, 24),  # interleave_moe_layer_step 2
        ("qwen3-30b-a3b", 1, 48, 48),
        ("llama-3.1-8b-instruct", 1, 32, 0),
    ],
)
def test_moe_layers_follow_the_family_rule(model, tp, layers, moe_layers):
    options = DeploymentOptions(model=model, gpu="H200", tp=tp, max_model_len=4096)
    model_cost = cost.model_cost(plan(options.plan_inputs()))
    assert (model_cost.layers, model_cost.moe_layers) == (layers, moe_layers)
