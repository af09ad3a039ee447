"""search() by meaning against the real server and a fake embedder whose
vectors are set by hand: each hit's similarity and its place in each leg,
`min_similarity` dropping what only meaning found below it and keeping
what the words found, on Client, AsyncClient and the LangChain retriever,
and in context()'s recall of another session of the subject; a threshold
that is no cosine refused before anything is sent."""

from __future__ import annotations

import math
from collections.abc import Iterator

import pytest

from archivist_client import AsyncClient, Client, InvalidArgument
from archivist_client.langchain import ArchivistRetriever
from archivist_client.v1 import archivist_pb2 as pb

from support import FakeEmbedder, eventually

AXES = {"profession": 0, "nurse": 0, "weekend": 1, "dog": 2, "quantum": 3}
NURSE = "I work nights as a nurse at the city hospital"
SMALL_TALK = [
    "What is my plan for the weekend?",
    "My dog is called Rex and what a dog he is",
    "Is my coat dry yet? What a day it is",
]
BUS = "The bus leaves at noon"
QUESTION = "What is my profession?"


@pytest.fixture
def embedder() -> Iterator[FakeEmbedder]:
    fake = FakeEmbedder(AXES, dims=5)
    yield fake
    fake.close()


@pytest.fixture
def embedded(start_server, embedder: FakeEmbedder, session_id: str):  # type: ignore[no-untyped-def]
    """A server whose every text of `session_id` has its vector."""
    server = start_server(embedder.config())
    texts = [*SMALL_TALK, NURSE, BUS]
    with Client(server.address) as client:
        client.append(session_id, [("user", t) for t in texts])

        def done() -> bool:
            e = client.backlog().raw.embeddings
            return e.pending == 0 and e.embedded == len(texts)

        assert eventually(done, limit=30.0), client.backlog().raw
    return server


def test_hits_say_their_similarity_and_their_place_in_each_leg(
    embedded, embedder: FakeEmbedder  # type: ignore[no-untyped-def]
) -> None:
    with Client(embedded.address) as client:
        found = client.search(QUESTION)
        lexical = client.search(QUESTION, mode="lexical")
    assert found.legs == ["lexical", "semantic"] and found.embedded_share == 1.0
    first = found.hits[0]
    # Found by meaning only, and near: above the small talk both legs found.
    assert (first.text, first.legs) == (NURSE, ["semantic"])
    assert (first.lexical_rank, first.semantic_rank) == (0, 1)
    assert first.similarity == pytest.approx(embedder.cosine(QUESTION, NURSE), abs=1e-5)
    assert first.similarity > 0.99
    # Each hit's place in the lexical leg (what is true now first may
    # move a hit afterwards, so it need not be its place in the answer).
    by_words = {h.text: h.lexical_rank for h in lexical.hits}
    assert sorted(by_words) == sorted(SMALL_TALK)
    assert sorted(by_words.values()) == [1, 2, 3]
    for hit in lexical.hits:
        assert (hit.similarity, hit.semantic_rank) == (0.0, 0)
    for hit in found.hits[1:]:
        talk = hit.text in SMALL_TALK
        assert hit.lexical_rank == (by_words[hit.text] if talk else 0)
        assert hit.semantic_rank > 0
        assert hit.similarity == pytest.approx(embedder.cosine(QUESTION, hit.text), abs=1e-5)


def test_min_similarity_drops_far_meaning_and_keeps_the_words(embedded) -> None:  # type: ignore[no-untyped-def]
    with Client(embedded.address) as client:
        kept = [h.text for h in client.search(QUESTION, min_similarity=0.5).hits]
        near = [h.text for h in client.search(QUESTION, mode="semantic", min_similarity=0.5).hits]
        nothing = client.search("quantum chromodynamics", min_similarity=0.5)
        everything = client.search("quantum chromodynamics")
    assert kept[0] == NURSE
    assert sorted(kept[1:]) == sorted(SMALL_TALK)  # the bus is far, and no word of it asked
    assert near == [NURSE]
    # "Nothing relevant" is an empty answer, not the nearest texts.
    assert nothing.hits == []
    assert len(everything.hits) == 5


async def test_async_search_takes_min_similarity(embedded) -> None:  # type: ignore[no-untyped-def]
    async with AsyncClient(embedded.address) as client:
        found = await client.search(QUESTION, mode="semantic", min_similarity=0.5)
    assert [(h.text, h.semantic_rank) for h in found.hits] == [(NURSE, 1)]


def test_the_retriever_takes_min_similarity_and_shows_the_legs(embedded) -> None:  # type: ignore[no-untyped-def]
    with Client(embedded.address) as client:
        retriever = ArchivistRetriever(client=client, mode="semantic", min_similarity=0.5)
        docs = retriever.invoke(QUESTION)
    assert [d.page_content for d in docs] == [NURSE]
    meta = docs[0].metadata
    assert (meta["lexical_rank"], meta["semantic_rank"]) == (0, 1)
    assert meta["similarity"] > 0.99


