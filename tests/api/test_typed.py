"""Typed outputs end to end: `PawFn.returning(T)` on the Torch and llama.cpp backends and through a server, on the
tiny and the trained models. Masking only removes tokens the type forbids, so a greedy call whose plain output
already fits gives the same tokens; one that does not fit still gives a value; under a JSON schema the tokens are
llama.cpp's own grammar's (`response_format`)."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any, Literal

import pytest
from pydantic import BaseModel

import pawfn
from pawfn import (
    ChoicesFormat,
    GrammarError,
    JsonSchemaFormat,
    JsonSchemaSpec,
    LlamaCpp,
    OutputTypeError,
    PawConfig,
    PawFn,
    Pattern,
    PatternFormat,
    Qwen3_0_6B,
    Remote,
    RuntimeOptions,
    Torch,
)
from pawfn.core.backends import Backend
from pawfn.core.grammar import OutputFormat
from pawfn.calls.pending import PendingGeneration
from pawfn.formats.constraint import Constraint
from tests.helpers.programs import TinyProgram, requires_llama_cpp, torch_program
from tests.helpers.references import llama_generate_json
from tests.helpers.servers import FIRST_ID, INPUTS, KEY, ServeProcess
from tests.helpers.trained import Family, load_trained

TEXTS = ["Urgent: the server is down!", "hello world", "a b c d e f", "numbers 12345 and words", "x"]
ANY_TEXT = PatternFormat(pattern=r"[\s\S]*")


def _open(program: TinyProgram, backend: type[Backend] = Torch) -> PawFn[Any, Any]:
    return PawFn.load_any_sync(str(program.folder), backend, base=program.interpreter.gguf_path)


@pytest.fixture(params=[Torch, pytest.param(LlamaCpp, marks=requires_llama_cpp)], ids=["torch", "llamacpp"])
def tiny(request: pytest.FixtureRequest, qwen3_program: TinyProgram) -> Iterator[PawFn[Any, Any]]:
    with _open(qwen3_program, request.param) as function:
        yield function


def test_masking_keeps_a_greedy_output_that_already_fits(tiny: PawFn[Any, Any]) -> None:
    """The random model writes stray bytes, which no text type fits: each output is cut to its longest head that is
    text, and a choice among that head and decoys gives the head's tokens (then maybe whitespace, which a choice may
    end with); a whole output that is text keeps all of its tokens under a pattern of any text."""
    options = RuntimeOptions(max_tokens=8)
    whole = 0
    for text in [*TEXTS, "hello", "the end", "1 2 3"]:
        plain = tiny.generate(text, options).token_ids
        head = max((k for k in range(1, len(plain) + 1) if "\ufffd" not in tiny.runtime.decode_tokens(plain[:k])), default=0)
        if head == 0:
            continue
        choice = ChoicesFormat(choices=(tiny.runtime.decode_tokens(plain[:head]), "zzz", "0"))
        constrained = tiny.generate(text, options.model_copy(update={"response_format": choice})).token_ids
        assert constrained[:head] == plain[:head], text
        assert not tiny.runtime.decode_tokens(constrained[head:]).strip()  # then at most the whitespace a choice may end with
        if head == len(plain):
            whole += 1
            assert tiny.generate(text, options.model_copy(update={"response_format": ANY_TEXT})).token_ids == plain, text
    assert whole >= 1


def test_outputs_that_do_not_fit_still_give_values_of_the_type(tiny: PawFn[Any, Any]) -> None:
    triage = tiny.returning(Literal["urgent", "normal", "spam"])
    assert all(label in ("urgent", "normal", "spam") for label in triage.run_batch(TEXTS))
    numbers = tiny.returning(int).run_batch(TEXTS, RuntimeOptions(max_tokens=24))
    assert all(isinstance(number, int) for number in numbers)
    codes = tiny.returning(Annotated[str, Pattern(r"[A-Z]{2}-[0-9]{3}")]).run_batch(TEXTS)
    assert all(re.fullmatch(r"[A-Z]{2}-[0-9]{3}", code) for code in codes)
    flags = tiny.returning(list[bool]).run_batch(TEXTS, RuntimeOptions(max_tokens=64))
    assert all(isinstance(flag, bool) for row in flags for flag in row)


class Summary(BaseModel):
    kind: Literal["question", "statement"]
    urgent: bool
    words: int


def test_a_call_ends_when_its_value_is_complete(tiny: PawFn[Any, Any]) -> None:
    """No token follows a whole value, in every typed form: the call's tokens are its value (after any leading
    whitespace), nothing after it (a model once spelled a label and then 8 whitespace tokens before EOS)."""
    outputs: list[OutputFormat] = [
        ChoicesFormat(choices=("yes", "no", "maybe")),
        PatternFormat(pattern="[0-9]{3}"),
        JsonSchemaFormat(
            json_schema=JsonSchemaSpec(schema={"type": "object", "properties": {"n": {"type": "integer", "maximum": 9}}, "required": ["n"]})
        ),
    ]
    for output in outputs:
        for text in TEXTS:
            generation = tiny.generate(text, RuntimeOptions(max_tokens=40, response_format=output))
            written = tiny.runtime.decode_tokens(generation.token_ids)
            assert written == written.rstrip() and written.strip() == generation.text, (output, text, written)
            assert generation.stop_reason == "eos"


def test_a_value_that_cannot_finish_is_a_typed_error_with_the_text_so_far(tiny: PawFn[Any, Any]) -> None:
    summary = tiny.returning(Summary)
    with pytest.raises(OutputTypeError, match=r"no value finished within 3 tokens \(stopped by max_tokens\)") as caught:
        summary.run(TEXTS[0], RuntimeOptions(max_tokens=3))
    assert caught.value.text.startswith("{") and "Summary" in str(caught.value)
    with pytest.raises(OutputTypeError, match="within 0 tokens"):
        summary.run(TEXTS[0], RuntimeOptions(max_tokens=0))


def test_sampling_draws_from_the_masked_distribution_with_the_calls_own_generator(tiny: PawFn[Any, Any]) -> None:
    triage = tiny.returning(Literal["urgent", "normal", "spam"])
    options = RuntimeOptions(temperature=1.5, seed=7, max_tokens=24)
    first = [triage.run(text, options) for text in TEXTS]
    assert first == [triage.run(text, options) for text in TEXTS]
    assert all(label in ("urgent", "normal", "spam") for label in first)


def test_rows_of_different_types_and_untyped_rows_share_steps_and_each_gets_its_tokens_alone(qwen3_program: TinyProgram) -> None:
    options = RuntimeOptions(max_tokens=64)
    with _open(qwen3_program) as function:
        kinds = [function.returning(Literal["urgent", "normal"]), function.returning(str), function.returning(int), function.returning(Summary)]
        calls = [(kinds[i % len(kinds)], TEXTS[i % len(TEXTS)]) for i in range(12)]
        alone = [program.generate(text, options).generation.token_ids for program, text in calls]
        scheduler = torch_program(function).base.scheduler
        steps, rows = scheduler.steps, scheduler.rows_stepped
        together = pawfn.generate_many(calls, options)
        assert scheduler.rows_stepped - rows > 2 * (scheduler.steps - steps)  # the rows really shared steps
        assert [generation.token_ids for generation in together] == alone
        values = pawfn.run_many(calls, options)
        assert [type(value) for value in values[:4]] == [str, str, int, Summary]


def test_a_failing_mask_fails_its_own_call_only(qwen3_program: TinyProgram, monkeypatch: pytest.MonkeyPatch) -> None:
    original = Constraint.fill

    def fill(self: Constraint, bitmask: Any, row: int) -> None:  # noqa: ANN401
        if isinstance(self.output, ChoicesFormat) and self.output.choices == ("boom",):
            raise RuntimeError("the mask failed")
        original(self, bitmask, row)

    monkeypatch.setattr(Constraint, "fill", fill)
    with _open(qwen3_program) as function:
        options = RuntimeOptions(max_tokens=6)
        pendings = [function.submit(text, options) for text in TEXTS[:2]]
        broken = function.submit(TEXTS[2], options.model_copy(update={"response_format": ChoicesFormat(choices=("boom",))}))
        with pytest.raises(RuntimeError, match="the mask failed"):
            broken.result()
        assert all(len(pending.result().token_ids) == 6 for pending in pendings)


def test_a_type_without_a_grammar_is_refused_before_any_call(qwen3_program: TinyProgram) -> None:
    with _open(qwen3_program) as function, pytest.raises(GrammarError, match="additional properties"):
        function.returning(dict[str, int])


def test_through_a_server_and_remote(server: ServeProcess, local_runs: dict[str, PawFn[Qwen3_0_6B, Torch]]) -> None:
    config = PawConfig.from_env(server_url=server.url, server_api_key=KEY, max_retries=0)
    options = RuntimeOptions(max_tokens=24)
    with PawFn[Qwen3_0_6B, Remote].load_sync(FIRST_ID, config=config) as remote:
        local = local_runs[FIRST_ID]
        assert remote.returning(Literal["urgent", "normal"]).run_batch(INPUTS, options) == local.returning(Literal["urgent", "normal"]).run_batch(
            INPUTS, options
        )
        assert remote.returning(int).run_batch(INPUTS, options) == local.returning(int).run_batch(INPUTS, options)
        assert asyncio.run(remote.returning(int).arun_batch(INPUTS, options)) == local.returning(int).run_batch(INPUTS, options)  # one request
        with pytest.raises(OutputTypeError, match="Summary") as unfinished:  # the server's error, typed as a local call's
            remote.returning(Summary).run(INPUTS[0], RuntimeOptions(max_tokens=4))
        with pytest.raises(OutputTypeError) as unfinished_here:
            local.returning(Summary).run(INPUTS[0], RuntimeOptions(max_tokens=4))
        assert repr(unfinished_here.value.text) in str(unfinished.value)
        assert remote.returning(bool).generate(INPUTS[0]).generation.token_ids == local.returning(bool).generate(INPUTS[0]).generation.token_ids
        deep: dict[str, Any] = {"type": "integer"}
        for _ in range(100):
            deep = {"type": "array", "items": deep}
        hostile: list[tuple[ChoicesFormat | PatternFormat | JsonSchemaFormat, str]] = [
            (JsonSchemaFormat(json_schema=JsonSchemaSpec(schema={"type": "object", "additionalProperties": True})), "additional properties"),
            (JsonSchemaFormat(json_schema=JsonSchemaSpec(schema=deep)), "nests deeper"),
            (PatternFormat(pattern="(" * 900 + "a" + ")" * 900), "nests too deeply"),
        ]
        for output, problem in hostile:  # each refused before any decoding, the server still serving
            with pytest.raises(pawfn.RequestError, match=problem) as caught:
                remote.generate(INPUTS[0], RuntimeOptions(response_format=output))
            assert caught.value.code == "invalid_response_format"
        assert remote.returning(int).run(INPUTS[1], options) == local.returning(int).run(INPUTS[1], options)


def _tokens(function: PawFn[Any, Any], text: str, options: RuntimeOptions) -> list[int]:
    """The tokens of a call, complete or not (one that runs out of budget raises; its tokens are kept)."""
    tokens: list[int] = []
    try:
        function.runtime.submit(text, options, tokens.append).result()
    except OutputTypeError:
        pass
    return tokens


SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "kind": {"enum": ["class", "function", "operator", "statement"]},
        "ok": {"type": "boolean"},
        "n": {"type": "integer"},
        "name": {"type": "string", "maxLength": 12},
    },
    "required": ["kind", "ok", "n"],
}


@requires_llama_cpp
@pytest.mark.llamacpp
@pytest.mark.parametrize("backend", [Torch, LlamaCpp])
@pytest.mark.parametrize("family", ["qwen3", "gpt2"])
def test_json_schema_tokens_equal_llama_cpps_own_grammar_on_trained_models(family: Family, backend: type[Backend], tmp_path: Path) -> None:
    """On the F32 files, where pawfn's float32 gives llama.cpp's tokens: the same schema through llama.cpp's converter and
    grammar sampler (`response_format`) and through pawfn's grammar and masks gives the same tokens on every input, up
    to the value's end (llama.cpp's grammar allows one space after it, which a trained model may write before EOS;
    pawfn's call ends with the value)."""
    fixture = load_trained(family)
    program, base = fixture.program_with_f32_adapter(tmp_path), fixture.base("f32")
    expected = llama_generate_json(base, fixture.adapter_f32, fixture.template, fixture.inputs, SCHEMA, 48, n_ctx=2048, kv="f32")
    options = RuntimeOptions(max_tokens=48, response_format=JsonSchemaFormat(json_schema=JsonSchemaSpec(schema=SCHEMA)))
    with PawFn.specialize(fixture.model, backend).load_sync(program, base=base, config=PawConfig(n_ctx=2048)) as function:
        found = [_tokens(function, text, options) for text in fixture.inputs]
        after_value = [function.runtime.decode_tokens(theirs[len(ours) :]) for ours, theirs in zip(found, expected, strict=True)]
    assert [theirs[: len(ours)] for ours, theirs in zip(found, expected, strict=True)] == found
    assert all(len(ours) == len(theirs) or rest == " " for ours, theirs, rest in zip(found, expected, after_value, strict=True)), after_value


