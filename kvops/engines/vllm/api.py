"""vLLM's generation routes (0.32's, and the one 0.34 added), as the admission proxy guards them: where each body
keeps its new-token limit and its parallel sequences, and the error shape each API answers in.

Read from the installed `vllm` package (paths below are under `vllm/entrypoints/`). `launchers/api_server/routers.py`
(`register_api_routers`) mounts the routers; with the "generate" task, `generate/api_router.py` adds chat, Responses,
completions, Anthropic messages, Cohere chat and generative scoring; SageMaker's `/invocations` and the structured
decisions route are mounted whatever the task; the token-in/token-out route with `--enable-scale-out` or
`--tokens-only` (`scale_out/factories.py`); the audio routes for speech-to-text models (`speech_to_text/`).

- `openai/completion/protocol.py` `CompletionRequest`: `max_tokens` (default 16; null reads as 16), `n`,
  `use_beam_search`, `min_tokens` (at most `max_tokens`, `vllm/sampling_params.py` `_verify_args`). `best_of` is
  OpenAI's field: vLLM 0.32 ignores it, the proxy still forces it to 1.
- `openai/chat_completion/protocol.py` `ChatCompletionRequest`: `max_completion_tokens`, the deprecated `max_tokens`
  (the former wins when both are set), `n`, `use_beam_search`, `min_tokens`; no default: up to the context.
  `BatchChatCompletionRequest` (`/v1/chat/completions/batch`): the same fields and `best_of`.
- `openai/responses/protocol.py` `ResponsesRequest`: `max_output_tokens`, no `n`.
- `anthropic/protocol.py` `AnthropicMessagesRequest`: `max_tokens` (required), `thinking.budget_tokens` below it.
- `cohere/api_router.py` (`/cohere/v2/chat`, with `VLLM_ENABLE_COHERE_API=1`), `cohere/protocol.py`: `max_tokens`.
- `serve/sagemaker/api_router.py` `/invocations`: a `ChatCompletionRequest` if it validates, else a
  `CompletionRequest` (`generate/factories.py`, in that order).
- `scale_out/token_in_token_out/protocol.py` `GenerateRequest` (`/inference/v1/generate`): `sampling_params`
  (`vllm/sampling_params.py` `SamplingParams`: `max_tokens`, `n`, `min_tokens`). Its dataclass default, 16, is not
  what runs: a `max_tokens` left out goes up to the context (`scale_out/token_in_token_out/serving.py`,
  `is_sampling_param_provided`), and a null one too (`vllm/v1/engine/input_processor.py`).
- `generate/structured_decisions/api_router.py` (`/v1/systemone`), `generate/generative_scoring/api_router.py`
  (`/generative_scoring`), and from 0.34 `openai/decisions/api_router.py` (`/v1/decisions`, `DecisionRequest`:
  questions answered by the model's probabilities): generation with no token field to cap; refused at critical.
- `speech_to_text/transcription/api_router.py`, `speech_to_text/translation/api_router.py`: multipart forms (their
  `max_completion_tokens` is a form field): refused at critical, otherwise passed through unread.

Errors: `serve/engine/protocol.py` `ErrorResponse` `{"error": {"message", "type", "param", "code"}}`; a stream that
fails sends it as a `data:` event, then `data: [DONE]` (`openai/completion/serving.py`). Anthropic's messages answer
`{"type": "error", "error": {"type", "message"}}` and stream `event: error` (`anthropic/api_router.py`,
`anthropic/serving.py`), the type in Anthropic's own vocabulary from 0.33 (`anthropic/protocol.py`,
`translate_error_type`: 503 `overloaded_error`, 429 `rate_limit_error`, ...; 0.32 passed vLLM's type through);
Cohere's `{"message"}` (`cohere/protocol.py` `CohereError`).
"""

from __future__ import annotations

import json
from http import HTTPStatus
from typing import Any

from kvops.engines.api import Fields, Route, RouteTable, Variant

# vLLM's error types (serve/engine/serving.py create_error_response) for the statuses the proxy answers itself
_TYPES = {
    HTTPStatus.BAD_REQUEST: "BadRequestError",
    HTTPStatus.REQUEST_TIMEOUT: "BadRequestError",
    HTTPStatus.REQUEST_ENTITY_TOO_LARGE: "BadRequestError",
    HTTPStatus.UNAUTHORIZED: "AuthenticationError",
    HTTPStatus.SERVICE_UNAVAILABLE: "ServiceUnavailableError",
    # vLLM's GracefulHTTPError (its own admission refusals) types an error by its status phrase
    HTTPStatus.TOO_MANY_REQUESTS: HTTPStatus.TOO_MANY_REQUESTS.phrase,
    HTTPStatus.BAD_GATEWAY: "InternalServerError",
    HTTPStatus.GATEWAY_TIMEOUT: "InternalServerError",
}


