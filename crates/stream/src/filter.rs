//! Include and exclude rules for the walk, with rsync's meaning.
//!
//! Rules are tried in order against each entry's path; the first that matches decides, and an
//! entry no rule matches is included. An excluded directory is not descended into. The path
//! is the entry's wire path, which starts with its source's name (`src/a/b.o` for
//! `fastcp -r src dest`, as for `rsync -r src dest`), or, for a filter
//! [rooted in the source](Filter::rooted_in_source) (`fastcp -r src/. dest`, as for
//! `rsync -r src/ dest`), the path beneath the source (`a/b.o`). A pattern
//!
//! - ending in `/` matches directories only;
//! - starting with `/` is anchored: it matches the whole path (`/src/build` is `build` at
//!   the top of the source `src`);
//! - containing another `/`, or `**`, matches the end of the path, at a component boundary
//!   (`docs/*.md` matches `src/docs/a.md` and `src/x/docs/b.md`);
//! - else matches the entry's name alone (`*.o` matches `*.o` files at any depth).
//!
//! The wildcards are rsync's: `*` and `?` never match `/`, `**` does (`/src/**/gen`), a
//! trailing `/***` matches a directory and everything beneath it, `[...]` is a character
//! class (`[!...]` or `[^...]` negated, `[[:digit:]]` and the other POSIX classes), and in a
//! pattern with a wildcard a backslash quotes the character after it (`file\?` is the name
//! `file?`; a pattern without wildcards is taken as it is, backslashes too). Names are matched
//! as bytes, as on disk: `?` takes one byte.
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

use crate::Error;

/// A caller's own test, after the rules: `false` leaves the entry out.
pub type Predicate = Arc<dyn Fn(&[u8], bool) -> bool + Send + Sync>;

/// Ordered include and exclude rules, and an optional predicate.
#[derive(Clone, Default)]
pub struct Filter {
    rules: Vec<Rule>,
    predicate: Option<Predicate>,
    only: Option<Arc<Only>>,
    /// The rules match the path beneath the source's top ([`Filter::rooted_in_source`]).
    rooted_in_source: bool,
}

/// A list of files in place of a walk (rsync's `--files-from`).
#[derive(Debug, Default)]
struct Only {
    /// The listed paths, relative to a source's top, in order.
    listed: std::collections::BTreeSet<Vec<u8>>,
    /// Their parent directories.
    parents: std::collections::HashSet<Vec<u8>>,
}

/// Where an entry stands with a [`Filter::files_from`] list.
enum Place<'a> {
    /// Listed, beneath a listed directory, or a source's top: the rules decide.
    Listed,
    /// A directory that only leads to listed paths (rsync's implied directory), at `rel`
    /// beneath the source's top.
    Leading(&'a [u8]),
    /// Neither: left out.
    Outside,
}

impl Only {
    /// Where the entry at `wire` (its first component is the source's top) stands.
    fn place<'a>(&self, wire: &'a [u8], is_dir: bool) -> Place<'a> {
        let Some(i) = wire.iter().position(|&b| b == b'/') else {
            return Place::Listed;
        };
        let rel = &wire[i + 1..];
        if self.listed.contains(rel)
            || rel
                .iter()
                .enumerate()
                .any(|(i, &b)| b == b'/' && self.listed.contains(&rel[..i]))
        {
            return Place::Listed;
        }
        if is_dir && self.parents.contains(rel) {
            return Place::Leading(rel);
        }
        Place::Outside
    }

    /// The listed paths beneath the directory at `rel`, each with whether it is known to be
    /// a directory (it leads to further listed paths).
    fn beneath<'a>(&'a self, rel: &[u8]) -> impl Iterator<Item = (&'a [u8], bool)> + 'a {
        let mut prefix = rel.to_vec();
        prefix.push(b'/');
        self.listed
            .range(prefix.clone()..)
            .take_while(move |p| p.starts_with(&prefix))
            .map(|p| (&p[..], self.parents.contains(p)))
    }
}

