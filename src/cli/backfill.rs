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

use crate::app::{App, BuildError};
use crate::backfill::{self, EmbeddingReport, Options, Progress, Report};
use crate::config::BackendKind;
use crate::failure::cause_chain;
use crate::model::SessionName;
use crate::store::{OpenMode, StoreError};

/// Exit code when segments are left unsummarised.
pub(crate) const EXIT_LEFT: u8 = 2;

#[derive(Debug, Args)]
pub struct BackfillArgs {
    /// A TOML configuration file (the server's) [env: ARCHIVIST_CONFIG].
    #[arg(long, env = crate::config::CONFIG_ENV, hide_env = true)]
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
    /// List what would be done; change nothing (the database is opened
    /// read-only).
    #[arg(long)]
    pub dry_run: bool,
    /// Print the report as JSON on standard output.
    #[arg(long)]
    pub json: bool,
    /// Summarise even though the provider configured here differs from the
    /// one the database was last served with.
    #[arg(long)]
    pub allow_provider_change: bool,
    /// Drain what is owed an embedding (entries and summaries without a
    /// vector) instead of recaps; needs `[embedding]` configured.
    #[arg(long, conflicts_with_all = ["session", "closed_before", "closed_after", "include_parked", "dry_run", "allow_provider_change"])]
    pub embeddings: bool,
    /// With --embeddings: embed even though the model or dimensions
    /// configured here differ from those the database's vectors are of,
    /// making this the active generation (its old vectors are dropped once
    /// every text has a new one). Run it with the server stopped.
    #[arg(long, requires = "embeddings")]
    pub allow_generation_change: bool,
}

/// Why a run did not get to its report.
enum Failed {
    /// The command line asks for something impossible: exit 64.
    Usage(String),
    /// Anything else: exit 1.
    Error(String),
}

/// Runs the command: 0 when nothing is left unsummarised, 2 when something
/// is, 1 on an error, 64 on a usage error.
pub async fn run(args: BackfillArgs) -> ExitCode {
    if args.embeddings {
        return match drain_embeddings(args).await {
            Ok(report) if report.left() == 0 => ExitCode::SUCCESS,
            Ok(_) => ExitCode::from(EXIT_LEFT),
            Err(failed) => failed.exit(),
        };
    }
    match drain(args).await {
        Ok(report) if report.left() == 0 => ExitCode::SUCCESS,
        Ok(_) => ExitCode::from(EXIT_LEFT),
        Err(failed) => failed.exit(),
    }
}

impl Failed {
    /// Says why and gives the exit code.
    fn exit(self) -> ExitCode {
        match self {
            Failed::Usage(e) => {
                eprintln!("error: {e}\n\nFor more information, try 'archivist backfill --help'.");
                ExitCode::from(super::EXIT_USAGE)
            }
            Failed::Error(e) => {
                eprintln!("error: {e}");
                ExitCode::FAILURE
            }
        }
    }
}

/// `--embeddings`: drains what is owed an embedding, with progress, and
/// prints the report.
async fn drain_embeddings(args: BackfillArgs) -> Result<EmbeddingReport, Failed> {
    let config = super::load_offline_config(args.config.clone(), args.data_dir.clone())
        .map_err(Failed::Error)?;
    if !config.embedding.enabled() {
        return Err(Failed::Usage(
            "--embeddings needs `[embedding]` configured (embedding.kind = \"openai\")".to_owned(),
        ));
    }
    let concurrency = args
        .concurrency
        .unwrap_or(config.reconciler.concurrency as usize);
    if concurrency == 0 {
        return Err(Failed::Usage("--concurrency must be at least 1".to_owned()));
    }
    let api_key = std::env::var(&config.provider.api_key_env).ok();
    let app = App::open(&config, api_key, "backfill", OpenMode::Existing)
        .await
        .map_err(|e| Failed::Error(cause_chain(&e).join(": ")))?;
    let Some(embedding) = app.embedding.clone() else {
        return Err(Failed::Error("the embedder was not built".to_owned()));
    };
    // Another model than the database's would make itself the active
    // generation and drop the vectors a running server searches.
    let ours = embedding.generation();
    let active = app
        .store
        .embedding_generation()
        .await
        .map_err(|e| Failed::Error(cause_chain(&e).join(": ")))?;
    if let Some(active) = active.filter(|a| a != ours.as_str())
        && !args.allow_generation_change
    {
        return Err(Failed::Error(format!(
            "this run embeds with {} but the database's vectors are of {active} (the model and \
             dimensions it last ran with): a backfill under another model would replace the \
             vectors a server searches. Pass the server's configuration with --config; to change \
             the model for good, start the server with the new [embedding] (it re-embeds in the \
             background), or stop it and pass --allow-generation-change",
            ours.as_str()
        )));
    }
    let cancel = CancellationToken::new();
    let on_signal = {
        let cancel = cancel.clone();
        tokio::spawn(super::on_signals(move || {
            eprintln!("stopping: running batches are cancelled and released");
            cancel.cancel();
        }))
    };
    let mut display = Display::new(false).of(Unit::Texts);
    let report =
        backfill::run_embeddings(&app, &embedding, concurrency, &cancel, |p| display.show(p)).await;
    display.finish();
    on_signal.abort();
    let report = report.map_err(|e| Failed::Error(cause_chain(&e).join(": ")))?;
    if args.json {
        let text =
            serde_json::to_string_pretty(&report).map_err(|e| Failed::Error(e.to_string()))?;
        println!("{text}");
    } else {
        print!("{}", render_embeddings(&report));
    }
    Ok(report)
}

