"""`pawfn run`: text and JSON Lines output, one-line errors with a non-zero exit, tracebacks only with --debug."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from conftest import TinyProgram
from pawfn import PawConfig, PawFn, Qwen3_0_6B, RuntimeOptions, Torch
from pawfn.cli import main


def _expected(program: TinyProgram, text: str, max_tokens: int) -> tuple[str, tuple[int, ...]]:
    with PawFn[Qwen3_0_6B, Torch].from_path(program.folder, base=program.interpreter.gguf_path, config=PawConfig()) as f:
        generation = f.generate(text, RuntimeOptions(max_tokens=max_tokens))
    return generation.text, generation.token_ids


def test_text_output(qwen3_program: TinyProgram, capsys: pytest.CaptureFixture[str]) -> None:
    base = str(qwen3_program.interpreter.gguf_path)
    status = main(["run", "--program", str(qwen3_program.archive), "--base", base, "--input", "hello",
                   "--input", "Urgent: the server is down!", "--max-tokens", "8"])
    out = capsys.readouterr().out
    assert status == 0
    assert out.split("\n")[:2] == [_expected(qwen3_program, "hello", 8)[0], _expected(qwen3_program, "Urgent: the server is down!", 8)[0]]


def test_json_lines(gpt2_program: TinyProgram, capsys: pytest.CaptureFixture[str]) -> None:
    base = str(gpt2_program.interpreter.hf_dir)
    threads = torch.get_num_threads()
    status = main(["run", "--program", str(gpt2_program.folder), "--base", base, "--input", "a", "--input", "b c",
                   "--max-tokens", "6", "--json", "--threads", "1"])
    assert torch.get_num_threads() == 1
    torch.set_num_threads(threads)
    lines = capsys.readouterr().out.strip().split("\n")
    assert status == 0 and len(lines) == 2
    records = [json.loads(line) for line in lines]
    assert [r["input"] for r in records] == ["a", "b c"]
    for record in records:
        assert record["program"] == "0123456789abcdef0123"
        assert record["interpreter"] == "gpt2"
        assert len(record["tokens"]) == 6 and record["stop_reason"] == "max_tokens"
        assert isinstance(record["output"], str)
        assert set(record["timings"]) == {"tokenize_ms", "prompt_ms", "generate_ms", "total_ms"}


@pytest.mark.parametrize(
    ("args", "message", "status"),
    [
        (["--program", "{missing}"], "no such bundle", 1),
        (["--program", "{program}", "--base", "{missing}"], "base weights not found", 1),
        (["--program", "{program}", "--temperature", "-1"], "invalid --temperature: Input should be greater than", 2),
        (["--program", "{program}", "--device", "tpu"], "invalid option: device: Input should be 'cpu', 'mps', 'cuda'", 2),
        (["--program", "{program}", "--n-ctx", "8"], "context overflow", 1),
    ],
)
def test_errors_are_one_line(
    qwen3_program: TinyProgram, tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], message: str, status: int
) -> None:
    values = {"program": str(qwen3_program.folder), "missing": str(tmp_path / "missing.paw")}
    argv = ["run", "--input", "x", "--base", str(qwen3_program.interpreter.gguf_path)]
    argv += [a.format(**values) for a in args]
    assert main(argv) == status
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.count("\n") == 1 and captured.err.startswith("pawfn: error: ")
    assert message in captured.err
    assert "Traceback" not in captured.err


def test_debug_prints_the_traceback(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--debug", "run", "--program", str(tmp_path / "missing"), "--input", "x"]) == 1
    err = capsys.readouterr().err
    assert "Traceback (most recent call last)" in err and err.rstrip().endswith("pass a .paw file, a bundle folder, a program id or a slug")


def test_console_script_runs(qwen3_program: TinyProgram) -> None:
    """The installed `pawfn` entry point (python -m pawfn) works end to end in a fresh process."""
    base = str(qwen3_program.interpreter.gguf_path)
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    result = subprocess.run(
        [sys.executable, "-m", "pawfn", "run", "--program", str(qwen3_program.folder), "--base", base,
         "--input", "hello", "--max-tokens", "5", "--json"],
        capture_output=True, text=True, check=False, env=env, timeout=300,
    )
    assert result.returncode == 0, result.stderr
    record = json.loads(result.stdout)
    assert tuple(record["tokens"]) == _expected(qwen3_program, "hello", 5)[1]


def test_usage_error_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["run", "--input", "x"])
    assert info.value.code == 2
    assert "--program" in capsys.readouterr().err
