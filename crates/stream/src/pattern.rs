//! Remote wildcards, as scp has them: `fastcp 'host:logs/*.txt' .`.
//!
//! The sending side expands a source that does not exist as named but holds `*`, `?` or `[`
//! ([`expand_sources`]); the receiving side then accepts at the top level only names that
//! equal what was asked for or match it as a pattern (see
//! [`ReceiveConfig::expected_top_level`](crate::ReceiveConfig::expected_top_level)), so a
//! hostile sender can answer `*.txt` with `a.txt` but not with `.bashrc` or `run.sh` (scp's
//! CVE-2019-6111). Both sides use the same rules: `*` and `?` match neither `/` nor a leading
//! `.`, `[...]` is a character class, and a backslash quotes the character after it, as in the
//! shell and scp (`'host:my\ file.txt'` names `my file.txt`).

use std::path::{Path, PathBuf};

use glob::{MatchOptions, Pattern};

/// Shell rules: `/` and a leading `.` only match literally.
const OPTIONS: MatchOptions = MatchOptions {
    case_sensitive: true,
    require_literal_separator: true,
    require_literal_leading_dot: true,
};

/// Whether `s` holds a wildcard character (`*`, `?` or `[`).
///
/// ```
/// assert!(fastcp_stream::has_wildcard(b"*.txt"));
/// assert!(!fastcp_stream::has_wildcard(b"notes.txt"));
/// ```
pub fn has_wildcard(s: &[u8]) -> bool {
    s.iter().any(|b| matches!(b, b'*' | b'?' | b'['))
}

/// Whether `s` is read as a pattern: it holds a wildcard or a backslash (which quotes the
/// character after it).
///
/// ```
/// assert!(fastcp_stream::is_pattern(b"my\\ file.txt"));
/// assert!(!fastcp_stream::is_pattern(b"plain.txt"));
/// ```
pub fn is_pattern(s: &[u8]) -> bool {
    has_wildcard(s) || s.contains(&b'\\')
}

/// `name`, a component with shell quoting, as a [`Pattern`]: a backslash quotes the character
/// after it (a wildcard character becomes a class of that one character), and a last one
/// stands for itself.
fn compile(name: &str) -> Option<Pattern> {
    let mut glob = String::with_capacity(name.len() + 4);
    let mut chars = name.chars();
    while let Some(c) = chars.next() {
        let quoted = if c == '\\' {
            chars.next().unwrap_or('\\')
        } else {
            glob.push(c);
            continue;
        };
        if matches!(quoted, '*' | '?' | '[' | ']' | '\\') {
            glob.push('[');
            glob.push(quoted);
            glob.push(']');
        } else {
            glob.push(quoted);
        }
    }
    Pattern::new(&glob).ok()
}

/// Replaces each source that does not exist as named and holds a wildcard by the paths it
/// matches, sorted; a source that matches nothing stays as it is, so that it fails as a
/// missing file would.
///
/// ```
/// use fastcp_stream::expand_sources;
///
/// let dir = tempfile::tempdir()?;
/// for name in ["a.txt", "b.txt", "c.log", ".hidden.txt"] {
///     std::fs::write(dir.path().join(name), name)?;
/// }
/// let got = expand_sources(&[dir.path().join("*.txt"), dir.path().join("none*")]);
/// assert_eq!(got, [dir.path().join("a.txt"), dir.path().join("b.txt"), dir.path().join("none*")]);
/// # Ok::<(), std::io::Error>(())
/// ```
pub fn expand_sources(sources: &[PathBuf]) -> Vec<PathBuf> {
    let mut out = Vec::with_capacity(sources.len());
    for source in sources {
        out.extend(expand(source).unwrap_or_else(|| vec![source.clone()]));
    }
    out
}

/// The matches of `source`, or `None` to keep it as it is.
fn expand(source: &Path) -> Option<Vec<PathBuf>> {
    let text = source.to_str()?;
    if !is_pattern(text.as_bytes()) || source.symlink_metadata().is_ok() {
        return None;
    }
    // One component at a time, listing only the folders a pattern is in. Names that are not
    // UTF-8 cannot match a pattern (which is text) and are passed over.
    let mut paths = vec![PathBuf::new()];
    for part in Path::new(text).components() {
        let std::path::Component::Normal(name) = part else {
            paths.iter_mut().for_each(|p| p.push(part));
            continue;
        };
        let name = name.to_str()?;
        if !is_pattern(name.as_bytes()) {
            paths.iter_mut().for_each(|p| p.push(name));
            continue;
        }
        let pattern = compile(name)?;
        let mut next = Vec::new();
        for dir in &paths {
            let listed = if dir.as_os_str().is_empty() {
                std::fs::read_dir(".")
            } else {
                std::fs::read_dir(dir)
            };
            let Ok(listed) = listed else { continue };
            for entry in listed.flatten() {
                let entry_name = entry.file_name();
                if entry_name
                    .to_str()
                    .is_some_and(|n| pattern.matches_with(n, OPTIONS))
                {
                    next.push(dir.join(entry_name));
                }
            }
        }
        paths = next;
    }
    let mut matches: Vec<PathBuf> = paths
        .into_iter()
        .filter(|p| p.symlink_metadata().is_ok())
        .collect();
    if matches.is_empty() {
        return None;
    }
    matches.sort();
    Some(matches)
}

