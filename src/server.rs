//! `fastcp server`: the remote side, started over SSH the way rsync starts `rsync --server`.
//!
//! It speaks the protocol on its stdin and stdout (the control stream), sets up the extra
//! data streams the client asked for, and runs the engine: it receives for a push and sends
//! for a pull. Paths arrive inside the protocol, never on its command line.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use fastcp_proto::{
    Accept, Direction, ErrorCode, ErrorFrame, Frame, Rendezvous, Request, TransportKind, flags,
};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::UnixListener;

use fastcp_crypto::{CipherSuite, CpuFeatures, JoinKind, KeyConfig};
use fastcp_transport::tcp::{TcpConfig, TcpRendezvous};
use std::net::{IpAddr, Ipv4Addr};
use std::ops::RangeInclusive;

use crate::compress;
use crate::session::{self, random32};
use crate::wire::FrameReader;
use crate::{BoxStream, Error, Report};

/// How long a server waits for data to move before it gives up on its client: twice the
/// client's default `--timeout`, so that the client, which can say why, usually notices first.
pub const SERVER_IDLE_TIMEOUT: Duration = Duration::from_secs(60);

/// How `fastcp server` behaves. The defaults suit a server started over SSH.
///
/// Build it from [`ServerConfig::default`] with its builder methods, one per field;
/// the type is `#[non_exhaustive]`, so new settings do not break callers.
///
/// ```
/// use std::time::Duration;
/// use fastcp::server::{Policy, ServerConfig};
///
/// let config = ServerConfig::default()
///     .policy(Policy::default().confined_to("/srv/backup/host1").no_delete())
///     .setup_timeout(Duration::from_secs(10));
/// assert!(config.policy.deny_delete);
/// ```
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ServerConfig {
    /// How long extra streams may take to connect and prove themselves. Default 15 s.
    pub join_timeout: Duration,
    /// The most data streams a client may ask for. Default 64.
    pub max_streams: u16,
    /// Where the TCP transport listens. Default: the address the SSH connection arrived on
    /// (from `SSH_CONNECTION`), or 127.0.0.1 outside SSH.
    pub tcp_bind: Option<IpAddr>,
    /// The ports the TCP transport may use on this server; a client's range is narrowed to
    /// them, and refused when it has none of them. Default: any free port.
    pub tcp_ports: Option<RangeInclusive<u16>>,
    /// Knobs of the sealed TCP streams.
    pub tcp: TcpConfig,
    /// The address the client's TCP data streams come from: connections from anywhere else
    /// are challenged only a few at a time. Default: the SSH connection's client address
    /// (from `SSH_CONNECTION`); outside SSH, none.
    pub tcp_client: Option<IpAddr>,
    /// Give up when no data has moved for this long while copying: a client that stopped
    /// answering leaves no server behind. Default: [`SERVER_IDLE_TIMEOUT`].
    pub idle_timeout: Option<Duration>,
    /// Where the server tells what the client does not hear through the protocol, such as a
    /// stranger's connection to the data port that was refused. Default: nowhere.
    pub log: crate::Log,
    /// How long a client may take to say hello and send its request: one that connects and
    /// says nothing does not hold the server. Default: [`SERVER_IDLE_TIMEOUT`].
    pub setup_timeout: Option<Duration>,
    /// What clients may do here: confined to a folder, read-only, write-only, no deletes
    /// (`fastcp server --restrict-to`, for a forced command in authorized_keys). Default:
    /// anything the account may do.
    pub policy: Policy,
    /// Where a server run in-process takes the extra data streams of a client in
    /// [`Mode::Caller`](crate::Mode::Caller): the program running it delivers them there
    /// from a transport of its own. Default: none, and such clients are refused.
    pub inbox: Option<StreamInbox>,
}

/// Makes a channel for handing data streams to an in-process server: give the
/// [`StreamInbox`] to its [`ServerConfig::inbox`], and deliver each stream the client's
/// transport opens with the [`StreamSender`]. Each stream still proves the session's secret
/// before the server uses it. One inbox serves one session at a time.
///
/// The whole copy below runs over `tokio::io::duplex` pipes: the control stream and three
/// data streams, with no socket or port anywhere.
///
/// ```
/// use std::sync::Arc;
/// use fastcp::server::{self, ServerConfig, StreamSender};
/// use fastcp::transport::{self, RemoteProcess, Rendezvous, Transport};
/// use fastcp::{BoxStream, CopyOptions, Location, Mode, Plan, Progress};
///
/// struct InMemory {
///     config: ServerConfig,
///     streams: StreamSender,
/// }
///
/// impl Transport for InMemory {
///     async fn start_server(&self) -> Result<RemoteProcess, transport::Error> {
///         let (client_end, server_end) = tokio::io::duplex(1 << 20);
///         let config = self.config.clone();
///         tokio::spawn(async move { server::serve(server_end, &config).await });
///         Ok(RemoteProcess::from_stream(client_end))
///     }
///
///     async fn open_stream(&self, at: &Rendezvous) -> Result<BoxStream, transport::Error> {
///         let Rendezvous::Caller = at else {
///             return Err(transport::Error::SingleStream("an in-memory transport"));
///         };
///         let (client_end, server_end) = tokio::io::duplex(1 << 20);
///         self.streams
///             .deliver(Box::new(server_end))
///             .await
///             .map_err(|e| transport::Error::io("handing a stream to the server", e))?;
///         Ok(Box::new(client_end))
///     }
///
///     fn supports_extra_streams(&self) -> bool {
///         true
///     }
/// }
///
/// # #[tokio::main]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let (streams, inbox) = server::stream_channel();
/// let peer = InMemory { config: ServerConfig::default().inbox(inbox), streams };
/// let dir = tempfile::tempdir()?;
/// std::fs::write(dir.path().join("a.txt"), b"hello")?;
/// let plan = Plan::new(
///     vec![Location::Local(dir.path().join("a.txt"))],
///     Location::parse(&format!("in-memory:{}", dir.path().join("b.txt").display())),
///     CopyOptions::default(),
/// )?;
/// let server = peer.start_server().await?;
/// let done = fastcp::run_session(
///     &plan,
///     server.stream,
///     Mode::Caller { streams: 4 },
///     &[peer],
///     Arc::new(Progress::default()),
/// )
/// .await?;
/// assert_eq!(done.streams, 4);
/// assert_eq!(std::fs::read(dir.path().join("b.txt"))?, b"hello");
/// # Ok(()) }
/// ```
pub fn stream_channel() -> (StreamSender, StreamInbox) {
    let (tx, rx) = tokio::sync::mpsc::channel(usize::from(u16::MAX));
    (
        StreamSender(tx),
        StreamInbox(Arc::new(tokio::sync::Mutex::new(rx))),
    )
}

