"""Prompt templates as the official SDK reads them: a compiled program's `{INPUT_PLACEHOLDER}` (exactly one, its
text split around it) and the numbered `{INPUT_0}`, `{INPUT_1}`, ... of a bare interpreter's template, whose calls
take several positional arguments (indices from 0 without gaps; a slot may repeat; none at all takes no argument).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from .errors import PawError

__all__ = ["INPUT_PLACEHOLDER", "ArityError", "NumberedTemplate", "TemplateError"]

INPUT_PLACEHOLDER = "{INPUT_PLACEHOLDER}"
_NUMBERED_SLOT = re.compile(r"\{INPUT_(0|[1-9][0-9]*)\}")
"""A slot: `{INPUT_` and a decimal index without leading zeros (`{INPUT_01}` is text, as in the official parser)."""


class TemplateError(PawError, ValueError):
    """A prompt template the official SDK would refuse (a gap in its slot indices, no single placeholder)."""


class ArityError(PawError, TypeError):
    """A call with another number of arguments than its template's slots."""

    def __init__(self, arity: int, given: int) -> None:
        self.arity = arity
        self.given = given
        super().__init__(f"the template takes {arity} positional argument{'s' * (arity != 1)} ({{INPUT_0}} ...); got {given}")


@dataclass(frozen=True)
class NumberedTemplate:
    """A template's literal text interleaved with the argument index of each slot."""

    segments: tuple[str | int, ...]

    @classmethod
    def parse(cls, text: str) -> NumberedTemplate:
        """Read `{INPUT_N}` slots; `TemplateError` if the indices do not run from 0 without a gap."""
        segments: list[str | int] = []
        end = 0
        for match in _NUMBERED_SLOT.finditer(text):
            segments += [text[end : match.start()], int(match.group(1))]
            end = match.end()
        segments.append(text[end:])
        indices = sorted({segment for segment in segments if isinstance(segment, int)})
        if indices != list(range(len(indices))):
            raise TemplateError(f"the template's slots are {{INPUT_{'}, {INPUT_'.join(map(str, indices))}}}: indices must start at 0 without gaps")
        return cls(tuple(segments))

    @classmethod
    def single(cls, text: str) -> NumberedTemplate:
        """A compiled program's template: exactly one `{INPUT_PLACEHOLDER}`, as slot 0 (other braces are text)."""
        count = text.count(INPUT_PLACEHOLDER)
        if count != 1:
            raise TemplateError(f"the prompt template must contain exactly one {INPUT_PLACEHOLDER}, found {count}")
        prefix, suffix = text.split(INPUT_PLACEHOLDER)
        return cls((prefix, 0, suffix))

    @property
    def arity(self) -> int:
        """How many positional arguments a call takes."""
        return 1 + max((segment for segment in self.segments if isinstance(segment, int)), default=-1)

    def bind(self, arguments: Sequence[str]) -> tuple[tuple[str, bool], ...]:
        """The rendered prompt as (text, is an argument) pieces, in order; `ArityError` on a wrong count."""
        if len(arguments) != self.arity:
            raise ArityError(self.arity, len(arguments))
        pieces = ((arguments[segment], True) if isinstance(segment, int) else (segment, False) for segment in self.segments)
        return tuple(piece for piece in pieces if piece[0])

    def render(self, arguments: Sequence[str]) -> str:
        """The rendered prompt as one string."""
        return "".join(text for text, _ in self.bind(arguments))

    @property
    def head(self) -> str:
        """The literal text before the first slot (the whole template when it has none)."""
        first = self.segments[0]
        assert isinstance(first, str)  # parsing always starts with text, if empty
        return first
