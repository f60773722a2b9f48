"""The HTTP API as a FastAPI app over any `ProgramService`: `pawfn serve` runs it on uvicorn with `LocalPrograms`,
the Ray Serve ingress with its deployment handles. Needs the `serve` extra (fastapi, uvicorn, prometheus-client).

Routes, a router each area (`serve.routes`, `serve.openai_api`): the official SDK's (`POST /api/v1/infer`, `GET
/api/v1/programs/resolve/{ref}`), pawfn's programs API (`/v1/programs...`), the server's (`GET /healthz`, `GET
/metrics`) and the OpenAI-compatible ones (`/v1/chat/completions`, `/v1/completions`, `/v1/models`); the OpenAPI
schema at `/openapi.json`. Here: the app that holds them, its error answers and the middleware every request
passes (request id, trace, metrics, access line).
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager, nullcontext
from importlib import metadata

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException

from ..calls.log import with_request_id
from ..calls.memo import bypassing_result_cache
from ..core.tracing import end_span, request_span
from .errors import ApiError, api_error, internal_error
from .flow import Drain, Serving, close_in_time, drain_after, error_body
from .routes import official_router, programs_router, server_router
from .gate import Admission, Gate, client_of
from .openai_api.errors import openai_error, speaks_openai
from .openai_api.routes import openai_router
from .metrics import ServerMetrics
from .service import ProgramService
from .settings import ServeSettings

logger = logging.getLogger("pawfn.serve")
access_logger = logging.getLogger("pawfn.serve.access")
"""One line per request with its request id (`pawfn serve` turns uvicorn's own access line off)."""

__all__ = ["ApiError", "api_error", "create_app", "drain_after"]


def create_app(service: ProgramService, settings: ServeSettings | None = None) -> FastAPI:
    """The API over `service`, with `settings`' limits and key; the service is closed when the app shuts down."""
    settings = settings or ServeSettings()
    admission = Admission(settings.max_queue, settings.max_queue_per_client)
    drain = Drain()
    metrics = ServerMetrics(lambda: admission.queued, service.counters)
    serving = Serving(service, settings, admission, drain, metrics)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncGenerator[None, None]:
        yield
        await close_in_time(service, drain)  # uvicorn has finished the requests it accepted by now

    app = FastAPI(
        title="pawfn",
        version=metadata.version("pawfn"),
        lifespan=lifespan,
        description="ProgramAsWeights programs over HTTP: the official hosted inference shape and pawfn's typed API.",
    )
    app.state.drain = drain

    for router in (official_router(serving), programs_router(serving), server_router(serving), openai_router(serving)):
        app.include_router(router)

    _answer_errors(app)
    app.add_middleware(Gate, settings=settings)  # inside `observe`: its refusals are counted and carry the request id
    app.middleware("http")(_observer(metrics))
    return app


def _error_response(request: Request, error: ApiError) -> JSONResponse:
    body = error_body(request, error)
    headers = error.headers if body.request_id is None else {**error.headers, "x-request-id": body.request_id}  # `observe` misses a crash
    if speaks_openai(request.url.path):
        status, shaped = openai_error(error)
        return JSONResponse(shaped.model_dump(), status_code=status, headers=headers)
    return JSONResponse(body.model_dump(), status_code=error.status, headers=headers)


async def _on_api_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, ApiError)
    return _error_response(request, exc)


async def _on_unexpected(request: Request, exc: Exception) -> Response:
    """Any other exception: a generic 500 with the request id; the traceback goes to the log (Starlette logs it
    after this answer)."""
    return _error_response(request, internal_error(exc))


async def _on_invalid(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, RequestValidationError)
    content_type = request.headers.get("content-type", "")
    media_type = content_type.split(";", 1)[0].strip().lower()
    if content_type and media_type != "application/json" and not media_type.endswith("+json"):
        return _error_response(
            request,
            ApiError(  # FastAPI reads such a body as no body at all
                415,
                "unsupported_media_type",
                f"the request body must be JSON sent with Content-Type: application/json (Content-Type "
                f"{content_type!r} was sent; with curl add -H 'Content-Type: application/json')",
            ),
        )
    places = [".".join(str(part) for part in item["loc"] if part != "body") for item in exc.errors()]
    problems = "; ".join(  # an OptionError inside the body reads as it does from the API: no pydantic prefix
        f"{place}: {str(item['msg']).removeprefix('Value error, ')}" for place, item in zip(places, exc.errors(), strict=True)
    )
    return _error_response(request, ApiError(422, "invalid_request", f"invalid request body: {problems}", param=places[0] if places else None))


