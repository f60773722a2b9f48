"""The official SDK's routes: `POST /api/v1/infer` (the hosted inference shape) and `GET /api/v1/programs/resolve/{ref}`."""

from __future__ import annotations

import time

from fastapi import APIRouter, Request

from ...core.options import RuntimeOptions
from ...core.protocol import InferRequest, InferResponse, ResolveResponse
from ..flow import Serving, answered, unless_disconnected
from ..gate import client_of

__all__ = ["official_router"]


def official_router(serving: Serving) -> APIRouter:
    """The official SDK's routes over `serving`."""
    router = APIRouter(tags=["official"])

    @router.post("/api/v1/infer", response_model=InferResponse)
    async def infer(body: InferRequest, request: Request) -> InferResponse:
        """The official hosted inference: `program_id` is a program id or slug."""
        started = time.perf_counter()
        options = serving.checked(body.input, RuntimeOptions(max_tokens=body.max_tokens, temperature=body.temperature or 0.0))
        with serving.admission.hold(1, client_of(request)), answered():
            result = await unless_disconnected(request, serving.service.run(body.program_id, body.input, options), serving.drain)
        serving.counted(result, started)
        latency_ms = (time.perf_counter() - started) * 1e3
        return InferResponse(output=result.generation.text, tokens_generated=len(result.generation.token_ids), latency_ms=latency_ms)

    @router.get("/api/v1/programs/resolve/{reference:path}", response_model=ResolveResponse)
    async def resolve(reference: str) -> ResolveResponse:
        """The program id a slug names, as the official SDK asks before remote inference."""
        with answered():
            info = await serving.service.info(reference)
        return ResolveResponse(program_id=info.program_id or info.name)

    return router
