//! Mirroring (`ReceiveConfig::delete`, the CLI's `--delete`): once every entry has arrived,
//! the receiver removes what each directory the sender sent holds and the sender did not
//! send, as rsync's `--delete` does.
//!
//! Only directories the sender sent are looked into, so nothing beside the copied tree is
//! touched. Every step goes through directory handles opened beneath the destination without
//! following a symlink: a symlink found among the extras is removed as a link, never
//! followed, and a directory swapped for a symlink while it is being emptied fails to open
//! instead of leading outside.

use std::collections::HashSet;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;

use bytes::Bytes;
use fastcp_proto::{Deleted, Frame};
use rustix::fs::{AtFlags, Mode, OFlags};
use rustix::io::Errno;

use crate::dest::Resolver;
use crate::receive::Shared;
use crate::{Error, ErrorCode, Failure, Side};

/// What a receiver says when [`Spared::of`] leaves nothing to delete.
pub const NOTHING_DELETED: &str = concat!(
    "nothing was deleted: the sender could not read everything, ",
    "and what it missed would have looked deleted"
);

/// How deep an extra directory may nest before its removal gives up: as deep as a tree the
/// copy could have made (each level is a directory handle held while its entries go).
const MAX_DEPTH: usize = fastcp_proto::MAX_DEPTH;

/// The entries `--delete` leaves alone for the sender's failures: each one it skipped on
/// purpose (a FIFO, a device: `Unsupported`) or could not carry under its name
/// (`UnsafePath`: a name SFTP takes as text, its odd bytes replaced), matched by its name as
/// text, so that a local name with the same odd bytes is kept.
#[derive(Debug, Default)]
pub struct Spared(HashSet<String>);

impl Spared {
    /// What `failures` spare, or `None` when nothing may be deleted: the sender missed
    /// something else (an entry it could not read, a failure without a path, more failures
    /// than kept), and what it missed would look deleted.
    pub fn of<'a>(failures: impl IntoIterator<Item = &'a Failure>) -> Option<Spared> {
        let mut spared = Spared::default();
        for f in failures {
            if f.side != Side::Sender {
                continue;
            }
            let alone = matches!(f.code, ErrorCode::Unsupported | ErrorCode::UnsafePath);
            if !alone || f.path.is_empty() {
                return None;
            }
            // A local path names a folder's contents `src/./x`; its wire path is `src/x`.
            spared
                .0
                .insert(String::from_utf8_lossy(&f.path).replace("/./", "/"));
        }
        Some(spared)
    }

    /// Whether the entry at wire path `path` is left alone. An SFTP pull names a failure
    /// by its wire path; a fastcp sender by its local path, which ends with the wire path
    /// (`/data/src/p`, or `/data/src/./p` for a folder's contents, for `src/p`).
    pub fn spares(&self, path: &[u8]) -> bool {
        if self.0.is_empty() {
            return false;
        }
        let path = String::from_utf8_lossy(path);
        if self.0.contains(&*path) {
            return true;
        }
        let tail = format!("/{path}");
        self.0.iter().any(|failed| failed.ends_with(&tail))
    }
}

/// A limit on what a mirror removes (rsync's `--max-delete`;
/// [`ReceiveConfig::max_delete`](crate::ReceiveConfig::max_delete)). Each extra is removed
/// whole, a directory with everything in it, while the entries removed stay within the
/// limit; from the first extra that would go past it, nothing more is removed, and what is
/// left is counted for the report.
///
/// ```
/// use fastcp_stream::DeleteBudget;
///
/// let mut budget = DeleteBudget::new(Some(3));
/// assert!(budget.take(2)); // a folder holding one file
/// assert!(!budget.take(2)); // would make 4
/// assert!(!budget.take(1)); // stopped: nothing more goes
/// assert_eq!(budget.left(), 3);
/// assert!(budget.message().unwrap().contains("3 entries"));
/// assert!(DeleteBudget::new(None).take(u64::MAX));
///
/// let mut none = DeleteBudget::new(Some(0));
/// assert!(!none.take(1));
/// assert!(none.message().unwrap().ends_with(": 1 entry the source does not have was not deleted"));
/// ```
#[derive(Debug, Clone, Copy, Default)]
pub struct DeleteBudget {
    limit: Option<u64>,
    taken: u64,
    left: u64,
}

