//! The semantic leg's cache: per tenant, the unit vectors of one
//! generation in memory, contiguous f32 (n × dimensions), with per slot
//! what the scope's filters read (document, session, level, role, time)
//! and the vector's `seq`. Owned by the `Sqlite` store; loaded by the
//! first semantic search of the tenant, and brought up to date by each
//! one from the tick of `vector_clock` it was read at: vectors stored
//! since (by any process on the file) are appended, vectors deleted since
//! (`vectors_gone`) and vectors replaced are marked dead, and dead slots
//! are compacted away once they are a quarter of the cache. A search
//! then compares the query with every live slot that passes the filters
//! (an exact dot product), and reads its hits back through SQL in its own
//! snapshot, where every filter and the vector's generation and seq are
//! checked again: whatever the cache holds, a hit is only ever a text
//! the statement finds (one that fails is passed over and the next
//! taken).
//!
//! Memory: 4 bytes × dimensions per vector (1.5 KiB at 384) and about 80
//! bytes of slot and index beside it; all tenants' caches together stay
//! within `BUDGET_BYTES`. A load first counts the tenant's vectors (its
//! sessions lead every loading statement, so neither the count nor the
//! load reads, or takes time from, another tenant's vectors) and reserves
//! their bytes before it reads them, so loads at once cannot together pass
//! the budget. Room is made by dropping other caches, the least recently
//! searched first, but only caches at least as large as the one coming
//! in, or not searched for `STALE_SEARCHES` searches: a tenant's search
//! never pushes a smaller working cache out, so two tenants cannot evict
//! each other on every call. A cache that cannot be admitted (or a tenant
//! whose generation alone is past the budget) is searched by the SQL scan.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock, RwLockReadGuard};

use rusqlite::{Connection, params};

use super::search::{
    ScopeValues, entry_filters, entry_said, row, summary_filters, summary_hit_said, summary_said,
};
use crate::model::Tenant;
use crate::store::StoreError;
use crate::store::embeddings::{SemanticLeg, cosine, from_bytes};
use crate::store::search::{SearchHit, SearchScope};

/// What every tenant's cache may hold together, vectors and slots: 512
/// MiB, about 340,000 vectors of 384 dimensions (or 85,000 of 1,536).
pub(super) const BUDGET_BYTES: usize = 512 << 20;
/// Bytes a slot costs beside its vector (the slot, the document index).
const SLOT_BYTES: usize = 80;
/// The ticks of deletions `vectors_gone` keeps (schema.rs prunes older
/// ones): a cache further behind loads whole.
const WINDOW: i64 = 100_000;
/// Dead slots past this share of the cache (and past `MIN_DEAD`) are
/// compacted away.
const DEAD_SHARE: usize = 4;
const MIN_DEAD: usize = 1024;
/// A cache not searched during this many searches (of any tenant) is no
/// longer anyone's working set: any cache coming in may drop it, even a
/// larger one.
const STALE_SEARCHES: u64 = 1000;

/// One text's vector, as the filters see it.
#[derive(Clone, Copy, Debug)]
struct Slot {
    doc: i64,
    /// The vector's tick (0: stored before ticks were kept).
    seq: i64,
    /// When the text was said (an entry's occurred_at, a summary's last
    /// entry's), what after / before read.
    created_at: i64,
    /// Index into `Cache::sessions`.
    session: u32,
    /// 0 for an entry, the node's level for a summary.
    level: u32,
    /// An entry's role code (summaries: 0).
    role: u8,
    dead: bool,
}

/// One tenant's vectors of one generation.
struct Cache {
    generation: String,
    dims: usize,
    /// The tick of `vector_clock` this cache is up to date with.
    clock: i64,
    data: Vec<f32>,
    slots: Vec<Slot>,
    /// The live slot of each document.
    by_doc: HashMap<i64, u32>,
    /// Session ids, by the index slots hold.
    sessions: Vec<i64>,
    session_ix: HashMap<i64, u32>,
    dead: usize,
}

/// One row of the loading statements.
struct Loaded {
    doc: i64,
    seq: i64,
    session: i64,
    vector: Vec<u8>,
    created_at: i64,
    role: u8,
    level: u32,
}

impl Cache {
    fn new(generation: &str, clock: i64) -> Cache {
        Cache {
            generation: generation.to_owned(),
            dims: 0,
            clock,
            data: Vec::new(),
            slots: Vec::new(),
            by_doc: HashMap::new(),
            sessions: Vec::new(),
            session_ix: HashMap::new(),
            dead: 0,
        }
    }

