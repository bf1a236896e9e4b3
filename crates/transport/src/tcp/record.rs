//! The record layer: sealing a byte stream into AEAD records, and opening it again.
//!
//! [`Sealing`] and [`Opening`] are the two halves' state machines. They own their buffers and
//! keys and borrow the underlying stream on each poll, so the same code serves
//! [`SealedStream`](super::SealedStream) (one duplex stream) and the split
//! [`SealedReader`](super::SealedReader) / [`SealedWriter`](super::SealedWriter).

use std::io::{self, IoSlice};
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::{BufMut, BytesMut};
use fastcp_crypto::{Opener, Sealer, TAG_LEN};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};

/// Bytes in a record header.
pub const HEADER_LEN: usize = 4;

/// The most plaintext one record may carry (1 MiB). A reader refuses a record announcing more
/// before reading or allocating anything for it.
pub const MAX_RECORD_LEN: usize = 1 << 20;

/// The plaintext per record a writer uses unless configured otherwise (256 KiB). Chosen by
/// measurement; see BENCHMARKS.md, "TCP transport tuning".
pub const DEFAULT_RECORD_LEN: usize = 256 << 10;

/// Header bit 31: this is the end record; the writer shut its side down cleanly.
const END_FLAG: u32 = 1 << 31;

/// Why a sealed stream failed. Carried inside the [`io::Error`] that reads and writes return
/// (see [`RecordError::from_io`]); its [`RecordError::kind`] is that error's kind.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RecordError {
    /// A record's tag did not verify: altered, replayed, reordered, dropped, or sealed with
    /// another key. None of its bytes were returned.
    #[error("data stream {stream}: authentication failed: the data was altered in transit")]
    Authentication {
        /// The stream's index.
        stream: u16,
    },
    /// The connection ended inside a record.
    #[error(
        "data stream {stream}: the connection ended in the middle of a record: the data was cut short in transit"
    )]
    Truncated {
        /// The stream's index.
        stream: u16,
    },
    /// The connection ended between records without the sealed end record, so the data
    /// may be incomplete.
    #[error(
        "data stream {stream}: the connection closed without a clean end: the data may be incomplete"
    )]
    Unterminated {
        /// The stream's index.
        stream: u16,
    },
    /// A record header announced more than [`MAX_RECORD_LEN`] bytes.
    #[error(
        "data stream {stream}: the peer announced a record of {len} bytes, above the limit of {max}"
    )]
    TooLong {
        /// The stream's index.
        stream: u16,
        /// The announced length (with any unknown header bits).
        len: u32,
        /// The limit.
        max: usize,
    },
    /// An authenticated end record carried data, which no fastcp writer does.
    #[error("data stream {stream}: the end record carries {len} bytes of data")]
    BadEnd {
        /// The stream's index.
        stream: u16,
        /// Bytes it carried.
        len: usize,
    },
    /// Sealing failed (the stream reached its record limit, for example).
    #[error("data stream {stream}: {message}")]
    Seal {
        /// The stream's index.
        stream: u16,
        /// What fastcp-crypto said.
        message: String,
    },
    /// A write after the stream was shut down.
    #[error("data stream {stream}: write after the stream was shut down")]
    Closed {
        /// The stream's index.
        stream: u16,
    },
    /// The underlying connection failed; later calls repeat this error.
    #[error("data stream {stream}: {message}")]
    Io {
        /// The stream's index.
        stream: u16,
        /// The I/O error's kind.
        kind: io::ErrorKind,
        /// The I/O error's message.
        message: String,
    },
}

impl RecordError {
    /// The [`io::ErrorKind`] reads and writes report this error with: `InvalidData` for
    /// authentication failures and malformed records, `UnexpectedEof` for truncation,
    /// `BrokenPipe` after shutdown, the original kind for I/O failures.
    pub fn kind(&self) -> io::ErrorKind {
        match self {
            RecordError::Authentication { .. }
            | RecordError::TooLong { .. }
            | RecordError::BadEnd { .. } => io::ErrorKind::InvalidData,
            RecordError::Truncated { .. } | RecordError::Unterminated { .. } => {
                io::ErrorKind::UnexpectedEof
            }
            RecordError::Seal { .. } => io::ErrorKind::Other,
            RecordError::Closed { .. } => io::ErrorKind::BrokenPipe,
            RecordError::Io { kind, .. } => *kind,
        }
    }

