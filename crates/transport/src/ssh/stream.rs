//! [`SshStream`]: one SSH channel as a tokio duplex byte stream.
//!
//! Why not russh's `Channel::into_stream()`: its reader drops stderr and exit-status
//! messages, and dropping it sends CLOSE at once, which loses the exit status of a command
//! that is still running. Here the reader only takes channel data (stderr and exit status
//! reach the caller through the connection's handler, see [`RemoteProcess`]), and dropping
//! the stream sends EOF (and CLOSE for forwarded sockets only).
//!
//! Flow control: writes wait for the peer's window, as russh's writer does; each write of
//! up to the peer's maximum packet size becomes one SSH packet, so write large buffers.
//! Reading: russh refills our receive window as soon as data arrives and queues up to
//! `channel_buffer_size` packets per channel; when a channel's queue is full the whole
//! connection waits. Keep reading every stream you open, or drop it.
//!
//! [`RemoteProcess`]: crate::RemoteProcess

use std::fmt;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::Bytes;
use russh::client::Msg;
use russh::{ChannelMsg, ChannelReadHalf, ChannelWriteHalf};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

type WaitFuture = Pin<Box<dyn Future<Output = (ChannelReadHalf, Option<ChannelMsg>)> + Send>>;

enum ReadState {
    Idle(ChannelReadHalf),
    Waiting(WaitFuture),
    Eof,
}

/// One SSH channel (exec, direct-streamlocal or direct-tcpip) as `AsyncRead + AsyncWrite`.
///
/// `poll_shutdown` sends EOF to the peer. Dropping the stream sends EOF if not sent yet; for
/// forwarded sockets it also closes the channel.
pub struct SshStream {
    read: ReadState,
    pending: Bytes,
    writer: Pin<Box<dyn AsyncWrite + Send + Sync>>,
    control: Option<ChannelWriteHalf<Msg>>,
    eof_sent: bool,
    close_on_drop: bool,
}

impl fmt::Debug for SshStream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SshStream")
            .field("channel", &self.control.as_ref().map(|c| c.id()))
            .field("eof_sent", &self.eof_sent)
            .finish()
    }
}

impl SshStream {
    pub(crate) fn new(channel: russh::Channel<Msg>, close_on_drop: bool) -> SshStream {
        let (read, write) = channel.split();
        SshStream {
            read: ReadState::Idle(read),
            pending: Bytes::new(),
            writer: Box::pin(write.make_writer()),
            control: Some(write),
            eof_sent: false,
            close_on_drop,
        }
    }

    /// Puts data that arrived before the stream existed in front of it.
    pub(crate) fn prepend(&mut self, early: Vec<Bytes>) {
        if early.is_empty() {
            return;
        }
        let mut all = early.concat();
        all.extend_from_slice(&self.pending);
        self.pending = Bytes::from(all);
    }
}

impl AsyncRead for SshStream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        loop {
            if !this.pending.is_empty() {
                let n = this.pending.len().min(buf.remaining());
                buf.put_slice(&this.pending.split_to(n));
                return Poll::Ready(Ok(()));
            }
            let fut = match std::mem::replace(&mut this.read, ReadState::Eof) {
                ReadState::Eof => return Poll::Ready(Ok(())),
                ReadState::Idle(mut half) => Box::pin(async move {
                    let msg = half.wait().await;
                    (half, msg)
                }) as WaitFuture,
                ReadState::Waiting(f) => f,
            };
            let mut fut = fut;
            match fut.as_mut().poll(cx) {
                Poll::Pending => {
                    this.read = ReadState::Waiting(fut);
                    return Poll::Pending;
                }
                Poll::Ready((half, msg)) => match msg {
                    Some(ChannelMsg::Data { data }) => {
                        this.pending = data;
                        this.read = ReadState::Idle(half);
                    }
                    // EOF, CLOSE, or the channel is gone: end of stream. Dropping the read
                    // half lets the session discard anything else for this channel.
                    Some(ChannelMsg::Eof) | Some(ChannelMsg::Close) | None => {
                        this.read = ReadState::Eof;
                    }
                    // Stderr, exit status, window adjustments...: handled elsewhere.
                    Some(_) => this.read = ReadState::Idle(half),
                },
            }
        }
    }
}

impl AsyncWrite for SshStream {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        if buf.is_empty() {
            return Poll::Ready(Ok(0));
        }
        if self.eof_sent {
            return Poll::Ready(Err(io::Error::new(
                io::ErrorKind::BrokenPipe,
                "write after shutdown",
            )));
        }
        self.writer.as_mut().poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.writer.as_mut().poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if self.eof_sent {
            return Poll::Ready(Ok(()));
        }
        ready!(self.writer.as_mut().poll_shutdown(cx))?;
        self.eof_sent = true;
        Poll::Ready(Ok(()))
    }
}

impl Drop for SshStream {
    fn drop(&mut self) {
        let Some(control) = self.control.take() else {
            return;
        };
        let (eof, close) = (!self.eof_sent, self.close_on_drop);
        if !eof && !close {
            return;
        }
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move {
                if eof {
                    let _ = control.eof().await;
                }
                if close {
                    let _ = control.close().await;
                }
            });
        }
    }
}
