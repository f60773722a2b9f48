"""`pawfn serve`'s connections on uvicorn: a bound on how many are open, and a deadline for each request's headers.

uvicorn closes an idle keep-alive connection (`timeout_keep_alive`) but gives a request whose headers trickle in, a
byte at a time, all the time it wants, and takes connections without bound. `guarded_protocol` is uvicorn's h11
protocol with both closed: a connection past `max_connections` is answered 503 and closed, and one that has not
sent a request's headers `header_timeout_s` after it opened (or after its last answer) is closed. The body's own
deadline is the app's (`ServeSettings.body_timeout_s`), so it holds on Ray Serve too.
"""

from __future__ import annotations

import asyncio
import json

from starlette.types import ASGIApp, Receive, Scope, Send
from uvicorn.protocols.http.h11_impl import H11Protocol

from ..core.protocol import ErrorBody

__all__ = ["guarded_protocol"]

_BUSY = json.dumps(
    ErrorBody(error="too_many_connections", message="the server has as many connections open as it takes; retry in a moment").model_dump()
).encode()
_BUSY_RESPONSE = (
    b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\nretry-after: 1\r\nconnection: close\r\n"
    + f"content-length: {len(_BUSY)}\r\n\r\n".encode()
    + _BUSY
)


def guarded_protocol(max_connections: int, header_timeout_s: float) -> type[H11Protocol]:
    """uvicorn's h11 protocol with at most `max_connections` open and `header_timeout_s` seconds for each request's
    headers (pass it as `uvicorn.Config(http=...)`)."""

    class GuardedProtocol(H11Protocol):
        _deadline: asyncio.TimerHandle | None = None

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]  # uvicorn's own signature
            super().connection_made(transport)
            if len(self.connections) > max_connections:
                transport.write(_BUSY_RESPONSE)
                transport.close()
                return
            inner: ASGIApp = self.app

            async def app(scope: Scope, receive: Receive, send: Send) -> None:
                self._disarm()  # the headers are in: the body's deadline is the app's
                await inner(scope, receive, send)

            self.app = app
            self._arm()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if not self.transport.is_closing():
                self._arm()  # the next request's headers, on the same deadline

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

        def _arm(self) -> None:
            self._disarm()
            self._deadline = self.loop.call_later(header_timeout_s, self._expire)

        def _disarm(self) -> None:
            if self._deadline is not None:
                self._deadline.cancel()
                self._deadline = None

        def _expire(self) -> None:
            self._deadline = None
            if not self.transport.is_closing():
                self.logger.info("closing a connection whose request headers did not arrive within %g s", header_timeout_s)
                self.transport.close()

    return GuardedProtocol
