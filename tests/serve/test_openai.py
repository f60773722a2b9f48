"""The OpenAI-compatible routes driven by the official `openai` client (sync, async, streaming, structured output)
against a real `pawfn serve` process, checked against pawfn's own route for the same program and input."""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Literal

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import BaseModel

from pawfn import PawFn, Qwen3_0_6B, RuntimeOptions, Torch
from pawfn.core.protocol import RunResponse
from tests.test_fuzz import FUZZ
from tests.helpers.servers import AUTH, FIRST_ID, INPUTS, KEY, SECOND_ID, STOPPED, ServeProcess, decode_steps, settled_steps, wait_decoding

pytest.importorskip("openai", reason="the OpenAI-compatible routes are tested with the official openai client (the dev extra)")
pytest.importorskip("fastapi", reason="pawfn serve needs the serve extra")

import httpx2  # noqa: E402 - openai's own HTTP client
import openai  # noqa: E402 - after the skip: the dev extra
from openai.types.chat import ChatCompletionMessageParam  # noqa: E402

from pawfn.serve import ServeSettings  # noqa: E402
from pawfn.serve.app import create_app  # noqa: E402 - the serve extra
from tests.serve.test_serve_app import ScriptedService  # noqa: E402 - the scripted service of the app's own tests

LocalRuns = dict[str, PawFn[Qwen3_0_6B, Torch]]


def _client(server: ServeProcess, **options: object) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key=KEY, max_retries=0, **options)  # type: ignore[arg-type]


def _own_route(server: ServeProcess, program: str, text: str, options: dict[str, object]) -> RunResponse:
    """The same call through pawfn's own route."""
    response = httpx.post(f"{server.url}/v1/programs/{program}/run", json={"input": text, "options": options}, headers=AUTH, timeout=60)
    assert response.status_code == 200, response.text
    return RunResponse.model_validate_json(response.content)


def test_the_models_are_the_served_programs_as_vllm_lists_lora_modules(server: ServeProcess) -> None:
    listed = {model.id: model for model in _client(server).models.list()}
    assert set(listed) == {FIRST_ID, SECOND_ID, "tiny-second"}
    second = listed["tiny-second"].model_dump()
    assert (second["root"], second["parent"], second["owned_by"], second["object"]) == (SECOND_ID, "Qwen/Qwen3-0.6B", "pawfn", "model")
    assert _client(server).models.retrieve("tiny-second").model_dump()["root"] == SECOND_ID


def test_completions_and_chat_completions_equal_pawfns_own_route(server: ServeProcess, local_runs: LocalRuns) -> None:
    client = _client(server)
    for program, text in ((FIRST_ID, INPUTS[0]), ("tiny-second", INPUTS[1]), (FIRST_ID, INPUTS[4])):
        own = _own_route(server, program, text, {"max_tokens": 12}).generation
        completion = client.completions.create(model=program, prompt=text, max_tokens=12)
        assert completion.choices[0].text == own.text and completion.model == program
        assert completion.choices[0].finish_reason == ("length" if own.stop_reason == "max_tokens" else "stop")
        assert completion.usage is not None
        assert (completion.usage.completion_tokens, completion.usage.prompt_tokens) == (len(own.token_ids), own.prefix_tokens + own.prompt_tokens)
        raw = client.chat.completions.with_raw_response.create(
            model=program, max_tokens=12, messages=[{"role": "system", "content": "You are helpful."}, {"role": "user", "content": text}]
        )
        assert raw.headers["x-pawfn-ignored-messages"] == "system"  # the system message is not part of the input, and it says so
        assert raw.headers["x-request-id"]
        chat = raw.parse()
        assert chat.choices[0].message.content == own.text and chat.choices[0].message.role == "assistant"
        assert chat.usage is not None and chat.usage.completion_tokens == len(own.token_ids)
        assert chat.usage.prompt_tokens_details is not None and chat.usage.prompt_tokens_details.cached_tokens == own.prefix_tokens
    expected = local_runs[FIRST_ID].generate(INPUTS[2], RuntimeOptions(max_tokens=12))  # and the in-process program's tokens
    conversation = [{"role": "user", "content": "an earlier turn"}, {"role": "assistant", "content": "x"}, {"role": "user", "content": INPUTS[2]}]
    last_user = client.chat.completions.with_raw_response.create(model=FIRST_ID, max_tokens=12, messages=conversation)  # type: ignore[arg-type]
    assert last_user.parse().choices[0].message.content == expected.text
    assert last_user.headers["x-pawfn-ignored-messages"] == "user,assistant"


