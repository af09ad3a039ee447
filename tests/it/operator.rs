//! What an operator or a person at a terminal meets, through the real
//! binary: a backfill that refuses another provider and never creates a
//! database, usage errors that do not look like "work left", the provider
//! checks at start-up and `archivist check`, and the terminal client
//! (NOT_FOUND, --json, a refused idempotency key, a close whose recap
//! failed).

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::Value;
use wiremock::{MockServer, ResponseTemplate};

use crate::harness::{TestServer, eventually};
use crate::provider::{Script, completion, error_json, fast};

/// What a run of the binary left: exit code, standard output and error.
pub(crate) struct Ran {
    pub(crate) code: i32,
    pub(crate) stdout: String,
    pub(crate) stderr: String,
}

impl Ran {
    pub(crate) fn json(&self) -> Value {
        serde_json::from_str(&self.stdout)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}\n{}", self.stdout, self.stderr))
    }
}

/// Runs `archivist ARGS` with `env` set (`None` removes a variable), in
/// `cwd` if given, on a blocking thread so that servers and fake providers
/// on this runtime keep answering.
pub(crate) async fn archivist(
    args: &[&str],
    env: &[(&str, Option<&str>)],
    cwd: Option<&Path>,
) -> Ran {
    let mut command = Command::new(env!("CARGO_BIN_EXE_archivist"));
    command.args(args).stdin(Stdio::null());
    for (key, value) in env {
        match value {
            Some(v) => command.env(key, v),
            None => command.env_remove(key),
        };
    }
    if let Some(dir) = cwd {
        command.current_dir(dir);
    }
    let out = tokio::task::spawn_blocking(move || command.output().expect("run archivist"))
        .await
        .expect("joined");
    Ran {
        code: out.status.code().expect("exit code"),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// `archivist session context SESSION --query QUERY --min-similarity
/// LEAST` against the open server at `address`, as a user types it.
pub(crate) async fn context_at_least(
    address: &str,
    session: &str,
    query: &str,
    least: &str,
) -> Ran {
    let args = [
        "session",
        "context",
        session,
        "--server",
        address,
        "--query",
        query,
        "--min-similarity",
        least,
    ];
    archivist(&args, &[("ARCHIVIST_TOKEN", None)], None).await
}

/// The environment of a run configured for the fake provider at `base`
/// (as `fast` configures the tests' servers).
fn openai_env(base: &str) -> Vec<(&'static str, Option<String>)> {
    vec![
        ("ARCHIVIST_PROVIDER_KIND", Some("openai".to_owned())),
        ("ARCHIVIST_PROVIDER_BASE_URL", Some(format!("{base}/v1"))),
        ("ARCHIVIST_PROVIDER_MODEL", Some("test-model".to_owned())),
        ("ARCHIVIST_RETRY_INITIAL_BACKOFF", Some("10ms".to_owned())),
        ("ARCHIVIST_RETRY_MAX_BACKOFF", Some("40ms".to_owned())),
    ]
}

fn borrowed<'a>(env: &'a [(&'a str, Option<String>)]) -> Vec<(&'a str, Option<&'a str>)> {
    env.iter().map(|(k, v)| (*k, v.as_deref())).collect()
}

fn closed_port() -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("addr");
    drop(listener);
    format!("http://{addr}")
}

#[tokio::test]
async fn a_backfill_with_another_provider_is_refused_naming_both() {
    // A server set up for an LLM, whose provider was down: one segment is
    // owed a recap.
    let base = closed_port();
    let served = format!("{base}/v1");
    let server = TestServer::start_with(|c| fast(c, &base)).await;
    server.append("s", &["Something worth an LLM recap."]).await;
    server
        .close("s", true)
        .await
        .expect("closed; nothing answered");
    let dir = server.stop().await;
    let data_dir = dir.path().to_str().expect("utf-8 path");

    // The README's backfill, run without the server's --config: the
    // built-in extractive provider. It refuses and names both providers.
    let ran = archivist(&["backfill", "--data-dir", data_dir], &[], None).await;
    assert_eq!(ran.code, 1, "{}", ran.stderr);
    assert!(ran.stderr.contains("extractive"), "{}", ran.stderr);
    assert!(ran.stderr.contains(&served), "{}", ran.stderr);
    assert!(ran.stderr.contains("test-model"), "{}", ran.stderr);
    assert!(
        ran.stderr.contains("--allow-provider-change"),
        "{}",
        ran.stderr
    );
    // Nothing was summarised: the segment waits for its LLM recap.
    let dry = archivist(
        &["backfill", "--data-dir", data_dir, "--dry-run", "--json"],
        &[],
        None,
    )
    .await;
    assert_eq!(dry.code, 2, "{}", dry.stderr);
    let report = dry.json();
    assert_eq!(report["matched"], 1);
    assert_eq!(report["provider"]["kind"], "extractive");
    assert_eq!(report["provider_changed_from"]["base_url"], served);

    // Said on purpose, it runs, and its report names the provider it used.
    let ran = archivist(
        &[
            "backfill",
            "--data-dir",
            data_dir,
            "--json",
            "--allow-provider-change",
        ],
        &[],
        None,
    )
    .await;
    assert_eq!(ran.code, 0, "{}", ran.stderr);
    let report = ran.json();
    assert_eq!(report["summarised"], 1);
    assert_eq!(report["provider"]["kind"], "extractive");
    assert_eq!(report["provider_changed_from"]["model"], "test-model");
}

/// The data directory of a server that ran with the extractive default and
/// stored an entry.
async fn extractive_database() -> tempfile::TempDir {
    let server = TestServer::start().await;
    server
        .append("s", &["Served by the extractive provider."])
        .await;
    server.stop().await
}

#[tokio::test]
async fn a_backfill_with_an_llm_over_an_extractive_database_needs_no_flag() {
    let dir = extractive_database().await;
    let data_dir = dir.path().to_str().expect("utf-8 path");
    let env = openai_env(&closed_port());
    for dry in [true, false] {
        let mut args = vec!["backfill", "--data-dir", data_dir];
        if dry {
            args.push("--dry-run");
        }
        let ran = archivist(&args, &borrowed(&env), None).await;
        assert_eq!(ran.code, 0, "dry run {dry}: {}{}", ran.stdout, ran.stderr);
        assert!(
            ran.stdout.contains(
                "moving from the built-in extractive provider to an LLM needs no --allow-provider-change"
            ),
            "dry run {dry}: {}",
            ran.stdout
        );
    }
}

#[tokio::test]
async fn a_backfill_never_creates_a_database_and_usage_errors_are_not_work_left() {
    let dir = tempfile::tempdir().expect("temp dir");
    let missing = dir.path().join("nonexistent");
    let missing_str = missing.to_str().expect("utf-8 path");
    for args in [
        vec!["backfill", "--data-dir", missing_str, "--dry-run"],
        vec!["backfill", "--data-dir", missing_str],
    ] {
        let ran = archivist(&args, &[], None).await;
        assert_eq!(ran.code, 1, "{args:?}: {}", ran.stderr);
        assert!(ran.stderr.contains(missing_str), "{}", ran.stderr);
        assert!(!ran.stdout.contains("match"), "{}", ran.stdout);
        assert!(!missing.exists(), "{args:?} created {}", missing.display());
    }
    // The same from the wrong directory, with the default data_dir.
    let elsewhere = tempfile::tempdir().expect("temp dir");
    let ran = archivist(&["backfill", "--dry-run"], &[], Some(elsewhere.path())).await;
    assert_eq!(ran.code, 1, "{}", ran.stderr);
    assert!(ran.stderr.contains("archivist-data"), "{}", ran.stderr);
    assert_eq!(
        std::fs::read_dir(elsewhere.path()).expect("dir").count(),
        0,
        "nothing was created"
    );
    // Usage errors exit 64, never 2 (which says work is left).
    for args in [
        vec!["backfill", "--bogus"],
        vec!["backfill", "--data-dir", missing_str, "--concurrency", "0"],
        vec![
            "backfill",
            "--data-dir",
            missing_str,
            "--closed-before",
            "soon",
        ],
        vec!["session", "show"],
        vec!["nonsense"],
    ] {
        let ran = archivist(&args, &[], None).await;
        assert_eq!(ran.code, 64, "{args:?}: {}", ran.stderr);
    }
    let ran = archivist(&["backfill", "--help"], &[], None).await;
    assert_eq!(ran.code, 0);
}

#[tokio::test]
async fn migrate_creates_a_sqlite_schema_says_so_in_one_line_and_then_finds_it_current() {
    let dir = tempfile::tempdir().expect("temp dir");
    let data = dir.path().join("data");
    let data_str = data.to_str().expect("utf-8 path");
    let first = archivist(&["migrate", "--data-dir", data_str], &[], None).await;
    assert_eq!(first.code, 0, "{}", first.stderr);
    let line = first.stdout.trim_end();
    assert_eq!(line.lines().count(), 1, "one line: {line}");
    assert!(line.starts_with("sqlite database at "), "{line}");
    assert!(line.contains(data_str), "names the file: {line}");
    let (from, to) = versions(line);
    assert_eq!(from, 0, "a new database: {line}");
    assert!(to > 0, "{line}");
    // The schema is in the database file itself, not only in its log: a
    // deploy step may copy the file alone.
    let log = std::fs::metadata(data.join("archivist.sqlite3-wal")).map_or(0, |m| m.len());
    assert_eq!(log, 0, "the log was checkpointed into the file");
    let file = std::fs::metadata(data.join("archivist.sqlite3")).expect("the database file");
    assert!(
        file.len() > 4096,
        "the file holds the schema: {} bytes",
        file.len()
    );

    // Again: nothing to do, the same version on both sides.
    let again = archivist(&["migrate", "--data-dir", data_str], &[], None).await;
    assert_eq!(again.code, 0, "{}", again.stderr);
    assert_eq!(
        versions(again.stdout.trim_end()),
        (to, to),
        "{}",
        again.stdout
    );
    // A read-only run, which needs the current schema, finds it.
    let dry = archivist(
        &["backfill", "--data-dir", data_str, "--dry-run"],
        &[],
        None,
    )
    .await;
    assert_eq!(dry.code, 0, "{}", dry.stderr);
}

#[tokio::test]
async fn migrate_without_its_database_fails_naming_where_but_never_the_password() {
    let port = closed_port().rsplit(':').next().expect("port").to_owned();
    let url = format!("postgres://archivist:hunter2-not-shown@127.0.0.1:{port}/archivist");
    let ran = archivist(
        &["migrate"],
        &[
            ("ARCHIVIST_STORAGE_BACKEND", Some("postgres")),
            ("ARCHIVIST_STORAGE_URL_ENV", Some("DATABASE_URL")),
            ("DATABASE_URL", Some(&url)),
        ],
        None,
    )
    .await;
    assert_eq!(ran.code, 1, "{}", ran.stderr);
    assert!(ran.stdout.is_empty(), "{}", ran.stdout);
    let target = format!("postgres://archivist@127.0.0.1:{port}/archivist");
    assert!(
        ran.stderr
            .contains(&format!("cannot connect to the database at {target}")),
        "{}",
        ran.stderr
    );
    assert!(!ran.stderr.contains("hunter2"), "{}", ran.stderr);
}

/// The schema versions a line of `archivist migrate` gives: "... schema
/// version FROM -> TO (...)".
pub(crate) fn versions(line: &str) -> (u64, u64) {
    let parse = || {
        let rest = line.split("schema version ").nth(1)?;
        let (from, rest) = rest.split_once(" -> ")?;
        let to = rest.split_whitespace().next()?;
        Some((from.parse().ok()?, to.parse().ok()?))
    };
    parse().unwrap_or_else(|| panic!("no versions in {line:?}"))
}

/// A `serve` process whose standard error is kept, line by line.
struct Serve {
    child: std::process::Child,
    lines: Arc<Mutex<Vec<String>>>,
}

impl Serve {
    fn start(data_dir: &Path, env: &[(&str, Option<&str>)]) -> Serve {
        let data_dir = data_dir.to_str().expect("utf-8 path");
        Serve::start_args(
            &["serve", "--listen", "127.0.0.1:0", "--data-dir", data_dir],
            env,
        )
    }

    fn start_args(args: &[&str], env: &[(&str, Option<&str>)]) -> Serve {
        let mut command = Command::new(env!("CARGO_BIN_EXE_archivist"));
        command
            .args(args)
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        for (key, value) in env {
            match value {
                Some(v) => command.env(key, v),
                None => command.env_remove(key),
            };
        }
        let mut child = command.spawn().expect("spawn archivist");
        let stderr = child.stderr.take().expect("stderr");
        let lines: Arc<Mutex<Vec<String>>> = Arc::default();
        let sink = lines.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                sink.lock().expect("lock").push(line);
            }
        });
        Serve { child, lines }
    }

    fn lines(&self) -> Vec<String> {
        self.lines.lock().expect("lock").clone()
    }

    async fn logged(&self, what: &str) -> Option<String> {
        let found = eventually(Duration::from_secs(15), || async {
            self.lines().iter().any(|l| l.contains(what))
        })
        .await;
        found.then(|| {
            self.lines()
                .into_iter()
                .find(|l| l.contains(what))
                .unwrap_or_default()
        })
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[tokio::test]
async fn start_up_warns_of_an_unset_key_and_logs_the_provider_check() {
    let refusing = Script::new(vec![error_json(
        401,
        "invalid_api_key",
        "You didn't provide an API key.",
    )]);
    let mock = refusing.mount().await;
    let dir = tempfile::tempdir().expect("temp dir");
    let env = openai_env(&mock.uri());
    let mut env = borrowed(&env);
    env.push(("ARCHIVIST_PROVIDER_API_KEY_ENV", Some("MY_UNSET_KEY")));
    env.push(("MY_UNSET_KEY", None));
    let server = Serve::start(dir.path(), &env);
    let warning = server.logged("MY_UNSET_KEY").await.expect("a warning");
    assert!(warning.contains("WARN"), "{warning}");
    assert!(warning.contains("not set"), "{warning}");
    // The server starts all the same, and its one check of the provider
    // says, in one line, what fails and what would fix it.
    server
        .logged("archivist is serving")
        .await
        .expect("serving");
    let check = server
        .logged("provider check failed")
        .await
        .expect("the check's line");
    assert!(check.contains("unauthorized"), "{check}");
    assert!(check.contains("MY_UNSET_KEY"), "{check}");
    assert_eq!(refusing.calls(), 1, "probed once");
    // One line: the probe's pass does not log its giving up besides.
    assert!(
        !server
            .lines()
            .iter()
            .any(|l| l.contains("recap pass gave up")),
        "{:#?}",
        server.lines()
    );
}

#[tokio::test]
async fn a_key_pasted_into_api_key_env_is_refused_without_being_repeated() {
    let dir = tempfile::tempdir().expect("temp dir");
    let pasted = "sk-proj-Zx81bQe5T9vLm3Kc0RdA7uWn";
    let ran = archivist(
        &[
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--data-dir",
            dir.path().to_str().expect("utf-8 path"),
        ],
        &[
            ("ARCHIVIST_PROVIDER_KIND", Some("openai")),
            ("ARCHIVIST_PROVIDER_API_KEY_ENV", Some(pasted)),
        ],
        None,
    )
    .await;
    assert_eq!(ran.code, 1, "{}", ran.stderr);
    assert!(
        ran.stderr.contains("provider.api_key_env"),
        "{}",
        ran.stderr
    );
    assert!(!ran.stderr.contains(pasted), "{}", ran.stderr);
}

#[tokio::test]
async fn archivist_check_classifies_what_the_provider_answers_and_says_the_fix() {
    let ok = Script::new(vec![completion("A recap.")]);
    let ok_mock = ok.mount().await;
    let refused_key = Script::new(vec![error_json(
        401,
        "invalid_api_key",
        "Incorrect API key provided",
    )]);
    let refused_mock = refused_key.mount().await;
    // A server with no chat-completions route: what a base_url without /v1
    // meets.
    let no_route = MockServer::start().await;
    let closed = closed_port();

    let cases: Vec<(&str, String, i32, &str, &str)> = vec![
        (
            "200",
            format!("{}/v1", ok_mock.uri()),
            0,
            "result: ok",
            "test-model-0613",
        ),
        (
            "401",
            format!("{}/v1", refused_mock.uri()),
            1,
            "result: unauthorized (HTTP 401)",
            "CHECK_KEY",
        ),
        (
            "404 route",
            no_route.uri(),
            1,
            "result: unknown_model (HTTP 404)",
            "provider.base_url is probably wrong",
        ),
        (
            "refused",
            format!("{closed}/v1"),
            1,
            "result: transport",
            "check that the provider is running",
        ),
    ];
    for (name, base_url, code, result, fix) in cases {
        let dir = tempfile::tempdir().expect("temp dir");
        let ran = archivist(
            &["check", "--data-dir", dir.path().to_str().expect("utf-8")],
            &[
                ("ARCHIVIST_PROVIDER_KIND", Some("openai")),
                ("ARCHIVIST_PROVIDER_BASE_URL", Some(&base_url)),
                ("ARCHIVIST_PROVIDER_MODEL", Some("test-model")),
                ("ARCHIVIST_PROVIDER_API_KEY_ENV", Some("CHECK_KEY")),
                ("CHECK_KEY", Some("sk-test-0000000000")),
                ("ARCHIVIST_RETRY_INITIAL_BACKOFF", Some("10ms")),
                ("ARCHIVIST_RETRY_MAX_BACKOFF", Some("40ms")),
            ],
            None,
        )
        .await;
        assert_eq!(ran.code, code, "{name}: {}{}", ran.stdout, ran.stderr);
        assert!(ran.stdout.contains(result), "{name}: {}", ran.stdout);
        assert!(ran.stdout.contains(fix), "{name}: {}", ran.stdout);
        assert!(
            !ran.stdout.contains("sk-test-0000000000"),
            "{name}: key shown"
        );
        if name == "404 route" {
            // A 404 that names no model points at base_url, not the model.
            let fix_line = ran
                .stdout
                .lines()
                .find(|l| l.starts_with("fix:"))
                .unwrap_or_default();
            assert!(!fix_line.contains("provider.model"), "{fix_line}");
        }
        assert_eq!(
            std::fs::read_dir(dir.path()).expect("dir").count(),
            0,
            "{name}: check created nothing"
        );
    }
    assert_eq!(ok.calls(), 1);
    assert_eq!(refused_key.calls(), 1, "a refused key is sent once");

    let ran = archivist(
        &["check", "--json"],
        &[
            ("ARCHIVIST_PROVIDER_KIND", Some("openai")),
            (
                "ARCHIVIST_PROVIDER_BASE_URL",
                Some(&format!("{}/v1", refused_mock.uri())),
            ),
        ],
        Some(tempfile::tempdir().expect("temp dir").path()),
    )
    .await;
    assert_eq!(ran.code, 1);
    let report = ran.json();
    assert_eq!(report["ok"], false);
    assert_eq!(report["class"], "unauthorized");
    assert_eq!(report["http_status"], 401);
    assert!(report["fix"].as_str().is_some_and(|f| !f.is_empty()));
}

#[tokio::test]
async fn the_terminal_client_says_not_found_prints_json_and_refuses_a_reused_id() {
    let server = TestServer::start().await;
    let address = format!("http://{}", server.addr);
    let client = |args: &[&str]| {
        let mut all = vec!["--server", address.as_str()];
        all.extend_from_slice(args);
        all.iter().map(|s| (*s).to_owned()).collect::<Vec<String>>()
    };
    let run = |args: Vec<String>, cmd: &'static str| async move {
        let mut full: Vec<&str> = vec![cmd];
        full.extend(args.iter().map(String::as_str));
        archivist(&full, &[], None).await
    };

    // NOT_FOUND from every command that names a session.
    for command in [
        vec!["show", "nosuch"],
        vec!["context", "nosuch"],
        vec!["entries", "nosuch"],
        vec!["close", "nosuch"],
        vec!["flush", "nosuch"],
        vec!["requeue", "nosuch"],
    ] {
        let ran = run(client(&command), "session").await;
        assert_eq!(ran.code, 1, "{command:?}: {}", ran.stdout);
        assert!(
            ran.stderr.contains("NotFound"),
            "{command:?}: {}",
            ran.stderr
        );
        assert!(ran.stderr.contains("SESSION_NOT_FOUND"), "{}", ran.stderr);
    }

    // A reused id with other text is refused, and nothing of it stored.
    let ran = run(
        client(&["append", "demo", "--id", "k1", "first text"]),
        "session",
    )
    .await;
    assert_eq!(ran.code, 0, "{}", ran.stderr);
    // An existing session with nothing to requeue is no error (the check
    // that it exists once asked GetContext for a budget it refuses).
    for command in [
        vec!["requeue", "demo"],
        vec!["requeue", "demo", "--include-parked"],
    ] {
        let ran = run(client(&command), "session").await;
        assert_eq!(ran.code, 0, "{command:?}: {}", ran.stderr);
    }
    let ran = run(
        client(&["append", "demo", "--id", "k1", "other text"]),
        "session",
    )
    .await;
    assert_eq!(ran.code, 1, "{}", ran.stdout);
    assert!(
        ran.stderr.contains("CLIENT_ENTRY_ID_REUSED"),
        "{}",
        ran.stderr
    );
    assert!(ran.stderr.contains("entries[0]"), "{}", ran.stderr);
    let ran = run(
        client(&["append", "demo", "--id", "k1", "first text"]),
        "session",
    )
    .await;
    assert_eq!(
        ran.code, 0,
        "the same text again is a retry: {}",
        ran.stderr
    );
    assert!(
        ran.stdout.contains("already stored as seq 1"),
        "{}",
        ran.stdout
    );

    // --json on the read commands, parsed.
    let ran = run(client(&["context", "demo", "--json"]), "session").await;
    assert_eq!(ran.code, 0);
    let context = ran.json();
    let items = context["items"].as_array().expect("items");
    assert_eq!(items.len(), 1);
    assert_eq!(items[0]["entry"]["content"], "first text");

    let ran = run(client(&["show", "demo", "--json"]), "session").await;
    assert_eq!(ran.code, 0);
    let shown = ran.json();
    assert_eq!(shown["segments"][0]["state"], "SEGMENT_STATE_OPEN");
    assert_eq!(shown["segments"][0]["level"], 1);
    assert_eq!(shown["segments"][0]["child_ids"], serde_json::json!([]));
    assert_eq!(shown["segments"][0]["entry_count"], 1);
    // Every field, defaults too; an unset message field is left out.
    assert_eq!(shown["segments"][0]["passes"], 0);
    assert!(shown["segments"][0].get("summary").is_none());

    let ran = run(client(&["--json"]), "sessions").await;
    assert_eq!(ran.code, 0, "{}", ran.stderr);
    let sessions = ran.json();
    assert_eq!(sessions["sessions"][0]["session_id"], "demo");
    assert_eq!(sessions["sessions"][0]["entry_count"], 1);

    let ran = run(client(&["--json"]), "backlog").await;
    assert_eq!(ran.code, 0, "{}", ran.stderr);
    assert_eq!(ran.json()["open"], 1);
    // Embeddings off: the text says nothing of them.
    let ran = run(client(&[]), "backlog").await;
    assert_eq!(ran.code, 0, "{}", ran.stderr);
    assert!(ran.stdout.starts_with("open: 1\n"), "{}", ran.stdout);
    assert!(!ran.stdout.contains("embed"), "{}", ran.stdout);

    let ran = run(client(&["close", "demo", "--wait", "--json"]), "session").await;
    assert_eq!(ran.code, 0, "{}", ran.stderr);
    let closed = ran.json();
    assert_eq!(closed["closed"], true);
    assert_eq!(closed["segment"]["state"], "SEGMENT_STATE_SUMMARISED");
}

