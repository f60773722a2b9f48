"""Record and replay: a call log written by real calls (`PawConfig(call_log=...)`, `PAW_CALL_LOG`) is a cassette;
`replay(kind, cassette)` is a program of that type that answers each call with the output recorded for the same
program, input and options, with no model."""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import TypeVar

from pydantic import ValidationError

from ..api.function import PawFn
from ..calls.log import CallRecord, logged_input
from ..calls.prompt import CallInput
from ..core.backends import Backend
from ..core.config import PawConfig
from ..core.errors import ConfigError, describe_validation_error
from ..core.models import InterpreterModel
from ..core.options import RuntimeOptions
from ..core.results import StopReason
from ..formats.bundle import ProgramMeta
from .fakes import FakeMissError, FakeRuntime

__all__ = ["ReplayRuntime", "replay"]

M = TypeVar("M", bound=InterpreterModel)
B = TypeVar("B", bound=Backend)

CallKey = tuple[str, int | None, float, float, int | None, str | None]
"""What a recorded call is found by: input (arguments joined by newlines, images as `[image]`), max_tokens,
temperature, top_p, seed and the typed output's format."""
MAX_CASSETTE_BYTES = 256 * 1024 * 1024


def _input_text(logged: str | list[str]) -> str:
    """A recorded input as one key: a numbered template's arguments joined by newlines."""
    return logged if isinstance(logged, str) else "\n".join(logged)


def _key(text: str, options: RuntimeOptions) -> CallKey:
    response_format = None if options.response_format is None else options.response_format.type
    return (text, options.max_tokens, options.temperature, options.top_p, options.seed, response_format)


def _record_key(record: CallRecord) -> CallKey:
    return (_input_text(record.input), record.max_tokens, record.temperature, record.top_p, record.seed, record.response_format)


def _options_of(key: CallKey) -> str:
    names = ("max_tokens", "temperature", "top_p", "seed", "response_format")
    return ", ".join(f"{name}={value!r}" for name, value in zip(names, key[1:], strict=True))


class ReplayRuntime(FakeRuntime):
    """Answers each call with the recorded output of the same input and options (as the real call stopped)."""

    def __init__(self, recorded: dict[CallKey, CallRecord], source: Path, n_ctx: int, arity: int) -> None:
        super().__init__({}, n_ctx, arity)
        self._recorded = recorded
        self._source = source

    @property
    def engine(self) -> str | None:
        return f"pawfn.testing replay of {self._source} (no model)"

    def reply(self, text: CallInput, options: RuntimeOptions) -> tuple[str, StopReason]:
        key = _key(_input_text(logged_input(text)), options)
        record = self._recorded.get(key)
        if record is None or record.output is None:
            raise FakeMissError(self._miss(key))
        stop: StopReason = "max_tokens" if record.stop_reason == "max_tokens" else "stop" if record.stop_reason == "stop" else "eos"
        return record.output, stop

    def _miss(self, key: CallKey) -> str:
        same_input = [known for known in self._recorded if known[0] == key[0]]
        if same_input:
            return (
                f"{self._source} has {key[0]!r} recorded with {_options_of(same_input[0])}, not {_options_of(key)}; "
                "call it with those options, or record the call again"
            )
        nearest = difflib.get_close_matches(key[0], sorted({known[0] for known in self._recorded}), n=1, cutoff=0.0)
        hint = f"; the nearest recorded input is {nearest[0]!r}" if nearest else ""
        return f"{self._source} has no call of {key[0]!r}{hint}; record it (run the real program with PawConfig(call_log=...))"


def _read_cassette(path: Path) -> list[CallRecord]:
    try:
        size = path.stat().st_size
        if size > MAX_CASSETTE_BYTES:
            raise ConfigError(f"{path}: {size} bytes, more than a cassette holds ({MAX_CASSETTE_BYTES}); keep the calls your tests make")
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read the cassette ({exc}); record one with PawConfig(call_log={str(path)!r})") from exc
    records: list[CallRecord] = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            records.append(CallRecord.model_validate_json(line))
        except ValidationError as exc:
            raise ConfigError(f"{path}: line {number} is not a call record ({describe_validation_error(exc)}); record the cassette again") from None
    return records


def replay(
    kind: type[PawFn[M, B]],
    cassette: str | Path,
    *,
    program_id: str | None = None,
    n_ctx: int = 2048,
    arity: int = 1,
    config: PawConfig | None = None,
) -> PawFn[M, B]:
    """A `kind` program that answers from `cassette` (a call log of real calls), with no model: each call gets the
    output recorded for the same input and options (the last, where a call was recorded twice); any other call
    raises `FakeMissError` naming the nearest recorded input. `program_id` picks one program's calls from a cassette
    that holds several; `calls_of` lists the calls it answered."""
    path = Path(cassette)
    records = [record for record in _read_cassette(path) if record.output is not None]
    programs = sorted({str(record.program_id) for record in records})
    if program_id is not None:
        records = [record for record in records if record.program_id == program_id]
    elif len(programs) > 1:
        raise ConfigError(f"{path} holds calls of {len(programs)} programs ({', '.join(programs)}); name one with program_id=")
    if not records:
        which = "" if program_id is None else f" of program {program_id}"
        raise ConfigError(f"{path} holds no answered call{which}; record some with PawConfig(call_log={str(path)!r})")
    model = kind.model_type()
    strangers = sorted({record.interpreter for record in records if not model.accepts(record.interpreter)})
    if strangers:
        raise ConfigError(
            f"{path} was recorded on {', '.join(strangers)}, which {model.__name__} does not run; replay it as that interpreter's PawFn"
        )
    recorded = {_record_key(record): record for record in records}
    meta = ProgramMeta(interpreter=records[0].interpreter, program_id=records[0].program_id)
    return kind(ReplayRuntime(recorded, path, n_ctx, arity), meta, path, config or PawConfig(progress=False), 0.0)
