//! The destination tree: resolving paths beneath the root without following symlinks, and
//! the blocking writer threads that create, fill, verify and rename files.
//!
//! **Architecture invariant:** every file system call on the receiving side goes through a
//! directory fd obtained from the root fd by [`Resolver`], one component at a time, with
//! `O_NOFOLLOW`: a symlink already in the destination is never traversed, so nothing is ever
//! written outside the root.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::ffi::OsStr;
use std::hash::{BuildHasher, RandomState};
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

use bytes::Bytes;
use fastcp_proto::{Attrs, LinkTimes, Meta, SpecialKind};
use rustix::fs::{AtFlags, FileType, Mode, OFlags, Timespec, Timestamps};
use rustix::io::Errno;
use tokio::sync::{OwnedSemaphorePermit, mpsc};

use crate::attrs::Target;
use crate::checksum::{Algorithm, Assembler, ChunkHash};
use crate::event::Event;
use crate::receive::Shared;
use crate::{Error, display::escape};

/// How many directory fds a [`Resolver`] keeps open, at most.
const DIR_CACHE: usize = 512;

/// Operations a writer takes from its queue at once, at most: whatever is there, without
/// waiting for more. Taken one at a time, each freed slot woke a reader waiting on a full
/// queue (an `eventfd` write and a scheduler wake-up per small file).
const WRITER_TAKE: usize = 64;

/// How many directory fds each of `resolvers` resolvers running at once may keep open (and
/// each writer hold for `fsync`): a quarter of the process's open-file limit shared among
/// them, [`DIR_CACHE`] at most and 8 at least. A deep tree under a low limit (1,024 is a
/// common default) then costs more opens, not "too many open files".
pub(crate) fn dir_cache_size(resolvers: usize) -> usize {
    let limit = rustix::process::getrlimit(rustix::process::Resource::Nofile).current;
    let share = limit.unwrap_or(u64::MAX) / 4 / resolvers.max(1) as u64;
    usize::try_from(share)
        .unwrap_or(usize::MAX)
        .clamp(8, DIR_CACHE)
}

/// File descriptors [`reserve_fds`] makes room for, at most.
const FD_TABLE: u64 = 8192;

/// Grows this process's file-descriptor table at once to what a copy may hold open (the
/// open-file limit, 8,192 at most), so that it does not grow step by step while the copy
/// runs. Linux makes a thread that grows the table of a multi-threaded process wait for an
/// RCU grace period, tens of milliseconds each time, and every thread opening a file waits
/// with it: a copy's directory caches open hundreds of folders. The table keeps its size, so
/// a second call costs a few system calls and does nothing else.
///
/// A receiver calls it as it starts. A program calls it first, before it starts any thread,
/// to make even that one growth free (the `fastcp` command does):
///
/// ```
/// fastcp_stream::reserve_fds();
/// ```
pub fn reserve_fds() {
    let limit = rustix::process::getrlimit(rustix::process::Resource::Nofile).current;
    let top = limit.unwrap_or(FD_TABLE).min(FD_TABLE).saturating_sub(1);
    // The lowest free descriptor at or above `top`, closed at once: only the table stays.
    // A descriptor of its own, opened with `O_PATH`, so that closing its copy flushes
    // nothing and drops none of the process's record locks (as closing a copy of a file
    // the program uses would).
    if let Ok(top) = i32::try_from(top)
        && top > 2
        && let Ok(root) = rustix::fs::open("/", OFlags::PATH | OFlags::CLOEXEC, Mode::empty())
    {
        let _ = rustix::io::fcntl_dupfd_cloexec(&root, top);
    }
}

/// Block size for reading a file back to hash it, when its chunks could not be hashed alone.
const READBACK: usize = 1 << 20;

/// One job for a writer thread.
#[derive(Debug)]
pub(crate) enum Op {
    /// A new file: create its temp file.
    Create {
        id: u64,
        wire: Bytes,
        size: u64,
        meta: Meta,
        attrs: Option<Box<Attrs>>,
        /// A `Piece`: the range `(offset, len)` that comes of the file.
        piece: Option<(u64, u64)>,
    },
    /// A chunk of a file, already hashed. The permit holds the receiver's byte budget until
    /// written.
    Data {
        id: u64,
        offset: u64,
        bytes: Bytes,
        hash: ChunkHash,
        _permit: Option<OwnedSemaphorePermit>,
    },
    /// A block the file's partial copy already holds (`--resume`).
    Keep { id: u64, offset: u64, len: u64 },
    /// A hole of the source: a range that reads as zeros (protocol version 8).
    Hole { id: u64, offset: u64, len: u64 },
    /// The sender's hash of a file.
    End { id: u64, hash: [u8; 32] },
    /// The sender gave up on a file: drop it.
    Abandon { id: u64 },
    /// A directory.
    Dir {
        wire: Bytes,
        meta: Meta,
        attrs: Option<Box<Attrs>>,
    },
    /// A file the quick check skips: what of its metadata differs from the sender's.
    Refresh {
        wire: Bytes,
        size: u64,
        mode: Option<u32>,
        mtime: Option<(i64, u32)>,
        attrs: Option<Box<Attrs>>,
    },
    /// A named pipe, socket or device node.
    Special {
        wire: Bytes,
        kind: SpecialKind,
        rdev: u64,
        meta: Meta,
        attrs: Option<Box<Attrs>>,
    },
    /// A symbolic link.
    Symlink {
        wire: Bytes,
        target: Bytes,
        times: Option<LinkTimes>,
        attrs: Option<Box<Attrs>>,
    },
}

/// Where the tree goes.
#[derive(Debug)]
pub(crate) struct Root {
    /// The root directory, opened once.
    pub(crate) fd: Arc<OwnedFd>,
    /// Its path, for messages.
    pub(crate) path: PathBuf,
    /// When the destination is not an existing directory: the name that replaces the single
    /// top-level wire name.
    pub(crate) rename_top: Option<Vec<u8>>,
    /// The single top-level entry must be a directory (see
    /// [`ReceiveConfig::target_may_be_new_dir`](crate::ReceiveConfig::target_may_be_new_dir)).
    pub(crate) top_must_be_dir: bool,
    /// The destination is an existing file: the single top-level entry may not be a
    /// directory, which never replaces it (`cp -r dir file` refuses it too).
    pub(crate) top_is_file: bool,
}

impl Root {
    /// The path beneath a reference folder (`link_dest`) that a wire path maps to: the path
    /// beneath the destination as the user named it. When the one top-level entry makes the
    /// destination (`rename_top`), a path beneath it loses that first name, and the entry
    /// itself keeps it.
    pub(crate) fn in_reference(&self, wire: &[u8]) -> Vec<u8> {
        let local = self.local(wire);
        match (&self.rename_top, local.iter().position(|&b| b == b'/')) {
            (Some(_), Some(i)) => local[i + 1..].to_vec(),
            _ => local,
        }
    }

    /// Opens the reference folder of `link_dest` as it mirrors this destination (see
    /// [`ReceiveConfig::link_dest`](crate::ReceiveConfig::link_dest)): it must be a folder
    /// on the destination's file system, since a hard link cannot cross to another.
    pub(crate) fn open_reference(&self, reference: &Path) -> Result<OwnedFd, Error> {
        // Opened to look paths up only: a folder that may be searched and not listed will do.
        let dir_flags = OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC;
        // The path from the root (absolute: as given).
        let from_root = match &self.rename_top {
            _ if reference.is_absolute() => reference.to_path_buf(),
            None => reference.to_path_buf(),
            // Taken from the destination the top-level entry makes, which may not exist yet:
            // its leading `..` names the root itself.
            Some(top) => {
                let mut path = PathBuf::from(std::ffi::OsStr::from_bytes(top));
                for part in reference.components() {
                    match part {
                        std::path::Component::ParentDir if path.as_os_str().is_empty() => {
                            path.push("..")
                        }
                        std::path::Component::ParentDir if path.ends_with("..") => path.push(".."),
                        std::path::Component::ParentDir => {
                            path.pop();
                        }
                        std::path::Component::CurDir => {}
                        other => path.push(other),
                    }
                }
                if path.as_os_str().is_empty() {
                    path.push(".");
                }
                path
            }
        };
        let opened = rustix::fs::openat(&*self.fd, &from_root, dir_flags, Mode::empty());
        // Named as the user gave it, with the option, and where a relative one was looked for.
        let named = match reference.is_absolute() {
            true => format!("--link-dest {}", reference.display()),
            false => format!(
                "--link-dest {} ({})",
                reference.display(),
                self.path.join(&from_root).display()
            ),
        };
        let what = |e: std::io::Error| Error::Io {
            path: PathBuf::from(&named),
            source: e,
        };
        let fd = opened.map_err(|e| what(e.into()))?;
        let (a, b) = (
            rustix::fs::fstat(&fd).map_err(|e| what(e.into()))?,
            rustix::fs::fstat(&*self.fd).map_err(|e| what(e.into()))?,
        );
        if a.st_dev != b.st_dev {
            return Err(what(std::io::Error::new(
                std::io::ErrorKind::CrossesDevices,
                "on another file system than the destination, which hard links cannot reach",
            )));
        }
        Ok(fd)
    }

    /// The path beneath the root that a wire path maps to.
    pub(crate) fn local(&self, wire: &[u8]) -> Vec<u8> {
        match &self.rename_top {
            None => wire.to_vec(),
            Some(name) => {
                let rest = match wire.iter().position(|&b| b == b'/') {
                    Some(i) => &wire[i..],
                    None => &[][..],
                };
                let mut v = Vec::with_capacity(name.len() + rest.len());
                v.extend_from_slice(name);
                v.extend_from_slice(rest);
                v
            }
        }
    }

    /// The full path of a local relative path, for messages.
    pub(crate) fn display(&self, local: &[u8]) -> PathBuf {
        if local.is_empty() {
            self.path.clone()
        } else {
            self.path.join(OsStr::from_bytes(local))
        }
    }
}

/// Directories created or to be fixed up, shared by the writers.
#[derive(Debug, Default)]
pub(crate) struct DirState {
    /// Local paths of directories this transfer created.
    created: HashSet<Vec<u8>>,
    /// Local paths of directories swept (or being swept) of stale temp files (see [`sweep`]).
    swept: HashMap<Vec<u8>, Arc<std::sync::OnceLock<()>>>,
    /// Mode and mtime to apply at the very end.
    pub(crate) fixups: Vec<Fixup>,
}

/// Metadata applied to a directory once everything is written.
#[derive(Debug)]
pub(crate) struct Fixup {
    /// The directory was there before this copy (not made by it).
    pub(crate) existed: bool,
    pub(crate) local: Vec<u8>,
    pub(crate) wire: Bytes,
    pub(crate) mode: Option<u32>,
    pub(crate) mtime: Option<(i64, u32)>,
    pub(crate) atime: Option<(i64, u32)>,
    pub(crate) attrs: Option<Box<Attrs>>,
}

