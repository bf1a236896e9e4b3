//! Sharding: one huge copy spread over many independent runs (`--shard I/N`).
//!
//! fastcp is not a scheduler. Each of `N` runs, on any machine and any scheduler (a
//! Kubernetes Indexed Job, a Slurm array, GNU parallel), walks the same sources, splits what it
//! finds into `N` shares by the same rule, and copies share `I` only. The rule depends on
//! nothing but the tree, so the `N` runs cover every file exactly once without talking to
//! each other; every run makes every directory, so each one's files have a place to land.
//!
//! The split balances bytes. A file bigger than a piece (a 16th of a share, and at least
//! [`GRID`], in whole multiples of it) is cut into pieces of that size. Then files and
//! pieces, largest first (ties by path, then offset), each go to the share with the fewest
//! bytes so far (then the fewest items, then the lowest index). Shares end within one piece
//! or one unsplit file of each other. Links and empty files weigh nothing and go round by
//! count. The names of a file with several (hard links) that is not cut go to one share
//! together, weighing all their bytes, so that with `-H` they arrive as one file.
//!
//! A run sends the pieces it holds of a file as ranges of it (protocol version 6; adjacent
//! ones merged). The receiver writes them into a work file that all the runs share, and the
//! run whose range completes the file checks nothing is missing and gives it its final name
//! (see `fastcp_stream`'s `pieces`): a file under its final name is whole, whichever run
//! ends last.
//!
//! ```
//! use fastcp::shard::{Shard, plan};
//! use fastcp::stream::WalkConfig;
//!
//! let dir = tempfile::tempdir()?;
//! for (name, size) in [("a", 300), ("b", 200), ("c", 100), ("d", 100)] {
//!     std::fs::write(dir.path().join(name), vec![0u8; size])?;
//! }
//! let config = WalkConfig::new(true, false);
//! let sources = [dir.path().to_path_buf()];
//! let first = plan(&sources, &config, "0/2".parse()?)?;
//! let second = plan(&sources, &config, Shard::new(1, 2)?)?;
//! assert_eq!(first.bytes + second.bytes, 700);
//! assert_eq!((first.bytes, second.bytes), (400, 300));
//! assert!(first.files.iter().all(|f| !second.files.contains(f)));
//! // Files this small are never cut.
//! assert!(first.pieces.is_empty() && second.pieces.is_empty());
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::cmp::Reverse;
use std::collections::hash_map::Entry;
use std::collections::{BinaryHeap, HashMap, HashSet};
use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;
use std::sync::Arc;

use bytes::Bytes;
use fastcp_stream::{EntryKind, Filter, Piece, WalkConfig};

use crate::Error;

/// Which share of a copy split `count` ways this run copies: `index` from 0 to
/// `count - 1`, as a Kubernetes Indexed Job numbers its pods.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Shard {
    index: u32,
    count: u32,
}

impl Shard {
    /// Share `index` of `count`; fails unless `index < count`.
    pub fn new(index: u32, count: u32) -> Result<Shard, Error> {
        if count == 0 || index >= count {
            return Err(Error::Usage(format!(
                "--shard {index}/{count}: the index must be from 0 to the count minus one"
            )));
        }
        Ok(Shard { index, count })
    }

    /// This run's share, from 0.
    pub fn index(&self) -> u32 {
        self.index
    }

    /// How many shares the copy is split into.
    pub fn count(&self) -> u32 {
        self.count
    }
}

impl fmt::Display for Shard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.index, self.count)
    }
}

impl FromStr for Shard {
    type Err = Error;

    /// `I/N`, such as `0/4`.
    fn from_str(s: &str) -> Result<Shard, Error> {
        let bad = || Error::Usage(format!("--shard {s:?}: expected I/N, such as 0/4"));
        let (i, n) = s.split_once('/').ok_or_else(bad)?;
        let (i, n) = (
            i.trim().parse().map_err(|_| bad())?,
            n.trim().parse().map_err(|_| bad())?,
        );
        Shard::new(i, n)
    }
}

/// Pieces are cut at multiples of this many bytes, whatever the runs' `--chunk-size`.
pub const GRID: u64 = fastcp_stream::DEFAULT_CHUNK_SIZE as u64;

/// What one share holds.
#[derive(Debug, Clone, Default)]
pub struct Share {
    /// The wire paths (relative, starting with the source's name) of its files and links,
    /// and of the files it holds pieces of.
    pub files: HashSet<Bytes>,
    /// The files of which it holds some ranges only, by wire path, adjacent ranges merged.
    pub pieces: HashMap<Bytes, Vec<Piece>>,
    /// Its files' and pieces' bytes.
    pub bytes: u64,
    /// The bytes of the whole copy, all shares together.
    pub total_bytes: u64,
    /// Files and links in the whole copy.
    pub total_files: u64,
    /// Files of the whole copy cut into pieces (whichever shares hold them).
    pub cut_files: u64,
}

/// A file or link the walk found: its size, its wire path, and the (device, inode) of a file
/// with several names.
type Walked = (u64, Bytes, Option<(u64, u64)>);

