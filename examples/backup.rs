//! A nightly backup with fastcp as a library: an incremental copy of SRC into the existing
//! folder HOST:DST (only files whose size or modification time changed travel; mirroring is
//! one option away, `.delete(true)`), one line per event while it runs (a file started, its
//! progress, done, skipped, resumed, deleted or failed, and the summary), and a clean cancel on
//! Ctrl-C. A local DST is created if missing. With `--link-dest DIR` (last night's folder,
//! on DST's side), each night gets a folder of its own, and what DIR holds alike becomes a
//! hard link to it instead of travelling.
//!
//! ```sh
//! cargo run --release --example backup -- SRC HOST:DST
//! cargo run --release --example backup -- SRC HOST:/backups/2026-11-28 --link-dest ../2026-11-27
//! ```
//!
//! Exit status: the `fastcp` command's (`fastcp::exit`): 0 when everything was copied, 1 when
//! some files failed, 2 on a usage error, 3 when the connection failed, 4 when data failed its
//! check, 5 when sources changed while read, 130 when cancelled.

use std::process::ExitCode;
use std::sync::Arc;

use fastcp::stream::escape;
use fastcp::{CancellationToken, CopyOptions, Event, EventSink, Location, Plan, Progress};

/// One line for an event; `push`: the copy goes to a remote host, whose counts of what
/// arrived come as the peer's.
fn line(event: &Event, push: bool) -> String {
    match event {
        Event::Started { path, size } => format!("start    {} ({size} bytes)", escape(path)),
        Event::Progress { path, done, size } => {
            format!("progress {} {done}/{size}", escape(path))
        }
        Event::Done {
            path,
            bytes,
            verified,
        } => format!(
            "done     {} ({bytes} bytes{})",
            escape(path),
            if *verified { ", verified" } else { "" }
        ),
        Event::Skipped { path, reason, .. } => format!("skipped  {} ({reason:?})", escape(path)),
        Event::Deleted { path } => format!("deleted  {}", escape(path)),
        Event::Resumed { path, kept } => {
            format!("resumed  {} ({kept} bytes were there)", escape(path))
        }
        Event::Failed(f) => format!("failed   {}: {}", escape(&f.path), f.message),
        Event::Finished(r) => {
            let arrived = if push { &r.peer } else { &r.local };
            format!(
                "finished {} files, {} bytes, {} unchanged, {} failed",
                arrived.files, arrived.bytes, r.files_skipped, r.failure_count
            )
        }
        Event::Aborted { message, progress } => format!(
            "aborted  after {} files, {} bytes: {message}",
            progress.files_done.max(progress.files_sent),
            progress.bytes_done.max(progress.bytes_sent)
        ),
        other => format!("{other:?}"),
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (src, dst, link_dest) = match &args[..] {
        [src, dst] => (src, dst, None),
        [src, dst, flag, dir] if flag == "--link-dest" => (src, dst, Some(dir)),
        _ => {
            eprintln!("usage: backup SRC HOST:DST [--link-dest DIR]");
            return ExitCode::from(2);
        }
    };
    let cancel = CancellationToken::new();
    let mut options = CopyOptions::default()
        .recursive(true)
        .skip_unchanged(true)
        .cancel(cancel.clone())
        .log(fastcp::Log::new(|level, line| {
            if level == fastcp::LogLevel::Warn {
                eprintln!("warning: {line}");
            }
        }));
    if let Some(dir) = link_dest {
        options = options.link_dest(dir);
    }
    // Always into DST, whether or not it existed: a trailing '/' says so.
    let dst = Location::parse(&format!("{}/", dst.trim_end_matches('/')));
    if let Location::Local(dir) = &dst
        && let Err(e) = std::fs::create_dir_all(dir)
    {
        eprintln!("backup: cannot create {}: {e}", dir.display());
        return ExitCode::from(1);
    }
    let plan = match Plan::new(vec![Location::parse(src)], dst, options) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("backup: {e}");
            return ExitCode::from(e.exit_code());
        }
    };
    tokio::spawn({
        let cancel = cancel.clone();
        async move {
            if tokio::signal::ctrl_c().await.is_ok() {
                eprintln!("cancelling...");
                cancel.cancel();
            }
        }
    });
    // Called on the engine's threads: printing a line is quick enough.
    let push = plan.dest().remote().is_some();
    let progress = Arc::new(Progress::with_events(EventSink::new(move |e: &Event| {
        println!("{}", line(e, push))
    })));
    let ssh = fastcp::transport::SshOptions::default();
    let result = match plan.remote() {
        Some(_) => fastcp::copy_remote(&plan, &ssh, progress).await,
        None => fastcp::copy_local(&plan, progress).await,
    };
    match result {
        Ok(outcome) => {
            let r = &outcome.report;
            // What arrived: on a push, the receiver's count (`local` is what was sent).
            let arrived = outcome.arrived();
            println!(
                "done: {} files copied ({} bytes), {} unchanged, {} failed, over {}",
                arrived.files, arrived.bytes, r.files_skipped, r.failure_count, outcome.transport
            );
            for f in &r.failures {
                eprintln!("failed: {}", f.message);
            }
            ExitCode::from(fastcp::exit::for_report(r))
        }
        Err(e) => {
            eprintln!("backup: {e} ({:?}, on the {:?} side)", e.kind(), e.fault());
            ExitCode::from(e.exit_code())
        }
    }
}