/// The times to set: `mtime`, and `atime` when it travelled (otherwise left as it is).
pub(crate) fn timestamps((sec, nsec): (i64, u32), atime: Option<(i64, u32)>) -> Timestamps {
    let last_access = match atime {
        Some((sec, nsec)) => Timespec {
            tv_sec: sec,
            tv_nsec: nsec as _,
        },
        None => Timespec {
            tv_sec: 0,
            tv_nsec: rustix::fs::UTIME_OMIT,
        },
    };
    Timestamps {
        last_access,
        last_modification: Timespec {
            tv_sec: sec,
            tv_nsec: nsec as _,
        },
    }
}

/// What the writers did, for the report.
#[derive(Debug, Default)]
pub(crate) struct Written {
    pub(crate) files: AtomicU64,
    pub(crate) dirs: AtomicU64,
    pub(crate) symlinks: AtomicU64,
    pub(crate) bytes: AtomicU64,
    /// Bytes of partial files kept in place of being sent again (`--resume`).
    pub(crate) resumed: AtomicU64,
    /// Entries removed from the way of the source's (`--delete`): a folder where the source
    /// has a file, with what it held.
    pub(crate) deleted: AtomicU64,
}

/// Splits a local path into its parent directory and its last component.
fn split_parent(local: &[u8]) -> (&[u8], &[u8]) {
    match local.iter().rposition(|&b| b == b'/') {
        Some(i) => (&local[..i], &local[i + 1..]),
        None => (&[][..], local),
    }
}

/// Opens directories beneath the root one component at a time, never following a symlink,
/// creating missing ones on demand, and caching the fds.
pub(crate) struct Resolver {
    shared: Arc<Shared>,
    /// The directory paths are taken from: the destination's root, or a reference folder.
    root: Arc<OwnedFd>,
    cache: HashMap<Vec<u8>, Arc<OwnedFd>>,
    /// The last directory asked for: entries come directory by directory.
    last: Option<(Vec<u8>, Arc<OwnedFd>)>,
    create: bool,
}

impl Resolver {
    pub(crate) fn new(shared: Arc<Shared>, create: bool) -> Resolver {
        Resolver {
            root: shared.root.fd.clone(),
            shared,
            cache: HashMap::new(),
            last: None,
            create,
        }
    }

    /// A resolver of paths beneath `root` (a reference folder, `link_dest`), which creates
    /// nothing.
    pub(crate) fn beneath(shared: Arc<Shared>, root: Arc<OwnedFd>) -> Resolver {
        Resolver {
            root,
            shared,
            cache: HashMap::new(),
            last: None,
            create: false,
        }
    }

    /// The directory at `local` (relative to the root; empty for the root itself).
    pub(crate) fn dir(&mut self, local: &[u8]) -> Result<Arc<OwnedFd>, Error> {
        if local.is_empty() {
            return Ok(self.root.clone());
        }
        if let Some((path, fd)) = &self.last
            && path[..] == *local
        {
            return Ok(fd.clone());
        }
        let fd = self.lookup(local)?;
        self.last = Some((local.to_vec(), fd.clone()));
        Ok(fd)
    }

    fn lookup(&mut self, local: &[u8]) -> Result<Arc<OwnedFd>, Error> {
        if let Some(fd) = self.cache.get(local) {
            return Ok(fd.clone());
        }
        // Ends of each component's prefix.
        let ends: Vec<usize> = local
            .iter()
            .enumerate()
            .filter(|&(_, &b)| b == b'/')
            .map(|(i, _)| i)
            .chain(std::iter::once(local.len()))
            .collect();
        // Start from the longest cached prefix.
        let mut base = self.root.clone();
        let mut from = 0;
        for j in (0..ends.len() - 1).rev() {
            if let Some(fd) = self.cache.get(&local[..ends[j]]) {
                base = fd.clone();
                from = j + 1;
                break;
            }
        }
        if self.cache.len() + (ends.len() - from) > self.shared.dir_cache {
            self.cache.clear();
        }
        for j in from..ends.len() {
            let start = if j == 0 { 0 } else { ends[j - 1] + 1 };
            let name = &local[start..ends[j]];
            let prefix = &local[..ends[j]];
            let fd = Arc::new(self.open_dir(&base, name, prefix)?);
            self.cache.insert(prefix.to_vec(), fd.clone());
            base = fd;
        }
        Ok(base)
    }

    fn open_dir(&self, parent: &OwnedFd, name: &[u8], prefix: &[u8]) -> Result<OwnedFd, Error> {
        let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
        match rustix::fs::openat(parent, name, flags, Mode::empty()) {
            Ok(fd) => return Ok(fd),
            Err(Errno::NOENT) if self.create => {
                // Entries may arrive before their directory's own entry: create it now,
                // private until its entry (or the end) sets its mode.
                let mut dirs = self.shared.lock_dirs();
                match rustix::fs::mkdirat(parent, name, Mode::from_raw_mode(0o700)) {
                    Ok(()) => {
                        dirs.created.insert(prefix.to_vec());
                    }
                    Err(Errno::EXIST) => {}
                    Err(e) => return Err(Error::io(self.shared.root.display(prefix), e.into())),
                }
            }
            // The source has a folder here (an entry lies beneath it), the destination a
            // file or a link: the folder takes its place, as rsync does. Never the folder the
            // user named as the destination, and never through the link.
            Err(Errno::LOOP | Errno::NOTDIR)
                if self.create && self.shared.root.rename_top.as_deref() != Some(prefix) =>
            {
                let mut dirs = self.shared.lock_dirs();
                // Another writer may have made the folder already (EISDIR), or be between
                // its removal and its making (ENOENT, EEXIST): the open below tells.
                match rustix::fs::unlinkat(parent, name, AtFlags::empty()) {
                    Ok(()) | Err(Errno::ISDIR | Errno::NOENT) => {}
                    Err(e) => return Err(Error::io(self.shared.root.display(prefix), e.into())),
                }
                match rustix::fs::mkdirat(parent, name, Mode::from_raw_mode(0o700)) {
                    Ok(()) => {
                        dirs.created.insert(prefix.to_vec());
                    }
                    Err(Errno::EXIST) => {}
                    Err(e) => return Err(Error::io(self.shared.root.display(prefix), e.into())),
                }
            }
            Err(Errno::LOOP | Errno::NOTDIR) => return Err(self.not_a_dir(parent, name, prefix)),
            Err(e) => return Err(Error::io(self.shared.root.display(prefix), e.into())),
        }
        match rustix::fs::openat(parent, name, flags, Mode::empty()) {
            Ok(fd) => Ok(fd),
            Err(Errno::LOOP | Errno::NOTDIR) => Err(self.not_a_dir(parent, name, prefix)),
            Err(e) => Err(Error::io(self.shared.root.display(prefix), e.into())),
        }
    }

    fn not_a_dir(&self, parent: &OwnedFd, name: &[u8], prefix: &[u8]) -> Error {
        let path = self.shared.root.display(prefix);
        match rustix::fs::statat(parent, name, AtFlags::SYMLINK_NOFOLLOW) {
            Ok(st) if FileType::from_raw_mode(st.st_mode) == FileType::Symlink => {
                Error::UnsafePath {
                    path: escape(path.as_os_str().as_bytes()),
                    reason: "is a symbolic link in the destination; refusing to write through it"
                        .into(),
                }
            }
            _ => Error::io(path, std::io::Error::from_raw_os_error(libc_enotdir())),
        }
    }
}

/// Clears a folder out of the way of the file or link `local` (in `parent`, as `name`) is to
/// become: an empty one always (as rsync), one with entries only under `--delete`, and only
/// when nothing in it is excluded by the rules or another copy's temp or partial file (as
/// `--delete` keeps those) and within `--max-delete`; removed through handles, never
/// following a link. Never the destination named on the command line. Whether the way is
/// clear.
fn clear_dir_in_the_way(
    shared: &Shared,
    parent: &OwnedFd,
    local: &[u8],
    name: &[u8],
    wire: &[u8],
) -> bool {
    if shared.root.rename_top.as_deref() == Some(local) {
        return false;
    }
    match rustix::fs::unlinkat(parent, name, AtFlags::REMOVEDIR) {
        Ok(()) => true,
        Err(Errno::NOTEMPTY | Errno::EXIST) if shared.config.delete => {
            let kept = |path: &[u8], is_dir: bool| {
                let leaf = path.rsplit(|&b| b == b'/').next().unwrap_or(path);
                is_temp_name(leaf)
                    || shared
                        .config
                        .filter
                        .as_ref()
                        .is_some_and(|f| !f.allows(path, is_dir))
            };
            if crate::mirror::holds_any(parent, name, wire, &kept) != Ok(false) {
                return false;
            }
            // It counts against `--max-delete`, as the mirror's extras do.
            let mut budget = lock(&shared.delete_budget);
            if budget.is_limited() && !budget.take(crate::mirror::entries(parent, name)) {
                return false;
            }
            drop(budget);
            match crate::mirror::remove(parent, name, &shared.progress, 0) {
                Ok(n) => {
                    shared.written.deleted.fetch_add(n, Relaxed);
                    shared.progress.deleted(Bytes::copy_from_slice(wire), n);
                    true
                }
                Err(_) => false,
            }
        }
        Err(_) => false,
    }
}

/// Renames `temp` over `name` in `parent` (the entry `local`, `wire`), clearing a folder
/// out of its way first when [`clear_dir_in_the_way`] may.
fn rename_into_place(
    shared: &Shared,
    parent: &OwnedFd,
    temp: &[u8],
    local: &[u8],
    name: &[u8],
    wire: &[u8],
) -> rustix::io::Result<()> {
    let renamed = rustix::fs::renameat(parent, temp, parent, name);
    if matches!(renamed, Err(Errno::ISDIR | Errno::NOTEMPTY | Errno::EXIST))
        && clear_dir_in_the_way(shared, parent, local, name, wire)
    {
        return rustix::fs::renameat(parent, temp, parent, name);
    }
    renamed
}

fn libc_enotdir() -> i32 {
    Errno::NOTDIR.raw_os_error()
}

/// The most chunks of one file that may wait for a gap before them, and the most gaps; an
/// honest sender's are a few per stream.
const MAX_PENDING_CHUNKS: usize = 65_536;

/// Chunks of zeros at least this long are left as holes instead of written.
const HOLE_MIN: usize = 4096;

/// File `id` of `files`, open, for `len` more of its bytes; `None` when the sender abandoned
/// it after these bytes were queued, or it failed here (its bytes are then counted and
/// dropped, and it is forgotten once they and its end have all come).
fn open_file(files: &mut HashMap<u64, FileState>, id: u64, len: u64) -> Option<&mut OpenFile> {
    if let Some(FileState::Skipped(s)) = files.get_mut(&id) {
        s.got += len;
        if s.got >= s.size && s.end {
            files.remove(&id);
        }
        return None;
    }
    match files.get_mut(&id) {
        Some(FileState::Open(f)) => Some(f),
        _ => None,
    }
}

