"""Typed clients of the PAW REST API: `PawClient` (sync) and `AsyncPawClient` (async), over httpx.

Every request retries connection errors, 408, 429 (honouring Retry-After) and 5xx with exponential backoff
and jitter. Redirects are followed by hand so the `X-API-Key` header never reaches another origin.

As in httpx, the decisions live in one place: `_ClientBase` describes every endpoint once (`_Endpoint`:
method, path, parser, error mapping) and plans each exchange (`_exchange`: requests, redirects, retries and
waits, without I/O); `PawClient` and `AsyncPawClient` only carry out the plan, one with blocking calls, one
with awaits.
"""

from __future__ import annotations

import asyncio
import email.utils
import os
import random
import time
from collections.abc import Callable, Generator, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Generic, TypedDict, TypeVar
from urllib.parse import quote, urljoin, urlsplit

import httpx
from pydantic import BaseModel, ValidationError
from typing_extensions import Self

from ..bundle import MAX_ARCHIVE_BYTES
from ..config import PawConfig
from ..errors import (
    AuthenticationError,
    CallTimeoutError,
    CompileError,
    ConfigError,
    HubConnectionError,
    HubError,
    IntegrityError,
    NotFoundError,
    OfflineError,
    RateLimitError,
    RequestError,
    ServerError,
    describe_validation_error,
)
from ..hashing import file_sha256
from ..jsonio import parse_json_object
from ..options import RuntimeOptions
from ..progress import DownloadProgress
from ..protocol import (
    ErrorBody, RunBatchRequest, RunBatchResponse, RunRequest, RunResponse, ServedProgram, ServedPrograms, StreamPiece,
    TokenizeRequest, TokenizeResponse,
)
from .refs import is_program_id
from .types import CompileCancellation, CompileJob, CompilePrecheck, CompileRequest, CompileResult, CompileStatus
from .types import CompilerInfo, ProgramInfo, ProgramList, ProgramVersions, RuntimeManifest

__all__ = ["AsyncPawClient", "PawClient", "ServerClient", "StreamEvent"]

_RETRY_STATUSES = frozenset({408, 429, 500, 502, 503, 504})
_SERVER_RETRY_STATUSES = _RETRY_STATUSES - {500}
"""A pawfn server's 500 is a call that failed (e.g. non-finite logits): sending it again fails again."""
_CALL_RETRY_STATUSES = _SERVER_RETRY_STATUSES - {504}
"""A server call is sent again only on answers that say it did not run (a gateway's 504 may hide one that does)."""
_NOT_SENT = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout)
"""Transport errors before a request reached the server: sending it again cannot run it twice."""
_MAX_RETRY_AFTER_S = 120.0
_MAX_REDIRECTS = 5
_ModelT = TypeVar("_ModelT", bound=BaseModel)
_T = TypeVar("_T")


def _origin(url: str) -> tuple[str, str, int | None]:
    parts = urlsplit(url)
    port = parts.port or {"http": 80, "https": 443}.get(parts.scheme)
    return parts.scheme, (parts.hostname or "").lower(), port


def _retry_after(response: httpx.Response) -> float | None:
    """Seconds from a Retry-After header (a number or an HTTP date), if any."""
    value = response.headers.get("retry-after")
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        parsed = email.utils.parsedate_to_datetime(value) if value else None
        return None if parsed is None else max(0.0, parsed.timestamp() - time.time())


def _call_timeout(what: str, url: str, timeout_s: float | None, where: str) -> CallTimeoutError:
    """A call that got no answer in time, never sent again; `where` says what the server does with it now."""
    return CallTimeoutError(
        f"{what}: no answer from {url} within {timeout_s} s; it was not sent again ({where}): give the call a "
        "max_tokens, or a longer PawConfig.run_timeout_s (PAW_RUN_TIMEOUT_S)", url=url,
    )


def _backoff(attempt: int, base_s: float) -> float:
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


