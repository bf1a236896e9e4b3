//! The benchmark report: a Markdown section with the machine, the versions, the command, one
//! table per data set (median, min, max, throughput, ratio to the baselines) and the targets.
//! `write_section` replaces only this benchmark's own `## bench <mode>` section of
//! BENCHMARKS.md, leaving the rest of the file as it is.

use std::fmt::Write as _;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{Context, Result};

use crate::bench::{BenchOptions, DataResult, DataSet, Mode, Outcome};

/// A finished benchmark, ready to render.
pub struct Report {
    mode: Mode,
    /// `bench tcp`, `bench wan 10ms`: the section's heading.
    section: String,
    runs: usize,
    command_line: String,
    date: String,
    machine: String,
    versions: String,
    root: String,
    fs_type: String,
    load: String,
    notes: Vec<String>,
    /// Results per data set.
    pub results: Vec<DataResult>,
}

/// A target from the specification: a fastcp contender's median against a baseline's median.
struct Target {
    /// The fastcp contender the target is for.
    contender: &'static str,
    baseline: &'static str,
    bound: Bound,
}

/// What a target asks of the contender's time over the baseline's time.
#[derive(Clone, Copy)]
enum Bound {
    /// The time ratio is at most this.
    TimeAtMost(f64),
    /// The throughput is at least this many times the baseline's (time ratio ≤ 1/x).
    SpeedAtLeast(f64),
}

/// Baselines that ratios are computed against.
fn baselines(mode: Mode, set: DataSet) -> &'static [&'static str] {
    let tree = set.is_tree();
    match (mode, tree) {
        (Mode::Local, false) => &["cp -a"],
        (Mode::Local, true) => &["tar | tar"],
        (Mode::Ssh, false) => &["scp"],
        (Mode::Ssh, true) => &["tar | ssh", "tar | ssh pull"],
        (Mode::Tcp, false) => &["scp", "nc"],
        (Mode::Tcp, true) => &["tar | ssh", "fastcp local"],
        (Mode::Wan, _) => &["scp"],
        (Mode::Sftp, false) => &["scp", "scp pull"],
        (Mode::Sftp, true) => &["scp", "scp pull", "tar | ssh", "tar | ssh pull"],
        (Mode::Streams, _) => &["fastcp tcp -j 1"],
        (Mode::Files, _) => &["fastcp local", "tar | ssh"],
        // Each rerun against those of its own direction (`rerun_table`).
        (Mode::Rerun, _) => &[],
    }
}

