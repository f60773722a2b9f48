"""Output formats a call can be constrained to, as data (`OutputFormat`: what a server request carries), and the Lark
grammar each becomes for llguidance, the library that builds the token masks (`docs/types.md` says why that one).

Plain formats (choices, a pattern) are the text a program writes, after up to 8 whitespace characters (a call's text
is stripped). A JSON schema becomes the language llama.cpp's own schema grammar accepts (its `response_format`): keys
in schema order, required ones first, then any ordered subset of the optional ones; one optional space after each
inner value, `{`, `[`, `:` and `,`; integers of at most 16 digits; no newlines. So pawfn's greedy tokens under a
schema are the official runtime's up to the value's end. Nothing follows a whole value, in every format: the call ends
with it (llama.cpp's grammar allows one more space before EOS, a token that changes no value).
"""

from __future__ import annotations

import json
import math
import re
from typing import TYPE_CHECKING, Annotated, Literal, TypeAlias

from pydantic import BaseModel, ConfigDict, Field, JsonValue

from .errors import GrammarError
from .integer_ranges import integer_range

if TYPE_CHECKING:
    import jsonschema.protocols

__all__ = ["ChoicesFormat", "JsonSchemaFormat", "JsonSchemaSpec", "OutputFormat", "PatternFormat", "SchemaLimits", "lark_grammar", "schema_validator"]

MAX_CHOICES = 1024
MAX_CHOICE_CHARS = 512
MAX_PATTERN_CHARS = 2048


class SchemaLimits(BaseModel):
    """Bounds on a JSON schema from a request, so a hostile schema cannot stall a server: its JSON size, its nesting
    depth and the rules its grammar may have (the grammar library's own fuel limits bound compile and mask time)."""

    model_config = ConfigDict(frozen=True)

    max_bytes: int = 64 * 1024
    max_depth: int = 24
    max_rules: int = 2000


class ChoicesFormat(BaseModel):
    """The output is one of `choices`, exactly (a `Literal`, an `Enum`)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    type: Literal["choices"] = "choices"
    choices: tuple[Annotated[str, Field(min_length=1, max_length=MAX_CHOICE_CHARS)], ...] = Field(min_length=1, max_length=MAX_CHOICES)


class PatternFormat(BaseModel):
    """The output matches the regular expression `pattern` as a whole (Rust `regex` syntax: no look-around, no
    back-references; a leading `^` and trailing `$` are allowed and change nothing)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    type: Literal["regex"] = "regex"
    pattern: str = Field(min_length=1, max_length=MAX_PATTERN_CHARS)


class JsonSchemaSpec(BaseModel):
    """OpenAI's `json_schema` object: a name and the schema."""

    model_config = ConfigDict(frozen=True, extra="ignore", serialize_by_alias=True, validate_by_name=True, validate_by_alias=True)

    name: str = Field(default="output", max_length=128)
    schema_: dict[str, JsonValue] = Field(alias="schema")
    strict: bool | None = None


class JsonSchemaFormat(BaseModel):
    """The output is a JSON value of `json_schema.schema`, as llama.cpp's schema grammar writes it (OpenAI's
    `response_format={"type": "json_schema", "json_schema": {...}}`)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    type: Literal["json_schema"] = "json_schema"
    json_schema: JsonSchemaSpec


OutputFormat: TypeAlias = Annotated[ChoicesFormat | PatternFormat | JsonSchemaFormat, Field(discriminator="type")]
"""What a call's output must be; `None` where a call is unconstrained."""

_WHITESPACE = "ws: /[ \\t\\r\\n]{1,8}/"
"""Up to 8 whitespace characters before a plain value (a call's text is stripped): what programs write before a
label, bounded so a model cannot spend its budget on blank lines. Nothing follows a value: the call ends with it."""


_OPTIONS = '%llguidance {"no_forcing": true}\n'
"""The model picks every token, as under llama.cpp's grammar sampler: by default llguidance forces the canonical
tokens of text the grammar fixes (after `"s`, only `ta` of `tatement`), which changes a greedy call's tokens."""


def lark_grammar(output: ChoicesFormat | PatternFormat | JsonSchemaFormat, limits: SchemaLimits | None = None) -> str:
    """The Lark grammar (llguidance's dialect) of `output`; `GrammarError` names what cannot be one."""
    if isinstance(output, ChoicesFormat):
        alternatives = " | ".join(_literal(choice) for choice in dict.fromkeys(output.choices))
        return f"{_OPTIONS}start: ws? ({alternatives})\n{_WHITESPACE}\n"
    if isinstance(output, PatternFormat):
        return f"{_OPTIONS}start: ws? /{_regex_body(output.pattern)}/\n{_WHITESPACE}\n"
    return _OPTIONS + _SchemaGrammar(limits or SchemaLimits()).build(output.json_schema.schema_)


