//! `cargo xtask plot`: PNG plots, drawn with plotters, of the results files that
//! `cargo xtask bench ... --write` keeps in `docs/bench/` (every timed run, with the machine
//! and the versions), and the "## Plots" section of BENCHMARKS.md that shows them.
//!
//! - `throughput.png`: the big file's throughput per tool, in each benchmark;
//! - `tree.png`: the kernel-shaped tree's time per tool, in each benchmark;
//! - `streams.png`: throughput with 1 to 16 streams (`bench streams`);
//! - `files.png`: time against file count, 1 to 1,000,000 files (`bench files`);
//! - `wan.png`: throughput through the WAN relay against its RTT (`bench wan --rtt ...`).
//!
//! Every figure is a median of the timed runs in the results files; nothing is typed in.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, anyhow, bail};
use plotters::coord::ranged1d::SegmentValue;
use plotters::prelude::*;

use crate::report::{self, RESULT_COLUMNS};

/// The benchmarks whose big file and tree go into `throughput.png` and `tree.png`.
const COMPARED: [&str; 4] = ["local", "ssh", "tcp", "sftp"];

/// Fonts tried, in order, for the plots' text (Debian: `fonts-dejavu-core`).
pub const FONTS: [&str; 3] = [
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/TTF/DejaVuSans.ttf",
];

/// One results file: its `# key value` header lines and its timed runs.
#[derive(Debug)]
pub struct Results {
    /// The file's name, such as `bench-tcp.tsv`.
    pub file: String,
    /// `benchmark`, `machine`, `versions`, `date`, `command`, `rtt_ms` ...
    pub header: BTreeMap<String, String>,
    /// The timed runs, in file order.
    pub runs: Vec<Run>,
}

/// One timed run.
#[derive(Clone, Debug, PartialEq)]
pub struct Run {
    /// The data set: `big`, `tree`, `files-N`.
    pub set: String,
    /// Bytes of file data in the data set.
    pub bytes: u64,
    /// Files in the data set.
    pub files: u64,
    /// The contender's name.
    pub contender: String,
    /// Wall-clock seconds.
    pub seconds: f64,
}

impl Results {
    /// Parses a results file's text.
    pub fn parse(file: &str, text: &str) -> Result<Results> {
        let mut header = BTreeMap::new();
        let mut runs = Vec::new();
        let mut columns_seen = false;
        for (i, line) in text.lines().enumerate() {
            let at = || format!("{file}:{}", i + 1);
            if let Some(kv) = line.strip_prefix("# ") {
                let (k, v) = kv.split_once(' ').unwrap_or((kv, ""));
                header.insert(k.to_owned(), v.to_owned());
            } else if line == RESULT_COLUMNS {
                columns_seen = true;
            } else if !line.is_empty() {
                if !columns_seen {
                    bail!("{}: a run before the column names", at());
                }
                let f: Vec<&str> = line.split('\t').collect();
                let [set, bytes, files, contender, _run, seconds] = f[..] else {
                    bail!("{}: expected 6 tab-separated fields", at());
                };
                let num = |v: &str| v.parse::<f64>().with_context(at);
                runs.push(Run {
                    set: set.to_owned(),
                    bytes: bytes.parse().with_context(at)?,
                    files: files.parse().with_context(at)?,
                    contender: contender.to_owned(),
                    seconds: num(seconds)?,
                });
            }
        }
        if !columns_seen {
            bail!("{file}: no column line ({RESULT_COLUMNS:?})");
        }
        Ok(Results {
            file: file.to_owned(),
            header,
            runs,
        })
    }

    /// The benchmark's name (`tcp`, `wan` ...).
    pub fn benchmark(&self) -> &str {
        self.header.get("benchmark").map_or("", String::as_str)
    }

    /// The median of each (data set, contender), in the order they first appear.
    pub fn medians(&self) -> Vec<Run> {
        let mut groups: Vec<(Run, Vec<f64>)> = Vec::new();
        for r in &self.runs {
            match groups
                .iter_mut()
                .find(|(g, _)| g.set == r.set && g.contender == r.contender)
            {
                Some((_, times)) => times.push(r.seconds),
                None => groups.push((r.clone(), vec![r.seconds])),
            }
        }
        groups
            .into_iter()
            .map(|(mut run, mut times)| {
                times.sort_by(f64::total_cmp);
                let n = times.len();
                run.seconds = if n % 2 == 1 {
                    times[n / 2]
                } else {
                    (times[n / 2 - 1] + times[n / 2]) / 2.0
                };
                run
            })
            .collect()
    }
}

