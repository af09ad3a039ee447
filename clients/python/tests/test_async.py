"""AsyncClient (grpc.aio): the same round trip and the same errors."""

from __future__ import annotations

import grpc
import pytest

from archivist_client import (
    AsyncClient,
    ContextSummary,
    Entry,
    InvalidArgument,
    NotFound,
)
from support import error, openai_config


async def test_async_append_close_with_wait_and_context_round_trip(server, session_id: str) -> None:
    async with AsyncClient(server.address) as client:
        appended = await client.append(
            session_id,
            [
                ("user", "Remember that the staging database is on port 5433. The runbooks "
                 "for the old cluster still say otherwise, and the dashboards were never "
                 "brought up to date either, so please take them with a grain of salt."),
                {"role": "assistant", "content": "Noted: staging is on 5433.",
                 "client_entry_id": "a-1"},
            ],
        )
        assert [e.seq for e in appended.entries] == [1, 2]
        again = await client.append(
            session_id,
            [{"role": "assistant", "content": "Noted: staging is on 5433.", "client_entry_id": "a-1"}],
        )
        assert again.entries[0].duplicate is True and again.entries[0].seq == 2

        before = await client.context(session_id)
        assert [(i.kind, i.role) for i in before.items] == [("entry", "user"), ("entry", "assistant")]

        closed = await client.close(session_id, wait=True)
        assert closed is not None and closed.state == "summarised"
        assert closed.summary is not None and "5433" in closed.summary.text

        await client.append(session_id, [("user", "And production?")])
        # Everything fits: the transcript comes back raw.
        everything = await client.context(session_id)
        assert [i.content for i in everything.items][-1] == "And production?"
        assert all(isinstance(i, Entry) for i in everything.items)
        # A budget below the raw history: the recap stands for the closed
        # segment, and the newest turn comes raw after it.
        after = await client.context(session_id, max_tokens=everything.estimated_tokens - 1)
        assert type(after.items[0]) is ContextSummary
        assert after.items[0].segment_id == closed.id
        assert after.items[-1].content == "And production?"
        assert all(isinstance(i, Entry) for i in after.items[1:])

        assert (await client.segment(closed.id)).state == "summarised"
        states = [s.state async for s in client.segments(session_id, page_size=1)]
        assert states == ["summarised", "open"]

        flushed = await client.flush(session_id)
        assert flushed.complete is True
        assert await client.requeue(session_id) == 0
        assert (await client.backlog()).summarised >= 2


async def test_async_errors_are_archivist_errors(server) -> None:
    async with AsyncClient(server.address) as client:
        with pytest.raises(InvalidArgument) as caught:
            await client.append("bad id!", [("user", "hello")])
        assert caught.value.code is grpc.StatusCode.INVALID_ARGUMENT
        assert "session_id" in [v.field for v in caught.value.violations]

        with pytest.raises(NotFound) as not_found:
            await client.context("never-written-to")
        assert not_found.value.reason == "SESSION_NOT_FOUND"

        # An error on a page surfaces from the async iterator.
        with pytest.raises(InvalidArgument):
            async for _ in client.segments("bad id!"):
                pass
        # Refused before sending, as the blocking client does.
        with pytest.raises(InvalidArgument) as caught:
            await client.context("never-written-to", max_tokens=-1)
        assert [v.field for v in caught.value.violations] == ["max_tokens"]
        with pytest.raises(InvalidArgument) as caught:
            await client.append("never-written-to", [("robot", "beep")])
        assert caught.value.reason == "INVALID_ROLE"
        assert [s async for s in client.segments("never-written-to")] == []


async def test_async_provider_503_returns_the_segment_with_its_failure(
    start_server, fake_provider, session_id: str
) -> None:
    fake_provider.reply = lambda: error(503, "upstream overloaded")
    server = start_server(openai_config(fake_provider.base_url, max_attempts=2))
    async with AsyncClient(server.address) as client:
        await client.append(session_id, [("user", "Summarise me, please.")])
        closed = await client.close(session_id, wait=True)
    assert closed is not None and closed.state == "pending"
    failure = closed.last_failure
    assert failure is not None
    assert (failure.kind, failure.retryable, failure.attempts, failure.http_status) == (
        "unavailable", True, 2, 503,
    )
    assert "503" in failure.causes[-1]