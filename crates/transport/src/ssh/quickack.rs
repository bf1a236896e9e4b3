//! A login's small messages without delayed acknowledgements.
//!
//! OpenSSH's sshd sends some of a login's messages back to back (after authentication, a
//! `hostkeys-00@openssh.com` request and then the answer to the channel the client opened)
//! without `TCP_NODELAY`, so Nagle's algorithm holds the second until the first is
//! acknowledged. The client has nothing to send in between, so its kernel delays that
//! acknowledgement: about 40 ms on Linux, on every login (OpenSSH's own client waits too).
//! [`QuickAck`] acknowledges at once what it reads, for a login's first reads, on a direct
//! TCP connection (a ProxyCommand's pipes or a ProxyJump's channel have no socket here).

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

/// Reads after which acknowledgements are left to the kernel again: russh reads a message
/// in two, and a login takes about 30 reads, more for each key an agent offers; then data
/// flows both ways.
const QUICK_READS: u32 = 128;

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
    use rustix::net::sockopt::{set_tcp_quickack, tcp_quickack};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    #[tokio::test]
    async fn a_login_acknowledges_what_it_reads_at_once() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let connect = TcpStream::connect(listener.local_addr().unwrap());
        let (client, accepted) = tokio::join!(connect, listener.accept());
        let (client, mut server) = (client.unwrap(), accepted.unwrap().0);
        let mut client = QuickAck::new(client);
        let mut byte = [0u8; 1];
        for i in 1..=3 {
            // Delayed acknowledgements, as after messages back and forth.
            set_tcp_quickack(&client.tcp, false).unwrap();
            server.write_all(b"m").await.unwrap();
            client.read_exact(&mut byte).await.unwrap();
            assert!(
                tcp_quickack(&client.tcp).unwrap(),
                "read {i} acknowledged at once"
            );
            assert_eq!(client.reads_left, QUICK_READS - i);
        }
        // Once the login is over, reads leave the kernel to decide.
        client.reads_left = 1;
        server.write_all(b"mm").await.unwrap();
        client.read_exact(&mut byte).await.unwrap();
        client.read_exact(&mut byte).await.unwrap();
        assert_eq!(client.reads_left, 0);
    }
}
