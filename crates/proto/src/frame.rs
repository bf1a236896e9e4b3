//! The frames fastcp sends, as plain data.

use bytes::Bytes;

/// One protocol message.
///
/// Every frame travels as a one-byte [`Frame::kind`], a four-byte big-endian payload length and
/// the payload. See `docs/protocol.md` for each payload's layout.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Frame {
    /// First frame on the control stream, in both directions.
    Hello(Hello),
    /// Client to server: what this session does.
    Request(Request),
    /// Server to client: the request is accepted; where the extra streams connect.
    Accept(Accept),
    /// Server to client on a freshly opened data connection: prove you know the session secret.
    Challenge(Challenge),
    /// Client to server, first frame on every extra data stream.
    Join(Join),
    /// A directory of the manifest.
    Dir(DirEntry),
    /// A regular file of the manifest. Its bytes follow in [`Data`] frames on any stream.
    File(FileEntry),
    /// A range of a regular file of the manifest, from one of several runs that each send a
    /// range of it (`--shard`, protocol version 6). Its bytes follow in [`Data`] frames, all
    /// within the range; the receiver assembles the file from the runs' pieces.
    Piece(PieceEntry),
    /// A symbolic link of the manifest, kept as a link.
    Symlink(SymlinkEntry),
    /// A named pipe, socket or device node of the manifest ([`flags::SPECIALS`],
    /// [`flags::DEVICES`]).
    Special(SpecialEntry),
    /// A chunk of a file's bytes.
    Data(Data),
    /// All of a file's chunks have been sent; carries the file's checksum.
    FileEnd(FileEnd),
    /// The sender's walk is complete: how many files and bytes the copy holds in all, for the
    /// receiver's progress display (protocol version 2).
    Totals(Totals),
    /// Sender to receiver, with the quick check (protocol version 4): a regular file the
    /// sender would send, by size and modification time, before any of its bytes.
    Probe(Probe),
    /// Receiver to sender, the reply to a [`Probe`]: send the file, or skip it because the
    /// receiver already has it with that size and modification time.
    Answer(Answer),
    /// With `-H` (protocol version 4): `path` is another name of the regular file sent
    /// earlier in this session as `target`.
    HardLink(HardLink),
    /// Receiver to sender, with `--resume`, just before the [`Answer`] that asks for a file:
    /// the hashes of the blocks its partial copy of the file already holds.
    Partial(Partial),
    /// Sender to receiver, with `--resume`: a block of a file that the receiver's partial
    /// copy already holds, in place of its bytes.
    Keep(Keep),
    /// A range of a file that holds no data on the sender, a hole of a sparse file
    /// (protocol version 8): it reads as zeros, and none of its bytes travel.
    Hole(Hole),
    /// Sender to receiver, with [`flags::ONE_FILE_SYSTEM`] (protocol version 11): a
    /// directory sent without its contents, a mount point the walk did not enter.
    Unentered(Unentered),
    /// Sender to receiver, with [`flags::OWNER`], [`flags::GROUP`], [`flags::XATTRS`] or
    /// [`flags::ACLS`]: the owner and extended attributes of the entry that follows it on the
    /// same stream.
    Attrs(Attrs),
    /// Receiver to sender, with [`flags::DELETE`] (protocol version 7): an entry the
    /// receiver removed because the sender does not have it.
    Deleted(Deleted),
    /// Receiver to sender (protocol version 7): the receiver got on with its work in the
    /// last quarter second. It comes at most that often, until the [`Done`](Frame::Done),
    /// so that a sender that has sent everything and waits for the receiver (writing its
    /// last files, removing extras, making hard links, setting folder times) does not take
    /// the wait for a stall.
    Busy,
    /// Something went wrong with one entry, or with the whole session.
    Error(ErrorFrame),
    /// The end of a stream (sender to receiver) or the final report (receiver to sender).
    Done(Summary),
}

/// Frame kinds, the first byte of every frame.
#[allow(missing_docs)]
pub mod kind {
    pub const HELLO: u8 = 0x01;
    pub const REQUEST: u8 = 0x02;
    pub const ACCEPT: u8 = 0x03;
    pub const CHALLENGE: u8 = 0x04;
    pub const JOIN: u8 = 0x05;
    pub const DIR: u8 = 0x10;
    pub const FILE: u8 = 0x11;
    pub const SYMLINK: u8 = 0x12;
    pub const DATA: u8 = 0x13;
    pub const FILE_END: u8 = 0x14;
    pub const TOTALS: u8 = 0x15;
    pub const PROBE: u8 = 0x16;
    pub const HARD_LINK: u8 = 0x17;
    pub const KEEP: u8 = 0x18;
    pub const ATTRS: u8 = 0x19;
    pub const SPECIAL: u8 = 0x1a;
    pub const ERROR: u8 = 0x20;
    pub const DONE: u8 = 0x21;
    pub const ANSWER: u8 = 0x22;
    pub const PARTIAL: u8 = 0x23;
    pub const PIECE: u8 = 0x1b;
    pub const DELETED: u8 = 0x24;
    pub const BUSY: u8 = 0x25;
    pub const HOLE: u8 = 0x26;
    pub const UNENTERED: u8 = 0x27;
}

