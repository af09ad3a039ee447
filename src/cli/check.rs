//! `archivist check`: sends one tiny recap request through a real pass with
//! the configuration given (the server's), and prints what came back as a
//! person needs it: the failure class, the cause, and the likely fix. Also
//! says whether the key variable is set and whether the database was last
//! served with the same provider. Creates nothing: a database is only read,
//! and only if it is there.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use crate::app::{App, BuildError};
use crate::config::ProviderKind;
use crate::failure::cause_chain;
use crate::model::ProviderIdentity;
use crate::pass::ProbeOutcome;
use crate::store::{OpenMode, Store, StoreError};
use crate::text::{count, human_duration};

#[derive(Debug, Args)]
pub struct CheckArgs {
    /// A TOML configuration file (the server's) [env: ARCHIVIST_CONFIG].
    #[arg(long, env = crate::config::CONFIG_ENV, hide_env = true)]
    pub config: Option<PathBuf>,
    /// Directory holding the database, to compare its provider record with
    /// this configuration (read only; nothing is created).
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
    /// Print the result as JSON on standard output.
    #[arg(long)]
    pub json: bool,
}

/// What the database says of the provider, next to this configuration.
enum Database {
    /// None at the data directory.
    Missing(PathBuf),
    /// It is there but could not be read (for example, an older schema).
    Unreadable(String),
    /// Last run with this same provider (or has no record yet).
    Same,
    /// Last run with another provider: serve and backfill would refuse.
    Changed(ProviderIdentity),
}

/// Runs the check: 0 when the provider answered, 1 when it did not (or the
/// configuration is bad).
pub async fn run(args: CheckArgs) -> ExitCode {
    match check(&args).await {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn check(args: &CheckArgs) -> Result<bool, String> {
    let config = super::load_offline_config(args.config.clone(), args.data_dir.clone())?;
    let api_key = std::env::var(&config.provider.api_key_env)
        .ok()
        .filter(|k| !k.is_empty());
    let key_set = api_key.is_some();
    let error = |e: BuildError| cause_chain(&e).join(": ");
    let (app, database) =
        match App::open(&config, api_key.clone(), "check", OpenMode::ReadOnly).await {
            Ok(app) => {
                let database = match app.provider_change().await {
                    Ok(Some((_, before))) => Database::Changed(before),
                    Ok(None) => Database::Same,
                    Err(e) => Database::Unreadable(cause_chain(&e).join(": ")),
                };
                (app, database)
            }
            Err(BuildError::Store(e)) => {
                let database = match e {
                    StoreError::NoDatabase { path } => Database::Missing(path),
                    other => Database::Unreadable(cause_chain(&other).join(": ")),
                };
                let app =
                    App::with_store(&config, api_key, "check", Store::detached()).map_err(error)?;
                (app, database)
            }
            Err(e) => return Err(error(e)),
        };

    let provider = app.provider_identity.clone();
    let retry = config.retry.clone();
    if !args.json {
        println!("provider: {provider}");
        if config.provider.kind == ProviderKind::Openai {
            let var = &config.provider.api_key_env;
            if key_set {
                println!("key: from {var} (set)");
            } else {
                println!(
                    "key: {var} is not set, so requests carry no key (fine for a local server; a hosted API refuses them)"
                );
            }
        }
        match &database {
            Database::Missing(path) => println!("database: none at {}", path.display()),
            Database::Unreadable(why) => println!("database: cannot be read: {why}"),
            Database::Same => println!("database: last ran with this provider (or has no record)"),
            Database::Changed(before) => println!(
                "database: last ran with {before}; serve and backfill refuse this configuration unless given --allow-provider-change"
            ),
        }
        eprintln!(
            "sending a test request through a recap pass (at most {}, {})…",
            count(u64::from(retry.max_attempts), "attempt", "attempts"),
            human_duration(retry.pass_ceiling)
        );
    }
    let probe = app
        .summariser
        .probe(&retry, &CancellationToken::new())
        .await;
    let took = human_duration(probe.elapsed);
    let attempts = count(u64::from(probe.attempts), "attempt", "attempts");
    let (ok, result) = match probe.outcome {
        ProbeOutcome::Answered(recap) => {
            if !args.json {
                println!(
                    "result: ok: the provider answered in {took} ({attempts}) with model {}",
                    recap.model
                );
            }
            (
                true,
                json!({
                    "ok": true,
                    "class": "ok",
                    "model": recap.model,
                    "attempts": probe.attempts,
                    "elapsed_seconds": probe.elapsed.as_secs_f64(),
                }),
            )
        }
        ProbeOutcome::Failed(failure) => {
            let status = failure
                .http_status
                .map(|s| format!(" (HTTP {s})"))
                .unwrap_or_default();
            if !args.json {
                println!(
                    "result: {}{status} after {attempts} in {took}",
                    failure.class.as_str()
                );
                // The first cause restates the result line.
                if let Some(rest) = failure.causes.get(1..).filter(|r| !r.is_empty()) {
                    println!("cause: {}", rest.join(": "));
                }
                println!("fix: {}", failure.hint);
            }
            (
                false,
                json!({
                    "ok": false,
                    "class": failure.class.as_str(),
                    "http_status": failure.http_status,
                    "attempts": probe.attempts,
                    "elapsed_seconds": probe.elapsed.as_secs_f64(),
                    "causes": failure.causes,
                    "fix": failure.hint,
                }),
            )
        }
        ProbeOutcome::Cancelled => (false, json!({ "ok": false, "class": "cancelled" })),
    };
    if args.json {
        let database = match &database {
            Database::Missing(path) => json!({ "state": "missing", "path": path }),
            Database::Unreadable(why) => json!({ "state": "unreadable", "error": why }),
            Database::Same => json!({ "state": "same_provider" }),
            Database::Changed(before) => {
                json!({ "state": "other_provider", "last_provider": before })
            }
        };
        let key = match config.provider.kind {
            ProviderKind::Openai => {
                json!({ "variable": config.provider.api_key_env, "set": key_set })
            }
            ProviderKind::Extractive => Value::Null,
        };
        let mut out = json!({
            "provider": provider,
            "key": key,
            "database": database,
        });
        if let (Some(out), Some(result)) = (out.as_object_mut(), result.as_object()) {
            out.extend(result.clone());
        }
        match serde_json::to_string_pretty(&out) {
            Ok(text) => println!("{text}"),
            Err(e) => return Err(e.to_string()),
        }
    }
    Ok(ok)
}