def test_a_threshold_that_is_no_cosine_is_refused_before_sending() -> None:
    # No server: nothing is sent.
    with Client("127.0.0.1:9") as client:
        for bad in [math.nan, 1.5, -1.01, math.inf]:
            with pytest.raises(InvalidArgument) as refused:
                client.search("anything", min_similarity=bad)
            assert refused.value.reason == "INVALID_MIN_SIMILARITY"
            assert [v.field for v in refused.value.violations] == ["min_similarity"]
        with pytest.raises(TypeError):
            client.search("anything", min_similarity="high")  # type: ignore[arg-type]
        with pytest.raises(ValueError):
            ArchivistRetriever(client=client, min_similarity=2.0)


def test_the_client_refuses_a_threshold_exactly_where_the_server_does(server, session_id: str) -> None:  # type: ignore[no-untyped-def]
    """The request carries a float (single precision): 1.00000001 goes as
    1.0, which the server takes, and so must the client (it refused it,
    checking the double it was given); 1.0000001 goes as 1.0000001192 and
    is refused by both. Each threshold is put to the server as it is, past
    the client's check, and the client must say the same."""
    edges = [1.00000001, -1.00000001, 1.0000000596046448, 1, -1, 0, -0.0, 1e-50]
    past = [1.0000001, -1.0000001, 1.00000006, 1e39, -1e39, math.nan, math.inf, -math.inf]
    with Client(server.address) as client:
        client.append(session_id, [("user", "anything at all")])
        for least in [*edges, *past]:
            asks = [
                (
                    client._stub.Search,
                    pb.SearchRequest(query="anything", min_similarity=least),
                    lambda: client.search("anything", min_similarity=least),
                ),
                (
                    client._stub.GetContext,
                    pb.GetContextRequest(session_id=session_id, min_similarity=least),
                    lambda: client.context(session_id, min_similarity=least),
                ),
            ]
            for method, request, ask in asks:
                try:
                    client._call(method, request, None)
                    server_took = True
                except InvalidArgument as refused:
                    assert refused.reason == "INVALID_MIN_SIMILARITY"
                    server_took = False
                assert server_took == (least in edges), least
                try:
                    ask()
                    client_took = True
                except InvalidArgument as refused:
                    assert refused.reason == "INVALID_MIN_SIMILARITY"
                    assert [v.field for v in refused.violations] == ["min_similarity"]
                    client_took = False
                assert client_took == server_took, (least, type(request).__name__)
        # An int past any float is no cosine either, refused as one.
        with pytest.raises(InvalidArgument) as refused:
            client.search("anything", min_similarity=2**1100)
        assert refused.value.reason == "INVALID_MIN_SIMILARITY"


NEAR = "I work nights as a nurse and walk the dog after"


@pytest.fixture
def two_days(start_server, embedder: FakeEmbedder):  # type: ignore[no-untyped-def]
    """Monday's session of a subject holds the texts, with a text near the
    question (but not on it) found by meaning only; Friday's, of the same
    subject, is where the question is asked. Every text has its vector."""
    server = start_server(embedder.config())
    monday = [*SMALL_TALK, NEAR, BUS]
    with Client(server.address) as client:
        client.append("ada-mon", [("user", t) for t in monday], subject="ada")
        client.append("ada-fri", [("user", "Good morning!")], subject="ada")

        def done() -> bool:
            e = client.backlog().raw.embeddings
            return e.pending == 0 and e.embedded == len(monday) + 1

        assert eventually(done, limit=30.0), client.backlog().raw
    return server


def test_context_takes_min_similarity_for_its_recall(two_days, embedder: FakeEmbedder) -> None:  # type: ignore[no-untyped-def]
    assert 0.5 < embedder.cosine(QUESTION, NEAR) < 0.9
    with Client(two_days.address) as client:

        def recalled(query: str, least: float | None) -> list[str]:
            ctx = client.context("ada-fri", max_tokens=2000, query=query, min_similarity=least)
            return [r.text for r in ctx.recalled]

        low = recalled(QUESTION, 0.5)
        high = recalled(QUESTION, 0.9)
        assert low[0] == NEAR and sorted(low[1:]) == sorted(SMALL_TALK)  # not the far bus
        assert sorted(high) == sorted(SMALL_TALK)  # the words' hits stay
        assert len(recalled("quantum chromodynamics", None)) == 5
        assert recalled("quantum chromodynamics", 0.5) == []
        # A threshold that is no cosine never leaves the client.
        for bad in [math.nan, 1.5]:
            with pytest.raises(InvalidArgument) as refused:
                recalled(QUESTION, bad)
            assert refused.value.reason == "INVALID_MIN_SIMILARITY"
            assert [v.field for v in refused.value.violations] == ["min_similarity"]


async def test_async_context_takes_min_similarity(two_days) -> None:  # type: ignore[no-untyped-def]
    async with AsyncClient(two_days.address) as client:
        nearest = await client.context("ada-fri", query="quantum chromodynamics")
        nothing = await client.context("ada-fri", query="quantum chromodynamics", min_similarity=0.5)
    assert len(nearest.recalled) == 5
    assert nothing.recalled == []