impl Frame {
    /// The kind byte that introduces this frame on the wire.
    pub fn kind(&self) -> u8 {
        match self {
            Frame::Hello(_) => kind::HELLO,
            Frame::Request(_) => kind::REQUEST,
            Frame::Accept(_) => kind::ACCEPT,
            Frame::Challenge(_) => kind::CHALLENGE,
            Frame::Join(_) => kind::JOIN,
            Frame::Dir(_) => kind::DIR,
            Frame::File(_) => kind::FILE,
            Frame::Piece(_) => kind::PIECE,
            Frame::Symlink(_) => kind::SYMLINK,
            Frame::Data(_) => kind::DATA,
            Frame::FileEnd(_) => kind::FILE_END,
            Frame::Totals(_) => kind::TOTALS,
            Frame::Probe(_) => kind::PROBE,
            Frame::Answer(_) => kind::ANSWER,
            Frame::HardLink(_) => kind::HARD_LINK,
            Frame::Partial(_) => kind::PARTIAL,
            Frame::Keep(_) => kind::KEEP,
            Frame::Hole(_) => kind::HOLE,
            Frame::Unentered(_) => kind::UNENTERED,
            Frame::Attrs(_) => kind::ATTRS,
            Frame::Special(_) => kind::SPECIAL,
            Frame::Deleted(_) => kind::DELETED,
            Frame::Busy => kind::BUSY,
            Frame::Error(_) => kind::ERROR,
            Frame::Done(_) => kind::DONE,
        }
    }

    /// A short name for messages, such as "Data".
    pub fn name(&self) -> &'static str {
        match self {
            Frame::Hello(_) => "Hello",
            Frame::Request(_) => "Request",
            Frame::Accept(_) => "Accept",
            Frame::Challenge(_) => "Challenge",
            Frame::Join(_) => "Join",
            Frame::Dir(_) => "Dir",
            Frame::File(_) => "File",
            Frame::Piece(_) => "Piece",
            Frame::Symlink(_) => "Symlink",
            Frame::Data(_) => "Data",
            Frame::FileEnd(_) => "FileEnd",
            Frame::Totals(_) => "Totals",
            Frame::Probe(_) => "Probe",
            Frame::Answer(_) => "Answer",
            Frame::HardLink(_) => "HardLink",
            Frame::Partial(_) => "Partial",
            Frame::Keep(_) => "Keep",
            Frame::Hole(_) => "Hole",
            Frame::Unentered(_) => "Unentered",
            Frame::Deleted(_) => "Deleted",
            Frame::Busy => "Busy",
            Frame::Attrs(_) => "Attrs",
            Frame::Special(_) => "Special",
            Frame::Error(_) => "Error",
            Frame::Done(_) => "Done",
        }
    }
}

/// The handshake: who we are and what we can do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hello {
    /// The newest protocol version this side speaks.
    pub version: u16,
    /// The oldest protocol version this side still speaks.
    pub min_version: u16,
    /// CPU feature bits, as defined by `fastcp-crypto` (bit 0: hardware AES, ...).
    pub cpu_features: u32,
    /// Cipher suite ids this side accepts, most preferred first.
    pub ciphers: Vec<u8>,
    /// Compression ids this side accepts (0 = none, 1 = zstd).
    pub compression: Vec<u8>,
    /// The largest frame payload this side accepts.
    pub max_frame: u32,
    /// The software and its version, such as "fastcp 0.1.0", for diagnostics.
    pub software: String,
}