impl DeleteBudget {
    /// A budget of at most `limit` entries; `None` removes everything.
    pub fn new(limit: Option<u64>) -> DeleteBudget {
        DeleteBudget {
            limit,
            ..DeleteBudget::default()
        }
    }

    /// Whether there is a limit, so that each extra's entries must be counted.
    pub fn is_limited(&self) -> bool {
        self.limit.is_some()
    }

    /// Whether an extra of `entries` entries may be removed; one that may not is counted
    /// as left, and so is every extra after it.
    pub fn take(&mut self, entries: u64) -> bool {
        let Some(limit) = self.limit else {
            return true;
        };
        if self.left == 0 && self.taken.saturating_add(entries) <= limit {
            self.taken += entries;
            return true;
        }
        self.left = self.left.saturating_add(entries);
        false
    }

    /// How many entries the limit left in place.
    pub fn left(&self) -> u64 {
        self.left
    }

    /// What the copy reports when the limit left extras in place (with
    /// [`ErrorCode::DeleteLimit`]), or `None`.
    pub fn message(&self) -> Option<String> {
        let limit = self.limit?;
        let (entries, were) = match self.left {
            1 => ("entry", "was"),
            _ => ("entries", "were"),
        };
        (self.left > 0).then(|| {
            format!(
                "--max-delete {limit} stopped the mirror: {} {entries} the source does not \
                 have {were} not deleted",
                self.left
            )
        })
    }
}

/// The order a mirror takes the folders it looks into, by wire path: each folder before what
/// it holds, names in byte order, as a walk of one source lists them. Their entries may
/// arrive in any order over several streams; taken in this one, [`DeleteBudget`] lets the
/// same extras go in every run, and a dry run lists those.
///
/// ```
/// let mut dirs: Vec<&[u8]> = vec![b"d/sub", b"d", b"d-2", b"c"];
/// dirs.sort_by(|a, b| fastcp_stream::mirror_order(a, b));
/// assert_eq!(dirs, [&b"c"[..], b"d", b"d/sub", b"d-2"]);
/// ```
pub fn mirror_order(a: &[u8], b: &[u8]) -> std::cmp::Ordering {
    a.split(|&c| c == b'/').cmp(b.split(|&c| c == b'/'))
}

/// How many entries `--delete` removing `path` would remove: 1, and for a directory (not a
/// symlink to one) everything in it, counted as [`DeleteBudget`] counts them. What cannot
/// be read counts as nothing.
pub fn entries_at(path: &std::path::Path) -> u64 {
    in_parent(path, entries).unwrap_or(1)
}

/// Whether the directory at `path` (the entry `wire` of the copy) holds, at any depth, what
/// `filter` excludes: `--delete` keeps such a folder, whole. Read as the copy's mirror reads
/// it, through handles, never following a link; what cannot be read holds nothing.
pub fn holds_excluded_at(path: &std::path::Path, wire: &[u8], filter: &crate::Filter) -> bool {
    let excluded = |path: &[u8], is_dir: bool| !filter.allows(path, is_dir);
    in_parent(path, |parent, name| {
        holds_any(parent, name, wire, &excluded) == Ok(true)
    })
    .unwrap_or(false)
}

/// `f` of the folder holding `path` (opened) and `path`'s name in it; `None` when the folder
/// cannot be opened or `path` has no name.
fn in_parent<T>(path: &std::path::Path, f: impl FnOnce(&OwnedFd, &[u8]) -> T) -> Option<T> {
    let (Some(parent), Some(name)) = (path.parent(), path.file_name()) else {
        return None;
    };
    let parent = if parent.as_os_str().is_empty() {
        std::path::Path::new(".")
    } else {
        parent
    };
    let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC;
    let fd = rustix::fs::open(parent, flags, Mode::empty()).ok()?;
    Some(f(&fd, name.as_bytes()))
}

/// How many entries removing `name` in `parent` would remove: 1, or a directory's own
/// entries too (counted through handles, never following a link; what cannot be read
/// counts as nothing).
pub(crate) fn entries(parent: &impl AsFd, name: &[u8]) -> u64 {
    let count = std::cell::Cell::new(0u64);
    let counting = |_: &[u8], _: bool| {
        count.set(count.get() + 1);
        false
    };
    let _ = holds_any(parent, name, b"", &counting);
    count.get() + 1
}

