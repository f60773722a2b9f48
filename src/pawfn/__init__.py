"""pawfn: typed Python SDK for ProgramAsWeights neural programs."""

from typing import TYPE_CHECKING

from .core.backends import Backend, LlamaCpp, Remote, Torch
from .api.batch import Returns, arun_many, generate_many, run_many
from .api.builder import PawFnBuilder, ProgramLoader, SpecCompiler
from .formats.bundle import ProgramMeta, PromptTemplate
from .core.errors import (
    AdapterError,
    AuthenticationError,
    BaseModelError,
    BundleError,
    CacheLockError,
    CompileError,
    ConfigError,
    ContextOverflowError,
    GrammarError,
    HubConnectionError,
    HubError,
    IntegrityError,
    InterpreterMismatchError,
    NonFiniteError,
    OptionError,
    OptionProblem,
    OutputTypeError,
    NotFoundError,
    OfflineError,
    PawError,
    ProgramBudgetError,
    ProgramBusyError,
    ProgramClosedError,
    ProgramNotLoadedError,
    RateLimitError,
    RequestError,
    ServerError,
    CallTimeoutError,
    TokenizerError,
)
from .api.function import PawFn
from .api.leases import PoolStats, ProgramLease, ResidentProgram
from .api.pool import ProgramPool
from .core.images import Image, ImageError
from .api.positional import Positional
from .core.templates import ArityError, TemplateError
from .core.grammar import ChoicesFormat, JsonSchemaFormat, JsonSchemaSpec, PatternFormat
from .formats.outputs import OutputType, Pattern
from .api.typed import TypedFn, TypedGeneration
from .core.results import Generation, Timings
from .calls.pending import TextIterator, TextStream
from .core.models import GPT2, InterpreterModel, Qwen3_0_6B, Qwen3_5_0_8B, WeightFile
from .core.config import EngineSettings, HubSettings, PawConfig, RemoteSettings
from .core.options import RuntimeOptions
from .calls.log import CallRecord, set_call_log_redactor
from .hub import AsyncPawClient, LockError, PawCache, PawClient, PreparedProgram, locked_program, prepare_program

if TYPE_CHECKING:
    from .torch import ModelRegistry

__version__ = "0.1.0"

__all__ = [
    "GPT2",
    "AdapterError",
    "ArityError",
    "AsyncPawClient",
    "AuthenticationError",
    "Backend",
    "BaseModelError",
    "BundleError",
    "CacheLockError",
    "ChoicesFormat",
    "CompileError",
    "ConfigError",
    "ContextOverflowError",
    "EngineSettings",
    "GrammarError",
    "Generation",
    "HubConnectionError",
    "HubSettings",
    "HubError",
    "Image",
    "ImageError",
    "IntegrityError",
    "LockError",
    "JsonSchemaFormat",
    "JsonSchemaSpec",
    "InterpreterMismatchError",
    "NonFiniteError",
    "OptionError",
    "OptionProblem",
    "OutputType",
    "OutputTypeError",
    "Pattern",
    "PatternFormat",
    "InterpreterModel",
    "LlamaCpp",
    "ModelRegistry",
    "NotFoundError",
    "OfflineError",
    "PawCache",
    "PawClient",
    "PawConfig",
    "PawError",
    "PawFn",
    "PawFnBuilder",
    "PoolStats",
    "Positional",
    "PreparedProgram",
    "ProgramBudgetError",
    "ProgramBusyError",
    "ProgramClosedError",
    "ProgramLease",
    "ProgramNotLoadedError",
    "ProgramLoader",
    "ProgramMeta",
    "ProgramPool",
    "PromptTemplate",
    "Qwen3_0_6B",
    "Qwen3_5_0_8B",
    "RateLimitError",
    "Remote",
    "RemoteSettings",
    "RequestError",
    "ResidentProgram",
    "Returns",
    "RuntimeOptions",
    "ServerError",
    "CallRecord",
    "CallTimeoutError",
    "SpecCompiler",
    "TemplateError",
    "TextIterator",
    "TextStream",
    "Timings",
    "TokenizerError",
    "Torch",
    "TypedFn",
    "TypedGeneration",
    "WeightFile",
    "__version__",
    "arun_many",
    "generate_many",
    "locked_program",
    "prepare_program",
    "run_many",
    "set_call_log_redactor",
]


def __getattr__(name: str) -> object:
    """`ModelRegistry` imported on first use: `import pawfn` does not import torch (a Remote-only client, `pawfn
    --help`)."""
    if name == "ModelRegistry":
        from .torch import ModelRegistry

        return ModelRegistry
    raise AttributeError(f"module 'pawfn' has no attribute {name!r}")
