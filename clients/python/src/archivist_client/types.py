"""Plain result types of the client, converted from the wire messages.

Every type here is a frozen dataclass built from one `archivist.v1` message;
its `raw` field keeps that message for anything this layer does not surface.
Roles and states are lower-case strings ("user", "pending", ...), durations
are `datetime.timedelta`, instants are timezone-aware `datetime` in UTC, and
a field the server left unset is `None`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any, Literal, Union, cast

from google.protobuf.duration_pb2 import Duration
from google.protobuf.message import Message
from google.protobuf.timestamp_pb2 import Timestamp

from .errors import invalid_argument
from .v1 import archivist_pb2 as pb

__all__ = [
    "AppendResult",
    "AppendedEntry",
    "Backlog",
    "Context",
    "ContextItem",
    "ContextSummary",
    "DeleteResult",
    "EVENT_KINDS",
    "Entry",
    "Failure",
    "FlushResult",
    "MessageLike",
    "ROLES",
    "RecalledHit",
    "STATES",
    "SEARCH_MODES",
    "SearchHit",
    "SearchResult",
    "Segment",
    "SessionEvent",
    "SessionInfo",
    "Summary",
]

#: Roles an entry may have, as the client spells them.
ROLES: tuple[str, ...] = ("user", "assistant", "system", "tool")
#: Segment states, as the client spells them.
STATES: tuple[str, ...] = ("open", "pending", "summarised", "parked")
#: Search modes (`search(mode=...)`), as the client spells them.
SEARCH_MODES: tuple[str, ...] = ("auto", "lexical", "semantic")
#: Session event kinds (`SessionEvent.kind`), as the client spells them.
EVENT_KINDS: tuple[str, ...] = ("closed", "summarised", "failed", "parked", "deleted", "gap")

#: One message for `append`: a `(role, content)` pair, or a mapping with
#: `role`, `content` and optionally `client_entry_id` (an idempotency key,
#: unique per session: an entry whose key was stored before is not stored
#: again, and its original seq is returned).
MessageLike = Union[tuple[str, str], Mapping[str, Any]]


def _ts(message: Message, name: str) -> datetime | None:
    if not message.HasField(name):
        return None
    value: Timestamp = getattr(message, name)
    return value.ToDatetime(tzinfo=timezone.utc)


def _dur(message: Message, name: str) -> timedelta | None:
    if not message.HasField(name):
        return None
    value: Duration = getattr(message, name)
    return value.ToTimedelta()


def _enum_name(enum: Any, value: int, prefix: str) -> str:
    try:
        return str(enum.Name(value)).removeprefix(prefix).lower()
    except ValueError:
        # A value newer than these stubs: say so rather than fail.
        return f"unknown({value})"


def role_name(value: int) -> str:
    return _enum_name(pb.Role, value, "ROLE_")


def state_name(value: int) -> str:
    return _enum_name(pb.SegmentState, value, "SEGMENT_STATE_")


def event_kind_name(value: int) -> str:
    return _enum_name(pb.SessionEventKind, value, "SESSION_EVENT_KIND_")


def leg_name(value: int) -> str:
    return _enum_name(pb.SearchLeg, value, "SEARCH_LEG_")


def _level(value: int) -> int:
    # A server older than the memory tree sends no level: its segments are
    # all segments of entries, level 1.
    return value or 1


def role_value(role: str, field: str = "role") -> int:
    """The wire value of a role name ("user", "assistant", "system", "tool");
    InvalidArgument for any other."""
    if not isinstance(role, str) or role.lower() not in ROLES:
        raise invalid_argument(
            field, f"role must be one of {', '.join(ROLES)}; got {role!r}", "INVALID_ROLE"
        )
    return int(pb.Role.Value("ROLE_" + role.upper()))


def state_value(state: str | int) -> int:
    """The wire value of a segment state name ("open", "pending", ...);
    InvalidArgument for any other."""
    if isinstance(state, int):
        return state
    if not isinstance(state, str) or state.lower() not in STATES:
        raise invalid_argument(
            "states", f"state must be one of {', '.join(STATES)}; got {state!r}", "UNKNOWN_STATE"
        )
    return int(pb.SegmentState.Value("SEGMENT_STATE_" + state.upper()))


def count_value(field: str, value: int, bits: int = 32) -> int:
    """A count or position sent as an unsigned field (`max_tokens`,
    `page_size`, `after_seq`); InvalidArgument unless an int that fits."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2**bits:
        raise invalid_argument(field, f"must be an int from 0 to {2**bits - 1}; got {value!r}")
    return value


