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
//! The tail: appended entries are indexed just behind the writer, in large
//! batches, not in the transaction that stores them. Each transaction that
//! writes to FTS5 writes a new segment and pays its share of the merges, so
//! indexing each group commit's few texts cost an append about as much as
//! storing it (docs/benchmarks.md, issue 38: 10.6 µs a text at 80 texts a
//! transaction, 2.6 µs at 4,000 outside archivist; inside, ten-entry
//! appends ran at 65 % of the unindexed rate with batches of 4,000, 72–84 %
//! with 20,000, the default). A session's `indexed_seq` is the
//! watermark: its entries past it are the tail (the partial index
//! `sessions_with_tail` holds the sessions that have one). The writer
//! indexes the whole tail (`index_tail`) before it commits the batch that
//! brings it to `[search] tail_texts`, in a batch that ends once it has
//! waited `tail_wait`, and at open (after kill -9: the watermark is in the
//! same transactions as the entries, so nothing past it is lost to Search).
//! An append costs one column of the session row it writes anyway.
//!
//! Read-your-writes: a search first has the writer index its tenant's tail
//! (`Sqlite::index_tail_of`; one writer job, only when the tail is not
//! empty), then reads the index alone. Chosen over scanning the tail at
//! read time (its texts put in an in-memory FTS5 table beside the query):
//! the hits of one index are ranked by one set of bm25 statistics, every
//! query form (phrases, prefixes, exclusions, the common-term probe) works
//! unchanged, and a search pays for the tail only when one is there, at
//! the large-batch price. The cost is a search waiting on the writer's
//! queue when its tenant has appended since the last indexing
//! (docs/benchmarks.md measures it under appends).
//!
//! Erasure: the tail holds no text (the watermark points into `entries`);
//! erasing a session moves its watermark to its end in the tombstoning
//! transaction, so nothing indexes its entries after that, and the
//! batches that delete its entries unindex what was indexed.
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
/// before it was set get it when the store opens). Writer only.
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
    for k in tables(conn)? {
        set_automerge(conn, k)?;
    }
    Ok(())
}

/// Every tenant table's number.
fn tables(conn: &Connection) -> Result<Vec<i64>, StoreError> {
    Ok(conn
        .prepare("SELECT id FROM search_tables")?
        .query_map([], |r| r.get(0))?
        .collect::<Result<_, _>>()?)
}

/// Drops every tenant table (a language change: the tokenizer is fixed
/// when a table is made). The backlog then owes every text again.
pub(super) fn drop_all(conn: &Connection) -> Result<(), StoreError> {
    for k in tables(conn)? {
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

/// Indexes the tail (fts.rs's module doc, "the tail"): every session's
/// entries past its `indexed_seq`, of `tenant` alone or of every tenant,
/// each tenant's in document order (FTS5 flushes its pending terms
/// whenever a rowid goes backwards), and moves each session's watermark to
/// its last entry. Runs in the writer's open transaction, after what
/// `Kept` holds is written (the watermark reads `next_seq`). Returns how
/// many texts it indexed.
pub(super) fn index_tail(conn: &Connection, tenant: Option<&str>) -> Result<u64, StoreError> {
    // A measurement-only build (Cargo.toml) leaves appended texts out of
    // the index, to weigh the index against this same code.
    if cfg!(feature = "measure-unindexed") {
        return Ok(0);
    }
    let tenants: Vec<String> = match tenant {
        Some(t) => vec![t.to_owned()],
        None => conn
            .prepare_cached(&format!(
                "SELECT DISTINCT tenant FROM sessions WHERE {TAIL}"
            ))?
            .query_map([], |r| r.get(0))?
            .collect::<Result<_, _>>()?,
    };
    let mut texts = 0u64;
    for tenant in tenants {
        if !tail_exists(conn, &tenant)? {
            continue;
        }
        let table = name(table_for(conn, &tenant)?);
        // A text the backlog indexed already (a language change owes every
        // stored one) has its document size row: a second insert would
        // count its terms twice. Looked for only while a backlog is owed
        // (a lookup per text otherwise spared).
        let owed: bool = conn
            .prepare_cached("SELECT entries_after IS NOT NULL FROM search_state WHERE id = 1")?
            .query_row([], |r| r.get(0))?;
        let guard = if owed {
            format!(
                "AND NOT EXISTS (SELECT 1 FROM {table}_docsize WHERE id = (session_id << 32) | seq)"
            )
        } else {
            String::new()
        };
        // Session by session in id order, each one's entries in seq order
        // (its primary key's): document order with no sort of the texts.
        let sessions: Vec<(i64, i64)> = conn
            .prepare_cached(&format!(
                "SELECT id, indexed_seq FROM sessions WHERE tenant = ?1 AND {TAIL} ORDER BY id"
            ))?
            .query_map([&tenant], |r| Ok((r.get(0)?, r.get(1)?)))?
            .collect::<Result<_, _>>()?;
        let mut insert = conn.prepare_cached(&format!(
            "INSERT INTO {table} (rowid, body) SELECT (session_id << 32) | seq, content \
             FROM entries WHERE session_id = ?1 AND seq > ?2 {guard} ORDER BY seq"
        ))?;
        for (session, after) in sessions {
            texts += insert.execute(params![session, after])? as u64;
        }
        conn.prepare_cached(&format!(
            "UPDATE sessions SET indexed_seq = next_seq - 1 WHERE tenant = ?1 AND {TAIL}"
        ))?
        .execute([&tenant])?;
    }
    Ok(texts)
}

/// The sessions with a tail, as the partial index `sessions_with_tail`
/// (schema.rs) holds them: a statement must name it in these words for
/// SQLite to read that index.
const TAIL: &str = "next_seq > indexed_seq + 1";

/// Whether the tenant has a tail.
pub(super) fn tail_exists(conn: &Connection, tenant: &str) -> Result<bool, StoreError> {
    Ok(conn
        .prepare_cached(&format!(
            "SELECT EXISTS (SELECT 1 FROM sessions WHERE tenant = ?1 AND {TAIL})"
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
            "SELECT coalesce(sum(next_seq - 1 - indexed_seq), 0), \
             min((SELECT created_at FROM entries e \
                  WHERE e.session_id = x.id AND e.seq = x.indexed_seq + 1)) \
             FROM sessions x WHERE (?1 IS NULL OR tenant = ?1) AND {TAIL}"
        ))?
        .query_row([tenant], |r| Ok((r.get(0)?, r.get(1)?)))?)
}
