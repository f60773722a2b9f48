"""Running a program over cases: every case submitted at once, so the engine decodes them together (each still gets
the tokens it gets alone), scored as they finish, with a progress bar on a terminal."""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import Sequence
from concurrent.futures import Future
from typing import Protocol, cast

from pydantic import BaseModel
from tqdm.auto import tqdm

from ..calls.caller import Caller
from ..core.errors import OutputTypeError, PawError
from ..core.images import Image
from ..core.grammar import JsonSchemaFormat
from ..core.options import RuntimeOptions
from ..core.progress import progress_enabled
from ..core.results import Generation
from ..formats.outputs import OutputType
from .cases import EvalCase
from .report import CaseResult, Comparison, EvalReport
from .scoring import Scorer

__all__ = ["Evaluated", "aevaluate", "compare", "evaluate"]


class _Missing:
    def __repr__(self) -> str:
        return "nothing"


_MISSING = _Missing()
"""A key one JSON object has and the other lacks."""


class Evaluated(Protocol):
    """What `evaluate` runs: a `PawFn` (its text is scored) or a `TypedFn` (its values are)."""

    @property
    def program_id(self) -> str | None: ...

    @property
    def output_type(self) -> OutputType[object] | None:
        """The type the calls return; None for text."""
        ...

    @property
    def calls(self) -> Caller:
        """Its calls (a `TypedFn`'s under its type's grammar)."""
        ...


def _submitted(program: Evaluated, case: EvalCase, options: RuntimeOptions | None) -> Future[Generation]:
    """`case`'s call started (its image arguments read now), or a future holding why it could not start: a wrong
    argument count, an image that cannot be read, is that case's error, never the run's end."""
    try:
        given: str | tuple[object, ...] = case.input
        if case.arguments is not None:
            given = tuple(argument if isinstance(argument, str) else Image(argument.image) for argument in case.arguments)
        return program.calls.submit(given, options)
    except (PawError, OSError, TypeError, ValueError) as exc:
        failed: Future[Generation] = Future()
        failed.set_exception(exc)
        return failed


def _value_difference(expected: object, got: object) -> str | None:
    """None when the values are equal; else what differs: the differing fields of two pydantic models (nested ones
    by their path), or both values."""
    if expected == got:
        return None
    if isinstance(expected, dict) and isinstance(got, dict):  # JSON objects: by key, as models by field
        wanted, found = cast("dict[str, object]", expected), cast("dict[str, object]", got)  # cast: parsed JSON
        keys = [*wanted, *(key for key in found if key not in wanted)]
        differing = [
            f"{key} (expected {wanted.get(key, _MISSING)!r}, got {found.get(key, _MISSING)!r})"
            for key in keys
            if wanted.get(key, _MISSING) != found.get(key, _MISSING)
        ]
        return "fields differ: " + "; ".join(differing)
    if isinstance(expected, BaseModel) and isinstance(got, BaseModel) and type(expected) is type(got):
        parts: list[str] = []
        for field in type(expected).model_fields:
            inner = _value_difference(getattr(expected, field), getattr(got, field))
            if inner is not None:
                parts.append(
                    f"{field}: {inner}"
                    if isinstance(getattr(expected, field), BaseModel)
                    else f"{field} (expected {getattr(expected, field)!r}, got {getattr(got, field)!r})"
                )
        return "fields differ: " + "; ".join(parts)
    return f"expected {expected!r}, got {got!r}"


def _scored(
    case: EvalCase,
    generation: Generation | None,
    failure: BaseException | None,
    scorer: Scorer | None,
    output: OutputType[object] | None,
    json_values: bool = False,
) -> CaseResult:
    """One case's result; a call or scorer that raised is an error (the case counts wrong), never the run's end. With no
    scorer, a typed program's values are compared (the expected text parsed as its type), JSON values where the calls
    were constrained to a JSON schema (`json_values`), else the texts exactly."""
    if generation is None:
        return CaseResult(case=case, output=None, correct=False, error=f"the call failed: {type(failure).__name__}: {failure}")
    if scorer is not None:
        try:
            right = bool(scorer(case, generation.text))
        except Exception as exc:  # noqa: BLE001 - a user's scorer: its error is this case's, reported with it
            return CaseResult(case=case, output=generation.text, correct=False, error=f"the scorer raised {type(exc).__name__}: {exc}")
        return CaseResult(case=case, output=generation.text, correct=right)
    if output is None and not json_values:
        return CaseResult(case=case, output=generation.text, correct=generation.text == case.expected)
    if output is None:
        try:
            expected_json: object = json.loads(case.expected)
        except json.JSONDecodeError as exc:
            return CaseResult(case=case, output=generation.text, correct=False, error=f"the case's expected text is no JSON: {exc}")
        try:
            got_json: object = json.loads(generation.text)
        except json.JSONDecodeError as exc:
            return CaseResult(case=case, output=generation.text, correct=False, detail=f"the output is no JSON: {exc}")
        difference = _value_difference(expected_json, got_json)
        return CaseResult(case=case, output=generation.text, correct=difference is None, detail=difference)
    try:
        expected = output.parse(case.expected)
    except OutputTypeError as exc:
        return CaseResult(case=case, output=generation.text, correct=False, error=f"the case's expected text is no {output.name}: {exc}")
    try:
        got = output.parse(generation.text)
    except OutputTypeError as exc:
        return CaseResult(case=case, output=generation.text, correct=False, detail=f"the output is no {output.name}: {exc}")
    difference = _value_difference(expected, got)
    return CaseResult(case=case, output=generation.text, correct=difference is None, detail=difference)


