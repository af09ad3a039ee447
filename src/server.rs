//! `archivist serve`: opens the store, wires the summariser, the reconciler
//! and the gRPC services (Archivist, health, reflection v1 and v1alpha) and
//! runs until the shutdown future resolves, then winds down within the
//! shutdown ceiling.

use std::future::Future;
use std::sync::Arc;

use std::time::Duration;
use tokio::net::TcpListener;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tonic::transport::{Certificate, Identity, ServerTlsConfig};
use tonic_health::ServingStatus;
use tonic_health::server::HealthReporter;
use tracing::{info, warn};

use crate::app::{App, BuildError, warn_if_no_key};
use crate::auth::{Auth, AuthSetupError};
use crate::breaker::Breaker;
use crate::config::{BackendKind, Config, ProviderKind, RetryConfig};
use crate::error_chain;
use crate::grpc::{GrpcService, Incoming, NameRefusals, RecordCalls};
use crate::metrics::Metrics;
use crate::pass::embed::Embedding;
use crate::pass::{ProbeOutcome, Summariser};
use crate::pb;
use crate::store::{Store, StoreError};

/// How long a connection may be silent before the server pings it, and how
/// long the ping may go unanswered before the connection is closed.
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(60);
const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(20);
/// The fewest streams one connection may have open at once.
const MIN_STREAMS: u32 = 100;
/// How long watchers get at shutdown to take their UNAVAILABLE before the
/// connections left only to watches are closed.
const WATCH_STOP_GRACE: Duration = Duration::from_secs(1);
/// The longest a probe of the store may take before it counts as failed,
/// unless the interval between probes is longer.
const MIN_PROBE_TIMEOUT: Duration = Duration::from_secs(1);

