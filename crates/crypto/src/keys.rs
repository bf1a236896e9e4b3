//! The key schedule: one session secret, a key per stream and direction, counters as
//! nonces, and automatic rekeying.
//!
//! ```text
//! prk          = HKDF-Extract(salt = "fastcp v1 session", ikm = session secret)
//! traffic[0]   = HKDF-Expand(prk, "fastcp v1 c2s stream 3", 32)      // or "s2c", any index
//! key[e]       = HKDF-Expand(traffic[e], "fastcp v1 key aes128-gcm", key_len)
//! iv[e]        = HKDF-Expand(traffic[e], "fastcp v1 iv", 12)
//! traffic[e+1] = HKDF-Expand(traffic[e], "fastcp v1 rekey", 32)
//! nonce(seq)   = iv[e] XOR (0u32 || seq as big-endian u64)
//! ```
//!
//! HKDF is HKDF-SHA256 (RFC 5869) from ring. Each stream and direction has its own traffic
//! secret, so no two streams ever share a key. The suite's name is part of the key label,
//! so a secret used (by mistake) with two suites still gives unrelated keys.
//!
//! # Counters, limits and rekeying
//!
//! A [`Sealer`] numbers its records 0, 1, 2, ... and that number is the nonce; an [`Opener`]
//! accepts only the number it expects next, so a replayed, reordered or dropped record fails
//! to authenticate. After its first failure an opener is poisoned and refuses everything,
//! which leaves a forger exactly one attempt per stream.
//!
//! Both ends move to the next key epoch at the same record, with no message exchanged: before
//! a record that would take the current key past [`KeyLimits::rekey_after_records`] records
//! or [`KeyLimits::rekey_after_bytes`] bytes of plaintext, each side derives `traffic[e+1]`
//! and forgets `traffic[e]`. The sequence number keeps counting across epochs.
//!
//! The defaults follow the AES-GCM bounds (the tighter of the suites; ChaCha20-Poly1305 has
//! no birthday bound at these sizes, and rekeying costs a few microseconds, so one rule
//! serves all three). AES-GCM's confidentiality advantage grows as σ²/2^129 for σ blocks
//! under one key (AES is a 128-bit permutation). With at most 2^32 records and 2^36 bytes
//! (2^32 blocks) per key, σ ≤ 2^33 and the advantage stays below 2^-63, well inside the
//! 2^-57 margin TLS 1.3 (RFC 8446 §5.5) and QUIC (RFC 9001 §6.6) aim for. Integrity needs no
//! extra limit because a failed record poisons the opener.
//!
//! A hard stop at [`KeyLimits::max_records`] (2^40 records, 64 PiB at 64 KiB per record) keeps
//! the 64-bit counter far from wrapping; a sealer that reaches it returns
//! [`Error::RecordLimit`] and the session must be restarted with a new secret.

use std::fmt;

use ring::hkdf;
use zeroize::{Zeroize, ZeroizeOnDrop, Zeroizing};

use crate::aead::{Aead, NONCE_LEN, Tag, new_aead};
use crate::{Choice, CipherSuite, Error, Provider, Result};

/// Bytes in a [`SessionSecret`] and in every traffic secret.
pub const SECRET_LEN: usize = 32;

/// The 32-byte secret both ends share for one session; wiped on drop.
///
/// The client makes it with [`SessionSecret::generate`] and sends it to the server over the
/// authenticated SSH channel; never put it on a command line or in an environment variable.
///
/// ```
/// use fastcp_crypto::{CipherSuite, Direction, KeyConfig, Provider, SessionSecret};
///
/// let secret = SessionSecret::generate()?;
/// let config = KeyConfig::new(CipherSuite::ChaCha20Poly1305, Provider::Ring);
/// let mut sealer = secret.sealer(&config, Direction::ClientToServer, 0)?;
/// let mut opener = secret.opener(&config, Direction::ClientToServer, 0)?;
///
/// let mut record = b"chunk of a file".to_vec();
/// sealer.seal_record(b"frame header", &mut record)?;
/// assert_eq!(record.len(), 15 + sealer.tag_len());
/// assert_eq!(opener.open_record(b"frame header", &mut record)?, b"chunk of a file");
/// # Ok::<(), fastcp_crypto::Error>(())
/// ```
#[derive(Clone, Zeroize, ZeroizeOnDrop)]
pub struct SessionSecret([u8; SECRET_LEN]);

