//! A copy between two peers that both run elsewhere, through this process: the frames a
//! sending peer writes on its streams are passed to a receiving peer's streams, each to the
//! stream of the same index, and the receiver's replies on stream 0 (quick-check answers,
//! per-entry errors, deletions, signs of life, its final `Done`) are passed back.
//!
//! Every frame is decoded (with the frame cap) and checked before it is passed on: the
//! entries' paths must be safe and, at the top level, among the names asked for; a frame
//! out of place for its direction ends the relay. What is passed on is the frame as decoded
//! and encoded again, never bytes that were not understood. The relay counts what passes
//! in a [`Progress`], as a sender counts what it sends, with the same [`Event`]s.
//!
//! Memory is bounded: one read buffer per stream (a frame at most) and the frames read but
//! not yet written, at most [`FLUSH_AT`] bytes of them, per stream; the files and probes
//! under way, at most [`MAX_TRACKED`] of each. With `checksum`, the path of each file the
//! receiver has already is kept until the end, as a receiver keeps it: only the sender,
//! comparing hashes, says whether it is skipped, by not sending it, and so these files
//! count as skipped (in the progress and the events too) only when the relay ends. With
//! `hard_links`, the names of the files skipped and the hard links passed on are kept until
//! the end too, as a receiver keeps every file's name: a further name of a skipped file
//! counts as skipped, as the receiver counts it.

use std::collections::HashMap;
use std::io;
use std::sync::{Arc, Mutex};

use bytes::{Bytes, BytesMut};
use fastcp_proto::{Decoder, ErrorFrame, Frame, Summary, encode, encode_data_header};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use crate::report::{Failure, Report, Side};
use crate::{Error, Event, Progress, SkipReason, stream_error};

/// Frames read and not yet written on one stream, in bytes, before they are written.
const FLUSH_AT: usize = 4 << 20;

/// The most files, and quick-check probes, a relay keeps track of at once: more than a
/// fastcp sender ever has outstanding.
const MAX_TRACKED: usize = 1 << 20;

/// How long a fatal error from one peer may take to reach the other before the relay ends.
const FATAL_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

/// What a [`relay`] checks and how it counts.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct RelayConfig {
    /// The largest frame payload passed on: the smaller of what both sessions agreed on.
    pub max_frame: u32,
    /// The only names accepted at the top level, as
    /// [`ReceiveConfig::expected_top_level`](crate::ReceiveConfig::expected_top_level):
    /// the names asked of the sending peer. `None` for any.
    pub expected_top_level: Option<Vec<Vec<u8>>>,
    /// The quick check compares content (`checksum`): what a skipped file's event says.
    /// The skipped files are known, and counted, only at the end (see the module's doc).
    pub checksum: bool,
    /// Hard links are kept (`-H`): each further name of a file the quick check skipped
    /// counts as skipped too, as [`ReceiveConfig::hard_links`](crate::ReceiveConfig) counts
    /// it (see the module's doc).
    pub hard_links: bool,
}

impl Default for RelayConfig {
    fn default() -> RelayConfig {
        RelayConfig {
            max_frame: fastcp_proto::DEFAULT_MAX_FRAME,
            expected_top_level: None,
            checksum: false,
            hard_links: false,
        }
    }
}

/// Why a [`relay`] stopped: the error, and the peer it came from (or whose stream failed).
#[derive(Debug, thiserror::Error)]
#[error("{error}")]
pub struct RelayError {
    /// The sending peer, or the receiving one.
    pub side: Side,
    /// What happened.
    pub error: Error,
}

impl RelayError {
    fn sender(error: Error) -> RelayError {
        RelayError {
            side: Side::Sender,
            error,
        }
    }

    fn receiver(error: Error) -> RelayError {
        RelayError {
            side: Side::Receiver,
            error,
        }
    }
}

