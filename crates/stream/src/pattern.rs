//! Remote wildcards, as scp has them: `fastcp 'host:logs/*.txt' .`.
//!
//! The sending side expands a source that does not exist as named but holds `*`, `?` or `[`
//! ([`expand_sources`]); the receiving side then accepts at the top level only names that
//! equal what was asked for or match it as a pattern (see
//! [`ReceiveConfig::expected_top_level`](crate::ReceiveConfig::expected_top_level)), so a
//! hostile sender can answer `*.txt` with `a.txt` but not with `.bashrc` or `run.sh` (scp's
//! CVE-2019-6111). Both sides use the same rules: `*` and `?` match neither `/` nor a leading
//! `.`, `[...]` is a character class, and a backslash quotes the character after it, as in the
//! shell and scp (`'host:my\ file.txt'` names `my file.txt`). Names are matched as bytes, as
//! they are on disk: `?` takes one UTF-8 character, or one byte that is not part of one, so a
//! name that is not UTF-8 matches as any other does.

use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

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

/// One character of a name: a UTF-8 character, or a byte that is not part of one (names are
/// bytes, and need not be UTF-8).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Unit {
    Char(char),
    Byte(u8),
}

/// The characters of `s`, each byte that is not part of a UTF-8 character standing alone.
fn units(s: &[u8]) -> Vec<Unit> {
    let mut out = Vec::with_capacity(s.len());
    for chunk in s.utf8_chunks() {
        out.extend(chunk.valid().chars().map(Unit::Char));
        out.extend(chunk.invalid().iter().map(|&b| Unit::Byte(b)));
    }
    out
}

/// One element of a compiled pattern.
#[derive(Debug)]
enum Token {
    /// This character only.
    Literal(Unit),
    /// `?`: any one character.
    Any,
    /// `*`: any run of characters, the empty one too.
    Star,
    /// `[...]`: one character among `ranges` (inclusive), or, `negated` (`[!...]`), one
    /// character not among them.
    Class {
        negated: bool,
        ranges: Vec<(Unit, Unit)>,
    },
}

/// A name's pattern, one component with shell quoting: `*`, `?`, `[...]` (`[!...]` negated,
/// `a-z` a range, a `]` first a member), and a backslash that quotes the character after it
/// (a last one stands for itself). A `[` with no `]` to close it stands for itself, as in the
/// shell.
#[derive(Debug)]
struct Glob(Vec<Token>);

impl Glob {
    /// Compiles `pattern`, which need not be UTF-8.
    fn new(pattern: &[u8]) -> Glob {
        let units = units(pattern);
        let mut tokens = Vec::new();
        let mut i = 0;
        while i < units.len() {
            let token = match units[i] {
                Unit::Char('\\') => {
                    i += 1;
                    Token::Literal(units.get(i).copied().unwrap_or(Unit::Char('\\')))
                }
                Unit::Char('?') => Token::Any,
                Unit::Char('*') if matches!(tokens.last(), Some(Token::Star)) => {
                    i += 1;
                    continue;
                }
                Unit::Char('*') => Token::Star,
                Unit::Char('[') => match class(&units[i + 1..]) {
                    Some((token, used)) => {
                        i += used;
                        token
                    }
                    None => Token::Literal(Unit::Char('[')),
                },
                unit => Token::Literal(unit),
            };
            tokens.push(token);
            i += 1;
        }
        Glob(tokens)
    }

    /// Whether the single name `name` matches: `/` is matched by nothing, and a leading `.`
    /// only by a literal `.`, as in the shell.
    fn matches(&self, name: &[u8]) -> bool {
        let name = units(name);
        if name.first() == Some(&Unit::Char('.'))
            && !matches!(self.0.first(), Some(Token::Literal(Unit::Char('.'))))
        {
            return false;
        }
        // Each token but `*` takes one character; on a mismatch, the last `*` takes one
        // more and the match goes on from there.
        let (mut t, mut n) = (0, 0);
        let mut star: Option<(usize, usize)> = None;
        while n < name.len() {
            match self.0.get(t) {
                Some(Token::Star) => {
                    star = Some((t, n));
                    t += 1;
                    continue;
                }
                Some(token) if takes(token, name[n]) => {
                    t += 1;
                    n += 1;
                    continue;
                }
                _ => {}
            }
            match star {
                Some((st, sn)) if name[sn] != Unit::Char('/') => {
                    star = Some((st, sn + 1));
                    t = st + 1;
                    n = sn + 1;
                }
                _ => return false,
            }
        }
        self.0[t..].iter().all(|token| matches!(token, Token::Star))
    }
}

/// Whether the one-character `token` takes `unit`.
fn takes(token: &Token, unit: Unit) -> bool {
    if unit == Unit::Char('/') {
        return matches!(token, Token::Literal(u) if *u == unit);
    }
    match token {
        Token::Literal(u) => *u == unit,
        Token::Any => true,
        Token::Star => false,
        Token::Class { negated, ranges } => {
            ranges.iter().any(|&(lo, hi)| in_range(lo, hi, unit)) != *negated
        }
    }
}

/// Whether `unit` is in `lo..=hi`: characters by code point, a byte alone only as itself.
fn in_range(lo: Unit, hi: Unit, unit: Unit) -> bool {
    match (lo, hi, unit) {
        (Unit::Char(lo), Unit::Char(hi), Unit::Char(c)) => (lo..=hi).contains(&c),
        _ => lo == unit && hi == unit,
    }
}

