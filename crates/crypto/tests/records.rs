//! Records through `Sealer` / `Opener`: every way a record can go wrong is refused, every
//! provider agrees, keys are per stream and direction, and rekeying and the hard stop work.

use fastcp_crypto::{
    Aead, AeadExt, CipherSuite, CpuFeatures, Direction, Error, KeyConfig, KeyLimits, Opener,
    Provider, Sealer, SessionSecret, choose, new_aead,
};

/// A small deterministic generator (splitmix64), so failures reproduce.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next() as u8).collect()
    }
}

fn secret(seed: u8) -> SessionSecret {
    SessionSecret::from_bytes([seed; 32])
}

/// Every suite and provider built in, as configs.
fn configs() -> Vec<KeyConfig> {
    let mut out = Vec::new();
    for suite in CipherSuite::ALL {
        for &provider in Provider::available() {
            out.push(KeyConfig::new(suite, provider));
        }
    }
    out
}

fn pair(config: &KeyConfig) -> (Sealer, Opener) {
    let s = secret(1);
    (
        s.sealer(config, Direction::ClientToServer, 0).unwrap(),
        s.opener(config, Direction::ClientToServer, 0).unwrap(),
    )
}

fn sealed(sealer: &mut Sealer, aad: &[u8], plaintext: &[u8]) -> Vec<u8> {
    let mut buf = plaintext.to_vec();
    sealer.seal_record(aad, &mut buf).unwrap();
    buf
}

#[test]
fn records_of_every_size_round_trip() {
    for config in configs() {
        let (mut tx, mut rx) = pair(&config);
        for len in [0, 1, 15, 16, 17, 255, 4096, 65_536 + 3] {
            let plain: Vec<u8> = (0..len).map(|i| (i * 7) as u8).collect();
            let mut rec = sealed(&mut tx, b"hdr", &plain);
            assert_eq!(rec.len(), len + tx.tag_len());
            if len >= 16 {
                assert_ne!(&rec[..len], &plain[..], "{config:?} left plaintext");
            }
            let out = rx.open_record(b"hdr", &mut rec).unwrap();
            assert_eq!(out, &plain[..], "{config:?} len {len}");
        }
        assert_eq!(tx.next_seq(), 8);
        assert_eq!(rx.next_seq(), 8);
    }
}

#[test]
fn tampered_byte_fails_and_poisons() {
    for config in configs() {
        let plain = b"a record worth protecting, longer than one block";
        for pos in [0, 17, plain.len() - 1, plain.len(), plain.len() + 15] {
            let (mut tx, mut rx) = pair(&config);
            let mut rec = sealed(&mut tx, b"hdr", plain);
            rec[pos] ^= 0x01;
            let r = rx.open_record(b"hdr", &mut rec);
            assert!(matches!(r, Err(Error::Open)), "{config:?} pos {pos}: {r:?}");
            assert!(rx.is_poisoned());
            // The next, genuine record is refused too.
            let mut next = sealed(&mut tx, b"hdr", plain);
            assert!(matches!(
                rx.open_record(b"hdr", &mut next),
                Err(Error::Poisoned)
            ));
        }
    }
}

#[test]
fn tampered_aad_fails() {
    for config in configs() {
        let (mut tx, mut rx) = pair(&config);
        let mut rec = sealed(&mut tx, b"hdr 1", b"payload");
        assert!(matches!(
            rx.open_record(b"hdr 2", &mut rec),
            Err(Error::Open)
        ));
    }
}

#[test]
fn truncated_record_fails() {
    for config in configs() {
        // One byte short: the tag no longer lines up.
        let (mut tx, mut rx) = pair(&config);
        let mut rec = sealed(&mut tx, b"", b"some plaintext bytes");
        rec.pop();
        assert!(matches!(rx.open_record(b"", &mut rec), Err(Error::Open)));

        // Shorter than a tag.
        let (mut tx, mut rx) = pair(&config);
        let rec = sealed(&mut tx, b"", b"some plaintext bytes");
        let mut short = rec[..10].to_vec();
        let r = rx.open_record(b"", &mut short);
        assert!(
            matches!(
                r,
                Err(Error::Truncated {
                    len: 10,
                    tag_len: 16
                })
            ),
            "{r:?}"
        );
        assert!(rx.is_poisoned());

        // Only the tag, body cut off.
        let (mut tx, mut rx) = pair(&config);
        let rec = sealed(&mut tx, b"", b"some plaintext bytes");
        let mut tail = rec[rec.len() - 16..].to_vec();
        assert!(matches!(rx.open_record(b"", &mut tail), Err(Error::Open)));
    }
}

