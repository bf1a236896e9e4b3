//! Copies between two remote hosts through this machine, as `scp -3` copies (and scp does by
//! default since OpenSSH 8.7): a session with the sources' host, whose `fastcp server`
//! sends as for a pull, and one with the target's host, whose server receives as for a
//! push; [`fastcp_stream::relay`] passes the frames between their data streams. Nothing is
//! written on this machine.
//!
//! The two sessions agree, before either sends its request, on what changes the frames:
//! one protocol version (the lower of the two servers', offered to both), the same number
//! of data streams (the fewer), and whether file content is hashed (not only when every
//! stream of both sessions authenticates each byte end to end). Each picks its own
//! transport and compression. See [`Session::relay`](crate::Session::relay).
//!
//! A host whose fastcp is of a protocol version that cannot serve the copy (too old for an
//! option asked for, or with no version in common) gets this fastcp uploaded by self-deploy,
//! as a copy with this machine does, once per host, and the relay is tried again.

use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::{Notify, watch};

use crate::client::{
    Outcome, Plan, SessionDone, TransportUsed, cancellable, stopped_answering, top_level_name,
    within_idle_limit,
};
use crate::location::{Location, RemotePath};
use crate::transport::SshOptions;
use crate::{BoxStream, Error, Progress, Session};

/// Which end of a relay a session serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum End {
    /// The sources' host: its server sends.
    Source,
    /// The target's host: its server receives.
    Target,
}

impl End {
    fn index(self) -> usize {
        match self {
            End::Source => 0,
            End::Target => 1,
        }
    }

    fn other(self) -> End {
        match self {
            End::Source => End::Target,
            End::Target => End::Source,
        }
    }
}

/// One session's part in a relay: its end, and where it meets the other session.
#[derive(Debug, Clone)]
pub(crate) struct Half {
    pub(crate) end: End,
    link: Arc<Link>,
    /// The other session's host, as its errors name it.
    other: String,
}

/// What a session offers the other before its request: what its server speaks and how its
/// streams go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Offer {
    /// The newest protocol version the server speaks (from its hello).
    pub(crate) version: u16,
    /// Every data stream authenticates each byte from this process to the server.
    pub(crate) authenticated: bool,
    /// The data streams its transport would carry.
    pub(crate) streams: u16,
}

/// The longest one session waits for the other's offer: well within the time a server
/// that said hello waits for its client.
const MEET_WAIT: Duration = Duration::from_secs(55);
const _: () = assert!(MEET_WAIT.as_secs() < crate::server::SERVER_IDLE_TIMEOUT.as_secs());

/// Where the two sessions of one relay meet.
#[derive(Default)]
struct Link {
    offers: Mutex<[Option<Offer>; 2]>,
    handed: Mutex<[Option<Vec<BoxStream>>; 2]>,
    max_frame: Mutex<Option<u32>>,
    changed: Notify,
    /// The relay's end: `Some(true)` once it went through.
    finished: watch::Sender<Option<bool>>,
    /// A session learned something (a TCP port out of reach, logins refused) that makes a
    /// second try of the whole relay take another way.
    again: AtomicBool,
    /// Each end's host (as [`End::index`] orders them) has a fastcp of a protocol version
    /// that cannot serve the copy (see [`Half::outdated`]).
    outdated: [AtomicBool; 2],
}

