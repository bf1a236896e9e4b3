//! fastcp-transport: duplex byte streams to a peer running `fastcp server`.
//!
//! The crate knows nothing about files. It reaches a peer, starts the fixed remote command
//! `fastcp server` (its stdio is the *control stream*), and opens more streams to a
//! rendezvous the server announces (a unix socket or a TCP port on the peer).
//!
//! - [`Transport`]: the small trait the engine uses.
//! - [`SshSession`]: the built-in SSH client (russh). Reads ssh_config ([`SshOptions`],
//!   [`HostConfig`]), checks known_hosts, authenticates with ssh-agent then identity
//!   files, and multiplexes N channels over one connection; [`SshSession::reconnect`] adds
//!   connections, each served by its own sshd process. Tuned by [`SshClientConfig`].
//! - [`SshProgram`]: runs the system `ssh` instead (`--ssh-program ssh`): one SSH stream,
//!   and [`SshProgram::direct_address`] for data streams of their own (the TCP transport),
//!   or [`SshProgram::forward_to_loopback`] (`ssh -W 127.0.0.1:PORT`) for each one ssh
//!   forwards.
//! - [`AnyTransport`]: picks one of the two from [`SshOptions::ssh_program`].
//!
//! ```no_run
//! use fastcp_transport::{AnyTransport, Rendezvous, SshOptions, Transport};
//! use tokio::io::AsyncWriteExt;
//!
//! # async fn demo() -> Result<(), fastcp_transport::Error> {
//! let options = SshOptions::default();
//! let peer = AnyTransport::connect("backup@nas", &options).await?;
//! let mut server = peer.start_server().await?;
//! server.stderr.forward_to_stderr();
//! server.stream.write_all(b"hello").await.map_err(|e| fastcp_transport::Error::Io {
//!     context: "write".into(),
//!     source: e,
//! })?;
//! // ...the server answers with its rendezvous; then, if the transport allows it:
//! if peer.supports_extra_streams() {
//!     let _data = peer.open_stream(&Rendezvous::UnixSocket("/tmp/x/s".into())).await?;
//! }
//! let status = server.exit.wait().await?;
//! assert!(status.success());
//! # Ok(()) }
//! ```

use std::any::Any;
use std::future::Future;

use tokio::io::{AsyncRead, AsyncWrite};

pub mod ssh;
pub mod tcp;

pub use ssh::{
    AddressFamily, Error, ExitStatus, ExitWaiter, HostConfig, HostKeyRefusal, ProcessStream,
    Prompt, Question, QuestionKind, RemoteProcess, SshClientConfig, SshOptions, SshProgram,
    SshSession, SshStream, Stderr, StrictHostKeyChecking,
};

/// A duplex byte stream: what every transport hands out.
///
/// Every `AsyncRead + AsyncWrite + Send + Unpin + 'static` type is one.
pub trait Duplex: AsyncRead + AsyncWrite + Send + Unpin + 'static {
    /// The stream as [`Any`], to tell its concrete type (see [`downcast`]).
    fn as_any(&self) -> &dyn Any;

    /// The boxed stream as [`Any`] (see [`downcast`]).
    fn into_any(self: Box<Self>) -> Box<dyn Any + Send>;
}

impl<T: AsyncRead + AsyncWrite + Send + Unpin + 'static> Duplex for T {
    fn as_any(&self) -> &dyn Any {
        self
    }

    fn into_any(self: Box<Self>) -> Box<dyn Any + Send> {
        self
    }
}

/// A boxed [`Duplex`] stream.
pub type BoxStream = Box<dyn Duplex>;

/// The stream inside `stream` if it is a `T`, or `stream` back unchanged.
///
/// A program that got its streams as [`BoxStream`]s can take a [`tcp::SealedStream`] back out
/// to use what only it offers, such as [`tcp::SealedReader::read_record`].
///
/// ```
/// use fastcp_transport::{BoxStream, downcast};
/// use tokio::io::DuplexStream;
///
/// let (a, _b) = tokio::io::duplex(64);
/// let boxed: BoxStream = Box::new(a);
/// let Err(boxed) = downcast::<tokio::net::TcpStream>(boxed) else {
///     panic!("not a TCP stream")
/// };
/// let Ok(_a) = downcast::<DuplexStream>(boxed) else {
///     panic!("a duplex pipe")
/// };
/// ```
pub fn downcast<T: Duplex>(stream: BoxStream) -> Result<T, BoxStream> {
    if (*stream).as_any().is::<T>() {
        let any = <dyn Duplex>::into_any(stream);
        Ok(*any.downcast::<T>().expect("the type was just checked"))
    } else {
        Err(stream)
    }
}

