//! [`SealedStream`], and its halves [`SealedReader`] and [`SealedWriter`].

use std::fmt;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::BytesMut;
use fastcp_crypto::{Direction, KeyConfig, SessionSecret};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};

use super::record::{Opening, Sealing};

/// A byte stream sealed with the session's AEAD, record by record.
///
/// Writes collect in a buffer of `record_len` bytes; a full buffer, a flush or a shutdown
/// seals it in place and sends `header || ciphertext || tag`. Reads take one record at a time,
/// check its tag, and only then return its bytes. Shutting down sends a sealed end record;
/// a reader reports end of stream only after that record, so a connection cut at any point
/// reads as an error, never as a clean end. The record format is in the
/// [module docs](super).
///
/// **Call [`shutdown`](tokio::io::AsyncWriteExt::shutdown) when done writing**: a stream
/// dropped without it reads as cut off at the other end.
///
/// ```
/// use fastcp_crypto::{CipherSuite, Direction, KeyConfig, Provider, SessionSecret};
/// use fastcp_transport::tcp::SealedStream;
/// use tokio::io::{AsyncReadExt, AsyncWriteExt};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let secret = SessionSecret::generate()?;
/// let keys = KeyConfig::new(CipherSuite::ChaCha20Poly1305, Provider::Ring);
/// let (a, b) = tokio::io::duplex(1 << 16);
/// let mut client = SealedStream::new(a, &secret, &keys, Direction::ClientToServer, 1, 1 << 16)?;
/// let mut server = SealedStream::new(b, &secret, &keys, Direction::ServerToClient, 1, 1 << 16)?;
///
/// client.write_all(b"hello").await?;
/// client.shutdown().await?;
/// let mut got = Vec::new();
/// server.read_to_end(&mut got).await?;
/// assert_eq!(got, b"hello");
/// # Ok(())
/// # }
/// ```
pub struct SealedStream<S> {
    inner: S,
    reader: Opening,
    writer: Sealing,
}

impl<S> SealedStream<S> {
    /// Wraps `inner` as data stream `index` of the session keyed by `secret`.
    ///
    /// This end seals with the keys for `sends` and opens with those for the reverse
    /// direction: the client passes [`Direction::ClientToServer`], the server
    /// [`Direction::ServerToClient`]. `record_len` is the plaintext per record this end
    /// writes, clamped to 1..=[`MAX_RECORD_LEN`](super::MAX_RECORD_LEN); the two ends need not
    /// agree on it.
    pub fn new(
        inner: S,
        secret: &SessionSecret,
        keys: &KeyConfig,
        sends: Direction,
        index: u16,
        record_len: usize,
    ) -> Result<SealedStream<S>, fastcp_crypto::Error> {
        let stream = u32::from(index);
        let sealer = secret.sealer(keys, sends, stream)?;
        let opener = secret.opener(keys, sends.reverse(), stream)?;
        Ok(SealedStream {
            inner,
            reader: Opening::new(index, opener),
            writer: Sealing::new(index, sealer, record_len),
        })
    }

    /// The stream's index in the session.
    pub fn index(&self) -> u16 {
        self.reader.stream()
    }

    /// The plaintext per record this end writes.
    pub fn record_len(&self) -> usize {
        self.writer.record_len()
    }

    /// The underlying stream.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The same sealed stream over `f(inner)`: to count or pace the bytes that cross the
    /// underlying stream, beneath the sealing.
    pub fn map_inner<T>(self, f: impl FnOnce(S) -> T) -> SealedStream<T> {
        SealedStream {
            inner: f(self.inner),
            reader: self.reader,
            writer: self.writer,
        }
    }
}

impl<S: AsyncRead + Unpin> SealedStream<S> {
    /// Reads the next record onto the end of `buf`, opening it in place: see
    /// [`SealedReader::read_record`].
    pub async fn read_record(&mut self, buf: &mut BytesMut) -> io::Result<usize> {
        if !self.reader.at_record_start() {
            return self.read_buf(buf).await;
        }
        self.reader.read_record(&mut self.inner, buf).await
    }
}

