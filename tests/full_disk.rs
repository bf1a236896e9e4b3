//! A full disk: the copy stops with a clear error, and the destination keeps no partial or
//! corrupt file under its final name and no temp file.
//!
//! Each test fills a 1 MiB tmpfs that it mounts in a private mount namespace of its own
//! (`unshare --mount --map-root-user`, as root or as a user allowed user namespaces), so
//! nothing outside the test sees the mount. Whatever runs inside the namespace (the local
//! copy, the pulling client, or the remote `fastcp server` through `--remote-path`) reports
//! back what the small disk holds: every name left on it, and `CORRUPT name` for a file whose
//! bytes differ from its source.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use common::*;
use fastcp_testsupport::Sshd;
use fastcp_testsupport::tree::{pseudo_random, write};

/// Shell code that mounts the small disk on `$FULL`, or fails the test with exit 99.
const MOUNT: &str = r#"mount -t tmpfs -o size=1m tmpfs "$FULL" || exit 99"#;

/// Shell code that reports what `$FULL` holds on stdout (after `--- disk`), comparing each
/// file with the same name under `$SRC`.
const REPORT: &str = r#"echo '--- disk'
find "$FULL" -mindepth 1 -printf '%P\n' | sort
find "$FULL" -type f -printf '%P\n' | while read -r f; do
  cmp -s "$FULL/$f" "$SRC/$f" || echo "CORRUPT $f"
done"#;

/// Sources under `dir/tree`: two small files that fit and one of 3 MiB that cannot; returns
/// `dir/full`, the empty directory the small disk is mounted on.
fn setup(dir: &Path) -> PathBuf {
    std::fs::create_dir_all(dir.join("tree")).unwrap();
    write(&dir.join("tree/a.txt"), b"small file a\n", 0o644);
    write(&dir.join("tree/b.txt"), &pseudo_random(100_000, 1), 0o644);
    write(&dir.join("tree/big.bin"), &pseudo_random(3 << 20, 2), 0o644);
    let full = dir.join("full");
    std::fs::create_dir(&full).unwrap();
    full
}

/// Runs the fastcp command line `args` (shell words) in a new mount namespace whose `full`
/// directory is the small disk, with `SRC` (the sources' directory), `FULL` and `BIN` set, and
/// `env` besides; returns the outcome with fastcp's own stderr, and the disk report.
fn copy_in_namespace(
    src: &Path,
    full: &Path,
    args: &str,
    env: &[(&str, &str)],
) -> (Output, Vec<String>) {
    let script = format!(
        r#"{MOUNT}
"$BIN" {args} 2>"$FULL/../stderr"
rc=$?
{REPORT}
exit $rc"#
    );
    let mut cmd = Command::new(fastcp_testsupport::tools::require("unshare"));
    cmd.args(["--mount", "--map-root-user", "sh", "-c", &script])
        .env("FULL", full)
        .env("SRC", src)
        .env("BIN", BIN)
        .env_remove("SSH_AUTH_SOCK")
        .envs(env.iter().copied());
    let out = cmd.output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let err = std::fs::read_to_string(full.with_file_name("stderr")).unwrap_or_default();
    eprintln!("stdout:\n{stdout}\nstderr:\n{err}");
    let out = Output {
        stderr: err.into_bytes(),
        ..out
    };
    (out, disk_report(&stdout))
}

/// The lines reported after `--- disk`.
fn disk_report(text: &str) -> Vec<String> {
    let (_, after) = text
        .split_once("--- disk\n")
        .unwrap_or_else(|| panic!("no disk report in:\n{text}"));
    after.lines().map(str::to_owned).collect()
}

/// What a full disk must look like afterwards: no temp file, nothing corrupt, no partial big
/// file; the small files may or may not have made it (the copy stops at the first failure).
fn assert_nothing_partial(report: &[String]) {
    for line in report {
        assert!(!line.starts_with("CORRUPT"), "{line}");
        assert!(!line.contains(".fastcp-"), "temp file left: {line}");
        assert!(
            !line.ends_with("big.bin"),
            "partial file under its final name: {line}"
        );
    }
}

