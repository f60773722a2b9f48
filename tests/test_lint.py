"""Ruff's lint (the rules in pyproject.toml's [tool.ruff.lint]: those the code's noqa comments name, pycodestyle,
pyflakes and bugbear) passes on src, tests, examples and benchmarks."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_ruff_check_is_clean() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "ruff", "check", "--output-format", "concise", "src", "tests", "examples", "benchmarks"],
        cwd=ROOT, capture_output=True, text=True, timeout=300, check=False,
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
