"""Load test of `pawfn serve`: many clients on more programs than the resident budget, faults mixed in, then a
SIGTERM mid-load. Every check of a server under load, in one run:

1. *Alone*: each program's calls one at a time (the reference tokens), the server's RSS after each program; more
   programs than `--budget`, so the first ones are evicted on the way.
2. *Load*: `--clients` threads for `--seconds`, each call on a random program and input: runs, batches, streams (a
   third abandoned after their first token) and faults (a body that is not JSON or not UTF-8, a wrong key, an
   unknown program, too many tokens, an oversized body), each answer checked against its documented status and
   every output against its call alone; the server's RSS sampled throughout; then decode steps must stop (no
   orphaned decoding) once the clients are gone.
3. *SIGTERM*: the same load with long streams, a SIGTERM halfway: only documented answers (requests still running at
   the end of `--graceful-timeout` answer 503 `shutting_down`, streams end with that `error` event), no traceback in
   the log, and the process gone within the graceful timeout.

Programs come from a real HTTP hub on 127.0.0.1 (the tests' `HubServer`, so a checkout with the dev extras), and the
server loads them on request (`--allow-load --max-programs B`). The RSS bound is the issue's, base + B programs +
10%, where base + B programs is the highest RSS while the same clients call only the B programs the budget holds
(so no eviction: the calls' own memory, KV slots and batches, counts in the base).

    python benchmarks/serve_load.py --tiny [--programs 12 --budget 4 --clients 12 --seconds 30]
    python benchmarks/serve_load.py [--workdir /tmp/pawfn-qwen3-shape] [--programs 12 --budget 4 --clients 8 --seconds 60]
"""

from __future__ import annotations

import argparse
import io
import os
import random
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import zipfile
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from load_cost import many_bundles  # noqa: E402 - beside this script
from tests.helpers.hub_server import HubServer  # noqa: E402 - the checkout's own test hub
from tests.helpers.servers import free_port, sse_events  # noqa: E402

KEY = "load-test-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
INPUTS = ["Urgent: the server is down!", "Lunch on Friday?", "Invoice 4471 is overdue", "hello"]
RUNTIME_ID = "load-test-qwen3"
LONG_TOKENS = 1500
"""Tokens of an abandoned stream, and of every stream once the SIGTERM is sent: calls that outlast the grace."""
EXPECTED_FAULTS = {  # fault -> (status, error code)
    "not_json": (422, "invalid_request"),
    "not_utf8": (422, "invalid_encoding"),
    "wrong_key": (401, "unauthorized"),
    "unknown_program": (404, "program_not_found"),
    "too_many_tokens": (422, "max_tokens_too_large"),
    "oversized": (413, "body_too_large"),
}
BUSY = {(503, "programs_busy"), (429, "queue_full")}
"""Documented refusals under load: every resident program busy, or the queue full."""


@dataclass
class Tally:
    """What the clients saw."""

    outcomes: Counter[str] = field(default_factory=Counter[str])
    """kind:status:code -> count."""
    wrong: list[str] = field(default_factory=list[str])
    """Answers that broke a rule: an undocumented status, an output unlike its call alone."""
    exact: int = 0
    latencies_s: list[float] = field(default_factory=list[float])
    answered_programs: set[str] = field(default_factory=set[str])
    lock: threading.Lock = field(default_factory=threading.Lock)

    def record(self, kind: str, status: int, code: str, problem: str | None = None) -> None:
        with self.lock:
            self.outcomes[f"{kind}:{status}:{code}"] += 1
            if problem is not None:
                self.wrong.append(f"{kind}: {problem}")


# --- programs on a hub ---


def _archive(bundle: Path) -> bytes:
    data = io.BytesIO()
    with zipfile.ZipFile(data, "w") as archive:
        for path in sorted(bundle.iterdir()):
            archive.write(path, path.name)
    return data.getvalue()


def _serve_on_hub(hub: HubServer, base: Path, bundles: list[tuple[str, Path]]) -> None:
    hub.serve_runtime(RUNTIME_ID, "Qwen/Qwen3-0.6B", base.read_bytes(), base.name)
    for program_id, bundle in bundles:
        hub.serve_program(program_id, _archive(bundle))


