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

/// Holes of the source where the partial file holds other bytes: they read as zeros in the
/// copy (punched out of the partial file), and none of their bytes travel.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn holes_of_the_source_clear_stale_bytes_of_a_continued_file() {
    use std::os::unix::fs::{FileExt, MetadataExt};
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("big");
    let first = pseudo_random(MIB, 10);
    let later = pseudo_random(MIB, 11);
    let f = fs::File::create(&src).unwrap();
    f.set_len(12 * MIB as u64).unwrap();
    f.write_all_at(&first, 0).unwrap();
    f.write_all_at(&later, 9 * MIB as u64).unwrap();
    drop(f);
    let content = fs::read(&src).unwrap();
    let dest = dir.path().join("dest");
    fs::create_dir(&dest).unwrap();
    let mut partial = vec![0xaa; 14 * MIB];
    partial[..MIB].copy_from_slice(&first);
    fs::write(dest.join(".big.fastcp-partial"), &partial).unwrap();

    let report = copy(&src, &dest, 2).await;
    assert!(fs::read(dest.join("big")).unwrap() == content);
    assert_eq!(report.bytes_resumed, MIB as u64);
    assert_eq!(report.bytes_sent, MIB as u64);
    let allocated = fs::metadata(dest.join("big")).unwrap().blocks() * 512;
    assert!(allocated <= 3 * MIB as u64, "{allocated} bytes allocated");
    assert_no_temp(&dest);
}

/// A partial file that holds the source's zeros as written blocks: they are kept, not sent,
/// and left as holes in the copy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kept_blocks_of_zeros_become_holes() {
    use std::os::unix::fs::{FileExt, MetadataExt};
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("big");
    let f = fs::File::create(&src).unwrap();
    f.set_len(16 * MIB as u64).unwrap();
    f.write_all_at(&pseudo_random(MIB, 12), 2 * MIB as u64)
        .unwrap();
    drop(f);
    let content = fs::read(&src).unwrap();
    let dest = dir.path().join("dest");
    fs::create_dir(&dest).unwrap();
    // Written out, zeros and all.
    fs::write(dest.join(".big.fastcp-partial"), &content[..12 * MIB]).unwrap();

    let report = copy(&src, &dest, 2).await;
    assert!(fs::read(dest.join("big")).unwrap() == content);
    assert_eq!(report.bytes_resumed, 12 * MIB as u64);
    assert_eq!(report.bytes_sent, 0);
    let allocated = fs::metadata(dest.join("big")).unwrap().blocks() * 512;
    assert!(allocated <= 2 * MIB as u64, "{allocated} bytes allocated");
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

/// A receiver answers a probe with a block of its own choosing. The sender takes only the
/// block size it would itself give the file: a larger one (here the whole file, with the
/// right hash) would have it read and hold that much before it could keep it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_offered_block_larger_than_the_files_own_is_not_taken() {
    use bytes::BytesMut;
    use fastcp_proto::{Answer, Decoder, Frame, Partial, Summary, encode};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    let work = tempfile::tempdir().unwrap();
    let src = work.path().join("big");
    let content = pseudo_random(8 * MIB, 3);
    fs::write(&src, &content).unwrap();
    let config = SendConfig {
        skip_unchanged: true,
        resume: true,
        ..SendConfig::default()
    };
    let (ours, theirs) = tokio::io::duplex(1 << 20);
    let sender = tokio::spawn(async move {
        let progress = Arc::new(Progress::default());
        fastcp_stream::send(&[src], vec![theirs], &config, progress).await
    });
    // The receiver's side, by hand: one stream.
    let (mut r, mut w) = tokio::io::split(ours);
    let mut decoder = Decoder::new(64 << 20);
    let mut buf = BytesMut::new();
    let mut frames = Vec::new();
    'read: loop {
        while let Some(frame) = decoder.decode(&mut buf).unwrap() {
            match &frame {
                Frame::Probe(p) => {
                    let mut out = BytesMut::new();
                    let whole = twox_hash::XxHash3_128::oneshot(&content);
                    encode(
                        &Frame::Partial(Partial {
                            id: p.id,
                            block: 8 * MIB as u64,
                            hashes: vec![whole],
                        }),
                        &mut out,
                    );
                    encode(
                        &Frame::Answer(Answer {
                            id: p.id,
                            send: true,
                            hash: None,
                        }),
                        &mut out,
                    );
                    w.write_all(&out).await.unwrap();
                }
                Frame::Done(_) => {
                    frames.push(frame);
                    break 'read;
                }
                _ => {}
            }
            frames.push(frame);
        }
        let n = tokio::time::timeout(std::time::Duration::from_secs(30), r.read_buf(&mut buf))
            .await
            .expect("the sender went quiet")
            .unwrap();
        assert!(n > 0, "the sender closed before its Done");
    }
    let mut out = BytesMut::new();
    encode(&Frame::Done(Summary::default()), &mut out);
    w.write_all(&out).await.unwrap();
    let _ = tokio::time::timeout(std::time::Duration::from_secs(30), sender).await;
    let kept: Vec<_> = frames
        .iter()
        .filter(|f| matches!(f, Frame::Keep(_)))
        .collect();
    assert!(kept.is_empty(), "kept with a block of its own: {kept:?}");
    let data: usize = frames
        .iter()
        .map(|f| match f {
            Frame::Data(d) => d.bytes.len(),
            _ => 0,
        })
        .sum();
    assert_eq!(data, 8 * MIB, "the file is sent whole");
}

/// `--delete` removes the partial file of a file the source no longer has as a file: one
/// that became a folder or a link takes the file's name, and its partial file would stay
/// forever, as one of a file that is gone would.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delete_removes_the_partial_file_of_a_file_that_became_a_folder_or_a_link() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("top");
    fs::create_dir_all(src.join("x")).unwrap();
    fs::write(src.join("x/in"), b"in").unwrap();
    std::os::unix::fs::symlink("x", src.join("l")).unwrap();
    fs::write(src.join("kept"), b"small").unwrap();
    let dest = dir.path().join("dest");
    let top = dest.join("top");
    fs::create_dir_all(&top).unwrap();
    for name in ["x", "l", "gone"] {
        fs::write(top.join(format!(".{name}.fastcp-partial")), vec![7; MIB]).unwrap();
    }
    let (send, receive) = configs();
    let send = SendConfig {
        recursive: true,
        ..send
    };
    let receive = ReceiveConfig {
        recursive: true,
        delete: true,
        ..receive
    };
    copy_local(
        &[src],
        &dest,
        &send,
        &receive,
        2,
        Arc::new(Progress::default()),
    )
    .await
    .unwrap();
    assert_eq!(fs::read(top.join("x/in")).unwrap(), b"in");
    for name in ["x", "l", "gone"] {
        let partial = top.join(format!(".{name}.fastcp-partial"));
        assert!(!partial.exists(), "{} stayed", partial.display());
    }
}
