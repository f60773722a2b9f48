"""The `pawfn` command line: run, bench, eval, compile, info, cache, login and serve."""

from __future__ import annotations

import argparse
import atexit
import contextlib
import getpass
import json
import logging
import os
import signal
import sys
import threading
import time
import traceback
import unicodedata
from collections import deque
from collections.abc import Generator, Sequence
from importlib import metadata
from pathlib import Path
from types import FrameType
from typing import NoReturn, get_args

from typing_extensions import Unpack

from pydantic import BaseModel, SecretStr, ValidationError

from . import evals
from .core.backends import Backend, LlamaCpp, Remote, Torch
from .api.bench import run_bench
from .formats.bundle import open_bundle
from .calls.pending import PendingGeneration, wait_interruptibly
from .core.config import PawConfig, save_api_key
from .core.errors import OptionError, OptionProblem, PawError, describe_validation_error
from .core.images import Image, ImageError
from .api.function import PawFn
from .core.grammar import ChoicesFormat, JsonSchemaFormat, JsonSchemaSpec, PatternFormat
from .hub.cache import PawCache
from .hub.usage import cache_files, clear_derived, prune_derived
from .hub.client import PawClient
from .hub import lockfile
from .hub.lockcode import generate_module
from .hub.prepare import PreparedProgram, compile_spec, prepare_program
from .hub.refs import parse_hub_reference, parse_reference
from .hub.types import compile_request
from .core.jsonio import parse_json_object
from .core.models import InterpreterModel, builtin_models, model_for_interpreter
from .api.positional import Positional
from .core.options import DType, Numerics, RuntimeOptions, WeightDType
from .core.results import Generation
from .serve import ServeSettings, ServeTarget, serve_on_ray, serve_programs

__all__ = ["main"]


_BACKENDS: dict[str, type[Backend]] = {Torch.name: Torch, LlamaCpp.name: LlamaCpp, Remote.name: Remote}
_OPTION_FLAGS = {
    name: "--" + name.replace("_", "-")
    for name in (
        "offline",
        "api_url",
        "cache_dir",
        "device",
        "dtype",
        "n_ctx",
        "threads",
        "max_tokens",
        "temperature",
        "top_p",
        "seed",
        "max_model_copies",
        "max_batch_rows",
        "weight_dtype",
        "numerics",
        "llamacpp_kv_dtype",
        "batch_invariant",
        "server_url",
        "call_log",
    )
} | {"parse_special_in_input": "--parse-special"}
SERVE_RESULT_CACHE_BYTES = 64 << 20
"""The result cache `pawfn serve` keeps unless told otherwise (the library keeps none)."""
_SERVE_LIMITS = (
    ("--max-queue", "max_queue", "calls accepted at once, more get 429"),
    ("--max-body-bytes", "max_body_bytes", "largest request body, more get 413"),
    ("--max-input-chars", "max_input_chars", "longest input, more get 413"),
    ("--max-tokens-limit", "max_tokens", "most tokens a call may generate, more get 422"),
    ("--max-batch-inputs", "max_batch_inputs", "most inputs per run_batch request"),
    ("--max-queue-per-client", "max_queue_per_client", "calls one client (address) holds at once, more get 429; a batch runs this many at a time"),
    ("--max-connections", "max_connections", "connections open at once, more are answered 503 and closed"),
    ("--keep-alive-timeout", "keep_alive_timeout_s", "seconds an idle keep-alive connection stays open"),
)
"""`pawfn serve`'s limits: (flag, `ServeSettings` field, what it bounds)."""
_SERVE_TIMEOUTS = (
    ("--header-timeout", "header_timeout_s", "seconds a connection may take to send a request's headers, then it is closed"),
    ("--body-timeout", "body_timeout_s", "seconds a request's body may take to arrive, then 408 and closed"),
    ("--failed-load-retry", "failed_load_retry_s", "seconds a program that failed to load on a request is refused (502) before it is tried again"),
)
"""`pawfn serve`'s time limits, in seconds: (flag, `ServeSettings` field, what it bounds)."""
_BENCH_INPUT = "Urgent: the server is down! Customers cannot log in."
_BIDI_CONTROLS = frozenset("\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")


class _CliError(Exception):
    """A usage problem found after parsing (printed as one line, exit 2)."""


def escape_control(text: str) -> str:
    """`text` on one line: backslashes, control characters and bidi overrides as Python escapes (`\\n`, `\\x1b`)."""
    out: list[str] = []
    for char in text:
        if char == "\\":
            out.append("\\\\")
        elif unicodedata.category(char) == "Cc" or char in _BIDI_CONTROLS:
            out.append(repr(char)[1:-1] if char not in "\"'" else char)
        else:
            out.append(char)
    return "".join(out)


def _common() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help="print tracebacks on errors")
    common.add_argument(
        "--verbose",
        "-v",
        action="store_true",
        default=argparse.SUPPRESS,
        help="print pawfn's INFO log lines (what a load does, and how long it takes)",
    )
    common.add_argument("--offline", action="store_true", default=None, help="make no network request (PAW_OFFLINE)")
    common.add_argument("--api-url", metavar="URL", help="PAW API root (PAW_API_URL)")
    common.add_argument("--cache-dir", metavar="PATH", help="cache shared with the official SDK (PAW_CACHE_DIR)")
    return common


def _engine_options() -> argparse.ArgumentParser:
    """Where and how programs run: what `run`, `bench` and `serve` share."""
    options = argparse.ArgumentParser(add_help=False)
    options.add_argument(
        "--backend",
        choices=sorted(_BACKENDS),
        default="torch",
        help="torch (default), llamacpp, or remote (a pawfn server: --server-url, key in PAW_SERVER_API_KEY)",
    )
    options.add_argument("--server-url", metavar="URL", help="the server of --backend remote (PAW_SERVER_URL)")
    options.add_argument("--base", metavar="PATH", help="base weights: a GGUF file or a Hugging Face model folder")
    options.add_argument("--device", help="cpu, cuda, cuda:N or mps (default: cpu)")
    options.add_argument("--dtype", choices=get_args(DType), help="compute dtype (default: float32)")
    options.add_argument(
        "--weight-dtype",
        choices=get_args(WeightDType),
        help="compact base matrices on the CPU (Torch, torch's arithmetic): float16 (near-exact) or int8 (lossy; see docs/performance.md)",
    )
    options.add_argument(
        "--numerics",
        choices=get_args(Numerics),
        help="Torch: auto (default: llama.cpp's arithmetic on GGUF bases on the CPU, the official runtime's "
        "tokens; torch's elsewhere), llamacpp, or native (torch's arithmetic)",
    )
    options.add_argument(
        "--batch-invariant",
        choices=("auto", "on", "off"),
        help="Torch: calls decoded together each get their tokens alone (on: row-exact steps) or share batched "
        "products (off: faster on GPUs; tokens may differ); auto (default): on for the CPU, off for CUDA and MPS",
    )
    options.add_argument(
        "--llamacpp-kv-dtype", choices=get_args(DType), help="LlamaCpp: the KV cache's type (default: the official runtime's, float16)"
    )
    options.add_argument("--call-log", metavar="PATH", help="append one JSON line per call to PATH (PAW_CALL_LOG; docs/call-log.md)")
    options.add_argument("--n-ctx", type=int, metavar="N", help="context window in tokens (default: 2048)")
    options.add_argument(
        "--threads",
        type=int,
        metavar="N",
        help="CPU threads (default: Torch takes the cores other processes leave idle; LlamaCpp the official runtime's)",
    )
    return options


