//! Deterministic benchmark data: a tree shaped like a kernel source tree, and a big random file.
//!
//! The tree follows a shape file (`source-tree-shape.tsv`): a file-size histogram by
//! power-of-two bucket (file count and total bytes per bucket) plus a trailing comment with the
//! directory count, the maximum depth, the files-per-directory median / p90 / max and the symlink
//! count. Everything is drawn from a seeded xoshiro256++ stream, so the same seed and scale give
//! the same tree byte for byte.

use std::fs::{self, File};
use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail, ensure};

use crate::rng::Rng;

/// Bumped whenever a generator's output changes, so stale benchmark data is regenerated.
pub const GENERATOR_VERSION: u32 = 1;

/// Default seed of every generator.
pub const DEFAULT_SEED: u64 = 0xfa57_c0de_2026;

/// One power-of-two bucket of the file-size histogram.
#[derive(Clone, Debug, PartialEq)]
pub struct Bucket {
    /// Smallest size in the bucket.
    pub low: u64,
    /// Largest size in the bucket (inclusive).
    pub high: u64,
    /// Number of files in the bucket.
    pub files: u64,
    /// Total bytes of those files.
    pub bytes: u64,
}

/// The shape of a source tree, as read from the shape file.
#[derive(Clone, Debug, PartialEq)]
pub struct Shape {
    /// File-size histogram.
    pub buckets: Vec<Bucket>,
    /// Number of directories, the root included.
    pub dirs: u64,
    /// Deepest directory level below the root.
    pub max_depth: u32,
    /// Median number of files per directory.
    pub files_per_dir_median: f64,
    /// 90th percentile of files per directory.
    pub files_per_dir_p90: f64,
    /// Largest number of files in one directory.
    pub files_per_dir_max: u64,
    /// Number of symbolic links (relative; some dangling).
    pub symlinks: u64,
}

impl Shape {
    /// Total number of regular files.
    pub fn files(&self) -> u64 {
        self.buckets.iter().map(|b| b.files).sum()
    }

    /// Total bytes of the regular files.
    pub fn bytes(&self) -> u64 {
        self.buckets.iter().map(|b| b.bytes).sum()
    }

    /// Reads a shape file.
    pub fn load(path: &Path) -> Result<Shape> {
        let text = fs::read_to_string(path).with_context(|| {
            format!(
                "cannot read the source-tree shape file {} (pass another one with --shape PATH)",
                path.display()
            )
        })?;
        Self::parse(&text).with_context(|| format!("bad shape file {}", path.display()))
    }

    /// Parses the text of a shape file.
    pub fn parse(text: &str) -> Result<Shape> {
        let mut buckets = Vec::new();
        let mut shape = Shape {
            buckets: Vec::new(),
            dirs: 0,
            max_depth: 0,
            files_per_dir_median: 0.0,
            files_per_dir_p90: 0.0,
            files_per_dir_max: 0,
            symlinks: 0,
        };
        for (lineno, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() {
                continue;
            }
            if let Some(comment) = line.strip_prefix('#') {
                parse_shape_comment(comment, &mut shape);
                continue;
            }
            let fields: Vec<&str> = line.split('\t').collect();
            if fields.len() != 4 || fields[0].parse::<u64>().is_err() {
                // The header row (or anything that is not four numbers) is skipped.
                continue;
            }
            let num = |i: usize| -> Result<u64> {
                fields[i].parse().with_context(|| {
                    format!("line {}: field {} is not a number", lineno + 1, i + 1)
                })
            };
            let bucket = Bucket {
                low: num(0)?,
                high: num(1)?,
                files: num(2)?,
                bytes: num(3)?,
            };
            ensure!(bucket.low <= bucket.high, "line {}: low > high", lineno + 1);
            ensure!(
                bucket.bytes >= bucket.low * bucket.files
                    && bucket.bytes <= bucket.high * bucket.files,
                "line {}: the byte total cannot be reached with sizes inside the bucket",
                lineno + 1
            );
            buckets.push(bucket);
        }
        ensure!(!buckets.is_empty(), "no histogram rows");
        ensure!(
            shape.dirs > 0,
            "the comment line with the directory count is missing"
        );
        shape.buckets = buckets;
        Ok(shape)
    }
}

