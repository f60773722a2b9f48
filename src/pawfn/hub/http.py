"""The request plan both PAW clients and the server client carry out: requests followed through redirects by hand
(so a key never reaches another origin), retried on connection errors, 408, 429 (honouring Retry-After) and 5xx
with exponential backoff and jitter, and the server's answers mapped to typed errors.

As in httpx, the decisions live in one place: `ClientBase` plans each exchange (`_exchange`: requests, redirects,
retries and waits, without I/O) of a request described once (`Endpoint`: request, parser, error mapping);
`SyncClient` carries the plan out with blocking calls, `AsyncPawClient` with awaits.
"""

from __future__ import annotations

import email.utils
import random
import time
from collections.abc import Callable, Generator, Mapping
from dataclasses import dataclass
from typing import Generic, TypedDict, TypeVar
from urllib.parse import quote, urljoin, urlsplit

import httpx
from pydantic import BaseModel, ValidationError
from typing_extensions import Self

from ..core.config import HubSettings, PawConfig
from ..core.errors import (
    AuthenticationError,
    CallTimeoutError,
    HubConnectionError,
    HubError,
    NotFoundError,
    OfflineError,
    PawError,
    RateLimitError,
    ServerError,
    describe_validation_error,
)
from ..core.guard import check_real_program
from ..core.jsonio import parse_json_object

__all__ = [
    "CALL_RETRY_STATUSES",
    "SERVER_RETRY_STATUSES",
    "ClientBase",
    "Endpoint",
    "ErrorFacts",
    "ModelT",
    "Outcome",
    "Plan",
    "Request",
    "Send",
    "Sleep",
    "SyncClient",
    "backoff",
    "call_timeout_error",
    "parse_model",
    "retry_after",
]

RETRY_STATUSES = frozenset({408, 429, 500, 502, 503, 504})
SERVER_RETRY_STATUSES = RETRY_STATUSES - {500}
"""A pawfn server's 500 is a call that failed (e.g. non-finite logits): sending it again fails again."""
CALL_RETRY_STATUSES = SERVER_RETRY_STATUSES - {504}
"""A server call is sent again only on answers that say it did not run (a gateway's 504 may hide one that does)."""
_NOT_SENT = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout)
"""Transport errors before a request reached the server: sending it again cannot run it twice."""
_MAX_RETRY_AFTER_S = 120.0
_MAX_REDIRECTS = 5
ModelT = TypeVar("ModelT", bound=BaseModel)
_T = TypeVar("_T")


def _origin(url: str) -> tuple[str, str, int | None]:
    parts = urlsplit(url)
    port = parts.port or {"http": 80, "https": 443}.get(parts.scheme)
    return parts.scheme, (parts.hostname or "").lower(), port


def retry_after(response: httpx.Response) -> float | None:
    """Seconds from a Retry-After header (a number or an HTTP date), if any."""
    value = response.headers.get("retry-after")
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        parsed = email.utils.parsedate_to_datetime(value) if value else None
        return None if parsed is None else max(0.0, parsed.timestamp() - time.time())


def call_timeout_error(what: str, url: str, timeout_s: float | None, where: str) -> CallTimeoutError:
    """A call that got no answer in time, never sent again; `where` says what the server does with it now."""
    return CallTimeoutError(
        f"{what}: no answer from {url} within {timeout_s} s; it was not sent again ({where}): give the call a "
        "max_tokens, or a longer PawConfig.run_timeout_s (PAW_RUN_TIMEOUT_S)",
        url=url,
    )


def backoff(attempt: int, base_s: float) -> float:
    """Exponential backoff with jitter: base * 2^attempt, capped at 8 s, times a factor in [0.75, 1]."""
    return min(base_s * 2.0**attempt, 8.0) * (1.0 - 0.25 * random.random())


def _error_body(response: httpx.Response) -> dict[str, object]:
    """An error response's JSON object (empty when there is none, or it was not read)."""
    try:
        return parse_json_object(response.content) or {}
    except httpx.ResponseNotRead:
        return {}


def _server_message(body: dict[str, object]) -> str | None:
    for key in ("message", "detail", "error"):
        value = body.get(key)
        if isinstance(value, str):
            return value
    return None


class ErrorFacts(TypedDict):
    status: int
    server_message: str | None
    url: str
    code: str | None


def _server_code(body: dict[str, object]) -> str | None:
    """The error code of an `{error, message}` body (the documented PAW error shape), if any."""
    code, message = body.get("error"), body.get("message")
    return code if isinstance(code, str) and isinstance(message, str) else None