/// One include or exclude rule, read as rsync reads it.
#[derive(Clone, Debug)]
struct Rule {
    include: bool,
    /// As given (without a `+ ` or `- ` prefix), for the wire and for messages.
    text: String,
    /// The pattern without its leading `/` and one trailing `/`.
    pattern: Vec<u8>,
    /// It ended in `/`: it matches directories only.
    dir_only: bool,
    /// It started with `/`: it matches the whole path.
    anchored: bool,
    /// How many `/` it holds (a leading one too, not the trailing one).
    slashes: usize,
    /// It holds `*`, `?` or `[`: a backslash quotes, and it is matched as a wildcard.
    wild: bool,
    /// It holds `**`, which crosses `/`.
    double_star: bool,
    /// It starts with `**`: it may match from the start of the path, as if after a `/`.
    double_star_first: bool,
    /// It ends with `***`: `dir/***` matches `dir` itself too.
    triple_star_last: bool,
    /// A `*` then a plain end (`*.o`, `*~`): it matches a name ending in that end, tested
    /// without the wildcard matcher.
    star_suffix: Option<Vec<u8>>,
}

impl fmt::Debug for Filter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Filter")
            .field("rules", &self.rules())
            .field("predicate", &self.predicate.is_some())
            .field("files_from", &self.only.as_ref().map(|o| o.listed.len()))
            .field("rooted_in_source", &self.rooted_in_source)
            .finish()
    }
}

impl Filter {
    /// Adds a rule that includes what `pattern` matches (rsync's `--include`). As with
    /// rsync, a `- ` prefix makes it an exclude rule and a `+ ` prefix is dropped, and `!`
    /// alone clears the rules added so far.
    pub fn include(&mut self, pattern: &str) -> Result<(), Error> {
        self.push(true, pattern)
    }

    /// Adds a rule that excludes what `pattern` matches (rsync's `--exclude`). As with
    /// rsync, a `+ ` prefix makes it an include rule and a `- ` prefix is dropped, and `!`
    /// alone clears the rules added so far.
    ///
    /// ```
    /// let mut f = fastcp_stream::Filter::default();
    /// f.exclude("*.o").unwrap();
    /// f.exclude("!").unwrap();
    /// f.exclude("+ keep.c").unwrap();
    /// f.exclude("*.c").unwrap();
    /// assert_eq!(f.rules(), ["+ keep.c", "- *.c"]);
    /// ```
    pub fn exclude(&mut self, pattern: &str) -> Result<(), Error> {
        self.push(false, pattern)
    }

    /// Adds the rules of a rule list: one a line, `+ PATTERN` to include, `- PATTERN` or a
    /// bare pattern to exclude (as rsync's `--exclude-from`), `!` to clear the rules so far;
    /// lines starting with `#` or `;` are skipped, and so are blank lines. A line may end in
    /// `\r\n`.
    pub fn add_rules(&mut self, text: &str) -> Result<(), Error> {
        self.add_lines(false, text)
    }

    /// Adds the rules of a list whose bare patterns include (rsync's `--include-from`):
    /// as [`Filter::add_rules`], but a line without a `+ ` or `- ` prefix includes.
    pub fn add_include_rules(&mut self, text: &str) -> Result<(), Error> {
        self.add_lines(true, text)
    }

    fn add_lines(&mut self, include: bool, text: &str) -> Result<(), Error> {
        for line in text.lines() {
            let line = line.trim_end_matches('\r');
            if line.trim().is_empty() || line.starts_with('#') || line.starts_with(';') {
                continue;
            }
            self.push(include, line)?;
        }
        Ok(())
    }

