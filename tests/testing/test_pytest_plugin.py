"""pawfn's pytest plugin, as an application's test run meets it (a child pytest on a test file of its own): with
`--pawfn-no-real-programs` a real load fails naming the switch, a marked test may load one, the fixtures give a fake
and block real programs; without the switch nothing changes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.helpers.programs import TinyProgram

_APPLICATION_TESTS = """
import os
import pytest
from pawfn import PawFn, Qwen3_0_6B, Torch

FOLDER, BASE = os.environ["APPLICATION_PROGRAM"], os.environ["APPLICATION_BASE"]


def test_a_real_load() -> None:
    PawFn[Qwen3_0_6B, Torch].load_sync(FOLDER, base=BASE).close()


@pytest.mark.pawfn_real_programs
def test_a_marked_real_load() -> None:
    PawFn[Qwen3_0_6B, Torch].load_sync(FOLDER, base=BASE).close()


def test_the_fake_fixture(fake_program) -> None:
    assert fake_program(PawFn[Qwen3_0_6B, Torch], {"a": "b"}).run("a") == "b"


def test_the_blocking_fixture(no_real_programs) -> None:
    with pytest.raises(Exception, match="the pytest fixture no_real_programs"):
        PawFn[Qwen3_0_6B, Torch].load_sync(FOLDER, base=BASE)
"""


def _run(folder: Path, program: TinyProgram, *options: str) -> subprocess.CompletedProcess[str]:
    (folder / "test_application.py").write_text(_APPLICATION_TESTS)
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--rootdir", str(folder), str(folder), *options]
    environment = {**os.environ, "APPLICATION_PROGRAM": str(program.folder), "APPLICATION_BASE": str(program.interpreter.gguf_path)}
    return subprocess.run(command, capture_output=True, text=True, cwd=folder, env=environment, timeout=300, check=False)


def test_the_switch_fails_real_loads_and_names_itself(qwen3_program: TinyProgram, tmp_path: Path) -> None:
    blocked = _run(tmp_path, qwen3_program, "--pawfn-no-real-programs")
    assert "1 failed, 3 passed" in blocked.stdout, blocked.stdout
    assert "test_a_real_load" in blocked.stdout and "--pawfn-no-real-programs" in blocked.stdout and "RealProgramsBlockedError" in blocked.stdout
    open_run = _run(tmp_path, qwen3_program)
    assert "4 passed" in open_run.stdout, open_run.stdout
