//! One leg of Search on PostgreSQL: the GIN-indexed tsvector columns
//! (schema.rs) matched by `websearch_to_tsquery` over our own rendering of
//! the query (search/query.rs), ranked by `ts_rank`, with the filters
//! applied before the limit; and the probe that finds common terms.
//!
//! Both wait for a read connection no longer than the search's deadline,
//! and run in a transaction whose `statement_timeout` is what is left of
//! the search's budget (the server cancels the statement at its deadline:
//! `SearchTooCostly`, or `SearchBusy` when the search mostly waited; see
//! `store/bound.rs`), and a caller that goes away mid-statement has it
//! cancelled too: its connection is dropped inside the transaction, which
//! sends the server a cancel request (`Conn`).

use tokio::time::Instant;
use tokio_postgres::error::SqlState;
use tokio_postgres::types::ToSql;

use super::{Conn, Postgres, transact, unsigned};
use crate::model::{Millis, Role, Tenant};
use crate::search::query::{Query, Term};
use crate::store::StoreError;
use crate::store::bound::SearchBound;
use crate::store::search::{COMMON_DOCS, SearchHit, SearchScope};

/// The settings of a search's transaction: the statements' timeout, what
/// is left until the deadline (none left: what `bound` says, without
/// asking).
fn settings(bound: &SearchBound) -> Result<String, StoreError> {
    let left = bound
        .deadline()
        .saturating_duration_since(Instant::now())
        .as_millis();
    if left == 0 {
        return Err(bound.spent());
    }
    // The setting's range ends at i32::MAX ms (24 days; the budget may be
    // set up to 30).
    let left = left.min(i32::MAX as u128);
    // A plan for each call's values, as the semantic leg's: a generic plan
    // of a cached statement cannot see which filters are off.
    Ok(format!(
        "SET LOCAL statement_timeout = {left}; SET LOCAL plan_cache_mode = force_custom_plan"
    ))
}

/// A statement's error, `SearchTooCostly` when its timeout cancelled it
/// (`bounded` asks the bound which it was).
fn costly(e: tokio_postgres::Error) -> StoreError {
    if e.code() == Some(&SqlState::QUERY_CANCELED) {
        StoreError::SearchTooCostly
    } else {
        e.into()
    }
}

/// A connection for one of a search's statements, waited for no longer
/// than its deadline: the wait is not the search's work, and a search
/// whose budget went on it is busy rather than too costly (`bound.rs`).
async fn reader(postgres: &Postgres, bound: &SearchBound) -> Result<Conn, StoreError> {
    match tokio::time::timeout_at(bound.deadline(), postgres.reader()).await {
        Ok(conn) => conn,
        Err(_) => Err(bound.spent()),
    }
}

/// Runs `body` on `client` in a transaction bounded by the search's
/// deadline, the settings pipelined with the body's first statement; the
/// time it runs is the search's work. Cancelled at the deadline, it is
/// what the bound says: too costly, or busy when the search mostly waited.
async fn bounded<T>(
    client: &Conn,
    bound: &SearchBound,
    body: impl Future<Output = Result<T, StoreError>>,
) -> Result<T, StoreError> {
    let setting = settings(bound)?;
    let body = async {
        let (set, result) = tokio::join!(client.batch_execute(&setting), body);
        set?;
        result
    };
    let started = Instant::now();
    let result = transact(client, body).await;
    bound.add_work(started.elapsed());
    match result {
        Err(StoreError::SearchTooCostly) => Err(bound.spent()),
        other => other,
    }
}

/// When an entry (`e`) was said.
pub(super) const ENTRY_SAID: &str = "coalesce(e.occurred_at, e.created_at)";

/// When a summary of node `g` was said: its last entry's time.
pub(super) const SUMMARY_SAID: &str = "(SELECT coalesce(l.occurred_at, l.created_at) FROM entries l \
     WHERE l.session_id = g.session_id AND l.seq = g.last_seq)";

/// What a hit's statement selects after its first columns (session name,
/// level, seq range, segment, role, time, text), read by name (`hit`): for
/// an entry (`e`), when it was said, its speaker and metadata.
pub(super) fn entry_hit_said() -> String {
    format!("{ENTRY_SAID} AS occurred_at, e.name AS speaker, e.metadata::TEXT AS metadata")
}

/// As `entry_hit_said`, for a summary of node `g`.
pub(super) fn summary_hit_said() -> String {
    format!("{SUMMARY_SAID} AS occurred_at, NULL::TEXT AS speaker, NULL::TEXT AS metadata")
}

