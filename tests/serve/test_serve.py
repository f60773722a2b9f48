"""`pawfn serve` end to end: a real uvicorn process on 127.0.0.1 serving tiny programs, checked against local runs."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
from pydantic import SecretStr

from pawfn import CallTimeoutError, LlamaCpp, PawConfig, PawFn, Qwen3_0_6B, Remote, RuntimeOptions, Torch
from pawfn.core.protocol import ServedProgram, ServedPrograms, RunBatchResponse, RunResponse
from tests.helpers.bounded import run_cli
from tests.helpers.programs import TinyProgram, requires_llama_cpp
from tests.helpers.servers import (
    AUTH,
    FIRST_ID,
    INPUTS,
    KEY,
    SECOND_ID,
    STOPPED,
    ServeProcess,
    decode_steps,
    run_concurrently,
    settled_steps,
    sse_events,
    start_server,
    wait_decoding,
)
from tests.helpers.tiny_models import TinyInterpreter

pytest.importorskip("fastapi", reason="pawfn serve needs the serve extra")

LocalRuns = dict[str, PawFn[Qwen3_0_6B, Torch]]


def _post(server: ServeProcess, path: str, body: object, headers: dict[str, str] | None = None) -> httpx.Response:
    return httpx.post(server.url + path, json=body, headers=AUTH if headers is None else headers, timeout=60)


def test_concurrent_requests_for_two_programs_equal_local_runs(server: ServeProcess, local_runs: LocalRuns) -> None:
    options = RuntimeOptions(max_tokens=12)
    calls = [(program_id, text) for text in INPUTS for program_id in (FIRST_ID, SECOND_ID)] * 2
    results = run_concurrently(server.url, calls, max_tokens=12)
    for (program_id, text), result in zip(calls, results, strict=True):
        expected = local_runs[program_id].generate(text, options)
        assert result.program == program_id
        assert result.generation.token_ids == expected.token_ids
        assert result.generation.text == expected.text
    assert {r.generation.token_ids for r in results[:2]} != {(), None}  # the programs generated something


def test_run_batch_and_the_official_infer_shape_equal_local_runs(server: ServeProcess, local_runs: LocalRuns) -> None:
    response = _post(server, f"/v1/programs/{SECOND_ID}/run_batch", {"inputs": INPUTS, "options": {"max_tokens": 10}})
    assert response.status_code == 200, response.text
    batch = RunBatchResponse.model_validate_json(response.content)
    expected = local_runs[SECOND_ID].generate_batch(INPUTS, RuntimeOptions(max_tokens=10))
    assert [g.token_ids for g in batch.generations] == [g.token_ids for g in expected]

    infer = _post(server, "/api/v1/infer", {"program_id": FIRST_ID, "input": INPUTS[0], "max_tokens": 10})
    assert infer.status_code == 200, infer.text
    body = infer.json()
    reference = local_runs[FIRST_ID].generate(INPUTS[0], RuntimeOptions(max_tokens=10))
    assert body["output"] == reference.text
    assert body["tokens_generated"] == len(reference.token_ids)
    assert body["latency_ms"] > 0


@pytest.mark.skipif(importlib.util.find_spec("programasweights") is None, reason="the official SDK is not installed")
def test_the_official_sdks_remote_function_runs_against_the_server(server: ServeProcess, local_runs: LocalRuns, tmp_path: Path) -> None:
    """The official SDK's own request code (`paw.function(ref, remote=True)`), pointed at the server by PAW_API_URL."""
    script = (
        "import json, sys, programasweights as paw\n"
        "f = paw.function(sys.argv[1], remote=True)\n"
        "print(json.dumps([f(text, max_tokens=9) for text in json.loads(sys.argv[2])]))\n"
    )
    environment = {"PAW_API_URL": server.url, "PAW_API_KEY": KEY, "HOME": str(tmp_path), "PATH": "/usr/bin:/bin"}
    for reference in (FIRST_ID, "tiny-second"):  # an id, and a slug the server resolves
        done = subprocess.run(
            [sys.executable, "-c", script, reference, json.dumps(INPUTS)], capture_output=True, text=True, env=environment, timeout=120, check=False
        )
        assert done.returncode == 0, done.stderr
        program_id = FIRST_ID if reference == FIRST_ID else SECOND_ID
        expected = [g.text for g in local_runs[program_id].generate_batch(INPUTS, RuntimeOptions(max_tokens=9))]
        assert json.loads(done.stdout) == expected


