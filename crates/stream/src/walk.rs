//! Walking the sources: the manifest, streamed.

use std::ffi::OsString;
use std::fs::{self, Metadata};
use std::io;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Component, Path, PathBuf};

use bytes::Bytes;
use fastcp_proto::{MAX_DEPTH, MAX_PATH, Meta, SpecialKind};

use crate::Error;

/// What the error for a skipped named pipe, socket and device adds to name the option that
/// would copy it ([`Error::without_option_hint`] takes it out again).
pub(crate) const OPTION_HINTS: [&str; 3] = [
    "; --specials copies it",
    "; --specials copies its name",
    "; --devices copies it",
];

/// What to walk.
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub struct WalkConfig {
    /// Descend into directories (scp's `-r`). Without it a directory source is an error for
    /// that source and the others are still walked. Default: false.
    pub recursive: bool,
    /// Follow symbolic links and copy what they point to. Without it links inside a tree are
    /// copied as links, dangling and absolute ones included; a source named at the top is
    /// always followed, as scp and `cp -H` follow a link named on the command line (a dangling
    /// one is copied as the link it is). Default: false.
    pub follow_links: bool,
    /// Include and exclude rules; what they leave out is not walked (a directory left out is
    /// not descended into). Top-level sources are always walked. Default: none.
    pub filter: Option<std::sync::Arc<crate::Filter>>,
    /// Yield device nodes as [`EntryKind::Special`] (rsync's `--devices`) instead of an
    /// error for each. Default: false.
    pub devices: bool,
    /// Yield named pipes and sockets as [`EntryKind::Special`] (rsync's `--specials`)
    /// instead of an error for each. Default: false.
    pub specials: bool,
    /// Do not descend into a directory on another file system than its top-level source
    /// (rsync's `-x`, `--one-file-system`): such a directory, a mount point, is yielded
    /// empty, as rsync keeps it. A source named at the top is walked wherever it is.
    /// Default: false.
    pub one_file_system: bool,
}

impl WalkConfig {
    /// A config with `recursive` and `follow_links` as given.
    pub fn new(recursive: bool, follow_links: bool) -> WalkConfig {
        WalkConfig {
            recursive,
            follow_links,
            ..WalkConfig::default()
        }
    }
}

/// Bytes of entries a [`WalkAhead`] may hold before its thread waits for the send: most
/// trees whole (about 130,000 entries of ordinary names), whatever their names' length.
const AHEAD_BYTES: usize = 32 << 20;

/// Entries travel from the walk-ahead thread in batches of at most this many, or of about
/// [`AHEAD_BATCH_BYTES`].
const AHEAD_BATCH: usize = 1024;
const AHEAD_BATCH_BYTES: usize = 256 << 10;

/// A walk started longer ago than this when its send begins (a login that waited for a
/// password, say) is not taken: its entries' sizes and times would be that old for the
/// quick check. The send walks again.
const AHEAD_MAX_AGE: std::time::Duration = std::time::Duration::from_secs(10);

/// A walk of a send's sources, started before the send: on a thread of its own, it reads
/// the tree while the connection is being made, and the send that is given it (through
/// [`SendConfig::walk_ahead`](crate::SendConfig::walk_ahead)) takes its entries instead of
/// walking again. It holds at most about 32 MiB of entries, then waits for the send.
///
/// A send takes it only if its sources are the ones it was started with, its walk config
/// is the same (the filter the same `Arc`), and it begins within 10 seconds of the start;
/// otherwise it walks as it would without it, and the walk ahead stops. Only one send
/// takes it. Dropped untaken (its last clone), its thread stops at its next batch.
///
/// A walk that panics (in a filter predicate, say) ends with an error entry, as the send's
/// own walk does: a walk cut short never looks complete.
///
/// ```
/// use fastcp_stream::{SendConfig, WalkAhead};
///
/// let dir = tempfile::tempdir()?;
/// std::fs::write(dir.path().join("a.txt"), b"hello")?;
/// let sources = [dir.path().join("a.txt")];
/// let mut config = SendConfig::default();
/// // Walked now, while a connection is made; `fastcp_stream::send(&sources, ...)` with this
/// // config then takes what it found.
/// config.walk_ahead = Some(WalkAhead::start(&sources, &config.walk_config()));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone)]
pub struct WalkAhead {
    inner: std::sync::Arc<Ahead>,
}

