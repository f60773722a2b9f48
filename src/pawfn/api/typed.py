"""`TypedFn[T]`: a program whose calls return `T`, decoded under `T`'s grammar (`PawFn.returning`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

from ..calls.caller import Caller
from ..formats.outputs import OutputType
from ..core.results import Generation
from .handle import ProgramHandle

__all__ = ["TextProgram", "TypedFn", "TypedGeneration"]

T_co = TypeVar("T_co", covariant=True)


class TextProgram(Protocol):
    """What a typed program runs on: a `PawFn`, whose calls return text."""

    @property
    def calls(self) -> Caller:
        """The one implementation of the program's calls."""
        ...

    @property
    def program_id(self) -> str | None:
        """The program's hub id, if it has one."""
        ...


@dataclass(frozen=True)
class TypedGeneration(Generic[T_co]):
    """A typed call's value and its `Generation` (text, tokens, timings)."""

    value: T_co
    generation: Generation


class TypedFn(ProgramHandle[TypedGeneration[T_co], T_co], Generic[T_co]):
    """A loaded program with a declared output type: every call's tokens are masked to the type's grammar, and its
    text parsed into a `T_co` (`OutputTypeError` where no value of `T_co` finished within the call's budget). Made by
    `PawFn.returning(T_co)`; it shares the program (closing the program closes it)."""

    def __init__(self, program: TextProgram, output: OutputType[T_co]) -> None:
        self._program = program
        self._output = output
        self._calls = program.calls.returning(output.format)

    @property
    def program(self) -> TextProgram:
        """The untyped program underneath (the `PawFn`)."""
        return self._program

    @property
    def program_id(self) -> str | None:
        """The program's hub id, if it has one."""
        return self._program.program_id

    @property
    def calls(self) -> Caller:
        """This program's calls under its type's grammar (the one implementation `PawFn` also runs on; advanced use)."""
        return self._calls

    @property
    def output_type(self) -> OutputType[T_co]:
        """The declared output type (its name, grammar format and parser)."""
        return self._output

    def _result(self, generation: Generation) -> TypedGeneration[T_co]:
        return TypedGeneration(self._output.parse(generation.text), generation)

    def value_of(self, generation: Generation) -> T_co:
        """The value of a `Generation` this program's call produced under its type (`OutputTypeError` if none)."""
        return self._output.parse(generation.text)

    def __repr__(self) -> str:
        return f"<TypedFn {self._output.name} of {self._program!r}>"
