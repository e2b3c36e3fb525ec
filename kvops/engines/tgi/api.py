"""TGI 3.3.7's generation routes, as the admission proxy guards them: where each body keeps its new-token limit, and
the error shape it answers in.

Read from huggingface/text-generation-inference at tag v3.3.7 (commit dfb3fbe7), `router/src/`:

- `server.rs` `base_routes`: POST `/` (`compat_generate`), `/generate`, `/generate_stream`, `/v1/chat/completions`,
  `/v1/completions`, `/vertex`, `/invocations`; builds with the `kserve` feature add
  `/v2/models/:model_name/versions/:model_version/infer`. (The `google` feature's `AIP_PREDICT_ROUTE` is a path
  read from the engine's environment: not known here, so not guarded.)
- `lib.rs` `GenerateParameters`: `max_new_tokens` (none given: up to `max_total_tokens`, `validation.rs`), `best_of`;
  `GenerateRequest` / `CompatGenerateRequest` keep them under `parameters`. `ChatRequest`: `max_tokens`, alias
  `max_completion_tokens`; its `n` is marked UNUSED. `CompletionRequest`: `max_tokens`.
- `vertex.rs` `VertexRequest`: `instances`, each a generate request (`inputs`, `parameters`) or a `ChatRequest`.
- `sagemaker.rs` `SagemakerRequest`: untagged, tried in order: `CompatGenerateRequest` (`inputs`), `ChatRequest`
  (`messages`), `CompletionRequest` (`prompt`).
- `kserve.rs` `InferenceRequest`: `parameters` (`GenerateParameters`).

Errors: `lib.rs` `ErrorResponse` `{"error", "error_type"}` (types from `infer/mod.rs` `error_type`: "overloaded",
"validation", "generation", ...). A stream that fails sends it as a `data:` event (`server.rs`
`impl From<InferError> for Event`); the OpenAI routes' streams send `{"error": {"message", "http_status_code"}}`
instead (`infer/mod.rs` `into_openai_event`).
"""

from __future__ import annotations

import json
from http import HTTPStatus
from typing import Any

from kvops.engines.api import Fields, Route, RouteTable, Variant

_TYPES = {
    HTTPStatus.SERVICE_UNAVAILABLE: "overloaded",
    HTTPStatus.TOO_MANY_REQUESTS: "overloaded",  # InferError::Overloaded: TGI's own 429 (impl From<InferError> for (StatusCode, Json<ErrorResponse>))
    HTTPStatus.BAD_GATEWAY: "generation",
    HTTPStatus.GATEWAY_TIMEOUT: "generation",
}


class TgiErrors:
    """TGI's ErrorResponse, and its stream event."""

    def body(self, status: HTTPStatus, message: str) -> dict[str, Any]:
        return {"error": message, "error_type": _TYPES.get(status, "validation")}

    def event(self, status: HTTPStatus, message: str) -> bytes:
        return f"data: {json.dumps(self.body(status, message))}\n\n".encode()


class TgiOpenAIErrors(TgiErrors):
    """TGI's OpenAI routes answer with ErrorResponse but end a failed stream with OpenaiErrorEvent."""

    def event(self, status: HTTPStatus, message: str) -> bytes:
        payload = {"error": {"message": message, "http_status_code": status.value}}
        return f"data: {json.dumps(payload)}\n\n".encode()


ERRORS = TgiErrors()
_OPENAI = TgiOpenAIErrors()

GENERATE = Fields(tokens=("max_new_tokens",), add="max_new_tokens", best_of="best_of", within="parameters")
CHAT = Fields(tokens=("max_tokens", "max_completion_tokens"), add="max_tokens")
COMPLETION = Fields(tokens=("max_tokens",), add="max_tokens")

ROUTES = RouteTable(
    (
        Route("/", ERRORS, (Variant(GENERATE),)),
        Route("/generate", ERRORS, (Variant(GENERATE),)),
        Route("/generate_stream", ERRORS, (Variant(GENERATE),)),
        Route("/v1/chat/completions", _OPENAI, (Variant(CHAT),)),
        Route("/v1/completions", _OPENAI, (Variant(COMPLETION),)),
        Route("/vertex", ERRORS, (Variant(GENERATE, when="inputs"), Variant(CHAT, when="messages")), each="instances"),
        Route(
            "/invocations",
            ERRORS,
            (Variant(GENERATE, when="inputs"), Variant(CHAT, when="messages"), Variant(COMPLETION, when="prompt")),
        ),
        Route("/v2/models/*/versions/*/infer", ERRORS, (Variant(GENERATE),)),
    )
)
