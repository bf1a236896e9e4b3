//! The sending side: walk, read, hash, schedule frames over the streams.
//!
//! Three stages, each bounded:
//!
//! 1. the **walk** runs on a blocking thread and feeds entries through a bounded channel;
//! 2. the **producer**, another blocking thread, opens and reads each file in large blocks,
//!    encodes the frames and queues them on the streams.
//!    A small file goes whole (File, Data, FileEnd back to back) on one stream, and the
//!    writer task of that stream hashes it; a big file is hashed as it is read,
//!    its File entry goes on one stream, its chunks are spread over all of them, and its
//!    FileEnd is queued after its last chunk. Each message goes to the stream with the
//!    fewest bytes queued, so a slow stream gets less;
//! 3. one **writer task** per stream drains its queue into the stream (a
//!    [`Sink`](crate::pipe::Sink): a byte stream's write buffer, or a local pipe).
//!
//! A byte [`Budget`] shared by all queues bounds the memory in flight: the producer waits
//! when it is spent. Meanwhile a task reads stream 0 for the receiver's per-entry errors and
//! its final report.

use std::collections::{HashMap, HashSet, VecDeque};
use std::io;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use fastcp_proto::{
    Answer, Decoder, DirEntry, ErrorFrame, FileEnd, FileEntry, Frame, HardLink, Hole, Keep,
    LinkTimes, Meta, Partial, PieceEntry, Probe, SpecialEntry, Summary, SymlinkEntry, Totals,
    Unentered, encode, encode_data_header,
};
use rustix::fs::{FileType, Mode, OFlags};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite};
use tokio::sync::mpsc;

use crate::attrs::Source;
use crate::budget::{AbortOnDrop, Budget, CloseOnDrop, Closed, Pool};
use crate::checksum::Algorithm;
use crate::event::{Event, SkipReason};
use crate::pipe::{ByteWriter, Sink, WriteFrom};
use crate::receive::BIG_FRAME;
use crate::report::{Failure, Report, Side};
use crate::walk::{EntryKind, WalkConfig, walk};
use crate::{Error, Progress, stream_error};

/// The default chunk size: files up to this size travel whole on one stream, bigger ones are
/// cut into chunks of this size.
pub const DEFAULT_CHUNK_SIZE: usize = 1 << 20;

/// The default bound on bytes queued for the streams and not yet written.
pub const DEFAULT_SEND_IN_FLIGHT: usize = 16 << 20;

/// How many walked entries may wait for the producer.
const WALK_QUEUE: usize = 1024;

/// Small files gathered for one stream are queued together once they fill this much (see
/// [`Out::gathered`]): a part this big is sealed where it lies on a TCP stream (data.rs's
/// `SEAL_IN_PLACE` in the `fastcp` crate) and passes a [`ByteWriter`]'s buffer, where each
/// file's own message was copied into the stream's buffer.
const GATHER: usize = 256 << 10;

/// Walked entries travel to the producer in batches of this many: one entry at a time, a
/// walker that is ahead woke up (and went back to sleep) for each slot the producer freed,
/// two futex calls per file (measured on a 78,579-file tree).
const WALK_BATCH: usize = 64;

/// What the walker hands the producer.
type WalkItem = Result<crate::Entry, Error>;

/// The cap on a frame from the receiver: errors and the final report are small; the largest
/// is a `Partial` with all its block hashes (`--resume`, 256 KiB of them).
pub(crate) const REPLY_MAX_FRAME: u32 = (fastcp_proto::MAX_PARTIAL_HASHES * 16) as u32 + (64 << 10);

/// Quick-check probes outstanding, at most: from the oldest one not yet answered to the
/// newest, until the first answer shows the round trip (see [`probe_window`]). About 200
/// bytes and a path are held for each.
const PROBE_WINDOW_MIN: usize = 1 << 12;
/// The most probes outstanding, on a long round trip: a no-change rerun of 78,579 files at
/// 20 ms RTT took 1.06 s with 4,096 and 0.90 s with this (and a walk started ahead).
const PROBE_WINDOW_MAX: usize = 1 << 14;
/// The window holds a probe for each this long of the round trip: a million probes a
/// second, about three times what a receiver answered on a loopback rerun of that tree
/// (78,579 in 0.22 s).
const PROBE_EVERY: Duration = Duration::from_micros(1);
/// Probes gathered into one message for stream 0, at most: one hand-off to its writer (and
/// over SSH, one packet) for many files instead of one each.
const PROBE_BATCH: usize = 512;
/// A batch goes at this size too: probes may carry their files' attributes (`Attrs`).
const PROBE_BATCH_BYTES: usize = 256 << 10;
/// With `checksum`, a file of this size or more has its probe sent before it is hashed here,
/// so that both sides hash at once: one file's hash then takes longer than a probe batch
/// saves.
const HASH_AHEAD: u64 = 1 << 20;

/// How long to wait for the receiver's explanation once a stream broke.
const EXPLANATION_WAIT: Duration = Duration::from_secs(5);

/// How to send.
///
/// ```
/// use fastcp_stream::SendConfig;
///
/// let config = SendConfig { recursive: true, ..SendConfig::default() };
/// assert_eq!(config.chunk_size, 1 << 20);
/// ```
#[derive(Debug, Clone)]
pub struct SendConfig {
    /// Files up to this size go whole on one stream; bigger files are cut into chunks of this
    /// size spread over all streams. It must fit in the peer's frame cap (16 bytes of header
    /// less). Default: [`DEFAULT_CHUNK_SIZE`] (1 MiB).
    pub chunk_size: usize,
    /// Descend into directories (scp's `-r`). Default: false.
    pub recursive: bool,
    /// Follow symbolic links instead of sending them as links. Default: false.
    pub follow_links: bool,
    /// Send modification times (and, to a peer of version 2 or later, access times and
    /// symlinks' own times). Without it the mtime fields are sent as zero, and only the
    /// permission bits travel (as scp does without `-p`). Default: false.
    pub preserve: bool,
    /// Bytes that may be queued for the streams before the reader waits. Default:
    /// [`DEFAULT_SEND_IN_FLIGHT`] (16 MiB).
    pub max_in_flight: usize,
    /// The protocol version agreed with the receiver: what a later version added is not
    /// sent to an older peer. Version 2 added the `Totals` frame, sent as soon as the walk is
    /// complete so that the receiver can show a total and an ETA, and with `preserve`, access
    /// times and symlink times; version 3 changed the `FileEnd` checksum from BLAKE3 to
    /// XXH3-128 (the receiver must be told the same version). Default:
    /// [`fastcp_proto::PROTOCOL_VERSION`].
    pub version: u16,
    /// The quick check (protocol version 4; the receiver must be configured alike): before
    /// a regular file's bytes go, ask the receiver whether it already has the file with this
    /// size and modification time, and skip it if so. The questions stream ahead of the
    /// answers, so it costs no round trip per file. Only worth it when the copy keeps
    /// modification times (`preserve`), or the receiver's times never match. Default: false.
    pub skip_unchanged: bool,
    /// Include and exclude rules for the walk (see [`crate::Filter`]). Default: none.
    pub filter: Option<Arc<crate::Filter>>,
    /// Keep hard links (`-H`, protocol version 4; the receiver must be configured alike): a
    /// file's further names go as `HardLink` entries instead of its bytes again. Default:
    /// false.
    pub hard_links: bool,
    /// With `skip_unchanged`: compare content hashes instead of modification times (rsync's
    /// `--checksum`). The sender hashes each file while the receiver hashes its own copy of
    /// the same size. Default: false.
    pub checksum: bool,
    /// Which hash `checksum` compares: the receiver must hash alike. Default:
    /// [`ContentHash::Xxh3`](crate::ContentHash::Xxh3).
    pub content_hash: crate::ContentHash,
    /// With `skip_unchanged` (protocol version 4; the receiver must be configured alike):
    /// continue the receiver's partial files (`--resume`). When the receiver answers a probe
    /// with the hashes of the blocks its partial copy holds, each block of the source that
    /// matches goes as a `Keep` instead of its bytes. Default: false.
    pub resume: bool,
    /// Owners and extended attributes to send ahead of each entry, as an `Attrs` frame (the
    /// receiver must be configured alike). Default: none.
    pub attrs: crate::KeepAttrs,
    /// Compute each file's checksum for its `FileEnd`. Off, the checksum is all zeros: for a
    /// bridge whose far end cannot check it (the SFTP path, where nothing remote reads the
    /// bytes back), so that hashing costs nothing. A fastcp receiver refuses such files.
    /// Default: true.
    pub file_checksums: bool,
    /// Hash each file's bytes for its `FileEnd` checksum. Off (the receiver configured alike,
    /// [`ReceiveConfig::hash_content`](crate::ReceiveConfig::hash_content)), the checksum
    /// folds each range's offset and length alone: it still proves that every range arrived,
    /// once and as sent, but hashes no byte. That is for a channel that authenticates every
    /// byte end to end, from this process to the receiver's (fastcp's sealed TCP streams, a
    /// pipe in this process; not SSH, whose MAC ends at sshd), where a hash of the content
    /// on both ends would check what the channel already has. A copy that
    /// `resume`s hashes regardless: the blocks it keeps join the sent bytes by their hashes.
    /// Default: true.
    pub hash_content: bool,
    /// Send device nodes (`--devices`) instead of skipping each as a failure of its own
    /// ([`ErrorCode::Unsupported`](crate::ErrorCode::Unsupported), not fatal; the receiver
    /// must be configured alike). Default: false.
    pub devices: bool,
    /// Send named pipes and sockets (`--specials`) instead of skipping each as a failure of
    /// its own, as for [`devices`](Self::devices) (the receiver must be configured alike).
    /// Default: false.
    pub specials: bool,
    /// Do not descend into directories on another file system than their top-level source
    /// (`-x`; see [`WalkConfig::one_file_system`]). Default: false.
    pub one_file_system: bool,
    /// The copy cannot carry devices, named pipes and sockets at all (the SFTP path): the
    /// failure for each one skipped does not name `--devices` or `--specials`. Default: false.
    pub specials_refused: bool,
    /// Files of which this run sends some ranges only, by wire path (`--shard`, protocol
    /// version 6): each range goes as a `Piece` entry of its own, and fails as changed unless
    /// the file still has the [`Piece::size`] it was planned with. Other runs send the other
    /// ranges; the receiver gives the file its final name once they cover it. Default: none.
    pub pieces: Option<Arc<HashMap<Bytes, Vec<Piece>>>>,
    /// The sources' walk, started ahead (see [`WalkAhead`](crate::WalkAhead)): a send of
    /// the same sources with the same [`walk_config`](SendConfig::walk_config) (the same
    /// filter `Arc`) takes its entries instead of walking. Default: none.
    pub walk_ahead: Option<crate::WalkAhead>,
}

