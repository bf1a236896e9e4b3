//! `--fsync`: the receiving side flushes every file before it takes its final name, and the
//! directories it wrote into before it reports success. Power loss cannot be staged in a
//! test, so these count the flushes with strace, on whichever side receives.

mod common;

use std::path::Path;
use std::process::Command;

use common::*;
use fastcp_testsupport::Sshd;
use fastcp_testsupport::tree::{assert_same_tree, build_mixed};

/// Regular files in the tree at `root`.
fn files_in(root: &Path) -> usize {
    let mut n = 0;
    for entry in std::fs::read_dir(root).unwrap() {
        let entry = entry.unwrap();
        let kind = entry.file_type().unwrap();
        if kind.is_dir() {
            n += files_in(&entry.path());
        } else if kind.is_file() {
            n += 1;
        }
    }
    n
}

/// `(fdatasync, fsync)` calls that succeeded in an strace log.
fn flushes(log: &Path) -> (usize, usize) {
    let text = std::fs::read_to_string(log).unwrap();
    // With -f a call can be split over two lines: "fsync(5 <unfinished ...>" and
    // "<... fsync resumed>) = 0".
    let ok = |call: &str| {
        let (whole, resumed) = (format!(" {call}("), format!("<... {call} resumed>"));
        text.lines()
            .filter(|l| (l.contains(&whole) || l.contains(&resumed)) && l.ends_with("= 0"))
            .count()
    };
    (ok("fdatasync"), ok("fsync"))
}

/// strace's arguments before the log file: follow threads, log the two flush calls.
const STRACE_ARGS: [&str; 5] = ["-f", "-qq", "-e", "trace=fdatasync,fsync", "-o"];

/// fastcp under strace, logging to `log`.
fn strace(log: &Path) -> Command {
    let mut cmd = Command::new(fastcp_testsupport::tools::require("strace"));
    cmd.args(STRACE_ARGS).arg(log).arg(BIN);
    cmd
}

#[test]
fn local_copy_flushes_every_file_and_directory_only_when_asked() {
    let work = tempfile::tempdir().unwrap();
    let src = work.path().join("src");
    build_mixed(&src);
    let files = files_in(&src);
    assert!(files > 3);

    let log = work.path().join("plain.log");
    let out = run(strace(&log)
        .arg("-r")
        .arg(&src)
        .arg(work.path().join("plain")));
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(flushes(&log), (0, 0), "no flush without --fsync");

    let log = work.path().join("fsync.log");
    let dst = work.path().join("synced");
    let out = run(strace(&log).args(["-r", "--fsync"]).arg(&src).arg(&dst));
    assert!(out.status.success(), "{}", stderr(&out));
    assert_same_tree(&src, &dst, false);
    let (datasyncs, syncs) = flushes(&log);
    assert_eq!(datasyncs, files, "one fdatasync per file");
    assert!(syncs >= 2, "the destination and its directories: {syncs}");
}

#[test]
fn push_flushes_on_the_server_and_pull_on_the_client() {
    let sshd = Sshd::start().unwrap();
    let work = tempfile::tempdir().unwrap();
    let src = work.path().join("src");
    build_mixed(&src);
    let files = files_in(&src);

    let server_log = work.path().join("server.log");
    let server = script(
        work.path(),
        "fastcp-strace",
        &format!(
            "exec strace {} '{}' '{BIN}' \"$@\"",
            STRACE_ARGS.join(" "),
            server_log.display()
        ),
    );
    let dst = work.path().join("pushed");
    let out = run(fastcp(&sshd, &server)
        .args(["-r", "--fsync", "--transport", "ssh"])
        .arg(&src)
        .arg(remote(&sshd, &dst)));
    assert!(out.status.success(), "{}", stderr(&out));
    assert_same_tree(&src, &dst, false);
    let (datasyncs, syncs) = flushes(&server_log);
    assert_eq!(datasyncs, files, "the receiving server flushes each file");
    assert!(syncs >= 2, "{syncs}");

    let client_log = work.path().join("client.log");
    let dst = work.path().join("pulled");
    let out = run(strace(&client_log)
        .arg("-F")
        .arg(sshd.ssh_config())
        .arg("--remote-path")
        .arg(BIN)
        .args(["-r", "--fsync", "--transport", "tcp"])
        .arg(remote(&sshd, &src))
        .arg(&dst)
        .env_remove("SSH_AUTH_SOCK"));
    assert!(out.status.success(), "{}", stderr(&out));
    assert_same_tree(&src, &dst, false);
    let (datasyncs, syncs) = flushes(&client_log);
    assert_eq!(datasyncs, files, "the receiving client flushes each file");
    assert!(syncs >= 2, "{syncs}");
}

