"""Recap failures from a fake OpenAI-compatible provider reach the caller as
typed errors with the whole cause chain and the archivist.v1.Failure detail."""

from __future__ import annotations

import grpc
import pytest

from archivist_client import Client, FailedPrecondition, ResourceExhausted, Unavailable
from support import KEY_ENV, SECRET_KEY, completion, error, eventually, openai_config


def test_provider_401_is_failed_precondition_unauthorized_and_parks(
    start_server, fake_provider, session_id: str
) -> None:
    # The provider echoes the key back, as some do: it must not reach us.
    fake_provider.reply = lambda: error(
        401, f"Incorrect API key provided: {SECRET_KEY}", "invalid_api_key"
    )
    server = start_server(openai_config(fake_provider.base_url), env={KEY_ENV: SECRET_KEY})
    with Client(server.address) as client:
        client.append(session_id, [("user", "Summarise me, please.")])
        with pytest.raises(FailedPrecondition) as caught:
            client.close(session_id, wait=True)
        err = caught.value
        assert err.code is grpc.StatusCode.FAILED_PRECONDITION
        assert err.reason == "UNAUTHORIZED"
        assert err.metadata["http_status"] == "401"
        assert err.metadata["provider"] == "openai"

        failure = err.failure
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
        assert len(err.causes) >= 2
        assert err.causes == failure.causes
        assert "recap of segment" in err.causes[0]
        assert "401" in err.causes[-1]
        assert "Incorrect API key provided" in err.causes[-1]
        everything = " ".join([err.message, *err.causes, *err.metadata.values()])
        assert SECRET_KEY not in everything
        assert "[REDACTED]" in err.causes[-1]

        assert fake_provider.count == 1
        assert fake_provider.requests[0]["authorization"] == f"Bearer {SECRET_KEY}"
        assert fake_provider.requests[0]["path"] == "/v1/chat/completions"

        segment_id = int(err.metadata["segment_id"])
        parked = client.segment(segment_id)
        assert parked.state == "parked"
        assert parked.last_failure is not None
        assert parked.last_failure.kind == "unauthorized"
        assert parked.last_failure.causes == failure.causes
        assert client.backlog().parked_by_class == {"unauthorized": 1}

        # Fixed provider plus a requeue: the reconciler summarises it.
        fake_provider.reply = completion
        assert client.requeue(session_id) == 0  # parked ones need include_parked
        assert client.requeue(session_id, include_parked=True) == 1
        assert eventually(lambda: client.segment(segment_id).state == "summarised")
        summary = client.segment(segment_id).summary
        assert summary is not None
        assert (summary.provider, summary.model) == ("openai", "fake-model")
        assert summary.text == "A recap of the segment."


def test_provider_503_is_unavailable_after_every_attempt(
    start_server, fake_provider, session_id: str
) -> None:
    fake_provider.reply = lambda: error(503, "The server is overloaded")
    server = start_server(openai_config(fake_provider.base_url, max_attempts=3))
    with Client(server.address) as client:
        client.append(session_id, [("user", "Summarise me, please.")])
        with pytest.raises(Unavailable) as caught:
            client.close(session_id, wait=True)
        err = caught.value
        assert err.reason == "UNAVAILABLE"
        failure = err.failure
        assert failure is not None
        assert failure.kind == "unavailable"
        assert failure.retryable is True
        assert failure.attempts == 3
        assert failure.http_status == 503
        assert err.causes == failure.causes
        assert "503" in err.causes[-1]
        assert "overloaded" in err.causes[-1]
        # Every attempt of the pass reached the provider (the reconciler may
        # have started the next pass since, hence at least).
        assert fake_provider.count >= 3

        segment = client.segment(int(err.metadata["segment_id"]))
        assert segment.state == "pending"  # retryable: the reconciler tries again
        assert segment.last_failure is not None
        assert segment.last_failure.kind == "unavailable"
        assert segment.attempts >= 3


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
        with pytest.raises(Unavailable) as caught:
            client.close(session_id, wait=True)
    err = caught.value
    assert err.reason == "TRANSPORT"
    assert err.failure is not None and err.failure.kind == "transport"
    assert err.failure.attempts == 2
    assert err.failure.http_status is None
    assert "Connection refused" in err.causes[-1]


def test_a_rate_limit_carries_retry_after(start_server, fake_provider, session_id: str) -> None:
    def limited():
        status, headers, body = error(429, "Rate limit reached", "rate_limit_exceeded")
        return status, {**headers, "retry-after": "120"}, body

    fake_provider.reply = limited
    server = start_server(openai_config(fake_provider.base_url))
    with Client(server.address) as client:
        client.append(session_id, [("user", "Summarise me, please.")])
        with pytest.raises(ResourceExhausted) as caught:
            client.close(session_id, wait=True)
    err = caught.value
    assert err.reason == "RATE_LIMITED"
    assert err.failure is not None and err.failure.kind == "rate_limited"
    assert err.failure.retry_after is not None
    assert err.failure.retry_after.total_seconds() == pytest.approx(120, abs=1)
    assert err.retry_after is not None
    assert err.retry_after.total_seconds() == pytest.approx(120, abs=1)
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