#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error(transparent)]
    Build(#[from] BuildError),
    #[error("cannot update the store")]
    Store(#[from] StoreError),
    #[error("cannot take the data directory")]
    Claim(#[source] StoreError),
    #[error("cannot set up authentication")]
    Auth(#[from] AuthSetupError),
    #[error("cannot read the TLS file {path}")]
    TlsFile {
        path: std::path::PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot listen for metrics on {at}")]
    MetricsListen {
        at: std::net::SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot build the reflection service")]
    Reflection(#[from] tonic_reflection::server::Error),
    #[error("the gRPC server failed")]
    Transport(#[from] tonic::transport::Error),
}

/// Serves on `listener` until `shutdown` resolves, with the provider key
/// read from the environment variable the configuration names.
pub async fn run(
    config: Config,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), ServeError> {
    let api_key = std::env::var(&config.provider.api_key_env).ok();
    run_with_key(config, api_key, listener, shutdown).await
}

/// As `run`, with the provider key given (for embedding and tests).
pub async fn run_with_key(
    config: Config,
    api_key: Option<String>,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), ServeError> {
    // Everything that can be refused is checked before anything starts, so
    // a server that cannot run says why without first claiming it serves.
    let tls = tls_config(&config)?;
    let auth = Arc::new(Auth::from_config(&config.auth.tenants, |var| {
        std::env::var(var).ok()
    })?);
    warn_if_no_key(&config, api_key.as_deref());
    // Held until the server has stopped; taken before the database is
    // opened, so a second server on one SQLite directory changes nothing.
    let _serving = match config.storage.backend {
        BackendKind::Sqlite => {
            Some(Store::claim_sqlite_dir(&config.data_dir).map_err(ServeError::Claim)?)
        }
        BackendKind::Postgres => None,
    };
    let app = App::build(&config, api_key, "serve").await?;
    let store = app.store.clone();
    let changed_from = app.claim_provider(config.allow_provider_change).await?;
    match config.provider.kind {
        ProviderKind::Extractive => info!(
            "summarising with the built-in extractive provider (no LLM); set provider.kind = \"openai\" to use one"
        ),
        ProviderKind::Openai => info!(
            base_url = %app.provider_identity.base_url,
            model = %config.provider.model,
            "summarising through an OpenAI-compatible endpoint"
        ),
    }
    match changed_from {
        Some(before) if crate::app::is_upgrade(&before, &app.provider_identity) => info!(
            "the provider changed from {before} to {}: recaps from now on come from the LLM (a move from the built-in extractive provider needs no --allow-provider-change)",
            app.provider_identity
        ),
        Some(before) => warn!(
            "the provider changed (--allow-provider-change): the database last ran with {before}; recaps from now on come from {}",
            app.provider_identity
        ),
        None => {}
    }
    let metrics = match config.metrics.listen {
        Some(at) => Some(
            metrics_endpoint(
                at,
                store.clone(),
                app.metrics.clone(),
                app.breaker.clone(),
                app.embedding.clone(),
            )
            .await?,
        ),
        None => None,
    };
    let unparked = store.unpark_changed(&app.provider_fingerprint).await?;
    if unparked > 0 {
        info!(
            unparked,
            "parked segments failed under another provider configuration; they are due again"
        );
    }
    if let Some(e) = &app.embedding {
        info!(
            generation = e.generation().as_str(),
            endpoint = %e.endpoint(),
            "embeddings are on: entries and recaps are embedded in the background for Search's semantic leg"
        );
    }
    store.set_index_tail(config.search.tail_texts, config.search.tail_wait);
    if store.set_search_language(config.search.language).await? {
        info!(
            language = config.search.language.name(),
            "the search language changed: every stored text is indexed again in the background"
        );
    }
    let summariser = app.summariser.clone();
    let service = Arc::new(app.service());

    let background = CancellationToken::new();
    let (ready, reconciler_ready) = tokio::sync::oneshot::channel();
    let reconciler_task = tokio::spawn(app.reconciler().with_ready(ready).run(background.clone()));
    // The backlog from before the start is looked at before any call is.
    let _ = reconciler_ready.await;
    tokio::spawn(crate::search::indexer::run(
        store.clone(),
        background.clone(),
    ));
    if config.provider.kind == ProviderKind::Openai && config.provider.check_on_start {
        // Once, in the background: a provider that is down or misconfigured
        // is said plainly at start-up, but never holds the server back.
        tokio::spawn(startup_probe(
            summariser.clone(),
            app.provider_identity.to_string(),
            config.retry.clone(),
            background.clone(),
        ));
    }

    if auth.is_open() {
        warn!("no [[auth.tenants]] configured: running open, every caller is one tenant");
    } else {
        info!(
            tenants = config.auth.tenants.len(),
            "bearer-token authentication is on"
        );
    }
    let archivist = GrpcService::new(service.clone(), config.limits.clone()).into_server(auth);
    let (health, health_service) = tonic_health::server::health_reporter();
    set_health(&health, ServingStatus::Serving).await;
    let watcher_stop = CancellationToken::new();
    // However `run` ends, the probe ends with it.
    let _stop_watcher = watcher_stop.clone().drop_guard();
    let watcher = tokio::spawn(watch_store(
        store.clone(),
        health.clone(),
        config.health.probe_interval,
        watcher_stop.clone(),
    ));
    let reflection_v1 = reflection().build_v1()?;
    let reflection_v1alpha = reflection().build_v1alpha()?;

    let stop_accepting = CancellationToken::new();
    let mut builder = tonic::transport::Server::builder()
        // A peer that has gone without a word (a dead host, a cut link) is
        // found by pings and its connection closed.
        .http2_keepalive_interval(Some(KEEPALIVE_INTERVAL))
        .http2_keepalive_timeout(Some(KEEPALIVE_TIMEOUT))
        // Streams past the call and watch caps are refused at once, but
        // each open one costs memory: a connection gets no more than the
        // server serves calls (and gRPC's customary 100 at least) and one
        // tenant may watch, so one tenant's watches on one connection leave
        // its calls room.
        .max_concurrent_streams(streams_per_connection(&config.limits));
    if let Some(tls) = tls {
        builder = builder.tls_config(tls)?;
        info!(mutual = config.tls.client_ca.is_some(), "TLS is on");
    }
    if let Some(metrics) = metrics {
        if let Ok(at) = metrics.listener.local_addr() {
            info!(metrics = %at, data_dir = %config.data_dir.display(), "metrics at /metrics");
        }
        tokio::spawn(metrics.serve(background.clone()));
    }
    let addr = listener
        .local_addr()
        .map_or_else(|e| format!("unknown ({e})"), |a| a.to_string());
    info!(listen = %addr, storage = %store.location(&config.data_dir), "archivist is serving");
    let incoming = Incoming::new(
        listener,
        config.limits.max_connections as usize,
        config.limits.idle_timeout,
    );
    let connections = incoming.connections();
    let layers = tower::ServiceBuilder::new()
        .layer(RecordCalls::new(app.metrics.clone()))
        .layer(NameRefusals::new(config.limits.max_message_bytes as usize));
    let server = builder
        .layer(layers)
        .add_service(health_service)
        .add_service(reflection_v1)
        .add_service(reflection_v1alpha)
        .add_service(archivist)
        .serve_with_incoming_shutdown(incoming, stop_accepting.clone().cancelled_owned());
    tokio::pin!(server);

    // The server future must not be polled again once it has finished.
    let mut calls_done = false;
    let deadline = tokio::select! {
        result = &mut server => {
            background.cancel();
            result?;
            calls_done = true;
            Instant::now() + config.shutdown.ceiling
        }
        () = shutdown => {
            info!(
                "shutting down: no new calls; running calls and recap passes get until the shutdown ceiling ({}); open segments stay open",
                crate::text::human_duration(config.shutdown.ceiling)
            );
            let deadline = Instant::now() + config.shutdown.ceiling;
            stop_accepting.cancel();
            // Watch streams would hold the graceful shutdown open forever:
            // each is told UNAVAILABLE, and a watcher that does not read
            // (its stream stuck behind HTTP/2 flow control) has its
            // connection closed once the others have had a moment.
            service.stop_watchers();
            let grace = (config.shutdown.ceiling / 4).min(WATCH_STOP_GRACE);
            let connections = connections.clone();
            tokio::spawn(async move {
                tokio::time::sleep(grace).await;
                connections.close_watching();
            });
            // The probe stops first, so that nothing says SERVING again.
            watcher_stop.cancel();
            let _ = tokio::time::timeout(Duration::from_secs(1), watcher).await;
            set_health(&health, ServingStatus::NotServing).await;
            // No new passes from here; running ones carry on.
            background.cancel();
            deadline
        }
    };
    if tokio::time::timeout_at(deadline, reconciler_task)
        .await
        .is_err()
    {
        warn!("the reconciler did not stop in time");
    }
    // Leave room at the end for cancelled passes to release their claims,
    // so that the whole shutdown stays within its ceiling.
    let grace = (config.shutdown.ceiling / 4).min(Duration::from_secs(1));
    let tracker = summariser.tracker();
    tracker.close();
    // Open segments stay open: they are durable, and a restart must not
    // cut a conversation in two. One nobody appends to again is closed by
    // the reconciler once segment.max_idle has passed.
    let settled_in_time = {
        let calls = async {
            if !calls_done {
                let _ = (&mut server).await;
                calls_done = true;
            }
        };
        let settled = async { tokio::join!(calls, tracker.wait()) };
        tokio::time::timeout_at(deadline - grace, settled)
            .await
            .is_ok()
    };
    if !settled_in_time {
        if tracker.is_empty() {
            warn!("calls still running near the shutdown ceiling; they are cut off");
        } else {
            warn!(
                passes = tracker.len(),
                "cancelling recap passes still running at the shutdown ceiling; their segments stay PENDING for the next start"
            );
        }
        summariser.cancel_all();
        let finish = async {
            if !calls_done {
                let _ = (&mut server).await;
            }
            tracker.wait().await;
        };
        if tokio::time::timeout_at(deadline, finish).await.is_err() {
            warn!(
                "shutdown ceiling reached with work still running; claims run out and their segments are due again"
            );
        }
    }
    info!("archivist stopped");
    Ok(())
}

/// The longest the start-up check of the provider waits for its answer.
const STARTUP_PROBE_TIMEOUT: Duration = Duration::from_secs(15);

/// Sends one tiny request to the provider (one attempt) and logs what came
/// back in one line: that it answers, or what fails and what would fix it.
async fn startup_probe(
    summariser: Arc<Summariser>,
    provider: String,
    retry: RetryConfig,
    stop: CancellationToken,
) {
    let timeout = retry.attempt_timeout.min(STARTUP_PROBE_TIMEOUT);
    let retry = RetryConfig {
        max_attempts: 1,
        attempt_timeout: timeout,
        pass_ceiling: timeout,
        ..retry
    };
    let probe = summariser.probe(&retry, &stop).await;
    let took = crate::text::human_duration(probe.elapsed);
    match probe.outcome {
        ProbeOutcome::Answered(_) => {
            info!("provider check passed: {provider} answered a test request in {took}")
        }
        ProbeOutcome::Failed(failure) => warn!(
            class = failure.class.as_str(),
            http_status = failure.http_status,
            "provider check failed: {provider}: {}. Fix: {}. The server runs on, and recaps fail until this is fixed; `archivist check` tries again",
            failure
                .causes
                .last()
                .map(String::as_str)
                .unwrap_or("no cause recorded"),
            failure.hint
        ),
        ProbeOutcome::Cancelled => {}
    }
}

/// The status health reports, for the server as a whole ("") and for the
/// archivist service: load balancers ask for either.
async fn set_health(health: &HealthReporter, status: ServingStatus) {
    health.set_service_status("", status).await;
    health
        .set_service_status(
            <pb::archivist_server::ArchivistServer<GrpcService> as tonic::server::NamedService>::NAME,
            status,
        )
        .await;
}

/// Streams one connection may have open: the calls the server serves at
/// once (gRPC's customary 100 at least) and the watches one tenant may
/// hold.
fn streams_per_connection(limits: &crate::config::LimitsConfig) -> u32 {
    limits
        .max_concurrent_calls
        .max(MIN_STREAMS)
        .saturating_add(limits.max_watches_per_tenant.min(limits.max_watches))
}

/// Probes the store every `every` (a small write committed and read back)
/// and turns health NOT_SERVING while it fails or takes too long, so that
/// a load balancer moves traffic elsewhere; SERVING again once it answers.
/// Logs each change once.
async fn watch_store(
    store: Store,
    health: HealthReporter,
    every: Duration,
    stop: CancellationToken,
) {
    let timeout = every.max(MIN_PROBE_TIMEOUT);
    let mut serving = true;
    loop {
        let probed = tokio::select! {
            () = stop.cancelled() => return,
            probed = async {
                tokio::time::sleep(every).await;
                tokio::time::timeout(timeout, store.probe()).await
            } => probed,
        };
        let failure = match probed {
            Ok(Ok(())) => None,
            Ok(Err(e)) => Some(error_chain(&e)),
            Err(_) => Some(format!("the store did not answer within {timeout:?}")),
        };
        match (failure, serving) {
            (Some(why), true) => {
                warn!(error = %why, "the store cannot write or read: health is NOT_SERVING until it can");
                set_health(&health, ServingStatus::NotServing).await;
                serving = false;
            }
            (None, false) => {
                info!("the store writes and reads again: health is SERVING");
                set_health(&health, ServingStatus::Serving).await;
                serving = true;
            }
            _ => {}
        }
    }
}

/// The TLS settings, when `[tls]` sets a certificate.
fn tls_config(config: &Config) -> Result<Option<ServerTlsConfig>, ServeError> {
    let (Some(cert), Some(key)) = (&config.tls.cert, &config.tls.key) else {
        return Ok(None);
    };
    let read = |path: &std::path::Path| {
        std::fs::read(path).map_err(|source| ServeError::TlsFile {
            path: path.to_owned(),
            source,
        })
    };
    // A handshake that stalls is dropped rather than held for ever.
    let mut tls = ServerTlsConfig::new()
        .identity(Identity::from_pem(read(cert)?, read(key)?))
        .timeout(std::time::Duration::from_secs(10));
    if let Some(ca) = &config.tls.client_ca {
        tls = tls.client_ca_root(Certificate::from_pem(read(ca)?));
    }
    Ok(Some(tls))
}

/// The Prometheus endpoint: `GET /metrics` on its own listener.
struct MetricsEndpoint {
    listener: TcpListener,
    router: axum::Router,
}

async fn metrics_endpoint(
    at: std::net::SocketAddr,
    store: Store,
    metrics: Arc<Metrics>,
    breaker: Arc<Breaker>,
    embedding: Option<Arc<Embedding>>,
) -> Result<MetricsEndpoint, ServeError> {
    let listener = TcpListener::bind(at)
        .await
        .map_err(|source| ServeError::MetricsListen { at, source })?;
    let router = axum::Router::new().route(
        "/metrics",
        axum::routing::get(move || {
            let store = store.clone();
            let metrics = metrics.clone();
            let breaker = breaker.clone();
            let embedding = embedding.clone();
            async move {
                let mut backlog = store.backlog(None).await.unwrap_or_default();
                if let Some(e) = &embedding {
                    backlog.embeddings = store
                        .embedding_backlog(None, &e.generation())
                        .await
                        .unwrap_or_default();
                }
                let body = metrics.render(&backlog, breaker.state());
                ([("content-type", "text/plain; version=0.0.4")], body)
            }
        }),
    );
    Ok(MetricsEndpoint { listener, router })
}

impl MetricsEndpoint {
    async fn serve(self, stop: CancellationToken) {
        let served = axum::serve(self.listener, self.router)
            .with_graceful_shutdown(stop.cancelled_owned())
            .await;
        if let Err(e) = served {
            warn!(error = %e, "the metrics endpoint stopped");
        }
    }
}

/// Reflection over our service, health, and the google.rpc error details, so
/// that a tool such as grpcurl can decode an error's details as well as call
/// the service.
fn reflection() -> tonic_reflection::server::Builder<'static> {
    tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(pb::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_types::pb::FILE_DESCRIPTOR_SET)
}
