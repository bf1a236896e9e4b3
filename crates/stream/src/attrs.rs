//! Owners and extended attributes (`--owner`, `--group`, `-X`, `-A`): read on the sending
//! side into an [`Attrs`] frame, applied on the receiving side through the entry's own file
//! descriptor (or, for a symbolic link, its parent's), never through a path.

use std::collections::HashMap;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;

use bytes::Bytes;
use fastcp_proto::{Attrs, MAX_ID_NAME, MAX_XATTR_VALUE, MAX_XATTRS, flags};
use rustix::fs::{AtFlags, Gid, Uid, XattrFlags};
use rustix::io::Errno;

/// Which of an entry's owner and extended attributes a copy keeps. All off by default.
///
/// ```
/// use fastcp_stream::KeepAttrs;
///
/// let keep = KeepAttrs { owner: true, group: true, ..KeepAttrs::default() };
/// assert!(keep.any());
/// assert_eq!(KeepAttrs::from_flags(keep.flags()), keep);
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct KeepAttrs {
    /// The owner (`--owner`). Only a receiver running as root can give a file away; any
    /// other receiver leaves its files its own, as rsync does.
    pub owner: bool,
    /// The group (`--group`). A receiver that is not root sets the groups it belongs to and
    /// leaves the others.
    pub group: bool,
    /// Map owners and groups by number, never by name (`--numeric-ids`). Without it the
    /// receiver looks each sender's name up in its own user database and falls back to the
    /// number when the name is unknown there; ids 0 always go by number, as in rsync.
    pub numeric_ids: bool,
    /// Extended attributes (`-X`): `user.*`, and `trusted.*` and `security.*` as far as
    /// the receiver may set them. `security.capability` is never set: like the setuid bit,
    /// it would let the sender hand the receiving user a program with more rights.
    pub xattrs: bool,
    /// POSIX ACLs (`-A`), which Linux keeps as the `system.posix_acl_access` and
    /// `system.posix_acl_default` attributes. The ids inside travel as numbers.
    pub acls: bool,
}

impl KeepAttrs {
    /// True when anything is kept, and so an [`Attrs`] frame precedes each entry.
    pub fn any(&self) -> bool {
        self.owner || self.group || self.xattrs || self.acls
    }

    /// The request bits for these choices.
    pub fn flags(&self) -> u32 {
        [
            (self.owner, flags::OWNER),
            (self.group, flags::GROUP),
            (self.numeric_ids, flags::NUMERIC_IDS),
            (self.xattrs, flags::XATTRS),
            (self.acls, flags::ACLS),
        ]
        .iter()
        .filter(|(on, _)| *on)
        .fold(0, |acc, (_, bit)| acc | bit)
    }

    /// The choices a request's bits make.
    pub fn from_flags(bits: u32) -> KeepAttrs {
        KeepAttrs {
            owner: bits & flags::OWNER != 0,
            group: bits & flags::GROUP != 0,
            numeric_ids: bits & flags::NUMERIC_IDS != 0,
            xattrs: bits & flags::XATTRS != 0,
            acls: bits & flags::ACLS != 0,
        }
    }

    /// Whether the attribute `name` is one these choices keep (and the receiver may set).
    fn keeps(&self, name: &[u8]) -> bool {
        const ACLS: [&[u8]; 2] = [b"system.posix_acl_access", b"system.posix_acl_default"];
        if ACLS.contains(&name) {
            return self.acls;
        }
        self.xattrs
            && name != b"security.capability"
            && [&b"user."[..], b"trusted.", b"security."]
                .iter()
                .any(|ns| name.starts_with(ns))
    }
}

/// What an entry is, to read its attributes.
pub(crate) enum Source<'a> {
    /// An open regular file.
    Fd(&'a OwnedFd),
    /// An entry of the walk, by path (never followed), with the owner and group the walk
    /// saw.
    Path(&'a Path, (u32, u32)),
}

/// User and group names by id, looked up once each (sending side).
#[derive(Debug, Default)]
pub(crate) struct Names {
    users: HashMap<u32, Bytes>,
    groups: HashMap<u32, Bytes>,
}

impl Names {
    fn user(&mut self, uid: u32) -> Bytes {
        self.users
            .entry(uid)
            .or_insert_with(|| {
                let user = nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(uid));
                name_bytes(user.ok().flatten().map(|u| u.name))
            })
            .clone()
    }

    fn group(&mut self, gid: u32) -> Bytes {
        self.groups
            .entry(gid)
            .or_insert_with(|| {
                let group = nix::unistd::Group::from_gid(nix::unistd::Gid::from_raw(gid));
                name_bytes(group.ok().flatten().map(|g| g.name))
            })
            .clone()
    }
}

fn name_bytes(name: Option<String>) -> Bytes {
    name.filter(|n| n.len() <= MAX_ID_NAME)
        .map(Bytes::from)
        .unwrap_or_default()
}

