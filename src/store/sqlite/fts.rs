//! The lexical index's tables on SQLite: one FTS5 table per tenant,
//! contentless (the text stays in `entries` and `summaries` only), named
//! `search_<k>` after the tenant's row in `search_tables`.
//!
//! Why a table per tenant: a search matches, ranks and counts in its own
//! tenant's index alone. With one shared table a search had to AND a scope
//! token that every document of the tenant holds, and FTS5's bm25 reads the
//! whole doclist of every phrase of a query to weigh it: a query paid for
//! the tenant's size (98 ms at a million entries where the word alone took
//! 0.3 ms), and the weights mixed tenants. Here the cost follows the
//! query's own words, and no tenant's words weigh another's ranking.
//!
//! Why the writes are here and not in triggers: a trigger's statement, and
//! every savepoint, makes FTS5 flush its pending terms into a new segment
//! (FTS5 flushes at each savepoint), so a trigger per entry wrote a segment
//! per entry (about 100 µs an entry measured outside archivist, against
//! 25 µs for the same inserts made once at the end).
//!
//! The search file: the index lives in `archivist-search.sqlite3` beside
//! the main file (attached as `search` to every connection), with
//! `search_tables`, `search_state` (language and backlog, index.rs) and
//! the watermarks (`search_marks`), so that the indexer thread
//! (indexer.rs) writes it beside the writer: SQLite lets one connection
//! at a time write a file, and FTS5's work per text (1.2–1.7 µs of CPU,
//! docs/benchmarks.md, issue 38) in the writer's thread held every append
//! back. No transaction is atomic across the two files (each has its own
//! log), so none depends on it: the indexer writes only the search file,
//! the writer's jobs that write it (an erasure's first step, a language
//! change, the backlog) write nothing else, and what the main file says
//! of the index (`indexed_seq`, `search_owed`) is only ever behind it.
//!
//! The tail: appended entries are indexed just behind the writer, in large
//! batches, not in the transaction that stores them: each transaction that
//! writes to FTS5 writes a new segment and pays its share of the merges
//! (10.6 µs a text at 80 texts a transaction, 2.6 µs at 4,000). A
//! session's watermark in `search_marks` says how far its entries are
//! indexed, in the same transactions as the texts, so a killed process
//! loses nothing (the indexer's first pass indexes the rest); the writer
//! copies it into `sessions.indexed_seq` after each pass, and the partial
//! index `sessions_with_tail` holds the sessions whose copy is behind:
//! where a pass looks. Recaps are owed in `search_owed` by the
//! transaction that stores them.
//!
//! Read-your-writes: a search first asks whether its tenant has a tail
//! (one read), and if so has the indexer index it (`Sqlite::index_tail_of`),
//! then reads the index alone. Chosen over scanning the tail at read time
//! (its texts put in an in-memory FTS5 table beside the query): the hits
//! of one index are ranked by one set of bm25 statistics, every query
//! form works unchanged, and a search pays for the tail only when one is
//! there, at the large-batch price.
//!
//! Erasure: the tail holds no text (the watermark points into `entries`);
//! erasing a session makes the indexer pass it by from the tombstoning
//! transaction on. Each batch of the erasure takes its texts out of the
//! index in one writer transaction (which locks the search file first, so
//! that it sees whatever the indexer committed), and deletes them from the
//! main file in the next (sessions.rs, `unindex_batch`).
//!
//! A document is indexed exactly when the table has its document-size row
//! (`search_<k>_docsize`): erasure unindexes only what was indexed (a
//! 'delete' of a document never inserted would corrupt the index), and the
//! backlog skips what is already there.

use std::path::Path;

use rusqlite::{Connection, OptionalExtension, TransactionState, params};

use crate::config::SearchLanguage;
use crate::store::StoreError;

/// The search file inside the data directory, beside the main one.
pub(super) const FILE: &str = "archivist-search.sqlite3";

/// Attaches the search file at `path` as the schema `search`. Its tables'
/// names are unique across both files, so statements name them alone.
pub(super) fn attach(conn: &Connection, path: &Path) -> rusqlite::Result<()> {
    let path = path
        .to_str()
        .ok_or_else(|| rusqlite::Error::InvalidPath(path.to_owned()))?;
    conn.execute("ATTACH DATABASE ?1 AS search", [path])?;
    Ok(())
}

