//! The checksum a `FileEnd` carries, computed by the sender as it reads a file and by the
//! receiver as chunks arrive, in any order and on any stream.
//!
//! What it is for: catching accidental damage between the sender's read and the receiver's
//! write (a chunk written at the wrong offset, a buffer reused too early, a bug in either
//! engine). It is not what makes a copy secure: every byte on the wire is already
//! authenticated by the transport (SSH's MAC, or fastcp's AEAD records on TCP), and a peer
//! that could choose a file's bytes could choose its checksum too. So protocol version 3 uses
//! XXH3-128, a non-cryptographic 128-bit hash that runs several times faster than BLAKE3 (rsync
//! uses the same hash for its whole-file check); versions 1 and 2 use BLAKE3 of the whole file.
//!
//! Version 3's checksum of a file sent as `Data` frames of payloads `p_i` at offsets `o_i`
//! (empty payloads skipped) is the XXH3-128 of the concatenation, in offset order, of
//! `o_i` (u64), `len(p_i)` (u64) and `XXH3-128(p_i)` (u128), all little-endian; the 16-byte
//! digest (little-endian) is followed by 16 zero bytes. Each chunk is hashed where it arrives;
//! only the 32-byte records are put in order. From version 8 a hole the sender skipped
//! (a `Hole` frame) is a record of its offset and length with the hash 0.

use std::collections::BTreeMap;

use twox_hash::XxHash3_128;

/// XXH3-128 of `bytes`, in one call (with AVX2 where the CPU has it, found at run time).
pub(crate) fn xxh3_128(bytes: &[u8]) -> u128 {
    XxHash3_128::oneshot(bytes)
}

/// The XXH3-128 of `len` zero bytes: what a block of zeros of a partial file is offered
/// with (`--resume`). The last length asked on each thread is remembered.
pub(crate) fn zeros_hash(len: u64) -> u128 {
    static ZEROS: [u8; 1 << 20] = [0; 1 << 20];
    thread_local! {
        static LAST: std::cell::Cell<Option<(u64, u128)>> = const { std::cell::Cell::new(None) };
    }
    if let Some((l, h)) = LAST.get()
        && l == len
    {
        return h;
    }
    let mut hasher = twox_hash::XxHash3_128::new();
    let mut left = len;
    while left > 0 {
        let n = left.min(ZEROS.len() as u64) as usize;
        hasher.write(&ZEROS[..n]);
        left -= n as u64;
    }
    let h = hasher.finish_128();
    LAST.set(Some((len, h)));
    h
}

/// The hash `--checksum` compares a file's content by (rsync's `--checksum`): both sides
/// hash their copy, and a file whose hashes match is not sent.
///
/// ```
/// use fastcp_stream::ContentHash;
///
/// let hash = ContentHash::Sha256.of(&b"abc"[..]).unwrap();
/// // The first 16 bytes of SHA-256("abc"), big-endian.
/// assert_eq!(hash, 0xba7816bf_8f01cfea_414140de_5dae2223);
/// assert_ne!(hash, ContentHash::Xxh3.of(&b"abc"[..]).unwrap());
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum ContentHash {
    /// XXH3-128 of the whole file: what two fastcp peers compare.
    #[default]
    Xxh3,
    /// SHA-256, which a host with only stock tools can compute (`openssl dgst`,
    /// `sha256sum`, `shasum`): what fastcp's SFTP path compares. A file of up to
    /// [`SHA256_RANGE`] bytes hashes to its SHA-256; a bigger one to the SHA-256 of its
    /// ranges' SHA-256 digests in order (see [`sha256_of_ranges`]), so that its ranges can be
    /// hashed at once by several processes. The hash is the digest's first 16 bytes, read
    /// big-endian.
    Sha256,
}

/// The ranges [`ContentHash::Sha256`] hashes a big file by: 256 MiB.
pub const SHA256_RANGE: u64 = 256 << 20;

/// [`ContentHash::Sha256`] of a file from the SHA-256 digests of its [`SHA256_RANGE`]
/// ranges, in order (one digest: a file of up to one range).
///
/// ```
/// use fastcp_stream::{ContentHash, sha256_of_ranges};
/// use sha2::{Digest, Sha256};
///
/// let digest: [u8; 32] = Sha256::digest(b"abc").into();
/// assert_eq!(sha256_of_ranges(&[digest]), ContentHash::Sha256.of(&b"abc"[..]).unwrap());
/// ```
pub fn sha256_of_ranges(digests: &[[u8; 32]]) -> u128 {
    use sha2::Digest;
    let whole: [u8; 32] = match digests {
        [one] => *one,
        _ => sha2::Sha256::digest(digests.concat()).into(),
    };
    u128::from_be_bytes(whole[..16].try_into().expect("16 bytes"))
}

