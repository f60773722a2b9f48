"""The HTTP API of `pawfn serve` and its Ray Serve twin: request and response bodies, shared by the servers and
the `Remote` backend, so both ends read the same schema.

`InferRequest`/`InferResponse` are the official hosted API's shape (`POST /api/v1/infer`); the `/v1/...` routes
carry pawfn's own `RuntimeOptions` and `Generation`.
"""

from __future__ import annotations

import base64
import binascii
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator
from typing_extensions import Self

from .images import Image, ImageError
from .options import RuntimeOptions
from .results import Generation

__all__ = [
    "ErrorBody",
    "Health",
    "InferRequest",
    "ImagePart",
    "ImageUrl",
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


class ImageUrl(BaseModel):
    """An image as a base64 `data:` URL (`data:image/png;base64,...`); the server fetches nothing."""

    model_config = ConfigDict(extra="forbid")

    url: str = Field(pattern=r"^data:image/[A-Za-z0-9.+-]+;base64,[A-Za-z0-9+/=\s]*$")


class ImagePart(BaseModel):
    """An image argument: OpenAI's `image_url` content part, inline only (bounded by the server's body limit)."""

    model_config = ConfigDict(extra="forbid")

    type: Literal["image_url"] = "image_url"
    image_url: ImageUrl

    def image(self) -> Image:
        """The image it carries (`ImageError` for base64 that does not decode)."""
        try:
            return Image(base64.b64decode(self.image_url.url.split(",", 1)[1], validate=False))
        except binascii.Error as exc:
            raise ImageError(f"an image argument's data URL is not valid base64: {exc}") from None

    @classmethod
    def of(cls, image: Image) -> ImagePart:
        """`image` as its normalized PNG (the official preprocessing contract's pixels) in a data URL."""
        return cls(image_url=ImageUrl(url="data:image/png;base64," + base64.b64encode(image.png()).decode("ascii")))


class _CallBody(BaseModel):
    """One call's input: `input` (one), or a numbered template's `arguments` in slot order (text, or images)."""

    model_config = ConfigDict(extra="forbid")

    input: str | None = None
    arguments: list[str | ImagePart] | None = Field(default=None, max_length=MAX_ARGUMENTS)
    options: RuntimeOptions = _DEFAULT_OPTIONS

    @model_validator(mode="after")
    def _one_kind(self) -> _CallBody:
        if (self.input is None) == (self.arguments is None):
            raise ValueError("give `input` (one) or `arguments` (a numbered template's, in slot order), not both or neither")
        return self

    @property
    def call(self) -> str | tuple[str | Image, ...]:
        """The call's input as a runtime takes it (images decoded from their data URLs)."""
        if self.arguments is not None:
            return tuple(argument if isinstance(argument, str) else argument.image() for argument in self.arguments)
        assert self.input is not None  # one of the two, by the validator
        return self.input

    def body(self) -> dict[str, object]:
        """The JSON body, without the unused one of `input` and `arguments`."""
        return self.model_dump(mode="json", exclude={"arguments" if self.arguments is None else "input"})

    @classmethod
    def of(cls, call: str | tuple[str | Image, ...], options: RuntimeOptions) -> Self:
        """The body for `call` (one input, or several arguments, images as data URLs)."""
        if isinstance(call, str):
            return cls(input=call, options=options)
        return cls(arguments=[argument if isinstance(argument, str) else ImagePart.of(argument) for argument in call], options=options)


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
