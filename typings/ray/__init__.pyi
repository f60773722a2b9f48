# The parts of ray that pawfn uses (ray's own annotations are partial): the `ray` extra.
from typing import Any

from . import util as util

def init(
    *,
    num_cpus: int | None = ...,
    include_dashboard: bool | None = ...,
    object_store_memory: int | None = ...,
    ignore_reinit_error: bool = ...,
    log_to_driver: bool = ...,
    runtime_env: dict[str, Any] | None = ...,
    address: str | None = ...,
    namespace: str | None = ...,
) -> Any: ...
def shutdown() -> None: ...
def is_initialized() -> bool: ...
def kill(actor: Any, *, no_restart: bool = ...) -> None: ...
def get_actor(name: str, namespace: str | None = ...) -> Any: ...
