//! The SQLite schema: versioned migrations, applied at open.

use rusqlite::Connection;

use crate::store::StoreError;

/// The index's language and backlog row's table (index.rs), in `schema`
/// ("" or "search."): made by a migration in the main file once, in the
/// search file since it has one (fts::prepare).
macro_rules! search_state_table {
    ($schema:literal) => {
        concat!(
            "CREATE TABLE ",
            $schema,
            "search_state (
    id              INTEGER PRIMARY KEY CHECK (id = 1),
    language        TEXT    NOT NULL,
    entries_after   INTEGER,
    entries_until   INTEGER,
    summaries_after INTEGER,
    summaries_until INTEGER
);"
        )
    };
}
pub(super) use search_state_table;

pub(super) const MIGRATIONS: &[&str] = &[
    r#"
CREATE TABLE sessions (
    id              INTEGER PRIMARY KEY,
    tenant          TEXT    NOT NULL,
    name            TEXT    NOT NULL,
    next_seq        INTEGER NOT NULL DEFAULT 1,
    next_ordinal    INTEGER NOT NULL DEFAULT 1,
    open_segment_id INTEGER,
    created_at      INTEGER NOT NULL,
    UNIQUE (tenant, name)
);

CREATE TABLE entries (
    session_id      INTEGER NOT NULL REFERENCES sessions (id),
    seq             INTEGER NOT NULL,
    client_entry_id TEXT,
    role            INTEGER NOT NULL,
    content         TEXT    NOT NULL,
    tokens          INTEGER NOT NULL,
    created_at      INTEGER NOT NULL,
    PRIMARY KEY (session_id, seq)
) WITHOUT ROWID;

CREATE UNIQUE INDEX entries_by_client_id
    ON entries (session_id, client_entry_id) WHERE client_entry_id IS NOT NULL;

CREATE TABLE segments (
    id                   INTEGER PRIMARY KEY,
    session_id           INTEGER NOT NULL REFERENCES sessions (id),
    ordinal              INTEGER NOT NULL,
    state                INTEGER NOT NULL,
    first_seq            INTEGER NOT NULL,
    last_seq             INTEGER NOT NULL,
    entry_count          INTEGER NOT NULL,
    token_estimate       INTEGER NOT NULL,
    attempts             INTEGER NOT NULL DEFAULT 0,
    passes               INTEGER NOT NULL DEFAULT 0,
    next_attempt_at      INTEGER,
    closed_at            INTEGER,
    last_failure         TEXT,
    failure_class        TEXT,
    provider_fingerprint TEXT,
    claim_owner          TEXT,
    claim_token          INTEGER NOT NULL DEFAULT 0,
    claim_expires_at     INTEGER,
    created_at           INTEGER NOT NULL,
    UNIQUE (session_id, ordinal)
);

-- The reconciler's scan reads only due PENDING rows through this index, so
-- its cost follows the backlog, not the number of segments ever stored.
CREATE INDEX segments_by_state_due ON segments (state, next_attempt_at);

CREATE TABLE summaries (
    segment_id     INTEGER PRIMARY KEY REFERENCES segments (id),
    text           TEXT    NOT NULL,
    provider       TEXT    NOT NULL,
    model          TEXT    NOT NULL,
    prompt_version TEXT    NOT NULL,
    input_tokens   INTEGER NOT NULL,
    output_tokens  INTEGER NOT NULL,
    created_at     INTEGER NOT NULL
);
"#,
    r#"
-- Bytes of entry content each tenant stores, kept in step by every append,
-- so the per-tenant cap is checked without summing the entries.
CREATE TABLE tenant_usage (
    tenant       TEXT    PRIMARY KEY,
    stored_bytes INTEGER NOT NULL
) WITHOUT ROWID;

INSERT INTO tenant_usage (tenant, stored_bytes)
    SELECT x.tenant, sum(length(CAST(e.content AS BLOB)))
    FROM entries e JOIN sessions x ON x.id = e.session_id
    GROUP BY x.tenant;
"#,
    r#"
-- Segments per tenant and state, kept in step by triggers, so that
-- GetBacklog and every metrics scrape cost the same with a million
-- summarised segments as with none.
CREATE TABLE segment_counts (
    tenant TEXT    NOT NULL,
    state  INTEGER NOT NULL,
    n      INTEGER NOT NULL,
    PRIMARY KEY (tenant, state)
) WITHOUT ROWID;

INSERT INTO segment_counts (tenant, state, n)
    SELECT x.tenant, s.state, count(*)
    FROM segments s JOIN sessions x ON x.id = s.session_id
    GROUP BY x.tenant, s.state;

CREATE TRIGGER segments_counted_on_insert AFTER INSERT ON segments
BEGIN
    INSERT OR IGNORE INTO segment_counts (tenant, state, n)
        VALUES ((SELECT tenant FROM sessions WHERE id = NEW.session_id), NEW.state, 0);
    UPDATE segment_counts SET n = n + 1
        WHERE tenant = (SELECT tenant FROM sessions WHERE id = NEW.session_id)
          AND state = NEW.state;
END;

CREATE TRIGGER segments_counted_on_state AFTER UPDATE OF state ON segments
WHEN OLD.state != NEW.state
BEGIN
    UPDATE segment_counts SET n = n - 1
        WHERE tenant = (SELECT tenant FROM sessions WHERE id = OLD.session_id)
          AND state = OLD.state;
    INSERT OR IGNORE INTO segment_counts (tenant, state, n)
        VALUES ((SELECT tenant FROM sessions WHERE id = NEW.session_id), NEW.state, 0);
    UPDATE segment_counts SET n = n + 1
        WHERE tenant = (SELECT tenant FROM sessions WHERE id = NEW.session_id)
          AND state = NEW.state;
END;
"#,
    r#"
-- The memory tree: every node (a segment of entries at level 1, a roll-up
-- of level-L nodes at level L + 1) is a row of segments, with its level and
-- the roll-up it belongs to. Ordinals count nodes of one level, so the
-- table is rebuilt with a UNIQUE (session_id, level, ordinal). Foreign keys
-- stay on (they cannot change inside the migration's transaction), and a
-- rename rewrites the references to the renamed table, so summaries is
-- rebuilt too, to refer to the new segments; ids are kept throughout.
-- Segment ids are AUTOINCREMENT from here on: a claim names its segment by
-- id, so an id must never come back for another segment after an erasure.
DROP INDEX segments_by_state_due;
DROP TRIGGER segments_counted_on_insert;
DROP TRIGGER segments_counted_on_state;
ALTER TABLE segments RENAME TO segments_v3;

CREATE TABLE segments (
    id                   INTEGER PRIMARY KEY AUTOINCREMENT,
    session_id           INTEGER NOT NULL REFERENCES sessions (id),
    level                INTEGER NOT NULL DEFAULT 1,
    ordinal              INTEGER NOT NULL,
    parent_id            INTEGER,
    state                INTEGER NOT NULL,
    first_seq            INTEGER NOT NULL,
    last_seq             INTEGER NOT NULL,
    entry_count          INTEGER NOT NULL,
    token_estimate       INTEGER NOT NULL,
    attempts             INTEGER NOT NULL DEFAULT 0,
    passes               INTEGER NOT NULL DEFAULT 0,
    next_attempt_at      INTEGER,
    closed_at            INTEGER,
    last_failure         TEXT,
    failure_class        TEXT,
    provider_fingerprint TEXT,
    claim_owner          TEXT,
    claim_token          INTEGER NOT NULL DEFAULT 0,
    claim_expires_at     INTEGER,
    created_at           INTEGER NOT NULL,
    UNIQUE (session_id, level, ordinal)
);

INSERT INTO segments (id, session_id, level, ordinal, parent_id, state, first_seq, last_seq,
    entry_count, token_estimate, attempts, passes, next_attempt_at, closed_at, last_failure,
    failure_class, provider_fingerprint, claim_owner, claim_token, claim_expires_at, created_at)
SELECT id, session_id, 1, ordinal, NULL, state, first_seq, last_seq,
    entry_count, token_estimate, attempts, passes, next_attempt_at, closed_at, last_failure,
    failure_class, provider_fingerprint, claim_owner, claim_token, claim_expires_at, created_at
FROM segments_v3;

CREATE TABLE summaries_v4 (
    segment_id     INTEGER PRIMARY KEY REFERENCES segments (id),
    text           TEXT    NOT NULL,
    provider       TEXT    NOT NULL,
    model          TEXT    NOT NULL,
    prompt_version TEXT    NOT NULL,
    input_tokens   INTEGER NOT NULL,
    output_tokens  INTEGER NOT NULL,
    created_at     INTEGER NOT NULL
);
INSERT INTO summaries_v4 SELECT * FROM summaries;
DROP TABLE summaries;
DROP TABLE segments_v3;
ALTER TABLE summaries_v4 RENAME TO summaries;

CREATE INDEX segments_by_state_due ON segments (state, next_attempt_at);
-- A roll-up's children, and a session's roots (the nodes no roll-up
-- covers yet), which is where GetContext starts.
CREATE INDEX segments_by_parent ON segments (parent_id) WHERE parent_id IS NOT NULL;
CREATE INDEX segments_roots ON segments (session_id, first_seq) WHERE parent_id IS NULL;

CREATE TRIGGER segments_counted_on_insert AFTER INSERT ON segments
BEGIN
    INSERT OR IGNORE INTO segment_counts (tenant, state, n)
        VALUES ((SELECT tenant FROM sessions WHERE id = NEW.session_id), NEW.state, 0);
    UPDATE segment_counts SET n = n + 1
        WHERE tenant = (SELECT tenant FROM sessions WHERE id = NEW.session_id)
          AND state = NEW.state;
END;

CREATE TRIGGER segments_counted_on_state AFTER UPDATE OF state ON segments
WHEN OLD.state != NEW.state
BEGIN
    UPDATE segment_counts SET n = n - 1
        WHERE tenant = (SELECT tenant FROM sessions WHERE id = OLD.session_id)
          AND state = OLD.state;
    INSERT OR IGNORE INTO segment_counts (tenant, state, n)
        VALUES ((SELECT tenant FROM sessions WHERE id = NEW.session_id), NEW.state, 0);
    UPDATE segment_counts SET n = n + 1
        WHERE tenant = (SELECT tenant FROM sessions WHERE id = NEW.session_id)
          AND state = NEW.state;
END;
"#,
    r#"
-- Erasing a session deletes its segments: the kept counts follow.
CREATE TRIGGER segments_counted_on_delete AFTER DELETE ON segments
BEGIN
    UPDATE segment_counts SET n = n - 1
        WHERE tenant = (SELECT tenant FROM sessions WHERE id = OLD.session_id)
          AND state = OLD.state;
END;
"#,
    r#"
-- When each session last stored an entry: ListSessions shows it, and the
-- reconciler closes an OPEN segment left without an append for
-- segment.max_idle. The partial index holds only sessions with an open
-- segment, so that scan reads the idle ones and nothing else.
ALTER TABLE sessions ADD COLUMN last_append_at INTEGER;

UPDATE sessions SET last_append_at = coalesce(
    (SELECT e.created_at FROM entries e WHERE e.session_id = sessions.id
     ORDER BY e.seq DESC LIMIT 1),
    created_at);

CREATE INDEX sessions_open_by_last_append
    ON sessions (last_append_at) WHERE open_segment_id IS NOT NULL;
"#,
    r#"
-- The provider each kind of run (serve, backfill) last summarised with:
-- kind, base URL (credentials removed) and model, never the key. A run
-- configured with another provider is refused unless the operator says so,
-- so that a run started without the server's configuration does not write
-- recaps with the wrong provider.
CREATE TABLE provider_runs (
    role        TEXT    PRIMARY KEY,
    kind        TEXT    NOT NULL,
    base_url    TEXT    NOT NULL,
    model       TEXT    NOT NULL,
    recorded_at INTEGER NOT NULL
) WITHOUT ROWID;
"#,
    r#"
-- Retention: the reconciler erases sessions with no append for
-- retention.session_ttl, oldest first, through this index.
CREATE INDEX sessions_by_last_append ON sessions (last_append_at);
"#,
    r#"
-- One row the server's health probe writes and reads back, so health says
-- NOT_SERVING while the store cannot write or read.
CREATE TABLE health_probe (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    at INTEGER NOT NULL
);
"#,
    r#"
-- Erasures whose text may still be in the write-ahead log (and in pages of
-- the database file the log has not yet overwritten): recorded in the
-- erasure's transaction, removed by the checkpoint that empties the log
-- after it (checkpoint.rs), so a crash in between loses none.
CREATE TABLE erasures_pending (
    id INTEGER PRIMARY KEY,
    tenant TEXT NOT NULL,
    erased_at INTEGER NOT NULL
);
"#,
    r#"
-- Whose memory a session is (NULL: none), fixed by the append that creates
-- it; ListSessions by subject and subject erasure go through the index.
ALTER TABLE sessions ADD COLUMN subject TEXT;
CREATE INDEX sessions_by_subject ON sessions (tenant, subject, name) WHERE subject IS NOT NULL;
"#,
    r#"
-- A session being erased (sessions.rs): its name moved out of the tenant's
-- names and its entries going in batches; start-up finishes any left.
ALTER TABLE sessions ADD COLUMN erasing INTEGER;
CREATE INDEX sessions_erasing ON sessions (id) WHERE erasing IS NOT NULL;
"#,
    r#"
-- The lexical index of Search: FTS5 over the text of entries and
-- summaries (external content: the view names each document), kept in
-- step by triggers in the transaction that stores or erases the text.
-- `doc` is (session_id << 32) | seq for an entry (seqs stay far below
-- 2^32) and -segment_id for a summary; `scope` is the owner's tenant as a
-- token (`t` and its hex), so a query walks only its tenant's postings.
-- The delete triggers read the tenant from the session row and the level
-- from the segment: erasure deletes summaries before segments and entries
-- before the session (sessions.rs, erase_tx).
CREATE VIEW search_docs AS
    SELECT (e.session_id << 32) | e.seq AS doc, e.content AS body,
           't' || hex(x.tenant) AS scope
    FROM entries e JOIN sessions x ON x.id = e.session_id
    UNION ALL
    SELECT -m.segment_id AS doc, m.text AS body, 't' || hex(x.tenant) AS scope
    FROM summaries m JOIN segments g ON g.id = m.segment_id JOIN sessions x ON x.id = g.session_id;
CREATE VIRTUAL TABLE search_index USING fts5(
    body, scope, content = 'search_docs', content_rowid = 'doc',
    tokenize = 'unicode61 remove_diacritics 2'
);
-- Deleting a document removes its terms from the index pages too, so the
-- text of an erased session is in no page of the file (with the store's
-- PRAGMA secure_delete zeroing the freed ones).
INSERT INTO search_index (search_index, rank) VALUES ('secure-delete', 1);
CREATE TRIGGER entries_indexed AFTER INSERT ON entries BEGIN
    INSERT INTO search_index (rowid, body, scope)
    SELECT (new.session_id << 32) | new.seq, new.content, 't' || hex(tenant)
    FROM sessions WHERE id = new.session_id;
END;
CREATE TRIGGER entries_unindexed AFTER DELETE ON entries BEGIN
    INSERT INTO search_index (search_index, rowid, body, scope)
    SELECT 'delete', (old.session_id << 32) | old.seq, old.content, 't' || hex(tenant)
    FROM sessions WHERE id = old.session_id;
END;
CREATE TRIGGER summaries_indexed AFTER INSERT ON summaries BEGIN
    INSERT INTO search_index (rowid, body, scope)
    SELECT -new.segment_id, new.text, 't' || hex(x.tenant)
    FROM segments g JOIN sessions x ON x.id = g.session_id WHERE g.id = new.segment_id;
END;
CREATE TRIGGER summaries_unindexed AFTER DELETE ON summaries BEGIN
    INSERT INTO search_index (search_index, rowid, body, scope)
    SELECT 'delete', -old.segment_id, old.text, 't' || hex(x.tenant)
    FROM segments g JOIN sessions x ON x.id = g.session_id WHERE g.id = old.segment_id;
END;
CREATE TRIGGER summaries_reindexed AFTER UPDATE OF text ON summaries BEGIN
    INSERT INTO search_index (search_index, rowid, body, scope)
    SELECT 'delete', -old.segment_id, old.text, 't' || hex(x.tenant)
    FROM segments g JOIN sessions x ON x.id = g.session_id WHERE g.id = old.segment_id;
    INSERT INTO search_index (rowid, body, scope)
    SELECT -new.segment_id, new.text, 't' || hex(x.tenant)
    FROM segments g JOIN sessions x ON x.id = g.session_id WHERE g.id = new.segment_id;
END;
-- What was stored before this migration is indexed in batches beside
-- appends (the backlog of a later migration; index.rs), not here in one
-- transaction that would hold every write back.
"#,
    r#"
-- Erasure records never reuse an id: the checkpoint thread reports "scrubbed
-- up to id N", and with a plain rowid the next erasure after a finished
-- scrub took the freed id again, so it was reported scrubbed while its
-- text was still in the database file (found by the Search erasure test).
CREATE TABLE erasures_pending_v2 (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    tenant TEXT NOT NULL,
    erased_at INTEGER NOT NULL
);
INSERT INTO erasures_pending_v2 SELECT id, tenant, erased_at FROM erasures_pending;
DROP TABLE erasures_pending;
ALTER TABLE erasures_pending_v2 RENAME TO erasures_pending;
"#,
    concat!(
        r#"
-- The lexical index's language and its backlog (index.rs): the entries in
-- (entries_after, entries_until] of documents (`doc` as above) and the
-- summaries in (summaries_after, summaries_until] of segment ids that are
-- not indexed yet are, by the indexer, in batches beside appends; a
-- language change owes every stored text so. NULL bounds: nothing owed.
-- A text is indexed exactly when the index has its document size row
-- (FTS5's docsize, written and deleted with its terms): new texts are
-- indexed at once, the indexer skips those, and an erasure unindexes only
-- what was indexed (a 'delete' of a document never inserted would corrupt
-- the index).
"#,
        search_state_table!(""),
        r#"
INSERT INTO search_state
SELECT 1, 'simple', 0, (SELECT max((session_id << 32) | seq) FROM entries),
       0, (SELECT max(segment_id) FROM summaries);
DROP TRIGGER entries_unindexed;
DROP TRIGGER summaries_unindexed;
DROP TRIGGER summaries_reindexed;
CREATE TRIGGER entries_unindexed AFTER DELETE ON entries
WHEN EXISTS (SELECT 1 FROM search_index_docsize WHERE id = ((old.session_id << 32) | old.seq))
BEGIN
    INSERT INTO search_index (search_index, rowid, body, scope)
    SELECT 'delete', (old.session_id << 32) | old.seq, old.content, 't' || hex(tenant)
    FROM sessions WHERE id = old.session_id;
END;
CREATE TRIGGER summaries_unindexed AFTER DELETE ON summaries
WHEN EXISTS (SELECT 1 FROM search_index_docsize WHERE id = -old.segment_id)
BEGIN
    INSERT INTO search_index (search_index, rowid, body, scope)
    SELECT 'delete', -old.segment_id, old.text, 't' || hex(x.tenant)
    FROM segments g JOIN sessions x ON x.id = g.session_id WHERE g.id = old.segment_id;
END;
CREATE TRIGGER summaries_reindexed AFTER UPDATE OF text ON summaries BEGIN
    INSERT INTO search_index (search_index, rowid, body, scope)
    SELECT 'delete', -old.segment_id, old.text, 't' || hex(x.tenant)
    FROM segments g JOIN sessions x ON x.id = g.session_id
    WHERE g.id = old.segment_id
      AND EXISTS (SELECT 1 FROM search_index_docsize WHERE id = -old.segment_id);
    INSERT INTO search_index (rowid, body, scope)
    SELECT -new.segment_id, new.text, 't' || hex(x.tenant)
    FROM segments g JOIN sessions x ON x.id = g.session_id WHERE g.id = new.segment_id;
END;
"#
    ),
    r#"
-- Embeddings (embeddings.rs). `doc` names an entry or a summary as in
-- search_index. What is owed a vector has a row in embeddings_owed, made
-- by the trigger that stores its text, in the same transaction, whether
-- embeddings are on or not (turning them on later owes the history);
-- state 0 is owed, 1 parked (a class retrying cannot fix, until the
-- embedder's configuration changes: `fingerprint`); a batch is claimed by
-- owner and fencing token, and written only while they still match.
-- Vectors are unit-length little-endian f32 keyed by doc and generation
-- (model and dimensions), so the vectors of two generations can stand side
-- by side while one replaces the other; session_id lets a search read only
-- its scope's. Erasing the text (the delete triggers, in the erasure's own
-- transaction) takes its vector and its debt with it.
CREATE TABLE embeddings_owed (
    doc INTEGER PRIMARY KEY,
    session_id INTEGER NOT NULL,
    state INTEGER NOT NULL DEFAULT 0,
    next_attempt_at INTEGER NOT NULL DEFAULT 0,
    passes INTEGER NOT NULL DEFAULT 0,
    attempts INTEGER NOT NULL DEFAULT 0,
    failure_class TEXT,
    last_failure TEXT,
    failed_at INTEGER,
    fingerprint TEXT,
    claim_owner TEXT,
    claim_token INTEGER,
    claim_expires_at INTEGER
);
CREATE INDEX embeddings_owed_due ON embeddings_owed (state, next_attempt_at);
CREATE INDEX embeddings_owed_by_session ON embeddings_owed (session_id);
CREATE TABLE embeddings (
    doc INTEGER NOT NULL,
    generation TEXT NOT NULL,
    session_id INTEGER NOT NULL,
    vector BLOB NOT NULL,
    PRIMARY KEY (doc, generation)
) WITHOUT ROWID;
CREATE INDEX embeddings_in_scope ON embeddings (generation, session_id);
CREATE TRIGGER entries_owed AFTER INSERT ON entries BEGIN
    INSERT OR REPLACE INTO embeddings_owed (doc, session_id)
    VALUES ((new.session_id << 32) | new.seq, new.session_id);
END;
CREATE TRIGGER entries_unembedded AFTER DELETE ON entries BEGIN
    DELETE FROM embeddings_owed WHERE doc = (old.session_id << 32) | old.seq;
    DELETE FROM embeddings WHERE doc = (old.session_id << 32) | old.seq;
END;
CREATE TRIGGER summaries_owed AFTER INSERT ON summaries BEGIN
    INSERT OR REPLACE INTO embeddings_owed (doc, session_id)
    SELECT -new.segment_id, g.session_id FROM segments g WHERE g.id = new.segment_id;
END;
CREATE TRIGGER summaries_unembedded AFTER DELETE ON summaries BEGIN
    DELETE FROM embeddings_owed WHERE doc = -old.segment_id;
    DELETE FROM embeddings WHERE doc = -old.segment_id;
END;
CREATE TRIGGER summaries_reembedded AFTER UPDATE OF text ON summaries BEGIN
    DELETE FROM embeddings WHERE doc = -old.segment_id;
    INSERT OR REPLACE INTO embeddings_owed (doc, session_id)
    SELECT -new.segment_id, g.session_id FROM segments g WHERE g.id = new.segment_id;
END;
-- What was stored before this migration is owed too.
INSERT INTO embeddings_owed (doc, session_id)
    SELECT (session_id << 32) | seq, session_id FROM entries;
INSERT INTO embeddings_owed (doc, session_id)
    SELECT -m.segment_id, g.session_id FROM summaries m JOIN segments g ON g.id = m.segment_id;
"#,
    r#"
-- The lexical index becomes one contentless FTS5 table per tenant (fts.rs
-- says why), `search_<id>` after its row here, made when the tenant first
-- has a text to index; the texts are indexed by the writer, not by
-- triggers. The shared table goes, and everything stored is owed to the
-- backlog again (indexed in batches beside appends, index.rs).
CREATE TABLE search_tables (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    tenant TEXT NOT NULL UNIQUE
);
DROP TRIGGER entries_indexed;
DROP TRIGGER entries_unindexed;
DROP TRIGGER summaries_indexed;
DROP TRIGGER summaries_unindexed;
DROP TRIGGER summaries_reindexed;
DROP TABLE search_index;
DROP VIEW search_docs;
UPDATE search_state SET
    entries_after = 0, entries_until = (SELECT max((session_id << 32) | seq) FROM entries),
    summaries_after = 0, summaries_until = (SELECT max(segment_id) FROM summaries)
WHERE id = 1;
"#,
    r#"
-- The active embedding generation, and the walk that owes every text
-- stored before a change of it a vector of the new one (generations.rs):
-- entry documents in (entries_after, entries_until], summaries' segment
-- ids in (summaries_after, summaries_until]; NULL when walked. A database
-- that embedded before this migration takes the generation most of its
-- vectors are of.
CREATE TABLE embedding_state (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    generation TEXT,
    entries_after INTEGER,
    entries_until INTEGER,
    summaries_after INTEGER,
    summaries_until INTEGER
);
INSERT INTO embedding_state (id, generation)
    VALUES (1, (SELECT generation FROM embeddings GROUP BY generation ORDER BY count(*) DESC LIMIT 1));
"#,
    r#"
-- What the semantic leg's cache of unit vectors (vectors.rs) reads to stay
-- in step with the vectors, whichever process writes them: every vector
-- stored takes the next tick of vector_clock as its `seq`, and every
-- vector deleted (an erasure, a summary re-embedded, an old generation
-- dropped) is logged in vectors_gone at the next tick, so a cache loads
-- only what changed since the tick it has. The log keeps the deletions of
-- the last 100,000 ticks (pruned as it grows); a cache further behind than
-- that loads whole again. Vectors stored before this have no seq (0 to
-- the cache): a cache's first load reads them all.
ALTER TABLE embeddings ADD COLUMN seq INTEGER;
CREATE INDEX embeddings_by_seq ON embeddings (generation, seq);
CREATE TABLE vector_clock (
    id  INTEGER PRIMARY KEY CHECK (id = 1),
    seq INTEGER NOT NULL
);
INSERT INTO vector_clock (id, seq) VALUES (1, 0);
CREATE TABLE vectors_gone (
    seq        INTEGER PRIMARY KEY,
    tenant     TEXT    NOT NULL,
    generation TEXT    NOT NULL,
    doc        INTEGER NOT NULL
);
CREATE TRIGGER embeddings_sequenced AFTER INSERT ON embeddings BEGIN
    UPDATE vector_clock SET seq = seq + 1 WHERE id = 1;
    UPDATE embeddings SET seq = (SELECT seq FROM vector_clock WHERE id = 1)
    WHERE doc = new.doc AND generation = new.generation;
END;
CREATE TRIGGER embeddings_gone AFTER DELETE ON embeddings BEGIN
    UPDATE vector_clock SET seq = seq + 1 WHERE id = 1;
    INSERT INTO vectors_gone (seq, tenant, generation, doc)
    SELECT c.seq, coalesce((SELECT tenant FROM sessions WHERE id = old.session_id), ''),
           old.generation, old.doc
    FROM vector_clock c WHERE c.id = 1;
    DELETE FROM vectors_gone WHERE seq < (SELECT seq FROM vector_clock WHERE id = 1) - 100000;
END;
"#,
    r#"
-- Time and speakers: when an entry was said (NULL: when it was stored,
-- created_at, as for every entry before this and most live ones, so a
-- live append spends no bytes on it), who said it, and its metadata (a
-- JSON object, NULL when empty). Columns added without a rewrite.
ALTER TABLE entries ADD COLUMN occurred_at INTEGER;
ALTER TABLE entries ADD COLUMN name TEXT;
ALTER TABLE entries ADD COLUMN metadata TEXT;
"#,
    r#"
-- retention.session_ttl reads when a session's newest entry was said:
-- last_said_at (NULL before this: last_append_at, when every entry was
-- said as it was stored), so an imported history ages by its own clock.
ALTER TABLE sessions ADD COLUMN last_said_at INTEGER;
CREATE INDEX sessions_by_last_said
    ON sessions (coalesce(last_said_at, last_append_at, created_at));
"#,
    r#"
-- Nothing is written for embeddings while they are off: `owing` says
-- whether a run with `[embedding]` on holds the store (set by the run that
-- starts the generation, cleared by a server started without embeddings),
-- and the triggers owe a stored text only then. Turning embeddings on
-- walks every stored text (generations.rs), so what was stored while they
-- were off is owed then. A database that never embedded drops the rows
-- its texts were owed by: the walk owes them again if it ever does.
ALTER TABLE embedding_state ADD COLUMN owing INTEGER NOT NULL DEFAULT 0;
UPDATE embedding_state SET owing = generation IS NOT NULL WHERE id = 1;
DELETE FROM embeddings_owed WHERE (SELECT generation FROM embedding_state WHERE id = 1) IS NULL;
DROP TRIGGER entries_owed;
DROP TRIGGER summaries_owed;
DROP TRIGGER summaries_reembedded;
CREATE TRIGGER entries_owed AFTER INSERT ON entries
WHEN (SELECT owing FROM embedding_state WHERE id = 1)
BEGIN
    INSERT OR REPLACE INTO embeddings_owed (doc, session_id)
    VALUES ((new.session_id << 32) | new.seq, new.session_id);
END;
CREATE TRIGGER summaries_owed AFTER INSERT ON summaries
WHEN (SELECT owing FROM embedding_state WHERE id = 1)
BEGIN
    INSERT OR REPLACE INTO embeddings_owed (doc, session_id)
    SELECT -new.segment_id, g.session_id FROM segments g WHERE g.id = new.segment_id;
END;
-- A changed summary's old vectors go whether or not embeddings are on (a
-- vector of a text no longer stored must not be found); it is owed again
-- only while they are.
CREATE TRIGGER summaries_reembedded AFTER UPDATE OF text ON summaries BEGIN
    DELETE FROM embeddings WHERE doc = -old.segment_id;
    INSERT OR REPLACE INTO embeddings_owed (doc, session_id)
    SELECT -new.segment_id, g.session_id FROM segments g
    WHERE g.id = new.segment_id AND (SELECT owing FROM embedding_state WHERE id = 1);
END;
"#,
    r#"
-- The recaps of a session being erased, each with its search document, for
-- the erasure's batches to take out of the index: taking them out while the
-- session was made gone held the writer for a second on a large session.
CREATE TABLE erasing_texts (
    session_id INTEGER NOT NULL,
    doc        INTEGER NOT NULL,
    text       TEXT    NOT NULL,
    PRIMARY KEY (session_id, doc)
) WITHOUT ROWID;
"#,
    r#"
-- The index built just behind the writer (fts.rs, "the tail"): a
-- session's entries up to indexed_seq are in its tenant's index (or were
-- left out by a backlog that owes them); those past it are the tail,
-- indexed in large batches by the writer. Every entry stored before this
-- was indexed as it was stored. The partial index holds only the sessions
-- with a tail, so finding, counting and indexing it never walks the rest.
ALTER TABLE sessions ADD COLUMN indexed_seq INTEGER NOT NULL DEFAULT 0;
UPDATE sessions SET indexed_seq = next_seq - 1;
CREATE INDEX sessions_with_tail ON sessions (tenant) WHERE next_seq > indexed_seq + 1;
"#,
    r#"
-- The index moves to a file of its own (fts.rs, indexer.rs): the indexer
-- thread writes it beside the writer. indexed_seq becomes the writer's
-- copy of the search file's watermark (it may lag it, never lead it). A
-- stored recap is owed to the index here until the indexer has it; the
-- id, never reused, names what the indexer reports done. The tables of
-- the index in this file go when the store opens (fts::prepare), and the
-- new file is owed everything.
CREATE TABLE search_owed (
    id         INTEGER PRIMARY KEY AUTOINCREMENT,
    segment_id INTEGER NOT NULL UNIQUE
);
-- The search file this main file goes with: its user_version is this
-- number, made when it is made (fts::prepare).
CREATE TABLE search_file (
    id      INTEGER PRIMARY KEY CHECK (id = 1),
    pairing INTEGER NOT NULL
);
"#,
];

/// Applies the migrations this build has and the database lacks, all in one
/// IMMEDIATE transaction: two processes opening a new database at once (a
/// server and a backfill run) take turns, and the second finds the work done.
pub(super) fn migrate(conn: &mut Connection) -> Result<(), StoreError> {
    let known = MIGRATIONS.len();
    let tx = conn
        .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
        .map_err(|e| StoreError::Migration {
            version: known,
            source: e.into(),
        })?;
    let current: i64 = tx
        .pragma_query_value(None, "user_version", |r| r.get(0))
        .map_err(|e| StoreError::Migration {
            version: known,
            source: e.into(),
        })?;
    crate::store::not_newer(current, known)?;
    for (i, sql) in MIGRATIONS.iter().enumerate().skip(current.max(0) as usize) {
        let version = i + 1;
        let err = |e: rusqlite::Error| StoreError::Migration {
            version,
            source: e.into(),
        };
        tx.execute_batch(sql).map_err(err)?;
        tx.pragma_update(None, "user_version", version as i64)
            .map_err(err)?;
    }
    tx.commit().map_err(|e| StoreError::Migration {
        version: known,
        source: e.into(),
    })
}

/// Checks, without changing anything, that a database opened read-only is
/// at the schema this build knows: an older one needs a run that may write
/// (the server, or a backfill that is not a dry run) to migrate it first.
pub(super) fn check_current(conn: &Connection) -> Result<(), StoreError> {
    let known = MIGRATIONS.len();
    let current: i64 = conn
        .pragma_query_value(None, "user_version", |r| r.get(0))
        .map_err(|e| StoreError::Migration {
            version: known,
            source: e.into(),
        })?;
    crate::store::is_current(current, known)
}