impl std::fmt::Debug for Link {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Link")
            .field("offers", &*lock(&self.offers))
            .finish_non_exhaustive()
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Half {
    /// Offers `ours` and waits for the other session's offer: the version both use (the
    /// lower), whether both authenticate every byte, and the streams both open (the fewer).
    ///
    /// Waits at most [`MEET_WAIT`]: this session's server has said hello and gives up on a
    /// client that does not answer within
    /// [`SERVER_IDLE_TIMEOUT`](crate::server::SERVER_IDLE_TIMEOUT). The other session may
    /// still be installing fastcp on its host then.
    pub(crate) async fn meet(&self, ours: Offer) -> Result<Offer, Error> {
        tokio::time::timeout(MEET_WAIT, self.offer(ours))
            .await
            .unwrap_or_else(|_| {
                Err(Error::Timeout(format!(
                    "the session with {} did not start within {} s, while this host's server \
                     waited",
                    self.other,
                    MEET_WAIT.as_secs()
                )))
            })
    }

    async fn offer(&self, ours: Offer) -> Result<Offer, Error> {
        {
            let mut offers = lock(&self.link.offers);
            if offers[self.end.index()].replace(ours).is_some() {
                // A second try of one session: the other went on with the first's offer.
                self.again();
                return Err(Error::ConnectionClosed(
                    "a relay's session was set up twice".into(),
                ));
            }
        }
        self.link.changed.notify_waiters();
        loop {
            let notified = self.link.changed.notified();
            if let [Some(a), Some(b)] = *lock(&self.link.offers) {
                return Ok(Offer {
                    version: a.version.min(b.version),
                    authenticated: a.authenticated && b.authenticated,
                    streams: a.streams.min(b.streams),
                });
            }
            notified.await;
        }
    }

    /// Hands this session's data streams to the relay, and waits for its end: `Ok` once it
    /// went through, an error (the relay's own is reported by whoever runs it) otherwise.
    pub(crate) async fn hand(&self, streams: Vec<BoxStream>, max_frame: u32) -> Result<(), Error> {
        let mut finished = self.link.finished.subscribe();
        {
            let mut cap = lock(&self.link.max_frame);
            *cap = Some(cap.map_or(max_frame, |c| c.min(max_frame)));
        }
        lock(&self.link.handed)[self.end.index()] = Some(streams);
        self.link.changed.notify_waiters();
        match finished.wait_for(Option::is_some).await.map(|f| *f) {
            Ok(Some(true)) => Ok(()),
            _ => Err(Error::ConnectionClosed(
                "the copy between the two hosts stopped".into(),
            )),
        }
    }

    /// Asks for the whole relay to be tried again (see [`Link::again`]).
    pub(crate) fn again(&self) {
        self.link.again.store(true, Relaxed);
    }

    /// Notes which host's fastcp `err`, a version gap this session met (an option too new
    /// for the version both sessions agreed on, or no version in common with its server),
    /// found outdated: this session's own, or, when its server speaks the version the option
    /// needs (as [`too_old`](crate::client::too_old) tells), the other host's, which the
    /// error then names.
    pub(crate) fn outdated(&self, err: Error) -> Error {
        let own = lock(&self.link.offers)[self.end.index()];
        let (end, err) = match err {
            Error::PeerTooOld {
                what,
                needs,
                speaks,
                ..
            } if own.is_some_and(|o| o.version >= needs) => (
                self.end.other(),
                Error::PeerTooOld {
                    what,
                    needs,
                    peer: format!("fastcp on {}", self.other),
                    speaks,
                },
            ),
            err => (self.end, err),
        };
        self.link.outdated[end.index()].store(true, Relaxed);
        err
    }
}

impl Link {
    /// Both sessions' data streams, sources' first, and the frame cap both accept.
    async fn handed(&self) -> (Vec<BoxStream>, Vec<BoxStream>, u32) {
        loop {
            let notified = self.changed.notified();
            {
                let mut handed = lock(&self.handed);
                if handed.iter().all(Option::is_some) {
                    let [a, b] = std::mem::take(&mut *handed);
                    let cap = lock(&self.max_frame).unwrap_or(fastcp_proto::DEFAULT_MAX_FRAME);
                    return (a.expect("handed"), b.expect("handed"), cap);
                }
            }
            notified.await;
        }
    }
}

/// Copies `plan` between its two remote hosts, logging in to each (once when both operands
/// name one login): [`copy_remote`](crate::copy_remote) for such a plan.
pub(crate) async fn copy(
    plan: &Plan,
    ssh: &SshOptions,
    progress: Arc<Progress>,
) -> Result<Outcome, Error> {
    let connect = async {
        check(plan)?;
        let from = plan.sources()[0].remote().expect("remote sources");
        let to = plan.dest().remote().expect("a remote target");
        let login = |r: &RemotePath| (r.user.clone(), r.host.clone(), r.port);
        let destination = |r: &RemotePath| match &r.user {
            Some(user) => format!("{user}@{}", r.host),
            None => r.host.clone(),
        };
        let named = |r: &RemotePath| {
            let host = destination(r);
            move |e: Error| e.on_host(&host)
        };
        // Each login's lines name its host, as its errors do.
        let options = |r: &RemotePath| {
            let mut options = plan.options().clone();
            options.log = options.log.for_host(&destination(r));
            options
        };
        // One after the other: each login may ask for a password on the terminal.
        let source = Session::connect(from, ssh, &options(from))
            .await
            .map_err(named(from))?;
        let target = if login(from) == login(to) {
            None
        } else {
            let session = Session::connect(to, ssh, &options(to))
                .await
                .map_err(named(to))?;
            Some(session)
        };
        Ok((source, target))
    };
    let (source, target) = match cancellable(plan.options().cancel.as_ref(), connect).await {
        Ok(sessions) => sessions,
        Err(e) => {
            progress.aborted(&e);
            return Err(e);
        }
    };
    source
        .relay(target.as_ref().unwrap_or(&source), plan, progress)
        .await
}

/// How many times a relay is tried when a session learned a better way on the way (besides
/// the tries after self-deploy replaced an outdated fastcp, at most one per host).
const TRIES: usize = 3;

/// Runs `plan` from `source`'s host to `target`'s (see [`Session::relay`]).
pub(crate) async fn run(
    source: &Session,
    target: &Session,
    plan: &Plan,
    progress: Arc<Progress>,
) -> Result<Outcome, Error> {
    check(plan)?;
    source.check_operands(plan.sources())?;
    target.check_operands(std::slice::from_ref(plan.dest()))?;
    let started = Instant::now();
    let mut tries = 0;
    loop {
        tries += 1;
        // Both operands on one host: the receiving half may need connections of its own.
        let target = if std::ptr::eq(source, target) {
            source
                .relay_target(plan)
                .await
                .map_err(|e| e.on_host(source.destination()))?
        } else {
            target
        };
        let link = Arc::new(Link::default());
        match attempt(source, target, plan, &link, progress.clone()).await {
            // A host's fastcp cannot serve the copy: this one runs there instead, where it
            // may (as with a copy to that host alone), and the relay is tried again.
            Err(e) if link.outdated.iter().any(|o| o.load(Relaxed)) => {
                let mut deployed = false;
                for (session, outdated) in [source, target].into_iter().zip(&link.outdated) {
                    if outdated.load(Relaxed) {
                        deployed |= session.deploy_in_place_of_outdated(plan, &e).await?;
                    }
                }
                if !deployed {
                    return Err(e);
                }
                tries -= 1;
            }
            Err(_) if link.again.load(Relaxed) && tries < TRIES => {
                plan.options
                    .log
                    .info(|| "setting the copy between the two hosts up again".into());
            }
            // The receiving host wrote the copy (a relay has no dry run).
            done => {
                return done.map(|(done, transport)| done.into_outcome(transport, started, true));
            }
        }
    }
}

/// What a relay cannot do (yet), said before anything connects.
fn check(plan: &Plan) -> Result<(), Error> {
    let refuse = |what: &str| {
        Err(Error::Usage(format!(
            "{what} is not supported for a copy between two remote hosts; copy through this \
             machine in two steps"
        )))
    };
    if plan.sources().iter().any(|s| s.remote().is_none()) || plan.dest().remote().is_none() {
        return Err(Error::Usage(
            "a copy between two remote hosts has its sources on one host and its target on \
             another (or the same) host"
                .into(),
        ));
    }
    let options = plan.options();
    if options.dry_run {
        return refuse("-n (dry run)");
    }
    if options.sftp {
        return refuse("--sftp");
    }
    if options.filter.as_ref().is_some_and(|f| f.has_predicate()) {
        return refuse("a filter predicate (it runs where the files are read)");
    }
    if options.shard.is_some() {
        return refuse("--shard");
    }
    Ok(())
}

/// One try: both sessions set up, meeting before their requests, then the relay between
/// their streams. A session's failure before the relay runs, or the relay's, ends the
/// other session at once (its future is dropped, which closes its connection's channels).
async fn attempt(
    source: &Session,
    target: &Session,
    plan: &Plan,
    link: &Arc<Link>,
    progress: Arc<Progress>,
) -> Result<(SessionDone, TransportUsed), Error> {
    let half = |end, other: &Session| Half {
        end,
        link: link.clone(),
        other: other.destination().to_owned(),
    };
    // Each session's lines name its host, as its errors do.
    let relaying = |end, session: &Session, other: &Session| {
        let mut plan = plan.relaying(half(end, other));
        plan.options.log = plan.options.log.for_host(session.destination());
        plan
    };
    let (plan_a, plan_b) = (
        relaying(End::Source, source, target),
        relaying(End::Target, target, source),
    );
    let named = |session: &Session| {
        let host = session.destination().to_owned();
        move |e: Error| e.on_host(&host)
    };
    let a = async {
        source
            .relay_half(&plan_a, progress.clone())
            .await
            .map_err(named(source))
    };
    let b = async {
        target
            .relay_half(&plan_b, progress.clone())
            .await
            .map_err(named(target))
    };
    let engine = async {
        let (streams_a, streams_b, max_frame) = link.handed().await;
        let waits: [Arc<AtomicUsize>; 2] = Default::default();
        let streams_a = Watched::all(streams_a, &waits[0]);
        let streams_b = Watched::all(streams_b, &waits[1]);
        let mut config = fastcp_stream::RelayConfig::default();
        config.max_frame = max_frame;
        config.checksum = plan.options().checksum;
        config.hard_links = plan.options().hard_links;
        // As a pull: a source that names no entry of its own (`a:`, `a:~`, `a:dir/.`)
        // arrives under a name only its host knows, so any name is accepted then.
        config.expected_top_level = plan
            .sources()
            .iter()
            .filter_map(Location::remote)
            .map(|r| top_level_name(&r.path))
            .collect();
        let relayed = async {
            fastcp_stream::relay(streams_a, streams_b, &config, progress.clone())
                .await
                .map_err(|e| {
                    let session = match e.side {
                        fastcp_stream::Side::Receiver => target,
                        _ => source,
                    };
                    Error::Engine(e.error).on_host(session.destination())
                })
        };
        let report = within_idle_limit(&progress, plan.options().timeout, relayed)
            .await
            .map_err(|e| match e {
                // The idle limit's own error: the relay's name a host already.
                Error::Timeout(_) => stalled(plan, [source, target], &waits),
                e if e.kind() == crate::ErrorKind::Cancelled => e,
                // A login whose server stopped answering SSH keepalives closed its streams.
                e => [source, target]
                    .into_iter()
                    .find_map(|s| Some((s, s.stopped_answering()?)))
                    .map_or(e, |(s, stopped)| {
                        stopped_answering(stopped, plan.options().timeout).on_host(s.destination())
                    }),
            });
        link.finished.send_replace(Some(report.is_ok()));
        report
    };
    let halves = async { tokio::try_join!(a, b) };
    tokio::pin!(halves, engine);
    let report = tokio::select! {
        ended = &mut halves => {
            return Err(match ended {
                Err(e) => e,
                Ok(_) => Error::ConnectionClosed("a session ended before the copy".into()),
            });
        }
        report = &mut engine => report?,
    };
    let ((done_a, transport_a), (done_b, transport_b)) = halves.await?;
    let transport = match (transport_a, transport_b) {
        (a, b) if a == b => a,
        (TransportUsed::Tcp, _) => TransportUsed::TcpThenSsh,
        _ => TransportUsed::SshThenTcp,
    };
    let done = SessionDone {
        report,
        streams: done_a.streams,
        cipher: done_a.cipher.or(done_b.cipher),
        provider: done_a.provider.or(done_b.provider),
        compression: done_a.compression.or(done_b.compression),
        remote_software: format!("{}, {}", done_a.remote_software, done_b.remote_software),
        listing: Vec::new(),
        data_time: done_a.data_time.max(done_b.data_time),
    };
    Ok((done, transport))
}

/// The error of a relay in which no data moved for `--timeout`: it names the host whose
/// streams took nothing more while this side waited to write to them (so the host that went
/// quiet), or both hosts when this side waited to write to neither: each then had nothing to
/// read from the other, and which one stopped cannot be told from here.
fn stalled(plan: &Plan, sessions: [&Session; 2], waits: &[Arc<AtomicUsize>; 2]) -> Error {
    let secs = plan.options().timeout.unwrap_or_default().as_secs_f32();
    let [source, target] = sessions.map(Session::destination);
    match waits.each_ref().map(|w| w.load(Relaxed) > 0) {
        [waited_a, waited_b] if waited_a != waited_b => {
            let host = if waited_a { source } else { target };
            Error::Timeout(format!(
                "while copying: no data moved for {secs} s; the host took nothing more of \
                 what the other sent (--timeout)"
            ))
            .on_host(host)
        }
        _ => Error::Timeout(format!(
            "while copying between {source} and {target}: no data moved for {secs} s; one of \
             them or the network stopped answering (--timeout)"
        )),
    }
}

/// A data stream of one end of a relay that counts, in `waiting` (shared by the end's
/// streams), the writes to it that wait: its host takes nothing more.
struct Watched {
    inner: BoxStream,
    waiting: Arc<AtomicUsize>,
    blocked: bool,
}

impl Watched {
    fn all(streams: Vec<BoxStream>, waiting: &Arc<AtomicUsize>) -> Vec<Watched> {
        streams
            .into_iter()
            .map(|inner| Watched {
                inner,
                waiting: waiting.clone(),
                blocked: false,
            })
            .collect()
    }

    /// Notes whether a write waits, as `poll` says.
    fn note<T>(&mut self, poll: Poll<T>) -> Poll<T> {
        let blocked = poll.is_pending();
        if blocked != self.blocked {
            self.blocked = blocked;
            if blocked {
                self.waiting.fetch_add(1, Relaxed);
            } else {
                self.waiting.fetch_sub(1, Relaxed);
            }
        }
        poll
    }
}

impl Drop for Watched {
    fn drop(&mut self) {
        if self.blocked {
            self.waiting.fetch_sub(1, Relaxed);
        }
    }
}

impl AsyncRead for Watched {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl AsyncWrite for Watched {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let poll = Pin::new(&mut self.inner).poll_write(cx, buf);
        self.note(poll)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let poll = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        self.note(poll)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let poll = Pin::new(&mut self.inner).poll_flush(cx);
        self.note(poll)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let poll = Pin::new(&mut self.inner).poll_shutdown(cx);
        self.note(poll)
    }
}