/// Removes the extras of every directory in `sent_dirs` (wire paths) whose names are not in
/// `sent` (wire paths of every entry sent) nor `spared`, within `budget`. Returns how many
/// entries were removed; each failure is reported on its entry and the rest goes on.
pub(crate) fn delete_extras(
    shared: &std::sync::Arc<Shared>,
    sent_dirs: &[Bytes],
    sent: &HashSet<Bytes>,
    spared: &Spared,
    budget: &mut DeleteBudget,
) -> u64 {
    let mut resolver = Resolver::new(shared.clone(), false);
    let mut removed = 0;
    // A sender of protocol version 7 hears of each removal, a folder's at a time.
    let tell = shared.config.version >= 7;
    let mut told = Vec::new();
    let dirs: HashSet<&[u8]> = sent_dirs.iter().map(|d| &d[..]).collect();
    for dir in sent_dirs {
        if !told.is_empty() {
            // Fails only once the reply stream is gone, when nobody is listening any more.
            let _ = shared.replies.blocking_send(std::mem::take(&mut told));
        }
        let local = shared.root.local(dir);
        let Ok(fd) = resolver.dir(&local) else {
            continue; // it failed when it was written, and was reported then
        };
        shared.progress.mirror_step();
        // In name order, so that a limit takes the same extras as a dry run lists.
        let names = match list(&fd) {
            Ok(mut n) => {
                n.sort_unstable();
                n
            }
            Err(e) => {
                let path = shared.root.display(&local);
                shared.entry_failed(dir, &Error::io(path, e.into()));
                continue;
            }
        };
        for name in names {
            let mut wire = Vec::with_capacity(dir.len() + 1 + name.len());
            wire.extend_from_slice(dir);
            wire.push(b'/');
            wire.extend_from_slice(&name);
            if sent.contains(&wire[..]) || spared.spares(&wire) {
                continue;
            }
            // What the rules exclude was never sent, and is not ours to delete.
            if let Some(filter) = &shared.config.filter {
                let is_dir = rustix::fs::statat(&fd, &name[..], AtFlags::SYMLINK_NOFOLLOW)
                    .is_ok_and(|st| {
                        rustix::fs::FileType::from_raw_mode(st.st_mode)
                            == rustix::fs::FileType::Directory
                    });
                if !filter.allows(&wire, is_dir) {
                    continue;
                }
            }
            // Another copy's temp file, or a partial file kept for `--resume`: not an extra.
            // A temp file a killed copy left goes, as the sweep before writing takes it, and
            // so does a partial file of a file the source no longer has: one it lacks, or has
            // as a folder or a link now (which took the file's place here).
            if crate::dest::is_work_file(&name) {
                match crate::resume::partial_target(&name) {
                    Some(target) => {
                        let mut of = Vec::with_capacity(dir.len() + 1 + target.len());
                        of.extend_from_slice(dir);
                        of.push(b'/');
                        of.extend_from_slice(target);
                        let no_file = !(sent.contains(&of[..]) || spared.spares(&of))
                            || dirs.contains(&of[..])
                            || rustix::fs::statat(&fd, target, AtFlags::SYMLINK_NOFOLLOW)
                                .is_ok_and(|st| {
                                    rustix::fs::FileType::from_raw_mode(st.st_mode)
                                        == rustix::fs::FileType::Symlink
                                });
                        if no_file {
                            crate::resume::remove_unheld_partial(&fd, &name);
                        }
                    }
                    None => {
                        crate::dest::remove_if_stale(&fd, &name, shared.started);
                    }
                }
                continue;
            }
            // A folder holding what the rules exclude stays, whole: `--delete` keeps that.
            if let Some(filter) = &shared.config.filter {
                let excluded = |path: &[u8], is_dir: bool| !filter.allows(path, is_dir);
                if holds_any(&fd, &name, &wire, &excluded) == Ok(true) {
                    continue;
                }
            }
            if budget.is_limited() && !budget.take(entries(&fd, &name)) {
                continue;
            }
            let mut local_child = local.clone();
            local_child.push(b'/');
            local_child.extend_from_slice(&name);
            match remove(&fd, &name, &shared.progress, 0) {
                Ok(n) => {
                    removed += n;
                    let path = Bytes::from(wire);
                    if tell {
                        told.push(Frame::Deleted(Deleted {
                            path: path.clone(),
                            entries: n,
                        }));
                    }
                    shared.progress.deleted(path, n);
                }
                Err(e) => {
                    let path = shared.root.display(&local_child);
                    shared.entry_failed(&wire, &Error::io(path, e.into()));
                }
            }
        }
    }
    if !told.is_empty() {
        let _ = shared.replies.blocking_send(told);
    }
    removed
}

