"""An evaluation's figures on hand-counted results: accuracy and its Wilson interval, per-label precision and recall,
the confusion table, per-tag accuracy, paired counts with McNemar's exact p-value; and its renderings (JUnit XML read
back by an XML parser)."""

from __future__ import annotations

from xml.etree import ElementTree

import pytest

from pawfn.evals import (
    CaseResult,
    Comparison,
    EvalCase,
    EvalReport,
    compare,
    mcnemar_exact,
    render_junit,
    render_markdown,
    render_text,
    wilson_interval,
)
from pawfn.evals.report import marked_difference

# (expected, got, tags): 10 cases, 7 right; labels spam / ham / unsure
_ROWS = [
    ("spam", "spam", ("mail",)),
    ("spam", "spam", ("mail",)),
    ("spam", "ham", ("mail",)),
    ("ham", "ham", ("mail", "short")),
    ("ham", "ham", ()),
    ("ham", "spam", ("short",)),
    ("ham", "ham", ()),
    ("unsure", "unsure", ()),
    ("unsure", "maybe", ("short",)),
    ("unsure", "unsure", ()),
]


def _report(rows: list[tuple[str, str, tuple[str, ...]]] = _ROWS, name: str = "p") -> EvalReport:
    results = [
        CaseResult(case=EvalCase(id=f"c{index}", input=f"text {index}", expected=expected, tags=tags), output=got, correct=got == expected)
        for index, (expected, got, tags) in enumerate(rows)
    ]
    return EvalReport(program=name, scorer="exact", seconds=1.0, results=results)


def test_accuracy_and_its_wilson_interval() -> None:
    report = _report()
    assert (report.correct, report.total, report.errors) == (7, 10, 0)
    assert report.accuracy == pytest.approx(0.7)
    low, high = report.interval
    assert (round(low, 4), round(high, 4)) == (0.3968, 0.8922)  # Wilson's 95% interval for 7 of 10
    assert [round(bound, 4) for bound in wilson_interval(8, 10)] == [0.4902, 0.9433]
    assert wilson_interval(0, 0) == (0.0, 1.0) and wilson_interval(5, 5)[1] == 1.0


def test_labels_precision_recall_and_confusion() -> None:
    report = _report()
    assert report.labels == ["ham", "spam", "unsure"]
    scores = {score.label: score for score in report.label_scores or []}
    assert (scores["spam"].support, scores["spam"].precision, scores["spam"].recall) == (3, 2 / 3, 2 / 3)
    assert (scores["ham"].support, scores["ham"].precision, scores["ham"].recall) == (4, 3 / 4, 3 / 4)
    assert (scores["unsure"].precision, scores["unsure"].recall) == (1.0, 2 / 3)
    assert report.confusion == {"ham": {"ham": 3, "spam": 1}, "spam": {"spam": 2, "ham": 1}, "unsure": {"unsure": 2, "(other)": 1}}
    assert {(g.tag, g.correct, g.total) for g in report.by_tag} == {("mail", 3, 4), ("short", 1, 3)}


def test_long_outputs_are_not_labels() -> None:
    report = _report([("a long\nanswer", "a long\nanswer", ()), ("b", "c", ())])
    assert report.labels is None and report.label_scores is None and report.confusion is None


def test_paired_counts_and_mcnemars_exact_p_value() -> None:
    first = _report()
    second = _report([(e, e if index in (2, 5) else g, t) for index, (e, g, t) in enumerate(_ROWS)][:9] + [("unsure", "no", ())], name="q")
    comparison = compare(first, second)
    assert (comparison.both_right, comparison.fixed, comparison.broken, comparison.both_wrong) == (6, 2, 1, 1)
    assert comparison.p_value == mcnemar_exact(2, 1) == 1.0
    assert mcnemar_exact(1, 9) == 2 * 11 / 1024 and mcnemar_exact(0, 5) == 2 / 32 and mcnemar_exact(0, 0) == 1.0
    with pytest.raises(ValueError, match="different cases"):
        compare(first, _report(_ROWS[:5]))
    assert Comparison.model_validate_json(comparison.model_dump_json()).fixed == 2  # the counts survive JSON


def test_the_junit_xml_has_a_case_per_case_and_the_right_counts() -> None:
    report = _report()
    errored = report.model_copy(
        update={"results": [*report.results[:-1], report.results[-1].model_copy(update={"correct": False, "output": None, "error": "boom"})]}
    )
    root = ElementTree.fromstring(render_junit(errored))
    suite = root.find("testsuite")
    assert suite is not None and suite.get("tests") == "10" and suite.get("failures") == "3" and suite.get("errors") == "1"
    cases = suite.findall("testcase")
    assert [case.get("name") for case in cases] == [f"c{index}" for index in range(10)]
    assert sum(case.find("failure") is not None for case in cases) == 3 and cases[-1].find("error") is not None
    failure = cases[2].find("failure")
    assert failure is not None and "expected 'spam', got 'ham'" in str(failure.get("message"))
    odd = _report([("ok", "o\x19k\x00", ())])  # an output XML cannot hold as it is
    odd_failure = ElementTree.fromstring(render_junit(odd)).find("testsuite/testcase/failure")
    assert odd_failure is not None and "got: o\\x19k\\x00" in str(odd_failure.text)


def test_the_terminal_and_markdown_reports_show_failures_side_by_side() -> None:
    text = render_text(_report())
    assert "FAIL c2: text 2" in text and "expected: spam" in text and "got:      ham" in text
    assert "7/10 right, accuracy 70.0% (95% interval 39.7% to 89.2%)" in text and "confusion" in text
    markdown = render_markdown(_report())
    assert markdown.startswith("### `p`: 70.0% (7/10)") and "| `spam` | 3 | 66.7% | 66.7% |" in markdown
    assert marked_difference("immediate", "immediately") == "immediate{+ly+}"
    assert marked_difference("later", "never") == "[-lat-]{+nev+}er"
