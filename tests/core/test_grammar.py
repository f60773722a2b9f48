"""`pawfn.core.grammar`: each output format's language, read byte by byte through llguidance (the library that masks the
tokens): plain formats with whitespace around them, JSON schemas as llama.cpp's own schema grammar reads them (checked
against its converter on generated texts), and hostile schemas refused within bounds."""

from __future__ import annotations

import importlib.util
import itertools
import json
import time
from collections.abc import Callable
from typing import Any, cast

import llguidance
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pawfn import ChoicesFormat, GrammarError, JsonSchemaFormat, JsonSchemaSpec, PatternFormat
from pawfn.core.grammar import SchemaLimits, lark_grammar

EOS = 256
HAS_LLAMA_CPP = importlib.util.find_spec("llama_cpp") is not None


class _Bytes:
    """A tokenizer of one token per byte, and EOS: a grammar's language read byte by byte."""

    eos_token_id = EOS
    bos_token_id = None
    tokens = [bytes([value]) for value in range(256)] + [b"\xff<eos>"]
    special_token_ids = [EOS]

    def __call__(self, text: bytes) -> list[int]:
        return list(text)


BYTES = llguidance.LLTokenizer(llguidance.TokenizerWrapper(_Bytes()))


def accepts(grammar: str, text: str) -> bool:
    """Whether `text` is a whole sentence of the Lark `grammar`."""
    matcher = llguidance.LLMatcher(BYTES, llguidance.LLMatcher.grammar_from_lark(grammar), log_level=0)
    assert not matcher.is_error(), matcher.get_error()
    return matcher.consume_tokens(list(text.encode())) and matcher.is_accepting()


def schema_grammar(schema: dict[str, Any]) -> str:
    return lark_grammar(JsonSchemaFormat(json_schema=JsonSchemaSpec(schema=schema)))


def test_choices_are_the_exact_texts_after_whitespace_and_nothing_after_them() -> None:
    grammar = lark_grammar(ChoicesFormat(choices=("urgent", "normal", 'say "hi"\n')))
    for text in ("urgent", " normal", '\nsay "hi"\n', "  \n\turgent"):
        assert accepts(grammar, text), text
    for text in ("Urgent", "urgentt", "urg", "normal urgent", "", "urgent ", " normal\n", "\n" * 9 + "urgent"):
        assert not accepts(grammar, text), text


def test_a_pattern_must_match_the_whole_output() -> None:
    grammar = lark_grammar(PatternFormat(pattern=r"^[A-Z]{3}-[0-9]{4}$"))
    assert accepts(grammar, "ABC-1234") and accepts(grammar, " \nABC-1234")
    assert not accepts(grammar, "ABC-123") and not accepts(grammar, "xABC-1234") and not accepts(grammar, "ABC-1234\n")
    assert accepts(lark_grammar(PatternFormat(pattern="a/b")), "a/b")  # the terminal's delimiter is escaped


@pytest.mark.parametrize("pattern", ["(", "[a-", "^$", "(" * 900 + "a" + ")" * 900])
def test_a_pattern_that_is_no_regular_expression_is_refused(pattern: str) -> None:
    with pytest.raises(GrammarError, match="pattern"):
        lark_grammar(PatternFormat(pattern=pattern))


OBJECT: dict[str, Any] = {
    "type": "object",
    "properties": {
        "label": {"enum": ["urgent", "normal"]},
        "score": {"type": "integer"},
        "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 3},
        "ratio": {"type": "number"},
        "ok": {"type": "boolean"},
        "note": {"anyOf": [{"type": "string", "maxLength": 5}, {"type": "null"}]},
    },
    "required": ["label", "score"],
}


