//! Where a copy's sources and destination are: a local path or `[user@]host:path`.

use std::fmt;
use std::path::PathBuf;

/// One operand of a copy, parsed the way scp parses it.
///
/// An operand is remote when a `:` comes before any `/`: `host:path`, `user@host:path`,
/// `[::1]:path` or `scp://[user@]host[:port]/path`. Anything else, including `./a:b` and
/// `/abs:path`, is a local path.
///
/// ```
/// use fastcp::Location;
///
/// assert_eq!(Location::parse("notes.txt"), Location::Local("notes.txt".into()));
/// let remote = Location::parse("alice@build1:src/").remote().cloned().unwrap();
/// assert_eq!((remote.user.as_deref(), remote.host.as_str(), remote.path.as_str()),
///            (Some("alice"), "build1", "src/"));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Location {
    /// A path on this machine.
    Local(PathBuf),
    /// A path on another machine, reached over SSH.
    Remote(RemotePath),
}

/// A `[user@]host:path` operand.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemotePath {
    /// The user, when given.
    pub user: Option<String>,
    /// The host or ssh_config alias, without brackets.
    pub host: String,
    /// The port, only from the `scp://host:port/` form.
    pub port: Option<u16>,
    /// The path on the remote host. Empty means the remote user's home directory.
    pub path: String,
}

impl Location {
    /// [`parse`](Location::parse) for an operand that may not be UTF-8, as a command line
    /// gives it: such a path is a local one (its bytes kept as they are), and a remote path
    /// that is not UTF-8 is refused (the remote path travels as text).
    ///
    /// ```
    /// use std::ffi::OsStr;
    /// use std::os::unix::ffi::OsStrExt;
    /// use fastcp::Location;
    ///
    /// let local = Location::parse_os(OsStr::from_bytes(b"caf\xe9.txt")).unwrap();
    /// assert_eq!(local, Location::Local(OsStr::from_bytes(b"caf\xe9.txt").into()));
    /// assert!(Location::parse_os(OsStr::from_bytes(b"host:caf\xe9")).is_err());
    /// ```
    pub fn parse_os(arg: &std::ffi::OsStr) -> Result<Location, crate::Error> {
        if let Some(text) = arg.to_str() {
            return Ok(Location::parse(text));
        }
        match Location::parse(&arg.to_string_lossy()) {
            Location::Local(_) => Ok(Location::Local(arg.into())),
            Location::Remote(_) => Err(crate::Error::Usage(format!(
                "{}: a remote path must be UTF-8 (it travels as text)",
                crate::stream::escape(std::os::unix::ffi::OsStrExt::as_bytes(arg))
            ))),
        }
    }

    /// Parses one command-line operand.
    pub fn parse(arg: &str) -> Location {
        if let Some(rest) = arg.strip_prefix("scp://")
            && let Some(remote) = parse_uri(rest)
        {
            return Location::Remote(remote);
        }
        if arg.starts_with('/') {
            return Location::Local(arg.into());
        }
        let (user, rest) = match arg.find('@') {
            // A user part only counts before the host: "a/b@c:d" is a local path.
            Some(at) if !arg[..at].contains('/') && !arg[..at].contains(':') => {
                (Some(&arg[..at]), &arg[at + 1..])
            }
            _ => (None, arg),
        };
        let (host, path) = if let Some(bracketed) = rest.strip_prefix('[') {
            match bracketed.split_once("]:") {
                Some((host, path)) => (host, path),
                None => return Location::Local(arg.into()),
            }
        } else {
            match rest.find([':', '/']) {
                Some(i) if rest.as_bytes()[i] == b':' => (&rest[..i], &rest[i + 1..]),
                _ => return Location::Local(arg.into()),
            }
        };
        if host.is_empty() || user.is_some_and(str::is_empty) {
            return Location::Local(arg.into());
        }
        Location::Remote(RemotePath {
            user: user.map(str::to_owned),
            host: host.to_owned(),
            port: None,
            path: path.to_owned(),
        })
    }

    /// The remote part, if this is a remote operand.
    pub fn remote(&self) -> Option<&RemotePath> {
        match self {
            Location::Remote(r) => Some(r),
            Location::Local(_) => None,
        }
    }
}