/// Takes the search file's write lock in the open transaction, unless it
/// holds it already: before the transaction reads that file at all, so
/// that it reads what the indexer last committed. A transaction that read
/// it first could not write it after the indexer had committed
/// (SQLITE_BUSY_SNAPSHOT), and one that only read it could miss what an
/// erasure must take out.
pub(super) fn lock(conn: &Connection) -> Result<(), StoreError> {
    if conn.transaction_state(Some("search"))? != TransactionState::Write {
        // A write that changes nothing still begins the file's write
        // transaction.
        conn.prepare_cached("DELETE FROM search.search_marks WHERE 0")?
            .execute([])?;
    }
    Ok(())
}

/// `lock` for a writer job: waits `WRITER_LOCK_WAIT` at most, since every
/// append waits behind the writer; a job that cannot have the lock fails
/// `locked` and is tried again shortly (`Sqlite::write_search`, which
/// also has the indexer begin no transaction meanwhile), not holding the
/// writer in between.
pub(super) fn lock_for_writer(conn: &Connection) -> Result<(), StoreError> {
    conn.busy_timeout(WRITER_LOCK_WAIT)?;
    let taken = lock(conn);
    conn.busy_timeout(super::BUSY_TIMEOUT)?;
    taken
}

/// How long a writer job waits for the search file's lock.
const WRITER_LOCK_WAIT: std::time::Duration = std::time::Duration::from_millis(10);

/// Whether `e` is a lock another connection held too long (SQLITE_BUSY).
pub(super) fn locked(e: &StoreError) -> bool {
    let cause = match e {
        StoreError::Query(cause) | StoreError::NotCommitted(cause) => cause,
        _ => return false,
    };
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(cause.as_ref());
    while let Some(e) = source {
        if let Some(e) = e.downcast_ref::<rusqlite::Error>() {
            return matches!(
                e.sqlite_error_code(),
                Some(rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked)
            );
        }
        source = e.source();
    }
    false
}

/// Makes the search file's tables if it has none (a new data directory,
/// one from before the file, or a file lost), or if it is not this main
/// file's (its `user_version` is not the pairing the main file keeps in
/// `search_file`: a main file restored or replaced beside it): the main
/// file then owes it every text, its sessions' entries as their tail and
/// its recaps in `search_owed`. The tables of the index from before the
/// file are dropped from the main file, and each session's copy of its
/// watermark is brought down to the search file's (after a machine crash
/// the main file's log may have reached the disk and the search file's
/// not). The writer's connection, at open; each step checks what it
/// finds inside its own IMMEDIATE transaction, so two processes opening
/// at once take turns.
pub(super) fn prepare(conn: &Connection) -> Result<(), StoreError> {
    in_transaction(conn, |conn| {
        let paired: Option<i64> = conn
            .query_row(
                "SELECT pairing FROM main.search_file WHERE id = 1",
                [],
                |r| r.get(0),
            )
            .optional()?;
        let own: i64 = conn.query_row("PRAGMA search.user_version", [], |r| r.get(0))?;
        if made(conn, "search", "search_state")? && paired != Some(own) {
            tracing::warn!(
                file = FILE,
                "the search index's file is not this database's (one of the two was restored or replaced): it is made again, and every stored text indexed again"
            );
            drop_index(conn, "search", &["search_marks"])?;
        }
        Ok(())
    })?;
    let legacy = made(conn, "main", "search_state")?;
    in_transaction(conn, |conn| {
        if made(conn, "search", "search_state")? {
            return Ok(());
        }
        let stored: bool = conn.query_row(
            "SELECT EXISTS (SELECT 1 FROM main.entries) OR EXISTS (SELECT 1 FROM main.summaries)",
            [],
            |r| r.get(0),
        )?;
        if stored && !legacy {
            tracing::warn!(
                file = FILE,
                "the search index's file was not there (or was empty): it is made again, and every stored text indexed again"
            );
        }
        // Both files in one transaction: a crash between their commits
        // leaves either no tables here (made again next time) or tables
        // whose pairing the main file does not have (emptied next time).
        let pairing = i64::from(rand::random::<i32>() | 1);
        conn.execute_batch(
            "UPDATE main.sessions SET indexed_seq = 0 WHERE erasing IS NULL;
             INSERT OR IGNORE INTO main.search_owed (segment_id)
               SELECT segment_id FROM main.summaries;",
        )?;
        conn.execute(
            "INSERT OR REPLACE INTO main.search_file (id, pairing) VALUES (1, ?1)",
            [pairing],
        )?;
        // The language the main file's index had, with no backlog: the
        // tail owes every text. The server sets the configured one after.
        let language: String = if legacy {
            conn.query_row(
                "SELECT language FROM main.search_state WHERE id = 1",
                [],
                |r| r.get(0),
            )?
        } else {
            SearchLanguage::Simple.name().to_owned()
        };
        conn.execute_batch(concat!(
            "CREATE TABLE search.search_tables (
                 id INTEGER PRIMARY KEY AUTOINCREMENT,
                 tenant TEXT NOT NULL UNIQUE
             );
             CREATE TABLE search.search_marks (
                 session_id INTEGER PRIMARY KEY,
                 seq INTEGER NOT NULL
             );",
            super::schema::search_state_table!("search.")
        ))?;
        conn.execute(
            "INSERT INTO search.search_state (id, language) VALUES (1, ?1)",
            [&language],
        )?;
        conn.execute_batch(&format!("PRAGMA search.user_version = {pairing}"))
    })?;
    in_transaction(conn, |conn| {
        if !made(conn, "main", "search_state")? {
            return Ok(());
        }
        drop_index(conn, "main", &[])
    })?;
    in_transaction(conn, |conn| {
        conn.execute_batch(
            "UPDATE main.sessions SET indexed_seq = \
               coalesce((SELECT seq FROM search.search_marks WHERE session_id = sessions.id), 0) \
             WHERE erasing IS NULL AND indexed_seq > \
               coalesce((SELECT seq FROM search.search_marks WHERE session_id = sessions.id), 0)",
        )
    })
}