/// The walk-ahead thread's batches of entries, each saying whether it is the last.
type Walked = std::sync::mpsc::Receiver<(Vec<Result<Entry, Error>>, bool)>;

/// The entries of a walk ahead's batches. A walk whose thread ended without its last batch
/// ends with an error entry: cut short, it must not look complete (a mirror would delete
/// what it did not reach).
fn entries(walked: Walked, path: PathBuf) -> impl Iterator<Item = Result<Entry, Error>> {
    let mut ended = false;
    std::iter::from_fn(move || {
        if ended {
            return None;
        }
        Some(match walked.recv() {
            Ok((batch, last)) => {
                ended = last;
                batch
            }
            Err(_) => {
                ended = true;
                vec![Err(Error::Io {
                    path: path.clone(),
                    source: io::Error::other("the walk stopped before its end"),
                })]
            }
        })
    })
    .flatten()
}

#[derive(Debug)]
struct Ahead {
    sources: Vec<PathBuf>,
    config: WalkConfig,
    started: std::time::Instant,
    walked: std::sync::Mutex<Option<Walked>>,
}

impl WalkAhead {
    /// Starts walking `sources` as `config` says, on a new thread (inside the current Tokio
    /// runtime's context if there is one: a filter predicate may use it).
    pub fn start(sources: &[PathBuf], config: &WalkConfig) -> WalkAhead {
        let (tx, rx) = std::sync::mpsc::sync_channel(AHEAD_BYTES / AHEAD_BATCH_BYTES);
        let mut walk = PanicsAsErrors::new(walk(sources, config), sources);
        let mut run = move || {
            loop {
                let mut batch = Vec::new();
                let mut bytes = 0;
                while batch.len() < AHEAD_BATCH && bytes < AHEAD_BATCH_BYTES {
                    let Some(item) = walk.next() else { break };
                    bytes += held_bytes(&item);
                    batch.push(item);
                }
                let last = batch.len() < AHEAD_BATCH && bytes < AHEAD_BATCH_BYTES;
                if tx.send((batch, last)).is_err() || last {
                    return;
                }
            }
        };
        // A thread of its own, not one of the runtime's blocking pool: a runtime dropped
        // while this walk waits for its send would otherwise wait for it.
        let runtime = tokio::runtime::Handle::try_current().ok();
        let spawned = std::thread::Builder::new()
            .name("fastcp-walk-ahead".into())
            .spawn(move || {
                let _entered = runtime.as_ref().map(|r| r.enter());
                run()
            })
            .is_ok();
        WalkAhead {
            inner: std::sync::Arc::new(Ahead {
                sources: sources.to_vec(),
                config: config.clone(),
                started: std::time::Instant::now(),
                // No thread (none could be made): no walk to take; the send walks itself.
                walked: std::sync::Mutex::new(spawned.then_some(rx)),
            }),
        }
    }

    /// The walk's entries, in walk order, if `sources` and `config` are what it was started
    /// with, it is recent, and no send took them before. Asked once: a walk not taken stops.
    pub(crate) fn take(
        &self,
        sources: &[PathBuf],
        config: &WalkConfig,
    ) -> Option<impl Iterator<Item = Result<Entry, Error>> + use<>> {
        let a = &self.inner;
        let walked = a.walked.lock().unwrap_or_else(|e| e.into_inner()).take()?;
        // Every field, so that a field added to WalkConfig cannot be missed here.
        let WalkConfig {
            recursive,
            follow_links,
            filter,
            devices,
            specials,
            one_file_system,
        } = config;
        let same_filter = match (&a.config.filter, filter) {
            (None, None) => true,
            (Some(x), Some(y)) => std::sync::Arc::ptr_eq(x, y),
            _ => false,
        };
        // As typed: `dir/` and `dir` are equal paths, but not the same sources.
        let same_sources = a.sources.len() == sources.len()
            && a.sources
                .iter()
                .zip(sources)
                .all(|(x, y)| x.as_os_str() == y.as_os_str());
        let same = same_sources
            && same_filter
            && (a.config.recursive, a.config.follow_links) == (*recursive, *follow_links)
            && (a.config.devices, a.config.specials) == (*devices, *specials)
            && a.config.one_file_system == *one_file_system
            && a.started.elapsed() <= AHEAD_MAX_AGE;
        let path = a.sources.first().cloned().unwrap_or_default();
        same.then(|| entries(walked, path))
    }
}

