"""Typed clients of the PAW REST API: `PawClient` (sync) and `AsyncPawClient` (async), over httpx.

Every request retries connection errors, 408, 429 (honouring Retry-After) and 5xx with exponential backoff
and jitter. Redirects are followed by hand so the `X-API-Key` header never reaches another origin.
"""

from __future__ import annotations

import asyncio
import email.utils
import hashlib
import os
import random
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TypeVar
from urllib.parse import quote, urljoin, urlsplit

import httpx
from pydantic import BaseModel, ValidationError

from ..bundle import MAX_ARCHIVE_BYTES
from ..config import PawConfig
from ..errors import (
    AuthenticationError,
    CompileError,
    HubConnectionError,
    HubError,
    IntegrityError,
    NotFoundError,
    OfflineError,
    RateLimitError,
    ServerError,
    describe_validation_error,
)
from ..jsonio import parse_json_object
from .refs import is_program_id
from .types import (
    CompileCancellation,
    CompileJob,
    CompilePrecheck,
    CompileRequest,
    CompileResult,
    CompileStatus,
    CompilerInfo,
    ProgramInfo,
    ProgramList,
    ProgramVersions,
    RuntimeManifest,
)

__all__ = ["AsyncPawClient", "DownloadProgress", "PawClient"]

DownloadProgress = Callable[[int, int | None], None]
"""Called with (bytes so far, total bytes or None) while a file downloads."""

_RETRY_STATUSES = frozenset({408, 429, 500, 502, 503, 504})
_MAX_RETRY_AFTER_S = 120.0
_MAX_REDIRECTS = 5
_CHUNK = 1024 * 1024
_ModelT = TypeVar("_ModelT", bound=BaseModel)


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


def _backoff(attempt: int, base_s: float) -> float:
    """Exponential backoff with jitter: base * 2^attempt, capped at 8 s, times a factor in [0.75, 1]."""
    return min(base_s * 2.0**attempt, 8.0) * (1.0 - 0.25 * random.random())


def _server_message(response: httpx.Response) -> str | None:
    try:
        body = parse_json_object(response.content)
    except httpx.ResponseNotRead:
        return None
    for key in ("message", "detail", "error"):
        value = (body or {}).get(key)
        if isinstance(value, str):
            return value
    return None


def _error_for(response: httpx.Response, what: str) -> HubError:
    status = response.status_code
    message = _server_message(response)
    suffix = f": {message}" if message else ""
    url = str(response.request.url)
    if status == 404:
        return NotFoundError(f"{what} not found (HTTP 404){suffix}", status=status, server_message=message, url=url)
    if status in (401, 403):
        return AuthenticationError(
            f"{what}: not authorized (HTTP {status}){suffix}; set PAW_API_KEY or run `pawfn login`",
            status=status, server_message=message, url=url,
        )
    if status == 429:
        return RateLimitError(
            f"{what}: rate limited (HTTP 429){suffix}; try again later",
            retry_after_s=_retry_after(response), status=status, server_message=message, url=url,
        )
    if status >= 500:
        return ServerError(f"{what}: server error (HTTP {status}){suffix}", status=status, server_message=message, url=url)
    return HubError(f"{what}: HTTP {status}{suffix}", status=status, server_message=message, url=url)


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


def _retry_delay(response: httpx.Response, attempt: int, max_retries: int, backoff_s: float) -> float | None:
    """Seconds to wait before retrying `response`, or None when it is final (success, 4xx, retries spent)."""
    if response.status_code not in _RETRY_STATUSES or attempt >= max_retries:
        return None
    delay = _retry_after(response)
    if delay is not None and delay > _MAX_RETRY_AFTER_S:
        return None  # the server asks for longer than a library should block: report it
    return _backoff(attempt, backoff_s) if delay is None else delay


def _refuse_offline(config: PawConfig, what: str) -> None:
    if config.offline:
        raise OfflineError(f"{what}: offline mode is on (PAW_OFFLINE / --offline), so no request is made")


def _build_request(
    http: httpx.Client | httpx.AsyncClient,
    config: PawConfig,
    method: str,
    url: str,
    *,
    json: object,
    params: Mapping[str, str] | None,
    headers: Mapping[str, str] | None,
    timeout: float | None,
) -> httpx.Request:
    """One hop of a request; the API key goes only to the API's own origin, never to a redirect target elsewhere."""
    all_headers = dict(headers or {})
    key = config.key_value()
    if key and _origin(url) == _origin(config.api_url):
        all_headers["X-API-Key"] = key
    return http.build_request(
        method, url, json=json, params=params, headers=all_headers, timeout=httpx.Timeout(timeout) if timeout else None
    )