/// Hands data streams to an in-process server (see [`stream_channel`]).
#[derive(Clone, Debug)]
pub struct StreamSender(tokio::sync::mpsc::Sender<BoxStream>);

impl StreamSender {
    /// Hands `stream` to the server; fails when the server's config, and so its inbox, is
    /// gone.
    pub async fn deliver(&self, stream: BoxStream) -> std::io::Result<()> {
        self.0.send(stream).await.map_err(|_| {
            std::io::Error::new(
                std::io::ErrorKind::BrokenPipe,
                "the server takes no more streams",
            )
        })
    }
}

/// Where an in-process server takes the data streams its caller hands it (see
/// [`stream_channel`]).
#[derive(Clone)]
pub struct StreamInbox(Arc<tokio::sync::Mutex<tokio::sync::mpsc::Receiver<BoxStream>>>);

impl std::fmt::Debug for StreamInbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("StreamInbox")
    }
}

/// What a server lets its clients do, as borg's `serve --restrict-to-path` and
/// `--append-only` or rsync's `rrsync` do for backups: set it in a forced command in
/// `authorized_keys` (`command="fastcp server --restrict-to /srv/backup/host1 --no-delete"`)
/// and that key can only copy within that folder, and only as allowed.
///
/// A request it does not allow is refused before anything is read or written, with an error
/// of kind permission denied that the client shows.
///
/// ```
/// use fastcp::server::Policy;
///
/// let policy = Policy::default().confined_to("/srv/backup/host1").no_delete();
/// assert!(policy.deny_delete && !policy.read_only);
/// ```
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub struct Policy {
    /// Every path a client names is taken relative to this folder (a leading `/` or `~/`
    /// included), and must resolve, symlinks and `..` followed, to the folder or beneath it.
    /// Below that, the engine never follows a symlink on the receiving side, and a pull may
    /// not ask to follow them (`-L`).
    pub root: Option<PathBuf>,
    /// Refuse pushes: nothing is written here.
    pub read_only: bool,
    /// Refuse pulls: nothing is read out from here.
    pub write_only: bool,
    /// Refuse mirroring (`--delete`): a client cannot remove what it did not just copy.
    pub deny_delete: bool,
}

impl Policy {
    /// Confines clients to `root` (see [`Policy::root`]).
    pub fn confined_to(mut self, root: impl Into<PathBuf>) -> Policy {
        self.root = Some(root.into());
        self
    }

    /// Refuses pushes.
    pub fn read_only(mut self) -> Policy {
        self.read_only = true;
        self
    }

    /// Refuses pulls.
    pub fn write_only(mut self) -> Policy {
        self.write_only = true;
        self
    }

    /// Refuses `--delete`.
    pub fn no_delete(mut self) -> Policy {
        self.deny_delete = true;
        self
    }

    /// What the request asks that this policy refuses, if anything.
    fn check(&self, request: &Request) -> Result<(), Error> {
        let refused = [
            (
                self.read_only && request.direction == Direction::Push,
                "this server is read-only: it takes no files",
            ),
            (
                self.write_only && request.direction == Direction::Pull,
                "this server is write-only: it sends no files",
            ),
            (
                self.deny_delete && request.flags & flags::DELETE != 0,
                "this server does not allow --delete",
            ),
            (
                self.write_only
                    && request.flags & flags::DRY_RUN != 0
                    && request.flags & flags::DELETE != 0,
                "this server is write-only: it does not list what --delete would remove",
            ),
            (
                self.root.is_some() && request.flags & flags::FOLLOW_LINKS != 0,
                "this server is confined to a folder and does not follow symlinks",
            ),
        ];
        match refused.iter().find(|(on, _)| *on) {
            Some((_, why)) => Err(denied(why.to_string())),
            None => Ok(()),
        }
    }

    /// Refuses a push of a folder's contents (`DIR/.`) into the root itself: its top-level
    /// entry would then be named in the root's parent, outside.
    fn check_contents(&self, request: &Request, resolved: &[PathBuf]) -> Result<(), Error> {
        if let (Some(root), Some(dest)) = (&self.root, resolved.first())
            && request.direction == Direction::Push
            && request.flags & flags::CONTENTS != 0
            && dest.canonicalize().ok() == root.canonicalize().ok()
        {
            return Err(denied(
                "a folder's contents cannot go into the folder this server is confined to \
                 itself: name a folder beneath it"
                    .into(),
            ));
        }
        Ok(())
    }

    /// A path as the client named it, resolved on this host: beneath the root when there is
    /// one (see [`remote_path`] otherwise).
    fn path(&self, raw: &[u8]) -> Result<PathBuf, Error> {
        let Some(root) = &self.root else {
            return Ok(remote_path(raw));
        };
        let rel = raw.strip_prefix(b"~").unwrap_or(raw);
        let rel = &rel[rel.iter().take_while(|&&b| b == b'/').count()..];
        let path = root.join(OsStr::from_bytes(rel));
        self.check_beneath(&path)?;
        Ok(path)
    }

