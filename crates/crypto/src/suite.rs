//! Names of the cipher suites and of the libraries that implement them.

use std::fmt;
use std::str::FromStr;

use crate::Error;

/// An AEAD cipher suite fastcp can run a data stream under.
///
/// All three have 16-byte tags and 12-byte nonces. The wire id ([`CipherSuite::id`]) is what
/// the handshake carries; the name ([`fmt::Display`] / [`FromStr`]) is what users type after
/// `--cipher`.
///
/// ```
/// use fastcp_crypto::CipherSuite;
///
/// let suite: CipherSuite = "chacha20-poly1305".parse()?;
/// assert_eq!(suite, CipherSuite::ChaCha20Poly1305);
/// assert_eq!(CipherSuite::from_id(suite.id()), Some(suite));
/// assert_eq!(suite.ssh_name(), "chacha20-poly1305@openssh.com");
/// # Ok::<(), fastcp_crypto::Error>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum CipherSuite {
    /// AES-128 in Galois/Counter Mode (NIST SP 800-38D), 16-byte key.
    Aes128Gcm,
    /// AES-256 in Galois/Counter Mode (NIST SP 800-38D), 32-byte key.
    Aes256Gcm,
    /// ChaCha20 with Poly1305 (RFC 8439), 32-byte key.
    ChaCha20Poly1305,
}

impl CipherSuite {
    /// Every suite, in wire-id order.
    pub const ALL: [CipherSuite; 3] = [
        CipherSuite::Aes128Gcm,
        CipherSuite::Aes256Gcm,
        CipherSuite::ChaCha20Poly1305,
    ];

    /// The byte that names this suite in the handshake (1, 2 or 3).
    pub fn id(self) -> u8 {
        match self {
            CipherSuite::Aes128Gcm => 1,
            CipherSuite::Aes256Gcm => 2,
            CipherSuite::ChaCha20Poly1305 => 3,
        }
    }

    /// The suite a handshake byte names, or `None` for an unknown byte.
    pub fn from_id(id: u8) -> Option<Self> {
        CipherSuite::ALL.into_iter().find(|s| s.id() == id)
    }

    /// The name users type: `aes128-gcm`, `aes256-gcm` or `chacha20-poly1305`.
    pub fn name(self) -> &'static str {
        match self {
            CipherSuite::Aes128Gcm => "aes128-gcm",
            CipherSuite::Aes256Gcm => "aes256-gcm",
            CipherSuite::ChaCha20Poly1305 => "chacha20-poly1305",
        }
    }

    /// OpenSSH's name for the same cipher, for the SSH transport's cipher list.
    pub fn ssh_name(self) -> &'static str {
        match self {
            CipherSuite::Aes128Gcm => "aes128-gcm@openssh.com",
            CipherSuite::Aes256Gcm => "aes256-gcm@openssh.com",
            CipherSuite::ChaCha20Poly1305 => "chacha20-poly1305@openssh.com",
        }
    }

    /// Key length in bytes.
    pub fn key_len(self) -> usize {
        match self {
            CipherSuite::Aes128Gcm => 16,
            CipherSuite::Aes256Gcm | CipherSuite::ChaCha20Poly1305 => 32,
        }
    }

    /// Whether this suite runs on AES (and so wants hardware AES and carry-less multiply).
    pub fn is_aes(self) -> bool {
        matches!(self, CipherSuite::Aes128Gcm | CipherSuite::Aes256Gcm)
    }
}

impl fmt::Display for CipherSuite {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for CipherSuite {
    type Err = Error;

