"""The soak (benchmarks/soak.py) within a CI budget: programs loaded and closed over and over with calls from
threads and asyncio tasks (a quarter cancelled), and the process's memory, open files and threads bounded."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "soak.py"


def test_soak_keeps_memory_files_and_threads_bounded(capsys: pytest.CaptureFixture[str]) -> None:
    result = subprocess.run(
        [sys.executable, str(SCRIPT), "--tiny", "--cycles", "8", "--calls", "100", "--rss-growth-mb", "64"],
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    with capsys.disabled():  # the bounds, in CI's log
        print("\n" + result.stdout)
    assert result.returncode == 0, result.stdout + result.stderr
    table = [row for row in map(str.split, result.stdout.splitlines()) if len(row) == 8 and row[0].isdigit()]
    assert len(table) == 8 and all(int(row[2]) > 0 for row in table)  # every cycle cancelled some tasks
    assert "held" in result.stdout.splitlines()[-1]
