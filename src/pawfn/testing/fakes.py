"""Fake programs: a real `PawFn[M, B]` whose runtime answers from a mapping or a function, with no model and no
file, recording every call; accepted wherever the program it stands for is, typed outputs (`returning`) included."""

from __future__ import annotations

import difflib
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from ..api.function import PawFn
from ..calls.pending import PendingGeneration, TokenListener
from ..calls.prompt import CallInput
from ..calls.runtime import ProgramRuntime
from ..core.backends import Backend
from ..core.config import PawConfig
from ..core.errors import PawError
from ..core.models import InterpreterModel
from ..core.options import RuntimeOptions
from ..calls.stops import first_stop
from ..core.results import Generation, StopReason, Timings
from ..formats.bundle import ProgramMeta

__all__ = ["Answers", "FakeCall", "FakeMissError", "FakeRuntime", "calls_of", "fake"]

M = TypeVar("M", bound=InterpreterModel)
B = TypeVar("B", bound=Backend)

Answers = Mapping[str, str] | Callable[[str], str]
"""What a fake answers: an output per input, or a function of the input."""


class FakeMissError(PawError, LookupError):
    """A fake program was called with an input it has no answer for."""


@dataclass(frozen=True)
class FakeCall:
    """One call a fake program answered: its input (a numbered template's arguments as a tuple) and options."""

    input: CallInput
    options: RuntimeOptions


def _text_of(given: CallInput) -> str:
    """The key a call's input is looked up by: the input itself, or a numbered template's text arguments joined by a
    newline (an image argument as `<image>`)."""
    if isinstance(given, str):
        return given
    return "\n".join(argument if isinstance(argument, str) else "<image>" for argument in given)


class FakeRuntime(ProgramRuntime):
    """A runtime that answers each call at once from `answers`, one token per character (so streams show the text
    as it comes), and records the calls."""

    def __init__(self, answers: Answers, n_ctx: int, arity: int = 1) -> None:
        super().__init__()
        self._answers = answers
        self._n_ctx = n_ctx
        self._arity = arity
        self._lock = threading.Lock()
        self.calls: list[FakeCall] = []

    @property
    def n_ctx(self) -> int:
        return self._n_ctx

    @property
    def prefix_tokens(self) -> int:
        return 0

    @property
    def arity(self) -> int:
        return self._arity

    @property
    def engine(self) -> str | None:
        return "pawfn.testing fake (no model)"

    def encode_prompt(self, text: CallInput, options: RuntimeOptions) -> list[int]:
        return [ord(char) for char in _text_of(text)]

    def decode_tokens(self, token_ids: Sequence[int]) -> str:
        return "".join(chr(token) for token in token_ids)

    def answer(self, text: CallInput) -> str:
        """The output for `text`, or `FakeMissError` naming the nearest input the fake knows."""
        key = _text_of(text)
        if callable(self._answers):
            return self._answers(key)
        found = self._answers.get(key)
        if found is None:
            nearest = difflib.get_close_matches(key, list(self._answers), n=1, cutoff=0.0)
            hint = f"; the nearest it knows is {nearest[0]!r}" if nearest else ""
            raise FakeMissError(f"this fake program has no answer for {key!r}{hint}; add it to the fake's answers")
        return found

    def reply(self, text: CallInput, options: RuntimeOptions) -> tuple[str, StopReason]:
        """A call's output and why it stopped: the answer, cut at `max_tokens` characters (a character a token: the
        budget cuts as a model's would)."""
        output = self.answer(text)
        if options.max_tokens is not None and len(output) >= options.max_tokens:
            return output[: options.max_tokens], "max_tokens"
        return output, "eos"

    def submit(self, text: CallInput, options: RuntimeOptions, on_token: TokenListener | None = None) -> PendingGeneration:
        pending = self.track(PendingGeneration())
        self._enter_run()
        try:
            with self._lock:
                self.calls.append(FakeCall(text, options))
            if not pending.set_running_or_notify_cancel():
                return pending
            try:
                output, stop = self.reply(text, options)
                shown = output
                if (at := first_stop(output, options.stop)) is not None:  # as a model's call: the stop's tokens were generated
                    ends = [at + len(s) for s in options.stop if output.startswith(s, at)]
                    shown, output, stop = output[:at], output[: min(ends)], "stop"
                for char in output:
                    if on_token is not None:
                        on_token(ord(char))
                timings = Timings(tokenize_ms=0.0, prompt_ms=0.0, generate_ms=0.0, total_ms=0.0)
                pending.set_result(
                    Generation(
                        text=shown.strip(),
                        token_ids=tuple(ord(char) for char in output),
                        prefix_tokens=0,
                        prompt_tokens=len(_text_of(text)),
                        stop_reason=stop,
                        timings=timings,
                    )
                )
            except BaseException as exc:  # noqa: BLE001 - the caller gets it from the result, as from any backend
                pending.set_exception(exc)
        finally:
            self._exit_run()
        return pending

    def release(self) -> None:
        pass


def fake(
    kind: type[PawFn[M, B]],
    answers: Answers,
    *,
    spec: str | None = None,
    n_ctx: int = 2048,
    program_id: str | None = None,
    arity: int = 1,
    config: PawConfig | None = None,
) -> PawFn[M, B]:
    """A `kind` program (`PawFn[Qwen3_0_6B, Torch]`) that answers each input from `answers` (a mapping, or a function
    of the input), with no model: pass it wherever the real program goes. An input the mapping lacks raises
    `FakeMissError` naming the nearest one it has; `calls_of(program)` lists the calls it answered. `config`: what
    it reads of a real program's (its `call_log`, say); no environment is read."""
    model = kind.model_type()
    meta = ProgramMeta(interpreter=model.interpreter_id, program_id=program_id, spec=spec)
    return kind(FakeRuntime(answers, n_ctx, arity), meta, Path("<fake program>"), config or PawConfig(progress=False), 0.0)


def calls_of(program: PawFn[M, B]) -> list[FakeCall]:
    """The calls a fake program answered, in order (a `TypeError` for a real one)."""
    runtime = program.runtime
    if not isinstance(runtime, FakeRuntime):
        raise TypeError(f"{program!r} is a real program; calls_of reads the calls of a pawfn.testing.fake(...)")
    return list(runtime.calls)
