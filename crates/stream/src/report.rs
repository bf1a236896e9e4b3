//! What a finished transfer reports.

use std::fmt;

use bytes::Bytes;
use fastcp_proto::{ErrorCode, ErrorFrame, Summary};

/// The most [`Failure`]s a [`Report`] keeps; later ones are only counted.
pub const MAX_FAILURES: usize = 10_000;

/// Which side of the transfer an entry failed on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Side {
    /// The side that reads the source files.
    Sender,
    /// The side that writes the destination.
    Receiver,
}

impl Side {
    /// `"sender"` or `"receiver"`, as the `--json` report names the side.
    ///
    /// ```
    /// assert_eq!(fastcp_stream::Side::Receiver.name(), "receiver");
    /// ```
    pub fn name(self) -> &'static str {
        match self {
            Side::Sender => "sender",
            Side::Receiver => "receiver",
        }
    }
}

/// One entry that could not be copied. The transfer went on without it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Failure {
    /// Where it failed.
    pub side: Side,
    /// The path concerned: the wire path (relative to the transfer's root) or, for a source
    /// that could not even be named, the local path. Raw bytes; see [`crate::escape`].
    pub path: Bytes,
    /// What kind of failure.
    pub code: ErrorCode,
    /// A human-readable message, which already names the file.
    pub message: String,
}

impl Failure {
    /// A failure of the entry at `path` on `side`; `message` names the entry already.
    ///
    /// ```
    /// use fastcp_stream::{ErrorCode, Failure, Side};
    ///
    /// let f = Failure::new(Side::Sender, "dir/a".into(), ErrorCode::NotFound, "dir/a: gone".into());
    /// assert_eq!(f.to_string(), "dir/a: gone");
    /// ```
    pub fn new(side: Side, path: Bytes, code: ErrorCode, message: String) -> Failure {
        Failure {
            side,
            path,
            code,
            message,
        }
    }

    pub(crate) fn from_frame(side: Side, frame: &ErrorFrame) -> Failure {
        Failure {
            side,
            // A copy: a slice would pin the whole receive buffer it was cut from.
            path: Bytes::copy_from_slice(&frame.path),
            code: frame.code,
            message: frame.message.clone(),
        }
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The message names the file already; the path is kept for programs.
        f.write_str(&self.message)
    }
}

/// The outcome of a transfer that ran to its end.
///
/// A transfer that ends with `Ok(Report)` may still have skipped entries: check
/// [`Report::is_complete`] and list [`Report::failures`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Report {
    /// This side's totals: what the sender sent, or what the receiver wrote.
    pub local: Summary,
    /// The peer's totals: the receiver's final report to a sender, or the sum of the
    /// sender's per-stream totals to a receiver.
    pub peer: Summary,
    /// Entries that failed on either side, at most [`MAX_FAILURES`] of them.
    pub failures: Vec<Failure>,
    /// How many failures there were in all, including any not kept in `failures`.
    pub failure_count: u64,
    /// Files the quick check found unchanged on the receiver and did not send.
    pub files_skipped: u64,
    /// Their total size in bytes.
    pub bytes_skipped: u64,
    /// File bytes that went over the streams (payload, before any compression or
    /// sealing): on the sender its own count, on the receiver the sender's.
    pub bytes_sent: u64,
    /// Bytes of files that the receiver's partial copies already held, which were not sent
    /// again (`--resume`).
    pub bytes_resumed: u64,
}

impl Report {
    /// True when every entry was copied.
    pub fn is_complete(&self) -> bool {
        self.failure_count == 0
    }

    pub(crate) fn push_failure(&mut self, failure: Failure) {
        self.failure_count += 1;
        if self.failures.len() < MAX_FAILURES {
            self.failures.push(failure);
        }
    }
}
