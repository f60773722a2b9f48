"""Prometheus metrics of one server, in a registry of its own (so several apps in one process never collide)."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterator

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from ..core.results import Generation
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


class _Resident(Collector):
    """`pawfn_program_resident{program}`: 1 for each program resident now, read when scraped."""

    def __init__(self, counters: Callable[[], ServiceCounters]) -> None:
        self._counters = counters

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = GaugeMetricFamily("pawfn_program_resident", "1 for each program resident now (its series exist while it is)", labels=["program"])
        for name in sorted(self._counters().resident or ()):
            family.add_metric([name], 1.0)
        yield family


class ServerMetrics:
    """Requests, latency, tokens, batch sizes and queue length of one server; per program, while it is resident, its
    calls, tokens, call latency and time to first token (an evicted program's series go with it, so their number
    stays within the resident-program budget)."""

    def __init__(self, queued: Callable[[], int], counters: Callable[[], ServiceCounters]) -> None:
        self._counters = counters
        self._labelled: OrderedDict[str, None] = OrderedDict()
        """Programs with per-program series, least recently counted first."""
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
        self.program_calls = Counter("pawfn_program_calls", "Calls answered, by program", ["program"], registry=self.registry)
        self.call_seconds = Histogram(
            "pawfn_program_call_seconds",
            "A call's time on the server, queue included, by program, in seconds",
            ["program"],
            buckets=_LATENCY_BUCKETS_S,
            registry=self.registry,
        )
        self.first_token_seconds = Histogram(
            "pawfn_program_time_to_first_token_seconds",
            "Time from a call's arrival to its first token (a stream: its first text; a result-cache hit: its answer), by program, in seconds",
            ["program"],
            buckets=_LATENCY_BUCKETS_S,
            registry=self.registry,
        )
        self.batch_inputs = Histogram("pawfn_batch_inputs", "Inputs per run_batch request", buckets=_SIZE_BUCKETS, registry=self.registry)
        queue = Gauge("pawfn_queue_length", "Calls accepted and not yet ended", registry=self.registry)
        queue.set_function(lambda: float(queued()))
        self.registry.register(_ServiceTotals(counters))
        self.registry.register(_Resident(counters))

    def call(self, program: str, generation: Generation, seconds: float, first_token_s: float | None = None) -> None:
        """Count one call of `program` that took `seconds` on the server (`first_token_s`: when its first text came, on
        a stream; else the time before it began generating, or all of it for a cache hit)."""
        if first_token_s is None:
            before_generating = seconds - generation.timings.generate_ms / 1e3
            first_token_s = before_generating if before_generating > 0 else seconds
        self.program_calls.labels(program).inc()
        self.call_seconds.labels(program).observe(seconds)
        self.first_token_seconds.labels(program).observe(first_token_s)
        self.generated_tokens.labels(program).inc(len(generation.token_ids))
        self.prompt_tokens.labels(program).inc(generation.prompt_tokens)
        self._labelled[program] = None
        self._labelled.move_to_end(program)
        while len(self._labelled) > _MAX_PROGRAM_SERIES:
            self._forget(next(iter(self._labelled)))

    def _forget(self, program: str) -> None:
        """Remove `program`'s series."""
        self._labelled.pop(program, None)
        for metric in (self.program_calls, self.call_seconds, self.first_token_seconds, self.generated_tokens, self.prompt_tokens):
            try:
                metric.remove(program)
            except KeyError:
                pass

    def render(self) -> tuple[bytes, str]:
        """The exposition text and its content type, once the series of programs no longer resident are gone."""
        resident = self._counters().resident
        if resident is not None:
            for program in [name for name in self._labelled if name not in resident]:
                self._forget(program)
        return generate_latest(self.registry), CONTENT_TYPE_LATEST


_MAX_PROGRAM_SERIES = 256
"""Programs with per-program series at most, the least recently counted dropped first: the bound where a service
cannot say which programs are resident (Ray's ingress); elsewhere an evicted program's series go at the next scrape."""
