//! A nightly backup with fastcp as a library: an incremental copy of SRC into the existing
//! folder HOST:DST (only files whose size or modification time changed travel; mirroring is
//! one option away, `delete: true`), progress lines while it runs, and a clean cancel on
//! Ctrl-C. A local DST is created if missing.
//!
//! ```sh
//! cargo run --release --example backup -- SRC HOST:DST
//! ```
//!
//! Exit status: 0 when everything was copied, 1 when some files failed, 2 on a usage error,
//! 3 when the copy could not run, 130 when cancelled.

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use fastcp::{CancellationToken, CopyOptions, Location, Plan, Progress};

#[tokio::main]
async fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [src, dst] = &args[..] else {
        eprintln!("usage: backup SRC HOST:DST");
        return ExitCode::from(2);
    };
    let cancel = CancellationToken::new();
    let options = CopyOptions::default()
        .recursive(true)
        .skip_unchanged(true)
        .cancel(cancel.clone())
        .log(fastcp::Log::new(|level, line| {
            if level == fastcp::LogLevel::Warn {
                eprintln!("warning: {line}");
            }
        }));
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
    let progress = Arc::new(Progress::default());
    let ticker = tokio::spawn({
        let progress = progress.clone();
        async move {
            loop {
                tokio::time::sleep(Duration::from_secs(1)).await;
                let s = progress.snapshot();
                println!(
                    "progress: {} files sent, {} unchanged, {} of {} bytes",
                    s.files_sent,
                    s.files_skipped,
                    s.bytes_sent + s.bytes_skipped,
                    s.bytes_seen
                );
            }
        }
    });
    let ssh = fastcp::transport::SshOptions::default();
    let result = match plan.remote() {
        Some(_) => fastcp::copy_remote(&plan, &ssh, progress).await,
        None => fastcp::copy_local(&plan, progress).await,
    };
    ticker.abort();
    match result {
        Ok(outcome) => {
            let r = &outcome.report;
            println!(
                "done: {} files copied ({} bytes), {} unchanged, {} failed, over {}",
                r.local.files, r.local.bytes, r.files_skipped, r.failure_count, outcome.transport
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
