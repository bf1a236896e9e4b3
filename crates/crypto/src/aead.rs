//! The provider-agnostic AEAD interface and its three implementations.
//!
//! An [`Aead`] is one suite keyed once, from one provider. It seals and opens in place, with
//! the tag kept separate so the framing layer decides where it goes ([`Aead::tag_len`] says
//! how much room to leave). Nonces are not passed in: each call names a 64-bit sequence
//! number, and the key turns it into a 96-bit nonce the way TLS 1.3 does (RFC 8446 §5.3):
//! the number, big-endian and left-padded to 12 bytes, XORed with a per-key IV. A distinct
//! sequence number under one key therefore always gives a distinct nonce.
//!
//! Key material: fastcp wipes every copy of key bytes it holds ([`crate::SessionSecret`],
//! derived keys, IVs). RustCrypto's expanded keys are wiped on drop too (its `zeroize`
//! feature is on). ring and aws-lc-rs keep their expanded key schedules inside their own
//! types and expose no way to wipe them; fastcp cannot do it without unsafe code, so those
//! copies are freed, not wiped.

use std::fmt;

use aes_gcm::aead::{AeadInOut, KeyInit};
use zeroize::{Zeroize, ZeroizeOnDrop};

use crate::{CipherSuite, Error, Provider, Result};

/// Length of every suite's authentication tag, in bytes.
pub const TAG_LEN: usize = 16;
/// Length of every suite's nonce (and of the per-key IV), in bytes.
pub const NONCE_LEN: usize = 12;
/// An authentication tag.
pub type Tag = [u8; TAG_LEN];

/// One AEAD suite with one key, from one provider.
///
/// Sequence numbers are the caller's to keep unique: sealing two messages under one key with
/// the same `seq` breaks the cipher. [`crate::Sealer`] and [`crate::Opener`] keep the counters
/// for you; use them unless you are writing a test or a benchmark.
///
/// ```
/// use fastcp_crypto::{new_aead, CipherSuite, Provider};
///
/// let aead = new_aead(Provider::Ring, CipherSuite::Aes128Gcm, &[7; 16], &[0; 12])?;
/// let mut buf = *b"hello";
/// let tag = aead.seal_in_place(0, b"header", &mut buf)?;
/// assert_ne!(&buf, b"hello");
/// aead.open_in_place(0, b"header", &mut buf, &tag)?;
/// assert_eq!(&buf, b"hello");
/// assert!(aead.open_in_place(1, b"header", &mut buf, &tag).is_err());
/// # Ok::<(), fastcp_crypto::Error>(())
/// ```
pub trait Aead: Send + Sync + fmt::Debug {
    /// The suite this key is for.
    fn suite(&self) -> CipherSuite;

    /// The library doing the work.
    fn provider(&self) -> Provider;

    /// Bytes of tag each sealed message carries.
    fn tag_len(&self) -> usize {
        TAG_LEN
    }

    /// Encrypts `in_out` in place and returns the tag that authenticates it and `aad`.
    fn seal_in_place(&self, seq: u64, aad: &[u8], in_out: &mut [u8]) -> Result<Tag>;

    /// Checks `tag` against `in_out` and `aad`, then decrypts `in_out` in place.
    ///
    /// On error `in_out` holds unspecified bytes and must be discarded.
    fn open_in_place(&self, seq: u64, aad: &[u8], in_out: &mut [u8], tag: &Tag) -> Result<()>;
}