fn parse_uri(rest: &str) -> Option<RemotePath> {
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i + 1..]),
        None => (rest, ""),
    };
    // As scp: the user and the path are percent-decoded, and the user's connection
    // parameters (`user;fingerprint=...`) are passed over.
    let (user, hostport) = match authority.rsplit_once('@') {
        Some((u, h)) => {
            let u = u.split(';').next().unwrap_or_default();
            (Some(percent_decoded(u)?), h)
        }
        None => (None, authority),
    };
    let (host, port) = if let Some(b) = hostport.strip_prefix('[') {
        let (host, after) = b.split_once(']')?;
        let port = match after.strip_prefix(':') {
            Some(p) => Some(p.parse().ok()?),
            None if after.is_empty() => None,
            None => return None,
        };
        (host, port)
    } else {
        match hostport.split_once(':') {
            Some((h, p)) => (h, Some(p.parse().ok()?)),
            None => (hostport, None),
        }
    };
    if host.is_empty() {
        return None;
    }
    Some(RemotePath {
        user,
        host: host.to_owned(),
        port,
        path: percent_decoded(path)?,
    })
}

/// `s` with each `%XX` replaced by the byte it stands for; `None` when a `%` is not followed
/// by two hex digits or the result is not UTF-8.
fn percent_decoded(s: &str) -> Option<String> {
    let mut out = Vec::with_capacity(s.len());
    let mut bytes = s.bytes();
    while let Some(b) = bytes.next() {
        if b != b'%' {
            out.push(b);
            continue;
        }
        let hex = [bytes.next()?, bytes.next()?];
        out.push(u8::from_str_radix(std::str::from_utf8(&hex).ok()?, 16).ok()?);
    }
    String::from_utf8(out).ok()
}

impl fmt::Display for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Location::Local(p) => write!(f, "{}", p.display()),
            Location::Remote(r) => write!(f, "{r}"),
        }
    }
}

impl fmt::Display for RemotePath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(u) = &self.user {
            write!(f, "{u}@")?;
        }
        if self.host.contains(':') {
            write!(f, "[{}]:{}", self.host, self.path)
        } else {
            write!(f, "{}:{}", self.host, self.path)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn remote(user: Option<&str>, host: &str, port: Option<u16>, path: &str) -> Location {
        Location::Remote(RemotePath {
            user: user.map(Into::into),
            host: host.into(),
            port,
            path: path.into(),
        })
    }

    #[test]
    fn parses_like_scp() {
        let local = |s: &str| Location::Local(s.into());
        let cases = [
            ("file", local("file")),
            ("dir/file", local("dir/file")),
            ("./a:b", local("./a:b")),
            ("/abs:colon", local("/abs:colon")),
            ("a/b:c", local("a/b:c")),
            (":path", local(":path")),
            ("@host:path", local("@host:path")),
            ("host:", remote(None, "host", None, "")),
            ("host:path/x", remote(None, "host", None, "path/x")),
            ("host:/abs", remote(None, "host", None, "/abs")),
            ("bob@host:p", remote(Some("bob"), "host", None, "p")),
            ("[::1]:p", remote(None, "::1", None, "p")),
            (
                "bob@[fe80::1]:/x",
                remote(Some("bob"), "fe80::1", None, "/x"),
            ),
            ("host:a:b", remote(None, "host", None, "a:b")),
            ("scp://h/p", remote(None, "h", None, "p")),
            (
                "scp://r%6fot;fingerprint=SHA256:x@h/my%20file",
                remote(Some("root"), "h", None, "my file"),
            ),
            (
                "scp://u@h:2222/d/f",
                remote(Some("u"), "h", Some(2222), "d/f"),
            ),
            ("scp://[::1]:22/x", remote(None, "::1", Some(22), "x")),
        ];
        for (arg, want) in cases {
            assert_eq!(Location::parse(arg), want, "{arg}");
        }
    }

    #[test]
    fn displays_round_trip() {
        for arg in ["host:p", "bob@host:/x", "[::1]:p", "file"] {
            assert_eq!(Location::parse(arg).to_string(), arg);
        }
    }
}
