//! One SSH login to a remote host for any number of copies: [`Session`].
//!
//! [`copy_remote`](crate::copy_remote) is a [`Session`] used once. A program that runs many
//! copies to one host (a nightly backup of fifty folders) connects once and runs them all,
//! one after another or at the same time, over the same SSH connection: each copy starts
//! its own `fastcp server` on a channel of it, and what a copy learns (that the TCP data
//! port is unreachable, that fastcp had to be deployed) serves the next.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use fastcp_transport::{self as transport, AnyTransport, SshOptions, SshSession, Transport};

use crate::client::{
    DEFAULT_SSH_STREAMS, DEFAULT_TCP_STREAMS, Job, MAX_SSH_STREAMS, Mode, Outcome, Peers, Plan,
    SessionDone, Started, TransportChoice, TransportUsed, direct_address, session_over,
    stall_behind,
};
use crate::location::{Location, RemotePath};
use crate::log::Log;
use crate::sftp::NO_SFTP;
use crate::{CopyOptions, Error, Progress};

/// A logged-in SSH connection to one remote host, for any number of copies.
///
/// It connects once, with the user, port, ssh_config and keys of [`SshOptions`] (a
/// passphrase or password is asked once), and each [`copy`](Session::copy) runs over it:
/// pushes and pulls, one after another or at the same time. Copies that want more data
/// streams over SSH than one connection carries open further connections to the same host
/// once, and the session keeps them for the copies after. Dropping the session closes its
/// connections; [`close`](Session::close) says so explicitly.
///
/// ```no_run
/// # async fn run() -> Result<(), fastcp::Error> {
/// use std::sync::Arc;
/// use fastcp::{CopyOptions, Location, Plan, Progress, Session};
/// use fastcp::transport::SshOptions;
///
/// let target = Location::parse("backup@nas:nightly/");
/// let host = target.remote().expect("a remote operand");
/// let options = CopyOptions::default().recursive(true).skip_unchanged(true);
/// let session = Session::connect(host, &SshOptions::default(), &options).await?;
/// for folder in ["/etc", "/home", "/srv"] {
///     let plan = Plan::new(vec![Location::parse(folder)], target.clone(), options.clone())?;
///     let outcome = session.copy(&plan, Arc::new(Progress::default())).await?;
///     // A push: what arrived is the receiver's count, the peer's (`local` is what was sent).
///     println!("{folder}: {} files", outcome.report.peer.files);
/// }
/// session.close().await;
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct Session {
    /// `[user@]host`, as connected to.
    destination: String,
    user: Option<String>,
    host: String,
    port: Option<u16>,
    ssh: SshOptions,
    /// The first connection, then any opened for more SSH streams.
    connections: Mutex<Vec<Arc<AnyTransport>>>,
    /// A copy found the TCP data port unreachable: later ones use SSH channels at once.
    tcp_unreachable: AtomicBool,
    /// When a login for another data stream last failed: for [`LOGIN_RETRY`] after it, later
    /// copies use the connections there are and log in no more.
    logins_failed: FailedLogins,
    /// A second login to the same host, for the receiving half of relays with both operands
    /// here whose data goes over SSH channels (see [`Session::relay_target`]).
    relay_sibling: tokio::sync::OnceCell<Box<Session>>,
}

impl Session {
    /// Logs in to `remote`'s host (its user and port; its path is not used) as `ssh` says.
    ///
    /// From `options` it takes what applies to the connection: [`CopyOptions::timeout`]
    /// (SSH keepalives a third of it apart, and the longest wait for the server's host key,
    /// unless ssh_config sets ServerAliveInterval or ConnectTimeout) and [`CopyOptions::log`].
    pub async fn connect(
        remote: &RemotePath,
        ssh: &SshOptions,
        options: &CopyOptions,
    ) -> Result<Session, Error> {
        let mut ssh = ssh.clone();
        if ssh.port.is_none() {
            ssh.port = remote.port;
        }
        if let Some(t) = options.timeout.filter(|t| !t.is_zero()) {
            // A peer that stopped answering is also noticed below the copy: SSH keepalives,
            // a third of the timeout apart (three unanswered end the connection).
            if ssh.client.keepalive_interval.is_none() {
                ssh.client.keepalive_interval = Some((t / 3).max(Duration::from_secs(1)));
            }
        }
        // And a server that never speaks: the handshake waits no longer than a copy.
        let handshake_limit = options
            .timeout
            .filter(|t| !t.is_zero() && ssh.client.default_connect_timeout.is_none());
        if handshake_limit.is_some() {
            ssh.client.default_connect_timeout = handshake_limit;
        }
        let destination = match &remote.user {
            Some(user) => format!("{user}@{}", remote.host),
            None => remote.host.clone(),
        };
        if ssh.remote_path.is_none() && !options.no_deploy {
            crate::deploy::hash_this_binary_soon();
        }
        let peer = connect(&destination, &ssh, &options.log)
            .await
            .map_err(|e| match (e, handshake_limit) {
                (Error::Transport(t), Some(limit)) => timed_out_by_timeout(t, limit),
                (e, _) => e,
            })?;
        Ok(Session {
            destination,
            user: remote.user.clone(),
            host: remote.host.clone(),
            port: remote.port,
            ssh,
            connections: Mutex::new(vec![Arc::new(peer)]),
            tcp_unreachable: AtomicBool::new(false),
            logins_failed: FailedLogins::default(),
            relay_sibling: tokio::sync::OnceCell::new(),
        })
    }

    /// The `[user@]host` this session is logged in to.
    pub fn destination(&self) -> &str {
        &self.destination
    }

    /// Runs one copy over this session: `plan`'s remote side must be this session's host
    /// (same user, host and port); with both operands there, it copies between them as
    /// [`relay`](Session::relay) does. Cancel it with [`CopyOptions::cancel`] or by dropping the
    /// future; the session stays usable either way.
    pub async fn copy(&self, plan: &Plan, progress: Arc<Progress>) -> Result<Outcome, Error> {
        let copy = self.copy_now(plan, progress.clone());
        let outcome = crate::client::stoppable(plan, &progress, copy).await;
        crate::client::report_end(&progress, outcome, |o| &o.report)
    }

