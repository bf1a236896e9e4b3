//! `--resume`: the receiver's partial files and the block hashes it offers from them.
//!
//! With resume on, the receiver writes each file bigger than [`PARTIAL_MIN`] to the fixed
//! temp name `.NAME.fastcp-partial` (see [`partial_name`]) and keeps it when the copy stops
//! before the file is complete. A later copy's probe for that file is answered with the
//! XXH3-128 of each block the partial file holds ([`block_hashes`]); the sender hashes the
//! same blocks of its source as it reads them and sends a `Keep` for each that matches.
//! What a block holds is judged by its content, so a partial file cut anywhere, with chunks
//! written out of order or never flushed, only costs the blocks that differ.

use std::collections::BTreeMap;
use std::io;
use std::os::fd::OwnedFd;

use rustix::fs::{FileType, FlockOperation, Mode, OFlags};
use twox_hash::XxHash3_128;

/// Files bigger than this keep a partial file with `--resume`; smaller ones are resent whole.
pub const PARTIAL_MIN: u64 = 4 << 20;

/// The smallest block a partial file is hashed in.
const BLOCK_MIN: u64 = 1 << 20;

/// The block size for a file of `size` bytes: at least [`BLOCK_MIN`], a whole number of MiB,
/// and large enough that [`fastcp_proto::MAX_PARTIAL_HASHES`] blocks cover the file.
pub(crate) fn block_size(size: u64) -> u64 {
    const MIB: u64 = 1 << 20;
    let fit = size.div_ceil(fastcp_proto::MAX_PARTIAL_HASHES as u64);
    fit.div_ceil(MIB).saturating_mul(MIB).max(BLOCK_MIN)
}

/// The partial file's name beside `name` (`--resume`): `.NAME.fastcp-partial`, short enough
/// for any file system. It is not one of the random temp names a later copy sweeps away.
///
/// ```
/// assert_eq!(fastcp_stream::partial_name(b"big.iso"), b".big.iso.fastcp-partial");
/// ```
pub fn partial_name(name: &[u8]) -> Vec<u8> {
    let keep = &name[..name.len().min(200)];
    let mut v = Vec::with_capacity(keep.len() + 16);
    v.push(b'.');
    v.extend_from_slice(keep);
    v.extend_from_slice(b".fastcp-partial");
    v
}

/// The name whose partial file `partial` is, when its name was not cut short (see
/// [`partial_name`]).
///
/// ```
/// assert_eq!(fastcp_stream::partial_target(b".big.iso.fastcp-partial"), Some(&b"big.iso"[..]));
/// assert_eq!(fastcp_stream::partial_target(b"big.iso"), None);
/// ```
pub fn partial_target(partial: &[u8]) -> Option<&[u8]> {
    let name = partial
        .strip_prefix(b".")?
        .strip_suffix(b".fastcp-partial")?;
    (!name.is_empty() && name.len() < 200).then_some(name)
}

/// Opens (or, with `create`, creates) the partial file `name` in `dir` for this copy alone:
/// a regular file with one link, reached without following a symlink, that no other live
/// copy holds. The returned descriptor holds an exclusive `flock` until it is closed. `None`
/// when there is no such file, or it cannot be had.
pub(crate) fn open_partial(dir: &OwnedFd, name: &[u8], create: bool) -> Option<OwnedFd> {
    let mut flags = OFlags::RDWR | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC;
    if create {
        flags |= OFlags::CREATE;
    }
    let fd = rustix::fs::openat(dir, name, flags, Mode::from_raw_mode(0o600)).ok()?;
    let st = rustix::fs::fstat(&fd).ok()?;
    if FileType::from_raw_mode(st.st_mode) != FileType::RegularFile || st.st_nlink != 1 {
        return None;
    }
    rustix::fs::flock(&fd, FlockOperation::NonBlockingLockExclusive).ok()?;
    Some(fd)
}

/// Removes the partial file `name` from `dir` unless a live copy holds it (or it is not a
/// plain file with one name).
pub(crate) fn remove_unheld_partial(dir: &OwnedFd, name: &[u8]) {
    // Held (locked) until it is gone.
    if let Some(_held) = open_partial(dir, name, false) {
        let _ = rustix::fs::unlinkat(dir, name, rustix::fs::AtFlags::empty());
    }
}

/// What the receiver offered for one file: the hashes of its partial file's first blocks.
#[derive(Debug, Clone)]
pub(crate) struct Offer {
    pub(crate) block: u64,
    pub(crate) hashes: Vec<u128>,
    /// For an offer from a [`Record`]: the source it vouches for.
    pub(crate) version: Option<Version>,
}