/// The embedding report for a person.
fn render_embeddings(report: &EmbeddingReport) -> String {
    let mut out = format!(
        "generation: {}\nowed at the start: {}\nembedded by this run: {}\nwith a vector of this generation: {}\nstill pending: {}\nparked: {}\n",
        report.generation,
        report.owed,
        report.embedded,
        report.embedded_total,
        report.pending,
        report.parked
    );
    for (class, n) in &report.parked_by_class {
        out.push_str(&format!("  {class}: {n}\n"));
    }
    if let Some(failure) = &report.last_failure {
        out.push_str(&format!("last failure: {failure}\n"));
    }
    if report.interrupted {
        out.push_str("interrupted: running batches were cancelled; they stay owed\n");
    }
    if let Some(why) = &report.stopped_early {
        out.push_str(&format!("stopped early: {why}\n"));
    }
    if report.parked > 0 {
        out.push_str(super::output::PARKED_EMBEDDINGS);
        out.push('\n');
    }
    out
}

/// What a progress display counts.
#[derive(Clone, Copy)]
enum Unit {
    /// Segments, summarised.
    Segments,
    /// Texts, embedded.
    Texts,
}

impl Unit {
    fn words(self) -> (&'static str, &'static str) {
        match self {
            Unit::Segments => ("segments", "summarised"),
            Unit::Texts => ("texts", "embedded"),
        }
    }
}

async fn drain(args: BackfillArgs) -> Result<Report, Failed> {
    let usage = |flag: &'static str| move |e: String| Failed::Usage(format!("{flag}: {e}"));
    let config = super::load_offline_config(args.config.clone(), args.data_dir.clone())
        .map_err(Failed::Error)?;
    let options = Options {
        session: args
            .session
            .as_deref()
            .map(SessionName::parse)
            .transpose()
            .map_err(|e| Failed::Usage(format!("--session: {e}")))?,
        closed_before: args
            .closed_before
            .as_deref()
            .map(super::parse_time)
            .transpose()
            .map_err(usage("--closed-before"))?,
        closed_after: args
            .closed_after
            .as_deref()
            .map(super::parse_time)
            .transpose()
            .map_err(usage("--closed-after"))?,
        concurrency: args
            .concurrency
            .unwrap_or(config.reconciler.concurrency as usize),
        include_parked: args.include_parked,
        dry_run: args.dry_run,
    };
    if options.concurrency == 0 {
        return Err(Failed::Usage("--concurrency must be at least 1".to_owned()));
    }
    let api_key = std::env::var(&config.provider.api_key_env).ok();
    // A backfill never creates a database: a missing one means the wrong
    // --data-dir (or directory), and a dry run only reads.
    let mode = if args.dry_run {
        OpenMode::ReadOnly
    } else {
        OpenMode::Existing
    };
    let error = |e: BuildError| Failed::Error(cause_chain(&e).join(": "));
    let app = App::open(&config, api_key, "backfill", mode)
        .await
        .map_err(|e| match e {
            BuildError::Store(StoreError::NoDatabase { path })
                if config.storage.backend == BackendKind::Postgres =>
            {
                Failed::Error(format!(
                    "the database at {} holds no archivist tables, so there is nothing to backfill (and nothing was created): point storage.url or storage.url_env, in --config FILE or the environment, at the servers' database",
                    path.display()
                ))
            }
            BuildError::Store(StoreError::NoDatabase { path }) => Failed::Error(format!(
                "there is no database at {}, so there is nothing to backfill (and nothing was created): point --data-dir, or data_dir in --config FILE, at the server's data directory",
                path.display()
            )),
            e => error(e),
        })?;
    let changed_from = if args.dry_run {
        app.provider_change()
            .await
            .map_err(|e| error(e.into()))?
            .map(|(_, identity)| identity)
    } else {
        app.claim_provider(args.allow_provider_change)
            .await
            .map_err(error)?
    };

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
    let mut report = report.map_err(|e| Failed::Error(cause_chain(&e).join(": ")))?;
    report.provider_changed_from = changed_from;
    if args.json {
        let text =
            serde_json::to_string_pretty(&report).map_err(|e| Failed::Error(e.to_string()))?;
        println!("{text}");
    } else {
        print!("{}", render(&report));
    }
    Ok(report)
}

