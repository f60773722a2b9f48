"""`serve_programs`: load programs and serve them over HTTP on uvicorn until SIGINT/SIGTERM (`pawfn serve`);
`serve_on_ray`: the same API on Ray Serve (`pawfn serve --ray`). Both serve a `ServeTarget`."""

from __future__ import annotations

import asyncio
import logging
import math
import signal
import socket
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from ..core.backends import Backend
from ..core.config import PawConfig
from ..core.errors import PawError
from .service import LocalPrograms, split_alias
from .settings import ON_REQUEST_PROGRAMS, ServeSettings

__all__ = ["ServeTarget", "resident_budget", "serve_on_ray", "serve_programs"]

logger = logging.getLogger("pawfn.serve")

_ANSWER_S = 5
"""Seconds after the grace for the drained requests' 503s to go out, before uvicorn cancels what is left."""

_EXIT_RESERVE_S = 0.5
"""Seconds of the grace kept for what follows the drain (the 503s written, the programs closed, the exit), so the
process is gone within the graceful timeout; a quarter of a grace under 2 s."""


def _exit_reserve_s(graceful_timeout_s: float) -> float:
    return min(_EXIT_RESERVE_S, graceful_timeout_s / 4)


def drain_delay_s(graceful_timeout_s: float) -> float:
    """Seconds from the signal until the requests still running answer 503: the grace less the exit's reserve."""
    return max(0.0, graceful_timeout_s - _exit_reserve_s(graceful_timeout_s))


class _UnjoinedExecutor(ThreadPoolExecutor):
    """The server loop's default executor under a graceful timeout: the loop's end does not wait for its threads (a
    program load or close a cancelled request left running has nothing left to give once the process exits)."""

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        super().shutdown(wait=False, cancel_futures=True)


@dataclass(frozen=True)
class ServeTarget:
    """What a server serves, wherever it runs: the programs (`NAME=REF` also serves REF as NAME), their backend and
    configuration, the HTTP limits, and where it listens."""

    references: Sequence[str]
    backend: type[Backend]
    config: PawConfig
    settings: ServeSettings
    host: str = "127.0.0.1"
    port: int = 8000
    allow_load: bool = False
    """Also load hub programs (ids and slugs, never local paths) on their first request."""
    base: Path | None = None
    """Base weights for every program (None: each program's own, from the cache or the hub)."""


def serve_programs(target: ServeTarget, *, graceful_timeout_s: float | None = None) -> None:
    """Load the target's programs (each base once), then serve them until a signal: on SIGTERM/SIGINT the server stops
    accepting, finishes the requests it holds, then closes the programs and exits: within `graceful_timeout_s` seconds
    of the signal (None: no limit), the requests still running half a second before then answering 503."""
    try:  # the `serve` extra: imported when a server starts, never with pawfn
        import uvicorn

        from .app import create_app, drain_after
        from .connections import guarded_protocol
    except ImportError as exc:
        raise PawError(f"pawfn serve needs the serve extra ({exc.name} is missing): pip install 'pawfn[serve]'") from exc
    _warn_if_open(target.host, target.settings)
    settings = target.settings
    listening = _bind(target.host, target.port)  # before the loads: a taken port fails now, not after minutes of loading
    app = create_app(_loaded(target), target.settings)

    class DrainingServer(uvicorn.Server):
        """uvicorn, whose shutdown first starts the app's drain deadline: requests still running when it passes
        answer 503 `shutting_down` (streams end with that event), before uvicorn's own timeout (a few seconds later,
        the last resort) would cancel them into 500s."""

        async def startup(self, sockets: list[socket.socket] | None = None) -> None:
            if graceful_timeout_s is not None:
                asyncio.get_running_loop().set_default_executor(_UnjoinedExecutor(thread_name_prefix="pawfn-serve"))
            await super().startup(sockets)
            if self.started:  # uvicorn says where it runs only for sockets it bound itself
                host = f"[{target.host}]" if ":" in target.host else target.host
                logger.info("Uvicorn running on http://%s:%d (Press CTRL+C to quit)", host, listening.getsockname()[1])

        async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
            if graceful_timeout_s is not None:
                close_within_s = graceful_timeout_s - _exit_reserve_s(graceful_timeout_s) * 3 / 4  # the rest: the loop's end and the exit
                drain_after(app, drain_delay_s(graceful_timeout_s), close_within_s=close_within_s)
            await super().shutdown(sockets)

    last_resort = None if graceful_timeout_s is None else math.ceil(graceful_timeout_s) + _ANSWER_S
    config = uvicorn.Config(
        app,
        host=target.host,
        port=target.port,
        log_level="info",
        access_log=False,  # the app logs each request itself, with its request id (pawfn.serve.access)
        timeout_graceful_shutdown=last_resort,
        http=guarded_protocol(settings.max_connections, settings.header_timeout_s),
        ws="none",  # no WebSocket routes: an upgrade request is plain HTTP here
        timeout_keep_alive=settings.keep_alive_timeout_s,
        proxy_headers=bool(settings.trusted_proxies),  # uvicorn's default trusts X-Forwarded-For from 127.0.0.1
        forwarded_allow_ips=list(settings.trusted_proxies) or None,
        server_header=False,
    )
    try:
        DrainingServer(config).run(sockets=[listening])
    finally:
        listening.close()


