"""What the HTTP app asks of the programs it serves (`ProgramService`), and its one-process implementation,
`LocalPrograms`: programs loaded in this process, each base once, calls batched by the base's scheduler.

The Ray Serve deployment implements the same protocol over deployment handles (`pawfn.serve.ray`).
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from contextlib import aclosing, asynccontextmanager
from collections.abc import AsyncGenerator, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from typing_extensions import Unpack

from ..core.backends import Backend
from ..core.config import PawConfig
from ..core.errors import ConfigError, NotFoundError, PawError
from ..api.function import PawFn
from ..hub.refs import is_hub_reference
from ..core.models import InterpreterModel
from ..core.options import RuntimeOptions
from ..core.images import Image
from ..api.positional import Positional
from ..core.protocol import RunBatchResponse, RunResponse, ServedProgram, StreamPiece
from ..calls.runtime import CallInput

__all__ = [
    "LocalPrograms",
    "ProgramBudgetError",
    "ProgramBusyError",
    "ProgramService",
    "ServiceCounters",
    "check_loadable",
    "program_info",
    "run_call",
    "run_calls",
    "split_alias",
    "stream_call",
]

AnyPawFn = PawFn[InterpreterModel, Backend]
"""A served program: any interpreter, any backend (how `load_any` types what it loads)."""


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


class ProgramBudgetError(PawError):
    """A program must load, the resident-program budget is full, and every resident program is pinned or running calls."""


class ProgramBusyError(PawError):
    """A program asked to unload is running calls."""


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
    names = ", ".join(sorted(served)) or "none"
    hint = (
        "only program ids and slugs load on request"
        if allow_load
        else ("start the server with --allow-load (Ray: allow_load) to load hub programs on request")
    )
    raise NotFoundError(f"program {reference!r} is not served here (served: {names}); {hint}", status=404)


def program_info(name: str, references: Sequence[str], program: AnyPawFn) -> ServedProgram:
    """What a client learns of a served program."""
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
    pendings = [await program.asubmit(text, options) for text in texts]
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
    """Programs loaded in this process by reference; `allow_load` also loads hub ids and slugs on first request
    (never local paths, which only the operator names at start)."""

    def __init__(
        self,
        backend: type[Backend],
        config: PawConfig,
        *,
        allow_load: bool = False,
        max_programs: int | None = None,
        max_program_bytes: int | None = None,
    ) -> None:
        """`max_programs`, `max_program_bytes`: the resident-program budget, by count and by the bytes programs hold
        beside their bases (`ProgramRuntime.resident_bytes`; None: no bound); a program loaded on a request past it
        replaces the least recently used idle ones that were not loaded at start."""
        self._backend = backend
        self._config = config
        self._allow_load = allow_load
        self._max_programs = max_programs
        self._max_program_bytes = max_program_bytes
        self._by_reference: dict[str, AnyPawFn] = {}
        self._names: dict[int, str] = {}
        """id(program) -> the name it is served under."""
        self._loading = asyncio.Lock()
        """One load at a time: the budget is checked and kept by each load in turn."""
        self._pinned: set[int] = set()
        """Programs the operator named at start: never unloaded."""
        self._in_flight: Counter[int] = Counter()
        self._last_used: dict[int, float] = {}
        self._loads = self._evictions = 0
        self._cold_start_s = 0.0

    def load(self, reference: str, base: Path | None = None, alias: str | None = None) -> ServedProgram:
        """Load `reference` now (at start, before serving), on `base` weights if given, also served as `alias`; a
        program already served under another reference (same id) is not loaded twice. It stays (pinned)."""
        if alias is not None and not is_hub_reference(alias):
            raise ConfigError(f"alias {alias!r} for {reference}: use a slug-like name (lowercase letters, digits, -)")
        program = PawFn.load_any_sync(reference, self._backend, base=base, config=self._config)
        info = self._add(reference, program, alias)
        self._pinned.add(id(self._by_reference[reference]))
        return info

    def _add(self, reference: str, program: AnyPawFn, alias: str | None = None) -> ServedProgram:
        known = self._by_reference.get(program.program_id or "")
        if known is not None:  # the same program by another name: keep the one loaded first
            program.close()
            program = known
        name = self._names.setdefault(id(program), program.program_id or reference)
        for key in (reference, name, alias):
            if key is not None:
                self._by_reference[key] = program
        return program_info(name, self._references(program), program)

    def _references(self, program: AnyPawFn) -> list[str]:
        return [reference for reference, held in self._by_reference.items() if held is program]

    async def _program(self, reference: str) -> AnyPawFn:
        program = self._by_reference.get(reference)
        if program is not None:
            return program
        check_loadable(reference, self._allow_load, self._names.values())
        async with self._loading:  # concurrent first requests load it once
            program = self._by_reference.get(reference)
            if program is None:
                await self._make_room()
                started = time.perf_counter()
                loaded = await PawFn.load_any(reference, self._backend, config=self._config)
                self._loads += 1
                self._cold_start_s += time.perf_counter() - started
                self._add(reference, loaded)
                program = self._by_reference[reference]
                await self._fit_bytes(program)
        return program

    @asynccontextmanager
    async def _using(self, reference: str) -> AsyncGenerator[AnyPawFn, None]:
        """The program `reference` names, held (never unloaded) while the block runs its calls."""
        program = await self._program(reference)
        key = id(program)  # counted before any other await: an eviction sees this call
        self._in_flight[key] += 1
        try:
            yield program
        finally:
            self._in_flight[key] -= 1
            self._last_used[key] = time.monotonic()

    async def _make_room(self) -> None:
        """Unload least recently used idle programs (not pinned, no call in flight) until one more fits the count."""
        while self._max_programs is not None and self.served_count() >= self._max_programs:
            if not await self._evict_one():
                raise ProgramBudgetError(
                    f"this server keeps at most {self._max_programs} programs and every one is running calls or pinned; "
                    "retry in a moment (or raise --max-programs)"
                )

    async def _fit_bytes(self, loaded: AnyPawFn) -> None:
        """After `loaded` came in: unload least recently used idle programs until their bytes fit; where none can go,
        `loaded` goes again and the request is refused."""
        while self._max_program_bytes is not None and self._resident_bytes() > self._max_program_bytes:
            if not await self._evict_one(keep=id(loaded)):
                held = self._resident_bytes()
                self._unload(id(loaded), loaded)
                await loaded.aclose()
                raise ProgramBudgetError(
                    f"this server keeps programs within {self._max_program_bytes} bytes and they would take {held} with every "
                    "other program running calls or pinned; retry in a moment (or raise --max-program-bytes)"
                )

    def _resident(self) -> dict[int, AnyPawFn]:
        """Each program served now, once (a program is served under several references), by id."""
        return {id(program): program for program in self._by_reference.values()}

    def _resident_bytes(self) -> int:
        return sum(program.runtime.resident_bytes or 0 for program in self._resident().values())

    async def _evict_one(self, keep: int | None = None) -> bool:
        """Unload the least recently used idle program (not pinned, no call in flight, not `keep`); False if none."""
        resident = self._resident()
        idle = [key for key in resident if key != keep and key not in self._pinned and not self._in_flight[key]]
        if not idle:
            return False
        victim = min(idle, key=lambda key: self._last_used.get(key, 0.0))
        program = resident[victim]
        self._unload(victim, program)
        self._evictions += 1
        await program.aclose()  # its adapter and prefix go; the base stays while another program uses it
        return True

    def served_count(self) -> int:
        return len(self._resident())

    async def programs(self) -> list[ServedProgram]:
        return [program_info(self._names[key], self._references(program), program) for key, program in self._resident().items()]

    async def info(self, reference: str) -> ServedProgram:
        async with self._using(reference) as program:
            return program_info(self._names[id(program)], self._references(program), program)

    async def run(self, reference: str, text: CallInput, options: RuntimeOptions) -> RunResponse:
        async with self._using(reference) as program:
            return await run_call(program, self._names[id(program)], text, options)

    async def run_batch(self, reference: str, texts: Sequence[str], options: RuntimeOptions) -> RunBatchResponse:
        async with self._using(reference) as program:
            return await run_calls(program, self._names[id(program)], texts, options)

    async def stream(self, reference: str, text: CallInput, options: RuntimeOptions) -> AsyncGenerator[StreamPiece | RunResponse, None]:
        async with self._using(reference) as program, aclosing(stream_call(program, self._names[id(program)], text, options)) as items:
            async for item in items:
                yield item

    async def tokenize(self, reference: str, text: CallInput, options: RuntimeOptions) -> list[int]:
        async with self._using(reference) as program:
            return tokenize_call(program, text, options)

    async def load_program(self, reference: str) -> ServedProgram:
        """Load a hub program now (`allow_load` as for requests), kept like one named at start until unloaded."""
        async with self._using(reference) as program:
            self._pinned.add(id(program))
            return program_info(self._names[id(program)], self._references(program), program)

    async def unload_program(self, reference: str) -> ServedProgram:
        """Unload the program `reference` names, whoever loaded it; refused while it runs calls."""
        program = self._by_reference.get(reference)
        if program is None:
            raise NotFoundError(f"{reference!r} is not loaded on this server", status=404)
        key = id(program)
        if self._in_flight[key]:
            raise ProgramBusyError(f"{self._names[key]} is running {self._in_flight[key]} calls; unload it when they end")
        info = program_info(self._names[key], self._references(program), program)
        self._unload(key, program)
        await program.aclose()
        return info

    def _unload(self, key: int, program: AnyPawFn) -> None:
        for reference in self._references(program):
            del self._by_reference[reference]
        del self._names[key]
        self._last_used.pop(key, None)
        self._pinned.discard(key)

    def counters(self) -> ServiceCounters:
        schedulers = {  # programs on one base share its scheduler: each counted once
            counted.scheduler: counted
            for program in self._by_reference.values()
            if not program.runtime.closed and (counted := program.runtime.decode_counters) is not None
        }
        return ServiceCounters(
            decode_steps=sum(c.steps for c in schedulers.values()),
            decode_rows=sum(c.rows for c in schedulers.values()),
            program_loads=self._loads,
            program_evictions=self._evictions,
            cold_start_s=self._cold_start_s,
        )

    async def aclose(self) -> None:
        programs = self._resident()
        self._by_reference.clear()
        for program in programs.values():
            await program.aclose()