    /// Copies `plan`'s sources, on this session's host, to its target on `target`'s host,
    /// through this machine, as `scp -3` copies: this session's `fastcp server` sends as for
    /// a pull, `target`'s receives as for a push, and the frames pass between their data
    /// streams here, checked and counted, never written to this machine's disk (see
    /// [`fastcp_stream::relay`]). `target` may be this very session (both operands on one
    /// host; when the data goes over the built-in client's SSH channels, the receiving side
    /// then takes a second login of this session's, made as the first was). Both hosts need fastcp (self-deploy puts it there); a host where it cannot run
    /// fails the copy rather than falling back to SFTP.
    ///
    /// The two sessions agree on one protocol version (the lower of the two servers'), as
    /// many data streams and, unless both carry every byte sealed from end to end, hashed
    /// file content; each picks its own transport and compression. A host whose fastcp
    /// cannot serve the copy (too old for an option asked for, or with no version in common)
    /// gets this fastcp from self-deploy, as for a copy with that host alone, and the relay
    /// is tried again (not with [`CopyOptions::no_deploy`] or a remote program named in
    /// [`SshOptions::remote_path`]: the copy then fails). A failure or a cut on
    /// either side ends both at once, with an error ([`Error::Host`]) naming the host it
    /// came from; `--timeout` ([`CopyOptions::timeout`]) watches both, and
    /// [`CopyOptions::cancel`] stops both. Not with a dry run, `--sftp`, `--shard` or a
    /// filter predicate.
    ///
    /// ```no_run
    /// # async fn run() -> Result<(), fastcp::Error> {
    /// use std::sync::Arc;
    /// use fastcp::{CopyOptions, Location, Plan, Progress, Session};
    /// use fastcp::transport::SshOptions;
    ///
    /// let (from, to) = (Location::parse("web1:/srv/site"), Location::parse("backup@nas:sites/"));
    /// let options = CopyOptions::default().recursive(true).skip_unchanged(true);
    /// let ssh = SshOptions::default();
    /// let web1 = Session::connect(from.remote().expect("remote"), &ssh, &options).await?;
    /// let nas = Session::connect(to.remote().expect("remote"), &ssh, &options).await?;
    /// let plan = Plan::new(vec![from], to, options)?;
    /// let outcome = web1.relay(&nas, &plan, Arc::new(Progress::default())).await?;
    /// println!("{} files arrived", outcome.report.peer.files);
    /// # Ok(()) }
    /// ```
    pub async fn relay(
        &self,
        target: &Session,
        plan: &Plan,
        progress: Arc<Progress>,
    ) -> Result<Outcome, Error> {
        let copy = Box::pin(crate::relay::run(self, target, plan, progress.clone()));
        let outcome = crate::client::stoppable(plan, &progress, copy).await;
        crate::client::report_end(&progress, outcome, |o| &o.report)
    }

    /// Checks that the remote ones among `operands` are this session's login.
    pub(crate) fn check_operands(&self, operands: &[Location]) -> Result<(), Error> {
        let remotes = operands.iter().filter_map(Location::remote);
        check_remotes(
            remotes,
            self.user.as_deref(),
            &self.host,
            self.port,
            &self.ssh,
        )
    }

    /// The session that receives a relay `plan` whose sources and target are both on this
    /// session's host: this one, or, when the data would go over the built-in client's SSH
    /// channels, a second login to the host (no prompt: it authenticates as the first did),
    /// kept for the relays after. Channels that share a connection stall each other when one
    /// is left unread (see [`fastcp_transport::SshStream`]), and a relay reads the sending
    /// server's streams only as fast as the receiving one takes them: on connections both
    /// halves share, a receiver slower than its sender would stop the very connections it
    /// waits on. Sealed TCP streams and the system ssh's channels do not stall each other.
    ///
    /// Through the system ssh, whose connection master both halves share, the master logs
    /// in first, so that the two servers do not each log in (and ask) at once.
    pub(crate) async fn relay_target(&self, plan: &Plan) -> Result<&Session, Error> {
        let first = self.first_connection();
        let login = match &*first {
            AnyTransport::Builtin(login) => login,
            AnyTransport::Program(program) => {
                program.start_master().await;
                return Ok(self);
            }
        };
        // A TCP choice that cannot be met fails the relay's halves, naming the host.
        if !matches!(self.tcp_address(plan, &first).await, Ok(None)) {
            return Ok(self);
        }
        let sibling = self
            .relay_sibling
            .get_or_try_init(|| async {
                plan.options.log.info(|| {
                    format!(
                        "{}: logging in again, for the receiving side's SSH channels",
                        self.destination
                    )
                });
                let second = login.reconnect().await.map_err(Error::Transport)?;
                Ok::<_, Error>(Box::new(Session {
                    destination: self.destination.clone(),
                    user: self.user.clone(),
                    host: self.host.clone(),
                    port: self.port,
                    ssh: self.ssh.clone(),
                    connections: Mutex::new(vec![Arc::new(AnyTransport::Builtin(second))]),
                    tcp_unreachable: AtomicBool::new(self.tcp_unreachable.load(Relaxed)),
                    logins_failed: FailedLogins::default(),
                    relay_sibling: tokio::sync::OnceCell::new(),
                }))
            })
            .await?;
        Ok(sibling)
    }