def _error_for(response: httpx.Response, what: str) -> HubError:
    status = response.status_code
    body = _error_body(response)
    message = _server_message(body)
    suffix = f": {message}" if message else ""
    url = str(response.request.url)
    facts = ErrorFacts(status=status, server_message=message, url=url, code=_server_code(body))
    if status == 404:
        return NotFoundError(f"{what} not found (HTTP 404){suffix}", **facts)
    if status in (401, 403):
        return AuthenticationError(f"{what}: not authorized (HTTP {status}){suffix}; set PAW_API_KEY or run `pawfn login`", **facts)
    if status == 429:
        return RateLimitError(f"{what}: rate limited (HTTP 429){suffix}; try again later", retry_after_s=retry_after(response), **facts)
    if status >= 500:
        return ServerError(f"{what}: server error (HTTP {status}){suffix}", **facts)
    return HubError(f"{what}: HTTP {status}{suffix}", **facts)


def parse_model(kind: type[ModelT], response: httpx.Response, what: str) -> ModelT:
    try:
        return kind.model_validate_json(response.content)
    except ValidationError as exc:
        raise HubError(f"{what}: unexpected response ({describe_validation_error(exc)})", status=response.status_code) from exc


def _redirect(response: httpx.Response, current: str, method: str) -> tuple[str, str] | None:
    """The next (URL, method) of a redirect response, else None."""
    if not response.is_redirect:
        return None
    return urljoin(current, response.headers.get("location", "")), "GET" if response.status_code == 303 else method


def _retry_delay(
    response: httpx.Response, attempt: int, max_retries: int, backoff_s: float, statuses: frozenset[int] = RETRY_STATUSES
) -> float | None:
    """Seconds to wait before retrying `response`, or None when it is final (success, 4xx, retries spent)."""
    if response.status_code not in statuses or attempt >= max_retries:
        return None
    delay = retry_after(response)
    if delay is not None and delay > _MAX_RETRY_AFTER_S:
        return None  # the server asks for longer than a library should block: report it
    return backoff(attempt, backoff_s) if delay is None else delay


def _as_reported(error: HubError) -> HubError:
    """An error as the server's status named it."""
    return error


@dataclass(frozen=True)
class Request:
    """One logical request: followed through redirects and retried as a whole."""

    method: str
    url: str
    what: str
    """What is asked for, in words, for error messages (e.g. ``program abc``)."""
    json: object = None
    params: Mapping[str, str] | None = None
    headers: Mapping[str, str] | None = None
    timeout: float | None = None
    stream: bool = False
    map_error: Callable[[HubError], PawError] = _as_reported
    """How this call names the server's errors (e.g. a refused spec is a `CompileError`)."""
    retry_statuses: frozenset[int] = RETRY_STATUSES
    """Answers worth sending the request again for (with connection errors)."""
    once: bool = False
    """A call that must not run twice (a server's run): sent again only where it never reached the server (no
    connection); a timeout or a connection lost afterwards is the caller's error (`CallTimeoutError` for timeouts)."""


@dataclass(frozen=True)
class Endpoint(Generic[_T]):
    """An API call described once: its request and how its answer is read."""

    request: Request
    parse: Callable[[httpx.Response], _T]


@dataclass(frozen=True)
class Send:
    request: httpx.Request
    stream: bool


@dataclass(frozen=True)
class Sleep:
    seconds: float


Outcome = httpx.Response | httpx.TransportError | None
Plan = Generator[Send | Sleep, Outcome, httpx.Response]


