//! Trees for tests: builders for awkward trees and a comparison that checks bytes, modes,
//! mtimes and link targets.

use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::fs;
use std::io::{Read, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, PermissionsExt, symlink};
use std::path::{Path, PathBuf};

/// What a tree entry looks like, for comparison.
#[derive(Debug, Clone, PartialEq, Eq)]
#[allow(missing_docs)] // The fields are what their names say: mode bits, (sec, nsec), ...
pub enum Node {
    /// A directory.
    Dir { mode: u32, mtime: (i64, i64) },
    /// A regular file, with its BLAKE3 hash.
    File {
        mode: u32,
        mtime: (i64, i64),
        size: u64,
        hash: [u8; 32],
    },
    /// A symbolic link.
    Symlink { target: Vec<u8> },
}

/// Every entry beneath `root` (not `root` itself), by relative path.
pub fn scan(root: &Path) -> BTreeMap<Vec<u8>, Node> {
    let mut out = BTreeMap::new();
    scan_into(root, root, &mut out);
    out
}

fn scan_into(root: &Path, dir: &Path, out: &mut BTreeMap<Vec<u8>, Node>) {
    for entry in fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let rel = path
            .strip_prefix(root)
            .unwrap()
            .as_os_str()
            .as_bytes()
            .to_vec();
        let m = fs::symlink_metadata(&path).unwrap();
        let mtime = (m.mtime(), m.mtime_nsec());
        let mode = m.mode() & 0o7777;
        let node = if m.file_type().is_symlink() {
            Node::Symlink {
                target: fs::read_link(&path)
                    .unwrap()
                    .as_os_str()
                    .as_bytes()
                    .to_vec(),
            }
        } else if m.is_dir() {
            scan_into(root, &path, out);
            Node::Dir { mode, mtime }
        } else {
            Node::File {
                mode,
                mtime,
                size: m.len(),
                hash: hash_file(&path),
            }
        };
        out.insert(rel, node);
    }
}

/// The BLAKE3 hash of a file's content.
pub fn hash_file(path: &Path) -> [u8; 32] {
    let mut f = fs::File::open(path).unwrap();
    let mut h = blake3::Hasher::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf).unwrap();
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    *h.finalize().as_bytes()
}

/// This process's umask.
pub fn umask() -> u32 {
    let s = fs::read_to_string("/proc/self/status").unwrap();
    s.lines()
        .find_map(|l| l.strip_prefix("Umask:"))
        .map(|v| u32::from_str_radix(v.trim(), 8).unwrap())
        .unwrap()
}

/// Asserts that `copy` is an identical copy of `orig`: same names, kinds, bytes, link
/// targets, and modes (exact with `preserve` but for the setuid and setgid bits, which a copy
/// never keeps; less the umask without), and the same mtimes with `preserve`.
pub fn assert_same_tree(orig: &Path, copy: &Path, preserve: bool) {
    let a = scan(orig);
    let b = scan(copy);
    let names = |m: &BTreeMap<Vec<u8>, Node>| -> Vec<String> {
        m.keys()
            .map(|k| String::from_utf8_lossy(k).into_owned())
            .collect()
    };
    assert_eq!(
        names(&a),
        names(&b),
        "different entries in {} and {}",
        orig.display(),
        copy.display()
    );
    let mask = umask();
    for (path, want) in &a {
        let got = &b[path];
        let want = match (want, preserve) {
            (
                Node::File {
                    mode,
                    mtime,
                    size,
                    hash,
                },
                true,
            ) => Node::File {
                mode: mode & 0o1777,
                mtime: *mtime,
                size: *size,
                hash: *hash,
            },
            (Node::Dir { mode, mtime }, true) => Node::Dir {
                mode: mode & 0o1777,
                mtime: *mtime,
            },
            (n, true) => n.clone(),
            (Node::Dir { mode, .. }, false) => Node::Dir {
                mode: mode & 0o777 & !mask,
                mtime: (0, 0),
            },
            (
                Node::File {
                    mode, size, hash, ..
                },
                false,
            ) => Node::File {
                mode: mode & 0o777 & !mask,
                mtime: (0, 0),
                size: *size,
                hash: *hash,
            },
            (n, false) => n.clone(),
        };
        let got = match (got, preserve) {
            (Node::Dir { mode, .. }, false) => Node::Dir {
                mode: *mode,
                mtime: (0, 0),
            },
            (
                Node::File {
                    mode, size, hash, ..
                },
                false,
            ) => Node::File {
                mode: *mode,
                mtime: (0, 0),
                size: *size,
                hash: *hash,
            },
            (n, _) => n.clone(),
        };
        assert_eq!(want, got, "{}", String::from_utf8_lossy(path));
    }
}

/// Asserts that no temp file is left anywhere beneath `root`.
pub fn assert_no_temp(root: &Path) {
    for path in scan(root).keys() {
        let name = path.rsplit(|&b| b == b'/').next().unwrap();
        assert!(
            !name.windows(8).any(|w| w == b".fastcp-"),
            "temp file left: {}",
            String::from_utf8_lossy(path)
        );
    }
}

/// Writes a file and sets its mode.
pub fn write(path: &Path, bytes: &[u8], mode: u32) {
    fs::write(path, bytes).unwrap();
    fs::set_permissions(path, fs::Permissions::from_mode(mode)).unwrap();
}

/// Deterministic pseudo-random bytes.
pub fn pseudo_random(len: usize, seed: u64) -> Vec<u8> {
    let mut out = Vec::with_capacity(len);
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    while out.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.extend_from_slice(&x.to_le_bytes());
    }
    out.truncate(len);
    out
}

