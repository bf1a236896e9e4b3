//! Checks that a copy equals its source: same relative paths, types, sizes, symlink targets and
//! bytes. Contents are compared directly (both sides sit on the same machine), in parallel.

use std::fs::{self, File};
use std::io::Read;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use anyhow::{Context, Result, bail};

use crate::data::threads;

/// The type of a tree entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Kind {
    /// A regular file.
    File,
    /// A directory.
    Dir,
    /// A symbolic link and its target.
    Symlink(PathBuf),
    /// Anything else (fifo, socket, device).
    Other,
}

/// One entry of a scanned tree.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    /// Path relative to the root.
    pub rel: PathBuf,
    /// Its type.
    pub kind: Kind,
    /// Size in bytes for regular files, 0 otherwise.
    pub size: u64,
}

/// A sorted listing of a tree (the root itself excluded).
#[derive(Clone, Debug, Default)]
pub struct Manifest {
    /// Entries sorted by relative path.
    pub entries: Vec<Entry>,
}

impl Manifest {
    /// Total bytes of the regular files.
    pub fn bytes(&self) -> u64 {
        self.entries.iter().map(|e| e.size).sum()
    }

    /// Number of entries of the given kind (`Symlink` matches any target).
    pub fn count(&self, kind: &Kind) -> usize {
        self.entries
            .iter()
            .filter(|e| std::mem::discriminant(&e.kind) == std::mem::discriminant(kind))
            .count()
    }
}

/// Lists the tree under `root` without following symlinks.
pub fn scan(root: &Path) -> Result<Manifest> {
    let mut entries = Vec::new();
    let mut stack = vec![PathBuf::new()];
    while let Some(rel) = stack.pop() {
        let dir = root.join(&rel);
        for item in fs::read_dir(&dir).with_context(|| format!("reading {}", dir.display()))? {
            let item = item?;
            let rel = rel.join(item.file_name());
            let meta = item.metadata()?; // does not follow symlinks
            let ft = meta.file_type();
            let (kind, size) = if ft.is_symlink() {
                (Kind::Symlink(fs::read_link(item.path())?), 0)
            } else if ft.is_dir() {
                stack.push(rel.clone());
                (Kind::Dir, 0)
            } else if ft.is_file() {
                (Kind::File, meta.len())
            } else {
                (Kind::Other, 0)
            };
            entries.push(Entry { rel, kind, size });
        }
    }
    entries.sort_unstable_by(|a, b| a.rel.cmp(&b.rel));
    Ok(Manifest { entries })
}

/// Compares the trees under `src` and `dst`.
pub fn compare_trees(src: &Path, dst: &Path) -> Result<()> {
    compare_tree_to(src, &scan(src)?, dst)
}

/// Compares the tree under `dst` with `src`, whose listing is already known.
pub fn compare_tree_to(src: &Path, src_manifest: &Manifest, dst: &Path) -> Result<()> {
    let meta = fs::symlink_metadata(dst)
        .with_context(|| format!("destination {} is missing", dst.display()))?;
    if !meta.is_dir() {
        bail!("destination {} is not a directory", dst.display());
    }
    let dst_manifest = scan(dst)?;
    let (a, b) = (&src_manifest.entries, &dst_manifest.entries);
    let (mut i, mut j) = (0, 0);
    while i < a.len() || j < b.len() {
        match (a.get(i), b.get(j)) {
            (Some(x), Some(y)) if x.rel == y.rel => {
                if x.kind != y.kind {
                    bail!(
                        "{}: source is {:?}, copy is {:?}",
                        x.rel.display(),
                        x.kind,
                        y.kind
                    );
                }
                if x.size != y.size {
                    bail!(
                        "{}: source has {} bytes, copy has {}",
                        x.rel.display(),
                        x.size,
                        y.size
                    );
                }
                i += 1;
                j += 1;
            }
            (Some(x), Some(y)) if x.rel < y.rel => {
                bail!("{} is missing from the copy", x.rel.display())
            }
            (Some(x), None) => bail!("{} is missing from the copy", x.rel.display()),
            (_, Some(y)) => bail!("{} is in the copy but not in the source", y.rel.display()),
            (None, None) => unreachable!(),
        }
    }

    // Same listing: now the bytes, file by file, spread over threads.
    let files: Vec<&Entry> = a
        .iter()
        .filter(|e| e.kind == Kind::File && e.size > 0)
        .collect();
    let next = AtomicUsize::new(0);
    let failure: Mutex<Option<anyhow::Error>> = Mutex::new(None);
    std::thread::scope(|scope| {
        for _ in 0..threads() {
            scope.spawn(|| {
                let mut bufs = (vec![0u8; 1 << 20], vec![0u8; 1 << 20]);
                loop {
                    let k = next.fetch_add(1, Ordering::Relaxed);
                    let Some(e) = files.get(k) else { break };
                    if failure.lock().unwrap().is_some() {
                        break;
                    }
                    if let Err(err) = same_contents(&src.join(&e.rel), &dst.join(&e.rel), &mut bufs)
                    {
                        failure
                            .lock()
                            .unwrap()
                            .get_or_insert(err.context(format!("{}", e.rel.display())));
                        break;
                    }
                }
            });
        }
    });
    match failure.into_inner().unwrap() {
        Some(err) => Err(err),
        None => Ok(()),
    }
}

