//! The session secret, and the proofs with which extra data streams join a session.
//!
//! ```text
//! secret = HKDF-SHA256(salt = "fastcp v1 session secret",
//!                      ikm  = client_random || server_random,
//!                      info = "fastcp v1 secret", 32 bytes)
//! proof  = HMAC-SHA256(secret, "fastcp v1 join " || kind || u32 len(challenge)
//!                              || challenge || u16 index)
//! ```
//!
//! Integers are big-endian; `kind` is `"unix"` or `"tcp"` ([`JoinKind::label`]). Both randoms
//! and the secret travel only inside the authenticated control stream (the SSH channel). The
//! proof binds the rendezvous kind, the server's fresh challenge (empty for a Unix socket,
//! which only the session's own user can reach) and the stream index, so a proof seen on one
//! connection is worthless on any other.
//!
//! ```
//! use fastcp_crypto::{join_proof, random_bytes, session_secret, verify_join, JoinKind};
//!
//! let client_random = random_bytes()?;
//! let server_random = random_bytes()?;
//! let secret = session_secret(&client_random, &server_random);
//!
//! let challenge: [u8; 32] = random_bytes()?;
//! let proof = join_proof(&secret, JoinKind::Tcp, &challenge, 1);
//! assert!(verify_join(&secret, JoinKind::Tcp, &challenge, 1, &proof));
//! assert!(!verify_join(&secret, JoinKind::Tcp, &challenge, 2, &proof));
//! # Ok::<(), fastcp_crypto::Error>(())
//! ```

use std::fmt;

use ring::{hkdf, hmac, rand::SecureRandom};
use zeroize::Zeroizing;

use crate::{Error, Result, SECRET_LEN, SessionSecret};

/// Bytes in a join proof.
pub const PROOF_LEN: usize = 32;

/// The rendezvous an extra stream joins through; its label is part of the proof.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum JoinKind {
    /// A Unix socket on the server, reached through forwarded SSH channels.
    Unix,
    /// A TCP port on the server; the server sends a challenge first.
    Tcp,
    /// A stream the program running the server handed to it in-process.
    Caller,
}

impl JoinKind {
    /// `"unix"`, `"tcp"` or `"caller"`, as hashed into the proof.
    pub fn label(self) -> &'static str {
        match self {
            JoinKind::Unix => "unix",
            JoinKind::Tcp => "tcp",
            JoinKind::Caller => "caller",
        }
    }
}

impl fmt::Display for JoinKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.label())
    }
}

/// The session secret that the client's and the server's randoms yield.
pub fn session_secret(client_random: &[u8; 32], server_random: &[u8; 32]) -> SessionSecret {
    let mut ikm = Zeroizing::new([0u8; 64]);
    ikm[..32].copy_from_slice(client_random);
    ikm[32..].copy_from_slice(server_random);
    let prk = hkdf::Salt::new(hkdf::HKDF_SHA256, b"fastcp v1 session secret").extract(&*ikm);
    let mut out = Zeroizing::new([0u8; SECRET_LEN]);
    prk.expand(&[b"fastcp v1 secret"], hkdf::HKDF_SHA256)
        .and_then(|okm| okm.fill(&mut *out))
        .expect("32 bytes is a valid HKDF-SHA256 output length");
    SessionSecret::from_bytes(*out)
}

/// The proof an extra stream sends in its `Join` frame: an HMAC keyed with the session
/// secret over the rendezvous kind, the server's challenge (empty where the rendezvous has
/// none) and the stream index.
pub fn join_proof(
    secret: &SessionSecret,
    kind: JoinKind,
    challenge: &[u8],
    index: u16,
) -> [u8; PROOF_LEN] {
    let tag = hmac::sign(&join_key(secret), &join_message(kind, challenge, index));
    let mut out = [0u8; PROOF_LEN];
    out.copy_from_slice(tag.as_ref());
    out
}

/// Checks a join proof, in constant time (ring's `hmac::verify`).
pub fn verify_join(
    secret: &SessionSecret,
    kind: JoinKind,
    challenge: &[u8],
    index: u16,
    proof: &[u8; PROOF_LEN],
) -> bool {
    hmac::verify(
        &join_key(secret),
        &join_message(kind, challenge, index),
        proof,
    )
    .is_ok()
}

fn join_key(secret: &SessionSecret) -> hmac::Key {
    hmac::Key::new(hmac::HMAC_SHA256, secret.as_bytes())
}