/// What the session does, sent by the client after the handshake.
#[derive(Clone, PartialEq, Eq)]
pub struct Request {
    /// Which way the files flow.
    pub direction: Direction,
    /// For [`Direction::Push`], exactly one path: the destination. For [`Direction::Pull`],
    /// the source paths on the server.
    pub paths: Vec<Bytes>,
    /// Option bits, see [`flags`].
    pub flags: u32,
    /// How many data streams the client wants, at least 1.
    pub streams: u16,
    /// How the extra data streams reach the server.
    pub transport: TransportKind,
    /// The cipher suite id for sealed transports (0 when unused).
    pub cipher: u8,
    /// The compression id (0 = none).
    pub compression: u8,
    /// The client's contribution to the session secret.
    pub client_random: [u8; 32],
    /// For [`TransportKind::Tcp`]: the ports the server may listen on, inclusive; `(0, 0)`
    /// lets the server choose.
    pub tcp_ports: (u16, u16),
    /// With [`flags::FILTERS`]: include and exclude rules, `+ PATTERN` or `- PATTERN` each,
    /// in order (rsync's meaning; the sender walks by them, the receiver keeps what they
    /// exclude from mirroring), and with [`flags::FILES_FROM`] `= PATH` lines.
    pub filters: Vec<Bytes>,
    /// With [`flags::LINK_DEST`] (a push): the receiver's reference folder (rsync's
    /// `--link-dest`), as the user wrote it; a relative one is taken from the destination.
    pub link_dest: Option<Bytes>,
    /// With [`flags::MAX_DELETE`]: how many entries the mirror may remove at most (a
    /// directory counts with everything in it).
    pub max_delete: Option<u64>,
}

