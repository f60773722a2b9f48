"""Record and replay: real calls logged to a cassette, then replayed with real programs switched off: the same
outputs, typed values and stop reasons for the same input and options; any other call a miss naming what was recorded."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Literal

import pytest

from pawfn import GPT2, ConfigError, PawConfig, PawFn, Qwen3_0_6B, RuntimeOptions, Torch
from pawfn.calls.log import call_log_for
from pawfn.testing import FakeMissError, allow_real_programs, block_real_programs, calls_of, replay
from tests.helpers.programs import TinyProgram

Label = Literal["immediate", "later", "never"]
INPUTS = ["hello", "the lazy dog", "numbers 1 2 3"]


def _record(program: TinyProgram, cassette: Path) -> tuple[list[str], list[str], list[str]]:
    config = PawConfig(call_log=cassette, progress=False)
    with PawFn[Qwen3_0_6B, Torch].load_sync(program.folder, base=program.interpreter.gguf_path, config=config) as real:
        short = [real.run(text, RuntimeOptions(max_tokens=4)) for text in INPUTS]
        longer = [real.generate(text, RuntimeOptions(max_tokens=9, seed=3)).text for text in INPUTS]
        labels: list[str] = [real.returning(Label).run(text, RuntimeOptions(max_tokens=16)) for text in INPUTS]
    log = call_log_for(config)
    assert log is not None
    log.flush()
    return short, longer, labels


def test_a_replayed_program_answers_as_the_recorded_one_with_no_model(qwen3_program: TinyProgram, tmp_path: Path) -> None:
    cassette = tmp_path / "cassette.jsonl"
    short, longer, labels = _record(qwen3_program, cassette)
    block_real_programs()
    try:
        program = replay(PawFn[Qwen3_0_6B, Torch], cassette)
        assert type(program) is PawFn[Qwen3_0_6B, Torch]
        assert [program.run(text, RuntimeOptions(max_tokens=4)) for text in INPUTS] == short
        generations = [program.generate(text, RuntimeOptions(max_tokens=9, seed=3)) for text in INPUTS]
        assert [generation.text for generation in generations] == longer
        assert [program.returning(Label).run(text, RuntimeOptions(max_tokens=16)) for text in INPUTS] == labels
        assert [call.input for call in calls_of(program)] == INPUTS * 3
        with pytest.raises(FakeMissError, match=r"has 'hello' recorded with max_tokens=4, .* not max_tokens=5"):
            program.run("hello", RuntimeOptions(max_tokens=5))
        with pytest.raises(FakeMissError, match=r"no call of 'the lazy cat'; the nearest recorded input is 'the lazy dog'"):
            program.run("the lazy cat", RuntimeOptions(max_tokens=4))
    finally:
        allow_real_programs()
    with pytest.raises(ConfigError, match=r"recorded on Qwen/Qwen3-0\.6B, which GPT2 does not run"):
        replay(PawFn[GPT2, Torch], cassette)


def test_a_cassette_of_several_programs_needs_one_named(tmp_path: Path) -> None:
    cassette = tmp_path / "two.jsonl"
    rows = [
        {"time": "t", "program_id": program_id, "program": "p", "interpreter": "Qwen/Qwen3-0.6B", "backend": "torch", "input": "x", "output": out}
        for program_id, out in (("1111aaaa2222bbbb3333", "one"), ("4444cccc5555dddd6666", "two"))
    ]
    cassette.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    with pytest.raises(ConfigError, match=r"holds calls of 2 programs .*; name one with program_id="):
        replay(PawFn[Qwen3_0_6B, Torch], cassette)
    assert replay(PawFn[Qwen3_0_6B, Torch], cassette, program_id="4444cccc5555dddd6666").run("x") == "two"
    cassette.write_text("not a record\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=r"two\.jsonl: line 1 is not a call record"):
        replay(PawFn[Qwen3_0_6B, Torch], cassette)