/// About the memory an entry (or an error) holds.
fn held_bytes(item: &Result<Entry, Error>) -> usize {
    std::mem::size_of::<Result<Entry, Error>>()
        + match item {
            Ok(e) => {
                let target = match &e.kind {
                    EntryKind::Symlink { target } => target.len(),
                    _ => 0,
                };
                e.path.as_os_str().len() + e.wire.len() + target
            }
            Err(_) => 256,
        }
}

/// A walk's items, with a panic (in the walk or a filter predicate) turned into one last
/// `Err` item: a walk cut short must not look complete, or a mirror would delete what it
/// did not reach.
pub(crate) struct PanicsAsErrors<I> {
    inner: Option<I>,
    path: PathBuf,
}

impl<I> PanicsAsErrors<I> {
    pub(crate) fn new(inner: I, sources: &[PathBuf]) -> PanicsAsErrors<I> {
        PanicsAsErrors {
            inner: Some(inner),
            path: sources.first().cloned().unwrap_or_default(),
        }
    }
}

impl<I: Iterator<Item = Result<Entry, Error>>> Iterator for PanicsAsErrors<I> {
    type Item = Result<Entry, Error>;

    fn next(&mut self) -> Option<Self::Item> {
        let inner = self.inner.as_mut()?;
        match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| inner.next())) {
            Ok(item) => item,
            Err(panic) => {
                self.inner = None;
                let what = crate::error::panic_message(&*panic);
                Some(Err(Error::Io {
                    path: self.path.clone(),
                    source: io::Error::other(format!("the walk stopped: it panicked: {what}")),
                }))
            }
        }
    }
}

/// One entry of the manifest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// Where it is on this machine.
    pub path: PathBuf,
    /// Its name on the wire: '/'-separated, relative, starting with the source's base name.
    pub wire: Bytes,
    /// What it is.
    pub kind: EntryKind,
    /// Permission bits and modification time, as the walk saw them.
    pub meta: Meta,
    /// For a regular file with more than one name: its (device, inode), which its other
    /// names share.
    pub inode: Option<(u64, u64)>,
    /// Its owner's user and group ids.
    pub owner: (u32, u32),
    /// A directory whose contents were not walked: a mount point beneath a source, with
    /// [`WalkConfig::one_file_system`].
    pub unentered: bool,
}

/// The kind of a manifest [`Entry`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EntryKind {
    /// A directory; its contents follow it.
    Dir,
    /// A regular file of this size (when walked; the sender re-reads it when it opens the
    /// file).
    File {
        /// Size in bytes.
        size: u64,
    },
    /// A symbolic link, kept as a link.
    Symlink {
        /// The link's target, as stored.
        target: Bytes,
    },
    /// A named pipe, socket or device node, with [`WalkConfig::specials`] or
    /// [`WalkConfig::devices`].
    Special {
        /// What it is.
        kind: SpecialKind,
        /// A device's number (`st_rdev`); 0 for pipes and sockets.
        rdev: u64,
    },
}

