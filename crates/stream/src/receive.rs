//! The receiving side: decode frames from every stream, check them, and hand the file system
//! work to a few blocking writer threads.
//!
//! One reader task per stream decodes frames and checks each against the session: paths are
//! validated and matched against what was asked for, file ids and byte counts are accounted
//! in a shared table, and anything out of place is a protocol error that ends the transfer.
//! File system work goes to [`crate::dest::Writer`] threads through bounded channels; all the
//! frames of one file go to the same writer, in order.
//!
//! # Why waiting for a file's entry cannot deadlock
//!
//! A `Data` or `FileEnd` frame may arrive on one stream before the `File` entry that
//! announces its id has been read from another; its reader then waits (and stops reading its
//! stream) until the entry is announced. This cannot deadlock:
//!
//! - the sender queues a file's entry before any of its chunks and its end, and each stream
//!   is a FIFO, so give every frame the time the sender queued it;
//! - a reader waits only for an entry queued *earlier* than the frame it holds, and only
//!   while that entry sits on another stream behind that stream's own current frame, which
//!   was therefore queued earlier still;
//! - so along any chain of waiting readers the queue times strictly decrease: no chain can
//!   close into a cycle, and the reader holding the earliest frame is never waiting;
//! - nothing else blocks a reader for good: writer threads and the byte budget drain on their
//!   own (disk I/O only), the quick-check threads that stream 0's reader hands probes to
//!   drain through the writers and the reply stream (which the sender always reads), and the
//!   sender's writer tasks drain every stream independently.
//!
//! If every other stream has ended and the entry still has not come, it never will: that is
//! a protocol error, not a wait.

use std::collections::{HashMap, HashSet};
use std::io;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use fastcp_proto::{Attrs, Decoder, ErrorFrame, FileEntry, Frame, Summary};
use rustix::fs::{Mode, OFlags};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, BufWriter};
use tokio::sync::{Notify, Semaphore, mpsc};
use tokio::task::JoinSet;

use crate::budget::Pool;
use crate::checksum::Algorithm;
use crate::dest::{self, DirState, IdSet, Op, Root, Writer, Written, lock};
use crate::event::{Event, SkipReason};
use crate::pipe::{ByteReader, Fill, ReadInto, Source};
use crate::probe::Probers;
use crate::report::{Failure, Report, Side};
use crate::{Error, Progress, display::escape, stream_error};

/// The default number of blocking writer threads.
pub const DEFAULT_WRITER_THREADS: usize = 2;

/// The default bound on received file bytes not yet written to disk.
pub const DEFAULT_RECEIVE_IN_FLIGHT: usize = 16 << 20;

/// Jobs queued per writer thread.
const WRITER_QUEUE: usize = 1024;

/// Each reader's buffer block: frames are cut from it without copying.
const READ_BLOCK: usize = 2 << 20;

/// A read asks for at least this much room.
const MIN_READ: usize = 64 << 10;

/// Frames at least this big (file chunks) start on a fresh block rather than be copied into
/// one when they do not fit in what is left of the current block.
pub(crate) const BIG_FRAME: usize = 256 << 10;

/// How long to try telling the sender why we stop.
const NOTICE_WAIT: Duration = Duration::from_secs(5);
/// How often the receiver tells the sender it is still at work, when it is (protocol
/// version 7): a sender that has sent everything hears nothing else until the `Done`.
const BUSY_EVERY: Duration = Duration::from_millis(250);

/// How to receive.
///
/// ```
/// use fastcp_stream::ReceiveConfig;
///
/// // A pull of `host:src` into `dst`: only "src" may arrive at the top level.
/// let config = ReceiveConfig {
///     recursive: true,
///     expected_top_level: Some(vec![b"src".to_vec()]),
///     ..ReceiveConfig::default()
/// };
/// assert!(!config.preserve);
/// ```
#[derive(Debug, Clone)]
pub struct ReceiveConfig {
    /// Apply the sender's exact mode bits and modification times (nanoseconds) to files and
    /// directories (scp's `-p`), and the access times and symlinks' own times when they
    /// travel (protocol version 2). Without it, new files and directories get the sender's
    /// permission bits less the umask, and existing directories are left alone. Default:
    /// false.
    pub preserve: bool,
    /// Accept directories (scp's `-r`). Without it a directory, or any path below the top
    /// level, is a protocol error. Default: false.
    pub recursive: bool,
    /// The destination must be an existing directory (the user gave several sources or a
    /// trailing '/'): otherwise fail before writing anything. Default: false.
    pub target_must_be_dir: bool,
    /// With `target_must_be_dir`: a destination that does not exist yet is made by the one
    /// top-level entry, which must then be a directory (a trailing '/' after one source's
    /// destination: `fastcp -r dir new/` makes `new` a copy of `dir`, as scp and `cp -r` do;
    /// a file sent there fails, as `cp file new/` does). Default: false.
    pub target_may_be_new_dir: bool,
    /// The one top-level entry is `dest` itself, even when `dest` is an existing directory:
    /// the source named a folder's contents (`DIR/.`), which go straight into `dest`, as
    /// `cp -r DIR/. DEST` copies them. Default: false.
    pub contents: bool,
    /// The only names accepted at the top level, or `None` for any. In a pull the client
    /// knows which names it asked for and refuses anything else (scp's CVE-2019-6111). A name
    /// with wildcards (`*.txt`) also accepts the names it matches, with the rules of
    /// [`expand_sources`](crate::expand_sources): `*` and `?` never match a leading `.`.
    /// Default: `None`.
    pub expected_top_level: Option<Vec<Vec<u8>>>,
    /// The largest frame payload accepted, as negotiated in the handshake. Default:
    /// [`fastcp_proto::DEFAULT_MAX_FRAME`].
    pub max_frame: u32,
    /// Blocking threads that write files. Default: [`DEFAULT_WRITER_THREADS`].
    pub writer_threads: usize,
    /// File bytes received and not yet written before the readers stop reading. Default:
    /// [`DEFAULT_RECEIVE_IN_FLIGHT`] (16 MiB).
    pub max_in_flight: usize,
    /// Flush each file's data to stable storage (`fdatasync`) before it takes its final name,
    /// and every directory an entry went into (`fsync`) before the transfer reports success,
    /// so that a copy that succeeded survives a crash or power loss. Slower, especially for
    /// many small files; for backups. Default: false.
    pub fsync: bool,
    /// The protocol version agreed with the sender, which picks the checksum a `FileEnd`
    /// carries: BLAKE3 below version 3, XXH3-128 from it (see [`whole_file_checksum`]).
    /// Default: [`fastcp_proto::PROTOCOL_VERSION`].
    ///
    /// [`whole_file_checksum`]: crate::whole_file_checksum
    pub version: u16,
    /// Answer the sender's quick-check probes (see
    /// [`SendConfig::skip_unchanged`](crate::SendConfig::skip_unchanged)): a file that is
    /// here already, as a regular file with the probe's size and modification time, is not
    /// sent. Without it a probe is a protocol error. Default: false.
    pub skip_unchanged: bool,
    /// With `skip_unchanged`: answer a probe with the content hash of a file of the same
    /// size, for the sender to compare (rsync's `--checksum`), instead of comparing times.
    /// Default: false.
    pub checksum: bool,
    /// Which hash `checksum` answers with: the sender must hash alike. Default:
    /// [`ContentHash::Xxh3`](crate::ContentHash::Xxh3).
    pub content_hash: crate::ContentHash,
    /// Mirror (rsync's `--delete`): once everything has arrived, remove from each directory
    /// the sender sent whatever it holds that the sender did not send, without following a
    /// symlink. Nothing is removed when the sender reported an error, since what it could
    /// not read would look missing. Default: false.
    pub delete: bool,
    /// With `delete`: remove at most this many entries (rsync's `--max-delete`; a directory
    /// counts with everything in it, and so does a folder cleared out of the way of a file or
    /// link). What the limit leaves is reported as one failure with
    /// [`ErrorCode::DeleteLimit`](fastcp_proto::ErrorCode::DeleteLimit); see
    /// [`DeleteBudget`](crate::DeleteBudget). Default: `None`, no limit.
    pub max_delete: Option<u64>,
    /// The sender's include and exclude rules: what they exclude is kept by `delete`, as
    /// rsync keeps excluded files. Default: none.
    pub filter: Option<Arc<crate::Filter>>,
    /// Accept `HardLink` entries (`-H`): once every file is in place, each becomes another
    /// name of the file it names. Without it such an entry is a protocol error. Default:
    /// false.
    pub hard_links: bool,
    /// With `skip_unchanged` (protocol version 4): continue partial files (`--resume`). A
    /// file bigger than 4 MiB is written to the fixed temp name `.NAME.fastcp-partial`, kept
    /// when the transfer stops before the file is complete, and a later probe for the file
    /// is answered with the hashes of the blocks it holds, so that the sender sends only the
    /// blocks that differ. Without it a `Keep` frame is a protocol error. Default: false.
    pub resume: bool,
    /// With `resume`, for a sender that cannot read its source to compare hashes (fastcp's
    /// SFTP pull, where reading the remote file is what resuming saves): each partial file
    /// keeps a record of the ranges that arrived, were checked and are on disk, tagged with
    /// the source's size and modification time, and a probe whose size and time match the
    /// tag is offered exactly the blocks the record holds, marked held rather than hashed.
    /// The sender keeps those without reading them. The record is saved, after an
    /// `fdatasync`, when the copy stops and, once the file has been open a quarter of a
    /// second, every 1/32 of the file (4 MiB at least); none is kept of a source modified
    /// less than 2 s ago, whose whole-second time could hide a rewrite. It lives in an
    /// extended attribute of the partial file (`user.fastcp.resume`), so where the file
    /// system has none the file is sent again whole. Default: false.
    pub resume_from_record: bool,
    /// Owners and extended attributes to set from the `Attrs` frame that precedes each entry
    /// (see [`KeepAttrs`](crate::KeepAttrs)). Without them an `Attrs` frame is a protocol
    /// error. Default: none.
    pub attrs: crate::KeepAttrs,
    /// Accept device nodes (`--devices`) and make them (only root can); without it a device
    /// entry is a protocol error. Default: false.
    pub devices: bool,
    /// Accept named pipes and sockets (`--specials`) and make them; without it such an
    /// entry is a protocol error. Default: false.
    pub specials: bool,
    /// The most manifest frames (entries, and quick-check probes, which count apart from the
    /// entry that may follow) a session may send. What the receiver remembers of each (the
    /// directories, links and, with `delete` or `hard_links`, every name) lives as long as
    /// the session, so a sender past this cap is stopped with a protocol error rather than
    /// left to exhaust memory. Default: [`DEFAULT_MAX_ENTRIES`].
    pub max_entries: u64,
    /// Hash each file's bytes to check them against the sender's checksum. Off (the sender
    /// configured alike, [`SendConfig::hash_content`](crate::SendConfig::hash_content), or
    /// a sender in this very process, such as fastcp's SFTP pull, whose `FileEnd` carries
    /// [`FileChecksum::ranges_only`](crate::FileChecksum::ranges_only)): each file is still
    /// checked to arrive whole, every range once and as sent, but no byte is hashed. That
    /// is for a channel that authenticates every byte end to end, from the sender's process
    /// to this one (fastcp's sealed TCP streams, a pipe in this process; not SSH, whose MAC
    /// ends at sshd). A receiver that `resume`s without
    /// `resume_from_record` hashes regardless, as its sender does. Default: true.
    pub hash_content: bool,
    /// With `skip_unchanged`, not `checksum` (rsync's `--link-dest`): a reference folder,
    /// such as the last night's backup. A file the destination does not hold alike, but the
    /// reference does (at the same path beneath it, a regular file with the probe's size and
    /// modification time, and with `preserve` its mode, with `attrs` its owner and group; not
    /// reached through a symlink), becomes another name of the reference's file, a hard link,
    /// instead of being sent. Where the link cannot be made (too many links, say), the file
    /// is sent. A linked file counts as skipped. The reference is taken as it mirrors the
    /// destination: for a destination that the one top-level folder makes (`src` copied as
    /// `new`), `new/x` is looked up as `x` beneath it. A relative path is taken from the
    /// destination (from `new`, which may not exist yet: `../old` is the folder `old` beside
    /// it). It must be a folder on the destination's file system. Default: `None`.
    pub link_dest: Option<PathBuf>,
    /// With `skip_unchanged`, not `checksum`: what else is left as it is (see
    /// [`SkipRules`]). Default: none.
    pub skip_rules: SkipRules,
}

