//! Dry runs (`-n`): what a copy would do, written nowhere.
//!
//! A local copy and a push list their own walk; a pull lists what the server's walk sends
//! ([`serve_dry_run`] is the server's side). The listing then loses what the quick check
//! would skip and gains what `--delete` would remove, judged where the files would land, as
//! the copy would judge them ([`judge`]): on this machine for a local copy or a pull; on the
//! server for a push (protocol version 6), which gets the push's listing and answers with
//! what it would skip and what it would remove.

use std::collections::HashSet;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use bytes::Bytes;
use fastcp_proto::{
    DirEntry, Direction, ErrorCode, FileEntry, Frame, Meta, SpecialKind, Summary, SymlinkEntry,
    flags,
};
use fastcp_stream::{EntryKind, Failure, Report, Side, WalkConfig};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};

use crate::client::{Plan, SessionDone, push_failure, within};
use crate::location::Location;
use crate::session;
use crate::wire::FrameReader;
use crate::{BoxStream, Error};

/// What a dry run's timeout error says it waited on.
const DRY_RUN_WAIT: &str = "during a dry run, waiting on the peer (--timeout)";

/// One entry a dry run would copy, or with `--delete` remove.
#[non_exhaustive]
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listed {
    /// Its path relative to the target, '/'-separated, starting with the source's name; for
    /// a folder's contents ([`Plan::contents`](crate::Plan::contents)) that name is not part
    /// of where it lands (`src/a` lands at `dest/a`). Raw bytes (they may come from the
    /// peer): escape them with [`crate::stream::escape`].
    pub path: Bytes,
    /// A directory, a file and its size, or a link and its target.
    pub kind: EntryKind,
    /// Its mode and modification time (no access time), on the side it is on: the source's
    /// for an entry to copy, the destination's for one to remove.
    pub meta: fastcp_stream::Meta,
    /// True for an entry of the destination that `--delete` would remove (a directory's
    /// entries are listed too, before it).
    pub delete: bool,
    /// True for a directory listed without its contents, a mount point that `-x` does not
    /// enter: `--delete` leaves what the destination holds beneath it.
    pub unentered: bool,
    /// With `-H`: another name of a file listed before it, whose bytes the copy sends once
    /// (it is counted as a file, with no bytes).
    pub another_name: bool,
    /// With `-H`, for another name: the path the file was first listed under, where the
    /// quick check judges whether the link is in place.
    pub(crate) first: Option<Bytes>,
}

/// Walks the local sources: what a dry run of a local copy or a push lists. On a blocking
/// thread: a walk of a big tree must not hold up the runtime's workers. A walk that stops
/// short (a filter predicate that panics, the runtime going away) ends with a failure, so
/// that the listing never looks complete. `specials_refused`: the copy cannot carry devices,
/// pipes and sockets (over SFTP), so their failures name no option that would.
pub(crate) async fn list_local(plan: &Plan, specials_refused: bool) -> (Vec<Listed>, Report) {
    let owned = plan.clone();
    match tokio::task::spawn_blocking(move || walk_local(&owned, specials_refused)).await {
        Ok(listed) => listed,
        Err(_) => {
            let mut report = Report::default();
            push_failure(&mut report, walk_stopped());
            (Vec::new(), report)
        }
    }
}

/// The failure of a walk that stopped before its end.
fn walk_stopped() -> Failure {
    Failure::new(
        Side::Sender,
        Bytes::new(),
        ErrorCode::Other,
        "the walk of the sources stopped before its end".into(),
    )
}

fn walk_local(plan: &Plan, specials_refused: bool) -> (Vec<Listed>, Report) {
    let mut config = WalkConfig::new(plan.options.recursive, plan.options.follow_links);
    config.filter = plan.options.filter.clone();
    config.devices = plan.options.devices;
    config.specials = plan.options.specials;
    config.one_file_system = plan.options.one_file_system;
    let mut listing = Vec::new();
    let mut report = Report::default();
    let mut walk = fastcp_stream::walk(&plan.local_sources(), &config);
    // With -H, the files with several names met so far.
    let mut named = std::collections::HashMap::new();
    loop {
        // A cancelled copy stops walking; its caller has returned already.
        if plan
            .options
            .cancel
            .as_ref()
            .is_some_and(|c| c.is_cancelled())
        {
            break;
        }
        let next = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| walk.next()));
        let entry = match next {
            Ok(Some(entry)) => entry,
            Ok(None) => break,
            Err(_) => {
                push_failure(&mut report, walk_stopped());
                break;
            }
        };
        let entry = readable(entry, config.follow_links);
        match entry {
            Ok(entry) => {
                let first = match entry.inode.filter(|_| plan.options.hard_links) {
                    Some(inode) => match named.entry(inode) {
                        std::collections::hash_map::Entry::Occupied(e) => {
                            Some(Bytes::clone(e.get()))
                        }
                        std::collections::hash_map::Entry::Vacant(e) => {
                            e.insert(entry.wire.clone());
                            None
                        }
                    },
                    None => None,
                };
                let listed = Listed {
                    path: entry.wire,
                    kind: entry.kind,
                    meta: fastcp_stream::Meta {
                        atime: None,
                        ..entry.meta
                    },
                    delete: false,
                    unentered: entry.unentered,
                    another_name: first.is_some(),
                    first,
                };
                count_listed(&mut report.local, &listed);
                listing.push(listed);
            }
            Err((e, path)) => {
                let e = match specials_refused {
                    true => e.without_option_hint(),
                    false => e,
                };
                push_failure(
                    &mut report,
                    Failure::new(Side::Sender, path, e.code(), e.to_string()),
                );
            }
        }
    }
    (listing, report)
}

