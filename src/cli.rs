//! Command-line parsing and the commands themselves.

use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::{ArgAction, CommandFactory, Parser, Subcommand, ValueEnum};
use fastcp::stream::{EntryKind, Failure, escape};
use fastcp::{CopyOptions, Location, Log, LogLevel, Plan, TransportChoice, exit};
use serde_json::json;

use crate::progress::{self, Output, Role};

const EXIT_CODES: &str = "\
Exit codes:
  0    success
  1    some files failed (the others were copied)
  2    usage error
  3    connection or authentication failure
  4    integrity failure (a hash or an AEAD tag did not match)
  5    some source files changed or vanished while they were read (the others were copied)
  6    --max-delete left extras that --delete would have removed (the rest was copied)
  130  stopped by Ctrl-C, SIGTERM or SIGHUP";

/// Fast, secure file copy: scp's habits, several times faster.
///
/// Operands are local paths or [user@]host:path, as with scp ([::1]:path and
/// scp://user@host:port/path work too). A remote copy runs `fastcp server` on the remote host
/// over SSH, so host keys, the agent and ~/.ssh/config work as they do for ssh.
#[derive(Debug, Parser)]
#[command(
    name = "fastcp",
    version = version_text(),
    args_conflicts_with_subcommands = true,
    subcommand_negates_reqs = true,
    // As scp: a flag given twice is the flag once, and an option's last value wins (-P 22
    // -P 2222 is port 2222). Options that add up (-i, -o, -J, --exclude, -v) still do.
    args_override_self = true,
    override_usage = "fastcp [OPTIONS] SOURCE... TARGET\n       fastcp <COMMAND>",
    after_help = EXIT_CODES,
    // `-h` is rsync's --human-readable beside operands (`-avh`); alone it is the help, as
    // with rsync (see `main`).
    disable_help_flag = true,
)]
pub struct Args {
    #[command(subcommand)]
    pub command: Option<Command>,
    /// Sources, then the target: local paths or [user@]host:path.
    /// (Options may come between them; a name that starts with `-` goes after `--`.)
    #[arg(value_name = "PATH", num_args = 1.., action = ArgAction::Append, required = true)]
    pub operands: Vec<std::ffi::OsString>,
    /// Copy directories recursively.
    #[arg(short = 'r', help_heading = "Copy")]
    pub recursive: bool,
    /// Preserve modes, modification and access times, and the times of symlinks.
    #[arg(short = 'p', help_heading = "Copy")]
    pub preserve: bool,
    /// List what would be copied, one entry a line on stdout; write nothing.
    #[arg(short = 'n', long = "dry-run", help_heading = "Copy")]
    pub dry_run: bool,
    /// Flush every file to disk before it takes its final name, and the directories written
    /// into before exiting, so that a finished copy survives a crash (slower; for backups).
    #[arg(long, help_heading = "Copy")]
    pub fsync: bool,
    /// Skip files the destination already has with the same size and content (hashed on
    /// each side, in parallel), as rsync's --checksum; long form only (scp's -c names a
    /// cipher).
    #[arg(long, help_heading = "Copy")]
    pub checksum: bool,
    /// Continue files a stopped copy left incomplete: the receiver keeps big files' partial
    /// data (hidden, as .NAME.fastcp-partial) and only the blocks it lacks are sent; implies
    /// --skip-unchanged (or goes with --checksum), so complete files are skipped.
    #[arg(long, help_heading = "Copy")]
    pub resume: bool,
    /// Keep hard links: a file's other names arrive as names of the same file.
    #[arg(short = 'H', help_heading = "Copy")]
    pub hard_links: bool,
    /// Follow symlinks inside trees and copy what they point to, as rsync's -L (a symlink
    /// named on the command line is always followed, as scp does).
    #[arg(short = 'L', long = "copy-links", help_heading = "Copy")]
    pub copy_links: bool,
    /// Archive: -r -p --owner --group -D, as rsync's -a (owners and devices only take when
    /// the receiving side runs as root).
    #[arg(short = 'a', long, help_heading = "Copy")]
    pub archive: bool,
    /// Copy device nodes (needs root on the receiving side) instead of skipping them.
    #[arg(long, help_heading = "Copy")]
    pub devices: bool,
    /// Copy named pipes and sockets instead of skipping them.
    #[arg(long, help_heading = "Copy")]
    pub specials: bool,
    /// --devices --specials.
    #[arg(short = 'D', help_heading = "Copy")]
    pub devices_and_specials: bool,
    /// Do not cross file system boundaries when recursing: a mount point beneath a source
    /// arrives as an empty directory (rsync's -x).
    #[arg(short = 'x', long, help_heading = "Copy")]
    pub one_file_system: bool,
    /// Keep each file's owner (needs root on the receiving side; mapped by user name unless
    /// --numeric-ids).
    #[arg(long, help_heading = "Copy")]
    pub owner: bool,
    /// Keep each file's group (a receiver that is not root sets the groups it is in).
    #[arg(long, help_heading = "Copy")]
    pub group: bool,
    /// With --owner or --group: keep the numeric ids, never map them by name.
    #[arg(long, help_heading = "Copy")]
    pub numeric_ids: bool,
    /// Keep extended attributes: user.*, and trusted.* and security.* as root
    /// (security.capability is never set).
    #[arg(short = 'X', long, help_heading = "Copy")]
    pub xattrs: bool,
    /// Keep POSIX ACLs (numeric ids inside).
    #[arg(short = 'A', long, help_heading = "Copy")]
    pub acls: bool,
    /// Skip files the destination already has with the same size and modification time
    /// (rsync's quick check); implies -p, since times only match if the copy keeps them.
    #[arg(long, help_heading = "Copy")]
    pub skip_unchanged: bool,
    /// Skip files the destination already has with the same size, whatever their time
    /// (rsync's --size-only); implies --skip-unchanged.
    #[arg(long, help_heading = "Copy")]
    pub size_only: bool,
    /// Leave whatever the destination already has at a file's path untouched (rsync's
    /// --ignore-existing); implies --skip-unchanged.
    #[arg(long, help_heading = "Copy")]
    pub ignore_existing: bool,
    /// Leave what the destination has with a later modification time untouched (rsync's
    /// -u); implies --skip-unchanged.
    #[arg(short = 'u', long, help_heading = "Copy")]
    pub update: bool,
    /// Mirror: remove from each directory copied what the destination holds and the source
    /// does not (rsync's --delete); only beneath the destination, never through a symlink.
    #[arg(long, help_heading = "Copy")]
    pub delete: bool,
    /// With --delete: remove at most NUM entries (a folder counts with all it holds); the
    /// extras past the limit stay and the copy ends with exit code 6 (rsync's --max-delete;
    /// 0 removes nothing and reports what would go).
    #[arg(long, value_name = "NUM", help_heading = "Copy")]
    pub max_delete: Option<u64>,
    /// With --delete: remove what --exclude rules leave out too, where --delete alone keeps
    /// it (rsync's --delete-excluded; implies --delete).
    #[arg(long, help_heading = "Copy")]
    pub delete_excluded: bool,
    /// Hard-link files from DIR, on the receiving side, where DIR holds them alike (same
    /// path, size and time) instead of sending them (rsync's --link-dest: each night's
    /// backup a full tree that costs only what changed). A relative DIR is taken from the
    /// destination. Implies --skip-unchanged.
    #[arg(long, value_name = "DIR", help_heading = "Copy")]
    pub link_dest: Option<std::path::PathBuf>,
    /// End the copy (exit code 3) when no data has moved for SECS seconds: a peer that
    /// stopped answering or a link that dropped. 0 waits forever.
    #[arg(long, value_name = "SECS", default_value_t = fastcp::DEFAULT_TIMEOUT.as_secs(), help_heading = "Copy")]
    pub timeout: u64,
    /// Leave out what PATTERN matches (rsync's meaning: `*.o`, `/top/build/`, `docs/*.tmp`);
    /// with --include, the first rule that matches decides, in command-line order.
    #[arg(long, value_name = "PATTERN", help_heading = "Copy")]
    pub exclude: Vec<String>,
    /// Copy what PATTERN matches even if a later --exclude would leave it out.
    #[arg(long, value_name = "PATTERN", help_heading = "Copy")]
    pub include: Vec<String>,
    /// Read exclude patterns from FILE, one a line (`+ PATTERN` includes; `#` comments).
    #[arg(long, value_name = "FILE", help_heading = "Copy")]
    pub exclude_from: Vec<std::path::PathBuf>,
    /// Read include patterns from FILE, one a line (`- PATTERN` excludes; `#` comments).
    #[arg(long, value_name = "FILE", help_heading = "Copy")]
    pub include_from: Vec<std::path::PathBuf>,
    /// Copy only the paths listed in FILE, one a line, relative to the source (rsync's
    /// --files-from; `-` reads standard input): the list is read here and applies to the
    /// sources wherever they are (a pull sends it to the remote side).
    #[arg(long, value_name = "FILE", help_heading = "Copy")]
    pub files_from: Option<std::path::PathBuf>,
    /// Never upload fastcp to a remote host that does not have it (such a copy goes over
    /// SFTP).
    #[arg(long, help_heading = "SSH")]
    pub no_deploy: bool,
    /// Never copy over SFTP in place of fastcp: a host without fastcp, where none can be
    /// deployed, fails the copy (exit code 3) instead.
    #[arg(long, help_heading = "SSH", conflicts_with = "sftp")]
    pub no_sftp_fallback: bool,
    /// Copy over the remote host's SFTP subsystem, with nothing of fastcp's there: several
    /// SFTP sessions at once (-j, default 4; 1 for a push or a pull, without -r, of files
    /// only, 32 MiB at most), many requests in flight on each.
    #[arg(long, help_heading = "SSH")]
    pub sftp: bool,
    /// Copy only share I of N (from 0): N runs with the same sources and I from 0 to N-1,
    /// on any machines, copy everything exactly once, balanced by bytes.
    #[arg(long, value_name = "I/N", help_heading = "Copy")]
    pub shard: Option<fastcp::shard::Shard>,
    /// Where to find the static binaries `cargo xtask dist` built, for a remote host this
    /// fastcp cannot run on (default: $FASTCP_DIST_DIR, or dist/ beside this program).
    #[arg(long, value_name = "DIR", help_heading = "SSH")]
    pub deploy_from: Option<std::path::PathBuf>,
    /// Compress the data streams with zstd (off by default; helps on slow links only).
    #[arg(short = 'C', help_heading = "Copy")]
    pub compress: bool,
    /// Limit the bandwidth to LIMIT Kbit/s, as scp's -l (1 Kbit = 1024 bits).
    #[arg(
        short = 'l',
        value_name = "LIMIT",
        help_heading = "Copy",
        conflicts_with = "bwlimit"
    )]
    pub limit_kbit: Option<u64>,
    /// Limit the bandwidth, as rsync's --bwlimit: KiB/s, or with a unit: 500K, 10M, 1.5G
    /// (powers of 1024), 10MB (powers of 1000), 4096B (bytes). 0 means no limit.
    #[arg(long, value_name = "RATE", value_parser = fastcp::limit::parse_rate, help_heading = "Copy")]
    pub bwlimit: Option<u64>,
    #[command(flatten)]
    pub link: LinkArgs,
    #[command(flatten)]
    pub ssh: SshArgs,
    /// Quiet: no progress, no warnings.
    #[arg(short = 'q', help_heading = "Output")]
    pub quiet: bool,
    /// Verbose: -v shows the connection steps and the transport, cipher and streams chosen;
    /// -vv more detail.
    #[arg(short = 'v', action = ArgAction::Count, help_heading = "Output")]
    pub verbose: u8,
    /// Show progress even when stderr is not a terminal: a plain line every few seconds.
    #[arg(long, help_heading = "Output")]
    pub progress: bool,
    /// Print a JSON summary on stdout when done (see README.md for the schema).
    #[arg(long, help_heading = "Output")]
    pub json: bool,
    /// rsync's --human-readable, as in -avh: accepted, with nothing to do (sizes are shown
    /// so already). Alone, -h prints this help.
    #[arg(short = 'h', help_heading = "Output")]
    pub human_readable: bool,
    /// Print help (-h alone: a summary).
    #[arg(long = "help", action = ArgAction::HelpLong)]
    help: Option<bool>,
}