    /// The record error inside an [`io::Error`] returned by a sealed stream, if it is one.
    pub fn from_io(err: &io::Error) -> Option<&RecordError> {
        err.get_ref()?.downcast_ref()
    }

    fn io(stream: u16, err: &io::Error) -> RecordError {
        RecordError::Io {
            stream,
            kind: err.kind(),
            message: err.to_string(),
        }
    }
}

impl From<RecordError> for io::Error {
    fn from(e: RecordError) -> io::Error {
        io::Error::new(e.kind(), e)
    }
}

/// The write half's state: plaintext accumulates in `buf` after a header-sized gap; a full
/// record (or a flush) seals it in place, appends the tag, and writes header, ciphertext and
/// tag with as few calls as the socket allows.
pub(crate) struct Sealing {
    stream: u16,
    sealer: Sealer,
    record_len: usize,
    /// `header || plaintext` while filling; `header || ciphertext || tag` once sealed.
    buf: Vec<u8>,
    /// When sealed: bytes of `buf` already written.
    sent: usize,
    sealed: bool,
    /// The end record was sealed (it may still be draining).
    ended: bool,
    failed: Option<RecordError>,
}

impl Sealing {
    pub(crate) fn new(stream: u16, sealer: Sealer, record_len: usize) -> Sealing {
        let record_len = record_len.clamp(1, MAX_RECORD_LEN);
        let mut buf = Vec::with_capacity(HEADER_LEN + record_len + TAG_LEN);
        buf.resize(HEADER_LEN, 0);
        Sealing {
            stream,
            sealer,
            record_len,
            buf,
            sent: 0,
            sealed: false,
            ended: false,
            failed: None,
        }
    }

    pub(crate) fn stream(&self) -> u16 {
        self.stream
    }

    pub(crate) fn record_len(&self) -> usize {
        self.record_len
    }

    fn plain_len(&self) -> usize {
        self.buf.len() - HEADER_LEN
    }

    fn check(&self) -> io::Result<()> {
        match &self.failed {
            Some(e) => Err(e.clone().into()),
            None => Ok(()),
        }
    }

    fn fail(&mut self, e: RecordError) -> io::Error {
        self.failed = Some(e.clone());
        e.into()
    }

    /// Seals the buffered plaintext (possibly none, for the end record) in place.
    fn seal(&mut self, end: bool) -> io::Result<()> {
        debug_assert!(!self.sealed);
        let len = self.plain_len() as u32;
        let header = if end { len | END_FLAG } else { len };
        self.buf[..HEADER_LEN].copy_from_slice(&header.to_be_bytes());
        let (header, body) = self.buf.split_at_mut(HEADER_LEN);
        match self.sealer.seal_in_place(header, body) {
            Ok(tag) => {
                self.buf.extend_from_slice(&tag);
                self.sealed = true;
                self.sent = 0;
                Ok(())
            }
            Err(e) => Err(self.fail(RecordError::Seal {
                stream: self.stream,
                message: e.to_string(),
            })),
        }
    }

    /// Writes out the sealed record, then empties the buffer for the next one.
    fn poll_drain<W: AsyncWrite + ?Sized>(
        &mut self,
        mut w: Pin<&mut W>,
        cx: &mut Context<'_>,
    ) -> Poll<io::Result<()>> {
        while self.sent < self.buf.len() {
            match ready!(w.as_mut().poll_write(cx, &self.buf[self.sent..])) {
                Ok(0) => {
                    let e =
                        io::Error::new(io::ErrorKind::WriteZero, "the connection took no bytes");
                    return Poll::Ready(Err(self.fail(RecordError::io(self.stream, &e))));
                }
                Ok(n) => self.sent += n,
                Err(e) => return Poll::Ready(Err(self.fail(RecordError::io(self.stream, &e)))),
            }
        }
        self.buf.truncate(HEADER_LEN);
        self.sealed = false;
        Poll::Ready(Ok(()))
    }

