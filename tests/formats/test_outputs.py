"""`pawfn.formats.outputs`: a Python type as its output format and its parser; types without a grammar refused at once."""

from __future__ import annotations

import dataclasses
import enum
from typing import Annotated, Any, Literal

import pytest
from pydantic import BaseModel, Field, StringConstraints

from pawfn import ChoicesFormat, GrammarError, JsonSchemaFormat, OutputType, OutputTypeError, Pattern, PatternFormat


class Priority(enum.Enum):
    HIGH = "high"
    LOW = "low"


class Level(enum.IntEnum):
    ONE = 1
    TWO = 2


class Ticket(BaseModel):
    label: Literal["urgent", "normal"]
    score: int
    tags: list[str] = []


@dataclasses.dataclass
class Point:
    x: float
    y: float


def test_choices_of_literals_and_enums_read_as_the_program_writes_them() -> None:
    triage = OutputType(Literal["urgent", "normal", "spam"])
    assert triage.format == ChoicesFormat(choices=("urgent", "normal", "spam"))
    assert triage.parse("spam") == "spam"
    assert OutputType(Priority).parse("low") is Priority.LOW
    assert OutputType(Level).format == ChoicesFormat(choices=("1", "2"))
    assert OutputType(Level).parse("2") is Level.TWO
    assert OutputType(Literal[1, 2, True]).parse("true") is True
    assert OutputType(Literal["a"] | Priority).parse("high") is Priority.HIGH  # noqa: PYI030
    with pytest.raises(OutputTypeError, match="none of the choices"):
        triage.parse("maybe")


def test_scalars_are_plain_text_patterns_parsed_by_pydantic() -> None:
    assert isinstance(OutputType(int).format, PatternFormat)
    assert OutputType(int).parse("-42") == -42
    assert OutputType(float).parse("2.5e3") == 2500.0
    assert OutputType(bool).parse("Yes") is True and OutputType(bool).parse("false") is False
    assert OutputType(str).format is None and OutputType(str).parse("any text") == "any text"
    code = OutputType(Annotated[str, Pattern(r"[A-Z]{3}-[0-9]{4}")])
    assert code.format == PatternFormat(pattern=r"[A-Z]{3}-[0-9]{4}")
    assert OutputType(Annotated[str, StringConstraints(pattern=r"^x+$")]).format == PatternFormat(pattern=r"^x+$")


def test_checks_beyond_the_grammar_run_on_the_value() -> None:
    small = OutputType(Annotated[int, Field(le=10)])
    assert small.parse("7") == 7
    with pytest.raises(OutputTypeError, match="less than or equal to 10") as caught:
        small.parse("12")
    assert caught.value.type_name.startswith("Annotated[int") and caught.value.text == "12"


class Bounded(BaseModel):
    count: int = Field(ge=1, le=10)
    share: float = Field(ge=0, le=1)


def test_a_models_field_bounds_are_kept() -> None:
    """`Field(le=10)` on an int bounds the grammar's integers (as llama.cpp's converter does); on a float it is checked on
    the value after the call, by the schema and by pydantic."""
    bounded = OutputType(Bounded)
    assert isinstance(bounded.format, JsonSchemaFormat)
    assert bounded.parse('{"count": 10, "share": 0.5}') == Bounded(count=10, share=0.5)
    from pawfn.formats.constraint import check_json_value

    with pytest.raises(OutputTypeError, match="breaks the schema's maximum"):
        check_json_value(bounded.format, '{"count": 3, "share": 1.5}')
    with pytest.raises(OutputTypeError, match="less than or equal to 1"):
        bounded.parse('{"count": 3, "share": 1.5}')


def test_models_lists_and_dataclasses_are_json() -> None:
    ticket = OutputType(Ticket)
    assert isinstance(ticket.format, JsonSchemaFormat) and ticket.format.json_schema.name == "Ticket"
    assert ticket.parse('{"label": "urgent", "score": 3}') == Ticket(label="urgent", score=3)
    assert OutputType(list[Ticket]).parse('[{"label": "normal", "score": 1, "tags": ["a"]}]')[0].tags == ["a"]
    assert OutputType(Point).parse('{"x": 1, "y": 2.5}') == Point(1.0, 2.5)
    assert OutputType(list[int]).parse("[1, 2]") == [1, 2]
    with pytest.raises(OutputTypeError, match="Ticket"):
        ticket.parse('{"label": "urgent"')  # never a half-parsed value


@pytest.mark.parametrize(
    ("output", "problem"),
    [
        (dict[str, int], "additional properties"),
        (Annotated[int, Pattern("[0-9]+")], "a pattern constrains str"),
        (Literal[1.5], "choices must be str, int or bool"),
        (Literal[""], "empty choice"),
        (Annotated[str, Pattern("(")], "not a regular expression"),
        (Annotated[str, Pattern("(?=a)a")], "look-around"),
        (Any, "any value"),
    ],
)
def test_types_without_a_grammar_are_refused_at_once(output: Any, problem: str) -> None:  # noqa: ANN401
    with pytest.raises(GrammarError, match=problem):
        OutputType(output)
