//! A hostile or broken sender: crafted frames written straight into the receiver's streams.
//! Each case must end with a clear error, leave nothing outside the destination, and leave
//! no partial or temporary file behind.

mod common;

use std::fs;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use common::{assert_no_temp, scan};
use fastcp_proto::{
    Data, DirEntry, ErrorCode, FileEnd, FileEntry, Frame, Meta, PieceEntry, Summary, SymlinkEntry,
    encode,
};
use fastcp_stream::{Error, Progress, ReceiveConfig, Report, receive};
use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};

/// A destination inside a sandbox, with a sibling directory that must stay empty.
struct Sandbox {
    _dir: tempfile::TempDir,
    dest: PathBuf,
    outside: PathBuf,
}

impl Sandbox {
    fn new() -> Sandbox {
        let dir = tempfile::tempdir().unwrap();
        let dest = dir.path().join("dest");
        let outside = dir.path().join("outside");
        fs::create_dir(&dest).unwrap();
        fs::create_dir(&outside).unwrap();
        Sandbox {
            _dir: dir,
            dest,
            outside,
        }
    }

    /// Nothing was written outside the destination, and no temp file is left inside.
    fn assert_contained(&self) {
        assert!(
            scan(&self.outside).is_empty(),
            "written outside: {:?}",
            scan(&self.outside).keys().collect::<Vec<_>>()
        );
        let parent = self.dest.parent().unwrap();
        let mut names: Vec<_> = fs::read_dir(parent)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        names.sort();
        assert_eq!(names, ["dest", "outside"]);
        assert_no_temp(&self.dest);
    }
}

fn meta() -> Meta {
    Meta {
        atime: None,
        mode: 0o644,
        mtime: 1_600_000_000,
        mtime_nsec: 0,
    }
}

fn file(id: u64, path: &[u8], size: u64) -> Frame {
    Frame::File(FileEntry {
        id,
        path: Bytes::copy_from_slice(path),
        size,
        meta: meta(),
    })
}

fn data(id: u64, offset: u64, bytes: &[u8]) -> Frame {
    Frame::Data(Data {
        id,
        offset,
        bytes: Bytes::copy_from_slice(bytes),
    })
}

fn end(id: u64, content: &[u8]) -> Frame {
    Frame::FileEnd(FileEnd {
        id,
        hash: fastcp_stream::whole_file_checksum(fastcp_proto::PROTOCOL_VERSION, content),
    })
}

/// The sender's word that it gave up on the file at `path` (it changed while read).
fn gave_up(path: &'static [u8]) -> Frame {
    Frame::Error(fastcp_proto::ErrorFrame {
        code: ErrorCode::Io,
        fatal: false,
        path: Bytes::from_static(path),
        message: format!(
            "{}: file changed while being read; not copied",
            String::from_utf8_lossy(path)
        ),
    })
}

fn dir(path: &[u8]) -> Frame {
    Frame::Dir(DirEntry {
        path: Bytes::copy_from_slice(path),
        meta: Meta {
            mode: 0o755,
            ..meta()
        },
    })
}

fn link(path: &[u8], target: &[u8]) -> Frame {
    Frame::Symlink(SymlinkEntry {
        times: None,
        path: Bytes::copy_from_slice(path),
        target: Bytes::copy_from_slice(target),
    })
}

fn done(files: u64, dirs: u64, symlinks: u64, bytes: u64) -> Frame {
    Frame::Done(summary(files, dirs, symlinks, bytes))
}

/// The sender's totals for a stream with no errors.
fn summary(files: u64, dirs: u64, symlinks: u64, bytes: u64) -> Summary {
    Summary {
        files,
        dirs,
        symlinks,
        bytes,
        errors: 0,
        deleted: 0,
    }
}

fn wire(frames: &[Frame]) -> Vec<u8> {
    let mut b = BytesMut::new();
    for f in frames {
        encode(f, &mut b);
    }
    b.to_vec()
}

/// What the peer saw on stream 0, and what `receive` returned.
struct Outcome {
    result: Result<Report, Error>,
    replies: Vec<Frame>,
}

/// Runs `receive` into `dest` over one stream per entry of `streams`, writing each stream's
/// bytes and then closing it if `close` is set (else keeping it open until receive returns).
async fn run(dest: &Path, config: ReceiveConfig, streams: Vec<Vec<u8>>, close: bool) -> Outcome {
    let (ours, theirs): (Vec<DuplexStream>, Vec<DuplexStream>) =
        streams.iter().map(|_| tokio::io::duplex(1 << 20)).unzip();
    let progress = Arc::new(Progress::default());
    let dest = dest.to_path_buf();
    let recv = tokio::spawn(async move { receive(&dest, theirs, &config, progress).await });
    let mut ours = ours.into_iter();
    let mut first = ours.next().unwrap();
    let mut others = Vec::new();
    let mut streams = streams.into_iter();
    first
        .write_all(&streams.next().unwrap())
        .await
        .unwrap_or(());
    for (mut s, bytes) in ours.zip(streams) {
        s.write_all(&bytes).await.unwrap_or(());
        others.push(s);
    }
    if close {
        first.shutdown().await.unwrap_or(());
        for s in &mut others {
            s.shutdown().await.unwrap_or(());
        }
        drop(others);
    }
    let result = tokio::time::timeout(Duration::from_secs(60), recv)
        .await
        .expect("receive hung")
        .unwrap();
    // Everything the receiver replied on stream 0.
    let mut raw = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), first.read_to_end(&mut raw)).await;
    let mut buf = BytesMut::from(&raw[..]);
    let mut decoder = fastcp_proto::Decoder::new(1 << 20);
    let mut replies = Vec::new();
    while let Ok(Some(f)) = decoder.decode(&mut buf) {
        replies.push(f);
    }
    Outcome { result, replies }
}

fn recursive() -> ReceiveConfig {
    ReceiveConfig {
        recursive: true,
        ..ReceiveConfig::default()
    }
}

/// The error, checked to be fatal and reported to the peer as such.
fn fatal(outcome: Outcome) -> Error {
    let err = match outcome.result {
        Ok(report) => panic!("expected an error, got {report:?}"),
        Err(e) => e,
    };
    let told = outcome
        .replies
        .iter()
        .any(|f| matches!(f, Frame::Error(e) if e.fatal));
    assert!(told, "the sender was not told: {:?}", outcome.replies);
    err
}

/// croc CVE-2023-43619 and rsync CVE-2024-12087: a sender's names that climb out of the
/// destination (`..`, absolute paths), or are empty, `.`, unnormalised or hold a NUL, are
/// refused for every kind of entry, and nothing is written anywhere.
#[tokio::test]
async fn unsafe_paths_are_refused() {
    let cases: &[&[u8]] = &[
        b"../x",
        b"/abs",
        b"/tmp/abs",
        b"a/../../x",
        b"",
        b".",
        b"..",
        b"a/./b",
        b"a//b",
        b"a/",
        b"nul\0byte",
    ];
    for &path in cases {
        for frame in [file(0, path, 1), dir(path), link(path, b"target")] {
            let sb = Sandbox::new();
            let stream = wire(&[
                frame.clone(),
                data(0, 0, b"x"),
                end(0, b"x"),
                done(1, 0, 0, 1),
            ]);
            let err = fatal(run(&sb.dest, recursive(), vec![stream], true).await);
            assert!(
                matches!(err, Error::UnsafePath { .. }),
                "{:?} {}: {err}",
                String::from_utf8_lossy(path),
                frame.name()
            );
            assert!(err.is_peer_fault());
            assert!(err.to_string().contains("unsafe path"), "{err}");
            sb.assert_contained();
            assert!(scan(&sb.dest).is_empty());
        }
    }
}