/// Keys `suite` from `provider` with `key` (exactly [`CipherSuite::key_len`] bytes) and the
/// per-key `iv` that sequence numbers are XORed into.
///
/// Fails with [`Error::ProviderUnavailable`] for [`Provider::AwsLc`] when the `aws-lc-rs`
/// feature is off, and with [`Error::KeyLength`] for a key of the wrong length.
pub fn new_aead(
    provider: Provider,
    suite: CipherSuite,
    key: &[u8],
    iv: &[u8; NONCE_LEN],
) -> Result<Box<dyn Aead>> {
    if key.len() != suite.key_len() {
        return Err(Error::KeyLength {
            suite,
            expected: suite.key_len(),
            got: key.len(),
        });
    }
    let iv = Iv(*iv);
    match provider {
        Provider::Ring => ring_impl::new(suite, key, iv),
        Provider::RustCrypto => rustcrypto_impl::new(suite, key, iv),
        #[cfg(feature = "aws-lc-rs")]
        Provider::AwsLc => awslc_impl::new(suite, key, iv),
        #[cfg(not(feature = "aws-lc-rs"))]
        Provider::AwsLc => Err(Error::ProviderUnavailable(provider)),
    }
}

/// Conveniences over [`Aead`] for messages that carry their tag at the end.
pub trait AeadExt: Aead {
    /// Encrypts the plaintext in `buf` and appends the tag.
    fn seal_append(&self, seq: u64, aad: &[u8], buf: &mut Vec<u8>) -> Result<()> {
        let tag = self.seal_in_place(seq, aad, buf)?;
        buf.extend_from_slice(&tag);
        Ok(())
    }

    /// Opens `ciphertext || tag` in place and returns the plaintext part of `buf`.
    fn open_trailing<'a>(&self, seq: u64, aad: &[u8], buf: &'a mut [u8]) -> Result<&'a mut [u8]> {
        let tag_len = self.tag_len();
        let Some(body_len) = buf.len().checked_sub(tag_len) else {
            return Err(Error::Truncated {
                len: buf.len(),
                tag_len,
            });
        };
        let (body, tag) = buf.split_at_mut(body_len);
        let tag: Tag = (&*tag).try_into().map_err(|_| Error::Open)?;
        self.open_in_place(seq, aad, body, &tag)?;
        Ok(body)
    }
}

impl<T: Aead + ?Sized> AeadExt for T {}

/// The per-key IV; wiped on drop.
#[derive(Clone, Zeroize, ZeroizeOnDrop)]
struct Iv([u8; NONCE_LEN]);

impl Iv {
    /// The nonce for `seq`: `iv XOR (0u32 || seq as big-endian u64)`.
    fn nonce(&self, seq: u64) -> [u8; NONCE_LEN] {
        let mut n = self.0;
        for (b, s) in n[4..].iter_mut().zip(seq.to_be_bytes()) {
            *b ^= s;
        }
        n
    }
}

mod ring_impl {
    use ring::aead::{self as r, Aad, LessSafeKey, Nonce, UnboundKey};

    use super::{Aead, Iv, Tag};
    use crate::{CipherSuite, Error, Provider, Result};

    pub(super) struct RingAead {
        key: LessSafeKey,
        suite: CipherSuite,
        iv: Iv,
    }

    pub(super) fn new(suite: CipherSuite, key: &[u8], iv: Iv) -> Result<Box<dyn Aead>> {
        let alg = match suite {
            CipherSuite::Aes128Gcm => &r::AES_128_GCM,
            CipherSuite::Aes256Gcm => &r::AES_256_GCM,
            CipherSuite::ChaCha20Poly1305 => &r::CHACHA20_POLY1305,
        };
        let key = UnboundKey::new(alg, key).map_err(|_| Error::Key {
            provider: Provider::Ring,
            suite,
        })?;
        Ok(Box::new(RingAead {
            key: LessSafeKey::new(key),
            suite,
            iv,
        }))
    }