/// The filters over entries (`e`, of session `x`) from `$first` on:
/// tenant, subject, session names, after, before, roles, levels, metadata
/// (a JSON object every pair of which the entry's holds).
pub(super) fn entry_filters(first: usize) -> String {
    let p = |i: usize| format!("${}", first + i);
    format!(
        "x.tenant = {t} AND ({s}::TEXT IS NULL OR x.subject = {s}) \
         AND ({n}::TEXT[] IS NULL OR x.name = ANY({n})) \
         AND ({a}::BIGINT IS NULL OR {ENTRY_SAID} > {a}) \
         AND ({b}::BIGINT IS NULL OR {ENTRY_SAID} < {b}) \
         AND ({r}::BIGINT[] IS NULL OR e.role = ANY({r})) AND 0 = ANY({l}::BIGINT[]) \
         AND ({m}::TEXT IS NULL OR e.metadata @> {m}::TEXT::JSONB)",
        t = p(0),
        s = p(1),
        n = p(2),
        a = p(3),
        b = p(4),
        r = p(5),
        l = p(6),
        m = p(7),
    )
}

/// As `entry_filters`, over summaries (`s`) of nodes (`g`): a role or a
/// metadata filter leaves every summary out.
pub(super) fn summary_filters(first: usize) -> String {
    let p = |i: usize| format!("${}", first + i);
    format!(
        "x.tenant = {t} AND ({s}::TEXT IS NULL OR x.subject = {s}) \
         AND ({n}::TEXT[] IS NULL OR x.name = ANY({n})) \
         AND ({a}::BIGINT IS NULL OR {SUMMARY_SAID} > {a}) \
         AND ({b}::BIGINT IS NULL OR {SUMMARY_SAID} < {b}) \
         AND {r}::BIGINT[] IS NULL AND {m}::TEXT IS NULL AND g.level = ANY({l}::BIGINT[])",
        t = p(0),
        s = p(1),
        n = p(2),
        a = p(3),
        b = p(4),
        r = p(5),
        l = p(6),
        m = p(7),
    )
}

/// The leg (`LEG`): $1 the query, the scope from $2, $10 the limit, $11 rank by
/// weight (`ts_rank`), or (only common words to go by) newest first.
fn leg() -> String {
    format!(
        "WITH q AS (SELECT websearch_to_tsquery(language, $1) AS q FROM search_state WHERE id = 1) \
SELECT * FROM ( \
SELECT x.name, 0::BIGINT AS level, e.seq AS first_seq, e.seq AS last_seq, NULL::BIGINT AS segment_id, \
       e.role, e.created_at, e.content AS text, \
       CASE WHEN $11 THEN ts_rank(e.tsv, q.q)::FLOAT8 ELSE {ENTRY_SAID}::FLOAT8 END AS r, {entry_said} \
FROM q, entries e JOIN sessions x ON x.id = e.session_id \
WHERE e.tsv @@ q.q AND {entry_filters} \
UNION ALL \
SELECT x.name, g.level, g.first_seq, g.last_seq, g.id, NULL::BIGINT, s.created_at, s.text, \
       CASE WHEN $11 THEN ts_rank(s.tsv, q.q)::FLOAT8 ELSE s.created_at::FLOAT8 END, {summary_said} \
FROM q, summaries s JOIN segments g ON g.id = s.segment_id JOIN sessions x ON x.id = g.session_id \
WHERE s.tsv @@ q.q AND {summary_filters} \
) hits ORDER BY r DESC, occurred_at DESC, name, first_seq DESC LIMIT $10",
        entry_said = entry_hit_said(),
        summary_said = summary_hit_said(),
        entry_filters = entry_filters(2),
        summary_filters = summary_filters(2),
    )
}

static LEG: std::sync::LazyLock<String> = std::sync::LazyLock::new(leg);

/// The scope's filters as both legs' statements take them, in this order:
/// tenant, subject, session names, after, before, roles, levels, metadata.
pub(super) struct ScopeValues<'a> {
    tenant: &'a str,
    subject: Option<&'a str>,
    sessions: Option<Vec<&'a str>>,
    after: Option<i64>,
    before: Option<i64>,
    roles: Option<Vec<i64>>,
    levels: Vec<i64>,
    metadata: Option<String>,
}

