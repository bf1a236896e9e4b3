//! The receiver's half of the quick check: a `Probe` asks whether the destination already
//! holds a file, and the answer costs a stat (a hash, with `checksum`).
//!
//! A no-change rerun is nothing but probes, one per file, so they are answered on threads of
//! their own, in parallel, rather than one after another on stream 0's reader: the reader
//! checks each probe against the session (as every entry is checked) and hands it on. A
//! directory's probes go to one thread, which keeps the directory open for the next.
//!
//! Probes go to a thread in batches, and its answers come back in one message: a stat costs
//! less than waking a thread. A batch holds what has arrived when the reader would wait;
//! a few probes wait a moment for more (a listing that sends them one by one). Answers may
//! go back in any order; the sender matches them by id. But a partial file's block hashes
//! (`--resume`) are taken for the answer that comes next, so a thread sends them and their
//! answer at its turn, and no other thread's answers come between. Everything a probe
//! changes (the counts, the files held for `--resume`, the refresh queued to a writer) is
//! done before its answer goes, so the `File` entry that an answer may bring finds it done.

use std::os::fd::OwnedFd;
use std::sync::{Arc, Mutex};
use std::task::Poll;
use std::time::Duration;

use fastcp_proto::{Answer, Attrs, Frame, Probe};
use rustix::fs::{AtFlags, FileType};
use rustix::io::Errno;
use tokio::sync::mpsc;

use crate::dest::{self, Op, Resolver, lock};
use crate::event::{Event, SkipReason};
use crate::mirror::split;
use crate::receive::{Shared, kept};
use crate::{Error, resume};

/// Probes handed to a thread at once, at most: one wake-up (and one message of answers
/// back) for many stats, each of which costs less than a wake-up.
const PROBE_BATCH: usize = 256;
/// A batch is handed over at this many bytes of names and attributes too.
const PROBE_BATCH_BYTES: usize = 256 << 10;
/// Batches queued per thread.
const PROBE_QUEUE: usize = 8;
/// Fewer probes than this wait up to [`GATHER`] for others before they are handed over.
const FEW: usize = 32;
/// How long the first of a few probes may wait for more before they are handed over.
const GATHER: Duration = Duration::from_millis(1);

/// A probe thread or a writer stopped: the transfer's error, set first, says why.
fn aborted() -> Error {
    Error::Stream {
        stream: 0,
        source: std::io::Error::other("transfer aborted"),
    }
}

/// About what a probe's attributes take in memory.
fn attrs_bytes(a: &Attrs) -> usize {
    a.path.len()
        + a.user.len()
        + a.group.len()
        + a.xattrs
            .iter()
            .map(|(n, v)| n.len() + v.len())
            .sum::<usize>()
}

/// Whether two modification times (seconds, nanoseconds) are the same for the quick check:
/// to the nanosecond, or to the second where either has none finer (a file copied over SFTP,
/// whose times are whole seconds, or from a file system that keeps no finer ones), so that
/// one night's copy over SFTP does not make the next night's over fastcp send everything.
///
/// ```
/// use fastcp_stream::same_mtime;
/// assert!(same_mtime((1_700_000_000, 250), (1_700_000_000, 250)));
/// assert!(same_mtime((1_700_000_000, 0), (1_700_000_000, 250)));
/// assert!(!same_mtime((1_700_000_000, 100), (1_700_000_000, 250)));
/// assert!(!same_mtime((1_700_000_001, 0), (1_700_000_000, 0)));
/// ```
pub fn same_mtime(a: (i64, u32), b: (i64, u32)) -> bool {
    a.0 == b.0 && (a.1 == b.1 || a.1 == 0 || b.1 == 0)
}

/// How many threads answer probes: stats of a cold disk overlap, and a warm one's cost CPU.
pub(crate) fn threads() -> usize {
    std::thread::available_parallelism().map_or(2, |n| n.get().clamp(2, 4))
}

/// A probe and the attributes that came just before it, copied out of the receive block
/// (a slice would keep the whole block while it waits).
type Job = (Probe, Option<Box<Attrs>>);

/// Hands probes to the threads that answer them, a directory's probes to one (a folder of
/// more than a batch to several, a batch each).
pub(crate) struct Probers {
    queues: Vec<mpsc::Sender<Vec<Job>>>,
    /// Each thread's probes not yet handed over, and their bytes.
    batches: Vec<(Vec<Job>, usize)>,
    /// The directory of the last probe, and the queue it went to.
    last: (Vec<u8>, usize),
    /// When the oldest of the probes not yet handed over came.
    since: Option<tokio::time::Instant>,
}