    /// Checks that `path`, with symlinks and `..` resolved as far as it exists, is the root or
    /// beneath it.
    fn check_beneath(&self, path: &Path) -> Result<(), Error> {
        let Some(root) = &self.root else {
            return Ok(());
        };
        let root = root
            .canonicalize()
            .map_err(|e| denied(format!("the folder this server is confined to: {e}")))?;
        // The longest part of the path that exists, resolved; the rest is yet to be made.
        let mut existing = path.to_path_buf();
        let mut rest = Vec::new();
        let resolved = loop {
            match existing.canonicalize() {
                Ok(r) => break r,
                Err(_) => match (existing.parent(), existing.file_name()) {
                    (Some(parent), Some(name)) => {
                        rest.push(name.to_owned());
                        existing = parent.to_path_buf();
                    }
                    _ => break existing.clone(),
                },
            }
        };
        let escapes = rest.iter().any(|n| n == "..");
        if escapes || !resolved.starts_with(&root) {
            return Err(denied(format!(
                "{}: outside the folder this server is confined to",
                path.display()
            )));
        }
        Ok(())
    }

    /// The paths a pull asked for, resolved and expanded as [`remote_sources`] does, each
    /// checked to be beneath the root.
    fn sources(&self, paths: &[bytes::Bytes]) -> Result<Vec<PathBuf>, Error> {
        if self.root.is_none() {
            return Ok(remote_sources(paths));
        }
        let named = paths
            .iter()
            .map(|p| self.path(p))
            .collect::<Result<Vec<_>, _>>()?;
        let expanded = fastcp_stream::expand_sources(&named);
        for p in &expanded {
            self.check_beneath(p)?;
        }
        Ok(expanded)
    }
}

/// A request the server's policy refuses.
fn denied(why: String) -> Error {
    Error::Io(std::io::Error::new(
        std::io::ErrorKind::PermissionDenied,
        why,
    ))
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            join_timeout: Duration::from_secs(15),
            max_streams: 64,
            tcp_bind: None,
            tcp_ports: None,
            tcp: TcpConfig::default(),
            tcp_client: ssh_connection_field(0),
            idle_timeout: Some(SERVER_IDLE_TIMEOUT),
            log: crate::Log::default(),
            policy: Policy::default(),
            setup_timeout: Some(SERVER_IDLE_TIMEOUT),
            inbox: None,
        }
    }
}

impl ServerConfig {
    /// Sets [`join_timeout`](ServerConfig::join_timeout).
    pub fn join_timeout(mut self, value: Duration) -> ServerConfig {
        self.join_timeout = value;
        self
    }

    /// Sets [`max_streams`](ServerConfig::max_streams).
    pub fn max_streams(mut self, value: u16) -> ServerConfig {
        self.max_streams = value;
        self
    }

    /// Sets [`tcp_bind`](ServerConfig::tcp_bind).
    pub fn tcp_bind(mut self, value: IpAddr) -> ServerConfig {
        self.tcp_bind = Some(value);
        self
    }

    /// Sets [`tcp_ports`](ServerConfig::tcp_ports).
    pub fn tcp_ports(mut self, value: RangeInclusive<u16>) -> ServerConfig {
        self.tcp_ports = Some(value);
        self
    }

    /// Sets [`tcp`](ServerConfig::tcp).
    pub fn tcp(mut self, value: TcpConfig) -> ServerConfig {
        self.tcp = value;
        self
    }

    /// Sets [`tcp_client`](ServerConfig::tcp_client).
    pub fn tcp_client(mut self, value: IpAddr) -> ServerConfig {
        self.tcp_client = Some(value);
        self
    }

    /// Sets [`idle_timeout`](ServerConfig::idle_timeout).
    pub fn idle_timeout(mut self, value: Duration) -> ServerConfig {
        self.idle_timeout = Some(value);
        self
    }

    /// Sets [`log`](ServerConfig::log).
    pub fn log(mut self, value: crate::Log) -> ServerConfig {
        self.log = value;
        self
    }

    /// Sets [`setup_timeout`](ServerConfig::setup_timeout).
    pub fn setup_timeout(mut self, value: Duration) -> ServerConfig {
        self.setup_timeout = Some(value);
        self
    }

    /// Sets [`policy`](ServerConfig::policy).
    pub fn policy(mut self, value: Policy) -> ServerConfig {
        self.policy = value;
        self
    }

    /// Sets [`inbox`](ServerConfig::inbox).
    pub fn inbox(mut self, value: StreamInbox) -> ServerConfig {
        self.inbox = Some(value);
        self
    }

    /// The address to listen on for TCP data streams.
    pub fn tcp_address(&self) -> IpAddr {
        self.tcp_bind
            .or_else(|| ssh_connection_field(2))
            .unwrap_or(IpAddr::V4(Ipv4Addr::LOCALHOST))
    }

    /// The port range for a session: the client's wish within this server's limits.
    fn port_range(&self, wish: (u16, u16)) -> Result<Option<RangeInclusive<u16>>, Error> {
        let wish = (wish != (0, 0)).then_some(wish.0..=wish.1);
        match (wish, &self.tcp_ports) {
            (None, mine) => Ok(mine.clone()),
            (Some(w), None) => Ok(Some(w)),
            (Some(w), Some(m)) => {
                let (lo, hi) = ((*w.start()).max(*m.start()), (*w.end()).min(*m.end()));
                if lo > hi {
                    return Err(Error::Unsupported(format!(
                        "the requested data ports {}-{} are outside this server's {}-{}",
                        w.start(),
                        w.end(),
                        m.start(),
                        m.end()
                    )));
                }
                Ok(Some(lo..=hi))
            }
        }
    }
}

/// An address from `SSH_CONNECTION` ("client_ip client_port server_ip server_port"): field 0
/// is the client's, 2 the server's.
fn ssh_connection_field(n: usize) -> Option<IpAddr> {
    std::env::var("SSH_CONNECTION")
        .ok()
        .and_then(|v| v.split_whitespace().nth(n).and_then(|ip| ip.parse().ok()))
}

