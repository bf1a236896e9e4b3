//! `cargo xtask`: fastcp's development tasks.
//!
//! - `cargo xtask gen tree DIR [--scale F] [--shape FILE] [--seed N]`: a deterministic tree
//!   shaped like a kernel source tree (file-size histogram, directory count and depth, files per
//!   directory, symlinks) read from `source-tree-shape.tsv`.
//! - `cargo xtask gen file PATH --size 2GiB [--seed N]`: random, incompressible bytes.
//! - `cargo xtask bench local|ssh|tcp [...]`: times fastcp against cp, tar, scp, rsync,
//!   `tar | ssh` and nc on tmpfs, checks every copy, prints a Markdown report and with
//!   `--write` records it in BENCHMARKS.md.
//! - `cargo xtask bench wan [...]`: the same through an emulated 50 ms, 1 Gbit/s link
//!   (a relay on 127.0.0.2): fastcp's TCP and SSH transports against scp and rsync.
//! - `cargo xtask bench streams|files [...]`: scaling with streams (`-j` 1 to 16) and with
//!   file count (1 to 1,000,000 files).
//! - `cargo xtask bench rerun [--login USER] [...]`: nightly-backup reruns with nothing
//!   changed, fastcp's (TCP and SSH, push and pull) against rsync's, the login alone and
//!   fastcp's own full copies.
//! - `cargo xtask bench all [...]`: every benchmark, one after another (the WAN at 10, 50 and
//!   100 ms, then the reruns), then with `--write` the plots.
//! - `cargo xtask plot`: PNG plots in docs/bench/ from the results files that `bench --write`
//!   keeps there, and the "## Plots" section of BENCHMARKS.md.
//! - `cargo xtask verify SRC DST`: checks that DST is an exact copy of SRC.
//! - `cargo xtask sshd`: runs the benchmark sshd (and prints its ssh_config) until Enter.
//! - `cargo xtask test [--no-install] [-- ARGS]`: installs what the test suite needs (OpenSSH's
//!   server and client, tmux, strace, ...) when it is missing, then runs
//!   `cargo test --workspace ARGS`, and without ARGS every example after it.
//! - `cargo xtask dist [--targets LIST] [--out DIR]`: static (musl) release binaries for
//!   x86_64 and aarch64 Linux, with their SHA-256 sums.

mod bench;
mod data;
mod dist;
mod plot;
mod report;
mod rerun;
mod rng;
mod sshd;
mod test;
mod verify;
mod wan;

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

const USAGE: &str = "\
usage:
  cargo xtask gen tree DIR [--scale F] [--shape FILE] [--seed N]
  cargo xtask gen file PATH --size SIZE [--seed N]
  cargo xtask bench local|ssh|tcp|wan|sftp|streams|files|rerun|all [options]
  cargo xtask plot                 PNG plots (docs/bench/) from the results files that
                                   bench --write keeps, shown in BENCHMARKS.md
  cargo xtask verify SRC DST       check that DST is an exact copy of SRC (file or tree)
  cargo xtask sshd [--data DIR]    run the benchmark sshd until Enter, for experiments
  cargo xtask test [--no-install] [-- ARGS]
                                   install what the tests need (apt-get, when missing and
                                   allowed), then run cargo test --workspace ARGS
                                   (without ARGS, then every example)
  cargo xtask dist [--targets LIST] [--out DIR]
                                   static musl binaries (x86_64, aarch64) and SHA256SUMS in
                                   DIR (default target/dist)

