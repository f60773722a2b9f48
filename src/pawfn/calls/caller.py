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
from .pending import PendingGeneration, TextIterator, TextStream, checked_input, checked_inputs, checked_options, gather_in_order, results_in_order
from .log import CallLog, CallSite, call_log_for, request_id
from .prompt import Argument, CallInput
from .runtime import ProgramRuntime

__all__ = ["Caller", "program_caller"]


class Caller:
    """Calls on `runtime`, a program of interpreter `model` (whether it reads image arguments)."""

    def __init__(self, runtime: ProgramRuntime, model: type[InterpreterModel], log: CallLog | None = None, site: CallSite | None = None) -> None:
        """`log`: where each call is recorded, as a call of `site` (both or neither)."""
        self.runtime = runtime
        self._model = model
        self._typed = False
        self._format: OutputFormat | None = None
        self._log = None if site is None else log
        self._site = site

    def returning(self, response_format: OutputFormat | None) -> Caller:
        """These calls with their output constrained to `response_format` (a typed program's; None: free text),
        replacing any format the options give."""
        typed = Caller(self.runtime, self._model, self._log, self._site)
        typed._typed, typed._format = True, response_format
        return typed

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
        return self._logged(self.runtime.submit(arguments, checked), arguments, checked)

    def generate(self, given: str | tuple[object, ...], options: RuntimeOptions | None) -> Generation:
        """Run a call and wait for its `Generation`."""
        if not isinstance(given, str):
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
        stream.follow(self._logged(self.runtime.submit_streaming(arguments, checked, stream), arguments, checked))
        return stream

    def iterate(self, given: str | tuple[object, ...], options: RuntimeOptions | None) -> TextIterator:
        """Start a call and follow its text from a plain loop (no event loop)."""
        arguments, checked = self.arguments(given), self.options(options)
        stream = TextIterator(self.runtime.decode_tokens)
        stream.follow(self._logged(self.runtime.submit_streaming(arguments, checked, stream), arguments, checked))
        return stream

    def submit_batch(self, inputs: Sequence[str], options: RuntimeOptions | None) -> list[PendingGeneration]:
        """Start a call per input (every input checked before the first starts)."""
        texts = checked_inputs(inputs)
        if texts:
            self.arguments(texts[0])  # every input is one str: the count and the program's state hold for all
        elif self.runtime.closed:
            raise ProgramClosedError()
        checked = self.options(options)
        return [self._logged(pending, text, checked) for pending, text in zip(self.runtime.submit_batch(texts, checked), texts, strict=True)]

    def generate_batch(self, inputs: Sequence[str], options: RuntimeOptions | None) -> list[Generation]:
        """Each input's `Generation`, in input order, once every call has ended (the first failure raised)."""
        return results_in_order(self.submit_batch(inputs, options))

    async def agenerate_batch(self, inputs: Sequence[str], options: RuntimeOptions | None) -> list[Generation]:
        """`generate_batch` for the event loop; cancelling the task cancels every call."""
        return await gather_in_order(self.submit_batch(inputs, options))

    def encode(self, given: str | tuple[object, ...], options: RuntimeOptions | None) -> list[int]:
        """The token ids a call evaluates after the cached prefix."""
        return self.runtime.encode_prompt(self.arguments(given), self.options(options))


def program_caller(
    runtime: ProgramRuntime, model: type[InterpreterModel], backend: str, meta: ProgramMeta, source: Path, settings: EngineSettings
) -> Caller:
    """The caller of a loaded program: its calls recorded in `settings.call_log` (when set) as calls of this program."""
    log = call_log_for(settings)
    if log is None:
        return Caller(runtime, model)
    return Caller(runtime, model, log, CallSite(program_id=meta.program_id, program=str(source), interpreter=meta.interpreter, backend=backend))