    /// Matches the rules against the path beneath the source's top, the top's own name left
    /// out: what rsync does for a source named with a trailing slash (`rsync -r src/ dest`),
    /// and so fastcp for a folder's contents (`fastcp -r src/. dest`), where `/build` is
    /// `src/build` and `*/c` needs a folder beneath `src`. Without it the path starts with
    /// the source's name, as rsync's does for `rsync -r src dest`. The top itself is never
    /// matched.
    ///
    /// ```
    /// let mut f = fastcp_stream::Filter::default();
    /// f.exclude("/build/").unwrap();
    /// assert!(f.allows(b"src/build", true));
    /// let f = f.rooted_in_source();
    /// assert!(!f.allows(b"src/build", true));
    /// assert!(f.allows(b"src/a/build", true));
    /// ```
    pub fn rooted_in_source(mut self) -> Filter {
        self.rooted_in_source = true;
        self
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
    /// it (with recursion), and the directories that lead to a listed path are made when the
    /// rules let it through (see [`Filter::allows`]). Like a
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
        Some(self.only.as_ref()?.listed.iter().cloned().collect())
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
    ///
    /// With a [`Filter::files_from`] list, a directory that only leads to listed paths is
    /// not asked of the rules, as rsync does not ask them of its implied directories: it is
    /// copied when one of the listed paths beneath it is (one the rules let through as a
    /// file or as a directory), so that no empty folder leads to what the rules leave out.
    ///
    /// ```
    /// let mut f = fastcp_stream::Filter::default().files_from(["a/b/x.o", "c/y"]);
    /// f.exclude("*.o").unwrap();
    /// f.exclude("c/").unwrap();
    /// assert!(!f.allows(b"src/a", true));
    /// assert!(!f.allows(b"src/a/b", true));
    /// assert!(f.allows(b"src/c", true));
    /// assert!(f.allows(b"src/c/y", false));
    /// ```
    pub fn allows(&self, wire: &[u8], is_dir: bool) -> bool {
        let decided = match self.only.as_deref().map(|o| (o, o.place(wire, is_dir))) {
            Some((_, Place::Outside)) => return false,
            Some((only, Place::Leading(rel))) => {
                let top = &wire[..wire.len() - rel.len()];
                let copied = |(listed, dir): (&[u8], bool)| {
                    let path = [top, listed].concat();
                    [true, false]
                        .into_iter()
                        .filter(|&as_dir| as_dir || !dir)
                        .any(|as_dir| self.ruled(&path, as_dir).unwrap_or(true))
                };
                if !only.beneath(rel).any(copied) {
                    return false;
                }
                None
            }
            _ => self.ruled(wire, is_dir),
        };
        decided.unwrap_or_else(|| {
            self.predicate
                .as_ref()
                .is_none_or(|keep| keep(wire, is_dir))
        })
    }

    /// What the first rule that matches the entry at `wire` says; `None` when none does.
    fn ruled(&self, wire: &[u8], is_dir: bool) -> Option<bool> {
        let path = match wire.iter().position(|&b| b == b'/') {
            Some(i) if self.rooted_in_source => &wire[i + 1..],
            None if self.rooted_in_source => &[][..],
            _ => wire,
        };
        self.rules
            .iter()
            .find(|r| r.matches(path, is_dir))
            .map(|r| r.include)
    }

    /// Adds one rule as rsync reads an `--include` (`include`) or `--exclude` option: a
    /// `+ ` or `- ` prefix says which it is, and `!` alone clears the rules so far.
    fn push(&mut self, include: bool, rule: &str) -> Result<(), Error> {
        if rule == "!" {
            self.rules.clear();
            return Ok(());
        }
        let (include, text) = match (rule.strip_prefix("+ "), rule.strip_prefix("- ")) {
            (Some(p), _) => (true, p),
            (_, Some(p)) => (false, p),
            _ => (include, rule),
        };
        if text.is_empty() {
            return Err(Error::InvalidArgument(format!(
                "an empty filter pattern: {rule:?}"
            )));
        }
        let mut pattern = text.as_bytes();
        let dir_only = pattern.len() > 1 && pattern.ends_with(b"/");
        if dir_only {
            pattern = &pattern[..pattern.len() - 1];
        }
        let slashes = pattern.iter().filter(|&&b| b == b'/').count();
        let anchored = pattern.starts_with(b"/");
        if anchored {
            pattern = &pattern[1..];
        }
        let wild = pattern.iter().any(|b| matches!(b, b'*' | b'?' | b'['));
        if wild && !well_formed(pattern) {
            return Err(Error::InvalidArgument(format!(
                "filter pattern {text:?}: a `[` with no `]` to close it, or an unknown \
                 `[:class:]`, matches nothing (write `\\[` for the character)"
            )));
        }
        let double_star = wild && pattern.windows(2).any(|w| w == b"**");
        let star_suffix = match pattern.split_first() {
            Some((b'*', rest))
                if slashes == 0
                    && !rest.iter().any(|b| matches!(b, b'*' | b'?' | b'[' | b'\\')) =>
            {
                Some(rest.to_vec())
            }
            _ => None,
        };
        self.rules.push(Rule {
            include,
            text: text.to_owned(),
            pattern: pattern.to_vec(),
            dir_only,
            anchored,
            slashes,
            wild,
            double_star,
            double_star_first: double_star && !anchored && pattern.starts_with(b"**"),
            triple_star_last: double_star && pattern.ends_with(b"***"),
            star_suffix,
        });
        Ok(())
    }
}

impl Rule {
    /// Whether the rule matches the entry at `path` (`/`-separated, from the rules' root),
    /// a directory or not, as rsync's rules match.
    fn matches(&self, path: &[u8], is_dir: bool) -> bool {
        if path.is_empty() || (self.dir_only && !is_dir) {
            return false;
        }
        // A pattern without a `/` or a `**` matches the name alone.
        let name = if self.slashes == 0 && !self.double_star {
            path.rsplit(|&b| b == b'/').next().unwrap_or(path)
        } else {
            path
        };
        if !self.wild {
            // Taken as it is: the whole path, or its end at a component boundary.
            return if self.anchored {
                name == self.pattern
            } else {
                name.ends_with(&self.pattern)
                    && (name.len() == self.pattern.len()
                        || name[name.len() - self.pattern.len() - 1] == b'/')
            };
        }
        if let Some(suffix) = &self.star_suffix {
            // `*` never crosses `/`, and the name has none.
            return name.ends_with(suffix);
        }
        // Copied only when the text gains a `/`, not for every rule and entry.
        let owned;
        let text = if self.double_star_first || (is_dir && self.triple_star_last) {
            let mut text = Vec::with_capacity(name.len() + 2);
            if self.double_star_first {
                // `**/x` matches `x` at the top too.
                text.push(b'/');
            }
            text.extend_from_slice(name);
            if is_dir && self.triple_star_last {
                // `dir/***` matches `dir` itself.
                text.push(b'/');
            }
            owned = text;
            &owned[..]
        } else {
            name
        };
        let start = if !self.anchored && self.slashes > 0 && !self.double_star {
            // The last components, as many as the pattern has.
            match last_components(text, self.slashes + 1) {
                Some(start) => start,
                None => return false,
            }
        } else {
            0
        };
        let text = &text[start..];
        let first = wild_match(&self.pattern, text);
        if first == Wild::Match {
            return true;
        }
        if self.anchored || self.double_star_first || !self.double_star || first == Wild::AbortAll {
            return false;
        }
        // A `**` inside or at the end: the pattern may start after any `/`.
        for (i, _) in text.iter().enumerate().filter(|&(_, &b)| b == b'/') {
            match wild_match(&self.pattern, &text[i + 1..]) {
                Wild::NoMatch | Wild::AbortToDoubleStar => continue,
                m => return m == Wild::Match,
            }
        }
        false
    }
}

/// Where the last `count` components of `text` start; `None` when it has fewer.
fn last_components(text: &[u8], count: usize) -> Option<usize> {
    let mut left = count;
    for (i, &b) in text.iter().enumerate().rev() {
        if b == b'/' {
            left -= 1;
            if left == 0 {
                return Some(i + 1);
            }
        }
    }
    (left == 1).then_some(0)
}

/// How a wildcard match ended. Besides a match and a mismatch, two ends that tell the
/// caller no later start can match: the text ran out ([`Wild::AbortAll`]), or a `*` came to a
/// `/` it cannot cross ([`Wild::AbortToDoubleStar`]: only an earlier `**` may go on).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Wild {
    Match,
    NoMatch,
    AbortAll,
    AbortToDoubleStar,
}

