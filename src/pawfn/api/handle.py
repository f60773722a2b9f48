"""What `PawFn` and `TypedFn` share beyond their calls: `evaluate` and `aevaluate` (the program run over cases and
scored, `pawfn.evals`) and `stream` (a call's text in a plain loop)."""

from __future__ import annotations

import os
from collections.abc import Sequence

from ..calls.pending import TextIterator
from ..core.options import RuntimeOptions
from ..evals.cases import EvalCase, read_cases
from ..evals.report import EvalReport
from ..evals.runner import Evaluated, aevaluate, evaluate
from ..evals.scoring import Scorer
from ..formats.outputs import OutputType

__all__ = ["ProgramHandle"]

Cases = Sequence[EvalCase] | str | os.PathLike[str]
"""Cases, or a cases file (JSON Lines, JSON or CSV: `read_cases`)."""


def _cases(cases: Cases) -> Sequence[EvalCase]:
    return read_cases(os.fspath(cases)) if isinstance(cases, str | os.PathLike) else cases


class ProgramHandle:
    """What `PawFn` and `TypedFn` share: evaluation on cases and a call followed in a plain loop. A `PawFn`'s output is
    text (`output_type` None)."""

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