impl Probers {
    /// Starts the threads; a refresh goes to one of `writers`. Each thread ends once its
    /// queue is drained and this is dropped, or at the transfer's first fatal error.
    pub(crate) fn start(shared: &Arc<Shared>, writers: &[mpsc::Sender<Op>]) -> Probers {
        let turn = Arc::new(Mutex::new(()));
        let queues: Vec<_> = (0..threads())
            .map(|i| {
                let (tx, rx) = mpsc::channel(PROBE_QUEUE);
                let prober = Prober {
                    shared: shared.clone(),
                    // Weak: the writers finish when the readers are done, whatever a
                    // probe thread is still doing (a hash, after an abort).
                    writers: writers.iter().map(mpsc::Sender::downgrade).collect(),
                    next_writer: i,
                    lookup: Resolver::new(shared.clone(), false),
                    reference: shared.reference.as_ref().map(|fd| {
                        (
                            Resolver::beneath(shared.clone(), fd.clone()),
                            Resolver::new(shared.clone(), true),
                        )
                    }),
                    ids: crate::attrs::Ids::default(),
                    turn: turn.clone(),
                    to_sync: Default::default(),
                };
                tokio::task::spawn_blocking(move || prober.run(rx));
                tx
            })
            .collect();
        Probers {
            batches: queues.iter().map(|_| (Vec::new(), 0)).collect(),
            queues,
            last: (Vec::new(), 0),
            since: None,
        }
    }

    /// Queues a probe (checked against the session already) for its directory's thread.
    /// It goes in a batch, handed over when full or by [`while_waiting`](Self::while_waiting).
    pub(crate) async fn probe(&mut self, p: Probe, attrs: Option<Box<Attrs>>) -> Result<(), Error> {
        let parent = &p.path[..p.path.iter().rposition(|&b| b == b'/').unwrap_or(0)];
        if self.last.0[..] != *parent {
            self.last = (parent.to_vec(), (self.last.1 + 1) % self.queues.len());
        }
        let i = self.last.1;
        let bytes = p.path.len() + attrs.as_ref().map_or(0, |a| attrs_bytes(a));
        let p = Probe {
            path: kept(&p.path),
            ..p
        };
        let attrs = attrs.as_deref().map(crate::receive::kept_attrs);
        self.since.get_or_insert_with(tokio::time::Instant::now);
        let batch = &mut self.batches[i];
        batch.0.push((p, attrs));
        batch.1 += bytes;
        if batch.0.len() >= PROBE_BATCH || batch.1 >= PROBE_BATCH_BYTES {
            self.hand_over(i).await?;
            // The rest of a big folder goes to the next thread.
            self.last.1 = (i + 1) % self.queues.len();
            if self.batches.iter().all(|b| b.0.is_empty()) {
                self.since = None;
            }
        }
        Ok(())
    }

    /// Awaits `fut` (the next read of the stream the probes come on), handing the probes
    /// queued so far to their threads if it has to wait: what has arrived already is
    /// decoded first, so that a batch holds all of it. A few probes wait for more until
    /// [`GATHER`] after the first of them came, as they do when a listing sends them one by
    /// one: a thread woken for each would cost more than its stat.
    pub(crate) async fn while_waiting<F: Future>(&mut self, fut: F) -> Result<F::Output, Error> {
        let mut fut = std::pin::pin!(fut);
        let queued: usize = self.batches.iter().map(|b| b.0.len()).sum();
        if queued == 0 {
            return Ok(fut.await);
        }
        if let Poll::Ready(out) =
            std::future::poll_fn(|cx| Poll::Ready(fut.as_mut().poll(cx))).await
        {
            return Ok(out);
        }
        if queued < FEW
            && let Some(since) = self.since
        {
            tokio::select! {
                out = fut.as_mut() => return Ok(out),
                () = tokio::time::sleep_until(since + GATHER) => {}
            }
        }
        self.flush().await?;
        Ok(fut.await)
    }

    /// Hands every probe queued so far to its thread.
    pub(crate) async fn flush(&mut self) -> Result<(), Error> {
        for i in 0..self.queues.len() {
            if !self.batches[i].0.is_empty() {
                self.hand_over(i).await?;
            }
        }
        self.since = None;
        Ok(())
    }

    async fn hand_over(&mut self, i: usize) -> Result<(), Error> {
        let (batch, _) = std::mem::take(&mut self.batches[i]);
        self.queues[i].send(batch).await.map_err(|_| aborted())
    }
}

