"""OpenTelemetry traces of calls and requests, where the `otel` extra (opentelemetry-api) is installed: nothing is
imported, and nothing costs, without it; with it and no SDK configured, OpenTelemetry's own no-op tracer answers.

A call is one `pawfn.call` span (from its submission to its end) with its phases as children, `pawfn.queue` (waiting
for the scheduler), `pawfn.prompt` (tokenizing and evaluating input + suffix) and `pawfn.decode`, drawn from the
call's own `Timings` once it has ended, so nothing is added to the decode loop. Its attributes follow OpenTelemetry's
GenAI conventions (`gen_ai.request.model`, `gen_ai.usage.*`) beside pawfn's (`pawfn.program_id`, `pawfn.numerics`,
`pawfn.request_id`, `pawfn.cache_hit`). A server's request is a `pawfn.request` span that continues the caller's
`traceparent`; the calls it starts are its children.
"""

from __future__ import annotations

import importlib.util
import time
from collections.abc import Generator, Mapping
from contextlib import contextmanager
from functools import cache
from typing import TYPE_CHECKING

from .results import Generation

if TYPE_CHECKING:
    from opentelemetry.context import Context
    from opentelemetry.trace import Span, Tracer

__all__ = ["CallTrace", "end_span", "phase_span", "request_span", "tracer", "tracing_calls"]


@cache
def tracer() -> Tracer | None:
    """pawfn's tracer, None where opentelemetry-api is not installed."""
    try:
        if importlib.util.find_spec("opentelemetry") is None:
            return None
    except (ImportError, ValueError):  # a broken or hidden installation counts as none
        return None
    from importlib import metadata

    from opentelemetry import trace

    return trace.get_tracer("pawfn", metadata.version("pawfn"))


def tracing_calls() -> bool:
    """Whether calls are traced now (an SDK records spans)."""
    return _recording() is not None


def _recording() -> Tracer | None:
    """The tracer, where a configured SDK records spans (None: nothing would be kept, so nothing is made)."""
    found = tracer()
    if found is None:
        return None
    from opentelemetry import trace

    provider = trace.get_tracer_provider()
    return None if type(provider).__name__ in ("ProxyTracerProvider", "NoOpTracerProvider") else found


class CallTrace:
    """One call's span, made once it ends from the times it took; `start` at its submission, in its caller's context."""

    def __init__(self, program: str, program_id: str | None, request_id: str | None) -> None:
        from opentelemetry import context

        self._parent: Context = context.get_current()
        self._started_ns = time.time_ns()
        self._attributes: dict[str, str | int | bool] = {"gen_ai.operation.name": "text_completion", "gen_ai.request.model": program}
        if program_id is not None:
            self._attributes["pawfn.program_id"] = program_id
        if request_id is not None:
            self._attributes["pawfn.request_id"] = request_id

    @classmethod
    def start(cls, program: str, program_id: str | None, request_id: str | None) -> CallTrace | None:
        """A call's trace, None where nothing records spans."""
        return None if _recording() is None else cls(program, program_id, request_id)

    def ended(self, generation: Generation | None, cache_hit: bool = False, failure: BaseException | None = None) -> None:
        """Make the call's spans: it ended now, with `generation` (None: it failed with `failure`)."""
        found = tracer()
        if found is None:
            return
        from opentelemetry import trace
        from opentelemetry.trace import Status, StatusCode

        ended_ns = time.time_ns()
        span = found.start_span("pawfn.call", context=self._parent, start_time=self._started_ns, attributes=self._attributes)
        if generation is not None:
            span.set_attributes(
                {
                    "gen_ai.usage.input_tokens": generation.prefix_tokens + generation.prompt_tokens,
                    "gen_ai.usage.output_tokens": len(generation.token_ids),
                    "gen_ai.response.finish_reasons": (generation.stop_reason,),
                    "pawfn.cache_hit": cache_hit,
                }
            )
            if generation.numerics is not None:
                span.set_attribute("pawfn.numerics", generation.numerics)
            if not cache_hit:
                inside = trace.set_span_in_context(span, self._parent)
                timings = generation.timings
                began_ns = max(self._started_ns, ended_ns - int(timings.total_ms * 1e6))
                prompt_ns = began_ns + int((timings.tokenize_ms + timings.prompt_ms) * 1e6)
                phases = (("pawfn.queue", self._started_ns, began_ns), ("pawfn.prompt", began_ns, prompt_ns), ("pawfn.decode", prompt_ns, ended_ns))
                for name, start, end in phases:
                    found.start_span(name, context=inside, start_time=start).end(end_time=max(start, end))
        elif failure is not None:
            span.record_exception(failure)
            span.set_status(Status(StatusCode.ERROR, type(failure).__name__))
        span.end(end_time=ended_ns)


@contextmanager
def request_span(headers: Mapping[str, str], name: str, attributes: Mapping[str, str]) -> Generator[Span | None]:
    """A server request's span, current inside the block, continuing the `traceparent` in `headers` (None where
    nothing records spans); the caller ends it (a stream's response ends after the block)."""
    found = _recording()
    if found is None:
        yield None
        return
    from opentelemetry import context, propagate
    from opentelemetry.trace import SpanKind, set_span_in_context

    span = found.start_span(name, context=propagate.extract(dict(headers)), kind=SpanKind.SERVER, attributes=dict(attributes))
    token = context.attach(set_span_in_context(span))
    try:
        yield span
    finally:
        context.detach(token)


@contextmanager
def phase_span(name: str, attributes: Mapping[str, str] | None = None, *, current: bool = True) -> Generator[None]:
    """A span around the block, a child of the current one (nothing where nothing records spans); `current=False`
    leaves it out of the context (around a generator's yields, whose context may not be the one it began in)."""
    found = _recording()
    if found is None:
        yield
        return
    if current:
        with found.start_as_current_span(name, attributes=dict(attributes or {})):
            yield
        return
    span = found.start_span(name, attributes=dict(attributes or {}))
    try:
        yield
    finally:
        span.end()


def end_span(span: Span | None, attributes: Mapping[str, str | int]) -> None:
    """End `span` with `attributes` set (nothing for None)."""
    if span is not None:
        span.set_attributes(dict(attributes))
        span.end()
