//! A file of several GiB, on tmpfs when there is one: identical copy, bounded memory.

mod common;

use std::fs;
use std::io::Write;
use std::path::Path;

use common::*;
use fastcp_stream::{ReceiveConfig, SendConfig};

const SIZE: u64 = 3 << 30;
const DIRS: u64 = 2000;

/// Peak resident memory of this process so far, in KiB.
fn vm_hwm_kib() -> u64 {
    let status = fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with("VmHWM:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

/// Writes `size` bytes that never repeat at a 1 MiB stride (a block of random bytes with the
/// block number stamped in), plus an odd tail, fast.
fn make_big(path: &Path, size: u64) {
    let block = pseudo_random(1 << 20, 42);
    let mut f = std::io::BufWriter::with_capacity(4 << 20, fs::File::create(path).unwrap());
    let mut written = 0u64;
    let mut n = 0u64;
    while written < size {
        let mut b = block.clone();
        b[..8].copy_from_slice(&n.to_le_bytes());
        let take = (size - written).min(b.len() as u64) as usize;
        f.write_all(&b[..take]).unwrap();
        written += take as u64;
        n += 1;
    }
    f.flush().unwrap();
}

/// Many directories, each entry's path cut from a receive buffer: nothing may keep those
/// buffers alive for the whole session.
async fn many_directories(base: &Path) {
    let src = base.join("dirs-src");
    let block = pseudo_random(8000, 7);
    for d in 0..DIRS {
        let dir = src.join(format!("tree/d{d:04}"));
        fs::create_dir_all(&dir).unwrap();
        for f in 0..16 {
            fs::write(dir.join(format!("f{f}")), &block).unwrap();
        }
    }
    let dst = base.join("dirs-dst");
    fs::create_dir_all(&dst).unwrap();
    let send = SendConfig {
        recursive: true,
        ..SendConfig::default()
    };
    let receive = ReceiveConfig {
        recursive: true,
        ..ReceiveConfig::default()
    };
    let (sent, received) = run_pair(&[src.join("tree")], &dst, &send, &receive, 4).await;
    assert!(sent.unwrap().is_complete());
    assert_eq!(received.unwrap().local.dirs, DIRS + 1);
    assert_same_tree(&src, &dst, false);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn several_gib_file_identical_and_memory_bounded() {
    let shm = Path::new("/dev/shm");
    let base = if shm.is_dir() {
        tempfile::tempdir_in(shm).unwrap()
    } else {
        tempfile::tempdir().unwrap()
    };
    let src = base.path().join("src");
    let dst = base.path().join("dst");
    fs::create_dir_all(&src).unwrap();
    fs::create_dir_all(&dst).unwrap();

    many_directories(base.path()).await;
    let peak = vm_hwm_kib();
    eprintln!("peak RSS after {DIRS} directories: {} MiB", peak / 1024);
    // Measured at 46 MiB; 117 MiB when directory paths pinned their receive buffers.
    assert!(
        peak < 90 * 1024,
        "peak RSS {peak} KiB for {DIRS} directories"
    );

    // Not a multiple of any chunk size.
    let t = std::time::Instant::now();
    make_big(&src.join("big"), SIZE + 12_345);
    eprintln!("made in {:?}", t.elapsed());
    let t = std::time::Instant::now();
    let before = vm_hwm_kib();

    // Several streams, the default chunk size, preserving times.
    let send = SendConfig {
        preserve: true,
        ..SendConfig::default()
    };
    let receive = ReceiveConfig {
        preserve: true,
        ..ReceiveConfig::default()
    };
    let (sent, received) = run_pair(&[src.join("big")], &dst, &send, &receive, 4).await;
    let sent = sent.unwrap();
    let received = received.unwrap();
    assert!(sent.is_complete() && received.is_complete());
    assert_eq!(received.local.bytes, SIZE + 12_345);
    eprintln!("copied in {:?}", t.elapsed());
    let peak = vm_hwm_kib();
    let t = std::time::Instant::now();
    eprintln!("peak RSS, both sides in one process: {} MiB", peak / 1024);
    // Both sides run in this process: under 100 MiB each, whatever the file size.
    assert!(
        peak < 200 * 1024 || peak <= before,
        "peak RSS {peak} KiB for a {SIZE}-byte file"
    );
    assert_same_tree(&src, &dst, true);
    eprintln!("compared in {:?}", t.elapsed());
}