/// How the data travels; shared by copies and `fastcp doctor`.
#[derive(Debug, Clone, clap::Args)]
pub struct LinkArgs {
    /// Number of parallel data streams (default: 4 over TCP, 2 over SSH; 1 over SSH for a push
    /// of files that fit in one chunk). Over SFTP, the sessions (default 4; 1 for a push or
    /// a pull, without -r, of files only, 32 MiB at most).
    #[arg(
        short = 'j',
        long = "streams",
        value_name = "N",
        help_heading = "Transport"
    )]
    pub streams: Option<u16>,
    /// Which transport carries the data.
    #[arg(long, value_enum, default_value_t = TransportArg::Auto, help_heading = "Transport")]
    pub transport: TransportArg,
    /// Force a cipher for sealed TCP streams: aes128-gcm, aes256-gcm or chacha20-poly1305
    /// (default: chosen from both CPUs).
    #[arg(long, value_name = "CIPHER", help_heading = "Transport")]
    pub cipher: Option<fastcp::crypto::CipherSuite>,
    /// Ports the server may use for TCP data streams, as LOW-HIGH.
    #[arg(long, value_name = "LOW-HIGH", value_parser = parse_ports, help_heading = "Transport")]
    pub tcp_ports: Option<(u16, u16)>,
}