    impl std::fmt::Debug for RingAead {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "Aead({} / ring)", self.suite)
        }
    }

    impl Aead for RingAead {
        fn suite(&self) -> CipherSuite {
            self.suite
        }

        fn provider(&self) -> Provider {
            Provider::Ring
        }

        fn seal_in_place(&self, seq: u64, aad: &[u8], in_out: &mut [u8]) -> Result<Tag> {
            let nonce = Nonce::assume_unique_for_key(self.iv.nonce(seq));
            let tag = self
                .key
                .seal_in_place_separate_tag(nonce, Aad::from(aad), in_out)
                .map_err(|_| Error::Seal {
                    provider: Provider::Ring,
                    suite: self.suite,
                    len: in_out.len(),
                })?;
            tag.as_ref().try_into().map_err(|_| Error::Seal {
                provider: Provider::Ring,
                suite: self.suite,
                len: in_out.len(),
            })
        }

        fn open_in_place(&self, seq: u64, aad: &[u8], in_out: &mut [u8], tag: &Tag) -> Result<()> {
            let nonce = Nonce::assume_unique_for_key(self.iv.nonce(seq));
            self.key
                .open_in_place_separate_tag(nonce, Aad::from(aad), r::Tag::from(*tag), in_out, 0..)
                .map(|_| ())
                .map_err(|_| Error::Open)
        }
    }
}

mod rustcrypto_impl {
    use aes_gcm::aead::array::Array;
    use aes_gcm::aead::consts::{U12, U16};
    use aes_gcm::{Aes128Gcm, Aes256Gcm};
    use chacha20poly1305::ChaCha20Poly1305;

    use super::{Aead, AeadInOut, Iv, KeyInit, Tag};
    use crate::{CipherSuite, Error, Provider, Result};

    /// Any RustCrypto AEAD with 12-byte nonces and 16-byte tags.
    pub(super) struct RustCryptoAead<C> {
        cipher: C,
        suite: CipherSuite,
        iv: Iv,
    }

    pub(super) fn new(suite: CipherSuite, key: &[u8], iv: Iv) -> Result<Box<dyn Aead>> {
        fn make<C>(suite: CipherSuite, key: &[u8], iv: Iv) -> Result<Box<dyn Aead>>
        where
            C: AeadInOut<NonceSize = U12, TagSize = U16> + KeyInit + Send + Sync + 'static,
        {
            let cipher = C::new_from_slice(key).map_err(|_| Error::Key {
                provider: Provider::RustCrypto,
                suite,
            })?;
            Ok(Box::new(RustCryptoAead { cipher, suite, iv }))
        }
        match suite {
            CipherSuite::Aes128Gcm => make::<Aes128Gcm>(suite, key, iv),
            CipherSuite::Aes256Gcm => make::<Aes256Gcm>(suite, key, iv),
            CipherSuite::ChaCha20Poly1305 => make::<ChaCha20Poly1305>(suite, key, iv),
        }
    }

    impl<C> std::fmt::Debug for RustCryptoAead<C> {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "Aead({} / rustcrypto)", self.suite)
        }
    }

    impl<C> Aead for RustCryptoAead<C>
    where
        C: AeadInOut<NonceSize = U12, TagSize = U16> + Send + Sync,
    {
        fn suite(&self) -> CipherSuite {
            self.suite
        }

        fn provider(&self) -> Provider {
            Provider::RustCrypto
        }

        fn seal_in_place(&self, seq: u64, aad: &[u8], in_out: &mut [u8]) -> Result<Tag> {
            let nonce = Array::from(self.iv.nonce(seq));
            let len = in_out.len();
            let tag = self
                .cipher
                .encrypt_inout_detached(&nonce, aad, in_out.into())
                .map_err(|_| Error::Seal {
                    provider: Provider::RustCrypto,
                    suite: self.suite,
                    len,
                })?;
            Ok(tag.into())
        }

        fn open_in_place(&self, seq: u64, aad: &[u8], in_out: &mut [u8], tag: &Tag) -> Result<()> {
            let nonce = Array::from(self.iv.nonce(seq));
            self.cipher
                .decrypt_inout_detached(&nonce, aad, in_out.into(), &Array::from(*tag))
                .map_err(|_| Error::Open)
        }
    }
}

#[cfg(feature = "aws-lc-rs")]
mod awslc_impl {
    use aws_lc_rs::aead::{self as a, Aad, LessSafeKey, Nonce, UnboundKey};

