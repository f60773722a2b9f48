"""pawfn's programs API: `GET /v1/programs`, `GET /v1/programs/{ref}`, `POST /v1/programs/{ref}/run`, `/run_batch`,
`/stream` (server-sent events), `/tokenize`, and the operator's `/load` and `/unload`."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, aclosing

from fastapi import APIRouter, Request
from fastapi.responses import StreamingResponse

from ...core.errors import PawError
from ...core.protocol import (
    RunBatchRequest,
    RunBatchResponse,
    RunRequest,
    RunResponse,
    ServedProgram,
    ServedPrograms,
    StreamPiece,
    TokenizeRequest,
    TokenizeResponse,
)
from ...core.tracing import phase_span
from ..errors import ApiError, api_error
from ..flow import Serving, answered, error_body, next_unless_drained, unless_disconnected, windows
from ..gate import client_of

__all__ = ["programs_router"]


def programs_router(serving: Serving) -> APIRouter:
    """pawfn's programs API over `serving`."""
    router = APIRouter(tags=["programs"])
    _add_operator_routes(router, serving)
    _add_call_routes(router, serving)
    _add_stream_route(router, serving)
    _add_listing_routes(router, serving)  # last: `GET /v1/programs/{ref}` takes any path the others leave
    return router


def _add_operator_routes(router: APIRouter, serving: Serving) -> None:
    """`/load` and `/unload`: the operator's (the admin key)."""
    service, drain = serving.service, serving.drain

    @router.post("/v1/programs/{reference:path}/load", response_model=ServedProgram)
    async def load(reference: str, request: Request) -> ServedProgram:
        """Load a hub program now (the server's `--allow-load`), kept until unloaded: the budget never replaces it.
        Needs the admin key."""
        with answered():
            return await unless_disconnected(request, service.load_program(reference), drain)

    @router.post("/v1/programs/{reference:path}/unload", response_model=ServedProgram)
    async def unload(reference: str) -> ServedProgram:
        """Unload a program loaded on a request or by `load` (409 while it runs calls, or for one named at start); its
        next request loads it again where the server allows. Needs the admin key."""
        with answered():
            return await service.unload_program(reference)


def _add_call_routes(router: APIRouter, serving: Serving) -> None:
    """`/run`, `/run_batch` and `/tokenize`: calls answered whole."""
    service, drain = serving.service, serving.drain

    @router.post("/v1/programs/{reference:path}/run", response_model=RunResponse)
    async def run(reference: str, body: RunRequest, request: Request) -> RunResponse:
        """One call with pawfn's `RuntimeOptions`; the `Generation` carries text, token ids and timings. A client that
        disconnects cancels its call."""
        call, options = serving.decoded(body)
        started = time.perf_counter()
        with serving.admission.hold(1, client_of(request)), answered():
            result = await unless_disconnected(request, service.run(reference, call, options), drain)
        return serving.counted(result, started)

    @router.post("/v1/programs/{reference:path}/run_batch", response_model=RunBatchResponse)
    async def run_batch(reference: str, body: RunBatchRequest, request: Request) -> RunBatchResponse:
        """Inputs decoded together (each with the tokens it gets alone), at most the per-client share at a time;
        results in input order. A client that disconnects cancels its calls."""
        settings = serving.settings
        if len(body.inputs) > settings.max_batch_inputs:
            raise ApiError(
                413, "batch_too_large", f"the batch has {len(body.inputs)} inputs; this server takes at most {settings.max_batch_inputs} a request"
            )
        for text in body.inputs:
            serving.check_input(text)
        options = serving.capped(body.options)
        serving.metrics.batch_inputs.observe(len(body.inputs))
        window = max(1, min(len(body.inputs), settings.max_queue_per_client))

        async def windowed() -> RunBatchResponse:
            """The inputs `window` at a time (an empty batch still names its program: one empty part)."""
            parts = [await service.run_batch(reference, part, options) for part in windows(body.inputs, window) or [[]]]
            return RunBatchResponse(program=parts[0].program, generations=[generation for part in parts for generation in part.generations])

        started = time.perf_counter()
        with serving.admission.hold(window, client_of(request)), answered():
            result = await unless_disconnected(request, windowed(), drain)
        for generation in result.generations:
            serving.counted(RunResponse(program=result.program, generation=generation), started)
        return result

    @router.post("/v1/programs/{reference:path}/tokenize", response_model=TokenizeResponse)
    async def tokenize(reference: str, body: TokenizeRequest, request: Request) -> TokenizeResponse:
        """Token ids of input + the template's suffix, as a call evaluates them after the cached prefix."""
        call, _ = serving.decoded(body)
        with answered():
            ids = await unless_disconnected(request, service.tokenize(reference, call, body.options), drain)
        return TokenizeResponse(token_ids=ids)


def _add_stream_route(router: APIRouter, serving: Serving) -> None:
    """`/stream`: a call's text as server-sent events."""
    service, drain = serving.service, serving.drain

    @router.post("/v1/programs/{reference:path}/stream", response_class=StreamingResponse)
    async def stream(reference: str, body: RunRequest, request: Request) -> StreamingResponse:
        """Server-sent events: `token` events (`StreamPiece`, text as generated), then one `done` (`RunResponse`,
        stripped text) or `error` (`ErrorBody`). Closing the connection cancels the call."""
        call, options = serving.decoded(body)
        started = time.perf_counter()
        held = AsyncExitStack()  # the queue slot and the call, until the last event is sent (or the client leaves)
        held.enter_context(serving.admission.hold(1, client_of(request)))
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
                                serving.counted(item, started, first_at)
                                yield f"event: done\ndata: {item.model_dump_json()}\n\n"
                                break
                            yield f"event: token\ndata: {item.model_dump_json()}\n\n"
                            item = await next_unless_drained(items, drain)
                except (PawError, ApiError) as exc:
                    body = error_body(request, exc if isinstance(exc, ApiError) else api_error(exc))
                    yield f"event: error\ndata: {body.model_dump_json()}\n\n"

        return StreamingResponse(events(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})


def _add_listing_routes(router: APIRouter, serving: Serving) -> None:
    """`GET /v1/programs` and `GET /v1/programs/{ref}`: what is served."""
    service = serving.service

    @router.get("/v1/programs", response_model=ServedPrograms)
    async def programs() -> ServedPrograms:
        """Every program served now."""
        return ServedPrograms(programs=await service.programs())

    @router.get("/v1/programs/{reference:path}", response_model=ServedProgram)
    async def info(reference: str) -> ServedProgram:
        """One program's facts (interpreter, context, prefix): what a `Remote` client checks before its first call."""
        with answered():
            return await service.info(reference)
