"""Serving throughput and latency on loopback, in one run: local calls (a `PawFn` in its own process), `pawfn serve`
(uvicorn), and Ray Serve with 1 and 2 program replicas, each taking the same calls from the same number of client
threads. Prints calls/s, latency p50/p90/p99 (of few calls: p99 is about the slowest) and each configuration's
throughput as a ratio to local calls; every answer is checked against the local tokens. Bounded: --calls per
configuration, --timeout-s per configuration.

    python benchmarks/serving.py [--workdir /tmp/pawfn-qwen3-shape] [--weight-dtype int8] [--calls 24] [--concurrency 8]
    python benchmarks/serving.py --tiny     # a tiny generated program (dev extras): the HTTP and Ray overheads alone

On a machine of C cores, the single-process configurations get all C (torch's default threads), and each of the
two Ray replicas C/2 (Ray sets a replica's threads to its CPUs).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import httpx

from load_cost import INPUT, prepare

_LOCAL = """
import json, sys, time
from concurrent.futures import ThreadPoolExecutor
from pawfn import PawConfig, PawFn, RuntimeOptions, Torch
bundle, base, text, weight_dtype = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4] or None
calls, concurrency, max_tokens = int(sys.argv[5]), int(sys.argv[6]), int(sys.argv[7])
config = PawConfig(weight_dtype=weight_dtype, max_model_copies=concurrency, max_batch_rows=concurrency)
program = PawFn.load_any_sync(bundle, Torch, base=base, config=config)
options = RuntimeOptions(max_tokens=max_tokens)
tokens = list(program.generate(text, options).token_ids)
def call(_):
    started = time.perf_counter()
    generation = program.generate(text, options)
    return time.perf_counter() - started, list(generation.token_ids) == tokens
started = time.perf_counter()
with ThreadPoolExecutor(concurrency) as pool:
    results = list(pool.map(call, range(calls)))
wall = time.perf_counter() - started
print(json.dumps({"wall_s": wall, "latencies_s": [r[0] for r in results], "exact": all(r[1] for r in results),
                  "tokens": tokens}))
"""


@dataclass(frozen=True)
class Measured:
    """One configuration's timed calls."""

    wall_s: float
    latencies_s: list[float]
    exact: bool
    """Every answer had the local tokens."""