/// Which files a receiver answering quick-check probes leaves as they are, beyond those it
/// holds alike: rsync's `--size-only`, `--ignore-existing` and `--update`. They apply to
/// regular files, the ones probed.
///
/// ```
/// use fastcp_stream::SkipRules;
///
/// let rules = SkipRules { existing: true, ..SkipRules::default() };
/// assert!(rules.any());
/// assert_eq!(SkipRules::from_flags(rules.flags()), rules);
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SkipRules {
    /// A regular file of the probe's size is unchanged, whatever its modification time
    /// (`--size-only`); it is still brought in line, as the quick check brings one.
    pub size_only: bool,
    /// Anything already at the file's path is left as it is, untouched, its mode and times
    /// included (`--ignore-existing`).
    pub existing: bool,
    /// Anything already at the file's path with a later modification time than the
    /// sender's is left as it is, untouched (`--update`). One of the same time is judged by
    /// the quick check.
    pub newer: bool,
}

impl SkipRules {
    /// Whether any rule is on.
    pub fn any(&self) -> bool {
        self.size_only || self.existing || self.newer
    }

    /// The request bits that carry these rules (protocol version 11).
    pub fn flags(&self) -> u32 {
        use fastcp_proto::flags;
        let mut f = 0;
        for (on, bit) in [
            (self.size_only, flags::SIZE_ONLY),
            (self.existing, flags::IGNORE_EXISTING),
            (self.newer, flags::UPDATE),
        ] {
            if on {
                f |= bit;
            }
        }
        f
    }

    /// The rules request bits `bits` carry.
    pub fn from_flags(bits: u32) -> SkipRules {
        use fastcp_proto::flags;
        SkipRules {
            size_only: bits & flags::SIZE_ONLY != 0,
            existing: bits & flags::IGNORE_EXISTING != 0,
            newer: bits & flags::UPDATE != 0,
        }
    }
}

/// The default [`ReceiveConfig::max_entries`]: 100 million.
pub const DEFAULT_MAX_ENTRIES: u64 = 100_000_000;

impl Default for ReceiveConfig {
    fn default() -> ReceiveConfig {
        ReceiveConfig {
            preserve: false,
            recursive: false,
            target_must_be_dir: false,
            target_may_be_new_dir: false,
            contents: false,
            expected_top_level: None,
            max_frame: fastcp_proto::DEFAULT_MAX_FRAME,
            writer_threads: DEFAULT_WRITER_THREADS,
            max_in_flight: DEFAULT_RECEIVE_IN_FLIGHT,
            fsync: false,
            version: fastcp_proto::PROTOCOL_VERSION,
            skip_unchanged: false,
            delete: false,
            max_delete: None,
            filter: None,
            hard_links: false,
            checksum: false,
            content_hash: crate::ContentHash::Xxh3,
            resume: false,
            resume_from_record: false,
            attrs: crate::KeepAttrs::default(),
            devices: false,
            specials: false,
            max_entries: DEFAULT_MAX_ENTRIES,
            hash_content: true,
            link_dest: None,
            skip_rules: SkipRules::default(),
        }
    }
}

/// The first fatal error, and a way to wait for one.
#[derive(Debug, Default)]
pub(crate) struct Abort {
    flag: AtomicBool,
    error: Mutex<Option<Error>>,
    notify: Notify,
}

impl Abort {
    pub(crate) fn trigger(&self, e: Error) {
        let mut g = lock(&self.error);
        if g.is_none() && !self.flag.load(Relaxed) {
            *g = Some(e);
        }
        self.flag.store(true, Relaxed);
        drop(g);
        self.notify.notify_waiters();
    }

    pub(crate) fn is_set(&self) -> bool {
        self.flag.load(Relaxed)
    }

    async fn wait(&self) {
        loop {
            let notified = self.notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.is_set() {
                return;
            }
            notified.await;
        }
    }

    fn take(&self) -> Option<Error> {
        lock(&self.error).take()
    }
}

/// A file announced by a `File` entry and not yet complete.
#[derive(Debug)]
struct Live {
    path: Bytes,
    size: u64,
    /// The bytes that come for it: all of the file, or a `Piece`'s range.
    start: u64,
    len: u64,
    seen: u64,
    end: bool,
    /// The entry has been handed to its writer; frames for it may follow.
    announced: bool,
    /// The sender gave up on it: its remaining frames are dropped.
    abandoned: bool,
}

/// A copy of a name cut from a receive block, for what outlives the frame: the slice itself
/// would keep the whole block (2 MiB or more, file data included) in memory.
pub(crate) fn kept(b: &[u8]) -> Bytes {
    Bytes::copy_from_slice(b)
}

/// [`kept`] for an entry's owner and extended attributes.
pub(crate) fn kept_attrs(a: &Attrs) -> Box<Attrs> {
    Box::new(Attrs {
        path: kept(&a.path),
        user: kept(&a.user),
        group: kept(&a.group),
        xattrs: a.xattrs.iter().map(|(n, v)| (kept(n), kept(v))).collect(),
        ..*a
    })
}

/// What the readers share about the session's files and names.
#[derive(Debug, Default)]
struct Table {
    /// Manifest frames checked so far (see [`ReceiveConfig::max_entries`]).
    entries: u64,
    live: HashMap<u64, Live>,
    /// Streams that have ended with the sender's `Done`. Kept under the same lock as the
    /// announcements: a stream waiting for a file's entry sees both in one state, so a stream
    /// that announces the file and then ends between two looks cannot be taken for one that
    /// never announced it.
    finished: usize,
    /// The files in `live` not abandoned, by (path, id): what a sender's `Error` for a path
    /// abandons is found without a scan of every file in flight, however many share a name.
    live_paths: std::collections::BTreeSet<(Bytes, u64)>,
    done: IdSet,
    /// The top-level name, when the destination is not a directory.
    top: Option<Bytes>,
    /// Wire paths of the symlinks sent in this session.
    symlinks: HashSet<Bytes>,
    /// Wire paths of the directories entries were sent as or into.
    dirs: HashSet<Bytes>,
    /// The parent of the last entry checked, whose prefixes are all in `dirs` and none a
    /// symlink: the next entry in the same directory skips those lookups. Cleared when a
    /// symlink is sent.
    checked_parent: Bytes,
    /// With `delete`: the wire path of every entry sent, and the directories sent.
    sent: HashSet<Bytes>,
    sent_dirs: Vec<Bytes>,
    /// With `delete`: the directories sent without their contents (mount points), whose
    /// extras are left alone.
    unentered: HashSet<Bytes>,
    /// With `hard_links`: the wire paths of the files sent (or probed), and the links to make
    /// at the end, (name, file).
    files: HashSet<Bytes>,
    links: Vec<(Bytes, Bytes)>,
    /// With `hard_links` and `skip_unchanged`: the wire paths of the files whose `File` entry
    /// came; the others of `files` the quick check skipped.
    sent_files: HashSet<Bytes>,
    /// Files the quick check skipped for certain (without `checksum`), and their bytes:
    /// counted, not named, so that a rerun over millions of files keeps no table of them.
    skipped: (u64, u64),
    /// Those of them named like a temp file: a sweep must leave them alone.
    skipped_temp_names: HashSet<Bytes>,
    /// With `checksum`: probes answered "skip" whose file has not come (yet), which only
    /// the sender's verdict settles: path -> size.
    maybe_skipped: HashMap<Bytes, u64>,
    /// With `checksum`: the refresh of each file probed with the same size, until its `File`
    /// entry comes (it was sent after all); see `Prober::refresh` in [`crate::probe`].
    refresh_later: HashMap<Bytes, Op>,
    /// With `resume`: the partial files offered to the sender, held (locked) until their
    /// `File` entry comes, with what was offered: path -> (file, offer).
    offers: HashMap<Bytes, (OwnedFd, crate::resume::Offer)>,
    /// With `checksum` and `resume`: the partial files offered for files the destination
    /// holds at the same size, which go if the sender skips them (the file is whole):
    /// path -> (folder, partial file's name).
    whole_partials: HashMap<Bytes, (Arc<OwnedFd>, Vec<u8>)>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Dir,
    File,
    Symlink,
}