/// Walks `sources` depth first, each directory before its contents, names sorted within a
/// directory.
///
/// The walk is lazy and its memory is bounded by the depth of the tree and the size of the
/// directories on the current path, so it suits trees of millions of files. An entry that
/// cannot be read yields an `Err` and the walk goes on with the next one.
///
/// Each source's wire name is its base name: `a/b/` and `a/b` give `b`; `.` and `..` give the
/// name of the directory they stand for; `/` has no name and is an error.
///
/// ```
/// use fastcp_stream::{walk, EntryKind, WalkConfig};
///
/// let dir = tempfile::tempdir()?;
/// std::fs::create_dir(dir.path().join("src"))?;
/// std::fs::write(dir.path().join("src/a.txt"), b"hello")?;
///
/// let entries: Vec<_> = walk(&[dir.path().join("src")], &WalkConfig::new(true, false))
///     .collect::<Result<_, _>>()?;
/// assert_eq!(entries[0].wire, "src");
/// assert_eq!(entries[0].kind, EntryKind::Dir);
/// assert_eq!(entries[1].wire, "src/a.txt");
/// assert_eq!(entries[1].kind, EntryKind::File { size: 5 });
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn walk(sources: &[PathBuf], config: &WalkConfig) -> Walk {
    let sources: Vec<PathBuf> = sources.to_vec();
    Walk {
        config: config.clone(),
        sources: sources.into_iter(),
        stack: Vec::new(),
        pending: None,
        tops: Default::default(),
        unfound: config.filter.as_deref().and_then(crate::Unfound::of),
    }
}

/// The iterator [`walk`] returns.
#[derive(Debug)]
pub struct Walk {
    config: WalkConfig,
    sources: std::vec::IntoIter<PathBuf>,
    stack: Vec<Level>,
    pending: Option<Error>,
    /// The top-level names walked so far.
    tops: std::collections::HashSet<Vec<u8>>,
    /// With a `--files-from` list: the paths it lists that no source has shown yet; those
    /// left at the end are reported, each as not found (as rsync reports them).
    unfound: Option<crate::Unfound>,
}

/// One directory being listed.
#[derive(Debug)]
struct Level {
    dir: PathBuf,
    wire: Vec<u8>,
    /// The names, each with its metadata as the listing got it (from the directory's own
    /// handle, not followed), when it could.
    names: std::vec::IntoIter<(OsString, Option<Metadata>)>,
    /// (device, inode), to detect loops when following links.
    id: (u64, u64),
}

impl Iterator for Walk {
    type Item = Result<Entry, Error>;

    fn next(&mut self) -> Option<Self::Item> {
        if let Some(e) = self.pending.take() {
            return Some(Err(e));
        }
        loop {
            if let Some(level) = self.stack.last_mut() {
                match level.names.next() {
                    Some((name, listed)) => {
                        let path = level.dir.join(&name);
                        let mut wire = Vec::with_capacity(level.wire.len() + 1 + name.len());
                        wire.extend_from_slice(&level.wire);
                        wire.push(b'/');
                        wire.extend_from_slice(name.as_bytes());
                        match self.visit(path, wire, false, listed) {
                            Ok(None) => continue,
                            other => return other.transpose(),
                        }
                    }
                    None => {
                        self.stack.pop();
                        continue;
                    }
                }
            }
            let Some(source) = self.sources.next() else {
                return self.unfound.as_mut()?.pop_missing().map(|listed| {
                    Err(Error::Io {
                        path: PathBuf::from(OsString::from_vec(listed)),
                        source: io::Error::new(
                            io::ErrorKind::NotFound,
                            "listed by --files-from, but not in the source",
                        ),
                    })
                });
            };
            let named = top_name(&source).and_then(|name| self.first_of_its_name(&source, name));
            match named.and_then(|name| self.visit(source, name, true, None)) {
                Ok(None) => continue,
                other => return other.transpose(),
            }
        }
    }
}

impl Walk {
    /// `name`, unless an earlier source had it: two sources of one name would land in one
    /// place, and which one stayed would be down to chance (the streams' order). The first
    /// is copied and the later ones fail.
    fn first_of_its_name(&mut self, source: &Path, name: Vec<u8>) -> Result<Vec<u8>, Error> {
        if self.tops.insert(name.clone()) {
            return Ok(name);
        }
        Err(Error::Unsupported {
            path: source.to_path_buf(),
            reason: format!(
                "not copied: an earlier source has the same name ({}), and both would land \
                 in one place",
                crate::display::escape(&name)
            ),
        })
    }

