"""Many programs through a budgeted pool (benchmarks/program_budget.py) within a CI budget: RSS stays within the base
plus the budget's programs + 10%, the derived cache under its bound (its prefixes pruned), and programs evicted long
before give their first tokens when they load again."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "program_budget.py"


def test_forty_programs_through_a_pool_of_four(capsys: pytest.CaptureFixture[str]) -> None:
    arguments = ["--tiny", "--programs", "40", "--budget", "4", "--derived-bound", "100000"]  # about five tiny prefixes
    result = subprocess.run([sys.executable, str(SCRIPT), *arguments], capture_output=True, text=True, timeout=600, check=False)
    with capsys.disabled():  # the figures, in CI's log
        print("\n" + result.stdout)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.splitlines()[-1] == "checks: all held"
    counts = re.search(r"loads (\d+), evictions (\d+)", result.stdout)
    assert counts is not None and int(counts.group(1)) == 48 and int(counts.group(2)) == 44  # 40, and every fifth again
    derived = re.search(r"derived cache: max [0-9.]+ MiB after a load \((\d+) bytes\)", result.stdout)
    assert derived is not None and 0 < int(derived.group(1)) <= 100000
