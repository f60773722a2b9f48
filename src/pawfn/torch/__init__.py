"""The Torch backend: pawfn's own forward pass on shared, reference-counted base weights."""

from .engine.program import TorchProgram
from .engine.registry import ModelRegistry

__all__ = ["ModelRegistry", "TorchProgram"]
