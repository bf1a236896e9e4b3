//! `cargo xtask bench local|ssh|tcp|wan|...`: times fastcp against the usual tools on tmpfs.
//!
//! Each contender is a bash command line (so pipelines like `tar | ssh` are measured whole).
//! Every contender runs once as a warm-up, then `runs` timed rounds follow with the contenders
//! alternated inside each round (ABCABC...). The destination is removed before each run (not
//! timed) and every run's output is checked against the source after the clock stops. A
//! contender that exits non-zero, times out or produces a wrong copy is reported as failed and
//! the benchmark carries on with the others.
//!
//! `bench rerun` ([`crate::rerun`]) keeps its reruns' destinations from one run to the next.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use crate::data::{self, Shape};
use crate::report::{self, Report};
use crate::sshd::{ALIAS, Sshd};
use crate::verify::{self, Kind, Manifest};
use crate::wan::{self, Wan};

/// Which benchmark to run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Local copies: fastcp vs `cp -a` vs `tar | tar`.
    Local,
    /// Over a loopback sshd: fastcp `--transport ssh` vs scp, rsync and `tar | ssh`.
    Ssh,
    /// fastcp `--transport tcp` vs scp, `tar | ssh` and plain `nc`.
    Tcp,
    /// Through an emulated 50 ms, 1 Gbit/s link: fastcp's transports vs scp and rsync.
    Wan,
    /// fastcp's SFTP path (`--sftp`, no fastcp on the remote) vs scp (which speaks SFTP
    /// since OpenSSH 9), `tar | ssh`, and the parallel copiers found on PATH.
    Sftp,
    /// Scaling with streams: the big file over TCP and SSH with `-j` from 1 to 16.
    Streams,
    /// Scaling with file count: trees of 1 to 1,000,000 small files, local, over TCP and
    /// SSH, against `tar | ssh` and rsync.
    Files,
    /// Nightly-backup reruns with nothing changed: fastcp's (TCP and SSH, push and pull)
    /// against rsync's and against fastcp's own full copy (see [`crate::rerun`]).
    Rerun,
}

impl Mode {
    /// The mode's name on the command line and in BENCHMARKS.md.
    pub fn name(self) -> &'static str {
        match self {
            Mode::Local => "local",
            Mode::Ssh => "ssh",
            Mode::Tcp => "tcp",
            Mode::Wan => "wan",
            Mode::Sftp => "sftp",
            Mode::Streams => "streams",
            Mode::Files => "files",
            Mode::Rerun => "rerun",
        }
    }

    /// Parses a mode's name.
    pub fn parse(s: &str) -> Result<Mode> {
        Ok(match s {
            "local" => Mode::Local,
            "ssh" => Mode::Ssh,
            "tcp" => Mode::Tcp,
            "wan" => Mode::Wan,
            "sftp" => Mode::Sftp,
            "streams" => Mode::Streams,
            "files" => Mode::Files,
            "rerun" => Mode::Rerun,
            _ => bail!(
                "unknown benchmark {s:?} \
                 (expected local, ssh, tcp, wan, sftp, streams, files or rerun)"
            ),
        })
    }
}

/// The two data sets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DataSet {
    /// One big random file.
    Big,
    /// The kernel-shaped tree.
    Tree,
    /// A tree of this many small files (`bench files`).
    Files(u64),
}

impl DataSet {
    /// Parses `big` or `tree`.
    pub fn parse(s: &str) -> Result<DataSet> {
        Ok(match s {
            "big" => DataSet::Big,
            "tree" => DataSet::Tree,
            _ => bail!("unknown data set {s:?} (expected big or tree)"),
        })
    }

    /// Whether the data set is a directory tree.
    pub fn is_tree(self) -> bool {
        self != DataSet::Big
    }

    /// `big`, `tree` or `files-N`: in log file names and the results file.
    pub fn label(self) -> String {
        match self {
            DataSet::Big => "big".into(),
            DataSet::Tree => "tree".into(),
            DataSet::Files(n) => format!("files-{n}"),
        }
    }
}

/// Everything `bench` needs to know.
#[derive(Clone, Debug)]
pub struct BenchOptions {
    /// Which benchmark.
    pub mode: Mode,
    /// Timed runs per contender.
    pub runs: usize,
    /// Where data sets and copies live (should be tmpfs).
    pub root: PathBuf,
    /// Run only one data set.
    pub only: Option<DataSet>,
    /// Replace this mode's section of BENCHMARKS.md.
    pub write: bool,
    /// Longest a single run may take before it is killed and counted as failed.
    pub timeout: Duration,
    /// Use this fastcp binary instead of building one.
    pub fastcp: Option<PathBuf>,
    /// Cipher for the `ssh` that rsync and `tar | ssh` run (OpenSSH's default if `None`).
    pub ssh_cipher: Option<String>,
    /// Run only the contenders with these ids (all if empty).
    pub contenders: Vec<String>,
    /// Extra arguments for every fastcp run (e.g. `-j 8`).
    pub fastcp_args: Vec<String>,
    /// Size of the big file.
    pub big_size: u64,
    /// `bench wan`: bytes in flight per connection through the relay.
    pub wan_window: usize,
    /// `bench wan`: the round-trip time the relay adds.
    pub rtt: Duration,
    /// `bench files`: the file counts, one tree each.
    pub file_counts: Vec<u64>,
    /// `bench files`: the size of each file.
    pub file_size: u64,
    /// `bench streams`: the stream counts (`-j`).
    pub streams: Vec<usize>,
    /// `bench rerun`: the account every contender logs in as (the current user if `None`).
    pub login: Option<String>,
    /// Scale of the tree (1.0 = the full shape).
    pub scale: f64,
    /// The tree's shape file.
    pub shape: PathBuf,
    /// The repository root (for building fastcp and finding BENCHMARKS.md).
    pub repo: PathBuf,
    /// The command line, recorded in the report.
    pub command_line: String,
}

