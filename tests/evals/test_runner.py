"""`evaluate` and `pawfn eval` on a real program: outputs scored as the program gives them alone, failures counted
and named, a scorer's error counted without ending the run, `--compare`, `--min-accuracy` as CI's exit code, JUnit
XML on disk."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from xml.etree import ElementTree

import pytest

from pawfn import PawFn, Qwen3_0_6B, RuntimeOptions, Torch
from pawfn.evals import EvalCase, aevaluate, evaluate, normalized
from tests.helpers.bounded import run_cli
from tests.helpers.programs import TinyProgram, requires_llama_cpp

OPTIONS = RuntimeOptions(max_tokens=6)
INPUTS = ["Urgent: the server is down!", "hello", "a b c", "numbers 12345", "Lunch?", "Invoice overdue"]


@pytest.fixture(scope="module")
def outputs(qwen3_program: TinyProgram) -> list[str]:
    """What the program answers to each input alone: the cases' right answers."""
    with PawFn[Qwen3_0_6B, Torch].load_sync(qwen3_program.folder, base=qwen3_program.interpreter.gguf_path) as program:
        return [program.generate(text, OPTIONS).text for text in INPUTS]


def _cases(outputs: list[str], wrong: set[int]) -> list[EvalCase]:
    return [
        EvalCase(id=f"case-{i}", input=text, expected=("WRONG " + out) if i in wrong else out, tags=("odd",) if i % 2 else ())
        for i, (text, out) in enumerate(zip(INPUTS, outputs, strict=True))
    ]


def test_evaluate_scores_each_case_as_the_program_answers_it_alone(qwen3_program: TinyProgram, outputs: list[str]) -> None:
    cases = _cases(outputs, wrong={1, 4})
    with PawFn[Qwen3_0_6B, Torch].load_sync(qwen3_program.folder, base=qwen3_program.interpreter.gguf_path) as program:
        report = evaluate(program, cases, options=OPTIONS, progress=False)
        again = asyncio.run(aevaluate(program, cases, options=OPTIONS))

        def fussy(case: EvalCase, output: str) -> bool:
            if case.id == "case-3":
                raise ValueError("cannot judge this one")
            return output == case.expected

        scored = evaluate(program, cases, scorer=fussy, options=OPTIONS, progress=False)
    assert (report.correct, report.total, report.errors) == (4, 6, 0)
    assert [r.output for r in report.results] == outputs and [r.case.id for r in report.failures] == ["case-1", "case-4"]
    assert [r.correct for r in again.results] == [r.correct for r in report.results]
    assert (scored.correct, scored.errors) == (3, 1) and "the scorer raised ValueError: cannot judge this one" in str(scored.results[3].error)
    assert {(g.tag, g.correct, g.total) for g in report.by_tag} == {("odd", 2, 3)}


def test_normalized_scoring_forgives_case_and_spaces() -> None:
    case = EvalCase(id="a", input="x", expected="Immediate  action")
    assert normalized(case, " immediate action ") and not normalized(case, "immediate-action")


def test_pawfn_eval_reports_compares_and_sets_the_exit_code(
    qwen3_program: TinyProgram, qwen3_program_q4: TinyProgram, outputs: list[str], tmp_path: Path
) -> None:
    cases = tmp_path / "cases.jsonl"
    cases.write_text("\n".join(case.model_dump_json() for case in _cases(outputs, wrong={1, 4})))
    common = [
        "eval",
        "--program",
        str(qwen3_program.folder),
        "--base",
        str(qwen3_program.interpreter.gguf_path),
        "--cases",
        str(cases),
        "--max-tokens",
        "6",
        "--no-progress",
    ]
    passed = run_cli(*common, "--min-accuracy", "0.6", "--junit-xml", str(tmp_path / "junit.xml"))
    assert passed.status == 0, passed.stderr
    assert "4/6 right, accuracy 66.7%" in passed.stdout and "FAIL case-1" in passed.stdout
    suite = ElementTree.parse(tmp_path / "junit.xml").getroot().find("testsuite")
    assert suite is not None and (suite.get("tests"), suite.get("failures"), suite.get("errors")) == ("6", "2", "0")
    failed = run_cli(*common, "--min-accuracy", "0.7")
    assert failed.status == 1 and "below --min-accuracy 0.7" in failed.stderr
    compared = run_cli(*common, "--compare", str(qwen3_program_q4.folder), "--json")
    assert compared.status == 0, compared.stderr
    data = json.loads(compared.stdout)
    assert data["report"]["correct"] == 4 and data["report"]["interval"][0] < 0.667 < data["report"]["interval"][1]
    paired = data["comparison"]
    assert paired["both_right"] + paired["fixed"] + paired["broken"] + paired["both_wrong"] == 6
    assert paired["both_right"] + paired["broken"] == 4 and 0 < paired["p_value"] <= 1
    run_cli("eval", "--program", str(qwen3_program.folder)).assert_one_line_error(2, "no cases", "--cases FILE")
    run_cli(*common, "--temperature", "-1").assert_one_line_error(2, "--temperature", "-1")  # pawfn run's options, checked as there
    run_cli(*common[:-3], "--cases", str(tmp_path / "absent.jsonl")).assert_one_line_error(1, "absent.jsonl", "cannot be read")


@requires_llama_cpp
def test_the_same_program_compared_on_two_backends(qwen3_program: TinyProgram, outputs: list[str], tmp_path: Path) -> None:
    """`--compare-backend llamacpp`: the Torch run against the official runtime's on the same cases; by default they
    give the same tokens, so the pairs agree case by case."""
    cases = tmp_path / "cases.jsonl"
    cases.write_text("\n".join(case.model_dump_json() for case in _cases(outputs, wrong={2})))
    arguments = ["eval", "--program", str(qwen3_program.folder), "--base", str(qwen3_program.interpreter.gguf_path), "--cases", str(cases)]
    compared = run_cli(*arguments, "--max-tokens", "6", "--no-progress", "--json", "--compare-backend", "llamacpp")
    assert compared.status == 0, compared.stderr
    data = json.loads(compared.stdout)
    assert data["report"]["program"].endswith(" on torch") and data["second"]["program"].endswith(" on llamacpp")
    assert [result["output"] for result in data["second"]["results"]] == [result["output"] for result in data["report"]["results"]]
    paired = data["comparison"]
    assert (paired["both_right"], paired["fixed"], paired["broken"], paired["both_wrong"]) == (5, 0, 0, 1)
