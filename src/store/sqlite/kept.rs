//! What the writer keeps of appends in memory: each session's row and its
//! open segment's counts, and each tenant's stored bytes, as the batch's
//! appends left them. An append then reads nothing but its idempotency
//! keys, and a session's row, its open segment and its tenant's bytes are
//! written once per batch, just before the COMMIT, however many appends
//! changed them.
//!
//! It is only ever a copy of what the database holds (or will hold once the
//! batch commits): the writer forgets it all before any job that is not an
//! append, when a batch fails, and when another connection (a backfill run
//! beside the server) has committed since its last batch.

use std::collections::HashMap;

use rusqlite::{Connection, params};

use crate::model::{Millis, SegmentId};

/// Sessions kept at most; past it, what is kept is forgotten after the
/// next write (a cache of the active sessions, not of them all).
const MAX_KEPT_SESSIONS: usize = 4096;

/// A session's row as the appends of this batch left it.
#[derive(Clone, Debug)]
pub(super) struct KeptSession {
    pub(super) id: i64,
    pub(super) next_seq: u64,
    pub(super) next_ordinal: u32,
    pub(super) open: Option<OpenSegment>,
    /// Whose memory it is; fixed at creation, so never written back.
    pub(super) subject: Option<String>,
    /// The last append that stored something, if one did since the row
    /// was last written.
    pub(super) appended_at: Option<Millis>,
    /// When its newest entry was said (none yet: `None`); a later entry
    /// may not be said before it.
    pub(super) newest: Option<Millis>,
}

/// A session's open segment: its counts as the appends left them.
#[derive(Clone, Debug)]
pub(super) struct OpenSegment {
    pub(super) id: SegmentId,
    pub(super) entries: u32,
    pub(super) tokens: u32,
    pub(super) last_seq: u64,
    /// Its counts changed since they were last written.
    pub(super) touched: bool,
}

impl OpenSegment {
    /// Writes its counts.
    pub(super) fn save(&mut self, conn: &Connection) -> rusqlite::Result<()> {
        conn.prepare_cached(
            "UPDATE segments SET entry_count = ?1, token_estimate = ?2, last_seq = ?3 \
             WHERE id = ?4",
        )?
        .execute(params![self.entries, self.tokens, self.last_seq, self.id])?;
        self.touched = false;
        Ok(())
    }
}

#[derive(Default)]
struct KeptTenant {
    /// Its stored bytes, counting what this batch has not yet written.
    stored: u64,
    /// Bytes added since the row was last written.
    unwritten: u64,
    sessions: HashMap<String, (KeptSession, bool)>,
}

/// See the module's documentation.
#[derive(Default)]
pub(crate) struct Kept {
    tenants: HashMap<String, KeptTenant>,
    /// Sessions changed since the last write: (tenant, name).
    changed: Vec<(String, String)>,
    sessions: usize,
    /// `PRAGMA data_version` when the last batch began: it changes when
    /// another connection commits.
    data_version: Option<i64>,
    /// Entries the batch's appends stored, all of them the search index's
    /// tail until it is indexed (the writer adds them to its count).
    unindexed: u64,
}

impl Kept {
    /// The tenant's session of that name and the tenant's stored bytes, as
    /// kept; `None` when either is not kept.
    pub(super) fn get(&self, tenant: &str, name: &str) -> Option<(KeptSession, u64)> {
        let t = self.tenants.get(tenant)?;
        let (session, _) = t.sessions.get(name)?;
        Some((session.clone(), t.stored))
    }

    /// The tenant's stored bytes, if kept.
    pub(super) fn stored(&self, tenant: &str) -> Option<u64> {
        self.tenants.get(tenant).map(|t| t.stored)
    }

    /// Keeps what a successful append left: the session's row (to be
    /// written before the COMMIT) and `added` bytes for its tenant, whose
    /// stored bytes were `stored` before the append.
    pub(super) fn put(
        &mut self,
        tenant: &str,
        name: &str,
        session: KeptSession,
        stored: u64,
        added: u64,
    ) {
        let t = match self.tenants.get_mut(tenant) {
            Some(t) => t,
            None => self.tenants.entry(tenant.to_owned()).or_default(),
        };
        t.stored = stored.saturating_add(added);
        t.unwritten = t.unwritten.saturating_add(added);
        match t.sessions.get_mut(name) {
            Some((kept, changed)) => {
                *kept = session;
                if !*changed {
                    *changed = true;
                    self.changed.push((tenant.to_owned(), name.to_owned()));
                }
            }
            None => {
                t.sessions.insert(name.to_owned(), (session, true));
                self.sessions += 1;
                self.changed.push((tenant.to_owned(), name.to_owned()));
            }
        }
    }

    /// Counts `n` entries stored by a successful append.
    pub(super) fn note_unindexed(&mut self, n: u64) {
        self.unindexed = self.unindexed.saturating_add(n);
    }

    /// The entries stored since the last call.
    pub(super) fn take_unindexed(&mut self) -> u64 {
        std::mem::take(&mut self.unindexed)
    }

    /// Writes every row the appends changed since the last write: each
    /// session once, its open segment's counts once, each tenant's bytes
    /// once. Past `MAX_KEPT_SESSIONS`, forgets everything once written.
    pub(super) fn write(&mut self, conn: &Connection) -> rusqlite::Result<()> {
        for (tenant, name) in std::mem::take(&mut self.changed) {
            let Some((session, changed)) = self
                .tenants
                .get_mut(&tenant)
                .and_then(|t| t.sessions.get_mut(&name))
            else {
                continue;
            };
            if let Some(open) = &mut session.open
                && open.touched
            {
                open.save(conn)?;
            }
            conn.prepare_cached(
                "UPDATE sessions SET next_seq = ?1, next_ordinal = ?2, open_segment_id = ?3, \
                 last_append_at = coalesce(?4, last_append_at), \
                 last_said_at = coalesce(?6, last_said_at) WHERE id = ?5",
            )?
            .execute(params![
                session.next_seq,
                session.next_ordinal,
                session.open.as_ref().map(|o| o.id),
                session.appended_at.map(|t| t.0),
                session.id,
                // When its newest entry was said, with what was stored.
                session.appended_at.take().and(session.newest).map(|t| t.0),
            ])?;
            *changed = false;
        }
        for (tenant, t) in &mut self.tenants {
            if t.unwritten > 0 {
                conn.prepare_cached(
                    "INSERT INTO tenant_usage (tenant, stored_bytes) VALUES (?1, ?2) \
                     ON CONFLICT (tenant) DO UPDATE SET stored_bytes = stored_bytes + ?2",
                )?
                .execute(params![tenant, t.unwritten])?;
                t.unwritten = 0;
            }
        }
        if self.sessions > MAX_KEPT_SESSIONS {
            self.forget();
        }
        Ok(())
    }

    /// Forgets everything kept (whatever was not written is lost: only for
    /// after a write, or when the batch that changed it failed).
    pub(super) fn forget(&mut self) {
        self.tenants.clear();
        self.changed.clear();
        self.sessions = 0;
    }

    /// Forgets everything if another connection has committed since the
    /// last batch began (or if that cannot be told).
    pub(super) fn forget_if_changed(&mut self, conn: &Connection) {
        let now = conn
            .prepare_cached("PRAGMA data_version")
            .and_then(|mut s| s.query_row([], |r| r.get::<_, i64>(0)))
            .ok();
        if now.is_none() || now != self.data_version {
            self.forget();
        }
        self.data_version = now;
    }
}