#[tokio::test]
async fn a_close_whose_recap_failed_is_reported_closed_with_what_comes_next() {
    let server = TestServer::start_with(|c| fast(c, &closed_port())).await;
    let address = format!("http://{}", server.addr);
    server.append("demo", &["Something to recap."]).await;
    let ran = archivist(
        &["session", "--server", &address, "close", "demo", "--wait"],
        &[],
        None,
    )
    .await;
    assert_eq!(ran.code, 3, "{}{}", ran.stdout, ran.stderr);
    assert!(
        ran.stdout.contains("closed segment 1 of demo"),
        "{}",
        ran.stdout
    );
    assert!(ran.stdout.contains("PENDING"), "{}", ran.stdout);
    assert!(ran.stdout.contains("next attempt:"), "{}", ran.stdout);
    assert!(ran.stdout.contains("fix:"), "{}", ran.stdout);
    // A refused key parks: the hint says what to do.
    let parked = Script::new(vec![ResponseTemplate::new(401)]);
    let mock = parked.mount().await;
    let server = TestServer::start_with(|c| fast(c, &mock.uri())).await;
    let address = format!("http://{}", server.addr);
    server.append("p", &["Something to recap."]).await;
    server.close("p", true).await.expect("closed; refused");
    let ran = archivist(&["session", "--server", &address, "show", "p"], &[], None).await;
    assert_eq!(ran.code, 0, "{}", ran.stderr);
    assert!(ran.stdout.contains("PARKED"), "{}", ran.stdout);
    assert!(ran.stdout.contains("--include-parked"), "{}", ran.stdout);
    assert!(ran.stdout.contains("fix:"), "{}", ran.stdout);
}

