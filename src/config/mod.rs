//! Configuration: the TOML file, `ARCHIVIST_*` environment variables and
//! command-line flags, in that order of precedence (flags win), with every
//! key optional and checked at start-up. An unknown key or a bad value is an
//! error that names the key.

mod load;
mod validate;

pub use load::{keys_help, load};

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::model::SegmentPolicy;

/// The environment variable naming a configuration file.
pub const CONFIG_ENV: &str = "ARCHIVIST_CONFIG";
/// `ARCHIVIST_*` variables that are not configuration keys: the file's
/// name, the terminal client's server address and token, and the
/// PostgreSQL servers the tests (one with pgvector) and benchmarks use (and
/// whether the tests require them), which a server they start inherits.
const NOT_KEYS: &[&str] = &[
    CONFIG_ENV,
    "ARCHIVIST_SERVER",
    "ARCHIVIST_TOKEN",
    "ARCHIVIST_TEST_PG_URL",
    "ARCHIVIST_TEST_PGVECTOR_URL",
    "ARCHIVIST_REQUIRE_PG",
    "ARCHIVIST_BENCH_PG_URL",
];
const ENV_PREFIX: &str = "ARCHIVIST_";

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    #[serde(with = "listen_addr")]
    pub listen: SocketAddr,
    pub data_dir: PathBuf,
    pub log_format: LogFormat,
    pub segment: SegmentConfig,
    pub memory: MemoryConfig,
    pub context: ContextConfig,
    pub retention: RetentionConfig,
    pub storage: StorageConfig,
    pub search: SearchConfig,
    pub limits: LimitsConfig,
    pub provider: ProviderConfig,
    pub embedding: EmbeddingConfig,
    pub retry: RetryConfig,
    pub reconciler: ReconcilerConfig,
    pub flush: FlushConfig,
    pub shutdown: ShutdownConfig,
    pub auth: AuthConfig,
    pub tls: TlsConfig,
    pub metrics: MetricsConfig,
    pub health: HealthConfig,
    /// Set by `--insecure-open`: serve a non-loopback address with no
    /// tenants configured. Never read from a file.
    #[serde(skip)]
    pub insecure_open: bool,
    /// Set by `--allow-provider-change`: summarise even though the provider
    /// differs from the one the database last ran with. Never read from a
    /// file.
    #[serde(skip)]
    pub allow_provider_change: bool,
}

/// Bearer-token tenants. With none, the server runs open (one tenant).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AuthConfig {
    pub tenants: Vec<TenantConfig>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TenantConfig {
    pub name: String,
    /// The hex SHA-256 of the tenant's token.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token_sha256: Option<String>,
    /// The name of an environment variable holding the token.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token_env: Option<String>,
}

/// TLS for the gRPC listener; off unless `cert` and `key` are set.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TlsConfig {
    /// PEM certificate chain.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cert: Option<PathBuf>,
    /// PEM private key.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub key: Option<PathBuf>,
    /// PEM CA certificates; when set, clients must present a certificate
    /// signed by one of them (mutual TLS).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub client_ca: Option<PathBuf>,
}

/// The health service's view of the store.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct HealthConfig {
    /// How often the store is probed (a small write read back); health is
    /// NOT_SERVING while a probe fails.
    #[serde(with = "duration")]
    pub probe_interval: Duration,
}

impl Default for HealthConfig {
    fn default() -> Self {
        HealthConfig {
            probe_interval: Duration::from_secs(5),
        }
    }
}

/// The Prometheus endpoint; off unless `listen` is set.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MetricsConfig {
    #[serde(skip_serializing_if = "Option::is_none", with = "listen_addr::option")]
    pub listen: Option<SocketAddr>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    Text,
    Json,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SegmentConfig {
    pub max_entries: u32,
    pub max_tokens: u32,
    /// An OPEN segment with no append for this long is closed (by the
    /// reconciler); zero: never.
    #[serde(with = "duration")]
    pub max_idle: Duration,
    /// A gap longer than this between two entries' `occurred_at` closes the
    /// segment before the later one, so an imported history is cut where
    /// its days are; unset: `max_idle`; zero: never.
    #[serde(skip_serializing_if = "Option::is_none", with = "duration::option")]
    pub max_gap: Option<Duration>,
}