impl SendConfig {
    /// The walk a send with this config makes of its sources: what to start a
    /// [`WalkAhead`](crate::WalkAhead) with.
    pub fn walk_config(&self) -> WalkConfig {
        let mut walk = WalkConfig::new(self.recursive, self.follow_links);
        walk.devices = self.devices;
        walk.specials = self.specials;
        walk.one_file_system = self.one_file_system;
        walk.filter = self.filter.clone();
        walk
    }
}

/// The range of a file one run sends (see [`SendConfig::pieces`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Piece {
    /// The whole file's size when the split was planned.
    pub size: u64,
    /// Where the range starts.
    pub offset: u64,
    /// The range's length, more than 0.
    pub len: u64,
}

impl Default for SendConfig {
    fn default() -> SendConfig {
        SendConfig {
            chunk_size: DEFAULT_CHUNK_SIZE,
            recursive: false,
            follow_links: false,
            preserve: false,
            max_in_flight: DEFAULT_SEND_IN_FLIGHT,
            version: fastcp_proto::PROTOCOL_VERSION,
            skip_unchanged: false,
            filter: None,
            hard_links: false,
            checksum: false,
            content_hash: crate::ContentHash::Xxh3,
            resume: false,
            attrs: crate::KeepAttrs::default(),
            file_checksums: true,
            hash_content: true,
            devices: false,
            specials: false,
            one_file_system: false,
            specials_refused: false,
            pieces: None,
            walk_ahead: None,
        }
    }
}

/// One message for a writer task: up to three byte strings written back to back.
struct Msg {
    parts: [Bytes; 3],
    /// Budget bytes to give back once written.
    permit: usize,
    /// Files whose last byte this message carries, for [`Progress`].
    files: u64,
    /// File content bytes in this message, for [`Progress`].
    data: u64,
    /// The middle part is a chunk buffer to give back to the [`Pool`].
    recycle: bool,
    /// The middle part is the whole of file `id`: hash it and send its `FileEnd` after it.
    /// Hashing in the writer tasks spreads it over the streams instead of the reader thread.
    end_of: Option<u64>,
}

/// The size of an encoded `FileEnd` frame.
const FILE_END_LEN: usize = fastcp_proto::HEADER_LEN + 8 + 32;

impl Msg {
    fn frame(frame: &Frame) -> Msg {
        Msg::parts(frame_bytes(frame), Bytes::new(), Bytes::new())
    }

    fn parts(a: Bytes, b: Bytes, c: Bytes) -> Msg {
        Msg {
            parts: [a, b, c],
            permit: 0,
            files: 0,
            data: 0,
            recycle: false,
            end_of: None,
        }
    }

    fn len(&self) -> usize {
        let end = if self.end_of.is_some() {
            FILE_END_LEN
        } else {
            0
        };
        self.parts.iter().map(Bytes::len).sum::<usize>() + end
    }
}

fn frame_bytes(frame: &Frame) -> Bytes {
    let mut b = BytesMut::new();
    encode(frame, &mut b);
    b.freeze()
}

/// Sends `sources` over `streams` and waits for the receiver's final report.
///
/// The streams must be set up already (handshake and request done); stream 0 also carries the
/// receiver's replies. Returns when the receiver has confirmed the whole transfer, with the
/// entries that failed on either side in [`Report::failures`]. A fatal error on either side
/// ends the transfer with `Err`.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use std::sync::Arc;
/// use fastcp_stream::{receive, send, Progress, ReceiveConfig, SendConfig};
///
/// let src = tempfile::tempdir()?;
/// let dst = tempfile::tempdir()?;
/// std::fs::write(src.path().join("hello.txt"), b"hello")?;
///
/// // Two in-memory streams; a real session would use SSH channels or sealed TCP.
/// let (a0, b0) = tokio::io::duplex(1 << 16);
/// let (a1, b1) = tokio::io::duplex(1 << 16);
/// let progress = Arc::new(Progress::default());
/// let sources = [src.path().join("hello.txt")];
/// let (send_config, receive_config) = (SendConfig::default(), ReceiveConfig::default());
/// let (sent, received) = tokio::join!(
///     send(&sources, vec![a0, a1], &send_config, progress.clone()),
///     receive(dst.path(), vec![b0, b1], &receive_config, progress),
/// );
/// assert_eq!(sent?.peer.files, 1);
/// assert!(received?.is_complete());
/// assert_eq!(std::fs::read(dst.path().join("hello.txt"))?, b"hello");
/// # Ok(()) }
/// ```
pub async fn send<S>(
    sources: &[PathBuf],
    streams: Vec<S>,
    config: &SendConfig,
    progress: Arc<Progress>,
) -> Result<Report, Error>
where
    S: AsyncRead + AsyncWrite + Send + Unpin + 'static,
{
    send_streams(sources, streams, config, progress, true).await
}

/// [`send`] for a sender whose receiver runs in this process and shares its `progress` (a
/// local copy through pipes of the program's own, paced or counted, say): the receiver
/// reports the copy's events, so this side reports none, neither of its files nor of the
/// receiver's deletions, which would then come twice.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use std::sync::{Arc, Mutex};
/// use fastcp_stream::{Event, EventSink, Progress, ReceiveConfig, SendConfig};
///
/// let src = tempfile::tempdir()?;
/// let dst = tempfile::tempdir()?;
/// std::fs::write(src.path().join("hello.txt"), b"hello")?;
/// let started = Arc::new(Mutex::new(0));
/// let sink = EventSink::new({
///     let started = started.clone();
///     move |e: &Event| *started.lock().unwrap() += matches!(e, Event::Started { .. }) as u32
/// });
/// let progress = Arc::new(Progress::with_events(sink));
/// let (a, b) = tokio::io::duplex(1 << 16);
/// let sources = [src.path().join("hello.txt")];
/// let (send_config, receive_config) = (SendConfig::default(), ReceiveConfig::default());
/// let (sent, received) = tokio::join!(
///     fastcp_stream::send_beside(&sources, vec![a], &send_config, progress.clone()),
///     fastcp_stream::receive(dst.path(), vec![b], &receive_config, progress),
/// );
/// sent?;
/// received?;
/// assert_eq!(*started.lock().unwrap(), 1, "the receiver's alone");
/// # Ok(()) }
/// ```
pub async fn send_beside<S>(
    sources: &[PathBuf],
    streams: Vec<S>,
    config: &SendConfig,
    progress: Arc<Progress>,
) -> Result<Report, Error>
where
    S: AsyncRead + AsyncWrite + Send + Unpin + 'static,
{
    send_streams(sources, streams, config, progress, false).await
}

/// [`send`], reporting this side's events or not.
async fn send_streams<S>(
    sources: &[PathBuf],
    streams: Vec<S>,
    config: &SendConfig,
    progress: Arc<Progress>,
    events: bool,
) -> Result<Report, Error>
where
    S: AsyncRead + AsyncWrite + Send + Unpin + 'static,
{
    if streams.is_empty() {
        return Err(Error::InvalidArgument("no streams to send on".into()));
    }
    let n = streams.len();
    let mut reads = Vec::with_capacity(n);
    let mut writes = Vec::with_capacity(n);
    for s in streams {
        let (r, w) = tokio::io::split(s);
        reads.push(r);
        writes.push(ByteWriter::new(w));
    }
    let mut reads = reads.into_iter();
    let reply_half = reads.next().expect("at least one stream");
    // The other read halves stay open (the receiver writes nothing on them) until the end.
    let _idle_reads: Vec<_> = reads.collect();
    send_over(sources, reply_half, writes, config, progress, events).await
}

/// [`send`] with its streams taken apart: the receiver's replies arrive on `reply_half`
/// (stream 0's read half), and the frames go to `writers`, one per stream in the streams'
/// order. The other streams' read halves are the caller's to keep open until this returns.
///
/// A stream with a write path of its own (file chunks sealed in place, as the TCP
/// transport's sealed streams do) implements [`WriteFrom`]; [`ByteWriter`] wraps any other.
///
/// ```
/// use std::sync::Arc;
///
/// use fastcp_stream::{ByteWriter, Progress, ReceiveConfig, SendConfig};
///
/// # #[tokio::main]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let dir = tempfile::tempdir()?;
/// std::fs::write(dir.path().join("a.txt"), b"hello")?;
/// let (ours, theirs) = tokio::io::duplex(1 << 16);
/// let (replies, write) = tokio::io::split(ours);
/// let (sources, dest) = ([dir.path().join("a.txt")], dir.path().join("b.txt"));
/// let (send_config, receive_config) = (SendConfig::default(), ReceiveConfig::default());
/// let progress = Arc::new(Progress::default());
/// let writers = vec![ByteWriter::new(write)];
/// let (sent, received) = tokio::join!(
///     fastcp_stream::send_to(&sources, replies, writers, &send_config, progress.clone()),
///     fastcp_stream::receive(&dest, vec![theirs], &receive_config, progress),
/// );
/// sent?;
/// received?;
/// assert_eq!(std::fs::read(dir.path().join("b.txt"))?, b"hello");
/// # Ok(())
/// # }
/// ```
pub async fn send_to<R, K>(
    sources: &[PathBuf],
    reply_half: R,
    writers: Vec<K>,
    config: &SendConfig,
    progress: Arc<Progress>,
) -> Result<Report, Error>
where
    R: AsyncRead + Send + Unpin + 'static,
    K: WriteFrom,
{
    send_over(sources, reply_half, writers, config, progress, true).await
}