/// Option bits of [`Request::flags`].
pub mod flags {
    /// Copy directories recursively (scp's `-r`).
    pub const RECURSIVE: u32 = 1 << 0;
    /// Preserve modes and modification times (scp's `-p`).
    pub const PRESERVE: u32 = 1 << 1;
    /// Follow symbolic links instead of copying them as links.
    pub const FOLLOW_LINKS: u32 = 1 << 2;
    /// List what would be copied, write nothing.
    pub const DRY_RUN: u32 = 1 << 3;
    /// The destination must be an existing directory (several sources, or a trailing '/').
    pub const TARGET_IS_DIR: u32 = 1 << 4;
    /// A throughput test (with [`Direction::Push`](super::Direction::Push)): the client
    /// sends arbitrary bytes on every data stream until it ends them, and the server counts
    /// and discards them, then answers `Done` with the count on stream 0. No path is used and
    /// nothing is written.
    pub const THROUGHPUT: u32 = 1 << 5;
    /// The receiver flushes each file to stable storage before it takes its final name, and
    /// the directories it wrote into at the end (`--fsync`). A server that does not know the
    /// bit refuses the request rather than copy without it.
    pub const FSYNC: u32 = 1 << 6;
    /// The quick check (protocol version 4): the sender probes each regular file with its
    /// size and modification time, and sends only those the receiver does not have alike.
    pub const SKIP_UNCHANGED: u32 = 1 << 7;
    /// Mirror: once everything has arrived, the receiver removes what each directory sent
    /// holds and the sender did not send (rsync's `--delete`).
    pub const DELETE: u32 = 1 << 8;
    /// The request carries include and exclude rules ([`super::Request::filters`]).
    pub const FILTERS: u32 = 1 << 9;
    /// Keep hard links (`-H`): the sender sends a file's further names as `HardLink` entries.
    pub const HARD_LINKS: u32 = 1 << 10;
    /// With [`SKIP_UNCHANGED`]: compare content instead of modification times. A receiver
    /// that has a file of the probe's size answers with its hash; the sender, having hashed
    /// its own meanwhile, skips the file when they match.
    pub const CHECKSUM: u32 = 1 << 11;
    /// With [`TransportKind::Tcp`](super::TransportKind::Tcp): the data streams reach the
    /// server through SSH port forwarding (`ssh -W 127.0.0.1:PORT`, when the client runs the
    /// system ssh through a proxy), so the server listens on its loopback address and expects
    /// them from there. They join and are sealed as direct TCP streams are.
    pub const FORWARDED: u32 = 1 << 12;
    /// With [`SKIP_UNCHANGED`]: continue partial files (`--resume`). The receiver keeps a
    /// big file's temp file under a fixed name when a copy stops before the file is complete,
    /// answers a later probe for it with the hashes of the blocks it holds
    /// ([`super::Partial`]), and the sender sends [`super::Keep`] for each block that
    /// matches instead of its bytes.
    pub const RESUME: u32 = 1 << 13;
    /// Keep each entry's owner (`--owner`): the sender precedes entries with [`super::Attrs`],
    /// and a receiver running as root sets the owner, by user name unless
    /// [`NUMERIC_IDS`] (a name it does not know falls back to the number).
    pub const OWNER: u32 = 1 << 14;
    /// Keep each entry's group (`--group`), mapped as [`OWNER`] maps users. A receiver that
    /// is not root sets it where it may (a group it belongs to).
    pub const GROUP: u32 = 1 << 15;
    /// With [`OWNER`] or [`GROUP`]: use the numbers, never the names (`--numeric-ids`).
    pub const NUMERIC_IDS: u32 = 1 << 16;
    /// Keep extended attributes (`-X`): the `user.` ones, and `trusted.` and `security.` as
    /// far as the receiver may set them.
    pub const XATTRS: u32 = 1 << 17;
    /// Keep POSIX ACLs (`-A`): the `system.posix_acl_access` and `system.posix_acl_default`
    /// attributes, with numeric ids inside.
    pub const ACLS: u32 = 1 << 18;
    /// Copy device nodes (`--devices`) as [`super::SpecialEntry`]s, where a sender would
    /// otherwise skip them with a warning. Only a receiver running as root can make them.
    pub const DEVICES: u32 = 1 << 19;
    /// Copy named pipes and sockets (`--specials`) as [`super::SpecialEntry`]s.
    pub const SPECIALS: u32 = 1 << 20;
    /// With [`FILTERS`]: some of the filter lines are `= PATH`, the paths of an rsync-style
    /// `--files-from` list (relative to a source's top): only they, the folders leading to
    /// them and what is beneath listed folders are copied, and mirroring keeps the rest.
    pub const FILES_FROM: u32 = 1 << 21;
    /// The one source names a folder's contents (`DIR/.`, as `cp -r DIR/. DEST` copies
    /// them): its top-level entry is the destination itself, even where that is an existing
    /// directory, instead of going beneath it (protocol version 7).
    pub const CONTENTS: u32 = 1 << 22;
    /// Neither side hashes file content (protocol version 9): each `FileEnd` checksum folds
    /// its file's ranges alone, as for a sender in the receiver's own process, because the
    /// transport authenticates every byte between the two fastcp processes (the sealed TCP
    /// streams; not SSH, whose MAC ends at sshd). A copy with
    /// [`RESUME`] hashes content regardless.
    pub const NO_CONTENT_HASH: u32 = 1 << 23;
    /// With [`TARGET_IS_DIR`] (protocol version 9): a destination that does not exist yet is
    /// made by the one top-level entry, which must be a directory (a trailing '/' after one
    /// source's destination, as `scp -r dir host:new/` makes `new`).
    pub const NEW_TARGET_DIR: u32 = 1 << 24;
    /// With [`SKIP_UNCHANGED`] (protocol version 10): the request carries a reference folder
    /// ([`super::Request::link_dest`], rsync's `--link-dest`). A file the destination does
    /// not hold alike, but the reference folder does (the same path, a regular file with the
    /// probe's size and time, and mode and owner where they are kept), becomes another name
    /// of the reference's file, a hard link, instead of being sent.
    pub const LINK_DEST: u32 = 1 << 25;
    /// The sender does not descend into directories on another file system than their
    /// top-level source (rsync's `-x`, protocol version 11): each such mount point is sent
    /// as an empty directory.
    pub const ONE_FILE_SYSTEM: u32 = 1 << 26;
    /// With [`SKIP_UNCHANGED`] (protocol version 11): a regular file of the probe's size is
    /// unchanged whatever its time (rsync's `--size-only`).
    pub const SIZE_ONLY: u32 = 1 << 27;
    /// With [`SKIP_UNCHANGED`] (protocol version 11): anything already at a probed path is
    /// left untouched, not sent (rsync's `--ignore-existing`).
    pub const IGNORE_EXISTING: u32 = 1 << 28;
    /// With [`SKIP_UNCHANGED`] (protocol version 11): anything already at a probed path with
    /// a later modification time than the probe's is left untouched (rsync's `--update`).
    pub const UPDATE: u32 = 1 << 29;
    /// With [`DELETE`] (protocol version 12): the request carries a limit
    /// ([`super::Request::max_delete`], rsync's `--max-delete`): the mirror removes at most
    /// that many entries and reports the extras it left.
    pub const MAX_DELETE: u32 = 1 << 30;
    /// All bits this version knows. Bit 31, the last, is kept to say that a second word of
    /// flags follows, for the options of a later version: a peer of this version refuses it
    /// as an unknown bit, as it refuses any other.
    pub const KNOWN: u32 = RECURSIVE
        | PRESERVE
        | FOLLOW_LINKS
        | DRY_RUN
        | TARGET_IS_DIR
        | THROUGHPUT
        | FSYNC
        | SKIP_UNCHANGED
        | DELETE
        | FILTERS
        | HARD_LINKS
        | CHECKSUM
        | FORWARDED
        | RESUME
        | OWNER
        | GROUP
        | NUMERIC_IDS
        | XATTRS
        | ACLS
        | DEVICES
        | SPECIALS
        | FILES_FROM
        | CONTENTS
        | NO_CONTENT_HASH
        | NEW_TARGET_DIR
        | LINK_DEST
        | ONE_FILE_SYSTEM
        | SIZE_ONLY
        | IGNORE_EXISTING
        | UPDATE
        | MAX_DELETE;
}

