import datetime

from google.protobuf import duration_pb2 as _duration_pb2
from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Role(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ROLE_UNSPECIFIED: _ClassVar[Role]
    ROLE_USER: _ClassVar[Role]
    ROLE_ASSISTANT: _ClassVar[Role]
    ROLE_SYSTEM: _ClassVar[Role]
    ROLE_TOOL: _ClassVar[Role]

class SegmentState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SEGMENT_STATE_UNSPECIFIED: _ClassVar[SegmentState]
    SEGMENT_STATE_OPEN: _ClassVar[SegmentState]
    SEGMENT_STATE_PENDING: _ClassVar[SegmentState]
    SEGMENT_STATE_SUMMARISED: _ClassVar[SegmentState]
    SEGMENT_STATE_PARKED: _ClassVar[SegmentState]

class SessionEventKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SESSION_EVENT_KIND_UNSPECIFIED: _ClassVar[SessionEventKind]
    SESSION_EVENT_KIND_CLOSED: _ClassVar[SessionEventKind]
    SESSION_EVENT_KIND_SUMMARISED: _ClassVar[SessionEventKind]
    SESSION_EVENT_KIND_FAILED: _ClassVar[SessionEventKind]
    SESSION_EVENT_KIND_PARKED: _ClassVar[SessionEventKind]
    SESSION_EVENT_KIND_DELETED: _ClassVar[SessionEventKind]
    SESSION_EVENT_KIND_GAP: _ClassVar[SessionEventKind]

class SearchMode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SEARCH_MODE_AUTO: _ClassVar[SearchMode]
    SEARCH_MODE_LEXICAL: _ClassVar[SearchMode]
    SEARCH_MODE_SEMANTIC: _ClassVar[SearchMode]

class SearchLeg(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SEARCH_LEG_UNSPECIFIED: _ClassVar[SearchLeg]
    SEARCH_LEG_LEXICAL: _ClassVar[SearchLeg]
    SEARCH_LEG_SEMANTIC: _ClassVar[SearchLeg]
ROLE_UNSPECIFIED: Role
ROLE_USER: Role
ROLE_ASSISTANT: Role
ROLE_SYSTEM: Role
ROLE_TOOL: Role
SEGMENT_STATE_UNSPECIFIED: SegmentState
SEGMENT_STATE_OPEN: SegmentState
SEGMENT_STATE_PENDING: SegmentState
SEGMENT_STATE_SUMMARISED: SegmentState
SEGMENT_STATE_PARKED: SegmentState
SESSION_EVENT_KIND_UNSPECIFIED: SessionEventKind
SESSION_EVENT_KIND_CLOSED: SessionEventKind
SESSION_EVENT_KIND_SUMMARISED: SessionEventKind
SESSION_EVENT_KIND_FAILED: SessionEventKind
SESSION_EVENT_KIND_PARKED: SessionEventKind
SESSION_EVENT_KIND_DELETED: SessionEventKind
SESSION_EVENT_KIND_GAP: SessionEventKind
SEARCH_MODE_AUTO: SearchMode
SEARCH_MODE_LEXICAL: SearchMode
SEARCH_MODE_SEMANTIC: SearchMode
SEARCH_LEG_UNSPECIFIED: SearchLeg
SEARCH_LEG_LEXICAL: SearchLeg
SEARCH_LEG_SEMANTIC: SearchLeg

class NewEntry(_message.Message):
    __slots__ = ("client_entry_id", "role", "content", "occurred_at", "name", "metadata")
    class MetadataEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    CLIENT_ENTRY_ID_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    OCCURRED_AT_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    client_entry_id: str
    role: Role
    content: str
    occurred_at: _timestamp_pb2.Timestamp
    name: str
    metadata: _containers.ScalarMap[str, str]
    def __init__(self, client_entry_id: _Optional[str] = ..., role: _Optional[_Union[Role, str]] = ..., content: _Optional[str] = ..., occurred_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., name: _Optional[str] = ..., metadata: _Optional[_Mapping[str, str]] = ...) -> None: ...

class Entry(_message.Message):
    __slots__ = ("seq", "client_entry_id", "role", "content", "created_at", "occurred_at", "name", "metadata")
    class MetadataEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    SEQ_FIELD_NUMBER: _ClassVar[int]
    CLIENT_ENTRY_ID_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    OCCURRED_AT_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    seq: int
    client_entry_id: str
    role: Role
    content: str
    created_at: _timestamp_pb2.Timestamp
    occurred_at: _timestamp_pb2.Timestamp
    name: str
    metadata: _containers.ScalarMap[str, str]
    def __init__(self, seq: _Optional[int] = ..., client_entry_id: _Optional[str] = ..., role: _Optional[_Union[Role, str]] = ..., content: _Optional[str] = ..., created_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., occurred_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., name: _Optional[str] = ..., metadata: _Optional[_Mapping[str, str]] = ...) -> None: ...

class AppendEntriesRequest(_message.Message):
    __slots__ = ("session_id", "entries", "subject")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    SUBJECT_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    entries: _containers.RepeatedCompositeFieldContainer[NewEntry]
    subject: str
    def __init__(self, session_id: _Optional[str] = ..., entries: _Optional[_Iterable[_Union[NewEntry, _Mapping]]] = ..., subject: _Optional[str] = ...) -> None: ...

class AppendedEntry(_message.Message):
    __slots__ = ("seq", "client_entry_id", "duplicate")
    SEQ_FIELD_NUMBER: _ClassVar[int]
    CLIENT_ENTRY_ID_FIELD_NUMBER: _ClassVar[int]
    DUPLICATE_FIELD_NUMBER: _ClassVar[int]
    seq: int
    client_entry_id: str
    duplicate: bool
    def __init__(self, seq: _Optional[int] = ..., client_entry_id: _Optional[str] = ..., duplicate: _Optional[bool] = ...) -> None: ...

class AppendEntriesResponse(_message.Message):
    __slots__ = ("entries", "open_segment_id", "closed_segment_ids")
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    OPEN_SEGMENT_ID_FIELD_NUMBER: _ClassVar[int]
    CLOSED_SEGMENT_IDS_FIELD_NUMBER: _ClassVar[int]
    entries: _containers.RepeatedCompositeFieldContainer[AppendedEntry]
    open_segment_id: int
    closed_segment_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, entries: _Optional[_Iterable[_Union[AppendedEntry, _Mapping]]] = ..., open_segment_id: _Optional[int] = ..., closed_segment_ids: _Optional[_Iterable[int]] = ...) -> None: ...

class CloseSegmentRequest(_message.Message):
    __slots__ = ("session_id", "wait")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    WAIT_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    wait: bool
    def __init__(self, session_id: _Optional[str] = ..., wait: _Optional[bool] = ...) -> None: ...

class CloseSegmentResponse(_message.Message):
    __slots__ = ("segment",)
    SEGMENT_FIELD_NUMBER: _ClassVar[int]
    segment: Segment
    def __init__(self, segment: _Optional[_Union[Segment, _Mapping]] = ...) -> None: ...

class FlushSessionRequest(_message.Message):
    __slots__ = ("session_id",)
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    def __init__(self, session_id: _Optional[str] = ...) -> None: ...

class FlushSessionResponse(_message.Message):
    __slots__ = ("segments", "complete")
    SEGMENTS_FIELD_NUMBER: _ClassVar[int]
    COMPLETE_FIELD_NUMBER: _ClassVar[int]
    segments: _containers.RepeatedCompositeFieldContainer[Segment]
    complete: bool
    def __init__(self, segments: _Optional[_Iterable[_Union[Segment, _Mapping]]] = ..., complete: _Optional[bool] = ...) -> None: ...

class GetSegmentRequest(_message.Message):
    __slots__ = ("segment_id",)
    SEGMENT_ID_FIELD_NUMBER: _ClassVar[int]
    segment_id: int
    def __init__(self, segment_id: _Optional[int] = ...) -> None: ...

class Summary(_message.Message):
    __slots__ = ("text", "provider", "model", "prompt_version", "input_tokens", "output_tokens", "created_at")
    TEXT_FIELD_NUMBER: _ClassVar[int]
    PROVIDER_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    PROMPT_VERSION_FIELD_NUMBER: _ClassVar[int]
    INPUT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    text: str
    provider: str
    model: str
    prompt_version: str
    input_tokens: int
    output_tokens: int
    created_at: _timestamp_pb2.Timestamp
    def __init__(self, text: _Optional[str] = ..., provider: _Optional[str] = ..., model: _Optional[str] = ..., prompt_version: _Optional[str] = ..., input_tokens: _Optional[int] = ..., output_tokens: _Optional[int] = ..., created_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class Failure(_message.Message):
    __slots__ = ("transport", "timeout", "unavailable", "rate_limited", "quota_exhausted", "unauthorized", "unknown_model", "invalid_request", "malformed_response", "cancelled", "budget_exhausted", "store", "retryable", "causes", "attempts", "elapsed", "http_status", "provider", "model", "hint")
    class Transport(_message.Message):
        __slots__ = ()
        def __init__(self) -> None: ...
    class Timeout(_message.Message):
        __slots__ = ()
        def __init__(self) -> None: ...
    class Unavailable(_message.Message):
        __slots__ = ()
        def __init__(self) -> None: ...
    class RateLimited(_message.Message):
        __slots__ = ("retry_after",)
        RETRY_AFTER_FIELD_NUMBER: _ClassVar[int]
        retry_after: _duration_pb2.Duration
        def __init__(self, retry_after: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ...) -> None: ...
    class QuotaExhausted(_message.Message):
        __slots__ = ()
        def __init__(self) -> None: ...
    class Unauthorized(_message.Message):
        __slots__ = ()
        def __init__(self) -> None: ...
    class UnknownModel(_message.Message):
        __slots__ = ()
        def __init__(self) -> None: ...
    class InvalidRequest(_message.Message):
        __slots__ = ()
        def __init__(self) -> None: ...
    class MalformedResponse(_message.Message):
        __slots__ = ()
        def __init__(self) -> None: ...
    class Cancelled(_message.Message):
        __slots__ = ()
        def __init__(self) -> None: ...
    class BudgetExhausted(_message.Message):
        __slots__ = ()
        def __init__(self) -> None: ...
    class Store(_message.Message):
        __slots__ = ()
        def __init__(self) -> None: ...
    TRANSPORT_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_FIELD_NUMBER: _ClassVar[int]
    UNAVAILABLE_FIELD_NUMBER: _ClassVar[int]
    RATE_LIMITED_FIELD_NUMBER: _ClassVar[int]
    QUOTA_EXHAUSTED_FIELD_NUMBER: _ClassVar[int]
    UNAUTHORIZED_FIELD_NUMBER: _ClassVar[int]
    UNKNOWN_MODEL_FIELD_NUMBER: _ClassVar[int]
    INVALID_REQUEST_FIELD_NUMBER: _ClassVar[int]
    MALFORMED_RESPONSE_FIELD_NUMBER: _ClassVar[int]
    CANCELLED_FIELD_NUMBER: _ClassVar[int]
    BUDGET_EXHAUSTED_FIELD_NUMBER: _ClassVar[int]
    STORE_FIELD_NUMBER: _ClassVar[int]
    RETRYABLE_FIELD_NUMBER: _ClassVar[int]
    CAUSES_FIELD_NUMBER: _ClassVar[int]
    ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    ELAPSED_FIELD_NUMBER: _ClassVar[int]
    HTTP_STATUS_FIELD_NUMBER: _ClassVar[int]
    PROVIDER_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    HINT_FIELD_NUMBER: _ClassVar[int]
    transport: Failure.Transport
    timeout: Failure.Timeout
    unavailable: Failure.Unavailable
    rate_limited: Failure.RateLimited
    quota_exhausted: Failure.QuotaExhausted
    unauthorized: Failure.Unauthorized
    unknown_model: Failure.UnknownModel
    invalid_request: Failure.InvalidRequest
    malformed_response: Failure.MalformedResponse
    cancelled: Failure.Cancelled
    budget_exhausted: Failure.BudgetExhausted
    store: Failure.Store
    retryable: bool
    causes: _containers.RepeatedScalarFieldContainer[str]
    attempts: int
    elapsed: _duration_pb2.Duration
    http_status: int
    provider: str
    model: str
    hint: str
    def __init__(self, transport: _Optional[_Union[Failure.Transport, _Mapping]] = ..., timeout: _Optional[_Union[Failure.Timeout, _Mapping]] = ..., unavailable: _Optional[_Union[Failure.Unavailable, _Mapping]] = ..., rate_limited: _Optional[_Union[Failure.RateLimited, _Mapping]] = ..., quota_exhausted: _Optional[_Union[Failure.QuotaExhausted, _Mapping]] = ..., unauthorized: _Optional[_Union[Failure.Unauthorized, _Mapping]] = ..., unknown_model: _Optional[_Union[Failure.UnknownModel, _Mapping]] = ..., invalid_request: _Optional[_Union[Failure.InvalidRequest, _Mapping]] = ..., malformed_response: _Optional[_Union[Failure.MalformedResponse, _Mapping]] = ..., cancelled: _Optional[_Union[Failure.Cancelled, _Mapping]] = ..., budget_exhausted: _Optional[_Union[Failure.BudgetExhausted, _Mapping]] = ..., store: _Optional[_Union[Failure.Store, _Mapping]] = ..., retryable: _Optional[bool] = ..., causes: _Optional[_Iterable[str]] = ..., attempts: _Optional[int] = ..., elapsed: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., http_status: _Optional[int] = ..., provider: _Optional[str] = ..., model: _Optional[str] = ..., hint: _Optional[str] = ...) -> None: ...

class Segment(_message.Message):
    __slots__ = ("id", "session_id", "ordinal", "state", "first_seq", "last_seq", "entry_count", "summary", "attempts", "passes", "last_failure", "next_attempt_at", "closed_at", "level", "child_ids", "first_occurred_at", "last_occurred_at")
    ID_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    ORDINAL_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    FIRST_SEQ_FIELD_NUMBER: _ClassVar[int]
    LAST_SEQ_FIELD_NUMBER: _ClassVar[int]
    ENTRY_COUNT_FIELD_NUMBER: _ClassVar[int]
    SUMMARY_FIELD_NUMBER: _ClassVar[int]
    ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    PASSES_FIELD_NUMBER: _ClassVar[int]
    LAST_FAILURE_FIELD_NUMBER: _ClassVar[int]
    NEXT_ATTEMPT_AT_FIELD_NUMBER: _ClassVar[int]
    CLOSED_AT_FIELD_NUMBER: _ClassVar[int]
    LEVEL_FIELD_NUMBER: _ClassVar[int]
    CHILD_IDS_FIELD_NUMBER: _ClassVar[int]
    FIRST_OCCURRED_AT_FIELD_NUMBER: _ClassVar[int]
    LAST_OCCURRED_AT_FIELD_NUMBER: _ClassVar[int]
    id: int
    session_id: str
    ordinal: int
    state: SegmentState
    first_seq: int
    last_seq: int
    entry_count: int
    summary: Summary
    attempts: int
    passes: int
    last_failure: Failure
    next_attempt_at: _timestamp_pb2.Timestamp
    closed_at: _timestamp_pb2.Timestamp
    level: int
    child_ids: _containers.RepeatedScalarFieldContainer[int]
    first_occurred_at: _timestamp_pb2.Timestamp
    last_occurred_at: _timestamp_pb2.Timestamp
    def __init__(self, id: _Optional[int] = ..., session_id: _Optional[str] = ..., ordinal: _Optional[int] = ..., state: _Optional[_Union[SegmentState, str]] = ..., first_seq: _Optional[int] = ..., last_seq: _Optional[int] = ..., entry_count: _Optional[int] = ..., summary: _Optional[_Union[Summary, _Mapping]] = ..., attempts: _Optional[int] = ..., passes: _Optional[int] = ..., last_failure: _Optional[_Union[Failure, _Mapping]] = ..., next_attempt_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., closed_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., level: _Optional[int] = ..., child_ids: _Optional[_Iterable[int]] = ..., first_occurred_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., last_occurred_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class ListSegmentsRequest(_message.Message):
    __slots__ = ("session_id", "states", "page_size", "page_token", "levels")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    STATES_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    LEVELS_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    states: _containers.RepeatedScalarFieldContainer[SegmentState]
    page_size: int
    page_token: str
    levels: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, session_id: _Optional[str] = ..., states: _Optional[_Iterable[_Union[SegmentState, str]]] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ..., levels: _Optional[_Iterable[int]] = ...) -> None: ...

class ListSegmentsResponse(_message.Message):
    __slots__ = ("segments", "next_page_token")
    SEGMENTS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    segments: _containers.RepeatedCompositeFieldContainer[Segment]
    next_page_token: str
    def __init__(self, segments: _Optional[_Iterable[_Union[Segment, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class GetContextRequest(_message.Message):
    __slots__ = ("session_id", "max_tokens", "query", "min_similarity")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    MAX_TOKENS_FIELD_NUMBER: _ClassVar[int]
    QUERY_FIELD_NUMBER: _ClassVar[int]
    MIN_SIMILARITY_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    max_tokens: int
    query: str
    min_similarity: float
    def __init__(self, session_id: _Optional[str] = ..., max_tokens: _Optional[int] = ..., query: _Optional[str] = ..., min_similarity: _Optional[float] = ...) -> None: ...

class ContextSummary(_message.Message):
    __slots__ = ("segment_id", "first_seq", "last_seq", "summary", "level", "first_occurred_at", "last_occurred_at")
    SEGMENT_ID_FIELD_NUMBER: _ClassVar[int]
    FIRST_SEQ_FIELD_NUMBER: _ClassVar[int]
    LAST_SEQ_FIELD_NUMBER: _ClassVar[int]
    SUMMARY_FIELD_NUMBER: _ClassVar[int]
    LEVEL_FIELD_NUMBER: _ClassVar[int]
    FIRST_OCCURRED_AT_FIELD_NUMBER: _ClassVar[int]
    LAST_OCCURRED_AT_FIELD_NUMBER: _ClassVar[int]
    segment_id: int
    first_seq: int
    last_seq: int
    summary: Summary
    level: int
    first_occurred_at: _timestamp_pb2.Timestamp
    last_occurred_at: _timestamp_pb2.Timestamp
    def __init__(self, segment_id: _Optional[int] = ..., first_seq: _Optional[int] = ..., last_seq: _Optional[int] = ..., summary: _Optional[_Union[Summary, _Mapping]] = ..., level: _Optional[int] = ..., first_occurred_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., last_occurred_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class RecalledHit(_message.Message):
    __slots__ = ("session_id", "level", "first_seq", "last_seq", "name", "occurred_at", "text", "score", "segment_id", "role")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    LEVEL_FIELD_NUMBER: _ClassVar[int]
    FIRST_SEQ_FIELD_NUMBER: _ClassVar[int]
    LAST_SEQ_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    OCCURRED_AT_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    SCORE_FIELD_NUMBER: _ClassVar[int]
    SEGMENT_ID_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    level: int
    first_seq: int
    last_seq: int
    name: str
    occurred_at: _timestamp_pb2.Timestamp
    text: str
    score: float
    segment_id: int
    role: Role
    def __init__(self, session_id: _Optional[str] = ..., level: _Optional[int] = ..., first_seq: _Optional[int] = ..., last_seq: _Optional[int] = ..., name: _Optional[str] = ..., occurred_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., text: _Optional[str] = ..., score: _Optional[float] = ..., segment_id: _Optional[int] = ..., role: _Optional[_Union[Role, str]] = ...) -> None: ...

class ContextItem(_message.Message):
    __slots__ = ("summary", "entry", "recalled")
    SUMMARY_FIELD_NUMBER: _ClassVar[int]
    ENTRY_FIELD_NUMBER: _ClassVar[int]
    RECALLED_FIELD_NUMBER: _ClassVar[int]
    summary: ContextSummary
    entry: Entry
    recalled: RecalledHit
    def __init__(self, summary: _Optional[_Union[ContextSummary, _Mapping]] = ..., entry: _Optional[_Union[Entry, _Mapping]] = ..., recalled: _Optional[_Union[RecalledHit, _Mapping]] = ...) -> None: ...

class GetContextResponse(_message.Message):
    __slots__ = ("items", "truncated", "estimated_tokens")
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    ESTIMATED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    items: _containers.RepeatedCompositeFieldContainer[ContextItem]
    truncated: bool
    estimated_tokens: int
    def __init__(self, items: _Optional[_Iterable[_Union[ContextItem, _Mapping]]] = ..., truncated: _Optional[bool] = ..., estimated_tokens: _Optional[int] = ...) -> None: ...

class RequeueSegmentsRequest(_message.Message):
    __slots__ = ("session_id", "segment_ids", "include_parked")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    SEGMENT_IDS_FIELD_NUMBER: _ClassVar[int]
    INCLUDE_PARKED_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    segment_ids: _containers.RepeatedScalarFieldContainer[int]
    include_parked: bool
    def __init__(self, session_id: _Optional[str] = ..., segment_ids: _Optional[_Iterable[int]] = ..., include_parked: _Optional[bool] = ...) -> None: ...

class RequeueSegmentsResponse(_message.Message):
    __slots__ = ("requeued", "embeddings_requeued")
    REQUEUED_FIELD_NUMBER: _ClassVar[int]
    EMBEDDINGS_REQUEUED_FIELD_NUMBER: _ClassVar[int]
    requeued: int
    embeddings_requeued: int
    def __init__(self, requeued: _Optional[int] = ..., embeddings_requeued: _Optional[int] = ...) -> None: ...

class GetBacklogRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListSessionsRequest(_message.Message):
    __slots__ = ("page_size", "page_token", "subject")
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    SUBJECT_FIELD_NUMBER: _ClassVar[int]
    page_size: int
    page_token: str
    subject: str
    def __init__(self, page_size: _Optional[int] = ..., page_token: _Optional[str] = ..., subject: _Optional[str] = ...) -> None: ...

class ListSessionsResponse(_message.Message):
    __slots__ = ("sessions", "next_page_token")
    SESSIONS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    sessions: _containers.RepeatedCompositeFieldContainer[SessionInfo]
    next_page_token: str
    def __init__(self, sessions: _Optional[_Iterable[_Union[SessionInfo, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class SessionInfo(_message.Message):
    __slots__ = ("session_id", "entry_count", "last_seq", "open_segment_id", "pending", "parked", "created_at", "last_append_at", "subject")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    ENTRY_COUNT_FIELD_NUMBER: _ClassVar[int]
    LAST_SEQ_FIELD_NUMBER: _ClassVar[int]
    OPEN_SEGMENT_ID_FIELD_NUMBER: _ClassVar[int]
    PENDING_FIELD_NUMBER: _ClassVar[int]
    PARKED_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    LAST_APPEND_AT_FIELD_NUMBER: _ClassVar[int]
    SUBJECT_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    entry_count: int
    last_seq: int
    open_segment_id: int
    pending: int
    parked: int
    created_at: _timestamp_pb2.Timestamp
    last_append_at: _timestamp_pb2.Timestamp
    subject: str
    def __init__(self, session_id: _Optional[str] = ..., entry_count: _Optional[int] = ..., last_seq: _Optional[int] = ..., open_segment_id: _Optional[int] = ..., pending: _Optional[int] = ..., parked: _Optional[int] = ..., created_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., last_append_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., subject: _Optional[str] = ...) -> None: ...

class Backlog(_message.Message):
    __slots__ = ("open", "pending", "summarised", "parked", "oldest_pending_age", "parked_by_class", "erasures_pending", "embeddings", "unindexed", "oldest_unindexed_age")
    class ParkedByClassEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    OPEN_FIELD_NUMBER: _ClassVar[int]
    PENDING_FIELD_NUMBER: _ClassVar[int]
    SUMMARISED_FIELD_NUMBER: _ClassVar[int]
    PARKED_FIELD_NUMBER: _ClassVar[int]
    OLDEST_PENDING_AGE_FIELD_NUMBER: _ClassVar[int]
    PARKED_BY_CLASS_FIELD_NUMBER: _ClassVar[int]
    ERASURES_PENDING_FIELD_NUMBER: _ClassVar[int]
    EMBEDDINGS_FIELD_NUMBER: _ClassVar[int]
    UNINDEXED_FIELD_NUMBER: _ClassVar[int]
    OLDEST_UNINDEXED_AGE_FIELD_NUMBER: _ClassVar[int]
    open: int
    pending: int
    summarised: int
    parked: int
    oldest_pending_age: _duration_pb2.Duration
    parked_by_class: _containers.ScalarMap[str, int]
    erasures_pending: int
    embeddings: EmbeddingBacklog
    unindexed: int
    oldest_unindexed_age: _duration_pb2.Duration
    def __init__(self, open: _Optional[int] = ..., pending: _Optional[int] = ..., summarised: _Optional[int] = ..., parked: _Optional[int] = ..., oldest_pending_age: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., parked_by_class: _Optional[_Mapping[str, int]] = ..., erasures_pending: _Optional[int] = ..., embeddings: _Optional[_Union[EmbeddingBacklog, _Mapping]] = ..., unindexed: _Optional[int] = ..., oldest_unindexed_age: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ...) -> None: ...

class EmbeddingBacklog(_message.Message):
    __slots__ = ("pending", "parked", "parked_by_class", "embedded", "last_failure", "deferred")
    class ParkedByClassEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    PENDING_FIELD_NUMBER: _ClassVar[int]
    PARKED_FIELD_NUMBER: _ClassVar[int]
    PARKED_BY_CLASS_FIELD_NUMBER: _ClassVar[int]
    EMBEDDED_FIELD_NUMBER: _ClassVar[int]
    LAST_FAILURE_FIELD_NUMBER: _ClassVar[int]
    DEFERRED_FIELD_NUMBER: _ClassVar[int]
    pending: int
    parked: int
    parked_by_class: _containers.ScalarMap[str, int]
    embedded: int
    last_failure: Failure
    deferred: int
    def __init__(self, pending: _Optional[int] = ..., parked: _Optional[int] = ..., parked_by_class: _Optional[_Mapping[str, int]] = ..., embedded: _Optional[int] = ..., last_failure: _Optional[_Union[Failure, _Mapping]] = ..., deferred: _Optional[int] = ...) -> None: ...

class DeleteSessionRequest(_message.Message):
    __slots__ = ("session_id",)
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    def __init__(self, session_id: _Optional[str] = ...) -> None: ...

class DeleteSessionResponse(_message.Message):
    __slots__ = ("entries_deleted", "segments_deleted")
    ENTRIES_DELETED_FIELD_NUMBER: _ClassVar[int]
    SEGMENTS_DELETED_FIELD_NUMBER: _ClassVar[int]
    entries_deleted: int
    segments_deleted: int
    def __init__(self, entries_deleted: _Optional[int] = ..., segments_deleted: _Optional[int] = ...) -> None: ...

class DeleteSubjectRequest(_message.Message):
    __slots__ = ("subject",)
    SUBJECT_FIELD_NUMBER: _ClassVar[int]
    subject: str
    def __init__(self, subject: _Optional[str] = ...) -> None: ...

class DeleteSubjectResponse(_message.Message):
    __slots__ = ("sessions_deleted", "entries_deleted", "segments_deleted")
    SESSIONS_DELETED_FIELD_NUMBER: _ClassVar[int]
    ENTRIES_DELETED_FIELD_NUMBER: _ClassVar[int]
    SEGMENTS_DELETED_FIELD_NUMBER: _ClassVar[int]
    sessions_deleted: int
    entries_deleted: int
    segments_deleted: int
    def __init__(self, sessions_deleted: _Optional[int] = ..., entries_deleted: _Optional[int] = ..., segments_deleted: _Optional[int] = ...) -> None: ...

class ListEntriesRequest(_message.Message):
    __slots__ = ("session_id", "after_seq", "page_size")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    AFTER_SEQ_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    after_seq: int
    page_size: int
    def __init__(self, session_id: _Optional[str] = ..., after_seq: _Optional[int] = ..., page_size: _Optional[int] = ...) -> None: ...

class ListEntriesResponse(_message.Message):
    __slots__ = ("entries", "next_after_seq")
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    NEXT_AFTER_SEQ_FIELD_NUMBER: _ClassVar[int]
    entries: _containers.RepeatedCompositeFieldContainer[Entry]
    next_after_seq: int
    def __init__(self, entries: _Optional[_Iterable[_Union[Entry, _Mapping]]] = ..., next_after_seq: _Optional[int] = ...) -> None: ...

class WatchSessionRequest(_message.Message):
    __slots__ = ("session_id",)
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    def __init__(self, session_id: _Optional[str] = ...) -> None: ...

class SessionEvent(_message.Message):
    __slots__ = ("kind", "segment", "at", "missed")
    KIND_FIELD_NUMBER: _ClassVar[int]
    SEGMENT_FIELD_NUMBER: _ClassVar[int]
    AT_FIELD_NUMBER: _ClassVar[int]
    MISSED_FIELD_NUMBER: _ClassVar[int]
    kind: SessionEventKind
    segment: Segment
    at: _timestamp_pb2.Timestamp
    missed: int
    def __init__(self, kind: _Optional[_Union[SessionEventKind, str]] = ..., segment: _Optional[_Union[Segment, _Mapping]] = ..., at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., missed: _Optional[int] = ...) -> None: ...

class SearchRequest(_message.Message):
    __slots__ = ("query", "session_ids", "subject", "after", "before", "roles", "levels", "limit", "mode", "metadata", "min_similarity")
    class MetadataEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    QUERY_FIELD_NUMBER: _ClassVar[int]
    SESSION_IDS_FIELD_NUMBER: _ClassVar[int]
    SUBJECT_FIELD_NUMBER: _ClassVar[int]
    AFTER_FIELD_NUMBER: _ClassVar[int]
    BEFORE_FIELD_NUMBER: _ClassVar[int]
    ROLES_FIELD_NUMBER: _ClassVar[int]
    LEVELS_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    MIN_SIMILARITY_FIELD_NUMBER: _ClassVar[int]
    query: str
    session_ids: _containers.RepeatedScalarFieldContainer[str]
    subject: str
    after: _timestamp_pb2.Timestamp
    before: _timestamp_pb2.Timestamp
    roles: _containers.RepeatedScalarFieldContainer[Role]
    levels: _containers.RepeatedScalarFieldContainer[int]
    limit: int
    mode: SearchMode
    metadata: _containers.ScalarMap[str, str]
    min_similarity: float
    def __init__(self, query: _Optional[str] = ..., session_ids: _Optional[_Iterable[str]] = ..., subject: _Optional[str] = ..., after: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., before: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., roles: _Optional[_Iterable[_Union[Role, str]]] = ..., levels: _Optional[_Iterable[int]] = ..., limit: _Optional[int] = ..., mode: _Optional[_Union[SearchMode, str]] = ..., metadata: _Optional[_Mapping[str, str]] = ..., min_similarity: _Optional[float] = ...) -> None: ...

class SearchHit(_message.Message):
    __slots__ = ("session_id", "level", "first_seq", "last_seq", "segment_id", "role", "created_at", "score", "text", "legs", "name", "occurred_at", "metadata", "similarity", "lexical_rank", "semantic_rank")
    class MetadataEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    LEVEL_FIELD_NUMBER: _ClassVar[int]
    FIRST_SEQ_FIELD_NUMBER: _ClassVar[int]
    LAST_SEQ_FIELD_NUMBER: _ClassVar[int]
    SEGMENT_ID_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    SCORE_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    LEGS_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    OCCURRED_AT_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    SIMILARITY_FIELD_NUMBER: _ClassVar[int]
    LEXICAL_RANK_FIELD_NUMBER: _ClassVar[int]
    SEMANTIC_RANK_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    level: int
    first_seq: int
    last_seq: int
    segment_id: int
    role: Role
    created_at: _timestamp_pb2.Timestamp
    score: float
    text: str
    legs: _containers.RepeatedScalarFieldContainer[SearchLeg]
    name: str
    occurred_at: _timestamp_pb2.Timestamp
    metadata: _containers.ScalarMap[str, str]
    similarity: float
    lexical_rank: int
    semantic_rank: int
    def __init__(self, session_id: _Optional[str] = ..., level: _Optional[int] = ..., first_seq: _Optional[int] = ..., last_seq: _Optional[int] = ..., segment_id: _Optional[int] = ..., role: _Optional[_Union[Role, str]] = ..., created_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., score: _Optional[float] = ..., text: _Optional[str] = ..., legs: _Optional[_Iterable[_Union[SearchLeg, str]]] = ..., name: _Optional[str] = ..., occurred_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., metadata: _Optional[_Mapping[str, str]] = ..., similarity: _Optional[float] = ..., lexical_rank: _Optional[int] = ..., semantic_rank: _Optional[int] = ...) -> None: ...

class SearchResponse(_message.Message):
    __slots__ = ("hits", "legs", "embedded_share")
    HITS_FIELD_NUMBER: _ClassVar[int]
    LEGS_FIELD_NUMBER: _ClassVar[int]
    EMBEDDED_SHARE_FIELD_NUMBER: _ClassVar[int]
    hits: _containers.RepeatedCompositeFieldContainer[SearchHit]
    legs: _containers.RepeatedScalarFieldContainer[SearchLeg]
    embedded_share: float
    def __init__(self, hits: _Optional[_Iterable[_Union[SearchHit, _Mapping]]] = ..., legs: _Optional[_Iterable[_Union[SearchLeg, str]]] = ..., embedded_share: _Optional[float] = ...) -> None: ...