bench options:
  --runs N             timed runs per contender (default 5), after one warm-up run
  --data DIR           where data sets and copies live (default /dev/shm/fastcp-bench)
  --only big|tree      run one data set only
  --contenders LIST    run only these, e.g. fastcp,tar-tar (ids: fastcp fastcp-pull
                       fastcp-local fastcp-no-aes cp tar-tar scp rsync tar-ssh tar-ssh-pull
                       nc escp mscp rclone; bench wan and streams: fastcp-tcp-N ...;
                       bench rerun: ssh-true rsync-push fastcp-tcp-pull ...)
  --write              replace this benchmark's section of BENCHMARKS.md and its results
                       file docs/bench/bench-MODE.tsv (bench all: then draw the plots)
  --fastcp PATH        use this fastcp binary instead of `cargo build --release -p fastcp`
  --fastcp-args ARGS   extra arguments for every fastcp run, e.g. \"-j 8\"
  --ssh-cipher C       cipher for the ssh of rsync and tar | ssh (default: OpenSSH's choice;
                       aes128-gcm@openssh.com in bench wan)
  --size SIZE          size of the big file (default 2GiB; 512MiB in bench wan)
  --window SIZE        bench wan: bytes in flight per connection, the emulated TCP window
                       (default 4MiB)
  --scale F            scale of the tree (default 1)
  --shape FILE         tree shape (default xtask/data/source-tree-shape.tsv)
  --timeout SECS       kill a run after this long and count it as failed (default 600)
  --rtt LIST           bench wan: round-trip times in ms, one run each (default 50; in
                       bench all 10,50,100)
  --streams LIST       bench streams: the -j values (default 1,2,4,8,16)
  --files LIST         bench files: file counts, one tree each (default
                       1,10,100,1000,10000,100000,1000000)
  --file-size SIZE     bench files: size of each file (default 4KiB)
  --login USER         bench rerun: every contender logs in as USER (a local account with
                       a shell; the bench key is authorized for all) instead of the current
                       user; --write then records the section \"bench rerun as USER\"

bench wan copies the big file through a relay on 127.0.0.2 that adds 25 ms each way, caps
all connections together at 125 MB/s (1 Gbit/s) and the bytes in flight of each connection
at the --window size. Contenders (ids): fastcp --transport tcp -j 1, 4 and 8 (fastcp-tcp-1,
fastcp-tcp-4, fastcp-tcp-8), fastcp --transport ssh (fastcp-ssh) and its pull
(fastcp-ssh-pull), scp, rsync.

bench rerun times no-change reruns of the tree (fastcp -r -p --skip-unchanged over TCP and
SSH, push and pull, and rsync -a both ways) into destinations its warm-up seeded, beside
`ssh HOST true` and fastcp's full TCP copies into an empty folder, and reports each rerun
against rsync's and against the full copy of the same direction.

SIZE accepts K/M/G (powers of 1024, also KiB/MiB/GiB) and KB/MB/GB (powers of 1000).";

/// Options that take a value (every other `--name` is a flag).
const VALUE_OPTIONS: &[&str] = &[
    "scale",
    "shape",
    "seed",
    "size",
    "runs",
    "data",
    "only",
    "fastcp",
    "fastcp-args",
    "timeout",
    "ssh-cipher",
    "contenders",
    "window",
    "targets",
    "out",
    "rtt",
    "files",
    "file-size",
    "streams",
    "login",
];

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// Command-line options: positional words plus `--name value` / `--name=value` / `--flag`.
struct Args {
    positional: Vec<String>,
    options: Vec<(String, Option<String>)>,
}

impl Args {
    /// Splits `args`; options named in `with_value` take the next word as their value.
    fn parse(args: &[String], with_value: &[&str]) -> Result<Args> {
        let mut positional = Vec::new();
        let mut options = Vec::new();
        let mut it = args.iter();
        while let Some(a) = it.next() {
            if let Some(name) = a.strip_prefix("--") {
                if let Some((n, v)) = name.split_once('=') {
                    options.push((n.to_owned(), Some(v.to_owned())));
                } else if with_value.contains(&name) {
                    let v = it
                        .next()
                        .with_context(|| format!("--{name} needs a value"))?;
                    options.push((name.to_owned(), Some(v.clone())));
                } else {
                    options.push((name.to_owned(), None));
                }
            } else {
                positional.push(a.clone());
            }
        }
        Ok(Args {
            positional,
            options,
        })
    }

    /// Removes and returns the value of `--name`.
    fn value(&mut self, name: &str) -> Result<Option<String>> {
        match self.options.iter().position(|(n, _)| n == name) {
            Some(i) => match self.options.remove(i).1 {
                Some(v) => Ok(Some(v)),
                None => bail!("--{name} needs a value"),
            },
            None => Ok(None),
        }
    }

    /// Removes `--name` and says whether it was there.
    fn flag(&mut self, name: &str) -> Result<bool> {
        match self.options.iter().position(|(n, _)| n == name) {
            Some(i) => match self.options.remove(i).1 {
                None => Ok(true),
                Some(_) => bail!("--{name} takes no value"),
            },
            None => Ok(false),
        }
    }

