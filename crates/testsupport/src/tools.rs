//! The programs the test suite runs, and the Debian packages that provide them.
//!
//! [`PREREQUISITES`] is the one list: `cargo xtask test` installs what is missing from it
//! before running the suite, and a test that needs a program calls [`require`], which fails
//! with one line naming the package instead of a bare "No such file or directory".
//!
//! ```no_run
//! let strace = fastcp_testsupport::tools::require("strace");
//! let status = std::process::Command::new(strace).arg("-V").status().unwrap();
//! assert!(status.success());
//! ```

use std::env;
use std::path::{Path, PathBuf};

/// A program the tests run.
#[derive(Debug, Clone, Copy)]
pub struct Prerequisite {
    /// The program's name, looked up on `PATH` (and in the sbin folders, for `sshd`).
    pub program: &'static str,
    /// The Debian package that provides it.
    pub package: &'static str,
    /// What the tests use it for.
    pub why: &'static str,
}

/// Every program the test suite runs besides cargo's own.
pub const PREREQUISITES: &[Prerequisite] = &[
    Prerequisite {
        program: "sshd",
        package: "openssh-server",
        why: "the real OpenSSH server every remote test copies through",
    },
    Prerequisite {
        program: "sftp-server",
        package: "openssh-sftp-server",
        why: "OpenSSH's SFTP server, which the test sshd serves as its sftp subsystem",
    },
    Prerequisite {
        program: "ssh",
        package: "openssh-client",
        why: "the system ssh path and the fixture's own checks",
    },
    Prerequisite {
        program: "ssh-keygen",
        package: "openssh-client",
        why: "temporary host and client keys",
    },
    Prerequisite {
        program: "ssh-agent",
        package: "openssh-client",
        why: "agent authentication",
    },
    Prerequisite {
        program: "ssh-add",
        package: "openssh-client",
        why: "agent authentication",
    },
    Prerequisite {
        program: "tmux",
        package: "tmux",
        why: "progress and prompts on a real terminal",
    },
    Prerequisite {
        program: "script",
        package: "bsdutils",
        why: "a pseudo-terminal for passphrase prompts",
    },
    Prerequisite {
        program: "strace",
        package: "strace",
        why: "counting the flushes of --fsync",
    },
    Prerequisite {
        program: "unshare",
        package: "util-linux",
        why: "a small tmpfs in a mount namespace, for full-disk tests",
    },
    Prerequisite {
        program: "setpriv",
        package: "util-linux",
        why: "runs fastcp as another user when the tests run as root, for unreadable files",
    },
    Prerequisite {
        program: "setsid",
        package: "util-linux",
        why: "a process without a terminal, which must not be asked anything",
    },
    Prerequisite {
        program: "mount",
        package: "mount",
        why: "a small tmpfs in a mount namespace, for full-disk tests",
    },
    Prerequisite {
        program: "kill",
        package: "procps",
        why: "signals to a copy in flight",
    },
    Prerequisite {
        program: "parallel",
        package: "parallel",
        why: "the GNU parallel line of docs/sharding.md, run as documented",
    },
    Prerequisite {
        program: "tcsh",
        package: "tcsh",
        why: "a csh-like login shell, to check what remote command lines mean under it",
    },
    Prerequisite {
        program: "dash",
        package: "dash",
        why: "a plain POSIX login shell, to check what remote command lines mean under it",
    },
    Prerequisite {
        program: "timeout",
        package: "coreutils",
        why: "bounding the runs of helper processes",
    },
];

/// Folders searched after `PATH`: sshd lives in sbin, which a normal user's `PATH` often
/// lacks, and sftp-server in OpenSSH's libexec folder (which varies by distribution).
const SBIN: &[&str] = &[
    "/usr/sbin",
    "/sbin",
    "/usr/local/sbin",
    "/usr/lib/openssh",
    "/usr/libexec",
    "/usr/libexec/openssh",
    "/usr/lib/ssh",
];

/// The full path of `program`: from `PATH`, then the sbin and libexec folders. `sshd` can be named with
/// the environment variable `FASTCP_TEST_SSHD`.
pub fn find(program: &str) -> Option<PathBuf> {
    if program == "sshd"
        && let Some(path) = env::var_os("FASTCP_TEST_SSHD")
    {
        return Some(PathBuf::from(path)).filter(|p| is_executable(p));
    }
    let path = env::var_os("PATH").unwrap_or_default();
    env::split_paths(&path)
        .chain(SBIN.iter().map(PathBuf::from))
        .filter(|dir| dir.is_absolute())
        .map(|dir| dir.join(program))
        .find(|p| is_executable(p))
}

/// The prerequisites that [`find`] cannot find.
pub fn missing() -> Vec<Prerequisite> {
    PREREQUISITES
        .iter()
        .filter(|p| find(p.program).is_none())
        .copied()
        .collect()
}

/// The message for a program that is not there, naming its package.
pub fn not_found_message(program: &str) -> String {
    let package = PREREQUISITES
        .iter()
        .find(|p| p.program == program)
        .map_or("?", |p| p.package);
    format!(
        "`{program}` not found on PATH or in /usr/sbin: install the Debian package {package} \
         (apt-get install {package}), or run the suite with `cargo xtask test`, which installs \
         what it lacks"
    )
}

/// The full path of `program`, or an error naming the package to install.
pub fn locate(program: &str) -> std::io::Result<PathBuf> {
    find(program).ok_or_else(|| {
        std::io::Error::new(std::io::ErrorKind::NotFound, not_found_message(program))
    })
}

/// The full path of `program`; panics with one line naming the package when it is missing.
pub fn require(program: &str) -> PathBuf {
    match find(program) {
        Some(p) => p,
        None => panic!("{}", not_found_message(program)),
    }
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    path.metadata()
        .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_a_program_on_path_and_names_the_package_of_a_missing_one() {
        assert!(find("sh").is_some_and(|p| p.is_absolute()));
        assert!(find("fastcp-no-such-program").is_none());
        let msg = not_found_message("sshd");
        assert!(msg.contains("openssh-server"), "{msg}");
        let err = locate("fastcp-no-such-program").unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::NotFound);
    }

    #[test]
    fn every_prerequisite_names_a_package() {
        for p in PREREQUISITES {
            assert!(!p.package.is_empty() && !p.why.is_empty(), "{p:?}");
        }
    }
}
