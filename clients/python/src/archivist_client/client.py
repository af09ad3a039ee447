"""`Client` (blocking) and `AsyncClient` (`grpc.aio`) for archivist.v1.

Both take the same arguments and have the same methods; the async ones are
coroutines, `AsyncClient.segments`, `AsyncClient.sessions` and
`AsyncClient.entries` are async iterators, and `watch` gives a `SessionWatch` (a generator of events) or an
`AsyncSessionWatch` (an async iterator). Every failed call, and every
stream that fails, raises an `ArchivistError` subclass (see
`archivist_client.errors`).
Nothing here retries: the server's recap passes do that, bounded, and a
caller that wants to retry a call decides for itself (`err.retry_after`,
`err.failure.retryable`).
"""

from __future__ import annotations

import asyncio
import math
import os
from collections.abc import AsyncIterator, Generator, Iterable, Iterator, Mapping, Sequence
from datetime import datetime
from types import TracebackType
from typing import Any, Callable, TypeVar, cast

import grpc
import grpc.aio

from .errors import from_rpc_error, invalid_argument
from .types import (
    SEARCH_MODES,
    AppendResult,
    Backlog,
    Context,
    DeleteResult,
    DeleteSubjectResult,
    Entry,
    FlushResult,
    MessageLike,
    SearchResult,
    Segment,
    SessionEvent,
    SessionInfo,
    count_value,
    new_entries,
    role_value,
    state_value,
)
from .v1 import archivist_pb2 as pb
from .v1 import archivist_pb2_grpc as pb_grpc

__all__ = ["AsyncClient", "AsyncSessionWatch", "Client", "DEFAULT_TIMEOUT", "SessionWatch"]

#: Default deadline of every call, in seconds. A waiting `close` or `flush`
#: answers a little before its deadline with the state as it stands.
DEFAULT_TIMEOUT = 30.0


class _Default:
    def __repr__(self) -> str:
        return "<client default>"


#: Sentinel: use the client's timeout (pass None for no deadline at all).
DEFAULT: Any = _Default()

T = TypeVar("T")


def _read_pem(ca_cert: str | bytes | os.PathLike[str]) -> bytes:
    if isinstance(ca_cert, bytes):
        return ca_cert
    if isinstance(ca_cert, str) and ca_cert.lstrip().startswith("-----BEGIN"):
        return ca_cert.encode("ascii")
    with open(ca_cert, "rb") as f:
        return f.read()


def _channel_setup(
    target: str, ca_cert: str | bytes | os.PathLike[str] | None
) -> tuple[str, grpc.ChannelCredentials | None]:
    """The gRPC target and, for TLS, its credentials.

    `https://host:port` is TLS (with `ca_cert` if given, else the system's
    roots); `http://host:port` is plaintext; a bare `host:port` is TLS when
    `ca_cert` is given and plaintext otherwise. Other gRPC targets
    (`dns:///...`, `unix:...`) pass through unchanged.
    """
    if not isinstance(target, str) or not target:
        raise ValueError("target must be a non-empty string such as '127.0.0.1:50051'")
    secure = ca_cert is not None
    if target.startswith("https://"):
        target, secure = target[len("https://") :], True
    elif target.startswith("http://"):
        if ca_cert is not None:
            # Refuse rather than quietly connect in plaintext.
            raise ValueError(
                "ca_cert was given with an http:// target: use https:// "
                "(or a bare host:port) for TLS"
            )
        target = target[len("http://") :]
    target = target.rstrip("/")
    if not secure:
        return target, None
    roots = _read_pem(ca_cert) if ca_cert is not None else None
    return target, grpc.ssl_channel_credentials(root_certificates=roots)


def _metadata(token: str | None) -> tuple[tuple[str, str], ...]:
    if token is None:
        return ()
    if not token or any(c in token for c in "\r\n"):
        raise ValueError("token must be a non-empty string without line breaks")
    return (("authorization", f"Bearer {token}"),)


def _levels(
    levels: Iterable[int] | int | None, meaning: str = "1: segments, 2 and up: roll-ups"
) -> list[int]:
    if levels is None:
        return []
    if isinstance(levels, int):
        levels = [levels]
    out = []
    for i, level in enumerate(levels):
        if isinstance(level, bool) or not isinstance(level, int):
            raise TypeError(f"levels must be ints ({meaning}); got {level!r}")
        out.append(count_value(f"levels[{i}]", level))
    return out


def _strings(field: str, values: Iterable[str] | str | None) -> list[str]:
    """A repeated string argument: a list of str, or one str for a list of
    one (never its characters)."""
    if values is None:
        return []
    if isinstance(values, str):
        return [values]
    out = list(values)
    for value in out:
        if not isinstance(value, str):
            raise TypeError(f"{field} must be strs; got {value!r}")
    return out


def _instant(field: str, value: datetime | None) -> datetime | None:
    if value is None:
        return None
    if not isinstance(value, datetime):
        raise TypeError(f"{field} must be a datetime; got {type(value).__name__}")
    if value.tzinfo is None or value.utcoffset() is None:
        # A naive datetime could be any zone's: guessing would move the
        # window by hours without a word.
        raise invalid_argument(
            field,
            "must be timezone-aware, such as datetime.now(timezone.utc); "
            f"got the naive {value.isoformat()}",
            "INVALID_TIMESTAMP",
        )
    return value


