"""Bringing a program in for a request: a reference that failed lately refused at once (`LoadFailures`), a failure
remembered and answered in the server's words (`loading`), the program held for the request (`held_for_request`)."""

from __future__ import annotations

import time
from collections import OrderedDict
from contextlib import AsyncExitStack, asynccontextmanager
from collections.abc import AsyncGenerator


from ..core.backends import Backend
from ..core.errors import (
    CacheLockError,
    HubConnectionError,
    NotFoundError,
    PawError,
    ProgramBudgetError,
    ProgramClosedError,
    RateLimitError,
    ServerError,
)
from ..api.function import PawFn
from ..api.pool import ProgramPool
from ..hub.refs import shown_reference
from ..core.models import InterpreterModel
from ..core.tracing import phase_span

__all__ = ["AnyPawFn", "LoadFailures", "ProgramLoadError", "held_for_request", "loading"]

AnyPawFn = PawFn[InterpreterModel, Backend]
"""A served program: any interpreter, any backend (how `load_any` types what it loads)."""

_TRANSIENT = (HubConnectionError, ServerError, RateLimitError, CacheLockError, ProgramBudgetError, ProgramClosedError)
"""Load failures that say nothing of the program (the hub unreachable or busy, the budget full, a shutdown): the next
request tries again."""
_REMEMBERED_FAILURES = 1024
"""Failed references a server remembers at most (the oldest forgotten first)."""


class ProgramLoadError(PawError):
    """A program a request named could not be loaded (its files from the hub are unusable); the message is the
    client's, the cause the server's log's."""


class LoadFailures:
    """References whose program failed to load on a request, each refused at once for `retry_s` seconds (a damaged
    or hostile program is not fetched, checked and refused again for every request)."""

    def __init__(self, retry_s: float) -> None:
        self.retry_s = retry_s
        self._failed: OrderedDict[str, tuple[float, str]] = OrderedDict()

    def check(self, reference: str) -> None:
        """`ProgramLoadError` if `reference` failed to load within the last `retry_s` seconds."""
        failed = self._failed.get(reference)
        if failed is None:
            return
        at, kind = failed
        left = at + self.retry_s - time.monotonic()
        if left <= 0:
            del self._failed[reference]
            return
        raise ProgramLoadError(
            f"program {shown_reference(reference)} failed to load {time.monotonic() - at:.0f} s ago ({kind}); the server tries again in {left:.0f} s"
        )

    def failed(self, reference: str, exc: PawError) -> ProgramLoadError:
        """Remember that `reference` failed to load with `exc` (unless that says nothing of the program); the error
        to answer with."""
        kind = type(exc).__name__
        if not isinstance(exc, _TRANSIENT) and self.retry_s > 0:
            self._failed[reference] = (time.monotonic(), kind)
            self._failed.move_to_end(reference)
            while len(self._failed) > _REMEMBERED_FAILURES:
                self._failed.popitem(last=False)
        retry = "retry later" if isinstance(exc, _TRANSIENT) else f"the server tries again after {self.retry_s:g} s"
        return ProgramLoadError(f"program {shown_reference(reference)} could not be loaded ({kind}); {retry}")


async def held_for_request(held: AsyncExitStack, pool: ProgramPool[InterpreterModel, Backend], reference: str, failures: LoadFailures) -> AnyPawFn:
    """The program `reference` names, held by `held` until it closes; one the pool must bring in goes through
    `loading` (its failures remembered and answered as such), while an error inside the caller's block stays its own."""
    if reference in pool:
        return await held.enter_async_context(pool.use(reference))
    with phase_span("pawfn.load", {"pawfn.program": shown_reference(reference)}):
        async with loading(reference, failures):
            return await held.enter_async_context(pool.use(reference))


@asynccontextmanager
async def loading(reference: str, failures: LoadFailures) -> AsyncGenerator[None, None]:
    """Around bringing a program in for a request: a reference that failed lately is refused at once, and a failure is
    remembered and answered as a `ProgramLoadError` (the cause kept for the log); a program the hub does not know is a
    404 in the server's words."""
    failures.check(reference)
    try:
        yield
    except NotFoundError as exc:
        raise NotFoundError(f"program {shown_reference(reference)} is not served here, and the hub knows no such program", status=404) from exc
    except (ProgramBudgetError, ProgramClosedError):
        raise
    except PawError as exc:
        raise failures.failed(reference, exc) from exc
