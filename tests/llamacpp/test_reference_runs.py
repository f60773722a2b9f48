"""llama.cpp's reference runs happen in child processes: a native crash fails one test, named, and the suite goes on."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from pawfn.core import cpuinfo as cpuinfo_module
from pawfn.llamacpp import cpu
from tests.helpers.references import REPOSITORY, crash_report, llama_reference

AMX_CPU = "flags\t\t: fpu sse4_2 avx avx2 fma f16c bmi2 avx512f avx512cd avx512vl avx512dq avx512bw amx_tile amx_int8\n"


def test_a_crashing_reference_run_fails_its_test_naming_the_signal() -> None:
    with pytest.raises(pytest.fail.Exception, match=r"reference run \(segfault\) died with SIGSEGV") as failure:
        llama_reference({"op": "segfault"})
    assert "Fatal Python error: Segmentation fault" in str(failure.value)  # the child's stderr comes with it


def test_the_suite_goes_on_after_a_reference_run_crashes(tmp_path: Path) -> None:
    """A session whose reference run segfaults still runs its other tests and prints its summary line."""
    (tmp_path / "test_inner.py").write_text(
        "from tests.helpers.references import llama_reference\n\n"
        "def test_crashes():\n    llama_reference({'op': 'segfault'})\n\n"
        "def test_after():\n    assert True\n"
    )
    inner = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", str(tmp_path / "test_inner.py")],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=300,
        check=False,
        env={**os.environ, "PYTHONPATH": str(REPOSITORY)},
    )
    assert inner.returncode == 1, inner.stdout + inner.stderr
    assert "1 failed, 1 passed" in inner.stdout.splitlines()[-1]
    assert "died with SIGSEGV" in inner.stdout


def test_a_segfault_on_an_amx_build_names_the_upstream_issue(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(AMX_CPU)
    monkeypatch.setattr(cpuinfo_module, "CPUINFO", cpuinfo)
    monkeypatch.setattr(cpu, "llama_cpp_system_info", lambda: "CPU : AVX512 = 1 | AMX_INT8 = 1 | REPACK = 1 |")
    report = crash_report("generate", signal.SIGSEGV, "")
    assert "died with SIGSEGV" in report and cpu.AMX_ISSUE in report and "without AMX" in report
    monkeypatch.setattr(cpu, "llama_cpp_system_info", lambda: "CPU : AVX512 = 1 | REPACK = 1 |")
    assert cpu.AMX_ISSUE not in crash_report("generate", signal.SIGSEGV, "")
    assert "died with SIGABRT" in crash_report("generate", signal.SIGABRT, "")
