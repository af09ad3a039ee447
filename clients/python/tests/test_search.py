"""search() on Client and AsyncClient against the real server: a planted
fact found by a question worded as the fact, every scope narrowing what is
found, erased text and another tenant's never found, and bad arguments
refused before anything is sent (or by the server, typed)."""

from __future__ import annotations

import hashlib
import time
import uuid
from datetime import datetime, timedelta, timezone

import pytest

from archivist_client import (
    AsyncClient,
    Client,
    FailedPrecondition,
    InvalidArgument,
    SearchHit,
    SearchResult,
)

FACT = "Ada's locker code is 4711, in the basement by the boiler."


def subject() -> str:
    """A subject of this test's own: the module's server is shared."""
    return f"user:{uuid.uuid4().hex[:12]}@example.com"


def test_a_question_worded_as_the_fact_finds_it_first(server, session_id: str) -> None:
    who = subject()
    with Client(server.address) as client:
        client.append(
            session_id,
            [
                ("user", "Hello, I have a question about the gym."),
                ("user", FACT),
                ("assistant", "Noted, I will remember where the locker is."),
            ],
            subject=who,
        )
        before = datetime.now(timezone.utc)
        found = client.search("What is Ada's locker code?", subject=who)
    assert isinstance(found, SearchResult)
    assert found.legs == ["lexical"] and found.embedded_share == 0.0
    hit = found.hits[0]
    assert isinstance(hit, SearchHit)
    assert hit.text == FACT
    assert (hit.session_id, hit.level, hit.first_seq, hit.last_seq) == (session_id, 0, 2, 2)
    assert (hit.kind, hit.role, hit.segment_id, hit.legs) == ("entry", "user", None, ["lexical"])
    assert hit.created_at is not None and hit.created_at.tzinfo is not None
    assert timedelta(0) <= before - hit.created_at < timedelta(minutes=5)
    assert hit.score == pytest.approx(1 / 61)
    assert all(h.score <= hit.score for h in found.hits)
    assert hit.raw.text == FACT


def test_every_scope_narrows_what_is_found(server) -> None:
    ada, bob = subject(), subject()
    word = f"zq{uuid.uuid4().hex[:10]}"
    with Client(server.address) as client:
        client.append(f"{word}-ada", [("user", f"{word} is Ada's word"), ("assistant", f"{word} noted")], subject=ada)
        client.append(f"{word}-bob", [("user", f"{word} is Bob's word too")], subject=bob)

        def sessions(**scope: object) -> list[str]:
            return sorted({h.session_id for h in client.search(word, **scope).hits})  # type: ignore[arg-type]

        assert sessions() == [f"{word}-ada", f"{word}-bob"]
        # A subject's scope leaves out another subject's session.
        assert sessions(subject=ada) == [f"{word}-ada"]
        assert sessions(subject=bob) == [f"{word}-bob"]
        assert sessions(session_ids=f"{word}-bob") == [f"{word}-bob"]
        assert sessions(session_ids=[f"{word}-ada", "no-such-session"]) == [f"{word}-ada"]
        assert sessions(session_ids=[f"{word}-ada"], subject=bob) == []
        assert sessions(roles="assistant") == [f"{word}-ada"]
        assert [h.role for h in client.search(word, roles=["assistant"]).hits] == ["assistant"]
        assert sessions(levels=[1]) == []
        now = datetime.now(timezone.utc)
        assert sessions(after=now + timedelta(hours=1)) == []
        assert sessions(before=now - timedelta(hours=1)) == []
        assert sessions(after=now - timedelta(hours=1), before=now + timedelta(hours=1)) == [
            f"{word}-ada",
            f"{word}-bob",
        ]
        assert len(client.search(word, limit=1).hits) == 1

        # A recap is found at its level, pointing at the entries it stands for.
        closed = client.close(f"{word}-ada", wait=True)
        assert closed is not None and closed.state == "summarised"
        (recap,) = client.search(word, levels=1).hits
        assert (recap.kind, recap.level, recap.role) == ("summary", 1, None)
        assert (recap.session_id, recap.first_seq, recap.last_seq) == (f"{word}-ada", 1, 2)
        assert recap.segment_id == closed.id
        assert word in recap.text


def test_erased_text_is_not_found(server) -> None:
    word = f"zq{uuid.uuid4().hex[:10]}"
    who = subject()
    with Client(server.address) as client:
        client.append(f"{word}-1", [("user", f"the secret is {word}")], subject=who)
        client.append(f"{word}-2", [("user", f"{word} again")], subject=who)
        client.append(f"{word}-3", [("user", f"{word} kept")])
        assert len(client.search(word).hits) == 3
        client.delete_session(f"{word}-1")
        assert sorted(h.session_id for h in client.search(word).hits) == [f"{word}-2", f"{word}-3"]
        client.delete_subject(who)
        assert [h.session_id for h in client.search(word).hits] == [f"{word}-3"]


