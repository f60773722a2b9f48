"""The Torch backend: pawfn's own forward pass on shared, reference-counted base weights."""

from .program import TorchProgram
from .registry import ModelRegistry

__all__ = ["ModelRegistry", "TorchProgram"]
