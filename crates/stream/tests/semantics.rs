//! scp-like semantics of a whole transfer: destination mapping, overwrites, what cannot be
//! copied, per-entry failures that let the rest go on.

mod common;

use std::fs;
use std::os::unix::fs::{PermissionsExt, symlink};
use std::path::PathBuf;
use std::sync::Arc;

use bytes::{BufMut, BytesMut};
use common::*;
use fastcp_stream::{
    EntryKind, Error, ErrorCode, Progress, ReadInto, ReceiveConfig, SendConfig, Side, WalkConfig,
    copy_local, walk,
};
use tokio::io::{AsyncReadExt, DuplexStream, ReadHalf};

fn configs(recursive: bool) -> (SendConfig, ReceiveConfig) {
    (
        SendConfig {
            recursive,
            ..SendConfig::default()
        },
        ReceiveConfig {
            recursive,
            ..ReceiveConfig::default()
        },
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn file_to_new_name_and_over_existing_file() {
    let src = tempfile::tempdir().unwrap();
    let dst = tempfile::tempdir().unwrap();
    write(&src.path().join("a"), b"content of a", 0o640);
    let (s, r) = configs(false);
    // dest does not exist: the file takes its name.
    let target = dst.path().join("renamed");
    let (sent, received) = run_pair(&[src.path().join("a")], &target, &s, &r, 2).await;
    assert!(sent.unwrap().is_complete());
    assert!(received.unwrap().is_complete());
    assert_eq!(fs::read(&target).unwrap(), b"content of a");
    // dest exists as a file: it is replaced, atomically, and keeps its own mode (as scp, cp
    // and rsync without -p keep it): a private file stays private.
    fs::write(&target, b"old").unwrap();
    fs::set_permissions(&target, fs::Permissions::from_mode(0o600)).unwrap();
    let (_, received) = run_pair(&[src.path().join("a")], &target, &s, &r, 1).await;
    assert!(received.unwrap().is_complete());
    assert_eq!(fs::read(&target).unwrap(), b"content of a");
    assert_eq!(
        fs::metadata(&target).unwrap().permissions().mode() & 0o777,
        0o600
    );
    // With -p, it takes the source's.
    let preserving = ReceiveConfig {
        preserve: true,
        ..r.clone()
    };
    let (_, received) = run_pair(&[src.path().join("a")], &target, &s, &preserving, 1).await;
    assert!(received.unwrap().is_complete());
    assert_eq!(
        fs::metadata(&target).unwrap().permissions().mode() & 0o777,
        0o640
    );
    assert_no_temp(dst.path());
}

/// A destination that is a named pipe or a device (`/dev/null`, say) is refused and left as
/// it is, never replaced by a file.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_device_or_pipe_as_the_destination_is_left_as_it_is() {
    use std::os::unix::fs::FileTypeExt;
    let src = tempfile::tempdir().unwrap();
    let dst = tempfile::tempdir().unwrap();
    write(&src.path().join("a"), b"content of a", 0o644);
    let mut targets = vec![(dst.path().join("fifo"), rustix::fs::FileType::Fifo, 0)];
    if rustix::process::geteuid().is_root() {
        // A null device of its own (1, 3), not the system's.
        let null = rustix::fs::makedev(1, 3);
        targets.push((
            dst.path().join("null"),
            rustix::fs::FileType::CharacterDevice,
            null,
        ));
    }
    let made = targets.len();
    for (target, kind, dev) in targets {
        rustix::fs::mknodat(
            rustix::fs::CWD,
            &target,
            kind,
            rustix::fs::Mode::from_raw_mode(0o666),
            dev,
        )
        .unwrap();
        let (s, r) = configs(false);
        let (_, received) = run_pair(&[src.path().join("a")], &target, &s, &r, 1).await;
        let err = received.unwrap_err();
        assert!(err.to_string().contains("left it as it is"), "{err}");
        let t = fs::symlink_metadata(&target).unwrap().file_type();
        assert!(t.is_fifo() || t.is_char_device(), "{}", target.display());
    }
    // Nothing beside them (names only: opening the pipe would wait for a writer).
    assert_eq!(fs::read_dir(dst.path()).unwrap().count(), made);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn directory_to_new_name_and_into_existing_dir() {
    let src = tempfile::tempdir().unwrap();
    let tree = src.path().join("tree");
    fs::create_dir_all(tree.join("sub")).unwrap();
    write(&tree.join("sub/f"), b"f", 0o644);
    let dst = tempfile::tempdir().unwrap();
    let (s, r) = configs(true);
    // Into an existing directory: dst/tree.
    let (_, received) = run_pair(std::slice::from_ref(&tree), dst.path(), &s, &r, 3).await;
    assert!(received.unwrap().is_complete());
    assert_eq!(fs::read(dst.path().join("tree/sub/f")).unwrap(), b"f");
    // To a new name: dst/copy is the tree.
    let (_, received) = run_pair(
        std::slice::from_ref(&tree),
        &dst.path().join("copy"),
        &s,
        &r,
        3,
    )
    .await;
    assert!(received.unwrap().is_complete());
    assert_eq!(fs::read(dst.path().join("copy/sub/f")).unwrap(), b"f");
    // Trailing slash on the source: same name.
    let mut slashed = tree.into_os_string();
    slashed.push("/");
    let dst2 = tempfile::tempdir().unwrap();
    let (_, received) = run_pair(&[PathBuf::from(slashed)], dst2.path(), &s, &r, 1).await;
    assert!(received.unwrap().is_complete());
    assert_eq!(fs::read(dst2.path().join("tree/sub/f")).unwrap(), b"f");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn several_sources_into_a_directory() {
    let src = tempfile::tempdir().unwrap();
    write(&src.path().join("one"), b"1", 0o644);
    write(&src.path().join("two"), b"22", 0o644);
    let dst = tempfile::tempdir().unwrap();
    let (s, mut r) = configs(false);
    r.target_must_be_dir = true;
    let sources = [src.path().join("one"), src.path().join("two")];
    let (sent, received) = run_pair(&sources, dst.path(), &s, &r, 2).await;
    let sent = sent.unwrap();
    assert_eq!(sent.local.files, 2);
    assert_eq!(sent.peer.files, 2);
    assert!(received.unwrap().is_complete());
    assert_eq!(fs::read(dst.path().join("two")).unwrap(), b"22");
    // The same into a name that is not a directory: refused before anything is written,
    // and the sender hears why.
    let (sent, received) = run_pair(&sources, &dst.path().join("nope"), &s, &r, 2).await;
    let err = received.unwrap_err();
    assert!(matches!(err, Error::InvalidArgument(_)), "{err}");
    let err = sent.unwrap_err();
    assert!(matches!(err, Error::Remote { .. }), "{err}");
    assert!(err.to_string().contains("not a directory"), "{err}");
    assert!(!dst.path().join("nope").exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn directory_without_recursive_is_skipped_and_others_copied() {
    let src = tempfile::tempdir().unwrap();
    fs::create_dir(src.path().join("dir")).unwrap();
    write(&src.path().join("file"), b"x", 0o644);
    let dst = tempfile::tempdir().unwrap();
    let (s, r) = configs(false);
    let sources = [src.path().join("dir"), src.path().join("file")];
    let (sent, received) = run_pair(&sources, dst.path(), &s, &r, 1).await;
    let sent = sent.unwrap();
    let received = received.unwrap();
    assert_eq!(sent.failure_count, 1);
    assert_eq!(sent.failures[0].side, Side::Sender);
    assert!(
        sent.failures[0].message.contains("not a regular file"),
        "{}",
        sent.failures[0].message
    );
    // The receiver was told too, and copied the rest.
    assert_eq!(received.failure_count, 1);
    assert_eq!(received.local.files, 1);
    assert!(dst.path().join("file").exists());
    assert!(!dst.path().join("dir").exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn special_files_and_unreadable_sources_are_reported() {
    let src = tempfile::tempdir().unwrap();
    let tree = src.path().join("t");
    fs::create_dir(&tree).unwrap();
    rustix::fs::mknodat(
        rustix::fs::CWD,
        tree.join("fifo"),
        rustix::fs::FileType::Fifo,
        rustix::fs::Mode::from_raw_mode(0o644),
        0,
    )
    .unwrap();
    write(&tree.join("ok"), b"ok", 0o644);
    let dst = tempfile::tempdir().unwrap();
    let (s, r) = configs(true);
    let sources = [tree.clone(), src.path().join("missing")];
    let (sent, received) = run_pair(&sources, dst.path(), &s, &r, 2).await;
    let sent = sent.unwrap();
    let received = received.unwrap();
    let messages: Vec<_> = sent.failures.iter().map(|f| f.message.clone()).collect();
    assert_eq!(sent.failure_count, 2, "{messages:?}");
    assert!(
        messages.iter().any(|m| m.contains("named pipe")),
        "{messages:?}"
    );
    assert!(
        messages
            .iter()
            .any(|m| m.contains("missing") && m.contains("no such file")),
        "{messages:?}"
    );
    assert!(sent.failures.iter().any(|f| f.code == ErrorCode::NotFound));
    assert_eq!(received.failure_count, 2);
    assert_eq!(fs::read(dst.path().join("t/ok")).unwrap(), b"ok");
    assert!(!dst.path().join("t/fifo").exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn file_that_changes_while_read_is_not_sent_as_good() {
    // A procfs file says it has 0 bytes, then reads as many: it "grew" while being read.
    let dst = tempfile::tempdir().unwrap();
    let (s, r) = configs(false);
    let (sent, received) =
        run_pair(&[PathBuf::from("/proc/self/stat")], dst.path(), &s, &r, 1).await;
    let sent = sent.unwrap();
    assert_eq!(sent.failure_count, 1, "{:?}", sent.failures);
    assert!(
        sent.failures[0]
            .message
            .contains("changed while being read")
    );
    assert_eq!(received.unwrap().local.files, 0);
    assert!(!dst.path().join("stat").exists());
}

/// A file rewritten in place at the same size while it is read has a new mtime: it is
/// reported as changed, not copied torn.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn file_rewritten_in_place_while_read_is_reported_not_copied_torn() {
    use std::os::unix::fs::FileExt;
    let src = tempfile::tempdir().unwrap();
    let path = src.path().join("live");
    let size = 8 << 20;
    write(&path, &vec![7u8; size], 0o644);
    let old = fs::metadata(&path).unwrap().modified().unwrap();
    let dst = tempfile::tempdir().unwrap();
    let (mut s, r) = configs(false);
    // A small pipe with nobody reading yet and 1 MiB in flight at most: the sender stops
    // after its first chunks, with the file open and mostly unread.
    s.max_in_flight = 1 << 20;
    let (a, b) = tokio::io::duplex(64 << 10);
    let progress = Arc::new(Progress::default());
    let sender = tokio::spawn({
        let (path, progress) = (path.clone(), progress.clone());
        async move { fastcp_stream::send(&[path], vec![a], &s, progress).await }
    });
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while progress.current().is_empty() {
        assert!(
            std::time::Instant::now() < deadline,
            "the sender never started"
        );
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    // Rewrite the start in place, same size, and give it a later mtime, as an editor's
    // write would.
    let f = fs::OpenOptions::new().write(true).open(&path).unwrap();
    f.write_all_at(&[9u8; 4096], 0).unwrap();
    f.set_modified(old + std::time::Duration::from_secs(5))
        .unwrap();
    drop(f);
    let received = fastcp_stream::receive(dst.path(), vec![b], &r, progress).await;
    let sent = sender.await.unwrap().unwrap();
    assert_eq!(sent.failure_count, 1, "{:?}", sent.failures);
    assert_eq!(sent.failures[0].code, ErrorCode::SourceChanged);
    assert!(
        sent.failures[0]
            .message
            .contains("changed while being read"),
        "{:?}",
        sent.failures
    );
    assert_eq!(received.unwrap().local.files, 0);
    assert!(!dst.path().join("live").exists());
    assert_no_temp(dst.path());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn file_where_a_directory_exists_is_a_per_entry_error() {
    let src = tempfile::tempdir().unwrap();
    let tree = src.path().join("t");
    fs::create_dir(&tree).unwrap();
    write(&tree.join("clash"), b"file", 0o644);
    write(&tree.join("fine"), b"fine", 0o644);
    let dst = tempfile::tempdir().unwrap();
    fs::create_dir_all(dst.path().join("t/clash/keep")).unwrap();
    let (s, r) = configs(true);
    let (sent, received) = run_pair(&[tree], dst.path(), &s, &r, 2).await;
    let received = received.unwrap();
    assert_eq!(received.failure_count, 1, "{:?}", received.failures);
    assert_eq!(received.failures[0].side, Side::Receiver);
    assert!(
        received.failures[0]
            .message
            .contains("folder with entries is in the way"),
        "{}",
        received.failures[0].message
    );
    // The sender heard about it.
    let sent = sent.unwrap();
    assert_eq!(sent.failure_count, 1);
    assert_eq!(sent.peer.errors, 1);
    assert!(dst.path().join("t/clash/keep").is_dir());
    assert_eq!(fs::read(dst.path().join("t/fine")).unwrap(), b"fine");
    assert_no_temp(dst.path());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn symlinks_replace_existing_entries() {
    let src = tempfile::tempdir().unwrap();
    let tree = src.path().join("t");
    fs::create_dir(&tree).unwrap();
    symlink("new-target", tree.join("link")).unwrap();
    symlink("/abs/target", tree.join("was-file")).unwrap();
    let dst = tempfile::tempdir().unwrap();
    fs::create_dir(dst.path().join("t")).unwrap();
    symlink("old-target", dst.path().join("t/link")).unwrap();
    fs::write(dst.path().join("t/was-file"), b"x").unwrap();
    let (s, r) = configs(true);
    let (_, received) = run_pair(&[tree], dst.path(), &s, &r, 1).await;
    assert!(received.unwrap().is_complete());
    assert_eq!(
        fs::read_link(dst.path().join("t/link")).unwrap(),
        PathBuf::from("new-target")
    );
    assert_eq!(
        fs::read_link(dst.path().join("t/was-file")).unwrap(),
        PathBuf::from("/abs/target")
    );
    assert_no_temp(dst.path());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn follow_links_copies_what_they_point_to() {
    let src = tempfile::tempdir().unwrap();
    let tree = src.path().join("t");
    fs::create_dir_all(tree.join("real")).unwrap();
    write(&tree.join("real/f"), b"f", 0o644);
    symlink("real", tree.join("alias")).unwrap();
    symlink("nowhere", tree.join("dangling")).unwrap();
    symlink(".", tree.join("real/loop")).unwrap();
    let dst = tempfile::tempdir().unwrap();
    let (mut s, r) = configs(true);
    s.follow_links = true;
    let (sent, received) = run_pair(&[tree], dst.path(), &s, &r, 2).await;
    let sent = sent.unwrap();
    received.unwrap();
    assert!(dst.path().join("t/alias").is_dir());
    assert_eq!(fs::read(dst.path().join("t/alias/f")).unwrap(), b"f");
    // A dangling link cannot be followed and stays a link; a loop is reported.
    assert!(
        fs::symlink_metadata(dst.path().join("t/dangling"))
            .unwrap()
            .is_symlink()
    );
    assert!(
        sent.failures.iter().any(|f| f.message.contains("loop")),
        "{:?}",
        sent.failures
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn copy_local_reports_progress() {
    let src = tempfile::tempdir().unwrap();
    let tree = src.path().join("t");
    fs::create_dir(&tree).unwrap();
    for i in 0..10 {
        write(
            &tree.join(format!("f{i}")),
            &pseudo_random(1000 * i, i as u64),
            0o644,
        );
    }
    let dst = tempfile::tempdir().unwrap();
    let (s, r) = configs(true);
    let progress = Arc::new(Progress::default());
    let report = copy_local(
        std::slice::from_ref(&tree),
        dst.path(),
        &s,
        &r,
        3,
        progress.clone(),
    )
    .await
    .unwrap();
    assert!(report.is_complete());
    assert_eq!(report.local.files, 10);
    assert_eq!(report.local.dirs, 1);
    assert_eq!(report.local.bytes, 45_000);
    assert_eq!(report.peer, report.local);
    let p = progress.snapshot();
    assert!(p.walk_complete);
    assert_eq!((p.files_seen, p.bytes_seen), (10, 45_000));
    assert_eq!((p.files_sent, p.bytes_sent), (10, 45_000));
    assert_eq!((p.files_done, p.bytes_done), (10, 45_000));
    assert!(progress.current().starts_with(b"t/f"));
    assert_same_tree(src.path(), dst.path(), false);
}

#[test]
fn walk_lists_directories_before_contents() {
    let src = tempfile::tempdir().unwrap();
    let tree = src.path().join("t");
    fs::create_dir_all(tree.join("b/c")).unwrap();
    write(&tree.join("a"), b"a", 0o644);
    write(&tree.join("b/c/d"), b"dd", 0o644);
    symlink("a", tree.join("l")).unwrap();
    let entries: Vec<_> = walk(&[tree], &WalkConfig::new(true, false))
        .map(Result::unwrap)
        .map(|e| (String::from_utf8(e.wire.to_vec()).unwrap(), e.kind))
        .collect();
    assert_eq!(
        entries,
        [
            ("t".to_string(), EntryKind::Dir),
            ("t/a".into(), EntryKind::File { size: 1 }),
            ("t/b".into(), EntryKind::Dir),
            ("t/b/c".into(), EntryKind::Dir),
            ("t/b/c/d".into(), EntryKind::File { size: 2 }),
            (
                "t/l".into(),
                EntryKind::Symlink {
                    target: bytes::Bytes::from_static(b"a")
                }
            ),
        ]
    );
    // `/` has no name to copy it under.
    let mut root = walk(&[PathBuf::from("/")], &WalkConfig::new(true, false));
    assert!(matches!(root.next(), Some(Err(Error::Unsupported { .. }))));
    assert!(root.next().is_none());
}

#[test]
fn public_types_are_send_and_sync() {
    fn check<T: Send + Sync>() {}
    check::<Error>();
    check::<Progress>();
    check::<fastcp_stream::Report>();
    check::<SendConfig>();
    check::<ReceiveConfig>();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn receiver_learns_the_walk_totals_from_the_sender() {
    let src = tempfile::tempdir().unwrap();
    let dst = tempfile::tempdir().unwrap();
    write(&src.path().join("a"), &[1; 3000], 0o644);
    write(&src.path().join("b"), &[2; 5], 0o644);
    let sources = [src.path().join("a"), src.path().join("b")];
    for totals in [true, false] {
        let (mut s, mut r) = configs(false);
        s.version = if totals { 2 } else { 1 };
        r.version = s.version;
        let target = dst.path().join(format!("totals-{totals}"));
        fs::create_dir(&target).unwrap();
        // Each side its own Progress, as in a pull: the receiver's walk counters can only
        // come from the sender's Totals frame.
        let (a, b): (Vec<_>, Vec<_>) = (0..2).map(|_| tokio::io::duplex(1 << 16)).unzip();
        let theirs = Arc::new(Progress::default());
        let (sent, received) = tokio::join!(
            fastcp_stream::send(&sources, a, &s, Arc::new(Progress::default())),
            fastcp_stream::receive(&target, b, &r, theirs.clone()),
        );
        assert!(sent.unwrap().is_complete());
        assert!(received.unwrap().is_complete());
        let seen = theirs.snapshot();
        if totals {
            assert_eq!((seen.files_seen, seen.bytes_seen), (2, 3005));
            assert!(seen.walk_complete);
        } else {
            assert_eq!((seen.files_seen, seen.bytes_seen), (0, 0));
            assert!(!seen.walk_complete);
        }
        assert_eq!(seen.files_done, 2);
    }
}

/// A tree whose file, symlink and directory have known access and modification times (the
/// sender reads them before it reads the file, which may move its access time).
fn timed_tree(root: &std::path::Path) -> [(PathBuf, (i64, i64)); 3] {
    let now = now_secs();
    let d = root.join("d");
    fs::create_dir_all(&d).unwrap();
    write(&d.join("f"), b"timed", 0o644);
    symlink("f", d.join("l")).unwrap();
    let times = [
        (d.join("f"), (now - 1000, 1_000_000_000)),
        (d.join("l"), (now - 2000, 1_100_000_000)),
        (d.clone(), (now - 3000, 1_200_000_000)),
    ];
    for (path, (atime, mtime)) in &times {
        set_times(path, *atime, *mtime);
    }
    times
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn preserve_keeps_access_times_and_symlink_times() {
    let src = tempfile::tempdir().unwrap();
    let dst = tempfile::tempdir().unwrap();
    let times = timed_tree(src.path());
    let (mut s, mut r) = configs(true);
    s.preserve = true;
    r.preserve = true;
    let report = copy_local(
        &[src.path().join("d")],
        dst.path(),
        &s,
        &r,
        2,
        Arc::new(Progress::default()),
    )
    .await
    .unwrap();
    assert!(report.is_complete());
    for (path, want) in &times {
        let copy = dst.path().join(path.strip_prefix(src.path()).unwrap());
        assert_eq!(times_of(&copy), *want, "{}", copy.display());
    }

    // A version 1 receiver gets neither: mtimes of files and directories only.
    for (path, (atime, mtime)) in &times {
        set_times(path, *atime, *mtime);
    }
    let old = dst.path().join("v1");
    fs::create_dir(&old).unwrap();
    s.version = 1;
    r.version = 1;
    let (sent, received) = run_pair(&[src.path().join("d")], &old, &s, &r, 2).await;
    assert!(sent.unwrap().is_complete());
    assert!(received.unwrap().is_complete());
    let (f, l, d) = (old.join("d/f"), old.join("d/l"), old.join("d"));
    assert_eq!(times_of(&f).1, times[0].1.1);
    assert_ne!(times_of(&f).0, times[0].1.0);
    assert_ne!(times_of(&l), times[1].1);
    assert_eq!(times_of(&d).1, times[2].1.1);
}

/// A reader that hands over up to `size` bytes a read, whatever the receiver's read limit:
/// what a reader of whole records does, whose records straddle the frames.
struct Records {
    inner: ReadHalf<DuplexStream>,
    size: usize,
}

impl ReadInto for Records {
    async fn read_into(&mut self, buf: &mut BytesMut, _limit: usize) -> std::io::Result<usize> {
        self.inner.read_buf(&mut (&mut *buf).limit(self.size)).await
    }

    fn room(&self) -> usize {
        self.size
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_of_whole_records_past_its_limit() {
    let src = tempfile::tempdir().unwrap();
    let tree = src.path().join("tree");
    build_mixed(&tree);
    write(
        &tree.join("big"),
        &pseudo_random((5 << 20) + 12345, 9),
        0o644,
    );
    let (s, r) = configs(true);
    let sources = [tree.clone()];
    for (n, size) in [(1, 300_007), (3, 4093), (2, 1 << 20)] {
        let dst = tempfile::tempdir().unwrap();
        let mut senders = Vec::new();
        let mut readers = Vec::new();
        let mut replies = Vec::new();
        for _ in 0..n {
            let (ours, theirs) = tokio::io::duplex(256 << 10);
            let (read, reply) = tokio::io::split(theirs);
            senders.push(ours);
            readers.push(Records { inner: read, size });
            replies.push(reply);
        }
        let mut replies = replies.into_iter();
        let reply = replies.next().unwrap();
        let progress = Arc::new(Progress::default());
        let target = dst.path().join("tree");
        let (sent, received) = tokio::join!(
            fastcp_stream::send(&sources, senders, &s, progress.clone()),
            fastcp_stream::receive_from(&target, readers, reply, &r, progress),
        );
        assert!(
            sent.unwrap().is_complete(),
            "{n} streams, records of {size}"
        );
        assert!(
            received.unwrap().is_complete(),
            "{n} streams, records of {size}"
        );
        assert_same_tree(&tree, &target, false);
        assert_no_temp(dst.path());
    }
}

/// The quick check: a second copy with `skip_unchanged` sends no file whose size and mtime
/// match the receiver's; a changed file (size, or mtime alone) is sent again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn skip_unchanged_sends_only_what_changed() {
    let src = tempfile::tempdir().unwrap();
    let tree = src.path().join("t");
    fs::create_dir_all(tree.join("sub")).unwrap();
    for i in 0..20 {
        write(&tree.join(format!("f{i}")), &vec![i as u8; 1000 + i], 0o644);
    }
    write(&tree.join("sub/big"), &vec![3u8; 3 << 20], 0o644);
    let dst = tempfile::tempdir().unwrap();
    let (mut s, mut r) = configs(true);
    s.preserve = true;
    r.preserve = true;
    s.skip_unchanged = true;
    r.skip_unchanged = true;
    let sources = [tree.clone()];

    let (sent, received) = run_pair(&sources, dst.path(), &s, &r, 2).await;
    let (sent, received) = (sent.unwrap(), received.unwrap());
    assert!(sent.is_complete(), "{:?}", sent.failures);
    assert_eq!((sent.local.files, sent.files_skipped), (21, 0));
    assert_eq!(received.local.files, 21);

    let (sent, received) = run_pair(&sources, dst.path(), &s, &r, 2).await;
    let (sent, received) = (sent.unwrap(), received.unwrap());
    assert_eq!((sent.local.files, sent.local.bytes), (0, 0));
    assert_eq!(sent.files_skipped, 21);
    assert_eq!(
        sent.bytes_skipped,
        (0..20).map(|i| 1000 + i).sum::<u64>() + (3 << 20)
    );
    assert_eq!((received.local.files, received.files_skipped), (0, 21));

    // One file grows; another keeps its size but gets a new mtime.
    write(&tree.join("f1"), &vec![9u8; 5000], 0o644);
    let f2 = fs::OpenOptions::new()
        .write(true)
        .open(tree.join("f2"))
        .unwrap();
    f2.set_modified(std::time::SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1 << 30))
        .unwrap();
    drop(f2);
    let (sent, received) = run_pair(&sources, dst.path(), &s, &r, 2).await;
    let (sent, received) = (sent.unwrap(), received.unwrap());
    assert_eq!(sent.local.files, 2);
    assert_eq!(sent.files_skipped, 19);
    assert_eq!(received.local.files, 2);
    assert_eq!(fs::read(dst.path().join("t/f1")).unwrap(), vec![9u8; 5000]);
    assert_eq!(
        fs::metadata(dst.path().join("t/f2"))
            .unwrap()
            .modified()
            .unwrap(),
        fs::metadata(tree.join("f2")).unwrap().modified().unwrap()
    );
    assert_no_temp(dst.path());
}

/// A probe without the quick check agreed is a protocol error, and a probe through a
/// symlink the sender sent is refused like any entry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_probe_nobody_agreed_to_is_refused() {
    let src = tempfile::tempdir().unwrap();
    write(&src.path().join("f"), b"x", 0o644);
    let dst = tempfile::tempdir().unwrap();
    let (mut s, r) = configs(false);
    s.skip_unchanged = true;
    let (_, received) = run_pair(&[src.path().join("f")], dst.path(), &s, &r, 1).await;
    let err = received.unwrap_err();
    assert!(err.to_string().contains("unexpected Probe frame"), "{err}");
}

/// Mirroring: what a sent directory holds beyond what was sent goes, files, directories and
/// symlinks alike; a symlink is removed as a link and never followed out of the destination;
/// nothing beside the copied tree is touched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delete_removes_extras_beneath_the_destination_only() {
    let src = tempfile::tempdir().unwrap();
    let tree = src.path().join("t");
    fs::create_dir_all(tree.join("keep")).unwrap();
    write(&tree.join("a"), b"a", 0o644);
    write(&tree.join("keep/b"), b"b", 0o644);
    let dst = tempfile::tempdir().unwrap();
    let outside = tempfile::tempdir().unwrap();
    write(&outside.path().join("precious"), b"do not touch", 0o644);
    let (mut s, mut r) = configs(true);
    r.delete = true;
    s.preserve = true;
    r.preserve = true;
    let (sent, received) = run_pair(std::slice::from_ref(&tree), dst.path(), &s, &r, 1).await;
    sent.unwrap();
    assert_eq!(received.unwrap().local.deleted, 0);

    let t = dst.path().join("t");
    write(&t.join("stale"), b"old", 0o644);
    fs::create_dir_all(t.join("gone/deep/er")).unwrap();
    write(&t.join("gone/deep/er/f"), b"x", 0o644);
    write(&t.join("keep/stale"), b"old", 0o644);
    symlink(outside.path(), t.join("link-to-outside-dir")).unwrap();
    symlink(
        outside.path().join("precious"),
        t.join("keep/link-to-outside-file"),
    )
    .unwrap();
    write(&dst.path().join("beside"), b"not part of the copy", 0o644);
    // Another copy's temp file and a partial file kept for --resume are not extras.
    write(&t.join(".a.fastcp-0badcafe"), b"live", 0o600);
    write(&t.join("keep/.b.fastcp-partial"), b"kept", 0o600);

    let (sent, received) = run_pair(std::slice::from_ref(&tree), dst.path(), &s, &r, 2).await;
    sent.unwrap();
    let received = received.unwrap();
    assert!(received.is_complete(), "{:?}", received.failures);
    // stale, gone + deep + er + f, keep/stale, and the two links.
    assert_eq!(received.local.deleted, 8);
    let mut left: Vec<String> = walkdir(&t);
    left.sort();
    assert_eq!(
        left,
        [
            ".a.fastcp-0badcafe",
            "a",
            "keep",
            "keep/.b.fastcp-partial",
            "keep/b"
        ]
    );
    assert_eq!(
        fs::read(outside.path().join("precious")).unwrap(),
        b"do not touch"
    );
    assert!(dst.path().join("beside").exists());
}

/// With `delete`, the temp files a killed copy left go from every folder mirrored, even
/// where nothing is written (the sweep before a write would not reach them), and so do the
/// partial files of files the source no longer has: a fresh temp file, one a live copy
/// holds locked, and a partial file of a file still in the source or held by a live copy
/// stay. They are not counted as deleted entries.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delete_takes_the_temp_files_a_killed_copy_left() {
    let src = tempfile::tempdir().unwrap();
    let tree = src.path().join("t");
    fs::create_dir_all(tree.join("sub")).unwrap();
    write(&tree.join("sub/b"), b"b", 0o644);
    let dst = tempfile::tempdir().unwrap();
    let (mut s, mut r) = configs(true);
    (s.preserve, s.skip_unchanged) = (true, true);
    (r.preserve, r.skip_unchanged, r.delete) = (true, true, true);
    let (sent, received) = run_pair(std::slice::from_ref(&tree), dst.path(), &s, &r, 1).await;
    sent.unwrap();
    received.unwrap();

    let sub = dst.path().join("t/sub");
    let hour_ago = now_secs() - 3600;
    let [stale, fresh, held, partial, gone, gone_held] = [
        ".x.fastcp-0123abcd",
        ".y.fastcp-89abcdef",
        ".z.fastcp-0badcafe",
        ".b.fastcp-partial",
        ".gone.fastcp-partial",
        ".gone2.fastcp-partial",
    ]
    .map(|n| sub.join(n));
    for p in [&stale, &fresh, &held, &partial, &gone, &gone_held] {
        write(p, b"left", 0o600);
    }
    for p in [&stale, &held, &partial] {
        set_mtime(p, hour_ago, 0);
    }
    let locks = [&held, &gone_held].map(|p| {
        let f = fs::File::open(p).unwrap();
        rustix::fs::flock(&f, rustix::fs::FlockOperation::LockExclusive).unwrap();
        f
    });

    let (sent, received) = run_pair(std::slice::from_ref(&tree), dst.path(), &s, &r, 1).await;
    sent.unwrap();
    let received = received.unwrap();
    assert!(received.is_complete(), "{:?}", received.failures);
    assert_eq!(received.local.deleted, 0);
    assert!(!stale.exists(), "the killed copy's temp file stayed");
    assert!(
        !gone.exists(),
        "the partial file of a file gone from the source stayed"
    );
    for p in [&fresh, &held, &partial, &gone_held] {
        assert!(p.exists(), "{} was removed", p.display());
    }
    drop(locks);
}

/// The sweep before a copy's first temp file in a folder takes what killed copies left, by
/// name; a file of the user's named the same way stays: one the copy skipped as unchanged,
/// and one the rules exclude.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sweep_spares_the_users_files_named_like_temp_files() {
    let src = tempfile::tempdir().unwrap();
    let tree = src.path().join("t");
    fs::create_dir_all(&tree).unwrap();
    write(&tree.join(".notes.fastcp-deadbeef"), b"notes", 0o644);
    write(&tree.join("a"), b"a", 0o644);
    let hour_ago = now_secs() - 3600;
    set_mtime(&tree.join(".notes.fastcp-deadbeef"), hour_ago, 0);
    let dst = tempfile::tempdir().unwrap();
    let (mut s, mut r) = configs(true);
    (s.preserve, s.skip_unchanged) = (true, true);
    (r.preserve, r.skip_unchanged) = (true, true);
    let mut filter = fastcp_stream::Filter::default();
    filter.exclude(".keep.*").unwrap();
    let filter = Some(Arc::new(filter));
    (s.filter, r.filter) = (filter.clone(), filter);
    let (sent, received) = run_pair(std::slice::from_ref(&tree), dst.path(), &s, &r, 1).await;
    sent.unwrap();
    received.unwrap();

    let t = dst.path().join("t");
    let [notes, kept, left] = [
        ".notes.fastcp-deadbeef",
        ".keep.fastcp-0123abcd",
        ".x.fastcp-89abcdef",
    ]
    .map(|n| t.join(n));
    write(&kept, b"excluded", 0o600);
    write(&left, b"left", 0o600);
    set_mtime(&kept, hour_ago, 0);
    set_mtime(&left, hour_ago, 0);
    // `a` changed: its temp file sweeps the folder.
    write(&tree.join("a"), b"a, changed", 0o644);
    let (sent, received) = run_pair(std::slice::from_ref(&tree), dst.path(), &s, &r, 1).await;
    sent.unwrap();
    let received = received.unwrap();
    assert!(received.is_complete(), "{:?}", received.failures);
    assert_eq!(fs::read(t.join("a")).unwrap(), b"a, changed");
    assert_eq!(
        fs::read(&notes).unwrap(),
        b"notes",
        "the skipped file was taken"
    );
    assert_eq!(
        fs::read(&kept).unwrap(),
        b"excluded",
        "the excluded file was taken"
    );
    assert!(!left.exists(), "the killed copy's temp file stayed");
}

/// When the sender cannot read everything, nothing is deleted: what it missed would look
/// deleted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delete_is_skipped_when_the_sender_had_errors() {
    let src = tempfile::tempdir().unwrap();
    let tree = src.path().join("t");
    fs::create_dir_all(&tree).unwrap();
    write(&tree.join("a"), b"a", 0o644);
    let dst = tempfile::tempdir().unwrap();
    fs::create_dir_all(dst.path().join("t")).unwrap();
    write(&dst.path().join("t/stale"), b"old", 0o644);
    let (s, mut r) = configs(true);
    r.delete = true;
    // A second source that cannot be read: the sender reports an error.
    let sources = [tree.clone(), src.path().join("missing")];
    let (_, received) = run_pair(&sources, dst.path(), &s, &r, 1).await;
    let received = received.unwrap();
    assert_eq!(received.local.deleted, 0);
    assert!(dst.path().join("t/stale").exists());
    assert!(
        received
            .failures
            .iter()
            .any(|f| f.message.contains("nothing was deleted")),
        "{:?}",
        received.failures
    );
}

/// Relative paths of everything beneath `root`, '/'-separated, without following links.
fn walkdir(root: &std::path::Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in fs::read_dir(&d).unwrap() {
            let e = e.unwrap();
            let p = e.path();
            out.push(p.strip_prefix(root).unwrap().to_string_lossy().into_owned());
            if e.file_type().unwrap().is_dir() {
                stack.push(p);
            }
        }
    }
    out
}

/// A sparse file stays sparse: blocks of zeros (4 KiB) are left as holes on the receiver,
/// within a chunk too, and the copy reads back the same bytes. The source's holes are found
/// on read and do not travel: only the data is sent, in units of 64 KiB.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sparse_file_stays_sparse() {
    use std::os::unix::fs::{FileExt, MetadataExt};
    let src = tempfile::tempdir().unwrap();
    let path = src.path().join("sparse");
    let f = fs::File::create(&path).unwrap();
    f.set_len(64 << 20).unwrap();
    f.write_all_at(&vec![7u8; 1 << 20], 10 << 20).unwrap();
    drop(f);
    // A byte here and there, none on a chunk's edge: each takes a block, not its chunk.
    let scattered = src.path().join("scattered");
    let f = fs::File::create(&scattered).unwrap();
    f.set_len(8 << 20).unwrap();
    for at in [0, 3_000_000, 6_000_000, (8 << 20) - 1] {
        f.write_all_at(&[9], at).unwrap();
    }
    drop(f);
    // Chunks on block boundaries, and chunks that are not; with a peer of protocol version
    // 7, which knows no holes: its zeros travel, and are still left as holes.
    for (chunk_size, version) in [(1 << 20, 8), (1_000_003, 8), (1 << 20, 7)] {
        let dst = tempfile::tempdir().unwrap();
        let (mut s, mut r) = configs(true);
        s.chunk_size = chunk_size;
        (s.version, r.version) = (version, version);
        let sources = [src.path().to_path_buf()];
        let (sent, received) = run_pair(&sources, dst.path(), &s, &r, 2).await;
        let sent = sent.unwrap();
        assert!(received.unwrap().is_complete());
        // 72 MiB of files, 1 MiB and 4 bytes of data: the MiB, and for each byte the
        // 64 KiB unit it lies in (two, at most, on the file system's blocks), whatever
        // the chunks.
        if version == 7 {
            assert_eq!(sent.bytes_sent, 72 << 20);
        } else {
            assert!(
                sent.bytes_sent <= (1 << 20) + 4 * (128 << 10),
                "{chunk_size}-byte chunks: {} bytes sent",
                sent.bytes_sent
            );
        }
        let top = dst.path().join(src.path().file_name().unwrap());
        for (name, data, size) in [("sparse", 1 << 20, 64 << 20), ("scattered", 4, 8 << 20)] {
            let copy = top.join(name);
            let meta = fs::metadata(&copy).unwrap();
            assert_eq!(meta.len(), size);
            let allocated = meta.blocks() * 512;
            // What the data takes, a few blocks more for the file system's own.
            assert!(
                allocated <= data.max(4 * 4096) + (64 << 10),
                "{name}, {chunk_size}-byte chunks: {allocated} bytes allocated for {data} bytes of data"
            );
            assert!(fs::read(&copy).unwrap() == fs::read(src.path().join(name)).unwrap());
        }
    }
}

/// A big file reports its progress chunk by chunk between its start and its end: bytes done
/// growing, below its size, then `Done`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_big_file_reports_progress_between_start_and_done() {
    use fastcp_stream::{Event, EventSink};
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("big");
    let size = 5 * (1 << 20) + 77;
    fs::write(&src, pseudo_random(size, 3)).unwrap();
    let dest = dir.path().join("dest");
    fs::create_dir(&dest).unwrap();
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let sink = EventSink::new({
        let seen = seen.clone();
        move |e: &Event| seen.lock().unwrap().push(e.clone())
    });
    let (send, receive) = configs(false);
    let report = copy_local(
        &[src],
        &dest,
        &send,
        &receive,
        3,
        Arc::new(Progress::with_events(sink)),
    )
    .await
    .unwrap();
    assert!(report.is_complete());
    let seen = seen.lock().unwrap().clone();
    assert!(
        matches!(seen.first(), Some(Event::Started { .. })),
        "{seen:?}"
    );
    assert!(matches!(seen.last(), Some(Event::Done { bytes, .. }) if *bytes == size as u64));
    let done: Vec<u64> = seen
        .iter()
        .filter_map(|e| match e {
            Event::Progress { done, size: s, .. } => {
                assert_eq!(*s, size as u64);
                Some(*done)
            }
            _ => None,
        })
        .collect();
    // Six chunks of 1 MiB at most: five reports before the last one completes the file.
    assert_eq!(done.len(), 5, "{seen:?}");
    assert!(done.windows(2).all(|w| w[0] < w[1]), "{done:?}");
    assert!(done.iter().all(|&d| d < size as u64));
}

/// A send given a walk started ahead copies what that walk found; a second send with the
/// same config (the walk is taken) walks for itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_send_with_a_walk_started_ahead_copies_the_tree() {
    let src = tempfile::tempdir().unwrap();
    let tree = src.path().join("t");
    fs::create_dir_all(tree.join("sub")).unwrap();
    write(&tree.join("a"), b"a", 0o644);
    write(&tree.join("sub/b"), b"b", 0o644);
    let (mut s, r) = configs(true);
    let sources = [tree.clone()];
    s.walk_ahead = Some(fastcp_stream::WalkAhead::start(&sources, &s.walk_config()));
    for round in 0..2 {
        let dst = tempfile::tempdir().unwrap();
        let (sent, received) = run_pair(&sources, dst.path(), &s, &r, 2).await;
        assert_eq!(sent.unwrap().peer.files, 2, "round {round}");
        assert!(received.unwrap().is_complete(), "round {round}");
        assert_eq!(fs::read(dst.path().join("t/a")).unwrap(), b"a");
        assert_eq!(fs::read(dst.path().join("t/sub/b")).unwrap(), b"b");
    }
}

/// A walk cut short by a panic (here in a filter predicate) is an error the receiver hears
/// of: a mirror then deletes nothing, as after any error of the sender's. With a walk
/// started ahead as without.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_walk_that_panics_deletes_nothing() {
    for ahead in [false, true] {
        let src = tempfile::tempdir().unwrap();
        let tree = src.path().join("t");
        fs::create_dir_all(&tree).unwrap();
        for name in ["a", "b", "c"] {
            write(&tree.join(name), name.as_bytes(), 0o644);
        }
        let dst = tempfile::tempdir().unwrap();
        fs::create_dir_all(dst.path().join("t")).unwrap();
        write(&dst.path().join("t/c"), b"c, kept", 0o644);
        write(&dst.path().join("t/stale"), b"old", 0o644);
        let (mut s, mut r) = configs(true);
        r.delete = true;
        let filter = fastcp_stream::Filter::default().with_predicate(Arc::new(|wire, _| {
            assert!(!wire.ends_with(b"/b"), "a predicate that panics");
            true
        }));
        s.filter = Some(Arc::new(filter));
        let sources = [tree.clone()];
        if ahead {
            s.walk_ahead = Some(fastcp_stream::WalkAhead::start(&sources, &s.walk_config()));
        }
        let (sent, received) = run_pair(&sources, dst.path(), &s, &r, 1).await;
        let sent = sent.unwrap();
        // Its own failure, and the receiver's word that it deleted nothing.
        let sides: Vec<_> = sent.failures.iter().map(|f| f.side).collect();
        assert_eq!(
            sides,
            [fastcp_stream::Side::Sender, fastcp_stream::Side::Receiver],
            "ahead {ahead}: {:?}",
            sent.failures
        );
        assert_eq!(sent.failures[1].message, fastcp_stream::NOTHING_DELETED);
        let received = received.unwrap();
        assert_eq!(received.local.deleted, 0, "ahead {ahead}");
        assert_eq!(fs::read(dst.path().join("t/a")).unwrap(), b"a");
        assert_eq!(fs::read(dst.path().join("t/c")).unwrap(), b"c, kept");
        assert!(dst.path().join("t/stale").exists(), "ahead {ahead}");
    }
}

/// Without content hashes (`hash_content` off on both sides, for a channel that
/// authenticates every byte) a copy still arrives whole; the sender then folds only its
/// ranges, so a receiver that hashes content refuses its files, and the other way round. A
/// copy that resumes hashes content on both sides whatever `hash_content` says.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn content_hashing_is_off_only_when_both_sides_agree() {
    let src = tempfile::tempdir().unwrap();
    let tree = src.path().join("t");
    fs::create_dir(&tree).unwrap();
    fs::write(tree.join("small"), b"hello world").unwrap();
    let big: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
    fs::write(tree.join("big"), &big).unwrap();
    let configs = |send_hashes: bool, receive_hashes: bool, resume: bool| {
        let (mut send, mut receive) = configs(true);
        send.chunk_size = 64 << 10;
        send.hash_content = send_hashes;
        receive.hash_content = receive_hashes;
        if resume {
            send.skip_unchanged = true;
            send.resume = true;
            send.preserve = true;
            receive.skip_unchanged = true;
            receive.resume = true;
            receive.preserve = true;
        }
        (send, receive)
    };
    for (send_hashes, receive_hashes, resume, ok) in [
        (false, false, false, true),
        (true, true, false, true),
        (false, true, false, false),
        (true, false, false, false),
        (false, false, true, true),
    ] {
        let case = format!("sender {send_hashes}, receiver {receive_hashes}, resume {resume}");
        let (send, receive) = configs(send_hashes, receive_hashes, resume);
        let dst = tempfile::tempdir().unwrap();
        let (sent, received) =
            run_pair(std::slice::from_ref(&tree), dst.path(), &send, &receive, 2).await;
        if ok {
            sent.unwrap_or_else(|e| panic!("{case}: {e}"));
            received.unwrap_or_else(|e| panic!("{case}: {e}"));
            assert_eq!(fs::read(dst.path().join("t/big")).unwrap(), big, "{case}");
            assert_eq!(
                fs::read(dst.path().join("t/small")).unwrap(),
                b"hello world"
            );
        } else {
            let err = received.expect_err(&case);
            assert!(matches!(err, Error::Integrity { .. }), "{case}: {err}");
            for name in ["big", "small"] {
                assert!(!dst.path().join("t").join(name).exists(), "{case}: {name}");
            }
        }
    }
}

/// A destination that must be a folder (a trailing '/') but does not exist yet is made by the
/// one source when `target_may_be_new_dir` allows it and the source is a folder; a file sent
/// there fails and writes nothing, and so does any source without the allowance or where a
/// file has the name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_folder_destination_is_made_by_one_folder_only() {
    let src = tempfile::tempdir().unwrap();
    let tree = src.path().join("tree");
    fs::create_dir_all(tree.join("sub")).unwrap();
    write(&tree.join("sub/f"), b"f", 0o644);
    write(&src.path().join("file"), b"x", 0o644);
    let (s, mut r) = configs(true);
    r.target_must_be_dir = true;
    r.target_may_be_new_dir = true;
    let dst = tempfile::tempdir().unwrap();
    let new = dst.path().join("new/");
    let (_, received) = run_pair(std::slice::from_ref(&tree), &new, &s, &r, 2).await;
    assert!(received.unwrap().is_complete());
    assert_eq!(fs::read(dst.path().join("new/sub/f")).unwrap(), b"f");
    // Now it exists: the next copy goes beneath it.
    let (_, received) = run_pair(std::slice::from_ref(&tree), &new, &s, &r, 2).await;
    assert!(received.unwrap().is_complete());
    assert_eq!(fs::read(dst.path().join("new/tree/sub/f")).unwrap(), b"f");

    let other = dst.path().join("other/");
    let (_, received) = run_pair(&[src.path().join("file")], &other, &s, &r, 2).await;
    let err = received.unwrap_err();
    assert!(err.to_string().contains("not a directory"), "{err}");
    assert!(!dst.path().join("other").exists());

    write(&dst.path().join("plain"), b"p", 0o644);
    let (_, received) = run_pair(
        std::slice::from_ref(&tree),
        &dst.path().join("plain/"),
        &s,
        &r,
        2,
    )
    .await;
    assert!(
        received
            .unwrap_err()
            .to_string()
            .contains("not a directory")
    );
    assert_eq!(fs::read(dst.path().join("plain")).unwrap(), b"p");

    r.target_may_be_new_dir = false;
    let (_, received) = run_pair(std::slice::from_ref(&tree), &other, &s, &r, 2).await;
    assert!(
        received
            .unwrap_err()
            .to_string()
            .contains("not a directory")
    );
    assert!(!dst.path().join("other").exists());
    assert_no_temp(dst.path());
}

/// A writer that notes the length of every part it is given.
struct Noting<W> {
    inner: W,
    parts: Arc<std::sync::Mutex<Vec<usize>>>,
}

impl<W: fastcp_stream::WriteFrom> fastcp_stream::WriteFrom for Noting<W> {
    async fn write_part(&mut self, part: &mut bytes::Bytes) -> std::io::Result<()> {
        self.parts.lock().unwrap().push(part.len());
        self.inner.write_part(part).await
    }

    async fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush().await
    }

    async fn shutdown(&mut self) -> std::io::Result<()> {
        self.inner.shutdown().await
    }
}

/// Without a content hash, small files reach a stream's writer gathered, many whole files to
/// a part of 256 KiB or more, rather than in parts of their own; a file that fails while it
/// is read (a procfs file that reads longer than it said) leaves the files gathered around
/// it whole. With a content hash, each file goes in parts of its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn small_files_travel_gathered_when_no_content_hash_is_needed() {
    let src = tempfile::tempdir().unwrap();
    let (before, after) = (src.path().join("before"), src.path().join("after"));
    for (dir, files) in [(&before, 300u32), (&after, 40)] {
        fs::create_dir(dir).unwrap();
        for i in 0..files {
            let body: Vec<u8> = (0..1000 + i).map(|b| (b * 7 + i) as u8).collect();
            fs::write(dir.join(format!("f{i}")), body).unwrap();
        }
    }
    let sources = [
        before.clone(),
        PathBuf::from("/proc/self/stat"),
        after.clone(),
    ];
    for hash in [false, true] {
        let dst = tempfile::tempdir().unwrap();
        let (mut s, mut r) = configs(true);
        (s.hash_content, r.hash_content) = (hash, hash);
        let parts = Arc::new(std::sync::Mutex::new(Vec::new()));
        let (near, far) = tokio::io::duplex(256 << 10);
        let (reply, w) = tokio::io::split(near);
        let writer = Noting {
            inner: fastcp_stream::ByteWriter::new(w),
            parts: parts.clone(),
        };
        let progress = Arc::new(Progress::default());
        let (sent, received) = tokio::join!(
            fastcp_stream::send_to(&sources, reply, vec![writer], &s, progress.clone()),
            fastcp_stream::receive(dst.path(), vec![far], &r, progress),
        );
        let sent = sent.unwrap();
        assert_eq!(sent.failure_count, 1, "{:?}", sent.failures);
        assert!(
            sent.failures[0]
                .message
                .contains("changed while being read")
        );
        assert_eq!(received.unwrap().local.files, 340);
        assert_same_tree(&before, &dst.path().join("before"), false);
        assert_same_tree(&after, &dst.path().join("after"), false);
        assert!(!dst.path().join("stat").exists());
        let parts = parts.lock().unwrap();
        let biggest = parts.iter().copied().max().unwrap();
        if hash {
            assert!(biggest < 16 << 10, "hash {hash}: {biggest}");
            assert!(parts.len() > 340, "hash {hash}: {} parts", parts.len());
        } else {
            // Gathered until a part is full (256 KiB) or the producer waits for the walk,
            // which hands it entries 64 at a time: under load a part may be cut at any such
            // batch, so at least one part holds a batch's 64 files.
            assert!(biggest >= 48 << 10, "hash {hash}: {biggest}");
            assert!(parts.len() < 40, "hash {hash}: {} parts", parts.len());
        }
    }
}
