//! The engine matrix: stream counts x chunk sizes x trees x protocol versions (which pick the
//! checksum); every run must give an identical tree.

mod common;

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use common::*;
use fastcp_stream::{ReceiveConfig, SendConfig};

/// Source trees, built once per test binary.
struct Trees {
    _dir: tempfile::TempDir,
    mixed: PathBuf,
    tiny: PathBuf,
}

fn trees() -> &'static Trees {
    static TREES: OnceLock<Trees> = OnceLock::new();
    TREES.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap();
        let mixed = dir.path().join("mixed-base");
        build_mixed(&mixed.join("mixed"));
        let tiny = dir.path().join("tiny-base");
        build_tiny(&tiny.join("tiny"), 20_000);
        Trees {
            mixed,
            tiny,
            _dir: dir,
        }
    })
}

async fn copy_and_compare(
    base: &Path,
    name: &str,
    streams: usize,
    chunk: usize,
    preserve: bool,
    version: u16,
) {
    let dest = tempfile::tempdir().unwrap();
    let send = SendConfig {
        chunk_size: chunk,
        recursive: true,
        preserve,
        version,
        ..SendConfig::default()
    };
    let receive = ReceiveConfig {
        recursive: true,
        preserve,
        version,
        ..ReceiveConfig::default()
    };
    let (sent, received) =
        run_pair(&[base.join(name)], dest.path(), &send, &receive, streams).await;
    let sent = sent.unwrap();
    let received = received.unwrap();
    assert!(sent.is_complete(), "{:?}", sent.failures);
    assert!(received.is_complete(), "{:?}", received.failures);
    assert_eq!(sent.local, received.peer);
    assert_eq!(received.local, sent.peer);
    assert_eq!(sent.local.files, received.local.files);
    assert_eq!(sent.local.bytes, received.local.bytes);
    assert_same_tree(base, dest.path(), preserve);
    assert_no_temp(dest.path());
}

macro_rules! matrix {
    ($($name:ident: $tree:ident, $streams:expr, $chunk:expr, $preserve:expr, $version:expr;)*) => {$(
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $name() {
            let t = trees();
            copy_and_compare(&t.$tree, stringify!($tree), $streams, $chunk, $preserve, $version)
                .await;
        }
    )*};
}

matrix! {
    mixed_1_stream_small_chunks: mixed, 1, 4096, true, 3;
    mixed_2_streams_small_chunks: mixed, 2, 4096, false, 3;
    mixed_4_streams_small_chunks: mixed, 4, 4096, true, 3;
    mixed_8_streams_small_chunks: mixed, 8, 4096, false, 3;
    mixed_1_stream_large_chunks: mixed, 1, 1 << 20, false, 3;
    mixed_2_streams_large_chunks: mixed, 2, 1 << 20, true, 3;
    mixed_4_streams_large_chunks: mixed, 4, 2 << 20, false, 3;
    mixed_8_streams_large_chunks: mixed, 8, 1 << 20, true, 3;
    mixed_3_streams_odd_chunks: mixed, 3, 5000, true, 3;
    tiny_1_stream_small_chunks: tiny, 1, 4096, false, 3;
    tiny_2_streams_large_chunks: tiny, 2, 1 << 20, true, 3;
    tiny_4_streams_small_chunks: tiny, 4, 4096, true, 3;
    tiny_8_streams_large_chunks: tiny, 8, 1 << 20, false, 3;
    // Version 2 (BLAKE3): chunks that are BLAKE3 subtrees are hashed as they come; chunks
    // that are not are hashed from disk once the file is complete.
    v2_mixed_4_streams_small_chunks: mixed, 4, 4096, false, 2;
    v2_mixed_2_streams_large_chunks: mixed, 2, 1 << 20, true, 2;
    v2_mixed_3_streams_odd_chunks: mixed, 3, 5000, true, 2;
    v2_tiny_2_streams_large_chunks: tiny, 2, 1 << 20, false, 2;
}