class _ErrorFacts(TypedDict):
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
    facts = _ErrorFacts(status=status, server_message=message, url=url, code=_server_code(body))
    if status == 404:
        return NotFoundError(f"{what} not found (HTTP 404){suffix}", **facts)
    if status in (401, 403):
        return AuthenticationError(
            f"{what}: not authorized (HTTP {status}){suffix}; set PAW_API_KEY or run `pawfn login`", **facts
        )
    if status == 429:
        return RateLimitError(
            f"{what}: rate limited (HTTP 429){suffix}; try again later", retry_after_s=_retry_after(response), **facts
        )
    if status >= 500:
        return ServerError(f"{what}: server error (HTTP {status}){suffix}", **facts)
    return HubError(f"{what}: HTTP {status}{suffix}", **facts)


def _parse(kind: type[_ModelT], response: httpx.Response, what: str) -> _ModelT:
    try:
        return kind.model_validate_json(response.content)
    except ValidationError as exc:
        raise HubError(
            f"{what}: unexpected response ({describe_validation_error(exc)})", status=response.status_code
        ) from exc


def _redirect(response: httpx.Response, current: str, method: str) -> tuple[str, str] | None:
    """The next (URL, method) of a redirect response, else None."""
    if not response.is_redirect:
        return None
    return urljoin(current, response.headers.get("location", "")), "GET" if response.status_code == 303 else method


def _retry_delay(
    response: httpx.Response, attempt: int, max_retries: int, backoff_s: float,
    statuses: frozenset[int] = _RETRY_STATUSES,
) -> float | None:
    """Seconds to wait before retrying `response`, or None when it is final (success, 4xx, retries spent)."""
    if response.status_code not in statuses or attempt >= max_retries:
        return None
    delay = _retry_after(response)
    if delay is not None and delay > _MAX_RETRY_AFTER_S:
        return None  # the server asks for longer than a library should block: report it
    return _backoff(attempt, backoff_s) if delay is None else delay


def _compile_result(response: httpx.Response) -> CompileResult:
    result = _parse(CompileResult, response, "compile")
    if result.error or result.status == "failed" or not result.program_id:
        raise CompileError(
            f"compile failed: {result.error or result.status}", status=response.status_code, server_message=result.error
        )
    return result


def _as_reported(error: HubError) -> HubError:
    """An error as the server's status named it."""
    return error


def _as_compile_error(error: HubError) -> HubError:
    """A refused spec (HTTP 400/422) is a `CompileError`; other failures keep their type."""
    if error.status in (400, 422):
        return CompileError(str(error), status=error.status, server_message=error.server_message, url=error.url)
    return error


def _program_id(value: str, what: str) -> str:
    if not is_program_id(value):
        raise HubError(f"{what}: the server returned an invalid program id {value!r}")
    return value


def _runtime_named(manifest: RuntimeManifest, runtime_id: str) -> RuntimeManifest:
    if manifest.runtime_id != runtime_id:
        raise HubError(f"runtime {runtime_id}: the server returned runtime {manifest.runtime_id!r}")
    return manifest


class _Resolved(BaseModel):
    program_id: str


class _Compilers(BaseModel):
    compilers: list[CompilerInfo]


@dataclass(frozen=True)
class _Request:
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
    map_error: Callable[[HubError], HubError] = _as_reported
    """How this call names the server's errors (e.g. a refused spec is a `CompileError`)."""
    retry_statuses: frozenset[int] = _RETRY_STATUSES
    """Answers worth sending the request again for (with connection errors)."""
    once: bool = False
    """A call that must not run twice (a server's run): sent again only where it never reached the server (no
    connection); a timeout or a connection lost afterwards is the caller's error (`CallTimeoutError` for timeouts)."""


@dataclass(frozen=True)
class _Endpoint(Generic[_T]):
    """An API call described once: its request and how its answer is read."""

    request: _Request
    parse: Callable[[httpx.Response], _T]


@dataclass(frozen=True)
class _Send:
    request: httpx.Request
    stream: bool


@dataclass(frozen=True)
class _Sleep:
    seconds: float


_Outcome = httpx.Response | httpx.TransportError | None
_Plan = Generator[_Send | _Sleep, _Outcome, httpx.Response]


