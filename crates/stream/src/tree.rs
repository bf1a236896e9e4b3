//! Hashing a file's chunks independently, in any order, with BLAKE3's tree structure: the
//! checksum of protocol versions 1 and 2 (see [`crate::checksum`]).
//!
//! BLAKE3 hashes a file as a binary tree over 1 KiB leaves. A chunk that is exactly one node
//! of that tree (which every chunk of a power-of-two chunk size at least 1 KiB is) can be
//! hashed on its own, wherever and whenever it arrives, into a *chaining value*; sibling values
//! are then merged up to the root. The receiver thus hashes chunks in its reader tasks, in
//! parallel and out of order, with no read-back and no reordering buffer, and the result is
//! exactly `blake3::hash` of the whole file.
//!
//! A chunk that is not a node of the tree (a sender with an odd chunk size) cannot be hashed
//! alone; [`TreeHash`] then says so, and the file is hashed by reading it back once complete.

use std::collections::BTreeMap;

use blake3::CHUNK_LEN;
use blake3::hazmat::{
    ChainingValue, HasherExt, Mode, left_subtree_len, merge_subtrees_non_root, merge_subtrees_root,
};

/// The hash of one chunk, computed where it arrived.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ChunkHash {
    /// The chunk is the whole file: its BLAKE3 hash.
    Root([u8; 32]),
    /// The chunk is a node of the file's tree: its chaining value.
    Node(ChainingValue),
    /// The chunk is not a node of the tree: hash the file from disk.
    Unaligned,
}

/// Hashes a chunk of `bytes` at `offset` in a file of `size` bytes.
pub(crate) fn chunk_hash(size: u64, offset: u64, bytes: &[u8]) -> ChunkHash {
    let len = bytes.len() as u64;
    if offset == 0 && len == size {
        return ChunkHash::Root(*blake3::hash(bytes).as_bytes());
    }
    if len == 0 || parent(size, offset, len).is_none() {
        return ChunkHash::Unaligned;
    }
    let mut h = blake3::Hasher::new();
    h.set_input_offset(offset);
    h.update(bytes);
    ChunkHash::Node(h.finalize_non_root())
}

/// The parent of node `[offset, offset + len)` in the tree over `size` bytes, as (start,
/// length, length of its left child); `None` when that range is not a node below the root.
fn parent(size: u64, offset: u64, len: u64) -> Option<(u64, u64, u64)> {
    let (mut start, mut n) = (0u64, size);
    let mut up = None;
    loop {
        if start == offset && n == len {
            return up;
        }
        if n <= CHUNK_LEN as u64 {
            return None;
        }
        let left = left_subtree_len(n);
        up = Some((start, n, left));
        if offset < start + left {
            if offset + len > start + left {
                return None;
            }
            n = left;
        } else {
            start += left;
            n -= left;
        }
    }
}

/// Chaining values of the parts of one file received so far, merged as soon as siblings meet:
/// chunks that arrive roughly in order keep only a handful of values.
#[derive(Debug)]
pub(crate) struct TreeHash {
    size: u64,
    /// start -> (length, chaining value) of nodes whose sibling is not in yet.
    nodes: BTreeMap<u64, (u64, ChainingValue)>,
    root: Option<[u8; 32]>,
    /// Some chunk was not a node: hash the file from disk instead.
    unaligned: bool,
}

impl TreeHash {
    pub(crate) fn new(size: u64) -> TreeHash {
        TreeHash {
            size,
            nodes: BTreeMap::new(),
            root: None,
            unaligned: false,
        }
    }

    /// Adds the hash of chunk `[offset, offset + len)`.
    pub(crate) fn add(&mut self, offset: u64, len: u64, hash: ChunkHash) {
        let mut cv = match hash {
            ChunkHash::Root(h) => {
                self.root = Some(h);
                return;
            }
            ChunkHash::Unaligned => {
                self.unaligned = true;
                self.nodes.clear();
                return;
            }
            ChunkHash::Node(_) if self.unaligned => return,
            ChunkHash::Node(cv) => cv,
        };
        let (mut start, mut len) = (offset, len);
        while let Some((ps, pn, left)) = parent(self.size, start, len) {
            let (sib_start, sib_len) = if start == ps {
                (ps + left, pn - left)
            } else {
                (ps, left)
            };
            match self.nodes.get(&sib_start) {
                Some(&(l, sib)) if l == sib_len => {
                    self.nodes.remove(&sib_start);
                    let (l, r) = if start == ps {
                        (&cv, &sib)
                    } else {
                        (&sib, &cv)
                    };
                    if ps == 0 && pn == self.size {
                        self.root = Some(*merge_subtrees_root(l, r, Mode::Hash).as_bytes());
                        return;
                    }
                    cv = merge_subtrees_non_root(l, r, Mode::Hash);
                    start = ps;
                    len = pn;
                }
                _ => break,
            }
        }
        self.nodes.insert(start, (len, cv));
    }

    /// The file's hash once every chunk is in; `None` when it must be read back instead (or
    /// when chunks are missing, which the caller rules out by counting bytes).
    pub(crate) fn root(&self) -> Option<[u8; 32]> {
        if self.unaligned { None } else { self.root }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data(len: usize) -> Vec<u8> {
        (0..len).map(|i| (i * 31 % 251) as u8).collect()
    }

    fn tree_hash(content: &[u8], chunk: usize, reverse: bool) -> Option<[u8; 32]> {
        let size = content.len() as u64;
        let mut t = TreeHash::new(size);
        let mut parts: Vec<(usize, &[u8])> = content
            .chunks(chunk)
            .enumerate()
            .map(|(i, c)| (i * chunk, c))
            .collect();
        if reverse {
            parts.reverse();
        }
        for (off, c) in parts {
            t.add(off as u64, c.len() as u64, chunk_hash(size, off as u64, c));
        }
        t.root()
    }

    #[test]
    fn any_order_gives_blake3() {
        for size in [
            1,
            1024,
            1025,
            4095,
            4096,
            4097,
            3 * 4096 + 17,
            65536,
            100_000,
            1 << 20,
        ] {
            let content = data(size);
            let want = *blake3::hash(&content).as_bytes();
            for chunk in [1024, 4096, 16384, 65536] {
                for reverse in [false, true] {
                    assert_eq!(
                        tree_hash(&content, chunk, reverse),
                        Some(want),
                        "size {size} chunk {chunk} reverse {reverse}"
                    );
                }
            }
        }
    }

    #[test]
    fn odd_chunk_sizes_ask_for_read_back() {
        let content = data(10_000);
        for chunk in [1000, 3000, 5000] {
            assert_eq!(tree_hash(&content, chunk, false), None, "chunk {chunk}");
        }
    }

    #[test]
    fn in_order_chunks_keep_few_nodes() {
        let size = 1u64 << 30;
        let mut t = TreeHash::new(size);
        let chunk = 1u64 << 20;
        let cv = ChunkHash::Node([7; 32]);
        let mut most = 0;
        for i in 0..size / chunk {
            t.add(i * chunk, chunk, cv);
            most = most.max(t.nodes.len());
        }
        assert!(most <= 11, "{most}");
        assert!(t.root().is_some());
    }
}
