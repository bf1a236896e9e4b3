//! The client side of a copy: local, push or pull.

use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use fastcp_proto::{Direction, Frame, Join, Rendezvous, Request, TransportKind, flags};
use fastcp_stream::{Failure, WalkConfig, escape};

use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::sync::watch;

use crate::compress::{self, Compression};
use crate::dry_run::{Listed, dry_run, list_local};
use crate::limit::{Limited, RateLimit};
use crate::location::{Location, RemotePath};
use crate::log::Log;
use crate::session::{self, random32};
use crate::wire::FrameReader;
use crate::{BoxStream, Error, Progress, Report};
use fastcp_crypto::{CipherSuite, CpuFeatures, JoinKind, KeyConfig, Provider};
use fastcp_transport::tcp::TcpConfig;
use fastcp_transport::{self as transport, AnyTransport, SshOptions, Transport};
use std::net::{IpAddr, SocketAddr};

/// Which transport carries the data. More choices may come, so the enum is
/// `#[non_exhaustive]`: a `match` on it needs a `_` arm.
///
/// ```compile_fail,E0004
/// use fastcp::TransportChoice;
///
/// fn word(choice: TransportChoice) -> &'static str {
///     match choice {
///         TransportChoice::Auto => "auto",
///         TransportChoice::Ssh => "ssh",
///         TransportChoice::Tcp => "tcp",
///     }
/// }
/// ```
#[non_exhaustive]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TransportChoice {
    /// Raw TCP when the server's port is reachable, SSH channels otherwise.
    #[default]
    Auto,
    /// SSH channels only.
    Ssh,
    /// Raw TCP data streams sealed with fastcp's AEAD; fail if they cannot connect.
    Tcp,
}

/// The transport that carried a copy's data ([`Outcome::transport`]): what the
/// [`TransportChoice`] came to. `Display` and [`as_str`](Self::as_str) give the word the
/// `fastcp` command's `--json` output and messages use.
///
/// ```
/// use fastcp::TransportUsed;
///
/// assert_eq!(TransportUsed::Tcp.as_str(), "tcp");
/// assert_eq!(TransportUsed::TcpThenSsh.to_string(), "tcp+ssh");
/// ```
#[non_exhaustive]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TransportUsed {
    /// None: a copy within this machine ("local").
    Local,
    /// SSH channels ("ssh").
    Ssh,
    /// Sealed TCP data streams ("tcp").
    Tcp,
    /// SFTP, where no fastcp could run on the remote host, or when asked for ("sftp").
    Sftp,
    /// A copy between two remote hosts: sealed TCP from the source host, SSH channels to
    /// the target ("tcp+ssh"). Where both hosts took the same transport, it is that one.
    TcpThenSsh,
    /// A copy between two remote hosts: SSH channels from the source host, sealed TCP to
    /// the target ("ssh+tcp").
    SshThenTcp,
}

impl TransportUsed {
    /// Its word: "local", "ssh", "tcp", "sftp", "tcp+ssh" or "ssh+tcp".
    pub fn as_str(self) -> &'static str {
        match self {
            TransportUsed::Local => "local",
            TransportUsed::Ssh => "ssh",
            TransportUsed::Tcp => "tcp",
            TransportUsed::Sftp => "sftp",
            TransportUsed::TcpThenSsh => "tcp+ssh",
            TransportUsed::SshThenTcp => "ssh+tcp",
        }
    }
}

impl std::fmt::Display for TransportUsed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What to copy and how. The defaults copy like `scp` without flags.
///
/// Build it from [`CopyOptions::default`] with its builder methods, one per field, each
/// named as the field it sets; new options arrive as new fields and methods, so the type is
/// `#[non_exhaustive]`.
///
/// ```
/// use std::time::Duration;
/// use fastcp::CopyOptions;
///
/// let nightly = CopyOptions::default()
///     .recursive(true)
///     .skip_unchanged(true)
///     .resume(true)
///     .timeout(Duration::from_secs(60));
/// assert!(nightly.recursive && nightly.resume);
/// ```
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub struct CopyOptions {
    /// Copy directories recursively (`-r`).
    pub recursive: bool,
    /// Preserve modes, modification and access times, and symlinks' times (`-p`).
    pub preserve: bool,
    /// Follow symbolic links instead of copying them as links.
    pub follow_links: bool,
    /// Number of data streams; `None` picks a default for the transport.
    pub streams: Option<u16>,
    /// Which transport to use for a remote copy.
    pub transport: TransportChoice,
    /// Force a cipher suite instead of choosing from both CPUs.
    pub cipher: Option<fastcp_crypto::CipherSuite>,
    /// Chunk size for splitting big files; `None` uses the engine's default.
    pub chunk_size: Option<usize>,
    /// The ports the server may listen on for TCP data streams, inclusive; `None` lets it
    /// choose.
    pub tcp_ports: Option<(u16, u16)>,
    /// List what would be copied in [`Outcome::listing`] and write nothing (`-n`). A pull
    /// asks the server for the listing; a push checks that the server accepts the target.
    pub dry_run: bool,
    /// Compress the data streams with zstd (`-C`) when the server offers it; without that
    /// offer the copy goes on uncompressed, with a warning in the [`Log`].
    pub compress: bool,
    /// The most bytes a second all data streams together may carry (`-l`, `--bwlimit`);
    /// `None` or `Some(0)` for no limit. Counts the bytes on the wire, after compression.
    pub bwlimit: Option<u64>,
    /// Flush each file to stable storage before it takes its final name, and the directories
    /// written into before reporting success (`--fsync`), on whichever side receives. See
    /// [`fastcp_stream::ReceiveConfig::fsync`].
    pub fsync: bool,
    /// The quick check (`--skip-unchanged`): a file the receiver already has with the same
    /// size and modification time is not sent. It implies [`preserve`](Self::preserve), since
    /// times only match if the copy keeps them. Needs protocol version 4 on both ends.
    pub skip_unchanged: bool,
    /// Mirror (`--delete`): remove from each directory copied what the destination holds and
    /// the source does not, only beneath the destination and never through a symlink. See
    /// [`fastcp_stream::ReceiveConfig::delete`].
    pub delete: bool,
    /// With [`delete`](Self::delete): remove at most this many entries (`--max-delete N`,
    /// rsync's; a directory counts with everything in it, and `0` removes nothing but
    /// reports what would go). Extras are removed whole, in name order, folder by folder,
    /// until the next would go past the limit; the rest stay and the copy reports them
    /// with [`ErrorCode::DeleteLimit`](fastcp_stream::ErrorCode::DeleteLimit), exit code
    /// [`exit::DELETE_LIMIT`](crate::exit::DELETE_LIMIT). A guard for nightly mirrors
    /// against a source that came up empty. Needs protocol version 12 on the receiving side.
    pub max_delete: Option<u64>,
    /// With [`delete`](Self::delete): remove what the [`filter`](Self::filter)'s rules and
    /// predicate exclude too (rsync's `--delete-excluded`), where `--delete` alone keeps it.
    /// What lies outside a `--files-from` list is still kept.
    /// [`CopyOptions::delete_excluded`] sets `delete` with it, as rsync's option implies
    /// `--delete`.
    pub delete_excluded: bool,
    /// Never upload fastcp to a remote host that lacks it (`--no-deploy`); see
    /// [`crate::deploy`]. Self-deploy also stays off when the remote program is named
    /// ([`SshOptions::remote_path`]); it works the same through the system ssh program.
    pub no_deploy: bool,
    /// Never fall back to SFTP (`--no-sftp-fallback`): a copy to or from a host that has no
    /// fastcp, and where none can be deployed, fails with
    /// [`ErrorKind::RemoteProgramMissing`](crate::ErrorKind::RemoteProgramMissing) instead
    /// of going over SFTP. For a program that wants what only fastcp on both ends gives
    /// (each file verified where it lands, folders flushed with `--fsync`, the quick
    /// check's speed).
    pub no_sftp_fallback: bool,
    /// Give up when no data has moved for this long once the copy's data is flowing: a peer
    /// that stopped answering, a link that dropped without a reset (`--timeout SECS`). The
    /// copy then ends with [`Error::Timeout`] (exit code 3). `None` waits forever; the
    /// command's default is [`DEFAULT_TIMEOUT`]. It also sets the SSH keepalive (a third of
    /// it) when ssh_config sets none, and, when ssh_config sets no ConnectTimeout, how long
    /// the SSH handshake may wait for the server.
    pub timeout: Option<Duration>,
    /// The quick check by content (`--checksum`): a file the receiver has with the same size
    /// and the same content hash (XXH3-128, computed on each side, in parallel) is not sent.
    /// Needs protocol version 4 on both ends.
    pub checksum: bool,
    /// Continue partial files (`--resume`): a file bigger than 4 MiB that a stopped copy
    /// left incomplete (cut connection, Ctrl-C, kill, full disk) is kept by the receiver
    /// under a hidden temp name (`.NAME.fastcp-partial`), and the next copy with `resume`
    /// sends only the blocks of it that differ; the whole file is still verified before it
    /// takes its final name. It implies the quick check ([`skip_unchanged`]), so files
    /// already complete are skipped. Needs protocol version 4 on both ends; over SFTP, see
    /// [`crate::sftp`].
    ///
    /// [`skip_unchanged`]: Self::skip_unchanged
    pub resume: bool,
    /// Keep hard links (`-H`): a file's further names arrive as names of the same file, not
    /// as copies. Needs protocol version 4 on both ends.
    pub hard_links: bool,
    /// A reference folder on the receiving side (`--link-dest DIR`, rsync's): a file that
    /// the destination does not hold alike, but `DIR` does (at the same path, with the same
    /// size and time, and mode and owner where they are kept), becomes a hard link to
    /// `DIR`'s file instead of being sent: each night's backup is a full tree that costs
    /// only what changed. A relative `DIR` is taken from the destination. It implies the
    /// quick check ([`skip_unchanged`](Self::skip_unchanged)); not with
    /// [`checksum`](Self::checksum), nor on a push over SFTP. Needs protocol version 10 on
    /// both ends. See [`fastcp_stream::ReceiveConfig::link_dest`].
    pub link_dest: Option<PathBuf>,
    /// Keep owners, groups, extended attributes or ACLs (`--owner`, `--group`,
    /// `--numeric-ids`, `-X`, `-A`); see [`fastcp_stream::KeepAttrs`]. Not over SFTP.
    pub attrs: fastcp_stream::KeepAttrs,
    /// Copy device nodes (`--devices`): only a receiving side running as root can make
    /// them. Without it each is skipped and reported as a failed entry
    /// ([`ErrorCode::Unsupported`](fastcp_stream::ErrorCode::Unsupported)). Not over SFTP.
    pub devices: bool,
    /// Copy named pipes and sockets (`--specials`; a socket arrives as its name, not a
    /// listening socket). Without it each is skipped and reported as a failed entry, as
    /// for [`devices`](Self::devices). Not over SFTP.
    pub specials: bool,
    /// Leave more files as they are than the quick check does (`--size-only`,
    /// `--ignore-existing`, `--update`); see [`fastcp_stream::SkipRules`]. Any of them
    /// implies [`skip_unchanged`](Self::skip_unchanged) and is refused with
    /// [`checksum`](Self::checksum). Needs protocol version 11 on the receiving side; not
    /// over SFTP.
    pub skip_rules: fastcp_stream::SkipRules,
    /// Do not descend into directories on another file system than their source (`-x`,
    /// `--one-file-system`, as rsync's): each mount point beneath a source arrives as an
    /// empty directory. A pull needs fastcp with protocol version 11 on the remote side,
    /// and is refused over SFTP, whose listings carry no device numbers. With
    /// [`delete`](Self::delete), what the receiving side holds beneath a mount point is
    /// left alone, as rsync leaves it (a push needs protocol version 11 on the remote side
    /// then).
    pub one_file_system: bool,
    /// Include and exclude rules for what is copied, with rsync's meaning
    /// (`--include`, `--exclude`, `--exclude-from`); see [`fastcp_stream::Filter`]. They
    /// travel to the remote side for a pull, and protect what they exclude from `--delete`.
    /// A [`predicate`](fastcp_stream::Filter::with_predicate) only applies to local sources.
    pub filter: Option<Arc<fastcp_stream::Filter>>,
    /// Cancels the copy when triggered, as dropping its future does: it stops at once on
    /// this side (the peer notices the closed connection), its temp files are removed, and
    /// the call returns [`Error::Cancelled`].
    pub cancel: Option<tokio_util::sync::CancellationToken>,
    /// Where self-deploy finds `cargo xtask dist` binaries for remotes this program cannot
    /// run on (`--deploy-from`).
    pub deploy_from: Option<std::path::PathBuf>,
    /// Copy over the remote's stock SFTP subsystem, without fastcp there (`--sftp`); see
    /// [`crate::sftp`]. A copy also takes this path by itself when the remote has no fastcp
    /// and none can run there, or none may be uploaded ([`no_deploy`](Self::no_deploy)).
    pub sftp: bool,
    /// Copy only share `I` of `N` of the files (`--shard I/N`): `N` runs, anywhere, each with
    /// its own `I`, together copy everything exactly once. See [`crate::shard`]. Local
    /// sources only; not with [`delete`](Self::delete).
    pub shard: Option<crate::shard::Shard>,
    /// Where the copy reports its steps and choices.
    pub log: Log,
}

/// Builder methods, one per field.
impl CopyOptions {
    /// Sets [`recursive`](CopyOptions::recursive).
    pub fn recursive(mut self, value: bool) -> CopyOptions {
        self.recursive = value;
        self
    }

    /// Sets [`preserve`](CopyOptions::preserve).
    pub fn preserve(mut self, value: bool) -> CopyOptions {
        self.preserve = value;
        self
    }

    /// Sets [`follow_links`](CopyOptions::follow_links).
    pub fn follow_links(mut self, value: bool) -> CopyOptions {
        self.follow_links = value;
        self
    }

    /// Sets [`streams`](CopyOptions::streams).
    pub fn streams(mut self, value: u16) -> CopyOptions {
        self.streams = Some(value);
        self
    }

