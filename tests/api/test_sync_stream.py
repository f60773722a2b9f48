"""`stream`: a call's text in a plain loop on every handle (PawFn, TypedFn, Positional), the same pieces as `astream`
and the call's own tokens; breaking out of the loop stops the call."""

from __future__ import annotations

import asyncio
from concurrent.futures import CancelledError
from typing import Literal

import pytest

from pawfn import PawFn, Positional, Qwen3_0_6B, RuntimeOptions, Torch
from pawfn.testing import fake
from tests.helpers.programs import TinyProgram

OPTIONS = RuntimeOptions(max_tokens=12)


def test_a_fake_streams_in_a_loop_and_a_typed_one_parses_its_value() -> None:
    program = fake(PawFn[Qwen3_0_6B, Torch], {"Server down!": " immediate", "a\\nb": "joined"}, arity=1)
    stream = program.stream("Server down!")
    assert list(stream) == list(" immediate")  # a fake's token is a character
    assert stream.generation().text == "immediate"
    typed = program.returning(Literal["immediate", "later"])
    with typed.stream("Server down!") as followed:
        assert "".join(followed) == " immediate"
        assert typed.value_of(followed.generation()) == "immediate"
    two = fake(PawFn[Qwen3_0_6B, Torch], {"a\nb": "joined"}, arity=2)
    assert "".join(Positional[str, str](two).stream("a", "b")) == "joined"


def test_the_pieces_are_the_calls_own_and_astreams(qwen3_program: TinyProgram) -> None:
    with PawFn[Qwen3_0_6B, Torch].load_sync(qwen3_program.folder, base=qwen3_program.interpreter.gguf_path) as program:
        expected = program.generate("hello", OPTIONS)
        stream = program.stream("hello", OPTIONS)
        pieces = list(stream)
        assert stream.generation().token_ids == expected.token_ids
        assert "".join(pieces) == program.runtime.decode_tokens(expected.token_ids)

        async def asynchronous() -> list[str]:
            async with await program.astream("hello", OPTIONS) as followed:
                return [piece async for piece in followed]

        assert asyncio.run(asynchronous()) == pieces
        shorter = program.stream_with("hello", RuntimeOptions(max_tokens=3))  # paw-rs's `_with` form: the options apply
        assert "".join(shorter) == program.runtime.decode_tokens(expected.token_ids[:3])
        assert shorter.generation().token_ids == expected.token_ids[:3]


def test_breaking_out_of_the_loop_stops_the_call(qwen3_program: TinyProgram) -> None:
    with PawFn[Qwen3_0_6B, Torch].load_sync(qwen3_program.folder, base=qwen3_program.interpreter.gguf_path) as program:
        long = RuntimeOptions(max_tokens=400)
        stream = program.stream("hello", long)
        for _ in stream:
            break
        assert stream.pending.abandoned.is_set()  # the loop's end closed the iterator, which cancelled the call
        with pytest.raises(CancelledError):
            stream.generation()  # it stopped at its next token rather than decoding its 400 for nobody
        assert program.generate("hello", OPTIONS).token_ids  # the program runs on
