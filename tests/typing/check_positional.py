"""Typing tests of numbered templates: `Positional[*Args]` takes exactly its arguments, of their kinds."""

from __future__ import annotations

from typing_extensions import assert_type

from pawfn import GPT2, Generation, PawFn, Positional, Torch


def calls(bare: PawFn[GPT2, Torch]) -> None:
    qa = Positional[str, str](bare)
    assert_type(qa.run("context", "question"), str)
    assert_type(qa.generate("context", "question"), Generation)
    qa.run("only one")  # expect-error: call-arg; reportCallIssue
    qa.run("a", "b", "c")  # expect-error: call-arg; reportCallIssue
    qa.run("a", 2)  # expect-error: arg-type; reportArgumentType
    assert_type(Positional[str](bare).run("one"), str)


async def asynchronous(bare: PawFn[GPT2, Torch]) -> None:
    assert_type(await Positional[str, str](bare).arun("a", "b"), str)


def loads() -> None:
    assert_type(PawFn[GPT2, Torch].bare(base="gpt2.gguf", template="Q: {INPUT_0} A:"), PawFn[GPT2, Torch])
