//! What a backup keeps beyond bytes, modes and times: owners and groups (`--owner`,
//! `--group`, `-a`), extended attributes (`-X`) and POSIX ACLs (`-A`), locally and in both
//! directions over SSH and the TCP transport, against a real sshd.

mod common;

use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::process::Command;

use common::*;
use fastcp_testsupport::Sshd;
use fastcp_testsupport::tree::{pseudo_random, write};
use rustix::fs::{Gid, Uid, XattrFlags};

fn set(path: &Path, name: &str, value: &[u8]) {
    rustix::fs::lsetxattr(path, name, value, XattrFlags::empty())
        .unwrap_or_else(|e| panic!("setting {name} on {}: {e}", path.display()));
}

fn get(path: &Path, name: &str) -> Option<Vec<u8>> {
    let mut buf = vec![0u8; 4096];
    match rustix::fs::lgetxattr(path, name, &mut buf[..]) {
        Ok(n) => Some(buf[..n].to_vec()),
        Err(rustix::io::Errno::NODATA) => None,
        Err(e) => panic!("reading {name} of {}: {e}", path.display()),
    }
}

fn chown(path: &Path, uid: u32, gid: u32) {
    rustix::fs::chownat(
        rustix::fs::CWD,
        path,
        Some(Uid::from_raw(uid)),
        Some(Gid::from_raw(gid)),
        rustix::fs::AtFlags::SYMLINK_NOFOLLOW,
    )
    .unwrap();
}

/// A POSIX ACL as Linux stores it in `system.posix_acl_access`: version 2, then (tag, perm,
/// id) entries.
fn acl(entries: &[(u16, u16, u32)]) -> Vec<u8> {
    let mut v = 2u32.to_le_bytes().to_vec();
    for &(tag, perm, id) in entries {
        v.extend_from_slice(&tag.to_le_bytes());
        v.extend_from_slice(&perm.to_le_bytes());
        v.extend_from_slice(&id.to_le_bytes());
    }
    v
}

const NO_ID: u32 = u32::MAX;

/// user::rw-, user:1001:rw-, group::r--, mask::rw-, other::r--
fn sample_acl() -> Vec<u8> {
    acl(&[
        (0x01, 6, NO_ID),
        (0x02, 6, 1001),
        (0x04, 4, NO_ID),
        (0x10, 6, NO_ID),
        (0x20, 4, NO_ID),
    ])
}

/// A file capability (VFS_CAP_REVISION_2, cap_net_raw permitted).
fn capability() -> Vec<u8> {
    let mut v = 0x0200_0000u32.to_le_bytes().to_vec();
    for word in [1u32 << 13, 0, 0, 0] {
        v.extend_from_slice(&word.to_le_bytes());
    }
    v
}

fn is_root() -> bool {
    rustix::process::geteuid().is_root()
}

/// A tree with owners, attributes and an ACL: `d` (1234:5678, user.dirnote), `d/f`
/// (1234:5678, user.note, trusted.t, security.capability), `big` (3 MiB, 2000:2000, an ACL)
/// and the link `d/l` (4321:8765).
fn source(work: &Path) -> std::path::PathBuf {
    let src = work.join("src");
    std::fs::create_dir_all(src.join("d")).unwrap();
    write(&src.join("d/f"), b"small", 0o640);
    write(&src.join("big"), &pseudo_random(3 << 20, 9), 0o664);
    std::os::unix::fs::symlink("f", src.join("d/l")).unwrap();
    set(&src.join("d"), "user.dirnote", b"dd");
    set(&src.join("d/f"), "user.note", b"hello");
    set(&src.join("big"), "system.posix_acl_access", &sample_acl());
    if is_root() {
        // Owners first: a change of owner clears a file capability.
        chown(&src.join("d"), 1234, 5678);
        chown(&src.join("d/f"), 1234, 5678);
        chown(&src.join("big"), 2000, 2000);
        chown(&src.join("d/l"), 4321, 8765);
        set(&src.join("d/f"), "trusted.t", b"tt");
        set(&src.join("d/f"), "security.capability", &capability());
        assert!(get(&src.join("d/f"), "security.capability").is_some());
    }
    src
}

fn owner(path: &Path) -> (u32, u32) {
    let m = std::fs::symlink_metadata(path).unwrap();
    (m.uid(), m.gid())
}