# --- the server ---


@dataclass
class Server:
    process: subprocess.Popen[str]
    url: str
    log: Path

    def rss_mib(self) -> float:
        return self.memory_mib()["VmRSS"]

    def memory_mib(self) -> dict[str, float]:
        """VmRSS and its parts: RssAnon (the process's own), RssFile (mapped files' pages in memory)."""
        fields = dict(line.split(":", 1) for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines() if ":" in line)
        return {key: int(fields[key].split()[0]) / 1024 for key in ("VmRSS", "RssAnon", "RssFile")}

    def metric(self, name: str) -> float:
        text = httpx.get(f"{self.url}/metrics", headers=AUTH, timeout=30).text
        match = re.search(rf"^{name} ([0-9.e+]+)$", text, flags=re.MULTILINE)
        return float(match.group(1)) if match else 0.0


def _start(hub: HubServer, cache: Path, budget: int, graceful_s: float, max_tokens: int) -> Server:
    port = free_port()
    log = cache.parent / "server.log"
    environment = {**os.environ, "PAW_API_URL": hub.api_url, "PAW_API_KEY": "hub-key", "PAW_CACHE_DIR": str(cache), "LOAD_TEST_KEY": KEY}
    command = [sys.executable, "-m", "pawfn", "serve", "--allow-load", "--max-programs", str(budget), "--api-key-env", "LOAD_TEST_KEY"]
    command += ["--graceful-timeout", str(graceful_s), "--max-tokens-limit", str(LONG_TOKENS), "--port", str(port)]
    command += ["--result-cache-bytes", "0"]  # its few inputs repeat: every call computed, as the load is meant (observability.py measures the cache)
    process = subprocess.Popen(command, stdout=log.open("w"), stderr=subprocess.STDOUT, text=True, env=environment)
    server = Server(process, f"http://127.0.0.1:{port}", log)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"pawfn serve exited with {process.returncode}:\n{log.read_text()}")
        try:
            if httpx.get(f"{server.url}/healthz", timeout=1).status_code == 200:
                return server
        except httpx.TransportError:
            time.sleep(0.2)
    process.kill()
    raise SystemExit(f"pawfn serve did not answer within 120 s:\n{log.read_text()}")


class RssSampler:
    """The server's RSS every `interval_s`, in a thread."""

    def __init__(self, server: Server, interval_s: float = 0.25) -> None:
        self.samples: list[float] = []
        self.peak: dict[str, float] = {"VmRSS": 0.0, "RssAnon": 0.0, "RssFile": 0.0}
        """The parts of the highest sample."""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(server, interval_s), daemon=True)
        self._thread.start()

    def _run(self, server: Server, interval_s: float) -> None:
        while not self._stop.is_set() and server.process.poll() is None:
            try:
                memory = server.memory_mib()
            except (FileNotFoundError, ProcessLookupError):
                return
            self.samples.append(memory["VmRSS"])
            if memory["VmRSS"] > self.peak["VmRSS"]:
                self.peak = memory
            self._stop.wait(interval_s)

    def stop(self) -> list[float]:
        self._stop.set()
        self._thread.join()
        return self.samples


# --- calls ---


def _run(client: httpx.Client, url: str, program: str, text: str, max_tokens: int) -> httpx.Response:
    return client.post(f"{url}/v1/programs/{program}/run", json={"input": text, "options": {"max_tokens": max_tokens}}, headers=AUTH)


def _code(response: httpx.Response) -> str:
    try:
        body = response.json()
    except ValueError:
        return "not-json"
    return str(body.get("error", "")) if isinstance(body, dict) else ""


