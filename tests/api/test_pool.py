"""`ProgramPool`: programs within a budget by count and bytes; the least recently used idle program makes room, never
one in use or pinned; an evicted program loads again with the same tokens; loads and evictions are counted."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from pawfn import (
    PawConfig,
    PawFn,
    ProgramBudgetError,
    ProgramBusyError,
    ProgramClosedError,
    ProgramNotLoadedError,
    ProgramPool,
    Qwen3_0_6B,
    RuntimeOptions,
    Torch,
)
from pawfn.testing import fake
from tests.helpers.programs import TinyProgram
from tests.helpers.tiny_models import write_bundle

OPTIONS = RuntimeOptions(max_tokens=8)
Program = PawFn[Qwen3_0_6B, Torch]


@pytest.fixture
def bundles(qwen3_program: TinyProgram, tmp_path: Path) -> list[str]:
    """Four programs on one base, each its own id, template (so prefix) and adapter copy."""
    folders: list[str] = []
    for index in range(4):
        meta: dict[str, object] = {"program_id": f"b0b0b0b0b0b0b0b0b0b{index}"}
        template = f"Program {index}. " + qwen3_program.template
        folders.append(str(write_bundle(tmp_path / f"program-{index}", qwen3_program.adapter, "Qwen/Qwen3-0.6B", template, meta)))
    return folders


def pool_of(
    qwen3_program: TinyProgram, tmp_path: Path, max_programs: int | None = None, max_bytes: int | None = None
) -> ProgramPool[Qwen3_0_6B, Torch]:
    config = PawConfig.model_validate({"cache_dir": tmp_path / "cache", "progress": False})
    return ProgramPool.of(Program, base=qwen3_program.interpreter.gguf_path, config=config, max_programs=max_programs, max_bytes=max_bytes)


def names(pool: ProgramPool[Qwen3_0_6B, Torch]) -> list[str]:
    """Held programs' names, least recently used first."""
    return [resident.name for resident in pool.resident()]


def test_the_least_recently_used_idle_program_makes_room(qwen3_program: TinyProgram, bundles: list[str], tmp_path: Path) -> None:
    async def scenario() -> None:
        async with pool_of(qwen3_program, tmp_path, max_programs=2) as pool:
            first = await pool.generate(bundles[0], "hello", OPTIONS)
            await pool.run(bundles[1], "hello", OPTIONS)
            await pool.run(bundles[0], "hello", OPTIONS)  # bundles[1] is now the least recently used
            evicted = pool.get(bundles[1])
            assert evicted is not None
            await pool.run(bundles[2], "hello", OPTIONS)
            assert names(pool) == ["b0b0b0b0b0b0b0b0b0b0", "b0b0b0b0b0b0b0b0b0b2"]
            assert evicted.closed and bundles[1] not in pool
            with pytest.raises(ProgramClosedError):
                evicted.run("hello", OPTIONS)
            await pool.run(bundles[1], "hello", OPTIONS)  # loads again; bundles[0] goes
            await pool.run(bundles[1], "hello", OPTIONS)
            again = await pool.generate(bundles[0], "hello", OPTIONS)  # loads again: the same tokens
            assert again.token_ids == first.token_ids
            stats = pool.stats
            assert (stats.loads, stats.evictions) == (5, 3) and stats.cold_start_s > 0
            assert len(pool) == 2

    asyncio.run(scenario())


def test_a_program_in_use_or_pinned_is_never_evicted(qwen3_program: TinyProgram, bundles: list[str], tmp_path: Path) -> None:
    async def scenario() -> None:
        async with pool_of(qwen3_program, tmp_path, max_programs=2) as pool:
            pinned = (await pool.pin(bundles[0])).program
            async with pool.use(bundles[1]) as held:
                with pytest.raises(ProgramBudgetError, match="max_programs"):  # one pinned, one in use: nothing can go
                    await pool.run(bundles[2], "hello", OPTIONS)
                assert names(pool) == ["b0b0b0b0b0b0b0b0b0b0", "b0b0b0b0b0b0b0b0b0b1"]
                with pytest.raises(ProgramBusyError):
                    await pool.unload(bundles[1])
                assert await pool.release(bundles[1]) is False  # in use: stays
                assert not held.closed
            await pool.run(bundles[2], "hello", OPTIONS)  # the block ended: bundles[1] is idle and makes room
            assert names(pool) == ["b0b0b0b0b0b0b0b0b0b0", "b0b0b0b0b0b0b0b0b0b2"] and not pinned.closed
            assert await pool.release(bundles[0]) is False  # pinned: stays
            unloaded = await pool.unload(bundles[0])  # an explicit unload takes a pinned one too
            assert unloaded.pinned and unloaded.program.closed and len(pool) == 1
            with pytest.raises(ProgramNotLoadedError, match="load it first"):
                await pool.unload(bundles[0])

    asyncio.run(scenario())