/// The class that `rest` (what follows a `[`) opens, and how many of its characters it takes
/// with the closing `]`; `None` when nothing closes it.
fn class(rest: &[Unit]) -> Option<(Token, usize)> {
    let mut i = 0;
    let negated = rest.first() == Some(&Unit::Char('!'));
    if negated {
        i += 1;
    }
    let mut ranges = Vec::new();
    let mut first = true;
    loop {
        let mut lo = *rest.get(i)?;
        if lo == Unit::Char(']') && !first {
            return Some((Token::Class { negated, ranges }, i + 1));
        }
        first = false;
        if lo == Unit::Char('\\') {
            i += 1;
            lo = *rest.get(i)?;
        }
        i += 1;
        let mut hi = lo;
        if rest.get(i) == Some(&Unit::Char('-'))
            && rest.get(i + 1).is_some_and(|u| *u != Unit::Char(']'))
        {
            i += 1;
            hi = rest[i];
            if hi == Unit::Char('\\') {
                i += 1;
                hi = *rest.get(i)?;
            }
            i += 1;
        }
        ranges.push((lo, hi));
    }
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
    if !is_pattern(source.as_os_str().as_bytes()) || source.symlink_metadata().is_ok() {
        return None;
    }
    // One component at a time, listing only the folders a pattern is in. Names are matched
    // as bytes: one that is not UTF-8 matches as any other does.
    let mut paths = vec![PathBuf::new()];
    for part in source.components() {
        let Component::Normal(name) = part else {
            paths.iter_mut().for_each(|p| p.push(part));
            continue;
        };
        if !is_pattern(name.as_bytes()) {
            paths.iter_mut().for_each(|p| p.push(name));
            continue;
        }
        let pattern = Glob::new(name.as_bytes());
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
                if pattern.matches(entry_name.as_bytes()) {
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
    Glob::new(asked).matches(name)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::OsStr;

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
    fn dot_names_match_a_leading_dot_and_odd_names_match_too() {
        let dir = tempfile::tempdir().unwrap();
        for name in [&b".hidden"[..], b"vis", b"ok.txt", b"bad\xff.txt"] {
            std::fs::write(dir.path().join(OsStr::from_bytes(name)), name).unwrap();
        }
        let d = dir.path();
        let bad = d.join(OsStr::from_bytes(b"bad\xff.txt"));
        assert_eq!(expand_sources(&[d.join(".h*")]), [d.join(".hidden")]);
        assert_eq!(
            expand_sources(&[d.join("*")]),
            [bad.clone(), d.join("ok.txt"), d.join("vis")]
        );
        assert_eq!(
            expand_sources(&[d.join("*.txt")]),
            [bad.clone(), d.join("ok.txt")]
        );
        assert_eq!(
            expand_sources(&[d.join("bad?.txt")]),
            std::slice::from_ref(&bad)
        );
        assert_eq!(expand_sources(&[d.join("bad[!x].*")]), [bad]);
        std::fs::create_dir(d.join("sub")).unwrap();
        std::fs::write(d.join("sub/x.txt"), b"x").unwrap();
        assert_eq!(expand_sources(&[d.join("s*/*.txt")]), [d.join("sub/x.txt")]);
        assert!(name_matches(b".h*", b".hidden"));
    }

    #[test]
    fn names_match_as_bytes() {
        // `?` takes one byte that is not part of a UTF-8 character, or one character.
        assert!(name_matches(b"b?.txt", b"b\xff.txt"));
        assert!(!name_matches(b"b?.txt", b"b\xff\xfe.txt"));
        assert!(name_matches(b"b??.txt", b"b\xff\xfe.txt"));
        assert!(name_matches("?.txt".as_bytes(), "é.txt".as_bytes()));
        assert!(name_matches(b"*", b"\xff"));
        assert!(name_matches(b"*.txt", b"\xe9t\xe9.txt"));
        assert!(!name_matches(b"*.txt", b"\xff.log"));
        assert!(name_matches(b"[!a]*", b"\xffa"));
        assert!(!name_matches(b"[a-z]*", b"\xffa"));
        assert!(name_matches("[é]".as_bytes(), "é".as_bytes()));
        // A pattern that is not UTF-8 matches its own bytes.
        assert!(name_matches(b"\xff*", b"\xff.txt"));
        assert!(!name_matches(b"?", b"."));
        assert!(!name_matches(b"[.]x", b".x"));
        assert!(name_matches(b".?", b".\xff"));
    }

    #[test]
    fn classes_and_stars_read_as_in_the_shell() {
        assert!(name_matches(b"[]]", b"]"));
        assert!(name_matches(b"[!]]", b"x"));
        assert!(!name_matches(b"[!]]", b"]"));
        assert!(name_matches(b"[a-]", b"-"));
        assert!(name_matches(b"[a-c]x", b"bx"));
        assert!(!name_matches(b"[a-c]x", b"dx"));
        assert!(name_matches(b"[\\]]", b"]"));
        // A `[` that nothing closes stands for itself.
        assert!(name_matches(b"a[*", b"a[bc"));
        assert!(!name_matches(b"a[*", b"abc"));
        assert!(name_matches(b"a**b", b"axyb"));
        assert!(name_matches(b"*a*b*", b"xxaxxbxx"));
        assert!(!name_matches(b"*a*b", b"xxaxxbxx"));
        assert!(name_matches(b"*", b""));
    }

    proptest::proptest! {
        /// Any pattern and name, of any bytes, match or not without a panic; a name that is
        /// not a pattern matches itself, and `*` matches every name without a leading `.`.
        #[test]
        fn any_bytes_match_without_panic(
            pattern in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..24),
            name in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..24),
        ) {
            let _ = name_matches(&pattern, &name);
            if !is_pattern(&name) {
                proptest::prop_assert!(name_matches(&name, &name));
            }
            let plain = !name.contains(&b'/') && name.first() != Some(&b'.');
            proptest::prop_assert_eq!(name_matches(b"*", &name), plain);
        }
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
