"""A template on one tokenizer: a program's prefix ids and each call's encoding (split at the placeholder, as the
official runtime's text mode does), or a bare interpreter's prompt rendered whole (its base mode); the context
budget of a call."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ..formats.bundle import PromptTemplate
from ..core.errors import ConfigError, ContextOverflowError
from ..core.images import Image
from ..core.options import RuntimeOptions
from ..core.results import StopReason
from ..core.templates import ArityError, NumberedTemplate
from ..formats.tokenizer import TextCodec

__all__ = ["Argument", "Budget", "CallInput", "Prompt", "WholePrompt", "image_prompt"]


@dataclass(frozen=True)
class Budget:
    """How many tokens a call may generate, and the stop reason if it uses them all."""

    limit: int
    exhausted_reason: StopReason


Argument = str | Image
"""One argument of a numbered template: text, or an image (on interpreters that take images)."""
CallInput = str | tuple[Argument, ...]
"""A call's input: the text of a compiled program's one slot, or the arguments of a numbered template's slots."""


def _text_arguments(text: CallInput) -> tuple[str, ...]:
    """The arguments as text, or a `ConfigError` for an image (a backend evaluates those itself, with `parts`)."""
    arguments = (text,) if isinstance(text, str) else text
    strings = tuple(argument for argument in arguments if isinstance(argument, str))
    if len(strings) != len(arguments):
        raise ConfigError(
            "an image argument has no token ids of its own: its embeddings come from the interpreter's projector when "
            "the call runs; count a prompt with images from a call's Generation.prompt_tokens instead"
        )
    return strings


def image_prompt(prompt: Prompt, projector_found: bool) -> WholePrompt:
    """`prompt` for a call with images: a `ConfigError` when no projector was found or the template has one text slot."""
    if not projector_found:
        raise ConfigError(
            "this program's interpreter takes images, but no projector was found: put its mmproj GGUF beside the "
            "base (named mmproj*.gguf), or load the program from the hub, which fetches it"
        )
    if not isinstance(prompt, WholePrompt):
        raise ConfigError("image arguments go into a numbered template's slots; this program has one text input")
    return prompt