#[tokio::test]
async fn the_terminal_client_names_every_bad_character_and_erases_in_plain_words() {
    let server = TestServer::start().await;
    let address = format!("http://{}", server.addr);
    let ran = archivist(
        &["session", "--server", &address, "show", "bad id!"],
        &[],
        None,
    )
    .await;
    assert_eq!(ran.code, 64, "{}", ran.stderr);
    assert!(
        ran.stderr.contains("session id contains ' ' and '!'"),
        "{}",
        ran.stderr
    );

    server.append("demo", &["one", "two", "three"]).await;
    server.close("demo", true).await.expect("closed");
    let ran = archivist(
        &["session", "--server", &address, "delete", "demo", "--yes"],
        &[],
        None,
    )
    .await;
    assert_eq!(ran.code, 0, "{}", ran.stderr);
    assert_eq!(
        ran.stdout.trim(),
        "erased session demo: 3 entries and 1 node of the memory tree (segments and roll-ups)"
    );

    // No variable set: --help names it without an empty value.
    let ran = archivist(
        &["session", "--help"],
        &[("ARCHIVIST_SERVER", None), ("ARCHIVIST_TOKEN", None)],
        None,
    )
    .await;
    assert_eq!(ran.code, 0, "{}", ran.stderr);
    assert!(
        ran.stdout.contains("[env: ARCHIVIST_SERVER]"),
        "{}",
        ran.stdout
    );
    assert!(!ran.stdout.contains("="), "{}", ran.stdout);
}

