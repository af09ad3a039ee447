//! The composition root: builds the shared parts (store, provider, breaker,
//! metrics, summariser) once, for `serve`, `backfill` and the benchmarks
//! alike, and hands each its `Arc`s. Nothing else constructs them.

use std::sync::Arc;

use tokio::sync::Notify;

use crate::breaker::{Breaker, MAX_PROBE_SPACING};
use crate::config::{Config, DurabilityConfig};
use crate::events::Hub;
use crate::metrics::Metrics;
use crate::model::Millis;
use crate::pass::schedule::lease;
use crate::pass::{Reports, Summariser, SummariserConfig};
use crate::provider::{Provider, ProviderSetupError};
use crate::reconciler::Reconciler;
use crate::service::Service;
use crate::store::{Durability, Store, StoreError};

#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    #[error("cannot open the store")]
    Store(#[from] StoreError),
    #[error("cannot set up the provider")]
    Provider(#[from] ProviderSetupError),
}

/// The parts of a running archivist process.
pub struct App {
    pub(crate) store: Store,
    pub(crate) breaker: Arc<Breaker>,
    pub(crate) metrics: Arc<Metrics>,
    pub(crate) summariser: Arc<Summariser>,
    /// Makes the reconciler scan sooner: closes, requeues and new roll-ups
    /// notify it.
    pub(crate) wake: Arc<Notify>,
    /// Session events for watchers.
    pub(crate) events: Arc<Hub>,
    /// Identifies the provider configuration (never the key itself).
    pub(crate) provider_fingerprint: String,
    pub(crate) config: Config,
}

impl App {
    /// Opens the store and builds every part from `config`, with the
    /// provider key given. `role` names the process in its claims
    /// (`serve`, `backfill`), so an operator can tell who holds one.
    pub async fn build(
        config: &Config,
        api_key: Option<String>,
        role: &str,
    ) -> Result<App, BuildError> {
        let durability = match config.storage.durability {
            DurabilityConfig::Process => Durability::Process,
            DurabilityConfig::Power => Durability::Power,
        };
        let store = Store::open_with(&config.data_dir, durability).await?;
        let provider = Provider::from_config(&config.provider, api_key)?;
        let provider_fingerprint = provider.fingerprint();
        let breaker = Arc::new(Breaker::new(
            config.reconciler.interval,
            config.reconciler.max_spacing.min(MAX_PROBE_SPACING),
            lease(&config.retry),
        ));
        let metrics = Arc::new(Metrics::new());
        let owner = format!("{role}-{}-{}", std::process::id(), Millis::now().0);
        let wake = Arc::new(Notify::new());
        let events = Arc::new(Hub::default());
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
            wake,
            events,
            provider_fingerprint,
            config: config.clone(),
        })
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
            self.breaker.clone(),
            self.metrics.clone(),
            self.config.reconciler.clone(),
            self.wake.clone(),
        )
    }
}
