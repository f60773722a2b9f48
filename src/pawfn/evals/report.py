"""What an evaluation found, and its renderings: a terminal report, Markdown, JSON (the models themselves) and JUnit
XML (one test case per case, so a CI system shows each)."""

from __future__ import annotations

import difflib
import re
from collections import Counter
from xml.etree import ElementTree

from pydantic import BaseModel, ConfigDict, computed_field

from .cases import EvalCase
from .stats import mcnemar_exact, precision_recall, wilson_interval

__all__ = [
    "CaseResult",
    "Comparison",
    "EvalReport",
    "GroupScore",
    "LabelScore",
    "marked_difference",
    "render_comparison",
    "render_markdown",
    "render_text",
    "render_junit",
]

_MAX_LABELS = 20
"""Expected outputs count as labels (a confusion table, per-label figures) when there are at most this many
distinct ones, each a short single line."""
_OTHER = "(other)"
"""An output that is none of the labels, in the confusion table."""


class CaseResult(BaseModel):
    """One case's outcome: the output (None where the call failed), whether it is right, and the error if any."""

    model_config = ConfigDict(frozen=True)

    case: EvalCase
    output: str | None
    correct: bool
    error: str | None = None
    detail: str | None = None
    """What differs, where a typed program's values are compared (the fields of a pydantic model by name)."""


class GroupScore(BaseModel):
    """Accuracy over one tag's cases."""

    tag: str
    correct: int
    total: int

    @computed_field  # type: ignore[prop-decorator]  # pydantic's documented use: a property in the dump
    @property
    def accuracy(self) -> float:
        return self.correct / self.total if self.total else 0.0


class LabelScore(BaseModel):
    """One label's precision (of outputs that were it, the share right) and recall (of its cases, the share found)."""

    label: str
    support: int
    """Cases whose expected output is this label."""
    precision: float | None
    recall: float | None


class EvalReport(BaseModel):
    """Every case's outcome for one program, and the figures over them."""

    program: str
    scorer: str
    seconds: float
    results: list[CaseResult]

    @computed_field  # type: ignore[prop-decorator]  # pydantic computed field: mypy does not know decorated properties
    @property
    def total(self) -> int:
        return len(self.results)

    @computed_field  # type: ignore[prop-decorator]  # pydantic computed field: mypy does not know decorated properties
    @property
    def correct(self) -> int:
        return sum(result.correct for result in self.results)

    @computed_field  # type: ignore[prop-decorator]  # pydantic computed field: mypy does not know decorated properties
    @property
    def errors(self) -> int:
        """Cases whose call or scorer raised (counted wrong)."""
        return sum(result.error is not None for result in self.results)

    @computed_field  # type: ignore[prop-decorator]  # pydantic computed field: mypy does not know decorated properties
    @property
    def accuracy(self) -> float:
        return self.correct / self.total if self.total else 0.0

    @computed_field  # type: ignore[prop-decorator]  # pydantic computed field: mypy does not know decorated properties
    @property
    def interval(self) -> tuple[float, float]:
        """Accuracy's 95% interval (Wilson)."""
        return wilson_interval(self.correct, self.total)

    @computed_field  # type: ignore[prop-decorator]  # pydantic computed field: mypy does not know decorated properties
    @property
    def by_tag(self) -> list[GroupScore]:
        totals: Counter[str] = Counter()
        rights: Counter[str] = Counter()
        for result in self.results:
            for tag in result.case.tags:
                totals[tag] += 1
                rights[tag] += result.correct
        return [GroupScore(tag=tag, correct=rights[tag], total=totals[tag]) for tag in sorted(totals)]

    @computed_field  # type: ignore[prop-decorator]  # pydantic computed field: mypy does not know decorated properties
    @property
    def labels(self) -> list[str] | None:
        """The expected outputs, when they are labels (at most 20 distinct short single lines); else None."""
        found = sorted({result.case.expected for result in self.results})
        if not found or len(found) > _MAX_LABELS or any("\n" in label or len(label) > 64 for label in found):
            return None
        return found

    @computed_field  # type: ignore[prop-decorator]  # pydantic computed field: mypy does not know decorated properties
    @property
    def label_scores(self) -> list[LabelScore] | None:
        labels = self.labels
        if labels is None:
            return None
        expected = [result.case.expected for result in self.results]
        got = [_label_of(result) for result in self.results]
        scores: list[LabelScore] = []
        for label in labels:
            precision, recall = precision_recall(expected, got, label)
            scores.append(LabelScore(label=label, support=expected.count(label), precision=precision, recall=recall))
        return scores

    @computed_field  # type: ignore[prop-decorator]  # pydantic computed field: mypy does not know decorated properties
    @property
    def confusion(self) -> dict[str, dict[str, int]] | None:
        """expected label -> output label -> cases (an output that is no label counts as `(other)`), when labels."""
        labels = self.labels
        if labels is None:
            return None
        table: dict[str, dict[str, int]] = {label: {} for label in labels}
        for result in self.results:
            output = _label_of(result)
            column = output if output in table else _OTHER
            row = table[result.case.expected]
            row[column] = row.get(column, 0) + 1
        return table

    @property
    def failures(self) -> list[CaseResult]:
        return [result for result in self.results if not result.correct]


