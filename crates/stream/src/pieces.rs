//! Pieces: a file split by byte ranges over several runs (`--shard`), assembled by the
//! receiver.
//!
//! Each run that sends a range of a file writes it into the same work file beside the
//! target, `.NAME.fastcp-shard-XXXXXXXX`, where `XXXXXXXX` is a hash of the source's size and
//! modification time: runs that read the same version of the source share one work file, and
//! a source changed between runs starts another. Once a run's range has arrived whole and
//! matched its sender's checksum, the run adds it to the work file's record,
//! `.NAME.fastcp-shard-XXXXXXXX.ranges`, under an exclusive `flock` of the work file. The run
//! whose range completes the record gives the work file the file's mode and times and its
//! final name; the others leave it for the runs still to come. So a file under its final
//! name is always whole, whichever run finishes last, and runs may go at once or one after
//! another, on one host or on many writing to one shared file system.

use std::collections::BTreeMap;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::time::{Duration, Instant};

use rustix::fs::{AtFlags, FileType, FlockOperation, Mode, OFlags};

/// How long a run waits for another run's hold on a work file's record.
const LOCK_WAIT: Duration = Duration::from_secs(60);

/// The record's first line, for the work file of inode `ino`: a record left beside another
/// file of the same name (the work file removed, and made again) counts as none.
fn header(ino: u64) -> Vec<u8> {
    format!("fastcp pieces 1 {ino}\n").into_bytes()
}

/// The work file's name beside `name` for a source of `size` bytes modified at `mtime`.
pub(crate) fn work_name(name: &[u8], size: u64, mtime: (i64, u32)) -> Vec<u8> {
    let mut id = [0u8; 20];
    id[..8].copy_from_slice(&size.to_le_bytes());
    id[8..16].copy_from_slice(&mtime.0.to_le_bytes());
    id[16..].copy_from_slice(&mtime.1.to_le_bytes());
    let tag = xxhash_rust::xxh3::xxh3_64(&id) as u32;
    let keep = &name[..name.len().min(200)];
    let mut v = Vec::with_capacity(keep.len() + 24);
    v.push(b'.');
    v.extend_from_slice(keep);
    v.extend_from_slice(format!(".fastcp-shard-{tag:08x}").as_bytes());
    v
}

/// Whether `name` is a work file of pieces, or its record.
pub(crate) fn is_piece_file(name: &[u8]) -> bool {
    name.starts_with(b".") && name.windows(14).any(|w| w == b".fastcp-shard-")
}

fn record_name(work: &[u8]) -> Vec<u8> {
    [work, b".ranges"].concat()
}

/// Opens (creating it if need be) the work file `work` in `dir` for a file of `size` bytes:
/// a regular file with one link, reached without following a symlink, at least `size` bytes
/// long. Other runs may hold it at the same time.
pub(crate) fn open_work(dir: &OwnedFd, work: &[u8], size: u64) -> io::Result<OwnedFd> {
    let flags = OFlags::RDWR | OFlags::CREATE | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    let fd = rustix::fs::openat(dir, work, flags, Mode::from_raw_mode(0o600))?;
    let st = rustix::fs::fstat(&fd)?;
    if FileType::from_raw_mode(st.st_mode) != FileType::RegularFile || st.st_nlink != 1 {
        return Err(io::Error::other(
            "the work file of its pieces is not a plain file; remove it",
        ));
    }
    match (st.st_size as u64).cmp(&size) {
        std::cmp::Ordering::Less => rustix::fs::ftruncate(&fd, size)?,
        std::cmp::Ordering::Equal => {}
        std::cmp::Ordering::Greater => {
            return Err(io::Error::other(
                "the work file of its pieces is longer than the file; remove it",
            ));
        }
    }
    Ok(fd)
}

/// What adding a range to a work file's record found.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Recorded {
    /// The runs' ranges now cover the file: the caller, still holding the work file's lock,
    /// gives it its final name. The record is gone.
    Complete,
    /// Ranges are still missing: other runs will send them.
    Partial,
    /// The work file is no longer under its name (another run completed the file): nothing
    /// to do.
    Gone,
}

/// Adds `[start, end)` of a file of `size` bytes to the record of the work file `work` in
/// `dir`, open as `fd`. On [`Recorded::Complete`], `fd` stays locked until it is closed.
pub(crate) fn record(
    dir: &OwnedFd,
    work: &[u8],
    fd: &OwnedFd,
    size: u64,
    start: u64,
    end: u64,
) -> io::Result<Recorded> {
    lock(fd)?;
    let ours = rustix::fs::fstat(fd)?;
    match rustix::fs::statat(dir, work, AtFlags::SYMLINK_NOFOLLOW) {
        Ok(st) if st.st_ino == ours.st_ino && st.st_dev == ours.st_dev => {}
        Ok(_) | Err(rustix::io::Errno::NOENT) => return Ok(Recorded::Gone),
        Err(e) => return Err(e.into()),
    }
    let name = record_name(work);
    let mut ranges = read_record(dir, &name, ours.st_ino)?;
    insert(&mut ranges, start, end);
    if ranges.get(&0) == Some(&size) {
        match rustix::fs::unlinkat(dir, &name[..], AtFlags::empty()) {
            Ok(()) | Err(rustix::io::Errno::NOENT) => {}
            Err(e) => return Err(e.into()),
        }
        return Ok(Recorded::Complete);
    }
    write_record(dir, &name, ours.st_ino, &ranges)?;
    Ok(Recorded::Partial)
}

