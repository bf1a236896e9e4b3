//! `--resume`: a partial file left by a stopped copy is continued, only the blocks it lacks
//! travel, and the file is verified as a whole before it takes its final name.

mod common;

use std::fs;
use std::path::Path;
use std::sync::Arc;

use common::*;
use fastcp_stream::{Progress, ReceiveConfig, Report, SendConfig, copy_local};

const MIB: usize = 1 << 20;

fn configs() -> (SendConfig, ReceiveConfig) {
    (
        SendConfig {
            preserve: true,
            skip_unchanged: true,
            resume: true,
            ..SendConfig::default()
        },
        ReceiveConfig {
            preserve: true,
            skip_unchanged: true,
            resume: true,
            ..ReceiveConfig::default()
        },
    )
}

async fn copy(src: &Path, dest: &Path, streams: usize) -> Report {
    let (send, receive) = configs();
    copy_local(
        &[src.to_path_buf()],
        dest,
        &send,
        &receive,
        streams,
        Arc::new(Progress::default()),
    )
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partial_file_is_continued_and_only_what_it_lacks_is_sent() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("big");
    let content = pseudo_random(40 * MIB + 12_345, 7);
    fs::write(&src, &content).unwrap();
    let dest = dir.path().join("dest");
    fs::create_dir(&dest).unwrap();
    // What a cut copy left: the first 25 MiB and a bit, with one block damaged.
    let mut partial = content[..25 * MIB + 500].to_vec();
    partial[5 * MIB + 77] ^= 1;
    fs::write(dest.join(".big.fastcp-partial"), &partial).unwrap();

    let report = copy(&src, &dest, 3).await;
    assert_eq!(fs::read(dest.join("big")).unwrap(), content);
    assert!(!dest.join(".big.fastcp-partial").exists());
    // 25 whole blocks of 1 MiB were there, one of them wrong.
    assert_eq!(report.bytes_resumed, 24 * MIB as u64);
    assert_eq!(report.bytes_sent, content.len() as u64 - 24 * MIB as u64);
    assert_no_temp(&dest);

    // Once complete, a rerun sends nothing; a partial file left beside the whole file (by a
    // copy stopped while another completed it, say) goes.
    fs::write(dest.join(".big.fastcp-partial"), &partial).unwrap();
    let again = copy(&src, &dest, 3).await;
    assert_eq!((again.files_skipped, again.bytes_sent), (1, 0));
    assert!(!dest.join(".big.fastcp-partial").exists());
}

/// Each block the partial file holds is offered once: blocks of the source past the partial
/// file that repeat one it holds (zeros, here) travel, and are not taken for kept.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blocks_past_the_partial_file_that_repeat_one_it_holds_still_travel() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("big");
    let mut content = pseudo_random(20 * MIB, 9);
    content[..4 * MIB].fill(0);
    content[6 * MIB..10 * MIB].fill(0);
    fs::write(&src, &content).unwrap();
    let dest = dir.path().join("dest");
    fs::create_dir(&dest).unwrap();
    fs::write(dest.join(".big.fastcp-partial"), &content[..6 * MIB]).unwrap();

    let report = copy(&src, &dest, 2).await;
    assert_eq!(fs::read(dest.join("big")).unwrap(), content);
    assert_eq!(report.bytes_resumed, 6 * MIB as u64);
    assert_eq!(report.bytes_sent, 14 * MIB as u64);
}

/// A partial file longer than the source now is, and zeros in the source where the partial
/// file holds other bytes: the zeros are written, not left as holes over stale data.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stale_bytes_never_survive_in_a_continued_file() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("big");
    let mut content = pseudo_random(9 * MIB, 8);
    content[2 * MIB..5 * MIB].fill(0);
    fs::write(&src, &content).unwrap();
    let dest = dir.path().join("dest");
    fs::create_dir(&dest).unwrap();
    let mut partial = vec![0xaa; 12 * MIB];
    partial[..MIB].copy_from_slice(&content[..MIB]);
    fs::write(dest.join(".big.fastcp-partial"), &partial).unwrap();

    let report = copy(&src, &dest, 2).await;
    assert_eq!(fs::read(dest.join("big")).unwrap(), content);
    assert_eq!(report.bytes_resumed, MIB as u64);
}

/// A partial file another copy holds (locked) is left alone: the file travels whole under a
/// temp name of its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partial_file_held_by_another_copy_is_not_touched() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("big");
    let content = pseudo_random(6 * MIB, 9);
    fs::write(&src, &content).unwrap();
    let dest = dir.path().join("dest");
    fs::create_dir(&dest).unwrap();
    let held_path = dest.join(".big.fastcp-partial");
    fs::write(&held_path, &content[..3 * MIB]).unwrap();
    let held = fs::File::open(&held_path).unwrap();
    rustix::fs::flock(&held, rustix::fs::FlockOperation::LockExclusive).unwrap();

    let report = copy(&src, &dest, 2).await;
    assert_eq!(fs::read(dest.join("big")).unwrap(), content);
    assert_eq!(report.bytes_resumed, 0);
    assert_eq!(fs::read(&held_path).unwrap(), &content[..3 * MIB]);
}

/// A copy without `--resume` that completes a file removes the partial file an earlier
/// `--resume` copy kept for it: nothing is left to leak.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_complete_copy_without_resume_removes_the_stale_partial_file() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("big");
    let content = pseudo_random(6 * MIB, 3);
    fs::write(&src, &content).unwrap();
    let dest = dir.path().join("dest");
    fs::create_dir(&dest).unwrap();
    fs::write(dest.join(".big.fastcp-partial"), &content[..2 * MIB]).unwrap();
    copy_local(
        &[src],
        &dest,
        &SendConfig::default(),
        &ReceiveConfig::default(),
        2,
        Arc::new(Progress::default()),
    )
    .await
    .unwrap();
    assert_eq!(fs::read(dest.join("big")).unwrap(), content);
    assert!(!dest.join(".big.fastcp-partial").exists());
}
