"""`pawfn bench`'s measurement: calls of one loaded program, timed, with the process's peak memory.

The calls are ordinary `generate` calls (warm-up first, then `runs` calls cycling over the inputs, from
`concurrency` threads at once; on the Torch backend the base's scheduler decodes concurrent calls together); the
benchmark only times them.
"""

from __future__ import annotations

import math
import resource
import statistics
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from pydantic import BaseModel, ConfigDict

from ..core.backends import Backend
from .function import PawFn
from ..core.models import InterpreterModel
from ..core.options import RuntimeOptions
from ..core.results import Generation

__all__ = ["BenchResult", "peak_rss_mb", "run_bench"]

M = TypeVar("M", bound=InterpreterModel)
B = TypeVar("B", bound=Backend)


class BenchResult(BaseModel):
    """Figures of one benchmark (times in milliseconds unless named otherwise) and the configuration used."""

    model_config = ConfigDict(frozen=True)

    program: str
    interpreter: str
    backend: str
    engine: str | None
    """What computed the calls where it matters for the figures (llama.cpp: its build and weight repacking)."""
    device: str
    dtype: str
    weight_dtype: str | None
    threads: int | None
    max_model_copies: int
    max_batch_rows: int
    max_tokens: int | None
    runs: int
    concurrency: int
    load_s: float
    """From the start of the load to a program ready to run (base, adapter, prefix), in seconds."""
    median_ms: float
    """Median wall time of one call."""
    p90_ms: float
    ms_per_token: float
    """Median over calls of the call's time divided by its generated tokens (EOS counts as one)."""
    tokens_per_call: float
    calls_per_s: float
    """Calls completed per second of wall time, all callers together."""
    peak_rss_mb: float
    """Peak resident memory of the process, in MiB."""


def peak_rss_mb() -> float:
    """The process's peak resident set size so far, in MiB."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2**20 if sys.platform == "darwin" else peak / 2**10  # bytes on macOS, KiB on Linux


def _percentile(values: Sequence[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(fraction * len(ordered)) - 1))]


def run_bench(
    program: PawFn[M, B], inputs: Sequence[str], options: RuntimeOptions, *, runs: int, concurrency: int, load_s: float, reference: str
) -> tuple[BenchResult, list[Generation]]:
    """Warm up once, then time `runs` calls over `inputs` from `concurrency` threads; the figures and the calls'
    results (in call order)."""
    if runs < 1 or concurrency < 1 or not inputs:
        raise ValueError("a benchmark needs at least one run, one caller and one input")
    program.generate(inputs[0], options)
    timed: list[tuple[float, Generation]] = []

    def call(index: int) -> tuple[float, Generation]:
        started = time.perf_counter()
        generation = program.generate(inputs[index % len(inputs)], options)
        return (time.perf_counter() - started) * 1e3, generation

    started = time.perf_counter()
    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        timed = list(pool.map(call, range(runs)))
    wall_s = time.perf_counter() - started
    times = [ms for ms, _ in timed]
    generations = [generation for _, generation in timed]
    produced = [len(g.token_ids) + (g.stop_reason == "eos") for g in generations]
    config = program.config
    result = BenchResult(
        program=program.program_id or reference,
        interpreter=program.interpreter,
        backend=type(program).backend_type().name,
        engine=program.runtime.engine,
        device=config.device,
        dtype=config.dtype,
        weight_dtype=config.weight_dtype,
        threads=config.threads,
        max_model_copies=config.max_model_copies,
        max_batch_rows=config.max_batch_rows,
        max_tokens=options.max_tokens,
        runs=runs,
        concurrency=concurrency,
        load_s=load_s,
        median_ms=statistics.median(times),
        p90_ms=_percentile(times, 0.9),
        ms_per_token=statistics.median(ms / max(n, 1) for ms, n in zip(times, produced, strict=True)),
        tokens_per_call=statistics.fmean(produced),
        calls_per_s=runs / wall_s,
        peak_rss_mb=peak_rss_mb(),
    )
    return result, generations
