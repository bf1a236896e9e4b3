//! `cargo xtask dist`: static (musl) release binaries of fastcp, the ones self-deploy
//! uploads to a remote host that has no fastcp, with their SHA-256 sums.
//!
//! For each target it adds the Rust target with rustup when it is missing, builds
//! `cargo build --release --target T -p fastcp`, and copies the binary to
//! `OUT/fastcp-<version>-<target>`; then it writes `OUT/SHA256SUMS` in `sha256sum`'s format.
//! A target's C compiler (musl-gcc, or a cross gcc) is installed with apt-get when it is
//! missing and the machine allows it, as `cargo xtask test` does; where it cannot be, the
//! target is skipped with the package to install, unless it was named with `--targets`,
//! where that is an error.

use std::fmt::Write as _;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};
use fastcp_testsupport::tools::{self, Prerequisite};

/// A target `dist` knows how to build.
struct Target {
    triple: &'static str,
    /// The C compiler for the target's C code (AWS-LC, ring, zstd, jemalloc) and the Debian
    /// package that has it.
    cc: Prerequisite,
    /// Whether `cc` also links (a cross target); else rustc's default linker serves, with
    /// the musl start files Rust ships.
    cc_links: bool,
}

const TARGETS: &[Target] = &[
    Target {
        triple: "x86_64-unknown-linux-musl",
        cc: Prerequisite {
            program: "musl-gcc",
            package: "musl-tools",
            why: "C code built against musl",
        },
        cc_links: false,
    },
    Target {
        triple: "aarch64-unknown-linux-musl",
        cc: Prerequisite {
            program: "aarch64-linux-gnu-gcc",
            package: "gcc-aarch64-linux-gnu",
            why: "C code and linking for aarch64",
        },
        cc_links: true,
    },
];

/// Options of `cargo xtask dist`.
pub struct DistOptions {
    /// Targets to build (empty: every target whose tools are here).
    pub targets: Vec<String>,
    /// Where the binaries and `SHA256SUMS` go.
    pub out: PathBuf,
    /// The repository root.
    pub repo: PathBuf,
}

/// Builds the binaries; returns their paths.
pub fn run(opts: &DistOptions) -> Result<Vec<PathBuf>> {
    let named = !opts.targets.is_empty();
    let wanted: Vec<&Target> = if named {
        opts.targets
            .iter()
            .map(|t| {
                TARGETS.iter().find(|k| k.triple == t).with_context(|| {
                    let known: Vec<_> = TARGETS.iter().map(|k| k.triple).collect();
                    format!("unknown target {t:?} (known: {})", known.join(", "))
                })
            })
            .collect::<Result<_>>()?
    } else {
        TARGETS.iter().collect()
    };
    let version = package_version(&opts.repo)?;
    fs::create_dir_all(&opts.out).with_context(|| format!("creating {}", opts.out.display()))?;
    let mut built = Vec::new();
    for target in wanted {
        if tools::find(target.cc.program).is_none()
            && let Err(e) = crate::test::install(&[target.cc], false)
        {
            let msg = format!("{}: {e:#}", target.triple);
            if named {
                bail!("{msg}");
            }
            eprintln!("skipped {msg}");
            continue;
        }
        built.push(build(target, &version, opts)?);
    }
    if built.is_empty() {
        bail!("nothing was built");
    }
    let mut sums = String::new();
    for path in &built {
        let bytes = fs::read(path)?;
        use sha2::Digest as _;
        let digest = sha2::Sha256::digest(&bytes);
        let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
        let name = path.file_name().expect("a file").to_string_lossy();
        writeln!(sums, "{hex}  {name}")?;
        println!("{}  {} bytes  sha256 {hex}", path.display(), bytes.len());
    }
    fs::write(opts.out.join("SHA256SUMS"), sums)?;
    println!("{}", opts.out.join("SHA256SUMS").display());
    Ok(built)
}

fn build(target: &Target, version: &str, opts: &DistOptions) -> Result<PathBuf> {
    ensure_rust_target(target.triple)?;
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.current_dir(&opts.repo)
        .args(["build", "--release", "--locked", "-p", "fastcp", "--target"])
        .arg(target.triple);
    let env_triple = target.triple.replace('-', "_");
    cmd.env(format!("CC_{env_triple}"), target.cc.program);
    if target.cc_links {
        cmd.env(
            format!("CARGO_TARGET_{}_LINKER", env_triple.to_uppercase()),
            target.cc.program,
        );
    }
    eprintln!("building fastcp for {}", target.triple);
    let status = cmd.status().context("running cargo build")?;
    if !status.success() {
        bail!("cargo build for {} failed ({status})", target.triple);
    }
    let target_dir = std::env::var_os("CARGO_TARGET_DIR")
        .map_or_else(|| opts.repo.join("target"), PathBuf::from);
    let from = target_dir.join(target.triple).join("release/fastcp");
    let to = opts.out.join(format!("fastcp-{version}-{}", target.triple));
    fs::copy(&from, &to)
        .with_context(|| format!("copying {} to {}", from.display(), to.display()))?;
    Ok(to)
}

/// Adds the Rust standard library for `triple` with rustup when it is missing.
fn ensure_rust_target(triple: &str) -> Result<()> {
    let Some(rustup) = tools::find("rustup") else {
        return Ok(()); // a toolchain without rustup: cargo will say if the target is missing
    };
    let out = Command::new(&rustup)
        .args(["target", "list", "--installed"])
        .output()
        .context("running rustup")?;
    if String::from_utf8_lossy(&out.stdout)
        .lines()
        .any(|l| l.trim() == triple)
    {
        return Ok(());
    }
    eprintln!("adding the Rust target {triple} (rustup target add {triple})");
    let status = Command::new(&rustup)
        .args(["target", "add", triple])
        .status()?;
    if !status.success() {
        bail!("rustup target add {triple} failed ({status})");
    }
    Ok(())
}

/// The `fastcp` package's version, from the workspace's Cargo.toml.
fn package_version(repo: &Path) -> Result<String> {
    let text = fs::read_to_string(repo.join("Cargo.toml"))?;
    let mut in_workspace_package = false;
    for line in text.lines() {
        let line = line.trim();
        if line.starts_with('[') {
            in_workspace_package = line == "[workspace.package]";
        } else if in_workspace_package && let Some(v) = line.strip_prefix("version") {
            return Ok(v
                .trim_start_matches([' ', '='])
                .trim_matches('"')
                .to_owned());
        }
    }
    bail!("no [workspace.package] version in Cargo.toml")
}