    /// Runs one of a relay's two sessions (`plan` says which): picks its transport as
    /// [`run`](Session::run) does, and hands its streams to the relay. A session that finds
    /// on the way that another transport is needed (the TCP port out of reach, logins
    /// refused) remembers it and asks for the relay to be tried again.
    pub(crate) async fn relay_half(
        &self,
        plan: &Plan,
        progress: Arc<Progress>,
    ) -> Result<(SessionDone, TransportUsed), Error> {
        let half = plan.relay.as_ref().expect("a relay's plan");
        let log = &plan.options.log;
        let first: &[_] = &[self.first_connection()];
        let peer = &first[0];
        let job = Job::Relay;
        if let Some(addr) = self.tcp_address(plan, peer).await? {
            let mode = Mode::Tcp {
                addr,
                streams: plan.options.streams.unwrap_or(DEFAULT_TCP_STREAMS).max(1),
            };
            log.info(|| format!("sealed TCP to {addr}"));
            return match session_over(plan, peer, first, &self.ssh, mode, progress, job).await {
                Err(Error::Tcp(e))
                    if e.is_unreachable() && plan.options.transport == TransportChoice::Auto =>
                {
                    log.warn(|| format!("{e}; falling back to SSH channels"));
                    self.tcp_unreachable.store(true, Relaxed);
                    half.again();
                    Err(Error::Tcp(e))
                }
                started => relay_started(started?, TransportUsed::Tcp),
            };
        }
        let wanted = plan
            .options
            .streams
            .unwrap_or(DEFAULT_SSH_STREAMS)
            .clamp(1, MAX_SSH_STREAMS);
        if let AnyTransport::Program(_) = &**peer {
            let mode = match wanted {
                1 => Mode::Inline,
                streams => Mode::Forwarded { streams },
            };
            let started = session_over(plan, peer, first, &self.ssh, mode, progress, job).await;
            return relay_started(started?, TransportUsed::Ssh);
        }
        let mode = match wanted {
            1 => Mode::Inline,
            streams => Mode::Unix { streams },
        };
        let peers = self.peers(mode.streams(), log).await;
        let mode = within_logins(mode, peers.most());
        log.info(|| format!("SSH channels, {} stream(s)", mode.streams()));
        let started = session_over(plan, peer, &peers, &self.ssh, mode, progress, job).await;
        if started.is_err() && peers.unsettled() && peers.settle().await < mode.streams() {
            half.again();
        }
        self.keep(peers.peers);
        relay_started(started?, TransportUsed::Ssh)
    }

    /// Uploads this fastcp to this session's host (see [`crate::deploy`]) and runs it there
    /// from now on, in place of the fastcp that a relay `plan` found there of a protocol
    /// version that cannot serve it (`outdated` says why), as a copy with this machine does;
    /// whether it did. Not when the remote program is named (`--remote-path`), nor with
    /// `--no-deploy`, nor where a deployed one runs already (once per host), nor where none
    /// can be uploaded (said with a warning).
    pub(crate) async fn deploy_in_place_of_outdated(
        &self,
        plan: &Plan,
        outdated: &Error,
    ) -> Result<bool, Error> {
        let peer = self.first_connection();
        if !crate::deploy::allowed(&self.ssh, &plan.options, &peer) {
            return Ok(false);
        }
        let host = &self.destination;
        plan.options.log.warn(|| {
            format!(
                "{outdated}; meanwhile this fastcp is to run on {host}, from self-deploy's cache"
            )
        });
        let options = crate::deploy::DeployOptions::of(&plan.options);
        let log = plan.options.log.for_host(host);
        match crate::deploy::deploy(&peer, &options, &log).await {
            Ok(deployed) => {
                peer.set_remote_path(Some(deployed.path));
                Ok(true)
            }
            Err(Error::Unsupported(why)) => {
                log.warn(|| format!("this fastcp cannot run there: {why}"));
                Ok(false)
            }
            Err(e) => Err(e.on_host(host)),
        }
    }

    /// Where a copy's sealed TCP streams go, if it takes them: the host's address as the
    /// plan's transport allows.
    async fn tcp_address(
        &self,
        plan: &Plan,
        peer: &AnyTransport,
    ) -> Result<Option<std::net::IpAddr>, Error> {
        Ok(match plan.options.transport {
            TransportChoice::Ssh => None,
            TransportChoice::Auto if self.tcp_unreachable.load(Relaxed) => None,
            TransportChoice::Auto => direct_address(peer).await,
            TransportChoice::Tcp => Some(direct_address(peer).await.ok_or_else(|| {
                Error::Usage(
                    "the TCP transport needs a host fastcp reaches directly (not through ProxyJump \
                     or a ProxyCommand); use --transport ssh"
                        .into(),
                )
            })?),
        })
    }

    /// Closes the session's connections. Copies still running on it fail.
    pub async fn close(self) {
        drop(self);
    }

    async fn copy_now(&self, plan: &Plan, progress: Arc<Progress>) -> Result<Outcome, Error> {
        if plan.is_relay() {
            // Both operands on this session's host.
            // Boxed: two sessions' state would otherwise make every copy's future that big.
            return Box::pin(crate::relay::run(self, self, plan, progress)).await;
        }
        let plan = &plan.sharded().await?;
        // A predicate is code: it runs where the files are read, and never travels (rules
        // and a --files-from list do).
        let local_only = plan
            .options
            .filter
            .as_ref()
            .is_some_and(|f| f.has_predicate());
        if local_only && matches!(plan.dest, Location::Local(_)) {
            return Err(Error::Usage(
                "a filter predicate runs where the files are read: it cannot serve a pull (use \
                 include and exclude rules or a --files-from list, which travel)"
                    .into(),
            ));
        }
        if local_only && plan.options.delete && plan.dest.remote().is_some() {
            return Err(Error::Usage(
                "--delete with a filter predicate: the remote side cannot tell what it leaves \
                 out from what is gone, and would delete it"
                    .into(),
            ));
        }
        let started = Instant::now();
        let job = if plan.options.dry_run {
            Job::DryRun
        } else {
            Job::Copy
        };
        let (done, transport) = self.run(plan, progress, job).await?;
        let peer_wrote = plan.dest.remote().is_some() && !plan.options.dry_run;
        Ok(done.into_outcome(transport, started, peer_wrote))
    }

    /// Checks that `plan` copies to or from this session's login.
    fn check_host(&self, plan: &Plan) -> Result<(), Error> {
        check_logins(plan, self.user.as_deref(), &self.host, self.port, &self.ssh)
    }

    /// The connection copies start their server on.
    pub(crate) fn first_connection(&self) -> Arc<AnyTransport> {
        lock(&self.connections)[0].clone()
    }

    /// Why one of this session's connections ended, when its server stopped answering SSH
    /// keepalives (see [`Transport::stopped_answering`](transport::Transport::stopped_answering)):
    /// the first connection's, else an extra stream's.
    pub(crate) fn stopped_answering(&self) -> Option<transport::Error> {
        use transport::Transport as _;
        lock(&self.connections)
            .iter()
            .find_map(|c| c.stopped_answering())
    }

