"""Constrained decoding: a call's `OutputFormat` as a token mask at every step (llguidance builds the masks; pawfn
applies them in its own decode loops), grammars compiled once per (tokenizer, format)."""

from __future__ import annotations

import functools
import json
import threading
import weakref
from collections import OrderedDict
from typing import TYPE_CHECKING
from weakref import WeakKeyDictionary

import numpy as np
from numpy.typing import NDArray

from ..core.errors import GrammarError, OutputTypeError
from ..core.grammar import ChoicesFormat, JsonSchemaFormat, OutputFormat, PatternFormat, SchemaLimits, lark_grammar, schema_validator

if TYPE_CHECKING:
    import jsonschema.protocols
    import llguidance
    from jsonschema import ValidationError

    from .tokenizer import TextCodec

__all__ = ["Constraint", "check_json_value", "check_output", "compile_output", "describe"]

_CACHE_SIZE = 64
_LEXER_FUEL, _STEP_FUEL, _GRAMMAR_SIZE = 2_000_000, 400_000, 200_000
"""llguidance's resource bounds (about 40 ms to build a grammar's lexer, 30 ms per mask step at worst): a hostile
schema or pattern fails its own call instead of stalling the step every other call shares."""


def describe(output: OutputFormat) -> str:
    """The format in words, for errors."""
    if isinstance(output, ChoicesFormat):
        shown = ", ".join(repr(choice) for choice in output.choices[:8])
        return f"choice of {shown}{', ...' if len(output.choices) > 8 else ''}"
    if isinstance(output, PatternFormat):
        return f"text matching {output.pattern!r}"
    return f"JSON value of the schema {output.json_schema.name!r}"


def check_output(output: OutputFormat, limits: SchemaLimits | None = None) -> None:
    """`GrammarError` now if `output` has no grammar (what a call would find at its start), for any tokenizer."""
    import llguidance

    problem = llguidance.LLMatcher.validate_grammar(llguidance.LLMatcher.grammar_from_lark(lark_grammar(output, limits)))
    if problem and not problem.startswith("WARNING"):
        raise GrammarError(f"the {describe(output)} has no grammar: {_first_reason(problem)}")


def check_json_value(output: JsonSchemaFormat, text: str) -> None:
    """`OutputTypeError` unless `text` is a JSON value of the output's whole schema, checked by jsonschema: the keywords
    the grammar cannot enforce, and any value the grammar let through (an enum outside the type, a required property
    the object does not list)."""
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise OutputTypeError(describe(output), text, f"it is not JSON ({exc})") from None
    errors: list[ValidationError] = list(_validator(json.dumps(output.json_schema.schema_, sort_keys=True)).iter_errors(value))
    if errors:
        error = max(errors, key=lambda found: len(found.absolute_path))  # the most specific place
        where = "".join(f"[{json.dumps(part)}]" for part in error.absolute_path) or "the value"
        raise OutputTypeError(describe(output), text, f"{where} breaks the schema's {error.validator}: {error.message}")


@functools.lru_cache(maxsize=64)
def _validator(schema: str) -> jsonschema.protocols.Validator:
    """The validator of a schema (given as its JSON, so it can key the cache), built once."""
    return schema_validator(json.loads(schema))


def _first_reason(message: str) -> str:
    """llguidance's message in one line: where, and the `error:` line that says why, if there is one."""
    lines = message.splitlines()
    reasons = [line.strip().removeprefix("error:").strip() for line in lines if line.strip().startswith("error:")]
    return "; ".join([lines[0].rstrip(":"), *reasons[:1]]) if lines else message


