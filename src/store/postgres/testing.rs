//! PostgreSQL for tests: a fresh database for each test, dropped after.
//! The server is `ARCHIVIST_TEST_PG_URL` (by default the local one, as
//! `postgres`); when it cannot be reached the PostgreSQL half of the suite
//! is skipped with a notice, unless `ARCHIVIST_REQUIRE_PG=1` (CI sets it),
//! which makes that a failure.

use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::sync::OnceCell;
use tokio_postgres::NoTls;

/// The variable naming the server the tests use.
pub(crate) const URL_ENV: &str = "ARCHIVIST_TEST_PG_URL";
/// Set to 1, an unreachable server fails the tests instead of skipping.
pub(crate) const REQUIRE_ENV: &str = "ARCHIVIST_REQUIRE_PG";
const DEFAULT_URL: &str = "postgres://postgres@127.0.0.1:5432/test";

static REACHABLE: OnceCell<bool> = OnceCell::const_new();
static NEXT: AtomicUsize = AtomicUsize::new(0);

/// The server's URL (its own database, where new ones are created).
pub(crate) fn admin_url() -> String {
    std::env::var(URL_ENV).unwrap_or_else(|_| DEFAULT_URL.to_owned())
}

/// `url` with its database replaced by `name`.
pub(crate) fn with_database(url: &str, name: &str) -> String {
    let (base, query) = match url.split_once('?') {
        Some((base, query)) => (base, format!("?{query}")),
        None => (url, String::new()),
    };
    let base = match base.rsplit_once('/') {
        Some((host, _)) if host.contains("//") && host.len() > "postgres://".len() - 1 => host,
        _ => base,
    };
    format!("{base}/{name}{query}")
}

/// A database made for one test; dropped (with any connection still open
/// to it) when this is.
pub(crate) struct TestDatabase {
    pub(crate) url: String,
    name: String,
}

impl Drop for TestDatabase {
    fn drop(&mut self) {
        let name = self.name.clone();
        // Its own thread and runtime: this may run inside a test's runtime.
        let _ = std::thread::spawn(move || {
            let Ok(rt) = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            else {
                return;
            };
            rt.block_on(async {
                if let Ok((client, connection)) = tokio_postgres::connect(&admin_url(), NoTls).await
                {
                    tokio::spawn(connection);
                    let _ = client
                        .batch_execute(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
                        .await;
                }
            });
        })
        .join();
    }
}

/// Whether the server answers; asked once per test binary. Unreachable:
/// says so once and gives false, or fails when it is required.
async fn reachable() -> bool {
    *REACHABLE
        .get_or_init(|| async {
            let url = admin_url();
            let target = url
                .parse::<tokio_postgres::Config>()
                .map(|c| super::describe(&c))
                .unwrap_or_else(|_| format!("{URL_ENV} (does not parse)"));
            let probe = tokio::time::timeout(std::time::Duration::from_secs(5), async {
                let (client, connection) = tokio_postgres::connect(&url, NoTls).await?;
                tokio::spawn(connection);
                client.batch_execute("SELECT 1").await
            })
            .await;
            let error = match probe {
                Ok(Ok(())) => return true,
                Ok(Err(e)) => crate::failure::cause_chain(&e).join(": "),
                Err(_) => "no answer within 5 s".to_owned(),
            };
            if std::env::var(REQUIRE_ENV).is_ok_and(|v| v == "1") {
                panic!("PostgreSQL not reachable at {target} and {REQUIRE_ENV}=1: {error}");
            }
            eprintln!(
                "PostgreSQL not reachable at {target} ({error}): skipping the PostgreSQL half \
                 (set {URL_ENV} to point at a server; {REQUIRE_ENV}=1 makes this a failure)"
            );
            false
        })
        .await
}

/// A fresh, empty database, or None when no server is reachable.
pub(crate) async fn fresh_database() -> Option<TestDatabase> {
    if !reachable().await {
        return None;
    }
    let name = format!(
        "archivist_test_{}_{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::SeqCst)
    );
    let (client, connection) = tokio_postgres::connect(&admin_url(), NoTls)
        .await
        .expect("connect to PostgreSQL");
    tokio::spawn(connection);
    client
        .batch_execute(&format!("CREATE DATABASE {name}"))
        .await
        .expect("create a test database");
    Some(TestDatabase {
        url: with_database(&admin_url(), &name),
        name,
    })
}

impl TestDatabase {
    /// Deadlocks the server detected in this database, read once every
    /// connection to it has closed: a backend hands in its counts when it
    /// exits, so only then is the figure complete. Drop every store on the
    /// database first.
    pub(crate) async fn deadlocks(&self) -> i64 {
        let (client, connection) = tokio_postgres::connect(&admin_url(), NoTls)
            .await
            .expect("connect to PostgreSQL");
        tokio::spawn(connection);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        loop {
            // Each query outside a transaction reads the statistics afresh.
            let row = client
                .query_one(
                    "SELECT numbackends, deadlocks FROM pg_stat_database WHERE datname = $1",
                    &[&self.name],
                )
                .await
                .expect("read the database's statistics");
            let (backends, deadlocks): (i32, i64) = (row.get(0), row.get(1));
            if backends == 0 {
                return deadlocks;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "{backends} connections to {} still open after 10 s",
                self.name
            );
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
    }
}
