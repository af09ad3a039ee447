//! The composition root: builds the shared parts (store, provider, breaker,
//! metrics, summariser) once, for `serve`, `backfill` and the benchmarks
//! alike, and hands each its `Arc`s. Nothing else constructs them.

use std::sync::Arc;

use tokio::sync::Notify;

use crate::breaker::{Breaker, Guarded, MAX_PROBE_SPACING};
use crate::config::{
    BackendKind, Config, ConfigError, DurabilityConfig, EmbeddingKind, ProviderKind,
};
use crate::events::{Hub, WatchLimits};
use crate::metrics::Metrics;
use crate::model::{Millis, ProviderIdentity};
use crate::pass::embed::Embedding;
use crate::pass::schedule::lease;
use crate::pass::{Reports, Summariser, SummariserConfig};
use crate::provider::embed::Embedder;
use crate::provider::{Provider, ProviderSetupError};
use crate::reconciler::Reconciler;
use crate::service::Service;
use crate::store::{Connections, Durability, Migrated, OpenMode, Store, StoreError};

#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    #[error("cannot open the store")]
    Store(#[from] StoreError),
    #[error("cannot set up the provider")]
    Provider(#[from] ProviderSetupError),
    #[error("cannot find the database")]
    Storage(#[source] ConfigError),
    #[error(transparent)]
    ProviderChanged(Box<ProviderChanged>),
}

/// A run configured with another provider than the one the database last
/// ran with: its recaps would come from a different model, for good.
#[derive(Debug, thiserror::Error)]
#[error(
    "this run is configured to summarise with {configured}, but the database at {database} was last {} with {recorded}: recaps written now would come from another provider and stay that way. If the server's configuration is elsewhere, pass it with --config; if the change is intended, pass --allow-provider-change",
    if recorded_by == "serve" { "served" } else { "backfilled" }
)]
pub struct ProviderChanged {
    pub configured: ProviderIdentity,
    pub recorded: ProviderIdentity,
    /// The kind of run that recorded it: `serve` or `backfill`.
    pub recorded_by: String,
    /// The database's file, or its server and name (never a password).
    pub database: String,
}

/// The role whose provider every run is checked against: the server's.
const SERVE: &str = "serve";

/// Whether moving from `from` to `to` is an upgrade from the built-in
/// extractive provider to an LLM, the first change a newcomer makes after
/// trying the defaults: its recaps are only better, so the guard lets it
/// through with a log line. The guard is for the other moves: an LLM's
/// database recapped by extractive (a command run without the server's
/// --config), or by another LLM.
pub(crate) fn is_upgrade(from: &ProviderIdentity, to: &ProviderIdentity) -> bool {
    from.kind == crate::provider::extractive::NAME && to.kind != crate::provider::extractive::NAME
}

/// Warns, naming the variable (never a value), when an OpenAI-compatible
/// provider is configured and the variable `provider.api_key_env` names
/// holds no key: requests then go without one, which suits a local server
/// and gets every recap refused by a hosted API.
pub(crate) fn warn_if_no_key(config: &Config, api_key: Option<&str>) {
    if config.provider.kind != ProviderKind::Openai || api_key.is_some_and(|k| !k.is_empty()) {
        return;
    }
    let var = &config.provider.api_key_env;
    tracing::warn!(
        variable = %var,
        "provider.api_key_env names the variable {var}, which is not set (or empty): requests to the provider carry no key. That suits a local server (Ollama, llama.cpp); a hosted API refuses them and every recap is parked as unauthorized. Set {var}, or name the variable that holds the key"
    );
}

/// How commits wait, as `storage.durability` says.
fn durability(config: &Config) -> Durability {
    match config.storage.durability {
        DurabilityConfig::Process => Durability::Process,
        DurabilityConfig::Power => Durability::Power,
    }
}

