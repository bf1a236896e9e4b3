//! Known-answer tests: RFC 8439 §2.8.2 for ChaCha20-Poly1305 and the McGrew-Viega GCM test
//! cases (the ones NIST's GCM specification cites) for AES-128-GCM and AES-256-GCM, run
//! against every provider built in.

use fastcp_crypto::{AeadExt, CipherSuite, Error, Provider, Tag, new_aead};

struct Vector {
    name: &'static str,
    suite: CipherSuite,
    key: &'static str,
    nonce: &'static str,
    aad: &'static str,
    plaintext: &'static str,
    ciphertext: &'static str,
    tag: &'static str,
}

const GCM_KEY: &str = "feffe9928665731c6d6a8f9467308308";
const GCM_NONCE: &str = "cafebabefacedbaddecaf888";
const GCM_AAD: &str = "feedfacedeadbeeffeedfacedeadbeefabaddad2";
const GCM_PT: &str = "d9313225f88406e5a55909c5aff5269a86a7a9531534f7da2e4c303d8a318a72\
                      1c3c0c95956809532fcf0e2449a6b525b16aedf5aa0de657ba637b391aafd255";
const GCM_PT60: &str = "d9313225f88406e5a55909c5aff5269a86a7a9531534f7da2e4c303d8a318a72\
                        1c3c0c95956809532fcf0e2449a6b525b16aedf5aa0de657ba637b39";

const VECTORS: &[Vector] = &[
    Vector {
        name: "GCM test case 2 (AES-128, zero key)",
        suite: CipherSuite::Aes128Gcm,
        key: "00000000000000000000000000000000",
        nonce: "000000000000000000000000",
        aad: "",
        plaintext: "00000000000000000000000000000000",
        ciphertext: "0388dace60b6a392f328c2b971b2fe78",
        tag: "ab6e47d42cec13bdf53a67b21257bddf",
    },
    Vector {
        name: "GCM test case 3 (AES-128)",
        suite: CipherSuite::Aes128Gcm,
        key: GCM_KEY,
        nonce: GCM_NONCE,
        aad: "",
        plaintext: GCM_PT,
        ciphertext: "42831ec2217774244b7221b784d0d49ce3aa212f2c02a4e035c17e2329aca12e\
                     21d514b25466931c7d8f6a5aac84aa051ba30b396a0aac973d58e091473f5985",
        tag: "4d5c2af327cd64a62cf35abd2ba6fab4",
    },
    Vector {
        name: "GCM test case 4 (AES-128, with AAD)",
        suite: CipherSuite::Aes128Gcm,
        key: GCM_KEY,
        nonce: GCM_NONCE,
        aad: GCM_AAD,
        plaintext: GCM_PT60,
        ciphertext: "42831ec2217774244b7221b784d0d49ce3aa212f2c02a4e035c17e2329aca12e\
                     21d514b25466931c7d8f6a5aac84aa051ba30b396a0aac973d58e091",
        tag: "5bc94fbc3221a5db94fae95ae7121a47",
    },
    Vector {
        name: "GCM test case 14 (AES-256, zero key)",
        suite: CipherSuite::Aes256Gcm,
        key: "0000000000000000000000000000000000000000000000000000000000000000",
        nonce: "000000000000000000000000",
        aad: "",
        plaintext: "00000000000000000000000000000000",
        ciphertext: "cea7403d4d606b6e074ec5d3baf39d18",
        tag: "d0d1c8a799996bf0265b98b5d48ab919",
    },
    Vector {
        name: "GCM test case 15 (AES-256)",
        suite: CipherSuite::Aes256Gcm,
        key: "feffe9928665731c6d6a8f9467308308feffe9928665731c6d6a8f9467308308",
        nonce: GCM_NONCE,
        aad: "",
        plaintext: GCM_PT,
        ciphertext: "522dc1f099567d07f47f37a32a84427d643a8cdcbfe5c0c97598a2bd2555d1aa\
                     8cb08e48590dbb3da7b08b1056828838c5f61e6393ba7a0abcc9f662898015ad",
        tag: "b094dac5d93471bdec1a502270e3cc6c",
    },
    Vector {
        name: "GCM test case 16 (AES-256, with AAD)",
        suite: CipherSuite::Aes256Gcm,
        key: "feffe9928665731c6d6a8f9467308308feffe9928665731c6d6a8f9467308308",
        nonce: GCM_NONCE,
        aad: GCM_AAD,
        plaintext: GCM_PT60,
        ciphertext: "522dc1f099567d07f47f37a32a84427d643a8cdcbfe5c0c97598a2bd2555d1aa\
                     8cb08e48590dbb3da7b08b1056828838c5f61e6393ba7a0abcc9f662",
        tag: "76fc6ece0f4e1768cddf8853bb2d551b",
    },
    Vector {
        name: "RFC 8439 section 2.8.2 (ChaCha20-Poly1305)",
        suite: CipherSuite::ChaCha20Poly1305,
        key: "808182838485868788898a8b8c8d8e8f909192939495969798999a9b9c9d9e9f",
        nonce: "070000004041424344454647",
        aad: "50515253c0c1c2c3c4c5c6c7",
        // "Ladies and Gentlemen of the class of '99: If I could offer you only one tip for
        // the future, sunscreen would be it."
        plaintext: "4c616469657320616e642047656e746c656d656e206f662074686520636c6173\
                    73206f66202739393a204966204920636f756c64206f6666657220796f75206f\
                    6e6c79206f6e652074697020666f7220746865206675747572652c2073756e73\
                    637265656e20776f756c642062652069742e",
        ciphertext: "d31a8d34648e60db7b86afbc53ef7ec2a4aded51296e08fea9e2b5a736ee62d6\
                     3dbea45e8ca9671282fafb69da92728b1a71de0a9e060b2905d6a5b67ecd3b36\
                     92ddbd7f2d778b8c9803aee328091b58fab324e4fad675945585808b4831d7bc\
                     3ff4def08e4b7a9de576d26586cec64b6116",
        tag: "1ae10b594f09e26a7e902ecbd0600691",
    },
];

