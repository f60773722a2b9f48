"""The HTTP API as a FastAPI app over any `ProgramService`: `pawfn serve` runs it on uvicorn with `LocalPrograms`,
the Ray Serve ingress with its deployment handles. Needs the `serve` extra (fastapi, uvicorn, prometheus-client).

Routes: `POST /api/v1/infer` (the official hosted shape) and `GET /api/v1/programs/resolve/{ref}`;
`GET /v1/programs`, `GET /v1/programs/{ref}`, `POST /v1/programs/{ref}/run`, `/run_batch`, `/stream` (server-sent
events), `/tokenize`; `GET /healthz`, `GET /metrics`; the OpenAPI schema at `/openapi.json`.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack, aclosing, asynccontextmanager, nullcontext
from importlib import metadata

from fastapi import APIRouter, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException

from ..core.errors import PawError
from ..core.options import RuntimeOptions
from ..calls.log import with_request_id
from ..calls.memo import bypassing_result_cache
from ..core.tracing import end_span, phase_span, request_span
from ..calls.runtime import CallInput
from ..core.protocol import (
    ErrorBody,
    Health,
    InferRequest,
    InferResponse,
    ServedProgram,
    ServedPrograms,
    ResolveResponse,
    RunBatchRequest,
    RunBatchResponse,
    RunRequest,
    RunResponse,
    StreamPiece,
    TokenizeRequest,
    TokenizeResponse,
)
from .errors import ApiError, api_error, internal_error
from .flow import Drain, Serving, answered, close_in_time, drain_after, next_unless_drained, unless_disconnected, windows
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
    counted, checked, check_input, capped = serving.counted, serving.checked, serving.check_input, serving.capped

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

    def error_body(request: Request, error: ApiError) -> ErrorBody:
        """What the client reads of `error`; its detail, if any, goes to the log under the request id."""
        request_id = getattr(request.state, "request_id", None)
        if error.detail is not None:
            logger.error(
                "request %s (%s %s) answered %d %s: %s", request_id, request.method, request.url.path[:200], error.status, error.code, error.detail
            )
        return ErrorBody(error=error.code, message=error.message, request_id=request_id)

    def decoded(body: RunRequest | TokenizeRequest) -> tuple[CallInput, RuntimeOptions]:
        """The call's input, its images decoded once (one that does not decode: 422), and `checked` options."""
        with answered():
            call = body.call
        return call, serving.checked(call, body.options)

    api = APIRouter()  # every route here needs the key: `_Gate` checks it

    @api.post("/api/v1/infer", response_model=InferResponse, tags=["official"])
    async def infer(body: InferRequest, request: Request) -> InferResponse:
        """The official hosted inference: `program_id` is a program id or slug."""
        started = time.perf_counter()
        options = checked(body.input, RuntimeOptions(max_tokens=body.max_tokens, temperature=body.temperature or 0.0))
        with admission.hold(1, client_of(request)), answered():
            result = await unless_disconnected(request, service.run(body.program_id, body.input, options), drain)
        counted(result, started)
        latency_ms = (time.perf_counter() - started) * 1e3
        return InferResponse(output=result.generation.text, tokens_generated=len(result.generation.token_ids), latency_ms=latency_ms)

    @api.get("/api/v1/programs/resolve/{reference:path}", response_model=ResolveResponse, tags=["official"])
    async def resolve(reference: str) -> ResolveResponse:
        """The program id a slug names, as the official SDK asks before remote inference."""
        with answered():
            info = await service.info(reference)
        return ResolveResponse(program_id=info.program_id or info.name)

    @api.get("/v1/programs", response_model=ServedPrograms, tags=["programs"])
    async def programs() -> ServedPrograms:
        """Every program served now."""
        return ServedPrograms(programs=await service.programs())

    @api.post("/v1/programs/{reference:path}/load", response_model=ServedProgram, tags=["programs"])
    async def load(reference: str, request: Request) -> ServedProgram:
        """Load a hub program now (the server's `--allow-load`), kept until unloaded: the budget never replaces it.
        Needs the admin key."""
        with answered():
            return await unless_disconnected(request, service.load_program(reference), drain)

    @api.post("/v1/programs/{reference:path}/unload", response_model=ServedProgram, tags=["programs"])
    async def unload(reference: str) -> ServedProgram:
        """Unload a program loaded on a request or by `load` (409 while it runs calls, or for one named at start); its
        next request loads it again where the server allows. Needs the admin key."""
        with answered():
            return await service.unload_program(reference)

    @api.post("/v1/programs/{reference:path}/run", response_model=RunResponse, tags=["programs"])
    async def run(reference: str, body: RunRequest, request: Request) -> RunResponse:
        """One call with pawfn's `RuntimeOptions`; the `Generation` carries text, token ids and timings. A client that
        disconnects cancels its call."""
        call, options = decoded(body)
        started = time.perf_counter()
        with admission.hold(1, client_of(request)), answered():
            result = await unless_disconnected(request, service.run(reference, call, options), drain)
        return counted(result, started)

    @api.post("/v1/programs/{reference:path}/run_batch", response_model=RunBatchResponse, tags=["programs"])
    async def run_batch(reference: str, body: RunBatchRequest, request: Request) -> RunBatchResponse:
        """Inputs decoded together (each with the tokens it gets alone), at most the per-client share at a time;
        results in input order. A client that disconnects cancels its calls."""
        if len(body.inputs) > settings.max_batch_inputs:
            raise ApiError(
                413, "batch_too_large", f"the batch has {len(body.inputs)} inputs; this server takes at most {settings.max_batch_inputs} a request"
            )
        for text in body.inputs:
            check_input(text)
        options = capped(body.options)
        metrics.batch_inputs.observe(len(body.inputs))
        window = max(1, min(len(body.inputs), settings.max_queue_per_client))

        async def windowed() -> RunBatchResponse:
            """The inputs `window` at a time (an empty batch still names its program: one empty part)."""
            parts = [await service.run_batch(reference, part, options) for part in windows(body.inputs, window) or [[]]]
            return RunBatchResponse(program=parts[0].program, generations=[generation for part in parts for generation in part.generations])

        started = time.perf_counter()
        with admission.hold(window, client_of(request)), answered():
            result = await unless_disconnected(request, windowed(), drain)
        for generation in result.generations:
            counted(RunResponse(program=result.program, generation=generation), started)
        return result

    @api.post("/v1/programs/{reference:path}/stream", tags=["programs"], response_class=StreamingResponse)
    async def stream(reference: str, body: RunRequest, request: Request) -> StreamingResponse:
        """Server-sent events: `token` events (`StreamPiece`, text as generated), then one `done` (`RunResponse`,
        stripped text) or `error` (`ErrorBody`). Closing the connection cancels the call."""
        call, options = decoded(body)
        started = time.perf_counter()
        held = AsyncExitStack()  # the queue slot and the call, until the last event is sent (or the client leaves)
        held.enter_context(admission.hold(1, client_of(request)))
        items = await held.enter_async_context(aclosing(service.stream(reference, call, options)))
        try:
            with answered():  # errors before the first piece (unknown program, overflow) keep their status
                first = await next_unless_drained(items, drain)  # a prompt still evaluating when the grace is up: 503
            first_at = time.perf_counter()
        except BaseException:
            await held.aclose()
            raise

        async def events() -> AsyncIterator[str]:
            async with held:
                try:
                    with phase_span("pawfn.stream", current=False):
                        item: StreamPiece | RunResponse | None = first
                        while item is not None:
                            if isinstance(item, RunResponse):
                                counted(item, started, first_at)
                                yield f"event: done\ndata: {item.model_dump_json()}\n\n"
                                break
                            yield f"event: token\ndata: {item.model_dump_json()}\n\n"
                            item = await next_unless_drained(items, drain)
                except (PawError, ApiError) as exc:
                    body = error_body(request, exc if isinstance(exc, ApiError) else api_error(exc))
                    yield f"event: error\ndata: {body.model_dump_json()}\n\n"

        return StreamingResponse(events(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})

    @api.post("/v1/programs/{reference:path}/tokenize", response_model=TokenizeResponse, tags=["programs"])
    async def tokenize(reference: str, body: TokenizeRequest, request: Request) -> TokenizeResponse:
        """Token ids of input + the template's suffix, as a call evaluates them after the cached prefix."""
        call, _ = decoded(body)
        with answered():
            ids = await unless_disconnected(request, service.tokenize(reference, call, body.options), drain)
        return TokenizeResponse(token_ids=ids)

    @api.get("/v1/programs/{reference:path}", response_model=ServedProgram, tags=["programs"])
    async def info(reference: str) -> ServedProgram:
        """One program's facts (interpreter, context, prefix): what a `Remote` client checks before its first call."""
        with answered():
            return await service.info(reference)

    @api.get("/metrics", tags=["server"], response_class=Response)
    async def prometheus() -> Response:
        """Prometheus metrics: requests, latency, tokens, batch sizes, queue length."""
        content, media_type = metrics.render()
        return Response(content, media_type=media_type)

    @app.get("/healthz", response_model=Health, tags=["server"])
    async def healthz() -> Health:
        """Liveness, open without the key."""
        return Health(status="ok", programs=service.served_count(), queued=admission.queued)

    app.include_router(api)
    app.include_router(openai_router(serving))

    def error_response(request: Request, error: ApiError) -> JSONResponse:
        body = error_body(request, error)
        headers = error.headers if body.request_id is None else {**error.headers, "x-request-id": body.request_id}  # `observe` misses a crash
        if speaks_openai(request.url.path):
            status, shaped = openai_error(error)
            return JSONResponse(shaped.model_dump(), status_code=status, headers=headers)
        return JSONResponse(body.model_dump(), status_code=error.status, headers=headers)

    async def on_api_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, ApiError)
        return error_response(request, exc)

    async def on_unexpected(request: Request, exc: Exception) -> Response:
        """Any other exception: a generic 500 with the request id; the traceback goes to the log (Starlette logs it
        after this answer)."""
        return error_response(request, internal_error(exc))

    async def on_invalid(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, RequestValidationError)
        content_type = request.headers.get("content-type", "")
        media_type = content_type.split(";", 1)[0].strip().lower()
        if content_type and media_type != "application/json" and not media_type.endswith("+json"):
            return error_response(
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
        return error_response(request, ApiError(422, "invalid_request", f"invalid request body: {problems}", param=places[0] if places else None))

    async def on_http(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        cause = exc.__cause__
        if exc.status_code == 400 and isinstance(cause, UnicodeDecodeError):  # FastAPI's "error parsing the body"
            byte = cause.object[cause.start : cause.start + 1].hex()
            message = f"the request body is not UTF-8 (byte 0x{byte} at offset {cause.start}); send the JSON encoded as UTF-8"
            return error_response(request, ApiError(422, "invalid_encoding", message))
        code = {400: "invalid_request", 404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
        return error_response(request, ApiError(exc.status_code, code, str(exc.detail), dict(exc.headers or {})))

    app.add_exception_handler(ApiError, on_api_error)
    app.add_exception_handler(RequestValidationError, on_invalid)
    app.add_exception_handler(HTTPException, on_http)
    app.add_exception_handler(Exception, on_unexpected)
    app.add_middleware(Gate, settings=settings)  # inside `observe`: its refusals are counted and carry the request id

    @app.middleware("http")
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

    return app


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
