"""What one call produced: `Generation` (text, token ids, counts) and its `Timings`."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict

from .options import ResolvedNumerics

__all__ = ["Generation", "StopReason", "Timings"]

StopReason = Literal["eos", "max_tokens", "context", "stop"]
"""Why a call ended: the model's end of text (or a typed value complete), its `max_tokens`, the end of the context
window, or one of `RuntimeOptions.stop`."""


class Timings(BaseModel):
    """Wall-clock times of one call, in milliseconds."""

    model_config = ConfigDict(frozen=True)

    tokenize_ms: float
    prompt_ms: float
    """Evaluating input + suffix after the cached prefix."""
    generate_ms: float
    """Sampling and evaluating the generated tokens."""
    total_ms: float


class Generation(BaseModel):
    """What one call produced: text, generated token ids (EOS excluded), token counts and timings."""

    model_config = ConfigDict(frozen=True)

    text: str
    token_ids: tuple[int, ...]
    prefix_tokens: int
    prompt_tokens: int
    """Tokens of input + suffix evaluated after the prefix."""
    stop_reason: StopReason
    timings: Timings
    numerics: ResolvedNumerics | None = None
    """The arithmetic that computed the call: llama.cpp's (the LlamaCpp backend, or `numerics="llamacpp"` on Torch) or
    torch's (`native`); None from a server that does not say."""