#[tokio::test]
async fn show_tells_a_failure_a_later_recap_cleared_as_past() {
    let script = Script::new(vec![ResponseTemplate::new(401), completion("The recap.")]);
    let mock = script.mount().await;
    let server = TestServer::start_with(|c| fast(c, &mock.uri())).await;
    let address = format!("http://{}", server.addr);
    server.append("p", &["Something to recap."]).await;
    server.close("p", true).await.expect("closed; refused");
    let args = ["session", "--server", &address, "show", "p"];
    let show = || archivist(&args, &[], None);
    let parked = show().await;
    assert!(parked.stdout.contains("PARKED"), "{}", parked.stdout);
    assert!(
        parked.stdout.contains("last failure: unauthorized"),
        "{}",
        parked.stdout
    );
    assert!(parked.stdout.contains("fix:"), "{}", parked.stdout);

    // Fixed and requeued, the recap is written: the failure is history.
    assert_eq!(server.requeue("p", true).await, 1);
    let summarised = eventually(Duration::from_secs(10), || async {
        server.backlog().await.summarised == 1
    })
    .await;
    assert!(summarised);
    let ran = show().await;
    assert_eq!(ran.code, 0, "{}", ran.stderr);
    assert!(ran.stdout.contains("SUMMARISED"), "{}", ran.stdout);
    assert!(ran.stdout.contains("The recap."), "{}", ran.stdout);
    assert!(
        ran.stdout.contains(
            "an earlier pass failed (unauthorized after 1 attempt); a later one succeeded"
        ),
        "{}",
        ran.stdout
    );
    for stale in ["last failure", "fix:", "parked", "requeue"] {
        assert!(!ran.stdout.contains(stale), "{stale:?} in {}", ran.stdout);
    }
}