/// Whether every byte of `b` is zero (exits at the first that is not).
fn is_zero(b: &[u8]) -> bool {
    let mut words = b.chunks_exact(8);
    words.all(|w| u64::from_ne_bytes(w.try_into().expect("8 bytes")) == 0)
        && words.remainder().iter().all(|&x| x == 0)
}

/// The permission bits a received file or directory may get with `-p`: everything but
/// setuid and setgid (the sticky bit stays), whoever writes it.
pub const SAFE_MODE_BITS: u32 = 0o1777;

/// Whether `name` is one of fastcp's temp names: `.NAME.fastcp-` and 8 hex digits (not a
/// `--resume` partial file).
///
/// ```
/// assert!(fastcp_stream::is_temp_name(b".notes.txt.fastcp-0badc0de"));
/// assert!(!fastcp_stream::is_temp_name(b".notes.txt.fastcp-partial"));
/// assert!(!fastcp_stream::is_temp_name(b"notes.txt"));
/// ```
pub fn is_temp_name(name: &[u8]) -> bool {
    let Some(tail) = name.len().checked_sub(16).map(|i| &name[i..]) else {
        return false;
    };
    name.len() > 17
        && name[0] == b'.'
        && tail.starts_with(b".fastcp-")
        && tail[8..].iter().all(|b| b.is_ascii_hexdigit())
}

/// Whether `name` is a file fastcp works in: a temp name (`.NAME.fastcp-XXXXXXXX`) or a
/// partial file kept for `--resume` (`.NAME.fastcp-partial`). Mirroring leaves them alone:
/// they belong to a live copy, or to the next one.
pub fn is_work_file(name: &[u8]) -> bool {
    is_temp_name(name)
        || (name.starts_with(b".") && name.ends_with(b".fastcp-partial"))
        || crate::pieces::is_piece_file(name)
}

/// How long before a transfer began a temp file must have been last written for its sweep to
/// take it: another live copy creates its temp file and locks it a moment later, and file
/// times come from a coarse clock, so a fresh temp file is never taken for a stale one.
const STALE_AFTER: std::time::Duration = std::time::Duration::from_secs(10);

/// Removes the temp files a copy that was killed left in `dir` (with kill -9, a power cut):
/// those last written well before this transfer began (`started`, see [`STALE_AFTER`]) that
/// no process holds a lock on. A receiver locks each temp file right after creating it and
/// until its rename, so another live copy's temp files are never touched; this transfer
/// sweeps a folder before it creates anything there. Best effort: what cannot be read or
/// locked stays.
fn sweep(dir: &OwnedFd, started: std::time::SystemTime, users: impl Fn(&[u8]) -> bool) -> usize {
    let Ok(d) = rustix::fs::openat(
        dir,
        c".",
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    ) else {
        return 0;
    };
    let Ok(mut entries) = rustix::fs::Dir::new(d) else {
        return 0;
    };
    let mut removed = 0;
    while let Some(Ok(entry)) = entries.next() {
        let name = entry.file_name().to_bytes();
        if is_temp_name(name) && !users(name) && remove_if_stale(dir, name, started) {
            removed += 1;
        }
    }
    removed
}

/// Removes `name` from `dir` if it is a temp file a killed copy left: a temp name, a
/// regular file last written [`STALE_AFTER`] or more before `started`, that no process
/// holds a lock on, or a symlink or special file made (its ctime, which `-p` does not set
/// back) that long before: those cannot be locked, and a live copy renames them a moment
/// after making them. Whether it was removed.
pub(crate) fn remove_if_stale(dir: &OwnedFd, name: &[u8], started: std::time::SystemTime) -> bool {
    if !is_temp_name(name) {
        return false;
    }
    let before = started
        .checked_sub(STALE_AFTER)
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_nanos() as i128);
    let Ok(st) = rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW) else {
        return false;
    };
    match FileType::from_raw_mode(st.st_mode) {
        FileType::RegularFile => {}
        FileType::Directory => return false,
        _ => {
            let made = i128::from(st.st_ctime) * 1_000_000_000 + i128::from(st.st_ctime_nsec);
            return made < before && rustix::fs::unlinkat(dir, name, AtFlags::empty()).is_ok();
        }
    }
    let flags = OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC;
    let Ok(fd) = rustix::fs::openat(dir, name, flags, Mode::empty()) else {
        return false;
    };
    let stale = rustix::fs::fstat(&fd).is_ok_and(|st| {
        let written = i128::from(st.st_mtime) * 1_000_000_000 + i128::from(st.st_mtime_nsec);
        FileType::from_raw_mode(st.st_mode) == FileType::RegularFile && written < before
    });
    stale
        && rustix::fs::flock(&fd, rustix::fs::FlockOperation::NonBlockingLockExclusive).is_ok()
        && rustix::fs::unlinkat(dir, name, AtFlags::empty()).is_ok()
}

/// A fresh temporary name beside `name`: `.NAME.fastcp-XXXXXXXX`, short enough for any file
/// system.
pub(crate) fn temp_name(name: &[u8]) -> Vec<u8> {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    thread_local!(static SEED: RandomState = RandomState::new());
    let r = SEED.with(|s| s.hash_one(COUNTER.fetch_add(1, Relaxed))) as u32;
    let keep = &name[..name.len().min(200)];
    let mut v = Vec::with_capacity(keep.len() + 18);
    v.push(b'.');
    v.extend_from_slice(keep);
    v.extend_from_slice(format!(".fastcp-{r:08x}").as_bytes());
    v
}

/// A file being received.
struct OpenFile {
    wire: Bytes,
    local: Vec<u8>,
    parent: Arc<OwnedFd>,
    name_at: usize,
    temp: Vec<u8>,
    fd: OwnedFd,
    size: u64,
    got: u64,
    meta: Meta,
    /// Byte ranges written so far, start -> end, adjacent ranges merged.
    written: BTreeMap<u64, u64>,
    /// The file was given its full length (for holes left where chunks of zeros go).
    sized: bool,
    checksum: Assembler,
    expected: Option<[u8; 32]>,
    /// `--resume`: the temp file is the file's partial file, kept if the copy stops before
    /// the file is complete.
    partial: bool,
    /// What the partial file was offered with, for the `Keep`s that may come.
    offer: Option<crate::resume::Offer>,
    /// With `resume_from_record`: the record this copy keeps of the partial file.
    record: Option<Box<Recording>>,
    /// Bytes at the start of the temp file that hold an earlier copy's data: zeros there are
    /// written, not left as holes.
    stale: u64,
    /// The owner and attributes to set before the rename.
    attrs: Option<Box<Attrs>>,
    /// A `Piece` of the file, `(offset, len)`: the temp file is the work file all the runs
    /// that send its pieces share (see [`crate::pieces`]).
    piece: Option<(u64, u64)>,
    /// Bytes of its partial file kept rather than sent again (`--resume`).
    kept: u64,
}

impl OpenFile {
    fn name(&self) -> &[u8] {
        &self.local[self.name_at..]
    }

    /// The bytes that come: the file's, or its piece's.
    fn expected_bytes(&self) -> u64 {
        self.piece.map_or(self.size, |(_, len)| len)
    }

    /// Removes the temp file.
    fn discard(self) {
        let _ = rustix::fs::unlinkat(&self.parent, &self.temp[..], AtFlags::empty());
    }

    /// The copy stops before the file is complete: its partial file stays for `--resume`
    /// (with its record saved), and the work file of pieces for the other runs, any other
    /// temp file goes.
    fn stop(mut self) {
        if self.partial {
            self.save_record();
        } else if self.piece.is_none() {
            self.discard();
        }
    }

    /// With a record (`resume_from_record`): flushes what was written to disk, then records
    /// it beside what the partial file held, for the next copy to keep. A failure only
    /// costs the next copy bytes: the record it leaves is older, never ahead of the disk.
    fn save_record(&mut self) {
        let Some(r) = &mut self.record else {
            return;
        };
        r.unrecorded = 0;
        if rustix::fs::fdatasync(&self.fd).is_err() {
            // The pages a failed flush lost are reported once: a later flush could succeed
            // without them. No record from this copy, then.
            crate::resume::Record::clear(&self.fd);
            self.record = None;
            return;
        }
        let mut record = r.base.clone();
        for (&start, &end) in &self.written {
            record.add(start, end);
        }
        let _ = record.save(&self.fd);
    }

    /// With a record: `len` more bytes were written. The record is saved each time a 32nd
    /// of the file (4 MiB at least) was written since it last was, once the file has been
    /// open a quarter of a second: a kill -9 costs the next copy no more than that, and a
    /// file written in less time waits for no flush.
    fn wrote(&mut self, len: u64) {
        let Some(r) = &mut self.record else {
            return;
        };
        r.unrecorded += len;
        if r.unrecorded >= (self.size / 32).max(crate::resume::PARTIAL_MIN)
            && r.opened.elapsed() >= Duration::from_millis(250)
        {
            self.save_record();
        }
    }
}

/// The record of what a partial file holds (`resume_from_record`), as this copy keeps it.
struct Recording {
    /// The source's version, and the ranges the partial file held when this copy opened it;
    /// what this copy writes joins them in the saved record.
    base: crate::resume::Record,
    /// Bytes written since the record was last saved.
    unrecorded: u64,
    opened: Instant,
}

/// A file whose bytes are dropped: it failed here, and we wait for the rest of its frames.
struct Skipped {
    size: u64,
    got: u64,
    end: bool,
}

enum FileState {
    Open(Box<OpenFile>),
    Skipped(Skipped),
}

/// One blocking writer thread.
pub(crate) struct Writer {
    shared: Arc<Shared>,
    resolver: Resolver,
    files: HashMap<u64, FileState>,
    readback: Vec<u8>,
    /// With `fsync`: the directories entries went into, to flush at the end.
    to_sync: HashMap<Vec<u8>, Arc<OwnedFd>>,
    /// Local ids by the sender's user and group names.
    ids: crate::attrs::Ids,
    /// Counts this writer as running until it is dropped, after everything above (see
    /// [`Progress::settled`](crate::Progress::settled)).
    _running: crate::progress::Running,
}

impl Writer {
    pub(crate) fn new(shared: Arc<Shared>) -> Writer {
        Writer {
            _running: shared.progress.writer_running(),
            resolver: Resolver::new(shared.clone(), true),
            shared,
            files: HashMap::new(),
            readback: Vec::new(),
            to_sync: HashMap::new(),
            ids: crate::attrs::Ids::default(),
        }
    }

    /// With `fsync`, remembers that an entry went into the directory `parent` at `local`.
    fn wrote_into(&mut self, local: &[u8], parent: &Arc<OwnedFd>) {
        if self.shared.config.fsync && !self.to_sync.contains_key(local) {
            // Flushed early when there are as many as the folder cache may hold: each is
            // an open folder. One written into again is flushed again.
            if self.to_sync.len() >= self.shared.dir_cache {
                self.sync_dirs();
            }
            self.to_sync.insert(local.to_vec(), parent.clone());
        }
    }

