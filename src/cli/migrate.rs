//! `archivist migrate`: brings the configured database (the SQLite file in
//! the data directory, or the PostgreSQL database `storage.url` or
//! `storage.url_env` names) to the schema this build knows, says what it
//! did in one line, and exits. For operators who migrate as a step of a
//! deploy, before the new replicas start; `serve` still migrates at
//! start-up, so running this is never required.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;

use crate::failure::cause_chain;
use crate::store::Migrated;

#[derive(Debug, Args)]
pub struct MigrateArgs {
    /// A TOML configuration file (the server's) [env: ARCHIVIST_CONFIG].
    #[arg(long, env = crate::config::CONFIG_ENV, hide_env = true)]
    pub config: Option<PathBuf>,
    /// Directory holding the SQLite database (overrides data_dir and
    /// ARCHIVIST_DATA_DIR); created, with the database, if missing.
    #[arg(long, value_name = "DIR")]
    pub data_dir: Option<PathBuf>,
}

/// Runs the migration: 0 when the database is at the current schema, 1
/// when it is not (unreachable, newer than this build, a migration that
/// failed), with the reason on standard error.
pub async fn run(args: MigrateArgs) -> ExitCode {
    match migrate(&args).await {
        Ok(done) => {
            println!("{}", report(&done));
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn migrate(args: &MigrateArgs) -> Result<Migrated, String> {
    let config = super::load_offline_config(args.config.clone(), args.data_dir.clone())?;
    crate::app::migrate(&config)
        .await
        .map_err(|e| cause_chain(&e).join(": "))
}

/// The one line that says what was done: the backend, where the database
/// is (never a password), and the schema versions before and after.
fn report(done: &Migrated) -> String {
    let what = if done.from == done.to {
        "already current, nothing to do"
    } else if done.from == 0 {
        "schema created"
    } else {
        "migrated"
    };
    format!(
        "{} database at {}: schema version {} -> {} ({what})",
        done.backend, done.location, done.from, done.to
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_report_names_backend_place_and_both_versions() {
        let done = |from| Migrated {
            backend: "postgres",
            location: "postgres://archivist@db:5432/archivist".to_owned(),
            from,
            to: 3,
        };
        assert_eq!(
            report(&done(0)),
            "postgres database at postgres://archivist@db:5432/archivist: schema version 0 -> 3 (schema created)"
        );
        assert!(report(&done(2)).ends_with("schema version 2 -> 3 (migrated)"));
        assert!(
            report(&done(3)).ends_with("schema version 3 -> 3 (already current, nothing to do)")
        );
    }
}