/// Serves one session on `control` (the server's stdin and stdout) and returns what the engine
/// reported.
pub async fn serve<S>(control: S, config: &ServerConfig) -> Result<Report, Error>
where
    S: AsyncRead + AsyncWrite + Send + Unpin + 'static,
{
    let mut reader = FrameReader::new(control, session::MAX_FRAME);
    let agreed = session::handshake_within(&mut reader, config.setup_timeout).await?;
    let request = crate::client::within(
        config.setup_timeout,
        "waiting for the client's request",
        reader.next("waiting for the request"),
    )
    .await;
    let request = match request {
        Ok(Frame::Request(r)) => r,
        // A client that only wanted the hellos (`fastcp doctor`) ends here.
        Err(Error::ConnectionClosed(_)) if reader.buffer().is_empty() => {
            return Ok(Report::default());
        }
        Err(e) => return Err(e),
        Ok(other) => {
            return Err(Error::UnexpectedFrame {
                expected: "Request",
                got: other.name(),
            });
        }
    };
    match run(reader, &agreed, request, config).await {
        Ok(report) => Ok(report),
        Err((reader, err)) => {
            // Tell the client why, if the control stream still works.
            if let Some(mut reader) = reader {
                let _ = reader.send(&fatal_frame(&err)).await;
            }
            Err(err)
        }
    }
}

type Failure<S> = (Option<FrameReader<S>>, Error);

async fn run<S>(
    mut reader: FrameReader<S>,
    agreed: &fastcp_proto::Negotiated,
    request: Request,
    config: &ServerConfig,
) -> Result<Report, Failure<S>>
where
    S: AsyncRead + AsyncWrite + Send + Unpin + 'static,
{
    if let Err(e) = check_request(&request, config) {
        return Err((Some(reader), e));
    }
    // Resolved once, before anything is accepted: a path the policy refuses ends the session
    // here, with a clear error.
    let resolved = match request.direction {
        Direction::Pull => config.policy.sources(&request.paths),
        Direction::Push => request
            .paths
            .iter()
            .map(|p| config.policy.path(p))
            .collect::<Result<Vec<_>, _>>(),
    };
    let checked = |r: Vec<PathBuf>| config.policy.check_contents(&request, &r).map(|()| r);
    let resolved = match resolved.and_then(checked) {
        Ok(r) => r,
        Err(e) => return Err((Some(reader), e)),
    };
    let filter = match request_filter(&request) {
        Ok(f) => f,
        Err(e) => return Err((Some(reader), e)),
    };
    // A client older than version 14 walked by its `--files-from` list and rules asking the
    // rules of the folders that lead to the listed paths: a mirror that spared by this side's
    // reading (version 14, rsync's implied folders) could remove what it left out.
    if request.direction == Direction::Push
        && request.flags & flags::DELETE != 0
        && agreed.version < 14
        && filter
            .as_deref()
            .is_some_and(crate::client::implies_folders_by_rules)
    {
        let e = Error::Unsupported(format!(
            "--delete with --files-from and include or exclude rules needs protocol version 14 \
             on both ends, and the client {} speaks {}: upgrade fastcp on the client",
            crate::stream::escape(agreed.peer.software.as_bytes()),
            agreed.version
        ));
        return Err((Some(reader), e));
    }
    // A pull's walk starts now, while the data streams join; the send takes what it found.
    let send_config = (request.direction == Direction::Pull).then(|| {
        let mut cfg = send_config(&request, agreed, filter.clone());
        if request.flags & (flags::DRY_RUN | flags::THROUGHPUT) == 0 {
            cfg.walk_ahead = Some(fastcp_stream::WalkAhead::start(
                &resolved,
                &cfg.walk_config(),
            ));
        }
        cfg
    });
    let server_random = random32();
    let secret = fastcp_crypto::session_secret(&request.client_random, &server_random);
    let streams = request.streams.max(1);
    let pending = match prepare(&request, agreed, config) {
        Ok(p) => p,
        Err(e) => return Err((Some(reader), e)),
    };
    let accept = Frame::Accept(Accept {
        streams,
        rendezvous: pending.rendezvous(),
        server_random,
    });
    if let Err(e) = reader.send(&accept).await {
        return Err((None, e.into()));
    }
    let control: BoxStream = Box::new(reader.into_stream());
    // With TCP the control stream only carries the setup; keep it open until the end.
    let (data, _control) = match pending {
        Pending::Inline => (vec![control], None),
        Pending::Unix(listener) => {
            let joins = Joins::Unix(&listener.listener);
            let joining = accept_joins(joins, &secret, streams - 1, config);
            match watching(control, joining).await {
                (control, Ok(extra)) => (std::iter::once(control).chain(extra).collect(), None),
                (control, Err(e)) => return Err((None, tell(control, e).await)),
            }
        }
        Pending::Caller(inbox) => {
            let mut inbox = inbox.0.lock().await;
            let joins = Joins::Caller(&mut inbox);
            let joining = accept_joins(joins, &secret, streams - 1, config);
            match watching(control, joining).await {
                (control, Ok(extra)) => (std::iter::once(control).chain(extra).collect(), None),
                (control, Err(e)) => return Err((None, tell(control, e).await)),
            }
        }
        Pending::Tcp(listener, keys) => {
            let mut control = control;
            // A client that cannot reach the port gives up and closes the control stream;
            // stop waiting then rather than at the join timeout.
            let joined = tokio::select! {
                joined = listener.accept(streams, &secret, &keys, config.join_timeout) => {
                    joined.map_err(Error::Tcp)
                }
                _ = closed(&mut control) => Err(Error::ConnectionClosed(
                    "the client closed the session while the data streams were joining".into(),
                )),
            };
            match joined {
                Ok(sealed) => {
                    for (peer, why) in &sealed.refused {
                        config.log.warn(|| {
                            format!("refused a connection to the data port from {peer}: {why}")
                        });
                    }
                    if sealed.refused_count > sealed.refused.len() {
                        config.log.warn(|| {
                            format!(
                                "refused {} more connections to the data port",
                                sealed.refused_count - sealed.refused.len()
                            )
                        });
                    }
                    (
                        sealed
                            .streams
                            .into_iter()
                            .map(|s| Box::new(s) as BoxStream)
                            .collect(),
                        Some(control),
                    )
                }
                Err(e) => return Err((None, e)),
            }
        }
    };
    let progress = Arc::new(fastcp_stream::Progress::default());
    let compressed = request.compression == compress::ZSTD;
    let data = data
        .into_iter()
        .map(|stream| crate::data::counted(stream, &progress, compressed));
    let data: Vec<BoxStream> = if compressed {
        data.map(compress::zstd).collect()
    } else {
        data.collect()
    };
    if request.flags & flags::THROUGHPUT != 0 {
        return discard(data).await.map_err(|e| (None, e));
    }
    if request.flags & flags::DRY_RUN != 0 {
        let sources = resolved;
        let target = sources.first().cloned().unwrap_or_default();
        let stream = data.into_iter().next().expect("at least one stream");
        return crate::dry_run::serve_dry_run(
            stream,
            &request,
            &sources,
            &target,
            filter.clone(),
            config.idle_timeout,
        )
        .await
        .map_err(|e| (None, e));
    }
    let engine = async {
        match request.direction {
            Direction::Push => {
                let dest = resolved.first().cloned().unwrap_or_default();
                let cfg = receive_config(&request, agreed, filter.clone());
                crate::data::receive(&dest, data, &cfg, progress.clone()).await
            }
            Direction::Pull => {
                let cfg = send_config.expect("a pull's send config");
                crate::data::send(&resolved, data, &cfg, progress.clone()).await
            }
        }
        .map_err(Error::Engine)
    };
    crate::client::within_idle_limit(&progress, config.idle_timeout, engine)
        .await
        .map_err(|e| (None, e))
}