def _compile_result(response: httpx.Response) -> CompileResult:
    result = _parse(CompileResult, response, "compile")
    if result.error or result.status == "failed" or not result.program_id:
        raise CompileError(
            f"compile failed: {result.error or result.status}", status=response.status_code, server_message=result.error
        )
    return result


def _compile_error(error: HubError, what: str) -> HubError:
    if error.status in (400, 422):
        return CompileError(str(error), status=error.status, server_message=error.server_message, url=error.url)
    return error


def default_progress(label: str, enabled: bool | None) -> DownloadProgress | None:
    """A one-line stderr progress display (on a terminal, unless `enabled` says otherwise)."""
    if enabled is False or (enabled is None and not sys.stderr.isatty()):
        return None
    last = [0.0]

    def show(done: int, total: int | None) -> None:
        now = time.monotonic()
        finished = total is not None and done >= total
        if now - last[0] < 0.2 and not finished:
            return
        last[0] = now
        if total:
            text = f"\r{label}: {done / 1e6:.1f}/{total / 1e6:.1f} MB ({100 * done / total:.0f}%)"
        else:
            text = f"\r{label}: {done / 1e6:.1f} MB"
        sys.stderr.write(text + ("\n" if finished else ""))
        sys.stderr.flush()

    return show


class PawClient:
    """Synchronous PAW API client; one connection pool, safe to share between threads."""

    def __init__(
        self, config: PawConfig | None = None, *, transport: httpx.BaseTransport | None = None, backoff_s: float = 0.5
    ) -> None:
        self.config = config or PawConfig.from_env()
        self._backoff_s = backoff_s
        self._http = httpx.Client(
            timeout=httpx.Timeout(self.config.timeout_s), follow_redirects=False, transport=transport,
            headers={"User-Agent": "pawfn"},
        )

    def close(self) -> None:
        """Close the connection pool."""
        self._http.close()

    def __enter__(self) -> PawClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- transport -------------------------------------------------------------------------------------

    def api_url(self, *parts: str) -> str:
        """`{api_url}/api/v1/` plus the URL-encoded path parts."""
        return f"{self.config.api_url}/api/v1/" + "/".join(quote(part, safe="") for part in parts)

    def _send(
        self,
        method: str,
        url: str,
        what: str,
        *,
        json: object = None,
        params: Mapping[str, str] | None = None,
        headers: Mapping[str, str] | None = None,
        timeout: float | None = None,
        stream: bool = False,
    ) -> httpx.Response:
        """One logical request: retries, manual redirects, typed errors. 2xx (202 included) is returned."""
        _refuse_offline(self.config, what)
        attempt = 0
        while True:
            current, current_method, redirects = url, method, 0
            try:
                while True:
                    request = _build_request(
                        self._http, self.config, current_method, current, json=json if current_method == method else None,
                        params=params, headers=headers, timeout=timeout,
                    )
                    response = self._http.send(request, stream=stream)
                    hop = _redirect(response, current, current_method)
                    if hop is None or redirects >= _MAX_REDIRECTS:
                        break
                    response.close()
                    current, current_method = hop
                    redirects += 1
            except httpx.TransportError as exc:
                if attempt < self.config.max_retries:
                    time.sleep(_backoff(attempt, self._backoff_s))
                    attempt += 1
                    continue
                raise HubConnectionError(f"{what}: cannot reach {current} ({exc})", url=current) from exc
            delay = _retry_delay(response, attempt, self.config.max_retries, self._backoff_s)
            if delay is not None:
                response.close()
                time.sleep(delay)
                attempt += 1
                continue
            if response.is_success:
                return response
            if stream:
                response.read()
            response.close()
            raise _error_for(response, what)

    def _get(self, kind: type[_ModelT], what: str, *parts: str, params: Mapping[str, str] | None = None) -> _ModelT:
        return _parse(kind, self._send("GET", self.api_url(*parts), what, params=params), what)

    # -- API -------------------------------------------------------------------------------------------

    def compile(self, request: CompileRequest) -> CompileResult:
        """Compile a spec and wait for the program (`POST /api/v1/compile`); failure is a `CompileError`."""
        what = "compile"
        try:
            response = self._send(
                "POST", self.api_url("compile"), what, json=request.model_dump(exclude_none=True),
                timeout=self.config.compile_timeout_s,
            )
        except HubError as exc:
            raise _compile_error(exc, what) from exc
        return _compile_result(response)

    def precheck(self, spec: str, compiler: str | None = None) -> CompilePrecheck:
        """Is the spec already compiled, and how long is the queue (`POST /api/v1/compile/precheck`)."""
        body = {"spec": spec} | ({"compiler": compiler} if compiler else {})
        return _parse(CompilePrecheck, self._send("POST", self.api_url("compile", "precheck"), "precheck", json=body), "precheck")

    def compile_async(self, request: CompileRequest) -> CompileJob:
        """Queue a compile (`POST /api/v1/compile/async`); poll it with `compile_status`."""
        try:
            response = self._send("POST", self.api_url("compile", "async"), "compile", json=request.model_dump(exclude_none=True))
        except HubError as exc:
            raise _compile_error(exc, "compile") from exc
        return _parse(CompileJob, response, "compile")

    def compile_status(self, job_id: str) -> CompileStatus:
        """State of a queued compile."""
        return self._get(CompileStatus, f"compile job {job_id}", "compile", job_id)

    def cancel_compile(self, job_id: str) -> CompileCancellation:
        """Cancel a queued compile (HTTP 409 once it started)."""
        what = f"compile job {job_id}"
        return _parse(CompileCancellation, self._send("DELETE", self.api_url("compile", job_id), what), what)

    def resolve(self, reference: str) -> str:
        """The program id a slug (`user/slug`, `slug`, `user/slug@vN`) points at."""
        what = f"program {reference}"
        response = self._send("GET", self.api_url("programs", "resolve", reference), what)
        program_id = _parse(_Resolved, response, what).program_id
        if not is_program_id(program_id):
            raise HubError(f"{what}: the server returned an invalid program id {program_id!r}")
        return program_id

    def program_info(self, reference: str) -> ProgramInfo:
        """Public facts about a program (`GET /api/v1/programs/{id_or_slug}`)."""
        return self._get(ProgramInfo, f"program {reference}", "programs", reference)

    def versions(self, slug: str) -> ProgramVersions:
        """Versions of a slug."""
        return self._get(ProgramVersions, f"versions of {slug}", "programs", slug, "versions")

    def my_programs(self, *, sort: str = "recent", per_page: int = 20, page: int = 1) -> ProgramList:
        """The caller's programs (needs an API key)."""
        params = {"mine": "true", "sort": sort, "per_page": str(per_page), "page": str(page)}
        return self._get(ProgramList, "my programs", "programs", params=params)

    def compilers(self) -> list[CompilerInfo]:
        """The compilers the server offers."""
        response = self._send("GET", self.api_url("models", "compilers"), "compilers")
        return _parse(_Compilers, response, "compilers").compilers

    def runtime_manifest(self, runtime_id: str) -> RuntimeManifest:
        """A runtime manifest; its id must be the one asked for."""
        manifest = self._get(RuntimeManifest, f"runtime {runtime_id}", "models", "runtimes", runtime_id)
        if manifest.runtime_id != runtime_id:
            raise HubError(f"runtime {runtime_id}: the server returned runtime {manifest.runtime_id!r}")
        return manifest

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
                "GET", self.api_url("programs", program_id, "download"), what, stream=True,
                timeout=self.config.download_timeout_s,
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
                response = self._send("GET", url, what, headers=headers, stream=True, timeout=self.config.download_timeout_s)
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