/// Which way the files flow in a session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// The client sends, the server receives.
    Push,
    /// The server sends, the client receives.
    Pull,
}

/// How the extra data streams of a session reach the server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TransportKind {
    /// Only the control stream carries data.
    Inline,
    /// Extra streams connect to a Unix socket on the server (forwarded SSH channels).
    Unix,
    /// Extra streams are raw TCP connections sealed with the session's AEAD.
    Tcp,
    /// Extra streams are handed to the server by the program that runs it in-process, from
    /// a transport of that program's own (an embedder's QUIC streams, an in-memory pipe).
    Caller,
}

/// The server's answer to a [`Request`].
#[derive(Clone, PartialEq, Eq)]
pub struct Accept {
    /// How many data streams the session will use.
    pub streams: u16,
    /// Where the extra streams connect.
    pub rendezvous: Rendezvous,
    /// The server's contribution to the session secret.
    pub server_random: [u8; 32],
}

// The two randoms make the session secret: Debug (and so any log line) shows neither.
impl std::fmt::Debug for Request {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Request")
            .field("direction", &self.direction)
            .field("paths", &self.paths)
            .field("flags", &format_args!("{:#x}", self.flags))
            .field("streams", &self.streams)
            .field("transport", &self.transport)
            .field("cipher", &self.cipher)
            .field("compression", &self.compression)
            .field("client_random", &format_args!(".."))
            .field("tcp_ports", &self.tcp_ports)
            .field("filters", &self.filters)
            .field("link_dest", &self.link_dest)
            .field("max_delete", &self.max_delete)
            .finish()
    }
}

impl std::fmt::Debug for Accept {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Accept")
            .field("streams", &self.streams)
            .field("rendezvous", &self.rendezvous)
            .field("server_random", &format_args!(".."))
            .finish()
    }
}

/// Where a session's extra data streams connect.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Rendezvous {
    /// No extra streams: everything travels on the control stream.
    None,
    /// A Unix socket path on the server.
    Unix(Bytes),
    /// A TCP port on the server; the client uses the address it reached the server at.
    Tcp(u16),
    /// The server takes its extra streams from the program that runs it
    /// ([`TransportKind::Caller`]).
    Caller,
}

/// A random challenge the server sends on a new data connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Challenge {
    /// Fresh random bytes.
    pub nonce: [u8; 32],
}

/// The first frame on an extra data stream: which stream it is, and proof of the secret.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Join {
    /// The stream's index, 1 for the first extra stream.
    pub index: u16,
    /// A MAC over the challenge (if any) and the index, keyed with the session secret.
    pub proof: [u8; 32],
}

/// What the sender's walk found in all, sent once the walk is complete.
///
/// It only feeds the receiver's progress display (a total and an ETA for a pull); nothing is
/// checked against it, and the entries it counts may still be on their way.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Totals {
    /// Regular files found.
    pub files: u64,
    /// Their total size in bytes.
    pub bytes: u64,
}

/// A file the sender would send, asked about before its bytes go (the quick check).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Probe {
    /// The probe's number, unique in the session; the [`Answer`] names it.
    pub id: u64,
    /// The file's wire path.
    pub path: Bytes,
    /// Its size in bytes.
    pub size: u64,
    /// Its modification time, seconds since the epoch.
    pub mtime: i64,
    /// Nanoseconds of the modification time.
    pub mtime_nsec: u32,
    /// Its permission bits (from protocol version 5; encoded after the other fields only
    /// when present).
    pub mode: Option<u32>,
}

/// What the receiver's partial copy of a file holds (`--resume`): the XXH3-128 of each of
/// its first `hashes.len()` blocks of `block` bytes (the last one may end at the file's end,
/// shorter). Sent just before the [`Answer`] to the probe it names.
///
/// A sender that cannot read its source to compare (fastcp's SFTP pull, whose reads would
/// cost what resuming saves) has its receiver offer by the record it keeps of what arrived
/// from that same version of the source instead: then a hash is [`NOT_HELD`] for a block
/// the record does not vouch for, and any other value for one it does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Partial {
    /// The probe answered.
    pub id: u64,
    /// The block size in bytes, at least 1.
    pub block: u64,
    /// The blocks' hashes, in file order; at most [`MAX_PARTIAL_HASHES`].
    pub hashes: Vec<u128>,
}

