"""`TypedFn[T]`: a program whose calls return `T`, decoded under `T`'s grammar (`PawFn.returning`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

from ..calls.caller import Caller
from ..calls.pending import PendingGeneration
from ..core.options import RuntimeOptions
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


class TypedFn(ProgramHandle, Generic[T_co]):
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

    def _typed(self, generation: Generation) -> TypedGeneration[T_co]:
        return TypedGeneration(self._output.parse(generation.text), generation)

    def generate(self, input: str, options: RuntimeOptions | None = None) -> TypedGeneration[T_co]:  # noqa: A002
        """Run the program under the type's grammar (it replaces any `response_format` given): the value and its `Generation`."""
        return self._typed(self._calls.generate(input, options))

    def run(self, input: str, options: RuntimeOptions | None = None) -> T_co:  # noqa: A002
        """The program's output on `input`, as a `T_co`."""
        return self.generate(input, options).value

    def submit(self, input: str, options: RuntimeOptions | None = None) -> PendingGeneration:  # noqa: A002
        """Start a call under the type's grammar; its future gives the `Generation`, `value_of` its value."""
        return self._calls.submit(input, options)

    async def agenerate(self, input: str, options: RuntimeOptions | None = None) -> TypedGeneration[T_co]:  # noqa: A002
        """`generate` without blocking the event loop."""
        return self._typed(await self._calls.agenerate(input, options))

    async def arun(self, input: str, options: RuntimeOptions | None = None) -> T_co:  # noqa: A002
        """`run` without blocking the event loop; cancelling the task stops the call at its next token."""
        return (await self.agenerate(input, options)).value

    def generate_batch(self, inputs: Sequence[str], options: RuntimeOptions | None = None) -> list[TypedGeneration[T_co]]:
        """`generate` for each input, decoded together as `PawFn.generate_batch` does; results in input order."""
        return [self._typed(generation) for generation in self._calls.generate_batch(inputs, options)]

    def run_batch(self, inputs: Sequence[str], options: RuntimeOptions | None = None) -> list[T_co]:
        """The values of `generate_batch`."""
        return [typed.value for typed in self.generate_batch(inputs, options)]

    async def arun_batch(self, inputs: Sequence[str], options: RuntimeOptions | None = None) -> list[T_co]:
        """`run_batch` without blocking the event loop (as `PawFn.arun_batch`: one request on Remote)."""
        return [self._output.parse(generation.text) for generation in await self._calls.agenerate_batch(inputs, options)]

    def value_of(self, generation: Generation) -> T_co:
        """The value of a `Generation` this program's call produced under its type (`OutputTypeError` if none)."""
        return self._output.parse(generation.text)

    def __repr__(self) -> str:
        return f"<TypedFn {self._output.name} of {self._program!r}>"
