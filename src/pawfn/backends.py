"""Backend types: where and how a program's forward pass runs."""

from __future__ import annotations

from abc import ABC, abstractmethod
from pathlib import Path
from typing import ClassVar

from .bundle import ProgramBundle
from .generation import Generation
from .models import InterpreterModel
from .config import PawConfig
from .options import RuntimeOptions

__all__ = ["Backend", "LlamaCpp", "ProgramRuntime", "Torch"]


class ProgramRuntime(ABC):
    """A loaded program on a backend: its adapter, its cached prefix and a handle on the shared base."""

    @property
    @abstractmethod
    def n_ctx(self) -> int:
        """Context window in tokens."""

    @property
    @abstractmethod
    def prefix_tokens(self) -> int:
        """Length of the cached prompt prefix in tokens."""

    @abstractmethod
    def encode_prompt(self, text: str, options: RuntimeOptions) -> list[int]:
        """Token ids of input + suffix, as evaluated after the cached prefix."""

    @abstractmethod
    def generate(self, text: str, options: RuntimeOptions) -> Generation:
        """Run the program on `text`; safe to call from several threads."""

    @abstractmethod
    def close(self) -> None:
        """Free the adapter and prefix cache; the shared base stays loaded for other programs."""


class Backend:
    """Base of backend types; like interpreter models, a backend class is a type-level marker."""

    name: ClassVar[str]
    """Short name of the backend (e.g. ``torch``)."""

    def __init__(self) -> None:
        raise TypeError(f"{type(self).__name__} is a type marker; use it as PawFn[..., {type(self).__name__}]")

    @classmethod
    def open_program(
        cls, model: type[InterpreterModel], bundle: ProgramBundle, base: Path, config: PawConfig
    ) -> ProgramRuntime:
        """Load `bundle` for `model` on base weights `base`."""
        raise NotImplementedError(f"backend {cls.__name__} cannot run programs")


class Torch(Backend):
    """PyTorch on CPU, CUDA or MPS (`PawConfig.device`), float32 by default (`PawConfig.dtype`)."""

    name = "torch"

    @classmethod
    def open_program(
        cls, model: type[InterpreterModel], bundle: ProgramBundle, base: Path, config: PawConfig
    ) -> ProgramRuntime:
        """Load `bundle` on the shared base for (model, base, device, dtype), loading that base once."""
        from .torch_runtime import TorchProgram

        return TorchProgram.open(model, bundle, base, config)


class LlamaCpp(Backend):
    """llama.cpp, the official runtime (the `llamacpp` extra): base weights must be a GGUF file.

    `PawConfig.device` "cpu" runs on the CPU, any other offloads every layer; `dtype` sets the KV-cache type.
    Each program has its own llama.cpp context over the memory-mapped base, and its runs are serialized.
    """

    name = "llamacpp"

    @classmethod
    def open_program(
        cls, model: type[InterpreterModel], bundle: ProgramBundle, base: Path, config: PawConfig
    ) -> ProgramRuntime:
        """Load `bundle` on llama.cpp with base GGUF `base`."""
        from .llamacpp_runtime import LlamaCppProgram

        return LlamaCppProgram.open(model, bundle, base, config)