/// One thread's handles.
struct Prober {
    shared: Arc<Shared>,
    writers: Vec<mpsc::WeakSender<Op>>,
    next_writer: usize,
    /// Opens directories to answer probes (never creates any).
    lookup: Resolver,
    /// With `link_dest`: opens the reference folder's directories, and the destination's
    /// (creating them) for the links made from it.
    reference: Option<(Resolver, Resolver)>,
    /// Local ids by the sender's user and group names, for the refresh.
    ids: crate::attrs::Ids,
    /// Held to send: what one thread sends for a probe goes back unbroken by another's.
    turn: Arc<Mutex<()>>,
    /// With `fsync` and `link_dest`: the destination's directories links went into since
    /// the last flush.
    to_sync: std::collections::HashMap<Vec<u8>, Arc<OwnedFd>>,
}

impl Prober {
    /// Answers the batches that come until the queue closes or the transfer aborts. A
    /// failure, a panic included, is the transfer's error, set before the queue closes: the
    /// reader, finding it closed, then reports this and not its own "aborted".
    fn run(mut self, mut rx: mpsc::Receiver<Vec<Job>>) {
        'batches: while let Some(batch) = rx.blocking_recv() {
            let mut answers = Vec::with_capacity(batch.len());
            for (p, attrs) in batch {
                if self.shared.abort.is_set() {
                    break 'batches;
                }
                match self.answer_caught(p, attrs) {
                    Ok(answer) => answers.extend(answer),
                    Err(e) => {
                        self.shared.abort.trigger(e);
                        break 'batches;
                    }
                }
            }
            // With `fsync`, the links are flushed before their answers go: the copy reports
            // success only once every answer is in.
            if let Err(e) = self.sync_dirs() {
                self.shared.abort.trigger(e);
                break 'batches;
            }
            if !answers.is_empty() {
                let _turn = lock(&self.turn);
                // Fails only when the reply stream is gone, and then the session is over.
                let _ = self.shared.replies.blocking_send(answers);
            }
        }
        drop(rx);
    }

    /// [`answer`](Self::answer), with a panic made an error (a local fault, not the peer's).
    fn answer_caught(
        &mut self,
        p: Probe,
        attrs: Option<Box<Attrs>>,
    ) -> Result<Option<Frame>, Error> {
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.answer(p, attrs)))
            .unwrap_or_else(|panic| {
                let what = crate::error::panic_message(&*panic);
                Err(Error::Io {
                    path: self.shared.root.display(b""),
                    source: std::io::Error::other(format!("a quick-check thread panicked: {what}")),
                })
            })
    }

    /// Answers one probe: "send" unless the destination holds the file. The answer is
    /// returned to go back with others, or `None` when it went with its partial file's
    /// hashes.
    fn answer(&mut self, p: Probe, attrs: Option<Box<Attrs>>) -> Result<Option<Frame>, Error> {
        #[cfg(test)]
        if p.path.ends_with(b"probe-panics-here") {
            panic!("injected by a test");
        }
        let config = &self.shared.config;
        let (checksum, resume) = (config.checksum, config.resume);
        let size_only = config.skip_rules.size_only;
        // `--ignore-existing`, `--update`: what is there is left untouched.
        if let Some(reason) = self.left_as_it_is(&p) {
            self.shared.progress.add_skipped(p.size);
            self.shared.progress.event(|| Event::Skipped {
                path: p.path.clone(),
                size: p.size,
                reason,
            });
            self.shared.probe_skipped(p.path.clone(), p.size);
            return Ok(Some(Frame::Answer(Answer {
                id: p.id,
                send: false,
                hash: None,
            })));
        }
        // The destination already holds the file when a regular file (not a link) is there
        // with its size and modification time, reached without following a symlink;
        // anything else, a missing directory included, means "send it". One stat serves the
        // check and the refresh.
        let st = self.same_size(&p);
        let (send, hash) = if checksum {
            let hash = st.as_ref().and_then(|_| self.content_hash(&p));
            (hash.is_none(), hash)
        } else {
            let same_time = st.as_ref().is_some_and(|st| {
                size_only
                    || same_mtime(
                        (st.st_mtime, st.st_mtime_nsec as u32),
                        (p.mtime, p.mtime_nsec),
                    )
            });
            (!same_time, None)
        };
        // With `link_dest`, a file in place that has other names (last night's, linked) is
        // not brought in line where that would change them too: it is sent, a file of its
        // own.
        let send = send
            || (self.shared.config.link_dest.is_some()
                && !checksum
                && st.as_ref().is_some_and(|st| {
                    st.st_nlink > 1
                        && shared_attrs_differ(
                            &mut self.ids,
                            &self.shared.config,
                            &p,
                            st,
                            attrs.as_deref(),
                        )
                }));
        // A file the reference folder holds alike becomes another name of it instead.
        let linked = send && !checksum && self.link_from_reference(&p, attrs.as_deref());
        let send = send && !linked;
        if !send
            && !linked
            && let Some(st) = st
        {
            self.refresh(&p, &st, attrs)?;
        }
        if !send && !checksum {
            // Certain: the sender skips it.
            self.shared.progress.add_skipped(p.size);
            self.shared.progress.event(|| Event::Skipped {
                path: p.path.clone(),
                size: p.size,
                reason: match linked {
                    true => SkipReason::Linked,
                    false => SkipReason::Unchanged,
                },
            });
        }
        if !send {
            self.shared.probe_skipped(p.path.clone(), p.size);
            // The file is whole: a partial file an earlier copy kept for it is of no more use.
            // With `checksum` only the sender knows, comparing hashes: it is offered below,
            // and goes at the end if the sender skips the file.
            if resume
                && !checksum
                && p.size > resume::PARTIAL_MIN
                && let Some((dir, name)) = self.probed_dir(&p)
            {
                dest::remove_stale_partial(&dir, &name);
            }
        }
        let answer = Frame::Answer(Answer {
            id: p.id,
            send,
            hash,
        });
        // With `checksum`, a file the destination holds at the same size is sent after all
        // when the hashes differ: its partial file is offered as for a file it lacks.
        if (send || checksum) && resume && p.size > resume::PARTIAL_MIN {
            // The sender takes a partial file's hashes for the answer that comes next:
            // nothing else of the probe threads' goes back between them.
            let turn = self.turn.clone();
            let _turn = lock(&turn);
            if let Some((fd, offer)) = self.partial_offer(&p) {
                if !send && let Some((dir, name)) = self.probed_dir(&p) {
                    self.shared.hold_whole_partial(
                        p.path.clone(),
                        dir,
                        resume::partial_name(&name),
                    );
                }
                // Its `Partial` frames are sent: the offer is held for the `File` entry.
                self.shared.hold_offer(p.path.clone(), fd, offer);
                // Fails only when the reply stream is gone, and then the session is over.
                let _ = self.shared.replies.blocking_send(vec![answer]);
                return Ok(None);
            }
            // With `checksum`, a partial file that offers nothing (shorter than a block, or
            // its record of another version) is of no use whether the sender skips the file
            // or sends it after all (from scratch): it goes, as the quick check removes it.
            if !send && let Some((dir, name)) = self.probed_dir(&p) {
                dest::remove_stale_partial(&dir, &name);
            }
        }
        Ok(Some(answer))
    }

    /// A file the sender will skip takes the sender's mode and times (with `preserve`, when
    /// they differ) and owner and attributes (when sent), as rsync brings an unchanged file
    /// in line; a writer does it. Nothing is queued when nothing differs.
    fn refresh(
        &mut self,
        p: &Probe,
        st: &rustix::fs::Stat,
        attrs: Option<Box<Attrs>>,
    ) -> Result<(), Error> {
        let preserve = self.shared.config.preserve;
        let (mode, mtime) = match (preserve, p.mode) {
            (true, Some(mode)) => {
                let mode = mode & crate::dest::SAFE_MODE_BITS;
                let times = (st.st_mtime, st.st_mtime_nsec as u32) != (p.mtime, p.mtime_nsec);
                (
                    (st.st_mode & 0o7777 != mode).then_some(mode),
                    times.then_some((p.mtime, p.mtime_nsec)),
                )
            }
            _ => (None, None),
        };
        let keep = &self.shared.config.attrs;
        let attrs = attrs.filter(|a| !self.ids.in_line(a, keep, st.st_uid, st.st_gid));
        if mode.is_none() && mtime.is_none() && attrs.is_none() {
            return Ok(());
        }
        // The probe's name and attributes are copies already (see `Job`): they may be kept
        // until the sender's verdict.
        let wire = p.path.clone();
        let op = Op::Refresh {
            wire: wire.clone(),
            size: p.size,
            mode,
            mtime,
            attrs,
        };
        if self.shared.config.checksum {
            // Only the sender knows whether the contents matched: done once it is, for the
            // files it skipped (`refresh_skipped`). Done now, a file it sends after all would
            // carry its time with the old content if the copy stopped before it arrived.
            self.shared.refresh_later(wire, op);
            return Ok(());
        }
        let w = self.next_writer % self.writers.len();
        self.next_writer += 1;
        let writer = self.writers[w].upgrade().ok_or_else(aborted)?;
        writer.blocking_send(op).map_err(|_| aborted())
    }

    /// With `link_dest`: makes the probed file another name (a hard link) of the reference
    /// folder's file at the same path, when that is a regular file (reached without
    /// following a link) with the probe's size and time, and its mode and owner where the
    /// copy keeps them: a link shares them, so a file that would need them changed is sent
    /// instead. False when there is no such file or the link cannot be made (the file is
    /// sent then).
    fn link_from_reference(&mut self, p: &Probe, attrs: Option<&Attrs>) -> bool {
        let Some((reference, dest)) = self.reference.as_mut() else {
            return false;
        };
        let (ref_dir, ref_name) = split(&self.shared.root.in_reference(&p.path));
        let (dir, name) = split(&self.shared.root.local(&p.path));
        if ref_name.is_empty() || name.is_empty() {
            return false;
        }
        let Ok(from) = reference.dir(&ref_dir) else {
            return false;
        };
        let Ok(st) = rustix::fs::statat(&*from, &ref_name[..], AtFlags::SYMLINK_NOFOLLOW) else {
            return false;
        };
        // A reference made over SFTP, or a copy over it, links as rsync links them.
        let same_time = same_mtime(
            (st.st_mtime, st.st_mtime_nsec as u32),
            (p.mtime, p.mtime_nsec),
        );
        if FileType::from_raw_mode(st.st_mode) != FileType::RegularFile
            || st.st_size as u64 != p.size
            || !same_time
            || shared_attrs_differ(&mut self.ids, &self.shared.config, p, &st, attrs)
        {
            return false;
        }
        let Ok(to) = dest.dir(&dir) else {
            return false;
        };
        let linked =
            match rustix::fs::linkat(&*from, &ref_name[..], &*to, &name[..], AtFlags::empty()) {
                Ok(()) => true,
                // Something else holds the name (the file as it was, changed since): the link
                // takes its place at once, as a received file would.
                Err(Errno::EXIST) => {
                    // Already a name of that file (its times to the second only): done. A
                    // rename onto another name of the same file would do nothing.
                    let there = rustix::fs::statat(&*to, &name[..], AtFlags::SYMLINK_NOFOLLOW);
                    if there.is_ok_and(|t| (t.st_dev, t.st_ino) == (st.st_dev, st.st_ino)) {
                        return true;
                    }
                    let temp = dest::temp_name(&name);
                    if rustix::fs::linkat(&*from, &ref_name[..], &*to, &temp[..], AtFlags::empty())
                        .is_err()
                    {
                        return false;
                    }
                    let renamed = rustix::fs::renameat(&*to, &temp[..], &*to, &name[..]);
                    // Gone after a rename, unless the name became that file meanwhile.
                    let _ = rustix::fs::unlinkat(&*to, &temp[..], AtFlags::empty());
                    renamed.is_ok()
                }
                Err(_) => false,
            };
        if linked && self.shared.config.fsync {
            self.to_sync.insert(dir, to);
        }
        linked
    }

    /// With `fsync`: flushes the directories links went into.
    fn sync_dirs(&mut self) -> Result<(), Error> {
        for (local, fd) in self.to_sync.drain() {
            rustix::fs::fsync(&*fd)
                .map_err(|e| Error::io(self.shared.root.display(&local), e.into()))?;
        }
        Ok(())
    }

    /// The destination's regular file at the probe's path (not a link, reached without
    /// following one), if it has the probe's size.
    /// Why what is at a probed path is left as it is, untouched, if it is: anything there
    /// with [`SkipRules::existing`](crate::SkipRules::existing), anything there with a later
    /// modification time with [`SkipRules::newer`](crate::SkipRules::newer).
    fn left_as_it_is(&mut self, p: &Probe) -> Option<SkipReason> {
        let rules = self.shared.config.skip_rules;
        if !rules.existing && !rules.newer {
            return None;
        }
        let (dir, name) = self.probed_dir(p)?;
        let st = rustix::fs::statat(&*dir, &name[..], AtFlags::SYMLINK_NOFOLLOW).ok()?;
        if rules.existing {
            return Some(SkipReason::Exists);
        }
        let theirs = (st.st_mtime, i128::from(st.st_mtime_nsec));
        (theirs > (p.mtime, i128::from(p.mtime_nsec))).then_some(SkipReason::Newer)
    }

    fn same_size(&mut self, p: &Probe) -> Option<rustix::fs::Stat> {
        let (dir, name) = self.probed_dir(p)?;
        let st = rustix::fs::statat(&*dir, &name[..], AtFlags::SYMLINK_NOFOLLOW).ok()?;
        (FileType::from_raw_mode(st.st_mode) == FileType::RegularFile
            && st.st_size as u64 == p.size)
            .then_some(st)
    }

    /// The existing directory a probed path's file would go into, and the file's name
    /// (looked up without creating or following anything).
    fn probed_dir(&mut self, p: &Probe) -> Option<(Arc<OwnedFd>, Vec<u8>)> {
        let local = self.shared.root.local(&p.path);
        let (parent, name) = match local.iter().rposition(|&b| b == b'/') {
            Some(i) => (&local[..i], &local[i + 1..]),
            None => (&[][..], &local[..]),
        };
        let dir = self.lookup.dir(parent).ok()?;
        (!name.is_empty()).then(|| (dir, name.to_vec()))
    }

    /// With `checksum`: the content hash of the destination's file (of the probe's size);
    /// `None` when it cannot be read.
    fn content_hash(&mut self, p: &Probe) -> Option<u128> {
        let (dir, name) = self.probed_dir(p)?;
        let file = crate::checksum::open_to_hash(&*dir, &name, false).ok()?;
        let (kind, progress) = (self.shared.config.content_hash, &self.shared.progress);
        crate::checksum::content_hash(kind, file, progress).ok()
    }

    /// With `resume`: the partial file of a probed file (of more than
    /// [`PARTIAL_MIN`](resume::PARTIAL_MIN) bytes), held, with the hashes of its blocks, sent
    /// to the sender; `None` when there is none to offer.
    ///
    /// The hashes go to the sender as they are made, a `Partial` frame every
    /// [`PIECE_BYTES`](crate::resume::PIECE_BYTES) hashed, so that hashing a big partial
    /// file is progress on both sides rather than a silence. With `resume_from_record`, the
    /// blocks the partial file's record holds for this version of the source are offered
    /// at once, unread.
    fn partial_offer(&mut self, p: &Probe) -> Option<(OwnedFd, resume::Offer)> {
        let (dir, name) = self.probed_dir(p)?;
        let fd = resume::open_partial(&dir, &resume::partial_name(&name), false)?;
        let replies = &self.shared.replies;
        if self.shared.config.resume_from_record {
            let record = resume::Record::load(&fd)?;
            let have = rustix::fs::fstat(&fd).ok()?.st_size as u64;
            let version = resume::Version::new(&name, p.size, (p.mtime, p.mtime_nsec));
            let offer = record.offer(version, have)?;
            let frame = Frame::Partial(fastcp_proto::Partial {
                id: p.id,
                block: offer.block,
                hashes: offer.hashes.clone(),
            });
            // Fails only when the reply stream is gone, and then the session is over.
            let _ = replies.blocking_send(vec![frame]);
            return Some((fd, offer));
        }
        let block = resume::block_size(p.size);
        // What was sent is what is offered, even if a read fails part way.
        let mut sent = Vec::new();
        let _ = resume::block_hashes(&fd, p.size, block, |piece, bytes| {
            self.shared.progress.add_checked(bytes);
            sent.extend_from_slice(piece);
            let frame = Frame::Partial(fastcp_proto::Partial {
                id: p.id,
                block,
                hashes: piece.to_vec(),
            });
            // Fails only when the reply stream is gone, and then the session is over.
            let _ = replies.blocking_send(vec![frame]);
        });
        let offer = resume::Offer {
            block,
            hashes: sent,
            version: None,
        };
        (!offer.hashes.is_empty()).then_some((fd, offer))
    }
}