class _Grammars:
    """The llguidance tokenizer of one codec and its compiled grammars (pristine matchers, copied per call)."""

    def __init__(self, codec: TextCodec) -> None:
        import llguidance

        self.vocab_size = codec.vocab_size
        self.tokenizer = llguidance.LLTokenizer(llguidance.TokenizerWrapper(_CodecTokens(codec)), n_vocab=codec.vocab_size, eos_token=codec.eos_id)
        self._compiled: OrderedDict[str, llguidance.LLMatcher] = OrderedDict()
        self._lock = threading.Lock()

    def matcher(self, output: OutputFormat, limits: SchemaLimits | None) -> llguidance.LLMatcher:
        key = output.model_dump_json()
        with self._lock:
            cached = self._compiled.get(key)
            if cached is not None:
                self._compiled.move_to_end(key)
                return cached.deep_copy()
        import llguidance

        grammar = llguidance.LLMatcher.grammar_from_lark(lark_grammar(output, limits))
        bounds = llguidance.LLParserLimits(initial_lexer_fuel=_LEXER_FUEL, step_lexer_fuel=_STEP_FUEL, max_grammar_size=_GRAMMAR_SIZE)
        pristine = llguidance.LLMatcher(self.tokenizer, grammar, log_level=0, limits=bounds)
        if pristine.is_error():
            raise GrammarError(f"the {describe(output)} has no grammar: {_first_reason(pristine.get_error())}")
        with self._lock:
            self._compiled[key] = pristine
            while len(self._compiled) > _CACHE_SIZE:
                self._compiled.popitem(last=False)
        return pristine.deep_copy()


class _CodecTokens:
    """A `TextCodec` as llguidance's tokenizer wrapper: each token's bytes (control tokens marked special)."""

    def __init__(self, codec: TextCodec) -> None:
        self.eos_token_id = codec.eos_id
        self.bos_token_id = None
        self.tokens = codec.grammar_pieces()
        self.special_token_ids = codec.special_ids()
        self._codec = weakref.ref(codec)  # weak: the grammars are cached by codec, and go with it

    def __call__(self, text: bytes) -> list[int]:
        codec = self._codec()
        return [] if codec is None else codec.encode(text.decode("utf-8", errors="replace"), parse_special=False)


_by_codec: WeakKeyDictionary[TextCodec, _Grammars] = WeakKeyDictionary()
_by_codec_lock = threading.Lock()


def _grammars(codec: TextCodec) -> _Grammars:
    with _by_codec_lock:
        grammars = _by_codec.get(codec)
        if grammars is None:
            grammars = _by_codec[codec] = _Grammars(codec)
        return grammars


def compile_output(codec: TextCodec, output: OutputFormat, limits: SchemaLimits | None = None) -> Constraint:
    """A fresh constraint for one call (`GrammarError` if `output` has no grammar)."""
    grammars = _grammars(codec)
    return Constraint(grammars.matcher(output, limits), output, grammars.vocab_size)


class Constraint:
    """One call's grammar state: which tokens may come next, and the tokens taken so far."""

    def __init__(self, matcher: llguidance.LLMatcher, output: OutputFormat, vocab_size: int) -> None:
        self._matcher = matcher
        self.output = output
        self.vocab_size = vocab_size
        self.words = (vocab_size + 31) // 32
        """int32 words of one row's bitmask."""

    def fill(self, bitmask: NDArray[np.int32], row: int) -> None:
        """Write the allowed next tokens, one bit each, into `bitmask[row]`."""
        target = bitmask[row]
        self._matcher.unsafe_compute_mask_ptr(target.ctypes.data, target.nbytes)
        self._check()

    def allowed(self, width: int) -> NDArray[np.bool_]:
        """The tokens that may come next, one boolean per logit of a `width`-wide row (past the tokenizer's: never)."""
        bitmask = np.full((1, self.words), -1, dtype=np.int32)
        self.fill(bitmask, 0)
        bits = np.unpackbits(bitmask.view(np.uint8), bitorder="little").astype(np.bool_)
        return bits[:width] if bits.shape[0] >= width else np.pad(bits, (0, width - bits.shape[0]))

    def consume(self, token: int) -> None:
        """Advance past `token` (one the mask allowed)."""
        self._matcher.consume_token(token)
        self._check()

    @property
    def accepting(self) -> bool:
        """The output so far is a whole value."""
        return self._matcher.is_accepting()

    @property
    def finished(self) -> bool:
        """Nothing but the end can come next."""
        return self._matcher.is_stopped()

    def _check(self) -> None:
        if self._matcher.is_error():
            problem = self._matcher.get_error().splitlines()[0]
            raise OutputTypeError(describe(self.output), "", f"the grammar failed: {problem}")