#[tokio::test]
async fn start_up_messages_name_what_to_change() {
    let dir = tempfile::tempdir().expect("temp dir");
    let data_dir = dir.path().to_str().expect("utf-8 path");
    // A host name is an address to listen on.
    let listening = Serve::start_args(
        &["serve", "--listen", "localhost:0", "--data-dir", data_dir],
        &[],
    );
    let line = listening
        .logged("archivist is serving")
        .await
        .expect("serving on localhost");
    assert!(line.contains("listen=127.0.0.1:"), "{line}");

    // A taken port names the flag that chose it.
    let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = taken.local_addr().expect("addr").to_string();
    let other = tempfile::tempdir().expect("temp dir");
    let ran = archivist(
        &[
            "serve",
            "--listen",
            &addr,
            "--data-dir",
            other.path().to_str().expect("utf-8"),
        ],
        &[],
        None,
    )
    .await;
    assert_eq!(ran.code, 1);
    assert!(ran.stderr.contains("--listen"), "{}", ran.stderr);
    assert!(ran.stderr.contains(&addr), "{}", ran.stderr);

    // Missing TLS files stop it before it claims to serve anything.
    let ran = archivist(
        &[
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--data-dir",
            other.path().to_str().expect("utf-8"),
        ],
        &[
            ("ARCHIVIST_TLS_CERT", Some("/nonexistent/cert.pem")),
            ("ARCHIVIST_TLS_KEY", Some("/nonexistent/key.pem")),
        ],
        None,
    )
    .await;
    assert_eq!(ran.code, 1);
    assert!(
        ran.stderr.contains("/nonexistent/cert.pem"),
        "{}",
        ran.stderr
    );
    assert!(
        !ran.stderr.contains("archivist is serving"),
        "{}",
        ran.stderr
    );

    // https:// to a plaintext server says so, and what to use instead.
    let plain = TestServer::start().await;
    let ran = archivist(
        &["sessions", "--server", &format!("https://{}", plain.addr)],
        &[],
        None,
    )
    .await;
    assert_eq!(ran.code, 1);
    assert!(ran.stderr.contains("does not speak TLS"), "{}", ran.stderr);
    assert!(
        ran.stderr.contains(&format!("http://{}", plain.addr)),
        "{}",
        ran.stderr
    );
}

