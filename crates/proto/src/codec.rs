//! Encoding frames to bytes and decoding them back, incrementally.

use bytes::{Buf, BufMut, Bytes, BytesMut};

use crate::frame::*;
use crate::{HARD_MAX_FRAME, HEADER_LEN, MAX_PATH, MAX_TEXT};

/// Why bytes from the peer are not a valid frame. Any of these means the peer is broken or
/// hostile: the stream cannot be trusted past this point.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DecodeError {
    /// The frame's kind byte is not one this version knows.
    #[error("unknown frame kind 0x{0:02x}")]
    UnknownKind(u8),
    /// The frame announces a payload larger than the negotiated cap.
    #[error("frame of {len} bytes exceeds the {max}-byte limit")]
    TooLarge {
        /// The announced payload length.
        len: u32,
        /// The cap in force.
        max: u32,
    },
    /// A field inside the payload ran past the payload's end.
    #[error("{0} frame is truncated")]
    Truncated(&'static str),
    /// The payload has bytes left over after its last field.
    #[error("{0} frame has trailing bytes")]
    Trailing(&'static str),
    /// A field's value is out of range.
    #[error("{frame} frame: {what}")]
    Invalid {
        /// The frame's name.
        frame: &'static str,
        /// What was wrong.
        what: &'static str,
    },
}

/// Appends `frame`, header and payload, to `dst`.
pub fn encode(frame: &Frame, dst: &mut BytesMut) {
    let start = dst.len();
    dst.put_u8(frame.kind());
    dst.put_u32(0); // patched below
    match frame {
        Frame::Hello(h) => {
            dst.put_slice(&crate::MAGIC);
            dst.put_u16(h.version);
            dst.put_u16(h.min_version);
            dst.put_u32(h.cpu_features);
            put_bytes(dst, &h.ciphers);
            put_bytes(dst, &h.compression);
            dst.put_u32(h.max_frame);
            put_bytes(dst, h.software.as_bytes());
        }
        Frame::Request(r) => {
            dst.put_u8(match r.direction {
                Direction::Push => 0,
                Direction::Pull => 1,
            });
            dst.put_u32(r.flags);
            dst.put_u16(r.streams);
            dst.put_u8(match r.transport {
                TransportKind::Inline => 0,
                TransportKind::Unix => 1,
                TransportKind::Tcp => 2,
                TransportKind::Caller => 3,
            });
            dst.put_u8(r.cipher);
            dst.put_u8(r.compression);
            dst.put_slice(&r.client_random);
            dst.put_u16(r.tcp_ports.0);
            dst.put_u16(r.tcp_ports.1);
            dst.put_u32(r.paths.len() as u32);
            for p in &r.paths {
                put_bytes(dst, p);
            }
            if r.flags & crate::flags::FILTERS != 0 {
                dst.put_u32(r.filters.len() as u32);
                for f in &r.filters {
                    put_bytes(dst, f);
                }
            }
            if r.flags & crate::flags::LINK_DEST != 0 {
                put_bytes(dst, r.link_dest.as_deref().unwrap_or_default());
            }
            if r.flags & crate::flags::MAX_DELETE != 0 {
                dst.put_u64(r.max_delete.unwrap_or_default());
            }
        }
        Frame::Accept(a) => {
            dst.put_u16(a.streams);
            match &a.rendezvous {
                Rendezvous::None => dst.put_u8(0),
                Rendezvous::Unix(path) => {
                    dst.put_u8(1);
                    put_bytes(dst, path);
                }
                Rendezvous::Tcp(port) => {
                    dst.put_u8(2);
                    dst.put_u16(*port);
                }
                Rendezvous::Caller => dst.put_u8(3),
            }
            dst.put_slice(&a.server_random);
        }
        Frame::Challenge(c) => dst.put_slice(&c.nonce),
        Frame::Join(j) => {
            dst.put_u16(j.index);
            dst.put_slice(&j.proof);
        }
        Frame::Dir(d) => {
            put_bytes(dst, &d.path);
            put_meta(dst, &d.meta);
        }
        Frame::File(f) => {
            dst.put_u64(f.id);
            put_bytes(dst, &f.path);
            dst.put_u64(f.size);
            put_meta(dst, &f.meta);
        }
        Frame::Piece(p) => {
            dst.put_u64(p.offset);
            dst.put_u64(p.len);
            dst.put_u64(p.file.id);
            put_bytes(dst, &p.file.path);
            dst.put_u64(p.file.size);
            put_meta(dst, &p.file.meta);
        }
        Frame::Symlink(s) => {
            put_bytes(dst, &s.path);
            put_bytes(dst, &s.target);
            if let Some(t) = &s.times {
                dst.put_i64(t.mtime);
                dst.put_u32(t.mtime_nsec);
                dst.put_i64(t.atime);
                dst.put_u32(t.atime_nsec);
            }
        }
        Frame::Special(e) => {
            put_bytes(dst, &e.path);
            dst.put_u8(e.kind.to_u8());
            dst.put_u64(e.rdev);
            put_meta(dst, &e.meta);
        }
        Frame::Data(d) => {
            dst.put_u64(d.id);
            dst.put_u64(d.offset);
            dst.put_slice(&d.bytes);
        }
        Frame::FileEnd(e) => {
            dst.put_u64(e.id);
            dst.put_slice(&e.hash);
        }
        Frame::Totals(t) => {
            dst.put_u64(t.files);
            dst.put_u64(t.bytes);
        }
        Frame::Probe(p) => {
            dst.put_u64(p.id);
            put_bytes(dst, &p.path);
            dst.put_u64(p.size);
            dst.put_i64(p.mtime);
            dst.put_u32(p.mtime_nsec);
            if let Some(mode) = p.mode {
                dst.put_u32(mode);
            }
        }
        Frame::Answer(a) => {
            dst.put_u64(a.id);
            dst.put_u8(a.send as u8);
            if let Some(h) = a.hash {
                dst.put_u128(h);
            }
        }
        Frame::HardLink(h) => {
            put_bytes(dst, &h.path);
            put_bytes(dst, &h.target);
        }
        Frame::Partial(p) => {
            dst.put_u64(p.id);
            dst.put_u64(p.block);
            dst.put_u32(p.hashes.len() as u32);
            for h in &p.hashes {
                dst.put_u128(*h);
            }
        }
        Frame::Attrs(a) => {
            put_bytes(dst, &a.path);
            dst.put_u32(a.uid);
            dst.put_u32(a.gid);
            put_bytes(dst, &a.user);
            put_bytes(dst, &a.group);
            dst.put_u32(a.xattrs.len() as u32);
            for (name, value) in &a.xattrs {
                put_bytes(dst, name);
                put_bytes(dst, value);
            }
        }
        Frame::Deleted(d) => {
            put_bytes(dst, &d.path);
            dst.put_u64(d.entries);
        }
        Frame::Busy => {}
        Frame::Keep(k) => {
            dst.put_u64(k.id);
            dst.put_u64(k.offset);
            dst.put_u64(k.len);
        }
        Frame::Hole(h) => {
            dst.put_u64(h.id);
            dst.put_u64(h.offset);
            dst.put_u64(h.len);
        }
        Frame::Unentered(u) => put_bytes(dst, &u.path),
        Frame::Error(e) => {
            dst.put_u16(e.code.to_u16());
            dst.put_u8(e.fatal as u8);
            put_bytes(dst, &e.path);
            put_bytes(dst, truncate_text(&e.message).as_bytes());
        }
        Frame::Done(s) => {
            dst.put_u64(s.files);
            dst.put_u64(s.dirs);
            dst.put_u64(s.symlinks);
            dst.put_u64(s.bytes);
            dst.put_u64(s.errors);
            // Only a peer that asked for mirroring (version 4) ever gets it.
            if s.deleted != 0 {
                dst.put_u64(s.deleted);
            }
        }
    }
    let len = (dst.len() - start - HEADER_LEN) as u32;
    dst[start + 1..start + HEADER_LEN].copy_from_slice(&len.to_be_bytes());
}

/// Appends the header of a [`Data`] frame carrying `len` bytes, without the bytes themselves.
///
/// Write the returned header and then the `len` bytes to send a `Data` frame without copying
/// its payload into the header buffer.
pub fn encode_data_header(id: u64, offset: u64, len: usize, dst: &mut BytesMut) {
    dst.put_u8(kind::DATA);
    dst.put_u32((16 + len) as u32);
    dst.put_u64(id);
    dst.put_u64(offset);
}

/// Takes frames out of a byte buffer as they become complete.
///
/// It never allocates more than the frame cap for a frame, whatever the peer announces.
#[derive(Debug, Clone)]
pub struct Decoder {
    max_frame: u32,
}

impl Decoder {
    /// A decoder that accepts payloads up to `max_frame` bytes (capped at
    /// [`HARD_MAX_FRAME`]).
    pub fn new(max_frame: u32) -> Decoder {
        Decoder {
            max_frame: max_frame.min(HARD_MAX_FRAME),
        }
    }

    /// The cap in force.
    pub fn max_frame(&self) -> u32 {
        self.max_frame
    }

    /// Changes the cap, for instance once the handshake has agreed on one.
    pub fn set_max_frame(&mut self, max_frame: u32) {
        self.max_frame = max_frame.min(HARD_MAX_FRAME);
    }

    /// Decodes one frame from the front of `src`.
    ///
    /// Returns `Ok(None)` when `src` does not yet hold a whole frame (it may reserve room for
    /// the rest, never more than the cap), and consumes the frame's bytes when it returns one.
    pub fn decode(&mut self, src: &mut BytesMut) -> Result<Option<Frame>, DecodeError> {
        if src.len() < HEADER_LEN {
            return Ok(None);
        }
        let kind = src[0];
        let len = u32::from_be_bytes([src[1], src[2], src[3], src[4]]);
        if !known_kind(kind) {
            return Err(DecodeError::UnknownKind(kind));
        }
        if len > self.max_frame {
            return Err(DecodeError::TooLarge {
                len,
                max: self.max_frame,
            });
        }
        let total = HEADER_LEN + len as usize;
        if src.len() < total {
            src.reserve(total - src.len());
            return Ok(None);
        }
        let mut frame = src.split_to(total);
        frame.advance(HEADER_LEN);
        decode_payload(kind, frame.freeze()).map(Some)
    }

    /// Completes a [`Data`] frame whose file bytes arrived in a buffer of their own, without
    /// copying them: when `src` holds exactly a `Data` frame's header, id and offset, the
    /// frame's length is within the cap, and `payload` is exactly the rest of the frame,
    /// empties `src` and returns the frame with `payload` as its bytes.
    ///
    /// Otherwise returns `None` and changes nothing: append `payload` to `src` and
    /// [`decode`](Decoder::decode) as usual (which reports whatever is wrong).
    ///
    /// ```
    /// use bytes::{Bytes, BytesMut};
    /// use fastcp_proto::{Data, Decoder, Frame, encode_data_header};
    ///
    /// let payload = Bytes::from(vec![7u8; 1000]);
    /// let mut src = BytesMut::new();
    /// encode_data_header(3, 4096, payload.len(), &mut src);
    /// let frame = Decoder::new(1 << 20).decode_split_data(&mut src, &payload);
    /// assert_eq!(frame, Some(Frame::Data(Data { id: 3, offset: 4096, bytes: payload })));
    /// assert!(src.is_empty());
    /// ```
    pub fn decode_split_data(&self, src: &mut BytesMut, payload: &Bytes) -> Option<Frame> {
        const FIELDS: usize = 16;
        if src.len() != HEADER_LEN + FIELDS || src[0] != kind::DATA {
            return None;
        }
        let len = u32::from_be_bytes([src[1], src[2], src[3], src[4]]);
        if len > self.max_frame || len as usize != FIELDS + payload.len() {
            return None;
        }
        let mut r = Reader {
            buf: Bytes::copy_from_slice(&src[HEADER_LEN..]),
            frame: "Data",
        };
        let frame = data_frame(r.u64().ok()?, r.u64().ok()?, payload.clone())?;
        src.clear();
        Some(frame)
    }
}

fn known_kind(k: u8) -> bool {
    matches!(
        k,
        kind::HELLO
            | kind::REQUEST
            | kind::ACCEPT
            | kind::CHALLENGE
            | kind::JOIN
            | kind::DIR
            | kind::FILE
            | kind::PIECE
            | kind::SYMLINK
            | kind::DATA
            | kind::FILE_END
            | kind::TOTALS
            | kind::PROBE
            | kind::HARD_LINK
            | kind::KEEP
            | kind::HOLE
            | kind::UNENTERED
            | kind::ATTRS
            | kind::SPECIAL
            | kind::PARTIAL
            | kind::DELETED
            | kind::BUSY
            | kind::ANSWER
            | kind::ERROR
            | kind::DONE
    )
}

fn decode_payload(k: u8, payload: Bytes) -> Result<Frame, DecodeError> {
    let mut r = Reader {
        buf: payload,
        frame: "",
    };
    let frame = match k {
        kind::HELLO => {
            r.frame = "Hello";
            if r.array()? != crate::MAGIC {
                return Err(r.invalid("bad magic"));
            }
            Frame::Hello(Hello {
                version: r.u16()?,
                min_version: r.u16()?,
                cpu_features: r.u32()?,
                ciphers: r.bytes(64)?.to_vec(),
                compression: r.bytes(64)?.to_vec(),
                max_frame: r.u32()?,
                software: r.text()?,
            })
        }
        kind::REQUEST => {
            r.frame = "Request";
            let direction = match r.u8()? {
                0 => Direction::Push,
                1 => Direction::Pull,
                _ => return Err(r.invalid("unknown direction")),
            };
            let flags = r.u32()?;
            let streams = r.u16()?;
            let transport = match r.u8()? {
                0 => TransportKind::Inline,
                1 => TransportKind::Unix,
                2 => TransportKind::Tcp,
                3 => TransportKind::Caller,
                _ => return Err(r.invalid("unknown transport")),
            };
            let cipher = r.u8()?;
            let compression = r.u8()?;
            let client_random = r.array()?;
            let tcp_ports = (r.u16()?, r.u16()?);
            let count = r.u32()?;
            let mut paths = Vec::new();
            for _ in 0..count {
                // Each path costs at least its 4-byte length, so the frame cap bounds this loop.
                paths.push(r.bytes(MAX_PATH)?);
            }
            let mut filters = Vec::new();
            if flags & crate::flags::FILTERS != 0 {
                for _ in 0..r.u32()? {
                    filters.push(r.bytes(MAX_PATH)?);
                }
            }
            let link_dest = match flags & crate::flags::LINK_DEST {
                0 => None,
                _ => Some(r.bytes(MAX_PATH)?),
            };
            let max_delete = match flags & crate::flags::MAX_DELETE {
                0 => None,
                _ => Some(r.u64()?),
            };
            Frame::Request(Request {
                direction,
                paths,
                flags,
                streams,
                transport,
                cipher,
                compression,
                client_random,
                tcp_ports,
                filters,
                link_dest,
                max_delete,
            })
        }
        kind::ACCEPT => {
            r.frame = "Accept";
            let streams = r.u16()?;
            let rendezvous = match r.u8()? {
                0 => Rendezvous::None,
                1 => Rendezvous::Unix(r.bytes(MAX_PATH)?),
                2 => Rendezvous::Tcp(r.u16()?),
                3 => Rendezvous::Caller,
                _ => return Err(r.invalid("unknown rendezvous")),
            };
            Frame::Accept(Accept {
                streams,
                rendezvous,
                server_random: r.array()?,
            })
        }
        kind::CHALLENGE => {
            r.frame = "Challenge";
            Frame::Challenge(Challenge { nonce: r.array()? })
        }
        kind::JOIN => {
            r.frame = "Join";
            Frame::Join(Join {
                index: r.u16()?,
                proof: r.array()?,
            })
        }
        kind::DIR => {
            r.frame = "Dir";
            Frame::Dir(DirEntry {
                path: r.bytes(MAX_PATH)?,
                meta: r.meta()?,
            })
        }
        kind::FILE => {
            r.frame = "File";
            Frame::File(FileEntry {
                id: r.u64()?,
                path: r.bytes(MAX_PATH)?,
                size: r.u64()?,
                meta: r.meta()?,
            })
        }
        kind::PIECE => {
            r.frame = "Piece";
            let (offset, len) = (r.u64()?, r.u64()?);
            let file = FileEntry {
                id: r.u64()?,
                path: r.bytes(MAX_PATH)?,
                size: r.u64()?,
                meta: r.meta()?,
            };
            if len == 0 || offset.checked_add(len).is_none_or(|end| end > file.size) {
                return Err(r.invalid("the range is empty or runs past the file's end"));
            }
            Frame::Piece(PieceEntry { file, offset, len })
        }
        kind::SYMLINK => {
            r.frame = "Symlink";
            let path = r.bytes(MAX_PATH)?;
            let target = r.bytes(MAX_PATH)?;
            let times = if r.buf.has_remaining() {
                let (mtime, mtime_nsec) = r.time()?;
                let (atime, atime_nsec) = r.time()?;
                Some(LinkTimes {
                    mtime,
                    mtime_nsec,
                    atime,
                    atime_nsec,
                })
            } else {
                None
            };
            Frame::Symlink(SymlinkEntry {
                path,
                target,
                times,
            })
        }
        kind::SPECIAL => {
            r.frame = "Special";
            let path = r.bytes(MAX_PATH)?;
            let kind = SpecialKind::from_u8(r.u8()?).ok_or_else(|| r.invalid("unknown kind"))?;
            Frame::Special(SpecialEntry {
                path,
                kind,
                rdev: r.u64()?,
                meta: r.meta()?,
            })
        }
        kind::DATA => {
            r.frame = "Data";
            let id = r.u64()?;
            let offset = r.u64()?;
            let bytes = r.buf.split_off(0);
            data_frame(id, offset, bytes).ok_or_else(|| r.invalid("offset overflows"))?
        }
        kind::FILE_END => {
            r.frame = "FileEnd";
            Frame::FileEnd(FileEnd {
                id: r.u64()?,
                hash: r.array()?,
            })
        }
        kind::ERROR => {
            r.frame = "Error";
            Frame::Error(ErrorFrame {
                code: ErrorCode::from_u16(r.u16()?),
                fatal: match r.u8()? {
                    0 => false,
                    1 => true,
                    _ => return Err(r.invalid("fatal flag is not 0 or 1")),
                },
                path: r.bytes(MAX_PATH)?,
                message: r.text()?,
            })
        }
        kind::TOTALS => {
            r.frame = "Totals";
            Frame::Totals(Totals {
                files: r.u64()?,
                bytes: r.u64()?,
            })
        }
        kind::PROBE => {
            r.frame = "Probe";
            let id = r.u64()?;
            let path = r.bytes(MAX_PATH)?;
            let size = r.u64()?;
            let (mtime, mtime_nsec) = r.time()?;
            let mode = if r.buf.has_remaining() {
                Some(r.u32()? & 0o7777)
            } else {
                None
            };
            Frame::Probe(Probe {
                id,
                path,
                size,
                mtime,
                mtime_nsec,
                mode,
            })
        }
        kind::HARD_LINK => {
            r.frame = "HardLink";
            Frame::HardLink(HardLink {
                path: r.bytes(MAX_PATH)?,
                target: r.bytes(MAX_PATH)?,
            })
        }
        kind::PARTIAL => {
            r.frame = "Partial";
            let id = r.u64()?;
            let block = r.u64()?;
            if block == 0 {
                return Err(r.invalid("block size is zero"));
            }
            let n = r.u32()? as usize;
            if n > MAX_PARTIAL_HASHES {
                return Err(r.invalid("more block hashes than allowed"));
            }
            r.need(n * 16)?;
            let hashes = (0..n).map(|_| r.buf.get_u128()).collect();
            Frame::Partial(Partial { id, block, hashes })
        }
        kind::ATTRS => {
            r.frame = "Attrs";
            let path = r.bytes(MAX_PATH)?;
            let uid = r.u32()?;
            let gid = r.u32()?;
            let user = r.bytes(MAX_ID_NAME)?;
            let group = r.bytes(MAX_ID_NAME)?;
            let n = r.u32()? as usize;
            if n > MAX_XATTRS {
                return Err(r.invalid("more extended attributes than allowed"));
            }
            let mut xattrs = Vec::with_capacity(n.min(64));
            for _ in 0..n {
                let name = r.bytes(MAX_XATTR_NAME)?;
                if name.is_empty() || name.contains(&0) {
                    return Err(r.invalid("extended attribute name is empty or holds a NUL"));
                }
                xattrs.push((name, r.bytes(MAX_XATTR_VALUE)?));
            }
            Frame::Attrs(Attrs {
                path,
                uid,
                gid,
                user,
                group,
                xattrs,
            })
        }
        kind::DELETED => {
            r.frame = "Deleted";
            Frame::Deleted(Deleted {
                path: r.bytes(MAX_PATH)?,
                entries: r.u64()?,
            })
        }
        kind::BUSY => {
            r.frame = "Busy";
            Frame::Busy
        }
        kind::KEEP => {
            r.frame = "Keep";
            Frame::Keep(Keep {
                id: r.u64()?,
                offset: r.u64()?,
                len: r.u64()?,
            })
        }
        kind::HOLE => {
            r.frame = "Hole";
            let h = Hole {
                id: r.u64()?,
                offset: r.u64()?,
                len: r.u64()?,
            };
            if h.len == 0 {
                return Err(r.invalid("an empty hole"));
            }
            Frame::Hole(h)
        }
        kind::UNENTERED => {
            r.frame = "Unentered";
            Frame::Unentered(Unentered {
                path: r.bytes(MAX_PATH)?,
            })
        }
        kind::ANSWER => {
            r.frame = "Answer";
            let id = r.u64()?;
            let send = match r.u8()? {
                0 => false,
                1 => true,
                _ => return Err(r.invalid("send flag is not 0 or 1")),
            };
            let hash = if r.buf.has_remaining() {
                Some(u128::from_be_bytes(r.array()?))
            } else {
                None
            };
            Frame::Answer(Answer { id, send, hash })
        }
        kind::DONE => {
            r.frame = "Done";
            Frame::Done(Summary {
                files: r.u64()?,
                dirs: r.u64()?,
                symlinks: r.u64()?,
                bytes: r.u64()?,
                errors: r.u64()?,
                deleted: if r.buf.has_remaining() { r.u64()? } else { 0 },
            })
        }
        other => return Err(DecodeError::UnknownKind(other)),
    };
    if r.buf.has_remaining() {
        return Err(DecodeError::Trailing(r.frame));
    }
    Ok(frame)
}

/// A `Data` frame, unless its last byte's offset overflows a u64.
fn data_frame(id: u64, offset: u64, bytes: Bytes) -> Option<Frame> {
    offset.checked_add(bytes.len() as u64)?;
    Some(Frame::Data(Data { id, offset, bytes }))
}

fn put_bytes(dst: &mut BytesMut, b: &[u8]) {
    dst.put_u32(b.len() as u32);
    dst.put_slice(b);
}

fn put_meta(dst: &mut BytesMut, m: &Meta) {
    dst.put_u32(m.mode);
    dst.put_i64(m.mtime);
    dst.put_u32(m.mtime_nsec);
    if let Some((sec, nsec)) = m.atime {
        dst.put_i64(sec);
        dst.put_u32(nsec);
    }
}

fn truncate_text(s: &str) -> &str {
    if s.len() <= MAX_TEXT {
        return s;
    }
    let mut end = MAX_TEXT;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// Checked reads from one frame's payload.
struct Reader {
    buf: Bytes,
    frame: &'static str,
}

impl Reader {
    fn need(&self, n: usize) -> Result<(), DecodeError> {
        if self.buf.remaining() < n {
            Err(DecodeError::Truncated(self.frame))
        } else {
            Ok(())
        }
    }

    fn invalid(&self, what: &'static str) -> DecodeError {
        DecodeError::Invalid {
            frame: self.frame,
            what,
        }
    }

    fn u8(&mut self) -> Result<u8, DecodeError> {
        self.need(1)?;
        Ok(self.buf.get_u8())
    }

    fn u16(&mut self) -> Result<u16, DecodeError> {
        self.need(2)?;
        Ok(self.buf.get_u16())
    }

    fn u32(&mut self) -> Result<u32, DecodeError> {
        self.need(4)?;
        Ok(self.buf.get_u32())
    }

    fn u64(&mut self) -> Result<u64, DecodeError> {
        self.need(8)?;
        Ok(self.buf.get_u64())
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], DecodeError> {
        self.need(N)?;
        let mut out = [0u8; N];
        self.buf.copy_to_slice(&mut out);
        Ok(out)
    }

    /// A length-prefixed byte string of at most `cap` bytes, checked before any copy.
    fn bytes(&mut self, cap: usize) -> Result<Bytes, DecodeError> {
        let len = self.u32()? as usize;
        if len > cap {
            return Err(self.invalid("field longer than its cap"));
        }
        self.need(len)?;
        Ok(self.buf.split_to(len))
    }

    fn text(&mut self) -> Result<String, DecodeError> {
        let b = self.bytes(MAX_TEXT)?;
        Ok(String::from_utf8_lossy(&b).into_owned())
    }

    /// Mode and mtime, then the access time if the payload goes on (it is the last field).
    fn meta(&mut self) -> Result<Meta, DecodeError> {
        let mode = self.u32()?;
        let (mtime, mtime_nsec) = self.time()?;
        let atime = if self.buf.has_remaining() {
            Some(self.time()?)
        } else {
            None
        };
        Ok(Meta {
            mode: mode & 0o7777,
            mtime,
            mtime_nsec,
            atime,
        })
    }

    /// Seconds (i64) and nanoseconds (u32, below 1e9).
    fn time(&mut self) -> Result<(i64, u32), DecodeError> {
        let sec = self.u64()? as i64;
        let nsec = self.u32()?;
        if nsec >= 1_000_000_000 {
            return Err(self.invalid("nanoseconds out of range"));
        }
        Ok((sec, nsec))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn roundtrip(frame: Frame) {
        let mut buf = BytesMut::new();
        encode(&frame, &mut buf);
        let encoded = buf.clone();
        let mut dec = Decoder::new(crate::DEFAULT_MAX_FRAME);
        // Feed it one byte at a time: every prefix must ask for more, never fail.
        let mut partial = BytesMut::new();
        for (i, b) in encoded.iter().enumerate() {
            partial.put_u8(*b);
            let got = dec.decode(&mut partial).unwrap();
            if i + 1 < encoded.len() {
                assert!(got.is_none(), "{} decoded early at byte {i}", frame.name());
            } else {
                assert_eq!(got.as_ref(), Some(&frame));
                assert!(partial.is_empty());
            }
        }
    }

    fn meta() -> Meta {
        Meta {
            mode: 0o644,
            mtime: -12345,
            mtime_nsec: 999_999_999,
            atime: None,
        }
    }

    #[test]
    fn hello_roundtrip() {
        roundtrip(Frame::Hello(Hello {
            version: 1,
            min_version: 1,
            cpu_features: 0b10_1011,
            ciphers: vec![1, 3, 2],
            compression: vec![0, 1],
            max_frame: 4 << 20,
            software: "fastcp 0.1.0".into(),
        }));
    }

    #[test]
    fn request_roundtrip() {
        for (direction, transport) in [
            (Direction::Push, TransportKind::Inline),
            (Direction::Pull, TransportKind::Unix),
            (Direction::Pull, TransportKind::Tcp),
            (Direction::Push, TransportKind::Caller),
        ] {
            roundtrip(Frame::Request(Request {
                direction,
                paths: vec![
                    Bytes::from_static(b"a/b"),
                    Bytes::from_static(b"\xff odd\nname"),
                ],
                flags: flags::RECURSIVE | flags::PRESERVE,
                streams: 4,
                transport,
                cipher: 1,
                compression: 0,
                client_random: [9; 32],
                tcp_ports: (40000, 40100),
                filters: vec![],
                link_dest: None,
                max_delete: None,
            }));
        }
        roundtrip(Frame::Request(Request {
            direction: Direction::Pull,
            paths: vec![Bytes::from_static(b"src")],
            flags: flags::RECURSIVE | flags::FILTERS,
            streams: 1,
            transport: TransportKind::Inline,
            cipher: 0,
            compression: 0,
            client_random: [1; 32],
            tcp_ports: (0, 0),
            filters: vec![
                Bytes::from_static(b"+ keep.o"),
                Bytes::from_static(b"- *.o"),
            ],
            link_dest: None,
            max_delete: None,
        }));
        roundtrip(Frame::Request(Request {
            direction: Direction::Push,
            paths: vec![Bytes::from_static(b"/backups/2026-11-28")],
            flags: flags::RECURSIVE
                | flags::SKIP_UNCHANGED
                | flags::FILTERS
                | flags::LINK_DEST
                | flags::DELETE
                | flags::MAX_DELETE,
            streams: 2,
            transport: TransportKind::Tcp,
            cipher: 1,
            compression: 0,
            client_random: [2; 32],
            tcp_ports: (0, 0),
            filters: vec![Bytes::from_static(b"- *.o")],
            link_dest: Some(Bytes::from_static(b"../2026-11-27")),
            max_delete: Some(1_000),
        }));
    }

    #[test]
    fn accept_roundtrip() {
        for rendezvous in [
            Rendezvous::None,
            Rendezvous::Unix(Bytes::from_static(b"/tmp/fastcp-x/sock")),
            Rendezvous::Tcp(40123),
            Rendezvous::Caller,
        ] {
            roundtrip(Frame::Accept(Accept {
                streams: 8,
                rendezvous,
                server_random: [7; 32],
            }));
        }
    }

    #[test]
    fn challenge_and_join_roundtrip() {
        roundtrip(Frame::Challenge(Challenge { nonce: [3; 32] }));
        roundtrip(Frame::Join(Join {
            index: 3,
            proof: [4; 32],
        }));
    }

    #[test]
    fn entry_roundtrips() {
        // Version 1 entries (no access time, no link times) and version 2 ones.
        let with_atime = Meta {
            atime: Some((1_700_000_000, 5)),
            ..meta()
        };
        for meta in [meta(), with_atime] {
            roundtrip(Frame::Dir(DirEntry {
                path: Bytes::from_static(b"src/empty dir"),
                meta,
            }));
            roundtrip(Frame::File(FileEntry {
                id: u64::MAX,
                path: Bytes::from_static("dir/ünïcode -leading".as_bytes()),
                size: 5 << 30,
                meta,
            }));
            roundtrip(Frame::Piece(PieceEntry {
                file: FileEntry {
                    id: 9,
                    path: Bytes::from_static(b"big/file"),
                    size: 5 << 30,
                    meta,
                },
                offset: 4 << 30,
                len: 1 << 30,
            }));
        }
        for times in [
            None,
            Some(LinkTimes {
                mtime: -1,
                mtime_nsec: 999_999_999,
                atime: i64::MAX,
                atime_nsec: 0,
            }),
        ] {
            roundtrip(Frame::Symlink(SymlinkEntry {
                path: Bytes::from_static(b"link"),
                target: Bytes::from_static(b"../../dangling"),
                times,
            }));
        }
    }

    #[test]
    fn optional_times_are_all_or_nothing() {
        // A version 1 entry is the version 2 one without its trailing times: a half-present
        // trailer, or nanoseconds out of range, is refused.
        let mut buf = BytesMut::new();
        encode(
            &Frame::Dir(DirEntry {
                path: Bytes::from_static(b"d"),
                meta: Meta {
                    atime: Some((7, 1_000_000_000)),
                    ..meta()
                },
            }),
            &mut buf,
        );
        assert!(Decoder::new(1024).decode(&mut buf.clone()).is_err());
        let mut short = buf.clone();
        short.truncate(short.len() - 4);
        let len = (short.len() - HEADER_LEN) as u32;
        short[1..HEADER_LEN].copy_from_slice(&len.to_be_bytes());
        assert!(Decoder::new(1024).decode(&mut short).is_err());
    }

    #[test]
    fn data_roundtrip_and_header() {
        let data = Data {
            id: 42,
            offset: 1 << 33,
            bytes: Bytes::from(vec![0x5a; 70_000]),
        };
        roundtrip(Frame::Data(data.clone()));
        roundtrip(Frame::Data(Data {
            bytes: Bytes::new(),
            ..data.clone()
        }));
        // The header-only encoder plus the payload is the same frame as the full encoder.
        let mut full = BytesMut::new();
        encode(&Frame::Data(data.clone()), &mut full);
        let mut split = BytesMut::new();
        encode_data_header(data.id, data.offset, data.bytes.len(), &mut split);
        split.extend_from_slice(&data.bytes);
        assert_eq!(full, split);
    }

    #[test]
    fn probe_and_answer_roundtrip() {
        for mode in [None, Some(0o640)] {
            roundtrip(Frame::Probe(Probe {
                id: 9,
                path: Bytes::from_static(b"dir/file"),
                size: 1 << 40,
                mtime: -3,
                mtime_nsec: 999_999_999,
                mode,
            }));
        }
        roundtrip(Frame::Answer(Answer {
            id: 9,
            send: true,
            hash: None,
        }));
        roundtrip(Frame::Answer(Answer {
            id: 11,
            send: false,
            hash: Some(u128::MAX - 7),
        }));
        roundtrip(Frame::HardLink(HardLink {
            path: Bytes::from_static(b"t/b"),
            target: Bytes::from_static(b"t/a"),
        }));
        roundtrip(Frame::Answer(Answer {
            id: 10,
            send: false,
            hash: None,
        }));
        let mut bad = BytesMut::new();
        encode(
            &Frame::Answer(Answer {
                id: 1,
                send: true,
                hash: None,
            }),
            &mut bad,
        );
        let last = bad.len() - 1;
        bad[last] = 2;
        assert!(Decoder::new(1 << 16).decode(&mut bad).is_err());
    }

    /// rsync CVE-2024-12084: a count of block hashes read from the wire is checked against
    /// its cap and the bytes that hold it before anything is allocated for it.
    #[test]
    fn partial_and_keep_roundtrip_and_hostile_counts_fail() {
        roundtrip(Frame::Partial(Partial {
            id: 3,
            block: 4 << 20,
            hashes: vec![1, u128::MAX, 0],
        }));
        roundtrip(Frame::Partial(Partial {
            id: 4,
            block: 1,
            hashes: Vec::new(),
        }));
        roundtrip(Frame::Keep(Keep {
            id: 8,
            offset: 1 << 40,
            len: 4 << 20,
        }));
        roundtrip(Frame::Deleted(Deleted {
            path: Bytes::from_static(b"tree/old dir"),
            entries: 12,
        }));
        roundtrip(Frame::Busy);
        roundtrip(Frame::Unentered(Unentered {
            path: Bytes::from_static(b"tree/mnt"),
        }));
        roundtrip(Frame::Hole(Hole {
            id: 9,
            offset: 3 << 20,
            len: u64::MAX - (3 << 20),
        }));
        // A count above the cap, or one the payload does not hold, is refused before any
        // allocation; so is a zero block size.
        for (block, count, hashes) in [(1u64, 16_385u32, 0usize), (1, 2, 1), (0, 0, 0)] {
            let mut payload = BytesMut::new();
            payload.put_u64(1);
            payload.put_u64(block);
            payload.put_u32(count);
            payload.put_bytes(7, hashes * 16);
            let mut wire = BytesMut::new();
            wire.put_u8(kind::PARTIAL);
            wire.put_u32(payload.len() as u32);
            wire.extend_from_slice(&payload);
            assert!(Decoder::new(1 << 20).decode(&mut wire).is_err());
        }
        // An empty hole is refused.
        let mut wire = BytesMut::new();
        encode(
            &Frame::Hole(Hole {
                id: 1,
                offset: 5,
                len: 0,
            }),
            &mut wire,
        );
        assert!(Decoder::new(1 << 20).decode(&mut wire).is_err());
    }

    #[test]
    fn special_roundtrip_and_unknown_kind_fails() {
        for kind in [
            SpecialKind::Fifo,
            SpecialKind::Socket,
            SpecialKind::CharDevice,
            SpecialKind::BlockDevice,
        ] {
            roundtrip(Frame::Special(SpecialEntry {
                path: Bytes::from_static(b"dev/null"),
                kind,
                rdev: 0x0103,
                meta: meta(),
            }));
        }
        let mut buf = BytesMut::new();
        encode(
            &Frame::Special(SpecialEntry {
                path: Bytes::from_static(b"p"),
                kind: SpecialKind::Fifo,
                rdev: 0,
                meta: meta(),
            }),
            &mut buf,
        );
        // The kind byte follows the path's length and its one byte.
        buf[crate::HEADER_LEN + 4 + 1] = 9;
        assert!(Decoder::new(HARD_MAX_FRAME).decode(&mut buf).is_err());
    }

    #[test]
    fn attrs_roundtrip_and_hostile_fields_fail() {
        let attrs = Attrs {
            path: Bytes::from_static(b"d/f"),
            uid: 1000,
            gid: 100,
            user: Bytes::from_static(b"alice"),
            group: Bytes::from_static(b"users"),
            xattrs: vec![
                (Bytes::from_static(b"user.a"), Bytes::from_static(b"1")),
                (Bytes::from_static(b"user.empty"), Bytes::new()),
            ],
        };
        roundtrip(Frame::Attrs(attrs.clone()));
        roundtrip(Frame::Attrs(Attrs::default()));
        let decode = |a: &Attrs| {
            let mut buf = BytesMut::new();
            encode(&Frame::Attrs(a.clone()), &mut buf);
            Decoder::new(HARD_MAX_FRAME).decode(&mut buf)
        };
        let nul = Attrs {
            xattrs: vec![(Bytes::from_static(b"user.\0x"), Bytes::new())],
            ..attrs.clone()
        };
        assert!(decode(&nul).is_err());
        let long_name = Attrs {
            xattrs: vec![(Bytes::from(vec![b'a'; MAX_XATTR_NAME + 1]), Bytes::new())],
            ..attrs.clone()
        };
        assert!(decode(&long_name).is_err());
        let many = Attrs {
            xattrs: vec![(Bytes::from_static(b"user.a"), Bytes::new()); MAX_XATTRS + 1],
            ..attrs.clone()
        };
        assert!(decode(&many).is_err());
        let long_user = Attrs {
            user: Bytes::from(vec![b'u'; MAX_ID_NAME + 1]),
            ..attrs
        };
        assert!(decode(&long_user).is_err());
    }

    #[test]
    fn file_end_totals_error_done_roundtrip() {
        roundtrip(Frame::FileEnd(FileEnd {
            id: 1,
            hash: [0xee; 32],
        }));
        roundtrip(Frame::Error(ErrorFrame {
            code: ErrorCode::UnsafePath,
            fatal: true,
            path: Bytes::from_static(b"../etc/passwd"),
            message: "path escapes the destination".into(),
        }));
        roundtrip(Frame::Totals(Totals {
            files: 78_579,
            bytes: 1 << 40,
        }));
        roundtrip(Frame::Done(Summary {
            files: 1,
            dirs: 2,
            symlinks: 3,
            bytes: 4,
            errors: 5,
            deleted: 0,
        }));
        roundtrip(Frame::Done(Summary {
            files: 1,
            dirs: 2,
            symlinks: 3,
            bytes: 4,
            errors: 5,
            deleted: 6,
        }));
    }

    #[test]
    fn split_data_matches_the_whole_frame_and_checks_what_the_decoder_checks() {
        let payload = Bytes::from(vec![9u8; 300]);
        let data = Data {
            id: 5,
            offset: 1 << 33,
            bytes: payload.clone(),
        };
        let mut head = BytesMut::new();
        encode_data_header(data.id, data.offset, payload.len(), &mut head);
        let mut dec = Decoder::new(1024);
        let mut src = head.clone();
        assert_eq!(
            dec.decode_split_data(&mut src, &payload),
            Some(Frame::Data(data.clone()))
        );
        assert!(src.is_empty());
        // A payload of another length, a frame above the cap, another kind, or bytes before
        // the header: nothing taken, nothing changed.
        for (mut src, payload, dec) in [
            (head.clone(), payload.slice(1..), Decoder::new(1024)),
            (head.clone(), payload.clone(), Decoder::new(100)),
            (
                {
                    let mut h = head.clone();
                    h[0] = kind::FILE_END;
                    h
                },
                payload.clone(),
                Decoder::new(1024),
            ),
            (
                {
                    let mut h = BytesMut::from(&[0u8][..]);
                    h.extend_from_slice(&head[..head.len() - 1]);
                    h
                },
                payload.clone(),
                Decoder::new(1024),
            ),
        ] {
            let before = src.clone();
            assert_eq!(dec.decode_split_data(&mut src, &payload), None);
            assert_eq!(src, before);
        }
        // An offset whose last byte overflows, which `decode` refuses, is not taken either.
        let mut far = BytesMut::new();
        encode_data_header(5, u64::MAX, payload.len(), &mut far);
        let before = far.clone();
        assert_eq!(dec.decode_split_data(&mut far, &payload), None);
        assert_eq!(far, before);
        far.extend_from_slice(&payload);
        assert!(dec.decode(&mut far).is_err());
    }

    /// rsync CVE-2024-12084/12085: a frame length read from the wire is checked before
    /// anything is buffered for it.
    #[test]
    fn oversized_frame_is_refused_before_buffering() {
        let mut buf = BytesMut::new();
        buf.put_u8(kind::DATA);
        buf.put_u32(u32::MAX);
        let mut dec = Decoder::new(1024);
        assert_eq!(
            dec.decode(&mut buf),
            Err(DecodeError::TooLarge {
                len: u32::MAX,
                max: 1024
            })
        );
        assert!(buf.capacity() < 1024);
    }

    #[test]
    fn unknown_kind_and_trailing_bytes_are_errors() {
        let mut buf = BytesMut::from(&[0x7f, 0, 0, 0, 0][..]);
        assert_eq!(
            Decoder::new(1024).decode(&mut buf),
            Err(DecodeError::UnknownKind(0x7f))
        );
        let mut buf = BytesMut::new();
        encode(&Frame::Challenge(Challenge { nonce: [0; 32] }), &mut buf);
        buf[4] += 1;
        buf.put_u8(0);
        assert_eq!(
            Decoder::new(1024).decode(&mut buf),
            Err(DecodeError::Trailing("Challenge"))
        );
    }

    #[test]
    fn inner_length_past_its_cap_is_refused() {
        let mut buf = BytesMut::new();
        buf.put_u8(kind::SYMLINK);
        buf.put_u32(8);
        buf.put_u32(u32::MAX); // path length, far past MAX_PATH
        buf.put_u32(0);
        assert!(matches!(
            Decoder::new(1024).decode(&mut buf),
            Err(DecodeError::Invalid {
                frame: "Symlink",
                ..
            })
        ));
    }

    #[test]
    fn a_piece_lies_within_its_file() {
        let piece = |offset, len| {
            let mut buf = BytesMut::new();
            encode(
                &Frame::Piece(PieceEntry {
                    file: FileEntry {
                        id: 1,
                        path: Bytes::from_static(b"f"),
                        size: 100,
                        meta: Meta::default(),
                    },
                    offset,
                    len,
                }),
                &mut buf,
            );
            Decoder::new(crate::DEFAULT_MAX_FRAME).decode(&mut buf)
        };
        assert!(piece(90, 10).unwrap().is_some());
        for (offset, len) in [(0, 0), (90, 11), (u64::MAX, 2)] {
            assert!(
                matches!(piece(offset, len), Err(DecodeError::Invalid { .. })),
                "{offset} + {len}"
            );
        }
    }
}
