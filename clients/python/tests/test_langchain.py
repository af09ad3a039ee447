"""ArchivistChatMessageHistory under a real LangChain chain, with
langchain-core's fake chat model."""

from __future__ import annotations

import uuid
from datetime import datetime, timezone
from typing import Any

import pytest
from langchain_core.chat_history import BaseChatMessageHistory
from langchain_core.documents import Document
from langchain_core.language_models.fake_chat_models import FakeListChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage, ToolMessage
from langchain_core.prompts import ChatPromptTemplate, MessagesPlaceholder
from langchain_core.retrievers import BaseRetriever
from langchain_core.runnables import RunnableLambda
from langchain_core.runnables.history import RunnableWithMessageHistory

from archivist_client import AsyncClient, Client, InvalidArgument, NotFound
from archivist_client.langchain import ArchivistChatMessageHistory, ArchivistRetriever


def chat_chain(client: Client, replies: list[str], seen: list[list[BaseMessage]]):
    """A prompt with the history, a step recording what the model is sent,
    and a fake model; its history lives in archivist through `client`."""
    prompt = ChatPromptTemplate.from_messages(
        [
            ("system", "You are a helpful assistant."),
            MessagesPlaceholder("history"),
            ("human", "{input}"),
        ]
    )

    def record(value: Any) -> Any:
        seen.append(value.to_messages())
        return value

    chain = prompt | RunnableLambda(record) | FakeListChatModel(responses=replies)
    return RunnableWithMessageHistory(
        chain,
        lambda session_id: ArchivistChatMessageHistory(session_id, client),
        input_messages_key="input",
        history_messages_key="history",
    )


def test_a_chain_keeps_its_history_in_archivist_across_clients(server, session_id: str) -> None:
    config = {"configurable": {"session_id": session_id}}

    first_seen: list[list[BaseMessage]] = []
    with Client(server.address) as first:
        chain = chat_chain(first, ["Nice to meet you, Ada."], first_seen)
        reply = chain.invoke({"input": "Hi, my name is Ada."}, config=config)
    assert reply.content == "Nice to meet you, Ada."
    assert [m.type for m in first_seen[0]] == ["system", "human"]

    # A new client object (as after a restart): the history is in archivist.
    second_seen: list[list[BaseMessage]] = []
    with Client(server.address) as second:
        chain = chat_chain(second, ["Your name is Ada."], second_seen)
        reply = chain.invoke({"input": "What is my name?"}, config=config)
        assert reply.content == "Your name is Ada."
        sent = second_seen[0]
        assert [(m.type, m.content) for m in sent] == [
            ("system", "You are a helpful assistant."),
            ("human", "Hi, my name is Ada."),
            ("ai", "Nice to meet you, Ada."),
            ("human", "What is my name?"),
        ]
        stored = second.context(session_id)
        assert [(e.role, e.content) for e in stored.entries] == [
            ("user", "Hi, my name is Ada."),
            ("assistant", "Nice to meet you, Ada."),
            ("user", "What is my name?"),
            ("assistant", "Your name is Ada."),
        ]
        # Every stored message has an idempotency key.
        assert all(e.client_entry_id for e in stored.entries)


def test_adding_the_same_messages_again_stores_them_once(server, session_id: str) -> None:
    with Client(server.address) as client:
        history = ArchivistChatMessageHistory(session_id, client)
        assert history.messages == []
        hello = HumanMessage("hello")
        answer = AIMessage("hi there", id="run-123")
        history.add_messages([hello, answer])
        assert hello.id  # a key was given and kept on the message
        history.add_messages([hello, answer])  # the same objects again
        history.add_message(hello)
        # The same text in a new message is a new message.
        history.add_messages([HumanMessage("hello")])
        # Messages read back from the session are already there.
        history.add_messages(history.messages)

        contents = [e.content for e in client.context(session_id).entries]
        assert contents == ["hello", "hi there", "hello"]
        keys = [e.client_entry_id for e in client.context(session_id).entries]
        assert keys[1] == "run-123"
        assert len(set(keys)) == 3

        # A message id longer than archivist takes is hashed to a stable key.
        long = AIMessage("long id", id="x" * 300)
        history.add_messages([long])
        history.add_messages([AIMessage("long id", id="x" * 300)])
        entries = client.context(session_id).entries
        assert [e.content for e in entries].count("long id") == 1
        assert entries[-1].client_entry_id.startswith("sha256:")


def test_a_message_name_is_kept_and_comes_back(server, session_id: str) -> None:
    with Client(server.address) as client:
        history = ArchivistChatMessageHistory(session_id, client)
        history.add_messages([HumanMessage("I'm in room 12.", name="Tom"), AIMessage("Noted.")])
        stored = list(client.entries(session_id))
        assert [(e.name, e.content) for e in stored] == [("Tom", "I'm in room 12."), ("", "Noted.")]
        back = history.messages
        assert [(m.name, m.content) for m in back] == [("Tom", "I'm in room 12."), (None, "Noted.")]