    use super::{Aead, Iv, Tag};
    use crate::{CipherSuite, Error, Provider, Result};

    pub(super) struct AwsLcAead {
        key: LessSafeKey,
        suite: CipherSuite,
        iv: Iv,
    }

    pub(super) fn new(suite: CipherSuite, key: &[u8], iv: Iv) -> Result<Box<dyn Aead>> {
        let alg = match suite {
            CipherSuite::Aes128Gcm => &a::AES_128_GCM,
            CipherSuite::Aes256Gcm => &a::AES_256_GCM,
            CipherSuite::ChaCha20Poly1305 => &a::CHACHA20_POLY1305,
        };
        let key = UnboundKey::new(alg, key).map_err(|_| Error::Key {
            provider: Provider::AwsLc,
            suite,
        })?;
        Ok(Box::new(AwsLcAead {
            key: LessSafeKey::new(key),
            suite,
            iv,
        }))
    }

    impl std::fmt::Debug for AwsLcAead {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "Aead({} / aws-lc-rs)", self.suite)
        }
    }

    impl Aead for AwsLcAead {
        fn suite(&self) -> CipherSuite {
            self.suite
        }

        fn provider(&self) -> Provider {
            Provider::AwsLc
        }

        fn seal_in_place(&self, seq: u64, aad: &[u8], in_out: &mut [u8]) -> Result<Tag> {
            let nonce = Nonce::assume_unique_for_key(self.iv.nonce(seq));
            let len = in_out.len();
            let err = || Error::Seal {
                provider: Provider::AwsLc,
                suite: self.suite,
                len,
            };
            let tag = self
                .key
                .seal_in_place_separate_tag(nonce, Aad::from(aad), in_out)
                .map_err(|_| err())?;
            tag.as_ref().try_into().map_err(|_| err())
        }

        fn open_in_place(&self, seq: u64, aad: &[u8], in_out: &mut [u8], tag: &Tag) -> Result<()> {
            let nonce = Nonce::assume_unique_for_key(self.iv.nonce(seq));
            self.key
                .open_in_place_separate_tag(nonce, Aad::from(aad), tag, in_out)
                .map(|_| ())
                .map_err(|_| Error::Open)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nonce_is_iv_xor_big_endian_counter() {
        let iv = Iv([0xff; 12]);
        assert_eq!(iv.nonce(0), [0xff; 12]);
        let n = iv.nonce(0x0102_0304_0506_0708);
        assert_eq!(&n[..4], &[0xff; 4]);
        assert_eq!(&n[4..], &[0xfe, 0xfd, 0xfc, 0xfb, 0xfa, 0xf9, 0xf8, 0xf7]);
        assert_ne!(iv.nonce(1), iv.nonce(2));
    }

    #[test]
    fn wrong_key_length_is_rejected() {
        for &p in Provider::available() {
            let err = new_aead(p, CipherSuite::Aes128Gcm, &[0; 32], &[0; 12]).unwrap_err();
            assert!(
                matches!(
                    err,
                    Error::KeyLength {
                        expected: 16,
                        got: 32,
                        ..
                    }
                ),
                "{err}"
            );
        }
    }

    #[test]
    fn aws_lc_without_feature_is_a_clear_error() {
        let r = new_aead(Provider::AwsLc, CipherSuite::Aes128Gcm, &[0; 16], &[0; 12]);
        if cfg!(feature = "aws-lc-rs") {
            assert!(r.is_ok());
        } else {
            assert!(matches!(
                r,
                Err(Error::ProviderUnavailable(Provider::AwsLc))
            ));
        }
    }

    #[test]
    fn short_trailing_record_is_truncated_error() {
        let aead = new_aead(Provider::Ring, CipherSuite::Aes128Gcm, &[1; 16], &[0; 12]).unwrap();
        let mut buf = [0u8; 15];
        assert!(matches!(
            aead.open_trailing(0, b"", &mut buf),
            Err(Error::Truncated {
                len: 15,
                tag_len: 16
            })
        ));
    }
}
