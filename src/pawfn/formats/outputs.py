"""Output types: a Python type a program's output is declared to be, as the `OutputFormat` its decoding is masked to
and the pydantic `TypeAdapter` that parses the text into the value.

Scalars are read as the plain text a program writes: a `Literal` or an `Enum` is one of its values, `bool` one of the
words pydantic reads as one (`true`, `no`, ...), `int` and `float` a number, `Annotated[str, Pattern(...)]` text
matching the pattern. Everything else (a pydantic model, `list[...]`, a dataclass, a `TypedDict`) is JSON, in the
language llama.cpp's schema grammar writes.
"""

from __future__ import annotations

import enum
import types
import typing
from dataclasses import dataclass
from typing import Any, Generic, TypeVar, cast

from pydantic import StringConstraints, TypeAdapter, ValidationError
from typing_extensions import TypeForm

from ..core.errors import GrammarError, OutputTypeError, describe_validation_error
from .constraint import check_output
from ..core.grammar import ChoicesFormat, JsonSchemaFormat, JsonSchemaSpec, OutputFormat, PatternFormat

__all__ = ["OutputType", "Pattern"]

T_co = TypeVar("T_co", covariant=True)

_BOOL_WORDS = ("true", "false", "yes", "no", "on", "off", "t", "f", "y", "n", "1", "0")
"""The words pydantic reads as a bool (any case)."""
_INTEGER = "[-+]?[0-9]{1,19}"
_FLOAT = "[-+]?([0-9]{1,19}(\\.[0-9]{0,19})?|\\.[0-9]{1,19})([eE][-+]?[0-9]{1,3})?"


@dataclass(frozen=True)
class Pattern:
    """`Annotated[str, Pattern(r"[A-Z]{3}-[0-9]{4}")]`: the output is text matching `regex` as a whole (Rust regex
    syntax, which llguidance reads: no look-around or back-references)."""

    regex: str


class OutputType(Generic[T_co]):
    """A declared output type: its format (None: free text) and its parser."""

    def __init__(self, output: TypeForm[T_co]) -> None:
        """`GrammarError` if `output` cannot be turned into a grammar."""
        self.name = _type_name(output)
        self._adapter: TypeAdapter[T_co] = TypeAdapter(cast(Any, output))  # cast: a TypeForm is any type expression
        self._choices: dict[str, T_co] | None = None
        self._json = False
        self.format: OutputFormat | None = self._format(output)
        if self.format is not None:
            check_output(self.format)  # a type without a grammar is refused now, not at the first call

    def _format(self, output: object) -> OutputFormat | None:
        base, metadata = _unwrap(output)
        pattern = _pattern(metadata)
        if pattern is not None:
            if base is not str:
                raise GrammarError(f"{self.name}: a pattern constrains str, not {_type_name(base)}")
            return PatternFormat(pattern=pattern)
        if base is str:
            return None
        if base is bool:
            return PatternFormat(pattern="(?i:" + "|".join(_BOOL_WORDS) + ")")
        if base is int:
            return PatternFormat(pattern=_INTEGER)
        if base is float:
            return PatternFormat(pattern=_FLOAT)
        values = _choices(base)
        if values is not None:
            self._choices = {}
            for value in values:
                text = _choice_text(value.value if isinstance(value, enum.Enum) else value, self.name)
                if self._choices.setdefault(text, cast(T_co, value)) is not value:  # cast: a value of the declared type
                    raise GrammarError(f"{self.name}: two choices are written {text!r}; a program's text could not tell them apart")
            return ChoicesFormat(choices=tuple(self._choices))
        try:
            schema = self._adapter.json_schema()
        except Exception as exc:  # noqa: BLE001 - pydantic's own reasons (PydanticInvalidForJsonSchema, ...)
            raise GrammarError(f"{self.name} has no JSON schema, so no grammar: {exc}") from None
        self._json = True
        return JsonSchemaFormat(json_schema=JsonSchemaSpec.model_validate({"name": self.name[:128], "schema": schema}))

    def parse(self, text: str) -> T_co:
        """The value of the output `text` (stripped); `OutputTypeError` if it is none."""
        try:
            if self._choices is not None:
                if text not in self._choices:
                    raise OutputTypeError(self.name, text, "it is none of the choices")
                return self._adapter.validate_python(self._choices[text])
            if self._json:
                return self._adapter.validate_json(text)
            return self._adapter.validate_python(text)
        except ValidationError as exc:
            raise OutputTypeError(self.name, text, describe_validation_error(exc)) from None

    def __repr__(self) -> str:
        return f"OutputType({self.name})"


def _unwrap(output: object) -> tuple[object, tuple[object, ...]]:
    """`Annotated[X, ...]` as (X, its metadata); anything else as (itself, ())."""
    if typing.get_origin(output) is typing.Annotated:
        base, *metadata = typing.get_args(output)
        inner, more = _unwrap(base)
        return inner, (*more, *metadata)
    return output, ()


def _pattern(metadata: tuple[object, ...]) -> str | None:
    for item in metadata:
        if isinstance(item, Pattern):
            return item.regex
        if isinstance(item, StringConstraints) and item.pattern is not None:
            return item.pattern if isinstance(item.pattern, str) else item.pattern.pattern
    return None


def _choices(output: object) -> list[object] | None:
    """The values of a `Literal`, an `Enum` or a union of them; None for other types."""
    if isinstance(output, type) and issubclass(output, enum.Enum):
        return list(output)
    origin = typing.get_origin(output)
    if origin is typing.Literal:
        return list(typing.get_args(output))
    if origin in (typing.Union, types.UnionType):
        parts = [_choices(arg) for arg in typing.get_args(output)]
        if all(part is not None for part in parts):
            return [value for part in parts for value in cast(list[object], part)]  # cast: none is None, checked above
    return None


def _choice_text(value: object, name: str) -> str:
    """How a program writes a choice: a string as itself, a number or bool as Python prints it (lower-case bools)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str | int):
        if value == "":
            raise GrammarError(f"{name} has an empty choice, which a program cannot write; drop it")
        return str(value)
    raise GrammarError(f"{name} has the choice {value!r}; choices must be str, int or bool")


def _type_name(output: object) -> str:
    if isinstance(output, type):
        return output.__name__
    return repr(output).replace("typing.", "").replace("typing_extensions.", "")