impl BenchOptions {
    /// Whether `--contenders` lets `c` run.
    pub fn wants(&self, c: &Contender) -> bool {
        self.contenders.is_empty() || self.contenders.contains(&c.id())
    }

    /// The benchmark's name in BENCHMARKS.md and in its results file: `bench tcp`,
    /// `bench wan 10ms` for a WAN run at another RTT than the default, or
    /// `bench rerun as plain` for reruns that log in as another account.
    pub fn section(&self) -> String {
        match (&self.login, self.mode) {
            (_, Mode::Wan) if self.rtt != wan::RTT => {
                format!("bench wan {}ms", self.rtt.as_millis())
            }
            (Some(user), Mode::Rerun) => format!("bench rerun as {user}"),
            _ => format!("bench {}", self.mode.name()),
        }
    }
}

/// A prepared data set: source path and what the copy must equal.
pub struct Data {
    /// Which data set.
    pub set: DataSet,
    /// The source (a file or a directory).
    pub src: PathBuf,
    /// Listing of the source tree (empty for the big file).
    pub manifest: Manifest,
    /// Bytes of file data.
    pub bytes: u64,
    /// One-line description for the report.
    pub description: String,
}

/// One contender: a name and the bash command that performs the copy.
#[derive(Clone, Debug)]
pub struct Contender {
    /// Short name ("scp", "tar | ssh").
    pub name: String,
    /// The command, run with `bash -c` and `set -o pipefail`.
    pub command: String,
    /// For `nc`: the listener started (untimed until the client starts) before the command.
    pub listener: Option<String>,
    /// Known unusable before any run (e.g. fastcp did not build).
    pub broken: Option<String>,
}

impl Contender {
    /// A contender that needs no listener and can run.
    pub fn new(name: &str, command: String) -> Contender {
        Contender {
            name: name.into(),
            command,
            listener: None,
            broken: None,
        }
    }

    /// Short id for `--contenders`: the name without options and pipes (`cp`, `tar-ssh`).
    pub fn id(&self) -> String {
        self.name
            .split_whitespace()
            .filter(|w| *w != "|" && !w.starts_with('-'))
            .collect::<Vec<_>>()
            .join("-")
    }
}

/// What happened to one contender on one data set.
#[derive(Clone, Debug, Default)]
pub struct Outcome {
    /// Duration of the warm-up run, if it ran.
    pub warmup: Option<Duration>,
    /// Durations of the timed runs that succeeded.
    pub times: Vec<Duration>,
    /// Why the contender failed, if it did.
    pub failure: Option<String>,
}

/// Results for one data set.
pub struct DataResult {
    /// The data set.
    pub data: Data,
    /// Contenders with their outcomes, in run order.
    pub contenders: Vec<(Contender, Outcome)>,
}

/// Shell-quotes `s` for bash when it needs it.
pub fn sq(s: &str) -> String {
    if !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"/._-+:=,@".contains(&b))
    {
        s.to_owned()
    } else {
        format!("'{}'", s.replace('\'', r"'\''"))
    }
}

/// A path shell-quoted for bash.
pub fn p(path: &Path) -> String {
    sq(&path.to_string_lossy())
}

