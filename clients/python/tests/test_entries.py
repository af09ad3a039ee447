"""entries(): the session's transcript (ListEntries), page by page, with
Client and AsyncClient, against the real server."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime, timezone

import pytest

from archivist_client import AsyncClient, Client, Entry, InvalidArgument, NotFound

SAID = [
    ("user", "The billing deploy failed; the migration timed out."),
    ("assistant", "I will rerun it with a longer timeout."),
    ("user", "The on-call engineer this week is Priya."),
    ("user", "Did the rerun work?"),
    ("assistant", "Yes: the migration finished in 41 minutes."),
    ("user", "Write that down in ticket OPS-7731."),
    ("tool", "ticket OPS-7731 updated"),
]


@pytest.fixture
def client(server) -> Iterator[Client]:
    with Client(server.address) as c:
        yield c


def store_said(client: Client, session_id: str) -> None:
    """SAID in the session: the first three summarised, the rest raw."""
    first = [dict(role=r, content=c) for r, c in SAID[:3]]
    first[1]["client_entry_id"] = "reply-1"
    client.append(session_id, first)
    closed = client.close(session_id, wait=True)
    assert closed is not None and closed.state == "summarised"
    client.append(session_id, SAID[3:])


def test_entries_read_every_page_in_order_even_once_summarised(
    client: Client, session_id: str
) -> None:
    store_said(client, session_id)
    # Pages of two: four calls for seven entries, read as one sequence.
    entries = list(client.entries(session_id, page_size=2))
    assert [(e.seq, e.role, e.content) for e in entries] == [
        (i + 1, role, content) for i, (role, content) in enumerate(SAID)
    ]
    assert all(isinstance(e, Entry) and e.kind == "entry" for e in entries)
    assert all(isinstance(e.created_at, datetime) for e in entries)
    assert [e.client_entry_id for e in entries[:3]] == ["", "reply-1", ""]
    # The summarised segment's raw messages are still there to read.
    assert [s.state for s in client.segments(session_id)][0] == "summarised"

    # From the middle, a few at a time; the default page size; past the end.
    part = list(client.entries(session_id, after_seq=2, limit=3, page_size=2))
    assert [e.content for e in part] == [c for _, c in SAID[2:5]]
    assert [e.seq for e in client.entries(session_id, 5)] == [6, 7]
    assert list(client.entries(session_id, after_seq=7)) == []
    assert list(client.entries(session_id, after_seq=2**64 - 1)) == []
    assert list(client.entries(session_id, limit=0)) == []


def test_entries_of_a_missing_or_erased_session_are_not_found(
    client: Client, session_id: str
) -> None:
    with pytest.raises(NotFound) as caught:
        list(client.entries(session_id))
    assert caught.value.reason == "SESSION_NOT_FOUND"
    assert caught.value.metadata == {"session_id": session_id}

    client.append(session_id, [("user", "soon gone")])
    assert [e.content for e in client.entries(session_id)] == ["soon gone"]
    client.delete_session(session_id)
    with pytest.raises(NotFound):
        list(client.entries(session_id))


def test_bad_arguments_are_refused(client: Client) -> None:
    with pytest.raises(InvalidArgument) as caught:
        list(client.entries("bad id!"))
    assert caught.value.reason == "INVALID_SESSION_ID"
    assert [v.field for v in caught.value.violations] == ["session_id"]
    # Refused at once, before any call or iteration.
    for kwargs in ({"after_seq": -1}, {"limit": -1}, {"page_size": -5}, {"limit": "3"}):
        with pytest.raises(ValueError):
            client.entries("s", **kwargs)  # type: ignore[arg-type]


async def test_async_entries_read_every_page(server, session_id: str) -> None:
    with Client(server.address) as sync:
        store_said(sync, session_id)
    async with AsyncClient(server.address) as client:
        entries = [e async for e in client.entries(session_id, page_size=3)]
        assert [(e.seq, e.role, e.content) for e in entries] == [
            (i + 1, role, content) for i, (role, content) in enumerate(SAID)
        ]
        part = [e async for e in client.entries(session_id, 4, 2)]
        assert [e.seq for e in part] == [5, 6]
        assert [e async for e in client.entries(session_id, after_seq=7)] == []
        with pytest.raises(NotFound):
            [e async for e in client.entries(session_id + "-nosuch")]
        with pytest.raises(ValueError):
            client.entries(session_id, limit=-1)


def test_a_history_keeps_when_and_who_said_it(client: Client, session_id: str) -> None:
    monday = datetime(2023, 11, 13, 8, 55, tzinfo=timezone.utc)
    client.append(
        session_id,
        [
            {
                "role": "user",
                "content": "The spare key is under the flowerpot.",
                "name": "Tom",
                "occurred_at": monday,
                "metadata": {"source": "export"},
            },
            # An RFC 3339 string, and a naive datetime read as UTC.
            {"role": "assistant", "content": "Noted.", "name": "Maya",
             "occurred_at": "2023-11-13T08:56:00Z"},
            {"role": "user", "content": "I moved it to Mrs Lindqvist.", "name": "Tom",
             "occurred_at": datetime(2023, 11, 16, 9, 0)},
        ],
    )
    entries = list(client.entries(session_id))
    assert [(e.name, e.occurred_at) for e in entries] == [
        ("Tom", monday),
        ("Maya", datetime(2023, 11, 13, 8, 56, tzinfo=timezone.utc)),
        ("Tom", datetime(2023, 11, 16, 9, 0, tzinfo=timezone.utc)),
    ]
    assert entries[0].metadata == {"source": "export"}
    assert entries[0].created_at is not None and entries[0].created_at > monday
    # Back in time: refused by reason, nothing of the call stored.
    with pytest.raises(InvalidArgument) as refused:
        client.append(
            session_id,
            [{"role": "user", "content": "earlier", "occurred_at": monday}],
        )
    assert refused.value.reason == "OCCURRED_OUT_OF_ORDER"
    assert len(list(client.entries(session_id))) == 3
