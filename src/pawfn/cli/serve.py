"""`pawfn serve`: programs over HTTP, on uvicorn or Ray Serve."""

from __future__ import annotations


import argparse
import logging
import os
from collections.abc import Callable
from pathlib import Path


from pydantic import SecretStr

from ..core.backends import Remote
from ..core.errors import OptionError
from ..hub import lockfile
from ..serve import ServeSettings, ServeTarget, serve_on_ray, serve_programs

from .shared import BACKENDS, CliError, engine_options, config_of


def register(add: Callable[..., argparse.ArgumentParser], common: argparse.ArgumentParser) -> None:
    """Add the command's parser by `add` (`add_parser` of pawfn's subcommands), its common options from `common`."""
    serve = add(
        "serve",
        parents=[common, engine_options()],
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
    _add_limits(serve)


def _add_limits(serve: argparse.ArgumentParser) -> None:
    """The server's bounds: concurrency, request limits and timeouts, the program budget, shutdown and Ray's replicas."""
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


def command(args: argparse.Namespace) -> int:
    if args.backend == Remote.name:
        raise CliError("--backend remote: a server runs its programs itself; use torch or llamacpp")
    if not args.program and not args.allow_load and not args.locked:
        raise CliError("nothing to serve: give --program REF (repeatable), --locked or --allow-load")
    config = config_of(args)
    if args.result_cache_bytes is not None and args.result_cache_bytes < 0:
        raise CliError(f"--result-cache-bytes {args.result_cache_bytes}: give a size in bytes, or 0 to turn the result cache off")
    cache_bytes = args.result_cache_bytes if args.result_cache_bytes is not None else config.result_cache_bytes or SERVE_RESULT_CACHE_BYTES
    config = config.model_copy(update={"result_cache_bytes": cache_bytes})
    references = list(args.program or [])
    if args.locked:  # each locked program checked now (fetched by id if missing), then served by its id under its name
        path = lockfile.lock_path(args.lock)
        for name in sorted(lockfile.read_lock(path).programs):
            references.append(f"{name}={lockfile.locked_program(name, lock=path, config=config).program_id}")
    key, admin_key = _key_from(args.api_key_env, "--api-key-env"), _key_from(args.admin_key_env, "--admin-key-env")
    if key is not None and key == admin_key:
        raise CliError("--admin-key-env names the same key as --api-key-env; give the operator a key of its own")
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
        raise CliError(str(exc.labeled(labels))) from exc
    logging.basicConfig(level=logging.INFO, format="%(levelname)s:     %(message)s")
    base = None if args.base is None else Path(args.base)
    target = ServeTarget(references, BACKENDS[args.backend], config, settings, args.host, args.port, args.allow_load, base)
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
        raise CliError(f"{flag} {variable}: that environment variable is empty or unset; export the key in it")
    return key
