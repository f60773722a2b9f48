"""Calls across programs: `run_many` and its twins take (program, input) pairs of any programs, on any bases and
backends, and return the results in call order."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypeAlias

from .function import PawFn
from .options import RuntimeOptions
from .results import Generation
from .calls import gather_in_order, results_in_order

__all__ = ["arun_many", "generate_many", "run_many"]

Call: TypeAlias = "tuple[PawFn[Any, Any], str]"  # a string: PawFn refuses Any as a run-time type argument
"""One call: a program of any interpreter and backend, and its input."""


def generate_many(calls: Sequence[Call], options: RuntimeOptions | None = None) -> list[Generation]:
    """`generate` for each (program, input) pair, results in call order, each exactly what the call gives alone.
    On the Torch backend, calls on one base are decoded together (each program's side paths once per step, on
    its rows); calls on other bases run beside them; llama.cpp runs its calls one by one. If calls fail, the first
    failing call's error is raised once every call has ended."""
    return results_in_order([program.submit(text, options) for program, text in _checked_calls(calls)])


def _checked_calls(calls: Sequence[Call]) -> Sequence[Call]:
    """`calls`, every one checked before the first runs."""
    for index, call in enumerate(calls):
        _check_call(index, call)
    return calls


def _check_call(index: int, call: object) -> None:
    """Untyped callers get a clear error, not an unpacking one."""
    if not (isinstance(call, tuple) and len(call) == 2 and isinstance(call[0], PawFn)):  # pyright: ignore[reportUnknownArgumentType]  # any tuple
        raise TypeError(f"calls[{index}] is {call!r}, not a (program, input) pair")


def run_many(calls: Sequence[Call], options: RuntimeOptions | None = None) -> list[str]:
    """The output texts of `generate_many`."""
    return [generation.text for generation in generate_many(calls, options)]


async def arun_many(calls: Sequence[Call], options: RuntimeOptions | None = None) -> list[str]:
    """`run_many` without blocking the event loop; cancelling the task stops its calls."""
    pendings = [await program.asubmit(text, options) for program, text in _checked_calls(calls)]
    return [generation.text for generation in await gather_in_order(pendings)]