def _json_output(options: RuntimeOptions | None) -> bool:
    """Whether the calls' outputs are JSON (constrained to a JSON schema by their options)."""
    return options is not None and isinstance(options.response_format, JsonSchemaFormat)


def _name(program: Evaluated, name: str | None) -> str:
    return name or program.program_id or repr(program)


def _scorer_name(scorer: Scorer | None, program: Evaluated, json_values: bool) -> str:
    if scorer is None:
        output = program.output_type
        return ("JSON values" if json_values else "exact") if output is None else f"values of {output.name}"
    return getattr(scorer, "__name__", type(scorer).__name__)


def evaluate(
    program: Evaluated,
    cases: Sequence[EvalCase],
    *,
    scorer: Scorer | None = None,
    options: RuntimeOptions | None = None,
    name: str | None = None,
    progress: bool | None = None,
) -> EvalReport:
    """Run `program` on every case (submitted together: the engine batches them) and score each output with `scorer`
    (None: the exact text, or for a `TypedFn` its value against the expected text parsed as the type, pydantic models
    field by field); `name` labels the report (default: the program id); `progress`: a bar on stderr (None: when it
    is a terminal)."""
    started = time.perf_counter()
    pending = [_submitted(program, case, options) for case in cases]
    results: list[CaseResult] = []
    bar = tqdm(total=len(cases), desc="evaluating", unit="case", file=sys.stderr, disable=not progress_enabled(progress))
    try:
        for case, future in zip(cases, pending, strict=True):
            try:
                generation, failure = future.result(), None
            except Exception as exc:  # noqa: BLE001 - a call that failed is this case's error
                generation, failure = None, exc
            results.append(_scored(case, generation, failure, scorer, program.output_type, _json_output(options)))
            bar.update(1)
    finally:
        bar.close()
        for future in pending:  # an interrupted run leaves nothing decoding
            future.cancel()
    return EvalReport(
        program=_name(program, name),
        scorer=_scorer_name(scorer, program, _json_output(options)),
        seconds=time.perf_counter() - started,
        results=results,
    )


async def aevaluate(
    program: Evaluated, cases: Sequence[EvalCase], *, scorer: Scorer | None = None, options: RuntimeOptions | None = None, name: str | None = None
) -> EvalReport:
    """`evaluate` without blocking the event loop; cancelling the task cancels the calls still running."""
    started = time.perf_counter()
    pending = [_submitted(program, case, options) for case in cases]
    try:
        outcomes = await asyncio.gather(*(asyncio.wrap_future(future) for future in pending), return_exceptions=True)
    finally:
        for future in pending:
            future.cancel()
    output, json_values = program.output_type, _json_output(options)
    results = [
        _scored(case, None, outcome, scorer, output)
        if isinstance(outcome, BaseException)
        else _scored(case, outcome, None, scorer, output, json_values)
        for case, outcome in zip(cases, outcomes, strict=True)
    ]
    return EvalReport(
        program=_name(program, name),
        scorer=_scorer_name(scorer, program, _json_output(options)),
        seconds=time.perf_counter() - started,
        results=results,
    )


def compare(first: EvalReport, second: EvalReport) -> Comparison:
    """Two reports on the same cases paired case by case (a `ValueError` where their cases differ)."""
    ids = [result.case.id for result in first.results]
    if sorted(ids) != sorted(result.case.id for result in second.results):
        raise ValueError("the two reports ran different cases; compare runs of the same cases file")
    return Comparison(first=first, second=second)