impl ContentHash {
    /// The hash of everything `r` reads.
    pub fn of(self, r: impl std::io::Read) -> std::io::Result<u128> {
        content_hash(self, r, &crate::Progress::default())
    }
}

/// The `kind` hash of everything `r` reads (see [`ContentHash`]). The bytes read count in
/// `progress` as checked.
pub(crate) fn content_hash(
    kind: ContentHash,
    r: impl std::io::Read,
    progress: &crate::Progress,
) -> std::io::Result<u128> {
    match kind {
        ContentHash::Xxh3 => {
            let mut h = XxHash3_128::new();
            read_all(r, progress, |bytes| h.write(bytes))?;
            Ok(h.finish_128())
        }
        ContentHash::Sha256 => sha256_by_ranges(r, SHA256_RANGE, progress),
    }
}

/// Opens `name` in `dir` to hash it (following a symlink only with `follow`) and, where this
/// process may (it owns the file, or is root), without touching its access time: a
/// `--checksum` pass reads every file, and the times `-p` then sends, or a skipped file
/// keeps, are the ones from before it.
pub(crate) fn open_to_hash(
    dir: impl rustix::fd::AsFd,
    name: &[u8],
    follow: bool,
) -> rustix::io::Result<std::fs::File> {
    use rustix::fs::{Mode, OFlags};
    let mut flags = OFlags::RDONLY | OFlags::CLOEXEC | OFlags::NONBLOCK;
    if !follow {
        flags |= OFlags::NOFOLLOW;
    }
    let fd = match rustix::fs::openat(&dir, name, flags | OFlags::NOATIME, Mode::empty()) {
        Err(rustix::io::Errno::PERM) => rustix::fs::openat(&dir, name, flags, Mode::empty())?,
        opened => opened?,
    };
    Ok(std::fs::File::from(fd))
}

/// [`ContentHash::Sha256`] with ranges of `range` bytes.
fn sha256_by_ranges(
    r: impl std::io::Read,
    range: u64,
    progress: &crate::Progress,
) -> std::io::Result<u128> {
    use sha2::Digest;
    let mut sha = sha2::Sha256::new();
    // The digests of the ranges before the current one, and the current one's length.
    let mut ranges: Vec<[u8; 32]> = Vec::new();
    let mut in_range = 0u64;
    read_all(r, progress, |mut bytes| {
        while !bytes.is_empty() {
            if in_range == range {
                ranges.push(sha.finalize_reset().into());
                in_range = 0;
            }
            let take = bytes.len().min((range - in_range) as usize);
            sha.update(&bytes[..take]);
            in_range += take as u64;
            bytes = &bytes[take..];
        }
    })?;
    ranges.push(sha.finalize().into());
    Ok(sha256_of_ranges(&ranges))
}

