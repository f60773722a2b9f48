"""How errors become HTTP answers: `ApiError` (a status, a stable code, a message for the client, a detail for the
log only) and `api_error`, the one mapping from pawfn's errors, shared by `pawfn serve` and the Ray replicas."""

from __future__ import annotations

from ..core.errors import (
    ConfigError,
    ContextOverflowError,
    GrammarError,
    HubError,
    InterpreterMismatchError,
    NonFiniteError,
    NotFoundError,
    OfflineError,
    OutputTypeError,
    PawError,
    ProgramClosedError,
    ProgramNotLoadedError,
)
from ..core.images import ImageError
from ..core.templates import ArityError
from .service import ProgramBudgetError, ProgramBusyError, ProgramKeptError, ProgramLoadError

__all__ = ["ApiError", "api_error", "internal_error", "shutting_down"]


class ApiError(Exception):
    """An error response: HTTP status, stable code, message (names the problem and the fix), extra headers; `detail`
    goes to the server's log only, beside the request id (a 5xx body never carries it)."""

    def __init__(
        self, status: int, code: str, message: str, headers: dict[str, str] | None = None, detail: str | None = None, param: str | None = None
    ) -> None:
        super().__init__(message)
        self.param = param
        """The request's field at fault, where one is (OpenAI's error object names it)."""
        self.status = status
        self.code = code
        self.message = message
        self.headers = headers or {}
        self.detail = detail


def api_error(exc: PawError) -> ApiError:
    """The response a pawfn error becomes: 4xx with its message for what the client can change, 502 for a program
    that could not come from the hub, and otherwise 500 with a generic message (the error itself logged)."""
    if isinstance(exc, NotFoundError | ProgramNotLoadedError):
        return ApiError(404, "program_not_found", str(exc))
    if isinstance(exc, ContextOverflowError):
        return ApiError(422, "context_overflow", str(exc))
    if isinstance(exc, InterpreterMismatchError):
        return ApiError(422, "interpreter_mismatch", str(exc))
    if isinstance(exc, GrammarError):
        return ApiError(422, "invalid_response_format", str(exc))
    if isinstance(exc, OutputTypeError):
        return ApiError(422, "output_not_of_type", str(exc))
    if isinstance(exc, ArityError):
        return ApiError(422, "wrong_argument_count", str(exc))
    if isinstance(exc, ImageError):
        return ApiError(422, "invalid_image", str(exc))
    if isinstance(exc, ConfigError):
        return ApiError(422, "invalid_request", str(exc))
    if isinstance(exc, ProgramClosedError):
        return shutting_down()
    if isinstance(exc, ProgramBudgetError):
        return ApiError(503, "programs_busy", str(exc), {"Retry-After": "1"})
    if isinstance(exc, ProgramBusyError):
        return ApiError(409, "program_busy", str(exc))
    if isinstance(exc, ProgramKeptError):
        return ApiError(409, "program_kept", str(exc))
    if isinstance(exc, ProgramLoadError):  # its message is written for clients; the cause is logged (a repeat has none)
        return ApiError(502, "load_failed", str(exc), detail=None if exc.__cause__ is None else _described(exc.__cause__))
    if isinstance(exc, (HubError, OfflineError)):
        return ApiError(502, "load_failed", "the server could not load the program from its hub; retry later", detail=_described(exc))
    if isinstance(exc, NonFiniteError):  # the program's own numbers: its message names no file
        return ApiError(500, "run_failed", str(exc))
    return internal_error(exc)


def _described(exc: BaseException) -> str:
    """`Type: message`, as the log shows an error."""
    return f"{type(exc).__name__}: {exc}"


def internal_error(exc: BaseException) -> ApiError:
    """A 500 that tells the client nothing of `exc` (it goes to the log, under the request id)."""
    return ApiError(500, "internal_error", "the server failed on this request; its log has the details under this request id", detail=_described(exc))


def shutting_down() -> ApiError:
    """The answer to a request still running when the server's drain deadline passes."""
    return ApiError(503, "shutting_down", "the server is shutting down; retry on another replica", {"Retry-After": "1"})