/// How to reach the remote host: scp's SSH flags.
#[derive(Debug, Clone, clap::Args)]
pub struct SshArgs {
    /// Port to connect to on the remote host (a number, or a service name such as `ssh`).
    #[arg(short = 'P', value_name = "PORT", value_parser = parse_port, help_heading = "SSH")]
    pub port: Option<u16>,
    /// Identity (private key) file for public key authentication.
    #[arg(short = 'i', value_name = "IDENTITY", help_heading = "SSH")]
    pub identity: Vec<PathBuf>,
    /// Connect through these jump hosts (ProxyJump), comma-separated; -J given again adds
    /// the next hops.
    #[arg(short = 'J', value_name = "JUMP", help_heading = "SSH")]
    pub jump: Vec<String>,
    /// Read this ssh_config instead of ~/.ssh/config and /etc/ssh/ssh_config.
    #[arg(short = 'F', value_name = "SSH_CONFIG", help_heading = "SSH")]
    pub config: Option<PathBuf>,
    /// An ssh_config option, as Key=Value (for example -o Port=2222).
    #[arg(short = 'o', value_name = "OPTION", help_heading = "SSH")]
    pub ssh_options: Vec<String>,
    /// The fastcp program on the remote host (default: fastcp on its PATH).
    #[arg(long, value_name = "PATH", help_heading = "SSH")]
    pub remote_path: Option<String>,
    /// Use this OpenSSH client program instead of the built-in SSH client (one stream);
    /// -S as in scp.
    #[arg(short = 'S', long, value_name = "PROGRAM", help_heading = "SSH")]
    pub ssh_program: Option<PathBuf>,
    /// Connect over IPv4 only (scp's -4: ssh's AddressFamily inet). As with scp, the last of
    /// -4 and -6 wins.
    #[arg(short = '4', help_heading = "SSH", overrides_with = "ipv6")]
    pub ipv4: bool,
    /// Connect over IPv6 only (scp's -6: ssh's AddressFamily inet6).
    #[arg(short = '6', help_heading = "SSH", overrides_with = "ipv4")]
    pub ipv6: bool,
    /// Batch mode: never ask for a passphrase or password (scp's -B: ssh's BatchMode yes).
    #[arg(short = 'B', help_heading = "SSH")]
    pub batch_mode: bool,
    /// The SSH connection's cipher, as scp's -c (ssh's Ciphers; --checksum has no short
    /// form for this reason).
    #[arg(short = 'c', value_name = "CIPHER", help_heading = "SSH")]
    pub ssh_cipher: Option<String>,
    /// scp's -T, -O and -s: accepted, and nothing to do (fastcp checks the names a server
    /// sends itself, and picks its own protocol).
    #[arg(short = 'T', hide = true)]
    pub scp_no_name_check: bool,
    #[arg(short = 'O', hide = true)]
    pub scp_legacy_protocol: bool,
    #[arg(short = 's', hide = true)]
    pub scp_sftp_protocol: bool,
    /// Copy between two remote hosts through this machine, as scp's -3: accepted, and
    /// what fastcp always does for `host1:src host2:dst` (nothing is written here; both
    /// hosts need fastcp, which self-deploy normally puts there).
    #[arg(short = '3', help_heading = "SSH")]
    pub scp_through_local: bool,
}

impl SshArgs {
    /// The SSH options these flags give. As ssh does, an identity file (`-i`) that cannot be
    /// found is left out with a warning on `log`: the copy goes on with the others (or
    /// ssh_config's, or the default ones).
    fn options(&self, log: &Log) -> fastcp::transport::SshOptions {
        // scp's own flags for ssh options come before -o, as ssh takes the first value.
        let mut options = Vec::new();
        if self.ipv4 {
            options.push("AddressFamily=inet".to_owned());
        }
        if self.ipv6 {
            options.push("AddressFamily=inet6".to_owned());
        }
        if self.batch_mode {
            options.push("BatchMode=yes".to_owned());
        }
        if let Some(c) = &self.ssh_cipher {
            options.push(format!("Ciphers={c}"));
        }
        options.extend(self.ssh_options.iter().cloned());
        let identity_files = self.identity.iter().filter(|file| {
            // `~` is for ssh_config's reading to expand.
            if file.as_os_str().as_encoded_bytes().starts_with(b"~") {
                return true;
            }
            let Err(e) = std::fs::metadata(file) else {
                return true;
            };
            let why = e.raw_os_error().map_or_else(
                || e.to_string(),
                |n| nix::errno::Errno::from_raw(n).desc().to_owned(),
            );
            log.warn(|| format!("Identity file {} not accessible: {why}.", file.display()));
            false
        });
        let mut ssh = fastcp::transport::SshOptions::default()
            .identity_files(identity_files)
            .options(options);
        ssh.config_file = self.config.clone();
        ssh.port = self.port;
        // `-J a -J b` is `-J a,b`: the hops in the order given.
        ssh.jump = (!self.jump.is_empty()).then(|| self.jump.join(","));
        ssh.remote_path = self.remote_path.clone();
        ssh.ssh_program = self.ssh_program.clone();
        ssh
    }
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
    /// Check a remote host: its fastcp version, both CPUs, the cipher and transport a copy
    /// would use, and a few seconds of measured throughput (nothing is written on either disk).
    Doctor(DoctorArgs),
    /// Print a shell completion script: fastcp completions bash > /etc/bash_completion.d/fastcp
    Completions {
        /// The shell.
        shell: clap_complete::Shell,
    },
    /// Print the manual page (roff): fastcp man | man -l -
    Man,
    /// The remote side, started over SSH; speaks the protocol on stdin/stdout.
    Server(ServerArgs),
    /// Benchmarks.
    Bench {
        #[command(subcommand)]
        what: BenchCommand,
    },
}

/// Options of `fastcp doctor`.
#[derive(Debug, clap::Args)]
#[command(after_help = EXIT_CODES)]
pub struct DoctorArgs {
    /// The host to check: [user@]host, as in ssh (host:path and scp:// forms work too).
    #[arg(value_name = "HOST")]
    pub host: String,
    /// How long to measure the throughput, in seconds (0 skips it).
    #[arg(long, value_name = "SECONDS", default_value_t = 3.0)]
    pub seconds: f64,
    #[command(flatten)]
    pub link: LinkArgs,
    #[command(flatten)]
    pub ssh: SshArgs,
    /// Show the connection steps (-vv: more).
    #[arg(short = 'v', action = ArgAction::Count, help_heading = "Output")]
    pub verbose: u8,
    /// Print the report as JSON on stdout.
    #[arg(long, help_heading = "Output")]
    pub json: bool,
}

/// Options of `fastcp server`, for the administrator of the server host.
#[derive(Debug, clap::Args)]
pub struct ServerArgs {
    /// Address to listen on for TCP data streams (default: the address the SSH connection
    /// arrived on).
    #[arg(long, value_name = "ADDR", env = "FASTCP_TCP_BIND")]
    pub bind: Option<std::net::IpAddr>,
    /// Ports the TCP data streams may use, as LOW-HIGH (a client's --tcp-ports is narrowed
    /// to them).
    #[arg(long, value_name = "LOW-HIGH", env = "FASTCP_TCP_PORTS", value_parser = parse_ports)]
    pub ports: Option<(u16, u16)>,
    /// Confine clients to DIR: every path they name is taken relative to it and must
    /// resolve beneath it (for a forced command in authorized_keys).
    #[arg(long, value_name = "DIR")]
    pub restrict_to: Option<std::path::PathBuf>,
    /// Refuse pushes: clients may only read.
    #[arg(long, conflicts_with = "write_only")]
    pub read_only: bool,
    /// Refuse pulls: clients may only write.
    #[arg(long)]
    pub write_only: bool,
    /// Refuse --delete.
    #[arg(long)]
    pub no_delete: bool,
}