def test_objects_take_required_keys_in_order_then_any_ordered_subset_of_the_optional_ones() -> None:
    grammar = schema_grammar(OBJECT)
    assert accepts(grammar, '{"label": "urgent", "score": 3}')
    assert accepts(grammar, '{"label":"normal","score":-12,"ok":true}')
    assert accepts(grammar, '{ "label": "urgent", "score": 0, "tags": ["a", "b"], "note": null}')
    assert not accepts(grammar, '{"label": "urgent", "score": 0} ')  # nothing after the whole value: the call ends
    assert accepts(grammar, '{"label": "urgent", "score": 1, "ratio": 1.5e-3, "note": "abcde"}')
    assert not accepts(grammar, '{"score": 3, "label": "urgent"}')  # required keys in schema order
    assert not accepts(grammar, '{"label": "urgent", "score": 1, "ok": true, "tags": []}')  # optional ones too
    assert not accepts(grammar, '{"label": "urgent"}')
    assert not accepts(grammar, '{"label": "urgent" , "score": 1}')  # no space after an enum value, as llama.cpp
    assert not accepts(grammar, '{"label": "urgent", "score": 01}')
    assert not accepts(grammar, '{"label": "urgent", "score": 12345678901234567}')  # 17 digits
    assert not accepts(grammar, '{\n"label": "urgent", "score": 1}')  # no newlines
    assert not accepts(grammar, '{"label": "urgent", "score": 1, "note": "abcdef"}')
    assert not accepts(grammar, '{"label": "urgent", "score": 1, "tags": ["a", "b", "c", "d"]}')


def test_local_references_and_recursion_become_rules() -> None:
    schema: dict[str, Any] = {
        "$defs": {
            "Node": {
                "type": "object",
                "properties": {"name": {"type": "string"}, "children": {"type": "array", "items": {"$ref": "#/$defs/Node"}}},
                "required": ["name"],
            }
        },
        "$ref": "#/$defs/Node",
    }
    grammar = schema_grammar(schema)
    assert accepts(grammar, '{"name": "a", "children": [{"name": "b", "children": [{"name": "c"}]}]}')
    assert not accepts(grammar, '{"name": "a", "children": [{"children": []}]}')


