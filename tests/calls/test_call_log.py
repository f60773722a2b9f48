"""The call log: one JSON line per call from every call path, the failure of a call logged as such, a file private to
its owner, rotated by size with nothing torn, a redactor that changes or drops records (and never lets one through
when it fails), the environment variable, request ids from a server, and `pawfn eval --from-log`."""

from __future__ import annotations

import asyncio
import json
import os
import stat
import time
from pathlib import Path
from typing import Literal

import httpx
import pytest

from pawfn import PawConfig, PawFn, Qwen3_0_6B, RuntimeOptions, Torch
from pawfn.calls.log import CallRecord, call_log_for, set_call_log_redactor
from pawfn.cli import main
from pawfn.evals import CasesError, log_cases
from pawfn.testing import FakeMissError, fake
from tests.helpers.programs import TinyProgram
from tests.helpers.servers import start_server

ANSWERS = {"Server down!": "immediate", "Lunch?": "later", "Newsletter": "never"}


def _records(path: Path) -> list[CallRecord]:
    return [CallRecord.model_validate_json(line) for line in path.read_text(encoding="utf-8").splitlines()]


def _flush(config: PawConfig) -> None:
    log = call_log_for(config)
    assert log is not None
    log.flush()


def test_every_call_path_writes_one_record(tmp_path: Path) -> None:
    config = PawConfig(call_log=tmp_path / "calls.jsonl", progress=False)
    program = fake(PawFn[Qwen3_0_6B, Torch], ANSWERS, program_id="a6b454023d41ac9ca845", config=config)
    assert program.run("Server down!") == "immediate"
    generation = program.generate("Lunch?", RuntimeOptions(max_tokens=3, seed=7))
    assert program.submit("Newsletter").result().text == "never"
    assert program.run_batch(["Lunch?", "Server down!"]) == ["later", "immediate"]
    assert program.returning(Literal["immediate", "later", "never"]).run("Server down!") == "immediate"

    async def streamed() -> str:
        stream = await program.astream("Newsletter")
        return "".join([piece async for piece in stream])

    assert asyncio.run(streamed()) == "never"
    with pytest.raises(FakeMissError):
        program.run("something else")
    _flush(config)
    records = _records(tmp_path / "calls.jsonl")
    assert [record.input for record in records] == [
        "Server down!",
        "Lunch?",
        "Newsletter",
        "Lunch?",
        "Server down!",
        "Server down!",
        "Newsletter",
        "something else",
    ]
    assert [record.output for record in records][:7] == ["immediate", "lat", "never", "later", "immediate", "immediate", "never"]
    second = records[1]
    assert (second.max_tokens, second.seed, second.stop_reason) == (3, 7, "max_tokens")
    assert second.generated_tokens == len(generation.token_ids) and second.timings == generation.timings
    assert {(record.program_id, record.interpreter, record.backend) for record in records} == {("a6b454023d41ac9ca845", "Qwen/Qwen3-0.6B", "torch")}
    assert records[5].response_format == "choices" and records[0].response_format is None
    failed = records[-1]
    assert failed.output is None and failed.error is not None and failed.error.startswith("FakeMissError: ")
    assert stat.S_IMODE((tmp_path / "calls.jsonl").stat().st_mode) == 0o600  # it holds users' inputs


def test_no_log_unless_asked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PAW_CALL_LOG", raising=False)
    assert PawConfig.from_env().call_log is None
    monkeypatch.setenv("PAW_CALL_LOG", str(tmp_path / "env.jsonl"))
    config = PawConfig.from_env(progress=False)
    assert config.call_log == tmp_path / "env.jsonl"
    fake(PawFn[Qwen3_0_6B, Torch], ANSWERS, config=config).run("Lunch?")
    _flush(config)
    assert [record.output for record in _records(tmp_path / "env.jsonl")] == ["later"]


def test_the_log_rotates_by_size_and_keeps_its_backups(tmp_path: Path) -> None:
    path = tmp_path / "calls.jsonl"
    config = PawConfig(call_log=path, call_log_max_bytes=4096, call_log_backups=2, progress=False)
    program = fake(PawFn[Qwen3_0_6B, Torch], lambda text: text.upper(), config=config)
    for index in range(200):
        program.run(f"input number {index:03d} " + "x" * 40)
    _flush(config)
    files = sorted(tmp_path.iterdir())
    assert files == [path, tmp_path / "calls.jsonl.1", tmp_path / "calls.jsonl.2"]
    assert all(file.stat().st_size <= 4096 for file in files)
    kept = [record for file in reversed(files) for record in _records(file)]  # every line whole JSON, oldest first
    numbers = [int(record.input.split()[2]) if isinstance(record.input, str) else -1 for record in kept]
    assert numbers == list(range(200 - len(numbers), 200))  # the newest calls, in order, none torn or lost in between