impl<S: AsyncWrite + Unpin> SealedStream<S> {
    /// Seals `data` in place and writes it: see [`SealedWriter::write_sealed`].
    pub async fn write_sealed(&mut self, data: &mut [u8]) -> io::Result<()> {
        self.writer.write_sealed(&mut self.inner, data).await
    }
}

impl SealedStream<TcpStream> {
    /// Splits the stream into halves that can be used from two tasks, without a lock.
    pub fn into_split(self) -> (SealedReader<OwnedReadHalf>, SealedWriter<OwnedWriteHalf>) {
        self.into_split_with(|r| r, |w| w)
    }

    /// Splits the stream as [`into_split`](Self::into_split) does, with each half of the
    /// socket wrapped by `read` and `write` beneath the sealing: to count or pace the bytes
    /// that cross the socket, say.
    pub fn into_split_with<R, W>(
        self,
        read: impl FnOnce(OwnedReadHalf) -> R,
        write: impl FnOnce(OwnedWriteHalf) -> W,
    ) -> (SealedReader<R>, SealedWriter<W>) {
        let (r, w) = self.inner.into_split();
        (
            SealedReader {
                inner: read(r),
                state: self.reader,
            },
            SealedWriter {
                inner: write(w),
                state: self.writer,
            },
        )
    }
}

impl<S> fmt::Debug for SealedStream<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SealedStream")
            .field("index", &self.index())
            .field("record_len", &self.record_len())
            .finish_non_exhaustive()
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for SealedStream<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        this.reader.poll_read(Pin::new(&mut this.inner), cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for SealedStream<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        this.writer.poll_write(Pin::new(&mut this.inner), cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        this.writer.poll_flush(Pin::new(&mut this.inner), cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        this.writer.poll_shutdown(Pin::new(&mut this.inner), cx)
    }
}

/// The reading half of a [`SealedStream`], from [`SealedStream::into_split`].
pub struct SealedReader<R> {
    inner: R,
    state: Opening,
}

impl<R> SealedReader<R> {
    /// The stream's index in the session.
    pub fn index(&self) -> u16 {
        self.state.stream()
    }
}

impl<R: AsyncRead + Unpin> SealedReader<R> {
    /// Reads the next record onto the end of `buf` and returns how many bytes of plaintext it
    /// added: 0 at the end of the stream, after the sealed end record.
    ///
    /// The ciphertext is read straight into `buf`'s spare room (grown for it if need be) and
    /// opened there, so the plaintext is never copied; [`AsyncRead`] instead reads each
    /// record into a buffer of the stream's own and copies it out. `buf` only ever gains
    /// plaintext that authenticated: on any error, and if this future is dropped before it
    /// completes, `buf` keeps its old length and the stream fails (later reads return an
    /// error). The two ways of reading can be mixed; this one hands over what `poll_read` left
    /// of a record first.
    ///
    /// ```
    /// use bytes::BytesMut;
    /// use fastcp_crypto::{CipherSuite, Direction, KeyConfig, Provider, SessionSecret};
    /// use fastcp_transport::tcp::SealedStream;
    /// use tokio::io::AsyncWriteExt;
    /// use tokio::net::{TcpListener, TcpStream};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let secret = SessionSecret::generate()?;
    /// let keys = KeyConfig::new(CipherSuite::Aes128Gcm, Provider::Ring);
    /// let listener = TcpListener::bind("127.0.0.1:0").await?;
    /// let a = TcpStream::connect(listener.local_addr()?).await?;
    /// let (b, _) = listener.accept().await?;
    /// let mut client = SealedStream::new(a, &secret, &keys, Direction::ClientToServer, 1, 1 << 16)?;
    /// let server = SealedStream::new(b, &secret, &keys, Direction::ServerToClient, 1, 1 << 16)?;
    ///
    /// client.write_all(b"hello").await?;
    /// client.shutdown().await?;
    /// let (mut reader, _writer) = server.into_split();
    /// let mut buf = BytesMut::new();
    /// while reader.read_record(&mut buf).await? > 0 {}
    /// assert_eq!(&buf[..], b"hello");
    /// # Ok(())
    /// # }
    /// ```
    pub async fn read_record(&mut self, buf: &mut BytesMut) -> io::Result<usize> {
        if !self.state.at_record_start() {
            return self.read_buf(buf).await;
        }
        self.state.read_record(&mut self.inner, buf).await
    }

    /// The size of the last record read (`ciphertext || tag`, header excluded): the room a
    /// buffer should have for [`read_record`](Self::read_record) to need no growing.
    pub fn record_room(&self) -> usize {
        self.state.last_record()
    }
}

impl<R> fmt::Debug for SealedReader<R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SealedReader")
            .field("index", &self.index())
            .finish_non_exhaustive()
    }
}

