//! Where the engine's frames meet its streams: a [`Sink`] for the sender's writer tasks and a
//! [`Source`] for the receiver's readers.
//!
//! Over a byte stream (every transport, and the engine's public [`send`](crate::send) and
//! [`receive`](crate::receive)) they are `write_all` into a write buffer and `read_buf`; a
//! stream that reads whole records can bring its own [`ReadInto`] to
//! [`receive_from`](crate::receive_from) and read them into the receiver's buffer directly.
//!
//! [`copy_local`](crate::copy_local) connects the two sides in one process with [`local`]
//! pipes instead, which carry the same encoded frames as shared buffers: a part of at least
//! [`SHARE_MIN`] bytes (a file's content or a chunk of it) travels as the buffer it was read
//! into, and the receiver takes it as the payload of the `Data` frame whose header it has just
//! decoded ([`Decoder::decode_split_data`]), so those bytes are never copied from one side
//! to the other. Smaller parts are gathered into one buffer, as a byte stream's write buffer
//! would gather them, and the reader copies such a buffer once. The sender gathers small
//! files itself, many to a part, where no content hash is taken
//! ([`WriteFrom::takes_gathered`]), as in fastcp's own local copy.

use std::future::Future;
use std::io;
use std::sync::Arc;

use bytes::{BufMut, Bytes, BytesMut};
use fastcp_proto::{Decoder, Frame};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufWriter};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};

use crate::budget::Pool;

/// Where a writer task puts a message's parts, in order.
pub(crate) trait Sink: Send + 'static {
    /// Queues `part` after the parts before it; the sink may leave other bytes in it.
    fn write(&mut self, part: &mut Bytes) -> impl Future<Output = io::Result<()>> + Send;
    /// Pushes out whatever is gathered.
    fn flush(&mut self) -> impl Future<Output = io::Result<()>> + Send;
    /// Flushes, then ends the stream.
    fn shutdown(&mut self) -> impl Future<Output = io::Result<()>> + Send;
    /// Whether small files should come gathered, many to a part (see
    /// [`WriteFrom::takes_gathered`]).
    fn takes_gathered(&self) -> bool;
}

/// What a reader got from its [`Source`].
pub(crate) enum Fill {
    /// This many bytes were appended to the buffer; 0 means the stream ended.
    Read(usize),
    /// A whole `Data` frame whose payload arrived on its own; the buffer held its header and
    /// is now empty.
    Frame(Frame),
}

/// Where a reader gets more bytes from.
pub(crate) trait Source: Send + 'static {
    /// Appends what arrives next to `buf` (making room through `pool` as needed), or returns
    /// the `Data` frame that `buf` held the start of, when the rest came as one shared buffer.
    /// A byte stream appends at most `limit` bytes; a local pipe hands over whole buffers.
    fn fill(
        &mut self,
        buf: &mut BytesMut,
        limit: usize,
        decoder: &Decoder,
        pool: &Pool,
    ) -> impl Future<Output = io::Result<Fill>> + Send;

    /// The spare room `buf` should have before a fill (see [`ReadInto::room`]).
    fn room(&self) -> usize {
        0
    }
}

/// A stream's write half as [`send_to`](crate::send_to) writes it: the frames' parts, in
/// order.
///
/// [`ByteWriter`] makes any [`AsyncWrite`] one. A stream that seals its bytes in records can
/// implement it to seal a big part (a file chunk) where it lies instead of copying it into a
/// record buffer first.
pub trait WriteFrom: Send + 'static {
    /// Writes `part` after the parts before it, or buffers it. The engine is done with the
    /// part's bytes once this returns: the writer may leave other bytes in it (ciphertext
    /// sealed in place) or replace it, as long as a buffer it was the only owner of stays
    /// one it is the only owner of, for reuse.
    fn write_part(&mut self, part: &mut Bytes) -> impl Future<Output = io::Result<()>> + Send;

    /// Pushes out whatever is buffered.
    fn flush(&mut self) -> impl Future<Output = io::Result<()>> + Send;

    /// Flushes, then ends the stream.
    fn shutdown(&mut self) -> impl Future<Output = io::Result<()>> + Send;

    /// Whether small files should come gathered, many whole files to a part of at least
    /// 256 KiB, rather than a message each: true (the default) for a writer that copies
    /// small parts into a buffer of its own but seals or writes a big one where it lies;
    /// false for one whose reader takes each file's part as it is but copies a part that
    /// holds many frames, where that copy would cost more than a message a file (for the
    /// in-process pipes of a local copy it costs less). The engine gathers only when every
    /// writer takes it, and only when its checksums need no pass over the content.
    fn takes_gathered(&self) -> bool {
        true
    }
}