/// State shared by the readers, the writers and the main task.
pub(crate) struct Shared {
    pub(crate) config: ReceiveConfig,
    pub(crate) root: Root,
    pub(crate) umask: u32,
    pub(crate) progress: Arc<Progress>,
    pub(crate) abort: Abort,
    pub(crate) written: Written,
    dirs: Mutex<DirState>,
    table: Mutex<Table>,
    announced: Notify,
    n_streams: usize,
    failures: Mutex<Report>,
    /// Receive blocks given back by the writers.
    pub(crate) pool: Pool,
    local_errors: std::sync::atomic::AtomicU64,
    /// Frames for the sender, a message of them at a time.
    pub(crate) replies: mpsc::Sender<Vec<Frame>>,
    /// When this transfer began: a temp file last written well before may be a killed
    /// copy's.
    pub(crate) started: std::time::SystemTime,
    /// How many directory fds each [`Resolver`](crate::dest::Resolver) keeps open.
    pub(crate) dir_cache: usize,
    /// With `link_dest`: the reference folder, opened.
    pub(crate) reference: Option<Arc<OwnedFd>>,
    /// With `delete`: what `max_delete` still lets go, shared by the folders a file or link
    /// takes the place of during the copy and the mirror after it.
    pub(crate) delete_budget: Mutex<crate::DeleteBudget>,
}

impl Shared {
    pub(crate) fn lock_dirs(&self) -> MutexGuard<'_, DirState> {
        lock(&self.dirs)
    }

    /// A probed file the destination holds: skipped for certain without `checksum`
    /// (counted, not named, but a temp-like name remembered for the sweep); with it,
    /// skipped unless its `File` entry comes after all (the checksums differed).
    /// `wire` is a copy of its own (not a slice of a receive block): it may be kept.
    pub(crate) fn probe_skipped(&self, wire: Bytes, size: u64) {
        let mut t = lock(&self.table);
        if self.config.checksum {
            t.maybe_skipped.insert(wire, size);
            return;
        }
        t.skipped.0 = t.skipped.0.saturating_add(1);
        t.skipped.1 = t.skipped.1.saturating_add(size);
        let name = wire.rsplit(|&b| b == b'/').next().unwrap_or_default();
        if dest::is_temp_name(name) {
            t.skipped_temp_names.insert(wire.clone());
        }
    }

    /// A hard link `name` (a wire path) found already in place, or made again to a file the
    /// quick check skipped: skipped, as an unchanged file is (no bytes travelled for it).
    pub(crate) fn link_skipped(&self, name: &Bytes) {
        use crate::{Event, SkipReason};
        let mut t = lock(&self.table);
        t.skipped.0 = t.skipped.0.saturating_add(1);
        drop(t);
        self.progress.add_skipped(0);
        self.progress.event(|| Event::Skipped {
            path: name.clone(),
            size: 0,
            reason: SkipReason::Unchanged,
        });
    }

    /// With `checksum`: the refresh of a probed file, made once the sender has skipped it
    /// (see [`refresh_skipped`]).
    pub(crate) fn refresh_later(&self, wire: Bytes, op: Op) {
        lock(&self.table).refresh_later.insert(wire, op);
    }

    /// With `resume`: holds the partial file offered for `wire`'s probe (a copy of its own),
    /// and what was offered from it, until its `File` entry comes.
    pub(crate) fn hold_offer(&self, wire: Bytes, fd: OwnedFd, offer: crate::resume::Offer) {
        lock(&self.table).offers.insert(wire, (fd, offer));
    }

    /// With `checksum` and `resume`: the partial file `name` in `dir`, offered for `wire`,
    /// whose file the destination holds at the same size; see [`drop_whole_partials`].
    pub(crate) fn hold_whole_partial(&self, wire: Bytes, dir: Arc<OwnedFd>, name: Vec<u8>) {
        lock(&self.table).whole_partials.insert(wire, (dir, name));
    }

    /// With `resume`: the partial file offered for `wire`'s probe, held, and what was
    /// offered from it.
    pub(crate) fn take_offer(&self, wire: &[u8]) -> Option<(OwnedFd, crate::resume::Offer)> {
        lock(&self.table).offers.remove(wire)
    }

    /// Whether the quick check skipped `wire` (its file was unchanged) in this transfer.
    /// Asked only of temp names (see [`dest::is_temp_name`]).
    pub(crate) fn was_skipped(&self, wire: &[u8]) -> bool {
        let t = lock(&self.table);
        t.skipped_temp_names.contains(wire) || t.maybe_skipped.contains_key(wire)
    }

    /// Records a failed entry and tells the sender; the transfer goes on.
    pub(crate) fn entry_failed(&self, wire: &[u8], e: &Error) {
        self.failed(ErrorFrame {
            code: e.code(),
            fatal: false,
            path: kept(wire),
            message: e.to_string(),
        });
    }

    /// Reports a failure of the mirror as a whole (no entry's), here and to the sender.
    /// Blocks while the reply queue is full.
    pub(crate) fn mirror_failed(&self, code: fastcp_proto::ErrorCode, message: String) {
        self.failed(ErrorFrame {
            code,
            fatal: false,
            path: Bytes::new(),
            message,
        });
    }

    fn failed(&self, frame: ErrorFrame) {
        let failure = Failure::from_frame(Side::Receiver, &frame);
        self.progress.event(|| Event::Failed(failure.clone()));
        lock(&self.failures).push_failure(failure);
        self.local_errors.fetch_add(1, Relaxed);
        // Fails only once the reply stream is gone, when nobody is listening any more.
        let _ = self.replies.blocking_send(vec![Frame::Error(frame)]);
    }

    /// Checks an entry's path against the session: safe, asked for, not through a symlink
    /// sent earlier.
    fn check_entry(&self, path: &Bytes, kind: Kind) -> Result<(), Error> {
        let first = check_sent_path(path, self.config.expected_top_level.as_deref())?;
        if !self.config.recursive && (kind == Kind::Dir || first.len() != path.len()) {
            return Err(Error::Protocol(format!(
                "{}: a directory entry, but the copy is not recursive",
                escape(path)
            )));
        }
        let mut t = lock(&self.table);
        t.entries += 1;
        if t.entries > self.config.max_entries {
            return Err(Error::Protocol(format!(
                "more than {} entries: the sender's tree is larger than this receiver accepts",
                self.config.max_entries
            )));
        }
        if self.root.top_must_be_dir && first.len() == path.len() && kind != Kind::Dir {
            // A trailing '/' asked for a folder, which no file makes.
            return Err(not_a_directory(&self.root.display(&self.root.local(first))));
        }
        if self.root.top_is_file && (kind == Kind::Dir || first.len() != path.len()) {
            // The folder, or an entry in it, whichever comes first: the copy stops at once.
            return Err(file_not_replaced(
                &self.root.display(&self.root.local(first)),
            ));
        }
        if self.root.rename_top.is_some() {
            match &t.top {
                None => t.top = Some(kept(first)),
                Some(top) if top[..] == *first => {}
                Some(top) => {
                    return Err(Error::Protocol(format!(
                        "a second top-level entry \"{}\" after \"{}\", but the destination {} \
                         is not a directory",
                        escape(first),
                        escape(top),
                        escape(self.root.display(b"").as_os_str().as_encoded_bytes()),
                    )));
                }
            }
        }
        let parent = &path[..path.iter().rposition(|&b| b == b'/').unwrap_or(0)];
        // Most entries come beside the one before: their prefixes were checked then.
        let same_parent = !parent.is_empty() && t.checked_parent[..] == *parent;
        if !same_parent && !t.symlinks.is_empty() {
            for (i, _) in path.iter().enumerate().filter(|&(_, &b)| b == b'/') {
                if t.symlinks.contains(&path[..i]) {
                    return Err(Error::unsafe_path(
                        path,
                        format!(
                            "goes through the symbolic link \"{}\" sent earlier",
                            escape(&path[..i])
                        ),
                    ));
                }
            }
        }
        match kind {
            Kind::Symlink => {
                if t.dirs.contains(path) {
                    return Err(Error::unsafe_path(
                        path,
                        "a symbolic link in place of a directory that entries were sent into",
                    ));
                }
                t.symlinks.insert(kept(path));
                t.checked_parent = Bytes::new();
            }
            Kind::Dir => {
                if t.symlinks.contains(path) {
                    return Err(Error::unsafe_path(
                        path,
                        "a directory in place of a symbolic link sent earlier",
                    ));
                }
                if !t.dirs.contains(path) {
                    t.dirs.insert(kept(path));
                }
            }
            Kind::File => {}
        }
        if self.config.delete {
            let path = kept(path);
            if t.sent.insert(path.clone()) && kind == Kind::Dir {
                t.sent_dirs.push(path);
            }
        }
        if same_parent {
            return Ok(());
        }
        // Remember every directory an entry goes into, for the whole session.
        let mut p = &path[..];
        while let Some(i) = p.iter().rposition(|&b| b == b'/') {
            p = &p[..i];
            if t.dirs.contains(p) {
                break;
            }
            t.dirs.insert(kept(p));
        }
        if !parent.is_empty() {
            t.checked_parent = kept(parent);
        }
        Ok(())
    }
}

