"""`Client` (blocking) and `AsyncClient` (`grpc.aio`) for archivist.v1.

Both take the same arguments and have the same methods; the async ones are
coroutines and `AsyncClient.segments` is an async iterator. Every failed
call raises an `ArchivistError` subclass (see `archivist_client.errors`).
Nothing here retries: the server's recap passes do that, bounded, and a
caller that wants to retry a call decides for itself (`err.retry_after`,
`err.failure.retryable`).
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterable, Iterator, Sequence
from typing import Any, Callable, TypeVar, cast

import grpc
import grpc.aio

from .errors import from_rpc_error
from .types import (
    AppendResult,
    Backlog,
    Context,
    FlushResult,
    MessageLike,
    Segment,
    new_entries,
    state_value,
)
from .v1 import archivist_pb2 as pb
from .v1 import archivist_pb2_grpc as pb_grpc

__all__ = ["AsyncClient", "Client", "DEFAULT_TIMEOUT"]

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


def _list_request(
    session_id: str | None,
    states: Iterable[str | int] | None,
    page_size: int,
    page_token: str,
) -> pb.ListSegmentsRequest:
    if isinstance(states, str):
        states = [states]
    return pb.ListSegmentsRequest(
        session_id=session_id or "",
        states=[cast("pb.SegmentState", state_value(s)) for s in states or ()],
        page_size=page_size,
        page_token=page_token,
    )


def _requeue_request(
    session_id: str | None, segment_ids: Sequence[int] | None, include_parked: bool
) -> pb.RequeueSegmentsRequest:
    return pb.RequeueSegmentsRequest(
        session_id=session_id or "",
        segment_ids=list(segment_ids or ()),
        include_parked=include_parked,
    )


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
        timeout: float | None = DEFAULT,
    ) -> AppendResult:
        """Appends messages, in order, to the session (creating it as needed).

        Each message is a `(role, content)` pair or a dict with `role`,
        `content` and an optional `client_entry_id` (idempotency key, unique
        per session: a key stored before is not stored again, and its entry
        comes back with its original seq and `duplicate=True`). Roles are
        "user", "assistant", "system" and "tool".

        Raises InvalidArgument (bad session id, no messages, empty or
        oversized content, ...) with `violations` naming each bad field.
        """
        request = pb.AppendEntriesRequest(
            session_id=session_id, entries=new_entries(messages)
        )
        return AppendResult.from_pb(self._call(self._stub.AppendEntries, request, timeout))

    def close(
        self, session_id: str, *, wait: bool = False, timeout: float | None = DEFAULT
    ) -> Segment | None:
        """Closes the session's open segment and schedules its recap.

        Returns the closed segment, or None when nothing was open. With
        `wait=True` it returns once the recap pass ends (or shortly before
        the deadline); a failed recap raises the error for its failure class
        with `failure` set, and the segment stays closed.
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
        self, session_id: str, *, max_tokens: int = 0, timeout: float | None = DEFAULT
    ) -> Context:
        """What an agent puts in its prompt: summaries where segments have
        one, raw entries elsewhere, oldest first, the oldest dropped to fit
        `max_tokens` (0: the server's cap; `truncated` says something was
        dropped)."""
        request = pb.GetContextRequest(session_id=session_id, max_tokens=max_tokens)
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
        page_size: int = 0,
        timeout: float | None = DEFAULT,
    ) -> Iterator[Segment]:
        """Iterates over segments in ordinal order, one page at a time.

        `session_id` None means every session of the caller; `states`
        (e.g. ["pending", "parked"]) filters; `page_size` 0 is the server's
        default (50). Each page is fetched when the previous one is used up,
        each with its own deadline.
        """
        token = ""
        while True:
            request = _list_request(session_id, states, page_size, token)
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


class AsyncClient(_Base):
    """The `grpc.aio` twin of `Client`: same arguments, same methods, as
    coroutines (`segments` is an async iterator).

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
        timeout: float | None = DEFAULT,
    ) -> AppendResult:
        """Appends messages, in order, to the session; see `Client.append`."""
        request = pb.AppendEntriesRequest(
            session_id=session_id, entries=new_entries(messages)
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
        self, session_id: str, *, max_tokens: int = 0, timeout: float | None = DEFAULT
    ) -> Context:
        """Summaries and raw entries for a prompt; see `Client.context`."""
        request = pb.GetContextRequest(session_id=session_id, max_tokens=max_tokens)
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
        page_size: int = 0,
        timeout: float | None = DEFAULT,
    ) -> AsyncIterator[Segment]:
        """Iterates (`async for`) over segments page by page; see
        `Client.segments`."""
        token = ""
        while True:
            request = _list_request(session_id, states, page_size, token)
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