    fn bytes(&self) -> usize {
        self.data.len() * 4 + self.slots.len() * SLOT_BYTES
    }

    fn kill(&mut self, i: usize) {
        if let Some(s) = self.slots.get_mut(i)
            && !s.dead
        {
            s.dead = true;
            self.dead += 1;
            if self.by_doc.get(&s.doc) == Some(&(i as u32)) {
                self.by_doc.remove(&s.doc);
            }
        }
    }

    /// Adds a stored vector; the document's older one, if any, is dead.
    fn add(&mut self, l: Loaded) -> Result<(), StoreError> {
        let vector = from_bytes(&l.vector)
            .ok_or_else(|| StoreError::Corrupt(format!("vector of {}", l.doc)))?;
        if self.dims == 0 {
            self.dims = vector.len();
        }
        if let Some(&old) = self.by_doc.get(&l.doc) {
            if self.slots[old as usize].seq >= l.seq {
                return Ok(());
            }
            self.kill(old as usize);
        }
        let i = self.slots.len() as u32;
        let session = match self.session_ix.get(&l.session) {
            Some(&k) => k,
            None => {
                let k = self.sessions.len() as u32;
                self.sessions.push(l.session);
                self.session_ix.insert(l.session, k);
                k
            }
        };
        let mut slot = Slot {
            doc: l.doc,
            seq: l.seq,
            created_at: l.created_at,
            session,
            level: l.level,
            role: l.role,
            dead: false,
        };
        // Another length is not this generation's: kept out of the data
        // (never compared), and out of the counts.
        if vector.len() == self.dims {
            self.data.extend_from_slice(&vector);
        } else {
            self.data.extend(std::iter::repeat_n(0.0, self.dims));
            slot.dead = true;
            self.dead += 1;
        }
        self.slots.push(slot);
        if !slot.dead {
            self.by_doc.insert(l.doc, i);
        }
        Ok(())
    }

    /// Drops the dead slots once they are too many.
    fn compact(&mut self) {
        if self.dead < MIN_DEAD || self.dead * DEAD_SHARE < self.slots.len() {
            return;
        }
        let dims = self.dims;
        let mut data = Vec::with_capacity((self.slots.len() - self.dead) * dims);
        let mut slots = Vec::with_capacity(self.slots.len() - self.dead);
        for (i, s) in self.slots.iter().enumerate() {
            if !s.dead {
                data.extend_from_slice(&self.data[i * dims..(i + 1) * dims]);
                slots.push(*s);
            }
        }
        self.by_doc = slots
            .iter()
            .enumerate()
            .map(|(i, s)| (s.doc, i as u32))
            .collect();
        self.data = data;
        self.slots = slots;
        self.dead = 0;
    }
}

/// A tenant's place in the cache.
#[derive(Default)]
struct Tenanted {
    cache: RwLock<Option<Cache>>,
    /// What the budget counts for it: what its cache holds, or while it
    /// loads, what it reserved. Raised only by `Vectors::admit`.
    bytes: AtomicUsize,
    /// When it was last searched (a counter), for eviction.
    used: AtomicU64,
}

#[cfg(test)]
type LoadHook = Box<dyn Fn(&str) + Send + Sync>;

/// Every tenant's cache (one per store).
pub(super) struct Vectors {
    tenants: Mutex<HashMap<String, Arc<Tenanted>>>,
    ticks: AtomicU64,
    /// `BUDGET_BYTES`, but for tests.
    budget: AtomicUsize,
    /// Called with the tenant once a load has reserved its bytes, before
    /// it reads them (tests hold a load there).
    #[cfg(test)]
    before_load: Mutex<Option<LoadHook>>,
}

impl Default for Vectors {
    fn default() -> Vectors {
        Vectors {
            tenants: Mutex::default(),
            ticks: AtomicU64::default(),
            budget: AtomicUsize::new(BUDGET_BYTES),
            #[cfg(test)]
            before_load: Mutex::default(),
        }
    }
}

/// How many vectors of the tenant and generation (?1 generation, ?2
/// tenant) there are, and their largest length; through the tenant's
/// sessions (the `(tenant, name)` index), then each session's vectors
/// (`embeddings_in_scope`): CROSS JOIN keeps that order, so no other
/// tenant's vector is read.
const COUNT: &str = "\
    SELECT count(*), max(length(v.vector)) / 4 \
    FROM sessions x CROSS JOIN embeddings v \
    WHERE x.tenant = ?2 AND v.generation = ?1 AND v.session_id = x.id";