/// The request's include and exclude rules and `--files-from` list, if it has any.
fn request_filter(request: &Request) -> Result<Option<Arc<fastcp_stream::Filter>>, Error> {
    if request.flags & flags::FILTERS == 0 {
        return Ok(None);
    }
    let list = request.flags & flags::FILES_FROM != 0;
    let (listed, rules): (Vec<&Bytes>, Vec<&Bytes>) = request
        .filters
        .iter()
        .partition(|r| list && r.starts_with(b"= "));
    let rules: Vec<String> = rules
        .iter()
        .map(|r| String::from_utf8_lossy(r).into_owned())
        .collect();
    let mut f = fastcp_stream::Filter::default();
    f.add_rules(&rules.join("\n")).map_err(Error::Engine)?;
    // A folder's contents (`DIR/.`) are matched beneath it, as the client matches them: a
    // push says so, a pull names the folder so.
    let contents = match request.direction {
        Direction::Push => request.flags & flags::CONTENTS != 0,
        Direction::Pull => {
            request.paths.len() == 1
                && (&request.paths[0][..] == b"." || request.paths[0].ends_with(b"/."))
        }
    };
    if contents {
        f = f.rooted_in_source();
    }
    if list {
        f = f.files_from(listed.iter().map(|l| &l[2..]));
    }
    Ok(Some(Arc::new(f)))
}

/// How a push's request asks the server to receive.
fn receive_config(
    request: &Request,
    agreed: &fastcp_proto::Negotiated,
    filter: Option<Arc<fastcp_stream::Filter>>,
) -> fastcp_stream::ReceiveConfig {
    let on = |flag| request.flags & flag != 0;
    fastcp_stream::ReceiveConfig {
        preserve: on(flags::PRESERVE),
        recursive: on(flags::RECURSIVE),
        target_must_be_dir: on(flags::TARGET_IS_DIR),
        target_may_be_new_dir: on(flags::NEW_TARGET_DIR),
        contents: on(flags::CONTENTS),
        fsync: on(flags::FSYNC),
        skip_unchanged: on(flags::SKIP_UNCHANGED),
        delete: on(flags::DELETE),
        max_delete: request.max_delete.filter(|_| on(flags::MAX_DELETE)),
        checksum: on(flags::CHECKSUM),
        resume: on(flags::RESUME),
        hard_links: on(flags::HARD_LINKS),
        attrs: fastcp_stream::KeepAttrs::from_flags(request.flags),
        devices: on(flags::DEVICES),
        specials: on(flags::SPECIALS),
        filter,
        version: agreed.version,
        hash_content: !on(flags::NO_CONTENT_HASH),
        link_dest: request
            .link_dest
            .as_ref()
            .filter(|_| on(flags::LINK_DEST))
            .map(|p| PathBuf::from(std::ffi::OsStr::from_bytes(p))),
        skip_rules: fastcp_stream::SkipRules::from_flags(request.flags),
        ..Default::default()
    }
}

/// How a pull's request asks the server to send.
fn send_config(
    request: &Request,
    agreed: &fastcp_proto::Negotiated,
    filter: Option<Arc<fastcp_stream::Filter>>,
) -> fastcp_stream::SendConfig {
    let on = |flag| request.flags & flag != 0;
    fastcp_stream::SendConfig {
        preserve: on(flags::PRESERVE),
        recursive: on(flags::RECURSIVE),
        follow_links: on(flags::FOLLOW_LINKS),
        skip_unchanged: on(flags::SKIP_UNCHANGED),
        checksum: on(flags::CHECKSUM),
        resume: on(flags::RESUME),
        hard_links: on(flags::HARD_LINKS),
        attrs: fastcp_stream::KeepAttrs::from_flags(request.flags),
        devices: on(flags::DEVICES),
        specials: on(flags::SPECIALS),
        one_file_system: on(flags::ONE_FILE_SYSTEM),
        filter,
        version: agreed.version,
        hash_content: !on(flags::NO_CONTENT_HASH),
        ..Default::default()
    }
}