@pytest.mark.parametrize(
    ("schema", "problem"),
    [
        ({"type": "string", "pattern": "^[a-z]+$"}, "pattern"),
        ({"type": "string", "format": "date-time"}, "format"),
        ({"type": "integer", "enum": ["a"]}, 'which is no "integer"'),
        ({"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["b"]}, "requires 'b'"),
        ({"type": "integer", "minimum": 5, "exclusiveMaximum": 5}, "no integer"),
        ({"type": "integer", "minimum": "0"}, "minimum at 'root' must be a number"),
        ({"type": "array", "items": {"type": "integer"}, "maxItems": 1.5}, "not valid JSON Schema at maxItems"),
        ({"type": "object", "additionalProperties": True}, "additional properties"),
        ({"allOf": [{"type": "integer"}]}, "allOf"),
        ({"type": "object", "properties": {"x": {}}}, "any value"),
        ({"$ref": "#/$defs/Missing"}, "does not define"),
        ({"enum": []}, "empty enum"),
        ({"type": "array", "items": {"type": "integer"}, "minItems": 3, "maxItems": 2}, "maxItems below minItems"),
        ({"type": "decimal"}, "no type this grammar knows"),
    ],
)
def test_what_has_no_grammar_is_refused_naming_the_keyword(schema: dict[str, Any], problem: str) -> None:
    with pytest.raises(GrammarError, match=problem):
        schema_grammar(schema)


@given(st.integers(-(10**6), 10**6), st.integers(0, 10**6), st.integers(-(10**7), 10**7))
@settings(max_examples=300, deadline=None)
def test_integer_bounds_are_exactly_the_integers_between(low: int, width: int, probe: int) -> None:
    """Integer bounds in the grammar, as llama.cpp's converter writes them: every integer from low to high, written
    without leading zeros, and nothing else."""
    import re

    from pawfn.core.integer_ranges import integer_range

    high = low + width
    pattern = re.compile(integer_range(low, high))
    for value in (low, high, low - 1, high + 1, probe, (low + high) // 2):
        assert (pattern.fullmatch(str(value)) is not None) == (low <= value <= high), (low, high, value)
    assert pattern.fullmatch("0" + str(abs(low))) is None and pattern.fullmatch("-0") is None


def test_integer_bounds_reach_the_token_masks() -> None:
    grammar = schema_grammar({"type": "object", "properties": {"n": {"type": "integer", "minimum": -3, "exclusiveMaximum": 120}}, "required": ["n"]})
    assert accepts(grammar, '{"n": -3}') and accepts(grammar, '{"n": 119}') and accepts(grammar, '{"n": 0}')
    assert not accepts(grammar, '{"n": -4}') and not accepts(grammar, '{"n": 120}') and not accepts(grammar, '{"n": 007}')


def test_keywords_no_grammar_enforces_are_checked_on_the_value() -> None:
    """Number bounds and multipleOf, uniqueItems: llama.cpp's grammar ignores them (so do pawfn's masks, keeping its
    tokens); the value is checked after the call, as every output is against its whole schema."""
    from pawfn.formats.constraint import check_json_value
    from pawfn.core.errors import OutputTypeError

    schema = {
        "type": "object",
        "properties": {
            "x": {"type": "number", "maximum": 1.5, "multipleOf": 0.5},
            "tags": {"type": "array", "items": {"type": "string"}, "uniqueItems": True},
        },
        "required": ["x", "tags"],
    }
    output = JsonSchemaFormat(json_schema=JsonSchemaSpec.model_validate({"name": "point", "schema": schema}))
    grammar = schema_grammar(schema)
    assert accepts(grammar, '{"x": 2.5, "tags": ["a", "a"]}')  # the grammar lets it through
    check_json_value(output, '{"x": 1.5, "tags": ["a", "b"]}')
    with pytest.raises(OutputTypeError, match=r'\["x"\] breaks the schema.s maximum'):
        check_json_value(output, '{"x": 2.5, "tags": []}')
    with pytest.raises(OutputTypeError, match=r'\["tags"\] breaks the schema.s uniqueItems'):
        check_json_value(output, '{"x": 1.0, "tags": ["a", "a"]}')


def _nested(depth: int) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "integer"}
    for _ in range(depth):
        schema = {"type": "array", "items": schema}
    return schema


@pytest.mark.parametrize(
    ("schema", "problem"),
    [
        (_nested(200), "nests deeper"),
        ({"enum": ["x" * 100] * 2000}, "bytes"),
        ({"type": "object", "properties": {f"k{i}": {"type": "integer"} for i in range(2500)}}, "bytes|rules"),
    ],
    ids=["deep", "large", "many rules"],
)
def test_hostile_schemas_are_refused_quickly(schema: dict[str, Any], problem: str) -> None:
    started = time.perf_counter()
    with pytest.raises(GrammarError, match=problem):
        schema_grammar(schema)
    assert time.perf_counter() - started < 5.0  # a hang guard, not a speed figure


def test_the_limits_are_settings() -> None:
    with pytest.raises(GrammarError, match="more than 3 grammar rules"):
        lark_grammar(JsonSchemaFormat(json_schema=JsonSchemaSpec(schema=OBJECT)), SchemaLimits(max_rules=3))


# llama.cpp's own converter (what `response_format` builds) against pawfn's grammar, on texts made from values of
# the schema written with every separator spacing, key order and number form either grammar might treat differently
SCHEMAS: list[dict[str, Any]] = [
    OBJECT,
    {"type": "array", "items": {"type": "integer"}, "minItems": 1, "maxItems": 3},
    {"type": "object", "properties": {"a": {"type": "boolean"}, "b": {"type": "null"}, "c": {"const": "k"}}},
    {"anyOf": [{"type": "number"}, {"type": "string"}]},
]
SEPARATORS = st.sampled_from(["", " ", "", " ", "  ", "\n"])
NUMBERS = ["0", "-0", "7", "01", "-12", "1.5", "1.", ".5", "1e5", "1E+05", "2.50e-3", "1234567890123456", "12345678901234567"]


def _text(value: object, draw: Callable[[st.SearchStrategy[Any]], Any]) -> str:
    """`value` as JSON with its spacing, key order (now and then shuffled) and number forms drawn."""
    space: str = draw(SEPARATORS)
    if isinstance(value, dict):
        fields = cast(dict[str, object], value)  # cast: a drawn JSON object (str keys)
        keys: list[str] = list(fields)
        if draw(st.integers(0, 4)) == 0:
            keys = draw(st.permutations(keys))
        items = [f"{json.dumps(key)}{draw(SEPARATORS)}:{draw(SEPARATORS)}{_text(fields[key], draw)}" for key in keys]
        return "{" + space + ("," + str(draw(SEPARATORS))).join(items) + "}" + str(draw(SEPARATORS))
    if isinstance(value, list):
        items = [_text(item, draw) for item in cast(list[object], value)]  # cast: a drawn JSON array
        return "[" + space + ("," + space).join(items) + "]" + str(draw(SEPARATORS))
    if isinstance(value, int | float) and not isinstance(value, bool):
        return (json.dumps(value) if draw(st.booleans()) else str(draw(st.sampled_from(NUMBERS)))) + space
    return json.dumps(value) + space


SHORT = st.text('ab"\\', max_size=7)
NUMBER = st.integers(-(10**17), 10**17) | st.floats(allow_nan=False, allow_infinity=False)
VALUES: list[st.SearchStrategy[object]] = [
    st.fixed_dictionaries(
        {"label": st.sampled_from(["urgent", "normal", "other"]), "score": st.integers(-(10**17), 10**17)},
        optional={"tags": st.lists(SHORT, max_size=4), "ratio": NUMBER, "ok": st.booleans(), "note": st.none() | SHORT},
    ),
    st.lists(st.integers(-(10**17), 10**17), max_size=4),
    st.fixed_dictionaries({}, optional={"a": st.booleans(), "b": st.none(), "c": st.sampled_from(["k", "x"])}),
    NUMBER | SHORT,
]
"""Values mostly of each schema (a few not: other labels, 17 digits, too many items), one strategy per schema."""


@pytest.mark.skipif(not HAS_LLAMA_CPP, reason="llama-cpp-python is not installed (its schema converter is the reference)")
@settings(max_examples=300, deadline=None)
@given(st.sampled_from(range(len(SCHEMAS))), st.data())
def test_json_schema_grammars_read_texts_as_llama_cpps_own_grammar_does(index: int, data: st.DataObject) -> None:
    from llama_cpp.llama_grammar import json_schema_to_gbnf
    from llguidance.gbnf_to_lark import gbnf_to_lark

    schema = SCHEMAS[index]
    text = _text(data.draw(VALUES[index]), data.draw)
    reference = gbnf_to_lark(json_schema_to_gbnf(json.dumps(schema)))
    # the same texts, but for llama.cpp's one space after the whole value, which pawfn's calls end before
    assert accepts(schema_grammar(schema), text) == (accepts(reference, text) and not text.endswith(" ")), text


@pytest.mark.skipif(not HAS_LLAMA_CPP, reason="llama-cpp-python is not installed (its schema converter is the reference)")
def test_every_optional_subset_reads_as_in_llama_cpp() -> None:
    from llama_cpp.llama_grammar import json_schema_to_gbnf
    from llguidance.gbnf_to_lark import gbnf_to_lark

    schema = {"type": "object", "properties": {k: {"type": "integer"} for k in "abcd"}, "required": ["b"]}
    ours, reference = schema_grammar(schema), gbnf_to_lark(json_schema_to_gbnf(json.dumps(schema)))
    for size in range(5):
        for keys in itertools.permutations("abcd", size):
            text = "{" + ", ".join(f'"{key}": 1' for key in keys) + "}"
            assert accepts(ours, text) == accepts(reference, text), text
