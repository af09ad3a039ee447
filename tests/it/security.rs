//! Guard rails: tenant authentication and isolation, limits, TLS, metrics.

use std::time::Duration;

use archivist::client::{ClientOptions, connect_with};
use archivist::config::token_sha256;
use archivist::config::{Config, TenantConfig};
use archivist::pb;
use tonic::Code;
use tonic_types::StatusExt;

use crate::harness::{TestServer, reason};
use crate::provider::{Script, completion, fast};

pub const TOKEN_A: &str = "token-of-tenant-a-5f1e";
pub const TOKEN_B: &str = "token-of-tenant-b-93c2";

pub fn tenants(config: &mut Config) {
    config.auth.tenants = vec![
        TenantConfig {
            name: "a".into(),
            token_sha256: Some(token_sha256(TOKEN_A)),
            token_env: None,
        },
        TenantConfig {
            name: "b".into(),
            token_sha256: Some(token_sha256(TOKEN_B)),
            token_env: None,
        },
    ];
}

pub async fn client(server: &TestServer, token: Option<&str>) -> archivist::client::Client {
    connect_with(&ClientOptions {
        address: format!("http://{}", server.addr),
        token: token.map(str::to_owned),
        ..ClientOptions::default()
    })
    .await
    .expect("connect")
}

fn append(session: &str, text: &str) -> pb::AppendEntriesRequest {
    crate::harness::append_request(session, &[text])
}

#[tokio::test]
async fn calls_without_a_valid_token_are_refused_and_store_nothing() {
    let server = TestServer::start_with(tenants).await;
    let status = client(&server, None)
        .await
        .append_entries(append("s", "no token"))
        .await
        .expect_err("refused");
    assert_eq!(status.code(), Code::Unauthenticated);
    assert_eq!(reason(&status), "MISSING_TOKEN");
    let status = client(&server, Some("not-a-token"))
        .await
        .append_entries(append("s", "wrong token"))
        .await
        .expect_err("refused");
    assert_eq!(status.code(), Code::Unauthenticated);
    assert_eq!(reason(&status), "INVALID_TOKEN");
    for token in [TOKEN_A, TOKEN_B] {
        let backlog = client(&server, Some(token))
            .await
            .get_backlog(pb::GetBacklogRequest {})
            .await
            .expect("backlog")
            .into_inner();
        assert_eq!(backlog.open + backlog.pending + backlog.summarised, 0);
    }
    for line in crate::logs::lines() {
        assert!(
            !line.contains(TOKEN_A) && !line.contains(TOKEN_B),
            "a token in the log: {line}"
        );
    }
}

#[tokio::test]
async fn one_tenant_cannot_see_or_touch_anothers_sessions() {
    let server = TestServer::start_with(|c| {
        tenants(c);
        c.segment.max_entries = 1;
    })
    .await;
    let mut a = client(&server, Some(TOKEN_A)).await;
    let mut b = client(&server, Some(TOKEN_B)).await;
    let resp = a
        .append_entries(append("shared-name", "a's secret plan"))
        .await
        .expect("append")
        .into_inner();
    let a_segment = resp.closed_segment_ids[0];
    a.append_entries(append("shared-name", "more of a's plan"))
        .await
        .expect("append");

    let not_found = |status: tonic::Status| {
        assert_eq!(status.code(), Code::NotFound, "{status:?}");
    };
    not_found(
        b.get_segment(pb::GetSegmentRequest {
            segment_id: a_segment,
        })
        .await
        .expect_err("hidden"),
    );
    not_found(
        b.get_context(pb::GetContextRequest {
            session_id: "shared-name".into(),
            max_tokens: 0,
            query: String::new(),
            min_similarity: None,
        })
        .await
        .expect_err("hidden"),
    );
    not_found(
        b.flush_session(pb::FlushSessionRequest {
            session_id: "shared-name".into(),
        })
        .await
        .expect_err("hidden"),
    );
    not_found(
        b.close_segment(pb::CloseSegmentRequest {
            session_id: "shared-name".into(),
            wait: false,
        })
        .await
        .expect_err("hidden"),
    );
    let listed = crate::harness::list_segments(&mut b, "").await;
    assert!(listed.is_empty(), "{listed:?}");
    let requeued = b
        .requeue_segments(pb::RequeueSegmentsRequest {
            session_id: String::new(),
            segment_ids: vec![a_segment],
            include_parked: true,
        })
        .await
        .expect("requeue")
        .into_inner()
        .requeued;
    assert_eq!(requeued, 0);
    let backlog = b
        .get_backlog(pb::GetBacklogRequest {})
        .await
        .expect("backlog")
        .into_inner();
    assert_eq!(
        backlog.open + backlog.pending + backlog.summarised + backlog.parked,
        0
    );

    // B's "shared-name" is B's own session: it starts at seq 1.
    let mine = b
        .append_entries(append("shared-name", "b's own entry"))
        .await
        .expect("append")
        .into_inner();
    assert_eq!(mine.entries[0].seq, 1);
    // And A still sees only A's.
    let a_ctx = a
        .get_context(pb::GetContextRequest {
            session_id: "shared-name".into(),
            max_tokens: 0,
            query: String::new(),
            min_similarity: None,
        })
        .await
        .expect("context")
        .into_inner();
    let text = format!("{a_ctx:?}");
    assert!(!text.contains("b's own entry"));
    // Health answers without a token, for probes.
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", server.addr))
        .expect("endpoint")
        .connect()
        .await
        .expect("connect");
    tonic_health::pb::health_client::HealthClient::new(channel)
        .check(tonic_health::pb::HealthCheckRequest {
            service: String::new(),
        })
        .await
        .expect("health without a token");
}

