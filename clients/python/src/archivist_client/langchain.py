"""LangChain integrations: a chat message history kept in archivist, and a
retriever over archivist's search.

    from archivist_client import Client
    from archivist_client.langchain import ArchivistChatMessageHistory

    history = ArchivistChatMessageHistory("support-42", Client("127.0.0.1:50051"))
    history.add_messages([HumanMessage("My name is Ada.")])
    history.messages   # summaries as SystemMessage, then the raw messages
    history.transcript()   # every message as it was added, none summarised

Needs the `langchain` extra (langchain-core); nothing else in
archivist_client imports LangChain.

What is kept: each message's role and text. Human, AI, system and tool
messages map to archivist's user, assistant, system and tool roles; tool-call
structure (an AI message's tool_calls, a tool message's tool_call_id) and
non-text content blocks are not stored, and a message with no text at all is
skipped (archivist refuses empty entries). Raw tool entries come back as
`ChatMessage(role="tool")`.

Idempotency: every stored message carries a `client_entry_id`, so adding the
same message twice stores it once. The key is the message's `id` when it has
one (hashed to `sha256:<hex>` if longer than the server's 128 characters);
a message without an id is given a fresh `uuid4` id first, written back into
`message.id` (as LangGraph's message reducer does), so re-adding that same
object reuses its key. Messages read back from this session's `messages`
carry their entry's key as `id` and, in `response_metadata["archivist"]`,
where they came from; adding them to the same session again is a no-op.

`transcript()` is the other way to read it back: every stored message,
oldest first, as it was added, with none replaced by a recap (ListEntries,
page by page); `messages` stays what belongs in a prompt.

`clear()` erases the session in archivist (DeleteSession): its entries,
recaps and roll-ups, for good.

`ArchivistRetriever` is a `BaseRetriever` over Search: each hit, an entry or
a recap, becomes a `Document` whose metadata says where it is in memory.

    retriever = ArchivistRetriever(client=Client("127.0.0.1:50051"), subject="user:ada")
    retriever.invoke("what is the vault code?")   # [Document(page_content=..., metadata=...)]
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Sequence
from typing import Any, Optional, Union

try:
    from langchain_core.callbacks import (
        AsyncCallbackManagerForRetrieverRun,
        CallbackManagerForRetrieverRun,
    )
    from langchain_core.chat_history import BaseChatMessageHistory
    from langchain_core.documents import Document
    from langchain_core.retrievers import BaseRetriever
    from langchain_core.runnables.config import run_in_executor
    from langchain_core.messages import (
        AIMessage,
        BaseMessage,
        ChatMessage,
        FunctionMessage,
        HumanMessage,
        SystemMessage,
        ToolMessage,
    )
except ImportError as e:  # pragma: no cover - depends on the install
    raise ImportError(
        "archivist_client.langchain needs langchain-core: "
        "pip install 'archivist-client[langchain]'"
    ) from e

from .client import AsyncClient, Client, _search_request
from .errors import NotFound, invalid_argument
from .types import Context, ContextSummary, Entry, SearchHit

__all__ = ["ArchivistChatMessageHistory", "ArchivistRetriever"]

# The server refuses longer client_entry_ids (and control characters).
MAX_KEY_CHARS = 128
# Entries per AppendEntries call (the server's default cap is 1000).
BATCH = 500

_CHAT_ROLES = {
    "user": "user",
    "human": "user",
    "assistant": "assistant",
    "ai": "assistant",
    "system": "system",
    "developer": "system",
    "tool": "tool",
    "function": "tool",
}


def _role(message: BaseMessage) -> str:
    if isinstance(message, HumanMessage):
        return "user"
    if isinstance(message, AIMessage):
        return "assistant"
    if isinstance(message, SystemMessage):
        return "system"
    if isinstance(message, (ToolMessage, FunctionMessage)):
        return "tool"
    if isinstance(message, ChatMessage) and message.role.lower() in _CHAT_ROLES:
        return _CHAT_ROLES[message.role.lower()]
    raise invalid_argument(
        "role",
        f"cannot store a {type(message).__name__} "
        f"(role {getattr(message, 'role', message.type)!r}) in archivist: "
        "roles are user, assistant, system and tool",
        "INVALID_ROLE",
    )


def _text(message: BaseMessage) -> str:
    content = message.content
    if isinstance(content, str):
        return content
    parts = []
    for block in content:
        if isinstance(block, str):
            parts.append(block)
        elif isinstance(block, dict) and block.get("type") == "text":
            parts.append(str(block.get("text", "")))
    return "".join(parts)


def _key(message_id: str) -> str:
    """The client_entry_id for a message id: itself when the server takes
    it, else a stable digest of it."""
    if len(message_id) <= MAX_KEY_CHARS and message_id.isprintable():
        return message_id
    return "sha256:" + hashlib.sha256(message_id.encode("utf-8")).hexdigest()


def _to_messages(session_id: str, context: Context, summary_prefix: str) -> list[BaseMessage]:
    messages: list[BaseMessage] = []
    for item in context.items:
        if isinstance(item, ContextSummary):
            messages.append(
                SystemMessage(
                    content=summary_prefix + item.text,
                    id=f"archivist-summary:{item.segment_id}",
                    response_metadata={
                        "archivist": {
                            "kind": "summary",
                            "session_id": session_id,
                            "segment_id": item.segment_id,
                            "level": item.level,
                            "first_seq": item.first_seq,
                            "last_seq": item.last_seq,
                            "provider": item.summary.provider,
                            "model": item.summary.model,
                        }
                    },
                )
            )
        elif isinstance(item, Entry):
            messages.append(_entry_message(session_id, item))
    return messages


def _entry_message(session_id: str, entry: Entry) -> BaseMessage:
    fields: dict[str, Any] = {
        "content": entry.content,
        "id": entry.client_entry_id or None,
        "name": entry.name or None,
        "response_metadata": {
            "archivist": {"kind": "entry", "session_id": session_id, "seq": entry.seq}
        },
    }
    if entry.role == "user":
        return HumanMessage(**fields)
    if entry.role == "assistant":
        return AIMessage(**fields)
    if entry.role == "system":
        return SystemMessage(**fields)
    # "tool", or a role newer than this client: archivist keeps no
    # tool_call_id, so a ToolMessage cannot be rebuilt faithfully.
    return ChatMessage(role=entry.role, **fields)


class ArchivistChatMessageHistory(BaseChatMessageHistory):
    """LangChain chat message history stored in an archivist session.

    Args:
        session_id: the archivist session (1-128 characters of
            `[A-Za-z0-9._:-]`).
        client: a `Client`, or an `AsyncClient` for the async methods
            (`aget_messages`, `aadd_messages`, `aclear`) only.
        max_tokens: the token budget of `messages` (0: the server's cap).
        summary_prefix: text put before each summary's recap in its
            SystemMessage (e.g. "Earlier in this conversation: ").

    `messages` is the session's context: a SystemMessage per summary (of a
    segment or, for older history, a roll-up of several), then the raw
    messages not yet summarised, oldest first. `transcript()` is every
    stored message as it was added, summarised or not. `clear()` erases the
    session in archivist: its entries, recaps and roll-ups.
    """

    def __init__(
        self,
        session_id: str,
        client: Client | AsyncClient,
        *,
        max_tokens: int = 0,
        summary_prefix: str = "",
    ) -> None:
        super().__init__()
        self.session_id = session_id
        self.client = client
        self.max_tokens = max_tokens
        self.summary_prefix = summary_prefix

    def _sync_client(self) -> Client:
        if not isinstance(self.client, Client):
            raise TypeError(
                "this history was given an AsyncClient: use aget_messages() and "
                "aadd_messages(), or give it a Client"
            )
        return self.client

    @property
    def messages(self) -> list[BaseMessage]:  # type: ignore[override]
        """The session's context as LangChain messages ([] for a new session)."""
        try:
            context = self._sync_client().context(self.session_id, max_tokens=self.max_tokens)
        except NotFound:
            return []
        return _to_messages(self.session_id, context, self.summary_prefix)

    async def aget_messages(self) -> list[BaseMessage]:
        if not isinstance(self.client, AsyncClient):
            return await super().aget_messages()
        try:
            context = await self.client.context(self.session_id, max_tokens=self.max_tokens)
        except NotFound:
            return []
        return _to_messages(self.session_id, context, self.summary_prefix)

    def transcript(self, after_seq: int = 0, limit: int | None = None) -> list[BaseMessage]:
        """Every message stored in the session, oldest first, as it was
        added: none replaced by a recap (unlike `messages`, which is the
        context for a prompt). Read page by page (ListEntries); `after_seq`
        and `limit` (None: all) pick a part. Each message carries its seq in
        `response_metadata["archivist"]`, so adding it back stores nothing.
        [] for a session that does not exist."""
        client = self._sync_client()
        try:
            entries = list(client.entries(self.session_id, after_seq, limit))
        except NotFound:
            return []
        return [_entry_message(self.session_id, e) for e in entries]

    async def atranscript(
        self, after_seq: int = 0, limit: int | None = None
    ) -> list[BaseMessage]:
        """`transcript()` through an AsyncClient (or, with a Client, in an
        executor)."""
        if not isinstance(self.client, AsyncClient):
            return await run_in_executor(None, self.transcript, after_seq, limit)
        try:
            entries = [e async for e in self.client.entries(self.session_id, after_seq, limit)]
        except NotFound:
            return []
        return [_entry_message(self.session_id, e) for e in entries]

    def _entries(self, messages: Sequence[BaseMessage]) -> list[dict[str, str]]:
        entries = []
        for message in messages:
            origin = (message.response_metadata or {}).get("archivist")
            if isinstance(origin, dict) and origin.get("session_id") == self.session_id:
                continue  # read from this very session: already stored
            role, text = _role(message), _text(message)
            if not text:
                continue
            if not message.id:
                message.id = str(uuid.uuid4())
            entry = {"role": role, "content": text, "client_entry_id": _key(message.id)}
            if message.name:
                entry["name"] = message.name
            entries.append(entry)
        return entries

    def add_messages(self, messages: Sequence[BaseMessage]) -> None:
        """Appends the messages in order, each with an idempotency key."""
        client = self._sync_client()
        entries = self._entries(messages)
        for start in range(0, len(entries), BATCH):
            client.append(self.session_id, entries[start : start + BATCH])

    async def aadd_messages(self, messages: Sequence[BaseMessage]) -> None:
        if not isinstance(self.client, AsyncClient):
            await super().aadd_messages(messages)
            return
        entries = self._entries(messages)
        for start in range(0, len(entries), BATCH):
            await self.client.append(self.session_id, entries[start : start + BATCH])

    def clear(self) -> None:
        """Erases the session in archivist (DeleteSession): its entries, its
        segments' recaps and its roll-ups, all of it, for good. A session
        that does not exist is already clear: no error. The next message
        added starts the session afresh at seq 1."""
        try:
            self._sync_client().delete_session(self.session_id)
        except NotFound:
            pass

    async def aclear(self) -> None:
        """`clear()` through an AsyncClient (or, with a Client, in an
        executor)."""
        if not isinstance(self.client, AsyncClient):
            await super().aclear()
            return
        try:
            await self.client.delete_session(self.session_id)
        except NotFound:
            pass


