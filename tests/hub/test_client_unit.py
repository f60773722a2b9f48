"""Client behaviour that needs no server: retries on connection errors, Retry-After parsing, offline refusal."""

from __future__ import annotations

import socket
from pathlib import Path

import httpx
import pytest

from pawfn import CallTimeoutError, HubConnectionError, OfflineError, PawClient, PawConfig, RateLimitError, RuntimeOptions, ServerError
from pawfn.remote.client import ServerClient


def _config(tmp_path: Path, **changes: object) -> PawConfig:
    return PawConfig.model_validate({"api_url": "http://127.0.0.1:9", "cache_dir": tmp_path, "progress": False} | changes)


def test_connection_errors_are_retried_then_typed(tmp_path: Path) -> None:
    attempts: list[str] = []

    def refuse(request: httpx.Request) -> httpx.Response:
        attempts.append(str(request.url))
        raise httpx.ConnectError("connection refused", request=request)

    client = PawClient(_config(tmp_path, max_retries=2), transport=httpx.MockTransport(refuse), backoff_s=0.001)
    with pytest.raises(HubConnectionError, match="cannot reach http://127.0.0.1:9/api/v1/programs/resolve/a%2Fb"):
        client.resolve("a/b")
    assert len(attempts) == 3


def test_a_closed_port_is_a_connection_error(tmp_path: Path) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    client = PawClient(_config(tmp_path, api_url=f"http://127.0.0.1:{port}", max_retries=1), backoff_s=0.001)
    with pytest.raises(HubConnectionError, match="cannot reach"):
        client.compilers()


def test_a_long_retry_after_is_reported_not_slept(tmp_path: Path) -> None:
    calls: list[int] = []

    def limited(request: httpx.Request) -> httpx.Response:
        calls.append(1)
        return httpx.Response(429, headers={"Retry-After": "3600"}, json={"detail": "slow down"})

    client = PawClient(_config(tmp_path), transport=httpx.MockTransport(limited))
    with pytest.raises(RateLimitError, match="rate limited \\(HTTP 429\\): slow down") as info:
        client.compilers()
    assert calls == [1] and info.value.retry_after_s == 3600.0


def test_offline_client_sends_nothing(tmp_path: Path) -> None:
    def fail(request: httpx.Request) -> httpx.Response:
        raise AssertionError("no request may be sent offline")

    client = PawClient(_config(tmp_path, offline=True), transport=httpx.MockTransport(fail))
    with pytest.raises(OfflineError, match="offline mode is on"):
        client.resolve("user/slug")


@pytest.mark.parametrize(("status", "sent"), [(500, 1), (503, 3)])
def test_a_servers_failed_call_is_not_sent_again_but_an_unavailable_server_is_retried(tmp_path: Path, status: int, sent: int) -> None:
    """A pawfn server's 500 is a call that failed (sending it again fails again); 503 and the like are retried."""
    attempts: list[str] = []

    def answer(request: httpx.Request) -> httpx.Response:
        attempts.append(request.url.raw_path.decode())
        return httpx.Response(status, json={"error": "run_failed", "message": "NonFiniteError: logits went NaN"})

    config = _config(tmp_path, server_url="http://127.0.0.1:9", max_retries=2)
    with ServerClient(config, transport=httpx.MockTransport(answer), backoff_s=0.001) as client:
        with pytest.raises(ServerError, match="logits went NaN") as failed:
            client.run("a/b", "x", RuntimeOptions(), timeout_s=60)
    assert failed.value.code == "run_failed"
    assert attempts == ["/v1/programs/a%2Fb/run"] * sent


@pytest.mark.parametrize(
    ("error", "sent", "expected"),
    [
        (httpx.ReadTimeout("slow"), 1, CallTimeoutError),
        (httpx.RemoteProtocolError("dropped"), 1, ServerError),
        (httpx.ConnectError("refused"), 3, HubConnectionError),
    ],
)
def test_a_call_is_sent_once_unless_it_never_reached_the_server(
    tmp_path: Path, error: httpx.TransportError, sent: int, expected: type[Exception]
) -> None:
    """A call the server may be running (a read timeout, a connection lost after sending) is not sent again: a
    second copy would run beside it; one that never connected is retried."""
    attempts: list[str] = []

    def answer(request: httpx.Request) -> httpx.Response:
        attempts.append(request.url.path)
        raise error

    config = _config(tmp_path, server_url="http://127.0.0.1:9", max_retries=2)
    with ServerClient(config, transport=httpx.MockTransport(answer), backoff_s=0.001) as client:
        with pytest.raises(expected):
            client.run("a", "x", RuntimeOptions(), timeout_s=5)
        assert len(attempts) == sent
        attempts.clear()
        with pytest.raises(HubConnectionError):
            client.programs()  # a GET is retried as before: it cannot run anything twice
    assert len(attempts) == 3


def test_a_calls_timeout_follows_its_budget(tmp_path: Path) -> None:
    with ServerClient(_config(tmp_path, server_url="http://127.0.0.1:9")) as client:
        assert client.call_timeout(RuntimeOptions(max_tokens=10), n_ctx=2048) == 70.0
        assert client.call_timeout(RuntimeOptions(), n_ctx=2048, inputs=2) == 60.0 + 4096.0
    with ServerClient(_config(tmp_path, server_url="http://127.0.0.1:9", run_timeout_s=5.0)) as fixed:
        assert fixed.call_timeout(RuntimeOptions(), n_ctx=2048) == 5.0