impl Offer {
    /// The hash the receiver offered for the block at `offset` of `len` bytes of a file of
    /// `size` bytes, if it offered that exact block.
    pub(crate) fn hash(&self, offset: u64, len: u64, size: u64) -> Option<u128> {
        if !offset.is_multiple_of(self.block) || len != self.block.min(size.saturating_sub(offset))
        {
            return None;
        }
        let hash = self.hashes.get((offset / self.block) as usize).copied();
        hash.filter(|&h| h != fastcp_proto::NOT_HELD)
    }

    /// The byte ranges of the blocks held, for a record of what the file holds.
    pub(crate) fn held(&self, size: u64) -> BTreeMap<u64, u64> {
        let mut ranges = BTreeMap::new();
        let mut last: Option<(u64, u64)> = None;
        for (i, &h) in self.hashes.iter().enumerate() {
            let start = i as u64 * self.block;
            let end = (start + self.block).min(size);
            if h == fastcp_proto::NOT_HELD || start >= end {
                continue;
            }
            match &mut last {
                Some((_, e)) if *e == start => *e = end,
                _ => {
                    if let Some((s, e)) = last.take() {
                        ranges.insert(s, e);
                    }
                    last = Some((start, end));
                }
            }
        }
        if let Some((s, e)) = last {
            ranges.insert(s, e);
        }
        ranges
    }
}

/// The extended attribute that holds a partial file's [`Record`].
const RECORD_ATTR: &str = "user.fastcp.resume";

/// The record's first bytes.
const RECORD_MAGIC: &[u8; 8] = b"FCRESUM2";

/// The most ranges a record keeps: the value stays within the 4 KiB that every file system
/// with extended attributes allows. Ranges past these are sent again.
const RECORD_RANGES: usize = 128;

/// The smallest block offered from a record: a cut loses at most one block at the edge of
/// each range that was being written.
const RECORD_BLOCK_MIN: u64 = 64 << 10;

/// The source a [`Record`] speaks for: its size and modification time, and the XXH3-64 of
/// its whole name (names over 200 bytes share a partial file's name).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Version {
    pub(crate) size: u64,
    pub(crate) mtime: (i64, u32),
    pub(crate) name: u64,
}

impl Version {
    pub(crate) fn new(name: &[u8], size: u64, mtime: (i64, u32)) -> Version {
        let name = twox_hash::XxHash3_64::oneshot(name);
        Version { size, mtime, name }
    }
}

/// For a sender that cannot read its source to compare hashes (the SFTP pull): which bytes
/// of a partial file arrived, were checked and are on disk, and the version of the source
/// they came from. Kept in an extended attribute of the partial file ([`Record::save`]), so
/// it lives and dies with the file's inode; where the file system has none, nothing is
/// recorded and the next copy sends the file whole.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Record {
    pub(crate) version: Version,
    /// Start -> end, adjacent ranges merged.
    pub(crate) ranges: BTreeMap<u64, u64>,
}

/// The record's bytes before its ranges: magic, size, mtime seconds and nanoseconds, name.
const RECORD_HEAD: usize = 36;

impl Record {
    /// The record of `fd`, if it has one that decodes.
    pub(crate) fn load(fd: &OwnedFd) -> Option<Record> {
        let mut buf = vec![0u8; RECORD_HEAD + 16 * RECORD_RANGES];
        let n = rustix::fs::fgetxattr(fd, RECORD_ATTR, &mut buf).ok()?;
        let v = buf.get(..n)?;
        let (head, pairs) = v.split_at_checked(RECORD_HEAD)?;
        let word = |at: usize| u64::from_le_bytes(head[at..at + 8].try_into().unwrap());
        if &head[..8] != RECORD_MAGIC || !pairs.len().is_multiple_of(16) {
            return None;
        }
        let nsec = u32::from_le_bytes(head[24..28].try_into().unwrap());
        let mut ranges = BTreeMap::new();
        for pair in pairs.chunks(16) {
            let start = u64::from_le_bytes(pair[..8].try_into().unwrap());
            let end = u64::from_le_bytes(pair[8..].try_into().unwrap());
            if start < end {
                ranges.insert(start, end);
            }
        }
        let version = Version {
            size: word(8),
            mtime: (word(16) as i64, nsec),
            name: word(28),
        };
        Some(Record { version, ranges })
    }