    /// Flushes the directories entries went into; the first failure aborts the transfer.
    fn sync_dirs(&mut self) {
        for (local, fd) in self.to_sync.drain() {
            if let Err(e) = rustix::fs::fsync(&*fd) {
                let path = self.shared.root.display(&local);
                self.shared.abort.trigger(Error::io(path, e.into()));
                return;
            }
        }
    }

    /// Runs until the channel closes or the transfer aborts; removes every temp file it
    /// still has.
    pub(crate) fn run(mut self, mut rx: mpsc::Receiver<Op>) {
        let mut ops = Vec::with_capacity(WRITER_TAKE);
        'run: while rx.blocking_recv_many(&mut ops, WRITER_TAKE) > 0 {
            for op in ops.drain(..) {
                if self.shared.abort.is_set() {
                    // With `resume`, what already arrived still goes into the partial files,
                    // for the next copy (the readers have stopped: this is what they had
                    // queued).
                    if !self.shared.config.resume {
                        break 'run;
                    }
                    if matches!(
                        op,
                        Op::Create { .. } | Op::Data { .. } | Op::Keep { .. } | Op::Hole { .. }
                    ) && self.handle_caught(op).is_err()
                    {
                        break 'run;
                    }
                    continue;
                }
                if let Err(e) = self.handle_caught(op) {
                    self.shared.abort.trigger(e);
                    break 'run;
                }
            }
        }
        drop(ops);
        drop(rx);
        let aborted = self.shared.abort.is_set();
        let mut incomplete = None;
        for (_, state) in self.files.drain() {
            if let FileState::Open(f) = state {
                incomplete.get_or_insert_with(|| escape(&f.wire));
                f.stop();
            }
        }
        if let (Some(path), false) = (incomplete, aborted) {
            self.shared.abort.trigger(Error::Protocol(format!(
                "{path}: the transfer ended before the file was complete"
            )));
        }
        if !self.shared.abort.is_set() {
            self.sync_dirs();
        }
    }

    /// [`handle`](Self::handle), with a panic made the transfer's error: the copy then
    /// ends at once (the readers could otherwise wait for budget this writer held), and the
    /// temp files of this writer's open files are removed as after any other error.
    fn handle_caught(&mut self, op: Op) -> Result<(), Error> {
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.handle(op))).unwrap_or_else(
            |panic| {
                let what = crate::error::panic_message(&*panic);
                // A local fault, not a lost connection.
                Err(Error::Io {
                    path: self.shared.root.display(b""),
                    source: std::io::Error::other(format!("a writer thread panicked: {what}")),
                })
            },
        )
    }

    fn handle(&mut self, op: Op) -> Result<(), Error> {
        #[cfg(test)]
        if let Op::End { id, .. } = &op
            && matches!(self.files.get(id),
                Some(FileState::Open(f)) if f.wire.ends_with(b"writer-panics-here"))
        {
            panic!("injected by a test");
        }
        match op {
            Op::Create {
                id,
                wire,
                size,
                meta,
                attrs,
                piece,
            } => self.create(id, wire, size, meta, attrs, piece),
            Op::Data {
                id,
                offset,
                bytes,
                hash,
                ..
            } => self.data(id, offset, bytes, hash),
            Op::Keep { id, offset, len } => self.keep(id, offset, len),
            Op::Hole { id, offset, len } => self.hole(id, offset, len),
            Op::End { id, hash } => self.end(id, hash),
            Op::Abandon { id } => {
                // The work file of a piece holds other runs' pieces: it stays.
                if let Some(FileState::Open(f)) = self.files.remove(&id)
                    && f.piece.is_none()
                {
                    f.discard();
                }
                Ok(())
            }
            Op::Dir { wire, meta, attrs } => {
                self.dir(wire, meta, attrs);
                Ok(())
            }
            Op::Refresh {
                wire,
                size,
                mode,
                mtime,
                attrs,
            } => {
                self.refresh(wire, size, mode, mtime, attrs);
                Ok(())
            }
            Op::Special {
                wire,
                kind,
                rdev,
                meta,
                attrs,
            } => {
                self.special(wire, kind, rdev, meta, attrs);
                Ok(())
            }
            Op::Symlink {
                wire,
                target,
                times,
                attrs,
            } => {
                self.symlink(wire, target, times, attrs);
                Ok(())
            }
        }
    }

    fn skip(&mut self, id: u64, size: u64) {
        self.files.insert(
            id,
            FileState::Skipped(Skipped {
                size,
                got: 0,
                end: false,
            }),
        );
    }

    fn create(
        &mut self,
        id: u64,
        wire: Bytes,
        size: u64,
        meta: Meta,
        attrs: Option<Box<Attrs>>,
        piece: Option<(u64, u64)>,
    ) -> Result<(), Error> {
        self.shared.progress.set_current(&wire);
        self.shared.progress.event(|| Event::Started {
            path: wire.clone(),
            size,
        });
        let local = self.shared.root.local(&wire);
        let (parent_path, name) = split_parent(&local);
        let name_at = local.len() - name.len();
        let parent = match self.resolver.dir(parent_path) {
            Ok(fd) => fd,
            Err(e) => {
                self.shared.entry_failed(&wire, &e);
                self.skip(id, piece.map_or(size, |(_, len)| len));
                return Ok(());
            }
        };
        if let Some((offset, len)) = piece {
            let temp = crate::pieces::work_name(name, size, (meta.mtime, meta.mtime_nsec));
            let end = offset + len;
            // The file is whole under its name already (a run retried after the last one):
            // nothing to do, and no work file to leave behind.
            if already_whole(&parent, name, size, &meta) {
                self.skip(id, len);
                return Ok(());
            }
            let opened = crate::pieces::open_work(&parent, &temp, size).and_then(|fd| {
                let claimed = crate::pieces::claim(&fd, size, offset, end)?;
                Ok((fd, claimed))
            });
            let fd = match opened {
                // Bytes are written only where no run's verified range is.
                Ok((fd, crate::pieces::Claim::Write)) => fd,
                Ok((_, crate::pieces::Claim::Held)) => {
                    self.skip(id, len);
                    return Ok(());
                }
                Err(e) => {
                    let e = Error::io(self.shared.root.display(&local), e);
                    self.shared.entry_failed(&wire, &e);
                    self.skip(id, len);
                    return Ok(());
                }
            };
            let file = OpenFile {
                wire,
                local,
                parent,
                name_at,
                temp,
                fd,
                size,
                got: 0,
                meta,
                written: BTreeMap::new(),
                sized: true,
                checksum: Algorithm::for_receiver(&self.shared.config).assembler_at(offset),
                expected: None,
                partial: false,
                offer: None,
                record: None,
                // Another run's bytes may be anywhere: zeros are written, not left as holes.
                stale: size,
                attrs,
                piece: Some((offset, len)),
                kept: 0,
            };
            self.files.insert(id, FileState::Open(Box::new(file)));
            return Ok(());
        }
        // Private until it is complete and verified; it takes its final mode just before
        // its final name.
        let mode = Mode::from_raw_mode(0o600);
        let flags =
            OFlags::RDWR | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC;
        // Once per directory a copy writes into, before its first temp file there (other
        // writers wait for it): what a killed copy left there goes.
        let swept = self
            .shared
            .lock_dirs()
            .swept
            .entry(parent_path.to_vec())
            .or_default()
            .clone();
        swept.get_or_init(|| {
            // A name the copy skipped (its file unchanged) or the rules exclude is the user's,
            // however it looks.
            let dir_wire = &wire[..wire.iter().rposition(|&b| b == b'/').unwrap_or(0)];
            let users = |name: &[u8]| {
                let mut w = Vec::with_capacity(dir_wire.len() + 1 + name.len());
                if !dir_wire.is_empty() {
                    w.extend_from_slice(dir_wire);
                    w.push(b'/');
                }
                w.extend_from_slice(name);
                self.shared.was_skipped(&w)
                    || self
                        .shared
                        .config
                        .filter
                        .as_ref()
                        .is_some_and(|f| !f.allows(&w, false))
            };
            sweep(&parent, self.shared.started, users);
        });
        if self.shared.config.resume && size > crate::resume::PARTIAL_MIN {
            match self.open_partial(&wire, &parent, name, size, &meta) {
                Ok(Some(file)) => {
                    let file = OpenFile {
                        wire,
                        local: local.clone(),
                        parent,
                        name_at,
                        meta,
                        checksum: Algorithm::for_receiver(&self.shared.config).assembler(size),
                        attrs,
                        ..file
                    };
                    self.files.insert(id, FileState::Open(Box::new(file)));
                    return Ok(());
                }
                Ok(None) => {}
                Err(e) => {
                    let e = Error::io(self.shared.root.display(&local), e);
                    self.shared.entry_failed(&wire, &e);
                    self.skip(id, size);
                    return Ok(());
                }
            }
        }
        let (fd, temp) = loop {
            let temp = temp_name(name);
            match rustix::fs::openat(&parent, &temp[..], flags, mode) {
                Ok(fd) => {
                    // Held until the rename: it tells a later sweep that this one is live.
                    let _ = rustix::fs::flock(&fd, rustix::fs::FlockOperation::LockExclusive);
                    break (fd, temp);
                }
                Err(Errno::EXIST) => continue,
                Err(e) => {
                    let e = Error::io(self.shared.root.display(&local), e.into());
                    self.shared.entry_failed(&wire, &e);
                    self.skip(id, size);
                    return Ok(());
                }
            }
        };
        let file = OpenFile {
            wire,
            local,
            parent,
            name_at,
            temp,
            fd,
            size,
            got: 0,
            meta,
            written: BTreeMap::new(),
            sized: false,
            checksum: Algorithm::for_receiver(&self.shared.config).assembler(size),
            expected: None,
            partial: false,
            offer: None,
            record: None,
            stale: 0,
            attrs,
            piece: None,
            kept: 0,
        };
        self.files.insert(id, FileState::Open(Box::new(file)));
        Ok(())
    }

    /// With `resume`: the file's partial file as its temp file, the one offered to the sender
    /// (its blocks kept, its length set to `size`) or a fresh one; `None` when another copy
    /// holds it (a random temp name is used instead). The fields that do not depend on the
    /// partial file are placeholders for the caller to fill.
    fn open_partial(
        &mut self,
        wire: &Bytes,
        parent: &Arc<OwnedFd>,
        name: &[u8],
        size: u64,
        meta: &Meta,
    ) -> std::io::Result<Option<OpenFile>> {
        let temp = crate::resume::partial_name(name);
        let version = crate::resume::Version::new(name, size, (meta.mtime, meta.mtime_nsec));
        let (fd, offer) = match self.shared.take_offer(wire) {
            // An offer vouched for by a record is this file's only if it is of this version
            // of the source (two sources may land on one name).
            Some((fd, offer)) => (
                fd,
                Some(offer).filter(|o| o.version.is_none_or(|v| v == version)),
            ),
            None => match crate::resume::open_partial(parent, &temp, true) {
                Some(fd) => (fd, None),
                None => return Ok(None),
            },
        };
        // What was not offered is of no use: it goes.
        let stale = match &offer {
            Some(o) => (o.hashes.len() as u64)
                .saturating_mul(o.block)
                .min(size)
                .min(rustix::fs::fstat(&fd)?.st_size as u64),
            None => 0,
        };
        // The old record speaks for bytes about to change: with a record, what this copy
        // keeps is recorded anew, before any byte is written.
        crate::resume::Record::clear(&fd);
        let record = (self.shared.config.resume_from_record
            && crate::resume::Record::may_record(meta.mtime))
        .then(|| {
            let mut ranges = offer.as_ref().map(|o| o.held(size)).unwrap_or_default();
            // Only what stays of the partial file.
            ranges.retain(|&start, end| {
                *end = (*end).min(stale);
                start < *end
            });
            crate::resume::Record { version, ranges }
        });
        if let Some(r) = record.as_ref().filter(|r| !r.ranges.is_empty()) {
            let _ = r.save(&fd);
        }
        rustix::fs::ftruncate(&fd, stale)?;
        rustix::fs::ftruncate(&fd, size)?;
        Ok(Some(OpenFile {
            wire: wire.clone(),
            local: Vec::new(),
            parent: parent.clone(),
            name_at: 0,
            temp,
            fd,
            size,
            got: 0,
            meta: Meta::default(),
            written: BTreeMap::new(),
            sized: true,
            checksum: Algorithm::Xxh3.assembler(size),
            expected: None,
            partial: true,
            offer,
            record: record.map(|base| {
                Box::new(Recording {
                    base,
                    unrecorded: 0,
                    opened: Instant::now(),
                })
            }),
            stale,
            attrs: None,
            piece: None,
            kept: 0,
        }))
    }

    /// A block of a file that its partial file already holds: accounted as written, and
    /// folded into the checksum with the hash the receiver offered for it.
    fn keep(&mut self, id: u64, offset: u64, len: u64) -> Result<(), Error> {
        let Some(f) = open_file(&mut self.files, id, len) else {
            return Ok(());
        };
        let offered = f.offer.as_ref().and_then(|o| o.hash(offset, len, f.size));
        let Some(hash) = offered else {
            let e = Error::Protocol(format!(
                "{}: kept block at offset {offset} was not offered",
                escape(&f.wire)
            ));
            return Err(self.fail_file(id, e));
        };
        if overlaps(&f.written, offset, offset + len) {
            let e = Error::Protocol(format!(
                "{}: overlapping chunks at offset {offset}",
                escape(&f.wire)
            ));
            return Err(self.fail_file(id, e));
        }
        // A block of zeros stays, as a hole where the file system can punch one: the same
        // bytes, and the copy as sparse as blocks of zeros that are written.
        if hash == crate::checksum::zeros_hash(len) {
            use rustix::fs::FallocateFlags;
            let punch = FallocateFlags::PUNCH_HOLE | FallocateFlags::KEEP_SIZE;
            let _ = rustix::fs::fallocate(&f.fd, punch, offset, len);
        }
        insert_range(&mut f.written, offset, offset + len);
        f.got += len;
        // A ranges-only checksum counts the block's range alone, as the sender's does.
        let ranges_only = Algorithm::for_receiver(&self.shared.config) == Algorithm::Ranges;
        let hash = if ranges_only { 0 } else { hash };
        f.checksum.add(offset, len, ChunkHash::Xxh3(hash));
        f.kept += len;
        self.shared.written.resumed.fetch_add(len, Relaxed);
        self.shared.progress.add_resumed(len);
        progressed(&self.shared.progress, f);
        self.finish_if_complete(id)
    }

    /// A hole of the source (protocol version 8): the range reads as zeros, accounted as
    /// written. The file takes its full length, so that a hole that was never written reads
    /// back as zeros; where an earlier copy's data may lie (`--resume`, another run's work
    /// file) the range is zeroed, by punching a hole where the file system can.
    fn hole(&mut self, id: u64, offset: u64, len: u64) -> Result<(), Error> {
        let Some(f) = open_file(&mut self.files, id, len) else {
            return Ok(());
        };
        let end = offset + len;
        if let Some(e) = refused_range(f, offset, end) {
            return Err(self.fail_file(id, e));
        }
        let mut zeroed = Ok(());
        if !f.sized {
            f.sized = true;
            zeroed = rustix::fs::ftruncate(&f.fd, f.size).map_err(Into::into);
        }
        if zeroed.is_ok() && offset < f.stale {
            zeroed = zero_range(&f.fd, offset, end.min(f.stale));
        }
        if let Err(e) = zeroed {
            let e = Error::io(self.shared.root.display(&f.local), e);
            if let Some(FileState::Open(f)) = self.files.remove(&id) {
                f.stop();
            }
            return Err(e);
        }
        insert_range(&mut f.written, offset, end);
        f.got += len;
        f.checksum.add(offset, len, ChunkHash::Xxh3(0));
        f.wrote(len);
        self.shared.progress.add_done_bytes(len);
        progressed(&self.shared.progress, f);
        self.finish_if_complete(id)
    }

    fn data(&mut self, id: u64, offset: u64, bytes: Bytes, hash: ChunkHash) -> Result<(), Error> {
        let len = bytes.len() as u64;
        let Some(f) = open_file(&mut self.files, id, len) else {
            return Ok(());
        };
        if len == 0 {
            return Ok(());
        }
        let end = offset + len;
        if let Some(e) = refused_range(f, offset, end) {
            return Err(self.fail_file(id, e));
        }
        // Blocks of zeros are left as holes, once the file has its full length: a sparse
        // source stays sparse, and reads back the same. Not where an earlier copy's data
        // may lie (`--resume`).
        let written = if offset >= f.stale {
            write_sparse(f, &bytes, offset)
        } else {
            pwrite_all(&f.fd, &bytes, offset)
        };
        if let Err(e) = written {
            // A full disk, say: what was written stays for `--resume`.
            let e = Error::io(self.shared.root.display(&f.local), e);
            if let Some(FileState::Open(f)) = self.files.remove(&id) {
                f.stop();
            }
            return Err(e);
        }
        // The block this chunk was cut from goes back to the readers once nothing else
        // holds it.
        self.shared.pool.give(bytes);
        insert_range(&mut f.written, offset, end);
        f.got += len;
        f.checksum.add(offset, len, hash);
        f.wrote(len);
        self.shared.progress.add_done_bytes(len);
        progressed(&self.shared.progress, f);
        self.finish_if_complete(id)
    }

    fn end(&mut self, id: u64, hash: [u8; 32]) -> Result<(), Error> {
        match self.files.get_mut(&id) {
            None => Ok(()),
            Some(FileState::Skipped(s)) => {
                s.end = true;
                if s.got >= s.size {
                    self.files.remove(&id);
                }
                Ok(())
            }
            Some(FileState::Open(f)) => {
                f.expected = Some(hash);
                self.finish_if_complete(id)
            }
        }
    }

    /// Removes a file's temp file and returns `e`, for a fatal error. The work file of a
    /// piece stays: it holds other runs' pieces, and this one's bytes were never recorded.
    fn fail_file(&mut self, id: u64, e: Error) -> Error {
        if let Some(FileState::Open(f)) = self.files.remove(&id) {
            if f.piece.is_some() {
                f.stop();
            } else {
                f.discard();
            }
        }
        e
    }

    /// Verifies and renames a file into place once all its bytes and its hash are in.
    fn finish_if_complete(&mut self, id: u64) -> Result<(), Error> {
        let Some(FileState::Open(f)) = self.files.get(&id) else {
            return Ok(());
        };
        if f.got < f.expected_bytes() || f.expected.is_none() {
            return Ok(());
        }
        let Some(FileState::Open(f)) = self.files.remove(&id) else {
            return Ok(());
        };
        let f = *f;
        let end = f.piece.map_or(f.size, |(offset, len)| offset + len);
        let actual = match f.checksum.finish(end) {
            Some(sum) => sum,
            None => {
                // Chunks that could not be hashed alone: hash the file from disk, once.
                if self.readback.is_empty() {
                    self.readback = vec![0; READBACK];
                }
                match read_back_hash(&f.fd, f.size, &mut self.readback) {
                    Ok(h) => h,
                    Err(e) => {
                        let e = Error::io(self.shared.root.display(&f.local), e);
                        f.discard();
                        return Err(e);
                    }
                }
            }
        };
        if Some(actual) != f.expected {
            let path = escape(&f.wire);
            match f.piece {
                Some((offset, len)) => self.piece_failed(f, offset, len),
                None => f.discard(),
            }
            return Err(Error::Integrity { path });
        }
        match f.piece {
            Some((offset, len)) => self.piece_done(f, offset, len),
            None => {
                let size = f.size;
                self.place(f, size)
            }
        }
    }

    /// A piece's bytes failed their check: its range comes off the work file's record, to be
    /// sent again (another run may have recorded it while this one wrote over it); if
    /// another run has meanwhile given the work file its final name, that file goes.
    fn piece_failed(&mut self, f: OpenFile, offset: u64, len: u64) {
        let name = &f.local[f.name_at..];
        let forgot = crate::pieces::forget(
            &f.parent,
            &f.temp,
            name,
            &f.fd,
            f.size,
            offset,
            offset + len,
        );
        let display = self.shared.root.display(&f.local);
        match forgot {
            Ok(crate::pieces::Forgot::Removed) => {
                let e = std::io::Error::other(
                    "another run completed it while a piece written into it failed its check: \
                     removed, copy it again",
                );
                self.shared.entry_failed(&f.wire, &Error::io(display, e));
            }
            Ok(_) => {}
            Err(e) => self.shared.entry_failed(&f.wire, &Error::io(display, e)),
        }
        f.stop();
    }

    /// A piece of a file arrived whole and verified: its range joins the record of the work
    /// file, and the run whose piece completes the file gives it its final name.
    fn piece_done(&mut self, f: OpenFile, offset: u64, len: u64) -> Result<(), Error> {
        let shared = self.shared.clone();
        let recorded =
            crate::pieces::record(&f.parent, &f.temp, &f.fd, f.size, offset, offset + len);
        match recorded {
            Ok(crate::pieces::Recorded::Complete) => {
                let (parent, local, name_at) = (f.parent.clone(), f.local.clone(), f.name_at);
                self.place(f, len)?;
                crate::pieces::remove_other_versions(&parent, &local[name_at..]);
                Ok(())
            }
            Ok(_) => {
                shared.written.bytes.fetch_add(len, Relaxed);
                shared.progress.event(|| Event::Done {
                    path: f.wire.clone(),
                    bytes: len,
                    verified: true,
                });
                Ok(())
            }
            Err(e) => {
                shared.entry_failed(&f.wire, &Error::io(shared.root.display(&f.local), e));
                Ok(())
            }
        }
    }

    /// Gives a verified file (`bytes` of it from this copy) its mode, times and attributes,
    /// then its final name.
    fn place(&mut self, f: OpenFile, bytes: u64) -> Result<(), Error> {
        let shared = self.shared.clone();
        let display = || shared.root.display(&f.local);
        if f.record.is_some() {
            crate::resume::Record::clear(&f.fd);
        }
        // The sender's bits (less the umask without `preserve`, as scp does); never setuid
        // or setgid: the file belongs to whoever receives it, and a sender must not be able
        // to hand that user a program that runs with their rights. Without `preserve`, a
        // file replaced keeps its own permission bits, as scp, cp and rsync keep them: a
        // private file stays private.
        let want = if shared.config.preserve {
            f.meta.mode & SAFE_MODE_BITS
        } else {
            self.replaced_mode(&f)
                .unwrap_or(f.meta.mode & 0o777 & !shared.umask)
        };
        // The file keeps its bytes when its owner or attributes cannot be set; the failure is
        // reported.
        if let Some(a) = &f.attrs
            && let Err(e) =
                crate::attrs::apply(Target::Fd(&f.fd), a, &shared.config.attrs, &mut self.ids)
        {
            shared.entry_failed(&f.wire, &Error::io(display(), e));
        }
        if want != 0o600
            && let Err(e) = rustix::fs::fchmod(&f.fd, Mode::from_raw_mode(want))
        {
            shared.entry_failed(&f.wire, &Error::io(display(), e.into()));
            f.discard();
            return Ok(());
        }
        if shared.config.preserve {
            let times = timestamps((f.meta.mtime, f.meta.mtime_nsec), f.meta.atime);
            if let Err(e) = rustix::fs::futimens(&f.fd, &times) {
                shared.entry_failed(&f.wire, &Error::io(display(), e.into()));
                f.discard();
                return Ok(());
            }
        }
        if shared.config.fsync
            && let Err(e) = rustix::fs::fdatasync(&f.fd)
        {
            shared.entry_failed(&f.wire, &Error::io(display(), e.into()));
            f.discard();
            return Ok(());
        }
        match rename_into_place(&shared, &f.parent, &f.temp, &f.local, f.name(), &f.wire) {
            Ok(()) => {
                if !f.partial && f.size > crate::resume::PARTIAL_MIN {
                    remove_stale_partial(&f.parent, f.name());
                }
                shared.written.files.fetch_add(1, Relaxed);
                shared.written.bytes.fetch_add(bytes, Relaxed);
                shared.progress.add_done_file();
                if f.kept > 0 {
                    shared.progress.event(|| Event::Resumed {
                        path: f.wire.clone(),
                        kept: f.kept,
                    });
                }
                shared.progress.event(|| Event::Done {
                    path: f.wire.clone(),
                    bytes,
                    verified: true,
                });
                self.wrote_into(split_parent(&f.local).0, &f.parent);
            }
            Err(e) => {
                let e = match e {
                    Errno::ISDIR | Errno::NOTEMPTY | Errno::EXIST => Error::Unsupported {
                        path: display(),
                        reason: "a folder with entries is in the way (--delete replaces it); \
                                 file not copied"
                            .into(),
                    },
                    e => Error::io(display(), e.into()),
                };
                shared.entry_failed(&f.wire, &e);
                f.discard();
            }
        }
        Ok(())
    }

    /// The permission bits of the regular file `f` is about to replace, if there is one:
    /// not looked for in a folder this copy made.
    fn replaced_mode(&self, f: &OpenFile) -> Option<u32> {
        let parent = split_parent(&f.local).0;
        if !parent.is_empty() && self.shared.lock_dirs().created.contains(parent) {
            return None;
        }
        let st = rustix::fs::statat(&f.parent, f.name(), AtFlags::SYMLINK_NOFOLLOW).ok()?;
        (FileType::from_raw_mode(st.st_mode) == FileType::RegularFile).then_some(st.st_mode & 0o777)
    }

    /// The local path of the entry at `wire`, and its parent directory, opened beneath the
    /// root; `None`, the failure reported, when the parent cannot be had.
    fn parent_of(&mut self, wire: &[u8]) -> Option<(Vec<u8>, Arc<OwnedFd>)> {
        let local = self.shared.root.local(wire);
        match self.resolver.dir(split_parent(&local).0) {
            Ok(fd) => Some((local, fd)),
            Err(e) => {
                self.shared.entry_failed(wire, &e);
                None
            }
        }
    }

    fn dir(&mut self, wire: Bytes, meta: Meta, attrs: Option<Box<Attrs>>) {
        let shared = self.shared.clone();
        let Some((local, parent)) = self.parent_of(&wire) else {
            return;
        };
        let (parent_path, name) = split_parent(&local);
        self.wrote_into(parent_path, &parent);
        let preserve = shared.config.preserve;
        let mode = meta.mode & 0o777;
        let created_mode = (mode | 0o700) & !shared.umask;
        let mut dirs = shared.lock_dirs();
        let new = match rustix::fs::mkdirat(&parent, name, Mode::from_raw_mode(mode | 0o700)) {
            Ok(()) => {
                dirs.created.insert(local.clone());
                Some(created_mode)
            }
            Err(Errno::EXIST) => {
                match rustix::fs::statat(&parent, name, AtFlags::SYMLINK_NOFOLLOW) {
                    Ok(st) => match FileType::from_raw_mode(st.st_mode) {
                        FileType::Directory if dirs.created.contains(&local) => {
                            // Made private on demand for an earlier entry: it takes its
                            // mode now (writable by its owner until the end), so that a copy
                            // cut short does not leave it private.
                            let flags = OFlags::RDONLY
                                | OFlags::DIRECTORY
                                | OFlags::NOFOLLOW
                                | OFlags::CLOEXEC;
                            let set = rustix::fs::openat(&parent, name, flags, Mode::empty())
                                .and_then(|fd| {
                                    rustix::fs::fchmod(&fd, Mode::from_raw_mode(created_mode))
                                });
                            match set {
                                Ok(()) => Some(created_mode),
                                Err(_) => Some(0o700 & !shared.umask),
                            }
                        }
                        // Already there: left as it is.
                        FileType::Directory => None,
                        // A file or a link where the source has a folder: the folder takes
                        // its place, as rsync does (a link is removed, never followed); not
                        // the destination the user named.
                        _ if shared.root.rename_top.as_deref() != Some(&local[..]) => {
                            let made = rustix::fs::unlinkat(&parent, name, AtFlags::empty())
                                .and_then(|()| {
                                    rustix::fs::mkdirat(
                                        &parent,
                                        name,
                                        Mode::from_raw_mode(mode | 0o700),
                                    )
                                });
                            if let Err(e) = made {
                                drop(dirs);
                                return shared.entry_failed(
                                    &wire,
                                    &Error::io(shared.root.display(&local), e.into()),
                                );
                            }
                            dirs.created.insert(local.clone());
                            Some(created_mode)
                        }
                        FileType::Symlink => {
                            drop(dirs);
                            let e = Error::UnsafePath {
                                path: escape(shared.root.display(&local).as_os_str().as_bytes()),
                                reason: "is a symbolic link in the destination; not replaced \
                                         by the directory"
                                    .into(),
                            };
                            return shared.entry_failed(&wire, &e);
                        }
                        _ => {
                            drop(dirs);
                            let e = Error::Unsupported {
                                path: shared.root.display(&local),
                                reason: "exists and is not a directory".into(),
                            };
                            return shared.entry_failed(&wire, &e);
                        }
                    },
                    Err(e) => {
                        drop(dirs);
                        return shared.entry_failed(
                            &wire,
                            &Error::io(shared.root.display(&local), e.into()),
                        );
                    }
                }
            }
            Err(e) => {
                drop(dirs);
                return shared
                    .entry_failed(&wire, &Error::io(shared.root.display(&local), e.into()));
            }
        };
        // Modes and times are applied at the very end, deepest first: a read-only directory
        // must not block writing into it, and writing into it would change its mtime.
        // Kept until the end: copies, not slices of a receive buffer.
        let wire = crate::receive::kept(&wire);
        let attrs = attrs.as_deref().map(crate::receive::kept_attrs);
        let fixup = match (new, preserve) {
            (_, true) => Some(Fixup {
                existed: new.is_none(),
                local,
                wire,
                mode: Some(meta.mode & SAFE_MODE_BITS),
                mtime: Some((meta.mtime, meta.mtime_nsec)),
                atime: meta.atime,
                attrs,
            }),
            (Some(created), false) => {
                let want = mode & !shared.umask;
                (want != created || attrs.is_some()).then_some(Fixup {
                    existed: false,
                    local,
                    wire,
                    mode: Some(want),
                    mtime: None,
                    atime: None,
                    attrs,
                })
            }
            (None, false) => attrs.is_some().then_some(Fixup {
                existed: true,
                local,
                wire,
                mode: None,
                mtime: None,
                atime: None,
                attrs,
            }),
        };
        if let Some(fixup) = fixup {
            dirs.fixups.push(fixup);
        }
        drop(dirs);
        shared.written.dirs.fetch_add(1, Relaxed);
    }

    /// Whether `parent`/`name` is already a symbolic link to `target` with `times` (when
    /// kept) and the owner `attrs` ask for.
    fn same_link(
        &mut self,
        parent: &OwnedFd,
        name: &[u8],
        target: &[u8],
        times: Option<LinkTimes>,
        attrs: Option<&Attrs>,
    ) -> bool {
        let Ok(st) = rustix::fs::statat(parent, name, AtFlags::SYMLINK_NOFOLLOW) else {
            return false;
        };
        if FileType::from_raw_mode(st.st_mode) != FileType::Symlink {
            return false;
        }
        match rustix::fs::readlinkat(parent, name, Vec::new()) {
            Ok(have) if have.as_bytes() == target => {}
            _ => return false,
        }
        let config = &self.shared.config;
        let time_kept = match times.filter(|_| config.preserve) {
            Some(t) => (st.st_mtime, st.st_mtime_nsec as u32) == (t.mtime, t.mtime_nsec),
            None => true,
        };
        time_kept && attrs.is_none_or(|a| self.owner_in_line(a, st.st_uid, st.st_gid))
    }

    /// Whether an entry owned by `uid`:`gid` that keeps no extended attributes (a symbolic
    /// link, a named pipe, a socket, a device node: see [`Target::Link`]) has the owner and
    /// group `attrs` ask for.
    fn owner_in_line(&mut self, attrs: &Attrs, uid: u32, gid: u32) -> bool {
        let (want_uid, want_gid) = self.ids.wanted(attrs, &self.shared.config.attrs);
        want_uid.is_none_or(|u| u == uid) && want_gid.is_none_or(|g| g == gid)
    }

    /// Whether `parent`/`name` is already the named pipe, socket or device node `kind`
    /// (`rdev`) with the mode and times (when kept) and the owner `attrs` ask for.
    fn same_special(
        &mut self,
        parent: &OwnedFd,
        name: &[u8],
        file_type: FileType,
        rdev: u64,
        meta: &Meta,
        attrs: Option<&Attrs>,
    ) -> bool {
        let Ok(st) = rustix::fs::statat(parent, name, AtFlags::SYMLINK_NOFOLLOW) else {
            return false;
        };
        let config = &self.shared.config;
        let in_line = FileType::from_raw_mode(st.st_mode) == file_type
            && st.st_rdev == rdev
            && (!config.preserve
                || (st.st_mode & 0o7777 == meta.mode & SAFE_MODE_BITS
                    && (st.st_mtime, st.st_mtime_nsec as u32) == (meta.mtime, meta.mtime_nsec)));
        in_line && attrs.is_none_or(|a| self.owner_in_line(a, st.st_uid, st.st_gid))
    }

    fn symlink(
        &mut self,
        wire: Bytes,
        target: Bytes,
        times: Option<LinkTimes>,
        attrs: Option<Box<Attrs>>,
    ) {
        let shared = self.shared.clone();
        let Some((local, parent)) = self.parent_of(&wire) else {
            return;
        };
        let (parent_path, name) = split_parent(&local);
        // A rerun leaves a link that already says the same, with the time (`-p`) and owner
        // asked for, as it is, as rsync does: no new inode for a backup's snapshots to see.
        if shared.config.skip_unchanged
            && self.same_link(&parent, name, &target, times, attrs.as_deref())
        {
            return;
        }
        // Made under a temp name and renamed over whatever has the name: atomic replace.
        let temp = loop {
            let temp = temp_name(name);
            match rustix::fs::symlinkat(&target[..], &parent, &temp[..]) {
                Ok(()) => break temp,
                Err(Errno::EXIST) => continue,
                Err(e) => {
                    return shared
                        .entry_failed(&wire, &Error::io(shared.root.display(&local), e.into()));
                }
            }
        };
        // Its owner, then its own times (with -p), set before it takes its name: a rename
        // keeps them. A link whose owner cannot be set is still made; the failure is reported.
        if let Some(a) = &attrs {
            let target = Target::Link(&parent, &temp[..]);
            if let Err(e) = crate::attrs::apply(target, a, &shared.config.attrs, &mut self.ids) {
                shared.entry_failed(&wire, &Error::io(shared.root.display(&local), e));
            }
        }
        if let Some(t) = times.filter(|_| shared.config.preserve) {
            let stamps = timestamps((t.mtime, t.mtime_nsec), Some((t.atime, t.atime_nsec)));
            if let Err(e) =
                rustix::fs::utimensat(&parent, &temp[..], &stamps, AtFlags::SYMLINK_NOFOLLOW)
            {
                let _ = rustix::fs::unlinkat(&parent, &temp[..], AtFlags::empty());
                return shared
                    .entry_failed(&wire, &Error::io(shared.root.display(&local), e.into()));
            }
        }
        match rename_into_place(&shared, &parent, &temp, &local, name, &wire) {
            Ok(()) => {
                shared.written.symlinks.fetch_add(1, Relaxed);
                self.wrote_into(parent_path, &parent);
            }
            Err(e) => {
                let _ = rustix::fs::unlinkat(&parent, &temp[..], AtFlags::empty());
                let e = match e {
                    Errno::ISDIR | Errno::NOTEMPTY | Errno::EXIST => Error::Unsupported {
                        path: shared.root.display(&local),
                        reason: "a folder with entries is in the way (--delete replaces it); \
                                 symbolic link not copied"
                            .into(),
                    },
                    e => Error::io(shared.root.display(&local), e.into()),
                };
                shared.entry_failed(&wire, &e);
            }
        }
    }
}

