//! The handshake: both sides send a [`Hello`]; each derives the same [`Negotiated`] result.

use bytes::BytesMut;

use crate::codec::{DecodeError, Decoder};
use crate::frame::{Frame, Hello, kind};
use crate::{HARD_MAX_FRAME, MAGIC};

/// Why a handshake failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum HandshakeError {
    /// The peer's first bytes are not a fastcp handshake, for example a shell's error message
    /// because fastcp is not installed there. Carries those bytes, escaped for printing.
    #[error("the peer does not speak the fastcp protocol; it sent: \"{0}\"")]
    NotFastcp(String),
    /// The two sides have no protocol version in common.
    #[error(
        "protocol versions do not overlap: we speak {local_min}..={local_max}, the peer {peer_min}..={peer_max}; {}",
        older(*local_min, *peer_max)
    )]
    Incompatible {
        /// Our oldest version.
        local_min: u16,
        /// Our newest version.
        local_max: u16,
        /// The peer's oldest version.
        peer_min: u16,
        /// The peer's newest version.
        peer_max: u16,
    },
    /// The peer's hello is malformed.
    #[error("bad handshake: {0}")]
    Decode(#[from] DecodeError),
    /// The peer sent another frame where its hello belongs.
    #[error("expected Hello, got {0}")]
    Unexpected(&'static str),
    /// The peer offered a frame size too small to carry anything.
    #[error("the peer's maximum frame size of {0} bytes is too small")]
    FrameTooSmall(u32),
}

/// Which side of two that share no protocol version to upgrade: the one whose newest version
/// is below the other's oldest.
fn older(local_min: u16, peer_max: u16) -> &'static str {
    if peer_max < local_min {
        "the peer is older: upgrade fastcp there"
    } else {
        "this side is older: upgrade fastcp here"
    }
}

/// What both sides agreed on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Negotiated {
    /// The protocol version in use: the newest both speak.
    pub version: u16,
    /// The largest frame payload either side may send: the smaller of the two offers.
    pub max_frame: u32,
    /// The peer's hello, for its CPU features, ciphers and software version.
    pub peer: Hello,
}

/// The smallest frame size a peer may offer: room for a path of [`crate::MAX_PATH`] bytes and
/// some data.
pub const MIN_FRAME: u32 = 64 << 10;

/// One side's view of the handshake. Sans-IO: the caller sends [`Handshake::hello`] and feeds
/// received bytes to [`Handshake::decode_peer_hello`].
///
/// ```
/// use bytes::BytesMut;
/// use fastcp_proto::{encode, Handshake, Hello};
///
/// let hello = |version| Hello {
///     version,
///     min_version: 1,
///     cpu_features: 0,
///     ciphers: vec![1],
///     compression: vec![0],
///     max_frame: 1 << 20,
///     software: "fastcp test".into(),
/// };
/// let client = Handshake::new(hello(1));
/// let server = Handshake::new(hello(2));
///
/// let mut wire = BytesMut::new();
/// encode(&server.hello(), &mut wire);
/// let agreed = client.decode_peer_hello(&mut wire).unwrap().unwrap();
/// assert_eq!(agreed.version, 1);
/// ```
#[derive(Debug, Clone)]
pub struct Handshake {
    local: Hello,
}

impl Handshake {
    /// A handshake that will offer `local`.
    pub fn new(local: Hello) -> Handshake {
        Handshake { local }
    }

    /// The frame to send first.
    pub fn hello(&self) -> Frame {
        Frame::Hello(self.local.clone())
    }

    /// Reads the peer's hello from the front of `src`: `Ok(None)` while more bytes are needed.
    pub fn decode_peer_hello(
        &self,
        src: &mut BytesMut,
    ) -> Result<Option<Negotiated>, HandshakeError> {
        if let Some(&first) = src.first()
            && first != kind::HELLO
        {
            return Err(HandshakeError::NotFastcp(escape_prefix(src)));
        }
        if src.len() >= 5 + MAGIC.len() && src[5..5 + MAGIC.len()] != MAGIC {
            return Err(HandshakeError::NotFastcp(escape_prefix(src)));
        }
        // A hello is small; a hostile peer cannot make us buffer more than this.
        let mut decoder = Decoder::new(MIN_FRAME);
        match decoder.decode(src)? {
            None => Ok(None),
            Some(Frame::Hello(peer)) => self.handle_hello(peer).map(Some),
            Some(other) => Err(HandshakeError::Unexpected(other.name())),
        }
    }