    /// Chooses the transport and runs `job` in one session; returns what it did and the
    /// transport that carried it (TCP, SSH or SFTP).
    pub(crate) async fn run(
        &self,
        plan: &Plan,
        progress: Arc<Progress>,
        job: Job,
    ) -> Result<(SessionDone, TransportUsed), Error> {
        self.check_host(plan)?;
        let log = &plan.options.log;
        let first: &[_] = &[self.first_connection()];
        let peer = &first[0];
        if plan.options.sftp {
            let done = match crate::sftp::copy(plan, peer, &self.logins_failed, progress).await {
                Err(e @ Error::RemoteCommand(_)) => return Err(unless_ssh_gave_up(peer, e).await),
                done => {
                    done.map_err(|e| stall_behind(e, first, Mode::Inline, plan.options.timeout))?
                }
            };
            return Ok((done, TransportUsed::Sftp));
        }
        if job == Job::DryRun {
            let started = session_over(
                plan,
                peer,
                first,
                &self.ssh,
                Mode::Inline,
                progress.clone(),
                job,
            )
            .await?;
            return self
                .over_sftp_if_needed(plan, peer, started, TransportUsed::Ssh, progress)
                .await;
        }
        if let Some(addr) = self.tcp_address(plan, peer).await? {
            let mode = Mode::Tcp {
                addr,
                streams: plan.options.streams.unwrap_or(DEFAULT_TCP_STREAMS).max(1),
            };
            log.info(|| {
                format!(
                    "transport: sealed TCP to {addr}, {} stream(s)",
                    mode.streams()
                )
            });
            match session_over(plan, peer, first, &self.ssh, mode, progress.clone(), job).await {
                Err(Error::Tcp(e))
                    if e.is_unreachable() && plan.options.transport == TransportChoice::Auto =>
                {
                    log.warn(|| format!("{e}; falling back to SSH channels"));
                    // Later copies of this session go straight to SSH channels.
                    self.tcp_unreachable.store(true, Relaxed);
                }
                other => {
                    return self
                        .over_sftp_if_needed(plan, peer, other?, TransportUsed::Tcp, progress)
                        .await;
                }
            }
        }
        let wanted = match plan.options.streams {
            Some(n) => n,
            None if plan.fits_one_stream() => {
                log.debug(|| "one stream: the files fit in one chunk".into());
                1
            }
            None => DEFAULT_SSH_STREAMS,
        }
        .clamp(1, MAX_SSH_STREAMS);
        if let (true, AnyTransport::Program(program)) = (wanted > 1, &**peer) {
            // The system ssh forwards TCP ports, not unix sockets: each stream is an `ssh -W` of
            // its own (a connection and an sshd process each, so they spread over cores, unless
            // ssh_config's ControlMaster shares one), sealed as TCP streams are.
            let mode = Mode::Forwarded { streams: wanted };
            log.info(|| {
                format!("transport: {wanted} sealed stream(s) forwarded by the system ssh (ssh -W)")
            });
            loop {
                match session_over(plan, peer, first, &self.ssh, mode, progress.clone(), job).await
                {
                    Err(Error::Tcp(
                        e @ (fastcp_transport::tcp::Error::Join { .. }
                        | fastcp_transport::tcp::Error::Unreachable { .. }),
                    )) => {
                        // Their own logins may need a prompt: ride the first one's instead.
                        if program.has_master() && !program.streams_through_master() {
                            log.info(|| {
                                "the extra streams could not log in without a prompt: they share \
                                 the first connection"
                                    .into()
                            });
                            program.set_streams_through_master(true);
                            continue;
                        }
                        log.warn(|| {
                            format!(
                                "the system ssh could not carry extra data streams (is TCP \
                                 forwarding allowed on the remote sshd?): {e}; copying over one \
                                 stream"
                            )
                        });
                        break;
                    }
                    other => {
                        return self
                            .over_sftp_if_needed(plan, peer, other?, TransportUsed::Ssh, progress)
                            .await;
                    }
                }
            }
        }
        let mode = if wanted > 1 && matches!(**peer, AnyTransport::Builtin(_)) {
            Mode::Unix { streams: wanted }
        } else {
            Mode::Inline
        };
        // Every data stream gets an SSH connection of its own. One sshd process encrypts
        // everything on its connection, so a second connection is faster than a second channel
        // (BENCHMARKS.md), and channels sharing a connection would stall each other: when the
        // engine leaves one channel unread while it waits for an entry on another, the SSH
        // client stops reading the whole connection.
        // The connections still to open log in while the server starts on the first, and
        // join it once they have (see `Logins`).
        let peers = self.peers(mode.streams(), log).await;
        // Fewer when this session's logins failed before, or a typed one failed just now.
        let mode = within_logins(mode, peers.most());
        log.info(|| {
            format!(
                "transport: SSH channels, {} stream(s) over {} connection(s)",
                mode.streams(),
                peers.most()
            )
        });
        let mut started =
            session_over(plan, peer, &peers, &self.ssh, mode, progress.clone(), job).await;
        // A login that failed failed the copy before anything was written: once every login
        // has ended, it runs again over the connections that logged in.
        if started.is_err() && peers.unsettled() {
            let most = peers.settle().await;
            if let Mode::Unix { streams } = mode
                && most < streams
            {
                let mode = match most {
                    2.. => Mode::Unix { streams: most },
                    _ => Mode::Inline,
                };
                started =
                    session_over(plan, peer, &peers, &self.ssh, mode, progress.clone(), job).await;
            }
        }
        // A server that refuses forwarded streams (AllowStreamLocalForwarding no, a key's
        // no-port-forwarding) still runs the copy over the session's own channel.
        if let (
            Mode::Unix { .. },
            Err(Error::Transport(fastcp_transport::Error::Channel { what, .. })),
        ) = (mode, &started)
            && what.starts_with("direct-streamlocal")
        {
            log.warn(|| {
                "the remote sshd refused extra data streams (forwarding is off there): \
                 copying over one stream"
                    .into()
            });
            started = session_over(
                plan,
                peer,
                first,
                &self.ssh,
                Mode::Inline,
                progress.clone(),
                job,
            )
            .await;
        }
        self.keep(peers.peers);
        self.over_sftp_if_needed(plan, peer, started?, TransportUsed::Ssh, progress)
            .await
    }

