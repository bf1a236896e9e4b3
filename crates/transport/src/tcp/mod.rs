//! Raw TCP data streams, sealed with fastcp's own AEAD.
//!
//! The SSH connection authenticates both ends and carries the control stream; the bulk data
//! then flows over N parallel TCP connections to a port the server announces. Nothing on those
//! connections is trusted until it authenticates:
//!
//! - [`TcpRendezvous::bind`] opens the server's port (any free port, or one from a range) and
//!   [`TcpRendezvous::accept`] takes exactly the session's streams.
//! - [`connect`] opens the client's connections.
//! - Each one is a [`SealedStream`]: tokio's `AsyncRead + AsyncWrite`, every byte in AEAD
//!   records keyed per stream and per direction from the session secret.
//!
//! # Joining
//!
//! On each new connection the server sends `Challenge { nonce }` (32 fresh random bytes) and
//! the client answers `Join { index, proof }`, where `proof` is
//! [`join_proof`](fastcp_crypto::join_proof)`(secret, "tcp", nonce, index)`. Both frames are
//! in the clear; everything after them is sealed. The server checks the proof in constant
//! time, accepts each index `1..=n` once, and returns the streams ordered by index.
//!
//! A connection that does not authenticate is **dropped and the session goes on**: one that
//! sends nothing and closes, or stays silent past [`TcpConfig::join_timeout`] (a port scan,
//! a client that gave up), and one that sends anything but a valid `Join` (a wrong proof, a
//! truncated frame, other bytes), which is also reported in [`Joined::refused`]. A stranger
//! who reaches the port during the join window can neither join (each challenge is fresh, so
//! a `Join` seen on the wire cannot be replayed) nor stop the session. When the server knows
//! the client's address ([`TcpRendezvous::expect_client`], from the SSH connection), only a
//! few connections from other addresses are challenged at a time and the rest are closed at
//! once ([`Rejection::Busy`]), so a flood cannot crowd the client's own connections out;
//! the client's connections are never turned away for that. A connection that proves the
//! secret but asks for an index out of range or already taken comes from a broken client
//! and aborts the session with [`Error::Rejected`]. Once all `n` streams have joined the
//! listener is closed, so later connections are refused by the kernel.
//!
//! # Records
//!
//! ```text
//! header      u32, big-endian: bit 31 = end of stream, bits 0..31 = plaintext length L
//! body        L bytes of ciphertext || 16-byte tag
//! ```
//!
//! The header is the AEAD's associated data and the nonce is the record's sequence number on
//! that stream and direction (see [`fastcp_crypto::Sealer`]), so an altered, replayed,
//! reordered, dropped or foreign record fails its tag. `L` is at most [`MAX_RECORD_LEN`]; a
//! reader checks that before allocating. A writer's `shutdown` sends an end record (bit 31
//! set, `L = 0`, sealed like any other); a reader reports end of stream only after it, so a
//! connection cut between records reads as [`RecordError::Unterminated`] and one cut inside a
//! record as [`RecordError::Truncated`]. After any failure a stream is poisoned: every later
//! call returns the same error, and no byte of a record that failed ever reaches the caller.
//!
//! # Example
//!
//! ```
//! use std::net::{IpAddr, Ipv4Addr, SocketAddr};
//! use std::time::Duration;
//!
//! use fastcp_crypto::{CipherSuite, KeyConfig, Provider, SessionSecret};
//! use fastcp_transport::tcp::{self, TcpConfig, TcpRendezvous};
//! use tokio::io::{AsyncReadExt, AsyncWriteExt};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! // Both ends derive the same secret from randoms exchanged over SSH.
//! let secret = SessionSecret::generate()?;
//! let keys = KeyConfig::new(CipherSuite::Aes128Gcm, Provider::Ring);
//!
//! let localhost = IpAddr::V4(Ipv4Addr::LOCALHOST);
//! let rendezvous = TcpRendezvous::bind(localhost, None, TcpConfig::default())?;
//! let port = rendezvous.port(); // sent to the client in `Accept`
//!
//! let server = tokio::spawn({
//!     let secret = secret.clone();
//!     async move { rendezvous.accept(2, &secret, &keys, Duration::from_secs(15)).await }
//! });
//! let addr = SocketAddr::new(localhost, port);
//! let mut client = tcp::connect(addr, 2, &secret, &keys, &TcpConfig::default()).await?;
//! let mut server = server.await??.streams;
//!
//! client[1].write_all(b"over stream 2").await?;
//! client[1].shutdown().await?;
//! let mut got = Vec::new();
//! server[1].read_to_end(&mut got).await?;
//! assert_eq!(got, b"over stream 2");
//! # Ok(())
//! # }
//! ```

mod connect;
mod record;
mod rendezvous;
mod stream;

use std::fmt;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

pub use connect::{connect, join_streams};
pub use record::{DEFAULT_RECORD_LEN, HEADER_LEN, MAX_RECORD_LEN, RecordError};
pub use rendezvous::{Joined, TcpRendezvous};
pub use stream::{SealedReader, SealedStream, SealedWriter};

/// Knobs of the TCP transport. Both ends may use different values.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct TcpConfig {
    /// Plaintext per record this end writes, at most [`MAX_RECORD_LEN`]. Default
    /// [`DEFAULT_RECORD_LEN`] (256 KiB).
    pub record_len: usize,
    /// How long the client waits for each TCP connection to be established before calling the
    /// port unreachable ([`Error::is_unreachable`]). Default 5 s.
    pub connect_timeout: Duration,
    /// How long one connection may take to finish the challenge and join, on either side.
    /// Default 5 s.
    pub join_timeout: Duration,
    /// `SO_SNDBUF` for each connection; `None` (the default) leaves the kernel's autotuning
    /// on, which measured fastest on loopback.
    pub send_buffer: Option<u32>,
    /// `SO_RCVBUF` for each connection; `None` (the default) leaves the kernel's autotuning
    /// on.
    pub recv_buffer: Option<u32>,
}

