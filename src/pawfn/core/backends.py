"""Backend types: type-level markers of where and how a program's forward pass runs.

The implementations live in `pawfn.torch`, `pawfn.llamacpp` and `pawfn.remote`; `pawfn.api.function` maps a marker
to its opener (Torch's imported on first use), so this module (a core type) imports no backend.
"""

from __future__ import annotations

from typing import ClassVar

__all__ = ["Backend", "LlamaCpp", "Remote", "Torch"]


class Backend:
    """Base of backend types; like interpreter models, a backend class is a type-level marker."""

    name: ClassVar[str]
    """Short name of the backend (e.g. ``torch``), as the CLI's `--backend` takes it."""

    def __init__(self) -> None:
        raise TypeError(f"{type(self).__name__} is a type marker; use it as PawFn[..., {type(self).__name__}]")


class Torch(Backend):
    """PyTorch on CPU, CUDA or MPS (`PawConfig.device`), float32 by default (`PawConfig.dtype`)."""

    name = "torch"


class LlamaCpp(Backend):
    """llama.cpp, the official runtime (the `llamacpp` extra): base weights must be a GGUF file.

    `PawConfig.device` "cpu" runs on the CPU, any other offloads every layer; `dtype` sets the KV-cache type.
    Each program has its own llama.cpp context over the memory-mapped base, and its runs are serialized.
    """

    name = "llamacpp"


class Remote(Backend):
    """A `pawfn serve` or Ray Serve server (`PawConfig.server_url`): programs load by reference on the server, and
    `run`, `arun`, `run_batch` and `generate` send their calls there. The interpreter type is checked against the
    server's program info when it loads, before any run."""

    name = "remote"