/// Hands everything `r` reads to `take`, counting it in `progress` as checked.
fn read_all(
    mut r: impl std::io::Read,
    progress: &crate::Progress,
    mut take: impl FnMut(&[u8]),
) -> std::io::Result<()> {
    // One buffer per thread, made once: a fresh zeroed 1 MiB for each file cost more than
    // hashing a tree of small files.
    thread_local! {
        static BUF: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
    }
    BUF.with_borrow_mut(|buf| {
        buf.resize(1 << 20, 0);
        loop {
            match r.read(buf) {
                Ok(0) => return Ok(()),
                Ok(n) => {
                    take(&buf[..n]);
                    progress.add_checked(n as u64);
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
    })
}

use crate::tree::{self, TreeHash};

/// The hash of one chunk, computed where it arrived.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ChunkHash {
    /// Versions 1 and 2: the chunk's place in the file's BLAKE3 tree.
    Blake3(tree::ChunkHash),
    /// Version 3: the chunk's XXH3-128.
    Xxh3(u128),
}

/// Which checksum a session uses: BLAKE3 with a peer of protocol version 1 or 2, XXH3-128
/// from version 3.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Algorithm {
    Blake3,
    Xxh3,
    /// XXH3's fold of `(offset, length, hash)` records with every hash 0: it proves that the
    /// ranges arrived, once each, as they were sent, without hashing their bytes. For a
    /// channel that authenticates every byte itself (see [`ReceiveConfig::hash_content`]).
    ///
    /// [`ReceiveConfig::hash_content`]: crate::ReceiveConfig::hash_content
    Ranges,
}

impl Algorithm {
    pub(crate) fn for_version(version: u16) -> Algorithm {
        if version >= 3 {
            Algorithm::Xxh3
        } else {
            Algorithm::Blake3
        }
    }

    /// Hashes the chunk `bytes` at `offset` of a file of `size` bytes.
    pub(crate) fn chunk(self, size: u64, offset: u64, bytes: &[u8]) -> ChunkHash {
        match self {
            Algorithm::Blake3 => ChunkHash::Blake3(tree::chunk_hash(size, offset, bytes)),
            Algorithm::Xxh3 | Algorithm::Ranges => ChunkHash::Xxh3(self.content(bytes)),
        }
    }

    /// What XXH3's fold records for `bytes`: their hash, or 0 when only ranges count.
    fn content(self, bytes: &[u8]) -> u128 {
        match self {
            Algorithm::Ranges => 0,
            _ => xxh3_128(bytes),
        }
    }

    /// The algorithm a sender with `config` computes its checksums with.
    pub(crate) fn for_sender(config: &crate::SendConfig) -> Algorithm {
        if config.hash_content || config.resume {
            Algorithm::for_version(config.version)
        } else {
            Algorithm::Ranges
        }
    }

    /// The algorithm a receiver with `config` checks files with.
    pub(crate) fn for_receiver(config: &crate::ReceiveConfig) -> Algorithm {
        if config.hash_content || (config.resume && !config.resume_from_record) {
            Algorithm::for_version(config.version)
        } else {
            Algorithm::Ranges
        }
    }

    /// The checksum of a file sent in one `Data` frame (none when it is empty).
    pub(crate) fn whole(self, content: &[u8]) -> [u8; 32] {
        match self {
            Algorithm::Blake3 => *blake3::hash(content).as_bytes(),
            Algorithm::Xxh3 | Algorithm::Ranges => {
                let mut f = Fold::default();
                f.push(0, content.len() as u64, self.content(content));
                f.finish()
            }
        }
    }

    /// A checksum fed with a file's chunks in order, as the sender reads them.
    pub(crate) fn sequential(self) -> Sequential {
        match self {
            Algorithm::Blake3 => Sequential::Blake3(Box::new(blake3::Hasher::new())),
            Algorithm::Xxh3 => Sequential::Xxh3(Fold::default()),
            Algorithm::Ranges => Sequential::Ranges(Fold::default()),
        }
    }

    /// A checksum of the chunks of a file's piece that starts at `offset` (protocol version
    /// 6, so never BLAKE3), fed in any order.
    pub(crate) fn assembler_at(self, offset: u64) -> Assembler {
        Assembler::Xxh3 {
            fold: Fold::default(),
            next: offset,
            waiting: BTreeMap::new(),
        }
    }

    /// A checksum fed with a file's chunks in any order, as the receiver gets them.
    pub(crate) fn assembler(self, size: u64) -> Assembler {
        match self {
            Algorithm::Blake3 => Assembler::Blake3(TreeHash::new(size)),
            Algorithm::Xxh3 | Algorithm::Ranges => Assembler::Xxh3 {
                fold: Fold::default(),
                next: 0,
                waiting: BTreeMap::new(),
            },
        }
    }
}

/// The sender's checksum of a file read in order, one chunk after another.
pub(crate) enum Sequential {
    Blake3(Box<blake3::Hasher>),
    Xxh3(Fold),
    Ranges(Fold),
}

impl Sequential {
    /// Adds the chunk that starts where the last one ended.
    pub(crate) fn update(&mut self, offset: u64, bytes: &[u8]) {
        match self {
            Sequential::Blake3(h) => {
                h.update(bytes);
            }
            Sequential::Xxh3(f) => f.push(offset, bytes.len() as u64, xxh3_128(bytes)),
            Sequential::Ranges(f) => f.push(offset, bytes.len() as u64, 0),
        }
    }

    /// Adds a block kept from the receiver's partial copy (`--resume`, version 4 only) as
    /// one record with the block's XXH3-128.
    pub(crate) fn keep(&mut self, offset: u64, len: u64, hash: u128) {
        match self {
            Sequential::Blake3(_) => unreachable!("resume needs protocol version 4"),
            Sequential::Xxh3(f) => f.push(offset, len, hash),
            Sequential::Ranges(f) => f.push(offset, len, 0),
        }
    }

    /// Adds a hole of the source (version 8 only), which reads as zeros and is not sent: one
    /// record with the hash 0, as the receiver folds the `Hole` frame in.
    pub(crate) fn hole(&mut self, offset: u64, len: u64) {
        match self {
            Sequential::Blake3(_) => unreachable!("holes need protocol version 8"),
            Sequential::Xxh3(f) | Sequential::Ranges(f) => f.push(offset, len, 0),
        }
    }

    pub(crate) fn finish(self) -> [u8; 32] {
        match self {
            Sequential::Blake3(h) => *h.finalize().as_bytes(),
            Sequential::Xxh3(f) | Sequential::Ranges(f) => f.finish(),
        }
    }
}

/// The receiver's checksum of a file whose chunks come in any order.
#[derive(Debug)]
pub(crate) enum Assembler {
    Blake3(TreeHash),
    Xxh3 {
        fold: Fold,
        /// Where the next chunk in order starts.
        next: u64,
        /// Chunks that came before the ones ahead of them: offset -> (length, hash).
        waiting: BTreeMap<u64, (u64, u128)>,
    },
}

impl Assembler {
    /// Chunks received ahead of a gap, waiting for it to be filled.
    pub(crate) fn pending(&self) -> usize {
        match self {
            Assembler::Xxh3 { waiting, .. } => waiting.len(),
            _ => 0,
        }
    }

    /// Adds the hash of chunk `[offset, offset + len)`. Empty chunks are skipped; chunks never
    /// overlap (the receiver refuses overlapping chunks before they get here).
    pub(crate) fn add(&mut self, offset: u64, len: u64, hash: ChunkHash) {
        if len == 0 {
            return;
        }
        match (self, hash) {
            (Assembler::Blake3(t), ChunkHash::Blake3(h)) => t.add(offset, len, h),
            (
                Assembler::Xxh3 {
                    fold,
                    next,
                    waiting,
                },
                ChunkHash::Xxh3(h),
            ) => {
                waiting.insert(offset, (len, h));
                while let Some((len, h)) = waiting.remove(next) {
                    fold.push(*next, len, h);
                    *next += len;
                }
            }
            (a, h) => unreachable!("a {h:?} chunk for a {a:?} file"),
        }
    }

    /// The file's checksum once every chunk is in, or `None` when it cannot be known from
    /// the chunks alone (a BLAKE3 file cut at odd offsets: read it back instead).
    pub(crate) fn finish(&self, size: u64) -> Option<[u8; 32]> {
        match self {
            Assembler::Blake3(_) if size == 0 => Some(*blake3::hash(b"").as_bytes()),
            Assembler::Blake3(t) => t.root(),
            Assembler::Xxh3 { fold, next, .. } => (*next == size).then(|| fold.finish()),
        }
    }
}

/// Version 3's fold of chunk records, in offset order, into one XXH3-128.
#[derive(Default)]
pub(crate) struct Fold(Box<XxHash3_128>);

impl std::fmt::Debug for Fold {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Fold")
    }
}

