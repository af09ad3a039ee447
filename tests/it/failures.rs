//! Failures cross the wire whole: for each class, a close that is OK
//! whatever its recap did, the typed Failure on the segment it answers
//! with (attempts, HTTP status, full cause chain), the same Failure read
//! back later, and the key nowhere.

use std::time::Duration;

use archivist::failure::FailureClass;
use archivist::pb;
use wiremock::ResponseTemplate;

use crate::harness::TestServer;
use crate::provider::{Script, append_and_close, class_of, error_json, failure_of, fast};

const KEY: &str = "sk-archivist-test-7f3a9c1e5b2d";

struct Case {
    name: &'static str,
    /// None: the provider is a closed port.
    answer: Option<ResponseTemplate>,
    class: FailureClass,
    attempts: u32,
    http_status: Option<u32>,
    /// Text the last cause (the root) must contain.
    root: &'static str,
}

fn cases() -> Vec<Case> {
    // Every body echoes the key, as some providers and gateways do.
    let echo = format!("Incorrect API key provided: {KEY}");
    vec![
        Case {
            name: "connection refused",
            answer: None,
            class: FailureClass::Transport,
            attempts: 3,
            http_status: None,
            root: "refused",
        },
        Case {
            name: "timeout",
            answer: Some(ResponseTemplate::new(200).set_delay(Duration::from_secs(5))),
            class: FailureClass::Timeout,
            attempts: 3,
            http_status: None,
            root: "no answer within",
        },
        Case {
            name: "503",
            answer: Some(ResponseTemplate::new(503).set_body_string(format!("overloaded ({KEY})"))),
            class: FailureClass::Unavailable,
            attempts: 3,
            http_status: Some(503),
            root: "HTTP 503",
        },
        Case {
            name: "HTML 502 page",
            answer: Some(
                ResponseTemplate::new(502)
                    .insert_header("content-type", "text/html")
                    .set_body_string(format!(
                        "<html><body>502 Bad Gateway, key={KEY}</body></html>"
                    )),
            ),
            class: FailureClass::Unavailable,
            attempts: 3,
            http_status: Some(502),
            root: "502 Bad Gateway",
        },
        Case {
            name: "429 with Retry-After",
            answer: Some(
                error_json(429, "rate_limit_exceeded", &echo).insert_header("retry-after", "3600"),
            ),
            class: FailureClass::RateLimited,
            attempts: 1,
            http_status: Some(429),
            root: "HTTP 429",
        },
        Case {
            name: "insufficient_quota",
            answer: Some(error_json(
                429,
                "insufficient_quota",
                &format!("You exceeded your current quota. {echo}"),
            )),
            class: FailureClass::QuotaExhausted,
            attempts: 1,
            http_status: Some(429),
            root: "exceeded your current quota",
        },
        Case {
            name: "401",
            answer: Some(error_json(401, "invalid_api_key", &echo)),
            class: FailureClass::Unauthorized,
            attempts: 1,
            http_status: Some(401),
            root: "Incorrect API key provided",
        },
        Case {
            name: "model_not_found",
            answer: Some(error_json(
                404,
                "model_not_found",
                "The model `test-model` does not exist",
            )),
            class: FailureClass::UnknownModel,
            attempts: 1,
            http_status: Some(404),
            root: "does not exist",
        },
    ]
}

fn closed_port() -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("addr");
    drop(listener);
    format!("http://{addr}")
}