/// The vectors of the tenant and generation (?1 generation, ?2 tenant)
/// with what the filters read, stored after tick ?3: entries, then
/// summaries. The embeddings index leads, so the cost follows what is new.
const CHANGED: &str = "\
    SELECT v.doc, coalesce(v.seq, 0), v.session_id, v.vector, \
    coalesce(e.occurred_at, e.created_at), e.role, 0 \
    FROM embeddings v INDEXED BY embeddings_by_seq CROSS JOIN sessions x \
    CROSS JOIN entries e \
    WHERE v.generation = ?1 AND v.seq > ?3 AND v.doc > 0 AND x.id = v.session_id \
    AND x.tenant = ?2 AND e.session_id = v.session_id AND e.seq = (v.doc & 4294967295) \
    UNION ALL \
    SELECT v.doc, coalesce(v.seq, 0), v.session_id, v.vector, \
    (SELECT coalesce(l.occurred_at, l.created_at) FROM entries l \
    WHERE l.session_id = g.session_id AND l.seq = g.last_seq), 0, g.level \
    FROM embeddings v INDEXED BY embeddings_by_seq CROSS JOIN sessions x \
    CROSS JOIN segments g CROSS JOIN summaries s \
    WHERE v.generation = ?1 AND v.seq > ?3 AND v.doc < 0 AND x.id = v.session_id \
    AND x.tenant = ?2 AND g.id = -v.doc AND s.segment_id = g.id";

/// As `CHANGED`, every one (a first load): the tenant's sessions lead, as
/// in `COUNT` (a plain JOIN let the planner start from the generation's
/// vectors, every tenant's).
const ALL: &str = "\
    SELECT v.doc, coalesce(v.seq, 0), v.session_id, v.vector, \
    coalesce(e.occurred_at, e.created_at), e.role, 0 \
    FROM sessions x CROSS JOIN embeddings v CROSS JOIN entries e \
    WHERE x.tenant = ?2 AND v.generation = ?1 AND v.session_id = x.id AND v.doc > 0 \
    AND e.session_id = v.session_id AND e.seq = (v.doc & 4294967295) \
    UNION ALL \
    SELECT v.doc, coalesce(v.seq, 0), v.session_id, v.vector, \
    (SELECT coalesce(l.occurred_at, l.created_at) FROM entries l \
    WHERE l.session_id = g.session_id AND l.seq = g.last_seq), 0, g.level \
    FROM sessions x CROSS JOIN embeddings v CROSS JOIN segments g CROSS JOIN summaries s \
    WHERE x.tenant = ?2 AND v.generation = ?1 AND v.session_id = x.id AND v.doc < 0 \
    AND g.id = -v.doc AND s.segment_id = g.id";

/// The scope's sessions (?1 tenant, ?2 subject, ?3 names), erased ones
/// left out.
const SESSIONS: &str = "SELECT x.id FROM sessions x WHERE x.tenant = ?1 AND x.erasing IS NULL \
     AND (?2 IS NULL OR x.subject = ?2) \
     AND (?3 IS NULL OR x.name IN (SELECT value FROM json_each(?3)))";

/// How many texts the scope holds (over ?2..?9; ?1 unused). Without a
/// time or role filter a session's entries are counted by its next seq
/// (entries go only with their whole session), not read.
const TOTAL: &str = concat!(
    "SELECT CASE WHEN ?5 IS NULL AND ?6 IS NULL AND ?7 IS NULL AND ?9 IS NULL \
     THEN (SELECT coalesce(sum(x.next_seq - 1), 0) FROM sessions x \
     WHERE x.tenant = ?2 AND x.erasing IS NULL AND (?3 IS NULL OR x.subject = ?3) \
     AND (?4 IS NULL OR x.name IN (SELECT value FROM json_each(?4))) \
     AND 0 IN (SELECT value FROM json_each(?8))) \
     ELSE (SELECT count(*) FROM sessions x JOIN entries e ON e.session_id = x.id WHERE ",
    entry_filters!(),
    ") END + (SELECT count(*) FROM sessions x JOIN segments g ON g.session_id = x.id \
     JOIN summaries s ON s.segment_id = g.id WHERE ",
    summary_filters!(),
    ")"
);