    /// Sets [`transport`](CopyOptions::transport).
    pub fn transport(mut self, value: TransportChoice) -> CopyOptions {
        self.transport = value;
        self
    }

    /// Sets [`cipher`](CopyOptions::cipher).
    pub fn cipher(mut self, value: fastcp_crypto::CipherSuite) -> CopyOptions {
        self.cipher = Some(value);
        self
    }

    /// Sets [`chunk_size`](CopyOptions::chunk_size).
    pub fn chunk_size(mut self, value: usize) -> CopyOptions {
        self.chunk_size = Some(value);
        self
    }

    /// Sets [`tcp_ports`](CopyOptions::tcp_ports).
    pub fn tcp_ports(mut self, value: (u16, u16)) -> CopyOptions {
        self.tcp_ports = Some(value);
        self
    }

    /// Sets [`dry_run`](CopyOptions::dry_run).
    pub fn dry_run(mut self, value: bool) -> CopyOptions {
        self.dry_run = value;
        self
    }

    /// Sets [`compress`](CopyOptions::compress).
    pub fn compress(mut self, value: bool) -> CopyOptions {
        self.compress = value;
        self
    }

    /// Sets [`bwlimit`](CopyOptions::bwlimit).
    pub fn bwlimit(mut self, value: u64) -> CopyOptions {
        self.bwlimit = Some(value);
        self
    }

    /// Sets [`fsync`](CopyOptions::fsync).
    pub fn fsync(mut self, value: bool) -> CopyOptions {
        self.fsync = value;
        self
    }

    /// Sets [`link_dest`](CopyOptions::link_dest).
    pub fn link_dest(mut self, value: impl Into<PathBuf>) -> CopyOptions {
        self.link_dest = Some(value.into());
        self
    }

    /// Sets [`skip_unchanged`](CopyOptions::skip_unchanged).
    pub fn skip_unchanged(mut self, value: bool) -> CopyOptions {
        self.skip_unchanged = value;
        self
    }

    /// Sets [`delete`](CopyOptions::delete).
    pub fn delete(mut self, value: bool) -> CopyOptions {
        self.delete = value;
        self
    }

    /// Sets [`delete_excluded`](CopyOptions::delete_excluded), and with it
    /// [`delete`](CopyOptions::delete).
    pub fn delete_excluded(mut self, value: bool) -> CopyOptions {
        self.delete_excluded = value;
        self.delete |= value;
        self
    }

    /// Sets [`max_delete`](CopyOptions::max_delete).
    pub fn max_delete(mut self, value: Option<u64>) -> CopyOptions {
        self.max_delete = value;
        self
    }

    /// Sets [`no_deploy`](CopyOptions::no_deploy).
    pub fn no_deploy(mut self, value: bool) -> CopyOptions {
        self.no_deploy = value;
        self
    }

    /// Sets [`no_sftp_fallback`](CopyOptions::no_sftp_fallback).
    pub fn no_sftp_fallback(mut self, value: bool) -> CopyOptions {
        self.no_sftp_fallback = value;
        self
    }

    /// Sets [`timeout`](CopyOptions::timeout).
    pub fn timeout(mut self, value: Duration) -> CopyOptions {
        self.timeout = Some(value);
        self
    }

    /// Sets [`checksum`](CopyOptions::checksum).
    pub fn checksum(mut self, value: bool) -> CopyOptions {
        self.checksum = value;
        self
    }

    /// Sets [`resume`](CopyOptions::resume).
    pub fn resume(mut self, value: bool) -> CopyOptions {
        self.resume = value;
        self
    }

    /// Sets [`hard_links`](CopyOptions::hard_links).
    pub fn hard_links(mut self, value: bool) -> CopyOptions {
        self.hard_links = value;
        self
    }

    /// Sets [`attrs`](CopyOptions::attrs).
    ///
    /// ```
    /// use fastcp::{CopyOptions, KeepAttrs};
    ///
    /// let backup = CopyOptions::default()
    ///     .recursive(true)
    ///     .preserve(true)
    ///     .attrs(KeepAttrs { owner: true, group: true, xattrs: true, ..KeepAttrs::default() });
    /// assert!(backup.attrs.owner);
    /// ```
    pub fn attrs(mut self, value: fastcp_stream::KeepAttrs) -> CopyOptions {
        self.attrs = value;
        self
    }

    /// Sets [`devices`](CopyOptions::devices).
    pub fn devices(mut self, value: bool) -> CopyOptions {
        self.devices = value;
        self
    }

    /// Sets [`specials`](CopyOptions::specials).
    pub fn specials(mut self, value: bool) -> CopyOptions {
        self.specials = value;
        self
    }

    /// Sets [`skip_rules`](CopyOptions::skip_rules).
    pub fn skip_rules(mut self, value: fastcp_stream::SkipRules) -> CopyOptions {
        self.skip_rules = value;
        self
    }

    /// Sets [`one_file_system`](CopyOptions::one_file_system).
    pub fn one_file_system(mut self, value: bool) -> CopyOptions {
        self.one_file_system = value;
        self
    }

    /// Sets [`filter`](CopyOptions::filter).
    pub fn filter(mut self, value: fastcp_stream::Filter) -> CopyOptions {
        self.filter = Some(Arc::new(value));
        self
    }

    /// Sets [`cancel`](CopyOptions::cancel).
    pub fn cancel(mut self, value: tokio_util::sync::CancellationToken) -> CopyOptions {
        self.cancel = Some(value);
        self
    }

    /// Sets [`deploy_from`](CopyOptions::deploy_from).
    pub fn deploy_from(mut self, value: impl Into<std::path::PathBuf>) -> CopyOptions {
        self.deploy_from = Some(value.into());
        self
    }

    /// Sets [`sftp`](CopyOptions::sftp).
    pub fn sftp(mut self, value: bool) -> CopyOptions {
        self.sftp = value;
        self
    }

    /// Sets [`shard`](CopyOptions::shard).
    pub fn shard(mut self, value: crate::shard::Shard) -> CopyOptions {
        self.shard = Some(value);
        self
    }

    /// Sets [`log`](CopyOptions::log).
    pub fn log(mut self, value: Log) -> CopyOptions {
        self.log = value;
        self
    }
}

/// How a finished copy went.
#[non_exhaustive]
#[derive(Debug, Clone)]
pub struct Outcome {
    /// What the engine counted, with per-file failures. `report.local` is this side's count:
    /// what was written for a local copy or a pull, but what was sent for a push, where what
    /// arrived (less the files the remote side could not write) is `report.peer`.
    pub report: Report,
    /// The transport that carried the data.
    pub transport: TransportUsed,
    /// The data streams used.
    pub streams: usize,
    /// The AEAD suite sealing the data, where fastcp seals it itself.
    pub cipher: Option<fastcp_crypto::CipherSuite>,
    /// The library running that suite on this side.
    pub provider: Option<Provider>,
    /// The compression the data streams used, if any.
    pub compression: Option<Compression>,
    /// The remote side's software string, such as "fastcp 0.1.0", for a remote copy. It came
    /// from the peer: escape it before printing.
    pub remote_software: Option<String>,
    /// For a dry run, what would be copied, in walk order.
    pub listing: Vec<Listed>,
    /// Wall-clock time of the whole copy.
    pub elapsed: Duration,
    /// Whether the remote side wrote the copy (a push, or a copy between two remote hosts,
    /// not a dry run): what arrived is then its count, `report.peer`.
    peer_wrote: bool,
}

impl Outcome {
    /// What arrived at the destination, as the side that wrote it counted: `report.local`
    /// for a local copy, a pull or a dry run, `report.peer` for a push (and a copy between
    /// two remote hosts), where `report.local` is what was sent, the files the remote side
    /// could not write included. The command line's `--json` `files` and `bytes` are these.
    ///
    /// ```no_run
    /// # async fn run(plan: fastcp::Plan, ssh: fastcp::transport::SshOptions) -> Result<(), fastcp::Error> {
    /// let outcome = fastcp::copy_remote(&plan, &ssh, Default::default()).await?;
    /// let arrived = outcome.arrived();
    /// println!("{} files, {} bytes arrived", arrived.files, arrived.bytes);
    /// # Ok(())
    /// # }
    /// ```
    pub fn arrived(&self) -> &fastcp_proto::Summary {
        if self.peer_wrote {
            &self.report.peer
        } else {
            &self.report.local
        }
    }
}

/// A copy that can run: checked operands and options. Made by [`Plan::new`] only, so that
/// what it checks holds; read it back with [`Plan::sources`], [`Plan::dest`] and
/// [`Plan::options`].
#[derive(Debug, Clone)]
pub struct Plan {
    /// The sources, all local or all on one remote host.
    pub(crate) sources: Vec<Location>,
    /// The destination.
    pub(crate) dest: Location,
    /// How to copy.
    pub(crate) options: CopyOptions,
    /// With `--shard`: the files of which this run sends some ranges only.
    pieces: Option<Arc<std::collections::HashMap<Bytes, Vec<fastcp_stream::Piece>>>>,
    /// A push's walk of its sources, started before the connection (see
    /// [`Plan::walking_ahead`]).
    walk_ahead: Option<fastcp_stream::WalkAhead>,
    /// For a copy between two remote hosts: which of its two sessions this plan runs.
    pub(crate) relay: Option<crate::relay::Half>,
}

impl Plan {
    /// Checks the operands the way scp does: at least one source, and the sources all local
    /// or all on one remote host. Sources on one host and a target on another (or the same)
    /// host make a copy between two remote hosts, through this machine, as `scp -3` copies:
    /// run it with [`copy_remote`] or [`Session::relay`](crate::Session::relay).
    pub fn new(
        sources: Vec<Location>,
        dest: Location,
        options: CopyOptions,
    ) -> Result<Plan, Error> {
        if sources.is_empty() {
            return Err(Error::Usage("no source given".into()));
        }
        if options.delete && !options.recursive {
            return Err(Error::Usage(
                "--delete mirrors directories: it needs -r".into(),
            ));
        }
        if options.delete_excluded && !options.delete {
            return Err(Error::Usage(
                "--delete-excluded widens what --delete removes: it needs --delete".into(),
            ));
        }
        if options.max_delete.is_some() && !options.delete {
            return Err(Error::Usage(
                "--max-delete limits what --delete removes: it needs --delete".into(),
            ));
        }
        if options.skip_rules.any() && options.checksum {
            return Err(Error::Usage(
                "--size-only, --ignore-existing and --update judge by sizes and times, not \
                 --checksum's hashes: use one or the other"
                    .into(),
            ));
        }
        if options.link_dest.is_some() && options.checksum {
            return Err(Error::Usage(
                "--link-dest compares sizes and times, not --checksum's hashes: use one of them"
                    .into(),
            ));
        }
        let remote_sources = sources.iter().filter(|s| s.remote().is_some()).count();
        if remote_sources > 0 && remote_sources < sources.len() {
            return Err(Error::Usage(
                "sources must be all local or all on one remote host".into(),
            ));
        }
        if remote_sources > 0 {
            // A user left out may be the one named elsewhere: the session checks the logins
            // once ssh_config is read.
            let first = sources[0].remote().expect("remote");
            if sources.iter().filter_map(Location::remote).any(|r| {
                (&r.host, r.port) != (&first.host, first.port)
                    || matches!((&r.user, &first.user), (Some(a), Some(b)) if a != b)
            }) {
                return Err(Error::Usage(
                    "remote sources must all be on the same host".into(),
                ));
            }
        }
        if sources.len() > 1 && sources.iter().any(names_contents) {
            return Err(Error::Usage(
                "a folder's contents (DIR/.) go straight into the target: name it as the only \
                 source"
                    .into(),
            ));
        }
        // A partial file's name follows its target's: two sources that land on one target
        // would share one.
        if options.resume {
            let mut names = std::collections::HashSet::new();
            for source in &sources {
                let name = match source {
                    Location::Local(p) => p.file_name().map(|n| n.as_bytes().to_vec()),
                    Location::Remote(r) => top_level_name(&r.path),
                };
                if let Some(name) = name
                    && !fastcp_stream::has_wildcard(&name)
                    && !names.insert(name.clone())
                {
                    return Err(Error::Usage(format!(
                        "{}: two sources of this name would land on one target; with \
                         --resume, copy them in separate runs",
                        crate::stream::escape(&name)
                    )));
                }
            }
        }
        // The rules of a copy of a folder's contents match beneath it, as rsync's do for
        // `DIR/`: `/build` is `DIR/build`.
        let mut options = options;
        if sources.len() == 1
            && names_contents(&sources[0])
            && let Some(filter) = &options.filter
        {
            options.filter = Some(Arc::new(filter.as_ref().clone().rooted_in_source()));
        }
        Ok(Plan {
            sources,
            dest,
            options,
            pieces: None,
            walk_ahead: None,
            relay: None,
        })
    }

    /// Whether the sources are on one remote host and the target on another (or the same):
    /// a copy between two remote hosts, through this machine.
    pub fn is_relay(&self) -> bool {
        self.dest.remote().is_some() && self.sources.iter().any(|s| s.remote().is_some())
    }

    /// The plan for `half`'s session of a copy between two remote hosts.
    pub(crate) fn relaying(&self, half: crate::relay::Half) -> Plan {
        Plan {
            relay: Some(half),
            ..self.clone()
        }
    }

    /// The sources, all local or all on one remote host.
    pub fn sources(&self) -> &[Location] {
        &self.sources
    }

    /// The destination.
    pub fn dest(&self) -> &Location {
        &self.dest
    }

    /// How to copy.
    pub fn options(&self) -> &CopyOptions {
        &self.options
    }

    /// For a push: the plan with the walk of its sources started, on a thread of its own,
    /// so that the sender finds the tree read when the connection is up (the walk is its
    /// first work, and a login takes as long as a walk of tens of thousands of files). The
    /// plan as it is otherwise, and for a dry run or a `--shard` (which walks first).
    pub(crate) fn walking_ahead(&self) -> Plan {
        let mut plan = self.clone();
        if self.dest.remote().is_some() && !self.options.dry_run && self.options.shard.is_none() {
            let config = self.send_config();
            plan.walk_ahead = Some(fastcp_stream::WalkAhead::start(
                &self.local_sources(),
                &config.walk_config(),
            ));
        }
        plan
    }

