"""The serving load test (benchmarks/serve_load.py) within a CI budget: a real `pawfn serve --allow-load` on a real
HTTP hub, more programs than its budget, clients with faults mixed in, then a SIGTERM mid-load; every check of the
benchmark must hold (documented answers only, outputs equal to their calls alone, RSS within base + budget + 10%,
evicted programs answering again, no decoding after the clients leave, a clean exit in time, no traceback)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "serve_load.py"


def test_a_server_under_load_with_more_programs_than_its_budget(capsys: pytest.CaptureFixture[str]) -> None:
    arguments = ["--tiny", "--programs", "5", "--budget", "2", "--clients", "4", "--seconds", "6"]
    arguments += ["--sigterm-seconds", "4", "--graceful-timeout", "2"]
    result = subprocess.run([sys.executable, str(SCRIPT), *arguments], capture_output=True, text=True, timeout=600, check=False)
    with capsys.disabled():  # the figures, in CI's log
        print("\n" + result.stdout)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.splitlines()[-1] == "checks: all held"
    exact = re.search(r"outputs equal to their call alone: (\d+)/(\d+); programs answering: (\d+)/5; loads (\d+), evictions (\d+)", result.stdout)
    assert exact is not None, result.stdout
    assert exact.group(1) == exact.group(2) and int(exact.group(1)) > 20 and int(exact.group(5)) > 0
    assert "each program again after the load: 5/5 gave their tokens alone" in result.stdout
    for fault in ("invalid_encoding", "body_too_large", "unauthorized", "program_not_found", "max_tokens_too_large"):
        assert fault in result.stdout
