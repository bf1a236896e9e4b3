//! The `fastcp` command: scp's habits, fastcp's engine.

use clap::Parser;
use fastcp::exit;
use std::io::Write;
use std::process::ExitCode;

mod cli;

fn main() -> ExitCode {
    let args = cli::Args::parse();
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
    match runtime.block_on(cli::run(args)) {
        Ok(code) => ExitCode::from(code),
        Err(err) => {
            let code = err
                .downcast_ref::<fastcp::Error>()
                .map(fastcp::Error::exit_code)
                .unwrap_or(exit::PARTIAL);
            if !is_broken_pipe(&err) {
                let _ = writeln!(std::io::stderr(), "fastcp: {err:#}");
            }
            ExitCode::from(code)
        }
    }
}

fn is_broken_pipe(err: &anyhow::Error) -> bool {
    err.chain().any(|e| {
        e.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
    })
}
