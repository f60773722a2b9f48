"""`Caller`: the one implementation of a call on a program, whatever holds it (`PawFn`, `TypedFn`, `Positional`): the
arguments and options checked once (kinds, count, images, the program open), then the call submitted, waited for,
awaited or followed as it is generated."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from concurrent.futures import Future
from pathlib import Path

from ..core.config import EngineSettings
from ..core.errors import ConfigError, ProgramClosedError
from ..core.grammar import OutputFormat
from ..core.images import Image
from ..core.models import InterpreterModel
from ..core.options import RuntimeOptions
from ..core.results import Generation
from ..formats.bundle import ProgramMeta
from ..core.templates import ArityError
from ..core.tracing import CallTrace, tracing_calls
from .pending import PendingGeneration, StreamSink, TextIterator, TextStream, checked_input, checked_inputs, checked_options
from .pending import gather_in_order, results_in_order
from .log import CallLog, CallSite, call_log_for, request_id
from .memo import ResultCache, result_cache_for
from .prompt import Argument, CallInput
from .runtime import ProgramRuntime

__all__ = ["Caller", "program_caller"]


class Caller:
    """Calls on `runtime`, a program of interpreter `model` (whether it reads image arguments)."""

    def __init__(
        self,
        runtime: ProgramRuntime,
        model: type[InterpreterModel],
        log: CallLog | None = None,
        site: CallSite | None = None,
        memo: tuple[ResultCache, str] | None = None,
        name: str = "program",
        program_id: str | None = None,
    ) -> None:
        """`log`: where each call is recorded, as a call of `site` (both or neither); `memo`: the result cache that
        answers deterministic calls, with the program's identity in its keys (None: every call is computed); `name`,
        `program_id`: the program in its calls' traces."""
        self.runtime = runtime
        self._name, self._program_id = name, program_id
        self._model = model
        self._typed = False
        self._format: OutputFormat | None = None
        self._log = None if site is None else log
        self._site = site
        self._memo = memo

    def returning(self, response_format: OutputFormat | None) -> Caller:
        """These calls with their output constrained to `response_format` (a typed program's; None: free text),
        replacing any format the options give."""
        typed = Caller(self.runtime, self._model, self._log, self._site, self._memo, self._name, self._program_id)
        typed._typed, typed._format = True, response_format
        return typed

    def _submitted(self, arguments: CallInput, options: RuntimeOptions, sink: StreamSink | None = None) -> PendingGeneration:
        """The call started on the runtime, or answered from the result cache (a stream then gets its tokens at once)."""
        trace = CallTrace.start(self._name, self._program_id, request_id())
        key = None if self._memo is None else ResultCache.key(self._memo[1], arguments, options)
        hit = None if key is None or self._memo is None else self._memo[0].get(key)
        if hit is not None:
            return _traced(_answered(hit, sink), trace, cache_hit=True)
        pending = self.runtime.submit(arguments, options) if sink is None else self.runtime.submit_streaming(arguments, options, sink)
        return _traced(pending if self._memo is None else _remembering(self._memo[0], key, pending), trace)

    def _logged(self, pending: PendingGeneration, given: CallInput, options: RuntimeOptions) -> PendingGeneration:
        """`pending`, recorded in the call log when it ends (a cancelled call is not)."""
        log, site = self._log, self._site
        if log is None or site is None:
            return pending
        request = request_id()

        def record(done: Future[Generation]) -> None:
            if not done.cancelled():
                failure = done.exception()
                log.record(site, given, options, None if failure is not None else done.result(), failure, request)

        pending.add_done_callback(record)
        return pending

    def arguments(self, given: str | tuple[object, ...]) -> CallInput:
        """One input, or a numbered template's arguments, checked against the program: kinds, count (`ArityError`),
        images only for an interpreter that reads them; a closed program says so whatever the arguments."""
        if isinstance(given, tuple):
            arguments: list[Argument] = []
            for index, argument in enumerate(given):
                if not isinstance(argument, (str, Image)):
                    raise TypeError(f"argument {index} ({{INPUT_{index}}}) must be str or pawfn.Image, not {type(argument).__name__}")
                if isinstance(argument, Image) and self._model.image_tokens is None:
                    raise ConfigError(f"argument {index} is an image, but {self._model.__name__} takes no images (Qwen3_5_0_8B does)")
                arguments.append(argument)
            checked: CallInput = tuple(arguments)
        else:
            checked = checked_input(given)
        count = len(checked) if isinstance(checked, tuple) else 1
        if count != self.runtime.arity:
            raise ArityError(self.runtime.arity, count)
        if self.runtime.closed:
            raise ProgramClosedError()
        return checked

    def options(self, options: RuntimeOptions | None) -> RuntimeOptions:
        """`options` checked (None: the defaults), with this caller's output format."""
        checked = checked_options(options)
        return checked.model_copy(update={"response_format": self._format}) if self._typed else checked

    def submit(self, given: str | tuple[object, ...], options: RuntimeOptions | None) -> PendingGeneration:
        """Start a call and return its future at once."""
        arguments, checked = self.arguments(given), self.options(options)
        return self._logged(self._submitted(arguments, checked), arguments, checked)

    def generate(self, given: str | tuple[object, ...], options: RuntimeOptions | None) -> Generation:
        """Run a call and wait for its `Generation`."""
        if not isinstance(given, str) or self._memo is not None or tracing_calls():
            return results_in_order([self.submit(given, options)])[0]
        arguments, checked = self.arguments(given), self.options(options)
        if self._log is None or self._site is None:
            return self.runtime.generate(arguments, checked)
        try:
            generation = self.runtime.generate(arguments, checked)
        except Exception as exc:
            self._log.record(self._site, arguments, checked, None, exc, request_id())
            raise
        self._log.record(self._site, arguments, checked, generation, None, request_id())
        return generation

    async def agenerate(self, given: str | tuple[object, ...], options: RuntimeOptions | None) -> Generation:
        """`generate` without blocking the event loop; cancelling the task stops the call at its next token."""
        return await asyncio.wrap_future(self.submit(given, options))

    def stream(self, given: str | tuple[object, ...], options: RuntimeOptions | None) -> TextStream:
        """Start a call and follow its text (call it on the event loop that reads the stream)."""
        arguments, checked = self.arguments(given), self.options(options)
        stream = TextStream(self.runtime.decode_tokens)
        stream.follow(self._logged(self._submitted(arguments, checked, stream), arguments, checked))
        return stream

    def iterate(self, given: str | tuple[object, ...], options: RuntimeOptions | None) -> TextIterator:
        """Start a call and follow its text from a plain loop (no event loop)."""
        arguments, checked = self.arguments(given), self.options(options)
        stream = TextIterator(self.runtime.decode_tokens)
        stream.follow(self._logged(self._submitted(arguments, checked, stream), arguments, checked))
        return stream

    def submit_batch(self, inputs: Sequence[str], options: RuntimeOptions | None) -> list[PendingGeneration]:
        """Start a call per input (every input checked before the first starts)."""
        texts = checked_inputs(inputs)
        if texts:
            self.arguments(texts[0])  # every input is one str: the count and the program's state hold for all
        elif self.runtime.closed:
            raise ProgramClosedError()
        checked = self.options(options)
        traces = [CallTrace.start(self._name, self._program_id, request_id()) for _ in texts] if tracing_calls() else None
        hits: list[Generation | None] = [None] * len(texts)
        if self._memo is None:
            pendings = self.runtime.submit_batch(texts, checked)
        else:  # the cache answers what it can; the rest go to the runtime together, as a batch
            identity, memo = self._memo[1], self._memo[0]
            keys = [ResultCache.key(identity, text, checked) for text in texts]
            hits = [None if key is None else memo.get(key) for key in keys]
            computed = iter(self.runtime.submit_batch([text for text, hit in zip(texts, hits, strict=True) if hit is None], checked))
            pendings = [
                _answered(hit, None) if hit is not None else _remembering(memo, key, next(computed)) for key, hit in zip(keys, hits, strict=True)
            ]
        if traces is not None:
            pendings = [_traced(pending, trace, hit is not None) for pending, trace, hit in zip(pendings, traces, hits, strict=True)]
        return [self._logged(pending, text, checked) for pending, text in zip(pendings, texts, strict=True)]

    def generate_batch(self, inputs: Sequence[str], options: RuntimeOptions | None) -> list[Generation]:
        """Each input's `Generation`, in input order, once every call has ended (the first failure raised)."""
        return results_in_order(self.submit_batch(inputs, options))

    async def agenerate_batch(self, inputs: Sequence[str], options: RuntimeOptions | None) -> list[Generation]:
        """`generate_batch` for the event loop; cancelling the task cancels every call."""
        return await gather_in_order(self.submit_batch(inputs, options))

    def encode(self, given: str | tuple[object, ...], options: RuntimeOptions | None) -> list[int]:
        """The token ids a call evaluates after the cached prefix."""
        return self.runtime.encode_prompt(self.arguments(given), self.options(options))