def test_messages_are_summaries_then_raw_messages(server, session_id: str) -> None:
    with Client(server.address) as client:
        history = ArchivistChatMessageHistory(session_id, client)
        history.add_messages(
            [
                SystemMessage("Answer briefly."),
                HumanMessage("The cluster is called orion."),
                AIMessage("Got it: orion."),
            ]
        )
        client.close(session_id, wait=True)
        history.add_messages(
            [HumanMessage("Restart it."), ToolMessage("restarted", tool_call_id="call-1")]
        )
        # Everything fits the server's cap: every message raw.
        assert [m.content for m in history.messages] == [
            "Answer briefly.", "The cluster is called orion.", "Got it: orion.",
            "Restart it.", "restarted",
        ]
        # Below the raw history: the recap first (as a system message),
        # then the newest messages raw.
        tight = ArchivistChatMessageHistory(session_id, client, max_tokens=40)
        messages = tight.messages
        summary = messages[0]
        assert type(summary).__name__ == "SystemMessage"
        assert "orion" in summary.content
        assert summary.response_metadata["archivist"]["kind"] == "summary"
        assert [type(m).__name__ for m in messages[-2:]] == ["HumanMessage", "ChatMessage"]
        assert messages[-2].content == "Restart it."
        assert (messages[-1].role, messages[-1].content) == ("tool", "restarted")
        assert isinstance(history, BaseChatMessageHistory)


def test_transcript_is_every_message_as_added_while_messages_stay_the_context(
    server, session_id: str
) -> None:
    with Client(server.address) as client:
        history = ArchivistChatMessageHistory(session_id, client)
        assert history.transcript() == []  # no session yet
        history.add_messages(
            [
                SystemMessage("Answer briefly."),
                HumanMessage("The cluster is called orion."),
                AIMessage("Got it: orion.", id="run-1"),
            ]
        )
        client.close(session_id, wait=True)
        history.add_messages(
            [HumanMessage("Restart it."), ToolMessage("restarted", tool_call_id="call-1")]
        )
        # The context at a budget below the raw history: a recap of the
        # first three, then the newest raw.
        tight = ArchivistChatMessageHistory(session_id, client, max_tokens=40)
        context = tight.messages
        assert context[0].response_metadata["archivist"]["kind"] == "summary"
        assert [m.content for m in context[-2:]] == ["Restart it.", "restarted"]
        transcript = history.transcript()
        assert [(type(m).__name__, m.content) for m in transcript] == [
            ("SystemMessage", "Answer briefly."),
            ("HumanMessage", "The cluster is called orion."),
            ("AIMessage", "Got it: orion."),
            ("HumanMessage", "Restart it."),
            ("ChatMessage", "restarted"),
        ]
        assert transcript[2].id == "run-1"
        assert [m.response_metadata["archivist"]["seq"] for m in transcript] == [1, 2, 3, 4, 5]
        assert [m.content for m in history.transcript(after_seq=1, limit=2)] == [
            "The cluster is called orion.", "Got it: orion.",
        ]
        # Read back, they are already stored: adding them again is a no-op.
        history.add_messages(transcript)
        assert len(history.transcript()) == 5


async def test_async_transcript_with_either_client(server, session_id: str) -> None:
    async with AsyncClient(server.address) as client:
        history = ArchivistChatMessageHistory(session_id, client)
        assert await history.atranscript() == []
        await history.aadd_messages([HumanMessage("first"), AIMessage("second")])
        await client.close(session_id, wait=True)
        await history.aadd_messages([HumanMessage("third")])
        transcript = await history.atranscript()
        assert [m.content for m in transcript] == ["first", "second", "third"]
        assert [m.content for m in await history.atranscript(after_seq=2)] == ["third"]
        with pytest.raises(TypeError, match="AsyncClient"):
            history.transcript()
    with Client(server.address) as sync:
        history = ArchivistChatMessageHistory(session_id, sync)
        assert [m.content for m in await history.atranscript(limit=2)] == ["first", "second"]


def test_clear_erases_the_session(server, session_id: str) -> None:
    with Client(server.address) as client:
        history = ArchivistChatMessageHistory(session_id, client)
        history.clear()  # nothing stored yet: already clear, no error
        history.add_messages([HumanMessage("My locker code is 4711."), AIMessage("Noted.")])
        client.close(session_id, wait=True)
        history.add_messages([HumanMessage("Forget all of that.")])
        assert [m.content for m in history.messages][-1] == "Forget all of that."

        history.clear()
        assert history.messages == []
        with pytest.raises(NotFound):
            client.context(session_id)
        assert session_id not in [s.session_id for s in client.sessions()]
        history.clear()  # again: no error

        # The history goes on as a new session.
        history.add_messages([HumanMessage("Hello again.")])
        entries = client.context(session_id).entries
        assert [(e.seq, e.content) for e in entries] == [(1, "Hello again.")]


