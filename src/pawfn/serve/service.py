"""What the HTTP app asks of the programs it serves (`ProgramService`), and its one-process implementation,
`LocalPrograms`: programs loaded in this process, each base once, calls batched by the base's scheduler.

The Ray Serve deployment implements the same protocol over deployment handles (`pawfn.serve.ray`).
"""

from __future__ import annotations

import asyncio
import re
from contextlib import AsyncExitStack, aclosing, asynccontextmanager
from collections.abc import AsyncGenerator, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from typing_extensions import Unpack

from ..core.backends import Backend
from ..core.config import PawConfig
from ..core.errors import ConfigError, NotFoundError, PawError, ProgramBudgetError, ProgramBusyError, ProgramNotLoadedError
from ..api.function import PawFn
from ..api.pool import ProgramPool, ResidentProgram
from ..hub.refs import is_hub_reference, parse_reference, shown_reference
from ..core.models import InterpreterModel
from ..core.options import RuntimeOptions
from ..core.images import Image
from ..api.positional import Positional
from ..core.protocol import RunBatchResponse, RunResponse, ServedProgram, StreamPiece
from ..calls.memo import result_cache_for
from ..calls.runtime import CallInput
from .loading import AnyPawFn, LoadFailures, ProgramLoadError, held_for_request, loading

__all__ = [
    "LoadFailures",
    "LocalPrograms",
    "ProgramBudgetError",
    "ProgramBusyError",
    "ProgramKeptError",
    "ProgramLoadError",
    "ProgramService",
    "ServiceCounters",
    "check_loadable",
    "held_for_request",
    "loading",
    "program_info",
    "run_call",
    "run_calls",
    "split_alias",
    "stream_call",
]

_SERVED_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
"""A name a program from a local file is served under when neither an alias nor a program id names it."""


class ProgramKeptError(PawError, RuntimeError):
    """A program named when the server started cannot be unloaded by a request."""


class ProgramService(Protocol):
    """The programs behind the HTTP API; every method raises `NotFoundError` for a program it does not serve."""

    async def programs(self) -> list[ServedProgram]:
        """Every program served now."""
        ...

    async def info(self, reference: str) -> ServedProgram:
        """The program `reference` names (loading it first where the service allows)."""
        ...

    async def run(self, reference: str, text: CallInput, options: RuntimeOptions) -> RunResponse:
        """One call."""
        ...

    async def run_batch(self, reference: str, texts: Sequence[str], options: RuntimeOptions) -> RunBatchResponse:
        """Calls decoded together, results in input order."""
        ...

    def stream(self, reference: str, text: CallInput, options: RuntimeOptions) -> AsyncGenerator[StreamPiece | RunResponse, None]:
        """One call's text as it is generated, then its `RunResponse`; closing the iterator early cancels the call."""
        ...

    async def tokenize(self, reference: str, text: CallInput, options: RuntimeOptions) -> list[int]:
        """Token ids of input + suffix."""
        ...

    async def load_program(self, reference: str) -> ServedProgram:
        """Load the program `reference` names now, kept until unloaded (an operator's request)."""
        ...

    async def unload_program(self, reference: str) -> ServedProgram:
        """Unload the program `reference` names (refused while it runs calls); what it was."""
        ...

    def counters(self) -> ServiceCounters:
        """Running totals for the metrics (zeros where the service cannot know them)."""
        ...

    def served_count(self) -> int:
        """How many programs are served now, known without asking anyone (for `/healthz`)."""
        ...

    async def aclose(self) -> None:
        """Finish running calls, then free every program."""
        ...


@dataclass(frozen=True)
class ServiceCounters:
    """Running totals a service keeps for the metrics."""

    decode_steps: int = 0
    """Decode steps of its bases' schedulers (forward passes over one or more rows)."""
    decode_rows: int = 0
    """Rows those steps advanced (rows / steps is the mean batch size)."""
    replica_retries: int = 0
    """Calls sent again because the replica holding them died (Ray)."""
    program_loads: int = 0
    """Programs loaded on a request (`--allow-load`), first or again after an eviction."""
    program_evictions: int = 0
    """Idle programs unloaded to stay within the resident-program budget."""
    cold_start_s: float = 0.0
    """Seconds those loads took, in all."""
    cache_hits: int = 0
    """Calls the result cache answered."""
    cache_misses: int = 0
    """Deterministic calls it did not hold (computed, then stored)."""
    cache_bytes: int = 0
    """Bytes the result cache holds now."""
    resident: frozenset[str] | None = None
    """The names of the programs resident now (None: the service cannot say without asking its replicas)."""


def split_alias(given: str) -> tuple[str | None, str]:
    """`NAME=REF` as (NAME, REF); a plain reference (or a path that holds `=`) as (None, REF)."""
    if "=" not in given or Path(given).exists():
        return None, given
    alias, _, reference = given.partition("=")
    return alias, reference


