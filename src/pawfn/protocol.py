"""The HTTP API of `pawfn serve` and its Ray Serve twin: request and response bodies, shared by the servers and
the `Remote` backend, so both ends read the same schema.

`InferRequest`/`InferResponse` are the official hosted API's shape (`POST /api/v1/infer`); the `/v1/...` routes
carry pawfn's own `RuntimeOptions` and `Generation`.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator
from typing_extensions import Self

from .options import RuntimeOptions
from .results import Generation

__all__ = [
    "ErrorBody",
    "Health",
    "InferRequest",
    "InferResponse",
    "MAX_ARGUMENTS",
    "ServedProgram",
    "ServedPrograms",
    "ResolveResponse",
    "RunBatchRequest",
    "RunBatchResponse",
    "RunRequest",
    "RunResponse",
    "StreamPiece",
    "TokenizeRequest",
    "TokenizeResponse",
]

_DEFAULT_OPTIONS = RuntimeOptions()


class InferRequest(BaseModel):
    """The official hosted inference request: a program by id or slug, one input, greedy unless `temperature`."""

    model_config = ConfigDict(extra="ignore")

    program_id: str = Field(min_length=1, max_length=200)
    input: str
    max_tokens: int | None = Field(default=None, ge=0)
    temperature: float | None = Field(default=None, ge=0, allow_inf_nan=False)


class InferResponse(BaseModel):
    """The official hosted inference response."""

    output: str
    tokens_generated: int
    latency_ms: float
    """Time the server spent on the call, in milliseconds."""


class ResolveResponse(BaseModel):
    """`GET /api/v1/programs/resolve/{ref}`: the program id a slug names (what the official SDK asks first)."""

    program_id: str


MAX_ARGUMENTS = 64
"""Most arguments one call may carry (a numbered template's slots)."""


class _CallBody(BaseModel):
    """One call's input: `input` (one), or a numbered template's `arguments` in slot order."""

    model_config = ConfigDict(extra="forbid")

    input: str | None = None
    arguments: list[str] | None = Field(default=None, max_length=MAX_ARGUMENTS)
    options: RuntimeOptions = _DEFAULT_OPTIONS

    @model_validator(mode="after")
    def _one_kind(self) -> _CallBody:
        if (self.input is None) == (self.arguments is None):
            raise ValueError("give `input` (one) or `arguments` (a numbered template's, in slot order), not both or neither")
        return self

    @property
    def call(self) -> str | tuple[str, ...]:
        """The call's input as a runtime takes it."""
        if self.arguments is not None:
            return tuple(self.arguments)
        assert self.input is not None  # one of the two, by the validator
        return self.input

    def body(self) -> dict[str, object]:
        """The JSON body, without the unused one of `input` and `arguments`."""
        return self.model_dump(mode="json", exclude={"arguments" if self.arguments is None else "input"})

    @classmethod
    def of(cls, call: str | tuple[str, ...], options: RuntimeOptions) -> Self:
        """The body for `call` (one input, or several arguments)."""
        return cls(input=call, options=options) if isinstance(call, str) else cls(arguments=list(call), options=options)


class RunRequest(_CallBody):
    """`POST /v1/programs/{ref}/run` and `/stream`."""


class RunBatchRequest(BaseModel):
    """`POST /v1/programs/{ref}/run_batch`: inputs decoded together, each with the tokens it gets alone."""

    model_config = ConfigDict(extra="forbid")

    inputs: list[str]
    options: RuntimeOptions = _DEFAULT_OPTIONS


class RunResponse(BaseModel):
    """One call's result."""

    program: str
    """The program as the server names it (its id, else the reference it was loaded by)."""
    generation: Generation


class RunBatchResponse(BaseModel):
    """A batch's results, in input order."""

    program: str
    generations: list[Generation]


class TokenizeRequest(_CallBody):
    """`POST /v1/programs/{ref}/tokenize`."""


class TokenizeResponse(BaseModel):
    """Token ids of input + the template's suffix, as a call evaluates them after the cached prefix."""

    token_ids: list[int]


class ServedProgram(BaseModel):
    """A program a server holds (or would load): what a client checks before its first call."""

    name: str
    """How the server names it: the program id, else the reference it was loaded by."""
    program_id: str | None
    references: list[str]
    """Every reference the server answers for it (id, slugs, paths given at start)."""
    interpreter: str
    """The interpreter it was compiled for (meta.json), e.g. ``Qwen/Qwen3-0.6B``."""
    model: str
    """pawfn's interpreter-model class, e.g. ``Qwen3_0_6B``."""
    backend: str
    n_ctx: int
    prefix_tokens: int
    arity: int = Field(default=1, ge=0)
    """How many arguments a call takes: one input, or a numbered template's slots (`RunRequest.arguments`)."""
    spec: str | None = None
    replica: str | None = None
    """The Ray Serve replica that answered (its actor name), where there are replicas."""


class ServedPrograms(BaseModel):
    """`GET /v1/programs`."""

    programs: list[ServedProgram]


class Health(BaseModel):
    """`GET /healthz`."""

    status: Literal["ok"]
    programs: int
    queued: int
    """Calls accepted and not yet ended."""


class StreamPiece(BaseModel):
    """A `token` event of a stream: generated text as it comes (unstripped; the `done` event's output is stripped)."""

    text: str


class ErrorBody(BaseModel):
    """Every error response: a stable code, a message that names the problem and the fix, the request id."""

    error: str
    message: str
    request_id: str | None = None