#[tokio::test]
async fn symlink_then_write_through_it_is_refused() {
    let sb = Sandbox::new();
    let target = sb.outside.as_os_str().as_encoded_bytes().to_vec();
    let stream = wire(&[
        link(b"evil", &target),
        file(0, b"evil/pwned", 5),
        data(0, 0, b"owned"),
        end(0, b"owned"),
        done(1, 0, 1, 5),
    ]);
    let err = fatal(run(&sb.dest, recursive(), vec![stream], true).await);
    assert!(matches!(err, Error::UnsafePath { .. }), "{err}");
    assert!(err.to_string().contains("evil"), "{err}");
    sb.assert_contained();
}

#[tokio::test]
async fn a_symlink_beside_files_already_checked_is_still_refused_as_a_parent() {
    // Files in "d" first, so that "d"'s prefixes are known good; then a symlink in "d", and
    // a file through it.
    let sb = Sandbox::new();
    let target = sb.outside.as_os_str().as_encoded_bytes().to_vec();
    let stream = wire(&[
        dir(b"d"),
        file(0, b"d/a", 1),
        data(0, 0, b"a"),
        end(0, b"a"),
        link(b"d/l", &target),
        file(1, b"d/b", 1),
        data(1, 0, b"b"),
        end(1, b"b"),
        file(2, b"d/l/pwned", 5),
        data(2, 0, b"owned"),
        end(2, b"owned"),
        done(3, 1, 1, 7),
    ]);
    let err = fatal(run(&sb.dest, recursive(), vec![stream], true).await);
    assert!(matches!(err, Error::UnsafePath { .. }), "{err}");
    assert!(err.to_string().contains("d/l"), "{err}");
    sb.assert_contained();
}

#[tokio::test]
async fn symlink_over_a_directory_with_entries_is_refused() {
    // The reverse order, across two streams: entries into "d", then "d" as a symlink.
    let sb = Sandbox::new();
    let target = sb.outside.as_os_str().as_encoded_bytes().to_vec();
    let s0 = wire(&[
        dir(b"d"),
        file(0, b"d/x", 1),
        data(0, 0, b"x"),
        end(0, b"x"),
        link(b"d", &target),
        file(1, b"d/y", 1),
        data(1, 0, b"y"),
        end(1, b"y"),
        done(2, 1, 1, 2),
    ]);
    let err = fatal(run(&sb.dest, recursive(), vec![s0], true).await);
    assert!(matches!(err, Error::UnsafePath { .. }), "{err}");
    sb.assert_contained();
}

#[tokio::test]
async fn existing_symlink_in_destination_is_not_followed() {
    let sb = Sandbox::new();
    symlink(&sb.outside, sb.dest.join("evil")).unwrap();
    let stream = wire(&[
        file(0, b"evil/pwned", 5),
        data(0, 0, b"owned"),
        end(0, b"owned"),
        file(1, b"fine", 2),
        data(1, 0, b"ok"),
        end(1, b"ok"),
        done(2, 0, 0, 7),
    ]);
    let outcome = run(&sb.dest, recursive(), vec![stream], true).await;
    let report = outcome.result.expect("copied");
    // The source has a folder where the destination has a link: the folder takes the link's
    // place (as rsync does), and nothing goes through the link.
    assert_eq!(report.failure_count, 0, "{:?}", report.failures);
    assert!(fs::symlink_metadata(sb.dest.join("evil")).unwrap().is_dir());
    assert_eq!(fs::read(sb.dest.join("evil/pwned")).unwrap(), b"owned");
    assert_eq!(fs::read(sb.dest.join("fine")).unwrap(), b"ok");
    sb.assert_contained();
}

#[tokio::test]
async fn data_past_the_end_is_refused() {
    let sb = Sandbox::new();
    let stream = wire(&[
        file(0, b"f", 4),
        data(0, 0, b"1234"),
        data(0, 4, b"5"),
        end(0, b"12345"),
        done(1, 0, 0, 5),
    ]);
    let err = fatal(run(&sb.dest, recursive(), vec![stream], true).await);
    assert!(matches!(err, Error::Protocol(_)), "{err}");
    assert!(err.to_string().contains("past the end"), "{err}");
    assert!(!sb.dest.join("f").exists());
    sb.assert_contained();
}

#[tokio::test]
async fn overlapping_chunks_are_refused() {
    let sb = Sandbox::new();
    let stream = wire(&[
        file(0, b"f", 8),
        data(0, 0, b"abcd"),
        data(0, 2, b"cdef"),
        end(0, b"abcdefgh"),
        done(1, 0, 0, 8),
    ]);
    let err = fatal(run(&sb.dest, recursive(), vec![stream], true).await);
    assert!(matches!(err, Error::Protocol(_)), "{err}");
    assert!(err.to_string().contains("overlapping"), "{err}");
    assert!(!sb.dest.join("f").exists());
    sb.assert_contained();
}

fn hole(id: u64, offset: u64, len: u64) -> Frame {
    Frame::Hole(fastcp_proto::Hole { id, offset, len })
}

/// A hole is checked as data is: within the file, never over another range, only from a
/// peer of version 8, and folded into the checksum; a file made whole with one reads as
/// zeros there.
#[tokio::test]
async fn holes_are_checked_as_data_is() {
    let mut sum = fastcp_stream::FileChecksum::new(8, 8);
    sum.add(0, b"abcd");
    sum.hole(4, 4);
    let hole_end = Frame::FileEnd(FileEnd {
        id: 0,
        hash: sum.finish().unwrap(),
    });
    let sb = Sandbox::new();
    let stream = wire(&[
        file(0, b"f", 8),
        data(0, 0, b"abcd"),
        hole(0, 4, 4),
        hole_end.clone(),
        done(1, 0, 0, 4),
    ]);
    let outcome = run(&sb.dest, recursive(), vec![stream], true).await;
    assert!(outcome.result.unwrap().is_complete());
    assert_eq!(fs::read(sb.dest.join("f")).unwrap(), b"abcd\0\0\0\0");
    assert_no_temp(&sb.dest);

    let refused = [
        (vec![hole(0, 4, 5)], "past the end"),
        (vec![hole(0, 2, 4)], "overlapping"),
        (vec![hole(0, 4, u64::MAX - 3)], "past the end"),
    ];
    for (holes, why) in refused {
        let sb = Sandbox::new();
        let mut frames = vec![file(0, b"f", 8), data(0, 0, b"abcd")];
        frames.extend(holes);
        frames.extend([hole_end.clone(), done(1, 0, 0, 4)]);
        let err = fatal(run(&sb.dest, recursive(), vec![wire(&frames)], true).await);
        assert!(matches!(err, Error::Protocol(_)), "{err}");
        assert!(err.to_string().contains(why), "{why}: {err}");
        assert!(!sb.dest.join("f").exists());
        sb.assert_contained();
    }

    // From a peer that agreed on version 7, a hole is an unexpected frame.
    let sb = Sandbox::new();
    let stream = wire(&[
        file(0, b"f", 8),
        data(0, 0, b"abcd"),
        hole(0, 4, 4),
        hole_end,
        done(1, 0, 0, 4),
    ]);
    let config = ReceiveConfig {
        version: 7,
        ..recursive()
    };
    let err = fatal(run(&sb.dest, config, vec![stream], true).await);
    assert!(err.to_string().contains("unexpected Hole"), "{err}");
    assert!(!sb.dest.join("f").exists());
    sb.assert_contained();

    // A wrong checksum: the hole's range is in it.
    let sb = Sandbox::new();
    let stream = wire(&[
        file(0, b"f", 8),
        data(0, 0, b"abcd"),
        hole(0, 4, 4),
        end(0, b"abcd\0\0\0\0"),
        done(1, 0, 0, 4),
    ]);
    let outcome = run(&sb.dest, recursive(), vec![stream], true).await;
    assert!(
        matches!(outcome.result, Err(Error::Integrity { .. })),
        "{:?}",
        outcome.result.map(|_| ())
    );
    assert!(!sb.dest.join("f").exists());
    sb.assert_contained();
}