    /// Fails on any option nobody asked for.
    fn finish(&self) -> Result<()> {
        if let Some((n, _)) = self.options.first() {
            bail!("unknown option --{n}\n\n{USAGE}");
        }
        Ok(())
    }
}

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask sits in the repository")
        .to_owned()
}

fn default_shape() -> PathBuf {
    repo_root().join("xtask/data/source-tree-shape.tsv")
}

/// The RTTs `bench all` runs `bench wan` at, unless `--rtt` says otherwise.
const ALL_RTTS: &[Duration] = &[
    Duration::from_millis(10),
    Duration::from_millis(50),
    Duration::from_millis(100),
];

/// One [`bench::BenchOptions`] per RTT of `--rtt LIST` (bench wan), else just one.
fn bench_runs(
    mode: bench::Mode,
    args: &mut Args,
    raw: &[String],
    default_rtts: &[Duration],
) -> Result<Vec<bench::BenchOptions>> {
    let rtts = match args.value("rtt")? {
        // Milliseconds, with or without the unit: 10,50 or 10ms,50ms.
        Some(list) => parse_list::<u64>("rtt", &list.replace("ms", ""))?
            .into_iter()
            .map(Duration::from_millis)
            .collect(),
        None => default_rtts.to_vec(),
    };
    let opts = bench_options(mode, args, raw)?;
    if mode != bench::Mode::Wan {
        return Ok(vec![opts]);
    }
    Ok(rtts
        .into_iter()
        .map(|rtt| bench::BenchOptions {
            rtt,
            ..opts.clone()
        })
        .collect())
}

/// A comma-separated list of numbers.
fn parse_list<T: std::str::FromStr>(name: &str, list: &str) -> Result<Vec<T>> {
    list.split(',')
        .map(|v| {
            v.trim()
                .replace('_', "")
                .parse()
                .map_err(|_| anyhow::anyhow!("bad --{name} value {v:?}"))
        })
        .collect()
}

/// The options of `cargo xtask bench MODE` from `args` (all of them consumed).
fn bench_options(
    mode: bench::Mode,
    args: &mut Args,
    raw: &[String],
) -> Result<bench::BenchOptions> {
    let runs = match args.value("runs")? {
        Some(s) => s.parse().with_context(|| format!("bad --runs {s:?}"))?,
        None => 5,
    };
    let opts = bench::BenchOptions {
        mode,
        runs,
        root: args
            .value("data")?
            .map_or_else(|| PathBuf::from("/dev/shm/fastcp-bench"), PathBuf::from),
        only: args
            .value("only")?
            .map(|s| bench::DataSet::parse(&s))
            .transpose()?,
        write: args.flag("write")?,
        timeout: Duration::from_secs(match args.value("timeout")? {
            Some(s) => s.parse().with_context(|| format!("bad --timeout {s:?}"))?,
            None => 600,
        }),
        fastcp: args.value("fastcp")?.map(PathBuf::from),
        ssh_cipher: args
            .value("ssh-cipher")?
            .or_else(|| (mode == bench::Mode::Wan).then(|| wan::SSH_CIPHER.to_owned())),
        contenders: args
            .value("contenders")?
            .map(|s| s.split(',').map(|c| c.trim().to_owned()).collect())
            .unwrap_or_default(),
        fastcp_args: args
            .value("fastcp-args")?
            .map(|s| s.split_whitespace().map(str::to_owned).collect())
            .unwrap_or_default(),
        big_size: data::parse_size(&args.value("size")?.unwrap_or_else(|| {
            if mode == bench::Mode::Wan {
                wan::DEFAULT_SIZE.into()
            } else {
                "2GiB".into()
            }
        }))?,
        wan_window: match args.value("window")? {
            Some(s) => usize::try_from(data::parse_size(&s)?)
                .with_context(|| format!("bad --window {s:?}"))?,
            None => wan::DEFAULT_WINDOW,
        },
        rtt: wan::RTT,
        file_counts: match args.value("files")? {
            Some(list) => parse_list("files", &list)?,
            None => vec![1, 10, 100, 1_000, 10_000, 100_000, 1_000_000],
        },
        file_size: data::parse_size(&args.value("file-size")?.unwrap_or_else(|| "4KiB".into()))?,
        login: args.value("login")?,
        streams: match args.value("streams")? {
            Some(list) => parse_list("streams", &list)?,
            None => vec![1, 2, 4, 8, 16],
        },
        scale: match args.value("scale")? {
            Some(s) => s.parse().with_context(|| format!("bad --scale {s:?}"))?,
            None => 1.0,
        },
        shape: args
            .value("shape")?
            .map_or_else(default_shape, PathBuf::from),
        repo: repo_root(),
        command_line: std::iter::once("cargo xtask".to_owned())
            .chain(raw.iter().map(|a| bench::sq(a)))
            .collect::<Vec<_>>()
            .join(" "),
    };
    args.finish()?;
    Ok(opts)
}