/// One reader's handles.
struct Reader {
    shared: Arc<Shared>,
    writers: Vec<mpsc::Sender<Op>>,
    budget: Arc<Semaphore>,
    budget_cap: usize,
    checksum: Algorithm,
    stream: usize,
    counts: Summary,
    next_writer: usize,
    /// Answer quick-check probes (stream 0's reader only).
    probers: Option<Probers>,
    /// The owner and attributes for the next entry on this stream.
    attrs: Option<Box<Attrs>>,
}

/// What accounting said about a `Data` or `FileEnd` frame.
enum Accounted {
    /// Hand it to the file's writer; the file has this size.
    Forward(u64),
    /// The sender gave up on the file: drop it.
    Drop,
    /// The file's entry has not arrived yet.
    Wait,
}

impl Reader {
    fn writer(&self, id: u64) -> &mpsc::Sender<Op> {
        &self.writers[(id % self.writers.len() as u64) as usize]
    }

    async fn send(&self, to: &mpsc::Sender<Op>, op: Op) -> Result<(), Error> {
        to.send(op).await.map_err(|_| {
            // A writer stopped: the abort carries the reason.
            Error::Stream {
                stream: self.stream,
                source: io::Error::other("transfer aborted"),
            }
        })
    }

    /// The `Attrs` that came just before the entry for `path`, if any.
    fn attrs_for(&mut self, path: &[u8]) -> Result<Option<Box<Attrs>>, Error> {
        match self.attrs.take() {
            Some(a) if a.path != path => Err(Error::Protocol(format!(
                "stream {}: attributes for {} came before the entry for {}",
                self.stream,
                escape(&a.path),
                escape(path)
            ))),
            a => Ok(a),
        }
    }

    /// Handles one frame; returns the sender's totals at the stream's `Done`.
    /// A `File` entry, or a `Piece` (`Some((offset, len))`) of one: its writer creates it.
    async fn file(&mut self, f: FileEntry, piece: Option<(u64, u64)>) -> Result<(), Error> {
        let (start, len) = piece.unwrap_or((0, f.size));
        self.shared.check_entry(&f.path, Kind::File)?;
        let attrs = self.attrs_for(&f.path)?;
        self.counts.files += 1;
        if self.shared.config.skip_unchanged {
            let mut t = lock(&self.shared.table);
            t.maybe_skipped.remove(&f.path);
            t.refresh_later.remove(&f.path);
        }
        if self.shared.config.hard_links {
            let mut t = lock(&self.shared.table);
            t.files.insert(kept(&f.path));
            if self.shared.config.skip_unchanged {
                t.sent_files.insert(kept(&f.path));
            }
        }
        {
            let mut t = lock(&self.shared.table);
            if t.live.contains_key(&f.id) || t.done.contains(f.id) {
                return Err(Error::Protocol(format!(
                    "{}: file id {} is already in use",
                    escape(&f.path),
                    f.id
                )));
            }
            t.live_paths.insert((f.path.clone(), f.id));
            t.live.insert(
                f.id,
                Live {
                    path: f.path.clone(),
                    size: f.size,
                    start,
                    len,
                    seen: 0,
                    end: false,
                    announced: false,
                    abandoned: false,
                },
            );
        }
        let op = Op::Create {
            id: f.id,
            wire: f.path,
            size: f.size,
            meta: f.meta,
            attrs,
            piece,
        };
        self.send(self.writer(f.id), op).await?;
        {
            let mut t = lock(&self.shared.table);
            if let Some(l) = t.live.get_mut(&f.id) {
                l.announced = true;
            }
        }
        self.shared.announced.notify_waiters();
        Ok(())
    }

    async fn frame(&mut self, frame: Frame) -> Result<Option<Summary>, Error> {
        // Probes are handed on in batches, but never held behind another kind of frame.
        if let Some(probers) = &mut self.probers
            && !matches!(frame, Frame::Probe(_) | Frame::Attrs(_))
        {
            probers.flush().await?;
        }
        match frame {
            Frame::Attrs(a) if self.shared.config.attrs.any() => {
                if let Some(before) = &self.attrs {
                    return Err(Error::Protocol(format!(
                        "stream {}: attributes for {} with no entry after them",
                        self.stream,
                        escape(&before.path)
                    )));
                }
                self.attrs = Some(Box::new(a));
            }
            Frame::Dir(d) => {
                self.shared.check_entry(&d.path, Kind::Dir)?;
                let attrs = self.attrs_for(&d.path)?;
                self.counts.dirs += 1;
                let w = self.next_writer % self.writers.len();
                self.next_writer += 1;
                self.send(
                    &self.writers[w],
                    Op::Dir {
                        wire: d.path,
                        meta: d.meta,
                        attrs,
                    },
                )
                .await?;
            }
            Frame::Symlink(s) => {
                self.shared.check_entry(&s.path, Kind::Symlink)?;
                let attrs = self.attrs_for(&s.path)?;
                self.counts.symlinks += 1;
                let w = self.next_writer % self.writers.len();
                self.next_writer += 1;
                self.send(
                    &self.writers[w],
                    Op::Symlink {
                        wire: s.path,
                        target: s.target,
                        times: s.times,
                        attrs,
                    },
                )
                .await?;
            }
            Frame::Special(e)
                if (e.kind.is_device() && self.shared.config.devices)
                    || (!e.kind.is_device() && self.shared.config.specials) =>
            {
                self.shared.check_entry(&e.path, Kind::File)?;
                let attrs = self.attrs_for(&e.path)?;
                self.counts.files += 1;
                let w = self.next_writer % self.writers.len();
                self.next_writer += 1;
                let op = Op::Special {
                    wire: e.path,
                    kind: e.kind,
                    rdev: e.rdev,
                    meta: e.meta,
                    attrs,
                };
                self.send(&self.writers[w], op).await?;
            }
            Frame::File(f) => self.file(f, None).await?,
            Frame::Piece(p) if self.shared.config.version >= 6 => {
                self.file(p.file, Some((p.offset, p.len))).await?
            }
            Frame::Data(d) => {
                let len = d.bytes.len() as u64;
                self.counts.bytes += len;
                let Some(size) = self.accounted(d.id, Some((d.offset, len))).await? else {
                    return Ok(None);
                };
                // Hashed here, in parallel over the streams and in whatever order chunks
                // come; the writer only merges the values.
                let hash = self.checksum.chunk(size, d.offset, &d.bytes);
                let permit = if d.bytes.is_empty() {
                    None
                } else {
                    let n = d.bytes.len().min(self.budget_cap) as u32;
                    Some(
                        self.budget
                            .clone()
                            .acquire_many_owned(n)
                            .await
                            .map_err(|_| Error::Stream {
                                stream: self.stream,
                                source: io::Error::other("transfer aborted"),
                            })?,
                    )
                };
                let op = Op::Data {
                    id: d.id,
                    offset: d.offset,
                    bytes: d.bytes,
                    hash,
                    _permit: permit,
                };
                self.send(self.writer(d.id), op).await?;
            }
            // Both came with version 4 (resume needs its XXH3 checksum): from an older peer
            // they are unexpected frames.
            Frame::Keep(k) if self.shared.config.resume && self.shared.config.version >= 4 => {
                if self
                    .accounted(k.id, Some((k.offset, k.len)))
                    .await?
                    .is_none()
                {
                    return Ok(None);
                }
                let op = Op::Keep {
                    id: k.id,
                    offset: k.offset,
                    len: k.len,
                };
                self.send(self.writer(k.id), op).await?;
            }
            Frame::Unentered(u) if self.shared.config.version >= 11 => {
                check_sent_path(&u.path, self.shared.config.expected_top_level.as_deref())?;
                if self.shared.config.delete {
                    let mut t = lock(&self.shared.table);
                    if t.unentered.len() as u64 >= self.shared.config.max_entries {
                        return Err(Error::Protocol("too many Unentered frames".into()));
                    }
                    t.unentered.insert(kept(&u.path));
                }
            }
            Frame::Hole(h) if self.shared.config.version >= 8 => {
                if self
                    .accounted(h.id, Some((h.offset, h.len)))
                    .await?
                    .is_none()
                {
                    return Ok(None);
                }
                let op = Op::Hole {
                    id: h.id,
                    offset: h.offset,
                    len: h.len,
                };
                self.send(self.writer(h.id), op).await?;
            }
            Frame::FileEnd(e) => {
                if self.accounted(e.id, None).await?.is_none() {
                    return Ok(None);
                }
                let op = Op::End {
                    id: e.id,
                    hash: e.hash,
                };
                self.send(self.writer(e.id), op).await?;
            }
            Frame::Error(e) => {
                self.counts.errors += 1;
                if e.fatal {
                    return Err(Error::from_frame(&e));
                }
                let failure = Failure::from_frame(Side::Sender, &e);
                self.shared
                    .progress
                    .event(|| Event::Failed(failure.clone()));
                lock(&self.shared.failures).push_failure(failure);
                // A file the sender gave up on after announcing it: drop it.
                let abandoned = {
                    let mut t = lock(&self.shared.table);
                    // Nor was it skipped, if probed: it failed (and is not brought in line
                    // with a source that could not be read).
                    t.maybe_skipped.remove(&e.path);
                    t.refresh_later.remove(&e.path);
                    let path = Bytes::copy_from_slice(&e.path);
                    let id = t
                        .live_paths
                        .range((path.clone(), 0)..=(path.clone(), u64::MAX))
                        .map(|&(_, id)| id)
                        .find(|id| t.live.get(id).is_some_and(|l| l.announced));
                    if let Some(id) = id
                        && let Some(l) = t.live.get_mut(&id)
                    {
                        l.abandoned = true;
                        t.live_paths.remove(&(path, id));
                    }
                    id
                };
                if let Some(id) = abandoned {
                    self.send(self.writer(id), Op::Abandon { id }).await?;
                }
            }
            Frame::Totals(t) => self.shared.progress.set_totals(t.files, t.bytes),
            Frame::HardLink(h) if self.shared.config.hard_links => {
                self.shared.check_entry(&h.path, Kind::File)?;
                fastcp_proto::path::validate(&h.target)
                    .map_err(|e| Error::unsafe_path(&h.target, e.to_string()))?;
                self.counts.files += 1;
                // Made once every file is in place: its file may still be on its way.
                lock(&self.shared.table)
                    .links
                    .push((kept(&h.path), kept(&h.target)));
            }
            Frame::Probe(p)
                if self.shared.config.skip_unchanged
                    && self.shared.config.version >= 4
                    && self.stream == 0 =>
            {
                self.shared.check_entry(&p.path, Kind::File)?;
                let attrs = self.attrs_for(&p.path)?;
                if self.shared.config.hard_links {
                    lock(&self.shared.table).files.insert(kept(&p.path));
                }
                let probers = self
                    .probers
                    .get_or_insert_with(|| Probers::start(&self.shared, &self.writers));
                probers.probe(p, attrs).await?;
            }
            Frame::Done(summary) => {
                if let Some(a) = &self.attrs {
                    return Err(Error::Protocol(format!(
                        "stream {}: attributes for {} with no entry after them",
                        self.stream,
                        escape(&a.path)
                    )));
                }
                if summary != self.counts {
                    return Err(Error::Protocol(format!(
                        "stream {}: the sender's totals ({}) do not match what arrived ({})",
                        self.stream,
                        totals(&summary),
                        totals(&self.counts)
                    )));
                }
                return Ok(Some(summary));
            }
            other => {
                return Err(Error::Protocol(format!(
                    "unexpected {} frame on stream {}",
                    other.name(),
                    self.stream
                )));
            }
        }
        Ok(None)
    }