def alone(server: Server, programs: list[str], max_tokens: int, inputs: list[str] = INPUTS) -> tuple[dict[tuple[str, str], list[int]], list[float]]:
    """Each program's calls one at a time: the reference tokens, and the server's RSS after each program (MiB)."""
    reference: dict[tuple[str, str], list[int]] = {}
    rss = []
    with httpx.Client(timeout=300) as client:
        for program in programs:
            for text in inputs:
                response = _run(client, server.url, program, text, max_tokens)
                if response.status_code != 200:
                    raise SystemExit(f"alone: {program} answered {response.status_code}: {response.text}")
                reference[(program, text)] = response.json()["generation"]["token_ids"]
            rss.append(server.rss_mib())
    return reference, rss


def _fault(client: httpx.Client, url: str, kind: str, program: str) -> httpx.Response:
    run_url = f"{url}/v1/programs/{program}/run"
    json_type = {"Content-Type": "application/json"} | AUTH
    if kind == "not_json":
        return client.post(run_url, content=b'{"input": ', headers=json_type)
    if kind == "not_utf8":
        return client.post(run_url, content=b'{"input": "caf\xe9"}', headers=json_type)
    if kind == "wrong_key":
        return client.post(run_url, json={"input": "x"}, headers={"Authorization": "Bearer wrong"})
    if kind == "unknown_program":
        return client.post(f"{url}/v1/programs/no-such-program-here/run", json={"input": "x"}, headers=AUTH)
    if kind == "too_many_tokens":
        return client.post(run_url, json={"input": "x", "options": {"max_tokens": 10**6}}, headers=AUTH)
    return client.post(run_url, content=b'{"input": "' + b"x" * (2 << 20) + b'"}', headers=json_type)


class StreamCutError(Exception):
    """A stream's connection broke after its 200: the server must end every stream with an event."""