/// [`send_to`] over any [`Sink`], local pipes included.
pub(crate) async fn send_over<R, K>(
    sources: &[PathBuf],
    reply_half: R,
    sinks: Vec<K>,
    config: &SendConfig,
    progress: Arc<Progress>,
    events: bool,
) -> Result<Report, Error>
where
    R: AsyncRead + Send + Unpin + 'static,
    K: Sink,
{
    // Without a receiver in this process, this side reports the events, and counts what
    // the receiver tells of (its deletions).
    let events = events.then(|| progress.clone());
    if sinks.is_empty() {
        return Err(Error::InvalidArgument("no streams to send on".into()));
    }
    if config.chunk_size == 0 || config.chunk_size > fastcp_proto::HARD_MAX_FRAME as usize - 16 {
        return Err(Error::InvalidArgument(format!(
            "chunk size {} is out of range",
            config.chunk_size
        )));
    }
    let n = sinks.len();
    let takes_gathered = sinks.iter().all(Sink::takes_gathered);
    let budget = Arc::new(Budget::new(
        config.max_in_flight.max(config.chunk_size + (64 << 10)),
    ));
    let _close_budget = CloseOnDrop(budget.clone());
    let queued: Arc<Vec<AtomicUsize>> = Arc::new((0..n).map(|_| AtomicUsize::new(0)).collect());

    let (answer_tx, answer_rx) = std::sync::mpsc::channel();
    let answers = config.skip_unchanged.then_some(answer_tx);
    let resume = config.skip_unchanged && config.resume;
    let mut reply = AbortOnDrop(vec![tokio::spawn(read_replies(
        reply_half,
        answers,
        resume,
        events.clone(),
        // A receiver that shares this side's Progress counts what it checks itself.
        events.clone(),
    ))]);

    let pool = Arc::new(Pool::default());
    let mut txs = Vec::with_capacity(n);
    let mut writers = AbortOnDrop(Vec::with_capacity(n));
    for (i, w) in sinks.into_iter().enumerate() {
        let (tx, rx) = mpsc::unbounded_channel();
        txs.push(tx);
        let ctx = WriteCtx {
            budget: budget.clone(),
            queued: queued.clone(),
            progress: progress.clone(),
            pool: pool.clone(),
            checksum: config.file_checksums.then(|| Algorithm::for_sender(config)),
        };
        writers.0.push(tokio::spawn(write_stream(i, w, rx, ctx)));
    }

    let (walk_tx, walk_rx) = mpsc::channel::<Vec<WalkItem>>(WALK_QUEUE / WALK_BATCH);
    let walk_config = config.walk_config();
    let walk_sources = sources.to_vec();
    let ahead = config.walk_ahead.clone();
    let walk_progress = progress.clone();
    let walk_pieces = config.pieces.clone();
    // The walk's totals go out on stream 0 as soon as it ends, ahead of the file data still
    // to be read (and before the producer's `Done`, which waits for `walk_tx` to close).
    let totals_out = (config.version >= 2).then(|| (txs[0].clone(), queued.clone()));
    let walker = tokio::task::spawn_blocking(move || {
        let mut totals = Totals::default();
        let mut batch = Vec::with_capacity(WALK_BATCH);
        let walked: Box<dyn Iterator<Item = WalkItem>> = match ahead
            .as_ref()
            .and_then(|a| a.take(&walk_sources, &walk_config))
        {
            Some(entries) => Box::new(entries),
            None => Box::new(crate::walk::PanicsAsErrors::new(
                walk(&walk_sources, &walk_config),
                &walk_sources,
            )),
        };
        for item in walked {
            if let Ok(entry) = &item
                && let EntryKind::File { size } = entry.kind
            {
                // Of a file sent in pieces, the pieces' bytes.
                let size = match walk_pieces.as_ref().and_then(|p| p.get(&entry.wire)) {
                    Some(pieces) => pieces.iter().map(|p| p.len).sum(),
                    None => size,
                };
                walk_progress.add_seen(1, size);
                totals.files += 1;
                totals.bytes += size;
            }
            batch.push(item);
            if batch.len() == WALK_BATCH {
                let full = std::mem::replace(&mut batch, Vec::with_capacity(WALK_BATCH));
                if walk_tx.blocking_send(full).is_err() {
                    return;
                }
            }
        }
        if !batch.is_empty() && walk_tx.blocking_send(batch).is_err() {
            return;
        }
        walk_progress.set_walk_complete();
        if let Some((tx, queued)) = totals_out {
            let msg = Msg::frame(&Frame::Totals(totals));
            queued[0].fetch_add(msg.len(), Relaxed);
            // A closed stream is reported by the producer or its writer.
            let _ = tx.send(msg);
        }
    });

    let producer_config = config.clone();
    let producer_pool = pool.clone();
    let producer_progress = progress.clone();
    let producer_budget = budget.clone();
    let producer = tokio::task::spawn_blocking(move || {
        let checksum = producer_config
            .file_checksums
            .then(|| Algorithm::for_sender(&producer_config));
        // Gathering is for checksums that need no pass over the content (the writer tasks
        // hash each file's message otherwise), not with `hard_links`, whose links name files
        // that must not wait in a buffer, and not with `attrs`, which go as frames of their
        // own before each file.
        let gather = takes_gathered
            && checksum.is_none_or(|c| c == Algorithm::Ranges)
            && !producer_config.hard_links
            && !producer_config.attrs.any();
        let mut out = Out {
            txs,
            queued,
            counts: vec![Summary::default(); n],
            budget: producer_budget,
            next: 0,
            gathered: if gather {
                (0..n).map(|_| Gathered::default()).collect()
            } else {
                Vec::new()
            },
            checksum,
        };
        let mut p = Producer {
            config: producer_config,
            pool: producer_pool,
            progress: producer_progress,
            out: &mut out,
            next_id: 0,
            failures: Vec::new(),
            probes: Probes {
                answers: answer_rx,
                waiting: Outstanding::default(),
                skipped: (0, 0),
                batch: BytesMut::new(),
                batched: 0,
                window: probe_window(None),
                first_sent: None,
                answered: false,
            },
            names: HashMap::new(),
            linked: Vec::new(),
            unchanged_names: HashSet::new(),
            first_names: HashSet::new(),
            owners: crate::attrs::Names::default(),
            resumed: 0,
            holes: 0,
            events,
        };
        let result = p.run(walk_rx);
        let failures = std::mem::take(&mut p.failures);
        let links_skipped = p
            .linked
            .iter()
            .filter(|first| p.unchanged_names.contains(*first))
            .count() as u64;
        p.probes.skipped.0 += links_skipped;
        let skipped = (p.probes.skipped, p.resumed, p.holes);
        result.map(|()| (out.counts, failures, skipped))
    });

    // The producer and the writers, in that order; a writer's error explains a stopped
    // producer.
    let work = async {
        let produced = producer.await;
        let mut halves = Vec::with_capacity(n);
        let mut first_err = None;
        for h in writers.0.iter_mut() {
            match h.await {
                Ok(Ok(w)) => halves.push(w),
                Ok(Err(e)) => {
                    first_err.get_or_insert(e);
                }
                Err(join) => {
                    first_err.get_or_insert(Error::Stream {
                        stream: 0,
                        source: io::Error::other(format!("writer task failed: {join}")),
                    });
                }
            }
        }
        if let Some(e) = first_err {
            return Err(e);
        }
        match produced {
            Ok(Ok(result)) => Ok((result, halves)),
            Ok(Err(Closed)) => Err(Error::Stream {
                stream: 0,
                source: io::Error::other("transfer aborted"),
            }),
            Err(join) => Err(Error::Stream {
                stream: 0,
                source: io::Error::other(format!("reader thread failed: {join}")),
            }),
        }
    };
    tokio::pin!(work);

    let mut replied = None;
    let worked = loop {
        tokio::select! {
            r = &mut reply.0[0], if replied.is_none() => {
                let r = flatten_reply(r);
                if let Err(e) = r {
                    // The receiver gave up (or the reply stream broke): stop at once.
                    return Err(e);
                }
                replied = Some(r);
            }
            w = &mut work => break w,
        }
    };
    let ((counts, local_failures, skipped), mut halves) = match worked {
        Ok(v) => v,
        Err(e) => {
            // A stream broke: the receiver probably said why on stream 0.
            let r = match replied {
                Some(r) => r,
                None => match tokio::time::timeout(EXPLANATION_WAIT, &mut reply.0[0]).await {
                    Ok(r) => flatten_reply(r),
                    Err(_) => return Err(e),
                },
            };
            return Err(match r {
                Err(remote) => remote,
                Ok(_) => e,
            });
        }
    };
    drop(walker);
    let (peer, remote_failures) = match replied {
        Some(r) => r?,
        None => flatten_reply((&mut reply.0[0]).await)?,
    };
    for w in halves.iter_mut() {
        // The transfer is complete; a failing shutdown changes nothing.
        let _ = w.shutdown().await;
    }

    let mut report = Report::default();
    for c in &counts {
        report.local.files += c.files;
        report.local.dirs += c.dirs;
        report.local.symlinks += c.symlinks;
        report.local.bytes += c.bytes;
        report.local.errors += c.errors;
    }
    report.peer = peer;
    report.bytes_sent = report.local.bytes;
    let holes;
    (
        (report.files_skipped, report.bytes_skipped),
        report.bytes_resumed,
        holes,
    ) = skipped;
    // The files' bytes copied include their holes, as on a receiver; the bytes sent do not.
    report.local.bytes += holes;
    for f in local_failures.into_iter().chain(remote_failures) {
        report.push_failure(f);
    }
    Ok(report)
}

type ReplyResult = Result<(Summary, Vec<Failure>), Error>;

fn flatten_reply(r: Result<ReplyResult, tokio::task::JoinError>) -> ReplyResult {
    match r {
        Ok(r) => r,
        Err(join) => Err(Error::Stream {
            stream: 0,
            source: io::Error::other(format!("reply task failed: {join}")),
        }),
    }
}