impl SessionSecret {
    /// A fresh secret from the operating system's random number generator.
    pub fn generate() -> Result<SessionSecret> {
        use ring::rand::SecureRandom;
        let mut bytes = [0u8; SECRET_LEN];
        ring::rand::SystemRandom::new()
            .fill(&mut bytes)
            .map_err(|_| Error::Random)?;
        let secret = SessionSecret(bytes);
        bytes.zeroize();
        Ok(secret)
    }

    /// Wraps secret bytes received from the peer.
    pub fn from_bytes(bytes: [u8; SECRET_LEN]) -> SessionSecret {
        SessionSecret(bytes)
    }

    /// The bytes, to send to the peer over an authenticated, encrypted channel.
    pub fn as_bytes(&self) -> &[u8; SECRET_LEN] {
        &self.0
    }

    /// The sealing half for records sent in `direction` on stream `stream`.
    pub fn sealer(&self, config: &KeyConfig, direction: Direction, stream: u32) -> Result<Sealer> {
        Ok(Sealer {
            state: KeyState::new(self.traffic_secret(direction, stream), config)?,
        })
    }

    /// The opening half for records received in `direction` on stream `stream`.
    pub fn opener(&self, config: &KeyConfig, direction: Direction, stream: u32) -> Result<Opener> {
        Ok(Opener {
            state: KeyState::new(self.traffic_secret(direction, stream), config)?,
            poisoned: false,
        })
    }

    fn traffic_secret(&self, direction: Direction, stream: u32) -> TrafficSecret {
        let prk = hkdf::Salt::new(hkdf::HKDF_SHA256, b"fastcp v1 session").extract(&self.0);
        let label = format!("fastcp v1 {} stream {stream}", direction.label());
        let mut out = TrafficSecret([0; SECRET_LEN]);
        expand(&prk, label.as_bytes(), &mut out.0);
        out
    }
}

impl fmt::Debug for SessionSecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("SessionSecret(..)")
    }
}

/// Which way records flow on a stream; each direction has its own key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Direction {
    /// From the end that started the session to the other.
    ClientToServer,
    /// From the other end back to the client.
    ServerToClient,
}

impl Direction {
    /// The other direction.
    pub fn reverse(self) -> Direction {
        match self {
            Direction::ClientToServer => Direction::ServerToClient,
            Direction::ServerToClient => Direction::ClientToServer,
        }
    }

    /// `c2s` or `s2c`, as used in key labels.
    pub fn label(self) -> &'static str {
        match self {
            Direction::ClientToServer => "c2s",
            Direction::ServerToClient => "s2c",
        }
    }
}

/// When a stream key is replaced, and when a stream must stop. Both ends must use the same
/// values, or records fail to open after the first rekey.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeyLimits {
    /// Records under one key before the next epoch. Default 2^32.
    pub rekey_after_records: u64,
    /// Plaintext bytes under one key before the next epoch. Default 2^36 (64 GiB).
    pub rekey_after_bytes: u64,
    /// Records per stream and direction, over all epochs, after which sealing fails with
    /// [`Error::RecordLimit`]. Default 2^40.
    pub max_records: u64,
}

impl Default for KeyLimits {
    fn default() -> Self {
        KeyLimits {
            rekey_after_records: 1 << 32,
            rekey_after_bytes: 1 << 36,
            max_records: 1 << 40,
        }
    }
}

/// Which suite and provider a stream key uses, and its limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeyConfig {
    /// Suite; both ends must agree.
    pub suite: CipherSuite,
    /// Provider; each end may use its own.
    pub provider: Provider,
    /// Rekey and stop limits; both ends must agree. Default [`KeyLimits::default`].
    pub limits: KeyLimits,
}

impl KeyConfig {
    /// `suite` from `provider` with default limits.
    pub fn new(suite: CipherSuite, provider: Provider) -> KeyConfig {
        KeyConfig {
            suite,
            provider,
            limits: KeyLimits::default(),
        }
    }
}