fn parse_seed(v: Option<String>) -> Result<u64> {
    match v {
        None => Ok(data::DEFAULT_SEED),
        Some(s) => s.parse().with_context(|| format!("bad --seed {s:?}")),
    }
}

fn run() -> Result<()> {
    let mut raw: Vec<String> = std::env::args().skip(1).collect();
    // Everything after `--` is passed on (to cargo test) as it is.
    let passthrough = match raw.iter().position(|a| a == "--") {
        Some(i) => {
            let rest = raw.split_off(i);
            rest[1..].to_vec()
        }
        None => Vec::new(),
    };
    let mut args = Args::parse(&raw, VALUE_OPTIONS)?;
    if args.flag("help")? || args.positional.is_empty() {
        println!("{USAGE}");
        return Ok(());
    }
    let positional = std::mem::take(&mut args.positional);
    let words: Vec<&str> = positional.iter().map(String::as_str).collect();
    match words.as_slice() {
        ["gen", "tree", dir] => {
            let dir = PathBuf::from(dir);
            let scale: f64 = match args.value("scale")? {
                Some(s) => s.parse().with_context(|| format!("bad --scale {s:?}"))?,
                None => 1.0,
            };
            let shape = args
                .value("shape")?
                .map_or_else(default_shape, PathBuf::from);
            let seed = parse_seed(args.value("seed")?)?;
            args.finish()?;
            let shape = data::Shape::load(&shape)?;
            eprintln!(
                "shape: {} files, {} bytes, {} directories, {} symlinks (scale {scale})",
                shape.files(),
                shape.bytes(),
                shape.dirs,
                shape.symlinks
            );
            let t = Instant::now();
            let summary = data::gen_tree(&dir, &shape, scale, seed)?;
            println!("{}: {summary}", dir.display());
            eprintln!("generated in {:.1} s", t.elapsed().as_secs_f64());
            Ok(())
        }
        ["gen", "file", path] => {
            let size =
                data::parse_size(&args.value("size")?.context("gen file needs --size SIZE")?)?;
            let seed = parse_seed(args.value("seed")?)?;
            args.finish()?;
            let t = Instant::now();
            data::gen_file(Path::new(path), size, seed)?;
            println!("{path}: {size} random bytes");
            eprintln!("generated in {:.1} s", t.elapsed().as_secs_f64());
            Ok(())
        }
        ["test"] => {
            let opts = test::TestOptions {
                no_install: args.flag("no-install")?,
                cargo_args: passthrough,
            };
            args.finish()?;
            let status = test::run(&opts)?;
            if !status.success() {
                bail!("the test suite failed ({status})");
            }
            Ok(())
        }
        ["dist"] => {
            let opts = dist::DistOptions {
                targets: args
                    .value("targets")?
                    .map(|s| s.split(',').map(|t| t.trim().to_owned()).collect())
                    .unwrap_or_default(),
                out: args
                    .value("out")?
                    .map_or_else(|| repo_root().join("target/dist"), PathBuf::from),
                repo: repo_root(),
            };
            args.finish()?;
            dist::run(&opts)?;
            Ok(())
        }
        ["bench", "all"] => {
            let only = args.value("only")?;
            let modes = [
                bench::Mode::Local,
                bench::Mode::Ssh,
                bench::Mode::Tcp,
                bench::Mode::Sftp,
                bench::Mode::Streams,
                bench::Mode::Files,
                bench::Mode::Wan,
                bench::Mode::Rerun,
            ];
            for mode in modes {
                // The sweeps and the WAN copy their own data sets.
                let own_data = matches!(
                    mode,
                    bench::Mode::Streams | bench::Mode::Files | bench::Mode::Wan
                );
                let tree_only = mode == bench::Mode::Rerun && only.as_deref() == Some("big");
                if (own_data && only.is_some()) || tree_only {
                    eprintln!("bench {}: skipped (--only)", mode.name());
                    continue;
                }
                let mut mode_raw = raw.clone();
                if let Some(w) = mode_raw.iter_mut().find(|w| *w == "all") {
                    *w = mode.name().to_owned();
                }
                let mut mode_args = Args::parse(&mode_raw, VALUE_OPTIONS)?;
                mode_args.positional.clear();
                for mut opts in bench_runs(mode, &mut mode_args, &mode_raw, ALL_RTTS)? {
                    // `--login` is for the reruns; the other modes log in as ever.
                    if mode != bench::Mode::Rerun {
                        opts.login = None;
                    }
                    bench::run(&opts)?;
                }
            }
            let write = args.flag("write")?;
            args.options.clear();
            if write {
                plot::run(&repo_root())?;
            }
            Ok(())
        }
        ["bench", mode] => {
            let mode = bench::Mode::parse(mode)?;
            for opts in bench_runs(mode, &mut args, &raw, &[wan::RTT])? {
                bench::run(&opts)?;
            }
            Ok(())
        }
        ["plot"] => {
            args.finish()?;
            plot::run(&repo_root())
        }
        ["sshd"] => {
            let dir = args
                .value("data")?
                .map_or_else(|| PathBuf::from("/dev/shm/fastcp-bench"), PathBuf::from);
            args.finish()?;
            let sshd = sshd::Sshd::start(&dir.join(format!("sshd-{}", std::process::id())))?;
            println!("sshd listening on 127.0.0.1:{}", sshd.port());
            println!(
                "try: ssh -F {} {} true",
                sshd.ssh_config().display(),
                sshd::ALIAS
            );
            println!("press Enter (or close stdin) to stop it");
            let mut line = String::new();
            let _ = std::io::stdin().read_line(&mut line);
            Ok(())
        }
        ["verify", src, dst] => {
            args.finish()?;
            let (src, dst) = (Path::new(src), Path::new(dst));
            if std::fs::symlink_metadata(src)?.is_dir() {
                verify::compare_trees(src, dst)?;
            } else {
                verify::compare_files(src, dst)?;
            }
            println!("{} equals {}", dst.display(), src.display());
            Ok(())
        }
        _ => bail!("unknown command {:?}\n\n{USAGE}", words.join(" ")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_documented_value_option_takes_a_value() {
        for line in USAGE.lines() {
            let line = line.trim_start();
            let Some(rest) = line.strip_prefix("--") else {
                continue;
            };
            let mut words = rest.split_whitespace();
            let name = words.next().unwrap();
            let takes_value = words
                .next()
                .is_some_and(|w| w.contains('|') || w.chars().all(|c| c.is_ascii_uppercase()));
            assert_eq!(VALUE_OPTIONS.contains(&name), takes_value, "--{name}");
        }
    }

    #[test]
    fn reruns_as_another_account_have_a_section_of_their_own() {
        let section = |words: &[&str]| {
            let raw: Vec<String> = words.iter().map(|s| s.to_string()).collect();
            let mut args = Args::parse(&raw, VALUE_OPTIONS).unwrap();
            args.positional.clear();
            let opts = bench_options(bench::Mode::Rerun, &mut args, &raw).unwrap();
            (opts.section(), opts.login)
        };
        assert_eq!(
            section(&["bench", "rerun"]),
            ("bench rerun".to_owned(), None)
        );
        assert_eq!(
            section(&["bench", "rerun", "--login", "plain", "--runs", "3"]),
            ("bench rerun as plain".to_owned(), Some("plain".to_owned()))
        );
    }

    #[test]
    fn options_and_positionals_are_split() {
        let raw: Vec<String> = [
            "bench",
            "ssh",
            "--ssh-cipher",
            "aes128-gcm@openssh.com",
            "--contenders=fastcp,nc",
            "--write",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let mut args = Args::parse(&raw, VALUE_OPTIONS).unwrap();
        assert_eq!(args.positional, ["bench", "ssh"]);
        assert_eq!(
            args.value("ssh-cipher").unwrap().as_deref(),
            Some("aes128-gcm@openssh.com")
        );
        assert_eq!(
            args.value("contenders").unwrap().as_deref(),
            Some("fastcp,nc")
        );
        assert!(args.flag("write").unwrap());
        args.finish().unwrap();
        let mut bad = Args::parse(&["--bogus".to_string()], VALUE_OPTIONS).unwrap();
        assert!(!bad.flag("write").unwrap());
        assert!(bad.finish().is_err());
    }
}
