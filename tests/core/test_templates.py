"""`pawfn.core.templates` against the official SDK's own template parser (`programasweights._prompt_template`): the same
segments, arities and refusals on a table of valid and invalid templates, and the same binding of arguments."""

from __future__ import annotations

from typing import Any

import pytest

from pawfn.core.templates import ArityError, NumberedTemplate, TemplateError

official = pytest.importorskip("programasweights._prompt_template")

NUMBERED = [
    "Context: {INPUT_0}. Question: {INPUT_1}. Answer:",
    "{INPUT_0}",
    "{INPUT_1} then {INPUT_0}",
    "{INPUT_0} twice {INPUT_0}",
    "no slots at all",
    "",
    "{INPUT_0}{INPUT_1}{INPUT_2}",
    "gap {INPUT_0} {INPUT_2}",
    "starts at one {INPUT_1}",
    "leading zero {INPUT_01} is text",
    "the old {INPUT_PLACEHOLDER} is text here",
    "{INPUT_0} and {INPUT_PLACEHOLDER}",
    "{input_0} lower case is text, {INPUT_-1} too, {INPUT_ 0} too",
    "<|im_start|>user\n{INPUT_0}<|im_end|>\n<|im_start|>assistant\n",
    "{{INPUT_0}} braces around",
    "{INPUT_10}",
    "".join(f"{{INPUT_{i}}}" for i in range(12)),
]
SINGLE = [
    "Input: {INPUT_PLACEHOLDER}\nOutput:",
    "{INPUT_PLACEHOLDER}",
    "none here",
    "two {INPUT_PLACEHOLDER} {INPUT_PLACEHOLDER}",
    "{INPUT_0} is text in a compiled template: {INPUT_PLACEHOLDER}",
]


def _official(template: str, placeholder: str) -> tuple[Any, ...] | str:
    try:
        return tuple(official.parse_template(template, placeholder))
    except ValueError:
        return "refused"


def _ours(template: str, numbered: bool) -> tuple[Any, ...] | str:
    try:
        return (NumberedTemplate.parse if numbered else NumberedTemplate.single)(template).segments
    except TemplateError:
        return "refused"


@pytest.mark.parametrize("template", NUMBERED)
def test_numbered_templates_read_as_the_official_parser_reads_them(template: str) -> None:
    assert _ours(template, numbered=True) == _official(template, "{INPUT_N}")


@pytest.mark.parametrize("template", SINGLE)
def test_compiled_templates_keep_their_single_placeholder_semantics(template: str) -> None:
    assert _ours(template, numbered=False) == _official(template, "{INPUT_PLACEHOLDER}")


@pytest.mark.parametrize("template", [t for t in NUMBERED if _official(t, "{INPUT_N}") != "refused"])
def test_binding_takes_exactly_the_templates_arity(template: str) -> None:
    ours = NumberedTemplate.parse(template)
    segments = official.parse_template(template, "{INPUT_N}")
    for count in range(ours.arity + 2):
        arguments = [f"arg{i}" for i in range(count)]
        try:
            expected: str | None = "".join(official.bind_template(segments, *arguments))
        except TypeError:
            expected = None
        if expected is None:
            with pytest.raises(ArityError, match=f"takes {ours.arity} positional"):
                ours.render(arguments)
        else:
            assert ours.render(arguments) == expected
