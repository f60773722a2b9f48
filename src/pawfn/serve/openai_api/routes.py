"""The OpenAI-compatible routes: `POST /v1/chat/completions`, `POST /v1/completions`, `GET /v1/models` and
`GET /v1/models/{model}`, over the same service, queue, budget, cancellation and request ids as pawfn's own routes.

A request's `model` names the program; every choice is one pawfn call, and its text is that call's `Generation.text`
(a stream's pieces add up to it: leading and trailing whitespace and a stop sequence are held back until the call has
said whether they stay)."""

from __future__ import annotations

import asyncio
import time
import uuid
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import AsyncExitStack, aclosing
from typing import TypeVar

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel

from ...calls.runtime import CallInput
from ...calls.stops import first_stop, unsure_tail
from ...core.errors import PawError
from ...core.options import RuntimeOptions
from ...core.protocol import RunResponse, StreamPiece
from ...core.tracing import phase_span
from ..errors import ApiError, api_error
from ..flow import Serving, answered, next_unless_drained, unless_disconnected
from ..gate import client_of
from .errors import openai_error
from .protocol import (
    AssistantMessage,
    ChatChoice,
    ChatChunkChoice,
    ChatCompletion,
    ChatCompletionChunk,
    ChatCompletionRequest,
    Completion,
    CompletionChoice,
    CompletionRequest,
    Delta,
    ModelCard,
    ModelList,
    PromptTokensDetails,
    Usage,
    finish_reason,
)

__all__ = ["IGNORED_MESSAGES_HEADER", "openai_router"]

IGNORED_MESSAGES_HEADER = "x-pawfn-ignored-messages"
"""On a chat completion: the roles of the messages left out of the program's input, in order (a program has its own
template, so a system message is not part of its input; only the last user message is)."""

T = TypeVar("T")
Plan = list[tuple[CallInput, RuntimeOptions]]
"""A request's calls, one per choice, in choice order."""


def openai_router(serving: Serving) -> APIRouter:
    """The OpenAI-compatible routes over `serving`."""
    router = APIRouter(tags=["openai"])
    _add_model_routes(router, serving)
    _add_completion_routes(router, serving)
    return router


def _add_model_routes(router: APIRouter, serving: Serving) -> None:
    """`GET /v1/models` and `GET /v1/models/{model}`: the programs served, as models."""
    started = int(time.time())

    def card(reference: str, program_id: str | None, name: str, interpreter: str, n_ctx: int) -> ModelCard:
        return ModelCard(id=reference, created=started, owned_by="pawfn", root=program_id or name, parent=interpreter, max_model_len=n_ctx)

    @router.get("/v1/models", response_model=ModelList)
    async def models() -> ModelList:
        """The programs served now, under every name a request may give them (`root`: the program id, `parent`: its
        interpreter), as vLLM lists LoRA modules."""
        cards = [
            card(reference, program.program_id, program.name, program.interpreter, program.n_ctx)
            for program in await serving.service.programs()
            for reference in program.references or [program.name]
        ]
        return ModelList(data=sorted(cards, key=lambda model: model.id))

    @router.get("/v1/models/{model:path}", response_model=ModelCard)
    async def model(model: str) -> ModelCard:
        """One program as a model (loading it first where the server loads on request)."""
        with answered():
            program = await serving.service.info(model)
        return card(model, program.program_id, program.name, program.interpreter, program.n_ctx)


def _add_completion_routes(router: APIRouter, serving: Serving) -> None:
    """`POST /v1/chat/completions` and `POST /v1/completions`: calls, whole or streamed."""

    @router.post("/v1/chat/completions", response_model=ChatCompletion)
    async def chat_completions(body: ChatCompletionRequest, request: Request) -> Response:
        """The last user message is the program's input; a stream sends `chat.completion.chunk`s, then `[DONE]`."""
        body.unsupported()
        call, left_out = body.call()
        headers = {IGNORED_MESSAGES_HEADER: ",".join(left_out)} if left_out else {}
        plan = _plan(serving, body.n, [call], body.options)
        if body.stream:
            return await _streamed(serving, request, body.model, plan, _ChatChunks(body.model, body.n, body.include_usage), headers)
        results = await _ran(serving, request, body.model, plan)
        completion = ChatCompletion(
            id=f"chatcmpl-{uuid.uuid4().hex}",
            created=int(time.time()),
            model=body.model,
            choices=[
                ChatChoice(
                    index=index, message=AssistantMessage(content=result.generation.text), finish_reason=finish_reason(result.generation.stop_reason)
                )
                for index, result in enumerate(results)
            ],
            usage=_usage(results, body.n),
            system_fingerprint=_fingerprint(results),
        )
        return JSONResponse(completion.model_dump(mode="json"), headers=headers)

    @router.post("/v1/completions", response_model=Completion)
    async def completions(body: CompletionRequest, request: Request) -> Response:
        """`prompt` is the program's input (a list: one input each, its choices `n` apart, as OpenAI numbers them)."""
        body.unsupported()
        plan = _plan(serving, body.n, body.inputs(), body.options)
        if body.stream:
            return await _streamed(serving, request, body.model, plan, _CompletionChunks(body.model, body.n, body.include_usage), {})
        results = await _ran(serving, request, body.model, plan)
        completion = Completion(
            id=f"cmpl-{uuid.uuid4().hex}",
            created=int(time.time()),
            model=body.model,
            choices=[
                CompletionChoice(index=index, text=result.generation.text, finish_reason=finish_reason(result.generation.stop_reason))
                for index, result in enumerate(results)
            ],
            usage=_usage(results, body.n),
            system_fingerprint=_fingerprint(results),
        )
        return JSONResponse(completion.model_dump(mode="json"))