    /// The entry at `path`, or `None` when the filter leaves it out. `listed` is its
    /// metadata from the directory listing, if any (looked up again otherwise).
    fn visit(
        &mut self,
        path: PathBuf,
        wire: Vec<u8>,
        top: bool,
        listed: Option<Metadata>,
    ) -> Result<Option<Entry>, Error> {
        let follow = self.config.follow_links || top;
        let lmeta = match listed {
            Some(m) => m,
            // Listed, then gone before its stat: a source that changed, as one gone before
            // its read is (a top-level source that is not there is not found).
            None => fs::symlink_metadata(&path).map_err(|e| {
                if top {
                    Error::io(&path, e)
                } else {
                    vanished_or(&path, e)
                }
            })?,
        };
        let meta = if follow && lmeta.file_type().is_symlink() {
            match fs::metadata(&path) {
                Ok(m) => m,
                // A dangling link cannot be followed: copy it as the link it is.
                Err(e) if e.kind() == io::ErrorKind::NotFound => lmeta,
                Err(e) => return Err(Error::io(&path, e)),
            }
        } else {
            lmeta
        };
        if wire.len() > MAX_PATH {
            return Err(Error::Unsupported {
                path,
                reason: format!("path longer than {MAX_PATH} bytes"),
            });
        }
        if wire.iter().filter(|&&b| b == b'/').count() >= MAX_DEPTH {
            return Err(Error::Unsupported {
                path,
                reason: format!("nested deeper than {MAX_DEPTH} levels"),
            });
        }
        let ft = meta.file_type();
        if !top && let Some(unfound) = &mut self.unfound {
            // Found, whether or not the rules keep it.
            unfound.came_to(&wire);
        }
        if !top
            && let Some(filter) = &self.config.filter
            && !filter.allows(&wire, ft.is_dir())
        {
            // What the rules leave out, the walk does not look into: the listed paths beneath
            // it are left out too, not missing.
            self.forget_listed_beneath(&wire);
            return Ok(None);
        }
        let kind = if ft.is_file() {
            EntryKind::File { size: meta.len() }
        } else if ft.is_dir() {
            if !self.config.recursive {
                // Nothing beneath it is looked for: the listed paths are not missing.
                self.forget_listed_beneath(&wire);
                return Err(Error::Unsupported {
                    path,
                    reason: "not a regular file (a directory: copy it with -r)".into(),
                });
            }
            let id = (meta.dev(), meta.ino());
            // The first level is the top-level source's.
            let elsewhere = self.stack.first().is_some_and(|l| l.id.0 != id.0);
            if self.config.one_file_system && elsewhere {
                // A mount point: kept, empty; the listed paths beneath it are not missing.
                self.forget_listed_beneath(&wire);
                return Ok(Some(Entry {
                    path,
                    wire: Bytes::from(wire),
                    kind: EntryKind::Dir,
                    meta: meta_of(&meta),
                    inode: None,
                    owner: (meta.uid(), meta.gid()),
                    unentered: true,
                }));
            }
            if self.stack.iter().any(|l| l.id == id) {
                return Err(Error::Unsupported {
                    path,
                    reason: "symbolic link loop: the directory contains itself".into(),
                });
            }
            match list(&path) {
                Ok(names) => self.stack.push(Level {
                    dir: path.clone(),
                    wire: wire.clone(),
                    names: names.into_iter(),
                    id,
                }),
                // Send the directory itself; its contents are lost and reported (and the
                // listed paths beneath it are not said to be missing from the source).
                Err(e) => {
                    self.forget_listed_beneath(&wire);
                    self.pending = Some(vanished_or(&path, e));
                }
            }
            EntryKind::Dir
        } else if ft.is_symlink() {
            let target = fs::read_link(&path).map_err(|e| vanished_or(&path, e))?;
            let target = target.into_os_string().into_vec();
            if target.len() > MAX_PATH {
                return Err(Error::Unsupported {
                    path,
                    reason: format!("symbolic link target longer than {MAX_PATH} bytes"),
                });
            }
            EntryKind::Symlink {
                target: Bytes::from(target),
            }
        } else if let Some(kind) = special_kind(&ft).filter(|k| {
            if k.is_device() {
                self.config.devices
            } else {
                self.config.specials
            }
        }) {
            EntryKind::Special {
                kind,
                rdev: if kind.is_device() { meta.rdev() } else { 0 },
            }
        } else {
            let what = if ft.is_fifo() {
                format!("a named pipe{}", OPTION_HINTS[0])
            } else if ft.is_socket() {
                format!("a socket{}", OPTION_HINTS[1])
            } else if ft.is_block_device() || ft.is_char_device() {
                format!("a device{}", OPTION_HINTS[2])
            } else {
                "of an unknown type".into()
            };
            return Err(Error::Unsupported {
                path,
                reason: format!("not a regular file ({what})"),
            });
        };
        let inode = (ft.is_file() && meta.nlink() > 1).then(|| (meta.dev(), meta.ino()));
        Ok(Some(Entry {
            path,
            wire: Bytes::from(wire),
            kind,
            meta: meta_of(&meta),
            inode,
            owner: (meta.uid(), meta.gid()),
            unentered: false,
        }))
    }
}

