//! The client side of a copy: local, push or pull.

use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use fastcp_proto::{Direction, Frame, Join, Rendezvous, Request, TransportKind, flags};

use tokio::io::{AsyncRead, AsyncWrite};

use crate::location::{Location, RemotePath};
use crate::session::{self, random32};
use crate::wire::FrameReader;
use crate::{BoxStream, Error, Progress, Report};
use fastcp_crypto::{CpuFeatures, JoinKind, KeyConfig};
use fastcp_transport::tcp::TcpConfig;
use fastcp_transport::{self as transport, AnyTransport, SshOptions, Transport};
use std::net::{IpAddr, SocketAddr};

/// Which transport carries the data.
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

/// What to copy and how. The defaults copy like `scp` without flags.
#[derive(Debug, Clone, Default)]
pub struct CopyOptions {
    /// Copy directories recursively (`-r`).
    pub recursive: bool,
    /// Preserve modes and modification times (`-p`).
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
}

/// How a finished copy went.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// What the engine counted, with per-file failures.
    pub report: Report,
    /// "local", "ssh" or "tcp".
    pub transport: &'static str,
    /// The data streams used.
    pub streams: usize,
    /// The AEAD suite sealing the data, where fastcp seals it itself.
    pub cipher: Option<fastcp_crypto::CipherSuite>,
    /// Wall-clock time of the whole copy.
    pub elapsed: Duration,
}

/// A copy that can run: checked operands and options.
#[derive(Debug, Clone)]
pub struct Plan {
    /// The sources, all local or all on one remote host.
    pub sources: Vec<Location>,
    /// The destination.
    pub dest: Location,
    /// How to copy.
    pub options: CopyOptions,
}

impl Plan {
    /// Checks the operands the way scp does: at least one source, and not remote on both
    /// ends.
    pub fn new(
        sources: Vec<Location>,
        dest: Location,
        options: CopyOptions,
    ) -> Result<Plan, Error> {
        if sources.is_empty() {
            return Err(Error::Usage("no source given".into()));
        }
        let remote_sources = sources.iter().filter(|s| s.remote().is_some()).count();
        if remote_sources > 0 && dest.remote().is_some() {
            return Err(Error::Usage(
                "copying between two remote locations is not supported; copy through this machine in two steps".into(),
            ));
        }
        if remote_sources > 0 && remote_sources < sources.len() {
            return Err(Error::Usage(
                "sources must be all local or all on one remote host".into(),
            ));
        }
        if remote_sources > 0 {
            let first = sources[0].remote().expect("remote");
            if sources
                .iter()
                .filter_map(Location::remote)
                .any(|r| (&r.user, &r.host, r.port) != (&first.user, &first.host, first.port))
            {
                return Err(Error::Usage(
                    "remote sources must all be on the same host".into(),
                ));
            }
        }
        Ok(Plan {
            sources,
            dest,
            options,
        })
    }

    /// The remote host, if any.
    pub fn remote(&self) -> Option<&RemotePath> {
        self.dest
            .remote()
            .or_else(|| self.sources.first().and_then(Location::remote))
    }

    /// True when the destination must be a directory: several sources or a trailing '/'.
    fn target_is_dir(&self) -> bool {
        let dest = match &self.dest {
            Location::Local(p) => p.as_os_str().as_bytes().ends_with(b"/"),
            Location::Remote(r) => r.path.ends_with('/'),
        };
        dest || self.sources.len() > 1
    }

    fn send_config(&self) -> fastcp_stream::SendConfig {
        let mut cfg = fastcp_stream::SendConfig {
            recursive: self.options.recursive,
            preserve: self.options.preserve,
            follow_links: self.options.follow_links,
            ..Default::default()
        };
        if let Some(c) = self.options.chunk_size {
            cfg.chunk_size = c;
        }
        cfg
    }

    fn receive_config(&self) -> fastcp_stream::ReceiveConfig {
        fastcp_stream::ReceiveConfig {
            recursive: self.options.recursive,
            preserve: self.options.preserve,
            target_must_be_dir: self.target_is_dir(),
            ..Default::default()
        }
    }

    fn flags(&self) -> u32 {
        let mut f = 0;
        if self.options.recursive {
            f |= flags::RECURSIVE;
        }
        if self.options.preserve {
            f |= flags::PRESERVE;
        }
        if self.options.follow_links {
            f |= flags::FOLLOW_LINKS;
        }
        if self.target_is_dir() {
            f |= flags::TARGET_IS_DIR;
        }
        f
    }

    fn local_sources(&self) -> Vec<PathBuf> {
        self.sources
            .iter()
            .filter_map(|s| match s {
                Location::Local(p) => Some(p.clone()),
                Location::Remote(_) => None,
            })
            .collect()
    }
}

