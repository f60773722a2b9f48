"""A call, whatever runs it: its arguments checked, its future (`PendingGeneration`, which a cancel stops
mid-decode), its text as it is generated (`TextStream`), and waiting for several in order."""

from __future__ import annotations

import asyncio
import queue
import threading
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from concurrent.futures import Future, wait
from typing import Protocol

from ..core.options import RuntimeOptions
from ..core.results import Generation

__all__ = [
    "PendingGeneration",
    "StreamSink",
    "TextIterator",
    "TextStream",
    "TokenListener",
    "checked_input",
    "checked_inputs",
    "checked_options",
    "gather_in_order",
    "results_in_order",
    "wait_interruptibly",
]

_DEFAULT_OPTIONS = RuntimeOptions()

_SIGNAL_POLL_S = 0.05
"""How often the main thread wakes while it waits on calls, to raise a Ctrl-C the kernel handed to another thread."""

TokenListener = Callable[[int], None]
"""Called with each generated token id as a call takes it (on the thread that decodes; keep it short)."""


class PendingGeneration(Future[Generation]):
    """A submitted call. `cancel()` also stops a call that is already decoding: it leaves at the next step."""

    def __init__(self) -> None:
        super().__init__()
        self.abandoned = threading.Event()
        """Set by `cancel()`; a scheduler drops the call's row when it sees it."""
        self._on_abandon: list[Callable[[], None]] = []
        self._abandon_lock = threading.Lock()

    def cancel(self) -> bool:
        with self._abandon_lock:
            self.abandoned.set()
            callbacks, self._on_abandon = self._on_abandon, []
        for callback in callbacks:
            callback()
        return super().cancel()

    def settle(self, result: Callable[[], Generation]) -> None:
        """Hand over what `result()` gives, or the error it raises (a constrained output that is no value)."""
        try:
            generation = result()
        except Exception as exc:  # noqa: BLE001 - the call's own error, delivered through its future
            self.set_exception(exc)
        else:
            self.set_result(generation)

    def when_abandoned(self, callback: Callable[[], None]) -> None:
        """Call `callback` once `cancel()` is called (at once if it was), on the cancelling thread."""
        with self._abandon_lock:
            if not self.abandoned.is_set():
                self._on_abandon.append(callback)
                return
        callback()


class StreamSink(Protocol):
    """What follows a call's output as it comes: token ids (a local backend) or decoded text (a server's)."""

    def on_token(self, token: int) -> None: ...

    def on_text(self, piece: str) -> None: ...


class _Pieces:
    """A call's output as text pieces: each item (a token id, or text decoded elsewhere) gives the text it adds, a
    character's first bytes held back until the rest arrive."""

    def __init__(self, decode: Callable[[Sequence[int]], str]) -> None:
        self._decode = decode
        self._output: list[int] = []
        self._sent = 0

    def add(self, item: int | str) -> str:
        """The text `item` adds ('' while a character is incomplete)."""
        if isinstance(item, str):
            return item
        self._output.append(item)
        text = self._decode(self._output)
        if text.endswith("\ufffd") or len(text) <= self._sent:  # maybe a character's first bytes: wait for the rest
            return ""
        piece, self._sent = text[self._sent :], len(text)
        return piece

    def rest(self) -> str:
        """What held-back bytes became once the call ended."""
        if not self._output:
            return ""
        text = self._decode(self._output)
        return text[self._sent :] if len(text) > self._sent else ""


