"""Typing tests of the batch calls: any mix of programs is accepted, anything but (program, str) pairs refused."""

from __future__ import annotations

from typing_extensions import assert_type

import pawfn
from pawfn import GPT2, LlamaCpp, PawFn, Qwen3_0_6B, RuntimeOptions, Torch


def batches(qwen: PawFn[Qwen3_0_6B, Torch], gpt2: PawFn[GPT2, LlamaCpp]) -> None:
    assert_type(qwen.run_batch(["a", "b"]), list[str])
    assert_type(qwen.generate_batch(("a", "b"), RuntimeOptions(max_tokens=3)), list[pawfn.Generation])
    assert_type(pawfn.run_many([(qwen, "a"), (gpt2, "b")]), list[str])
    assert_type(pawfn.generate_many([(gpt2, "b")]), list[pawfn.Generation])
    qwen.run_batch([1, 2])  # expect-error: list-item; reportArgumentType
    pawfn.run_many([(qwen, 3)])  # expect-error: list-item; reportArgumentType
    pawfn.run_many([("a", qwen)])  # expect-error: list-item; reportArgumentType
    pawfn.run_many([qwen])  # expect-error: list-item; reportArgumentType


async def async_batches(qwen: PawFn[Qwen3_0_6B, Torch]) -> None:
    assert_type(await qwen.arun_batch(["a"]), list[str])
    assert_type(await pawfn.arun_many([(qwen, "a")]), list[str])