/// Reads the numbers out of the shape file's comment line, e.g.
/// `directories: 5,096; depth up to 9; files per directory: median 7, p90 34, max 2,541; 56 symlinks`.
fn parse_shape_comment(comment: &str, shape: &mut Shape) {
    let number_after = |key: &str| -> Option<f64> {
        let at = comment.find(key)? + key.len();
        let digits: String = comment[at..]
            .trim_start_matches([' ', ':'])
            .chars()
            .take_while(|c| c.is_ascii_digit() || *c == ',' || *c == '.')
            .filter(|c| *c != ',')
            .collect();
        digits.trim_end_matches('.').parse().ok()
    };
    if let Some(v) = number_after("directories") {
        shape.dirs = v as u64;
    }
    if let Some(v) = number_after("depth up to") {
        shape.max_depth = v as u32;
    }
    if let Some(v) = number_after("median") {
        shape.files_per_dir_median = v;
    }
    if let Some(v) = number_after("p90") {
        shape.files_per_dir_p90 = v;
    }
    if let Some(v) = number_after("max") {
        shape.files_per_dir_max = v as u64;
    }
    // "56 symlinks": the number comes before the word.
    if let Some(at) = comment.find("symlinks") {
        let before: String = comment[..at]
            .trim_end()
            .chars()
            .rev()
            .take_while(|c| c.is_ascii_digit() || *c == ',')
            .filter(|c| *c != ',')
            .collect();
        if let Ok(v) = before.chars().rev().collect::<String>().parse() {
            shape.symlinks = v;
        }
    }
}

/// Picks `n` sizes in `low..=high` whose sum is `total` (clamped to what the bucket allows).
///
/// Sizes are `low + u^a * (high - low)` for uniform `u`, with the exponent `a` found by
/// bisection so that the sum lands on the target; the rounding residue is then spread out.
pub fn bucket_sizes(rng: &mut Rng, low: u64, high: u64, n: usize, total: u64) -> Vec<u64> {
    if n == 0 {
        return Vec::new();
    }
    if low == high {
        return vec![low; n];
    }
    let target = total.clamp(low * n as u64, high * n as u64);
    let us: Vec<f64> = (0..n).map(|_| rng.unit()).collect();
    let span = (high - low) as f64;
    let sum_for = |a: f64| -> f64 { us.iter().map(|u| low as f64 + u.powf(a) * span).sum() };
    // The sum falls as the exponent grows; bisect on ln(a).
    let (mut lo, mut hi) = (-12.0f64, 12.0f64);
    for _ in 0..64 {
        let mid = (lo + hi) / 2.0;
        if sum_for(mid.exp()) > target as f64 {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    let a = ((lo + hi) / 2.0).exp();
    let mut sizes: Vec<u64> = us
        .iter()
        .map(|u| ((low as f64 + u.powf(a) * span).round() as u64).clamp(low, high))
        .collect();
    // Spread the residue so the bucket total is exact.
    let mut diff = target as i128 - sizes.iter().map(|&s| i128::from(s)).sum::<i128>();
    while diff != 0 {
        let before = diff;
        for s in sizes.iter_mut() {
            if diff > 0 && *s < high {
                let step = (high - *s)
                    .min(diff.min(u64::MAX as i128) as u64)
                    .min(1 + (diff as u64) / n as u64);
                *s += step;
                diff -= i128::from(step);
            } else if diff < 0 && *s > low {
                let want = (-diff) as u64;
                let step = (*s - low).min(want).min(1 + want / n as u64);
                *s -= step;
                diff += i128::from(step);
            }
            if diff == 0 {
                break;
            }
        }
        if diff == before {
            break; // cannot move further (only possible if the target was out of range)
        }
    }
    sizes
}

/// What `gen tree` produced.
#[derive(Clone, Debug, Default)]
pub struct TreeSummary {
    /// Regular files.
    pub files: u64,
    /// Directories, the root included.
    pub dirs: u64,
    /// Symbolic links.
    pub symlinks: u64,
    /// Of which dangling.
    pub dangling: u64,
    /// Total bytes of the regular files.
    pub bytes: u64,
    /// Deepest directory below the root.
    pub max_depth: u32,
    /// Files per directory: median.
    pub per_dir_median: u64,
    /// Files per directory: 90th percentile.
    pub per_dir_p90: u64,
    /// Files per directory: maximum.
    pub per_dir_max: u64,
}

impl std::fmt::Display for TreeSummary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} files, {} dirs (depth up to {}), {} symlinks ({} dangling), {} bytes ({:.2} GB); \
             files per dir: median {}, p90 {}, max {}",
            self.files,
            self.dirs,
            self.max_depth,
            self.symlinks,
            self.dangling,
            self.bytes,
            self.bytes as f64 / 1e9,
            self.per_dir_median,
            self.per_dir_p90,
            self.per_dir_max
        )
    }
}

