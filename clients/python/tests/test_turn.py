"""The turn's context: `context(query=...)` brings what an older session of
the subject said before the session's own memory, best first, and nothing
without a query; on Client and AsyncClient."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from archivist_client import AsyncClient, Client, InvalidArgument, RecalledHit

FACT = "My gym locker code is 4711, the one by the boiler."
QUESTION = "What is my gym locker code again?"


def test_a_fact_told_on_monday_reaches_fridays_context_with_the_question(server) -> None:
    ada = f"ada-{uuid.uuid4().hex[:8]}"
    with Client(server.address) as client:
        client.append(f"{ada}-mon", [("user", FACT), ("assistant", "Noted.")], subject=ada)
        client.append(f"{ada}-bob", [("user", "Bob's gym locker code is 9999.")], subject="bob")
        client.append(f"{ada}-fri", [("user", "Good morning!"), ("user", QUESTION)], subject=ada)

        plain = client.context(f"{ada}-fri", max_tokens=400)
        assert plain.recalled == []
        assert all("4711" not in getattr(i, "content", "") for i in plain.items)

        turn = client.context(f"{ada}-fri", max_tokens=400, query=QUESTION)
        first = turn.items[0]
        assert isinstance(first, RecalledHit) and first.kind == "recalled"
        assert (first.session_id, first.text, first.level) == (f"{ada}-mon", FACT, 0)
        assert (first.first_seq, first.role, first.segment_id) == (1, "user", None)
        assert first.score > 0 and first.occurred_at is not None
        assert all(r.session_id == f"{ada}-mon" for r in turn.recalled)
        # The cover after it is the one without a query; the budget holds.
        assert turn.items[len(turn.recalled):] == plain.items
        assert turn.estimated_tokens <= 400

        # A query nothing answers adds nothing.
        assert client.context(f"{ada}-fri", max_tokens=400, query="zeppelin quartermaster").raw == plain.raw

        # A message with no word to look for is no query: the cover alone.
        assert client.context(f"{ada}-fri", max_tokens=400, query="👍").raw == plain.raw
        with pytest.raises(InvalidArgument) as bad:
            client.context(f"{ada}-fri", query="word " * 1000)
        assert bad.value.reason == "QUERY_TOO_LONG"
        assert [v.field for v in bad.value.violations] == ["query"]
        with pytest.raises(TypeError, match="query must be a str"):
            client.context(f"{ada}-fri", query=123)  # type: ignore[arg-type]


def test_the_async_client_recalls_too(server) -> None:
    ada = f"ada-{uuid.uuid4().hex[:8]}"

    async def run() -> None:
        async with AsyncClient(server.address) as client:
            await client.append(f"{ada}-mon", [("user", FACT)], subject=ada)
            await client.append(f"{ada}-fri", [("user", QUESTION)], subject=ada)
            turn = await client.context(f"{ada}-fri", max_tokens=400, query=QUESTION)
            assert [(r.session_id, r.text) for r in turn.recalled] == [(f"{ada}-mon", FACT)]

    asyncio.run(run())