class Prompt:
    """A program's template on one tokenizer: the prefix's ids (checked against the context) and the encoding
    of each call's input + suffix, like the official runtime."""

    arity = 1
    """Positional arguments a call takes."""

    def __init__(self, codec: TextCodec, template: PromptTemplate, n_ctx: int) -> None:
        self.codec = codec
        self.n_ctx = n_ctx
        self.prefix_ids = self._prefix_ids(template.prefix)
        self.counted_prefix = len(self.prefix_ids)
        """The template's leading tokens that every call's prompt starts with, cached or not (`Generation.prefix_tokens`)."""
        self._suffix = template.suffix
        # The official runtime tokenizes input + suffix as one string; llama.cpp first cuts it at special
        # tokens, so the input joins the suffix's text up to its first control token, and the rest follows.
        self._suffix_head, rest = codec.split_at_first_control(template.suffix)
        self._suffix_rest_ids = codec.encode(rest, parse_special=True)

    def _prefix_ids(self, prefix: str) -> list[int]:
        fewest = -(-len(prefix.encode("utf-8", "surrogatepass")) // self.codec.max_token_bytes)
        if fewest >= self.n_ctx:  # cannot fit: refused before tokenizing (a 40 MB template took 4 GB to tokenize)
            raise ContextOverflowError(fewest, 0, self.n_ctx, at_least=True)
        ids = self.codec.encode(prefix, parse_special=True)
        if len(ids) >= self.n_ctx:
            raise ContextOverflowError(len(ids), 0, self.n_ctx)
        return ids

    def encode(self, text: CallInput, options: RuntimeOptions) -> list[int]:
        """Token ids of `text` + suffix, as evaluated after the prefix."""
        if isinstance(text, tuple):
            if len(text) != 1:
                raise ArityError(1, len(text))
            text = _text_arguments(text)[0]
        if options.parse_special_in_input:
            return self.codec.encode(text + self._suffix, parse_special=True)
        return self.codec.encode(text + self._suffix_head, parse_special=False) + self._suffix_rest_ids

    def budget(self, n_prompt: int, options: RuntimeOptions) -> Budget:
        """The official runtime's rule: what is left of the context, capped by `max_tokens`; none left is an error."""
        n_prefix = len(self.prefix_ids)
        remaining = self.n_ctx - n_prefix - n_prompt
        if remaining <= 0:
            raise ContextOverflowError(n_prefix, n_prompt, self.n_ctx)
        if options.max_tokens is not None and options.max_tokens <= remaining:
            return Budget(options.max_tokens, "max_tokens")
        return Budget(remaining, "context")


class WholePrompt(Prompt):
    """A bare interpreter's template (no program): each call's prompt rendered whole and tokenized at once, as the
    official runtime's base mode does; the text up to the template's last control token before its first slot is
    the cached prefix (llama.cpp cuts a prompt at control tokens before anything else, so that cut changes no
    token). A `granule` above 1 caches instead the head's settled tokens (`TextCodec.settled_ids`: the same in every
    call, whatever its arguments) cut to a multiple of it; None caches nothing (each call evaluates the whole prompt)."""

    def __init__(self, codec: TextCodec, template: NumberedTemplate, n_ctx: int, granule: int | None = 1) -> None:
        self.codec = codec
        self.n_ctx = n_ctx
        self.arity = template.arity
        head = template.head
        fixed = len(head) - len(codec.control_spans(head)[-1][0])  # the end of its last control token
        self._fixed_ids = self._prefix_ids(head[:fixed])
        self.counted_prefix = len(self._fixed_ids)
        if granule is None:
            self.prefix_ids: list[int] = []
        elif granule == 1:
            self.prefix_ids = self._fixed_ids
        else:  # the head's settled tokens (whatever an argument adds), cut to whole granules
            settled = self._prefix_ids(head) if fixed == len(head) else codec.settled_ids(head)
            self.prefix_ids = settled[: len(settled) // granule * granule]
        self._prefix_text = head[:fixed]
        self._template = NumberedTemplate((head[fixed:], *template.segments[1:]))

    def rendered(self, text: CallInput, marker: str) -> tuple[str, list[Image]]:
        """The whole prompt, prefix included, with `marker` where each image argument goes, and the images in
        prompt order (a repeated slot repeats its image), as the official vision runtime renders it."""
        arguments = (text,) if isinstance(text, str) else text
        if len(arguments) != self.arity:
            raise ArityError(self.arity, len(arguments))
        pieces: list[str] = [self._prefix_text]
        images: list[Image] = []
        for segment in self._template.segments:
            if isinstance(segment, str):
                pieces.append(segment)
                continue
            argument = arguments[segment]
            if isinstance(argument, Image):
                images.append(argument)
                argument = marker
            pieces.append(argument)
        prompt = "".join(pieces)
        if prompt.count(marker) != len(images):
            raise ConfigError(f"the prompt holds the image marker {marker!r} as text; it is reserved for images (pass a pawfn.Image)")
        return prompt, images

    def encode(self, text: CallInput, options: RuntimeOptions) -> list[int]:
        """Token ids of the prompt after the prefix: the template's text parsed for control tokens, the arguments'
        only with `parse_special_in_input`."""
        return self._after_prefix(self._encoded(self._template.bind(_text_arguments(text)), options))

    def _after_prefix(self, rest: list[int]) -> list[int]:
        """A call's tokens after the cached prefix, from its tokens after the fixed head's (`rest`): the official
        runtime's tokens are the head's then these, as llama.cpp cuts a prompt at control tokens first."""
        whole, cached = self._fixed_ids + rest, len(self.prefix_ids)
        if whole[:cached] != self.prefix_ids:  # settled tokens are a prefix of every call's: never expected
            raise RuntimeError(f"a call's prompt does not start with its program's cached prefix of {cached} tokens (a pawfn bug)")
        return whole[cached:]

    def parts(self, text: CallInput, options: RuntimeOptions, delimiters: tuple[str, str]) -> list[list[int] | Image]:
        """The prompt after the prefix as mtmd splits it: runs of token ids (encoded as `encode` does) and each image
        argument between the texts of `delimiters` (control tokens, e.g. <|vision_start|> and <|vision_end|>)."""
        arguments = (text,) if isinstance(text, str) else text
        if len(arguments) != self.arity:
            raise ArityError(self.arity, len(arguments))
        parts: list[list[int] | Image] = []
        run: list[tuple[str, bool]] = []  # (text, is an argument) since the last image
        for segment in self._template.segments:
            argument = segment if isinstance(segment, str) else arguments[segment]
            if isinstance(argument, Image):
                parts += [self._encoded([*run, (delimiters[0], False)], options), argument]
                run = [(delimiters[1], False)]
            elif argument:
                run.append((argument, not isinstance(segment, str)))
        parts.append(self._encoded(run, options))
        first = parts[0]
        assert isinstance(first, list)  # the prompt starts with text: the head, before every argument
        parts[0] = self._after_prefix(first)
        return parts

    def _encoded(self, pieces: Sequence[tuple[str, bool]], options: RuntimeOptions) -> list[int]:
        """Token ids of (text, is an argument) pieces: an argument's control-token text stays text unless
        `parse_special_in_input`."""
        if options.parse_special_in_input or not any(is_argument and self.codec.holds_control_text(piece) for piece, is_argument in pieces):
            return self.codec.encode("".join(piece for piece, _ in pieces), parse_special=True)
        ids: list[int] = []
        fragment = ""  # text between control tokens, tokenized as one piece
        for piece, is_argument in pieces:
            for span, is_control in [(piece, False)] if is_argument else self.codec.control_spans(piece):
                if is_control:
                    ids += self.codec.encode(fragment, parse_special=False) + self.codec.encode(span, parse_special=True)
                    fragment = ""
                else:
                    fragment += span  # control-token text in an argument stays text
        return ids + self.codec.encode(fragment, parse_special=False)