    /// Writes the record onto `fd`, whose bytes must already be on disk: a record never
    /// vouches for bytes a crash could still lose. At most [`RECORD_RANGES`] ranges, the
    /// first ones.
    pub(crate) fn save(&self, fd: &OwnedFd) -> io::Result<()> {
        let mut v = Vec::with_capacity(RECORD_HEAD + 16 * self.ranges.len().min(RECORD_RANGES));
        let Version { size, mtime, name } = self.version;
        v.extend_from_slice(RECORD_MAGIC);
        v.extend_from_slice(&size.to_le_bytes());
        v.extend_from_slice(&mtime.0.to_le_bytes());
        v.extend_from_slice(&mtime.1.to_le_bytes());
        v.extend_from_slice(&name.to_le_bytes());
        for (start, end) in self.ranges.iter().take(RECORD_RANGES) {
            v.extend_from_slice(&start.to_le_bytes());
            v.extend_from_slice(&end.to_le_bytes());
        }
        rustix::fs::fsetxattr(fd, RECORD_ATTR, &v, rustix::fs::XattrFlags::empty())?;
        Ok(())
    }

    /// Adds `[start, end)` to the ranges, merged with any it overlaps or touches.
    pub(crate) fn add(&mut self, start: u64, end: u64) {
        crate::pieces::insert(&mut self.ranges, start, end);
    }

    /// Whether a record may be kept for a source modified at `mtime` (seconds): not when
    /// it was modified less than 2 s before now by this host's clock. Times are whole
    /// seconds over SFTP, so a source rewritten within the second it was read keeps its
    /// time, and a record of that read would vouch for bytes of a version gone.
    pub(crate) fn may_record(mtime: i64) -> bool {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs() as i64);
        mtime < now - 1
    }

    /// Removes any record from `fd`: its bytes are about to change, or to take their final
    /// name.
    pub(crate) fn clear(fd: &OwnedFd) {
        let _ = rustix::fs::fremovexattr(fd, RECORD_ATTR);
    }

    /// What to offer for a probe of `version`, from a partial file of `have` bytes: the
    /// block size, and for each block [`fastcp_proto::NOT_HELD`] or 1 (held: inside one
    /// recorded range, and within `have`), up to the last held one. `None` when the record
    /// is of another version or another file, or holds no whole block.
    pub(crate) fn offer(&self, version: Version, have: u64) -> Option<Offer> {
        if self.version != version {
            return None;
        }
        let size = version.size;
        let fit = size.div_ceil(fastcp_proto::MAX_PARTIAL_HASHES as u64);
        let block = fit
            .div_ceil(RECORD_BLOCK_MIN)
            .saturating_mul(RECORD_BLOCK_MIN);
        let mut hashes = Vec::new();
        let mut at = 0;
        while at < size {
            let end = (at + block).min(size);
            let held = end <= have
                && self
                    .ranges
                    .range(..=at)
                    .next_back()
                    .is_some_and(|(_, &e)| e >= end);
            hashes.push(if held { 1 } else { fastcp_proto::NOT_HELD });
            at = end;
        }
        while hashes.last() == Some(&fastcp_proto::NOT_HELD) {
            hashes.pop();
        }
        (!hashes.is_empty()).then_some(Offer {
            block,
            hashes,
            version: Some(version),
        })
    }
}

/// A long hash sends its hashes every this many bytes hashed, in a `Partial` frame of their
/// own: the sender sees progress, and neither side's `--timeout` takes it for a stall.
pub(crate) const PIECE_BYTES: u64 = 256 << 20;

