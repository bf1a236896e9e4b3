//! Per-entry events, for programs that log or show what a transfer does file by file.

use std::fmt;
use std::sync::Arc;

use bytes::Bytes;

use crate::report::Failure;

/// What happened to one entry, as it happens. Paths are wire paths (relative to the
/// transfer's root, '/'-separated, raw bytes: escape them with [`crate::escape`] to print).
///
/// Events come from the receiving side when it runs in this process (a local copy, a pull,
/// a server's receiver), where a file is done once it is verified and under its final name;
/// otherwise (a push) from the sending side, where a file is done once its last byte is
/// handed to the streams, and the receiver's verdict on it arrives as a [`Event::Failed`] if
/// it failed there.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Event {
    /// A regular file's bytes started to arrive (or to leave).
    Started {
        /// The file.
        path: Bytes,
        /// Its size in bytes.
        size: u64,
    },
    /// More of a big file (one cut into chunks) has been written (or handed to the
    /// streams): `done` of its `size` bytes, counting what `--resume` kept. One for each chunk
    /// but the last, which [`Event::Done`] stands for.
    Progress {
        /// The file.
        path: Bytes,
        /// Its bytes done so far.
        done: u64,
        /// Its size in bytes.
        size: u64,
    },
    /// A regular file is done.
    Done {
        /// The file.
        path: Bytes,
        /// Its size in bytes.
        bytes: u64,
        /// Its checksum matched and it took its final name (the receiving side); false on
        /// the sending side, which only knows that it was sent.
        verified: bool,
    },
    /// A regular file continued from the partial file an earlier copy left (`--resume`):
    /// `kept` of its bytes were there already and were not sent again. It comes before the
    /// file's [`Event::Done`].
    Resumed {
        /// The file.
        path: Bytes,
        /// Its bytes the partial file held.
        kept: u64,
    },
    /// A regular file was not sent: the destination has it already.
    Skipped {
        /// The file.
        path: Bytes,
        /// Its size in bytes.
        size: u64,
        /// Why.
        reason: SkipReason,
    },
    /// An entry `--delete` removed from the destination (a directory with what was in it).
    Deleted {
        /// The entry.
        path: Bytes,
    },
    /// An entry could not be copied; the transfer went on without it.
    Failed(Failure),
    /// The copy ended without a fatal error, with this summary: the last event of a copy
    /// that returns `Ok` (see [`Progress::finished`](crate::Progress::finished)).
    Finished(Box<crate::Report>),
    /// The copy stopped on a fatal error (a lost connection, a refused login, a cancel): the
    /// last event of a copy that returns `Err`, which holds the typed error (see
    /// [`Progress::aborted`](crate::Progress::aborted)). Where the events come from the
    /// receiving side, the files done before it are done (each had its [`Event::Done`]) and
    /// nothing else is under a final name. On a push (and a relay between two hosts),
    /// whose events come from the sending side, a `Done` only says the file was handed to
    /// the streams (passed on): whether it landed before the stop, only a rerun
    /// (`--skip-unchanged`) finds out; nothing partial is under a final name either way.
    Aborted {
        /// The error, as the copy's `Err` words it.
        message: String,
        /// The counters when it stopped: what had been walked, sent, written and skipped.
        progress: crate::Snapshot,
    },
}

/// Why a file was skipped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum SkipReason {
    /// Same size and modification time (the quick check).
    Unchanged,
    /// Same size and content hash (`checksum`).
    SameContent,
    /// Made a hard link to the reference folder's file of the same size and time
    /// ([`ReceiveConfig::link_dest`](crate::ReceiveConfig::link_dest)). Only the receiving
    /// side knows it: a sender's event for such a file says [`Unchanged`](Self::Unchanged).
    Linked,
    /// Something is there already, left as it is
    /// ([`SkipRules::existing`](crate::SkipRules::existing)). Only the receiving side knows
    /// it, as for [`Linked`](Self::Linked).
    Exists,
    /// What is there already is newer, left as it is
    /// ([`SkipRules::newer`](crate::SkipRules::newer)). Only the receiving side knows it, as
    /// for [`Linked`](Self::Linked).
    Newer,
}

impl SkipReason {
    /// Why the quick check skips a file: by content with `checksum`, else by times.
    pub(crate) fn of(checksum: bool) -> SkipReason {
        if checksum {
            SkipReason::SameContent
        } else {
            SkipReason::Unchanged
        }
    }
}

/// Where a transfer's [`Event`]s go: a function called on the engine's threads, as each
/// event happens. Keep it quick (hand the event to a channel, say); it must not block.
#[derive(Clone)]
pub struct EventSink(Arc<dyn Fn(&Event) + Send + Sync>);

impl EventSink {
    /// A sink that calls `f` for each event.
    pub fn new(f: impl Fn(&Event) + Send + Sync + 'static) -> EventSink {
        EventSink(Arc::new(f))
    }

    pub(crate) fn emit(&self, event: &Event) {
        (self.0)(event)
    }
}

impl fmt::Debug for EventSink {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("EventSink")
    }
}
