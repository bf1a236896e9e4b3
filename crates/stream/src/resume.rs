//! `--resume`: the receiver's partial files and the block hashes it offers from them.
//!
//! With resume on, the receiver writes each file bigger than [`PARTIAL_MIN`] to the fixed
//! temp name `.NAME.fastcp-partial` (see [`partial_name`]) and keeps it when the copy stops
//! before the file is complete. A later copy's probe for that file is answered with the
//! XXH3-128 of each block the partial file holds ([`block_hashes`]); the sender hashes the
//! same blocks of its source as it reads them and sends a `Keep` for each that matches.
//! What a block holds is judged by its content, so a partial file cut anywhere, with chunks
//! written out of order or never flushed, only costs the blocks that differ.

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

/// What the receiver offered for one file: the hashes of its partial file's first blocks.
#[derive(Debug, Clone)]
pub(crate) struct Offer {
    pub(crate) block: u64,
    pub(crate) hashes: Vec<u128>,
}

impl Offer {
    /// The hash the receiver offered for the block at `offset` of `len` bytes of a file of
    /// `size` bytes, if it offered that exact block.
    pub(crate) fn hash(&self, offset: u64, len: u64, size: u64) -> Option<u128> {
        if !offset.is_multiple_of(self.block) || len != self.block.min(size.saturating_sub(offset))
        {
            return None;
        }
        self.hashes.get((offset / self.block) as usize).copied()
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