/// A candidate read back: ?1 generation, the scope's ?2..?9, ?10 the
/// document, ?11 the vector's seq. Entries, then summaries.
const ENTRY_HIT: &str = concat!(
    "SELECT x.name, 0, e.seq, e.seq, NULL, e.role, e.created_at, e.content, ",
    entry_said!(),
    " FROM embeddings v JOIN sessions x ON x.id = v.session_id \
     JOIN entries e ON e.session_id = v.session_id AND e.seq = (v.doc & 4294967295) \
     WHERE v.doc = ?10 AND v.generation = ?1 AND coalesce(v.seq, 0) = ?11 \
     AND v.session_id = (?10 >> 32) AND ",
    entry_filters!()
);
const SUMMARY_HIT: &str = concat!(
    "SELECT x.name, g.level, g.first_seq, g.last_seq, g.id, NULL, s.created_at, s.text, ",
    summary_hit_said!(),
    " FROM embeddings v JOIN segments g ON g.id = -v.doc \
     JOIN summaries s ON s.segment_id = g.id JOIN sessions x ON x.id = g.session_id \
     WHERE v.doc = ?10 AND v.generation = ?1 AND coalesce(v.seq, 0) = ?11 AND ",
    summary_filters!()
);

fn loaded(r: &rusqlite::Row<'_>) -> rusqlite::Result<Loaded> {
    Ok(Loaded {
        doc: r.get(0)?,
        seq: r.get(1)?,
        session: r.get(2)?,
        vector: r.get(3)?,
        created_at: r.get(4)?,
        role: u8::try_from(r.get::<_, i64>(5)?).unwrap_or(0),
        level: u32::try_from(r.get::<_, i64>(6)?).unwrap_or(u32::MAX),
    })
}

fn read<T>(l: &RwLock<T>) -> RwLockReadGuard<'_, T> {
    l.read().unwrap_or_else(|e| e.into_inner())
}

impl Vectors {
    fn tenant(&self, tenant: &str) -> Arc<Tenanted> {
        let mut tenants = self.tenants.lock().unwrap_or_else(|e| e.into_inner());
        let t = tenants.entry(tenant.to_owned()).or_default().clone();
        t.used.store(
            self.ticks.fetch_add(1, Ordering::Relaxed),
            Ordering::Relaxed,
        );
        t
    }

    /// Lets `t` count `need` bytes in all (a reservation before its load,
    /// or its cache once grown), making room by dropping other caches, the
    /// least recently searched first, among those it may drop: larger than
    /// `need` (so neither of two caches of one size drops the other), or
    /// stale. False, with nothing dropped and `t`'s count
    /// unchanged, when that cannot make room. A cache being searched or
    /// loaded (its lock held) is never dropped; one loading counts what it
    /// reserved.
    fn admit(&self, t: &Arc<Tenanted>, need: usize) -> bool {
        let budget = self.budget.load(Ordering::Relaxed);
        if need > budget {
            return false;
        }
        // Held throughout: every raise of a count is decided under it, so
        // two admissions never both count on the same room.
        let tenants = self.tenants.lock().unwrap_or_else(|e| e.into_inner());
        let now = self.ticks.load(Ordering::Relaxed);
        let mut others: Vec<(&Arc<Tenanted>, usize)> = tenants
            .values()
            .filter(|o| !Arc::ptr_eq(o, t))
            .map(|o| (o, o.bytes.load(Ordering::Relaxed)))
            .filter(|&(_, bytes)| bytes > 0)
            .collect();
        let held: usize = others.iter().map(|&(_, bytes)| bytes).sum();
        let mut over = (held + need).saturating_sub(budget);
        if over > 0 {
            others.retain(|&(o, bytes)| {
                bytes > need || now.saturating_sub(o.used.load(Ordering::Relaxed)) > STALE_SEARCHES
            });
            others.sort_by_key(|&(o, _)| o.used.load(Ordering::Relaxed));
            let mut dropped = Vec::new();
            for (o, bytes) in others {
                if over == 0 {
                    break;
                }
                if let Ok(guard) = o.cache.try_write() {
                    dropped.push((o, guard));
                    over = over.saturating_sub(bytes);
                }
            }
            if over > 0 {
                return false;
            }
            for (o, mut guard) in dropped {
                *guard = None;
                o.bytes.store(0, Ordering::Relaxed);
            }
        }
        t.bytes.store(need, Ordering::Relaxed);
        true
    }

