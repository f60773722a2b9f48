"""How a call's tokens are formed after the cached prefix, and how many it may generate (both backends)."""

from __future__ import annotations

from dataclasses import dataclass

from .errors import ContextOverflowError
from .generation import StopReason
from .options import RuntimeOptions
from .tokenizer import TextCodec

__all__ = ["Budget", "PromptEncoder", "budget"]


class PromptEncoder:
    """Tokenizes input + suffix like the official runtime, keeping the input plain text unless asked."""

    def __init__(self, codec: TextCodec, suffix: str) -> None:
        self._codec = codec
        self._suffix = suffix
        # The official runtime tokenizes input + suffix as one string; llama.cpp first cuts it at special
        # tokens, so the input joins the suffix's text up to its first control token, and the rest follows.
        self._suffix_head, rest = codec.split_at_first_control(suffix)
        self._suffix_rest_ids = codec.encode(rest, parse_special=True)

    def encode(self, text: str, options: RuntimeOptions) -> list[int]:
        """Token ids of `text` + suffix, as evaluated after the prefix."""
        if options.parse_special_in_input:
            return self._codec.encode(text + self._suffix, parse_special=True)
        return self._codec.encode(text + self._suffix_head, parse_special=False) + self._suffix_rest_ids


@dataclass(frozen=True)
class Budget:
    """How many tokens a call may generate, and the stop reason if it uses them all."""

    limit: int
    exhausted_reason: StopReason


def budget(n_prefix: int, n_prompt: int, n_ctx: int, options: RuntimeOptions) -> Budget:
    """The official runtime's rule: what is left of the context, capped by `max_tokens`; none left is an error."""
    remaining = n_ctx - n_prefix - n_prompt
    if remaining <= 0:
        raise ContextOverflowError(n_prefix, n_prompt, n_ctx)
    if options.max_tokens is not None and options.max_tokens <= remaining:
        return Budget(options.max_tokens, "max_tokens")
    return Budget(remaining, "context")
