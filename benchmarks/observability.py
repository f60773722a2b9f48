"""What tracing and the result cache do to `pawfn serve` under load, side by side in one run.

1. *Tracing*: the same load (`--clients` threads making `--calls` calls each, every input new, the result cache off) on a
   server without an OpenTelemetry SDK and on one whose SDK records every span (a `BatchSpanProcessor` handing them
   to an exporter that drops them: the cost of making and ending spans, not of a collector), `--runs` times each,
   alternating; prints calls/s and the ratio traced / untraced per run.
2. *Result cache*: the same clients, each input a repeat of an earlier one with probability `--repeat-rate` (0.3: a
   third of a triage queue's messages seen before), on a server with the cache off and on (64 MiB, the default);
   prints calls/s, mean latency, the hits, and the ratios. Then one input alone: the time of the call that
   computes it and of the repeat the cache answers, as the client sees them (HTTP included).

The program is the Qwen3-0.6B-shaped one of `load_cost.py` (random weights, real shapes; `--tiny`: the tests' tiny
one), served as `triage` with calls of `--max-tokens`.

    python benchmarks/observability.py [--workdir /tmp/pawfn-qwen3-shape] [--clients 8] [--calls 4] [--runs 3] [--tracing-only]
"""

from __future__ import annotations

import argparse
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from load_cost import prepare  # noqa: E402 - beside this script
from tests.helpers.servers import free_port  # noqa: E402 - the checkout's own helpers

_RECORDING_SDK = """
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

class Dropped(SpanExporter):
    def export(self, spans):
        return SpanExportResult.SUCCESS

provider = TracerProvider()
provider.add_span_processor(BatchSpanProcessor(Dropped()))
trace.set_tracer_provider(provider)
"""
"""An OpenTelemetry SDK that records every span and hands them to an exporter that drops them."""
_PLAIN = "import sys\nfrom pawfn.cli import main\nsys.exit(main(sys.argv[1:]))\n"
_TRACED = _RECORDING_SDK + _PLAIN


class Server:
    """`pawfn serve` in a child process, traced or not."""

    def __init__(self, bundle: Path, base: Path, traced: bool, cache_bytes: int) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        arguments = [
            "serve",
            "--program",
            f"triage={bundle}",
            "--base",
            str(base),
            "--port",
            str(self.port),
            "--result-cache-bytes",
            str(cache_bytes),
        ]
        self.log = tempfile.TemporaryFile("w+")
        self.process = subprocess.Popen(
            [sys.executable, "-c", _TRACED if traced else _PLAIN, *arguments], stdout=self.log, stderr=subprocess.STDOUT, text=True
        )
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                self.log.seek(0)
                raise SystemExit(f"pawfn serve exited:\n{self.log.read()}")
            try:
                if httpx.get(f"{self.url}/healthz", timeout=1).status_code == 200:
                    return
            except httpx.TransportError:
                time.sleep(0.2)
        raise SystemExit("pawfn serve did not start within 300 s")

    def metric(self, name: str) -> float:
        text = httpx.get(f"{self.url}/metrics").text
        return next((float(line.split()[1]) for line in text.splitlines() if line.split(" ")[0] in (name, name + "_total")), 0.0)

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(60)


def load(url: str, clients: int, calls: int, max_tokens: int, repeat_rate: float, seed: int) -> tuple[float, list[float]]:
    """`clients` threads making `calls` calls each: the seconds they took in all, and each call's latency (s); each
    input new, or with probability `repeat_rate` one sent before (a fixed amount of work, so the rate is not counted
    in whole batches)."""
    sent: list[str] = []
    lock = threading.Lock()
    latencies: list[float] = []
    counter = iter(range(1 << 30))

    def client(index: int) -> None:
        rng = random.Random(seed * 1000 + index)
        with httpx.Client(timeout=600) as http:
            for _ in range(calls):
                with lock:
                    text = rng.choice(sent) if sent and rng.random() < repeat_rate else f"message {seed}-{next(counter)}: the server is down again"
                    sent.append(text)
                started = time.perf_counter()
                response = http.post(f"{url}/v1/programs/triage/run", json={"input": text, "options": {"max_tokens": max_tokens}})
                response.raise_for_status()
                with lock:
                    latencies.append(time.perf_counter() - started)

    threads = [threading.Thread(target=client, args=(index,)) for index in range(clients)]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return time.perf_counter() - started, latencies


