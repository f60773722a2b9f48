"""The Torch backend's token sampler: temperature + top-p with one seeded generator per call (None: greedy)."""

from __future__ import annotations

import torch

from ...core.options import RuntimeOptions

__all__ = ["make_generator", "sample_token"]


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


def sample_token(logits: torch.Tensor, options: RuntimeOptions, generator: torch.Generator) -> int:
    """A temperature + top-p draw from `logits` [vocab] with the call's own generator (greedy rows take the argmax
    of a whole step at once: `runner.Runner`)."""
    # float64 and shifted first: any positive temperature (even 1e-300, which is 0 in float32) then gives 0 and -inf
    # at worst (a near-greedy draw), never 0 / 0 or inf - inf = NaN
    logits = logits.double().cpu()
    probs = torch.softmax((logits - logits.max()) / options.temperature, dim=-1)
    if options.top_p < 1.0:
        sorted_probs, order = torch.sort(probs, descending=True)
        before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs
        sorted_probs[before >= options.top_p] = 0.0  # keep the smallest head whose mass reaches top_p
        probs = torch.zeros_like(probs).scatter_(0, order, sorted_probs)
    return int(torch.multinomial(probs, 1, generator=generator).item())