    /// Accepts fastcp's names and OpenSSH's names, ignoring ASCII case.
    fn from_str(s: &str) -> Result<Self, Error> {
        CipherSuite::ALL
            .into_iter()
            .find(|c| c.name().eq_ignore_ascii_case(s) || c.ssh_name().eq_ignore_ascii_case(s))
            .ok_or_else(|| Error::UnknownCipher(s.to_owned()))
    }
}

/// A library that implements the suites.
///
/// [`Provider::AwsLc`] always exists as a name, but it is only usable when fastcp-crypto is
/// built with the `aws-lc-rs` cargo feature; otherwise [`crate::new_aead`] returns
/// [`Error::ProviderUnavailable`]. Keeping the variant lets a command line name it and get a
/// clear error instead of "unknown provider".
///
/// ```
/// use fastcp_crypto::Provider;
///
/// assert_eq!("ring".parse::<Provider>()?, Provider::Ring);
/// assert!(Provider::available().contains(&Provider::RustCrypto));
/// # Ok::<(), fastcp_crypto::Error>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Provider {
    /// `ring` 0.17 (BoringSSL-derived assembly).
    Ring,
    /// RustCrypto's `aes-gcm` 0.11 and `chacha20poly1305` 0.11 (pure Rust with intrinsics).
    RustCrypto,
    /// `aws-lc-rs` (AWS-LC); needs the `aws-lc-rs` cargo feature.
    AwsLc,
}

impl Provider {
    /// Every provider fastcp knows about, built in or not.
    pub const ALL: [Provider; 3] = [Provider::Ring, Provider::RustCrypto, Provider::AwsLc];

    /// The providers built into this binary.
    pub fn available() -> &'static [Provider] {
        if cfg!(feature = "aws-lc-rs") {
            &[Provider::Ring, Provider::RustCrypto, Provider::AwsLc]
        } else {
            &[Provider::Ring, Provider::RustCrypto]
        }
    }

    /// Whether this provider is built into this binary.
    pub fn is_available(self) -> bool {
        Provider::available().contains(&self)
    }

    /// The name used on the command line and in tables: `ring`, `rustcrypto`, `aws-lc-rs`.
    pub fn name(self) -> &'static str {
        match self {
            Provider::Ring => "ring",
            Provider::RustCrypto => "rustcrypto",
            Provider::AwsLc => "aws-lc-rs",
        }
    }

    /// The fastest provider built in for `suite` on this CPU, as measured for BENCHMARKS.md.
    ///
    /// AES-GCM: aws-lc-rs when it is built in and this CPU runs its AVX-512 GCM (VAES,
    /// VPCLMULQDQ and AVX-512 F/DQ/BW/VL: about twice ring's rate there); ring otherwise,
    /// whose VAES/AVX2 GCM measured twice aws-lc-rs's AES-NI/AVX path on a CPU with VAES but
    /// no AVX-512 (AMD Zen 3), and which is level with it on plain AES-NI.
    /// ChaCha20-Poly1305: ring, which measured level with or ahead of aws-lc-rs. RustCrypto
    /// is never the default: it is the slowest of the three unless built with
    /// `-C target-cpu=native`.
    ///
    /// ```
    /// use fastcp_crypto::{CipherSuite, Provider};
    ///
    /// let p = Provider::fastest_for(CipherSuite::Aes128Gcm);
    /// assert!(p.is_available());
    /// assert_eq!(Provider::fastest_for(CipherSuite::ChaCha20Poly1305), Provider::Ring);
    /// ```
    pub fn fastest_for(suite: CipherSuite) -> Provider {
        Provider::fastest_on(suite, aws_lc_has_avx512_gcm())
    }

    /// [`Provider::fastest_for`] with the CPU question answered by the caller: whether this
    /// CPU runs aws-lc-rs's AVX-512 AES-GCM.
    fn fastest_on(suite: CipherSuite, avx512_gcm: bool) -> Provider {
        if suite.is_aes() && avx512_gcm && Provider::AwsLc.is_available() {
            Provider::AwsLc
        } else {
            Provider::Ring
        }
    }
}

