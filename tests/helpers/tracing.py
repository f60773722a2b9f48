"""OpenTelemetry's in-memory exporter for tests: one SDK tracer provider for the test process (OpenTelemetry lets a
process set its provider once), whose spans are kept only inside `captured_spans()`."""

from __future__ import annotations

from collections.abc import Generator
from contextlib import contextmanager
from functools import cache

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter


class _WhileCapturing(SpanProcessor):
    """Hands spans to the in-memory exporter only while a test captures them (the rest of the session keeps none)."""

    def __init__(self, exporter: InMemorySpanExporter) -> None:
        self.inner = SimpleSpanProcessor(exporter)
        self.capturing = False

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        pass

    def on_end(self, span: ReadableSpan) -> None:
        if self.capturing:
            self.inner.on_end(span)


@cache
def _processor() -> tuple[_WhileCapturing, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = trace.get_tracer_provider()
    if not isinstance(provider, TracerProvider):
        provider = TracerProvider()
        trace.set_tracer_provider(provider)
    processor = _WhileCapturing(exporter)
    provider.add_span_processor(processor)
    return processor, exporter


@contextmanager
def captured_spans() -> Generator[InMemorySpanExporter]:
    """The spans that end inside the block (tracing stays on for the process once a test has asked)."""
    processor, exporter = _processor()
    exporter.clear()
    processor.capturing = True
    try:
        yield exporter
    finally:
        processor.capturing = False