/// A walk's entry as a dry run lists it: a file the copy could not open fails as it would
/// (which keeps `--delete` from deleting anything, as in the copy). A failure comes with the
/// path of its entry, or none.
fn readable(
    entry: Result<fastcp_stream::Entry, fastcp_stream::Error>,
    follow_links: bool,
) -> Result<fastcp_stream::Entry, (fastcp_stream::Error, Bytes)> {
    match entry {
        Ok(entry) if matches!(entry.kind, EntryKind::File { .. }) => {
            match fastcp_stream::check_readable(&entry, follow_links) {
                Ok(()) => Ok(entry),
                Err(e) => Err((e, entry.wire)),
            }
        }
        Ok(entry) => Ok(entry),
        Err(e) => {
            // Named by its path, as the sender names it: `--delete` spares what the walk
            // skipped on purpose (a named pipe without `--specials`).
            let path = match &e {
                fastcp_stream::Error::Io { path, .. }
                | fastcp_stream::Error::Unsupported { path, .. }
                | fastcp_stream::Error::SourceChanged { path }
                | fastcp_stream::Error::SourceVanished { path } => {
                    Bytes::copy_from_slice(path.as_os_str().as_bytes())
                }
                _ => Bytes::new(),
            };
            Err((e, path))
        }
    }
}

/// [`count`], for a listed entry: another name of a file listed before it has no bytes.
pub(crate) fn count_listed(summary: &mut Summary, listed: &Listed) {
    count(summary, &listed.kind);
    if let (true, EntryKind::File { size }) = (listed.another_name, &listed.kind) {
        summary.bytes -= size;
    }
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
    version: u16,
    data: Vec<BoxStream>,
    progress: &fastcp_stream::Progress,
    done: &mut SessionDone,
) -> Result<(), Error> {
    let control = data
        .into_iter()
        .next()
        .ok_or_else(|| Error::Unsupported("the server offered no stream for the dry run".into()))?;
    let mut reader = FrameReader::new(control, session::MAX_FRAME);
    // With -H, the ids of the files listed so far: a server that knows further names lists
    // them with their file's id.
    let mut ids = std::collections::HashMap::new();
    if direction == Direction::Push {
        (done.listing, done.report) = list_local(plan, false).await;
        if Judge::of(plan).any() {
            return judged_remotely(plan, version, &mut reader, progress, done).await;
        }
    }
    loop {
        let frame = reader.next("listing what would be copied").await?;
        let name = frame.name();
        let entry = match frame {
            Frame::Done(_) => {
                if let Location::Local(dest) = &plan.dest {
                    let listing = std::mem::take(&mut done.listing);
                    done.listing = apply(plan, dest, listing, &mut done.report)?;
                }
                return Ok(());
            }
            Frame::Error(e) if e.fatal => {
                return Err(Error::Engine(fastcp_stream::Error::from_frame(&e)));
            }
            Frame::Error(e) => {
                push_failure(
                    &mut done.report,
                    Failure::new(Side::Sender, e.path, e.code, e.message),
                );
                continue;
            }
            other if direction == Direction::Pull => match listed_from(other) {
                Some((id, entry)) => {
                    let first = match id.filter(|_| plan.options.hard_links) {
                        Some(id) => match ids.entry(id) {
                            std::collections::hash_map::Entry::Occupied(e) => {
                                Some(Bytes::clone(e.get()))
                            }
                            std::collections::hash_map::Entry::Vacant(e) => {
                                e.insert(entry.path.clone());
                                None
                            }
                        },
                        None => None,
                    };
                    Listed {
                        another_name: first.is_some(),
                        first,
                        ..entry
                    }
                }
                None => {
                    return Err(Error::UnexpectedFrame {
                        expected: "a listing",
                        got: name,
                    });
                }
            },
            _ => {
                return Err(Error::UnexpectedFrame {
                    expected: "a listing",
                    got: name,
                });
            }
        };
        count_listed(&mut done.report.local, &entry);
        done.listing.push(entry);
    }
}