class _ClientBase:
    """Every pure decision of the two clients: endpoints, request building, redirects, retries, errors."""

    def __init__(self, config: PawConfig | None, backoff_s: float) -> None:
        self.config = config or PawConfig.from_env()
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
        self, method: str, what: str, *parts: str, json: object = None, params: Mapping[str, str] | None = None,
        timeout: float | None = None, map_error: Callable[[HubError], HubError] = _as_reported,
    ) -> _Request:
        return _Request(method, self.api_url(*parts), what, json=json, params=params, timeout=timeout, map_error=map_error)

    def _build(self, http: httpx.Client | httpx.AsyncClient, request: _Request, method: str, url: str) -> httpx.Request:
        """One hop; the API key goes only to the API's own origin, never to a redirect target elsewhere."""
        headers = dict(request.headers or {})
        if self._key and _origin(url) == _origin(self._root):
            headers["X-API-Key"] = self._key
        return http.build_request(
            method, url, json=request.json if method == request.method else None, params=request.params,
            headers=headers, timeout=httpx.Timeout(request.timeout) if request.timeout else None,
        )

    def _exchange(self, http: httpx.Client | httpx.AsyncClient, request: _Request) -> _Plan:
        """The plan of one logical request: yields what to send or how long to sleep, returns the 2xx answer
        (202 included) or raises the typed error."""
        if self.config.offline:
            raise OfflineError(f"{request.what}: offline mode is on (PAW_OFFLINE / --offline), so no request is made")
        attempt = 0
        while True:
            url, method, redirects = request.url, request.method, 0
            while True:
                outcome = yield _Send(self._build(http, request, method, url), request.stream)
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
                        raise _call_timeout(request.what, url, request.timeout, "the server may still be running it") from outcome
                    raise ServerError(
                        f"{request.what}: the connection to {url} failed after the call was sent ({outcome}); it was "
                        "not sent again (the server may have run it)", url=url,
                    ) from outcome
                if attempt >= self.config.max_retries:
                    raise HubConnectionError(f"{request.what}: cannot reach {url} ({outcome})", url=url) from outcome
                delay = _backoff(attempt, self._backoff_s)
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
            yield _Sleep(delay)
            attempt += 1

    # -- endpoints, described once for both clients ------------------------------------------------------

    def _compile(self, request: CompileRequest) -> _Endpoint[CompileResult]:
        body = request.model_dump(exclude_none=True)
        return _Endpoint(
            self._api(
                "POST", "compile", "compile", json=body, timeout=self.config.compile_timeout_s, map_error=_as_compile_error
            ),
            _compile_result,
        )

    def _precheck(self, spec: str, compiler: str | None) -> _Endpoint[CompilePrecheck]:
        body = {"spec": spec} | ({"compiler": compiler} if compiler else {})
        return self._model(CompilePrecheck, "POST", "precheck", "compile", "precheck", json=body)

    def _compile_async(self, request: CompileRequest) -> _Endpoint[CompileJob]:
        body = request.model_dump(exclude_none=True)
        return self._model(CompileJob, "POST", "compile", "compile", "async", json=body, map_error=_as_compile_error)

    def _model(
        self, kind: type[_ModelT], method: str, what: str, *parts: str, json: object = None,
        params: Mapping[str, str] | None = None, map_error: Callable[[HubError], HubError] = _as_reported,
    ) -> _Endpoint[_ModelT]:
        """An endpoint whose answer is one pydantic model."""
        request = self._api(method, what, *parts, json=json, params=params, map_error=map_error)
        return _Endpoint(request, lambda response: _parse(kind, response, what))

    def _compile_status(self, job_id: str) -> _Endpoint[CompileStatus]:
        return self._model(CompileStatus, "GET", f"compile job {job_id}", "compile", job_id)

    def _cancel_compile(self, job_id: str) -> _Endpoint[CompileCancellation]:
        return self._model(CompileCancellation, "DELETE", f"compile job {job_id}", "compile", job_id)

    def _resolve(self, reference: str) -> _Endpoint[str]:
        what = f"program {reference}"
        return _Endpoint(
            self._api("GET", what, "programs", "resolve", reference),
            lambda response: _program_id(_parse(_Resolved, response, what).program_id, what),
        )

    def _program_info(self, reference: str) -> _Endpoint[ProgramInfo]:
        return self._model(ProgramInfo, "GET", f"program {reference}", "programs", reference)

    def _versions(self, slug: str) -> _Endpoint[ProgramVersions]:
        return self._model(ProgramVersions, "GET", f"versions of {slug}", "programs", slug, "versions")

    def _my_programs(self, sort: str, per_page: int, page: int) -> _Endpoint[ProgramList]:
        params = {"mine": "true", "sort": sort, "per_page": str(per_page), "page": str(page)}
        return self._model(ProgramList, "GET", "my programs", "programs", params=params)

    def _compilers(self) -> _Endpoint[list[CompilerInfo]]:
        return _Endpoint(
            self._api("GET", "compilers", "models", "compilers"),
            lambda response: _parse(_Compilers, response, "compilers").compilers,
        )

    def _runtime_manifest(self, runtime_id: str) -> _Endpoint[RuntimeManifest]:
        what = f"runtime {runtime_id}"
        return _Endpoint(
            self._api("GET", what, "models", "runtimes", runtime_id),
            lambda response: _runtime_named(_parse(RuntimeManifest, response, what), runtime_id),
        )