def test_a_stop_sequence_n_choices_and_a_seed_act_as_openai_documents(server: ServeProcess) -> None:
    client = _client(server)
    whole = _own_route(server, FIRST_ID, INPUTS[0], {"max_tokens": 20}).generation.text
    stop = whole[len(whole) // 2 : len(whole) // 2 + 2].strip() or whole[len(whole) // 2]
    stopped = client.completions.create(model=FIRST_ID, prompt=INPUTS[0], max_tokens=20, stop=[stop])
    assert stopped.choices[0].text == whole[: whole.find(stop)].strip() and stopped.choices[0].finish_reason == "stop"
    greedy = client.chat.completions.create(model=FIRST_ID, max_tokens=8, n=3, messages=[{"role": "user", "content": INPUTS[1]}])
    assert [choice.index for choice in greedy.choices] == [0, 1, 2] and len({choice.message.content for choice in greedy.choices}) == 1
    sampled = [
        client.chat.completions.create(model=FIRST_ID, max_tokens=8, n=3, temperature=1.5, seed=5, messages=[{"role": "user", "content": "hi"}])
        for _ in range(2)
    ]
    assert [c.message.content for c in sampled[0].choices] == [c.message.content for c in sampled[1].choices]  # seeded: repeatable
    assert len({c.message.content for c in sampled[0].choices}) > 1  # each choice its own seed
    several = client.completions.create(model=FIRST_ID, prompt=[INPUTS[0], INPUTS[1]], max_tokens=6, n=2)
    assert [choice.text for choice in several.choices[::2]] == [
        _own_route(server, FIRST_ID, text, {"max_tokens": 6}).generation.text for text in INPUTS[:2]
    ]


def test_streams_reassemble_to_the_same_text_with_usage(server: ServeProcess) -> None:
    async def scenario() -> None:
        async with openai.AsyncOpenAI(base_url=f"{server.url}/v1", api_key=KEY, max_retries=0) as client:
            for text in INPUTS:
                own = _own_route(server, FIRST_ID, text, {"max_tokens": 16}).generation
                stream = await client.chat.completions.create(
                    model=FIRST_ID, max_tokens=16, stream=True, stream_options={"include_usage": True}, messages=[{"role": "user", "content": text}]
                )
                chunks = [chunk async for chunk in stream]
                assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == own.text
                assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] in ("stop", "length")
                assert chunks[-1].choices == [] and chunks[-1].usage is not None
                assert chunks[-1].usage.completion_tokens == len(own.token_ids)
                completion = await client.completions.create(model=FIRST_ID, prompt=text, max_tokens=16, stream=True)
                assert "".join([chunk.choices[0].text async for chunk in completion]) == own.text

    asyncio.run(scenario())
    with _client(server).completions.create(model=FIRST_ID, prompt=INPUTS[0], max_tokens=16, stream=True, n=2) as stream:
        texts = ["", ""]
        for chunk in stream:
            for choice in chunk.choices:
                texts[choice.index] += choice.text
    assert texts == [_own_route(server, FIRST_ID, INPUTS[0], {"max_tokens": 16}).generation.text] * 2


class Ticket(BaseModel):
    urgent: bool
    team: Literal["ops", "dev"]