/// Passes a copy from the sending peer's streams (`sender`) to the receiving peer's
/// (`receiver`), stream `i` to stream `i`, and the receiver's replies back, until the
/// receiver's final `Done` has reached the sender and the sender has ended its streams.
/// Both sets of streams must be of one session each, with the same number of streams, the
/// same protocol version and the same request flags. Returns the sender's totals as
/// [`Report::local`] and the receiver's as [`Report::peer`], with the failures of both.
///
/// A cut stream, a fatal error or a broken frame on either side ends the relay at once (a
/// fatal error is passed on first, so that the other peer says why it stops); the streams
/// are dropped, which ends both sessions.
///
/// ```
/// use std::sync::Arc;
/// use fastcp_stream::{Progress, ReceiveConfig, RelayConfig, SendConfig};
///
/// # #[tokio::main]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let dir = tempfile::tempdir()?;
/// std::fs::write(dir.path().join("a.txt"), b"hello")?;
/// // A sender and a receiver, each with its own pipe to the relay.
/// let (to_sender, sender_end) = tokio::io::duplex(1 << 16);
/// let (to_receiver, receiver_end) = tokio::io::duplex(1 << 16);
/// let (sources, dest) = ([dir.path().join("a.txt")], dir.path().join("b.txt"));
/// let (send, receive) = (SendConfig::default(), ReceiveConfig::default());
/// let config = RelayConfig::default();
/// let progress = Arc::new(Progress::default());
/// let (sent, relayed, received) = tokio::join!(
///     fastcp_stream::send(&sources, vec![sender_end], &send, Arc::default()),
///     fastcp_stream::relay(vec![to_sender], vec![to_receiver], &config, progress),
///     fastcp_stream::receive(&dest, vec![receiver_end], &receive, Arc::default()),
/// );
/// let (_, report, _) = (sent?, relayed?, received?);
/// assert_eq!((report.local.files, report.peer.files), (1, 1));
/// assert_eq!(std::fs::read(dir.path().join("b.txt"))?, b"hello");
/// # Ok(()) }
/// ```
pub async fn relay<S, R>(
    sender: Vec<S>,
    receiver: Vec<R>,
    config: &RelayConfig,
    progress: Arc<Progress>,
) -> Result<Report, RelayError>
where
    S: AsyncRead + AsyncWrite + Send + Unpin + 'static,
    R: AsyncRead + AsyncWrite + Send + Unpin + 'static,
{
    if sender.is_empty() || sender.len() != receiver.len() {
        return Err(RelayError::sender(Error::InvalidArgument(format!(
            "a relay needs as many streams on each side, at least one: {} and {}",
            sender.len(),
            receiver.len()
        ))));
    }
    let shared = Arc::new(Shared {
        config: config.clone(),
        progress,
        track: Mutex::new(Track::default()),
    });
    let mut tasks = tokio::task::JoinSet::new();
    // The sender reads replies on stream 0 only, and the receiver writes them there only;
    // the other halves stay open until the end.
    let mut idle = Vec::new();
    let mut back = None;
    for (i, (s, r)) in sender.into_iter().zip(receiver).enumerate() {
        let (s_read, s_write) = tokio::io::split(s);
        let (r_read, r_write) = tokio::io::split(r);
        tasks.spawn(forward(i, s_read, r_write, shared.clone()).map_task(Task::Forward));
        if i == 0 {
            back = Some((r_read, s_write));
        } else {
            idle.push((s_write, r_read));
        }
    }
    let (r_read, s_write) = back.expect("at least one stream");
    tasks.spawn(replies(r_read, s_write, shared.clone()).map_task(Task::Replies));
    let mut local = Summary::default();
    let mut peer = None;
    while let Some(joined) = tasks.join_next().await {
        let done = match joined {
            Ok(done) => done,
            Err(join) => Err(RelayError::sender(Error::Stream {
                stream: 0,
                source: io::Error::other(format!("relay task failed: {join}")),
            })),
        };
        match done {
            Ok(Task::Forward(s)) => {
                local.files += s.files;
                local.dirs += s.dirs;
                local.symlinks += s.symlinks;
                local.bytes += s.bytes;
                local.errors += s.errors;
            }
            Ok(Task::Replies(s)) => peer = Some(s),
            Err(e) => {
                let e = explained(e, &mut tasks).await;
                tasks.abort_all();
                return Err(e);
            }
        }
    }
    drop(idle);
    shared.settle_skipped();
    let track = lock(&shared.track);
    let mut report = Report {
        local,
        peer: peer.unwrap_or_default(),
        failures: Vec::new(),
        failure_count: 0,
        files_skipped: track.skipped.0,
        bytes_skipped: track.skipped.1,
        bytes_sent: local.bytes,
        bytes_resumed: track.resumed,
    };
    for f in &track.failures {
        report.push_failure(f.clone());
    }
    report.failure_count = track.failure_count;
    Ok(report)
}

