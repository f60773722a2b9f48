"""Evaluation cases: an input and the output it should give, from a file (JSON Lines, JSON, CSV) or from the
`Input:` / `Output:` examples of a program's own spec."""

from __future__ import annotations

import csv
import json
import re
from collections.abc import Iterable, Mapping
from typing import cast
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, model_validator

from ..calls.log import CallRecord
from ..core.errors import ConfigError, describe_validation_error

__all__ = ["CaseImage", "CasesError", "EvalCase", "log_cases", "read_cases", "spec_cases"]

_OBJECT = TypeAdapter(dict[str, object])
_ROWS = TypeAdapter(list[object])
_MAX_CASES = 1_000_000
"""More rows than any evaluation needs: a file past it is refused, not read into memory."""


class CasesError(ConfigError):
    """A cases file (or spec) that cannot be read as cases: names the file, the line and the fix."""


class CaseImage(BaseModel):
    """An image argument of a case: `{"image": "photos/cat.png"}` (a path relative to the cases file)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    image: str = Field(min_length=1)


def _shown_argument(item: object) -> str:
    if isinstance(item, dict):
        return f"[image {cast('dict[str, object]', item).get('image')}]"  # cast: a JSON object
    return str(item)


class EvalCase(BaseModel):
    """One case: the program's input and the output it should give; `id` names it in reports (its line number
    where the file gives none), `tags` group it. A program of several arguments (a numbered template, images for
    Qwen3.5) takes `arguments` instead, in slot order; `input` then shows them in reports (given, or made of them)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    id: str = Field(min_length=1)
    input: str
    expected: str
    tags: tuple[str, ...] = ()
    arguments: tuple[str | CaseImage, ...] | None = None

    @model_validator(mode="before")
    @classmethod
    def _input_from_arguments(cls, data: object) -> object:
        """`input`, where only `arguments` are given: the arguments shown in one line (`q | [image cat.png]`)."""
        if not isinstance(data, dict):
            return data
        given = cast("dict[str, object]", data)  # cast: a case's fields by name
        if "input" in given:
            return given
        arguments = given.get("arguments")
        if not isinstance(arguments, list) or not arguments:
            raise ValueError('a case needs "input", or "arguments" (at least one) for a program of several')
        shown = [_shown_argument(item) for item in cast("list[object]", arguments)]  # cast: a JSON list
        return given | {"input": " | ".join(shown)}

    def with_images_from(self, folder: Path) -> EvalCase:
        """This case with its image paths made absolute from `folder` (its cases file's)."""
        if self.arguments is None:
            return self
        arguments = tuple(
            argument if isinstance(argument, str) else CaseImage(image=str(folder / Path(argument.image).expanduser())) for argument in self.arguments
        )
        return self.model_copy(update={"arguments": arguments})


def _case(row: Mapping[str, object], default_id: str, where: str) -> EvalCase:
    values = dict(row)
    values.setdefault("id", default_id)
    if isinstance(values.get("tags"), str):  # CSV: tags separated by commas or spaces
        values["tags"] = [tag for tag in re.split(r"[,\s]+", str(values["tags"])) if tag]
    if values.get("id") in (None, ""):
        values["id"] = default_id
    try:
        return EvalCase.model_validate(values)
    except ValidationError as exc:
        raise CasesError(f'{where}: {describe_validation_error(exc)}; each case needs "input" (or "arguments") and "expected"') from exc


def _unique(cases: list[EvalCase], source: str) -> list[EvalCase]:
    seen: dict[str, int] = {}
    for number, case in enumerate(cases, 1):
        if case.id in seen:
            raise CasesError(f"{source}: case {number} has the id {case.id!r} of case {seen[case.id]}; give every case its own id")
        seen[case.id] = number
    if not cases:
        raise CasesError(f'{source}: no cases; write one per line: {{"input": ..., "expected": ...}}')
    return cases


def read_cases(path: str | Path) -> list[EvalCase]:
    """The cases in `path`: JSON Lines (`.jsonl`, one object a line), JSON (`.json`, a list of objects) or CSV
    (`.csv`, a header row naming `input`, `expected` and optionally `id`, `tags`); a bad row is a `CasesError` naming
    its line."""
    source = Path(path)
    try:
        text = source.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise CasesError(f"{source}: cannot be read as UTF-8 text ({exc})") from exc
    folder = source.resolve().parent
    return [case.with_images_from(folder) for case in _parsed_cases(text, source)]


def _parsed_cases(text: str, source: Path) -> list[EvalCase]:
    suffix = source.suffix.lower()
    if suffix == ".csv":
        return _unique(list(_csv_cases(text, source)), str(source))
    if suffix == ".json":
        try:
            parsed: object = json.loads(text)
            rows = _ROWS.validate_python(parsed)
        except json.JSONDecodeError as exc:
            raise CasesError(f"{source}: line {exc.lineno}: not JSON ({exc.msg})") from exc
        except ValidationError:
            raise CasesError(f"{source}: a JSON cases file holds a list of cases; use .jsonl for one case a line") from None
        return _unique([_row(row, str(number), f"{source}: case {number}") for number, row in enumerate(rows, 1)], str(source))
    return _unique(list(_jsonl_cases(text, source)), str(source))