/// Any [`AsyncWrite`] as a [`WriteFrom`], behind a write buffer that gathers small parts
/// (256 KiB; bigger parts go straight through).
#[derive(Debug)]
pub struct ByteWriter<W: AsyncWrite>(BufWriter<W>);

impl<W: AsyncWrite> ByteWriter<W> {
    /// The write buffer's size.
    pub const BUFFER: usize = 256 << 10;

    /// Wraps `w`.
    pub fn new(w: W) -> ByteWriter<W> {
        ByteWriter(BufWriter::with_capacity(Self::BUFFER, w))
    }
}

impl<W: AsyncWrite + Unpin + Send + 'static> WriteFrom for ByteWriter<W> {
    async fn write_part(&mut self, part: &mut Bytes) -> io::Result<()> {
        self.0.write_all(part).await
    }

    async fn flush(&mut self) -> io::Result<()> {
        self.0.flush().await
    }

    async fn shutdown(&mut self) -> io::Result<()> {
        self.0.shutdown().await
    }
}

impl<T: WriteFrom> Sink for T {
    async fn write(&mut self, part: &mut Bytes) -> io::Result<()> {
        self.write_part(part).await
    }

    async fn flush(&mut self) -> io::Result<()> {
        WriteFrom::flush(self).await
    }

    async fn shutdown(&mut self) -> io::Result<()> {
        WriteFrom::shutdown(self).await
    }

    fn takes_gathered(&self) -> bool {
        WriteFrom::takes_gathered(self)
    }
}

/// A stream's read half as [`receive_from`](crate::receive_from) reads it: what arrives next
/// goes onto the end of the receiver's buffer.
///
/// [`ByteReader`] makes any [`AsyncRead`] one. A stream that reads in records can implement
/// it to put each record's bytes into the receiver's buffer directly, with no copy between
/// its own buffer and the receiver's.
pub trait ReadInto: Send + 'static {
    /// Appends the bytes that arrive next to `buf` and returns how many; 0 means the stream
    /// ended. A reader that can stop anywhere appends at most `limit` bytes; one that hands
    /// over whole records only may go past it (the receiver then copies a little more).
    fn read_into(
        &mut self,
        buf: &mut BytesMut,
        limit: usize,
    ) -> impl Future<Output = io::Result<usize>> + Send;

    /// The spare room `buf` should have before a read: a reader of whole records says how
    /// big one is, so that none has to grow the buffer. 0 (the default) leaves it to the
    /// receiver.
    fn room(&self) -> usize {
        0
    }
}

/// Any [`AsyncRead`] as a [`ReadInto`].
#[derive(Debug)]
pub struct ByteReader<R>(pub R);

impl<R: AsyncRead + Unpin + Send + 'static> ReadInto for ByteReader<R> {
    async fn read_into(&mut self, buf: &mut BytesMut, limit: usize) -> io::Result<usize> {
        self.0.read_buf(&mut buf.limit(limit)).await
    }
}

impl<T: ReadInto> Source for T {
    async fn fill(
        &mut self,
        buf: &mut BytesMut,
        limit: usize,
        _: &Decoder,
        _: &Pool,
    ) -> io::Result<Fill> {
        self.read_into(buf, limit).await.map(Fill::Read)
    }

    fn room(&self) -> usize {
        ReadInto::room(self)
    }
}

/// Parts of at least this many bytes travel through a local pipe as they are; smaller ones
/// are gathered.
pub(crate) const SHARE_MIN: usize = 16 << 10;

/// Gathered bytes go out once there are this many.
const GATHER_MAX: usize = 256 << 10;

/// One buffer in a local pipe, holding its share of the pipe's room until it is taken.
struct Segment {
    bytes: Bytes,
    _room: OwnedSemaphorePermit,
}

/// A local pipe of `room` bytes: what is written to the [`LocalSink`] and not yet taken from
/// the [`LocalSource`] is bounded by `room`, counting a buffer bigger than `room` as `room`.
pub(crate) fn local(room: usize) -> (LocalSink, LocalSource) {
    let (tx, rx) = mpsc::unbounded_channel();
    let room = room.clamp(1, Semaphore::MAX_PERMITS.min(u32::MAX as usize));
    let sink = LocalSink {
        tx: Some(tx),
        room: Arc::new(Semaphore::new(room)),
        room_size: room,
        gather: BytesMut::new(),
    };
    (sink, LocalSource { rx })
}

