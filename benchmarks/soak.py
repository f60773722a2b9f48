"""Soak: load and close programs over and over, with thousands of calls from threads and asyncio tasks (some
cancelled), and show that the process's memory, open files and threads stay bounded.

Each cycle loads two programs on one base (Torch), runs `--calls` calls from 8 threads, as many `arun` tasks
(every 4th cancelled as it starts) and a `run_batch`, then closes both programs. Printed per cycle: calls, RSS,
open file descriptors, Python and OS threads. The bounds are checked against the first cycle (the warm-up:
torch's thread pool, allocator caches):

    python benchmarks/soak.py --tiny [--cycles 20] [--calls 200]           # tiny generated models (dev extras)
    python benchmarks/soak.py --program BUNDLE --base GGUF [--cycles N] [--calls N]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from pawfn import InterpreterModel, PawConfig, PawFn, RuntimeOptions, Torch

INPUTS = ["hello", "Urgent: the server is down!", "a", "numbers 1 2 3", "the end is near"]


@dataclass(frozen=True)
class Cycle:
    """What the process held after one cycle."""

    calls: int
    cancelled: int
    rss_mb: float
    open_files: int
    python_threads: int
    os_threads: int
    seconds: float


def _status(field: str) -> int:
    """A number from /proc/self/status (kB for sizes)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


def _cycle(bundles: list[Path], base: Path, calls: int, config: PawConfig) -> tuple[int, int]:
    """One load-run-close cycle; (calls that ran, calls cancelled)."""
    programs: list[PawFn[InterpreterModel, Torch]] = [PawFn.load_any_sync(str(bundle), Torch, base=base, config=config) for bundle in bundles]
    options = RuntimeOptions(max_tokens=6)
    done = 0
    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(lambda i: programs[i % len(programs)].generate(INPUTS[i % len(INPUTS)], options), range(calls)))
    done += len(results)

    async def tasks() -> tuple[int, int]:
        running = [asyncio.create_task(programs[i % len(programs)].arun(INPUTS[i % len(INPUTS)], options)) for i in range(calls)]
        for index in range(0, calls, 4):
            running[index].cancel()
        outcomes = await asyncio.gather(*running, return_exceptions=True)
        cancelled = sum(isinstance(outcome, asyncio.CancelledError) for outcome in outcomes)
        failed = [outcome for outcome in outcomes if isinstance(outcome, BaseException) and not isinstance(outcome, asyncio.CancelledError)]
        if failed:
            raise failed[0]
        return len(outcomes) - cancelled, cancelled

    ran, cancelled = asyncio.run(tasks())
    done += ran + len(programs[0].run_batch(INPUTS, options))
    for program in programs:
        program.close()
    return done, cancelled


def soak(bundles: list[Path], base: Path, cycles: int, calls: int) -> list[Cycle]:
    """Run `cycles` cycles of `calls` thread calls and `calls` tasks each; the process's state after each."""
    config = PawConfig(max_model_copies=8, max_batch_rows=8)
    measured: list[Cycle] = []
    for _ in range(cycles):
        started = time.perf_counter()
        ran, cancelled = _cycle(bundles, base, calls, config)
        measured.append(
            Cycle(
                calls=ran,
                cancelled=cancelled,
                rss_mb=_status("VmRSS") / 1024,
                open_files=len(os.listdir("/proc/self/fd")),
                python_threads=threading.active_count(),
                os_threads=_status("Threads"),
                seconds=time.perf_counter() - started,
            )
        )
    return measured


def check_bounds(cycles: list[Cycle], rss_growth_mb: float) -> list[str]:
    """What grew past its bound after the first cycle: RSS by more than `rss_growth_mb`, any open file, any Python
    thread, more than one OS thread."""
    first, problems = cycles[0], []
    for index, cycle in enumerate(cycles[1:], start=2):
        if cycle.rss_mb > first.rss_mb + rss_growth_mb:
            problems.append(f"cycle {index}: RSS {cycle.rss_mb:.0f} MB, {cycle.rss_mb - first.rss_mb:.0f} MB above cycle 1")
        if cycle.open_files > first.open_files:
            problems.append(f"cycle {index}: {cycle.open_files} open files, cycle 1 had {first.open_files}")
        # one OS thread of slack: a worker that has finished may still be exiting when the cycle is measured
        if cycle.os_threads > first.os_threads + 1 or cycle.python_threads > first.python_threads:
            problems.append(f"cycle {index}: {cycle.os_threads} threads, cycle 1 had {first.os_threads}")
    return problems


def _tiny(folder: Path) -> tuple[list[Path], Path]:
    """Two programs on a tiny generated Qwen3 interpreter (the test suite's generators; needs the dev extras)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from tests.helpers.programs import make_program
    from tests.helpers.tiny_models import build_interpreter

    interpreter = build_interpreter("qwen3", folder)
    programs = [make_program(interpreter, folder, f"program-{seed}", seed=seed) for seed in (1, 2)]
    return [program.folder for program in programs], interpreter.gguf_path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--tiny", action="store_true", help="generate two tiny programs and use them")
    parser.add_argument("--program", type=Path, action="append", default=[], help="a bundle (repeatable)")
    parser.add_argument("--base", type=Path)
    parser.add_argument("--cycles", type=int, default=20)
    parser.add_argument("--calls", type=int, default=200, help="thread calls and asyncio tasks per cycle, each")
    parser.add_argument("--rss-growth-mb", type=float, default=64.0, help="bound on RSS growth after cycle 1")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        if args.tiny:
            bundles, base = _tiny(Path(scratch))
        elif args.program and args.base:
            bundles, base = args.program, args.base
        else:
            parser.error("give --tiny, or --program BUNDLE (repeatable) and --base PATH")
        print(f"{'cycle':>5} {'calls':>6} {'cancelled':>9} {'RSS MB':>7} {'open files':>10} {'py threads':>10} {'OS threads':>10} {'s':>6}")
        cycles = soak(bundles, base, args.cycles, args.calls)
        for index, cycle in enumerate(cycles, start=1):
            print(
                f"{index:5} {cycle.calls:6} {cycle.cancelled:9} {cycle.rss_mb:7.0f} {cycle.open_files:10} "
                f"{cycle.python_threads:10} {cycle.os_threads:10} {cycle.seconds:6.1f}"
            )
        total = sum(cycle.calls for cycle in cycles)
        problems = check_bounds(cycles, args.rss_growth_mb)
        print(
            f"{total} calls in {len(cycles)} cycles; bounds after cycle 1: RSS +{args.rss_growth_mb:.0f} MB, no new open "
            f"files or Python threads, at most 1 more OS thread: {'held' if not problems else 'BROKEN: ' + '; '.join(problems)}"
        )
        if problems:
            raise SystemExit(1)


if __name__ == "__main__":
    main()
