"""What a Ray Serve deployment of the HTTP API takes (`RayAppArgs`) and how its replicas scale (`replica_scaling`):
plain data, importable without Ray (`ray` runs them)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from ..core.backends import Torch
from ..core.config import PawConfig
from .settings import ServeSettings

__all__ = ["RayAppArgs", "replica_scaling"]


class RayAppArgs(BaseModel):
    """What `app_builder` takes (`serve run pawfn.serve.ray:app_builder programs=a,b replicas=2`)."""

    model_config = ConfigDict(extra="forbid")

    programs: list[str] = Field(default_factory=list[str])
    """References served by name from the start (ids, slugs, paths that exist on every node); `NAME=REF` serves REF
    as NAME too."""
    allow_load: bool = False
    """Also load hub programs (ids, slugs) on their first request."""
    backend: str = Torch.name
    base: str | None = None
    replicas: int = Field(default=1, ge=1)
    """Replicas at start (the fewest, when autoscaling)."""
    max_replicas: int | None = Field(default=None, ge=1)
    """Autoscale between `replicas` and this many on ongoing requests per replica; None: fixed."""
    target_ongoing_requests: float = Field(default=4.0, gt=0)
    replica_cpus: float = Field(default=1.0, gt=0)
    """CPUs Ray reserves for each replica (Ray also sets its OMP_NUM_THREADS, so torch's threads, to this)."""
    max_programs_per_replica: int = Field(default=8, ge=1)
    """Programs a replica holds at most (Ray's multiplexing and the replica's pool alike); those named at start count
    too and are never evicted once loaded."""
    max_program_bytes_per_replica: int | None = Field(default=None, ge=1)
    """Bytes a replica's programs may hold beside their bases (`ProgramRuntime.resident_bytes`); None: no bound."""
    config: PawConfig = Field(default_factory=PawConfig.from_env)
    settings: ServeSettings = Field(default_factory=ServeSettings)

    @field_validator("programs", mode="before")
    @classmethod
    def _comma_separated(cls, value: object) -> object:
        """`serve run ... programs=a,b` gives one string."""
        return [part for part in value.split(",") if part] if isinstance(value, str) else value


def replica_scaling(args: RayAppArgs) -> dict[str, Any]:  # Any: Ray's deployment options
    """The replica deployment's scaling options: a fixed count, or Ray's autoscaling on ongoing requests per replica
    between `replicas` and `max_replicas`."""
    if args.max_replicas is None or args.max_replicas <= args.replicas:
        return {"num_replicas": args.replicas}
    return {
        "autoscaling_config": {
            "min_replicas": args.replicas,
            "max_replicas": args.max_replicas,
            "target_ongoing_requests": args.target_ongoing_requests,
        }
    }
