//! The destination listed ahead: a copy into a tree that is mostly there already (a nightly
//! pull with the quick check) answers one probe per file, and each answer costs a stat. A
//! [`ListAhead`] reads those stats on a thread of its own while the connection is being made,
//! when this side has little else to do, so that the probes find them in memory.
//!
//! Listings are keyed by the folder's device and inode, not by its path: a probe uses the
//! listing of the very folder its own lookup opened (beneath the destination, never through
//! a symlink), so a path that names something else by the time the copy runs finds nothing
//! and is stat'ed as before. Only the answer to a probe comes from a listing; nothing is
//! written on its word.

use std::collections::HashMap;
use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rustix::fs::{AtFlags, FileType, Mode, OFlags};

use crate::dest::lock;

/// Entries a listing ahead reads at most (about 100 bytes of memory each): enough for most
/// trees whole. Folders it did not reach are stat'ed as the probes come.
const MAX_ENTRIES: usize = 400_000;

/// Listings older than this are not used: a login that waited for a password leaves them
/// that stale. The probes stat the files as they come.
const MAX_AGE: Duration = Duration::from_secs(10);

/// What a listing keeps of an entry: what a probe's answer looks at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Seen {
    pub(crate) mode: u32,
    pub(crate) size: u64,
    pub(crate) mtime: i64,
    pub(crate) mtime_nsec: u32,
    pub(crate) uid: u32,
    pub(crate) gid: u32,
}

impl From<&rustix::fs::Stat> for Seen {
    fn from(st: &rustix::fs::Stat) -> Seen {
        Seen {
            mode: st.st_mode,
            size: st.st_size as u64,
            mtime: st.st_mtime,
            mtime_nsec: st.st_mtime_nsec as u32,
            uid: st.st_uid,
            gid: st.st_gid,
        }
    }
}

/// A folder's entries as they were listed, by name, without `.` and `..`.
pub(crate) type Listing = HashMap<Box<[u8]>, Seen>;

/// Folders of a destination, listed with a stat of each entry on a thread of its own while
/// a connection is made; give it to the receiver through
/// [`ReceiveConfig::list_ahead`](crate::ReceiveConfig::list_ahead), and each quick-check
/// probe for a file in a listed folder is answered from the listing instead of a stat.
///
/// It lists each folder given and the folders beneath it, depth first, never following a
/// symlink, up to about 400,000 entries. A receiver uses a folder's listing only if it was
/// complete, only for the folder it was made of (its device and inode, whatever its path
/// names by then), and only within 10 seconds of the start: a folder changed in that time
/// by something else is judged as it was listed. Only the answers come from it; nothing is
/// written on its word. Dropped (its last clone), it stops at the next folder.
///
/// ```
/// use fastcp_stream::{ListAhead, ReceiveConfig};
///
/// let dst = tempfile::tempdir()?;
/// std::fs::create_dir(dst.path().join("src"))?;
/// // A pull of `host:src` into `dst` will land in dst/src: list it while logging in.
/// let config = ReceiveConfig {
///     skip_unchanged: true,
///     list_ahead: Some(ListAhead::start(vec![dst.path().join("src")])),
///     ..ReceiveConfig::default()
/// };
/// # drop(config);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone)]
pub struct ListAhead {
    handle: Arc<Handle>,
}

#[derive(Debug)]
struct Inner {
    started: Instant,
    /// The complete listings so far, by the folder's (device, inode).
    dirs: Mutex<HashMap<(u64, u64), Arc<Listing>>>,
    /// Set when the last handle is dropped.
    stop: AtomicBool,
}

/// What every [`ListAhead`] shares: the thread stops when the last one goes.
#[derive(Debug)]
struct Handle(Arc<Inner>);

impl Drop for Handle {
    fn drop(&mut self) {
        self.0.stop.store(true, Ordering::Relaxed);
    }
}

impl ListAhead {
    /// Starts listing `folders` (each the top of a tree a copy will land in; one that is
    /// not a folder, or is a symlink, is passed over) on a new thread.
    pub fn start(folders: Vec<PathBuf>) -> ListAhead {
        let inner = Arc::new(Inner {
            started: Instant::now(),
            dirs: Mutex::new(HashMap::new()),
            stop: AtomicBool::new(false),
        });
        let thread = inner.clone();
        // Without a thread nothing is listed: the probes stat as they come.
        let _ = std::thread::Builder::new()
            .name("fastcp-list-ahead".into())
            .spawn(move || {
                let mut budget = MAX_ENTRIES;
                for folder in folders {
                    let Ok(fd) = rustix::fs::open(&folder, DIR_FLAGS, Mode::empty()) else {
                        continue;
                    };
                    if !list_tree(fd, &thread, &mut budget) {
                        break;
                    }
                }
            });
        ListAhead {
            handle: Arc::new(Handle(inner)),
        }
    }

    /// The listing of the folder `dir` is, if it was listed whole and recently.
    pub(crate) fn listing(&self, dir: &OwnedFd) -> Option<Arc<Listing>> {
        let inner = &self.handle.0;
        if inner.started.elapsed() > MAX_AGE {
            return None;
        }
        let st = rustix::fs::fstat(dir).ok()?;
        lock(&inner.dirs).get(&(st.st_dev, st.st_ino)).cloned()
    }
}

/// How a folder is opened: never through a symlink.
const DIR_FLAGS: OFlags = OFlags::RDONLY
    .union(OFlags::DIRECTORY)
    .union(OFlags::NOFOLLOW)
    .union(OFlags::CLOEXEC);

