"""`pawfn serve` as an attacker on the same network meets it: keys checked before bodies are read, operator routes
behind their own key, references that never reach the file system, programs named at start kept, failed loads not
retried for every request, bounded queue shares, generic 5xx bodies, and stalled sockets closed on a real server."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from pydantic import SecretStr

from pawfn import PawConfig, RuntimeOptions, Torch
from pawfn.core.errors import ConfigError, HubError, NotFoundError, PawError
from pawfn.core.protocol import RunBatchResponse, RunResponse
from pawfn.calls.runtime import CallInput
from pawfn.serve import ServeSettings
from pawfn.serve.launch import ServeTarget, resident_budget
from pawfn.serve.service import LocalPrograms, ProgramKeptError
from pawfn.serve.settings import ON_REQUEST_PROGRAMS
from tests.helpers.hub_server import HubServer
from tests.helpers.programs import INTERPRETER_IDS, TinyProgram
from tests.helpers.servers import FIRST_ID, ServeProcess, start_server
from tests.helpers.tiny_models import Array, random_lora, write_adapter_gguf, write_bundle, zip_bundle
from tests.serve.test_serve_app import ScriptedService

pytest.importorskip("fastapi", reason="pawfn serve needs the serve extra")

from fastapi import FastAPI  # noqa: E402 - after the skip: the extra
from starlette.types import Message  # noqa: E402 - after the skip: the extra

from pawfn.serve.app import create_app  # noqa: E402 - after the skip: it needs the extra

KEY, ADMIN = "client-key-1", "admin-key-2"
RUNTIME_ID = "tiny-qwen3-f32"
BASE_FILE = "tiny-qwen3.gguf"
GOOD, BROKEN = "c0c0c0c0c0c0c0c0c0c1", "c0c0c0c0c0c0c0c0c0c2"
OPTIONS = RuntimeOptions(max_tokens=4)


def _client(app: FastAPI, key: str | None = KEY, address: str = "127.0.0.1") -> httpx.AsyncClient:
    headers = {} if key is None else {"Authorization": f"Bearer {key}"}
    transport = httpx.ASGITransport(app=app, client=(address, 40000), raise_app_exceptions=False)  # a server answers, never raises
    return httpx.AsyncClient(transport=transport, base_url="http://pawfn", headers=headers)


# --- keys ---


def _answers_to_a_stalling_client(app: FastAPI, headers: list[tuple[bytes, bytes]], first: list[Message]) -> tuple[list[Message], bool]:
    """What `app` sends for a `POST /v1/programs/p/run` with `headers` whose client sends the messages
    `first` and then nothing, ever; and whether the app asked for more than those."""
    sent: list[Message] = []
    waited = False

    async def receive() -> Message:
        nonlocal waited
        if first:
            return first.pop(0)
        waited = True
        await asyncio.Event().wait()  # a client that stalls
        raise AssertionError("unreachable")

    async def send(message: Message) -> None:
        sent.append(message)

    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/v1/programs/p/run",
        "raw_path": b"/v1/programs/p/run",
        "query_string": b"",
        "root_path": "",
        "headers": [(b"content-type", b"application/json"), *headers],
        "client": ("127.0.0.1", 1),
        "server": ("127.0.0.1", 80),
        "state": {},
    }
    asyncio.run(asyncio.wait_for(app(scope, receive, send), 10))
    return sent, waited


def test_the_key_is_checked_before_a_byte_of_the_body_is_read() -> None:
    """A request without the key announcing a body it never sends is answered 401 at once, and the connection is
    closed: the body is never waited for (a malformed body without a key gets 401, not 422)."""
    app = create_app(ScriptedService(), ServeSettings(api_key=SecretStr(KEY)))
    sent, waited = _answers_to_a_stalling_client(app, [(b"content-length", b"1000")], [])
    assert not waited
    assert sent[0]["status"] == 401 and (b"connection", b"close") in sent[0]["headers"]

    async def malformed() -> None:
        async with _client(app, key=None) as client:
            refused = await client.post("/v1/programs/p/run", content=b"{not json", headers={"content-type": "application/json"})
            assert refused.status_code == 401 and refused.json()["error"] == "unauthorized"

    asyncio.run(malformed())


def test_operator_routes_need_the_admin_key_and_are_off_without_one() -> None:
    async def scenario() -> None:
        keyed = create_app(ScriptedService(), ServeSettings(api_key=SecretStr(KEY), admin_key=SecretStr(ADMIN)))
        async with _client(keyed) as client, _client(keyed, key=ADMIN) as operator, _client(keyed, key=None) as anonymous:
            for route in ("/v1/programs/p/load", "/v1/programs/p/unload"):
                assert (await client.post(route)).status_code == 401  # the clients' key is not the operator's
                assert (await anonymous.post(route)).status_code == 401
                assert (await operator.post(route)).status_code == 200
            assert (await operator.get("/v1/programs/p")).status_code == 200  # the admin key opens the clients' routes too
        for settings in (ServeSettings(api_key=SecretStr(KEY)), ServeSettings()):  # no admin key: the routes are off for everyone
            async with _client(create_app(ScriptedService(), settings)) as client:
                refused = await client.post("/v1/programs/p/unload")
                assert refused.status_code == 403 and refused.json()["error"] == "operator_routes_off"
                assert "--admin-key-env" in refused.json()["message"]

    asyncio.run(scenario())


# --- bodies, queues and errors ---


def test_a_body_that_trickles_in_answers_408_and_closes() -> None:
    app = create_app(ScriptedService(), ServeSettings(body_timeout_s=0.2))
    piece: Message = {"type": "http.request", "body": b'{"input": ', "more_body": True}
    sent, waited = _answers_to_a_stalling_client(app, [(b"transfer-encoding", b"chunked")], [piece])
    assert waited
    assert sent[0]["status"] == 408 and (b"connection", b"close") in sent[0]["headers"]
    assert b"body_timeout" in sent[1]["body"]


def test_one_client_cannot_take_the_whole_queue() -> None:
    """A batch of 8 from one client holds its share (3 calls, run 3 at a time), so another client's call is
    accepted; the first client's next call is refused while it holds its share; the batch's answers keep input order."""

    async def scenario() -> None:
        service = ScriptedService()
        app = create_app(service, ServeSettings(max_queue=4, max_queue_per_client=3, max_batch_inputs=8))
        async with _client(app, key=None, address="10.0.0.1") as first, _client(app, key=None, address="10.0.0.2") as second:
            batch = asyncio.create_task(first.post("/v1/programs/p/run_batch", json={"inputs": [str(n) for n in range(8)]}))
            while service.started < 1:
                await asyncio.sleep(0.01)
            assert (await first.get("/healthz")).json()["queued"] == 3  # the batch holds a window of three, not eight
            own = await first.post("/v1/programs/p/run", json={"input": "x"})
            assert own.status_code == 429 and own.json()["error"] == "client_queue_full"
            other = asyncio.create_task(second.post("/v1/programs/p/run", json={"input": "y"}))
            while service.started < 2:
                await asyncio.sleep(0.01)
            full = await second.post("/v1/programs/p/run", json={"input": "z"})
            assert full.status_code == 429 and full.json()["error"] == "queue_full"  # the server's own bound still holds
            service.release.set()
            answer = await batch
            assert answer.status_code == 200, answer.text
            assert [g.text for g in RunBatchResponse.model_validate_json(answer.content).generations] == [str(n) for n in range(8)]
            assert (await other).status_code == 200
            assert (await first.get("/healthz")).json()["queued"] == 0

    asyncio.run(scenario())


class _Failing(ScriptedService):
    """A service whose calls fail the way a bug or the hub would, with a server path in the error."""

    def __init__(self, error: BaseException) -> None:
        super().__init__()
        self.error = error

    async def run(self, reference: str, text: CallInput, options: RuntimeOptions) -> RunResponse:
        raise self.error


@pytest.mark.parametrize(
    ("error", "status", "code"),
    [
        (PawError("state of /srv/secret/cache/programs/x"), 500, "internal_error"),
        (OSError(2, "No such file or directory", "/srv/secret/cache/x.gguf"), 500, "internal_error"),
        (HubError("GET http://10.0.0.9/internal answered: /srv/secret/cache"), 502, "load_failed"),
    ],
    ids=["paw-error", "os-error", "hub-error"],
)
def test_server_failures_answer_a_generic_body_and_log_the_detail(
    error: BaseException, status: int, code: str, caplog: pytest.LogCaptureFixture
) -> None:
    async def scenario() -> httpx.Response:
        async with _client(create_app(_Failing(error), ServeSettings()), key=None) as client:
            return await client.post("/v1/programs/p/run", json={"input": "x"})

    with caplog.at_level(logging.ERROR, logger="pawfn.serve"):
        answer = asyncio.run(scenario())
    assert answer.status_code == status
    body = answer.json()
    assert body["error"] == code and "/srv" not in answer.text and "10.0.0.9" not in answer.text
    request_id = body["request_id"]
    assert request_id and answer.headers["x-request-id"] == request_id
    logged = [record.getMessage() for record in caplog.records if request_id in record.getMessage()]
    assert logged and "/srv/secret" in logged[0]


# --- a real hub behind the service ---


def _write_program(program: TinyProgram, root: Path, program_id: str, pairs: dict[str, tuple[Array, Array]] | None = None, **meta: object) -> Path:
    """A `.paw` of `program`'s interpreter with `pairs` (default: its own) and meta fields."""
    folder = root / program_id
    folder.mkdir(parents=True, exist_ok=True)
    adapter = folder / "adapter.gguf"
    write_adapter_gguf(adapter, program.interpreter.arch, pairs or program.pairs)
    bundle = write_bundle(
        folder / "bundle", adapter, INTERPRETER_IDS[program.interpreter.family], program.template, {"program_id": program_id, **meta}
    )
    return zip_bundle(bundle, folder / "program.paw")