/// The sending end of a [`local`] pipe.
pub(crate) struct LocalSink {
    tx: Option<mpsc::UnboundedSender<Segment>>,
    room: Arc<Semaphore>,
    room_size: usize,
    gather: BytesMut,
}

fn closed() -> io::Error {
    io::Error::new(io::ErrorKind::BrokenPipe, "the receiving side has gone")
}

impl LocalSink {
    async fn send(&mut self, bytes: Bytes) -> io::Result<()> {
        let n = bytes.len().min(self.room_size) as u32;
        let permit = self
            .room
            .clone()
            .acquire_many_owned(n)
            .await
            .map_err(|_| closed())?;
        let tx = self.tx.as_ref().ok_or_else(closed)?;
        tx.send(Segment {
            bytes,
            _room: permit,
        })
        .map_err(|_| closed())
    }

    async fn send_gathered(&mut self) -> io::Result<()> {
        if self.gather.is_empty() {
            return Ok(());
        }
        let bytes = self.gather.split().freeze();
        self.send(bytes).await
    }
}

impl Sink for LocalSink {
    async fn write(&mut self, part: &mut Bytes) -> io::Result<()> {
        if part.len() < SHARE_MIN {
            self.gather.extend_from_slice(part);
            if self.gather.len() >= GATHER_MAX {
                self.send_gathered().await?;
            }
            return Ok(());
        }
        // What came before goes first, so that a chunk's header ends the buffer before it.
        self.send_gathered().await?;
        self.send(part.clone()).await
    }

    async fn flush(&mut self) -> io::Result<()> {
        self.send_gathered().await
    }

    async fn shutdown(&mut self) -> io::Result<()> {
        self.send_gathered().await?;
        self.tx = None;
        Ok(())
    }

    /// Small files come many to a part. The reader copies such a part, where it took a
    /// file's own part as it was, but one message for many files costs the two sides
    /// fewer wake-ups than that copy (a local copy of a 52,000-file tree: futex calls
    /// 202,716 to 13,136, and 5% less CPU; BENCHMARKS.md).
    fn takes_gathered(&self) -> bool {
        true
    }
}

/// The receiving end of a [`local`] pipe.
pub(crate) struct LocalSource {
    rx: mpsc::UnboundedReceiver<Segment>,
}

impl Source for LocalSource {
    async fn fill(
        &mut self,
        buf: &mut BytesMut,
        _: usize,
        decoder: &Decoder,
        pool: &Pool,
    ) -> io::Result<Fill> {
        // The segment's room is given back as soon as it is taken: from here on its bytes
        // count against the receiver's own budget, as bytes read from a stream would.
        let Some(Segment { bytes, .. }) = self.rx.recv().await else {
            return Ok(Fill::Read(0));
        };
        if let Some(frame) = decoder.decode_split_data(buf, &bytes) {
            return Ok(Fill::Frame(frame));
        }
        crate::receive::ensure_room(buf, bytes.len(), pool);
        buf.extend_from_slice(&bytes);
        Ok(Fill::Read(bytes.len()))
    }
}

/// A one-way stream of frames from [`send_to`](crate::send_to) to a consumer in the same
/// process that takes the frames themselves (as fastcp's SFTP push does, which turns them into
/// SFTP requests): the local pipe [`copy_local`](crate::copy_local) uses, with a public face.
/// A file's chunks reach the [`PipeReader`] as the very buffers the sender read them into;
/// nothing is copied from one side to the other. `room` bounds the bytes in the pipe.
///
/// ```
/// # tokio::runtime::Runtime::new().unwrap().block_on(async {
/// use fastcp_stream::{WriteFrom, frame_pipe};
///
/// let (mut writer, mut reader) = frame_pipe(1 << 20);
/// let mut frame = bytes::BytesMut::new();
/// fastcp_proto::encode(&fastcp_proto::Frame::Done(Default::default()), &mut frame);
/// writer.write_part(&mut frame.freeze()).await?;
/// writer.shutdown().await?;
/// assert!(matches!(reader.next().await?, Some(fastcp_proto::Frame::Done(_))));
/// assert!(reader.next().await?.is_none());
/// # std::io::Result::Ok(()) }).unwrap();
/// ```
pub fn frame_pipe(room: usize) -> (PipeWriter, PipeReader) {
    let (sink, source) = local(room);
    let reader = PipeReader {
        source,
        buf: BytesMut::new(),
        decoder: Decoder::new(fastcp_proto::HARD_MAX_FRAME),
        pool: Pool::default(),
    };
    (PipeWriter(sink), reader)
}

