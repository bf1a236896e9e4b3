//! Live counters that a user interface polls while a transfer runs.

use std::io;
use std::pin::Pin;
use std::sync::atomic::{
    AtomicBool, AtomicU64, AtomicUsize, Ordering::AcqRel, Ordering::Acquire, Ordering::Relaxed,
};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, ready};

use bytes::Bytes;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// Counters updated by the engine as it goes, cheap enough for the hot path (relaxed atomics
/// and a lock that is only ever tried).
///
/// The sender updates the walk counters ([`files_seen`](Snapshot::files_seen),
/// [`bytes_seen`](Snapshot::bytes_seen), [`walk_complete`](Snapshot::walk_complete)) and the
/// `sent` counters; the receiver updates the `done` counters, and sets the walk counters from
/// the sender's `Totals` frame when the walk ran on the other side (a pull).
/// [`crate::copy_local`] gives both sides the same `Progress`, so one object shows the walk
/// and what is written.
///
/// ```
/// use std::sync::Arc;
/// use fastcp_stream::Progress;
///
/// let progress = Arc::new(Progress::default());
/// // ... hand a clone to `send`, `receive` or `copy_local`, then poll from a timer:
/// let now = progress.snapshot();
/// assert_eq!(now.bytes_done, 0);
/// assert!(!now.walk_complete);
/// ```
#[derive(Debug, Default)]
pub struct Progress {
    files_seen: AtomicU64,
    bytes_seen: AtomicU64,
    walk_complete: AtomicBool,
    files_sent: AtomicU64,
    bytes_sent: AtomicU64,
    files_done: AtomicU64,
    bytes_done: AtomicU64,
    files_skipped: AtomicU64,
    bytes_skipped: AtomicU64,
    bytes_resumed: AtomicU64,
    bytes_checked: AtomicU64,
    deleted: AtomicU64,
    mirror_steps: AtomicU64,
    wire_bytes: AtomicU64,
    current: Mutex<Bytes>,
    events: Option<crate::EventSink>,
    /// Writers (of this side's receiver) still running; see [`settled`](Progress::settled).
    writers: AtomicUsize,
    /// Told when the last writer ends.
    writers_ended: tokio::sync::Notify,
}

/// A writer of the receiver, running: counted in its [`Progress`] until dropped.
#[derive(Debug)]
pub(crate) struct Running(Arc<Progress>);

impl Drop for Running {
    fn drop(&mut self) {
        if self.0.writers.fetch_sub(1, AcqRel) == 1 {
            self.0.writers_ended.notify_waiters();
        }
    }
}

/// A copy of the [`Progress`] counters at one moment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct Snapshot {
    /// Regular files the walk has found so far.
    pub files_seen: u64,
    /// Total size of those files.
    pub bytes_seen: u64,
    /// The walk has finished: `files_seen` and `bytes_seen` are the totals.
    pub walk_complete: bool,
    /// Files whose last byte the sender has written to a stream.
    pub files_sent: u64,
    /// File bytes the sender has written to the streams (a sparse file's holes, which go as
    /// their length alone, included).
    pub bytes_sent: u64,
    /// Files the receiver has verified and renamed into place.
    pub files_done: u64,
    /// File bytes the receiver has written to disk.
    pub bytes_done: u64,
    /// Files the quick check found unchanged on the receiver, which were not sent.
    pub files_skipped: u64,
    /// Their total size.
    pub bytes_skipped: u64,
    /// Bytes of files that the receiver's partial copies already held and that were not sent
    /// again (`--resume`).
    pub bytes_resumed: u64,
    /// File bytes read and hashed to compare with the other side (`checksum`, and the
    /// partial files of `resume`), on either side: a long comparison is progress, not a
    /// stall.
    pub bytes_checked: u64,
    /// Entries the receiver removed because the sender does not have them (mirroring).
    pub deleted: u64,
    /// Steps of the receiver's work after the data (a folder listed or an entry removed by
    /// mirroring, a hard link made, a folder's times set): a long `--delete` is progress, not
    /// a stall.
    pub mirror_steps: u64,
    /// Bytes read from or written to the data streams, counted as they move (by streams
    /// wrapped in [`Counted`]; fastcp counts its sealed TCP streams at their sockets, headers
    /// and tags included): a slow link or a low bandwidth limit is progress, not a stall,
    /// even while one chunk takes longer than an idle limit to cross.
    pub wire_bytes: u64,
}