impl<R: AsyncRead + Unpin> AsyncRead for SealedReader<R> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        this.state.poll_read(Pin::new(&mut this.inner), cx, buf)
    }
}

/// The writing half of a [`SealedStream`], from [`SealedStream::into_split`].
pub struct SealedWriter<W> {
    inner: W,
    state: Sealing,
}

impl<W> SealedWriter<W> {
    /// The stream's index in the session.
    pub fn index(&self) -> u16 {
        self.state.stream()
    }
}

impl<W: AsyncWrite + Unpin> SealedWriter<W> {
    /// Writes `data` as whole records sealed in place, after whatever is buffered (which goes
    /// out first as a record of its own): `data` holds ciphertext afterwards, and its bytes
    /// are never copied into the stream's record buffer as [`AsyncWrite`] copies them. For
    /// big buffers the writer is done with, such as a file chunk already hashed.
    ///
    /// A failure, or this future being dropped midway, leaves the stream failed: part of a
    /// record may have gone out.
    ///
    /// ```
    /// use fastcp_crypto::{CipherSuite, Direction, KeyConfig, Provider, SessionSecret};
    /// use fastcp_transport::tcp::SealedStream;
    /// use tokio::io::{AsyncReadExt, AsyncWriteExt};
    /// use tokio::net::{TcpListener, TcpStream};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let secret = SessionSecret::generate()?;
    /// let keys = KeyConfig::new(CipherSuite::Aes128Gcm, Provider::Ring);
    /// let listener = TcpListener::bind("127.0.0.1:0").await?;
    /// let a = TcpStream::connect(listener.local_addr()?).await?;
    /// let (b, _) = listener.accept().await?;
    /// let client = SealedStream::new(a, &secret, &keys, Direction::ClientToServer, 1, 1 << 16)?;
    /// let mut server = SealedStream::new(b, &secret, &keys, Direction::ServerToClient, 1, 1 << 16)?;
    ///
    /// let (_reader, mut writer) = client.into_split();
    /// writer.write_all(b"header:").await?;
    /// let mut chunk = vec![7u8; 100_000];
    /// writer.write_sealed(&mut chunk).await?;
    /// assert_ne!(chunk, vec![7u8; 100_000], "sealed in place");
    /// writer.shutdown().await?;
    /// let mut got = Vec::new();
    /// server.read_to_end(&mut got).await?;
    /// assert_eq!(&got[..7], b"header:");
    /// assert!(got[7..].iter().all(|&b| b == 7) && got.len() == 100_007);
    /// # Ok(())
    /// # }
    /// ```
    pub async fn write_sealed(&mut self, data: &mut [u8]) -> io::Result<()> {
        self.state.write_sealed(&mut self.inner, data).await
    }
}

impl<W> fmt::Debug for SealedWriter<W> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SealedWriter")
            .field("index", &self.index())
            .finish_non_exhaustive()
    }
}

impl<W: AsyncWrite + Unpin> AsyncWrite for SealedWriter<W> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        this.state.poll_write(Pin::new(&mut this.inner), cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        this.state.poll_flush(Pin::new(&mut this.inner), cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        this.state.poll_shutdown(Pin::new(&mut this.inner), cx)
    }
}