impl Fold {
    fn push(&mut self, offset: u64, len: u64, hash: u128) {
        if len == 0 {
            return;
        }
        let mut record = [0u8; 32];
        record[..8].copy_from_slice(&offset.to_le_bytes());
        record[8..16].copy_from_slice(&len.to_le_bytes());
        record[16..].copy_from_slice(&hash.to_le_bytes());
        self.0.write(&record);
    }

    fn finish(&self) -> [u8; 32] {
        let mut out = [0u8; 32];
        out[..16].copy_from_slice(&self.0.finish_128().to_le_bytes());
        out
    }
}

/// The checksum a `FileEnd` carries for a file sent whole in one `Data` frame (or, when empty,
/// in none), under protocol `version`: what a program that speaks the protocol itself (a test
/// playing a peer, say) needs to send a file.
///
/// The checksum catches accidental damage between the sender's read and the receiver's write;
/// the transport (SSH's MAC, or fastcp's AEAD records) is what authenticates the bytes. So
/// from version 3 it is XXH3-128, several times faster than BLAKE3, which versions 1 and 2
/// use. docs/protocol.md defines both.
///
/// ```
/// let v2 = fastcp_stream::whole_file_checksum(2, b"hello");
/// assert_eq!(v2, *blake3::hash(b"hello").as_bytes());
/// let v3 = fastcp_stream::whole_file_checksum(3, b"hello");
/// assert_ne!(v3, v2);
/// assert_eq!(v3[16..], [0; 16]);
/// ```
pub fn whole_file_checksum(version: u16, content: &[u8]) -> [u8; 32] {
    Algorithm::for_version(version).whole(content)
}