/// Runs the whole benchmark and prints (and with `--write`, records) the report.
pub fn run(opts: &BenchOptions) -> Result<Report> {
    let root = &opts.root;
    fs::create_dir_all(root).with_context(|| format!("creating {}", root.display()))?;
    let root = root.canonicalize()?;
    match fs_type(&root) {
        Some(t) if t == "tmpfs" => {}
        other => eprintln!(
            "warning: {} is on {} rather than tmpfs; disk speed will be part of the figures",
            root.display(),
            other.unwrap_or_else(|| "an unknown file system".into())
        ),
    }
    let load_at_start = load_average();
    if let Some(user) = &opts.login {
        if opts.mode != Mode::Rerun {
            bail!("--login is for bench rerun only");
        }
        crate::rerun::account(user)?;
    }

    let sets: Vec<DataSet> = match (opts.mode, opts.only) {
        // Tens of thousands of files at 50 ms per round trip would take scp hours.
        (Mode::Wan | Mode::Streams, Some(DataSet::Tree)) => {
            bail!("bench {} copies the big file only", opts.mode.name())
        }
        (Mode::Wan | Mode::Streams, _) => vec![DataSet::Big],
        (Mode::Files, Some(_)) => bail!("bench files has its own trees: use --files LIST"),
        (Mode::Files, None) => opts
            .file_counts
            .iter()
            .map(|&n| DataSet::Files(n))
            .collect(),
        (Mode::Rerun, Some(DataSet::Big)) => bail!("bench rerun copies the tree only"),
        (Mode::Rerun, _) => vec![DataSet::Tree],
        (_, Some(s)) => vec![s],
        (_, None) => vec![DataSet::Big, DataSet::Tree],
    };
    let mut datas = Vec::new();
    for set in sets {
        datas.push(prepare(set, &root.join("data"), opts)?);
    }

    let fastcp = fastcp_binary(opts);
    let mut notes = Vec::new();
    let mut wan = None;
    let sshd = match opts.mode {
        Mode::Local => None,
        _ => {
            let sshd = Sshd::start(&root.join(format!("sshd-{}", std::process::id())))?;
            if opts.mode == Mode::Wan {
                let bin = fastcp.as_deref().unwrap_or(Path::new("fastcp"));
                let w = Wan::start(
                    &sshd,
                    &root.join(format!("wan-{}", std::process::id())),
                    bin,
                    opts.wan_window,
                    opts.rtt,
                )?;
                notes.extend(w.notes(sshd.port(), datas.first().map(|d| d.bytes)));
                wan = Some(w);
            }
            let cfg = wan
                .as_ref()
                .map_or(sshd.ssh_config(), |w| w.ssh_config().to_owned());
            // Log in once (verbosely, to learn which cipher plain `ssh` negotiates).
            let mut probe = Command::new("ssh");
            probe.arg("-v").arg("-F").arg(&cfg);
            if let Some(c) = &opts.ssh_cipher {
                probe.args(["-c", c]);
            }
            if let Some(user) = &opts.login {
                probe.args(["-l", user]);
            }
            let login = Instant::now();
            let out = probe
                .args([ALIAS, "true"])
                .env_remove("SSH_AUTH_SOCK")
                .stdin(Stdio::null())
                .output()?;
            let login = login.elapsed();
            if !out.status.success() {
                // What the login or the remote shell said, without a verbose ssh's debug lines.
                let said = format!(
                    "{}{}",
                    String::from_utf8_lossy(&out.stdout),
                    String::from_utf8_lossy(&out.stderr)
                );
                let said: Vec<&str> = said.lines().filter(|l| !l.starts_with("debug")).collect();
                bail!(
                    "cannot log in to the benchmark sshd{} (`ssh {ALIAS} true` exited with {}):\n\
                     {}\nsshd log:\n{}",
                    opts.login.as_ref().map_or(String::new(), |u| format!(
                        " as {u}, which needs a local account with a shell that runs commands \
                         (the bench key is authorized for every account)"
                    )),
                    out.status,
                    said.join("\n").trim(),
                    sshd.log()
                );
            }
            let cipher = String::from_utf8_lossy(&out.stderr)
                .lines()
                .find_map(|l| {
                    l.split("client->server cipher: ")
                        .nth(1)
                        .map(|c| c.split_whitespace().next().unwrap_or("").to_owned())
                })
                .unwrap_or_else(|| "unknown".into());
            if let Some(user) = &opts.login {
                notes.push(format!(
                    "Every contender logs in as `{user}` (ssh and rsync's ssh `-l {user}`, \
                     fastcp `-o User={user}`); the sshd authorizes the bench key for any account"
                ));
            }
            if opts.mode == Mode::Wan {
                notes.push(format!(
                    "A login through the relay (`ssh -F \"$CFG\" {ALIAS} true`) took {:.2} s: \
                     every contender pays it once per run",
                    login.as_secs_f64()
                ));
            } else {
                let chosen = if opts.ssh_cipher.is_some() {
                    " (set with --ssh-cipher)"
                } else {
                    ", OpenSSH's default"
                };
                notes.push(if opts.mode == Mode::Rerun {
                    format!("`ssh` (hence rsync) negotiated {cipher}{chosen}")
                } else {
                    format!(
                        "`ssh` (hence rsync and `tar | ssh`) negotiated {cipher}{chosen}; \
                         scp is forced to aes128-gcm@openssh.com"
                    )
                });
            }
            eprintln!(
                "benchmark sshd on 127.0.0.1:{} (config {}); ssh negotiates {cipher}",
                sshd.port(),
                cfg.display()
            );
            Some(sshd)
        }
    };
    let cfg = match &wan {
        Some(w) => Some(w.ssh_config().to_owned()),
        None => sshd.as_ref().map(|s| s.ssh_config()),
    };

    let out = root.join("out");
    let logs = root.join("logs");
    fs::create_dir_all(&logs)?;
    let mut results = Vec::new();
    for data in datas {
        if opts.mode == Mode::Rerun {
            let cfg = cfg.as_deref().expect("bench rerun starts an sshd");
            let contenders = crate::rerun::measure(opts, &fastcp, &data, &root, &logs, cfg)?;
            results.push(DataResult { data, contenders });
            continue;
        }
        let dst = out.join(data.src.file_name().unwrap());
        let mut contenders = contenders(opts, &fastcp, &data, &dst, wan.as_ref());
        check_wanted(opts, &contenders)?;
        contenders.retain(|c| opts.wants(c));
        let outcomes = measure(opts, &data, &contenders, &out, &dst, &logs, cfg.as_deref())?;
        results.push(DataResult {
            data,
            contenders: contenders.into_iter().zip(outcomes).collect(),
        });
    }
    let _ = fs::remove_dir_all(&out);
    drop(wan);
    drop(sshd);

    let load = format!("{load_at_start} at start, {} at the end", load_average());
    let report = Report::new(opts, &root, load, notes, results);
    let markdown = report.markdown();
    println!("{markdown}");
    if opts.write {
        let path = opts.repo.join("BENCHMARKS.md");
        let heading = format!("## {}", opts.section());
        report::write_section(&path, &heading, &markdown)?;
        eprintln!("updated section \"{heading}\" of {}", path.display());
        let results = report::results_path(&opts.repo, &opts.section());
        let params = match (opts.mode, &opts.login) {
            (Mode::Wan, _) => vec![("rtt_ms", opts.rtt.as_millis().to_string())],
            (Mode::Rerun, Some(user)) => vec![("login", user.clone())],
            _ => Vec::new(),
        };
        report.write_results(&results, &params)?;
        eprintln!("wrote every timed run to {}", results.display());
    }
    Ok(report)
}

/// Fails on a `--contenders` id that names none of `contenders`.
pub fn check_wanted(opts: &BenchOptions, contenders: &[Contender]) -> Result<()> {
    let ids: Vec<String> = contenders.iter().map(Contender::id).collect();
    for want in &opts.contenders {
        // Some contenders copy one data set only (nc: the big file; fastcp-local in
        // bench tcp: the tree); asking for them is fine when the other runs too.
        let known = ids.contains(want) || ["nc", "fastcp-local"].contains(&want.as_str());
        if !known {
            bail!(
                "no contender {want:?} in bench {} (there are: {})",
                opts.mode.name(),
                ids.join(", ")
            );
        }
    }
    Ok(())
}

