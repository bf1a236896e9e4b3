//! What a dry run (`-n`) shows when the receiving side is this machine (a local copy or a
//! pull): the listing less what the quick check would skip, plus what `--delete` would
//! remove, judged as the copy would judge them. Nothing is written or removed.

use std::collections::HashSet;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use bytes::Bytes;
use fastcp_stream::{EntryKind, Meta, Report};

use crate::client::{Listed, Plan};

/// Applies the quick check and `--delete` to a dry run's `listing` for a copy into the local
/// `dest`, and recounts `report` by what is left.
pub(crate) fn apply(
    plan: &Plan,
    dest: &Path,
    listing: Vec<Listed>,
    report: &mut Report,
) -> Vec<Listed> {
    let o = &plan.options;
    if !(o.skip_unchanged || o.resume || o.delete) {
        return listing;
    }
    let into = dest.is_dir();
    let local = |wire: &[u8]| -> PathBuf {
        if into {
            return dest.join(std::ffi::OsStr::from_bytes(wire));
        }
        match wire.iter().position(|&b| b == b'/') {
            Some(i) => dest.join(std::ffi::OsStr::from_bytes(&wire[i + 1..])),
            None => dest.to_path_buf(),
        }
    };
    let sent: HashSet<Bytes> = listing.iter().map(|l| l.path.clone()).collect();
    let mut kept = Vec::with_capacity(listing.len());
    let mut deletions = Vec::new();
    for entry in listing {
        match entry.kind {
            EntryKind::File { size }
                if (o.skip_unchanged || o.resume)
                    && !o.checksum
                    && unchanged(&local(&entry.path), size, &entry.meta) =>
            {
                report.files_skipped += 1;
                report.bytes_skipped += size;
                continue;
            }
            EntryKind::Dir if o.delete => extras(
                plan,
                &local(&entry.path),
                &entry.path,
                &sent,
                &mut deletions,
            ),
            _ => {}
        }
        kept.push(entry);
    }
    report.local.files = 0;
    report.local.dirs = 0;
    report.local.symlinks = 0;
    report.local.bytes = 0;
    for entry in &kept {
        crate::client::count(&mut report.local, &entry.kind);
    }
    report.local.deleted = deletions.len() as u64;
    kept.extend(deletions);
    kept
}

/// A regular file at `path` with this size and modification time: the quick check skips it.
fn unchanged(path: &Path, size: u64, meta: &Meta) -> bool {
    std::fs::symlink_metadata(path).is_ok_and(|m| {
        m.is_file()
            && m.len() == size
            && m.mtime() == meta.mtime
            && m.mtime_nsec() == i64::from(meta.mtime_nsec)
    })
}

/// What the directory at `dir` (wire path `wire`) holds beyond `sent`: what `--delete` would
/// remove. A directory that is not there, or is a symlink, holds nothing to remove.
fn extras(plan: &Plan, dir: &Path, wire: &[u8], sent: &HashSet<Bytes>, out: &mut Vec<Listed>) {
    if !std::fs::symlink_metadata(dir).is_ok_and(|m| m.is_dir()) {
        return;
    }
    let Ok(names) = std::fs::read_dir(dir) else {
        return;
    };
    let mut found = Vec::new();
    for entry in names.flatten() {
        let name = entry.file_name();
        let mut path = Vec::with_capacity(wire.len() + 1 + name.len());
        path.extend_from_slice(wire);
        path.push(b'/');
        path.extend_from_slice(name.as_bytes());
        if sent.contains(&path[..]) || fastcp_stream::is_work_file(name.as_bytes()) {
            continue;
        }
        let Ok(m) = entry.metadata() else { continue };
        if let Some(filter) = &plan.options.filter
            && !filter.allows(&path, m.is_dir())
        {
            continue;
        }
        let kind = if m.is_dir() {
            EntryKind::Dir
        } else if m.file_type().is_symlink() {
            let target = std::fs::read_link(entry.path()).unwrap_or_default();
            EntryKind::Symlink {
                target: Bytes::copy_from_slice(target.as_os_str().as_bytes()),
            }
        } else {
            EntryKind::File { size: m.len() }
        };
        found.push(Listed {
            path: Bytes::from(path),
            kind,
            meta: Meta {
                mode: m.mode() & 0o7777,
                mtime: m.mtime(),
                mtime_nsec: m.mtime_nsec().clamp(0, 999_999_999) as u32,
                atime: None,
            },
            delete: true,
        });
    }
    found.sort_by(|a, b| a.path.cmp(&b.path));
    out.extend(found);
}