def _plan(serving: Serving, n: int, inputs: Sequence[CallInput], options_of: Callable[[int], RuntimeOptions]) -> Plan:
    """One call per choice (`n` per input, in OpenAI's order), each input's length checked and each call's options
    capped by the server's limits; 400 for more choices than one client may run at once."""
    count = n * len(inputs)
    if count == 0:
        raise ApiError(400, "invalid_request", "prompt is an empty list; give at least one input", param="prompt")
    if count > serving.settings.max_queue_per_client:
        raise ApiError(
            400,
            "too_many_choices",
            f"the request asks for {count} choices; this server runs at most {serving.settings.max_queue_per_client} calls of one client at once",
            param="n",
        )
    plan: Plan = []
    for call in inputs:
        serving.check_input(call)
        for choice in range(n):
            with answered():  # an option out of range (OptionError) is the request's fault
                options = options_of(choice)
            plan.append((call, serving.capped(options)))
    return plan


async def _all(works: Sequence[Awaitable[T]]) -> list[T]:
    """Every work's result in order; the first failure cancels the others."""
    tasks = [asyncio.ensure_future(work) for work in works]
    try:
        return list(await asyncio.gather(*tasks))
    finally:
        for task in tasks:
            task.cancel()


async def _ran(serving: Serving, request: Request, reference: str, plan: Plan) -> list[RunResponse]:
    """The plan's calls run together (the base's scheduler batches them), each counted in the metrics."""
    started = time.perf_counter()
    with serving.admission.hold(len(plan), client_of(request)), answered():
        works = [serving.service.run(reference, call, options) for call, options in plan]
        results = await unless_disconnected(request, _all(works), serving.drain)
    return [serving.counted(result, started) for result in results]


def _usage(results: Sequence[RunResponse], n: int) -> Usage:
    """Tokens of the request: each input's prompt once (its program's prefix as cached tokens), every choice's output."""
    prompts = [result.generation for result in results[::n]]
    prompt_tokens = sum(g.prefix_tokens + g.prompt_tokens for g in prompts)
    completion_tokens = sum(len(result.generation.token_ids) for result in results)
    return Usage(
        prompt_tokens=prompt_tokens,
        completion_tokens=completion_tokens,
        total_tokens=prompt_tokens + completion_tokens,
        prompt_tokens_details=PromptTokensDetails(cached_tokens=sum(g.prefix_tokens for g in prompts)),
    )


def _fingerprint(results: Sequence[RunResponse]) -> str | None:
    """The arithmetic that computed the calls (`pawfn-llamacpp`: llama.cpp's, the official runtime's tokens)."""
    numerics = results[0].generation.numerics if results else None
    return None if numerics is None else f"pawfn-{numerics}"


class _Shown:
    """One choice's text as a stream may show it: what the call's `Generation.text` will begin with for sure (leading
    and trailing whitespace, and a tail that may begin a stop sequence, wait for what follows)."""

    def __init__(self, stops: tuple[str, ...]) -> None:
        self._stops = stops
        self._raw = ""
        self.sent = ""

    def add(self, piece: str) -> str:
        """The text `piece` makes sure of ('' while it waits)."""
        self._raw += piece
        at = first_stop(self._raw, self._stops)
        sure = self._raw[: len(self._raw) - unsure_tail(self._raw, self._stops)] if at is None else self._raw[:at]
        return self._advance(sure.strip())

    def rest(self, text: str) -> str:
        """What is left to show of the call's final `text`."""
        return self._advance(text)

    def _advance(self, sure: str) -> str:
        if len(sure) <= len(self.sent) or not sure.startswith(self.sent):
            return ""
        piece, self.sent = sure[len(self.sent) :], sure
        return piece


class _Chunks(ABC):
    """How a stream's events read: a choice's opening, its new text, its end, the usage (one id for the stream)."""

    prefix = "cmpl"

    def __init__(self, model: str, n: int, include_usage: bool) -> None:
        self.id = f"{self.prefix}-{uuid.uuid4().hex}"
        self.created = int(time.time())
        self.model = model
        self.n = n
        self.include_usage = include_usage

    def opening(self, index: int) -> BaseModel | None:
        """The chunk that opens choice `index` (None: nothing before its text)."""
        return None

    @abstractmethod
    def text(self, index: int, text: str) -> BaseModel: ...

    @abstractmethod
    def finished(self, index: int, result: RunResponse) -> BaseModel: ...

    @abstractmethod
    def usage(self, usage: Usage) -> BaseModel: ...


