//! `--shard I/N`: N independent runs cover a tree exactly once, balanced by bytes.

mod common;

use std::collections::HashSet;
use std::fs;
use std::path::Path;
use std::process::Command;

use common::*;
use fastcp::shard::{Shard, plan};
use fastcp::stream::WalkConfig;
use fastcp_testsupport::Sshd;
use fastcp_testsupport::tree::{assert_no_temp, assert_same_tree, pseudo_random, write};

/// 600 files of sizes from 0 to about 200 KB (a skewed spread, as in source trees), in
/// nested folders, and a few links.
fn build(root: &Path) {
    for i in 0..600u64 {
        let dir = root.join(format!("d{}/e{}", i % 7, i % 3));
        fs::create_dir_all(&dir).unwrap();
        let r = pseudo_random(8, i);
        let size = (u64::from(r[0]) * u64::from(r[1]) * 3 + u64::from(r[2])) as usize;
        write(&dir.join(format!("f{i}")), &pseudo_random(size, i), 0o644);
    }
    std::os::unix::fs::symlink("d0", root.join("link")).unwrap();
    fs::create_dir_all(root.join("empty/dir")).unwrap();
}

/// Big files, 12 MiB and a bit, beside the tree of [`build`]: more than a piece of a share.
const BIG: [&str; 3] = ["d1/big-a", "d2/e0/big-b", "big-c"];

fn build_with_big(root: &Path) {
    build(root);
    for (i, name) in BIG.iter().enumerate() {
        let size = (12 << 20) + 1000 * i;
        write(&root.join(name), &pseudo_random(size, 90 + i as u64), 0o640);
    }
}

#[test]
fn shares_are_disjoint_cover_everything_and_balance_bytes_within_ten_percent() {
    let work = tempfile::tempdir().unwrap();
    let src = work.path().join("src");
    build_with_big(&src);
    let config = WalkConfig::new(true, false);
    let sources = [src.clone()];
    for n in [1u32, 2, 3, 5, 8] {
        let shares: Vec<_> = (0..n)
            .map(|i| plan(&sources, &config, Shard::new(i, n).unwrap()).unwrap())
            .collect();
        // Whole files in one share; the pieces of a split file, over all the shares, cover
        // it exactly once.
        let mut seen = HashSet::new();
        let mut pieces: std::collections::HashMap<_, Vec<(u64, u64, u64)>> = Default::default();
        for share in &shares {
            for f in &share.files {
                match share.pieces.get(f) {
                    Some(p) => pieces
                        .entry(f.clone())
                        .or_default()
                        .extend(p.iter().map(|p| (p.offset, p.len, p.size))),
                    None => assert!(seen.insert(f.clone()), "{f:?} is in two shares of {n}"),
                }
            }
        }
        for (f, mut ranges) in pieces {
            assert!(
                seen.insert(f.clone()),
                "{f:?} is whole in a share and split too"
            );
            ranges.sort_unstable();
            let size = ranges[0].2;
            let mut at = 0;
            for (offset, len, _) in ranges {
                assert_eq!(offset, at, "{f:?}: a gap or an overlap at {at} (N = {n})");
                assert!(len > 0 && offset.is_multiple_of(fastcp::shard::GRID));
                at += len;
            }
            assert_eq!(at, size, "{f:?}: the pieces end at the file's end");
        }
        if n > 1 {
            // A 12 MiB file is over a 16th of a share: it is cut.
            assert!(shares.iter().any(|s| !s.pieces.is_empty()), "N = {n}");
        }
        assert_eq!(seen.len() as u64, shares[0].total_files, "N = {n}");
        let total: u64 = shares.iter().map(|s| s.bytes).sum();
        assert_eq!(total, shares[0].total_bytes);
        let (min, max) = (
            shares.iter().map(|s| s.bytes).min().unwrap(),
            shares.iter().map(|s| s.bytes).max().unwrap(),
        );
        let mean = total as f64 / f64::from(n);
        assert!(
            (max - min) as f64 <= 0.1 * mean,
            "N = {n}: shares from {min} to {max} bytes"
        );
        // The same split every time.
        let again = plan(&sources, &config, Shard::new(0, n).unwrap()).unwrap();
        assert_eq!(again.files, shares[0].files);
        assert_eq!(again.pieces, shares[0].pieces);
    }
}

