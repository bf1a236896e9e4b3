//! The receiver's memory stays bounded however much it receives, also when it keeps names
//! for the whole session (`--delete`, `-H`): it keeps copies, never slices of the blocks the
//! data arrived in, which would keep every block, file data included, until the end.
//!
//! One test in its own binary: it reads the process's peak resident size.

mod common;

use std::path::Path;

use common::*;
use fastcp_stream::{ReceiveConfig, SendConfig};

const MIB: u64 = 1 << 20;

/// A line of `/proc/self/status`, in KiB.
fn status_kib(key: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with(key)).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

/// 256 MiB in 4,096 files of 64 KiB, in 64 folders.
fn source(root: &Path) {
    let data = pseudo_random(64 << 10, 7);
    for d in 0..64 {
        let dir = root.join(format!("d{d:02}"));
        std::fs::create_dir_all(&dir).unwrap();
        for f in 0..64 {
            write(&dir.join(format!("f{f:02}")), &data, 0o644);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn names_kept_for_the_session_do_not_keep_the_received_data() {
    let work = tempfile::tempdir().unwrap();
    let src = work.path().join("src");
    source(&src);
    let send = |hard_links| SendConfig {
        recursive: true,
        hard_links,
        ..SendConfig::default()
    };
    let receive = |delete, hard_links| ReceiveConfig {
        recursive: true,
        delete,
        hard_links,
        ..ReceiveConfig::default()
    };
    for (name, send, receive) in [
        ("--delete", send(false), receive(true, false)),
        ("-H", send(true), receive(false, true)),
    ] {
        let dest = work.path().join(name);
        std::fs::create_dir(&dest).unwrap();
        // Resets the peak resident size to the current one (Linux 4.0 and later).
        std::fs::write("/proc/self/clear_refs", "5").unwrap();
        let before = status_kib("VmRSS:") * 1024;
        let (sent, received) =
            run_pair(std::slice::from_ref(&src), &dest, &send, &receive, 4).await;
        sent.unwrap();
        received.unwrap();
        let grew = (status_kib("VmHWM:") * 1024).saturating_sub(before);
        eprintln!("{name}: the peak grew by {} MiB", grew / MIB);
        assert!(
            grew < 160 * MIB,
            "{name}: the peak resident size grew by {} MiB while 256 MiB arrived",
            grew / MIB
        );
        assert_same_tree(&src, &dest.join("src"), false);
    }
}
