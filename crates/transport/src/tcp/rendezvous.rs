//! The server's side: a listening port where the session's data streams join.

use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::ops::RangeInclusive;
use std::sync::Arc;
use std::time::Duration;

use bytes::BytesMut;
use fastcp_crypto::{Direction, JoinKind, KeyConfig, SessionSecret};
use fastcp_proto::{Challenge, Decoder, Frame};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::task::JoinSet;
use tokio::time::Instant;

use super::{Error, Rejection, SealedStream, TcpConfig};

/// Bytes of an encoded `Challenge` frame.
pub(crate) const CHALLENGE_LEN: usize = fastcp_proto::HEADER_LEN + 32;
/// Bytes of an encoded `Join` frame.
pub(crate) const JOIN_LEN: usize = fastcp_proto::HEADER_LEN + 2 + 32;

/// Connections being challenged at once, beyond the streams expected. Bounds what a flood of
/// connections can cost while a session joins.
const EXTRA_PENDING: usize = 16;

/// Connections from addresses other than the expected client's being challenged at once.
/// Past it, such connections are closed unchallenged, so a flood from elsewhere cannot take
/// the slots the client's own connections need.
const STRANGERS_PENDING: usize = 4;

/// Refused connections remembered for the report; later ones are only counted.
const REFUSED_KEPT: usize = 16;

/// What [`TcpRendezvous::accept`] returns: the session's streams, and the connections it
/// refused on the way.
#[derive(Debug)]
pub struct Joined {
    /// The data streams, ordered by index.
    pub streams: Vec<SealedStream<TcpStream>>,
    /// The first connections that failed to authenticate and were dropped, with why.
    pub refused: Vec<(SocketAddr, Rejection)>,
    /// How many connections were refused in all.
    pub refused_count: usize,
}

/// The server's listening port for one session's TCP data streams.
///
/// Bind it before answering the client's request, send [`TcpRendezvous::port`] in `Accept`,
/// then [`TcpRendezvous::accept`] the streams. See the [module docs](super) for the join and
/// what happens to connections that fail it.
#[derive(Debug)]
pub struct TcpRendezvous {
    listener: TcpListener,
    local: SocketAddr,
    config: TcpConfig,
    client: Option<IpAddr>,
}

impl TcpRendezvous {
    /// Listens on `addr`, on a free port from `ports` (tried from a random starting point,
    /// so concurrent sessions spread out), or on any free port when `ports` is `None`.
    ///
    /// `config`'s buffer sizes apply to the listening socket, so accepted connections
    /// inherit them. Must be called within a Tokio runtime.
    pub fn bind(
        addr: IpAddr,
        ports: Option<RangeInclusive<u16>>,
        config: TcpConfig,
    ) -> Result<TcpRendezvous, Error> {
        let listener = match ports {
            None => listen(SocketAddr::new(addr, 0), &config).map_err(|source| Error::Bind {
                addr: SocketAddr::new(addr, 0),
                source,
            })?,
            Some(range) => {
                let (start, end) = (*range.start(), *range.end());
                if start == 0 || start > end {
                    return Err(Error::PortRange { start, end });
                }
                let count = u32::from(end - start) + 1;
                let offset = u32::from_be_bytes(fastcp_crypto::random_bytes()?) % count;
                let mut bound = None;
                for i in 0..count {
                    let port = start + ((offset + i) % count) as u16;
                    let at = SocketAddr::new(addr, port);
                    match listen(at, &config) {
                        Ok(l) => {
                            bound = Some(l);
                            break;
                        }
                        Err(e) if e.kind() == io::ErrorKind::AddrInUse => continue,
                        Err(source) => return Err(Error::Bind { addr: at, source }),
                    }
                }
                bound.ok_or(Error::NoFreePort { addr, start, end })?
            }
        };
        let local = listener.local_addr().map_err(|source| Error::Bind {
            addr: SocketAddr::new(addr, 0),
            source,
        })?;
        Ok(TcpRendezvous {
            listener,
            local,
            config,
            client: None,
        })
    }

    /// The address the session's client is expected to connect from (the SSH connection's
    /// client address). Connections from it are always challenged; connections from anywhere
    /// else are challenged only a few at a time, so strangers cannot crowd the client out.
    /// Without it every connection is treated alike.
    pub fn expect_client(&mut self, ip: IpAddr) {
        self.client = Some(ip);
    }

    /// The port to announce to the client.
    pub fn port(&self) -> u16 {
        self.local.port()
    }