def _program_options() -> argparse.ArgumentParser:
    """What `run` and `bench` share: the program, its inputs, and every option that changes how it runs."""
    options = argparse.ArgumentParser(add_help=False, parents=[_engine_options()])
    what = options.add_mutually_exclusive_group(required=True)
    what.add_argument("--program", metavar="REF", help="program id, user/slug, slug@vN, .paw file or folder")
    what.add_argument("--interpreter", metavar="ID", help="no program: the bare interpreter (Qwen/Qwen3-0.6B, gpt2, Qwen/Qwen3.5-0.8B)")
    options.add_argument("--template", metavar="TEXT", help="with --interpreter: a numbered template ({INPUT_0}, {INPUT_1}, ...)")
    options.add_argument(
        "--arg",
        action="append",
        metavar="TEXT",
        help="one call's arguments, in slot order (repeatable; a numbered template: --template, or a program of the vision runtime)",
    )
    options.add_argument(
        "--image",
        action="append",
        dest="arg",
        type=_image_argument,
        metavar="PATH",
        help="an image argument, in slot order among the --arg values (an interpreter that takes images: Qwen3.5; Torch and LlamaCpp)",
    )
    options.add_argument("--input", action="append", default=[], metavar="TEXT", help="input text (repeatable)")
    options.add_argument("--input-file", metavar="PATH", help="inputs from a file, one per line (blank lines skipped); - reads stdin")
    options.add_argument(
        "--input-format",
        choices=("lines", "jsonl"),
        help='lines, or JSON Lines (each a JSON string or an object with an "input" string); default: jsonl for *.jsonl files, else lines',
    )
    options.add_argument("--temperature", type=float, default=0.0, metavar="T", help="0 is greedy (default: 0)")
    options.add_argument("--top-p", type=float, default=1.0, metavar="P", help="nucleus mass in (0, 1] (default: 1)")
    options.add_argument("--seed", type=int, metavar="S", help="sampling seed")
    options.add_argument("--parse-special", action="store_true", help="parse special-token text in inputs (the official SDK's behaviour)")
    return options