/// The most block hashes a [`Partial`] carries.
pub const MAX_PARTIAL_HASHES: usize = 16_384;

/// In a [`Partial`], a block the receiver does not hold: no sender takes a block whose
/// XXH3-128 is 0 to match it.
pub const NOT_HELD: u128 = 0;

/// A block of file `id` that the receiver's partial copy already holds (`--resume`): block
/// `offset / block` of the [`Partial`] the receiver sent, whose hash the sender found equal
/// to its own. It stands for `len` bytes at `offset` wherever a [`Data`] frame would.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Keep {
    /// The file, as numbered by its `File` entry.
    pub id: u64,
    /// Where the block starts.
    pub offset: u64,
    /// Its length.
    pub len: u64,
}

/// A hole of file `id` on the sender (protocol version 8): `len` bytes at `offset` that read
/// as zeros there and are not sent. It stands for them wherever a [`Data`] frame would; the
/// receiver leaves the range a hole, or zeroes it where its file held other data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Hole {
    /// The file, as numbered by its `File` entry.
    pub id: u64,
    /// Where the hole starts.
    pub offset: u64,
    /// Its length, at least 1.
    pub len: u64,
}

/// A directory of the manifest sent without its contents: a mount point that a walk staying
/// on one file system (`-x`) did not enter. It comes on any stream, before or after the
/// directory's own [`DirEntry`]. A mirroring receiver leaves what that directory holds, as
/// rsync leaves a mount point's contents.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unentered {
    /// Relative path, '/'-separated; see [`crate::path`].
    pub path: Bytes,
}

/// The owner and extended attributes of the entry that follows on the same stream (a `Dir`,
/// `File`, `Symlink` or `Probe` of the same path).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Attrs {
    /// The entry's wire path.
    pub path: Bytes,
    /// Owner's user id on the sender.
    pub uid: u32,
    /// Group id on the sender.
    pub gid: u32,
    /// The owner's user name on the sender, empty when it has none (at most
    /// [`MAX_ID_NAME`] bytes).
    pub user: Bytes,
    /// The group's name on the sender, empty when it has none.
    pub group: Bytes,
    /// Extended attributes, name and value, at most [`MAX_XATTRS`] of them; a name is at
    /// most [`MAX_XATTR_NAME`] bytes, a value at most [`MAX_XATTR_VALUE`].
    pub xattrs: Vec<(Bytes, Bytes)>,
}

/// The longest user or group name an [`Attrs`] carries.
pub const MAX_ID_NAME: usize = 256;
/// The most extended attributes an [`Attrs`] carries.
pub const MAX_XATTRS: usize = 1024;
/// The longest extended attribute name (Linux's `XATTR_NAME_MAX`).
pub const MAX_XATTR_NAME: usize = 255;
/// The largest extended attribute value (Linux's `XATTR_SIZE_MAX`).
pub const MAX_XATTR_VALUE: usize = 65_536;

/// Another name of a file sent earlier in the session (`-H`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HardLink {
    /// The new name's wire path.
    pub path: Bytes,
    /// The wire path of the `File` entry it is a name of.
    pub target: Bytes,
}

/// An entry the receiver removed (`--delete`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Deleted {
    /// Its wire path.
    pub path: Bytes,
    /// How many entries went: 1, or a folder with everything it held.
    pub entries: u64,
}

/// The receiver's reply to a [`Probe`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Answer {
    /// The probe answered.
    pub id: u64,
    /// True: send the file. False: the receiver has it, with that size and time; skip it
    /// (with [`flags::CHECKSUM`]: a file of that size, whose content hash is `hash`).
    pub send: bool,
    /// With [`flags::CHECKSUM`] and `send` false: the XXH3-128 of the receiver's file, for
    /// the sender to compare with its own (an optional trailing field).
    pub hash: Option<u128>,
}

/// File metadata common to manifest entries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Meta {
    /// Permission bits (the low 12 bits of `st_mode`).
    pub mode: u32,
    /// Modification time, seconds since the Unix epoch.
    pub mtime: i64,
    /// Nanoseconds within [`Meta::mtime`], below 1e9.
    pub mtime_nsec: u32,
    /// Access time, seconds and nanoseconds, when it travels: with `-p`, from protocol
    /// version 2 on (it is encoded after the other fields only when present).
    pub atime: Option<(i64, u32)>,
}