/// The checksum a `FileEnd` carries, for a program that speaks the protocol itself and reads
/// a file in chunks, in any order, perhaps on several tasks: add each `Data` payload at its
/// offset as it is sent, then [`finish`](FileChecksum::finish) once all of them are in.
///
/// ```
/// use fastcp_stream::{FileChecksum, whole_file_checksum};
///
/// let mut c = FileChecksum::new(4, 11);
/// c.add(6, b"world");
/// assert_eq!(c.finish(), None, "bytes 0..6 are missing");
/// c.add(0, b"hello ");
/// assert_ne!(c.finish(), Some(whole_file_checksum(4, b"hello world")), "cut in two frames");
///
/// let mut whole = FileChecksum::new(4, 11);
/// whole.add(0, b"hello world");
/// assert_eq!(whole.finish(), Some(whole_file_checksum(4, b"hello world")));
/// ```
#[derive(Debug)]
pub struct FileChecksum {
    algorithm: Algorithm,
    size: u64,
    /// Where the payloads end: the file's size, or its piece's end.
    end: u64,
    assembler: Assembler,
}

impl FileChecksum {
    /// A checksum under protocol `version` for a file of `size` bytes.
    pub fn new(version: u16, size: u64) -> FileChecksum {
        let algorithm = Algorithm::for_version(version);
        FileChecksum {
            algorithm,
            size,
            end: size,
            assembler: algorithm.assembler(size),
        }
    }

    /// For a program that feeds a receiver in its own process ([`ReceiveConfig::hash_content`]
    /// off): the checksum of the file's ranges alone, as such a receiver checks them, with
    /// no byte hashed.
    ///
    /// ```
    /// use fastcp_stream::FileChecksum;
    ///
    /// let mut c = FileChecksum::ranges_only(11);
    /// c.add(0, b"hello ");
    /// assert_eq!(c.finish(), None, "bytes 6..11 are missing");
    /// c.add(6, b"world");
    /// assert!(c.finish().is_some());
    /// ```
    ///
    /// [`ReceiveConfig::hash_content`]: crate::ReceiveConfig::hash_content
    pub fn ranges_only(size: u64) -> FileChecksum {
        let algorithm = Algorithm::Ranges;
        FileChecksum {
            algorithm,
            size,
            end: size,
            assembler: algorithm.assembler(size),
        }
    }

    /// The checksum of a `Piece`, bytes `offset..offset + len` of a file of `size` bytes
    /// (protocol version 6).
    ///
    /// ```
    /// use fastcp_stream::FileChecksum;
    ///
    /// // "world" of "hello world".
    /// let mut c = FileChecksum::piece(11, 6, 5);
    /// c.add(6, b"wor");
    /// assert_eq!(c.finish(), None);
    /// c.add(9, b"ld");
    /// assert!(c.finish().is_some());
    /// ```
    pub fn piece(size: u64, offset: u64, len: u64) -> FileChecksum {
        let algorithm = Algorithm::Xxh3;
        FileChecksum {
            algorithm,
            size,
            end: offset.saturating_add(len),
            assembler: algorithm.assembler_at(offset),
        }
    }

    /// Adds the payload of one `Data` frame at `offset`. Payloads must not overlap.
    pub fn add(&mut self, offset: u64, bytes: &[u8]) {
        let hash = self.algorithm.chunk(self.size, offset, bytes);
        self.assembler.add(offset, bytes.len() as u64, hash);
    }