/// Whether AWS-LC would take its VAES + AVX-512 AES-GCM path on this CPU (the condition of
/// its `crypto_gcm_avx512_enabled`); without it AWS-LC falls back to an AES-NI/AVX path.
fn aws_lc_has_avx512_gcm() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::is_x86_feature_detected as has;
        has!("vaes")
            && has!("vpclmulqdq")
            && has!("avx512f")
            && has!("avx512dq")
            && has!("avx512bw")
            && has!("avx512vl")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

impl fmt::Display for Provider {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Provider {
    type Err = Error;

    /// Accepts `ring`, `rustcrypto` (or `rust-crypto`), `aws-lc-rs` (or `aws-lc`), ignoring
    /// ASCII case.
    fn from_str(s: &str) -> Result<Self, Error> {
        match s.to_ascii_lowercase().as_str() {
            "ring" => Ok(Provider::Ring),
            "rustcrypto" | "rust-crypto" => Ok(Provider::RustCrypto),
            "aws-lc-rs" | "aws-lc" | "awslc" => Ok(Provider::AwsLc),
            _ => Err(Error::UnknownProvider(s.to_owned())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_round_trip_and_unknown_ids_are_none() {
        for s in CipherSuite::ALL {
            assert_eq!(CipherSuite::from_id(s.id()), Some(s));
        }
        assert_eq!(
            CipherSuite::ALL.map(CipherSuite::id),
            [1, 2, 3],
            "wire ids are fixed"
        );
        assert_eq!(CipherSuite::from_id(0), None);
        assert_eq!(CipherSuite::from_id(4), None);
        assert_eq!(CipherSuite::from_id(255), None);
    }

    #[test]
    fn names_round_trip() {
        for s in CipherSuite::ALL {
            assert_eq!(s.to_string().parse::<CipherSuite>().unwrap(), s);
            assert_eq!(s.ssh_name().parse::<CipherSuite>().unwrap(), s);
        }
        assert_eq!(
            "AES128-GCM".parse::<CipherSuite>().unwrap(),
            CipherSuite::Aes128Gcm
        );
        assert!(matches!(
            "aes128-ctr".parse::<CipherSuite>(),
            Err(Error::UnknownCipher(_))
        ));
        for p in Provider::ALL {
            assert_eq!(p.to_string().parse::<Provider>().unwrap(), p);
        }
        assert!(matches!(
            "openssl".parse::<Provider>(),
            Err(Error::UnknownProvider(_))
        ));
    }

    #[test]
    fn key_lengths() {
        assert_eq!(CipherSuite::Aes128Gcm.key_len(), 16);
        assert_eq!(CipherSuite::Aes256Gcm.key_len(), 32);
        assert_eq!(CipherSuite::ChaCha20Poly1305.key_len(), 32);
    }

    #[test]
    fn default_providers() {
        let built_in = cfg!(feature = "aws-lc-rs");
        for aes in [CipherSuite::Aes128Gcm, CipherSuite::Aes256Gcm] {
            let with = if built_in {
                Provider::AwsLc
            } else {
                Provider::Ring
            };
            assert_eq!(Provider::fastest_on(aes, true), with);
            assert_eq!(Provider::fastest_on(aes, false), Provider::Ring);
        }
        for avx512 in [false, true] {
            assert_eq!(
                Provider::fastest_on(CipherSuite::ChaCha20Poly1305, avx512),
                Provider::Ring
            );
        }
        assert_eq!(
            Provider::fastest_for(CipherSuite::Aes128Gcm),
            Provider::fastest_on(CipherSuite::Aes128Gcm, aws_lc_has_avx512_gcm())
        );
    }

    #[test]
    fn default_provider_is_built_in() {
        for s in CipherSuite::ALL {
            assert!(Provider::fastest_for(s).is_available());
            assert_ne!(Provider::fastest_for(s), Provider::RustCrypto);
        }
        assert_eq!(Provider::AwsLc.is_available(), cfg!(feature = "aws-lc-rs"));
    }
}
