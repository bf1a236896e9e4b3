//! Pieces: a file split by byte ranges over several runs (`--shard`), assembled by the
//! receiver.
//!
//! Each run that sends a range of a file writes it into the same work file beside the
//! target, `.NAME.fastcp-shard-XXXXXXXXXXXXXXXX`, where the tag is a hash of the file's whole
//! name and the source's size and modification time: runs that read the same version of
//! the source share one work file, and a source changed between runs starts another.
//!
//! The work file holds its own record. Past the file's `size` bytes, a trailer lists the
//! ranges that have arrived whole, matched their sender's checksum and been flushed to disk
//! ([`record`]); it is read and rewritten only under an exclusive `flock` of the work file,
//! and it lives and dies with the work file's inode, so no record can outlive its bytes or
//! speak for another file. A run writes only into ranges the trailer does not hold yet
//! ([`coverage`]); a range whose check fails is taken out of the trailer again
//! ([`forget`]). The run whose range completes the trailer cuts it off and gives the work
//! file the file's mode and times and its final name, while it still holds the lock; the
//! others leave the work file for the runs still to come. So a file under its final name is
//! always whole, whichever run finishes last, and runs may go at once or one after another,
//! on one host or on many writing to one shared file system.

use std::collections::BTreeMap;
use std::io;
use std::os::fd::OwnedFd;
use std::time::{Duration, Instant};

use rustix::fs::{AtFlags, FileType, FlockOperation, Mode, OFlags};
use twox_hash::XxHash3_64;

fn xxh3_64(bytes: &[u8]) -> u64 {
    XxHash3_64::oneshot(bytes)
}

/// How long a run waits for another run's hold on a work file.
const LOCK_WAIT: Duration = Duration::from_secs(60);

/// The trailer's first bytes.
const MAGIC: &[u8; 8] = b"FCPIECE1";

/// The most ranges a trailer holds: more means runs split the file in different ways, and
/// the ones past this are sent again.
const MAX_RANGES: usize = 1 << 16;

/// The work file's name beside `name` for a source of `size` bytes modified at `mtime`.
pub(crate) fn work_name(name: &[u8], size: u64, mtime: (i64, u32)) -> Vec<u8> {
    let mut id = Vec::with_capacity(name.len() + 20);
    id.extend_from_slice(&size.to_le_bytes());
    id.extend_from_slice(&mtime.0.to_le_bytes());
    id.extend_from_slice(&mtime.1.to_le_bytes());
    id.extend_from_slice(name);
    let mut v = prefix(name);
    v.extend_from_slice(format!("{:016x}", xxh3_64(&id)).as_bytes());
    v
}

/// How much of a file's name its work files' names keep.
const NAME_KEPT: usize = 200;

/// `.NAME.fastcp-shard-`, the name cut to [`NAME_KEPT`] bytes: every work file of `name`
/// starts so.
fn prefix(name: &[u8]) -> Vec<u8> {
    let keep = &name[..name.len().min(NAME_KEPT)];
    [b".", keep, b".fastcp-shard-"].concat()
}

/// Whether `name` is a work file of pieces.
pub(crate) fn is_piece_file(name: &[u8]) -> bool {
    name.len() > 31 && name.starts_with(b".") && {
        let (head, tag) = name.split_at(name.len() - 16);
        head.ends_with(b".fastcp-shard-") && tag.iter().all(u8::is_ascii_hexdigit)
    }
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
            "the work file of its pieces is not a plain file with one name",
        ));
    }
    let locked = Locked::take(&fd)?;
    if (rustix::fs::fstat(&fd)?.st_size as u64) < size {
        rustix::fs::ftruncate(&fd, size)?;
    }
    drop(locked);
    Ok(fd)
}

/// What a run does with a range it is about to receive.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Claim {
    /// Write it: the trailer holds none of it (any part it held, from runs that cut the
    /// file otherwise, is taken off until this range is recorded whole).
    Write,
    /// The trailer holds all of it already: nothing to write.
    Held,
}