def _label_of(result: CaseResult) -> str:
    """The label an output counts as: its case's when the scorer took it as right (normalized text, say), else the
    output itself (nothing where the call failed)."""
    return result.case.expected if result.correct else (result.output or "")


class Comparison(BaseModel):
    """Two reports on the same cases, paired case by case."""

    first: EvalReport
    second: EvalReport

    def _pairs(self) -> list[tuple[bool, bool]]:
        seconds = {result.case.id: result.correct for result in self.second.results}
        return [(result.correct, seconds[result.case.id]) for result in self.first.results]

    @computed_field  # type: ignore[prop-decorator]  # pydantic computed field: mypy does not know decorated properties
    @property
    def both_right(self) -> int:
        return sum(1 for a, b in self._pairs() if a and b)

    @computed_field  # type: ignore[prop-decorator]  # pydantic computed field: mypy does not know decorated properties
    @property
    def fixed(self) -> int:
        """Wrong in the first, right in the second."""
        return sum(1 for a, b in self._pairs() if not a and b)

    @computed_field  # type: ignore[prop-decorator]  # pydantic computed field: mypy does not know decorated properties
    @property
    def broken(self) -> int:
        """Right in the first, wrong in the second."""
        return sum(1 for a, b in self._pairs() if a and not b)

    @computed_field  # type: ignore[prop-decorator]  # pydantic computed field: mypy does not know decorated properties
    @property
    def both_wrong(self) -> int:
        return sum(1 for a, b in self._pairs() if not a and not b)

    @computed_field  # type: ignore[prop-decorator]  # pydantic computed field: mypy does not know decorated properties
    @property
    def p_value(self) -> float:
        """The exact McNemar test's two-sided p-value for the fixed and broken cases."""
        return mcnemar_exact(self.fixed, self.broken)


def marked_difference(expected: str, got: str) -> str:
    """`got` against `expected` in one line: what is only in the expected text `[-so-]`, only in the output `{+so+}`."""
    out: list[str] = []
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(None, expected, got, autojunk=False).get_opcodes():
        if tag == "equal":
            out.append(expected[i1:i2])
            continue
        if i2 > i1:
            out.append(f"[-{expected[i1:i2]}-]")
        if j2 > j1:
            out.append(f"{{+{got[j1:j2]}+}}")
    return "".join(out)