def test_a_redactor_changes_or_drops_records_and_a_failing_one_lets_nothing_through(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "my_redactors.py").write_text(
        "def redact(record):\n"
        "    if record.input == 'Newsletter':\n"
        "        return None\n"
        "    return record.model_copy(update={'input': '[redacted]'})\n"
        "def broken(record):\n"
        "    raise RuntimeError('bug in the hook')\n",
        encoding="utf-8",
    )
    monkeypatch.syspath_prepend(str(tmp_path))  # pyright: ignore[reportUnknownMemberType]  # pytest leaves `path` unannotated
    config = PawConfig(call_log=tmp_path / "redacted.jsonl", call_log_redact="my_redactors:redact", progress=False)
    program = fake(PawFn[Qwen3_0_6B, Torch], ANSWERS, config=config)
    for text in ANSWERS:
        program.run(text)
    _flush(config)
    assert [(record.input, record.output) for record in _records(tmp_path / "redacted.jsonl")] == [
        ("[redacted]", "immediate"),
        ("[redacted]", "later"),
    ]

    failing = PawConfig(call_log=tmp_path / "failing.jsonl", call_log_redact="my_redactors:broken", progress=False)
    fake(PawFn[Qwen3_0_6B, Torch], ANSWERS, config=failing).run("Server down!")
    _flush(failing)
    assert not (tmp_path / "failing.jsonl").exists()

    in_python = PawConfig(call_log=tmp_path / "python.jsonl", progress=False)
    set_call_log_redactor(in_python, lambda record: record.model_copy(update={"output": "***"}))
    fake(PawFn[Qwen3_0_6B, Torch], ANSWERS, config=in_python).run("Lunch?")
    _flush(in_python)
    assert [record.output for record in _records(tmp_path / "python.jsonl")] == ["***"]


def test_eval_from_log_turns_calls_into_cases(tmp_path: Path, qwen3_program: TinyProgram, capsys: pytest.CaptureFixture[str]) -> None:
    log = tmp_path / "calls.jsonl"
    config = PawConfig(call_log=log, progress=False)
    with PawFn[Qwen3_0_6B, Torch].load_sync(qwen3_program.folder, base=qwen3_program.interpreter.gguf_path, config=config) as program:
        outputs = [program.run(text, RuntimeOptions(max_tokens=6)) for text in ("hello", "the lazy dog", "numbers 1 2 3")]
    _flush(config)
    lines = log.read_text(encoding="utf-8").splitlines()
    corrected = json.loads(lines[1]) | {"expected": "a corrected answer"}  # what a reviewer writes into the line
    log.write_text("\n".join([lines[0], json.dumps(corrected), lines[2]]) + "\n", encoding="utf-8")
    cases = log_cases(log)
    assert [(case.input, case.expected, case.tags) for case in cases] == [
        ("hello", outputs[0], ("logged",)),
        ("the lazy dog", "a corrected answer", ("corrected",)),
        ("numbers 1 2 3", outputs[2], ("logged",)),
    ]
    with pytest.raises(CasesError, match=r"no call of program 0000000000000000ffff with an output"):
        log_cases(log, "0000000000000000ffff")
    status = main(
        ["eval", "--program", str(qwen3_program.folder), "--base", str(qwen3_program.interpreter.gguf_path), "--from-log", str(log)]
        + ["--max-tokens", "6", "--json", "--no-progress"]
    )
    report = json.loads(capsys.readouterr().out)["report"]
    assert status == 0 and (report["total"], report["correct"]) == (3, 2)
    assert {group["tag"]: group["correct"] for group in report["by_tag"]} == {"logged": 2, "corrected": 0}
    log.write_text(log.read_text(encoding="utf-8") + "{not json\n", encoding="utf-8")
    with pytest.raises(CasesError, match=r"calls\.jsonl: line 4: not a call record"):
        log_cases(log)


def test_a_servers_calls_carry_their_request_ids(tmp_path: Path, qwen3_program: TinyProgram) -> None:
    log = tmp_path / "served.jsonl"
    arguments = ["--program", f"tiny={qwen3_program.archive}", "--base", str(qwen3_program.interpreter.gguf_path), "--call-log", str(log)]
    server = start_server(*arguments, environment={"PAW_CACHE_DIR": str(tmp_path / "cache")})
    try:
        with httpx.Client(base_url=server.url, timeout=60) as client:
            for request_id in ("req-one", "req-two"):
                body = {"input": "hello", "options": {"max_tokens": 4}}
                response = client.post("/v1/programs/tiny/run", json=body, headers={"x-request-id": request_id})
                assert response.status_code == 200, response.text
        deadline = time.monotonic() + 30  # the writer thread follows the answers by a moment
        while time.monotonic() < deadline and (not log.exists() or len(log.read_text(encoding="utf-8").splitlines()) < 2):
            time.sleep(0.05)
    finally:
        server.stop()
    records = _records(log)  # the server flushed its log as it stopped
    assert [record.request_id for record in records] == ["req-one", "req-two"]
    assert all(record.input == "hello" and record.output is not None for record in records)
    assert stat.S_IMODE(os.stat(log).st_mode) == 0o600