#[tokio::test]
async fn over_limit_messages_calls_and_bytes_get_their_codes_and_store_nothing() {
    let script = Script::new(vec![completion("slow").set_delay(Duration::from_secs(2))]);
    let mock = script.mount().await;
    let server = TestServer::start_with(|c| {
        fast(c, &mock.uri());
        c.limits.max_message_bytes = 2048;
        c.limits.max_concurrent_calls = 1;
        // A session and an entry cost their text plus 64 bytes each.
        c.limits.max_tenant_bytes = 400;
    })
    .await;
    let mut client = server.client.clone();

    // A message over the size limit.
    let status = client
        .append_entries(append("big", &"x".repeat(4000)))
        .await
        .expect_err("too big");
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    assert_eq!(reason(&status), "MESSAGE_TOO_LARGE");

    // Bytes over the tenant's cap: the first append fits (1 + 64 for the
    // session, 60 + 64 for the entry), the second would pass 400.
    client
        .append_entries(append("s", &"y".repeat(60)))
        .await
        .expect("within the cap");
    let status = client
        .append_entries(append("s", &"z".repeat(250)))
        .await
        .expect_err("over the cap");
    assert_eq!(status.code(), Code::ResourceExhausted);
    assert_eq!(reason(&status), "TENANT_STORAGE_FULL");
    assert!(status.get_error_details().quota_failure().is_some());
    let ctx = server.context("s", 0).await;
    assert_eq!(
        ctx.items.len(),
        1,
        "nothing of the refused append was stored"
    );
    assert!(
        server.segments("big").await.is_empty(),
        "the oversized message stored nothing"
    );

    // Calls over the concurrency cap: one call holds the only slot (it
    // waits on a slow provider); another is refused at once, not queued.
    let holder = {
        let mut c = client.clone();
        tokio::spawn(async move {
            c.close_segment(pb::CloseSegmentRequest {
                session_id: "s".into(),
                wait: true,
            })
            .await
        })
    };
    // Once its pass has reached the provider, the holder has the slot.
    let holding =
        crate::harness::eventually(Duration::from_secs(2), || async { script.calls() == 1 }).await;
    assert!(holding);
    let status = client
        .get_backlog(pb::GetBacklogRequest {})
        .await
        .expect_err("a call past the cap is refused");
    assert_eq!(status.code(), Code::ResourceExhausted);
    assert_eq!(reason(&status), "TOO_MANY_CALLS");
    assert!(status.get_error_details().retry_info().is_some());
    holder.await.expect("joined").expect("the holder finishes");
    client
        .get_backlog(pb::GetBacklogRequest {})
        .await
        .expect("served again once the slot is free");
}

/// A CA, and a certificate for `localhost` (or a client) signed by it.
struct Pki {
    ca: String,
    cert: String,
    key: String,
    client_cert: String,
    client_key: String,
}

fn pki() -> Pki {
    use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).expect("params");
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca =
        CertifiedIssuer::self_signed(ca_params, KeyPair::generate().expect("key")).expect("ca");
    let key = KeyPair::generate().expect("key");
    let cert = CertificateParams::new(vec!["localhost".to_owned()])
        .expect("params")
        .signed_by(&key, &ca)
        .expect("server cert");
    let client_key = KeyPair::generate().expect("key");
    let client_cert = CertificateParams::new(vec!["client".to_owned()])
        .expect("params")
        .signed_by(&client_key, &ca)
        .expect("client cert");
    Pki {
        ca: ca.pem(),
        cert: cert.pem(),
        key: key.serialize_pem(),
        client_cert: client_cert.pem(),
        client_key: client_key.serialize_pem(),
    }
}