/// Drops the index's tables from `schema`: each tenant's, `search_tables`,
/// `search_state` and `also`.
fn drop_index(conn: &Connection, schema: &str, also: &[&str]) -> rusqlite::Result<()> {
    let tenants = tables(conn, schema)?.into_iter().map(name);
    let named = ["search_tables", "search_state"]
        .iter()
        .chain(also)
        .map(|t| t.to_string());
    for table in tenants.chain(named) {
        conn.execute_batch(&format!("DROP TABLE {schema}.{table}"))?;
    }
    Ok(())
}

/// Whether `schema` has a table named `table`.
fn made(conn: &Connection, schema: &str, table: &str) -> rusqlite::Result<bool> {
    conn.prepare(&format!(
        "SELECT EXISTS (SELECT 1 FROM {schema}.sqlite_schema WHERE name = ?1)"
    ))?
    .query_row([table], |r| r.get(0))
}

/// Runs `f` in an IMMEDIATE transaction of its own, rolled back if it fails.
fn in_transaction(
    conn: &Connection,
    f: impl FnOnce(&Connection) -> rusqlite::Result<()>,
) -> Result<(), StoreError> {
    conn.execute_batch("BEGIN IMMEDIATE")?;
    match f(conn).and_then(|()| conn.execute_batch("COMMIT")) {
        Ok(()) => Ok(()),
        Err(e) => {
            let _ = conn.execute_batch("ROLLBACK");
            Err(e.into())
        }
    }
}

/// The tokenizer of each language (FTS5 has stemming for English only).
fn tokenizer(language: SearchLanguage) -> &'static str {
    match language {
        SearchLanguage::Simple => "unicode61 remove_diacritics 2",
        SearchLanguage::English => "porter unicode61 remove_diacritics 2",
    }
}

/// The name of the tenant table `k`: made of a number only, so safe to
/// put in a statement's text.
pub(super) fn name(k: i64) -> String {
    format!("search_{k}")
}

/// The tenant's table, if it has one yet.
pub(super) fn table_of(conn: &Connection, tenant: &str) -> Result<Option<i64>, StoreError> {
    Ok(conn
        .prepare_cached("SELECT id FROM search_tables WHERE tenant = ?1")?
        .query_row([tenant], |r| r.get(0))
        .optional()?)
}