impl Walk {
    /// The paths of the `--files-from` list beneath `wire`, which the walk does not look
    /// into, are not reported missing.
    fn forget_listed_beneath(&mut self, wire: &[u8]) {
        if let Some(unfound) = &mut self.unfound {
            unfound.not_looked_into(wire);
        }
    }
}

/// What a file type is, when it is a pipe, socket or device.
fn special_kind(ft: &fs::FileType) -> Option<SpecialKind> {
    if ft.is_fifo() {
        Some(SpecialKind::Fifo)
    } else if ft.is_socket() {
        Some(SpecialKind::Socket)
    } else if ft.is_char_device() {
        Some(SpecialKind::CharDevice)
    } else if ft.is_block_device() {
        Some(SpecialKind::BlockDevice)
    } else {
        None
    }
}

/// The names in a directory, sorted by their bytes, each with its metadata (not followed)
/// when it could be had: looked up from the directory's own handle, which spares the kernel
/// a walk of the whole path for each.
fn list(dir: &Path) -> io::Result<Vec<(OsString, Option<Metadata>)>> {
    let mut names = Vec::new();
    for entry in fs::read_dir(dir)? {
        let entry = entry?;
        names.push((entry.file_name(), entry.metadata().ok()));
    }
    names.sort_unstable_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
    Ok(names)
}

/// The error for `path`, found by its stat and then gone (`e` not found) or unreadable.
pub(crate) fn vanished_or(path: &Path, e: io::Error) -> Error {
    match e.kind() {
        io::ErrorKind::NotFound => Error::SourceVanished {
            path: path.to_path_buf(),
        },
        _ => Error::io(path, e),
    }
}

/// Mode bits, mtime and atime of a file's metadata.
pub(crate) fn meta_of(m: &Metadata) -> Meta {
    Meta {
        mode: m.mode() & 0o7777,
        mtime: m.mtime(),
        mtime_nsec: m.mtime_nsec().clamp(0, 999_999_999) as u32,
        atime: Some((m.atime(), m.atime_nsec().clamp(0, 999_999_999) as u32)),
    }
}

/// The wire name of a top-level source: its base name.
fn top_name(source: &Path) -> Result<Vec<u8>, Error> {
    let last = source.components().next_back();
    let name = match last {
        Some(Component::Normal(name)) => name.to_os_string(),
        Some(Component::CurDir | Component::ParentDir) => {
            // `.`, `..`, `a/..`: the name of the directory they stand for.
            let canonical = fs::canonicalize(source).map_err(|e| Error::io(source, e))?;
            match canonical.file_name() {
                Some(n) => n.to_os_string(),
                None => return Err(no_name(source)),
            }
        }
        _ => return Err(no_name(source)),
    };
    Ok(name.into_vec())
}

