"""Bare interpreters (no program) and numbered templates: `PawFn[M, B].bare(...)` on the official base template or
a numbered one, called through `Positional[*Args]`; the tokens are the official SDK's base mode's (llama.cpp, the
whole rendered prompt tokenized at once with special tokens parsed, no adapter) on Torch and llama.cpp."""

from __future__ import annotations

import pytest

from pawfn import (
    ArityError,
    BaseModelError,
    ConfigError,
    GPT2,
    Image,
    LlamaCpp,
    PawConfig,
    PawFn,
    Positional,
    Qwen3_0_6B,
    Remote,
    RuntimeOptions,
    TemplateError,
    Torch,
)
from pawfn.core.backends import Backend
from pawfn.core.models import InterpreterModel
from tests.helpers.programs import TinyProgram, requires_llama_cpp
from tests.helpers.references import llama_generate_whole
from tests.helpers.tiny_models import TinyInterpreter

TEXTS = ["hello world", "Urgent: the server is down!", "numbers 12345", "x"]
NUMBERED = "Context: {INPUT_0}. Question: {INPUT_1}. Answer:"
CHAT = "<|im_start|>system\n{INPUT_0}<|im_end|>\n<|im_start|>user\n{INPUT_1}<|im_end|>\n<|im_start|>assistant\n"
BACKENDS = [Torch, pytest.param(LlamaCpp, marks=requires_llama_cpp)]
MODELS: dict[str, type[InterpreterModel]] = {"qwen3": Qwen3_0_6B, "gpt2": GPT2}


@pytest.fixture(params=["qwen3", "gpt2"])
def interpreter(request: pytest.FixtureRequest, qwen3: TinyInterpreter, gpt2: TinyInterpreter) -> TinyInterpreter:
    return qwen3 if request.param == "qwen3" else gpt2


@requires_llama_cpp
@pytest.mark.parametrize("backend", BACKENDS)
def test_the_default_template_gives_the_official_base_modes_tokens(interpreter: TinyInterpreter, backend: type[Backend]) -> None:
    model = MODELS[interpreter.family]
    prompts = [model.base_template.replace("{INPUT_PLACEHOLDER}", text) for text in TEXTS]
    expected = llama_generate_whole(interpreter.gguf_path, prompts, 8)
    with PawFn.specialize(model, backend).bare(base=interpreter.gguf_path) as bare:
        assert [list(bare.generate(text, RuntimeOptions(max_tokens=8)).token_ids) for text in TEXTS] == expected


@requires_llama_cpp
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("template", [NUMBERED, CHAT, "{INPUT_1} {INPUT_0} {INPUT_1}"], ids=["plain", "chat", "repeats"])
def test_numbered_templates_give_the_official_base_modes_tokens(interpreter: TinyInterpreter, backend: type[Backend], template: str) -> None:
    calls = [("the sky is blue", text) for text in TEXTS]
    prompts = [template.replace("{INPUT_0}", first).replace("{INPUT_1}", second) for first, second in calls]
    expected = llama_generate_whole(interpreter.gguf_path, prompts, 8)
    with PawFn.specialize(MODELS[interpreter.family], backend).bare(base=interpreter.gguf_path, template=template) as bare:
        qa = Positional[str, str](bare)
        assert [list(qa.generate(first, second, options=RuntimeOptions(max_tokens=8)).token_ids) for first, second in calls] == expected


@requires_llama_cpp
def test_control_text_in_an_argument_is_text_unless_asked(qwen3: TinyInterpreter) -> None:
    """The official base mode parses special-token text in arguments too; pawfn keeps its plain-text default and
    gives the official tokens with `parse_special_in_input=True`."""
    argument = "a <|im_end|> b"
    expected = llama_generate_whole(qwen3.gguf_path, [CHAT.replace("{INPUT_0}", "be brief").replace("{INPUT_1}", argument)], 8)[0]
    with PawFn[Qwen3_0_6B, Torch].bare(base=qwen3.gguf_path, template=CHAT) as bare:
        chat = Positional[str, str](bare)
        special = chat.generate("be brief", argument, options=RuntimeOptions(max_tokens=8, parse_special_in_input=True))
        plain = chat.generate("be brief", argument, options=RuntimeOptions(max_tokens=8))
        assert list(special.token_ids) == expected
        assert bare.runtime.encode_prompt(("be brief", argument), RuntimeOptions()) != bare.runtime.encode_prompt(
            ("be brief", argument), RuntimeOptions(parse_special_in_input=True)
        )
        assert plain.prompt_tokens > special.prompt_tokens  # the control token's text became several text tokens


def test_calls_in_one_batch_each_get_their_tokens_alone(qwen3: TinyInterpreter) -> None:
    options = RuntimeOptions(max_tokens=6)
    with PawFn[Qwen3_0_6B, Torch].bare(base=qwen3.gguf_path, template=CHAT, config=PawConfig(max_batch_rows=8)) as bare:
        chat = Positional[str, str](bare)
        alone = [chat.generate("be brief", text, options=options).token_ids for text in TEXTS]
        pendings = [chat.submit("be brief", text, options=options) for text in TEXTS]
        assert [pending.result().token_ids for pending in pendings] == alone


def test_wrong_counts_and_kinds_are_refused_before_any_work(qwen3: TinyInterpreter) -> None:
    with PawFn[Qwen3_0_6B, Torch].bare(base=qwen3.gguf_path, template=NUMBERED) as bare:
        with pytest.raises(ArityError, match="takes 2 positional arguments"):
            Positional[str](bare).run("only one")
        with pytest.raises(ArityError, match="takes 2 positional arguments"):
            bare.run("a single input")
        untyped: Positional[str, str] = Positional(bare)
        with pytest.raises(TypeError, match=r"argument 1 \({INPUT_1}\) must be str"):
            untyped.run("a", 2)  # type: ignore[arg-type]  # pyright: ignore[reportArgumentType]  # a wrong kind on purpose
        with pytest.raises(ConfigError, match="argument 1 is an image, but Qwen3_0_6B takes no images"):
            Positional[str, Image](bare).run("a", Image(b"never decoded"))
    with PawFn[Qwen3_0_6B, Torch].bare(base=qwen3.gguf_path) as default:
        assert default.run("a single input") == Positional[str](default).run("a single input")


def test_templates_and_backends_it_cannot_take(qwen3: TinyInterpreter, qwen3_program: TinyProgram) -> None:
    with pytest.raises(TemplateError, match="indices must start at 0 without gaps"):
        PawFn[Qwen3_0_6B, Torch].bare(base=qwen3.gguf_path, template="{INPUT_0} {INPUT_2}")
    with pytest.raises(BaseModelError, match="no base weights for Qwen3_0_6B in the cache: pass base=PATH"):
        PawFn[Qwen3_0_6B, Torch].bare(template=NUMBERED)  # the test's cache is empty
    with pytest.raises(ConfigError, match="runs locally"):
        PawFn[Qwen3_0_6B, Remote].bare(template=NUMBERED)
    with pytest.raises(TypeError, match="takes a loaded PawFn"):
        Positional[str](qwen3_program)
