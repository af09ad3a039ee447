//! `archivist backfill`: the terminal side of the backfill drain: flags,
//! a progress bar on a terminal (plain lines otherwise), the report as text
//! or JSON, and an exit code a script can use.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use tokio_util::sync::CancellationToken;

use crate::app::App;
use crate::backfill::{self, Options, Progress, Report};
use crate::config::Overrides;
use crate::failure::cause_chain;
use crate::model::{Millis, SessionName};

/// Exit code when segments are left unsummarised.
pub(crate) const EXIT_LEFT: u8 = 2;

#[derive(Debug, Args)]
pub struct BackfillArgs {
    /// A TOML configuration file (the server's).
    #[arg(long, env = crate::config::CONFIG_ENV)]
    pub config: Option<PathBuf>,
    /// Directory holding the database.
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
    /// Only this session's segments.
    #[arg(long)]
    pub session: Option<String>,
    /// Only segments closed before this: an RFC 3339 time, or a duration
    /// ago such as "2h".
    #[arg(long, value_name = "TIME")]
    pub closed_before: Option<String>,
    /// Only segments closed after this: an RFC 3339 time, or a duration ago.
    #[arg(long, value_name = "TIME")]
    pub closed_after: Option<String>,
    /// Passes at once (default: reconciler.concurrency).
    #[arg(long)]
    pub concurrency: Option<usize>,
    /// Also retry PARKED segments (bad key, unknown model, invalid request).
    #[arg(long)]
    pub include_parked: bool,
    /// List what would be done; change nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Print the report as JSON on standard output.
    #[arg(long)]
    pub json: bool,
}

/// Runs the command: 0 when nothing is left unsummarised, 2 when something
/// is, 1 on an error.
pub async fn run(args: BackfillArgs) -> ExitCode {
    match drain(args).await {
        Ok(report) if report.left() == 0 => ExitCode::SUCCESS,
        Ok(_) => ExitCode::from(EXIT_LEFT),
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn drain(args: BackfillArgs) -> Result<Report, String> {
    let config = super::load_config(&Overrides {
        config_file: args.config.clone(),
        listen: None,
        data_dir: args.data_dir.clone(),
        // The backfill serves nothing: where the server listens is not its
        // concern.
        insecure_open: true,
    })?;
    let options = Options {
        session: args
            .session
            .as_deref()
            .map(SessionName::parse)
            .transpose()
            .map_err(|e| format!("--session: {e}"))?,
        closed_before: args
            .closed_before
            .as_deref()
            .map(parse_time)
            .transpose()
            .map_err(|e| format!("--closed-before: {e}"))?,
        closed_after: args
            .closed_after
            .as_deref()
            .map(parse_time)
            .transpose()
            .map_err(|e| format!("--closed-after: {e}"))?,
        concurrency: args
            .concurrency
            .unwrap_or(config.reconciler.concurrency as usize),
        include_parked: args.include_parked,
        dry_run: args.dry_run,
    };
    if options.concurrency == 0 {
        return Err("--concurrency must be at least 1".to_owned());
    }
    let api_key = std::env::var(&config.provider.api_key_env).ok();
    let app = App::build(&config, api_key, "backfill")
        .await
        .map_err(|e| cause_chain(&e).join(": "))?;

    let cancel = CancellationToken::new();
    let on_signal = {
        let cancel = cancel.clone();
        tokio::spawn(super::on_signals(move || {
            eprintln!("stopping: running passes are cancelled and their segments released");
            cancel.cancel();
        }))
    };
    let mut display = Display::new(args.dry_run);
    let report = backfill::run(&app, &options, &cancel, |p| display.show(p)).await;
    display.finish();
    on_signal.abort();
    let report = report.map_err(|e| cause_chain(&e).join(": "))?;
    if args.json {
        let text = serde_json::to_string_pretty(&report).map_err(|e| e.to_string())?;
        println!("{text}");
    } else {
        print!("{}", render(&report));
    }
    Ok(report)
}

/// An RFC 3339 time, or a duration ago ("90m", "2h", "3days").
fn parse_time(text: &str) -> Result<Millis, String> {
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

/// A progress bar when standard error is a terminal, a line every few
/// seconds otherwise.
struct Display {
    bar: Option<ProgressBar>,
    last_line: Instant,
    last: Progress,
    quiet: bool,
}

impl Display {
    fn new(dry_run: bool) -> Display {
        Display {
            bar: None,
            last_line: Instant::now(),
            last: Progress::default(),
            quiet: dry_run,
        }
    }

    fn show(&mut self, p: Progress) {
        self.last = p;
        if self.quiet {
            return;
        }
        if std::io::stderr().is_terminal() {
            let bar = self.bar.get_or_insert_with(|| {
                let bar = ProgressBar::new(p.total);
                if let Ok(style) = ProgressStyle::with_template(
                    "{bar:40} {pos}/{len} segments, {per_sec}, {msg} [{elapsed_precise}, eta {eta}]",
                ) {
                    bar.set_style(style);
                }
                bar
            });
            bar.set_length(p.total);
            bar.set_position(p.done);
            bar.set_message(format!("{} summarised", p.summarised));
        } else if p.done == 0 || self.last_line.elapsed() >= Duration::from_secs(5) {
            self.last_line = Instant::now();
            eprintln!(
                "backfill: {}/{} segments, {} summarised",
                p.done, p.total, p.summarised
            );
        }
    }

    fn finish(&mut self) {
        if let Some(bar) = self.bar.take() {
            bar.finish();
        } else if !self.quiet && self.last.total > 0 {
            eprintln!(
                "backfill: {}/{} segments, {} summarised",
                self.last.done, self.last.total, self.last.summarised
            );
        }
    }
}

/// The report for a person.
pub(crate) fn render(report: &Report) -> String {
    let mut out = String::new();
    if report.dry_run {
        out.push_str(&format!(
            "dry run: {} unsummarised segment(s) match; nothing was changed\n",
            report.matched
        ));
        for s in &report.segments {
            out.push_str(&format!(
                "  segment {} of {}: {}, {} attempt(s){}\n",
                s.id,
                s.session,
                s.state,
                s.attempts,
                s.class
                    .as_deref()
                    .map(|c| format!(", last failure {c}"))
                    .unwrap_or_default()
            ));
        }
    } else {
        out.push_str(&format!("summarised: {}\n", report.summarised));
    }
    out.push_str(&format!("still pending: {}\n", report.pending));
    for (class, n) in &report.pending_by_class {
        out.push_str(&format!("  {class}: {n}\n"));
    }
    out.push_str(&format!("parked: {}\n", report.parked));
    for (class, n) in &report.parked_by_class {
        out.push_str(&format!("  {class}: {n}\n"));
    }
    if report.interrupted {
        out.push_str("interrupted: running passes were cancelled; their segments stay PENDING\n");
    }
    if let Some(why) = &report.stopped_early {
        out.push_str(&format!("stopped early: {why}\n"));
    }
    if report.parked > 0 && !report.dry_run {
        out.push_str(
            "parked segments need a fixed provider setup; then rerun with --include-parked\n",
        );
    }
    out
}