fn piece(id: u64, path: &[u8], size: u64, offset: u64, len: u64) -> Frame {
    let Frame::File(file) = file(id, path, size) else {
        unreachable!()
    };
    Frame::Piece(PieceEntry { file, offset, len })
}

fn piece_end(id: u64, size: u64, offset: u64, content: &[u8]) -> Frame {
    let mut c = fastcp_stream::FileChecksum::piece(size, offset, content.len() as u64);
    c.add(offset, content);
    Frame::FileEnd(FileEnd {
        id,
        hash: c.finish().unwrap(),
    })
}

/// Pieces of a file from two sessions make it whole; until the second, nothing is under
/// its name.
#[tokio::test]
async fn pieces_from_two_sessions_make_one_file() {
    let sb = Sandbox::new();
    let first = wire(&[
        piece(0, b"f", 8, 4, 4),
        data(0, 4, b"efgh"),
        piece_end(0, 8, 4, b"efgh"),
        done(1, 0, 0, 4),
    ]);
    run(&sb.dest, recursive(), vec![first], true)
        .await
        .result
        .unwrap();
    assert!(!sb.dest.join("f").exists());
    let second = wire(&[
        piece(0, b"f", 8, 0, 4),
        data(0, 0, b"abcd"),
        piece_end(0, 8, 0, b"abcd"),
        done(1, 0, 0, 4),
    ]);
    let report = run(&sb.dest, recursive(), vec![second], true)
        .await
        .result
        .unwrap();
    assert_eq!(report.local.files, 1);
    assert_eq!(fs::read(sb.dest.join("f")).unwrap(), b"abcdefgh");
    sb.assert_contained();
}

/// A piece's bytes outside its range, a piece past its file's end, a bad checksum and a
/// piece to a receiver of an older protocol: each refused, nothing under the file's name.
#[tokio::test]
async fn pieces_out_of_bounds_are_refused() {
    let sb = Sandbox::new();
    let outside = wire(&[
        piece(0, b"f", 8, 4, 4),
        data(0, 0, b"abcd"),
        piece_end(0, 8, 0, b"abcd"),
        done(1, 0, 0, 4),
    ]);
    let err = fatal(run(&sb.dest, recursive(), vec![outside], true).await);
    assert!(err.to_string().contains("outside the piece"), "{err}");
    let tampered = wire(&[
        piece(0, b"f", 8, 0, 4),
        data(0, 0, b"abcd"),
        piece_end(0, 8, 0, b"abce"),
        done(1, 0, 0, 4),
    ]);
    let err = fatal(run(&sb.dest, recursive(), vec![tampered], true).await);
    assert!(matches!(err, Error::Integrity { .. }), "{err}");
    // The other half, whole: the tampered half was never recorded.
    let other = wire(&[
        piece(0, b"f", 8, 4, 4),
        data(0, 4, b"efgh"),
        piece_end(0, 8, 4, b"efgh"),
        done(1, 0, 0, 4),
    ]);
    run(&sb.dest, recursive(), vec![other], true)
        .await
        .result
        .unwrap();
    assert!(!sb.dest.join("f").exists());
    let old = ReceiveConfig {
        version: 5,
        ..recursive()
    };
    let piece_to_old = wire(&[piece(0, b"g", 8, 0, 4), data(0, 0, b"abcd")]);
    let err = fatal(run(&sb.dest, old, vec![piece_to_old], true).await);
    assert!(err.to_string().contains("unexpected Piece"), "{err}");
    assert!(!sb.dest.join("f").exists() && !sb.dest.join("g").exists());
}

/// A session that sends the 4 bytes `content` at `offset` of the 8-byte file `f`, whole.
fn piece_of(offset: u64, content: &[u8]) -> Vec<u8> {
    wire(&[
        piece(0, b"f", 8, offset, 4),
        data(0, offset, content),
        piece_end(0, 8, offset, content),
        done(1, 0, 0, 4),
    ])
}

/// A range already on the work file's record is not written again: a retried run's copy of
/// it, damaged or not, cannot touch verified bytes.
#[tokio::test]
async fn a_piece_already_on_record_is_not_written_again() {
    let sb = Sandbox::new();
    let ok = |outcome: Outcome| outcome.result.unwrap();
    ok(run(&sb.dest, recursive(), vec![piece_of(0, b"abcd")], true).await);
    let damaged = wire(&[
        piece(0, b"f", 8, 0, 4),
        data(0, 0, b"XXXX"),
        piece_end(0, 8, 0, b"abcd"),
        done(1, 0, 0, 4),
    ]);
    ok(run(&sb.dest, recursive(), vec![damaged], true).await);
    ok(run(&sb.dest, recursive(), vec![piece_of(4, b"efgh")], true).await);
    assert_eq!(fs::read(sb.dest.join("f")).unwrap(), b"abcdefgh");
    sb.assert_contained();
}

/// A piece that fails as a protocol error leaves the work file, and what other runs put on
/// its record, in place: the file completes with the right bytes.
#[tokio::test]
async fn a_failed_piece_keeps_the_other_runs_pieces() {
    let sb = Sandbox::new();
    let ok = |outcome: Outcome| outcome.result.unwrap();
    ok(run(&sb.dest, recursive(), vec![piece_of(0, b"abcd")], true).await);
    let overlapping = wire(&[
        piece(0, b"f", 8, 4, 4),
        data(0, 4, b"ef"),
        data(0, 4, b"ef"),
    ]);
    // Refused (as overlapping chunks, or as a stream that ended before the piece did).
    fatal(run(&sb.dest, recursive(), vec![overlapping], true).await);
    ok(run(&sb.dest, recursive(), vec![piece_of(4, b"efgh")], true).await);
    assert_eq!(fs::read(sb.dest.join("f")).unwrap(), b"abcdefgh");
    sb.assert_contained();
}

#[tokio::test]
async fn wrong_hash_leaves_nothing() {
    let sb = Sandbox::new();
    // An existing file of that name must survive intact.
    fs::write(sb.dest.join("victim"), b"original").unwrap();
    let stream = wire(&[
        file(0, b"victim", 8),
        data(0, 0, b"tampered"),
        end(0, b"expected"),
        done(1, 0, 0, 8),
    ]);
    let err = fatal(run(&sb.dest, recursive(), vec![stream], true).await);
    assert!(matches!(err, Error::Integrity { .. }), "{err}");
    assert!(err.to_string().contains("victim"), "{err}");
    assert_eq!(fs::read(sb.dest.join("victim")).unwrap(), b"original");
    // A new file must not exist at all.
    let sb = Sandbox::new();
    let stream = wire(&[
        file(0, b"new", 8),
        data(0, 4, b"ered"),
        data(0, 0, b"tamp"),
        end(0, b"expected"),
        done(1, 0, 0, 8),
    ]);
    let err = fatal(run(&sb.dest, recursive(), vec![stream], true).await);
    assert!(matches!(err, Error::Integrity { .. }), "{err}");
    assert!(!sb.dest.join("new").exists());
    sb.assert_contained();
}

