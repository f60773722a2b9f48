"""The `Remote` backend: programs that run on a `pawfn serve` or Ray Serve server."""

from .program import RemoteProgram

__all__ = ["RemoteProgram"]