def schema_validator(schema: dict[str, JsonValue]) -> jsonschema.protocols.Validator:
    """jsonschema's validator of `schema` (its `$schema` draft, else 2020-12); `GrammarError` if `schema` is no valid
    JSON Schema."""
    import jsonschema.exceptions
    import jsonschema.validators

    kind = jsonschema.validators.validator_for(schema, default=jsonschema.validators.Draft202012Validator)
    try:
        kind.check_schema(schema)
    except jsonschema.exceptions.SchemaError as exc:
        where = "/".join(str(part) for part in exc.absolute_path) or "its root"
        raise GrammarError(f"the JSON schema is not valid JSON Schema at {where}: {exc.message}") from None
    return kind(schema)


def _literal(text: str) -> str:
    """A Lark string literal: JSON's quoting, which llguidance reads."""
    return json.dumps(text, ensure_ascii=False)


def _regex_body(pattern: str) -> str:
    """`pattern` for a `/.../` terminal: anchors dropped (the whole output must match anyway), slashes escaped."""
    body = pattern.removeprefix("^")
    if body.endswith("$") and not body.endswith("\\$"):
        body = body[:-1]
    if not body:
        raise GrammarError(f"the pattern {pattern!r} matches only the empty text; give a pattern of the output")
    try:
        re.compile(body)
    except re.error as exc:
        raise GrammarError(f"the pattern {pattern!r} is not a regular expression: {exc}") from None
    except RecursionError:
        raise GrammarError(f"the pattern {pattern[:40]!r}... nests too deeply; give a flatter pattern") from None
    return re.sub(r"(?<!\\)/", r"\\/", body).replace("\n", "\\n")


# llama.cpp's schema grammar, as regular expressions: integers of at most 16 digits, no leading zero but "0"; strings
# of any characters but an unescaped quote or backslash; JSON's escapes
_INTEGRAL = "([0-9]|[1-9][0-9]{1,15})"
_CHAR = '([^"\\\\]|\\\\(["\\\\\\/bfnrt]|u[0-9a-fA-F]{4}))'
_TERMINALS = {
    "integer": f"/-?{_INTEGRAL}/",
    "number": f"/-?{_INTEGRAL}(\\.[0-9]{{1,16}})?([eE][-+]?{_INTEGRAL})?/",
    "boolean": '("true" | "false")',
    "null": '"null"',
    "string": f'/"{_CHAR}*"/',
}
_ANNOTATIONS = frozenset({"title", "description", "default", "examples", "$comment", "deprecated", "readOnly", "writeOnly", "$schema", "$id"})
_BOUNDS = frozenset({"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"})
_SUPPORTED = {
    "object": frozenset({"type", "properties", "required", "additionalProperties"}),
    "array": frozenset({"type", "items", "minItems", "maxItems", "prefixItems"}),
    "string": frozenset({"type", "minLength", "maxLength"}),
    "integer": frozenset({"type"}) | _BOUNDS,
    "number": frozenset({"type"}),
    "boolean": frozenset({"type"}),
    "null": frozenset({"type"}),
}
"""Keywords the grammar enforces, per type."""
CHECKED_AFTER = {
    "number": _BOUNDS | {"multipleOf"},
    "integer": frozenset({"multipleOf"}),
    "array": frozenset({"uniqueItems"}),
    "object": frozenset({"minProperties", "maxProperties"}),
}
"""Keywords no grammar here enforces and llama.cpp's schema grammar ignores too (so the official runtime's tokens
stay the same): checked on the value after the call, as every output is against its whole schema."""
_MOST = 10**16 - 1
"""The largest integer llama.cpp's schema grammar writes (16 digits)."""


