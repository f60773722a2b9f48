"""Cases from JSON Lines, JSON and CSV files and from a spec's Input:/Output: examples; a bad row names its line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pawfn.evals import CasesError, EvalCase, read_cases, spec_cases


def test_the_three_formats_give_the_same_cases(tmp_path: Path) -> None:
    rows: list[dict[str, object]] = [
        {"id": "a", "input": "Server down!", "expected": "urgent", "tags": ["ops"]},
        {"input": "Lunch, anyone?", "expected": "later"},
    ]
    (tmp_path / "c.jsonl").write_text("\n".join(json.dumps(row) for row in rows) + "\n\n")
    (tmp_path / "c.json").write_text(json.dumps(rows))
    (tmp_path / "c.csv").write_text('id,input,expected,tags\na,Server down!,urgent,ops\n,"Lunch, anyone?",later,\n')
    jsonl, as_json, csv = (read_cases(tmp_path / name) for name in ("c.jsonl", "c.json", "c.csv"))
    assert jsonl[0] == as_json[0] == csv[0] == EvalCase(id="a", input="Server down!", expected="urgent", tags=("ops",))
    assert [case.input for case in jsonl] == [case.input for case in as_json] == [case.input for case in csv]
    assert (jsonl[1].id, as_json[1].id, csv[1].id) == ("line-2", "2", "line-3")  # where the file names none


@pytest.mark.parametrize(
    ("name", "text", "words"),
    [
        ("bad.jsonl", '{"input": "a", "expected": "b"}\n{"input": "c"\n', "line 2: not JSON"),
        ("missing.jsonl", '{"input": "a", "expected": "b"}\n\n{"input": "c"}\n', "line 3: expected: Field required"),
        ("type.jsonl", '{"input": 5, "expected": "b"}\n', "line 1: input"),
        ("list.jsonl", '["a", "b"]\n', "line 1: a case is an object"),
        ("object.json", '{"input": "a"}', "holds a list of cases"),
        ("header.csv", "text,label\na,b\n", "lacks expected, input"),
        ("extra.csv", "input,expected\na,b,c\n", "line 2: more fields than the header"),
        ("twice.jsonl", '{"id": "x", "input": "a", "expected": "b"}\n{"id": "x", "input": "c", "expected": "d"}\n', "case 2 has the id 'x'"),
        ("empty.jsonl", "\n\n", "no cases"),
    ],
)
def test_a_bad_cases_file_names_the_line_and_the_fix(tmp_path: Path, name: str, text: str, words: str) -> None:
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(CasesError, match=words) as caught:
        read_cases(path)
    assert str(path) in str(caught.value)


def test_a_missing_or_binary_file_is_a_cases_error(tmp_path: Path) -> None:
    with pytest.raises(CasesError, match="cannot be read"):
        read_cases(tmp_path / "absent.jsonl")
    (tmp_path / "binary.jsonl").write_bytes(b"\xff\xfe\x00")
    with pytest.raises(CasesError, match="cannot be read as UTF-8"):
        read_cases(tmp_path / "binary.jsonl")


def test_a_specs_examples_are_cases() -> None:
    spec = """Classify an email's urgency as immediate, later or never.

Examples:
Input: Urgent: the server is down!
Output: immediate

Input: Lunch on Friday?
Output: later
Input: A newsletter
  with two lines
Output: never
"""
    cases = spec_cases(spec)
    assert [(case.input, case.expected) for case in cases] == [
        ("Urgent: the server is down!", "immediate"),
        ("Lunch on Friday?", "later"),
        ("A newsletter\nwith two lines", "never"),
    ]
    assert [case.id for case in cases] == ["example-1", "example-2", "example-3"] and all(case.tags == ("spec",) for case in cases)
    with pytest.raises(CasesError, match="no Input:/Output: examples"):
        spec_cases("Classify sentiment.")
