//! Validation of the relative paths that travel in manifest entries.
//!
//! A wire path is a '/'-separated sequence of components, relative to the transfer's root.
//! The receiver must never let a path from the peer name anything outside its destination:
//! [`validate`] rejects every form that could (an empty path or component, ".", "..", an
//! absolute path, a NUL byte, an overlong path or name). What it cannot see, a symbolic link
//! already on disk, the receiver checks when it resolves the path.
//!
//! ```
//! use fastcp_proto::path::{validate, PathError};
//!
//! assert!(validate(b"src/main.rs").is_ok());
//! assert_eq!(validate(b"../etc/passwd"), Err(PathError::DotDot));
//! assert_eq!(validate(b"/etc/passwd"), Err(PathError::Absolute));
//! ```

use crate::{MAX_DEPTH, MAX_NAME, MAX_PATH};

/// Why a wire path was rejected.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PathError {
    /// The path is empty.
    #[error("empty path")]
    Empty,
    /// The path starts with '/'.
    #[error("absolute path")]
    Absolute,
    /// A component is empty ("a//b" or a trailing '/').
    #[error("empty path component")]
    EmptyComponent,
    /// A component is ".".
    #[error("\".\" path component")]
    Dot,
    /// A component is "..".
    #[error("\"..\" path component")]
    DotDot,
    /// The path contains a NUL byte.
    #[error("NUL byte in path")]
    Nul,
    /// The path or one of its components is too long.
    #[error("path too long")]
    TooLong,
    /// The path has more than [`MAX_DEPTH`] components.
    #[error("path nested deeper than {} levels", crate::MAX_DEPTH)]
    TooDeep,
}

/// Checks that `path` is a safe relative wire path.
pub fn validate(path: &[u8]) -> Result<(), PathError> {
    if path.is_empty() {
        return Err(PathError::Empty);
    }
    if path.len() > MAX_PATH {
        return Err(PathError::TooLong);
    }
    if path[0] == b'/' {
        return Err(PathError::Absolute);
    }
    if path.contains(&0) {
        return Err(PathError::Nul);
    }
    for (depth, component) in path.split(|&b| b == b'/').enumerate() {
        if depth == MAX_DEPTH {
            return Err(PathError::TooDeep);
        }
        match component {
            b"" => return Err(PathError::EmptyComponent),
            b"." => return Err(PathError::Dot),
            b".." => return Err(PathError::DotDot),
            c if c.len() > MAX_NAME => return Err(PathError::TooLong),
            _ => {}
        }
    }
    Ok(())
}

/// The components of a path that passed [`validate`].
pub fn components(path: &[u8]) -> impl Iterator<Item = &[u8]> {
    path.split(|&b| b == b'/')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn depth_is_capped() {
        let at_cap = vec!["d"; crate::MAX_DEPTH].join("/");
        assert_eq!(validate(at_cap.as_bytes()), Ok(()));
        let deeper = format!("{at_cap}/d");
        assert_eq!(validate(deeper.as_bytes()), Err(PathError::TooDeep));
    }

    #[test]
    fn accepts_ordinary_and_odd_names() {
        for ok in [
            &b"a"[..],
            b"a/b/c",
            b"-leading-dash",
            b"with space/and\nnewline",
            b"...",
            b"..a/.b",
            "ünïcødé/名前".as_bytes(),
            b"\xff\xfe not utf8",
        ] {
            assert_eq!(validate(ok), Ok(()), "{:?}", String::from_utf8_lossy(ok));
        }
    }

    #[test]
    fn rejects_every_escape() {
        let cases: &[(&[u8], PathError)] = &[
            (b"", PathError::Empty),
            (b"/", PathError::Absolute),
            (b"/etc/passwd", PathError::Absolute),
            (b".", PathError::Dot),
            (b"a/./b", PathError::Dot),
            (b"..", PathError::DotDot),
            (b"a/../../b", PathError::DotDot),
            (b"a/..", PathError::DotDot),
            (b"a//b", PathError::EmptyComponent),
            (b"a/", PathError::EmptyComponent),
            (b"a\0b", PathError::Nul),
        ];
        for (path, want) in cases {
            assert_eq!(
                validate(path),
                Err(*want),
                "{:?}",
                String::from_utf8_lossy(path)
            );
        }
        assert_eq!(validate(&[b'a'; 256]), Err(PathError::TooLong));
        assert_eq!(validate(&[b'a'; MAX_PATH + 1]), Err(PathError::TooLong));
    }
}
