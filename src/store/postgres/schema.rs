//! The PostgreSQL schema: versioned migrations, applied at start-up in one
//! transaction under an advisory lock, so that replicas starting together
//! take turns and each after the first finds the work done.

use deadpool_postgres::Object;

use crate::store::StoreError;

/// The advisory lock migrations hold (any fixed number; "archivist" in
/// ASCII, cut to 63 bits).
pub(super) const MIGRATION_LOCK: i64 = 0x6172_6368_6976_6973;

/// The table that records which migrations have been applied.
const VERSION_TABLE: &str = "archivist_schema_version";

pub(super) const MIGRATIONS: &[&str] = &[
    r#"
CREATE TABLE sessions (
    id              BIGSERIAL PRIMARY KEY,
    -- Byte order, as SQLite compares: listings page by name the same way.
    tenant          TEXT COLLATE "C" NOT NULL,
    name            TEXT COLLATE "C" NOT NULL,
    next_seq        BIGINT NOT NULL DEFAULT 1,
    next_ordinal    BIGINT NOT NULL DEFAULT 1,
    open_segment_id BIGINT,
    created_at      BIGINT NOT NULL,
    last_append_at  BIGINT,
    UNIQUE (tenant, name)
);

-- The reconciler closes OPEN segments idle for segment.max_idle through
-- the first; retention erases sessions through the second.
CREATE INDEX sessions_open_by_last_append
    ON sessions (last_append_at) WHERE open_segment_id IS NOT NULL;
CREATE INDEX sessions_by_last_append ON sessions (last_append_at);

CREATE TABLE entries (
    session_id      BIGINT NOT NULL REFERENCES sessions (id),
    seq             BIGINT NOT NULL,
    client_entry_id TEXT,
    role            BIGINT NOT NULL,
    content         TEXT   NOT NULL,
    tokens          BIGINT NOT NULL,
    created_at      BIGINT NOT NULL,
    PRIMARY KEY (session_id, seq)
);

CREATE UNIQUE INDEX entries_by_client_id
    ON entries (session_id, client_entry_id) WHERE client_entry_id IS NOT NULL;

-- Every node of the memory tree. Ids come from a sequence and never come
-- back after an erasure: a claim names its segment by id.
CREATE TABLE segments (
    id                   BIGSERIAL PRIMARY KEY,
    session_id           BIGINT NOT NULL REFERENCES sessions (id),
    level                BIGINT NOT NULL DEFAULT 1,
    ordinal              BIGINT NOT NULL,
    parent_id            BIGINT,
    state                BIGINT NOT NULL,
    first_seq            BIGINT NOT NULL,
    last_seq             BIGINT NOT NULL,
    entry_count          BIGINT NOT NULL,
    token_estimate       BIGINT NOT NULL,
    attempts             BIGINT NOT NULL DEFAULT 0,
    passes               BIGINT NOT NULL DEFAULT 0,
    next_attempt_at      BIGINT,
    closed_at            BIGINT,
    last_failure         TEXT,
    failure_class        TEXT,
    provider_fingerprint TEXT,
    claim_owner          TEXT,
    claim_token          BIGINT NOT NULL DEFAULT 0,
    claim_expires_at     BIGINT,
    created_at           BIGINT NOT NULL,
    UNIQUE (session_id, level, ordinal)
);

-- The due scan reads only PENDING rows through this index, so its cost
-- follows the backlog, not the number of segments ever stored.
CREATE INDEX segments_by_state_due ON segments (state, next_attempt_at);
CREATE INDEX segments_by_parent ON segments (parent_id) WHERE parent_id IS NOT NULL;
CREATE INDEX segments_roots ON segments (session_id, first_seq) WHERE parent_id IS NULL;

CREATE TABLE summaries (
    segment_id     BIGINT PRIMARY KEY REFERENCES segments (id),
    text           TEXT   NOT NULL,
    provider       TEXT   NOT NULL,
    model          TEXT   NOT NULL,
    prompt_version TEXT   NOT NULL,
    input_tokens   BIGINT NOT NULL,
    output_tokens  BIGINT NOT NULL,
    created_at     BIGINT NOT NULL
);

-- Bytes of entry content each tenant stores, kept in step by every append,
-- so the per-tenant cap is checked without summing the entries. An append
-- locks its tenant's row first, so the cap holds across replicas.
CREATE TABLE tenant_usage (
    tenant       TEXT   PRIMARY KEY,
    stored_bytes BIGINT NOT NULL
);

-- Segments per tenant and state, so that GetBacklog and every metrics
-- scrape cost the same with a million summarised segments as with none.
-- Triggers append +1 / -1 rows to segment_count_deltas (an insert takes
-- no lock another transaction waits for: no hot row shared by every
-- replica's writes); the deltas are folded into segment_counts now and
-- then, and a read adds the two.
CREATE TABLE segment_counts (
    tenant TEXT   NOT NULL,
    state  BIGINT NOT NULL,
    n      BIGINT NOT NULL,
    PRIMARY KEY (tenant, state)
);

CREATE TABLE segment_count_deltas (
    id     BIGSERIAL PRIMARY KEY,
    tenant TEXT   NOT NULL,
    state  BIGINT NOT NULL,
    d      BIGINT NOT NULL
);

CREATE FUNCTION archivist_count_segments() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    t TEXT;
BEGIN
    IF TG_OP = 'INSERT' THEN
        SELECT tenant INTO t FROM sessions WHERE id = NEW.session_id;
        INSERT INTO segment_count_deltas (tenant, state, d) VALUES (t, NEW.state, 1);
    ELSIF TG_OP = 'UPDATE' THEN
        SELECT tenant INTO t FROM sessions WHERE id = NEW.session_id;
        INSERT INTO segment_count_deltas (tenant, state, d)
            VALUES (t, OLD.state, -1), (t, NEW.state, 1);
    ELSE
        SELECT tenant INTO t FROM sessions WHERE id = OLD.session_id;
        INSERT INTO segment_count_deltas (tenant, state, d) VALUES (t, OLD.state, -1);
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER segments_counted_on_insert AFTER INSERT ON segments
    FOR EACH ROW EXECUTE FUNCTION archivist_count_segments();
CREATE TRIGGER segments_counted_on_state AFTER UPDATE OF state ON segments
    FOR EACH ROW WHEN (OLD.state IS DISTINCT FROM NEW.state)
    EXECUTE FUNCTION archivist_count_segments();
CREATE TRIGGER segments_counted_on_delete AFTER DELETE ON segments
    FOR EACH ROW EXECUTE FUNCTION archivist_count_segments();

-- The provider each kind of run (serve, backfill) last summarised with:
-- kind, base URL (credentials removed) and model, never the key.
CREATE TABLE provider_runs (
    role        TEXT   PRIMARY KEY,
    kind        TEXT   NOT NULL,
    base_url    TEXT   NOT NULL,
    model       TEXT   NOT NULL,
    recorded_at BIGINT NOT NULL
);

-- One row the health probe writes and reads back.
CREATE TABLE health_probe (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    at BIGINT  NOT NULL
);
"#,
    r#"
-- Whose memory a session is (NULL: none), fixed by the append that creates
-- it; ListSessions by subject and subject erasure go through the index.
ALTER TABLE sessions ADD COLUMN subject TEXT COLLATE "C";
CREATE INDEX sessions_by_subject ON sessions (tenant, subject, name) WHERE subject IS NOT NULL;
"#,
    r#"
-- The lexical index of Search: each text's tsvector, written by the
-- statement that stores the text (writer.rs, claims.rs) in the index's
-- language (search_state, the next migration), under a GIN index. Rows
-- stored before are indexed in batches beside appends (index.rs): a
-- generated column here would rewrite every row in this transaction,
-- holding every write back. Erasure deletes the rows, and the vectors with
-- them.
ALTER TABLE entries ADD COLUMN tsv tsvector;
CREATE INDEX entries_search ON entries USING GIN (tsv);
ALTER TABLE summaries ADD COLUMN tsv tsvector;
CREATE INDEX summaries_search ON summaries USING GIN (tsv);
"#,
    r#"
-- The index's language and its backlog (index.rs): entries in
-- (entries_after, entries_until] by (session_id, seq) and summaries in
-- (summaries_after, summaries_until] by segment id get their tsvector (in
-- this language) from the indexer; NULL bounds: nothing owed. A database
-- whose columns were generated ('simple') keeps its vectors, the columns
-- now plain; one whose rows have none owes them.
ALTER TABLE entries ALTER COLUMN tsv DROP EXPRESSION IF EXISTS;
ALTER TABLE summaries ALTER COLUMN tsv DROP EXPRESSION IF EXISTS;
CREATE TABLE search_state (
    id                    INTEGER PRIMARY KEY CHECK (id = 1),
    language              regconfig NOT NULL,
    entries_after_session BIGINT,
    entries_after_seq     BIGINT,
    entries_until_session BIGINT,
    entries_until_seq     BIGINT,
    summaries_after       BIGINT,
    summaries_until       BIGINT
);
INSERT INTO search_state
SELECT 1, 'simple', 0, 0, e.session_id, e.seq, 0, s.segment_id
FROM (SELECT 1) one
LEFT JOIN LATERAL (SELECT session_id, seq FROM entries WHERE tsv IS NULL
                   ORDER BY session_id DESC, seq DESC LIMIT 1) e ON true
LEFT JOIN LATERAL (SELECT max(segment_id) AS segment_id FROM summaries WHERE tsv IS NULL) s ON true;
"#,
    r#"
-- Embeddings (embeddings.rs), as SQLite keeps them. `doc` names an entry,
-- (session_id << 32) | seq, or a summary, -segment_id. What is owed a
-- vector has a row in embeddings_owed, made by a trigger in the statement
-- that stores the text (whether embeddings are on or not: turning them on
-- later owes the history); state 0 is owed, 1 parked (a class retrying
-- cannot fix, until the embedder's configuration changes: `fingerprint`);
-- a batch is claimed by owner and fencing token, and written only while
-- they still match. Erasure (erasure.rs) deletes a session's debts, then
-- its vectors, in its own transaction.
--
-- Nothing here needs the `vector` extension, so this schema stands on any
-- PostgreSQL: vectors are kept as real[] (unit length), and pgvector comes
-- in only through per-generation HNSW indexes over an expression casting
-- them to vector(N), made (embeddings.rs) when a generation's first
-- vectors are stored, on a server that archivist has checked has the
-- extension (a server without it is refused at start-up when embeddings
-- are on). One typmod-less column cannot carry an HNSW index (it needs a
-- fixed dimension), and a generation's dimension is known only from its
-- first answer (`dimensions = 0` is the model's own): a partial index per
-- generation on `(vector::vector(N))`, WHERE generation = its id, gives
-- each its own dimension, lets two generations stand side by side while one
-- replaces the other, and goes with a DROP INDEX when the old one does.
-- The filters of Search (time, role, level) are copied beside the vector so
-- that the index scan tests each candidate without reading its text.
CREATE TABLE embeddings_owed (
    doc              BIGINT PRIMARY KEY,
    session_id       BIGINT NOT NULL,
    state            BIGINT NOT NULL DEFAULT 0,
    next_attempt_at  BIGINT NOT NULL DEFAULT 0,
    passes           BIGINT NOT NULL DEFAULT 0,
    attempts         BIGINT NOT NULL DEFAULT 0,
    failure_class    TEXT,
    last_failure     TEXT,
    failed_at        BIGINT,
    fingerprint      TEXT,
    claim_owner      TEXT,
    claim_token      BIGINT,
    claim_expires_at BIGINT
);
CREATE INDEX embeddings_owed_due ON embeddings_owed (state, next_attempt_at);
CREATE INDEX embeddings_owed_by_session ON embeddings_owed (session_id);

-- A generation (`model@dimensions`) by a small id that index names and
-- statements can carry, with the length of its vectors.
CREATE TABLE embedding_generations (
    id         INTEGER GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    name       TEXT    NOT NULL UNIQUE,
    dimensions INTEGER NOT NULL
);

CREATE TABLE embeddings (
    doc        BIGINT  NOT NULL,
    generation INTEGER NOT NULL REFERENCES embedding_generations (id),
    session_id BIGINT  NOT NULL,
    level      BIGINT  NOT NULL,
    role       BIGINT,
    created_at BIGINT  NOT NULL,
    vector     REAL[]  NOT NULL,
    PRIMARY KEY (doc, generation)
);
CREATE INDEX embeddings_by_session ON embeddings (session_id);

-- One statement's entries owed at once (the append writer inserts a batch
-- in one statement): a transition table, not a trigger call per row.
CREATE FUNCTION archivist_owe_entries() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO embeddings_owed (doc, session_id)
    SELECT (session_id << 32) | seq, session_id FROM stored
    ON CONFLICT (doc) DO NOTHING;
    RETURN NULL;
END
$$;
CREATE TRIGGER entries_owed AFTER INSERT ON entries
    REFERENCING NEW TABLE AS stored
    FOR EACH STATEMENT EXECUTE FUNCTION archivist_owe_entries();

-- A summary is owed when written, and again (its old vectors dropped) if
-- its text ever changes.
CREATE FUNCTION archivist_owe_summary() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'UPDATE' THEN
        DELETE FROM embeddings WHERE doc = -OLD.segment_id;
    END IF;
    INSERT INTO embeddings_owed (doc, session_id)
    SELECT -NEW.segment_id, g.session_id FROM segments g WHERE g.id = NEW.segment_id
    ON CONFLICT (doc) DO UPDATE SET state = 0, next_attempt_at = 0, passes = 0,
        attempts = 0, failure_class = NULL, last_failure = NULL, failed_at = NULL,
        fingerprint = NULL;
    RETURN NULL;
END
$$;
CREATE TRIGGER summaries_owed AFTER INSERT ON summaries
    FOR EACH ROW EXECUTE FUNCTION archivist_owe_summary();
CREATE TRIGGER summaries_reembedded AFTER UPDATE OF text ON summaries
    FOR EACH ROW WHEN (OLD.text IS DISTINCT FROM NEW.text)
    EXECUTE FUNCTION archivist_owe_summary();

-- What was stored before this migration is owed too.
INSERT INTO embeddings_owed (doc, session_id)
    SELECT (session_id << 32) | seq, session_id FROM entries;
INSERT INTO embeddings_owed (doc, session_id)
    SELECT -m.segment_id, g.session_id FROM summaries m JOIN segments g ON g.id = m.segment_id;
"#,
    r#"
-- The active embedding generation, and the walk that owes every text
-- stored before a change of it a vector of the new one (generations.rs):
-- entry documents ((session_id << 32) | seq) in (entries_after,
-- entries_until], summaries' segment ids in (summaries_after,
-- summaries_until]; NULL when walked. The row is locked by each step, so
-- replicas take turns. A database that embedded before this migration
-- takes the generation most of its vectors are of.
CREATE TABLE embedding_state (
    id              INTEGER PRIMARY KEY CHECK (id = 1),
    generation      TEXT,
    entries_after   BIGINT,
    entries_until   BIGINT,
    summaries_after BIGINT,
    summaries_until BIGINT
);
INSERT INTO embedding_state (id, generation)
    VALUES (1, (SELECT n.name FROM embeddings v JOIN embedding_generations n ON n.id = v.generation
                GROUP BY n.name ORDER BY count(*) DESC LIMIT 1));
"#,
    r#"
-- Claims take the due debts oldest first (ORDER BY next_attempt_at, doc):
-- with doc in the index the first few are read off it, where the index on
-- (state, next_attempt_at) left a sort of every due debt (600 ms a claim
-- with a million owed).
CREATE INDEX embeddings_owed_claimable ON embeddings_owed (state, next_attempt_at, doc);
DROP INDEX embeddings_owed_due;
"#,
    r#"
-- Time and speakers: when an entry was said (NULL: when it was stored,
-- created_at, as for every entry before this and most live ones), who
-- said it, and its metadata (NULL when empty). Columns without defaults:
-- no rewrite of the table. IF NOT EXISTS: a database taken back to an
-- older version by hand (the migration tests do) keeps its columns.
ALTER TABLE entries ADD COLUMN IF NOT EXISTS occurred_at BIGINT,
    ADD COLUMN IF NOT EXISTS name TEXT,
    ADD COLUMN IF NOT EXISTS metadata JSONB;
"#,
    r#"
-- retention.session_ttl reads when a session's newest entry was said:
-- last_said_at (NULL before this: last_append_at, when every entry was
-- said as it was stored), so an imported history ages by its own clock.
ALTER TABLE sessions ADD COLUMN IF NOT EXISTS last_said_at BIGINT;
CREATE INDEX IF NOT EXISTS sessions_by_last_said
    ON sessions ((coalesce(last_said_at, last_append_at, created_at)));
"#,
    r#"
-- Nothing is written for embeddings while they are off: `owing` says
-- whether a run with `[embedding]` on holds the store (set by the run that
-- starts the generation, cleared by a server started without embeddings),
-- and the functions behind the triggers owe a stored text only then.
-- Turning embeddings on walks every stored text (generations.rs), so what
-- was stored while they were off is owed then. A database that never
-- embedded drops the rows its texts were owed by: the walk owes them
-- again if it ever does.
ALTER TABLE embedding_state ADD COLUMN IF NOT EXISTS owing BOOLEAN NOT NULL DEFAULT false;
UPDATE embedding_state SET owing = generation IS NOT NULL WHERE id = 1;
DELETE FROM embeddings_owed WHERE (SELECT generation FROM embedding_state WHERE id = 1) IS NULL;
CREATE OR REPLACE FUNCTION archivist_owe_entries() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NOT (SELECT owing FROM embedding_state WHERE id = 1) THEN
        RETURN NULL;
    END IF;
    INSERT INTO embeddings_owed (doc, session_id)
    SELECT (session_id << 32) | seq, session_id FROM stored
    ON CONFLICT (doc) DO NOTHING;
    RETURN NULL;
END
$$;
-- A changed summary's old vectors go whether or not embeddings are on (a
-- vector of a text no longer stored must not be found); it is owed again
-- only while they are.
CREATE OR REPLACE FUNCTION archivist_owe_summary() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'UPDATE' THEN
        DELETE FROM embeddings WHERE doc = -OLD.segment_id;
    END IF;
    IF NOT (SELECT owing FROM embedding_state WHERE id = 1) THEN
        RETURN NULL;
    END IF;
    INSERT INTO embeddings_owed (doc, session_id)
    SELECT -NEW.segment_id, g.session_id FROM segments g WHERE g.id = NEW.segment_id
    ON CONFLICT (doc) DO UPDATE SET state = 0, next_attempt_at = 0, passes = 0,
        attempts = 0, failure_class = NULL, last_failure = NULL, failed_at = NULL,
        fingerprint = NULL;
    RETURN NULL;
END
$$;
"#,
];

