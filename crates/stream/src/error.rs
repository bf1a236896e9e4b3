//! The engine's error type.

use std::io;
use std::path::PathBuf;

use fastcp_proto::{DecodeError, ErrorCode, ErrorFrame};

use crate::display::escape;

/// Everything that can stop a transfer or fail one entry.
///
/// The variants fall into three families that callers usually treat differently:
///
/// - **the peer misbehaved** ([`Error::Protocol`], [`Error::Decode`], [`Error::UnsafePath`],
///   [`Error::Integrity`]): the other side is broken or hostile; see [`Error::is_peer_fault`];
/// - **the connection was cut** ([`Error::ConnectionClosed`], [`Error::Stream`]); see
///   [`Error::is_disconnect`];
/// - **a local problem** ([`Error::Io`], [`Error::Unsupported`], [`Error::SourceChanged`], [`Error::SourceVanished`],
///   [`Error::InvalidArgument`]),
///   with the path concerned.
///
/// [`Error::Remote`] is the peer telling us it gave up, with its own reason.
///
/// Every message names the file concerned (escaped so that control characters in a name
/// cannot rewrite the terminal) and the cause:
///
/// ```
/// use fastcp_stream::Error;
///
/// let err = Error::Io {
///     path: "/tmp/x\ny".into(),
///     source: std::io::Error::from(std::io::ErrorKind::PermissionDenied),
/// };
/// assert_eq!(err.to_string(), r"/tmp/x\ny: permission denied");
/// assert!(!err.is_peer_fault());
/// ```
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A local file operation failed.
    #[error("{}: {}", escape(.path.as_os_str().as_encoded_bytes()), io_message(.source))]
    Io {
        /// The local path concerned.
        path: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// A source that cannot be copied, such as a directory without `recursive`, a device or a
    /// socket.
    #[error("{}: {reason}", escape(.path.as_os_str().as_encoded_bytes()))]
    Unsupported {
        /// The local path concerned.
        path: PathBuf,
        /// Why it is skipped.
        reason: String,
    },
    /// A source file changed while it was being read (its size or modification time is not
    /// what it was when it was opened, or it was replaced by something else); it was not
    /// copied.
    #[error("{}: file changed while being read; not copied", escape(.path.as_os_str().as_encoded_bytes()))]
    SourceChanged {
        /// The local path concerned.
        path: PathBuf,
    },
    /// A source file vanished between the walk that found it and its read; it was not copied.
    #[error("{}: file vanished before it could be read; not copied", escape(.path.as_os_str().as_encoded_bytes()))]
    SourceVanished {
        /// The local path concerned.
        path: PathBuf,
    },
    /// The caller asked for something impossible, such as several sources into a destination
    /// that is not a directory.
    #[error("{0}")]
    InvalidArgument(String),
    /// The peer broke the protocol: a frame out of place, an unknown file id, data past a
    /// file's end, counts that do not add up.
    #[error("protocol violation by the peer: {0}")]
    Protocol(String),
    /// The peer sent bytes that are not a valid frame.
    #[error("protocol violation by the peer on stream {stream}: {source}")]
    Decode {
        /// The stream the bytes arrived on.
        stream: usize,
        /// What was wrong.
        #[source]
        source: DecodeError,
    },
    /// The peer sent a path that could write outside the destination, or that was not asked
    /// for.
    #[error("unsafe path from the peer: {path}: {reason}")]
    UnsafePath {
        /// The path, escaped for display.
        path: String,
        /// Why it was refused.
        reason: String,
    },
    /// A file's content did not match the checksum the sender computed; the file was
    /// discarded.
    #[error("{path}: checksum mismatch: the data were corrupted on the way (file discarded)")]
    Integrity {
        /// The file's wire path, escaped for display.
        path: String,
    },
    /// A stream ended before the transfer was complete.
    #[error("connection closed unexpectedly on stream {stream} ({during})")]
    ConnectionClosed {
        /// The stream that ended.
        stream: usize,
        /// What was going on.
        during: &'static str,
    },
    /// Reading or writing a stream failed. A read that failed with
    /// [`io::ErrorKind::InvalidData`] brought bytes that were not sent (a sealed TCP record that
    /// failed its tag, say): an integrity failure, not a lost connection (see
    /// [`code`](Error::code)).
    #[error("stream {stream}: {}", io_message(.source))]
    Stream {
        /// The stream concerned.
        stream: usize,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// The peer reported a fatal error and gave up.
    #[error("the other end stopped the copy: {}", remote_message(.path, .message))]
    Remote {
        /// The peer's error code.
        code: ErrorCode,
        /// The path concerned, escaped for display, or empty.
        path: String,
        /// The peer's message.
        message: String,
    },
}

/// An I/O error as a short lowercase message: "permission denied" rather than
/// "Permission denied (os error 13)".
pub(crate) fn io_message(e: &io::Error) -> String {
    let s = e.to_string();
    let s = match s.find(" (os error") {
        Some(i) => &s[..i],
        None => &s[..],
    };
    let mut chars = s.chars();
    match chars.next() {
        Some(c) => c.to_lowercase().chain(chars).collect(),
        None => String::new(),
    }
}

/// What a caught panic said, when it said it with a string.
pub(crate) fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_default()
}

