"""What `PawFn` and `TypedFn` share: the call methods, declared once over the handle's `Caller` (a handle says only
what a `Generation` becomes: `PawFn` its text, `TypedFn` its parsed value), `evaluate` and `aevaluate` (the program
run over cases and scored, `pawfn.evals`) and `stream` (a call's text in a plain loop)."""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Generic, TypeVar

from ..calls.caller import Caller
from ..calls.pending import PendingGeneration, TextIterator
from ..core.options import RuntimeOptions
from ..core.results import Generation
from ..evals.cases import EvalCase, read_cases
from ..evals.report import EvalReport
from ..evals.runner import Evaluated, aevaluate, evaluate
from ..evals.scoring import Scorer
from ..formats.outputs import OutputType

__all__ = ["ProgramHandle"]

R_co = TypeVar("R_co", covariant=True)
"""What a handle's `generate` gives: a `Generation`, or a `TypedGeneration`."""
V_co = TypeVar("V_co", covariant=True)
"""What a handle's `run` gives: text, or a typed value."""

Cases = Sequence[EvalCase] | str | os.PathLike[str]
"""Cases, or a cases file (JSON Lines, JSON or CSV: `read_cases`)."""


def _cases(cases: Cases) -> Sequence[EvalCase]:
    return read_cases(os.fspath(cases)) if isinstance(cases, str | os.PathLike) else cases


class ProgramHandle(ABC, Generic[R_co, V_co]):
    """What `PawFn` and `TypedFn` share: the calls (each declared here once), evaluation on cases and a call followed
    in a plain loop. A `PawFn`'s output is text (`output_type` None)."""

    @property
    @abstractmethod
    def calls(self) -> Caller:
        """The program's calls (under its type's grammar for a typed program): the one implementation every method runs on."""

    @abstractmethod
    def _result(self, generation: Generation) -> R_co:
        """What `generate` gives for a call's `Generation`."""

    @abstractmethod
    def value_of(self, generation: Generation) -> V_co:
        """A call's value: its text, or a typed program's parsed value (`OutputTypeError` if it has none)."""

    def generate(self, input: str, options: RuntimeOptions | None = None) -> R_co:  # noqa: A002
        """Run the program on `input` (greedily unless `options` say otherwise; a typed program under its type's grammar,
        which replaces any `response_format`): the output and its tokens, timings and stop reason."""
        return self._result(self.calls.generate(input, options))

    def run(self, input: str, options: RuntimeOptions | None = None) -> V_co:  # noqa: A002
        """The program's output on `input`: its text, or a typed program's value."""
        return self.value_of(self.calls.generate(input, options))

    def submit(self, input: str, options: RuntimeOptions | None = None) -> PendingGeneration:  # noqa: A002
        """Start a call and return a future of its `Generation` at once (Torch: on its base's scheduler, decoded with the
        calls in flight; llama.cpp: its calls in turn; Remote: sent); `value_of` gives its value, `cancel()` stops it."""
        return self.calls.submit(input, options)

    async def agenerate(self, input: str, options: RuntimeOptions | None = None) -> R_co:  # noqa: A002
        """`generate` without blocking the event loop; cancelling the task stops the call at its next token."""
        return self._result(await self.calls.agenerate(input, options))

    async def arun(self, input: str, options: RuntimeOptions | None = None) -> V_co:  # noqa: A002
        """`run` without blocking the event loop; cancelling the task stops the call at its next token."""
        return self.value_of(await self.calls.agenerate(input, options))

    def generate_batch(self, inputs: Sequence[str], options: RuntimeOptions | None = None) -> list[R_co]:
        """`generate` for each of `inputs`, results in input order, each exactly what the input gives alone. The
        Torch backend decodes them together (up to `PawConfig.max_batch_rows` rows per pass); llama.cpp one by
        one. If calls fail, the first failing input's error is raised once every call has ended."""
        return [self._result(generation) for generation in self.calls.generate_batch(inputs, options)]

    def run_batch(self, inputs: Sequence[str], options: RuntimeOptions | None = None) -> list[V_co]:
        """The outputs of `generate_batch`: texts, or a typed program's values."""
        return [self.value_of(generation) for generation in self.calls.generate_batch(inputs, options)]

    async def arun_batch(self, inputs: Sequence[str], options: RuntimeOptions | None = None) -> list[V_co]:
        """`run_batch` without blocking the event loop (one request on Remote); cancelling the task stops its calls."""
        return [self.value_of(generation) for generation in await self.calls.agenerate_batch(inputs, options)]

    @property
    def output_type(self) -> OutputType[object] | None:
        """The type the program's calls return; None for text (a `TypedFn` has one)."""
        return None

    def stream(self: Evaluated, input: str, options: RuntimeOptions | None = None) -> TextIterator:  # noqa: A002
        """Start a call and iterate over its text as it is generated, with no event loop: `for piece in f.stream(x)`
        (pieces unstripped; a typed program's under its grammar), then `.generation()` (`value_of` gives a typed
        value). Breaking out of the loop stops the call at its next token."""
        return self.calls.iterate(input, options)

    def stream_with(self: Evaluated, input: str, options: RuntimeOptions) -> TextIterator:  # noqa: A002
        """`stream` with `options` (paw-rs's `_with` form, as `run_with`)."""
        return self.calls.iterate(input, options)

    def evaluate(
        self: Evaluated,
        cases: Cases,
        *,
        scorer: Scorer | None = None,
        options: RuntimeOptions | None = None,
        name: str | None = None,
        progress: bool | None = None,
    ) -> EvalReport:
        """Run every case (submitted together: the engine batches them) and score it: exact text, a typed program's
        values (pydantic models field by field), or `scorer`. An `EvalReport` (accuracy and its interval, labels,
        tags, failures; `pawfn.evals` renders it)."""
        return evaluate(self, _cases(cases), scorer=scorer, options=options, name=name, progress=progress)

    async def aevaluate(
        self: Evaluated, cases: Cases, *, scorer: Scorer | None = None, options: RuntimeOptions | None = None, name: str | None = None
    ) -> EvalReport:
        """`evaluate` without blocking the event loop; cancelling the task cancels the calls still running."""
        return await aevaluate(self, _cases(cases), scorer=scorer, options=options, name=name)
