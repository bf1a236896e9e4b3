//! known_hosts files: lookup and recording, as OpenSSH reads and writes them.
//!
//! Supported: plain host patterns (with `*`, `?` and `!negation`), `[host]:port` entries,
//! hashed entries (`|1|base64 salt|base64 HMAC-SHA1(salt, host)`), several key types per
//! host, comments, and the `@revoked` marker (a revoked key is refused). `@cert-authority`
//! lines are skipped: fastcp does not ask for host certificates, so they never apply.
//! Lines it cannot parse (unknown key types, garbage) are skipped, never trusted.

use std::fs;
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use data_encoding::BASE64;
use hmac::{Hmac, KeyInit, Mac};
use russh::keys::{Algorithm, HashAlg, PublicKey};
use sha1::Sha1;

/// What the known_hosts files say about a host's key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HostKeyStatus {
    /// The key is recorded for this host.
    Known {
        /// File holding it.
        file: PathBuf,
        /// Line number (1-based).
        line: usize,
    },
    /// No key is recorded for this host.
    Unknown,
    /// Other keys are recorded for this host, and not this one (of whatever type: as ssh,
    /// a host that no longer shows the key of a type it was known by has changed).
    Changed {
        /// File holding the other key.
        file: PathBuf,
        /// Its line number (1-based).
        line: usize,
    },
    /// The key is marked `@revoked`.
    Revoked {
        /// File holding the marker.
        file: PathBuf,
        /// Its line number (1-based).
        line: usize,
    },
}

/// The name a host is looked up under: `host` on port 22, `[host]:port` otherwise.
pub fn host_port_name(host: &str, port: u16) -> String {
    let host = host.to_ascii_lowercase();
    if port == 22 {
        host
    } else {
        format!("[{host}]:{port}")
    }
}

/// OpenSSH's short name of a key type, as in "No ED25519 host key is known".
pub fn key_type_name(key: &PublicKey) -> String {
    match key.algorithm() {
        Algorithm::Ed25519 => "ED25519".into(),
        Algorithm::Rsa { .. } => "RSA".into(),
        Algorithm::Ecdsa { .. } => "ECDSA".into(),
        Algorithm::Dsa => "DSA".into(),
        Algorithm::SkEd25519 => "ED25519-SK".into(),
        Algorithm::SkEcdsaSha2NistP256 => "ECDSA-SK".into(),
        other => other.as_str().to_uppercase(),
    }
}

/// `SHA256:...` fingerprint of a key, as OpenSSH prints it.
pub fn fingerprint(key: &PublicKey) -> String {
    key.fingerprint(HashAlg::Sha256).to_string()
}

/// Looks `name` (see [`host_port_name`]) up in `files`, in order; missing files are skipped.
pub fn check(files: &[PathBuf], name: &str, key: &PublicKey) -> io::Result<HostKeyStatus> {
    let mut changed = None;
    let mut known = None;
    for file in files {
        let text = match fs::read_to_string(file) {
            Ok(t) => t,
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e),
        };
        for (i, raw) in text.lines().enumerate() {
            let Some(entry) = parse_line(raw) else {
                continue;
            };
            if !entry.matches_host(name) {
                continue;
            }
            let Ok(recorded) = russh::keys::parse_public_key_base64(entry.key_b64) else {
                continue;
            };
            let same_key = recorded.key_data() == key.key_data();
            match entry.marker {
                Marker::Revoked if same_key => {
                    return Ok(HostKeyStatus::Revoked {
                        file: file.clone(),
                        line: i + 1,
                    });
                }
                Marker::Revoked | Marker::Other => {}
                Marker::None if same_key => {
                    known.get_or_insert((file.clone(), i + 1));
                }
                Marker::None => {
                    changed.get_or_insert((file.clone(), i + 1));
                }
            }
        }
    }
    Ok(match (known, changed) {
        (Some((file, line)), _) => HostKeyStatus::Known { file, line },
        (None, Some((file, line))) => HostKeyStatus::Changed { file, line },
        (None, None) => HostKeyStatus::Unknown,
    })
}

/// The fewest bits of an RSA key OpenSSH takes, whatever RequiredRSASize says.
pub const RSA_MIN_BITS: u32 = 1024;