    /// The walk [`walking_ahead`](Plan::walking_ahead) started, if any.
    pub(crate) fn walk_ahead(&self) -> Option<fastcp_stream::WalkAhead> {
        self.walk_ahead.clone()
    }

    /// With `--shard`: whether this run sends some files in pieces (see [`crate::shard`]).
    pub(crate) fn has_pieces(&self) -> bool {
        self.pieces.is_some()
    }

    /// The host whose server this plan's session runs with, as `[user@]host`: for a copy
    /// between two remote hosts, the one of the half it runs.
    pub(crate) fn server_host(&self) -> Option<String> {
        let remote = match &self.relay {
            Some(half) if half.end == crate::relay::End::Source => {
                self.sources.first().and_then(Location::remote)
            }
            Some(_) => self.dest.remote(),
            None => self.remote(),
        }?;
        Some(match &remote.user {
            Some(user) => format!("{user}@{}", remote.host),
            None => remote.host.clone(),
        })
    }

    /// The remote host, if any.
    pub fn remote(&self) -> Option<&RemotePath> {
        self.dest
            .remote()
            .or_else(|| self.sources.first().and_then(Location::remote))
    }

    /// True when the one source names a folder's contents (`DIR/.`): they go straight into
    /// the target, as `cp -r DIR/. DEST` puts them, rather than in a folder of DIR's name
    /// beneath it. A dry run's [`Listed`] paths then still start with DIR's name, which
    /// the destination leaves out.
    pub fn contents(&self) -> bool {
        self.sources.len() == 1 && names_contents(&self.sources[0])
    }

    /// True when the destination must be a directory: several sources, a trailing '/', or a
    /// remote source whose name has wildcards (it may match several entries; checking before
    /// anything is written beats finding out at the second match).
    pub(crate) fn target_is_dir(&self) -> bool {
        self.dest_has_slash() || self.remote_wildcard() || self.sources.len() > 1
    }

    /// Whether the destination ends with '/'.
    fn dest_has_slash(&self) -> bool {
        match &self.dest {
            Location::Local(p) => p.as_os_str().as_bytes().ends_with(b"/"),
            Location::Remote(r) => r.path.ends_with('/'),
        }
    }

    /// Whether a remote source's name has wildcards (it may match several entries).
    fn remote_wildcard(&self) -> bool {
        self.sources
            .iter()
            .filter_map(Location::remote)
            .any(|r| top_level_name(&r.path).is_some_and(|n| fastcp_stream::has_wildcard(&n)))
    }

    /// True when the destination must be a directory only because of its trailing '/', after
    /// one source: one that does not exist yet is then made by that source, which must be a
    /// folder (`fastcp -r dir new/` makes `new`, as scp and `cp -r` do).
    /// A local source is known to be one: when it is not, the destination must exist.
    pub(crate) fn new_target_dir(&self) -> bool {
        self.dest_has_slash()
            && self.sources.len() == 1
            && !self.remote_wildcard()
            && match &self.sources[0] {
                Location::Local(source) => source.is_dir(),
                Location::Remote(_) => true,
            }
    }

    fn send_config(&self) -> fastcp_stream::SendConfig {
        let mut cfg = fastcp_stream::SendConfig {
            recursive: self.options.recursive,
            preserve: self.preserve(),
            follow_links: self.options.follow_links,
            skip_unchanged: self.probing(),
            checksum: self.options.checksum,
            resume: self.options.resume,
            filter: self.options.filter.clone(),
            hard_links: self.options.hard_links,
            attrs: self.options.attrs,
            devices: self.options.devices,
            specials: self.options.specials,
            one_file_system: self.options.one_file_system,
            pieces: self.pieces.clone(),
            walk_ahead: self.walk_ahead.clone(),
            // A local copy's two sides share their buffers; `run_session` turns hashing
            // back on unless the streams authenticate every byte end to end.
            hash_content: false,
            ..Default::default()
        };
        if let Some(c) = self.options.chunk_size {
            cfg.chunk_size = c;
        }
        cfg
    }

    pub(crate) fn receive_config(&self) -> fastcp_stream::ReceiveConfig {
        fastcp_stream::ReceiveConfig {
            recursive: self.options.recursive,
            preserve: self.preserve(),
            target_must_be_dir: self.target_is_dir(),
            target_may_be_new_dir: self.new_target_dir(),
            contents: self.contents(),
            fsync: self.options.fsync,
            skip_unchanged: self.probing(),
            checksum: self.options.checksum,
            resume: self.options.resume,
            delete: self.options.delete,
            max_delete: self.options.max_delete,
            filter: self.spared(),
            hard_links: self.options.hard_links,
            attrs: self.options.attrs,
            devices: self.options.devices,
            specials: self.options.specials,
            link_dest: self.options.link_dest.clone(),
            skip_rules: self.options.skip_rules,
            // As in `send_config`.
            hash_content: false,
            ..Default::default()
        }
    }

    /// Whether the sender asks before sending each file: the quick check by times or by
    /// content, and resume, which implies it.
    pub(crate) fn probing(&self) -> bool {
        self.options.skip_unchanged
            || self.options.checksum
            || self.options.resume
            || self.options.link_dest.is_some()
            || self.options.skip_rules.any()
    }

    /// Whether modes and times are kept: `-p`, or the quick check by times, whose times must
    /// match.
    fn preserve(&self) -> bool {
        self.options.preserve
            || self.options.skip_unchanged
            || ((self.options.resume
                || self.options.link_dest.is_some()
                || self.options.skip_rules.any())
                && !self.options.checksum)
    }

    fn flags(&self) -> u32 {
        let mut f = 0;
        if self.options.recursive {
            f |= flags::RECURSIVE;
        }
        if self.preserve() {
            f |= flags::PRESERVE;
        }
        if self.probing() {
            f |= flags::SKIP_UNCHANGED;
        }
        if self.options.checksum {
            f |= flags::CHECKSUM;
        }
        if self.options.resume {
            f |= flags::RESUME;
        }
        if self.options.delete {
            f |= flags::DELETE;
        }
        if self.options.delete && self.options.max_delete.is_some() {
            f |= flags::MAX_DELETE;
        }
        if self.options.link_dest.is_some() {
            f |= flags::LINK_DEST;
        }
        f |= self.options.skip_rules.flags();
        if self.options.hard_links {
            f |= flags::HARD_LINKS;
        }
        f |= self.options.attrs.flags();
        if self.options.devices {
            f |= flags::DEVICES;
        }
        if self.options.specials {
            f |= flags::SPECIALS;
        }
        if self.options.follow_links {
            f |= flags::FOLLOW_LINKS;
        }
        if self.options.one_file_system {
            f |= flags::ONE_FILE_SYSTEM;
        }
        if self.options.fsync {
            f |= flags::FSYNC;
        }
        if self.target_is_dir() {
            f |= flags::TARGET_IS_DIR;
        }
        // A pull places the contents here; only a push asks the server to.
        if self.contents() && self.dest.remote().is_some() {
            f |= flags::CONTENTS;
        }
        f
    }

    /// The bandwidth limit, if any.
    pub(crate) fn rate_limit(&self) -> Option<Arc<RateLimit>> {
        self.options
            .bwlimit
            .filter(|&rate| rate > 0)
            .map(RateLimit::new)
    }

    /// A push of regular files that together fit in one chunk: each travels whole on one
    /// stream, so a second stream over SSH would only add its login to the copy's time.
    pub(crate) fn fits_one_stream(&self) -> bool {
        let chunk = self
            .options
            .chunk_size
            .unwrap_or(fastcp_stream::DEFAULT_CHUNK_SIZE) as u64;
        self.pushes_files_within(chunk)
    }

    /// Whether this is a push of regular files only (no folder), `bytes` at most together.
    pub(crate) fn pushes_files_within(&self, bytes: u64) -> bool {
        let mut total = 0u64;
        for source in &self.sources {
            let Location::Local(path) = source else {
                return false;
            };
            // A symlink named as a source is followed (as the walk follows it).
            match std::fs::metadata(path) {
                Ok(m) if m.is_file() => total = total.saturating_add(m.len()),
                _ => return false,
            }
        }
        total <= bytes
    }

    /// The plan with `--shard` applied: its filter narrowed to this run's share, found by
    /// walking the sources first (see [`crate::shard`]). Without a shard, a copy of itself.
    pub(crate) async fn sharded(&self) -> Result<Plan, Error> {
        let Some(shard) = self.options.shard else {
            return Ok(self.clone());
        };
        if self.sources.iter().any(|s| s.remote().is_some()) {
            return Err(Error::Usage(
                "--shard splits local sources: run it where the files are (a push or a local \
                 copy)"
                    .into(),
            ));
        }
        if self.options.delete {
            return Err(Error::Usage(
                "--shard and --delete do not go together: each run would delete what the \
                 others copy"
                    .into(),
            ));
        }
        let mut config = WalkConfig::new(self.options.recursive, self.options.follow_links);
        config.filter = self.options.filter.clone();
        config.one_file_system = self.options.one_file_system;
        let sources = self.local_sources();
        let share =
            tokio::task::spawn_blocking(move || crate::shard::plan(&sources, &config, shard))
                .await
                .map_err(|e| Error::Io(std::io::Error::other(e)))??;
        self.options.log.info(|| {
            format!(
                "shard {shard}: {} of {} files and links ({} of them in pieces), {} of {} bytes",
                share.files.len(),
                share.total_files,
                share.pieces.len(),
                share.bytes,
                share.total_bytes
            )
        });
        if self.options.hard_links && share.cut_files > 0 {
            return Err(Error::Usage(
                "-H with a --shard that cuts files into pieces: a file's other names would be \
                 linked before its last piece arrives; run without -H, or with fewer shards"
                    .into(),
            ));
        }
        let mut plan = self.clone();
        plan.pieces = (!share.pieces.is_empty()).then(|| Arc::new(share.pieces.clone()));
        plan.options.filter = Some(crate::shard::narrow(self.options.filter.clone(), share));
        Ok(plan)
    }

    /// What the receiving side's `--delete` spares: what the filter leaves out, or with
    /// `delete_excluded`, what lies outside its `--files-from` list alone.
    pub(crate) fn spared(&self) -> Option<Arc<fastcp_stream::Filter>> {
        let filter = self.options.filter.as_ref()?;
        if self.options.delete_excluded {
            filter.files_from_only().map(Arc::new)
        } else {
            Some(filter.clone())
        }
    }

    /// The filter a request carries: the whole of it for a remote walk (a pull), what the
    /// mirror spares for a remote receiver (a push).
    fn request_filter(&self, pushes: bool) -> Option<Arc<fastcp_stream::Filter>> {
        if pushes {
            self.spared()
        } else {
            self.options.filter.clone()
        }
    }

    pub(crate) fn local_sources(&self) -> Vec<PathBuf> {
        self.sources
            .iter()
            .filter_map(|s| match s {
                Location::Local(p) => Some(p.clone()),
                Location::Remote(_) => None,
            })
            .collect()
    }
}

/// Runs `work` until it ends or `cancel` is triggered. Cancelling drops `work`, whose engine
/// then removes its temp files.
pub(crate) async fn cancellable<T>(
    cancel: Option<&tokio_util::sync::CancellationToken>,
    work: impl std::future::Future<Output = Result<T, Error>>,
) -> Result<T, Error> {
    match cancel {
        None => work.await,
        Some(token) => tokio::select! {
            r = work => r,
            () = token.cancelled() => Err(Error::Cancelled),
        },
    }
}

/// Copies between two local paths through the engine, over in-process streams.
///
/// Cancel it with [`CopyOptions::cancel`], or by dropping the future.
pub async fn copy_local(plan: &Plan, progress: Arc<Progress>) -> Result<Outcome, Error> {
    if plan.options.compress {
        plan.options.log.warn(|| {
            "-C is ignored for a copy on this machine: nothing goes over a network".into()
        });
    }
    let copy = copy_local_now(plan, progress.clone());
    let outcome = stoppable(plan, &progress, copy).await;
    report_end(&progress, outcome, |o| &o.report)
}

/// How long a copy that stopped early waits for its writers to remove their temp files.
const SETTLE_WAIT: Duration = Duration::from_secs(10);

/// Runs the copy `work` until it ends or `plan`'s cancel token fires; a copy that stopped
/// early (cancelled, failed) returns once its writer threads have removed their temp files,
/// waiting at most [`SETTLE_WAIT`]: the copy's future is dropped on a cancel, and its
/// writers finish on their own.
pub(crate) async fn stoppable<T>(
    plan: &Plan,
    progress: &Progress,
    work: impl std::future::Future<Output = Result<T, Error>>,
) -> Result<T, Error> {
    let outcome = cancellable(plan.options.cancel.as_ref(), work).await;
    if outcome.is_err() {
        let _ = tokio::time::timeout(SETTLE_WAIT, progress.settled()).await;
    }
    outcome
}

/// Gives a whole copy's last event: `Finished` with its report (`report` of what it
/// returned), or `Aborted` with its error.
pub(crate) fn report_end<T>(
    progress: &Progress,
    outcome: Result<T, Error>,
    report: impl Fn(&T) -> &Report,
) -> Result<T, Error> {
    match &outcome {
        Ok(done) => progress.finished(report(done)),
        Err(e) => progress.aborted(e),
    }
    outcome
}

