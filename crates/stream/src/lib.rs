//! The fastcp copy engine: walk, chunk, schedule, reassemble and verify a tree of files over
//! any number of byte streams.
//!
//! The engine is modelled on `tar | ssh`: one pipelined stream of many files with no round
//! trip per file. It goes further in two ways: big files are cut into chunks spread over
//! several streams, and every file is verified against the sender's checksum before it is
//! renamed into place (XXH3-128 of its chunks from protocol version 3, BLAKE3 before; see
//! [`whole_file_checksum`] for why a non-cryptographic hash is enough).
//!
//! - [`send`] walks the sources ([`walk`]) and streams the manifest and the file contents over
//!   `N` streams; [`receive`] writes them beneath a destination. Both run over any
//!   `AsyncRead + AsyncWrite` streams that a session has already set up (SSH channels, sealed
//!   TCP, in-memory pipes) and speak the frames of [`fastcp_proto`].
//! - [`copy_local`] runs both in one process over in-memory pipes: the local copy.
//! - [`relay`] passes a sender's frames, checked, to a receiver elsewhere, and the
//!   receiver's replies back: a copy between two remote hosts through this process.
//! - [`Progress`] holds counters a user interface polls; [`Report`] is what a finished
//!   transfer returns, with the entries that failed on either side; [`Error`] is what stops
//!   one.
//!
//! Memory stays bounded whatever the size of the tree or of its files: every queue between
//! the stages is bounded in bytes or entries.
//!
//! Both sides run on a tokio runtime with its time driver enabled (`#[tokio::main]`, or a
//! builder's `enable_all`), and use its blocking pool for file system work.
//!
//! # Example
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use std::sync::Arc;
//! use fastcp_stream::{copy_local, Progress, ReceiveConfig, SendConfig};
//!
//! let src = tempfile::tempdir()?;
//! let dst = tempfile::tempdir()?;
//! std::fs::create_dir(src.path().join("project"))?;
//! std::fs::write(src.path().join("project/notes.txt"), b"fast")?;
//!
//! let send = SendConfig { recursive: true, ..SendConfig::default() };
//! let receive = ReceiveConfig { recursive: true, ..ReceiveConfig::default() };
//! let report = copy_local(
//!     &[src.path().join("project")],
//!     dst.path(),
//!     &send,
//!     &receive,
//!     4,
//!     Arc::new(Progress::default()),
//! )
//! .await?;
//! assert!(report.is_complete());
//! assert_eq!(report.local.files, 1);
//! assert_eq!(std::fs::read(dst.path().join("project/notes.txt"))?, b"fast");
//! # Ok(()) }
//! ```
#![deny(missing_docs)]

mod attrs;
mod budget;
mod checksum;
mod dest;
mod display;
mod error;
mod event;
mod filter;
mod mirror;
mod pattern;
mod pieces;
mod pipe;
mod probe;
mod progress;
mod receive;
mod relay;
mod report;
mod resume;
mod send;
mod tree;
mod walk;

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

pub use attrs::KeepAttrs;
pub use checksum::{
    ContentHash, FileChecksum, SHA256_RANGE, sha256_of_ranges, whole_file_checksum,
};
pub use dest::{SAFE_MODE_BITS, is_temp_name, is_work_file, reserve_fds};
pub use display::escape;
pub use error::Error;
pub use event::{Event, EventSink, SkipReason};
pub use fastcp_proto::{ErrorCode, Meta, SpecialKind, Summary};
pub use filter::{Filter, Predicate, Unfound};
pub use mirror::{
    DeleteBudget, NOTHING_DELETED, Spared, entries_at, holds_excluded_at, mirror_order,
};
pub use pattern::{expand_sources, has_wildcard, is_pattern, name_matches};
pub use pipe::{
    ByteReader, ByteWriter, PipeReader, PipeSource, PipeWriter, ReadInto, WriteFrom, frame_pipe,
    receiver_pipe,
};
pub use probe::same_mtime;
pub use progress::{Counted, Progress, Snapshot};
pub use receive::{
    DEFAULT_MAX_ENTRIES, DEFAULT_RECEIVE_IN_FLIGHT, DEFAULT_WRITER_THREADS, ReceiveConfig,
    SkipRules, check_destination, receive, receive_from, receive_piped,
};
pub use relay::{RelayConfig, RelayError, relay};
pub use report::{Failure, MAX_FAILURES, Report, Side};
pub use resume::{PARTIAL_MIN, partial_name, partial_target};
pub use send::{
    DEFAULT_CHUNK_SIZE, DEFAULT_SEND_IN_FLIGHT, Piece, SendConfig, check_readable, send,
    send_beside, send_to,
};
pub use walk::{Entry, EntryKind, Walk, WalkAhead, WalkConfig, walk};

