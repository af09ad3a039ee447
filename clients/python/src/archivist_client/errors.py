"""Errors: every failed call raises an `ArchivistError` subclass.

The server sends the rich error model: a `google.rpc.Status` in the
`grpc-status-details-bin` trailer, with `ErrorInfo` (domain "archivist", an
UPPER_SNAKE reason, metadata), `BadRequest` field violations for bad input,
`RetryInfo` where a wait makes sense, `DebugInfo` whose stack entries are the
cause chain, and an `archivist.v1.Failure` where a status carries one.
A recap that fails is no call's error: its Failure is the segment's
`last_failure` (what `Client.close(wait=True)` returns). `from_rpc_error`
decodes all of them with the standard `google.rpc` types; an error that did
not come from archivist (the server unreachable, the deadline passed on the
client) has the gRPC code and message and empty details.

The subclass follows the status code, so `except archivist_client.NotFound`
works; `reason` tells finer cases apart (`SESSION_NOT_FOUND`,
`SEGMENT_NOT_FOUND`, ...; docs/errors.md lists them).
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import timedelta
from typing import TYPE_CHECKING, Any, NamedTuple

import grpc
from google.protobuf.any_pb2 import Any as AnyPb
from google.rpc import error_details_pb2, status_pb2

from .v1 import archivist_pb2 as pb

if TYPE_CHECKING:
    # Imported where used: `types` raises InvalidArgument from here.
    from .types import Failure

__all__ = [
    "AlreadyExists",
    "ArchivistError",
    "Cancelled",
    "DeadlineExceeded",
    "FailedPrecondition",
    "Internal",
    "InvalidArgument",
    "NotFound",
    "PermissionDenied",
    "ResourceExhausted",
    "Unauthenticated",
    "Unavailable",
    "Violation",
    "from_rpc_error",
]

DETAILS_TRAILER = "grpc-status-details-bin"


class Violation(NamedTuple):
    """One bad field of a request (from `google.rpc.BadRequest`)."""

    field: str
    description: str


class ArchivistError(Exception):
    """A call to archivist failed.

    Attributes:
        code: the gRPC status code (`grpc.StatusCode`).
        message: the status message.
        reason: ErrorInfo's UPPER_SNAKE reason ("" when the server sent none).
        domain: ErrorInfo's domain ("archivist" for the server's own errors).
        metadata: ErrorInfo's metadata (`segment_id`, `attempts`,
            `http_status`, `provider`, `model`, ... as strings).
        causes: the cause chain from DebugInfo, outermost first, down to the
            root cause (or the Failure's causes, when only it came).
        retry_after: RetryInfo's delay, when a retry after a wait makes sense.
        violations: BadRequest's field violations as (field, description).
        failure: the decoded `archivist.v1.Failure`, when the status carries
            one (a failed recap is the segment's `last_failure` instead).
        details: every detail unpacked, including kinds not surfaced above.
    """

    code: grpc.StatusCode
    message: str
    reason: str
    domain: str
    metadata: dict[str, str]
    causes: list[str]
    retry_after: timedelta | None
    violations: list[Violation]
    failure: Failure | None
    details: list[Any]

    def __init__(
        self,
        code: grpc.StatusCode,
        message: str,
        *,
        reason: str = "",
        domain: str = "",
        metadata: dict[str, str] | None = None,
        causes: list[str] | None = None,
        retry_after: timedelta | None = None,
        violations: list[Violation] | None = None,
        failure: Failure | None = None,
        details: list[Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.reason = reason
        self.domain = domain
        self.metadata = dict(metadata or {})
        self.causes = list(causes or [])
        self.retry_after = retry_after
        self.violations = list(violations or [])
        self.failure = failure
        self.details = list(details or [])

    def __str__(self) -> str:
        reason = f" [{self.reason}]" if self.reason else ""
        return f"{self.code.name}{reason}: {self.message}"

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(code={self.code.name}, reason={self.reason!r}, "
            f"message={self.message!r})"
        )

    def __reduce__(self) -> Any:
        # Pickles (e.g. across a process pool) without the raw details.
        return (
            _rebuild,
            (
                type(self),
                self.code.name,
                self.message,
                {
                    "reason": self.reason,
                    "domain": self.domain,
                    "metadata": self.metadata,
                    "causes": self.causes,
                    "retry_after": self.retry_after,
                    "violations": self.violations,
                    "failure": self.failure,
                },
            ),
        )


def _rebuild(cls: type, code: str, message: str, kwargs: dict[str, Any]) -> Any:
    return cls(grpc.StatusCode[code], message, **kwargs)


class Cancelled(ArchivistError):
    """CANCELLED: the call was cancelled."""


class InvalidArgument(ArchivistError, ValueError):
    """INVALID_ARGUMENT: bad input; `violations` names every bad field.

    The client raises it itself, before anything is sent, for an argument
    it can tell is bad (an unknown role, a negative `max_tokens`): then
    `domain` is "" and `reason` the one the server would give, or
    "INVALID_ARGUMENT". It is a ValueError too."""


def invalid_argument(
    field: str, description: str, reason: str = "INVALID_ARGUMENT"
) -> InvalidArgument:
    """The InvalidArgument raised before a call is sent, for one bad field."""
    return InvalidArgument(
        grpc.StatusCode.INVALID_ARGUMENT,
        f"{field}: {description}",
        reason=reason,
        violations=[Violation(field, description)],
    )


class DeadlineExceeded(ArchivistError):
    """DEADLINE_EXCEEDED: the call's deadline passed, or its request did not
    arrive whole in time."""


class NotFound(ArchivistError):
    """NOT_FOUND: no such session or segment (for this tenant)."""


class AlreadyExists(ArchivistError):
    """ALREADY_EXISTS."""


class PermissionDenied(ArchivistError):
    """PERMISSION_DENIED."""


class ResourceExhausted(ArchivistError):
    """RESOURCE_EXHAUSTED: the server shedding load (see `retry_after`), a
    message too large, or the tenant's storage full."""


class FailedPrecondition(ArchivistError):
    """FAILED_PRECONDITION: the call cannot be done in the state things are in."""


class Internal(ArchivistError):
    """INTERNAL: a server fault; `causes` has the chain."""


class Unavailable(ArchivistError):
    """UNAVAILABLE: the server or its storage cannot be reached now; a
    retry may succeed (docs/errors.md says which calls are safe to retry)."""


class Unauthenticated(ArchivistError):
    """UNAUTHENTICATED: no bearer token, or one no tenant has."""


_BY_CODE: dict[grpc.StatusCode, type[ArchivistError]] = {
    grpc.StatusCode.CANCELLED: Cancelled,
    grpc.StatusCode.INVALID_ARGUMENT: InvalidArgument,
    grpc.StatusCode.DEADLINE_EXCEEDED: DeadlineExceeded,
    grpc.StatusCode.NOT_FOUND: NotFound,
    grpc.StatusCode.ALREADY_EXISTS: AlreadyExists,
    grpc.StatusCode.PERMISSION_DENIED: PermissionDenied,
    grpc.StatusCode.RESOURCE_EXHAUSTED: ResourceExhausted,
    grpc.StatusCode.FAILED_PRECONDITION: FailedPrecondition,
    grpc.StatusCode.INTERNAL: Internal,
    grpc.StatusCode.UNAVAILABLE: Unavailable,
    grpc.StatusCode.UNAUTHENTICATED: Unauthenticated,
}


def error_class(code: grpc.StatusCode) -> type[ArchivistError]:
    """The subclass raised for `code` (ArchivistError itself for codes the
    server does not use, such as UNKNOWN or UNIMPLEMENTED)."""
    return _BY_CODE.get(code, ArchivistError)


def _unpack(detail: AnyPb) -> Any:
    for kind in (
        error_details_pb2.ErrorInfo,
        error_details_pb2.BadRequest,
        error_details_pb2.RetryInfo,
        error_details_pb2.DebugInfo,
        error_details_pb2.QuotaFailure,
        error_details_pb2.PreconditionFailure,
        error_details_pb2.ResourceInfo,
        error_details_pb2.Help,
        error_details_pb2.LocalizedMessage,
        error_details_pb2.RequestInfo,
        pb.Failure,
    ):
        if detail.Is(kind.DESCRIPTOR):
            message = kind()
            detail.Unpack(message)
            return message
    return detail  # an unknown kind stays packed


def _status_details(trailers: Iterable[tuple[str, Any]] | None) -> status_pb2.Status | None:
    for key, value in trailers or ():
        if key == DETAILS_TRAILER and isinstance(value, bytes):
            try:
                return status_pb2.Status.FromString(value)
            except Exception:  # a malformed trailer is no reason to lose the error
                return None
    return None


def from_status(
    code: grpc.StatusCode,
    message: str,
    status: status_pb2.Status | None,
) -> ArchivistError:
    """Builds the error for a status code, message and decoded details."""
    kwargs: dict[str, Any] = {}
    details = [_unpack(d) for d in status.details] if status is not None else []
    debug_causes: list[str] | None = None
    for detail in details:
        if isinstance(detail, error_details_pb2.ErrorInfo):
            kwargs["reason"] = detail.reason
            kwargs["domain"] = detail.domain
            kwargs["metadata"] = dict(detail.metadata)
        elif isinstance(detail, error_details_pb2.BadRequest):
            kwargs["violations"] = [
                Violation(v.field, v.description) for v in detail.field_violations
            ]
        elif isinstance(detail, error_details_pb2.RetryInfo):
            if detail.HasField("retry_delay"):
                kwargs["retry_after"] = detail.retry_delay.ToTimedelta()
        elif isinstance(detail, error_details_pb2.DebugInfo):
            debug_causes = list(detail.stack_entries)
        elif isinstance(detail, pb.Failure):
            from .types import Failure

            kwargs["failure"] = Failure.from_pb(detail)
    failure: Failure | None = kwargs.get("failure")
    if debug_causes is not None:
        kwargs["causes"] = debug_causes
    elif failure is not None:
        kwargs["causes"] = list(failure.causes)
    if "retry_after" not in kwargs and failure is not None and failure.retry_after:
        kwargs["retry_after"] = failure.retry_after
    if not message and status is not None:
        message = status.message
    return error_class(code)(code, message, details=details, **kwargs)


def from_rpc_error(error: grpc.RpcError) -> ArchivistError:
    """Converts a `grpc.RpcError` (sync or `grpc.aio`) into an ArchivistError."""
    code_of = getattr(error, "code", None)
    code = code_of() if callable(code_of) else None
    if not isinstance(code, grpc.StatusCode):
        code = grpc.StatusCode.UNKNOWN
    details_of = getattr(error, "details", None)
    message = details_of() if callable(details_of) else None
    trailers_of = getattr(error, "trailing_metadata", None)
    trailers = trailers_of() if callable(trailers_of) else None
    return from_status(code, message or str(error), _status_details(trailers))