async fn copy_local_now(plan: &Plan, progress: Arc<Progress>) -> Result<Outcome, Error> {
    let plan = &plan.sharded().await?;
    let Location::Local(dest) = &plan.dest else {
        return Err(Error::Usage("copy_local needs a local destination".into()));
    };
    let started = Instant::now();
    let streams = plan.options.streams.unwrap_or(2).max(1) as usize;
    let mut outcome = Outcome {
        report: Report::default(),
        transport: TransportUsed::Local,
        streams,
        cipher: None,
        provider: None,
        compression: None,
        remote_software: None,
        listing: Vec::new(),
        elapsed: Duration::ZERO,
        peer_wrote: false,
    };
    if plan.options.dry_run {
        let (listing, mut report) = list_local(plan, false).await;
        outcome.listing = crate::dry_run::apply(plan, dest, listing, &mut report)?;
        outcome.report = report;
        outcome.elapsed = started.elapsed();
        return Ok(outcome);
    }
    plan.options
        .log
        .info(|| format!("transport: local, {streams} in-process stream(s)"));
    if plan.options.compress {
        plan.options
            .log
            .debug(|| "compression (-C) only applies to remote copies".into());
    }
    outcome.report = match plan.rate_limit() {
        None => {
            fastcp_stream::copy_local(
                &plan.local_sources(),
                dest,
                &plan.send_config(),
                &plan.receive_config(),
                streams,
                progress,
            )
            .await?
        }
        Some(limit) => {
            plan.options
                .log
                .info(|| format!("bandwidth limit: {} bytes/s", limit.bytes_per_sec()));
            copy_local_limited(plan, dest, streams, limit, progress).await?
        }
    };
    outcome.elapsed = started.elapsed();
    Ok(outcome)
}

/// [`fastcp_stream::copy_local`] with the sender's ends of the pipes paced by `limit`.
async fn copy_local_limited(
    plan: &Plan,
    dest: &std::path::Path,
    streams: usize,
    limit: Arc<RateLimit>,
    progress: Arc<Progress>,
) -> Result<Report, Error> {
    let (ours, theirs): (Vec<_>, Vec<_>) = (0..streams)
        .map(|_| {
            let (a, b) = tokio::io::duplex(fastcp_stream::LOCAL_PIPE_BUFFER);
            (Limited::new(a, limit.clone()), b)
        })
        .unzip();
    let send_config = plan.send_config();
    let mut receive_config = plan.receive_config();
    let needed = (send_config.chunk_size + 64).min(fastcp_proto::HARD_MAX_FRAME as usize) as u32;
    receive_config.max_frame = receive_config.max_frame.max(needed);
    let sources = plan.local_sources();
    let (sent, received) = tokio::join!(
        // The receiver reports the events, for both sides.
        fastcp_stream::send_beside(&sources, ours, &send_config, progress.clone()),
        fastcp_stream::receive(dest, theirs, &receive_config, progress),
    );
    match (sent, received) {
        (Ok(_), Ok(report)) => Ok(report),
        (Err(e), Ok(_)) => Err(e.into()),
        (Err(e), Err(r)) if r.is_disconnect() => Err(e.into()),
        (_, Err(r)) => Err(r.into()),
    }
}

pub(crate) fn push_failure(report: &mut Report, failure: Failure) {
    report.failure_count += 1;
    if report.failures.len() < fastcp_stream::MAX_FAILURES {
        report.failures.push(failure);
    }
}

/// Copies to or from a remote host: starts `fastcp server` there over SSH, sets up the data
/// streams (SSH channels or sealed TCP connections) and runs the engine.
///
/// With [`TransportChoice::Auto`] it tries TCP first when the host can be reached directly,
/// and falls back to SSH channels (with a warning on the options' [`Log`](crate::Log)) when
/// the data port is unreachable.
///
/// A plan with its sources on one host and its target on another (or the same) host
/// ([`Plan::is_relay`]) copies between them through this machine: it logs in to both (once
/// when they are one login) and runs [`Session::relay`](crate::Session::relay).
pub async fn copy_remote(
    plan: &Plan,
    ssh: &SshOptions,
    progress: Arc<Progress>,
) -> Result<Outcome, Error> {
    if plan.is_relay() {
        // Boxed: two sessions' state would otherwise make every copy's future that big.
        return Box::pin(crate::relay::copy(plan, ssh, progress)).await;
    }
    let plan = &plan.walking_ahead();
    let connect = async {
        let remote = remote_of(plan)?;
        // Before logging in: an operand of another login would fail after it.
        crate::remote::check_logins(plan, remote.user.as_deref(), &remote.host, remote.port, ssh)?;
        crate::Session::connect(remote, ssh, &plan.options).await
    };
    let session = match cancellable(plan.options.cancel.as_ref(), connect).await {
        Ok(session) => session,
        Err(e) => {
            progress.aborted(&e);
            return Err(e);
        }
    };
    // The copy reports its own end.
    session.copy(plan, progress).await
}

/// `work`, given at most `limit` (none: no limit); `what` names the wait in the timeout error.
pub(crate) async fn within<T>(
    limit: Option<Duration>,
    what: &str,
    work: impl std::future::Future<Output = Result<T, Error>>,
) -> Result<T, Error> {
    match limit.filter(|l| !l.is_zero()) {
        None => work.await,
        Some(limit) => tokio::time::timeout(limit, work).await.map_err(|_| {
            Error::Timeout(format!("{what}: nothing for {} s", limit.as_secs_f32()))
        })?,
    }
}

/// The remote operand of a plan for a remote copy.
fn remote_of(plan: &Plan) -> Result<&RemotePath, Error> {
    plan.remote()
        .ok_or_else(|| Error::Usage("copy_remote needs a remote operand".into()))
}

/// What a session does once its streams are up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Job {
    /// Copy files with the engine.
    Copy,
    /// List what would be copied; write nothing.
    DryRun,
    /// Send generated bytes for this long to a server that discards them.
    Measure(Duration),
    /// Hand the streams to a relay between two sessions (see [`crate::relay`]); the plan
    /// says which session this is.
    Relay,
}

/// A session that ran, or the reason to copy over SFTP instead: fastcp is not on the remote
/// host and cannot run there.
pub(crate) enum Started {
    Done(Box<SessionDone>),
    Sftp(String),
}

/// How long to wait for the remote program's exit status and last words once its session
/// ended.
pub(crate) const EXIT_STATUS_WAIT: Duration = Duration::from_secs(5);

/// How long a session that went through waits for the remote program's exit status and the
/// end of its stderr, both together: the server has said its last word, and exits at once.
pub(crate) const DONE_EXIT_WAIT: Duration = Duration::from_secs(2);

/// The `fastcp` command's `--timeout` unless told otherwise.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);

/// Runs `work`, failing with [`Error::Timeout`] once `progress` has not moved for `limit`.
pub(crate) async fn within_idle_limit<T>(
    progress: &Progress,
    limit: Option<Duration>,
    work: impl std::future::Future<Output = Result<T, Error>>,
) -> Result<T, Error> {
    let Some(limit) = limit.filter(|l| !l.is_zero()) else {
        return work.await;
    };
    let watch = async {
        let tick = (limit / 10).clamp(Duration::from_millis(50), Duration::from_secs(1));
        let mut last = progress.snapshot();
        let mut since = Instant::now();
        loop {
            tokio::time::sleep(tick).await;
            let now = progress.snapshot();
            if now != last {
                last = now;
                since = Instant::now();
            } else if since.elapsed() >= limit {
                return Error::Timeout(format!(
                    "while copying: no data moved for {} s; the other side or the network \
                     stopped answering (--timeout)",
                    limit.as_secs_f32()
                ));
            }
        }
    };
    tokio::select! {
        r = work => r,
        e = watch => Err(e),
    }
}

/// Data streams over one SSH connection unless `-j` says otherwise.
pub const DEFAULT_SSH_STREAMS: u16 = 2;

/// The most data streams over SSH; each is an SSH connection (and an sshd process) of its
/// own, so `-j` is capped here.
pub const MAX_SSH_STREAMS: u16 = 16;

/// Sealed TCP data streams unless `-j` says otherwise.
pub const DEFAULT_TCP_STREAMS: u16 = 4;

/// How a session's data streams reach the server. More ways may come, so the enum is
/// `#[non_exhaustive]`: a `match` on it needs a `_` arm.
#[non_exhaustive]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Only the control stream. [`run_session`] then opens no stream, and its `peers` may be
    /// empty: a server run in-process over a pipe, as here, or over a stream of one's own.
    /// [`run_session_inline`] runs such a session with no `peers` at all.
    ///
    /// ```
    /// # #[tokio::main]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use std::sync::Arc;
    /// use fastcp::server::{ServerConfig, serve};
    /// use fastcp::{CopyOptions, Location, Plan, Progress};
    ///
    /// let dir = tempfile::tempdir()?;
    /// std::fs::create_dir(dir.path().join("src"))?;
    /// std::fs::write(dir.path().join("src/a.txt"), b"hello")?;
    /// let (client_end, server_end) = tokio::io::duplex(1 << 20);
    /// let server = tokio::spawn(async move { serve(server_end, &ServerConfig::default()).await });
    /// let plan = Plan::new(
    ///     vec![Location::Local(dir.path().join("src"))],
    ///     Location::parse(&format!("in-process:{}", dir.path().join("dst").display())),
    ///     CopyOptions::default().recursive(true),
    /// )?;
    /// let progress = Arc::new(Progress::default());
    /// let done = fastcp::run_session_inline(&plan, client_end, progress).await?;
    /// assert_eq!(done.report.local.files, 1);
    /// assert_eq!(server.await??.local.files, 1);
    /// assert_eq!(std::fs::read(dir.path().join("dst/a.txt"))?, b"hello");
    /// # Ok(()) }
    /// ```
    Inline,
    /// The control stream plus `streams - 1` forwarded SSH channels to a Unix socket.
    Unix {
        /// Data streams in all.
        streams: u16,
    },
    /// `streams` sealed TCP connections to `addr`; the control stream carries no data.
    Tcp {
        /// The server's address.
        addr: IpAddr,
        /// Data streams in all.
        streams: u16,
    },
    /// `streams` sealed streams to a port on the server's loopback, each carried by a
    /// forwarding of the system ssh (`ssh -W 127.0.0.1:PORT`): the way to several streams
    /// when the system ssh reaches the host through a proxy. The control stream carries no
    /// data.
    Forwarded {
        /// Data streams in all.
        streams: u16,
    },
    /// The control stream plus `streams - 1` streams that the transport hands to the server
    /// itself ([`Rendezvous::Caller`](transport::Rendezvous::Caller)): the server runs in
    /// a program that takes them from the transport, through a
    /// [`StreamInbox`](crate::server::StreamInbox).
    Caller {
        /// Data streams in all.
        streams: u16,
    },
}

impl Mode {
    /// Data streams in all.
    pub fn streams(&self) -> u16 {
        match *self {
            Mode::Inline => 1,
            Mode::Unix { streams }
            | Mode::Tcp { streams, .. }
            | Mode::Forwarded { streams }
            | Mode::Caller { streams } => streams,
        }
    }
}

/// What a finished session reports.
#[non_exhaustive]
#[derive(Debug, Clone)]
pub struct SessionDone {
    /// The engine's report.
    pub report: Report,
    /// Data streams used.
    pub streams: usize,
    /// The AEAD suite fastcp sealed the data with, for TCP.
    pub cipher: Option<fastcp_crypto::CipherSuite>,
    /// The library that ran `cipher` on this side.
    pub provider: Option<Provider>,
    /// The compression the data streams used, if any.
    pub compression: Option<Compression>,
    /// The server's software string, from its hello (escape it before printing).
    pub remote_software: String,
    /// For a dry run, what would be copied.
    pub listing: Vec<Listed>,
    /// How long the data phase took, after the session was set up.
    pub data_time: Duration,
}

impl SessionDone {
    /// The whole copy's outcome; `peer_wrote` when the remote side wrote it (see
    /// [`Outcome::arrived`]).
    pub(crate) fn into_outcome(
        self,
        transport: TransportUsed,
        started: Instant,
        peer_wrote: bool,
    ) -> Outcome {
        Outcome {
            report: self.report,
            transport,
            streams: self.streams,
            cipher: self.cipher,
            provider: self.provider,
            compression: self.compression,
            remote_software: Some(self.remote_software),
            listing: self.listing,
            elapsed: started.elapsed(),
            peer_wrote,
        }
    }
}

/// The connections a session's streams go over: the first runs the server, and the extra
/// streams go round-robin over them.
pub(crate) trait Peers: Sync {
    /// One connection.
    type Peer: Transport;

    /// The connection that carries stream `index` (0: the server's own).
    fn peer(&self, index: u16) -> &Self::Peer;

    /// Whether there is no connection at all: a caller's [`run_session`] with
    /// [`Mode::Inline`] needs none.
    fn is_empty(&self) -> bool {
        false
    }
}

/// Connections that are all there from the start.
impl<T: Transport> Peers for [T] {
    type Peer = T;

    fn is_empty(&self) -> bool {
        <[T]>::is_empty(self)
    }

    fn peer(&self, index: u16) -> &T {
        &self[usize::from(index) % self.len()]
    }
}