/// Generates (once) and scans a data set under `data_dir`.
fn prepare(set: DataSet, data_dir: &Path, opts: &BenchOptions) -> Result<Data> {
    fs::create_dir_all(data_dir)?;
    match set {
        DataSet::Big => {
            let src = data_dir.join(format!(
                "big-{}.bin",
                report::human_size(opts.big_size).replace(' ', "")
            ));
            let stamp = format!(
                "generator {}, seed {}, size {}\n",
                data::GENERATOR_VERSION,
                data::DEFAULT_SEED,
                opts.big_size
            );
            if !stamp_matches(&src, &stamp)? {
                eprintln!("generating {} ...", src.display());
                let t = Instant::now();
                data::gen_file(&src, opts.big_size, data::DEFAULT_SEED)?;
                fs::write(stamp_path(&src), &stamp)?;
                eprintln!("  done in {:.1} s", t.elapsed().as_secs_f64());
            }
            let bytes = fs::metadata(&src)?.len();
            if bytes != opts.big_size {
                bail!(
                    "{} has {} bytes, expected {}; remove it to regenerate",
                    src.display(),
                    bytes,
                    opts.big_size
                );
            }
            Ok(Data {
                set,
                src,
                manifest: Manifest::default(),
                bytes,
                description: format!(
                    "{} random file ({} bytes)",
                    report::human_size(bytes),
                    report::thousands(bytes)
                ),
            })
        }
        DataSet::Files(count) => {
            let src = data_dir.join(format!("files-{count}"));
            let stamp = format!(
                "generator {}, seed {}, files {count}, size {}\n",
                data::GENERATOR_VERSION,
                data::DEFAULT_SEED,
                opts.file_size
            );
            if !stamp_matches(&src, &stamp)? {
                let partial = data::partial_name(&src);
                if partial.exists() {
                    fs::remove_dir_all(&partial)?;
                }
                eprintln!("generating {} ...", src.display());
                let t = Instant::now();
                data::gen_flat_tree(&partial, count, opts.file_size, data::DEFAULT_SEED)?;
                fs::rename(&partial, &src)?;
                fs::write(stamp_path(&src), &stamp)?;
                eprintln!("  done in {:.1} s", t.elapsed().as_secs_f64());
            }
            let manifest = verify::scan(&src)?;
            let bytes = manifest.bytes();
            Ok(Data {
                set,
                src,
                manifest,
                bytes,
                description: format!(
                    "{} files of {} ({} bytes), at most {} per directory",
                    report::thousands(count),
                    report::human_size(opts.file_size),
                    report::thousands(bytes),
                    data::FILES_PER_DIR
                ),
            })
        }
        DataSet::Tree => {
            let name = if opts.scale == 1.0 {
                "tree".to_owned()
            } else {
                format!("tree-scale{}", opts.scale)
            };
            let src = data_dir.join(name);
            let shape_text = fs::read(&opts.shape).with_context(|| {
                format!(
                    "cannot read the source-tree shape file {} (pass another one with --shape PATH)",
                    opts.shape.display()
                )
            })?;
            let stamp = format!(
                "generator {}, seed {}, scale {}, shape {:016x}\n",
                data::GENERATOR_VERSION,
                data::DEFAULT_SEED,
                opts.scale,
                fnv1a(&shape_text)
            );
            if !stamp_matches(&src, &stamp)? {
                let shape = Shape::load(&opts.shape)?;
                let partial = data::partial_name(&src);
                if partial.exists() {
                    fs::remove_dir_all(&partial)?;
                }
                eprintln!("generating {} ...", src.display());
                let t = Instant::now();
                let summary = data::gen_tree(&partial, &shape, opts.scale, data::DEFAULT_SEED)?;
                fs::rename(&partial, &src)?;
                fs::write(stamp_path(&src), &stamp)?;
                eprintln!("  {summary}\n  done in {:.1} s", t.elapsed().as_secs_f64());
            }
            // scp -r follows symlinks and stops at a dangling one: bench sftp copies the tree
            // without its links, so that scp can take part.
            let (src, what) = if opts.mode == Mode::Sftp {
                let bare = data_dir.join(format!(
                    "{}-nolinks",
                    src.file_name().unwrap().to_string_lossy()
                ));
                if !stamp_matches(&bare, &stamp)? {
                    let partial = data::partial_name(&bare);
                    if partial.exists() {
                        fs::remove_dir_all(&partial)?;
                    }
                    eprintln!("copying {} without its symlinks ...", src.display());
                    let ok = Command::new("cp")
                        .arg("-a")
                        .arg(&src)
                        .arg(&partial)
                        .status()?
                        .success()
                        && Command::new("find")
                            .arg(&partial)
                            .args(["-type", "l", "-delete"])
                            .status()?
                            .success();
                    if !ok {
                        bail!("cannot make {}", bare.display());
                    }
                    fs::rename(&partial, &bare)?;
                    fs::write(stamp_path(&bare), &stamp)?;
                }
                (
                    bare,
                    "Kernel-shaped tree without its symlinks (scp -r cannot copy them)",
                )
            } else {
                (src, "Kernel-shaped tree")
            };
            let manifest = verify::scan(&src)?;
            let bytes = manifest.bytes();
            let description = format!(
                "{what}: {} files, {} directories, {} symlinks, {} ({} bytes)",
                report::thousands(manifest.count(&Kind::File) as u64),
                report::thousands(manifest.count(&Kind::Dir) as u64 + 1),
                manifest.count(&Kind::Symlink(PathBuf::new())),
                report::human_size(bytes),
                report::thousands(bytes),
            );
            Ok(Data {
                set,
                src,
                manifest,
                bytes,
                description,
            })
        }
    }
}

/// Where the parameters a data set was generated with are recorded.
fn stamp_path(src: &Path) -> PathBuf {
    let mut name = src.file_name().unwrap_or_default().to_os_string();
    name.push(".stamp");
    src.with_file_name(name)
}