/// The reason to report for a relay that stopped on `first`: when that is a cut stream,
/// a peer that stopped on purpose may still be saying why on another (its fatal error
/// frame), and that is the better reason; waits at most [`FATAL_WAIT`] for it.
async fn explained(
    first: RelayError,
    tasks: &mut tokio::task::JoinSet<Result<Task, RelayError>>,
) -> RelayError {
    let is_cut = |e: &RelayError| {
        matches!(
            e.error,
            Error::Stream { .. } | Error::ConnectionClosed { .. }
        )
    };
    if !is_cut(&first) {
        return first;
    }
    let deadline = tokio::time::Instant::now() + FATAL_WAIT;
    while let Ok(Some(joined)) = tokio::time::timeout_at(deadline, tasks.join_next()).await {
        if let Ok(Err(e)) = joined
            && !is_cut(&e)
        {
            return e;
        }
    }
    first
}

/// What a relay's tasks ended with: a stream's `Done` from the sender, or the receiver's.
enum Task {
    Forward(Summary),
    Replies(Summary),
}

trait MapTask: std::future::Future<Output = Result<Summary, RelayError>> + Sized {
    fn map_task(
        self,
        f: fn(Summary) -> Task,
    ) -> impl std::future::Future<Output = Result<Task, RelayError>> {
        async move { self.await.map(f) }
    }
}

impl<F: std::future::Future<Output = Result<Summary, RelayError>>> MapTask for F {}

/// What the relay's tasks share.
struct Shared {
    config: RelayConfig,
    progress: Arc<Progress>,
    track: Mutex<Track>,
}

/// The files under way, the probes unanswered, and what was counted.
#[derive(Default)]
struct Track {
    /// Each file under way by id: its path, size and bytes passed on.
    files: HashMap<u64, (Bytes, u64, u64)>,
    /// Each probe unanswered by id: its path and size.
    probes: HashMap<u64, (Bytes, u64)>,
    /// Files and bytes the quick check skipped.
    skipped: (u64, u64),
    /// With `checksum`: files answered "skip" whose `File` entry has not come (yet): the
    /// sender compares the hashes and may send them after all. Path -> size.
    maybe_skipped: HashMap<Bytes, u64>,
    /// With `hard_links`: the files skipped for certain (without `checksum`), by path, and
    /// each hard link passed on, (name, file).
    skipped_names: std::collections::HashSet<Bytes>,
    links: Vec<(Bytes, Bytes)>,
    /// Bytes the receiver's partial files held (`Keep`).
    resumed: u64,
    failures: Vec<Failure>,
    failure_count: u64,
}