/// The XXH3-128 of each whole block of `block` bytes of `fd` from offset 0, as far as both
/// the file and `size` (the sender's size) go; the last block may end at `size`, shorter.
/// `piece` gets the new hashes each time they cover [`PIECE_BYTES`] (and the rest at the
/// end), with the bytes they cover.
pub(crate) fn block_hashes(
    fd: &OwnedFd,
    size: u64,
    block: u64,
    mut piece: impl FnMut(&[u128], u64),
) -> io::Result<Vec<u128>> {
    let have = rustix::fs::fstat(fd)?.st_size as u64;
    let end = have.min(size);
    let mut hashes = Vec::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut offset = 0;
    // The hashes handed to `piece` so far, and the offset they reach.
    let (mut given, mut reported) = (0, 0);
    while offset < end && hashes.len() < fastcp_proto::MAX_PARTIAL_HASHES {
        let len = block.min(size - offset);
        if offset + len > end {
            break;
        }
        let mut h = XxHash3_128::new();
        let mut at = offset;
        while at < offset + len {
            let n = buf.len().min((offset + len - at) as usize);
            let got = rustix::io::pread(fd, &mut buf[..n], at)?;
            if got == 0 {
                // Shorter than it was: what is hashed so far.
                if given < hashes.len() {
                    piece(&hashes[given..], offset - reported);
                }
                return Ok(hashes);
            }
            h.write(&buf[..got]);
            at += got as u64;
        }
        hashes.push(h.finish_128());
        offset += len;
        if offset - reported >= PIECE_BYTES {
            piece(&hashes[given..], offset - reported);
            (given, reported) = (hashes.len(), offset);
        }
    }
    if given < hashes.len() {
        piece(&hashes[given..], offset - reported);
    }
    Ok(hashes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_are_whole_mebibytes_and_few() {
        assert_eq!(block_size(0), BLOCK_MIN);
        assert_eq!(block_size(10 << 20), BLOCK_MIN);
        let big = 500u64 << 30;
        let b = block_size(big);
        assert_eq!(b % (1 << 20), 0);
        assert!(big.div_ceil(b) <= fastcp_proto::MAX_PARTIAL_HASHES as u64);
    }

    #[test]
    fn offers_name_exact_blocks_only() {
        let offer = Offer {
            block: 4,
            hashes: vec![1, 2, 3],
            version: None,
        };
        assert_eq!(offer.hash(0, 4, 10), Some(1));
        assert_eq!(offer.hash(8, 2, 10), Some(3));
        assert_eq!(offer.hash(8, 4, 10), None, "past the file's end");
        assert_eq!(offer.hash(2, 4, 10), None, "not on a block boundary");
        assert_eq!(offer.hash(4, 3, 10), None, "not a whole block");
        assert_eq!(offer.hash(12, 4, 20), None, "not offered");
    }

    #[test]
    fn hashes_cover_what_both_sides_hold() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("p");
        let data: Vec<u8> = (0..10u8).collect();
        std::fs::write(&path, &data).unwrap();
        let fd: OwnedFd = std::fs::File::open(&path).unwrap().into();
        let h = |b: &[u8]| XxHash3_128::oneshot(b);
        // The sender's file is longer: only whole blocks of the partial count.
        assert_eq!(
            block_hashes(&fd, 100, 4, |_, _| {}).unwrap(),
            vec![h(&data[..4]), h(&data[4..8])]
        );
        // The sender's file ends at 10: the last, short block counts too.
        assert_eq!(
            block_hashes(&fd, 10, 4, |_, _| {}).unwrap(),
            vec![h(&data[..4]), h(&data[4..8]), h(&data[8..])]
        );
        // Shorter than the partial: what the sender's size covers, its short last block too.
        assert_eq!(
            block_hashes(&fd, 6, 4, |_, _| {}).unwrap(),
            vec![h(&data[..4]), h(&data[4..6])]
        );
    }

    #[test]
    fn hashes_come_in_pieces_that_cover_them_all() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("p");
        let block = 64 << 20;
        let file = std::fs::File::create(&path).unwrap();
        file.set_len(10 * block).unwrap();
        let fd: OwnedFd = std::fs::File::open(&path).unwrap().into();
        let mut pieces = Vec::new();
        let all = block_hashes(&fd, 10 * block, block, |p, bytes| {
            pieces.push((p.to_vec(), bytes))
        })
        .unwrap();
        // 256 MiB a piece: four blocks, four blocks, then the last two.
        let sizes: Vec<_> = pieces.iter().map(|(p, b)| (p.len(), *b)).collect();
        assert_eq!(sizes, [(4, 4 * block), (4, 4 * block), (2, 2 * block)]);
        let joined: Vec<u128> = pieces.into_iter().flat_map(|(p, _)| p).collect();
        assert_eq!(joined, all);
    }

    #[test]
    fn a_record_offers_the_whole_blocks_it_holds_for_its_version_only() {
        const K: u64 = RECORD_BLOCK_MIN;
        let size = 10 * K + 100;
        let version = Version::new(b"big", size, (1_700_000_000, 0));
        let record = Record {
            version,
            // Block 0 and 1 whole, 2 in part, 4 whole but 5 in part, the last short one.
            ranges: BTreeMap::from([(0, 2 * K + 10), (4 * K, 5 * K + 3), (10 * K, size)]),
        };
        let offer = record.offer(version, size).expect("held blocks");
        assert_eq!(offer.block, K);
        let held: Vec<bool> = offer.hashes.iter().map(|&h| h != 0).collect();
        let want = [
            true, true, false, false, true, false, false, false, false, false, true,
        ];
        assert_eq!(held, want);
        assert_eq!(offer.hash(2 * K, K, size), None, "not held");
        assert!(
            offer.hash(10 * K, 100, size).is_some(),
            "the short last block"
        );
        assert_eq!(
            offer.held(size),
            BTreeMap::from([(0, 2 * K), (4 * K, 5 * K), (10 * K, size)])
        );
        for (other, what) in [
            (
                Version::new(b"big", size, (1_700_000_001, 0)),
                "another time",
            ),
            (
                Version::new(b"big", size + 1, (1_700_000_000, 0)),
                "another size",
            ),
            (
                Version::new(b"bigger", size, (1_700_000_000, 0)),
                "another name",
            ),
        ] {
            assert!(record.offer(other, size).is_none(), "{what}");
        }
        let none = Record {
            ranges: BTreeMap::from([(K + 1, 2 * K + 1)]),
            ..record
        };
        assert!(none.offer(version, size).is_none(), "no whole block");
    }

    #[test]
    fn ranges_added_to_a_record_join_what_they_overlap_or_touch() {
        let mut r = Record {
            version: Version::new(b"f", 1000, (0, 0)),
            ranges: BTreeMap::from([(0, 900)]),
        };
        r.add(0, 64);
        assert_eq!(r.ranges, BTreeMap::from([(0, 900)]), "inside one");
        r.add(950, 960);
        r.add(970, 980);
        r.add(900, 975);
        assert_eq!(r.ranges, BTreeMap::from([(0, 980)]), "across three");
        r.add(990, 1000);
        assert_eq!(r.ranges, BTreeMap::from([(0, 980), (990, 1000)]));
    }

    #[test]
    fn a_record_offers_nothing_past_the_partial_files_end() {
        const K: u64 = RECORD_BLOCK_MIN;
        let version = Version::new(b"f", 8 * K, (0, 0));
        let record = Record {
            version,
            ranges: BTreeMap::from([(0, 8 * K)]),
        };
        let offer = record.offer(version, 3 * K + 5).unwrap();
        assert_eq!(
            offer.hashes,
            vec![1, 1, 1],
            "cut short by hand: three blocks left"
        );
        assert_eq!(offer.version, Some(version));
    }

    #[test]
    fn a_record_lives_on_its_file_until_cleared() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("p");
        std::fs::write(&path, b"x").unwrap();
        let fd: OwnedFd = std::fs::File::open(&path).unwrap().into();
        assert_eq!(Record::load(&fd), None);
        let record = Record {
            version: Version::new(b"p", 1 << 30, (-5, 7)),
            ranges: (0..200u64).map(|i| (i * 10, i * 10 + 5)).collect(),
        };
        record.save(&fd).unwrap();
        let loaded = Record::load(&fd).expect("saved");
        assert_eq!(loaded.version, record.version);
        // The first ranges only: the rest are sent again.
        let first: BTreeMap<u64, u64> = record.ranges.into_iter().take(RECORD_RANGES).collect();
        assert_eq!(loaded.ranges, first);
        Record::clear(&fd);
        assert_eq!(Record::load(&fd), None);
    }

    #[test]
    fn a_partial_files_name_gives_its_files_unless_cut() {
        assert_eq!(
            partial_target(&partial_name(b"big.iso")),
            Some(&b"big.iso"[..])
        );
        let long = vec![b'x'; 250];
        assert_eq!(
            partial_target(&partial_name(&long)),
            None,
            "cut at 200 bytes"
        );
        assert_eq!(partial_target(b".fastcp-partial"), None);
        assert_eq!(partial_target(b"big.fastcp-partial"), None);
    }

    #[test]
    fn a_partial_held_by_another_copy_or_a_link_is_not_taken() {
        let dir = tempfile::tempdir().unwrap();
        let dfd: OwnedFd = std::fs::File::open(dir.path()).unwrap().into();
        assert!(open_partial(&dfd, b"none", false).is_none());
        let held = open_partial(&dfd, b"p", true).expect("created");
        assert!(open_partial(&dfd, b"p", false).is_none(), "locked");
        drop(held);
        assert!(open_partial(&dfd, b"p", false).is_some());
        std::os::unix::fs::symlink("p", dir.path().join("l")).unwrap();
        assert!(open_partial(&dfd, b"l", false).is_none(), "a symlink");
        std::fs::hard_link(dir.path().join("p"), dir.path().join("h")).unwrap();
        assert!(open_partial(&dfd, b"h", false).is_none(), "two links");
    }
}