/// Whether `src` exists and was generated with the parameters in `stamp`. A data set that
/// exists with other (or unknown) parameters is removed so it can be generated again.
fn stamp_matches(src: &Path, stamp: &str) -> Result<bool> {
    let Ok(meta) = fs::symlink_metadata(src) else {
        return Ok(false);
    };
    if fs::read_to_string(stamp_path(src)).is_ok_and(|s| s == stamp) {
        return Ok(true);
    }
    eprintln!(
        "{} was generated with other parameters; generating it again",
        src.display()
    );
    if meta.is_dir() {
        fs::remove_dir_all(src)?;
    } else {
        fs::remove_file(src)?;
    }
    Ok(false)
}

/// FNV-1a, to fingerprint the shape file in the stamp.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// What every contender's command line shares, quoted for the shell.
pub(crate) struct Common {
    /// fastcp's binary (`target/release/fastcp` when it could not be built).
    pub bin: String,
    /// Why fastcp could not be built, if it could not: its runs are then counted as failed.
    pub broken: Option<String>,
    /// `--fastcp-args`, each with a space before it.
    pub extra: String,
    /// ssh's ` -c CIPHER` from `--ssh-cipher`, or nothing.
    pub cipher: String,
}

impl Common {
    pub(crate) fn new(opts: &BenchOptions, fastcp: &Result<PathBuf, String>) -> Common {
        let (bin, broken) = match fastcp {
            Ok(bin) => (p(bin), None),
            Err(why) => ("target/release/fastcp".to_owned(), Some(why.clone())),
        };
        Common {
            bin,
            broken,
            extra: opts
                .fastcp_args
                .iter()
                .map(|a| format!(" {}", sq(a)))
                .collect(),
            cipher: opts
                .ssh_cipher
                .as_deref()
                .map_or(String::new(), |c| format!(" -c {}", sq(c))),
        }
    }
}

/// The fastcp binary, built unless one was given; `Err` holds why it is unusable.
fn fastcp_binary(opts: &BenchOptions) -> Result<PathBuf, String> {
    if let Some(path) = &opts.fastcp {
        // Absolute, so that it also works as --remote-path in the ssh session.
        return Ok(path.canonicalize().unwrap_or_else(|_| path.clone()));
    }
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    eprintln!("building fastcp: cargo build --release -p fastcp");
    let status = Command::new(cargo)
        .args(["build", "--release", "-p", "fastcp"])
        .current_dir(&opts.repo)
        .stdin(Stdio::null())
        .status();
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| opts.repo.join("target"));
    let bin = target.join("release").join("fastcp");
    match status {
        Ok(s) if s.success() && bin.exists() => Ok(bin),
        Ok(s) if s.success() => Err(format!("no binary at {} after the build", bin.display())),
        Ok(s) => Err(format!("`cargo build --release -p fastcp` failed ({s})")),
        Err(e) => Err(format!("cannot run cargo: {e}")),
    }
}