    /// `n` connections for a copy's data streams, at most: the session's own, then new ones
    /// that log in in the background (see [`Peer`]), but no new ones for a while once a login
    /// for a stream has failed in this session (see [`LOGIN_RETRY`]). When the first login was
    /// typed, the new ones may ask again
    /// (a one-time code), and a prompt can outlast the server's wait for its streams: they
    /// log in before the server starts.
    async fn peers<'a>(&'a self, n: u16, log: &'a Log) -> Logins<'a> {
        let have = lock(&self.connections).clone();
        let typed = matches!(&*have[0], AnyTransport::Builtin(s) if s.login_was_typed());
        let mut n = usize::from(n.max(1));
        if self.logins_failed.recent(typed) && n > have.len() {
            n = have.len();
            log.info(|| {
                format!(
                    "copying over {n} stream(s): logins for more streams failed in this session \
                     less than {} s ago",
                    LOGIN_RETRY.as_secs()
                )
            });
        }
        let mut peers: Vec<Peer> = have.iter().take(n).cloned().map(Peer::Ready).collect();
        // Only the built-in client logs in again; the system ssh forwards its streams.
        if let AnyTransport::Builtin(_) = &*have[0] {
            for _ in peers.len()..n {
                let first = have[0].clone();
                let login = tokio::spawn(async move {
                    match &*first {
                        AnyTransport::Builtin(first) => first.reconnect().await,
                        AnyTransport::Program(_) => Err(transport::Error::SingleStream("ssh")),
                    }
                });
                peers.push(Peer::LoggingIn(Login::new(login)));
            }
        }
        let logins = Logins {
            failed: &self.logins_failed,
            log,
            peers,
            carrying: tokio::sync::OnceCell::new(),
        };
        if typed {
            // Logged in now, as long as a prompt takes; `keep` keeps them after the copy, as
            // it does the others.
            logins.carrying.get_or_init(|| logins.ended(None)).await;
        }
        logins
    }

    /// Keeps the connections a copy logged in, for the copies after it; the logins it
    /// never waited for are abandoned.
    fn keep(&self, peers: Vec<Peer>) {
        let new = peers.into_iter().filter_map(|p| match p {
            Peer::LoggingIn(login) => login.done.get().cloned(),
            Peer::Ready(_) => None,
        });
        lock(&self.connections).extend(new);
    }
}

/// A copy's connections for its data streams: the first logged in, the others logging in
/// while the server starts, and joining it as soon as they have. A login that fails (an sshd
/// that drops logins beyond `MaxStartups`, a one-time password, a limit of one login per
/// user) fails that first run of the copy before anything is written (the server writes
/// nothing until every stream has joined); once every login has ended
/// ([`settle`](Logins::settle)), the copy runs again over the connections that logged in,
/// with a warning, rather than failing.
struct Logins<'a> {
    /// Marked when a login fails: the session's [`Session::logins_failed`].
    failed: &'a FailedLogins,
    log: &'a Log,
    peers: Vec<Peer>,
    /// Where in `peers` the connections that logged in are, once all logins have ended.
    carrying: tokio::sync::OnceCell<Vec<usize>>,
}

/// How long a copy that failed waits for the logins of its other connections still under
/// way: as long as a server waits for the streams to join. A login not done by then is given
/// up, as one that failed. The SFTP path gives each of its extra logins as long.
pub(crate) const LOGIN_WAIT: Duration = Duration::from_secs(15);

impl Logins<'_> {
    /// The most connections that may carry streams: those that logged in, once known.
    fn most(&self) -> u16 {
        let n = self.carrying.get().map_or(self.peers.len(), Vec::len);
        u16::try_from(n).unwrap_or(u16::MAX)
    }

    /// Whether a login may have failed: one failed, or one is still under way, and the logins
    /// have not been settled yet.
    fn unsettled(&self) -> bool {
        self.carrying.get().is_none()
            && self
                .peers
                .iter()
                .any(|p| matches!(p, Peer::LoggingIn(login) if login.done.get().is_none()))
    }

    /// Waits for every login, [`LOGIN_WAIT`] at most, once; returns how many connections
    /// logged in, the streams then go over those only.
    async fn settle(&self) -> u16 {
        self.carrying
            .get_or_init(|| self.ended(Some(LOGIN_WAIT)))
            .await;
        self.most()
    }

    /// Waits for every login, `patience` at most; returns where the connections that logged
    /// in are. When a login failed, warns and tells the session.
    async fn ended(&self, patience: Option<Duration>) -> Vec<usize> {
        let deadline = patience.map(|p| tokio::time::Instant::now() + p);
        let mut carrying = Vec::with_capacity(self.peers.len());
        let mut failed = None;
        for (i, peer) in self.peers.iter().enumerate() {
            let Peer::LoggingIn(login) = peer else {
                carrying.push(i);
                continue;
            };
            let connection = login.connection();
            let ended = match deadline {
                Some(deadline) => tokio::time::timeout_at(deadline, connection).await.ok(),
                None => Some(connection.await),
            };
            match ended {
                Some(Ok(_)) => carrying.push(i),
                Some(Err(e)) => {
                    failed.get_or_insert_with(|| {
                        login
                            .why
                            .get()
                            .cloned()
                            .unwrap_or_else(|| login_refused(&e))
                    });
                }
                None => {
                    failed.get_or_insert_with(login_too_slow);
                }
            }
        }
        if let Some(why) = failed {
            fewer_logins(
                self.failed,
                self.log,
                &why,
                &format!("{} stream(s)", carrying.len()),
            );
        }
        carrying
    }
}

impl Peers for Logins<'_> {
    type Peer = Peer;

    fn peer(&self, index: u16) -> &Peer {
        let index = usize::from(index);
        match self.carrying.get() {
            Some(carrying) => &self.peers[carrying[index % carrying.len()]],
            None => &self.peers[index % self.peers.len()],
        }
    }
}

