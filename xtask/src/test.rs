//! `cargo xtask test`: installs what the test suite needs, then runs it.
//!
//! The programs come from one list, [`fastcp_testsupport::tools::PREREQUISITES`], plus the C
//! toolchain the build needs. What is missing is installed with `apt-get` when the machine
//! has it and we are root (or have password-less sudo), and the command says what it
//! installs; elsewhere it names the packages and stops. Then it runs `cargo test --workspace`
//! with any arguments given after `--`.

use std::process::{Command, ExitStatus, Stdio};
use std::time::Instant;

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
    eprintln!(
        "cargo xtask test: {} in {:.0} s",
        if status.success() { "passed" } else { "FAILED" },
        started.elapsed().as_secs_f64()
    );
    Ok(status)
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
}