/// Removes the work files, and their records, that other versions of the source left for
/// the file `name` in `dir`: it is whole under its name now, and their runs will never
/// complete it.
pub(crate) fn remove_other_versions(dir: &OwnedFd, name: &[u8]) {
    let prefix = work_name(name, 0, (0, 0));
    let prefix = &prefix[..prefix.len() - 8];
    let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC;
    let Ok(d) = rustix::fs::openat(dir, c".", flags, Mode::empty()) else {
        return;
    };
    let Ok(mut entries) = rustix::fs::Dir::new(d) else {
        return;
    };
    while let Some(Ok(entry)) = entries.next() {
        if entry.file_name().to_bytes().starts_with(prefix) {
            let _ = rustix::fs::unlinkat(dir, entry.file_name(), AtFlags::empty());
        }
    }
}

/// Takes `fd`'s exclusive lock, waiting at most [`LOCK_WAIT`] for another run's.
fn lock(fd: &OwnedFd) -> io::Result<()> {
    let give_up = Instant::now() + LOCK_WAIT;
    loop {
        match rustix::fs::flock(fd, FlockOperation::NonBlockingLockExclusive) {
            Ok(()) => return Ok(()),
            Err(rustix::io::Errno::WOULDBLOCK | rustix::io::Errno::INTR)
                if Instant::now() < give_up =>
            {
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(rustix::io::Errno::WOULDBLOCK) => {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "another copy held the record of its pieces for a minute",
                ));
            }
            Err(e) => return Err(e.into()),
        }
    }
}

/// The ranges a record holds, start -> end, merged; none when there is no record yet. A
/// record that cannot be read as one counts as none: its ranges are sent again.
fn read_record(dir: &OwnedFd, name: &[u8], ino: u64) -> io::Result<BTreeMap<u64, u64>> {
    let mut ranges = BTreeMap::new();
    let fd = match rustix::fs::openat(
        dir,
        name,
        OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC | OFlags::NONBLOCK,
        Mode::empty(),
    ) {
        Ok(fd) => fd,
        Err(rustix::io::Errno::NOENT) => return Ok(ranges),
        Err(e) => return Err(e.into()),
    };
    let mut text = Vec::new();
    let mut buf = [0u8; 8192];
    loop {
        let n = rustix::io::read(fd.as_fd(), &mut buf)?;
        if n == 0 || text.len() > 1 << 20 {
            break;
        }
        text.extend_from_slice(&buf[..n]);
    }
    let Some(body) = text.strip_prefix(&header(ino)[..]) else {
        return Ok(ranges);
    };
    for line in body.split(|&b| b == b'\n').filter(|l| !l.is_empty()) {
        let parsed = std::str::from_utf8(line).ok().and_then(|l| {
            let (a, b) = l.split_once(' ')?;
            Some((a.parse::<u64>().ok()?, b.parse::<u64>().ok()?))
        });
        match parsed {
            Some((a, b)) if a < b => insert(&mut ranges, a, b),
            _ => return Ok(BTreeMap::new()),
        }
    }
    Ok(ranges)
}

/// Replaces the record `name` with `ranges`, at once (a new file renamed over it).
fn write_record(
    dir: &OwnedFd,
    name: &[u8],
    ino: u64,
    ranges: &BTreeMap<u64, u64>,
) -> io::Result<()> {
    let mut text = header(ino);
    for (a, b) in ranges {
        text.extend_from_slice(format!("{a} {b}\n").as_bytes());
    }
    let new = [name, b".new"].concat();
    let flags =
        OFlags::WRONLY | OFlags::CREATE | OFlags::TRUNC | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    let fd = rustix::fs::openat(dir, &new[..], flags, Mode::from_raw_mode(0o600))?;
    let mut at = 0;
    while at < text.len() {
        at += rustix::io::write(&fd, &text[at..])?;
    }
    drop(fd);
    rustix::fs::renameat(dir, &new[..], dir, name)?;
    Ok(())
}

