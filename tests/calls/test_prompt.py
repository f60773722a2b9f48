"""A whole prompt's cached prefix: whatever its granule, the prefix's ids then each call's ids are the tokens of the
prompt with nothing cached, text alone and around images."""

from __future__ import annotations

import PIL.Image
import pytest

from pawfn import Image
from pawfn.calls.prompt import WholePrompt
from pawfn.core.options import RuntimeOptions
from pawfn.core.templates import NumberedTemplate
from pawfn.formats.ggufio import GGUFFile
from pawfn.formats.tokenizer import TextCodec
from tests.helpers.tiny_models import TinyInterpreter

HEAD = "<|im_start|>user\n" + "Sort the message by urgency: outages first, then billing. " * 6 + "\n\n[INPUT]\n"
TEXTS = ["\nUrgent: the server is down!", "hello", " x", "", "]] 12", "e server"]
"""Inputs that extend a head's last pre-token (a head ending in " th" then "e server": " the" is one token) and not."""


@pytest.mark.parametrize("family", ["qwen3", "qwen35"])
@pytest.mark.parametrize("head", [HEAD, HEAD + "Read th"], ids=["newline", "in-a-word"])
@pytest.mark.parametrize("granule", [1, 8, 32, 0])
def test_a_granule_prefix_then_the_call_gives_the_uncached_tokens(family: str, head: str, granule: int, request: pytest.FixtureRequest) -> None:
    """Granule 0 here: the head's whole token count, so the cut lies where a cache of every head token would end."""
    tiny: TinyInterpreter = request.getfixturevalue(family)
    codec = TextCodec.from_gguf(GGUFFile(tiny.gguf_path))
    granule = granule or len(codec.encode(head, parse_special=True))
    template = NumberedTemplate.parse(head + "{INPUT_0}\n[END_INPUT]<|im_end|>\n<|im_start|>assistant\n")
    uncached, cached = WholePrompt(codec, template, 2048, None), WholePrompt(codec, template, 2048, granule)
    assert uncached.prefix_ids == [] and len(cached.prefix_ids) % granule == 0 and cached.counted_prefix == uncached.counted_prefix
    if granule > 1:
        assert len(cached.prefix_ids) >= len(codec.settled_ids(head)) - granule + 1  # the settled head, to whole granules
    options = RuntimeOptions()
    for text in TEXTS:
        assert cached.prefix_ids + cached.encode(text, options) == uncached.encode(text, options)


def test_a_granule_prefix_comes_off_the_first_run_before_an_image(qwen3: TinyInterpreter) -> None:
    codec = TextCodec.from_gguf(GGUFFile(qwen3.gguf_path))
    template = NumberedTemplate.parse(HEAD + "{INPUT_0} and {INPUT_1}<|im_end|>\n")
    uncached, cached = WholePrompt(codec, template, 2048, None), WholePrompt(codec, template, 2048, 16)
    image = Image(PIL.Image.new("RGB", (4, 4)))
    arguments = ("look", image)
    delimiters = ("<|im_start|>", "<|im_end|>")
    whole, after = uncached.parts(arguments, RuntimeOptions(), delimiters), cached.parts(arguments, RuntimeOptions(), delimiters)
    assert len(cached.prefix_ids) >= 16 and len(whole) == len(after) == 3 and after[1] is image
    first, whole_first = after[0], whole[0]
    assert isinstance(first, list) and isinstance(whole_first, list)
    assert cached.prefix_ids + first == whole_first and after[2] == whole[2]