#[test]
fn reordered_records_fail() {
    for config in configs() {
        let (mut tx, mut rx) = pair(&config);
        let _first = sealed(&mut tx, b"", b"first");
        let mut second = sealed(&mut tx, b"", b"second");
        assert!(matches!(rx.open_record(b"", &mut second), Err(Error::Open)));
    }
}

#[test]
fn replayed_record_fails() {
    for config in configs() {
        let (mut tx, mut rx) = pair(&config);
        let rec = sealed(&mut tx, b"", b"pay me once");
        let mut copy = rec.clone();
        rx.open_record(b"", &mut copy).unwrap();
        let mut again = rec.clone();
        assert!(matches!(rx.open_record(b"", &mut again), Err(Error::Open)));
    }
}

#[test]
fn dropped_record_fails_the_next_one() {
    for config in configs() {
        let (mut tx, mut rx) = pair(&config);
        let mut a = sealed(&mut tx, b"", b"a");
        let _lost = sealed(&mut tx, b"", b"b");
        let mut c = sealed(&mut tx, b"", b"c");
        rx.open_record(b"", &mut a).unwrap();
        assert!(matches!(rx.open_record(b"", &mut c), Err(Error::Open)));
    }
}

#[test]
fn wrong_key_fails() {
    for config in configs() {
        let mut tx = secret(1)
            .sealer(&config, Direction::ClientToServer, 3)
            .unwrap();
        let rec = sealed(&mut tx, b"", b"for stream 3, client to server");
        let wrong: Vec<(&str, Opener)> = vec![
            (
                "other secret",
                secret(2)
                    .opener(&config, Direction::ClientToServer, 3)
                    .unwrap(),
            ),
            (
                "other stream",
                secret(1)
                    .opener(&config, Direction::ClientToServer, 4)
                    .unwrap(),
            ),
            (
                "other direction",
                secret(1)
                    .opener(&config, Direction::ServerToClient, 3)
                    .unwrap(),
            ),
        ];
        for (what, mut rx) in wrong {
            let mut buf = rec.clone();
            assert!(
                matches!(rx.open_record(b"", &mut buf), Err(Error::Open)),
                "{config:?}: {what}"
            );
        }
        let mut right = secret(1)
            .opener(&config, Direction::ClientToServer, 3)
            .unwrap();
        let mut buf = rec.clone();
        right.open_record(b"", &mut buf).unwrap();
    }
}

#[test]
fn other_suite_same_secret_fails() {
    let a = KeyConfig::new(CipherSuite::Aes256Gcm, Provider::Ring);
    let b = KeyConfig::new(CipherSuite::ChaCha20Poly1305, Provider::Ring);
    let mut tx = secret(1).sealer(&a, Direction::ClientToServer, 0).unwrap();
    let mut rx = secret(1).opener(&b, Direction::ClientToServer, 0).unwrap();
    let mut rec = sealed(&mut tx, b"", b"suite mismatch");
    assert!(matches!(rx.open_record(b"", &mut rec), Err(Error::Open)));
}

#[test]
fn all_providers_agree_byte_for_byte_on_random_inputs() {
    let mut rng = Rng(0x5eed_fa57_c0de);
    for round in 0..200 {
        let suite = CipherSuite::ALL[round % 3];
        let key = rng.bytes(suite.key_len());
        let iv: [u8; 12] = rng.bytes(12).try_into().unwrap();
        let seq = rng.next();
        let aad_len = (rng.next() % 40) as usize;
        let aad = rng.bytes(aad_len);
        let len = match round % 4 {
            0 => (rng.next() % 64) as usize,
            1 => (rng.next() % 4096) as usize,
            2 => 16 * (rng.next() % 100) as usize,
            _ => 65_536 + (rng.next() % 64) as usize,
        };
        let plain = rng.bytes(len);

        let aeads: Vec<Box<dyn Aead>> = Provider::available()
            .iter()
            .map(|&p| new_aead(p, suite, &key, &iv).unwrap())
            .collect();
        let records: Vec<Vec<u8>> = aeads
            .iter()
            .map(|a| {
                let mut buf = plain.clone();
                a.seal_append(seq, &aad, &mut buf).unwrap();
                buf
            })
            .collect();
        for (a, r) in aeads.iter().zip(&records) {
            assert_eq!(
                r, &records[0],
                "round {round}: {a:?} disagrees with {:?}",
                aeads[0]
            );
        }
        // Each provider opens what the others sealed.
        for a in &aeads {
            for r in &records {
                let mut buf = r.clone();
                assert_eq!(a.open_trailing(seq, &aad, &mut buf).unwrap(), &plain[..]);
            }
        }
    }
}