fn migration_error(version: usize) -> impl Fn(tokio_postgres::Error) -> StoreError {
    move |e| StoreError::Migration {
        version,
        source: Box::new(e),
    }
}

/// Whether the database holds archivist's schema (at any version).
pub(super) async fn exists(client: &Object) -> Result<bool, StoreError> {
    let row = client
        .query_one("SELECT to_regclass($1) IS NOT NULL", &[&VERSION_TABLE])
        .await?;
    Ok(row.try_get(0)?)
}

/// The version the database is at; 0 for none.
async fn version(client: &Object) -> Result<i64, tokio_postgres::Error> {
    let row = client
        .query_one(
            &format!("SELECT coalesce(max(version), 0)::BIGINT FROM {VERSION_TABLE}"),
            &[],
        )
        .await?;
    row.try_get(0)
}

/// The schema version this build migrates to.
pub(super) fn known() -> usize {
    MIGRATIONS.len()
}

/// Applies the migrations this build has and the database lacks, in one
/// transaction holding an advisory lock: replicas starting together take
/// turns, and each after the first finds nothing left to do. Returns the
/// version the database was at (0 for none).
pub(super) async fn migrate(client: &mut Object) -> Result<i64, StoreError> {
    let known = MIGRATIONS.len();
    let err = migration_error(known);
    let tx = client.transaction().await.map_err(&err)?;
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK])
        .await
        .map_err(&err)?;
    // SET LOCAL: no NOTICE that the table exists at every start-up (the
    // driver logs notices), for this transaction only.
    tx.batch_execute(&format!(
        "SET LOCAL client_min_messages = warning; \
         CREATE TABLE IF NOT EXISTS {VERSION_TABLE} (\
         version INTEGER PRIMARY KEY, applied_at BIGINT NOT NULL)"
    ))
    .await
    .map_err(&err)?;
    let row = tx
        .query_one(
            &format!("SELECT coalesce(max(version), 0)::BIGINT FROM {VERSION_TABLE}"),
            &[],
        )
        .await
        .map_err(&err)?;
    let current: i64 = row.try_get(0).map_err(&err)?;
    crate::store::not_newer(current, known)?;
    for (i, sql) in MIGRATIONS.iter().enumerate().skip(current.max(0) as usize) {
        let version = i + 1;
        let err = migration_error(version);
        tx.batch_execute(sql).await.map_err(&err)?;
        tx.execute(
            &format!("INSERT INTO {VERSION_TABLE} (version, applied_at) VALUES ($1, $2)"),
            &[&(version as i32), &crate::model::Millis::now().0],
        )
        .await
        .map_err(&err)?;
    }
    tx.commit().await.map_err(&err)?;
    Ok(current)
}

/// Checks, without changing anything, that the schema is the one this
/// build knows.
pub(super) async fn check_current(client: &Object) -> Result<(), StoreError> {
    let known = MIGRATIONS.len();
    let current = version(client).await.map_err(migration_error(known))?;
    crate::store::is_current(current, known)
}
