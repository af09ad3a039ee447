"""Watching a session: events as segments close and are summarised, the
end after the session is erased, stopping a watch, and the stream's errors
as ArchivistErrors. Every wait is bounded: a watch's own deadline, or
asyncio.wait_for."""

from __future__ import annotations

import asyncio
import collections.abc
import threading
import time
from collections.abc import Iterator
from datetime import datetime

import pytest

from archivist_client import (
    AsyncClient,
    Client,
    DeadlineExceeded,
    InvalidArgument,
    Segment,
    SessionEvent,
    SessionWatch,
    Unavailable,
)
from archivist_client.v1 import archivist_pb2 as pb

# The longest any watch in these tests may last.
WATCH_LIMIT = 20.0
# The longest one awaited event may take.
STEP = 10.0


@pytest.fixture
def client(server) -> Iterator[Client]:
    with Client(server.address) as c:
        yield c


def test_a_watcher_sees_closed_then_summarised_then_deleted_and_the_end(
    client: Client, session_id: str
) -> None:
    client.append(session_id, [("user", "The release train leaves on Thursday.")])
    with client.watch(session_id, timeout=WATCH_LIMIT) as events:
        # Subscribed once watch() returns: nothing after it is missed.
        assert isinstance(events, SessionWatch)
        assert isinstance(events, collections.abc.Generator)
        closed_segment = client.close(session_id, wait=True)
        assert closed_segment is not None

        closed = next(events)
        assert isinstance(closed, SessionEvent)
        assert closed.kind == "closed"
        assert isinstance(closed.segment, Segment)
        assert (closed.segment.id, closed.segment.state) == (closed_segment.id, "pending")
        assert closed.segment.level == 1
        assert isinstance(closed.at, datetime)

        summarised = next(events)
        assert summarised.kind == "summarised"
        assert summarised.segment is not None
        assert summarised.segment.id == closed_segment.id
        assert summarised.segment.state == "summarised"
        assert summarised.segment.summary is not None
        assert "Thursday" in summarised.segment.summary.text
        assert summarised.at is not None and summarised.at >= closed.at

        client.delete_session(session_id)
        rest = list(events)  # ends after "deleted"
        assert [e.kind for e in rest] == ["deleted"]
        assert rest[0].segment is None and rest[0].at is not None
        assert events.active is False
        with pytest.raises(StopIteration):
            next(events)


def test_watching_before_the_first_append_sees_closed_then_summarised(
    client: Client, session_id: str
) -> None:
    # The session does not exist yet: the watch waits for it.
    with client.watch(session_id, timeout=WATCH_LIMIT) as events:
        client.append(session_id, [("user", "Invoice 4471 is due on Friday.")])
        closed_segment = client.close(session_id)
        assert closed_segment is not None
        closed = next(events)
        assert (closed.kind, closed.segment and closed.segment.id) == (
            "closed",
            closed_segment.id,
        )
        summarised = next(events)
        assert summarised.kind == "summarised"
        assert summarised.segment is not None and summarised.segment.summary is not None
        assert "4471" in summarised.segment.summary.text
    with pytest.raises(InvalidArgument) as bad:
        client.watch("bad id!", timeout=WATCH_LIMIT)
    assert "session_id" in [v.field for v in bad.value.violations]


def test_a_watch_stops_when_closed_or_cancelled_from_another_thread(
    client: Client, session_id: str
) -> None:
    client.append(session_id, [("user", "Nothing will happen here.")])

    events = client.watch(session_id, timeout=WATCH_LIMIT)
    events.close()
    assert list(events) == [] and events.active is False

    with client.watch(session_id, timeout=WATCH_LIMIT) as events:
        pass
    assert list(events) == []

    # A loop blocked waiting for an event ends, without an error, when
    # another thread cancels the watch (well before its deadline).
    events = client.watch(session_id, timeout=WATCH_LIMIT)
    timer = threading.Timer(0.2, events.cancel)
    timer.start()
    started = time.monotonic()
    try:
        assert list(events) == []
    finally:
        timer.cancel()
    assert time.monotonic() - started < WATCH_LIMIT / 2

    # Breaking out of a loop and closing the generator is the same.
    events = client.watch(session_id, timeout=WATCH_LIMIT)
    client.close(session_id)
    for event in events:
        assert event.kind == "closed"
        break
    events.close()
    assert events.active is False