TOKEN_A = "py-search-tenant-a-7d1"
TOKEN_B = "py-search-tenant-b-0c4"


def test_another_tenant_finds_nothing_of_ours(start_server) -> None:
    tenants = "".join(
        f'[[auth.tenants]]\nname = "{name}"\ntoken_sha256 = "{hashlib.sha256(token.encode()).hexdigest()}"\n'
        for name, token in [("a", TOKEN_A), ("b", TOKEN_B)]
    )
    srv = start_server(tenants)
    with Client(srv.address, token=TOKEN_A) as a, Client(srv.address, token=TOKEN_B) as b:
        a.append("ours", [("user", FACT)], subject="user:ada")
        b.append("theirs", [("user", "Their locker code is 1234.")], subject="user:ada")
        assert [h.text for h in a.search("locker code").hits] == [FACT]
        assert [h.text for h in b.search("locker code").hits] == ["Their locker code is 1234."]
        # Naming our session or our subject finds nothing, and says nothing.
        assert b.search("locker code 4711", session_ids=["ours"]).hits == []
        assert [h.session_id for h in b.search("4711 or 1234", subject="user:ada").hits] == ["theirs"]


def test_bad_arguments_are_refused_before_sending_or_typed_by_the_server(server) -> None:
    with Client(server.address) as client:
        for query, reason in [("", "EMPTY_QUERY"), ("   ", "EMPTY_QUERY"), ("x" * 4097, "QUERY_TOO_LONG")]:
            with pytest.raises(InvalidArgument) as caught:
                client.search(query)
            assert caught.value.reason == reason
            assert [v.field for v in caught.value.violations] == ["query"]
        # The rest of the query's rules are the server's, with its reasons.
        for query in ["***", "-only -excluded", "() : ^"]:
            with pytest.raises(InvalidArgument) as caught:
                client.search(query)
            assert caught.value.reason == "EMPTY_QUERY", query
            assert [v.field for v in caught.value.violations] == ["query"]
        with pytest.raises(InvalidArgument) as caught:
            client.search("near", limit=0)
        assert [v.field for v in caught.value.violations] == ["limit"]
        for limit in [101, -1, 2**40]:
            with pytest.raises(InvalidArgument):
                client.search("near", limit=limit)
        with pytest.raises(InvalidArgument) as caught:
            client.search("near", roles=["boss"])
        assert caught.value.reason == "INVALID_ROLE"
        assert [v.field for v in caught.value.violations] == ["roles[0]"]
        with pytest.raises(InvalidArgument) as caught:
            client.search("near", mode="fuzzy")
        assert caught.value.reason == "INVALID_MODE"
        with pytest.raises(InvalidArgument):
            client.search("near", levels=[-1])
        with pytest.raises(InvalidArgument) as caught:
            client.search("near", levels=[65])
        assert caught.value.reason == "INVALID_LEVEL"
        with pytest.raises(InvalidArgument) as caught:
            client.search("near", after=datetime(2026, 1, 1))
        assert caught.value.reason == "INVALID_TIMESTAMP"
        with pytest.raises(InvalidArgument) as caught:
            client.search("near", subject="s" * 10_000)
        assert [v.field for v in caught.value.violations] == ["subject"]
        with pytest.raises(InvalidArgument) as caught:
            client.search("near", session_ids=["bad id!"])
        assert [v.field for v in caught.value.violations] == ["session_ids[0]"]
        with pytest.raises(InvalidArgument):
            client.search("near \ud800")
        for bad in [
            {"query": 42},
            {"query": b"near"},
            {"query": "near", "limit": "5"},
            {"query": "near", "limit": True},
            {"query": "near", "after": "2026-01-01T00:00:00Z"},
            {"query": "near", "session_ids": [1]},
            {"query": "near", "subject": 7},
            {"query": "near", "levels": ["1"]},
        ]:
            with pytest.raises(TypeError):
                client.search(**bad)  # type: ignore[arg-type]
        with pytest.raises(FailedPrecondition) as caught:
            client.search("near", mode="semantic")
        assert caught.value.reason == "EMBEDDINGS_OFF"