/// The PostgreSQL URL `storage.url` or `storage.url_env` gives.
fn postgres_url(config: &Config) -> Result<String, BuildError> {
    config
        .storage
        .postgres_url(|var| std::env::var(var).ok())
        .map_err(BuildError::Storage)
}

/// Migrates the database `config` names (creating a SQLite one as needed;
/// a PostgreSQL one must exist) to the current schema, building nothing
/// else: `archivist migrate`.
pub(crate) async fn migrate(config: &Config) -> Result<Migrated, BuildError> {
    let durability = durability(config);
    Ok(match config.storage.backend {
        BackendKind::Sqlite => Store::migrate_sqlite(&config.data_dir, durability).await?,
        BackendKind::Postgres => {
            Store::migrate_postgres(&postgres_url(config)?, durability).await?
        }
    })
}

/// The parts of a running archivist process.
pub struct App {
    pub(crate) store: Store,
    pub(crate) breaker: Arc<Breaker>,
    pub(crate) metrics: Arc<Metrics>,
    pub(crate) summariser: Arc<Summariser>,
    /// The embedder's passes, when `[embedding]` is on.
    pub(crate) embedding: Option<Arc<Embedding>>,
    /// Makes the reconciler scan sooner: closes, requeues and new roll-ups
    /// notify it.
    pub(crate) wake: Arc<Notify>,
    /// Session events for watchers.
    pub(crate) events: Arc<Hub>,
    /// Identifies the provider configuration (never the key itself).
    pub(crate) provider_fingerprint: String,
    /// Which provider this run summarises with, as the database records it.
    pub(crate) provider_identity: ProviderIdentity,
    /// What names this run's process in claims and in the provider record:
    /// `serve`, `backfill`, `check`, `bench`.
    role: String,
    pub(crate) config: Config,
}

impl App {
    /// Opens (creating as needed) the store and builds every part from
    /// `config`, with the provider key given. `role` names the process in
    /// its claims (`serve`, `backfill`), so an operator can tell who holds
    /// one.
    pub async fn build(
        config: &Config,
        api_key: Option<String>,
        role: &str,
    ) -> Result<App, BuildError> {
        App::open(config, api_key, role, OpenMode::Create).await
    }

    /// As `build`, opening the database as `mode` says.
    pub(crate) async fn open(
        config: &Config,
        api_key: Option<String>,
        role: &str,
        mode: OpenMode,
    ) -> Result<App, BuildError> {
        let durability = durability(config);
        let store = match config.storage.backend {
            BackendKind::Sqlite => Store::open_as(&config.data_dir, durability, mode).await?,
            BackendKind::Postgres => {
                let connections = Connections {
                    reads: config.storage.read_connections as usize,
                    writes: config.storage.write_connections as usize,
                };
                Store::open_postgres_with(&postgres_url(config)?, mode, durability, connections)
                    .await?
            }
        };
        // Refused here, by name, rather than at the first vector stored: a
        // PostgreSQL without pgvector cannot keep what embeddings make.
        if config.embedding.enabled() {
            store.require_vectors().await?;
        }
        App::with_store(config, api_key, role, store)
    }