/// The contenders of `opts.mode` for one data set, copying `data.src` to `dst` (through `wan`
/// in `bench wan`).
fn contenders(
    opts: &BenchOptions,
    fastcp: &Result<PathBuf, String>,
    data: &Data,
    dst: &Path,
    wan: Option<&Wan>,
) -> Vec<Contender> {
    let tree = data.set.is_tree();
    let (src, dstq) = (p(&data.src), p(dst));
    let src_parent = p(data.src.parent().unwrap());
    let dst_parent = p(dst.parent().unwrap());
    let name = sq(&data.src.file_name().unwrap().to_string_lossy());
    let r = if tree { "-r " } else { "" };
    let Common {
        bin: fastcp_bin,
        broken,
        extra,
        cipher: c,
    } = Common::new(opts, fastcp);
    let cmd = Contender::new;
    let fastcp_run = |name: &str, args: String| Contender {
        name: name.into(),
        command: format!("{fastcp_bin} {r}{args}{extra}"),
        listener: None,
        broken: broken.clone(),
    };
    let remote =
        |transport: &str| format!("--transport {transport} -F \"$CFG\" --remote-path {fastcp_bin}");
    let fastcp_remote = |transport: &str| {
        fastcp_run(
            "fastcp",
            format!("{} {src} {ALIAS}:{dstq}", remote(transport)),
        )
    };
    // Pulls copy the same source, named as the remote side sees it, to the same destination.
    let fastcp_pull = |transport: &str| {
        fastcp_run(
            "fastcp pull",
            format!("{} {ALIAS}:{src} {dstq}", remote(transport)),
        )
    };
    let fastcp_local = fastcp_run("fastcp local", format!("{src} {dstq}"));
    // scp -r follows symlinks and stops at a dangling one, after copying most of the tree
    // (minutes, for the kernel-shaped tree): it is listed as failed without being run.
    let mut scp = cmd(
        "scp",
        format!("scp -q -F \"$CFG\" -c aes128-gcm@openssh.com {r}{src} {ALIAS}:{dstq}"),
    );
    if tree && let Some(link) = first_dangling_link(&data.src) {
        scp.broken = Some(format!(
            "not run: `scp -r` follows symlinks and fails on a dangling one, such as {}",
            link.display()
        ));
    }
    let remote_tar = if tree {
        format!("mkdir -p {dstq} && tar -C {dstq} -xf -")
    } else {
        format!("tar -C {dst_parent} -xf -")
    };
    let tar_ssh_pull = cmd(
        "tar | ssh pull",
        if tree {
            format!(
                "mkdir -p {dstq} && ssh -F \"$CFG\"{c} {ALIAS} {} | tar -C {dstq} -xf -",
                sq(&format!("tar -C {src} -cf - ."))
            )
        } else {
            format!(
                "ssh -F \"$CFG\"{c} {ALIAS} {} | tar -C {dst_parent} -xf -",
                sq(&format!("tar -C {src_parent} -cf - {name}"))
            )
        },
    );
    let rsync = cmd(
        "rsync",
        if tree {
            format!("rsync -a -e \"ssh -F $CFG{c}\" {src}/ {ALIAS}:{dstq}/")
        } else {
            format!("rsync -a -e \"ssh -F $CFG{c}\" {src} {ALIAS}:{dstq}")
        },
    );
    let tar_ssh = cmd(
        "tar | ssh",
        if tree {
            format!(
                "tar -C {src} -cf - . | ssh -F \"$CFG\"{c} {ALIAS} {}",
                sq(&remote_tar)
            )
        } else {
            format!(
                "tar -C {src_parent} -cf - {name} | ssh -F \"$CFG\"{c} {ALIAS} {}",
                sq(&remote_tar)
            )
        },
    );
    match opts.mode {
        Mode::Local => vec![
            Contender {
                name: "fastcp".into(),
                ..fastcp_local
            },
            cmd("cp -a", format!("cp -a {src} {dstq}")),
            cmd(
                "tar | tar",
                if tree {
                    format!("mkdir -p {dstq} && tar -C {src} -cf - . | tar -C {dstq} -xf -")
                } else {
                    format!("tar -C {src_parent} -cf - {name} | tar -C {dst_parent} -xf -")
                },
            ),
        ],
        Mode::Ssh => vec![
            fastcp_remote("ssh"),
            fastcp_pull("ssh"),
            // The system OpenSSH client carrying the session (as when ssh_config needs it):
            // the data then takes sealed TCP streams to the address `ssh -G` resolves.
            Contender {
                name: "fastcp system-ssh".into(),
                command: format!(
                    "{fastcp_bin} {r}--ssh-program ssh -F \"$CFG\" --remote-path {fastcp_bin}{extra} {src} {ALIAS}:{dstq}"
                ),
                listener: None,
                broken: broken.clone(),
            },
            scp,
            rsync,
            tar_ssh,
            tar_ssh_pull,
        ],
        Mode::Sftp => {
            let mut v = vec![
                Contender {
                    name: "fastcp".into(),
                    command: format!(
                        "{fastcp_bin} {r}--sftp -F \"$CFG\"{extra} {src} {ALIAS}:{dstq}"
                    ),
                    listener: None,
                    broken: broken.clone(),
                },
                Contender {
                    name: "fastcp pull".into(),
                    command: format!(
                        "{fastcp_bin} {r}--sftp -F \"$CFG\"{extra} {ALIAS}:{src} {dstq}"
                    ),
                    listener: None,
                    broken: broken.clone(),
                },
                Contender {
                    name: "scp pull".into(),
                    command: scp.command.replace(
                        &format!("{src} {ALIAS}:{dstq}"),
                        &format!("{ALIAS}:{src} {dstq}"),
                    ),
                    ..scp.clone()
                },
                scp,
                tar_ssh,
                tar_ssh_pull,
            ];
            v.extend(peers(&src, &dstq, tree));
            v
        }
        Mode::Tcp => {
            let mut v = vec![fastcp_remote("tcp"), fastcp_pull("tcp")];
            if tree {
                // The physical limit for a tree: the same engine without the network.
                v.push(fastcp_local);
            } else {
                // The probe's override: as on a CPU without AES, fastcp picks ChaCha20.
                let mut no_aes = fastcp_remote("tcp");
                no_aes.name = "fastcp no-aes".into();
                no_aes.command = format!("{NO_HW_AES}=1 {}", no_aes.command);
                v.push(no_aes);
                v.push(Contender {
                    name: "nc".into(),
                    command: format!("nc -N 127.0.0.1 \"$PORT\" < {src}"),
                    listener: Some(format!("nc -l -d 127.0.0.1 \"$PORT\" > {dstq}")),
                    broken: (!which("nc")).then(|| {
                        "not run: nc is not on PATH (Debian: apt-get install netcat-openbsd)".into()
                    }),
                });
            }
            v.extend([scp, tar_ssh, tar_ssh_pull]);
            v.extend(peers(&src, &dstq, tree));
            v
        }
        Mode::Streams => opts
            .streams
            .iter()
            .flat_map(|j| {
                ["tcp", "ssh"].map(|t| {
                    fastcp_run(
                        &format!("fastcp {t} -j {j}"),
                        format!("{} -j {j} {src} {ALIAS}:{dstq}", remote(t)),
                    )
                })
            })
            .collect(),
        Mode::Files => vec![
            fastcp_local,
            Contender {
                name: "fastcp tcp".into(),
                ..fastcp_remote("tcp")
            },
            Contender {
                name: "fastcp ssh".into(),
                ..fastcp_remote("ssh")
            },
            tar_ssh,
            rsync,
        ],
        Mode::Rerun => unreachable!("bench rerun has its own contenders (rerun.rs)"),
        Mode::Wan => wan::contenders(
            &fastcp_bin,
            broken,
            wan.map_or(Path::new("fastcp"), Wan::wrapper),
            &extra,
            &src,
            &dstq,
            opts.ssh_cipher.as_deref().unwrap_or(wan::SSH_CIPHER),
        ),
    }
}

/// The environment variable that makes fastcp's cipher probe act as on a CPU without AES.
const NO_HW_AES: &str = "FASTCP_NO_HW_AES";

/// Other parallel copiers found on PATH, pushing `src` to `dst` through the benchmark sshd:
/// EScp (`../shared/peers/build-escp.sh` builds it), mscp, and rclone's SFTP backend.
fn peers(src: &str, dst: &str, tree: bool) -> Vec<Contender> {
    let cmd = Contender::new;
    let mut v = Vec::new();
    if which("escp") {
        // EScp takes no ssh_config: the port comes from it, the key and known_hosts through
        // the sshd's `ssh-direct` wrapper.
        v.push(cmd(
            "escp",
            format!(
                "escp -q -P \"$(awk '/Port/{{print $2}}' \"$CFG\")\" -S \"${{CFG%/*}}/ssh-direct\" \
                 {}{src} \"$(id -un)\"@127.0.0.1:{dst}",
                if tree { "-r " } else { "" }
            ),
        ));
    }
    if which("mscp") {
        v.push(cmd(
            "mscp",
            format!("mscp -q -F \"$CFG\" -c aes128-gcm@openssh.com {src} {ALIAS}:{dst}"),
        ));
    }
    if which("rclone") {
        v.push(cmd(
            "rclone",
            format!(
                "rclone copy{} --sftp-ssh \"ssh -F $CFG {ALIAS}\" {src} :sftp:{dst}",
                if tree { "" } else { "to" }
            ),
        ));
    }
    v
}