def _parser() -> argparse.ArgumentParser:
    common = _common()
    parser = argparse.ArgumentParser(prog="pawfn", description="Run ProgramAsWeights neural programs locally.")
    parser.add_argument("--debug", action="store_true", help="print tracebacks on errors")
    parser.add_argument("--verbose", "-v", action="store_true", help="print pawfn's INFO log lines (what a load does, and how long it takes)")
    parser.add_argument("--version", action="version", version=_version())
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    program = _program_options()
    run = commands.add_parser("run", parents=[common, program], help="run a program on one or more inputs")
    run.add_argument("--max-tokens", type=int, metavar="N", help="most tokens to generate (default: to EOS)")
    run.add_argument(
        "--batch-size",
        type=int,
        default=8,
        metavar="N",
        help="inputs decoded together, each with the tokens it gets alone (default: 8; llama.cpp runs them in turn)",
    )
    run.add_argument("--json", action="store_true", help="print one JSON object per input (JSON Lines); plain output escapes control characters")
    typed = run.add_mutually_exclusive_group()
    typed.add_argument("--choices", metavar="A,B,C", help="the output must be one of these comma-separated texts")
    typed.add_argument("--pattern", metavar="REGEX", help="the output must match this regular expression as a whole")
    typed.add_argument("--json-schema", type=Path, metavar="FILE", help="the output must be a JSON value of the schema in FILE")

    bench = commands.add_parser("bench", parents=[common, program], help="time calls of a program (load, latency, memory)")
    bench.add_argument("--max-tokens", type=int, default=10, metavar="N", help="tokens per call (default: 10)")
    bench.add_argument("--runs", type=int, default=10, metavar="N", help="timed calls after one warm-up (default: 10)")
    bench.add_argument(
        "--concurrency",
        type=int,
        default=1,
        metavar="N",
        help="callers at once (default: 1); Torch decodes their calls together, up to --max-model-copies",
    )
    bench.add_argument("--max-model-copies", type=int, metavar="N", help="model copies, so concurrent runs (default: 8)")
    bench.add_argument("--max-batch-rows", type=int, metavar="N", help="rows per forward pass of a decode step (default: 8)")
    bench.add_argument("--json", action="store_true", help="print one JSON object with the figures and the configuration")

    evaluation = commands.add_parser(
        "eval", parents=[common, _engine_options()], help="evaluate a program on cases: accuracy, per label and tag, JUnit XML, --compare"
    )
    evaluation.add_argument("--program", required=True, metavar="REF", help="program id, user/slug, slug@vN, .paw file or folder")
    evaluation.add_argument("--cases", type=Path, metavar="FILE", help="cases: .jsonl, .json or .csv, each with input and expected (and id, tags)")
    evaluation.add_argument("--from-spec", action="store_true", help="also the Input:/Output: examples of the program's spec")
    evaluation.add_argument(
        "--from-log",
        action="append",
        type=Path,
        default=[],
        metavar="LOG",
        help="also cases from a call log (--call-log): each call's expected, else its output",
    )
    evaluation.add_argument("--log-program", metavar="ID", help="with --from-log: only the calls of this program id")
    scoring = evaluation.add_mutually_exclusive_group()
    scoring.add_argument("--normalize", action="store_true", help="an output is right up to case and runs of white space (default: exact)")
    scoring.add_argument("--scorer", metavar="MODULE:FUNCTION", help="your scorer: function(case, output) -> bool")
    evaluation.add_argument("--compare", metavar="REF", help="another program (or version: user/slug@v2) on the same cases: paired counts, McNemar")
    evaluation.add_argument(
        "--compare-backend", choices=sorted(_BACKENDS), help="the compared run on this backend (alone: the same program on two backends)"
    )
    evaluation.add_argument("--min-accuracy", type=float, metavar="X", help="exit 1 when the accuracy (0 to 1) is below X")
    typed_eval = evaluation.add_mutually_exclusive_group()
    typed_eval.add_argument("--choices", metavar="A,B,C", help="calls constrained to one of these texts, as pawfn run --choices")
    typed_eval.add_argument("--pattern", metavar="REGEX", help="calls constrained to this regular expression, as pawfn run --pattern")
    typed_eval.add_argument(
        "--json-schema", type=Path, metavar="FILE", help="calls constrained to the schema in FILE; outputs compared as JSON values, key by key"
    )
    evaluation.add_argument("--max-tokens", type=int, metavar="N", help="most tokens a call generates (default: to EOS)")
    evaluation.add_argument("--temperature", type=float, default=0.0, metavar="T", help="0 is greedy (default: 0)")
    evaluation.add_argument("--top-p", type=float, default=1.0, metavar="P", help="nucleus mass in (0, 1] (default: 1)")
    evaluation.add_argument("--seed", type=int, metavar="S", help="sampling seed")
    evaluation.add_argument("--parse-special", action="store_true", help="parse special-token text in inputs (the official SDK's behaviour)")
    evaluation.add_argument("--no-progress", action="store_true", help="no progress bar (default: one on a terminal)")
    report = evaluation.add_mutually_exclusive_group()
    report.add_argument("--json", action="store_true", help="print the report as JSON (every case, every figure)")
    report.add_argument("--markdown", action="store_true", help="print the report as Markdown (a CI summary, a pull request comment)")
    evaluation.add_argument("--junit-xml", type=Path, metavar="PATH", help="also write JUnit XML there, one test case per case")

    compile_ = commands.add_parser("compile", parents=[common, _engine_options()], help="compile a spec into a program on the hub")
    compile_.add_argument("--spec", required=True, metavar="TEXT", help="what the function does, in plain English")
    compile_.add_argument("--compiler", metavar="NAME", help="compiler (default: the server's)")
    compile_.add_argument("--slug", metavar="SLUG", help="publish under your slug (needs an API key)")
    compile_.add_argument("--name", metavar="NAME", help="display name")
    compile_.add_argument("--private", action="store_true", help="do not list the program publicly")
    compile_.add_argument("--ephemeral", action="store_true", help="ask the server not to keep the program")
    compile_.add_argument("--json", action="store_true", help="print the server's answer as JSON")
    compile_.add_argument(
        "--eval", type=Path, metavar="CASES", help="evaluate the compiled program on CASES first; with --slug, publish it only if it passes"
    )
    compile_.add_argument("--min-accuracy", type=float, metavar="X", help="with --eval: the accuracy (0 to 1) it must reach (default: 1)")
    compile_.add_argument("--max-tokens", type=int, metavar="N", help="with --eval: most tokens a call generates (default: to EOS)")

    info = commands.add_parser("info", parents=[common], help="show a program's facts")
    info.add_argument("program", metavar="REF", help="program id, slug or local bundle")
    info.add_argument("--json", action="store_true", help="print JSON")

    cache = commands.add_parser("cache", help="list, clear or fill the cache shared with the official SDK")
    cache_commands = cache.add_subparsers(dest="cache_command", required=True, metavar="ACTION")
    listing = cache_commands.add_parser("list", parents=[common], help="list cached programs, base models and pawfn's derived files with their sizes")
    listing.add_argument("--json", action="store_true", help='print JSON Lines, each with a "kind"')
    clear = cache_commands.add_parser("clear", parents=[common], help="delete every cached program and base model")
    clear.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    clear.add_argument(
        "--derived", action="store_true", help="delete only pawfn's derived files (converted bases, stored prefixes, kernels), which it rebuilds"
    )
    prune = cache_commands.add_parser(
        "prune", parents=[common], help="delete pawfn's least recently used derived files until they fit a size (programs and bases stay)"
    )
    prune.add_argument(
        "--max-bytes", type=int, metavar="N", help="the size to fit, in bytes (default: derived_cache_max_bytes, PAW_DERIVED_CACHE_MAX_BYTES, 8 GiB)"
    )
    for commands_of in (cache_commands, commands):  # `pawfn prepare` and `pawfn cache prepare`: one command
        prepare = commands_of.add_parser("prepare", parents=[common], help="download a program and its base for offline use")
        chosen = prepare.add_mutually_exclusive_group(required=True)
        chosen.add_argument("program", nargs="?", metavar="REF", help="program id or slug")
        chosen.add_argument("--locked", action="store_true", help="every program of pawfn.lock, by id, its files checked against the lock")
        prepare.add_argument("--lock", metavar="PATH", help="the lock file (default: PAWFN_LOCK, else the nearest pawfn.lock upward)")
        prepare.add_argument(
            "--base",
            type=Path,
            metavar="FILE",
            help="a local copy of the base weights the program's runtime pins (checked by sha256), recorded in the cache instead "
            "of downloaded: later commands need no --base, offline too",
        )
        prepare.add_argument("--json", action="store_true", help="print JSON")

    lock = commands.add_parser("lock", help="pin the programs an application runs in pawfn.lock: add, update, check")
    lock_commands = lock.add_subparsers(dest="lock_command", required=True, metavar="ACTION")
    where = argparse.ArgumentParser(add_help=False)
    where.add_argument("--lock", metavar="PATH", help="the lock file (default: PAWFN_LOCK, else the nearest pawfn.lock upward; add: ./pawfn.lock)")
    add = lock_commands.add_parser("add", parents=[common, where], help="lock a hub program under a name (downloads it and its base)")
    add.add_argument("name", metavar="NAME", help="the name the application loads it by (a Python identifier)")
    add.add_argument("program", metavar="REF", help="program id, user/slug or user/slug@vN")
    add.add_argument("--cases", metavar="FILE", help="its cases file (relative to the lock): `pawfn lock update` evaluates both versions on it")
    returns = add.add_mutually_exclusive_group()
    returns.add_argument("--choices", metavar="A,B,C", help="its output is one of these texts (codegen: a TypedFn of a Literal)")
    returns.add_argument("--pattern", metavar="REGEX", help="its output matches this regular expression (codegen: a TypedFn of a Pattern)")
    returns.add_argument("--returns", choices=get_args(lockfile.Scalar), help="its output is a value of this type (codegen: TypedFn[int], ...)")
    returns.add_argument("--json-schema", type=Path, metavar="FILE", help="its output is JSON of the schema in FILE (codegen: pydantic models)")
    codegen = lock_commands.add_parser("codegen", parents=[common, where], help="write a module of typed handles, one per locked program")
    codegen.add_argument("--out", type=Path, metavar="PATH", help="the module to write (kept in the lock; later runs, add and update rewrite it)")
    codegen.add_argument("--backend", choices=sorted(_BACKENDS), help="the handles' backend (default: the lock's, else torch)")
    update = lock_commands.add_parser(
        "update", parents=[common, where, _engine_options()], help="move names to what their slugs now resolve to, printing each change"
    )
    update.add_argument("names", nargs="*", metavar="NAME", help="the names to update (default: all)")
    update.add_argument("--max-tokens", type=int, metavar="N", help="most tokens a call generates when evaluating (default: to EOS)")
    check = lock_commands.add_parser("check", parents=[common, where], help="exit 1 on any drift between the lock, the cache and the hub")
    check.add_argument("names", nargs="*", metavar="NAME", help="the names to check (default: all)")

    serve = commands.add_parser(
        "serve",
        parents=[common, _engine_options()],
        help="serve programs over HTTP: the official /api/v1/infer and pawfn's /v1 API (needs pawfn[serve])",
    )
    serve.add_argument(
        "--program",
        action="append",
        default=[],
        metavar="[NAME=]REF",
        help="program to load at start: id, user/slug, slug@vN, .paw file or folder, also served as NAME (repeatable)",
    )
    serve.add_argument("--allow-load", action="store_true", help="also load hub programs (ids, slugs) on their first request")
    serve.add_argument("--locked", action="store_true", help="serve every program of pawfn.lock under its name, its files checked against the lock")
    serve.add_argument("--lock", metavar="PATH", help="with --locked: the lock file (default: PAWFN_LOCK, else the nearest pawfn.lock upward)")
    serve.add_argument("--host", default="127.0.0.1", help="address to listen on (default: 127.0.0.1)")
    serve.add_argument("--port", type=int, default=8000, help="port (default: 8000)")
    serve.add_argument("--api-key-env", metavar="NAME", help="require the key held in environment variable NAME (Bearer or X-API-Key)")
    serve.add_argument(
        "--admin-key-env",
        metavar="NAME",
        help="enable the operator routes (POST /v1/programs/REF/load and /unload) for the key held in environment variable NAME (default: off)",
    )
    serve.add_argument(
        "--trusted-proxy",
        action="append",
        default=[],
        metavar="ADDRESS",
        dest="trusted_proxies",
        help="a proxy whose X-Forwarded-For names the client, for the per-client queue share (repeatable; default: none, the header is ignored)",
    )
    serve.add_argument(
        "--result-cache-bytes",
        type=int,
        metavar="N",
        help=f"bytes of the result cache that answers repeated deterministic calls, shared by the programs; 0: off "
        f"(default: PAW_RESULT_CACHE_BYTES, else {SERVE_RESULT_CACHE_BYTES >> 20} MiB)",
    )
    serve.add_argument("--max-model-copies", type=int, metavar="N", help="concurrent runs per base (default: 8)")
    serve.add_argument("--max-batch-rows", type=int, metavar="N", help="rows per forward pass (default: 8)")
    limits = ServeSettings()
    for flag, field, what in _SERVE_LIMITS:
        default = getattr(limits, field)
        serve.add_argument(flag, type=int, default=default, metavar="N", dest=field, help=f"{what} (default: {default})")
    for flag, field, what in _SERVE_TIMEOUTS:
        default = getattr(limits, field)
        serve.add_argument(flag, type=float, default=default, metavar="S", dest=field, help=f"{what} (default: {default:g})")
    serve.add_argument(
        "--max-programs",
        type=int,
        metavar="N",
        help="most programs resident at once (Ray: per replica); with --allow-load a new one replaces the least recently used idle one "
        "(default: with --allow-load, those named at start and 8 more, else no bound; Ray: 8)",
    )
    serve.add_argument(
        "--max-program-bytes",
        type=int,
        metavar="N",
        help="most bytes the resident programs hold beside their bases (adapters, prefixes; Ray: per replica), bounded like --max-programs "
        "(default: none)",
    )
    serve.add_argument(
        "--program-wait",
        type=float,
        default=ServeSettings().program_wait_s,
        metavar="S",
        dest="program_wait_s",
        help="how long a request whose program must load waits for a resident one to go idle, then 503 (default: 5)",
    )
    serve.add_argument(
        "--graceful-timeout",
        type=float,
        default=30.0,
        metavar="S",
        help="on SIGTERM or Ctrl-C, exit within S seconds; requests still running half a second before then answer 503 (default: 30)",
    )
    serve.add_argument("--ray", action="store_true", help="serve on Ray Serve (RAY_ADDRESS's cluster, else a local Ray; needs pawfn[ray])")
    serve.add_argument("--replicas", type=int, default=1, metavar="N", help="Ray: program replicas (default: 1)")
    serve.add_argument("--max-replicas", type=int, metavar="N", help="Ray: autoscale up to N replicas on ongoing requests (default: fixed)")

    login = commands.add_parser("login", parents=[common], help="store an API key in the official config file")
    login.add_argument("key", nargs="?", help="the key (prompted for when omitted)")
    return parser


