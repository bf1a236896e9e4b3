//! Sending and receiving over a session's data streams.
//!
//! [`send`] and [`receive`] are [`fastcp_stream::send`] and [`fastcp_stream::receive`] for
//! the streams a session hands out. On a sealed TCP stream ([`SealedStream`]) the sender seals
//! file chunks where they lie ([`SealedWriter::write_sealed`]) and the receiver reads each
//! record straight into the engine's buffers and opens it there
//! ([`SealedReader::read_record`]): each side copies every byte once less. Any other stream
//! is written and read as bytes.
//!
//! Both count the bytes that cross each stream in the [`Progress`]
//! ([`wire_bytes`](fastcp_stream::Snapshot::wire_bytes)) as they go, so that an idle limit
//! sees a slow link moving: a sealed TCP stream's at its socket; any other stream's if its
//! caller wrapped it with [`counted`].

use std::io;
use std::path::Path;
use std::sync::Arc;

use std::path::PathBuf;

use bytes::{Bytes, BytesMut};
use fastcp_stream::{
    ByteReader, ByteWriter, Counted, Error, Progress, ReadInto, ReceiveConfig, Report, SendConfig,
    WriteFrom,
};
use fastcp_transport::tcp::{SealedReader, SealedStream, SealedWriter};
use fastcp_transport::{BoxStream, downcast};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, ReadHalf, WriteHalf};
use tokio::net::TcpStream;
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};

/// Parts at least this big (file chunks) are sealed where they lie; smaller ones are gathered
/// into the stream's record buffer.
const SEAL_IN_PLACE: usize = 256 << 10;

/// Sends `sources` over `streams`, as [`fastcp_stream::send`] does, sealing the file chunks
/// it sends on sealed TCP streams in place.
pub async fn send(
    sources: &[PathBuf],
    streams: Vec<BoxStream>,
    config: &SendConfig,
    progress: Arc<Progress>,
) -> Result<Report, Error> {
    let mut readers: Vec<Box<dyn AsyncRead + Send + Unpin>> = Vec::with_capacity(streams.len());
    let mut writers = Vec::with_capacity(streams.len());
    for stream in streams {
        match downcast::<SealedStream<TcpStream>>(stream) {
            Ok(sealed) => {
                let (r, w) = split_counted(sealed, &progress);
                readers.push(Box::new(r));
                writers.push(DataWriter::Sealed(Box::new(w)));
            }
            Err(stream) => {
                let (r, w) = tokio::io::split(stream);
                readers.push(Box::new(r));
                writers.push(DataWriter::Bytes(ByteWriter::new(w)));
            }
        }
    }
    let mut readers = readers.into_iter();
    let Some(reply_half) = readers.next() else {
        return Err(Error::InvalidArgument("no streams to send on".into()));
    };
    // The receiver writes nothing on the other streams; their read halves stay open until the
    // end.
    let _idle_reads: Vec<_> = readers.collect();
    fastcp_stream::send_to(sources, reply_half, writers, config, progress).await
}

/// Receives a tree into `dest` from `streams`, as [`fastcp_stream::receive`] does, reading
/// the sealed TCP streams among them record by record into the engine's buffers.
///
/// ```
/// use std::sync::Arc;
///
/// use fastcp::{BoxStream, Progress};
/// use fastcp::stream::{ReceiveConfig, SendConfig};
///
/// # #[tokio::main]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let dir = tempfile::tempdir()?;
/// std::fs::write(dir.path().join("a.txt"), b"hello")?;
/// let (ours, theirs) = tokio::io::duplex(1 << 16);
/// let (sources, dest) = ([dir.path().join("a.txt")], dir.path().join("b.txt"));
/// let (send_config, receive_config) = (SendConfig::default(), ReceiveConfig::default());
/// let progress = Arc::new(Progress::default());
/// let (sent, received) = tokio::join!(
///     fastcp::stream::send(&sources, vec![ours], &send_config, progress.clone()),
///     fastcp::data::receive(&dest, vec![Box::new(theirs) as BoxStream], &receive_config, progress),
/// );
/// sent?;
/// received?;
/// assert_eq!(std::fs::read(dir.path().join("b.txt"))?, b"hello");
/// # Ok(())
/// # }
/// ```
pub async fn receive(
    dest: &Path,
    streams: Vec<BoxStream>,
    config: &ReceiveConfig,
    progress: Arc<Progress>,
) -> Result<Report, Error> {
    let mut readers = Vec::with_capacity(streams.len());
    let mut writers: Vec<Box<dyn AsyncWrite + Send + Unpin>> = Vec::with_capacity(streams.len());
    for stream in streams {
        match downcast::<SealedStream<TcpStream>>(stream) {
            Ok(sealed) => {
                let (r, w) = split_counted(sealed, &progress);
                readers.push(DataReader::Sealed(Box::new(r)));
                writers.push(Box::new(w));
            }
            Err(stream) => {
                let (r, w) = tokio::io::split(stream);
                readers.push(DataReader::Bytes(ByteReader(r)));
                writers.push(Box::new(w));
            }
        }
    }
    let mut writers = writers.into_iter();
    let Some(reply_half) = writers.next() else {
        return Err(Error::InvalidArgument("no streams to receive on".into()));
    };
    // Nothing is sent back on the other streams; their write halves stay open until the end.
    let _idle_writes: Vec<_> = writers.collect();
    fastcp_stream::receive_from(dest, readers, reply_half, config, progress).await
}

