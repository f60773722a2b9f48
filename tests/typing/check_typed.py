"""Typing tests of typed outputs: `returning(T)` gives `T` from every call in both checkers, and a value used as
another type is refused (# expect-error lines)."""

from __future__ import annotations

import enum
from typing import Annotated, Literal

from pydantic import BaseModel
from typing_extensions import assert_type

import pawfn
from pawfn import LlamaCpp, PawFn, Pattern, Qwen3_0_6B, Remote, Torch, TypedFn, TypedGeneration


class Priority(enum.Enum):
    HIGH = "high"
    LOW = "low"


class Ticket(BaseModel):
    label: Literal["urgent", "normal"]
    score: int


Code = Annotated[str, Pattern(r"[A-Z]{3}-[0-9]{4}")]


def handles(program: PawFn[Qwen3_0_6B, Torch], remote: PawFn[Qwen3_0_6B, Remote], native: PawFn[Qwen3_0_6B, LlamaCpp]) -> None:
    triage = program.returning(Literal["urgent", "normal", "spam"])
    assert_type(triage, TypedFn[Literal["urgent", "normal", "spam"]])
    assert_type(triage.run("x"), Literal["urgent", "normal", "spam"])
    assert_type(triage.run_batch(["x"]), list[Literal["urgent", "normal", "spam"]])
    assert_type(triage.generate("x"), TypedGeneration[Literal["urgent", "normal", "spam"]])
    assert_type(program.returning(Priority).run("x"), Priority)
    assert_type(program.returning(bool).run("x"), bool)
    assert_type(program.returning(int).run("x"), int)
    assert_type(program.returning(float).run("x"), float)
    assert_type(program.returning(Ticket).run("x"), Ticket)
    assert_type(program.returning(list[Ticket]).run("x"), list[Ticket])
    assert_type(program.returning(Code).run("x"), str)
    assert_type(remote.returning(int).run("x"), int)
    assert_type(native.returning(bool).run("x"), bool)

    label: Literal["urgent", "normal", "spam"] = triage.run("x")
    number: int = program.returning(Ticket).run("x")  # expect-error: assignment; reportAssignmentType
    other: Literal["a", "b"] = triage.run("x")  # expect-error: assignment; reportAssignmentType
    del label, number, other


async def asynchronous(program: PawFn[Qwen3_0_6B, Torch]) -> None:
    assert_type(await program.returning(int).arun("x"), int)
    assert_type(await pawfn.arun_many([(program.returning(int), "a")]), list[int])
    assert_type(await pawfn.arun_many([(program, "a")]), list[str])
    assert_type(await program.returning(Ticket).arun_batch(["x"]), list[Ticket])


def many(program: PawFn[Qwen3_0_6B, Torch]) -> None:
    flags = program.returning(bool)
    assert_type(pawfn.run_many([(flags, "a"), (flags, "b")]), list[bool])
    assert_type(pawfn.run_many([(program, "a"), (program, "b")]), list[str])
    assert_type(pawfn.run_many([(program.returning(Literal["x", "y"]), "a"), (program.returning(str), "b")]), list[str])
    pawfn.run_many([(program.returning(int), "a"), (program, "b")])  # expect-error: list-item; reportArgumentType