    /// Brings the tenant's cache of `generation` up to tick `clock` (the
    /// snapshot's); None when it does not fit the budget.
    fn refresh(
        &self,
        conn: &Connection,
        t: &Arc<Tenanted>,
        tenant: &str,
        generation: &str,
        clock: i64,
    ) -> Result<bool, StoreError> {
        let mut guard = t.cache.write().unwrap_or_else(|e| e.into_inner());
        let current = guard
            .as_ref()
            .is_some_and(|c| c.generation == generation && clock - c.clock <= WINDOW);
        if !current {
            *guard = None;
            t.bytes.store(0, Ordering::Relaxed);
            let (count, dims): (i64, Option<i64>) = conn
                .prepare_cached(COUNT)?
                .query_row(params![generation, tenant], |r| Ok((r.get(0)?, r.get(1)?)))?;
            let count = usize::try_from(count).unwrap_or(usize::MAX);
            let dims = dims.and_then(|d| usize::try_from(d).ok()).unwrap_or(0);
            let need = count.saturating_mul(dims.saturating_mul(4).saturating_add(SLOT_BYTES));
            // Reserved before a byte is read: a load beside this one sees
            // the room as taken.
            if !self.admit(t, need) {
                return Ok(false);
            }
            #[cfg(test)]
            if let Some(hook) = self
                .before_load
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .as_ref()
            {
                hook(tenant);
            }
            let cache = load(conn, generation, tenant, clock, count, dims);
            let fits = match &cache {
                // The load reads, in the count's snapshot, no more than
                // was counted; should it, it is admitted again.
                Ok(c) => c.bytes() <= need || self.admit(t, c.bytes()),
                Err(_) => false,
            };
            match cache {
                Ok(c) if fits => {
                    t.bytes.store(c.bytes(), Ordering::Relaxed);
                    *guard = Some(c);
                    return Ok(true);
                }
                other => {
                    t.bytes.store(0, Ordering::Relaxed);
                    return other.map(|_| false);
                }
            }
        }
        let Some(cache) = guard.as_mut() else {
            return Ok(false);
        };
        if cache.clock >= clock {
            return Ok(true);
        }
        // Stored and deleted since, in tick order: a document deleted and
        // stored again (a summary re-embedded) ends alive, and the other
        // way round dead.
        let mut changes: Vec<(i64, Option<Loaded>, i64)> = conn
            .prepare_cached(CHANGED)?
            .query_map(params![generation, tenant, cache.clock], |r| {
                let l = loaded(r)?;
                Ok((l.seq, l.doc, l))
            })?
            .map(|r| r.map(|(seq, doc, l)| (seq, Some(l), doc)))
            .collect::<Result<_, _>>()?;
        let gone = conn
            .prepare_cached(
                "SELECT seq, doc FROM vectors_gone WHERE seq > ?3 AND tenant = ?2 \
                 AND generation = ?1",
            )?
            .query_map(params![generation, tenant, cache.clock], |r| {
                Ok((r.get::<_, i64>(0)?, None, r.get::<_, i64>(1)?))
            })?
            .collect::<Result<Vec<_>, _>>()?;
        changes.extend(gone);
        changes.sort_by_key(|c| c.0);
        for (seq, stored, doc) in changes {
            match stored {
                Some(l) => cache.add(l)?,
                None => {
                    if let Some(&i) = cache.by_doc.get(&doc)
                        && cache.slots[i as usize].seq < seq
                    {
                        cache.kill(i as usize);
                    }
                }
            }
        }
        cache.clock = clock;
        cache.compact();
        let bytes = cache.bytes();
        if bytes <= t.bytes.load(Ordering::Relaxed) || self.admit(t, bytes) {
            t.bytes.store(bytes, Ordering::Relaxed);
            return Ok(true);
        }
        *guard = None;
        t.bytes.store(0, Ordering::Relaxed);
        Ok(false)
    }
}

/// Reads the tenant's vectors of `generation` (`count` of up to `dims`
/// dimensions, as counted) into a new cache at tick `clock`.
fn load(
    conn: &Connection,
    generation: &str,
    tenant: &str,
    clock: i64,
    count: usize,
    dims: usize,
) -> Result<Cache, StoreError> {
    let mut cache = Cache::new(generation, clock);
    cache.data.reserve(count.saturating_mul(dims));
    cache.slots.reserve(count);
    let mut stmt = conn.prepare_cached(ALL)?;
    let mut rows = stmt.query(params![generation, tenant])?;
    while let Some(r) = rows.next()? {
        cache.add(loaded(r)?)?;
    }
    Ok(cache)
}