/// The copy `top` kept everything `-a -X -A` keeps, and never a file capability.
fn check_kept(top: &Path) {
    assert_eq!(std::fs::read(top.join("d/f")).unwrap(), b"small");
    assert_eq!(
        get(&top.join("d"), "user.dirnote").as_deref(),
        Some(&b"dd"[..])
    );
    assert_eq!(
        get(&top.join("d/f"), "user.note").as_deref(),
        Some(&b"hello"[..])
    );
    assert_eq!(
        get(&top.join("big"), "system.posix_acl_access"),
        Some(sample_acl()),
        "{}",
        top.display()
    );
    assert_eq!(get(&top.join("d/f"), "security.capability"), None);
    let mode = |p: &str| std::fs::metadata(top.join(p)).unwrap().mode() & 0o7777;
    assert_eq!(mode("d/f"), 0o640);
    assert_eq!(mode("big"), 0o664);
    if is_root() {
        assert_eq!(
            get(&top.join("d/f"), "trusted.t").as_deref(),
            Some(&b"tt"[..])
        );
        assert_eq!(owner(&top.join("d")), (1234, 5678));
        assert_eq!(owner(&top.join("d/f")), (1234, 5678));
        assert_eq!(owner(&top.join("big")), (2000, 2000));
        assert_eq!(owner(&top.join("d/l")), (4321, 8765));
    }
}

/// Without the options the receiving user owns everything and no attribute travels.
fn check_plain(top: &Path) {
    let me = (
        rustix::process::geteuid().as_raw(),
        rustix::process::getegid().as_raw(),
    );
    for p in ["d", "d/f", "big", "d/l"] {
        assert_eq!(owner(&top.join(p)), me, "{p}");
    }
    assert_eq!(get(&top.join("d/f"), "user.note"), None);
    assert_eq!(get(&top.join("d"), "user.dirnote"), None);
    assert_eq!(get(&top.join("big"), "system.posix_acl_access"), None);
}

#[test]
fn owners_xattrs_and_acls_are_kept_locally_and_both_ways_over_ssh_and_tcp() {
    if !is_root() {
        eprintln!("not root: owners are checked only when the tests run as root");
    }
    let sshd = Sshd::start().unwrap();
    let work = tempfile::tempdir().unwrap();
    let src = source(work.path());
    let copies: [(&str, Option<(bool, &str)>); 5] = [
        ("local", None),
        ("ssh-push", Some((false, "ssh"))),
        ("ssh-pull", Some((true, "ssh"))),
        ("tcp-push", Some((false, "tcp"))),
        ("tcp-pull", Some((true, "tcp"))),
    ];
    for (name, how) in copies {
        let dst = work.path().join(name);
        std::fs::create_dir(&dst).unwrap();
        let mut cmd = match how {
            None => Command::new(BIN),
            Some((pull, transport)) => {
                let mut cmd = fastcp(&sshd, bin());
                cmd.args(["--transport", transport, "-j", "2"]);
                if pull {
                    cmd.args(["-a", "-X", "-A"])
                        .arg(remote(&sshd, &src))
                        .arg(&dst);
                } else {
                    cmd.args(["-a", "-X", "-A"])
                        .arg(&src)
                        .arg(remote(&sshd, &dst));
                }
                cmd
            }
        };
        if how.is_none() {
            cmd.args(["-a", "-X", "-A"]).arg(&src).arg(&dst);
        }
        let out = run(&mut cmd);
        assert!(out.status.success(), "{name}: {}", stderr(&out));
        check_kept(&dst.join("src"));
    }
    // Numbers only: the same ids here, where both ends share one user database.
    let numeric = work.path().join("numeric");
    std::fs::create_dir(&numeric).unwrap();
    let out = run(fastcp(&sshd, bin())
        .args(["-a", "-X", "-A", "--numeric-ids"])
        .arg(&src)
        .arg(remote(&sshd, &numeric)));
    assert!(out.status.success(), "{}", stderr(&out));
    check_kept(&numeric.join("src"));

    let plain = work.path().join("plain");
    std::fs::create_dir(&plain).unwrap();
    let out = run(fastcp(&sshd, bin())
        .arg("-rp")
        .arg(&src)
        .arg(remote(&sshd, &plain)));
    assert!(out.status.success(), "{}", stderr(&out));
    check_plain(&plain.join("src"));
}

