"""llama.cpp's and mtmd's messages in Python's logging (`route_native_logs`, at the levels `native_log_level` gives),
and its C-level stderr silenced while it loads (`quiet_native_stderr`)."""

from __future__ import annotations

import contextlib
import ctypes
import functools
import logging
import os
import threading
from collections.abc import Callable, Generator
from typing import TYPE_CHECKING


if TYPE_CHECKING:
    pass

__all__ = ["native_log_level", "quiet_native_stderr", "route_native_logs"]

_NATIVE_STDERR = threading.Lock()
"""One load at a time redirects fd 2 (process-wide)."""
_NATIVE_LOG = logging.getLogger("pawfn.llamacpp")
_NATIVE_LEVELS = {1: logging.DEBUG, 2: logging.DEBUG, 3: logging.INFO, 4: logging.ERROR}
"""ggml's log levels (1 debug, 2 info, 3 warning, 4 error; 5 continues the last message) as pawfn logs them. Its
warnings are routine here (a recurrent model's position jump at every image), so they log at INFO."""


_ROUTINE_ERRORS = (b"seq_rm: invalid seq_id (-1) ",)
"""Errors llama.cpp logs where nothing is wrong: every evaluation drops the cache past its start with seq_id -1
(every sequence), as `Llama.eval` does; the attention cache takes it, and the recurrent memory of a model like
Qwen3.5's refuses -1 with this error and keeps its state, which cannot be cut anyway. Python would print each one."""


def native_log_level(level: int, text: bytes, last: int) -> int:
    """The `logging` level of one llama.cpp message (`last`: the previous message's, which a continuation keeps)."""
    if level == 5:
        return last
    if text.startswith(_ROUTINE_ERRORS):
        return logging.DEBUG
    return _NATIVE_LEVELS.get(level, logging.DEBUG)


@functools.cache
def route_native_logs() -> Callable[[int, bytes, ctypes.c_void_p | None], None]:
    """Send llama.cpp's and mtmd's messages to the logger `pawfn.llamacpp`, process-wide, once (llama-cpp-python's own
    callback reads an older numbering of ggml's levels and prints every warning as an error); the callback is kept
    alive by the cache."""
    import llama_cpp
    from llama_cpp import mtmd_cpp as mtmd

    last = [logging.DEBUG]

    @llama_cpp.llama_log_callback
    def forward(level: int, text: bytes, user_data: ctypes.c_void_p | None) -> None:
        last[0] = native_log_level(level, text, last[0])
        if _NATIVE_LOG.isEnabledFor(last[0]):
            _NATIVE_LOG.log(last[0], "%s", text.decode("utf-8", "replace").rstrip("\n"))

    llama_cpp.llama_log_set(forward, None)
    mtmd.mtmd_helper_log_set(forward, None)  # mtmd's logger too
    return forward


@contextlib.contextmanager
def quiet_native_stderr() -> Generator[None, None, None]:
    """Silence llama.cpp's C-level logging on fd 2 while it loads (process-wide, so serialized)."""
    with _NATIVE_STDERR:
        saved = os.dup(2)
        try:
            with open(os.devnull, "wb") as devnull:
                os.dup2(devnull.fileno(), 2)
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)
