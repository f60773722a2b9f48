"""The HTTP app's own rules (queue limit, streaming's slot, error shapes) on a scripted `ProgramService`, in process:
deterministic where the end-to-end tests depend on timing."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncGenerator, Generator, Sequence
from contextlib import contextmanager

import httpx
import pytest
from hypothesis import strategies as st
from hypothesis import given

from pawfn import ContextOverflowError, NotFoundError, RuntimeOptions
from pawfn.core.protocol import RunBatchResponse, RunResponse, ServedProgram, StreamPiece
from pawfn.core.results import Generation, Timings
from pawfn.calls.runtime import CallInput
from pawfn.serve import ServeSettings
from pawfn.serve.service import ServiceCounters
from tests.helpers.servers import free_port
from tests.test_fuzz import FUZZ

pytest.importorskip("fastapi", reason="pawfn serve needs the serve extra")

from fastapi import FastAPI  # noqa: E402 - after the skip: the extra

from pawfn.serve.app import create_app  # noqa: E402 - after the skip: it needs the extra


def _generation(text: str) -> Generation:
    timings = Timings(tokenize_ms=0, prompt_ms=0, generate_ms=0, total_ms=1)
    return Generation(text=text, token_ids=(1, 2), prefix_tokens=3, prompt_tokens=4, stop_reason="eos", timings=timings)


class ScriptedService:
    """Calls wait for `release`; `stream` yields two pieces, then waits too. Records what was cancelled."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.started = 0
        self.cancelled = 0

    async def programs(self) -> list[ServedProgram]:
        return [await self.info("p")]

    async def info(self, reference: str) -> ServedProgram:
        if reference != "p":
            raise NotFoundError(f"program {reference!r} is not served here", status=404)
        return ServedProgram(
            name="p", program_id=None, references=["p"], interpreter="gpt2", model="GPT2", backend="torch", n_ctx=64, prefix_tokens=3
        )

    async def run(self, reference: str, text: CallInput, options: RuntimeOptions) -> RunResponse:
        await self.info(reference)
        if text == "overflow":
            raise ContextOverflowError(60, 10, 64)
        assert isinstance(text, str)
        self.started += 1
        try:
            await self.release.wait()
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        return RunResponse(program="p", generation=_generation(text))

    async def run_batch(self, reference: str, texts: Sequence[str], options: RuntimeOptions) -> RunBatchResponse:
        return RunBatchResponse(program="p", generations=[(await self.run(reference, t, options)).generation for t in texts])

    async def stream(self, reference: str, text: CallInput, options: RuntimeOptions) -> AsyncGenerator[StreamPiece | RunResponse, None]:
        await self.info(reference)
        yield StreamPiece(text="a")
        yield StreamPiece(text="b")
        yield await self.run(reference, text, options)

    async def load_program(self, reference: str) -> ServedProgram:
        return await self.info(reference)

    async def unload_program(self, reference: str) -> ServedProgram:
        return await self.info(reference)

    async def tokenize(self, reference: str, text: CallInput, options: RuntimeOptions) -> list[int]:
        return [1]

    def counters(self) -> ServiceCounters:
        return ServiceCounters()

    def served_count(self) -> int:
        return 1

    async def aclose(self) -> None:
        pass


def _client(service: ScriptedService, settings: ServeSettings | None = None) -> httpx.AsyncClient:
    app = create_app(service, settings)
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test")


def test_the_queue_counts_accepted_calls_and_frees_them_when_they_end() -> None:
    async def scenario() -> None:
        service = ScriptedService()
        async with _client(service, ServeSettings(max_queue=3)) as client:
            held = [asyncio.create_task(client.post("/v1/programs/p/run", json={"input": str(n)})) for n in range(3)]
            while service.started < 3:
                await asyncio.sleep(0.01)
            refused = await client.post("/v1/programs/p/run", json={"input": "x"})
            assert refused.status_code == 429 and refused.headers["retry-after"] == "1"
            assert refused.json()["error"] == "queue_full" and "at most 3" in refused.json()["message"]
            batch = await client.post("/v1/programs/p/run_batch", json={"inputs": ["a", "b"]})
            assert batch.status_code == 429  # a batch counts each of its calls
            assert (await client.get("/healthz")).json()["queued"] == 3
            service.release.set()
            assert [(await task).status_code for task in held] == [200, 200, 200]
            assert (await client.get("/healthz")).json()["queued"] == 0
            assert (await client.post("/v1/programs/p/run_batch", json={"inputs": ["a", "b"]})).status_code == 200

    asyncio.run(scenario())


def test_errors_keep_their_status_and_shape() -> None:
    async def scenario() -> None:
        async with _client(ScriptedService()) as client:
            missing = await client.post("/v1/programs/q/run", json={"input": "x"})
            overflow = await client.post("/v1/programs/p/run", json={"input": "overflow"})
            no_route = await client.get("/v2/nothing")
            stream_missing = await client.post("/v1/programs/q/stream", json={"input": "x"})
            for response, status, code in (
                (missing, 404, "program_not_found"),
                (overflow, 422, "context_overflow"),
                (no_route, 404, "not_found"),
                (stream_missing, 404, "program_not_found"),
            ):
                assert (response.status_code, response.json()["error"]) == (status, code)
                assert response.json()["request_id"] == response.headers["x-request-id"]
            assert (await client.get("/healthz")).json()["queued"] == 0  # refused streams gave their slot back

    asyncio.run(scenario())


