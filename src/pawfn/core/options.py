"""Runtime options of one call."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from .errors import OptionError
from .grammar import OutputFormat

MAX_STOPS = 4
"""Most stop sequences one call may give (OpenAI's limit)."""
MAX_STOP_CHARS = 256
"""Longest stop sequence, in characters."""

__all__ = ["MAX_STOPS", "DType", "Device", "Numerics", "OptionsModel", "ResolvedNumerics", "RuntimeOptions", "WeightDType"]

DType = Literal["float32", "bfloat16", "float16"]
"""Compute dtypes of the Torch backend."""
WeightDType = Literal["float16", "int8"]
"""Compact CPU storage of the base's matrices (`PawConfig.weight_dtype`): near-exact float16 or lossy int8."""
Numerics = Literal["auto", "native", "llamacpp"]
"""Whose arithmetic the Torch backend runs (`PawConfig.numerics`): torch's own on dequantized weights, llama.cpp's
CPU backend's on the GGUF blocks (the official runtime's tokens), or auto: llama.cpp's for GGUF bases on the CPU,
torch's elsewhere."""
ResolvedNumerics = Literal["native", "llamacpp"]
"""The arithmetic a program runs once `auto` is decided (`Generation.numerics`)."""
Device = Literal[
    "cpu",
    "mps",
    "cuda",
    "cuda:0",
    "cuda:1",
    "cuda:2",
    "cuda:3",
    "cuda:4",
    "cuda:5",
    "cuda:6",
    "cuda:7",
    "cuda:8",
    "cuda:9",
    "cuda:10",
    "cuda:11",
    "cuda:12",
    "cuda:13",
    "cuda:14",
    "cuda:15",
]
"""Devices of the Torch backend."""


class OptionsModel(BaseModel):
    """Options a user writes: constructing one with invalid values raises `OptionError` (a `PawError` naming each
    field, its value and its range) rather than pydantic's `ValidationError`."""

    if not TYPE_CHECKING:  # the checkers keep pydantic's typed __init__ (fields as keyword arguments)

        def __init__(self, **values: object) -> None:
            try:
                super().__init__(**values)
            except ValidationError as exc:
                raise OptionError.from_validation(exc, type(self)) from None


class RuntimeOptions(OptionsModel):
    """How one call generates: greedy by default, like the official runtime."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)

    max_tokens: int | None = Field(default=None, ge=0)
    """Most tokens to generate; None runs to EOS or the end of the context window."""
    temperature: float = Field(default=0.0, ge=0.0, allow_inf_nan=False)
    """Sampling temperature; 0 is greedy decoding."""
    top_p: float = Field(default=1.0, gt=0.0, le=1.0, allow_inf_nan=False)
    """Nucleus-sampling mass in (0, 1]; used only when temperature > 0."""
    seed: int | None = Field(default=None, ge=0, lt=2**64)
    """Seed of the sampler (one generator per call), in [0, 2**64); None draws a fresh one."""
    stop: Annotated[tuple[Annotated[str, Field(min_length=1, max_length=MAX_STOP_CHARS)], ...], Field(max_length=MAX_STOPS, strict=False)] = ()
    """Stop sequences: the call ends once its output text contains one (`stop_reason="stop"`), its text cut before
    the first; the tokens that spelled it stay in `token_ids`, as llama.cpp's `stop` does. At most 4."""
    parse_special_in_input: bool = False
    """Parse special-token text (e.g. ``<|im_end|>``) inside the input as control tokens, like the official SDK."""
    response_format: OutputFormat | None = None
    """What the output must be (choices, a pattern, a JSON schema): each step's tokens are masked to it; None leaves the
    output free. `PawFn.returning` sets it from a Python type and parses the value."""