/// A progress bar when standard error is a terminal, a line every few
/// seconds otherwise: the first progress, then at most one every
/// `LINE_EVERY`, and the last at the end unless it said that already.
struct Display {
    unit: Unit,
    bar: Option<ProgressBar>,
    started: Instant,
    /// When the last plain line was printed, and what it said.
    last_line: Option<(Instant, Progress)>,
    last: Progress,
    quiet: bool,
}

/// The least time between two plain progress lines.
const LINE_EVERY: Duration = Duration::from_secs(5);

impl Display {
    fn new(dry_run: bool) -> Display {
        Display {
            unit: Unit::Segments,
            bar: None,
            started: Instant::now(),
            last_line: None,
            last: Progress::default(),
            quiet: dry_run,
        }
    }

    fn of(mut self, unit: Unit) -> Display {
        self.unit = unit;
        self
    }

    fn show(&mut self, p: Progress) {
        let (things, done) = self.unit.words();
        self.last = p;
        if self.quiet {
            return;
        }
        if std::io::stderr().is_terminal() {
            let bar = self.bar.get_or_insert_with(|| {
                let bar = ProgressBar::new(p.total);
                if let Ok(style) = ProgressStyle::with_template(
                    &format!("{{bar:40}} {{pos}}/{{len}} {things}, {{msg}} [{{elapsed_precise}}, eta {{eta}}]"),
                ) {
                    bar.set_style(style);
                }
                bar
            });
            bar.set_length(p.total);
            bar.set_position(p.done);
            bar.set_message(format!(
                "{} {done}, {}",
                p.summarised,
                rate(p.done, self.started.elapsed())
            ));
        } else if let Some(line) = self.plain_line(p, Instant::now()) {
            eprintln!("{line}");
        }
    }

    /// The plain line to print for `p` at `now`, if one is due: the first,
    /// then one every `LINE_EVERY` at most. (An embedding drain reports
    /// progress as each batch ends, and many end with nothing done.)
    fn plain_line(&mut self, p: Progress, now: Instant) -> Option<String> {
        // Nothing to do is for the report to say.
        let due = p.total > 0
            && self
                .last_line
                .is_none_or(|(at, _)| now.duration_since(at) >= LINE_EVERY);
        if !due {
            return None;
        }
        self.last_line = Some((now, p));
        Some(self.line(p))
    }

    fn line(&self, p: Progress) -> String {
        let (things, done) = self.unit.words();
        format!(
            "backfill: {}/{} {things}, {} {done}, {}",
            p.done,
            p.total,
            p.summarised,
            rate(p.done, self.started.elapsed())
        )
    }

    fn finish(&mut self) {
        if let Some(bar) = self.bar.take() {
            bar.finish();
        } else if let Some(line) = self.last_plain_line() {
            eprintln!("{line}");
        }
    }

    /// The plain line that ends a run, unless the last one said it.
    fn last_plain_line(&self) -> Option<String> {
        let said = self.last_line.is_some_and(|(_, p)| p == self.last);
        (!self.quiet && self.last.total > 0 && !said).then(|| self.line(self.last))
    }
}

/// Segments a second (or a minute, when fewer), to a sensible precision.
fn rate(done: u64, elapsed: Duration) -> String {
    let secs = elapsed.as_secs_f64();
    if done == 0 || secs <= 0.0 {
        return "0/s".to_owned();
    }
    let per_sec = done as f64 / secs;
    if per_sec >= 10.0 {
        format!("{per_sec:.0}/s")
    } else if per_sec >= 1.0 {
        format!("{per_sec:.1}/s")
    } else {
        format!("{:.1}/min", per_sec * 60.0)
    }
}