#[tokio::test]
async fn tls_refuses_plaintext_and_serves_a_client_that_trusts_its_ca() {
    let pki = pki();
    let files = tempfile::tempdir().expect("temp dir");
    let write = |name: &str, text: &str| {
        let path = files.path().join(name);
        std::fs::write(&path, text).expect("write");
        path
    };
    let (ca, cert, key) = (
        write("ca.pem", &pki.ca),
        write("cert.pem", &pki.cert),
        write("key.pem", &pki.key),
    );
    let (client_cert, client_key) = (
        write("client.pem", &pki.client_cert),
        write("client-key.pem", &pki.client_key),
    );

    for mutual in [false, true] {
        let dir = tempfile::tempdir().expect("temp dir");
        let mut config = Config::default();
        config.tls.cert = Some(cert.clone());
        config.tls.key = Some(key.clone());
        if mutual {
            config.tls.client_ca = Some(ca.clone());
        }
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let port = listener.local_addr().expect("addr").port();
        config.data_dir = dir.path().to_owned();
        tokio::spawn(archivist::server::run_with_key(
            config,
            None,
            listener,
            std::future::pending(),
        ));

        let secure = |identity: bool| ClientOptions {
            address: format!("https://localhost:{port}"),
            ca_cert: Some(ca.clone()),
            client_cert: identity.then(|| client_cert.clone()),
            client_key: identity.then(|| client_key.clone()),
            ..ClientOptions::default()
        };
        let mut ok = None;
        for _ in 0..50 {
            if let Ok(c) = connect_with(&secure(true)).await {
                ok = Some(c);
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let mut ok = ok.expect("a client with the CA (and a certificate) connects");
        ok.append_entries(append("s", "over TLS"))
            .await
            .expect("served over TLS");

        // Plaintext to a TLS port: no answer.
        let plain = connect_with(&ClientOptions {
            address: format!("http://127.0.0.1:{port}"),
            ..ClientOptions::default()
        })
        .await;
        if let Ok(mut plain) = plain {
            plain
                .get_backlog(pb::GetBacklogRequest {})
                .await
                .expect_err("plaintext is refused");
        }
        if mutual {
            // No client certificate: refused.
            let anonymous = connect_with(&secure(false)).await;
            if let Ok(mut anonymous) = anonymous {
                anonymous
                    .get_backlog(pb::GetBacklogRequest {})
                    .await
                    .expect_err("a client without a certificate is refused");
            }
        }
    }
}

#[tokio::test]
async fn the_metrics_endpoint_counts_calls_retries_and_failures() {
    let script = Script::new(vec![tonic_free_503()]);
    let mock = script.mount().await;
    let server = TestServer::start_with(|c| {
        fast(c, &mock.uri());
        c.metrics.listen = Some("127.0.0.1:0".parse().expect("addr"));
    })
    .await;
    let data_dir = server.data_dir().display().to_string();
    let logged = || {
        crate::logs::lines()
            .into_iter()
            .find(|l| l.contains("metrics at /metrics") && l.contains(&data_dir))
    };
    let up =
        crate::harness::eventually(Duration::from_secs(5), || async { logged().is_some() }).await;
    assert!(up, "the metrics address is logged");
    let line = logged().unwrap_or_default();
    let addr = line
        .split("metrics=")
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .expect("address")
        .to_owned();
    let scrape = || async {
        reqwest::get(format!("http://{addr}/metrics"))
            .await
            .expect("scrape")
            .text()
            .await
            .expect("body")
    };
    let value = |text: &str, series: &str| -> f64 {
        text.lines()
            .find(|l| l.starts_with(series))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0.0)
    };
    let before = scrape().await;
    server.append("s", &["one", "two"]).await;
    server
        .close("s", true)
        .await
        .expect("closed; 503 every time");
    let after = scrape().await;
    let appended = "archivist_grpc_calls_total{code=\"Ok\",method=\"AppendEntries\"}";
    assert_eq!(
        value(&after, appended) - value(&before, appended),
        1.0,
        "{after}"
    );
    // The close committed: OK, whatever its recap did.
    let closed = "archivist_grpc_calls_total{code=\"Ok\",method=\"CloseSegment\"}";
    assert_eq!(value(&after, closed), 1.0, "{after}");
    assert_eq!(
        value(
            &after,
            "archivist_summarise_attempts_total{class=\"unavailable\",outcome=\"failure\"}"
        ),
        3.0
    );
    assert_eq!(value(&after, "archivist_retries_total"), 2.0);
    assert_eq!(
        value(
            &after,
            "archivist_passes_total{class=\"unavailable\",outcome=\"failure\"}"
        ),
        1.0
    );
    assert_eq!(value(&after, "archivist_pass_duration_seconds_count"), 1.0);
    assert_eq!(value(&after, "archivist_segments{state=\"pending\"}"), 1.0);
    assert!(after.contains("archivist_breaker_state 0"));
    assert!(after.contains("archivist_oldest_pending_age_seconds"));
    assert!(after.contains("archivist_reconciler_scans_total"));
}

fn tonic_free_503() -> wiremock::ResponseTemplate {
    wiremock::ResponseTemplate::new(503)
}
