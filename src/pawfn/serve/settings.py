"""`ServeSettings`: the limits and the key of one HTTP server (`pawfn serve` or the Ray Serve ingress)."""

from __future__ import annotations

from pydantic import ConfigDict, Field, SecretStr

from ..core.options import OptionsModel

__all__ = ["ServeSettings"]


class ServeSettings(OptionsModel):
    """What a server accepts; a request past a limit gets a JSON error (413, 422 or 429), never a crash."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    api_key: SecretStr | None = None
    """Required on every route but `/healthz` (`Authorization: Bearer KEY` or `X-API-Key: KEY`); None: open."""
    max_body_bytes: int = Field(default=1 << 20, ge=1)
    """Largest request body, in bytes (413 past it)."""
    max_input_chars: int = Field(default=16_384, ge=1)
    """Longest input, in characters (413 past it)."""
    max_tokens: int = Field(default=1024, ge=1)
    """Most tokens a call may ask for (422 past it); a call that names none generates at most this many."""
    max_queue: int = Field(default=64, ge=1)
    """Most calls accepted and not yet ended, across requests (429 with Retry-After past it)."""
    max_batch_inputs: int = Field(default=64, ge=1)
    """Most inputs in one `run_batch` request (413 past it)."""
    max_programs: int | None = Field(default=None, ge=1)
    """Most programs resident at once, those named at start included (never unloaded): a program loaded on a request
    (`--allow-load`) past it replaces the least recently used idle one; None: no bound."""
    max_program_bytes: int | None = Field(default=None, ge=1)
    """Most bytes the resident programs hold beside their bases (adapters and evaluated prefixes; Torch reports them,
    LlamaCpp programs count 0), bounded as `max_programs`; None: no bound."""
    program_wait_s: float = Field(default=5.0, ge=0)
    """How long a request whose program must load waits for a resident program to go idle when the budget is full,
    in seconds (then 503 `programs_busy`)."""
