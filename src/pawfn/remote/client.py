"""Client of a pawfn server (`pawfn serve` or Ray Serve): what the `Remote` backend calls, on the hub clients'
request plan (`hub.http`)."""

from __future__ import annotations

import time
from collections.abc import Generator, Iterator, Sequence
from contextlib import contextmanager

import httpx

from ..core.config import PawConfig, RemoteSettings
from ..core.errors import AuthenticationError, ConfigError, HubError, OutputTypeError, PawError, RequestError, ServerError
from ..core.options import RuntimeOptions
from ..calls.runtime import CallInput
from ..core.protocol import (
    ErrorBody,
    RunBatchRequest,
    RunBatchResponse,
    RunRequest,
    RunResponse,
    ServedProgram,
    ServedPrograms,
    StreamPiece,
    TokenizeRequest,
    TokenizeResponse,
)
from ..hub.http import CALL_RETRY_STATUSES, SERVER_RETRY_STATUSES, Endpoint, ErrorFacts, ModelT, Request, SyncClient, call_timeout_error, parse_model

__all__ = ["ServerClient", "StreamEvent"]


def _output_error(code: str | None, message: str | None) -> OutputTypeError | None:
    """The `OutputTypeError` a local call raises, for a server's answer that its call's output is no value."""
    return OutputTypeError.reported(f"the server's call: {message}") if code == "output_not_of_type" else None


def _as_server_error(error: HubError) -> PawError:
    """A pawfn server's refusals: a bad request is a `RequestError`, a refused key names the server's setting, an
    output that is no value of its type the `OutputTypeError` a local call raises."""
    output_error = _output_error(error.code, error.server_message)
    if output_error is not None:
        return output_error
    facts = ErrorFacts(status=error.status or 0, server_message=error.server_message, url=error.url or "", code=error.code)
    if isinstance(error, AuthenticationError):
        return AuthenticationError(
            f"the server refused the request (HTTP {error.status}): {error.server_message or 'no key'}; set "
            "PawConfig.server_api_key (PAW_SERVER_API_KEY) to the key it was started with",
            **facts,
        )
    if error.status in (400, 413, 422):
        return RequestError(f"the server refused the request (HTTP {error.status}): {error.server_message}", **facts)
    return error