/// The server's side of a dry run, on the session's only stream: for a pull, the walk of
/// `sources` as `Dir`, `File` (no data) and `Symlink` frames and an `Error` for each entry
/// that cannot be read; then `Done` with the totals. For a push, only `Done`, or a fatal
/// `Error` if `target` cannot be the target. Nothing is written.
pub(crate) async fn serve_dry_run<S>(
    mut stream: S,
    request: &fastcp_proto::Request,
    sources: &[PathBuf],
    target: &std::path::Path,
    filter: Option<Arc<fastcp_stream::Filter>>,
    idle: Option<std::time::Duration>,
) -> Result<Report, Error>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let (direction, flags) = (request.direction, request.flags);
    let link_dest = request
        .link_dest
        .as_ref()
        .map(|p| Path::new(std::ffi::OsStr::from_bytes(p)));
    let mut report = Report::default();
    let mut out = bytes::BytesMut::new();
    if direction == Direction::Push {
        // The target as the copy's receiver checks it before it writes anything.
        let config = fastcp_stream::ReceiveConfig {
            target_must_be_dir: flags & flags::TARGET_IS_DIR != 0,
            target_may_be_new_dir: flags & flags::NEW_TARGET_DIR != 0,
            contents: flags & flags::CONTENTS != 0,
            link_dest: link_dest.map(Path::to_path_buf),
            ..Default::default()
        };
        if let Err(e) = fastcp_stream::check_destination(target, &config, true) {
            let error = Frame::Error(fastcp_proto::ErrorFrame {
                code: e.code(),
                fatal: true,
                path: Bytes::new(),
                message: e.to_string(),
            });
            crate::wire::write_frame(&mut stream, &error).await?;
            if Judge::from_flags(flags, filter.clone(), link_dest, request.max_delete).any() {
                // The client is sending its listing before it reads: take it in, so that
                // it gets to read why.
                drain_listing(&mut FrameReader::new(stream, session::MAX_FRAME), idle).await;
            }
            return Err(Error::Engine(e));
        }
        let judge = Judge::from_flags(flags, filter.clone(), link_dest, request.max_delete);
        if judge.any() {
            return judge_for_client(stream, target, &judge, idle).await;
        }
    } else {
        let mut config = WalkConfig::new(
            flags & flags::RECURSIVE != 0,
            flags & flags::FOLLOW_LINKS != 0,
        );
        config.filter = filter;
        config.devices = flags & flags::DEVICES != 0;
        config.specials = flags & flags::SPECIALS != 0;
        config.one_file_system = flags & flags::ONE_FILE_SYSTEM != 0;
        let mut id = 0;
        // With -H, the id each file with several names was first listed with: its further
        // names are listed with it too.
        let mut ids = std::collections::HashMap::new();
        let hard_links = flags & flags::HARD_LINKS != 0;
        for entry in fastcp_stream::walk(sources, &config) {
            let entry = readable(entry, config.follow_links);
            let frame = match entry {
                Ok(entry) => {
                    let first = match entry.inode.filter(|_| hard_links) {
                        Some(inode) => ids.get(&inode).copied(),
                        None => None,
                    };
                    count(&mut report.local, &entry.kind);
                    // A listing: no access times, which a version 1 client would refuse.
                    let meta = Meta {
                        atime: None,
                        ..entry.meta
                    };
                    match entry.kind {
                        // The client asked for `-x`, so it speaks version 11.
                        EntryKind::Dir if entry.unentered => {
                            Frame::Unentered(fastcp_proto::Unentered { path: entry.wire })
                        }
                        EntryKind::Dir => Frame::Dir(DirEntry {
                            path: entry.wire,
                            meta,
                        }),
                        EntryKind::File { size } => {
                            let id = match first {
                                Some(first) => {
                                    report.local.bytes -= size;
                                    first
                                }
                                None => {
                                    id += 1;
                                    if let Some(inode) = entry.inode.filter(|_| hard_links) {
                                        ids.insert(inode, id);
                                    }
                                    id
                                }
                            };
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
                Err((e, path)) => {
                    report.local.errors += 1;
                    Frame::Error(fastcp_proto::ErrorFrame {
                        code: e.code(),
                        fatal: false,
                        path,
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
/// `dest`, and recounts `report` by what is left. Fails as the copy would when `dest` cannot
/// take the listing (a trailing '/' naming no folder, after a file, say).
pub(crate) fn apply(
    plan: &Plan,
    dest: &Path,
    listing: Vec<Listed>,
    report: &mut Report,
) -> Result<Vec<Listed>, Error> {
    let top_is_dir = listing
        .first()
        .is_none_or(|entry| matches!(entry.kind, EntryKind::Dir));
    fastcp_stream::check_destination(dest, &plan.receive_config(), top_is_dir)?;
    Ok(judge(&Judge::of(plan), dest, listing, report))
}

/// What judging a dry run's listing takes: the copy's quick check and `--delete`.
pub(crate) struct Judge<'a> {
    /// The quick check by size and time (`--skip-unchanged`, `--resume`).
    skip_unchanged: bool,
    /// `--checksum`: a file of the same size may differ, so none is judged unchanged here.
    checksum: bool,
    delete: bool,
    /// `--max-delete`: at most this many entries are listed as deleted.
    max_delete: Option<u64>,
    /// What the rules exclude is not deleted (the mirror's spared filter: see
    /// `Plan::spared`).
    filter: Option<Arc<fastcp_stream::Filter>>,
    /// The source is a folder's contents (`DIR/.`): its top-level entry is the destination.
    contents: bool,
    /// `--link-dest`: a file the reference folder holds alike is linked, not sent.
    link_dest: Option<&'a Path>,
    /// `-X` or `-A`: nothing is linked (the attributes are not compared).
    xattrs: bool,
    /// `-p`: with `--link-dest`, a file in place that shares its mode with other names is
    /// sent when the source's mode differs, rather than changed.
    preserve: bool,
    /// `--size-only`, `--ignore-existing`, `--update`.
    rules: fastcp_stream::SkipRules,
}

impl<'a> Judge<'a> {
    pub(crate) fn of(plan: &'a Plan) -> Judge<'a> {
        let o = &plan.options;
        Judge {
            skip_unchanged: o.skip_unchanged
                || o.resume
                || o.link_dest.is_some()
                || o.skip_rules.any(),
            checksum: o.checksum,
            delete: o.delete,
            max_delete: o.max_delete,
            filter: plan.spared(),
            contents: plan.contents(),
            link_dest: o.link_dest.as_deref(),
            xattrs: o.attrs.xattrs || o.attrs.acls,
            preserve: o.preserve,
            rules: o.skip_rules,
        }
    }

    /// A push's judge, on the server, from its request.
    fn from_flags(
        bits: u32,
        filter: Option<Arc<fastcp_stream::Filter>>,
        link_dest: Option<&'a Path>,
        max_delete: Option<u64>,
    ) -> Judge<'a> {
        Judge {
            skip_unchanged: bits & (flags::SKIP_UNCHANGED | flags::RESUME) != 0,
            checksum: bits & flags::CHECKSUM != 0,
            delete: bits & flags::DELETE != 0,
            max_delete: max_delete.filter(|_| bits & flags::MAX_DELETE != 0),
            filter,
            contents: bits & flags::CONTENTS != 0,
            link_dest: link_dest.filter(|_| bits & flags::LINK_DEST != 0),
            xattrs: bits & (flags::XATTRS | flags::ACLS) != 0,
            preserve: bits & flags::PRESERVE != 0,
            rules: fastcp_stream::SkipRules::from_flags(bits),
        }
    }

    /// Whether there is anything to judge: `--checksum` compares content, which a preview
    /// does not hash, so it alone judges nothing. Both ends of a push's dry run decide by
    /// this, from the same options.
    pub(crate) fn any(&self) -> bool {
        (self.skip_unchanged && !self.checksum) || self.delete
    }
}

/// The quick check and `--delete` applied to `listing` for a copy into the local `dest`;
/// `report` recounted by what is left.
fn judge(j: &Judge, dest: &Path, listing: Vec<Listed>, report: &mut Report) -> Vec<Listed> {
    if !j.any() {
        return listing;
    }
    // The destination named on the command line is followed, as the copy follows it: a
    // symlink to a folder there is that folder, and its entries are what `--delete` removes.
    let resolved;
    let dest = if dest.is_symlink() && dest.is_dir() {
        resolved = std::fs::canonicalize(dest).unwrap_or_else(|_| dest.to_path_buf());
        resolved.as_path()
    } else {
        dest
    };
    let into = dest.is_dir() && !j.contents;
    let local = |wire: &[u8]| -> PathBuf {
        if into {
            return dest.join(std::ffi::OsStr::from_bytes(wire));
        }
        match wire.iter().position(|&b| b == b'/') {
            Some(i) => dest.join(std::ffi::OsStr::from_bytes(&wire[i + 1..])),
            None => dest.to_path_buf(),
        }
    };
    // The reference folder mirrors the destination as named; a relative one is taken from
    // it, which may not exist yet (`../old` beside a new `new`).
    // As the receiver opens it: from the destination when it is the folder entries go
    // into, else from its parent, with `..` taken lexically past the name it will have.
    let reference = j.link_dest.map(|r| match dest.file_name() {
        Some(name) if !into && r.is_relative() => {
            let parent = dest.parent().filter(|p| !p.as_os_str().is_empty());
            parent
                .unwrap_or(Path::new("."))
                .join(lexical(&Path::new(name).join(r)))
        }
        _ => dest.join(r),
    });
    let in_reference = |wire: &[u8]| -> Option<PathBuf> {
        let reference = reference.as_ref()?;
        let rest = match wire.iter().position(|&b| b == b'/') {
            _ if into => wire,
            Some(i) => &wire[i + 1..],
            None => dest.file_name()?.as_bytes(),
        };
        Some(reference.join(std::ffi::OsStr::from_bytes(rest)))
    };
    // As the copy's receiver does, reach nothing through a symlink in the destination: a
    // path counts only when every folder above it, up to `dest`, is a real one.
    let mut real: std::collections::HashMap<PathBuf, bool> = std::collections::HashMap::new();
    let mut reachable = |path: &Path| -> bool {
        let above: Vec<&Path> = path
            .ancestors()
            .skip(1)
            .take_while(|d| *d != dest && d.starts_with(dest))
            .collect();
        above.iter().rev().all(|d| {
            *real
                .entry(d.to_path_buf())
                .or_insert_with(|| std::fs::symlink_metadata(d).is_ok_and(|m| m.is_dir()))
        })
    };
    let sent: HashSet<Bytes> = listing.iter().map(|l| l.path.clone()).collect();
    // What the copy's receiver leaves alone for the sender's failures, or nothing deleted.
    let spared = match j.delete {
        true => fastcp_stream::Spared::of(&report.failures)
            .filter(|_| report.failure_count as usize == report.failures.len()),
        false => None,
    };
    if j.delete && spared.is_none() {
        push_failure(
            report,
            Failure::new(
                Side::Receiver,
                Bytes::new(),
                ErrorCode::Other,
                fastcp_stream::NOTHING_DELETED.into(),
            ),
        );
    }
    let mut kept = Vec::with_capacity(listing.len());
    let mut dirs_in_place = 0;
    let mut deletions = Vec::new();
    let mut mirrored = Vec::new();
    let mut budget = fastcp_stream::DeleteBudget::new(j.max_delete);
    // With -H, the files listed so far: another name of one is made again.
    let mut listed_files = HashSet::new();
    for entry in listing {
        let path = local(&entry.path);
        if let Some(first) = entry
            .first
            .as_ref()
            .filter(|_| j.skip_unchanged && !j.checksum)
        {
            // Another name of a file (-H): as the copy does, made again when its file is
            // sent, or when the destination's name is not yet another name of that file
            // (the link was broken, or the source's links changed), else left in place.
            let file_sent = listed_files.contains(first);
            if file_sent || !reachable(&path) || !same_file(&path, &local(first)) {
                kept.push(entry);
            }
            // Counted as the copy counts a link to a file the quick check skipped, in place
            // or made again: skipped, with no bytes.
            if !file_sent {
                report.files_skipped += 1;
            }
            continue;
        }

        let linked = |size| {
            !j.xattrs
                && in_reference(&entry.path).is_some_and(|r| {
                    reference
                    .as_deref()
                    .is_some_and(|top| real_folders(&r, top))
                    && same_to_the_second(&r, size, &entry.meta)
                    // A link shares its mode, which the copy keeps (`--link-dest` implies -p).
                    && std::fs::symlink_metadata(&r).is_ok_and(|m| {
                        m.mode() & 0o7777 == entry.meta.mode & fastcp_stream::SAFE_MODE_BITS
                    })
                })
        };
        if !reachable(&path) {
            if let EntryKind::File { size } = entry.kind
                && j.skip_unchanged
                && !j.checksum
                && linked(size)
            {
                report.files_skipped += 1;
                report.bytes_skipped += size;
                continue;
            }
            listed_files.insert(entry.path.clone());
            kept.push(entry);
            continue;
        }
        match &entry.kind {
            EntryKind::File { size }
                if j.skip_unchanged
                    && !j.checksum
                    && ((unchanged(&path, *size, &entry.meta, &j.rules)
                        && !(j.link_dest.is_some()
                            && j.preserve
                            && shares_another_mode(&path, &entry.meta)))
                        || linked(*size)) =>
            {
                report.files_skipped += 1;
                report.bytes_skipped += size;
                continue;
            }
            EntryKind::Dir if !entry.unentered && spared.is_some() => {
                mirrored.push((entry.path.clone(), path.clone()));
            }
            _ => {}
        }
        if j.delete && !matches!(entry.kind, EntryKind::Dir) && path != dest {
            in_the_way(j, &path, &entry.path, &mut budget, &mut deletions);
        }
        if j.skip_unchanged && in_place(&path, &entry, j.preserve) {
            // Not listed, but counted as the copy counts every folder it is sent.
            dirs_in_place += u64::from(matches!(entry.kind, EntryKind::Dir));
            continue;
        }
        listed_files.insert(entry.path.clone());
        kept.push(entry);
    }
    // In the order the copy's mirror takes the folders, whatever order they were listed in.
    mirrored.sort_by(|a, b| fastcp_stream::mirror_order(&a.0, &b.0));
    mirrored.dedup_by(|a, b| a.0 == b.0);
    if let Some(spared) = &spared {
        for (wire, path) in &mirrored {
            extras(j, path, wire, (&sent, spared), &mut budget, &mut deletions);
        }
    }
    report.local.files = 0;
    report.local.dirs = 0;
    report.local.symlinks = 0;
    report.local.bytes = 0;
    for entry in &kept {
        count_listed(&mut report.local, entry);
    }
    report.local.dirs += dirs_in_place;
    report.local.deleted = deletions.len() as u64;
    if let Some(message) = budget.message() {
        push_failure(
            report,
            Failure::new(
                Side::Receiver,
                Bytes::new(),
                ErrorCode::DeleteLimit,
                message,
            ),
        );
    }
    kept.extend(deletions);
    kept
}

/// Whether every folder above `path`, up to `top`, is a real one (no symlink), as the
/// receiver reaches them.
fn real_folders(path: &Path, top: &Path) -> bool {
    path.ancestors()
        .skip(1)
        .take_while(|d| *d != top && d.starts_with(top))
        .all(|d| std::fs::symlink_metadata(d).is_ok_and(|m| m.is_dir()))
}

/// `path` with its `..` taken lexically: a folder before it may not exist yet.
fn lexical(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for part in path.components() {
        match part {
            std::path::Component::ParentDir
                if matches!(
                    out.components().next_back(),
                    Some(std::path::Component::Normal(_))
                ) =>
            {
                out.pop();
            }
            std::path::Component::CurDir => {}
            other => out.push(other),
        }
    }
    out
}

/// A regular file at `path` with this size and modification time to the second where
/// either has none finer: `--link-dest` links it, as the receiver does.
fn same_to_the_second(path: &Path, size: u64, meta: &Meta) -> bool {
    std::fs::symlink_metadata(path).is_ok_and(|m| {
        m.is_file()
            && m.len() == size
            && fastcp_stream::same_mtime(
                (m.mtime(), m.mtime_nsec() as u32),
                (meta.mtime, meta.mtime_nsec),
            )
    })
}

/// A file at `path` with other names (last night's, with `--link-dest`) and a mode other
/// than `meta`'s: the receiver sends it, a file of its own, rather than change theirs.
fn shares_another_mode(path: &Path, meta: &Meta) -> bool {
    std::fs::symlink_metadata(path).is_ok_and(|m| {
        m.nlink() > 1 && m.mode() & 0o7777 != meta.mode & fastcp_stream::SAFE_MODE_BITS
    })
}

/// Whether `a` and `b` are names of the same file (links not followed).
fn same_file(a: &Path, b: &Path) -> bool {
    let id = |p: &Path| {
        std::fs::symlink_metadata(p)
            .map(|m| (m.dev(), m.ino()))
            .ok()
    };
    id(a).is_some_and(|a| Some(a) == id(b))
}

/// A regular file at `path` with this size and modification time: the quick check skips it.
fn unchanged(path: &Path, size: u64, meta: &Meta, rules: &fastcp_stream::SkipRules) -> bool {
    std::fs::symlink_metadata(path).is_ok_and(|m| {
        let theirs = (m.mtime(), m.mtime_nsec() as u32);
        let ours = (meta.mtime, meta.mtime_nsec);
        // As the receiver judges: what `--ignore-existing` and `--update` leave, first.
        rules.existing
            || (rules.newer && theirs > ours)
            || (m.is_file()
                && m.len() == size
                && (rules.size_only || fastcp_stream::same_mtime(theirs, ours)))
    })
}

/// Whether the destination already has a folder, link or special file at `path` as the
/// quick check would leave it: a real folder for a folder, a link to the same target for a
/// link, the same kind of special file (device number, and with `preserve` mode and
/// modification time) for a named pipe, socket or device node. A rerun makes nothing new of
/// folders and links (it brings their attributes in line, as it does a skipped file's), nor
/// of special files in line, so a dry run does not list them, as rsync lists only what it
/// would transfer.
fn in_place(path: &Path, entry: &Listed, preserve: bool) -> bool {
    use std::os::unix::fs::FileTypeExt;
    match &entry.kind {
        EntryKind::Special { kind, rdev } => std::fs::symlink_metadata(path).is_ok_and(|m| {
            let t = m.file_type();
            let same_kind = match kind {
                SpecialKind::Fifo => t.is_fifo(),
                SpecialKind::Socket => t.is_socket(),
                SpecialKind::CharDevice => t.is_char_device(),
                SpecialKind::BlockDevice => t.is_block_device(),
            };
            let meta = &entry.meta;
            same_kind
                && m.rdev() == *rdev
                && (!preserve
                    || (m.mode() & 0o7777 == meta.mode & fastcp_stream::SAFE_MODE_BITS
                        && m.mtime() == meta.mtime
                        && m.mtime_nsec() == i64::from(meta.mtime_nsec)))
        }),
        EntryKind::Dir => std::fs::symlink_metadata(path).is_ok_and(|m| m.is_dir()),
        EntryKind::Symlink { target } => {
            std::fs::read_link(path).is_ok_and(|t| t.as_os_str().as_bytes() == &target[..])
        }
        _ => false,
    }
}

/// What the directory at `dir` (wire path `wire`) holds beyond what was sent and spared:
/// what `--delete` would remove, within `budget`, in name order as the copy removes them, a
/// folder after everything it holds (as rsync's `-n` lists them, so that the count is the
/// copy's). A directory that is not there, or is a symlink, holds nothing to remove.
fn extras(
    j: &Judge,
    dir: &Path,
    wire: &[u8],
    (sent, spared): (&HashSet<Bytes>, &fastcp_stream::Spared),
    budget: &mut fastcp_stream::DeleteBudget,
    out: &mut Vec<Listed>,
) {
    if !std::fs::symlink_metadata(dir).is_ok_and(|m| m.is_dir()) {
        return;
    }
    let Ok(names) = std::fs::read_dir(dir) else {
        return;
    };
    let mut found = Vec::new();
    for entry in names.flatten() {
        let name = entry.file_name();
        let path = joined(wire, name.as_bytes());
        if sent.contains(&path[..])
            || spared.spares(&path)
            || fastcp_stream::is_work_file(name.as_bytes())
        {
            continue;
        }
        let Ok(m) = entry.metadata() else { continue };
        if let Some(filter) = j.filter.as_deref()
            && (!filter.allows(&path, m.is_dir())
                || m.is_dir() && fastcp_stream::holds_excluded_at(&entry.path(), &path, filter))
        {
            continue;
        }
        found.push((entry.path(), deleted(path, &entry.path(), &m)));
    }
    found.sort_by(|a, b| a.1.path.cmp(&b.1.path));
    for (here, listed) in found {
        if budget.is_limited() && !budget.take(fastcp_stream::entries_at(&here)) {
            continue;
        }
        if matches!(listed.kind, EntryKind::Dir) {
            everything_in(&here, &listed.path, out);
        }
        out.push(listed);
    }
}

/// What `--delete` removes where a file or link of the copy lands at `path` (wire path
/// `wire`): a folder with entries there, with all it holds, as the copy clears it out of
/// the way (within `budget`), unless it holds what `--delete` keeps (what the rules
/// exclude, another copy's temp file). An empty folder goes unlisted, as the copy removes
/// it without counting it.
fn in_the_way(
    j: &Judge,
    path: &Path,
    wire: &[u8],
    budget: &mut fastcp_stream::DeleteBudget,
    out: &mut Vec<Listed>,
) {
    let Ok(m) = std::fs::symlink_metadata(path) else {
        return;
    };
    if !m.is_dir() {
        return;
    }
    let mut held = Vec::new();
    everything_in(path, wire, &mut held);
    let kept = |l: &Listed| {
        let leaf = l.path.rsplit(|&b| b == b'/').next().unwrap_or(&l.path);
        fastcp_stream::is_temp_name(leaf)
            || j.filter
                .as_deref()
                .is_some_and(|f| !f.allows(&l.path, matches!(l.kind, EntryKind::Dir)))
    };
    if held.is_empty() || held.iter().any(kept) {
        return;
    }
    if budget.is_limited() && !budget.take(held.len() as u64 + 1) {
        return;
    }
    out.extend(held);
    out.push(deleted(wire.to_vec(), path, &m));
}

/// Everything the folder at `dir` (wire path `wire`) holds, at any depth, as entries
/// `--delete` removes with it: in name order, each folder after what it holds. Links are not
/// followed; what cannot be read holds nothing.
fn everything_in(dir: &Path, wire: &[u8], out: &mut Vec<Listed>) {
    let Ok(names) = std::fs::read_dir(dir) else {
        return;
    };
    let mut found: Vec<_> = names
        .flatten()
        .filter_map(|entry| {
            let m = entry.metadata().ok()?;
            let path = joined(wire, entry.file_name().as_bytes());
            Some((entry.path(), deleted(path, &entry.path(), &m)))
        })
        .collect();
    found.sort_by(|a, b| a.1.path.cmp(&b.1.path));
    for (here, listed) in found {
        if matches!(listed.kind, EntryKind::Dir) {
            everything_in(&here, &listed.path, out);
        }
        out.push(listed);
    }
}

/// `wire/name`.
fn joined(wire: &[u8], name: &[u8]) -> Vec<u8> {
    let mut path = Vec::with_capacity(wire.len() + 1 + name.len());
    path.extend_from_slice(wire);
    path.push(b'/');
    path.extend_from_slice(name);
    path
}

/// The destination's entry at `here` (metadata `m`, not followed), listed as removed at
/// `path`.
fn deleted(path: Vec<u8>, here: &Path, m: &std::fs::Metadata) -> Listed {
    let kind = if m.is_dir() {
        EntryKind::Dir
    } else if m.file_type().is_symlink() {
        let target = std::fs::read_link(here).unwrap_or_default();
        EntryKind::Symlink {
            target: Bytes::copy_from_slice(target.as_os_str().as_bytes()),
        }
    } else {
        EntryKind::File { size: m.len() }
    };
    Listed {
        path: Bytes::from(path),
        kind,
        meta: Meta {
            mode: m.mode() & 0o7777,
            mtime: m.mtime(),
            mtime_nsec: m.mtime_nsec().clamp(0, 999_999_999) as u32,
            atime: None,
        },
        delete: true,
        unentered: false,
        another_name: false,
        first: None,
    }
}

/// The frame that lists `entry` (a `File` as `id`; a directory `-x` did not enter as an
/// `Unentered`, which only a version 11 peer is sent: a listing's folders need no times).
fn listing_frame(entry: &Listed, id: u64) -> Frame {
    let meta = entry.meta;
    match &entry.kind {
        EntryKind::Dir if entry.unentered => Frame::Unentered(fastcp_proto::Unentered {
            path: entry.path.clone(),
        }),
        EntryKind::Dir => Frame::Dir(DirEntry {
            path: entry.path.clone(),
            meta,
        }),
        EntryKind::File { size } => Frame::File(FileEntry {
            id,
            path: entry.path.clone(),
            size: *size,
            meta,
        }),
        EntryKind::Symlink { target } => Frame::Symlink(SymlinkEntry {
            path: entry.path.clone(),
            target: target.clone(),
            times: None,
        }),
        EntryKind::Special { kind, rdev } => Frame::Special(fastcp_proto::SpecialEntry {
            path: entry.path.clone(),
            kind: *kind,
            rdev: *rdev,
            meta,
        }),
    }
}

/// A listing entry from a frame of a listing (its path copied out: a slice would pin the
/// whole receive buffer), with a file's id; `None` for any other frame.
fn listed_from(frame: Frame) -> Option<(Option<u64>, Listed)> {
    let listed = |path: Bytes, kind, meta: Meta| Listed {
        path: Bytes::copy_from_slice(&path),
        kind,
        meta: Meta {
            atime: None,
            ..meta
        },
        delete: false,
        unentered: false,
        another_name: false,
        first: None,
    };
    Some(match frame {
        Frame::Dir(d) => (None, listed(d.path, EntryKind::Dir, d.meta)),
        Frame::Unentered(u) => (
            None,
            Listed {
                unentered: true,
                ..listed(u.path, EntryKind::Dir, Meta::default())
            },
        ),
        Frame::File(f) => (
            Some(f.id),
            listed(f.path, EntryKind::File { size: f.size }, f.meta),
        ),
        Frame::Symlink(l) => (
            None,
            listed(
                l.path,
                EntryKind::Symlink { target: l.target },
                Meta::default(),
            ),
        ),
        Frame::Special(e) => (
            None,
            listed(
                e.path,
                EntryKind::Special {
                    kind: e.kind,
                    rdev: e.rdev,
                },
                e.meta,
            ),
        ),
        _ => return None,
    })
}

/// A push's dry run judged on the server (protocol version 6, checked by the caller; `version`
/// is the one agreed): this side sends its listing (each `File` numbered by its place in it)
/// and a `Done`; the server answers
/// `Answer { send: false }` for each file its quick check would skip, lists what `--delete`
/// would remove, and ends with `Done`.
async fn judged_remotely(
    plan: &Plan,
    version: u16,
    reader: &mut FrameReader<BoxStream>,
    progress: &fastcp_stream::Progress,
    done: &mut SessionDone,
) -> Result<(), Error> {
    // Under the idle limit, which sees the stream's bytes move (a slow link or a low
    // `--bwlimit` is no stall): a server that stopped reading is not waited for.
    let sending = async {
        let mut out = bytes::BytesMut::new();
        for (i, entry) in done.listing.iter().enumerate() {
            let frame = match &entry.first {
                // Another name (-H), which a server of version 14 judges as a link.
                Some(first) if version >= 14 => Frame::HardLink(fastcp_proto::HardLink {
                    path: entry.path.clone(),
                    target: first.clone(),
                }),
                _ => listing_frame(entry, i as u64),
            };
            fastcp_proto::encode(&frame, &mut out);
            if out.len() >= 64 << 10 {
                reader.send_bytes(&out.split()).await?;
            }
        }
        fastcp_proto::encode(&Frame::Done(Summary::default()), &mut out);
        Ok(reader.send_bytes(&out).await?)
    };
    crate::client::within_idle_limit(progress, plan.options.timeout, sending).await?;
    // The server judges the listing without the walk's failures, which the copy's receiver
    // hears of: one it cannot pass over leaves nothing deleted (and no limit reached), and
    // what the walk skipped on purpose stays.
    let spared = fastcp_stream::Spared::of(&done.report.failures)
        .filter(|_| done.report.failure_count as usize == done.report.failures.len());
    let mut skipped = HashSet::new();
    let mut deletions = Vec::new();
    loop {
        let frame = within(
            plan.options.timeout,
            DRY_RUN_WAIT,
            reader.next("judging the push"),
        )
        .await?;
        match frame {
            Frame::Answer(a) if !a.send => {
                skipped.insert(a.id);
            }
            Frame::Done(_) => break,
            Frame::Error(e) if e.fatal => {
                return Err(Error::Engine(fastcp_stream::Error::from_frame(&e)));
            }
            Frame::Error(e) if e.code == ErrorCode::DeleteLimit && spared.is_none() => {}
            Frame::Error(e) => push_failure(
                &mut done.report,
                Failure::new(Side::Receiver, e.path, e.code, e.message),
            ),
            frame => match listed_from(frame) {
                Some((_, entry)) => {
                    if spared.as_ref().is_some_and(|s| !s.spares(&entry.path)) {
                        deletions.push(Listed {
                            delete: true,
                            ..entry
                        });
                    }
                }
                None => {
                    return Err(Error::Protocol(fastcp_proto::DecodeError::Invalid {
                        frame: "dry run",
                        what: "the server answered a push's listing with another frame",
                    }));
                }
            },
        }
    }
    if plan.options.delete && spared.is_none() {
        push_failure(
            &mut done.report,
            Failure::new(
                Side::Receiver,
                Bytes::new(),
                ErrorCode::Other,
                fastcp_stream::NOTHING_DELETED.into(),
            ),
        );
    }
    let report = &mut done.report;
    let mut kept = Vec::with_capacity(done.listing.len());
    let mut dirs_in_place = 0;
    // The files the quick check skips: another name of one counts as skipped too, in
    // place or made again, as the copy counts it.
    let mut files_skipped = HashSet::new();
    for (i, entry) in std::mem::take(&mut done.listing).into_iter().enumerate() {
        let skip = skipped.contains(&(i as u64));
        if entry
            .first
            .as_ref()
            .is_some_and(|f| files_skipped.contains(f))
        {
            report.files_skipped += 1;
        } else if skip {
            // A file the quick check skips, or a folder or link already in place (a folder
            // still counted, as the copy counts every folder it is sent).
            match &entry.kind {
                EntryKind::File { size } if !entry.another_name => {
                    report.files_skipped += 1;
                    report.bytes_skipped += size;
                    files_skipped.insert(entry.path.clone());
                }
                EntryKind::File { .. } => report.files_skipped += 1,
                EntryKind::Dir => dirs_in_place += 1,
                _ => {}
            }
        }
        if !skip {
            kept.push(entry);
        }
    }
    report.local = Summary {
        errors: report.local.errors,
        ..Summary::default()
    };
    for entry in &kept {
        count_listed(&mut report.local, entry);
    }
    report.local.dirs += dirs_in_place;
    report.local.deleted = deletions.len() as u64;
    kept.extend(deletions);
    done.listing = kept;
    Ok(())
}

/// The server's side of [`judged_remotely`]: reads the push's listing (each frame within
/// `idle`), judges it against `target` as the copy would, and answers.
async fn judge_for_client<S>(
    stream: S,
    target: &Path,
    by: &Judge<'_>,
    idle: Option<std::time::Duration>,
) -> Result<Report, Error>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let mut reader = FrameReader::new(stream, session::MAX_FRAME);
    let (listing, ids) = match read_listing(&mut reader, idle).await {
        Ok(read) => read,
        Err(e) => {
            // Told on the stream, and the rest of the listing taken in: the client reads
            // only once it has sent it all.
            let error = Frame::Error(fastcp_proto::ErrorFrame {
                code: e.code(),
                fatal: true,
                path: Bytes::new(),
                message: e.to_string(),
            });
            if reader.send(&error).await.is_ok() {
                drain_listing(&mut reader, idle).await;
            }
            return Err(e);
        }
    };
    let mut report = Report::default();
    let judged = judge(by, target, listing.clone(), &mut report);
    let kept: HashSet<Bytes> = judged
        .iter()
        .filter(|l| !l.delete)
        .map(|l| l.path.clone())
        .collect();
    let mut out = bytes::BytesMut::new();
    for (i, entry) in listing.iter().enumerate() {
        if !kept.contains(&entry.path) {
            // A file by its id; a folder or link, which has none, by its place in the
            // listing, which is what the client numbers its files by too. A client before
            // folders and links were judged here keeps them listed, as it always did.
            let id = ids[i].unwrap_or(i as u64);
            fastcp_proto::encode(
                &Frame::Answer(fastcp_proto::Answer {
                    id,
                    send: false,
                    hash: None,
                }),
                &mut out,
            );
        }
    }
    for entry in judged.iter().filter(|l| l.delete) {
        fastcp_proto::encode(&listing_frame(entry, 0), &mut out);
    }
    // What the judging reports (the limit of `--max-delete`), as the copy would.
    for f in &report.failures {
        fastcp_proto::encode(
            &Frame::Error(fastcp_proto::ErrorFrame {
                code: f.code,
                fatal: false,
                path: f.path.clone(),
                message: f.message.clone(),
            }),
            &mut out,
        );
    }
    fastcp_proto::encode(&Frame::Done(report.local), &mut out);
    let mut stream = reader.into_stream();
    stream.write_all(&out).await?;
    stream.flush().await?;
    Ok(report)
}

/// A push's listing, up to its `Done`, each frame within `idle`: the entries, and the id of
/// each file (`None` for other entries).
async fn read_listing<S: AsyncRead + Unpin>(
    reader: &mut FrameReader<S>,
    idle: Option<std::time::Duration>,
) -> Result<(Vec<Listed>, Vec<Option<u64>>), Error> {
    let mut listing = Vec::new();
    let mut ids = Vec::new();
    loop {
        let frame = within(
            idle,
            DRY_RUN_WAIT,
            reader.next("reading the push's listing"),
        )
        .await?;
        if matches!(frame, Frame::Done(_)) {
            return Ok((listing, ids));
        }
        let name = frame.name();
        let (id, entry) = match frame {
            // Another name of a file listed before it (-H, a client of version 14).
            Frame::HardLink(h) => {
                if fastcp_proto::path::validate(&h.target).is_err() {
                    return Err(Error::Protocol(fastcp_proto::DecodeError::Invalid {
                        frame: "dry run",
                        what: "a hard link's file is not a safe relative path",
                    }));
                }
                let path = Bytes::copy_from_slice(&h.path);
                let (_, file) = listed_from(Frame::File(FileEntry {
                    id: 0,
                    path,
                    size: 0,
                    meta: Meta::default(),
                }))
                .expect("a File frame is a listing's");
                let first = Some(Bytes::copy_from_slice(&h.target));
                let another_name = true;
                (
                    None,
                    Listed {
                        first,
                        another_name,
                        ..file
                    },
                )
            }
            frame => match listed_from(frame) {
                Some(listed) => listed,
                None => {
                    return Err(Error::UnexpectedFrame {
                        expected: "a listing",
                        got: name,
                    });
                }
            },
        };
        if fastcp_proto::path::validate(&entry.path).is_err() {
            return Err(Error::Protocol(fastcp_proto::DecodeError::Invalid {
                frame: "dry run",
                what: "a listed path is not a safe relative path",
            }));
        }
        ids.push(id);
        listing.push(entry);
        if listing.len() as u64 > fastcp_stream::DEFAULT_MAX_ENTRIES {
            return Err(Error::Unsupported(
                "the push's listing is longer than a copy may be".into(),
            ));
        }
    }
}

/// Reads and drops what is left of a push's listing, up to its `Done` or the end of the
/// stream, each frame within `idle` (and at most as many as a listing may hold).
async fn drain_listing<S: AsyncRead + Unpin>(
    reader: &mut FrameReader<S>,
    idle: Option<std::time::Duration>,
) {
    for _ in 0..=fastcp_stream::DEFAULT_MAX_ENTRIES {
        match within(
            idle,
            DRY_RUN_WAIT,
            reader.next("reading the push's listing"),
        )
        .await
        {
            Ok(Frame::Done(_)) | Err(_) => return,
            Ok(_) => {}
        }
    }
}
