"""`ProgramPool`: programs within a budget by count and bytes; the least recently used idle program makes room, never
one in use or pinned; an evicted program loads again with the same tokens; loads and evictions are counted."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from pawfn import PawConfig, PawFn, ProgramBudgetError, ProgramBusyError, ProgramClosedError, ProgramPool, Qwen3_0_6B, RuntimeOptions, Torch
from pawfn.core.errors import NotFoundError
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
            pinned = await pool.load(bundles[0], pin=True)
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
            with pytest.raises(NotFoundError):
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
            one = (await probe.load(bundles[0])).runtime.resident_bytes
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
            program = await pool.load(bundles[0])
            assert await pool.load("b0b0b0b0b0b0b0b0b0b0") is program  # its id finds it: nothing loads
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