def test_concurrent_calls_on_the_programs_of_a_full_pool(qwen3_program: TinyProgram, bundles: list[str], tmp_path: Path) -> None:
    """More programs than the budget, called concurrently: each call gets its program's lone tokens or a budget refusal."""

    async def scenario() -> None:
        async with pool_of(qwen3_program, tmp_path) as unbounded:
            alone = {bundle: (await unbounded.generate(bundle, "hello", OPTIONS)).token_ids for bundle in bundles}
        async with pool_of(qwen3_program, tmp_path, max_programs=2) as pool:
            outcomes = await asyncio.gather(*(pool.generate(bundles[i % 4], "hello", OPTIONS) for i in range(16)), return_exceptions=True)
            for index, outcome in enumerate(outcomes):
                if isinstance(outcome, BaseException):
                    assert isinstance(outcome, ProgramBudgetError), outcome
                else:
                    assert outcome.token_ids == alone[bundles[index % 4]]
            assert sum(not isinstance(outcome, BaseException) for outcome in outcomes) >= 8
            assert len(pool) <= 2

    asyncio.run(scenario())


def test_a_load_past_the_budget_waits_for_a_program_to_go_idle(qwen3_program: TinyProgram, bundles: list[str], tmp_path: Path) -> None:
    async def scenario() -> None:
        async with pool_of(qwen3_program, tmp_path, max_programs=1) as pool:
            pool.wait_s = 30.0
            async with pool.use(bundles[0]):
                waiting = asyncio.create_task(pool.run(bundles[1], "hello", OPTIONS))
                await asyncio.sleep(0.3)
                assert not waiting.done() and names(pool) == ["b0b0b0b0b0b0b0b0b0b0"]
            assert await waiting  # bundles[0] went idle: it made room
            assert names(pool) == ["b0b0b0b0b0b0b0b0b0b1"]
            pool.wait_s = 0.2
            async with pool.use(bundles[1]):
                started = time.monotonic()
                with pytest.raises(ProgramBudgetError):
                    await pool.run(bundles[2], "hello", OPTIONS)
                assert time.monotonic() - started >= 0.2

    asyncio.run(scenario())