class _SyncClient(_ClientBase):
    """Carries out `_exchange` plans with blocking I/O on one connection pool, safe to share between threads."""

    def __init__(self, config: PawConfig | None, transport: httpx.BaseTransport | None, backoff_s: float) -> None:
        super().__init__(config, backoff_s)
        self._http = httpx.Client(
            timeout=httpx.Timeout(self.config.timeout_s), follow_redirects=False, transport=transport,
            headers={"User-Agent": "pawfn"},
        )

    def close(self) -> None:
        """Close the connection pool."""
        self._http.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _send(self, request: _Request) -> httpx.Response:
        """Carry out `_exchange` with blocking I/O."""
        plan = self._exchange(self._http, request)
        outcome: _Outcome = None
        while True:
            try:
                action = plan.send(outcome)
            except StopIteration as done:
                response = done.value  # the plan's return value
                assert isinstance(response, httpx.Response)
                return response
            if isinstance(action, _Sleep):
                time.sleep(action.seconds)
                outcome = None
                continue
            try:
                outcome = self._http.send(action.request, stream=action.stream)
            except httpx.TransportError as exc:
                outcome = exc

    def _call(self, endpoint: _Endpoint[_T]) -> _T:
        return endpoint.parse(self._send(endpoint.request))


class PawClient(_SyncClient):
    """Synchronous PAW API client; one connection pool, safe to share between threads."""

    def __init__(
        self, config: PawConfig | None = None, *, transport: httpx.BaseTransport | None = None, backoff_s: float = 0.5
    ) -> None:
        super().__init__(config, transport, backoff_s)

    def compile(self, request: CompileRequest) -> CompileResult:
        """Compile a spec and wait for the program (`POST /api/v1/compile`); failure is a `CompileError`."""
        return self._call(self._compile(request))

    def precheck(self, spec: str, compiler: str | None = None) -> CompilePrecheck:
        """Is the spec already compiled, and how long is the queue (`POST /api/v1/compile/precheck`)."""
        return self._call(self._precheck(spec, compiler))

    def compile_async(self, request: CompileRequest) -> CompileJob:
        """Queue a compile (`POST /api/v1/compile/async`); poll it with `compile_status`."""
        return self._call(self._compile_async(request))

    def compile_status(self, job_id: str) -> CompileStatus:
        """State of a queued compile."""
        return self._call(self._compile_status(job_id))

    def cancel_compile(self, job_id: str) -> CompileCancellation:
        """Cancel a queued compile (HTTP 409 once it started)."""
        return self._call(self._cancel_compile(job_id))

    def resolve(self, reference: str) -> str:
        """The program id a slug (`user/slug`, `slug`, `user/slug@vN`) points at."""
        return self._call(self._resolve(reference))

    def program_info(self, reference: str) -> ProgramInfo:
        """Public facts about a program (`GET /api/v1/programs/{id_or_slug}`)."""
        return self._call(self._program_info(reference))

    def versions(self, slug: str) -> ProgramVersions:
        """Versions of a slug."""
        return self._call(self._versions(slug))

    def my_programs(self, *, sort: str = "recent", per_page: int = 20, page: int = 1) -> ProgramList:
        """The caller's programs (needs an API key)."""
        return self._call(self._my_programs(sort, per_page, page))

    def compilers(self) -> list[CompilerInfo]:
        """The compilers the server offers."""
        return self._call(self._compilers())

    def runtime_manifest(self, runtime_id: str) -> RuntimeManifest:
        """A runtime manifest; its id must be the one asked for."""
        return self._call(self._runtime_manifest(runtime_id))

    def download_program(self, program_id: str, destination: Path, progress: DownloadProgress | None = None) -> Path:
        """Stream a program's `.paw` archive to `destination`, waiting (bounded) while the server builds it.

        A connection lost mid-archive restarts the download (archives are small); nothing is left behind.
        """
        if not is_program_id(program_id):
            raise HubError(f"invalid program id {program_id!r}")
        attempt = 0
        while True:
            try:
                return self._download_program_once(program_id, destination, progress)
            except httpx.TransportError as exc:
                if attempt >= self.config.max_retries:
                    raise HubConnectionError(
                        f"program {program_id}: connection lost during the download ({exc})", url=self.config.api_url
                    ) from exc
                time.sleep(_backoff(attempt, self._backoff_s))
                attempt += 1

    def _download_program_once(self, program_id: str, destination: Path, progress: DownloadProgress | None) -> Path:
        what = f"program {program_id}"
        waited = 0.0
        while True:
            response = self._send(
                _Request(
                    "GET", self.api_url("programs", program_id, "download"), what, stream=True,
                    timeout=self.config.download_timeout_s,
                )
            )
            if response.status_code != 202:
                break
            response.close()
            delay = _retry_after(response)
            delay = 3.0 if delay is None else max(delay, 0.25)  # a 0 would poll the server in a busy loop
            if waited + delay > self.config.max_wait_s:
                raise ServerError(
                    f"{what} is still being generated after {waited:.0f} s; try again shortly", status=202
                )
            time.sleep(delay)
            waited += delay
        created = False
        try:
            declared = response.headers.get("content-length")
            total = int(declared) if declared and declared.isdigit() else None
            if total is not None and total > MAX_ARCHIVE_BYTES:
                raise HubError(f"{what}: archive is too large ({total} bytes; limit {MAX_ARCHIVE_BYTES})")
            written = 0
            handle = destination.open("xb")
            created = True
            with handle:
                for chunk in response.iter_bytes():
                    written += len(chunk)
                    if written > MAX_ARCHIVE_BYTES:
                        raise HubError(f"{what}: archive is larger than {MAX_ARCHIVE_BYTES} bytes")
                    handle.write(chunk)
                    if progress:
                        progress(written, total)
                handle.flush()
                os.fsync(handle.fileno())
        except BaseException:
            if created:
                destination.unlink(missing_ok=True)
            raise
        finally:
            response.close()
        return destination

    def download_file(
        self,
        url: str,
        destination: Path,
        *,
        size_bytes: int | None,
        sha256: str | None,
        progress: DownloadProgress | None = None,
    ) -> Path:
        """Download `url` to `destination`, resuming a partial download, then verify size and sha256."""
        what = f"download of {destination.name}"
        partial = destination.with_name(f".{destination.name}.pawfn-partial")
        attempt = 0
        while True:
            offset = partial.stat().st_size if partial.exists() else 0
            if size_bytes is not None and offset > size_bytes:
                partial.unlink()
                offset = 0
            if size_bytes is not None and offset == size_bytes:
                break
            headers = {"Range": f"bytes={offset}-"} if offset else {}
            try:
                response = self._send(
                    _Request("GET", url, what, headers=headers, stream=True, timeout=self.config.download_timeout_s)
                )
            except HubError as exc:
                if exc.status == 416 and offset:  # the partial file is already whole, or bogus: check it
                    break
                raise
            try:
                resumed = response.status_code == 206
                total = size_bytes or (
                    int(response.headers["content-length"]) + (offset if resumed else 0)
                    if response.headers.get("content-length", "").isdigit() else None
                )
                done = offset if resumed else 0
                try:
                    with partial.open("ab" if resumed else "wb") as handle:
                        for chunk in response.iter_bytes():
                            handle.write(chunk)
                            done += len(chunk)
                            if progress:
                                progress(done, total)
                except httpx.TransportError as exc:
                    if attempt < self.config.max_retries:  # keep what arrived and resume from there
                        attempt += 1
                        time.sleep(_backoff(attempt, self._backoff_s))
                        continue
                    raise HubConnectionError(f"{what}: connection lost ({exc}); run again to resume", url=url) from exc
            finally:
                response.close()
            break
        _verify(partial, destination.name, size_bytes, sha256)
        os.replace(partial, destination)
        return destination


