"""The call log: one JSON line per call (`PawConfig(call_log=...)`, `PAW_CALL_LOG`, `pawfn serve --call-log`), off by
default. Written by a thread of its own (a decode step never waits on the disk), rotated by size, private to its owner
(0600: it holds your users' inputs), with a hook that redacts or drops a record before it is written.
`pawfn eval --from-log` turns the lines into cases."""

from __future__ import annotations

import atexit
import contextlib
import contextvars
import importlib
import logging
import os
import queue
import threading
from collections.abc import Callable, Generator
from concurrent.futures import Future
from datetime import UTC, datetime
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from ..core.config import EngineSettings
from ..core.errors import ConfigError
from ..core.options import RuntimeOptions
from ..core.results import Generation, Timings
from .prompt import CallInput

__all__ = ["CallLog", "CallRecord", "CallSite", "Redactor", "call_log_for", "logged_input", "set_call_log_redactor", "request_id", "with_request_id"]

_LOG = logging.getLogger("pawfn")
MAX_REQUEST_ID_CHARS = 128
"""A request id is the client's `x-request-id` header on a server: logged cut to this length."""

_request_id: contextvars.ContextVar[str | None] = contextvars.ContextVar("pawfn_request_id", default=None)


def request_id() -> str | None:
    """The id of the request this code runs for (set by `pawfn serve` around each request), else None."""
    return _request_id.get()


@contextlib.contextmanager
def with_request_id(value: str | None) -> Generator[None]:
    """Calls started inside the block are logged with request id `value`."""
    token = _request_id.set(None if value is None else value[:MAX_REQUEST_ID_CHARS])
    try:
        yield
    finally:
        _request_id.reset(token)


class CallRecord(BaseModel):
    """One logged call: what was asked, what came back, how and how long; `expected` is yours to fill (a corrected
    output) before `pawfn eval --from-log` turns the line into a case."""

    model_config = ConfigDict(frozen=True, extra="allow")

    time: str
    """When the call ended, ISO 8601 in UTC."""
    program_id: str | None = None
    program: str
    """The program's source: its bundle path or the reference it was loaded by."""
    interpreter: str
    backend: str
    input: str | list[str]
    """The input; a numbered template's arguments as a list, each image as `[image]`."""
    output: str | None = None
    error: str | None = None
    """The exception's type and message, for a call that failed (then no output)."""
    max_tokens: int | None = None
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None
    response_format: str | None = None
    """A typed call's output format (its kind), None for text."""
    numerics: str | None = None
    prefix_tokens: int | None = None
    prompt_tokens: int | None = None
    generated_tokens: int | None = None
    stop_reason: str | None = None
    timings: Timings | None = None
    request_id: str | None = None
    expected: str | None = None


Redactor = Callable[[CallRecord], CallRecord | None]
"""Sees each record before it is written: returns it (changed, e.g. `record.model_copy(update={"input": "..."})`),
or None to drop it. A redactor that raises drops the record (never written unredacted) and is logged once."""


class CallSite(BaseModel):
    """What every record of one program carries: which program, on what."""

    model_config = ConfigDict(frozen=True)

    program_id: str | None
    program: str
    interpreter: str
    backend: str


def logged_input(given: CallInput) -> str | list[str]:
    """A call's input as its record holds it: the text, or a numbered template's arguments with each image `[image]`."""
    if isinstance(given, tuple):
        return [argument if isinstance(argument, str) else "[image]" for argument in given]
    return given


