"""`ServeSettings`: the limits and the key of one HTTP server (`pawfn serve` or the Ray Serve ingress)."""

from __future__ import annotations

from pydantic import ConfigDict, Field, SecretStr

from ..core.options import OptionsModel

__all__ = ["ON_REQUEST_PROGRAMS", "ServeSettings"]

ON_REQUEST_PROGRAMS = 8
"""Programs a server that loads them on request (`--allow-load`) keeps beside those named at start, unless
`max_programs` says otherwise: a client naming ids one after another cannot fill the memory."""


class ServeSettings(OptionsModel):
    """What a server accepts; a request past a limit gets a JSON error (413, 422 or 429), never a crash."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    api_key: SecretStr | None = None
    """Required on every route but `/healthz` and the docs (`Authorization: Bearer KEY` or `X-API-Key: KEY`), checked
    from the headers before the body is read; None: open."""
    admin_key: SecretStr | None = None
    """The operator's key, required by the operator routes (`POST /v1/programs/{ref}/load` and `/unload`), sent like
    `api_key` (it also opens every other route); None: those routes are off (403)."""
    max_body_bytes: int = Field(default=1 << 20, ge=1)
    """Largest request body, in bytes (413 past it)."""
    max_input_chars: int = Field(default=16_384, ge=1)
    """Longest input, in characters (413 past it)."""
    max_tokens: int = Field(default=1024, ge=1)
    """Most tokens a call may ask for (422 past it); a call that names none generates at most this many."""
    max_queue: int = Field(default=64, ge=1)
    """Most calls accepted and not yet ended, across requests (429 with Retry-After past it)."""
    max_queue_per_client: int = Field(default=16, ge=1)
    """Most of those one client holds at once (a client is its address, or the address a trusted proxy names); a
    `run_batch` runs at most this many of its inputs at a time, so no request or client takes the whole queue."""
    max_batch_inputs: int = Field(default=64, ge=1)
    """Most inputs in one `run_batch` request (413 past it)."""
    max_programs: int | None = Field(default=None, ge=1)
    """Most programs resident at once, those named at start included (never unloaded): a program loaded on a request
    (`--allow-load`) past it replaces the least recently used idle one; None: those named at start and
    `ON_REQUEST_PROGRAMS` (8) more where programs load on request."""
    max_program_bytes: int | None = Field(default=None, ge=1)
    """Most bytes the resident programs hold beside their bases (adapters and evaluated prefixes; Torch reports them,
    LlamaCpp programs count 0), bounded as `max_programs`; None: no bound."""
    program_wait_s: float = Field(default=5.0, ge=0)
    """How long a request whose program must load waits for a resident program to go idle when the budget is full,
    in seconds (then 503 `programs_busy`)."""
    failed_load_retry_s: float = Field(default=60.0, ge=0)
    """After a program failed to load on a request (a damaged or hostile file from the hub), seconds during which
    requests for it answer 502 at once instead of loading it again."""
    body_timeout_s: float = Field(default=30.0, gt=0)
    """Seconds a request's whole body may take to arrive once its headers have (408 past it, and the connection closed)."""
    header_timeout_s: float = Field(default=10.0, gt=0)
    """Seconds a connection may take to send a request's headers, from its opening or the end of the last answer
    (closed past it; `pawfn serve` only: on Ray Serve its proxy's own settings apply)."""
    keep_alive_timeout_s: int = Field(default=5, ge=1)
    """Seconds an idle keep-alive connection stays open (`pawfn serve` only)."""
    max_connections: int = Field(default=256, ge=1)
    """Most connections open at once; one more is answered 503 and closed (`pawfn serve` only)."""
    trusted_proxies: tuple[str, ...] = ()
    """Addresses of proxies whose `X-Forwarded-For` names the client (uvicorn's `forwarded_allow_ips`); empty: the
    header is ignored and a client is its connection's address (`pawfn serve` only)."""
