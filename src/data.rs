//! Receiving over a session's data streams.
//!
//! [`receive`] is [`fastcp_stream::receive`] for the streams a session hands out: a sealed TCP
//! stream ([`SealedStream`]) has its records read straight into the engine's buffers and
//! opened there ([`SealedReader::read_record`]), which saves copying every byte it carries
//! once; any other stream is read as bytes.

use std::io;
use std::path::Path;
use std::sync::Arc;

use bytes::BytesMut;
use fastcp_stream::{ByteReader, Error, Progress, ReadInto, ReceiveConfig, Report};
use fastcp_transport::tcp::{SealedReader, SealedStream};
use fastcp_transport::{BoxStream, downcast};
use tokio::io::{AsyncWrite, ReadHalf};
use tokio::net::TcpStream;
use tokio::net::tcp::OwnedReadHalf;

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
                let (r, w) = sealed.into_split();
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

/// One data stream's read half.
enum DataReader {
    Sealed(Box<SealedReader<OwnedReadHalf>>),
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