/// The semantic leg from the cache, in the read transaction of `conn`;
/// None when the tenant's vectors do not fit the budget (the caller scans
/// in SQL instead).
pub(super) fn semantic_leg(
    conn: &Connection,
    vectors: &Vectors,
    tenant: &Tenant,
    scope: &SearchScope,
    generation: &str,
    query: &[f32],
    limit: u32,
) -> Result<Option<SemanticLeg>, StoreError> {
    // The cache holds no metadata: a metadata filter reads the scope in
    // SQL, where the filter is.
    if !scope.metadata.is_empty() {
        return Ok(None);
    }
    let values = &ScopeValues::new(tenant, scope)?;
    let tenant = tenant.0.as_str();
    // The first read fixes the snapshot, so the tick is the snapshot's.
    let clock: i64 = conn
        .prepare_cached("SELECT seq FROM vector_clock WHERE id = 1")?
        .query_row([], |r| r.get(0))?;
    let t = vectors.tenant(tenant);
    if t.bytes.load(Ordering::Relaxed) > vectors.budget.load(Ordering::Relaxed) {
        // The budget shrank under it (tests set it).
        *t.cache.write().unwrap_or_else(|e| e.into_inner()) = None;
        t.bytes.store(0, Ordering::Relaxed);
    }
    let mut tries = 0;
    let guard = loop {
        let guard = read(&t.cache);
        if let Some(c) = guard.as_ref()
            && c.generation == generation
            && c.clock >= clock
        {
            break guard;
        }
        drop(guard);
        tries += 1;
        // Another search moving the cache elsewhere each time (another
        // generation) is not waited out.
        if tries > 3 || !vectors.refresh(conn, &t, tenant, generation, clock)? {
            return Ok(None);
        }
    };
    let Some(cache) = guard.as_ref() else {
        return Ok(None);
    };

    let allowed = {
        let mut allowed = vec![false; cache.sessions.len()];
        let mut stmt = conn.prepare_cached(SESSIONS)?;
        let mut rows = stmt.query(values.session_params().as_slice())?;
        while let Some(r) = rows.next()? {
            if let Some(&k) = cache.session_ix.get(&r.get::<_, i64>(0)?) {
                allowed[k as usize] = true;
            }
        }
        allowed
    };
    let levels = scope.levels();
    let roles: u32 = scope
        .roles
        .iter()
        .map(|r| 1u32 << (r.code().clamp(0, 31)))
        .fold(0, |a, b| a | b);
    let (after, before) = (scope.after.map(|m| m.0), scope.before.map(|m| m.0));
    let comparable = query.len() == cache.dims;
    let mut embedded = 0u64;
    let mut scored: Vec<(f32, u32)> = Vec::new();
    for (i, s) in cache.slots.iter().enumerate() {
        // A slot newer than this snapshot (another search loaded it) is
        // not this search's.
        if s.dead || !allowed[s.session as usize] || s.seq > clock {
            continue;
        }
        let kind = if s.level == 0 {
            levels.contains(&0) && (roles == 0 || roles & (1 << s.role.min(31)) != 0)
        } else {
            roles == 0 && levels.contains(&s.level)
        };
        if !kind
            || after.is_some_and(|a| s.created_at <= a)
            || before.is_some_and(|b| s.created_at >= b)
        {
            continue;
        }
        embedded += 1;
        if comparable {
            let v = &cache.data[i * cache.dims..(i + 1) * cache.dims];
            scored.push((cosine(query, v), i as u32));
        }
    }

    let order = |a: &(f32, u32), b: &(f32, u32)| {
        b.0.total_cmp(&a.0).then(
            cache.slots[a.1 as usize]
                .doc
                .cmp(&cache.slots[b.1 as usize].doc),
        )
    };
    let limit = limit as usize;
    let mut hits: Vec<SearchHit> = Vec::with_capacity(limit.min(scored.len()));
    let mut dead: Vec<Slot> = Vec::new();
    let mut rest = &mut scored[..];
    while hits.len() < limit && !rest.is_empty() {
        let take = ((limit - hits.len()) * 2).max(8).min(rest.len());
        if take < rest.len() {
            rest.select_nth_unstable_by(take - 1, order);
        }
        let (best, tail) = rest.split_at_mut(take);
        best.sort_unstable_by(order);
        for &(cos, i) in best.iter() {
            if hits.len() == limit {
                break;
            }
            let s = cache.slots[i as usize];
            let sql = if s.doc > 0 { ENTRY_HIT } else { SUMMARY_HIT };
            let found = conn
                .prepare_cached(sql)?
                .query_map(
                    values.params(&generation, &[&s.doc, &s.seq]).as_slice(),
                    row,
                )?
                .next()
                .transpose()?;
            match found {
                Some(hit) => hits.push(SearchHit {
                    similarity: cos,
                    ..hit
                }),
                None => {
                    let there: bool = conn
                        .prepare_cached(
                            "SELECT EXISTS (SELECT 1 FROM embeddings WHERE doc = ?1 \
                             AND generation = ?2 AND coalesce(seq, 0) = ?3)",
                        )?
                        .query_row(params![s.doc, generation, s.seq], |r| r.get(0))?;
                    if !there {
                        dead.push(s);
                    }
                }
            }
        }
        rest = tail;
    }
    drop(guard);
    if !dead.is_empty() {
        // Gone in this snapshot and not newer than it: gone for good. The
        // slots are found again by document and seq (a compaction may
        // have moved them meanwhile).
        let mut guard = t.cache.write().unwrap_or_else(|e| e.into_inner());
        if let Some(c) = guard.as_mut()
            && c.generation == generation
        {
            for s in dead {
                if let Some(&i) = c.by_doc.get(&s.doc)
                    && c.slots[i as usize].seq == s.seq
                {
                    c.kill(i as usize);
                }
            }
        }
    }

    let total: i64 = conn
        .prepare_cached(TOTAL)?
        .query_row(values.params(&generation, &[]).as_slice(), |r| r.get(0))?;
    Ok(Some(SemanticLeg {
        hits,
        embedded_share: if total <= 0 {
            0.0
        } else {
            (embedded as f64 / total as f64).min(1.0)
        },
    }))
}

