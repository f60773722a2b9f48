"""Stop sequences (`RuntimeOptions.stop`) in a call's output text: where the first begins, and how much of a text's
end may still turn into one (what a stream holds back)."""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["StopSearch", "first_stop", "unsure_tail"]


def first_stop(text: str, stops: Sequence[str], start: int = 0) -> int | None:
    """Where the first of `stops` begins in `text` (searching from `start`); None: none is there."""
    found = [at for stop in stops if (at := text.find(stop, start)) >= 0]
    return min(found) if found else None


def unsure_tail(text: str, stops: Sequence[str]) -> int:
    """How many characters at the end of `text` begin one of `stops` (0: none could)."""
    return max((k for stop in stops for k in range(1, min(len(stop), len(text) + 1)) if text.endswith(stop[:k])), default=0)


class StopSearch:
    """A growing output searched for `stops`, each time only where the newest characters can have completed one."""

    def __init__(self, stops: Sequence[str]) -> None:
        self._stops = stops
        self._longest = max((len(stop) for stop in stops), default=0)
        self._searched = 0
        self.at: int | None = None
        """Where the first stop sequence begins, once one has appeared."""

    def seen(self, text: str) -> bool:
        """Whether `text` (the whole output so far) now holds a stop sequence."""
        start = max(0, self._searched - self._longest - 4)  # a character's bytes still arriving may redraw the last few
        self._searched = len(text)
        self.at = first_stop(text, self._stops, start)
        return self.at is not None