class Clients:
    """`count` client threads calling until stopped, each answer checked; `stopping` marks answers after a SIGTERM."""

    def __init__(self, server: Server, programs: list[str], reference: dict[tuple[str, str], list[int]], max_tokens: int, long_streams: bool) -> None:
        """`long_streams`: every stream asks for `LONG_TOKENS` (the SIGTERM phase); else only abandoned ones do."""
        self.server, self.programs, self.reference = server, programs, reference
        self.max_tokens, self.long_streams = max_tokens, long_streams
        self.tally = Tally()
        self.stop = threading.Event()
        self.signalled = threading.Event()
        self.disconnected_after_signal = 0

    def run(self, count: int, seconds: float, seed: int) -> None:
        """`count` clients for `seconds`, each fault sent once more beside them (so every kind is checked each run)."""
        deadline = time.monotonic() + seconds
        with ThreadPoolExecutor(count + 1) as pool:
            running = [pool.submit(self._every_fault, self.programs[0])]
            running += [pool.submit(self._client, random.Random(seed * 1000 + worker), deadline) for worker in range(count)]
        for future in running:
            future.result()  # a client's own failure (not an answer it judged) ends the run with its traceback

    def _every_fault(self, program: str) -> None:
        with httpx.Client(timeout=300) as client:
            for kind in sorted(EXPECTED_FAULTS):
                try:
                    self._check_status(kind, _fault(client, self.server.url, kind, program), {EXPECTED_FAULTS[kind]})
                except httpx.TransportError as exc:
                    if not self.signalled.is_set():
                        self.tally.record(kind, 0, type(exc).__name__, f"lost before any SIGTERM: {exc!r}")

    def _client(self, rng: random.Random, deadline: float) -> None:
        with httpx.Client(timeout=300) as client:
            while time.monotonic() < deadline and not self.stop.is_set():
                try:
                    self._one(client, rng)
                except StreamCutError as exc:
                    self.tally.record("stream", 200, "cut", f"a stream ended without its done or error event: {exc}")
                except httpx.TransportError as exc:
                    if not self.signalled.is_set():
                        self.tally.record("transport", 0, type(exc).__name__, f"lost before any SIGTERM: {exc!r}")
                        continue
                    # after the signal: refused (the server stopped accepting) or an idle keep-alive connection closed
                    with self.tally.lock:
                        self.disconnected_after_signal += 1
                    if self.server.process.poll() is not None:
                        return
                    time.sleep(0.05)

    def _check_status(self, kind: str, response: httpx.Response, documented: set[tuple[int, str]]) -> bool:
        """Record the answer; True when it is a 200."""
        code = _code(response) if response.status_code != 200 else ""
        allowed = documented | BUSY | ({(503, "shutting_down")} if self.signalled.is_set() else set())
        problem = (
            None
            if response.status_code == 200 or (response.status_code, code) in allowed
            else f"{response.status_code} {code}: {response.text[:200]}"
        )
        self.tally.record(kind, response.status_code, code, problem)
        return response.status_code == 200

    def _compare(self, program: str, text: str, tokens: list[int]) -> None:
        expected = self.reference[(program, text)]
        with self.tally.lock:
            if tokens[: len(expected)] == expected[: len(tokens)] and (len(tokens) == len(expected) or len(tokens) > len(expected)):
                self.tally.exact += 1
                self.tally.answered_programs.add(program)
            else:
                self.tally.wrong.append(f"{program} {text!r}: {tokens} where alone gave {expected}")

    def _one(self, client: httpx.Client, rng: random.Random) -> None:
        program, text = rng.choice(self.programs), rng.choice(INPUTS)
        roll = rng.random()
        started = time.perf_counter()
        if roll < 0.15:
            kind = rng.choice(sorted(EXPECTED_FAULTS))
            self._check_status(kind, _fault(client, self.server.url, kind, program), {EXPECTED_FAULTS[kind]})
        elif roll < 0.25:
            texts = [text, rng.choice(INPUTS)]
            body = {"inputs": texts, "options": {"max_tokens": self.max_tokens}}
            response = client.post(f"{self.server.url}/v1/programs/{program}/run_batch", json=body, headers=AUTH)
            if self._check_status("batch", response, set()):
                for given, generation in zip(texts, response.json()["generations"], strict=True):
                    self._compare(program, given, generation["token_ids"])
        elif roll < 0.45:
            self._stream(client, program, text, abandon=rng.random() < 0.33)
        else:
            response = _run(client, self.server.url, program, text, self.max_tokens)
            if self._check_status("run", response, set()):
                self._compare(program, text, response.json()["generation"]["token_ids"])
                with self.tally.lock:
                    self.tally.latencies_s.append(time.perf_counter() - started)

    def _stream(self, client: httpx.Client, program: str, text: str, abandon: bool) -> None:
        # a long stream while a SIGTERM may come: its call outlasts the grace and must end with an error event
        tokens = LONG_TOKENS if self.long_streams or abandon else self.max_tokens
        body = {"input": text, "options": {"max_tokens": tokens}}
        with client.stream("POST", f"{self.server.url}/v1/programs/{program}/stream", json=body, headers=AUTH) as response:
            if response.status_code != 200:
                response.read()
                self._check_status("stream", response, set())
                return
            last: tuple[str, dict[str, object]] | None = None
            try:
                for event, data in sse_events(response.iter_lines()):
                    last = (event, data)
                    if abandon and event == "token":
                        self.tally.record("stream_abandoned", 200, "")
                        return  # leaving closes the connection: the server must stop decoding it
            except httpx.TransportError as exc:
                raise StreamCutError(repr(exc)) from exc
        if last is None:
            self.tally.record("stream", 200, "no-events", "a stream ended without any event")
        elif last[0] == "done":
            self.tally.record("stream", 200, "")
            generation = last[1]["generation"]
            assert isinstance(generation, dict)
            if tokens == self.max_tokens:
                self._compare(program, text, list(generation["token_ids"]))
        elif last[0] == "error" and last[1].get("error") == "shutting_down" and self.signalled.is_set():
            self.tally.record("stream", 200, "error:shutting_down")
        else:
            self.tally.record("stream", 200, f"{last[0]}:{last[1].get('error')}", f"a stream ended with {last}")


# --- the run ---


def _percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))] if ordered else float("nan")


def _derived_bytes(cache: Path) -> int:
    """Bytes of pawfn's derived files in the cache (stored prefixes, converted bases, kernels)."""
    from pawfn import PawCache
    from pawfn.hub.usage import cache_files

    return sum(item.size_bytes for item in cache_files(PawCache(cache)) if item.derived)