/// A directory of the manifest. It may be empty.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirEntry {
    /// Relative path, '/'-separated; see [`crate::path`].
    pub path: Bytes,
    /// Mode and mtime.
    pub meta: Meta,
}

/// A regular file of the manifest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileEntry {
    /// The id that this file's [`Data`] and [`FileEnd`] frames carry; unique in a session.
    pub id: u64,
    /// Relative path, '/'-separated; see [`crate::path`].
    pub path: Bytes,
    /// The file's size in bytes. The receiver expects exactly this many.
    pub size: u64,
    /// Mode and mtime.
    pub meta: Meta,
}

/// A range of a regular file: the bytes `[offset, offset + len)` of `file`, whose `size` is
/// the whole file's. Sent when a copy is split over several runs by bytes (`--shard`), each
/// sending a range of a file too big for one share. The [`FileEnd`] that closes it carries
/// the checksum of the range's chunks alone (protocol version 3's fold of the records of
/// the chunks it holds); the receiver writes the range into a work file that all the runs
/// share and gives the file its final name once the runs' ranges cover it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PieceEntry {
    /// The file, as a [`Frame::File`] would carry it; `file.size` is the whole file's.
    pub file: FileEntry,
    /// Where the range starts.
    pub offset: u64,
    /// The range's length: more than 0, and `offset + len <= file.size`.
    pub len: u64,
}

/// A named pipe, socket or device node of the manifest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpecialEntry {
    /// Relative path, '/'-separated; see [`crate::path`].
    pub path: Bytes,
    /// What it is.
    pub kind: SpecialKind,
    /// For a device, its device number (`st_rdev`); 0 otherwise.
    pub rdev: u64,
    /// Mode and mtime.
    pub meta: Meta,
}

/// The kind of a [`SpecialEntry`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SpecialKind {
    /// A named pipe (FIFO).
    Fifo,
    /// A Unix domain socket's name (the receiver makes the name, not a listening socket).
    Socket,
    /// A character device.
    CharDevice,
    /// A block device.
    BlockDevice,
}

impl SpecialKind {
    /// Its byte on the wire.
    pub fn to_u8(self) -> u8 {
        match self {
            SpecialKind::Fifo => 1,
            SpecialKind::Socket => 2,
            SpecialKind::CharDevice => 3,
            SpecialKind::BlockDevice => 4,
        }
    }

    /// The kind a wire byte names, if any.
    pub fn from_u8(b: u8) -> Option<SpecialKind> {
        Some(match b {
            1 => SpecialKind::Fifo,
            2 => SpecialKind::Socket,
            3 => SpecialKind::CharDevice,
            4 => SpecialKind::BlockDevice,
            _ => return None,
        })
    }

    /// True for the device kinds ([`flags::DEVICES`]); false for pipes and sockets
    /// ([`flags::SPECIALS`]).
    pub fn is_device(self) -> bool {
        matches!(self, SpecialKind::CharDevice | SpecialKind::BlockDevice)
    }
}

/// A symbolic link of the manifest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SymlinkEntry {
    /// Relative path, '/'-separated; see [`crate::path`].
    pub path: Bytes,
    /// The link's target, as stored in the link (never followed by the receiver).
    pub target: Bytes,
    /// The link's own times, when they travel: with `-p`, from protocol version 2 on (encoded
    /// after the target only when present).
    pub times: Option<LinkTimes>,
}

/// A symbolic link's own modification and access times.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct LinkTimes {
    /// Modification time, seconds since the Unix epoch.
    pub mtime: i64,
    /// Nanoseconds within `mtime`, below 1e9.
    pub mtime_nsec: u32,
    /// Access time, seconds since the Unix epoch.
    pub atime: i64,
    /// Nanoseconds within `atime`, below 1e9.
    pub atime_nsec: u32,
}

/// A chunk of a file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Data {
    /// The [`FileEntry::id`].
    pub id: u64,
    /// Where the bytes go in the file.
    pub offset: u64,
    /// The bytes.
    pub bytes: Bytes,
}

/// The end of a file, with its checksum.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileEnd {
    /// The [`FileEntry::id`].
    pub id: u64,
    /// The checksum of the file's content: BLAKE3 of the whole file in protocol versions 1
    /// and 2; from version 3, XXH3-128 over its chunks, then 16 zero bytes (docs/protocol.md).
    pub hash: [u8; 32],
}