def new_entries(messages: Iterable[MessageLike]) -> list[pb.NewEntry]:
    """Wire entries from `(role, content)` pairs or mappings."""
    if isinstance(messages, (str, bytes)) or isinstance(messages, Mapping):
        raise TypeError(
            "messages must be a list of (role, content) pairs or dicts, "
            "not a single message"
        )
    entries = []
    for i, message in enumerate(messages):
        client_entry_id = ""
        name: Any = ""
        occurred_at: Any = None
        metadata: Any = None
        if isinstance(message, Mapping):
            unknown = set(message) - {
                "role",
                "content",
                "client_entry_id",
                "name",
                "occurred_at",
                "metadata",
            }
            if unknown:
                raise invalid_argument(
                    f"entries[{i}]", f"unknown keys: {', '.join(sorted(unknown))}"
                )
            try:
                role, content = message["role"], message["content"]
            except KeyError as missing:
                raise invalid_argument(f"entries[{i}]", f"no {missing.args[0]!r}") from None
            client_entry_id = message.get("client_entry_id") or ""
            name = message.get("name") or ""
            occurred_at = message.get("occurred_at")
            metadata = message.get("metadata")
        elif isinstance(message, tuple) and len(message) == 2:
            role, content = message
        else:
            raise TypeError(
                f"messages[{i}] must be a (role, content) pair or a dict; "
                f"got {type(message).__name__}"
            )
        if not isinstance(content, str):
            raise TypeError(f"messages[{i}].content must be str")
        if not isinstance(client_entry_id, str):
            raise TypeError(f"messages[{i}].client_entry_id must be str")
        if not isinstance(name, str):
            raise TypeError(f"messages[{i}].name must be str")
        if metadata is not None and not (
            isinstance(metadata, Mapping)
            and all(isinstance(k, str) and isinstance(v, str) for k, v in metadata.items())
        ):
            raise TypeError(f"messages[{i}].metadata must be a dict of str to str")
        role_wire = role_value(role, f"entries[{i}].role")
        entry = pb.NewEntry(
            client_entry_id=client_entry_id,
            role=cast("pb.Role", role_wire),
            content=content,
            name=name,
            metadata=dict(metadata or {}),
        )
        if occurred_at is not None:
            entry.occurred_at.CopyFrom(_timestamp(occurred_at, f"entries[{i}].occurred_at"))
        entries.append(entry)
    return entries


def _timestamp(value: Any, field_name: str) -> Timestamp:
    """A wire timestamp from a datetime (naive: UTC) or an RFC 3339 string."""
    if isinstance(value, str):
        try:
            value = datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            raise invalid_argument(
                field_name, f"not an RFC 3339 time: {value!r}", "INVALID_TIMESTAMP"
            ) from None
    if not isinstance(value, datetime):
        raise TypeError(f"{field_name} must be a datetime or an RFC 3339 string")
    if value.tzinfo is None:
        value = value.replace(tzinfo=timezone.utc)
    ts = Timestamp()
    ts.FromDatetime(value.astimezone(timezone.utc))
    return ts


@dataclass(frozen=True)
class Failure:
    """Why a recap pass failed (`archivist.v1.Failure`).

    `kind` is the failure class: "transport", "timeout", "unavailable",
    "rate_limited", "quota_exhausted", "unauthorized", "unknown_model",
    "invalid_request", "malformed_response", "cancelled", "budget_exhausted"
    or "store". `causes` is the cause chain, outermost first, down to
    the root. `retry_after` is set for "rate_limited" when the provider said
    how long to wait. `hint` says what most likely fixes it, for a person
    (empty from servers that do not send one).
    """

    kind: str
    retryable: bool
    causes: list[str]
    attempts: int
    elapsed: timedelta | None
    http_status: int | None
    retry_after: timedelta | None
    provider: str
    model: str
    raw: pb.Failure = field(repr=False, compare=False)
    hint: str = ""

    @classmethod
    def from_pb(cls, failure: pb.Failure) -> Failure:
        kind = failure.WhichOneof("kind") or "unknown"
        retry_after = None
        if kind == "rate_limited":
            retry_after = _dur(failure.rate_limited, "retry_after")
        return cls(
            kind=kind,
            retryable=failure.retryable,
            causes=list(failure.causes),
            attempts=failure.attempts,
            elapsed=_dur(failure, "elapsed"),
            http_status=failure.http_status if failure.HasField("http_status") else None,
            retry_after=retry_after,
            provider=failure.provider,
            model=failure.model,
            raw=failure,
            hint=failure.hint,
        )