def test_a_watch_ends_with_unavailable_when_the_server_stops(start_server, session_id: str) -> None:
    server = start_server()
    with Client(server.address) as client:
        client.append(session_id, [("user", "Before the shutdown.")])
        events = client.watch(session_id, timeout=WATCH_LIMIT)
        server.stop()
        with pytest.raises(Unavailable) as caught:
            next(events)
    assert caught.value.reason == "SHUTTING_DOWN"
    assert events.active is False


def test_a_watch_past_its_deadline_raises_deadline_exceeded(
    client: Client, session_id: str
) -> None:
    client.append(session_id, [("user", "Quiet.")])
    events = client.watch(session_id, timeout=0.3)
    with pytest.raises(DeadlineExceeded):
        next(events)


async def test_async_watcher_sees_closed_then_summarised_then_deleted(
    server, session_id: str
) -> None:
    async with AsyncClient(server.address) as client:
        await client.append(session_id, [("user", "The backup runs at 02:00 UTC.")])
        async with client.watch(session_id, timeout=WATCH_LIMIT) as events:
            closed_segment = await client.close(session_id, wait=True)
            assert closed_segment is not None
            closed = await asyncio.wait_for(anext(events), STEP)
            summarised = await asyncio.wait_for(anext(events), STEP)
            assert [closed.kind, summarised.kind] == ["closed", "summarised"]
            assert closed.segment is not None and summarised.segment is not None
            assert closed.segment.id == summarised.segment.id == closed_segment.id
            assert summarised.segment.summary is not None

            await client.delete_session(session_id)

            async def rest() -> list[SessionEvent]:
                return [e async for e in events]

            assert [e.kind for e in await asyncio.wait_for(rest(), STEP)] == ["deleted"]
            assert events.active is False

        # Erased: a new watch waits for the session to come again, and
        # sees its first close.
        async with client.watch(session_id, timeout=WATCH_LIMIT) as events:
            await client.append(session_id, [("user", "Back again.")])
            again = await client.close(session_id)
            assert again is not None
            closed = await asyncio.wait_for(anext(events), STEP)
            assert closed.kind == "closed"
            assert closed.segment is not None and closed.segment.id == again.id


async def test_async_watch_stops_by_aclose_from_another_task_or_by_cancelling(
    server, session_id: str
) -> None:
    async with AsyncClient(server.address) as client:
        await client.append(session_id, [("user", "Nothing will happen here either.")])

        events = await client.watch(session_id, timeout=WATCH_LIMIT)

        async def collect() -> list[SessionEvent]:
            return [e async for e in events]

        reader = asyncio.create_task(collect())
        await asyncio.sleep(0.1)
        await events.aclose()
        assert await asyncio.wait_for(reader, STEP) == []

        # Cancelling the reading task stops its watch as well.
        events = await client.watch(session_id, timeout=WATCH_LIMIT)

        async def one() -> SessionEvent:
            return await anext(events)

        reader = asyncio.create_task(one())
        await asyncio.sleep(0.1)
        reader.cancel()
        with pytest.raises(asyncio.CancelledError):
            await reader
        assert events.active is False


async def test_async_watch_ends_with_unavailable_when_the_server_stops(
    start_server, session_id: str
) -> None:
    server = start_server()
    async with AsyncClient(server.address) as client:
        await client.append(session_id, [("user", "Before the shutdown.")])
        events = await client.watch(session_id, timeout=WATCH_LIMIT)
        await asyncio.to_thread(server.stop)
        with pytest.raises(Unavailable) as caught:
            await asyncio.wait_for(anext(events), STEP)
    assert caught.value.reason == "SHUTTING_DOWN"


def test_event_kinds_from_the_wire() -> None:
    gap = SessionEvent.from_pb(pb.SessionEvent(kind=pb.SESSION_EVENT_KIND_GAP, missed=17))
    assert (gap.kind, gap.segment, gap.at, gap.missed) == ("gap", None, None, 17)
    names = [
        SessionEvent.from_pb(pb.SessionEvent(kind=value)).kind
        for value in (1, 2, 3, 4, 5, 6)
    ]
    assert names == ["closed", "summarised", "failed", "parked", "deleted", "gap"]
    newer = pb.SessionEvent(kind=99)  # type: ignore[arg-type]
    assert SessionEvent.from_pb(newer).kind == "unknown(99)"
    # A server older than the memory tree sends no level: level 1.
    assert Segment.from_pb(pb.Segment(id=1)).level == 1