/// Whether `program` is on PATH.
fn which(program: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|path| std::env::split_paths(&path).any(|d| d.join(program).is_file()))
}

/// The first symlink under `dir` whose target does not exist, if any.
fn first_dangling_link(dir: &Path) -> Option<PathBuf> {
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in fs::read_dir(&d).ok()?.flatten() {
            let path = entry.path();
            match entry.file_type() {
                Ok(t) if t.is_dir() => stack.push(path),
                Ok(t) if t.is_symlink() && fs::metadata(&path).is_err() => return Some(path),
                _ => {}
            }
        }
    }
    None
}

/// Warm-up plus `opts.runs` alternated rounds, each run into a fresh `dst`.
fn measure(
    opts: &BenchOptions,
    data: &Data,
    contenders: &[Contender],
    out: &Path,
    dst: &Path,
    logs: &Path,
    cfg: Option<&Path>,
) -> Result<Vec<Outcome>> {
    let label = format!("{}/{}", opts.mode.name(), data.set.label());
    alternate(&label, opts.runs, contenders, |c, i, _round| {
        let log = logs.join(format!("{}-{}.log", label.replace('/', "-"), i));
        run_once(c, data, out, dst, &log, cfg, opts.timeout)
    })
}

/// One warm-up run per contender, then `runs` rounds with every contender once each, in
/// order. `run(contender, index, round)` performs one run (round 0 is the warm-up); its outer
/// `Err` aborts the benchmark, its inner `Err` is the contender's failure, after which the
/// contender runs no more.
pub fn alternate(
    label: &str,
    runs: usize,
    contenders: &[Contender],
    mut run: impl FnMut(&Contender, usize, usize) -> Result<Result<Duration, String>>,
) -> Result<Vec<Outcome>> {
    let mut outcomes: Vec<Outcome> = vec![Outcome::default(); contenders.len()];
    for (i, c) in contenders.iter().enumerate() {
        if let Some(why) = &c.broken {
            eprintln!("[{label}] {}: skipped: {why}", c.name);
            outcomes[i].failure = Some(why.clone());
            continue;
        }
        match run(c, i, 0)? {
            Ok(t) => {
                eprintln!("[{label}] warm-up {}: {:.2} s", c.name, t.as_secs_f64());
                outcomes[i].warmup = Some(t);
            }
            Err(why) => {
                eprintln!("[{label}] warm-up {}: FAILED: {why}", c.name);
                outcomes[i].failure = Some(why);
            }
        }
    }
    for round in 1..=runs {
        for (i, c) in contenders.iter().enumerate() {
            if outcomes[i].failure.is_some() {
                continue;
            }
            match run(c, i, round)? {
                Ok(t) => {
                    eprintln!(
                        "[{label}] round {round}/{runs} {}: {:.2} s",
                        c.name,
                        t.as_secs_f64()
                    );
                    outcomes[i].times.push(t);
                }
                Err(why) => {
                    eprintln!("[{label}] round {round}/{runs} {}: FAILED: {why}", c.name);
                    outcomes[i].failure = Some(format!("run {round}: {why}"));
                }
            }
        }
    }
    Ok(outcomes)
}

/// One run: clear the destination, time the command, check the copy.
///
/// The outer `Err` is a harness problem (abort); the inner `Err` is the contender's failure.
fn run_once(
    c: &Contender,
    data: &Data,
    out: &Path,
    dst: &Path,
    log: &Path,
    cfg: Option<&Path>,
    timeout: Duration,
) -> Result<Result<Duration, String>> {
    if out.exists() {
        fs::remove_dir_all(out).with_context(|| format!("clearing {}", out.display()))?;
    }
    fs::create_dir_all(out)?;
    let elapsed = match time_command(c, log, cfg, timeout)? {
        Ok(t) => t,
        Err(why) => return Ok(Err(why)),
    };
    let check = if data.set.is_tree() {
        verify::compare_tree_to(&data.src, &data.manifest, dst)
    } else {
        verify::compare_files(&data.src, dst)
    };
    Ok(check_result(check, elapsed))
}

/// A run's time, or why its copy is wrong.
pub fn check_result(check: Result<()>, elapsed: Duration) -> Result<Duration, String> {
    match check {
        Ok(()) => Ok(elapsed),
        Err(e) => Err(format!(
            "wrong copy (run took {:.1} s): {e:#}",
            elapsed.as_secs_f64()
        )),
    }
}