/// Whether a file `st` lacks the mode (with `preserve`) or owner and attributes (as kept)
/// that probe `p` brings: what a hard link shares with every other name of its file.
fn shared_attrs_differ(
    ids: &mut crate::attrs::Ids,
    config: &crate::ReceiveConfig,
    p: &Probe,
    st: &rustix::fs::Stat,
    attrs: Option<&Attrs>,
) -> bool {
    let mode_differs = |mode: u32| st.st_mode & 0o7777 != mode & dest::SAFE_MODE_BITS;
    (config.preserve && p.mode.is_some_and(mode_differs))
        || attrs.is_some_and(|a| !ids.in_line(a, &config.attrs, st.st_uid, st.st_gid))
}

#[cfg(test)]
mod tests {
    use std::os::unix::ffi::OsStrExt;
    use std::path::Path;
    use std::sync::Arc;
    use std::time::Duration;

    use crate::{Progress, ReceiveConfig, Report, SendConfig};

    /// Copies `tree` into `dst` over two in-process streams, with the quick check.
    async fn copy(tree: &Path, dst: &Path) -> Result<Report, crate::Error> {
        copy_with(tree, dst, false).await
    }

    /// [`copy`], with `--resume` if asked.
    async fn copy_with(tree: &Path, dst: &Path, resume: bool) -> Result<Report, crate::Error> {
        copy_checking(tree, dst, resume, false).await
    }

