//! The fastcp wire protocol, sans-IO.
//!
//! This crate knows how fastcp's bytes look on the wire and nothing else: it has no sockets,
//! no clock and no async runtime. The engine (`fastcp-stream`) and the transports
//! (`fastcp-transport`) feed it bytes and take frames out, or the other way round.
//!
//! - [`Frame`] is every message fastcp sends: the [`Hello`] handshake, the session
//!   [`Request`] and [`Accept`], manifest entries ([`DirEntry`], [`FileEntry`],
//!   [`SymlinkEntry`]), file [`Data`] chunks, [`FileEnd`] with the file's checksum, [`ErrorFrame`]
//!   and [`Done`].
//! - [`encode`] appends a frame to a buffer; [`Decoder`] takes frames out of a buffer
//!   incrementally, returning `Ok(None)` while it needs more bytes and checking every length
//!   against a cap before it allocates.
//! - [`Handshake`] negotiates the protocol version and frame size from two [`Hello`]s.
//! - [`path`] validates the relative paths that travel in entries.
//!
//! The full format is specified in `docs/protocol.md`.
//!
//! # Example
//!
//! ```
//! use bytes::BytesMut;
//! use fastcp_proto::{encode, Decoder, Frame, FileEnd};
//!
//! let mut wire = BytesMut::new();
//! encode(&Frame::FileEnd(FileEnd { id: 7, hash: [0xab; 32] }), &mut wire);
//!
//! let mut decoder = Decoder::new(fastcp_proto::DEFAULT_MAX_FRAME);
//! // Half a frame is not a frame yet.
//! let mut partial = wire.split_to(10);
//! assert!(decoder.decode(&mut partial).unwrap().is_none());
//! partial.unsplit(wire);
//! let frame = decoder.decode(&mut partial).unwrap().unwrap();
//! assert_eq!(frame, Frame::FileEnd(FileEnd { id: 7, hash: [0xab; 32] }));
//! ```
#![deny(missing_docs)]

mod codec;
mod frame;
mod handshake;
pub mod path;

pub use codec::{DecodeError, Decoder, encode, encode_data_header};
pub use frame::*;
pub use handshake::{Handshake, HandshakeError, Negotiated};

/// The first bytes of every [`Hello`] payload.
pub const MAGIC: [u8; 8] = *b"FASTCP\r\n";
/// The protocol version this build speaks. Version 2 adds the [`Totals`] frame; version 3
/// makes the [`FileEnd`] checksum XXH3-128 instead of BLAKE3; version 4 adds the quick check
/// ([`Probe`], [`Answer`], request flag [`flags::SKIP_UNCHANGED`]); version 5 adds the
/// file's mode to a [`Probe`], so that a receiver brings a file it skips in line with the
/// source's mode, times, owner and attributes, as rsync does; version 6 adds the [`Piece`](Frame::Piece)
/// entry, a range of a file, for a copy split over several runs (`--shard`); version 7 adds
/// the receiver's [`Deleted`] and [`Busy`](Frame::Busy) frames, which show the sender what a
/// mirror removed and that the receiver is still at work after the last entry; version 8
/// adds the [`Hole`] frame, a sparse file's hole in place of its zeros; version 9 adds the
/// request flag [`flags::NO_CONTENT_HASH`], a copy that hashes no file content where the
/// transport authenticates every byte, and [`flags::NEW_TARGET_DIR`], a destination folder
/// made by the one source; version 10 adds the request flag [`flags::LINK_DEST`], a
/// reference folder whose unchanged files the receiver links instead of receiving them;
/// version 11 adds the request flags [`flags::ONE_FILE_SYSTEM`], a pull's walk that stays on
/// the file system of each source, and [`flags::SIZE_ONLY`], [`flags::IGNORE_EXISTING`] and
/// [`flags::UPDATE`], which leave more files as they are; version 12 adds the request flag
/// [`flags::MAX_DELETE`], a limit on what a mirror removes; version 13 reads the filter
/// lines as rsync 3 does (its wildcards and quoting, and for a folder's contents the paths
/// beneath it); version 14 lists another name of a file (`-H`) in a push's dry run as a
/// [`HardLink`], so that the receiving side judges whether that link is in place, and
/// judges the folders leading to a `--files-from` list's paths as rsync's implied folders
/// (made for the paths the rules let through, not asked of the rules themselves).
pub const PROTOCOL_VERSION: u16 = 14;
/// The oldest protocol version this build still speaks.
pub const MIN_PROTOCOL_VERSION: u16 = 1;
/// Bytes of the frame header: a one-byte kind and a four-byte big-endian payload length.
pub const HEADER_LEN: usize = 5;
/// The default cap on a frame's payload, offered in [`Hello::max_frame`].
pub const DEFAULT_MAX_FRAME: u32 = 4 << 20;
/// No peer may make us accept a frame larger than this, whatever it offers.
pub const HARD_MAX_FRAME: u32 = 64 << 20;
/// The cap on a path's length in bytes.
pub const MAX_PATH: usize = 4096;
/// The cap on a single path component's length in bytes.
pub const MAX_NAME: usize = 255;
/// The cap on a path's depth, in components: deeper trees exist only to exhaust a peer (each
/// level is a directory handle the receiver opens).
pub const MAX_DEPTH: usize = 1024;
/// The cap on human-readable text (error messages, software versions) in bytes.
pub const MAX_TEXT: usize = 4096;