def main() -> None:  # noqa: PLR0915 - one run, its phases in order
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--tiny", action="store_true", help="a tiny generated Qwen3 interpreter (fast; the test suite's generators)")
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/pawfn-qwen3-shape"), help="the Qwen3-0.6B-shaped base and bundle")
    parser.add_argument("--programs", type=int, default=12)
    parser.add_argument("--budget", type=int, default=4, help="--max-programs of the server")
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=30.0, help="the load phase")
    parser.add_argument("--sigterm-seconds", type=float, default=10.0, help="the SIGTERM phase (the signal comes halfway)")
    parser.add_argument("--graceful-timeout", type=float, default=2.0)
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    if args.programs <= args.budget:
        parser.error("--programs must exceed --budget: the test is about evictions")
    problems: list[str] = []
    with tempfile.TemporaryDirectory(prefix="pawfn-load-") as scratch:
        folder = Path(scratch)
        base, bundles = many_bundles(folder / "programs", args.tiny, args.workdir, args.programs, 0xC0DE0000, {"runtime_id": RUNTIME_ID})
        hub = HubServer()
        _serve_on_hub(hub, base, bundles)
        programs = [program_id for program_id, _ in bundles]
        cache = folder / "cache"
        server = _start(hub, cache, args.budget, args.graceful_timeout, args.max_tokens)
        try:
            # 1. alone
            started = time.perf_counter()
            reference, rss_alone = alone(server, programs, args.max_tokens)
            at_budget = max(rss_alone[: args.budget])
            per_program = (rss_alone[args.budget - 1] - rss_alone[0]) / max(1, args.budget - 1)
            print(
                f"alone: {len(reference)} calls on {len(programs)} programs in {time.perf_counter() - started:.1f} s; RSS with 1 program "
                f"{rss_alone[0]:.0f} MiB, with {args.budget} (the budget) {at_budget:.0f} MiB ({per_program:.1f} MiB a program); "
                f"after all {rss_alone[-1]:.0f} MiB"
            )

            # 2a. the same load on the programs the budget holds (no eviction): base + B programs under this load
            resident = programs[-args.budget :]
            warm = Clients(server, resident, reference, args.max_tokens, long_streams=False)
            sampler = RssSampler(server)
            evictions_before = server.metric("pawfn_program_evictions_total")
            warm.run(args.clients, max(5.0, args.seconds / 3), args.seed + 2)
            warm_samples = sampler.stop()
            warm_peak = sampler.peak
            bound = max(warm_samples) * 1.10
            print(
                f"warm: {args.clients} clients on the {args.budget} resident programs, {sum(warm.tally.outcomes.values())} requests, "
                f"{server.metric('pawfn_program_evictions_total') - evictions_before:.0f} evictions; RSS max {max(warm_samples):.0f} MiB "
                f"(base + {args.budget} programs under this load; anonymous {warm_peak['RssAnon']:.0f}, files {warm_peak['RssFile']:.0f}); "
                f"bound + 10%: {bound:.0f} MiB"
            )
            problems += warm.tally.wrong[:20]

            # 2. load
            clients = Clients(server, programs, reference, args.max_tokens, long_streams=False)
            sampler = RssSampler(server)
            started = time.perf_counter()
            clients.run(args.clients, args.seconds, args.seed)
            elapsed = time.perf_counter() - started
            deadline = time.monotonic() + 60
            while httpx.get(f"{server.url}/healthz", timeout=10).json()["queued"] and time.monotonic() < deadline:
                time.sleep(0.1)
            steps = server.metric("pawfn_decode_steps_total")
            time.sleep(1.0)
            orphaned = server.metric("pawfn_decode_steps_total") - steps
            samples = sampler.stop()
            tally = clients.tally
            total = sum(tally.outcomes.values())
            print(
                f"load: {args.clients} clients, {elapsed:.1f} s, {total} requests ({total / elapsed:.1f}/s); run p50 "
                f"{_percentile(tally.latencies_s, 0.5) * 1e3:.0f} ms, p99 {_percentile(tally.latencies_s, 0.99) * 1e3:.0f} ms"
            )
            for outcome, count in sorted(tally.outcomes.items()):
                print(f"  {outcome:40} {count}")
            loads, evictions = server.metric("pawfn_program_loads_total"), server.metric("pawfn_program_evictions_total")
            cold = server.metric("pawfn_program_cold_start_seconds_total")
            print(
                f"  outputs equal to their call alone: {tally.exact}/{tally.exact + len([w for w in tally.wrong if ' where alone gave ' in w])}; "
                f"programs answering: {len(tally.answered_programs)}/{len(programs)}; loads {loads:.0f}, evictions {evictions:.0f}, "
                f"cold start {cold / max(loads, 1) * 1e3:.0f} ms a load"
            )
            print(
                f"  RSS during load: min {min(samples):.0f}, median {statistics.median(samples):.0f}, max {max(samples):.0f} MiB "
                f"(bound {bound:.0f}; at the peak anonymous {sampler.peak['RssAnon']:.0f}, files {sampler.peak['RssFile']:.0f}); "
                f"decode steps in the second after the last answer: {orphaned:.0f}; derived cache "
                f"{_derived_bytes(cache) / 2**20:.0f} MiB"
            )
            problems += tally.wrong[:20]
            if max(samples) > bound:
                problems.append(f"RSS reached {max(samples):.0f} MiB, above the bound {bound:.0f}")
            if orphaned:
                problems.append(f"{orphaned:.0f} decode steps ran after every client had its answer or left")
            # every program once more, one at a time: all but the budget's last were evicted at least once
            again, _ = alone(server, programs, args.max_tokens, INPUTS[:1])
            same = sum(tokens == reference[key] for key, tokens in again.items())
            print(f"  each program again after the load: {same}/{len(programs)} gave their tokens alone")
            if evictions < 1 or same < len(programs):
                problems.append(f"evicted programs must answer again: {evictions:.0f} evictions, {same}/{len(programs)} gave their tokens")

            # 3. SIGTERM mid-load
            sigterm = Clients(server, programs, reference, args.max_tokens, long_streams=True)
            runner = threading.Thread(target=sigterm.run, args=(args.clients, args.sigterm_seconds + args.graceful_timeout + 10, args.seed + 1))
            runner.start()
            time.sleep(args.sigterm_seconds / 2)
            sigterm.signalled.set()
            signalled_at = time.monotonic()
            server.process.send_signal(signal.SIGTERM)
            status = server.process.wait(args.graceful_timeout + 30)
            exit_s = time.monotonic() - signalled_at
            sigterm.stop.set()
            runner.join()
            log = server.log.read_text()
            shutting = sum(count for outcome, count in sigterm.tally.outcomes.items() if "shutting_down" in outcome)
            print(
                f"SIGTERM after {args.sigterm_seconds / 2:.1f} s of load: exit status {status} in {exit_s:.2f} s (graceful timeout "
                f"{args.graceful_timeout:g} s); {sum(sigterm.tally.outcomes.values())} answers, {shutting} of them shutting_down, "
                f"{sigterm.disconnected_after_signal} requests refused or cut after the signal; tracebacks in the log: {log.count('Traceback')}"
            )
            for outcome, count in sorted(sigterm.tally.outcomes.items()):
                print(f"  {outcome:40} {count}")
            problems += sigterm.tally.wrong[:20]
            if exit_s > args.graceful_timeout:
                problems.append(f"the server took {exit_s:.2f} s to exit after SIGTERM, more than its graceful timeout")
            if status not in (0, -signal.SIGTERM):
                problems.append(f"the server exited with {status}")
            if "Traceback" in log or "Internal Server Error" in log:
                problems.append("the server's log holds a traceback")
        finally:
            if server.process.poll() is None:
                server.process.kill()
            hub.close()
    print("checks: " + ("all held" if not problems else "BROKEN:\n  " + "\n  ".join(problems)))
    if problems:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
