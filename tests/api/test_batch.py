"""Batches of inputs (`PawFn.run_batch`) and calls across programs (`pawfn.run_many`): each result is what the
call gives alone, in call order. (They run one by one for now; batched decoding is issue 9's work.)"""

from __future__ import annotations

import asyncio

import pytest

import pawfn
from pawfn import ContextOverflowError, InterpreterModel, LlamaCpp, PawConfig, PawFn, RuntimeOptions, Torch
from tests.helpers.programs import TinyProgram, requires_llama_cpp

INPUTS = ["hello", "Urgent: the server is down! Customers wait and wait.", "a", "numbers 1 2 3"]


def _load(
    program: TinyProgram, backend: type[Torch] | type[LlamaCpp] = Torch, n_ctx: int = 2048
) -> PawFn[InterpreterModel, Torch] | PawFn[InterpreterModel, LlamaCpp]:
    config = PawConfig(n_ctx=n_ctx)
    if backend is Torch:
        return PawFn.load_any_sync(str(program.folder), Torch, base=program.interpreter.gguf_path, config=config)
    return PawFn.load_any_sync(str(program.folder), LlamaCpp, base=program.interpreter.gguf_path, config=config)


@pytest.mark.parametrize("family", ["qwen3", "gpt2"])
def test_run_batch_gives_each_input_its_own_result(family: str, request: pytest.FixtureRequest) -> None:
    program: TinyProgram = request.getfixturevalue(f"{family}_program")
    with _load(program) as loaded:
        for options in (RuntimeOptions(max_tokens=3), RuntimeOptions(max_tokens=9), RuntimeOptions(max_tokens=6, temperature=0.8, seed=7)):
            alone = [loaded.generate(text, options) for text in INPUTS]
            batch = loaded.generate_batch(INPUTS, options)
            assert [g.token_ids for g in batch] == [g.token_ids for g in alone]
            assert loaded.run_batch(INPUTS, options) == [g.text for g in alone]
            assert asyncio.run(loaded.arun_batch(INPUTS, options)) == [g.text for g in alone]
        assert loaded.run_batch([]) == []


def test_run_batch_refuses_one_string_and_raises_an_overflow(qwen3_program: TinyProgram) -> None:
    with _load(qwen3_program, n_ctx=64) as loaded:
        with pytest.raises(TypeError, match="not one string"):
            loaded.run_batch("hello")
        with pytest.raises(ContextOverflowError):
            loaded.run_batch(["hello", "word " * 200], RuntimeOptions(max_tokens=2))


def test_run_many_keeps_call_order_across_programs_and_interpreters(
    qwen3_program: TinyProgram, qwen3_program_q4: TinyProgram, gpt2_program: TinyProgram
) -> None:
    options = RuntimeOptions(max_tokens=5)
    with _load(qwen3_program) as first, _load(qwen3_program_q4) as second, _load(gpt2_program) as third:
        calls = [(first, "hello"), (third, "a b"), (second, "hello"), (first, "numbers 1 2 3"), (third, "x")]
        alone = [program.generate(text, options) for program, text in calls]
        assert [g.token_ids for g in pawfn.generate_many(calls, options)] == [g.token_ids for g in alone]
        assert pawfn.run_many(calls, options) == [g.text for g in alone]
        assert asyncio.run(pawfn.arun_many(calls, options)) == [g.text for g in alone]
        with pytest.raises(TypeError, match=r"calls\[1\] is .* not a \(program, input\) pair"):
            pawfn.run_many([(first, "x"), ("x", first)])  # type: ignore[list-item]  # pyright: ignore[reportArgumentType]  # a wrong call on purpose


@requires_llama_cpp
def test_the_llamacpp_backend_takes_the_same_calls(qwen3_program: TinyProgram) -> None:
    options = RuntimeOptions(max_tokens=4)
    with _load(qwen3_program, LlamaCpp) as official, _load(qwen3_program) as torch_program:
        assert official.run_batch(INPUTS, options) == [official.generate(text, options).text for text in INPUTS]
        calls = [(official, "hello"), (torch_program, "hello")]
        texts = pawfn.run_many(calls, options)
        assert texts[0] == texts[1]  # the same tokens on both backends