/// The report for a person.
pub(crate) fn render(report: &Report) -> String {
    use crate::text::count;
    let mut out = String::new();
    if let Some(provider) = &report.provider {
        out.push_str(&format!("provider: {provider}\n"));
    }
    if let Some(before) = &report.provider_changed_from {
        let upgrade = report
            .provider
            .as_ref()
            .is_some_and(|now| crate::app::is_upgrade(before, now));
        if upgrade {
            out.push_str(&format!(
                "provider changed: the database last ran with {before}; moving from the built-in extractive provider to an LLM needs no --allow-provider-change\n"
            ));
        } else if report.dry_run {
            out.push_str(&format!(
                "provider changed: the database last ran with {before}; a real run refuses \
                 unless given --allow-provider-change (or the server's --config)\n"
            ));
        } else {
            out.push_str(&format!(
                "provider changed: the database last ran with {before} (--allow-provider-change)\n"
            ));
        }
    }
    if report.dry_run {
        out.push_str(&format!(
            "dry run: a run would take {}; nothing was changed\n",
            count(report.matched, "segment", "segments")
        ));
        for s in &report.segments {
            out.push_str(&format!(
                "  segment {} of {}: {}, {}, {}{}\n",
                s.id,
                s.session,
                s.state,
                count(u64::from(s.attempts), "attempt", "attempts"),
                match s.class.as_str() {
                    "not_attempted" => "not attempted yet".to_owned(),
                    class => format!("last failure {class}"),
                },
                if s.claimed_elsewhere {
                    " (a server is running its pass now)"
                } else {
                    ""
                }
            ));
        }
    } else {
        out.push_str(&format!("summarised: {}\n", report.summarised));
    }
    out.push_str(&format!("still pending: {}\n", report.pending));
    for (class, n) in &report.pending_by_class {
        out.push_str(&format!("  {class}: {n}\n"));
    }
    if report.claimed_elsewhere > 0 {
        out.push_str(&format!(
            "  (a server is running the passes of {} of them now)\n",
            report.claimed_elsewhere
        ));
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
    if report.parked > 0 {
        out.push_str(match (report.dry_run, report.include_parked) {
            (true, false) => {
                "parked segments are not taken without --include-parked; run `archivist check` first to see whether the provider setup is fixed\n"
            }
            (true, true) => "",
            (false, false) => {
                "parked segments wait for a fixed provider setup: run `archivist check`, fix what it reports, then rerun with --include-parked (a server started with the fixed setup retries them by itself)\n"
            }
            (false, true) => {
                "parked segments failed again under this provider setup: run `archivist check` to see what is wrong, and fix it before the next run\n"
            }
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(total: u64, done: u64, summarised: u64) -> Progress {
        Progress {
            total,
            done,
            summarised,
        }
    }

    /// Off a terminal: the first progress, then one line every
    /// `LINE_EVERY` at most, and the end unless the last line said it;
    /// repeats of nothing done (an embedding drain's idle batches) print
    /// nothing more.
    #[test]
    fn plain_lines_are_the_first_one_a_while_and_the_end_once() {
        let mut display = Display::new(false).of(Unit::Texts);
        let start = Instant::now();
        assert_eq!(display.plain_line(at(0, 0, 0), start), None, "nothing owed");
        let mut printed = Vec::new();
        for (p, after) in [
            (at(5, 0, 0), 0),
            (at(5, 0, 0), 1),
            (at(5, 0, 0), 2),
            (at(5, 2, 2), 3),
            (at(5, 3, 3), 6),
            (at(5, 3, 3), 7),
        ] {
            display.last = p;
            let now = start + Duration::from_secs(after);
            printed.extend(display.plain_line(p, now));
        }
        assert_eq!(printed.len(), 2, "{printed:?}");
        assert!(
            printed[0].starts_with("backfill: 0/5 texts, 0 embedded"),
            "{printed:?}"
        );
        assert!(
            printed[1].starts_with("backfill: 3/5 texts, 3 embedded"),
            "{printed:?}"
        );
        // The last line said 3 of 5: the end says nothing more.
        assert_eq!(display.last_plain_line(), None);
        display.last = at(5, 5, 5);
        let end = display.last_plain_line().expect("the end");
        assert!(end.starts_with("backfill: 5/5 texts, 5 embedded"), "{end}");
        // A dry run prints no progress.
        let mut dry = Display::new(true);
        dry.last = at(1, 0, 0);
        assert_eq!(dry.last_plain_line(), None);
    }

    /// The report says what this run embedded, and apart, how many have a
    /// vector in all (a second run over a drained database embeds none).
    #[test]
    fn the_embedding_report_tells_this_run_from_the_total() {
        let report = EmbeddingReport {
            generation: "concepts/6".to_owned(),
            owed: 0,
            embedded: 0,
            embedded_total: 3,
            ..EmbeddingReport::default()
        };
        let text = render_embeddings(&report);
        assert!(
            text.contains("\nembedded by this run: 0\nwith a vector of this generation: 3\n"),
            "{text}"
        );
        assert!(!text.contains("\nembedded: "), "{text}");
    }
}