def _version() -> str:
    return f"pawfn {metadata.version('pawfn')}"


def _config(args: argparse.Namespace) -> PawConfig:
    overrides: dict[str, object] = {}
    names = (
        "offline",
        "api_url",
        "cache_dir",
        "device",
        "dtype",
        "weight_dtype",
        "numerics",
        "llamacpp_kv_dtype",
        "n_ctx",
        "threads",
        "max_model_copies",
        "max_batch_rows",
        "server_url",
        "call_log",
    )
    for name in names:
        value = getattr(args, name, None)
        if value is not None:
            overrides[name] = Path(value) if name in ("cache_dir", "call_log") else value
    invariant = getattr(args, "batch_invariant", None)
    if invariant in ("on", "off"):
        overrides["batch_invariant"] = invariant == "on"
    try:
        return PawConfig.from_sources(overrides, _OPTION_FLAGS)
    except OptionError as exc:
        raise _CliError(str(exc)) from exc


def _options(args: argparse.Namespace) -> RuntimeOptions:
    try:
        return RuntimeOptions(
            max_tokens=args.max_tokens,
            temperature=args.temperature,
            top_p=args.top_p,
            seed=args.seed,
            parse_special_in_input=args.parse_special,
            response_format=_response_format(args),
        )
    except OptionError as exc:
        raise _CliError(str(exc.labeled(_OPTION_FLAGS))) from exc