fn remote_message(path: &str, message: &str) -> String {
    if path.is_empty() {
        message.to_string()
    } else {
        format!("{path}: {message}")
    }
}

impl Error {
    /// This error without the option it names to copy a skipped named pipe, socket or device
    /// (`--specials`, `--devices`): for a copy that cannot carry them.
    pub fn without_option_hint(self) -> Error {
        match self {
            Error::Unsupported { path, reason } => Error::Unsupported {
                path,
                reason: crate::walk::OPTION_HINTS
                    .iter()
                    .fold(reason, |reason, hint| reason.replace(hint, "")),
            },
            e => e,
        }
    }

    /// True when the peer is broken or hostile: it broke the protocol, sent an unsafe path
    /// or corrupted data.
    pub fn is_peer_fault(&self) -> bool {
        matches!(
            self,
            Error::Protocol(_)
                | Error::Decode { .. }
                | Error::UnsafePath { .. }
                | Error::Integrity { .. }
        )
    }

    /// True when a stream ended or failed before the transfer was complete.
    pub fn is_disconnect(&self) -> bool {
        match self {
            Error::ConnectionClosed { .. } => true,
            Error::Stream { source, .. } => source.kind() != io::ErrorKind::InvalidData,
            _ => false,
        }
    }

    /// The wire error code that describes this error.
    pub fn code(&self) -> ErrorCode {
        match self {
            Error::Io { source, .. } => match (source.raw_os_error(), source.kind()) {
                (Some(28), _) => ErrorCode::NoSpace,
                (Some(30), _) => ErrorCode::ReadOnly,
                (Some(122), _) => ErrorCode::Quota,
                (_, io::ErrorKind::NotFound) => ErrorCode::NotFound,
                (_, io::ErrorKind::PermissionDenied) => ErrorCode::PermissionDenied,
                _ => ErrorCode::Io,
            },
            Error::Unsupported { .. } | Error::InvalidArgument(_) => ErrorCode::Unsupported,
            Error::SourceChanged { .. } | Error::SourceVanished { .. } => ErrorCode::SourceChanged,
            Error::Protocol(_) | Error::Decode { .. } => ErrorCode::Protocol,
            Error::UnsafePath { .. } => ErrorCode::UnsafePath,
            Error::Integrity { .. } => ErrorCode::Integrity,
            Error::Stream { source, .. } if source.kind() == io::ErrorKind::InvalidData => {
                ErrorCode::Integrity
            }
            Error::ConnectionClosed { .. } | Error::Stream { .. } => ErrorCode::Io,
            Error::Remote { code, .. } => *code,
        }
    }

    /// The [`ErrorFrame`] that tells the peer about this error.
    pub(crate) fn to_frame(&self, path: &[u8], fatal: bool) -> ErrorFrame {
        ErrorFrame {
            code: self.code(),
            fatal,
            path: bytes::Bytes::copy_from_slice(path),
            message: self.to_string(),
        }
    }

    pub(crate) fn io(path: impl Into<PathBuf>, source: io::Error) -> Error {
        Error::Io {
            path: path.into(),
            source,
        }
    }

    pub(crate) fn unsafe_path(path: &[u8], reason: impl Into<String>) -> Error {
        Error::UnsafePath {
            path: escape(path),
            reason: reason.into(),
        }
    }

    /// The peer's error, as its [`ErrorFrame`] tells it.
    pub fn from_frame(frame: &ErrorFrame) -> Error {
        Error::Remote {
            code: frame.code,
            path: escape(&frame.path),
            message: frame.message.clone(),
        }
    }
}