/// Where extra streams meet the server on the peer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Rendezvous {
    /// A unix socket path on the peer (in a private 0700 directory).
    UnixSocket(String),
    /// A TCP port on the peer's loopback (127.0.0.1).
    TcpPort(u16),
    /// The server takes its extra streams from the program that runs it: the transport
    /// delivers each stream there itself (the `fastcp` crate's `server::StreamInbox`), as
    /// an embedder's own transport does. SSH cannot.
    Caller,
}

/// A way to talk to `fastcp server` on a peer: start it and get its control stream, then
/// open more data streams to where it waits for them.
///
/// SSH implements it ([`SshSession`], [`SshProgram`], [`AnyTransport`]); so can anything
/// else that reaches a server: a caller's own SSH session, a QUIC connection, an in-memory
/// pair for tests. [`RemoteProcess::from_stream`] makes the control stream of a server that
/// has no stderr or exit status of its own. The `fastcp` crate's `run_session` runs a copy
/// over any transport; its docs have a whole copy over `tokio::io::duplex`.
pub trait Transport: Send + Sync {
    /// Starts `fastcp server` (or `--remote-path`'s program, with the fixed argument
    /// `server`) and returns its control stream, stderr and exit status.
    fn start_server(&self) -> impl Future<Output = Result<RemoteProcess, Error>> + Send;

    /// Opens one more stream to `rendezvous` on the peer. Fails with [`Error::SingleStream`]
    /// when [`supports_extra_streams`] is false, or when this transport cannot reach that kind
    /// of rendezvous (the system ssh reaches TCP ports only).
    ///
    /// [`supports_extra_streams`]: Transport::supports_extra_streams
    fn open_stream(
        &self,
        rendezvous: &Rendezvous,
    ) -> impl Future<Output = Result<BoxStream, Error>> + Send;

    /// Whether [`open_stream`](Transport::open_stream) can be used.
    fn supports_extra_streams(&self) -> bool;

    /// Whether every stream this transport carries (the server's control stream and those
    /// [`open_stream`](Transport::open_stream) opens) authenticates each byte end to end,
    /// from the server's process to this one, with nothing in between that the check does
    /// not cover: then a copy over it hashes no file content on top, and only checks that
    /// every range of a file arrives once (the `fastcp` crate's `run_session`, from protocol
    /// version 9). SSH does not count: its MAC ends at sshd, and between sshd and the remote
    /// server the bytes cross a pipe; nor do a plain socket or an in-memory pipe. A
    /// transport whose own channel security ends inside the two processes (TLS or QUIC
    /// terminated in the server's process, say) may say true. Default: false.
    fn authenticates(&self) -> bool {
        false
    }

    /// Why the connection ended, when it ended because the peer stopped answering (SSH
    /// keepalives unanswered: [`Error::StoppedAnswering`]): a stream that closed then was
    /// closed by this side, and the stall is the error to report. Default: `None`.
    fn stopped_answering(&self) -> Option<Error> {
        None
    }
}

/// A shared transport, as an embedder keeps one for several copies.
impl<T: Transport> Transport for std::sync::Arc<T> {
    async fn start_server(&self) -> Result<RemoteProcess, Error> {
        (**self).start_server().await
    }

    async fn open_stream(&self, rendezvous: &Rendezvous) -> Result<BoxStream, Error> {
        (**self).open_stream(rendezvous).await
    }

    fn supports_extra_streams(&self) -> bool {
        (**self).supports_extra_streams()
    }

    fn authenticates(&self) -> bool {
        (**self).authenticates()
    }

    fn stopped_answering(&self) -> Option<Error> {
        (**self).stopped_answering()
    }
}

impl Transport for SshSession {
    async fn start_server(&self) -> Result<RemoteProcess, Error> {
        let cmd = self.server_command()?;
        Ok(self.exec(&cmd).await?.boxed())
    }

    async fn open_stream(&self, rendezvous: &Rendezvous) -> Result<BoxStream, Error> {
        let s = match rendezvous {
            Rendezvous::UnixSocket(path) => self.open_streamlocal(path).await?,
            Rendezvous::TcpPort(port) => self.open_direct_tcpip("127.0.0.1", *port).await?,
            Rendezvous::Caller => {
                return Err(Error::SingleStream("an SSH session"));
            }
        };
        Ok(Box::new(s))
    }

    fn supports_extra_streams(&self) -> bool {
        true
    }

    fn stopped_answering(&self) -> Option<Error> {
        SshSession::stopped_answering(self)
    }
}

impl Transport for SshProgram {
    async fn start_server(&self) -> Result<RemoteProcess, Error> {
        Ok(self.start().await?.boxed())
    }