fn no_name(source: &Path) -> Error {
    Error::Unsupported {
        path: source.to_path_buf(),
        reason: "has no name to copy it under (copy its contents instead)".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tree_deeper_than_the_protocol_allows_is_reported_not_sent() {
        let dir = tempfile::tempdir().unwrap();
        let deepest = (0..MAX_DEPTH).fold(dir.path().join("top"), |p, _| p.join("d"));
        fs::create_dir_all(&deepest).unwrap();
        fs::write(deepest.join("f"), b"too deep").unwrap();
        let items: Vec<_> =
            walk(&[dir.path().join("top")], &WalkConfig::new(true, false)).collect();
        let errors: Vec<String> = items
            .iter()
            .filter_map(|r| r.as_ref().err().map(|e| e.to_string()))
            .collect();
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert!(errors[0].contains("deeper than 1024"), "{errors:?}");
        // "top" and its 1023 nested directories: the 1024 levels the protocol carries.
        assert_eq!(items.len() - 1, MAX_DEPTH);
    }

    #[test]
    fn a_walk_ahead_is_taken_once_and_only_for_its_own_walk() {
        let dir = tempfile::tempdir().unwrap();
        let src = dir.path().join("src");
        fs::create_dir_all(src.join("sub")).unwrap();
        fs::write(src.join("a"), b"a").unwrap();
        fs::write(src.join("sub/b"), b"b").unwrap();
        let sources = [src.clone()];
        let config = WalkConfig::new(true, false);
        let mut filtered = config.clone();
        filtered.filter = Some(std::sync::Arc::new(crate::Filter::default()));
        let other_sources = [src.join("sub")];
        // `src/` follows `src` when it is a symbolic link: not the same walk as `src`.
        let mut slashed = src.clone().into_os_string();
        slashed.push("/");
        let slashed = [PathBuf::from(slashed)];
        let mismatches: [(&[PathBuf], &WalkConfig); 4] = [
            (&other_sources, &config),
            (&slashed, &config),
            (&sources, &WalkConfig::new(false, false)),
            (&sources, &filtered),
        ];
        for (i, (s, c)) in mismatches.into_iter().enumerate() {
            let ahead = WalkAhead::start(&sources, &config);
            assert!(ahead.take(s, c).is_none(), "mismatch {i} taken");
            // Not taken: the walk ahead stopped, and a later send walks for itself.
            assert!(ahead.take(&sources, &config).is_none(), "mismatch {i}");
        }

        let names = |items: Vec<Result<Entry, Error>>| -> Vec<Bytes> {
            items.into_iter().map(|e| e.unwrap().wire).collect()
        };
        let ahead = WalkAhead::start(&sources, &config);
        let taken = names(ahead.take(&sources, &config).unwrap().collect());
        assert_eq!(taken, names(walk(&sources, &config).collect()));
        assert_eq!(taken, ["src", "src/a", "src/sub", "src/sub/b"]);
        assert!(
            ahead.clone().take(&sources, &config).is_none(),
            "taken twice"
        );
    }

    /// An entry listed and then gone before its stat, or a folder or link gone after its
    /// stat, is a source that vanished (an exit code of its own), not an I/O failure; a
    /// top-level source that is not there is not found.
    #[test]
    fn an_entry_gone_between_its_listing_and_its_stat_vanished() {
        let dir = tempfile::tempdir().unwrap();
        let top = dir.path().join("top");
        fs::create_dir(&top).unwrap();
        let mut w = walk(std::slice::from_ref(&top), &WalkConfig::new(true, false));
        let gone = top.join("gone");
        let err = w
            .visit(gone.clone(), b"top/gone".to_vec(), false, None)
            .unwrap_err();
        assert!(
            matches!(err, Error::SourceVanished { ref path } if *path == gone),
            "{err}"
        );
        let err = w.visit(gone, b"gone".to_vec(), true, None).unwrap_err();
        assert!(matches!(err, Error::Io { .. }), "{err}");

        // A folder whose stat was taken, removed before it is listed: sent, its contents
        // reported as vanished.
        let sub = top.join("sub");
        fs::create_dir(&sub).unwrap();
        let listed = fs::symlink_metadata(&sub).unwrap();
        fs::remove_dir(&sub).unwrap();
        let entry = w.visit(sub.clone(), b"top/sub".to_vec(), false, Some(listed));
        assert!(matches!(
            entry,
            Ok(Some(Entry {
                kind: EntryKind::Dir,
                ..
            }))
        ));
        let pending = w.pending.take().unwrap();
        assert!(matches!(pending, Error::SourceVanished { .. }), "{pending}");

        // A symbolic link whose stat was taken, removed before its target is read.
        let link = top.join("link");
        std::os::unix::fs::symlink("t", &link).unwrap();
        let listed = fs::symlink_metadata(&link).unwrap();
        fs::remove_file(&link).unwrap();
        let err = w
            .visit(link, b"top/link".to_vec(), false, Some(listed))
            .unwrap_err();
        assert!(matches!(err, Error::SourceVanished { .. }), "{err}");
    }

    /// A walk ahead whose thread ended without its last batch ends with an error entry.
    #[test]
    fn a_walk_ahead_cut_short_ends_with_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("a");
        fs::write(&file, b"a").unwrap();
        let entry = walk(&[file], &WalkConfig::new(false, false))
            .next()
            .unwrap()
            .unwrap();
        let (tx, rx) = std::sync::mpsc::sync_channel(4);
        tx.send((vec![Ok(entry.clone())], false)).unwrap();
        drop(tx);
        let items: Vec<_> = entries(rx, PathBuf::from("src")).collect();
        assert_eq!(items.len(), 2, "{items:?}");
        assert!(items[0].is_ok());
        let err = items[1].as_ref().unwrap_err().to_string();
        assert!(err.contains("the walk stopped before its end"), "{err}");

        let (tx, rx) = std::sync::mpsc::sync_channel(4);
        tx.send((vec![Ok(entry)], true)).unwrap();
        drop(tx);
        let items: Vec<_> = entries(rx, PathBuf::from("src")).collect();
        assert!(items.len() == 1 && items[0].is_ok(), "{items:?}");
    }

    /// A walk whose filter predicate panics ends with an error entry, ahead or not.
    #[test]
    fn a_walk_that_panics_ends_with_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let src = dir.path().join("src");
        fs::create_dir_all(&src).unwrap();
        for name in ["a", "b", "c"] {
            fs::write(src.join(name), name).unwrap();
        }
        let sources = [src.clone()];
        let mut config = WalkConfig::new(true, false);
        let filter = crate::Filter::default().with_predicate(std::sync::Arc::new(|wire, _| {
            assert!(!wire.ends_with(b"/b"), "a predicate that panics");
            true
        }));
        config.filter = Some(std::sync::Arc::new(filter));
        let ahead = WalkAhead::start(&sources, &config);
        let by_hand: Vec<_> = PanicsAsErrors::new(walk(&sources, &config), &sources).collect();
        let taken: Vec<_> = ahead.take(&sources, &config).unwrap().collect();
        for items in [by_hand, taken] {
            let wires: Vec<_> = items
                .iter()
                .map(|i| {
                    i.as_ref()
                        .map(|e| e.wire.clone())
                        .map_err(|e| e.to_string())
                })
                .collect();
            assert_eq!(wires.len(), 3, "{wires:?}");
            assert_eq!(wires[0].as_ref().unwrap(), "src");
            assert_eq!(wires[1].as_ref().unwrap(), "src/a");
            let e = wires[2].as_ref().unwrap_err();
            assert!(e.contains("the walk stopped: it panicked"), "{e}");
        }
    }

    #[test]
    fn top_names() {
        assert_eq!(top_name(Path::new("a/b/")).unwrap(), b"b");
        assert_eq!(top_name(Path::new("a/b")).unwrap(), b"b");
        assert_eq!(top_name(Path::new("b")).unwrap(), b"b");
        assert!(top_name(Path::new("/")).is_err());
        let cwd = std::env::current_dir().unwrap();
        assert_eq!(
            top_name(Path::new(".")).unwrap(),
            cwd.file_name().unwrap().as_bytes()
        );
        assert_eq!(
            top_name(Path::new("..")).unwrap(),
            cwd.parent().unwrap().file_name().unwrap().as_bytes()
        );
    }
}
