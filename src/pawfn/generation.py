"""The result of one call and the token sampler."""

from __future__ import annotations

from typing import Literal

import torch
from pydantic import BaseModel, ConfigDict

from .options import RuntimeOptions

__all__ = ["Generation", "StopReason", "Timings", "make_generator", "pick_token"]

StopReason = Literal["eos", "max_tokens", "context"]


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


def make_generator(options: RuntimeOptions) -> torch.Generator | None:
    """One CPU generator per call, seeded from `options.seed` (None for greedy decoding)."""
    if options.temperature == 0.0:
        return None
    generator = torch.Generator(device="cpu")
    if options.seed is None:
        generator.seed()
    else:
        generator.manual_seed(options.seed)
    return generator


def pick_token(logits: torch.Tensor, options: RuntimeOptions, generator: torch.Generator | None) -> int:
    """Greedy argmax (first maximum, as llama.cpp) or temperature + top-p sampling."""
    if options.temperature == 0.0 or generator is None:
        return int(torch.argmax(logits).item())
    probs = torch.softmax(logits.float().cpu() / options.temperature, dim=-1)
    if options.top_p < 1.0:
        sorted_probs, order = torch.sort(probs, descending=True)
        before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs
        sorted_probs[before >= options.top_p] = 0.0  # keep the smallest head whose mass reaches top_p
        probs = torch.zeros_like(probs).scatter_(0, order, sorted_probs)
    return int(torch.multinomial(probs, 1, generator=generator).item())
