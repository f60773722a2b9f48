"""OpenTelemetry traces: a call's span and its phases from the in-process API, and a server request's span that
continues the caller's `traceparent`, with the calls it starts as its children; nothing without the extra."""

from __future__ import annotations

import asyncio
import subprocess
import sys

import httpx
import pytest

from pawfn import PawConfig, PawFn, Qwen3_0_6B, RuntimeOptions, Torch
from tests.helpers.programs import TinyProgram

pytest.importorskip("opentelemetry.sdk", reason="traces are tested with OpenTelemetry's SDK (the dev extra)")

from opentelemetry import trace  # noqa: E402 - after the skip
from opentelemetry.sdk.trace import ReadableSpan  # noqa: E402

from tests.helpers.tracing import captured_spans  # noqa: E402 - after the skip


def test_a_call_is_a_span_with_its_phases_under_the_callers_span(qwen3_program: TinyProgram) -> None:
    with captured_spans() as exporter, PawFn[Qwen3_0_6B, Torch].load_sync(qwen3_program.archive, base=qwen3_program.interpreter.gguf_path) as program:
        with trace.get_tracer("app").start_as_current_span("handler") as handler:
            generation = program.generate("hello world", RuntimeOptions(max_tokens=6))
    spans = {span.name: span for span in exporter.get_finished_spans()}
    call = spans["pawfn.call"]
    assert call.parent is not None and call.parent.span_id == handler.get_span_context().span_id and call.context is not None
    assert call.attributes is not None
    assert call.attributes["gen_ai.usage.output_tokens"] == len(generation.token_ids)
    assert call.attributes["gen_ai.usage.input_tokens"] == generation.prefix_tokens + generation.prompt_tokens
    assert call.attributes["pawfn.numerics"] == generation.numerics and call.attributes["pawfn.cache_hit"] is False
    for phase in ("pawfn.queue", "pawfn.prompt", "pawfn.decode"):
        parent = spans[phase].parent
        assert parent is not None and parent.span_id == call.context.span_id
        assert call.start_time is not None and call.end_time is not None
        assert call.start_time <= (spans[phase].start_time or 0) <= (spans[phase].end_time or 0) <= call.end_time


def test_a_result_cache_hit_is_a_call_span_that_says_so_without_phases(qwen3_program: TinyProgram) -> None:
    config = PawConfig(result_cache_bytes=1 << 20)
    with PawFn[Qwen3_0_6B, Torch].load_sync(qwen3_program.archive, base=qwen3_program.interpreter.gguf_path, config=config) as program:
        options = RuntimeOptions(max_tokens=5, seed=1, temperature=0.7)
        program.generate("traced twice", options)
        with captured_spans() as exporter:
            program.generate("traced twice", options)
            program.generate_batch(["traced twice"], options)
    spans = exporter.get_finished_spans()
    assert [span.name for span in spans] == ["pawfn.call", "pawfn.call"]
    assert all(span.attributes is not None and span.attributes["pawfn.cache_hit"] is True for span in spans)


def _ids(span: ReadableSpan) -> tuple[int, int]:
    """A finished span's trace id and span id."""
    assert span.context is not None
    return span.context.trace_id, span.context.span_id


def test_a_request_continues_the_callers_trace_and_its_calls_are_its_children(qwen3_program: TinyProgram) -> None:
    from pawfn.serve.app import create_app
    from pawfn.serve.service import LocalPrograms

    trace_id, parent_id = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
    service = LocalPrograms(Torch, PawFn[Qwen3_0_6B, Torch].load_sync(qwen3_program.archive, base=qwen3_program.interpreter.gguf_path).config)
    service.load(str(qwen3_program.archive), base=qwen3_program.interpreter.gguf_path, alias="tiny")

    async def scenario() -> httpx.Response:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=create_app(service)), base_url="http://test", timeout=60) as client:
            headers = {"traceparent": f"00-{trace_id}-{parent_id}-01"}
            response = await client.post(
                "/v1/chat/completions", json={"model": "tiny", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}, headers=headers
            )
            await service.aclose()
            return response

    with captured_spans() as exporter:
        response = asyncio.run(scenario())
    assert response.status_code == 200, response.text
    spans = exporter.get_finished_spans()
    request = next(span for span in spans if span.name.startswith("pawfn.request"))
    assert f"{_ids(request)[0]:032x}" == trace_id and request.parent is not None and f"{request.parent.span_id:016x}" == parent_id
    assert request.attributes is not None and request.attributes["pawfn.request_id"] == response.headers["x-request-id"]
    assert request.attributes["http.response.status_code"] == 200 and request.attributes["http.route"] == "/v1/chat/completions"
    call = next(span for span in spans if span.name == "pawfn.call")
    parents = {_ids(span)[1]: span.parent.span_id for span in spans if span.parent is not None}
    ancestors, at = set[int](), _ids(call)[1]
    while at in parents:  # FastAPI's own spans (its endpoint's) may stand between the request and the call
        at = parents[at]
        ancestors.add(at)
    assert _ids(request)[1] in ancestors and _ids(call)[0] == _ids(request)[0]
    assert call.attributes is not None and call.attributes["pawfn.request_id"] == response.headers["x-request-id"]
    assert call.attributes["gen_ai.usage.output_tokens"] == response.json()["usage"]["completion_tokens"]


_HIDDEN = (
    "import importlib.abc, sys\n"
    "class Hidden(importlib.abc.MetaPathFinder):\n"
    "    def find_spec(self, name, path=None, target=None):\n"
    "        if name.split('.')[0] == 'opentelemetry':\n"
    "            raise ModuleNotFoundError(name)\n"
    "sys.meta_path.insert(0, Hidden())\n"
)
"""Run first in a script: opentelemetry as if it were not installed."""


@pytest.mark.parametrize("installed", [False, True], ids=["without the extra", "with it, no SDK configured"])
def test_calls_import_nothing_of_opentelemetry_they_do_not_need(qwen3_program: TinyProgram, installed: bool) -> None:
    script = ("" if installed else _HIDDEN) + (
        "from pawfn import PawConfig, PawFn, Qwen3_0_6B, RuntimeOptions, Torch\n"
        f"with PawFn[Qwen3_0_6B, Torch].load_sync({str(qwen3_program.archive)!r}, base={str(qwen3_program.interpreter.gguf_path)!r}) as p:\n"
        "    p.generate('hi', RuntimeOptions(max_tokens=3))\n"
        "print(sorted({'.'.join(name.split('.')[:2]) for name in sys.modules if name.startswith('opentelemetry')}))\n"
    )
    done = subprocess.run([sys.executable, "-c", "import sys\n" + script], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    imported = done.stdout.strip()
    assert ("'opentelemetry.trace'" in imported and "sdk" not in imported) if installed else imported == "[]"