    pub(crate) fn poll_write<W: AsyncWrite + ?Sized>(
        &mut self,
        mut w: Pin<&mut W>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.check()?;
        if self.ended {
            return Poll::Ready(Err(self.fail(RecordError::Closed {
                stream: self.stream,
            })));
        }
        loop {
            if self.sealed {
                ready!(self.poll_drain(w.as_mut(), cx))?;
            }
            let room = self.record_len - self.plain_len();
            if room == 0 {
                self.seal(false)?;
                continue;
            }
            let n = room.min(data.len());
            self.buf.extend_from_slice(&data[..n]);
            return Poll::Ready(Ok(n));
        }
    }

    pub(crate) fn poll_flush<W: AsyncWrite + ?Sized>(
        &mut self,
        mut w: Pin<&mut W>,
        cx: &mut Context<'_>,
    ) -> Poll<io::Result<()>> {
        self.check()?;
        if !self.sealed && self.plain_len() > 0 {
            self.seal(false)?;
        }
        if self.sealed {
            ready!(self.poll_drain(w.as_mut(), cx))?;
        }
        w.poll_flush(cx)
            .map_err(|e| self.fail(RecordError::io(self.stream, &e)))
    }

    /// Flushes, sends the sealed end record, then shuts the connection's write side down.
    pub(crate) fn poll_shutdown<W: AsyncWrite + ?Sized>(
        &mut self,
        mut w: Pin<&mut W>,
        cx: &mut Context<'_>,
    ) -> Poll<io::Result<()>> {
        self.check()?;
        loop {
            if self.sealed {
                ready!(self.poll_drain(w.as_mut(), cx))?;
            } else if self.ended {
                return w
                    .poll_shutdown(cx)
                    .map_err(|e| self.fail(RecordError::io(self.stream, &e)));
            } else if self.plain_len() > 0 {
                self.seal(false)?;
            } else {
                self.seal(true)?;
                self.ended = true;
            }
        }
    }
}

impl Sealing {
    /// Writes what is buffered as a record of its own, then seals `data` in place as records
    /// of up to `record_len` bytes and writes each as `header || ciphertext || tag` with one
    /// vectored write, so its bytes are never copied into the record buffer. `data` holds
    /// ciphertext afterwards.
    ///
    /// A failure, or this future being dropped once the first record is sealed, leaves the
    /// stream failed: part of a record may be out.
    pub(crate) async fn write_sealed<W: AsyncWrite + Unpin + ?Sized>(
        &mut self,
        w: &mut W,
        data: &mut [u8],
    ) -> io::Result<()> {
        if self.ended {
            self.check()?;
            return Err(self.fail(RecordError::Closed {
                stream: self.stream,
            }));
        }
        std::future::poll_fn(|cx| self.poll_flush(Pin::new(&mut *w), cx)).await?;
        let cancelled = io::Error::other("a sealed write was cancelled");
        self.failed = Some(RecordError::io(self.stream, &cancelled));
        for piece in data.chunks_mut(self.record_len) {
            let header = (piece.len() as u32).to_be_bytes();
            let tag = match self.sealer.seal_in_place(&header, piece) {
                Ok(tag) => tag,
                Err(e) => {
                    return Err(self.fail(RecordError::Seal {
                        stream: self.stream,
                        message: e.to_string(),
                    }));
                }
            };
            let mut slices = [
                IoSlice::new(&header),
                IoSlice::new(piece),
                IoSlice::new(&tag),
            ];
            let mut slices = &mut slices[..];
            while !slices.is_empty() {
                match w.write_vectored(slices).await {
                    Ok(0) => {
                        let e = io::Error::new(
                            io::ErrorKind::WriteZero,
                            "the connection took no bytes",
                        );
                        return Err(self.fail(RecordError::io(self.stream, &e)));
                    }
                    Ok(n) => IoSlice::advance_slices(&mut slices, n),
                    Err(e) => return Err(self.fail(RecordError::io(self.stream, &e))),
                }
            }
        }
        self.failed = None;
        Ok(())
    }
}

/// Where the read half is within the incoming byte stream.
#[derive(Debug, Clone, Copy)]
enum ReadState {
    /// Reading a header; `have` of its bytes are in `Opening::header`.
    Header { have: usize },
    /// Reading a record's `ciphertext || tag` (`need` bytes) into `Opening::buf`.
    Body { end: bool, need: usize, have: usize },
    /// Handing out the opened plaintext `buf[pos..end]`.
    Plain { pos: usize, end: usize },
    /// The authenticated end record arrived: end of stream.
    Ended,
    /// Failed; every later read repeats the error.
    Failed,
}