/// Whether a top-level `name` that arrived is one the receiver asked for as `asked`: the same
/// name, or a match of it as a pattern.
///
/// ```
/// assert!(fastcp_stream::name_matches(b"*.txt", b"a.txt"));
/// assert!(!fastcp_stream::name_matches(b"*.txt", b".hidden.txt"));
/// ```
pub fn name_matches(asked: &[u8], name: &[u8]) -> bool {
    if asked == name {
        return true;
    }
    if !is_pattern(asked) {
        return false;
    }
    match (std::str::from_utf8(asked), std::str::from_utf8(name)) {
        (Ok(asked), Ok(name)) => compile(asked).is_some_and(|p| p.matches_with(name, OPTIONS)),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_match_like_the_shell() {
        assert!(name_matches(b"a.txt", b"a.txt"));
        assert!(!name_matches(b"a.txt", b"b.txt"));
        assert!(name_matches(b"*.txt", b"a.txt"));
        assert!(!name_matches(b"*.txt", b".hidden.txt"));
        assert!(!name_matches(b"*", b".bashrc"));
        assert!(!name_matches(b"*.txt", b"run.sh"));
        assert!(name_matches(b"file?.[ch]", b"file1.c"));
        assert!(!name_matches(b"file?.[ch]", b"file10.c"));
        assert!(!name_matches(b"*", b"a/b"));
        // A name that is literally a pattern is still accepted as itself.
        assert!(name_matches(b"[x]", b"[x]"));
        assert!(name_matches(b"[x]", b"x"));
    }

    #[test]
    fn dot_names_match_a_leading_dot_and_odd_names_are_passed_over() {
        use std::os::unix::ffi::OsStrExt;
        let dir = tempfile::tempdir().unwrap();
        for name in [&b".hidden"[..], b"vis", b"ok.txt", b"bad\xff.txt"] {
            std::fs::write(dir.path().join(std::ffi::OsStr::from_bytes(name)), name).unwrap();
        }
        let d = dir.path();
        assert_eq!(expand_sources(&[d.join(".h*")]), [d.join(".hidden")]);
        assert_eq!(
            expand_sources(&[d.join("*")]),
            [d.join("ok.txt"), d.join("vis")]
        );
        assert_eq!(expand_sources(&[d.join("*.txt")]), [d.join("ok.txt")]);
        std::fs::create_dir(d.join("sub")).unwrap();
        std::fs::write(d.join("sub/x.txt"), b"x").unwrap();
        assert_eq!(expand_sources(&[d.join("s*/*.txt")]), [d.join("sub/x.txt")]);
        assert!(name_matches(b".h*", b".hidden"));
    }

    #[test]
    fn existing_names_are_not_expanded() {
        let dir = tempfile::tempdir().unwrap();
        for name in ["[x]", "x"] {
            std::fs::write(dir.path().join(name), name).unwrap();
        }
        let literal = dir.path().join("[x]");
        assert_eq!(expand_sources(std::slice::from_ref(&literal)), [literal]);
    }

    #[test]
    fn a_backslash_quotes_the_next_character() {
        assert!(name_matches(b"my\\ file.txt", b"my file.txt"));
        assert!(name_matches(b"star\\*", b"star*"));
        assert!(!name_matches(b"star\\*", b"starry"));
        assert!(name_matches(b"q\\?\\[x\\]\\\\", b"q?[x]\\"));
        assert!(name_matches(b"\\a*", b"ab"));
        assert!(!name_matches(b"x\\ y", b"x\\ z"));
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        for name in ["my file.txt", "star*", "starry", "back\\slash"] {
            std::fs::write(d.join(name), name).unwrap();
        }
        std::fs::create_dir(d.join("my dir")).unwrap();
        std::fs::write(d.join("my dir/f"), b"f").unwrap();
        assert_eq!(
            expand_sources(&[d.join("my\\ file.txt")]),
            [d.join("my file.txt")]
        );
        assert_eq!(expand_sources(&[d.join("star\\*")]), [d.join("star*")]);
        assert_eq!(
            expand_sources(&[d.join("my\\ dir/f")]),
            [d.join("my dir/f")]
        );
        // A name that holds a backslash is itself first.
        let literal = d.join("back\\slash");
        assert_eq!(expand_sources(std::slice::from_ref(&literal)), [literal]);
    }

    #[test]
    fn wildcards_in_directories_expand_too() {
        let dir = tempfile::tempdir().unwrap();
        for d in ["one", "two", ".three"] {
            std::fs::create_dir(dir.path().join(d)).unwrap();
            std::fs::write(dir.path().join(d).join("f"), d).unwrap();
        }
        let got = expand_sources(&[dir.path().join("*/f")]);
        assert_eq!(got, [dir.path().join("one/f"), dir.path().join("two/f")]);
    }
}
