"""Sessions: listing them page by page (each tenant its own), erasing one,
and the memory tree's levels as the client shows them."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from datetime import datetime, timezone

import pytest

from archivist_client import (
    AsyncClient,
    Client,
    ContextSummary,
    DeleteResult,
    Entry,
    InvalidArgument,
    NotFound,
    SessionInfo,
)
from support import eventually

TOKEN_A = "py-tenant-a-token-3b7e"
TOKEN_B = "py-tenant-b-token-c41d"


def two_tenants() -> str:
    config = ""
    for name, token in (("a", TOKEN_A), ("b", TOKEN_B)):
        digest = hashlib.sha256(token.encode()).hexdigest()
        config += f'[[auth.tenants]]\nname = "{name}"\ntoken_sha256 = "{digest}"\n\n'
    return config


@pytest.fixture
def client(server) -> Iterator[Client]:
    with Client(server.address) as c:
        yield c


def test_sessions_pages_through_every_session_of_the_callers_tenant_only(start_server) -> None:
    server = start_server(two_tenants())
    names = [f"a-session-{i:02d}" for i in range(7)]
    with Client(server.address, token=TOKEN_A) as a, Client(server.address, token=TOKEN_B) as b:
        for i, name in enumerate(reversed(names)):
            a.append(name, [("user", f"message {j} of {name}") for j in range(i + 1)])
        a.close(names[0], wait=True)
        b.append("b-only", [("user", "tenant b's own session")])
        b.append(names[3], [("user", "the same name, another tenant")])

        # Seven sessions in pages of three: three calls, every one listed
        # once, in session_id order.
        pages = []
        list_sessions = a._stub.ListSessions

        def counted(request, **kwargs):  # type: ignore[no-untyped-def]
            pages.append(request.page_token)
            return list_sessions(request, **kwargs)

        a._stub.ListSessions = counted  # type: ignore[method-assign]
        listed = list(a.sessions(page_size=3))
        a._stub.ListSessions = list_sessions  # type: ignore[method-assign]
        assert len(pages) == 3 and pages[0] == ""
        assert [s.session_id for s in listed] == names
        assert all(isinstance(s, SessionInfo) for s in listed)

        first, last = listed[0], listed[-1]
        # names[0] got 7 entries (appended last) and its segment was closed.
        assert (first.entry_count, first.last_seq, first.open_segment_id) == (7, 7, None)
        assert (first.pending, first.parked) == (0, 0)
        assert (last.entry_count, last.last_seq) == (1, 1)
        assert last.open_segment_id is not None
        for info in listed:
            assert isinstance(info.created_at, datetime)
            assert info.created_at.tzinfo is timezone.utc
            assert info.last_append_at is not None and info.last_append_at >= info.created_at

        # The default page size, and a page larger than what there is.
        assert [s.session_id for s in a.sessions()] == names
        assert [s.session_id for s in a.sessions(page_size=1000)] == names

        # Tenant b sees its own two sessions, never a's.
        mine = list(b.sessions(page_size=1))
        assert [s.session_id for s in mine] == ["a-session-03", "b-only"]
        assert mine[0].entry_count == 1  # its own a-session-03, not a's 4 entries

        # Erasing is per tenant too: b erasing its a-session-03 leaves a's.
        assert b.delete_session(names[3]).entries_deleted == 1
        with pytest.raises(NotFound):
            b.delete_session(names[4])
        assert [s.session_id for s in b.sessions()] == ["b-only"]
        assert [s.session_id for s in a.sessions(page_size=2)] == names
        assert a.context(names[3]).entries[-1].content == f"message 3 of {names[3]}"


async def test_async_sessions_page_through_every_session(start_server) -> None:
    server = start_server()
    names = [f"async-{i}" for i in range(5)]
    async with AsyncClient(server.address) as client:
        for name in names:
            await client.append(name, [("user", f"hello from {name}")])
        listed = [s async for s in client.sessions(page_size=2)]
        assert [s.session_id for s in listed] == names
        assert all(s.entry_count == 1 and s.open_segment_id is not None for s in listed)

        erased = await client.delete_session(names[0])
        assert (erased.entries_deleted, erased.segments_deleted) == (1, 1)
        assert [s.session_id async for s in client.sessions(page_size=2)] == names[1:]
        with pytest.raises(NotFound):
            await client.delete_session(names[0])


def test_delete_session_erases_it_and_the_next_append_starts_at_seq_1(
    client: Client, session_id: str
) -> None:
    client.append(session_id, [("user", "The staging password is hunter2."),
                               ("assistant", "Stored."), ("user", "And the VPN one?")])
    client.close(session_id, wait=True)
    client.append(session_id, [("user", "Still open.")])
    assert session_id in [s.session_id for s in client.sessions()]

    erased = client.delete_session(session_id)
    assert isinstance(erased, DeleteResult)
    assert (erased.entries_deleted, erased.segments_deleted) == (4, 2)

    with pytest.raises(NotFound) as caught:
        client.context(session_id)
    assert caught.value.reason == "SESSION_NOT_FOUND"
    assert list(client.segments(session_id)) == []
    assert session_id not in [s.session_id for s in client.sessions()]
    with pytest.raises(NotFound) as again:
        client.delete_session(session_id)
    assert again.value.reason == "SESSION_NOT_FOUND"
    with pytest.raises(InvalidArgument):
        client.delete_session("bad id!")

    # The same name again is a new session.
    appended = client.append(session_id, [("user", "A fresh start.")])
    assert [e.seq for e in appended.entries] == [1]
    context = client.context(session_id)
    assert [(i.kind, i.text) for i in context.items] == [("entry", "A fresh start.")]
    assert [s.ordinal for s in client.segments(session_id)] == [1]


def test_segments_by_level_and_a_context_zoomed_out_to_a_roll_up(
    client: Client, session_id: str
) -> None:
    # The default fanout is 4: four summarised segments make a roll-up.
    for i in range(4):
        client.append(session_id, [
            ("user", f"Service {i} needs its certificate renewed before Friday, says ops."),
            ("assistant", f"Noted for service {i}; I will renew it and confirm."),
        ])
        client.close(session_id, wait=True)
    client.append(session_id, [("user", "What is left to do?")])

    level_1 = list(client.segments(session_id))
    assert [(s.level, s.child_ids) for s in level_1] == [(1, [])] * 5
    assert list(client.segments(session_id, levels=[1])) == level_1

    # The roll-up is summarised in the background.
    assert eventually(
        lambda: [s.state for s in client.segments(session_id, levels=2)] == ["summarised"]
    )
    (roll_up,) = client.segments(session_id, levels=[2])
    assert roll_up.level == 2
    assert roll_up.child_ids == [s.id for s in level_1[:4]]
    assert (roll_up.first_seq, roll_up.last_seq, roll_up.entry_count) == (1, 8, 8)
    assert client.segment(roll_up.id).child_ids == roll_up.child_ids
    both = list(client.segments(session_id, levels=[1, 2], page_size=2))
    assert sorted((s.level, s.id) for s in both) == sorted(
        [(1, s.id) for s in level_1] + [(2, roll_up.id)]
    )

    # Everything fits: every entry raw, though four segments are summarised.
    whole = client.context(session_id)
    assert [(i.kind, i.seq) for i in whole.items] == [("entry", seq) for seq in range(1, 10)]
    # Room for the roll-up and the newest turn, not for the level-1 recaps:
    # the roll-up stands for the four segments, the newest entries raw.
    roll_up_tokens = -(-len(roll_up.summary.text.encode()) // 4) + 4
    zoomed = client.context(session_id, max_tokens=roll_up_tokens + 36)
    assert zoomed.truncated is False
    summary, *entries = zoomed.items
    assert isinstance(summary, ContextSummary)
    assert (summary.level, summary.segment_id, summary.first_seq, summary.last_seq) == (
        2, roll_up.id, 1, 8,
    )
    assert entries and all(isinstance(e, Entry) for e in entries)
    assert entries[-1].seq == 9

    with pytest.raises(InvalidArgument) as caught:
        list(client.segments(session_id, levels=[0]))
    assert "levels[0]" in [v.field for v in caught.value.violations]
    with pytest.raises(TypeError):
        list(client.segments(session_id, levels=["2"]))  # type: ignore[list-item]
