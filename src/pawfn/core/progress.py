"""Progress bars (tqdm, as huggingface_hub) for downloads and weight loading, shown on a terminal by default."""

from __future__ import annotations

import contextlib
import logging
import sys
import threading
import time
from collections.abc import Callable, Generator, Iterable, Iterator
from contextvars import ContextVar
from typing import Never, TypeVar

from tqdm.auto import tqdm

__all__ = ["DownloadProgress", "LoadSteps", "download_progress", "load_step", "loading", "progress_enabled", "track"]

_LOG = logging.getLogger("pawfn")

DownloadProgress = Callable[[int, int | None], None]
"""Called with (bytes so far, total bytes or None) while a file downloads."""

_T = TypeVar("_T")


def progress_enabled(setting: bool | None) -> bool:
    """`PawConfig.progress`: True or False as given; None shows bars only when stderr is a terminal."""
    return sys.stderr.isatty() if setting is None else setting


def download_progress(label: str, setting: bool | None) -> DownloadProgress | None:
    """A byte-counting bar for one download, or None when progress is off; it closes when the total is reached."""
    if not progress_enabled(setting):
        return None
    bar = tqdm(desc=label, unit="B", unit_scale=True, unit_divisor=1024, file=sys.stderr)

    def update(done: int, total: int | None) -> None:
        if total is not None and bar.total != total:
            bar.total = total
        bar.update(done - bar.n)
        if total is not None and done >= total:
            bar.close()

    return update


def track(items: Iterable[_T], label: str, total: int | None, setting: bool | None) -> Iterator[_T]:
    """`items` with a bar counting them (e.g. tensors while a base loads), when progress is on."""
    if not progress_enabled(setting):
        yield from items
        return
    with tqdm(items, desc=label, total=total, unit="tensor", file=sys.stderr, leave=False) as bar:
        yield from bar


LOAD_BAR_DELAY_S = 1.0
"""A load's bar appears once the load has taken this long: most loads of a program on a loaded base are quicker."""


class LoadSteps:
    """What a load is doing: on a terminal a tqdm line naming the step and the time so far, once the load has taken
    `delay_s`; elsewhere (a CI log, a pipe, a server) the same steps as INFO lines of the `pawfn` log, then the whole
    load's time."""

    def __init__(self, name: str, setting: bool | None, delay_s: float = LOAD_BAR_DELAY_S) -> None:
        self._name = name
        self._started = time.perf_counter()
        self._bar: tqdm[Never] | None = None  # a bar over no iterable
        self._ended = threading.Event()
        self._ticker: threading.Thread | None = None
        if progress_enabled(setting):
            self._bar = tqdm(desc=f"loading {name}", bar_format="{desc} [{elapsed}]", delay=delay_s, file=sys.stderr, leave=False)
            # a step may take seconds without a call here: a thread shows the line once the delay has passed and
            # keeps its clock going
            self._ticker = threading.Thread(target=self._tick, args=(self._bar, delay_s), name="pawfn-load-progress", daemon=True)
            self._ticker.start()

    def _tick(self, bar: tqdm[Never], delay_s: float) -> None:
        if self._ended.wait(delay_s):
            return
        while not self._ended.is_set():
            bar.refresh()
            self._ended.wait(_TICK_S)

    def step(self, what: str) -> None:
        """The load has moved on to `what` (e.g. "reading base model.gguf")."""
        if self._bar is not None:
            self._bar.set_description_str(f"loading {self._name}: {what}", refresh=False)  # the thread shows it
        else:
            _LOG.info("loading %s: %s", self._name, what)

    def close(self, loaded: bool) -> None:
        """End the bar; log how long the load took."""
        self._ended.set()
        if self._ticker is not None:
            self._ticker.join()  # its last refresh done: the line is cleared after it, not drawn again
        if self._bar is not None:
            self._bar.close()
        elapsed_s = time.perf_counter() - self._started
        if loaded:
            _LOG.info("loaded %s in %.2f s", self._name, elapsed_s)


_TICK_S = 0.25
"""How often a shown load line updates its clock."""


_current: ContextVar[LoadSteps | None] = ContextVar("pawfn_load_steps", default=None)


@contextlib.contextmanager
def loading(name: str, setting: bool | None) -> Generator[LoadSteps]:
    """The steps of loading `name`, which `load_step` reports to from anywhere the load runs in this context."""
    steps = LoadSteps(name, setting)
    token = _current.set(steps)
    loaded = False
    try:
        yield steps
        loaded = True
    finally:
        _current.reset(token)
        steps.close(loaded)


def load_step(what: str) -> None:
    """Report a step of the load running in this context (nothing outside one)."""
    steps = _current.get()
    if steps is not None:
        steps.step(what)