def _verify(path: Path, name: str, size_bytes: int | None, sha256: str | None) -> None:
    size = path.stat().st_size
    if size_bytes is not None and size != size_bytes:
        path.unlink()
        raise IntegrityError(f"{name}: downloaded {size} bytes, expected {size_bytes}; the file was discarded")
    if sha256 is not None:
        digest = file_sha256(path)
        if digest != sha256.lower():
            path.unlink()
            raise IntegrityError(f"{name}: sha256 {digest} does not match the expected {sha256}; the file was discarded")


class AsyncPawClient(_ClientBase):
    """Asynchronous twin of `PawClient`: API calls on httpx's async client; file downloads (disk I/O and
    hashing) in a worker thread on a `PawClient`."""

    def __init__(
        self, config: PawConfig | None = None, *, transport: httpx.AsyncBaseTransport | None = None, backoff_s: float = 0.5
    ) -> None:
        super().__init__(config, backoff_s)
        self._downloads = PawClient(self.config, backoff_s=backoff_s)
        self._http = httpx.AsyncClient(
            timeout=httpx.Timeout(self.config.timeout_s), follow_redirects=False, transport=transport,
            headers={"User-Agent": "pawfn"},
        )

    async def aclose(self) -> None:
        """Close both connection pools."""
        await self._http.aclose()
        self._downloads.close()

    async def __aenter__(self) -> AsyncPawClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def _send(self, request: _Request) -> httpx.Response:
        """Carry out `_exchange` with awaits."""
        plan = self._exchange(self._http, request)
        outcome: _Outcome = None
        while True:
            try:
                action = plan.send(outcome)
            except StopIteration as done:
                response = done.value  # the plan's return value
                assert isinstance(response, httpx.Response)
                return response
            if isinstance(action, _Sleep):
                await asyncio.sleep(action.seconds)
                outcome = None
                continue
            try:
                outcome = await self._http.send(action.request, stream=action.stream)
            except httpx.TransportError as exc:
                outcome = exc

    async def _call(self, endpoint: _Endpoint[_T]) -> _T:
        return endpoint.parse(await self._send(endpoint.request))

    async def compile(self, request: CompileRequest) -> CompileResult:
        """Async `PawClient.compile`."""
        return await self._call(self._compile(request))

    async def precheck(self, spec: str, compiler: str | None = None) -> CompilePrecheck:
        """Async `PawClient.precheck`."""
        return await self._call(self._precheck(spec, compiler))

    async def compile_async(self, request: CompileRequest) -> CompileJob:
        """Async `PawClient.compile_async`."""
        return await self._call(self._compile_async(request))

    async def compile_status(self, job_id: str) -> CompileStatus:
        """Async `PawClient.compile_status`."""
        return await self._call(self._compile_status(job_id))

    async def cancel_compile(self, job_id: str) -> CompileCancellation:
        """Async `PawClient.cancel_compile`."""
        return await self._call(self._cancel_compile(job_id))

    async def resolve(self, reference: str) -> str:
        """Async `PawClient.resolve`."""
        return await self._call(self._resolve(reference))

    async def program_info(self, reference: str) -> ProgramInfo:
        """Async `PawClient.program_info`."""
        return await self._call(self._program_info(reference))

    async def versions(self, slug: str) -> ProgramVersions:
        """Async `PawClient.versions`."""
        return await self._call(self._versions(slug))

    async def my_programs(self, *, sort: str = "recent", per_page: int = 20, page: int = 1) -> ProgramList:
        """Async `PawClient.my_programs`."""
        return await self._call(self._my_programs(sort, per_page, page))

    async def compilers(self) -> list[CompilerInfo]:
        """Async `PawClient.compilers`."""
        return await self._call(self._compilers())

    async def runtime_manifest(self, runtime_id: str) -> RuntimeManifest:
        """Async `PawClient.runtime_manifest`."""
        return await self._call(self._runtime_manifest(runtime_id))

    async def download_program(self, program_id: str, destination: Path, progress: DownloadProgress | None = None) -> Path:
        """Async `PawClient.download_program` (streams to disk in a worker thread)."""
        return await asyncio.to_thread(self._downloads.download_program, program_id, destination, progress)