/// Parses "LOW-HIGH" or a single port.
/// A port as scp's `-P` takes it: a number from 1 to 65535, or a TCP service name.
fn parse_port(s: &str) -> Result<u16, String> {
    fastcp::transport::ssh::config::parse_port(s).ok_or_else(|| format!("bad port {s:?}"))
}

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
        "{}\ncrypto providers: {}\ncompression: zstd",
        env!("CARGO_PKG_VERSION"),
        providers.join(", ")
    );
    Box::leak(text.into_boxed_str())
}

/// What to use instead of an rsync or scp flag that fastcp does not take; `flag` as clap
/// names it (`-z`, `--rsync-path`).
fn alternative_to(flag: &str) -> Option<&'static str> {
    Some(match flag {
        "-z" | "--compress" => "rsync's -z is -C here (zstd; worth it on slow links only)",
        "-e" | "--rsh" => {
            "give ssh's settings as scp takes them: -S PROGRAM (the ssh program), -P PORT, \
             -i KEY, -o OPTION, -F CONFIG"
        }
        "--partial" | "--partial-dir" | "--append" | "--append-verify" => {
            "--resume keeps a stopped copy's partial files and sends only what they lack"
        }
        "--inplace" => {
            "every file is written to a temporary name and renamed over its target once \
             whole and checked; leave out --inplace"
        }
        "--rsync-path" => "--remote-path PATH names the fastcp program on the remote host",
        "-R" | "--relative" => {
            "neither scp's -R (copy from the source host) nor rsync's -R (--relative) is \
             taken; between two remote hosts fastcp copies through this machine, as scp's -3"
        }
        _ => return None,
    })
}

/// `err`, a usage error clap found, with what to use instead when it is about an rsync or
/// scp flag that fastcp does not take or reads otherwise (rsync's `-P` is scp's port here).
/// Such an error suggests no look-alike flag of fastcp's (`--inplace` is not `--include`).
pub fn with_alternative(err: clap::Error) -> clap::Error {
    use clap::error::{ContextKind, ContextValue, ErrorKind};
    let Some(ContextValue::String(arg)) = err.get(ContextKind::InvalidArg) else {
        return err;
    };
    let tip = |text: &'static str| ContextValue::StyledStrs(vec![text.into()]);
    match err.kind() {
        ErrorKind::UnknownArgument => {
            let flag = arg.split_once('=').map_or(arg.as_str(), |(flag, _)| flag);
            let Some(alternative) = alternative_to(flag) else {
                return err;
            };
            let mut said = clap::Error::new(ErrorKind::UnknownArgument).with_cmd(&command());
            said.insert(
                ContextKind::InvalidArg,
                ContextValue::String(flag.to_owned()),
            );
            said.insert(ContextKind::Suggested, tip(alternative));
            if let Some(usage) = err.get(ContextKind::Usage) {
                said.insert(ContextKind::Usage, usage.clone());
            }
            said
        }
        ErrorKind::ValueValidation if arg.starts_with("-P ") => {
            let mut err = err;
            err.insert(
                ContextKind::Suggested,
                tip("-P is scp's port; rsync's -P (--partial --progress) is --resume --progress"),
            );
            err
        }
        _ => err,
    }
}

/// The clap definition, for parsing, completions and the man page. `-h` beside operands is
/// rsync's flag, so clap's own help flag is off (for the subcommands too: it is a global
/// setting), and each subcommand is given `-h`/`--help` again.
pub fn command() -> clap::Command {
    fn with_help(command: clap::Command) -> clap::Command {
        command.mut_subcommands(|sub| {
            let help = clap::Arg::new("help")
                .short('h')
                .long("help")
                .action(ArgAction::Help)
                .help("Print help");
            with_help(sub.arg(help))
        })
    }
    with_help(Args::command())
}

/// The command line, parsed.
pub fn parse() -> Result<Args, clap::Error> {
    use clap::FromArgMatches;
    let mut command = command();
    let matches = command.try_get_matches_from_mut(std::env::args_os())?;
    Args::from_arg_matches(&matches).map_err(|e| e.format(&mut command))
}

/// A [`Log`] that prints on stderr through `output`: warnings unless `quiet`, steps at `-v`,
/// detail at `-vv`.
fn stderr_log(output: &Output, quiet: bool, verbose: u8) -> Log {
    let output = output.clone();
    Log::new(move |level, line| {
        let show = match level {
            LogLevel::Warn => !quiet || verbose > 0,
            LogLevel::Info => verbose >= 1,
            LogLevel::Debug => verbose >= 2,
        };
        if show {
            let prefix = if level == LogLevel::Warn {
                "fastcp: warning: "
            } else {
                "fastcp: "
            };
            output.line(&format!("{prefix}{line}"));
        }
    })
}

impl LinkArgs {
    fn options(&self) -> CopyOptions {
        let mut options = CopyOptions::default().transport(match self.transport {
            TransportArg::Auto => TransportChoice::Auto,
            TransportArg::Ssh => TransportChoice::Ssh,
            TransportArg::Tcp => TransportChoice::Tcp,
        });
        options.streams = self.streams;
        options.cipher = self.cipher;
        options.tcp_ports = self.tcp_ports;
        options
    }
}

/// Runs the parsed command and returns the exit code.
/// Runs the command `args` name. A copy stops when `cancel` is cancelled.
pub async fn run(args: Args, cancel: fastcp::CancellationToken) -> anyhow::Result<u8> {
    match args.command {
        Some(Command::Server(server_args)) => server(&server_args).await,
        Some(Command::Bench {
            what: BenchCommand::Ciphers,
        }) => {
            let table = tokio::task::spawn_blocking(|| {
                fastcp::crypto::bench_table(std::time::Duration::from_millis(300))
            })
            .await??;
            println!("{table}");
            Ok(exit::OK)
        }
        Some(Command::Completions { shell }) => {
            let mut out = std::io::stdout().lock();
            clap_complete::generate(shell, &mut command(), "fastcp", &mut out);
            out.flush()?;
            Ok(exit::OK)
        }
        Some(Command::Man) => {
            let mut out = std::io::stdout().lock();
            // The header's version is one line: `--version` adds the providers below it.
            let page = command().version(env!("CARGO_PKG_VERSION"));
            clap_mangen::Man::new(page).render(&mut out)?;
            out.flush()?;
            Ok(exit::OK)
        }
        Some(Command::Doctor(doctor_args)) => {
            let checked = doctor(&doctor_args).await;
            // `fastcp doctor x` with a file named `doctor` here: maybe a copy was meant.
            if checked.is_err() && std::path::Path::new("doctor").exists() {
                eprintln!(
                    "fastcp: `doctor` is a command; to copy the file of that name, write ./doctor"
                );
            }
            checked
        }
        None => copy(&args, cancel).await,
    }
}