impl Writer {
    /// Brings a file the quick check skipped in line with the sender's mode, times, owner
    /// and attributes, through its own descriptor (opened without following a link, and
    /// only if it is still the regular file of that size the check saw).
    fn refresh(
        &mut self,
        wire: Bytes,
        size: u64,
        mode: Option<u32>,
        mtime: Option<(i64, u32)>,
        attrs: Option<Box<Attrs>>,
    ) {
        let shared = self.shared.clone();
        let Some((local, parent)) = self.parent_of(&wire) else {
            return;
        };
        let name = split_parent(&local).1;
        let fail = |e: std::io::Error| {
            shared.entry_failed(&wire, &Error::io(shared.root.display(&local), e));
        };
        let flags = OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC;
        let fd = match rustix::fs::openat(&parent, name, flags, Mode::empty()) {
            Ok(fd) => fd,
            Err(e) => return fail(e.into()),
        };
        match rustix::fs::fstat(&fd) {
            Ok(st)
                if FileType::from_raw_mode(st.st_mode) == FileType::RegularFile
                    && st.st_size as u64 == size => {}
            Ok(_) => return, // replaced since the check: not ours to change
            Err(e) => return fail(e.into()),
        }
        if let Some(a) = &attrs
            && let Err(e) =
                crate::attrs::apply(Target::Fd(&fd), a, &shared.config.attrs, &mut self.ids)
        {
            fail(e);
        }
        if let Some(mode) = mode
            && let Err(e) = rustix::fs::fchmod(&fd, Mode::from_raw_mode(mode))
        {
            fail(e.into());
        }
        if let Some(mtime) = mtime
            && let Err(e) = rustix::fs::futimens(&fd, &timestamps(mtime, None))
        {
            fail(e.into());
        }
    }