@pytest.mark.parametrize("family", ["qwen3", "gpt2"])
def test_trained_outputs_that_fit_keep_their_tokens(family: Family) -> None:
    """Peaked models, 16 inputs, 32 greedy tokens: constrained to a choice among their own plain text and decoys, or to
    any text, each call gives its plain tokens; the calls run together as one batch."""
    fixture = load_trained(family)
    options = RuntimeOptions(max_tokens=32)
    with PawFn.specialize(fixture.model, Torch).load_sync(fixture.program, base=fixture.base("q8_0")) as function:
        plain = [generation.token_ids for generation in function.generate_batch(list(fixture.inputs), options)]
        pendings: list[PendingGeneration] = []
        for text, tokens in zip(fixture.inputs, plain, strict=True):
            decoys = ChoicesFormat(choices=("the", function.runtime.decode_tokens(tokens), "The class"))
            for output in (decoys, ANY_TEXT):
                pendings.append(function.submit(text, options.model_copy(update={"response_format": output})))
        constrained = [pending.result().token_ids for pending in pendings]
    assert constrained == [tokens for tokens in plain for _ in range(2)]


class Passage(BaseModel):
    topic: Literal["class", "function", "operator", "statement", "other"]
    about_python: bool
    words: int


@pytest.mark.parametrize("family", ["qwen3", "gpt2"])
def test_trained_outputs_that_do_not_fit_become_values(family: Family) -> None:
    """The trained programs continue documentation passages, which fit none of these types: every call still ends
    with a value of its type, decoded together in one batch."""
    fixture = load_trained(family)
    options = RuntimeOptions(max_tokens=64)
    with PawFn.specialize(fixture.model, Torch).load_sync(fixture.program, base=fixture.base("q8_0")) as function:
        inputs = list(fixture.inputs)
        assert all(label in ("yes", "no") for label in function.returning(Literal["yes", "no"]).run_batch(inputs, options))
        assert all(isinstance(number, int) for number in function.returning(int).run_batch(inputs, options))
        assert all(isinstance(passage, Passage) for passage in function.returning(Passage).run_batch(inputs, options))


def test_a_closed_base_takes_its_compiled_grammars_with_it(qwen3_program: TinyProgram) -> None:
    """Grammars are cached per tokenizer, weakly: the cache keeps no codec (and no base) alive."""
    import gc
    import weakref

    from pawfn.formats.constraint import _by_codec  # pyright: ignore[reportPrivateUsage]  # the cache under test

    with _open(qwen3_program) as function:
        function.returning(Literal["urgent", "normal"]).run(TEXTS[0])
        codec = weakref.ref(function.runtime._prompt.codec)  # type: ignore[attr-defined]  # noqa: SLF001  # pyright: ignore[reportAttributeAccessIssue, reportUnknownMemberType, reportUnknownArgumentType]  # the codec, to watch it go
        assert codec() in _by_codec
    del function
    gc.collect()
    assert codec() is None