/// The --include, --exclude, --exclude-from and --include-from rules in the order they were
/// given (clap keeps each option's values apart; rsync's rules depend on their order across
/// options).
fn filter_from_command_line(
    files_from: Option<&std::path::Path>,
) -> anyhow::Result<Option<Arc<fastcp::stream::Filter>>> {
    use std::os::unix::ffi::{OsStrExt, OsStringExt};
    let mut filter = fastcp::stream::Filter::default();
    // As the OS gives them: an operand or a file name may not be UTF-8 (`env::args` panics on
    // such an argument). Patterns are text.
    let args: Vec<std::ffi::OsString> = std::env::args_os().skip(1).collect();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        if a == "--" {
            break;
        }
        for (name, kind) in [
            ("--include", 0),
            ("--exclude", 1),
            ("--exclude-from", 2),
            ("--include-from", 3),
        ] {
            let value = match a.as_bytes().strip_prefix(name.as_bytes()) {
                Some(b"") => it.next().cloned(),
                Some([b'=', rest @ ..]) => Some(std::ffi::OsString::from_vec(rest.to_vec())),
                _ => continue,
            };
            let Some(value) = value else { continue };
            match kind {
                0 => filter.include(&value.to_string_lossy())?,
                1 => filter.exclude(&value.to_string_lossy())?,
                _ => {
                    let what = || format!("reading {name} {}", value.to_string_lossy());
                    let text = std::fs::read(&value).with_context(what)?;
                    let text = String::from_utf8_lossy(&text);
                    if kind == 2 {
                        filter.add_rules(&text)?;
                    } else {
                        filter.add_include_rules(&text)?;
                    }
                }
            }
        }
    }
    if let Some(list) = files_from {
        // Paths, one a line, as bytes: a listed name need not be UTF-8.
        let bytes = if list == std::path::Path::new("-") {
            let mut bytes = Vec::new();
            std::io::Read::read_to_end(&mut std::io::stdin(), &mut bytes)
                .context("reading --files-from -")?;
            bytes
        } else {
            std::fs::read(list)
                .with_context(|| format!("reading --files-from {}", list.display()))?
        };
        // As rsync reads it: lines starting with `#` or `;` are comments.
        let lines = bytes
            .split(|&b| b == b'\n')
            .map(|l| l.strip_suffix(b"\r").unwrap_or(l))
            .filter(|l| !l.trim_ascii().is_empty() && !l.starts_with(b"#") && !l.starts_with(b";"));
        filter = filter.files_from(lines);
    }
    Ok((!filter.is_empty()).then(|| Arc::new(filter)))
}

async fn copy(args: &Args, cancel: fastcp::CancellationToken) -> anyhow::Result<u8> {
    let output = Output::default();
    let (feed, progress) = progress::Feed::start(&output);
    let result = copy_with(args, &output, &feed, progress, cancel).await;
    if let (Err(err), true) = (&result, args.json) {
        print_json(&aborted_json(err, &feed))?;
    }
    result
}

/// The exit code of a command that failed with `err`.
pub fn exit_code_of(err: &anyhow::Error) -> u8 {
    err.downcast_ref::<fastcp::Error>()
        .map(fastcp::Error::exit_code)
        .unwrap_or(exit::PARTIAL)
}

async fn copy_with(
    args: &Args,
    output: &Output,
    feed: &Arc<progress::Feed>,
    progress: Arc<fastcp::Progress>,
    cancel: fastcp::CancellationToken,
) -> anyhow::Result<u8> {
    let (dest, sources) = match args.operands.split_last() {
        Some((dest, sources)) if !sources.is_empty() => (dest, sources),
        _ => {
            let mut text = "a source and a target are needed: fastcp SOURCE... TARGET".to_owned();
            // rsync's `-avc src/ dest`: scp's -c took the source for a cipher.
            if let Some(cipher) = &args.ssh.ssh_cipher
                && std::path::Path::new(cipher).exists()
            {
                text += &format!(
                    " (-c is scp's cipher, and took {cipher:?}; rsync's -c is --checksum)"
                );
            }
            return Err(fastcp::Error::Usage(text).into());
        }
    };
    let log = stderr_log(output, args.quiet, args.verbose);
    let mut options = args
        .link
        .options()
        .recursive(args.recursive || args.archive)
        .preserve(args.preserve || args.archive)
        .attrs(fastcp::KeepAttrs {
            owner: args.owner || args.archive,
            group: args.group || args.archive,
            numeric_ids: args.numeric_ids,
            xattrs: args.xattrs,
            acls: args.acls,
        })
        .devices(args.devices || args.devices_and_specials || args.archive)
        .specials(args.specials || args.devices_and_specials || args.archive)
        .one_file_system(args.one_file_system)
        .dry_run(args.dry_run)
        .fsync(args.fsync)
        .skip_unchanged(args.skip_unchanged)
        .skip_rules(fastcp::stream::SkipRules {
            size_only: args.size_only,
            existing: args.ignore_existing,
            newer: args.update,
        })
        .hard_links(args.hard_links)
        .follow_links(args.copy_links)
        .checksum(args.checksum)
        .resume(args.resume)
        .delete(args.delete)
        .delete_excluded(args.delete_excluded)
        .max_delete(args.max_delete)
        .no_deploy(args.no_deploy)
        .no_sftp_fallback(args.no_sftp_fallback)
        .sftp(args.sftp)
        .compress(args.compress)
        .cancel(cancel)
        .log(log.clone());
    // A bad pattern or a list that cannot be read: what was asked makes no sense (exit 2).
    options.filter = filter_from_command_line(args.files_from.as_deref())
        .map_err(|e| fastcp::Error::Usage(error_text(&e)))?;
    options.shard = args.shard;
    options.link_dest = args.link_dest.clone();
    options.timeout = (args.timeout > 0).then(|| std::time::Duration::from_secs(args.timeout));
    options.deploy_from = args.deploy_from.clone();
    // scp's -l: Kbit/s of 1024 bits.
    options.bwlimit = args
        .bwlimit
        .or(args.limit_kbit.map(|k| k.saturating_mul(1024) / 8));
    let sources = sources
        .iter()
        .map(|s| Location::parse_os(s))
        .collect::<Result<Vec<_>, _>>()?;
    let plan = Plan::new(sources, Location::parse_os(dest)?, options)?;
    let role = if plan.remote().is_none() {
        Role::Local
    } else if plan.dest().remote().is_some() {
        Role::Push
    } else {
        Role::Pull
    };
    feed.set_role(role);
    if plan.is_relay() {
        // Named as the relay's own errors name them.
        let named = |r: &fastcp::RemotePath| match &r.user {
            Some(user) => format!("{user}@{}", r.host),
            None => r.host.clone(),
        };
        let source = plan.sources().iter().find_map(Location::remote);
        if let (Some(source), Some(target)) = (source, plan.dest().remote()) {
            feed.set_hosts(named(source), named(target));
        }
    }
    let style = if args.quiet || args.dry_run {
        progress::Style::Off
    } else if std::io::IsTerminal::is_terminal(&std::io::stderr()) {
        progress::Style::Bar
    } else if args.progress {
        progress::Style::Lines
    } else {
        progress::Style::Off
    };
    let display = progress::Display::start(progress.clone(), feed.clone(), role, style, output);
    let result = if role == Role::Local {
        fastcp::copy_local(&plan, progress.clone()).await
    } else {
        fastcp::copy_remote(&plan, &args.ssh.options(&log), progress.clone()).await
    };
    display.finish(&progress, role, result.as_ref().ok()).await;
    let outcome = match result {
        Ok(outcome) => outcome,
        Err(err) => return Err(err.into()),
    };
    // Failures were printed as they happened; the report may hold some no event told.
    feed.print_rest(&outcome.report.failures, outcome.report.failure_count);
    let code = exit::for_report(&outcome.report);
    if args.json {
        print_json(&summary_json(&outcome, code, args.dry_run, plan.contents()))?;
    } else if args.dry_run {
        let mut out = std::io::stdout().lock();
        for entry in &outcome.listing {
            writeln!(out, "{}", listing_line(entry, plan.contents()))?;
        }
        out.flush()?;
    }
    if !outcome.report.is_complete()
        && !args.quiet
        && let Some(line) = failures_line(&outcome, args.dry_run)
    {
        output.line(&line);
    }
    Ok(code)
}

