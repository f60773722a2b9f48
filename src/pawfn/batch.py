"""Calls across programs: `run_many` and its twins take (program, input) pairs of any programs, on any bases and
backends, and return the results in call order."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any, TypeAlias

from .function import PawFn
from .options import RuntimeOptions
from .results import Generation

__all__ = ["arun_many", "generate_many", "run_many"]

Call: TypeAlias = "tuple[PawFn[Any, Any], str]"  # a string: PawFn refuses Any as a run-time type argument
"""One call: a program of any interpreter and backend, and its input."""


def generate_many(calls: Sequence[Call], options: RuntimeOptions | None = None) -> list[Generation]:
    """`generate` for each (program, input) pair, results in call order: each is what the call gives alone. (For
    now the calls run one after another; the first error is raised.)"""
    for index, call in enumerate(calls):
        _check_call(index, call)
    return [program.generate(text, options) for program, text in calls]


def _check_call(index: int, call: object) -> None:
    """Untyped callers get a clear error, not an unpacking one."""
    if not (isinstance(call, tuple) and len(call) == 2 and isinstance(call[0], PawFn)):  # pyright: ignore[reportUnknownArgumentType]  # any tuple
        raise TypeError(f"calls[{index}] is {call!r}, not a (program, input) pair")


def run_many(calls: Sequence[Call], options: RuntimeOptions | None = None) -> list[str]:
    """The output texts of `generate_many`."""
    return [generation.text for generation in generate_many(calls, options)]


async def arun_many(calls: Sequence[Call], options: RuntimeOptions | None = None) -> list[str]:
    """`run_many` in a worker thread, so the event loop never blocks."""
    generations = await asyncio.to_thread(generate_many, calls, options)
    return [generation.text for generation in generations]
