"""Decoding of the rich error model, without a server: every status code's
class, every detail kind, and a trailer that cannot be decoded."""

from __future__ import annotations

import pickle
from datetime import timedelta

import grpc
import pytest
from google.protobuf.any_pb2 import Any as AnyPb
from google.rpc import error_details_pb2, status_pb2

import archivist_client as ac
from archivist_client.errors import from_rpc_error
from archivist_client.v1 import archivist_pb2 as pb


class FakeRpcError(grpc.RpcError):
    """What grpc raises: an RpcError that is also a Call."""

    def __init__(self, code, message, trailers=()):
        self._code, self._message, self._trailers = code, message, trailers

    def code(self):
        return self._code

    def details(self):
        return self._message

    def trailing_metadata(self):
        return self._trailers


def packed(*messages) -> bytes:
    status = status_pb2.Status(code=14, message="from the status")
    for message in messages:
        detail = AnyPb()
        detail.Pack(message)
        status.details.append(detail)
    return status.SerializeToString()


@pytest.mark.parametrize(
    ("code", "cls"),
    [
        (grpc.StatusCode.CANCELLED, ac.Cancelled),
        (grpc.StatusCode.INVALID_ARGUMENT, ac.InvalidArgument),
        (grpc.StatusCode.DEADLINE_EXCEEDED, ac.DeadlineExceeded),
        (grpc.StatusCode.NOT_FOUND, ac.NotFound),
        (grpc.StatusCode.ALREADY_EXISTS, ac.AlreadyExists),
        (grpc.StatusCode.PERMISSION_DENIED, ac.PermissionDenied),
        (grpc.StatusCode.RESOURCE_EXHAUSTED, ac.ResourceExhausted),
        (grpc.StatusCode.FAILED_PRECONDITION, ac.FailedPrecondition),
        (grpc.StatusCode.INTERNAL, ac.Internal),
        (grpc.StatusCode.UNAVAILABLE, ac.Unavailable),
        (grpc.StatusCode.UNAUTHENTICATED, ac.Unauthenticated),
        (grpc.StatusCode.UNKNOWN, ac.ArchivistError),
        (grpc.StatusCode.UNIMPLEMENTED, ac.ArchivistError),
    ],
)
def test_each_code_has_its_class(code, cls) -> None:
    err = from_rpc_error(FakeRpcError(code, "it failed"))
    assert type(err) is cls
    assert (err.code, err.message, err.reason, err.causes, err.failure) == (
        code, "it failed", "", [], None,
    )
    assert str(err) == f"{code.name}: it failed"


def test_every_detail_is_decoded() -> None:
    failure = pb.Failure(retryable=True, causes=["outer", "root"], attempts=2,
                         provider="openai", model="m", http_status=429)
    failure.rate_limited.retry_after.FromTimedelta(timedelta(seconds=7))
    failure.elapsed.FromTimedelta(timedelta(milliseconds=250))
    info = error_details_pb2.ErrorInfo(reason="RATE_LIMITED", domain="archivist",
                                       metadata={"attempts": "2"})
    retry = error_details_pb2.RetryInfo()
    retry.retry_delay.FromTimedelta(timedelta(seconds=7))
    debug = error_details_pb2.DebugInfo(stack_entries=["outer", "middle", "root"])
    bad = error_details_pb2.BadRequest(field_violations=[
        error_details_pb2.BadRequest.FieldViolation(field="session_id", description="bad")
    ])
    trailers = (("other", "x"), ("grpc-status-details-bin", packed(failure, info, retry, debug, bad)))
    err = from_rpc_error(FakeRpcError(grpc.StatusCode.RESOURCE_EXHAUSTED, "limited", trailers))

    assert isinstance(err, ac.ResourceExhausted)
    assert (err.reason, err.domain, err.metadata) == ("RATE_LIMITED", "archivist", {"attempts": "2"})
    assert err.retry_after == timedelta(seconds=7)
    assert err.causes == ["outer", "middle", "root"]  # DebugInfo wins
    assert err.violations == [("session_id", "bad")]
    assert err.violations[0].field == "session_id"
    f = err.failure
    assert f is not None
    assert (f.kind, f.retryable, f.causes, f.attempts, f.http_status, f.provider, f.model) == (
        "rate_limited", True, ["outer", "root"], 2, 429, "openai", "m",
    )
    assert f.retry_after == timedelta(seconds=7)
    assert f.elapsed == timedelta(milliseconds=250)
    assert len(err.details) == 5

    copy = pickle.loads(pickle.dumps(err))
    assert type(copy) is ac.ResourceExhausted
    assert (copy.code, copy.reason, copy.causes, copy.failure.kind) == (
        err.code, "RATE_LIMITED", err.causes, "rate_limited",
    )


def test_failure_causes_stand_in_when_there_is_no_debug_info() -> None:
    failure = pb.Failure(causes=["outer", "root"])
    failure.transport.SetInParent()
    trailers = (("grpc-status-details-bin", packed(failure)),)
    err = from_rpc_error(FakeRpcError(grpc.StatusCode.UNAVAILABLE, "down", trailers))
    assert err.causes == ["outer", "root"]
    assert err.failure is not None and err.failure.http_status is None


def test_an_undecodable_trailer_keeps_the_error() -> None:
    trailers = (("grpc-status-details-bin", b"\xff\xff not a status"),)
    err = from_rpc_error(FakeRpcError(grpc.StatusCode.INTERNAL, "boom", trailers))
    assert isinstance(err, ac.Internal) and err.message == "boom" and err.details == []