def test_streaming_sends_text_as_generated_then_the_generation(server: ServeProcess, local_runs: LocalRuns) -> None:
    expected = local_runs[FIRST_ID].generate(INPUTS[2], RuntimeOptions(max_tokens=16))
    with httpx.stream(
        "POST", f"{server.url}/v1/programs/{FIRST_ID}/stream", json={"input": INPUTS[2], "options": {"max_tokens": 16}}, headers=AUTH, timeout=60
    ) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        events = list(sse_events(response.iter_lines()))
    pieces = [str(data["text"]) for event, data in events if event == "token"]
    assert [event for event, _ in events][-1] == "done"
    done = RunResponse.model_validate(events[-1][1])
    assert done.generation.token_ids == expected.token_ids
    assert "".join(pieces) == local_runs[FIRST_ID].runtime.decode_tokens(expected.token_ids)
    assert len(pieces) > 1


def test_program_listing_info_and_openapi(server: ServeProcess, served_programs: tuple[TinyProgram, TinyProgram]) -> None:
    listing = ServedPrograms.model_validate_json(httpx.get(f"{server.url}/v1/programs", headers=AUTH).content)
    assert sorted(p.name for p in listing.programs) == [FIRST_ID, SECOND_ID]
    info = ServedProgram.model_validate_json(httpx.get(f"{server.url}/v1/programs/{SECOND_ID}", headers=AUTH).content)
    assert (info.model, info.interpreter, info.backend) == ("Qwen3_0_6B", "Qwen/Qwen3-0.6B", "torch")
    assert {"tiny-second", SECOND_ID} == set(info.references)  # never the server's path of the file
    resolved = httpx.get(f"{server.url}/api/v1/programs/resolve/tiny-second", headers=AUTH)
    assert resolved.json() == {"program_id": SECOND_ID}
    schema = httpx.get(f"{server.url}/openapi.json").json()
    assert {"/api/v1/infer", "/v1/programs/{reference}/run", "/v1/programs/{reference}/stream", "/metrics"} <= set(schema["paths"])


def test_unknown_program_and_bad_key_get_json_errors(server: ServeProcess) -> None:
    missing = _post(server, "/v1/programs/c2c2c2c2c2c2c2c2c2c2/run", {"input": "x"})
    assert missing.status_code == 404
    assert missing.json()["error"] == "program_not_found" and "--allow-load" in missing.json()["message"]
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"X-API-Key": KEY[:-1]}):
        refused = _post(server, f"/v1/programs/{FIRST_ID}/run", {"input": "x"}, headers)
        assert refused.status_code == 401 and refused.json()["error"] == "unauthorized"
        assert refused.headers["www-authenticate"] == "Bearer"
    assert _post(server, f"/v1/programs/{FIRST_ID}/run", {"input": "x"}, {"X-API-Key": KEY}).status_code == 200
    assert httpx.get(f"{server.url}/metrics").status_code == 401
    health = httpx.get(f"{server.url}/healthz")  # liveness needs no key
    assert health.status_code == 200 and health.json()["programs"] == 2  # two programs, one of them under two names