    /// [`account`](Self::account), waiting for the file's entry if it has not come yet: the
    /// file's size when the frame goes to its writer, `None` when it is dropped.
    async fn accounted(&self, id: u64, chunk: Option<(u64, u64)>) -> Result<Option<u64>, Error> {
        loop {
            match self.account(id, chunk)? {
                Accounted::Forward(size) => return Ok(Some(size)),
                Accounted::Drop => return Ok(None),
                Accounted::Wait => self.wait_announced(id).await?,
            }
        }
    }

    /// Accounts a chunk (`Some((offset, len))`) or a file's end (`None`) against its file.
    fn account(&self, id: u64, chunk: Option<(u64, u64)>) -> Result<Accounted, Error> {
        let mut t = lock(&self.shared.table);
        let Some(l) = t.live.get_mut(&id) else {
            if t.done.contains(id) {
                return Err(Error::Protocol(format!(
                    "{} for file id {id} after the file was complete",
                    if chunk.is_some() {
                        "data"
                    } else {
                        "a second end"
                    }
                )));
            }
            return Ok(Accounted::Wait);
        };
        if !l.announced {
            return Ok(Accounted::Wait);
        }
        match chunk {
            Some((offset, len)) => {
                if offset.saturating_add(len) > l.size {
                    return Err(Error::Protocol(format!(
                        "{}: data past the end of the file ({} bytes at offset {offset}, size {})",
                        escape(&l.path),
                        len,
                        l.size
                    )));
                }
                if offset < l.start || offset + len > l.start + l.len {
                    return Err(Error::Protocol(format!(
                        "{}: data outside the piece sent ({} bytes at offset {offset}, piece of \
                         {} bytes at offset {})",
                        escape(&l.path),
                        len,
                        l.len,
                        l.start
                    )));
                }
                l.seen += len;
                if l.seen > l.len {
                    return Err(Error::Protocol(format!(
                        "{}: more data than the file's size of {} (repeated or overlapping \
                         chunks)",
                        escape(&l.path),
                        l.len
                    )));
                }
            }
            None => {
                if l.end {
                    return Err(Error::Protocol(format!(
                        "{}: a second end for the file",
                        escape(&l.path)
                    )));
                }
                l.end = true;
            }
        }
        let out = if l.abandoned {
            Accounted::Drop
        } else {
            Accounted::Forward(l.size)
        };
        self.complete_if_done(&mut t, id);
        Ok(out)
    }

    fn complete_if_done(&self, t: &mut Table, id: u64) {
        if let Some(l) = t.live.get(&id)
            && l.seen == l.len
            && l.end
        {
            if let Some(l) = t.live.remove(&id) {
                t.live_paths.remove(&(l.path, id));
            }
            t.done.insert(id);
        }
    }

    /// This stream has ended with the sender's `done`.
    fn finish(&self, done: Summary) -> Summary {
        lock(&self.shared.table).finished += 1;
        self.shared.announced.notify_waiters();
        done
    }

    /// Waits until file `id` is announced on some stream; an error when it never can be.
    async fn wait_announced(&self, id: u64) -> Result<(), Error> {
        let shared = &self.shared;
        loop {
            let notified = shared.announced.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            match announcement(&lock(&shared.table), id, shared.n_streams) {
                Announcement::Made => return Ok(()),
                Announcement::Pending => {}
                Announcement::Never => {
                    return Err(Error::Protocol(format!(
                        "stream {}: data for file id {id}, which no stream announced",
                        self.stream
                    )));
                }
            }
            notified.await;
        }
    }
}

/// Where a file's entry stands, for a stream holding data for it.
#[derive(Debug, PartialEq, Eq)]
enum Announcement {
    Made,
    /// Not yet: another stream may still bring it.
    Pending,
    /// Every other stream has ended without it.
    Never,
}

/// Judged on one state of the table, announcements and ended streams together.
fn announcement(t: &Table, id: u64, n_streams: usize) -> Announcement {
    if t.live.get(&id).is_some_and(|l| l.announced) || t.done.contains(id) {
        Announcement::Made
    } else if t.finished + 1 >= n_streams {
        Announcement::Never
    } else {
        Announcement::Pending
    }
}

fn totals(s: &Summary) -> String {
    format!(
        "{} files, {} dirs, {} symlinks, {} bytes, {} errors",
        s.files, s.dirs, s.symlinks, s.bytes, s.errors
    )
}

/// Reads and handles one stream's frames until its `Done`.
///
/// A failure is recorded as the transfer's error before this returns, while the reader still
/// holds its senders to the writers: a writer that saw its channel close first would otherwise
/// report the files it was left with as a protocol violation instead of the real cause (a cut
/// connection, say).
/// Returns `None` when the stream failed; the error is then in `shared.abort`.
async fn read_stream<C: Source>(r: C, reader: Reader) -> Option<Summary> {
    let shared = reader.shared.clone();
    let writers = reader.writers.clone();
    let result = read_frames(r, reader).await;
    let summary = match result {
        Ok(summary) => Some(summary),
        Err(e) => {
            shared.abort.trigger(e);
            None
        }
    };
    drop(writers);
    summary
}

async fn read_frames<C: Source>(mut r: C, mut reader: Reader) -> Result<Summary, Error> {
    let i = reader.stream;
    let mut decoder = Decoder::new(reader.shared.config.max_frame);
    let mut buf = BytesMut::new();
    // The length of the last big frame seen: a guess at the next one's.
    let mut big = 0;
    loop {
        while let Some(frame) = decoder
            .decode(&mut buf)
            .map_err(|source| Error::Decode { stream: i, source })?
        {
            if let Some(done) = reader.frame(frame).await? {
                return Ok(reader.finish(done));
            }
        }
        // `buf` now holds the start of a frame at most. Room for the whole of it (its length
        // is checked against the cap before anything is allocated for it), or, between
        // frames, for one as big as the last big one; at least a good read.
        let (frame_len, frame_left) = pending_frame(&buf, &decoder);
        if frame_len >= BIG_FRAME {
            big = frame_len;
        }
        // A reader of whole records asks for room for one; in the middle of a frame, room
        // for the rest of it is what counts (its records end where it does).
        let want = if buf.is_empty() {
            big.max(r.room())
        } else {
            frame_left
        };
        ensure_room(&mut buf, want.max(MIN_READ), &reader.shared.pool);
        // A read that ran past the end of a big frame into a block without room for the
        // next one would have the next one's start copied into a fresh block: stop at the
        // frame's end instead, and the next frame starts on a fresh block, uncopied.
        let limit = if frame_len >= BIG_FRAME && buf.capacity() - buf.len() - frame_left < big {
            frame_left
        } else {
            usize::MAX
        };
        let fill = r.fill(&mut buf, limit, &decoder, &reader.shared.pool);
        // The probes decoded so far go to their threads if this waits for more.
        let filled = match &mut reader.probers {
            Some(probers) => probers.while_waiting(fill).await?,
            None => fill.await,
        };
        let n = match filled.map_err(|e| stream_error(i, e, "while receiving"))? {
            Fill::Read(n) => n,
            Fill::Frame(frame) => match reader.frame(frame).await? {
                Some(done) => return Ok(reader.finish(done)),
                None => continue,
            },
        };
        if n == 0 {
            return Err(Error::ConnectionClosed {
                stream: i,
                during: if buf.is_empty() {
                    "before the end of the transfer"
                } else {
                    "in the middle of a frame"
                },
            });
        }
    }
}

