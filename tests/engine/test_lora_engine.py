"""`kvops plan --enable-lora` against the LoRA slots the real engine allocates (vLLM 0.32.0 CPU build): the plan's
argv, built into an engine by vLLM's own parser in a subprocess (tests/support/lora_tensors.py), holds exactly the
bytes the plan adds to its weights term, on five layouts: embed_tokens and lm_head with slots of their own (Llama),
the same with tied embeddings, none (Qwen2, which lists no embedding modules), and two mixtures of experts (Mixtral;
Qwen3-MoE with a dense layer), whose router and every expert get slots."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.support.planned_server import plan_json
from tests.support.processes import checkout_env
from tests.support.tiny_model import TINY_LLAMA, build_model

pytestmark = pytest.mark.vllm

SHAPES = {
    "llama": TINY_LLAMA,
    "llama-tied": dict(TINY_LLAMA, tie_word_embeddings=True),
    "qwen2": dict(TINY_LLAMA, architectures=["Qwen2ForCausalLM"], model_type="qwen2"),
    "mixtral": dict(
        TINY_LLAMA,
        architectures=["MixtralForCausalLM"],
        model_type="mixtral",
        num_local_experts=4,
        num_experts_per_tok=2,
    ),
    "qwen3-moe": dict(  # layer 1 dense (mlp_only_layers): its MLP's slots, not the experts'
        TINY_LLAMA,
        architectures=["Qwen3MoeForCausalLM"],
        model_type="qwen3_moe",
        num_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=128,
        decoder_sparse_step=1,
        mlp_only_layers=[1],
        norm_topk_prob=True,
    ),
}
PINNED = ("--kv-cache-memory-bytes", "4194304", "--max-model-len", "1024")
LORA = ("--enable-lora", "--max-loras", "3", "--max-lora-rank", "8")


def weights(plan: dict) -> int:
    return next(term["bytes"] for term in plan["memory"]["terms"] if term["name"] == "weights")


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_planned_lora_slots_are_the_bytes_vllm_allocates(shape, tmp_path, run_kvops):
    model = str(build_model(tmp_path / shape, SHAPES[shape]))
    plain = plan_json(run_kvops, "--model", model, *PINNED)
    served = plan_json(run_kvops, "--model", model, *PINNED, *LORA)
    argv = served["command"]["argv"]
    assert argv[:3] == ["vllm", "serve", model] and all(flag in argv for flag in LORA)
    ran = subprocess.run(
        [sys.executable, "-m", "tests.support.lora_tensors", *argv[2:]],
        capture_output=True,
        text=True,
        timeout=900,
        env=checkout_env(),
    )
    assert ran.returncode == 0, ran.stderr[-3000:]
    engine = json.loads(ran.stdout.strip().splitlines()[-1])
    assert weights(served) - weights(plain) == engine["lora_bytes"] > 0
    assert ("logits_processor" in engine["layers"]) == (shape != "qwen2")
