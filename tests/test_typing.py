"""The typing tests in tests/typing/: both checkers accept every unmarked line and refuse every marked one.

A line that must fail ends with `# expect-error: <mypy code>; <pyright rule>`. The test fails when a marked line
stops failing, fails for another reason, or when an unmarked line starts failing, under either tool.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TYPING = ROOT / "tests" / "typing"
FILES = sorted(TYPING.glob("*.py"))
_EXPECT = re.compile(r"#\s*expect-error:\s*([\w-]+)\s*;\s*(\w+)\s*$")
_MYPY_LINE = re.compile(r"^(?P<path>[^:]+):(?P<line>\d+): error: .*\[(?P<code>[\w-]+)\]$")


def _expectations(path: Path) -> dict[int, tuple[str, str]]:
    expected: dict[int, tuple[str, str]] = {}
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        match = _EXPECT.search(line)
        if match:
            expected[number] = (match.group(1), match.group(2))
    return expected


def _compare(tool: str, path: Path, found: dict[int, set[str]], expected: dict[int, str]) -> list[str]:
    problems = [f"{tool}: line {n} must fail with {code}, but passed" for n, code in expected.items() if n not in found]
    problems += [
        f"{tool}: line {n} must fail with {code}, but failed with {sorted(found[n])}"
        for n, code in expected.items()
        if n in found and code not in found[n]
    ]
    problems += [f"{tool}: unexpected error on line {n}: {sorted(codes)}" for n, codes in found.items() if n not in expected]
    return [f"{path.name}: {p}" for p in problems]


def test_there_are_typing_tests() -> None:
    assert FILES and all(_expectations(path) for path in FILES)


@pytest.mark.parametrize("path", FILES, ids=[p.name for p in FILES])
def test_mypy(path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "mypy", "--config-file", str(ROOT / "mypy.ini"), "--show-error-codes", "--no-error-summary", "--no-pretty", str(path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
        timeout=900,
    )
    found: dict[int, set[str]] = {}
    for line in result.stdout.splitlines():
        match = _MYPY_LINE.match(line.strip())
        if match:
            found.setdefault(int(match.group("line")), set()).add(match.group("code"))
        elif ": error:" in line:
            pytest.fail(f"unparsed mypy error: {line}")
    expected = {n: codes[0] for n, codes in _expectations(path).items()}
    assert _compare("mypy", path, found, expected) == [], result.stdout


@pytest.mark.parametrize("path", FILES, ids=[p.name for p in FILES])
def test_pyright(path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "pyright", "--outputjson", "--pythonpath", sys.executable, "--project", str(TYPING), str(path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
        timeout=900,
    )
    report = json.loads(result.stdout)
    found: dict[int, set[str]] = {}
    for diagnostic in report["generalDiagnostics"]:
        if diagnostic["severity"] == "error":
            line = diagnostic["range"]["start"]["line"] + 1
            found.setdefault(line, set()).add(diagnostic.get("rule", "error"))
    expected = {n: codes[1] for n, codes in _expectations(path).items()}
    assert _compare("pyright", path, found, expected) == [], json.dumps(report["generalDiagnostics"], indent=1)
