//! Dry runs (`-n`): what a copy would do, written nowhere.
//!
//! A local copy and a push list their own walk; a pull lists what the server's walk sends
//! ([`serve_dry_run`] is the server's side). When the receiving side is this machine (a local
//! copy or a pull), the listing then loses what the quick check would skip and gains what
//! `--delete` would remove, judged as the copy would judge them ([`apply`]).

use std::collections::HashSet;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use bytes::Bytes;
use fastcp_proto::{DirEntry, Direction, FileEntry, Frame, Meta, Summary, SymlinkEntry, flags};
use fastcp_stream::{EntryKind, Failure, Report, Side, WalkConfig};
use tokio::io::{AsyncWrite, AsyncWriteExt};

use crate::client::{Plan, SessionDone, push_failure};
use crate::location::Location;
use crate::session;
use crate::wire::FrameReader;
use crate::{BoxStream, Error};

/// One entry a dry run would copy, or with `--delete` remove.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listed {
    /// Its path relative to the target, '/'-separated, starting with the source's name. Raw
    /// bytes (they may come from the peer): escape them with [`crate::stream::escape`].
    pub path: Bytes,
    /// A directory, a file and its size, or a link and its target.
    pub kind: EntryKind,
    /// Its mode and modification time (no access time), on the side it is on: the source's
    /// for an entry to copy, the destination's for one to remove.
    pub meta: fastcp_stream::Meta,
    /// True for an entry of the destination that `--delete` would remove (a directory with
    /// all it holds).
    pub delete: bool,
}

/// Walks the local sources: what a dry run of a local copy or a push lists.
pub(crate) fn list_local(plan: &Plan) -> (Vec<Listed>, Report) {
    let mut config = WalkConfig::new(plan.options.recursive, plan.options.follow_links);
    config.filter = plan.options.filter.clone();
    config.devices = plan.options.devices;
    config.specials = plan.options.specials;
    let mut listing = Vec::new();
    let mut report = Report::default();
    for entry in fastcp_stream::walk(&plan.local_sources(), &config) {
        match entry {
            Ok(entry) => {
                count(&mut report.local, &entry.kind);
                listing.push(Listed {
                    path: entry.wire,
                    kind: entry.kind,
                    meta: fastcp_stream::Meta {
                        atime: None,
                        ..entry.meta
                    },
                    delete: false,
                });
            }
            Err(e) => push_failure(
                &mut report,
                Failure {
                    side: Side::Sender,
                    path: Bytes::new(),
                    code: e.code(),
                    message: e.to_string(),
                },
            ),
        }
    }
    (listing, report)
}

pub(crate) fn count(summary: &mut Summary, kind: &EntryKind) {
    match kind {
        EntryKind::Dir => summary.dirs += 1,
        EntryKind::File { size } => {
            summary.files += 1;
            summary.bytes += size;
        }
        EntryKind::Symlink { .. } => summary.symlinks += 1,
        EntryKind::Special { .. } => summary.files += 1,
    }
}

/// The client's side of a dry run: a push lists its own walk and waits for the server's
/// word that it accepts the target; a pull lists what the server sends.
pub(crate) async fn dry_run(
    plan: &Plan,
    direction: Direction,
    data: Vec<BoxStream>,
    done: &mut SessionDone,
) -> Result<(), Error> {
    let control = data
        .into_iter()
        .next()
        .ok_or_else(|| Error::Unsupported("the server offered no stream for the dry run".into()))?;
    let mut reader = FrameReader::new(control, session::MAX_FRAME);
    if direction == Direction::Push {
        (done.listing, done.report) = list_local(plan);
    }
    loop {
        let frame = reader.next("listing what would be copied").await?;
        let (path, kind, meta) = match frame {
            Frame::Done(_) => {
                if let Location::Local(dest) = &plan.dest {
                    let listing = std::mem::take(&mut done.listing);
                    done.listing = apply(plan, dest, listing, &mut done.report);
                }
                return Ok(());
            }
            Frame::Error(e) if e.fatal => return Err(Error::Remote(e.message)),
            Frame::Error(e) => {
                push_failure(
                    &mut done.report,
                    Failure {
                        side: Side::Sender,
                        path: e.path,
                        code: e.code,
                        message: e.message,
                    },
                );
                continue;
            }
            Frame::Dir(d) if direction == Direction::Pull => (d.path, EntryKind::Dir, d.meta),
            Frame::File(f) if direction == Direction::Pull => {
                (f.path, EntryKind::File { size: f.size }, f.meta)
            }
            Frame::Symlink(l) if direction == Direction::Pull => (
                l.path,
                EntryKind::Symlink { target: l.target },
                fastcp_stream::Meta::default(),
            ),
            Frame::Special(e) if direction == Direction::Pull => (
                e.path,
                EntryKind::Special {
                    kind: e.kind,
                    rdev: e.rdev,
                },
                e.meta,
            ),
            other => {
                return Err(Error::UnexpectedFrame {
                    expected: "a listing",
                    got: other.name(),
                });
            }
        };
        count(&mut done.report.local, &kind);
        // Copies: a slice would pin the whole receive buffer.
        done.listing.push(Listed {
            path: Bytes::copy_from_slice(&path),
            kind,
            meta: fastcp_stream::Meta {
                atime: None,
                ..meta
            },
            delete: false,
        });
    }
}

