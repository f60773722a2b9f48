"""`pawfn bench`: the figures and the configuration, from ordinary calls that compute what a plain run computes."""

from __future__ import annotations

import json

import pytest

from pawfn import PawFn, Qwen3_0_6B, RuntimeOptions, Torch
from pawfn.api.bench import run_bench
from pawfn.cli import main
from tests.helpers.programs import TinyProgram

FIGURES = {"load_s", "median_ms", "p90_ms", "ms_per_token", "tokens_per_call", "calls_per_s", "peak_rss_mb"}


def test_bench_json_has_the_figures_and_the_configuration(qwen3_program: TinyProgram, capsys: pytest.CaptureFixture[str]) -> None:
    argv = [
        "bench",
        "--program",
        str(qwen3_program.folder),
        "--base",
        str(qwen3_program.interpreter.gguf_path),
        "--runs",
        "4",
        "--concurrency",
        "2",
        "--max-model-copies",
        "2",
        "--max-tokens",
        "5",
        "--json",
    ]
    assert main(argv) == 0
    record = json.loads(capsys.readouterr().out)
    assert FIGURES <= set(record)
    assert all(isinstance(record[key], float) and record[key] > 0 for key in FIGURES)
    assert record["runs"] == 4 and record["concurrency"] == 2 and record["max_model_copies"] == 2
    assert record["backend"] == "torch" and record["dtype"] == "float32" and record["max_tokens"] == 5
    assert record["tokens_per_call"] == 5.0  # a random model never says EOS within 5 tokens
    assert record["p90_ms"] >= record["median_ms"]


def test_bench_table(qwen3_program: TinyProgram, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["bench", "--program", str(qwen3_program.folder), "--base", str(qwen3_program.interpreter.gguf_path), "--runs", "2", "--input", "hello"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "on torch, cpu, float32" in out and "median call" in out and "peak RSS" in out


def test_bench_calls_compute_what_plain_calls_compute(qwen3_program: TinyProgram) -> None:
    options = RuntimeOptions(max_tokens=6)
    inputs = ["hello", "Urgent: the server is down!", "the lazy dog"]
    with PawFn[Qwen3_0_6B, Torch].load_sync(qwen3_program.folder, base=qwen3_program.interpreter.gguf_path) as program:
        plain = [program.generate(text, options).token_ids for text in inputs]
        _, generations = run_bench(program, inputs, options, runs=6, concurrency=3, load_s=0.0, reference="x")
    assert [g.token_ids for g in generations] == plain * 2


def test_bench_refuses_zero_runs(qwen3_program: TinyProgram, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "--program", str(qwen3_program.folder), "--runs", "0"]) == 2
    assert capsys.readouterr().err == "pawfn: error: invalid --runs=0: expected an integer >= 1\n"
