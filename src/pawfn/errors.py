"""Typed exceptions: every error pawfn raises on purpose derives from `PawError`."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from pydantic import ValidationError

__all__ = [
    "AdapterError",
    "AuthenticationError",
    "CompileError",
    "ConfigError",
    "HubConnectionError",
    "HubError",
    "IntegrityError",
    "NotFoundError",
    "OfflineError",
    "RateLimitError",
    "RequestError",
    "ServerError",
    "BaseModelError",
    "BundleError",
    "CacheLockError",
    "ContextOverflowError",
    "InterpreterMismatchError",
    "NonFiniteError",
    "PawError",
    "ProgramClosedError",
    "TokenizerError",
    "describe_option_errors",
    "describe_validation_error",
]


def describe_validation_error(error: ValidationError) -> str:
    """One line naming each invalid field and its problem (`field: message; ...`)."""
    return "; ".join(f"{'.'.join(map(str, item['loc']))}: {item['msg']}" for item in error.errors())


def describe_option_errors(error: ValidationError, labels: Mapping[str, str]) -> str:
    """One line per invalid option in one wording, `invalid LABEL=VALUE: problem`, where LABEL says where the
    value came from (e.g. ``--dtype``, ``PAW_DTYPE``; the field name otherwise); secrets are never echoed."""
    parts: list[str] = []
    for item in error.errors():
        field = str(item["loc"][0]) if item["loc"] else "value"
        label = labels.get(field, field)
        shown = "<hidden>" if "key" in field else repr(item.get("input"))
        parts.append(f"invalid {label}={shown}: {item['msg']}")
    return "; ".join(parts)


class PawError(Exception):
    """Base class of every error raised by pawfn."""


class BundleError(PawError, ValueError):
    """A program bundle (`.paw` zip or folder) is missing, unsafe or malformed."""

    def __init__(self, path: Path | str, problem: str) -> None:
        self.path = Path(path)
        self.problem = problem
        super().__init__(f"{path}: {problem}")


class AdapterError(PawError, ValueError):
    """A GGUF LoRA adapter cannot be read or does not fit its interpreter."""

    def __init__(self, path: Path | str, problem: str) -> None:
        self.path = Path(path)
        self.problem = problem
        super().__init__(f"{path}: {problem}")


class BaseModelError(PawError, ValueError):
    """Base weights (HF folder or GGUF file) are missing, unreadable or of the wrong architecture."""

    def __init__(self, path: Path | str | None, problem: str) -> None:
        self.path = None if path is None else Path(path)
        self.problem = problem
        super().__init__(problem if path is None else f"{path}: {problem}")


class TokenizerError(BaseModelError):
    """The interpreter's tokenizer cannot be built from the base weights."""


class InterpreterMismatchError(PawError, TypeError):
    """A program was compiled for another interpreter than the model type it is loaded as."""

    def __init__(self, program: str, found: str, expected: str, model_name: str, suggestion: str | None) -> None:
        self.found = found
        self.expected = expected
        fix = f"load it as PawFn[{suggestion}, ...] instead" if suggestion else "pawfn has no model type for it"
        super().__init__(
            f"program {program} was compiled for interpreter {found!r}, but it is being loaded as "
            f"{model_name} (interpreter {expected!r}); {fix}"
        )


class NonFiniteError(PawError, ArithmeticError):
    """A run's logits became NaN or infinite (the run stops rather than return garbage)."""

    def __init__(self, position: int, cause: str) -> None:
        self.position = position
        super().__init__(f"the model's logits became non-finite (NaN or infinity) at position {position}: {cause}")


class ContextOverflowError(PawError, ValueError):
    """Prefix plus input does not fit the context window (all counts in tokens)."""

    def __init__(self, prefix_tokens: int, prompt_tokens: int, n_ctx: int, at_least: bool = False) -> None:
        self.prefix_tokens = prefix_tokens
        self.prompt_tokens = prompt_tokens
        self.n_ctx = n_ctx
        super().__init__(
            f"context overflow: {'at least ' if at_least else ''}{prefix_tokens + prompt_tokens} tokens used (prefix={prefix_tokens}, "
            f"input={prompt_tokens}), context window={n_ctx}; shorten the input or raise n_ctx"
        )


class ProgramClosedError(PawError, RuntimeError):
    """The program was closed and can no longer run."""


class ConfigError(PawError, ValueError):
    """A configuration value (argument, environment variable or config file) is invalid."""


class CacheLockError(PawError, TimeoutError):
    """Another process (pawfn or the official SDK) held a cache entry's lock longer than `PawConfig.lock_timeout_s`."""

    def __init__(self, what: str, path: Path, timeout_s: float) -> None:
        self.path = path
        super().__init__(
            f"gave up after {timeout_s:g} s waiting for the cache lock on {what} ({path}): another process is "
            "installing or downloading it; try again later, or raise PawConfig.lock_timeout_s"
        )


class OfflineError(PawError, ConnectionError):
    """Offline mode (or an unreachable hub) and something needed is not in the cache."""


class IntegrityError(PawError, ValueError):
    """A downloaded file failed its size or sha256 check."""


class HubError(PawError):
    """The PAW API answered with an error; carries the HTTP status and the server's message."""

    def __init__(
        self, message: str, *, status: int | None = None, server_message: str | None = None, url: str | None = None,
        code: str | None = None,
    ) -> None:
        self.status = status
        self.server_message = server_message
        self.url = url
        self.code = code
        """The server's error code (the body's ``error`` field, e.g. ``context_overflow``), if it gave one."""
        super().__init__(message)


class NotFoundError(HubError, LookupError):
    """The program, slug or job does not exist (or is private to another account): HTTP 404."""


class AuthenticationError(HubError):
    """The API key is missing, wrong or not allowed to do this: HTTP 401/403."""


class RateLimitError(HubError):
    """Too many requests (HTTP 429) and the retries ran out; `retry_after_s` says when to try again."""

    def __init__(
        self,
        message: str,
        *,
        retry_after_s: float | None = None,
        status: int | None = None,
        server_message: str | None = None,
        url: str | None = None,
        code: str | None = None,
    ) -> None:
        self.retry_after_s = retry_after_s
        super().__init__(message, status=status, server_message=server_message, url=url, code=code)


class RequestError(HubError, ValueError):
    """A server refused a request as invalid (HTTP 400/413/422): too large, bad options, or an input that overflows
    the program's context; `code` names which."""


class ServerError(HubError):
    """The server failed (HTTP 5xx) or could not be reached, after the retries."""


class CallTimeoutError(ServerError, TimeoutError):
    """A call sent to a server got no answer within its timeout (`PawConfig.run_timeout_s`). It is not sent again:
    the server may still be running it."""


class CompileError(HubError):
    """The compiler refused the spec or failed to compile it."""


class HubConnectionError(HubError, ConnectionError):
    """The PAW API (or a download host) could not be reached, after the retries."""