/// Why a login for another data stream (or SFTP session) failed with `e`, as far as the
/// error tells, with the error's first line.
pub(crate) fn login_refused(e: &transport::Error) -> String {
    use transport::Error::*;
    let guess = match e {
        Auth { .. } => {
            "the remote host refused an extra login (a one-time password, or one login per \
             user at a time?)"
        }
        Connect { .. } | Timeout { .. } => {
            "an extra connection to the remote host failed (a firewall limiting new \
             connections?)"
        }
        _ => "the remote sshd refused extra logins (MaxStartups/PerSourceMaxStartups?)",
    };
    let said = e.to_string();
    let said = said.lines().next().unwrap_or_default();
    format!("{guess}: {said}")
}

/// Why a login for another data stream (or SFTP session) was given up after [`LOGIN_WAIT`].
pub(crate) fn login_too_slow() -> String {
    format!(
        "an extra login to the remote host took longer than {} s (a firewall limiting new \
         connections, a slow host?)",
        LOGIN_WAIT.as_secs()
    )
}

/// A copy's logins for more streams failed, `why`: warns once, saying what the copy goes on
/// over (`over`: "2 stream(s)"), and marks its session (`failed`, the session's
/// [`Session::logins_failed`]), which logs in no more for its copies in the next
/// [`LOGIN_RETRY`].
pub(crate) fn fewer_logins(failed: &FailedLogins, log: &Log, why: &str, over: &str) {
    failed.mark();
    log.warn(|| format!("{why}; copying over {over}"));
}

/// How long after a failed login for another stream a session's copies log in no more. A
/// refusal may not last (a burst of logins beyond `MaxStartups`, another client's), and a
/// session may live for days, so its copies try again after this, and after twice as long
/// each time they fail again (a day at most); one that fails again costs a first run that
/// writes nothing. A session whose first login was typed (a password, a one-time code)
/// does not try again: each try would ask.
pub(crate) const LOGIN_RETRY: Duration = Duration::from_secs(600);

/// The longest a session waits before it tries extra logins again.
const LOGIN_RETRY_MOST: Duration = Duration::from_secs(24 * 3600);

/// When a session's login for another stream last failed, and how many times one has
/// failed (see [`LOGIN_RETRY`]).
#[derive(Debug, Default)]
pub(crate) struct FailedLogins(Mutex<Option<(tokio::time::Instant, u32)>>);

impl FailedLogins {
    /// A login failed now.
    pub(crate) fn mark(&self) {
        let mut failed = lock(&self.0);
        let times = failed.map_or(0, |(_, n)| n);
        *failed = Some((tokio::time::Instant::now(), times.saturating_add(1)));
    }

    /// Whether copies log in no more: a login failed less than [`LOGIN_RETRY`] ago (twice
    /// that after two failures, and so on), or ever failed when `typed` (the first login was
    /// typed).
    pub(crate) fn recent(&self, typed: bool) -> bool {
        lock(&self.0).is_some_and(|(at, times)| {
            let wait = LOGIN_RETRY.saturating_mul(1 << (times - 1).min(16));
            typed || at.elapsed() < wait.min(LOGIN_RETRY_MOST)
        })
    }
}

/// One of a copy's connections: logged in, or logging in in the background while the server
/// starts on the first, so that over a long path the two waits overlap. A stream opened on
/// it waits for its login.
enum Peer {
    Ready(Arc<AnyTransport>),
    LoggingIn(Login),
}

/// A connection logging in (see [`Peer`]).
struct Login {
    task: tokio::sync::Mutex<Option<tokio::task::JoinHandle<Result<SshSession, transport::Error>>>>,
    done: std::sync::OnceLock<Arc<AnyTransport>>,
    /// Why the login failed, as [`login_refused`] tells it.
    why: std::sync::OnceLock<String>,
}

impl Login {
    /// The login `task` runs.
    fn new(task: tokio::task::JoinHandle<Result<SshSession, transport::Error>>) -> Login {
        Login {
            task: tokio::sync::Mutex::new(Some(task)),
            done: std::sync::OnceLock::new(),
            why: std::sync::OnceLock::new(),
        }
    }

    /// The connection once logged in; the login's error the first time it fails.
    async fn connection(&self) -> Result<Arc<AnyTransport>, transport::Error> {
        let mut task = self.task.lock().await;
        if let Some(done) = self.done.get() {
            return Ok(done.clone());
        }
        let failed = |why: String| {
            transport::Error::io(
                "logging in to the host again for another data stream",
                std::io::Error::other(why),
            )
        };
        let Some(login) = task.as_mut() else {
            return Err(failed("the login failed".into()));
        };
        // Awaited in place: a wait cancelled here leaves the login to `Drop`, which stops it.
        let joined = login.await;
        *task = None;
        let session = joined
            .map_err(|e| failed(e.to_string()))
            .and_then(|login| login)
            .inspect_err(|e| {
                let _ = self.why.set(login_refused(e));
            })?;
        Ok(self
            .done
            .get_or_init(|| Arc::new(AnyTransport::Builtin(session)))
            .clone())
    }
}

impl Drop for Login {
    fn drop(&mut self) {
        if let Some(login) = self.task.get_mut().take() {
            login.abort();
        }
    }
}

impl Transport for Peer {
    async fn start_server(&self) -> Result<transport::RemoteProcess, transport::Error> {
        match self {
            Peer::Ready(c) => c.start_server().await,
            Peer::LoggingIn(login) => login.connection().await?.start_server().await,
        }
    }

    async fn open_stream(
        &self,
        rendezvous: &transport::Rendezvous,
    ) -> Result<crate::BoxStream, transport::Error> {
        match self {
            Peer::Ready(c) => c.open_stream(rendezvous).await,
            Peer::LoggingIn(login) => login.connection().await?.open_stream(rendezvous).await,
        }
    }

    fn supports_extra_streams(&self) -> bool {
        match self {
            Peer::Ready(c) => c.supports_extra_streams(),
            // Only the built-in client logs in again.
            Peer::LoggingIn(_) => true,
        }
    }

    fn authenticates(&self) -> bool {
        match self {
            Peer::Ready(c) => c.authenticates(),
            // The built-in client's SSH, which does not (see `Transport::authenticates`).
            Peer::LoggingIn(_) => false,
        }
    }

