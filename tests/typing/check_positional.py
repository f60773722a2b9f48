"""Typing tests of numbered templates: `Positional[*Args]` takes exactly its arguments, of their kinds."""

from __future__ import annotations

from typing_extensions import assert_type

from pawfn import GPT2, Generation, Image, LlamaCpp, PawFn, Positional, Qwen3_5_0_8B, Remote, TextStream, Torch


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


async def streams_and_tokens(program: PawFn[Qwen3_5_0_8B, Remote]) -> None:
    """A program of the vision runtime, here on a server: its arguments stream and tokenize typed too."""
    chat = Positional[str, str](program)
    assert_type(await chat.agenerate("be brief", "hello"), Generation)
    assert_type(chat.prompt_token_ids("be brief", "hello"), list[int])
    stream = await chat.astream("be brief", "hello")
    assert_type(stream, TextStream)
    await chat.agenerate("only one")  # expect-error: call-arg; reportCallIssue
    chat.prompt_token_ids("a", 2)  # expect-error: arg-type; reportArgumentType


def qwen35_loads() -> None:
    assert_type(PawFn[Qwen3_5_0_8B, Torch].bare(base="qwen3.5.gguf"), PawFn[Qwen3_5_0_8B, Torch])
    assert_type(PawFn[Qwen3_5_0_8B, LlamaCpp].load_sync("vision.paw"), PawFn[Qwen3_5_0_8B, LlamaCpp])


def images(program: PawFn[Qwen3_5_0_8B, LlamaCpp]) -> None:
    describe = Positional[str, Image](program)
    assert_type(describe.run("Describe it.", Image(b"...")), str)
    describe.run("Describe it.", "not an image")  # expect-error: arg-type; reportArgumentType
    describe.run(Image(b"..."), "swapped")  # expect-error: arg-type; reportArgumentType
