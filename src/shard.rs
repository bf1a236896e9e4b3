//! Sharding: one huge copy spread over many independent runs (`--shard I/N`).
//!
//! fastcp is not a scheduler. Each of `N` runs, on any machine and any scheduler (a
//! Kubernetes Indexed Job, a Slurm array, GNU parallel), walks the same sources, splits what it
//! finds into `N` shares by the same rule, and copies share `I` only. The rule depends on
//! nothing but the tree, so the `N` runs cover every file exactly once without talking to
//! each other; every run makes every directory, so each one's files have a place to land.
//!
//! The split balances bytes: files, largest first (ties by path), each go to the share with
//! the fewest bytes so far (then the fewest files, then the lowest index). Shares end within
//! the size of one file of each other, so they are balanced as long as no single file is a
//! large part of a share. Links and empty files weigh nothing and go round by count. A file
//! is never split between runs: each run writes whole files, each checked and renamed into
//! place as in any copy.
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
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::collections::HashSet;
use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;
use std::sync::Arc;

use bytes::Bytes;
use fastcp_stream::{EntryKind, Filter, WalkConfig};

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

/// What one share holds.
#[derive(Debug, Clone, Default)]
pub struct Share {
    /// The wire paths (relative, starting with the source's name) of its files and links.
    pub files: HashSet<Bytes>,
    /// Its files' bytes.
    pub bytes: u64,
    /// The bytes of the whole copy, all shares together.
    pub total_bytes: u64,
    /// Files and links in the whole copy.
    pub total_files: u64,
}

/// Walks `sources` as `config` says and returns share `shard` of them. Every run given the
/// same tree and the same `N` computes the same split.
pub fn plan(sources: &[PathBuf], config: &WalkConfig, shard: Shard) -> Result<Share, Error> {
    let mut items: Vec<(u64, Bytes)> = Vec::new();
    for entry in fastcp_stream::walk(sources, config) {
        // What cannot be read is reported by the copy itself; here it is only left out.
        let Ok(entry) = entry else { continue };
        match entry.kind {
            EntryKind::Dir => {}
            EntryKind::File { size } => items.push((size, entry.wire)),
            _ => items.push((0, entry.wire)),
        }
    }
    // Largest first; equal sizes by path, so that every run sees the same order.
    items.sort_unstable_by(|a, b| b.0.cmp(&a.0).then_with(|| a.1.cmp(&b.1)));
    let n = shard.count as usize;
    let mut load = vec![(0u64, 0u64); n];
    let mut share = Share {
        total_files: items.len() as u64,
        ..Share::default()
    };
    for (size, wire) in items {
        let to = (0..n)
            .min_by_key(|&k| (load[k], k))
            .expect("at least one share");
        load[to].0 += size;
        load[to].1 += 1;
        share.total_bytes += size;
        if to == shard.index as usize {
            share.bytes += size;
            share.files.insert(wire);
        }
    }
    Ok(share)
}

/// `filter` narrowed to `share`: directories always pass (every run makes them), other
/// entries only when the share holds them. The result holds no rules of its own (a rule
/// that matches decides alone, and would let in what other shares hold): `filter` is asked
/// first, inside its predicate.
pub fn narrow(filter: Option<Arc<Filter>>, share: Share) -> Arc<Filter> {
    let files = Arc::new(share.files);
    Arc::new(
        Filter::default().with_predicate(Arc::new(move |wire: &[u8], is_dir: bool| {
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
