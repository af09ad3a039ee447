//! Layering the configuration: the TOML file, then `ARCHIVIST_*`
//! variables, then flags, each checked as it is applied so an error names
//! the key (and the variable) that brought it.

use std::path::Path;

use super::{Config, ConfigError, ENV_PREFIX, NOT_KEYS, Overrides};

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
    // The variable storage.url_env names, if it is one of ours: refused
    // with its reason before it is blamed for naming no key.
    let url_env = env
        .iter()
        .find(|(k, _)| k == "ARCHIVIST_STORAGE_URL_ENV")
        .map(|(_, v)| v.clone())
        .or_else(|| {
            table
                .get("storage")
                .and_then(|s| s.get("url_env"))
                .and_then(|v| v.as_str())
                .map(str::to_owned)
        });
    if let Some(message) = url_env
        .as_deref()
        .and_then(super::validate::url_env_in_our_namespace)
    {
        return Err(ConfigError::Invalid {
            key: "storage.url_env".to_owned(),
            message,
        });
    }
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
    config.allow_provider_change = overrides.allow_provider_change;
    config.validate()?;
    Ok(config)
}

/// Every configuration key with its default and its environment variable,
/// one a line, for `archivist serve --help`.
pub fn keys_help() -> String {
    let mut out = String::from(
        "Configuration: a TOML file (--config FILE, or ARCHIVIST_CONFIG=FILE), then environment \
         variables, then flags; each overrides the one before, and every key is optional. \
         An unknown key or a bad value stops the server, naming the key. Durations are \
         written 500ms, 30s, 1h.\n\nKey (default) and its environment variable:\n",
    );
    let rows: Vec<(String, String)> = leaves_of_defaults()
        .into_iter()
        .filter(|(_, default)| !matches!(default, toml::Value::Array(_)))
        .map(|(path, default)| {
            let shown = match &default {
                toml::Value::String(s) if s.is_empty() => "(unset)".to_owned(),
                other => other.to_string(),
            };
            (format!("{} = {shown}", path.join(".")), env_name(&path))
        })
        .collect();
    let width = rows.iter().map(|(k, _)| k.len()).max().unwrap_or(0);
    for (key, var) in rows {
        out.push_str(&format!("  {key:width$}  {var}\n"));
    }
    out.push_str(
        "  [[auth.tenants]] name, token_sha256 or token_env   (in the file only)\n\n\
         The provider's key is read from the variable provider.api_key_env names (its NAME \
         goes in the configuration, never the key). The terminal client reads \
         ARCHIVIST_SERVER and ARCHIVIST_TOKEN. Every key is described in docs/configuration.md.",
    );
    out
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
        ["segment", "max_gap"],
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

#[cfg(test)]
mod tests {
    use std::path::PathBuf;
    use std::time::Duration;

    use super::super::{DurabilityConfig, ProviderKind};
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
        assert_eq!(c.storage.durability, DurabilityConfig::Power);
        assert_eq!(c.shutdown.ceiling, Duration::from_secs(15));
    }

    #[test]
    fn the_embedding_section_parses_and_is_checked_by_key() {
        let (_f, o) = file(
            "[embedding]\nkind = \"openai\"\nbase_url = \"http://127.0.0.1:9/v1\"\nmodel = \"m\"\ndimensions = 256\nbatch = 8\n",
        );
        let c = load(&o, env(&[])).expect("embedding section loads");
        assert!(c.embedding.enabled());
        assert_eq!((c.embedding.dimensions, c.embedding.batch), (256, 8));
        assert!(!Config::default().embedding.enabled());
        assert_eq!(Config::default().embedding.batch, 32);
        for (text, key) in [
            ("[embedding]\nbatch = 0\n", "embedding.batch"),
            ("[embedding]\nreembed_rate = 0\n", "embedding.reembed_rate"),
            (
                "[embedding]\nmax_concurrent_queries = 0\n",
                "embedding.max_concurrent_queries",
            ),
            ("[embedding]\ndimensions = 100000\n", "embedding.dimensions"),
            (
                "[embedding]\nkind = \"openai\"\nbase_url = \"ftp://x\"\n",
                "embedding.base_url",
            ),
            (
                "[embedding]\napi_key_env = \"sk-123 456\"\n",
                "embedding.api_key_env",
            ),
        ] {
            let (_f, o) = file(text);
            let e = load(&o, env(&[])).expect_err(text);
            assert!(e.to_string().contains(key), "{text}: {e}");
        }
        // Embeddings on PostgreSQL are a configuration like any other: a
        // server without pgvector is refused when the store is opened.
        let (_f, o) = file(
            "[embedding]\nkind = \"openai\"\n[storage]\nbackend = \"postgres\"\nurl = \"postgres://u@h/d\"\n",
        );
        load(&o, env(&[])).expect("embeddings on PostgreSQL");
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

        for (text, key) in [
            (
                "[limits]\nmax_receiving_bytes = 1000\n",
                "limits.max_receiving_bytes",
            ),
            (
                "[limits]\nrequest_timeout = \"0s\"\n",
                "limits.request_timeout",
            ),
            ("[limits]\nmax_connections = 0\n", "limits.max_connections"),
            ("[limits]\nidle_timeout = \"0s\"\n", "limits.idle_timeout"),
            ("[limits]\nmax_watches = 0\n", "limits.max_watches"),
            (
                "[limits]\nmax_watches_per_tenant = 0\n",
                "limits.max_watches_per_tenant",
            ),
            (
                "[limits]\nmax_context_tokens = 0\n",
                "limits.max_context_tokens",
            ),
            (
                "[provider]\nmax_response_bytes = 10\n",
                "provider.max_response_bytes",
            ),
            (
                "[health]\nprobe_interval = \"0s\"\n",
                "health.probe_interval",
            ),
            (
                "[storage]\nread_connections = 0\n",
                "storage.read_connections",
            ),
            (
                "[storage]\nwrite_connections = 1001\n",
                "storage.write_connections",
            ),
            ("[search]\ntail_texts = 0\n", "search.tail_texts"),
            ("[search]\ntail_texts = 1000001\n", "search.tail_texts"),
            ("[search]\ntail_wait = \"0s\"\n", "search.tail_wait"),
        ] {
            let (_f, o) = file(text);
            let e = load(&o, env(&[])).expect_err(key);
            assert!(e.to_string().contains(key), "{e}");
        }
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
    fn a_key_in_api_key_env_is_refused_without_repeating_it() {
        for pasted in [
            "sk-proj-abcdefghijklmnop1234567890",
            "gsk_9f8e7d6c5b4a3f2e1d0c9b8a7f6e5d4c",
            "",
            "MY KEY",
        ] {
            let e = load(
                &Overrides::default(),
                env(&[("ARCHIVIST_PROVIDER_API_KEY_ENV", pasted)]),
            )
            .expect_err("refused");
            let text = crate::failure::cause_chain(&e).join(": ");
            assert!(text.contains("provider.api_key_env"), "{text}");
            if !pasted.is_empty() {
                assert!(!text.contains(pasted), "the value is repeated: {text}");
            }
        }
        for name in ["OPENAI_API_KEY", "MY_UNSET_KEY", "groq_key", "_K2"] {
            let c = load(
                &Overrides::default(),
                env(&[("ARCHIVIST_PROVIDER_API_KEY_ENV", name)]),
            )
            .expect("a variable name is fine");
            assert_eq!(c.provider.api_key_env, name);
        }
    }

    #[test]
    fn postgres_storage_needs_one_url_and_never_shows_it() {
        let secret = "postgres://app:s3cret-pw@db.internal:5432/archivist";
        let c = load(
            &Overrides::default(),
            env(&[
                ("ARCHIVIST_STORAGE_BACKEND", "postgres"),
                ("ARCHIVIST_STORAGE_URL", secret),
            ]),
        )
        .expect("a URL is enough");
        assert_eq!(c.storage.backend, super::super::BackendKind::Postgres);
        assert_eq!(c.storage.postgres_url(|_| None).expect("url"), secret);
        assert!(!format!("{c:?}").contains("s3cret"), "the URL is not shown");

        let c = load(
            &Overrides::default(),
            env(&[
                ("ARCHIVIST_STORAGE_BACKEND", "postgres"),
                ("ARCHIVIST_STORAGE_URL_ENV", "DB_URL_FOR_TEST"),
            ]),
        )
        .expect("a variable's name is enough");
        assert_eq!(
            c.storage
                .postgres_url(|v| (v == "DB_URL_FOR_TEST").then(|| secret.to_owned()))
                .expect("read from the variable"),
            secret
        );
        let unset = c.storage.postgres_url(|_| None).expect_err("unset");
        assert!(unset.to_string().contains("storage.url_env"), "{unset}");

        for (vars, key) in [
            (
                vec![("ARCHIVIST_STORAGE_BACKEND", "postgres")],
                "storage.backend",
            ),
            (
                vec![
                    ("ARCHIVIST_STORAGE_BACKEND", "postgres"),
                    ("ARCHIVIST_STORAGE_URL", secret),
                    ("ARCHIVIST_STORAGE_URL_ENV", "DB_URL"),
                ],
                "storage.url",
            ),
            (
                vec![
                    ("ARCHIVIST_STORAGE_BACKEND", "postgres"),
                    ("ARCHIVIST_STORAGE_URL_ENV", secret),
                ],
                "storage.url_env",
            ),
            (
                vec![
                    ("ARCHIVIST_STORAGE_BACKEND", "postgres"),
                    ("ARCHIVIST_STORAGE_URL", "mysql://app:s3cret-pw@db/x"),
                ],
                "storage.url",
            ),
            (vec![("ARCHIVIST_STORAGE_URL", secret)], "storage.backend"),
        ] {
            let e = load(&Overrides::default(), env(&vars)).expect_err(key);
            let text = crate::failure::cause_chain(&e).join(": ");
            assert!(text.contains(key), "{text}");
            assert!(!text.contains("s3cret"), "the value is repeated: {text}");
        }
    }

    #[test]
    fn a_url_env_in_archivists_own_namespace_is_refused_by_name() {
        // From the file as from the environment: ARCHIVIST_* variables are
        // the settings' own, and one that names no key is refused at load,
        // so the URL cannot be kept in one.
        let (_f, from_file) =
            file("[storage]\nbackend = \"postgres\"\nurl_env = \"ARCHIVIST_DATABASE_URL\"\n");
        let refusals = [
            load(&from_file, env(&[])),
            load(
                &Overrides::default(),
                env(&[
                    ("ARCHIVIST_STORAGE_BACKEND", "postgres"),
                    ("ARCHIVIST_STORAGE_URL_ENV", "ARCHIVIST_DATABASE_URL"),
                ]),
            ),
            // With the variable set (the usual case): not blamed for
            // naming no key, nor, when it is a key's, for setting it.
            load(
                &from_file,
                env(&[("ARCHIVIST_DATABASE_URL", "postgres://u:pw@db/x")]),
            ),
            load(
                &Overrides::default(),
                env(&[
                    ("ARCHIVIST_STORAGE_BACKEND", "postgres"),
                    ("ARCHIVIST_STORAGE_URL_ENV", "ARCHIVIST_DATABASE_URL"),
                    ("ARCHIVIST_DATABASE_URL", "postgres://u:pw@db/x"),
                ]),
            ),
        ];
        for refused in refusals {
            let e = refused.expect_err("refused");
            let text = crate::failure::cause_chain(&e).join(": ");
            assert!(text.contains("storage.url_env"), "{text}");
            assert!(text.contains("ARCHIVIST_DATABASE_URL"), "{text}");
            assert!(text.contains("such as DATABASE_URL"), "{text}");
            assert!(!text.contains("pw@"), "{text}");
        }
        let (_f, names_a_key) =
            file("[storage]\nbackend = \"postgres\"\nurl_env = \"ARCHIVIST_STORAGE_URL\"\n");
        let e = load(
            &names_a_key,
            env(&[("ARCHIVIST_STORAGE_URL", "postgres://u:pw@db/x")]),
        )
        .expect_err("refused");
        let text = crate::failure::cause_chain(&e).join(": ");
        assert!(text.contains("storage.url_env"), "{text}");
        assert!(text.contains("such as DATABASE_URL"), "{text}");
        // Outside the namespace, the same name is fine.
        let (_f, o) = file("[storage]\nbackend = \"postgres\"\nurl_env = \"DATABASE_URL\"\n");
        let c = load(&o, env(&[])).expect("DATABASE_URL is fine");
        assert_eq!(c.storage.url_env, "DATABASE_URL");
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

    #[test]
    fn what_ci_exports_is_not_taken_for_keys() {
        // A server a test starts inherits these; refusing one would fail
        // every such test under .ci/run.
        let url = "postgres://postgres@127.0.0.1:55432/test";
        load(
            &Overrides::default(),
            env(&[
                ("ARCHIVIST_TEST_PG_URL", url),
                ("ARCHIVIST_TEST_PGVECTOR_URL", url),
                ("ARCHIVIST_REQUIRE_PG", "1"),
                ("ARCHIVIST_BENCH_PG_URL", url),
            ]),
        )
        .expect("not keys");
    }
}