#: The longest query the server takes, in UTF-8 bytes (the proto's cap).
MAX_QUERY_BYTES = 4096
#: The most hits one search returns (the proto's cap).
MAX_SEARCH_LIMIT = 100


def _min_similarity(min_similarity: float | None) -> float | None:
    """A `min_similarity` as the request carries it, a single-precision
    float, refused as the server refuses it when that is no cosine: the
    server checks what arrives, so 1.00000001 (sent as 1.0) is taken and
    1.0000001 (sent as 1.0000001192) is not."""
    if min_similarity is None:
        return None
    if isinstance(min_similarity, bool) or not isinstance(min_similarity, (int, float)):
        raise TypeError(f"min_similarity must be a float; got {type(min_similarity).__name__}")
    try:
        # The field's own conversion: rounding, and infinity past the range.
        sent = pb.SearchRequest(min_similarity=float(min_similarity)).min_similarity
    except OverflowError:  # an int past any float
        sent = math.inf if min_similarity > 0 else -math.inf
    if not -1.0 <= sent <= 1.0:  # NaN fails this too
        raise invalid_argument(
            "min_similarity",
            f"{min_similarity!r} is no cosine: a similarity is from -1 to 1",
            "INVALID_MIN_SIMILARITY",
        )
    return sent


def _search_request(
    query: str,
    session_ids: Iterable[str] | str | None,
    subject: str | None,
    after: datetime | None,
    before: datetime | None,
    roles: Iterable[str] | str | None,
    levels: Iterable[int] | int | None,
    limit: int | None,
    mode: str,
    metadata: Mapping[str, str] | None = None,
    min_similarity: float | None = None,
) -> pb.SearchRequest:
    """A Search request from `search()`'s arguments, checked as far as the
    client can tell: wrong types raise TypeError, bad values
    InvalidArgument (with the server's reasons), before anything is sent.
    Whether a non-empty query has a word to look for is the server's to
    say (EMPTY_QUERY too)."""
    if not isinstance(query, str):
        raise TypeError(f"query must be a str; got {type(query).__name__}")
    if not query.strip():
        raise invalid_argument("query", "the query is empty: give words to look for", "EMPTY_QUERY")
    try:
        size = len(query.encode("utf-8"))
    except UnicodeEncodeError:
        raise invalid_argument(
            "query", "the query is not valid text (it holds a lone surrogate)"
        ) from None
    if size > MAX_QUERY_BYTES:
        raise invalid_argument(
            "query",
            f"the query is {size} bytes, over the cap of {MAX_QUERY_BYTES}",
            "QUERY_TOO_LONG",
        )
    if subject is not None and not isinstance(subject, str):
        raise TypeError(f"subject must be a str; got {type(subject).__name__}")
    if limit is not None:
        if isinstance(limit, bool) or not isinstance(limit, int):
            raise TypeError(f"limit must be an int; got {type(limit).__name__}")
        if not 1 <= limit <= MAX_SEARCH_LIMIT:
            raise invalid_argument(
                "limit",
                f"must be from 1 to {MAX_SEARCH_LIMIT} (None: the server's default, 10); "
                f"got {limit}",
            )
    if not isinstance(mode, str) or mode.lower() not in SEARCH_MODES:
        raise invalid_argument(
            "mode", f"must be one of {', '.join(SEARCH_MODES)}; got {mode!r}", "INVALID_MODE"
        )
    least = _min_similarity(min_similarity)
    roles_wire = [
        cast("pb.Role", role_value(r, f"roles[{i}]"))
        for i, r in enumerate(_strings("roles", roles))
    ]
    if metadata is not None and not (
        isinstance(metadata, Mapping)
        and all(isinstance(k, str) and isinstance(v, str) for k, v in metadata.items())
    ):
        raise TypeError("metadata must be a dict of str to str")
    request = pb.SearchRequest(
        query=query,
        session_ids=_strings("session_ids", session_ids),
        subject=subject or "",
        after=_instant("after", after),
        before=_instant("before", before),
        roles=roles_wire,
        levels=_levels(levels, "0: entries, 1: segment recaps, 2 and up: roll-ups"),
        limit=limit or 0,
        mode=cast("pb.SearchMode", pb.SearchMode.Value("SEARCH_MODE_" + mode.upper())),
        metadata=dict(metadata or {}),
    )
    if least is not None:
        request.min_similarity = least
    return request


def _context_request(
    session_id: str, max_tokens: int, query: str | None, min_similarity: float | None
) -> pb.GetContextRequest:
    if query is not None and not isinstance(query, str):
        raise TypeError(f"query must be a str; got {type(query).__name__}")
    least = _min_similarity(min_similarity)
    request = pb.GetContextRequest(
        session_id=session_id,
        max_tokens=count_value("max_tokens", max_tokens),
        query=query or "",
    )
    if least is not None:
        request.min_similarity = least
    return request