#[cfg(test)]
impl super::Sqlite {
    /// Sets what the caches may hold together.
    pub(super) fn set_vector_budget(&self, bytes: usize) {
        self.inner.vectors.budget.store(bytes, Ordering::Relaxed);
    }

    /// The tenant's cache: its slots and how many of them are dead.
    /// (Looked at without counting as a search of the tenant.)
    pub(super) fn cached_vectors(&self, tenant: &str) -> Option<(usize, usize)> {
        let t = self
            .inner
            .vectors
            .tenants
            .lock()
            .expect("tenants")
            .get(tenant)?
            .clone();
        // Not under the tenants' lock: a load holding its cache's lock
        // may be waiting for that one.
        let c = read(&t.cache);
        c.as_ref().map(|c| (c.slots.len(), c.dead))
    }

    /// What the budget counts for every tenant together: caches held and
    /// loads' reservations.
    pub(super) fn vector_bytes(&self) -> usize {
        let tenants = self.inner.vectors.tenants.lock().expect("tenants");
        tenants
            .values()
            .map(|t| t.bytes.load(Ordering::Relaxed))
            .sum()
    }

    /// Has every load call `hook` with its tenant once it has reserved its
    /// bytes, before it reads them.
    pub(super) fn before_vector_load(&self, hook: impl Fn(&str) + Send + Sync + 'static) {
        *self.inner.vectors.before_load.lock().expect("hook") = Some(Box::new(hook));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stored(doc: i64, seq: i64) -> Loaded {
        Loaded {
            doc,
            seq,
            session: 1,
            vector: crate::store::embeddings::to_bytes(&[1.0, 0.0]),
            created_at: 0,
            role: 1,
            level: 0,
        }
    }

    /// Caches of `bytes` for tenants searched in this order, in a budget
    /// of 100 bytes.
    fn holding(caches: &[(&str, usize)]) -> Vectors {
        let v = Vectors::default();
        v.budget.store(100, Ordering::Relaxed);
        for &(tenant, bytes) in caches {
            let t = v.tenant(tenant);
            *t.cache.write().expect("lock") = Some(Cache::new("g", 0));
            t.bytes.store(bytes, Ordering::Relaxed);
        }
        v
    }

    fn held(v: &Vectors, tenant: &str) -> Option<usize> {
        let t = v.tenants.lock().expect("tenants").get(tenant)?.clone();
        let cached = read(&t.cache).is_some();
        cached.then(|| t.bytes.load(Ordering::Relaxed))
    }

    #[test]
    fn a_larger_cache_never_drops_a_smaller_working_one_and_a_smaller_drops_the_oldest_larger() {
        // Room enough: nothing is dropped.
        let v = holding(&[("b", 30)]);
        assert!(v.admit(&v.tenant("a"), 70));
        assert_eq!(held(&v, "b"), Some(30));

        // A larger one coming in finds no room it may take: nothing
        // dropped, its count unchanged.
        let v = holding(&[("b", 30)]);
        let a = v.tenant("a");
        assert!(!v.admit(&a, 80));
        assert_eq!(held(&v, "b"), Some(30));
        assert_eq!(a.bytes.load(Ordering::Relaxed), 0);
        // Nor does one of the same size.
        let v = holding(&[("b", 60)]);
        assert!(!v.admit(&v.tenant("a"), 60));
        assert_eq!(held(&v, "b"), Some(60));

        // A smaller one drops the least recently searched larger ones,
        // only as many as it needs.
        let v = holding(&[("c", 40), ("d", 40), ("b", 10)]);
        assert!(v.admit(&v.tenant("a"), 30));
        assert_eq!(
            (held(&v, "c"), held(&v, "d"), held(&v, "b"), held(&v, "a")),
            (None, Some(40), Some(10), None)
        );
        assert_eq!(v.tenant("a").bytes.load(Ordering::Relaxed), 30);

        // A cache not searched for STALE_SEARCHES searches is anyone's
        // (`b` was searched at tick 0; each `tenant` call is a search).
        let v = holding(&[("b", 30)]);
        while v.ticks.load(Ordering::Relaxed) < STALE_SEARCHES - 1 {
            v.tenant("a");
        }
        assert!(!v.admit(&v.tenant("a"), 80));
        assert!(v.admit(&v.tenant("a"), 80));
        assert_eq!(held(&v, "b"), None);
    }

    #[test]
    fn a_load_counts_what_it_reserved_and_is_never_dropped() {
        let v = holding(&[("a", 80)]);
        let a = v.tenant("a");
        // `a` loading: its lock held, its cache not there yet.
        let mut loading = a.cache.write().expect("lock");
        *loading = None;
        assert!(!v.admit(&v.tenant("b"), 30));
        assert_eq!(a.bytes.load(Ordering::Relaxed), 80);
        drop(loading);
        // Searched now (a read lock) it is kept too.
        *a.cache.write().expect("lock") = Some(Cache::new("g", 0));
        let searching = read(&a.cache);
        assert!(!v.admit(&v.tenant("b"), 30));
        drop(searching);
        assert!(v.admit(&v.tenant("b"), 30));
        assert_eq!(held(&v, "a"), None);
    }

    /// The VM steps a loading statement takes for tenant `b`.
    fn steps(conn: &Connection, sql: &str) -> i32 {
        let mut stmt = conn.prepare(sql).expect("prepare");
        let rows = stmt
            .query_map(params!["g", "b"], |_| Ok(()))
            .expect("query")
            .count();
        assert!(rows > 0, "{sql}");
        stmt.get_status(rusqlite::StatementStatus::VmStep)
    }

    #[test]
    fn a_load_and_its_count_read_no_other_tenants_vectors() {
        let mut conn = Connection::open_in_memory().expect("open");
        super::super::schema::migrate(&mut conn).expect("migrate");
        let vector = crate::store::embeddings::to_bytes(&[1.0, 0.0]);
        // Sessions 1..=10 are a's, 11 is b's; b's one vector has its entry.
        let store = |session: i64, tenant: &str, vectors: i64| {
            conn.execute(
                "INSERT OR IGNORE INTO sessions (id, tenant, name, created_at) \
                 VALUES (?1, ?2, ?3, 0)",
                params![session, tenant, format!("s{session}")],
            )
            .expect("session");
            for seq in 1..=vectors {
                conn.execute(
                    "INSERT INTO embeddings (doc, generation, session_id, vector) \
                     VALUES (?1, 'g', ?2, ?3)",
                    params![(session << 32) | seq, session, vector],
                )
                .expect("vector");
            }
        };
        store(11, "b", 1);
        conn.execute(
            "INSERT INTO entries (session_id, seq, role, content, tokens, created_at) \
             VALUES (11, 1, 1, 'e', 1, 0)",
            [],
        )
        .expect("entry");
        let alone = (steps(&conn, COUNT), steps(&conn, ALL));
        for session in 1..=10 {
            store(session, "a", 100);
        }
        // The same work beside a thousand of another tenant's vectors.
        assert_eq!((steps(&conn, COUNT), steps(&conn, ALL)), alone);
    }

    #[test]
    fn a_replaced_vector_is_dead_and_dead_slots_are_compacted_away() {
        let mut c = Cache::new("g", 0);
        for seq in 1..=10_000 {
            c.add(stored(seq % 100 + 1, seq)).expect("add");
            c.compact();
        }
        // 100 documents: never more than a quarter dead past the minimum.
        assert_eq!(c.by_doc.len(), 100);
        assert!(c.slots.len() <= 100 + MIN_DEAD + 1, "{}", c.slots.len());
        assert_eq!(c.data.len(), c.slots.len() * 2);
        for (&doc, &i) in &c.by_doc {
            let s = c.slots[i as usize];
            assert!(!s.dead && s.doc == doc && s.seq > 9_900);
        }
        // An older copy arriving late changes nothing.
        c.add(stored(1, 5)).expect("add");
        assert_eq!(c.slots[c.by_doc[&1] as usize].seq, 10_000);
    }
}