/// Reads every `*.tsv` results file in `dir`, by name.
pub fn load(dir: &Path) -> Result<Vec<Results>> {
    let mut paths: Vec<PathBuf> = match fs::read_dir(dir) {
        Ok(entries) => entries
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|e| e == "tsv"))
            .collect(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
        Err(e) => return Err(e).with_context(|| format!("reading {}", dir.display())),
    };
    paths.sort();
    paths
        .iter()
        .map(|p| {
            let text = fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?;
            Results::parse(&p.file_name().unwrap().to_string_lossy(), &text)
        })
        .collect()
}

/// A series of a line plot: its name and its (x, y) points.
type Series = (String, Vec<(f64, f64)>);

/// What each plot shows, from the results: bars are (label, value), lines are series.
#[derive(Debug, Default)]
pub struct Figures {
    /// Big file, MiB/s per `benchmark: contender`.
    pub throughput: Vec<(String, f64)>,
    /// Kernel-shaped tree, seconds per `benchmark: contender`.
    pub tree: Vec<(String, f64)>,
    /// MiB/s against `-j`, per transport.
    pub streams: Vec<Series>,
    /// Seconds against file count, per contender.
    pub files: Vec<Series>,
    /// MB/s against RTT in ms, per contender.
    pub wan: Vec<Series>,
}

/// Adds `(x, y)` to the series called `name`, creating it at the end if new.
fn push_point(series: &mut Vec<Series>, name: &str, x: f64, y: f64) {
    match series.iter_mut().find(|(n, _)| n == name) {
        Some((_, pts)) => pts.push((x, y)),
        None => series.push((name.to_owned(), vec![(x, y)])),
    }
}

impl Figures {
    /// Gathers the medians each plot shows.
    pub fn from_results(all: &[Results]) -> Figures {
        let mut f = Figures::default();
        let mib = |r: &Run| r.bytes as f64 / f64::from(1u32 << 20) / r.seconds;
        for bench in COMPARED {
            for res in all.iter().filter(|r| r.benchmark() == bench) {
                for m in res.medians() {
                    let label = format!("{bench}: {}", m.contender);
                    match m.set.as_str() {
                        "big" => f.throughput.push((label, mib(&m))),
                        "tree" => f.tree.push((label, m.seconds)),
                        _ => {}
                    }
                }
            }
        }
        for res in all {
            for m in res.medians() {
                match res.benchmark() {
                    "streams" => {
                        // "fastcp tcp -j 4": the series is "fastcp tcp", x is 4.
                        if let Some((name, j)) = m.contender.rsplit_once(" -j ")
                            && let Ok(j) = j.parse::<f64>()
                        {
                            push_point(&mut f.streams, name, j, mib(&m));
                        }
                    }
                    "files" => push_point(&mut f.files, &m.contender, m.files as f64, m.seconds),
                    "wan" => {
                        let rtt = res
                            .header
                            .get("rtt_ms")
                            .and_then(|v| v.parse().ok())
                            .unwrap_or(crate::wan::RTT.as_millis() as f64);
                        push_point(
                            &mut f.wan,
                            &m.contender,
                            rtt,
                            m.bytes as f64 / 1e6 / m.seconds,
                        );
                    }
                    _ => {}
                }
            }
        }
        for (_, pts) in f.streams.iter_mut().chain(&mut f.files).chain(&mut f.wan) {
            pts.sort_by(|a, b| a.0.total_cmp(&b.0));
        }
        f
    }
}

