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
            return Location::try_parse(text);
        }
        match Location::try_parse(&arg.to_string_lossy())? {
            Location::Local(_) => Ok(Location::Local(arg.into())),
            Location::Remote(_) => Err(crate::Error::Usage(format!(
                "{}: a remote path must be UTF-8 (it travels as text)",
                crate::stream::escape(std::os::unix::ffi::OsStrExt::as_bytes(arg))
            ))),
        }
    }

    /// Parses one command-line operand, refusing a malformed `scp://` URI as scp does (a
    /// bad `%` escape, an empty user or host, a port that is neither a number from 1 to
    /// 65535 nor a TCP service name).
    ///
    /// ```
    /// use fastcp::Location;
    ///
    /// let remote = Location::try_parse("scp://alice@build1:2222/src/").unwrap();
    /// assert_eq!(remote.remote().unwrap().port, Some(2222));
    /// assert!(Location::try_parse("scp://build1:99999/src/").is_err());
    /// ```
    pub fn try_parse(arg: &str) -> Result<Location, crate::Error> {
        match arg.strip_prefix("scp://") {
            Some(rest) => parse_uri(rest)
                .map(Location::Remote)
                .map_err(|why| crate::Error::Usage(format!("{arg}: invalid scp:// URI: {why}"))),
            None => Ok(Location::parse(arg)),
        }
    }

    /// Parses one command-line operand. A malformed `scp://` URI is read as `host:path`, with
    /// `scp` the host; [`try_parse`](Location::try_parse) refuses it.
    pub fn parse(arg: &str) -> Location {
        if let Some(rest) = arg.strip_prefix("scp://")
            && let Ok(remote) = parse_uri(rest)
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

/// The `[user@]host[:port][/path]` of an `scp://` URI, as OpenSSH's `parse_uri` reads it; the
/// error says what is wrong with it.
fn parse_uri(rest: &str) -> Result<RemotePath, String> {
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i + 1..]),
        None => (rest, ""),
    };
    // As scp: the user and the path are percent-decoded, and the user's connection
    // parameters (`user;fingerprint=...`) are passed over.
    let (user, hostport) = match authority.rsplit_once('@') {
        Some((u, h)) => {
            let u = u.split(';').next().unwrap_or_default();
            if u.is_empty() {
                return Err("empty user".into());
            }
            (Some(percent_decoded(u)?), h)
        }
        None => (None, authority),
    };
    let (host, port) = if let Some(b) = hostport.strip_prefix('[') {
        let (host, after) = b
            .split_once(']')
            .ok_or_else(|| format!("no `]` after `[{b}`"))?;
        match after.strip_prefix(':') {
            Some(p) => (host, Some(port(p)?)),
            None if after.is_empty() => (host, None),
            None => return Err(format!("`{after}` after `[{host}]`")),
        }
    } else {
        let (host, port) = match hostport.split_once(':') {
            Some((h, p)) => (h, Some(port(p)?)),
            None => (hostport, None),
        };
        if let Some(why) = host_fault(host) {
            return Err(why);
        }
        (host, port)
    };
    if host.is_empty() {
        return Err("empty host".into());
    }
    Ok(RemotePath {
        user,
        host: host.to_owned(),
        port,
        path: percent_decoded(path)?,
    })
}

/// The port of an `scp://` URI: a number from 1 to 65535, or a TCP service name.
fn port(p: &str) -> Result<u16, String> {
    crate::transport::ssh::config::parse_port(p).ok_or_else(|| {
        format!("port `{p}` is neither a number from 1 to 65535 nor a TCP service name")
    })
}