/// The exact number of bits of an RSA key's modulus (`None` for another kind of key).
pub fn rsa_bits(key: &russh::keys::ssh_key::public::KeyData) -> Option<u32> {
    let n = key.rsa()?.n().as_positive_bytes()?;
    let first = n.iter().position(|&b| b != 0)?;
    Some((n.len() - first) as u32 * 8 - n[first].leading_zeros())
}

/// The first bytes of a key revocation list in OpenSSH's binary format.
const KRL_MAGIC: &[u8] = b"SSHKRL\n\0";

/// Whether `file` is a key revocation list in OpenSSH's binary format (`ssh-keygen -k`),
/// rather than a list of public keys.
pub fn is_key_revocation_list(file: &Path) -> bool {
    let mut start = [0; KRL_MAGIC.len()];
    fs::File::open(file)
        .and_then(|mut f| f.read_exact(&mut start))
        .is_ok_and(|()| start == KRL_MAGIC)
}

/// The line of `file` (ssh_config's RevokedHostKeys: one public key a line, as ssh reads
/// it) that lists `key`, if any. As with ssh, a file that cannot be read is an error, and a
/// key revocation list in OpenSSH's binary format is refused.
pub fn revoked_in(file: &Path, key: &PublicKey) -> io::Result<Option<usize>> {
    if is_key_revocation_list(file) {
        return Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "a key revocation list in OpenSSH's binary format, which only the system ssh reads",
        ));
    }
    let text = fs::read_to_string(file)?;
    for (i, raw) in text.lines().enumerate() {
        let line = raw.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        // As ssh: a line that is no public key is an error, never passed over.
        let mut fields = line.split_whitespace();
        let listed = fields
            .next()
            .zip(fields.next())
            .and_then(|(_, b64)| russh::keys::parse_public_key_base64(b64).ok())
            .ok_or_else(|| {
                io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("line {} is not a public key", i + 1),
                )
            })?;
        if listed.key_data() == key.key_data() {
            return Ok(Some(i + 1));
        }
    }
    Ok(None)
}

/// The types of the keys `files` record for `name` (not revoked ones): a client offers
/// these host key algorithms first, as ssh does, so that a host with several keys shows
/// one it is known by.
pub fn known_algorithms(files: &[PathBuf], name: &str) -> Vec<Algorithm> {
    let mut found = Vec::new();
    for file in files {
        let Ok(text) = fs::read_to_string(file) else {
            continue;
        };
        for raw in text.lines() {
            let Some(entry) = parse_line(raw) else {
                continue;
            };
            if !matches!(entry.marker, Marker::None) || !entry.matches_host(name) {
                continue;
            }
            if let Ok(key) = russh::keys::parse_public_key_base64(entry.key_b64)
                && !found.contains(&key.algorithm())
            {
                found.push(key.algorithm());
            }
        }
    }
    found
}

/// Whether a `@cert-authority` line in `files` covers `name`: the host is then to be trusted
/// by its certificate, which only the system ssh checks.
pub fn has_cert_authority(files: &[PathBuf], name: &str) -> bool {
    files.iter().any(|file| {
        fs::read_to_string(file).is_ok_and(|text| {
            text.lines().any(|raw| {
                raw.trim_start()
                    .get(..15)
                    .is_some_and(|m| m.eq_ignore_ascii_case("@cert-authority"))
                    && parse_line(raw).is_some_and(|e| e.matches_host(name))
            })
        })
    })
}

/// Appends `key` for `name` to `file` (creating it and its directory, mode 0700, if needed),
/// hashing the host name when `hash` is set (ssh_config `HashKnownHosts yes`).
pub fn record(file: &Path, name: &str, key: &PublicKey, hash: bool) -> io::Result<()> {
    // `UserKnownHostsFile /dev/null`, the idiom of throwaway hosts: nothing to keep, as
    // with ssh. Only a regular file (or none yet) is appended to.
    if let Ok(meta) = fs::metadata(file)
        && !meta.is_file()
    {
        return Ok(());
    }
    if let Some(dir) = file.parent()
        && !dir.as_os_str().is_empty()
        && !dir.exists()
    {
        fs::DirBuilder::new()
            .recursive(true)
            .mode_0700()
            .create(dir)?;
    }
    let host_field = if hash {
        hash_host(name)?
    } else {
        name.to_owned()
    };
    let key_text = key
        .to_openssh()
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e.to_string()))?;
    // `to_openssh` writes "type base64 [comment]"; keep type and key only.
    let key_text: Vec<&str> = key_text.split_whitespace().take(2).collect();
    let mut f = fs::OpenOptions::new()
        .read(true)
        .append(true)
        .create(true)
        .open(file)?;
    let mut needs_newline = false;
    if f.seek(SeekFrom::End(-1)).is_ok() {
        let mut last = [0u8; 1];
        f.read_exact(&mut last)?;
        needs_newline = last[0] != b'\n';
    }
    let line = format!(
        "{}{host_field} {}\n",
        if needs_newline { "\n" } else { "" },
        key_text.join(" ")
    );
    f.write_all(line.as_bytes())?;
    f.sync_all()
}