    /// Only [`Rendezvous::TcpPort`]: `ssh -W` forwards no unix socket. What ssh says goes to
    /// this process's stderr.
    async fn open_stream(&self, rendezvous: &Rendezvous) -> Result<BoxStream, Error> {
        match rendezvous {
            Rendezvous::TcpPort(port) => {
                let quiet = self.has_master() && !self.streams_through_master();
                let process = self.forward_to_loopback(*port)?;
                // A try on a connection of its own may fail to log in without a prompt, and
                // is then made again through the master: keep its complaints quiet.
                if quiet {
                    let mut stderr = process.stderr;
                    tokio::spawn(async move { while stderr.recv().await.is_some() {} });
                } else {
                    drop(process.stderr.forward_to_stderr());
                }
                Ok(Box::new(process.stream))
            }
            Rendezvous::UnixSocket(_) => Err(Error::SingleStream(
                "the system ssh (it forwards TCP ports, not unix sockets)",
            )),
            Rendezvous::Caller => Err(Error::SingleStream("the system ssh")),
        }
    }

    fn supports_extra_streams(&self) -> bool {
        true
    }
}

/// The built-in client, or the system ssh program when [`SshOptions::ssh_program`] is set.
#[derive(Debug)]
pub enum AnyTransport {
    /// Built-in client.
    Builtin(SshSession),
    /// System OpenSSH client.
    Program(SshProgram),
}

impl AnyTransport {
    /// Reaches `destination` (`[user@]host`) as `options` say: with the system ssh when
    /// [`SshOptions::ssh_program`] is set, else with the built-in client.
    pub async fn connect(destination: &str, options: &SshOptions) -> Result<Self, Error> {
        Ok(match options.ssh_program {
            Some(_) => AnyTransport::Program(SshProgram::connect(destination, options).await?),
            None => AnyTransport::Builtin(SshSession::connect(destination, options).await?),
        })
    }

    /// Warnings to show the user, such as a host key just recorded in known_hosts (the
    /// system ssh program prints its own).
    pub fn warnings(&self) -> &[String] {
        match self {
            AnyTransport::Builtin(s) => s.warnings(),
            AnyTransport::Program(_) => &[],
        }
    }

    /// Runs the fixed `command` through the peer's login shell (see [`SshSession::exec`] and
    /// [`SshProgram::exec`]).
    pub async fn exec(&self, command: &str) -> Result<RemoteProcess, Error> {
        Ok(match self {
            AnyTransport::Builtin(s) => s.exec(command).await?.boxed(),
            AnyTransport::Program(p) => p.exec(command)?.boxed(),
        })
    }

    /// The program [`start_server`](Transport::start_server) runs on the peer (`None`:
    /// `fastcp` from its PATH).
    pub fn remote_path(&self) -> Option<String> {
        match self {
            AnyTransport::Builtin(s) => s.remote_path(),
            AnyTransport::Program(p) => p.remote_path(),
        }
    }

    /// Runs `path` on the peer from now on, as after a self-deploy.
    pub fn set_remote_path(&self, path: Option<String>) {
        match self {
            AnyTransport::Builtin(s) => s.set_remote_path(path),
            AnyTransport::Program(p) => p.set_remote_path(path),
        }
    }

    /// Runs `command` in place of `fastcp server` when no remote path is named: a fixed
    /// command line that the caller built, which must put no user data in it (fastcp's own
    /// tries the remote PATH, then a binary self-deploy cached there).
    pub fn set_launcher(&self, command: Option<String>) {
        match self {
            AnyTransport::Builtin(s) => s.set_launcher(command),
            AnyTransport::Program(p) => p.set_launcher(command),
        }
    }
}

impl Transport for AnyTransport {
    async fn start_server(&self) -> Result<RemoteProcess, Error> {
        match self {
            AnyTransport::Builtin(s) => s.start_server().await,
            AnyTransport::Program(p) => p.start_server().await,
        }
    }

    async fn open_stream(&self, rendezvous: &Rendezvous) -> Result<BoxStream, Error> {
        match self {
            AnyTransport::Builtin(s) => Transport::open_stream(s, rendezvous).await,
            AnyTransport::Program(p) => Transport::open_stream(p, rendezvous).await,
        }
    }

    fn supports_extra_streams(&self) -> bool {
        match self {
            AnyTransport::Builtin(s) => s.supports_extra_streams(),
            AnyTransport::Program(p) => p.supports_extra_streams(),
        }
    }

    fn authenticates(&self) -> bool {
        match self {
            AnyTransport::Builtin(s) => s.authenticates(),
            AnyTransport::Program(p) => p.authenticates(),
        }
    }

    fn stopped_answering(&self) -> Option<Error> {
        match self {
            AnyTransport::Builtin(s) => Transport::stopped_answering(s),
            AnyTransport::Program(p) => p.stopped_answering(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn assert_send_sync<T: Send + Sync>() {}
    fn assert_send<T: Send>() {}

    #[test]
    fn public_types_are_thread_safe() {
        assert_send_sync::<SshSession>();
        assert_send_sync::<SshProgram>();
        assert_send_sync::<Error>();
        assert_send::<SshStream>();
        assert_send::<RemoteProcess>();
    }
}
