"""Ruff passes on src, tests, examples, benchmarks and scripts: its lint (the rules in pyproject.toml's
[tool.ruff.lint]: those the code's noqa comments name, pycodestyle, pyflakes and bugbear) and its formatter's check
(`ruff format` leaves every file as it is)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PATHS = ["src", "tests", "examples", "benchmarks", "scripts"]


def _ruff(*arguments: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ruff", *arguments, *PATHS], cwd=ROOT, capture_output=True, text=True, timeout=300, check=False)


def test_ruff_check_is_clean() -> None:
    result = _ruff("check", "--output-format", "concise")
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]


def test_ruff_format_leaves_every_file_as_it_is() -> None:
    result = _ruff("format", "--check")
    assert result.returncode == 0, "run `ruff format src tests examples benchmarks scripts`:\n" + result.stdout[-4000:] + result.stderr[-2000:]
