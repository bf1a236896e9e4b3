//! Compression of the data streams (`-C`): zstd, agreed in the handshake.
//!
//! Each side lists the compression ids it accepts in its `Hello`; the client asks for one in
//! its `Request` only if the server listed it. Once the session is set up, both ends wrap every
//! data stream with [`zstd`]: what a side writes is compressed (and flushed whenever the engine
//! flushes, so nothing waits in the compressor), what it reads is decompressed. For sealed TCP
//! streams compression sits inside the encryption, as in SSH.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> std::io::Result<()> {
//! use tokio::io::{AsyncReadExt, AsyncWriteExt};
//!
//! let (a, b) = tokio::io::duplex(1 << 16);
//! let (mut a, mut b) = (fastcp::compress::zstd(a), fastcp::compress::zstd(b));
//! a.write_all(&[b'x'; 100_000]).await?;
//! a.flush().await?;
//! let mut got = vec![0; 100_000];
//! b.read_exact(&mut got).await?;
//! assert!(got.iter().all(|&c| c == b'x'));
//! # Ok(()) }
//! ```

use async_compression::Level;
use async_compression::tokio::bufread::ZstdDecoder;
use async_compression::tokio::write::ZstdEncoder;
use async_compression::zstd::DParameter;
use tokio::io::{AsyncRead, AsyncWrite, BufReader};

use crate::BoxStream;

/// Compression id: none.
pub const NONE: u8 = 0;
/// Compression id: zstd.
pub const ZSTD: u8 = 1;
/// The compression ids this build accepts, in its order of preference.
pub const SUPPORTED: &[u8] = &[NONE, ZSTD];

/// The largest zstd window accepted from a peer (2^23 = 8 MiB), which bounds the memory a
/// hostile peer can make each stream's decompressor allocate.
const WINDOW_LOG_MAX: u32 = 23;

/// A compression the data streams used (see [`Outcome::compression`](crate::Outcome::compression)).
/// `Display` and [`as_str`](Self::as_str) give its name, as the `fastcp` command's `--json`
/// output writes it.
///
/// ```
/// use fastcp::compress::Compression;
///
/// assert_eq!(Compression::Zstd.as_str(), "zstd");
/// assert_eq!(Compression::Zstd.to_string(), "zstd");
/// ```
#[non_exhaustive]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Compression {
    /// zstd, level 1 ("zstd").
    Zstd,
}

impl Compression {
    /// Its name: "zstd".
    pub fn as_str(self) -> &'static str {
        match self {
            Compression::Zstd => "zstd",
        }
    }
}

impl std::fmt::Display for Compression {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The name of a compression id, for messages.
pub fn name(id: u8) -> &'static str {
    match id {
        NONE => "none",
        ZSTD => "zstd",
        _ => "unknown",
    }
}

/// Wraps a duplex stream: writes are zstd-compressed (level 1), reads are decompressed.
pub fn zstd<S>(stream: S) -> BoxStream
where
    S: AsyncRead + AsyncWrite + Send + Unpin + 'static,
{
    let reading = ZstdDecoder::with_params(
        BufReader::with_capacity(256 * 1024, stream),
        &[DParameter::window_log_max(WINDOW_LOG_MAX)],
    );
    Box::new(ZstdEncoder::with_quality(reading, Level::Fastest))
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test]
    async fn both_directions_and_flushes() {
        let (a, b) = tokio::io::duplex(4096);
        let (mut a, mut b) = (zstd(a), zstd(b));
        // A small message must arrive after a flush, without closing the stream.
        a.write_all(b"ping").await.unwrap();
        a.flush().await.unwrap();
        let mut got = [0; 4];
        b.read_exact(&mut got).await.unwrap();
        assert_eq!(&got, b"ping");
        b.write_all(b"pong").await.unwrap();
        b.flush().await.unwrap();
        a.read_exact(&mut got).await.unwrap();
        assert_eq!(&got, b"pong");
        // Bulk data, then a clean end of stream.
        let data: Vec<u8> = (0..1_000_000u32).map(|i| (i % 251) as u8).collect();
        let writer = tokio::spawn(async move {
            a.write_all(&data).await.unwrap();
            a.shutdown().await.unwrap();
            data
        });
        let mut got = Vec::new();
        b.read_to_end(&mut got).await.unwrap();
        assert_eq!(got, writer.await.unwrap());
    }

    #[tokio::test]
    async fn garbage_is_an_error() {
        let (mut a, b) = tokio::io::duplex(4096);
        let mut b = zstd(b);
        a.write_all(b"this is not a zstd frame").await.unwrap();
        drop(a);
        let mut got = Vec::new();
        assert!(b.read_to_end(&mut got).await.is_err());
    }
}