/// `|1|salt|hash` for `name`, with a fresh random salt.
fn hash_host(name: &str) -> io::Result<String> {
    let mut salt = [0u8; 20];
    getrandom::fill(&mut salt).map_err(|e| io::Error::other(e.to_string()))?;
    let mac = hmac_sha1(&salt, name);
    Ok(format!(
        "|1|{}|{}",
        BASE64.encode(&salt),
        BASE64.encode(&mac)
    ))
}

fn hmac_sha1(salt: &[u8], name: &str) -> Vec<u8> {
    let mut mac = Hmac::<Sha1>::new_from_slice(salt).expect("HMAC takes any key length");
    mac.update(name.as_bytes());
    mac.finalize().into_bytes().to_vec()
}

#[derive(Debug, PartialEq, Eq)]
enum Marker {
    None,
    Revoked,
    Other,
}

struct Entry<'a> {
    marker: Marker,
    hosts: &'a str,
    key_b64: &'a str,
}

fn parse_line(raw: &str) -> Option<Entry<'_>> {
    let line = raw.trim();
    if line.is_empty() || line.starts_with('#') {
        return None;
    }
    let mut fields = line.split_whitespace();
    let mut first = fields.next()?;
    let marker = if let Some(m) = first.strip_prefix('@') {
        first = fields.next()?;
        if m.eq_ignore_ascii_case("revoked") {
            Marker::Revoked
        } else {
            Marker::Other
        }
    } else {
        Marker::None
    };
    let _key_type = fields.next()?;
    let key_b64 = fields.next()?;
    Some(Entry {
        marker,
        hosts: first,
        key_b64,
    })
}

impl Entry<'_> {
    fn matches_host(&self, name: &str) -> bool {
        if let Some(hashed) = self.hosts.strip_prefix("|1|") {
            let mut parts = hashed.split('|');
            let (Some(salt), Some(hash), None) = (parts.next(), parts.next(), parts.next()) else {
                return false;
            };
            let (Ok(salt), Ok(hash)) = (
                BASE64.decode(salt.as_bytes()),
                BASE64.decode(hash.as_bytes()),
            ) else {
                return false;
            };
            let mut mac = Hmac::<Sha1>::new_from_slice(&salt).expect("HMAC takes any key length");
            mac.update(name.as_bytes());
            return mac.verify_slice(&hash).is_ok();
        }
        match_pattern_list(self.hosts, name)
    }
}

/// OpenSSH's `match_hostname`: a comma-separated list of patterns; any matching negated
/// pattern rejects, otherwise any matching positive pattern accepts. Case-insensitive.
pub(crate) fn match_pattern_list(list: &str, name: &str) -> bool {
    let name = name.to_ascii_lowercase();
    let mut matched = false;
    for pat in list.split(',') {
        let (negated, pat) = match pat.strip_prefix('!') {
            Some(p) => (true, p),
            None => (false, pat),
        };
        if wildcard_match(pat.to_ascii_lowercase().as_bytes(), name.as_bytes()) {
            if negated {
                return false;
            }
            matched = true;
        }
    }
    matched
}

