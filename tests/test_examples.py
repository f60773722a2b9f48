"""The examples run end to end on the tiny generated programs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.helpers.programs import TinyProgram

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def test_typed_api_example(qwen3_program: TinyProgram, gpt2_program: TinyProgram) -> None:
    result = subprocess.run(
        [
            sys.executable, str(EXAMPLES / "typed_api.py"),
            "--qwen3-program", str(qwen3_program.archive), "--qwen3-base", str(qwen3_program.interpreter.gguf_path),
            "--gpt2-program", str(gpt2_program.folder), "--gpt2-base", str(gpt2_program.interpreter.hf_dir),
            "--input", "Urgent: the server is down!", "--max-tokens", "6",
        ],
        capture_output=True, text=True, check=False, timeout=300,
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.strip().split("\n")
    assert lines[0].startswith("qwen3 (Qwen/Qwen3-0.6B): '") and lines[1].startswith("gpt2 (gpt2): '")


def test_library_functions_example(qwen3_program: TinyProgram) -> None:
    result = subprocess.run(
        [
            sys.executable, str(EXAMPLES / "library_functions.py"), "--program", str(qwen3_program.folder),
            "--base", str(qwen3_program.interpreter.gguf_path), "--input", "Urgent: the server is down!",
        ],
        capture_output=True, text=True, check=False, timeout=300,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("0123456789abcdef0123 on Qwen/Qwen3-0.6B, 2048-token context\n")
