"""pawfn: typed Python SDK for ProgramAsWeights neural programs."""

from .backends import Backend, Torch
from .bundle import ProgramMeta, PromptTemplate
from .errors import (
    AdapterError,
    BaseModelError,
    BundleError,
    ContextOverflowError,
    InterpreterMismatchError,
    PawError,
    ProgramClosedError,
    TokenizerError,
)
from .function import PawFn
from .generation import Generation, Timings
from .models import GPT2, InterpreterModel, Qwen3_0_6B, WeightFile
from .options import PawConfig, RuntimeOptions
from .registry import BaseRegistry

__version__ = "0.1.0"

__all__ = [
    "GPT2",
    "AdapterError",
    "Backend",
    "BaseModelError",
    "BaseRegistry",
    "BundleError",
    "ContextOverflowError",
    "Generation",
    "InterpreterMismatchError",
    "InterpreterModel",
    "PawConfig",
    "PawError",
    "PawFn",
    "ProgramClosedError",
    "ProgramMeta",
    "PromptTemplate",
    "Qwen3_0_6B",
    "RuntimeOptions",
    "Timings",
    "TokenizerError",
    "Torch",
    "WeightFile",
    "__version__",
]