struct Dir {
    parent: usize,
    depth: u32,
    path: PathBuf,
}

const EXTENSIONS: &[&str] = &[
    ".c", ".c", ".c", ".c", ".h", ".h", ".h", ".S", ".rst", ".txt", ".yaml", ".dts", ".dtsi",
    ".sh", ".py", "",
];

fn word(rng: &mut Rng, min: u64, max: u64) -> String {
    const LETTERS: &[u8] = b"etaoinshrdlcumwfgypbvkxqz_";
    let len = min + rng.below(max - min + 1);
    // Skewed letter choice (square of a uniform) gives English-ish frequencies.
    (0..len)
        .map(|_| {
            let u = rng.unit();
            LETTERS[((u * u) * (LETTERS.len() - 1) as f64) as usize] as char
        })
        .collect()
}

/// Builds the text pool that file contents are cut from: C-like lines of words and punctuation.
fn text_pool(seed: u64, len: usize) -> Vec<u8> {
    let mut rng = Rng::derive(seed, u64::MAX);
    let mut vocab: Vec<String> = [
        "static", "struct", "int", "return", "if", "else", "for", "while", "unsigned", "long",
        "void", "const", "u32", "u64", "size_t", "NULL", "err", "ret", "dev", "#include",
        "#define", "{", "}", "(", ")", ";", "=", "==", "->", "&&", "||", "*", "0", "1", "sizeof",
        "goto", "out;", "break;",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    while vocab.len() < 4096 {
        vocab.push(word(&mut rng, 2, 14));
    }
    let mut pool = Vec::with_capacity(len + 256);
    while pool.len() < len {
        let indent = rng.below(4) as usize;
        pool.extend(std::iter::repeat_n(b'\t', indent));
        let tokens = 2 + rng.below(10);
        for t in 0..tokens {
            if t > 0 {
                pool.push(b' ');
            }
            // Zipf-like: small indices (common words) much more often.
            let u = rng.unit();
            let i = ((u * u * u) * vocab.len() as f64) as usize;
            pool.extend_from_slice(vocab[i.min(vocab.len() - 1)].as_bytes());
        }
        pool.push(b'\n');
    }
    pool.truncate(len);
    pool
}

/// Fills `buf` with `size` bytes of text-like content: mostly slices of the pool, with short
/// random runs mixed in, so it compresses somewhat but not trivially.
fn fill_content(rng: &mut Rng, pool: &[u8], buf: &mut Vec<u8>, size: usize) {
    buf.clear();
    while buf.len() < size {
        let left = size - buf.len();
        if rng.below(8) == 0 {
            let n = left.min(16 + rng.below(240) as usize);
            let at = buf.len();
            buf.resize(at + n, 0);
            rng.fill(&mut buf[at..]);
        } else {
            let n = left.min(64 + rng.below(4032) as usize);
            let off = rng.below((pool.len() - n) as u64) as usize;
            buf.extend_from_slice(&pool[off..off + n]);
        }
    }
}

/// Splits `n` directories over the levels `1..=max_depth` like a kernel tree: few at the top,
/// most three to five levels down, a thin tail to the deepest level.
fn dirs_per_level(n: usize, max_depth: u32) -> Vec<usize> {
    const PROFILE: [f64; 9] = [
        22.0, 310.0, 1150.0, 1650.0, 1150.0, 520.0, 200.0, 70.0, 23.0,
    ];
    let weights: Vec<f64> = (0..max_depth as usize)
        .map(|i| {
            if i < PROFILE.len() {
                PROFILE[i]
            } else {
                PROFILE[8] * 0.3f64.powi(i as i32 - 8)
            }
        })
        .collect();
    let total: f64 = weights.iter().sum();
    let mut counts: Vec<usize> = weights
        .iter()
        .map(|w| (w / total * n as f64).round() as usize)
        .collect();
    // Fix the rounding on the biggest level, and keep at least one directory at the top.
    let biggest = (0..counts.len()).max_by_key(|&i| counts[i]).unwrap_or(0);
    let sum: usize = counts.iter().sum();
    if sum > n {
        counts[biggest] -= (sum - n).min(counts[biggest]);
    } else {
        counts[biggest] += n - sum;
    }
    if n > 0 && counts[0] == 0 {
        counts[0] = 1;
        counts[biggest] -= 1;
    }
    counts
}

fn percentile(sorted: &[u64], p: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let idx = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[idx]
}

/// Number of worker threads for generation and checks.
pub fn threads() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(2)
        .clamp(1, 8)
}