def test_limits_answer_413_422_and_429_with_json(server: ServeProcess) -> None:
    path = f"/v1/programs/{FIRST_ID}/run"
    cases: list[tuple[httpx.Response, int, str]] = [
        (_post(server, path, {"input": "x" * 5000}), 413, "body_too_large"),
        (_post(server, path, {"input": "x" * 301}), 413, "input_too_long"),
        (_post(server, path, {"input": "x", "options": {"max_tokens": 25}}), 422, "max_tokens_too_large"),
        (_post(server, path, {"input": "x", "options": {"temperature": -1}}), 422, "invalid_request"),
        (_post(server, path, {"inputs": "x"}), 422, "invalid_request"),
        (_post(server, f"/v1/programs/{FIRST_ID}/run_batch", {"inputs": ["x"] * 9}), 413, "batch_too_large"),
        (httpx.post(server.url + path, content=b"{not json", headers=AUTH | {"content-type": "application/json"}), 422, "invalid_request"),
    ]

    def chunked() -> Iterator[bytes]:
        yield b'{"input": "'
        for _ in range(10):
            yield b"x" * 500
        yield b'"}'

    cases.append((httpx.post(server.url + path, content=chunked(), headers=AUTH), 413, "body_too_large"))
    for response, status, code in cases:
        assert (response.status_code, response.json()["error"]) == (status, code), response.text
        assert response.json()["message"]
    assert cases[3][0].json()["message"] == (  # the wording of RuntimeOptions(temperature=-1) in Python and the CLI
        "invalid request body: options: invalid temperature=-1: expected a finite number >= 0"
    )
    assert _post(server, path, {"input": "still fine"}).status_code == 200  # the server took all that in its stride


def _one_copy_server(program: TinyProgram, qwen3: TinyInterpreter, cache: Path, *settings: str) -> ServeProcess:
    """`pawfn serve` of `program` on one model copy with calls of up to 64 tokens: accepted calls take a while."""
    arguments = ["--program", str(program.archive), "--base", str(qwen3.hf_dir), "--max-model-copies", "1", "--max-tokens-limit", "64"]
    return start_server(*arguments, *settings, environment={"PAW_CACHE_DIR": str(cache)})


def test_the_queue_limit_counts_calls_across_requests(
    served_programs: tuple[TinyProgram, TinyProgram], qwen3: TinyInterpreter, tmp_path: Path
) -> None:
    """16 calls at most: a batch of 8 fits beside another of 8, a ninth call does not while they run. One model copy
    and 64-token calls keep both batches in flight long enough to see (the shared server's 24-token calls on two
    copies could end before the second batch arrived)."""
    server = _one_copy_server(served_programs[0], qwen3, tmp_path, "--max-queue", "16")
    answers: list[int] = []
    barrier = threading.Barrier(3)

    def batch() -> None:
        barrier.wait()
        body = {"inputs": [f"q {n}" for n in range(8)], "options": {"max_tokens": 64}}
        answers.append(httpx.post(f"{server.url}/v1/programs/{FIRST_ID}/run_batch", json=body, timeout=120).status_code)

    try:
        threads = [threading.Thread(target=batch) for _ in range(2)]
        for thread in threads:
            thread.start()
        barrier.wait()
        seen_full = False
        deadline = time.monotonic() + 30
        while any(t.is_alive() for t in threads) and time.monotonic() < deadline:
            if httpx.get(f"{server.url}/healthz").json()["queued"] == 16:
                refused = httpx.post(f"{server.url}/v1/programs/{FIRST_ID}/run", json={"input": "x"}, timeout=60)
                if refused.status_code == 429:
                    assert refused.json()["error"] == "queue_full" and refused.headers["retry-after"] == "1"
                    seen_full = True
                    break
        for thread in threads:
            thread.join()
        assert answers == [200, 200]
    finally:
        server.stop()
    if not seen_full:
        pytest.skip("the two batches never overlapped on this machine (too fast to observe the full queue)")


def test_metrics_count_requests_tokens_and_batches(server: ServeProcess) -> None:
    assert _post(server, f"/v1/programs/{SECOND_ID}/run_batch", {"inputs": INPUTS[:3], "options": {"max_tokens": 5}}).status_code == 200
    text = httpx.get(f"{server.url}/metrics", headers=AUTH).text
    assert 'pawfn_requests_total{route="/v1/programs/{reference:path}/run_batch",status="200"}' in text
    assert f'pawfn_generated_tokens_total{{program="{SECOND_ID}"}}' in text
    assert "pawfn_batch_inputs_bucket" in text and "pawfn_queue_length 0.0" in text
    steps = next(float(line.split()[1]) for line in text.splitlines() if line.startswith("pawfn_decode_steps_total"))
    rows = next(float(line.split()[1]) for line in text.splitlines() if line.startswith("pawfn_decode_rows_total"))
    assert rows >= steps > 0