/// A directory already in the destination takes the sender's attributes and loses the
/// kept ones the sender's lacks; attributes outside what was asked for stay.
#[test]
fn an_existing_directory_is_brought_in_line() {
    let work = tempfile::tempdir().unwrap();
    let src = source(work.path());
    let dst = work.path().join("dst");
    std::fs::create_dir_all(dst.join("src/d")).unwrap();
    set(&dst.join("src/d"), "user.stale", b"old");
    set(&dst.join("src/d"), "user.dirnote", b"old");
    let out = run(Command::new(BIN).args(["-r", "-X"]).arg(&src).arg(&dst));
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(get(&dst.join("src/d"), "user.stale"), None);
    assert_eq!(
        get(&dst.join("src/d"), "user.dirnote").as_deref(),
        Some(&b"dd"[..])
    );
    assert_eq!(
        get(&dst.join("src/d/f"), "user.note").as_deref(),
        Some(&b"hello"[..])
    );
    // -X alone leaves the ACL and the owners.
    assert_eq!(get(&dst.join("src/big"), "system.posix_acl_access"), None);
    let me = rustix::process::geteuid().as_raw();
    assert_eq!(owner(&dst.join("src/d/f")).0, me);
}

/// Not over SFTP: the options are refused before anything is copied.
#[test]
fn sftp_refuses_owners_and_attributes() {
    let sshd = Sshd::start().unwrap();
    let work = tempfile::tempdir().unwrap();
    let src = work.path().join("f");
    write(&src, b"x", 0o644);
    let dst = work.path().join("out");
    std::fs::create_dir(&dst).unwrap();
    for opt in ["--owner", "-X", "-A", "-a"] {
        let out = run(fastcp(&sshd, bin())
            .args(["--sftp", opt])
            .arg(&src)
            .arg(remote(&sshd, &dst)));
        assert!(!out.status.success(), "{opt}");
        assert!(
            stderr(&out).contains("-X and -A"),
            "{opt}: {}",
            stderr(&out)
        );
    }
    assert!(std::fs::read_dir(&dst).unwrap().next().is_none());
}

/// `-D` (and `-a`) copies named pipes, sockets (their names) and device nodes, locally and
/// both ways over SSH, with their modes and times; without it each is skipped with a
/// warning and the rest is copied.
#[test]
fn pipes_sockets_and_devices_with_d() {
    use std::os::unix::fs::FileTypeExt;
    let sshd = Sshd::start().unwrap();
    let work = tempfile::tempdir().unwrap();
    let src = work.path().join("src");
    std::fs::create_dir(&src).unwrap();
    write(&src.join("plain"), b"p", 0o644);
    let mode = |m| rustix::fs::Mode::from_raw_mode(m);
    use rustix::fs::FileType;
    rustix::fs::mknodat(
        rustix::fs::CWD,
        src.join("fifo"),
        FileType::Fifo,
        mode(0o640),
        0,
    )
    .unwrap();
    rustix::fs::mknodat(
        rustix::fs::CWD,
        src.join("sock"),
        FileType::Socket,
        mode(0o600),
        0,
    )
    .unwrap();
    let null = rustix::fs::makedev(1, 3);
    if is_root() {
        rustix::fs::mknodat(
            rustix::fs::CWD,
            src.join("null"),
            FileType::CharacterDevice,
            mode(0o666),
            null,
        )
        .unwrap();
    }
    let check = |top: &Path| {
        let m = |n: &str| std::fs::symlink_metadata(top.join(n)).unwrap();
        assert!(m("fifo").file_type().is_fifo(), "{}", top.display());
        assert_eq!(m("fifo").mode() & 0o7777, 0o640);
        assert!(m("sock").file_type().is_socket());
        assert_eq!(
            m("fifo").mtime(),
            std::fs::symlink_metadata(src.join("fifo")).unwrap().mtime()
        );
        if is_root() {
            assert!(m("null").file_type().is_char_device());
            assert_eq!(m("null").rdev(), null);
        }
        assert_eq!(std::fs::read(top.join("plain")).unwrap(), b"p");
    };
    for (name, how) in [("local", 0), ("push", 1), ("pull", 2)] {
        let dst = work.path().join(name);
        std::fs::create_dir(&dst).unwrap();
        let mut cmd = match how {
            0 => Command::new(BIN),
            _ => fastcp(&sshd, bin()),
        };
        cmd.arg("-rpD");
        match how {
            0 => cmd.arg(&src).arg(&dst),
            1 => cmd.arg(&src).arg(remote(&sshd, &dst)),
            _ => cmd.arg(remote(&sshd, &src)).arg(&dst),
        };
        let out = run(&mut cmd);
        assert!(out.status.success(), "{name}: {}", stderr(&out));
        check(&dst.join("src"));
    }
    // Without -D: skipped, each with a warning that names the option; the rest arrives.
    let dst = work.path().join("without");
    std::fs::create_dir(&dst).unwrap();
    let out = run(Command::new(BIN).arg("-r").arg(&src).arg(&dst));
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(err.contains("--specials copies it"), "{err}");
    assert_eq!(std::fs::read(dst.join("src/plain")).unwrap(), b"p");
    assert!(!dst.join("src/fifo").exists());
}