/// Starts `fastcp server` on the first of `peers` (the connection `first`) and runs one
/// session with it. When the remote host has no fastcp, deploys it (see [`crate::deploy`])
/// and runs the session with that; when none can run there, says why, for the caller to copy
/// over SFTP.
pub(crate) async fn session_over<P: Peers + ?Sized>(
    plan: &Plan,
    first: &AnyTransport,
    peers: &P,
    ssh: &SshOptions,
    mode: Mode,
    progress: Arc<Progress>,
    job: Job,
) -> Result<Started, Error> {
    // One round trip when fastcp is on the remote PATH or already deployed there.
    // Whether the remote program is the one self-deploy may put in place of another.
    let deployable = crate::deploy::allowed(ssh, &plan.options, first);
    let dist = crate::deploy::DeployOptions::of(&plan.options);
    if deployable && let Some(launcher) = crate::deploy::launcher(&dist) {
        plan.options.log.info(|| {
            "remote program: the fastcp self-deploy cached there, else fastcp from the remote PATH"
                .into()
        });
        first.set_launcher(Some(launcher));
    }
    // The system ssh's exit status is the server's, or, before the server spoke, its own.
    let program = match first {
        AnyTransport::Program(p) => Some(p.program()),
        AnyTransport::Builtin(_) => None,
    };
    let missing = match try_session(plan, peers, ssh, program, mode, progress.clone(), job).await {
        Ok(done) => return Ok(Started::Done(Box::new(done))),
        Err(Attempt::Failed(e)) => return Err(e),
        Err(Attempt::SftpOnly(said)) => return Ok(Started::Sftp(sftp_only(&said))),
        // A fastcp on the remote PATH of a version that cannot serve this copy: this very
        // program runs there instead, from self-deploy's cache, where later copies find it
        // first. A relay's two sessions agreed on one version: the relay notes which host's
        // fastcp is outdated, and deploys there once both sessions are over (see
        // `relay::run`).
        Err(Attempt::Outdated(e)) if deployable && job != Job::Relay => {
            plan.options.log.warn(|| {
                format!(
                    "{e}; meanwhile this fastcp runs there, from self-deploy's cache (or the \
                     copy goes over SFTP where none can be uploaded)"
                )
            });
            None
        }
        Err(Attempt::Outdated(e)) => {
            return Err(match plan.relay.as_ref().filter(|_| job == Job::Relay) {
                Some(half) => half.outdated(e),
                None => e,
            });
        }
        Err(Attempt::Missing(e)) => Some(e),
    };
    let log = &plan.options.log;
    if let Some(err) = &missing {
        if ssh.remote_path.is_some() {
            return Err(not_installed(ssh, err));
        }
        if plan.options.no_deploy {
            return Ok(Started::Sftp(
                "fastcp is not on the remote host's PATH, and --no-deploy forbids uploading it"
                    .into(),
            ));
        }
        log.info(|| "fastcp is not on the remote host's PATH: deploying it".into());
    }
    let peer = first;
    let deployed = match crate::deploy::deploy(peer, &dist, log).await {
        Ok(deployed) => deployed,
        Err(Error::Unsupported(why)) => return Ok(Started::Sftp(why)),
        Err(e) => return Err(e),
    };
    peer.set_remote_path(Some(deployed.path.clone()));
    let mut ssh = ssh.clone();
    ssh.remote_path = Some(deployed.path.clone());
    match try_session(plan, peers, &ssh, program, mode, progress, job).await {
        Ok(done) => Ok(Started::Done(Box::new(done))),
        Err(Attempt::Failed(e) | Attempt::Outdated(e)) => Err(e),
        Err(Attempt::SftpOnly(said)) => Ok(Started::Sftp(sftp_only(&said))),
        Err(Attempt::Missing(_)) => Ok(Started::Sftp(format!(
            "the fastcp uploaded to {} cannot run on the remote host (a home folder mounted \
             noexec?)",
            deployed.path
        ))),
    }
}

/// The likely cause of a remote command's output that is not what the program writes.
pub(crate) const SHELL_PRINTS: &str = "does a startup file of the remote login shell \
     (~/.bashrc, ~/.cshrc) print on stdout? It must print nothing for sessions without a \
     terminal, as scp needs too";

/// Why a copy goes over SFTP when the server refused to run fastcp for SFTP's sake.
fn sftp_only(said: &str) -> String {
    format!(
        "the remote account may only use SFTP (the server said \"{}\")",
        said.trim()
    )
}

/// Why a session did not run: the remote program is missing (or cannot be executed), it is
/// a fastcp of a protocol version that cannot serve the copy, the account may only use SFTP
/// (what the server said), or anything else.
enum Attempt {
    Missing(Error),
    Outdated(Error),
    SftpOnly(String),
    Failed(Error),
}

/// Starts `fastcp server` on the first of `peers` and runs one session with it; `program` is
/// the ssh program that runs it, if the system ssh does.
async fn try_session<P: Peers + ?Sized>(
    plan: &Plan,
    peers: &P,
    ssh: &SshOptions,
    program: Option<&std::path::Path>,
    mode: Mode,
    progress: Arc<Progress>,
    job: Job,
) -> Result<SessionDone, Attempt> {
    plan.options.log.debug(|| {
        format!(
            "starting `{} server` on the remote host",
            ssh.remote_path.as_deref().unwrap_or("fastcp")
        )
    });
    let server = peers
        .peer(0)
        .start_server()
        .await
        .map_err(|e| Attempt::Failed(e.into()))?;
    // What the remote shell says before the server speaks ("fastcp: command not found") is
    // held back: it is shown only if this attempt is not the one that finds fastcp missing.
    let (verdict, heard) = watch::channel(None);
    let verdict = Arc::new(verdict);
    let stderr = tokio::spawn(held_stderr(
        server.stderr,
        RemoteLines::of(plan.server_host().as_deref()),
        heard,
        plan.options.log.clone(),
        plan.options.cancel.clone(),
    ));
    let control = Spoken {
        inner: server.stream,
        verdict: Some(verdict.clone()),
    };
    let session = run_job(plan, control, mode, peers, progress.clone(), job)
        .await
        .map_err(|e| stall_behind(e, peers, mode, plan.options.timeout));
    // The exit status tells a missing remote program from other failures. After a cut it may
    // never come: wait a little, never forever. A stalled peer (`--timeout`) will not exit nor
    // end its stderr: its stall was waited for already, so take only what is there.
    // A copy that went through has its server's last word already: the server exits at
    // once, and its exit status and stderr's end are not worth more than a moment, shared
    // between the two (the system ssh may be stopped while the data went over TCP).
    let stalled = matches!(&session, Err(e) if e.kind() == crate::ErrorKind::Timeout);
    let patience = match &session {
        Ok(_) => DONE_EXIT_WAIT,
        Err(_) if stalled => Duration::ZERO,
        Err(_) => EXIT_STATUS_WAIT,
    };
    let waited = Instant::now();
    // The ssh program is killed once this wait gives up on it: none is left behind.
    let status = server.exit.wait_or_kill(patience).await;
    if session.is_ok()
        && let (Some(program), Err(transport::Error::Io { source, .. })) = (program, &status)
        && source.kind() == std::io::ErrorKind::TimedOut
    {
        plan.options.log.warn(|| {
            format!(
                "the copy is complete, but {} did not exit within {} s of it (was it \
                 stopped?), and was killed; what the remote server said last, if anything, is \
                 not shown",
                program.display(),
                patience.as_secs_f32()
            )
        });
    }
    let stderr_patience = match &session {
        Ok(_) => patience.saturating_sub(waited.elapsed()),
        Err(_) => patience,
    };
    // The system ssh exits 255 when it gives up (a refused login, a host key it will not
    // trust) before the server could speak: what it said is the error, not a line on stderr.
    let ssh_gave_up = matches!(&session, Err(e) if closed_early(e))
        && matches!(&status, Ok(s) if s.code() == Some(255));
    // The system ssh gave up mid-copy (a stream closed, ssh exited 255): why may be on its
    // stderr.
    let ssh_ended = program.is_some()
        && matches!(&session, Err(e) if e.kind() == crate::ErrorKind::Connect)
        && matches!(&status, Ok(s) if s.code() == Some(255));
    // Whether the server said anything at all: until it does, the ssh program's status may
    // be its own (a program that is no ssh, one that could not start).
    let spoke = verdict.borrow().is_some();
    let attempt = match (session, status) {
        (Ok(done), _) => Ok(done),
        // An account that may only use SFTP (`ForceCommand internal-sftp`): sshd says so
        // in place of running any command.
        (Err(Error::Handshake(fastcp_proto::HandshakeError::NotFastcp(said))), _)
            if said.to_ascii_lowercase().contains("sftp connections only") =>
        {
            Err(Attempt::SftpOnly(said))
        }
        (Err(err), _) if version_gap(&err) => Err(Attempt::Outdated(err)),
        // 127: not found; 126: found but not executable (a noexec mount).
        (Err(err), Ok(status)) if status.is_command_not_found() || status.code() == Some(126) => {
            Err(Attempt::Missing(err))
        }
        // Bytes before the server's hello: the remote login shell printed them (an `echo` in
        // ~/.bashrc), or the program is not fastcp.
        (Err(Error::Handshake(fastcp_proto::HandshakeError::NotFastcp(said))), _) => {
            Err(Attempt::Failed(Error::RemoteCommand(format!(
                "the remote command `{} server` began with \"{said}\", which is not fastcp's \
                 hello: is that program on the remote host another one, or {SHELL_PRINTS}",
                ssh.remote_path.as_deref().unwrap_or("fastcp"),
            ))))
        }
        // The ssh program ended before the server said anything, and not as ssh does when it
        // gives up (255, saying why; see below): name it, as its status is its own unless it
        // reached the remote host and ran the server there.
        (Err(err), Ok(status))
            if program.is_some()
                && !spoke
                && !status.success()
                && !ssh_gave_up
                && closed_early(&err) =>
        {
            Err(Attempt::Failed(Error::ConnectionClosed(format!(
                "the ssh program {} {} before the remote command `{} server` said anything \
                 (once ssh has logged in, that is the remote command's status)",
                program.unwrap_or(std::path::Path::new("ssh")).display(),
                match status.code() {
                    Some(code) => format!("exited with status {code}"),
                    None => format!("was {status}"),
                },
                ssh.remote_path.as_deref().unwrap_or("fastcp"),
            ))))
        }
        // Closed before it said hello: how the remote command ended is the clue. With the
        // built-in client that status is the remote program's own (the connection stayed up
        // to deliver it), so the failure is that program's, not the network's: retrying
        // would meet it again.
        (Err(Error::ConnectionClosed(why)), Ok(status)) if !status.success() => {
            let why = format!(
                "{why}: the remote command `{} server` {}",
                ssh.remote_path.as_deref().unwrap_or("fastcp"),
                match status.code() {
                    Some(code) => format!("exited with status {code}"),
                    None => format!("was {status}"),
                }
            );
            Err(Attempt::Failed(if program.is_none() {
                Error::RemoteCommand(why)
            } else {
                Error::ConnectionClosed(why)
            }))
        }
        (Err(err), _) => Err(Attempt::Failed(err)),
    };
    verdict.send_if_modified(|v| {
        let first = v.is_none();
        if first {
            *v = Some(
                !ssh_gave_up
                    && !matches!(
                        attempt,
                        Err(Attempt::Missing(_) | Attempt::Outdated(_) | Attempt::SftpOnly(_))
                    ),
            );
        }
        first
    });
    match tokio::time::timeout(stderr_patience, stderr).await {
        Ok(Ok((said, _))) if ssh_gave_up && !said.trim_ascii().is_empty() => Err(Attempt::Failed(
            Error::SystemSsh(String::from_utf8_lossy(said.trim_ascii()).into_owned()),
        )),
        // The system ssh gave up on a server that stopped answering its keepalives: a
        // stall, as the built-in client reports one, not a stream that closed.
        Ok(Ok((_, true))) if ssh_ended => Err(Attempt::Failed(Error::Timeout(
            "while copying: the other side or the network stopped answering: no reply to the \
             system ssh's keepalives (ServerAliveInterval x ServerAliveCountMax)"
                .into(),
        ))),
        _ => attempt,
    }
}

/// `err`, or, when one of the connections that carried `mode`'s streams ended because its
/// server stopped answering SSH keepalives, that stall: the streams on it closed because of
/// it, and "closed unexpectedly" would hide why. A stall the idle limit caught, or a
/// cancelled copy, stays as it is.
pub(crate) fn stall_behind<P: Peers + ?Sized>(
    err: Error,
    peers: &P,
    mode: Mode,
    timeout: Option<Duration>,
) -> Error {
    if matches!(
        err.kind(),
        crate::ErrorKind::Timeout | crate::ErrorKind::Cancelled
    ) || peers.is_empty()
    {
        return err;
    }
    let connections = match mode {
        Mode::Unix { streams } => streams,
        _ => 1,
    };
    (0..connections)
        .find_map(|i| peers.peer(i).stopped_answering())
        .map_or(err, |stopped| stopped_answering(stopped, timeout))
}

/// The error of a connection whose server stopped answering SSH keepalives (`stopped`,
/// [`transport::Error::StoppedAnswering`]): a stall, as the idle limit reports one, naming
/// the limit that fired: ssh_config's ServerAliveInterval x ServerAliveCountMax, or
/// `--timeout` (`timeout`), which set the keepalives when ssh_config did not.
pub(crate) fn stopped_answering(stopped: transport::Error, timeout: Option<Duration>) -> Error {
    let transport::Error::StoppedAnswering {
        waited,
        server_alive,
        ..
    } = &stopped
    else {
        return stopped.into();
    };
    let limit = match timeout.filter(|t| !t.is_zero()) {
        _ if *server_alive => "ServerAliveInterval x ServerAliveCountMax".to_owned(),
        Some(t) => format!("--timeout {}", t.as_secs_f32()),
        None => "SSH keepalives".to_owned(),
    };
    Error::Timeout(format!(
        "while copying: the other side or the network stopped answering: no reply to SSH \
         keepalives for {} s ({limit})",
        waited.as_secs_f32()
    ))
}

/// Whether `err` says only that the control stream ended (the process behind it exited).
fn closed_early(err: &Error) -> bool {
    match err {
        Error::ConnectionClosed(_) => true,
        Error::Io(e) => matches!(
            e.kind(),
            std::io::ErrorKind::BrokenPipe
                | std::io::ErrorKind::ConnectionReset
                | std::io::ErrorKind::UnexpectedEof
        ),
        _ => false,
    }
}

/// What the system ssh says when its ServerAliveInterval keepalives went unanswered
/// (OpenSSH's "Timeout, server HOST not responding.") before it exits 255.
const SSH_KEEPALIVES_UNANSWERED: &[u8] = b"Timeout, server ";