def _three_batches_queued(server: ServeProcess, batch: Callable[[], None]) -> list[threading.Thread]:
    """`batch` (a request of 8 calls) from three threads, returned once the server holds all 24 calls (or 30 s)."""
    threads = [threading.Thread(target=batch) for _ in range(3)]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + 30
    while httpx.get(f"{server.url}/healthz").json()["queued"] < 24 and time.monotonic() < deadline:
        time.sleep(0.005)
    return threads


def test_sigterm_finishes_every_accepted_request(
    served_programs: tuple[TinyProgram, TinyProgram], qwen3: TinyInterpreter, local_runs: LocalRuns, tmp_path: Path
) -> None:
    """One model copy, so 24 accepted calls take a while; SIGTERM while they run loses none of them."""
    server = _one_copy_server(served_programs[0], qwen3, tmp_path, "--max-queue-per-client", "64")  # three clients, one address
    inputs = [f"input number {n}" for n in range(8)]
    answers: list[httpx.Response] = []

    def batch() -> None:
        answers.append(
            httpx.post(f"{server.url}/v1/programs/{FIRST_ID}/run_batch", json={"inputs": inputs, "options": {"max_tokens": 64}}, timeout=120)
        )

    threads = _three_batches_queued(server, batch)
    status = server.stop()
    for thread in threads:
        thread.join()
    assert status == -signal.SIGTERM, server.output()
    expected = [g.token_ids for g in local_runs[FIRST_ID].generate_batch(inputs, RuntimeOptions(max_tokens=64))]
    assert [r.status_code for r in answers] == [200, 200, 200]
    for answer in answers:
        assert [g.token_ids for g in RunBatchResponse.model_validate_json(answer.content).generations] == expected
    assert "Finished server process" in server.output()


def test_serve_command_errors_are_one_line(served_programs: tuple[TinyProgram, TinyProgram], qwen3: TinyInterpreter) -> None:
    run_cli("serve").assert_one_line_error(2, "nothing to serve", "--program")
    run_cli("serve", "--program", str(served_programs[0].archive), "--api-key-env", "PAWFN_UNSET_KEY").assert_one_line_error(
        2, "PAWFN_UNSET_KEY", "empty or unset"
    )
    archive = str(served_programs[0].archive)
    run_cli("serve", "--program", archive, "--admin-key-env", "PAWFN_UNSET_KEY").assert_one_line_error(
        2, "--admin-key-env PAWFN_UNSET_KEY", "empty or unset"
    )
    run_cli(
        "serve", "--program", archive, "--api-key-env", "PAWFN_SAME", "--admin-key-env", "PAWFN_SAME", environment={"PAWFN_SAME": "one-key"}
    ).assert_one_line_error(2, "a key of its own")
    run_cli("serve", "--program", archive, "--header-timeout", "0").assert_one_line_error(2, "--header-timeout")
    run_cli("serve", "--program", "missing.paw").assert_one_line_error(1, "missing.paw")
    run_cli("serve", "--program", str(served_programs[0].archive), "--base", str(qwen3.hf_dir), "--max-queue", "0").assert_one_line_error(
        2, "--max-queue"
    )


@requires_llama_cpp
def test_serving_on_the_llamacpp_backend_gives_its_tokens(
    served_programs: tuple[TinyProgram, TinyProgram], qwen3: TinyInterpreter, tmp_path: Path
) -> None:
    """llama.cpp runs a program's calls in turn, on worker threads: runs, batches and streams still answer right."""
    server = start_server(
        "--program",
        f"tiny={served_programs[0].archive}",
        "--base",
        str(qwen3.gguf_path),
        "--backend",
        "llamacpp",
        environment={"PAW_CACHE_DIR": str(tmp_path)},
    )
    try:
        options = RuntimeOptions(max_tokens=10)
        with PawFn[Qwen3_0_6B, LlamaCpp].load_sync(served_programs[0].archive, base=qwen3.gguf_path) as local:
            expected = [local.generate(text, options).token_ids for text in INPUTS]
            results = run_concurrently(server.url, [("tiny", text) for text in INPUTS], max_tokens=10, threads=4)
            assert [result.generation.token_ids for result in results] == expected
            with httpx.stream(
                "POST", f"{server.url}/v1/programs/tiny/stream", json={"input": INPUTS[0], "options": {"max_tokens": 10}}, timeout=60
            ) as response:
                events = list(sse_events(response.iter_lines()))
            assert RunResponse.model_validate(events[-1][1]).generation.token_ids == expected[0]
            pieces = "".join(str(data["text"]) for event, data in events if event == "token")
            assert pieces == local.runtime.decode_tokens(expected[0])
    finally:
        assert server.stop() == -signal.SIGTERM, server.output()