    /// The address and port listened on.
    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }

    /// Accepts exactly `n` data streams (indices `1..=n`), each proving it knows `secret`, and
    /// returns them sealed with `keys`, ordered by index. The port closes when this returns.
    ///
    /// Connections are challenged concurrently, each within [`TcpConfig::join_timeout`]; all
    /// `n` must have joined within `timeout` ([`Error::JoinTimeout`]). A connection that does
    /// not authenticate (silent, not a `Join`, a wrong proof) is dropped and the session goes
    /// on: it is listed in [`Joined::refused`]. One that proves the secret but claims an index
    /// out of range or already taken comes from a broken client, and aborts with
    /// [`Error::Rejected`].
    pub async fn accept(
        self,
        n: u16,
        secret: &SessionSecret,
        keys: &KeyConfig,
        timeout: Duration,
    ) -> Result<Joined, Error> {
        let deadline = Instant::now() + timeout;
        let job = Arc::new(Job {
            secret: secret.clone(),
            keys: *keys,
            config: self.config.clone(),
            streams: n,
        });
        let mut slots: Vec<Option<SealedStream<TcpStream>>> = (0..n).map(|_| None).collect();
        let mut joined: u16 = 0;
        let mut refused = Vec::new();
        let mut refused_count = 0;
        let mut refuse = |peer: SocketAddr, reason: Rejection| {
            refused_count += 1;
            if refused.len() < REFUSED_KEPT {
                refused.push((peer, reason));
            }
        };
        let mut pending = JoinSet::new();
        // Who each challenge in `pending` is talking to, by task.
        let mut peers: HashMap<tokio::task::Id, SocketAddr> = HashMap::new();
        let mut strangers = 0;
        let max_pending = usize::from(n) + EXTRA_PENDING;
        while joined < n {
            tokio::select! {
                accepted = self.listener.accept(), if pending.len() < max_pending => {
                    match accepted {
                        Ok((conn, peer)) => {
                            let stranger = self.client.is_some_and(|ip| ip != peer.ip());
                            if stranger && strangers >= STRANGERS_PENDING {
                                refuse(peer, Rejection::Busy);
                                continue; // dropping `conn` closes it unchallenged
                            }
                            strangers += usize::from(stranger);
                            let job = job.clone();
                            let task = pending.spawn(async move {
                                (stranger, challenge(conn, peer, job).await)
                            });
                            peers.insert(task.id(), peer);
                        }
                        Err(e) if is_transient(&e) => continue,
                        Err(e) => return Err(Error::Accept(e)),
                    }
                }
                Some(done) = pending.join_next_with_id() => {
                    let (stranger, outcome) = match done {
                        Ok((id, done)) => {
                            peers.remove(&id);
                            done
                        }
                        Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
                        Err(e) => {
                            peers.remove(&e.id());
                            continue;
                        }
                    };
                    strangers -= usize::from(stranger);
                    match outcome? {
                        Outcome::Silent => {}
                        Outcome::Refused(peer, reason) => refuse(peer, reason),
                        Outcome::Broken(peer, reason) => {
                            return Err(Error::Rejected { peer, reason });
                        }
                        Outcome::Joined(peer, stream) => {
                            let index = stream.index();
                            let slot = &mut slots[usize::from(index) - 1];
                            if slot.is_some() {
                                return Err(Error::Rejected {
                                    peer,
                                    reason: Rejection::Duplicate { index },
                                });
                            }
                            *slot = Some(*stream);
                            joined += 1;
                        }
                    }
                }
                () = tokio::time::sleep_until(deadline) => {
                    return Err(Error::JoinTimeout { joined, expected: n, timeout });
                }
            }
        }
        // Every stream has joined: dropping the listener closes the port. Connections still
        // being challenged are closed unanswered, and reported with those that failed
        // meanwhile, so that no stranger goes unnoticed however the joins were ordered.
        pending.abort_all();
        while let Some(done) = pending.join_next_with_id().await {
            match done {
                Ok((_, (_, Ok(Outcome::Refused(peer, reason))))) => refuse(peer, reason),
                Ok(_) => {}
                Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
                Err(e) => {
                    if let Some(peer) = peers.remove(&e.id()) {
                        refuse(peer, Rejection::Late);
                    }
                }
            }
        }
        Ok(Joined {
            streams: slots
                .into_iter()
                .map(|s| s.expect("every index joined"))
                .collect(),
            refused,
            refused_count,
        })
    }
}

/// What every connection's challenge needs.
struct Job {
    secret: SessionSecret,
    keys: KeyConfig,
    config: TcpConfig,
    streams: u16,
}