def _percent(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


def _one_line(text: str, limit: int = 200) -> str:
    shown = text.replace("\n", "\\n")
    return shown if len(shown) <= limit else shown[: limit - 3] + "..."


def render_text(report: EvalReport, failures_shown: int = 20) -> str:
    """The report as a person reads it in a terminal: the failing cases (expected, got, the difference), accuracy with
    its interval, per label and per tag."""
    lines: list[str] = []
    failures = report.failures
    for result in failures[:failures_shown]:
        lines.append(f"FAIL {result.case.id}: {_one_line(result.case.input, 80)}")
        lines.append(f"  expected: {_one_line(result.case.expected)}")
        if result.error is not None:
            lines.append(f"  error:    {_one_line(result.error)}")
        else:
            got = result.output or ""
            lines.append(f"  got:      {_one_line(got)}")
            lines.append(f"  diff:     {_one_line(result.detail or marked_difference(result.case.expected, got))}")
    if len(failures) > failures_shown:
        lines.append(f"... and {len(failures) - failures_shown} more failing cases (--json lists them all)")
    low, high = report.interval
    lines.append(
        f"{report.program}: {report.correct}/{report.total} right, accuracy {_percent(report.accuracy)} "
        f"(95% interval {_percent(low)} to {_percent(high)}), {report.errors} errors, scorer {report.scorer}, {report.seconds:.1f} s"
    )
    if report.label_scores is not None and report.confusion is not None:
        lines.append("")
        lines.extend(
            _table(
                ["label", "cases", "precision", "recall"],
                [[s.label, str(s.support), _percent(s.precision), _percent(s.recall)] for s in report.label_scores],
            )
        )
        columns = [*report.confusion, _OTHER]
        lines.append("")
        lines.append("confusion (rows: expected, columns: output)")
        lines.extend(_table(["", *columns], [[label, *(str(row.get(column, 0)) for column in columns)] for label, row in report.confusion.items()]))
    if report.by_tag:
        lines.append("")
        lines.extend(
            _table(["tag", "right", "cases", "accuracy"], [[g.tag, str(g.correct), str(g.total), _percent(g.accuracy)] for g in report.by_tag])
        )
    return "\n".join(lines)


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    widths = [max(len(row[index]) for row in [header, *rows]) for index in range(len(header))]
    return ["  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip() for row in [header, *rows]]


def render_comparison(comparison: Comparison) -> str:
    """The paired counts of two runs on the same cases, and McNemar's p-value."""
    first, second = comparison.first, comparison.second
    return "\n".join(
        [
            f"{first.program}: {_percent(first.accuracy)}   {second.program}: {_percent(second.accuracy)}   ({first.total} cases)",
            f"both right {comparison.both_right}, fixed {comparison.fixed} (right only in the second), "
            f"broken {comparison.broken} (right only in the first), both wrong {comparison.both_wrong}",
            f"exact McNemar p-value: {comparison.p_value:.4g}",
        ]
    )


def render_markdown(report: EvalReport) -> str:
    """The report as Markdown (a CI job's summary, a pull request comment)."""
    low, high = report.interval
    lines = [
        f"### `{report.program}`: {_percent(report.accuracy)} ({report.correct}/{report.total})",
        "",
        f"95% interval {_percent(low)} to {_percent(high)}; {report.errors} errors; scorer `{report.scorer}`.",
    ]
    if report.label_scores is not None:
        lines += ["", "| label | cases | precision | recall |", "| --- | --- | --- | --- |"]
        lines += [f"| `{s.label}` | {s.support} | {_percent(s.precision)} | {_percent(s.recall)} |" for s in report.label_scores]
    if report.by_tag:
        lines += ["", "| tag | right | cases | accuracy |", "| --- | --- | --- | --- |"]
        lines += [f"| {g.tag} | {g.correct} | {g.total} | {_percent(g.accuracy)} |" for g in report.by_tag]
    if report.failures:
        lines += ["", "| case | expected | got |", "| --- | --- | --- |"]
        lines += [
            f"| {f.case.id} | `{_one_line(f.case.expected, 60)}` | `{_one_line(f.output or f.error or '', 60)}` |".replace("|`", "| `")
            for f in report.failures[:50]
        ]
    return "\n".join(lines)


_NOT_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]")
"""Characters XML 1.0 cannot hold, even escaped (a program's output may have any)."""


def _xml(text: str) -> str:
    """`text` with the characters XML cannot hold written as Python escapes (`\\x19`)."""
    return _NOT_XML.sub(lambda found: repr(found.group())[1:-1], text)


def render_junit(report: EvalReport) -> str:
    """JUnit XML: one `testsuite` named after the program, one `testcase` per case, a `failure` (expected and got) for
    a wrong output, an `error` for a call or scorer that raised."""
    suite = ElementTree.Element(
        "testsuite",
        name=_xml(report.program),
        tests=str(report.total),
        failures=str(report.total - report.correct - report.errors),
        errors=str(report.errors),
        time=f"{report.seconds:.3f}",
    )
    for result in report.results:
        case = ElementTree.SubElement(suite, "testcase", classname=_xml(report.program), name=_xml(result.case.id))
        if result.error is not None:
            ElementTree.SubElement(case, "error", message=_xml(_one_line(result.error))).text = _xml(result.error)
        elif not result.correct:
            got = result.output or ""
            message = f"expected {_one_line(result.case.expected, 100)!r}, got {_one_line(got, 100)!r}"
            failure = ElementTree.SubElement(case, "failure", message=_xml(message))
            difference = result.detail or marked_difference(result.case.expected, got)
            failure.text = _xml(f"input: {result.case.input}\nexpected: {result.case.expected}\ngot: {got}\ndiff: {difference}")
    suites = ElementTree.Element("testsuites", tests=str(report.total), failures=suite.get("failures", "0"), errors=str(report.errors))
    suites.append(suite)
    return ElementTree.tostring(suites, encoding="unicode", xml_declaration=True)
