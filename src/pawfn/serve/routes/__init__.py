"""The server's routes by area, each a router over one `Serving`: the official SDK's (`official`), pawfn's programs
API (`programs`) and the server's own (`server`); the OpenAI-compatible routes are `serve.openai_api`."""

from .official import official_router
from .programs import programs_router
from .server import server_router

__all__ = ["official_router", "programs_router", "server_router"]
