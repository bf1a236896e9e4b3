//! Picking the suite and provider for a session from both ends' CPUs.
//!
//! The receiver decrypts every byte the sender encrypts, so the slower end sets the pace:
//! AES-GCM is picked only when both ends have hardware AES and carry-less multiply;
//! otherwise ChaCha20-Poly1305, which is fast in plain vector code everywhere. A user's
//! `--cipher` wins over both. AES-128 is preferred over AES-256: it is about 30% faster
//! (fewer rounds) and 128-bit keys are ample for session keys that live minutes.

use std::fmt;

use crate::{CipherSuite, CpuFeatures, Provider};

/// Why [`choose`] picked what it picked.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Reason {
    /// The user asked for this suite.
    UserPreference,
    /// Both ends have hardware AES and carry-less multiply.
    BothHaveHwAes,
    /// This end lacks hardware AES or carry-less multiply; the peer has them.
    LocalLacksHwAes,
    /// The peer lacks hardware AES or carry-less multiply; this end has them.
    PeerLacksHwAes,
    /// Neither end has hardware AES with carry-less multiply.
    NeitherHasHwAes,
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Reason::UserPreference => "chosen with --cipher",
            Reason::BothHaveHwAes => "both ends have hardware AES and carry-less multiply",
            Reason::LocalLacksHwAes => {
                "this machine lacks hardware AES-GCM support, and software AES is slower than ChaCha20"
            }
            Reason::PeerLacksHwAes => {
                "the peer lacks hardware AES-GCM support, and it must decrypt (or encrypt) every byte too"
            }
            Reason::NeitherHasHwAes => "neither end has hardware AES-GCM support",
        })
    }
}

/// The outcome of [`choose`]: the suite, the provider to run it with, and why.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Choice {
    /// The suite both ends will use.
    pub suite: CipherSuite,
    /// The provider this end will use (the fastest one built in for the suite).
    pub provider: Provider,
    /// Why.
    pub reason: Reason,
}

impl fmt::Display for Choice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} via {}: {}", self.suite, self.provider, self.reason)
    }
}