#[test]
fn each_end_may_use_its_own_provider() {
    for suite in CipherSuite::ALL {
        for &p in Provider::available() {
            for &q in Provider::available() {
                let s = secret(9);
                let mut tx = s
                    .sealer(&KeyConfig::new(suite, p), Direction::ServerToClient, 1)
                    .unwrap();
                let mut rx = s
                    .opener(&KeyConfig::new(suite, q), Direction::ServerToClient, 1)
                    .unwrap();
                for i in 0..5u8 {
                    let mut rec = sealed(&mut tx, &[i], &[i; 100]);
                    assert_eq!(rx.open_record(&[i], &mut rec).unwrap(), &[i; 100]);
                }
            }
        }
    }
}

/// The key schedule pinned against an independent implementation (Python's `hmac` and
/// `cryptography` packages computing the HKDF labels in the module docs by hand).
#[test]
fn key_schedule_matches_independent_computation() {
    let s = SessionSecret::from_bytes(std::array::from_fn(|i| i as u8));
    let hex = |b: &[u8]| b.iter().map(|x| format!("{x:02x}")).collect::<String>();
    for &provider in Provider::available() {
        let mut config = KeyConfig::new(CipherSuite::Aes128Gcm, provider);
        config.limits.rekey_after_records = 2;
        let mut tx = s.sealer(&config, Direction::ClientToServer, 3).unwrap();
        let got: Vec<String> = (0..3)
            .map(|_| hex(&sealed(&mut tx, b"hdr", b"fastcp")))
            .collect();
        assert_eq!(
            got,
            [
                "5a2df8aa82f3cd45847349b0f47ae65c55c78298c9c1",
                "a3cd020552a4847ad77752344b3ee3b3a8f2712c0385",
                "32264beef35b628c2da8b9cd9977f1d0ed7a53b2c38b",
            ],
            "{provider}"
        );
        assert_eq!(tx.epoch(), 1);

        for (suite, want) in [
            (
                CipherSuite::ChaCha20Poly1305,
                "e0882cecd289caaa839a867368fd755153369a48b373",
            ),
            (
                CipherSuite::Aes256Gcm,
                "95927b314f7d1c931a472237933500c08fdf713147c9",
            ),
        ] {
            let mut tx = s
                .sealer(
                    &KeyConfig::new(suite, provider),
                    Direction::ServerToClient,
                    0,
                )
                .unwrap();
            assert_eq!(
                hex(&sealed(&mut tx, b"", b"fastcp")),
                want,
                "{suite} {provider}"
            );
        }
    }
}

#[test]
fn rekey_by_record_count_stays_in_step() {
    for mut config in configs() {
        config.limits.rekey_after_records = 3;
        let (mut tx, mut rx) = pair(&config);
        let (mut plain_tx, _) = pair(&KeyConfig::new(config.suite, config.provider));
        for i in 0..10u8 {
            let mut rec = sealed(&mut tx, b"", &[i; 33]);
            let unrekeyed = sealed(&mut plain_tx, b"", &[i; 33]);
            if i < 3 {
                assert_eq!(rec, unrekeyed, "first epoch uses the initial key");
            } else {
                assert_ne!(rec, unrekeyed, "record {i} must be under a new key");
            }
            assert_eq!(rx.open_record(b"", &mut rec).unwrap(), &[i; 33]);
        }
        assert_eq!(tx.epoch(), 3);
        assert_eq!(rx.epoch(), 3);
        assert_eq!(tx.next_seq(), 10);
    }
}

#[test]
fn rekey_by_bytes_stays_in_step() {
    let mut config = KeyConfig::new(CipherSuite::Aes128Gcm, Provider::Ring);
    config.limits.rekey_after_bytes = 100;
    let (mut tx, mut rx) = pair(&config);
    let mut epochs = Vec::new();
    for _ in 0..5 {
        let mut rec = sealed(&mut tx, b"", &[7; 40]);
        rx.open_record(b"", &mut rec).unwrap();
        epochs.push(tx.epoch());
        assert_eq!(tx.epoch(), rx.epoch());
    }
    // 40 + 40 fit under 100 bytes; a third record would not, so it opens a new epoch.
    assert_eq!(epochs, [0, 0, 1, 1, 2]);

    // A record bigger than the whole budget still goes out, one per epoch.
    let mut big = sealed(&mut tx, b"", &[1; 500]);
    rx.open_record(b"", &mut big).unwrap();
    let mut big2 = sealed(&mut tx, b"", &[2; 500]);
    rx.open_record(b"", &mut big2).unwrap();
    assert_eq!(tx.epoch(), 4);
}