def check_loadable(reference: str, allow_load: bool, served: Iterable[str]) -> None:
    """`NotFoundError` unless a program not yet served may load on request: `allow_load`, and a hub id or slug."""
    if allow_load and is_hub_reference(reference):
        return
    names = sorted(served)
    shown = ", ".join(names[:20]) + (f" and {len(names) - 20} more" if len(names) > 20 else "") if names else "none"
    hint = (
        "only program ids and slugs load on request"
        if allow_load
        else ("start the server with --allow-load (Ray: allow_load) to load hub programs on request")
    )
    raise NotFoundError(f"program {shown_reference(reference)} is not served here (served: {shown}); {hint}", status=404)


def program_info(name: str, references: Sequence[str], program: AnyPawFn) -> ServedProgram:
    """What a client learns of a served program (`references`: the names clients use, never a server path)."""
    return ServedProgram(
        name=name,
        program_id=program.program_id,
        references=sorted(set(references)),
        interpreter=program.interpreter,
        model=program.model_type().__name__,
        backend=program.backend_type().name,
        n_ctx=program.n_ctx,
        prefix_tokens=program.prefix_tokens,
        arity=program.runtime.arity,
        spec=program.spec,
    )


def _arguments(program: AnyPawFn) -> Positional[Unpack[tuple[str | Image, ...]]]:
    """`program` called with a numbered template's arguments (their count is checked against its template)."""
    return Positional(program)


async def run_call(program: AnyPawFn, name: str, text: CallInput, options: RuntimeOptions) -> RunResponse:
    """One call (one input, or a numbered template's arguments) on a loaded program, answered under `name`."""
    generation = await (program.agenerate(text, options) if isinstance(text, str) else _arguments(program).agenerate(*text, options=options))
    return RunResponse(program=name, generation=generation)


def tokenize_call(program: AnyPawFn, text: CallInput, options: RuntimeOptions) -> list[int]:
    """The token ids a call evaluates after the program's cached prefix."""
    return program.prompt_token_ids(text, options) if isinstance(text, str) else _arguments(program).prompt_token_ids(*text, options=options)


async def run_calls(program: AnyPawFn, name: str, texts: Sequence[str], options: RuntimeOptions) -> RunBatchResponse:
    """Calls decoded together on a loaded program, results in input order; a failed or abandoned batch leaves nothing
    running."""
    pendings = [program.submit(text, options) for text in texts]
    try:
        generations = [await asyncio.wrap_future(pending) for pending in pendings]
    finally:
        for pending in pendings:
            pending.cancel()
    return RunBatchResponse(program=name, generations=generations)


async def stream_call(program: AnyPawFn, name: str, text: CallInput, options: RuntimeOptions) -> AsyncGenerator[StreamPiece | RunResponse, None]:
    """One call's text as generated, then its `RunResponse`; closing the generator early cancels the call."""
    opened = program.astream(text, options) if isinstance(text, str) else _arguments(program).astream(*text, options=options)
    async with await opened as stream:
        async for piece in stream:
            yield StreamPiece(text=piece)
        yield RunResponse(program=name, generation=await stream.generation())