/// The total length of the frame `buf` starts with and how many of its bytes are still to
/// come: (0, 0) when its header is not all there yet (or is over the cap, which the decoder
/// refuses).
fn pending_frame(buf: &[u8], decoder: &Decoder) -> (usize, usize) {
    match buf.get(..fastcp_proto::HEADER_LEN) {
        Some(h) => {
            let len = u32::from_be_bytes([h[1], h[2], h[3], h[4]]);
            if len <= decoder.max_frame() {
                let total = fastcp_proto::HEADER_LEN + len as usize;
                (total, total.saturating_sub(buf.len()))
            } else {
                (0, 0)
            }
        }
        None => (0, 0),
    }
}

/// Makes room for `want` more bytes in `buf`, moving what it holds into a recycled block when
/// its own block is full (frames cut from it may still be in flight).
pub(crate) fn ensure_room(buf: &mut BytesMut, want: usize, pool: &Pool) {
    if buf.capacity() - buf.len() >= want {
        return;
    }
    let need = buf.len() + want;
    let mut block = match Bytes::from(pool.take(need.max(READ_BLOCK))).try_into_mut() {
        Ok(b) => b,
        Err(_) => BytesMut::with_capacity(need.max(READ_BLOCK)),
    };
    block.extend_from_slice(buf);
    *buf = block;
}

/// Sends the sender a `Busy` frame every [`BUSY_EVERY`] in which this side got on (wrote,
/// checked, removed, listed), so that a sender that has sent everything and waits for the
/// `Done` (while the last files are written, extras removed, links made, folder times set)
/// does not take the wait for a stall. A receiver that got nowhere (a hung disk) says
/// nothing, and the sender's stall limit ends the copy. Runs until aborted.
async fn tell_busy(progress: Arc<Progress>, replies: mpsc::Sender<Vec<Frame>>) {
    // Bytes that crossed the streams are not work done here: a `Busy` frame is such bytes.
    let work = || crate::progress::Snapshot {
        wire_bytes: 0,
        ..progress.snapshot()
    };
    let mut last = work();
    loop {
        tokio::time::sleep(BUSY_EVERY).await;
        let now = work();
        if now != last {
            last = now;
            if replies.send(vec![Frame::Busy]).await.is_err() {
                return;
            }
        }
    }
}

/// Writes replies to the sender on stream 0 until the final `Done` or a fatal error.
async fn write_replies<W: AsyncWrite + Unpin>(
    w: W,
    mut rx: mpsc::Receiver<Vec<Frame>>,
) -> Result<W, Error> {
    let mut w = BufWriter::new(w);
    let fail = |e| stream_error(0, e, "while sending replies");
    let mut buf = BytesMut::new();
    'messages: loop {
        let frames = match rx.try_recv() {
            Ok(f) => f,
            Err(mpsc::error::TryRecvError::Empty) => {
                w.flush().await.map_err(fail)?;
                match rx.recv().await {
                    Some(f) => f,
                    None => break,
                }
            }
            Err(mpsc::error::TryRecvError::Disconnected) => break,
        };
        for frame in frames {
            buf.clear();
            fastcp_proto::encode(&frame, &mut buf);
            w.write_all(&buf).await.map_err(fail)?;
            let last =
                matches!(&frame, Frame::Done(_)) || matches!(&frame, Frame::Error(e) if e.fatal);
            if last {
                break 'messages;
            }
        }
    }
    w.flush().await.map_err(fail)?;
    Ok(w.into_inner())
}

/// A path a sender sent: safe, and at the top level one of the names asked for (`expected`,
/// wildcards matching, or any when `None`; scp's CVE-2019-6111). Returns its first component.
pub(crate) fn check_sent_path<'a>(
    path: &'a [u8],
    expected: Option<&[Vec<u8>]>,
) -> Result<&'a [u8], Error> {
    fastcp_proto::path::validate(path).map_err(|e| Error::unsafe_path(path, e.to_string()))?;
    let first = path.split(|&b| b == b'/').next().unwrap_or_default();
    if let Some(expected) = expected
        && !expected
            .iter()
            .any(|n| crate::pattern::name_matches(n, first))
    {
        return Err(Error::unsafe_path(
            path,
            format!("\"{}\" was not requested", escape(first)),
        ));
    }
    Ok(first)
}

/// Checks `dest` as a receive into it with `config` would check it before anything is
/// written, and fails with the same error: for a dry run, which writes nothing. `top_is_dir`
/// says whether the single top-level entry to come is a folder, which a destination named
/// with a trailing '/' that does not exist yet needs
/// ([`ReceiveConfig::target_may_be_new_dir`]).
pub fn check_destination(
    dest: &Path,
    config: &ReceiveConfig,
    top_is_dir: bool,
) -> Result<(), Error> {
    let root = open_destination(dest, config)?;
    if root.top_must_be_dir && root.rename_top.is_some() && !top_is_dir {
        return Err(not_a_directory(&root.display(&root.local(b""))));
    }
    if root.top_is_file && top_is_dir {
        return Err(file_not_replaced(&root.display(&root.local(b""))));
    }
    if let Some(reference) = &config.link_dest {
        root.open_reference(reference)?;
    }
    Ok(())
}

/// Opens the destination: the directory entries go into, and the name the single top-level
/// entry takes when `dest` is not a directory.
fn open_destination(dest: &Path, config: &ReceiveConfig) -> Result<Root, Error> {
    let dir_flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC;
    let is_file = match std::fs::metadata(dest) {
        Ok(m) if m.is_dir() && config.contents => {
            // The source's contents go into `dest`: its top-level entry is `dest` itself,
            // named in its parent (`.` and `..` resolved: the user named it).
            let real = dest.canonicalize().map_err(|e| Error::io(dest, e))?;
            if let (Some(parent), Some(name)) = (real.parent(), real.file_name()) {
                return named_in(parent, name);
            }
            return Err(Error::InvalidArgument(format!(
                "{}: a folder's contents cannot go into the root directory",
                escape(dest.as_os_str().as_encoded_bytes())
            )));
        }
        Ok(m) if m.is_dir() => {
            // Following a symlink for the destination itself is fine: the user named it.
            let fd = rustix::fs::open(dest, dir_flags, Mode::empty())
                .map_err(|e| Error::io(dest, e.into()))?;
            return Ok(Root {
                fd: Arc::new(fd),
                path: dest.to_path_buf(),
                rename_top: None,
                top_must_be_dir: false,
                top_is_file: false,
            });
        }
        Ok(m) if !m.is_file() => {
            // A device or a pipe (`/dev/null`, say) is never replaced by a file.
            return Err(Error::InvalidArgument(format!(
                "{}: is {}, not a file nor a folder: fastcp writes files, not into devices \
                 or pipes, and left it as it is",
                escape(dest.as_os_str().as_encoded_bytes()),
                special_kind(&m)
            )));
        }
        Ok(_) if config.target_must_be_dir => return Err(not_a_directory(dest)),
        Ok(_) => true,
        // A symlink to nothing: a file takes its place (the link itself, never followed), and
        // a folder does not, as for a file.
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            std::fs::symlink_metadata(dest).is_ok_and(|m| m.is_symlink())
        }
        Err(e) => return Err(Error::io(dest, e)),
    };
    if config.target_must_be_dir && !config.target_may_be_new_dir {
        return Err(not_a_directory(dest));
    }
    let name = dest.file_name().ok_or_else(|| {
        Error::InvalidArgument(format!(
            "{}: not a valid destination name",
            escape(dest.as_os_str().as_encoded_bytes())
        ))
    })?;
    let parent = match dest.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let mut root = named_in(parent, name)?;
    root.top_must_be_dir = config.target_must_be_dir;
    root.top_is_file = is_file;
    Ok(root)
}

/// The error for a folder sent to a destination that is an existing file: the copy stops,
/// as one whose entries all failed (exit 1), before anything is written.
fn file_not_replaced(dest: &Path) -> Error {
    Error::Io {
        path: dest.to_path_buf(),
        source: io::Error::new(
            io::ErrorKind::NotADirectory,
            "exists and is not a directory: a folder does not replace a file",
        ),
    }
}

/// The error for a destination that must be a directory and is not one, saying why it must
/// (as the SFTP path says it).
pub(crate) fn not_a_directory(dest: &Path) -> Error {
    Error::InvalidArgument(format!(
        "{}: not a directory (several sources, or a trailing '/', need one)",
        escape(dest.as_os_str().as_encoded_bytes())
    ))
}

/// What a file that is neither a regular file nor a folder is, for messages.
fn special_kind(m: &std::fs::Metadata) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    let t = m.file_type();
    if t.is_char_device() {
        "a character device"
    } else if t.is_block_device() {
        "a block device"
    } else if t.is_fifo() {
        "a named pipe"
    } else if t.is_socket() {
        "a socket"
    } else {
        "a special file"
    }
}

/// The root whose one top-level entry is `name` in the existing directory `parent`.
fn named_in(parent: &Path, name: &std::ffi::OsStr) -> Result<Root, Error> {
    let dir_flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC;
    let fd = rustix::fs::open(parent, dir_flags, Mode::empty())
        .map_err(|e| Error::io(parent, e.into()))?;
    Ok(Root {
        fd: Arc::new(fd),
        path: parent.to_path_buf(),
        rename_top: Some(name.as_encoded_bytes().to_vec()),
        top_must_be_dir: false,
        top_is_file: false,
    })
}

/// The process umask, read without changing it (which would race with other threads).
fn read_umask() -> u32 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Umask:"))
                .and_then(|v| u32::from_str_radix(v.trim(), 8).ok())
        })
        .unwrap_or(0o022)
}

