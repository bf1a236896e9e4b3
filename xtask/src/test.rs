//! `cargo xtask test`: installs what the test suite needs, then runs it.
//!
//! The programs come from one list, [`fastcp_testsupport::tools::PREREQUISITES`], plus the C
//! toolchain the build needs. What is missing is installed with `apt-get` when the machine
//! has it and we are root (or have password-less sudo), and the command says what it
//! installs; elsewhere it names the packages and stops. Then it runs `cargo test --workspace`
//! with any arguments given after `--`. Without such arguments (the whole suite, as CI runs
//! it), it then runs every example of the workspace ([`EXAMPLES`]) on a small tree, so that
//! an example that panics or fails fails the command.

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use fastcp_testsupport::tools::{self, Prerequisite};

/// What building the workspace needs besides Rust: AWS-LC, ring and jemalloc build C code.
const BUILD_TOOLS: &[Prerequisite] = &[
    Prerequisite {
        program: "cc",
        package: "gcc",
        why: "the C code of AWS-LC, ring and jemalloc",
    },
    Prerequisite {
        program: "make",
        package: "make",
        why: "jemalloc's build",
    },
];

/// Files the tests read, named by their path.
const FILES: &[Prerequisite] = &[Prerequisite {
    program: crate::plot::FONTS[0],
    package: "fonts-dejavu-core",
    why: "the text of the benchmark plots (xtask's plot tests)",
}];

/// Every example of the workspace, as (package, example, arguments), with arguments that
/// make it quick: `{src}` stands for a small tree (a file, and a folder with a 100 KB file),
/// `{out}` for an empty folder of the example's own. Each runs on this machine alone:
/// `ssh_throughput` starts its own sshd on 127.0.0.1, `tcp_throughput` talks to itself over
/// loopback. `backup` copies into a local folder; its remote side is `copy_remote`'s, which
/// the suite runs against its sshd.
const EXAMPLES: &[(&str, &str, &[&str])] = &[
    ("fastcp", "backup", &["{src}", "{out}/night"]),
    ("fastcp", "blocking", &["{src}", "{out}"]),
    ("fastcp", "events_cost", &["{src}", "{out}"]),
    ("fastcp", "serve", &["{src}", "{out}/served"]),
    ("fastcp-crypto", "bench_table", &["5"]),
    ("fastcp-stream", "local_copy", &["-r", "{src}", "{out}"]),
    (
        "fastcp-transport",
        "ssh_throughput",
        &["--bytes", "1M", "--runs", "1"],
    ),
    (
        "fastcp-transport",
        "tcp_throughput",
        &["--bytes", "1M", "--samples", "1"],
    ),
];

/// How long one example may run before it counts as hung.
const EXAMPLE_TIMEOUT: Duration = Duration::from_secs(300);

/// Options of `cargo xtask test`.
pub struct TestOptions {
    /// Only name what is missing; install nothing.
    pub no_install: bool,
    /// Arguments for `cargo test`, after `--`.
    pub cargo_args: Vec<String>,
}

/// Checks (and installs) the prerequisites, then runs the suite; returns its exit status.
pub fn run(opts: &TestOptions) -> Result<ExitStatus> {
    let missing: Vec<Prerequisite> = BUILD_TOOLS
        .iter()
        .chain(FILES)
        .filter(|p| !present(p))
        .copied()
        .chain(tools::missing())
        .collect();
    if !missing.is_empty() {
        install(&missing, opts.no_install)?;
    }
    let started = Instant::now();
    let mut cmd = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
    cmd.args(["test", "--workspace"]).args(&opts.cargo_args);
    eprintln!(
        "running: cargo test --workspace {}",
        opts.cargo_args.join(" ")
    );
    let status = cmd.status().context("running cargo test")?;
    if status.success() && opts.cargo_args.is_empty() {
        run_examples()?;
    }
    eprintln!(
        "cargo xtask test: {} in {:.0} s",
        if status.success() { "passed" } else { "FAILED" },
        started.elapsed().as_secs_f64()
    );
    Ok(status)
}

/// The workspace's root folder.
fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask sits in the workspace")
        .to_owned()
}

