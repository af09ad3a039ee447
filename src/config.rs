//! Configuration: the TOML file, `ARCHIVIST_*` environment variables and
//! command-line flags, in that order of precedence (flags win), with every
//! key optional and checked at start-up. An unknown key or a bad value is an
//! error that names the key.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::model::SegmentPolicy;

/// The environment variable naming a configuration file.
pub const CONFIG_ENV: &str = "ARCHIVIST_CONFIG";
/// `ARCHIVIST_*` variables that are not configuration keys: the file's
/// name, and the terminal client's server address and token.
const NOT_KEYS: &[&str] = &[CONFIG_ENV, "ARCHIVIST_SERVER", "ARCHIVIST_TOKEN"];
const ENV_PREFIX: &str = "ARCHIVIST_";

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    pub listen: SocketAddr,
    pub data_dir: PathBuf,
    pub log_format: LogFormat,
    pub segment: SegmentConfig,
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
    /// Set by `--insecure-open`: serve a non-loopback address with no
    /// tenants configured. Never read from a file.
    #[serde(skip)]
    pub insecure_open: bool,
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

/// The Prometheus endpoint; off unless `listen` is set.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MetricsConfig {
    #[serde(skip_serializing_if = "Option::is_none")]
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
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct StorageConfig {
    /// What an acknowledged write survives.
    pub durability: DurabilityConfig,
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
            insecure_open: false,
        }
    }
}