impl Track {
    fn fail(&mut self, failure: Failure) {
        self.failure_count += 1;
        if self.failures.len() < crate::MAX_FAILURES {
            self.failures.push(failure);
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Frames decoded on one side and waiting to be written on the other: small frames encoded
/// together, file bytes as they were read.
#[derive(Default)]
struct Outbox {
    small: BytesMut,
    parts: Vec<Bytes>,
    len: usize,
}

impl Outbox {
    fn push(&mut self, frame: &Frame) {
        let before = self.small.len();
        match frame {
            // The file's bytes go on as they were read, uncopied.
            Frame::Data(d) if d.bytes.len() >= 4096 => {
                encode_data_header(d.id, d.offset, d.bytes.len(), &mut self.small);
                self.parts.push(self.small.split().freeze());
                self.parts.push(d.bytes.clone());
                self.len += d.bytes.len();
            }
            other => encode(other, &mut self.small),
        }
        self.len += self.small.len().saturating_sub(before);
    }

    async fn write_to<W: AsyncWrite + Unpin>(&mut self, w: &mut W) -> io::Result<()> {
        if !self.small.is_empty() {
            self.parts.push(self.small.split().freeze());
        }
        for part in self.parts.drain(..) {
            w.write_all(&part).await?;
        }
        self.len = 0;
        w.flush().await
    }
}

/// Reads frames from `r` into `buf` until one is whole; `Ok(None)` at the end of the stream
/// between frames.
async fn next_frame<R: AsyncRead + Unpin>(
    r: &mut R,
    buf: &mut BytesMut,
    decoder: &mut Decoder,
    stream: usize,
) -> Result<Option<Frame>, Error> {
    loop {
        if let Some(frame) = decoder
            .decode(buf)
            .map_err(|source| Error::Decode { stream, source })?
        {
            return Ok(Some(frame));
        }
        if buf.capacity() - buf.len() < 64 << 10 {
            buf.reserve(256 << 10);
        }
        let n = r
            .read_buf(buf)
            .await
            .map_err(|e| stream_error(stream, e, "relaying"))?;
        if n == 0 {
            if buf.is_empty() {
                return Ok(None);
            }
            return Err(Error::ConnectionClosed {
                stream,
                during: "relaying: the stream ended inside a frame",
            });
        }
    }
}

/// Whether a whole frame waits in `buf`, so that reading on may wait for no new bytes.
fn frame_ready(buf: &BytesMut) -> bool {
    buf.len() >= 5 && buf.len() >= 5 + u32::from_be_bytes([buf[1], buf[2], buf[3], buf[4]]) as usize
}

/// Passes stream `i` from the sender to the receiver; returns the sender's `Done` for it
/// once the sender has ended the stream.
async fn forward<R, W>(
    i: usize,
    mut r: R,
    mut w: W,
    shared: Arc<Shared>,
) -> Result<Summary, RelayError>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut decoder = Decoder::new(shared.config.max_frame);
    let mut buf = BytesMut::with_capacity(256 << 10);
    let mut out = Outbox::default();
    let mut done = None;
    let to_receiver = |e: io::Error| RelayError::receiver(stream_error(i, e, "relaying"));
    loop {
        if !frame_ready(&buf) || out.len >= FLUSH_AT {
            out.write_to(&mut w).await.map_err(to_receiver)?;
        }
        let frame = next_frame(&mut r, &mut buf, &mut decoder, i)
            .await
            .map_err(RelayError::sender)?;
        let Some(frame) = frame else {
            return match done {
                Some(summary) => {
                    let _ = w.shutdown().await;
                    Ok(summary)
                }
                None => Err(RelayError::sender(Error::ConnectionClosed {
                    stream: i,
                    during: "relaying, before the sender's end of the stream",
                })),
            };
        };
        shared.sender_frame(i, &frame).map_err(RelayError::sender)?;
        out.push(&frame);
        match frame {
            Frame::Done(summary) => done = Some(summary),
            Frame::Error(e) if e.fatal => {
                let _ = tokio::time::timeout(FATAL_WAIT, out.write_to(&mut w)).await;
                return Err(RelayError::sender(Error::from_frame(&e)));
            }
            _ => {}
        }
    }
}

/// Passes the receiver's replies on stream 0 back to the sender; returns the receiver's
/// final `Done` once the sender has it.
async fn replies<R, W>(mut r: R, mut w: W, shared: Arc<Shared>) -> Result<Summary, RelayError>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut decoder = Decoder::new(crate::send::REPLY_MAX_FRAME);
    let mut buf = BytesMut::with_capacity(64 << 10);
    let mut out = Outbox::default();
    let to_sender = |e: io::Error| RelayError::sender(stream_error(0, e, "relaying"));
    loop {
        if !frame_ready(&buf) || out.len >= FLUSH_AT {
            out.write_to(&mut w).await.map_err(to_sender)?;
        }
        let frame = next_frame(&mut r, &mut buf, &mut decoder, 0)
            .await
            .map_err(RelayError::receiver)?
            .ok_or_else(|| {
                RelayError::receiver(Error::ConnectionClosed {
                    stream: 0,
                    during: "relaying, before the receiver's report",
                })
            })?;
        shared
            .receiver_frame(&frame)
            .map_err(RelayError::receiver)?;
        out.push(&frame);
        match frame {
            Frame::Done(summary) => {
                out.write_to(&mut w).await.map_err(to_sender)?;
                let _ = w.shutdown().await;
                return Ok(summary);
            }
            Frame::Error(e) if e.fatal => {
                let _ = tokio::time::timeout(FATAL_WAIT, out.write_to(&mut w)).await;
                return Err(RelayError::receiver(Error::from_frame(&e)));
            }
            _ => {}
        }
    }
}

impl Shared {
    /// Checks and counts a frame of the sender's, on stream `i`.
    fn sender_frame(&self, i: usize, frame: &Frame) -> Result<(), Error> {
        let progress = &self.progress;
        match frame {
            Frame::Dir(d) => self.check_path(&d.path),
            Frame::Symlink(s) => self.check_path(&s.path),
            Frame::Special(s) => self.check_path(&s.path),
            Frame::Attrs(a) => self.check_path(&a.path),
            Frame::HardLink(h) => {
                self.check_path(&h.path)?;
                self.check_path(&h.target)?;
                if self.config.hard_links {
                    lock(&self.track)
                        .links
                        .push((h.path.clone(), h.target.clone()));
                }
                Ok(())
            }
            Frame::File(f) => {
                self.check_path(&f.path)?;
                let mut track = lock(&self.track);
                if track.files.len() >= MAX_TRACKED {
                    return Err(too_many("files under way"));
                }
                track.maybe_skipped.remove(&f.path);
                track.files.insert(f.id, (f.path.clone(), f.size, 0));
                progress.set_current(&f.path);
                progress.event(|| Event::Started {
                    path: f.path.clone(),
                    size: f.size,
                });
                Ok(())
            }
            Frame::Probe(p) => {
                self.check_path(&p.path)?;
                let mut track = lock(&self.track);
                if track.probes.len() >= MAX_TRACKED {
                    return Err(too_many("quick-check probes unanswered"));
                }
                track.probes.insert(p.id, (p.path.clone(), p.size));
                Ok(())
            }
            Frame::Data(d) => {
                self.advance(d.id, d.bytes.len() as u64, 0);
                Ok(())
            }
            Frame::Hole(h) => {
                self.advance(h.id, h.len, 0);
                Ok(())
            }
            Frame::Unentered(u) => self.check_path(&u.path),
            Frame::Keep(k) => {
                self.advance(k.id, 0, k.len);
                Ok(())
            }
            Frame::FileEnd(end) => {
                let file = lock(&self.track).files.remove(&end.id);
                progress.add_sent(1, 0);
                if let Some((path, size, _)) = file {
                    progress.event(|| Event::Done {
                        path,
                        bytes: size,
                        verified: false,
                    });
                }
                Ok(())
            }
            Frame::Totals(t) => {
                progress.set_totals(t.files, t.bytes);
                Ok(())
            }
            Frame::Error(e) if !e.fatal => {
                // Nor was a file skipped that the sender failed to read.
                lock(&self.track).maybe_skipped.remove(&e.path[..]);
                self.failed(Side::Sender, e);
                Ok(())
            }
            Frame::Error(_) | Frame::Done(_) => Ok(()),
            other => Err(Error::Protocol(format!(
                "unexpected {} frame from the sender on stream {i}",
                other.name()
            ))),
        }
    }