def _answered(generation: Generation, sink: StreamSink | None) -> PendingGeneration:
    """A call the result cache answers: done at once, its tokens given to `sink` first."""
    pending = PendingGeneration()
    if sink is not None:
        for token in generation.token_ids:
            sink.on_token(token)
    pending.set_running_or_notify_cancel()
    pending.set_result(generation)
    return pending


def _traced(pending: PendingGeneration, trace: CallTrace | None, cache_hit: bool = False) -> PendingGeneration:
    """`pending`, its spans made once it ends (a cancelled call has none)."""
    if trace is not None:

        def ended(done: Future[Generation]) -> None:
            if not done.cancelled():
                failure = done.exception()
                trace.ended(None if failure is not None else done.result(), cache_hit, failure)

        pending.add_done_callback(ended)
    return pending


def _remembering(memo: ResultCache, key: tuple[str, str, str] | None, pending: PendingGeneration) -> PendingGeneration:
    """`pending`, its generation stored under `key` once it succeeds (None: not stored)."""
    if key is not None:

        def remember(done: Future[Generation]) -> None:
            if not done.cancelled() and done.exception() is None:
                memo.put(key, done.result())

        pending.add_done_callback(remember)
    return pending


def program_caller(
    runtime: ProgramRuntime,
    model: type[InterpreterModel],
    backend: str,
    meta: ProgramMeta,
    source: Path,
    settings: EngineSettings,
    identity: str | None = None,
) -> Caller:
    """The caller of a loaded program: its calls recorded in `settings.call_log` (when set) as calls of this program,
    and its deterministic calls answered from the process's result cache of `settings.result_cache_bytes` (when set
    and the program has an `identity`: what determines its outputs besides the call)."""
    cache = result_cache_for(settings.result_cache_bytes)
    memo = None if cache is None or identity is None else (cache, identity)
    log = call_log_for(settings)
    name = meta.program_id or source.name
    if log is None:
        return Caller(runtime, model, memo=memo, name=name, program_id=meta.program_id)
    site = CallSite(program_id=meta.program_id, program=str(source), interpreter=meta.interpreter, backend=backend)
    return Caller(runtime, model, log, site, memo, name, meta.program_id)