/// Matches `text` against `pattern` as rsync's wildmatch does: `?` is one byte but `/`, `*`
/// a run without `/`, `**` (or more) any run, `[...]` a class, and `\` quotes the next byte.
fn wild_match(pattern: &[u8], text: &[u8]) -> Wild {
    let (mut p, mut t) = (pattern, text);
    while let Some((&pc, rest)) = p.split_first() {
        let Some(&tc) = t.first() else {
            if pc != b'*' {
                return Wild::AbortAll;
            }
            // A `*` may take nothing: handled below with an empty text.
            return star(rest, t);
        };
        match pc {
            b'?' if tc == b'/' => return Wild::NoMatch,
            b'?' => p = rest,
            b'*' => return star(rest, t),
            b'[' => match class(rest, tc) {
                None => return Wild::AbortAll,
                Some((false, _)) => return Wild::NoMatch,
                Some((true, _)) if tc == b'/' => return Wild::NoMatch,
                Some((true, used)) => p = &rest[used..],
            },
            b'\\' => match rest.split_first() {
                Some((&quoted, after)) if quoted == tc => p = after,
                _ => return Wild::NoMatch,
            },
            literal if literal == tc => p = rest,
            _ => return Wild::NoMatch,
        }
        t = &t[1..];
    }
    if t.is_empty() {
        Wild::Match
    } else {
        Wild::NoMatch
    }
}