/// How one connection's challenge ended.
enum Outcome {
    /// It sent nothing, then closed or timed out: ignored.
    Silent,
    /// It failed to authenticate: dropped, and reported.
    Refused(SocketAddr, Rejection),
    /// It proved the secret but asked for a stream the session does not have: the client is
    /// broken, and the session aborts.
    Broken(SocketAddr, Rejection),
    /// A valid join for an index in range.
    Joined(SocketAddr, Box<SealedStream<TcpStream>>),
}

/// Sends a fresh challenge on `conn` and checks the `Join` that answers it.
async fn challenge(mut conn: TcpStream, peer: SocketAddr, job: Arc<Job>) -> Result<Outcome, Error> {
    let nonce: [u8; 32] = fastcp_crypto::random_bytes()?;
    let _ = conn.set_nodelay(true);
    let mut out = BytesMut::with_capacity(CHALLENGE_LEN);
    fastcp_proto::encode(&Frame::Challenge(Challenge { nonce }), &mut out);

    let mut join = [0u8; JOIN_LEN];
    let mut got = 0;
    let exchange = async {
        conn.write_all(&out).await?;
        while got < JOIN_LEN {
            match conn.read(&mut join[got..]).await? {
                0 => break,
                n => got += n,
            }
        }
        Ok::<(), io::Error>(())
    };
    // Whatever stopped the exchange (a close, a reset, the timeout), only the bytes that
    // arrived matter: none is a silent connection; some but not all, a broken join.
    let _ = tokio::time::timeout(job.config.join_timeout, exchange).await;
    if got == 0 {
        return Ok(Outcome::Silent);
    }
    if got < JOIN_LEN {
        // A frame of another kind may be shorter than a Join: report what it was.
        if let Some(reason) = not_a_join(&join[..got]) {
            return Ok(Outcome::Refused(peer, reason));
        }
        return Ok(Outcome::Refused(peer, Rejection::Incomplete { got }));
    }
    let frame = match Decoder::new(JOIN_LEN as u32).decode(&mut BytesMut::from(&join[..])) {
        Ok(Some(Frame::Join(j))) => j,
        Ok(Some(other)) => {
            let what = format!("a {} frame", other.name());
            return Ok(Outcome::Refused(peer, Rejection::NotAJoin(what)));
        }
        Ok(None) => return Ok(Outcome::Refused(peer, Rejection::Incomplete { got })),
        Err(e) => {
            let what = format!("bytes that are not a fastcp frame ({e})");
            return Ok(Outcome::Refused(peer, Rejection::NotAJoin(what)));
        }
    };
    let index = frame.index;
    if !fastcp_crypto::verify_join(&job.secret, JoinKind::Tcp, &nonce, index, &frame.proof) {
        return Ok(Outcome::Refused(peer, Rejection::BadProof { index }));
    }
    if index == 0 || index > job.streams {
        let streams = job.streams;
        return Ok(Outcome::Broken(
            peer,
            Rejection::IndexOutOfRange { index, streams },
        ));
    }
    let stream = SealedStream::new(
        conn,
        &job.secret,
        &job.keys,
        Direction::ServerToClient,
        index,
        job.config.record_len,
    )?;
    Ok(Outcome::Joined(peer, Box::new(stream)))
}

/// Why a short prefix is certainly not a `Join`, if it shows that already.
fn not_a_join(prefix: &[u8]) -> Option<Rejection> {
    let kind = *prefix.first()?;
    if kind != fastcp_proto::kind::JOIN {
        return Some(Rejection::NotAJoin(format!(
            "bytes starting with 0x{kind:02x}"
        )));
    }
    None
}

/// Errors from `accept` that concern one connection, not the listener.
fn is_transient(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::Interrupted
            | io::ErrorKind::WouldBlock
    )
}

/// A listening socket on `addr` with `config`'s buffer sizes.
fn listen(addr: SocketAddr, config: &TcpConfig) -> io::Result<TcpListener> {
    let socket = match addr {
        SocketAddr::V4(_) => TcpSocket::new_v4()?,
        SocketAddr::V6(_) => TcpSocket::new_v6()?,
    };
    socket.set_reuseaddr(true)?;
    if let Some(size) = config.send_buffer {
        socket.set_send_buffer_size(size)?;
    }
    if let Some(size) = config.recv_buffer {
        socket.set_recv_buffer_size(size)?;
    }
    socket.bind(addr)?;
    socket.listen(128)
}
