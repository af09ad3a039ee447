//! Configuration: the TOML file, `ARCHIVIST_*` environment variables and
//! command-line flags, in that order of precedence (flags win), with every
//! key optional and checked at start-up. An unknown key or a bad value is an
//! error that names the key.

mod load;

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
/// PostgreSQL server the tests and benchmarks use (and whether the tests
/// require it), which a server they start inherits.
const NOT_KEYS: &[&str] = &[
    CONFIG_ENV,
    "ARCHIVIST_SERVER",
    "ARCHIVIST_TOKEN",
    "ARCHIVIST_TEST_PG_URL",
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
    pub retention: RetentionConfig,
    pub storage: StorageConfig,
    pub limits: LimitsConfig,
    pub provider: ProviderConfig,
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

#[derive(Clone, Default, PartialEq, Serialize, Deserialize)]
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
    /// that a password stays out of files.
    pub url_env: String,
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
            retention: RetentionConfig::default(),
            storage: StorageConfig::default(),
            limits: LimitsConfig::default(),
            provider: ProviderConfig::default(),
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
        }
    }
}

impl Default for LimitsConfig {
    fn default() -> Self {
        LimitsConfig {
            max_content_bytes: 64 * 1024,
            max_entries_per_call: 1000,
            max_message_bytes: 4 * 1024 * 1024,
            max_concurrent_calls: 256,
            max_tenant_bytes: 1024 * 1024 * 1024,
            max_context_tokens: 100_000,
            request_timeout: Duration::from_secs(10),
            max_receiving_bytes: 64 * 1024 * 1024,
            max_connections: 256,
            idle_timeout: Duration::from_secs(300),
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
        SegmentPolicy {
            max_entries: self.segment.max_entries,
            max_tokens: self.segment.max_tokens,
        }
    }

    /// Checks what types alone cannot; the error names the key.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let invalid = |key: &str, message: &str| {
            Err(ConfigError::Invalid {
                key: key.to_owned(),
                message: message.to_owned(),
            })
        };
        if self.segment.max_entries == 0 {
            return invalid("segment.max_entries", "must be at least 1");
        }
        if self.segment.max_tokens == 0 {
            return invalid("segment.max_tokens", "must be at least 1");
        }
        if self.memory.fanout == 1 {
            return invalid(
                "memory.fanout",
                "must be 0 (no roll-ups) or at least 2 (a roll-up of one node says nothing new)",
            );
        }
        if self.memory.fanout > 64 {
            return invalid("memory.fanout", "must be at most 64");
        }
        if self.limits.max_content_bytes == 0 {
            return invalid("limits.max_content_bytes", "must be at least 1");
        }
        if self.limits.max_entries_per_call == 0 {
            return invalid("limits.max_entries_per_call", "must be at least 1");
        }
        if self.limits.max_message_bytes < 1024 {
            return invalid("limits.max_message_bytes", "must be at least 1024");
        }
        if self.limits.max_concurrent_calls == 0 {
            return invalid("limits.max_concurrent_calls", "must be at least 1");
        }
        if self.limits.max_context_tokens == 0 {
            return invalid("limits.max_context_tokens", "must be at least 1");
        }
        if self.limits.max_connections == 0 {
            return invalid("limits.max_connections", "must be at least 1");
        }
        if self.limits.idle_timeout.is_zero() {
            return invalid("limits.idle_timeout", "must be longer than zero");
        }
        if self.limits.request_timeout.is_zero() {
            return invalid("limits.request_timeout", "must be longer than zero");
        }
        if self.limits.max_receiving_bytes < u64::from(self.limits.max_message_bytes) + 5 {
            return invalid(
                "limits.max_receiving_bytes",
                "must hold at least one whole message (limits.max_message_bytes and 5 bytes of framing)",
            );
        }
        let mut names = std::collections::HashSet::new();
        for (i, t) in self.auth.tenants.iter().enumerate() {
            let key = format!("auth.tenants[{i}]");
            if crate::model::SessionName::parse(&t.name).is_err() {
                return invalid(
                    &format!("{key}.name"),
                    "must be 1 to 128 characters of letters, digits and . _ : -",
                );
            }
            if !names.insert(t.name.as_str()) {
                return invalid(&format!("{key}.name"), "names a tenant already configured");
            }
            match (&t.token_sha256, &t.token_env) {
                (Some(hex), None) => {
                    if hex.len() != 64 || !hex.chars().all(|c| c.is_ascii_hexdigit()) {
                        return invalid(
                            &format!("{key}.token_sha256"),
                            "must be 64 hex digits (the SHA-256 of the token)",
                        );
                    }
                }
                (None, Some(var)) if !var.is_empty() => {}
                _ => {
                    return invalid(&key, "needs exactly one of token_sha256 and token_env");
                }
            }
        }
        match (&self.tls.cert, &self.tls.key) {
            (Some(_), Some(_)) | (None, None) => {}
            (Some(_), None) => return invalid("tls.key", "is needed with tls.cert"),
            (None, Some(_)) => return invalid("tls.cert", "is needed with tls.key"),
        }
        if self.tls.client_ca.is_some() && self.tls.cert.is_none() {
            return invalid("tls.client_ca", "needs tls.cert and tls.key");
        }
        if let Some(at) = self.metrics.listen
            && !at.ip().is_loopback()
            && !self.insecure_open
        {
            return invalid(
                "metrics.listen",
                "metrics on a non-loopback address show every tenant's totals over plain HTTP; keep it on loopback, or pass --insecure-open",
            );
        }
        if self.auth.tenants.is_empty() && !self.listen.ip().is_loopback() && !self.insecure_open {
            return invalid(
                "listen",
                "a non-loopback address with no [[auth.tenants]] would let anyone on the network read every session; configure tenants, or pass --insecure-open",
            );
        }
        match self.storage.backend {
            BackendKind::Sqlite => {
                if !self.storage.url.is_empty() || !self.storage.url_env.is_empty() {
                    return invalid(
                        "storage.backend",
                        "storage.url and storage.url_env are for backend = \"postgres\"; with \"sqlite\" the database is in data_dir",
                    );
                }
            }
            BackendKind::Postgres => {
                match (self.storage.url.is_empty(), self.storage.url_env.is_empty()) {
                    (true, true) => {
                        return invalid(
                            "storage.backend",
                            "\"postgres\" needs storage.url or storage.url_env (the NAME of a variable holding the URL)",
                        );
                    }
                    (false, false) => {
                        return invalid(
                            "storage.url",
                            "give storage.url or storage.url_env, not both",
                        );
                    }
                    (false, true) => {
                        if !(self.storage.url.starts_with("postgres://")
                            || self.storage.url.starts_with("postgresql://"))
                        {
                            // Not repeated: it may hold a password.
                            return invalid(
                                "storage.url",
                                "must be a postgres:// or postgresql:// URL (the value given is not shown)",
                            );
                        }
                    }
                    (true, false) => {
                        if !is_variable_name(&self.storage.url_env) {
                            return invalid(
                                "storage.url_env",
                                "must be the NAME of an environment variable holding the URL, not the URL itself (the value given is not shown)",
                            );
                        }
                    }
                }
            }
        }
        if self.provider.kind == ProviderKind::Openai {
            if !(self.provider.base_url.starts_with("http://")
                || self.provider.base_url.starts_with("https://"))
            {
                return invalid("provider.base_url", "must be an http:// or https:// URL");
            }
            if self.provider.model.trim().is_empty() {
                return invalid("provider.model", "must not be empty");
            }
        }
        if !is_variable_name(&self.provider.api_key_env) {
            // The value is not repeated: it may well be the key itself.
            return invalid(
                "provider.api_key_env",
                "must be the NAME of an environment variable (letters, digits and _, such as OPENAI_API_KEY), not the key itself: put the key in a variable and name that variable here (the value given is not shown, in case it is a key)",
            );
        }
        if self.provider.max_input_tokens < 64 {
            return invalid("provider.max_input_tokens", "must be at least 64");
        }
        if self.provider.max_output_tokens == 0 {
            return invalid("provider.max_output_tokens", "must be at least 1");
        }
        if self.provider.max_response_bytes < 1024 {
            return invalid("provider.max_response_bytes", "must be at least 1024");
        }
        let r = &self.retry;
        if r.max_attempts == 0 {
            return invalid("retry.max_attempts", "must be at least 1");
        }
        if !(r.multiplier.is_finite() && r.multiplier >= 1.0) {
            return invalid("retry.multiplier", "must be a number of at least 1.0");
        }
        if !(r.jitter.is_finite() && (0.0..=1.0).contains(&r.jitter)) {
            return invalid("retry.jitter", "must be between 0.0 and 1.0");
        }
        if r.initial_backoff > r.max_backoff {
            return invalid(
                "retry.initial_backoff",
                "must not be longer than retry.max_backoff",
            );
        }
        if r.attempt_timeout.is_zero() {
            return invalid("retry.attempt_timeout", "must be longer than zero");
        }
        if r.pass_ceiling.is_zero() {
            return invalid("retry.pass_ceiling", "must be longer than zero");
        }
        if self.reconciler.interval.is_zero() {
            return invalid("reconciler.interval", "must be longer than zero");
        }
        if self.reconciler.concurrency == 0 {
            return invalid("reconciler.concurrency", "must be at least 1");
        }
        if self.flush.ceiling.is_zero() {
            return invalid("flush.ceiling", "must be longer than zero");
        }
        if self.shutdown.ceiling.is_zero() {
            return invalid("shutdown.ceiling", "must be longer than zero");
        }
        if self.health.probe_interval.is_zero() {
            return invalid("health.probe_interval", "must be longer than zero");
        }
        let longest = crate::failure::LONGEST_WAIT;
        for (key, d) in [
            ("segment.max_idle", self.segment.max_idle),
            ("retry.initial_backoff", r.initial_backoff),
            ("retry.max_backoff", r.max_backoff),
            ("retry.attempt_timeout", r.attempt_timeout),
            ("retry.pass_ceiling", r.pass_ceiling),
            ("retry.max_blind_wait", r.max_blind_wait),
            ("reconciler.interval", self.reconciler.interval),
            ("reconciler.max_spacing", self.reconciler.max_spacing),
            ("reconciler.quota_delay", self.reconciler.quota_delay),
            ("flush.ceiling", self.flush.ceiling),
            ("shutdown.ceiling", self.shutdown.ceiling),
            ("limits.request_timeout", self.limits.request_timeout),
            ("limits.idle_timeout", self.limits.idle_timeout),
            ("health.probe_interval", self.health.probe_interval),
        ] {
            if d > longest {
                return invalid(key, "must be at most 30 days");
            }
        }
        Ok(())
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
}