/// Receives a tree into `dest` from `streams`.
///
/// `dest` maps as with scp: if it is an existing directory, entries go beneath it under the
/// names they were sent with; otherwise its parent must exist and the single top-level entry
/// is created as `dest` (a second top-level name is then an error). Stream 0 also carries
/// the replies: per-entry errors, then the final report once every file is verified and in
/// place.
///
/// Every file is written to a temporary file beside its target, verified against the
/// sender's checksum and renamed into place: a file under its final name is never partial.
/// Paths are resolved beneath the destination one component at a time without following any
/// symlink, so nothing is written outside it.
///
/// See [`crate::send`] for an example with both sides.
pub async fn receive<S>(
    dest: &Path,
    streams: Vec<S>,
    config: &ReceiveConfig,
    progress: Arc<Progress>,
) -> Result<Report, Error>
where
    S: AsyncRead + AsyncWrite + Send + Unpin + 'static,
{
    if streams.is_empty() {
        return Err(Error::InvalidArgument("no streams to receive on".into()));
    }
    let n = streams.len();
    let mut reads = Vec::with_capacity(n);
    let mut writes = Vec::with_capacity(n);
    for s in streams {
        let (r, w) = tokio::io::split(s);
        reads.push(ByteReader(r));
        writes.push(w);
    }
    let mut writes = writes.into_iter();
    let reply_half = writes.next().expect("at least one stream");
    // Nothing is sent back on the other streams; their write halves stay open until the end.
    let _idle_writes: Vec<_> = writes.collect();
    receive_over(dest, reads, reply_half, config, progress).await
}

/// [`receive`] with its streams taken apart: the frames arrive from `readers`, one per
/// stream in the streams' order, and the replies go out on `reply_half` (stream 0's write
/// half). The other streams' write halves are the caller's to keep open until this returns.
///
/// A stream with a read path of its own (whole records read into the receiver's buffer, as
/// the TCP transport's sealed streams do) implements [`ReadInto`]; [`ByteReader`] wraps any
/// other.
///
/// ```
/// use std::sync::Arc;
///
/// use fastcp_stream::{ByteReader, Progress, ReceiveConfig, SendConfig};
///
/// # #[tokio::main]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let dir = tempfile::tempdir()?;
/// std::fs::write(dir.path().join("a.txt"), b"hello")?;
/// let (ours, theirs) = tokio::io::duplex(1 << 16);
/// let (read, reply) = tokio::io::split(theirs);
/// let (sources, dest) = ([dir.path().join("a.txt")], dir.path().join("b.txt"));
/// let (send_config, receive_config) = (SendConfig::default(), ReceiveConfig::default());
/// let progress = Arc::new(Progress::default());
/// let (sent, received) = tokio::join!(
///     fastcp_stream::send(&sources, vec![ours], &send_config, progress.clone()),
///     fastcp_stream::receive_from(&dest, vec![ByteReader(read)], reply, &receive_config, progress),
/// );
/// sent?;
/// received?;
/// assert_eq!(std::fs::read(dir.path().join("b.txt"))?, b"hello");
/// # Ok(())
/// # }
/// ```
pub async fn receive_from<R, W>(
    dest: &Path,
    readers: Vec<R>,
    reply_half: W,
    config: &ReceiveConfig,
    progress: Arc<Progress>,
) -> Result<Report, Error>
where
    R: ReadInto,
    W: AsyncWrite + Send + Unpin + 'static,
{
    receive_over(dest, readers, reply_half, config, progress).await
}

/// [`receive_from`] over in-process pipes of frames ([`receiver_pipe`](crate::receiver_pipe)):
/// a `Data` frame's payload written to a pipe as a part of its own arrives as that buffer,
/// uncopied. The receiver decodes and checks every frame as it does from a byte stream.
pub async fn receive_piped<W>(
    dest: &Path,
    pipes: Vec<crate::PipeSource>,
    reply_half: W,
    config: &ReceiveConfig,
    progress: Arc<Progress>,
) -> Result<Report, Error>
where
    W: AsyncWrite + Send + Unpin + 'static,
{
    receive_over(dest, pipes, reply_half, config, progress).await
}

/// [`receive_from`] over any [`Source`], local pipes included.
pub(crate) async fn receive_over<C, W>(
    dest: &Path,
    sources: Vec<C>,
    reply_half: W,
    config: &ReceiveConfig,
    progress: Arc<Progress>,
) -> Result<Report, Error>
where
    C: Source,
    W: AsyncWrite + Send + Unpin + 'static,
{
    if sources.is_empty() {
        return Err(Error::InvalidArgument("no streams to receive on".into()));
    }
    let n = sources.len();
    let (reply_tx, reply_rx) = mpsc::channel(256);
    let mut replier =
        crate::budget::AbortOnDrop(vec![tokio::spawn(write_replies(reply_half, reply_rx))]);

    let opened = open_destination(dest, config).and_then(|root| {
        let reference = match &config.link_dest {
            Some(_) if !config.skip_unchanged || config.checksum => {
                return Err(Error::InvalidArgument(
                    "--link-dest compares sizes and times: it needs the quick check, and not \
                     --checksum"
                        .into(),
                ));
            }
            Some(path) => Some(Arc::new(root.open_reference(path)?)),
            None => None,
        };
        Ok((root, reference))
    });
    let (root, reference) = match opened {
        Ok(r) => r,
        Err(e) => {
            notify_fatal(&reply_tx, &mut replier, &e).await;
            return Err(e);
        }
    };
    let shared = Arc::new(Shared {
        config: config.clone(),
        root,
        umask: read_umask(),
        progress,
        abort: Abort::default(),
        written: Written::default(),
        dirs: Mutex::new(DirState::default()),
        table: Mutex::new(Table::default()),
        announced: Notify::new(),
        n_streams: n,
        failures: Mutex::new(Report::default()),
        pool: Pool::default(),
        local_errors: Default::default(),
        replies: reply_tx.clone(),
        started: std::time::SystemTime::now(),
        // The writers' and the quick check's resolvers run at once.
        dir_cache: dest::dir_cache_size(config.writer_threads.max(1) + crate::probe::threads()),
        reference,
        delete_budget: Mutex::new(crate::DeleteBudget::new(config.max_delete)),
    });
    dest::reserve_fds();
    let _busy = (config.version >= 7).then(|| {
        crate::budget::AbortOnDrop(vec![tokio::spawn(tell_busy(
            shared.progress.clone(),
            reply_tx.clone(),
        ))])
    });

    let mut writer_txs = Vec::new();
    let mut writer_threads = Vec::new();
    for _ in 0..config.writer_threads.max(1) {
        let (tx, rx) = mpsc::channel(WRITER_QUEUE);
        writer_txs.push(tx);
        let writer = Writer::new(shared.clone());
        writer_threads.push(tokio::task::spawn_blocking(move || writer.run(rx)));
    }
    let budget_cap = config.max_in_flight.clamp(1 << 20, u32::MAX as usize >> 1);
    let budget = Arc::new(Semaphore::new(budget_cap));

    let mut readers = JoinSet::new();
    for (i, r) in sources.into_iter().enumerate() {
        let reader = Reader {
            shared: shared.clone(),
            writers: writer_txs.clone(),
            budget: budget.clone(),
            budget_cap,
            checksum: Algorithm::for_receiver(config),
            stream: i,
            counts: Summary::default(),
            next_writer: i,
            probers: None,
            attrs: None,
        };
        readers.spawn(read_stream(r, reader));
    }

    // Wait for every stream's end, or the first fatal error anywhere. `writer_txs` stays
    // until the check below: a writer whose queue closed first would report a missing end
    // on its own, in vaguer words, and race this check to be the copy's error.
    let mut peer = Summary::default();
    let outcome: Result<(), Error> = loop {
        tokio::select! {
            r = readers.join_next() => match r {
                None => break Ok(()),
                Some(Ok(Some(s))) => {
                    peer.files += s.files;
                    peer.dirs += s.dirs;
                    peer.symlinks += s.symlinks;
                    peer.bytes += s.bytes;
                    peer.errors += s.errors;
                }
                // The stream's error is already recorded in `shared.abort`.
                Some(Ok(None)) => break Err(Error::Protocol("aborted".into())),
                Some(Err(join)) => break Err(Error::Stream {
                    stream: 0,
                    source: io::Error::other(format!("reader task failed: {join}")),
                }),
            },
            _ = shared.abort.wait() => break Err(Error::Protocol("aborted".into())),
        }
    };
    let outcome = outcome.and_then(|()| {
        // Every stream has ended: a file still missing bytes or its end never completes.
        let t = lock(&shared.table);
        match t.live.values().find(|l| !l.abandoned) {
            Some(l) => Err(Error::Protocol(format!(
                "{}: the sender finished with {} of {} bytes{}",
                escape(&l.path),
                l.seen,
                l.size,
                if l.end { "" } else { " and no end of file" }
            ))),
            None => Ok(()),
        }
    });
    match outcome {
        Ok(()) => {
            drop_whole_partials(&shared);
            refresh_skipped(&shared, &writer_txs).await
        }
        Err(e) => shared.abort.trigger(e),
    }
    drop(writer_txs);
    readers.abort_all();
    while readers.join_next().await.is_some() {}
    // The writers finish the files they have (or, after an abort, remove their temp files).
    for h in writer_threads {
        if let Err(join) = h.await {
            shared.abort.trigger(Error::Stream {
                stream: 0,
                source: io::Error::other(format!("writer thread failed: {join}")),
            });
        }
    }
    if shared.abort.is_set() {
        let e = shared
            .abort
            .take()
            .unwrap_or_else(|| Error::Protocol("aborted".into()));
        notify_fatal(&reply_tx, &mut replier, &e).await;
        return Err(e);
    }

    let links = {
        let mut t = lock(&shared.table);
        let files = std::mem::take(&mut t.files);
        let links = std::mem::take(&mut t.links);
        let sent = std::mem::take(&mut t.sent_files);
        (links, files, sent)
    };
    if !links.0.is_empty() {
        let link_shared = shared.clone();
        let _ = tokio::task::spawn_blocking(move || {
            crate::mirror::make_links(&link_shared, &links.0, &links.1, &links.2)
        })
        .await;
    }
    let mut deleted = 0;
    if config.delete {
        // What the sender could not read would look deleted. Only what it skips on purpose
        // (FIFOs, sockets, devices) or could not name is safe to pass over, and that is kept.
        let spared = {
            let f = lock(&shared.failures);
            let complete = f.failure_count as usize == f.failures.len() || peer.errors == 0;
            crate::mirror::Spared::of(&f.failures).filter(|_| complete)
        };
        let del_shared = shared.clone();
        deleted = tokio::task::spawn_blocking(move || {
            let shared = del_shared;
            let Some(spared) = spared else {
                shared.mirror_failed(
                    fastcp_proto::ErrorCode::Other,
                    crate::mirror::NOTHING_DELETED.into(),
                );
                return 0;
            };
            let (dirs, sent) = {
                let mut t = lock(&shared.table);
                let unentered = std::mem::take(&mut t.unentered);
                let mut dirs = std::mem::take(&mut t.sent_dirs);
                dirs.retain(|d| !unentered.contains(d));
                dirs.sort_by(|a, b| crate::mirror_order(a, b));
                (dirs, std::mem::take(&mut t.sent))
            };
            // What the folders cleared out of the way took is spent.
            let mut budget = *lock(&shared.delete_budget);
            let n = crate::mirror::delete_extras(&shared, &dirs, &sent, &spared, &mut budget);
            if let Some(message) = budget.message() {
                shared.mirror_failed(fastcp_proto::ErrorCode::DeleteLimit, message);
            }
            n
        })
        .await
        .unwrap_or(0);
    }

    let fixups = std::mem::take(&mut shared.lock_dirs().fixups);
    let fix_shared = shared.clone();
    let _ = tokio::task::spawn_blocking(move || dest::apply_fixups(&fix_shared, fixups)).await;

    let mut report = std::mem::take(&mut *lock(&shared.failures));
    report.local = Summary {
        files: shared.written.files.load(Relaxed),
        dirs: shared.written.dirs.load(Relaxed),
        symlinks: shared.written.symlinks.load(Relaxed),
        bytes: shared.written.bytes.load(Relaxed),
        errors: shared.local_errors.load(Relaxed),
        deleted: deleted + shared.written.deleted.load(Relaxed),
    };
    report.peer = peer;
    {
        let t = lock(&shared.table);
        report.files_skipped = t.skipped.0.saturating_add(t.maybe_skipped.len() as u64);
        report.bytes_skipped = t
            .maybe_skipped
            .values()
            .fold(t.skipped.1, |sum, &size| sum.saturating_add(size));
        // With checksums, what was skipped is known only now.
        if config.checksum && shared.progress.has_events() {
            for (path, &size) in &t.maybe_skipped {
                shared.progress.event(|| Event::Skipped {
                    path: path.clone(),
                    size,
                    reason: SkipReason::SameContent,
                });
            }
        }
    }
    report.bytes_resumed = shared.written.resumed.load(Relaxed);
    report.bytes_sent = peer.bytes;
    let _ = reply_tx.send(vec![Frame::Done(report.local)]).await;
    drop(reply_tx);
    drop(shared);
    match (&mut replier.0[0]).await {
        Ok(Ok(mut w)) => {
            let _ = w.shutdown().await;
        }
        Ok(Err(e)) => return Err(e),
        Err(join) => {
            return Err(Error::Stream {
                stream: 0,
                source: io::Error::other(format!("reply task failed: {join}")),
            });
        }
    }
    Ok(report)
}