def _call_requests(server: ServeProcess) -> float:
    """Requests to the routes a `Remote` call goes over (`run`, and `stream` for one call)."""
    text = httpx.get(f"{server.url}/metrics", headers=AUTH).text
    prefixes = tuple(f'pawfn_requests_total{{route="/v1/programs/{{reference:path}}/{route}",' for route in ("run", "stream"))
    return sum(float(line.split()[1]) for line in text.splitlines() if line.startswith(prefixes))


def test_a_client_that_leaves_cancels_its_calls(long_calls_server: ServeProcess) -> None:
    """A run_batch whose client gives up stops decoding; a `Remote` call that times out is not sent again and is
    cancelled on the server too."""
    server = long_calls_server
    before = decode_steps(server)
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{server.url}/v1/programs/{FIRST_ID}/run_batch", json={"inputs": ["a", "b"]}, headers=AUTH, timeout=httpx.Timeout(60, read=0.5))
    assert settled_steps(server) - before < STOPPED  # the batch would have taken ~4,000 steps
    config = PawConfig(server_url=server.url, server_api_key=SecretStr(KEY), run_timeout_s=0.5, max_retries=3)
    with PawFn[Qwen3_0_6B, Remote].load_sync(FIRST_ID, config=config) as program:
        runs, before = _call_requests(server), decode_steps(server)
        with pytest.raises(CallTimeoutError, match="not sent again"):
            program.run("hello")
    assert settled_steps(server) - before < STOPPED  # stopped, not decoded to its end (~1,990 steps)
    assert _call_requests(server) == runs + 1  # one request, ended once its client had gone


def test_a_cancelled_remote_call_stops_on_the_server_and_close_does_not_wait(long_calls_server: ServeProcess) -> None:
    """A call to the end of the context (~2,000 steps), cancelled while the server decodes it: closing the program
    returns without its answer, and the server, its connection closed, stops decoding."""
    server = long_calls_server
    settled_steps(server)
    before = decode_steps(server)
    config = PawConfig(server_url=server.url, server_api_key=SecretStr(KEY))
    program = PawFn[Qwen3_0_6B, Remote].load_sync(FIRST_ID, config=config)
    pending = program.submit("hello")
    wait_decoding(server, before)
    pending.cancel()
    program.close()
    assert settled_steps(server) - before < STOPPED  # not the ~2,000 the call would have decoded