/// The read half's state: reads one record at a time into its own buffer (never past the
/// record), opens it in place, and only then hands out its plaintext.
pub(crate) struct Opening {
    stream: u16,
    opener: Opener,
    header: [u8; HEADER_LEN],
    buf: Vec<u8>,
    state: ReadState,
    failed: Option<RecordError>,
    last_record: usize,
}

/// Cuts a buffer back to `len` bytes when dropped.
struct Rollback<'a> {
    buf: &'a mut BytesMut,
    len: usize,
}

impl Drop for Rollback<'_> {
    fn drop(&mut self) {
        self.buf.truncate(self.len);
    }
}

impl Opening {
    pub(crate) fn new(stream: u16, opener: Opener) -> Opening {
        Opening {
            stream,
            opener,
            header: [0; HEADER_LEN],
            buf: Vec::new(),
            state: ReadState::Header { have: 0 },
            failed: None,
            last_record: 0,
        }
    }

    pub(crate) fn stream(&self) -> u16 {
        self.stream
    }

    fn fail(&mut self, e: RecordError) -> Poll<io::Result<()>> {
        Poll::Ready(Err(self.fail_now(e)))
    }

    fn fail_now(&mut self, e: RecordError) -> io::Error {
        self.state = ReadState::Failed;
        self.failed = Some(e.clone());
        e.into()
    }

    /// The complete header's end flag and the length of the `ciphertext || tag` after it.
    fn parse_header(&self) -> Result<(bool, usize), RecordError> {
        let word = u32::from_be_bytes(self.header);
        let len = word & !END_FLAG;
        if len as usize > MAX_RECORD_LEN {
            return Err(RecordError::TooLong {
                stream: self.stream,
                len: word,
                max: MAX_RECORD_LEN,
            });
        }
        Ok((word & END_FLAG != 0, len as usize + self.opener.tag_len()))
    }

    /// Opens `record` (`ciphertext || tag`) in place; returns its plaintext length.
    fn open(
        opener: &mut Opener,
        stream: u16,
        header: &[u8; HEADER_LEN],
        end: bool,
        record: &mut [u8],
    ) -> Result<usize, RecordError> {
        let len = match opener.open_record(header, record) {
            Ok(plain) => plain.len(),
            Err(_) => return Err(RecordError::Authentication { stream }),
        };
        if end && len > 0 {
            return Err(RecordError::BadEnd { stream, len });
        }
        Ok(len)
    }

    /// Whether nothing of the next record has been read yet.
    pub(crate) fn at_record_start(&self) -> bool {
        matches!(self.state, ReadState::Header { have: 0 })
    }

    /// The `ciphertext || tag` length of the last record read (0 before the first).
    pub(crate) fn last_record(&self) -> usize {
        self.last_record
    }