class _SchemaGrammar:
    """Turns a JSON schema into Lark rules; refuses, naming the keyword, what llama.cpp's grammar would read
    differently or what has no grammar here (numeric bounds, string formats and patterns, `allOf`)."""

    def __init__(self, limits: SchemaLimits) -> None:
        self._limits = limits
        self._rules: dict[str, str] = {}
        self._definitions: dict[str, JsonValue] = {}
        self._named: dict[str, str] = {}

    def build(self, schema: dict[str, JsonValue]) -> str:
        size = len(json.dumps(schema))
        if size > self._limits.max_bytes:
            raise GrammarError(f"the JSON schema is {size} bytes, more than the {self._limits.max_bytes} allowed; send a smaller schema")
        for key in ("$defs", "definitions"):
            definitions = schema.get(key)
            if isinstance(definitions, dict):
                for name, definition in definitions.items():
                    self._definitions[f"#/{key}/{name}"] = definition
        start = self._value(
            schema, "root", 0, after=""
        )  # nothing after the whole value: the call ends there; bounds the depth before jsonschema recurses through it
        schema_validator(schema)  # a schema jsonschema cannot read is refused now, not after a call
        rules = [f"start: {start}", 'space: " "?', *(f"{name}: {body}" for name, body in self._rules.items())]
        return "\n".join(rules) + "\n"

    def _rule(self, hint: str, body: str) -> str:
        if len(self._rules) >= self._limits.max_rules:
            raise GrammarError(f"the JSON schema needs more than {self._limits.max_rules} grammar rules; send a smaller schema")
        name = f"r{len(self._rules)}_{re.sub('[^a-z0-9]', '', hint.lower())[:24]}"
        self._rules[name] = body
        return name

    def _value(self, schema: JsonValue, hint: str, depth: int, after: str = " space") -> str:
        """A rule (or inline expression) for one value of `schema`, followed by `after`: llama.cpp's optional space
        inside a value, nothing after the whole one (the call ends when its value does)."""
        if depth > self._limits.max_depth:
            raise GrammarError(f"the JSON schema nests deeper than {self._limits.max_depth} levels; send a flatter schema")
        if schema is True or schema == {}:
            raise GrammarError("the JSON schema allows any value somewhere (`{}` or `true`); give every value a type")
        if not isinstance(schema, dict):
            raise GrammarError(f"a JSON schema must be an object, not {json.dumps(schema)[:80]}")
        ref = schema.get("$ref")
        if isinstance(ref, str):
            return self._reference(ref, depth) if after else self._value(self._definition(ref), ref.rsplit("/", 1)[-1], depth + 1, after)
        for keyword in ("anyOf", "oneOf"):
            options = schema.get(keyword)
            if isinstance(options, list):
                return "(" + " | ".join(self._value(option, hint, depth + 1, after) for option in options) + ")"
        if "allOf" in schema or "not" in schema or "if" in schema:
            raise GrammarError("the JSON schema uses allOf, not or if, which have no grammar here; use anyOf or plain types")
        # a constant or an enum value has no optional space after it, as in llama.cpp's grammar (other values do)
        if "const" in schema:
            _check_types([schema["const"]], schema.get("type"), "const", hint)
            return _literal(json.dumps(schema["const"], ensure_ascii=False))
        enum = schema.get("enum")
        if isinstance(enum, list):
            if not enum:
                raise GrammarError("the JSON schema has an empty enum: no value fits it")
            _check_types(enum, schema.get("type"), "enum", hint)
            return "(" + " | ".join(_literal(json.dumps(value, ensure_ascii=False)) for value in enum) + ")"
        kind = schema.get("type")
        if isinstance(kind, list):
            return "(" + " | ".join(self._value({**schema, "type": one}, hint, depth + 1, after) for one in kind) + ")"
        if not isinstance(kind, str) or kind not in _SUPPORTED:
            raise GrammarError(f"the JSON schema at {hint!r} has no type this grammar knows ({json.dumps(schema)[:80]}); give it a JSON type")
        unsupported = set(schema) - _SUPPORTED[kind] - CHECKED_AFTER.get(kind, frozenset()) - _ANNOTATIONS - {"$defs", "definitions"}
        if unsupported:
            raise GrammarError(
                f"the JSON schema's {kind} at {hint!r} uses {', '.join(sorted(unsupported))}, which the grammar cannot enforce; "
                "drop it from the type (check it after the call) or use a Literal or a pattern"
            )
        if kind == "integer" and _BOUNDS & set(schema):
            return f"/{integer_range(*_integer_bounds(schema, hint))}/{after}"
        if kind == "object":
            return self._object(schema, hint, depth, after)
        if kind == "array":
            return self._array(schema, hint, depth, after)
        if kind == "string" and ("minLength" in schema or "maxLength" in schema):
            low, high = _count(schema, "minLength", 0), schema.get("maxLength")
            repeat = f"{{{low},{high}}}" if isinstance(high, int) else f"{{{low},}}"
            return f'/"{_CHAR}{repeat}"/{after}'
        return f"{_TERMINALS[kind]}{after}"

    def _reference(self, ref: str, depth: int) -> str:
        if ref in self._named:
            return self._named[ref]
        definition = self._definition(ref)
        name = f"r{len(self._rules)}_ref"
        self._named[ref] = name
        self._rules[name] = ""  # reserved first: a recursive definition refers to itself
        self._rules[name] = self._value(definition, ref.rsplit("/", 1)[-1], depth + 1)
        return name

    def _definition(self, ref: str) -> JsonValue:
        definition = self._definitions.get(ref)
        if definition is None:
            raise GrammarError(f"the JSON schema refers to {ref!r}, which it does not define; only local $defs are read")
        return definition

    def _object(self, schema: dict[str, JsonValue], hint: str, depth: int, after: str) -> str:
        additional = schema.get("additionalProperties")
        if additional not in (None, False):
            raise GrammarError(f"the JSON schema's object at {hint!r} allows additional properties; list them (or set additionalProperties false)")
        properties = schema.get("properties") or {}
        required_names = schema.get("required") or []
        if not isinstance(properties, dict) or not isinstance(required_names, list):
            raise GrammarError(f"the JSON schema's object at {hint!r} has malformed properties or required")
        pairs = {
            name: self._rule(
                f"{hint}-{name}-kv", f'{_literal(json.dumps(name, ensure_ascii=False))} space ":" space {self._value(value, name, depth + 1)}'
            )
            for name, value in properties.items()
        }
        missing = [name for name in required_names if name not in properties]
        if missing:
            raise GrammarError(
                f"the JSON schema's object at {hint!r} requires {', '.join(map(repr, missing))}, which its properties do not list "
                "(and no other property is allowed): no object fits it; list them under properties"
            )
        required = [pairs[name] for name in properties if name in required_names]
        optional = [pairs[name] for name in properties if name not in required_names]
        parts = [' "," space '.join(required)] if required else []
        if optional:
            # any ordered subset of the optional properties, as llama.cpp's grammar allows: the first one taken, then
            # each later one or not
            tails = [""] * (len(optional) + 1)
            for index in reversed(range(1, len(optional))):
                tails[index] = self._rule(f"{hint}-rest", f'("," space {optional[index]})? {tails[index + 1]}'.strip())
            firsts = " | ".join(f"{optional[index]} {tails[index + 1]}".strip() for index in range(len(optional)))
            parts.append(f'("," space ({firsts}))?' if required else f"({firsts})?")
        return self._rule(hint, " ".join(['"{" space', *parts, '"}"']) + after)

    def _array(self, schema: dict[str, JsonValue], hint: str, depth: int, after: str) -> str:
        prefix = schema.get("prefixItems")
        if isinstance(prefix, list):
            if "items" in schema and schema["items"] is not False:
                raise GrammarError(f"the JSON schema's array at {hint!r} has prefixItems and more items; use a fixed tuple")
            items = ' "," space '.join(self._value(item, f"{hint}-{i}", depth + 1) for i, item in enumerate(prefix))
            return self._rule(hint, f'"[" space {items} "]"{after}')
        item = self._value(schema.get("items", {}), f"{hint}-item", depth + 1)
        low, high = _count(schema, "minItems", 0), schema.get("maxItems")
        if isinstance(high, int) and high < low:
            raise GrammarError(f"the JSON schema's array at {hint!r} has maxItems below minItems: no value fits it")
        if high == 0:
            return self._rule(hint, f'"[" space "]"{after}')
        more = f"{{{max(low - 1, 0)},{high - 1}}}" if isinstance(high, int) else ("*" if low <= 1 else f"{{{low - 1},}}")
        items = f'{item} ("," space {item}){more}'
        return self._rule(hint, f'"[" space {items if low else f"({items})?"} "]"{after}')