    /// Makes a named pipe, socket or device node under a temp name, gives it its owner,
    /// mode and times there, and renames it over whatever has its name (never a directory).
    fn special(
        &mut self,
        wire: Bytes,
        kind: SpecialKind,
        rdev: u64,
        meta: Meta,
        attrs: Option<Box<Attrs>>,
    ) {
        let shared = self.shared.clone();
        let Some((local, parent)) = self.parent_of(&wire) else {
            return;
        };
        let (parent_path, name) = split_parent(&local);
        let fail = |e: Errno| {
            shared.entry_failed(&wire, &Error::io(shared.root.display(&local), e.into()));
        };
        let file_type = match kind {
            SpecialKind::Fifo => FileType::Fifo,
            SpecialKind::Socket => FileType::Socket,
            SpecialKind::CharDevice => FileType::CharacterDevice,
            SpecialKind::BlockDevice => FileType::BlockDevice,
        };
        // A rerun leaves one that is already in line as it is, as it leaves a link.
        if shared.config.skip_unchanged
            && self.same_special(&parent, name, file_type, rdev, &meta, attrs.as_deref())
        {
            return;
        }
        let temp = loop {
            let temp = temp_name(name);
            match rustix::fs::mknodat(
                &parent,
                &temp[..],
                file_type,
                Mode::from_raw_mode(0o600),
                rdev,
            ) {
                Ok(()) => break temp,
                Err(Errno::EXIST) => continue,
                Err(e) => return fail(e),
            }
        };
        let remove = || {
            let _ = rustix::fs::unlinkat(&parent, &temp[..], AtFlags::empty());
        };
        if let Some(a) = &attrs {
            let target = Target::Link(&parent, &temp[..]);
            if let Err(e) = crate::attrs::apply(target, a, &shared.config.attrs, &mut self.ids) {
                shared.entry_failed(&wire, &Error::io(shared.root.display(&local), e));
            }
        }
        let mode = if shared.config.preserve {
            meta.mode & SAFE_MODE_BITS
        } else {
            meta.mode & 0o777 & !shared.umask
        };
        // The temp name is ours and not a link: nothing is followed.
        if let Err(e) = rustix::fs::chmodat(
            &parent,
            &temp[..],
            Mode::from_raw_mode(mode),
            AtFlags::empty(),
        ) {
            remove();
            return fail(e);
        }
        if shared.config.preserve {
            let stamps = timestamps((meta.mtime, meta.mtime_nsec), meta.atime);
            if let Err(e) =
                rustix::fs::utimensat(&parent, &temp[..], &stamps, AtFlags::SYMLINK_NOFOLLOW)
            {
                remove();
                return fail(e);
            }
        }
        match rustix::fs::renameat(&parent, &temp[..], &parent, name) {
            Ok(()) => {
                shared.written.files.fetch_add(1, Relaxed);
                self.wrote_into(parent_path, &parent);
            }
            Err(Errno::ISDIR | Errno::NOTEMPTY | Errno::EXIST) => {
                remove();
                let e = Error::Unsupported {
                    path: shared.root.display(&local),
                    reason: "a directory is in the way; not copied".into(),
                };
                shared.entry_failed(&wire, &e);
            }
            Err(e) => {
                remove();
                fail(e);
            }
        }
    }
}

