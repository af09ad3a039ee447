"""Subjects: whose memory a session is, fixed by the append that creates
it, listed by, and erased whole in one call; on Client and AsyncClient."""

from __future__ import annotations

import pytest

from archivist_client import (
    AsyncClient,
    Client,
    DeleteSubjectResult,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
)

ADA = "user:ada@example.com"


def test_a_subject_is_fixed_listed_and_forgotten_whole(server) -> None:
    with Client(server.address) as client:
        client.append("ada-1", [("user", "Ada's locker code is 4711.")], subject=ADA)
        client.append("ada-2", [("user", "Ada prefers tea."), ("assistant", "Noted.")], subject=ADA)
        client.append("bob-1", [("user", "Bob's code is 1234.")], subject="bob")
        client.append("nobody-1", [("user", "No subject here.")])

        with pytest.raises(FailedPrecondition) as caught:
            client.append("ada-1", [("user", "not stored")], subject="bob")
        assert caught.value.reason == "SUBJECT_MISMATCH"
        assert caught.value.metadata["subject"] == ADA
        # None later is fine, and the refused call stored nothing.
        assert [e.seq for e in client.append("ada-1", [("user", "second")]).entries] == [2]
        with pytest.raises(InvalidArgument) as bad:
            client.append("x", [("user", "y")], subject="ada lovelace")
        assert [v.field for v in bad.value.violations] == ["subject"]

        ada = list(client.sessions(subject=ADA, page_size=1))
        assert [(s.session_id, s.subject, s.entry_count) for s in ada] == [
            ("ada-1", ADA, 2),
            ("ada-2", ADA, 2),
        ]
        every = {s.session_id: s.subject for s in client.sessions()}
        assert every["nobody-1"] is None and every["bob-1"] == "bob"

        erased = client.delete_subject(ADA)
        assert isinstance(erased, DeleteSubjectResult)
        assert (erased.sessions_deleted, erased.entries_deleted, erased.segments_deleted) == (2, 4, 2)
        with pytest.raises(NotFound):
            list(client.entries("ada-1"))
        assert list(client.sessions(subject=ADA)) == []
        assert [e.content for e in client.entries("bob-1")] == ["Bob's code is 1234."]
        assert client.delete_subject(ADA).sessions_deleted == 0


async def test_async_subjects_list_and_erase(server) -> None:
    async with AsyncClient(server.address) as client:
        await client.append("async-carol-1", [("user", "Carol's note.")], subject="carol")
        await client.append("async-carol-2", [("user", "Another.")], subject="carol")
        with pytest.raises(FailedPrecondition):
            await client.append("async-carol-1", [("user", "no")], subject="dave")
        listed = [s.session_id async for s in client.sessions(subject="carol")]
        assert listed == ["async-carol-1", "async-carol-2"]
        erased = await client.delete_subject("carol")
        assert (erased.sessions_deleted, erased.entries_deleted) == (2, 2)
        assert [s async for s in client.sessions(subject="carol")] == []
