//! The crate's one error type.

use crate::{CipherSuite, Provider};

/// Everything that can go wrong in fastcp-crypto.
///
/// [`Error::Open`] and [`Error::Truncated`] mean the peer (or something between us) sent bytes
/// that do not authenticate; the connection must be dropped. [`Error::Poisoned`] follows
/// them. The rest are local mistakes: a bad name, a missing provider, a spent key.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A record did not authenticate: it was tampered with, truncated, reordered, replayed,
    /// dropped before this one, or sealed under another key.
    #[error("record failed authentication (tampered, truncated, reordered, replayed or wrong key)")]
    Open,
    /// A record is shorter than the tag it must end with.
    #[error("record of {len} bytes is shorter than its {tag_len}-byte tag")]
    Truncated {
        /// Bytes received.
        len: usize,
        /// Bytes the tag alone needs.
        tag_len: usize,
    },
    /// An [`crate::Opener`] already rejected a record and refuses to open any more.
    #[error("stream key is unusable after an earlier authentication failure")]
    Poisoned,
    /// The provider refused to seal (input too long for the algorithm).
    #[error("{provider} failed to seal a {len}-byte record with {suite}")]
    Seal {
        /// Provider that failed.
        provider: Provider,
        /// Suite in use.
        suite: CipherSuite,
        /// Plaintext length.
        len: usize,
    },
    /// A [`crate::Sealer`] reached its record limit; the stream must end.
    #[error("stream reached its limit of {limit} records; start a new session")]
    RecordLimit {
        /// The limit that was reached.
        limit: u64,
    },
    /// Key bytes of the wrong length for the suite.
    #[error("{suite} needs a {expected}-byte key, got {got} bytes")]
    KeyLength {
        /// Suite the key was for.
        suite: CipherSuite,
        /// Length the suite needs.
        expected: usize,
        /// Length given.
        got: usize,
    },
    /// The provider is known but not built into this binary.
    #[error("crypto provider {0} is not built in (build with the `aws-lc-rs` cargo feature)")]
    ProviderUnavailable(Provider),
    /// A provider rejected a key (should not happen with keys of the right length).
    #[error("{provider} rejected the key for {suite}")]
    Key {
        /// Provider that rejected it.
        provider: Provider,
        /// Suite the key was for.
        suite: CipherSuite,
    },
    /// A cipher name that fastcp does not know.
    #[error("unknown cipher {0:?} (expected aes128-gcm, aes256-gcm or chacha20-poly1305)")]
    UnknownCipher(String),
    /// A provider name that fastcp does not know.
    #[error("unknown crypto provider {0:?} (expected ring, rustcrypto or aws-lc-rs)")]
    UnknownProvider(String),
    /// The system random number generator failed.
    #[error("the system random number generator failed")]
    Random,
}

/// Shorthand for results in this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;