/// Big files cut into pieces over three runs, at once or one after another, locally and over
/// SSH: each file takes its final name only when its last piece is in, whole, and no work
/// file is left.
#[test]
fn pieces_of_big_files_from_several_runs_make_whole_files() {
    let work = tempfile::tempdir().unwrap();
    let src = work.path().join("src");
    build_with_big(&src);
    let shard = |i: u32| ["-r", "-p", "--json", "--shard", &format!("{i}/3")].map(String::from);

    // One after another: until the last run, the big files are nowhere under their names.
    let local = work.path().join("local");
    fs::create_dir(&local).unwrap();
    let mut files = 0;
    for i in 0..3 {
        let out = run(Command::new(BIN).args(shard(i)).arg(&src).arg(&local));
        assert!(out.status.success(), "{}", stderr(&out));
        files += json(&out)["files"].as_u64().unwrap();
        if i < 2 {
            let done = BIG.iter().filter(|b| local.join("src").join(b).exists());
            assert!(
                done.count() < BIG.len(),
                "run {i}: every big file already whole"
            );
        }
        for big in BIG {
            if let Ok(copy) = fs::read(local.join("src").join(big)) {
                assert!(copy == fs::read(src.join(big)).unwrap(), "{big} torn");
            }
        }
    }
    assert_eq!(
        files, 603,
        "each file counted once, by the run that completed it"
    );
    assert_same_tree(&src, &local.join("src"), true);
    assert_no_temp(&local);

    // All at once, over SSH.
    let sshd = Sshd::start().unwrap();
    let pushed = work.path().join("pushed");
    fs::create_dir(&pushed).unwrap();
    let runs: Vec<_> = (0..3)
        .map(|i| {
            fastcp(&sshd, bin())
                .args(shard(i))
                .arg(&src)
                .arg(remote(&sshd, &pushed))
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    for (i, child) in runs.into_iter().enumerate() {
        let out = child.wait_with_output().unwrap();
        assert!(out.status.success(), "run {i}: {}", stderr(&out));
    }
    assert_same_tree(&src, &pushed.join("src"), true);
    assert_no_temp(&pushed);
}

/// A big file rewritten between two runs' pieces is never put together from both versions:
/// the later run's pieces start a work file of their own, and the file is whole once every
/// run has sent its pieces of the same version.
#[test]
fn pieces_of_two_versions_of_a_file_never_meet() {
    let work = tempfile::tempdir().unwrap();
    let src = work.path().join("src");
    fs::create_dir(&src).unwrap();
    let big = src.join("big");
    write(&big, &pseudo_random(24 << 20, 1), 0o644);
    write(&src.join("small"), b"small", 0o644);
    // With -p and without: the receiver tells versions apart by their time either way.
    for (round, keep) in [vec!["-r", "-p"], vec!["-r"]].iter().enumerate() {
        write(&big, &pseudo_random(24 << 20, round as u64), 0o644);
        let dst = work.path().join(format!("dst{round}"));
        fs::create_dir(&dst).unwrap();
        let copy = |i: u32| {
            let out = run(Command::new(BIN)
                .args(keep)
                .args(["--shard", &format!("{i}/2")])
                .arg(&src)
                .arg(&dst));
            assert!(out.status.success(), "run {i}: {}", stderr(&out));
        };
        copy(0);
        // Same size, new bytes and a new time.
        write(&big, &pseudo_random(24 << 20, 10 + round as u64), 0o644);
        fastcp_testsupport::tree::set_mtime(&big, 2_000_000_000 + round as i64, 0);
        copy(1);
        assert!(
            !dst.join("src/big").exists(),
            "{keep:?}: a file of two versions"
        );
        copy(0);
        assert_eq!(
            fs::read(dst.join("src/big")).unwrap(),
            fs::read(&big).unwrap()
        );
        // The first version's work file went with the file's completion.
        assert_no_temp(&dst);
    }
}

/// Two big files whose long names agree in their first 200 bytes, of one size and one time,
/// each get a work file of their own.
#[test]
fn long_names_alike_get_work_files_of_their_own() {
    let work = tempfile::tempdir().unwrap();
    let src = work.path().join("src");
    fs::create_dir(&src).unwrap();
    let stem = "n".repeat(200);
    for (i, end) in ["x", "y"].iter().enumerate() {
        let path = src.join(format!("{stem}-{end}"));
        write(&path, &pseudo_random(12 << 20, 7 + i as u64), 0o644);
        fastcp_testsupport::tree::set_mtime(&path, 1_700_000_000, 0);
    }
    let dst = work.path().join("dst");
    fs::create_dir(&dst).unwrap();
    for i in 0..2 {
        let out = run(Command::new(BIN)
            .args(["-r", "-p", "--shard", &format!("{i}/2")])
            .arg(&src)
            .arg(&dst));
        assert!(out.status.success(), "run {i}: {}", stderr(&out));
    }
    assert_same_tree(&src, &dst.join("src"), true);
    assert_no_temp(&dst);
}

/// Runs whose walks differ (a file grew between them, so every file is cut otherwise) still
/// complete the file from the newer cut; a run retried after a file is whole leaves nothing
/// behind.
#[test]
fn pieces_of_another_cut_and_retried_runs_complete_cleanly() {
    let work = tempfile::tempdir().unwrap();
    let src = work.path().join("src");
    fs::create_dir(&src).unwrap();
    write(&src.join("big"), &pseudo_random(40 << 20, 1), 0o644);
    write(&src.join("other"), b"small", 0o644);
    let dst = work.path().join("dst");
    fs::create_dir(&dst).unwrap();
    let copy = |i: u32, extra: &[&str]| {
        let out = run(Command::new(BIN)
            .args(["-r", "-p", "--shard", &format!("{i}/2")])
            .args(extra)
            .arg(&src)
            .arg(&dst));
        assert!(out.status.success(), "run {i}: {}", stderr(&out));
    };
    copy(0, &[]);
    // Bigger pieces from now on.
    write(&src.join("other"), &pseudo_random(50 << 20, 2), 0o644);
    for _ in 0..2 {
        copy(0, &["--skip-unchanged"]);
        copy(1, &["--skip-unchanged"]);
    }
    assert_same_tree(&src, &dst.join("src"), true);
    assert_no_temp(&dst);
    // A retried run, without --skip-unchanged, after its files are whole.
    copy(1, &[]);
    assert_same_tree(&src, &dst.join("src"), true);
    assert_no_temp(&dst);
}

#[test]
fn shard_runs_together_copy_the_tree_locally_and_over_ssh() {
    let work = tempfile::tempdir().unwrap();
    let src = work.path().join("src");
    build(&src);

    let local = work.path().join("local");
    fs::create_dir(&local).unwrap();
    let mut files = 0;
    for i in 0..3 {
        let out = run(Command::new(BIN)
            .args(["-r", "--json", "--shard", &format!("{i}/3")])
            .arg(&src)
            .arg(&local));
        assert!(out.status.success(), "{}", stderr(&out));
        let copied = json(&out)["files"].as_u64().unwrap();
        assert!(copied > 0, "every share holds files");
        files += copied;
    }
    assert_eq!(files, 600, "600 files, each copied once");
    assert_same_tree(&src, &local.join("src"), false);

    let sshd = Sshd::start().unwrap();
    let pushed = work.path().join("pushed");
    fs::create_dir(&pushed).unwrap();
    for i in 0..2 {
        let out = run(fastcp(&sshd, bin())
            .args(["-r", "--shard", &format!("{i}/2")])
            .arg(&src)
            .arg(remote(&sshd, &pushed)));
        assert!(out.status.success(), "{}", stderr(&out));
    }
    assert_same_tree(&src, &pushed.join("src"), false);
}

/// With -H, the names of one file fall in one share, so that they arrive as one file
/// (one inode) whichever runs copy the tree, and its bytes travel once.
#[test]
fn shard_runs_with_hard_links_keep_each_file_s_names_together() {
    use std::os::unix::fs::MetadataExt;
    let work = tempfile::tempdir().unwrap();
    let src = work.path().join("src");
    build(&src);
    // Forty files with three more names each, spread over the tree's folders.
    for i in 0..40u64 {
        let first = src.join(format!("d{}/e{}/f{i}", i % 7, i % 3));
        for k in 0..3u64 {
            let dir = src.join(format!("d{}", (i + k + 1) % 7));
            fs::hard_link(&first, dir.join(format!("link-{i}-{k}"))).unwrap();
        }
    }
    let config = WalkConfig::new(true, false);
    let sources = [src.clone()];
    let shares: Vec<_> = (0..4)
        .map(|i| plan(&sources, &config, Shard::new(i, 4).unwrap()).unwrap())
        .collect();
    for i in 0..40u64 {
        let names: Vec<_> = std::iter::once(format!("src/d{}/e{}/f{i}", i % 7, i % 3))
            .chain((0..3u64).map(|k| format!("src/d{}/link-{i}-{k}", (i + k + 1) % 7)))
            .collect();
        let holders: HashSet<_> = names
            .iter()
            .map(|n| {
                shares
                    .iter()
                    .position(|s| s.files.contains(n.as_bytes()))
                    .unwrap()
            })
            .collect();
        assert_eq!(holders.len(), 1, "{names:?} are in shares {holders:?}");
    }

    let sshd = Sshd::start().unwrap();
    let pushed = work.path().join("pushed");
    fs::create_dir(&pushed).unwrap();
    for i in 0..4 {
        let out = run(fastcp(&sshd, bin())
            .args(["-r", "-H", "--shard", &format!("{i}/4")])
            .arg(&src)
            .arg(remote(&sshd, &pushed)));
        assert!(out.status.success(), "{}", stderr(&out));
    }
    assert_same_tree(&src, &pushed.join("src"), false);
    for i in 0..40u64 {
        let first = pushed.join(format!("src/d{}/e{}/f{i}", i % 7, i % 3));
        let meta = fs::metadata(&first).unwrap();
        assert_eq!(meta.nlink(), 4, "{}", first.display());
        for k in 0..3u64 {
            let other = pushed.join(format!("src/d{}/link-{i}-{k}", (i + k + 1) % 7));
            assert_eq!(fs::metadata(&other).unwrap().ino(), meta.ino());
        }
    }
}

#[test]
fn shard_misuse_is_a_usage_error() {
    let work = tempfile::tempdir().unwrap();
    let src = work.path().join("src");
    fs::create_dir(&src).unwrap();
    fs::write(src.join("f"), b"f").unwrap();
    // A file cut into pieces: -H is refused by every run, the one without pieces too.
    fs::write(src.join("big"), vec![7u8; 8 << 20]).unwrap();
    fs::write(src.join("other"), vec![8u8; 8 << 20]).unwrap();
    let dst = work.path().join("dst");
    for args in [
        vec!["--shard", "3/3"],
        vec!["--shard", "one/two"],
        vec!["--shard", "0/2", "--delete"],
        vec!["--shard", "0/3", "-H"],
        vec!["--shard", "2/3", "-H"],
    ] {
        let out = run(Command::new(BIN).arg("-r").args(&args).arg(&src).arg(&dst));
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", stderr(&out));
    }
    let sshd = Sshd::start().unwrap();
    let out = run(fastcp(&sshd, bin())
        .args(["-r", "--shard", "0/2"])
        .arg(remote(&sshd, &src))
        .arg(&dst));
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("local sources"), "{}", stderr(&out));
    assert!(!dst.exists());
}

/// The repository's root, where docs/ is.
fn docs() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("docs")
}