/// The server's side of a throughput test: reads every stream to its end, throwing the bytes
/// away, then reports their number on stream 0.
async fn discard(data: Vec<BoxStream>) -> Result<Report, Error> {
    let mut readers = Vec::new();
    let mut first = None;
    for (i, stream) in data.into_iter().enumerate() {
        let (mut read, write) = tokio::io::split(stream);
        if i == 0 {
            first = Some(write);
        }
        readers.push(tokio::spawn(async move {
            let mut buf = vec![0u8; 256 * 1024];
            let mut total = 0u64;
            loop {
                match read.read(&mut buf).await? {
                    0 => return Ok::<_, std::io::Error>(total),
                    n => total += n as u64,
                }
            }
        }));
    }
    let mut report = Report::default();
    for reader in readers {
        report.local.bytes += reader
            .await
            .map_err(|e| Error::Io(std::io::Error::other(e)))??;
    }
    if let Some(mut w) = first {
        crate::wire::write_frame(&mut w, &Frame::Done(report.local)).await?;
        let _ = w.shutdown().await;
    }
    Ok(report)
}

/// Returns once `control` reaches end of stream (or fails); anything read is dropped.
async fn closed(control: &mut BoxStream) {
    let mut buf = [0u8; 256];
    while let Ok(n) = control.read(&mut buf).await {
        if n == 0 {
            break;
        }
    }
}

/// Waits for `joining` (the client's extra streams) while watching `control`, which is data
/// stream 0: a client that gives up, closing it (say, when a login for another stream
/// failed), ends the wait at once rather than at the join timeout. What the client sends on it
/// meanwhile (its first data, once its own side has joined) stays in front of the stream.
async fn watching<T>(
    mut control: BoxStream,
    joining: impl Future<Output = Result<T, Error>>,
) -> (BoxStream, Result<T, Error>) {
    let mut joining = std::pin::pin!(joining);
    let mut first = [0u8; 4096];
    let read = tokio::select! {
        joined = &mut joining => return (control, joined),
        read = control.read(&mut first) => read,
    };
    match read {
        Ok(n @ 1..) => {
            let joined = joining.await;
            let prefix = Bytes::copy_from_slice(&first[..n]);
            (
                Box::new(crate::wire::Prefixed::new(prefix, control)),
                joined,
            )
        }
        Ok(0) => (
            control,
            Err(Error::ConnectionClosed(
                "the client closed the session while the data streams were joining".into(),
            )),
        ),
        Err(e) => (
            control,
            Err(Error::ConnectionClosed(format!(
                "the session failed while the data streams were joining: {e}"
            ))),
        ),
    }
}

/// A rendezvous waiting for the client's extra streams.
enum Pending {
    Inline,
    Unix(UnixRendezvous),
    Tcp(TcpRendezvous, KeyConfig),
    Caller(StreamInbox),
}

impl Pending {
    fn rendezvous(&self) -> Rendezvous {
        match self {
            Pending::Inline => Rendezvous::None,
            Pending::Unix(r) => Rendezvous::Unix(r.path_bytes()),
            Pending::Tcp(r, _) => Rendezvous::Tcp(r.port()),
            Pending::Caller(_) => Rendezvous::Caller,
        }
    }
}

/// Opens the rendezvous the request asks for.
fn prepare(
    request: &Request,
    agreed: &fastcp_proto::Negotiated,
    config: &ServerConfig,
) -> Result<Pending, Error> {
    match request.transport {
        TransportKind::Inline => Ok(Pending::Inline),
        TransportKind::Unix => Ok(Pending::Unix(UnixRendezvous::bind()?)),
        TransportKind::Caller => match &config.inbox {
            Some(inbox) => Ok(Pending::Caller(inbox.clone())),
            None => Err(Error::Unsupported(
                "this server takes no data streams from its caller (no inbox)".into(),
            )),
        },
        TransportKind::Tcp => {
            let suite = CipherSuite::from_id(request.cipher).ok_or_else(|| {
                Error::Unsupported(format!("unknown cipher id {}", request.cipher))
            })?;
            let peer = CpuFeatures::from_bits(agreed.peer.cpu_features);
            let choice = fastcp_crypto::choose(CpuFeatures::probe(), peer, Some(suite));
            let keys = KeyConfig::new(choice.suite, choice.provider);
            let ports = config.port_range(request.tcp_ports)?;
            // Forwarded streams come from the sshd on this host, to its loopback address.
            let forwarded = request.flags & flags::FORWARDED != 0;
            let (bind, client) = if forwarded {
                let loopback = IpAddr::V4(Ipv4Addr::LOCALHOST);
                (loopback, Some(loopback))
            } else {
                (config.tcp_address(), config.tcp_client)
            };
            let mut listener =
                TcpRendezvous::bind(bind, ports, config.tcp.clone()).map_err(Error::Tcp)?;
            if let Some(client) = client {
                listener.expect_client(client);
            }
            Ok(Pending::Tcp(listener, keys))
        }
    }
}

fn check_request(request: &Request, config: &ServerConfig) -> Result<(), Error> {
    config.policy.check(request)?;
    if request.flags & !flags::KNOWN != 0 {
        return Err(Error::Unsupported(format!(
            "unknown request flags 0x{:x}; upgrade fastcp on the server",
            request.flags & !flags::KNOWN
        )));
    }
    if !compress::SUPPORTED.contains(&request.compression) {
        return Err(Error::Unsupported(format!(
            "unknown compression id {}; upgrade fastcp on the server",
            request.compression
        )));
    }
    if request.flags & flags::THROUGHPUT != 0 && request.direction != Direction::Push {
        return Err(Error::Unsupported(
            "a throughput test sends from the client".into(),
        ));
    }
    if request.flags & flags::DRY_RUN != 0 && request.transport != TransportKind::Inline {
        return Err(Error::Unsupported(
            "a dry run runs on the control stream only".into(),
        ));
    }
    if request.streams > config.max_streams {
        return Err(Error::Unsupported(format!(
            "{} streams requested; this server allows at most {}",
            request.streams, config.max_streams
        )));
    }
    if request.transport == TransportKind::Inline && request.streams > 1 {
        return Err(Error::Unsupported(
            "several streams need a rendezvous transport".into(),
        ));
    }
    match request.direction {
        Direction::Push if request.paths.len() != 1 => Err(Error::Unsupported(
            "a push names exactly one destination".into(),
        )),
        Direction::Pull if request.paths.is_empty() => Err(Error::Unsupported(
            "a pull names at least one source".into(),
        )),
        _ => Ok(()),
    }
}

