"""Models from the Hugging Face Hub, against a local server on 127.0.0.1 that stands in for the Hub (the Hub cannot
be reached from the test machines; tests/support/hub_server.py speaks its file API: /api/models/..., HEAD and GET
resolve/<rev>/<file> with X-Repo-Commit, ETag and Content-Length, HTTP range reads, the Hub's X-Error-Code errors).

kvops runs as users run it, in its own process, with HF_ENDPOINT pointing at the stand-in, its own HF_HOME (the
Hugging Face cache) and XDG_CACHE_HOME (kvops's cache of the headers it read)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from kvops.units import format_bytes
from tests.support.hub_server import Hub, Repo, hub_server
from tests.support.processes import checkout_env
from tests.support.safetensors_files import safetensors_bytes, tensor_bytes, write_sharded
from tests.unit.model.test_checkpoint import FP8, MXFP4

pytest.importorskip("huggingface_hub")

LLAMA = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 64,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "num_hidden_layers": 1,
    "intermediate_size": 256,
    "vocab_size": 1000,
    "max_position_embeddings": 4096,
    "torch_dtype": "bfloat16",
}
GPT_OSS = dict(
    LLAMA,
    architectures=["GptOssForCausalLM"],
    model_type="gpt_oss",
    num_hidden_layers=2,
    head_dim=16,
    num_local_experts=4,
    num_experts_per_tok=2,
    intermediate_size=64,
    sliding_window=128,
    layer_types=["sliding_attention", "full_attention"],
    quantization_config={"quant_method": "mxfp4"},
)
FP8_CONFIG = dict(LLAMA, quantization_config={"quant_method": "fp8", "weight_block_size": [128, 128]})


def repo_files(config: dict, shards: list[dict], folder: Path) -> dict[str, bytes]:
    files = {"config.json": json.dumps(config).encode()}
    if len(shards) == 1:
        return files | {"model.safetensors": safetensors_bytes(shards[0])}
    return files | write_sharded(folder, shards)


def stored(shards: list[dict]) -> dict[str, int]:
    totals: dict[str, int] = {}
    for shard in shards:
        for dtype, shape in shard.values():
            totals[dtype] = totals.get(dtype, 0) + tensor_bytes(dtype, shape)
    return totals


EMBEDDINGS = [{"model.embed_tokens.weight": ("BF16", (1000, 64))}]
# vLLM's rotary cos/sin cache, counted with the weights (it is in 'Model loading took'): 4096 positions x head dim 16 x 2 B
ROTARY = 4096 * 16 * 2


@pytest.fixture
def hub(tmp_path):
    stand_in = Hub(
        {
            "acme/tiny-llama": Repo(repo_files(LLAMA, EMBEDDINGS, tmp_path / "llama")),
            "acme/tiny-oss": Repo(repo_files(GPT_OSS, MXFP4, tmp_path / "oss")),
            "acme/tiny-fp8": Repo(repo_files(FP8_CONFIG, FP8, tmp_path / "fp8"), branches=("main", "v1")),
            "acme/gated": Repo(repo_files(LLAMA, EMBEDDINGS, tmp_path / "gated"), gated=True),
        }
    )
    with hub_server(stand_in) as server:
        stand_in.endpoint = f"http://127.0.0.1:{server.server_port}"
        yield stand_in


@pytest.fixture
def run(hub, tmp_path):
    """kvops in its own process, with the stand-in as HF_ENDPOINT and fresh caches."""

    def kvops(*args: str, **env: str) -> subprocess.CompletedProcess:
        environment = checkout_env(
            HF_ENDPOINT=hub.endpoint,
            HF_HOME=str(tmp_path / "hf"),
            XDG_CACHE_HOME=str(tmp_path / "xdg"),
            HF_HUB_DISABLE_TELEMETRY="1",
            **env,
        )
        environment.pop("HF_TOKEN", None)
        environment.pop("HF_HUB_OFFLINE", None)
        environment |= env
        return subprocess.run(
            [sys.executable, "-m", "kvops", *args], capture_output=True, text=True, env=environment, timeout=120
        )

    return kvops


def weights_term(plan: dict) -> dict:
    return next(term for term in plan["memory"]["terms"] if term["name"] == "weights")


def plan_of(run, model: str, **env: str) -> dict:
    ran = run("plan", "-m", model, "--gpu", "h100", "--json", **env)
    assert ran.returncode == 0, ran.stderr
    return json.loads(ran.stdout)


def test_a_public_config_plans_with_the_checkpoint_bytes(run, hub):
    plan = plan_of(run, "acme/tiny-llama")
    assert plan["model"] == "acme/tiny-llama"
    assert weights_term(plan)["bytes"] == 1000 * 64 * 2 + ROTARY
    asked = [(method, path) for method, path, _, _ in hub.requests]
    assert ("GET", "/api/models/acme/tiny-llama") in asked
    assert any(path.endswith("/config.json") for _, path in asked)
    # huggingface_hub asks HEAD first: the stand-in's X-Repo-Commit, ETag and Content-Length name what is cached
    assert any(method == "HEAD" and path.endswith("/resolve/main/config.json") for method, path in asked)
    assert not any(path.endswith(".safetensors") and not ranged for _, path, ranged, _ in hub.requests), (
        "weights were downloaded"
    )


@pytest.mark.parametrize("repo, shards", [("acme/tiny-oss", MXFP4), ("acme/tiny-fp8", FP8)], ids=["mxfp4", "fp8"])
def test_range_read_headers_give_the_checkpoints_bytes_per_dtype(run, hub, repo, shards):
    plan = plan_of(run, f"hf://{repo}")
    weights = weights_term(plan)
    assert weights["bytes"] == sum(stored(shards).values()) + ROTARY and "rotary cos/sin cache" in weights["formula"]
    for dtype, size in stored(shards).items():
        assert f"{dtype} {format_bytes(size)}" in weights["formula"]
    # what was read of each safetensors file: its first bytes, never the whole file
    reads = [(path, ranged) for method, path, ranged, _ in hub.requests if path.endswith(".safetensors")]
    assert len(reads) == len(shards) and all(ranged and ranged.startswith("bytes=0-") for _, ranged in reads)


def test_the_sharded_index_is_read_and_every_shard_header(run, hub):
    plan_of(run, "acme/tiny-oss")
    paths = [path for _, path, _, _ in hub.requests]
    assert any(path.endswith("/model.safetensors.index.json") for path in paths)
    assert {path.rsplit("/", 1)[1] for path in paths if path.endswith(".safetensors")} == {
        "model-00001-of-00002.safetensors",
        "model-00002-of-00002.safetensors",
    }


def test_mxfp4_weights_per_gpu_are_the_stored_bytes(run):
    plan = plan_of(run, "acme/tiny-oss")
    assert weights_term(plan)["bytes"] == sum(stored(MXFP4).values()) + ROTARY


def test_a_revision_is_read_and_emitted(run, hub):
    plan = plan_of(run, "acme/tiny-fp8@v1")
    assert plan["flags"]["revision"] == "v1"
    assert ("GET", "/api/models/acme/tiny-fp8/revision/v1") in [(m, p) for m, p, _, _ in hub.requests]
    missing = run("plan", "-m", "acme/tiny-fp8@v9", "--gpu", "h100")
    assert missing.returncode == 1 and len(missing.stderr.strip().splitlines()) == 1
    assert "revision 'v9' not found in acme/tiny-fp8" in missing.stderr


def test_a_gated_repo_is_one_line_and_opens_with_a_token(run, hub):
    refused = run("plan", "-m", "acme/gated", "--gpu", "h100")
    assert refused.returncode == 1 and len(refused.stderr.strip().splitlines()) == 1
    assert "acme/gated is gated on the Hub" in refused.stderr and "HF_TOKEN" in refused.stderr
    plan = plan_of(run, "acme/gated", HF_TOKEN=hub.token)
    assert weights_term(plan)["bytes"] == 1000 * 64 * 2 + ROTARY
    assert any(authorized for _, path, _, authorized in hub.requests if path.endswith("config.json"))


def test_a_missing_repo_is_one_line(run):
    ran = run("plan", "-m", "acme/no-such-model", "--gpu", "h100")
    assert ran.returncode == 1 and len(ran.stderr.strip().splitlines()) == 1
    assert "'acme/no-such-model' not found on the Hub" in ran.stderr and "local folder" in ran.stderr


def test_offline_plans_come_from_the_caches(run, hub):
    online = plan_of(run, "acme/tiny-oss")
    hub.requests.clear()
    offline = plan_of(run, "acme/tiny-oss", HF_HUB_OFFLINE="1")
    assert hub.requests == []  # nothing asked of the Hub
    assert weights_term(offline)["bytes"] == weights_term(online)["bytes"]
    never = run("plan", "-m", "acme/tiny-fp8", "--gpu", "h100", HF_HUB_OFFLINE="1")
    assert never.returncode == 1 and len(never.stderr.strip().splitlines()) == 1
    assert "HF_HUB_OFFLINE=1" in never.stderr


def test_a_second_plan_reads_the_headers_from_kvops_cache(run, hub):
    plan_of(run, "acme/tiny-oss")
    hub.requests.clear()
    plan_of(run, "acme/tiny-oss")
    assert not any(path.endswith(".safetensors") for _, path, _, _ in hub.requests)
