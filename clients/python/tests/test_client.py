"""The blocking Client against the real server (built-in extractive
summariser)."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import grpc
import pytest

from archivist_client import (
    ArchivistError,
    Client,
    ContextSummary,
    Entry,
    InvalidArgument,
    NotFound,
    Unavailable,
)
from support import eventually


@pytest.fixture
def client(server) -> Iterator[Client]:
    with Client(server.address) as c:
        yield c


def test_append_close_with_wait_and_context_round_trip(client: Client, session_id: str) -> None:
    appended = client.append(
        session_id,
        [
            ("user", ("The billing deploy failed last night; the migration timed out. The runbooks for "
             "the old cluster still say otherwise, and the dashboards were never updated.")),
            {"role": "assistant", "content": "I will rerun it with a longer timeout.",
             "client_entry_id": "reply-1"},
        ],
    )
    assert [e.seq for e in appended.entries] == [1, 2]
    assert [e.duplicate for e in appended.entries] == [False, False]
    assert appended.open_segment_id is not None

    # The same idempotency key again: not stored twice, original seq back.
    again = client.append(
        session_id,
        [{"role": "assistant", "content": "I will rerun it with a longer timeout.",
          "client_entry_id": "reply-1"}],
    )
    assert [(e.seq, e.client_entry_id, e.duplicate) for e in again.entries] == [
        (2, "reply-1", True)
    ]

    before = client.context(session_id)
    assert [(i.kind, i.role, i.content) for i in before.items] == [
        ("entry", "user", ("The billing deploy failed last night; the migration timed out. The runbooks for "
             "the old cluster still say otherwise, and the dashboards were never updated.")),
        ("entry", "assistant", "I will rerun it with a longer timeout."),
    ]
    assert before.entries[1].client_entry_id == "reply-1"
    assert before.truncated is False

    closed = client.close(session_id, wait=True)
    assert closed is not None
    assert closed.state == "summarised"
    assert (closed.first_seq, closed.last_seq, closed.entry_count) == (1, 2, 2)
    assert closed.summary is not None and closed.summary.provider == "extractive"
    assert "billing" in closed.summary.text
    assert closed.last_failure is None
    assert closed.closed_at is not None

    client.append(session_id, [("user", "Did it work this time?")])
    # Room for the recap and the newest turn, not for the entries the recap
    # stands for (estimated tokens: bytes / 4, rounded up, plus 4).
    recap_tokens = -(-len(closed.summary.text.encode()) // 4) + 4
    after = client.context(session_id, max_tokens=recap_tokens + 14)
    assert [type(i) for i in after.items] == [ContextSummary, Entry]
    summary, entry = after.items
    assert isinstance(summary, ContextSummary) and isinstance(entry, Entry)
    assert (summary.segment_id, summary.first_seq, summary.last_seq) == (closed.id, 1, 2)
    assert summary.text == closed.summary.text
    assert (entry.seq, entry.role, entry.text) == (3, "user", "Did it work this time?")
    assert entry.created_at is not None

    assert client.segment(closed.id).state == "summarised"

    # Nothing open: close is a no-op and says so.
    client.close(session_id)
    assert client.close(session_id) is None


def test_segments_iterate_every_page_and_filter_by_state(client: Client, session_id: str) -> None:
    for i in range(3):
        client.append(session_id, [("user", f"message {i}")])
        client.close(session_id, wait=True)
    client.append(session_id, [("user", "still open")])

    every = list(client.segments(session_id, page_size=1))
    assert [s.ordinal for s in every] == [1, 2, 3, 4]
    assert [s.state for s in every] == ["summarised"] * 3 + ["open"]
    assert all(s.session_id == session_id for s in every)

    assert [s.ordinal for s in client.segments(session_id, states=["open"])] == [4]

    flushed = client.flush(session_id)
    assert flushed.complete is True
    assert [s.state for s in flushed.segments] == ["summarised"] * 4

    # FlushSession waits for level 1 only: the roll-up of the four follows
    # in the background, and until it is written it is PENDING, which a
    # requeue would count.
    assert eventually(
        lambda: [s.state for s in client.segments(session_id, levels=[2])] == ["summarised"]
    )
    assert client.requeue(session_id) == 0
    backlog = client.backlog()
    assert backlog.summarised >= 4
    assert backlog.pending == 0


def test_context_within_a_token_budget_drops_the_oldest(client: Client, session_id: str) -> None:
    client.append(session_id, [("user", f"entry number {i} " + "word " * 40) for i in range(10)])
    whole = client.context(session_id)
    assert len(whole.items) == 10 and whole.truncated is False

    small = client.context(session_id, max_tokens=whole.estimated_tokens // 3)
    assert small.truncated is True
    assert 0 < len(small.items) < 10
    # The newest survive.
    assert small.items[-1].seq == 10


def test_a_bad_session_id_is_invalid_argument_naming_the_field(client: Client) -> None:
    with pytest.raises(InvalidArgument) as caught:
        client.append("bad id!", [("user", "hello")])
    err = caught.value
    assert err.code is grpc.StatusCode.INVALID_ARGUMENT
    assert err.reason == "INVALID_SESSION_ID"
    assert err.domain == "archivist"
    assert "session_id" in [v.field for v in err.violations]
    assert isinstance(err, ArchivistError)


def test_every_bad_field_is_named(client: Client, session_id: str) -> None:
    with pytest.raises(InvalidArgument) as caught:
        client.append(session_id, [("user", "fine"), ("user", ""), {"role": "tool",
                      "content": "x", "client_entry_id": "k" * 200}])
    fields = [v.field for v in caught.value.violations]
    assert "entries[1].content" in fields
    assert "entries[2].client_entry_id" in fields


def test_bad_messages_are_refused_before_any_call(client: Client, session_id: str) -> None:
    # An ArchivistError like every other failure, raised before sending.
    with pytest.raises(ArchivistError, match="role must be one of") as caught:
        client.append(session_id, [("user", "fine"), ("robot", "beep")])
    assert isinstance(caught.value, InvalidArgument)
    assert caught.value.code is grpc.StatusCode.INVALID_ARGUMENT
    assert caught.value.reason == "INVALID_ROLE"
    assert [v.field for v in caught.value.violations] == ["entries[1].role"]
    for bad in (-1, 2**32, "10"):
        with pytest.raises(InvalidArgument) as caught:
            client.context(session_id, max_tokens=bad)  # type: ignore[arg-type]
        assert [v.field for v in caught.value.violations] == ["max_tokens"]
    with pytest.raises(InvalidArgument):
        list(client.segments(session_id, states=["finished"]))
    with pytest.raises(InvalidArgument):
        list(client.sessions(page_size=-1))
    with pytest.raises(TypeError):
        client.append(session_id, [("user", "a", "b")])  # type: ignore[list-item]
    with pytest.raises(NotFound):
        client.context(session_id)  # nothing was stored


def test_unknown_session_and_segment_are_not_found(client: Client, session_id: str) -> None:
    with pytest.raises(NotFound) as caught:
        client.context(session_id)
    assert caught.value.reason == "SESSION_NOT_FOUND"
    assert caught.value.metadata == {"session_id": session_id}

    with pytest.raises(NotFound) as caught:
        client.segment(987654321)
    assert caught.value.reason == "SEGMENT_NOT_FOUND"
    assert caught.value.metadata["segment_id"] == "987654321"


def test_an_unreachable_server_is_unavailable() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    # Nothing listens on `port` now.
    with Client(f"http://127.0.0.1:{port}", timeout=5) as client:
        with pytest.raises(Unavailable) as caught:
            client.backlog()
    assert caught.value.reason == ""
    assert caught.value.failure is None


def test_the_backlog_counts_entries_not_yet_in_the_search_index(start_server, session_id: str) -> None:  # type: ignore[no-untyped-def]
    # A tail that only a search indexes during the test.
    server = start_server('[search]\ntail_texts = 1000000\ntail_wait = "1h"\n')
    with Client(server.address) as client:
        client.append(session_id, [("user", f"tailword{i} of the ledger") for i in range(3)])
        waiting = client.backlog()
        assert waiting.unindexed == 3
        assert waiting.oldest_unindexed_age is not None
        hits = client.search("tailword1")
        assert [h.text for h in hits.hits] == ["tailword1 of the ledger"]
        indexed = client.backlog()
        assert (indexed.unindexed, indexed.oldest_unindexed_age) == (0, None)