def test_structured_output_from_a_pydantic_model_is_decoded_under_its_schema(long_calls_server: ServeProcess) -> None:
    server = long_calls_server  # room for a JSON value: the random tiny model spends tokens on whitespace
    sent: list[bytes] = []

    def record(request: httpx2.Request) -> None:
        sent.append(request.read())

    http_client = httpx2.Client(event_hooks={"request": [record]})
    client = _client(server, http_client=http_client)
    parsed = client.chat.completions.parse(model=FIRST_ID, max_tokens=200, messages=[{"role": "user", "content": INPUTS[0]}], response_format=Ticket)
    ticket = parsed.choices[0].message.parsed
    assert isinstance(ticket, Ticket)
    response_format = json.loads(sent[-1])["response_format"]  # the schema the client made of the model, replayed on pawfn's route
    own = _own_route(server, FIRST_ID, INPUTS[0], {"max_tokens": 200, "response_format": response_format}).generation
    assert parsed.choices[0].message.content == own.text and Ticket.model_validate_json(own.text) == ticket
    labels = client.chat.completions.create(
        model=FIRST_ID, max_tokens=8, messages=[{"role": "user", "content": INPUTS[1]}], extra_body={"structured_outputs": {"choice": ["yes", "no"]}}
    )
    assert labels.choices[0].message.content in ("yes", "no")
    as_json = client.chat.completions.create(
        model=FIRST_ID, max_tokens=400, messages=[{"role": "user", "content": INPUTS[1]}], response_format={"type": "json_object"}
    )
    assert isinstance(json.loads(as_json.choices[0].message.content or ""), dict)


def test_errors_are_openais_error_objects_with_the_request_id(server: ServeProcess) -> None:
    client = _client(server)
    user: list[ChatCompletionMessageParam] = [{"role": "user", "content": "x"}]
    with pytest.raises(openai.NotFoundError) as missing:
        client.chat.completions.create(model="c2c2c2c2c2c2c2c2c2c2", messages=user)
    assert (missing.value.status_code, missing.value.type, missing.value.code) == (404, "invalid_request_error", "model_not_found")
    assert missing.value.request_id
    with pytest.raises(openai.BadRequestError) as tools:
        client.chat.completions.create(model=FIRST_ID, messages=user, tools=[{"type": "function", "function": {"name": "f", "parameters": {}}}])
    assert (tools.value.param, tools.value.code, tools.value.type) == ("tools", "unsupported_parameter", "invalid_request_error")
    assert "tools" in tools.value.message
    with pytest.raises(openai.BadRequestError) as unknown:
        client.completions.create(model=FIRST_ID, prompt="x", extra_body={"max_token": 5})
    assert unknown.value.param == "max_token"
    hostiles: list[dict[str, object]] = [{"choice": []}, {"choice": [""]}, {"regex": "x" * 2100}, {"choice": ["a"], "regex": "a"}]
    for hostile in hostiles:
        with pytest.raises(openai.BadRequestError) as constrained:
            client.completions.create(model=FIRST_ID, prompt="x", extra_body={"structured_outputs": hostile})
        assert constrained.value.param is not None and constrained.value.param.startswith("structured_outputs")
    with pytest.raises(openai.BadRequestError) as too_many:
        client.completions.create(model=FIRST_ID, prompt="x", max_tokens=10_000)
    assert too_many.value.param == "max_tokens"
    with pytest.raises(openai.BadRequestError) as invalid:
        client.chat.completions.create(model=FIRST_ID, messages=[{"role": "nobody", "content": "x"}])  # type: ignore[list-item,misc]
    assert invalid.value.type == "invalid_request_error" and invalid.value.param is not None
    with pytest.raises(openai.AuthenticationError) as refused:
        openai.OpenAI(base_url=f"{server.url}/v1", api_key="wrong", max_retries=0).models.list()
    assert (refused.value.status_code, refused.value.code) == (401, "invalid_api_key")
    zero_penalty = client.completions.create(model=FIRST_ID, prompt="x", max_tokens=2, frequency_penalty=0, presence_penalty=0)
    assert zero_penalty.choices  # a parameter sent with the value that asks for nothing is no error


def test_a_client_that_leaves_a_stream_stops_its_decoding(long_calls_server: ServeProcess) -> None:
    server = long_calls_server
    before = decode_steps(server)
    client = _client(server)
    with client.completions.create(model=FIRST_ID, prompt="hello", max_tokens=2000, stream=True) as stream:
        next(iter(stream))
        wait_decoding(server, before)
    assert settled_steps(server) - before < STOPPED  # the call would have taken ~1,990 steps
    deadline = time.monotonic() + 10
    while httpx.get(f"{server.url}/healthz").json()["queued"] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert httpx.get(f"{server.url}/healthz").json()["queued"] == 0