impl Default for TcpConfig {
    fn default() -> Self {
        TcpConfig {
            record_len: DEFAULT_RECORD_LEN,
            connect_timeout: Duration::from_secs(5),
            join_timeout: Duration::from_secs(5),
            send_buffer: None,
            recv_buffer: None,
        }
    }
}

/// What went wrong while setting up the TCP data streams.
///
/// [`Error::is_unreachable`] tells the one case where falling back to SSH channels is right:
/// the client could not even establish the TCP connections. Failures after that (a rejected
/// join, a timeout while joining) are the session's end.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The server could not listen on the address.
    #[error("cannot listen for data streams on {addr}: {source}")]
    Bind {
        /// The address tried.
        addr: SocketAddr,
        /// What the OS said.
        #[source]
        source: io::Error,
    },
    /// Every port of the configured range was taken.
    #[error("no free port for data streams in {start}-{end} on {addr}")]
    NoFreePort {
        /// The address tried.
        addr: IpAddr,
        /// First port of the range.
        start: u16,
        /// Last port of the range.
        end: u16,
    },
    /// The configured port range is empty or includes port 0.
    #[error("invalid data port range {start}-{end}")]
    PortRange {
        /// First port of the range.
        start: u16,
        /// Last port of the range.
        end: u16,
    },
    /// The client could not establish a TCP connection to the data port: refused, filtered
    /// (timed out) or unreachable. Nothing was sent; falling back to SSH is safe.
    #[error("cannot reach the data port {addr}: {source}")]
    Unreachable {
        /// The server's data address.
        addr: SocketAddr,
        /// What the OS said, or a `TimedOut` error after [`TcpConfig::connect_timeout`].
        #[source]
        source: io::Error,
    },
    /// A connection was established but joining failed on the client's side.
    #[error("data stream {index}: joining {addr}: {source}")]
    Join {
        /// The stream's index.
        index: u16,
        /// The server's data address.
        addr: SocketAddr,
        /// What happened.
        #[source]
        source: io::Error,
    },
    /// A connection proved the session secret but asked for a stream the session does not
    /// have: the client is broken, and the session is aborted.
    #[error(
        "a data connection from {peer} proved the session secret but {reason}; the session \
         is aborted"
    )]
    Rejected {
        /// Where the connection came from.
        peer: SocketAddr,
        /// What was wrong with it.
        reason: Rejection,
    },
    /// Not all streams joined in time.
    #[error(
        "only {joined} of {expected} data streams joined within {}s",
        timeout.as_secs_f32()
    )]
    JoinTimeout {
        /// Streams that joined.
        joined: u16,
        /// Streams expected.
        expected: u16,
        /// The time allowed.
        timeout: Duration,
    },
    /// Accepting connections failed.
    #[error("accepting data connections: {0}")]
    Accept(#[source] io::Error),
    /// Keying a stream failed (a provider that is not built in, for example).
    #[error(transparent)]
    Crypto(#[from] fastcp_crypto::Error),
}

impl Error {
    /// True when the client could not establish a TCP connection to the data port at all
    /// (refused, filtered, unreachable): the case where `--transport auto` falls back to SSH.
    pub fn is_unreachable(&self) -> bool {
        matches!(self, Error::Unreachable { .. })
    }
}

/// Why the server rejected a connection to its data port.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Rejection {
    /// The first bytes were not a `Join` frame.
    NotAJoin(String),
    /// The connection sent part of a `Join`, then closed or stalled.
    Incomplete {
        /// Bytes received.
        got: usize,
    },
    /// The proof did not match the session secret and this connection's challenge.
    BadProof {
        /// The index it claimed.
        index: u16,
    },
    /// A valid proof for an index outside `1..=n`.
    IndexOutOfRange {
        /// The index it claimed.
        index: u16,
        /// The session's extra streams.
        streams: u16,
    },
    /// A valid proof for an index that already joined.
    Duplicate {
        /// The index it claimed.
        index: u16,
    },
    /// Closed unchallenged: too many connections from addresses other than the client's
    /// were already being challenged.
    Busy,
    /// Closed while still being challenged, because every stream of the session had joined.
    Late,
}

impl fmt::Display for Rejection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Rejection::NotAJoin(what) => write!(f, "it sent {what} instead of a Join"),
            Rejection::Incomplete { got } => {
                write!(f, "it sent {got} bytes of a Join, then stopped")
            }
            Rejection::BadProof { index } => {
                write!(f, "wrong proof of the session secret for stream {index}")
            }
            Rejection::IndexOutOfRange { index, streams } => {
                write!(f, "stream index {index} outside 1..={streams}")
            }
            Rejection::Duplicate { index } => write!(f, "stream {index} had already joined"),
            Rejection::Busy => write!(
                f,
                "closed unchallenged: too many connections from elsewhere were joining"
            ),
            Rejection::Late => write!(
                f,
                "closed before it had joined: every stream of the session was there"
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn public_types_are_send_and_sync() {
        fn check<T: Send + Sync>() {}
        check::<Error>();
        check::<RecordError>();
        check::<TcpConfig>();
        check::<SealedStream<tokio::net::TcpStream>>();
        check::<SealedReader<tokio::net::tcp::OwnedReadHalf>>();
        check::<SealedWriter<tokio::net::tcp::OwnedWriteHalf>>();
        check::<TcpRendezvous>();
    }
}
