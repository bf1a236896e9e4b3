//! Include and exclude rules for the walk, with rsync's meaning.
//!
//! Rules are tried in order against each entry's wire path (which starts with its source's
//! name); the first that matches decides, and an entry no rule matches is included. An
//! excluded directory is not descended into. A pattern
//!
//! - ending in `/` matches directories only;
//! - starting with `/` is anchored: it matches the whole wire path (`/src/build` is `build`
//!   at the top of the source `src`);
//! - containing another `/` matches the end of the path, at a component boundary
//!   (`docs/*.md` matches `src/docs/a.md` and `src/x/docs/b.md`);
//! - else matches the entry's name alone (`*.o` matches `*.o` files at any depth).
//!
//! `*` and `?` never match `/`; `**` as a whole component matches any number of directories;
//! `[...]` is a character class.
//!
//! ```
//! use fastcp_stream::Filter;
//!
//! let mut f = Filter::default();
//! f.include("keep.o").unwrap();
//! f.exclude("*.o").unwrap();
//! f.exclude("/src/target/").unwrap();
//! assert!(!f.allows(b"src/a/b.o", false));
//! assert!(f.allows(b"src/a/keep.o", false));
//! assert!(!f.allows(b"src/target", true));
//! assert!(f.allows(b"src/a/target", true));
//! ```

use std::fmt;
use std::sync::Arc;

use glob::{MatchOptions, Pattern};

use crate::Error;

/// A caller's own test, after the rules: `false` leaves the entry out.
pub type Predicate = Arc<dyn Fn(&[u8], bool) -> bool + Send + Sync>;

/// Ordered include and exclude rules, and an optional predicate.
#[derive(Clone, Default)]
pub struct Filter {
    rules: Vec<Rule>,
    predicate: Option<Predicate>,
    only: Option<Arc<Only>>,
}

/// A list of files in place of a walk (rsync's `--files-from`).
#[derive(Debug, Default)]
struct Only {
    /// The listed paths, relative to a source's top.
    listed: std::collections::HashSet<Vec<u8>>,
    /// Their parent directories.
    parents: std::collections::HashSet<Vec<u8>>,
}

impl Only {
    /// Whether the entry at `wire` (its first component is the source's top) is listed,
    /// leads to a listed path, or lies beneath a listed directory.
    fn allows(&self, wire: &[u8], is_dir: bool) -> bool {
        let Some(i) = wire.iter().position(|&b| b == b'/') else {
            return true;
        };
        let rel = &wire[i + 1..];
        if self.listed.contains(rel) || (is_dir && self.parents.contains(rel)) {
            return true;
        }
        rel.iter()
            .enumerate()
            .any(|(i, &b)| b == b'/' && self.listed.contains(&rel[..i]))
    }
}

#[derive(Clone, Debug)]
struct Rule {
    include: bool,
    /// As given, for the wire and for messages.
    text: String,
    pattern: Pattern,
    dir_only: bool,
    anchored: bool,
    /// The pattern has a '/' inside: it matches the end of the path.
    has_slash: bool,
}

impl fmt::Debug for Filter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Filter")
            .field("rules", &self.rules())
            .field("predicate", &self.predicate.is_some())
            .field("files_from", &self.only.as_ref().map(|o| o.listed.len()))
            .finish()
    }
}

const OPTIONS: MatchOptions = MatchOptions {
    case_sensitive: true,
    require_literal_separator: true,
    require_literal_leading_dot: false,
};

impl Filter {
    /// Adds a rule that includes what `pattern` matches (rsync's `--include`).
    pub fn include(&mut self, pattern: &str) -> Result<(), Error> {
        self.push(true, pattern)
    }

    /// Adds a rule that excludes what `pattern` matches (rsync's `--exclude`).
    pub fn exclude(&mut self, pattern: &str) -> Result<(), Error> {
        self.push(false, pattern)
    }

    /// Adds the rules of a rule list: one a line, `+ PATTERN` to include, `- PATTERN` or a
    /// bare pattern to exclude (as rsync's `--exclude-from`); blank lines and lines starting
    /// with `#` or `;` are skipped.
    pub fn add_rules(&mut self, text: &str) -> Result<(), Error> {
        for line in text.lines() {
            let line = line.trim_end_matches('\r');
            if line.trim().is_empty() || line.starts_with('#') || line.starts_with(';') {
                continue;
            }
            match (line.strip_prefix("+ "), line.strip_prefix("- ")) {
                (Some(p), _) => self.include(p)?,
                (_, Some(p)) => self.exclude(p)?,
                _ => self.exclude(line)?,
            }
        }
        Ok(())
    }

    /// Leaves out every entry `keep` returns false for (given the wire path and whether it
    /// is a directory), after the rules let it through. It runs on the sending side only,
    /// so it is for local sources (a push or a local copy).
    pub fn with_predicate(mut self, keep: Predicate) -> Filter {
        self.predicate = Some(keep);
        self
    }