/// Walks `sources` as `config` says and returns share `shard` of them. Every run given the
/// same tree and the same `N` computes the same split.
pub fn plan(sources: &[PathBuf], config: &WalkConfig, shard: Shard) -> Result<Share, Error> {
    let mut files: Vec<Walked> = Vec::new();
    for entry in fastcp_stream::walk(sources, config) {
        // What cannot be read is reported by the copy itself; here it is only left out.
        let Ok(entry) = entry else { continue };
        match entry.kind {
            EntryKind::Dir => {}
            EntryKind::File { size } => files.push((size, entry.wire, entry.inode)),
            _ => files.push((0, entry.wire, None)),
        }
    }
    let n = shard.count as usize;
    let total: u64 = files.iter().map(|f| f.0).sum();
    let piece = if n == 1 {
        u64::MAX
    } else {
        total.div_ceil(n as u64 * 16).div_ceil(GRID).max(1) * GRID
    };
    let sizes: HashMap<Bytes, u64> = files.iter().map(|(s, w, _)| (w.clone(), *s)).collect();
    let mut share = Share {
        total_files: sizes.len() as u64,
        total_bytes: total,
        ..Share::default()
    };
    // (size, path, offset): whole files at offset 0, big ones cut into pieces.
    let mut items: Vec<(u64, Bytes, u64)> = Vec::with_capacity(files.len());
    // The names of one file go to one share, as one item under the first name walked
    // weighing them all, so that with -H they arrive as names of one file: the further
    // names of each first name, and where each file's item is.
    let mut further: HashMap<Bytes, Vec<Bytes>> = HashMap::new();
    let mut first: HashMap<(u64, u64), usize> = HashMap::new();
    for (size, wire, inode) in files {
        if size <= piece {
            match inode.map(|inode| first.entry(inode)) {
                Some(Entry::Occupied(at)) => {
                    let item = &mut items[*at.get()];
                    item.0 += size;
                    further.entry(item.1.clone()).or_default().push(wire);
                }
                Some(Entry::Vacant(at)) => {
                    at.insert(items.len());
                    items.push((size, wire, 0));
                }
                None => items.push((size, wire, 0)),
            }
            continue;
        }
        share.cut_files += 1;
        let mut offset = 0;
        while offset < size {
            let len = piece.min(size - offset);
            items.push((len, wire.clone(), offset));
            offset += len;
        }
    }
    // Largest first; equal sizes by path and offset, so that every run sees the same order.
    items.sort_unstable_by(|a, b| b.0.cmp(&a.0).then_with(|| (&a.1, a.2).cmp(&(&b.1, b.2))));
    // Shares by (bytes, items, index), the lightest on top.
    let mut load: BinaryHeap<Reverse<(u64, u64, usize)>> =
        (0..n).map(|k| Reverse((0, 0, k))).collect();
    let mut mine: HashMap<Bytes, Vec<(u64, u64)>> = HashMap::new();
    for (len, wire, offset) in items {
        let Reverse((bytes, count, to)) = load.pop().expect("at least one share");
        load.push(Reverse((bytes + len, count + 1, to)));
        if to == shard.index as usize {
            share.bytes += len;
            for name in further.remove(&wire).into_iter().flatten() {
                let size = sizes[&name];
                mine.entry(name).or_default().push((0, size));
            }
            // A file's item weighs all its names; its own range is its size at most.
            let own = len.min(sizes[&wire]);
            mine.entry(wire).or_default().push((offset, own));
        }
    }
    for (wire, mut ranges) in mine {
        let size = sizes[&wire];
        ranges.sort_unstable();
        let mut merged: Vec<Piece> = Vec::new();
        for (offset, len) in ranges {
            match merged.last_mut() {
                Some(last) if last.offset + last.len == offset => last.len += len,
                _ => merged.push(Piece { size, offset, len }),
            }
        }
        if !(merged.len() == 1 && merged[0].len == size) {
            share.pieces.insert(wire.clone(), merged);
        }
        share.files.insert(wire);
    }
    Ok(share)
}

/// `filter` narrowed to `share`: directories always pass (every run makes them), other
/// entries only when the share holds them. The result holds no rules of its own (a rule
/// that matches decides alone, and would let in what other shares hold): `filter` is asked
/// first, inside its predicate.
pub fn narrow(filter: Option<Arc<Filter>>, share: Share) -> Arc<Filter> {
    let files = Arc::new(share.files);
    // A `--files-from` list stays, so that each run still reports what it lists and the
    // source lacks (the predicate applies it as well).
    let listed = filter.as_ref().and_then(|f| f.listed());
    let narrowed = match listed {
        Some(listed) => Filter::default().files_from(listed),
        None => Filter::default(),
    };
    Arc::new(
        narrowed.with_predicate(Arc::new(move |wire: &[u8], is_dir: bool| {
            let earlier = filter.as_ref().is_none_or(|f| f.allows(wire, is_dir));
            earlier && (is_dir || files.contains(wire))
        })),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shard_operands_are_checked() {
        assert_eq!("3/8".parse::<Shard>().unwrap(), Shard::new(3, 8).unwrap());
        for bad in ["8/8", "1/0", "x/2", "1", "-1/2", "1/2/3"] {
            assert!(bad.parse::<Shard>().is_err(), "{bad}");
        }
        assert_eq!(Shard::new(0, 1).unwrap().to_string(), "0/1");
    }
}