/// The last line of a copy where some entries failed: how many, and whether anything else
/// was done (what the receiving side wrote: the far side's count, on a `push`). None when
/// only the mirror's limit stopped it, which its own message says.
fn failures_line(outcome: &fastcp::Outcome, dry_run: bool) -> Option<String> {
    let r = &outcome.report;
    let verb = if dry_run { "listed" } else { "copied" };
    let written = outcome.arrived();
    let done = written.files + written.dirs + written.symlinks;
    // A refused `--delete` is reported beside the failures that caused it, and is no entry;
    // neither is what `--max-delete` left.
    let limited = |f: &&fastcp::stream::Failure| f.code == fastcp::stream::ErrorCode::DeleteLimit;
    let refusals = r
        .failures
        .iter()
        .filter(|f| {
            f.path.is_empty() && (f.message == fastcp::stream::NOTHING_DELETED || limited(f))
        })
        .count() as u64;
    if r.failure_count == r.failures.len() as u64 && r.failures.iter().all(|f| limited(&f)) {
        return None;
    }
    let failed = r.failure_count.saturating_sub(refusals).max(1);
    Some(if done + r.files_skipped == 0 {
        let entries = if failed == 1 { "entry" } else { "entries" };
        format!("fastcp: nothing was {verb}: {failed} {entries} failed")
    } else {
        format!("fastcp: {failed} of the entries could not be {verb}; the others were {verb}")
    })
}

/// An error and its causes, each cause once: "a: b: c", leaving out a cause whose text the
/// message already includes.
pub fn error_text(err: &anyhow::Error) -> String {
    let mut text = err.to_string();
    for cause in err.chain().skip(1) {
        let cause = cause.to_string();
        if !says_already(&text, &cause) {
            text.push_str(": ");
            text.push_str(&cause);
        }
    }
    text
}

/// Whether `text` already tells `cause`: the engine words an I/O error itself
/// ("no space left on device"), so the OS's own wording of the same error
/// ("No space left on device (os error 28)") would only repeat it.
fn says_already(text: &str, cause: &str) -> bool {
    let bare = match cause.rfind(" (os error ") {
        Some(i) if cause.ends_with(')') => &cause[..i],
        _ => cause,
    };
    text.to_lowercase().contains(&bare.to_lowercase())
}

/// One line of a dry run's listing: directories end with '/', links show their target, and
/// what `--delete` would remove starts with "deleting ". The path is where the entry lands
/// beneath the destination ([`landing_path`]).
fn listing_line(entry: &fastcp::Listed, contents: bool) -> String {
    let path = escape(landing_path(&entry.path, contents));
    let line = match &entry.kind {
        EntryKind::Dir => format!("{path}/"),
        EntryKind::File { .. } | EntryKind::Special { .. } => path,
        EntryKind::Symlink { target } => format!("{path} -> {}", escape(target)),
    };
    // As rsync words it.
    if entry.delete {
        format!("deleting {line}")
    } else {
        line
    }
}

/// A listed entry's path as the destination will have it: as listed (`src/a/x` for
/// `fastcp -r src dest`, where it lands at `dest/src/a/x`), or, for a folder's contents
/// (`src/.`, which go straight into the destination), without the source's name, the top
/// itself being `.`: `a/x` for what lands at `dest/a/x`, as `rsync -n src/ dest` names it.
fn landing_path(path: &[u8], contents: bool) -> &[u8] {
    if !contents {
        return path;
    }
    match path.iter().position(|&b| b == b'/') {
        Some(i) => &path[i + 1..],
        None => b".",
    }
}

/// The `--json` kind of a pipe, socket or device.
fn special_name(kind: fastcp::stream::SpecialKind) -> &'static str {
    use fastcp::stream::SpecialKind;
    match kind {
        SpecialKind::Fifo => "fifo",
        SpecialKind::Socket => "socket",
        SpecialKind::CharDevice => "char-device",
        SpecialKind::BlockDevice => "block-device",
    }
}

/// The JSON object of a usage error found while reading the command line (README.md, "JSON
/// summary").
pub fn print_usage_json(message: &str) -> anyhow::Result<()> {
    print_json(&json!({
        "version": 1,
        "exit_code": exit::USAGE,
        "error": message,
        "error_kind": "usage",
        "fault": "user",
    }))
}

fn print_json(value: &serde_json::Value) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    serde_json::to_writer_pretty(&mut out, value)?;
    writeln!(out)?;
    out.flush()?;
    Ok(())
}

fn code_name(code: fastcp::stream::ErrorCode) -> &'static str {
    use fastcp::stream::ErrorCode as C;
    match code {
        C::NotFound => "not_found",
        C::PermissionDenied => "permission_denied",
        C::Io => "io",
        C::UnsafePath => "unsafe_path",
        C::Integrity => "integrity",
        C::Protocol => "protocol",
        C::Unsupported => "unsupported",
        C::SourceChanged => "source_changed",
        C::NoSpace => "no_space",
        C::ReadOnly => "read_only",
        C::Quota => "quota",
        C::DeleteLimit => "delete_limit",
        _ => "other",
    }
}

/// A `--json` failure entry.
fn failure_json(f: &Failure) -> serde_json::Value {
    json!({
        "path": escape(&f.path),
        "side": f.side.name(),
        "code": code_name(f.code),
        "message": f.message,
    })
}

/// A name in snake case, from a variant's name: `HostKey` gives `host_key`.
fn snake_case(name: &str) -> String {
    let mut out = String::new();
    for (i, c) in name.chars().enumerate() {
        if c.is_ascii_uppercase() {
            if i > 0 {
                out.push('_');
            }
            out.push(c.to_ascii_lowercase());
        } else {
            out.push(c);
        }
    }
    out
}