@pytest.fixture
def hub(qwen3_program: TinyProgram, tmp_path: Path) -> Iterator[tuple[HubServer, PawConfig]]:
    """A real HTTP hub with a good program and one whose adapter is made for another model size."""
    server = HubServer()
    server.serve_runtime(RUNTIME_ID, "Qwen/Qwen3-0.6B", qwen3_program.interpreter.gguf_path.read_bytes(), BASE_FILE)
    server.serve_program(GOOD, _write_program(qwen3_program, tmp_path, GOOD, runtime_id=RUNTIME_ID).read_bytes())
    wrong: dict[str, tuple[Array, Array]] = {target: (a[:, :-1], b) for target, (a, b) in random_lora(qwen3_program.interpreter, seed=5).items()}
    server.serve_program(BROKEN, _write_program(qwen3_program, tmp_path, BROKEN, wrong, runtime_id=RUNTIME_ID).read_bytes())
    config = PawConfig.model_validate({"api_url": server.api_url, "api_key": "k", "cache_dir": tmp_path / "cache", "progress": False})
    yield server, config
    server.close()


def test_a_reference_from_a_client_never_names_a_local_path(
    hub: tuple[HubServer, PawConfig], qwen3_program: TinyProgram, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A bundle at `evil/prog` under the server's working folder: a request for `evil/prog` asks the hub (which knows
    no such program: 404), and answers exactly as for a name with nothing behind it."""
    server, config = hub
    work = tmp_path / "work"
    (work / "evil").mkdir(parents=True)
    write_bundle(work / "evil" / "prog", qwen3_program.adapter, "Qwen/Qwen3-0.6B", qwen3_program.template)
    monkeypatch.chdir(work)
    app = create_app(LocalPrograms(Torch, config, allow_load=True), ServeSettings())

    async def scenario() -> tuple[httpx.Response, httpx.Response]:
        async with _client(app, key=None) as client:
            there = await client.post("/v1/programs/evil/prog/run", json={"input": "x"})
            absent = await client.post("/v1/programs/evil/none/run", json={"input": "x"})
            return there, absent

    there, absent = asyncio.run(scenario())
    assert (there.status_code, there.json()["error"]) == (absent.status_code, absent.json()["error"]) == (404, "program_not_found")
    assert there.json()["message"].replace("evil/prog", "evil/none") == absent.json()["message"]
    assert server.state.count(r"/programs/resolve/evil%2Fprog$") == 1


@pytest.mark.parametrize(
    "reference",
    ["a" * 300, "b" * 5000, "..", "%2e%2e/%2e%2e/etc/passwd", "x/../../y", "x\u202ey", "\u00e9t\u00e9", "a b", "~root", "/etc/passwd", "a\\b"],
    ids=["300", "5000", "dots", "encoded-dots", "climb", "bidi", "unicode", "space", "tilde", "absolute", "backslash"],
)
def test_long_and_odd_references_answer_4xx_json(hub: tuple[HubServer, PawConfig], reference: str) -> None:
    _, config = hub
    app = create_app(LocalPrograms(Torch, config, allow_load=True), ServeSettings())

    async def scenario() -> list[httpx.Response]:
        async with _client(app, key=None) as client:
            return [
                await client.post(f"/v1/programs/{reference}/run", json={"input": "x"}),
                await client.get(f"/v1/programs/{reference}"),
                await client.post("/api/v1/infer", json={"program_id": reference[:200], "input": "x"}),
            ]

    for answer in asyncio.run(scenario()):
        assert 400 <= answer.status_code < 500, answer.text
        assert answer.json()["error"] and len(answer.text) < 2000


def test_a_program_that_fails_to_load_is_refused_for_a_while_then_tried_again(
    hub: tuple[HubServer, PawConfig], caplog: pytest.LogCaptureFixture
) -> None:
    """A hub program whose adapter does not fit its interpreter: 502 `load_failed` naming neither a path nor the
    file's details (the log has them, once); the next requests answer at once, asking the hub nothing; after the
    retry period it is tried again (from the cache)."""
    server, config = hub
    app = create_app(LocalPrograms(Torch, config, allow_load=True, failed_load_retry_s=1.0), ServeSettings())
    caplog.set_level(logging.ERROR, logger="pawfn.serve")

    async def scenario() -> None:
        async with _client(app, key=None) as client:
            first = await client.post(f"/v1/programs/{BROKEN}/run", json={"input": "x"})
            assert first.status_code == 502 and first.json()["error"] == "load_failed", first.text
            assert "AdapterError" in first.json()["message"] and str(config.cache_dir) not in first.text
            asked = len(server.state.snapshot())
            again = await client.post(f"/v1/programs/{BROKEN}/run", json={"input": "x"})
            assert again.status_code == 502 and "tries again in" in again.json()["message"]
            assert len(server.state.snapshot()) == asked  # refused from memory: the hub not asked, the cache not read
            [logged] = [record.getMessage() for record in caplog.records]  # the cause, under the first request's id only
            assert first.json()["request_id"] in logged and "do not fit the base weight" in logged
            good = await client.post(f"/v1/programs/{GOOD}/run", json={"input": "x", "options": {"max_tokens": 2}})
            assert good.status_code == 200, good.text
            await asyncio.sleep(1.1)
            later = await client.post(f"/v1/programs/{BROKEN}/run", json={"input": "x"})
            assert later.status_code == 502 and "tries again after" in later.json()["message"]  # loaded (and refused) anew

    asyncio.run(scenario())


def test_programs_named_at_start_stay_and_their_names_never_reach_the_hub(
    hub: tuple[HubServer, PawConfig], served_programs: tuple[TinyProgram, TinyProgram]
) -> None:
    """`q4=./file.paw` at start: the operator's key cannot unload it (409 `program_kept`), `q4` keeps running the
    operator's program (the hub never asked for `q4`), and no response names the file's path."""
    server, config = hub
    service = LocalPrograms(Torch, config, allow_load=True)
    service.load(str(served_programs[0].archive), served_programs[0].interpreter.gguf_path, alias="q4")
    app = create_app(service, ServeSettings(admin_key=SecretStr(ADMIN)))

    async def scenario() -> None:
        async with _client(app, key=ADMIN) as operator:
            kept = await operator.post("/v1/programs/q4/unload")
            assert kept.status_code == 409 and kept.json()["error"] == "program_kept"
            with pytest.raises(ProgramKeptError):
                await service.unload_program("q4")
            before = await operator.post("/v1/programs/q4/run", json={"input": "hello", "options": {"max_tokens": 4}})
            listing = await operator.get("/v1/programs")
            assert str(served_programs[0].archive) not in listing.text and str(served_programs[0].archive.parent) not in before.text
            loaded = await operator.post(f"/v1/programs/{GOOD}/load")  # an operator's hub program: unloaded at will
            assert loaded.status_code == 200 and (await operator.post(f"/v1/programs/{GOOD}/unload")).status_code == 200
            assert before.status_code == 200 and before.json()["program"] == FIRST_ID
            after = await operator.post("/v1/programs/q4/run", json={"input": "hello", "options": {"max_tokens": 4}})
            assert after.json()["generation"]["token_ids"] == before.json()["generation"]["token_ids"]
        assert server.state.count(r"q4") == 0
        await service.aclose()

    asyncio.run(scenario())


def test_the_listing_names_programs_from_files_without_their_paths(
    served_programs: tuple[TinyProgram, TinyProgram], qwen3_program: TinyProgram, tmp_path: Path
) -> None:
    """A file is served under its alias, else its program id, else its file name (two files of one name without
    either are refused at start, never one quietly served for the other)."""
    service = LocalPrograms(Torch, PawConfig(offline=True, progress=False))
    base = qwen3_program.interpreter.gguf_path
    first = service.load(str(served_programs[0].archive), base)
    named = service.load(str(served_programs[1].folder), base, alias="second")
    assert first.references == [first.program_id] and first.name == first.program_id
    assert named.references == sorted(["second", str(named.program_id)])
    archives: list[Path] = []
    for folder in ("a", "b"):  # two programs without ids, each in a file called program.paw
        bundle = write_bundle(
            tmp_path / folder / "bundle", qwen3_program.adapter, "Qwen/Qwen3-0.6B", f"{folder}: " + qwen3_program.template, {"program_id": None}
        )
        archives.append(zip_bundle(bundle, tmp_path / folder / "program.paw"))
    unnamed = service.load(str(archives[0]), base)
    assert (unnamed.program_id, unnamed.name, unnamed.references) == (None, "program", ["program"])
    with pytest.raises(ConfigError, match="served as 'program' already; name this one: --program NAME="):
        service.load(str(archives[1]), base)
    asyncio.run(service.aclose())


def test_loading_on_request_has_a_resident_budget_by_default(qwen3_program: TinyProgram) -> None:
    settings = ServeSettings()

    def target(allow_load: bool, references: list[str], max_programs: int | None = None) -> ServeTarget:
        given = settings if max_programs is None else settings.model_copy(update={"max_programs": max_programs})
        return ServeTarget(references, Torch, PawConfig(), given, allow_load=allow_load)

    assert resident_budget(target(True, [])) == ON_REQUEST_PROGRAMS
    assert resident_budget(target(True, ["a", "b"])) == 2 + ON_REQUEST_PROGRAMS
    assert resident_budget(target(True, ["a"], max_programs=3)) == 3
    assert resident_budget(target(False, ["a", "b"])) is None  # nothing loads on request: the operator's programs only


def test_a_hub_404_is_the_servers_own_words(hub: tuple[HubServer, PawConfig]) -> None:
    _, config = hub
    service = LocalPrograms(Torch, config, allow_load=True)
    with pytest.raises(NotFoundError, match="hub knows no such program") as caught:
        asyncio.run(service.run("someone/missing", "x", OPTIONS))
    assert config.api_url not in str(caught.value)


# --- a real server: stalled sockets ---


@pytest.fixture(scope="module")
def guarded_server(served_programs: tuple[TinyProgram, TinyProgram], tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServeProcess]:
    """A server with second-long timeouts and room for six connections."""
    first = served_programs[0]
    server = start_server(
        "--program",
        f"tiny={first.archive}",
        "--base",
        str(first.interpreter.hf_dir),
        "--header-timeout",
        "1",
        "--body-timeout",
        "1",
        "--keep-alive-timeout",
        "1",
        "--max-connections",
        "6",
        environment={"PAW_CACHE_DIR": str(tmp_path_factory.mktemp("guarded-cache"))},
    )
    yield server
    assert server.stop() == -signal.SIGTERM, server.output()


def _connect(url: str) -> socket.socket:
    host, port = url.removeprefix("http://").split(":")
    connection = socket.create_connection((host, int(port)), timeout=10)
    return connection


def _closed_within(connection: socket.socket, seconds: float) -> tuple[bool, bytes]:
    """Whether the server closed `connection` within `seconds`, and what it sent before."""
    connection.settimeout(seconds)
    received = b""
    try:
        while chunk := connection.recv(4096):
            received += chunk
    except (TimeoutError, socket.timeout):
        return False, received
    except ConnectionResetError:
        pass
    return True, received


def test_stalled_sockets_are_closed_within_their_timeouts(guarded_server: ServeProcess) -> None:
    """Headers that never end, a body that never ends, an idle keep-alive connection: each closed within its
    timeout (1 s here, 5 s allowed); the body's with a 408. Then the server still answers."""
    headers = _connect(guarded_server.url)
    headers.sendall(b"POST /v1/programs/tiny/run HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n")
    body = _connect(guarded_server.url)
    body.sendall(b'POST /v1/programs/tiny/run HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{"input"')
    idle = _connect(guarded_server.url)
    idle.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
    silent = _connect(guarded_server.url)  # connects, sends nothing
    closed = {
        name: _closed_within(connection, 5.0) for name, connection in (("headers", headers), ("body", body), ("idle", idle), ("silent", silent))
    }
    assert all(done for done, _ in closed.values()), {name: done for name, (done, _) in closed.items()}
    assert closed["body"][1].startswith(b"HTTP/1.1 408") and b"body_timeout" in closed["body"][1]
    assert closed["idle"][1].startswith(b"HTTP/1.1 200")
    assert httpx.get(f"{guarded_server.url}/healthz", timeout=10).status_code == 200