def file_sha256(path: Path) -> str:
    """Hex sha256 of a file, read in 1 MiB chunks."""
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


class _Resolved(BaseModel):
    program_id: str


class _Compilers(BaseModel):
    compilers: list[CompilerInfo]


class AsyncPawClient:
    """Asynchronous twin of `PawClient`: JSON calls on httpx's async client, file downloads in a worker thread."""

    def __init__(
        self, config: PawConfig | None = None, *, transport: httpx.AsyncBaseTransport | None = None, backoff_s: float = 0.5
    ) -> None:
        self.config = config or PawConfig.from_env()
        self._backoff_s = backoff_s
        self._sync = PawClient(self.config, backoff_s=backoff_s)
        self._http = httpx.AsyncClient(
            timeout=httpx.Timeout(self.config.timeout_s), follow_redirects=False, transport=transport,
            headers={"User-Agent": "pawfn"},
        )

    async def aclose(self) -> None:
        """Close both connection pools."""
        await self._http.aclose()
        self._sync.close()

    async def __aenter__(self) -> AsyncPawClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def _send(
        self, method: str, url: str, what: str, *, json: object = None, params: Mapping[str, str] | None = None,
        timeout: float | None = None,
    ) -> httpx.Response:
        _refuse_offline(self.config, what)
        attempt = 0
        while True:
            current, current_method, redirects = url, method, 0
            try:
                while True:
                    request = _build_request(
                        self._http, self.config, current_method, current, json=json if current_method == method else None,
                        params=params, headers=None, timeout=timeout,
                    )
                    response = await self._http.send(request)
                    hop = _redirect(response, current, current_method)
                    if hop is None or redirects >= _MAX_REDIRECTS:
                        break
                    current, current_method = hop
                    redirects += 1
            except httpx.TransportError as exc:
                if attempt < self.config.max_retries:
                    await asyncio.sleep(_backoff(attempt, self._backoff_s))
                    attempt += 1
                    continue
                raise HubConnectionError(f"{what}: cannot reach {current} ({exc})", url=current) from exc
            delay = _retry_delay(response, attempt, self.config.max_retries, self._backoff_s)
            if delay is not None:
                await asyncio.sleep(delay)
                attempt += 1
                continue
            if response.is_success:
                return response
            raise _error_for(response, what)

    async def _get(self, kind: type[_ModelT], what: str, *parts: str, params: Mapping[str, str] | None = None) -> _ModelT:
        return _parse(kind, await self._send("GET", self._sync.api_url(*parts), what, params=params), what)

    async def compile(self, request: CompileRequest) -> CompileResult:
        """Async `PawClient.compile`."""
        try:
            response = await self._send(
                "POST", self._sync.api_url("compile"), "compile", json=request.model_dump(exclude_none=True),
                timeout=self.config.compile_timeout_s,
            )
        except HubError as exc:
            raise _compile_error(exc, "compile") from exc
        return _compile_result(response)

    async def precheck(self, spec: str, compiler: str | None = None) -> CompilePrecheck:
        """Async `PawClient.precheck`."""
        body = {"spec": spec} | ({"compiler": compiler} if compiler else {})
        response = await self._send("POST", self._sync.api_url("compile", "precheck"), "precheck", json=body)
        return _parse(CompilePrecheck, response, "precheck")

    async def compile_async(self, request: CompileRequest) -> CompileJob:
        """Async `PawClient.compile_async`."""
        try:
            response = await self._send(
                "POST", self._sync.api_url("compile", "async"), "compile", json=request.model_dump(exclude_none=True)
            )
        except HubError as exc:
            raise _compile_error(exc, "compile") from exc
        return _parse(CompileJob, response, "compile")

    async def compile_status(self, job_id: str) -> CompileStatus:
        """Async `PawClient.compile_status`."""
        return await self._get(CompileStatus, f"compile job {job_id}", "compile", job_id)

    async def cancel_compile(self, job_id: str) -> CompileCancellation:
        """Async `PawClient.cancel_compile`."""
        what = f"compile job {job_id}"
        return _parse(CompileCancellation, await self._send("DELETE", self._sync.api_url("compile", job_id), what), what)

    async def resolve(self, reference: str) -> str:
        """Async `PawClient.resolve`."""
        what = f"program {reference}"
        response = await self._send("GET", self._sync.api_url("programs", "resolve", reference), what)
        program_id = _parse(_Resolved, response, what).program_id
        if not is_program_id(program_id):
            raise HubError(f"{what}: the server returned an invalid program id {program_id!r}")
        return program_id

    async def program_info(self, reference: str) -> ProgramInfo:
        """Async `PawClient.program_info`."""
        return await self._get(ProgramInfo, f"program {reference}", "programs", reference)

    async def versions(self, slug: str) -> ProgramVersions:
        """Async `PawClient.versions`."""
        return await self._get(ProgramVersions, f"versions of {slug}", "programs", slug, "versions")

    async def my_programs(self, *, sort: str = "recent", per_page: int = 20, page: int = 1) -> ProgramList:
        """Async `PawClient.my_programs`."""
        params = {"mine": "true", "sort": sort, "per_page": str(per_page), "page": str(page)}
        return await self._get(ProgramList, "my programs", "programs", params=params)

    async def compilers(self) -> list[CompilerInfo]:
        """Async `PawClient.compilers`."""
        response = await self._send("GET", self._sync.api_url("models", "compilers"), "compilers")
        return _parse(_Compilers, response, "compilers").compilers

    async def runtime_manifest(self, runtime_id: str) -> RuntimeManifest:
        """Async `PawClient.runtime_manifest`."""
        return await asyncio.to_thread(self._sync.runtime_manifest, runtime_id)

    async def download_program(self, program_id: str, destination: Path, progress: DownloadProgress | None = None) -> Path:
        """Async `PawClient.download_program` (streams to disk in a worker thread)."""
        return await asyncio.to_thread(self._sync.download_program, program_id, destination, progress)