/// How long sessions are kept.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RetentionConfig {
    /// A session with no append for this long is erased (by the
    /// reconciler); zero: never.
    #[serde(with = "duration")]
    pub session_ttl: Duration,
}

/// The memory tree: roll-ups of recaps, and the context carried into a
/// recap.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MemoryConfig {
    /// Children per roll-up; 0: no roll-ups.
    pub fanout: u32,
    /// Estimated tokens of the previous summary carried into a level-1
    /// recap prompt; 0: none.
    pub carry_tokens: u32,
}

impl Default for MemoryConfig {
    fn default() -> Self {
        MemoryConfig {
            fanout: 4,
            carry_tokens: 300,
        }
    }
}

/// What GetContext returns besides what its budget decides.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ContextConfig {
    /// Estimated tokens of the newest entries a context always returns raw
    /// (the recent window), at most the call's budget; 0: a quarter of it.
    pub recent_tokens: u32,
    /// Estimated tokens a context with a query spends at most on what it
    /// recalls (Search's hits in the session's subject), at most the
    /// call's budget; 0: a quarter of it. What recall leaves unused goes
    /// to the cover.
    pub recall_tokens: u32,
}

#[derive(Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct StorageConfig {
    /// What an acknowledged write survives (SQLite; PostgreSQL follows the
    /// server's own `synchronous_commit`).
    pub durability: DurabilityConfig,
    /// Which database holds the data.
    pub backend: BackendKind,
    /// PostgreSQL: the connection URL (`postgres://user@host:5432/db`).
    /// A password here is in the file: prefer `url_env`.
    pub url: String,
    /// PostgreSQL: the NAME of an environment variable holding the URL, so
    /// that a password stays out of files (`DATABASE_URL`, say; not an
    /// `ARCHIVIST_*` one, which are settings).
    pub url_env: String,
    /// PostgreSQL: connections for the reads callers ask for that may cost
    /// (Search, GetContext, listings); more such reads at once wait for
    /// one, and are refused (RESOURCE_EXHAUSTED) after 10 s.
    pub read_connections: u32,
    /// PostgreSQL: connections for everything else but appends (which have
    /// one, two with `durability = "power"`, of their own).
    pub write_connections: u32,
}

impl Default for StorageConfig {
    fn default() -> Self {
        StorageConfig {
            durability: DurabilityConfig::default(),
            backend: BackendKind::default(),
            url: String::new(),
            url_env: String::new(),
            read_connections: 8,
            write_connections: 8,
        }
    }
}

/// The URL is never shown: it may carry a password.
impl std::fmt::Debug for StorageConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StorageConfig")
            .field("durability", &self.durability)
            .field("backend", &self.backend)
            .field(
                "url",
                &if self.url.is_empty() {
                    ""
                } else {
                    "(set, not shown)"
                },
            )
            .field("url_env", &self.url_env)
            .field("read_connections", &self.read_connections)
            .field("write_connections", &self.write_connections)
            .finish()
    }
}

impl StorageConfig {
    /// The PostgreSQL URL: `url`, or the value of the variable `url_env`
    /// names, read through `var`. The error never repeats a value.
    pub fn postgres_url(
        &self,
        var: impl Fn(&str) -> Option<String>,
    ) -> Result<String, ConfigError> {
        if !self.url.is_empty() {
            return Ok(self.url.clone());
        }
        match var(&self.url_env) {
            Some(url) if !url.trim().is_empty() => Ok(url.trim().to_owned()),
            _ => Err(ConfigError::Invalid {
                key: "storage.url_env".to_owned(),
                message: format!(
                    "names the variable {}, which is not set (or empty): set it to the PostgreSQL URL",
                    self.url_env
                ),
            }),
        }
    }
}

/// The database behind the store.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BackendKind {
    /// A file in `data_dir`: the embedded default, for one process.
    #[default]
    Sqlite,
    /// A PostgreSQL database that any number of replicas share.
    Postgres,
}

