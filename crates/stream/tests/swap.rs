//! A directory of the destination flipped, in a loop, between itself and a symbolic link
//! pointing outside, while a copy, a `--delete` and a `--resume` run into it. Copies may
//! fail; nothing outside may ever be written, replaced or removed.

mod common;

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};

use common::*;
use fastcp_stream::{Progress, ReceiveConfig, SendConfig, copy_local};

const MIB: usize = 1 << 20;

/// Every file beneath `dir`, by relative path, with its bytes (links as their targets).
fn snapshot(dir: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    let mut out = BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            let m = fs::symlink_metadata(&p).unwrap();
            let rel = p.strip_prefix(dir).unwrap().to_path_buf();
            if m.is_dir() {
                stack.push(p);
                out.insert(rel, b"<dir>".to_vec());
            } else if m.file_type().is_symlink() {
                out.insert(
                    rel,
                    fs::read_link(&p)
                        .unwrap()
                        .into_os_string()
                        .into_encoded_bytes(),
                );
            } else {
                out.insert(rel, fs::read(&p).unwrap());
            }
        }
    }
    out
}

/// Flips `dir` with a link to `outside` until stopped; returns how many times it did.
fn flipper(dir: PathBuf, outside: PathBuf, stop: Arc<AtomicBool>) -> std::thread::JoinHandle<u64> {
    std::thread::spawn(move || {
        let aside = dir.with_extension("aside");
        let mut flips = 0;
        while !stop.load(Relaxed) {
            if fs::rename(&dir, &aside).is_ok() {
                if std::os::unix::fs::symlink(&outside, &dir).is_ok() {
                    flips += 1;
                    std::thread::yield_now();
                    let _ = fs::remove_file(&dir);
                }
                // The copy may have made the directory again meanwhile: then it stays aside.
                let _ = fs::rename(&aside, &dir);
            }
            std::thread::yield_now();
        }
        flips
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_directory_swapped_for_a_symlink_lets_nothing_out() {
    let work = tempfile::tempdir().unwrap();
    let src = work.path().join("src");
    fs::create_dir_all(src.join("sub")).unwrap();
    for i in 0..100 {
        fs::write(src.join(format!("sub/f{i}")), format!("new {i}")).unwrap();
    }
    let big = pseudo_random(6 * MIB, 5);
    fs::write(src.join("sub/big"), &big).unwrap();

    // Decoys outside under the very names the copy writes, deletes and resumes.
    let outside = work.path().join("outside");
    fs::create_dir(&outside).unwrap();
    for i in 0..100 {
        fs::write(outside.join(format!("f{i}")), b"decoy").unwrap();
        fs::write(outside.join(format!("x{i}")), b"decoy").unwrap();
    }
    fs::write(outside.join(".big.fastcp-partial"), &big[..3 * MIB]).unwrap();
    let before = snapshot(&outside);

    let plain = (
        SendConfig {
            recursive: true,
            ..SendConfig::default()
        },
        ReceiveConfig {
            recursive: true,
            ..ReceiveConfig::default()
        },
    );
    let delete = (
        plain.0.clone(),
        ReceiveConfig {
            delete: true,
            ..plain.1.clone()
        },
    );
    let resume = (
        SendConfig {
            preserve: true,
            skip_unchanged: true,
            resume: true,
            ..plain.0.clone()
        },
        ReceiveConfig {
            preserve: true,
            skip_unchanged: true,
            resume: true,
            ..plain.1.clone()
        },
    );
    let mut flips = 0;
    let mut completed = 0;
    for round in 0..8 {
        for (name, (send, receive)) in [("copy", &plain), ("delete", &delete), ("resume", &resume)]
        {
            let dest = work.path().join(format!("dest-{name}-{round}"));
            let sub = dest.join("src/sub");
            fs::create_dir_all(&sub).unwrap();
            match name {
                "delete" => {
                    for i in 0..100 {
                        fs::write(sub.join(format!("x{i}")), b"extra").unwrap();
                    }
                }
                "resume" => fs::write(sub.join(".big.fastcp-partial"), &big[..2 * MIB]).unwrap(),
                _ => {}
            }
            let stop = Arc::new(AtomicBool::new(false));
            let flip = flipper(sub, outside.clone(), stop.clone());
            let result = copy_local(
                std::slice::from_ref(&src),
                &dest,
                send,
                receive,
                3,
                Arc::new(Progress::default()),
            )
            .await;
            stop.store(true, Relaxed);
            flips += flip.join().unwrap();
            if result.is_ok_and(|r| r.is_complete()) {
                completed += 1;
            }
            assert_eq!(
                snapshot(&outside),
                before,
                "{name} round {round} reached outside"
            );
        }
    }
    eprintln!("{flips} flips, {completed} of 24 copies complete");
    assert!(flips > 24, "the directory was hardly flipped: {flips}");
}