#[tokio::test]
async fn every_class_reaches_the_caller_typed_with_its_whole_chain() {
    for case in cases() {
        let name = case.name;
        let (base, _mock) = match case.answer {
            Some(answer) => {
                let script = Script::new(vec![answer]);
                let mock = script.mount().await;
                (mock.uri(), Some(mock))
            }
            None => (closed_port(), None),
        };
        let server = TestServer::start_with_key(KEY, |c| {
            fast(c, &base);
            c.retry.attempt_timeout = Duration::from_millis(300);
        })
        .await;
        // The close is OK: the failure is the segment's, not the call's.
        let closed = append_and_close(&server, "s").await.expect_err(name);
        let failure = failure_of(&closed).clone();
        assert_eq!(class_of(&failure), Some(case.class), "{name}");
        assert_eq!(failure.attempts, case.attempts, "{name}");
        assert_eq!(failure.http_status, case.http_status, "{name}");
        assert_eq!(failure.retryable, case.class.retryable(), "{name}");
        assert_eq!(
            (failure.provider.as_str(), failure.model.as_str()),
            ("openai", "test-model")
        );
        assert!(failure.elapsed.is_some(), "{name}");
        assert!(failure.causes.len() >= 2, "{name}: {:?}", failure.causes);
        assert!(!failure.hint.is_empty(), "{name}: a hint");
        let root = failure.causes.last().expect("a root cause");
        assert!(
            root.contains(case.root),
            "{name}: root cause {root:?} in {:?}",
            failure.causes
        );
        if case.class == FailureClass::Transport {
            // More than reqwest's "error sending request": down to the socket.
            assert!(failure.causes.len() > 3, "{name}: {:?}", failure.causes);
            assert!(!root.contains("error sending request"), "{name}: {root}");
        }
        if case.class == FailureClass::RateLimited {
            match &failure.kind {
                Some(pb::failure::Kind::RateLimited(r)) => assert_eq!(
                    r.retry_after.and_then(|d| Duration::try_from(d).ok()),
                    Some(Duration::from_secs(3600)),
                    "{name}"
                ),
                other => panic!("{name}: {other:?}"),
            }
        }
        let expected_state = match case.class.retryable() {
            true => pb::SegmentState::Pending,
            false => pb::SegmentState::Parked,
        };
        assert_eq!(closed.state, expected_state as i32, "{name}");

        // The segment keeps the very same record.
        let segs = server.segments("s").await;
        assert_eq!(segs.len(), 1);
        let stored = server
            .client
            .clone()
            .get_segment(pb::GetSegmentRequest {
                segment_id: segs[0].id,
            })
            .await
            .expect("get")
            .into_inner()
            .last_failure
            .expect("last_failure");
        assert_eq!(stored, failure, "{name}: stored and returned differ");
        assert!(segs[0].summary.is_none(), "{name}");

        // The key is in no cause and nowhere in the database's files.
        for cause in &failure.causes {
            assert!(!cause.contains(KEY), "{name}: key in {cause:?}");
        }
        let dir = server.stop().await;
        for entry in std::fs::read_dir(dir.path()).expect("data dir") {
            let path = entry.expect("entry").path();
            // The WAL may be checkpointed into the main file and removed as
            // the store closes; what it held is then in the main file.
            let Ok(bytes) = std::fs::read(&path) else {
                continue;
            };
            assert!(
                !bytes.windows(KEY.len()).any(|w| w == KEY.as_bytes()),
                "{name}: key in {}",
                path.display()
            );
        }
    }
    for line in crate::logs::lines() {
        assert!(!line.contains(KEY), "key in a log line: {line}");
    }
}

#[tokio::test]
async fn the_terminal_client_prints_the_chain() {
    let server = TestServer::start_with(|c| fast(c, &closed_port())).await;
    let address = format!("http://{}", server.addr);
    server.append("s", &["Something to recap."]).await;
    let ran = crate::operator::archivist(
        &["session", "--server", &address, "close", "s", "--wait"],
        &[],
        None,
    )
    .await;
    assert_eq!(ran.code, 3, "{}{}", ran.stdout, ran.stderr);
    let failure_line = ran
        .stdout
        .lines()
        .find(|l| l.trim_start().starts_with("last failure: transport"))
        .unwrap_or_else(|| panic!("no failure line in {}", ran.stdout));
    // The chain down to the socket, after the class and the attempts.
    assert!(failure_line.contains("after 3 attempts"), "{failure_line}");
    assert!(
        failure_line.to_lowercase().contains("refused"),
        "{failure_line}"
    );
    assert!(ran.stdout.contains("fix: "), "{}", ran.stdout);
}