_SPAN_COST = (
    _RECORDING_SDK
    + """
import time
from pawfn.core.results import Generation, Timings
from pawfn.core.tracing import CallTrace
timings = Timings(tokenize_ms=1.0, prompt_ms=100.0, generate_ms=400.0, total_ms=501.0)
generation = Generation(
    text="immediate", token_ids=(1, 2, 3), prefix_tokens=300, prompt_tokens=20, stop_reason="eos", timings=timings, numerics="llamacpp"
)
for rounds in (200, 2000):
    started = time.perf_counter()
    for _ in range(rounds):
        CallTrace.start("triage", "a" * 20, "request").ended(generation)
    spent = time.perf_counter() - started
print(spent / rounds * 1e6)
"""
)


def _span_cost_us() -> float:
    """Microseconds a call's spans take to make and end (`pawfn.call` and its three phases), in a child process."""
    done = subprocess.run([sys.executable, "-c", _SPAN_COST], capture_output=True, text=True, check=True)
    return float(done.stdout.strip())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/pawfn-qwen3-shape"))
    parser.add_argument("--tiny", action="store_true", help="the tests' tiny Qwen3 program instead of the Qwen3-0.6B-shaped one")
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--calls", type=int, default=4, help="calls per client and measurement")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--repeat-rate", type=float, default=0.3)
    parser.add_argument("--tracing-only", action="store_true", help="measure tracing alone (no result-cache part)")
    args = parser.parse_args()
    if args.tiny:
        from tests.helpers.programs import make_program
        from tests.helpers.tiny_models import build_interpreter

        root = Path(tempfile.mkdtemp(prefix="pawfn-observability-"))
        interpreter = build_interpreter("qwen3", root)
        program = make_program(interpreter, root, "bench", seed=3)
        base, bundle = interpreter.gguf_path, program.archive
    else:
        base, bundle = prepare(args.workdir)

    print(f"tracing: the spans of one call, made and ended: {_span_cost_us():.0f} us (an SDK recording them, a batch processor)")
    print(f"tracing: {args.clients} clients x {args.calls} calls of {args.max_tokens} tokens, result cache off")
    ratios = []
    for run in range(args.runs):
        rates = {}
        for traced in (False, True) if run % 2 == 0 else (True, False):  # alternating which goes first
            server = Server(bundle, base, traced, 0)
            try:
                load(server.url, args.clients, 1, args.max_tokens, 0.0, seed=99)  # warm-up: kernels, threads, first batches
                seconds, _ = load(server.url, args.clients, args.calls, args.max_tokens, 0.0, seed=run)
            finally:
                server.stop()
            rates[traced] = args.clients * args.calls / seconds
        ratios.append(rates[True] / rates[False])
        print(f"  run {run + 1}: untraced {rates[False]:.2f} calls/s, traced {rates[True]:.2f} calls/s, traced/untraced {ratios[-1]:.3f}")
    print(f"  median traced/untraced: {statistics.median(ratios):.3f}")
    if args.tracing_only:
        return

    print(f"result cache: repeat rate {args.repeat_rate:g}")
    results = {}
    for cache_bytes in (0, 64 << 20):
        server = Server(bundle, base, False, cache_bytes)
        try:
            load(server.url, args.clients, 1, args.max_tokens, 0.0, seed=98)
            seconds, latencies = load(server.url, args.clients, args.calls, args.max_tokens, args.repeat_rate, seed=7)
            hits, misses = server.metric("pawfn_result_cache_hits"), server.metric("pawfn_result_cache_misses")
            if cache_bytes:  # one client, its connection open: the first call computes, the next five are hits
                body = {"input": f"alone {time.time_ns()}", "options": {"max_tokens": args.max_tokens}}
                timed = []
                with httpx.Client(timeout=120) as http:
                    for _ in range(6):
                        started = time.perf_counter()
                        http.post(f"{server.url}/v1/programs/triage/run", json=body).raise_for_status()
                        timed.append(time.perf_counter() - started)
        finally:
            server.stop()
        rate = len(latencies) / seconds
        results[cache_bytes] = rate, statistics.mean(latencies)
        label = "on (64 MiB)" if cache_bytes else "off"
        mean_ms = statistics.mean(latencies) * 1e3
        print(f"  cache {label}: {rate:.2f} calls/s, mean latency {mean_ms:.0f} ms, hits {hits:.0f}, misses {misses:.0f}")
    (off_rate, off_latency), (on_rate, on_latency) = results[0], results[64 << 20]
    print(f"  on/off: throughput {on_rate / off_rate:.2f}x, mean latency {on_latency / off_latency:.2f}x")
    hit = statistics.median(timed[1:])
    print(f"  one input alone: computed {timed[0] * 1e3:.1f} ms, repeated (a hit, median of 5) {hit * 1e3:.2f} ms, hit/call {hit / timed[0]:.4f}")


if __name__ == "__main__":
    main()
