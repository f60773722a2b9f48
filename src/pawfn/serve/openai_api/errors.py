"""Errors on the OpenAI-compatible routes, in OpenAI's error object: `{"error": {"message", "type", "param", "code"}}`
with OpenAI's status codes and types, whatever part of the server refused the request."""

from __future__ import annotations

from pydantic import BaseModel

from ..errors import ApiError

__all__ = ["OPENAI_ROUTES", "OpenAIError", "OpenAIErrorResponse", "openai_error", "speaks_openai"]

OPENAI_ROUTES = ("/v1/chat/completions", "/v1/completions", "/v1/models")
"""The routes whose errors take OpenAI's shape (and `/v1/models/{model}`)."""

_OPENAI_CODES = {
    "program_not_found": "model_not_found",
    "context_overflow": "context_length_exceeded",
    "unauthorized": "invalid_api_key",
    "queue_full": "rate_limit_exceeded",
    "client_queue_full": "rate_limit_exceeded",
}
"""pawfn's codes that OpenAI's API names otherwise; the others keep pawfn's name."""


class OpenAIError(BaseModel):
    """OpenAI's error object."""

    message: str
    type: str
    param: str | None = None
    code: str | None = None


class OpenAIErrorResponse(BaseModel):
    """The body of every error the OpenAI-compatible routes answer."""

    error: OpenAIError


def speaks_openai(path: str) -> bool:
    """Whether a request to `path` is answered in OpenAI's shapes."""
    return path in OPENAI_ROUTES or path.startswith("/v1/models/")


def openai_error(error: ApiError) -> tuple[int, OpenAIErrorResponse]:
    """The status and body `error` becomes on an OpenAI-compatible route: an invalid request (pawfn's 413 for an input
    or 422) is OpenAI's 400 `invalid_request_error`, a full queue 429 `requests`, a server-side failure `server_error`."""
    status = 400 if error.status in (413, 415, 422) and error.code != "body_too_large" else error.status
    if status == 429:
        kind = "requests"
    elif status >= 500:
        kind = "server_error"
    else:
        kind = "invalid_request_error"
    code = _OPENAI_CODES.get(error.code, error.code)
    return status, OpenAIErrorResponse(error=OpenAIError(message=error.message, type=kind, param=error.param, code=code))