def _list_request(
    session_id: str | None,
    states: Iterable[str | int] | None,
    levels: Iterable[int] | int | None,
    page_size: int,
    page_token: str,
) -> pb.ListSegmentsRequest:
    if isinstance(states, str):
        states = [states]
    return pb.ListSegmentsRequest(
        session_id=session_id or "",
        states=[cast("pb.SegmentState", state_value(s)) for s in states or ()],
        page_size=count_value("page_size", page_size),
        page_token=page_token,
        levels=_levels(levels),
    )


def _requeue_request(
    session_id: str | None, segment_ids: Sequence[int] | None, include_parked: bool
) -> pb.RequeueSegmentsRequest:
    return pb.RequeueSegmentsRequest(
        session_id=session_id or "",
        segment_ids=list(segment_ids or ()),
        include_parked=include_parked,
    )


class _EntryPages:
    """Where a read of a session's transcript (ListEntries) stands: the
    next page to ask for, and how many entries are still wanted. One pager
    serves `Client.entries` and `AsyncClient.entries`."""

    #: The most entries the server puts in a page.
    MAX_PAGE = 1000

    def __init__(
        self, session_id: str, after_seq: int, limit: int | None, page_size: int
    ) -> None:
        count_value("after_seq", after_seq, bits=64)
        count_value("page_size", page_size)
        if limit is not None:
            count_value("limit", limit, bits=64)
        self.session_id = session_id
        self.after_seq = after_seq
        self.left = limit
        self.page_size = page_size
        self.done = limit == 0

    def request(self) -> pb.ListEntriesRequest:
        """The next page's request: no larger than what is still wanted."""
        page_size = self.page_size
        if self.left is not None:
            page_size = min(page_size or self.MAX_PAGE, self.left)
        return pb.ListEntriesRequest(
            session_id=self.session_id, after_seq=self.after_seq, page_size=page_size
        )

    def take(self, page: pb.ListEntriesResponse) -> list[Entry]:
        """The entries of a page that are wanted; moves on to the next."""
        wanted = page.entries if self.left is None else page.entries[: self.left]
        entries = [Entry.from_pb(e) for e in wanted]
        if self.left is not None:
            self.left -= len(entries)
        self.after_seq = page.next_after_seq
        self.done = page.next_after_seq == 0 or self.left == 0
        return entries


def _task_cancelled() -> bool:
    """Whether the running task itself is being cancelled (Python 3.11+
    can tell; 3.10 cannot, and says no)."""
    task = asyncio.current_task()
    cancelling = getattr(task, "cancelling", None)
    return bool(cancelling and cancelling())