def _response_format(args: argparse.Namespace) -> ChoicesFormat | PatternFormat | JsonSchemaFormat | None:
    """The output format `--choices`, `--pattern` or `--json-schema` asks for (at most one: argparse sees to that)."""
    choices: str | None = getattr(args, "choices", None)
    pattern: str | None = getattr(args, "pattern", None)
    schema_file: Path | None = getattr(args, "json_schema", None)
    try:
        if choices is not None:
            listed = tuple(choice.strip() for choice in choices.split(",") if choice.strip())
            if not listed:
                raise _CliError(f"--choices {choices!r}: no choice in it; give the texts the output may be, comma-separated (--choices yes,no)")
            return ChoicesFormat(choices=listed)
        if pattern is not None:
            if not pattern:
                raise _CliError("--pattern '': give the regular expression the output must match (--pattern '[0-9]+')")
            return PatternFormat(pattern=pattern)
        if schema_file is None:
            return None
        try:
            schema = json.loads(schema_file.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise _CliError(f"--json-schema {schema_file}: cannot read a JSON schema there ({exc})") from None
        if not isinstance(schema, dict):
            raise _CliError(f"--json-schema {schema_file}: a JSON schema is an object, not {type(schema).__name__}")
        return JsonSchemaFormat(json_schema=JsonSchemaSpec.model_validate({"name": schema_file.stem, "schema": schema}))
    except ValidationError as exc:
        raise _CliError(f"--choices/--pattern/--json-schema: {describe_validation_error(exc)}") from None


def _positive(flag: str, value: int) -> None:
    """Refuse a count below 1 in the wording of every option error."""
    if value < 1:
        raise _CliError(str(OptionError([OptionProblem.outside(flag, value, "an integer >= 1")])))


def _input_line(line: str, number: int, source: str, jsonl: bool) -> str:
    if not jsonl:
        return line
    parsed = parse_json_object(line) if line.lstrip().startswith("{") else None
    text: object = parsed.get("input") if parsed is not None else None
    if parsed is None:
        try:
            text = json.loads(line)
        except json.JSONDecodeError:
            text = None
    if not isinstance(text, str):
        raise _CliError(f'{source}: line {number} is not a JSON string or an object with an "input" string')
    return text


def _inputs(args: argparse.Namespace) -> list[str]:
    """--input values, then the lines of --input-file (or stdin for -), each checked to be valid text."""
    inputs: list[str] = list(args.input)
    if args.input_file is not None:
        source = "stdin" if args.input_file == "-" else args.input_file
        try:
            raw = sys.stdin.buffer.read() if args.input_file == "-" else Path(args.input_file).read_bytes()
            text = raw.decode("utf-8")
        except OSError as exc:
            raise _CliError(f"--input-file {source}: cannot read it ({exc.strerror or exc})") from exc
        except UnicodeDecodeError as exc:
            raise _CliError(f"--input-file {source}: not UTF-8 text (byte {exc.start}); convert it to UTF-8") from exc
        jsonl = (args.input_format or ("jsonl" if source.endswith(".jsonl") else "lines")) == "jsonl"
        for number, line in enumerate(text.splitlines(), start=1):
            if line.strip():
                inputs.append(_input_line(line, number, source, jsonl))
    if not inputs:
        raise _CliError("no input: give --input TEXT (repeatable) or --input-file PATH (- for stdin)")
    for number, item in enumerate(inputs, start=1):
        try:
            item.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise _CliError(f"input {number} is not valid text (undecodable bytes or a lone surrogate)") from exc
    return inputs


def _print_json(data: object) -> None:
    print(json.dumps(data, ensure_ascii=False, default=str), flush=True)


def _load_program(args: argparse.Namespace, config: PawConfig) -> PawFn[InterpreterModel, Backend]:
    """`--program` (with `--base`, if given) on `--backend`, with the interpreter its bundle names; or the bare
    `--interpreter` on its official template or `--template`."""
    base = None if args.base is None else Path(args.base)
    if args.interpreter is None:
        if args.template is not None:
            raise _CliError("--template is for a bare interpreter: give --interpreter ID instead of --program (a program keeps its template)")
        return PawFn.load_any_sync(args.program, _BACKENDS[args.backend], base=base, config=config)
    model = model_for_interpreter(args.interpreter)
    if model is None:
        raise _CliError(f"--interpreter {args.interpreter!r}: pawfn knows {', '.join(m.interpreter_id for m in builtin_models())}")
    return PawFn.specialize(model, _BACKENDS[args.backend]).bare(base=base, template=args.template, config=config)


def _image_argument(path: str) -> Image:
    """`--image PATH` as an image argument (read now: a missing or special file is a usage error)."""
    try:
        return Image(path)
    except ImageError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


def _print_first(args: argparse.Namespace, program: PawFn[InterpreterModel, Backend], window: deque[tuple[str, PendingGeneration]]) -> None:
    """Wait for the window's first call, print it and drop it; interrupted, the call stays in the window to be cancelled."""
    text, running = window[0]
    wait_interruptibly([running])
    _print_generation(args, program, text, running.result())
    window.popleft()


def _run(args: argparse.Namespace) -> int:
    _positive("--batch-size", args.batch_size)
    config = _config(args)
    copies = max(config.max_model_copies, args.batch_size)  # every row of a batch holds a copy while it runs
    config = config.with_options(max_batch_rows=args.batch_size, max_model_copies=copies)
    options = _options(args)
    if args.arg is not None:
        if args.input or args.input_file is not None:
            raise _CliError("--arg and --image give one call's arguments; drop --input/--input-file (or give one --input per call)")
        with _load_program(args, config) as program:
            call: Positional[Unpack[tuple[str | Image, ...]]] = Positional(program)  # the count is checked against the template
            shown = [argument if isinstance(argument, str) else repr(argument) for argument in args.arg]
            _print_generation(args, program, shown, call.generate(*args.arg, options=options))
        return 0
    inputs = _inputs(args)
    with _load_program(args, config) as program:
        # at most --batch-size calls in flight (the base's scheduler decodes them together; a server gets no more at
        # once); each output prints as soon as it and those before it are done, in input order
        window: deque[tuple[str, PendingGeneration]] = deque()
        try:
            for text in inputs:
                window.append((text, program.submit(text, options)))
                if len(window) >= args.batch_size:
                    _print_first(args, program, window)
            while window:
                _print_first(args, program, window)
        finally:
            for _, running in window:
                running.cancel()  # after an error or a broken pipe: stop what still runs
    return 0


def _print_generation(args: argparse.Namespace, program: PawFn[InterpreterModel, Backend], text: str | list[str], generation: Generation) -> None:
    if not args.json:
        print(escape_control(generation.text), flush=True)
        return
    _print_json(
        {
            "program": program.program_id or args.program or args.interpreter,
            "interpreter": program.interpreter,
            "input": text,
            "output": generation.text,
            "tokens": list(generation.token_ids),
            "stop_reason": generation.stop_reason,
            "prefix_tokens": generation.prefix_tokens,
            "prompt_tokens": generation.prompt_tokens,
            "numerics": generation.numerics,
            "timings": generation.timings.model_dump(),
        }
    )


def _bench(args: argparse.Namespace) -> int:
    config = _config(args)
    options = _options(args)
    inputs = _inputs(args) if args.input_file is not None or args.input else [_BENCH_INPUT]
    _positive("--runs", args.runs)
    _positive("--concurrency", args.concurrency)
    started = time.perf_counter()
    with _load_program(args, config) as program:
        load_s = time.perf_counter() - started
        result, _ = run_bench(
            program, inputs, options, runs=args.runs, concurrency=args.concurrency, load_s=load_s, reference=args.program or args.interpreter
        )
    if args.json:
        _print_json(result.model_dump())
        return 0
    print(
        f"{result.program} ({result.interpreter}) on {result.backend}, {result.device}, {result.dtype}, "
        f"threads {result.threads or 'default'}, {result.concurrency} caller(s), {result.runs} runs"
    )
    if result.engine is not None:
        print(f"  {result.engine}")
    rows = [
        ("load (ready to run)", f"{result.load_s:.2f} s"),
        ("median call", f"{result.median_ms:.1f} ms"),
        ("p90 call", f"{result.p90_ms:.1f} ms"),
        ("per token", f"{result.ms_per_token:.1f} ms"),
        ("tokens per call", f"{result.tokens_per_call:.1f}"),
        ("calls per second", f"{result.calls_per_s:.2f}"),
        ("peak RSS", f"{result.peak_rss_mb:.0f} MiB"),
    ]
    for label, value in rows:
        print(f"  {label:20} {value}")
    return 0


def _compile(args: argparse.Namespace) -> int:
    config = _config(args)
    evaluated = None if args.eval is None else _evaluated_draft(args, config)
    if evaluated is False:
        return 1
    request = compile_request(args.spec, args.compiler, slug=args.slug, name=args.name, public=not args.private, ephemeral=args.ephemeral)
    result = compile_spec(request, config)
    if isinstance(evaluated, str) and result.program_id != evaluated:
        raise _CliError(
            f"the hub built {result.program_id} for the publishing compile, not the evaluated {evaluated}; evaluate what "
            f"{args.slug or 'it'} names now with `pawfn eval --program {result.program_id} --cases {args.eval}`"
        )
    if args.json:
        _print_json(result.model_dump(mode="json"))
    else:
        print(f"program: {result.program_id}")
        if result.slug:
            print(f"slug: {result.slug}" + (f" v{result.version}" if result.version else ""))
        print(f"status: {result.status}")
        print(f"run it: pawfn run --program {result.slug or result.program_id} --input TEXT")
    return 0


def _evaluated_draft(args: argparse.Namespace, config: PawConfig) -> str | bool:
    """`pawfn compile --eval`: compile unpublished, evaluate on the cases, print the report. The draft's id when it
    reached --min-accuracy (the publishing compile that follows gets the same program: the hub answers a spec and
    compiler it built with that program, which the caller checks), False when it did not."""
    minimum = 1.0 if args.min_accuracy is None else args.min_accuracy
    if not 0 <= minimum <= 1:
        raise _CliError(f"--min-accuracy {minimum}: give a share between 0 and 1 (0.9 for 90%)")
    cases = evals.read_cases(args.eval)
    draft = compile_spec(compile_request(args.spec, args.compiler, name=args.name, public=False), config)
    assert draft.program_id is not None  # compile_spec raises CompileError without one
    base = None if args.base is None else Path(args.base)
    with PawFn.load_any_sync(draft.program_id, _BACKENDS[args.backend], base=base, config=config) as program:
        report = program.evaluate(cases, options=RuntimeOptions(max_tokens=args.max_tokens), name=draft.program_id, progress=config.progress)
    print(evals.render_text(report), file=sys.stderr if args.json else sys.stdout)
    if report.accuracy < minimum:
        where = f"; not published as {args.slug}" if args.slug else ""
        print(f"pawfn: program {draft.program_id}: accuracy {report.accuracy:.4f} is below {minimum}{where}", file=sys.stderr)
        return False
    return draft.program_id


def _eval(args: argparse.Namespace) -> int:
    if args.cases is None and not args.from_spec and not args.from_log:
        raise _CliError("no cases: give --cases FILE (.jsonl, .json or .csv), --from-spec (the program's Input:/Output: examples) or --from-log LOG")
    if args.min_accuracy is not None and not 0 <= args.min_accuracy <= 1:
        raise _CliError(f"--min-accuracy {args.min_accuracy}: give a share between 0 and 1 (0.9 for 90%)")
    config = _config(args)
    scorer = evals.load_scorer(args.scorer) if args.scorer else evals.normalized if args.normalize else None
    options = _options(args)
    base = None if args.base is None else Path(args.base)
    cases = [] if args.cases is None else evals.read_cases(args.cases)
    for log in args.from_log:
        cases += [case.model_copy(update={"id": f"{log.name}:{case.id}"}) for case in evals.log_cases(log, args.log_program)]
    progress = False if args.no_progress else config.progress
    reports: list[evals.EvalReport] = []
    runs = [(args.program, args.backend)]
    if args.compare or args.compare_backend:
        runs.append((args.compare or args.program, args.compare_backend or args.backend))
    for reference, backend in runs:
        with PawFn.load_any_sync(reference, _BACKENDS[backend], base=base, config=config) as program:
            if args.from_spec and not reports:  # the first program's examples: both runs take the same cases
                given = {case.id for case in cases}
                cases += [case for case in evals.spec_cases(program.spec or "", f"{reference}'s spec") if case.id not in given]
            name = reference if runs[0][1] == runs[-1][1] else f"{reference} on {backend}"
            reports.append(evals.evaluate(program, cases, scorer=scorer, options=options, name=name, progress=progress))
    report = reports[0]
    comparison = evals.compare(report, reports[1]) if len(reports) > 1 else None
    if args.junit_xml is not None:
        args.junit_xml.write_text(evals.render_junit(report), encoding="utf-8")
    if args.json:
        data: dict[str, object] = {"report": report.model_dump(mode="json")}
        if comparison is not None:
            data["second"] = comparison.second.model_dump(mode="json")
            data["comparison"] = comparison.model_dump(mode="json", exclude={"first", "second"})
        _print_json(data)
    elif args.markdown:
        print(evals.render_markdown(report))
    else:
        print(evals.render_text(report) + ("" if comparison is None else "\n\n" + evals.render_comparison(comparison)))
    if args.min_accuracy is not None and report.accuracy < args.min_accuracy:
        print(f"pawfn: accuracy {report.accuracy:.4f} is below --min-accuracy {args.min_accuracy}", file=sys.stderr)
        return 1
    return 0


def _dump(model: BaseModel) -> dict[str, object]:
    return model.model_dump(mode="json")


def _info(args: argparse.Namespace) -> int:
    config = _config(args)
    reference = parse_reference(args.program)
    data: dict[str, object]
    if reference.kind == "path":
        with open_bundle(reference.path) as bundle:
            data = _dump(bundle.meta) | {"source": str(reference.path)}
    elif config.offline:
        cache = PawCache(config.cache_dir, config.lock_timeout_s)
        program_id = reference.text if reference.kind == "id" else cache.cached_slug(reference.text)
        bundle_meta = None if program_id is None else cache.read_program(program_id)
        if bundle_meta is None:
            raise PawError(f"program {args.program} is not in the cache (offline); run `pawfn cache prepare {args.program}` online")
        data = _dump(bundle_meta.meta) | {"source": str(bundle_meta.source)}
    else:
        with PawClient(config) as client:
            data = _dump(client.program_info(reference.text))
    if args.json:
        _print_json(data)
    else:
        for key in ("id", "program_id", "name", "spec", "interpreter", "compiler_snapshot", "aliases", "downloads", "source"):
            if data.get(key) not in (None, [], ""):
                print(f"{key}: {data[key]}")
    return 0


def _cache(args: argparse.Namespace) -> int:
    config = _config(args)
    cache = PawCache(config.cache_dir, config.lock_timeout_s)
    if args.cache_command == "list":
        _list_cache(cache, args.json)
        return 0
    if args.cache_command == "prune":
        bound = config.derived_cache_max_bytes if args.max_bytes is None else args.max_bytes
        if bound < 0:
            raise _CliError(f"--max-bytes must be 0 or more, not {bound}")
        removed = prune_derived(cache, bound)
        left = sum(item.size_bytes for item in cache_files(cache) if item.derived)
        print(f"removed {len(removed)} derived files ({_size(sum(item.size_bytes for item in removed))}); {_size(left)} left in {cache.root}")
        return 0
    if args.cache_command == "clear" and args.derived:
        removed = clear_derived(cache)
        print(f"removed {len(removed)} derived files ({_size(sum(item.size_bytes for item in removed))}) from {cache.root}")
        return 0
    if args.cache_command == "clear":
        if not args.yes:
            if not sys.stdin.isatty():
                raise _CliError(
                    "`pawfn cache clear` deletes every cached program and base model; add --yes to confirm "
                    "(or --derived to delete only pawfn's derived files)"
                )
            if input(f"delete everything in {cache.root}? [y/N] ").strip().lower() not in ("y", "yes"):
                print("nothing deleted")
                return 0
        cache.clear()
        print(f"cleared {cache.root}")
        return 0
    return _prepare(args)


def _prepare(args: argparse.Namespace) -> int:
    config = _config(args)
    if args.locked and args.base is not None:
        raise _CliError("--base records one program's base; give the program (`pawfn cache prepare REF --base FILE`), then --locked")
    if args.locked:
        path = lockfile.lock_path(args.lock)
        names = sorted(lockfile.read_lock(path).programs)
        ready = [(name, lockfile.locked_program(name, lock=path, config=config)) for name in names]
    else:
        ready = [(args.program, prepare_program(args.program, config, base_file=args.base))]
    for name, prepared in ready:
        if args.json:
            runtime_id = None if prepared.runtime is None else prepared.runtime.runtime_id
            _print_json(
                {
                    "program": name,
                    "program_id": prepared.program_id,
                    "path": str(prepared.bundle),
                    "runtime_id": runtime_id,
                    "base": str(prepared.base),
                }
            )
        else:
            print(f"{name}: ready offline ({prepared.bundle}; base {prepared.base})")
    return 0


def _lock(args: argparse.Namespace) -> int:
    config = _config(args)
    if args.lock_command == "add":
        path = Path(args.lock) if args.lock else lockfile.find_lock() or Path(lockfile.LOCK_FILE_NAME)
        lock = lockfile.read_lock(path) if path.exists() else lockfile.LockFile()
        name = lockfile.check_name(args.name)
        if name in lock.programs:
            raise _CliError(f"{path} already locks {name} (program {lock.programs[name].program_id}); `pawfn lock update {name}` moves it")
        prepared = prepare_program(parse_hub_reference(args.program).text, config, local_paths=False)
        entry = lockfile.lock_entry(args.program, prepared, cases=args.cases, returns=_declared_returns(args))
        lock.programs[name] = entry
        _write_lock(path, lock)
        print(f"locked {name}: {args.program} -> {entry.program_id} ({entry.interpreter}) in {path}")
        return 0
    path = lockfile.lock_path(args.lock)
    lock = lockfile.read_lock(path)
    if args.lock_command == "codegen":
        target = lock.codegen
        if args.out is not None:
            out = args.out.resolve()
            if not out.is_relative_to(path.parent.resolve()):
                raise _CliError(f"--out {args.out}: the module must be inside the lock's folder {path.parent}")
            target = lockfile.CodegenTarget(path=out.relative_to(path.parent.resolve()).as_posix(), backend=args.backend or "torch")
        elif target is None:
            raise _CliError(f"{path} names no module yet: give --out PATH (for example --out programs.py) the first time")
        elif args.backend is not None:
            target = target.model_copy(update={"backend": args.backend})
        lock.codegen = target
        _write_lock(path, lock)
        print(f"wrote {path.parent / target.path}: {len(lock.programs)} typed handles on {target.backend}")
        return 0
    names = args.names or sorted(lock.programs)
    entries = {name: lock.entry(name, path) for name in names}
    if args.lock_command == "check":
        problems: list[str] = []
        with contextlib.ExitStack() as stack:
            client = None if config.offline else stack.enter_context(PawClient(config))
            for name, entry in entries.items():
                found = lockfile.check_locked(name, entry, config, client)
                problems += found
                if not found:
                    print(f"{name}: {entry.program_id} as locked")
        if lock.codegen is not None:
            module = path.parent / lock.codegen.path
            current = module.read_text(encoding="utf-8") if module.is_file() else None
            if current != generate_module(lock, path, module, lock.codegen.backend):
                problems.append(
                    f"{module} is {'missing' if current is None else 'stale'}: the lock changed since it was generated; run `pawfn lock codegen`"
                )
        for problem in problems:
            print(problem)
        return 1 if problems else 0
    moved = 0
    for name, entry in entries.items():
        if entry.pinned:
            print(f"{name}: {entry.reference} is pinned; nothing to follow")
            continue
        prepared = prepare_program(entry.reference, config, local_paths=False)
        if prepared.program_id == entry.program_id:
            print(f"{name}: {entry.program_id}, unchanged")
            continue
        newer = lockfile.lock_entry(entry.reference, prepared, cases=entry.cases, returns=entry.returns)
        print(f"{name}: {entry.program_id} -> {newer.program_id}" + _eval_delta(args, path, entry, prepared, config))
        lock.programs[name] = newer
        moved += 1
    if moved:
        _write_lock(path, lock)
    return 0


def _write_lock(path: Path, lock: lockfile.LockFile) -> None:
    """Write `lock`, and the handles module it names (so the two never disagree)."""
    if lock.codegen is not None:
        module = path.parent / lock.codegen.path
        text = generate_module(lock, path, module, lock.codegen.backend)  # before the lock: a refused lock writes nothing
        lockfile.write_lock(path, lock)
        module.parent.mkdir(parents=True, exist_ok=True)
        module.write_text(text, encoding="utf-8")
        return
    lockfile.write_lock(path, lock)


def _declared_returns(args: argparse.Namespace) -> lockfile.Returns | None:
    """The output type `pawfn lock add` was told of (--choices, --pattern and --json-schema read as `pawfn run` reads
    them, or --returns); None for text."""
    declared = _response_format(args)
    try:
        if isinstance(declared, ChoicesFormat):
            if len(set(declared.choices)) != len(declared.choices):
                raise _CliError(f"--choices {args.choices}: give each choice once")
            return list(declared.choices)
        if isinstance(declared, PatternFormat):
            return lockfile.ReturnsPattern(pattern=declared.pattern)
        if isinstance(declared, JsonSchemaFormat):
            return lockfile.ReturnsSchema(json_schema=dict(declared.json_schema.schema_))
    except ValidationError as exc:
        raise _CliError(f"the declared output: {describe_validation_error(exc)}") from exc
    returns: lockfile.Returns | None = args.returns
    return returns


def _eval_delta(args: argparse.Namespace, path: Path, entry: lockfile.LockedProgram, newer: PreparedProgram, config: PawConfig) -> str:
    """`' (accuracy ...)'`: both versions evaluated on the entry's cases; '' for an entry without cases."""
    if entry.cases is None:
        return ""
    cases = evals.read_cases(path.parent / entry.cases)
    options = RuntimeOptions(max_tokens=args.max_tokens)
    base = None if args.base is None else Path(args.base)
    reports: list[evals.EvalReport] = []
    versions: tuple[str | PreparedProgram, ...] = (entry.program_id, newer)
    for version in versions:
        with PawFn.load_any_sync(version, _BACKENDS[args.backend], base=base, config=config) as program:
            reports.append(evals.evaluate(program, cases, options=options, name=program.program_id, progress=False))
    comparison = evals.compare(reports[0], reports[1])
    return (
        f" (accuracy {reports[0].accuracy:.4f} -> {reports[1].accuracy:.4f} on {len(cases)} cases of {entry.cases}: "
        f"fixed {comparison.fixed}, broken {comparison.broken}, McNemar p={comparison.p_value:.3g})"
    )


def _list_cache(cache: PawCache, as_json: bool) -> None:
    """Programs, then base models and pawfn's derived files with their sizes (JSON Lines with ``kind``)."""
    programs = cache.list_programs()
    files = cache_files(cache)
    if as_json:
        for program in programs:
            _print_json(
                {
                    "kind": "program",
                    "program_id": program.program_id,
                    "slugs": list(program.slugs),
                    "interpreter": program.interpreter,
                    "spec": program.spec,
                    "runtime_id": program.runtime_id,
                    "path": str(program.path),
                }
            )
        for item in files:
            _print_json({"kind": item.kind, "path": str(item.path), "size_bytes": item.size_bytes, "detail": item.detail})
        return
    if not programs:
        print(f"no programs in the cache ({cache.root}); `pawfn cache prepare REF` fetches one")
    for program in programs:
        names = f" ({', '.join(program.slugs)})" if program.slugs else ""
        print(f"{program.program_id}{names}  {program.interpreter}  {(program.spec or '')[:60]}")
    bases = [item for item in files if item.kind == "base_model"]
    if bases:
        print("base models:")
        for item in bases:
            print(f"  {_size(item.size_bytes):>9}  {item.path.name}")
    derived = [item for item in files if item.derived]
    if derived:
        print("derived by pawfn (rebuilt when missing; `pawfn cache clear --derived` deletes them):")
        for item in derived:
            if item.kind == "converted_base":
                print(f"  {_size(item.size_bytes):>9}  converted base: {item.detail or item.path.name}")
        for kind, name in (("prefix", "stored prefixes"), ("kernel", "compiled kernel libraries")):
            group = [item for item in derived if item.kind == kind]
            if group:
                print(f"  {_size(sum(item.size_bytes for item in group)):>9}  {len(group)} {name}")
    if files:
        print(f"total {_size(sum(item.size_bytes for item in files))} besides programs, in {cache.root}")


def _size(size_bytes: int) -> str:
    """`size_bytes` in decimal units: ``598.3 MB``, ``1.19 GB``."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if size_bytes >= scale:
            value = size_bytes / scale
            return f"{value:.2f} {unit}" if value < 10 else f"{value:.1f} {unit}"
    return f"{size_bytes} B"


def _login(args: argparse.Namespace) -> int:
    config = _config(args)
    key = args.key
    if key is None:
        print(f"Create an API key at {config.api_url}/settings")
        key = getpass.getpass("API key: ").strip()
    if not key:
        raise _CliError("no key given; nothing saved")
    path = save_api_key(key)
    print(f"saved the API key to {path}")
    return 0


def _serve(args: argparse.Namespace) -> int:
    if args.backend == Remote.name:
        raise _CliError("--backend remote: a server runs its programs itself; use torch or llamacpp")
    if not args.program and not args.allow_load and not args.locked:
        raise _CliError("nothing to serve: give --program REF (repeatable), --locked or --allow-load")
    config = _config(args)
    if args.result_cache_bytes is not None and args.result_cache_bytes < 0:
        raise _CliError(f"--result-cache-bytes {args.result_cache_bytes}: give a size in bytes, or 0 to turn the result cache off")
    cache_bytes = args.result_cache_bytes if args.result_cache_bytes is not None else config.result_cache_bytes or SERVE_RESULT_CACHE_BYTES
    config = config.model_copy(update={"result_cache_bytes": cache_bytes})
    references = list(args.program or [])
    if args.locked:  # each locked program checked now (fetched by id if missing), then served by its id under its name
        path = lockfile.lock_path(args.lock)
        for name in sorted(lockfile.read_lock(path).programs):
            references.append(f"{name}={lockfile.locked_program(name, lock=path, config=config).program_id}")
    key, admin_key = _key_from(args.api_key_env, "--api-key-env"), _key_from(args.admin_key_env, "--admin-key-env")
    if key is not None and key == admin_key:
        raise _CliError("--admin-key-env names the same key as --api-key-env; give the operator a key of its own")
    try:
        limits = {field: getattr(args, field) for _, field, _ in _SERVE_LIMITS + _SERVE_TIMEOUTS}
        budget = {"max_programs": args.max_programs, "max_program_bytes": args.max_program_bytes, "program_wait_s": args.program_wait_s}
        settings = ServeSettings(
            api_key=None if key is None else SecretStr(key),
            admin_key=None if admin_key is None else SecretStr(admin_key),
            trusted_proxies=tuple(args.trusted_proxies),
            **budget,
            **limits,
        )
    except OptionError as exc:
        labels = {name: "--" + name.replace("_", "-") for name in ServeSettings.model_fields}
        labels |= {field: flag for flag, field, _ in _SERVE_LIMITS + _SERVE_TIMEOUTS} | {"trusted_proxies": "--trusted-proxy"}
        raise _CliError(str(exc.labeled(labels))) from exc
    logging.basicConfig(level=logging.INFO, format="%(levelname)s:     %(message)s")
    base = None if args.base is None else Path(args.base)
    target = ServeTarget(references, _BACKENDS[args.backend], config, settings, args.host, args.port, args.allow_load, base)
    if args.ray:
        serve_on_ray(target, replicas=args.replicas, max_replicas=args.max_replicas)
    else:
        serve_programs(target, graceful_timeout_s=args.graceful_timeout)
    return 0


def _key_from(variable: str | None, flag: str) -> str | None:
    """The key held in environment variable `variable` (None where no variable is named)."""
    if variable is None:
        return None
    key = os.environ.get(variable)
    if not key:
        raise _CliError(f"{flag} {variable}: that environment variable is empty or unset; export the key in it")
    return key


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of `pawfn`; returns the exit status."""
    parser = _parser()
    args = parser.parse_args(argv)
    if args.verbose:
        logging.basicConfig(level=logging.INFO, format="%(levelname)s:     %(message)s")
    handlers = {"run": _run, "bench": _bench, "eval": _eval, "compile": _compile, "info": _info, "cache": _cache, "prepare": _prepare}
    handlers |= {"lock": _lock, "login": _login, "serve": _serve}
    try:
        with contextlib.ExitStack() as stack:
            if args.command != "serve":  # the server stops gracefully on its own signal handlers
                stack.enter_context(_stopping_on_ctrl_c())
            return handlers[args.command](args)
    except _CliError as exc:
        if args.debug:
            traceback.print_exc()
        print(f"pawfn: error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # a reader that left early (`pawfn cache list | head -1`): stop quietly, as `cat` would
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # so the exit's flush finds no pipe
        return 141  # 128 + SIGPIPE, what a shell reports for a program the pipe stopped
    except (PawError, OSError) as exc:
        if args.debug:
            traceback.print_exc()
        print(f"pawfn: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        if not _interrupted:  # a KeyboardInterrupt our handler did not raise (before it was set): say it here
            print("pawfn: interrupted", file=sys.stderr)
        return 130


_interrupted = False
"""The first Ctrl-C came: its line is printed and the calls are stopping."""


@contextlib.contextmanager
def _stopping_on_ctrl_c() -> Generator[None]:
    """The first Ctrl-C prints one line at once and raises KeyboardInterrupt, which cancels the running calls (they stop
    within a layer of one prompt pass, or at their next token); a second one quits without waiting for them."""
    global _interrupted
    _interrupted = False
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum: int, frame: FrameType | None) -> None:
        global _interrupted
        if _interrupted:
            sys.stderr.flush()
            os._exit(130)
        _interrupted = True
        print("pawfn: interrupted; stopping (Ctrl-C again quits at once)", file=sys.stderr, flush=True)
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGINT, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def entry() -> NoReturn:
    """The `pawfn` command: `main`, then an exit that skips the interpreter's teardown (half a second of freeing
    torch's operator registry here), once stdout and stderr are flushed and the atexit handlers have run."""
    status = main()
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except BrokenPipeError:  # a reader that left early (`pawfn run ... | head -1`) is not an error of ours
        pass
    atexit._run_exitfuncs()  # pyright: ignore[reportPrivateUsage]  # what a normal exit runs first (logging, tqdm)
    os._exit(status)


if __name__ == "__main__":
    entry()