/// The server's side of a dry run, on the session's only stream: for a pull, the walk of
/// `sources` as `Dir`, `File` (no data) and `Symlink` frames and an `Error` for each entry
/// that cannot be read; then `Done` with the totals. For a push, only `Done`, or a fatal
/// `Error` if `target` cannot be the target. Nothing is written.
pub(crate) async fn serve_dry_run<S>(
    mut stream: S,
    direction: Direction,
    sources: &[PathBuf],
    target: &std::path::Path,
    flags: u32,
    filter: Option<Arc<fastcp_stream::Filter>>,
) -> Result<Report, Error>
where
    S: AsyncWrite + Unpin,
{
    let mut report = Report::default();
    let mut out = bytes::BytesMut::new();
    if direction == Direction::Push {
        if flags & flags::TARGET_IS_DIR != 0 && !target.is_dir() {
            let message = format!(
                "{}: not a directory (several sources, or a trailing '/', need an existing directory)",
                target.display()
            );
            crate::wire::write_frame(
                &mut stream,
                &Frame::Error(fastcp_proto::ErrorFrame {
                    code: fastcp_proto::ErrorCode::NotFound,
                    fatal: true,
                    path: Bytes::new(),
                    message: message.clone(),
                }),
            )
            .await?;
            return Err(Error::Unsupported(message));
        }
    } else {
        let mut config = WalkConfig::new(
            flags & flags::RECURSIVE != 0,
            flags & flags::FOLLOW_LINKS != 0,
        );
        config.filter = filter;
        config.devices = flags & flags::DEVICES != 0;
        config.specials = flags & flags::SPECIALS != 0;
        let mut id = 0;
        for entry in fastcp_stream::walk(sources, &config) {
            let frame = match entry {
                Ok(entry) => {
                    count(&mut report.local, &entry.kind);
                    // A listing: no access times, which a version 1 client would refuse.
                    let meta = Meta {
                        atime: None,
                        ..entry.meta
                    };
                    match entry.kind {
                        EntryKind::Dir => Frame::Dir(DirEntry {
                            path: entry.wire,
                            meta,
                        }),
                        EntryKind::File { size } => {
                            id += 1;
                            Frame::File(FileEntry {
                                id,
                                path: entry.wire,
                                size,
                                meta,
                            })
                        }
                        EntryKind::Symlink { target } => Frame::Symlink(SymlinkEntry {
                            path: entry.wire,
                            target,
                            times: None,
                        }),
                        EntryKind::Special { kind, rdev } => {
                            Frame::Special(fastcp_proto::SpecialEntry {
                                path: entry.wire,
                                kind,
                                rdev,
                                meta,
                            })
                        }
                    }
                }
                Err(e) => {
                    report.local.errors += 1;
                    Frame::Error(fastcp_proto::ErrorFrame {
                        code: e.code(),
                        fatal: false,
                        path: Bytes::new(),
                        message: e.to_string(),
                    })
                }
            };
            fastcp_proto::encode(&frame, &mut out);
            if out.len() >= 64 * 1024 {
                stream.write_all(&out).await?;
                out.clear();
            }
        }
    }
    fastcp_proto::encode(&Frame::Done(report.local), &mut out);
    stream.write_all(&out).await?;
    stream.flush().await?;
    Ok(report)
}

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
        count(&mut report.local, &entry.kind);
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
