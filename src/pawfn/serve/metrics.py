"""Prometheus metrics of one server, in a registry of its own (so several apps in one process never collide)."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from .service import ServiceCounters

__all__ = ["ServerMetrics"]

_LATENCY_BUCKETS_S = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
_SIZE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128)


class _ServiceTotals(Collector):
    """The service's own running totals, read when scraped."""

    def __init__(self, counters: Callable[[], ServiceCounters]) -> None:
        self._counters = counters

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        totals = self._counters()
        yield CounterMetricFamily("pawfn_decode_steps", "Decode steps (forward passes over one or more rows)", value=totals.decode_steps)
        yield CounterMetricFamily(
            "pawfn_decode_rows", "Rows the decode steps advanced (rows / steps is the mean batch size)", value=totals.decode_rows
        )
        yield CounterMetricFamily("pawfn_replica_retries", "Calls sent again because the replica holding them died", value=totals.replica_retries)
        yield CounterMetricFamily("pawfn_program_loads", "Programs loaded on a request (first, or after an eviction)", value=totals.program_loads)
        yield CounterMetricFamily("pawfn_program_evictions", "Idle programs unloaded to keep the resident budget", value=totals.program_evictions)
        yield CounterMetricFamily("pawfn_program_cold_start_seconds", "Seconds the loads on a request took, in all", value=totals.cold_start_s)
        yield CounterMetricFamily("pawfn_result_cache_hits", "Calls the result cache answered", value=totals.cache_hits)
        yield CounterMetricFamily(
            "pawfn_result_cache_misses", "Deterministic calls the result cache did not hold (computed, then stored)", value=totals.cache_misses
        )
        yield GaugeMetricFamily("pawfn_result_cache_bytes", "Bytes the result cache holds", value=totals.cache_bytes)


class ServerMetrics:
    """Requests, latency, tokens, batch sizes and queue length of one server."""

    def __init__(self, queued: Callable[[], int], counters: Callable[[], ServiceCounters]) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter("pawfn_requests", "HTTP requests by route and status", ["route", "status"], registry=self.registry)
        self.latency = Histogram(
            "pawfn_request_seconds",
            "Time from the request to the end of its response (a stream: its last event), in seconds",
            ["route"],
            buckets=_LATENCY_BUCKETS_S,
            registry=self.registry,
        )
        self.generated_tokens = Counter("pawfn_generated_tokens", "Tokens generated, by program", ["program"], registry=self.registry)
        self.prompt_tokens = Counter("pawfn_prompt_tokens", "Input + suffix tokens evaluated, by program", ["program"], registry=self.registry)
        self.batch_inputs = Histogram("pawfn_batch_inputs", "Inputs per run_batch request", buckets=_SIZE_BUCKETS, registry=self.registry)
        queue = Gauge("pawfn_queue_length", "Calls accepted and not yet ended", registry=self.registry)
        queue.set_function(lambda: float(queued()))
        self.registry.register(_ServiceTotals(counters))

    def render(self) -> tuple[bytes, str]:
        """The exposition text and its content type."""
        return generate_latest(self.registry), CONTENT_TYPE_LATEST
