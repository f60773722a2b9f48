"""`ProgramPool[M, B]`: programs kept loaded by reference within a budget (a count and the bytes they hold beside
their shared bases); the least recently used idle program makes room, never one running calls or one pinned.

An evicted program loads again on its next use from the cache (its adapter and stored prefix), with the same
tokens. `pawfn serve` keeps its programs in one (`--max-programs`, `--max-program-bytes`), as does each Ray replica.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncGenerator, Awaitable, Callable, Iterable, Mapping
from contextlib import asynccontextmanager
from types import TracebackType
from typing import Generic, TypeVar, cast

from typing_extensions import Self

from ..core.backends import Backend, Remote
from ..core.config import PawConfig
from ..core.errors import ProgramBudgetError, ProgramBusyError, ProgramNotLoadedError
from ..core.models import InterpreterModel
from ..core.options import RuntimeOptions
from ..core.results import Generation
from ..hub.prepare import PreparedProgram
from .function import PawFn
from .finding import Finder, Found, finder_of, prepared_first, retrieved
from .leases import HeldProgram, PoolStats, ProgramLease, ResidentProgram
from .opening import ModelChoice, expect_model, known_interpreter

__all__ = ["PoolStats", "ProgramLease", "ProgramPool", "ResidentProgram"]

M = TypeVar("M", bound=InterpreterModel)
B = TypeVar("B", bound=Backend)
OtherM = TypeVar("OtherM", bound=InterpreterModel)
OtherB = TypeVar("OtherB", bound=Backend)


class ProgramPool(Generic[M, B]):
    """Programs loaded on first use and kept within `max_programs` and `max_bytes`; use them inside `use`.

    ```python
    async with ProgramPool.of(PawFn[Qwen3_0_6B, Torch], max_programs=8) as pool:
        label = await pool.run("email-triage", "Urgent: the server is down!")
        async with pool.use("user/sentiment") as program:  # held: never evicted inside the block
            scores = await program.arun_batch(reviews)
    ```

    A program handed out by `use` or `load` is leased: it may be evicted (and closed) once the block ends or the lease
    is released; keep a program past that with `pin(reference)`. One event loop drives a pool; its loads run one
    at a time in worker threads.
    """

    def __init__(
        self,
        load: Callable[[str], Awaitable[PawFn[M, B]]],
        *,
        identify: Callable[[str], Awaitable[str | None]] | None = None,
        max_programs: int | None = None,
        max_bytes: int | None = None,
        wait_s: float = 0.0,
    ) -> None:
        """`load(reference)`: how a program comes in (`of` and `any` give the usual ones); `identify(reference)`: its
        program id, found before anything is evicted (a reference to a held program by another name then loads
        nothing, and one that names no program fails without evicting; `of` and `any` resolve and download it once,
        and load those files); `max_programs`, `max_bytes`: the budget, by count and by the bytes programs hold
        beside their bases (None: no bound); `wait_s`: how long a load past the budget waits for a held program to go
        idle before `ProgramBudgetError`."""
        self._start(finder_of(load, identify), max_programs, max_bytes, wait_s)

    def _start(self, find: Finder[M, B], max_programs: int | None, max_bytes: int | None, wait_s: float) -> None:
        """Every construction path: the pool's finder and budget, checked."""
        if max_programs is not None and max_programs < 1:
            raise ValueError(f"max_programs={max_programs}: a pool holds at least one program (None: no bound)")
        if max_bytes is not None and max_bytes < 1:
            raise ValueError(f"max_bytes={max_bytes}: give a positive number of bytes (None: no bound)")
        if wait_s < 0:
            raise ValueError(f"wait_s={wait_s}: give the seconds a load may wait for room, 0 or more")
        self._find = find
        self._finding: dict[str, asyncio.Future[Found[M, B]]] = {}
        """reference -> its find under way: concurrent first uses of a cold program resolve it once."""
        self.max_programs = max_programs
        self.max_bytes = max_bytes
        self.wait_s = wait_s
        self._went_idle = asyncio.Event()
        """Set when a use ends and leaves its program idle: a load waiting for room looks again."""
        self._entries: dict[str, HeldProgram[M, B]] = {}
        """reference or alias -> its entry (one entry under several keys)."""
        self._loading = asyncio.Lock()
        """One load at a time: each load checks and keeps the budget in turn, and concurrent first uses load once."""
        self._loads = self._evictions = self._releases = 0
        self._cold_start_s = 0.0

    @staticmethod
    def of(
        kind: type[PawFn[OtherM, OtherB]],
        *,
        base: str | os.PathLike[str] | None = None,
        config: PawConfig | None = None,
        references: Mapping[str, str] | None = None,
        local_paths: bool = True,
        max_programs: int | None = None,
        max_bytes: int | None = None,
        wait_s: float = 0.0,
    ) -> ProgramPool[OtherM, OtherB]:
        """A pool of `kind` programs (`PawFn[Qwen3_0_6B, Torch]`), each loaded as `kind.load(reference, ...)` would;
        `references`: names that load another reference (`{"triage": "user/email-triage@v3"}`); `local_paths=False`:
        every other reference is a program id or slug, never a file (references from a server's clients)."""
        return ProgramPool._opening(
            lambda named, given_base: kind.load(named, base=given_base, config=config),
            kind.backend_type(),
            expect_model(kind.model_type()),
            config,
            base,
            references,
            local_paths=local_paths,
            max_programs=max_programs,
            max_bytes=max_bytes,
            wait_s=wait_s,
        )

    @staticmethod
    def any(
        backend: type[OtherB],
        *,
        base: str | os.PathLike[str] | None = None,
        config: PawConfig | None = None,
        references: Mapping[str, str] | None = None,
        local_paths: bool = True,
        max_programs: int | None = None,
        max_bytes: int | None = None,
        wait_s: float = 0.0,
    ) -> ProgramPool[InterpreterModel, OtherB]:
        """A pool of programs on any interpreter their bundles name, on `backend` (`PawFn.load_any`); `references` and
        `local_paths` as in `of`."""
        return ProgramPool._opening(
            lambda named, given_base: PawFn.load_any(named, backend, base=given_base, config=config),
            backend,
            known_interpreter,
            config,
            base,
            references,
            local_paths=local_paths,
            max_programs=max_programs,
            max_bytes=max_bytes,
            wait_s=wait_s,
        )

    @staticmethod
    def _opening(
        open_program: Callable[[str | PreparedProgram, str | os.PathLike[str] | None], Awaitable[PawFn[OtherM, OtherB]]],
        backend: type[Backend],
        choose: ModelChoice,
        config: PawConfig | None,
        base: str | os.PathLike[str] | None,
        references: Mapping[str, str] | None,
        *,
        local_paths: bool,
        max_programs: int | None,
        max_bytes: int | None,
        wait_s: float,
    ) -> ProgramPool[OtherM, OtherB]:
        """`of` and `any`: on `Remote` by reference (the server resolves and loads its programs); elsewhere each
        reference resolved and downloaded once by the finder, which opens those files (`open_program(prepared, None)`)."""
        renamed = dict(references or {})
        if issubclass(backend, Remote):
            find = finder_of(lambda reference: open_program(renamed.get(reference, reference), base), None)
        else:
            find = prepared_first(lambda prepared: open_program(prepared, None), choose, config, base, renamed, local_paths)
        pool = cast("ProgramPool[OtherM, OtherB]", ProgramPool.__new__(ProgramPool))  # __init__ is the path by load and identify
        pool._start(find, max_programs, max_bytes, wait_s)
        return pool

    # --- what is held ---

    def _held(self) -> list[HeldProgram[M, B]]:
        """Each entry once (an entry is found under several references)."""
        return list({id(entry): entry for entry in self._entries.values()}.values())

    def __len__(self) -> int:
        """Programs held now."""
        return len(self._held())

    def __contains__(self, reference: object) -> bool:
        return reference in self._entries

    def get(self, reference: str) -> PawFn[M, B] | None:
        """The program `reference` finds if the pool holds it now (nothing is loaded)."""
        entry = self._entries.get(reference)
        return None if entry is None else entry.program

    def resident(self) -> list[ResidentProgram[M, B]]:
        """Every program held now, least recently used first."""
        return [self._describe(entry) for entry in sorted(self._held(), key=lambda entry: entry.last_used_s)]

    def describe(self, reference: str) -> ResidentProgram[M, B]:
        """The held program `reference` finds (`ProgramNotLoadedError` if none)."""
        return self._describe(self._entry(reference))

    def _describe(self, entry: HeldProgram[M, B]) -> ResidentProgram[M, B]:
        references = tuple(sorted(key for key, held in self._entries.items() if held is entry))
        return ResidentProgram(
            name=entry.name,
            references=references,
            program=entry.program,
            pinned=entry.pinned,
            in_flight=entry.in_flight,
            last_used_s=entry.last_used_s,
            resident_bytes=entry.program.runtime.resident_bytes,
        )

    def _entry(self, reference: str) -> HeldProgram[M, B]:
        entry = self._entries.get(reference)
        if entry is None:
            raise ProgramNotLoadedError(f"{reference!r} is not loaded in this pool; load it first (pool.load or pool.use)")
        return entry

    @property
    def resident_bytes(self) -> int:
        """Bytes the held programs hold beside their bases (those whose backend cannot tell count 0)."""
        return sum(entry.program.runtime.resident_bytes or 0 for entry in self._held())

    @property
    def stats(self) -> PoolStats:
        """Loads, evictions, releases and cold-start seconds so far."""
        return PoolStats(loads=self._loads, evictions=self._evictions, releases=self._releases, cold_start_s=self._cold_start_s)

    # --- bringing programs in ---

    def add(self, reference: str, program: PawFn[M, B], *, aliases: Iterable[str] = (), pin: bool = True) -> ResidentProgram[M, B]:
        """Hold a program loaded elsewhere under `reference` (and `aliases`), pinned unless `pin=False`; no budget is
        checked (an operator's choice). A program the pool already holds (same id) is kept and `program` closed."""
        entry = self._join(reference, program, pin)
        for alias in aliases:
            self._entries[alias] = entry
        return self._describe(entry)

    def _join(self, reference: str, program: PawFn[M, B], pin: bool) -> HeldProgram[M, B]:
        entry = self._entries.get(program.program_id or "") or self._entries.get(reference)
        if entry is not None and entry.program is not program:  # the same program by another name: keep the first
            program.close()
        elif entry is None:
            entry = HeldProgram(program, program.program_id or reference, pin)
        entry.pinned = entry.pinned or pin
        for key in (reference, entry.name):
            self._entries[key] = entry
        return entry

    async def load(self, reference: str) -> ProgramLease[M, B]:
        """The program `reference` names (loaded within the budget if the pool does not hold it), leased: never evicted
        or unloaded until the lease is released (`lease.release()`, or `async with lease as program:`)."""
        entry = self._entries.get(reference) or await self._bring_in(reference)
        return ProgramLease(entry, self._went_idle)  # no await since the entry was found: nothing evicted it meanwhile

    async def pin(self, reference: str) -> ResidentProgram[M, B]:
        """Load the program `reference` names if need be and keep it until `unload` (never evicted); what is held."""
        async with await self.load(reference):
            entry = self._entry(reference)
            entry.pinned = True
            return self._describe(entry)

    @asynccontextmanager
    async def use(self, reference: str) -> AsyncGenerator[PawFn[M, B], None]:
        """The program `reference` names (loaded within the budget if need be), leased for the block."""
        async with await self.load(reference) as program:
            yield program

    async def _bring_in(self, reference: str) -> HeldProgram[M, B]:
        finding = self._finding.get(reference)
        if finding is None:  # the first use of a cold reference finds it; concurrent ones wait for the same find
            finding = self._finding[reference] = asyncio.ensure_future(self._find(reference))
            finding.add_done_callback(retrieved)
        try:
            found = await asyncio.shield(finding)  # raises for no program, or one this pool cannot run
            async with self._loading:
                entry = self._entries.get(reference) or self._entries.get(found.program_id or "")  # loaded meanwhile, or by its id
                if entry is not None:
                    self._entries[reference] = entry
                    return entry
                await self._make_room()
                started = time.perf_counter()
                program = await found.load()
                self._loads += 1
                self._cold_start_s += time.perf_counter() - started
                entry = self._join(reference, program, pin=False)
                await self._fit_bytes(entry)
                return entry
        finally:  # joined (or failed): a later first use finds the entry, or tries afresh
            if self._finding.get(reference) is finding:
                del self._finding[reference]

    async def _make_room(self) -> None:
        """Evict until one more program fits the count."""
        deadline = time.monotonic() + self.wait_s
        while self.max_programs is not None and len(self) >= self.max_programs:
            if not await self._evict_one(deadline=deadline):
                raise ProgramBudgetError(
                    f"this pool holds at most {self.max_programs} programs and every one is running calls or pinned; "
                    "retry in a moment (or raise the count: max_programs, --max-programs)"
                )

    async def _fit_bytes(self, loaded: HeldProgram[M, B]) -> None:
        """After `loaded` came in: evict until the bytes fit; where none can go, `loaded` goes again and is refused."""
        deadline = time.monotonic() + self.wait_s
        while self.max_bytes is not None and self.resident_bytes > self.max_bytes:
            if not await self._evict_one(keep=loaded, deadline=deadline):
                held = self.resident_bytes
                self._forget(loaded)
                await loaded.program.aclose()
                raise ProgramBudgetError(
                    f"this pool keeps programs within {self.max_bytes} bytes and they would take {held} with every other "
                    "program running calls or pinned; retry in a moment (or raise the bound: max_bytes, --max-program-bytes)"
                )

    async def _evict_one(self, keep: HeldProgram[M, B] | None = None, deadline: float = 0.0) -> bool:
        """Unload the least recently used idle program (not pinned, not in use, not `keep`), waiting until `deadline`
        (`time.monotonic()`) for one to go idle; False if none did."""
        while True:
            idle = [entry for entry in self._held() if entry is not keep and not entry.pinned and not entry.in_flight]
            remaining = deadline - time.monotonic()
            if idle or remaining <= 0:
                break
            self._went_idle.clear()
            try:
                await asyncio.wait_for(self._went_idle.wait(), remaining)
            except TimeoutError:
                pass
        if not idle:
            return False
        victim = min(idle, key=lambda entry: entry.last_used_s)
        self._forget(victim)
        self._evictions += 1
        await victim.program.aclose()  # its adapter and prefix go; the base stays while another program uses it
        return True

    def _forget(self, entry: HeldProgram[M, B]) -> None:
        for key in [key for key, held in self._entries.items() if held is entry]:
            del self._entries[key]

    # --- letting programs go ---

    async def unload(self, reference: str) -> ResidentProgram[M, B]:
        """Unload the program `reference` finds, pinned or not; `ProgramBusyError` while it is in use. What it was."""
        entry = self._entry(reference)
        if entry.in_flight:
            raise ProgramBusyError(f"{entry.name} is running {entry.in_flight} calls; unload it when they end")
        described = self._describe(entry)
        self._forget(entry)
        await entry.program.aclose()
        return described

    async def release(self, reference: str) -> bool:
        """Unload the program `reference` finds if it is idle and not pinned (a router dropped it); True if it went."""
        entry = self._entries.get(reference)
        if entry is None or entry.pinned or entry.in_flight:
            return False
        self._forget(entry)
        self._releases += 1
        await entry.program.aclose()
        return True

    # --- calls ---

    async def generate(self, reference: str, input: str, options: RuntimeOptions | None = None) -> Generation:  # noqa: A002
        """One call on the program `reference` names (loaded if need be)."""
        async with self.use(reference) as program:
            return await program.agenerate(input, options)

    async def run(self, reference: str, input: str, options: RuntimeOptions | None = None) -> str:  # noqa: A002
        """The output text of `generate`."""
        return (await self.generate(reference, input, options)).text

    # --- closing ---

    async def aclose(self) -> None:
        """Wait for each program's running calls, then free every program (pinned ones too)."""
        held = self._held()
        self._entries.clear()
        for entry in held:
            await entry.program.aclose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, traceback: TracebackType | None) -> None:
        await self.aclose()

    def __repr__(self) -> str:
        bound = f"max_programs={self.max_programs}, max_bytes={self.max_bytes}"
        return f"<ProgramPool {len(self)} held ({bound})>"
