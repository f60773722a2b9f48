"""Evaluating a program on your own cases: `evaluate(program, cases)` (and `aevaluate`), cases from a file or the
program's spec, exact, normalized or your own scoring, and reports for people and CI (`pawfn eval`)."""

from .cases import CaseImage, CasesError, EvalCase, log_cases, read_cases, spec_cases
from .report import CaseResult, Comparison, EvalReport, GroupScore, LabelScore, render_comparison, render_junit, render_markdown, render_text
from .runner import aevaluate, compare, evaluate
from .scoring import Scorer, exact, load_scorer, normalized
from .stats import mcnemar_exact, wilson_interval

__all__ = [
    "CaseImage",
    "CaseResult",
    "CasesError",
    "Comparison",
    "EvalCase",
    "EvalReport",
    "GroupScore",
    "LabelScore",
    "Scorer",
    "aevaluate",
    "compare",
    "evaluate",
    "exact",
    "load_scorer",
    "log_cases",
    "mcnemar_exact",
    "normalized",
    "read_cases",
    "render_comparison",
    "render_junit",
    "render_markdown",
    "render_text",
    "spec_cases",
    "wilson_interval",
]