/// Generates a kernel-shaped tree under `root` (created; must be empty or absent).
///
/// `scale` multiplies the file, directory, symlink and largest-directory counts (sizes per
/// bucket keep their mean), so `--scale 0.01` gives a small tree of the same shape.
pub fn gen_tree(root: &Path, shape: &Shape, scale: f64, seed: u64) -> Result<TreeSummary> {
    ensure!(
        scale > 0.0 && scale.is_finite(),
        "--scale must be a positive number"
    );
    if root.exists() {
        ensure!(
            fs::read_dir(root)?.next().is_none(),
            "{} exists and is not empty; remove it first",
            root.display()
        );
    }
    fs::create_dir_all(root).with_context(|| format!("creating {}", root.display()))?;
    let mut rng = Rng::new(seed);
    let scaled = |n: u64| -> u64 { (n as f64 * scale).round() as u64 };

    // 1. File sizes, bucket by bucket, then shuffled over the files.
    let mut sizes = Vec::new();
    for b in &shape.buckets {
        let n = scaled(b.files);
        if n == 0 {
            continue;
        }
        let total = (b.bytes as f64 * n as f64 / b.files as f64).round() as u64;
        sizes.extend(bucket_sizes(&mut rng, b.low, b.high, n as usize, total));
    }
    rng.shuffle(&mut sizes);
    let n_files = sizes.len() as u64;

    // 2. Directories, level by level following a kernel-like depth profile; a parent is picked
    //    uniformly or in proportion to the children it already has (so a few directories get
    //    many subdirectories, as drivers/ and arch/ do).
    let n_dirs = scaled(shape.dirs).max(1) as usize;
    let per_level = dirs_per_level(n_dirs - 1, shape.max_depth.max(1));
    let mut dirs = vec![Dir {
        parent: usize::MAX,
        depth: 0,
        path: PathBuf::new(),
    }];
    let mut prev_level: Vec<usize> = vec![0];
    for &count in &per_level {
        let mut this_level: Vec<usize> = Vec::with_capacity(count);
        for _ in 0..count {
            let parent = if !this_level.is_empty() && rng.below(2) == 0 {
                dirs[this_level[rng.below(this_level.len() as u64) as usize]].parent
            } else {
                prev_level[rng.below(prev_level.len() as u64) as usize]
            };
            let i = dirs.len();
            let name = format!("{}{}", word(&mut rng, 2, 10), i);
            let path = dirs[parent].path.join(name);
            dirs.push(Dir {
                parent,
                depth: dirs[parent].depth + 1,
                path,
            });
            this_level.push(i);
        }
        // After an empty level (tiny scales) the next one hangs off the last non-empty level.
        if !this_level.is_empty() {
            prev_level = this_level;
        }
    }
    for d in &dirs[1..] {
        fs::create_dir(root.join(&d.path))
            .with_context(|| format!("mkdir {}", d.path.display()))?;
    }

    // 3. Files per directory: log-normal through the median and p90, one directory holding the
    //    maximum, then nudged so the counts add up to the file total.
    let median = shape.files_per_dir_median.max(1.0);
    let p90 = shape.files_per_dir_p90.max(median + 1.0);
    let mu = median.ln();
    let sigma = (p90.ln() - mu) / 1.281_551_6;
    let max_dir_files = scaled(shape.files_per_dir_max).max(1).min(n_files);
    let mut counts: Vec<u64> = (0..n_dirs)
        .map(|_| ((mu + sigma * rng.normal()).exp().round() as u64).min(max_dir_files))
        .collect();
    // The biggest directory sits a few levels down, as drivers/.../ does.
    let big_dir = {
        let candidates: Vec<usize> = (0..n_dirs).filter(|&i| dirs[i].depth >= 3).collect();
        if candidates.is_empty() {
            n_dirs - 1
        } else {
            candidates[rng.below(candidates.len() as u64) as usize]
        }
    };
    counts[big_dir] = max_dir_files;
    let mut diff = n_files as i64 - counts.iter().sum::<u64>() as i64;
    let med = median as u64;
    let mut stuck = 0;
    while diff != 0 {
        let i = rng.below(n_dirs as u64) as usize;
        if i == big_dir && n_dirs > 1 {
            continue;
        }
        // Adjust only directories above the median, so the median stays where it is.
        let ok = if diff > 0 {
            counts[i] >= med
        } else {
            counts[i] > med + 1
        };
        if ok || stuck > 100_000 {
            if diff > 0 {
                counts[i] += 1;
                diff -= 1;
            } else if counts[i] > 0 {
                counts[i] -= 1;
                diff += 1;
            }
        } else {
            stuck += 1;
        }
    }

    // 4. Names and sizes of the files.
    struct Job {
        dir: usize,
        path: PathBuf,
        size: u64,
        exec: bool,
    }
    let mut jobs = Vec::with_capacity(n_files as usize);
    let mut next_size = sizes.into_iter();
    for (d, &count) in counts.iter().enumerate() {
        for k in 0..count {
            let ext = EXTENSIONS[rng.below(EXTENSIONS.len() as u64) as usize];
            let name = format!("{}{}{}", word(&mut rng, 2, 12), k, ext);
            let size = next_size.next().context("internal: file sizes ran out")?;
            jobs.push(Job {
                dir: d,
                path: dirs[d].path.join(name),
                size,
                exec: ext == ".sh" || ext == ".py",
            });
        }
    }

    // 5. Contents, written in parallel; each file's bytes come from its own derived stream.
    let pool = text_pool(seed, 8 << 20);
    let n_threads = threads();
    std::thread::scope(|scope| -> Result<()> {
        let handles: Vec<_> = (0..n_threads)
            .map(|t| {
                let jobs = &jobs;
                let pool = &pool;
                scope.spawn(move || -> Result<()> {
                    let mut buf = Vec::new();
                    for (i, job) in jobs.iter().enumerate().skip(t).step_by(n_threads) {
                        let mut rng = Rng::derive(seed, i as u64);
                        fill_content(&mut rng, pool, &mut buf, job.size as usize);
                        let path = root.join(&job.path);
                        let mut f = File::create(&path)
                            .with_context(|| format!("create {}", path.display()))?;
                        f.write_all(&buf)
                            .with_context(|| format!("write {}", path.display()))?;
                        if job.exec {
                            f.set_permissions(fs::Permissions::from_mode(0o755))?;
                        }
                    }
                    Ok(())
                })
            })
            .collect();
        for h in handles {
            h.join().expect("generator thread panicked")?;
        }
        Ok(())
    })?;

    // 6. Relative symlinks: most to files elsewhere in the tree, a few to directories, about a
    //    fifth dangling. Directory links only point from an inner directory to a leaf, so a tool
    //    that follows links (scp -r) cannot loop.
    let n_links = scaled(shape.symlinks);
    let mut dangling = 0;
    let mut has_children = vec![false; n_dirs];
    for d in &dirs[1..] {
        has_children[d.parent] = true;
    }
    let leaves: Vec<usize> = (1..n_dirs).filter(|&d| !has_children[d]).collect();
    let ancestors = |mut d: usize| -> Vec<usize> {
        let mut chain = vec![d];
        while dirs[d].parent != usize::MAX {
            d = dirs[d].parent;
            chain.push(d);
        }
        chain.reverse();
        chain
    };
    for k in 0..n_links {
        let at = rng.below(n_dirs as u64) as usize;
        let from = ancestors(at);
        let kind = rng.below(10);
        let (to_dir, leaf) = if kind < 2 || jobs.is_empty() {
            dangling += 1;
            let d = rng.below(n_dirs as u64) as usize;
            (d, format!("{}-missing{}.h", word(&mut rng, 3, 8), k))
        } else if kind < 4 && has_children[at] && !leaves.is_empty() {
            let d = leaves[rng.below(leaves.len() as u64) as usize];
            let name = dirs[d]
                .path
                .file_name()
                .unwrap()
                .to_string_lossy()
                .into_owned();
            (dirs[d].parent, name)
        } else {
            let job = &jobs[rng.below(jobs.len() as u64) as usize];
            (
                job.dir,
                job.path.file_name().unwrap().to_string_lossy().into_owned(),
            )
        };
        let to = ancestors(to_dir);
        let common = from.iter().zip(&to).take_while(|(a, b)| a == b).count();
        let mut target = PathBuf::new();
        for _ in common..from.len() {
            target.push("..");
        }
        for &d in &to[common..] {
            target.push(dirs[d].path.file_name().unwrap());
        }
        target.push(leaf);
        let link = root
            .join(&dirs[at].path)
            .join(format!("{}-link{}", word(&mut rng, 3, 8), k));
        std::os::unix::fs::symlink(&target, &link)
            .with_context(|| format!("symlink {}", link.display()))?;
    }

    let mut sorted_counts = counts.clone();
    sorted_counts.sort_unstable();
    Ok(TreeSummary {
        files: n_files,
        dirs: n_dirs as u64,
        symlinks: n_links,
        dangling,
        bytes: jobs.iter().map(|j| j.size).sum(),
        max_depth: dirs.iter().map(|d| d.depth).max().unwrap_or(0),
        per_dir_median: percentile(&sorted_counts, 0.5),
        per_dir_p90: percentile(&sorted_counts, 0.9),
        per_dir_max: sorted_counts.last().copied().unwrap_or(0),
    })
}

