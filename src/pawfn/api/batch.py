"""Calls across programs: `run_many` and its twins take (program, input) pairs of any programs, on any bases and
backends, typed (`PawFn.returning`) or not, and return the results in call order."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, TypeVar, overload

from ..calls.pending import PendingGeneration, gather_in_order, results_in_order
from .function import PawFn
from ..core.options import RuntimeOptions
from ..core.results import Generation
from .typed import TypedFn

__all__ = ["Returns", "arun_many", "generate_many", "run_many"]

T = TypeVar("T")
T_co = TypeVar("T_co", covariant=True)


class Returns(Protocol[T_co]):
    """A program whose calls give a `T_co`: a `PawFn` (its text) or a `TypedFn[T]` (its value)."""

    def submit(self, input: str, options: RuntimeOptions | None = None, /) -> PendingGeneration:  # noqa: A002
        """Start a call; its future gives the `Generation`."""
        ...

    def value_of(self, generation: Generation, /) -> T_co:
        """The call's value: its text, or its parsed value."""
        ...


def generate_many(calls: Sequence[tuple[PawFn[Any, Any] | TypedFn[Any], str]], options: RuntimeOptions | None = None) -> list[Generation]:
    """`generate` for each (program, input) pair, results in call order, each exactly what the call gives alone.
    On the Torch backend, calls on one base are decoded together (each program's side paths once per step, on
    its rows); calls on other bases run beside them; llama.cpp runs its calls one by one. If calls fail, the first
    failing call's error is raised once every call has ended."""
    return results_in_order([program.submit(text, options) for program, text in _checked_calls(calls)])


def _checked_calls(calls: Sequence[tuple[Returns[T], str]]) -> Sequence[tuple[Returns[T], str]]:
    """`calls`, every one checked before the first runs."""
    for index, call in enumerate(calls):
        _check_call(index, call)
    return calls


def _check_call(index: int, call: object) -> None:
    """Untyped callers get a clear error, not an unpacking one."""
    if not (isinstance(call, tuple) and len(call) == 2 and isinstance(call[0], PawFn | TypedFn)):  # pyright: ignore[reportUnknownArgumentType]  # any tuple
        raise TypeError(f"calls[{index}] is {call!r}, not a (program, input) pair")


@overload
def run_many(calls: Sequence[tuple[PawFn[Any, Any], str]], options: RuntimeOptions | None = None) -> list[str]: ...
@overload
def run_many(calls: Sequence[tuple[TypedFn[T], str]], options: RuntimeOptions | None = None) -> list[T]: ...
def run_many(calls: Sequence[tuple[Returns[Any], str]], options: RuntimeOptions | None = None) -> list[Any]:  # Any: the overloads type it
    """The values of `generate_many`: a plain program's text, a typed one's value (each under its own grammar). The
    checkers type a list of plain programs as `list[str]` and one of typed programs as `list[T]` (their types'
    union); mix in a plain program as `program.returning(str)` to keep the typing."""
    generations = results_in_order([program.submit(text, options) for program, text in _checked_calls(calls)])
    return [program.value_of(generation) for (program, _), generation in zip(calls, generations, strict=True)]


@overload
async def arun_many(calls: Sequence[tuple[PawFn[Any, Any], str]], options: RuntimeOptions | None = None) -> list[str]: ...
@overload
async def arun_many(calls: Sequence[tuple[TypedFn[T], str]], options: RuntimeOptions | None = None) -> list[T]: ...
async def arun_many(calls: Sequence[tuple[Returns[Any], str]], options: RuntimeOptions | None = None) -> list[Any]:  # Any: the overloads type it
    """`run_many` without blocking the event loop; cancelling the task stops its calls."""
    pendings = [program.submit(text, options) for program, text in _checked_calls(calls)]
    generations = await gather_in_order(pendings)
    return [program.value_of(generation) for (program, _), generation in zip(calls, generations, strict=True)]