@dataclass(frozen=True)
class Summary:
    """A segment's recap and what wrote it."""

    text: str
    provider: str
    model: str
    prompt_version: str
    input_tokens: int
    output_tokens: int
    created_at: datetime | None
    raw: pb.Summary = field(repr=False, compare=False)

    @classmethod
    def from_pb(cls, summary: pb.Summary) -> Summary:
        return cls(
            text=summary.text,
            provider=summary.provider,
            model=summary.model,
            prompt_version=summary.prompt_version,
            input_tokens=summary.input_tokens,
            output_tokens=summary.output_tokens,
            created_at=_ts(summary, "created_at"),
            raw=summary,
        )


@dataclass(frozen=True)
class Segment:
    """A node of a session's memory tree: its state, and its recap if it
    has one.

    At `level` 1 it is a segment, a run of the session's entries; at level
    L + 1 it is a roll-up recapping consecutive level-L nodes, `child_ids`
    (oldest first; empty at level 1). `first_seq`, `last_seq` and
    `entry_count` span the entries beneath it; `ordinal` counts the nodes of
    its level within the session.
    """

    id: int
    session_id: str
    ordinal: int
    state: str
    first_seq: int
    last_seq: int
    entry_count: int
    summary: Summary | None
    attempts: int
    passes: int
    last_failure: Failure | None
    next_attempt_at: datetime | None
    closed_at: datetime | None
    raw: pb.Segment = field(repr=False, compare=False)
    level: int = 1
    child_ids: list[int] = field(default_factory=list)

    @classmethod
    def from_pb(cls, segment: pb.Segment) -> Segment:
        return cls(
            id=segment.id,
            session_id=segment.session_id,
            ordinal=segment.ordinal,
            state=state_name(segment.state),
            first_seq=segment.first_seq,
            last_seq=segment.last_seq,
            entry_count=segment.entry_count,
            summary=(
                Summary.from_pb(segment.summary) if segment.HasField("summary") else None
            ),
            attempts=segment.attempts,
            passes=segment.passes,
            last_failure=(
                Failure.from_pb(segment.last_failure)
                if segment.HasField("last_failure")
                else None
            ),
            next_attempt_at=_ts(segment, "next_attempt_at"),
            closed_at=_ts(segment, "closed_at"),
            raw=segment,
            level=_level(segment.level),
            child_ids=list(segment.child_ids),
        )


@dataclass(frozen=True)
class Entry:
    """One stored message of a session."""

    seq: int
    client_entry_id: str
    role: str
    content: str
    created_at: datetime | None
    raw: pb.Entry = field(repr=False, compare=False)
    #: When it was said (created_at when it was given no time of its own).
    occurred_at: datetime | None = None
    #: Who said it ("" when unnamed).
    name: str = ""
    metadata: dict[str, str] = field(default_factory=dict)

    kind: Literal["entry"] = field(default="entry", init=False)

    @property
    def text(self) -> str:
        """The entry's content (so `item.text` works for every context item)."""
        return self.content

    @classmethod
    def from_pb(cls, entry: pb.Entry) -> Entry:
        return cls(
            seq=entry.seq,
            client_entry_id=entry.client_entry_id,
            role=role_name(entry.role),
            content=entry.content,
            created_at=_ts(entry, "created_at"),
            raw=entry,
            occurred_at=_ts(entry, "occurred_at"),
            name=entry.name,
            metadata=dict(entry.metadata),
        )


@dataclass(frozen=True)
class ContextSummary:
    """A context item standing for the entries `first_seq..=last_seq`: the
    recap of node `segment_id`, a segment (`level` 1) or a roll-up (2 and
    up)."""

    segment_id: int
    first_seq: int
    last_seq: int
    summary: Summary
    raw: pb.ContextSummary = field(repr=False, compare=False)
    level: int = 1

    kind: Literal["summary"] = field(default="summary", init=False)

    @property
    def text(self) -> str:
        """The recap text (`summary.text`)."""
        return self.summary.text

    @classmethod
    def from_pb(cls, item: pb.ContextSummary) -> ContextSummary:
        return cls(
            segment_id=item.segment_id,
            first_seq=item.first_seq,
            last_seq=item.last_seq,
            summary=Summary.from_pb(item.summary),
            raw=item,
            level=_level(item.level),
        )


