//! What the `fastcp` command shows on stderr while a copy runs.
//!
//! The display is built on the library's public surface, as an embedding program's would be:
//! the copy's [`Event`]s, taken by a [`Feed`], name the file in flight and report each failure
//! as it happens (and how a copy that stopped on an error had got on); the [`Progress`]
//! counters give the totals and the bytes done, read on a timer.
//!
//! On a terminal: one indicatif bar for the bytes, with the rate and the ETA, the files done
//! out of the total, and the current file's name with its control characters escaped (scp's
//! CVE-2019-6109). While the walk is still finding files the totals grow, and the bar says so
//! ("+" after the totals, no ETA). Off a terminal, `--progress` prints a plain line every few
//! seconds instead. Lines from the copy's [`fastcp::Log`] and failures go through
//! [`Output::line`] so that they do not tear the bar.

use std::collections::HashSet;
use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use fastcp::stream::{Failure, MAX_FAILURES, Snapshot, escape};
use fastcp::{Event, EventSink, Outcome, Progress};
use indicatif::{HumanBytes, HumanDuration, ProgressBar, ProgressDrawTarget, ProgressStyle};

/// Which counters measure the work: the receiver's on a local copy and a pull, the sender's
/// on a push (the remote side writes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Both ends are here.
    Local,
    /// This side sends.
    Push,
    /// This side receives.
    Pull,
}

/// How progress is shown.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Style {
    /// Nothing.
    Off,
    /// An indicatif bar on a terminal.
    Bar,
    /// A plain line on stderr every [`LINE_INTERVAL`].
    Lines,
}

/// How often `--progress` prints a line off a terminal.
pub const LINE_INTERVAL: Duration = Duration::from_secs(2);

/// How often the bar reads the counters.
const BAR_TICK: Duration = Duration::from_millis(100);

/// Where stderr lines go while a progress display may be running.
#[derive(Clone, Default)]
pub struct Output {
    bar: Arc<Mutex<Option<ProgressBar>>>,
}

impl Output {
    /// Prints one line on stderr, above the bar if there is one. A stderr that cannot be
    /// written (a pipe whose reader left, as in `fastcp -v ... 2>&1 | head -1`) loses the
    /// line, and the copy goes on.
    pub fn line(&self, line: &str) {
        let print = || {
            let _ = writeln!(std::io::stderr().lock(), "{line}");
        };
        let bar = self.bar.lock().unwrap_or_else(|p| p.into_inner()).clone();
        match bar {
            Some(bar) if !bar.is_finished() => bar.suspend(print),
            _ => print(),
        }
    }
}

/// What the command learns from a copy's events.
///
/// It is called on the engine's threads, so it never waits: the name of the file in flight is
/// only updated when its lock is free, and a failure is one line on stderr.
pub struct Feed {
    output: Output,
    /// The file most recently started.
    current: Mutex<Bytes>,
    state: Mutex<FeedState>,
    /// Which counters measure the work, once the copy's plan is known.
    role: std::sync::OnceLock<Role>,
    /// In a copy between two remote hosts, the sender's host and the receiver's, which
    /// name where each failure happened.
    hosts: std::sync::OnceLock<[String; 2]>,
}

#[derive(Default)]
struct FeedState {
    /// Failures printed as they happened: the first [`MAX_FAILURES`] are remembered, so that
    /// the report's own list (which keeps as many) prints only what no event reported.
    printed: HashSet<(Bytes, String)>,
    /// How many were printed in all (a line said already counts, unprinted).
    printed_count: u64,
    /// The lines printed: a failure that reads as one already shown (the entries of a
    /// folder that could not be made, say) is not shown again.
    lines: HashSet<String>,
    /// The first [`MAX_FAILURES`], for `--json` when the copy stops on an error.
    failures: Vec<Failure>,
    /// The counters when the copy stopped on an error.
    aborted: Option<Snapshot>,
}

impl FeedState {
    /// Whether a failure's `line` is to be printed: not said already (once as many lines
    /// as are remembered have been said, every line is).
    fn first_time(&mut self, line: &str) -> bool {
        self.lines.len() >= MAX_FAILURES || self.lines.insert(line.to_owned())
    }
}

impl Feed {
    /// A feed that prints failures on `output`, and the [`Progress`] that reports to it.
    pub fn start(output: &Output) -> (Arc<Feed>, Arc<Progress>) {
        let feed = Arc::new(Feed {
            output: output.clone(),
            current: Mutex::new(Bytes::new()),
            state: Mutex::new(FeedState::default()),
            role: std::sync::OnceLock::new(),
            hosts: std::sync::OnceLock::new(),
        });
        let sink = EventSink::new({
            let feed = feed.clone();
            move |event: &Event| feed.take(event)
        });
        (feed, Arc::new(Progress::with_events(sink)))
    }