/// The paths a pull asked for, with `~` and wildcards expanded as scp's remote side does.
/// (In a push the one path is the destination, which is never expanded.)
fn remote_sources(paths: &[bytes::Bytes]) -> Vec<PathBuf> {
    let named: Vec<PathBuf> = paths.iter().map(|p| remote_path(p)).collect();
    fastcp_stream::expand_sources(&named)
}

/// A path as the client named it on this host: relative paths are relative to the server's
/// working directory (the login directory under sshd), an empty path is that directory, and a
/// leading `~/` is the home directory, as scp does.
fn remote_path(raw: &[u8]) -> PathBuf {
    if raw.is_empty() || raw == b"~" {
        return home().unwrap_or_else(|| ".".into());
    }
    if let Some(rest) = raw.strip_prefix(b"~/")
        && let Some(home) = home()
    {
        return home.join(OsStr::from_bytes(rest));
    }
    // `~user` and `~user/...`, as the shell (and so scp) expands them; an unknown user's
    // name stays as it is.
    if let Some(after) = raw.strip_prefix(b"~") {
        let (name, rest) = match after.iter().position(|&b| b == b'/') {
            Some(i) => (&after[..i], Some(&after[i + 1..])),
            None => (after, None),
        };
        if let Ok(name) = std::str::from_utf8(name)
            && let Ok(Some(user)) = nix::unistd::User::from_name(name)
        {
            return match rest {
                Some(rest) => user.dir.join(OsStr::from_bytes(rest)),
                None => user.dir,
            };
        }
    }
    PathBuf::from(OsStr::from_bytes(raw))
}

fn home() -> Option<PathBuf> {
    std::env::var_os("HOME").map(PathBuf::from)
}

/// A Unix socket in a fresh private (0700) directory, where forwarded SSH channels join.
struct UnixRendezvous {
    _dir: tempfile::TempDir,
    path: PathBuf,
    listener: UnixListener,
}

impl UnixRendezvous {
    /// Binds in `$TMPDIR`, or in /tmp when that cannot hold the socket (a `$TMPDIR` that
    /// does not exist or is read-only, or whose path is too long for a socket's).
    fn bind() -> Result<UnixRendezvous, Error> {
        let tmp = std::env::temp_dir();
        match UnixRendezvous::bind_in(&tmp) {
            Err(_) if tmp != Path::new("/tmp") => UnixRendezvous::bind_in(Path::new("/tmp")),
            bound => bound,
        }
    }

    fn bind_in(base: &Path) -> Result<UnixRendezvous, Error> {
        let dir = tempfile::Builder::new()
            .prefix("fastcp-")
            .tempdir_in(base)
            .map_err(|e| {
                Error::Io(std::io::Error::new(
                    e.kind(),
                    format!("creating the rendezvous directory: {e}"),
                ))
            })?;
        let path = dir.path().join("s");
        let listener = UnixListener::bind(&path)?;
        Ok(UnixRendezvous {
            _dir: dir,
            path,
            listener,
        })
    }

    fn path_bytes(&self) -> Bytes {
        Bytes::copy_from_slice(self.path.as_os_str().as_bytes())
    }
}

/// The frame that tells the client why the session ends.
fn fatal_frame(err: &Error) -> Frame {
    Frame::Error(ErrorFrame {
        code: err.code(),
        fatal: true,
        path: Bytes::new(),
        message: err.to_string(),
    })
}

/// Tells the client on `control` why the session ends, if it still listens; returns `err`.
async fn tell(mut control: BoxStream, err: Error) -> Error {
    let _ = crate::wire::write_frame(&mut control, &fatal_frame(&err)).await;
    let _ = control.shutdown().await;
    err
}

/// Where a session's extra streams come from, before they prove the secret.
enum Joins<'a> {
    Unix(&'a UnixListener),
    Caller(&'a mut tokio::sync::mpsc::Receiver<BoxStream>),
}

impl Joins<'_> {
    async fn next(&mut self) -> Result<BoxStream, Error> {
        match self {
            Joins::Unix(listener) => Ok(Box::new(listener.accept().await?.0)),
            Joins::Caller(inbox) => inbox.recv().await.ok_or_else(|| {
                Error::ConnectionClosed("the server's caller handed it no more streams".into())
            }),
        }
    }

    /// The kind of proof the streams bring.
    fn kind(&self) -> JoinKind {
        match self {
            Joins::Unix(_) => JoinKind::Unix,
            Joins::Caller(_) => JoinKind::Caller,
        }
    }
}

/// Accepts `n` streams from `joins`, each proving the secret with a [`Join`], and returns
/// them ordered by index.
async fn accept_joins(
    mut joins: Joins<'_>,
    secret: &fastcp_crypto::SessionSecret,
    n: u16,
    config: &ServerConfig,
) -> Result<Vec<BoxStream>, Error> {
    let kind = joins.kind();
    let mut slots: Vec<Option<BoxStream>> = (0..n).map(|_| None).collect();
    let joined = async {
        for _ in 0..n {
            let mut reader = FrameReader::new(joins.next().await?, session::MAX_FRAME);
            let join = match reader.next("joining").await? {
                Frame::Join(j) => j,
                other => {
                    return Err(Error::UnexpectedFrame {
                        expected: "Join",
                        got: other.name(),
                    });
                }
            };
            let slot = (join.index as usize)
                .checked_sub(1)
                .and_then(|i| slots.get_mut(i))
                .filter(|s| s.is_none());
            match slot {
                Some(slot) if session::verify_join(secret, kind, b"", join.index, &join.proof) => {
                    *slot = Some(Box::new(reader.into_stream()));
                }
                _ => return Err(Error::JoinRejected(join.index)),
            }
        }
        Ok::<_, Error>(())
    };
    tokio::time::timeout(config.join_timeout, joined)
        .await
        .map_err(|_| Error::Timeout("waiting for the data streams to connect".into()))??;
    Ok(slots
        .into_iter()
        .map(|s| s.expect("every slot filled"))
        .collect())
}

