"""Every route the installed vLLM mounts is either guarded (kvops.engines.vllm.api.ROUTES) or named here as not
generating tokens, so a release that adds a generation route fails this test until the guard knows it (0.34 added
/v1/decisions). Run on 0.32 in the suite and on 0.33 and 0.34 by .ci/newer_vllm. The routes are read from the
routers' source (`@router.post("/path")`, `app.add_api_route("/path", ...)`): mounting them needs an engine."""

from __future__ import annotations

import re
from http import HTTPStatus
from pathlib import Path

import pytest

from kvops.engines.vllm.api import ROUTES, AnthropicErrors

pytestmark = pytest.mark.vllm

NOT_GENERATION = {
    # pooling models: embeddings, scores, classes (no tokens generated)
    "/pooling", "/classify", "/score", "/v1/score", "/rerank", "/v1/rerank", "/v2/rerank", "/v1/embeddings", "/v2/embed",
    # text in or out only: tokenizing, rendering a prompt, counting its tokens
    "/tokenize", "/detokenize", "/v1/messages/count_tokens", "/v1/chat/completions/render",
    "/v1/chat/completions/derender", "/v1/completions/render", "/v1/completions/derender", "/v1/messages/render",
    "/v1/responses/render", "/cohere/v2/chat/render",
    # operating the engine: caches, sleep, weights, LoRA, profiling, scaling, aborts, checkpoints, fault tolerance
    "/abort_requests", "/inference/v1/abort_requests", "/v1/responses/{response_id}/cancel", "/pause", "/resume",
    "/ping", "/sleep", "/wake_up", "/reset_prefix_cache", "/reset_mm_cache", "/reset_encoder_cache",
    "/release_kv_cache_memory", "/collective_rpc", "/start_profile", "/stop_profile", "/is_scaling_elastic_ep",
    "/scale_elastic_ep", "/v1/load_lora_adapter", "/v1/unload_lora_adapter", "/init_weight_transfer_engine",
    "/start_weight_update", "/start_draft_weight_update", "/finish_weight_update", "/update_weights",
    "/update_weight_version", "/shutdown_weight_transfer_engine", "/weight_checker", "/checkpoint/prepare",
    "/checkpoint/restore", "/fault_tolerance/apply", "/v1/fault_tolerance/apply",
}  # fmt: skip
# Generation that Python middleware does not see as HTTP: realtime audio over a websocket (docs/kv-guard.md).
UNGUARDED = {"/v1/realtime"}

DECLARED = re.compile(r"(?:@\w+\.(?:post|api_route|websocket)|\.add_api_route)\(\s*\"(/[^\"]*)\"")


def mounted_routes() -> set[str]:
    vllm = pytest.importorskip("vllm")
    entrypoints = Path(vllm.__file__).parent / "entrypoints"
    return {path for source in entrypoints.rglob("*.py") for path in DECLARED.findall(source.read_text())}


def test_every_route_the_installed_vllm_mounts_is_guarded_or_generates_nothing():
    guarded = {route.path for route in ROUTES.routes}
    mounted = mounted_routes()
    assert {"/v1/completions", "/v1/chat/completions", "/v1/messages"} <= mounted  # the reading finds routes
    assert mounted - guarded - NOT_GENERATION - UNGUARDED == set()


# every status the admission proxy or the middleware answers itself
ANSWERED = [400, 401, 403, 404, 408, 413, 415, 429, 500, 501, 502, 503, 504]


@pytest.mark.parametrize("status", ANSWERED)
def test_anthropic_refusals_carry_the_type_the_installed_vllm_gives_the_status(status):
    """vLLM 0.33 and 0.34 answer /v1/messages in Anthropic's types (503 overloaded_error, not 0.32's
    ServiceUnavailableError: vllm/entrypoints/anthropic/protocol.py translate_error_type), on which Anthropic's
    SDKs dispatch. A release that drops or renames the table fails here; 0.32 passed vLLM's own type through."""
    vllm = pytest.importorskip("vllm")
    if tuple(int(part) for part in vllm.__version__.split(".")[:2]) < (0, 33):
        pytest.skip(f"vLLM {vllm.__version__} passes vLLM's own error type to Anthropic clients")
    from vllm.entrypoints.anthropic.protocol import translate_error_type

    body = AnthropicErrors().body(HTTPStatus(status), "KV cache pressure is critical")
    assert body["error"]["type"] == translate_error_type(status)