class ServerClient(SyncClient):
    """Client of a `pawfn serve` or Ray Serve server (`PawConfig.server_url`): what the `Remote` backend calls.
    Same retries as `PawClient`; the server's key goes to its origin only."""

    def __init__(self, config: PawConfig | None = None, *, transport: httpx.BaseTransport | None = None, backoff_s: float = 0.5) -> None:
        remote = config or PawConfig.from_env()
        super().__init__(remote, transport, backoff_s)
        self.remote: RemoteSettings = remote
        """Where the server is and how long a call may take there."""
        if remote.server_url is None:
            self.close()
            raise ConfigError("no server to run on: set PawConfig.server_url (or PAW_SERVER_URL) to the URL of a `pawfn serve` server")
        self._root = remote.server_url
        self._key = remote.server_key_value()

    @property
    def url(self) -> str:
        """The server's root URL."""
        return self._root

    def _v1_request(self, method: str, what: str, *parts: str, json: object = None, stream: bool = False, call_s: float | None = None) -> Request:
        """A request to `/v1/...`: the server's errors and retries. A call (`call_s`: its timeout) is sent once."""
        once = call_s is not None
        return Request(
            method,
            self._url("v1", *parts),
            what,
            json=json,
            timeout=call_s,
            stream=stream,
            map_error=_as_server_error,
            retry_statuses=CALL_RETRY_STATUSES if once else SERVER_RETRY_STATUSES,
            once=once,
        )

    def call_timeout(self, options: RuntimeOptions, n_ctx: int, inputs: int = 1) -> float:
        """Seconds to wait for a call's answer: `PawConfig.run_timeout_s`, else 60 s plus 1 s per token of its budget
        (`max_tokens`, else the context) per input."""
        if self.remote.run_timeout_s is not None:
            return self.remote.run_timeout_s
        return 60.0 + float(options.max_tokens if options.max_tokens is not None else n_ctx) * inputs

    def _v1(self, kind: type[ModelT], method: str, what: str, *parts: str, json: object = None, call_s: float | None = None) -> Endpoint[ModelT]:
        """A `/v1/...` endpoint answered by one model."""
        request = self._v1_request(method, what, *parts, json=json, call_s=call_s)
        return Endpoint(request, lambda response: parse_model(kind, response, what))

    def program(self, reference: str) -> ServedProgram:
        """What the server knows of a program (it loads it first where it may): `GET /v1/programs/{ref}`."""
        return self._call(self._v1(ServedProgram, "GET", f"program {reference}", "programs", reference))

    def programs(self) -> list[ServedProgram]:
        """Every program the server holds now."""
        return self._call(self._v1(ServedPrograms, "GET", "programs", "programs")).programs

    def run(self, reference: str, text: CallInput, options: RuntimeOptions, timeout_s: float) -> RunResponse:
        """One call (`POST /v1/programs/{ref}/run`), sent once, its answer awaited `timeout_s` (`call_timeout`)."""
        body = RunRequest.of(text, options).body()
        endpoint = self._v1(RunResponse, "POST", f"a run of {reference}", "programs", reference, "run", json=body, call_s=timeout_s)
        return self._call(endpoint)

    def run_batch(self, reference: str, texts: Sequence[str], options: RuntimeOptions, timeout_s: float) -> RunBatchResponse:
        """Calls decoded together on the server, results in input order (`POST /v1/programs/{ref}/run_batch`), sent
        once, the answer awaited `timeout_s`."""
        body = RunBatchRequest(inputs=list(texts), options=options).model_dump(mode="json")
        endpoint = self._v1(RunBatchResponse, "POST", f"a batch of {reference}", "programs", reference, "run_batch", json=body, call_s=timeout_s)
        return self._call(endpoint)

    def tokenize(self, reference: str, text: CallInput, options: RuntimeOptions) -> list[int]:
        """Token ids of input + suffix, as the server's program evaluates them."""
        body = TokenizeRequest.of(text, options).body()
        what = f"tokens of an input to {reference}"
        return self._call(self._v1(TokenizeResponse, "POST", what, "programs", reference, "tokenize", json=body)).token_ids

    @contextmanager
    def stream(self, reference: str, text: CallInput, options: RuntimeOptions, timeout_s: float) -> Generator[Iterator[StreamEvent], None, None]:
        """One call's server-sent events (`POST /v1/programs/{ref}/stream`): `StreamPiece`s, then the
        `RunResponse`; an `error` event raises the server's error. Refusals before the first event are typed errors.
        Sent once; past `timeout_s` in all, or as long without an event, a `CallTimeoutError` (leaving the block
        closes the connection, so the server stops the call)."""
        body = RunRequest.of(text, options).body()
        request = self._v1_request("POST", f"a stream of {reference}", "programs", reference, "stream", json=body, stream=True, call_s=timeout_s)
        deadline = time.monotonic() + timeout_s
        response = self._send(request)

        def lines() -> Iterator[str]:
            try:
                for line in response.iter_lines():
                    if time.monotonic() > deadline:
                        raise httpx.ReadTimeout("the call's time ran out")
                    yield line
            except httpx.TimeoutException as exc:
                raise call_timeout_error(request.what, request.url, timeout_s, "the server stops it as the connection closes") from exc
            except httpx.TransportError as exc:
                raise ServerError(f"{request.what}: the connection to {request.url} failed mid-stream ({exc})", url=request.url) from exc

        try:
            yield _stream_events(lines(), request.url)
        finally:
            response.close()


StreamEvent = StreamPiece | RunResponse
"""What a server's stream sends: text as generated, then the call's answer."""


def _stream_events(lines: Iterator[str], url: str) -> Iterator[StreamEvent]:
    event, data = "message", ""
    for line in lines:
        if line.startswith("event:"):
            event = line.removeprefix("event:").strip()
        elif line.startswith("data:"):
            data += line.removeprefix("data:").strip()
        elif not line and data:
            if event == "token":
                yield StreamPiece.model_validate_json(data)
            elif event == "done":
                yield RunResponse.model_validate_json(data)
                return
            elif event == "error":
                failure = ErrorBody.model_validate_json(data)
                output_error = _output_error(failure.error, failure.message)
                if output_error is not None:
                    raise output_error
                raise ServerError(f"the server's call failed: {failure.message}", code=failure.error, url=url, server_message=failure.message)
            event, data = "message", ""
    raise ServerError("the server's stream ended before the call's answer", url=url)