def test_the_bytes_bound(qwen3_program: TinyProgram, bundles: list[str], tmp_path: Path) -> None:
    async def scenario() -> None:
        async with pool_of(qwen3_program, tmp_path) as probe:
            one = (await probe.load(bundles[0])).program.runtime.resident_bytes
        assert one is not None and one > 0
        async with pool_of(qwen3_program, tmp_path, max_bytes=one * 3 // 2) as pool:  # room for one program
            await pool.run(bundles[0], "hello", OPTIONS)
            await pool.run(bundles[1], "hello", OPTIONS)
            assert names(pool) == ["b0b0b0b0b0b0b0b0b0b1"] and pool.resident_bytes <= one * 3 // 2
            async with pool.use(bundles[1]):
                with pytest.raises(ProgramBudgetError, match="bytes"):  # the only other program is in use
                    await pool.run(bundles[2], "hello", OPTIONS)
                assert names(pool) == ["b0b0b0b0b0b0b0b0b0b1"]  # the refused program was let go again
            assert pool.stats.evictions == 1

    asyncio.run(scenario())


def test_one_program_under_two_references_is_held_once(qwen3_program: TinyProgram, bundles: list[str], tmp_path: Path) -> None:
    async def scenario() -> None:
        async with pool_of(qwen3_program, tmp_path, max_programs=4) as pool:
            program = (await pool.load(bundles[0])).program
            assert (await pool.load("b0b0b0b0b0b0b0b0b0b0")).program is program  # its id finds it: nothing loads
            config = PawConfig.model_validate({"cache_dir": tmp_path / "cache", "progress": False})
            twin = Program.load_sync(bundles[0], base=qwen3_program.interpreter.gguf_path, config=config)
            resident = pool.add("twin", twin, aliases=["alias"])  # the same id: the held one is kept, the twin closed
            assert twin.closed and resident.program is program and resident.pinned
            assert set(resident.references) == {bundles[0], "b0b0b0b0b0b0b0b0b0b0", "twin", "alias"}
            assert len(pool) == 1 and pool.stats.loads == 1

    asyncio.run(scenario())


def test_budget_arguments_are_checked() -> None:
    async def load(reference: str) -> Program:
        raise AssertionError("never called")

    with pytest.raises(ValueError, match="max_programs=0"):
        ProgramPool(load, max_programs=0)
    with pytest.raises(ValueError, match="max_bytes=-1"):
        ProgramPool(load, max_bytes=-1)


def test_eight_concurrent_first_uses_of_a_cold_program_resolve_it_once() -> None:
    found: list[str] = []
    loaded: list[str] = []

    async def identify(reference: str) -> str:
        found.append(reference)
        await asyncio.sleep(0.05)  # a hub resolve takes a while: every first use arrives meanwhile
        return f"id-of-{reference}"

    async def load(reference: str) -> Program:
        loaded.append(reference)
        return fake(Program, {"hello": reference})

    async def scenario() -> list[str]:
        async with ProgramPool(load, identify=identify, max_programs=2) as pool:
            outputs = await asyncio.gather(*(pool.run("cold", "hello") for _ in range(8)))
            assert len(pool) == 1 and pool.stats.loads == 1
            await pool.run("cold", "hello")  # held now: nothing resolves
            return outputs

    assert asyncio.run(scenario()) == ["cold"] * 8
    assert found == ["cold"] and loaded == ["cold"]


def test_a_failed_resolve_fails_every_waiter_and_the_next_use_tries_again() -> None:
    attempts: list[str] = []

    async def identify(reference: str) -> str:
        attempts.append(reference)
        await asyncio.sleep(0.05)
        if len(attempts) == 1:
            raise ProgramNotLoadedError("the hub was away")  # any error: every first use waiting on it sees it
        return "id"

    async def load(reference: str) -> Program:
        return fake(Program, {"hello": "hi"})

    async def scenario() -> None:
        async with ProgramPool(load, identify=identify) as pool:
            outcomes = await asyncio.gather(*(pool.run("ref", "hello") for _ in range(4)), return_exceptions=True)
            assert all(isinstance(outcome, ProgramNotLoadedError) for outcome in outcomes)
            assert await pool.run("ref", "hello") == "hi"

    asyncio.run(scenario())
    assert attempts == ["ref", "ref"]


def test_a_leased_program_is_never_closed_under_its_holder() -> None:
    async def load(reference: str) -> Program:
        return fake(Program, {"hello": reference})

    async def scenario() -> None:
        async with ProgramPool(load, max_programs=1) as pool:
            lease = await pool.load("a")
            with pytest.raises(ProgramBudgetError):  # the only program is leased: nothing can make room
                await pool.run("b", "hello")
            with pytest.raises(ProgramBusyError):
                await pool.unload("a")
            assert await pool.release("a") is False
            assert lease.program.run("hello") == "a"  # not closed: a closed program raises ProgramClosedError
            async with lease as program:  # the block releases it
                assert program is lease.program
            assert lease.held is False
            lease.release()  # a second release does nothing
            assert await pool.run("b", "hello") == "b"  # "a" is idle now: it makes room
            assert lease.program.closed and pool.stats.evictions == 1

    asyncio.run(scenario())


def test_a_release_is_counted_apart_from_evictions() -> None:
    async def load(reference: str) -> Program:
        return fake(Program, {"hello": reference})

    async def scenario() -> None:
        async with ProgramPool(load) as pool:
            await pool.run("a", "hello")
            assert await pool.release("a") is True
            assert (pool.stats.loads, pool.stats.evictions, pool.stats.releases) == (1, 0, 1)
            with pytest.raises(ProgramNotLoadedError, match="'a' is not loaded in this pool"):
                pool.describe("a")

    asyncio.run(scenario())
