"""PawFn[M, LlamaCpp]: llama.cpp itself behind the typed API gives the Torch backend's greedy tokens."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.helpers.programs import TinyProgram, requires_llama_cpp
from pawfn import GPT2, BaseModelError, InterpreterModel, LlamaCpp, PawFn, ProgramClosedError, Qwen3_0_6B, RuntimeOptions, Torch

pytestmark = [requires_llama_cpp, pytest.mark.llamacpp]
INPUTS = ["Urgent: the server is down!", "hello", "", "Résumé café ünïcödé 12345"]
OPTIONS = RuntimeOptions(max_tokens=16)


def _model(program: TinyProgram) -> type[InterpreterModel]:
    return Qwen3_0_6B if program.interpreter.family == "qwen3" else GPT2


@pytest.mark.parametrize("family", ["qwen3", "gpt2"])
def test_llama_cpp_backend_matches_torch(family: str, request: pytest.FixtureRequest) -> None:
    program: TinyProgram = request.getfixturevalue(f"{family}_program")
    base = program.interpreter.gguf_path
    model = _model(program)
    with PawFn.specialize(model, LlamaCpp).from_path(program.folder, base=base) as llama, PawFn.specialize(
        model, Torch
    ).from_path(program.folder, base=base) as torch_fn:
        assert type(llama).backend_type() is LlamaCpp
        for _ in range(2):  # the second round checks the rewind to the cached prefix
            for text in INPUTS:
                assert llama.generate(text, OPTIONS).token_ids == torch_fn.generate(text, OPTIONS).token_ids, text
        assert llama.prefix_tokens == torch_fn.prefix_tokens


def test_llama_cpp_runs_are_serialized(qwen3_program: TinyProgram) -> None:
    base = qwen3_program.interpreter.gguf_path
    with PawFn[Qwen3_0_6B, LlamaCpp].from_path(qwen3_program.folder, base=base) as function:
        expected = {text: function.generate(text, OPTIONS).token_ids for text in INPUTS}

        def run(text: str) -> tuple[str, tuple[int, ...]]:
            return text, function.generate(text, OPTIONS).token_ids

        with ThreadPoolExecutor(max_workers=4) as pool:
            assert all(tokens == expected[text] for text, tokens in pool.map(run, INPUTS * 3))
    with pytest.raises(ProgramClosedError):
        function.run("hello")


def test_llama_cpp_needs_a_gguf_base(qwen3_program: TinyProgram) -> None:
    with pytest.raises(BaseModelError, match="needs a GGUF file"):
        PawFn[Qwen3_0_6B, LlamaCpp].from_path(qwen3_program.folder, base=qwen3_program.interpreter.hf_dir)