def test_a_full_queue_is_429_and_a_shutdown_503_in_openais_shape() -> None:
    from pawfn.core.errors import ProgramClosedError

    service = ScriptedService()

    async def scenario() -> None:
        transport = httpx2.ASGITransport(app=create_app(service, ServeSettings(max_queue=1)))
        async with (
            httpx2.AsyncClient(transport=transport) as http,
            openai.AsyncOpenAI(base_url="http://test/v1", api_key="none", max_retries=0, http_client=http) as client,
        ):
            held = asyncio.create_task(client.completions.create(model="p", prompt="a"))
            while service.started < 1:
                await asyncio.sleep(0.01)
            with pytest.raises(openai.RateLimitError) as full:
                await client.completions.create(model="p", prompt="b")
            assert (full.value.type, full.value.code, full.value.response.headers["retry-after"]) == ("requests", "rate_limit_exceeded", "1")
            assert full.value.request_id
            service.release.set()
            assert (await held).choices[0].text == "a"

            async def closed(reference: str, text: object, options: RuntimeOptions) -> RunResponse:
                raise ProgramClosedError("the program was closed")

            service.run = closed  # type: ignore[method-assign]  # the server shutting down under the call
            with pytest.raises(openai.InternalServerError) as shutting:
                await client.chat.completions.create(model="p", messages=[{"role": "user", "content": "c"}])
            assert (shutting.value.status_code, shutting.value.type, shutting.value.code) == (503, "server_error", "shutting_down")

    asyncio.run(scenario())


