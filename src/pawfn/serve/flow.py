"""How a request's work runs, whatever route it came by (pawfn's own, the official SDK's, the OpenAI-compatible ones):
`Serving` (the service, the limits, the queue and the metrics one app shares), against the client's disconnect and the
server's drain deadline (`Drain`)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Generator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TypeVar

from fastapi import FastAPI, Request

from ..calls.runtime import CallInput
from ..core.errors import PawError
from ..core.options import RuntimeOptions
from ..core.protocol import ErrorBody, RunRequest, RunResponse, StreamPiece, TokenizeRequest
from .errors import ApiError, api_error, shutting_down
from .gate import Admission
from .metrics import ServerMetrics
from .service import ProgramService
from .settings import ServeSettings

logger = logging.getLogger("pawfn.serve")

__all__ = ["Drain", "Serving", "answered", "close_in_time", "drain_after", "error_body", "next_unless_drained", "unless_disconnected", "windows"]


@dataclass(frozen=True)
class Serving:
    """What every route of one app shares: the programs, the limits, the queue, the drain deadline and the metrics."""

    service: ProgramService
    settings: ServeSettings
    admission: Admission
    drain: Drain
    metrics: ServerMetrics

    def check_input(self, text: CallInput) -> None:
        """413 for an input longer than the server takes."""
        length = len(text) if isinstance(text, str) else sum(len(argument) for argument in text if isinstance(argument, str))
        if length > self.settings.max_input_chars:
            raise ApiError(413, "input_too_long", f"the input has {length} characters; this server takes at most {self.settings.max_input_chars}")

    def capped(self, options: RuntimeOptions) -> RuntimeOptions:
        """`options` with the server's max_tokens cap (422 past it)."""
        if options.max_tokens is None:
            return options.model_copy(update={"max_tokens": self.settings.max_tokens})
        if options.max_tokens > self.settings.max_tokens:
            raise ApiError(
                422,
                "max_tokens_too_large",
                f"max_tokens={options.max_tokens} is over this server's limit of {self.settings.max_tokens}; ask for fewer",
                param="max_tokens",
            )
        return options

    def checked(self, text: CallInput, options: RuntimeOptions) -> RuntimeOptions:
        """`options` with the server's max_tokens cap, after checking the input's length."""
        self.check_input(text)
        return self.capped(options)

    def decoded(self, body: RunRequest | TokenizeRequest) -> tuple[CallInput, RuntimeOptions]:
        """A request's input, its images decoded once (one that does not decode: 422), and its `checked` options."""
        with answered():
            call = body.call
        return call, self.checked(call, body.options)

    def counted(self, result: RunResponse, started: float, first_at: float | None = None) -> RunResponse:
        """`result`, counted in its program's metrics as a call that arrived at `started` (`time.perf_counter()`) and,
        on a stream, showed its first text at `first_at`."""
        now = time.perf_counter()
        self.metrics.call(result.program, result.generation, now - started, None if first_at is None else first_at - started)
        return result


def error_body(request: Request, error: ApiError) -> ErrorBody:
    """What the client reads of `error`; its detail, if any, goes to the log under the request id."""
    request_id = getattr(request.state, "request_id", None)
    if error.detail is not None:
        logger.error(
            "request %s (%s %s) answered %d %s: %s", request_id, request.method, request.url.path[:200], error.status, error.code, error.detail
        )
    return ErrorBody(error=error.code, message=error.message, request_id=request_id)


class Drain:
    """The server's drain deadline (`drain_after`): once it passes, the requests still running answer 503
    `shutting_down` and the streams end with that `error` event, before the server cancels what is left."""

    def __init__(self) -> None:
        self._passed: asyncio.Event | None = None
        self.close_by: float | None = None
        """The event loop's time by which closing the programs stops waiting for their cancelled calls (None: no limit)."""

    @property
    def passed(self) -> asyncio.Event:
        if self._passed is None:  # made in the server's event loop, on first use
            self._passed = asyncio.Event()
        return self._passed


def drain_after(app: FastAPI, seconds: float, *, close_within_s: float | None = None) -> None:
    """Start `app`'s drain deadline, `seconds` from now (call it in the server's event loop as it shuts down); the
    programs' close then waits at most until `close_within_s` from now for their cancelled calls' last step."""
    drain: Drain = app.state.drain
    loop = asyncio.get_running_loop()
    loop.call_later(seconds, drain.passed.set)
    if close_within_s is not None:
        drain.close_by = loop.time() + close_within_s


async def close_in_time(service: ProgramService, drain: Drain) -> None:
    """Close the programs; past the drain's close deadline, stop waiting for calls that were cancelled but are still in
    their last step (a prompt's evaluation takes up to a second): the process is about to exit, which frees them."""
    if drain.close_by is None:
        await service.aclose()
        return
    try:
        await asyncio.wait_for(service.aclose(), max(0.0, drain.close_by - asyncio.get_running_loop().time()))
    except TimeoutError:
        logger.info("exiting while cancelled calls end their last step (the graceful timeout is up)")


T = TypeVar("T")


async def unless_disconnected(request: Request, work: Awaitable[T], drain: Drain) -> T:
    """`work`'s result, or, where the client disconnects first, `work` cancelled (its calls then stop at their next
    token instead of decoding for nobody) and a 499 that nobody reads; where the drain deadline passes first, `work`
    cancelled and a 503 `shutting_down`."""
    task = asyncio.ensure_future(work)

    async def disconnected() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass

    watchers = {asyncio.ensure_future(disconnected()), asyncio.ensure_future(drain.passed.wait())}
    try:
        await asyncio.wait({task, *watchers}, return_when=asyncio.FIRST_COMPLETED)
    finally:  # this request's own cancellation (the server's last resort) takes them all with it
        for watcher in watchers:
            watcher.cancel()
        if not task.done():
            task.cancel()
    if task.done() and not task.cancelled():
        return task.result()
    if drain.passed.is_set():
        raise shutting_down()
    raise ApiError(499, "client_closed", "the client closed the connection; its calls were cancelled")


async def next_unless_drained(items: AsyncIterator[StreamPiece | RunResponse], drain: Drain) -> StreamPiece | RunResponse | None:
    """The stream's next item (None at its end), or, where the drain deadline passes first, the stream's call cancelled
    and a 503 `shutting_down` raised."""
    following = asyncio.ensure_future(anext(items, None))
    deadline = asyncio.ensure_future(drain.passed.wait())
    try:
        await asyncio.wait({following, deadline}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        deadline.cancel()
        if not following.done():
            following.cancel()
            await asyncio.wait({following})  # the generator's own cancellation ends before it is closed
    if following.done() and not following.cancelled():
        return following.result()
    raise shutting_down()


@contextmanager
def answered() -> Generator[None]:
    """pawfn errors raised inside become their error responses."""
    try:
        yield
    except PawError as exc:
        raise api_error(exc) from exc


def windows(texts: Sequence[str], size: int) -> list[Sequence[str]]:
    """`texts` in consecutive parts of at most `size`."""
    return [texts[start : start + size] for start in range(0, len(texts), size)]
