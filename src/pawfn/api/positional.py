"""`Positional[*Args]`: calls with several positional arguments, for a numbered template (`{INPUT_0}`, `{INPUT_1}`,
...), typed by their kinds: `Positional[str, str](program).run("context", "question")`, or with an image:
`Positional[str, Image](program).run("Describe it.", Image("photo.png"))`."""

from __future__ import annotations

from typing import Any, Generic

from typing_extensions import TypeVarTuple, Unpack

from ..calls.caller import Caller
from ..calls.pending import PendingGeneration, TextIterator, TextStream
from ..core.options import RuntimeOptions
from ..core.results import Generation

__all__ = ["Positional"]

Args = TypeVarTuple("Args")


class Positional(Generic[Unpack[Args]]):
    """A program (a bare interpreter with a numbered template) called with its arguments, typed by the class's type
    arguments; a call with another count than the template's, or an argument of another kind, is refused before any
    work (the program's one check, `Caller.arguments`)."""

    def __init__(self, program: Any) -> None:  # noqa: ANN401 - any PawFn; its calls are all this needs
        calls = getattr(program, "calls", None)
        if not isinstance(calls, Caller):
            raise TypeError(f"Positional takes a loaded PawFn, not {type(program).__name__}")
        self._program: object = program
        self._calls = calls

    @property
    def program(self) -> object:
        """The program underneath (a `PawFn`)."""
        return self._program

    def submit(self, *arguments: Unpack[Args], options: RuntimeOptions | None = None) -> PendingGeneration:
        """Start a call; its future gives the `Generation` (`ArityError` at once on a wrong count)."""
        return self._calls.submit(arguments, options)

    def generate(self, *arguments: Unpack[Args], options: RuntimeOptions | None = None) -> Generation:
        """Run the template on `arguments`: text, token ids and timings."""
        return self._calls.generate(arguments, options)

    def run(self, *arguments: Unpack[Args], options: RuntimeOptions | None = None) -> str:
        """Run the template on `arguments` and return the output text."""
        return self._calls.generate(arguments, options).text

    async def arun(self, *arguments: Unpack[Args], options: RuntimeOptions | None = None) -> str:
        """`run` without blocking the event loop; cancelling the task stops the call at its next token."""
        return (await self._calls.agenerate(arguments, options)).text

    async def agenerate(self, *arguments: Unpack[Args], options: RuntimeOptions | None = None) -> Generation:
        """`generate` without blocking the event loop; cancelling the task stops the call at its next token."""
        return await self._calls.agenerate(arguments, options)

    async def astream(self, *arguments: Unpack[Args], options: RuntimeOptions | None = None) -> TextStream:
        """The call's text as it is generated: `async for piece in stream`, then `await stream.generation()`;
        leaving the stream early cancels the call."""
        return self._calls.stream(arguments, options)

    def stream(self, *arguments: Unpack[Args], options: RuntimeOptions | None = None) -> TextIterator:
        """`astream` in a plain loop: `for piece in stream`, then `stream.generation()`; breaking out stops the call."""
        return self._calls.iterate(arguments, options)

    def prompt_token_ids(self, *arguments: Unpack[Args], options: RuntimeOptions | None = None) -> list[int]:
        """The token ids a call on `arguments` evaluates after the cached prefix."""
        return self._calls.encode(arguments, options)