/// A pipe of frames into a receiver in the same process, for a producer of frames other than
/// fastcp's sender (as fastcp's SFTP pull is, which turns SFTP replies into frames): write
/// encoded frames to the [`PipeWriter`], and give the [`PipeSource`] to
/// [`receive_piped`](crate::receive_piped). A part of 16 KiB or more, a `Data` frame's
/// payload written on its own, reaches the receiver as the very buffer written: nothing is
/// copied from one side to the other. `room` bounds the bytes in the pipe.
pub fn receiver_pipe(room: usize) -> (PipeWriter, PipeSource) {
    let (sink, source) = local(room);
    (PipeWriter(sink), PipeSource(source))
}

/// The receiving end of a [`receiver_pipe`].
pub struct PipeSource(LocalSource);

impl Source for PipeSource {
    async fn fill(
        &mut self,
        buf: &mut BytesMut,
        limit: usize,
        decoder: &Decoder,
        pool: &Pool,
    ) -> io::Result<Fill> {
        self.0.fill(buf, limit, decoder, pool).await
    }
}

/// The sending end of a [`frame_pipe`]: give it to [`send_to`](crate::send_to).
pub struct PipeWriter(LocalSink);

impl WriteFrom for PipeWriter {
    async fn write_part(&mut self, part: &mut Bytes) -> io::Result<()> {
        Sink::write(&mut self.0, part).await
    }

    async fn flush(&mut self) -> io::Result<()> {
        Sink::flush(&mut self.0).await
    }

    async fn shutdown(&mut self) -> io::Result<()> {
        Sink::shutdown(&mut self.0).await
    }

    /// A file a message, as before the local copy gathered: the SFTP push, which takes
    /// these frames, was not measured with small files gathered.
    fn takes_gathered(&self) -> bool {
        false
    }
}

/// The receiving end of a [`frame_pipe`]: whole frames, in the order they were written.
pub struct PipeReader {
    source: LocalSource,
    buf: BytesMut,
    decoder: Decoder,
    pool: Pool,
}