/// A receiver that does not hash content (`hash_content: false`, for a sender in its own
/// process) still checks each file's ranges against the sender's: the ranges as sent are
/// accepted, a file whose ranges differ from what its `FileEnd` says is not kept.
#[tokio::test]
async fn a_receiver_without_content_hashes_still_checks_the_ranges() {
    let config = ReceiveConfig {
        hash_content: false,
        ..recursive()
    };
    let ranges = |parts: &[(u64, &[u8])], size| {
        let mut c = fastcp_stream::FileChecksum::ranges_only(size);
        for (offset, bytes) in parts {
            c.add(*offset, bytes);
        }
        Frame::FileEnd(FileEnd {
            id: 0,
            hash: c.finish().unwrap(),
        })
    };
    let sb = Sandbox::new();
    let stream = wire(&[
        file(0, b"f", 11),
        data(0, 6, b"world"),
        data(0, 0, b"hello "),
        ranges(&[(0, b"hello "), (6, b"world")], 11),
        done(1, 0, 0, 11),
    ]);
    let outcome = run(&sb.dest, config.clone(), vec![stream], true).await;
    outcome.result.unwrap();
    assert_eq!(fs::read(sb.dest.join("f")).unwrap(), b"hello world");
    sb.assert_contained();

    // Sent in one range, announced as two.
    let sb = Sandbox::new();
    let stream = wire(&[
        file(0, b"f", 11),
        data(0, 0, b"hello world"),
        ranges(&[(0, b"hello "), (6, b"world")], 11),
        done(1, 0, 0, 11),
    ]);
    let err = fatal(run(&sb.dest, config, vec![stream], true).await);
    assert!(matches!(err, Error::Integrity { .. }), "{err}");
    assert!(!sb.dest.join("f").exists());
    sb.assert_contained();
}

#[tokio::test]
async fn duplicate_file_ids_are_refused() {
    let sb = Sandbox::new();
    let stream = wire(&[
        file(7, b"a", 1),
        data(7, 0, b"a"),
        end(7, b"a"),
        file(7, b"b", 1),
        data(7, 0, b"b"),
        end(7, b"b"),
        done(2, 0, 0, 2),
    ]);
    let err = fatal(run(&sb.dest, recursive(), vec![stream], true).await);
    assert!(matches!(err, Error::Protocol(_)), "{err}");
    assert!(err.to_string().contains("id 7"), "{err}");
    sb.assert_contained();
    // The same id on two streams at once.
    let sb = Sandbox::new();
    let s0 = wire(&[
        file(3, b"a", 1),
        data(3, 0, b"a"),
        end(3, b"a"),
        done(1, 0, 0, 1),
    ]);
    let s1 = wire(&[
        file(3, b"b", 1),
        data(3, 0, b"b"),
        end(3, b"b"),
        done(1, 0, 0, 1),
    ]);
    let err = fatal(run(&sb.dest, recursive(), vec![s0, s1], true).await);
    assert!(matches!(err, Error::Protocol(_)), "{err}");
    sb.assert_contained();
}

#[tokio::test]
async fn data_for_an_unknown_id_then_eof() {
    // One stream: the entry can never come.
    let sb = Sandbox::new();
    let stream = wire(&[data(99, 0, b"orphan")]);
    let err = fatal(run(&sb.dest, recursive(), vec![stream], true).await);
    assert!(matches!(err, Error::Protocol(_)), "{err}");
    assert!(err.to_string().contains("99"), "{err}");
    sb.assert_contained();
    // Two streams: the other one ends properly, so the entry can never come either.
    let sb = Sandbox::new();
    let s0 = wire(&[data(99, 0, b"orphan")]);
    let s1 = wire(&[done(0, 0, 0, 0)]);
    let err = fatal(run(&sb.dest, recursive(), vec![s0, s1], true).await);
    assert!(matches!(err, Error::Protocol(_)), "{err}");
    sb.assert_contained();
    // Two streams, the other one cut: a closed connection.
    let sb = Sandbox::new();
    let s0 = wire(&[data(99, 0, b"orphan")]);
    let s1 = wire(&[]);
    let err = run(&sb.dest, recursive(), vec![s0, s1], true)
        .await
        .result
        .unwrap_err();
    assert!(err.is_disconnect() || err.is_peer_fault(), "{err}");
    sb.assert_contained();
}

#[tokio::test]
async fn cut_stream_mid_file_leaves_no_partial_file() {
    let sb = Sandbox::new();
    fs::write(sb.dest.join("big"), b"previous version").unwrap();
    let chunk = vec![0x5a; 100_000];
    let stream = wire(&[
        file(0, b"small", 2),
        data(0, 0, b"ok"),
        end(0, b"ok"),
        file(1, b"big", 1_000_000),
        data(1, 0, &chunk),
        data(1, 100_000, &chunk),
    ]);
    // Cut in the middle of a frame, too.
    let mut cut = stream.clone();
    cut.extend_from_slice(&wire(&[data(1, 200_000, &chunk)])[..50_000]);
    for bytes in [stream, cut] {
        let outcome = run(&sb.dest, recursive(), vec![bytes], true).await;
        let err = fatal(outcome);
        assert!(err.is_disconnect(), "{err}");
        assert!(matches!(err, Error::ConnectionClosed { .. }), "{err}");
        assert_eq!(fs::read(sb.dest.join("big")).unwrap(), b"previous version");
        sb.assert_contained();
    }
}