/// Reads the receiver's replies on stream 0: per-entry errors and quick-check answers (passed
/// on to the producer through `answers`, each with the `Partial` that came just before it,
/// with `resume`), the entries it deleted and its signs of life while it finishes, then the
/// final `Done`. The errors and deletions are reported to `events` (the receiver's own,
/// when it runs elsewhere).
async fn read_replies<R: AsyncRead + Unpin>(
    mut r: R,
    answers: Option<std::sync::mpsc::Sender<Answered>>,
    resume: bool,
    events: Option<Arc<Progress>>,
    checked: Option<Arc<Progress>>,
) -> ReplyResult {
    let mut decoder = Decoder::new(REPLY_MAX_FRAME);
    let mut buf = BytesMut::with_capacity(8 << 10);
    let mut failures = Vec::new();
    let mut partial: Option<Partial> = None;
    loop {
        while let Some(frame) = decoder
            .decode(&mut buf)
            .map_err(|source| Error::Decode { stream: 0, source })?
        {
            match frame {
                Frame::Error(e) if e.fatal => return Err(Error::from_frame(&e)),
                Frame::Error(e) => {
                    let failure = Failure::from_frame(Side::Receiver, &e);
                    if let Some(p) = &events {
                        p.event(|| Event::Failed(failure.clone()));
                    }
                    if failures.len() < crate::report::MAX_FAILURES {
                        failures.push(failure);
                    }
                }
                Frame::Done(summary) => return Ok((summary, failures)),
                Frame::Deleted(d) => {
                    if let Some(p) = &events {
                        p.deleted(d.path, d.entries);
                    }
                }
                // The receiver is still at work: its bytes moved, which is all it says.
                Frame::Busy => {}
                Frame::Partial(p) if resume => {
                    if let Some(progress) = &checked {
                        progress.add_checked(p.hashes.len() as u64 * p.block);
                    }
                    // A long hash comes in pieces: later ones add to the first.
                    match &mut partial {
                        Some(have) if have.id == p.id && have.block == p.block => {
                            if have.hashes.len() + p.hashes.len() > fastcp_proto::MAX_PARTIAL_HASHES
                            {
                                return Err(Error::Protocol(
                                    "more block hashes than a partial file may have".into(),
                                ));
                            }
                            have.hashes.extend(p.hashes);
                        }
                        _ => partial = Some(p),
                    }
                }
                Frame::Answer(a) if answers.is_some() => {
                    // With `checksum`, a file the receiver holds at the same size may be
                    // sent after all, with the partial file it offered.
                    let offer = partial.take().filter(|p| p.id == a.id);
                    // The producer may be gone already (a stopped transfer): nothing to do.
                    let at = Instant::now();
                    let _ = answers.as_ref().map(|tx| tx.send((a, offer, at)));
                }
                other => {
                    return Err(Error::Protocol(format!(
                        "unexpected {} frame from the receiver",
                        other.name()
                    )));
                }
            }
        }
        let n = r
            .read_buf(&mut buf)
            .await
            .map_err(|e| stream_error(0, e, "reading the receiver's replies"))?;
        if n == 0 {
            return Err(Error::ConnectionClosed {
                stream: 0,
                during: "reading the receiver's replies",
            });
        }
    }
}

/// What the writer tasks share.
struct WriteCtx {
    budget: Arc<Budget>,
    queued: Arc<Vec<AtomicUsize>>,
    progress: Arc<Progress>,
    pool: Arc<Pool>,
    /// `None` without [`SendConfig::file_checksums`].
    checksum: Option<Algorithm>,
}

/// Drains one stream's queue into the stream.
async fn write_stream<K: Sink>(
    i: usize,
    mut w: K,
    mut rx: mpsc::UnboundedReceiver<Msg>,
    ctx: WriteCtx,
) -> Result<K, Error> {
    let WriteCtx {
        budget,
        queued,
        progress,
        pool,
        checksum,
    } = ctx;
    let mut end_frame = BytesMut::with_capacity(FILE_END_LEN);
    let fail = |e| stream_error(i, e, "while sending");
    loop {
        let mut msg = match rx.try_recv() {
            Ok(m) => m,
            Err(mpsc::error::TryRecvError::Empty) => {
                // Nothing queued: push out what is buffered before waiting.
                w.flush().await.map_err(fail)?;
                match rx.recv().await {
                    Some(m) => m,
                    None => break,
                }
            }
            Err(mpsc::error::TryRecvError::Disconnected) => break,
        };
        // The sink may seal the parts in place: whatever reads them comes first.
        let end = msg.end_of.map(|id| {
            let hash = checksum.map_or([0; 32], |c| c.whole(&msg.parts[1]));
            encode(&Frame::FileEnd(FileEnd { id, hash }), &mut end_frame);
            end_frame.split().freeze()
        });
        let payload_len = msg.parts[1].len();
        for part in &mut msg.parts {
            if !part.is_empty() {
                w.write(part).await.map_err(fail)?;
            }
        }
        if let Some(mut end) = end {
            w.write(&mut end).await.map_err(fail)?;
        }
        // A big frame ends a record of a stream that seals its bytes in records (the TCP
        // transport's), so the receiver, reading whole records, gets it without the next
        // frame's start behind it and can read that frame into a fresh block uncopied.
        if payload_len >= BIG_FRAME {
            w.flush().await.map_err(fail)?;
        }
        queued[i].fetch_sub(msg.len(), Relaxed);
        budget.release(msg.permit);
        progress.add_sent(msg.files, msg.data);
        if msg.recycle {
            let [_, payload, _] = msg.parts;
            pool.give(payload);
        }
    }
    w.flush().await.map_err(fail)?;
    Ok(w)
}

/// The producer's handle on the stream queues.
struct Out {
    txs: Vec<mpsc::UnboundedSender<Msg>>,
    queued: Arc<Vec<AtomicUsize>>,
    /// What was queued on each stream, for its `Done`.
    counts: Vec<Summary>,
    budget: Arc<Budget>,
    next: usize,
    /// Small files read for each stream and not yet queued, when the senders' checksums
    /// need no pass over the content (none, or ranges only); empty otherwise. What is
    /// gathered for a stream is queued before anything else goes on it, once it holds
    /// [`GATHER`] bytes, and before the producer waits for the walk or the receiver.
    gathered: Vec<Gathered>,
    /// The checksum of the gathered files' `FileEnd`s, if any.
    checksum: Option<Algorithm>,
}

/// Whole small files, each as `File`, `Data` and `FileEnd` frames back to back, gathered for
/// one stream.
#[derive(Default)]
struct Gathered {
    buf: Vec<u8>,
    files: u64,
    data: u64,
}

impl Out {
    /// The stream with the fewest bytes queued, starting the search round-robin so that ties
    /// spread.
    fn pick(&mut self) -> usize {
        let n = self.txs.len();
        let start = self.next;
        self.next = (self.next + 1) % n;
        let mut best = start;
        let mut best_q = self.queued[start].load(Relaxed);
        for k in 1..n {
            if best_q == 0 {
                break;
            }
            let i = (start + k) % n;
            let q = self.queued[i].load(Relaxed);
            if q < best_q {
                best = i;
                best_q = q;
            }
        }
        best
    }

    /// Queues `msg` on stream `i`, after what was gathered for it.
    fn push(&mut self, i: usize, msg: Msg) -> Result<(), Closed> {
        self.queue_gathered(i)?;
        self.queue(i, msg)
    }

    fn queue(&mut self, i: usize, msg: Msg) -> Result<(), Closed> {
        let len = msg.len();
        self.queue_charged(i, msg, len)
    }

    /// Queues `msg`, taking `charge` bytes of the budget (what its buffers hold in memory).
    fn queue_charged(&mut self, i: usize, mut msg: Msg, charge: usize) -> Result<(), Closed> {
        let len = msg.len();
        msg.permit = self.budget.acquire(charge)?;
        self.queued[i].fetch_add(len, Relaxed);
        self.txs[i].send(msg).map_err(|_| Closed)
    }

    /// Whether a small file of `size` bytes goes into the buffer gathered for its stream.
    fn gathers(&self, size: u64) -> bool {
        !self.gathered.is_empty() && size < GATHER as u64
    }

    /// The buffer gathered for stream `i`, with room for `n` more bytes: what it held is
    /// queued first if they would not fit.
    fn gather_buffer(&mut self, i: usize, n: usize) -> Result<&mut Vec<u8>, Closed> {
        let g = &self.gathered[i];
        if !g.buf.is_empty() && g.buf.capacity() - g.buf.len() < n {
            self.queue_gathered(i)?;
        }
        let g = &mut self.gathered[i];
        if g.buf.capacity() == 0 {
            // A buffer of its own, not a chunk buffer from the pool: gathered buffers
            // outnumber the pool's spares whenever the budget is spent, and the fresh
            // chunk buffers taken then faulted their pages in (see BENCHMARKS.md).
            g.buf = Vec::with_capacity((2 * GATHER).max(n));
        }
        g.buf.reserve(n);
        Ok(&mut g.buf)
    }

    /// Counts a file just gathered for stream `i`, and queues the buffer once it is full.
    fn gathered_file(&mut self, i: usize, size: u64) -> Result<(), Closed> {
        let g = &mut self.gathered[i];
        g.files += 1;
        g.data += size;
        if g.buf.len() >= GATHER {
            self.queue_gathered(i)?;
        }
        Ok(())
    }

    /// Queues what was gathered for stream `i`, as one message.
    fn queue_gathered(&mut self, i: usize) -> Result<(), Closed> {
        let Some(g) = self.gathered.get_mut(i) else {
            return Ok(());
        };
        if g.buf.is_empty() {
            return Ok(());
        }
        let g = std::mem::take(g);
        let charge = g.buf.capacity();
        let mut msg = Msg::parts(Bytes::new(), Bytes::from(g.buf), Bytes::new());
        msg.files = g.files;
        msg.data = g.data;
        self.queue_charged(i, msg, charge)
    }

    /// Queues what was gathered for every stream (before the producer waits).
    fn queue_all_gathered(&mut self) -> Result<(), Closed> {
        for i in 0..self.gathered.len() {
            self.queue_gathered(i)?;
        }
        Ok(())
    }
}

