"""What a request passes before a route runs it: `Gate` (the key, from the headers, before any body is read; the
body, whole, within its size and time) and `Admission` (the queue's bounds, across requests and per client)."""

from __future__ import annotations

import asyncio
import hmac
import re
from collections.abc import Generator, Mapping
from contextlib import contextmanager

from fastapi import Request
from fastapi.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..core.protocol import ErrorBody
from .errors import ApiError
from .openai_api.errors import openai_error, speaks_openai
from .settings import ServeSettings

__all__ = ["Admission", "Gate", "client_of"]


_OPEN_PATHS = frozenset({"/healthz", "/docs", "/docs/oauth2-redirect", "/redoc", "/openapi.json"})
"""Routes anyone may call: liveness and the API's documentation."""
_OPERATOR_ROUTE = re.compile(r"^/v1/programs/.+/(?:load|unload)$")
"""POSTs that change what the server holds: the admin key's alone."""


def _presented_key(headers: Mapping[bytes, bytes]) -> bytes | None:
    """The key a request sends: `Authorization: Bearer KEY`, else `X-API-Key: KEY`."""
    scheme, _, token = headers.get(b"authorization", b"").partition(b" ")
    if scheme.lower() == b"bearer" and token:
        return token
    return headers.get(b"x-api-key")


def _matches(given: bytes | None, key: bytes | None) -> bool:
    return given is not None and key is not None and hmac.compare_digest(given, key)  # constant time


class Gate:
    """Pure ASGI, in front of the routes: the key checked from the headers before a byte of the body is read (the
    operator routes need the admin key), then the body read whole within the size and time limits and replayed to
    the app. Refusals close the connection, so nothing a client left unsent keeps it open."""

    def __init__(self, app: ASGIApp, settings: ServeSettings) -> None:
        self._app = app
        self._settings = settings
        self._key = None if settings.api_key is None else settings.api_key.get_secret_value().encode()
        self._admin_key = None if settings.admin_key is None else settings.admin_key.get_secret_value().encode()

    def _refusal(self, scope: Scope, headers: Mapping[bytes, bytes]) -> ApiError | None:
        path: str = scope["path"]
        if path in _OPEN_PATHS:
            return None
        given = _presented_key(headers)
        if scope["method"] == "POST" and _OPERATOR_ROUTE.match(path):
            if self._admin_key is None:
                return ApiError(
                    403,
                    "operator_routes_off",
                    "loading and unloading programs over HTTP is off on this server; its operator enables it with --admin-key-env NAME",
                )
            if not _matches(given, self._admin_key):
                return ApiError(
                    401,
                    "unauthorized",
                    "this route needs the server's admin key: send Authorization: Bearer ADMIN_KEY",
                    {"WWW-Authenticate": "Bearer"},
                )
            return None
        if self._key is None or _matches(given, self._key) or _matches(given, self._admin_key):
            return None
        return ApiError(
            401, "unauthorized", "missing or wrong API key: send Authorization: Bearer KEY (or X-API-Key: KEY)", {"WWW-Authenticate": "Bearer"}
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self._app(scope, receive, send)
            return
        headers = dict(scope["headers"])
        refusal = self._refusal(scope, headers)
        if refusal is not None:
            await _refuse(scope, send, refusal)
            return
        limit = self._settings.max_body_bytes
        too_large = ApiError(
            413,
            "body_too_large",
            f"the request body is over this server's limit of {limit} bytes; send less (split a batch) or raise --max-body-bytes",
        )
        declared = headers.get(b"content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > limit):
            await _refuse(scope, send, too_large)
            return
        messages: list[Message] = []
        size = 0
        timeout_s = self._settings.body_timeout_s
        try:
            async with asyncio.timeout(timeout_s):  # the whole body, however it is cut into pieces
                while size <= limit:
                    message = await receive()
                    messages.append(message)
                    size += len(message.get("body", b""))
                    if message["type"] != "http.request" or not message.get("more_body", False):
                        break
        except TimeoutError:
            await _refuse(
                scope, send, ApiError(408, "body_timeout", f"the request body did not arrive within {timeout_s:g} s; send it whole, at once")
            )
            return
        if size > limit:  # answered outside the body's deadline: the answer is never cut by it
            await _refuse(scope, send, too_large)
            return

        async def replay() -> Message:
            return messages.pop(0) if messages else await receive()

        await self._app(scope, replay, send)


async def _refuse(scope: Scope, send: Send, error: ApiError) -> None:
    """Answer `error` as JSON before the app sees the request, and close the connection after it."""
    request_id = scope.get("state", {}).get("request_id")  # set by the outer middleware
    headers = {**error.headers, "Connection": "close"}
    if speaks_openai(scope["path"]):
        status, shaped = openai_error(error)
        response = JSONResponse(shaped.model_dump(), status_code=status, headers=headers)
    else:
        body = ErrorBody(error=error.code, message=error.message, request_id=request_id)
        response = JSONResponse(body.model_dump(), status_code=error.status, headers=headers)

    async def no_body() -> Message:
        return {"type": "http.disconnect"}

    await response(scope, no_body, send)


class Admission:
    """The queue limits: calls accepted and not yet ended, across requests and per client (event-loop only, so no
    lock)."""

    def __init__(self, limit: int, per_client: int) -> None:
        self.limit = limit
        self.per_client = per_client
        self.queued = 0
        self._by_client: dict[str, int] = {}

    @contextmanager
    def hold(self, calls: int, client: str) -> Generator[None, None, None]:
        if self.queued + calls > self.limit:
            raise ApiError(
                429, "queue_full", f"the server holds {self.queued} calls and takes at most {self.limit}; retry after a moment", {"Retry-After": "1"}
            )
        held = self._by_client.get(client, 0)
        if held + calls > self.per_client:
            raise ApiError(
                429,
                "client_queue_full",
                f"this client holds {held} calls and may hold at most {self.per_client} at once; retry when some have ended",
                {"Retry-After": "1"},
            )
        self.queued += calls
        self._by_client[client] = held + calls
        try:
            yield
        finally:
            self.queued -= calls
            left = self._by_client[client] - calls
            if left:
                self._by_client[client] = left
            else:
                del self._by_client[client]


def client_of(request: Request) -> str:
    """Who a request counts against: its connection's address (a trusted proxy's `X-Forwarded-For` sets it first)."""
    return request.client.host if request.client is not None else "unknown"
