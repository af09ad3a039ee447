"""Recap failures from a fake OpenAI-compatible provider reach the caller as
the typed Failure of the segment a waiting close returns, with the whole
cause chain; the close itself succeeded, so it is no error."""

from __future__ import annotations

import pytest

from archivist_client import Client
from support import KEY_ENV, SECRET_KEY, completion, error, eventually, openai_config


def test_provider_401_parks_and_the_close_returns_the_failure(
    start_server, fake_provider, session_id: str
) -> None:
    # The provider echoes the key back, as some do: it must not reach us.
    fake_provider.reply = lambda: error(
        401, f"Incorrect API key provided: {SECRET_KEY}", "invalid_api_key"
    )
    server = start_server(openai_config(fake_provider.base_url), env={KEY_ENV: SECRET_KEY})
    with Client(server.address) as client:
        client.append(session_id, [("user", "Summarise me, please.")])
        # The close committed: it returns the segment, whose state and
        # last_failure say how its recap went.
        closed = client.close(session_id, wait=True)
        assert closed is not None
        assert closed.state == "parked"
        assert closed.summary is None

        failure = closed.last_failure
        assert failure is not None
        assert failure.kind == "unauthorized"
        assert failure.retryable is False
        assert failure.attempts == 1  # a bad key is sent once, not hammered
        assert failure.http_status == 401
        assert (failure.provider, failure.model) == ("openai", "fake-model")
        assert failure.retry_after is None
        assert failure.elapsed is not None
        # What would fix it, naming the variable the key came from.
        assert "refused the key" in failure.hint
        assert SECRET_KEY not in failure.hint

        # The cause chain, outermost first, down to the provider's answer.
        assert len(failure.causes) >= 2
        assert "recap of segment" in failure.causes[0]
        assert "401" in failure.causes[-1]
        assert "Incorrect API key provided" in failure.causes[-1]
        assert SECRET_KEY not in " ".join(failure.causes)
        assert "[REDACTED]" in failure.causes[-1]

        assert fake_provider.count == 1
        assert fake_provider.requests[0]["authorization"] == f"Bearer {SECRET_KEY}"
        assert fake_provider.requests[0]["path"] == "/v1/chat/completions"

        parked = client.segment(closed.id)
        assert parked.state == "parked"
        assert parked.last_failure == failure
        assert client.backlog().parked_by_class == {"unauthorized": 1}

        # Fixed provider plus a requeue: the reconciler summarises it.
        fake_provider.reply = completion
        assert client.requeue(session_id) == 0  # parked ones need include_parked
        assert client.requeue(session_id, include_parked=True) == 1
        assert eventually(lambda: client.segment(closed.id).state == "summarised")
        summary = client.segment(closed.id).summary
        assert summary is not None
        assert (summary.provider, summary.model) == ("openai", "fake-model")
        assert summary.text == "A recap of the segment."


def test_provider_503_stays_pending_after_every_attempt(
    start_server, fake_provider, session_id: str
) -> None:
    fake_provider.reply = lambda: error(503, "The server is overloaded")
    server = start_server(openai_config(fake_provider.base_url, max_attempts=3))
    with Client(server.address) as client:
        client.append(session_id, [("user", "Summarise me, please.")])
        closed = client.close(session_id, wait=True)
        assert closed is not None
        assert closed.state == "pending"  # retryable: the reconciler tries again
        failure = closed.last_failure
        assert failure is not None
        assert failure.kind == "unavailable"
        assert failure.retryable is True
        assert failure.attempts == 3
        assert failure.http_status == 503
        assert "503" in failure.causes[-1]
        assert "overloaded" in failure.causes[-1]
        assert (closed.attempts, closed.passes) == (3, 1)
        # Every attempt of the pass reached the provider (the reconciler may
        # have started the next pass since, hence at least).
        assert fake_provider.count >= 3


def test_a_retry_policy_does_not_repeat_a_close_whose_recap_failed(
    start_server, fake_provider, session_id: str
) -> None:
    """gRPC retry policies retry UNAVAILABLE; a close that committed is OK,
    so a client with one gets the segment it closed (a retried close would
    have found nothing open and returned None)."""
    import json

    fake_provider.reply = lambda: error(503, "The server is overloaded")
    server = start_server(openai_config(fake_provider.base_url, max_attempts=2))
    retrying = json.dumps({
        "methodConfig": [{
            "name": [{"service": "archivist.v1.Archivist"}],
            "retryPolicy": {
                "maxAttempts": 3,
                "initialBackoff": "0.05s",
                "maxBackoff": "0.2s",
                "backoffMultiplier": 2,
                "retryableStatusCodes": ["UNAVAILABLE", "DEADLINE_EXCEEDED"],
            },
        }],
    })
    options = [("grpc.enable_retries", 1), ("grpc.service_config", retrying)]
    with Client(server.address, options=options) as client:
        client.append(session_id, [("user", "Summarise me, please.")])
        closed = client.close(session_id, wait=True)
        assert closed is not None
        assert closed.state == "pending"
        assert closed.last_failure is not None
        assert closed.last_failure.kind == "unavailable"
        assert (closed.attempts, closed.passes) == (2, 1)
        assert [s.id for s in client.segments(session_id)] == [closed.id]


def test_a_refused_connection_names_the_root_cause(
    start_server, session_id: str
) -> None:
    # A provider on a port where nothing listens.
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = start_server(openai_config(f"http://127.0.0.1:{port}/v1", max_attempts=2))
    with Client(server.address) as client:
        client.append(session_id, [("user", "Summarise me, please.")])
        closed = client.close(session_id, wait=True)
    assert closed is not None and closed.state == "pending"
    failure = closed.last_failure
    assert failure is not None and failure.kind == "transport"
    assert failure.attempts == 2
    assert failure.http_status is None
    assert "Connection refused" in failure.causes[-1]


def test_a_rate_limit_carries_retry_after(start_server, fake_provider, session_id: str) -> None:
    def limited():
        status, headers, body = error(429, "Rate limit reached", "rate_limit_exceeded")
        return status, {**headers, "retry-after": "120"}, body

    fake_provider.reply = limited
    server = start_server(openai_config(fake_provider.base_url))
    with Client(server.address) as client:
        client.append(session_id, [("user", "Summarise me, please.")])
        closed = client.close(session_id, wait=True)
    assert closed is not None and closed.state == "pending"
    failure = closed.last_failure
    assert failure is not None and failure.kind == "rate_limited"
    assert failure.retry_after is not None
    assert failure.retry_after.total_seconds() == pytest.approx(120, abs=1)
    # Due again no sooner than the provider asked.
    assert closed.next_attempt_at is not None
    # A Retry-After longer than the blind-wait cap ends the pass at once.
    assert fake_provider.count == 1


def test_close_with_wait_answers_within_the_callers_deadline(
    start_server, fake_provider, session_id: str
) -> None:
    import threading
    import time

    release = threading.Event()

    def hang():
        release.wait(10)  # a provider that does not answer
        return completion()

    fake_provider.reply = hang
    server = start_server(openai_config(fake_provider.base_url))
    try:
        with Client(server.address) as client:
            client.append(session_id, [("user", "Summarise me, please.")])
            started = time.monotonic()
            closed = client.close(session_id, wait=True, timeout=1.0)
            took = time.monotonic() - started
            # The server answers just before the deadline with the state as
            # it stands, instead of letting the call fail.
            assert closed is not None and closed.state == "pending"
            assert took < 1.0
    finally:
        release.set()