def _document(hit: SearchHit) -> Document:
    """A search hit as a Document: its text, and where it is in memory."""
    where = f"seq:{hit.first_seq}" if hit.level == 0 else f"node:{hit.segment_id}"
    return Document(
        id=f"archivist:{hit.session_id}:{where}",
        page_content=hit.text,
        metadata={
            "session_id": hit.session_id,
            "kind": hit.kind,
            "level": hit.level,
            "first_seq": hit.first_seq,
            "last_seq": hit.last_seq,
            "segment_id": hit.segment_id,
            "created_at": hit.created_at.isoformat() if hit.created_at else None,
            "score": hit.score,
            "role": hit.role,
            "legs": hit.legs,
            "name": hit.name or None,
            "occurred_at": hit.occurred_at.isoformat() if hit.occurred_at else None,
            "entry_metadata": dict(hit.metadata),
            "similarity": hit.similarity,
            "lexical_rank": hit.lexical_rank,
            "semantic_rank": hit.semantic_rank,
        },
    )


class ArchivistRetriever(BaseRetriever):
    """A LangChain retriever over archivist's Search: the caller's entries
    and recaps found by their words, best first, as Documents.

    Args:
        client: a `Client`, or an `AsyncClient` for `ainvoke` (and the
            other async methods) only. With a `Client`, `ainvoke` runs the
            search in an executor.
        subject: only this subject's sessions (whose memory they are).
        session_ids: only these sessions.
        levels: 0 entries, 1 segment recaps, 2 and up roll-ups (None:
            entries and segment recaps).
        roles: only entries of these roles ("user", "assistant", "system",
            "tool"); recaps have none, so a role leaves them out.
        limit: the most Documents per query, 1 to 100 (None: 10).
        mode: "auto", "lexical" or "semantic" (see `Client.search`).
        metadata_filter: only entries whose metadata holds every one of
            these pairs (recaps have none, so a pair leaves them out).
        min_similarity: a cosine from -1 to 1 (None: none): the hits only
            the semantic leg found below it are dropped (see
            `Client.search`), so a question nothing in memory answers
            retrieves nothing rather than the nearest texts.

    Each Document's `page_content` is the hit's text and its `metadata`
    says where in memory it is: `session_id`, `kind` ("entry" or
    "summary"), `level`, `first_seq`, `last_seq`, `segment_id` (None for
    an entry), `created_at` (ISO 8601, UTC), `score`, `role` (None for a
    recap), `legs` (how it was found), `name` (the speaker, None when none
    was given), `occurred_at` (when it was said, ISO 8601), `entry_metadata`
    (the entry's own pairs), `similarity` (the cosine to the query; 0 when
    not found by meaning), `lexical_rank` and `semantic_rank` (its place in
    each leg; 0: not found by it). Its `id` names the entry or node.
    A bad scope, limit or mode fails when the retriever is made (pydantic's
    ValidationError, a ValueError, with the client's InvalidArgument
    message); a query the server refuses raises its `ArchivistError`.
    """

    client: Union[Client, AsyncClient]
    subject: Optional[str] = None
    session_ids: Optional[list[str]] = None
    levels: Optional[list[int]] = None
    roles: Optional[list[str]] = None
    limit: Optional[int] = None
    mode: str = "auto"
    metadata_filter: Optional[dict[str, str]] = None
    min_similarity: Optional[float] = None

    def model_post_init(self, context: Any) -> None:
        # The scope is checked now, with the checks every search makes, so
        # a bad one fails where it is written rather than at the first query.
        _search_request("scope check", after=None, before=None, **self._scope())

    def _scope(self) -> dict[str, Any]:
        return {
            "session_ids": self.session_ids,
            "subject": self.subject,
            "roles": self.roles,
            "levels": self.levels,
            "limit": self.limit,
            "mode": self.mode,
            "metadata": self.metadata_filter,
            "min_similarity": self.min_similarity,
        }

    def _get_relevant_documents(
        self, query: str, *, run_manager: CallbackManagerForRetrieverRun
    ) -> list[Document]:
        if not isinstance(self.client, Client):
            raise TypeError(
                "this retriever was given an AsyncClient: use ainvoke(), or give it a Client"
            )
        return [_document(hit) for hit in self.client.search(query, **self._scope()).hits]

    async def _aget_relevant_documents(
        self, query: str, *, run_manager: AsyncCallbackManagerForRetrieverRun
    ) -> list[Document]:
        if not isinstance(self.client, AsyncClient):
            return await super()._aget_relevant_documents(query, run_manager=run_manager)
        found = await self.client.search(query, **self._scope())
        return [_document(hit) for hit in found.hits]