/// The tenant's table, made (with the index's language) if it has none.
/// In a transaction holding the search file's lock (`lock`).
pub(super) fn table_for(conn: &Connection, tenant: &str) -> Result<i64, StoreError> {
    if let Some(k) = table_of(conn, tenant)? {
        return Ok(k);
    }
    let language: String =
        conn.query_row("SELECT language FROM search_state WHERE id = 1", [], |r| {
            r.get(0)
        })?;
    let language = SearchLanguage::from_name(&language).ok_or_else(|| {
        StoreError::Corrupt(format!(
            "search_state names an unknown language {language:?}"
        ))
    })?;
    let k: i64 = conn
        .prepare_cached("INSERT INTO search_tables (tenant) VALUES (?1) RETURNING id")?
        .query_row([tenant], |r| r.get(0))?;
    let table = name(k);
    // secure-delete: a deleted document's terms leave the index pages too,
    // so an erased text is in no page of the file (with the connection's
    // PRAGMA secure_delete zeroing the freed ones).
    conn.execute_batch(&format!(
        "CREATE VIRTUAL TABLE search.{table} USING fts5(body, content = '', tokenize = '{}');
         INSERT INTO {table} ({table}, rank) VALUES ('secure-delete', 1);",
        tokenizer(language)
    ))?;
    set_automerge(conn, k)?;
    Ok(k)
}

/// FTS5's `automerge`: how many segments of one level it lets gather
/// before merging them into one of the next (FTS5's default is 4). At 8
/// each text is merged over fewer levels: indexing 400,000 of the ratios
/// bench's texts in batches of 20,000 cost 2.74 µs a text against 3.39 at
/// 4 (SQLite 3.54 outside archivist, docs/benchmarks.md), and the largest
/// batch's time fell too (84 ms against 98), merges being about a fifth
/// of the index's work. A search reads up to twice as many segments a
/// level, and was measured no slower for it (the ratios bench's
/// `--search-under-appends`); what it finds is the same.
pub(super) const AUTOMERGE: u32 = 8;

/// Gives table `k` this build's `automerge` unless it has it (tables made
/// before it was set get it when the store opens).
fn set_automerge(conn: &Connection, k: i64) -> Result<(), StoreError> {
    let table = name(k);
    let current: Option<i64> = conn
        .prepare_cached(&format!(
            "SELECT v FROM {table}_config WHERE k = 'automerge'"
        ))?
        .query_row([], |r| r.get(0))
        .optional()?;
    if current != Some(i64::from(AUTOMERGE)) {
        conn.execute(
            &format!("INSERT INTO {table} ({table}, rank) VALUES ('automerge', ?1)"),
            [AUTOMERGE],
        )?;
    }
    Ok(())
}

/// Gives every tenant table this build's `automerge` (at open, in the
/// writer's connection before it starts).
pub(super) fn tune_all(conn: &Connection) -> Result<(), StoreError> {
    for k in tables(conn, "search")? {
        set_automerge(conn, k)?;
    }
    Ok(())
}

/// Every tenant table's number, as `schema`'s `search_tables` lists them.
fn tables(conn: &Connection, schema: &str) -> rusqlite::Result<Vec<i64>> {
    conn.prepare(&format!("SELECT id FROM {schema}.search_tables"))?
        .query_map([], |r| r.get(0))?
        .collect()
}

/// Drops every tenant table (a language change: the tokenizer is fixed
/// when a table is made). The backlog then owes every text again.
pub(super) fn drop_all(conn: &Connection) -> Result<(), StoreError> {
    for k in tables(conn, "search")? {
        conn.execute_batch(&format!("DROP TABLE {}", name(k)))?;
    }
    conn.execute("DELETE FROM search_tables", [])?;
    Ok(())
}

/// Whether document `doc` is in table `k`.
pub(super) fn indexed(conn: &Connection, k: i64, doc: i64) -> Result<bool, StoreError> {
    Ok(conn
        .prepare_cached(&format!(
            "SELECT EXISTS (SELECT 1 FROM {}_docsize WHERE id = ?1)",
            name(k)
        ))?
        .query_row([doc], |r| r.get(0))?)
}

/// Indexes `body` as document `doc` of table `k`, unless it is there.
/// Returns whether it was indexed now.
pub(super) fn index(conn: &Connection, k: i64, doc: i64, body: &str) -> Result<bool, StoreError> {
    if indexed(conn, k, doc)? {
        return Ok(false);
    }
    let table = name(k);
    conn.prepare_cached(&format!(
        "INSERT INTO {table} (rowid, body) VALUES (?1, ?2)"
    ))?
    .execute(params![doc, body])?;
    Ok(true)
}