def run_local(bundle: Path, base: Path, weight_dtype: str, calls: int, concurrency: int, max_tokens: int) -> tuple[Measured, list[int]]:
    """Local calls in a fresh process; its figures and the call's tokens."""
    arguments = [str(bundle), str(base), INPUT, weight_dtype, str(calls), str(concurrency), str(max_tokens)]
    done = subprocess.run([sys.executable, "-c", _LOCAL, *arguments], capture_output=True, text=True, check=False, timeout=1800)
    if done.returncode != 0:
        raise SystemExit(f"local calls failed:\n{done.stderr}")
    figures = json.loads(done.stdout.strip().splitlines()[-1])
    return Measured(figures["wall_s"], figures["latencies_s"], figures["exact"]), figures["tokens"]


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def _wait_healthy(url: str, timeout_s: float, process: subprocess.Popen[bytes] | None = None) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise SystemExit(f"the server exited with {process.returncode}")
        try:
            if httpx.get(f"{url}/healthz", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    raise SystemExit(f"{url} did not become healthy within {timeout_s} s")


def drive(url: str, program: str, calls: int, concurrency: int, max_tokens: int, tokens: list[int]) -> Measured:
    """`calls` runs of INPUT from `concurrency` threads over one connection pool, after one warm-up call."""
    path = f"{url}/v1/programs/{program}/run"
    body = {"input": INPUT, "options": {"max_tokens": max_tokens}}
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    with httpx.Client(timeout=600, limits=limits) as client:
        client.post(path, json=body).raise_for_status()

        def call(_: int) -> tuple[float, bool]:
            started = time.perf_counter()
            response = client.post(path, json=body)
            response.raise_for_status()
            return time.perf_counter() - started, response.json()["generation"]["token_ids"] == tokens

        started = time.perf_counter()
        with ThreadPoolExecutor(concurrency) as pool:
            results = list(pool.map(call, range(calls)))
        wall = time.perf_counter() - started
    return Measured(wall, [r[0] for r in results], all(r[1] for r in results))


def serve_uvicorn(
    bundle: Path, base: Path, weight_dtype: str, calls: int, concurrency: int, max_tokens: int, tokens: list[int], timeout_s: float
) -> Measured:
    port = _free_port()
    command = [
        sys.executable,
        "-m",
        "pawfn",
        "serve",
        "--program",
        f"bench={bundle}",
        "--base",
        str(base),
        "--port",
        str(port),
        "--max-model-copies",
        str(concurrency),
        "--max-batch-rows",
        str(concurrency),
    ]
    if weight_dtype:
        command += ["--weight-dtype", weight_dtype]
    with tempfile.TemporaryFile() as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
        try:
            url = f"http://127.0.0.1:{port}"
            _wait_healthy(url, timeout_s, process)
            return drive(url, "bench", calls, concurrency, max_tokens, tokens)
        finally:
            process.send_signal(signal.SIGTERM)
            process.wait(60)


def serve_ray(
    bundle: Path, base: Path, weight_dtype: str, calls: int, concurrency: int, max_tokens: int, tokens: list[int], timeout_s: float, replicas: int
) -> Measured:
    import ray
    from ray import serve

    from pawfn import PawConfig
    from pawfn.serve.ray import RayAppArgs, ray_app

    cores = os.cpu_count() or 2
    port = _free_port()
    ray.init(num_cpus=cores, include_dashboard=False, log_to_driver=False)
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        config = PawConfig(weight_dtype=weight_dtype or None, max_model_copies=concurrency, max_batch_rows=concurrency)
        args = RayAppArgs(programs=[f"bench={bundle}"], base=str(base), replicas=replicas, replica_cpus=cores / replicas, config=config)
        serve.run(ray_app(args), name="bench", route_prefix="/")
        url = f"http://127.0.0.1:{port}"
        _wait_healthy(url, timeout_s)
        for _ in range(replicas):  # every replica loads the program before the clock starts
            drive(url, "bench", replicas, replicas, max_tokens, tokens)
        return drive(url, "bench", calls, concurrency, max_tokens, tokens)
    finally:
        serve.shutdown()
        ray.shutdown()


def _tiny(folder: Path) -> tuple[Path, Path]:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from tests.helpers.programs import make_program
    from tests.helpers.tiny_models import build_interpreter

    interpreter = build_interpreter("qwen3", folder)
    return make_program(interpreter, folder, "bench-program", program_id="0123456789abcdef0bee").archive, interpreter.hf_dir


def _row(label: str, result: Measured, calls: int, reference: float | None) -> float:
    rate = calls / result.wall_s
    cuts = statistics.quantiles(result.latencies_s, n=100, method="inclusive")
    ratio = "" if reference is None else f"  {rate / reference:5.2f}x local"
    print(
        f"  {label:24} {rate:6.2f} calls/s  p50 {cuts[49] * 1e3:7.0f} ms  p90 {cuts[89] * 1e3:7.0f} ms  "
        f"p99 {cuts[98] * 1e3:7.0f} ms  exact {result.exact}{ratio}",
        flush=True,
    )
    return rate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/pawfn-qwen3-shape"))
    parser.add_argument("--tiny", action="store_true", help="a tiny generated program instead (needs the dev extras)")
    parser.add_argument("--weight-dtype", default="int8", choices=("", "float16", "int8"), help="'' for float32")
    parser.add_argument("--calls", type=int, default=24, help="timed calls per configuration")
    parser.add_argument("--concurrency", type=int, default=8, help="client threads (and model copies per base)")
    parser.add_argument("--max-tokens", type=int, default=10)
    parser.add_argument("--timeout-s", type=float, default=600.0, help="longest wait for a server to start")
    parser.add_argument("--skip-ray", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        if args.tiny:
            bundle, base = _tiny(Path(scratch))
        else:
            base, bundle = prepare(args.workdir)
        local, tokens = run_local(bundle, base, args.weight_dtype, args.calls, args.concurrency, args.max_tokens)
        print(
            f"{args.calls} calls of {args.max_tokens} tokens from {args.concurrency} client threads, "
            f"weights {args.weight_dtype or 'float32'}, {os.cpu_count()} cores"
        )
        reference = _row("local calls (PawFn)", local, args.calls, None)
        common = (bundle, base, args.weight_dtype, args.calls, args.concurrency, args.max_tokens, tokens, args.timeout_s)
        _row("pawfn serve (uvicorn)", serve_uvicorn(*common), args.calls, reference)
        if not args.skip_ray:
            for replicas in (1, 2):
                _row(f"Ray Serve, {replicas} replica{'s' if replicas > 1 else ''}", serve_ray(*common, replicas=replicas), args.calls, reference)
    print(json.dumps({"note": "ratios are throughput over local calls, measured in this run"}))


if __name__ == "__main__":
    main()