/// Reads what `keep` asks for of one entry, for the [`Attrs`] frame that precedes it.
/// Attributes the filesystem does not support, or this user may not read, are left out.
pub(crate) fn read(
    wire: &Bytes,
    source: Source<'_>,
    keep: &KeepAttrs,
    names: &mut Names,
) -> io::Result<Attrs> {
    let (uid, gid) = match &source {
        Source::Fd(fd) => {
            let st = rustix::fs::fstat(fd)?;
            (st.st_uid, st.st_gid)
        }
        Source::Path(_, owner) => *owner,
    };
    let mut attrs = Attrs {
        path: wire.clone(),
        uid,
        gid,
        ..Attrs::default()
    };
    if keep.owner && !keep.numeric_ids {
        attrs.user = names.user(uid);
    }
    if keep.group && !keep.numeric_ids {
        attrs.group = names.group(gid);
    }
    if keep.xattrs || keep.acls {
        attrs.xattrs = read_xattrs(&source, keep)?;
    }
    Ok(attrs)
}

fn read_xattrs(source: &Source<'_>, keep: &KeepAttrs) -> io::Result<Vec<(Bytes, Bytes)>> {
    let list = match source {
        Source::Fd(fd) => grow(|buf| rustix::fs::flistxattr(fd, buf)),
        Source::Path(p, _) => grow(|buf| rustix::fs::llistxattr(*p, buf)),
    };
    let list = match list {
        Ok(l) => l,
        Err(Errno::NOTSUP) => return Ok(Vec::new()),
        Err(e) => return Err(e.into()),
    };
    let mut out = Vec::new();
    for name in list.split(|&b| b == 0).filter(|n| !n.is_empty()) {
        if !keep.keeps(name) || out.len() == MAX_XATTRS {
            continue;
        }
        let value = match source {
            Source::Fd(fd) => grow(|buf| rustix::fs::fgetxattr(fd, name, buf)),
            Source::Path(p, _) => grow(|buf| rustix::fs::lgetxattr(*p, name, buf)),
        };
        match value {
            Ok(v) if v.len() <= MAX_XATTR_VALUE => {
                out.push((Bytes::copy_from_slice(name), Bytes::from(v)))
            }
            // Gone since the listing, or not ours to read.
            Ok(_) | Err(Errno::NODATA | Errno::PERM | Errno::ACCESS) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(out)
}

/// Runs a list or get call into a buffer that grows until the answer fits.
fn grow(
    mut call: impl FnMut(&mut [u8]) -> rustix::io::Result<usize>,
) -> rustix::io::Result<Vec<u8>> {
    let mut buf = vec![0u8; 256];
    loop {
        match call(&mut buf) {
            Ok(n) => {
                buf.truncate(n);
                return Ok(buf);
            }
            Err(Errno::RANGE) if buf.len() < 1 << 20 => buf.resize(buf.len() * 4, 0),
            Err(e) => return Err(e),
        }
    }
}

/// Ids by the sender's names, looked up once each (receiving side).
#[derive(Debug, Default)]
pub(crate) struct Ids {
    users: HashMap<Bytes, Option<u32>>,
    groups: HashMap<Bytes, Option<u32>>,
}

impl Ids {
    /// The owner and group `attrs` ask this receiver for, under `keep`: the owner only when
    /// running as root.
    pub(crate) fn wanted(&mut self, attrs: &Attrs, keep: &KeepAttrs) -> (Option<u32>, Option<u32>) {
        let root = rustix::process::geteuid().is_root();
        (
            (keep.owner && root).then(|| self.uid(attrs)),
            keep.group.then(|| self.gid(attrs)),
        )
    }

    /// Whether a file owned by `uid`:`gid` already has what `attrs` ask for under `keep`,
    /// when they carry no extended attributes to compare.
    pub(crate) fn in_line(&mut self, attrs: &Attrs, keep: &KeepAttrs, uid: u32, gid: u32) -> bool {
        let (want_uid, want_gid) = self.wanted(attrs, keep);
        !(keep.xattrs || keep.acls)
            && want_uid.is_none_or(|u| u == uid)
            && want_gid.is_none_or(|g| g == gid)
    }

    /// The local uid for the sender's owner: by name unless it is empty, unknown here, or
    /// for id 0.
    fn uid(&mut self, attrs: &Attrs) -> u32 {
        if attrs.uid == 0 || attrs.user.is_empty() {
            return attrs.uid;
        }
        let by_name = self.users.entry(attrs.user.clone()).or_insert_with(|| {
            let name = std::str::from_utf8(&attrs.user).ok()?;
            let user = nix::unistd::User::from_name(name).ok().flatten()?;
            Some(user.uid.as_raw())
        });
        by_name.unwrap_or(attrs.uid)
    }

    fn gid(&mut self, attrs: &Attrs) -> u32 {
        if attrs.gid == 0 || attrs.group.is_empty() {
            return attrs.gid;
        }
        let by_name = self.groups.entry(attrs.group.clone()).or_insert_with(|| {
            let name = std::str::from_utf8(&attrs.group).ok()?;
            let group = nix::unistd::Group::from_name(name).ok().flatten()?;
            Some(group.gid.as_raw())
        });
        by_name.unwrap_or(attrs.gid)
    }
}

/// What an entry is, to set its attributes.
pub(crate) enum Target<'a> {
    /// An open regular file or directory.
    Fd(&'a OwnedFd),
    /// A symbolic link, by its name in its parent directory: only its owner is set (Linux
    /// keeps no `user.*` attributes on links).
    Link(&'a OwnedFd, &'a [u8]),
}

/// Sets what `keep` asks for on a received entry: the owner and group first (a change of
/// owner clears the setuid bits, and the mode is set after this), then the attributes. A
/// directory that was already there loses the kept attributes the sender's does not have.
pub(crate) fn apply(
    target: Target<'_>,
    attrs: &Attrs,
    keep: &KeepAttrs,
    ids: &mut Ids,
) -> io::Result<()> {
    let root = rustix::process::geteuid().is_root();
    let (uid, gid) = ids.wanted(attrs, keep);
    let (uid, gid) = (uid.map(Uid::from_raw), gid.map(Gid::from_raw));
    let current = match target {
        Target::Fd(fd) => rustix::fs::fstat(fd)?,
        Target::Link(dir, name) => rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW)?,
    };
    let differs = uid.is_some_and(|u| u.as_raw() != current.st_uid)
        || gid.is_some_and(|g| g.as_raw() != current.st_gid);
    if differs {
        let chown = match target {
            Target::Fd(fd) => rustix::fs::fchown(fd, uid, gid),
            Target::Link(dir, name) => {
                rustix::fs::chownat(dir, name, uid, gid, AtFlags::SYMLINK_NOFOLLOW)
            }
        };
        match chown {
            Ok(()) => {}
            // Not root: a group this user is not in stays as it was, as rsync leaves it.
            Err(Errno::PERM) if !root && uid.is_none() => {}
            Err(e) => return Err(e.into()),
        }
    }
    let Target::Fd(fd) = target else {
        return Ok(());
    };
    if !(keep.xattrs || keep.acls) {
        return Ok(());
    }
    for (name, value) in attrs.xattrs.iter().filter(|(n, _)| keep.keeps(n)) {
        rustix::fs::fsetxattr(fd.as_fd(), &name[..], value, XattrFlags::empty())?;
    }
    // What an existing directory has beyond the sender's: removed.
    let existing = match grow(|buf| rustix::fs::flistxattr(fd, buf)) {
        Ok(l) => l,
        Err(Errno::NOTSUP) => return Ok(()),
        Err(e) => return Err(e.into()),
    };
    for name in existing.split(|&b| b == 0).filter(|n| !n.is_empty()) {
        if keep.keeps(name) && !attrs.xattrs.iter().any(|(n, _)| n == name) {
            match rustix::fs::fremovexattr(fd, name) {
                Ok(()) | Err(Errno::NODATA) => {}
                Err(e) => return Err(e.into()),
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn which_attributes_are_kept() {
        let x = KeepAttrs {
            xattrs: true,
            ..KeepAttrs::default()
        };
        assert!(x.keeps(b"user.comment"));
        assert!(x.keeps(b"trusted.md5"));
        assert!(x.keeps(b"security.selinux"));
        assert!(!x.keeps(b"security.capability"));
        assert!(!x.keeps(b"system.posix_acl_access"));
        assert!(!x.keeps(b"system.nfs4_acl"));
        assert!(!x.keeps(b"other.thing"));
        let a = KeepAttrs {
            acls: true,
            ..KeepAttrs::default()
        };
        assert!(a.keeps(b"system.posix_acl_access"));
        assert!(a.keeps(b"system.posix_acl_default"));
        assert!(!a.keeps(b"user.comment"));
    }

    #[test]
    fn flags_roundtrip() {
        for bits in 0..32u32 {
            let keep = KeepAttrs {
                owner: bits & 1 != 0,
                group: bits & 2 != 0,
                numeric_ids: bits & 4 != 0,
                xattrs: bits & 8 != 0,
                acls: bits & 16 != 0,
            };
            assert_eq!(KeepAttrs::from_flags(keep.flags()), keep);
        }
    }

    #[test]
    fn ids_map_by_name_but_never_root() {
        let mut ids = Ids::default();
        let attrs = |uid, user: &'static [u8]| Attrs {
            uid,
            gid: uid,
            user: Bytes::from_static(user),
            group: Bytes::from_static(user),
            ..Attrs::default()
        };
        // "root" is uid 0 everywhere; a sender's uid 0 stays 0 whatever its name.
        assert_eq!(ids.uid(&attrs(0, b"somebody")), 0);
        assert_eq!(ids.uid(&attrs(4242, b"root")), 0);
        assert_eq!(ids.gid(&attrs(4242, b"root")), 0);
        // A name unknown here falls back to the number.
        assert_eq!(ids.uid(&attrs(4242, b"no-such-user-xyz")), 4242);
        assert_eq!(ids.uid(&attrs(4243, b"")), 4243);
    }
}