    /// Checks and counts a reply of the receiver's.
    fn receiver_frame(&self, frame: &Frame) -> Result<(), Error> {
        let progress = &self.progress;
        match frame {
            Frame::Answer(a) => {
                let mut track = lock(&self.track);
                let probe = track.probes.remove(&a.id);
                if let (false, Some((path, size))) = (a.send, probe) {
                    if self.config.checksum {
                        // Only the sender, comparing hashes, settles it.
                        track.maybe_skipped.insert(path, size);
                        return Ok(());
                    }
                    track.skipped.0 += 1;
                    track.skipped.1 += size;
                    if self.config.hard_links {
                        track.skipped_names.insert(path.clone());
                    }
                    drop(track);
                    self.skipped(path, size);
                }
                Ok(())
            }
            Frame::Partial(p) => {
                progress.add_checked((p.hashes.len() as u64).saturating_mul(p.block));
                Ok(())
            }
            Frame::Deleted(d) => {
                progress.deleted(Bytes::copy_from_slice(&d.path), d.entries);
                Ok(())
            }
            Frame::Error(e) if !e.fatal => {
                self.failed(Side::Receiver, e);
                Ok(())
            }
            Frame::Error(_) | Frame::Busy | Frame::Done(_) => Ok(()),
            other => Err(Error::Protocol(format!(
                "unexpected {} frame from the receiver",
                other.name()
            ))),
        }
    }