/// Over SFTP a push asks the server to flush each file (`fsync@openssh.com`) before it
/// takes its final name, and only with `--fsync`: counted under sshd's own sftp-server.
#[test]
fn an_sftp_push_asks_the_server_to_flush_each_file() {
    let work = tempfile::tempdir().unwrap();
    let log = work.path().join("sftp-server.log");
    let sftp_server = fastcp_testsupport::tools::locate("sftp-server").unwrap();
    let strace = fastcp_testsupport::tools::require("strace");
    let wrapper = script(
        work.path(),
        "sftp-server-strace",
        // Each of the copy's SFTP sessions runs a server of its own, which logs to a file
        // of its own (`-ff`: LOG.PID).
        &format!(
            "exec '{}' -ff {} '{}' '{}' \"$@\"",
            strace.display(),
            STRACE_ARGS.join(" "),
            log.display(),
            sftp_server.display()
        ),
    );
    let sshd = Sshd::start_with_options(&format!("Subsystem sftp {}", wrapper.display())).unwrap();
    let src = work.path().join("src");
    // Names SFTP carries (`build_mixed` has one that is not UTF-8).
    fastcp_testsupport::tree::build_tiny(&src, 40);
    let files = files_in(&src);
    let logs = |remove: bool| {
        let mut syncs = 0;
        for e in std::fs::read_dir(work.path()).unwrap() {
            let path = e.unwrap().path();
            if path.to_string_lossy().contains("sftp-server.log.") {
                // A log of one process: its lines have no pid in front.
                let text = std::fs::read_to_string(&path).unwrap();
                syncs += text
                    .lines()
                    .filter(|l| {
                        (l.starts_with("fsync(") || l.starts_with("<... fsync resumed>"))
                            && l.ends_with("= 0")
                    })
                    .count();
                if remove {
                    std::fs::remove_file(&path).unwrap();
                }
            }
        }
        syncs
    };
    for fsync in [false, true] {
        logs(true);
        let dst = work.path().join(format!("pushed-{fsync}"));
        let mut cmd = Command::new(BIN);
        cmd.arg("-F")
            .arg(sshd.ssh_config())
            .args(["--sftp", "-r"])
            .env_remove("SSH_AUTH_SOCK");
        if fsync {
            cmd.arg("--fsync");
        }
        let out = run(cmd.arg(&src).arg(remote(&sshd, &dst)));
        assert!(out.status.success(), "{}", stderr(&out));
        assert_same_tree(&src, &dst, false);
        let syncs = logs(false);
        if fsync {
            assert!(syncs >= files, "{syncs} flushes for {files} files");
        } else {
            assert_eq!(syncs, 0, "no flush without --fsync");
        }
    }
}

/// With `--link-dest`, the folders the links went into are flushed too: a night whose files
/// are all links survives a power loss as one whose files were written.
#[test]
fn link_dest_flushes_the_folders_its_links_went_into() {
    let work = tempfile::tempdir().unwrap();
    let src = work.path().join("src");
    for dir in ["x", "y"] {
        std::fs::create_dir_all(src.join(dir)).unwrap();
        std::fs::write(src.join(dir).join("f"), dir).unwrap();
    }
    let out = run(Command::new(BIN)
        .args(["-r", "-p"])
        .arg(&src)
        .arg(work.path().join("day1")));
    assert!(out.status.success(), "{}", stderr(&out));
    let log = work.path().join("link.log");
    let out = run(Command::new(fastcp_testsupport::tools::require("strace"))
        .args(["-f", "-qq", "-y", "-e", "trace=fsync", "-o"])
        .arg(&log)
        .arg(BIN)
        .args(["-r", "--fsync", "--link-dest", "../day1"])
        .arg(&src)
        .arg(work.path().join("day2")));
    assert!(out.status.success(), "{}", stderr(&out));
    let text = std::fs::read_to_string(&log).unwrap();
    for dir in ["x", "y"] {
        use std::os::unix::fs::MetadataExt;
        let ino = |day: &str| {
            std::fs::metadata(work.path().join(day).join(dir).join("f"))
                .unwrap()
                .ino()
        };
        assert_eq!(ino("day1"), ino("day2"), "{dir}/f is a link");
        // A failed flush would have failed the copy.
        let synced = format!("day2/{dir}>");
        assert!(
            text.lines()
                .any(|l| l.contains(" fsync(") && l.contains(&synced)),
            "{dir} not flushed:\n{text}"
        );
    }
}