fn same_contents(a: &Path, b: &Path, bufs: &mut (Vec<u8>, Vec<u8>)) -> Result<()> {
    let mut fa = File::open(a).with_context(|| format!("open {}", a.display()))?;
    let mut fb = File::open(b).with_context(|| format!("open {}", b.display()))?;
    let mut offset = 0u64;
    loop {
        let n = read_full(&mut fa, &mut bufs.0)?;
        let m = read_full(&mut fb, &mut bufs.1)?;
        if n != m || bufs.0[..n] != bufs.1[..m] {
            bail!("contents differ near byte {offset}");
        }
        if n == 0 {
            return Ok(());
        }
        offset += n as u64;
    }
}

fn read_full(f: &mut File, buf: &mut [u8]) -> Result<usize> {
    let mut filled = 0;
    while filled < buf.len() {
        match f.read(&mut buf[filled..])? {
            0 => break,
            n => filled += n,
        }
    }
    Ok(filled)
}

/// Compares two regular files: size, then bytes (ranges compared in parallel).
pub fn compare_files(src: &Path, dst: &Path) -> Result<()> {
    let meta = fs::symlink_metadata(dst)
        .with_context(|| format!("destination {} is missing", dst.display()))?;
    if !meta.is_file() {
        bail!("destination {} is not a regular file", dst.display());
    }
    let size = fs::metadata(src)?.len();
    if meta.len() != size {
        bail!("copy has {} bytes, source has {}", meta.len(), size);
    }
    let fa = File::open(src)?;
    let fb = File::open(dst)?;
    let n = threads() as u64;
    let per = size.div_ceil(n).max(1);
    std::thread::scope(|scope| -> Result<()> {
        let handles: Vec<_> = (0..n)
            .map(|t| {
                let (fa, fb) = (&fa, &fb);
                scope.spawn(move || -> Result<()> {
                    const BLOCK: u64 = 4 << 20;
                    let (start, end) = ((t * per).min(size), ((t + 1) * per).min(size));
                    let mut a = vec![0u8; BLOCK as usize];
                    let mut b = vec![0u8; BLOCK as usize];
                    let mut off = start;
                    while off < end {
                        let len = (end - off).min(BLOCK) as usize;
                        fa.read_exact_at(&mut a[..len], off)?;
                        fb.read_exact_at(&mut b[..len], off)?;
                        if a[..len] != b[..len] {
                            bail!("contents differ in bytes {off}..{}", off + len as u64);
                        }
                        off += len as u64;
                    }
                    Ok(())
                })
            })
            .collect();
        for h in handles {
            h.join().expect("compare thread panicked")?;
        }
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tmp(name: &str) -> PathBuf {
        let p = std::env::temp_dir().join(format!("xtask-verify-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&p);
        fs::create_dir_all(&p).unwrap();
        p
    }

    #[test]
    fn detects_each_kind_of_difference() {
        let base = tmp("kinds");
        let src = base.join("src");
        fs::create_dir_all(src.join("d/e")).unwrap();
        fs::write(src.join("d/f"), b"hello").unwrap();
        std::os::unix::fs::symlink("../nowhere", src.join("d/link")).unwrap();
        let copy = |name: &str| {
            let dst = base.join(name);
            let st = std::process::Command::new("cp")
                .arg("-a")
                .arg(&src)
                .arg(&dst)
                .status()
                .unwrap();
            assert!(st.success());
            dst
        };
        compare_trees(&src, &copy("same")).unwrap();

        let d = copy("content");
        fs::write(d.join("d/f"), b"hellO").unwrap();
        assert!(compare_trees(&src, &d).is_err());

        let d = copy("size");
        fs::write(d.join("d/f"), b"hello!").unwrap();
        assert!(compare_trees(&src, &d).is_err());

        let d = copy("target");
        fs::remove_file(d.join("d/link")).unwrap();
        std::os::unix::fs::symlink("../elsewhere", d.join("d/link")).unwrap();
        assert!(compare_trees(&src, &d).is_err());

        let d = copy("missing");
        fs::remove_dir(d.join("d/e")).unwrap();
        assert!(compare_trees(&src, &d).is_err());

        let d = copy("extra");
        fs::write(d.join("extra"), b"").unwrap();
        assert!(compare_trees(&src, &d).is_err());

        let d = copy("followed");
        fs::remove_file(d.join("d/link")).unwrap();
        fs::write(d.join("d/link"), b"").unwrap();
        assert!(compare_trees(&src, &d).is_err());

        fs::remove_dir_all(&base).unwrap();
    }

    #[test]
    fn compares_files_by_size_and_bytes() {
        let base = tmp("files");
        let data: Vec<u8> = (0..3_000_000u32).map(|i| (i * 7 % 251) as u8).collect();
        fs::write(base.join("a"), &data).unwrap();
        fs::write(base.join("b"), &data).unwrap();
        compare_files(&base.join("a"), &base.join("b")).unwrap();
        let mut other = data.clone();
        other[2_999_000] ^= 1;
        fs::write(base.join("c"), &other).unwrap();
        assert!(compare_files(&base.join("a"), &base.join("c")).is_err());
        fs::write(base.join("d"), &data[..10]).unwrap();
        assert!(compare_files(&base.join("a"), &base.join("d")).is_err());
        assert!(compare_files(&base.join("a"), &base.join("nope")).is_err());
        fs::remove_dir_all(&base).unwrap();
    }
}