/// Matches `text` against what follows a `*` (`after`, which may start with more `*`).
fn star(after: &[u8], text: &[u8]) -> Wild {
    let more = after.iter().take_while(|&&b| b == b'*').count();
    let crosses = more > 0;
    let after = &after[more..];
    if after.is_empty() {
        return if crosses || !text.contains(&b'/') {
            Wild::Match
        } else {
            Wild::NoMatch
        };
    }
    for (i, &b) in text.iter().enumerate() {
        match wild_match(after, &text[i..]) {
            Wild::NoMatch if !crosses && b == b'/' => return Wild::AbortToDoubleStar,
            Wild::NoMatch => {}
            Wild::AbortToDoubleStar if crosses => {}
            m => return m,
        }
    }
    Wild::AbortAll
}

/// Whether the class that `rest` (what follows a `[`) opens takes `c`, and how many bytes
/// of `rest` it spans with its `]`; `None` when nothing closes it or a `[:name:]` is
/// unknown. `[!...]` and `[^...]` are negated, `a-z` a range, a `]` first a member, `\`
/// quotes, and `[:alpha:]` and the other POSIX classes name ASCII sets.
fn class(rest: &[u8], c: u8) -> Option<(bool, usize)> {
    let mut i = 0;
    let negated = matches!(rest.first(), Some(b'!' | b'^'));
    if negated {
        i += 1;
    }
    let mut taken = false;
    // The previous member, which a `-` may make the start of a range; 0 after a range.
    let mut prev = 0u8;
    let mut first = true;
    loop {
        let mut ch = *rest.get(i)?;
        if ch == b']' && !first {
            return Some((taken != negated, i + 1));
        }
        first = false;
        if ch == b'\\' {
            i += 1;
            ch = *rest.get(i)?;
            taken |= c == ch;
        } else if ch == b'-' && prev != 0 && rest.get(i + 1).is_some_and(|&next| next != b']') {
            i += 1;
            let mut hi = rest[i];
            if hi == b'\\' {
                i += 1;
                hi = *rest.get(i)?;
            }
            taken |= (prev..=hi).contains(&c);
            ch = 0;
        } else if ch == b'[' && rest.get(i + 1) == Some(&b':') {
            let names = &rest[i + 2..];
            let close = names.iter().position(|&b| b == b']')?;
            if close == 0 || names[close - 1] != b':' {
                // Not a `[:name:]`: the `[` is a member.
                taken |= c == b'[';
            } else {
                taken |= posix_class(&names[..close - 1])?(c);
                i += 2 + close;
                ch = 0;
            }
        } else {
            taken |= c == ch;
        }
        prev = ch;
        i += 1;
    }
}

/// The test of a POSIX class by its name (`alpha` for `[:alpha:]`), ASCII only.
fn posix_class(name: &[u8]) -> Option<fn(u8) -> bool> {
    Some(match name {
        b"alnum" => |c: u8| c.is_ascii_alphanumeric(),
        b"alpha" => |c: u8| c.is_ascii_alphabetic(),
        b"blank" => |c: u8| c == b' ' || c == b'\t',
        b"cntrl" => |c: u8| c.is_ascii_control(),
        b"digit" => |c: u8| c.is_ascii_digit(),
        b"graph" => |c: u8| c.is_ascii_graphic(),
        b"lower" => |c: u8| c.is_ascii_lowercase(),
        b"print" => |c: u8| c.is_ascii_graphic() || c == b' ',
        b"punct" => |c: u8| c.is_ascii_punctuation(),
        b"space" => |c: u8| c.is_ascii_whitespace() || c == 0x0b,
        b"upper" => |c: u8| c.is_ascii_uppercase(),
        b"xdigit" => |c: u8| c.is_ascii_hexdigit(),
        _ => return None,
    })
}

