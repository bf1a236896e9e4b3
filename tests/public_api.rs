//! A snapshot of the public API of the library crates (`fastcp` and the four crates it
//! re-exports): every `pub` item's signature and every public field, by file. A change to
//! any of them fails this test with the difference, so that it is made on purpose: review
//! it, then record the new snapshot with
//!
//! ```sh
//! FASTCP_BLESS=1 cargo test --test public_api
//! ```
//!
//! and say in the change whether it breaks callers (a removed or changed line does; an
//! added line does not, for the `#[non_exhaustive]` types).

use std::fmt::Write;
use std::path::{Path, PathBuf};

const SNAPSHOT: &str = "tests/public-api.txt";

/// The source folders of the crates whose public items are the library's API.
const CRATES: [&str; 5] = [
    "src",
    "crates/crypto/src",
    "crates/proto/src",
    "crates/stream/src",
    "crates/transport/src",
];

/// Binaries and CLI-only files: not library API.
const NOT_API: [&str; 3] = ["src/main.rs", "src/cli.rs", "src/progress.rs"];

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    entries.sort();
    for p in entries {
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|e| e == "rs") {
            out.push(p);
        }
    }
}

/// The public signatures in one file's text, whitespace collapsed, test modules left out.
fn public_items(text: &str) -> Vec<String> {
    let mut items = Vec::new();
    let mut lines = text.lines().peekable();
    while let Some(line) = lines.next() {
        let trimmed = line.trim();
        if trimmed == "#[cfg(test)]" {
            // A test module runs to the end of the file, by this codebase's habit.
            if lines
                .peek()
                .is_some_and(|l| l.trim_start().starts_with("mod "))
            {
                break;
            }
            continue;
        }
        if !trimmed.starts_with("pub ") {
            continue;
        }
        // A public field is its line.
        let is_field = trimmed
            .strip_prefix("pub ")
            .and_then(|rest| rest.split_once(':'))
            .is_some_and(|(name, _)| name.chars().all(|c| c.is_alphanumeric() || c == '_'));
        // A re-export runs to its ';', braces and all; anything else to its body or value.
        let stops: &[char] = if is_field {
            &[]
        } else if trimmed.starts_with("pub use ") {
            &[';']
        } else {
            &['{', ';', '=']
        };
        let mut sig = String::new();
        let mut part = trimmed.to_owned();
        loop {
            match part.find(stops) {
                Some(i) => {
                    sig.push_str(&part[..i]);
                    break;
                }
                None if is_field => {
                    sig.push_str(&part);
                    break;
                }
                None => {
                    sig.push_str(&part);
                    sig.push(' ');
                    match lines.next() {
                        Some(next) => part = next.trim().to_owned(),
                        None => break,
                    }
                }
            }
        }
        let sig = sig.split_whitespace().collect::<Vec<_>>().join(" ");
        let sig = sig.trim_end_matches(',').trim().to_owned();
        items.push(sig);
    }
    items
}

fn snapshot(root: &Path) -> String {
    let mut out = String::new();
    for dir in CRATES {
        let mut files = Vec::new();
        rust_files(&root.join(dir), &mut files);
        for file in files {
            let rel = file
                .strip_prefix(root)
                .unwrap()
                .to_string_lossy()
                .into_owned();
            if NOT_API.contains(&rel.as_str()) {
                continue;
            }
            let items = public_items(&std::fs::read_to_string(&file).unwrap());
            if items.is_empty() {
                continue;
            }
            writeln!(out, "# {rel}").unwrap();
            for item in items {
                writeln!(out, "{item}").unwrap();
            }
        }
    }
    out
}

#[test]
fn the_public_api_changes_only_on_purpose() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let now = snapshot(root);
    let path = root.join(SNAPSHOT);
    if std::env::var_os("FASTCP_BLESS").is_some() {
        std::fs::write(&path, &now).unwrap();
        return;
    }
    let recorded = std::fs::read_to_string(&path).unwrap_or_default();
    if recorded == now {
        return;
    }
    let old: Vec<&str> = recorded.lines().collect();
    let new: Vec<&str> = now.lines().collect();
    let mut diff = String::new();
    for line in &old {
        if !new.contains(line) {
            writeln!(diff, "- {line}").unwrap();
        }
    }
    for line in &new {
        if !old.contains(line) {
            writeln!(diff, "+ {line}").unwrap();
        }
    }
    panic!(
        "the public API changed (- removed or changed, + added):\n{diff}\nIf that is on \
         purpose, record it: FASTCP_BLESS=1 cargo test --test public_api"
    );
}

#[test]
fn signatures_are_read_across_lines_and_tests_are_left_out() {
    let text = "pub use a::{\n    B, C,\n};\npub struct A {\n    pub x: Option<(u8, u8)>,\n    y: u8,\n}\npub fn f(\n    a: u8,\n    b: u16,\n) -> u8 {\n}\npub(crate) fn g() {}\npub const C: u8 = 1;\n#[cfg(test)]\nmod tests {\n    pub fn t() {}\n}\n";
    assert_eq!(
        public_items(text),
        [
            "pub use a::{ B, C, }",
            "pub struct A",
            "pub x: Option<(u8, u8)>",
            "pub fn f( a: u8, b: u16, ) -> u8",
            "pub const C: u8",
        ]
    );
}
