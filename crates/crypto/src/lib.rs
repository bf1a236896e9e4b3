//! fastcp-crypto: the authenticated ciphers behind fastcp's data streams.
//!
//! - [`CipherSuite`] names the three suites (AES-128-GCM, AES-256-GCM, ChaCha20-Poly1305) and
//!   [`Provider`] the libraries that implement them (ring, RustCrypto, and aws-lc-rs with the
//!   `aws-lc-rs` cargo feature). [`new_aead`] keys one of them as an [`Aead`]: seal and open
//!   in place, nonces from 64-bit sequence numbers, tags kept apart.
//! - [`CpuFeatures::probe`] reads this CPU once (the [`NO_HW_AES_ENV`] variable hides
//!   hardware AES for tests); [`CpuFeatures::to_bits`] is its handshake form.
//! - [`choose`] turns both ends' features and the user's `--cipher` into a [`Choice`].
//! - [`SessionSecret`] yields a [`Sealer`] and an [`Opener`] per stream and direction, which
//!   number records themselves, rekey on schedule and reject replays, reordering and drops.
//! - [`bench_table`] is the `fastcp bench ciphers` table.
//!
//! No I/O happens here; the transports move the bytes.
//!
//! ```
//! use fastcp_crypto::{choose, CpuFeatures, Direction, KeyConfig, SessionSecret};
//!
//! // Both ends learn each other's CPU features in the handshake.
//! let here = CpuFeatures::probe();
//! let peer = CpuFeatures::from_bits(here.to_bits());
//! let choice = choose(here, peer, None);
//!
//! let secret = SessionSecret::generate()?;
//! let config = KeyConfig::from(choice);
//! let mut tx = secret.sealer(&config, Direction::ClientToServer, 7)?;
//! let mut rx = secret.opener(&config, Direction::ClientToServer, 7)?;
//!
//! let mut first = b"first".to_vec();
//! let mut second = b"second".to_vec();
//! tx.seal_record(b"", &mut first)?;
//! tx.seal_record(b"", &mut second)?;
//!
//! // Out of order: refused, and the opener stays refused.
//! assert!(rx.open_record(b"", &mut second).is_err());
//! assert!(rx.is_poisoned());
//! # Ok::<(), fastcp_crypto::Error>(())
//! ```
#![deny(missing_docs)]

mod aead;
mod bench;
mod choose;
mod cpu;
mod error;
mod join;
pub mod keys;
mod suite;

pub use aead::{Aead, AeadExt, NONCE_LEN, TAG_LEN, Tag, new_aead};
pub use bench::{BENCH_ROUNDS, BENCH_SIZES, BenchRow, BenchTable, bench_table};
pub use choose::{Choice, Reason, choose};
pub use cpu::{CpuFeatures, NO_HW_AES_ENV};
pub use error::{Error, Result};
pub use join::{JoinKind, PROOF_LEN, join_proof, random_bytes, session_secret, verify_join};
pub use keys::{Direction, KeyConfig, KeyLimits, Opener, SECRET_LEN, Sealer, SessionSecret};
pub use suite::{CipherSuite, Provider};
