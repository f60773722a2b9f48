"""Serving programs over HTTP: `pawfn serve` (FastAPI on uvicorn) and a Ray Serve deployment (`pawfn.serve.ray`).

The app and the Ray deployment need the `serve` / `ray` extras and are imported where used; this package itself
imports neither.
"""

from .launch import ServeTarget, serve_on_ray, serve_programs
from .service import LocalPrograms, ProgramService, program_info
from .settings import ServeSettings

__all__ = ["LocalPrograms", "ProgramService", "ServeSettings", "ServeTarget", "program_info", "serve_on_ray", "serve_programs"]
