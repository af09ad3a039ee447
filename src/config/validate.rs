//! Checking a configuration for what its types alone cannot say; every
//! error names the key.

use super::{BackendKind, Config, ConfigError, ENV_PREFIX, ProviderKind, is_variable_name};
use std::time::Duration;

/// The longest vector an embedder may be asked for (the largest common
/// models make 3072; a vector is read whole into memory per search).
const MAX_DIMENSIONS: u32 = 16_384;
/// The most inputs one embeddings request may carry (OpenAI's own cap).
const MAX_BATCH: u32 = 2048;

impl Config {
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
        for (key, connections) in [
            ("storage.read_connections", self.storage.read_connections),
            ("storage.write_connections", self.storage.write_connections),
        ] {
            if !(1..=1000).contains(&connections) {
                return invalid(key, "must be 1 to 1000");
            }
        }
        if self.limits.max_connections == 0 {
            return invalid("limits.max_connections", "must be at least 1");
        }
        if self.limits.max_watches == 0 {
            return invalid("limits.max_watches", "must be at least 1");
        }
        if self.limits.max_watches_per_tenant == 0 {
            return invalid("limits.max_watches_per_tenant", "must be at least 1");
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
                // First: with the variable set, the other checks would
                // blame something else.
                if let Some(message) = url_env_in_our_namespace(&self.storage.url_env) {
                    return invalid("storage.url_env", &message);
                }
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
        let e = &self.embedding;
        if e.enabled() {
            if !(e.base_url.starts_with("http://") || e.base_url.starts_with("https://")) {
                return invalid("embedding.base_url", "must be an http:// or https:// URL");
            }
            if e.model.trim().is_empty() {
                return invalid("embedding.model", "must not be empty");
            }
        }
        if !is_variable_name(&e.api_key_env) {
            return invalid(
                "embedding.api_key_env",
                "must be the NAME of an environment variable (letters, digits and _, such as OPENAI_API_KEY), not the key itself (the value given is not shown, in case it is a key)",
            );
        }
        if e.dimensions > MAX_DIMENSIONS {
            return invalid(
                "embedding.dimensions",
                &format!("must be at most {MAX_DIMENSIONS} (0: the model's own)"),
            );
        }
        if !(1..=MAX_BATCH).contains(&e.batch) {
            return invalid(
                "embedding.batch",
                &format!("must be between 1 and {MAX_BATCH}"),
            );
        }
        if e.reembed_rate == 0 {
            return invalid(
                "embedding.reembed_rate",
                "must be at least 1 (texts a second re-embedded after a change of model)",
            );
        }
        if e.max_concurrent_queries == 0 {
            return invalid(
                "embedding.max_concurrent_queries",
                "must be at least 1 (search queries embedded at once)",
            );
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
        // One batch indexes the whole tail while appends wait on it.
        if !(1..=1_000_000).contains(&self.search.tail_texts) {
            return invalid("search.tail_texts", "must be from 1 to 1000000");
        }
        if self.search.tail_wait.is_zero() {
            return invalid("search.tail_wait", "must be longer than zero");
        }
        if self.search.budget.is_zero() {
            return invalid("search.budget", "must be longer than zero");
        }
        let longest = crate::failure::LONGEST_WAIT;
        for (key, d) in [
            ("segment.max_idle", self.segment.max_idle),
            (
                "segment.max_gap",
                self.segment.max_gap.unwrap_or(Duration::ZERO),
            ),
            ("limits.max_clock_skew", self.limits.max_clock_skew),
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
            ("search.budget", self.search.budget),
            ("search.tail_wait", self.search.tail_wait),
        ] {
            if d > longest {
                return invalid(key, "must be at most 30 days");
            }
        }
        Ok(())
    }
}

/// Why `storage.url_env` may not name `name`, if it may not: `ARCHIVIST_*`
/// variables are the settings' own namespace (one that names no key is
/// refused at load, one that does sets that key), so the URL cannot live in
/// one.
pub(super) fn url_env_in_our_namespace(name: &str) -> Option<String> {
    name.starts_with(ENV_PREFIX).then(|| {
        format!(
            "names {name}, but variables starting with {ENV_PREFIX} are archivist's own settings, so the URL cannot be kept in one: put it in a variable outside that namespace, such as DATABASE_URL, and name that"
        )
    })
}