class _ChatChunks(_Chunks):
    prefix = "chatcmpl"

    def _chunk(self, choices: list[ChatChunkChoice], usage: Usage | None = None) -> ChatCompletionChunk:
        return ChatCompletionChunk(id=self.id, created=self.created, model=self.model, choices=choices, usage=usage)

    def opening(self, index: int) -> BaseModel:
        return self._chunk([ChatChunkChoice(index=index, delta=Delta(role="assistant", content=""))])

    def text(self, index: int, text: str) -> BaseModel:
        return self._chunk([ChatChunkChoice(index=index, delta=Delta(content=text))])

    def finished(self, index: int, result: RunResponse) -> BaseModel:
        return self._chunk([ChatChunkChoice(index=index, delta=Delta(), finish_reason=finish_reason(result.generation.stop_reason))])

    def usage(self, usage: Usage) -> BaseModel:
        return self._chunk([], usage)


class _CompletionChunks(_Chunks):
    def _chunk(self, choices: list[CompletionChoice], usage: Usage | None = None) -> Completion:
        return Completion(id=self.id, created=self.created, model=self.model, choices=choices, usage=usage)

    def text(self, index: int, text: str) -> BaseModel:
        return self._chunk([CompletionChoice(index=index, text=text, finish_reason=None)])

    def finished(self, index: int, result: RunResponse) -> BaseModel:
        return self._chunk([CompletionChoice(index=index, text="", finish_reason=finish_reason(result.generation.stop_reason))])

    def usage(self, usage: Usage) -> BaseModel:
        return self._chunk([], usage)


def _event(chunk: BaseModel) -> str:
    return f"data: {chunk.model_dump_json()}\n\n"


Item = StreamPiece | RunResponse


async def _streamed(serving: Serving, request: Request, reference: str, plan: Plan, chunks: _Chunks, headers: dict[str, str]) -> StreamingResponse:
    """The plan's calls streamed together as OpenAI's chunks, then `data: [DONE]`; an error before any text keeps its
    status, one after it is a last `data: {"error": ...}` event. Closing the connection cancels every call."""
    started = time.perf_counter()
    held = AsyncExitStack()  # the queue slots and the calls, until the last event is sent (or the client leaves)
    held.enter_context(serving.admission.hold(len(plan), client_of(request)))
    try:
        streams = [await held.enter_async_context(aclosing(serving.service.stream(reference, call, options))) for call, options in plan]
        with answered():  # errors before the first piece (unknown program, overflow) keep their status
            firsts = await _all([next_unless_drained(stream, serving.drain) for stream in streams])
    except BaseException:
        await held.aclose()
        raise
    shown = [_Shown(options.stop) for _, options in plan]
    first_at: list[float | None] = [None] * len(plan)

    async def events() -> AsyncIterator[str]:
        async with held:
            results: list[RunResponse | None] = [None] * len(plan)
            try:
                with phase_span("pawfn.stream", current=False):
                    for index in range(len(plan)):
                        if (opening := chunks.opening(index)) is not None:
                            yield _event(opening)
                    async for index, item in _merged(streams, firsts, serving):
                        if isinstance(item, StreamPiece):
                            first_at[index] = first_at[index] or time.perf_counter()
                            if text := shown[index].add(item.text):
                                yield _event(chunks.text(index, text))
                            continue
                        results[index] = serving.counted(item, started, first_at[index])
                        if text := shown[index].rest(item.generation.text):
                            yield _event(chunks.text(index, text))
                        yield _event(chunks.finished(index, item))
                    if chunks.include_usage:
                        yield _event(chunks.usage(_usage([result for result in results if result is not None], chunks.n)))
                    yield "data: [DONE]\n\n"
            except (PawError, ApiError) as exc:
                _, body = openai_error(exc if isinstance(exc, ApiError) else api_error(exc))
                yield _event(body)

    return StreamingResponse(events(), media_type="text/event-stream", headers={**headers, "Cache-Control": "no-cache"})


async def _merged(streams: Sequence[AsyncIterator[Item]], firsts: Sequence[Item | None], serving: Serving) -> AsyncIterator[tuple[int, Item]]:
    """The streams' items as they come, each with its stream's index, beginning with `firsts`."""
    waiting: dict[asyncio.Future[Item | None], int] = {}

    def follow(index: int, item: Item | None) -> None:
        if item is not None and not isinstance(item, RunResponse):
            waiting[asyncio.ensure_future(next_unless_drained(streams[index], serving.drain))] = index

    try:
        for index, first in enumerate(firsts):
            if first is not None:
                yield index, first
            follow(index, first)
        while waiting:
            done, _ = await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
            for task in sorted(done, key=lambda finished: waiting[finished]):
                index = waiting.pop(task)
                item = task.result()
                if item is not None:
                    yield index, item
                follow(index, item)
    finally:
        for task in waiting:
            task.cancel()
        if waiting:
            await asyncio.wait(waiting)
