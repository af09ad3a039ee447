//! Command-line entry points other than `serve` (`backfill`, `check`,
//! `migrate`, the terminal client), and what they share with it:
//! configuration loading, signals, the listen address and exit codes.
//!
//! The terminal client: `session.rs` its commands, `reads.rs` and
//! `waits.rs` the longer ones, `search.rs` `archivist search`, `import.rs`
//! `archivist import` (a history from JSON Lines),
//! `terminal.rs` what every command shares (flags, connection, exit
//! status), `output.rs` what they print. The commands use `terminal.rs`
//! and `output.rs`, never each other's callers.

pub mod backfill;
pub mod check;
pub mod import;
pub mod migrate;
mod output;
mod reads;
pub mod search;
pub mod session;
mod terminal;
mod waits;

pub use terminal::ConnectFlags;
pub(crate) use terminal::parse_duration;

use crate::config::{self, Config, Overrides};
use crate::failure::cause_chain;
use crate::model::Millis;

/// Exit code of a usage error (bad flags or arguments), as sysexits'
/// EX_USAGE: never one a command gives to an outcome, such as backfill's 2
/// for "work left".
pub const EXIT_USAGE: u8 = 64;

/// Loads the configuration (file, `ARCHIVIST_*` variables, flags); the
/// error is the text to print.
pub fn load_config(overrides: &Overrides) -> Result<Config, String> {
    // Variables that are not UTF-8 cannot be ours; skip rather than panic.
    let env = std::env::vars_os()
        .filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?)));
    config::load(overrides, env).map_err(|e| cause_chain(&e).join(": "))
}

/// The configuration of a command that serves nothing (backfill, check,
/// migrate): from its `--config` file, `--data-dir` and the environment;
/// where a server would listen, and its tenants, are not its concern.
fn load_offline_config(
    config_file: Option<std::path::PathBuf>,
    data_dir: Option<std::path::PathBuf>,
) -> Result<Config, String> {
    load_config(&Overrides {
        config_file,
        data_dir,
        insecure_open: true,
        ..Overrides::default()
    })
}

/// A `--listen` address: `IP:PORT`, or `HOST:PORT` for a name such as
/// localhost.
pub fn parse_listen(text: &str) -> Result<std::net::SocketAddr, String> {
    config::parse_listen(text)
}

/// A time given on the command line (backfill's close times, search's
/// window): an RFC 3339 time, or a duration ago ("90m", "2h", "3days").
pub(crate) fn parse_time(text: &str) -> Result<Millis, String> {
    if let Ok(at) = humantime::parse_rfc3339_weak(text) {
        let ms = at
            .duration_since(std::time::UNIX_EPOCH)
            .map_err(|_| format!("{text:?} is before 1970"))?
            .as_millis();
        return Ok(Millis(i64::try_from(ms).unwrap_or(i64::MAX)));
    }
    match humantime::parse_duration(text) {
        Ok(ago) => {
            let ms = i64::try_from(ago.as_millis()).unwrap_or(i64::MAX);
            Ok(Millis(Millis::now().0.saturating_sub(ms)))
        }
        Err(_) => Err(format!(
            "{text:?} is neither a time (2026-11-29T10:00:00Z) nor a duration ago (2h)"
        )),
    }
}

/// Resolves on SIGINT or SIGTERM. The handlers are installed by this
/// call, not at the first poll: a signal between the two would take the
/// default action (the process killed, its wind-down skipped).
#[cfg(unix)]
fn signal() -> impl Future<Output = ()> + Send {
    use tokio::signal::unix::{SignalKind, signal};
    let term = signal(SignalKind::terminate());
    let int = signal(SignalKind::interrupt());
    async move {
        match (term, int) {
            (Ok(mut term), Ok(mut int)) => {
                tokio::select! {
                    _ = term.recv() => {}
                    _ = int.recv() => {}
                }
            }
            (Ok(mut one), Err(_)) | (Err(_), Ok(mut one)) => {
                one.recv().await;
            }
            (Err(_), Err(_)) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
}

/// Resolves on Ctrl-C.
#[cfg(not(unix))]
fn signal() -> impl Future<Output = ()> + Send {
    async {
        let _ = tokio::signal::ctrl_c().await;
    }
}

/// Resolves on the first signal; a second one ends the process at once
/// (every acknowledged write is already committed). The handlers are
/// installed when this is called.
pub fn shutdown_signal() -> impl Future<Output = ()> + Send {
    let first = signal();
    async move {
        first.await;
        tokio::spawn(exit_on_signal());
    }
}

/// Runs `first` on the first signal, and ends the process at once on a
/// second; for commands that stop cleanly on their own once told to.
pub(crate) async fn on_signals(first: impl FnOnce() + Send + 'static) {
    signal().await;
    first();
    exit_on_signal().await;
}

async fn exit_on_signal() {
    signal().await;
    eprintln!("second signal: exiting at once");
    std::process::exit(130);
}