/// Runs `c` (after its listener, if it has one) with `bash -c`, `$CFG` set to `cfg` and
/// stderr in `log`, and times it. The inner `Err` says why it failed: exit status and the
/// log's last lines, or the timeout.
pub fn time_command(
    c: &Contender,
    log: &Path,
    cfg: Option<&Path>,
    timeout: Duration,
) -> Result<Result<Duration, String>> {
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let shell = |script: &str, log_file: &Path| -> Result<std::process::Child> {
        let mut cmd = Command::new("bash");
        cmd.arg("-c")
            .arg(format!("set -o pipefail\n{script}"))
            .env("PORT", port.to_string())
            .env_remove("SSH_AUTH_SOCK")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(fs::File::create(log_file)?);
        if let Some(cfg) = cfg {
            cmd.env("CFG", cfg);
        }
        std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
        Ok(cmd.spawn()?)
    };

    let listener = match &c.listener {
        Some(script) => {
            let child = shell(script, &log.with_extension("listener.log"))?;
            let deadline = Instant::now() + Duration::from_secs(10);
            while !is_listening(port) {
                if Instant::now() > deadline {
                    kill_group(child.id());
                    return Ok(Err("the listener did not start within 10 s".into()));
                }
                std::thread::sleep(Duration::from_millis(5));
            }
            Some(child)
        }
        None => None,
    };

    let start = Instant::now();
    let child = shell(&c.command, log)?;
    let (status, timed_out) = wait_with_timeout(child, timeout)?;
    let mut listener_result = None;
    if let Some(l) = listener {
        let left = timeout
            .saturating_sub(start.elapsed())
            .max(Duration::from_secs(1));
        listener_result = Some(wait_with_timeout(l, left)?);
    }
    let elapsed = start.elapsed();

    let tail = |path: &Path| -> String {
        let text = fs::read_to_string(path).unwrap_or_default();
        let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
        lines[lines.len().saturating_sub(2)..]
            .iter()
            .map(|l| {
                let l = l.trim();
                match l.char_indices().nth(120) {
                    Some((at, _)) => format!("{}…", &l[..at]),
                    None => l.to_owned(),
                }
            })
            .collect::<Vec<_>>()
            .join(" / ")
    };
    if timed_out {
        return Ok(Err(format!("killed after {} s", timeout.as_secs())));
    }
    if !status.success() {
        return Ok(Err(format!(
            "{status} after {:.1} s: {}",
            elapsed.as_secs_f64(),
            tail(log)
        )));
    }
    if let Some((status, timed_out)) = listener_result
        && (timed_out || !status.success())
    {
        return Ok(Err(format!(
            "listener {status}: {}",
            tail(&log.with_extension("listener.log"))
        )));
    }
    Ok(Ok(elapsed))
}

/// Waits for `child`; after `timeout` kills its whole process group. Returns the status and
/// whether it was killed.
pub fn wait_with_timeout(
    mut child: std::process::Child,
    timeout: Duration,
) -> Result<(ExitStatus, bool)> {
    let pid = child.id();
    let (done, wait) = mpsc::channel::<()>();
    let watchdog = std::thread::spawn(move || {
        if wait.recv_timeout(timeout).is_err() {
            kill_group(pid);
            true
        } else {
            false
        }
    });
    let status = child.wait()?;
    let _ = done.send(());
    let timed_out = watchdog.join().unwrap_or(false);
    Ok((status, timed_out))
}

/// Kills the process group led by `pid` (a group this harness created).
fn kill_group(pid: u32) {
    let _ = Command::new("kill")
        .args(["-KILL", "--", &format!("-{pid}")])
        .status();
}

/// The 1, 5 and 15 minute load averages, as /proc/loadavg gives them.
fn load_average() -> String {
    let text = fs::read_to_string("/proc/loadavg").unwrap_or_default();
    text.split_whitespace()
        .take(3)
        .collect::<Vec<_>>()
        .join(" ")
}

/// Whether something listens on 127.0.0.1:`port` (read from /proc/net/tcp).
fn is_listening(port: u16) -> bool {
    let want = format!("0100007F:{port:04X}");
    fs::read_to_string("/proc/net/tcp")
        .map(|t| {
            t.lines().skip(1).any(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                f.len() > 3 && f[1] == want && f[3] == "0A"
            })
        })
        .unwrap_or(false)
}

/// The file system type of the mount holding `path`.
pub fn fs_type(path: &Path) -> Option<String> {
    let mounts = fs::read_to_string("/proc/self/mounts").ok()?;
    mounts
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.len() > 2).then(|| (f[1].replace("\\040", " "), f[2].to_owned()))
        })
        .filter(|(mnt, _)| path.starts_with(mnt))
        .max_by_key(|(mnt, _)| mnt.len())
        .map(|(_, t)| t)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn contender_ids() {
        let c = |name: &str| Contender {
            name: name.into(),
            command: String::new(),
            listener: None,
            broken: None,
        };
        assert_eq!(c("cp -a").id(), "cp");
        assert_eq!(c("tar | tar").id(), "tar-tar");
        assert_eq!(c("tar | ssh").id(), "tar-ssh");
        assert_eq!(c("fastcp").id(), "fastcp");
    }

    #[test]
    fn stamps_and_fingerprints() {
        assert_ne!(fnv1a(b"a"), fnv1a(b"b"));
        let dir = std::env::temp_dir().join(format!("xtask-stamp-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(dir.join("set")).unwrap();
        assert!(!stamp_matches(&dir.join("missing"), "x").unwrap());
        fs::write(stamp_path(&dir.join("set")), "v1").unwrap();
        assert!(stamp_matches(&dir.join("set"), "v1").unwrap());
        // Other parameters: the stale data set is removed.
        assert!(!stamp_matches(&dir.join("set"), "v2").unwrap());
        assert!(!dir.join("set").exists());
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn quoting() {
        assert_eq!(sq("/dev/shm/a-b_c.bin"), "/dev/shm/a-b_c.bin");
        assert_eq!(sq("a b"), "'a b'");
        assert_eq!(sq("it's"), r"'it'\''s'");
        assert_eq!(sq(""), "''");
    }

    #[test]
    fn timeout_kills_the_whole_group() {
        let mut cmd = Command::new("bash");
        cmd.args(["-c", "sleep 30 | sleep 30"]);
        std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
        let t = Instant::now();
        let (status, timed_out) =
            wait_with_timeout(cmd.spawn().unwrap(), Duration::from_millis(200)).unwrap();
        assert!(timed_out);
        assert!(!status.success());
        assert!(t.elapsed() < Duration::from_secs(20));
    }

    #[test]
    fn dev_shm_is_found_in_mounts() {
        // Whatever it is, the root file system has a type.
        assert!(fs_type(Path::new("/")).is_some());
    }
}