def test_connections_past_the_bound_are_refused_and_closed(guarded_server: ServeProcess) -> None:
    held = [_connect(guarded_server.url) for _ in range(6)]
    try:
        time.sleep(0.2)
        extra = _connect(guarded_server.url)
        done, received = _closed_within(extra, 5.0)
        assert done and received.startswith(b"HTTP/1.1 503") and b"too_many_connections" in received
    finally:
        for connection in held:
            connection.close()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:  # the held ones are gone once the server sees them close
        try:
            if httpx.get(f"{guarded_server.url}/healthz", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    raise AssertionError(f"the server took no connection after the others closed:\n{guarded_server.output()}")


def test_a_flood_of_stalled_sockets_leaves_no_descriptors_behind(guarded_server: ServeProcess) -> None:
    """40 sockets that each send half a request: the server closes every one (those past the bound at once, the
    others at their header or body deadline), and its open descriptors go back to where they were."""
    pid = guarded_server.process.pid

    def descriptors() -> list[str]:
        return sorted(os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd"))

    before = descriptors()
    stalled: list[socket.socket] = []
    for index in range(40):
        connection = _connect(guarded_server.url)
        try:
            connection.sendall(b"GET /healthz HTTP/1.1\r\nHo" if index % 2 else b"POST /v1/programs/tiny/run HTTP/1.1\r\nContent-Length: 9\r\n\r\n{")
        except OSError:  # refused and closed before the write: closed is what is asked
            pass
        stalled.append(connection)
    try:
        assert all(_closed_within(connection, 10.0)[0] for connection in stalled)
    finally:
        for connection in stalled:
            connection.close()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and len(descriptors()) > len(before):
        time.sleep(0.2)
    assert len(descriptors()) <= len(before), (before, descriptors())


def test_the_access_log_carries_each_requests_id(qwen3_program: TinyProgram, tmp_path: Path) -> None:
    """An error body's request id finds its access line: one line per request with the id (uvicorn's own is off); a
    path a client chose never starts a line of its own."""
    server = start_server(
        "--program", f"tiny={qwen3_program.archive}", "--base", str(qwen3_program.interpreter.gguf_path), environment={"PAW_CACHE_DIR": str(tmp_path)}
    )
    try:
        ok = httpx.post(
            f"{server.url}/v1/programs/tiny/run", json={"input": "hi", "options": {"max_tokens": 2}}, headers={"x-request-id": "req-ok"}, timeout=60
        )
        missing = httpx.get(f"{server.url}/v1/programs/nothing%0Afake-line", timeout=60)
        assert ok.status_code == 200 and missing.status_code == 404
        request_id = missing.json()["request_id"]
    finally:
        server.stop()
    lines = server.output().splitlines()
    assert any("POST '/v1/programs/tiny/run' 200" in line and line.endswith("request 'req-ok'") for line in lines)
    assert any(" 404 " in line and line.endswith(f"request {request_id!r}") for line in lines)  # the error body's id
    assert not any(line.startswith("fake-line") for line in lines)
    assert not any('HTTP/1.1" 200' in line for line in lines)  # uvicorn's access line, without the id, is gone