async def _on_http(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    cause = exc.__cause__
    if exc.status_code == 400 and isinstance(cause, UnicodeDecodeError):  # FastAPI's "error parsing the body"
        byte = cause.object[cause.start : cause.start + 1].hex()
        message = f"the request body is not UTF-8 (byte 0x{byte} at offset {cause.start}); send the JSON encoded as UTF-8"
        return _error_response(request, ApiError(422, "invalid_encoding", message))
    code = {400: "invalid_request", 404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
    return _error_response(request, ApiError(exc.status_code, code, str(exc.detail), dict(exc.headers or {})))


def _answer_errors(app: FastAPI) -> None:
    """Every error answered as an `ApiError` body (OpenAI's error object on its paths), with the request id."""
    app.add_exception_handler(ApiError, _on_api_error)
    app.add_exception_handler(RequestValidationError, _on_invalid)
    app.add_exception_handler(HTTPException, _on_http)
    app.add_exception_handler(Exception, _on_unexpected)


def _observer(metrics: ServerMetrics) -> Callable[[Request, Callable[[Request], Awaitable[Response]]], Awaitable[Response]]:
    """The middleware every request passes: its request id, span, metrics and access line."""

    async def observe(request: Request, call_next: Callable[[Request], Awaitable[Response]]) -> Response:
        request.state.request_id = request.headers.get("x-request-id") or uuid.uuid4().hex
        started = time.perf_counter()
        about = {"http.request.method": request.method, "url.path": request.url.path[:200], "pawfn.request_id": str(request.state.request_id)[:128]}
        with (
            with_request_id(request.state.request_id),
            bypassing_result_cache() if _no_cache(request) else nullcontext(),
            request_span(request.headers, f"pawfn.request {request.method}", about) as span,
        ):
            response = await call_next(request)  # each call this request starts is logged with its id, traced as a child
        response.headers["x-request-id"] = request.state.request_id
        route = getattr(request.scope.get("route"), "path", "unmatched")

        def finished() -> None:
            """Count the request once its body has gone out (a stream's last event, or its client gone)."""
            elapsed_s = time.perf_counter() - started
            end_span(span, {"http.route": route, "http.response.status_code": response.status_code})
            metrics.requests.labels(route, str(response.status_code)).inc()
            metrics.latency.labels(route).observe(elapsed_s)
            # the access line carries the id an error body gives, so the two can be matched (uvicorn's own line cannot)
            access_logger.info(
                "%s %s %r %d %.1f ms request %r",  # %r: a path or id a client chose cannot write a line of its own
                client_of(request),
                request.method,
                request.url.path[:200],
                response.status_code,
                elapsed_s * 1e3,
                str(request.state.request_id)[:128],
            )

        body: AsyncIterator[object] | None = getattr(response, "body_iterator", None)
        if body is None:
            finished()
        else:  # call_next's response streams its body: time it to the end, not to the headers
            setattr(response, "body_iterator", _then(body, finished))  # noqa: B010 - starlette's attribute, not on Response's type
        return response

    return observe


def _no_cache(request: Request) -> bool:
    """Whether the request asks for fresh answers (`Cache-Control: no-cache` or `no-store`): its calls skip the result cache."""
    directives = {part.strip().lower() for part in request.headers.get("cache-control", "").split(",")}
    return bool(directives & {"no-cache", "no-store"})


async def _then(body: AsyncIterator[object], finished: Callable[[], None]) -> AsyncIterator[object]:
    """`body`'s chunks, then `finished()`, however the body ends (to its end, an error, or its client gone)."""
    try:
        async for chunk in body:
            yield chunk
    finally:
        finished()