    /// A path of the sender's: safe, and at the top level one of the names asked for.
    fn check_path(&self, path: &[u8]) -> Result<(), Error> {
        let expected = self.config.expected_top_level.as_deref();
        crate::receive::check_sent_path(path, expected).map(|_| ())
    }

    /// `sent` bytes of file `id` passed on, or `kept` bytes of it that the receiver holds.
    fn advance(&self, id: u64, sent: u64, kept: u64) {
        self.progress.add_sent(0, sent);
        if kept > 0 {
            self.progress.add_resumed(kept);
        }
        let mut track = lock(&self.track);
        track.resumed += kept;
        if let Some((path, size, done)) = track.files.get_mut(&id) {
            *done += sent + kept;
            if *done < *size && self.progress.has_events() {
                let (path, done, size) = (path.clone(), *done, *size);
                drop(track);
                self.progress.event(|| Event::Progress { path, done, size });
            }
        }
    }

    /// A file the quick check skipped.
    fn skipped(&self, path: Bytes, size: u64) {
        self.progress.add_skipped(size);
        self.progress.event(|| Event::Skipped {
            path,
            size,
            reason: SkipReason::of(self.config.checksum),
        });
    }

    /// Files answered "skip" that the sender did not send after all: skipped; and the hard
    /// links to skipped files, which the receiver finds in place or makes again.
    fn settle_skipped(&self) {
        let (maybe, links) = {
            let mut track = lock(&self.track);
            let maybe = std::mem::take(&mut track.maybe_skipped);
            track.skipped.0 += maybe.len() as u64;
            track.skipped.1 += maybe.values().sum::<u64>();
            let links: Vec<Bytes> = std::mem::take(&mut track.links)
                .into_iter()
                .filter(|(_, file)| track.skipped_names.contains(file) || maybe.contains_key(file))
                .map(|(name, _)| name)
                .collect();
            track.skipped.0 += links.len() as u64;
            (maybe, links)
        };
        for (path, size) in maybe {
            self.skipped(path, size);
        }
        for name in links {
            self.skipped(name, 0);
        }
    }

    /// A per-entry failure on `side`.
    fn failed(&self, side: Side, e: &ErrorFrame) {
        let failure = Failure::from_frame(side, e);
        self.progress.event(|| Event::Failed(failure.clone()));
        lock(&self.track).fail(failure);
    }
}

fn too_many(what: &str) -> Error {
    Error::Protocol(format!(
        "more than {MAX_TRACKED} {what}: more than a fastcp sender keeps"
    ))
}