    /// Agrees on the version and frame size with the peer's hello.
    pub fn handle_hello(&self, peer: Hello) -> Result<Negotiated, HandshakeError> {
        let version = self.local.version.min(peer.version);
        if version < self.local.min_version.max(peer.min_version) {
            return Err(HandshakeError::Incompatible {
                local_min: self.local.min_version,
                local_max: self.local.version,
                peer_min: peer.min_version,
                peer_max: peer.version,
            });
        }
        if peer.max_frame < MIN_FRAME {
            return Err(HandshakeError::FrameTooSmall(peer.max_frame));
        }
        let max_frame = self.local.max_frame.min(peer.max_frame).min(HARD_MAX_FRAME);
        Ok(Negotiated {
            version,
            max_frame,
            peer,
        })
    }
}

/// The first bytes of a stream, printable: control characters and non-UTF-8 are escaped.
fn escape_prefix(src: &[u8]) -> String {
    let prefix = &src[..src.len().min(200)];
    String::from_utf8_lossy(prefix)
        .chars()
        .flat_map(|c| c.escape_default())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::encode;

    fn hello(min_version: u16, version: u16, max_frame: u32) -> Hello {
        Hello {
            version,
            min_version,
            cpu_features: 1,
            ciphers: vec![1, 3],
            compression: vec![0],
            max_frame,
            software: "fastcp test".into(),
        }
    }

    fn agree(a: Hello, b: Hello) -> Result<Negotiated, HandshakeError> {
        let mut wire = BytesMut::new();
        encode(&Frame::Hello(b), &mut wire);
        Handshake::new(a)
            .decode_peer_hello(&mut wire)
            .map(|n| n.expect("whole hello"))
    }

    #[test]
    fn picks_newest_common_version_and_smallest_frame() {
        let n = agree(hello(1, 3, 8 << 20), hello(2, 5, 1 << 20)).unwrap();
        assert_eq!(n.version, 3);
        assert_eq!(n.max_frame, 1 << 20);
    }

    #[test]
    fn disjoint_versions_fail() {
        let err = agree(hello(1, 1, 1 << 20), hello(2, 3, 1 << 20)).unwrap_err();
        assert!(matches!(err, HandshakeError::Incompatible { .. }), "{err}");
        assert!(err.to_string().ends_with("upgrade fastcp here"), "{err}");
        let err = agree(hello(4, 5, 1 << 20), hello(2, 3, 1 << 20)).unwrap_err();
        assert!(err.to_string().ends_with("upgrade fastcp there"), "{err}");
    }

    #[test]
    fn tiny_frame_offer_fails() {
        let err = agree(hello(1, 1, 1 << 20), hello(1, 1, 16)).unwrap_err();
        assert_eq!(err, HandshakeError::FrameTooSmall(16));
    }

    #[test]
    fn shell_error_is_reported_as_not_fastcp() {
        let mut wire = BytesMut::from(&b"bash: line 1: fastcp: command not found\n"[..]);
        let err = Handshake::new(hello(1, 1, 1 << 20))
            .decode_peer_hello(&mut wire)
            .unwrap_err();
        assert!(err.to_string().contains("command not found\\n"), "{err}");
    }

    #[test]
    fn wrong_first_frame_fails() {
        let mut wire = BytesMut::new();
        encode(
            &Frame::Challenge(crate::Challenge { nonce: [0; 32] }),
            &mut wire,
        );
        assert!(
            Handshake::new(hello(1, 1, 1 << 20))
                .decode_peer_hello(&mut wire)
                .is_err()
        );
    }
}