@dataclass(frozen=True)
class RecalledHit:
    """A text recalled for `context(query=...)` from the memory of the
    session's subject (every session of it; the session alone without a
    subject): an entry (`level` 0, `first_seq == last_seq` its seq, `role`
    and `name` its own) or a recap (`level` 1) or roll-up (2 and up) of
    `first_seq..last_seq` in session `session_id`. `score` is Search's,
    higher for better hits."""

    session_id: str
    level: int
    first_seq: int
    last_seq: int
    segment_id: int | None
    role: str | None
    name: str | None
    occurred_at: datetime | None
    text: str
    score: float
    raw: pb.RecalledHit = field(repr=False, compare=False)

    kind: Literal["recalled"] = field(default="recalled", init=False)

    @classmethod
    def from_pb(cls, hit: pb.RecalledHit) -> RecalledHit:
        return cls(
            session_id=hit.session_id,
            level=hit.level,
            first_seq=hit.first_seq,
            last_seq=hit.last_seq,
            segment_id=hit.segment_id or None,
            role=role_name(hit.role) if hit.level == 0 else None,
            name=hit.name or None,
            occurred_at=_ts(hit, "occurred_at"),
            text=hit.text,
            score=hit.score,
            raw=hit,
        )


#: One item of a context: a recalled hit, a summary or a raw entry;
#: `item.kind` says which ("recalled", "summary", "entry").
ContextItem = Union[RecalledHit, ContextSummary, Entry]


@dataclass(frozen=True)
class Context:
    """What an agent puts in its prompt.

    With `context(query=...)`, `items` open with what was recalled for the
    query (`RecalledHit`, kind "recalled"), best first. Then they cover the
    session, oldest first: summaries (`ContextSummary`, kind "summary")
    of segments or, for older history, roll-ups, and raw entries (`Entry`,
    kind "entry") where no recap exists, their seq ranges contiguous.
    `truncated` says the oldest history was dropped to fit `max_tokens`.
    """

    items: list[ContextItem]
    truncated: bool
    estimated_tokens: int
    raw: pb.GetContextResponse = field(repr=False, compare=False)

    @property
    def summaries(self) -> list[ContextSummary]:
        return [i for i in self.items if isinstance(i, ContextSummary)]

    @property
    def entries(self) -> list[Entry]:
        return [i for i in self.items if isinstance(i, Entry)]

    @property
    def recalled(self) -> list[RecalledHit]:
        """What was recalled for the query, best first (none without one)."""
        return [i for i in self.items if isinstance(i, RecalledHit)]

    @classmethod
    def from_pb(cls, response: pb.GetContextResponse) -> Context:
        items: list[ContextItem] = []
        for item in response.items:
            which = item.WhichOneof("item")
            if which == "summary":
                items.append(ContextSummary.from_pb(item.summary))
            elif which == "entry":
                items.append(Entry.from_pb(item.entry))
            elif which == "recalled":
                items.append(RecalledHit.from_pb(item.recalled))
            # An item of a kind newer than these stubs is left out.
        return cls(
            items=items,
            truncated=response.truncated,
            estimated_tokens=response.estimated_tokens,
            raw=response,
        )


@dataclass(frozen=True)
class AppendedEntry:
    """Where one appended message went: its seq, and whether its
    `client_entry_id` had been stored before (then seq is the original)."""

    seq: int
    client_entry_id: str
    duplicate: bool


@dataclass(frozen=True)
class AppendResult:
    """The answer to `append`: one `AppendedEntry` per message, in order."""

    entries: list[AppendedEntry]
    open_segment_id: int | None
    closed_segment_ids: list[int]
    raw: pb.AppendEntriesResponse = field(repr=False, compare=False)

    @classmethod
    def from_pb(cls, response: pb.AppendEntriesResponse) -> AppendResult:
        return cls(
            entries=[
                AppendedEntry(e.seq, e.client_entry_id, e.duplicate)
                for e in response.entries
            ],
            open_segment_id=(
                response.open_segment_id if response.HasField("open_segment_id") else None
            ),
            closed_segment_ids=list(response.closed_segment_ids),
            raw=response,
        )