/// Whether `name` in `parent` is a regular file of `size` bytes with the time in `meta`: the
/// file a `Piece` belongs to, whole already, with the time `-p` gave it.
fn already_whole(parent: &OwnedFd, name: &[u8], size: u64, meta: &Meta) -> bool {
    rustix::fs::statat(parent, name, AtFlags::SYMLINK_NOFOLLOW).is_ok_and(|st| {
        FileType::from_raw_mode(st.st_mode) == FileType::RegularFile
            && st.st_size as u64 == size
            && (st.st_mtime, st.st_mtime_nsec as u32) == (meta.mtime, meta.mtime_nsec)
    })
}

/// Removes the partial file an earlier `--resume` copy kept for `name`, now that the file is
/// complete without it; not one that another live copy holds.
pub(crate) fn remove_stale_partial(parent: &OwnedFd, name: &[u8]) {
    crate::resume::remove_unheld_partial(parent, &crate::resume::partial_name(name));
}

/// Whether a directory that was there before the copy has, now, the mode and times its
/// fixup would set (and no attributes to set): a rerun then leaves it alone, with one
/// `fstatat` from its parent instead of opening it and setting both again.
fn already_set(resolver: &mut Resolver, f: &Fixup) -> bool {
    let (parent, name) = split_parent(&f.local);
    if !f.existed || f.attrs.is_some() || name.is_empty() {
        return false;
    }
    let Ok(parent) = resolver.dir(parent) else {
        return false;
    };
    let Ok(st) = rustix::fs::statat(&*parent, name, AtFlags::SYMLINK_NOFOLLOW) else {
        return false;
    };
    FileType::from_raw_mode(st.st_mode) == FileType::Directory
        && f.mode.is_none_or(|m| st.st_mode & 0o7777 == m)
        && f.mtime
            .is_none_or(|t| (st.st_mtime, st.st_mtime_nsec as u32) == t)
        && f.atime
            .is_none_or(|t| (st.st_atime, st.st_atime_nsec as u32) == t)
}

/// Fixups checked on one thread at least, when [`apply_fixups`] checks them on several.
const FIXUPS_PER_THREAD: usize = 256;