struct Producer<'a> {
    config: SendConfig,
    pool: Arc<Pool>,
    progress: Arc<Progress>,
    out: &'a mut Out,
    next_id: u64,
    failures: Vec<Failure>,
    probes: Probes,
    /// With `hard_links`: the wire path each multiply-named file was first sent under.
    names: HashMap<(u64, u64), Bytes>,
    /// With `hard_links` and `skip_unchanged`: the first name each further name sent as a
    /// `HardLink` entry links to, and the first names the receiver had unchanged. A further
    /// name of an unchanged file counts as skipped, as the receiver counts one it finds in
    /// place: its bytes did not travel either.
    linked: Vec<Bytes>,
    unchanged_names: HashSet<Bytes>,
    /// With `hard_links` and `skip_unchanged`: the first names of multiply-named files.
    first_names: HashSet<Bytes>,
    /// User and group names by id, with `attrs`.
    owners: crate::attrs::Names,
    /// Bytes the receiver's partial files held, sent as `Keep`s (`resume`).
    resumed: u64,
    /// Bytes of sparse sources' holes, sent as `Hole`s.
    holes: u64,
    /// Where this side's events go, when it reports them.
    events: Option<Arc<Progress>>,
}

/// How many probes may be outstanding, given how long the first batch took to be answered
/// (`None` before then): enough to keep the receiver busy over that round trip, and no more.
/// A window much larger than the round trip needs only fills the buffers on the way: over
/// SSH on loopback, sshd grew and moved its buffers for 120-160 ms at a rerun's start with
/// 16,384 probes outstanding, and the whole rerun took 0.50 s against 0.39 s with 4,096.
fn probe_window(first_answer: Option<Duration>) -> usize {
    let needed = first_answer.map_or(0, |rtt| rtt.as_nanos() / PROBE_EVERY.as_nanos());
    usize::try_from(needed)
        .unwrap_or(usize::MAX)
        .clamp(PROBE_WINDOW_MIN, PROBE_WINDOW_MAX)
}

/// An answer to a probe, the partial file's hashes offered with it (`resume`), and when it
/// came in: the first one's time sizes the probe window.
type Answered = (Answer, Option<Partial>, Instant);

/// The quick check's state in the producer: the files asked about and not yet answered.
struct Probes {
    answers: std::sync::mpsc::Receiver<Answered>,
    /// Probe id to the file's path and wire path, size (for the skipped count) and, with
    /// `checksum`, its content hash (`None` if it could not be read: it is then sent, and
    /// the send reports why).
    waiting: Outstanding<(PathBuf, Bytes, u64, Option<u128>)>,
    /// Files and bytes skipped.
    skipped: (u64, u64),
    /// Probes (and their `Attrs`) encoded and not yet handed to stream 0, and how many.
    batch: BytesMut,
    batched: usize,
    /// How many may be outstanding ([`probe_window`]).
    window: usize,
    /// When the first batch went, until its first answer came back (then `None`).
    first_sent: Option<Instant>,
    /// Whether an answer has come back yet.
    answered: bool,
}

/// Values by id, for ids given out in order and mostly taken back in order: a queue from
/// the oldest id still held, rather than a map.
struct Outstanding<T> {
    /// The id of the queue's front.
    first: u64,
    slots: VecDeque<Option<T>>,
}

impl<T> Default for Outstanding<T> {
    fn default() -> Self {
        Outstanding {
            first: 0,
            slots: VecDeque::new(),
        }
    }
}

impl<T> Outstanding<T> {
    /// The id the next value pushed gets (the first is 0).
    fn next_id(&self) -> u64 {
        self.first + self.slots.len() as u64
    }

    /// Holds a value under [`next_id`](Self::next_id).
    fn push(&mut self, value: T) {
        self.slots.push_back(Some(value));
    }

    /// Takes `id`'s value back; `None` for an id not held (never given, or already taken).
    fn take(&mut self, id: u64) -> Option<T> {
        let i = usize::try_from(id.checked_sub(self.first)?).ok()?;
        let value = self.slots.get_mut(i)?.take()?;
        while let Some(None) = self.slots.front() {
            self.slots.pop_front();
            self.first += 1;
        }
        Some(value)
    }

    /// From the oldest id still held to the newest: what bounds the queue.
    fn span(&self) -> usize {
        self.slots.len()
    }

    fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }
}