/// A sealed TCP stream's halves, each counting in `progress` the bytes that cross its socket.
fn split_counted(
    sealed: SealedStream<TcpStream>,
    progress: &Arc<Progress>,
) -> (SealedReader<CountedRead>, SealedWriter<CountedWrite>) {
    sealed.into_split_with(
        |r| Counted::new(r, progress.clone()),
        |w| Counted::new(w, progress.clone()),
    )
}

type CountedRead = Counted<OwnedReadHalf>;
type CountedWrite = Counted<OwnedWriteHalf>;

/// `stream`, counting in `progress` the bytes that cross the wire beneath it, for an idle
/// limit to watch. Call it on the stream as it comes off the wire, beneath any compression,
/// and say whether something will `wrap` the result before it reaches [`send`] or
/// [`receive`].
///
/// A sealed TCP stream that reaches them bare is counted at its socket by them, and keeps
/// its sealing in place, so it is left as it is unless `wrap`; then it is counted at its
/// socket here. Any other stream is wrapped in [`Counted`].
pub fn counted(stream: BoxStream, progress: &Arc<Progress>, wrap: bool) -> BoxStream {
    match downcast::<SealedStream<TcpStream>>(stream) {
        Ok(sealed) if wrap => Box::new(sealed.map_inner(|tcp| Counted::new(tcp, progress.clone()))),
        Ok(sealed) => Box::new(sealed),
        Err(stream) => Box::new(Counted::new(stream, progress.clone())),
    }
}

/// One data stream's write half.
enum DataWriter {
    Sealed(Box<SealedWriter<CountedWrite>>),
    Bytes(ByteWriter<WriteHalf<BoxStream>>),
}

impl WriteFrom for DataWriter {
    async fn write_part(&mut self, part: &mut Bytes) -> io::Result<()> {
        match self {
            DataWriter::Sealed(w) if part.len() >= SEAL_IN_PLACE => {
                match std::mem::take(part).try_into_mut() {
                    Ok(mut owned) => {
                        let written = w.write_sealed(&mut owned).await;
                        *part = owned.freeze();
                        written
                    }
                    Err(shared) => {
                        *part = shared;
                        w.write_all(part).await
                    }
                }
            }
            DataWriter::Sealed(w) => w.write_all(part).await,
            DataWriter::Bytes(w) => w.write_part(part).await,
        }
    }

    async fn flush(&mut self) -> io::Result<()> {
        match self {
            DataWriter::Sealed(w) => w.flush().await,
            DataWriter::Bytes(w) => WriteFrom::flush(w).await,
        }
    }

    async fn shutdown(&mut self) -> io::Result<()> {
        match self {
            DataWriter::Sealed(w) => w.shutdown().await,
            DataWriter::Bytes(w) => WriteFrom::shutdown(w).await,
        }
    }
}

/// One data stream's read half.
enum DataReader {
    Sealed(Box<SealedReader<CountedRead>>),
    Bytes(ByteReader<ReadHalf<BoxStream>>),
}

impl ReadInto for DataReader {
    async fn read_into(&mut self, buf: &mut BytesMut, limit: usize) -> io::Result<usize> {
        match self {
            DataReader::Sealed(r) => r.read_record(buf).await,
            DataReader::Bytes(r) => r.read_into(buf, limit).await,
        }
    }

    fn room(&self) -> usize {
        match self {
            DataReader::Sealed(r) => r.record_room(),
            DataReader::Bytes(_) => 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fastcp_crypto::{CipherSuite, Direction, KeyConfig, Provider, SessionSecret};
    use tokio::io::AsyncReadExt;

    /// A sealed stream over a loopback TCP connection, and the far end's socket.
    async fn sealed_tcp() -> (SealedStream<TcpStream>, TcpStream) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let near = TcpStream::connect(listener.local_addr().unwrap());
        let (near, far) = tokio::join!(near, listener.accept());
        let secret = SessionSecret::generate().unwrap();
        let keys = KeyConfig::new(CipherSuite::ChaCha20Poly1305, Provider::Ring);
        let sealed = SealedStream::new(
            near.unwrap(),
            &secret,
            &keys,
            Direction::ClientToServer,
            1,
            1 << 16,
        )
        .unwrap();
        (sealed, far.unwrap().0)
    }

    /// A sealed TCP stream that something will wrap (compression) is counted at its socket;
    /// one left bare stays a sealed TCP stream, for `send` and `receive` to count and seal in
    /// place.
    #[tokio::test]
    async fn counted_counts_a_wrapped_sealed_stream_at_its_socket() {
        let progress = Arc::new(Progress::default());
        let (sealed, mut far) = sealed_tcp().await;
        let mut stream = counted(Box::new(sealed), &progress, true);
        let reading = tokio::spawn(async move {
            let mut all = Vec::new();
            far.read_to_end(&mut all).await.unwrap();
            all.len()
        });
        stream.write_all(&[7u8; 300_000]).await.unwrap();
        stream.shutdown().await.unwrap();
        drop(stream);
        let on_the_wire = reading.await.unwrap() as u64;
        assert!(on_the_wire > 300_000);
        assert_eq!(progress.snapshot().wire_bytes, on_the_wire);

        let (sealed, _far) = sealed_tcp().await;
        let bare = counted(Box::new(sealed), &progress, false);
        assert!(downcast::<SealedStream<TcpStream>>(bare).is_ok());
    }
}
