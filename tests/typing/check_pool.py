"""Typing tests of `ProgramPool`: its programs keep the pool's type arguments; a pool of one kind refuses another's."""

from __future__ import annotations

from typing_extensions import assert_type

from pawfn import GPT2, InterpreterModel, PawFn, PoolStats, PreparedProgram, ProgramLease, ProgramPool, Qwen3_0_6B, ResidentProgram, Torch


async def pools(other: PawFn[GPT2, Torch]) -> None:
    pool = ProgramPool.of(PawFn[Qwen3_0_6B, Torch], max_programs=8)
    assert_type(pool, ProgramPool[Qwen3_0_6B, Torch])
    assert_type(await pool.pin("email-triage"), ResidentProgram[Qwen3_0_6B, Torch])
    lease = await pool.load("email-triage")
    assert_type(lease, ProgramLease[Qwen3_0_6B, Torch])
    assert_type(lease.program, PawFn[Qwen3_0_6B, Torch])
    async with lease as leased:
        assert_type(leased, PawFn[Qwen3_0_6B, Torch])
    async with pool.use("email-triage") as program:
        assert_type(program, PawFn[Qwen3_0_6B, Torch])
    assert_type(await pool.run("email-triage", "text"), str)
    assert_type(pool.resident(), list[ResidentProgram[Qwen3_0_6B, Torch]])
    assert_type(pool.stats, PoolStats)
    assert_type(ProgramPool.any(Torch), ProgramPool[InterpreterModel, Torch])
    pool.add("gpt2", other)  # expect-error: arg-type; reportArgumentType
    ProgramPool.of(PawFn[Qwen3_0_6B, Torch], max_programs="8")  # expect-error: arg-type; reportArgumentType
    assert_type(ProgramPool.of(PawFn[Qwen3_0_6B, Torch], references={"triage": "user/email-triage@v3"}), ProgramPool[Qwen3_0_6B, Torch])
    ProgramPool.any(Torch, references=["user/email-triage"])  # expect-error: arg-type; reportArgumentType


def prepared_loads(prepared: PreparedProgram) -> None:
    assert_type(PawFn[Qwen3_0_6B, Torch].load_sync(prepared), PawFn[Qwen3_0_6B, Torch])
    assert_type(PawFn.load_any_sync(prepared, Torch), PawFn[InterpreterModel, Torch])