/// Error codes carried by [`ErrorFrame`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ErrorCode {
    /// Anything else.
    Other,
    /// A path did not exist.
    NotFound,
    /// Permission was denied.
    PermissionDenied,
    /// A local I/O error, such as a full disk.
    Io,
    /// A path from the peer was rejected as unsafe.
    UnsafePath,
    /// A hash or tag did not match.
    Integrity,
    /// The peer broke the protocol.
    Protocol,
    /// The request cannot be served, such as a directory without `-r`.
    Unsupported,
    /// A source file changed or vanished while it was being read, so it was not copied
    /// (rsync's "vanished or changed" case, its exit code 24). Older peers read it as
    /// [`ErrorCode::Other`].
    SourceChanged,
    /// A disk is full (ENOSPC). Older peers read it as [`ErrorCode::Other`].
    NoSpace,
    /// A file system is read-only (EROFS). Older peers read it as [`ErrorCode::Other`].
    ReadOnly,
    /// A disk quota is exhausted (EDQUOT). Older peers read it as [`ErrorCode::Other`].
    Quota,
    /// The mirror's limit ([`flags::MAX_DELETE`]) left extras in place. Older peers read it
    /// as [`ErrorCode::Other`].
    DeleteLimit,
}

impl ErrorCode {
    /// The code's number on the wire.
    pub fn to_u16(self) -> u16 {
        match self {
            ErrorCode::Other => 0,
            ErrorCode::NotFound => 1,
            ErrorCode::PermissionDenied => 2,
            ErrorCode::Io => 3,
            ErrorCode::UnsafePath => 4,
            ErrorCode::Integrity => 5,
            ErrorCode::Protocol => 6,
            ErrorCode::Unsupported => 7,
            ErrorCode::SourceChanged => 8,
            ErrorCode::NoSpace => 9,
            ErrorCode::ReadOnly => 10,
            ErrorCode::Quota => 11,
            ErrorCode::DeleteLimit => 12,
        }
    }

    /// The code for a number from the wire; unknown numbers become [`ErrorCode::Other`].
    pub fn from_u16(n: u16) -> ErrorCode {
        match n {
            1 => ErrorCode::NotFound,
            2 => ErrorCode::PermissionDenied,
            3 => ErrorCode::Io,
            4 => ErrorCode::UnsafePath,
            5 => ErrorCode::Integrity,
            6 => ErrorCode::Protocol,
            7 => ErrorCode::Unsupported,
            8 => ErrorCode::SourceChanged,
            9 => ErrorCode::NoSpace,
            10 => ErrorCode::ReadOnly,
            11 => ErrorCode::Quota,
            12 => ErrorCode::DeleteLimit,
            _ => ErrorCode::Other,
        }
    }
}

/// An error report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ErrorFrame {
    /// What kind of failure.
    pub code: ErrorCode,
    /// True when the session cannot go on.
    pub fatal: bool,
    /// The path concerned, or empty.
    pub path: Bytes,
    /// A human-readable message.
    pub message: String,
}

/// Totals of a session or of one stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Summary {
    /// Regular files.
    pub files: u64,
    /// Directories.
    pub dirs: u64,
    /// Symbolic links.
    pub symlinks: u64,
    /// File content bytes.
    pub bytes: u64,
    /// Entries that failed.
    pub errors: u64,
    /// In the receiver's final report, with mirroring: entries it removed because the sender
    /// does not have them (an optional trailing field, sent only when not zero).
    pub deleted: u64,
}

/// Alias kept short for the `Done` frame's payload.
pub type Done = Summary;

#[cfg(test)]
mod tests {
    use super::*;

    /// The session secret is made of the two randoms: no Debug output, hence no log line at
    /// any `-v` level, shows either of them.
    #[test]
    fn debug_output_hides_the_randoms() {
        let random = [0xa5u8; 32];
        let request = Request {
            direction: Direction::Push,
            paths: vec![Bytes::from_static(b"dst")],
            flags: flags::RECURSIVE,
            streams: 4,
            transport: TransportKind::Tcp,
            cipher: 1,
            compression: 0,
            client_random: random,
            tcp_ports: (0, 0),
            filters: Vec::new(),
            link_dest: None,
            max_delete: None,
        };
        let accept = Accept {
            streams: 4,
            rendezvous: Rendezvous::Tcp(4000),
            server_random: random,
        };
        for text in [
            format!("{request:?}"),
            format!("{:?}", Frame::Request(request.clone())),
            format!("{accept:?}"),
            format!("{:?}", Frame::Accept(accept.clone())),
        ] {
            assert!(!text.contains("165"), "{text}");
            assert!(!text.to_ascii_lowercase().contains("a5"), "{text}");
            assert!(text.contains("_random: .."), "{text}");
        }
        assert!(format!("{request:?}").contains("\"dst\""));
    }
}
