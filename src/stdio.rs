//! The server's stdin and stdout as one async duplex stream.
//!
//! Under sshd, `fastcp server`'s stdin and stdout are pipes or a socket. tokio's own stdio
//! hands every write to a blocking thread, which is slow for bulk data, so where they are
//! pipes or sockets we drive duplicates of them with non-blocking I/O on the reactor, and fall
//! back to tokio's stdio otherwise (a regular file on stdin, say).

use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::pin::Pin;
use std::task::{Context, Poll};

use rustix::fs::FileType;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::UnixStream;
use tokio::net::unix::pipe;

type Reader = Box<dyn AsyncRead + Send + Unpin>;
type Writer = Box<dyn AsyncWrite + Send + Unpin>;

/// This process's stdin (read half) and stdout (write half).
pub struct Stdio(tokio::io::Join<Reader, Writer>);

impl Stdio {
    /// Takes over stdin and stdout. Call it once, inside a tokio runtime.
    pub fn new() -> Stdio {
        let read =
            reader(io::stdin().as_fd()).unwrap_or_else(|_| Box::new(tokio::io::stdin()) as Reader);
        let write = writer(io::stdout().as_fd())
            .unwrap_or_else(|_| Box::new(tokio::io::stdout()) as Writer);
        Stdio(tokio::io::join(read, write))
    }
}

impl Default for Stdio {
    fn default() -> Self {
        Stdio::new()
    }
}

fn duplicate(fd: BorrowedFd<'_>) -> io::Result<(OwnedFd, FileType)> {
    let kind = FileType::from_raw_mode(rustix::fs::fstat(fd)?.st_mode);
    Ok((fd.try_clone_to_owned()?, kind))
}

fn reader(fd: BorrowedFd<'_>) -> io::Result<Reader> {
    match duplicate(fd)? {
        (fd, FileType::Fifo) => Ok(Box::new(pipe::Receiver::from_owned_fd(fd)?)),
        (fd, FileType::Socket) => Ok(Box::new(socket(fd)?)),
        _ => Err(io::ErrorKind::Unsupported.into()),
    }
}

fn writer(fd: BorrowedFd<'_>) -> io::Result<Writer> {
    match duplicate(fd)? {
        (fd, FileType::Fifo) => Ok(Box::new(pipe::Sender::from_owned_fd(fd)?)),
        (fd, FileType::Socket) => Ok(Box::new(socket(fd)?)),
        _ => Err(io::ErrorKind::Unsupported.into()),
    }
}

fn socket(fd: OwnedFd) -> io::Result<UnixStream> {
    let std = std::os::unix::net::UnixStream::from(fd);
    std.set_nonblocking(true)?;
    UnixStream::from_std(std)
}

impl AsyncRead for Stdio {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_read(cx, buf)
    }
}

impl AsyncWrite for Stdio {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(cx, data)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_shutdown(cx)
    }
}
