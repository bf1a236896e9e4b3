//! What each of fastcp's fuzz targets checks, as plain functions of a byte string.
//!
//! The cargo-fuzz targets in `fuzz/` call these, and `tests/corpus.rs` replays every input
//! of `fuzz/corpus/<target>/` through them as an ordinary test, so a regression found once
//! fails CI without a nightly toolchain. Each function must return normally for every input:
//! a panic is a bug, whether it is an assertion here or a crash in fastcp.
//!
//! ```
//! fastcp_fuzz_harness::decoder(b"\x13\x00\x00\x00\x08garbage!");
//! fastcp_fuzz_harness::path(b"a/../b");
//! ```
#![deny(missing_docs)]

use std::sync::Arc;

use bytes::BytesMut;
use fastcp_proto::{Decoder, Frame, Handshake, Hello};
use tokio::io::AsyncReadExt;

/// A target's checks on one input.
pub type Check = fn(&[u8]);

/// Every fuzz target by name, for the replay test.
pub const TARGETS: &[(&str, Check)] = &[
    ("decoder", decoder),
    ("handshake", handshake),
    ("path", path),
    ("record", record),
    ("sealed", sealed),
    ("receive", receive),
];

/// The frame decoder: bytes arrive in pieces whose sizes come from the input; whatever it
/// decodes re-encodes to a frame that decodes the same, and it never buffers past its cap.
pub fn decoder(data: &[u8]) {
    let Some((&step, data)) = data.split_first() else {
        return;
    };
    let step = usize::from(step).max(1);
    let cap = 64 << 10;
    let mut decoder = Decoder::new(cap);
    let mut buf = BytesMut::new();
    for piece in data.chunks(step) {
        buf.extend_from_slice(piece);
        loop {
            match decoder.decode(&mut buf) {
                Ok(Some(frame)) => round_trip(&frame, cap),
                Ok(None) => break,
                Err(_) => return,
            }
        }
        assert!(
            buf.len() <= cap as usize + fastcp_proto::HEADER_LEN + step,
            "the decoder kept {} bytes with a cap of {cap}",
            buf.len()
        );
    }
}

fn round_trip(frame: &Frame, cap: u32) {
    let mut wire = BytesMut::new();
    fastcp_proto::encode(frame, &mut wire);
    let again = Decoder::new(cap)
        .decode(&mut wire)
        .expect("a decoded frame re-encodes to a valid one")
        .expect("whole");
    assert_eq!(&again, frame, "a frame changed in a round trip");
    assert!(wire.is_empty());
}

/// The handshake: the peer's hello, whatever it holds, is agreed to or refused, never more.
pub fn handshake(data: &[u8]) {
    let local = Hello {
        version: fastcp_proto::PROTOCOL_VERSION,
        min_version: fastcp_proto::MIN_PROTOCOL_VERSION,
        cpu_features: 0,
        ciphers: vec![1, 3],
        compression: Vec::new(),
        max_frame: fastcp_proto::DEFAULT_MAX_FRAME,
        software: "fuzz".into(),
    };
    let handshake = Handshake::new(local);
    let mut buf = BytesMut::from(data);
    if let Ok(Some(agreed)) = handshake.decode_peer_hello(&mut buf) {
        assert!(agreed.version >= fastcp_proto::MIN_PROTOCOL_VERSION);
        assert!(agreed.version <= fastcp_proto::PROTOCOL_VERSION);
        assert!(agreed.max_frame <= fastcp_proto::HARD_MAX_FRAME);
    }
}