    /// [`copy_with`], with `--checksum` in place of the quick check if asked.
    async fn copy_checking(
        tree: &Path,
        dst: &Path,
        resume: bool,
        checksum: bool,
    ) -> Result<Report, crate::Error> {
        let send_config = SendConfig {
            recursive: true,
            preserve: true,
            skip_unchanged: true,
            checksum,
            resume,
            ..Default::default()
        };
        let receive_config = ReceiveConfig {
            recursive: true,
            preserve: true,
            skip_unchanged: true,
            checksum,
            resume,
            ..Default::default()
        };
        let (a, b): (Vec<_>, Vec<_>) = (0..2).map(|_| tokio::io::duplex(64 << 10)).unzip();
        let progress = Arc::new(Progress::default());
        let sources = [tree.to_path_buf()];
        let copy = async {
            tokio::join!(
                crate::send(&sources, a, &send_config, progress.clone()),
                crate::receive(dst, b, &receive_config, progress.clone()),
            )
        };
        // A bound on a hang, not on speed.
        let (sent, received) = tokio::time::timeout(Duration::from_secs(60), copy)
            .await
            .expect("the copy hung");
        sent?;
        received
    }

    /// A rerun of many files in many directories, more than one batch for each probe thread,
    /// skips every unchanged file and sends the changed ones, wherever they are.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_rerun_over_many_directories_sends_just_what_changed() {
        let src = tempfile::tempdir().unwrap();
        let dst = tempfile::tempdir().unwrap();
        let tree = src.path().join("t");
        for d in 0..40 {
            let dir = tree.join(format!("d{d:02}"));
            std::fs::create_dir_all(&dir).unwrap();
            for f in 0..30 {
                std::fs::write(dir.join(format!("f{f:02}")), format!("{d} {f}")).unwrap();
            }
        }
        copy(&tree, dst.path()).await.unwrap();
        let changed = ["d00/f00", "d17/f09", "d39/f29"];
        for c in changed {
            // Another size: changed whatever the clock's resolution.
            std::fs::write(tree.join(c), format!("changed {c}")).unwrap();
        }
        let report = copy(&tree, dst.path()).await.unwrap();
        assert_eq!(report.files_skipped, 40 * 30 - 3);
        assert_eq!(report.local.files, 3, "{report:?}");
        for c in changed {
            let got = std::fs::read_to_string(dst.path().join("t").join(c)).unwrap();
            assert_eq!(got, format!("changed {c}"));
        }
    }

    /// With `--checksum` and `--resume`, a partial file too short to offer a block goes when
    /// the file it was for is found whole, as with the quick check: offered nothing, it was
    /// kept for good.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_partial_file_that_offers_nothing_goes_with_checksum() {
        const SIZE: usize = (crate::resume::PARTIAL_MIN + (1 << 20)) as usize;
        let src = tempfile::tempdir().unwrap();
        let dst = tempfile::tempdir().unwrap();
        let tree = src.path().join("t");
        let to = dst.path().join("t");
        std::fs::create_dir_all(&tree).unwrap();
        std::fs::create_dir_all(&to).unwrap();
        let big: Vec<u8> = (0..SIZE).map(|i| (i * 7) as u8).collect();
        std::fs::write(tree.join("big"), &big).unwrap();
        std::fs::write(to.join("big"), &big).unwrap();
        let partial = crate::resume::partial_name(b"big");
        let partial = to.join(std::ffi::OsStr::from_bytes(&partial));
        for held in [0, 1000] {
            std::fs::write(&partial, &big[..held]).unwrap();
            let report = copy_checking(&tree, dst.path(), true, true).await.unwrap();
            assert_eq!(report.files_skipped, 1, "{report:?}");
            assert!(!partial.exists(), "a partial file of {held} bytes is kept");
        }
    }

    /// Partial files in many folders, offered by several threads at once, are each resumed:
    /// every file's block hashes reach the sender with that file's answer.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn partial_files_offered_on_several_threads_are_all_resumed() {
        const SIZE: usize = (crate::resume::PARTIAL_MIN + (1 << 20)) as usize;
        let src = tempfile::tempdir().unwrap();
        let dst = tempfile::tempdir().unwrap();
        let tree = src.path().join("t");
        let dirs = 12;
        for d in 0..dirs {
            let dir = tree.join(format!("d{d:02}"));
            std::fs::create_dir_all(&dir).unwrap();
            for f in 0..40 {
                std::fs::write(dir.join(format!("small{f:02}")), format!("{d} {f}")).unwrap();
            }
            let big: Vec<u8> = (0..SIZE).map(|i| (i * 7 + d) as u8).collect();
            std::fs::write(dir.join("big"), &big).unwrap();
            // What a cut copy would have kept: the first half, under the partial name.
            let to = dst.path().join("t").join(format!("d{d:02}"));
            std::fs::create_dir_all(&to).unwrap();
            let partial = crate::resume::partial_name(b"big");
            let partial = to.join(std::ffi::OsStr::from_bytes(&partial));
            std::fs::write(partial, &big[..SIZE / 2]).unwrap();
        }
        let report = copy_with(&tree, dst.path(), true).await.unwrap();
        // Each partial file holds whole 1 MiB blocks of the first half.
        let held = (SIZE as u64 / 2) & !((1 << 20) - 1);
        assert_eq!(report.bytes_resumed, held * dirs as u64, "{report:?}");
        for d in 0..dirs {
            let path = format!("t/d{d:02}/big");
            let got = std::fs::read(dst.path().join(&path)).unwrap();
            assert_eq!(
                got,
                std::fs::read(src.path().join(&path)).unwrap(),
                "{path}"
            );
        }
    }

    /// Each file continued from a partial file is reported as resumed, with the bytes it
    /// kept, before it is done: by the receiver, and by the sender (which reports for a push).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_resumed_file_is_reported_on_both_sides() {
        use crate::{Event, EventSink};
        use bytes::Bytes;
        use std::sync::Mutex;
        const SIZE: usize = (crate::resume::PARTIAL_MIN + (1 << 20)) as usize;
        let src = tempfile::tempdir().unwrap();
        let dst = tempfile::tempdir().unwrap();
        let tree = src.path().join("t");
        std::fs::create_dir_all(&tree).unwrap();
        let big: Vec<u8> = (0..SIZE).map(|i| (i * 7) as u8).collect();
        std::fs::write(tree.join("big"), &big).unwrap();
        std::fs::write(tree.join("small"), b"small").unwrap();
        std::fs::create_dir_all(dst.path().join("t")).unwrap();
        let partial = crate::resume::partial_name(b"big");
        let partial = dst
            .path()
            .join("t")
            .join(std::ffi::OsStr::from_bytes(&partial));
        std::fs::write(partial, &big[..SIZE / 2]).unwrap();
        let recording = || {
            let seen = Arc::new(Mutex::new(Vec::new()));
            let sink = EventSink::new({
                let seen = seen.clone();
                move |e: &Event| match e {
                    Event::Resumed { .. } | Event::Done { .. } => {
                        seen.lock().unwrap().push(e.clone())
                    }
                    _ => {}
                }
            });
            (Arc::new(Progress::with_events(sink)), seen)
        };
        let (sending, sent_events) = recording();
        let (receiving, received_events) = recording();
        let send_config = SendConfig {
            recursive: true,
            skip_unchanged: true,
            resume: true,
            ..Default::default()
        };
        let receive_config = ReceiveConfig {
            recursive: true,
            skip_unchanged: true,
            resume: true,
            ..Default::default()
        };
        let (a, b): (Vec<_>, Vec<_>) = (0..2).map(|_| tokio::io::duplex(64 << 10)).unzip();
        let sources = [tree.clone()];
        let copy = async {
            tokio::join!(
                crate::send(&sources, a, &send_config, sending),
                crate::receive(dst.path(), b, &receive_config, receiving),
            )
        };
        let (sent, received) = tokio::time::timeout(Duration::from_secs(60), copy)
            .await
            .expect("the copy hung");
        sent.unwrap();
        assert!(received.unwrap().is_complete());
        let held = (SIZE as u64 / 2) & !((1 << 20) - 1);
        for (side, seen) in [("sender", sent_events), ("receiver", received_events)] {
            let seen = seen.lock().unwrap();
            let resumed: Vec<usize> = (0..seen.len())
                .filter(|&i| matches!(&seen[i], Event::Resumed { .. }))
                .collect();
            assert_eq!(resumed.len(), 1, "{side}: {seen:?}");
            let i = resumed[0];
            assert_eq!(
                seen[i],
                Event::Resumed {
                    path: Bytes::from_static(b"t/big"),
                    kept: held
                },
                "{side}"
            );
            assert!(
                matches!(&seen[i + 1], Event::Done { path, .. } if &path[..] == b"t/big"),
                "{side}: {seen:?}"
            );
        }
    }

    /// A quick-check thread that panics (a test hook makes it, for a file of this name)
    /// ends the copy with an error that says so, rather than a hang.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_quick_check_thread_that_panics_ends_the_copy() {
        let src = tempfile::tempdir().unwrap();
        let dst = tempfile::tempdir().unwrap();
        let tree = src.path().join("t");
        // Many folders: probes keep going to every thread, the one that panicked included.
        for i in 0..400 {
            let dir = tree.join(format!("d{:02}", i % 40));
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(dir.join(format!("f{i}")), [i as u8; 10]).unwrap();
        }
        std::fs::write(tree.join("d00/probe-panics-here"), b"x").unwrap();
        let e = copy(&tree, dst.path())
            .await
            .expect_err("a quick-check thread panicked, yet the copy succeeded");
        assert!(e.to_string().contains("panicked"), "{e}");
    }
}
