"""mypy --strict (mypy.ini) and pyright strict (pyproject.toml) pass on src/, tests/ and examples/."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _run(*command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=False, timeout=900)


def test_mypy_strict() -> None:
    result = _run(sys.executable, "-m", "mypy")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Success: no issues found" in result.stdout


def test_pyright_strict() -> None:
    result = _run(sys.executable, "-m", "pyright", "--pythonpath", sys.executable)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 errors" in result.stdout