impl Progress {
    /// Counters that also report each entry's [`Event`](crate::Event) to `sink`.
    ///
    /// ```
    /// use std::sync::{Arc, Mutex};
    /// use fastcp_stream::{Event, EventSink, Progress, ReceiveConfig, SendConfig};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let dir = tempfile::tempdir()?;
    /// std::fs::write(dir.path().join("a"), b"hello")?;
    /// let seen = Arc::new(Mutex::new(Vec::new()));
    /// let sink = EventSink::new({
    ///     let seen = seen.clone();
    ///     move |e: &Event| seen.lock().unwrap().push(e.clone())
    /// });
    /// let progress = Arc::new(Progress::with_events(sink));
    /// fastcp_stream::copy_local(
    ///     &[dir.path().join("a")],
    ///     &dir.path().join("b"),
    ///     &SendConfig::default(),
    ///     &ReceiveConfig::default(),
    ///     1,
    ///     progress,
    /// )
    /// .await?;
    /// let seen = seen.lock().unwrap();
    /// assert!(matches!(&seen[..], [
    ///     Event::Started { size: 5, .. },
    ///     Event::Done { bytes: 5, verified: true, .. },
    /// ]));
    /// # Ok(()) }
    /// ```
    pub fn with_events(sink: crate::EventSink) -> Progress {
        Progress {
            events: Some(sink),
            ..Progress::default()
        }
    }

    /// Counts a writer of the receiver as running until the returned guard is dropped.
    pub(crate) fn writer_running(self: &Arc<Self>) -> Running {
        self.writers.fetch_add(1, AcqRel);
        Running(self.clone())
    }

    /// Waits until no writer of this side's receiver runs (at once when none does). A copy
    /// that stopped early (cancelled, or failed) returns before its writer threads have
    /// removed their temp files; once this returns, they have.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let progress = fastcp_stream::Progress::default();
    /// progress.settled().await; // no copy ran: at once
    /// # }
    /// ```
    pub async fn settled(&self) {
        loop {
            let ended = self.writers_ended.notified();
            tokio::pin!(ended);
            ended.as_mut().enable();
            if self.writers.load(Acquire) == 0 {
                return;
            }
            ended.await;
        }
    }

    /// Reports the end of a copy to the sink, as [`Event::Finished`](crate::Event::Finished)
    /// with `report`: for the layer that runs a whole copy (fastcp's `copy_local` and
    /// `Session::copy` call it once, when the copy returns `Ok`).
    pub fn finished(&self, report: &crate::Report) {
        self.event(|| crate::Event::Finished(Box::new(report.clone())));
    }

    /// Reports that a copy stopped on a fatal error, as
    /// [`Event::Aborted`](crate::Event::Aborted) with `error`'s text and the counters at that
    /// moment: for the layer that runs a whole copy (fastcp's `copy_local`, `copy_remote` and
    /// `Session::copy` call it once, when the copy returns `Err`).
    pub fn aborted(&self, error: &dyn std::fmt::Display) {
        self.event(|| crate::Event::Aborted {
            message: error.to_string(),
            progress: self.snapshot(),
        });
    }

    /// Reports an event, when someone listens.
    pub(crate) fn event(&self, event: impl FnOnce() -> crate::Event) {
        if let Some(sink) = &self.events {
            sink.emit(&event());
        }
    }

    /// Whether events are listened to.
    pub(crate) fn has_events(&self) -> bool {
        self.events.is_some()
    }

    /// All counters at once.
    pub fn snapshot(&self) -> Snapshot {
        Snapshot {
            files_seen: self.files_seen.load(Relaxed),
            bytes_seen: self.bytes_seen.load(Relaxed),
            walk_complete: self.walk_complete.load(Relaxed),
            files_sent: self.files_sent.load(Relaxed),
            bytes_sent: self.bytes_sent.load(Relaxed),
            files_done: self.files_done.load(Relaxed),
            bytes_done: self.bytes_done.load(Relaxed),
            files_skipped: self.files_skipped.load(Relaxed),
            bytes_skipped: self.bytes_skipped.load(Relaxed),
            bytes_resumed: self.bytes_resumed.load(Relaxed),
            bytes_checked: self.bytes_checked.load(Relaxed),
            deleted: self.deleted.load(Relaxed),
            mirror_steps: self.mirror_steps.load(Relaxed),
            wire_bytes: self.wire_bytes.load(Relaxed),
        }
    }