class CallLog:
    """Appends records to `path` from a writer thread; a file past `max_bytes` is moved to `path.1` (`.1` to `.2`,
    ... keeping `backups` old files) before the next line."""

    def __init__(self, path: Path, max_bytes: int, backups: int, redact: Redactor | None = None) -> None:
        self.path = path
        self.max_bytes = max_bytes
        self.backups = backups
        self.redact = redact
        self._queue: queue.SimpleQueue[CallRecord | Future[None] | None] = queue.SimpleQueue()
        self._warned = False
        self._writer = threading.Thread(target=self._write_all, name=f"pawfn-call-log-{path.name}", daemon=True)
        self._writer.start()
        atexit.register(self.flush)

    def record(
        self,
        site: CallSite,
        given: CallInput,
        options: RuntimeOptions,
        generation: Generation | None,
        error: BaseException | None,
        request: str | None,
    ) -> None:
        """Queue one call's record (returns at once)."""
        fields: dict[str, object] = {
            "time": datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z"),
            "input": logged_input(given),
            "max_tokens": options.max_tokens,
            "temperature": options.temperature,
            "top_p": options.top_p,
            "seed": options.seed,
            "response_format": None if options.response_format is None else options.response_format.type,
            "request_id": request,
        }
        if generation is not None:
            fields |= {"output": generation.text, "numerics": generation.numerics, "prefix_tokens": generation.prefix_tokens}
            fields |= {"prompt_tokens": generation.prompt_tokens, "generated_tokens": len(generation.token_ids)}
            fields |= {"stop_reason": generation.stop_reason, "timings": generation.timings}
        if error is not None:
            fields["error"] = f"{type(error).__name__}: {error}"
        self._queue.put(CallRecord.model_validate(site.model_dump() | fields))

    def flush(self, timeout_s: float = 10.0) -> None:
        """Wait until every record queued so far is written (or `timeout_s` passes)."""
        done: Future[None] = Future()
        self._queue.put(done)
        with contextlib.suppress(TimeoutError):
            done.result(timeout_s)

    def _write_all(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            if isinstance(item, Future):
                item.set_result(None)
                continue
            try:
                self._write(item)
            except Exception:  # noqa: BLE001 - a log that cannot be written must never end the calls it describes
                if not self._warned:
                    self._warned = True
                    _LOG.exception("cannot write the call log %s; calls go on unlogged", self.path)

    def _write(self, record: CallRecord) -> None:
        if self.redact is not None:
            try:
                redacted = self.redact(record)
            except Exception:  # noqa: BLE001 - the user's hook: a failure drops the record, never writes it unredacted
                if not self._warned:
                    self._warned = True
                    _LOG.exception("the call log's redactor raised; its records are dropped")
                return
            if redacted is None:
                return
            record = redacted
        line = (record.model_dump_json(exclude_none=True) + "\n").encode("utf-8")
        try:
            size = self.path.stat().st_size
        except FileNotFoundError:
            size = 0
        if size and size + len(line) > self.max_bytes:
            self._rotate()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        descriptor = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(descriptor, line)
        finally:
            os.close(descriptor)

    def _rotate(self) -> None:
        for index in range(self.backups, 0, -1):
            older = self.path.with_name(f"{self.path.name}.{index}")
            newer = self.path if index == 1 else self.path.with_name(f"{self.path.name}.{index - 1}")
            if index == self.backups:
                older.unlink(missing_ok=True)
            if newer.exists():
                os.replace(newer, older)
        if self.backups == 0:
            self.path.unlink(missing_ok=True)


_LOGS: dict[Path, CallLog] = {}
_LOGS_LOCK = threading.Lock()


def _redactor(path: str | None) -> Redactor | None:
    """The function `module:function` names, for `call_log_redact`."""
    if path is None:
        return None
    module_name, _, function_name = path.partition(":")
    try:
        found: object = getattr(importlib.import_module(module_name), function_name)
    except (ImportError, AttributeError, ValueError) as exc:
        raise ConfigError(f"call_log_redact {path!r}: cannot import it ({exc}); name a function as module:function") from exc
    if not callable(found):
        raise ConfigError(f"call_log_redact {path!r} is not a function; name one as module:function")
    redactor: Redactor = found  # pyright: ignore[reportAssignmentType]  # a user's callable, checked as far as Python allows
    return redactor


def call_log_for(settings: EngineSettings) -> CallLog | None:
    """The process's one writer for `settings.call_log` (programs logging to one file share it), None when off."""
    if settings.call_log is None:
        return None
    path = settings.call_log.expanduser().resolve()
    with _LOGS_LOCK:
        log = _LOGS.get(path)
        if log is None:
            log = _LOGS[path] = CallLog(path, settings.call_log_max_bytes, settings.call_log_backups, _redactor(settings.call_log_redact))
        return log


def set_call_log_redactor(settings: EngineSettings, redact: Redactor | None) -> None:
    """Set the redactor of `settings.call_log`'s writer in Python (a function rather than a `module:function` name)."""
    log = call_log_for(settings)
    if log is None:
        raise ConfigError("no call log is configured: set PawConfig(call_log=PATH) (or PAW_CALL_LOG) first")
    log.redact = redact