/// Glob match with `*` (any run) and `?` (any one byte).
pub(crate) fn wildcard_match(pat: &[u8], s: &[u8]) -> bool {
    let (mut p, mut i) = (0, 0);
    let (mut star, mut mark) = (None, 0);
    while i < s.len() {
        if p < pat.len() && (pat[p] == b'?' || pat[p] == s[i]) {
            p += 1;
            i += 1;
        } else if p < pat.len() && pat[p] == b'*' {
            star = Some(p);
            p += 1;
            mark = i;
        } else if let Some(sp) = star {
            p = sp + 1;
            mark += 1;
            i = mark;
        } else {
            return false;
        }
    }
    while p < pat.len() && pat[p] == b'*' {
        p += 1;
    }
    p == pat.len()
}

trait DirBuilderExt700 {
    fn mode_0700(&mut self) -> &mut Self;
}

impl DirBuilderExt700 for fs::DirBuilder {
    fn mode_0700(&mut self) -> &mut Self {
        use std::os::unix::fs::DirBuilderExt;
        self.mode(0o700)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ED: &str = "AAAAC3NzaC1lZDI1NTE5AAAAIOIcV0Jlq+9p5q8Kn56j+9LNvSeLRFDZWteG7pnuyBUo";
    const ED2: &str = "AAAAC3NzaC1lZDI1NTE5AAAAIPTDqDeRrxhBWLlMykjl8siUVJ/S2+9QZR4yM9XFxZI/";

    fn key(b64: &str) -> PublicKey {
        russh::keys::parse_public_key_base64(b64).unwrap()
    }

    fn file_with(text: &str) -> (tempfile::TempDir, Vec<PathBuf>) {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("known_hosts");
        fs::write(&p, text).unwrap();
        (dir, vec![p])
    }

    #[test]
    fn plain_port_and_wildcard_entries() {
        let (_d, files) = file_with(&format!(
            "# comment\n\nexample.org ssh-ed25519 {ED}\n[127.0.0.1]:2222 ssh-ed25519 {ED} c\n\
             *.corp,!bad.corp ssh-ed25519 {ED}\n"
        ));
        let k = key(ED);
        let st = |name: &str| check(&files, name, &k).unwrap();
        assert_eq!(
            st("example.org"),
            HostKeyStatus::Known {
                file: files[0].clone(),
                line: 3
            }
        );
        assert_eq!(
            st("[127.0.0.1]:2222"),
            HostKeyStatus::Known {
                file: files[0].clone(),
                line: 4
            }
        );
        assert_eq!(st("127.0.0.1"), HostKeyStatus::Unknown);
        assert_eq!(st("[127.0.0.1]:2223"), HostKeyStatus::Unknown);
        assert!(matches!(st("a.corp"), HostKeyStatus::Known { line: 5, .. }));
        assert_eq!(st("bad.corp"), HostKeyStatus::Unknown);
        assert_eq!(host_port_name("Example.ORG", 22), "example.org");
    }

    #[test]
    fn a_key_of_another_type_is_a_change_and_known_types_are_listed() {
        let (_d, files) = file_with(&format!(
            "other ssh-ed25519 {ED}\nh ssh-rsa AAAAB3NzaC1yc2EAAAADAQABAAAAgQDuPUAqXmsljuHQSeet2HM+LsF46BNaAr4ZBNYkb0MN9+ten5VVsybjsOygi1qwvfbfFVIWnX+h/spRbs8HI9o1gPn2L3zr5OKyd5ukr5zqhsLKhmx1qKcLNHe0Ms1wo7tiTHniBFWwea1KaDB7h6TFO07+Gm46pl1wRNziaIYXkQ==\n"
        ));
        assert_eq!(
            check(&files, "h", &key(ED)).unwrap(),
            HostKeyStatus::Changed {
                file: files[0].clone(),
                line: 2
            }
        );
        assert_eq!(
            check(&files, "new", &key(ED)).unwrap(),
            HostKeyStatus::Unknown
        );
        assert_eq!(
            known_algorithms(&files, "h"),
            [Algorithm::Rsa { hash: None }]
        );
        assert_eq!(known_algorithms(&files, "new"), []);
    }

    #[test]
    fn changed_key_names_the_line() {
        let (_d, files) = file_with(&format!(
            "h ssh-ed25519 {ED2}\nh ssh-rsa AAAAB3NzaC1yc2EAAAADAQABAAAAgQDuPUAqXmsljuHQSeet2HM+LsF46BNaAr4ZBNYkb0MN9+ten5VVsybjsOygi1qwvfbfFVIWnX+h/spRbs8HI9o1gPn2L3zr5OKyd5ukr5zqhsLKhmx1qKcLNHe0Ms1wo7tiTHniBFWwea1KaDB7h6TFO07+Gm46pl1wRNziaIYXkQ==\n"
        ));
        assert_eq!(
            check(&files, "h", &key(ED)).unwrap(),
            HostKeyStatus::Changed {
                file: files[0].clone(),
                line: 1
            }
        );
    }

    #[test]
    fn revoked_and_unknown_markers() {
        let (_d, files) = file_with(&format!(
            "@cert-authority * ssh-ed25519 {ED}\n@revoked h ssh-ed25519 {ED}\nh ssh-ed25519 {ED}\n"
        ));
        assert!(matches!(
            check(&files, "h", &key(ED)).unwrap(),
            HostKeyStatus::Revoked { line: 2, .. }
        ));
        // The cert-authority line is not a key for "other".
        assert_eq!(
            check(&files, "other", &key(ED)).unwrap(),
            HostKeyStatus::Unknown
        );
    }

    #[test]
    fn hashed_entries_written_and_read_back() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("sub/known_hosts");
        record(&p, "[10.0.0.1]:2200", &key(ED), true).unwrap();
        let text = fs::read_to_string(&p).unwrap();
        assert!(text.starts_with("|1|"), "{text}");
        assert!(!text.contains("10.0.0.1"));
        let files = vec![p.clone()];
        assert!(matches!(
            check(&files, "[10.0.0.1]:2200", &key(ED)).unwrap(),
            HostKeyStatus::Known { line: 1, .. }
        ));
        assert_eq!(
            check(&files, "10.0.0.1", &key(ED)).unwrap(),
            HostKeyStatus::Unknown
        );
        record(&p, "plain", &key(ED2), false).unwrap();
        assert!(
            fs::read_to_string(&p)
                .unwrap()
                .lines()
                .nth(1)
                .unwrap()
                .starts_with("plain ssh-ed25519 ")
        );
    }