/// Draws every plot that has data into `repo/docs/bench/` and writes BENCHMARKS.md's
/// "## Plots" section.
pub fn run(repo: &Path) -> Result<()> {
    let dir = repo.join("docs/bench");
    let all = load(&dir)?;
    if all.is_empty() {
        bail!(
            "no results files in {}: run `cargo xtask bench ... --write` first",
            dir.display()
        );
    }
    register_font()?;
    let f = Figures::from_results(&all);
    let mut shown: Vec<(&str, String)> = Vec::new();
    if !f.throughput.is_empty() {
        bars(
            &dir.join("throughput.png"),
            "2 GiB file: throughput (median)",
            "MiB/s",
            &f.throughput,
        )?;
        shown.push((
            "throughput.png",
            "The big file's throughput per tool (bench local, ssh, tcp and sftp; pushes unless \
             named pull)"
                .into(),
        ));
    }
    if !f.tree.is_empty() {
        bars(
            &dir.join("tree.png"),
            "Kernel-shaped tree: time (median, lower is better)",
            "seconds",
            &f.tree,
        )?;
        shown.push((
            "tree.png",
            "The kernel-shaped tree's time per tool (bench local, ssh, tcp and sftp)".into(),
        ));
    }
    let line_plots = [
        (
            "streams.png",
            "Big file: scaling with streams (-j)",
            ("streams", Axis::Log2),
            ("MiB/s", Axis::Linear),
            &f.streams,
            "Throughput of the big file with 1 to 16 streams (bench streams)",
        ),
        (
            "files.png",
            "Scaling with file count (lower is better)",
            ("files", Axis::Log10),
            ("seconds", Axis::Log10),
            &f.files,
            "Time to copy a tree of N small files, N from 1 to 1,000,000 (bench files)",
        ),
        (
            "wan.png",
            "Through the WAN relay (1 Gbit/s): throughput against RTT",
            ("RTT, ms", Axis::Linear),
            ("MB/s", Axis::Linear),
            &f.wan,
            "Throughput through the emulated WAN link at each RTT (bench wan --rtt)",
        ),
    ];
    for (png, title, x, y, series, caption) in line_plots {
        if !series.is_empty() {
            lines(&dir.join(png), title, x, y, series)?;
            shown.push((png, caption.into()));
        }
    }

    let mut s = String::from("## Plots\n\n");
    let _ = writeln!(
        s,
        "Drawn by `cargo xtask plot` from the results files in docs/bench/, which \
         `cargo xtask bench ... --write` keeps (every timed run, with its machine and versions); \
         `cargo xtask bench all --write` runs every benchmark and then draws these. Each point \
         or bar is the median of a benchmark's timed runs, from the run recorded in its section \
         below.\n"
    );
    for (png, caption) in &shown {
        let _ = writeln!(s, "![{caption}](docs/bench/{png})\n\n*{caption}.*\n");
    }
    let _ = writeln!(s, "Results files:\n");
    for r in &all {
        let _ = writeln!(
            s,
            "- `docs/bench/{}`: {} runs, {}; {}.",
            r.file,
            r.runs.len(),
            r.header.get("date").map_or("undated", String::as_str),
            r.header
                .get("machine")
                .map_or("unknown machine", String::as_str)
        );
    }
    let path = repo.join("BENCHMARKS.md");
    report::write_section(&path, "## Plots", &s)?;
    eprintln!(
        "drew {} plots in {}; updated \"## Plots\" in {}",
        shown.len(),
        dir.display(),
        path.display()
    );
    Ok(())
}

/// Registers the first font found in [`FONTS`] as plotters' "sans-serif".
fn register_font() -> Result<()> {
    let path = FONTS
        .iter()
        .find(|p| Path::new(p).exists())
        .ok_or_else(|| {
            anyhow!(
                "no font for the plots' text: install DejaVu Sans (`apt-get install \
                 fonts-dejavu-core`); looked for {}",
                FONTS.join(", ")
            )
        })?;
    let bytes = fs::read(path).with_context(|| format!("reading {path}"))?;
    // plotters keeps fonts for the life of the program.
    plotters::style::register_font("sans-serif", FontStyle::Normal, Vec::leak(bytes))
        .map_err(|_| anyhow!("{path} is not a font plotters can read"))?;
    Ok(())
}

/// fastcp's bars and lines stand out; the peers' are grey or from the palette.
fn is_fastcp(label: &str) -> bool {
    label
        .rsplit(": ")
        .next()
        .is_some_and(|c| c.starts_with("fastcp"))
}

/// A horizontal bar chart, one bar per `(label, value)`, the value written beside it.
fn bars(path: &Path, title: &str, unit: &str, bars: &[(String, f64)]) -> Result<()> {
    let n = bars.len();
    let max = bars.iter().map(|b| b.1).fold(0.0, f64::max).max(1e-9) * 1.18;
    let height = 90 + 26 * u32::try_from(n)?;
    let root = BitMapBackend::new(path, (1100, height)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 22))
        .margin(14)
        .x_label_area_size(40)
        .y_label_area_size(290)
        .build_cartesian_2d(0.0..max, (0..n).into_segmented())?;
    let label_of = |v: &SegmentValue<usize>| match v {
        SegmentValue::CenterOf(i) | SegmentValue::Exact(i) => {
            bars.get(*i).map(|b| b.0.clone()).unwrap_or_default()
        }
        SegmentValue::Last => String::new(),
    };
    chart
        .configure_mesh()
        .disable_y_mesh()
        .y_labels(n)
        .y_label_formatter(&label_of)
        .x_label_formatter(&|v| format!("{v}"))
        .x_desc(unit)
        .label_style(("sans-serif", 14))
        .draw()?;
    chart.draw_series(bars.iter().enumerate().map(|(i, (label, v))| {
        let color = if is_fastcp(label) {
            RGBColor(31, 119, 180)
        } else {
            RGBColor(150, 150, 150)
        };
        let mut bar = Rectangle::new(
            [
                (0.0, SegmentValue::Exact(i)),
                (*v, SegmentValue::Exact(i + 1)),
            ],
            color.filled(),
        );
        bar.set_margin(3, 3, 0, 0);
        bar
    }))?;
    chart.draw_series(bars.iter().enumerate().map(|(i, (_, v))| {
        let text = if *v >= 10.0 {
            format!(" {v:.0}")
        } else {
            format!(" {v:.2}")
        };
        Text::new(
            text,
            (*v, SegmentValue::CenterOf(i)),
            ("sans-serif", 13).into_font().color(&BLACK),
        )
    }))?;
    root.present()?;
    Ok(())
}