class SessionWatch(Generator[SessionEvent, None, None]):
    """The events of one session, as they happen: what `Client.watch`
    returns, once the server has subscribed it.

    A generator of `SessionEvent`: iterate it (`for event in watch`), and
    stop it with `close()` (or leave its `with` block). `cancel()` does the
    same and may be called from another thread, ending a `for` loop blocked
    there. Iteration ends after the "deleted" event (the session was erased)
    and when stopped; a stream that fails raises its `ArchivistError`
    (`Unavailable`, reason "SHUTTING_DOWN", when the server stops;
    `DeadlineExceeded` when the watch's own `timeout` passes).

    There is no replay: read `segments()` after `watch()` returns to learn
    what happened before.
    """

    def __init__(self, call: Any) -> None:
        self._call = call
        self._pending: pb.SessionEvent | None = None
        self._finished = False
        self._stopped = False

    def _subscribe(self) -> None:
        # Response headers come once the server has subscribed this watcher
        # (or together with the status, when it refused).
        try:
            self._call.initial_metadata()
            if self._call.done():
                # Either refused (NOT_FOUND, ...) or ended already: the
                # first read tells which, keeping an event it may hold.
                try:
                    self._pending = next(self._call)
                except StopIteration:
                    self._finished = True
        except grpc.RpcError as e:
            self._finished = True
            raise from_rpc_error(e) from e

    def send(self, value: None) -> SessionEvent:
        """The next event (`next(watch)`); blocks until one comes."""
        if value is not None:
            raise TypeError("SessionWatch.send takes only None")
        if self._finished:
            raise StopIteration
        try:
            if self._pending is not None:
                message, self._pending = self._pending, None
            else:
                message = next(self._call)
        except StopIteration:
            self._finished = True
            raise
        except grpc.RpcError as e:
            self._finished = True
            if self._stopped:
                raise StopIteration from None
            raise from_rpc_error(e) from e
        event = SessionEvent.from_pb(message)
        if event.kind == "deleted":
            # The session is gone and the server ends the stream.
            self.cancel()
        return event

    def throw(  # type: ignore[override]
        self,
        typ: Any,
        val: Any = None,
        tb: TracebackType | None = None,
    ) -> SessionEvent:
        """Stops the watch and raises the exception (as a generator that
        does not catch it would)."""
        self.cancel()
        if isinstance(typ, BaseException):
            raise typ
        raise (typ() if val is None else val).with_traceback(tb)

    def close(self) -> None:
        """Stops watching; iteration ends. Idempotent."""
        self.cancel()

    def cancel(self) -> None:
        """Stops watching, from any thread: a `for` loop over this watch,
        even one blocked waiting, ends without an error."""
        self._stopped = True
        self._finished = True
        self._call.cancel()

    @property
    def active(self) -> bool:
        """Whether the watch may still yield events."""
        return not self._finished

    def __enter__(self) -> SessionWatch:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncSessionWatch:
    """The `grpc.aio` twin of `SessionWatch`: an async iterator of
    `SessionEvent` (what `AsyncClient.watch` returns).

    `async with client.watch(session_id) as events:` and
    `events = await client.watch(session_id)` return once the server has
    subscribed (so `segments()` read then misses nothing); plain
    `async for event in client.watch(session_id)` subscribes on the first
    step. Iteration ends after the "deleted" event; `aclose()` (or leaving
    the `async with` block) or `cancel()` stops it, ending a loop waiting in
    another task without an error, and cancelling the task that iterates
    stops it too. A stream that fails raises its `ArchivistError`.
    """

    def __init__(self, call: Any) -> None:
        self._call = call
        self._subscribed = False
        self._pending: pb.SessionEvent | None = None
        self._finished = False
        self._stopped = False

    async def subscribed(self) -> AsyncSessionWatch:
        """Returns once the server has subscribed this watcher; raises the
        call's error (`ResourceExhausted` past the server's watch caps, ...)."""
        if self._subscribed:
            return self
        self._subscribed = True
        try:
            await self._call.initial_metadata()
            if self._call.done() and not self._finished:
                message = await self._call.read()
                if message is grpc.aio.EOF:
                    self._finished = True
                else:
                    self._pending = message
        except grpc.RpcError as e:
            self._finished = True
            raise from_rpc_error(e) from e
        except asyncio.CancelledError:
            if self._stopped and not _task_cancelled():
                return self
            self.cancel()
            raise
        return self

    def __await__(self) -> Generator[Any, None, AsyncSessionWatch]:
        return self.subscribed().__await__()

    def __aiter__(self) -> AsyncSessionWatch:
        return self

    async def __anext__(self) -> SessionEvent:
        if not self._subscribed:
            await self.subscribed()
        if self._finished:
            raise StopAsyncIteration
        try:
            if self._pending is not None:
                message, self._pending = self._pending, None
            else:
                message = await self._call.read()
        except grpc.RpcError as e:
            self._finished = True
            if self._stopped:
                raise StopAsyncIteration from None
            raise from_rpc_error(e) from e
        except asyncio.CancelledError:
            if self._stopped and not _task_cancelled():
                # Stopped by aclose()/cancel(), not by cancelling this task.
                raise StopAsyncIteration from None
            self.cancel()
            raise
        if message is grpc.aio.EOF:
            self._finished = True
            raise StopAsyncIteration
        event = SessionEvent.from_pb(message)
        if event.kind == "deleted":
            self.cancel()
        return event

    def cancel(self) -> None:
        """Stops watching; a loop over this watch, even one waiting in
        another task, ends without an error. Idempotent."""
        self._stopped = True
        self._finished = True
        self._call.cancel()

    async def aclose(self) -> None:
        """Stops watching (as `cancel()`)."""
        self.cancel()

    @property
    def active(self) -> bool:
        """Whether the watch may still yield events."""
        return not self._finished

    async def __aenter__(self) -> AsyncSessionWatch:
        return await self.subscribed()

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


class _Base:
    def __init__(
        self,
        target: str,
        token: str | None = None,
        ca_cert: str | bytes | os.PathLike[str] | None = None,
        timeout: float | None = DEFAULT_TIMEOUT,
        *,
        options: Sequence[tuple[str, Any]] | None = None,
    ) -> None:
        self.target, self._credentials = _channel_setup(target, ca_cert)
        self._metadata = _metadata(token)
        self.timeout = timeout
        self._options = list(options or ())

    def _deadline(self, timeout: float | None) -> float | None:
        return self.timeout if timeout is DEFAULT else timeout

    def __repr__(self) -> str:
        tls = "tls" if self._credentials is not None else "plaintext"
        return f"{type(self).__name__}({self.target!r}, {tls})"


