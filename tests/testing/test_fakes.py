"""Fakes stand in for real programs with no model: the same type (accepted by code typed for the real program),
every way of calling it, typed outputs, recorded calls; a miss names the nearest input. The switch makes any real
load or hub request fail, naming itself, in process and from the environment."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from typing import Literal

import pytest
from pydantic import BaseModel

from pawfn import GPT2, OutputTypeError, PawConfig, PawFn, Qwen3_0_6B, RuntimeOptions, Torch
from pawfn.core.guard import ENVIRONMENT_SWITCH
from pawfn.testing import FakeMissError, RealProgramsBlockedError, allow_real_programs, block_real_programs, calls_of, fake
from tests.helpers.programs import TinyProgram


def _triage(program: PawFn[Qwen3_0_6B, Torch], text: str) -> str:
    """Application code, typed for the real program."""
    return program.run(text).upper()


def test_a_fake_is_the_program_it_stands_for_and_records_its_calls() -> None:
    program = fake(PawFn[Qwen3_0_6B, Torch], {"Server down!": "immediate", "Lunch?": " later "})
    assert PawFn[Qwen3_0_6B, Torch].narrow(program) is program and program.model_type() is Qwen3_0_6B and program.backend_type() is Torch
    assert _triage(program, "Server down!") == "IMMEDIATE"
    assert program.run_batch(["Lunch?", "Server down!"]) == ["later", "immediate"]  # stripped, as every call's output
    assert asyncio.run(program.arun("Lunch?")) == "later"
    assert program.submit("Server down!").result().text == "immediate"
    options = RuntimeOptions(max_tokens=3)
    cut = program.generate("Server down!", options)
    assert (cut.text, cut.stop_reason) == ("imm", "max_tokens")
    assert [(call.input, call.options.max_tokens) for call in calls_of(program)][-1] == ("Server down!", 3)
    stopped = program.generate("Server down!", RuntimeOptions(stop=("di", "at")))
    assert (stopped.text, stopped.stop_reason, len(stopped.token_ids)) == ("imme", "stop", 6)  # the stop's tokens were generated
    assert len(calls_of(program)) == 7  # run, two in the batch, arun, submit, two generates


def test_a_fake_streams_its_answer_as_it_comes() -> None:
    program = fake(PawFn[GPT2, Torch], lambda text: text[::-1])

    async def follow() -> list[str]:
        async with await program.astream("abc") as stream:
            return [piece async for piece in stream]

    assert "".join(asyncio.run(follow())) == "cba"


def test_a_miss_names_the_nearest_input() -> None:
    program = fake(PawFn[Qwen3_0_6B, Torch], {"Server down!": "immediate", "Lunch?": "later"})
    with pytest.raises(FakeMissError, match="no answer for 'Server down'; the nearest it knows is 'Server down!'"):
        program.run("Server down")


def test_typed_outputs_parse_the_fakes_answers() -> None:
    class Ticket(BaseModel):
        urgency: Literal["high", "low"]

    program = fake(PawFn[Qwen3_0_6B, Torch], {"a": '{"urgency": "high"}', "b": "high", "c": "soon"})
    assert program.returning(Ticket).run("a") == Ticket(urgency="high")
    label = program.returning(Literal["high", "low"])
    assert label.run("b") == "high"
    with pytest.raises(OutputTypeError):
        label.run("c")


def test_the_switch_blocks_real_loads_and_hub_requests_naming_itself(qwen3_program: TinyProgram) -> None:
    base = qwen3_program.interpreter.gguf_path
    with block_real_programs():
        with pytest.raises(RealProgramsBlockedError, match=r"opening a program on Torch .*block_real_programs\(\)"):
            PawFn[Qwen3_0_6B, Torch].load_sync(qwen3_program.folder, base=base)
        config = PawConfig.model_validate({"api_url": "http://127.0.0.1:9", "offline": False, "progress": False})
        with pytest.raises(RealProgramsBlockedError, match="127.0.0.1:9"):
            PawFn[Qwen3_0_6B, Torch].load_sync("someone/program", config=config)
        assert fake(PawFn[Qwen3_0_6B, Torch], {"x": "y"}).run("x") == "y"  # fakes still answer
        with allow_real_programs():
            PawFn[Qwen3_0_6B, Torch].load_sync(qwen3_program.folder, base=base).close()
    PawFn[Qwen3_0_6B, Torch].load_sync(qwen3_program.folder, base=base).close()  # off again after the block


def test_the_environment_switch_reaches_child_processes(qwen3_program: TinyProgram) -> None:
    script = "import sys\nfrom pawfn import PawFn, Qwen3_0_6B, Torch\nPawFn[Qwen3_0_6B, Torch].load_sync(sys.argv[1], base=sys.argv[2])\n"
    done = subprocess.run(
        [sys.executable, "-c", script, str(qwen3_program.folder), str(qwen3_program.interpreter.gguf_path)],
        capture_output=True,
        text=True,
        env={**os.environ, ENVIRONMENT_SWITCH: "1"},
        timeout=120,
        check=False,
    )
    assert done.returncode != 0 and "RealProgramsBlockedError" in done.stderr and f"{ENVIRONMENT_SWITCH}=1" in done.stderr
