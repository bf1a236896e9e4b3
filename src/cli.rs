//! Command-line parsing and the commands themselves.

use std::sync::Arc;

use anyhow::Context;
use clap::{Parser, Subcommand, ValueEnum};
use fastcp::{CopyOptions, Location, Plan, Progress, TransportChoice, exit};

/// Fast, secure file copy: scp's habits, several times faster.
#[derive(Debug, Parser)]
#[command(
    name = "fastcp",
    version = version_text(),
    args_conflicts_with_subcommands = true,
    subcommand_negates_reqs = true,
    after_help = "Operands are local paths or [user@]host:path, as with scp.\nExit codes: 0 success, 1 some files failed, 2 usage error, 3 connection or authentication failure, 4 integrity failure."
)]
pub struct Args {
    #[command(subcommand)]
    pub command: Option<Command>,
    /// Sources, then the target.
    #[arg(value_name = "SOURCE... TARGET", num_args = 2.., required = true)]
    pub operands: Vec<String>,
    /// Copy directories recursively.
    #[arg(short = 'r')]
    pub recursive: bool,
    /// Preserve modification times and modes.
    #[arg(short = 'p')]
    pub preserve: bool,
    /// Number of parallel data streams (default: chosen from the cores and the transport).
    #[arg(short = 'j', long = "streams", value_name = "N")]
    pub streams: Option<u16>,
    /// Which transport carries the data.
    #[arg(long, value_enum, default_value_t = TransportArg::Auto)]
    pub transport: TransportArg,
    /// Force a cipher: aes128-gcm, aes256-gcm or chacha20-poly1305.
    #[arg(long, value_name = "CIPHER")]
    pub cipher: Option<fastcp::crypto::CipherSuite>,
    /// Quiet: no progress, no warnings.
    #[arg(short = 'q')]
    pub quiet: bool,
    /// Print a JSON summary on stdout when done.
    #[arg(long)]
    pub json: bool,
    /// Port to connect to on the remote host.
    #[arg(short = 'P', value_name = "PORT")]
    pub port: Option<u16>,
    /// Identity (private key) file for public key authentication.
    #[arg(short = 'i', value_name = "IDENTITY")]
    pub identity: Vec<std::path::PathBuf>,
    /// Connect through these jump hosts (ProxyJump), comma-separated.
    #[arg(short = 'J', value_name = "JUMP")]
    pub jump: Option<String>,
    /// Read this ssh_config instead of ~/.ssh/config.
    #[arg(short = 'F', value_name = "SSH_CONFIG")]
    pub config: Option<std::path::PathBuf>,
    /// ssh_config option, as Key=Value.
    #[arg(short = 'o', value_name = "OPTION")]
    pub ssh_options: Vec<String>,
    /// The fastcp program on the remote host (default: fastcp on its PATH).
    #[arg(long, value_name = "PATH")]
    pub remote_path: Option<String>,
    /// Ports the server may use for TCP data streams, as LOW-HIGH.
    #[arg(long, value_name = "LOW-HIGH", value_parser = parse_ports)]
    pub tcp_ports: Option<(u16, u16)>,
    /// Use this OpenSSH client program instead of the built-in SSH client (one stream).
    #[arg(long, value_name = "PROGRAM")]
    pub ssh_program: Option<std::path::PathBuf>,
}

/// Transport names on the command line.
#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum TransportArg {
    /// TCP when reachable, SSH otherwise.
    Auto,
    /// SSH channels only.
    Ssh,
    /// Raw TCP streams sealed with fastcp's AEAD.
    Tcp,
}

/// Subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// The remote side, started over SSH; speaks the protocol on stdin/stdout.
    Server(ServerArgs),
    /// Benchmarks.
    Bench {
        #[command(subcommand)]
        what: BenchCommand,
    },
}

/// Options of `fastcp server`, for the administrator of the server host.
#[derive(Debug, clap::Args)]
pub struct ServerArgs {
    /// Address to listen on for TCP data streams [env: FASTCP_TCP_BIND] (default: the
    /// address the SSH connection arrived on).
    #[arg(long, value_name = "ADDR", env = "FASTCP_TCP_BIND")]
    pub bind: Option<std::net::IpAddr>,
    /// Ports the TCP data streams may use, as LOW-HIGH [env: FASTCP_TCP_PORTS].
    #[arg(long, value_name = "LOW-HIGH", env = "FASTCP_TCP_PORTS", value_parser = parse_ports)]
    pub ports: Option<(u16, u16)>,
}