    /// Copies only the listed paths (rsync's `--files-from`): each is relative to a source's
    /// top (`d/f` for `SRC/d/f`), `/`-separated; a listed directory brings what is beneath
    /// it (with recursion), and the directories that lead to a listed path are made. Like a
    /// predicate it runs on the sending side only, so it is for local sources. Blank lines
    /// and a leading `./` or `/` are ignored.
    ///
    /// ```
    /// let filter = fastcp_stream::Filter::default().files_from(["a/b.txt", "c/"]);
    /// assert!(filter.allows(b"src", true));
    /// assert!(filter.allows(b"src/a", true));
    /// assert!(filter.allows(b"src/a/b.txt", false));
    /// assert!(!filter.allows(b"src/a/other.txt", false));
    /// assert!(filter.allows(b"src/c/deep/x", false));
    /// assert!(!filter.allows(b"src/d", true));
    /// ```
    pub fn files_from<P: AsRef<[u8]>>(mut self, paths: impl IntoIterator<Item = P>) -> Filter {
        let mut only = Only::default();
        for p in paths {
            let mut p = p.as_ref();
            while let Some(rest) = p.strip_prefix(b"./").or_else(|| p.strip_prefix(b"/")) {
                p = rest;
            }
            while let Some(rest) = p.strip_suffix(b"/") {
                p = rest;
            }
            if p.is_empty() {
                continue;
            }
            let mut at = 0;
            while let Some(i) = p[at..].iter().position(|&b| b == b'/') {
                only.parents.insert(p[..at + i].to_vec());
                at += i + 1;
            }
            only.listed.insert(p.to_vec());
        }
        self.only = Some(Arc::new(only));
        self
    }

    /// The rules as `+ PATTERN` and `- PATTERN` lines, the form [`Filter::add_rules`]
    /// reads (and the protocol carries).
    pub fn rules(&self) -> Vec<String> {
        self.rules
            .iter()
            .map(|r| format!("{} {}", if r.include { '+' } else { '-' }, r.text))
            .collect()
    }

    /// Whether a predicate ([`Filter::with_predicate`]) was set: code, which only the side
    /// that holds it can run, so it never travels.
    pub fn has_predicate(&self) -> bool {
        self.predicate.is_some()
    }

    /// The paths of the [`Filter::files_from`] list, sorted, as the protocol carries them;
    /// `None` without a list.
    pub fn listed(&self) -> Option<Vec<Vec<u8>>> {
        let only = self.only.as_ref()?;
        let mut v: Vec<Vec<u8>> = only.listed.iter().cloned().collect();
        v.sort_unstable();
        Some(v)
    }

    /// The [`Filter::files_from`] list alone, without the rules or the predicate; `None`
    /// without a list. What a mirror still spares with rsync's `--delete-excluded`, which
    /// removes what the rules exclude but keeps what lies outside the list.
    ///
    /// ```
    /// let mut filter = fastcp_stream::Filter::default().files_from(["a/"]);
    /// filter.exclude("*.o").unwrap();
    /// let list = filter.files_from_only().unwrap();
    /// assert!(!filter.allows(b"src/a/x.o", false));
    /// assert!(list.allows(b"src/a/x.o", false));
    /// assert!(!list.allows(b"src/b", true));
    /// assert!(fastcp_stream::Filter::default().files_from_only().is_none());
    /// ```
    pub fn files_from_only(&self) -> Option<Filter> {
        Some(Filter {
            only: Some(self.only.clone()?),
            ..Filter::default()
        })
    }

    /// Whether there are no rules, no predicate and no list.
    pub fn is_empty(&self) -> bool {
        self.rules.is_empty() && self.predicate.is_none() && self.only.is_none()
    }

    /// Whether the entry at `wire` (a directory or not) is copied.
    pub fn allows(&self, wire: &[u8], is_dir: bool) -> bool {
        if let Some(only) = &self.only
            && !only.allows(wire, is_dir)
        {
            return false;
        }
        let path = String::from_utf8_lossy(wire);
        for r in &self.rules {
            if r.dir_only && !is_dir {
                continue;
            }
            if r.matches(&path) {
                return r.include;
            }
        }
        self.predicate
            .as_ref()
            .is_none_or(|keep| keep(wire, is_dir))
    }

    fn push(&mut self, include: bool, pattern: &str) -> Result<(), Error> {
        if pattern.is_empty() {
            return Err(Error::InvalidArgument("an empty filter pattern".into()));
        }
        let dir_only = pattern.len() > 1 && pattern.ends_with('/');
        let body = pattern.trim_end_matches('/');
        let anchored = body.starts_with('/');
        let body = body.trim_start_matches('/');
        let compiled = Pattern::new(body)
            .map_err(|e| Error::InvalidArgument(format!("filter pattern {pattern:?}: {e}")))?;
        self.rules.push(Rule {
            include,
            text: pattern.to_owned(),
            pattern: compiled,
            dir_only,
            anchored,
            has_slash: body.contains('/'),
        });
        Ok(())
    }
}

