//! PostgreSQL for tests: a fresh database for each test, dropped after.
//! The server is `ARCHIVIST_TEST_PG_URL` (by default the local one, as
//! `postgres`); when it cannot be reached the PostgreSQL half of the suite
//! is skipped with a notice, unless `ARCHIVIST_REQUIRE_PG=1` (CI sets it),
//! which makes that a failure. The embedding cases want a server with
//! pgvector, `ARCHIVIST_TEST_PGVECTOR_URL` (no default: `.ci/pgvector
//! start` prints one); unset or unreachable, they skip or fail alike.

use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::sync::OnceCell;
use tokio_postgres::NoTls;

/// The variable naming the server the tests use.
pub(crate) const URL_ENV: &str = "ARCHIVIST_TEST_PG_URL";
/// The variable naming a server with pgvector, for the embedding cases.
pub(crate) const VECTOR_URL_ENV: &str = "ARCHIVIST_TEST_PGVECTOR_URL";
/// Set to 1, an unreachable server fails the tests instead of skipping.
pub(crate) const REQUIRE_ENV: &str = "ARCHIVIST_REQUIRE_PG";
const DEFAULT_URL: &str = "postgres://postgres@127.0.0.1:5432/test";

static REACHABLE: OnceCell<bool> = OnceCell::const_new();
static VECTOR_REACHABLE: OnceCell<bool> = OnceCell::const_new();
static NEXT: AtomicUsize = AtomicUsize::new(0);

/// The server's URL (its own database, where new ones are created).
pub(crate) fn admin_url() -> String {
    std::env::var(URL_ENV).unwrap_or_else(|_| DEFAULT_URL.to_owned())
}

/// Which server a test wants.
#[derive(Clone, Copy)]
enum Server {
    Plain,
    Vector,
}

impl Server {
    /// Its URL, None when unset (only the pgvector one may be).
    fn url(self) -> Option<String> {
        match self {
            Server::Plain => Some(admin_url()),
            Server::Vector => std::env::var(VECTOR_URL_ENV).ok().filter(|u| !u.is_empty()),
        }
    }

    fn env(self) -> &'static str {
        match self {
            Server::Plain => URL_ENV,
            Server::Vector => VECTOR_URL_ENV,
        }
    }

    fn reachable(self) -> &'static OnceCell<bool> {
        match self {
            Server::Plain => &REACHABLE,
            Server::Vector => &VECTOR_REACHABLE,
        }
    }
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
    /// The server's own database, to drop this one from.
    admin: String,
}

impl Drop for TestDatabase {
    fn drop(&mut self) {
        let name = self.name.clone();
        let admin = self.admin.clone();
        // Its own thread and runtime: this may run inside a test's runtime.
        let _ = std::thread::spawn(move || {
            let Ok(rt) = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            else {
                return;
            };
            rt.block_on(async {
                if let Ok((client, connection)) = tokio_postgres::connect(&admin, NoTls).await {
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

/// Whether the server answers; asked once per test binary. Unreachable
/// (or, for pgvector, not named): says so once and gives false, or fails
/// when it is required.
async fn reachable(server: Server) -> bool {
    *server
        .reachable()
        .get_or_init(|| async {
            let required = std::env::var(REQUIRE_ENV).is_ok_and(|v| v == "1");
            let env = server.env();
            let Some(url) = server.url() else {
                if required {
                    panic!("{env} is not set and {REQUIRE_ENV}=1: the pgvector tests need a server with pgvector (.ci/pgvector start prints one)");
                }
                eprintln!(
                    "{env} is not set: skipping the PostgreSQL-with-pgvector half \
                     (.ci/pgvector start prints a server's URL; {REQUIRE_ENV}=1 makes this a failure)"
                );
                return false;
            };
            let target = url
                .parse::<tokio_postgres::Config>()
                .map(|c| super::describe(&c))
                .unwrap_or_else(|_| format!("{env} (does not parse)"));
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
            if required {
                panic!("PostgreSQL not reachable at {target} and {REQUIRE_ENV}=1: {error}");
            }
            eprintln!(
                "PostgreSQL not reachable at {target} ({error}): skipping its half \
                 (set {env} to point at a server; {REQUIRE_ENV}=1 makes this a failure)"
            );
            false
        })
        .await
}

/// A fresh, empty database, or None when no server is reachable.
pub(crate) async fn fresh_database() -> Option<TestDatabase> {
    fresh_on(Server::Plain).await
}

/// A fresh, empty database on the server with pgvector, or None when none
/// is named or reachable (and none is required).
pub(crate) async fn fresh_vector_database() -> Option<TestDatabase> {
    fresh_on(Server::Vector).await
}

async fn fresh_on(server: Server) -> Option<TestDatabase> {
    if !reachable(server).await {
        return None;
    }
    let admin = server.url()?;
    let name = format!(
        "archivist_test_{}_{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::SeqCst)
    );
    let (client, connection) = tokio_postgres::connect(&admin, NoTls)
        .await
        .expect("connect to PostgreSQL");
    tokio::spawn(connection);
    client
        .batch_execute(&format!("CREATE DATABASE {name}"))
        .await
        .expect("create a test database");
    Some(TestDatabase {
        url: with_database(&admin, &name),
        name,
        admin,
    })
}

impl TestDatabase {
    /// Deadlocks the server detected in this database, read once every
    /// connection to it has closed: a backend hands in its counts when it
    /// exits, so only then is the figure complete. Drop every store on the
    /// database first.
    pub(crate) async fn deadlocks(&self) -> i64 {
        let (client, connection) = tokio_postgres::connect(&self.admin, NoTls)
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