impl Producer<'_> {
    fn run(&mut self, mut walk: mpsc::Receiver<Vec<WalkItem>>) -> Result<(), Closed> {
        let mut walked = Vec::new().into_iter();
        loop {
            let Some(item) = walked.next() else {
                walked = match walk.try_recv() {
                    Ok(batch) => batch,
                    Err(mpsc::error::TryRecvError::Disconnected) => break,
                    Err(mpsc::error::TryRecvError::Empty) => {
                        // Nothing to add to the probe batch for now: let it go before waiting.
                        self.before_waiting()?;
                        match walk.blocking_recv() {
                            Some(batch) => batch,
                            None => break,
                        }
                    }
                }
                .into_iter();
                continue;
            };
            match item {
                Err(e) => {
                    let e = match self.config.specials_refused {
                        true => e.without_option_hint(),
                        false => e,
                    };
                    let path = match &e {
                        Error::Io { path, .. }
                        | Error::Unsupported { path, .. }
                        | Error::SourceChanged { path }
                        | Error::SourceVanished { path } => {
                            Bytes::copy_from_slice(path.as_os_str().as_encoded_bytes())
                        }
                        _ => Bytes::new(),
                    };
                    let s = self.out.pick();
                    self.fail(s, path, &e)?;
                }
                Ok(entry) => match entry.kind {
                    EntryKind::Dir => {
                        let frame = Frame::Dir(DirEntry {
                            path: entry.wire.clone(),
                            meta: self.meta(entry.meta),
                        });
                        self.announce(&entry, frame, |c| c.dirs += 1)?;
                        // A mirroring receiver leaves what a mount point holds.
                        if entry.unentered && self.config.version >= 11 {
                            let frame = Frame::Unentered(Unentered {
                                path: entry.wire.clone(),
                            });
                            let s = self.out.pick();
                            self.out.push(s, Msg::frame(&frame))?;
                        }
                    }
                    EntryKind::Symlink { ref target } => {
                        let frame = Frame::Symlink(SymlinkEntry {
                            path: entry.wire.clone(),
                            target: target.clone(),
                            times: self.link_times(entry.meta),
                        });
                        self.announce(&entry, frame, |c| c.symlinks += 1)?;
                    }
                    EntryKind::Special { kind, rdev } => {
                        let frame = Frame::Special(SpecialEntry {
                            path: entry.wire.clone(),
                            kind,
                            rdev,
                            meta: self.meta(entry.meta),
                        });
                        self.announce(&entry, frame, |c| c.files += 1)?;
                    }
                    EntryKind::File { .. }
                        if self.config.hard_links
                            && let Some(first) = entry.inode.and_then(|i| self.names.get(&i)) =>
                    {
                        if self.config.skip_unchanged {
                            self.linked.push(first.clone());
                        }
                        let frame = Frame::HardLink(HardLink {
                            path: entry.wire,
                            target: first.clone(),
                        });
                        let s = self.out.pick();
                        self.out.counts[s].files += 1;
                        self.out.push(s, Msg::frame(&frame))?;
                    }
                    EntryKind::File { size } if self.config.skip_unchanged => {
                        self.first_name(&entry);
                        self.probe(entry.path, entry.wire, size, entry.meta, entry.owner)?;
                    }
                    EntryKind::File { .. } => {
                        self.first_name(&entry);
                        self.file(&entry.path, entry.wire, None)?
                    }
                },
            }
            // Send what the receiver asked for as soon as it asked.
            while let Ok(a) = self.probes.answers.try_recv() {
                self.answered(a)?;
            }
        }
        while !self.probes.waiting.is_empty() {
            let a = self.next_answer()?;
            self.answered(a)?;
        }
        self.before_waiting()?;
        for s in 0..self.out.txs.len() {
            let done = Frame::Done(self.out.counts[s]);
            self.out.push(s, Msg::frame(&done))?;
        }
        Ok(())
    }

    /// Remembers the wire path a file with several names is first sent under (`-H`).
    fn first_name(&mut self, entry: &crate::Entry) {
        if let (true, Some(inode)) = (self.config.hard_links, entry.inode) {
            self.names.insert(inode, entry.wire.clone());
            if self.config.skip_unchanged {
                self.first_names.insert(entry.wire.clone());
            }
        }
    }

    /// Asks the receiver about a file on stream 0 (see [`SendConfig::skip_unchanged`]),
    /// waiting for an answer first when too many are outstanding.
    fn probe(
        &mut self,
        path: PathBuf,
        wire: Bytes,
        size: u64,
        meta: Meta,
        owner: (u32, u32),
    ) -> Result<(), Closed> {
        while self.probes.waiting.span() >= self.probes.window {
            let a = self.next_answer()?;
            self.answered(a)?;
        }
        let id = self.probes.waiting.next_id();
        let frame = Frame::Probe(Probe {
            id,
            path: wire.clone(),
            size,
            mtime: meta.mtime,
            mtime_nsec: meta.mtime_nsec,
            // A receiver of version 5 brings a file it skips in line with the mode.
            mode: (self.config.version >= 5).then_some(meta.mode),
        });
        // With version 5, the attributes too (a file it sends gets them again, with its
        // `File` entry), just before it.
        if self.config.version >= 5 && self.config.attrs.any() {
            match crate::attrs::read(
                &wire,
                Source::Path(&path, owner),
                &self.config.attrs,
                &mut self.owners,
            ) {
                Ok(a) => encode(&Frame::Attrs(a), &mut self.probes.batch),
                Err(e) => self.fail(0, wire.clone(), &Error::io(&path, e))?,
            }
        }
        encode(&frame, &mut self.probes.batch);
        self.probes.batched += 1;
        // The receiver hashes its copy while we hash ours: a file that takes long to hash
        // has its probe sent first.
        if self.probes.batched >= PROBE_BATCH
            || self.probes.batch.len() >= PROBE_BATCH_BYTES
            || (self.config.checksum && size >= HASH_AHEAD)
        {
            self.flush_probes()?;
        }
        let hash = if self.config.checksum {
            // As the walk went: a symlink is followed (the walk found a file there).
            crate::checksum::open_to_hash(
                rustix::fs::CWD,
                path.as_os_str().as_encoded_bytes(),
                true,
            )
            .map_err(std::io::Error::from)
            .and_then(|f| {
                crate::checksum::content_hash(self.config.content_hash, f, &self.progress)
            })
            .ok()
        } else {
            None
        };
        self.probes.waiting.push((path, wire, size, hash));
        Ok(())
    }

    /// The next answer to a probe: one that has come, or else one waited for, once what is
    /// batched and gathered has gone.
    fn next_answer(&mut self) -> Result<Answered, Closed> {
        if let Ok(a) = self.probes.answers.try_recv() {
            return Ok(a);
        }
        self.before_waiting()?;
        self.probes.answers.recv().map_err(|_| Closed)
    }

    /// Lets go of what is batched and gathered, before waiting for the walk or the
    /// receiver.
    fn before_waiting(&mut self) -> Result<(), Closed> {
        self.flush_probes()?;
        self.out.queue_all_gathered()
    }

    /// Hands the batched probes to stream 0.
    fn flush_probes(&mut self) -> Result<(), Closed> {
        if self.probes.batched == 0 {
            return Ok(());
        }
        self.probes.batched = 0;
        let batch = self.probes.batch.split().freeze();
        // Ahead of the files gathered for stream 0: no probe waits for one, and the first
        // batch's round trip sizes the probe window.
        self.out
            .queue(0, Msg::parts(batch, Bytes::new(), Bytes::new()))?;
        if !self.probes.answered && self.probes.first_sent.is_none() {
            self.probes.first_sent = Some(Instant::now());
        }
        Ok(())
    }

    /// Sends or skips the file a probe asked about. An answer to no outstanding probe (a
    /// broken or hostile receiver) is ignored: it can only stop a file from being sent, and
    /// the receiver then does not have it.
    fn answered(&mut self, (a, offer, at): Answered) -> Result<(), Closed> {
        if !self.probes.answered {
            self.probes.answered = true;
            let rtt = self
                .probes
                .first_sent
                .take()
                .map(|t| at.saturating_duration_since(t));
            self.probes.window = probe_window(rtt);
        }
        let Some((path, wire, size, hash)) = self.probes.waiting.take(a.id) else {
            return Ok(());
        };
        let differs = self.config.checksum && (hash.is_none() || a.hash != hash);
        if a.send || differs {
            self.file(&path, wire, offer)
        } else {
            self.probes.skipped.0 += 1;
            self.probes.skipped.1 += size;
            if self.first_names.contains(&wire) {
                self.unchanged_names.insert(wire.clone());
            }
            // Counted by the receiver when it shares this side's Progress.
            if let Some(p) = &self.events {
                p.add_skipped(size);
            }
            self.event(|| Event::Skipped {
                path: wire,
                size,
                reason: SkipReason::of(self.config.checksum),
            });
            Ok(())
        }
    }

    /// What travels of an entry's metadata: the mode always; the times with `preserve`, the
    /// access time only to a peer of version 2 or later.
    fn meta(&self, meta: Meta) -> Meta {
        if !self.config.preserve {
            Meta {
                mode: meta.mode,
                ..Meta::default()
            }
        } else if self.config.version < 2 {
            Meta {
                atime: None,
                ..meta
            }
        } else {
            meta
        }
    }

    /// A symlink's own times, with `preserve` to a peer of version 2 or later.
    fn link_times(&self, meta: Meta) -> Option<LinkTimes> {
        if !self.config.preserve || self.config.version < 2 {
            return None;
        }
        let (atime, atime_nsec) = meta.atime.unwrap_or((meta.mtime, meta.mtime_nsec));
        Some(LinkTimes {
            mtime: meta.mtime,
            mtime_nsec: meta.mtime_nsec,
            atime,
            atime_nsec,
        })
    }

    /// Sends a directory, link or special entry on the least loaded stream, after its
    /// `Attrs`, and counts it there.
    fn announce(
        &mut self,
        entry: &crate::Entry,
        frame: Frame,
        count: impl FnOnce(&mut Summary),
    ) -> Result<(), Closed> {
        let s = self.out.pick();
        let from = Source::Path(&entry.path, entry.owner);
        self.attrs(s, &entry.wire, &entry.path, from)?;
        count(&mut self.out.counts[s]);
        self.out.push(s, Msg::frame(&frame))
    }

    /// With `attrs`: sends the owner and extended attributes of the entry about to go on
    /// stream `s`. When they cannot be read, the entry still goes, without them, and the
    /// failure is reported.
    fn attrs(
        &mut self,
        s: usize,
        wire: &Bytes,
        path: &Path,
        from: Source<'_>,
    ) -> Result<(), Closed> {
        if !self.config.attrs.any() {
            return Ok(());
        }
        match crate::attrs::read(wire, from, &self.config.attrs, &mut self.owners) {
            Ok(a) => self.out.push(s, Msg::frame(&Frame::Attrs(a))),
            Err(e) => self.fail(s, wire.clone(), &Error::io(path, e)),
        }
    }

    /// Records a failed entry and tells the receiver on stream `s`.
    fn fail(&mut self, s: usize, path: Bytes, e: &Error) -> Result<(), Closed> {
        let frame = ErrorFrame {
            code: e.code(),
            fatal: false,
            path,
            message: e.to_string(),
        };
        let failure = Failure::from_frame(Side::Sender, &frame);
        self.event(|| Event::Failed(failure.clone()));
        if self.failures.len() < crate::report::MAX_FAILURES {
            self.failures.push(failure);
        }
        self.out.counts[s].errors += 1;
        self.out.push(s, Msg::frame(&Frame::Error(frame)))
    }

    /// Sends one regular file, or the pieces of it that this run sends; with the receiver's
    /// `offer` (`--resume`), a block it holds already goes as a `Keep`.
    fn file(&mut self, path: &Path, wire: Bytes, offer: Option<Partial>) -> Result<(), Closed> {
        let pieces = self.config.pieces.clone();
        match pieces.as_ref().and_then(|p| p.get(&wire)) {
            Some(pieces) => {
                for piece in pieces {
                    self.file_or_piece(path, wire.clone(), None, Some(*piece))?;
                }
                Ok(())
            }
            None => self.file_or_piece(path, wire, offer, None),
        }
    }

    /// Sends a regular file whole, or `piece` of it.
    fn file_or_piece(
        &mut self,
        path: &Path,
        wire: Bytes,
        offer: Option<Partial>,
        piece: Option<Piece>,
    ) -> Result<(), Closed> {
        // A source named at the top was walked through its link, if it is one.
        let top = !wire.contains(&b'/');
        let (fd, size, meta, allocated) = match open_source(path, self.config.follow_links || top) {
            Ok(v) => v,
            Err(e) => {
                let s = self.out.pick();
                return self.fail(s, wire, &e);
            }
        };
        self.progress.set_current(&wire);
        self.event(|| Event::Started {
            path: wire.clone(),
            size,
        });
        if let Some(p) = piece {
            let refused = if p.size != size {
                Some(Error::SourceChanged { path: path.into() })
            } else if self.config.version < 6 {
                Some(Error::Protocol(
                    "the receiver's fastcp is too old for a piece of a file".into(),
                ))
            } else {
                None
            };
            if let Some(e) = refused {
                let s = self.out.pick();
                return self.fail(s, wire, &e);
            }
        }
        let id = self.next_id;
        self.next_id += 1;
        let mtime = (meta.mtime, meta.mtime_nsec);
        let mut file = FileEntry {
            id,
            path: wire.clone(),
            size,
            meta: self.meta(meta),
        };
        if piece.is_some() {
            // The receiver tells the runs' versions of the source apart by its time, with
            // `-p` or without (it sets the time only with `-p`).
            (file.meta.mtime, file.meta.mtime_nsec) = mtime;
        }
        // The bytes this run sends: the whole file, or its piece.
        let (start, stop) = piece.map_or((0, size), |p| (p.offset, p.offset + p.len));
        let entry = match piece {
            Some(p) => Frame::Piece(PieceEntry {
                file,
                offset: p.offset,
                len: p.len,
            }),
            None => Frame::File(file),
        };
        let chunk = self.config.chunk_size as u64;

        if size <= chunk && piece.is_none() {
            if self.out.gathers(size) {
                return self.gather(path, wire, &fd, &entry, size, mtime);
            }
            // Small: the whole file in one message on one stream.
            let mut content = Vec::with_capacity(size as usize + 1);
            if let Err(e) = read_whole(path, &fd, size, mtime, &mut content) {
                let s = self.out.pick();
                return self.fail(s, wire, &e);
            }
            let content = Bytes::from(content);
            let s = self.out.pick();
            self.attrs(s, &wire, path, Source::Fd(&fd))?;
            let mut b = BytesMut::with_capacity(128 + wire.len());
            encode(&entry, &mut b);
            if size > 0 {
                encode_data_header(id, 0, content.len(), &mut b);
            }
            let counts = &mut self.out.counts[s];
            counts.files += 1;
            counts.bytes += size;
            let mut msg = Msg::parts(b.freeze(), content, Bytes::new());
            msg.files = 1;
            msg.data = size;
            msg.end_of = Some(id);
            self.out.push(s, msg)?;
            self.sent(wire, size);
            return Ok(());
        }

        // Big: the entry on one stream, chunks on whichever streams are least loaded.
        let home = self.out.pick();
        self.attrs(home, &wire, path, Source::Fd(&fd))?;
        self.out.counts[home].files += 1;
        self.out.push(home, Msg::frame(&entry))?;
        let mut hasher = self
            .config
            .file_checksums
            .then(|| Algorithm::for_sender(&self.config).sequential());
        // Offered blocks only make sense with the XXH3 checksum (version 4 has it). A block is
        // read whole before it can be kept: one larger than this side would give the file is
        // not taken, so that a receiver cannot make it hold more.
        let offer = offer.filter(|p| {
            self.config.resume
                && self.config.version >= 4
                && piece.is_none()
                && p.block <= crate::resume::block_size(size)
        });
        // A sparse source's holes, to a receiver that knows them (version 8): neither read
        // nor sent. Holes and the data between them are found in units of `align`: the
        // offered blocks, so that the chunks after a hole still start where they do, or
        // else [`HOLE_UNIT`], so that a few bytes of data cost that much, not a chunk.
        let mut holes = (self.config.version >= 8 && allocated < size).then(Holes::default);
        let align = offer.as_ref().map_or(HOLE_UNIT, |p| p.block);
        let mut offset = start;
        let mut kept = 0;
        while offset < stop {
            // The block the receiver's partial file offered at `offset`, if one starts there.
            let offered = offer.as_ref().and_then(|p| {
                let i = offset.is_multiple_of(p.block).then_some(offset / p.block)?;
                let hash = p.hashes.get(i as usize)?;
                Some((p.block.min(size - offset), *hash))
            });
            let hole = match &mut holes {
                Some(h) => match h.at(&fd, offset, stop, align) {
                    Ok(hole) => hole,
                    Err(source) => return self.fail(home, wire, &Error::io(path, source)),
                },
                None => None,
            };
            if let Some(mut end) = hole {
                // Within the blocks the receiver's partial file offered, a block at a time: one
                // it holds as zeros already is kept (a receiver over SFTP would otherwise write
                // its zeros again).
                if let Some((block, h)) = offered {
                    end = end.min(offset + block);
                    if end == offset + block && h == crate::checksum::zeros_hash(block) {
                        if let Some(hasher) = &mut hasher {
                            hasher.keep(offset, block, h);
                        }
                        self.keep(id, offset, block, &wire, size)?;
                        kept += block;
                        offset = end;
                        continue;
                    }
                }
                let len = end - offset;
                if let Some(hasher) = &mut hasher {
                    hasher.hole(offset, len);
                }
                let s = self.out.pick();
                let mut msg = Msg::frame(&Frame::Hole(Hole { id, offset, len }));
                // Done, as far as progress goes: a bar reaches its total.
                msg.data = len;
                self.out.push(s, msg)?;
                self.holes += len;
                if end < size {
                    self.event(|| Event::Progress {
                        path: wire.clone(),
                        done: end,
                        size,
                    });
                }
                offset = end;
                continue;
            }
            // A block the receiver offered: read whole, hashed, and kept if it matches.
            let (end, want) = match offered {
                Some((len, h)) => (offset + len, Some(h)),
                None => {
                    let end = offset + chunk.min(stop - offset);
                    // In a sparse file, up to the hole after the data (whole units of it).
                    let data_end = holes.as_ref().map_or(u64::MAX, |h| h.data_end(align));
                    (end.min(data_end.max(offset + 1)), None)
                }
            };
            let mut chunks = Vec::new();
            let mut block = want.map(|_| twox_hash::XxHash3_128::new());
            let mut at = offset;
            while at < end {
                let n = chunk.min(end - at) as usize;
                let bytes = match read_chunk(&fd, at, n, self.pool.take(n)) {
                    Ok(b) => b,
                    Err(ReadError::Io(source)) => {
                        return self.fail(home, wire, &Error::io(path, source));
                    }
                    Err(ReadError::Changed) => {
                        return self.fail(home, wire, &Error::SourceChanged { path: path.into() });
                    }
                };
                if let Some(b) = &mut block {
                    b.write(&bytes);
                }
                chunks.push((at, bytes));
                at += n as u64;
            }
            if let (Some(b), Some(h)) = (&block, want)
                && b.finish_128() == h
            {
                let len = end - offset;
                if let Some(hasher) = &mut hasher {
                    hasher.keep(offset, len, h);
                }
                for (_, bytes) in chunks {
                    self.pool.give(bytes);
                }
                self.keep(id, offset, len, &wire, size)?;
                kept += len;
                offset = end;
                continue;
            }
            for (at, bytes) in chunks {
                let n = bytes.len();
                if let Some(hasher) = &mut hasher {
                    hasher.update(at, &bytes);
                }
                let mut head = BytesMut::with_capacity(fastcp_proto::HEADER_LEN + 16);
                encode_data_header(id, at, n, &mut head);
                let s = self.out.pick();
                self.out.counts[s].bytes += n as u64;
                let mut msg = Msg::parts(head.freeze(), bytes, Bytes::new());
                msg.data = n as u64;
                msg.recycle = true;
                self.out.push(s, msg)?;
                let done = at + n as u64;
                if done < size {
                    self.event(|| Event::Progress {
                        path: wire.clone(),
                        done,
                        size,
                    });
                }
            }
            offset = end;
        }
        match at_eof(&fd, size).and_then(|eof| Ok(eof && unchanged(&fd, size, mtime)?)) {
            Ok(true) => {}
            Ok(false) => {
                return self.fail(home, wire, &Error::SourceChanged { path: path.into() });
            }
            Err(source) => return self.fail(home, wire, &Error::io(path, source)),
        }
        let end = Frame::FileEnd(FileEnd {
            id,
            hash: hasher.map_or([0; 32], |h| h.finish()),
        });
        let s = self.out.pick();
        let mut msg = Msg::frame(&end);
        msg.files = 1;
        self.out.push(s, msg)?;
        if kept > 0 {
            self.event(|| Event::Resumed {
                path: wire.clone(),
                kept,
            });
        }
        self.sent(wire, stop - start);
        Ok(())
    }

    /// Sends a `Keep` for the `len` bytes at `offset` of file `id` (of `size` bytes, at
    /// `wire`) that the receiver's partial file holds, and counts them as resumed.
    fn keep(
        &mut self,
        id: u64,
        offset: u64,
        len: u64,
        wire: &Bytes,
        size: u64,
    ) -> Result<(), Closed> {
        let s = self.out.pick();
        self.out
            .push(s, Msg::frame(&Frame::Keep(Keep { id, offset, len })))?;
        self.resumed += len;
        // Counted by the receiver when it shares this side's Progress.
        if let Some(p) = &self.events {
            p.add_resumed(len);
        }
        let end = offset + len;
        if end < size {
            self.event(|| Event::Progress {
                path: wire.clone(),
                done: end,
                size,
            });
        }
        Ok(())
    }

    /// Reports an event, when this side reports them.
    fn event(&self, event: impl FnOnce() -> Event) {
        if let Some(p) = &self.events {
            p.event(event);
        }
    }

    /// Sends a small file whole in the buffer gathered for the least loaded stream: its
    /// `File` entry, its content read straight into the buffer, and its `FileEnd`, whose
    /// checksum needs no pass over the content (see [`Out::gathered`]).
    fn gather(
        &mut self,
        path: &Path,
        wire: Bytes,
        fd: &OwnedFd,
        entry: &Frame,
        size: u64,
        mtime: (i64, u32),
    ) -> Result<(), Closed> {
        let Frame::File(FileEntry { id, .. }) = *entry else {
            unreachable!("a whole small file goes as a File entry")
        };
        let mut head = BytesMut::with_capacity(128 + wire.len());
        encode(entry, &mut head);
        if size > 0 {
            encode_data_header(id, 0, size as usize, &mut head);
        }
        let checksum = self.out.checksum;
        let s = self.out.pick();
        // One byte more than the file has, to see one that grew.
        let buf = self
            .out
            .gather_buffer(s, head.len() + size as usize + 1 + FILE_END_LEN)?;
        let mark = buf.len();
        buf.extend_from_slice(&head);
        let start = buf.len();
        if let Err(e) = read_whole(path, fd, size, mtime, buf) {
            buf.truncate(mark);
            return self.fail(s, wire, &e);
        }
        let hash = checksum.map_or([0; 32], |c| c.whole(&buf[start..]));
        head.clear();
        encode(&Frame::FileEnd(FileEnd { id, hash }), &mut head);
        buf.extend_from_slice(&head);
        let counts = &mut self.out.counts[s];
        counts.files += 1;
        counts.bytes += size;
        self.out.gathered_file(s, size)?;
        self.sent(wire, size);
        Ok(())
    }

    /// A file's last byte is on its way.
    fn sent(&self, path: Bytes, bytes: u64) {
        self.event(|| Event::Done {
            path,
            bytes,
            verified: false,
        });
    }
}