/// Takes document `doc` (whose text was `body`) out of table `k`, if it
/// is there.
pub(super) fn unindex(conn: &Connection, k: i64, doc: i64, body: &str) -> Result<(), StoreError> {
    if !indexed(conn, k, doc)? {
        return Ok(());
    }
    let table = name(k);
    conn.prepare_cached(&format!(
        "INSERT INTO {table} ({table}, rowid, body) VALUES ('delete', ?1, ?2)"
    ))?
    .execute(params![doc, body])?;
    Ok(())
}

/// The most owed recaps found indexed already that one pass reports.
const PASS_REPORTS: i64 = 10_000;

/// What one pass of the indexer did: texts indexed, each session's new
/// watermark (id, created_at, last seq), and the owed recaps it found
/// indexed (their `search_owed` ids), for the writer to note in the main
/// file (`indexer.rs`).
#[derive(Debug, Default)]
pub(super) struct Pass {
    pub(super) texts: u64,
    pub(super) marks: Vec<(i64, i64, i64)>,
    pub(super) recaps: Vec<i64>,
    /// It stopped at its limit with more of the tail left.
    pub(super) more: bool,
}

/// Indexes the tail (the module doc, "the tail") of `tenant`, or of every
/// tenant: each session's entries past its watermark in `search_marks`,
/// each tenant's in document order (FTS5 flushes its pending terms
/// whenever a rowid goes backwards, so recaps, whose documents are
/// negative, come first), and the recaps owed in `search_owed`; moves the
/// watermarks. Runs in the indexer's transaction, which holds the search
/// file's write lock (`lock`) before it reads the main file, so it reads a
/// main file no older than any erasure that waits for that lock. Sessions
/// being erased are left out.
///
/// At most `limit` texts a pass (a tail left by an upgrade or a crash
/// can be a whole history): `more` says it stopped there.
pub(super) fn index_tail(
    conn: &Connection,
    tenant: Option<&str>,
    limit: u64,
) -> Result<Pass, StoreError> {
    let mut pass = Pass::default();
    let mut left = i64::try_from(limit).unwrap_or(i64::MAX);
    // A measurement-only build (Cargo.toml) leaves appended texts out of
    // the index, to weigh the index against this same code.
    if cfg!(feature = "measure-unindexed") {
        return Ok(pass);
    }
    let tenants: Vec<String> = match tenant {
        Some(t) => vec![t.to_owned()],
        None => conn
            .prepare_cached(&format!(
                "SELECT tenant FROM sessions s WHERE {TAIL} AND {TRULY} \
                 UNION SELECT x.tenant FROM search_owed o JOIN segments g ON g.id = o.segment_id \
                 JOIN sessions x ON x.id = g.session_id"
            ))?
            .query_map([], |r| r.get(0))?
            .collect::<Result<_, _>>()?,
    };
    for tenant in tenants {
        let sessions: Vec<(i64, i64, i64, i64)> = conn
            .prepare_cached(&format!(
                "SELECT s.id, s.created_at, coalesce(m.seq, 0), s.next_seq - 1 FROM sessions s \
                 LEFT JOIN search_marks m ON m.session_id = s.id \
                 WHERE s.tenant = ?1 AND {TAIL} AND {TRULY} ORDER BY s.id"
            ))?
            .query_map([&tenant], |r| {
                Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?))
            })?
            .collect::<Result<_, _>>()?;
        // The owed recaps not indexed yet, `left` at most (those indexed
        // already wait only for the writer to forget them: a report lost
        // to a crash is made again here).
        let known = table_of(conn, &tenant)?;
        let unindexed = known.map_or(String::new(), |k| {
            format!(
                "AND NOT EXISTS (SELECT 1 FROM {}_docsize WHERE id = -o.segment_id)",
                name(k)
            )
        });
        let recaps: Vec<(i64, i64, String)> = conn
            .prepare_cached(&format!(
                "SELECT o.id, o.segment_id, m.text FROM search_owed o \
                 JOIN summaries m ON m.segment_id = o.segment_id \
                 JOIN segments g ON g.id = o.segment_id JOIN sessions x ON x.id = g.session_id \
                 WHERE x.tenant = ?1 AND x.erasing IS NULL {unindexed} \
                 ORDER BY o.segment_id DESC LIMIT ?2"
            ))?
            .query_map(params![&tenant, left], |r| {
                Ok((r.get(0)?, r.get(1)?, r.get(2)?))
            })?
            .collect::<Result<_, _>>()?;
        if let Some(k) = known {
            let done: Vec<i64> = conn
                .prepare_cached(&format!(
                    "SELECT o.id FROM search_owed o \
                     JOIN segments g ON g.id = o.segment_id JOIN sessions x ON x.id = g.session_id \
                     WHERE x.tenant = ?1 \
                     AND EXISTS (SELECT 1 FROM {}_docsize WHERE id = -o.segment_id) LIMIT ?2",
                    name(k)
                ))?
                .query_map(params![&tenant, PASS_REPORTS], |r| r.get(0))?
                .collect::<Result<_, _>>()?;
            pass.recaps.extend(done);
        }
        if sessions.is_empty() && recaps.is_empty() {
            continue;
        }
        let k = table_for(conn, &tenant)?;
        left -= i64::try_from(recaps.len()).unwrap_or(i64::MAX);
        for (owed, segment, text) in recaps {
            pass.texts += u64::from(index(conn, k, -segment, &text)?);
            pass.recaps.push(owed);
        }
        if left <= 0 {
            pass.more = true;
            return Ok(pass);
        }
        let table = name(k);
        // Session by session in id order, each one's entries in seq order
        // (its primary key's): document order with no sort of the texts.
        // No entry past a watermark is indexed yet: the backlog (index.rs)
        // takes only those up to it.
        let mut insert = conn.prepare_cached(&format!(
            "INSERT INTO {table} (rowid, body) SELECT (session_id << 32) | seq, content \
             FROM entries WHERE session_id = ?1 AND seq > ?2 AND seq <= ?3 ORDER BY seq"
        ))?;
        let mut mark = conn.prepare_cached(
            "INSERT INTO search_marks (session_id, seq) VALUES (?1, ?2) \
             ON CONFLICT (session_id) DO UPDATE SET seq = excluded.seq",
        )?;
        for (session, created_at, after, last) in sessions {
            // Seqs are gapless from 1 (a session loses entries only to its
            // erasure), so the limit is a seq.
            let upto = last.min(after.saturating_add(left));
            pass.texts += insert.execute(params![session, after, upto])? as u64;
            mark.execute(params![session, upto])?;
            pass.marks.push((session, created_at, upto));
            left -= upto - after;
            if upto < last {
                pass.more = true;
                return Ok(pass);
            }
        }
    }
    Ok(pass)
}