/// Lists the tree beneath `top`, depth first, folders in name order (the order of a
/// sender's walk, whose probes come in it); false once it should stop: the budget spent,
/// the listings too old to be used, or nobody left to use them.
fn list_tree(top: OwnedFd, inner: &Inner, budget: &mut usize) -> bool {
    // Folders still to list: each by its parent's handle and its name, so that only the
    // parents of pending folders are open.
    let mut stack: Vec<(Arc<OwnedFd>, Vec<u8>)> = Vec::new();
    let mut next = Some(Arc::new(top));
    loop {
        if inner.stop.load(Ordering::Relaxed) || inner.started.elapsed() > MAX_AGE {
            return false;
        }
        let dir = match next.take() {
            Some(dir) => dir,
            None => {
                let Some((parent, name)) = stack.pop() else {
                    return true;
                };
                match rustix::fs::openat(&*parent, &name[..], DIR_FLAGS, Mode::empty()) {
                    Ok(fd) => Arc::new(fd),
                    Err(_) => continue,
                }
            }
        };
        let Ok(st) = rustix::fs::fstat(&*dir) else {
            continue;
        };
        let Ok(names) = crate::mirror::list(&dir) else {
            continue;
        };
        if names.len() > *budget {
            return false;
        }
        *budget -= names.len();
        let mut listing = Listing::with_capacity(names.len());
        let mut folders = Vec::new();
        let mut whole = true;
        for name in names {
            let Ok(entry) = rustix::fs::statat(&*dir, &name[..], AtFlags::SYMLINK_NOFOLLOW) else {
                // Gone since the listing, or not to be read: the folder is not known whole.
                whole = false;
                break;
            };
            if FileType::from_raw_mode(entry.st_mode) == FileType::Directory {
                folders.push(name.clone());
            }
            listing.insert(name.into_boxed_slice(), Seen::from(&entry));
        }
        if !whole {
            continue;
        }
        lock(&inner.dirs).insert((st.st_dev, st.st_ino), Arc::new(listing));
        folders.sort_unstable_by(|a, b| b.cmp(a));
        stack.extend(folders.into_iter().map(|name| (dir.clone(), name)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    fn open_dir(path: &std::path::Path) -> OwnedFd {
        rustix::fs::open(path, DIR_FLAGS, Mode::empty()).unwrap()
    }

    /// The listing of `dir`, once the thread has made it (within a generous deadline).
    fn listed(ahead: &ListAhead, dir: &std::path::Path) -> Arc<Listing> {
        let fd = open_dir(dir);
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            if let Some(listing) = ahead.listing(&fd) {
                return listing;
            }
            assert!(
                Instant::now() < deadline,
                "{} was never listed",
                dir.display()
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Every folder of the tree is listed whole, each entry as a stat of it (not following
    /// a link) sees it; a linked folder is not listed through its link.
    #[test]
    fn folders_are_listed_as_a_stat_of_each_entry_sees_them() {
        let dir = tempfile::tempdir().unwrap();
        let top = dir.path().join("top");
        let outside = dir.path().join("outside");
        fs::create_dir_all(top.join("sub/deep")).unwrap();
        fs::create_dir(&outside).unwrap();
        fs::write(outside.join("x"), b"x").unwrap();
        fs::write(top.join("a"), b"hello").unwrap();
        fs::write(top.join("sub/b"), vec![7; 5000]).unwrap();
        fs::write(top.join("sub/deep/c"), b"").unwrap();
        // Named to come before `sub` in the walk's order.
        std::os::unix::fs::symlink(&outside, top.join("a-link")).unwrap();

        let ahead = ListAhead::start(vec![top.clone(), dir.path().join("missing")]);
        for (folder, names) in [
            (top.clone(), &["a", "a-link", "sub"][..]),
            (top.join("sub"), &["b", "deep"][..]),
            (top.join("sub/deep"), &["c"][..]),
        ] {
            let listing = listed(&ahead, &folder);
            let mut got: Vec<_> = listing.keys().map(|k| k.to_vec()).collect();
            got.sort();
            let want: Vec<_> = names.iter().map(|n| n.as_bytes().to_vec()).collect();
            assert_eq!(got, want, "{}", folder.display());
            let fd = open_dir(&folder);
            for name in names {
                let st = rustix::fs::statat(&fd, *name, AtFlags::SYMLINK_NOFOLLOW).unwrap();
                assert_eq!(listing[name.as_bytes()], Seen::from(&st), "{name}");
            }
        }
        // `sub/deep` is listed after the link would have been followed: it was not.
        assert!(ahead.listing(&open_dir(&outside)).is_none());
    }

    /// A folder replaced after its listing (a new inode at the same path) finds none: the
    /// listing belongs to the folder, not to its name.
    #[test]
    fn a_listing_belongs_to_its_folder_not_to_its_path() {
        let dir = tempfile::tempdir().unwrap();
        let top = dir.path().join("top");
        fs::create_dir(&top).unwrap();
        fs::write(top.join("a"), b"a").unwrap();
        let ahead = ListAhead::start(vec![top.clone()]);
        listed(&ahead, &top);
        fs::rename(&top, dir.path().join("old")).unwrap();
        fs::create_dir(&top).unwrap();
        assert!(ahead.listing(&open_dir(&top)).is_none());
        assert!(ahead.listing(&open_dir(&dir.path().join("old"))).is_some());
    }
}