impl Rule {
    fn matches(&self, path: &str) -> bool {
        if self.anchored {
            return self.pattern.matches_with(path, OPTIONS);
        }
        if !self.has_slash {
            let name = path.rsplit('/').next().unwrap_or(path);
            return self.pattern.matches_with(name, OPTIONS);
        }
        // The end of the path, at each component boundary.
        std::iter::once(0)
            .chain(path.match_indices('/').map(|(i, _)| i + 1))
            .any(|start| self.pattern.matches_with(&path[start..], OPTIONS))
    }
}

/// The paths of a [`Filter::files_from`] list that a walk has not come to yet: those left at
/// its end are missing from the source, and are reported as not found, as rsync reports
/// them. fastcp's own walk keeps one; a program that lists a source its own way (over SFTP,
/// say) tells one of every entry it comes to and of every folder it does not look into.
///
/// ```
/// use fastcp_stream::{Filter, Unfound};
///
/// let filter = Filter::default().files_from(["a/b", "c/d", "e"]);
/// let mut unfound = Unfound::of(&filter).unwrap();
/// unfound.came_to(b"src/a/b"); // wire paths: the source's top first
/// unfound.not_looked_into(b"src/c"); // left out by a rule, or not listable
/// assert_eq!(unfound.missing().collect::<Vec<_>>(), [b"e".to_vec()]);
/// ```
#[derive(Debug, Clone, Default)]
pub struct Unfound(std::collections::BTreeSet<Vec<u8>>);

impl Unfound {
    /// The paths `filter` lists, if it has a list.
    pub fn of(filter: &Filter) -> Option<Unfound> {
        filter.listed().map(|l| Unfound(l.into_iter().collect()))
    }

    /// The walk came to the entry at `wire` (its first component is the source's top), which
    /// is found whether or not the rules keep it.
    pub fn came_to(&mut self, wire: &[u8]) {
        self.0.remove(below_top(wire));
    }

    /// The walk does not look into `wire` (a rule leaves it out, or it could not be listed):
    /// the listed paths beneath it are not missing either. The source's top stands for
    /// every path.
    pub fn not_looked_into(&mut self, wire: &[u8]) {
        let mut beneath = below_top(wire).to_vec();
        if !beneath.is_empty() {
            beneath.push(b'/');
        }
        let gone: Vec<Vec<u8>> = self
            .0
            .range(beneath.clone()..)
            .take_while(|p| p.starts_with(&beneath))
            .cloned()
            .collect();
        for p in gone {
            self.0.remove(&p);
        }
    }

    /// Keeps only the paths for which `keep` is true.
    pub fn retain(&mut self, mut keep: impl FnMut(&[u8]) -> bool) {
        self.0.retain(|p| keep(p));
    }

    /// The next path the walk never came to, in order.
    pub fn pop_missing(&mut self) -> Option<Vec<u8>> {
        self.0.pop_first()
    }

    /// The paths the walk never came to, in order.
    pub fn missing(self) -> impl Iterator<Item = Vec<u8>> {
        self.0.into_iter()
    }
}

/// A wire path without its first component (the source's top): empty for the top itself.
fn below_top(wire: &[u8]) -> &[u8] {
    let at = wire
        .iter()
        .position(|&b| b == b'/')
        .map_or(wire.len(), |i| i + 1);
    &wire[at..]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rsync_meanings() {
        let mut f = Filter::default();
        f.add_rules("# comment\n+ important.log\n- *.log\n- /t/cache/\ndocs/*.tmp\n\n")
            .unwrap();
        assert!(f.allows(b"t/a/important.log", false));
        assert!(!f.allows(b"t/a/b/c.log", false));
        assert!(!f.allows(b"t/cache", true));
        assert!(f.allows(b"t/cache", false), "dir-only rule");
        assert!(f.allows(b"t/x/cache", true), "anchored rule");
        assert!(!f.allows(b"t/docs/a.tmp", false));
        assert!(!f.allows(b"t/x/docs/a.tmp", false));
        assert!(f.allows(b"t/docs/sub/a.tmp", false), "* does not cross /");
        assert!(f.allows(b"t/readme", false));
        assert_eq!(
            f.rules(),
            ["+ important.log", "- *.log", "- /t/cache/", "- docs/*.tmp"]
        );
        let mut again = Filter::default();
        again.add_rules(&f.rules().join("\n")).unwrap();
        assert_eq!(again.rules(), f.rules());
        let mut deep = Filter::default();
        deep.exclude("/t/**/gen").unwrap();
        assert!(!deep.allows(b"t/a/b/gen", false));
        assert!(Filter::default().exclude("[").is_err());
    }

    #[test]
    fn the_predicate_comes_after_the_rules() {
        let f = Filter::default().with_predicate(Arc::new(|wire: &[u8], _| !wire.ends_with(b"~")));
        assert!(!f.allows(b"t/a~", false));
        assert!(f.allows(b"t/a", false));
    }
}
