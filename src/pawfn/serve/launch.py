"""`serve_programs`: load programs and serve them over HTTP on uvicorn until SIGINT/SIGTERM (`pawfn serve`)."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

from ..backends import Backend
from ..config import PawConfig
from ..errors import PawError
from .service import LocalPrograms
from .settings import ServeSettings

__all__ = ["serve_programs"]

logger = logging.getLogger("pawfn.serve")


def serve_programs(
    references: Sequence[str], backend: type[Backend], config: PawConfig, settings: ServeSettings, *,
    host: str = "127.0.0.1", port: int = 8000, allow_load: bool = False, base: Path | None = None,
    graceful_timeout_s: float | None = None,
) -> None:
    """Load `references` (each base once; on `base` weights if given; `NAME=REF` also serves REF as NAME), then serve them until a signal; on SIGTERM/SIGINT the server stops
    accepting, finishes the requests it holds (at most `graceful_timeout_s`, None: no limit), then closes them."""
    try:  # the `serve` extra: imported when a server starts, never with pawfn
        import uvicorn

        from .app import create_app
    except ImportError as exc:
        raise PawError(f"pawfn serve needs the serve extra ({exc.name} is missing): pip install 'pawfn[serve]'") from exc
    service = LocalPrograms(backend, config, allow_load=allow_load)
    for given in references:
        alias, _, reference = given.rpartition("=") if "=" in given and not Path(given).exists() else ("", "", given)
        info = service.load(reference, base, alias or None)
        logger.info("serving %s (%s, %s, %d-token prefix)", info.name, info.model, info.backend, info.prefix_tokens)
    uvicorn.run(
        create_app(service, settings), host=host, port=port, log_level="info",
        timeout_graceful_shutdown=None if graceful_timeout_s is None else int(graceful_timeout_s),
    )