/// Claims `[start, end)` of the work file `fd` of `size` bytes for writing: bytes are never
/// written where the trailer vouches for them.
pub(crate) fn claim(fd: &OwnedFd, size: u64, start: u64, end: u64) -> io::Result<Claim> {
    let _locked = Locked::take(fd)?;
    let mut ranges = read_trailer(fd, size)?;
    let touching = ranges
        .range(..end)
        .filter(|&(_, &e)| e > start)
        .map(|(&s, &e)| (s, e))
        .collect::<Vec<_>>();
    Ok(match touching[..] {
        [] => Claim::Write,
        [(s, e)] if s <= start && e >= end => Claim::Held,
        _ => {
            remove(&mut ranges, start, end);
            write_trailer(fd, size, &ranges)?;
            Claim::Write
        }
    })
}

/// What adding a range to a work file's trailer found.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Recorded {
    /// The runs' ranges now cover the file, and the trailer is cut off: the caller, still
    /// holding the work file's lock (until `fd` is closed), gives it its final name.
    Complete,
    /// Ranges are still missing: other runs will send them.
    Partial,
    /// The work file is no longer under its name (another run completed the file): nothing
    /// to do.
    Gone,
}

/// Adds `[start, end)` of a file of `size` bytes, verified, to the trailer of the work file
/// `work` in `dir`, open as `fd`, once its bytes are on disk.
pub(crate) fn record(
    dir: &OwnedFd,
    work: &[u8],
    fd: &OwnedFd,
    size: u64,
    start: u64,
    end: u64,
) -> io::Result<Recorded> {
    // A range on record speaks for bytes that survive a crash.
    rustix::fs::fdatasync(fd)?;
    let locked = Locked::take(fd)?;
    if !still_named(dir, work, fd)? {
        return Ok(Recorded::Gone);
    }
    let mut ranges = read_trailer(fd, size)?;
    insert(&mut ranges, start, end);
    if ranges.get(&0) == Some(&size) {
        rustix::fs::ftruncate(fd, size)?;
        std::mem::forget(locked);
        return Ok(Recorded::Complete);
    }
    write_trailer(fd, size, &ranges)?;
    Ok(Recorded::Partial)
}

/// What taking a range back found.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Forgot {
    /// The range is off the trailer (or never was on it): it will be sent again.
    Forgotten,
    /// Another run completed the file while this one wrote into it: the file under `name`,
    /// this very work file, was removed, since its bytes may be damaged.
    Removed,
    /// The work file is gone, and `name` is another file: nothing to do.
    Gone,
}

/// Takes `[start, end)` out of the trailer of the work file `work` in `dir`, open as `fd`,
/// after bytes written there failed their check; if another run has already given the work
/// file its final `name`, that file is removed: a file under its final name is never
/// damaged.
pub(crate) fn forget(
    dir: &OwnedFd,
    work: &[u8],
    name: &[u8],
    fd: &OwnedFd,
    size: u64,
    start: u64,
    end: u64,
) -> io::Result<Forgot> {
    let _locked = Locked::take(fd)?;
    if !still_named(dir, work, fd)? {
        if still_named(dir, name, fd)? {
            rustix::fs::unlinkat(dir, name, AtFlags::empty())?;
            return Ok(Forgot::Removed);
        }
        return Ok(Forgot::Gone);
    }
    let mut ranges = read_trailer(fd, size)?;
    remove(&mut ranges, start, end);
    write_trailer(fd, size, &ranges)?;
    rustix::fs::fdatasync(fd)?;
    Ok(Forgot::Forgotten)
}

/// Removes the work files that other versions of the source left for the file `name` in
/// `dir`: it is whole under its name now, and their runs will never complete it. Each goes
/// only under its own lock, so that no run is recording into it at that moment.
pub(crate) fn remove_other_versions(dir: &OwnedFd, name: &[u8]) {
    // A longer name is cut in its work files' names, which may then be another file's.
    if name.len() > NAME_KEPT {
        return;
    }
    let prefix = prefix(name);
    let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC;
    let Ok(d) = rustix::fs::openat(dir, c".", flags, Mode::empty()) else {
        return;
    };
    let Ok(mut entries) = rustix::fs::Dir::new(d) else {
        return;
    };
    while let Some(Ok(entry)) = entries.next() {
        let found = entry.file_name().to_bytes();
        if !(found.len() == prefix.len() + 16 && found.starts_with(&prefix) && is_piece_file(found))
        {
            continue;
        }
        let open = OFlags::RDWR | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC;
        let Ok(fd) = rustix::fs::openat(dir, entry.file_name(), open, Mode::empty()) else {
            continue;
        };
        if rustix::fs::flock(&fd, FlockOperation::NonBlockingLockExclusive).is_ok()
            && still_named(dir, found, &fd).unwrap_or(false)
        {
            let _ = rustix::fs::unlinkat(dir, entry.file_name(), AtFlags::empty());
        }
    }
}

