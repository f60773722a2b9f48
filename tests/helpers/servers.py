"""A real `pawfn serve` process on 127.0.0.1 for end-to-end tests, and a reader of its server-sent events."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import IO

import httpx

from pawfn.core.protocol import RunResponse


KEY = "test-key-0123"
AUTH = {"Authorization": f"Bearer {KEY}"}
INPUTS = ["Urgent: the server is down!", "hello world", "a b c d e f", "", "numbers 12345 and words"]
FIRST_ID, SECOND_ID = "a0a0a0a0a0a0a0a0a0a0", "b1b1b1b1b1b1b1b1b1b1"
"""Ids of the two tiny Qwen3 programs the shared test server holds (the second also as `tiny-second`)."""


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


@dataclass
class ServeProcess:
    """`python -m pawfn serve ...` and where it listens; `stop()` sends SIGTERM and returns the exit status (uvicorn
    re-raises the signal once it has shut down gracefully, so a clean stop is -SIGTERM)."""

    process: subprocess.Popen[str]
    url: str
    log: IO[str]

    def output(self) -> str:
        self.log.seek(0)
        return self.log.read()

    def stop(self, timeout_s: float = 60.0) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout_s)


def start_server(*arguments: str, environment: dict[str, str] | None = None, timeout_s: float = 90.0) -> ServeProcess:
    """Start `pawfn serve ARGUMENTS --port P` and wait until `/healthz` answers (its log on failure)."""
    port = free_port()
    log = tempfile.TemporaryFile("w+")
    process = subprocess.Popen(
        [sys.executable, "-m", "pawfn", "serve", *arguments, "--host", "127.0.0.1", "--port", str(port)],
        stdout=log,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, **(environment or {})},
    )
    server = ServeProcess(process, f"http://127.0.0.1:{port}", log)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise AssertionError(f"pawfn serve exited with {process.returncode}:\n{server.output()}")
        try:
            if httpx.get(f"{server.url}/healthz", timeout=1.0).status_code == 200:
                return server
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    process.kill()
    raise AssertionError(f"pawfn serve did not answer within {timeout_s} s:\n{server.output()}")


def run_concurrently(url: str, calls: list[tuple[str, str]], max_tokens: int, threads: int = 8) -> list[RunResponse]:
    """Each (program reference, input) as its own `POST /v1/programs/{ref}/run`, `threads` at a time; 200s only."""

    def run(call: tuple[str, str]) -> RunResponse:
        body = {"input": call[1], "options": {"max_tokens": max_tokens}}
        response = httpx.post(f"{url}/v1/programs/{call[0]}/run", json=body, headers=AUTH, timeout=120)
        assert response.status_code == 200, response.text
        return RunResponse.model_validate_json(response.content)

    with ThreadPoolExecutor(threads) as pool:
        return list(pool.map(run, calls))


def sse_events(lines: Iterator[str]) -> Iterator[tuple[str, dict[str, object]]]:
    """(event, data) pairs of a text/event-stream body."""
    event, data = "message", ""
    for line in lines:
        if line.startswith("event:"):
            event = line.removeprefix("event:").strip()
        elif line.startswith("data:"):
            data += line.removeprefix("data:").strip()
        elif not line and data:
            yield event, json.loads(data)
            event, data = "message", ""


def decode_steps(server: ServeProcess) -> float:
    """The server's decode steps so far (`pawfn_decode_steps_total`)."""
    text = httpx.get(f"{server.url}/metrics", headers=AUTH).text
    return next(float(line.split()[1]) for line in text.splitlines() if line.startswith("pawfn_decode_steps_total"))


def settled_steps(server: ServeProcess) -> float:
    """The decode steps once the queue is empty and nothing decodes any more."""
    deadline = time.monotonic() + 30
    while httpx.get(f"{server.url}/healthz").json()["queued"] and time.monotonic() < deadline:
        time.sleep(0.01)
    settled = decode_steps(server)
    while True:  # a cancelled row may take its last step just after its request has ended
        time.sleep(0.3)
        now = decode_steps(server)
        if now == settled:
            return settled
        assert time.monotonic() < deadline, f"decode steps still growing: {settled} -> {now}"
        settled = now


STOPPED = 1500
"""Fewer decode steps than this after a cancel proves the server stopped the call: the whole call is ~1,990 steps (to
the end of a 2,048-token context). How many a stop takes depends on the machine's load: 1,112 once on a busy CI
machine (0.5-1 s for the closed connection to reach the server), 1,020 and 1,112 on a quiet 2-core AMD EPYC, a few
hundred elsewhere."""


def wait_decoding(server: ServeProcess, before: float) -> None:
    """Wait until the server decodes a call that started after `before` steps."""
    deadline = time.monotonic() + 60
    while decode_steps(server) < before + 20 and time.monotonic() < deadline:
        time.sleep(0.01)