impl<'a> ScopeValues<'a> {
    pub(super) fn new(
        tenant: &'a Tenant,
        scope: &'a SearchScope,
    ) -> Result<ScopeValues<'a>, StoreError> {
        Ok(ScopeValues {
            tenant: &tenant.0,
            subject: scope.subject.as_ref().map(|s| s.as_str()),
            sessions: (!scope.sessions.is_empty())
                .then(|| scope.sessions.iter().map(|s| s.as_str()).collect()),
            after: scope.after.map(|m| m.0),
            before: scope.before.map(|m| m.0),
            roles: (!scope.roles.is_empty())
                .then(|| scope.roles.iter().map(|r| r.code()).collect()),
            levels: scope.levels().into_iter().map(i64::from).collect(),
            metadata: (!scope.metadata.is_empty())
                .then(|| serde_json::to_string(&scope.metadata))
                .transpose()
                .map_err(|e| StoreError::Corrupt(format!("metadata: {e}")))?,
        })
    }

    pub(super) fn params(&self) -> [&(dyn ToSql + Sync); 8] {
        [
            &self.tenant,
            &self.subject,
            &self.sessions,
            &self.after,
            &self.before,
            &self.roles,
            &self.levels,
            &self.metadata,
        ]
    }
}

/// A hit as both legs' statements select it (session name, level, seq
/// range, segment, role, time, text, then `entry_hit_said` or
/// `summary_hit_said`'s columns by name).
pub(super) fn hit(r: &tokio_postgres::Row) -> Result<SearchHit, StoreError> {
    Ok(SearchHit {
        session: r.try_get(0)?,
        level: unsigned(r.try_get(1)?, "level")?,
        first_seq: unsigned(r.try_get(2)?, "seq")?,
        last_seq: unsigned(r.try_get(3)?, "seq")?,
        segment_id: r
            .try_get::<_, Option<i64>>(4)?
            .map(|id| unsigned(id, "segment id"))
            .transpose()?,
        role: r.try_get::<_, Option<i64>>(5)?.and_then(Role::from_code),
        created_at: Millis(r.try_get(6)?),
        occurred_at: Millis(r.try_get("occurred_at")?),
        name: r.try_get("speaker")?,
        metadata: crate::store::decode_metadata(r.try_get::<_, Option<&str>>("metadata")?)?,
        text: r.try_get(7)?,
        score: 0.0,
        legs: Vec::new(),
        similarity: 0.0,
        lexical_rank: 0,
        semantic_rank: 0,
        held: 0.0,
    })
}

impl Postgres {
    pub(crate) async fn search(
        &self,
        tenant: &Tenant,
        scope: &SearchScope,
        query: &Query,
        limit: u32,
        weighed: bool,
        bound: &SearchBound,
    ) -> Result<Vec<SearchHit>, StoreError> {
        let client = reader(self, bound).await?;
        let stmt = client.prepare_cached(&LEG).await?;
        let values = ScopeValues::new(tenant, scope)?;
        let text = query.websearch();
        let limit = i64::from(limit);
        // Pipelined: BEGIN, the bound and the search go out together.
        let mut params: Vec<&(dyn ToSql + Sync)> = vec![&text];
        params.extend_from_slice(&values.params());
        params.extend_from_slice(&[&limit, &weighed]);
        let rows = bounded(&client, bound, async {
            client.query(&stmt, params.as_slice()).await.map_err(costly)
        })
        .await?;
        rows.iter().map(hit).collect()
    }

    /// In how many of the tenant's entries each term is, counted up to
    /// `COMMON_DOCS` (counting stops there), in one bounded transaction.
    pub(crate) async fn term_docs(
        &self,
        tenant: &Tenant,
        terms: &[Term],
        bound: &SearchBound,
    ) -> Result<Vec<u32>, StoreError> {
        let client = reader(self, bound).await?;
        let stmt = client
            .prepare_cached(
                "SELECT count(*) FROM (SELECT 1 FROM entries e JOIN sessions x ON x.id = e.session_id \
                 WHERE e.tsv @@ websearch_to_tsquery((SELECT language FROM search_state WHERE id = 1), $1) \
                 AND x.tenant = $2 LIMIT $3) c",
            )
            .await?;
        bounded(&client, bound, async {
            let mut docs = Vec::with_capacity(terms.len());
            for term in terms {
                let single = Query {
                    all: vec![vec![term.clone()]],
                    none: Vec::new(),
                    as_written: Vec::new(),
                };
                let row = client
                    .query_one(
                        &stmt,
                        &[&single.websearch(), &tenant.0, &i64::from(COMMON_DOCS)],
                    )
                    .await
                    .map_err(costly)?;
                // At most COMMON_DOCS, so it fits.
                docs.push(u32::try_from(row.try_get::<_, i64>(0)?).unwrap_or(COMMON_DOCS));
            }
            Ok(docs)
        })
        .await
    }
}