impl Error {
    pub(crate) fn code(&self) -> ErrorCode {
        match self {
            Error::Unsupported(_) => ErrorCode::Unsupported,
            Error::Protocol(_) | Error::UnexpectedFrame { .. } => ErrorCode::Protocol,
            Error::Io(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
                ErrorCode::PermissionDenied
            }
            Error::Io(_) => ErrorCode::Io,
            _ => ErrorCode::Other,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `~user` names that user's home, as in the shell and scp; an unknown user's name is a
    /// name like any other.
    #[test]
    fn remote_paths_expand_a_users_home() {
        let me = nix::unistd::User::from_uid(nix::unistd::getuid())
            .unwrap()
            .unwrap();
        let tilde = format!("~{}", me.name);
        assert_eq!(remote_path(tilde.as_bytes()), me.dir);
        assert_eq!(
            remote_path(format!("{tilde}/a/b").as_bytes()),
            me.dir.join("a/b")
        );
        assert_eq!(
            remote_path(b"~no-such-user-here/x"),
            PathBuf::from("~no-such-user-here/x")
        );
    }

    /// What the client sends on stream 0 while the server still waits for the other streams
    /// is kept, in front of the stream.
    #[tokio::test]
    async fn bytes_sent_while_the_streams_join_are_kept() {
        let (mut client, server) = tokio::io::duplex(1 << 16);
        let (joined_tx, joined_rx) = tokio::sync::oneshot::channel::<()>();
        let joining = async move {
            joined_rx.await.unwrap();
            Ok::<_, Error>("joined")
        };
        let waiting = tokio::spawn(watching(Box::new(server), joining));
        client.write_all(b"first frames").await.unwrap();
        tokio::task::yield_now().await;
        joined_tx.send(()).unwrap();
        let (mut control, joined) = waiting.await.unwrap();
        assert_eq!(joined.unwrap(), "joined");
        client.write_all(b", then more").await.unwrap();
        drop(client);
        let mut got = Vec::new();
        control.read_to_end(&mut got).await.unwrap();
        assert_eq!(got, b"first frames, then more");
    }

    /// A client older than version 14 that pushes with `--delete`, a `--files-from` list with
    /// a path in a folder and rules is refused: it walked asking the rules of the folders that
    /// lead to the listed paths, and a mirror that spared by this side's reading could remove
    /// what it left out. A client of version 14 gets past that check.
    #[tokio::test]
    async fn an_older_client_mirroring_a_list_with_rules_is_refused() {
        use fastcp_proto::{Frame, Hello, Request, TransportKind, encode};
        let dest = tempfile::tempdir().unwrap();
        for (version, refused) in [(13, true), (14, false)] {
            let (mut client, server) = tokio::io::duplex(1 << 20);
            let config = ServerConfig {
                setup_timeout: Some(Duration::from_secs(5)),
                ..ServerConfig::default()
            };
            let serving = tokio::spawn(async move { serve(server, &config).await });
            let mut wire = bytes::BytesMut::new();
            encode(
                &Frame::Hello(Hello {
                    version,
                    min_version: 1,
                    cpu_features: 0,
                    ciphers: vec![1, 2, 3],
                    compression: vec![0],
                    max_frame: fastcp_proto::DEFAULT_MAX_FRAME,
                    software: "fastcp old".into(),
                }),
                &mut wire,
            );
            encode(
                &Frame::Request(Request {
                    direction: Direction::Push,
                    paths: vec![Bytes::from(dest.path().display().to_string())],
                    flags: flags::RECURSIVE
                        | flags::DELETE
                        | flags::FILTERS
                        | flags::FILES_FROM
                        | flags::TARGET_IS_DIR,
                    streams: 1,
                    transport: TransportKind::Inline,
                    cipher: 0,
                    compression: 0,
                    client_random: [1; 32],
                    tcp_ports: (0, 0),
                    filters: vec![Bytes::from_static(b"- b/"), Bytes::from_static(b"= a/b/x")],
                    link_dest: None,
                    max_delete: None,
                }),
                &mut wire,
            );
            client.write_all(&wire).await.unwrap();
            // What the server answers is drained; it ends the session either way once the
            // client goes (a client of version 14 would go on to send its files).
            let draining = async {
                let mut got = Vec::new();
                let _ = tokio::time::timeout(Duration::from_secs(2), client.read_to_end(&mut got))
                    .await;
                drop(client);
                got
            };
            let said = String::from_utf8_lossy(&draining.await).into_owned();
            let ended = tokio::time::timeout(Duration::from_secs(10), serving)
                .await
                .unwrap()
                .unwrap();
            let upgrade = "upgrade fastcp on the client";
            if refused {
                let err = ended.unwrap_err().to_string();
                assert!(err.contains(upgrade), "{err}");
                assert!(said.contains(upgrade), "{said}");
            } else {
                assert!(!said.contains(upgrade), "{said}");
                if let Err(e) = ended {
                    assert!(!e.to_string().contains(upgrade), "{e}");
                }
            }
        }
    }

    /// A client that closes stream 0 while the streams join ends the wait.
    #[tokio::test]
    async fn a_client_gone_while_the_streams_join_ends_the_wait() {
        let (client, server) = tokio::io::duplex(1 << 16);
        drop(client);
        let never = std::future::pending::<Result<(), Error>>();
        let (_, joined) = watching(Box::new(server), never).await;
        assert!(
            matches!(joined, Err(Error::ConnectionClosed(_))),
            "{joined:?}"
        );
    }
}
