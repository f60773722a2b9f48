"""Subclasses of a generic class that carry its type arguments at run time (`PawFn[Qwen3_0_6B, Torch]` is a class
that knows its model and backend), made once per pair of arguments, across threads."""

from __future__ import annotations

import threading
from typing import TypeVar, cast

from ..core.backends import Backend
from ..core.models import InterpreterModel

__all__ = ["Specializations"]

C = TypeVar("C", bound=type)


class Specializations:
    """The subclasses of one generic class (`base`) per (model, backend) pair."""

    def __init__(self) -> None:
        self._made: dict[tuple[type, type[InterpreterModel], type[Backend]], type] = {}
        self._lock = threading.Lock()

    def of(self, base: C, arguments: object) -> C | None:
        """`base` specialized by `arguments` when they are an interpreter model and a backend class (a checked
        `TypeError` for other classes); None for anything else (type variables, forward references, another count),
        which stays a typing alias."""
        pair = cast("tuple[object, ...]", arguments) if isinstance(arguments, tuple) else ()  # cast: isinstance leaves the items unknown
        if len(pair) != 2:
            return None
        model, backend = pair
        if not (isinstance(model, type) and isinstance(backend, type)):
            return None
        if not issubclass(model, InterpreterModel):
            raise TypeError(f"{base.__name__}'s first type argument must be an InterpreterModel subclass, not {model!r}")
        if not issubclass(backend, Backend):
            raise TypeError(f"{base.__name__}'s second type argument must be a Backend subclass, not {backend!r}")
        key = (base, model, backend)
        with self._lock:
            made = self._made.get(key)
            if made is None:
                name = f"{base.__name__}[{model.__name__}, {backend.__name__}]"
                made = type(name, (base,), {"_model_type": model, "_backend_type": backend, "__module__": base.__module__})
                made.__qualname__ = name
                self._made[key] = made
        return cast(C, made)  # a subclass of `base`, made above