def _loaded(target: ServeTarget) -> LocalPrograms:
    """The target's programs, each named at start loaded now (each base once), within its budget."""
    settings = target.settings
    service = LocalPrograms(
        target.backend,
        target.config,
        allow_load=target.allow_load,
        max_programs=resident_budget(target),
        max_program_bytes=settings.max_program_bytes,
        program_wait_s=settings.program_wait_s,
        failed_load_retry_s=settings.failed_load_retry_s,
    )
    for given in target.references:
        alias, reference = split_alias(given)
        info = service.load(reference, target.base, alias)
        logger.info("serving %s (%s, %s, %d-token prefix)", info.name, info.model, info.backend, info.prefix_tokens)
    return service


def _bind(host: str, port: int) -> socket.socket:
    """A socket bound to `host`:`port` as uvicorn binds one (`PawError` naming the address and the fix if it is taken)."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise PawError(f"cannot listen on {host}:{port} ({exc.strerror or exc}); stop what holds the port or pass another --port") from exc
    sock.set_inheritable(True)
    return sock


def resident_budget(target: ServeTarget) -> int | None:
    """The most programs resident at once: the settings' `max_programs`, else, where programs load on request, those
    named at start and `ON_REQUEST_PROGRAMS` more; None (no bound) when only programs named at start are served."""
    if target.settings.max_programs is not None or not target.allow_load:
        return target.settings.max_programs
    return len(target.references) + ON_REQUEST_PROGRAMS


def _warn_if_open(host: str, settings: ServeSettings) -> None:
    """Anyone who can reach a non-loopback address can run the programs unless a key is required."""
    if settings.api_key is None and host not in ("127.0.0.1", "localhost", "::1"):
        logger.warning("serving on %s without an API key: anyone who can reach it can run the programs (--api-key-env NAME requires one)", host)


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def serve_on_ray(target: ServeTarget, *, replicas: int = 1, max_replicas: int | None = None) -> None:
    """Serve the same API on Ray Serve until interrupted: on the cluster `RAY_ADDRESS` names, else on a local Ray
    instance; `replicas` program replicas (autoscaled up to `max_replicas`), each within the settings' program budget
    (8 programs when the settings name no count)."""
    try:  # the `ray` extra: imported when a server starts, never with pawfn
        import ray
        from ray import serve

        from .ray import RayAppArgs, ray_app
    except ImportError as exc:
        raise PawError(f"pawfn serve --ray needs the ray extra ({exc.name} is missing): pip install 'pawfn[ray]'") from exc
    args = RayAppArgs(
        programs=list(target.references),
        allow_load=target.allow_load,
        backend=target.backend.name,
        base=None if target.base is None else str(target.base),
        replicas=replicas,
        max_replicas=max_replicas,
        max_programs_per_replica=target.settings.max_programs or 8,
        max_program_bytes_per_replica=target.settings.max_program_bytes,
        config=target.config,
        settings=target.settings,
    )
    _warn_if_open(target.host, target.settings)
    ray.init(ignore_reinit_error=True)
    signal.signal(signal.SIGTERM, _interrupt)  # SIGTERM stops it like Ctrl-C: Serve drains, then Ray shuts down
    try:
        serve.start(http_options={"host": target.host, "port": target.port})
        serve.run(ray_app(args), name="pawfn", route_prefix="/")
        logger.info("serving on Ray Serve at http://%s:%d (Ctrl-C stops)", target.host, target.port)
        never = threading.Event()
        while not never.wait(0.2):  # wakes so a Ctrl-C the kernel gave one of Ray's threads is raised here
            pass
    except KeyboardInterrupt:
        pass
    finally:
        serve.shutdown()
        ray.shutdown()