/// Picks the suite for a session from this end's and the peer's CPU features, unless the
/// user named one.
///
/// A pure function: both ends can run it on the same inputs and agree. The provider is a
/// local matter (it does not change the bytes on the wire) and is
/// [`Provider::fastest_for`] the suite.
///
/// ```
/// use fastcp_crypto::{choose, CipherSuite, CpuFeatures, Reason};
///
/// let aes = CpuFeatures::from_bits(CpuFeatures::HW_AES | CpuFeatures::CLMUL);
/// assert_eq!(choose(aes, aes, None).suite, CipherSuite::Aes128Gcm);
///
/// let c = choose(aes, CpuFeatures::NONE, None);
/// assert_eq!(c.suite, CipherSuite::ChaCha20Poly1305);
/// assert_eq!(c.reason, Reason::PeerLacksHwAes);
///
/// let c = choose(aes, aes, Some(CipherSuite::Aes256Gcm));
/// assert_eq!((c.suite, c.reason), (CipherSuite::Aes256Gcm, Reason::UserPreference));
/// ```
pub fn choose(local: CpuFeatures, peer: CpuFeatures, preference: Option<CipherSuite>) -> Choice {
    let (suite, reason) = match (
        preference,
        local.has_fast_aes_gcm(),
        peer.has_fast_aes_gcm(),
    ) {
        (Some(suite), _, _) => (suite, Reason::UserPreference),
        (None, true, true) => (CipherSuite::Aes128Gcm, Reason::BothHaveHwAes),
        (None, false, true) => (CipherSuite::ChaCha20Poly1305, Reason::LocalLacksHwAes),
        (None, true, false) => (CipherSuite::ChaCha20Poly1305, Reason::PeerLacksHwAes),
        (None, false, false) => (CipherSuite::ChaCha20Poly1305, Reason::NeitherHasHwAes),
    };
    Choice {
        suite,
        provider: Provider::fastest_for(suite),
        reason,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FULL: u32 = CpuFeatures::KNOWN;
    const AES_ONLY: u32 = CpuFeatures::HW_AES;
    const CLMUL_ONLY: u32 = CpuFeatures::CLMUL;
    const AES_CLMUL: u32 = CpuFeatures::HW_AES | CpuFeatures::CLMUL;

    fn f(bits: u32) -> CpuFeatures {
        CpuFeatures::from_bits(bits)
    }

    /// Every pair of feature sets (including partial ones) times every preference.
    #[test]
    fn every_combination() {
        let sets = [0, AES_ONLY, CLMUL_ONLY, AES_CLMUL, FULL];
        let prefs = [
            None,
            Some(CipherSuite::Aes128Gcm),
            Some(CipherSuite::Aes256Gcm),
            Some(CipherSuite::ChaCha20Poly1305),
        ];
        let mut seen = 0;
        for &l in &sets {
            for &p in &sets {
                let fast = |b: u32| b & AES_CLMUL == AES_CLMUL;
                for pref in prefs {
                    let c = choose(f(l), f(p), pref);
                    let (suite, reason) = match pref {
                        Some(s) => (s, Reason::UserPreference),
                        None => match (fast(l), fast(p)) {
                            (true, true) => (CipherSuite::Aes128Gcm, Reason::BothHaveHwAes),
                            (false, true) => {
                                (CipherSuite::ChaCha20Poly1305, Reason::LocalLacksHwAes)
                            }
                            (true, false) => {
                                (CipherSuite::ChaCha20Poly1305, Reason::PeerLacksHwAes)
                            }
                            (false, false) => {
                                (CipherSuite::ChaCha20Poly1305, Reason::NeitherHasHwAes)
                            }
                        },
                    };
                    assert_eq!(
                        (c.suite, c.reason),
                        (suite, reason),
                        "{l:#b} {p:#b} {pref:?}"
                    );
                    assert_eq!(c.provider, Provider::fastest_for(suite));
                    assert!(c.provider.is_available());
                    seen += 1;
                }
            }
        }
        assert_eq!(seen, 5 * 5 * 4);
    }

    #[test]
    fn hw_aes_on_both_ends_gives_aes_gcm() {
        let c = choose(f(FULL), f(AES_CLMUL), None);
        assert_eq!(c.suite, CipherSuite::Aes128Gcm);
        assert_eq!(c.reason, Reason::BothHaveHwAes);
    }

    #[test]
    fn no_hw_aes_on_either_end_gives_chacha() {
        assert_eq!(
            choose(f(0), f(FULL), None).suite,
            CipherSuite::ChaCha20Poly1305
        );
        assert_eq!(
            choose(f(FULL), f(0), None).suite,
            CipherSuite::ChaCha20Poly1305
        );
        assert_eq!(
            choose(f(0), f(0), None).suite,
            CipherSuite::ChaCha20Poly1305
        );
    }

    #[test]
    fn aes_without_clmul_is_not_enough() {
        let c = choose(f(AES_ONLY), f(FULL), None);
        assert_eq!(c.suite, CipherSuite::ChaCha20Poly1305);
        assert_eq!(c.reason, Reason::LocalLacksHwAes);
    }

    #[test]
    fn env_switch_turns_aes_peer_into_chacha() {
        let here = f(FULL).without_hw_aes();
        assert_eq!(
            choose(here, f(FULL), None).suite,
            CipherSuite::ChaCha20Poly1305
        );
    }

    #[test]
    fn preference_overrides_cpu() {
        for s in CipherSuite::ALL {
            for (l, p) in [(0, 0), (FULL, FULL), (FULL, 0), (0, FULL)] {
                let c = choose(f(l), f(p), Some(s));
                assert_eq!(c.suite, s);
                assert_eq!(c.reason, Reason::UserPreference);
            }
        }
    }

    #[test]
    fn display_says_what_and_why() {
        let c = choose(f(FULL), f(0), None);
        let s = c.to_string();
        assert!(s.starts_with("chacha20-poly1305 via "), "{s}");
        assert!(s.contains("peer lacks hardware AES"), "{s}");
    }
}
