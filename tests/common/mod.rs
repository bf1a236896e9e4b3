//! Helpers shared by the end-to-end tests: the fastcp command set up for a test sshd, and
//! small scripts that stand in for the remote program.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use fastcp_testsupport::Sshd;

/// The fastcp binary under test.
pub const BIN: &str = env!("CARGO_BIN_EXE_fastcp");

/// The binary as a path, for `--remote-path`.
pub fn bin() -> &'static Path {
    Path::new(BIN)
}

/// A `fastcp` command for `sshd`: its ssh_config, `remote_path` as the remote program, and no
/// agent from the environment.
pub fn fastcp(sshd: &Sshd, remote_path: &Path) -> Command {
    let mut cmd = Command::new(BIN);
    cmd.arg("-F")
        .arg(sshd.ssh_config())
        .arg("--remote-path")
        .arg(remote_path)
        .env_remove("SSH_AUTH_SOCK");
    cmd
}

/// fastcp with the ssh_config `config` (`-F`), this build as the remote program
/// (`--remote-path`) and no agent.
pub fn fastcp_with_config(config: impl AsRef<std::ffi::OsStr>) -> Command {
    let mut cmd = Command::new(BIN);
    cmd.arg("-F")
        .arg(config)
        .arg("--remote-path")
        .arg(BIN)
        .env_remove("SSH_AUTH_SOCK");
    cmd
}

/// `alias:path` on `sshd`.
pub fn remote(sshd: &Sshd, path: &Path) -> String {
    format!("{}:{}", sshd.alias(), path.display())
}

/// Runs the command and prints what it said, for the test's log.
pub fn run(cmd: &mut Command) -> Output {
    let out = cmd.output().expect("run fastcp");
    eprintln!(
        "fastcp exited {:?}\nstdout: {}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// The command's stderr as text.
pub fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// The `--json` summary on stdout.
pub fn json(out: &Output) -> serde_json::Value {
    serde_json::from_slice(&out.stdout).expect("a JSON summary on stdout")
}

/// An executable shell script `dir/name` running `body`.
pub fn script(dir: &Path, name: &str, body: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).unwrap();
    std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    path
}

/// A wrapper that starts the fastcp binary with `env` (shell assignments) set.
pub fn wrapper(dir: &Path, env: &str) -> PathBuf {
    script(dir, "fastcp-wrapper", &format!("{env} exec '{BIN}' \"$@\""))
}

/// A folder `src` in `work` with `n` empty files of longish names, and an empty `dst` beside
/// it: a listing longer than a connection's buffers. Returns both.
pub fn many_empty_files(work: &Path, n: usize) -> (PathBuf, PathBuf) {
    let src = work.join("src");
    std::fs::create_dir(&src).unwrap();
    for i in 0..n {
        std::fs::write(src.join(format!("file-with-a-longish-name-{i:05}")), b"").unwrap();
    }
    let dst = work.join("dst");
    std::fs::create_dir(&dst).unwrap();
    (src, dst)
}