/// The sessions the main file holds to have a tail, as the partial index
/// `sessions_with_tail` (schema.rs) holds them: a statement must name it
/// in these words for SQLite to read that index. Their `indexed_seq` is
/// the writer's copy of the watermark and may lag it (the indexer moves
/// the watermark, then the writer its copy), never lead it.
const TAIL: &str = "s.next_seq > s.indexed_seq + 1";

/// Of those, the ones the search file's watermark says have a tail, and
/// are not being erased.
const TRULY: &str = "s.erasing IS NULL \
    AND s.next_seq - 1 > coalesce((SELECT seq FROM search_marks WHERE session_id = s.id), 0)";

/// Whether the tenant has a tail, or a recap owed to the index.
pub(super) fn tail_exists(conn: &Connection, tenant: &str) -> Result<bool, StoreError> {
    Ok(conn
        .prepare_cached(&format!(
            "SELECT EXISTS (SELECT 1 FROM sessions s WHERE s.tenant = ?1 AND {TAIL} AND {TRULY}) \
             OR EXISTS (SELECT 1 FROM search_owed o JOIN segments g ON g.id = o.segment_id \
                        JOIN sessions x ON x.id = g.session_id WHERE x.tenant = ?1)"
        ))?
        .query_row([tenant], |r| r.get(0))?)
}

/// The tail's size: texts appended and not indexed yet (of `tenant`, or of
/// every tenant), and when the oldest of them was stored.
pub(super) fn tail(
    conn: &Connection,
    tenant: Option<&str>,
) -> Result<(u64, Option<i64>), StoreError> {
    Ok(conn
        .prepare_cached(&format!(
            "SELECT coalesce(sum(s.next_seq - 1 - coalesce(m.seq, 0)), 0), \
             min((SELECT created_at FROM entries e \
                  WHERE e.session_id = s.id AND e.seq = coalesce(m.seq, 0) + 1)) \
             FROM sessions s LEFT JOIN search_marks m ON m.session_id = s.id \
             WHERE (?1 IS NULL OR s.tenant = ?1) AND {TAIL} AND {TRULY}"
        ))?
        .query_row([tenant], |r| Ok((r.get(0)?, r.get(1)?)))?)
}