/// [`already_set`] for each of `fixups`, in order. A rerun finds nearly every folder as it
/// is to be, and each check is a stat that changes nothing, so they run on a few threads at
/// once, each over a run of neighbours (which share their parents' fds). A thread that
/// fails leaves its folders to be set.
fn all_already_set(shared: &Arc<Shared>, fixups: &[Fixup]) -> Vec<bool> {
    let threads = crate::probe::threads()
        .min(fixups.len() / FIXUPS_PER_THREAD)
        .max(1);
    let run = fixups.len().div_ceil(threads).max(1);
    std::thread::scope(|scope| {
        let checks: Vec<_> = fixups
            .chunks(run)
            .map(|part| {
                let checking = scope.spawn(move || {
                    let mut resolver = Resolver::new(shared.clone(), false);
                    part.iter()
                        .map(|f| already_set(&mut resolver, f))
                        .collect::<Vec<_>>()
                });
                (part.len(), checking)
            })
            .collect();
        checks
            .into_iter()
            .flat_map(|(n, checking)| checking.join().unwrap_or_else(|_| vec![false; n]))
            .collect()
    })
}

/// Applies directory modes and times, deepest first.
pub(crate) fn apply_fixups(shared: &Arc<Shared>, mut fixups: Vec<Fixup>) {
    fixups.sort_by_key(|f| std::cmp::Reverse(f.local.iter().filter(|&&b| b == b'/').count()));
    let set = all_already_set(shared, &fixups);
    let mut resolver = Resolver::new(shared.clone(), false);
    let mut ids = crate::attrs::Ids::default();
    for (f, set) in fixups.into_iter().zip(set) {
        if set {
            continue;
        }
        shared.progress.mirror_step();
        let fd = match resolver.dir(&f.local) {
            Ok(fd) => fd,
            Err(e) => {
                shared.entry_failed(&f.wire, &e);
                continue;
            }
        };
        let display = || shared.root.display(&f.local);
        if let Some(a) = &f.attrs
            && let Err(e) = crate::attrs::apply(Target::Fd(&fd), a, &shared.config.attrs, &mut ids)
        {
            shared.entry_failed(&f.wire, &Error::io(display(), e));
        }
        if let Some(mtime) = f.mtime {
            let times = timestamps(mtime, f.atime);
            if let Err(e) = rustix::fs::futimens(&*fd, &times) {
                shared.entry_failed(&f.wire, &Error::io(display(), e.into()));
            }
        }
        if let Some(mode) = f.mode
            && let Err(e) = rustix::fs::fchmod(&*fd, Mode::from_raw_mode(mode))
        {
            shared.entry_failed(&f.wire, &Error::io(display(), e.into()));
        }
    }
}

/// Reports a file's progress, unless it is complete ([`Event::Done`] follows then).
fn progressed(progress: &crate::Progress, f: &OpenFile) {
    if f.got < f.size {
        progress.event(|| Event::Progress {
            path: f.wire.clone(),
            done: f.got,
            size: f.size,
        });
    }
}

/// True when [start, end) overlaps a range in `ranges`.
fn overlaps(ranges: &BTreeMap<u64, u64>, start: u64, end: u64) -> bool {
    if let Some((_, &e)) = ranges.range(..=start).next_back()
        && e > start
    {
        return true;
    }
    if let Some((&s, _)) = ranges.range(start..).next()
        && s < end
    {
        return true;
    }
    false
}

/// Adds [start, end) to `ranges`, merging it with adjacent ranges.
fn insert_range(ranges: &mut BTreeMap<u64, u64>, mut start: u64, mut end: u64) {
    if let Some((&s, &e)) = ranges.range(..=start).next_back()
        && e == start
    {
        ranges.remove(&s);
        start = s;
    }
    if let Some(e) = ranges.remove(&end) {
        end = e;
    }
    ranges.insert(start, end);
}

/// The BLAKE3 hash of the first `size` bytes of a file.
fn read_back_hash(fd: &OwnedFd, size: u64, buf: &mut [u8]) -> std::io::Result<[u8; 32]> {
    let mut hasher = blake3::Hasher::new();
    let mut at = 0;
    while at < size {
        let n = ((size - at) as usize).min(buf.len());
        pread_exact(fd, &mut buf[..n], at)?;
        hasher.update(&buf[..n]);
        at += n as u64;
    }
    Ok(*hasher.finalize().as_bytes())
}

/// Writes `bytes` at `offset` of `f`, but for the [`HOLE_MIN`]-aligned blocks of zeros in it,
/// which stay holes: the file is given its full length first, so that they read back as
/// zeros wherever they are.
fn write_sparse(f: &mut OpenFile, bytes: &[u8], offset: u64) -> std::io::Result<()> {
    let block = HOLE_MIN as u64;
    // Block boundaries, in `bytes`, at multiples of the block size in the file.
    let first = ((block - offset % block) % block) as usize;
    let cuts = std::iter::once(0)
        .chain((first..bytes.len()).step_by(HOLE_MIN).filter(|&c| c > 0))
        .chain(std::iter::once(bytes.len()));
    let mut data: Option<usize> = None; // where the run of data to write began
    let mut last = 0;
    for cut in cuts {
        if cut == last {
            continue;
        }
        let piece = &bytes[last..cut];
        // A piece at either end of the chunk is part of a block: a hole there too, unless
        // the next chunk brings data to its block.
        if is_zero(piece) {
            if let Some(start) = data.take() {
                pwrite_all(&f.fd, &bytes[start..last], offset + start as u64)?;
            }
            if !f.sized {
                f.sized = true;
                rustix::fs::ftruncate(&f.fd, f.size)?;
            }
        } else {
            data.get_or_insert(last);
        }
        last = cut;
    }
    match data {
        Some(start) => pwrite_all(&f.fd, &bytes[start..], offset + start as u64),
        None => Ok(()),
    }
}

/// Why `[offset, end)` of `f` cannot be taken: it overlaps a range already in, or the file
/// has too many ranges out of order (a hostile sender's tiny chunks, out of order, would
/// grow its maps with what it sends: past the cap the file fails).
fn refused_range(f: &OpenFile, offset: u64, end: u64) -> Option<Error> {
    if f.written.len() >= MAX_PENDING_CHUNKS || f.checksum.pending() >= MAX_PENDING_CHUNKS {
        return Some(Error::Protocol(format!(
            "{}: more than {MAX_PENDING_CHUNKS} chunks out of order",
            escape(&f.wire)
        )));
    }
    overlaps(&f.written, offset, end).then(|| {
        Error::Protocol(format!(
            "{}: overlapping chunks at offset {offset}",
            escape(&f.wire)
        ))
    })
}

/// Makes `[start, end)` of `fd` read as zeros: a hole punched in it, or zeros written where
/// the file system cannot punch one.
fn zero_range(fd: &OwnedFd, start: u64, end: u64) -> std::io::Result<()> {
    use rustix::fs::FallocateFlags;
    let punch = FallocateFlags::PUNCH_HOLE | FallocateFlags::KEEP_SIZE;
    match rustix::fs::fallocate(fd, punch, start, end - start) {
        Ok(()) => return Ok(()),
        Err(Errno::OPNOTSUPP | Errno::NOSYS | Errno::INVAL) => {}
        Err(e) => return Err(e.into()),
    }
    let zeros = vec![0u8; ((end - start) as usize).min(READBACK)];
    let mut at = start;
    while at < end {
        let n = ((end - at) as usize).min(zeros.len());
        pwrite_all(fd, &zeros[..n], at)?;
        at += n as u64;
    }
    Ok(())
}

fn pwrite_all(fd: &OwnedFd, mut buf: &[u8], mut offset: u64) -> std::io::Result<()> {
    while !buf.is_empty() {
        match rustix::io::pwrite(fd, buf, offset) {
            Ok(0) => return Err(std::io::ErrorKind::WriteZero.into()),
            Ok(n) => {
                buf = &buf[n..];
                offset += n as u64;
            }
            Err(Errno::INTR) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

fn pread_exact(fd: &OwnedFd, mut buf: &mut [u8], mut offset: u64) -> std::io::Result<()> {
    while !buf.is_empty() {
        match rustix::io::pread(fd, &mut *buf, offset) {
            Ok(0) => return Err(std::io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => {
                buf = &mut buf[n..];
                offset += n as u64;
            }
            Err(Errno::INTR) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// A set of ids stored as ranges: tiny when ids complete roughly in order.
#[derive(Debug, Default)]
pub(crate) struct IdSet {
    /// First id to last id, both in the set (inclusive, so that `u64::MAX` fits).
    ranges: BTreeMap<u64, u64>,
}

impl IdSet {
    pub(crate) fn contains(&self, id: u64) -> bool {
        matches!(self.ranges.range(..=id).next_back(), Some((_, &last)) if last >= id)
    }

    pub(crate) fn insert(&mut self, id: u64) {
        if self.contains(id) {
            return;
        }
        let mut start = id;
        let mut last = id;
        if let Some((&s, &l)) = self.ranges.range(..id).next_back()
            && l + 1 == id
        {
            start = s;
        }
        if let Some(next) = id.checked_add(1)
            && let Some(l) = self.ranges.remove(&next)
        {
            last = l;
        }
        self.ranges.insert(start, last);
    }
}

/// The receiver's lock on the directory state, tolerant of poisoning.
pub(crate) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn id_set_merges() {
        let mut s = IdSet::default();
        for id in [0, 2, 1, 5, 4, 3, 10] {
            s.insert(id);
        }
        assert_eq!(s.ranges.len(), 2);
        assert!((0..=5).all(|i| s.contains(i)));
        assert!(!s.contains(6) && s.contains(10) && !s.contains(11));
    }

    /// The largest id a peer can send is a member like any other, and leaves the others be.
    #[test]
    fn id_set_holds_the_largest_id() {
        let mut s = IdSet::default();
        s.insert(0);
        s.insert(u64::MAX);
        assert!(s.contains(u64::MAX) && s.contains(0));
        assert!(!s.contains(1) && !s.contains(u64::MAX - 1));
        s.insert(u64::MAX - 1);
        assert!(s.contains(u64::MAX - 1) && s.contains(u64::MAX));
        assert_eq!(s.ranges.len(), 2);
    }

    #[test]
    fn overlap_detection() {
        let mut p = BTreeMap::new();
        p.insert(10, 20);
        p.insert(30, 40);
        assert!(!overlaps(&p, 0, 10));
        assert!(!overlaps(&p, 20, 30));
        assert!(overlaps(&p, 15, 16));
        assert!(overlaps(&p, 5, 11));
        assert!(overlaps(&p, 19, 31));
        assert!(overlaps(&p, 10, 20));
    }

    #[test]
    fn temp_names_are_recognised() {
        assert!(is_temp_name(&temp_name(b"report.pdf")));
        assert!(is_temp_name(b".a.fastcp-0123abcd"));
        for other in [
            &b".fastcp-0123abcd"[..],
            b"a.fastcp-0123abcd",
            b".a.fastcp-0123abcx",
            b".a.fastcp-123abcd",
        ] {
            assert!(!is_temp_name(other), "{}", String::from_utf8_lossy(other));
        }
    }

    #[test]
    fn temp_names_fit() {
        let t = temp_name(&[b'x'; 255]);
        assert!(t.len() <= 255);
        assert!(t.starts_with(b".x"));
        assert_ne!(temp_name(b"a"), temp_name(b"a"));
    }
}