/// Parses "LOW-HIGH" or a single port.
fn parse_ports(s: &str) -> Result<(u16, u16), String> {
    let (lo, hi) = s.split_once('-').unwrap_or((s, s));
    let lo: u16 = lo.trim().parse().map_err(|_| format!("bad port {lo:?}"))?;
    let hi: u16 = hi.trim().parse().map_err(|_| format!("bad port {hi:?}"))?;
    if lo == 0 || lo > hi {
        return Err(format!(
            "bad port range {s:?}: want LOW-HIGH with 0 < LOW <= HIGH"
        ));
    }
    Ok((lo, hi))
}

/// `fastcp bench ...`
#[derive(Debug, Subcommand)]
pub enum BenchCommand {
    /// Measure each cipher on this machine and show which one fastcp picks.
    Ciphers,
}

fn version_text() -> &'static str {
    let providers: Vec<String> = fastcp::crypto::Provider::available()
        .iter()
        .map(|p| p.to_string())
        .collect();
    let text = format!(
        "{}\ncrypto providers: {}",
        env!("CARGO_PKG_VERSION"),
        providers.join(", ")
    );
    Box::leak(text.into_boxed_str())
}

/// Runs the parsed command and returns the exit code.
pub async fn run(args: Args) -> anyhow::Result<u8> {
    match &args.command {
        Some(Command::Server(server_args)) => return server(server_args).await,
        Some(Command::Bench {
            what: BenchCommand::Ciphers,
        }) => {
            let table = tokio::task::spawn_blocking(|| {
                fastcp::crypto::bench_table(std::time::Duration::from_millis(300))
            })
            .await??;
            println!("{table}");
            return Ok(exit::OK);
        }
        None => {}
    }
    let (dest, sources) = args.operands.split_last().context("no target given")?;
    let options = CopyOptions {
        recursive: args.recursive,
        preserve: args.preserve,
        streams: args.streams,
        transport: match args.transport {
            TransportArg::Auto => TransportChoice::Auto,
            TransportArg::Ssh => TransportChoice::Ssh,
            TransportArg::Tcp => TransportChoice::Tcp,
        },
        cipher: args.cipher,
        tcp_ports: args.tcp_ports,
        ..Default::default()
    };
    let plan = Plan::new(
        sources.iter().map(|s| Location::parse(s)).collect(),
        Location::parse(dest),
        options,
    )?;
    let progress = Arc::new(Progress::default());
    let outcome = if plan.remote().is_none() {
        fastcp::copy_local(&plan, progress).await?
    } else {
        let ssh = fastcp::transport::SshOptions {
            config_file: args.config.clone(),
            port: args.port,
            identity_files: args.identity.clone(),
            jump: args.jump.clone(),
            options: args.ssh_options.clone(),
            remote_path: args.remote_path.clone(),
            ssh_program: args.ssh_program.clone(),
            ..Default::default()
        };
        fastcp::copy_remote(&plan, &ssh, progress).await?
    };
    for failure in &outcome.report.failures {
        eprintln!("fastcp: {failure}");
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&summary_json(&outcome))?);
    }
    Ok(if outcome.report.failures.is_empty() {
        exit::OK
    } else {
        exit::PARTIAL
    })
}

fn summary_json(outcome: &fastcp::Outcome) -> serde_json::Value {
    let secs = outcome.elapsed.as_secs_f64();
    serde_json::json!({
        "bytes": outcome.report.local.bytes,
        "files": outcome.report.local.files,
        "seconds": secs,
        "throughput_bytes_per_sec": if secs > 0.0 { outcome.report.local.bytes as f64 / secs } else { 0.0 },
        "transport": outcome.transport,
        "streams": outcome.streams,
        "cipher": outcome.cipher.map(|c| c.to_string()),
        "errors": outcome.report.failures.iter().map(|f| f.to_string()).collect::<Vec<_>>(),
    })
}

async fn server(args: &ServerArgs) -> anyhow::Result<u8> {
    let stdio = fastcp::stdio::Stdio::new();
    let config = fastcp::server::ServerConfig {
        tcp_bind: args.bind,
        tcp_ports: args.ports.map(|(lo, hi)| lo..=hi),
        ..Default::default()
    };
    match fastcp::server::serve(stdio, &config).await {
        Ok(report) => {
            for failure in &report.failures {
                eprintln!("fastcp server: {failure}");
            }
            Ok(if report.failures.is_empty() {
                exit::OK
            } else {
                exit::PARTIAL
            })
        }
        Err(e) => {
            eprintln!("fastcp server: {e}");
            Ok(e.exit_code())
        }
    }
}