enum ReadError {
    Io(io::Error),
    /// The file is not the size it had when opened.
    Changed,
}

/// The unit a sparse source's holes and data are found in, when no offered block sets it.
const HOLE_UNIT: u64 = 64 << 10;

/// Where a sparse source's data lies, asked of the file system (`SEEK_DATA`, `SEEK_HOLE`) as
/// the read goes through it.
#[derive(Default)]
struct Holes {
    /// The file holds data from the offset asked last up to here.
    data_until: u64,
}

impl Holes {
    /// Where the hole at `offset` ends, cut to a multiple of `align` unless it reaches
    /// `stop` (the end of what is sent); `None` when data starts at `offset`, or the hole
    /// there ends before the next multiple of `align` (its zeros are read and sent).
    fn at(&mut self, fd: &OwnedFd, offset: u64, stop: u64, align: u64) -> io::Result<Option<u64>> {
        use rustix::fs::{SeekFrom, seek};
        if offset < self.data_until {
            return Ok(None);
        }
        let data = match seek(fd, SeekFrom::Data(offset)) {
            Ok(d) => d,
            // No data after `offset`: a hole to the end.
            Err(rustix::io::Errno::NXIO) => stop,
            // A file system that cannot tell: all of it is data.
            Err(rustix::io::Errno::INVAL | rustix::io::Errno::OPNOTSUPP) => {
                self.data_until = u64::MAX;
                return Ok(None);
            }
            Err(e) => return Err(e.into()),
        };
        if data <= offset {
            self.data_until = match seek(fd, SeekFrom::Hole(offset)) {
                Ok(h) => h.max(offset + 1),
                Err(_) => u64::MAX,
            };
            return Ok(None);
        }
        let end = if data >= stop {
            stop
        } else {
            data - data % align.max(1)
        };
        if end > offset {
            return Ok(Some(end));
        }
        // A hole shorter than a unit: its zeros are read with the data after it.
        self.data_until = match seek(fd, SeekFrom::Hole(data)) {
            Ok(h) => h.max(data + 1),
            Err(_) => u64::MAX,
        };
        Ok(None)
    }

    /// Where the data found last ends, rounded up to a multiple of `align`.
    fn data_end(&self, align: u64) -> u64 {
        let align = align.max(1);
        self.data_until
            .checked_next_multiple_of(align)
            .unwrap_or(u64::MAX)
    }
}

