"""Running a program over cases: every case submitted at once, so the engine decodes them together (each still gets
the tokens it gets alone), scored as they finish, with a progress bar on a terminal."""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Sequence
from concurrent.futures import Future
from typing import TypeVar

from tqdm.auto import tqdm

from ..api.function import PawFn
from ..core.backends import Backend
from ..core.models import InterpreterModel
from ..core.options import RuntimeOptions
from ..core.progress import progress_enabled
from ..core.results import Generation
from .cases import EvalCase
from .report import CaseResult, Comparison, EvalReport
from .scoring import Scorer, exact

__all__ = ["aevaluate", "compare", "evaluate"]

M = TypeVar("M", bound=InterpreterModel)
B = TypeVar("B", bound=Backend)


def _scored(case: EvalCase, generation: Generation | None, failure: BaseException | None, scorer: Scorer) -> CaseResult:
    """One case's result; a call or scorer that raised is an error (the case counts wrong), never the run's end."""
    if generation is None:
        return CaseResult(case=case, output=None, correct=False, error=f"the call failed: {type(failure).__name__}: {failure}")
    try:
        right = bool(scorer(case, generation.text))
    except Exception as exc:  # noqa: BLE001 - a user's scorer: its error is this case's, reported with it
        return CaseResult(case=case, output=generation.text, correct=False, error=f"the scorer raised {type(exc).__name__}: {exc}")
    return CaseResult(case=case, output=generation.text, correct=right)


def _name(program: PawFn[M, B], name: str | None) -> str:
    return name or program.program_id or str(program.source)


def _scorer_name(scorer: Scorer) -> str:
    return getattr(scorer, "__name__", type(scorer).__name__)


def evaluate(
    program: PawFn[M, B],
    cases: Sequence[EvalCase],
    *,
    scorer: Scorer = exact,
    options: RuntimeOptions | None = None,
    name: str | None = None,
    progress: bool | None = None,
) -> EvalReport:
    """Run `program` on every case (submitted together: the engine batches them) and score each output with `scorer`
    (`exact` by default); `name` labels the report (default: the program id, else its file); `progress`: a bar on
    stderr (None: when it is a terminal)."""
    started = time.perf_counter()
    pending: list[Future[Generation]] = [program.submit(case.input, options) for case in cases]
    results: list[CaseResult] = []
    bar = tqdm(total=len(cases), desc="evaluating", unit="case", file=sys.stderr, disable=not progress_enabled(progress))
    try:
        for case, future in zip(cases, pending, strict=True):
            try:
                generation, failure = future.result(), None
            except Exception as exc:  # noqa: BLE001 - a call that failed is this case's error
                generation, failure = None, exc
            results.append(_scored(case, generation, failure, scorer))
            bar.update(1)
    finally:
        bar.close()
        for future in pending:  # an interrupted run leaves nothing decoding
            future.cancel()
    return EvalReport(program=_name(program, name), scorer=_scorer_name(scorer), seconds=time.perf_counter() - started, results=results)


async def aevaluate(
    program: PawFn[M, B], cases: Sequence[EvalCase], *, scorer: Scorer = exact, options: RuntimeOptions | None = None, name: str | None = None
) -> EvalReport:
    """`evaluate` without blocking the event loop; cancelling the task cancels the calls still running."""
    started = time.perf_counter()
    pending = [await program.asubmit(case.input, options) for case in cases]
    try:
        outcomes = await asyncio.gather(*(asyncio.wrap_future(future) for future in pending), return_exceptions=True)
    finally:
        for future in pending:
            future.cancel()
    results = [
        _scored(case, None, outcome, scorer) if isinstance(outcome, BaseException) else _scored(case, outcome, None, scorer)
        for case, outcome in zip(cases, outcomes, strict=True)
    ]
    return EvalReport(program=_name(program, name), scorer=_scorer_name(scorer), seconds=time.perf_counter() - started, results=results)


def compare(first: EvalReport, second: EvalReport) -> Comparison:
    """Two reports on the same cases paired case by case (a `ValueError` where their cases differ)."""
    ids = [result.case.id for result in first.results]
    if sorted(ids) != sorted(result.case.id for result in second.results):
        raise ValueError("the two reports ran different cases; compare runs of the same cases file")
    return Comparison(first=first, second=second)