    #[test]
    fn hashed_entry_from_ssh_keygen_format() {
        // Salt and hash computed independently with `ssh-keygen -H` semantics.
        let salt = [7u8; 20];
        let mac = hmac_sha1(&salt, "example.org");
        let line = format!(
            "|1|{}|{} ssh-ed25519 {ED}\n",
            BASE64.encode(&salt),
            BASE64.encode(&mac)
        );
        let (_d, files) = file_with(&line);
        assert!(matches!(
            check(&files, "example.org", &key(ED)).unwrap(),
            HostKeyStatus::Known { .. }
        ));
        assert_eq!(
            check(&files, "example.com", &key(ED)).unwrap(),
            HostKeyStatus::Unknown
        );
    }

    #[test]
    fn wildcards() {
        assert!(wildcard_match(b"*", b"anything"));
        assert!(wildcard_match(b"a*c", b"abbbc"));
        assert!(wildcard_match(b"a?c", b"abc"));
        assert!(!wildcard_match(b"a?c", b"ac"));
        assert!(!wildcard_match(b"*.corp", b"corp"));
        assert!(match_pattern_list("x,*.corp,!bad.corp", "Good.Corp"));
    }

    /// RevokedHostKeys: a listed key is found by its line; a line that is no public key is
    /// an error, as with ssh, never passed over (it may have meant to revoke this key).
    #[test]
    fn revoked_keys_file() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("revoked");
        std::fs::write(
            &file,
            format!("# old keys\n\nssh-ed25519 {ED2} a\nssh-ed25519 {ED} b\n"),
        )
        .unwrap();
        assert_eq!(revoked_in(&file, &key(ED)).unwrap(), Some(4));
        std::fs::write(&file, format!("ssh-ed25519 {ED2}\n")).unwrap();
        assert_eq!(revoked_in(&file, &key(ED)).unwrap(), None);
        for bad in [
            format!("[127.0.0.1]:22 ssh-ed25519 {ED}\n"),
            "garbage line\n".into(),
        ] {
            std::fs::write(&file, bad).unwrap();
            assert!(revoked_in(&file, &key(ED)).is_err());
        }
        assert!(revoked_in(&dir.path().join("missing"), &key(ED)).is_err());
    }
}
