"""Many programs one after another in one process through a `ProgramPool` with a budget: memory stays at the base
plus the budget's programs, and the derived cache (stored prefixes) under its bound.

Loads --programs programs (each its own template, so its own prefix, and its own adapter file) on the
Qwen3-0.6B-shaped base through `ProgramPool.of(PawFn[Qwen3_0_6B, Torch], max_programs=--budget)` with
`PAW_DERIVED_CACHE_MAX_BYTES=--derived-bound`, one 10-token call each; after every program it reads the process's
RSS and the derived cache's size. The bound is the issue's: base + budget programs + 10%, where base + budget
programs is the highest RSS while the first --budget programs come in (no eviction yet). Every fifth program is
called again at the end (evicted long before, it loads again) and must give its first call's tokens.

    python benchmarks/program_budget.py [--workdir /tmp/pawfn-qwen3-shape] [--programs 100] [--budget 8]
    python benchmarks/program_budget.py --tiny [--programs 40] [--budget 4]    # tiny generated models (dev extras)
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
import time
from pathlib import Path

from load_cost import many_bundles


def _rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise KeyError("VmRSS")


async def _run(base: Path, bundles: list[Path], budget: int, cache: Path) -> tuple[list[tuple[float, int, float]], int, int, list[str]]:
    """Per program (RSS MiB, derived bytes, load+call s); the pool's loads and evictions; problems."""
    from pawfn import PawCache, PawConfig, PawFn, ProgramPool, Qwen3_0_6B, RuntimeOptions, Torch
    from pawfn.hub.usage import cache_files

    config = PawConfig.from_env(cache_dir=cache, progress=False)
    options = RuntimeOptions(max_tokens=10)
    figures, first_tokens, problems = [], {}, []
    async with ProgramPool.of(PawFn[Qwen3_0_6B, Torch], base=base, config=config, max_programs=budget) as pool:
        for bundle in bundles:
            started = time.perf_counter()
            first_tokens[str(bundle)] = (await pool.generate(str(bundle), "Urgent: the server is down!", options)).token_ids
            derived = sum(item.size_bytes for item in cache_files(PawCache(cache)) if item.derived)
            figures.append((_rss_mib(), derived, time.perf_counter() - started))
        for bundle in bundles[::5]:
            again = (await pool.generate(str(bundle), "Urgent: the server is down!", options)).token_ids
            if again != first_tokens[str(bundle)]:
                problems.append(f"{bundle.name} loaded again gave {again}, first {first_tokens[str(bundle)]}")
        stats = pool.stats
        if len(pool) > budget:
            problems.append(f"the pool holds {len(pool)} programs, over its budget {budget}")
    return figures, stats.loads, stats.evictions, problems


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--tiny", action="store_true", help="a tiny generated Qwen3 interpreter (the test suite's generators)")
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/pawfn-qwen3-shape"))
    parser.add_argument("--programs", type=int, default=100)
    parser.add_argument("--budget", type=int, default=8)
    parser.add_argument("--derived-bound", type=int, default=512 << 20, help="PAW_DERIVED_CACHE_MAX_BYTES for the run (bytes)")
    args = parser.parse_args()
    if args.programs <= args.budget:
        parser.error("--programs must exceed --budget")
    os.environ["PAW_DERIVED_CACHE_MAX_BYTES"] = str(args.derived_bound)
    with tempfile.TemporaryDirectory(prefix="pawfn-budget-") as scratch:
        base, programs = many_bundles(Path(scratch) / "programs", args.tiny, args.workdir, args.programs, 0xB0D6E7000, {})
        bundles = [bundle for _, bundle in programs]
        started = time.perf_counter()
        figures, loads, evictions, problems = asyncio.run(_run(base, bundles, args.budget, Path(scratch) / "cache"))
        elapsed = time.perf_counter() - started
    rss = [figure[0] for figure in figures]
    at_budget = max(rss[: args.budget])
    bound = at_budget * 1.10
    print(
        f"{args.programs} programs through a pool of {args.budget} in {elapsed:.0f} s ({elapsed / args.programs:.2f} s a program: "
        f"load, prefix, one call); loads {loads}, evictions {evictions}"
    )
    print(f"{'program':>8} {'RSS MiB':>8} {'derived MiB':>12} {'s':>6}")
    for index in sorted({0, 1, args.budget - 1, args.budget, args.budget + 1, *range(9, args.programs, 10), args.programs - 1}):
        figure = rss[index], figures[index][1] / 2**20, figures[index][2]
        print(f"{index + 1:8} {figure[0]:8.0f} {figure[1]:12.0f} {figure[2]:6.2f}")
    per_program = (rss[args.budget - 1] - rss[0]) / max(1, args.budget - 1)
    late = rss[args.budget :]
    print(
        f"RSS: 1 program {rss[0]:.0f} MiB; {args.budget} programs {at_budget:.0f} MiB ({per_program:.1f} MiB a program); after them max "
        f"{max(late):.0f}, last {rss[-1]:.0f} MiB; bound (base + {args.budget} programs + 10%) {bound:.0f} MiB; growth past the budget "
        f"{max(late) - at_budget:+.0f} MiB ({(max(late) - at_budget) / max(per_program, 1e-9):+.1f} programs)"
    )
    derived_max = max(figure[1] for figure in figures)
    print(f"derived cache: max {derived_max / 2**20:.2f} MiB after a load ({derived_max} bytes), bound {args.derived_bound / 2**20:.2f} MiB")
    if max(late) > bound:
        problems.append(f"RSS reached {max(late):.0f} MiB, above {bound:.0f}")
    if derived_max > args.derived_bound:
        problems.append(f"the derived cache reached {derived_max} bytes, above {args.derived_bound}")
    print("checks: " + ("all held" if not problems else "BROKEN:\n  " + "\n  ".join(problems)))
    if problems:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