def test_ctrl_c_on_a_remote_run_exits_at_once_and_the_server_stops(long_calls_server: ServeProcess) -> None:
    server = long_calls_server
    settled_steps(server)
    before = decode_steps(server)
    env = dict(os.environ, PYTHONWARNINGS="ignore", PAW_SERVER_API_KEY=KEY)
    process = subprocess.Popen(
        [sys.executable, "-m", "pawfn", "run", "--backend", "remote", "--server-url", server.url, "--program", FIRST_ID, "--input", "hello"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    wait_decoding(server, before)
    process.send_signal(signal.SIGINT)
    out, err = process.communicate(timeout=120)
    assert process.returncode == 130 and err.strip().splitlines()[-1] == "pawfn: interrupted; stopping (Ctrl-C again quits at once)", err
    assert out == "" and "Traceback" not in err
    assert settled_steps(server) - before < STOPPED


def _stream_seconds(server: ServeProcess) -> float:
    text = httpx.get(f"{server.url}/metrics", headers=AUTH).text
    prefix = 'pawfn_request_seconds_sum{route="/v1/programs/{reference:path}/stream"}'
    return sum(float(line.split()[1]) for line in text.splitlines() if line.startswith(prefix))


def test_the_request_metric_times_a_stream_to_its_last_event(long_calls_server: ServeProcess) -> None:
    """`pawfn_request_seconds` of a stream covers the stream, not its headers (it once measured 6.6 ms for any stream):
    at least the time the client saw between the headers and the last event."""
    server = long_calls_server
    settled_steps(server)
    before = _stream_seconds(server)
    body = {"input": "q", "options": {"max_tokens": 300}}
    with httpx.stream("POST", f"{server.url}/v1/programs/{FIRST_ID}/stream", json=body, headers=AUTH, timeout=120) as response:
        headers_at = time.perf_counter()
        events = list(sse_events(response.iter_lines()))
        streamed_s = time.perf_counter() - headers_at
    assert events[-1][0] == "done" and len(events) > 50, events[-3:]
    observed_s = _stream_seconds(server) - before
    assert observed_s >= 0.8 * streamed_s and streamed_s > 0.05, (observed_s, streamed_s)


def test_sigterm_answers_503_to_the_calls_that_outlast_the_grace(long_calls_server: ServeProcess) -> None:
    """24 calls to the end of the context, running and queued, a stream that runs and one still waiting for its first
    token: SIGTERM ends the server within its 1 s; the requests still running then answer 503 `shutting_down` JSON
    with Retry-After (a `Remote` client sends such a call again), the running stream ends with that `error` event, the
    waiting one answers the 503 JSON, and nothing is cut off or logged as a traceback."""
    server = long_calls_server
    answers: list[httpx.Response] = []
    streamed: list[str] = []
    waiting_stream: list[httpx.Response] = []

    def batch() -> None:
        answers.append(httpx.post(f"{server.url}/v1/programs/{FIRST_ID}/run_batch", json={"inputs": ["q"] * 8}, headers=AUTH, timeout=120))

    running = threading.Event()  # the stream has its first event: the batches queue behind it, not before

    def stream() -> None:
        body = {"input": "q", "options": {"max_tokens": 2000}}
        chunks: list[str] = []
        try:
            with httpx.stream("POST", f"{server.url}/v1/programs/{FIRST_ID}/stream", json=body, headers=AUTH, timeout=120) as response:
                for chunk in response.iter_text():
                    chunks.append(chunk)
                    running.set()
        finally:
            streamed.append("".join(chunks))
            running.set()

    def stream_behind_the_batches() -> None:
        body = {"input": "q", "options": {"max_tokens": 2000}}
        with httpx.stream("POST", f"{server.url}/v1/programs/{FIRST_ID}/stream", json=body, headers=AUTH, timeout=120) as response:
            response.read()
            waiting_stream.append(response)

    streaming = threading.Thread(target=stream)
    streaming.start()
    assert running.wait(30), "the stream never started"
    threads = _three_batches_queued(server, batch)
    waiting = threading.Thread(target=stream_behind_the_batches)
    waiting.start()
    deadline = time.monotonic() + 30
    while httpx.get(f"{server.url}/healthz").json()["queued"] < 26 and time.monotonic() < deadline:
        time.sleep(0.005)
    stopping = time.monotonic()
    status = server.stop(timeout_s=60)
    stopped_s = time.monotonic() - stopping
    for thread in [*threads, streaming, waiting]:
        thread.join()
    assert status == -signal.SIGTERM, server.output()
    assert stopped_s < 10, server.output()  # the 24 calls would take over a minute
    [late] = waiting_stream
    assert late.status_code == 503 and late.json()["error"] == "shutting_down" and late.json()["request_id"], late.text
    assert [answer.status_code for answer in answers] == [503] * 3, server.output()
    for answer in answers:
        assert answer.json()["error"] == "shutting_down" and answer.headers["retry-after"] == "1" and answer.json()["request_id"]
    events = list(sse_events(iter(streamed[0].splitlines())))
    assert events[-1][0] == "error" and events[-1][1]["error"] == "shutting_down" and events[-1][1]["request_id"], streamed
    assert "Traceback" not in server.output() and "timeout graceful shutdown exceeded" not in server.output()


def test_a_body_sent_as_a_form_gets_415_naming_the_content_type(server: ServeProcess) -> None:
    """curl's -d without a JSON Content-Type (form encoding): the answer says what to send."""
    response = httpx.post(
        f"{server.url}/v1/programs/{FIRST_ID}/run", content=b'{"input": "x"}', headers=AUTH | {"content-type": "application/x-www-form-urlencoded"}
    )
    assert response.status_code == 415 and response.json()["error"] == "unsupported_media_type"
    assert "application/x-www-form-urlencoded" in response.json()["message"] and "Content-Type: application/json" in response.json()["message"]


def _readme_curl_commands() -> list[str]:
    text = (Path(__file__).resolve().parents[2] / "README.md").read_text(encoding="utf-8").replace("\\\n", " ")
    return [line.strip() for line in text.splitlines() if line.strip().startswith("curl ")]


@pytest.mark.skipif(shutil.which("curl") is None, reason="no curl here")
def test_the_readmes_curl_commands_work_as_written(server: ServeProcess) -> None:
    """The README's curl lines, run by a shell against a real server (its address, program and key put in)."""
    commands = _readme_curl_commands()
    assert len(commands) >= 3
    for command in commands:
        line = (
            command.replace("localhost:8000", server.url.removeprefix("http://"))
            .replace("/programs/triage/", f"/programs/{FIRST_ID}/")
            .replace('"program_id": "triage"', f'"program_id": "{FIRST_ID}"')
        )
        result = subprocess.run(
            ["bash", "-c", line], capture_output=True, text=True, timeout=120, check=False, env={"PATH": os.environ["PATH"], "PAWFN_KEY": KEY}
        )
        assert result.returncode == 0, result.stderr
        if "/stream" in line:
            assert "event: done" in result.stdout, result.stdout
        else:
            assert "error" not in json.loads(result.stdout), result.stdout


def test_a_taken_port_fails_before_any_program_loads(served_programs: tuple[TinyProgram, TinyProgram], qwen3: TinyInterpreter) -> None:
    """The port is bound before the programs load: a taken one is a one-line error naming the address and the fix,
    with no program loaded first (the loads once came first, and a taken port failed only after them)."""
    import socket

    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        command = [sys.executable, "-m", "pawfn", "serve", "--program", str(served_programs[0].archive), "--base", str(qwen3.gguf_path)]
        result = subprocess.run([*command, "--port", str(port)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 1, result.stderr
    assert result.stderr.splitlines() == [
        f"pawfn: error: cannot listen on 127.0.0.1:{port} (Address already in use); stop what holds the port or pass another --port"
    ]
    assert "serving" not in result.stdout + result.stderr


@pytest.mark.parametrize("stop_signal", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_ctrl_c_honours_the_graceful_timeout_as_sigterm_does(
    served_programs: tuple[TinyProgram, TinyProgram], qwen3: TinyInterpreter, tmp_path: Path, stop_signal: signal.Signals
) -> None:
    """A call that would decode ~8,000 steps (over 10 s), then the signal, with 1 s of grace: the call answers 503
    `shutting_down` and the process exits within the grace and a margin for a busy machine, for Ctrl-C as for SIGTERM
    (a user once measured 6.3 s against a grace of 5 for SIGINT)."""
    server = start_server(
        "--program",
        str(served_programs[0].archive),
        "--base",
        str(qwen3.gguf_path),
        "--n-ctx",
        "8192",
        "--max-tokens-limit",
        "8000",
        "--graceful-timeout",
        "1",
        environment={"PAW_CACHE_DIR": str(tmp_path / "cache")},
    )
    answers: list[httpx.Response] = []
    body = {"input": "q", "options": {"max_tokens": 8000}}
    before = decode_steps(server)
    calling = threading.Thread(target=lambda: answers.append(httpx.post(f"{server.url}/v1/programs/{FIRST_ID}/run", json=body, timeout=120)))
    calling.start()
    wait_decoding(server, before)
    sent = time.monotonic()
    server.process.send_signal(stop_signal)
    status = server.process.wait(60)
    stopped_s = time.monotonic() - sent
    calling.join()
    assert status == (130 if stop_signal == signal.SIGINT else -signal.SIGTERM), server.output()
    assert answers[0].status_code == 503 and answers[0].json()["error"] == "shutting_down", answers[0].text
    assert stopped_s < 1 + 2, (stopped_s, server.output())
    assert "Traceback" not in server.output()