fn targets(mode: Mode, set: DataSet) -> Vec<Target> {
    use Bound::*;
    let t = |baseline, bound| Target {
        contender: "fastcp",
        baseline,
        bound,
    };
    let pull = |baseline, bound| Target {
        contender: "fastcp pull",
        baseline,
        bound,
    };
    match (mode, set) {
        (Mode::Local, DataSet::Big) => vec![t("cp -a", TimeAtMost(1.5))],
        (Mode::Local, _) => vec![t("tar | tar", TimeAtMost(1.0))],
        (Mode::Ssh, DataSet::Big) => vec![
            t("scp", TimeAtMost(0.8)),
            Target {
                contender: "fastcp system-ssh",
                baseline: "scp",
                bound: TimeAtMost(0.8),
            },
        ],
        (Mode::Ssh, _) => vec![
            t("tar | ssh", TimeAtMost(0.7)),
            pull("tar | ssh pull", TimeAtMost(0.7)),
        ],
        (Mode::Tcp, DataSet::Big) => vec![t("scp", TimeAtMost(0.35)), t("nc", TimeAtMost(1.0))],
        (Mode::Tcp, _) => vec![
            t("tar | ssh", TimeAtMost(0.5)),
            t("fastcp local", TimeAtMost(1.3)),
            pull("fastcp local", TimeAtMost(1.3)),
        ],
        (Mode::Sftp, DataSet::Big) => {
            vec![t("scp", TimeAtMost(0.8)), pull("scp pull", TimeAtMost(0.8))]
        }
        (Mode::Sftp, _) => vec![t("scp", TimeAtMost(0.3)), pull("scp pull", TimeAtMost(0.3))],
        (Mode::Streams | Mode::Files, _) => Vec::new(),
        // The nightly backup's: a no-change rerun takes at most half of rsync's and a tenth
        // of a full copy.
        (Mode::Rerun, _) => {
            const RERUNS: [(&str, &str, &str); 4] = [
                ("fastcp tcp push", "rsync push", "fastcp full tcp push"),
                ("fastcp tcp pull", "rsync pull", "fastcp full tcp pull"),
                ("fastcp ssh push", "rsync push", "fastcp full tcp push"),
                ("fastcp ssh pull", "rsync pull", "fastcp full tcp pull"),
            ];
            RERUNS
                .into_iter()
                .flat_map(|(contender, rsync, full)| {
                    [
                        Target {
                            contender,
                            baseline: rsync,
                            bound: TimeAtMost(0.5),
                        },
                        Target {
                            contender,
                            baseline: full,
                            bound: TimeAtMost(0.1),
                        },
                    ]
                })
                .collect()
        }
        // "fastcp's TCP transport, with several streams": the default count and more.
        (Mode::Wan, _) => ["fastcp tcp -j 4", "fastcp tcp -j 8"]
            .into_iter()
            .map(|contender| Target {
                contender,
                baseline: "scp",
                bound: SpeedAtLeast(3.0),
            })
            .collect(),
    }
}

/// Median of the timed runs (mean of the middle two for an even count).
pub fn median(times: &[Duration]) -> Option<Duration> {
    let mut v = times.to_vec();
    v.sort_unstable();
    match v.len() {
        0 => None,
        n if n % 2 == 1 => Some(v[n / 2]),
        n => Some((v[n / 2 - 1] + v[n / 2]) / 2),
    }
}

fn first_line(program: &str, args: &[&str]) -> String {
    match Command::new(program).args(args).output() {
        Ok(out) => {
            let text = if out.stdout.is_empty() {
                out.stderr
            } else {
                out.stdout
            };
            let text = String::from_utf8_lossy(&text);
            text.lines()
                .next()
                .unwrap_or("")
                .split_whitespace()
                .collect::<Vec<_>>()
                .join(" ")
        }
        Err(_) => format!("{program}: not found"),
    }
}

fn machine() -> String {
    let lscpu = Command::new("lscpu")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned());
    let field = |name: &str| {
        lscpu.as_ref().ok().and_then(|t| {
            t.lines()
                .find_map(|l| l.strip_prefix(name).map(|m| m.trim().to_owned()))
        })
    };
    let model = field("Model name:").unwrap_or_else(|| "unknown CPU".into());
    let family = match (field("CPU family:"), field("Model:")) {
        (Some(f), Some(m)) => format!(" (family {f}, model {m})"),
        _ => String::new(),
    };
    // The flags that decide fastcp's cipher provider and BLAKE3's code path.
    let flags = field("Flags:").unwrap_or_default();
    let wanted = ["aes", "vaes", "vpclmulqdq", "avx2", "avx512f"];
    let have: Vec<&str> = wanted
        .into_iter()
        .filter(|w| flags.split_whitespace().any(|f| f == *w))
        .collect();
    let missing: Vec<&str> = wanted.into_iter().filter(|w| !have.contains(w)).collect();
    let cpu_flags = if missing.is_empty() {
        format!("; {}", have.join(" "))
    } else {
        format!("; {}; no {}", have.join(" "), missing.join(", no "))
    };
    let cores = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(0);
    let mem_kib: u64 = fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|t| {
            t.lines()
                .find_map(|l| l.strip_prefix("MemTotal:"))
                .and_then(|v| v.split_whitespace().next().and_then(|n| n.parse().ok()))
        })
        .unwrap_or(0);
    format!(
        "{model}{family}{cpu_flags}, {cores} cores, {:.1} GiB RAM, Linux {}",
        mem_kib as f64 / (1 << 20) as f64,
        first_line("uname", &["-r"])
    )
}