/// The `--json` object of a copy that stopped on an error: the error, its kind and whose
/// fault, and how far the copy had got (from its events), except for a usage error, which
/// stops a copy before it starts; README.md documents it.
fn aborted_json(err: &anyhow::Error, feed: &progress::Feed) -> serde_json::Value {
    let mut value = json!({
        "version": 1,
        "exit_code": exit_code_of(err),
        "error": error_text(err),
    });
    let mut usage = false;
    if let Some(e) = err.downcast_ref::<fastcp::Error>() {
        value["error_kind"] = snake_case(&format!("{:?}", e.kind())).into();
        value["fault"] = snake_case(&format!("{:?}", e.fault())).into();
        usage = e.kind() == fastcp::ErrorKind::Usage;
    }
    if let Some((done, role)) = feed.aborted().filter(|_| !usage) {
        let (files, bytes) = match role {
            Role::Push => (done.files_sent, done.bytes_sent),
            Role::Local | Role::Pull => (done.files_done, done.bytes_done),
        };
        let (failures, count) = feed.failures();
        value["files"] = files.into();
        value["bytes"] = bytes.into();
        value["files_skipped"] = done.files_skipped.into();
        value["bytes_skipped"] = done.bytes_skipped.into();
        value["bytes_resumed"] = done.bytes_resumed.into();
        value["files_deleted"] = done.deleted.into();
        value["error_count"] = count.into();
        value["errors"] = failures.iter().map(failure_json).collect();
    }
    value
}

/// The `--json` summary; README.md documents the schema.
fn summary_json(
    outcome: &fastcp::Outcome,
    exit_code: u8,
    dry_run: bool,
    contents: bool,
) -> serde_json::Value {
    let secs = outcome.elapsed.as_secs_f64();
    // What arrived: a push counts from the receiver's final report, so that a file the
    // remote could not write is not counted as copied (a dry run writes nothing there).
    let arrived = outcome.arrived();
    let mut value = json!({
        "version": 1,
        "exit_code": exit_code,
        "dry_run": dry_run,
        "bytes": arrived.bytes,
        "files": arrived.files,
        "dirs": arrived.dirs,
        "symlinks": arrived.symlinks,
        "files_skipped": outcome.report.files_skipped,
        "bytes_skipped": outcome.report.bytes_skipped,
        "bytes_sent": outcome.report.bytes_sent,
        "bytes_resumed": outcome.report.bytes_resumed,
        // The receiver deletes: this side (pull) or the peer (push).
        "files_deleted": outcome.report.local.deleted + outcome.report.peer.deleted,
        "seconds": secs,
        "throughput_bytes_per_sec": if secs > 0.0 { arrived.bytes as f64 / secs } else { 0.0 },
        "transport": outcome.transport.as_str(),
        "cipher": outcome.cipher.map(|c| c.to_string()),
        "provider": outcome.provider.map(|p| p.to_string()),
        "compression": outcome.compression.map(|c| c.as_str()),
        "streams": outcome.streams,
        "remote": outcome.remote_software.as_deref().map(|s| escape(s.as_bytes())),
        "error_count": outcome.report.failure_count,
        "errors": outcome.report.failures.iter().map(failure_json).collect::<Vec<_>>(),
    });
    if dry_run {
        value["entries"] = outcome
            .listing
            .iter()
            .map(|e| {
                let (kind, size, target) = match &e.kind {
                    EntryKind::Dir => ("dir", None, None),
                    EntryKind::File { size } => ("file", Some(*size), None),
                    EntryKind::Symlink { target } => ("symlink", None, Some(escape(target))),
                    EntryKind::Special { kind, .. } => (special_name(*kind), None, None),
                };
                json!({
                    "path": escape(landing_path(&e.path, contents)),
                    "kind": kind,
                    "size": size,
                    "target": target,
                    "mode": format!("{:04o}", e.meta.mode),
                    "mtime": e.meta.mtime,
                    "action": if e.delete { "delete" } else { "copy" },
                })
            })
            .collect();
    }
    value
}

async fn doctor(args: &DoctorArgs) -> anyhow::Result<u8> {
    let output = Output::default();
    let remote = match Location::try_parse(&args.host)? {
        Location::Remote(r) => r,
        Location::Local(_) => match Location::parse(&format!("{}:", args.host)) {
            Location::Remote(r) => r,
            Location::Local(_) => {
                return Err(fastcp::Error::Usage(format!(
                    "{:?} is not a host; give [user@]host",
                    args.host
                ))
                .into());
            }
        },
    };
    let log = stderr_log(&output, false, args.verbose);
    let options = args.link.options().log(log.clone());
    let ssh = args.ssh.options(&log);
    let probe = fastcp::probe(&remote, &ssh, &options).await?;
    let here = fastcp::crypto::CpuFeatures::probe();
    let providers: Vec<String> = fastcp::crypto::Provider::available()
        .iter()
        .map(ToString::to_string)
        .collect();
    let zstd = probe.compression.contains(&fastcp::compress::ZSTD);
    if !args.json {
        println!("fastcp doctor: {}", remote.host);
        println!(
            "  local:       {} (crypto providers: {}), CPU: {here}",
            fastcp::SOFTWARE,
            providers.join(", ")
        );
        println!(
            "  remote:      {} (protocol {}), CPU: {}",
            escape(probe.software.as_bytes()),
            probe.protocol,
            probe.remote_cpu
        );
        println!("  cipher:      {}", probe.cipher);
        println!(
            "  transport:   {}",
            match probe.tcp_address {
                Some(addr) =>
                    format!("sealed TCP to {addr} (SSH channels if its data port is blocked)"),
                None => "SSH channels".into(),
            }
        );
        println!(
            "  compression: {}",
            if zstd {
                "zstd (-C)"
            } else {
                "not offered by the remote fastcp"
            }
        );
    }
    let measured = if args.seconds > 0.0 {
        let duration = Duration::from_secs_f64(args.seconds.min(600.0));
        Some(fastcp::measure(&remote, &ssh, &options, duration).await?)
    } else {
        None
    };
    if args.json {
        print_json(&json!({
            "version": 1,
            "host": remote.host,
            "local": {
                "software": fastcp::SOFTWARE,
                "providers": providers,
                "cpu_features": here.names(),
            },
            "remote": {
                "software": escape(probe.software.as_bytes()),
                "protocol": probe.protocol,
                "cpu_features": probe.remote_cpu.names(),
                "compression": probe.compression.iter().map(|&c| fastcp::compress::name(c)).collect::<Vec<_>>(),
            },
            "cipher": probe.cipher.suite.to_string(),
            "provider": probe.cipher.provider.to_string(),
            "cipher_reason": probe.cipher.reason.to_string(),
            "transport": probe.transport.as_str(),
            "throughput": measured.as_ref().map(|m| json!({
                "bytes": m.bytes,
                "seconds": m.elapsed.as_secs_f64(),
                "bytes_per_sec": m.bytes_per_sec(),
                "transport": m.transport.as_str(),
                "streams": m.streams,
                "cipher": m.cipher.map(|c| c.to_string()),
            })),
        }))?;
    } else if let Some(m) = &measured {
        println!(
            "  throughput:  {}/s over {}, {} stream(s){} ({} in {:.1}s to a sink on the remote host; no disk written)",
            indicatif::HumanBytes(m.bytes_per_sec() as u64),
            m.transport,
            m.streams,
            m.cipher.map(|c| format!(", {c}")).unwrap_or_default(),
            indicatif::HumanBytes(m.bytes),
            m.elapsed.as_secs_f64(),
        );
    }
    Ok(exit::OK)
}