/// What makes `host` no host name, as OpenSSH's `valid_domain` judges it: letters, digits,
/// `-`, `_` and single dots, starting with a letter, a digit or `_`.
fn host_fault(host: &str) -> Option<String> {
    let bytes = host.as_bytes();
    let first = *bytes.first()?;
    let ok = (first.is_ascii_alphanumeric() || first == b'_')
        && !host.contains("..")
        && bytes
            .iter()
            .all(|&c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'));
    (!ok).then(|| format!("`{host}` is not a host name"))
}

/// `s` with each `%XX` replaced by the byte it stands for; an error when a `%` is not followed
/// by two hex digits, one stands for a NUL byte, or the result is not UTF-8.
fn percent_decoded(s: &str) -> Result<String, String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while let Some(&b) = bytes.get(i) {
        if b != b'%' {
            out.push(b);
            i += 1;
            continue;
        }
        let hex = bytes
            .get(i + 1..i + 3)
            .filter(|h| h.iter().all(u8::is_ascii_hexdigit))
            .and_then(|h| u8::from_str_radix(std::str::from_utf8(h).ok()?, 16).ok());
        match hex {
            Some(byte) if byte != 0 => out.push(byte),
            _ => {
                let escape = String::from_utf8_lossy(&bytes[i..bytes.len().min(i + 3)]);
                return Err(format!(
                    "`{escape}` is not a `%` escape of a byte other than 0"
                ));
            }
        }
        i += 3;
    }
    String::from_utf8(out).map_err(|_| format!("`{s}` does not decode to UTF-8"))
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
            assert_eq!(Location::try_parse(arg).unwrap(), want, "{arg}");
        }
    }

    #[test]
    fn refuses_a_malformed_scp_uri_as_scp_does() {
        let cases = [
            ("scp://h/%zz", "`%zz`"),
            ("scp://h/a%2", "`%2`"),
            ("scp://h/a%", "`%`"),
            ("scp://h/%00", "`%00`"),
            ("scp://h/%+1", "`%+1`"),
            ("scp://h/%ff", "UTF-8"),
            ("scp://u%zz@h/x", "`%zz`"),
            ("scp://@h/x", "empty user"),
            ("scp://;fingerprint=x@h/x", "empty user"),
            ("scp://h:99999/x", "port `99999`"),
            ("scp://h:abc/x", "port `abc`"),
            ("scp://h:0/x", "port `0`"),
            ("scp://h:/x", "port ``"),
            ("scp://h:-1/x", "port `-1`"),
            ("scp://[::1]:70000/x", "port `70000`"),
            ("scp://[::1/x", "no `]`"),
            ("scp://[::1]x/y", "`x` after"),
            ("scp:///x", "empty host"),
            ("scp://", "empty host"),
            ("scp://u@/x", "empty host"),
            ("scp://[]/x", "empty host"),
            ("scp://h%20x/p", "`h%20x` is not a host name"),
            ("scp://-h/p", "not a host name"),
            ("scp://a..b/p", "not a host name"),
        ];
        for (arg, why) in cases {
            let err = Location::try_parse(arg).expect_err(arg).to_string();
            assert!(
                err.starts_with(&format!("{arg}: invalid scp:// URI: ")),
                "{err}"
            );
            assert!(err.contains(why), "{arg}: {err}");
            let os = Location::parse_os(std::ffi::OsStr::new(arg)).expect_err(arg);
            assert!(matches!(os, crate::Error::Usage(_)), "{arg}: {os:?}");
        }
    }

    /// As scp (OpenSSH's `a2port`), a URI's port may be a TCP service name.
    #[test]
    fn a_uri_port_may_be_a_service_name() {
        if !std::fs::read_to_string("/etc/services").is_ok_and(|s| s.contains("22/tcp")) {
            eprintln!("/etc/services does not name ssh; skipping");
            return;
        }
        let want = remote(Some("u"), "h", Some(22), "x");
        assert_eq!(Location::try_parse("scp://u@h:ssh/x").unwrap(), want);
    }

    #[test]
    fn displays_round_trip() {
        for arg in ["host:p", "bob@host:/x", "[::1]:p", "file"] {
            assert_eq!(Location::parse(arg).to_string(), arg);
        }
    }
}
