//! Command-line entry points other than `serve`, and what they share with
//! it: configuration loading and signals.

pub mod backfill;
pub mod session;

use crate::config::{self, Config, Overrides};
use crate::failure::cause_chain;

/// Loads the configuration (file, `ARCHIVIST_*` variables, flags); the
/// error is the text to print.
pub fn load_config(overrides: &Overrides) -> Result<Config, String> {
    // Variables that are not UTF-8 cannot be ours; skip rather than panic.
    let env = std::env::vars_os()
        .filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?)));
    config::load(overrides, env).map_err(|e| cause_chain(&e).join(": "))
}

/// Resolves on SIGINT or SIGTERM.
async fn signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = tokio::signal::ctrl_c() => {}
                    _ = term.recv() => {}
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}

/// Resolves on the first signal; a second one ends the process at once
/// (every acknowledged write is already committed).
pub async fn shutdown_signal() {
    signal().await;
    tokio::spawn(exit_on_signal());
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