async def test_async_history_with_an_async_client(server, session_id: str) -> None:
    async with AsyncClient(server.address) as client:
        history = ArchivistChatMessageHistory(session_id, client)
        message = HumanMessage("from asyncio")
        await history.aadd_messages([message, AIMessage("answered")])
        await history.aadd_messages([message])
        assert [m.content for m in await history.aget_messages()] == ["from asyncio", "answered"]
        with pytest.raises(TypeError, match="AsyncClient"):
            history.messages
        with pytest.raises(TypeError, match="AsyncClient"):
            history.clear()

        await history.aclear()
        assert await history.aget_messages() == []
        with pytest.raises(NotFound):
            await client.context(session_id)
        await history.aclear()  # already clear: no error


def test_the_retriever_returns_the_planted_fact_as_a_document(server) -> None:
    who = f"user:{uuid.uuid4().hex[:12]}"
    with Client(server.address) as client:
        client.append(
            "retriever-ada",
            [("user", "Hello."), ("user", "My vault code is zephyrquill 4471."), ("assistant", "Noted.")],
            subject=who,
        )
        client.append("retriever-bob", [("user", "Bob's vault code is 1234.")], subject="user:bob-retriever")
        retriever = ArchivistRetriever(client=client, subject=who, limit=5)
        assert isinstance(retriever, BaseRetriever)
        docs = retriever.invoke("what is my vault code?")
        assert all(isinstance(d, Document) for d in docs)
        assert [d.page_content for d in docs] == ["My vault code is zephyrquill 4471."]
        meta = docs[0].metadata
        assert {k: meta[k] for k in ("session_id", "kind", "level", "first_seq", "last_seq", "role", "legs")} == {
            "session_id": "retriever-ada",
            "kind": "entry",
            "level": 0,
            "first_seq": 2,
            "last_seq": 2,
            "role": "user",
            "legs": ["lexical"],
        }
        assert meta["segment_id"] is None
        assert meta["score"] == pytest.approx(1 / 61)
        at = datetime.fromisoformat(meta["created_at"])
        assert at.tzinfo is not None and abs(datetime.now(timezone.utc) - at).total_seconds() < 300
        assert docs[0].id == "archivist:retriever-ada:seq:2"
        assert (meta["name"], meta["entry_metadata"]) == (None, {})

        # Speakers, times and metadata come back; metadata_filter keeps only
        # the entries holding every pair.
        said = datetime(2023, 11, 14, 9, 12, tzinfo=timezone.utc)
        client.append(
            "retriever-ada-2",
            [
                {"role": "user", "content": "The zephyrquill spare is in the shed.", "name": "Maya",
                 "occurred_at": said, "metadata": {"channel": "sms"}},
                {"role": "user", "content": "The zephyrquill spare moved to the attic.", "name": "Tom",
                 "metadata": {"channel": "email"}},
            ],
            subject=who,
        )
        sms = ArchivistRetriever(client=client, subject=who, metadata_filter={"channel": "sms"}).invoke("zephyrquill")
        assert [d.page_content for d in sms] == ["The zephyrquill spare is in the shed."]
        assert sms[0].metadata["name"] == "Maya"
        assert datetime.fromisoformat(sms[0].metadata["occurred_at"]) == said
        assert sms[0].metadata["entry_metadata"] == {"channel": "sms"}

        # The scope holds: roles, levels, sessions; recaps come as summaries.
        assert ArchivistRetriever(client=client, subject=who, roles=["assistant"]).invoke("vault code") == []
        closed = client.close("retriever-ada", wait=True)
        assert closed is not None
        recaps = ArchivistRetriever(client=client, session_ids=["retriever-ada"], levels=[1]).invoke("zephyrquill")
        assert [(d.metadata["kind"], d.metadata["segment_id"], d.metadata["role"]) for d in recaps] == [
            ("summary", closed.id, None)
        ]
        assert recaps[0].id == f"archivist:retriever-ada:node:{closed.id}"

        # A bad scope fails where it is written; a bad query when asked.
        with pytest.raises(ValueError, match="limit"):
            ArchivistRetriever(client=client, limit=500)
        with pytest.raises(ValueError, match="INVALID_ROLE"):
            ArchivistRetriever(client=client, roles=["boss"])
        with pytest.raises(InvalidArgument):
            retriever.invoke("")
        with pytest.raises(InvalidArgument) as caught:
            retriever.invoke("***")
        assert caught.value.reason == "EMPTY_QUERY"


async def test_the_retriever_searches_through_an_async_client_or_a_blocking_one(server) -> None:
    who = f"user:{uuid.uuid4().hex[:12]}"
    async with AsyncClient(server.address) as client:
        await client.append("retriever-async", [("user", "The boiler is in the basement.")], subject=who)
        retriever = ArchivistRetriever(client=client, subject=who)
        docs = await retriever.ainvoke("where is the boiler?")
        assert [(d.page_content, d.metadata["session_id"]) for d in docs] == [
            ("The boiler is in the basement.", "retriever-async")
        ]
        with pytest.raises(TypeError, match="AsyncClient"):
            retriever.invoke("boiler")
    with Client(server.address) as sync:
        docs = await ArchivistRetriever(client=sync, subject=who).ainvoke("boiler basement")
        assert [d.page_content for d in docs] == ["The boiler is in the basement."]