/// Forwards the remote program's stderr to ours once `verdict` says to (`Some(true)`), each
/// line marked with the host it came from (`lines`); until then it is held, and with
/// `Some(false)` it goes to the debug log only, and is returned whole. Once the copy is
/// cancelled (Ctrl-C), what the server says of the client going away goes to the debug log
/// too. Also returns whether what was forwarded holds the system ssh's own word that its
/// keepalives went unanswered ([`SSH_KEEPALIVES_UNANSWERED`]).
async fn held_stderr(
    mut stderr: transport::Stderr,
    mut lines: RemoteLines,
    mut verdict: watch::Receiver<Option<bool>>,
    log: crate::Log,
    cancel: Option<tokio_util::sync::CancellationToken>,
) -> (Vec<u8>, bool) {
    let mut held = Vec::new();
    let mut ended = false;
    let show = loop {
        if let Some(show) = *verdict.borrow_and_update() {
            break show;
        }
        tokio::select! {
            chunk = stderr.recv(), if !ended => match chunk {
                Some(chunk) => held.extend_from_slice(&chunk),
                None => ended = true,
            },
            changed = verdict.changed() => if changed.is_err() {
                break true;
            },
        }
    };
    if !show {
        log.debug(|| format!("the remote shell said: {}", escape(held.trim_ascii())));
        while let Some(chunk) = stderr.recv().await {
            log.debug(|| format!("the remote shell said: {}", escape(chunk.trim_ascii())));
            if held.len() < HELD_MAX {
                held.extend_from_slice(&chunk);
            }
        }
        return (held, false);
    }
    let mut out = tokio::io::stderr();
    let _ = out.write_all(&lines.mark(&held)).await;
    let _ = out.flush().await;
    let cancelled = async {
        match &cancel {
            Some(c) => c.cancelled().await,
            None => std::future::pending().await,
        }
    };
    let mut cancelled = std::pin::pin!(cancelled);
    let mut shown = true;
    let mut unanswered = false;
    loop {
        let chunk = tokio::select! {
            chunk = stderr.recv() => chunk,
            () = &mut cancelled, if shown => {
                shown = false;
                continue;
            }
        };
        let Some(chunk) = chunk else { break };
        unanswered |= chunk
            .windows(SSH_KEEPALIVES_UNANSWERED.len())
            .any(|w| w == SSH_KEEPALIVES_UNANSWERED);
        if !shown {
            log.debug(|| format!("the server said: {}", escape(chunk.trim_ascii())));
        } else if out.write_all(&lines.mark(&chunk)).await.is_err() || out.flush().await.is_err() {
            shown = false;
        }
    }
    (held, unanswered)
}

/// The remote program's stderr as this side shows it: each line begins with the host it came
/// from (`host: `), so that the remote's words are not taken for this side's own, and its
/// control characters (but tabs and line ends) are shown escaped (`\x1b`), so that it cannot
/// move the cursor or rewrite what the terminal shows (scp's CVE-2019-6110).
pub(crate) struct RemoteLines {
    prefix: Vec<u8>,
    /// The next byte begins a line.
    at_start: bool,
    /// The last chunk ended in a CR, held back: an LF starting the next one ends the line,
    /// as CR LF does; anything else shows it.
    cr_held: bool,
}

impl RemoteLines {
    /// Lines of `host`, or of "remote" when the host has no name here (a server a program
    /// runs itself).
    pub(crate) fn of(host: Option<&str>) -> RemoteLines {
        RemoteLines {
            prefix: format!("{}: ", host.unwrap_or("remote")).into_bytes(),
            at_start: true,
            cr_held: false,
        }
    }

    /// `chunk`, the next bytes the remote wrote, with the host before each line that begins
    /// in it.
    pub(crate) fn mark(&mut self, mut chunk: &[u8]) -> Vec<u8> {
        let mut out = Vec::with_capacity(chunk.len() + self.prefix.len() + 4);
        if std::mem::take(&mut self.cr_held) {
            if std::mem::take(&mut self.at_start) {
                out.extend_from_slice(&self.prefix);
            }
            match chunk.strip_prefix(b"\n") {
                Some(rest) => {
                    out.push(b'\n');
                    self.at_start = true;
                    chunk = rest;
                }
                None => out.extend_from_slice(b"\\x0d"),
            }
        }
        // A CR that ends the chunk may be the first half of a CR LF.
        if let Some(rest) = chunk.strip_suffix(b"\r") {
            self.cr_held = true;
            chunk = rest;
        }
        for line in chunk.split_inclusive(|&b| b == b'\n') {
            if self.at_start {
                out.extend_from_slice(&self.prefix);
            }
            // A line that ends in CR LF (ssh's own lines, written for a terminal) ends as
            // any other; a CR inside a line is shown.
            let (body, end) = match line.strip_suffix(b"\r\n") {
                Some(body) => (body, &b"\n"[..]),
                None => (line, &b""[..]),
            };
            for &b in body {
                if (b < 0x20 && b != b'\n' && b != b'\t') || b == 0x7f {
                    out.extend_from_slice(format!("\\x{b:02x}").as_bytes());
                } else {
                    out.push(b);
                }
            }
            out.extend_from_slice(end);
            self.at_start = line.ends_with(b"\n");
        }
        out
    }
}

/// The most of what the remote side says after a failed start that [`held_stderr`] keeps.
const HELD_MAX: usize = 64 << 10;

/// The control stream, which says `Some(true)` on `verdict` once the server has spoken:
/// from then on, its stderr is the server's own, and is shown as it comes.
struct Spoken<S> {
    inner: S,
    verdict: Option<Arc<watch::Sender<Option<bool>>>>,
}

