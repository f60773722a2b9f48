"""`pawfn lock codegen`'s module: mypy and pyright, both strict, accept it and an application using it correctly, and
refuse a misuse of a program's output type in both; what codegen cannot generate is one `LockError` naming it."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from pawfn import LockError
from pawfn.hub.lockcode import generate_module
from pawfn.hub.lockfile import LockedProgram, LockFile, ReturnsPattern, ReturnsSchema

ROOT = Path(__file__).resolve().parents[2]
ENTRY = {
    "reference": "alice/email-triage",
    "program_id": "1111aaaa2222bbbb3333",
    "interpreter": "Qwen/Qwen3-0.6B",
    "adapter_sha256": "0" * 64,
    "template_sha256": "1" * 64,
}
TICKET: dict[str, object] = {
    "type": "object",
    "title": "Ticket",
    "properties": {
        "label": {"enum": ["urgent", "normal"]},
        "score": {"type": "integer"},
        "tags": {"type": "array", "items": {"type": "string"}},
        "owner": {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]},
    },
    "required": ["label", "score"],
}
APPLICATION = """\
from typing import Literal

from app.programs import Programs, Ticket, programs
from pawfn import GPT2, PawConfig, PawFn, Qwen3_0_6B, Torch, TypedFn


def use() -> None:
    label: Literal["immediate", "later", "never"] = programs.triage.run("x")
    count: int = programs.count.run("x")
    code: str = programs.code.run("x")
    ticket: Ticket = programs.ticket.run("x")
    score: int = ticket.score
    owner: str | None = None if ticket.owner is None else ticket.owner.name
    haiku: PawFn[GPT2, Torch] = programs.haiku
    text: str = haiku.run("x")
    typed: TypedFn[Literal["immediate", "later", "never"]] = Programs(PawConfig(offline=True)).triage
    print(label, count, code, score, owner, text, typed)
    programs.close()


def misuse() -> None:
    number: int = programs.triage.run("x")  # MISUSE
    yes: Literal["yes"] = programs.triage.run("x")  # MISUSE
    label: str = programs.ticket.run("x").label.upper()
    other: PawFn[Qwen3_0_6B, Torch] = programs.haiku  # MISUSE: a GPT-2 program
    programs.triage.run(3)  # MISUSE
    print(number, yes, label, other)
"""


def _lock() -> LockFile:
    programs = {
        "triage": LockedProgram.model_validate(ENTRY | {"returns": ["immediate", "later", "never"]}),
        "count": LockedProgram.model_validate(ENTRY | {"returns": "int"}),
        "code": LockedProgram(**ENTRY, returns=ReturnsPattern(pattern=r"[A-Z]{3}-[0-9]{4}")),
        "ticket": LockedProgram(**ENTRY, returns=ReturnsSchema(json_schema=TICKET)),
        "haiku": LockedProgram.model_validate(ENTRY | {"interpreter": "gpt2"}),
    }
    return LockFile(programs=programs)


def _errors_by_line(output: str, pattern: str) -> dict[int, str]:
    return {int(match.group("line")): match.group(0) for match in re.finditer(pattern, output, flags=re.MULTILINE)}


def test_the_generated_module_passes_both_checkers_strict_and_a_misuse_fails_in_both(tmp_path: Path) -> None:
    module = tmp_path / "app" / "programs.py"
    module.parent.mkdir()
    (module.parent / "__init__.py").write_text("")
    module.write_text(generate_module(_lock(), tmp_path / "pawfn.lock", module, "torch"), encoding="utf-8")
    application = tmp_path / "application.py"
    application.write_text(APPLICATION, encoding="utf-8")
    misuses = {number for number, line in enumerate(APPLICATION.splitlines(), start=1) if "# MISUSE" in line}
    assert len(misuses) == 4

    mypy = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-error-summary", "--show-error-codes", "--no-pretty", "app/programs.py", "application.py"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=False,
        timeout=900,
    )
    found = _errors_by_line(mypy.stdout, r"^(?P<file>[\w/.]+):(?P<line>\d+): error: .*$")
    assert not [line for line in mypy.stdout.splitlines() if line.startswith("app/")], mypy.stdout
    assert set(found) == misuses, mypy.stdout

    (tmp_path / "pyrightconfig.json").write_text(json.dumps({"typeCheckingMode": "strict", "pythonVersion": "3.11"}), encoding="utf-8")
    pyright = subprocess.run(
        [sys.executable, "-m", "pyright", "--outputjson", "app/programs.py", "application.py"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=False,
        timeout=900,
    )
    report = json.loads(pyright.stdout)
    errors = [d for d in report["generalDiagnostics"] if d["severity"] == "error"]
    assert not [d for d in errors if d["file"].endswith("programs.py")], errors
    assert {d["range"]["start"]["line"] + 1 for d in errors} == misuses, errors


def test_what_codegen_cannot_generate_is_named(tmp_path: Path) -> None:
    lock, module = tmp_path / "pawfn.lock", tmp_path / "programs.py"
    cases: list[tuple[dict[str, object], str]] = [
        (TICKET | {"oneOf": []}, r"programs\.ticket\.returns\.json_schema: pawfn lock codegen does not generate oneOf"),
        ({"type": "object", "properties": {"class": {"type": "string"}}}, r"property 'class' cannot be a pydantic field name"),
        ({"type": "null"}, r"type 'null' is not one codegen generates"),
        ({"type": "array", "items": {"enum": [1, 2]}}, r"json_schema\.items: enum must be a list of texts"),
    ]
    for schema, problem in cases:
        bad = LockFile(programs={"ticket": LockedProgram(**ENTRY, returns=ReturnsSchema(json_schema=schema))})
        with pytest.raises(LockError, match=problem):
            generate_module(bad, lock, module, "torch")
    with pytest.raises(LockError, match=r"programs\.close: the generated handles keep that name"):
        generate_module(LockFile(programs={"close": LockedProgram.model_validate(ENTRY)}), lock, module, "torch")
    with pytest.raises(LockError, match=r"interpreter 'someone/else' is none that pawfn runs"):
        generate_module(LockFile(programs={"x": LockedProgram.model_validate(ENTRY | {"interpreter": "someone/else"})}), lock, module, "torch")


def test_texts_from_the_lock_reach_the_code_only_as_literals(tmp_path: Path) -> None:
    """A choice or a pattern holding quotes, newlines or code stays a string: the module compiles and holds no statement of it."""
    hostile = ['a"\n__import__("os").system("boom")\n"', "b'''", "c\\"]
    lock = LockFile(
        programs={"triage": LockedProgram(**ENTRY, returns=hostile), "code": LockedProgram(**ENTRY, returns=ReturnsPattern(pattern='"""x'))}
    )
    text = generate_module(lock, tmp_path / "pawfn.lock", tmp_path / "programs.py", "llamacpp")
    compile(text, "programs.py", "exec")
    assert not [line for line in text.splitlines() if line.lstrip().startswith("__import__")]
    assert "from pawfn import LlamaCpp," in text and "PawFn[Qwen3_0_6B, LlamaCpp]" in text