impl Default for SegmentConfig {
    fn default() -> Self {
        SegmentConfig {
            max_entries: 50,
            max_tokens: 4000,
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

    pub fn durability(&self) -> crate::store::Durability {
        match self.storage.durability {
            DurabilityConfig::Process => crate::store::Durability::Process,
            DurabilityConfig::Power => crate::store::Durability::Power,
        }
    }

    /// The database file inside the data directory.
    pub fn database_path(&self) -> PathBuf {
        self.data_dir.join("archivist.sqlite3")
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
        if self.provider.max_input_tokens < 64 {
            return invalid("provider.max_input_tokens", "must be at least 64");
        }
        if self.provider.max_output_tokens == 0 {
            return invalid("provider.max_output_tokens", "must be at least 1");
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
        // Durations feed deadlines and leases; a century would overflow them
        // and nothing sensible needs more than a month.
        let longest = Duration::from_secs(30 * 24 * 3600);
        for (key, d) in [
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
        ] {
            if d > longest {
                return invalid(key, "must be at most 30 days");
            }
        }
        Ok(())
    }
}

/// Flags given on the command line; they override everything else.
#[derive(Clone, Debug, Default)]
pub struct Overrides {
    pub config_file: Option<PathBuf>,
    pub listen: Option<SocketAddr>,
    pub data_dir: Option<PathBuf>,
    pub insecure_open: bool,
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

/// Reads the file (if any), applies `ARCHIVIST_*` variables from `env`, then
/// the flags, and validates the result.
pub fn load(
    overrides: &Overrides,
    env: impl IntoIterator<Item = (String, String)>,
) -> Result<Config, ConfigError> {
    let mut table = match &overrides.config_file {
        Some(path) => read_file(path)?,
        None => toml::Table::new(),
    };
    let leaves = leaves_of_defaults();
    let mut env: Vec<(String, String)> = env
        .into_iter()
        .filter(|(k, _)| k.starts_with(ENV_PREFIX) && !NOT_KEYS.contains(&k.as_str()))
        .collect();
    env.sort();
    for (var, raw) in env {
        let Some((path, default)) = leaves.iter().find(|(path, _)| env_name(path) == var) else {
            return Err(ConfigError::UnknownEnv { var });
        };
        let key = path.join(".");
        let value = parse_env_value(&raw, default).map_err(|message| ConfigError::Env {
            var: var.clone(),
            key: key.clone(),
            message,
        })?;
        let mut candidate = table.clone();
        set_path(&mut candidate, path, value);
        // Deserialise with just this override added, so a bad value is
        // blamed on the variable that brought it.
        if let Err(e) = candidate.clone().try_into::<Config>() {
            return Err(ConfigError::Env {
                var,
                key,
                message: e.message().to_owned(),
            });
        }
        table = candidate;
    }
    let mut config: Config =
        table
            .try_into()
            .map_err(|e: toml::de::Error| ConfigError::Invalid {
                key: "(configuration)".to_owned(),
                message: e.message().to_owned(),
            })?;
    if let Some(listen) = overrides.listen {
        config.listen = listen;
    }
    if let Some(dir) = &overrides.data_dir {
        config.data_dir = dir.clone();
    }
    config.insecure_open = overrides.insecure_open;
    config.validate()?;
    Ok(config)
}

fn read_file(path: &Path) -> Result<toml::Table, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        path: path.to_owned(),
        source,
    })?;
    let parse_error = |source: toml::de::Error| ConfigError::Parse {
        path: path.to_owned(),
        source: Box::new(source),
    };
    // Parsing straight into the typed config first gives errors that point at
    // the line and name the key.
    toml::from_str::<Config>(&text).map_err(parse_error)?;
    toml::from_str::<toml::Table>(&text).map_err(parse_error)
}

/// Every key of the configuration with its default value, as a path.
fn leaves_of_defaults() -> Vec<(Vec<String>, toml::Value)> {
    fn walk(prefix: &[String], table: &toml::Table, out: &mut Vec<(Vec<String>, toml::Value)>) {
        for (k, v) in table {
            let mut path = prefix.to_vec();
            path.push(k.clone());
            match v {
                toml::Value::Table(t) => walk(&path, t, out),
                other => out.push((path, other.clone())),
            }
        }
    }
    let mut out = Vec::new();
    // Serialising the defaults cannot fail: every field is a plain value.
    if let Ok(table) = toml::Table::try_from(Config::default()) {
        walk(&[], &table, &mut out);
    }
    // Keys with no default are not serialised; they take strings.
    for key in [
        ["tls", "cert"],
        ["tls", "key"],
        ["tls", "client_ca"],
        ["metrics", "listen"],
    ] {
        out.push((
            key.iter().map(|k| (*k).to_owned()).collect(),
            toml::Value::String(String::new()),
        ));
    }
    out
}

fn env_name(path: &[String]) -> String {
    format!("{ENV_PREFIX}{}", path.join("_").to_ascii_uppercase())
}

fn parse_env_value(raw: &str, default: &toml::Value) -> Result<toml::Value, String> {
    let raw = raw.trim();
    match default {
        toml::Value::Integer(_) => raw
            .parse::<i64>()
            .map(toml::Value::Integer)
            .map_err(|_| format!("{raw:?} is not a whole number")),
        toml::Value::Float(_) => raw
            .parse::<f64>()
            .map(toml::Value::Float)
            .map_err(|_| format!("{raw:?} is not a number")),
        toml::Value::Boolean(_) => raw
            .parse::<bool>()
            .map(toml::Value::Boolean)
            .map_err(|_| format!("{raw:?} is not true or false")),
        _ => Ok(toml::Value::String(raw.to_owned())),
    }
}

fn set_path(table: &mut toml::Table, path: &[String], value: toml::Value) {
    let Some((last, parents)) = path.split_last() else {
        return;
    };
    let mut cursor = table;
    for p in parents {
        let entry = cursor
            .entry(p.clone())
            .or_insert_with(|| toml::Value::Table(toml::Table::new()));
        if !entry.is_table() {
            *entry = toml::Value::Table(toml::Table::new());
        }
        let toml::Value::Table(t) = entry else {
            return;
        };
        cursor = t;
    }
    cursor.insert(last.clone(), value);
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

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn file(text: &str) -> (tempfile::NamedTempFile, Overrides) {
        let mut f = tempfile::NamedTempFile::new().expect("temp file");
        std::io::Write::write_all(&mut f, text.as_bytes()).expect("write");
        let o = Overrides {
            config_file: Some(f.path().to_owned()),
            ..Overrides::default()
        };
        (f, o)
    }

    #[test]
    fn defaults_are_valid_and_match_the_design() {
        let c = load(&Overrides::default(), env(&[])).expect("defaults load");
        assert_eq!(c, Config::default());
        assert_eq!(c.listen.to_string(), "127.0.0.1:50051");
        assert_eq!(c.retry.max_attempts, 3);
        assert_eq!(c.retry.initial_backoff, Duration::from_millis(500));
        assert_eq!(c.reconciler.max_spacing, Duration::from_secs(3600));
    }

    #[test]
    fn the_design_example_file_parses() {
        let (_f, o) = file(
            r#"
listen = "127.0.0.1:50051"
data_dir = "archivist-data"
log_format = "text"
[segment]
max_entries = 50
max_tokens = 4000
[storage]
durability = "power"
[provider]
kind = "openai"
base_url = "http://127.0.0.1:11434/v1"
model = "llama3.2"
api_key_env = "OPENAI_API_KEY"
max_input_tokens = 8000
max_output_tokens = 512
[retry]
max_attempts = 3
initial_backoff = "500ms"
max_backoff = "8s"
multiplier = 2.0
jitter = 0.5
attempt_timeout = "20s"
pass_ceiling = "30s"
max_blind_wait = "30s"
[reconciler]
interval = "5s"
concurrency = 4
max_spacing = "1h"
quota_delay = "1h"
[flush]
ceiling = "10s"
[shutdown]
ceiling = "15s"
"#,
        );
        let c = load(&o, env(&[])).expect("design file loads");
        assert_eq!(c.provider.kind, ProviderKind::Openai);
        assert_eq!(c.durability(), crate::store::Durability::Power);
        assert_eq!(c.shutdown.ceiling, Duration::from_secs(15));
    }

    #[test]
    fn unknown_keys_are_refused_by_name() {
        let (_f, o) = file("[retry]\nmax_atempts = 4\n");
        let e = load(&o, env(&[])).expect_err("typo refused");
        let text = crate::failure::cause_chain(&e).join(": ");
        assert!(text.contains("max_atempts"), "{text}");
    }

    #[test]
    fn bad_values_are_refused_by_name() {
        let (_f, o) = file("[retry]\npass_ceiling = \"soon\"\n");
        let e = load(&o, env(&[])).expect_err("bad duration refused");
        let text = crate::failure::cause_chain(&e).join(": ");
        assert!(text.contains("pass_ceiling"), "{text}");

        let (_f, o) = file("[retry]\njitter = 1.5\n");
        let e = load(&o, env(&[])).expect_err("jitter out of range");
        assert!(e.to_string().contains("retry.jitter"), "{e}");

        let (_f, o) = file("[flush]\nceiling = \"1000000000years\"\n");
        let e = load(&o, env(&[])).expect_err("absurd duration refused");
        assert!(e.to_string().contains("flush.ceiling"), "{e}");
    }

    #[test]
    fn environment_overrides_file_and_flags_override_environment() {
        let (_f, mut o) = file("listen = \"127.0.0.1:7000\"\n[segment]\nmax_entries = 7\n");
        let c = load(
            &o,
            env(&[
                ("ARCHIVIST_LISTEN", "127.0.0.1:7001"),
                ("ARCHIVIST_SEGMENT_MAX_ENTRIES", "9"),
                ("ARCHIVIST_PROVIDER_BASE_URL", "http://127.0.0.1:9/v1"),
                ("ARCHIVIST_RETRY_PASS_CEILING", "5s"),
                ("ARCHIVIST_CONFIG", "ignored-here"),
                ("OTHER", "x"),
            ]),
        )
        .expect("loads");
        assert_eq!(c.listen.to_string(), "127.0.0.1:7001");
        assert_eq!(c.segment.max_entries, 9);
        assert_eq!(c.provider.base_url, "http://127.0.0.1:9/v1");
        assert_eq!(c.retry.pass_ceiling, Duration::from_secs(5));

        o.listen = Some("127.0.0.1:7002".parse().expect("addr"));
        o.data_dir = Some(PathBuf::from("/tmp/elsewhere"));
        let c = load(&o, env(&[("ARCHIVIST_LISTEN", "127.0.0.1:7001")])).expect("loads");
        assert_eq!(c.listen.to_string(), "127.0.0.1:7002");
        assert_eq!(c.data_dir, PathBuf::from("/tmp/elsewhere"));
    }

    #[test]
    fn bad_environment_is_refused_by_name() {
        let e = load(
            &Overrides::default(),
            env(&[("ARCHIVIST_SEGMENT_MAX_ENTRIES", "many")]),
        )
        .expect_err("refused");
        assert!(
            e.to_string().contains("ARCHIVIST_SEGMENT_MAX_ENTRIES"),
            "{e}"
        );
        let e = load(
            &Overrides::default(),
            env(&[("ARCHIVIST_LISTEN", "nowhere")]),
        )
        .expect_err("refused");
        assert!(e.to_string().contains("listen"), "{e}");
        let e = load(&Overrides::default(), env(&[("ARCHIVIST_NOPE", "1")])).expect_err("refused");
        assert!(e.to_string().contains("ARCHIVIST_NOPE"), "{e}");
    }
}