impl PipeReader {
    /// The next frame; `None` once the writer has shut down (or is gone) after a whole
    /// frame. Bytes that do not decode are an `InvalidData` error, a frame cut short by the
    /// writer's end an `UnexpectedEof`.
    pub async fn next(&mut self) -> io::Result<Option<Frame>> {
        loop {
            if let Some(frame) = self
                .decoder
                .decode(&mut self.buf)
                .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?
            {
                return Ok(Some(frame));
            }
            match self
                .source
                .fill(&mut self.buf, usize::MAX, &self.decoder, &self.pool)
                .await?
            {
                Fill::Frame(frame) => return Ok(Some(frame)),
                Fill::Read(0) if self.buf.is_empty() => return Ok(None),
                Fill::Read(0) => {
                    return Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "the frame pipe ended inside a frame",
                    ));
                }
                Fill::Read(_) => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fastcp_proto::{Data, encode_data_header};

    /// One `fill` of `source` into `buf` with at most `limit` bytes, as a reader with a 1 MiB
    /// frame cap makes it.
    async fn fill(source: &mut impl Source, buf: &mut BytesMut, limit: usize) -> Fill {
        let (decoder, pool) = (Decoder::new(1 << 20), Pool::default());
        source.fill(buf, limit, &decoder, &pool).await.unwrap()
    }

    #[tokio::test]
    async fn a_frame_pipe_hands_over_frames_and_chunks_as_written() {
        let (mut writer, mut reader) = frame_pipe(1 << 20);
        let mut payload = Bytes::from(vec![7u8; SHARE_MIN * 4]);
        let mut head = BytesMut::new();
        fastcp_proto::encode(&Frame::Totals(Default::default()), &mut head);
        encode_data_header(3, 4096, payload.len(), &mut head);
        writer.write_part(&mut head.freeze()).await.unwrap();
        writer.write_part(&mut payload).await.unwrap();
        let mut small = BytesMut::new();
        encode_data_header(3, 0, 5, &mut small);
        small.extend_from_slice(b"hello");
        writer.write_part(&mut small.freeze()).await.unwrap();
        WriteFrom::shutdown(&mut writer).await.unwrap();

        assert!(matches!(
            reader.next().await.unwrap(),
            Some(Frame::Totals(_))
        ));
        let Some(Frame::Data(big)) = reader.next().await.unwrap() else {
            panic!("a chunk");
        };
        assert_eq!((big.id, big.offset), (3, 4096));
        assert_eq!(big.bytes.as_ptr(), payload.as_ptr(), "not copied");
        let Some(Frame::Data(d)) = reader.next().await.unwrap() else {
            panic!("a small chunk");
        };
        assert_eq!(&d.bytes[..], b"hello");
        assert!(reader.next().await.unwrap().is_none());
    }

    #[tokio::test]
    async fn a_frame_pipe_cut_inside_a_frame_or_fed_garbage_fails() {
        let (mut writer, mut reader) = frame_pipe(1 << 20);
        let mut head = BytesMut::new();
        encode_data_header(1, 0, 10, &mut head);
        head.extend_from_slice(b"abc");
        writer.write_part(&mut head.freeze()).await.unwrap();
        WriteFrom::shutdown(&mut writer).await.unwrap();
        let e = reader.next().await.unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof);

        let (mut writer, mut reader) = frame_pipe(1 << 20);
        writer
            .write_part(&mut Bytes::from_static(&[0xee; 32]))
            .await
            .unwrap();
        WriteFrom::flush(&mut writer).await.unwrap();
        let e = reader.next().await.unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidData);
    }

    #[tokio::test]
    async fn a_chunk_after_its_header_is_taken_without_copying() {
        let (mut sink, mut source) = local(1 << 20);
        let mut payload = Bytes::from(vec![5u8; SHARE_MIN]);
        let mut head = BytesMut::new();
        encode_data_header(1, 0, payload.len(), &mut head);
        sink.write(&mut head.freeze()).await.unwrap();
        sink.write(&mut payload).await.unwrap();
        sink.shutdown().await.unwrap();

        let mut buf = BytesMut::new();
        let Fill::Read(n) = fill(&mut source, &mut buf, usize::MAX).await else {
            panic!("the header comes first");
        };
        assert_eq!(n, 21);
        let Fill::Frame(Frame::Data(Data { id, offset, bytes })) =
            fill(&mut source, &mut buf, usize::MAX).await
        else {
            panic!("the chunk completes its frame");
        };
        assert_eq!((id, offset), (1, 0));
        // The very buffer that was written.
        assert_eq!(bytes.as_ptr(), payload.as_ptr());
        assert!(buf.is_empty());
        assert!(matches!(
            fill(&mut source, &mut buf, usize::MAX).await,
            Fill::Read(0)
        ));
    }

    #[tokio::test]
    async fn small_parts_are_gathered_and_room_is_bounded() {
        let (mut sink, mut source) = local(1000);
        for _ in 0..3 {
            sink.write(&mut Bytes::from_static(b"abc")).await.unwrap();
        }
        sink.flush().await.unwrap();
        let mut buf = BytesMut::new();
        assert!(matches!(
            fill(&mut source, &mut buf, usize::MAX).await,
            Fill::Read(9)
        ));
        assert_eq!(&buf[..], b"abcabcabc");

        // A big buffer takes all the room: the next write waits until it is taken.
        sink.write(&mut Bytes::from(vec![0u8; SHARE_MIN]))
            .await
            .unwrap();
        let mut second = Bytes::from(vec![1u8; SHARE_MIN]);
        let mut next = Box::pin(sink.write(&mut second));
        assert!(
            tokio::time::timeout(std::time::Duration::from_millis(50), &mut next)
                .await
                .is_err()
        );
        fill(&mut source, &mut buf, usize::MAX).await;
        next.await.unwrap();
    }

    #[tokio::test]
    async fn a_byte_source_reads_no_more_than_its_limit() {
        let (mut a, b) = tokio::io::duplex(1 << 16);
        a.write_all(&[7u8; 100]).await.unwrap();
        let mut source = ByteReader(b);
        let mut buf = BytesMut::with_capacity(1 << 10);
        assert!(matches!(
            fill(&mut source, &mut buf, 30).await,
            Fill::Read(30)
        ));
        assert!(matches!(
            fill(&mut source, &mut buf, usize::MAX).await,
            Fill::Read(70)
        ));
        assert_eq!(&buf[..], &[7u8; 100][..]);
    }

    #[tokio::test]
    async fn writing_after_the_source_is_gone_is_a_broken_pipe() {
        let (mut sink, source) = local(1 << 20);
        drop(source);
        let e = sink
            .write(&mut Bytes::from(vec![0u8; SHARE_MIN]))
            .await
            .unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::BrokenPipe);
    }
}