def _check_types(values: list[JsonValue], kind: JsonValue, keyword: str, hint: str) -> None:
    """Refuse an enum or const value outside the node's `type` (the grammar would write it, the schema refuse it)."""
    import jsonschema.validators

    kinds = [kind] if isinstance(kind, str) else kind if isinstance(kind, list) else []
    checker = jsonschema.validators.Draft202012Validator.TYPE_CHECKER
    known = [k for k in kinds if isinstance(k, str) and k in _SUPPORTED]
    for value in values if known else []:
        if not any(checker.is_type(value, k) for k in known):
            raise GrammarError(
                f"the JSON schema's {keyword} at {hint!r} holds {json.dumps(value)[:40]}, which is no {json.dumps(kind)}: no output "
                "could be both; fix the schema"
            )


def _integer_bounds(schema: dict[str, JsonValue], hint: str) -> tuple[int, int]:
    """The least and the greatest integer `schema` allows, within the 16 digits llama.cpp's grammar writes."""
    low, high = -_MOST, _MOST
    for key in _BOUNDS & set(schema):
        value = schema[key]
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            raise GrammarError(f"the JSON schema's {key} at {hint!r} must be a number, not {json.dumps(value)[:40]}")
        if key == "minimum":
            low = max(low, math.ceil(value))
        elif key == "exclusiveMinimum":
            low = max(low, math.floor(value) + 1)
        elif key == "maximum":
            high = min(high, math.floor(value))
        else:
            high = min(high, math.ceil(value) - 1)
    if low > high:
        raise GrammarError(f"the JSON schema's integer at {hint!r} has bounds no integer of at most 16 digits fits; fix them")
    return low, high


def _count(schema: dict[str, JsonValue], key: str, default: int) -> int:
    value = schema.get(key, default)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise GrammarError(f"the JSON schema's {key} must be a non-negative integer, not {value!r}")
    return value