/// `archivist serve` on `data_dir`, expected to refuse and exit: bounded,
/// so that a server that started after all fails the test instead of
/// hanging the suite.
async fn serve_once(data_dir: &str) -> Ran {
    tokio::time::timeout(
        Duration::from_secs(60),
        archivist(
            &["serve", "--listen", "127.0.0.1:0", "--data-dir", data_dir],
            &[],
            None,
        ),
    )
    .await
    .expect("the refused serve exits at once")
}

#[tokio::test]
async fn a_second_serve_on_one_sqlite_directory_is_refused_naming_the_first() {
    let dir = tempfile::tempdir().expect("temp dir");
    let data_dir = dir.path().to_str().expect("utf-8 path");
    let pid_file = dir.path().join("archivist.serving");
    let mut first = Serve::start(dir.path(), &[]);
    first
        .logged("archivist is serving")
        .await
        .expect("the first serves");
    let first_pid = first.child.id();
    assert_eq!(
        std::fs::read_to_string(&pid_file).expect("pid file"),
        format!("{first_pid}\n")
    );

    let ran = serve_once(data_dir).await;
    assert_eq!(ran.code, 1, "{}", ran.stderr);
    let held_by = format!("another `archivist serve` (process {first_pid})");
    assert!(ran.stderr.contains(&held_by), "{}", ran.stderr);
    assert!(ran.stderr.contains(data_dir), "{}", ran.stderr);
    assert!(ran.stderr.contains("PostgreSQL"), "{}", ran.stderr);
    assert!(
        !ran.stderr.contains("archivist is serving"),
        "{}",
        ran.stderr
    );
    // The file only says who; the lock on the directory decides.
    std::fs::remove_file(&pid_file).expect("remove the pid file");
    let ran = serve_once(data_dir).await;
    assert_eq!(ran.code, 1, "{}", ran.stderr);
    assert!(
        ran.stderr.contains("another `archivist serve` is serving"),
        "{}",
        ran.stderr
    );
    // The first is untouched and still answers.
    let addr = first
        .logged("archivist is serving")
        .await
        .and_then(|l| {
            l.split("listen=")
                .nth(1)
                .and_then(|a| a.split_whitespace().next())
                .map(str::to_owned)
        })
        .expect("the first's address");
    let mut client = archivist::client::connect(&format!("http://{addr}"))
        .await
        .expect("connect");
    client
        .append_entries(crate::harness::append_request("s", &["still here"]))
        .await
        .expect("the first still appends");

    // However the first ends, the directory is free again; a link planted
    // where the pid goes is replaced, never written through.
    first.child.kill().expect("kill -9");
    first.child.wait().expect("reaped");
    let elsewhere = tempfile::tempdir().expect("temp dir");
    let victim = elsewhere.path().join("victim");
    std::fs::write(&victim, "precious").expect("write");
    let _ = std::fs::remove_file(&pid_file);
    std::os::unix::fs::symlink(&victim, &pid_file).expect("plant a link");
    let mut again = Serve::start(dir.path(), &[]);
    again
        .logged("archivist is serving")
        .await
        .expect("a server after the first is gone serves");
    assert_eq!(
        std::fs::read_to_string(&victim).expect("victim"),
        "precious"
    );
    assert!(
        std::fs::symlink_metadata(&pid_file)
            .expect("pid file")
            .is_file()
    );
    // Stopped gracefully, it takes its pid file with it.
    let term = Command::new("kill")
        .arg(again.child.id().to_string())
        .status()
        .expect("kill -TERM");
    assert!(term.success());
    let stopped = again.child.wait().expect("stopped");
    assert_eq!(stopped.code(), Some(0));
    assert!(!pid_file.exists(), "the pid file outlived its server");

    // A file where the data directory should be is named as such.
    let file = dir.path().join("not-a-directory");
    std::fs::write(&file, "x").expect("write");
    let ran = serve_once(file.to_str().expect("utf-8")).await;
    assert_eq!(ran.code, 1, "{}", ran.stderr);
    let not_a_dir = "something other than a directory is at that path";
    assert!(ran.stderr.contains(not_a_dir), "{}", ran.stderr);
    // So do the commands that only read or drain it, and a dangling link.
    let file = file.to_str().expect("utf-8");
    let ran = archivist(&["backfill", "--data-dir", file], &[], None).await;
    assert_eq!(ran.code, 1, "{}", ran.stderr);
    assert!(ran.stderr.contains(not_a_dir), "{}", ran.stderr);
    let ran = archivist(&["check", "--data-dir", file], &[], None).await;
    assert!(
        ran.stdout.contains(&format!(
            "database: cannot be read: cannot use the data directory {file}: {not_a_dir}"
        )),
        "{}",
        ran.stdout
    );
    let dangling = dir.path().join("dangling");
    std::os::unix::fs::symlink(dir.path().join("nowhere"), &dangling).expect("link");
    let ran = serve_once(dangling.to_str().expect("utf-8")).await;
    assert_eq!(ran.code, 1, "{}", ran.stderr);
    assert!(ran.stderr.contains(not_a_dir), "{}", ran.stderr);
}

