//! What this CPU offers the ciphers, and the bits the handshake carries.

use std::fmt;
use std::sync::OnceLock;

/// The environment variable that makes fastcp act as if this CPU had no hardware AES.
///
/// Set it to `1` (any other value, or unset, leaves the probe alone). It changes what
/// [`CpuFeatures::probe`] reports, and so what fastcp advertises to the peer and picks with
/// [`crate::choose`]; it does not stop the crypto libraries from using AES instructions
/// inside their own code. Tests use it to run the ChaCha20-Poly1305 path on any machine.
pub const NO_HW_AES_ENV: &str = "FASTCP_NO_HW_AES";

/// CPU features that matter for cipher choice, as a small bit set.
///
/// The bit layout is part of the wire handshake ([`CpuFeatures::to_bits`]); unknown bits
/// from a newer peer are ignored.
///
/// | bit | meaning |
/// |---|---|
/// | 0 | hardware AES (x86_64 AES-NI, aarch64 AES) |
/// | 1 | carry-less multiply (x86_64 PCLMULQDQ, aarch64 PMULL) |
/// | 2 | VAES (x86_64) |
/// | 3 | VPCLMULQDQ (x86_64) |
/// | 4 | AVX-512F (x86_64) |
/// | 5 | AVX2 (x86_64) |
///
/// ```
/// use fastcp_crypto::CpuFeatures;
///
/// let here = CpuFeatures::probe();
/// let wire = here.to_bits();
/// assert_eq!(CpuFeatures::from_bits(wire), here);
/// assert!(!here.without_hw_aes().has_hw_aes());
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct CpuFeatures {
    bits: u32,
}

impl CpuFeatures {
    /// Hardware AES rounds (AES-NI, ARMv8 AES).
    pub const HW_AES: u32 = 1 << 0;
    /// Carry-less multiply (PCLMULQDQ, PMULL), which makes GHASH fast.
    pub const CLMUL: u32 = 1 << 1;
    /// Vector AES (VAES).
    pub const VAES: u32 = 1 << 2;
    /// Vector carry-less multiply (VPCLMULQDQ).
    pub const VPCLMULQDQ: u32 = 1 << 3;
    /// AVX-512 Foundation.
    pub const AVX512F: u32 = 1 << 4;
    /// AVX2.
    pub const AVX2: u32 = 1 << 5;
    /// Every bit this version knows.
    pub const KNOWN: u32 = (1 << 6) - 1;

    /// No features at all: a CPU without any of the above.
    pub const NONE: CpuFeatures = CpuFeatures { bits: 0 };

    /// This CPU's features, probed once and cached, with [`NO_HW_AES_ENV`] applied.
    pub fn probe() -> CpuFeatures {
        static PROBED: OnceLock<CpuFeatures> = OnceLock::new();
        *PROBED.get_or_init(|| {
            let hw = CpuFeatures::detect();
            if env_disables_hw_aes(std::env::var_os(NO_HW_AES_ENV).as_deref()) {
                hw.without_hw_aes()
            } else {
                hw
            }
        })
    }

    /// Asks the CPU directly, ignoring [`NO_HW_AES_ENV`]. Not cached; prefer
    /// [`CpuFeatures::probe`].
    pub fn detect() -> CpuFeatures {
        #[allow(unused_mut)]
        let mut bits = 0;
        #[cfg(target_arch = "x86_64")]
        {
            use std::arch::is_x86_feature_detected as has;
            let flags = [
                (has!("aes"), Self::HW_AES),
                (has!("pclmulqdq"), Self::CLMUL),
                (has!("vaes"), Self::VAES),
                (has!("vpclmulqdq"), Self::VPCLMULQDQ),
                (has!("avx512f"), Self::AVX512F),
                (has!("avx2"), Self::AVX2),
            ];
            for (present, bit) in flags {
                if present {
                    bits |= bit;
                }
            }
        }
        #[cfg(target_arch = "aarch64")]
        {
            use std::arch::is_aarch64_feature_detected as has;
            // std's "aes" on aarch64 means FEAT_AES and FEAT_PMULL together.
            if has!("aes") {
                bits |= Self::HW_AES | Self::CLMUL;
            }
        }
        CpuFeatures { bits }
    }

    /// The same features minus hardware AES (and VAES): what fastcp reports under
    /// [`NO_HW_AES_ENV`], or when a config asks for it.
    #[must_use]
    pub fn without_hw_aes(self) -> CpuFeatures {
        CpuFeatures {
            bits: self.bits & !(Self::HW_AES | Self::VAES),
        }
    }