/// With `checksum` and `resume`, once every stream has ended: the partial files of the files
/// the sender skipped (their hashes matched) go, as the quick check removes those of files
/// it finds whole.
fn drop_whole_partials(shared: &Shared) {
    let whole: Vec<_> = {
        let t = &mut *lock(&shared.table);
        let partials = std::mem::take(&mut t.whole_partials);
        let (skipped, offers) = (&t.maybe_skipped, &mut t.offers);
        partials
            .into_iter()
            .filter(|(wire, _)| skipped.contains_key(wire))
            .map(|(wire, partial)| {
                // Released, so that it can be taken and removed.
                offers.remove(&wire);
                partial
            })
            .collect()
    };
    for (dir, name) in whole {
        crate::resume::remove_unheld_partial(&dir, &name);
    }
}

/// With `checksum`, once every stream has ended: the files the sender skipped take its mode
/// and times (see `Prober::refresh` in [`crate::probe`]), by the writers.
async fn refresh_skipped(shared: &Shared, writers: &[mpsc::Sender<Op>]) {
    let ops: Vec<Op> = std::mem::take(&mut lock(&shared.table).refresh_later)
        .into_values()
        .collect();
    for (i, op) in ops.into_iter().enumerate() {
        // Fails only when a writer stopped, and then the abort carries the reason.
        if writers[i % writers.len()].send(op).await.is_err() {
            return;
        }
    }
}

/// Tells the sender why we stop, if the reply stream still works.
async fn notify_fatal(
    tx: &mpsc::Sender<Vec<Frame>>,
    replier: &mut crate::budget::AbortOnDrop<Result<impl Sized, Error>>,
    e: &Error,
) {
    let frame = e.to_frame(b"", true);
    if tx.send(vec![Frame::Error(frame)]).await.is_ok() {
        let _ = tokio::time::timeout(NOTICE_WAIT, &mut replier.0[0]).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A writer thread that panics (a test hook makes it, at the end of a file of this
    /// name) ends the copy with an error that says so, and its temp file is removed.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_writer_that_panics_ends_the_copy_and_leaves_no_temp_file() {
        let src = tempfile::tempdir().unwrap();
        let dst = tempfile::tempdir().unwrap();
        let tree = src.path().join("t");
        std::fs::create_dir(&tree).unwrap();
        std::fs::write(tree.join("writer-panics-here"), vec![7u8; 300 << 10]).unwrap();
        for i in 0..20 {
            std::fs::write(tree.join(format!("f{i}")), vec![i as u8; 100 << 10]).unwrap();
        }
        let send_config = crate::SendConfig {
            recursive: true,
            ..Default::default()
        };
        let receive_config = ReceiveConfig {
            recursive: true,
            ..Default::default()
        };
        let (a, b): (Vec<_>, Vec<_>) = (0..2).map(|_| tokio::io::duplex(64 << 10)).unzip();
        let progress = Arc::new(crate::Progress::default());
        let sources = [tree.clone()];
        let copy = async {
            tokio::join!(
                crate::send(&sources, a, &send_config, progress.clone()),
                receive(dst.path(), b, &receive_config, progress.clone()),
            )
        };
        // A bound on a hang, not on speed: the copy ends at once or never.
        let (_, received) = tokio::time::timeout(Duration::from_secs(60), copy)
            .await
            .expect("the copy hung after a writer panicked");
        let e = received.expect_err("a writer panicked, yet the copy succeeded");
        assert!(e.to_string().contains("panicked"), "{e}");
        let left: Vec<_> = std::fs::read_dir(dst.path().join("t"))
            .map(|d| d.map(|e| e.unwrap().file_name()).collect())
            .unwrap_or_default();
        assert!(
            !left
                .iter()
                .any(|n| dest::is_temp_name(n.as_encoded_bytes())),
            "temp files left: {left:?}"
        );
        assert!(!dst.path().join("t/writer-panics-here").exists());
    }

    /// A stream holding data for a file whose entry another stream brought and then ended on:
    /// the file counts as announced, whatever the order the two facts were recorded in.
    #[test]
    fn a_file_announced_by_a_stream_that_then_ended_is_announced() {
        let live = |announced| Live {
            path: Bytes::from_static(b"f"),
            size: 1,
            start: 0,
            len: 1,
            seen: 0,
            end: false,
            announced,
            abandoned: false,
        };
        let mut t = Table::default();
        assert_eq!(announcement(&t, 0, 2), Announcement::Pending);
        t.live.insert(0, live(false));
        assert_eq!(announcement(&t, 0, 2), Announcement::Pending);
        t.live.insert(0, live(true));
        t.finished = 1;
        assert_eq!(announcement(&t, 0, 2), Announcement::Made);
        assert_eq!(announcement(&t, 1, 2), Announcement::Never);
        assert_eq!(announcement(&t, 1, 3), Announcement::Pending);
        t.live.remove(&0);
        t.done.insert(0);
        assert_eq!(announcement(&t, 0, 2), Announcement::Made);
    }

    #[test]
    fn pending_frame_measures_the_frame_buf_starts_with() {
        let decoder = Decoder::new(1 << 20);
        let mut frame = BytesMut::new();
        fastcp_proto::encode_data_header(1, 0, 1000, &mut frame);
        let header = frame.len();
        let kind_and_length = fastcp_proto::HEADER_LEN;
        assert_eq!(
            pending_frame(&frame[..kind_and_length - 1], &decoder),
            (0, 0)
        );
        assert_eq!(
            pending_frame(&frame[..kind_and_length], &decoder),
            (header + 1000, header + 1000 - kind_and_length)
        );
        assert_eq!(pending_frame(&frame, &decoder), (header + 1000, 1000));
        frame.extend_from_slice(&[0; 400]);
        assert_eq!(pending_frame(&frame, &decoder), (header + 1000, 600));
        // Over the cap: left to the decoder to refuse.
        let small = Decoder::new(64 << 10);
        let mut huge = BytesMut::new();
        fastcp_proto::encode_data_header(1, 0, 1 << 20, &mut huge);
        assert_eq!(pending_frame(&huge, &small), (0, 0));
    }
}
