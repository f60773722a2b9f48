"""The server's own routes: `GET /metrics` (Prometheus) and `GET /healthz` (open without the key)."""

from __future__ import annotations

from fastapi import APIRouter, Response

from ...core.protocol import Health
from ..flow import Serving

__all__ = ["server_router"]


def server_router(serving: Serving) -> APIRouter:
    """The server's routes over `serving`."""
    router = APIRouter(tags=["server"])

    @router.get("/metrics", response_class=Response)
    async def prometheus() -> Response:
        """Prometheus metrics: requests, latency, tokens, batch sizes, queue length."""
        content, media_type = serving.metrics.render()
        return Response(content, media_type=media_type)

    @router.get("/healthz", response_model=Health)
    async def healthz() -> Health:
        """Liveness, open without the key."""
        return Health(status="ok", programs=serving.service.served_count(), queued=serving.admission.queued)

    return router