fn hex(s: &str) -> Vec<u8> {
    let s: String = s.chars().filter(|c| !c.is_whitespace()).collect();
    assert!(s.len().is_multiple_of(2), "odd hex length");
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

/// Splits a 12-byte vector nonce into (iv, seq) so that `iv XOR (0 || seq)` gives it back:
/// either the whole nonce as IV with seq 0, or the first 4 bytes as IV and the last 8 as seq.
fn nonce_forms(nonce: &[u8]) -> [([u8; 12], u64); 2] {
    let whole: [u8; 12] = nonce.try_into().unwrap();
    let mut prefix = [0u8; 12];
    prefix[..4].copy_from_slice(&nonce[..4]);
    let seq = u64::from_be_bytes(nonce[4..].try_into().unwrap());
    [(whole, 0), (prefix, seq)]
}

#[test]
fn every_provider_matches_every_vector() {
    let mut checked = 0;
    for &provider in Provider::available() {
        for v in VECTORS {
            for (iv, seq) in nonce_forms(&hex(v.nonce)) {
                let ctx = format!("{} with {provider}, seq {seq:#x}", v.name);
                let aead = new_aead(provider, v.suite, &hex(v.key), &iv).unwrap();
                let aad = hex(v.aad);

                let mut buf = hex(v.plaintext);
                let tag = aead.seal_in_place(seq, &aad, &mut buf).unwrap();
                assert_eq!(buf, hex(v.ciphertext), "ciphertext: {ctx}");
                assert_eq!(tag.to_vec(), hex(v.tag), "tag: {ctx}");

                aead.open_in_place(seq, &aad, &mut buf, &tag).unwrap();
                assert_eq!(buf, hex(v.plaintext), "plaintext: {ctx}");

                let mut record = hex(v.ciphertext);
                record.extend_from_slice(&hex(v.tag));
                let opened = aead.open_trailing(seq, &aad, &mut record).unwrap();
                assert_eq!(opened, &hex(v.plaintext)[..], "open_trailing: {ctx}");
                checked += 1;
            }
        }
    }
    assert_eq!(checked, Provider::available().len() * VECTORS.len() * 2);
}

#[test]
fn every_provider_rejects_a_flipped_bit_in_each_part_of_a_vector() {
    for &provider in Provider::available() {
        for v in VECTORS {
            let aead = new_aead(
                provider,
                v.suite,
                &hex(v.key),
                &hex(v.nonce).try_into().unwrap(),
            )
            .unwrap();
            let aad = hex(v.aad);
            let ct = hex(v.ciphertext);
            let tag: Tag = hex(v.tag).try_into().unwrap();

            let mut bad_tag = tag;
            bad_tag[15] ^= 1;
            let mut buf = ct.clone();
            let r = aead.open_in_place(0, &aad, &mut buf, &bad_tag);
            assert!(
                matches!(r, Err(Error::Open)),
                "{} / {provider}: tag",
                v.name
            );

            if !ct.is_empty() {
                let mut buf = ct.clone();
                buf[0] ^= 0x80;
                let r = aead.open_in_place(0, &aad, &mut buf, &tag);
                assert!(
                    matches!(r, Err(Error::Open)),
                    "{} / {provider}: body",
                    v.name
                );
            }

            let mut other_aad = aad.clone();
            other_aad.push(0);
            let mut buf = ct.clone();
            let r = aead.open_in_place(0, &other_aad, &mut buf, &tag);
            assert!(
                matches!(r, Err(Error::Open)),
                "{} / {provider}: aad",
                v.name
            );

            let mut buf = ct.clone();
            let r = aead.open_in_place(1, &aad, &mut buf, &tag);
            assert!(
                matches!(r, Err(Error::Open)),
                "{} / {provider}: seq",
                v.name
            );
        }
    }
}