#[test]
fn mismatched_limits_fail_at_the_first_rekey() {
    let mut fast = KeyConfig::new(CipherSuite::ChaCha20Poly1305, Provider::RustCrypto);
    fast.limits.rekey_after_records = 2;
    let slow = KeyConfig::new(CipherSuite::ChaCha20Poly1305, Provider::RustCrypto);
    let s = secret(5);
    let mut tx = s.sealer(&fast, Direction::ClientToServer, 0).unwrap();
    let mut rx = s.opener(&slow, Direction::ClientToServer, 0).unwrap();
    for _ in 0..2 {
        let mut rec = sealed(&mut tx, b"", b"x");
        rx.open_record(b"", &mut rec).unwrap();
    }
    let mut rec = sealed(&mut tx, b"", b"x");
    assert!(matches!(rx.open_record(b"", &mut rec), Err(Error::Open)));
}

#[test]
fn sealer_stops_at_the_record_limit() {
    for mut config in configs() {
        config.limits.max_records = 5;
        let (mut tx, mut rx) = pair(&config);
        for _ in 0..5 {
            let mut rec = sealed(&mut tx, b"", b"ok");
            rx.open_record(b"", &mut rec).unwrap();
        }
        let mut buf = b"one too many".to_vec();
        let r = tx.seal_record(b"", &mut buf);
        assert!(matches!(r, Err(Error::RecordLimit { limit: 5 })), "{r:?}");
        assert_eq!(buf, b"one too many", "nothing sealed");
        assert!(tx.seal_record(b"", &mut buf).is_err(), "still stopped");
        assert_eq!(tx.next_seq(), 5);
    }
}

#[test]
fn default_limits_are_the_documented_ones() {
    let l = KeyLimits::default();
    assert_eq!(l.rekey_after_records, 1 << 32);
    assert_eq!(l.rekey_after_bytes, 1 << 36);
    assert_eq!(l.max_records, 1 << 40);
}

#[test]
fn detached_tags_work_like_records() {
    for config in configs() {
        let (mut tx, mut rx) = pair(&config);
        let mut buf = *b"detached tag payload";
        let tag = tx.seal_in_place(b"a", &mut buf).unwrap();
        rx.open_in_place(b"a", &mut buf, &tag).unwrap();
        assert_eq!(&buf, b"detached tag payload");
    }
}

#[test]
fn generated_secrets_differ_and_debug_hides_them() {
    let a = SessionSecret::generate().unwrap();
    let b = SessionSecret::generate().unwrap();
    assert_ne!(a.as_bytes(), b.as_bytes());
    let shown = format!("{a:?}");
    assert_eq!(shown, "SessionSecret(..)");
}

#[test]
fn config_from_choice_keeps_suite_and_provider() {
    let c = choose(CpuFeatures::NONE, CpuFeatures::NONE, None);
    let k = KeyConfig::from(c);
    assert_eq!((k.suite, k.provider), (c.suite, c.provider));
    assert_eq!(k.limits, KeyLimits::default());
}

#[test]
fn public_types_are_send_and_sync() {
    fn send_sync<T: Send + Sync>() {}
    send_sync::<Sealer>();
    send_sync::<Opener>();
    send_sync::<SessionSecret>();
    send_sync::<Box<dyn Aead>>();
    send_sync::<Error>();
}

/// Nonces are unique per key, per direction and per stream, across rekeys: a (key, nonce)
/// pair used twice would seal the same plaintext to the same bytes (the keystream and the
/// tag depend on nothing else), so identical plaintexts sealed on 8 streams, both
/// directions, 64 records each over four key epochs, must all differ, in every suite.
#[test]
fn no_two_records_share_a_key_and_nonce() {
    use std::collections::HashSet;
    for mut config in configs() {
        config.limits.rekey_after_records = 16;
        let s = secret(7);
        let mut seen = HashSet::new();
        let mut count = 0;
        for direction in [Direction::ClientToServer, Direction::ServerToClient] {
            for stream in 0..8 {
                let mut sealer = s.sealer(&config, direction, stream).unwrap();
                for _ in 0..64 {
                    let record = sealed(&mut sealer, b"", &[0u8; 32]);
                    count += 1;
                    assert!(
                        seen.insert(record),
                        "{config:?}: a record repeated (stream {stream}, {direction:?}, seq {})",
                        sealer.next_seq() - 1
                    );
                }
                assert!(sealer.epoch() >= 3, "the test must cross rekeys");
            }
        }
        assert_eq!(seen.len(), count);
    }
}