impl<S: AsyncRead + Unpin> AsyncRead for Spoken<S> {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let polled = std::pin::Pin::new(&mut self.inner).poll_read(cx, buf);
        if buf.filled().len() > before
            && let Some(verdict) = self.verdict.take()
        {
            verdict.send_replace(Some(true));
        }
        polled
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Spoken<S> {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// The advice for a remote host where `fastcp server` could not start.
fn not_installed(ssh: &SshOptions, err: &Error) -> Error {
    Error::RemoteCommand(format!(
        "fastcp is not installed on the remote host (or not on its PATH): the remote \
         shell could not run `{}`. Install it there (a `cargo xtask dist` binary \
         in /usr/local/bin, or `cargo install --path .` from fastcp's source) or name it with \
         --remote-path /path/to/fastcp. ({err})",
        ssh.remote_path.as_deref().unwrap_or("fastcp"),
    ))
}

/// Opens the session's `streams - 1` extra streams at `rendezvous`, round-robin over `peers`,
/// each proving the secret with a [`Join`]; returns them after `control`, in index order.
async fn join<P: Peers + ?Sized>(
    control: BoxStream,
    rendezvous: &transport::Rendezvous,
    kind: JoinKind,
    secret: &fastcp_crypto::SessionSecret,
    streams: u16,
    peers: &P,
) -> Result<Vec<BoxStream>, Error> {
    let mut data = vec![control];
    for index in 1..streams.max(1) {
        let mut stream = peers.peer(index).open_stream(rendezvous).await?;
        let proof = fastcp_crypto::join_proof(secret, kind, b"", index);
        crate::wire::write_frame(&mut stream, &Frame::Join(Join { index, proof })).await?;
        data.push(stream);
    }
    Ok(data)
}

/// The address to open TCP data streams to: the SSH host itself, when fastcp's own client
/// reached it directly, or when the system ssh would (`ssh -G` names no proxy).
pub(crate) async fn direct_address(peer: &AnyTransport) -> Option<IpAddr> {
    match peer {
        AnyTransport::Builtin(session) => session.peer_addr().map(|a| a.ip()),
        AnyTransport::Program(program) => program.direct_address().await.map(|a| a.ip()),
    }
}

/// The request flags for the filter a request carries.
fn filter_flags(filter: Option<&fastcp_stream::Filter>) -> u32 {
    match filter {
        Some(f) if f.listed().is_some() => flags::FILTERS | flags::FILES_FROM,
        Some(f) if !f.rules().is_empty() => flags::FILTERS,
        _ => 0,
    }
}

/// The error for a remote fastcp whose protocol version (`agreed`) is below what `what`
/// needs,
/// `needs`. In a copy between two remote hosts, both sessions speak the lower of the two
/// servers' versions: where this session's own server speaks `needs`, the one too old is the
/// other host's, and the error says so rather than name this one (the relay then names that
/// host: see [`Half::outdated`](crate::relay::Half::outdated)).
pub(crate) fn too_old(what: &str, needs: u16, agreed: &fastcp_proto::Negotiated) -> Error {
    let peer = if agreed.peer.version >= needs {
        "fastcp on the other host".to_owned()
    } else {
        escape(agreed.peer.software.as_bytes()).to_string()
    };
    Error::PeerTooOld {
        what: what.to_owned(),
        needs,
        peer,
        speaks: agreed.version,
    }
}

/// Whether `err` says the remote fastcp is of a protocol version that cannot serve this
/// copy: too old for what it asks, or with no version in common.
fn version_gap(err: &Error) -> bool {
    matches!(
        err,
        Error::PeerTooOld { .. }
            | Error::Handshake(fastcp_proto::HandshakeError::Incompatible { .. })
    )
}

/// Whether a fastcp older than protocol version 13 reads `rule` (a `+ PATTERN` or
/// `- PATTERN` line) as this one does. Those matched a pattern with shell-style wildcards:
/// no `\` quoting, no `***`, `[^...]` or `[[:class:]]`, a `**` of their own, and the path from
/// the source's name even for a folder's contents (`contents`), where only a pattern that
/// matches names alone reads the same.
fn read_alike_before_13(rule: &str, contents: bool) -> bool {
    let pattern = rule.get(2..).unwrap_or_default();
    let name_only = !pattern.trim_end_matches('/').contains('/');
    (!contents || name_only)
        && !["\\", "**", "[^", "[[:"]
            .iter()
            .any(|s| pattern.contains(s))
}

/// Whether `filter` has rules and a `--files-from` list with a path in a folder: the
/// folders leading to it are judged as rsync's implied folders (protocol version 14).
pub(crate) fn implies_folders_by_rules(filter: &fastcp_stream::Filter) -> bool {
    !filter.rules().is_empty()
        && filter
            .listed()
            .is_some_and(|listed| listed.iter().any(|p| p.contains(&b'/')))
}

/// The filter lines a request carries: the rules, then `= PATH` for each path of a
/// `--files-from` list.
fn filter_lines(filter: Option<&fastcp_stream::Filter>) -> Vec<Bytes> {
    let Some(filter) = filter else {
        return Vec::new();
    };
    let mut lines: Vec<Bytes> = filter.rules().into_iter().map(Bytes::from).collect();
    for path in filter.listed().unwrap_or_default() {
        let mut line = b"= ".to_vec();
        line.extend_from_slice(&path);
        lines.push(Bytes::from(line));
    }
    lines
}

/// Runs the client side of a session over `control`, the remote `fastcp server`'s stdio, and
/// opens any extra data streams as `mode` says. Extra streams go round-robin over `peers`,
/// connections to the same host (the first one runs the server), through
/// [`Transport::open_stream`]. The plan's remote host is only a label here: `control` and
/// `peers` are the connection.
///
/// A session over `control` alone ([`Mode::Inline`]) needs no `peers`: [`run_session_inline`]
/// runs it without naming a transport type for an empty list.
///
/// With [`CopyOptions::dry_run`] the session only lists what would be copied.
/// [`CopyOptions::cancel`] stops it, as it stops [`Session::copy`](crate::Session::copy), and its last event is
/// [`Event::Finished`](crate::Event::Finished) or [`Event::Aborted`](crate::Event::Aborted).
///
/// # A transport of your own
///
/// Anything that can start a server and open streams to it is a [`Transport`]. Here the
/// server is [`crate::server::serve`] in this process, on one end of a `tokio::io::duplex`
/// pipe, and the copy's three data streams reach it at the Unix socket it names:
///
/// ```
/// use std::sync::Arc;
/// use fastcp::transport::{self, RemoteProcess, Rendezvous, Transport};
/// use fastcp::{BoxStream, CopyOptions, Location, Mode, Plan, Progress};
///
/// struct InProcess;
///
/// impl Transport for InProcess {
///     async fn start_server(&self) -> Result<RemoteProcess, transport::Error> {
///         let (client_end, server_end) = tokio::io::duplex(1 << 20);
///         tokio::spawn(async move {
///             fastcp::server::serve(server_end, &Default::default()).await
///         });
///         Ok(RemoteProcess::from_stream(client_end))
///     }
///
///     async fn open_stream(&self, at: &Rendezvous) -> Result<BoxStream, transport::Error> {
///         match at {
///             Rendezvous::UnixSocket(path) => {
///                 let s = tokio::net::UnixStream::connect(path).await;
///                 Ok(Box::new(s.map_err(|e| transport::Error::io("joining", e))?))
///             }
///             _ => Err(transport::Error::SingleStream("unix sockets only")),
///         }
///     }
///
///     fn supports_extra_streams(&self) -> bool {
///         true
///     }
/// }
///
/// # #[tokio::main]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let dir = tempfile::tempdir()?;
/// std::fs::write(dir.path().join("a.txt"), b"hello")?;
/// let plan = Plan::new(
///     vec![Location::Local(dir.path().join("a.txt"))],
///     Location::parse(&format!("in-process:{}", dir.path().join("b.txt").display())),
///     CopyOptions::default(),
/// )?;
/// let server = InProcess.start_server().await?;
/// let done = fastcp::run_session(
///     &plan,
///     server.stream,
///     Mode::Unix { streams: 3 },
///     &[InProcess],
///     Arc::new(Progress::default()),
/// )
/// .await?;
/// assert_eq!(done.streams, 3);
/// assert_eq!(std::fs::read(dir.path().join("b.txt"))?, b"hello");
/// # Ok(()) }
/// ```
pub async fn run_session<S, T>(
    plan: &Plan,
    control: S,
    mode: Mode,
    peers: &[T],
    progress: Arc<Progress>,
) -> Result<SessionDone, Error>
where
    S: AsyncRead + AsyncWrite + Send + Unpin + 'static,
    T: Transport,
{
    if plan.is_relay() {
        let e = Error::Usage(
            "a copy between two remote hosts needs two sessions: use Session::relay".into(),
        );
        progress.aborted(&e);
        return Err(e);
    }
    let job = if plan.options.dry_run {
        Job::DryRun
    } else {
        Job::Copy
    };
    let work = run_job(plan, control, mode, peers, progress.clone(), job);
    let done = stoppable(plan, &progress, work).await;
    report_end(&progress, done, |d| &d.report)
}

/// [`run_session`] in [`Mode::Inline`] with no peers: the whole session, data included, goes
/// over `control`, a stream to a `fastcp server` of any kind (a pipe to
/// [`server::serve`](crate::server::serve) in this process, a socket, an SSH channel of one's
/// own).
///
/// ```
/// # #[tokio::main]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use std::sync::Arc;
/// use fastcp::{CopyOptions, Location, Plan, Progress};
///
/// let dir = tempfile::tempdir()?;
/// std::fs::write(dir.path().join("a.txt"), b"hello")?;
/// let (client_end, server_end) = tokio::io::duplex(1 << 20);
/// tokio::spawn(async move { fastcp::server::serve(server_end, &Default::default()).await });
/// // The host name only labels the remote side: the pipe is the connection.
/// let plan = Plan::new(
///     vec![Location::Local(dir.path().join("a.txt"))],
///     Location::parse(&format!("in-process:{}", dir.path().join("b.txt").display())),
///     CopyOptions::default(),
/// )?;
/// let done = fastcp::run_session_inline(&plan, client_end, Arc::new(Progress::default())).await?;
/// assert_eq!((done.streams, done.report.local.files), (1, 1));
/// assert_eq!(std::fs::read(dir.path().join("b.txt"))?, b"hello");
/// # Ok(()) }
/// ```
pub async fn run_session_inline<S>(
    plan: &Plan,
    control: S,
    progress: Arc<Progress>,
) -> Result<SessionDone, Error>
where
    S: AsyncRead + AsyncWrite + Send + Unpin + 'static,
{
    // No connection: any transport type serves for the empty list.
    let no_peers: &[AnyTransport] = &[];
    run_session(plan, control, Mode::Inline, no_peers, progress).await
}

async fn run_job<S, P>(
    plan: &Plan,
    control: S,
    mode: Mode,
    peers: &P,
    progress: Arc<Progress>,
    job: Job,
) -> Result<SessionDone, Error>
where
    S: AsyncRead + AsyncWrite + Send + Unpin + 'static,
    P: Peers + ?Sized,
{
    let log = &plan.options.log;
    let mut reader = FrameReader::new(control, session::MAX_FRAME);
    // Sealed TCP streams authenticate every byte from one fastcp process to the other, and
    // so do a transport's own where it says so (not SSH's, whose MAC ends at sshd): then
    // neither side hashes file content.
    let mut authenticated = match mode {
        Mode::Tcp { .. } | Mode::Forwarded { .. } => true,
        Mode::Inline | Mode::Unix { .. } | Mode::Caller { .. } => {
            // No connection to ask (an inline session over a caller's pipe): hashed.
            !peers.is_empty() && (0..mode.streams()).all(|i| peers.peer(i).authenticates())
        }
    };
    let mut streams = mode.streams();
    let relay = plan.relay.as_ref().filter(|_| job == Job::Relay);
    let agreed = match relay {
        None => session::handshake_within(&mut reader, plan.options.timeout).await?,
        Some(half) => {
            // Both sessions of a relay speak one version, open as many streams, and hash
            // content alike: they agree before either says anything more.
            let hello = within(
                plan.options.timeout,
                "waiting for the peer's hello (it started but says nothing)",
                session::read_hello(&mut reader),
            )
            .await?;
            let met = half
                .meet(crate::relay::Offer {
                    version: hello.version,
                    authenticated,
                    streams,
                })
                .await?;
            authenticated = met.authenticated;
            streams = met.streams;
            session::offer_hello(&mut reader, hello, met.version).await?
        }
    };
    let copies = matches!(job, Job::Copy | Job::Relay);
    if (plan.probing() || plan.options.hard_links) && agreed.version < 4 && copies {
        return Err(too_old(
            "--skip-unchanged, --checksum, --resume or -H",
            4,
            &agreed,
        ));
    }
    let peer_cpu = CpuFeatures::from_bits(agreed.peer.cpu_features);
    log.info(|| {
        format!(
            "remote: {}, protocol version {}",
            escape(agreed.peer.software.as_bytes()),
            agreed.version
        )
    });
    log.debug(|| {
        format!(
            "CPU features: here {}; there {peer_cpu}",
            CpuFeatures::probe()
        )
    });
    let pushes = match relay {
        Some(half) => half.end == crate::relay::End::Target,
        None => plan.dest.remote().is_some(),
    };
    let (direction, paths) = if pushes {
        let remote = plan
            .dest
            .remote()
            .ok_or_else(|| Error::Usage("a session needs a remote operand".into()))?;
        (Direction::Push, vec![Bytes::from(remote.path.clone())])
    } else {
        let paths = plan
            .sources
            .iter()
            .filter_map(Location::remote)
            .map(|r| Bytes::from(r.path.clone()))
            .collect();
        (Direction::Pull, paths)
    };
    let (transport, choice) = match mode {
        Mode::Inline => (TransportKind::Inline, None),
        // A relay's other session may carry one stream only.
        Mode::Unix { .. } | Mode::Caller { .. } if streams == 1 => (TransportKind::Inline, None),
        Mode::Unix { .. } => (TransportKind::Unix, None),
        Mode::Caller { .. } => (TransportKind::Caller, None),
        Mode::Tcp { .. } | Mode::Forwarded { .. } => {
            let choice = fastcp_crypto::choose(CpuFeatures::probe(), peer_cpu, plan.options.cipher);
            log.info(|| format!("cipher: {choice}"));
            (TransportKind::Tcp, Some(choice))
        }
    };
    let compression = if plan.options.compress && copies {
        if agreed.peer.compression.contains(&compress::ZSTD) {
            log.info(|| "compression: zstd".into());
            compress::ZSTD
        } else {
            log.warn(|| {
                format!(
                    "the remote {} does not offer zstd compression; copying uncompressed",
                    escape(agreed.peer.software.as_bytes())
                )
            });
            compress::NONE
        }
    } else {
        compress::NONE
    };
    let mut request_flags = plan.flags();
    // The receiver judges by them: a pull's is this side.
    let rules = fastcp_stream::SkipRules::from_flags(request_flags);
    if !pushes {
        request_flags &= !rules.flags();
    } else if rules.any() && agreed.version < 11 {
        return Err(too_old(
            "--size-only, --ignore-existing or --update",
            11,
            &agreed,
        ));
    }
    if pushes && request_flags & flags::MAX_DELETE != 0 && agreed.version < 12 {
        return Err(too_old("--max-delete", 12, &agreed));
    }
    if request_flags & flags::LINK_DEST != 0 && agreed.version < 10 {
        return Err(too_old("--link-dest", 10, &agreed));
    }
    if !pushes {
        // Where the files land, and the reference folder they are linked from, are the
        // receiver's to say; a pull's is this side.
        request_flags &= !(flags::CONTENTS | flags::LINK_DEST | flags::MAX_DELETE);
        if request_flags & flags::ONE_FILE_SYSTEM != 0 && agreed.version < 11 {
            return Err(too_old("-x on a pull", 11, &agreed));
        }
    } else {
        // A push's walk is this side's; a mirroring receiver must know what it left out.
        if request_flags & flags::ONE_FILE_SYSTEM != 0
            && (request_flags & flags::DELETE != 0 || plan.options.dry_run)
            && agreed.version < 11
        {
            return Err(too_old("-x with --delete or -n on a push", 11, &agreed));
        }
        request_flags &= !flags::ONE_FILE_SYSTEM;
    }
    // A push's dry run that skips or deletes is judged on the server.
    if pushes && job == Job::DryRun && crate::dry_run::Judge::of(plan).any() && agreed.version < 6 {
        return Err(too_old(
            "-n with --delete, --skip-unchanged or --resume on a push",
            6,
            &agreed,
        ));
    }
    match job {
        Job::Copy | Job::Relay => {}
        Job::DryRun => request_flags |= flags::DRY_RUN,
        Job::Measure(_) => request_flags |= flags::THROUGHPUT,
    }
    if matches!(mode, Mode::Forwarded { .. }) {
        request_flags |= flags::FORWARDED;
    }
    let hash_content = !(authenticated && agreed.version >= 9);
    if !hash_content {
        request_flags |= flags::NO_CONTENT_HASH;
    }
    if agreed.version >= 9 && plan.new_target_dir() && (pushes || relay.is_none()) {
        request_flags |= flags::NEW_TARGET_DIR;
    }
    let client_random = random32();
    let request_filter = plan.request_filter(pushes);
    request_flags |= filter_flags(request_filter.as_deref());
    let filters = filter_lines(request_filter.as_deref());
    // A remote side that walks by the rules (a pull) or spares what they exclude (a push's
    // mirror) reads them itself: one older than version 13 reads some of them otherwise.
    if agreed.version < 13
        && (!pushes || request_flags & flags::DELETE != 0)
        && let Some(rule) = request_filter.as_deref().and_then(|f| {
            f.rules()
                .into_iter()
                .find(|r| !read_alike_before_13(r, plan.contents()))
        })
    {
        // The user's own rule, as typed (escaped only where it holds a control character).
        let shown = if rule.chars().any(char::is_control) {
            escape(rule.as_bytes()).to_string()
        } else {
            rule
        };
        // Version 13 reads it as rsync does.
        return Err(too_old(&format!("the rule `{shown}`"), 13, &agreed));
    }
    // From version 14 the folders that lead to a `--files-from` list's paths are made for
    // those paths, not asked of the rules; an older remote side that walks by the list and
    // the rules (a pull) or spares by them (a push's mirror) makes, skips or removes them
    // otherwise.
    if agreed.version < 14
        && (!pushes || request_flags & flags::DELETE != 0)
        && request_filter
            .as_deref()
            .is_some_and(implies_folders_by_rules)
    {
        return Err(too_old(
            "--files-from with include or exclude rules",
            14,
            &agreed,
        ));
    }
    let filter_bytes: usize = filters.iter().map(|l| 4 + l.len()).sum();
    if filter_bytes > fastcp_proto::DEFAULT_MAX_FRAME as usize {
        return Err(Error::Usage(format!(
            "the filter rules and --files-from list take {filter_bytes} bytes, more than one \
             request carries ({} bytes): split the list over several copies",
            fastcp_proto::DEFAULT_MAX_FRAME
        )));
    }
    reader
        .send(&Frame::Request(Request {
            direction,
            paths,
            flags: request_flags,
            streams,
            transport,
            cipher: choice.as_ref().map_or(0, |c| c.suite.id()),
            compression,
            client_random,
            tcp_ports: plan.options.tcp_ports.unwrap_or((0, 0)),
            filters,
            link_dest: (request_flags & flags::LINK_DEST != 0)
                .then_some(plan.options.link_dest.as_ref())
                .flatten()
                .map(|p| Bytes::copy_from_slice(p.as_os_str().as_bytes())),
            max_delete: plan
                .options
                .max_delete
                .filter(|_| request_flags & flags::MAX_DELETE != 0),
        }))
        .await?;
    let accept = within(
        plan.options.timeout,
        "waiting for the server to accept the request",
        reader.next("waiting for the server to accept"),
    )
    .await?;
    let accept = match accept {
        Frame::Accept(a) => a,
        Frame::Error(e) => {
            return Err(Error::Refused {
                code: e.code,
                message: e.message,
            });
        }
        other => {
            return Err(Error::UnexpectedFrame {
                expected: "Accept",
                got: other.name(),
            });
        }
    };
    log.debug(|| {
        format!(
            "accepted: {} stream(s), rendezvous {:?}",
            accept.streams, accept.rendezvous
        )
    });
    let secret = fastcp_crypto::session_secret(&client_random, &accept.server_random);
    let control: BoxStream = Box::new(reader.into_stream());
    // With TCP the control stream carries no data but stays open until the end.
    let (data, _control): (Vec<BoxStream>, Option<BoxStream>) = match (&accept.rendezvous, mode) {
        (Rendezvous::None, _) => (vec![control], None),
        (Rendezvous::Unix(path), Mode::Unix { .. }) => {
            let path = String::from_utf8_lossy(path).into_owned();
            let rendezvous = transport::Rendezvous::UnixSocket(path);
            let data = join(
                control,
                &rendezvous,
                JoinKind::Unix,
                &secret,
                accept.streams,
                peers,
            )
            .await?;
            (data, None)
        }
        (Rendezvous::Caller, Mode::Caller { .. }) => {
            let rendezvous = transport::Rendezvous::Caller;
            let data = join(
                control,
                &rendezvous,
                JoinKind::Caller,
                &secret,
                accept.streams,
                peers,
            )
            .await?;
            (data, None)
        }
        (Rendezvous::Tcp(port), Mode::Tcp { .. } | Mode::Forwarded { .. }) => {
            let choice = choice.as_ref().expect("a TCP session has a cipher");
            let keys = KeyConfig::new(choice.suite, choice.provider);
            let mut config = TcpConfig::default();
            if let Some(limit) = plan.rate_limit() {
                // Records no longer than a burst, so that bytes leave as the limit lets
                // them rather than when a whole record has been paid for.
                config.record_len = config.record_len.min(limit.burst());
            }
            let data: Vec<BoxStream> = if let Mode::Tcp { addr, .. } = mode {
                let addr = SocketAddr::new(addr, *port);
                let sealed =
                    fastcp_transport::tcp::connect(addr, accept.streams, &secret, &keys, &config)
                        .await?;
                sealed
                    .into_iter()
                    .map(|s| Box::new(s) as BoxStream)
                    .collect()
            } else {
                // Forwarded: the server listens on its loopback, each stream an `ssh -W` to it.
                let rendezvous = transport::Rendezvous::TcpPort(*port);
                let mut conns = Vec::with_capacity(usize::from(accept.streams));
                for _ in 0..accept.streams {
                    conns.push(peers.peer(0).open_stream(&rendezvous).await?);
                }
                let loopback = SocketAddr::new(IpAddr::V4(std::net::Ipv4Addr::LOCALHOST), *port);
                let sealed =
                    fastcp_transport::tcp::join_streams(conns, loopback, &secret, &keys, &config)
                        .await?;
                sealed
                    .into_iter()
                    .map(|s| Box::new(s) as BoxStream)
                    .collect()
            };
            (data, Some(control))
        }
        (other, _) => {
            return Err(Error::Unsupported(format!(
                "the server offered a rendezvous this session did not ask for: {other:?}"
            )));
        }
    };
    let limit = plan.rate_limit();
    if let Some(limit) = &limit {
        log.info(|| format!("bandwidth limit: {} bytes/s", limit.bytes_per_sec()));
    }
    let compressed = compression == compress::ZSTD;
    // Only a copy's streams reach `data::send` or `data::receive` (which count a bare sealed
    // TCP stream themselves); a dry run's are read here.
    let wrap = compressed || !matches!(job, Job::Copy);
    let data: Vec<BoxStream> = data
        .into_iter()
        .map(|stream| {
            let stream: BoxStream = match &limit {
                Some(limit) => Box::new(Limited::new(stream, limit.clone())),
                None => stream,
            };
            let stream = crate::data::counted(stream, &progress, wrap);
            if compressed {
                compress::zstd(stream)
            } else {
                stream
            }
        })
        .collect();
    let n = data.len();
    let mut done = SessionDone {
        report: Report::default(),
        streams: n,
        cipher: choice.map(|c| c.suite),
        provider: choice.map(|c| c.provider),
        compression: (compression == compress::ZSTD).then_some(Compression::Zstd),
        remote_software: agreed.peer.software.clone(),
        listing: Vec::new(),
        data_time: Duration::ZERO,
    };
    let data_started = Instant::now();
    match job {
        Job::Copy => {}
        Job::Relay => {
            let half = relay.expect("a relay's session");
            half.hand(data, agreed.max_frame).await?;
            done.data_time = data_started.elapsed();
            return Ok(done);
        }
        Job::DryRun => {
            dry_run(plan, direction, agreed.version, data, &progress, &mut done).await?;
            done.data_time = data_started.elapsed();
            return Ok(done);
        }
        Job::Measure(duration) => {
            done.report.local.bytes = measure_streams(data, duration).await?;
            done.data_time = data_started.elapsed();
            return Ok(done);
        }
    }
    let engine = async {
        Ok(match direction {
            Direction::Push => {
                let config = fastcp_stream::SendConfig {
                    version: agreed.version,
                    hash_content,
                    ..plan.send_config()
                };
                crate::data::send(&plan.local_sources(), data, &config, progress.clone()).await?
            }
            Direction::Pull => {
                let Location::Local(dest) = &plan.dest else {
                    unreachable!("a pull has a local destination")
                };
                let mut cfg = plan.receive_config();
                cfg.version = agreed.version;
                cfg.hash_content = hash_content;
                // Accept only the names we asked for at the top level (scp CVE-2019-6111).
                cfg.expected_top_level = plan
                    .sources
                    .iter()
                    .filter_map(Location::remote)
                    .map(|r| top_level_name(&r.path))
                    .collect();
                crate::data::receive(dest, data, &cfg, progress.clone()).await?
            }
        })
    };
    done.report = within_idle_limit(&progress, plan.options.timeout, engine).await?;
    done.data_time = data_started.elapsed();
    Ok(done)
}

/// Whether `source` names a folder's contents: `.`, or a path ending in `/.`.
fn names_contents(source: &Location) -> bool {
    let path: &[u8] = match source {
        Location::Local(p) => p.as_os_str().as_bytes(),
        Location::Remote(r) => r.path.as_bytes(),
    };
    path == b"." || path.ends_with(b"/.")
}

/// The name a remote source arrives under: its last path component. `None` where only
/// the remote knows it: `.`, `..`, a home (`~`, `~user`, which arrives as the home
/// folder's own name).
pub(crate) fn top_level_name(path: &str) -> Option<Vec<u8>> {
    let trimmed = path.trim_end_matches('/');
    let name = trimmed.rsplit('/').next().unwrap_or(trimmed);
    match name {
        "" | "." | ".." => None,
        home if home == trimmed && home.starts_with('~') => None,
        n => Some(n.as_bytes().to_vec()),
    }
}

/// Sends generated bytes on every stream for `duration`, ends the streams and waits for the
/// server's count on stream 0: the bytes the server received and discarded.
async fn measure_streams(data: Vec<BoxStream>, duration: Duration) -> Result<u64, Error> {
    // Incompressible bytes, made once.
    let mut block = vec![0u8; 1 << 20];
    for chunk in block.chunks_mut(32) {
        chunk.copy_from_slice(&random32()[..chunk.len()]);
    }
    let block = Bytes::from(block);
    let deadline = tokio::time::Instant::now() + duration;
    let writers: Vec<_> = data
        .into_iter()
        .map(|mut stream| {
            let block = block.clone();
            tokio::spawn(async move {
                while tokio::time::Instant::now() < deadline {
                    stream.write_all(&block).await?;
                }
                stream.flush().await?;
                stream.shutdown().await?;
                Ok::<_, std::io::Error>(stream)
            })
        })
        .collect();
    let mut first = None;
    for writer in writers {
        let stream = writer
            .await
            .map_err(|e| Error::Io(std::io::Error::other(e)))??;
        first.get_or_insert(stream);
    }
    let first = first.ok_or_else(|| Error::Unsupported("no data stream to measure".into()))?;
    let mut reader = FrameReader::new(first, session::MAX_FRAME);
    match reader.next("waiting for the server's count").await? {
        Frame::Done(summary) => Ok(summary.bytes),
        Frame::Error(e) => Err(Error::Engine(fastcp_stream::Error::from_frame(&e))),
        other => Err(Error::UnexpectedFrame {
            expected: "Done",
            got: other.name(),
        }),
    }
}

/// What [`probe`] learned about a remote host.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Probe {
    /// The remote side's software string, such as "fastcp 0.1.0" (from the peer: escape it
    /// before printing).
    pub software: String,
    /// The protocol version both ends agreed on.
    pub protocol: u16,
    /// This machine's CPU features.
    pub local_cpu: CpuFeatures,
    /// The remote machine's CPU features.
    pub remote_cpu: CpuFeatures,
    /// The cipher a sealed TCP session would use, and why.
    pub cipher: fastcp_crypto::Choice,
    /// The compression ids the server accepts.
    pub compression: Vec<u8>,
    /// The transport a copy with these options tries first: TCP or SSH.
    pub transport: TransportUsed,
    /// Where sealed TCP data streams would connect, when the host is reached directly.
    pub tcp_address: Option<IpAddr>,
}

/// Connects to `remote`'s host, starts `fastcp server` there, exchanges hellos and ends the
/// session cleanly: which fastcp runs there, on what CPU, and what a copy would choose.
pub async fn probe(
    remote: &RemotePath,
    ssh: &SshOptions,
    options: &CopyOptions,
) -> Result<Probe, Error> {
    let session = crate::Session::connect(remote, ssh, options).await?;
    let peer = session.first_connection();
    let tcp_address = match options.transport {
        TransportChoice::Ssh => None,
        _ => direct_address(&peer).await,
    };
    let server = peer.start_server().await?;
    let mut lines = RemoteLines::of(Some(session.destination()));
    let mut said = server.stderr;
    let stderr = tokio::spawn(async move {
        let mut out = tokio::io::stderr();
        while let Some(chunk) = said.recv().await {
            let _ = out.write_all(&lines.mark(&chunk)).await;
            let _ = out.flush().await;
        }
    });
    let mut reader = FrameReader::new(server.stream, session::MAX_FRAME);
    let agreed = session::handshake_within(&mut reader, options.timeout).await;
    // End the session: the server takes end of stream before a request as a clean goodbye.
    let _ = reader.stream.shutdown().await;
    let status = server.exit.wait().await;
    let _ = stderr.await;
    let agreed = match (agreed, status) {
        (Ok(agreed), _) => agreed,
        (Err(err), Ok(status)) if status.is_command_not_found() => {
            return Err(not_installed(ssh, &err));
        }
        (Err(err), _) => return Err(err),
    };
    let local_cpu = CpuFeatures::probe();
    let remote_cpu = CpuFeatures::from_bits(agreed.peer.cpu_features);
    Ok(Probe {
        software: agreed.peer.software,
        protocol: agreed.version,
        local_cpu,
        remote_cpu,
        cipher: fastcp_crypto::choose(local_cpu, remote_cpu, options.cipher),
        compression: agreed.peer.compression,
        transport: if tcp_address.is_some() {
            TransportUsed::Tcp
        } else {
            TransportUsed::Ssh
        },
        tcp_address,
    })
}

/// What [`measure`] saw.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Measurement {
    /// Bytes the server received.
    pub bytes: u64,
    /// From the first byte sent to the server's count.
    pub elapsed: Duration,
    /// The transport that carried them: TCP or SSH.
    pub transport: TransportUsed,
    /// Data streams used.
    pub streams: usize,
    /// The AEAD suite, for TCP.
    pub cipher: Option<CipherSuite>,
    /// The library that ran it on this side.
    pub provider: Option<Provider>,
}

