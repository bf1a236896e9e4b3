//! The facade's error type.

use std::io;

/// Anything that can end a copy or a server session.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The command line or the options make no sense.
    #[error("{0}")]
    Usage(String),
    /// A local I/O error outside the engine.
    #[error(transparent)]
    Io(#[from] io::Error),
    /// The peer sent bytes that are not a valid frame.
    #[error("protocol error: {0}")]
    Protocol(#[from] fastcp_proto::DecodeError),
    /// The handshake failed.
    #[error(transparent)]
    Handshake(#[from] fastcp_proto::HandshakeError),
    /// The peer sent a frame that does not belong here.
    #[error("protocol error: expected {expected}, got {got}")]
    UnexpectedFrame {
        /// What the session expected.
        expected: &'static str,
        /// What arrived.
        got: &'static str,
    },
    /// The connection ended early.
    #[error("{0}")]
    ConnectionClosed(String),
    /// Something took too long.
    #[error("timed out {0}")]
    Timeout(String),
    /// An extra data stream failed to prove it belongs to the session.
    #[error("data stream {0} failed to authenticate; aborting the session")]
    JoinRejected(u16),
    /// The peer cannot do what was asked.
    #[error("{0}")]
    Unsupported(String),
    /// The remote fastcp is too old for what this copy asks: `what` needs protocol version
    /// `needs` there, and it speaks `speaks`. Where self-deploy may act (no
    /// [`remote_path`](crate::transport::SshOptions::remote_path), no
    /// [`no_deploy`](crate::CopyOptions::no_deploy)), a copy that meets such a remote
    /// program on the remote PATH runs this fastcp there instead, or where it cannot be
    /// uploaded (a program that embeds the library and has no `cargo xtask dist` binary for
    /// the remote) goes over SFTP (see [`crate::deploy`]); so does one that meets a fastcp
    /// with no protocol version in common
    /// ([`HandshakeError::Incompatible`](fastcp_proto::HandshakeError::Incompatible)); not
    /// a copy between two remote hosts, whose two sessions agreed on one version first.
    #[error(
        "{what} needs protocol version {needs} on the remote side, and the remote {peer} \
         speaks {speaks}: upgrade fastcp there"
    )]
    PeerTooOld {
        /// The option or rule that needs the newer version, as the user named it.
        what: String,
        /// The protocol version it needs.
        needs: u16,
        /// The remote program's software string (escaped for printing).
        peer: String,
        /// The protocol version the two sides agreed on: the remote's newest.
        speaks: u16,
    },
    /// The remote side reported a fatal error.
    #[error("remote: {0}")]
    Remote(String),

    /// The server refused the request, with the kind of its reason (its error code): a path
    /// it does not have, or one its policy does not allow (see
    /// [`server::Policy`](crate::server::Policy)).
    #[error("remote: {message}")]
    Refused {
        /// The server's error code.
        code: fastcp_proto::ErrorCode,
        /// Its message.
        message: String,
    },
    /// The remote command failed before speaking the protocol.
    #[error("{0}")]
    RemoteCommand(String),
    /// The system ssh ([`SshOptions::ssh_program`](crate::transport::SshOptions::ssh_program),
    /// or the one a configuration only it serves hands the connection to) gave up before the
    /// server spoke: it could not connect, log in, or trust the host key. Its own words, which
    /// would otherwise go to stderr; the [`kind`](Error::kind) is read from them (a refused
    /// login is [`ErrorKind::Auth`], a host key it would not trust [`ErrorKind::HostKey`]).
    #[error("ssh: {}", .0.trim_start_matches("ssh: "))]
    SystemSsh(String),
    /// The copy was cancelled ([`crate::CopyOptions::cancel`]).
    #[error("cancelled")]
    Cancelled,
    /// fastcp could not be put on a remote host that lacks it (see [`crate::deploy`]).
    #[error("self-deploy: {0}")]
    Deploy(String),
    /// The copy engine failed.
    #[error(transparent)]
    Engine(#[from] fastcp_stream::Error),
    /// The transport failed: connecting, authenticating, host keys, channels.
    #[error(transparent)]
    Transport(#[from] fastcp_transport::Error),
    /// Setting up the TCP data streams failed.
    #[error(transparent)]
    Tcp(#[from] fastcp_transport::tcp::Error),
    /// The cipher layer failed.
    #[error(transparent)]
    Crypto(#[from] fastcp_crypto::Error),
    /// One of the two hosts of a copy between two remote hosts failed, or its connection
    /// did ([`Session::relay`](crate::Session::relay)): `host` names it, and the error's
    /// [`kind`](Error::kind), [`fault`](Error::fault) and exit code are `source`'s.
    #[error("{host}: {source}")]
    Host {
        /// The host, as `[user@]host`.
        host: String,
        /// What failed there.
        source: Box<Error>,
    },
}

impl Error {
    /// This error, as it happened on `host` (see [`Error::Host`]); one that names a host
    /// already is left as it is.
    pub(crate) fn on_host(self, host: &str) -> Error {
        match self {
            Error::Host { .. } | Error::Cancelled => self,
            e => Error::Host {
                host: host.to_owned(),
                source: Box::new(e),
            },
        }
    }
}

/// Documented process exit codes.
pub mod exit {
    /// Everything was copied.
    pub const OK: u8 = 0;
    /// Some files failed, or the copy stopped on a file or disk error; what was copied is
    /// whole.
    pub const PARTIAL: u8 = 1;
    /// The command line was wrong, or the remote side cannot serve the request.
    pub const USAGE: u8 = 2;
    /// Connecting or authenticating failed, the connection was lost or stalled, or the peer
    /// broke the protocol.
    pub const CONNECTION: u8 = 3;
    /// Data failed an integrity check (a hash or an AEAD tag).
    pub const INTEGRITY: u8 = 4;
    /// Everything was copied but files that changed or vanished while they were read (as
    /// rsync's 24): run the copy again once they are stable.
    pub const SOURCE_CHANGED: u8 = 5;
    /// Everything was copied, but `--max-delete` left extras that `--delete` would have
    /// removed (as rsync's 25).
    pub const DELETE_LIMIT: u8 = 6;
    /// Stopped by SIGINT (Ctrl-C), SIGTERM or SIGHUP; nothing partial was kept (128 + 2, as
    /// shells report an interrupted command).
    pub const INTERRUPTED: u8 = 130;

    /// The exit code for a copy that ran to its end with `report`: [`OK`], [`INTEGRITY`] if
    /// any file failed its check, else [`SOURCE_CHANGED`] if every failure was a source that
    /// changed or vanished while read, else [`DELETE_LIMIT`] if the only failure was
    /// `--max-delete`'s limit, else [`PARTIAL`].
    pub fn for_report(report: &crate::stream::Report) -> u8 {
        use crate::stream::ErrorCode;
        let codes = || report.failures.iter().map(|f| f.code);
        if report.is_complete() {
            OK
        } else if codes().any(|c| c == ErrorCode::Integrity) {
            INTEGRITY
        } else if report.failure_count == report.failures.len() as u64
            && codes().all(|c| c == ErrorCode::SourceChanged)
        {
            SOURCE_CHANGED
        } else if report.failure_count == report.failures.len() as u64
            && codes().all(|c| c == ErrorCode::DeleteLimit)
        {
            DELETE_LIMIT
        } else {
            PARTIAL
        }
    }
}

impl Error {
    /// The process exit code this error maps to; see [`exit`]. It follows
    /// [`kind`](Error::kind), so that a program that reads one agrees with the other: any
    /// failure of the transport is a connection failure, whatever its cause.
    ///
    /// ```
    /// use fastcp::{Error, exit};
    ///
    /// assert_eq!(Error::Usage("no target given".into()).exit_code(), exit::USAGE);
    /// assert_eq!(Error::ConnectionClosed("cut".into()).exit_code(), exit::CONNECTION);
    /// ```
    pub fn exit_code(&self) -> u8 {
        if let Error::Host { source, .. } = self {
            return source.exit_code();
        }
        match (self, self.kind()) {
            (_, ErrorKind::Usage) => exit::USAGE,
            (_, ErrorKind::Cancelled) => exit::INTERRUPTED,
            (_, ErrorKind::Integrity) => exit::INTEGRITY,
            (Error::Transport(_) | Error::Tcp(_), _) => exit::CONNECTION,
            (
                _,
                ErrorKind::Auth
                | ErrorKind::HostKey
                | ErrorKind::Connect
                | ErrorKind::Timeout
                | ErrorKind::RemoteProgramMissing
                | ErrorKind::Protocol,
            ) => exit::CONNECTION,
            (_, ErrorKind::SourceChanged) => exit::SOURCE_CHANGED,
            _ => exit::PARTIAL,
        }
    }
}

/// What kind of failure an [`Error`] is, stable across releases: what a program that embeds
/// fastcp matches on, rather than on variants or messages.
///
/// ```
/// use fastcp::{Error, ErrorKind, Fault};
///
/// let e = Error::Usage("no target given".into());
/// assert_eq!(e.kind(), ErrorKind::Usage);
/// assert_eq!(e.fault(), Fault::User);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// The SSH server did not accept any of our credentials.
    Auth,
    /// The host key is unknown, changed, revoked or refused.
    HostKey,
    /// The host, its SSH port or the data port could not be reached, or the connection was
    /// lost.
    Connect,
    /// Something took longer than allowed, or data stopped moving (`--timeout`).
    Timeout,
    /// fastcp is not on the remote host and could not be deployed there.
    RemoteProgramMissing,
    /// A path does not exist.
    NotFound,
    /// Permission was denied.
    PermissionDenied,
    /// A disk is full.
    NoSpace,
    /// A file system is read-only.
    ReadOnly,
    /// A disk quota is exhausted.
    Quota,
    /// Data failed a check: a file's checksum or an AEAD tag.
    Integrity,
    /// The peer broke the protocol, or speaks an incompatible version.
    Protocol,
    /// The copy was cancelled.
    Cancelled,
    /// The request makes no sense (bad options or operands), or the peer cannot serve it.
    Usage,
    /// A source changed or vanished while it was read.
    SourceChanged,
    /// Any other local I/O failure.
    Io,
}

/// Whose side a failure is on, as rustls tells its errors apart: what a program reports,
/// retries or alerts on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Fault {
    /// This machine: its disks, files or configuration.
    Local,
    /// The remote host or the peer program: it refused, failed, or broke the protocol.
    Remote,
    /// The network between them: unreachable, cut, stalled, tampered with.
    Network,
    /// What was asked: options, operands, credentials, host keys to trust.
    User,
}

impl Error {
    /// The kind of failure; see [`ErrorKind`].
    pub fn kind(&self) -> ErrorKind {
        use fastcp_transport::Error as T;
        match self {
            Error::Host { source, .. } => source.kind(),
            Error::Usage(_) | Error::Unsupported(_) | Error::PeerTooOld { .. } => ErrorKind::Usage,
            Error::Cancelled => ErrorKind::Cancelled,
            Error::Io(e) => io_kind(e),
            Error::Protocol(_) | Error::UnexpectedFrame { .. } | Error::Handshake(_) => {
                ErrorKind::Protocol
            }
            Error::ConnectionClosed(_) | Error::Tcp(_) => ErrorKind::Connect,
            Error::Timeout(_) => ErrorKind::Timeout,
            Error::JoinRejected(_) => ErrorKind::Protocol,
            Error::Remote(_) => ErrorKind::Io,
            Error::Refused { code, .. } => code_kind(*code),
            Error::RemoteCommand(_) | Error::Deploy(_) => ErrorKind::RemoteProgramMissing,
            Error::SystemSsh(said) => system_ssh_kind(said),
            Error::Crypto(fastcp_crypto::Error::ProviderUnavailable(_)) => ErrorKind::Usage,
            Error::Crypto(_) => ErrorKind::Integrity,
            Error::Engine(e) => engine_kind(e),
            Error::Transport(t) => match t {
                T::Auth { .. } | T::TooManyAuthFailures { .. } => ErrorKind::Auth,
                T::HostKeyUnknown { .. } | T::HostKeyChanged { .. } | T::HostKeyRejected { .. } => {
                    ErrorKind::HostKey
                }
                T::Timeout { .. } => ErrorKind::Timeout,
                T::Config(_) | T::SingleStream(_) => ErrorKind::Usage,
                T::Io { source, .. } => io_kind(source),
                _ => ErrorKind::Connect,
            },
        }
    }

    /// Whose side the failure is on; see [`Fault`].
    pub fn fault(&self) -> Fault {
        if let Error::Host { source, .. } = self {
            return source.fault();
        }
        match (self, self.kind()) {
            (Error::PeerTooOld { .. }, _) => Fault::Remote,
            (_, ErrorKind::Usage | ErrorKind::Auth | ErrorKind::HostKey | ErrorKind::Cancelled) => {
                Fault::User
            }
            (_, ErrorKind::Connect | ErrorKind::Timeout) => Fault::Network,
            (Error::Refused { .. }, ErrorKind::PermissionDenied | ErrorKind::NotFound) => {
                Fault::User
            }
            (Error::Refused { .. } | Error::Remote(_), _) => Fault::Remote,
            (Error::Crypto(_), _) | (Error::Tcp(_), _) => Fault::Network,
            (_, ErrorKind::Integrity) => Fault::Network,
            (_, ErrorKind::Protocol | ErrorKind::RemoteProgramMissing) => Fault::Remote,
            (Error::Engine(fastcp_stream::Error::Remote { .. }), _) => Fault::Remote,
            (
                Error::Engine(
                    fastcp_stream::Error::Protocol(_) | fastcp_stream::Error::Decode { .. },
                ),
                _,
            ) => Fault::Remote,
            _ => Fault::Local,
        }
    }
}

/// The kind of the system ssh's failure, from what it said (OpenSSH's own wording).
fn system_ssh_kind(said: &str) -> ErrorKind {
    if said.contains("Host key verification failed") || said.contains("HOST IDENTIFICATION") {
        ErrorKind::HostKey
    } else if said.contains("Permission denied") || said.contains("Too many authentication") {
        ErrorKind::Auth
    } else if said.contains("timed out") {
        ErrorKind::Timeout
    } else {
        ErrorKind::Connect
    }
}

/// The kind of a local I/O error, storage errors apart.
fn io_kind(e: &io::Error) -> ErrorKind {
    match e.raw_os_error() {
        Some(28) => return ErrorKind::NoSpace,  // ENOSPC
        Some(30) => return ErrorKind::ReadOnly, // EROFS
        Some(122) => return ErrorKind::Quota,   // EDQUOT
        _ => {}
    }
    match e.kind() {
        io::ErrorKind::NotFound => ErrorKind::NotFound,
        io::ErrorKind::PermissionDenied => ErrorKind::PermissionDenied,
        io::ErrorKind::TimedOut => ErrorKind::Timeout,
        io::ErrorKind::ConnectionRefused
        | io::ErrorKind::ConnectionReset
        | io::ErrorKind::ConnectionAborted
        | io::ErrorKind::BrokenPipe
        | io::ErrorKind::UnexpectedEof => ErrorKind::Connect,
        _ => ErrorKind::Io,
    }
}

/// The kind of an engine error.
fn engine_kind(e: &fastcp_stream::Error) -> ErrorKind {
    use fastcp_stream::Error as S;
    match e {
        S::Io { source, .. } => io_kind(source),
        S::SourceChanged { .. } | S::SourceVanished { .. } => ErrorKind::SourceChanged,
        S::Integrity { .. } => ErrorKind::Integrity,
        S::Stream { .. } if e.code() == fastcp_proto::ErrorCode::Integrity => ErrorKind::Integrity,
        S::ConnectionClosed { .. } | S::Stream { .. } => ErrorKind::Connect,
        S::UnsafePath { .. } | S::Protocol(_) | S::Decode { .. } => ErrorKind::Protocol,
        S::Unsupported { .. } | S::InvalidArgument(_) => ErrorKind::Usage,
        S::Remote { code, .. } => code_kind(*code),
        _ => ErrorKind::Io,
    }
}

/// The kind of a wire error code.
fn code_kind(code: fastcp_proto::ErrorCode) -> ErrorKind {
    use fastcp_proto::ErrorCode as C;
    match code {
        C::NotFound => ErrorKind::NotFound,
        C::PermissionDenied => ErrorKind::PermissionDenied,
        C::Integrity => ErrorKind::Integrity,
        C::SourceChanged => ErrorKind::SourceChanged,
        C::NoSpace => ErrorKind::NoSpace,
        C::ReadOnly => ErrorKind::ReadOnly,
        C::Quota => ErrorKind::Quota,
        C::DeleteLimit => ErrorKind::Usage,
        C::Unsupported => ErrorKind::Usage,
        C::Io | C::Other => ErrorKind::Io,
        _ => ErrorKind::Protocol,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_and_faults() {
        let enospc = Error::Io(io::Error::from_raw_os_error(28));
        assert_eq!(
            (enospc.kind(), enospc.fault()),
            (ErrorKind::NoSpace, Fault::Local)
        );
        let erofs = Error::Engine(fastcp_stream::Error::Io {
            path: "/mnt/x".into(),
            source: io::Error::from_raw_os_error(30),
        });
        assert_eq!(
            (erofs.kind(), erofs.fault()),
            (ErrorKind::ReadOnly, Fault::Local)
        );
        let cut = Error::Engine(fastcp_stream::Error::ConnectionClosed {
            stream: 0,
            during: "copying",
        });
        assert_eq!(
            (cut.kind(), cut.fault()),
            (ErrorKind::Connect, Fault::Network)
        );
        let auth = Error::Transport(fastcp_transport::Error::Auth {
            user: "u".into(),
            host: "h".into(),
            tried: vec![],
        });
        assert_eq!((auth.kind(), auth.fault()), (ErrorKind::Auth, Fault::User));
        // A fatal error the remote side reported is the remote's, not this machine's.
        let remote = Error::Remote("reading the folder over SFTP: bad message".into());
        assert_eq!(
            (remote.kind(), remote.fault()),
            (ErrorKind::Io, Fault::Remote)
        );
        let tries = Error::Transport(fastcp_transport::Error::TooManyAuthFailures {
            user: "u".into(),
            host: "h".into(),
            tried: vec![],
        });
        assert_eq!(
            (tries.kind(), tries.fault()),
            (ErrorKind::Auth, Fault::User)
        );
        let remote_full = Error::Engine(fastcp_stream::Error::Remote {
            code: fastcp_proto::ErrorCode::NoSpace,
            path: String::new(),
            message: "no space".into(),
        });
        assert_eq!(remote_full.kind(), ErrorKind::NoSpace);
        assert_eq!(remote_full.fault(), Fault::Remote);
        let stalled = Error::Timeout("while copying".into());
        assert_eq!(
            (stalled.kind(), stalled.fault()),
            (ErrorKind::Timeout, Fault::Network)
        );
        let missing = Error::Deploy("no binary".into());
        assert_eq!(missing.kind(), ErrorKind::RemoteProgramMissing);
    }

    #[test]
    fn exit_codes_follow_kinds() {
        use fastcp_proto::ErrorCode as C;
        use fastcp_stream::Error as S;
        let remote = |code| {
            Error::Engine(S::Remote {
                code,
                path: String::new(),
                message: "m".into(),
            })
        };
        let cases = [
            // A record that failed its tag: data, not the connection, went wrong.
            (
                Error::Engine(S::Stream {
                    stream: 1,
                    source: io::Error::new(io::ErrorKind::InvalidData, "tag"),
                }),
                ErrorKind::Integrity,
                exit::INTEGRITY,
            ),
            (
                Error::Engine(S::Stream {
                    stream: 1,
                    source: io::Error::from(io::ErrorKind::ConnectionReset),
                }),
                ErrorKind::Connect,
                exit::CONNECTION,
            ),
            (
                Error::Io(io::Error::from(io::ErrorKind::BrokenPipe)),
                ErrorKind::Connect,
                exit::CONNECTION,
            ),
            // Whatever failed in the transport, the connection failed.
            (
                Error::Transport(fastcp_transport::Error::io(
                    "reading the identity",
                    io::Error::from(io::ErrorKind::NotFound),
                )),
                ErrorKind::NotFound,
                exit::CONNECTION,
            ),
            (
                Error::Engine(S::InvalidArgument("x".into())),
                ErrorKind::Usage,
                exit::USAGE,
            ),
            (
                Error::Engine(S::SourceChanged { path: "f".into() }),
                ErrorKind::SourceChanged,
                exit::SOURCE_CHANGED,
            ),
            (remote(C::NotFound), ErrorKind::NotFound, exit::PARTIAL),
            (remote(C::Other), ErrorKind::Io, exit::PARTIAL),
            (remote(C::Protocol), ErrorKind::Protocol, exit::CONNECTION),
            (Error::Remote("failed".into()), ErrorKind::Io, exit::PARTIAL),
            (
                Error::Crypto(fastcp_crypto::Error::ProviderUnavailable(
                    fastcp_crypto::Provider::Ring,
                )),
                ErrorKind::Usage,
                exit::USAGE,
            ),
        ];
        for (e, kind, code) in cases {
            assert_eq!((e.kind(), e.exit_code()), (kind, code), "{e:?}");
        }
    }
}