/// Copies between two local paths through the engine, over in-process streams.
pub async fn copy_local(plan: &Plan, progress: Arc<Progress>) -> Result<Outcome, Error> {
    let Location::Local(dest) = &plan.dest else {
        return Err(Error::Usage("copy_local needs a local destination".into()));
    };
    let started = Instant::now();
    let streams = plan.options.streams.unwrap_or(2).max(1) as usize;
    let report = fastcp_stream::copy_local(
        &plan.local_sources(),
        dest,
        &plan.send_config(),
        &plan.receive_config(),
        streams,
        progress,
    )
    .await?;
    Ok(Outcome {
        report,
        transport: "local",
        streams,
        cipher: None,
        elapsed: started.elapsed(),
    })
}

/// Copies to or from a remote host: starts `fastcp server` there over SSH, sets up the data
/// streams (SSH channels or sealed TCP connections) and runs the engine.
///
/// With [`TransportChoice::Auto`] it tries TCP first when the host can be reached directly,
/// and falls back to SSH channels (saying so on stderr) when the data port is unreachable.
pub async fn copy_remote(
    plan: &Plan,
    ssh: &SshOptions,
    progress: Arc<Progress>,
) -> Result<Outcome, Error> {
    let started = Instant::now();
    let remote = plan
        .remote()
        .ok_or_else(|| Error::Usage("copy_remote needs a remote operand".into()))?;
    let mut ssh = ssh.clone();
    if ssh.port.is_none() {
        ssh.port = remote.port;
    }
    let destination = match &remote.user {
        Some(user) => format!("{user}@{}", remote.host),
        None => remote.host.clone(),
    };
    let peer = AnyTransport::connect(&destination, &ssh).await?;
    let tcp_addr = match plan.options.transport {
        TransportChoice::Ssh => None,
        TransportChoice::Auto => direct_address(&peer).await,
        TransportChoice::Tcp => Some(direct_address(&peer).await.ok_or_else(|| {
            Error::Usage(
                "the TCP transport needs a host fastcp reaches directly (not through ProxyJump \
                 or --ssh-program); use --transport ssh"
                    .into(),
            )
        })?),
    };
    if let Some(addr) = tcp_addr {
        let mode = Mode::Tcp {
            addr,
            streams: plan.options.streams.unwrap_or(DEFAULT_TCP_STREAMS).max(1),
        };
        match session_over(plan, &peer, &ssh, mode, progress.clone()).await {
            Err(Error::Tcp(e))
                if e.is_unreachable() && plan.options.transport == TransportChoice::Auto =>
            {
                eprintln!("fastcp: {e}; falling back to SSH channels");
            }
            other => return other.map(|done| done.into_outcome("tcp", started)),
        }
    }
    let wanted = plan.options.streams.unwrap_or(DEFAULT_SSH_STREAMS).max(1);
    let mode = if wanted > 1 && peer.supports_extra_streams() {
        Mode::Unix { streams: wanted }
    } else {
        Mode::Inline
    };
    session_over(plan, &peer, &ssh, mode, progress)
        .await
        .map(|done| done.into_outcome("ssh", started))
}

/// Data streams over one SSH connection unless `-j` says otherwise.
pub const DEFAULT_SSH_STREAMS: u16 = 2;

/// Sealed TCP data streams unless `-j` says otherwise.
pub const DEFAULT_TCP_STREAMS: u16 = 4;

/// How a session's data streams reach the server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Only the control stream.
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
}

/// What a finished session reports.
#[derive(Debug, Clone)]
pub struct SessionDone {
    /// The engine's report.
    pub report: Report,
    /// Data streams used.
    pub streams: usize,
    /// The AEAD suite fastcp sealed the data with, for TCP.
    pub cipher: Option<fastcp_crypto::CipherSuite>,
}

impl SessionDone {
    fn into_outcome(self, transport: &'static str, started: Instant) -> Outcome {
        Outcome {
            report: self.report,
            transport,
            streams: self.streams,
            cipher: self.cipher,
            elapsed: started.elapsed(),
        }
    }
}

/// Starts `fastcp server` on `peer` and runs one session with it, turning a failure to start
/// the remote program into advice.
async fn session_over(
    plan: &Plan,
    peer: &AnyTransport,
    ssh: &SshOptions,
    mode: Mode,
    progress: Arc<Progress>,
) -> Result<SessionDone, Error> {
    let server = peer.start_server().await?;
    let stderr = server.stderr.forward_to_stderr();
    let session = run_session(plan, server.stream, mode, peer, progress).await;
    let status = server.exit.wait().await;
    let _ = stderr.await;
    match (session, status) {
        (Ok(done), _) => Ok(done),
        (Err(err), Ok(status)) if status.is_command_not_found() => {
            Err(Error::RemoteCommand(format!(
                "fastcp is not installed on the remote host (or not on its PATH): the remote \
                 shell could not run `{}`. Install it there (cargo install fastcp) or name it \
                 with --remote-path /path/to/fastcp. ({err})",
                ssh.remote_path.as_deref().unwrap_or("fastcp"),
            )))
        }
        (Err(err), _) => Err(err),
    }
}