    fn take(&self, event: &Event) {
        match event {
            Event::Started { path, .. } => {
                if let Ok(mut current) = self.current.try_lock() {
                    *current = path.clone();
                }
            }
            Event::Failed(failure) => {
                let mut state = self.state();
                state.printed_count += 1;
                if state.failures.len() < MAX_FAILURES {
                    state
                        .printed
                        .insert((failure.path.clone(), failure.message.clone()));
                    state.failures.push(failure.clone());
                }
                let line = self.failure_line(failure);
                let new = state.first_time(&line);
                drop(state);
                if new {
                    self.output.line(&line);
                }
            }
            Event::Aborted { progress, .. } => self.state().aborted = Some(*progress),
            _ => {}
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, FeedState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The file most recently started, escaped for the terminal.
    fn current(&self) -> String {
        escape(&self.current.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// After the copy: prints the failures of `failures` (the report's list, `count` in all)
    /// that no event reported, and a line for those beyond any list.
    pub fn print_rest(&self, failures: &[Failure], count: u64) {
        let state = self.state();
        let mut printed = state.printed_count;
        for failure in failures {
            if !state
                .printed
                .contains(&(failure.path.clone(), failure.message.clone()))
            {
                let line = self.failure_line(failure);
                if !state.lines.contains(&line) {
                    self.output.line(&line);
                }
                printed += 1;
            }
        }
        if count > printed {
            self.output.line(&format!(
                "fastcp: ... and {} more failures",
                count - printed
            ));
        }
    }

    /// The failures reported so far (the first [`MAX_FAILURES`]), and how many in all.
    pub fn failures(&self) -> (Vec<Failure>, u64) {
        let state = self.state();
        (state.failures.clone(), state.printed_count)
    }

    /// In a copy between two remote hosts: names the sender's host and the receiver's in
    /// the failures' lines, since paths on both may read alike.
    pub fn set_hosts(&self, sender: String, receiver: String) {
        let _ = self.hosts.set([sender, receiver]);
    }

    /// A failure as the user reads it (see [`failure_line`]), after the host where it
    /// happened in a copy between two remote hosts.
    fn failure_line(&self, failure: &Failure) -> String {
        let host = self
            .hosts
            .get()
            .map(|[sender, receiver]| match failure.side {
                fastcp::stream::Side::Receiver => receiver,
                _ => sender,
            });
        failure_line(failure, host.map(String::as_str))
    }

    /// Says which counters measure the work.
    pub fn set_role(&self, role: Role) {
        let _ = self.role.set(role);
    }

    /// The counters when the copy stopped on an error, if it did, and which of them measure
    /// the work.
    pub fn aborted(&self) -> Option<(Snapshot, Role)> {
        Some((self.state().aborted?, *self.role.get()?))
    }
}

/// A failure as the user reads it. The message names the file already, escaped where it
/// was made; it may come from the peer, so control characters are escaped (once: not the
/// backslashes of the names' own escapes). `host`, when given, comes first.
fn failure_line(failure: &Failure, host: Option<&str>) -> String {
    let mut line = String::from("fastcp: ");
    if let Some(host) = host {
        line.push_str(&escape(host.as_bytes()));
        line.push_str(": ");
    }
    for c in failure.message.chars() {
        if c.is_control() {
            line.push_str(&escape(c.encode_utf8(&mut [0; 4]).as_bytes()));
        } else {
            line.push(c);
        }
    }
    line
}

/// The counters that measure the work, by role.
#[derive(Debug, Clone, Copy)]
struct Counts {
    bytes: u64,
    files: u64,
    /// The totals known so far: the walk's, or what is done when nobody counts a walk here.
    total_bytes: u64,
    total_files: u64,
    /// The totals are final.
    complete: bool,
    /// The totals are counted here: by the walk (local copy, push), or, in a pull, from the
    /// server's `Totals` frame once its walk is complete. Until then a pull shows what is done
    /// and no total.
    known: bool,
}

fn counts(s: &Snapshot, role: Role) -> Counts {
    let (bytes, files) = match role {
        Role::Local | Role::Pull => (s.bytes_done, s.files_done),
        Role::Push => (s.bytes_sent, s.files_sent),
    };
    // Files the quick check skipped, and blocks kept from partial files, are done too: the
    // bar reaches its total.
    let (bytes, files) = (
        bytes + s.bytes_skipped + s.bytes_resumed,
        files + s.files_skipped,
    );
    Counts {
        bytes,
        files,
        total_bytes: s.bytes_seen.max(bytes),
        total_files: s.files_seen.max(files),
        complete: s.walk_complete,
        known: role != Role::Pull || s.files_seen > 0 || s.walk_complete,
    }
}

/// A running progress display; [`Display::finish`] ends it.
pub struct Display {
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<()>>,
    bar: Option<ProgressBar>,
    style: Style,
    output: Output,
}

impl Display {
    /// Starts showing `progress` in `style`.
    pub fn start(
        progress: Arc<Progress>,
        feed: Arc<Feed>,
        role: Role,
        style: Style,
        output: &Output,
    ) -> Display {
        let (stop, mut stopped) = tokio::sync::oneshot::channel();
        let mut bar = None;
        let task = match style {
            Style::Off => None,
            Style::Bar => {
                let b = ProgressBar::with_draw_target(Some(0), ProgressDrawTarget::stderr());
                b.set_style(walking_style());
                bar = Some(b.clone());
                let output = output.clone();
                Some(tokio::spawn(async move {
                    let mut tick = tokio::time::interval(BAR_TICK);
                    let mut begun = false;
                    loop {
                        tokio::select! {
                            _ = tick.tick() => {
                                // Not over a login's questions: the bar shows once the copy
                                // is under way, and messages go around it from then on.
                                if !begun && copy_begun(&progress.snapshot(), role) {
                                    begun = true;
                                    *output.bar.lock().unwrap_or_else(|p| p.into_inner()) =
                                        Some(b.clone());
                                }
                                if begun {
                                    draw(&b, &progress, &feed, role);
                                }
                            }
                            _ = &mut stopped => break,
                        }
                    }
                }))
            }
            Style::Lines => {
                let output = output.clone();
                Some(tokio::spawn(async move {
                    let started = Instant::now();
                    let mut tick = tokio::time::interval(LINE_INTERVAL);
                    tick.tick().await;
                    let mut last = (Instant::now(), 0u64);
                    loop {
                        tokio::select! {
                            _ = tick.tick() => {
                                let c = counts(&progress.snapshot(), role);
                                let now = Instant::now();
                                let secs = now.duration_since(last.0).as_secs_f64();
                                let rate = c.bytes.saturating_sub(last.1) as f64 / secs.max(1e-3);
                                last = (now, c.bytes);
                                output.line(&plain_line(&c, rate, started.elapsed()));
                            }
                            _ = &mut stopped => break,
                        }
                    }
                }))
            }
        };
        Display {
            stop: Some(stop),
            task,
            bar,
            style,
            output: output.clone(),
        }
    }

    /// Stops the display. After a successful copy the bar is drawn full, at 100%, and
    /// `--progress` prints a last line.
    pub async fn finish(mut self, progress: &Progress, role: Role, outcome: Option<&Outcome>) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
        let c = counts(&progress.snapshot(), role);
        match (self.style, outcome) {
            (Style::Bar, Some(outcome)) => {
                let bar = self.bar.take().expect("a bar");
                // The report's totals are final even where nobody counted a walk here.
                let total = c.bytes.max(outcome.report.local.bytes);
                bar.set_style(done_style());
                if outcome.report.is_complete() {
                    bar.set_length(total);
                } else {
                    // Some files failed: the bar stops short of what the walk found.
                    bar.set_length(c.total_bytes.max(total));
                }
                bar.set_position(total);
                bar.set_prefix(format!("{} files", outcome.report.local.files));
                let secs = outcome.elapsed.as_secs_f64().max(1e-3);
                bar.finish_with_message(format!(
                    "in {}, {}/s",
                    HumanDuration(outcome.elapsed),
                    HumanBytes((total as f64 / secs) as u64)
                ));
            }
            (Style::Bar, None) => {
                if let Some(bar) = self.bar.take() {
                    bar.abandon();
                }
            }
            (Style::Lines, Some(outcome)) => {
                let secs = outcome.elapsed.as_secs_f64().max(1e-3);
                self.output.line(&format!(
                    "fastcp: 100% {} in {} files, {:.1}s ({}/s)",
                    HumanBytes(outcome.report.local.bytes),
                    outcome.report.local.files,
                    secs,
                    HumanBytes((outcome.report.local.bytes as f64 / secs) as u64),
                ));
            }
            _ => {}
        }
        *self.output.bar.lock().unwrap_or_else(|p| p.into_inner()) = None;
    }
}

fn template(t: &str) -> ProgressStyle {
    ProgressStyle::with_template(t)
        .expect("a valid template")
        .progress_chars("=> ")
}

/// While the walk runs: the totals so far, marked with "+", and no ETA.
fn walking_style() -> ProgressStyle {
    template(
        "{percent:>3}% [{bar:20}] {bytes}/{total_bytes}+ {binary_bytes_per_sec} {prefix}+ {wide_msg}",
    )
}

/// When nobody counts the totals here.
fn open_ended_style() -> ProgressStyle {
    template("{spinner} {bytes} {binary_bytes_per_sec} {elapsed} {prefix} {wide_msg}")
}

/// Once the totals are known.
fn counted_style() -> ProgressStyle {
    template(
        "{percent:>3}% [{bar:20}] {bytes}/{total_bytes} {binary_bytes_per_sec} ETA {eta} {prefix} {wide_msg}",
    )
}

fn done_style() -> ProgressStyle {
    template("{percent:>3}% [{bar:20}] {bytes} {prefix} {wide_msg}")
}

/// Whether a copy is under way, past its login (whose password or host key questions a bar
/// would draw over): a local copy at once; else once file data is sent or a file done or
/// skipped, or (on a pull) announced by the sender. Not bytes on the wire: a session's first
/// bytes may go out before its login is done.
fn copy_begun(s: &Snapshot, role: Role) -> bool {
    role == Role::Local
        || s.bytes_sent > 0
        || s.files_sent > 0
        || s.files_done > 0
        || s.files_skipped > 0
        || s.deleted > 0
        || (role == Role::Pull && s.files_seen > 0)
}

fn draw(bar: &ProgressBar, progress: &Progress, feed: &Feed, role: Role) {
    let c = counts(&progress.snapshot(), role);
    // Nothing to measure against yet (the walk has found nothing so far), or nobody counts.
    if !c.known || (c.total_bytes == 0 && !c.complete) {
        bar.set_style(open_ended_style());
        bar.set_position(c.bytes);
        bar.set_prefix(format!("{} files", c.files));
        bar.set_message(feed.current());
        return;
    }
    if c.complete {
        bar.set_style(counted_style());
    } else {
        bar.set_style(walking_style());
    }
    bar.set_length(c.total_bytes);
    bar.set_position(c.bytes);
    bar.set_prefix(format!("{}/{} files", c.files, c.total_files));
    bar.set_message(feed.current());
}

/// One `--progress` line.
fn plain_line(c: &Counts, rate: f64, elapsed: Duration) -> String {
    let rate_text = format!("{}/s", HumanBytes(rate as u64));
    if !c.known {
        return format!(
            "fastcp: {} so far, {rate_text}, {} files, {:.0}s",
            HumanBytes(c.bytes),
            c.files,
            elapsed.as_secs_f64(),
        );
    }
    if c.complete && c.total_bytes > 0 {
        let pct = c.bytes as f64 * 100.0 / c.total_bytes as f64;
        let eta = if rate > 0.0 {
            HumanDuration(Duration::from_secs_f64(
                c.total_bytes.saturating_sub(c.bytes) as f64 / rate,
            ))
            .to_string()
        } else {
            "unknown".into()
        };
        format!(
            "fastcp: {pct:.0}% {} of {}, {rate_text}, ETA {eta}, {}/{} files",
            HumanBytes(c.bytes),
            HumanBytes(c.total_bytes),
            c.files,
            c.total_files,
        )
    } else {
        format!(
            "fastcp: {} of {}+ so far, {rate_text}, {}/{}+ files, {:.0}s",
            HumanBytes(c.bytes),
            HumanBytes(c.total_bytes),
            c.files,
            c.total_files,
            elapsed.as_secs_f64(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_lines() {
        let c = Counts {
            bytes: 512 << 20,
            files: 3,
            total_bytes: 1 << 30,
            total_files: 10,
            complete: true,
            known: true,
        };
        let line = plain_line(&c, (256 << 20) as f64, Duration::from_secs(2));
        assert_eq!(
            line,
            "fastcp: 50% 512.00 MiB of 1.00 GiB, 256.00 MiB/s, ETA 2 seconds, 3/10 files"
        );
        let walking = Counts {
            complete: false,
            ..c
        };
        let line = plain_line(&walking, 0.0, Duration::from_secs(2));
        assert!(line.contains("1.00 GiB+ so far"), "{line}");
    }

    /// Entries that fail for one reason, worded alike (the entries of a folder that could
    /// not be made, all naming it), are said once; past the lines remembered, each is said.
    #[test]
    fn a_failure_said_alike_is_said_once() {
        let mut state = FeedState::default();
        assert!(state.first_time("fastcp: d: a file is in the way"));
        assert!(!state.first_time("fastcp: d: a file is in the way"));
        assert!(state.first_time("fastcp: e: a file is in the way"));
        for i in 0..MAX_FAILURES {
            state.first_time(&format!("line {i}"));
        }
        assert!(state.first_time("fastcp: d: a file is in the way"));
    }
}
