"""Typed clients of the PAW REST API: `PawClient` (sync) and `AsyncPawClient` (async), over httpx.

Every endpoint is described once (`_HubEndpoints`) and carried out on the request plan of `hub.http`: retries with
backoff, redirects followed by hand so the `X-API-Key` header never reaches another origin, typed errors.
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from typing import TypeVar

import httpx
from pydantic import BaseModel

from ..formats.bundle import MAX_ARCHIVE_BYTES
from ..core.config import HubSettings
from ..core.errors import CompileError, HubConnectionError, HubError, IntegrityError, ServerError
from ..core.hashing import file_sha256
from ..core.progress import DownloadProgress
from .http import ClientBase, Endpoint, Outcome, Request, Sleep, SyncClient, backoff, parse_model, retry_after
from .refs import is_program_id
from .types import CompileCancellation, CompileJob, CompilePrecheck, CompileRequest, CompileResult, CompileStatus
from .types import CompilerInfo, ProgramInfo, ProgramList, ProgramVersions, RuntimeManifest

__all__ = ["AsyncPawClient", "PawClient"]

_T = TypeVar("_T")


def _compile_result(response: httpx.Response) -> CompileResult:
    result = parse_model(CompileResult, response, "compile")
    if result.error or result.status == "failed" or not result.program_id:
        raise CompileError(f"compile failed: {result.error or result.status}", status=response.status_code, server_message=result.error)
    return result


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


class _HubEndpoints(ClientBase):
    """The PAW API's endpoints, described once for both clients."""

    def _compile(self, request: CompileRequest) -> Endpoint[CompileResult]:
        body = request.model_dump(exclude_none=True)
        return Endpoint(
            self._api("POST", "compile", "compile", json=body, timeout=self.config.compile_timeout_s, map_error=_as_compile_error), _compile_result
        )

    def _precheck(self, spec: str, compiler: str | None) -> Endpoint[CompilePrecheck]:
        body = {"spec": spec} | ({"compiler": compiler} if compiler else {})
        return self._model(CompilePrecheck, "POST", "precheck", "compile", "precheck", json=body)

    def _compile_async(self, request: CompileRequest) -> Endpoint[CompileJob]:
        body = request.model_dump(exclude_none=True)
        return self._model(CompileJob, "POST", "compile", "compile", "async", json=body, map_error=_as_compile_error)

    def _compile_status(self, job_id: str) -> Endpoint[CompileStatus]:
        return self._model(CompileStatus, "GET", f"compile job {job_id}", "compile", job_id)

    def _cancel_compile(self, job_id: str) -> Endpoint[CompileCancellation]:
        return self._model(CompileCancellation, "DELETE", f"compile job {job_id}", "compile", job_id)

    def _resolve(self, reference: str) -> Endpoint[str]:
        what = f"program {reference}"
        return Endpoint(
            self._api("GET", what, "programs", "resolve", reference),
            lambda response: _program_id(parse_model(_Resolved, response, what).program_id, what),
        )

    def _program_info(self, reference: str) -> Endpoint[ProgramInfo]:
        return self._model(ProgramInfo, "GET", f"program {reference}", "programs", reference)

    def _versions(self, slug: str) -> Endpoint[ProgramVersions]:
        return self._model(ProgramVersions, "GET", f"versions of {slug}", "programs", slug, "versions")

    def _my_programs(self, sort: str, per_page: int, page: int) -> Endpoint[ProgramList]:
        params = {"mine": "true", "sort": sort, "per_page": str(per_page), "page": str(page)}
        return self._model(ProgramList, "GET", "my programs", "programs", params=params)

    def _compilers(self) -> Endpoint[list[CompilerInfo]]:
        return Endpoint(
            self._api("GET", "compilers", "models", "compilers"), lambda response: parse_model(_Compilers, response, "compilers").compilers
        )

    def _runtime_manifest(self, runtime_id: str) -> Endpoint[RuntimeManifest]:
        what = f"runtime {runtime_id}"
        return Endpoint(
            self._api("GET", what, "models", "runtimes", runtime_id),
            lambda response: _runtime_named(parse_model(RuntimeManifest, response, what), runtime_id),
        )


class PawClient(_HubEndpoints, SyncClient):
    """Synchronous PAW API client; one connection pool, safe to share between threads."""

    def __init__(self, config: HubSettings | None = None, *, transport: httpx.BaseTransport | None = None, backoff_s: float = 0.5) -> None:
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
                    raise HubConnectionError(f"program {program_id}: connection lost during the download ({exc})", url=self.config.api_url) from exc
                time.sleep(backoff(attempt, self._backoff_s))
                attempt += 1

    def _download_program_once(self, program_id: str, destination: Path, progress: DownloadProgress | None) -> Path:
        what = f"program {program_id}"
        waited = 0.0
        while True:
            response = self._send(
                Request("GET", self.api_url("programs", program_id, "download"), what, stream=True, timeout=self.config.download_timeout_s)
            )
            if response.status_code != 202:
                break
            response.close()
            delay = retry_after(response)
            delay = 3.0 if delay is None else max(delay, 0.25)  # a 0 would poll the server in a busy loop
            if waited + delay > self.config.max_wait_s:
                raise ServerError(f"{what} is still being generated after {waited:.0f} s; try again shortly", status=202)
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
        self, url: str, destination: Path, *, size_bytes: int | None, sha256: str | None, progress: DownloadProgress | None = None
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
                response = self._send(Request("GET", url, what, headers=headers, stream=True, timeout=self.config.download_timeout_s))
            except HubError as exc:
                if exc.status == 416 and offset:  # the partial file is already whole, or bogus: check it
                    break
                raise
            try:
                resumed = response.status_code == 206
                total = size_bytes or (
                    int(response.headers["content-length"]) + (offset if resumed else 0)
                    if response.headers.get("content-length", "").isdigit()
                    else None
                )
                done = offset if resumed else 0
                try:
                    with partial.open("ab" if resumed else "wb") as handle:
                        for chunk in response.iter_bytes():
                            handle.write(chunk)
                            done += len(chunk)
                            if size_bytes is not None and done > size_bytes:  # a server sending past the pinned size: stop here
                                break
                            if progress:
                                progress(done, total)
                except httpx.TransportError as exc:
                    if attempt < self.config.max_retries:  # keep what arrived and resume from there
                        attempt += 1
                        time.sleep(backoff(attempt, self._backoff_s))
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


class AsyncPawClient(_HubEndpoints):
    """Asynchronous twin of `PawClient`: API calls on httpx's async client; file downloads (disk I/O and
    hashing) in a worker thread on a `PawClient`."""

    def __init__(self, config: HubSettings | None = None, *, transport: httpx.AsyncBaseTransport | None = None, backoff_s: float = 0.5) -> None:
        super().__init__(config, backoff_s)
        self._downloads = PawClient(self.config, backoff_s=backoff_s)
        self._http = httpx.AsyncClient(
            timeout=httpx.Timeout(self.config.timeout_s), follow_redirects=False, transport=transport, headers={"User-Agent": "pawfn"}
        )

    async def aclose(self) -> None:
        """Close both connection pools."""
        await self._http.aclose()
        self._downloads.close()

    async def __aenter__(self) -> AsyncPawClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def _send(self, request: Request) -> httpx.Response:
        """Carry out `_exchange` with awaits."""
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
                await asyncio.sleep(action.seconds)
                outcome = None
                continue
            try:
                outcome = await self._http.send(action.request, stream=action.stream)
            except httpx.TransportError as exc:
                outcome = exc

    async def _call(self, endpoint: Endpoint[_T]) -> _T:
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