class TextIterator:
    """One call's text as it is generated, with no event loop: `for piece in stream` gives pieces (unstripped;
    together, the decoded output), then raises the call's error if it failed; `stream.generation()` gives its
    `Generation`. Breaking out of the loop, leaving `with stream`, or `close()` cancels the call."""

    def __init__(self, decode: Callable[[Sequence[int]], str]) -> None:
        self._pieces = _Pieces(decode)
        self._items: queue.SimpleQueue[int | str] = queue.SimpleQueue()
        self._pending: PendingGeneration | None = None

    def on_token(self, token: int) -> None:
        """The call's `TokenListener` (any thread)."""
        self._items.put(token)

    def on_text(self, piece: str) -> None:
        """Text of the call decoded elsewhere (a server's stream), from any thread."""
        self._items.put(piece)

    def follow(self, pending: PendingGeneration) -> None:
        """Read the call `pending` (started with `on_token` or `on_text` as its listener)."""
        self._pending = pending
        pending.add_done_callback(lambda _: self._items.put(-1))

    @property
    def pending(self) -> PendingGeneration:
        """The call being followed (its future)."""
        if self._pending is None:
            raise RuntimeError("TextIterator.follow was not called")
        return self._pending

    def __iter__(self) -> Iterator[str]:
        try:
            while (item := self._next()) != -1:
                piece = self._pieces.add(item)
                if piece:
                    yield piece
            if rest := self._pieces.rest():
                yield rest
            self.generation()  # the call's error, if it failed
        finally:  # a loop left early (break, an exception, the iterator dropped) stops the call
            self.close()

    def _next(self) -> int | str:
        """The next item, waking on the main thread every 50 ms so that a Ctrl-C is acted on at once."""
        poll_s = _SIGNAL_POLL_S if threading.current_thread() is threading.main_thread() else None
        while True:
            try:
                return self._items.get(timeout=poll_s)
            except queue.Empty:
                continue

    def generation(self) -> Generation:
        """The call's `Generation`, once it has ended (its error raised if it failed)."""
        return results_in_order([self.pending])[0]

    def close(self) -> None:
        """Stop the call at its next token (nothing once it has ended)."""
        self.pending.cancel()

    def __enter__(self) -> TextIterator:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class TextStream:
    """One call's text as it is generated: `async for piece in stream` gives pieces (unstripped; together, the
    decoded output), then raises the call's error if it failed; `await stream.generation()` gives its `Generation`
    (with the stripped text). Leaving `async with stream` early cancels the call."""

    def __init__(self, decode: Callable[[Sequence[int]], str]) -> None:
        """Make it on the event loop that will read it, before the call starts."""
        self._decode = decode
        self._loop = asyncio.get_running_loop()
        self._items: asyncio.Queue[int | str] = asyncio.Queue()
        """Token ids as they are taken, or text already decoded (a remote call's); -1 once the call has ended."""
        self._pending: PendingGeneration | None = None

    def _put(self, item: int | str) -> None:
        try:
            self._loop.call_soon_threadsafe(self._items.put_nowait, item)
        except RuntimeError:  # the loop has closed: nobody is reading
            pass

    def on_token(self, token: int) -> None:
        """The call's `TokenListener` (any thread); never raises, so a closed loop cannot fail the call."""
        self._put(token)

    def on_text(self, piece: str) -> None:
        """Text of the call decoded elsewhere (a server's stream), from any thread; never raises."""
        self._put(piece)

    def follow(self, pending: PendingGeneration) -> None:
        """Read the call `pending` (started with `on_token` or `on_text` as its listener)."""
        self._pending = pending

        def ended(_: Future[Generation]) -> None:
            self.on_token(-1)

        pending.add_done_callback(ended)

    @property
    def pending(self) -> PendingGeneration:
        """The call being followed (its future)."""
        if self._pending is None:
            raise RuntimeError("TextStream.follow was not called")
        return self._pending

    async def __aiter__(self) -> AsyncIterator[str]:
        pieces = _Pieces(self._decode)
        while (item := await self._items.get()) != -1:
            piece = pieces.add(item)
            if piece:
                yield piece
        if rest := pieces.rest():  # what a held-back character's bytes became
            yield rest
        await self.generation()  # the call's error, if it failed

    async def generation(self) -> Generation:
        """The call's `Generation`, once it has ended."""
        return await asyncio.wrap_future(self.pending)

    def cancel(self) -> None:
        """Stop the call at its next token."""
        self.pending.cancel()

    async def __aenter__(self) -> TextStream:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        self.cancel()


def results_in_order(pendings: Sequence[PendingGeneration]) -> list[Generation]:
    """The results of `pendings` in order, after all have ended; the first failed one's error is raised. Interrupted
    while it waits (Ctrl-C: KeyboardInterrupt, or any other exception raised in this thread), it cancels them all,
    so a scheduler drops their rows at the next token instead of decoding for nobody, and raises again."""
    try:
        wait_interruptibly(pendings)
    except BaseException:
        for pending in pendings:
            pending.cancel()
        raise
    return [pending.result() for pending in pendings]


def wait_interruptibly(pendings: Sequence[Future[Generation]]) -> None:
    """Block until every call has ended. On the main thread the wait wakes every 50 ms: a SIGINT the kernel
    delivers to another thread (a decode or BLAS worker) only sets a flag that Python acts on in the main thread once
    it runs again, and a lock wait without a timeout would hold it until the calls end."""
    poll_s = _SIGNAL_POLL_S if threading.current_thread() is threading.main_thread() else None
    while wait(pendings, timeout=poll_s).not_done:
        pass


async def gather_in_order(pendings: Sequence[PendingGeneration]) -> list[Generation]:
    """`results_in_order` for the event loop; cancelling the awaiting task cancels every call."""
    outcomes = await asyncio.gather(*(asyncio.wrap_future(pending) for pending in pendings), return_exceptions=True)
    results: list[Generation] = []
    for outcome in outcomes:
        if isinstance(outcome, BaseException):
            raise outcome
        results.append(outcome)
    return results


def checked_input(value: object) -> str:
    """The input text; a non-str is refused at run time too, for callers without a type checker."""
    if not isinstance(value, str):
        raise TypeError(f"input must be str, not {type(value).__name__}")
    return value


def checked_inputs(inputs: Sequence[str]) -> list[str]:
    """A batch's inputs, every one checked before the first call runs."""
    if isinstance(inputs, str):
        raise TypeError("inputs must be a sequence of strings, not one string; pass [text] for one input")
    return [checked_input(item) for item in inputs]


def checked_options(value: object) -> RuntimeOptions:
    if value is None:
        return _DEFAULT_OPTIONS
    if not isinstance(value, RuntimeOptions):
        raise TypeError(f"options must be RuntimeOptions, not {type(value).__name__}")
    return value