    /// Adds a block the receiver kept (`--resume`): `len` bytes at `offset` for which a
    /// `Keep` frame went instead of `Data`, with the hash the receiver offered for it (a
    /// ranges-only checksum counts the range alone). Blocks and payloads must not overlap.
    ///
    /// # Panics
    ///
    /// Under protocol versions 1 and 2, which have no `Keep`.
    ///
    /// ```
    /// use fastcp_stream::FileChecksum;
    ///
    /// let mut c = FileChecksum::ranges_only(11);
    /// c.keep(0, 6, 1);
    /// c.add(6, b"world");
    /// assert!(c.finish().is_some());
    /// ```
    pub fn keep(&mut self, offset: u64, len: u64, hash: u128) {
        let hash = match self.algorithm {
            Algorithm::Ranges => 0,
            _ => hash,
        };
        self.assembler.add(offset, len, ChunkHash::Xxh3(hash));
    }

    /// Adds a hole of the source (protocol version 8): `len` bytes at `offset` that read as
    /// zeros, for which a `Hole` frame went instead of `Data`. Holes, blocks and payloads
    /// must not overlap.
    ///
    /// # Panics
    ///
    /// Under protocol versions 1 and 2, which have no `Hole`.
    ///
    /// ```
    /// use fastcp_stream::FileChecksum;
    ///
    /// let mut c = FileChecksum::new(8, 11);
    /// c.add(0, b"hello");
    /// assert_eq!(c.finish(), None, "bytes 5..11 are missing");
    /// c.hole(5, 6);
    /// assert!(c.finish().is_some());
    /// ```
    pub fn hole(&mut self, offset: u64, len: u64) {
        self.assembler.add(offset, len, ChunkHash::Xxh3(0));
    }