def _as_server_error(error: HubError) -> HubError:
    """A pawfn server's refusals: a bad request is a `RequestError`, a refused key names the server's setting."""
    facts = _ErrorFacts(
        status=error.status or 0, server_message=error.server_message, url=error.url or "", code=error.code
    )
    if isinstance(error, AuthenticationError):
        return AuthenticationError(
            f"the server refused the request (HTTP {error.status}): {error.server_message or 'no key'}; set "
            "PawConfig.server_api_key (PAW_SERVER_API_KEY) to the key it was started with", **facts,
        )
    if error.status in (400, 413, 422):
        return RequestError(f"the server refused the request (HTTP {error.status}): {error.server_message}", **facts)
    return error


class ServerClient(_SyncClient):
    """Client of a `pawfn serve` or Ray Serve server (`PawConfig.server_url`): what the `Remote` backend calls.
    Same retries as `PawClient`; the server's key goes to its origin only."""

    def __init__(
        self, config: PawConfig | None = None, *, transport: httpx.BaseTransport | None = None, backoff_s: float = 0.5
    ) -> None:
        super().__init__(config, transport, backoff_s)
        if self.config.server_url is None:
            self.close()
            raise ConfigError(
                "no server to run on: set PawConfig.server_url (or PAW_SERVER_URL) to the URL of a `pawfn serve` server"
            )
        self._root = self.config.server_url
        self._key = self.config.server_key_value()

    @property
    def url(self) -> str:
        """The server's root URL."""
        return self._root

    def _v1_request(
        self, method: str, what: str, *parts: str, json: object = None, stream: bool = False, call_s: float | None = None
    ) -> _Request:
        """A request to `/v1/...`: the server's errors and retries. A call (`call_s`: its timeout) is sent once."""
        once = call_s is not None
        return _Request(method, self._url("v1", *parts), what, json=json, timeout=call_s, stream=stream,
                        map_error=_as_server_error, retry_statuses=_CALL_RETRY_STATUSES if once else _SERVER_RETRY_STATUSES,
                        once=once)

    def call_timeout(self, options: RuntimeOptions, n_ctx: int, inputs: int = 1) -> float:
        """Seconds to wait for a call's answer: `PawConfig.run_timeout_s`, else 60 s plus 1 s per token of its budget
        (`max_tokens`, else the context) per input."""
        if self.config.run_timeout_s is not None:
            return self.config.run_timeout_s
        return 60.0 + float(options.max_tokens if options.max_tokens is not None else n_ctx) * inputs

    def _v1(
        self, kind: type[_ModelT], method: str, what: str, *parts: str, json: object = None, call_s: float | None = None
    ) -> _Endpoint[_ModelT]:
        """A `/v1/...` endpoint answered by one model."""
        request = self._v1_request(method, what, *parts, json=json, call_s=call_s)
        return _Endpoint(request, lambda response: _parse(kind, response, what))

    def program(self, reference: str) -> ServedProgram:
        """What the server knows of a program (it loads it first where it may): `GET /v1/programs/{ref}`."""
        return self._call(self._v1(ServedProgram, "GET", f"program {reference}", "programs", reference))

    def programs(self) -> list[ServedProgram]:
        """Every program the server holds now."""
        return self._call(self._v1(ServedPrograms, "GET", "programs", "programs")).programs

    def run(self, reference: str, text: str, options: RuntimeOptions, timeout_s: float) -> RunResponse:
        """One call (`POST /v1/programs/{ref}/run`), sent once, its answer awaited `timeout_s` (`call_timeout`)."""
        body = RunRequest(input=text, options=options).model_dump(mode="json")
        endpoint = self._v1(RunResponse, "POST", f"a run of {reference}", "programs", reference, "run", json=body,
                            call_s=timeout_s)
        return self._call(endpoint)

    def run_batch(self, reference: str, texts: Sequence[str], options: RuntimeOptions, timeout_s: float) -> RunBatchResponse:
        """Calls decoded together on the server, results in input order (`POST /v1/programs/{ref}/run_batch`), sent
        once, the answer awaited `timeout_s`."""
        body = RunBatchRequest(inputs=list(texts), options=options).model_dump(mode="json")
        endpoint = self._v1(RunBatchResponse, "POST", f"a batch of {reference}", "programs", reference, "run_batch",
                            json=body, call_s=timeout_s)
        return self._call(endpoint)

    def tokenize(self, reference: str, text: str, options: RuntimeOptions) -> list[int]:
        """Token ids of input + suffix, as the server's program evaluates them."""
        body = TokenizeRequest(input=text, options=options).model_dump(mode="json")
        what = f"tokens of an input to {reference}"
        return self._call(self._v1(TokenizeResponse, "POST", what, "programs", reference, "tokenize", json=body)).token_ids

    @contextmanager
    def stream(
        self, reference: str, text: str, options: RuntimeOptions, timeout_s: float
    ) -> Generator[Iterator[StreamEvent], None, None]:
        """One call's server-sent events (`POST /v1/programs/{ref}/stream`): `StreamPiece`s, then the
        `RunResponse`; an `error` event raises the server's error. Refusals before the first event are typed errors.
        Sent once; past `timeout_s` in all, or as long without an event, a `CallTimeoutError` (leaving the block
        closes the connection, so the server stops the call)."""
        body = RunRequest(input=text, options=options).model_dump(mode="json")
        request = self._v1_request("POST", f"a stream of {reference}", "programs", reference, "stream", json=body,
                                   stream=True, call_s=timeout_s)
        deadline = time.monotonic() + timeout_s
        response = self._send(request)

        def lines() -> Iterator[str]:
            try:
                for line in response.iter_lines():
                    if time.monotonic() > deadline:
                        raise httpx.ReadTimeout("the call's time ran out")
                    yield line
            except httpx.TimeoutException as exc:
                raise _call_timeout(request.what, request.url, timeout_s, "the server stops it as the connection closes") from exc
            except httpx.TransportError as exc:
                raise ServerError(f"{request.what}: the connection to {request.url} failed mid-stream ({exc})",
                                  url=request.url) from exc

        try:
            yield _stream_events(lines(), request.url)
        finally:
            response.close()


StreamEvent = StreamPiece | RunResponse
"""What a server's stream sends: text as generated, then the call's answer."""


def _stream_events(lines: Iterator[str], url: str) -> Iterator[StreamEvent]:
    event, data = "message", ""
    for line in lines:
        if line.startswith("event:"):
            event = line.removeprefix("event:").strip()
        elif line.startswith("data:"):
            data += line.removeprefix("data:").strip()
        elif not line and data:
            if event == "token":
                yield StreamPiece.model_validate_json(data)
            elif event == "done":
                yield RunResponse.model_validate_json(data)
                return
            elif event == "error":
                failure = ErrorBody.model_validate_json(data)
                raise ServerError(f"the server's call failed: {failure.message}", code=failure.error, url=url,
                                  server_message=failure.message)
            event, data = "message", ""
    raise ServerError("the server's stream ended before the call's answer", url=url)