/// Folders made on demand, for entries that came before their own, take their modes when
/// their entries come: a copy cut before its end does not leave them private.
#[tokio::test]
async fn a_cut_copy_leaves_its_folders_with_their_modes() {
    use std::os::unix::fs::PermissionsExt;
    let sb = Sandbox::new();
    let umask = {
        let probe = sb.dest.join("probe");
        fs::create_dir(&probe).unwrap();
        let mode = fs::metadata(&probe).unwrap().permissions().mode();
        fs::remove_dir(&probe).unwrap();
        !mode & 0o777
    };
    let (mut ours, theirs) = tokio::io::duplex(1 << 20);
    let dest = sb.dest.clone();
    let recv = tokio::spawn(async move {
        let progress = Arc::new(Progress::default());
        receive(&dest, vec![theirs], &recursive(), progress).await
    });
    let first = wire(&[
        file(0, b"d/sub/f", 2),
        data(0, 0, b"ok"),
        end(0, b"ok"),
        dir(b"d"),
        dir(b"d/sub"),
        file(1, b"d/big", 1_000_000),
        data(1, 0, &[7; 1000]),
    ]);
    ours.write_all(&first).await.unwrap();
    // The copy goes on while its folders' entries are handled; then it is cut.
    let mode = |d: &str| {
        fs::metadata(sb.dest.join(d))
            .map(|m| m.permissions().mode() & 0o777)
            .unwrap_or(0)
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while (mode("d") != 0o755 & !umask || mode("d/sub") != 0o755 & !umask)
        && std::time::Instant::now() < deadline
    {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    drop(ours);
    let result = tokio::time::timeout(Duration::from_secs(60), recv)
        .await
        .expect("receive hung")
        .unwrap();
    assert!(result.is_err_and(|e| e.is_disconnect()));
    for d in ["d", "d/sub"] {
        assert_eq!(mode(d), 0o755 & !umask, "{d}: {:o}", mode(d));
    }
    assert_eq!(fs::read(sb.dest.join("d/sub/f")).unwrap(), b"ok");
    sb.assert_contained();
}

/// The folder named as the destination is never replaced: a hostile sender answering a
/// copy of a folder's contents (`host:src/.` into `dest`, with `--delete`) with a link for
/// its top does not put a link in the destination's place.
#[tokio::test]
async fn the_named_destination_is_never_replaced_by_a_link() {
    let sb = Sandbox::new();
    let outside = sb.outside.to_str().unwrap().as_bytes().to_vec();
    let stream = wire(&[link(b"src", &outside), done(0, 0, 1, 0)]);
    let config = ReceiveConfig {
        contents: true,
        delete: true,
        ..recursive()
    };
    let _ = run(&sb.dest, config, vec![stream], true).await;
    assert!(fs::symlink_metadata(&sb.dest).unwrap().is_dir());
    sb.assert_contained();
}

/// With `--delete`, a folder in a file's way goes only when nothing in it is excluded by
/// the rules (as `--delete` keeps what they exclude); else it stays, reported.
#[tokio::test]
async fn a_folder_in_the_way_with_excluded_entries_stays() {
    let sb = Sandbox::new();
    fs::create_dir(sb.dest.join("x")).unwrap();
    fs::write(sb.dest.join("x/keep.o"), b"kept").unwrap();
    let mut filter = fastcp_stream::Filter::default();
    filter.exclude("*.o").unwrap();
    let config = ReceiveConfig {
        delete: true,
        filter: Some(Arc::new(filter)),
        ..recursive()
    };
    let stream = wire(&[
        file(0, b"x", 2),
        data(0, 0, b"ok"),
        end(0, b"ok"),
        done(1, 0, 0, 2),
    ]);
    let report = run(&sb.dest, config, vec![stream], true)
        .await
        .result
        .unwrap();
    assert_eq!(report.failure_count, 1, "{:?}", report.failures);
    assert_eq!(fs::read(sb.dest.join("x/keep.o")).unwrap(), b"kept");
    sb.assert_contained();
}

/// `max_delete` takes the folders in one order, each before what it holds, whatever order
/// their entries arrived in (over several streams a subfolder's may come first): the same
/// extras go in every run, and a dry run can tell which.
#[tokio::test]
async fn max_delete_takes_folders_in_walk_order_whatever_their_arrival() {
    let sb = Sandbox::new();
    fs::create_dir_all(sb.dest.join("d/sub")).unwrap();
    fs::write(sb.dest.join("d/x"), b"extra").unwrap();
    fs::write(sb.dest.join("d/sub/x"), b"extra").unwrap();
    let config = ReceiveConfig {
        delete: true,
        max_delete: Some(1),
        ..recursive()
    };
    let stream = wire(&[dir(b"d/sub"), dir(b"d"), done(0, 2, 0, 0)]);
    let report = run(&sb.dest, config, vec![stream], true)
        .await
        .result
        .unwrap();
    assert_eq!(report.local.deleted, 1);
    assert!(
        !sb.dest.join("d/x").exists(),
        "the folder's own extra goes first"
    );
    assert!(sb.dest.join("d/sub/x").exists(), "its subfolder's stays");
    sb.assert_contained();
}

fn resuming() -> ReceiveConfig {
    ReceiveConfig {
        recursive: true,
        skip_unchanged: true,
        resume: true,
        ..ReceiveConfig::default()
    }
}

/// With `--resume` a cut leaves the big file's bytes in its partial file, what was still
/// queued for the disk included, and nothing under its final name.
#[tokio::test]
async fn a_cut_with_resume_keeps_the_partial_file_only() {
    let sb = Sandbox::new();
    let chunk = vec![0x5a; 1 << 20];
    let stream = wire(&[file(0, b"big", 8 << 20), data(0, 0, &chunk)]);
    let err = fatal(run(&sb.dest, resuming(), vec![stream], true).await);
    assert!(err.is_disconnect(), "{err}");
    assert!(!sb.dest.join("big").exists());
    let partial = sb.dest.join(".big.fastcp-partial");
    assert!(fs::read(&partial).unwrap()[..1 << 20] == chunk[..], "kept");
    // Without resume the temp file goes.
    fs::remove_file(&partial).unwrap();
    let stream = wire(&[file(0, b"big", 8 << 20), data(0, 0, &chunk)]);
    fatal(run(&sb.dest, recursive(), vec![stream], true).await);
    sb.assert_contained();
}

/// A `Keep` stands for bytes the receiver's partial file holds, and only for a block the
/// receiver offered: one that names another block, or comes with nothing offered, fails the
/// file, and nothing takes its final name.
#[tokio::test]
async fn a_keep_for_a_block_not_offered_is_refused() {
    let sb = Sandbox::new();
    let keep = |offset, len| Frame::Keep(fastcp_proto::Keep { id: 0, offset, len });
    for k in [keep(0, 1 << 20), keep(1 << 20, 1 << 20), keep(0, 8 << 20)] {
        let stream = wire(&[file(0, b"big", 8 << 20), k]);
        let err = fatal(run(&sb.dest, resuming(), vec![stream], false).await);
        assert!(err.to_string().contains("not offered"), "{err}");
        assert!(!sb.dest.join("big").exists());
    }
    // Without resume a `Keep` is not a frame a receiver takes at all.
    let stream = wire(&[file(0, b"big", 8 << 20), keep(0, 1 << 20)]);
    let err = fatal(run(&sb.dest, recursive(), vec![stream], true).await);
    assert!(err.to_string().contains("Keep"), "{err}");
    sb.assert_contained();
}

/// The quick check and `Keep` came with protocol version 4: from a peer that agreed on an
/// older one (whose files carry BLAKE3 checksums), a probe is an unexpected frame, even with
/// a partial file there to offer, and nothing panics.
#[tokio::test]
async fn a_probe_and_keep_from_a_version_2_peer_are_refused() {
    let sb = Sandbox::new();
    fs::write(sb.dest.join(".big.fastcp-partial"), vec![7u8; 8 << 20]).unwrap();
    let stream = wire(&[
        Frame::Probe(fastcp_proto::Probe {
            id: 0,
            path: Bytes::from_static(b"big"),
            size: 8 << 20,
            mtime: 1,
            mtime_nsec: 0,
            mode: None,
        }),
        file(0, b"big", 8 << 20),
        Frame::Keep(fastcp_proto::Keep {
            id: 0,
            offset: 0,
            len: 1 << 20,
        }),
    ]);
    let config = ReceiveConfig {
        version: 2,
        ..resuming()
    };
    let err = fatal(run(&sb.dest, config, vec![stream], false).await);
    assert!(matches!(err, Error::Protocol(_)), "{err}");
    assert!(err.to_string().contains("unexpected Probe"), "{err}");
    assert!(!sb.dest.join("big").exists());
    // The partial file is as it was, and nothing else is left.
    let partial = sb.dest.join(".big.fastcp-partial");
    assert_eq!(fs::read(&partial).unwrap(), vec![7u8; 8 << 20]);
    fs::remove_file(&partial).unwrap();
    sb.assert_contained();
}

#[tokio::test]
async fn file_end_before_all_bytes_then_done() {
    let sb = Sandbox::new();
    let stream = wire(&[
        file(0, b"short", 10),
        data(0, 0, b"12345"),
        end(0, b"1234567890"),
        done(1, 0, 0, 5),
    ]);
    let err = fatal(run(&sb.dest, recursive(), vec![stream], true).await);
    assert!(matches!(err, Error::Protocol(_)), "{err}");
    assert!(err.to_string().contains("5 of 10 bytes"), "{err}");
    assert!(!sb.dest.join("short").exists());
    sb.assert_contained();
}

#[tokio::test]
async fn done_with_wrong_counts_is_refused() {
    let sb = Sandbox::new();
    let stream = wire(&[
        file(0, b"f", 1),
        data(0, 0, b"x"),
        end(0, b"x"),
        done(2, 0, 0, 1),
    ]);
    let err = fatal(run(&sb.dest, recursive(), vec![stream], true).await);
    assert!(matches!(err, Error::Protocol(_)), "{err}");
    assert!(err.to_string().contains("do not match"), "{err}");
    sb.assert_contained();
}

#[tokio::test]
async fn second_top_level_name_when_dest_is_not_a_dir() {
    let sb = Sandbox::new();
    let target = sb.dest.join("renamed");
    let stream = wire(&[
        file(0, b"one", 1),
        data(0, 0, b"1"),
        end(0, b"1"),
        file(1, b"two", 1),
        data(1, 0, b"2"),
        end(1, b"2"),
        done(2, 0, 0, 2),
    ]);
    let err = fatal(run(&target, recursive(), vec![stream], true).await);
    assert!(matches!(err, Error::Protocol(_)), "{err}");
    assert!(err.to_string().contains("not a directory"), "{err}");
    assert!(!sb.dest.join("two").exists());
    sb.assert_contained();
}

#[tokio::test]
async fn pull_refuses_names_not_asked_for() {
    // CVE-2019-6111: the client asked for "wanted" and the server sends something else.
    let sb = Sandbox::new();
    let config = ReceiveConfig {
        recursive: true,
        expected_top_level: Some(vec![b"wanted".to_vec()]),
        ..ReceiveConfig::default()
    };
    let stream = wire(&[
        file(0, b"wanted", 1),
        data(0, 0, b"w"),
        end(0, b"w"),
        file(1, b".bashrc", 4),
        data(1, 0, b"evil"),
        end(1, b"evil"),
        done(2, 0, 0, 5),
    ]);
    let err = fatal(run(&sb.dest, config.clone(), vec![stream], true).await);
    assert!(matches!(err, Error::UnsafePath { .. }), "{err}");
    assert!(err.to_string().contains("not requested"), "{err}");
    assert!(!sb.dest.join(".bashrc").exists());
    sb.assert_contained();
    // Below a requested name anything goes.
    let sb = Sandbox::new();
    let stream = wire(&[
        dir(b"wanted"),
        file(0, b"wanted/inner", 1),
        data(0, 0, b"i"),
        end(0, b"i"),
        done(1, 1, 0, 1),
    ]);
    let report = run(&sb.dest, config, vec![stream], true)
        .await
        .result
        .unwrap();
    assert!(report.is_complete());
    assert_eq!(fs::read(sb.dest.join("wanted/inner")).unwrap(), b"i");
}

#[tokio::test]
async fn directory_without_recursive_is_refused() {
    let sb = Sandbox::new();
    let stream = wire(&[dir(b"d"), done(0, 1, 0, 0)]);
    let err = fatal(run(&sb.dest, ReceiveConfig::default(), vec![stream], true).await);
    assert!(matches!(err, Error::Protocol(_)), "{err}");
    assert!(scan(&sb.dest).is_empty());
    sb.assert_contained();
}

#[tokio::test]
async fn target_must_be_dir_fails_before_writing() {
    let sb = Sandbox::new();
    let config = ReceiveConfig {
        target_must_be_dir: true,
        ..recursive()
    };
    for target in [sb.dest.join("missing"), sb.dest.join("a-file")] {
        if target.ends_with("a-file") {
            fs::write(&target, b"keep").unwrap();
        }
        let stream = wire(&[
            file(0, b"x", 1),
            data(0, 0, b"x"),
            end(0, b"x"),
            done(1, 0, 0, 1),
        ]);
        let err = fatal(run(&target, config.clone(), vec![stream], true).await);
        assert!(matches!(err, Error::InvalidArgument(_)), "{err}");
        assert!(err.to_string().contains("not a directory"), "{err}");
    }
    assert_eq!(fs::read(sb.dest.join("a-file")).unwrap(), b"keep");
    assert_eq!(scan(&sb.dest).len(), 1);
    sb.assert_contained();
}

#[tokio::test]
async fn garbage_bytes_are_a_decode_error() {
    let sb = Sandbox::new();
    let err = fatal(run(&sb.dest, recursive(), vec![vec![0x7f, 0, 0, 0, 0]], true).await);
    assert!(matches!(err, Error::Decode { .. }), "{err}");
    assert!(err.is_peer_fault());
    // A frame announcing more than the cap is refused before it is buffered.
    let mut huge = vec![fastcp_proto::kind::DATA];
    huge.extend_from_slice(&u32::MAX.to_be_bytes());
    let err = fatal(run(&sb.dest, recursive(), vec![huge], false).await);
    assert!(matches!(err, Error::Decode { .. }), "{err}");
    sb.assert_contained();
}

#[tokio::test]
async fn sender_error_frames_are_reported_and_abandon_the_file() {
    // The sender announces a file, sends part of it, then gives up on it.
    let sb = Sandbox::new();
    let stream = wire(&[
        file(0, b"changing", 10),
        data(0, 0, b"12345"),
        gave_up(b"changing"),
        file(1, b"stable", 2),
        data(1, 0, b"ok"),
        end(1, b"ok"),
        Frame::Done(Summary {
            errors: 1,
            ..summary(2, 0, 0, 7)
        }),
    ]);
    let report = run(&sb.dest, recursive(), vec![stream], true)
        .await
        .result
        .unwrap();
    assert_eq!(report.failure_count, 1);
    assert_eq!(report.failures[0].side, fastcp_stream::Side::Sender);
    assert!(!sb.dest.join("changing").exists());
    assert_eq!(fs::read(sb.dest.join("stable")).unwrap(), b"ok");
    assert_eq!(report.local.files, 1);
    sb.assert_contained();
}

/// Two entries in flight under one name, and the sender gives up on one: that one is
/// dropped, the other lands, and the copy goes on.
#[tokio::test]
async fn an_error_for_a_name_two_files_share_abandons_one() {
    let sb = Sandbox::new();
    let stream = wire(&[
        file(0, b"twice", 4),
        file(1, b"twice", 4),
        gave_up(b"twice"),
        data(0, 0, b"wxyz"),
        end(0, b"wxyz"),
        data(1, 0, b"abcd"),
        end(1, b"abcd"),
        Frame::Done(Summary {
            errors: 1,
            ..summary(2, 0, 0, 8)
        }),
    ]);
    let report = run(&sb.dest, recursive(), vec![stream], true)
        .await
        .result
        .unwrap();
    assert_eq!(report.failure_count, 1);
    assert_eq!(report.local.files, 1);
    let landed = fs::read(sb.dest.join("twice")).unwrap();
    assert!(landed == b"wxyz" || landed == b"abcd", "{landed:?}");
    sb.assert_contained();
}

/// A sender cannot hand the receiving user a setuid or setgid program, even with `-p`; the
/// other bits (sticky included) are kept.
#[tokio::test]
async fn setuid_and_setgid_bits_are_dropped() {
    use std::os::unix::fs::PermissionsExt;
    let sb = Sandbox::new();
    let entry = |id: u64, path: &[u8], mode: u32| {
        Frame::File(FileEntry {
            id,
            path: Bytes::copy_from_slice(path),
            size: 2,
            meta: Meta { mode, ..meta() },
        })
    };
    let stream = wire(&[
        entry(1, b"suid", 0o4755),
        data(1, 0, b"#!"),
        end(1, b"#!"),
        entry(2, b"sgid", 0o2750),
        data(2, 0, b"#!"),
        end(2, b"#!"),
        done(2, 0, 0, 4),
    ]);
    let config = ReceiveConfig {
        preserve: true,
        ..recursive()
    };
    let report = run(&sb.dest, config, vec![stream], true)
        .await
        .result
        .unwrap();
    assert!(report.is_complete(), "{:?}", report.failures);
    let mode = |n: &str| fs::metadata(sb.dest.join(n)).unwrap().permissions().mode() & 0o7777;
    assert_eq!(mode("suid"), 0o755);
    assert_eq!(mode("sgid"), 0o750);
}

/// A file being received is readable by nobody else until it is complete: its temp file is
/// private, whatever mode it will end with.
#[tokio::test]
async fn a_temp_file_is_private_until_complete() {
    use std::os::unix::fs::PermissionsExt;
    let sb = Sandbox::new();
    let (mut ours, theirs) = tokio::io::duplex(1 << 20);
    let dest = sb.dest.clone();
    let recv = tokio::spawn(async move {
        receive(
            &dest,
            vec![theirs],
            &recursive(),
            Arc::new(Progress::default()),
        )
        .await
    });
    // A world-readable file's entry, then silence.
    ours.write_all(&wire(&[file(1, b"public", 10)]))
        .await
        .unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let temp = loop {
        let found = fs::read_dir(&sb.dest)
            .unwrap()
            .filter_map(Result::ok)
            .find(|e| e.file_name().to_string_lossy().contains(".fastcp-"));
        if let Some(e) = found {
            break e.path();
        }
        assert!(std::time::Instant::now() < deadline, "no temp file");
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    assert_eq!(
        fs::metadata(&temp).unwrap().permissions().mode() & 0o777,
        0o600
    );
    ours.write_all(&wire(&[
        data(1, 0, b"helloworld"),
        end(1, b"helloworld"),
        done(1, 0, 0, 10),
    ]))
    .await
    .unwrap();
    ours.shutdown().await.unwrap();
    let report = tokio::time::timeout(Duration::from_secs(60), recv)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert!(report.is_complete());
    let mode = fs::metadata(sb.dest.join("public"))
        .unwrap()
        .permissions()
        .mode()
        & 0o777;
    assert_eq!(mode, 0o644 & !read_umask());
}

fn read_umask() -> u32 {
    let status = fs::read_to_string("/proc/self/status").unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("Umask:"))
        .map(|v| u32::from_str_radix(v.trim(), 8).unwrap())
        .unwrap_or(0o022)
}

/// Tiny chunks sent out of order, each leaving a gap, would grow the receiver's maps with
/// what the sender sends: past a cap the transfer stops with a clear error.
#[tokio::test]
async fn endless_out_of_order_chunks_hit_a_cap() {
    let sb = Sandbox::new();
    let n: u64 = 70_000;
    let mut frames = vec![file(1, b"gappy", 2 * n + 1)];
    // Every other byte, never the first: nothing ever joins up.
    for i in 0..n {
        frames.push(data(1, 2 * i + 1, b"x"));
    }
    let err = fatal(run(&sb.dest, recursive(), vec![wire(&frames)], true).await);
    assert!(err.to_string().contains("chunks out of order"), "{err}");
    sb.assert_contained();
    assert!(!sb.dest.join("gappy").exists());
}

fn attrs(path: &[u8], xattrs: &[(&'static [u8], &'static [u8])]) -> Frame {
    Frame::Attrs(fastcp_proto::Attrs {
        path: Bytes::copy_from_slice(path),
        uid: 0,
        gid: 0,
        xattrs: xattrs
            .iter()
            .map(|&(n, v)| (Bytes::from_static(n), Bytes::from_static(v)))
            .collect(),
        ..fastcp_proto::Attrs::default()
    })
}

fn keep_all() -> ReceiveConfig {
    ReceiveConfig {
        attrs: fastcp_stream::KeepAttrs {
            owner: true,
            group: true,
            numeric_ids: true,
            xattrs: true,
            acls: true,
        },
        ..recursive()
    }
}

/// Attributes must name the entry that follows them, come only when asked for, and be
/// followed by an entry: anything else is a protocol error and nothing is written.
#[tokio::test]
async fn attributes_out_of_place_are_refused() {
    let cases: [(&str, ReceiveConfig, Vec<Frame>); 4] = [
        (
            "for another entry",
            keep_all(),
            vec![attrs(b"other", &[]), file(1, b"f", 2), data(1, 0, b"ab")],
        ),
        (
            "twice",
            keep_all(),
            vec![attrs(b"f", &[]), attrs(b"f", &[]), file(1, b"f", 2)],
        ),
        (
            "with no entry after them",
            keep_all(),
            vec![attrs(b"f", &[]), done(0, 0, 0, 0)],
        ),
        (
            "not asked for",
            recursive(),
            vec![attrs(b"f", &[]), file(1, b"f", 2)],
        ),
    ];
    for (what, config, frames) in cases {
        let sb = Sandbox::new();
        let outcome = run(&sb.dest, config, vec![wire(&frames)], true).await;
        let err = outcome.result.expect_err(what);
        assert!(
            matches!(err, Error::Protocol(_) | Error::Decode { .. }),
            "{what}: {err}"
        );
        assert!(!sb.dest.join("f").exists(), "{what}");
        sb.assert_contained();
    }
}

/// A sender cannot give the receiver a file capability, nor attributes outside what was
/// asked for (`-X` without `-A` keeps no ACL).
#[tokio::test]
async fn a_file_capability_is_never_set() {
    let sb = Sandbox::new();
    let cap: &'static [u8] = &[
        0, 0, 0, 2, 0, 0x20, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    ];
    let acl: &'static [u8] = &[2, 0, 0, 0, 1, 0, 6, 0, 255, 255, 255, 255];
    let stream = wire(&[
        attrs(
            b"f",
            &[
                (b"security.capability", cap),
                (b"system.posix_acl_access", acl),
                (b"user.ok", b"1"),
            ],
        ),
        file(1, b"f", 2),
        data(1, 0, b"#!"),
        end(1, b"#!"),
        done(1, 0, 0, 2),
    ]);
    let config = ReceiveConfig {
        attrs: fastcp_stream::KeepAttrs {
            xattrs: true,
            ..fastcp_stream::KeepAttrs::default()
        },
        ..recursive()
    };
    let report = run(&sb.dest, config, vec![stream], true)
        .await
        .result
        .unwrap();
    assert!(report.is_complete(), "{:?}", report.failures);
    let get = |name: &str| {
        let mut buf = [0u8; 256];
        rustix::fs::getxattr(sb.dest.join("f"), name, &mut buf[..]).map(|n| buf[..n].to_vec())
    };
    assert_eq!(get("user.ok").unwrap(), b"1");
    assert!(get("security.capability").is_err());
    assert!(get("system.posix_acl_access").is_err());
    sb.assert_contained();
}

fn special(path: &[u8], kind: fastcp_proto::SpecialKind) -> Frame {
    Frame::Special(fastcp_proto::SpecialEntry {
        path: Bytes::copy_from_slice(path),
        kind,
        rdev: 0x0103,
        meta: meta(),
    })
}

/// A pipe, socket or device the receiver did not ask for is a protocol error (a device
/// needs `devices` even when `specials` is on), and nothing is made.
#[tokio::test]
async fn special_files_not_asked_for_are_refused() {
    use fastcp_proto::SpecialKind;
    let specials_only = ReceiveConfig {
        specials: true,
        ..recursive()
    };
    for (config, kind) in [
        (recursive(), SpecialKind::Fifo),
        (recursive(), SpecialKind::Socket),
        (specials_only, SpecialKind::CharDevice),
    ] {
        let sb = Sandbox::new();
        let stream = wire(&[special(b"x", kind), done(1, 0, 0, 0)]);
        let err = run(&sb.dest, config, vec![stream], true)
            .await
            .result
            .expect_err("refused");
        assert!(matches!(err, Error::Protocol(_)), "{kind:?}: {err}");
        assert!(fs::symlink_metadata(sb.dest.join("x")).is_err());
        sb.assert_contained();
    }
}

/// A special file never replaces a directory with entries, and never lands through a symlink.
#[tokio::test]
async fn a_special_file_replaces_no_directory_and_follows_no_link() {
    use fastcp_proto::SpecialKind;
    let sb = Sandbox::new();
    fs::create_dir(sb.dest.join("d")).unwrap();
    fs::write(sb.dest.join("d/keep"), b"k").unwrap();
    symlink(&sb.outside, sb.dest.join("out")).unwrap();
    let stream = wire(&[
        special(b"d", SpecialKind::Fifo),
        special(b"out/p", SpecialKind::Fifo),
        done(2, 0, 0, 0),
    ]);
    let config = ReceiveConfig {
        specials: true,
        ..recursive()
    };
    let report = run(&sb.dest, config, vec![stream], true)
        .await
        .result
        .unwrap();
    // The folder with entries stays (without --delete); the link is replaced by a folder,
    // never followed.
    assert_eq!(report.failure_count, 1, "{:?}", report.failures);
    assert_eq!(fs::read(sb.dest.join("d/keep")).unwrap(), b"k");
    assert!(fs::symlink_metadata(sb.dest.join("out")).unwrap().is_dir());
    // The pipe made in its place goes before the check, which reads every file.
    fs::remove_file(sb.dest.join("out/p")).unwrap();
    sb.assert_contained();
}

/// A sender past the receiver's cap on entries is stopped with a clear error; so is a path
/// nested deeper than the protocol allows.
#[tokio::test]
async fn entry_count_and_depth_caps_stop_the_sender() {
    let sb = Sandbox::new();
    let frames: Vec<Frame> = (0..11)
        .map(|i| {
            Frame::Dir(DirEntry {
                path: Bytes::from(format!("d{i}")),
                meta: meta(),
            })
        })
        .collect();
    let config = ReceiveConfig {
        max_entries: 10,
        ..recursive()
    };
    let err = run(&sb.dest, config, vec![wire(&frames)], true)
        .await
        .result
        .expect_err("past the cap");
    assert!(err.to_string().contains("more than 10 entries"), "{err}");
    sb.assert_contained();

    let sb = Sandbox::new();
    let deep = vec!["d"; fastcp_proto::MAX_DEPTH + 1].join("/");
    let frames = [Frame::Dir(DirEntry {
        path: Bytes::from(deep),
        meta: meta(),
    })];
    let err = run(&sb.dest, recursive(), vec![wire(&frames)], true)
        .await
        .result
        .expect_err("too deep");
    assert!(err.to_string().contains("deeper than 1024"), "{err}");
    assert!(!sb.dest.join("d").exists());
    sb.assert_contained();
}

/// rsync CVE-2024-12086: a sender must learn nothing of files outside the destination. Its
/// quick-check probes name files through a symlink to a folder outside, a symlink to a
/// file outside, and a partial file that is a symlink to one (with `--checksum`, and with
/// `--resume`): no answer carries a hash of what is outside, none says the file is there,
/// and the outside file is neither read into a reply nor changed. The same file inside is
/// found there, as the check that the probes are answered at all.
#[tokio::test]
async fn cve_2024_12086_probes_learn_nothing_outside_the_destination() {
    let sb = Sandbox::new();
    let secret = sb.outside.join("secret");
    let content = vec![0x42u8; 8 << 20];
    fs::write(&secret, &content).unwrap();
    let size = content.len() as u64;
    let mtime = fs::metadata(&secret)
        .unwrap()
        .modified()
        .unwrap()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap();
    symlink(&sb.outside, sb.dest.join("link")).unwrap();
    symlink(&secret, sb.dest.join("flink")).unwrap();
    symlink(&secret, sb.dest.join(".big.fastcp-partial")).unwrap();
    // The same bytes inside, at the same time: the one probe the receiver says it holds.
    let inside = sb.dest.join("inside");
    fs::write(&inside, &content).unwrap();
    fs::File::options()
        .write(true)
        .open(&inside)
        .unwrap()
        .set_modified(fs::metadata(&secret).unwrap().modified().unwrap())
        .unwrap();
    let probe = |id, path: &'static [u8]| {
        Frame::Probe(fastcp_proto::Probe {
            id,
            path: Bytes::from_static(path),
            size,
            mtime: mtime.as_secs() as i64,
            mtime_nsec: mtime.subsec_nanos(),
            mode: None,
        })
    };
    let probes = [
        probe(0, b"link/secret"),
        probe(1, b"flink"),
        probe(2, b"big"),
        probe(3, b"inside"),
    ];
    for config in [
        ReceiveConfig {
            checksum: true,
            ..resuming()
        },
        resuming(),
    ] {
        let replies = answers_to(&sb.dest, config, &probes).await;
        for reply in &replies {
            match reply {
                Frame::Answer(a) if a.id == 3 => assert!(!a.send, "{a:?}"),
                Frame::Answer(a) => {
                    assert!(a.send, "the receiver claimed it holds {a:?}");
                    assert_eq!(a.hash, None, "{a:?}");
                }
                Frame::Partial(p) => {
                    assert!(
                        p.hashes.iter().all(|&h| h == fastcp_proto::NOT_HELD),
                        "block hashes of a file outside: {p:?}"
                    );
                }
                other => panic!("unexpected reply {other:?}"),
            }
        }
    }
    assert_eq!(
        fs::read(&secret).unwrap(),
        content,
        "the file outside is untouched"
    );
    assert!(sb.dest.join("flink").is_symlink());
}