def test_hostile_queries_are_words(server, session_id: str) -> None:
    word = f"zq{uuid.uuid4().hex[:10]}"
    with Client(server.address) as client:
        client.append(session_id, [("user", f"near the {word} col star")])
        for query in [
            f"NEAR({word}",
            f'"{word} col',
            f"{word} col: star*",
            f"{word}\x00col",
            f"{word}'; DROP TABLE entries; --",
            f'{word}" OR 1=1 --',
            f"{word} AND OR NOT",
            ("near " * 800) + word,
        ]:
            hits = client.search(query, session_ids=[session_id]).hits
            assert [h.text for h in hits] == [f"near the {word} col star"], query[:40]
        assert client.search(f"{word} -star", session_ids=[session_id]).hits == []


async def test_async_search_finds_scopes_and_refuses_as_the_blocking_one(server) -> None:
    word = f"zq{uuid.uuid4().hex[:10]}"
    who = subject()
    async with AsyncClient(server.address) as client:
        await client.append(f"{word}-a", [("user", f"{word}: the boiler is in the basement")], subject=who)
        await client.append(f"{word}-b", [("user", f"{word} elsewhere")])
        found = await client.search(f"where is the boiler {word}", subject=who)
        assert [(h.session_id, h.text) for h in found.hits] == [
            (f"{word}-a", f"{word}: the boiler is in the basement")
        ]
        assert found.legs == ["lexical"]
        assert len((await client.search(word)).hits) == 2
        with pytest.raises(InvalidArgument):
            await client.search("")
        with pytest.raises(InvalidArgument) as caught:
            await client.search("***")
        assert caught.value.reason == "EMPTY_QUERY"
        await client.delete_session(f"{word}-a")
        assert [h.session_id for h in (await client.search(word)).hits] == [f"{word}-b"]


def test_speakers_times_and_metadata_come_back_and_metadata_filters(server) -> None:
    who = subject()
    word = f"zq{uuid.uuid4().hex[:10]}"
    monday = datetime(2023, 11, 13, 9, 12, tzinfo=timezone.utc)
    thursday = datetime(2023, 11, 16, 18, 40, tzinfo=timezone.utc)
    with Client(server.address) as client:
        client.append(
            f"{word}-chat",
            [
                {
                    "role": "user",
                    "content": f"The spare key {word} is under the flowerpot.",
                    "name": "Maya",
                    "occurred_at": monday,
                    "metadata": {"channel": "sms"},
                },
                {
                    "role": "user",
                    "content": f"I moved the spare key {word} to Mrs Lindqvist.",
                    "name": "Tom",
                    "occurred_at": thursday,
                    "metadata": {"channel": "email", "thread": "keys"},
                },
            ],
            subject=who,
        )
        # Monday's segment closed at the three days' gap: its recap (no
        # name, no metadata) is found too; the entries are what is asked.
        hits = client.search(f"spare key {word}", subject=who, levels=0).hits
        by_name = {h.name: h for h in hits}
        assert set(by_name) == {"Maya", "Tom"}
        assert by_name["Maya"].occurred_at == monday and by_name["Tom"].occurred_at == thursday
        assert by_name["Tom"].metadata == {"channel": "email", "thread": "keys"}
        # What is true now first: Thursday's move above Monday's place.
        assert hits[0].name == "Tom"
        # Every pair must match.
        found = client.search(f"spare key {word}", subject=who, metadata={"channel": "sms"}).hits
        assert [h.text for h in found] == [f"The spare key {word} is under the flowerpot."]
        assert client.search(word, subject=who, metadata={"channel": "sms", "thread": "keys"}).hits == []
        found = client.search(word, subject=who, metadata={"thread": "keys"}).hits
        assert [h.name for h in found] == ["Tom"]
        # The window reads when it was said, not when it was stored.
        tuesday = datetime(2023, 11, 14, tzinfo=timezone.utc)
        found = client.search(word, subject=who, before=tuesday, levels=0).hits
        assert [h.name for h in found] == ["Maya"]
        # Monday's segment closed at the gap; its recap is written by the
        # server's own pass, so wait for it (bounded).
        deadline = time.monotonic() + 30
        while not (found := client.search(word, subject=who, before=tuesday, levels=1).hits):
            assert time.monotonic() < deadline, "Monday's recap was never written"
            time.sleep(0.05)
        [recap] = found
        # Monday's recap says who and when, and is dated by its last entry.
        assert recap.occurred_at == monday and recap.metadata == {}
        assert f"Maya (13 Nov 2023): The spare key {word} is under the flowerpot." in recap.text
        with pytest.raises(TypeError, match="metadata"):
            client.search(word, metadata={"channel": 1})  # type: ignore[dict-item]
        with pytest.raises(InvalidArgument) as caught:
            client.search(word, metadata={"bad key!": "x"})
        assert any("metadata" in v.field for v in caught.value.violations)