/// What `fastcp server`'s flags allow its clients.
fn server_policy(args: &ServerArgs) -> fastcp::server::Policy {
    let mut policy = fastcp::server::Policy::default();
    if let Some(root) = &args.restrict_to {
        policy = policy.confined_to(root);
    }
    if args.read_only {
        policy = policy.read_only();
    }
    if args.write_only {
        policy = policy.write_only();
    }
    if args.no_delete {
        policy = policy.no_delete();
    }
    policy
}

async fn server(args: &ServerArgs) -> anyhow::Result<u8> {
    let stdio = fastcp::stdio::Stdio::new();
    let mut config = fastcp::server::ServerConfig::default()
        .policy(server_policy(args))
        // Warnings reach the client's stderr through sshd.
        .log(fastcp::Log::new(|level, line| {
            // Nothing to do about a stderr that sshd no longer reads: the client is gone.
            if level == fastcp::LogLevel::Warn {
                let _ = writeln!(std::io::stderr().lock(), "fastcp server: warning: {line}");
            }
        }));
    config.tcp_bind = args.bind;
    config.tcp_ports = args.ports.map(|(lo, hi)| lo..=hi);
    // The client learns of failures through the protocol and shows them; stderr (which sshd
    // passes on to the client) is for what could not travel that way.
    match fastcp::server::serve(stdio, &config).await {
        Ok(report) => Ok(if report.failures.is_empty() {
            exit::OK
        } else {
            exit::PARTIAL
        }),
        Err(e) => {
            if !told_the_client(&e) {
                let _ = writeln!(std::io::stderr().lock(), "fastcp server: {e}");
            }
            Ok(e.exit_code())
        }
    }
}

/// Whether a server's fatal error reached the client in an `Error` frame (or came from it).
fn told_the_client(e: &fastcp::Error) -> bool {
    match e {
        fastcp::Error::Unsupported(_) => true,
        // The control stream ended or broke: the client ended the session and knows why (a
        // destination it refused, say), or it is gone, and sshd passes stderr on to nobody.
        fastcp::Error::ConnectionClosed(_) => true,
        fastcp::Error::Engine(e) => !e.is_disconnect(),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clap_definition_is_consistent() {
        command().debug_assert();
    }

    #[test]
    fn scp_limit_is_kbit_per_second() {
        let args = Args::try_parse_from(["fastcp", "-l", "800", "a", "b"]).unwrap();
        assert_eq!(args.limit_kbit, Some(800));
        assert!(Args::try_parse_from(["fastcp", "-l", "8", "--bwlimit", "1M", "a", "b"]).is_err());
    }

    /// As scp: a flag given twice is the flag once, an option given twice takes its last
    /// value, and the options that add up still do.
    #[test]
    fn flags_and_options_may_be_repeated() {
        let parse = |args: &[&str]| {
            let mut argv = vec!["fastcp"];
            argv.extend(args);
            argv.extend(["a", "b"]);
            Args::try_parse_from(argv).unwrap_or_else(|e| panic!("{args:?}: {e}"))
        };
        for flag in [
            "-q",
            "-r",
            "-p",
            "-C",
            "-3",
            "-4",
            "-B",
            "-T",
            "-O",
            "-s",
            "-n",
            "-a",
            "-H",
            "-L",
            "-D",
            "-x",
            "-X",
            "-A",
            "--fsync",
            "--checksum",
            "--sftp",
            "--json",
            "--progress",
        ] {
            parse(&[flag, flag]);
        }
        let args = parse(&["-qq", "-rr", "-pp"]);
        assert!(args.quiet && args.recursive && args.preserve);
        let args = parse(&[
            "-P",
            "22",
            "-P",
            "2222",
            "-c",
            "aes128-ctr",
            "-c",
            "aes256-ctr",
        ]);
        assert_eq!(args.ssh.port, Some(2222));
        assert_eq!(args.ssh.ssh_cipher.as_deref(), Some("aes256-ctr"));
        let args = parse(&[
            "-F", "one", "-F", "two", "-S", "x", "-S", "ssh", "-l", "8", "-l", "9",
        ]);
        assert_eq!(args.ssh.config, Some(PathBuf::from("two")));
        assert_eq!(args.ssh.ssh_program, Some(PathBuf::from("ssh")));
        assert_eq!(args.limit_kbit, Some(9));
        let args = parse(&["-j", "2", "-j", "3", "--timeout", "5", "--timeout", "7"]);
        assert_eq!((args.link.streams, args.timeout), (Some(3), 7));
        // What adds up.
        let args = parse(&["-v", "-v", "-i", "k1", "-i", "k2", "-o", "A=1", "-o", "B=2"]);
        assert_eq!(args.verbose, 2);
        assert_eq!(args.ssh.identity.len(), 2);
        assert_eq!(args.ssh.ssh_options, ["A=1", "B=2"]);
        // `-J a -J b` is `-J a,b`.
        let args = parse(&["-J", "a", "-J", "b,c"]);
        let log = Log::new(|_, _| {});
        assert_eq!(args.ssh.options(&log).jump.as_deref(), Some("a,b,c"));
        // And in `fastcp doctor`.
        let args =
            Args::try_parse_from(["fastcp", "doctor", "-P", "1", "-P", "2", "-v", "-v", "h"])
                .unwrap();
        let Some(Command::Doctor(doctor)) = args.command else {
            panic!("not doctor");
        };
        assert_eq!((doctor.ssh.port, doctor.verbose), (Some(2), 2));
    }

    /// As scp (whose ssh sets AddressFamily from each flag in turn): -4 and -6 together are
    /// no error, and the last one given wins.
    #[test]
    fn the_last_of_4_and_6_wins() {
        let log = Log::new(|_, _| {});
        for (flags, family) in [
            (["-4", "-6"], "AddressFamily=inet6"),
            (["-6", "-4"], "AddressFamily=inet"),
            (["-4", "-4"], "AddressFamily=inet"),
        ] {
            let mut argv = vec!["fastcp"];
            argv.extend(flags);
            argv.extend(["a", "b"]);
            let args = Args::try_parse_from(&argv).unwrap_or_else(|e| panic!("{flags:?}: {e}"));
            assert_eq!(args.ssh.options(&log).options, [family], "{flags:?}");
        }
    }

    #[test]
    fn an_io_cause_the_message_already_words_is_not_repeated() {
        let os = std::io::Error::from_raw_os_error(28);
        assert!(says_already("x: no space left on device", &os.to_string()));
        assert!(!says_already("x: permission denied", &os.to_string()));
        let err = anyhow::Error::new(os).context("copying x");
        assert_eq!(
            error_text(&err),
            "copying x: No space left on device (os error 28)"
        );
    }
}
