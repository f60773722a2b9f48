"""Typed exceptions: every error pawfn raises on purpose derives from `PawError`."""

from __future__ import annotations

import types
import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import annotated_types
from pydantic import BaseModel, SecretStr, ValidationError

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
    "GrammarError",
    "OutputTypeError",
    "InterpreterMismatchError",
    "NonFiniteError",
    "OptionError",
    "OptionProblem",
    "PawError",
    "ProgramBudgetError",
    "ProgramBusyError",
    "ProgramClosedError",
    "RealProgramsBlockedError",
    "TokenizerError",
    "describe_validation_error",
]


def describe_validation_error(error: ValidationError) -> str:
    """One line naming each invalid field and its problem (`field: message; ...`)."""
    return "; ".join(f"{'.'.join(map(str, item['loc']))}: {item['msg']}" for item in error.errors())


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
            f"program {program} was compiled for interpreter {found!r}, but it is being loaded as {model_name} (interpreter {expected!r}); {fix}"
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


class GrammarError(PawError, TypeError):
    """An output type or schema that cannot be turned into a grammar (refused before any call runs)."""


class OutputTypeError(PawError, ValueError):
    """A call's output is not a value of the type it was constrained to: no value could finish within its token
    budget, or the value broke a check the grammar cannot make (e.g. a pydantic validator)."""

    def __init__(self, type_name: str, text: str, problem: str) -> None:
        self.type_name = type_name
        self.text = text
        """The output text so far."""
        self.problem = problem
        shown = text if len(text) <= 200 else text[:200] + "..."
        super().__init__(f"the output is not a {type_name}: {problem}; text so far: {shown!r}")

    @classmethod
    def reported(cls, message: str) -> OutputTypeError:
        """The error a server reported for its call (its message names the type and shows the text)."""
        error = cls.__new__(cls)
        PawError.__init__(error, message)
        error.type_name, error.text, error.problem = "", "", message
        return error


class ProgramClosedError(PawError, RuntimeError):
    """The program was closed and can no longer run."""

    def __init__(self, message: str = "this program was closed; load it again to run it") -> None:
        super().__init__(message)


class ProgramBudgetError(PawError, RuntimeError):
    """A program must load, a pool's budget is full, and every program it holds is pinned or running calls."""


class ProgramBusyError(PawError, RuntimeError):
    """A program asked to unload is running calls."""


class ProgramNotLoadedError(PawError, LookupError):
    """A program asked of a pool (or server) by reference is not loaded there; use or load it first."""


class RealProgramsBlockedError(PawError, RuntimeError):
    """A real program was opened, or a hub or server asked, while `pawfn.testing` blocks real programs (a unit test)."""


class ConfigError(PawError, ValueError):
    """A configuration value (argument, environment variable or config file) is invalid."""


class _Hidden:
    """Stands for a secret's value in messages."""

    def __repr__(self) -> str:
        return "<hidden>"


_HIDDEN = _Hidden()


@dataclass(frozen=True)
class OptionProblem:
    """One invalid option: its field, the value given (``<hidden>`` for secrets), what is wrong and what it allows."""

    field: str
    value: object
    problem: str
    allowed: str | None = None
    """The values the field takes, e.g. ``an integer >= 0, or None``; None where a custom check said what is wrong."""

    @classmethod
    def outside(cls, field: str, value: object, allowed: str) -> OptionProblem:
        """`value` is not among what `field` allows (``an integer >= 1``): the problem reads ``expected ...``."""
        return cls(field, value, f"expected {allowed}", allowed)

    def describe(self, label: str | None = None) -> str:
        """`invalid LABEL=VALUE: problem`, LABEL where the value came from (``--top-p``, ``PAW_DTYPE``) or the field."""
        return f"invalid {label or self.field}={self.value!r}: {self.problem}"