/// Opens the file a walk yielded as the copy's sender opens it, and closes it again: what a
/// dry run learns of a file it would not be able to read (its error, as the copy would
/// report it), which a mirror must not run after. `follow_links` as in [`WalkConfig`].
///
/// ```
/// let dir = tempfile::tempdir().unwrap();
/// std::fs::write(dir.path().join("f"), b"x").unwrap();
/// let walk = fastcp_stream::walk(&[dir.path().join("f")], &Default::default());
/// for entry in walk {
///     assert!(fastcp_stream::check_readable(&entry.unwrap(), false).is_ok());
/// }
/// ```
pub fn check_readable(entry: &crate::Entry, follow_links: bool) -> Result<(), Error> {
    // A source named at the top was walked through its link, if it is one.
    let top = !entry.wire.contains(&b'/');
    open_source(&entry.path, follow_links || top).map(drop)
}

/// Opens a source file for reading and checks that it is a regular file; returns its size,
/// metadata as of the open, and the bytes the file system holds for it (less than its size
/// for a sparse file).
fn open_source(path: &Path, follow: bool) -> Result<(OwnedFd, u64, Meta, u64), Error> {
    // O_NONBLOCK: a FIFO swapped in since the walk must not hang us.
    let mut flags = OFlags::RDONLY | OFlags::CLOEXEC | OFlags::NONBLOCK;
    if !follow {
        flags |= OFlags::NOFOLLOW;
    }
    // The walk saw it a moment ago: gone now, it vanished.
    let fd = rustix::fs::open(path, flags, Mode::empty())
        .map_err(|e| crate::walk::vanished_or(path, e.into()))?;
    let st = rustix::fs::fstat(&fd).map_err(|e| Error::io(path, e.into()))?;
    if FileType::from_raw_mode(st.st_mode) != FileType::RegularFile {
        return Err(Error::SourceChanged { path: path.into() });
    }
    let meta = Meta {
        mode: st.st_mode & 0o7777,
        mtime: st.st_mtime,
        mtime_nsec: (st.st_mtime_nsec as u64).min(999_999_999) as u32,
        atime: Some((
            st.st_atime,
            (st.st_atime_nsec as u64).min(999_999_999) as u32,
        )),
    };
    let allocated = (st.st_blocks as u64).saturating_mul(512);
    Ok((fd, st.st_size as u64, meta, allocated))
}

fn retry<T>(mut f: impl FnMut() -> rustix::io::Result<T>) -> io::Result<T> {
    loop {
        match f() {
            Err(rustix::io::Errno::INTR) => continue,
            r => return r.map_err(Into::into),
        }
    }
}

/// Whether the open file still has the `size` and `mtime` it had when it was opened: a file rewritten in place at the same size while it was read has a new
/// mtime, and its copy would be torn.
fn unchanged(fd: &OwnedFd, size: u64, mtime: (i64, u32)) -> io::Result<bool> {
    let st = rustix::fs::fstat(fd)?;
    Ok(st.st_size as u64 == size
        && (
            st.st_mtime,
            (st.st_mtime_nsec as u64).min(999_999_999) as u32,
        ) == mtime)
}

/// Appends a whole file of `size` bytes to `v`, checking that it has exactly that many; `v`
/// may hold more than that afterwards when it fails.
fn read_small_into(fd: &OwnedFd, size: u64, v: &mut Vec<u8>) -> Result<(), ReadError> {
    let start = v.len();
    let end = start + size as usize;
    v.reserve(size as usize + 1);
    loop {
        let want = v.capacity() - v.len();
        let off = (v.len() - start) as u64;
        let n = retry(|| rustix::io::pread(fd, rustix::buffer::spare_capacity(&mut *v), off))
            .map_err(ReadError::Io)?;
        if v.len() > end {
            return Err(ReadError::Changed);
        }
        if n == 0 {
            return if v.len() == end {
                Ok(())
            } else {
                Err(ReadError::Changed)
            };
        }
        // A regular file returns less than asked only at its end: one read, not two.
        if n < want && v.len() == end {
            return Ok(());
        }
    }
}

/// Appends the whole file at `path` (`size` bytes, modified at `mtime` when it was opened) to
/// `v`, or says why it cannot be sent as it was: it could not be read, or it changed while it
/// was read. `v` may hold some of it afterwards when it fails.
fn read_whole(
    path: &Path,
    fd: &OwnedFd,
    size: u64,
    mtime: (i64, u32),
    v: &mut Vec<u8>,
) -> Result<(), Error> {
    let changed = || Error::SourceChanged { path: path.into() };
    match read_small_into(fd, size, v) {
        Ok(()) => {}
        Err(ReadError::Io(source)) => return Err(Error::io(path, source)),
        Err(ReadError::Changed) => return Err(changed()),
    }
    match unchanged(fd, size, mtime) {
        Ok(true) => Ok(()),
        Ok(false) => Err(changed()),
        Err(source) => Err(Error::io(path, source)),
    }
}

/// Reads exactly `n` bytes at `offset`.
fn read_chunk(fd: &OwnedFd, offset: u64, n: usize, mut v: Vec<u8>) -> Result<Bytes, ReadError> {
    while v.len() < n {
        let off = offset + v.len() as u64;
        let got = retry(|| rustix::io::pread(fd, rustix::buffer::spare_capacity(&mut v), off))
            .map_err(ReadError::Io)?;
        if got == 0 {
            return Err(ReadError::Changed);
        }
    }
    v.truncate(n);
    Ok(Bytes::from(v))
}

/// True when the file has no byte at `size`.
fn at_eof(fd: &OwnedFd, size: u64) -> io::Result<bool> {
    let mut one = [0u8; 1];
    let n = retry(|| rustix::io::pread(fd, &mut one, size))?;
    Ok(n == 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Answers in any order find their probe once; unknown and repeated ids find nothing;
    /// the queue shrinks as its oldest ids are taken.
    #[test]
    fn outstanding_probes_are_taken_once_in_any_order() {
        let mut w = Outstanding::default();
        for id in 0..4 {
            assert_eq!(w.next_id(), id);
            w.push(id * 10);
        }
        assert_eq!(w.take(2), Some(20));
        assert_eq!(w.take(2), None, "taken twice");
        assert_eq!(w.take(9), None, "never given");
        assert_eq!(w.span(), 4, "the oldest is still held");
        assert_eq!(w.take(0), Some(0));
        assert_eq!(w.span(), 3);
        assert_eq!(w.take(1), Some(10));
        assert_eq!(w.span(), 1, "2 was taken already: only 3 is left");
        assert_eq!(w.take(0), None, "below the oldest held");
        assert_eq!(w.next_id(), 4);
        w.push(40);
        assert_eq!(w.take(4), Some(40));
        assert_eq!(w.take(3), Some(30));
        assert!(w.is_empty());
        assert_eq!(w.take(u64::MAX), None);
    }

    /// The probe window starts small, stays small on a short round trip, grows with a long
    /// one, and is capped.
    #[test]
    fn the_probe_window_follows_the_first_round_trip() {
        let ms = Duration::from_millis;
        assert_eq!(probe_window(None), PROBE_WINDOW_MIN);
        assert_eq!(probe_window(Some(Duration::ZERO)), PROBE_WINDOW_MIN);
        assert_eq!(probe_window(Some(ms(1))), PROBE_WINDOW_MIN, "loopback");
        assert_eq!(probe_window(Some(ms(10))), 10_000);
        assert_eq!(probe_window(Some(ms(15))), 15_000);
        assert_eq!(probe_window(Some(ms(50))), PROBE_WINDOW_MAX);
        assert_eq!(probe_window(Some(Duration::MAX)), PROBE_WINDOW_MAX);
    }

    /// The biggest `Partial` a receiver sends (a file of 16 GiB or more) reaches the
    /// producer with its answer.
    #[tokio::test]
    async fn replies_carry_a_partial_with_every_hash() {
        let hashes: Vec<u128> = (0..fastcp_proto::MAX_PARTIAL_HASHES as u128).collect();
        let mut wire = BytesMut::new();
        let partial = Partial {
            id: 7,
            block: 1 << 20,
            hashes: hashes.clone(),
        };
        encode(&Frame::Partial(partial), &mut wire);
        let answer = Answer {
            id: 7,
            send: true,
            hash: None,
        };
        encode(&Frame::Answer(answer), &mut wire);
        encode(&Frame::Done(Summary::default()), &mut wire);
        let (tx, rx) = std::sync::mpsc::channel();
        let done = read_replies(&wire[..], Some(tx), true, None, None).await;
        assert!(done.is_ok(), "{done:?}");
        let (got, offer, _) = rx.recv().unwrap();
        assert_eq!(got, answer);
        assert_eq!(offer.unwrap().hashes, hashes);
    }

    /// A long hash comes in pieces: they add up to one offer, the bytes they cover count as
    /// checked (progress, not a stall), and more hashes than a file may have are refused.
    #[tokio::test]
    async fn partial_pieces_add_up_and_count_as_progress() {
        let piece = |from: u128, n: usize| {
            Frame::Partial(Partial {
                id: 3,
                block: 1 << 20,
                hashes: (from..from + n as u128).collect(),
            })
        };
        let answer = Answer {
            id: 3,
            send: true,
            hash: None,
        };
        let mut wire = BytesMut::new();
        encode(&piece(0, 1024), &mut wire);
        encode(&piece(1024, 10), &mut wire);
        encode(&Frame::Answer(answer), &mut wire);
        encode(&Frame::Done(Summary::default()), &mut wire);
        let progress = Arc::new(Progress::default());
        let (tx, rx) = std::sync::mpsc::channel();
        let done = read_replies(&wire[..], Some(tx), true, None, Some(progress.clone())).await;
        assert!(done.is_ok(), "{done:?}");
        let (_, offer, _) = rx.recv().unwrap();
        assert_eq!(offer.unwrap().hashes, (0..1034).collect::<Vec<u128>>());
        assert_eq!(progress.snapshot().bytes_checked, 1034 << 20);

        let mut wire = BytesMut::new();
        let n = fastcp_proto::MAX_PARTIAL_HASHES;
        encode(&piece(0, n), &mut wire);
        encode(&piece(0, 1), &mut wire);
        let (tx, _rx) = std::sync::mpsc::channel();
        let done = read_replies(&wire[..], Some(tx), true, None, None).await;
        assert!(matches!(done, Err(Error::Protocol(_))), "{done:?}");
    }
}
