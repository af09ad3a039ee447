"""Python client for archivist, the memory summarisation service for LLM agents.

    from archivist_client import Client

    with Client("127.0.0.1:50051") as client:
        client.append("demo", [("user", "The deploy failed."), ("assistant", "Rerunning it.")])
        client.close("demo", wait=True)
        for item in client.context("demo").items:
            print(item.kind, item.text if item.kind == "summary" else item.content)

Layout: `client` (Client, AsyncClient, and the SessionWatch and
AsyncSessionWatch that `watch` returns), `types` (the result dataclasses),
`errors` (ArchivistError and one subclass per status code), `langchain`
(a LangChain chat message history and retriever; needs the `langchain`
extra), and `v1` (the generated protobuf and gRPC stubs, made by
generate.py).
"""

from .client import DEFAULT_TIMEOUT, AsyncClient, AsyncSessionWatch, Client, SessionWatch
from .errors import (
    AlreadyExists,
    ArchivistError,
    Cancelled,
    DeadlineExceeded,
    FailedPrecondition,
    Internal,
    InvalidArgument,
    NotFound,
    PermissionDenied,
    ResourceExhausted,
    Unauthenticated,
    Unavailable,
    Violation,
)
from .types import (
    AppendedEntry,
    AppendResult,
    Backlog,
    Context,
    ContextItem,
    ContextSummary,
    DeleteResult,
    DeleteSubjectResult,
    Entry,
    Failure,
    FlushResult,
    MessageLike,
    RecalledHit,
    SearchHit,
    SearchResult,
    Segment,
    SessionEvent,
    SessionInfo,
    Summary,
)

__version__ = "0.1.0"

__all__ = [
    "DEFAULT_TIMEOUT",
    "AlreadyExists",
    "AppendResult",
    "AppendedEntry",
    "ArchivistError",
    "AsyncClient",
    "AsyncSessionWatch",
    "Backlog",
    "Cancelled",
    "Client",
    "Context",
    "ContextItem",
    "ContextSummary",
    "DeadlineExceeded",
    "DeleteResult",
    "DeleteSubjectResult",
    "Entry",
    "FailedPrecondition",
    "Failure",
    "FlushResult",
    "Internal",
    "InvalidArgument",
    "MessageLike",
    "NotFound",
    "PermissionDenied",
    "ResourceExhausted",
    "RecalledHit",
    "SearchHit",
    "SearchResult",
    "Segment",
    "SessionEvent",
    "SessionInfo",
    "SessionWatch",
    "Summary",
    "Unauthenticated",
    "Unavailable",
    "Violation",
]