/// Sends `probes` to a receiver into `dest` and returns its replies to them (answers and
/// partial files' block hashes), once every probe has its answer.
async fn answers_to(dest: &Path, config: ReceiveConfig, probes: &[Frame]) -> Vec<Frame> {
    let (mut ours, theirs) = tokio::io::duplex(1 << 20);
    let dest = dest.to_path_buf();
    let progress = Arc::new(Progress::default());
    let recv = tokio::spawn(async move { receive(&dest, vec![theirs], &config, progress).await });
    ours.write_all(&wire(probes)).await.unwrap();
    let mut decoder = fastcp_proto::Decoder::new(1 << 20);
    let mut buf = BytesMut::new();
    let mut replies = Vec::new();
    let mut answers = 0;
    while answers < probes.len() {
        while let Some(f) = decoder.decode(&mut buf).unwrap() {
            answers += usize::from(matches!(f, Frame::Answer(_)));
            replies.push(f);
        }
        if answers == probes.len() {
            break;
        }
        let mut chunk = [0u8; 4096];
        let n = tokio::time::timeout(Duration::from_secs(30), ours.read(&mut chunk))
            .await
            .expect("no answer within 30 s")
            .unwrap();
        assert!(n > 0, "the receiver hung up: {replies:?}");
        buf.extend_from_slice(&chunk[..n]);
    }
    drop(ours);
    let _ = tokio::time::timeout(Duration::from_secs(30), recv)
        .await
        .expect("receive hung");
    replies
}