impl From<Choice> for KeyConfig {
    fn from(c: Choice) -> KeyConfig {
        KeyConfig::new(c.suite, c.provider)
    }
}

/// Seals the records of one stream in one direction, numbering them itself.
///
/// Owns the key and the record counter; see the [module docs](self) for limits and rekeying.
pub struct Sealer {
    state: KeyState,
}

impl Sealer {
    /// Encrypts `in_out` in place as the next record and returns its tag.
    ///
    /// Fails with [`Error::RecordLimit`] once [`KeyLimits::max_records`] records were sealed.
    pub fn seal_in_place(&mut self, aad: &[u8], in_out: &mut [u8]) -> Result<Tag> {
        let limit = self.state.limits.max_records;
        if self.state.seq >= limit {
            return Err(Error::RecordLimit { limit });
        }
        self.state.before_record(in_out.len())?;
        let seq = self.state.seq;
        // The number is spent even if sealing fails: no nonce is ever offered twice.
        self.state.after_record(in_out.len());
        self.state.aead.seal_in_place(seq, aad, in_out)
    }

    /// Encrypts the plaintext in `buf` as the next record and appends the tag, so `buf` ends
    /// as `ciphertext || tag` ([`Sealer::tag_len`] bytes longer). `aad` (a frame header, for
    /// example) is authenticated but neither encrypted nor included in `buf`; the opener
    /// must pass the same bytes.
    pub fn seal_record(&mut self, aad: &[u8], buf: &mut Vec<u8>) -> Result<()> {
        let tag = self.seal_in_place(aad, buf)?;
        buf.extend_from_slice(&tag);
        Ok(())
    }

    /// Bytes each record grows by.
    pub fn tag_len(&self) -> usize {
        self.state.aead.tag_len()
    }

    /// The number the next record will carry.
    pub fn next_seq(&self) -> u64 {
        self.state.seq
    }

    /// How many times this key was replaced.
    pub fn epoch(&self) -> u64 {
        self.state.epoch
    }

    /// The suite in use.
    pub fn suite(&self) -> CipherSuite {
        self.state.aead.suite()
    }
}

impl fmt::Debug for Sealer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Sealer")
            .field("aead", &self.state.aead)
            .field("next_seq", &self.state.seq)
            .field("epoch", &self.state.epoch)
            .finish_non_exhaustive()
    }
}

/// Opens the records of one stream in one direction, in order, each exactly once.
pub struct Opener {
    state: KeyState,
    poisoned: bool,
}

impl Opener {
    /// Checks `tag` and decrypts `in_out` in place as the next expected record.
    ///
    /// Any failure poisons the opener: later calls return [`Error::Poisoned`].
    pub fn open_in_place(&mut self, aad: &[u8], in_out: &mut [u8], tag: &Tag) -> Result<()> {
        if self.poisoned {
            return Err(Error::Poisoned);
        }
        if let Err(e) = self.state.before_record(in_out.len()) {
            self.poisoned = true;
            return Err(e);
        }
        match self
            .state
            .aead
            .open_in_place(self.state.seq, aad, in_out, tag)
        {
            Ok(()) => {
                self.state.after_record(in_out.len());
                Ok(())
            }
            Err(e) => {
                self.poisoned = true;
                Err(e)
            }
        }
    }

    /// Opens a `ciphertext || tag` record made by [`Sealer::seal_record`] in place and
    /// returns the plaintext, a prefix of `record`.
    pub fn open_record<'a>(&mut self, aad: &[u8], record: &'a mut [u8]) -> Result<&'a mut [u8]> {
        if self.poisoned {
            return Err(Error::Poisoned);
        }
        let tag_len = self.tag_len();
        let Some(body_len) = record.len().checked_sub(tag_len) else {
            self.poisoned = true;
            return Err(Error::Truncated {
                len: record.len(),
                tag_len,
            });
        };
        let (body, tag) = record.split_at_mut(body_len);
        let tag: Tag = (&*tag).try_into().map_err(|_| Error::Open)?;
        self.open_in_place(aad, body, &tag)?;
        Ok(body)
    }

    /// Bytes each record carries beyond its plaintext.
    pub fn tag_len(&self) -> usize {
        self.state.aead.tag_len()
    }

    /// The number the next record must carry.
    pub fn next_seq(&self) -> u64 {
        self.state.seq
    }

    /// How many times this key was replaced.
    pub fn epoch(&self) -> u64 {
        self.state.epoch
    }

    /// Whether an earlier record failed, so this opener refuses all others.
    pub fn is_poisoned(&self) -> bool {
        self.poisoned
    }
}

