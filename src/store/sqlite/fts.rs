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
//! 25 µs for the same inserts made once at the end). Appends queue their
//! texts in a temporary table of the writer's connection (undone with the
//! job's savepoint like any other write) and the writer indexes them all,
//! in document order, just before the batch commits or before any other
//! kind of job runs (`flush_pending`), in the same transaction. Other
//! writers (summaries, the backlog, erasure) index and unindex at once.
//!
//! A document is indexed exactly when the table has its document-size row
//! (`search_<k>_docsize`): erasure unindexes only what was indexed (a
//! 'delete' of a document never inserted would corrupt the index), and the
//! backlog skips what is already there.

use rusqlite::{Connection, OptionalExtension, params};

use crate::config::SearchLanguage;
use crate::store::StoreError;

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
/// Writer only.
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
        "CREATE VIRTUAL TABLE {table} USING fts5(body, content = '', tokenize = '{}');
         INSERT INTO {table} ({table}, rank) VALUES ('secure-delete', 1);",
        tokenizer(language)
    ))?;
    Ok(k)
}

/// Drops every tenant table (a language change: the tokenizer is fixed
/// when a table is made). The backlog then owes every text again.
pub(super) fn drop_all(conn: &Connection) -> Result<(), StoreError> {
    let tables: Vec<i64> = conn
        .prepare("SELECT id FROM search_tables")?
        .query_map([], |r| r.get(0))?
        .collect::<Result<_, _>>()?;
    for k in tables {
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

/// Makes the writer connection's queue of texts appended and not indexed
/// yet. In memory: the text of an entry erased later must not be left in
/// a temporary file.
pub(super) fn prepare_writer(conn: &Connection) -> rusqlite::Result<()> {
    conn.pragma_update(None, "temp_store", "MEMORY")?;
    conn.execute_batch(
        "CREATE TEMP TABLE IF NOT EXISTS search_pending (
             doc INTEGER PRIMARY KEY,
             tenant TEXT NOT NULL,
             body TEXT NOT NULL
         )",
    )
}

/// Queues an appended entry's text for `flush_pending` (the writer's
/// connection only).
pub(super) fn queue(conn: &Connection, tenant: &str, doc: i64, body: &str) -> rusqlite::Result<()> {
    // A measurement-only build (Cargo.toml) leaves appended texts out of
    // the index, to weigh the index against this same code.
    if cfg!(feature = "measure-unindexed") {
        return Ok(());
    }
    conn.prepare_cached("INSERT INTO temp.search_pending (doc, tenant, body) VALUES (?1, ?2, ?3)")?
        .execute(params![doc, tenant, body])
        .map(drop)
}

/// Indexes every queued text, each tenant's in document order (FTS5
/// flushes its pending terms whenever a rowid goes backwards), and empties
/// the queue. Runs in the writer's open transaction, outside any job's
/// savepoint.
pub(super) fn flush_pending(conn: &Connection) -> Result<(), StoreError> {
    let tenants: Vec<String> = conn
        .prepare_cached("SELECT DISTINCT tenant FROM temp.search_pending")?
        .query_map([], |r| r.get(0))?
        .collect::<Result<_, _>>()?;
    if tenants.is_empty() {
        return Ok(());
    }
    for tenant in tenants {
        let table = name(table_for(conn, &tenant)?);
        conn.prepare_cached(&format!(
            "INSERT INTO {table} (rowid, body) \
             SELECT doc, body FROM temp.search_pending WHERE tenant = ?1 ORDER BY doc"
        ))?
        .execute([&tenant])?;
    }
    conn.prepare_cached("DELETE FROM temp.search_pending")?
        .execute([])?;
    Ok(())
}
