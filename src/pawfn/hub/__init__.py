"""The PAW hub: API client, the cache shared with the official SDK, references and runtime manifests."""

from .cache import CachedProgram, PawCache
from .client import AsyncPawClient, PawClient
from .lockfile import LockError, LockFile, LockedProgram, locked_program
from .prepare import PreparedProgram, aprepare_program, compile_program, find_cached_base, prepare_program
from .refs import ProgramReference, parse_reference
from .types import (
    CompileCancellation,
    CompileJob,
    CompilePrecheck,
    CompileResult,
    CompileStatus,
    CompilerInfo,
    ProgramInfo,
    ProgramList,
    ProgramVersions,
    RuntimeManifest,
)

__all__ = [
    "AsyncPawClient",
    "CachedProgram",
    "CompileCancellation",
    "CompileJob",
    "CompilePrecheck",
    "CompileResult",
    "CompileStatus",
    "CompilerInfo",
    "LockError",
    "LockFile",
    "LockedProgram",
    "PawCache",
    "PawClient",
    "PreparedProgram",
    "ProgramInfo",
    "ProgramList",
    "ProgramReference",
    "ProgramVersions",
    "RuntimeManifest",
    "aprepare_program",
    "compile_program",
    "find_cached_base",
    "locked_program",
    "parse_reference",
    "prepare_program",
]