    /// The checksum, once payloads cover the whole file; `None` before (or, under versions 1
    /// and 2, for a file cut at offsets BLAKE3's tree cannot join).
    pub fn finish(&self) -> Option<[u8; 32]> {
        self.assembler.finish(self.end)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A file longer than one range hashes to the SHA-256 of its ranges' digests, whatever
    /// sizes its reads come in; one of up to a range, to its own SHA-256.
    #[test]
    fn sha256_by_ranges_hashes_each_range_then_their_digests() {
        use sha2::Digest;
        let data: Vec<u8> = (0..1000u32).map(|i| (i * 7 % 251) as u8).collect();
        let digest = |b: &[u8]| -> [u8; 32] { sha2::Sha256::digest(b).into() };
        let progress = crate::Progress::default();
        // Reads of 7 bytes, so that range edges fall inside reads.
        struct Small<'a>(&'a [u8]);
        impl std::io::Read for Small<'_> {
            fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
                let n = self.0.len().min(buf.len()).min(7);
                buf[..n].copy_from_slice(&self.0[..n]);
                self.0 = &self.0[n..];
                Ok(n)
            }
        }
        let ranges: Vec<[u8; 32]> = data.chunks(300).map(digest).collect();
        assert_eq!(ranges.len(), 4);
        let by_ranges = sha256_by_ranges(Small(&data), 300, &progress).unwrap();
        assert_eq!(by_ranges, sha256_of_ranges(&ranges));
        let whole = u128::from_be_bytes(digest(&data)[..16].try_into().unwrap());
        assert_ne!(by_ranges, whole);
        for len in [0, 1, 299, 300] {
            let one = sha256_by_ranges(Small(&data[..len]), 300, &progress).unwrap();
            let want = u128::from_be_bytes(digest(&data[..len])[..16].try_into().unwrap());
            assert_eq!(one, want, "{len} bytes");
        }
        assert_eq!(progress.snapshot().bytes_checked, 1000 + 600);
    }

    /// XXH3-128 (seed 0) as the reference implementation gives it, so that a change of the
    /// hashing crate, or of its code path on another CPU, cannot change the protocol's
    /// checksums.
    #[test]
    fn xxh3_128_matches_the_reference_values() {
        let data: Vec<u8> = (0..(1usize << 20) + 7)
            .map(|i| (i * 31 % 251) as u8)
            .collect();
        for (len, want) in [
            (0, 0x99aa06d3014798d86001c324468d497f_u128),
            (5, 0x8156cb136c7003e99f31da1ddba90baf),
            (200, 0xcab4b6c1d7f66c432a1a7281f2883dff),
            (1000, 0x17a0f7b2ab909d68404e1417800eb486),
            ((1 << 20) + 7, 0x8770f70a6e58f8280e288da8f2c28366),
        ] {
            assert_eq!(xxh3_128(&data[..len]), want, "{len} bytes");
            let mut streamed = XxHash3_128::new();
            for part in data[..len].chunks(4099) {
                streamed.write(part);
            }
            assert_eq!(streamed.finish_128(), want, "{len} bytes, streamed");
        }
    }

    fn data(len: usize) -> Vec<u8> {
        (0..len).map(|i| (i * 31 % 251) as u8).collect()
    }

    /// The sender's checksum of `content` cut into `chunk`-byte frames.
    fn sent(algo: Algorithm, content: &[u8], chunk: usize) -> [u8; 32] {
        if content.len() <= chunk {
            return algo.whole(content);
        }
        let mut s = algo.sequential();
        for (i, c) in content.chunks(chunk).enumerate() {
            s.update((i * chunk) as u64, c);
        }
        s.finish()
    }

    type Reorder<'a> = dyn Fn(&mut Vec<(usize, &[u8])>) + 'a;

    /// The receiver's checksum of the same frames, arriving in the order `order` gives.
    fn received(
        algo: Algorithm,
        content: &[u8],
        chunk: usize,
        order: impl Fn(&mut Vec<(usize, &[u8])>),
    ) -> Option<[u8; 32]> {
        let size = content.len() as u64;
        let mut a = algo.assembler(size);
        let mut parts: Vec<(usize, &[u8])> = content
            .chunks(chunk)
            .enumerate()
            .map(|(i, c)| (i * chunk, c))
            .collect();
        order(&mut parts);
        for (off, c) in parts {
            a.add(off as u64, c.len() as u64, algo.chunk(size, off as u64, c));
        }
        a.finish(size)
    }

    #[test]
    fn both_sides_agree_in_any_order() {
        for algo in [Algorithm::Blake3, Algorithm::Xxh3] {
            for size in [0, 1, 1024, 4097, 65536, 100_000, 1 << 20] {
                let content = data(size);
                for chunk in [1024, 16384, 1 << 20] {
                    let want = sent(algo, &content, chunk);
                    let orders: [&Reorder<'_>; 3] = [&|_| {}, &|p| p.reverse(), &|p| {
                        // Odd indices first, then even ones.
                        let (mut odd, even): (Vec<_>, Vec<_>) =
                            p.drain(..).partition(|(o, _)| (o / chunk) % 2 == 1);
                        odd.extend(even);
                        *p = odd;
                    }];
                    for (k, order) in orders.iter().enumerate() {
                        assert_eq!(
                            received(algo, &content, chunk, order),
                            Some(want),
                            "{algo:?} size {size} chunk {chunk} order {k}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn version_3_detects_a_changed_byte_a_moved_chunk_and_a_missing_one() {
        let content = data(3 << 14);
        let chunk = 1 << 14;
        let want = sent(Algorithm::Xxh3, &content, chunk);
        let size = content.len() as u64;

        let mut flipped = content.clone();
        flipped[20_000] ^= 1;
        assert_ne!(sent(Algorithm::Xxh3, &flipped, chunk), want);

        // The same chunks, two of them swapped in place: every byte is there, in the wrong
        // order.
        let mut a = Algorithm::Xxh3.assembler(size);
        let (c0, c1, c2) = (
            &content[..chunk],
            &content[chunk..2 * chunk],
            &content[2 * chunk..],
        );
        for (off, c) in [(0, c1), (chunk, c0), (2 * chunk, c2)] {
            a.add(
                off as u64,
                c.len() as u64,
                Algorithm::Xxh3.chunk(size, off as u64, c),
            );
        }
        assert_ne!(a.finish(size), Some(want));

        // A chunk missing: no checksum at all.
        let mut a = Algorithm::Xxh3.assembler(size);
        for (off, c) in [(0, c0), (2 * chunk, c2)] {
            a.add(
                off as u64,
                c.len() as u64,
                Algorithm::Xxh3.chunk(size, off as u64, c),
            );
        }
        assert_eq!(a.finish(size), None);
    }

    #[test]
    fn blake3_stays_plain_blake3() {
        let content = data(100_000);
        assert_eq!(
            sent(Algorithm::Blake3, &content, 16384),
            *blake3::hash(&content).as_bytes()
        );
        assert_eq!(
            whole_file_checksum(1, &content),
            *blake3::hash(&content).as_bytes()
        );
    }

    #[test]
    fn the_version_picks_the_algorithm() {
        assert_eq!(Algorithm::for_version(1), Algorithm::Blake3);
        assert_eq!(Algorithm::for_version(2), Algorithm::Blake3);
        assert_eq!(Algorithm::for_version(3), Algorithm::Xxh3);
    }
}