/// The names in a directory, without `.` and `..`.
fn list(fd: &OwnedFd) -> rustix::io::Result<Vec<Vec<u8>>> {
    let mut names = Vec::new();
    for entry in rustix::fs::Dir::read_from(fd)? {
        let name = entry?.file_name().to_bytes().to_vec();
        if name != b"." && name != b".." {
            names.push(name);
        }
    }
    Ok(names)
}

/// Whether the directory `name` in `parent` (the wire path `wire`) holds, at any depth, an
/// entry `kept` says stays (given its wire path and whether it is a directory). Read
/// through handles, never following a link.
pub(crate) fn holds_any(
    parent: &impl AsFd,
    name: &[u8],
    wire: &[u8],
    kept: &dyn Fn(&[u8], bool) -> bool,
) -> rustix::io::Result<bool> {
    fn walk(
        dir: &OwnedFd,
        wire: &[u8],
        kept: &dyn Fn(&[u8], bool) -> bool,
        depth: usize,
    ) -> rustix::io::Result<bool> {
        if depth >= MAX_DEPTH {
            return Err(Errno::LOOP);
        }
        let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
        for child in list(dir)? {
            let mut path = wire.to_vec();
            path.push(b'/');
            path.extend_from_slice(&child);
            let name = std::ffi::OsStr::from_bytes(&child);
            let sub = match rustix::fs::openat(dir, name, flags, Mode::empty()) {
                Ok(fd) => Some(fd),
                Err(Errno::NOTDIR | Errno::LOOP) => None,
                Err(e) => return Err(e),
            };
            if kept(&path, sub.is_some()) {
                return Ok(true);
            }
            if let Some(sub) = sub
                && walk(&sub, &path, kept, depth + 1)?
            {
                return Ok(true);
            }
        }
        Ok(false)
    }
    let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    let dir = rustix::fs::openat(
        parent,
        std::ffi::OsStr::from_bytes(name),
        flags,
        Mode::empty(),
    )?;
    walk(&dir, wire, kept, 0)
}

/// Removes `name` in `parent`: a directory with everything in it, anything else (a symlink
/// included) as itself. Returns how many entries went; each is a step of `progress`, so that
/// a big folder's removal is not taken for a stall.
pub(crate) fn remove(
    parent: &impl AsFd,
    name: &[u8],
    progress: &crate::Progress,
    depth: usize,
) -> rustix::io::Result<u64> {
    let name = std::ffi::OsStr::from_bytes(name);
    match rustix::fs::unlinkat(parent, name, AtFlags::empty()) {
        Ok(()) => {
            progress.mirror_step();
            return Ok(1);
        }
        // A directory (EISDIR on Linux; EPERM elsewhere): empty it first.
        Err(Errno::ISDIR | Errno::PERM) => {}
        Err(e) => return Err(e),
    }
    if depth >= MAX_DEPTH {
        return Err(Errno::LOOP);
    }
    let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    let dir = rustix::fs::openat(parent, name, flags, Mode::empty())?;
    let mut removed = 0;
    for child in list(&dir)? {
        removed += remove(&dir, &child, progress, depth + 1)?;
    }
    rustix::fs::unlinkat(parent, name, AtFlags::REMOVEDIR)?;
    progress.mirror_step();
    Ok(removed + 1)
}