def test_the_guides_openai_example_runs_against_the_server(long_calls_server: ServeProcess) -> None:
    """docs/guide.md's `openai` block as written, pointed at this server (its program served as `triage`)."""
    guide = (Path(__file__).resolve().parents[2] / "docs" / "guide.md").read_text(encoding="utf-8")
    blocks = [block for block in re.findall(r"```python\n(.*?)```", guide, flags=re.DOTALL) if "OpenAI(" in block]
    assert len(blocks) == 1
    script = blocks[0].replace("http://127.0.0.1:8000", long_calls_server.url).replace('"triage"', f'"{FIRST_ID}"')
    done = subprocess.run(
        [sys.executable, "-c", script], env={**os.environ, "PAWFN_KEY": KEY}, capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert FIRST_ID in done.stdout and "urgent=" in done.stdout


def _metric(server: ServeProcess, name: str) -> float:
    text = httpx.get(f"{server.url}/metrics", headers=AUTH).text
    return next(float(line.split()[1]) for line in text.splitlines() if line.startswith(name + " ") or line.startswith(name + "_total "))


def test_a_repeated_call_is_answered_from_the_servers_result_cache_unless_told_not_to(server: ServeProcess) -> None:
    body = {"input": "a cached input", "options": {"max_tokens": 20}}

    def run(headers: dict[str, str]) -> RunResponse:
        response = httpx.post(f"{server.url}/v1/programs/{SECOND_ID}/run", json=body, headers={**AUTH, **headers}, timeout=60)
        assert response.status_code == 200, response.text
        return RunResponse.model_validate_json(response.content)

    first = run({})
    hits = _metric(server, "pawfn_result_cache_hits")
    assert run({}) == first  # the very generation, its timings too: nothing computed
    assert _metric(server, "pawfn_result_cache_hits") == hits + 1 and _metric(server, "pawfn_result_cache_bytes") > 0
    fresh = run({"Cache-Control": "no-cache"})
    assert fresh.generation.token_ids == first.generation.token_ids and fresh.generation.timings != first.generation.timings
    assert _metric(server, "pawfn_result_cache_hits") == hits + 1
    chat = _client(server).chat.completions.create(model=SECOND_ID, max_tokens=20, messages=[{"role": "user", "content": "a cached input"}])
    assert chat.choices[0].message.content == first.generation.text and _metric(server, "pawfn_result_cache_hits") == hits + 2


def test_a_messages_image_parts_are_the_calls_image_arguments_in_order() -> None:
    pytest.importorskip("PIL", reason="images need the vision extra")
    import base64
    import io

    from PIL import Image as PILImage

    from pawfn import Image

    given: list[object] = []

    class Recording(ScriptedService):
        async def run(self, reference: str, text: object, options: RuntimeOptions) -> RunResponse:
            given.append(text)
            self.release.set()
            return await super().run(reference, "ok", options)

    buffer = io.BytesIO()
    PILImage.new("RGB", (8, 6), (200, 10, 10)).save(buffer, format="PNG")
    url = "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()
    content = [{"type": "text", "text": "What is it?"}, {"type": "image_url", "image_url": {"url": url}}]

    async def scenario() -> tuple[httpx2.Response, httpx2.Response]:
        transport = httpx2.ASGITransport(app=create_app(Recording()))
        async with httpx2.AsyncClient(transport=transport, base_url="http://test") as client:
            answered = await client.post("/v1/chat/completions", json={"model": "p", "messages": [{"role": "user", "content": content}]})
            fetched = {"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}}
            refused = await client.post("/v1/chat/completions", json={"model": "p", "messages": [{"role": "user", "content": [fetched]}]})
            return answered, refused

    answered, refused = asyncio.run(scenario())
    assert answered.status_code == 200, answered.text
    call = given[0]
    assert isinstance(call, tuple) and call[0] == "What is it?" and isinstance(call[1], Image) and call[1].rgb().size == (8, 6)
    assert refused.status_code == 400 and refused.json()["error"]["code"] == "invalid_image_url" and given[1:] == []


_TEXT = st.text(max_size=12)
_ANY = st.none() | st.booleans() | st.integers(-3, 3000) | st.floats(allow_nan=False, allow_infinity=False) | _TEXT
_PART = st.fixed_dictionaries({"type": st.sampled_from(["text", "image_url", "audio"])}, optional={"text": _ANY, "image_url": _ANY})
_MESSAGE = st.fixed_dictionaries(
    {"role": st.sampled_from(["system", "user", "assistant", "tool", "robot"])}, optional={"content": _ANY | st.lists(_PART, max_size=3)}
)
_OPENAI_BODIES = st.fixed_dictionaries(
    {},
    optional={
        "model": st.sampled_from(["p", "q", ""]) | _ANY,
        "messages": st.lists(_MESSAGE, max_size=4) | _ANY,
        "prompt": _TEXT | st.lists(_TEXT, max_size=20) | _ANY,
        "max_tokens": _ANY,
        "max_completion_tokens": _ANY,
        "temperature": _ANY,
        "top_p": _ANY,
        "seed": st.integers() | _ANY,
        "stop": _ANY | st.lists(_TEXT, max_size=6),
        "n": st.integers(-1, 40) | _ANY,
        "stream": _ANY,
        "stream_options": _ANY | st.fixed_dictionaries({}, optional={"include_usage": _ANY}),
        "response_format": _ANY | st.fixed_dictionaries({"type": st.sampled_from(["text", "json_object", "json_schema", "xml"])}),
        "structured_outputs": _ANY | st.fixed_dictionaries({}, optional={"choice": st.lists(_TEXT, max_size=3) | _ANY, "regex": _ANY}),
        "tools": _ANY | st.lists(_ANY, max_size=2),
        "logprobs": _ANY,
        "frequency_penalty": _ANY,
        "user": _ANY,
    },
)


@FUZZ
@given(route=st.sampled_from(["/v1/chat/completions", "/v1/completions"]), body=_OPENAI_BODIES)
def test_any_openai_body_gets_an_answer_or_openais_error_never_a_crash(route: str, body: dict[str, object]) -> None:

    class AnyInput(ScriptedService):
        async def run(self, reference: str, text: object, options: RuntimeOptions) -> RunResponse:
            return await super().run(reference, "answer", options)

    async def scenario() -> None:
        service = AnyInput()
        service.release.set()
        transport = httpx2.ASGITransport(app=create_app(service, ServeSettings(max_body_bytes=4096)))
        async with httpx2.AsyncClient(transport=transport, base_url="http://test") as client:
            response = await client.post(route, json=body)
            assert response.status_code in (200, 400, 404, 413, 429), response.text
            if response.status_code != 200:
                error = response.json()["error"]
                assert set(error) == {"message", "type", "param", "code"} and error["message"] and error["type"] == "invalid_request_error"

    asyncio.run(scenario())