/// Search's lexical index.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SearchConfig {
    /// How texts and queries are cut into terms. A change re-indexes every
    /// text in the background.
    pub language: SearchLanguage,
    /// The most time one search's statements may take together, past
    /// which it is stopped and answered `SEARCH_TOO_COSTLY`.
    #[serde(with = "duration")]
    pub budget: Duration,
    /// SQLite: texts stored and not yet indexed (the tail, indexed just
    /// behind the appends in large batches by the indexer thread) at which
    /// the indexer indexes them all; appends wait while twice this many
    /// wait, so the tail never runs away.
    pub tail_texts: u64,
    /// SQLite: the longest the indexer lets the tail wait (it indexes it at
    /// least this often while there is one). A search has its tenant's
    /// tail indexed first in any case.
    #[serde(with = "duration")]
    pub tail_wait: Duration,
}

impl Default for SearchConfig {
    fn default() -> Self {
        SearchConfig {
            language: SearchLanguage::default(),
            budget: Duration::from_secs(2),
            // docs/benchmarks.md (issue 38): 4,000 left ten-entry appends
            // at 65 % of the unindexed rate, 20,000 at 72–84 % (8×1).
            tail_texts: 20_000,
            tail_wait: Duration::from_secs(1),
        }
    }
}

/// The lexical index's language.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SearchLanguage {
    /// Words as written, lower-cased, no stemming: no language's rules
    /// surprise another's (SQLite also folds diacritics). A query's word
    /// still finds its irregular English forms (`search::forms`), as with
    /// `English`.
    #[default]
    Simple,
    /// English stemming: "deploying" finds "deployed" (SQLite's porter,
    /// PostgreSQL's `english`).
    English,
}

impl SearchLanguage {
    /// Its name in the configuration and in the database.
    pub(crate) fn name(self) -> &'static str {
        match self {
            SearchLanguage::Simple => "simple",
            SearchLanguage::English => "english",
        }
    }

    /// The language of that name, as `name` gives it.
    pub(crate) fn from_name(name: &str) -> Option<SearchLanguage> {
        [SearchLanguage::Simple, SearchLanguage::English]
            .into_iter()
            .find(|l| l.name() == name)
    }
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DurabilityConfig {
    /// The process being killed (kill -9, a crash).
    #[default]
    Process,
    /// Power loss and operating-system crashes too: an fsync per commit.
    Power,
}