/// Writes `size` random (incompressible) bytes to `path`, through a temporary name that is
/// renamed into place when complete.
pub fn gen_file(path: &Path, size: u64, seed: u64) -> Result<()> {
    const BLOCK: usize = 8 << 20;
    let tmp = partial_name(path);
    let mut f = File::create(&tmp).with_context(|| format!("create {}", tmp.display()))?;
    let mut rng = Rng::new(seed);
    let mut buf = vec![0u8; BLOCK];
    let mut left = size;
    while left > 0 {
        let n = left.min(BLOCK as u64) as usize;
        rng.fill(&mut buf[..n]);
        f.write_all(&buf[..n])
            .with_context(|| format!("write {}", tmp.display()))?;
        left -= n as u64;
    }
    f.sync_all().ok();
    drop(f);
    fs::rename(&tmp, path)
        .with_context(|| format!("rename {} to {}", tmp.display(), path.display()))?;
    Ok(())
}

/// Files per directory in [`gen_flat_tree`]'s trees.
pub const FILES_PER_DIR: u64 = 1000;

/// A tree of `count` files of `size` random bytes each, [`FILES_PER_DIR`] to a directory
/// (`d000/f00000` ...), for scaling with file count. Each file's bytes depend on `seed` and
/// its index only.
pub fn gen_flat_tree(root: &Path, count: u64, size: u64, seed: u64) -> Result<()> {
    fs::create_dir_all(root).with_context(|| format!("create {}", root.display()))?;
    let mut buf = vec![0u8; usize::try_from(size)?];
    for i in 0..count {
        let dir = root.join(format!("d{:03}", i / FILES_PER_DIR));
        if i % FILES_PER_DIR == 0 {
            fs::create_dir(&dir).with_context(|| format!("create {}", dir.display()))?;
        }
        Rng::derive(seed, i).fill(&mut buf);
        let path = dir.join(format!("f{:05}", i % FILES_PER_DIR));
        fs::write(&path, &buf).with_context(|| format!("write {}", path.display()))?;
    }
    Ok(())
}