    /// The wire path of the file most recently started (raw bytes: escape it with
    /// [`crate::escape`] before printing). Empty before the first file.
    pub fn current(&self) -> Bytes {
        match self.current.lock() {
            Ok(g) => g.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    pub(crate) fn set_current(&self, path: &Bytes) {
        // Never wait: a reader holding the lock just means this update is skipped.
        if let Ok(mut g) = self.current.try_lock() {
            *g = path.clone();
        }
    }

    pub(crate) fn add_seen(&self, files: u64, bytes: u64) {
        self.files_seen.fetch_add(files, Relaxed);
        self.bytes_seen.fetch_add(bytes, Relaxed);
    }

    /// The sender's final totals, from its `Totals` frame: the walk is complete. Counts the
    /// walk already made in this process (a local copy) are not added twice.
    pub(crate) fn set_totals(&self, files: u64, bytes: u64) {
        self.files_seen.fetch_max(files, Relaxed);
        self.bytes_seen.fetch_max(bytes, Relaxed);
        self.set_walk_complete();
    }

    pub(crate) fn set_walk_complete(&self) {
        self.walk_complete.store(true, Relaxed);
    }

    pub(crate) fn add_sent(&self, files: u64, bytes: u64) {
        if files != 0 {
            self.files_sent.fetch_add(files, Relaxed);
        }
        if bytes != 0 {
            self.bytes_sent.fetch_add(bytes, Relaxed);
        }
    }

    pub(crate) fn add_done_bytes(&self, bytes: u64) {
        self.bytes_done.fetch_add(bytes, Relaxed);
    }

    pub(crate) fn add_done_file(&self) {
        self.files_done.fetch_add(1, Relaxed);
    }

    pub(crate) fn add_checked(&self, bytes: u64) {
        self.bytes_checked.fetch_add(bytes, Relaxed);
    }

    pub(crate) fn add_resumed(&self, bytes: u64) {
        self.bytes_resumed.fetch_add(bytes, Relaxed);
    }

    pub(crate) fn add_deleted(&self, entries: u64) {
        self.deleted.fetch_add(entries, Relaxed);
    }

    /// Counts a step of mirroring (a folder listed, an entry removed) for a program that
    /// mirrors a destination the engine does not write itself, so that an idle limit
    /// watching [`snapshot`](Self::snapshot) sees it moving.
    pub fn mirror_step(&self) {
        self.mirror_steps.fetch_add(1, Relaxed);
    }

    /// Counts `entries` removed by `--delete` at `path` (a folder counts with all it held)
    /// and reports [`Event::Deleted`](crate::Event::Deleted): for a program that mirrors a
    /// destination the engine does not write itself, as fastcp's SFTP push does.
    pub fn deleted(&self, path: Bytes, entries: u64) {
        self.add_deleted(entries);
        self.event(|| crate::Event::Deleted { path });
    }

    /// Counts `bytes` that crossed a data stream, for a program that carries the engine's
    /// streams itself; [`Counted`] calls it for every read and write.
    pub fn add_wire(&self, bytes: u64) {
        if bytes != 0 {
            self.wire_bytes.fetch_add(bytes, Relaxed);
        }
    }

    pub(crate) fn add_skipped(&self, bytes: u64) {
        self.files_skipped.fetch_add(1, Relaxed);
        self.bytes_skipped.fetch_add(bytes, Relaxed);
    }
}

/// A stream whose reads and writes count in a [`Progress`]'s
/// [`wire_bytes`](Snapshot::wire_bytes) as they happen, so that an idle limit watching the
/// snapshot sees a slow stream moving before a whole chunk has crossed it.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> std::io::Result<()> {
/// use std::sync::Arc;
/// use tokio::io::{AsyncReadExt, AsyncWriteExt};
/// use fastcp_stream::{Counted, Progress};
///
/// let progress = Arc::new(Progress::default());
/// let (a, mut b) = tokio::io::duplex(1 << 16);
/// let mut a = Counted::new(a, progress.clone());
/// a.write_all(b"hello").await?;
/// let mut buf = [0; 5];
/// b.read_exact(&mut buf).await?;
/// assert_eq!(progress.snapshot().wire_bytes, 5);
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct Counted<S> {
    inner: S,
    progress: Arc<Progress>,
}

impl<S> Counted<S> {
    /// Wraps `inner`, counting its bytes in `progress`.
    pub fn new(inner: S, progress: Arc<Progress>) -> Counted<S> {
        Counted { inner, progress }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Counted<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        ready!(Pin::new(&mut self.inner).poll_read(cx, buf))?;
        self.progress.add_wire((buf.filled().len() - before) as u64);
        Poll::Ready(Ok(()))
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Counted<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        let n = ready!(Pin::new(&mut self.inner).poll_write(cx, data))?;
        self.progress.add_wire(n as u64);
        Poll::Ready(Ok(n))
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let n = ready!(Pin::new(&mut self.inner).poll_write_vectored(cx, bufs))?;
        self.progress.add_wire(n as u64);
        Poll::Ready(Ok(n))
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}