/// Bounds on what one call may carry.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LimitsConfig {
    /// Largest entry content, in bytes of UTF-8.
    pub max_content_bytes: u32,
    /// Most entries in one AppendEntries call.
    pub max_entries_per_call: u32,
    /// Largest gRPC message the server reads.
    pub max_message_bytes: u32,
    /// Calls served at once; more are refused with RESOURCE_EXHAUSTED.
    pub max_concurrent_calls: u32,
    /// Content bytes one tenant may store; appends past it are refused with
    /// RESOURCE_EXHAUSTED. 0: no cap.
    pub max_tenant_bytes: u64,
    /// Most estimated tokens one GetContext answers with: what `max_tokens`
    /// 0 means, and the most any larger value gets.
    pub max_context_tokens: u32,
    /// How long a request's body may take to arrive whole; a call takes its
    /// slot only then.
    #[serde(with = "duration")]
    pub request_timeout: Duration,
    /// Request bytes held at once by every body still arriving; past it a
    /// request is refused (RESOURCE_EXHAUSTED) rather than buffered.
    pub max_receiving_bytes: u64,
    /// Connections open at once; at the cap a new one replaces the one idle
    /// the longest, or is closed at once when none is idle.
    pub max_connections: u32,
    /// A connection with no call running this long is closed.
    #[serde(with = "duration")]
    pub idle_timeout: Duration,
    /// WatchSession streams open at once on the server; they hold no call
    /// slot, and past this a watch is refused (RESOURCE_EXHAUSTED).
    pub max_watches: u32,
    /// WatchSession streams one tenant may have open at once.
    pub max_watches_per_tenant: u32,
    /// How far ahead of the server's clock an entry's `occurred_at` may be.
    #[serde(with = "duration")]
    pub max_clock_skew: Duration,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ProviderKind {
    Extractive,
    Openai,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ProviderConfig {
    pub kind: ProviderKind,
    pub base_url: String,
    pub model: String,
    /// The NAME of the environment variable that holds the key.
    pub api_key_env: String,
    pub max_input_tokens: u32,
    pub max_output_tokens: u32,
    /// `serve` sends one tiny request at start-up (in the background) and
    /// logs whether the provider answers, and what would fix it if not.
    pub check_on_start: bool,
    /// Most bytes of a provider's response body read; a larger answer is a
    /// malformed_response and nothing of it is kept.
    pub max_response_bytes: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum EmbeddingKind {
    /// No embeddings: search is lexical only.
    None,
    /// Any OpenAI-compatible `/embeddings` endpoint.
    Openai,
}

/// The embedder: what entries and summaries are embedded with, off the
/// request path, for the semantic leg of Search.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct EmbeddingConfig {
    pub kind: EmbeddingKind,
    /// `/embeddings` is appended.
    pub base_url: String,
    pub model: String,
    /// The NAME of the environment variable that holds the key.
    pub api_key_env: String,
    /// The vectors' length, sent as `dimensions`; 0: the model's own (not
    /// sent, and learnt from the first answer).
    pub dimensions: u32,
    /// Inputs per request.
    pub batch: u32,
    /// The model name a search's query is embedded with; empty: `model`.
    /// For models with a query input type (e5's "query" against
    /// "passage"): it must make vectors of the same space as `model`'s.
    pub query_model: String,
    /// After a change of model or dimensions, the most texts a second
    /// (on average, a reconciler tick's worth at a time) made owed again
    /// for the new generation; fresh texts go first.
    pub reembed_rate: u32,
    /// Search queries embedded at once; a search over it waits a second
    /// at most for its turn, then AUTO searches by words and SEMANTIC is
    /// RESOURCE_EXHAUSTED.
    pub max_concurrent_queries: u32,
}

impl EmbeddingConfig {
    pub fn enabled(&self) -> bool {
        self.kind != EmbeddingKind::None
    }
}

impl Default for EmbeddingConfig {
    fn default() -> Self {
        EmbeddingConfig {
            kind: EmbeddingKind::None,
            base_url: "https://api.openai.com/v1".to_owned(),
            model: "text-embedding-3-small".to_owned(),
            api_key_env: "OPENAI_API_KEY".to_owned(),
            dimensions: 0,
            batch: 32,
            query_model: String::new(),
            reembed_rate: 100,
            max_concurrent_queries: 8,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RetryConfig {
    pub max_attempts: u32,
    #[serde(with = "duration")]
    pub initial_backoff: Duration,
    #[serde(with = "duration")]
    pub max_backoff: Duration,
    pub multiplier: f64,
    pub jitter: f64,
    #[serde(with = "duration")]
    pub attempt_timeout: Duration,
    #[serde(with = "duration")]
    pub pass_ceiling: Duration,
    #[serde(with = "duration")]
    pub max_blind_wait: Duration,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ReconcilerConfig {
    #[serde(with = "duration")]
    pub interval: Duration,
    pub concurrency: u32,
    #[serde(with = "duration")]
    pub max_spacing: Duration,
    #[serde(with = "duration")]
    pub quota_delay: Duration,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct FlushConfig {
    #[serde(with = "duration")]
    pub ceiling: Duration,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ShutdownConfig {
    #[serde(with = "duration")]
    pub ceiling: Duration,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            listen: SocketAddr::from(([127, 0, 0, 1], 50051)),
            data_dir: PathBuf::from("archivist-data"),
            log_format: LogFormat::Text,
            segment: SegmentConfig::default(),
            memory: MemoryConfig::default(),
            context: ContextConfig::default(),
            retention: RetentionConfig::default(),
            storage: StorageConfig::default(),
            search: SearchConfig::default(),
            limits: LimitsConfig::default(),
            provider: ProviderConfig::default(),
            embedding: EmbeddingConfig::default(),
            retry: RetryConfig::default(),
            reconciler: ReconcilerConfig::default(),
            flush: FlushConfig::default(),
            shutdown: ShutdownConfig::default(),
            auth: AuthConfig::default(),
            tls: TlsConfig::default(),
            metrics: MetricsConfig::default(),
            health: HealthConfig::default(),
            insecure_open: false,
            allow_provider_change: false,
        }
    }
}

impl Default for SegmentConfig {
    fn default() -> Self {
        SegmentConfig {
            max_entries: 50,
            max_tokens: 4000,
            max_idle: Duration::from_secs(30 * 60),
            max_gap: None,
        }
    }
}

/// `limits.max_content_bytes` unless configured: the longest entry text.
pub(crate) const DEFAULT_MAX_CONTENT_BYTES: u32 = 64 * 1024;
/// `limits.max_message_bytes` unless configured: the largest request.
pub(crate) const DEFAULT_MAX_MESSAGE_BYTES: u32 = 4 * 1024 * 1024;

impl Default for LimitsConfig {
    fn default() -> Self {
        LimitsConfig {
            max_content_bytes: DEFAULT_MAX_CONTENT_BYTES,
            max_entries_per_call: 1000,
            max_message_bytes: DEFAULT_MAX_MESSAGE_BYTES,
            max_concurrent_calls: 256,
            max_tenant_bytes: 1024 * 1024 * 1024,
            max_context_tokens: 100_000,
            request_timeout: Duration::from_secs(10),
            max_receiving_bytes: 64 * 1024 * 1024,
            max_connections: 256,
            idle_timeout: Duration::from_secs(300),
            max_watches: 1024,
            max_watches_per_tenant: 256,
            max_clock_skew: Duration::from_secs(5 * 60),
        }
    }
}

impl Default for ProviderConfig {
    fn default() -> Self {
        ProviderConfig {
            kind: ProviderKind::Extractive,
            base_url: "http://127.0.0.1:11434/v1".to_owned(),
            model: "llama3.2".to_owned(),
            api_key_env: "OPENAI_API_KEY".to_owned(),
            max_input_tokens: 8000,
            max_output_tokens: 512,
            check_on_start: true,
            max_response_bytes: 1024 * 1024,
        }
    }
}

impl Default for RetryConfig {
    fn default() -> Self {
        RetryConfig {
            max_attempts: 3,
            initial_backoff: Duration::from_millis(500),
            max_backoff: Duration::from_secs(8),
            multiplier: 2.0,
            jitter: 0.5,
            attempt_timeout: Duration::from_secs(20),
            pass_ceiling: Duration::from_secs(30),
            max_blind_wait: Duration::from_secs(30),
        }
    }
}

impl Default for ReconcilerConfig {
    fn default() -> Self {
        ReconcilerConfig {
            interval: Duration::from_secs(5),
            concurrency: 4,
            max_spacing: Duration::from_secs(3600),
            quota_delay: Duration::from_secs(3600),
        }
    }
}

impl Default for FlushConfig {
    fn default() -> Self {
        FlushConfig {
            ceiling: Duration::from_secs(10),
        }
    }
}

impl Default for ShutdownConfig {
    fn default() -> Self {
        ShutdownConfig {
            ceiling: Duration::from_secs(15),
        }
    }
}

impl Config {
    pub fn segment_policy(&self) -> SegmentPolicy {
        let gap = self.segment.max_gap.unwrap_or(self.segment.max_idle);
        SegmentPolicy {
            max_entries: self.segment.max_entries,
            max_tokens: self.segment.max_tokens,
            max_gap: (!gap.is_zero()).then_some(gap),
        }
    }
}

/// Whether `name` can be an environment variable's name and does not look
/// like a pasted key: letters, digits and `_`, not starting with a digit,
/// and not a long run mixing lowercase letters and digits as keys do
/// (variable names are conventionally capitals).
fn is_variable_name(name: &str) -> bool {
    let mut chars = name.chars();
    let Some(first) = chars.next() else {
        return false;
    };
    if !(first.is_ascii_alphabetic() || first == '_')
        || !chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
    {
        return false;
    }
    let lower = name.chars().filter(char::is_ascii_lowercase).count();
    let digits = name.chars().filter(char::is_ascii_digit).count();
    !(name.len() >= 24 && lower >= 4 && digits >= 4)
}

/// The hex SHA-256 of a token: what `auth.tenants[].token_sha256` takes.
pub fn token_sha256(token: &str) -> String {
    use sha2::{Digest, Sha256};
    crate::text::hex(&Sha256::digest(token.as_bytes()))
}

/// Flags given on the command line; they override everything else.
#[derive(Clone, Debug, Default)]
pub struct Overrides {
    pub config_file: Option<PathBuf>,
    pub listen: Option<SocketAddr>,
    pub data_dir: Option<PathBuf>,
    pub insecure_open: bool,
    pub allow_provider_change: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read configuration file {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("configuration file {path} is not valid")]
    Parse {
        path: PathBuf,
        #[source]
        source: Box<toml::de::Error>,
    },
    #[error(
        "{var} does not name a configuration key (keys are set as ARCHIVIST_<SECTION>_<KEY>, for example ARCHIVIST_RETRY_MAX_ATTEMPTS)"
    )]
    UnknownEnv { var: String },
    #[error("{var} (key {key}): {message}")]
    Env {
        var: String,
        key: String,
        message: String,
    },
    #[error("{key}: {message}")]
    Invalid { key: String, message: String },
}

/// An address to listen on: `IP:PORT`, or `HOST:PORT` with a name (such as
/// `localhost:50051`) resolved now, an IPv4 address preferred.
pub fn parse_listen(text: &str) -> Result<SocketAddr, String> {
    let text = text.trim();
    if let Ok(addr) = text.parse::<SocketAddr>() {
        return Ok(addr);
    }
    let bad = || {
        format!(
            "{text:?} is not an address to listen on: write it as IP:PORT or HOST:PORT, such as 127.0.0.1:50051, [::1]:50051 or localhost:50051"
        )
    };
    if !text.contains(':') {
        return Err(bad());
    }
    match std::net::ToSocketAddrs::to_socket_addrs(text) {
        Ok(addrs) => {
            let addrs: Vec<SocketAddr> = addrs.collect();
            addrs
                .iter()
                .find(|a| a.is_ipv4())
                .or(addrs.first())
                .copied()
                .ok_or_else(bad)
        }
        Err(e) => Err(format!("{} ({e})", bad())),
    }
}

/// Listen addresses, read with `parse_listen`.
mod listen_addr {
    use std::net::SocketAddr;

    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(addr: &SocketAddr, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(addr)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<SocketAddr, D::Error> {
        let text = String::deserialize(d)?;
        super::parse_listen(&text).map_err(serde::de::Error::custom)
    }

    pub mod option {
        use std::net::SocketAddr;

        use serde::{Deserialize, Deserializer, Serializer};

        pub fn serialize<S: Serializer>(
            addr: &Option<SocketAddr>,
            s: S,
        ) -> Result<S::Ok, S::Error> {
            match addr {
                Some(addr) => s.collect_str(addr),
                None => s.serialize_none(),
            }
        }

        pub fn deserialize<'de, D: Deserializer<'de>>(
            d: D,
        ) -> Result<Option<SocketAddr>, D::Error> {
            let text = String::deserialize(d)?;
            super::super::parse_listen(&text)
                .map(Some)
                .map_err(serde::de::Error::custom)
        }
    }
}

/// Durations written as `500ms`, `30s`, `1h` (humantime's format).
mod duration {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&humantime::format_duration(*d).to_string())
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        let text = String::deserialize(d)?;
        humantime::parse_duration(&text).map_err(|e| {
            serde::de::Error::custom(format!(
                "{text:?} is not a duration ({e}); write it like \"500ms\", \"30s\" or \"1h\""
            ))
        })
    }

    pub mod option {
        use std::time::Duration;

        use serde::{Deserializer, Serializer};

        pub fn serialize<S: Serializer>(d: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
            match d {
                Some(d) => super::serialize(d, s),
                None => s.serialize_none(),
            }
        }

        pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
            super::deserialize(d).map(Some)
        }
    }
}