class Client(_Base):
    """A blocking client for archivist.

    Args:
        target: the server, as `host:port`, `http://host:port` or
            `https://host:port`.
        token: a bearer token, sent as `authorization: Bearer <token>` on
            every call (needed when the server has tenants configured).
        ca_cert: a PEM CA certificate (a path, PEM bytes or PEM text) to
            verify the server with; turns TLS on. `https://` without it uses
            the system's roots.
        timeout: the default deadline of every call in seconds (None: none).
            Each method also takes `timeout=` for that call.
        options: extra gRPC channel options.

    Use it as a context manager, or call `disconnect()` when done (`close`
    is the CloseSegment call). One client is safe to share between threads.

    >>> with Client("127.0.0.1:50051") as client:      # doctest: +SKIP
    ...     client.append("demo", [("user", "hello")])
    """

    def __init__(
        self,
        target: str,
        token: str | None = None,
        ca_cert: str | bytes | os.PathLike[str] | None = None,
        timeout: float | None = DEFAULT_TIMEOUT,
        *,
        options: Sequence[tuple[str, Any]] | None = None,
    ) -> None:
        super().__init__(target, token, ca_cert, timeout, options=options)
        if self._credentials is None:
            self._channel = grpc.insecure_channel(self.target, options=self._options)
        else:
            self._channel = grpc.secure_channel(
                self.target, self._credentials, options=self._options
            )
        self._stub = pb_grpc.ArchivistStub(self._channel)

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.disconnect()

    def disconnect(self) -> None:
        """Closes the channel; the client is unusable afterwards."""
        self._channel.close()

    def _call(self, method: Callable[..., T], request: Any, timeout: float | None) -> T:
        try:
            return method(
                request, timeout=self._deadline(timeout), metadata=self._metadata
            )
        except grpc.RpcError as e:
            raise from_rpc_error(e) from e

    def append(
        self,
        session_id: str,
        messages: Iterable[MessageLike],
        *,
        subject: str | None = None,
        timeout: float | None = DEFAULT,
    ) -> AppendResult:
        """Appends messages, in order, to the session (creating it as needed).

        Each message is a `(role, content)` pair or a dict with `role`,
        `content` and optionally `client_entry_id` (idempotency key, unique
        per session: a key stored before is not stored again, and its entry
        comes back with its original seq and `duplicate=True`), `name` (who
        said it, 1 to 64 characters), `occurred_at` (when it was said: a
        datetime, naive meaning UTC, or an RFC 3339 string; never before the
        session's newest entry, raising InvalidArgument with reason
        OCCURRED_OUT_OF_ORDER) and `metadata` (up to 16 str pairs). Roles
        are "user", "assistant", "system" and "tool".

        `subject` says whose memory the session is (a user, a customer: 1
        to 256 characters of letters, digits and . _ : @ -). The append that
        creates the session fixes it; naming another one later (or one for
        a session created without) raises FailedPrecondition with reason
        SUBJECT_MISMATCH and stores nothing. Naming none later is fine.

        Raises InvalidArgument (bad session id or subject, no messages,
        empty or oversized content, ...) with `violations` naming each bad
        field.
        """
        request = pb.AppendEntriesRequest(
            session_id=session_id, entries=new_entries(messages), subject=subject or ""
        )
        return AppendResult.from_pb(self._call(self._stub.AppendEntries, request, timeout))

    def close(
        self, session_id: str, *, wait: bool = False, timeout: float | None = DEFAULT
    ) -> Segment | None:
        """Closes the session's open segment and schedules its recap.

        Returns the closed segment, or None when nothing was open. With
        `wait=True` it returns once the recap pass ends (or shortly before
        the deadline). The close succeeded whatever the recap did, so a
        failed recap raises nothing: the segment's `state` is "pending" (the
        server tries again by itself) or "parked", and its `last_failure`
        says why. An error means the close itself failed.
        """
        request = pb.CloseSegmentRequest(session_id=session_id, wait=wait)
        response = self._call(self._stub.CloseSegment, request, timeout)
        return Segment.from_pb(response.segment) if response.HasField("segment") else None

    def flush(self, session_id: str, *, timeout: float | None = DEFAULT) -> FlushResult:
        """Session wind-down: closes the open segment and waits, bounded by
        the server's flush ceiling and the deadline, for every pending
        recap. `complete` says whether every segment is summarised."""
        request = pb.FlushSessionRequest(session_id=session_id)
        return FlushResult.from_pb(self._call(self._stub.FlushSession, request, timeout))

    def context(
        self,
        session_id: str,
        *,
        max_tokens: int = 0,
        query: str | None = None,
        min_similarity: float | None = None,
        timeout: float | None = DEFAULT,
    ) -> Context:
        """What an agent puts in its prompt: summaries where segments have
        one, raw entries elsewhere, oldest first, the oldest dropped to fit
        `max_tokens` (0: the server's cap; `truncated` says something was
        dropped).

        With `query` (the turn's question, or the user's last message; at
        most 4096 bytes, searched as `search` does), what the memory of the
        session's subject holds about it (every session of the subject; the
        session alone without one) comes first, best first, as
        `Context.recalled`, within the server's `context.recall_tokens`
        (default a quarter of the budget); nothing the session's items
        already show verbatim is repeated. A message with no word to look
        for ("👍") is no query. `min_similarity` (a cosine, -1 to 1; None:
        none) leaves out of the recall what only meaning found below it, as
        in `search`, so a question nothing in memory answers recalls
        nothing with embeddings on too; what the words found stays."""
        request = _context_request(session_id, max_tokens, query, min_similarity)
        return Context.from_pb(self._call(self._stub.GetContext, request, timeout))

    def segment(self, segment_id: int, *, timeout: float | None = DEFAULT) -> Segment:
        """One segment with its state, summary, attempts and last failure."""
        request = pb.GetSegmentRequest(segment_id=segment_id)
        return Segment.from_pb(self._call(self._stub.GetSegment, request, timeout))

    def segments(
        self,
        session_id: str | None = None,
        *,
        states: Iterable[str | int] | None = None,
        levels: Iterable[int] | int | None = None,
        page_size: int = 0,
        timeout: float | None = DEFAULT,
    ) -> Iterator[Segment]:
        """Iterates over segments in id order (ordinal order within a
        session and level), one page at a time.

        `session_id` None means every session of the caller; `states`
        (e.g. ["pending", "parked"]) filters; `levels` names the levels of
        the memory tree to list (e.g. [1, 2]; None or empty: level 1 only,
        the segments of entries; 2 and up are roll-ups); `page_size` 0 is
        the server's default (50). Each page is fetched when the previous
        one is used up, each with its own deadline.
        """
        token = ""
        while True:
            request = _list_request(session_id, states, levels, page_size, token)
            page = self._call(self._stub.ListSegments, request, timeout)
            for segment in page.segments:
                yield Segment.from_pb(segment)
            if not page.next_page_token:
                return
            token = page.next_page_token

    def requeue(
        self,
        session_id: str | None = None,
        *,
        segment_ids: Sequence[int] | None = None,
        include_parked: bool = False,
        timeout: float | None = DEFAULT,
    ) -> int:
        """Operator: makes matching PENDING segments (and PARKED ones with
        `include_parked`) due now; returns how many."""
        request = _requeue_request(session_id, segment_ids, include_parked)
        return self._call(self._stub.RequeueSegments, request, timeout).requeued

    def backlog(self, *, timeout: float | None = DEFAULT) -> Backlog:
        """Segment counts per state, the oldest PENDING age and parked
        segments per failure class (the caller's own segments)."""
        return Backlog.from_pb(
            self._call(self._stub.GetBacklog, pb.GetBacklogRequest(), timeout)
        )

    def sessions(
        self,
        *,
        subject: str | None = None,
        page_size: int = 0,
        timeout: float | None = DEFAULT,
    ) -> Iterator[SessionInfo]:
        """Iterates over the caller's sessions in session_id order, one page
        at a time (`page_size` 0: the server's default, 50), each page with
        its own deadline; with `subject`, only that subject's. Only the
        caller's tenant's sessions are listed."""
        token = ""
        while True:
            request = pb.ListSessionsRequest(
                page_size=count_value("page_size", page_size),
                page_token=token,
                subject=subject or "",
            )
            page = self._call(self._stub.ListSessions, request, timeout)
            for info in page.sessions:
                yield SessionInfo.from_pb(info)
            if not page.next_page_token:
                return
            token = page.next_page_token

    def entries(
        self,
        session_id: str,
        after_seq: int = 0,
        limit: int | None = None,
        *,
        page_size: int = 0,
        timeout: float | None = DEFAULT,
    ) -> Iterator[Entry]:
        """Iterates over the session's transcript (ListEntries): its entries
        with a seq after `after_seq`, oldest first, as they were appended,
        whether or not a recap has replaced them in `context()`.

        At most `limit` entries (None: every one there is). Each page is
        fetched when the previous one is used up, each with its own deadline
        (`page_size` 0: the server's default, 100; at most 1000). Raises
        NotFound, when iteration starts, for a session that does not exist
        (another tenant's, or an erased one); bad arguments raise
        InvalidArgument at once.
        """
        return self._entries(_EntryPages(session_id, after_seq, limit, page_size), timeout)

    def _entries(self, pages: _EntryPages, timeout: float | None) -> Iterator[Entry]:
        while not pages.done:
            page = self._call(self._stub.ListEntries, pages.request(), timeout)
            yield from pages.take(page)

    def delete_session(
        self, session_id: str, *, timeout: float | None = DEFAULT
    ) -> DeleteResult:
        """Erases the session: its entries, segments, roll-ups, summaries
        and failures. Watchers get a "deleted" event; the next append starts
        a new session at seq 1. Raises NotFound when there is no such
        session."""
        request = pb.DeleteSessionRequest(session_id=session_id)
        return DeleteResult.from_pb(self._call(self._stub.DeleteSession, request, timeout))

    def delete_subject(
        self, subject: str, *, timeout: float | None = DEFAULT
    ) -> DeleteSubjectResult:
        """Erases every session of the subject in the caller's tenant, each
        as `delete_session` erases one (the "forget this user" privacy law
        asks for), and counts what went. A subject with no session gives
        zeros."""
        request = pb.DeleteSubjectRequest(subject=subject)
        return DeleteSubjectResult.from_pb(
            self._call(self._stub.DeleteSubject, request, timeout)
        )

    def search(
        self,
        query: str,
        *,
        session_ids: Iterable[str] | str | None = None,
        subject: str | None = None,
        after: datetime | None = None,
        before: datetime | None = None,
        roles: Iterable[str] | str | None = None,
        levels: Iterable[int] | int | None = None,
        limit: int | None = None,
        mode: str = "auto",
        metadata: Mapping[str, str] | None = None,
        min_similarity: float | None = None,
        timeout: float | None = DEFAULT,
    ) -> SearchResult:
        """Searches the caller's memory (Search): entries and recaps found by
        their words, best first, as a `SearchResult` of `SearchHit`s.

        `query` is web-search syntax: words, `"a phrase"`, `or` between
        alternatives, `-word` to exclude (at most 4096 bytes; terms past the
        32nd and words past the 64th are ignored). The scope is
        `session_ids` (these sessions), or
        `subject` (that subject's sessions; with both, those of the named
        sessions that are the subject's), or neither: every session of the
        caller's tenant. `after` / `before` (timezone-aware datetimes) keep
        what was stored strictly after / before; `roles` ("user", ...) only
        entries of those roles (recaps have none); `levels` 0 entries, 1
        segment recaps, 2 and up roll-ups (None: entries and segment
        recaps). `limit` is 1 to 100 (None: 10). `mode` is "auto" (by
        meaning too when the server has embeddings), "lexical" or
        "semantic" (FailedPrecondition, reason EMBEDDINGS_OFF, on a server
        without embeddings). `min_similarity` (a cosine, -1 to 1; None:
        none) drops the hits only the semantic leg found whose similarity
        is below it, so that "nothing relevant" comes back empty; a hit
        the words found stays whatever its similarity. Each hit's
        `similarity` is its cosine to the query (0 when the semantic leg
        did not find it), `lexical_rank` / `semantic_rank` its place in
        each leg (0: not found by it).

        Erased text is never found, nor another tenant's. Bad arguments
        raise InvalidArgument (a query with no word to look for: reason
        EMPTY_QUERY) or, for a wrong type, TypeError, before anything is
        sent where the client can tell.
        """
        request = _search_request(
            query, session_ids, subject, after, before, roles, levels, limit, mode, metadata, min_similarity
        )
        return SearchResult.from_pb(self._call(self._stub.Search, request, timeout))

    def watch(self, session_id: str, *, timeout: float | None = None) -> SessionWatch:
        """Watches the session's events: returns, once the server has
        subscribed, a `SessionWatch` generating `SessionEvent`s as segments
        and roll-ups close, are summarised, fail or are parked, ending after
        the session's erasure ("deleted").

        No replay: read `segments()` after this returns to see what happened
        before. `timeout` is the whole watch's deadline (None, the default:
        none; it ends with `DeadlineExceeded`). A session with no entry yet is
        waited for, so watching first and then appending misses nothing;
        past the server's watch caps it raises ResourceExhausted
        (`TOO_MANY_WATCHES`). Stop it with `close()` or `cancel()`, or use it
        in a `with` block:

            with client.watch("demo") as events:
                for event in events:
                    print(event.kind, event.segment and event.segment.id)
        """
        request = pb.WatchSessionRequest(session_id=session_id)
        call = self._stub.WatchSession(request, timeout=timeout, metadata=self._metadata)
        watch = SessionWatch(call)
        watch._subscribe()
        return watch