/// A PATH with the fastcp under test first.
fn path_with_fastcp() -> std::ffi::OsString {
    let mut dirs = vec![bin().parent().unwrap().to_path_buf()];
    dirs.extend(std::env::split_paths(
        &std::env::var_os("PATH").unwrap_or_default(),
    ));
    std::env::join_paths(dirs).unwrap()
}

/// The documented Indexed Job, Slurm array and GNU parallel line, each run as written (with
/// the scheduler's variables set), cover the tree exactly once.
#[test]
fn the_documented_scheduler_recipes_copy_the_tree() {
    let work = tempfile::tempdir().unwrap();
    let src = work.path().join("src");
    build(&src);

    // Kubernetes: the container's command, with the index each pod gets.
    let manifest = fs::read_to_string(docs().join("sharding/job.yaml")).unwrap();
    let command = manifest
        .lines()
        .find_map(|l| l.trim().strip_prefix("- fastcp "))
        .map(|rest| format!("fastcp {rest}"))
        .expect("the manifest runs fastcp");
    let shards: u32 = manifest
        .lines()
        .skip_while(|l| !l.contains("name: SHARDS"))
        .find_map(|l| l.trim().strip_prefix("value: "))
        .map(|v| v.trim_matches('"').parse().unwrap())
        .unwrap();
    let k8s = work.path().join("k8s");
    fs::create_dir(&k8s).unwrap();
    for i in 0..shards {
        let out = run(Command::new("sh")
            .args(["-c", &command])
            .env("PATH", path_with_fastcp())
            .env("JOB_COMPLETION_INDEX", i.to_string())
            .env("SHARDS", shards.to_string())
            .env("SRC", &src)
            .env("DEST", &k8s));
        assert!(out.status.success(), "pod {i}: {}", stderr(&out));
    }
    assert_same_tree(&src, &k8s.join("src"), true);

    // Slurm: the array script, once per task id.
    let slurm = work.path().join("slurm");
    fs::create_dir(&slurm).unwrap();
    for i in 0..4 {
        let out = run(Command::new("bash")
            .arg(docs().join("sharding/slurm-array.sh"))
            .env("PATH", path_with_fastcp())
            .env("SLURM_ARRAY_TASK_ID", i.to_string())
            .env("SLURM_ARRAY_TASK_COUNT", "4")
            .env("SRC", &src)
            .env("DEST", &slurm));
        assert!(out.status.success(), "task {i}: {}", stderr(&out));
    }
    assert_same_tree(&src, &slurm.join("src"), true);

    // GNU parallel: the line from docs/sharding.md.
    let guide = fs::read_to_string(docs().join("sharding.md")).unwrap();
    let line = guide
        .lines()
        .find(|l| l.starts_with("parallel "))
        .expect("a GNU parallel line");
    let parallel = work.path().join("parallel");
    fs::create_dir(&parallel).unwrap();
    fastcp_testsupport::tools::require("parallel");
    let out = run(Command::new("bash")
        .args(["-c", line])
        .env("PATH", path_with_fastcp())
        .env("SRC", &src)
        .env("DEST", &parallel)
        .env("HOME", work.path()));
    assert!(out.status.success(), "{}", stderr(&out));
    assert_same_tree(&src, &parallel.join("src"), true);
}

/// With `--files-from`, each run copies the listed paths of its share, and each reports a
/// listed path the source lacks (exit code 1), as a run without `--shard` does.
#[test]
fn shard_runs_with_a_list_copy_its_paths_and_report_what_is_missing() {
    let work = tempfile::tempdir().unwrap();
    let src = work.path().join("src");
    build(&src);
    let list = work.path().join("list");
    fs::write(&list, "d0/e0\nd1/e1/f1\nnot/there\n").unwrap();
    let dst = work.path().join("dst");
    fs::create_dir(&dst).unwrap();
    for i in 0..2 {
        let out = run(Command::new(BIN)
            .args(["-r", "--shard", &format!("{i}/2"), "--files-from"])
            .arg(&list)
            .arg(&src)
            .arg(&dst));
        assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
        assert!(
            stderr(&out).contains("not/there: listed by --files-from, but not in the source"),
            "{}",
            stderr(&out)
        );
    }
    assert_same_tree(&src.join("d0/e0"), &dst.join("src/d0/e0"), false);
    assert_eq!(
        fs::read(dst.join("src/d1/e1/f1")).unwrap(),
        fs::read(src.join("d1/e1/f1")).unwrap()
    );
    assert!(!dst.join("src/d2").exists());
}