/// The address to open TCP data streams to: the SSH host itself, when fastcp's own client
/// reached it directly.
async fn direct_address(peer: &AnyTransport) -> Option<IpAddr> {
    match peer {
        AnyTransport::Builtin(session) => session.peer_addr().map(|a| a.ip()),
        _ => None,
    }
}

/// Runs the client side of a session over `control`, the remote `fastcp server`'s stdio, and
/// opens any extra data streams as `mode` says, through `peer` for SSH channels.
pub async fn run_session<S, T>(
    plan: &Plan,
    control: S,
    mode: Mode,
    peer: &T,
    progress: Arc<Progress>,
) -> Result<SessionDone, Error>
where
    S: AsyncRead + AsyncWrite + Send + Unpin + 'static,
    T: Transport,
{
    let mut reader = FrameReader::new(control, session::MAX_FRAME);
    let agreed = session::handshake(&mut reader).await?;
    let remote = plan
        .remote()
        .ok_or_else(|| Error::Usage("a session needs a remote operand".into()))?;
    let (direction, paths) = if plan.dest.remote().is_some() {
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
    let (transport, streams, choice) = match mode {
        Mode::Inline => (TransportKind::Inline, 1, None),
        Mode::Unix { streams } => (TransportKind::Unix, streams, None),
        Mode::Tcp { streams, .. } => {
            let peer_cpu = CpuFeatures::from_bits(agreed.peer.cpu_features);
            let choice = fastcp_crypto::choose(CpuFeatures::probe(), peer_cpu, plan.options.cipher);
            (TransportKind::Tcp, streams, Some(choice))
        }
    };
    let client_random = random32();
    reader
        .send(&Frame::Request(Request {
            direction,
            paths,
            flags: plan.flags(),
            streams,
            transport,
            cipher: choice.as_ref().map_or(0, |c| c.suite.id()),
            compression: 0,
            client_random,
            tcp_ports: plan.options.tcp_ports.unwrap_or((0, 0)),
        }))
        .await?;
    let accept = match reader.next("waiting for the server to accept").await? {
        Frame::Accept(a) => a,
        Frame::Error(e) => return Err(Error::Remote(e.message)),
        other => {
            return Err(Error::UnexpectedFrame {
                expected: "Accept",
                got: other.name(),
            });
        }
    };
    let secret = fastcp_crypto::session_secret(&client_random, &accept.server_random);
    let control: BoxStream = Box::new(reader.into_stream());
    // With TCP the control stream carries no data but stays open until the end.
    let (data, _control): (Vec<BoxStream>, Option<BoxStream>) = match (&accept.rendezvous, mode) {
        (Rendezvous::None, _) => (vec![control], None),
        (Rendezvous::Unix(path), Mode::Unix { .. }) => {
            let path = String::from_utf8_lossy(path).into_owned();
            let mut data = vec![control];
            for index in 1..accept.streams.max(1) {
                let rendezvous = transport::Rendezvous::UnixSocket(path.clone());
                let mut stream = peer.open_stream(&rendezvous).await?;
                let proof = fastcp_crypto::join_proof(&secret, JoinKind::Unix, b"", index);
                crate::wire::write_frame(&mut stream, &Frame::Join(Join { index, proof })).await?;
                data.push(stream);
            }
            (data, None)
        }
        (Rendezvous::Tcp(port), Mode::Tcp { addr, .. }) => {
            let choice = choice.as_ref().expect("a TCP session has a cipher");
            let keys = KeyConfig::new(choice.suite, choice.provider);
            let sealed = fastcp_transport::tcp::connect(
                SocketAddr::new(addr, *port),
                accept.streams,
                &secret,
                &keys,
                &TcpConfig::default(),
            )
            .await?;
            let data = sealed
                .into_iter()
                .map(|s| Box::new(s) as BoxStream)
                .collect();
            (data, Some(control))
        }
        (other, _) => {
            return Err(Error::Unsupported(format!(
                "the server offered a rendezvous this session did not ask for: {other:?}"
            )));
        }
    };
    let n = data.len();
    let report = match direction {
        Direction::Push => {
            fastcp_stream::send(&plan.local_sources(), data, &plan.send_config(), progress).await?
        }
        Direction::Pull => {
            let Location::Local(dest) = &plan.dest else {
                unreachable!("a pull has a local destination")
            };
            let mut cfg = plan.receive_config();
            // Accept only the names we asked for at the top level (scp CVE-2019-6111).
            cfg.expected_top_level = plan
                .sources
                .iter()
                .filter_map(Location::remote)
                .map(|r| top_level_name(&r.path))
                .collect();
            fastcp_stream::receive(dest, data, &cfg, progress).await?
        }
    };
    Ok(SessionDone {
        report,
        streams: n,
        cipher: choice.map(|c| c.suite),
    })
}

/// The name a remote source arrives under: its last path component.
fn top_level_name(path: &str) -> Option<Vec<u8>> {
    let trimmed = path.trim_end_matches('/');
    let name = trimmed.rsplit('/').next().unwrap_or(trimmed);
    match name {
        "" | "~" | "." | ".." => None,
        n => Some(n.as_bytes().to_vec()),
    }
}
