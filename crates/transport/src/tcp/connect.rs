//! The client's side: opening the session's data streams to the server's port.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;

use bytes::BytesMut;
use fastcp_crypto::{Direction, JoinKind, KeyConfig, SessionSecret};
use fastcp_proto::{Decoder, Frame, Join};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};
use tokio::task::JoinSet;

use super::rendezvous::CHALLENGE_LEN;
use super::{Error, SealedStream, TcpConfig};

/// Opens `n` data streams (indices `1..=n`) to the server's data port at `addr`, joins each
/// with a proof of `secret`, and returns them sealed with `keys`, ordered by index.
///
/// `addr` is the address the client reached the server at, with the port from `Accept`.
/// The connections are made concurrently with `TCP_NODELAY` and `config`'s buffer sizes.
///
/// The work happens in two steps, and the error tells which one failed:
/// 1. All `n` TCP connections are established, each within [`TcpConfig::connect_timeout`].
///    If any cannot be (refused, filtered, unreachable), the others are closed before sending
///    a byte, which the server ignores, and the result is [`Error::Unreachable`]
///    ([`Error::is_unreachable`]): the caller may fall back to SSH.
/// 2. Each connection reads the server's challenge and answers with its `Join`, within
///    [`TcpConfig::join_timeout`]. A failure here is [`Error::Join`].
///
/// The server is not authenticated by the join itself; it is by the first record it sends
/// (only a holder of the secret can seal it), and nothing it could say in the clear reaches
/// the caller.
pub async fn connect(
    addr: SocketAddr,
    n: u16,
    secret: &SessionSecret,
    keys: &KeyConfig,
    config: &TcpConfig,
) -> Result<Vec<SealedStream<TcpStream>>, Error> {
    // Step 1: TCP connections.
    let mut connecting = JoinSet::new();
    for index in 1..=n {
        let config = config.clone();
        connecting.spawn(async move {
            let conn = tokio::time::timeout(config.connect_timeout, open(addr, &config))
                .await
                .unwrap_or_else(|_| {
                    Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        format!(
                            "no answer within {}s (a firewall may be dropping the connection)",
                            config.connect_timeout.as_secs_f32()
                        ),
                    ))
                });
            (index, conn)
        });
    }
    let mut conns = Vec::with_capacity(usize::from(n));
    while let Some(done) = connecting.join_next().await {
        let (index, conn) = done.unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()));
        match conn {
            Ok(conn) => conns.push((index, conn)),
            // Returning drops the other connections (and aborts those still connecting).
            Err(source) => return Err(Error::Unreachable { addr, source }),
        }
    }

    conns.sort_by_key(|(index, _)| *index);
    join_streams(
        conns.into_iter().map(|(_, conn)| conn).collect(),
        addr,
        secret,
        keys,
        config,
    )
    .await
}

/// Joins already open byte streams to the session as its data streams `1..=conns.len()`,
/// in order: each reads the server's challenge and answers with its `Join` within
/// [`TcpConfig::join_timeout`], and comes back sealed with `keys`.
///
/// [`connect`] uses it on TCP connections; a caller whose streams reach the data port some
/// other way, such as `ssh -W 127.0.0.1:PORT` (the server listening on its loopback), uses it
/// directly. `addr` names the data port in errors.
pub async fn join_streams<S>(
    conns: Vec<S>,
    addr: SocketAddr,
    secret: &SessionSecret,
    keys: &KeyConfig,
    config: &TcpConfig,
) -> Result<Vec<SealedStream<S>>, Error>
where
    S: AsyncRead + AsyncWrite + Send + Unpin + 'static,
{
    let n = conns.len();
    let secret = Arc::new(secret.clone());
    let mut joining = JoinSet::new();
    for (i, conn) in conns.into_iter().enumerate() {
        let index = u16::try_from(i + 1).map_err(|_| Error::Join {
            index: u16::MAX,
            addr,
            source: io::Error::new(io::ErrorKind::InvalidInput, "too many data streams"),
        })?;
        let secret = secret.clone();
        let timeout = config.join_timeout;
        joining.spawn(async move {
            let joined = tokio::time::timeout(timeout, join(conn, index, &secret))
                .await
                .unwrap_or_else(|_| {
                    Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        format!(
                            "the server sent no challenge within {}s",
                            timeout.as_secs_f32()
                        ),
                    ))
                });
            (index, joined)
        });
    }
    let mut slots: Vec<Option<SealedStream<S>>> = (0..n).map(|_| None).collect();
    while let Some(done) = joining.join_next().await {
        let (index, joined) = done.unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()));
        let conn = joined.map_err(|source| Error::Join {
            index,
            addr,
            source,
        })?;
        let stream = SealedStream::new(
            conn,
            &secret,
            keys,
            Direction::ClientToServer,
            index,
            config.record_len,
        )?;
        slots[usize::from(index) - 1] = Some(stream);
    }
    Ok(slots
        .into_iter()
        .map(|s| s.expect("every index joined"))
        .collect())
}

/// One TCP connection to `addr` with `config`'s socket options.
async fn open(addr: SocketAddr, config: &TcpConfig) -> io::Result<TcpStream> {
    let socket = match addr {
        SocketAddr::V4(_) => TcpSocket::new_v4()?,
        SocketAddr::V6(_) => TcpSocket::new_v6()?,
    };
    if let Some(size) = config.send_buffer {
        socket.set_send_buffer_size(size)?;
    }
    if let Some(size) = config.recv_buffer {
        socket.set_recv_buffer_size(size)?;
    }
    let conn = socket.connect(addr).await?;
    conn.set_nodelay(true)?;
    Ok(conn)
}

/// Reads the server's challenge on `conn` and answers with the `Join` for `index`.
async fn join<S: AsyncRead + AsyncWrite + Unpin>(
    mut conn: S,
    index: u16,
    secret: &SessionSecret,
) -> io::Result<S> {
    let mut buf = [0u8; CHALLENGE_LEN];
    conn.read_exact(&mut buf).await.map_err(|e| {
        if e.kind() == io::ErrorKind::UnexpectedEof {
            io::Error::new(
                e.kind(),
                "the server closed the connection before sending its challenge \
                 (the session may have been aborted; see the server's error)",
            )
        } else {
            e
        }
    })?;
    let nonce = match Decoder::new(CHALLENGE_LEN as u32).decode(&mut BytesMut::from(&buf[..])) {
        Ok(Some(Frame::Challenge(c))) => c.nonce,
        Ok(Some(other)) => {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("expected a Challenge from the server, got {}", other.name()),
            ));
        }
        Ok(None) | Err(_) => {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "the server's first bytes are not a fastcp Challenge (is something else listening on that port?)",
            ));
        }
    };
    let proof = fastcp_crypto::join_proof(secret, JoinKind::Tcp, &nonce, index);
    let mut out = BytesMut::new();
    fastcp_proto::encode(&Frame::Join(Join { index, proof }), &mut out);
    conn.write_all(&out).await?;
    Ok(conn)
}
