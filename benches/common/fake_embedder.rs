//! A fake OpenAI-compatible `/v1/embeddings` in the bench process (on a
//! thread and runtime of its own, so that the bench's own work does not
//! delay its answers): each request is answered after a fixed latency with
//! one unit vector per input, or (hanging) never.
//!
//! The vectors are deterministic and clustered: a text's vector is the
//! centre of one of `CLUSTERS` random directions (picked by a hash of the
//! text) plus noise of its own, normalised. Nearest neighbours then mean
//! something (a query lands in one cluster, whose members are nearer than
//! the rest), and `vector` lets the bench compute the exact ranking itself.
//! Its length is the request's `dimensions`, else `DEFAULT_DIMENSIONS`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::Value;

/// The vectors' length when the request names none (the common small
/// models': e5-small, all-MiniLM).
pub const DEFAULT_DIMENSIONS: usize = 384;
/// Directions the vectors cluster around.
pub const CLUSTERS: u64 = 1000;
/// The noise's weight against a cluster's centre (both of unit scale per
/// component before normalising): neighbours within a cluster are close,
/// but not identical.
const NOISE: f32 = 0.6;

/// What the fake was sent and answered.
#[derive(Default)]
pub struct Counts {
    pub requests: AtomicU64,
    pub items: AtomicU64,
    /// Requests waiting for their answer now.
    pub in_flight: AtomicU64,
    /// The most requests waiting at once.
    pub most_in_flight: AtomicU64,
    /// Each answer as it was sent: when, and how many vectors.
    answers: Mutex<Vec<(Instant, u32)>>,
}

impl Counts {
    /// Every answer so far: when, and how many vectors.
    pub fn answers(&self) -> Vec<(Instant, u32)> {
        self.answers.lock().unwrap().clone()
    }
}

pub struct FakeEmbedder {
    /// The base URL, for `embedding.base_url` (`/embeddings` is appended).
    pub url: String,
    pub counts: Arc<Counts>,
}

struct Shared {
    latency: Duration,
    hang: bool,
    counts: Arc<Counts>,
}

impl FakeEmbedder {
    /// Answers every request after `latency`.
    pub fn start(latency: Duration) -> FakeEmbedder {
        Self::spawn(latency, false)
    }

    /// Reads every request and never answers it (the connection stays
    /// open until the client gives up).
    pub fn hanging() -> FakeEmbedder {
        Self::spawn(Duration::ZERO, true)
    }

    fn spawn(latency: Duration, hang: bool) -> FakeEmbedder {
        let counts = Arc::new(Counts::default());
        let shared = Arc::new(Shared {
            latency,
            hang,
            counts: counts.clone(),
        });
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a loopback port");
        listener.set_nonblocking(true).expect("nonblocking");
        let address = listener.local_addr().expect("its address");
        std::thread::Builder::new()
            .name("fake-embedder".to_owned())
            .spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .expect("runtime");
                rt.block_on(async move {
                    let listener =
                        tokio::net::TcpListener::from_std(listener).expect("tokio listener");
                    let app = axum::Router::new()
                        .route("/v1/embeddings", axum::routing::post(answer))
                        .with_state(shared);
                    axum::serve(listener, app).await.expect("the fake serves");
                });
            })
            .expect("a thread");
        FakeEmbedder {
            url: format!("http://{address}/v1"),
            counts,
        }
    }
}

/// splitmix64: a well-mixed sequence from any seed.
fn mix(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Uniform in [-1, 1).
fn unit(state: &mut u64) -> f32 {
    (mix(state) >> 40) as f32 / (1u64 << 23) as f32 - 1.0
}

/// FNV-1a of `text`.
fn hash(text: &str) -> u64 {
    text.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// The fake's vector of `text`: its cluster's centre plus its own noise,
/// normalised.
pub fn vector(text: &str, dimensions: usize) -> Vec<f32> {
    let h = hash(text);
    let mut centre = (h % CLUSTERS).wrapping_mul(0x5851_f42d_4c95_7f2d);
    let mut noise = h;
    let mut v: Vec<f32> = (0..dimensions)
        .map(|_| unit(&mut centre) + NOISE * unit(&mut noise))
        .collect();
    let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt();
    v.iter_mut().for_each(|x| *x /= norm);
    v
}

/// The inputs of a request body and the length asked for.
fn inputs(body: &[u8]) -> Option<(Vec<String>, usize)> {
    let v: Value = serde_json::from_slice(body).ok()?;
    let texts = match &v["input"] {
        Value::String(s) => vec![s.clone()],
        Value::Array(a) => a
            .iter()
            .map(|x| x.as_str().map(str::to_owned))
            .collect::<Option<Vec<_>>>()?,
        _ => return None,
    };
    let dimensions = v["dimensions"]
        .as_u64()
        .map_or(DEFAULT_DIMENSIONS, |d| d as usize);
    Some((texts, dimensions))
}

/// Counts the request at its arrival and its vectors at their answer.
async fn answer(State(shared): State<Arc<Shared>>, body: Bytes) -> Response {
    let counts = &shared.counts;
    counts.requests.fetch_add(1, Ordering::SeqCst);
    let Some((texts, dimensions)) = inputs(&body) else {
        return (StatusCode::BAD_REQUEST, "no input").into_response();
    };
    let now = counts.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
    counts.most_in_flight.fetch_max(now, Ordering::SeqCst);
    if shared.hang {
        std::future::pending::<()>().await;
    }
    tokio::time::sleep(shared.latency).await;
    // Written by hand: serde_json's Value would cost more than the rest.
    let mut out = String::with_capacity(texts.len() * dimensions * 12 + 128);
    out.push_str(r#"{"object":"list","data":["#);
    for (i, text) in texts.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        out.push_str(&format!(
            r#"{{"object":"embedding","index":{i},"embedding":["#
        ));
        for (j, x) in vector(text, dimensions).iter().enumerate() {
            if j > 0 {
                out.push(',');
            }
            out.push_str(&x.to_string());
        }
        out.push_str("]}");
    }
    out.push_str(r#"],"model":"fake","usage":{"prompt_tokens":0,"total_tokens":0}}"#);
    counts.in_flight.fetch_sub(1, Ordering::SeqCst);
    counts.items.fetch_add(texts.len() as u64, Ordering::SeqCst);
    counts
        .answers
        .lock()
        .unwrap()
        .push((Instant::now(), texts.len() as u32));
    ([(header::CONTENT_TYPE, "application/json")], out).into_response()
}