class LocalPrograms:
    """Programs loaded in this process by reference, kept in a `ProgramPool`; `allow_load` also loads hub ids and
    slugs on first request (never local paths, which only the operator names at start)."""

    def __init__(
        self,
        backend: type[Backend],
        config: PawConfig,
        *,
        allow_load: bool = False,
        max_programs: int | None = None,
        max_program_bytes: int | None = None,
        program_wait_s: float = 0.0,
        failed_load_retry_s: float = 60.0,
    ) -> None:
        """`max_programs`, `max_program_bytes`: the resident-program budget, by count and by the bytes programs hold
        beside their bases (`ProgramRuntime.resident_bytes`; None: no bound); a program loaded on a request past it
        replaces the least recently used idle ones that were not loaded at start or by `load_program`, waiting up to
        `program_wait_s` for one to go idle. A program that failed to load on a request is refused for
        `failed_load_retry_s` seconds."""
        self._backend = backend
        self._config = config
        self._allow_load = allow_load
        self._pool: ProgramPool[InterpreterModel, Backend] = ProgramPool.any(
            backend, config=config, local_paths=False, max_programs=max_programs, max_bytes=max_program_bytes, wait_s=program_wait_s
        )
        self._started: set[str] = set()
        """The names of the programs loaded at start (never unloaded by a request)."""
        self._failures = LoadFailures(failed_load_retry_s)

    def load(self, reference: str, base: Path | None = None, alias: str | None = None) -> ServedProgram:
        """Load `reference` now (at start, before serving), on `base` weights if given, also served as `alias`; a
        program already served under another reference (same id) is not loaded twice. It stays (pinned). A local
        file is served under `alias`, else its program id, else its file name; never under its path."""
        if alias is not None and not is_hub_reference(alias):
            raise ConfigError(f"alias {alias!r} for {reference}: use a slug-like name (lowercase letters, digits, -)")
        local = parse_reference(reference).kind == "path"
        program = PawFn.load_any_sync(reference, self._backend, base=base, config=self._config)
        if local:
            served_as = alias or program.program_id or _file_name(reference)
            held = self._pool.get(served_as)
            if held is not None and (program.program_id is None or held.program_id != program.program_id):
                program.close()
                raise ConfigError(f"{reference}: another program is served as {served_as!r} already; name this one: --program NAME={reference}")
            resident = self._pool.add(served_as, program, aliases=[])
        else:
            resident = self._pool.add(reference, program, aliases=[] if alias is None else [alias])
        self._started.update(resident.references)
        return self._info(resident)

    @staticmethod
    def _info(resident: ResidentProgram[InterpreterModel, Backend]) -> ServedProgram:
        return program_info(resident.name, resident.references, resident.program)

    @asynccontextmanager
    async def _using(self, reference: str) -> AsyncGenerator[tuple[AnyPawFn, str], None]:
        """The program `reference` names and its served name, held (never unloaded) while the block runs its calls; a
        failure to bring it in is a `loading` failure, an error of its calls is their own."""
        if reference not in self._pool:
            check_loadable(reference, self._allow_load, [resident.name for resident in self._pool.resident()])
        async with AsyncExitStack() as held:
            program = await held_for_request(held, self._pool, reference, self._failures)
            yield program, self._pool.describe(reference).name

    def served_count(self) -> int:
        return len(self._pool)

    async def programs(self) -> list[ServedProgram]:
        return [self._info(resident) for resident in self._pool.resident()]

    async def info(self, reference: str) -> ServedProgram:
        async with self._using(reference):
            return self._info(self._pool.describe(reference))

    async def run(self, reference: str, text: CallInput, options: RuntimeOptions) -> RunResponse:
        async with self._using(reference) as (program, name):
            return await run_call(program, name, text, options)

    async def run_batch(self, reference: str, texts: Sequence[str], options: RuntimeOptions) -> RunBatchResponse:
        async with self._using(reference) as (program, name):
            return await run_calls(program, name, texts, options)

    async def stream(self, reference: str, text: CallInput, options: RuntimeOptions) -> AsyncGenerator[StreamPiece | RunResponse, None]:
        async with self._using(reference) as (program, name), aclosing(stream_call(program, name, text, options)) as items:
            async for item in items:
                yield item

    async def tokenize(self, reference: str, text: CallInput, options: RuntimeOptions) -> list[int]:
        async with self._using(reference) as (program, _):
            return tokenize_call(program, text, options)

    async def load_program(self, reference: str) -> ServedProgram:
        """Load a hub program now (`allow_load` as for requests), kept like one named at start until unloaded."""
        async with self._using(reference):
            return self._info(await self._pool.pin(reference))

    async def unload_program(self, reference: str) -> ServedProgram:
        """Unload the program `reference` names if a request or `load_program` loaded it; refused while it runs calls,
        and for a program named at start (its names then never fall through to the hub)."""
        if reference not in self._pool:
            raise ProgramNotLoadedError(f"{shown_reference(reference)} is not loaded on this server; nothing to unload")
        resident = self._pool.describe(reference)
        if self._started.intersection(resident.references):
            raise ProgramKeptError(f"{resident.name} was named when the server started and stays until it stops; restart the server without it")
        return self._info(await self._pool.unload(reference))

    def counters(self) -> ServiceCounters:
        schedulers = {  # programs on one base share its scheduler: each counted once
            counted.scheduler: counted
            for resident in self._pool.resident()
            if not resident.program.runtime.closed and (counted := resident.program.runtime.decode_counters) is not None
        }
        stats = self._pool.stats
        cache = result_cache_for(self._config.result_cache_bytes)
        cached = None if cache is None else cache.stats()
        return ServiceCounters(
            decode_steps=sum(c.steps for c in schedulers.values()),
            decode_rows=sum(c.rows for c in schedulers.values()),
            program_loads=stats.loads,
            program_evictions=stats.evictions,
            cold_start_s=stats.cold_start_s,
            cache_hits=0 if cached is None else cached.hits,
            cache_misses=0 if cached is None else cached.misses,
            cache_bytes=0 if cached is None else cached.bytes,
            resident=frozenset(resident.name for resident in self._pool.resident()),
        )

    async def aclose(self) -> None:
        await self._pool.aclose()


def _file_name(path: str) -> str:
    """The name a local bundle is served under when nothing else names it: its file or folder name, less `.paw`."""
    name = Path(path).name.removesuffix(".paw")
    if not _SERVED_NAME.match(name):
        raise ConfigError(f"{path}: give the program a name to be served under: --program NAME={path}")
    return name
