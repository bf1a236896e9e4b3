//! A login's small messages without delayed acknowledgements.
//!
//! OpenSSH's sshd sends some of a login's messages back to back (after authentication, a
//! `hostkeys-00@openssh.com` request and then the answer to the channel the client opened)
//! without `TCP_NODELAY`, so Nagle's algorithm holds the second until the first is
//! acknowledged. The client has nothing to send in between, so its kernel delays that
//! acknowledgement: about 40 ms on Linux, on every login (OpenSSH's own client waits too).
//! [`QuickAck`] acknowledges at once what it reads, for a login's first reads.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

/// Reads after which acknowledgements are left to the kernel again: a login is done in far
/// fewer, and then data flows both ways.
const QUICK_READS: u32 = 64;

/// A TCP connection that acknowledges what it reads at once (`TCP_QUICKACK`), for its
/// first [`QUICK_READS`] reads.
pub(super) struct QuickAck {
    tcp: TcpStream,
    reads_left: u32,
}

impl QuickAck {
    pub(super) fn new(tcp: TcpStream) -> QuickAck {
        QuickAck {
            tcp,
            reads_left: QUICK_READS,
        }
    }
}

impl AsyncRead for QuickAck {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.tcp).poll_read(cx, buf);
        if self.reads_left > 0
            && matches!(polled, Poll::Ready(Ok(())))
            && buf.filled().len() > before
        {
            self.reads_left -= 1;
            // Best effort: the acknowledgement is only sooner.
            let _ = rustix::net::sockopt::set_tcp_quickack(&self.tcp, true);
        }
        polled
    }
}

impl AsyncWrite for QuickAck {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.tcp).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.tcp).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.tcp).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.tcp).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.tcp.is_write_vectored()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    /// Small messages back and forth, as in a login; whether `client`'s kernel then
    /// acknowledges at once (not in its delayed, "ping-pong" mode).
    async fn quick_after_exchanges<S: AsyncRead + AsyncWrite + Unpin>(
        client: &mut S,
        server: &mut TcpStream,
        tcp: impl Fn(&S) -> &TcpStream,
    ) -> bool {
        let mut byte = [0u8; 1];
        for _ in 0..8 {
            client.write_all(b"q").await.unwrap();
            server.read_exact(&mut byte).await.unwrap();
            server.write_all(b"a").await.unwrap();
            client.read_exact(&mut byte).await.unwrap();
        }
        rustix::net::sockopt::tcp_quickack(tcp(client)).unwrap()
    }

    async fn pair() -> (TcpStream, TcpStream) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let connect = TcpStream::connect(listener.local_addr().unwrap());
        let (client, accepted) = tokio::join!(connect, listener.accept());
        (client.unwrap(), accepted.unwrap().0)
    }

    #[tokio::test]
    async fn a_login_acknowledges_what_it_reads_at_once() {
        // The kernel alone delays acknowledgements once messages go back and forth.
        let (mut plain, mut server) = pair().await;
        let quick = quick_after_exchanges(&mut plain, &mut server, |s| s).await;
        assert!(
            !quick,
            "this kernel never delays acknowledgements: nothing to test"
        );

        let (client, mut server) = pair().await;
        let mut client = QuickAck::new(client);
        let quick = quick_after_exchanges(&mut client, &mut server, |s| &s.tcp).await;
        assert!(quick, "a login's reads acknowledge at once");

        // Once the login is over, the kernel decides again.
        client.reads_left = 0;
        let quick = quick_after_exchanges(&mut client, &mut server, |s| &s.tcp).await;
        assert!(!quick);
    }
}