impl fmt::Debug for Opener {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Opener")
            .field("aead", &self.state.aead)
            .field("next_seq", &self.state.seq)
            .field("epoch", &self.state.epoch)
            .field("poisoned", &self.poisoned)
            .finish_non_exhaustive()
    }
}

/// A stream-direction secret from which epoch keys come; wiped on drop.
#[derive(Zeroize, ZeroizeOnDrop)]
struct TrafficSecret([u8; SECRET_LEN]);

impl TrafficSecret {
    fn prk(&self) -> hkdf::Prk {
        hkdf::Prk::new_less_safe(hkdf::HKDF_SHA256, &self.0)
    }

    fn aead(&self, suite: CipherSuite, provider: Provider) -> Result<Box<dyn Aead>> {
        let prk = self.prk();
        let mut key = Zeroizing::new(vec![0u8; suite.key_len()]);
        expand(&prk, format!("fastcp v1 key {suite}").as_bytes(), &mut key);
        let mut iv = Zeroizing::new([0u8; NONCE_LEN]);
        expand(&prk, b"fastcp v1 iv", &mut *iv);
        new_aead(provider, suite, &key, &iv)
    }

    fn next(&self) -> TrafficSecret {
        let mut out = TrafficSecret([0; SECRET_LEN]);
        expand(&self.prk(), b"fastcp v1 rekey", &mut out.0);
        out
    }
}

/// What a sealer and an opener share: the current key, its counters, and the secret that
/// yields the next one.
struct KeyState {
    traffic: TrafficSecret,
    aead: Box<dyn Aead>,
    suite: CipherSuite,
    provider: Provider,
    limits: KeyLimits,
    seq: u64,
    epoch: u64,
    records_in_epoch: u64,
    bytes_in_epoch: u64,
}

impl KeyState {
    fn new(traffic: TrafficSecret, config: &KeyConfig) -> Result<KeyState> {
        Ok(KeyState {
            aead: traffic.aead(config.suite, config.provider)?,
            traffic,
            suite: config.suite,
            provider: config.provider,
            limits: config.limits,
            seq: 0,
            epoch: 0,
            records_in_epoch: 0,
            bytes_in_epoch: 0,
        })
    }

    /// Moves to the next epoch if a record of `len` bytes would take this key past a limit.
    /// Both ends call it with the same lengths in the same order, so they agree.
    fn before_record(&mut self, len: usize) -> Result<()> {
        let len = len as u64;
        let full = self.records_in_epoch >= self.limits.rekey_after_records
            || self.bytes_in_epoch.saturating_add(len) > self.limits.rekey_after_bytes;
        if full && self.records_in_epoch > 0 {
            let next = self.traffic.next();
            self.aead = next.aead(self.suite, self.provider)?;
            self.traffic = next;
            self.epoch += 1;
            self.records_in_epoch = 0;
            self.bytes_in_epoch = 0;
        }
        Ok(())
    }

    fn after_record(&mut self, len: usize) {
        self.seq += 1;
        self.records_in_epoch += 1;
        self.bytes_in_epoch = self.bytes_in_epoch.saturating_add(len as u64);
    }
}

/// A length for ring's HKDF-Expand.
struct Len(usize);

impl hkdf::KeyType for Len {
    fn len(&self) -> usize {
        self.0
    }
}

/// HKDF-Expand(prk, info) into `out`. The lengths used here (12 to 32 bytes) are far below
/// HKDF-SHA256's limit of 255 * 32 bytes, so this cannot fail.
fn expand(prk: &hkdf::Prk, info: &[u8], out: &mut [u8]) {
    let info = [info];
    let okm = prk
        .expand(&info, Len(out.len()))
        .expect("HKDF-SHA256 output of at most 32 bytes");
    okm.fill(out)
        .expect("HKDF-SHA256 output of at most 32 bytes");
}