    fn stopped_answering(&self) -> Option<transport::Error> {
        match self {
            Peer::Ready(c) => c.stopped_answering(),
            Peer::LoggingIn(login) => login.done.get()?.stopped_answering(),
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Session {
    /// Returns a finished session as carried by `transport`, or copies over SFTP.
    async fn over_sftp_if_needed(
        &self,
        plan: &Plan,
        peer: &AnyTransport,
        started: Started,
        transport: TransportUsed,
        progress: Arc<Progress>,
    ) -> Result<(SessionDone, TransportUsed), Error> {
        match started {
            Started::Done(done) => Ok((*done, transport)),
            Started::Sftp(why) if plan.options.no_sftp_fallback => {
                Err(Error::RemoteCommand(format!(
                    "{why}; --no-sftp-fallback forbids copying over SFTP instead: install fastcp \
                 there, or drop that option"
                )))
            }
            Started::Sftp(why) => {
                plan.options
                    .log
                    .warn(|| format!("{why}: copying over SFTP"));
                match crate::sftp::copy(plan, peer, &self.logins_failed, progress).await {
                    Ok(done) => Ok((done, TransportUsed::Sftp)),
                    Err(Error::RemoteCommand(no_sftp)) if no_sftp.starts_with(NO_SFTP) => {
                        Err(Error::RemoteCommand(format!(
                            "{why}; {no_sftp}. Install fastcp on the remote host, or allow it \
                             to be uploaded (no --no-deploy)"
                        )))
                    }
                    Err(e) => Err(stall_behind(
                        e,
                        std::slice::from_ref(peer),
                        Mode::Inline,
                        plan.options.timeout,
                    )),
                }
            }
        }
    }
}

/// SSH channels as many as there are logins for them (one stream rides the control
/// channel alone).
fn within_logins(mode: Mode, logins: u16) -> Mode {
    match mode {
        Mode::Unix { streams } => match streams.min(logins) {
            n @ 2.. => Mode::Unix { streams: n },
            _ => Mode::Inline,
        },
        mode => mode,
    }
}

/// A session of a relay that ran, or why it could not: the host has no fastcp that can run.
fn relay_started(
    started: Started,
    transport: TransportUsed,
) -> Result<(SessionDone, TransportUsed), Error> {
    match started {
        Started::Done(done) => Ok((*done, transport)),
        Started::Sftp(why) => Err(Error::RemoteCommand(format!(
            "{why}; a copy between two remote hosts needs fastcp on both (self-deploy normally \
             puts it there): install it there, or copy through this machine in two steps"
        ))),
    }
}

/// Checks that every remote operand of `plan` is the login `user@host` (port `port`, as
/// `ssh` reaches it): the same host and port, and a user that is the same once ssh_config
/// and the default user are applied (as root, `root@host:a` and `host:b` are one login).
pub(crate) fn check_logins(
    plan: &Plan,
    user: Option<&str>,
    host: &str,
    port: Option<u16>,
    ssh: &SshOptions,
) -> Result<(), Error> {
    if plan.remote().is_none() {
        return Err(Error::Usage("a remote copy needs a remote operand".into()));
    }
    let remotes = plan.sources().iter().chain([plan.dest()]);
    check_remotes(remotes.filter_map(Location::remote), user, host, port, ssh)
}

/// Checks that each of `remotes` is the login `user@host`, as [`check_logins`] does.
fn check_remotes<'a>(
    remotes: impl Iterator<Item = &'a RemotePath>,
    user: Option<&str>,
    host: &str,
    port: Option<u16>,
    ssh: &SshOptions,
) -> Result<(), Error> {
    let login = |user: Option<&str>| {
        let destination = match user {
            Some(u) => format!("{u}@{host}"),
            None => host.to_owned(),
        };
        let mut ssh = ssh.clone();
        ssh.port = ssh.port.or(port);
        transport::ssh::resolve_chain(&destination, &ssh)
            .ok()
            .and_then(|mut chain| chain.pop())
            .map(|hop| hop.user)
    };
    // The session's own login, resolved once, and only if an operand names another user.
    let ours = std::cell::OnceCell::new();
    for remote in remotes {
        let same_user = remote.user.as_deref() == user
            || matches!(
                (login(remote.user.as_deref()), ours.get_or_init(|| login(user))),
                (Some(a), Some(b)) if a == *b
            );
        if (remote.host.as_str(), remote.port) != (host, port) || !same_user {
            let logged_in = match user {
                Some(u) => format!("{u}@{host}"),
                None => host.to_owned(),
            };
            let named = match &remote.user {
                Some(u) => format!("{u}@{}", remote.host),
                None => remote.host.clone(),
            };
            return Err(Error::Usage(format!(
                "{named} is not the login of the copy's other operands ({logged_in}): copy \
                 from one login at a time"
            )));
        }
    }
    Ok(())
}

/// `err`, an SFTP session that did not start, or, when the system ssh that was to start it
/// gave up before (it could not connect, trust the host key or log in: status 255), that,
/// in ssh's words: the host is not to blame. An ssh program that failed otherwise before any
/// SFTP reply is named, with its status, in place of `err`: the host is not said to lack
/// SFTP when the program (`-S /bin/false`, say), or what it ran, ended first.
async fn unless_ssh_gave_up(peer: &AnyTransport, err: Error) -> Error {
    let AnyTransport::Program(program) = peer else {
        return err;
    };
    match program
        .last_login_ended(crate::client::EXIT_STATUS_WAIT)
        .await
    {
        // Without the subsystem, ssh says "subsystem request failed" (and exits 255 too):
        // `err` says so already, in ssh's words.
        Some((status, said))
            if status.code() == Some(255) && said.contains("subsystem request failed") =>
        {
            err
        }
        Some((status, said)) if status.code() == Some(255) && !said.is_empty() => {
            Error::SystemSsh(said)
        }
        // Not ssh's own failure, or not ssh: the program and how it ended are named, as
        // the copy over fastcp's own protocol names them.
        Some((status, said)) if !status.success() => {
            let said = if said.is_empty() {
                String::new()
            } else {
                format!(", saying: {said}")
            };
            let ended = match status.code() {
                Some(code) => format!("exited with status {code}"),
                None => format!("was {status}"),
            };
            Error::ConnectionClosed(format!(
                "the ssh program {} {ended} before any SFTP reply (once ssh has logged in, \
                 that is the status of the remote SFTP server){said}",
                program.program().display()
            ))
        }
        _ => err,
    }
}

/// `err`, or, when it is the SSH handshake's time limit and that limit was the copy's
/// `timeout` ([`CopyOptions::timeout`], `--timeout`) because ssh_config sets no
/// ConnectTimeout, an error that names `--timeout`.
fn timed_out_by_timeout(err: transport::Error, timeout: Duration) -> Error {
    let transport::Error::Timeout {
        host,
        port,
        connect_timeout: false,
        connected,
        ..
    } = &err
    else {
        return err.into();
    };
    let secs = timeout.as_secs_f32();
    let what = if *connected {
        format!(
            "the server took the connection, but its SSH banner and host key did not come within {secs} s"
        )
    } else {
        format!("no connection within {secs} s")
    };
    Error::Timeout(format!(
        "connecting to host {host} port {port}: {what} (--timeout {secs}, which limits the \
         SSH handshake as ssh_config sets no ConnectTimeout).\n\
         Check that the host is up and the port is an SSH server's, or give the handshake a \
         limit of its own with -o ConnectTimeout=SECS."
    ))
}

/// Connects as [`AnyTransport::connect`] does, telling `log` where and how.
async fn connect(destination: &str, ssh: &SshOptions, log: &Log) -> Result<AnyTransport, Error> {
    if let Some(program) = &ssh.ssh_program {
        log.info(|| format!("running {} to reach {destination}", program.display()));
    } else if let Ok(chain) = transport::ssh::resolve_chain(destination, ssh) {
        for (i, hop) in chain.iter().enumerate() {
            let role = if i + 1 == chain.len() {
                "host"
            } else {
                "jump host"
            };
            log.info(|| {
                format!(
                    "connecting to {role} {}@{} port {} ({})",
                    hop.user, hop.host_name, hop.port, hop.alias
                )
            });
            log.debug(|| {
                format!(
                    "  identity files {:?}, known hosts {:?}, StrictHostKeyChecking {:?}",
                    hop.identity_files, hop.user_known_hosts_files, hop.strict_host_key_checking
                )
            });
            if !hop.passed_over.is_empty() {
                log.info(|| {
                    format!(
                        "  passed over, as a copy needs nothing of them: {}",
                        hop.passed_over.join(", ")
                    )
                });
            }
        }
    }
    let peer = match AnyTransport::connect(destination, ssh).await {
        // ssh_config asks for what only OpenSSH's client does: let it do the connecting.
        Err(transport::Error::NeedsSystemSsh(why)) if ssh.ssh_program.is_none() => {
            log.info(|| format!("{why}: the built-in SSH client lacks it; running the system ssh"));
            let mut system = ssh.clone();
            system.ssh_program = Some(PathBuf::from("ssh"));
            AnyTransport::connect(destination, &system).await?
        }
        other => other?,
    };
    if let AnyTransport::Builtin(session) = &peer {
        match session.peer_addr() {
            Some(addr) => log.info(|| format!("authenticated to {addr}")),
            None => log.info(|| "authenticated (through a proxy)".into()),
        }
    }
    for warning in peer.warnings() {
        log.warn(|| warning.clone());
    }
    Ok(peer)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A login that never ends is given up after [`LOGIN_WAIT`], as one that fails is: the
    /// copy's second run has neither's stream, the copy warns once, and its session logs in
    /// no more.
    #[tokio::test(start_paused = true)]
    async fn logins_that_fail_or_never_end_carry_no_stream() {
        let refused = Login::new(tokio::spawn(async {
            Err(transport::Error::Protocol(russh::Error::Disconnect))
        }));
        let endless = Login::new(tokio::spawn(std::future::pending()));
        let warnings = Arc::new(Mutex::new(Vec::new()));
        let log = Log::new({
            let warnings = warnings.clone();
            move |_, line| lock(&warnings).push(line.to_owned())
        });
        let failed = FailedLogins::default();
        let logins = Logins {
            failed: &failed,
            log: &log,
            peers: vec![Peer::LoggingIn(refused), Peer::LoggingIn(endless)],
            carrying: tokio::sync::OnceCell::new(),
        };
        let started = tokio::time::Instant::now();
        assert!(logins.unsettled());
        let settled = tokio::time::timeout(2 * LOGIN_WAIT, logins.settle()).await;
        assert_eq!(settled, Ok(0), "the wait has a bound");
        assert_eq!(started.elapsed(), LOGIN_WAIT);
        assert_eq!(logins.settle().await, 0, "settled once");
        assert!(!logins.unsettled());
        assert!(failed.recent(false));
        let warnings = lock(&warnings);
        assert_eq!(warnings.len(), 1, "{warnings:?}");
        assert!(
            warnings[0].starts_with("the remote sshd refused extra logins"),
            "{warnings:?}"
        );
    }

    /// A session logs in no more for [`LOGIN_RETRY`] after a login failed, then tries again,
    /// waiting twice as long after each failure, up to a day; never when the login was typed.
    #[tokio::test(start_paused = true)]
    async fn a_failed_login_is_tried_again_after_a_while() {
        let failed = FailedLogins::default();
        assert!(!failed.recent(false));
        assert!(!failed.recent(true));
        failed.mark();
        assert!(failed.recent(false));
        tokio::time::advance(LOGIN_RETRY - Duration::from_secs(1)).await;
        assert!(failed.recent(false));
        tokio::time::advance(Duration::from_secs(1)).await;
        assert!(!failed.recent(false));
        // A typed login is not asked for again.
        assert!(failed.recent(true));
        // Failing again, it waits twice as long, then four times, up to a day.
        failed.mark();
        tokio::time::advance(2 * LOGIN_RETRY - Duration::from_secs(1)).await;
        assert!(failed.recent(false));
        tokio::time::advance(Duration::from_secs(1)).await;
        assert!(!failed.recent(false));
        for _ in 0..40 {
            failed.mark();
        }
        tokio::time::advance(LOGIN_RETRY_MOST).await;
        assert!(!failed.recent(false));
    }
}