class OptionError(ConfigError):
    """Options (`RuntimeOptions`, `PawConfig`, a CLI flag or a variable) with values outside what they allow; one
    `OptionProblem` per invalid field, in the same wording from the API, the CLI and a server."""

    def __init__(self, problems: Sequence[OptionProblem], labels: Mapping[str, str] | None = None) -> None:
        self.problems = tuple(problems)
        self.labels = dict(labels or {})
        super().__init__("; ".join(item.describe(self.labels.get(item.field)) for item in self.problems))

    @property
    def field(self) -> str:
        """The first invalid field's name."""
        return self.problems[0].field

    @property
    def value(self) -> object:
        """The first invalid field's value."""
        return self.problems[0].value

    @property
    def allowed(self) -> str | None:
        """What the first invalid field allows."""
        return self.problems[0].allowed

    def labeled(self, labels: Mapping[str, str]) -> OptionError:
        """The same problems named by where their values came from (e.g. ``{"top_p": "--top-p"}``)."""
        return OptionError(self.problems, {**self.labels, **labels})

    @classmethod
    def from_validation(cls, error: ValidationError, model: type[BaseModel], labels: Mapping[str, str] | None = None) -> OptionError:
        """The problems of pydantic's `error` on `model`, each with the range its field allows."""
        problems: list[OptionProblem] = []
        for item in error.errors():
            field = str(item["loc"][0]) if item["loc"] else "value"
            value: object = _HIDDEN if "key" in field else item.get("input")
            info = model.model_fields.get(field)
            if info is None and item["type"] == "extra_forbidden":
                problems.append(OptionProblem(field, value, f"unknown option; the options are {', '.join(model.model_fields)}"))
            elif info is None or item["type"] == "value_error":  # a field's own check words its problem itself
                problems.append(OptionProblem(field, value, str(item["msg"]).removeprefix("Value error, ")))
            else:
                problems.append(OptionProblem.outside(field, value, allowed_values(info.annotation, info.metadata)))
        return cls(problems, labels)


def allowed_values(annotation: object, metadata: Sequence[object] = ()) -> str:
    """What a field typed `annotation` with pydantic constraints `metadata` accepts, in words."""
    choices = typing.get_args(annotation)
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        others = [choice for choice in choices if choice is not type(None)]
        described = " or ".join(allowed_values(choice, metadata) for choice in others)
        return f"{described}, or None" if len(others) < len(choices) else described
    if typing.get_origin(annotation) is typing.Literal:
        shown = [repr(choice) for choice in choices]
        return "one of " + ", ".join(shown if len(shown) <= 8 else [*shown[:6], "...", shown[-1]])
    bounds: list[str] = []
    finite = False
    for item in metadata:
        if isinstance(item, annotated_types.Ge):
            bounds.append(f">= {_number(item.ge)}")
        elif isinstance(item, annotated_types.Gt):
            bounds.append(f"> {_number(item.gt)}")
        elif isinstance(item, annotated_types.Le):
            bounds.append(f"<= {_number(item.le)}")
        elif isinstance(item, annotated_types.Lt):
            bounds.append(f"< {_number(item.lt)}")
        elif getattr(item, "allow_inf_nan", None) is False:
            finite = True
    if len(bounds) == 2 and bounds[0][0] == ">" and bounds[1][0] == "<":  # an interval: [0, 2**64), (0, 1]
        low, high = (bound.split(" ", 1) for bound in bounds)
        bound_text = f" in {'[' if low[0] == '>=' else '('}{low[1]}, {high[1]}{']' if high[0] == '<=' else ')'}"
    else:
        bound_text = "".join(f" {bound}" for bound in bounds[:1]) + "".join(f" and {bound}" for bound in bounds[1:])
    names = {
        bool: "true or false",
        int: "an integer",
        float: "a finite number" if finite else "a number",
        str: "text",
        SecretStr: "text",
        Path: "a path",
    }
    name = names.get(annotation, getattr(annotation, "__name__", str(annotation))) if isinstance(annotation, type) else str(annotation)
    return name + bound_text


def _number(value: object) -> str:
    """`value` as written in docs: ``2**64`` rather than twenty digits, ``0`` rather than ``0.0``."""
    if isinstance(value, int) and value >= 2**32 and value & (value - 1) == 0:
        return f"2**{value.bit_length() - 1}"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


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
        self, message: str, *, status: int | None = None, server_message: str | None = None, url: str | None = None, code: str | None = None
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
