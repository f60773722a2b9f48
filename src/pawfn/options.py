"""Runtime options of one call and the load-time configuration of a program."""

from __future__ import annotations

import math
import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

__all__ = ["DType", "PawConfig", "RuntimeOptions"]

DType = Literal["float32", "bfloat16", "float16"]
_DEVICE_PATTERN = re.compile(r"^(cpu|mps|cuda(:\d+)?)$")


class RuntimeOptions(BaseModel):
    """How one call generates: greedy by default, like the official runtime."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)

    max_tokens: int | None = Field(default=None, ge=0)
    """Most tokens to generate; None runs to EOS or the end of the context window."""
    temperature: float = Field(default=0.0, ge=0.0)
    """Sampling temperature; 0 is greedy decoding."""
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    """Nucleus-sampling mass in (0, 1]; used only when temperature > 0."""
    seed: int | None = None
    """Seed of the sampler (one generator per call); None draws a fresh one."""
    parse_special_in_input: bool = False
    """Parse special-token text (e.g. ``<|im_end|>``) inside the input as control tokens, like the official SDK."""

    @field_validator("temperature", "top_p")
    @classmethod
    def _finite(cls, value: float) -> float:
        if not math.isfinite(value):
            raise ValueError("must be a finite number")
        return value


class PawConfig(BaseModel):
    """Where and how a program runs: device, dtype, context size and model copies."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)

    device: str = "cpu"
    """Torch device: ``cpu``, ``cuda``, ``cuda:N`` or ``mps``."""
    dtype: DType = "float32"
    """Compute dtype of the base weights, adapters and KV cache."""
    n_ctx: int = Field(default=2048, gt=0)
    """Context window in tokens (prefix + input + output); capped by the architecture's position limit."""
    max_model_copies: int = Field(default=1, ge=1)
    """Most copies of one base model, and so most concurrent runs on it."""

    @field_validator("device")
    @classmethod
    def _known_device(cls, value: str) -> str:
        if not _DEVICE_PATTERN.match(value):
            raise ValueError(f"unknown device {value!r}; use 'cpu', 'cuda', 'cuda:N' or 'mps'")
        return value