fn assert_clean_failure(out: &Output, who: &str) {
    assert_ne!(
        out.status.code(),
        Some(99),
        "could not mount the small disk"
    );
    assert_eq!(out.status.code(), Some(1), "{who}: {}", stderr(out));
    let err = stderr(out);
    assert!(
        err.contains("no space left on device"),
        "{who} should say why: {err}"
    );
    assert_eq!(
        err.matches("o space left on device").count(),
        1,
        "said once: {err}"
    );
}

#[test]
fn local_copy_into_a_full_disk() {
    let work = tempfile::tempdir().unwrap();
    let full = setup(work.path());
    let (out, report) =
        copy_in_namespace(work.path(), &full, r#"-r "$SRC/tree" "$FULL/tree""#, &[]);
    assert_clean_failure(&out, "the local copy");
    assert_nothing_partial(&report);
}

#[test]
fn pull_into_a_full_disk() {
    let sshd = Sshd::start().unwrap();
    let work = tempfile::tempdir().unwrap();
    let full = setup(work.path());
    let cfg = sshd.ssh_config().to_str().unwrap().to_owned();
    let remote = remote(&sshd, &work.path().join("tree"));
    let (out, report) = copy_in_namespace(
        work.path(),
        &full,
        r#"-F "$CFG" --remote-path "$BIN" -r "$REMOTE" "$FULL/tree""#,
        &[("CFG", &cfg), ("REMOTE", &remote)],
    );
    assert_clean_failure(&out, "the pulling client");
    assert_nothing_partial(&report);
}

#[test]
fn push_to_a_remote_full_disk() {
    let sshd = Sshd::start().unwrap();
    let work = tempfile::tempdir().unwrap();
    let full = setup(work.path());
    let listing = work.path().join("listing");
    // The remote program: fastcp server inside a namespace whose destination is the small
    // disk; it writes its report where the test can read it.
    let server = script(
        work.path(),
        "fastcp-full-disk",
        &format!(
            r#"export FULL='{full}' SRC='{src}'
exec unshare --mount --map-root-user sh -c '{MOUNT}
"{BIN}" "$@"
rc=$?
{{ {REPORT}
}} > "{listing}"
exit $rc' fastcp "$@""#,
            full = full.display(),
            src = work.path().display(),
            listing = listing.display(),
            MOUNT = MOUNT.replace('\'', r"'\''"),
            REPORT = REPORT.replace('\'', r"'\''"),
        ),
    );
    for transport in ["ssh", "tcp"] {
        let out = run(fastcp(&sshd, &server)
            .args(["-r", "--transport", transport])
            .arg(work.path().join("tree"))
            .arg(remote(&sshd, &full.join("tree"))));
        assert_clean_failure(&out, transport);
        let report = std::fs::read_to_string(&listing).unwrap();
        eprintln!("{transport}: remote disk:\n{report}");
        assert_nothing_partial(&disk_report(&report));
    }
}

/// A full disk with `--resume`, local and pull: the first copy fails and keeps what it wrote
/// in its hidden partial file; once space is freed, the second copy continues it, sends only
/// what was missing, and the file is whole.
#[test]
fn a_full_disk_then_resume_once_space_is_freed() {
    let sshd = Sshd::start().unwrap();
    let work = tempfile::tempdir().unwrap();
    write(
        &work.path().join("big.bin"),
        &pseudo_random(6 << 20, 4),
        0o644,
    );
    let full = work.path().join("full");
    std::fs::create_dir(&full).unwrap();
    let cfg = sshd.ssh_config().to_str().unwrap().to_owned();
    let remote = remote(&sshd, &work.path().join("big.bin"));
    for (who, from) in [("local", r#""$SRC/big.bin""#), ("pull", r#""$REMOTE""#)] {
        let script = format!(
            r#"mount -t tmpfs -o size=3m tmpfs "$FULL" || exit 99
"$BIN" -F "$CFG" --remote-path "$BIN" --resume {from} "$FULL/big.bin" 2>"$FULL/../stderr"
echo "first $?"
ls -a "$FULL"
mount -o remount,size=16m "$FULL" || exit 99
"$BIN" -F "$CFG" --remote-path "$BIN" --resume --json {from} "$FULL/big.bin" || exit 98
cmp "$FULL/big.bin" "$SRC/big.bin" || echo CORRUPT
ls -a "$FULL""#
        );
        let out = Command::new(fastcp_testsupport::tools::require("unshare"))
            .args(["--mount", "--map-root-user", "sh", "-c", &script])
            .env("FULL", &full)
            .env("SRC", work.path())
            .env("BIN", BIN)
            .env("CFG", &cfg)
            .env("REMOTE", &remote)
            .env_remove("SSH_AUTH_SOCK")
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        let first_err = std::fs::read_to_string(work.path().join("stderr")).unwrap_or_default();
        eprintln!("{who}:\n{stdout}\nfirst copy said: {first_err}");
        assert_ne!(
            out.status.code(),
            Some(99),
            "could not mount the small disk"
        );
        assert!(
            out.status.success(),
            "{who}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(stdout.contains("first 1"), "{who}: the first copy fails");
        assert!(first_err.contains("no space left on device"), "{first_err}");
        let (before, after) = stdout.split_once('{').expect("the JSON summary");
        assert!(
            before.contains(".big.bin.fastcp-partial") && !before.contains("\nbig.bin\n"),
            "{who}: only the partial file is kept: {before}"
        );
        assert!(!after.contains("CORRUPT"));
        assert!(
            !after.contains("fastcp-"),
            "{who}: the partial file is gone"
        );
        let text = format!("{{{}}}", after.rsplit_once('}').unwrap().0);
        let json: serde_json::Value = serde_json::from_str(&text).unwrap();
        let resumed = json["bytes_resumed"].as_u64().unwrap();
        let sent = json["bytes_sent"].as_u64().unwrap();
        assert!(resumed >= 1 << 20, "{who}: kept {resumed}");
        assert_eq!(resumed + sent, 6 << 20);
    }
}

/// A push over SFTP into a full disk (sshd's own sftp-server, in a namespace whose
/// destination is the small disk): the copy stops at the first file that does not fit,
/// saying what sftp-server does not (its answer to a full disk is a bare "Failure"), once,
/// and leaves no temp file and nothing partial.
#[test]
fn an_sftp_push_to_a_full_disk_stops_and_says_why() {
    let work = tempfile::tempdir().unwrap();
    let full = setup(work.path());
    // More files than the disk holds, each of which would fail if the copy went on.
    std::fs::create_dir(work.path().join("tree/more")).unwrap();
    for i in 0..6 {
        let name = format!("tree/more/{i}.bin");
        write(
            &work.path().join(name),
            &pseudo_random(300_000, 10 + i),
            0o644,
        );
    }
    let listing = work.path().join("listing");
    let sftp_server = fastcp_testsupport::tools::locate("sftp-server").unwrap();
    let wrapper = script(
        work.path(),
        "sftp-server-full-disk",
        &format!(
            r#"export FULL='{full}' SRC='{src}'
exec unshare --mount --map-root-user sh -c '{MOUNT}
"{server}"
rc=$?
{{ {REPORT}
}} > "{listing}.part" && mv "{listing}.part" "{listing}"
exit $rc'"#,
            full = full.display(),
            src = work.path().display(),
            server = sftp_server.display(),
            listing = listing.display(),
            MOUNT = MOUNT.replace('\'', r"'\''"),
            REPORT = REPORT.replace('\'', r"'\''"),
        ),
    );
    let sshd = Sshd::start_with_options(&format!("Subsystem sftp {}", wrapper.display())).unwrap();
    let out = run(Command::new(BIN)
        .arg("-F")
        .arg(sshd.ssh_config())
        .args(["--sftp", "-r", "-j", "1"])
        .arg(work.path().join("tree"))
        .arg(remote(&sshd, &full.join("tree")))
        .env_remove("SSH_AUTH_SOCK"));
    assert_clean_failure(&out, "the SFTP push");
    let err = stderr(&out);
    assert!(!err.contains("without saying why"), "{err}");
    assert!(!err.contains("Failure: Failure"), "{err}");
    // sftp-server writes its report once its session has closed, after the copy returned.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let report = loop {
        match std::fs::read_to_string(&listing) {
            Ok(report) if report.contains("--- disk") => break report,
            _ => {
                assert!(
                    std::time::Instant::now() < deadline,
                    "no report from the server"
                );
                std::thread::sleep(std::time::Duration::from_millis(50));
            }
        }
    };
    assert_nothing_partial(&disk_report(&report));
}
