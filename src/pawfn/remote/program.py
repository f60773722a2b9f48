"""`RemoteProgram`: a program held by a server (`PawConfig.server_url`), called over HTTP with pawfn's own types.

Calls go out on daemon threads, at most `PawConfig.max_model_copies` requests in flight at once (the server
batches them); a batch is one request. A cancelled call stops counting at once: closing the program (or the
process, after Ctrl-C) does not wait for its answer, and the server, seeing the connection close, stops it. The
server's program info (interpreter, context, prefix) is read once, when the program opens, so a wrong interpreter
type fails before any run.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from concurrent.futures import CancelledError

from ..core.config import PawConfig
from ..core.errors import ConfigError
from .client import ServerClient
from ..core.options import RuntimeOptions
from ..core.protocol import RunResponse, ServedProgram
from ..core.results import Generation
from ..calls.runtime import CallInput, ProgramRuntime
from ..calls.pending import PendingGeneration, StreamSink, TokenListener

__all__ = ["RemoteProgram"]


class RemoteProgram(ProgramRuntime):
    """A program on a server; safe to call from many threads and tasks."""

    def __init__(self, client: ServerClient, served: ServedProgram, concurrency: int) -> None:
        super().__init__()
        self._client = client
        self._served = served
        self._slots = threading.BoundedSemaphore(concurrency)
        """One per request in flight."""

    @classmethod
    def open(cls, reference: str, config: PawConfig) -> RemoteProgram:
        """Ask the server for `reference` (it loads it if it may); `NotFoundError` if it does not serve it."""
        client = ServerClient(config)
        try:
            served = client.program(reference)
        except BaseException:
            client.close()
            raise
        return cls(client, served, config.max_model_copies)

    @property
    def served(self) -> ServedProgram:
        """What the server said of the program when it opened."""
        return self._served

    @property
    def n_ctx(self) -> int:
        return self._served.n_ctx

    @property
    def prefix_tokens(self) -> int:
        return self._served.prefix_tokens

    def encode_prompt(self, text: CallInput, options: RuntimeOptions) -> list[int]:
        return self._client.tokenize(self._served.name, text, options)

    @property
    def arity(self) -> int:
        return self._served.arity

    def decode_tokens(self, token_ids: Sequence[int]) -> str:
        raise ConfigError("a Remote program has no tokenizer here: its text comes from the server (Generation.text)")

    def submit(self, text: CallInput, options: RuntimeOptions, on_token: TokenListener | None = None) -> PendingGeneration:
        """Send the call from a worker thread and return at once. It goes over the server's stream, so that
        `cancel()` closes its connection and the server stops it at its next token."""
        if on_token is not None:
            raise ConfigError("a Remote program cannot report token ids as they come; follow its text with astream")
        return self._streamed(text, options, None)

    def submit_streaming(self, text: CallInput, options: RuntimeOptions, stream: StreamSink) -> PendingGeneration:
        """Follow the call through the server's stream: `stream` gets its text as the server sends it."""
        return self._streamed(text, options, stream.on_text)

    def _streamed(self, text: CallInput, options: RuntimeOptions, on_text: Callable[[str], None] | None) -> PendingGeneration:
        pending = self.track(PendingGeneration())

        def request() -> list[Generation]:
            with self._client.stream(self._served.name, text, options, self._client.call_timeout(options, self.n_ctx)) as events:
                for event in events:
                    if isinstance(event, RunResponse):
                        return [event.generation]
                    if pending.abandoned.is_set():  # cancelled: leaving closes the connection, which stops the call
                        raise CancelledError()
                    if on_text is not None:
                        on_text(event.text)
            raise AssertionError("a server stream ends with its answer")  # _stream_events raises otherwise

        self._dispatch([pending], request)
        return pending

    def submit_batch(self, texts: Sequence[str], options: RuntimeOptions) -> list[PendingGeneration]:
        """One request for the whole batch (the server decodes it together). Cancelled, it stops counting at once,
        but the server finishes it unless this process exits (closing its connection)."""
        pendings = [self.track(PendingGeneration()) for _ in texts]
        inputs = list(texts)
        timeout_s = self._client.call_timeout(options, self.n_ctx, len(inputs))
        self._dispatch(pendings, lambda: self._client.run_batch(self._served.name, inputs, options, timeout_s).generations)
        return pendings

    def _dispatch(self, pendings: list[PendingGeneration], request: Callable[[], list[Generation]]) -> None:
        """Run `request` on a daemon thread and hand its results to `pendings` (cancelled ones are skipped). The call
        counts as running until it answers or every one of its pendings is cancelled, whichever comes first."""
        self._enter_run()
        counted = threading.Lock()  # held once the run has stopped counting

        def end() -> None:
            if counted.acquire(blocking=False):
                self._exit_run()

        def on_abandon() -> None:
            if all(pending.abandoned.is_set() for pending in pendings):
                end()

        for pending in pendings:
            pending.when_abandoned(on_abandon)

        def work() -> None:
            try:
                with self._slots:
                    running = [pending.set_running_or_notify_cancel() for pending in pendings]
                    if not any(running):
                        return
                    try:
                        generations = request()
                    except BaseException as exc:  # noqa: BLE001 - each waiter gets the error, as from a local backend
                        for pending, started in zip(pendings, running, strict=True):
                            if started:
                                pending.set_exception(exc)
                        return
                    for pending, started, generation in zip(pendings, running, generations, strict=True):
                        if started:
                            pending.set_result(generation)
            finally:
                end()

        # A daemon thread: the process may exit (Ctrl-C) while a cancelled call's request is still out.
        threading.Thread(target=work, name="pawfn-remote", daemon=True).start()

    def release(self) -> None:
        self._client.close()  # a cancelled call still in flight loses its connection: the server stops it