/// A rerun that skips a file whose bytes did not change still brings its mode, owner and
/// attributes (and with --checksum its times) in line with the source, as rsync does;
/// locally and both ways over SSH.
#[test]
fn a_skipped_file_takes_the_sources_new_mode_owner_and_attributes() {
    let sshd = Sshd::start().unwrap();
    let work = tempfile::tempdir().unwrap();
    let src = work.path().join("src");
    std::fs::create_dir(&src).unwrap();
    write(&src.join("f"), b"same bytes", 0o644);
    write(&src.join("g"), b"other bytes", 0o644);
    for (name, how) in [("local", 0), ("push", 1), ("pull", 2)] {
        let dst = work.path().join(name);
        std::fs::create_dir(&dst).unwrap();
        let copy = |extra: &[&str]| {
            let mut cmd = match how {
                0 => Command::new(BIN),
                _ => fastcp(&sshd, bin()),
            };
            cmd.args(["-a", "-X", "--json"]).args(extra);
            match how {
                0 => cmd.arg(&src).arg(&dst),
                1 => cmd.arg(&src).arg(remote(&sshd, &dst)),
                _ => cmd.arg(remote(&sshd, &src)).arg(&dst),
            };
            let out = run(&mut cmd);
            assert!(out.status.success(), "{name}: {}", stderr(&out));
            json(&out)
        };
        // Start from the plain state each round.
        std::fs::set_permissions(
            src.join("f"),
            std::os::unix::fs::PermissionsExt::from_mode(0o644),
        )
        .unwrap();
        let _ = rustix::fs::lremovexattr(src.join("f"), "user.tag");
        copy(&["--skip-unchanged"]);
        // Only metadata changes: the mtime stays.
        std::fs::set_permissions(
            src.join("f"),
            std::os::unix::fs::PermissionsExt::from_mode(0o600),
        )
        .unwrap();
        set(&src.join("f"), "user.tag", b"v2");
        if is_root() {
            chown(&src.join("f"), 3333, 4444);
        }
        let v = copy(&["--skip-unchanged"]);
        assert_eq!(v["files_skipped"], 2, "{name}: {v}");
        assert_eq!(v["files"], 0, "{name}: {v}");
        let top = dst.join("src");
        let m = std::fs::metadata(top.join("f")).unwrap();
        assert_eq!(m.mode() & 0o7777, 0o600, "{name}");
        assert_eq!(
            get(&top.join("f"), "user.tag").as_deref(),
            Some(&b"v2"[..]),
            "{name}"
        );
        if is_root() {
            assert_eq!(owner(&top.join("f")), (3333, 4444), "{name}");
        }
        // --checksum skips g by content and gives it the source's newer time.
        let later = std::time::SystemTime::now() + std::time::Duration::from_secs(3600);
        std::fs::File::options()
            .write(true)
            .open(src.join("g"))
            .unwrap()
            .set_modified(later)
            .unwrap();
        let v = copy(&["--checksum"]);
        assert_eq!(v["files"], 0, "{name}: {v}");
        assert_eq!(
            std::fs::metadata(top.join("g")).unwrap().mtime(),
            std::fs::metadata(src.join("g")).unwrap().mtime(),
            "{name}"
        );
        if is_root() {
            chown(&src.join("f"), 0, 0);
        }
    }
}
