//! The session exchange on the control stream, shared by client and server.
//!
//! ```text
//! client                                  server (`fastcp server`)
//!   Hello  ----------------------------->
//!          <-----------------------------  Hello
//!   Request (direction, paths, flags,
//!            streams, transport, random) ->
//!          <-----------------------------  Accept (streams, rendezvous, random)
//!                                          or Error (fatal)
//!   extra streams connect to the rendezvous; each sends Join (index, proof)
//!   the engine runs over the data streams
//! ```
//!
//! Both randoms are exchanged inside the control stream (an SSH channel), never on a command
//! line or in the environment; the session secret derived from them keys the join proofs and,
//! for the TCP transport, the AEAD.

use fastcp_proto::{Handshake, Hello, MIN_PROTOCOL_VERSION, Negotiated, PROTOCOL_VERSION};
use ring::rand::SecureRandom;
use tokio::io::{AsyncRead, AsyncWrite};

use crate::Error;
use crate::wire::FrameReader;

/// The software string this build puts in its hello.
pub const SOFTWARE: &str = concat!("fastcp ", env!("CARGO_PKG_VERSION"));

/// The largest frame this build accepts.
pub const MAX_FRAME: u32 = fastcp_proto::DEFAULT_MAX_FRAME + 64 * 1024;

/// Our hello: protocol versions, CPU features, ciphers in our order of preference.
pub(crate) fn local_hello() -> Hello {
    let cpu = fastcp_crypto::CpuFeatures::probe();
    let local_choice = fastcp_crypto::choose(cpu, cpu, None);
    let mut ciphers = vec![local_choice.suite.id()];
    for suite in fastcp_crypto::CipherSuite::ALL {
        if !ciphers.contains(&suite.id()) {
            ciphers.push(suite.id());
        }
    }
    Hello {
        version: PROTOCOL_VERSION,
        min_version: MIN_PROTOCOL_VERSION,
        cpu_features: cpu.to_bits(),
        ciphers,
        compression: crate::compress::SUPPORTED.to_vec(),
        max_frame: MAX_FRAME,
        software: SOFTWARE.into(),
    }
}

/// [`handshake`], given at most `limit` (none: no limit) for the peer's hello: a peer that
/// never speaks (a remote program that hangs, a client that connected and went quiet) ends
/// in [`Error::Timeout`].
pub(crate) async fn handshake_within<S: AsyncRead + AsyncWrite + Unpin>(
    reader: &mut FrameReader<S>,
    limit: Option<std::time::Duration>,
) -> Result<Negotiated, Error> {
    crate::client::within(
        limit,
        "waiting for the peer's hello (it started but says nothing)",
        handshake(reader),
    )
    .await
}

/// Sends our hello and reads the peer's.
pub(crate) async fn handshake<S: AsyncRead + AsyncWrite + Unpin>(
    reader: &mut FrameReader<S>,
) -> Result<Negotiated, Error> {
    let hs = Handshake::new(local_hello());
    reader.send(&hs.hello()).await?;
    peer_hello(reader, &hs).await
}

/// Reads the peer's hello before sending ours, which a peer that speaks first allows (a
/// `fastcp server` sends its hello at once): a relay learns both peers' versions before it
/// offers one to either.
pub(crate) async fn read_hello<S: AsyncRead + AsyncWrite + Unpin>(
    reader: &mut FrameReader<S>,
) -> Result<Hello, Error> {
    let hs = Handshake::new(local_hello());
    Ok(peer_hello(reader, &hs).await?.peer)
}

/// Sends our hello offering protocol `version` at most, and agrees with the peer's hello
/// `peer`, read already ([`read_hello`]).
pub(crate) async fn offer_hello<S: AsyncRead + AsyncWrite + Unpin>(
    reader: &mut FrameReader<S>,
    peer: Hello,
    version: u16,
) -> Result<Negotiated, Error> {
    let mut ours = local_hello();
    ours.version = ours.version.min(version);
    let hs = Handshake::new(ours);
    reader.send(&hs.hello()).await?;
    Ok(hs.handle_hello(peer)?)
}

/// Reads the peer's hello and agrees with it as `hs` offers.
async fn peer_hello<S: AsyncRead + AsyncWrite + Unpin>(
    reader: &mut FrameReader<S>,
    hs: &Handshake,
) -> Result<Negotiated, Error> {
    loop {
        if let Some(agreed) = hs.decode_peer_hello(reader.buffer())? {
            return Ok(agreed);
        }
        if !reader.fill().await? {
            let seen = String::from_utf8_lossy(reader.buffer()).into_owned();
            return Err(Error::ConnectionClosed(if seen.is_empty() {
                "the peer closed the connection before the handshake".into()
            } else {
                format!(
                    "the peer closed the connection during the handshake after sending: {}",
                    seen.escape_default()
                )
            }));
        }
    }
}

/// 32 fresh random bytes.
pub(crate) fn random32() -> [u8; 32] {
    let mut out = [0u8; 32];
    ring::rand::SystemRandom::new()
        .fill(&mut out)
        .expect("the system random number generator failed");
    out
}

// The session secret and the join proofs live in fastcp-crypto, with their byte formats
// (docs/protocol.md, "Session").
pub(crate) use fastcp_crypto::verify_join;