/// The path checker: a path it accepts is relative, has no empty, `.` or `..` component and
/// no NUL, and is within the length cap.
pub fn path(data: &[u8]) {
    if fastcp_proto::path::validate(data).is_err() {
        return;
    }
    assert!(!data.is_empty() && data[0] != b'/', "{data:?}");
    assert!(!data.contains(&0), "{data:?}");
    assert!(data.len() <= fastcp_proto::MAX_PATH);
    for c in fastcp_proto::path::components(data) {
        assert!(!c.is_empty() && c != b"." && c != b"..", "{data:?}");
        assert!(!c.contains(&b'/'));
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime")
}

/// The TCP record opener: bytes from the wire, under a key the input does not know, end in
/// an error or a clean end, and never yield plaintext that failed its tag.
pub fn record(data: &[u8]) {
    use fastcp_crypto::{CipherSuite, Direction, KeyConfig, Provider, SessionSecret};
    let secret = SessionSecret::from_bytes([7; 32]);
    let keys = KeyConfig::new(CipherSuite::Aes128Gcm, Provider::Ring);
    let wire = tokio::io::join(data, tokio::io::sink());
    let Ok(mut stream) = fastcp_transport::tcp::SealedStream::new(
        wire,
        &secret,
        &keys,
        Direction::ServerToClient,
        1,
        fastcp_transport::tcp::DEFAULT_RECORD_LEN,
    ) else {
        return;
    };
    let mut out = Vec::new();
    let result = runtime().block_on(stream.read_to_end(&mut out));
    // Without the key no record can be forged: nothing may come out.
    assert!(out.is_empty() || result.is_ok(), "{result:?}");
    assert!(out.is_empty(), "{} bytes passed a forged tag", out.len());
}

/// The TCP record layer under a known key: the input is plaintext pieces that a writer seals
/// into records, then edits an attacker makes to the sealed bytes (flip a byte, drop, repeat
/// or move a span, cut the stream). The untouched stream opens to exactly the plaintext. An
/// edited one opens to a prefix of it and then an error; only bytes edited after the end
/// record may go unnoticed, as they are never read.
///
/// Input: `record_len`, a piece count, then each piece as a length byte and its bytes, then
/// up to eight edits of five bytes each (kind, position, argument).
pub fn sealed(data: &[u8]) {
    use fastcp_crypto::{CipherSuite, Direction, KeyConfig, Provider, SessionSecret};
    use tokio::io::AsyncWriteExt;
    let mut input = data.iter().copied();
    let mut byte = || input.next().unwrap_or(0);
    let record_len = 1 + usize::from(byte() % 32);
    let pieces = byte() % 16;
    let mut plain = Vec::new();
    let mut lengths = Vec::new();
    for _ in 0..pieces {
        let len = usize::from(byte());
        let start = plain.len();
        plain.extend((0..len).map(|_| byte()));
        lengths.push(plain.len() - start);
    }
    let edits: Vec<[u8; 5]> = (0..8)
        .map(|_| [byte(), byte(), byte(), byte(), byte()])
        .take_while(|edit| edit[0] != 0)
        .collect();

    let secret = SessionSecret::from_bytes([7; 32]);
    let keys = KeyConfig::new(CipherSuite::Aes128Gcm, Provider::Ring);
    let runtime = runtime();
    let wire = runtime.block_on(async {
        let sink = tokio::io::join(tokio::io::empty(), Vec::new());
        let mut writer = fastcp_transport::tcp::SealedStream::new(
            sink,
            &secret,
            &keys,
            Direction::ClientToServer,
            1,
            record_len,
        )
        .expect("a writer");
        let mut at = 0;
        for len in lengths {
            writer.write_all(&plain[at..at + len]).await.expect("write");
            writer.flush().await.expect("flush");
            at += len;
        }
        writer.shutdown().await.expect("shutdown");
        writer.get_ref().writer().clone()
    });

    let mut edited = wire.clone();
    for [kind, a, b, c, d] in edits {
        let pos = usize::from(u16::from_le_bytes([a, b]));
        let arg = u16::from_le_bytes([c, d]);
        let len = edited.len();
        if len == 0 {
            break;
        }
        let pos = pos % len;
        let span = pos..(pos + 1 + usize::from(arg % 64)).min(len);
        match kind % 4 {
            0 => edited[pos] ^= (arg as u8) | 1,
            1 => {
                edited.drain(span);
            }
            2 => {
                let copy = edited[span.clone()].to_vec();
                let to = usize::from(arg >> 6) % (len + 1);
                edited.splice(to..to, copy);
            }
            _ => edited.truncate(pos),
        }
    }

    let mut reader = fastcp_transport::tcp::SealedStream::new(
        tokio::io::join(std::io::Cursor::new(edited.clone()), tokio::io::sink()),
        &secret,
        &keys,
        Direction::ServerToClient,
        1,
        record_len,
    )
    .expect("a reader");
    let mut out = Vec::new();
    let result = runtime.block_on(reader.read_to_end(&mut out));
    assert!(
        plain.starts_with(&out),
        "bytes that were never sealed came out"
    );
    if edited == wire {
        assert!(result.is_ok(), "the untouched stream failed: {result:?}");
        assert_eq!(out, plain, "the untouched stream lost bytes");
    } else if result.is_ok() {
        assert!(
            edited.starts_with(&wire),
            "an edit before the end record went unnoticed"
        );
        assert_eq!(out, plain);
    }
}

/// The receiver: a hostile sender's bytes on stream 0 end in a clean report or an error, and
/// nothing is written outside the destination.
pub fn receive(data: &[u8]) {
    let root = tempfile::tempdir().expect("a temp dir");
    let dest = root.path().join("dest");
    // Every kind of entry the receiver can be asked to take, but devices (made only as
    // root, and not worth making here).
    let config = fastcp_stream::ReceiveConfig {
        recursive: true,
        specials: true,
        attrs: fastcp_stream::KeepAttrs {
            group: true,
            xattrs: true,
            acls: true,
            ..fastcp_stream::KeepAttrs::default()
        },
        ..fastcp_stream::ReceiveConfig::default()
    };
    let progress = Arc::new(fastcp_stream::Progress::default());
    let wire = tokio::io::join(std::io::Cursor::new(data.to_vec()), tokio::io::sink());
    let _ = runtime().block_on(async {
        tokio::time::timeout(
            std::time::Duration::from_secs(10),
            fastcp_stream::receive(&dest, vec![wire], &config, progress),
        )
        .await
    });
    for entry in std::fs::read_dir(root.path()).expect("the temp dir") {
        let name = entry.expect("an entry").file_name();
        assert_eq!(name, "dest", "written outside the destination: {name:?}");
    }
}