# Anthropic's error types by status, as vLLM 0.33+ answers its messages route (anthropic/protocol.py,
# translate_error_type): Anthropic's SDKs dispatch on them; a status not named is a server or a request error
_ANTHROPIC_TYPES = {
    HTTPStatus.BAD_REQUEST: "invalid_request_error",
    HTTPStatus.UNAUTHORIZED: "authentication_error",
    HTTPStatus.FORBIDDEN: "permission_error",
    HTTPStatus.NOT_FOUND: "not_found_error",
    HTTPStatus.REQUEST_ENTITY_TOO_LARGE: "request_too_large",
    HTTPStatus.TOO_MANY_REQUESTS: "rate_limit_error",
    HTTPStatus.SERVICE_UNAVAILABLE: "overloaded_error",
}


def _type(status: HTTPStatus) -> str:
    return _TYPES.get(status, "InternalServerError")


def anthropic_type(status: HTTPStatus) -> str:
    """The `error.type` vLLM's Anthropic messages route gives a status."""
    fallback = "api_error" if status >= HTTPStatus.INTERNAL_SERVER_ERROR else "invalid_request_error"
    return _ANTHROPIC_TYPES.get(status, fallback)


def _sse(payload: dict[str, Any], event: str | None = None) -> bytes:
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {json.dumps(payload)}\n\n".encode()


class OpenAIErrors:
    """vLLM's OpenAI-compatible ErrorResponse."""

    def body(self, status: HTTPStatus, message: str) -> dict[str, Any]:
        return {"error": {"message": message, "type": _type(status), "param": None, "code": status.value}}

    def event(self, status: HTTPStatus, message: str) -> bytes:
        return _sse(self.body(status, message)) + b"data: [DONE]\n\n"


class AnthropicErrors:
    """vLLM's Anthropic messages errors: Anthropic's envelope and types."""

    def body(self, status: HTTPStatus, message: str) -> dict[str, Any]:
        return {"type": "error", "error": {"type": anthropic_type(status), "message": message}}

    def event(self, status: HTTPStatus, message: str) -> bytes:
        return _sse(self.body(status, message), event="error")


class ResponsesErrors(OpenAIErrors):
    """The Responses API answers like the other OpenAI routes; its stream ends with OpenAI's `error` event."""

    def event(self, status: HTTPStatus, message: str) -> bytes:
        return _sse({"type": "error", "code": _type(status), "message": message, "param": None}, event="error")


class CohereErrors:
    """vLLM's Cohere v2 chat errors (`{message, id}`, id omitted)."""

    def body(self, status: HTTPStatus, message: str) -> dict[str, Any]:
        return {"message": message}

    def event(self, status: HTTPStatus, message: str) -> bytes:
        return _sse(self.body(status, message), event="error")


ERRORS = OpenAIErrors()
_ANTHROPIC, _RESPONSES, _COHERE = AnthropicErrors(), ResponsesErrors(), CohereErrors()

COMPLETION = Fields(
    tokens=("max_tokens",),
    add="max_tokens",
    default=16,
    n="n",
    best_of="best_of",
    beam_search="use_beam_search",
    below=(("min_tokens", 0),),
)
CHAT = Fields(
    tokens=("max_tokens", "max_completion_tokens"),
    add="max_completion_tokens",
    n="n",
    best_of="best_of",
    beam_search="use_beam_search",
    below=(("min_tokens", 0),),
)
RESPONSES = Fields(tokens=("max_output_tokens",), add="max_output_tokens")
MESSAGES = Fields(tokens=("max_tokens",), below=(("thinking.budget_tokens", 1),))
COHERE_CHAT = Fields(tokens=("max_tokens",), add="max_tokens")
TOKENS_IN_OUT = Fields(
    tokens=("max_tokens",), add="max_tokens", n="n", within="sampling_params", below=(("min_tokens", 0),)
)

ROUTES = RouteTable(
    (
        Route("/v1/completions", ERRORS, (Variant(COMPLETION),)),
        Route("/v1/chat/completions", ERRORS, (Variant(CHAT),)),
        Route("/v1/chat/completions/batch", ERRORS, (Variant(CHAT),)),
        Route("/v1/responses", _RESPONSES, (Variant(RESPONSES),)),
        Route("/v1/messages", _ANTHROPIC, (Variant(MESSAGES),)),
        Route("/cohere/v2/chat", _COHERE, (Variant(COHERE_CHAT),)),
        Route("/invocations", ERRORS, (Variant(CHAT, when="messages"), Variant(COMPLETION))),
        Route("/inference/v1/generate", ERRORS, (Variant(TOKENS_IN_OUT),)),
        Route("/v1/systemone", ERRORS),
        Route("/v1/decisions", ERRORS),
        Route("/generative_scoring", ERRORS),
        Route("/v1/audio/transcriptions", ERRORS, json=False),
        Route("/v1/audio/translations", ERRORS, json=False),
    )
)