class ClientBase:
    """Every pure decision of the two clients: endpoints, request building, redirects, retries, errors."""

    def __init__(self, config: HubSettings | None, backoff_s: float) -> None:
        self.config: HubSettings = config or PawConfig.from_env()
        self._backoff_s = backoff_s
        self._root = self.config.api_url
        """The server's root URL: requests go under it, and its key only to its origin."""
        self._key = self.config.key_value()

    def api_url(self, *parts: str) -> str:
        """`{root}/api/v1/` plus the URL-encoded path parts."""
        return self._url("api/v1", *parts)

    def _url(self, prefix: str, *parts: str) -> str:
        return f"{self._root}/{prefix}/" + "/".join(quote(part, safe="") for part in parts)

    def _api(
        self,
        method: str,
        what: str,
        *parts: str,
        json: object = None,
        params: Mapping[str, str] | None = None,
        timeout: float | None = None,
        map_error: Callable[[HubError], PawError] = _as_reported,
    ) -> Request:
        return Request(method, self.api_url(*parts), what, json=json, params=params, timeout=timeout, map_error=map_error)

    def _build(self, http: httpx.Client | httpx.AsyncClient, request: Request, method: str, url: str) -> httpx.Request:
        """One hop; the API key goes only to the API's own origin, never to a redirect target elsewhere; refused while
        real programs are blocked (`pawfn.testing`)."""
        check_real_program(f"{request.what} ({method} {url})")
        headers = dict(request.headers or {})
        if self._key and _origin(url) == _origin(self._root):
            headers["X-API-Key"] = self._key
        return http.build_request(
            method,
            url,
            json=request.json if method == request.method else None,
            params=request.params,
            headers=headers,
            timeout=httpx.Timeout(request.timeout) if request.timeout else None,
        )

    def _exchange(self, http: httpx.Client | httpx.AsyncClient, request: Request) -> Plan:
        """The plan of one logical request: yields what to send or how long to sleep, returns the 2xx answer
        (202 included) or raises the typed error."""
        if self.config.offline:
            raise OfflineError(f"{request.what}: offline mode is on (PAW_OFFLINE / --offline), so no request is made")
        attempt = 0
        while True:
            url, method, redirects = request.url, request.method, 0
            while True:
                outcome = yield Send(self._build(http, request, method, url), request.stream)
                assert outcome is not None  # a send is answered by a response or a transport error
                if isinstance(outcome, httpx.TransportError):
                    break
                hop = _redirect(outcome, url, method)
                if hop is None or redirects >= _MAX_REDIRECTS:
                    break
                outcome.close()
                (url, method), redirects = hop, redirects + 1
            if isinstance(outcome, httpx.TransportError):
                if request.once and not isinstance(outcome, _NOT_SENT):
                    if isinstance(outcome, httpx.TimeoutException):
                        raise call_timeout_error(request.what, url, request.timeout, "the server may still be running it") from outcome
                    raise ServerError(
                        f"{request.what}: the connection to {url} failed after the call was sent ({outcome}); it was "
                        "not sent again (the server may have run it)",
                        url=url,
                    ) from outcome
                if attempt >= self.config.max_retries:
                    raise HubConnectionError(f"{request.what}: cannot reach {url} ({outcome})", url=url) from outcome
                delay = backoff(attempt, self._backoff_s)
            else:
                retry = _retry_delay(outcome, attempt, self.config.max_retries, self._backoff_s, request.retry_statuses)
                if retry is None:
                    if outcome.is_success:
                        return outcome
                    if request.stream:
                        outcome.read()  # the error body carries the server's message
                    outcome.close()
                    raise request.map_error(_error_for(outcome, request.what))
                outcome.close()
                delay = retry
            yield Sleep(delay)
            attempt += 1

    def _model(
        self,
        kind: type[ModelT],
        method: str,
        what: str,
        *parts: str,
        json: object = None,
        params: Mapping[str, str] | None = None,
        map_error: Callable[[HubError], PawError] = _as_reported,
    ) -> Endpoint[ModelT]:
        """An endpoint whose answer is one pydantic model."""
        request = self._api(method, what, *parts, json=json, params=params, map_error=map_error)
        return Endpoint(request, lambda response: parse_model(kind, response, what))


class SyncClient(ClientBase):
    """Carries out `_exchange` plans with blocking I/O on one connection pool, safe to share between threads."""

    def __init__(self, config: HubSettings | None, transport: httpx.BaseTransport | None, backoff_s: float) -> None:
        super().__init__(config, backoff_s)
        self._http = httpx.Client(
            timeout=httpx.Timeout(self.config.timeout_s), follow_redirects=False, transport=transport, headers={"User-Agent": "pawfn"}
        )

    def close(self) -> None:
        """Close the connection pool."""
        self._http.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _send(self, request: Request) -> httpx.Response:
        """Carry out `_exchange` with blocking I/O."""
        plan = self._exchange(self._http, request)
        outcome: Outcome = None
        while True:
            try:
                action = plan.send(outcome)
            except StopIteration as done:
                response = done.value  # the plan's return value
                assert isinstance(response, httpx.Response)
                return response
            if isinstance(action, Sleep):
                time.sleep(action.seconds)
                outcome = None
                continue
            try:
                outcome = self._http.send(action.request, stream=action.stream)
            except httpx.TransportError as exc:
                outcome = exc

    def _call(self, endpoint: Endpoint[_T]) -> _T:
        return endpoint.parse(self._send(endpoint.request))