/// Sets an entry's mtime (nanoseconds included), not following symlinks.
pub fn set_mtime(path: &Path, sec: i64, nsec: i64) {
    let times = rustix::fs::Timestamps {
        last_access: rustix::fs::Timespec {
            tv_sec: sec,
            tv_nsec: nsec as _,
        },
        last_modification: rustix::fs::Timespec {
            tv_sec: sec,
            tv_nsec: nsec as _,
        },
    };
    rustix::fs::utimensat(
        rustix::fs::CWD,
        path,
        &times,
        rustix::fs::AtFlags::SYMLINK_NOFOLLOW,
    )
    .unwrap();
}

/// A tree with a bit of everything but volume: files around the chunk sizes, odd names,
/// symlinks of every kind, empty directories, deep nesting, odd modes and mtimes.
pub fn build_mixed(root: &Path) {
    fs::create_dir_all(root).unwrap();
    write(&root.join("empty"), b"", 0o644);
    write(&root.join("one"), b"1", 0o600);
    write(&root.join("exec.sh"), b"#!/bin/sh\necho hi\n", 0o755);
    write(&root.join("read-only"), b"do not touch", 0o444);
    for (i, size) in [
        4095usize,
        4096,
        4097,
        3 * 4096 + 17,
        (1 << 20) - 1,
        1 << 20,
        (1 << 20) + 1,
        5 * (1 << 20) + 123,
    ]
    .into_iter()
    .enumerate()
    {
        write(
            &root.join(format!("sized-{size}")),
            &pseudo_random(size, i as u64),
            0o644,
        );
    }
    let odd = root.join("odd names");
    fs::create_dir(&odd).unwrap();
    for name in [
        &b"with space"[..],
        b"new\nline",
        b"-leading-dash",
        b"--",
        b"...",
        b"tab\there",
        b"back\\slash",
        b"quote\"s'",
        "ünïcödé-名前-😀".as_bytes(),
        b"\xff\xfe not utf-8",
        b"\x1b[31mred",
        &[b'L'; 255],
    ] {
        write(&odd.join(OsStr::from_bytes(name)), name, 0o644);
    }
    let links = root.join("links");
    fs::create_dir(&links).unwrap();
    symlink("../one", links.join("relative")).unwrap();
    symlink("/etc/hostname", links.join("absolute")).unwrap();
    symlink("does/not/exist", links.join("dangling")).unwrap();
    symlink(".", links.join("self")).unwrap();
    symlink("../odd names", links.join("to-dir")).unwrap();
    fs::create_dir_all(root.join("empty-dirs/a/b/c")).unwrap();
    fs::create_dir(root.join("empty-dirs/d")).unwrap();
    let mut deep = root.join("deep");
    for i in 0..120 {
        deep.push(format!("level-{i:03}"));
    }
    fs::create_dir_all(&deep).unwrap();
    write(&deep.join("bottom"), b"the bottom", 0o640);
    // Modes only `preserve` keeps exactly, and directories locked down.
    write(&root.join("world-writable"), b"w", 0o666);
    write(&root.join("setgid-ish"), b"s", 0o2755);
    let locked = root.join("locked");
    fs::create_dir(&locked).unwrap();
    write(&locked.join("inside"), b"in a read-only dir", 0o644);
    let secret = root.join("private");
    fs::create_dir(&secret).unwrap();
    write(&secret.join("key"), b"k", 0o600);
    // Distinct mtimes with nanoseconds, files and directories, set last and deepest first.
    let mut all: Vec<PathBuf> = scan(root)
        .keys()
        .map(|k| root.join(OsStr::from_bytes(k)))
        .collect();
    all.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    for (i, p) in all.iter().enumerate() {
        set_mtime(
            p,
            1_500_000_000 + i as i64 * 7919,
            (i as i64 * 123_456_789) % 1_000_000_000,
        );
    }
    fs::set_permissions(&secret, fs::Permissions::from_mode(0o700)).unwrap();
    fs::set_permissions(&locked, fs::Permissions::from_mode(0o555)).unwrap();
    set_mtime(&secret, 1_234_567_890, 5);
    set_mtime(&locked, 1_234_567_891, 999_999_999);
}

/// `count` tiny files spread over a few directories.
pub fn build_tiny(root: &Path, count: usize) {
    for i in 0..count {
        let dir = root.join(format!("d{:02}", i % 40));
        if i < 40 {
            fs::create_dir_all(&dir).unwrap();
        }
        let mut f = fs::File::create(dir.join(format!("f{i:05}"))).unwrap();
        write!(f, "tiny file {i}\n{}", "x".repeat(i % 97)).unwrap();
    }
}

/// Sets the access and modification times (whole seconds) of `path` itself, not following a
/// symlink.
pub fn set_times(path: &Path, atime: i64, mtime: i64) {
    use rustix::fs::{AtFlags, CWD, Timespec, Timestamps, utimensat};
    let t = |sec| Timespec {
        tv_sec: sec,
        tv_nsec: 0,
    };
    let times = Timestamps {
        last_access: t(atime),
        last_modification: t(mtime),
    };
    utimensat(CWD, path, &times, AtFlags::SYMLINK_NOFOLLOW).unwrap();
}

/// The access and modification times (whole seconds) of `path` itself, not following a
/// symlink.
pub fn times_of(path: &Path) -> (i64, i64) {
    let m = fs::symlink_metadata(path).unwrap();
    (m.atime(), m.mtime())
}

/// Seconds since the Unix epoch, now.
pub fn now_secs() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}
