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
    /// The remote side reported a fatal error.
    #[error("remote: {0}")]
    Remote(String),
    /// The remote command failed before speaking the protocol.
    #[error("{0}")]
    RemoteCommand(String),
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
}

/// Documented process exit codes.
pub mod exit {
    /// Everything was copied.
    pub const OK: u8 = 0;
    /// Some files failed; the others were copied.
    pub const PARTIAL: u8 = 1;
    /// The command line was wrong.
    pub const USAGE: u8 = 2;
    /// Connecting or authenticating failed.
    pub const CONNECTION: u8 = 3;
    /// Data failed an integrity check (a hash or an AEAD tag).
    pub const INTEGRITY: u8 = 4;
    /// Everything was copied but files that changed or vanished while they were read (as
    /// rsync's 24): run the copy again once they are stable.
    pub const SOURCE_CHANGED: u8 = 5;
    /// Stopped by SIGINT (Ctrl-C), SIGTERM or SIGHUP; nothing partial was kept (128 + 2, as
    /// shells report an interrupted command).
    pub const INTERRUPTED: u8 = 130;

    /// The exit code for a copy that ran to its end with `report`: [`OK`], [`INTEGRITY`] if
    /// any file failed its check, else [`SOURCE_CHANGED`] if every failure was a source that
    /// changed or vanished while read, else [`PARTIAL`].
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
        } else {
            PARTIAL
        }
    }
}

impl Error {
    /// The process exit code this error maps to; see [`exit`].
    pub fn exit_code(&self) -> u8 {
        match self {
            Error::Usage(_) => exit::USAGE,
            Error::Transport(_) | Error::Tcp(_) | Error::Timeout(_) | Error::JoinRejected(_) => {
                exit::CONNECTION
            }
            Error::RemoteCommand(_) | Error::Handshake(_) | Error::Deploy(_) => exit::CONNECTION,
            Error::Engine(e) if e.code() == fastcp_proto::ErrorCode::Integrity => exit::INTEGRITY,
            // A connection lost mid-copy is a connection failure, not a file's.
            Error::Engine(e) if e.is_disconnect() => exit::CONNECTION,
            Error::ConnectionClosed(_) => exit::CONNECTION,
            Error::Crypto(_) => exit::INTEGRITY,
            _ => exit::PARTIAL,
        }
    }
}
