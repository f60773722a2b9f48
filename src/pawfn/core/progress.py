"""Progress bars (tqdm, as huggingface_hub) for downloads and weight loading, shown on a terminal by default."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable, Iterator
from typing import TypeVar

from tqdm.auto import tqdm

__all__ = ["DownloadProgress", "download_progress", "progress_enabled", "track"]

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