/// Whether `name` in `dir` is still the file open as `fd`.
fn still_named(dir: &OwnedFd, name: &[u8], fd: &OwnedFd) -> io::Result<bool> {
    let ours = rustix::fs::fstat(fd)?;
    match rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW) {
        Ok(st) => Ok(st.st_ino == ours.st_ino && st.st_dev == ours.st_dev),
        Err(rustix::io::Errno::NOENT) => Ok(false),
        Err(e) => Err(e.into()),
    }
}

/// An exclusive `flock` of a work file, let go when dropped.
struct Locked<'a>(&'a OwnedFd);

impl<'a> Locked<'a> {
    /// Takes `fd`'s lock, waiting at most [`LOCK_WAIT`] for another run's.
    fn take(fd: &'a OwnedFd) -> io::Result<Locked<'a>> {
        let give_up = Instant::now() + LOCK_WAIT;
        loop {
            match rustix::fs::flock(fd, FlockOperation::NonBlockingLockExclusive) {
                Ok(()) => return Ok(Locked(fd)),
                Err(rustix::io::Errno::WOULDBLOCK | rustix::io::Errno::INTR)
                    if Instant::now() < give_up =>
                {
                    std::thread::sleep(Duration::from_millis(5));
                }
                Err(rustix::io::Errno::WOULDBLOCK) => {
                    return Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        "another copy held the work file of its pieces for a minute",
                    ));
                }
                Err(e) => return Err(e.into()),
            }
        }
    }
}

impl Drop for Locked<'_> {
    fn drop(&mut self) {
        let _ = rustix::fs::flock(self.0, FlockOperation::Unlock);
    }
}

/// The ranges the trailer of a work file of `size` bytes holds, start -> end, merged: none
/// when there is no trailer, or one that does not check out (its ranges are sent again).
///
/// The trailer: [`MAGIC`], the body's length (u32), the XXH3-64 of the body (u64), then the
/// body: a (start u64, end u64) pair per range, all little-endian.
fn read_trailer(fd: &OwnedFd, size: u64) -> io::Result<BTreeMap<u64, u64>> {
    let mut ranges = BTreeMap::new();
    let mut head = [0u8; 20];
    if !pread_full(fd, &mut head, size)? || &head[..8] != MAGIC {
        return Ok(ranges);
    }
    let len = u32::from_le_bytes(head[8..12].try_into().expect("4 bytes")) as usize;
    let sum = u64::from_le_bytes(head[12..20].try_into().expect("8 bytes"));
    if !len.is_multiple_of(16) || len / 16 > MAX_RANGES {
        return Ok(ranges);
    }
    let mut body = vec![0u8; len];
    if !pread_full(fd, &mut body, size + 20)? || xxh3_64(&body) != sum {
        return Ok(ranges);
    }
    for pair in body.chunks_exact(16) {
        let a = u64::from_le_bytes(pair[..8].try_into().expect("8 bytes"));
        let b = u64::from_le_bytes(pair[8..].try_into().expect("8 bytes"));
        if a >= b || b > size {
            return Ok(BTreeMap::new());
        }
        insert(&mut ranges, a, b);
    }
    Ok(ranges)
}