fn fastcp_rev(repo: &Path) -> String {
    let rev = Command::new("git")
        .arg("-C")
        .arg(repo)
        .args(["rev-parse", "--short=12", "HEAD"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_default();
    let dirty = Command::new("git")
        .arg("-C")
        .arg(repo)
        // BENCHMARKS.md itself does not count: an earlier bench of the same run writes it.
        .args([
            "status",
            "--porcelain",
            "--untracked-files=no",
            "--",
            ".",
            ":!BENCHMARKS.md",
        ])
        .output()
        .map(|o| !o.stdout.is_empty())
        .unwrap_or(false);
    if rev.is_empty() {
        "unknown revision".into()
    } else if dirty {
        format!("{rev} (with uncommitted changes in the work tree)")
    } else {
        rev
    }
}

impl Report {
    /// Gathers the environment and wraps the results.
    pub fn new(
        opts: &BenchOptions,
        root: &Path,
        load: String,
        notes: Vec<String>,
        results: Vec<DataResult>,
    ) -> Report {
        let mut versions = vec![
            match &opts.fastcp {
                // Its commit is not known here: the one given may be built from any.
                Some(bin) => format!(
                    "fastcp {} (given with --fastcp; the repository is at {})",
                    bin.display(),
                    fastcp_rev(&opts.repo)
                ),
                None => format!("fastcp {}", fastcp_rev(&opts.repo)),
            },
            first_line("ssh", &["-V"]),
            first_line("rsync", &["--version"]),
        ];
        // The reruns run no tar.
        if opts.mode != crate::bench::Mode::Rerun {
            versions.push(first_line("tar", &["--version"]));
        }
        let versions = versions.join("; ");
        Report {
            mode: opts.mode,
            section: opts.section(),
            runs: opts.runs,
            command_line: opts.command_line.clone(),
            date: first_line("date", &["-u", "+%Y-%m-%d %H:%M UTC"]),
            machine: machine(),
            versions,
            root: root.display().to_string(),
            fs_type: crate::bench::fs_type(root).unwrap_or_else(|| "unknown".into()),
            load,
            notes,
            results,
        }
    }

    /// Renders the `## bench <mode>` section.
    pub fn markdown(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(s, "## {}\n", self.section);
        let _ = writeln!(s, "`{}`, run on {}.\n", self.command_line, self.date);
        let _ = writeln!(s, "- Machine: {}.", self.machine);
        let _ = writeln!(s, "- Versions: {}.", self.versions);
        let _ = writeln!(
            s,
            "- Data and copies on {} ({}); load average (1/5/15 min) {}.",
            self.root, self.fs_type, self.load
        );
        if self.mode == Mode::Rerun {
            let _ = writeln!(
                s,
                "- Method: one warm-up run per contender, then {} timed runs each, contenders \
                 alternated within every round in the order of the table. A rerun's warm-up \
                 seeds its destination (fastcp's TCP and SSH reruns share one per direction); \
                 every timed run reruns into it with nothing changed, and it is checked against \
                 the source (paths, types, sizes, symlink targets, bytes) after the seeding and \
                 after the last round. Before the rounds each fastcp rerun ran once with \
                 `--json` and reported every file skipped and 0 bytes sent. A full copy goes \
                 into an empty destination every run, checked and deleted after the clock stops. \
                 Times are wall clock around the whole command; \"vs rsync\" is a median over \
                 rsync's rerun of the same direction, \"of full copy\" over fastcp's full TCP \
                 copy of the same direction.",
                self.runs
            );
        } else {
            let _ = writeln!(
                s,
                "- Method: one warm-up run per contender, then {} timed runs each, contenders \
                 alternated within every round; the destination is deleted before each run (not \
                 timed); every output is checked against the source (paths, types, sizes, \
                 symlink targets, bytes) after the clock stops. Times are wall clock around the \
                 whole command.",
                self.runs
            );
        }
        if self.mode != Mode::Local {
            let _ = writeln!(
                s,
                "- Transport: OpenSSH sshd on 127.0.0.1 started by the harness (temp host key, \
                 client key and known_hosts; `$CFG` below is its temp ssh_config, host alias `{}`).",
                crate::sshd::ALIAS
            );
        }
        for note in &self.notes {
            let _ = writeln!(s, "- {note}.");
        }
        for r in &self.results {
            s.push('\n');
            self.table(&mut s, r);
        }
        s
    }

    fn table(&self, s: &mut String, r: &DataResult) {
        let set = r.data.set;
        let _ = writeln!(s, "### {}\n", r.data.description);
        if self.mode == Mode::Rerun {
            rerun_table(s, r);
        } else {
            self.ratio_table(s, r);
        }
        let base_median = |name: &str| -> Option<Duration> {
            r.contenders
                .iter()
                .find(|(c, _)| c.name == name)
                .and_then(|(_, o)| median(&o.times))
        };
        // The WAN's targets are for its default RTT; other RTTs are measured for the plot.
        let targets = if self.mode == Mode::Wan && self.section != "bench wan" {
            Vec::new()
        } else {
            targets(self.mode, set)
        };
        for t in targets {
            let (name, base) = (t.contender, t.baseline);
            let want = match t.bound {
                Bound::TimeAtMost(x) => format!("{name} ≤ {x:.2}x `{base}`"),
                Bound::SpeedAtLeast(x) => {
                    format!("`{name}` at least {x}x the throughput of `{base}`")
                }
            };
            let Some((_, outcome)) = r.contenders.iter().find(|(c, _)| c.name == name) else {
                let _ = writeln!(s, "- Target {want}: not measured ({name} was not run).");
                continue;
            };
            let verdict = match (median(&outcome.times), base_median(base)) {
                (Some(f), Some(b)) => {
                    let ratio = f.as_secs_f64() / b.as_secs_f64();
                    let (met, shown) = match t.bound {
                        Bound::TimeAtMost(x) => (ratio <= x, ratio),
                        Bound::SpeedAtLeast(x) => (1.0 / ratio >= x, 1.0 / ratio),
                    };
                    format!("{} ({shown:.2}x)", if met { "met" } else { "**not met**" })
                }
                (None, _) => format!("not measured ({name} did not complete)"),
                (_, None) => "not measured (the baseline did not complete)".into(),
            };
            let _ = writeln!(s, "- Target {want}: {verdict}.");
        }
        let _ = writeln!(s, "\nCommands (run with `bash -c`, `set -o pipefail`):\n");
        for (c, _) in &r.contenders {
            if let Some(l) = &c.listener {
                let _ = writeln!(
                    s,
                    "- {}: `{l} &` (untimed until it listens), then `{}`",
                    c.name, c.command
                );
            } else {
                let _ = writeln!(s, "- {}: `{}`", c.name, c.command);
            }
        }
    }

    /// The table of most benchmarks: median, min, max, throughput, then the median over each
    /// baseline's.
    fn ratio_table(&self, s: &mut String, r: &DataResult) {
        let set = r.data.set;
        let bases = baselines(self.mode, set);
        let base_median = |name: &str| -> Option<Duration> {
            r.contenders
                .iter()
                .find(|(c, _)| c.name == name)
                .and_then(|(_, o)| median(&o.times))
        };
        // Over the WAN, link rates are decimal and speed-ups read better than time ratios.
        let wan = self.mode == Mode::Wan;
        let (unit, unit_bytes) = if wan {
            ("MB/s", 1e6)
        } else {
            ("MiB/s", (1 << 20) as f64)
        };
        let mut header = format!("| contender | median | min | max | {unit} |");
        let mut rule = "|---|---:|---:|---:|---:|".to_owned();
        for b in bases {
            let b = b.replace('|', "\\|");
            if wan {
                let _ = write!(header, " speed vs {b} |");
            } else {
                let _ = write!(header, " vs {b} |");
            }
            rule.push_str("---:|");
        }
        header.push_str(" result |");
        rule.push_str("---|");
        let _ = writeln!(s, "{header}\n{rule}");
        for (c, o) in &r.contenders {
            let m = median(&o.times);
            let secs = |d: Option<Duration>| {
                d.map_or("—".to_owned(), |d| format!("{:.2} s", d.as_secs_f64()))
            };
            let rate = m.map_or("—".to_owned(), |d| {
                format!("{:.0}", r.data.bytes as f64 / unit_bytes / d.as_secs_f64())
            });
            let _ = write!(
                s,
                "| {} | {} | {} | {} | {} |",
                c.name.replace('|', "\\|"),
                secs(m),
                secs(o.times.iter().min().copied()),
                secs(o.times.iter().max().copied()),
                rate
            );
            for b in bases {
                let ratio = match (m, base_median(b)) {
                    (Some(m), Some(bm)) if wan => {
                        format!("{:.2}x", bm.as_secs_f64() / m.as_secs_f64())
                    }
                    (Some(m), Some(bm)) => format!("{:.2}x", m.as_secs_f64() / bm.as_secs_f64()),
                    _ => "—".into(),
                };
                let _ = write!(s, " {ratio} |");
            }
            let _ = writeln!(s, " {} |", result_text(o));
        }
        s.push('\n');
    }
}

/// `bench rerun`'s table: every run in order, the median, and the median over rsync's rerun
/// and over fastcp's full copy of the same direction.
fn rerun_table(s: &mut String, r: &DataResult) {
    let base_median = |name: &str| -> Option<Duration> {
        r.contenders
            .iter()
            .find(|(c, _)| c.name == name)
            .and_then(|(_, o)| median(&o.times))
    };
    let _ = writeln!(
        s,
        "| contender | runs (s) | median | vs rsync | of full copy | result |\n\
         |---|---|---:|---:|---:|---|"
    );
    for (c, o) in &r.contenders {
        let m = median(&o.times);
        let runs: Vec<String> = o
            .times
            .iter()
            .map(|t| format!("{:.3}", t.as_secs_f64()))
            .collect();
        let ratio = |base: Option<&String>| match (m, base.and_then(|b| base_median(b))) {
            (Some(m), Some(b)) => format!("{:.2}x", m.as_secs_f64() / b.as_secs_f64()),
            _ => "—".into(),
        };
        let bases = crate::rerun::baselines(&c.name);
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {} | {} |",
            c.name,
            if runs.is_empty() {
                "—".to_owned()
            } else {
                runs.join(", ")
            },
            m.map_or("—".to_owned(), |d| format!("{:.3} s", d.as_secs_f64())),
            ratio(bases.as_ref().map(|b| &b[0])),
            ratio(bases.as_ref().map(|b| &b[1])),
            result_text(o)
        );
    }
    s.push('\n');
}

/// Where a benchmark's timed runs are kept for `cargo xtask plot`:
/// `docs/bench/bench-tcp.tsv`, `docs/bench/bench-wan-10ms.tsv`.
pub fn results_path(repo: &Path, section: &str) -> PathBuf {
    repo.join("docs/bench")
        .join(format!("{}.tsv", section.replace(' ', "-")))
}

/// The columns of a results file, after its `# key value` header lines.
pub const RESULT_COLUMNS: &str = "set\tbytes\tfiles\tcontender\trun\tseconds";

impl Report {
    /// Writes every timed run, one per line, with the machine and versions in `# key value`
    /// header lines (`params` adds more, such as the WAN's RTT).
    pub fn write_results(&self, path: &Path, params: &[(&str, String)]) -> Result<()> {
        let mut s = String::new();
        let _ = writeln!(s, "# benchmark {}", self.mode.name());
        for (k, v) in params {
            let _ = writeln!(s, "# {k} {v}");
        }
        let _ = writeln!(s, "# date {}", self.date);
        let _ = writeln!(s, "# machine {}", self.machine);
        let _ = writeln!(s, "# versions {}", self.versions);
        let _ = writeln!(s, "# command {}", self.command_line);
        let _ = writeln!(s, "{RESULT_COLUMNS}");
        for r in &self.results {
            let files = if r.data.set.is_tree() {
                r.data.manifest.count(&crate::verify::Kind::File)
            } else {
                1
            };
            for (c, o) in &r.contenders {
                for (i, t) in o.times.iter().enumerate() {
                    let _ = writeln!(
                        s,
                        "{}\t{}\t{files}\t{}\t{}\t{:.4}",
                        r.data.set.label(),
                        r.data.bytes,
                        c.name,
                        i + 1,
                        t.as_secs_f64()
                    );
                }
            }
        }
        if let Some(dir) = path.parent() {
            fs::create_dir_all(dir)?;
        }
        fs::write(path, s).with_context(|| format!("writing {}", path.display()))
    }
}

fn result_text(o: &Outcome) -> String {
    let text = match &o.failure {
        None if o.times.len() == 1 => "ok (1 run)".to_owned(),
        None => format!("ok ({} runs)", o.times.len()),
        Some(why) => {
            let mut why: String = why.chars().take(200).collect();
            if why.len() < o.failure.as_ref().unwrap().len() {
                why.push('…');
            }
            if o.times.is_empty() {
                format!("**failed**: {why}")
            } else {
                format!("**failed** after {} good runs: {why}", o.times.len())
            }
        }
    };
    text.replace('|', "\\|")
        .replace('`', "'")
        .replace('\n', " ")
}

/// Replaces the section that starts with the line `heading` (up to the next `## ` heading) with
/// `section`, or appends `section` if there is none.
pub fn replace_section(doc: &str, heading: &str, section: &str) -> String {
    let section = format!("{}\n", section.trim_end());
    let lines: Vec<&str> = doc.split_inclusive('\n').collect();
    let start = lines.iter().position(|l| l.trim_end() == heading);
    match start {
        Some(start) => {
            let end = lines[start + 1..]
                .iter()
                .position(|l| l.starts_with("## ") || l.starts_with("# "))
                .map_or(lines.len(), |i| start + 1 + i);
            let mut out: String = lines[..start].concat();
            out.push_str(&section);
            if end < lines.len() {
                out.push('\n');
                out.push_str(&lines[end..].concat());
            }
            out
        }
        None => {
            let mut out = doc.trim_end().to_owned();
            if !out.is_empty() {
                out.push_str("\n\n");
            }
            out.push_str(&section);
            out
        }
    }
}

/// Replaces (or appends) `heading`'s section of the Markdown file at `path`.
pub fn write_section(path: &Path, heading: &str, section: &str) -> Result<()> {
    let doc = match fs::read_to_string(path) {
        Ok(d) => d,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => "# Benchmarks\n".to_owned(),
        Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
    };
    let new = replace_section(&doc, heading, section);
    let tmp = path.with_extension("md.partial");
    fs::write(&tmp, new).with_context(|| format!("writing {}", tmp.display()))?;
    fs::rename(&tmp, path).with_context(|| format!("renaming into {}", path.display()))?;
    Ok(())
}

/// `2 GiB`, `1.42 GiB`, `300 MiB`, `12 KiB`, `17 B`.
pub fn human_size(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut unit = 0;
    let mut v = bytes as f64;
    while v >= 1024.0 && unit < UNITS.len() - 1 {
        v /= 1024.0;
        unit += 1;
    }
    if v.fract() == 0.0 {
        format!("{v} {}", UNITS[unit])
    } else {
        format!("{v:.2} {}", UNITS[unit])
    }
}

/// `1234567` as `1,234,567`.
pub fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, ch) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(ch);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replaces_only_its_own_section() {
        let doc = "# Benchmarks\n\nintro\n\n## bench local\n\nold local\n### sub\nold\n\n## bench ssh\n\nssh stays\n";
        let new = replace_section(doc, "## bench local", "## bench local\n\nnew local\n");
        assert_eq!(
            new,
            "# Benchmarks\n\nintro\n\n## bench local\n\nnew local\n\n## bench ssh\n\nssh stays\n"
        );
        let new = replace_section(doc, "## bench ssh", "## bench ssh\n\nnew ssh");
        assert_eq!(
            new,
            "# Benchmarks\n\nintro\n\n## bench local\n\nold local\n### sub\nold\n\n## bench ssh\n\nnew ssh\n"
        );
        let new = replace_section(doc, "## bench tcp", "## bench tcp\n\ntcp");
        assert!(new.starts_with(doc.trim_end()));
        assert!(new.ends_with("ssh stays\n\n## bench tcp\n\ntcp\n"));
        // A heading that merely starts the same way is not ours.
        let doc2 = "## bench local extra\n\nkeep\n";
        assert!(replace_section(doc2, "## bench local", "## bench local\n\nx").contains("keep"));
    }

    #[test]
    fn rerun_rows_compare_with_their_own_direction() {
        use crate::bench::{Contender, Data};
        let ms = Duration::from_millis;
        let row = |name: &str, times: &[u64]| {
            (
                Contender::new(name, String::new()),
                Outcome {
                    times: times.iter().map(|&t| ms(t)).collect(),
                    ..Outcome::default()
                },
            )
        };
        let r = DataResult {
            data: Data {
                set: DataSet::Tree,
                src: PathBuf::from("/tree"),
                manifest: crate::verify::Manifest::default(),
                bytes: 0,
                description: "tree".into(),
            },
            contenders: vec![
                row("ssh true", &[300, 250, 280]),
                row("rsync push", &[1000, 800, 900]),
                row("rsync pull", &[2000]),
                row("fastcp full tcp push", &[4000, 5000]),
                row("fastcp full tcp pull", &[]),
                row("fastcp tcp push", &[450, 400, 500]),
                row("fastcp ssh pull", &[500]),
            ],
        };
        let mut s = String::new();
        rerun_table(&mut s, &r);
        let line = |name: &str| {
            s.lines()
                .find(|l| l.starts_with(&format!("| {name} |")))
                .unwrap()
                .to_owned()
        };
        assert_eq!(
            line("fastcp tcp push"),
            "| fastcp tcp push | 0.450, 0.400, 0.500 | 0.450 s | 0.50x | 0.10x | ok (3 runs) |"
        );
        // The pull's full copy did not run: no share of it.
        assert_eq!(
            line("fastcp ssh pull"),
            "| fastcp ssh pull | 0.500 | 0.500 s | 0.25x | — | ok (1 run) |"
        );
        assert_eq!(
            line("rsync push"),
            "| rsync push | 1.000, 0.800, 0.900 | 0.900 s | 1.00x | 0.20x | ok (3 runs) |"
        );
        assert_eq!(
            line("ssh true"),
            "| ssh true | 0.300, 0.250, 0.280 | 0.280 s | — | — | ok (3 runs) |"
        );
        assert!(line("fastcp full tcp pull").contains("| — | — | — | — |"));
    }

    #[test]
    fn medians_sizes_and_numbers() {
        let s = Duration::from_secs;
        assert_eq!(median(&[s(3), s(1), s(2)]), Some(s(2)));
        assert_eq!(
            median(&[s(4), s(1), s(2), s(3)]),
            Some(Duration::from_millis(2500))
        );
        assert_eq!(median(&[]), None);
        assert_eq!(human_size(2 << 30), "2 GiB");
        assert_eq!(human_size(1_500_000_000), "1.40 GiB");
        assert_eq!(thousands(78_579), "78,579");
        assert_eq!(thousands(999), "999");
        assert_eq!(thousands(1_000_000), "1,000,000");
    }
}
