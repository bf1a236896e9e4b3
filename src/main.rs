//! The `fastcp` command: scp's habits, fastcp's engine.

use fastcp::exit;
use std::io::Write;
use std::process::ExitCode;

mod cli;
mod progress;

/// See the `jemalloc` feature in Cargo.toml: buffers stay mapped between uses.
#[cfg(feature = "jemalloc")]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// How long a copy may take to stop after SIGINT, SIGTERM or SIGHUP before it is dropped.
const CANCEL_GRACE: std::time::Duration = std::time::Duration::from_secs(3);

/// How long a copy that failed waits for a signal that may have failed it (see `main`).
const SIGNAL_GRACE: std::time::Duration = std::time::Duration::from_millis(250);

fn main() -> ExitCode {
    // This binary is `fastcp server` too: self-deploy may upload it.
    fastcp::deploy::this_binary_serves();
    // clap exits with 2 on a usage error, 0 for --help and --version; with --json, a usage
    // error also prints its JSON object.
    // `-h` alone is the help, as with rsync; beside operands it is rsync's --human-readable.
    if std::env::args_os().skip(1).eq(["-h"]) {
        let _ = cli::command().print_help();
        return ExitCode::SUCCESS;
    }
    let args = match cli::parse().map_err(cli::with_alternative) {
        Ok(args) => args,
        Err(e) => {
            use clap::error::ErrorKind as K;
            // Asked for as an option, not named as an operand (`-- --json`): the arguments
            // parsed again, past their errors.
            let wants_json = cli::command()
                .ignore_errors(true)
                .try_get_matches()
                .is_ok_and(|m| m.get_flag("json"));
            if wants_json && !matches!(e.kind(), K::DisplayHelp | K::DisplayVersion) {
                let rendered = e.render().to_string();
                let first = rendered.lines().next().unwrap_or_default();
                let _ = cli::print_usage_json(first.trim_start_matches("error: "));
            }
            // scp has no commands: a file named like one (`man`, `doctor`) is taken for the
            // command. Say how to copy it.
            if !matches!(e.kind(), K::DisplayHelp | K::DisplayVersion)
                && let Some(first) = std::env::args_os().nth(1)
                && let Some(name) = first.to_str()
                && cli::command().find_subcommand(name).is_some()
                && std::path::Path::new(&first).exists()
            {
                let _ = e.print();
                eprintln!(
                    "fastcp: `{name}` is a command; to copy the file of that name, write ./{name}"
                );
                return ExitCode::from(e.exit_code() as u8);
            }
            e.exit()
        }
    };
    // Before any thread starts: then growing the table costs nothing (see its docs).
    fastcp::stream::reserve_fds();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("fastcp: cannot start the async runtime: {e}");
            return ExitCode::from(exit::PARTIAL);
        }
    };
    let cancel = fastcp::CancellationToken::new();
    let copying = args.command.is_none();
    let serving = matches!(args.command, Some(cli::Command::Server(_)));
    let verbose = args.verbose > 0;
    let kept = if args.resume {
        "files over 4 MiB that were under way keep their partial files for --resume"
    } else {
        "nothing partial was kept under a final name"
    };
    let outcome = runtime.block_on(async {
        let run = cli::run(args, cancel.clone());
        let signalled = interrupted();
        tokio::pin!(run, signalled);
        let (signal, ended) = tokio::select! {
            biased;
            signal = &mut signalled => (signal, false),
            r = &mut run => match r {
                // A copy that failed as a signal came was interrupted: a terminal's Ctrl-C
                // or a service manager's SIGTERM reaches the whole process group, and the
                // ssh it killed may fail the copy before this process sees its own.
                Err(e) if copying => {
                    match tokio::time::timeout(SIGNAL_GRACE, &mut signalled).await {
                        Ok(signal) => (signal, true),
                        Err(_) => return Err(e),
                    }
                }
                r => return r,
            },
        };
        if copying && !ended {
            // A copy stops through its token, so it ends as any cancelled copy does: its
            // last event is `Aborted` (and --json prints how far it got), its temp files are
            // gone. A second signal, or a copy that does not stop in time, drops it.
            cancel.cancel();
            tokio::select! {
                _ = tokio::time::timeout(CANCEL_GRACE, &mut run) => {}
                _ = interrupted() => {}
            }
        }
        // Otherwise the command's future is dropped here: its temp files are removed, and
        // the writer threads finish before the runtime goes.
        // A server's words are shown by its client, as the server's.
        let said = match serving {
            true => format!("fastcp server: interrupted by {signal}"),
            false => format!("fastcp: interrupted by {signal}; {kept}"),
        };
        let _ = writeln!(std::io::stderr().lock(), "{said}");
        Ok(exit::INTERRUPTED)
    });
    // Blocking threads still cleaning up get a moment; none may keep the process alive.
    runtime.shutdown_timeout(std::time::Duration::from_secs(5));
    match outcome {
        Ok(code) => ExitCode::from(code),
        Err(err) => {
            let code = cli::exit_code_of(&err);
            if !is_broken_pipe(&err) {
                let mut stderr = std::io::stderr().lock();
                let _ = writeln!(stderr, "fastcp: {}", cli::error_text(&err));
                let hint = err
                    .downcast_ref::<fastcp::Error>()
                    .and_then(|e| hint(e, verbose));
                if let Some(hint) = hint {
                    let _ = writeln!(stderr, "fastcp: {hint}");
                }
            }
            ExitCode::from(code)
        }
    }
}

/// Waits for SIGINT, SIGTERM or SIGHUP; returns its name. Without signal support, never.
async fn interrupted() -> &'static str {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut int), Ok(mut term), Ok(mut hup)) = (
        signal(SignalKind::interrupt()),
        signal(SignalKind::terminate()),
        signal(SignalKind::hangup()),
    ) else {
        return std::future::pending().await;
    };
    tokio::select! {
        _ = int.recv() => "SIGINT",
        _ = term.recv() => "SIGTERM",
        _ = hup.recv() => "SIGHUP",
    }
}

/// What to do about an error, where the message alone does not say (`verbose`: the
/// command already shows its connection steps).
fn hint(err: &fastcp::Error, verbose: bool) -> Option<&'static str> {
    match err.exit_code() {
        // What the other end refused is not about this command's options.
        exit::USAGE if !said_by_the_other_end(err) => Some("see fastcp --help"),
        exit::CONNECTION
            if !verbose
                && !err.to_string().contains("--remote-path")
                && err.kind() != fastcp::ErrorKind::RemoteProgramMissing =>
        {
            Some("fastcp -v shows the connection steps")
        }
        exit::INTEGRITY => Some(
            "data was corrupted in transit or on a disk; nothing corrupt was kept. \
             Run the copy again; if it recurs, check the network, memory and disks",
        ),
        _ => None,
    }
}

/// Whether the error is what the other end reported, as "the other end stopped the copy".
fn said_by_the_other_end(err: &fastcp::Error) -> bool {
    match err {
        fastcp::Error::Host { source, .. } => said_by_the_other_end(source),
        fastcp::Error::Engine(fastcp::stream::Error::Remote { .. }) => true,
        _ => false,
    }
}

fn is_broken_pipe(err: &anyhow::Error) -> bool {
    err.chain().any(|e| {
        e.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
    })
}