#[tokio::test]
async fn serve_moves_up_from_extractive_but_refuses_other_changes_unless_told() {
    let dir = extractive_database().await;
    let data_dir = dir.path().to_str().expect("utf-8 path");
    let serve_args = ["serve", "--listen", "127.0.0.1:0", "--data-dir", data_dir];
    let llm = |base: &str| {
        let mut env = openai_env(base);
        env.push((
            "ARCHIVIST_PROVIDER_CHECK_ON_START",
            Some("false".to_owned()),
        ));
        env
    };

    // From the default to an LLM: the upgrade a newcomer makes, let through
    // and said in a line.
    let env = llm("http://127.0.0.1:9");
    let upgraded = Serve::start(dir.path(), &borrowed(&env));
    let changed = upgraded
        .logged("the provider changed")
        .await
        .expect("said so at start-up");
    assert!(changed.contains("from extractive"), "{changed}");
    assert!(changed.contains("http://127.0.0.1:9/v1"), "{changed}");
    assert!(changed.contains("INFO"), "{changed}");
    upgraded
        .logged("archivist is serving")
        .await
        .expect("serving without the flag");
    drop(upgraded);

    // Back down to extractive (a serve without the server's --config), or
    // across to another LLM: refused, naming both.
    let other = llm("http://127.0.0.1:10");
    for (what, env) in [("extractive", Vec::new()), ("another LLM", other.clone())] {
        let ran = archivist(&serve_args, &borrowed(&env), None).await;
        assert_eq!(ran.code, 1, "{what}: {}", ran.stderr);
        assert!(
            ran.stderr
                .contains("last served with openai at http://127.0.0.1:9/v1"),
            "{what}: {}",
            ran.stderr
        );
        assert!(
            ran.stderr.contains("--allow-provider-change"),
            "{what}: {}",
            ran.stderr
        );
        assert!(
            !ran.stderr.contains("archivist is serving"),
            "{what}: {}",
            ran.stderr
        );
    }

    let mut told_args = serve_args.to_vec();
    told_args.push("--allow-provider-change");
    let told = Serve::start_args(&told_args, &borrowed(&other));
    let changed = told
        .logged("the provider changed (--allow-provider-change)")
        .await
        .expect("said so at start-up");
    assert!(changed.contains("http://127.0.0.1:9/v1"), "{changed}");
    assert!(changed.contains("WARN"), "{changed}");
    told.logged("archivist is serving").await.expect("serving");
    drop(told);
    // The new provider is the server's record now: no flag needed again.
    let again = Serve::start(dir.path(), &borrowed(&other));
    again
        .logged("archivist is serving")
        .await
        .expect("serving without the flag");
}