    /// Builds every part around `store` (which may be detached, for a
    /// probe that must not create a database).
    pub(crate) fn with_store(
        config: &Config,
        api_key: Option<String>,
        role: &str,
        store: Store,
    ) -> Result<App, BuildError> {
        let provider = Provider::from_config(&config.provider, api_key)?;
        let provider_fingerprint = provider.fingerprint();
        let provider_identity = provider.identity();
        let breaker = Arc::new(Breaker::new(
            Guarded::Recap,
            config.reconciler.interval,
            config.reconciler.max_spacing.min(MAX_PROBE_SPACING),
            lease(&config.retry),
        ));
        let metrics = Arc::new(Metrics::new());
        let owner = format!("{role}-{}-{}", std::process::id(), Millis::now().0);
        let wake = Arc::new(Notify::new());
        let events = Hub::relayed(
            &store,
            owner.clone(),
            wake.clone(),
            WatchLimits {
                max: config.limits.max_watches as usize,
                per_tenant: config.limits.max_watches_per_tenant as usize,
            },
            metrics.clone(),
        );
        let embedding = match config.embedding.kind {
            EmbeddingKind::None => None,
            EmbeddingKind::Openai => {
                let key = std::env::var(&config.embedding.api_key_env).ok();
                let embedder =
                    Embedder::new(&config.embedding, key).map_err(ProviderSetupError::Client)?;
                Some(Embedding::new(
                    store.clone(),
                    embedder,
                    config,
                    format!("{owner}-embed"),
                ))
            }
        };
        let summariser = Summariser::new(
            store.clone(),
            provider,
            Reports {
                breaker: breaker.clone(),
                metrics: metrics.clone(),
                wake: wake.clone(),
                events: events.clone(),
            },
            SummariserConfig::from(config),
            owner,
        );
        Ok(App {
            store,
            breaker,
            metrics,
            summariser,
            embedding,
            wake,
            events,
            provider_fingerprint,
            provider_identity,
            role: role.to_owned(),
            config: config.clone(),
        })
    }

    /// The provider the database last ran with, when it is not this run's:
    /// the server's record (the server is the authority), or for any other
    /// run a backfill's where no server has run yet, with the role that
    /// recorded it. None for a database that has no record (new, or from
    /// before records were kept).
    pub(crate) async fn provider_change(
        &self,
    ) -> Result<Option<(String, ProviderIdentity)>, StoreError> {
        let recorded = match self.store.provider_identity(SERVE).await? {
            Some(served) => Some((SERVE.to_owned(), served)),
            None if self.role == SERVE => None,
            None => self
                .store
                .provider_identity("backfill")
                .await?
                .map(|b| ("backfill".to_owned(), b)),
        };
        Ok(recorded.filter(|(_, identity)| *identity != self.provider_identity))
    }

    /// Refuses a run whose provider differs from the one the database last
    /// ran with, unless `allow_change` or the change is an upgrade from
    /// extractive to an LLM; then records this run's provider. Returns the
    /// provider the database had, when it changed.
    pub(crate) async fn claim_provider(
        &self,
        allow_change: bool,
    ) -> Result<Option<ProviderIdentity>, BuildError> {
        let changed = self.provider_change().await?;
        if let Some((recorded_by, recorded)) = &changed
            && !allow_change
            && !is_upgrade(recorded, &self.provider_identity)
        {
            return Err(BuildError::ProviderChanged(Box::new(ProviderChanged {
                configured: self.provider_identity.clone(),
                recorded: recorded.clone(),
                recorded_by: recorded_by.clone(),
                database: self.store.location(&self.config.data_dir),
            })));
        }
        self.store
            .record_provider_identity(&self.role, &self.provider_identity)
            .await?;
        Ok(changed.map(|(_, identity)| identity))
    }

    pub fn store(&self) -> &Store {
        &self.store
    }

    pub fn summariser(&self) -> &Arc<Summariser> {
        &self.summariser
    }

    /// What makes the reconciler scan sooner.
    pub fn wake(&self) -> Arc<Notify> {
        self.wake.clone()
    }

    /// The operations behind the RPCs, over this app's parts.
    pub(crate) fn service(&self) -> Service {
        Service::new(
            self.store.clone(),
            self.summariser.clone(),
            self.embedding.clone(),
            self.wake.clone(),
            self.events.clone(),
            &self.config,
        )
    }

    /// The background drain over this app's parts.
    pub fn reconciler(&self) -> Reconciler {
        Reconciler::new(
            self.store.clone(),
            self.summariser.clone(),
            self.embedding.clone(),
            Reports {
                breaker: self.breaker.clone(),
                metrics: self.metrics.clone(),
                wake: self.wake.clone(),
                events: self.events.clone(),
            },
            &self.config,
        )
    }
}