def _row(row: object, default_id: str, where: str) -> EvalCase:
    try:
        fields = _OBJECT.validate_python(row)
    except ValidationError:
        raise CasesError(f'{where}: a case is an object with "input" and "expected", not {type(row).__name__}') from None
    return _case(fields, default_id, where)


def _jsonl_cases(text: str, source: Path) -> Iterable[EvalCase]:
    for number, line in enumerate(text.splitlines(), 1):
        if number > _MAX_CASES:
            raise CasesError(f"{source}: more than {_MAX_CASES} lines; split the cases")
        if not line.strip():
            continue
        try:
            row: object = json.loads(line)
        except json.JSONDecodeError as exc:
            raise CasesError(f"{source}: line {number}: not JSON ({exc.msg}); write one case a line") from exc
        yield _row(row, f"line-{number}", f"{source}: line {number}")


def _csv_cases(text: str, source: Path) -> Iterable[EvalCase]:
    reader = csv.DictReader(text.splitlines())
    missing = {"input", "expected"} - set(reader.fieldnames or ())
    if missing:
        raise CasesError(f"{source}: the header row lacks {', '.join(sorted(missing))}; name the columns input, expected (and id, tags)")
    for row in reader:
        number = reader.line_num
        if number > _MAX_CASES:
            raise CasesError(f"{source}: more than {_MAX_CASES} rows; split the cases")
        if None in row:
            raise CasesError(f"{source}: line {number}: more fields than the header names; quote values that hold commas")
        yield _case({key: value for key, value in row.items() if value is not None}, f"line-{number}", f"{source}: line {number}")


def spec_cases(spec: str, source: str = "the spec") -> list[EvalCase]:
    """The `Input: ...` / `Output: ...` examples of a program's spec, in order: each starts on a line of its own; an
    input or output runs over the lines that follow it, up to the next `Input:`/`Output:` line or a blank line."""
    cases: list[EvalCase] = []
    parts: dict[str, list[str]] = {}
    current: str | None = None

    def emit() -> None:
        if "input" in parts and "output" in parts:
            text, output = ("\n".join(parts[key]).strip() for key in ("input", "output"))
            cases.append(EvalCase(id=f"example-{len(cases) + 1}", input=text, expected=output, tags=("spec",)))
        parts.clear()

    for line in spec.splitlines():
        stripped = line.strip()
        label = "input" if stripped.startswith("Input:") else "output" if stripped.startswith("Output:") else None
        if label == "input" and "output" in parts:
            emit()
        if label is not None:
            current = label
            parts[label] = [stripped.split(":", 1)[1].strip()]
        elif not stripped:
            if "output" in parts:
                emit()
            current = None
        elif current is not None:
            parts[current].append(stripped)
    emit()
    if not cases:
        raise CasesError(f"{source} holds no Input:/Output: examples; give cases in a file (--cases FILE)")
    return cases


def log_cases(path: str | Path, program_id: str | None = None) -> list[EvalCase]:
    """Cases from a call log (`PawConfig(call_log=...)`): each logged call's input with the `expected` you added to
    its line (a corrected output; tagged `corrected`), else its logged output (a snapshot to keep; tagged `logged`).
    Left out: calls that failed with nothing expected, calls with several arguments, and with `program_id` the
    calls of other programs. A line that is no record is a `CasesError` naming it."""
    source = Path(path)
    try:
        text = source.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise CasesError(f"{source}: cannot be read as UTF-8 text ({exc})") from exc
    cases: list[EvalCase] = []
    for number, line in enumerate(text.splitlines(), 1):
        if number > _MAX_CASES:
            raise CasesError(f"{source}: more than {_MAX_CASES} lines; split the log")
        if not line.strip():
            continue
        try:
            record = CallRecord.model_validate_json(line)
        except ValidationError as exc:
            raise CasesError(f"{source}: line {number}: not a call record ({describe_validation_error(exc)}); fix or delete that line") from None
        if (program_id is not None and record.program_id != program_id) or not isinstance(record.input, str):
            continue
        expected = record.expected if record.expected is not None else record.output
        if expected is None:
            continue
        tags = ("corrected",) if record.expected is not None else ("logged",)
        cases.append(EvalCase(id=f"log-{number}", input=record.input, expected=expected, tags=tags))
    if not cases:
        which = "" if program_id is None else f" of program {program_id}"
        raise CasesError(f"{source}: no call{which} with an output or an expected text to make a case of")
    return cases