/// `"fastcp v1 join " || kind || u32 len(challenge) || challenge || u16 index`.
fn join_message(kind: JoinKind, challenge: &[u8], index: u16) -> Vec<u8> {
    let len = u32::try_from(challenge.len()).expect("a challenge shorter than 4 GiB");
    let mut msg = Vec::with_capacity(15 + 4 + 4 + challenge.len() + 2);
    msg.extend_from_slice(b"fastcp v1 join ");
    msg.extend_from_slice(kind.label().as_bytes());
    msg.extend_from_slice(&len.to_be_bytes());
    msg.extend_from_slice(challenge);
    msg.extend_from_slice(&index.to_be_bytes());
    msg
}

/// `N` bytes from the operating system's random number generator: session randoms,
/// challenges.
pub fn random_bytes<const N: usize>() -> Result<[u8; N]> {
    let mut out = [0u8; N];
    ring::rand::SystemRandom::new()
        .fill(&mut out)
        .map_err(|_| Error::Random)?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(bytes: &[u8]) -> String {
        bytes.iter().map(|b| format!("{b:02x}")).collect()
    }

    /// Known answers computed independently (Python's `hmac`/`hashlib`, HKDF written out from
    /// RFC 5869), pinning the byte formats of docs/protocol.md.
    #[test]
    fn known_answers() {
        let secret = session_secret(&[1; 32], &[2; 32]);
        assert_eq!(
            hex(secret.as_bytes()),
            "98a5dc3b3f1c301143c180e0059313f41df4c8e3f31ca213916272a1a6ce8799"
        );
        let challenge: Vec<u8> = (0..32).collect();
        assert_eq!(
            hex(&join_proof(&secret, JoinKind::Tcp, &challenge, 3)),
            "e8f77eccee9782c8adb8d647cc178dfc4220ebd5503f70ce47e73c0d0f6f5dfc"
        );
        assert_eq!(
            hex(&join_proof(&secret, JoinKind::Unix, b"", 1)),
            "e6ffd437438a91d1f8e0ad1c59bf8deae1a0fb8b41535d43c120ba040fe06b8f"
        );
    }

    #[test]
    fn secret_depends_on_both_randoms_in_order() {
        let a = session_secret(&[1; 32], &[2; 32]);
        assert_ne!(a.as_bytes(), session_secret(&[2; 32], &[1; 32]).as_bytes());
        assert_ne!(a.as_bytes(), session_secret(&[1; 32], &[3; 32]).as_bytes());
        assert_ne!(a.as_bytes(), session_secret(&[0; 32], &[2; 32]).as_bytes());
        assert_eq!(a.as_bytes(), session_secret(&[1; 32], &[2; 32]).as_bytes());
    }

    #[test]
    fn proof_binds_secret_kind_challenge_and_index() {
        let s = session_secret(&[1; 32], &[2; 32]);
        let p = join_proof(&s, JoinKind::Tcp, b"nonce", 3);
        assert!(verify_join(&s, JoinKind::Tcp, b"nonce", 3, &p));
        assert!(!verify_join(&s, JoinKind::Tcp, b"nonce", 4, &p));
        assert!(!verify_join(&s, JoinKind::Unix, b"nonce", 3, &p));
        assert!(!verify_join(&s, JoinKind::Tcp, b"other", 3, &p));
        assert!(!verify_join(&s, JoinKind::Tcp, b"", 3, &p));
        let other = session_secret(&[1; 32], &[3; 32]);
        assert!(!verify_join(&other, JoinKind::Tcp, b"nonce", 3, &p));
        for bit in 0..PROOF_LEN * 8 {
            let mut bad = p;
            bad[bit / 8] ^= 1 << (bit % 8);
            assert!(
                !verify_join(&s, JoinKind::Tcp, b"nonce", 3, &bad),
                "bit {bit}"
            );
        }
    }

    /// The challenge's length prefix keeps the boundary between challenge and index
    /// unambiguous.
    #[test]
    fn challenge_and_index_do_not_run_together() {
        let s = session_secret(&[9; 32], &[8; 32]);
        let a = join_proof(&s, JoinKind::Tcp, &[0xab, 0x00], 1);
        let b = join_proof(&s, JoinKind::Tcp, &[0xab], 1);
        assert_ne!(a, b);
    }

    #[test]
    fn random_bytes_differ() {
        let a: [u8; 32] = random_bytes().unwrap();
        let b: [u8; 32] = random_bytes().unwrap();
        assert_ne!(a, b);
    }
}