/// Whether each class in `pattern` is closed and names only known POSIX classes: one that
/// is not would match nothing.
fn well_formed(pattern: &[u8]) -> bool {
    let mut i = 0;
    while i < pattern.len() {
        match pattern[i] {
            b'\\' => i += 2,
            b'[' => match class(&pattern[i + 1..], 0) {
                Some((_, used)) => i += 1 + used,
                None => return false,
            },
            _ => i += 1,
        }
    }
    true
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

    /// Whether `pattern`, as an exclude rule rooted in the source, leaves out `path`.
    fn excludes(pattern: &str, path: &str, is_dir: bool) -> bool {
        let mut f = Filter::default();
        f.exclude(pattern).unwrap();
        !f.rooted_in_source()
            .allows(format!("top/{path}").as_bytes(), is_dir)
    }

    #[test]
    fn wildcards_read_as_rsync_reads_them() {
        // (pattern, path beneath the source, is a directory, excluded) as rsync 3 decides.
        let cases = [
            ("file\\?", "file?", false, true),
            ("file\\?", "filex", false, false),
            ("st\\*r", "st*r", true, true),
            ("st\\*r", "star", true, false),
            ("b\\[a\\]d", "b[a]d", false, true),
            ("b[a]d", "bad", false, true),
            ("b[a]d", "b[a]d", false, false),
            // Without a wildcard a backslash is a character like any other.
            ("back\\slash", "back\\slash", true, true),
            ("back\\\\*", "back\\x", false, true),
            ("[^a]*", "a", true, false),
            ("[^a]*", "b", true, true),
            ("[!a-f]*", "g", false, true),
            ("[[:upper:]]*", "Makefile", false, true),
            ("[[:upper:]]*", "makefile", false, false),
            ("[[:digit:]x]", "x", false, true),
            ("[]]", "]", false, true),
            ("*", ".hidden", false, true),
            ("*.o", ".o", false, true),
            ("*.o", "x.o.c", false, false),
            ("*~", "a/b~", false, true),
            ("*.o/", "x.o", true, true),
            ("*.o/", "x.o", false, false),
            ("*.c", "a/b/x.c", false, true),
            ("*/c", "a/b/c", true, true),
            ("*/c", "c", true, false),
            ("a/*", "a/b/c", false, false),
            ("a/**", "a/b/c", false, true),
            ("a/**", "x/a/b", false, true),
            ("a**", "a/b/c/z.c", false, true),
            ("a**", "ba", false, false),
            ("**.c", "a/b/z.c", false, true),
            ("**/z.c", "z.c", false, true),
            ("/**/foo", "foo", true, false),
            ("/**/foo", "x/foo", true, true),
            ("a/**/z.c", "a/z.c", false, false),
            ("a/**/z.c", "a/b/c/z.c", false, true),
            ("a/***", "a", true, true),
            ("a/***", "a/b/c", false, true),
            ("a/***", "x/a/y", false, true),
            ("a/***", "ab", true, false),
            ("/x/foo/***", "x/foo", true, true),
            ("/x/foo/***", "foo", true, false),
            ("foo/bar", "x/foo/bar", true, true),
            ("/foo/bar", "x/foo/bar", true, false),
            ("/build", "build", true, true),
            ("/build", "src/build", true, false),
            ("build/", "src/build", false, false),
            ("my dir", "my dir", true, true),
            ("my\\ dir", "my dir", true, false),
        ];
        for (pattern, path, is_dir, excluded) in cases {
            assert_eq!(
                excludes(pattern, path, is_dir),
                excluded,
                "{pattern:?} on {path:?}"
            );
        }
    }

    #[test]
    fn prefixes_and_clearing_read_as_rsync_reads_them() {
        let mut f = Filter::default();
        f.exclude("*.o").unwrap();
        f.exclude("!").unwrap();
        f.exclude("+ keep.c").unwrap();
        f.include("- *.c").unwrap();
        assert!(f.allows(b"t/x.o", false), "! clears the rules before it");
        assert!(f.allows(b"t/keep.c", false));
        assert!(!f.allows(b"t/other.c", false));
        assert_eq!(f.rules(), ["+ keep.c", "- *.c"]);
        let mut list = Filter::default();
        list.add_include_rules("a/***\r\n- *\r\n; comment\n")
            .unwrap();
        assert_eq!(list.rules(), ["+ a/***", "- *"]);
        assert!(Filter::default().exclude("- ").is_err());
        assert!(Filter::default().exclude("[[:nope:]]").is_err());
    }

    #[test]
    fn rooted_in_source_matches_beneath_the_top() {
        let mut f = Filter::default();
        f.exclude("/build/").unwrap();
        f.exclude("*/c").unwrap();
        // The path starts with the source's name: `/build` would be a source of that name.
        assert!(f.allows(b"src/build", true));
        assert!(!f.allows(b"src/c", true));
        let f = f.rooted_in_source();
        assert!(f.allows(b"src", true), "the top itself is never matched");
        assert!(f.allows(b"src/src/build", true));
        assert!(f.allows(b"src/x/build", true));
        assert!(!f.allows(b"src/build", true));
        assert!(f.allows(b"src/c", true));
        assert!(!f.allows(b"src/a/c", true));
    }

    #[test]
    fn the_predicate_comes_after_the_rules() {
        let f = Filter::default().with_predicate(Arc::new(|wire: &[u8], _| !wire.ends_with(b"~")));
        assert!(!f.allows(b"t/a~", false));
        assert!(f.allows(b"t/a", false));
    }
}