impl Measurement {
    /// Bytes a second.
    pub fn bytes_per_sec(&self) -> f64 {
        self.bytes as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }
}

/// Measures how fast data reaches `remote`'s host: sets up a session as a copy with
/// `options` would (transport, streams, cipher) and sends generated, incompressible bytes on
/// every stream for `duration` to a server that counts and discards them. Nothing touches
/// either disk.
pub async fn measure(
    remote: &RemotePath,
    ssh: &SshOptions,
    options: &CopyOptions,
    duration: Duration,
) -> Result<Measurement, Error> {
    let options = CopyOptions {
        dry_run: false,
        compress: false,
        ..options.clone()
    };
    let target = RemotePath {
        path: String::new(),
        ..remote.clone()
    };
    let plan = Plan::new(
        vec![Location::Local(PathBuf::new())],
        Location::Remote(target),
        options,
    )?;
    let progress = Arc::new(Progress::default());
    let session = crate::Session::connect(remote_of(&plan)?, ssh, &plan.options).await?;
    let (done, transport) = session.run(&plan, progress, Job::Measure(duration)).await?;
    Ok(Measurement {
        bytes: done.report.local.bytes,
        elapsed: done.data_time,
        transport,
        streams: done.streams,
        cipher: done.cipher,
        provider: done.provider,
    })
}

#[cfg(test)]
mod tests {
    use super::{CopyOptions, Error, Location, Plan, RemoteLines, top_level_name};

    /// `delete_excluded` widens `delete`: set alone it is a usage error; its builder sets
    /// both, as rsync's option implies `--delete`.
    #[test]
    fn delete_excluded_needs_delete_and_its_builder_sets_it() {
        let plan = |options: CopyOptions| {
            Plan::new(
                vec![Location::Local("a".into())],
                Location::Local("b".into()),
                options,
            )
        };
        let alone = CopyOptions {
            recursive: true,
            delete_excluded: true,
            ..CopyOptions::default()
        };
        match plan(alone) {
            Err(Error::Usage(m)) => assert!(m.contains("needs --delete"), "{m}"),
            other => panic!("{other:?}"),
        }
        let built = CopyOptions::default().recursive(true).delete_excluded(true);
        assert!(built.delete);
        assert!(plan(built).is_ok());
    }

    /// A relay's session whose own server is new enough blames the other host's.
    #[test]
    fn too_old_names_the_host_that_is_too_old() {
        let agreed = |own: u16, version: u16| fastcp_proto::Negotiated {
            version,
            max_frame: 1 << 20,
            peer: fastcp_proto::Hello {
                version: own,
                min_version: 1,
                cpu_features: 0,
                ciphers: vec![1],
                compression: vec![0],
                max_frame: 1 << 20,
                software: "fastcp 9.9".into(),
            },
        };
        let said =
            |own, version| super::too_old("--max-delete", 12, &agreed(own, version)).to_string();
        assert_eq!(
            said(11, 11),
            "--max-delete needs protocol version 12 on the remote side, and the remote fastcp \
             9.9 speaks 11: upgrade fastcp there"
        );
        assert!(
            said(14, 11).contains("the remote fastcp on the other host speaks 11"),
            "{}",
            said(14, 11)
        );
    }

    /// Each line the remote writes begins with its host, however its chunks cut it.
    #[test]
    fn a_remotes_lines_begin_with_its_host() {
        let mut lines = RemoteLines::of(Some("me@nas"));
        let shown: Vec<u8> = [
            &b"fastcp server: a"[..],
            b" line\nand an",
            b"other\n\n",
            b"end",
        ]
        .into_iter()
        .flat_map(|chunk| lines.mark(chunk))
        .collect();
        assert_eq!(
            String::from_utf8(shown).unwrap(),
            "me@nas: fastcp server: a line\nme@nas: and another\nme@nas: \nme@nas: end"
        );
        assert_eq!(RemoteLines::of(None).mark(b"x\n"), b"remote: x\n");
        // A terminal's escapes arrive as text.
        assert_eq!(
            RemoteLines::of(Some("nas")).mark(b"\x1b[2Jgone\r\x07\tok\x7f\n"),
            b"nas: \\x1b[2Jgone\\x0d\\x07\tok\\x7f\n"
        );
        // A line ending CR LF, as ssh writes "Timeout, server … not responding.", ends as
        // any other.
        assert_eq!(
            RemoteLines::of(Some("nas")).mark(b"Timeout, server nas not responding.\r\nnext\r\n"),
            b"nas: Timeout, server nas not responding.\nnas: next\n"
        );
        // So does one whose CR and LF come in two chunks; a CR that no LF follows is shown.
        let mut lines = RemoteLines::of(Some("nas"));
        let shown: Vec<u8> = [&b"Timeout.\r"[..], b"\nnext\r", b"x\n", b"\r", b"\n"]
            .into_iter()
            .flat_map(|chunk| lines.mark(chunk))
            .collect();
        assert_eq!(
            String::from_utf8(shown).unwrap(),
            "nas: Timeout.\nnas: next\\x0dx\nnas: \n"
        );
    }

    #[test]
    fn a_home_arrives_under_a_name_only_the_remote_knows() {
        let name = |p: &str| top_level_name(p).map(|n| String::from_utf8(n).unwrap());
        for only_there in ["~", "~/", "~bob", "~bob/", ".", "dir/.", "..", ""] {
            assert_eq!(name(only_there), None, "{only_there}");
        }
        assert_eq!(name("~bob/x").as_deref(), Some("x"));
        assert_eq!(name("dir/~bob").as_deref(), Some("~bob"));
        assert_eq!(name("/a/b/").as_deref(), Some("b"));
    }
}
