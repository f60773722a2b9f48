"""The examples run end to end: the local ones on the tiny generated programs, the hub ones up to their clear
message when no API key or no hub is there."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from pawfn import PawFn, Qwen3_0_6B, RuntimeOptions, Torch
from tests.helpers.programs import TinyProgram, requires_llama_cpp
from tests.helpers.servers import KEY, SECOND_ID, ServeProcess

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def _run(name: str, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(EXAMPLES / f"{name}.py"), *args], capture_output=True, text=True, check=False, timeout=300, env=env)


def test_typed_api_example(qwen3_program: TinyProgram, gpt2_program: TinyProgram) -> None:
    result = _run(
        "typed_api",
        "--qwen3-program",
        str(qwen3_program.archive),
        "--qwen3-base",
        str(qwen3_program.interpreter.gguf_path),
        "--gpt2-program",
        str(gpt2_program.folder),
        "--gpt2-base",
        str(gpt2_program.interpreter.hf_dir),
        "--input",
        "Urgent: the server is down!",
        "--max-tokens",
        "6",
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.strip().split("\n")
    assert lines[0].startswith("qwen3 (Qwen/Qwen3-0.6B): '") and lines[1].startswith("gpt2 (gpt2): '")


def test_library_functions_example(qwen3_program: TinyProgram) -> None:
    result = _run(
        "library_functions",
        "--program",
        str(qwen3_program.folder),
        "--base",
        str(qwen3_program.interpreter.gguf_path),
        "--input",
        "Urgent: the server is down!",
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("0123456789abcdef0123 on Qwen/Qwen3-0.6B, 2048-token context\n")


def test_qwen3_inference_example(qwen3_program: TinyProgram) -> None:
    result = _run(
        "qwen3_inference",
        "--program",
        str(qwen3_program.archive),
        "--base",
        str(qwen3_program.interpreter.gguf_path),
        "--input",
        "hello",
        "--input",
        "Server down!",
        "--max-tokens",
        "4",
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.strip().split("\n")
    assert lines[0].startswith("loaded in ") and len(lines) == 3
    assert lines[1].startswith("'hello' -> ") and "(4 tokens, max_tokens, " in lines[1]


def test_parallel_benchmark_example(qwen3_program: TinyProgram) -> None:
    result = _run(
        "parallel_benchmark",
        "--program",
        str(qwen3_program.folder),
        "--base",
        str(qwen3_program.interpreter.gguf_path),
        "--concurrency",
        "4",
        "--calls",
        "8",
        "--max-tokens",
        "5",
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("Qwen/Qwen3-0.6B: ") and result.stdout.strip().endswith("same tokens as alone: True")


def test_verify_bundle_example(gpt2_program_q4: TinyProgram) -> None:
    result = _run("verify_bundle", "--program", str(gpt2_program_q4.archive))
    assert result.returncode == 0, result.stderr
    assert "program 0123456789abcdef0123 for gpt2 (GPT2)" in result.stdout
    assert "alpha 16.0" in result.stdout and "Q4_0" in result.stdout


def test_verify_bundle_example_reports_a_broken_bundle(tmp_path: Path) -> None:
    (tmp_path / "meta.json").write_text("{}", encoding="utf-8")
    result = _run("verify_bundle", "--program", str(tmp_path))
    assert result.returncode == 1 and result.stderr.startswith("verify_bundle: ") and result.stderr.count("\n") == 1


def test_download_and_save_example_round_trips_a_local_bundle(qwen3_program: TinyProgram, tmp_path: Path) -> None:
    out = tmp_path / "copy.paw"
    result = _run("download_and_save", "--program", str(qwen3_program.archive), "--out", str(out))
    assert result.returncode == 0, result.stderr
    assert "round trip identical" in result.stdout and out.is_file()


@requires_llama_cpp
@pytest.mark.parametrize("name", ["verify_backend", "compare_backends", "llamacpp_benchmark"])
def test_llama_cpp_examples(gpt2_program: TinyProgram, name: str) -> None:
    args = ["--program", str(gpt2_program.folder), "--base", str(gpt2_program.interpreter.gguf_path)]
    if name != "llamacpp_benchmark":
        args += ["--input", "hello", "--input", "Server down!", "--max-tokens", "8"]
    else:
        args += ["--runs", "2", "--max-tokens", "4"]
    result = _run(name, *args)
    assert result.returncode == 0, result.stdout + result.stderr
    if name == "verify_backend":
        assert result.stdout.count("ok    ") == 2
    elif name == "compare_backends":
        lines = result.stdout.strip().split("\n")
        assert [line.split()[0] for line in lines] == ["torch", "torch", "llamacpp", "llamacpp"]
        torch_outputs = [line.split(" (")[0].split(maxsplit=1)[1] for line in lines[:2]]
        assert torch_outputs == [line.split(" (")[0].split(maxsplit=1)[1] for line in lines[2:]]  # same greedy text
    else:
        assert result.stdout.startswith("gpt2 on llama.cpp: load ") and "tokens/s" in result.stdout


def _offline_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PAW_")}
    return env | {"PAW_CONFIG_FILE": str(tmp_path / "none.json"), "PAW_CACHE_DIR": str(tmp_path / "cache")} | extra


def test_high_level_example_says_it_needs_a_key(tmp_path: Path) -> None:
    result = _run("high_level", env=_offline_env(tmp_path))
    assert result.returncode == 1
    assert result.stderr == "high_level: compiling needs a PAW API key: set PAW_API_KEY or run `pawfn login`\n"


def test_low_level_example_says_the_hub_is_unreachable(tmp_path: Path) -> None:
    result = _run("low_level", env=_offline_env(tmp_path, PAW_API_URL="http://127.0.0.1:9"))
    assert result.returncode == 1
    assert result.stderr.startswith("low_level: program email-triage: cannot reach http://127.0.0.1:9")
    assert result.stderr.count("\n") == 1


def test_remote_client_example(server: ServeProcess, local_runs: dict[str, PawFn[Qwen3_0_6B, Torch]]) -> None:
    result = _run(
        "remote_client",
        "--server",
        server.url,
        "--program",
        "tiny-second",
        "--key-env",
        "PAWFN_TEST_KEY",
        "--input",
        "hello world",
        "--input",
        "Server down!",
        "--max-tokens",
        "6",
        env={**os.environ, "PAWFN_TEST_KEY": KEY},
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.strip().split("\n")
    expected = local_runs[SECOND_ID].run_with("hello world", RuntimeOptions(max_tokens=6))
    assert lines[0] == f"{SECOND_ID} on {server.url}: Qwen/Qwen3-0.6B, {local_runs[SECOND_ID].prefix_tokens}-token prefix"
    assert lines[1] == f"'hello world' -> {expected!r}"


def test_remote_client_example_without_a_server_says_so() -> None:
    result = _run("remote_client", "--server", "http://127.0.0.1:9", "--program", "x", "--input", "y", env=dict(os.environ))
    assert result.returncode == 1 and result.stderr.startswith("remote_client: ") and "cannot reach" in result.stderr


def test_typed_outputs_example(qwen3_program: TinyProgram) -> None:
    result = _run("typed_outputs", "--program", str(qwen3_program.archive), "--base", str(qwen3_program.interpreter.gguf_path))
    assert result.returncode == 0, result.stderr
    first = result.stdout.splitlines()[0]
    assert first.startswith("label='") and " urgent=" in first and " minutes=" in first
    assert result.stdout.splitlines()[1].startswith(("ticket=Ticket(", "no ticket: the output is not a JSON value"))