/// `path` with `.partial` appended, where data is built before it is renamed into place.
pub fn partial_name(path: &Path) -> PathBuf {
    let mut name = path
        .file_name()
        .map(|n| n.to_os_string())
        .unwrap_or_default();
    name.push(".partial");
    path.with_file_name(name)
}

/// Parses a size such as `2GiB`, `1.5G`, `100MB` or `4096`.
///
/// `K`/`M`/`G`/`T` and `KiB`/`MiB`/`GiB`/`TiB` are powers of 1024; `KB`/`MB`/`GB`/`TB` are
/// powers of 1000.
pub fn parse_size(text: &str) -> Result<u64> {
    let t = text.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let num: f64 = num.parse().with_context(|| format!("bad size {text:?}"))?;
    let mult: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kib" => 1 << 10,
        "m" | "mib" => 1 << 20,
        "g" | "gib" => 1 << 30,
        "t" | "tib" => 1 << 40,
        "kb" => 1_000,
        "mb" => 1_000_000,
        "gb" => 1_000_000_000,
        "tb" => 1_000_000_000_000,
        _ => bail!("bad size unit in {text:?} (use K, M, G, KiB, MiB, GiB, KB, MB, GB)"),
    };
    Ok((num * mult as f64).round() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    const SHAPE: &str = "# header comment\n\
        bucket_low_bytes\tbucket_high_bytes\tfiles\tbytes\n\
        0\t0\t3\t0\n\
        1024\t2047\t1000\t1500000\n\
        4096\t8191\t500\t3000000\n\
        16777216\t33554431\t1\t23944620\n\
        # directories: 5,096; depth up to 9; files per directory: median 7, p90 34, max 2,541; 56 symlinks (some dangling, relative)\n";

    #[test]
    fn parses_the_shape_file() {
        let s = Shape::parse(SHAPE).unwrap();
        assert_eq!(s.buckets.len(), 4);
        assert_eq!(s.files(), 1504);
        assert_eq!(s.dirs, 5096);
        assert_eq!(s.max_depth, 9);
        assert_eq!(s.files_per_dir_median, 7.0);
        assert_eq!(s.files_per_dir_p90, 34.0);
        assert_eq!(s.files_per_dir_max, 2541);
        assert_eq!(s.symlinks, 56);
    }

    #[test]
    fn shape_without_directory_line_is_an_error() {
        assert!(Shape::parse("0\t0\t3\t0\n").is_err());
    }

    #[test]
    fn bucket_sizes_hit_the_total_and_stay_in_range() {
        let mut rng = Rng::new(3);
        for (low, high, n, total) in [
            (1024, 2047, 1000, 1_500_000),
            (4096, 8191, 7, 40_000),
            (16777216, 33554431, 1, 23944620),
            (8, 15, 51, 597),
        ] {
            let sizes = bucket_sizes(&mut rng, low, high, n, total);
            assert_eq!(sizes.len(), n);
            assert_eq!(sizes.iter().sum::<u64>(), total);
            assert!(sizes.iter().all(|&s| (low..=high).contains(&s)));
        }
    }

    #[test]
    fn sizes_parse() {
        assert_eq!(parse_size("2GiB").unwrap(), 2 << 30);
        assert_eq!(parse_size("1.5G").unwrap(), 3 << 29);
        assert_eq!(parse_size("100MB").unwrap(), 100_000_000);
        assert_eq!(parse_size("4096").unwrap(), 4096);
        assert!(parse_size("12 parsecs").is_err());
    }

    #[test]
    fn small_tree_has_the_shape_and_is_deterministic() {
        let shape = Shape::parse(SHAPE).unwrap();
        let base = std::env::temp_dir().join(format!("xtask-gen-test-{}", std::process::id()));
        let _ = fs::remove_dir_all(&base);
        let a = gen_tree(&base.join("a"), &shape, 0.5, 42).unwrap();
        let b = gen_tree(&base.join("b"), &shape, 0.5, 42).unwrap();
        assert_eq!(a.files, 2 + 500 + 250 + 1); // counts are rounded per bucket
        assert_eq!(a.dirs, 2548);
        assert_eq!(a.symlinks, 28);
        assert_eq!(a.bytes, b.bytes);
        crate::verify::compare_trees(&base.join("a"), &base.join("b")).unwrap();
        // A different seed gives different contents.
        let c = gen_tree(&base.join("c"), &shape, 0.5, 43).unwrap();
        assert_eq!(c.files, a.files);
        assert!(crate::verify::compare_trees(&base.join("a"), &base.join("c")).is_err());
        fs::remove_dir_all(&base).unwrap();
    }
}