/// The names of the examples in the workspace's `examples/` folders, sorted.
fn example_files(root: &Path) -> Result<Vec<String>> {
    let mut folders = vec![root.join("examples")];
    for entry in std::fs::read_dir(root.join("crates"))? {
        folders.push(entry?.path().join("examples"));
    }
    let mut names = Vec::new();
    for folder in folders.iter().filter(|f| f.is_dir()) {
        for entry in std::fs::read_dir(folder)? {
            let path = entry?.path();
            if path.extension().is_some_and(|e| e == "rs") {
                names.push(path.file_stem().unwrap().to_string_lossy().into_owned());
            }
        }
    }
    names.sort();
    Ok(names)
}

/// Builds the workspace's examples (as `cargo test --workspace` did: nothing is rebuilt)
/// and runs each as [`EXAMPLES`] says; fails on the first that fails, panics or hangs, and
/// when an example is missing from the list.
fn run_examples() -> Result<()> {
    let root = workspace_root();
    let listed: Vec<String> = EXAMPLES.iter().map(|e| e.1.to_owned()).collect();
    for name in example_files(&root)? {
        if !listed.contains(&name) {
            bail!(
                "example {name} is not in xtask/src/test.rs's EXAMPLES: add it, with arguments that make it quick"
            );
        }
    }
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let output = Command::new(&cargo)
        .args([
            "build",
            "--workspace",
            "--examples",
            "--message-format=json-render-diagnostics",
        ])
        .stderr(Stdio::inherit())
        .output()
        .context("running cargo build --examples")?;
    if !output.status.success() {
        bail!("building the examples failed ({})", output.status);
    }
    let executables = example_executables(&String::from_utf8_lossy(&output.stdout));
    let work = std::env::temp_dir().join(format!("fastcp-examples-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&work);
    let src = work.join("src");
    std::fs::create_dir_all(src.join("sub"))?;
    std::fs::write(src.join("a.txt"), b"hello\n")?;
    std::fs::write(
        src.join("sub/b.bin"),
        (0..100_000u32).map(|i| (i % 251) as u8).collect::<Vec<_>>(),
    )?;
    let result = (|| {
        for (package, name, args) in EXAMPLES {
            let program = executables
                .iter()
                .find(|p| p.file_name().is_some_and(|f| f == *name))
                .with_context(|| format!("cargo built no example {name} (package {package})"))?;
            let out = work.join(name);
            std::fs::create_dir_all(&out)?;
            let args: Vec<String> = args
                .iter()
                .map(|a| {
                    a.replace("{src}", &src.to_string_lossy())
                        .replace("{out}", &out.to_string_lossy())
                })
                .collect();
            run_example(package, name, program, &args)?;
        }
        Ok(())
    })();
    let _ = std::fs::remove_dir_all(&work);
    result
}

/// The example programs among the artifacts that `cargo build --message-format=json`
/// reports, one JSON object a line (`"executable":"PATH"` on an example's line).
fn example_executables(messages: &str) -> Vec<PathBuf> {
    messages
        .lines()
        .filter(|l| {
            l.contains(r#""reason":"compiler-artifact""#) && l.contains(r#""kind":["example"]"#)
        })
        .filter_map(|l| {
            let start = l.find(r#""executable":""#)? + r#""executable":""#.len();
            let len = l[start..].find('"')?;
            Some(PathBuf::from(&l[start..start + len]))
        })
        .collect()
}

/// Runs one example, its output kept and shown only when it fails or runs past
/// [`EXAMPLE_TIMEOUT`].
fn run_example(package: &str, name: &str, program: &Path, args: &[String]) -> Result<()> {
    let started = Instant::now();
    let log =
        std::env::temp_dir().join(format!("fastcp-example-{name}-{}.log", std::process::id()));
    let file = std::fs::File::create(&log)?;
    // A process group of its own, so that a hung example goes with what it started (the
    // sshd of `ssh_throughput`).
    let mut child = Command::new(program)
        .args(args)
        .process_group(0)
        .stdin(Stdio::null())
        .stdout(file.try_clone()?)
        .stderr(file)
        .spawn()
        .with_context(|| format!("starting example {name}"))?;
    let status = loop {
        if let Some(status) = child.try_wait()? {
            break Some(status);
        }
        if started.elapsed() > EXAMPLE_TIMEOUT {
            let group = format!("-{}", child.id());
            let _ = Command::new("kill").args(["-KILL", "--", &group]).status();
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let said = std::fs::read_to_string(&log).unwrap_or_default();
    let _ = std::fs::remove_file(&log);
    match status {
        Some(s) if s.success() => {
            eprintln!(
                "example {name} ({package}): ok in {:.1} s",
                started.elapsed().as_secs_f64()
            );
            Ok(())
        }
        Some(s) => bail!("example {name} ({package}) failed ({s}):\n{said}"),
        None => bail!(
            "example {name} ({package}) did not end within {} s:\n{said}",
            EXAMPLE_TIMEOUT.as_secs()
        ),
    }
}

/// Installs the packages of `missing` with apt-get, or says what to install and fails.
pub(crate) fn install(missing: &[Prerequisite], no_install: bool) -> Result<()> {
    let mut packages: Vec<&str> = missing.iter().map(|p| p.package).collect();
    packages.dedup();
    packages.sort_unstable();
    packages.dedup();
    for p in missing {
        eprintln!(
            "missing: {} (Debian package {}): {}",
            p.program, p.package, p.why
        );
    }
    let line = format!("apt-get install {}", packages.join(" "));
    let sudo = if is_root() {
        Some(Vec::new())
    } else if tools::find("sudo").is_some() && sudo_without_password() {
        Some(vec!["sudo"])
    } else {
        None
    };
    let (Some(sudo), false, Some(_)) = (sudo, no_install, tools::find("apt-get")) else {
        bail!("install the programs above ({line}, as root) and run the command again");
    };
    eprintln!("installing: {}", packages.join(" "));
    let apt = |args: &[&str]| -> Result<()> {
        let mut argv: Vec<&str> = sudo.clone();
        argv.push("apt-get");
        argv.extend_from_slice(args);
        let status = Command::new(argv[0])
            .args(&argv[1..])
            .env("DEBIAN_FRONTEND", "noninteractive")
            .stdin(Stdio::null())
            .status()
            .with_context(|| format!("running {}", argv.join(" ")))?;
        if !status.success() {
            bail!(
                "`{}` failed ({status}); install the packages by hand: {line}",
                argv.join(" ")
            );
        }
        Ok(())
    };
    apt(&["update", "-qq"])?;
    let mut args = vec!["install", "-y", "-qq", "--no-install-recommends"];
    args.extend(&packages);
    apt(&args)?;
    let still: Vec<&str> = missing
        .iter()
        .filter(|p| !present(p))
        .map(|p| p.program)
        .collect();
    if !still.is_empty() {
        bail!("still missing after installing: {}", still.join(", "));
    }
    Ok(())
}

/// Whether a prerequisite is there: a program on PATH, or a file named by its absolute path.
fn present(p: &Prerequisite) -> bool {
    if p.program.starts_with('/') {
        std::path::Path::new(p.program).exists()
    } else {
        tools::find(p.program).is_some()
    }
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| o.stdout.trim_ascii() == b"0")
}

fn sudo_without_password() -> bool {
    Command::new("sudo")
        .args(["-n", "true"])
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_prerequisite_is_found_by_its_path() {
        let p = |program| Prerequisite {
            program,
            package: "x",
            why: "y",
        };
        // A path that is not a program on PATH: the font's kind of prerequisite.
        assert!(present(&p("/etc/passwd")));
        assert!(!present(&p("/nonexistent/font.ttf")));
        assert!(present(&p("sh")));
    }

    /// A new example must be given arguments here, or `cargo xtask test` would refuse to
    /// run; and every example listed exists.
    #[test]
    fn every_example_is_listed_to_run() {
        let files = example_files(&workspace_root()).unwrap();
        let mut listed: Vec<String> = EXAMPLES.iter().map(|e| e.1.to_owned()).collect();
        listed.sort();
        assert_eq!(files, listed);
    }

    #[test]
    fn example_executables_are_read_from_cargos_messages() {
        let messages = concat!(
            r#"{"reason":"compiler-artifact","target":{"kind":["lib"]},"executable":null}"#,
            "\n",
            r#"{"reason":"compiler-artifact","target":{"kind":["example"],"name":"serve"},"executable":"/t/debug/examples/serve"}"#,
            "\n",
            r#"{"reason":"build-finished","success":true}"#,
        );
        assert_eq!(
            example_executables(messages),
            [PathBuf::from("/t/debug/examples/serve")]
        );
    }
}