/// Adds `[start, end)` to `ranges`, merging it with the ranges it touches.
fn insert(ranges: &mut BTreeMap<u64, u64>, mut start: u64, mut end: u64) {
    let touching: Vec<(u64, u64)> = ranges
        .range(..=end)
        .filter(|&(_, &e)| e >= start)
        .map(|(&s, &e)| (s, e))
        .collect();
    for (s, e) in touching {
        ranges.remove(&s);
        start = start.min(s);
        end = end.max(e);
    }
    ranges.insert(start, end);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir() -> (tempfile::TempDir, OwnedFd) {
        let t = tempfile::tempdir().unwrap();
        let fd =
            rustix::fs::open(t.path(), OFlags::RDONLY | OFlags::DIRECTORY, Mode::empty()).unwrap();
        (t, fd)
    }

    #[test]
    fn names_follow_the_source_version() {
        let a = work_name(b"f", 10, (1, 2));
        assert!(a.starts_with(b".f.fastcp-shard-") && a.len() == 24);
        assert_ne!(a, work_name(b"f", 11, (1, 2)));
        assert_ne!(a, work_name(b"f", 10, (1, 3)));
        assert!(is_piece_file(&a) && is_piece_file(&record_name(&a)));
        assert!(!is_piece_file(b"f.fastcp-shard-1") && !is_piece_file(b".f"));
        assert!(work_name(&[b'x'; 255], 1, (0, 0)).len() <= 255 - ".ranges.new".len());
    }

    #[test]
    fn ranges_complete_in_any_order_and_overlap() {
        let (_t, dir) = dir();
        let work = work_name(b"f", 100, (0, 0));
        let fd = open_work(&dir, &work, 100).unwrap();
        assert_eq!(rustix::fs::fstat(&fd).unwrap().st_size, 100);
        assert_eq!(
            record(&dir, &work, &fd, 100, 60, 100).unwrap(),
            Recorded::Partial
        );
        // Another run, its own descriptor.
        let other = open_work(&dir, &work, 100).unwrap();
        drop(fd);
        assert_eq!(
            record(&dir, &work, &other, 100, 0, 30).unwrap(),
            Recorded::Partial
        );
        drop(other);
        let fd = open_work(&dir, &work, 100).unwrap();
        assert_eq!(
            record(&dir, &work, &fd, 100, 20, 61).unwrap(),
            Recorded::Complete
        );
        let record = record_name(&work);
        assert_eq!(
            rustix::fs::statat(&dir, &record[..], AtFlags::empty()).unwrap_err(),
            rustix::io::Errno::NOENT
        );
    }

    #[test]
    fn a_completed_file_is_gone_for_the_runs_still_writing() {
        let (_t, dir) = dir();
        let work = work_name(b"f", 10, (0, 0));
        let late = open_work(&dir, &work, 10).unwrap();
        rustix::fs::renameat(&dir, &work[..], &dir, "f").unwrap();
        assert_eq!(
            record(&dir, &work, &late, 10, 0, 5).unwrap(),
            Recorded::Gone
        );
    }

    #[test]
    fn other_versions_go_once_the_file_is_whole() {
        let (t, dir) = dir();
        for (name, size) in [(&b"f"[..], 1), (b"f", 2), (b"g", 1)] {
            let work = work_name(name, size, (0, 0));
            let fd = open_work(&dir, &work, 10).unwrap();
            record(&dir, &work, &fd, 10, 0, 1).unwrap();
        }
        std::fs::write(t.path().join("f"), b"").unwrap();
        remove_other_versions(&dir, b"f");
        let mut left: Vec<_> = std::fs::read_dir(t.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        left.sort();
        let g = String::from_utf8(work_name(b"g", 1, (0, 0))).unwrap();
        assert_eq!(left, [g.clone(), format!("{g}.ranges"), "f".into()]);
    }

    #[test]
    fn a_damaged_record_counts_as_none() {
        let (t, dir) = dir();
        let work = work_name(b"f", 100, (0, 0));
        let fd = open_work(&dir, &work, 100).unwrap();
        let record_path = t
            .path()
            .join(std::str::from_utf8(&record_name(&work)).unwrap());
        let ino = rustix::fs::fstat(&fd).unwrap().st_ino;
        let good = format!("fastcp pieces 1 {ino}\n");
        for bad in [
            "0 100\n".to_string(),
            format!("{good}0 100 7\n"),
            format!("{good}50 10\n"),
            // Another work file's record: this one was removed and made again.
            format!("fastcp pieces 1 {}\n0 90\n", ino + 1),
        ] {
            std::fs::write(&record_path, &bad).unwrap();
            assert_eq!(
                record(&dir, &work, &fd, 100, 0, 10).unwrap(),
                Recorded::Partial
            );
            let text = std::fs::read_to_string(&record_path).unwrap();
            assert_eq!(text, format!("{good}0 10\n"), "{bad:?}");
        }
    }

    #[test]
    fn a_work_file_that_is_not_ours_is_refused() {
        let (t, dir) = dir();
        let work = work_name(b"f", 10, (0, 0));
        let path = t.path().join(std::str::from_utf8(&work).unwrap());
        std::os::unix::fs::symlink("/etc/passwd", &path).unwrap();
        assert!(open_work(&dir, &work, 10).is_err());
        std::fs::remove_file(&path).unwrap();
        std::fs::write(&path, [0u8; 11]).unwrap();
        assert!(open_work(&dir, &work, 10).is_err(), "longer than the file");
        std::fs::write(&path, [0u8; 3]).unwrap();
        std::fs::hard_link(&path, t.path().join("second")).unwrap();
        assert!(open_work(&dir, &work, 10).is_err(), "two links");
    }
}