/// The buffer of an in-memory byte pipe (`tokio::io::duplex`) between a sender and a receiver
/// in one process, when something must sit between them (a rate limit, say); [`copy_local`]
/// itself uses pipes that pass buffers without copying, each bounded by this much.
///
/// Every byte is copied into a byte pipe and out again; a pipe that fits in the CPU's L2
/// cache keeps the second copy cheap. Measured on a 2 GiB file (2 cores, tmpfs): 64 KiB to
/// 512 KiB cost about the same CPU time, 1 MiB about 5% more.
pub const LOCAL_PIPE_BUFFER: usize = 256 << 10;

/// Copies `sources` to `dest` on this machine, through the same engine and protocol as a
/// network copy: [`send`] and [`receive`] in one process, over `streams` in-memory pipes.
///
/// The pipes carry the protocol's encoded frames as shared buffers rather than as a byte
/// stream: the content of a file of 256 KiB or more reaches the receiver as the very
/// buffers the sender read it into, which takes two copies of every byte off a local copy;
/// smaller files come many to a buffer (one hand-over for many files), which the receiver
/// copies once.
/// The receiver still decodes every frame, checks every path and checks that every file
/// arrived whole, each range once. With [`SendConfig::hash_content`] and
/// [`ReceiveConfig::hash_content`] off on both sides (as fastcp's own local copy sets them) it
/// hashes no byte: both sides would hash the very same buffers.
///
/// Returns the receiver's [`Report`]: `local` is what was written, `peer` what was sent, and
/// `failures` lists the entries that failed on either side. See the [crate example](crate).
pub async fn copy_local(
    sources: &[PathBuf],
    dest: &Path,
    send_config: &SendConfig,
    receive_config: &ReceiveConfig,
    streams: usize,
    progress: Arc<Progress>,
) -> Result<Report, Error> {
    let n = streams.max(1);
    let (sinks, sources_in): (Vec<_>, Vec<_>) =
        (0..n).map(|_| pipe::local(LOCAL_PIPE_BUFFER)).unzip();
    // The receiver's replies (errors, its final report) go back through a byte pipe.
    let (reply_in, reply_out) = tokio::io::duplex(64 << 10);
    let mut receive_config = receive_config.clone();
    // Both ends are ours: accept the chunks we send.
    let needed = (send_config.chunk_size + 64).min(fastcp_proto::HARD_MAX_FRAME as usize) as u32;
    receive_config.max_frame = receive_config.max_frame.max(needed);
    let (sent, received) = tokio::join!(
        send::send_over(
            sources,
            reply_in,
            sinks,
            send_config,
            progress.clone(),
            false
        ),
        receive::receive_over(dest, sources_in, reply_out, &receive_config, progress),
    );
    match (sent, received) {
        (Ok(_), Ok(report)) => Ok(report),
        (Err(e), Ok(_)) => Err(e),
        // The sender's own failure explains a receiver that saw its streams close.
        (Err(e), Err(r)) if r.is_disconnect() => Err(e),
        (_, Err(r)) => Err(r),
    }
}

/// Maps an I/O error on a stream: a closed connection or another failure.
pub(crate) fn stream_error(stream: usize, e: io::Error, during: &'static str) -> Error {
    match e.kind() {
        io::ErrorKind::BrokenPipe
        | io::ErrorKind::ConnectionReset
        | io::ErrorKind::ConnectionAborted
        | io::ErrorKind::UnexpectedEof => Error::ConnectionClosed { stream, during },
        _ => Error::Stream { stream, source: e },
    }
}