class AsyncClient(_Base):
    """The `grpc.aio` twin of `Client`: same arguments, same methods, as
    coroutines (`segments`, `sessions` and `entries` are async iterators).

    Create it inside the running event loop and use it as an async context
    manager, or `await client.disconnect()` when done.

    >>> async with AsyncClient("127.0.0.1:50051") as client:   # doctest: +SKIP
    ...     await client.append("demo", [("user", "hello")])
    """

    def __init__(
        self,
        target: str,
        token: str | None = None,
        ca_cert: str | bytes | os.PathLike[str] | None = None,
        timeout: float | None = DEFAULT_TIMEOUT,
        *,
        options: Sequence[tuple[str, Any]] | None = None,
    ) -> None:
        super().__init__(target, token, ca_cert, timeout, options=options)
        if self._credentials is None:
            self._channel = grpc.aio.insecure_channel(self.target, options=self._options)
        else:
            self._channel = grpc.aio.secure_channel(
                self.target, self._credentials, options=self._options
            )
        self._stub = pb_grpc.ArchivistStub(self._channel)

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.disconnect()

    async def disconnect(self) -> None:
        """Closes the channel; the client is unusable afterwards."""
        await self._channel.close()

    async def _call(self, method: Callable[..., Any], request: Any, timeout: float | None) -> Any:
        try:
            return await method(
                request, timeout=self._deadline(timeout), metadata=self._metadata
            )
        except grpc.RpcError as e:
            raise from_rpc_error(e) from e

    async def append(
        self,
        session_id: str,
        messages: Iterable[MessageLike],
        *,
        subject: str | None = None,
        timeout: float | None = DEFAULT,
    ) -> AppendResult:
        """Appends messages, in order, to the session; see `Client.append`."""
        request = pb.AppendEntriesRequest(
            session_id=session_id, entries=new_entries(messages), subject=subject or ""
        )
        return AppendResult.from_pb(
            await self._call(self._stub.AppendEntries, request, timeout)
        )

    async def close(
        self, session_id: str, *, wait: bool = False, timeout: float | None = DEFAULT
    ) -> Segment | None:
        """Closes the open segment, optionally waiting for its recap; see
        `Client.close`."""
        request = pb.CloseSegmentRequest(session_id=session_id, wait=wait)
        response = await self._call(self._stub.CloseSegment, request, timeout)
        return Segment.from_pb(response.segment) if response.HasField("segment") else None

    async def flush(self, session_id: str, *, timeout: float | None = DEFAULT) -> FlushResult:
        """Session wind-down; see `Client.flush`."""
        request = pb.FlushSessionRequest(session_id=session_id)
        return FlushResult.from_pb(await self._call(self._stub.FlushSession, request, timeout))

    async def context(
        self,
        session_id: str,
        *,
        max_tokens: int = 0,
        query: str | None = None,
        min_similarity: float | None = None,
        timeout: float | None = DEFAULT,
    ) -> Context:
        """Summaries and raw entries for a prompt, and with `query` what was
        recalled for it first; see `Client.context`."""
        request = _context_request(session_id, max_tokens, query, min_similarity)
        return Context.from_pb(await self._call(self._stub.GetContext, request, timeout))

    async def segment(self, segment_id: int, *, timeout: float | None = DEFAULT) -> Segment:
        """One segment; see `Client.segment`."""
        request = pb.GetSegmentRequest(segment_id=segment_id)
        return Segment.from_pb(await self._call(self._stub.GetSegment, request, timeout))

    async def segments(
        self,
        session_id: str | None = None,
        *,
        states: Iterable[str | int] | None = None,
        levels: Iterable[int] | int | None = None,
        page_size: int = 0,
        timeout: float | None = DEFAULT,
    ) -> AsyncIterator[Segment]:
        """Iterates (`async for`) over segments page by page; see
        `Client.segments`."""
        token = ""
        while True:
            request = _list_request(session_id, states, levels, page_size, token)
            page = await self._call(self._stub.ListSegments, request, timeout)
            for segment in page.segments:
                yield Segment.from_pb(segment)
            if not page.next_page_token:
                return
            token = page.next_page_token

    async def requeue(
        self,
        session_id: str | None = None,
        *,
        segment_ids: Sequence[int] | None = None,
        include_parked: bool = False,
        timeout: float | None = DEFAULT,
    ) -> int:
        """Operator: makes matching segments due now; see `Client.requeue`."""
        request = _requeue_request(session_id, segment_ids, include_parked)
        return (await self._call(self._stub.RequeueSegments, request, timeout)).requeued

    async def backlog(self, *, timeout: float | None = DEFAULT) -> Backlog:
        """Counts per state; see `Client.backlog`."""
        return Backlog.from_pb(
            await self._call(self._stub.GetBacklog, pb.GetBacklogRequest(), timeout)
        )

    async def sessions(
        self,
        *,
        subject: str | None = None,
        page_size: int = 0,
        timeout: float | None = DEFAULT,
    ) -> AsyncIterator[SessionInfo]:
        """Iterates (`async for`) over the caller's sessions page by page;
        see `Client.sessions`."""
        token = ""
        while True:
            request = pb.ListSessionsRequest(
                page_size=count_value("page_size", page_size),
                page_token=token,
                subject=subject or "",
            )
            page = await self._call(self._stub.ListSessions, request, timeout)
            for info in page.sessions:
                yield SessionInfo.from_pb(info)
            if not page.next_page_token:
                return
            token = page.next_page_token

    def entries(
        self,
        session_id: str,
        after_seq: int = 0,
        limit: int | None = None,
        *,
        page_size: int = 0,
        timeout: float | None = DEFAULT,
    ) -> AsyncIterator[Entry]:
        """Iterates (`async for`) over the session's transcript page by
        page; see `Client.entries`."""
        return self._entries(_EntryPages(session_id, after_seq, limit, page_size), timeout)

    async def _entries(self, pages: _EntryPages, timeout: float | None) -> AsyncIterator[Entry]:
        while not pages.done:
            page = await self._call(self._stub.ListEntries, pages.request(), timeout)
            for entry in pages.take(page):
                yield entry

    async def delete_session(
        self, session_id: str, *, timeout: float | None = DEFAULT
    ) -> DeleteResult:
        """Erases the session; see `Client.delete_session`."""
        request = pb.DeleteSessionRequest(session_id=session_id)
        return DeleteResult.from_pb(
            await self._call(self._stub.DeleteSession, request, timeout)
        )

    async def delete_subject(
        self, subject: str, *, timeout: float | None = DEFAULT
    ) -> DeleteSubjectResult:
        """Erases every session of the subject; see `Client.delete_subject`."""
        request = pb.DeleteSubjectRequest(subject=subject)
        return DeleteSubjectResult.from_pb(
            await self._call(self._stub.DeleteSubject, request, timeout)
        )

    async def search(
        self,
        query: str,
        *,
        session_ids: Iterable[str] | str | None = None,
        subject: str | None = None,
        after: datetime | None = None,
        before: datetime | None = None,
        roles: Iterable[str] | str | None = None,
        levels: Iterable[int] | int | None = None,
        limit: int | None = None,
        mode: str = "auto",
        metadata: Mapping[str, str] | None = None,
        min_similarity: float | None = None,
        timeout: float | None = DEFAULT,
    ) -> SearchResult:
        """Searches the caller's memory, best first; see `Client.search`."""
        request = _search_request(
            query, session_ids, subject, after, before, roles, levels, limit, mode, metadata, min_similarity
        )
        return SearchResult.from_pb(await self._call(self._stub.Search, request, timeout))

    def watch(self, session_id: str, *, timeout: float | None = None) -> AsyncSessionWatch:
        """Watches the session's events: an `AsyncSessionWatch`, an async
        iterator of `SessionEvent` ending after "deleted"; see
        `Client.watch`. Not a coroutine: `async with client.watch(s) as
        events` (or `await client.watch(s)`) waits for the subscription and
        waits for a session with no entry yet, like `Client.watch`.

            async with client.watch("demo") as events:
                async for event in events:
                    print(event.kind)
        """
        request = pb.WatchSessionRequest(session_id=session_id)
        call = self._stub.WatchSession(request, timeout=timeout, metadata=self._metadata)
        return AsyncSessionWatch(call)