@contextmanager
def _uvicorn(app: FastAPI) -> Generator[str, None, None]:
    """`app` on a real uvicorn server in a thread (httpx's ASGI transport buffers whole responses: no streaming)."""
    import uvicorn

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)


def test_a_stream_holds_one_slot_until_its_last_event_and_a_client_that_leaves_frees_it() -> None:
    service = ScriptedService()
    loop_release = threading.Event()

    async def run_with_release(reference: str, text: CallInput, options: RuntimeOptions) -> RunResponse:
        service.started += 1
        try:
            while not loop_release.is_set():
                await asyncio.sleep(0.01)
        except asyncio.CancelledError:
            service.cancelled += 1
            raise
        return RunResponse(program="p", generation=_generation(str(text)))

    service.run = run_with_release  # type: ignore[method-assign]  # a thread-safe release for the server's loop
    with _uvicorn(create_app(service, ServeSettings(max_queue=1))) as url, httpx.Client(base_url=url, timeout=10) as client:
        with client.stream("POST", "/v1/programs/p/stream", json={"input": "x"}) as response:
            assert response.status_code == 200
            lines = response.iter_lines()
            assert next(lines) == "event: token"
            refused = client.post("/v1/programs/p/run", json={"input": "y"})
            assert (refused.status_code, refused.json()["error"]) == (429, "queue_full")
            loop_release.set()
            assert "event: done" in list(lines)
        assert client.get("/healthz").json()["queued"] == 0
        loop_release.clear()
        with client.stream("POST", "/v1/programs/p/stream", json={"input": "x"}) as response:
            assert next(response.iter_lines()) == "event: token"
        deadline = time.monotonic() + 10  # the client left mid-stream: the call is cancelled, its slot freed
        while (client.get("/healthz").json()["queued"], service.cancelled) != (0, 1) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert (client.get("/healthz").json()["queued"], service.cancelled) == (0, 1)


_FINITE = st.floats(allow_nan=False, allow_infinity=False)
"""JSON has no NaN or infinity (bodies that spell them are among the raw bytes)."""
_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=10), children, max_size=4),
    max_leaves=12,
)
_FIELDS = st.fixed_dictionaries(
    {},
    optional={
        "input": _JSON | st.text(max_size=40),
        "inputs": _JSON | st.lists(st.text(max_size=10), max_size=70),
        "options": _JSON
        | st.fixed_dictionaries(
            {},
            optional={
                "max_tokens": _JSON | st.integers(-5, 2000),
                "temperature": _JSON | _FINITE,
                "seed": _JSON | st.integers(),
                "top_p": _JSON | _FINITE,
                "parse_special_in_input": _JSON,
            },
        ),
        "program_id": _JSON | st.just("p"),
        "max_tokens": _JSON | st.integers(),
        "temperature": _JSON | _FINITE,
    },
)
_ROUTES = (
    "/v1/programs/p/run",
    "/v1/programs/p/run_batch",
    "/v1/programs/p/tokenize",
    "/api/v1/infer",
    "/v1/programs/q/run",
    "/v1/programs/p/stream",
)


@FUZZ
@given(
    route=st.sampled_from(_ROUTES),
    body=_FIELDS | _JSON,
    raw=st.none() | st.binary(max_size=64) | st.sampled_from([b'{"input": NaN}', b'{"input": "x", "options": {"temperature": Infinity}}']),
)
def test_any_body_gets_an_answer_or_a_json_error_never_a_crash(route: str, body: object, raw: bytes | None) -> None:
    async def scenario() -> None:
        service = ScriptedService()
        service.release.set()
        async with _client(service, ServeSettings(max_body_bytes=2048, max_batch_inputs=64)) as client:
            if raw is None:
                response = await client.post(route, json=body)
            else:
                response = await client.post(route, content=raw, headers={"content-type": "application/json"})
            assert response.status_code in (200, 400, 404, 413, 422, 429), response.text
            if response.status_code != 200:
                error = response.json()
                assert set(error) == {"error", "message", "request_id"} and error["message"]

    asyncio.run(scenario())


def test_a_body_not_utf8_and_an_oversized_one_are_named_and_counted() -> None:
    """A body that is not UTF-8 gets 422 naming the byte (FastAPI alone answers 400 "error parsing the body"); a 413 for
    a body over the limit carries the request id of its header and is counted like every other answer."""

    async def scenario() -> None:
        async with _client(ScriptedService(), ServeSettings(max_body_bytes=100)) as client:
            encoded = await client.post("/v1/programs/p/run", content=b'{"input": "\xff\xfe"}', headers={"content-type": "application/json"})
            assert encoded.status_code == 422 and encoded.json()["error"] == "invalid_encoding"
            assert "0xff at offset 11" in encoded.json()["message"]
            large = await client.post("/v1/programs/p/run", json={"input": "x" * 200})
            assert large.status_code == 413 and large.json()["error"] == "body_too_large"
            for response in (encoded, large):
                assert response.json()["request_id"] == response.headers["x-request-id"]
            counted = (await client.get("/metrics")).text
            assert 'pawfn_requests_total{route="unmatched",status="413"} 1.0' in counted
            assert 'status="422"} 1.0' in counted

    asyncio.run(scenario())