    /// Reads the next record straight onto the end of `buf`, opens it there and leaves its
    /// plaintext in place: returns the plaintext's length, 0 after the end record. Call only
    /// [at a record's start](Self::at_record_start).
    ///
    /// Reading the header can be cancelled and resumed by either read path. Once the body is
    /// being read, a failure, or this future being dropped, leaves the stream failed and
    /// `buf` as it was: ciphertext never stays in it.
    pub(crate) async fn read_record<R: AsyncRead + Unpin + ?Sized>(
        &mut self,
        r: &mut R,
        buf: &mut BytesMut,
    ) -> io::Result<usize> {
        debug_assert!(self.at_record_start());
        let mut have = 0;
        while have < HEADER_LEN {
            let got = match r.read(&mut self.header[have..]).await {
                Ok(n) => n,
                Err(e) => return Err(self.fail_now(RecordError::io(self.stream, &e))),
            };
            if got == 0 {
                let stream = self.stream;
                return Err(self.fail_now(if have == 0 {
                    RecordError::Unterminated { stream }
                } else {
                    RecordError::Truncated { stream }
                }));
            }
            have += got;
            if have < HEADER_LEN {
                self.state = ReadState::Header { have };
            }
        }
        let (end, need) = match self.parse_header() {
            Ok(h) => h,
            Err(e) => return Err(self.fail_now(e)),
        };
        self.last_record = need;
        // Failed until the record is in: a dropped future leaves it so.
        let interrupted = io::Error::other("a record read was cancelled");
        self.fail_now(RecordError::io(self.stream, &interrupted));
        let start = buf.len();
        let mut body = Rollback { buf, len: start };
        body.buf.reserve(need);
        while body.buf.len() - start < need {
            let want = need - (body.buf.len() - start);
            match r.read_buf(&mut (&mut *body.buf).limit(want)).await {
                Ok(0) => {
                    return Err(self.fail_now(RecordError::Truncated {
                        stream: self.stream,
                    }));
                }
                Ok(_) => {}
                Err(e) => return Err(self.fail_now(RecordError::io(self.stream, &e))),
            }
        }
        let record = &mut body.buf[start..start + need];
        let len = match Self::open(&mut self.opener, self.stream, &self.header, end, record) {
            Ok(len) => len,
            Err(e) => return Err(self.fail_now(e)),
        };
        body.len = start + len;
        self.failed = None;
        self.state = if end {
            ReadState::Ended
        } else {
            ReadState::Header { have: 0 }
        };
        Ok(len)
    }

    pub(crate) fn poll_read<R: AsyncRead + ?Sized>(
        &mut self,
        mut r: Pin<&mut R>,
        cx: &mut Context<'_>,
        out: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        loop {
            match self.state {
                ReadState::Failed => {
                    let e = self
                        .failed
                        .clone()
                        .expect("a failed stream keeps its error");
                    return Poll::Ready(Err(e.into()));
                }
                ReadState::Ended => return Poll::Ready(Ok(())),
                ReadState::Plain { pos, end } if pos < end => {
                    let n = out.remaining().min(end - pos);
                    out.put_slice(&self.buf[pos..pos + n]);
                    self.state = if pos + n == end {
                        ReadState::Header { have: 0 }
                    } else {
                        ReadState::Plain { pos: pos + n, end }
                    };
                    return Poll::Ready(Ok(()));
                }
                ReadState::Plain { .. } => self.state = ReadState::Header { have: 0 },
                _ if out.remaining() == 0 => return Poll::Ready(Ok(())),
                ReadState::Header { have } => {
                    let mut rb = ReadBuf::new(&mut self.header[have..]);
                    if let Err(e) = ready!(r.as_mut().poll_read(cx, &mut rb)) {
                        return self.fail(RecordError::io(self.stream, &e));
                    }
                    let got = rb.filled().len();
                    if got == 0 {
                        return self.fail(if have == 0 {
                            RecordError::Unterminated {
                                stream: self.stream,
                            }
                        } else {
                            RecordError::Truncated {
                                stream: self.stream,
                            }
                        });
                    }
                    let have = have + got;
                    if have < HEADER_LEN {
                        self.state = ReadState::Header { have };
                        continue;
                    }
                    let (end, need) = match self.parse_header() {
                        Ok(h) => h,
                        Err(e) => return self.fail(e),
                    };
                    if self.buf.len() < need {
                        self.buf.resize(need, 0);
                    }
                    self.state = ReadState::Body { end, need, have: 0 };
                }
                ReadState::Body { end, need, have } => {
                    if have < need {
                        let mut rb = ReadBuf::new(&mut self.buf[have..need]);
                        if let Err(e) = ready!(r.as_mut().poll_read(cx, &mut rb)) {
                            return self.fail(RecordError::io(self.stream, &e));
                        }
                        let got = rb.filled().len();
                        if got == 0 {
                            return self.fail(RecordError::Truncated {
                                stream: self.stream,
                            });
                        }
                        self.state = ReadState::Body {
                            end,
                            need,
                            have: have + got,
                        };
                        continue;
                    }
                    let len = match Self::open(
                        &mut self.opener,
                        self.stream,
                        &self.header,
                        end,
                        &mut self.buf[..need],
                    ) {
                        Ok(len) => len,
                        Err(e) => return self.fail(e),
                    };
                    self.state = if end {
                        ReadState::Ended
                    } else {
                        ReadState::Plain { pos: 0, end: len }
                    };
                }
            }
        }
    }
}