/// Makes each hard link `(name, file)` (wire paths) another name of `file`, which must be a
/// file of this session (in `files`). Both are reached through directory handles beneath the
/// destination; the link goes to a temporary name and is renamed over whatever held its name.
/// With `skip_unchanged`, a link to a file the quick check skipped (not in `sent`) counts as
/// skipped, found in place or made again.
pub(crate) fn make_links(
    shared: &std::sync::Arc<Shared>,
    links: &[(Bytes, Bytes)],
    files: &HashSet<Bytes>,
    sent: &HashSet<Bytes>,
) {
    let mut resolver = Resolver::new(shared.clone(), false);
    for (name, file) in links {
        shared.progress.mirror_step();
        let made = (|| -> Result<(), Error> {
            if !files.contains(file) {
                return Err(Error::Protocol(format!(
                    "{}: a hard link to {}, which was not sent",
                    crate::display::escape(name),
                    crate::display::escape(file)
                )));
            }
            let (file_dir, file_name) = split(&shared.root.local(file));
            let (link_dir, link_name) = split(&shared.root.local(name));
            let from = resolver.dir(&file_dir)?;
            let to = resolver.dir(&link_dir)?;
            let io = |e: rustix::io::Errno| {
                Error::io(shared.root.display(&shared.root.local(name)), e.into())
            };
            // Already another name of the file (an unchanged tree copied again): nothing to
            // do. Renaming a link over a name of the same file would do nothing either, and
            // leave the temporary name behind.
            let inode = |dir, name: &[u8]| {
                rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW)
                    .ok()
                    .map(|st| (st.st_dev, st.st_ino))
            };
            if let Some(target) = inode(&*to, &link_name)
                && inode(&*from, &file_name) == Some(target)
            {
                shared.link_skipped(name);
                return Ok(());
            }
            let mut temp = b".".to_vec();
            temp.extend_from_slice(&link_name);
            temp.extend_from_slice(b".fastcp-link");
            let _ = rustix::fs::unlinkat(&*to, &temp[..], AtFlags::empty());
            let link =
                || rustix::fs::linkat(&*from, &file_name[..], &*to, &temp[..], AtFlags::empty());
            match link() {
                // The file is at its link limit (a name of a `link_dest` reference's file, with
                // other nights linked to it): it becomes a file of its own, a copy, which its
                // other names then share.
                Err(Errno::MLINK) => {
                    own_copy(&from, &file_name)
                        .map_err(|e| Error::io(shared.root.display(&shared.root.local(file)), e))?;
                    link().map_err(io)?;
                }
                linked => linked.map_err(io)?,
            }
            let renamed = rustix::fs::renameat(&*to, &temp[..], &*to, &link_name[..]);
            // Gone after a rename, unless the name became the same file meanwhile.
            let _ = rustix::fs::unlinkat(&*to, &temp[..], AtFlags::empty());
            renamed.map_err(io)?;
            shared
                .written
                .files
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            if shared.config.skip_unchanged && !sent.contains(file) {
                shared.link_skipped(name);
            }
            Ok(())
        })();
        if let Err(e) = made {
            shared.entry_failed(name, &e);
        }
    }
}

/// Replaces the file `name` in `dir` by a copy of it, a file of its own with its mode,
/// owner (where this process may set it) and times, taking its name at once.
fn own_copy(dir: &OwnedFd, name: &[u8]) -> std::io::Result<()> {
    let flags = OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    let from = rustix::fs::openat(dir, name, flags, Mode::empty())?;
    let st = rustix::fs::fstat(&from)?;
    let temp = crate::dest::temp_name(name);
    let create = OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::CLOEXEC;
    let to = rustix::fs::openat(dir, &temp[..], create, Mode::from_raw_mode(0o600))?;
    let copied = (|| -> std::io::Result<()> {
        let (mut from, mut to) = (std::fs::File::from(from), std::fs::File::from(to));
        std::io::copy(&mut from, &mut to)?;
        let _ = rustix::fs::fchown(
            &to,
            Some(rustix::fs::Uid::from_raw(st.st_uid)),
            Some(rustix::fs::Gid::from_raw(st.st_gid)),
        );
        rustix::fs::fchmod(&to, Mode::from_raw_mode(st.st_mode & 0o7777))?;
        let times = crate::dest::timestamps(
            (st.st_mtime, st.st_mtime_nsec as u32),
            Some((st.st_atime, st.st_atime_nsec as u32)),
        );
        rustix::fs::futimens(&to, &times)?;
        rustix::fs::renameat(dir, &temp[..], dir, name)?;
        Ok(())
    })();
    if copied.is_err() {
        let _ = rustix::fs::unlinkat(dir, &temp[..], AtFlags::empty());
    }
    copied
}

/// A local path's parent and last component.
pub(crate) fn split(local: &[u8]) -> (Vec<u8>, Vec<u8>) {
    match local.iter().rposition(|&b| b == b'/') {
        Some(i) => (local[..i].to_vec(), local[i + 1..].to_vec()),
        None => (Vec::new(), local.to_vec()),
    }
}