@dataclass(frozen=True)
class FlushResult:
    """The answer to `flush`: every segment of the session as it stands,
    and whether all of them are summarised."""

    segments: list[Segment]
    complete: bool
    raw: pb.FlushSessionResponse = field(repr=False, compare=False)

    @classmethod
    def from_pb(cls, response: pb.FlushSessionResponse) -> FlushResult:
        return cls(
            segments=[Segment.from_pb(s) for s in response.segments],
            complete=response.complete,
            raw=response,
        )


@dataclass(frozen=True)
class Backlog:
    """Segment counts per state, the oldest PENDING segment's age,
    parked segments per failure class, erasures whose text is still
    in the SQLite write-ahead log (`erasures_pending`), and entries stored
    and not yet in the search index (`unindexed`, the oldest's age in
    `oldest_unindexed_age`: on SQLite the index is built just behind the
    appends; a search finds them all the same; always 0 on PostgreSQL)."""

    open: int
    pending: int
    summarised: int
    parked: int
    oldest_pending_age: timedelta | None
    parked_by_class: dict[str, int]
    erasures_pending: int
    unindexed: int
    oldest_unindexed_age: timedelta | None
    raw: pb.Backlog = field(repr=False, compare=False)

    @classmethod
    def from_pb(cls, backlog: pb.Backlog) -> Backlog:
        return cls(
            open=backlog.open,
            pending=backlog.pending,
            summarised=backlog.summarised,
            parked=backlog.parked,
            oldest_pending_age=_dur(backlog, "oldest_pending_age"),
            parked_by_class=dict(backlog.parked_by_class),
            erasures_pending=backlog.erasures_pending,
            unindexed=backlog.unindexed,
            oldest_unindexed_age=_dur(backlog, "oldest_unindexed_age"),
            raw=backlog,
        )


@dataclass(frozen=True)
class SessionInfo:
    """One of the caller's sessions (from `sessions()`).

    `pending` and `parked` count the session's nodes owed a recap and
    parked; `open_segment_id` is the segment taking appends (None when none
    is open); `last_append_at` is when it last stored an entry; `subject`
    is whose memory it is (None when the append that created it named none).
    """

    session_id: str
    entry_count: int
    last_seq: int
    open_segment_id: int | None
    pending: int
    parked: int
    created_at: datetime | None
    last_append_at: datetime | None
    subject: str | None
    raw: pb.SessionInfo = field(repr=False, compare=False)

    @classmethod
    def from_pb(cls, info: pb.SessionInfo) -> SessionInfo:
        return cls(
            session_id=info.session_id,
            entry_count=info.entry_count,
            last_seq=info.last_seq,
            open_segment_id=(
                info.open_segment_id if info.HasField("open_segment_id") else None
            ),
            pending=info.pending,
            parked=info.parked,
            created_at=_ts(info, "created_at"),
            last_append_at=_ts(info, "last_append_at"),
            subject=info.subject or None,
            raw=info,
        )


@dataclass(frozen=True)
class DeleteResult:
    """What `delete_session` erased: the session's entries, and its
    segments and roll-ups (`segments_deleted` counts both)."""

    entries_deleted: int
    segments_deleted: int
    raw: pb.DeleteSessionResponse = field(repr=False, compare=False)

    @classmethod
    def from_pb(cls, response: pb.DeleteSessionResponse) -> DeleteResult:
        return cls(
            entries_deleted=response.entries_deleted,
            segments_deleted=response.segments_deleted,
            raw=response,
        )


@dataclass(frozen=True)
class DeleteSubjectResult:
    """What `delete_subject` erased: the subject's sessions, their entries,
    and their segments and roll-ups (`segments_deleted` counts both)."""

    sessions_deleted: int
    entries_deleted: int
    segments_deleted: int
    raw: pb.DeleteSubjectResponse = field(repr=False, compare=False)

    @classmethod
    def from_pb(cls, response: pb.DeleteSubjectResponse) -> DeleteSubjectResult:
        return cls(
            sessions_deleted=response.sessions_deleted,
            entries_deleted=response.entries_deleted,
            segments_deleted=response.segments_deleted,
            raw=response,
        )


