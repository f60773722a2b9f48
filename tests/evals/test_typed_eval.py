"""`PawFn.evaluate` and `TypedFn.evaluate` (sync and async): a typed program's values compared with the expected text
parsed as its type, a pydantic model field by field with the differing fields named; JSON-schema calls on the command
line compared as JSON values, key by key."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Literal

import pytest
from pydantic import BaseModel

from pawfn import PawFn, Qwen3_0_6B, RuntimeOptions, Torch
from pawfn.cli import main
from pawfn.evals import EvalCase, normalized, render_junit, render_text
from pawfn.testing import fake
from tests.helpers.programs import TinyProgram


class Owner(BaseModel):
    name: str
    team: str


class Ticket(BaseModel):
    label: Literal["urgent", "normal"]
    score: int
    owner: Owner


def _ticket(label: str, score: int, name: str = "ana", team: str = "ops") -> str:
    return json.dumps({"label": label, "score": score, "owner": {"name": name, "team": team}})


ANSWERS = {
    "Server down!": _ticket("urgent", 9),
    "Lunch?": _ticket("normal", 1),
    "Invoice": _ticket("normal", 4, team="billing"),
    "Broken": '{"label": "urgent"}',
}


def test_a_typed_program_is_scored_by_value_naming_the_fields_that_differ() -> None:
    program = fake(PawFn[Qwen3_0_6B, Torch], ANSWERS, program_id="a6b454023d41ac9ca845").returning(Ticket)
    cases = [
        EvalCase(id="same-value", input="Server down!", expected=' {"score": 9, "label": "urgent", "owner": {"team": "ops", "name": "ana"}} '),
        EvalCase(id="score", input="Lunch?", expected=_ticket("normal", 3)),
        EvalCase(id="nested", input="Invoice", expected=_ticket("normal", 4, team="sales")),
        EvalCase(id="no-ticket", input="Broken", expected=_ticket("urgent", 9)),
        EvalCase(id="bad-case", input="Lunch?", expected="not json"),
    ]
    report = program.evaluate(cases)
    results = {result.case.id: result for result in report.results}
    assert (report.correct, report.total, report.errors, report.program) == (1, 5, 1, "a6b454023d41ac9ca845")
    assert report.scorer == "values of Ticket"
    assert results["same-value"].correct  # another key order and spacing: the same Ticket
    assert results["score"].detail == "fields differ: score (expected 3, got 1)"
    assert results["nested"].detail == "fields differ: owner: fields differ: team (expected 'sales', got 'billing')"
    assert results["no-ticket"].detail is not None and results["no-ticket"].detail.startswith("the output is no Ticket")
    assert results["bad-case"].error is not None and results["bad-case"].error.startswith("the case's expected text is no Ticket")
    assert "  diff:     fields differ: score (expected 3, got 1)" in render_text(report)
    assert "diff: fields differ: score (expected 3, got 1)" in render_junit(report)
    assert asyncio.run(program.aevaluate(cases)).model_dump(exclude={"seconds"}) == report.model_dump(exclude={"seconds"})


def test_a_text_program_evaluates_cases_from_a_list_or_a_file(tmp_path: Path) -> None:
    program = fake(PawFn[Qwen3_0_6B, Torch], {"Server down!": "immediate", "Lunch?": "Later"})
    cases_file = tmp_path / "cases.jsonl"
    cases_file.write_text('{"input": "Server down!", "expected": "immediate"}\n{"input": "Lunch?", "expected": "later"}\n', encoding="utf-8")
    exact = program.evaluate(cases_file)
    assert (exact.correct, exact.total, exact.scorer) == (1, 2, "exact")
    assert program.evaluate(str(cases_file), scorer=normalized).correct == 2
    labels = program.returning(Literal["immediate", "later", "Later"]).evaluate(cases_file)
    assert (labels.correct, labels.scorer) == (1, "values of Literal['immediate', 'later', 'Later']")
    assert asyncio.run(program.aevaluate(cases_file, name="triage")).program == "triage"


def test_the_cli_compares_json_schema_outputs_key_by_key(qwen3_program: TinyProgram, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    schema = {"type": "object", "properties": {"label": {"enum": ["a", "b"]}, "n": {"type": "integer"}}, "required": ["label", "n"]}
    schema_file = tmp_path / "schema.json"
    schema_file.write_text(json.dumps(schema), encoding="utf-8")
    base = str(qwen3_program.interpreter.gguf_path)
    options = RuntimeOptions.model_validate(
        {"max_tokens": 40, "response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": schema}}}
    )
    inputs = ["hello", "the lazy dog"]
    with PawFn[Qwen3_0_6B, Torch].load_sync(qwen3_program.folder, base=base) as program:
        outputs = [program.run(text, options) for text in inputs]
    produced = [json.loads(text) for text in outputs]  # what the program gives: valid JSON of the schema
    changed = produced[1] | {"n": produced[1]["n"] + 1}
    rows = [
        {"id": "same", "input": inputs[0], "expected": json.dumps(produced[0], indent=2)},
        {"id": "n", "input": inputs[1], "expected": json.dumps(changed)},
    ]
    cases_file = tmp_path / "cases.jsonl"
    cases_file.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    arguments = ["eval", "--program", str(qwen3_program.folder), "--base", base, "--cases", str(cases_file), "--json-schema", str(schema_file)]
    assert main([*arguments, "--max-tokens", "40", "--json", "--no-progress"]) == 0
    report = json.loads(capsys.readouterr().out)["report"]
    assert (report["correct"], report["total"], report["scorer"]) == (1, 2, "JSON values")
    details = {result["case"]["id"]: result["detail"] for result in report["results"]}
    assert details == {"same": None, "n": f"fields differ: n (expected {changed['n']}, got {produced[1]['n']})"}