    /// The handshake form.
    pub fn to_bits(self) -> u32 {
        self.bits
    }

    /// Reads the handshake form; bits this version does not know are dropped.
    pub fn from_bits(bits: u32) -> CpuFeatures {
        CpuFeatures {
            bits: bits & Self::KNOWN,
        }
    }

    /// Whether every bit in `mask` is set.
    pub fn contains(self, mask: u32) -> bool {
        self.bits & mask == mask
    }

    /// Hardware AES rounds.
    pub fn has_hw_aes(self) -> bool {
        self.contains(Self::HW_AES)
    }

    /// Carry-less multiply.
    pub fn has_clmul(self) -> bool {
        self.contains(Self::CLMUL)
    }

    /// Hardware AES and carry-less multiply: what AES-GCM needs to beat ChaCha20-Poly1305.
    pub fn has_fast_aes_gcm(self) -> bool {
        self.contains(Self::HW_AES | Self::CLMUL)
    }

    /// Names of the set bits, for logs and `fastcp bench ciphers`.
    pub fn names(self) -> Vec<&'static str> {
        let mut out = Vec::new();
        for (bit, name) in [
            (Self::HW_AES, "aes"),
            (Self::CLMUL, "clmul"),
            (Self::VAES, "vaes"),
            (Self::VPCLMULQDQ, "vpclmulqdq"),
            (Self::AVX512F, "avx512f"),
            (Self::AVX2, "avx2"),
        ] {
            if self.contains(bit) {
                out.push(name);
            }
        }
        out
    }
}

/// Whether the value of [`NO_HW_AES_ENV`] asks to hide hardware AES.
fn env_disables_hw_aes(value: Option<&std::ffi::OsStr>) -> bool {
    value.is_some_and(|v| v == "1")
}

impl fmt::Debug for CpuFeatures {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CpuFeatures({self})")
    }
}

impl fmt::Display for CpuFeatures {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names = self.names();
        if names.is_empty() {
            f.write_str("none")
        } else {
            f.write_str(&names.join(" "))
        }
    }
}

#[cfg(test)]
mod tests {
    use std::ffi::OsStr;

    use super::*;

    #[test]
    fn wire_bits_are_fixed() {
        assert_eq!(CpuFeatures::HW_AES, 1);
        assert_eq!(CpuFeatures::CLMUL, 2);
        assert_eq!(CpuFeatures::VAES, 4);
        assert_eq!(CpuFeatures::VPCLMULQDQ, 8);
        assert_eq!(CpuFeatures::AVX512F, 16);
        assert_eq!(CpuFeatures::AVX2, 32);
    }

    #[test]
    fn unknown_bits_are_ignored() {
        let f = CpuFeatures::from_bits(0xffff_ffff);
        assert_eq!(f.to_bits(), 0b11_1111);
        assert!(f.has_fast_aes_gcm());
        assert_eq!(CpuFeatures::from_bits(1 << 6), CpuFeatures::NONE);
        assert_eq!(
            CpuFeatures::from_bits(0b11 | 1 << 31).to_bits(),
            0b11,
            "known bits survive next to unknown ones"
        );
    }

    #[test]
    fn without_hw_aes_clears_aes_and_vaes_only() {
        let all = CpuFeatures::from_bits(CpuFeatures::KNOWN);
        let f = all.without_hw_aes();
        assert!(!f.has_hw_aes());
        assert!(!f.contains(CpuFeatures::VAES));
        assert!(!f.has_fast_aes_gcm());
        assert!(f.has_clmul());
        assert!(f.contains(CpuFeatures::AVX2 | CpuFeatures::AVX512F | CpuFeatures::VPCLMULQDQ));
    }

    #[test]
    fn env_switch_only_accepts_one() {
        assert!(env_disables_hw_aes(Some(OsStr::new("1"))));
        assert!(!env_disables_hw_aes(Some(OsStr::new("0"))));
        assert!(!env_disables_hw_aes(Some(OsStr::new(""))));
        assert!(!env_disables_hw_aes(None));
    }

    #[test]
    fn probe_is_cached_and_consistent_with_detect() {
        let a = CpuFeatures::probe();
        assert_eq!(a, CpuFeatures::probe());
        let hw = CpuFeatures::detect();
        assert!(a == hw || a == hw.without_hw_aes());
    }

    #[test]
    fn display_names_bits() {
        assert_eq!(CpuFeatures::NONE.to_string(), "none");
        assert_eq!(CpuFeatures::from_bits(0b11).to_string(), "aes clmul");
    }
}
