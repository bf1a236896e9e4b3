//! Frames over async byte streams, for the session exchange that precedes the engine.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{Buf, Bytes, BytesMut};
use fastcp_proto::{Decoder, Frame, encode};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};

use crate::Error;

/// Reads whole frames from a stream, keeping what it read past the last frame.
pub(crate) struct FrameReader<S> {
    pub(crate) stream: S,
    buf: BytesMut,
    decoder: Decoder,
}

impl<S: AsyncRead + Unpin> FrameReader<S> {
    pub(crate) fn new(stream: S, max_frame: u32) -> Self {
        FrameReader {
            stream,
            buf: BytesMut::with_capacity(8192),
            decoder: Decoder::new(max_frame),
        }
    }

    /// Reads more bytes; `Ok(false)` at end of stream.
    pub(crate) async fn fill(&mut self) -> io::Result<bool> {
        if self.buf.capacity() - self.buf.len() < 4096 {
            self.buf.reserve(8192);
        }
        Ok(self.stream.read_buf(&mut self.buf).await? > 0)
    }

    /// The bytes read so far and not yet decoded.
    pub(crate) fn buffer(&mut self) -> &mut BytesMut {
        &mut self.buf
    }

    /// The next frame, or an error naming `what` when the stream ends first.
    pub(crate) async fn next(&mut self, what: &str) -> Result<Frame, Error> {
        loop {
            if let Some(frame) = self
                .decoder
                .decode(&mut self.buf)
                .map_err(Error::Protocol)?
            {
                return Ok(frame);
            }
            if !self.fill().await? {
                return Err(Error::ConnectionClosed(format!(
                    "the peer closed the connection while {what}"
                )));
            }
        }
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> FrameReader<S> {
    /// Writes frames already encoded, and flushes them.
    pub(crate) async fn send_bytes(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.stream.write_all(bytes).await?;
        self.stream.flush().await
    }

    /// Writes one frame and flushes it.
    pub(crate) async fn send(&mut self, frame: &Frame) -> io::Result<()> {
        write_frame(&mut self.stream, frame).await
    }

    /// Gives the stream back, with anything read past the last frame still in front of it.
    pub(crate) fn into_stream(self) -> Prefixed<S> {
        Prefixed {
            prefix: self.buf.freeze(),
            inner: self.stream,
        }
    }
}

/// Writes one frame and flushes it.
pub(crate) async fn write_frame<W: AsyncWrite + Unpin>(w: &mut W, frame: &Frame) -> io::Result<()> {
    let mut buf = BytesMut::new();
    encode(frame, &mut buf);
    w.write_all(&buf).await?;
    w.flush().await
}

/// A stream with some bytes already read from it put back in front.
#[derive(Debug)]
pub struct Prefixed<S> {
    prefix: Bytes,
    inner: S,
}

impl<S> Prefixed<S> {
    /// `inner` with `prefix` read from it put back in front.
    pub(crate) fn new(prefix: Bytes, inner: S) -> Prefixed<S> {
        Prefixed { prefix, inner }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Prefixed<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if !self.prefix.is_empty() {
            let n = self.prefix.len().min(buf.remaining());
            buf.put_slice(&self.prefix[..n]);
            self.prefix.advance(n);
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Prefixed<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}