/// How an axis maps its values.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Axis {
    Linear,
    /// Powers of two evenly spaced (streams).
    Log2,
    /// Powers of ten evenly spaced (file counts, times).
    Log10,
}

impl Axis {
    fn map(self, v: f64) -> f64 {
        match self {
            Axis::Linear => v,
            Axis::Log2 => v.max(1e-12).log2(),
            Axis::Log10 => v.max(1e-12).log10(),
        }
    }

    /// The label of the mapped value `v`: blank between powers on a log axis.
    fn label(self, v: f64) -> String {
        let power = |base: f64| {
            let r = v.round();
            if (v - r).abs() > 1e-6 {
                return String::new();
            }
            let x = base.powf(r);
            if x >= 1e6 {
                format!("{}M", x / 1e6)
            } else if x >= 1e3 {
                format!("{}k", x / 1e3)
            } else if x >= 1.0 {
                format!("{x}")
            } else {
                format!("{x:.2}")
            }
        };
        match self {
            Axis::Linear => format!("{v}"),
            Axis::Log2 => power(2.0),
            Axis::Log10 => power(10.0),
        }
    }
}

/// A line chart of `series`, with points marked and a legend.
fn lines(
    path: &Path,
    title: &str,
    (x_desc, x_axis): (&str, Axis),
    (y_desc, y_axis): (&str, Axis),
    series: &[Series],
) -> Result<()> {
    let pts = || series.iter().flat_map(|(_, p)| p.iter());
    let range = |axis: Axis, get: fn(&(f64, f64)) -> f64| {
        let (lo, hi) = pts()
            .map(|p| axis.map(get(p)))
            .fold((f64::MAX, f64::MIN), |(lo, hi), v| (lo.min(v), hi.max(v)));
        match axis {
            // From zero, with room above for the legend.
            Axis::Linear => 0.0..(hi * 1.25).max(1e-9),
            _ => (lo.floor() - 0.05)..(hi.ceil() + 0.05).max(lo.floor() + 1.0),
        }
    };
    let xr = range(x_axis, |p| p.0);
    let yr = range(y_axis, |p| p.1);
    let root = BitMapBackend::new(path, (1000, 620)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 22))
        .margin(14)
        .x_label_area_size(45)
        .y_label_area_size(70)
        .build_cartesian_2d(xr, yr)?;
    let fx = move |v: &f64| x_axis.label(*v);
    let fy = move |v: &f64| y_axis.label(*v);
    chart
        .configure_mesh()
        .x_desc(x_desc)
        .y_desc(y_desc)
        .x_labels(12)
        .y_labels(10)
        .x_label_formatter(&fx)
        .y_label_formatter(&fy)
        .label_style(("sans-serif", 14))
        .draw()?;
    for (i, (name, points)) in series.iter().enumerate() {
        let color = if series.len() <= 10 {
            Palette99::pick(i).to_rgba()
        } else {
            Palette99::pick(i * 3).to_rgba()
        };
        let mapped: Vec<(f64, f64)> = points
            .iter()
            .map(|&(x, y)| (x_axis.map(x), y_axis.map(y)))
            .collect();
        let width = if name.starts_with("fastcp") { 3 } else { 2 };
        chart
            .draw_series(LineSeries::new(mapped.clone(), color.stroke_width(width)))?
            .label(name.as_str())
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 22, y)], color.stroke_width(width))
            });
        chart.draw_series(mapped.iter().map(|&p| Circle::new(p, 4, color.filled())))?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .label_font(("sans-serif", 14))
        .draw()?;
    root.present()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(bench: &str, extra: &str, rows: &[&str]) -> Results {
        let text = format!(
            "# benchmark {bench}\n{extra}# machine test box\n{RESULT_COLUMNS}\n{}\n",
            rows.join("\n")
        );
        Results::parse(&format!("bench-{bench}.tsv"), &text).unwrap()
    }

    #[test]
    fn medians_per_set_and_contender() {
        let r = file(
            "tcp",
            "",
            &[
                "big\t1048576\t1\tfastcp\t1\t1.0",
                "big\t1048576\t1\tnc\t1\t2.0",
                "big\t1048576\t1\tfastcp\t2\t3.0",
                "big\t1048576\t1\tfastcp\t3\t2.0",
                "tree\t10\t5\tfastcp\t1\t4.0",
                "tree\t10\t5\tfastcp\t2\t6.0",
            ],
        );
        let m = r.medians();
        let got: Vec<(&str, &str, f64)> = m
            .iter()
            .map(|r| (r.set.as_str(), r.contender.as_str(), r.seconds))
            .collect();
        assert_eq!(
            got,
            [
                ("big", "fastcp", 2.0),
                ("big", "nc", 2.0),
                ("tree", "fastcp", 5.0)
            ]
        );
        assert_eq!(r.header["machine"], "test box");
    }

    #[test]
    fn bad_files_are_refused() {
        assert!(Results::parse("x.tsv", "# benchmark tcp\n").is_err());
        assert!(Results::parse("x.tsv", "big\t1\t1\tfastcp\t1\t1.0\n").is_err());
        let short = format!("{RESULT_COLUMNS}\nbig\t1\t1\tfastcp\t1\n");
        assert!(Results::parse("x.tsv", &short).is_err());
        let nan = format!("{RESULT_COLUMNS}\nbig\tmany\t1\tfastcp\t1\t1.0\n");
        assert!(Results::parse("x.tsv", &nan).is_err());
    }

    #[test]
    fn figures_come_from_the_right_benchmarks() {
        let all = [
            file(
                "tcp",
                "",
                &[
                    "big\t2097152\t1\tfastcp\t1\t1.0",
                    "tree\t10\t3\tfastcp pull\t1\t0.5",
                ],
            ),
            file(
                "streams",
                "",
                &[
                    "big\t1048576\t1\tfastcp tcp -j 4\t1\t0.5",
                    "big\t1048576\t1\tfastcp tcp -j 1\t1\t1.0",
                ],
            ),
            file("files", "", &["files-10\t40960\t10\trsync\t1\t0.3"]),
            file("wan", "# rtt_ms 10\n", &["big\t1000000\t1\tscp\t1\t2.0"]),
        ];
        let f = Figures::from_results(&all);
        assert_eq!(f.throughput, [("tcp: fastcp".to_owned(), 2.0)]);
        assert_eq!(f.tree, [("tcp: fastcp pull".to_owned(), 0.5)]);
        // Sorted by x.
        assert_eq!(
            f.streams,
            [("fastcp tcp".to_owned(), vec![(1.0, 1.0), (4.0, 2.0)])]
        );
        assert_eq!(f.files, [("rsync".to_owned(), vec![(10.0, 0.3)])]);
        assert_eq!(f.wan, [("scp".to_owned(), vec![(10.0, 0.5)])]);
    }

    #[test]
    fn log_axis_labels_only_at_powers() {
        assert_eq!(Axis::Log10.label(6.0), "1M");
        assert_eq!(Axis::Log10.label(4.0), "10k");
        assert_eq!(Axis::Log10.label(0.0), "1");
        assert_eq!(Axis::Log10.label(-1.0), "0.10");
        assert_eq!(Axis::Log10.label(0.5), "");
        assert_eq!(Axis::Log2.label(4.0), "16");
        assert!((Axis::Log2.map(8.0) - 3.0).abs() < 1e-12);
    }

    #[test]
    fn draws_pngs() {
        // `cargo xtask test` installs the font.
        register_font().unwrap();
        let dir = std::env::temp_dir().join(format!("xtask-plot-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let bar_data = [
            ("tcp: fastcp".to_owned(), 900.0),
            ("tcp: nc".to_owned(), 800.0),
        ];
        bars(&dir.join("b.png"), "t", "MiB/s", &bar_data).unwrap();
        let series = [(
            "fastcp".to_owned(),
            vec![(1.0, 0.01), (1000.0, 0.2), (1e6, 30.0)],
        )];
        lines(
            &dir.join("l.png"),
            "t",
            ("files", Axis::Log10),
            ("s", Axis::Log10),
            &series,
        )
        .unwrap();
        for f in ["b.png", "l.png"] {
            let bytes = fs::read(dir.join(f)).unwrap();
            assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n", "{f}");
        }
        fs::remove_dir_all(&dir).unwrap();
    }
}