/// Writes `ranges` as the trailer past `size`, and cuts off whatever followed it.
fn write_trailer(fd: &OwnedFd, size: u64, ranges: &BTreeMap<u64, u64>) -> io::Result<()> {
    let mut body = Vec::with_capacity(ranges.len().min(MAX_RANGES) * 16);
    for (a, b) in ranges.iter().take(MAX_RANGES) {
        body.extend_from_slice(&a.to_le_bytes());
        body.extend_from_slice(&b.to_le_bytes());
    }
    let mut trailer = Vec::with_capacity(20 + body.len());
    trailer.extend_from_slice(MAGIC);
    trailer.extend_from_slice(&(body.len() as u32).to_le_bytes());
    trailer.extend_from_slice(&xxh3_64(&body).to_le_bytes());
    trailer.extend_from_slice(&body);
    let mut at = 0;
    while at < trailer.len() {
        at += rustix::io::pwrite(fd, &trailer[at..], size + at as u64)?;
    }
    rustix::fs::ftruncate(fd, size + trailer.len() as u64)?;
    Ok(())
}

/// Fills `buf` from `offset`; false when the file ends first.
fn pread_full(fd: &OwnedFd, buf: &mut [u8], offset: u64) -> io::Result<bool> {
    let mut at = 0;
    while at < buf.len() {
        match rustix::io::pread(fd, &mut buf[at..], offset + at as u64) {
            Ok(0) => return Ok(false),
            Ok(n) => at += n,
            Err(rustix::io::Errno::INTR) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(true)
}

/// Adds `[start, end)` to `ranges`, merging it with the ranges it touches.
pub(crate) fn insert(ranges: &mut BTreeMap<u64, u64>, mut start: u64, mut end: u64) {
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

/// Takes `[start, end)` out of `ranges`.
fn remove(ranges: &mut BTreeMap<u64, u64>, start: u64, end: u64) {
    let touching: Vec<(u64, u64)> = ranges
        .range(..end)
        .filter(|&(_, &e)| e > start)
        .map(|(&s, &e)| (s, e))
        .collect();
    for (s, e) in touching {
        ranges.remove(&s);
        if s < start {
            ranges.insert(s, start);
        }
        if e > end {
            ranges.insert(end, e);
        }
    }
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
    fn names_follow_the_whole_name_and_the_source_version() {
        let a = work_name(b"f", 10, (1, 2));
        assert!(a.starts_with(b".f.fastcp-shard-") && a.len() == 32);
        assert_ne!(a, work_name(b"f", 11, (1, 2)));
        assert_ne!(a, work_name(b"f", 10, (1, 3)));
        assert_ne!(a, work_name(b"g", 10, (1, 2)));
        // Names alike in their first 200 bytes still differ.
        let long = |c: u8| [vec![b'n'; 210], vec![c]].concat();
        assert_ne!(
            work_name(&long(b'x'), 1, (0, 0)),
            work_name(&long(b'y'), 1, (0, 0))
        );
        assert!(is_piece_file(&a));
        assert!(!is_piece_file(b".f.fastcp-shard-1") && !is_piece_file(b".f"));
        assert!(!is_piece_file(b"f.fastcp-shard-0123456789abcdef"));
        assert!(work_name(&[b'x'; 255], 1, (0, 0)).len() <= 255);
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
        assert_eq!(claim(&fd, 100, 70, 80).unwrap(), Claim::Held);
        assert_eq!(claim(&fd, 100, 0, 60).unwrap(), Claim::Write);
        // Another run, its own descriptor: the trailer stays with the file.
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
        assert_eq!(
            rustix::fs::fstat(&fd).unwrap().st_size,
            100,
            "the trailer is cut off"
        );
    }

    #[test]
    fn a_range_that_failed_its_check_is_taken_back() {
        let (_t, dir) = dir();
        let work = work_name(b"f", 100, (0, 0));
        let fd = open_work(&dir, &work, 100).unwrap();
        record(&dir, &work, &fd, 100, 0, 60).unwrap();
        assert_eq!(
            forget(&dir, &work, b"f", &fd, 100, 20, 40).unwrap(),
            Forgot::Forgotten
        );
        assert_eq!(claim(&fd, 100, 0, 20).unwrap(), Claim::Held);
        assert_eq!(claim(&fd, 100, 40, 60).unwrap(), Claim::Held);
        assert_eq!(claim(&fd, 100, 20, 40).unwrap(), Claim::Write);
        // Completed by another run meanwhile: the file under its final name goes.
        rustix::fs::renameat(&dir, &work[..], &dir, "f").unwrap();
        assert_eq!(
            forget(&dir, &work, b"f", &fd, 100, 0, 10).unwrap(),
            Forgot::Removed
        );
        assert_eq!(
            rustix::fs::statat(&dir, "f", AtFlags::empty()).unwrap_err(),
            rustix::io::Errno::NOENT
        );
    }

    /// Runs that cut the file otherwise: a range that overlaps recorded ones takes them off
    /// where it overlaps, and the file completes from the new cut.
    #[test]
    fn a_range_of_another_cut_takes_over_what_it_overlaps() {
        let (_t, dir) = dir();
        let work = work_name(b"f", 90, (0, 0));
        let fd = open_work(&dir, &work, 90).unwrap();
        record(&dir, &work, &fd, 90, 0, 30).unwrap();
        record(&dir, &work, &fd, 90, 60, 90).unwrap();
        assert_eq!(claim(&fd, 90, 20, 70).unwrap(), Claim::Write);
        assert_eq!(claim(&fd, 90, 0, 20).unwrap(), Claim::Held);
        assert_eq!(claim(&fd, 90, 70, 90).unwrap(), Claim::Held);
        assert_eq!(
            record(&dir, &work, &fd, 90, 20, 70).unwrap(),
            Recorded::Complete
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

    /// A work file made again under the same name (the first one removed) starts with no
    /// ranges, whatever inode it gets.
    #[test]
    fn a_new_work_file_holds_no_ranges() {
        let (t, dir) = dir();
        let work = work_name(b"f", 10, (0, 0));
        let fd = open_work(&dir, &work, 10).unwrap();
        record(&dir, &work, &fd, 10, 0, 5).unwrap();
        drop(fd);
        std::fs::remove_file(t.path().join(std::str::from_utf8(&work).unwrap())).unwrap();
        let fd = open_work(&dir, &work, 10).unwrap();
        assert_eq!(claim(&fd, 10, 0, 5).unwrap(), Claim::Write);
        assert_eq!(
            record(&dir, &work, &fd, 10, 5, 10).unwrap(),
            Recorded::Partial
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
        std::fs::write(t.path().join("f.fastcp-shard-0123456789abcdef"), b"").unwrap();
        remove_other_versions(&dir, b"f");
        let mut left: Vec<_> = std::fs::read_dir(t.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        left.sort();
        let g = String::from_utf8(work_name(b"g", 1, (0, 0))).unwrap();
        assert_eq!(
            left,
            [g, "f".into(), "f.fastcp-shard-0123456789abcdef".into()]
        );
    }

    #[test]
    fn a_damaged_trailer_counts_as_none() {
        let (t, dir) = dir();
        let work = work_name(b"f", 100, (0, 0));
        let fd = open_work(&dir, &work, 100).unwrap();
        record(&dir, &work, &fd, 100, 0, 90).unwrap();
        let path = t.path().join(std::str::from_utf8(&work).unwrap());
        let mut bytes = std::fs::read(&path).unwrap();
        let last = bytes.len() - 1;
        bytes[last] ^= 1;
        std::fs::write(&path, &bytes).unwrap();
        assert_eq!(claim(&fd, 100, 0, 90).unwrap(), Claim::Write);
        assert_eq!(
            record(&dir, &work, &fd, 100, 90, 100).unwrap(),
            Recorded::Partial
        );
    }

    #[test]
    fn a_work_file_that_is_not_ours_is_refused() {
        let (t, dir) = dir();
        let work = work_name(b"f", 10, (0, 0));
        let path = t.path().join(std::str::from_utf8(&work).unwrap());
        std::os::unix::fs::symlink("/etc/passwd", &path).unwrap();
        assert!(open_work(&dir, &work, 10).is_err());
        std::fs::remove_file(&path).unwrap();
        std::fs::write(&path, [0u8; 3]).unwrap();
        std::fs::hard_link(&path, t.path().join("second")).unwrap();
        assert!(open_work(&dir, &work, 10).is_err(), "two links");
    }
}