@dataclass(frozen=True)
class SessionEvent:
    """Something that happened to a watched session (from `watch()`).

    `kind` is one of:

    - "closed": a segment closed (it is now "pending", owed a recap);
    - "summarised": a node's recap is written (a segment's, or a roll-up's);
    - "failed": a node's recap pass failed; it stays pending and is tried
      again (`segment.last_failure` says why, `segment.next_attempt_at`
      when);
    - "parked": a pass failed in a way retrying cannot fix;
    - "deleted": the session was erased; the watch ends after this event;
    - "gap": this watcher fell behind and lost `missed` events before this
      one (read `segments()` to catch up).

    `segment` is the node as it is after the event (None for "deleted" and
    "gap"); `at` is when it happened.
    """

    kind: str
    segment: Segment | None
    at: datetime | None
    missed: int
    raw: pb.SessionEvent = field(repr=False, compare=False)

    @classmethod
    def from_pb(cls, event: pb.SessionEvent) -> SessionEvent:
        return cls(
            kind=event_kind_name(event.kind),
            segment=Segment.from_pb(event.segment) if event.HasField("segment") else None,
            at=_ts(event, "at"),
            missed=event.missed,
            raw=event,
        )


@dataclass(frozen=True)
class SearchHit:
    """An entry or a recap that a search found (from `search()`).

    `level` 0 is an entry (`role` is its role, `first_seq == last_seq` its
    seq); 1 is a segment's recap and 2 and up a roll-up's (`role` None,
    `segment_id` the node, `first_seq..last_seq` the entries it stands for),
    so every hit points back into the session's context. `name` is an
    entry's speaker ("" when none was given, and for a recap),
    `occurred_at` when it was said (a recap's: when its last entry was) and
    `metadata` an entry's pairs (a recap has none). `score` is
    higher for better hits, comparable within one search only; `legs` says
    how it was found ("lexical": by its words, "semantic": by meaning).
    `similarity` is the cosine of the hit's embedding to the query's (0
    when the semantic leg did not find it: compare it with a threshold
    only for hits whose `semantic_rank` is not 0); `lexical_rank` and
    `semantic_rank` are its places, from 1, in each leg's own ranking (0
    when that leg did not find it).
    """

    session_id: str
    level: int
    first_seq: int
    last_seq: int
    segment_id: int | None
    role: str | None
    created_at: datetime | None
    score: float
    text: str
    legs: list[str]
    similarity: float
    lexical_rank: int
    semantic_rank: int
    raw: pb.SearchHit = field(repr=False, compare=False)
    name: str = ""
    occurred_at: datetime | None = None
    metadata: dict[str, str] = field(default_factory=dict)

    @property
    def kind(self) -> Literal["entry", "summary"]:
        """"entry" (level 0) or "summary" (a recap or roll-up), as context
        items say."""
        return "entry" if self.level == 0 else "summary"

    @classmethod
    def from_pb(cls, hit: pb.SearchHit) -> SearchHit:
        return cls(
            session_id=hit.session_id,
            level=hit.level,
            first_seq=hit.first_seq,
            last_seq=hit.last_seq,
            segment_id=hit.segment_id or None,
            role=role_name(hit.role) if hit.level == 0 else None,
            created_at=_ts(hit, "created_at"),
            score=hit.score,
            text=hit.text,
            legs=[leg_name(leg) for leg in hit.legs],
            similarity=hit.similarity,
            lexical_rank=hit.lexical_rank,
            semantic_rank=hit.semantic_rank,
            raw=hit,
            name=hit.name,
            occurred_at=_ts(hit, "occurred_at"),
            metadata=dict(hit.metadata),
        )


@dataclass(frozen=True)
class SearchResult:
    """The answer to `search()`: `hits`, best first; the `legs` that ran
    ("lexical", and "semantic" when embeddings are on); and
    `embedded_share`, the share of the searched texts that have an
    embedding (0 without embeddings: below 1, a match by meaning may miss
    the rest, which the lexical leg still covers)."""

    hits: list[SearchHit]
    legs: list[str]
    embedded_share: float
    raw: pb.SearchResponse = field(repr=False, compare=False)

    @classmethod
    def from_pb(cls, response: pb.SearchResponse) -> SearchResult:
        return cls(
            hits=[SearchHit.from_pb(h) for h in response.hits],
            legs=[leg_name(leg) for leg in response.legs],
            embedded_share=response.embedded_share,
            raw=response,
        )
