"""`Positional[*Args]`: calls with several positional arguments, for a numbered template (`{INPUT_0}`, `{INPUT_1}`,
...), typed by their kinds: `Positional[str, str](program).run("context", "question")`, or with an image:
`Positional[str, Image](program).run("Describe it.", Image("photo.png"))`."""

from __future__ import annotations

import asyncio
from typing import Any, Generic

from typing_extensions import TypeVarTuple, Unpack

from ..calls.pending import PendingGeneration, TextStream, checked_options, results_in_order
from ..core.options import RuntimeOptions
from ..core.results import Generation
from ..core.errors import ConfigError
from ..core.images import Image
from ..core.models import InterpreterModel
from ..calls.prompt import Argument
from ..calls.runtime import ProgramRuntime
from ..core.templates import ArityError

__all__ = ["Positional"]

Args = TypeVarTuple("Args")


class Positional(Generic[Unpack[Args]]):
    """A program (a bare interpreter with a numbered template) called with its arguments, typed by the class's type
    arguments; a call with another count, or an argument of another kind, is refused before any work."""

    def __init__(self, program: Any) -> None:  # noqa: ANN401 - any PawFn; its runtime is all this needs
        runtime = getattr(program, "runtime", None)
        if not isinstance(runtime, ProgramRuntime):
            raise TypeError(f"Positional takes a loaded PawFn, not {type(program).__name__}")
        self._program: object = program
        self._runtime = runtime
        model = getattr(program, "model_type", lambda: None)()
        self._model: type[InterpreterModel] | None = model if isinstance(model, type) and issubclass(model, InterpreterModel) else None

    @property
    def program(self) -> object:
        """The program underneath (a `PawFn`)."""
        return self._program

    def _checked(self, arguments: tuple[object, ...]) -> tuple[Argument, ...]:
        kinds = getattr(self, "__orig_class__", None)
        declared = None if kinds is None else kinds.__args__
        if declared is not None and len(declared) != len(arguments):
            raise ArityError(len(declared), len(arguments))
        checked: list[Argument] = []
        for index, argument in enumerate(arguments):
            if not isinstance(argument, (str, Image)):
                raise TypeError(f"argument {index} ({{INPUT_{index}}}) must be str or pawfn.Image, not {type(argument).__name__}")
            if isinstance(argument, Image) and self._model is not None and self._model.image_tokens is None:
                raise ConfigError(f"argument {index} is an image, but {self._model.__name__} takes no images (Qwen3_5_0_8B does)")
            checked.append(argument)
        return tuple(checked)

    def submit(self, *arguments: Unpack[Args], options: RuntimeOptions | None = None) -> PendingGeneration:
        """Start a call; its future gives the `Generation` (`ArityError` at once on a wrong count)."""
        return self._runtime.submit(self._checked(arguments), checked_options(options))

    def generate(self, *arguments: Unpack[Args], options: RuntimeOptions | None = None) -> Generation:
        """Run the template on `arguments`: text, token ids and timings."""
        return results_in_order([self.submit(*arguments, options=options)])[0]

    def run(self, *arguments: Unpack[Args], options: RuntimeOptions | None = None) -> str:
        """Run the template on `arguments` and return the output text."""
        return self.generate(*arguments, options=options).text

    async def arun(self, *arguments: Unpack[Args], options: RuntimeOptions | None = None) -> str:
        """`run` without blocking the event loop; cancelling the task stops the call at its next token."""
        return (await self.agenerate(*arguments, options=options)).text

    async def agenerate(self, *arguments: Unpack[Args], options: RuntimeOptions | None = None) -> Generation:
        """`generate` without blocking the event loop; cancelling the task stops the call at its next token."""
        return await asyncio.wrap_future(self.submit(*arguments, options=options))

    async def astream(self, *arguments: Unpack[Args], options: RuntimeOptions | None = None) -> TextStream:
        """The call's text as it is generated: `async for piece in stream`, then `await stream.generation()`;
        leaving the stream early cancels the call."""
        stream = TextStream(self._runtime.decode_tokens)
        stream.follow(self._runtime.submit_streaming(self._checked(arguments), checked_options(options), stream))
        return stream

    def prompt_token_ids(self, *arguments: Unpack[Args], options: RuntimeOptions | None = None) -> list[int]:
        """The token ids a call on `arguments` evaluates after the cached prefix."""
        return self._runtime.encode_prompt(self._checked(arguments), checked_options(options))
