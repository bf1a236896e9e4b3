//! The `fastcp` command line: flags, exit codes, the JSON summary, completions, the man page,
//! dry runs, compression, bandwidth limits and `fastcp doctor`.
//!
//! Remote cases run against a real OpenSSH sshd on 127.0.0.1 started by `fastcp-testsupport`
//! (temp host key, temp authorized_keys, free port), with the built `fastcp` as the remote
//! `fastcp server` through `--remote-path`. Nothing touches ~/.ssh.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use assert_cmd::Command;
use fastcp_testsupport::Sshd;
use fastcp_testsupport::tree::{assert_same_tree, build_mixed, pseudo_random, set_mtime, write};
use predicates::prelude::*;
use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_fastcp");

fn fastcp() -> Command {
    let mut cmd = Command::new(BIN);
    cmd.env_remove("SSH_AUTH_SOCK")
        .timeout(Duration::from_secs(300));
    cmd
}

/// A `fastcp` command set up for `sshd`: its ssh_config and the remote binary.
fn remote_fastcp(sshd: &Sshd) -> Command {
    let mut cmd = fastcp();
    cmd.arg("-F")
        .arg(sshd.ssh_config())
        .arg("--remote-path")
        .arg(BIN);
    cmd
}

fn remote(sshd: &Sshd, path: &Path) -> String {
    format!("{}:{}", sshd.alias(), path.display())
}

fn json_of(output: &std::process::Output) -> Value {
    serde_json::from_slice(&output.stdout).unwrap_or_else(|e| {
        panic!(
            "stdout is not JSON ({e}):\n{}\nstderr: {}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        )
    })
}

fn keys(v: &Value) -> BTreeSet<String> {
    v.as_object()
        .expect("a JSON object")
        .keys()
        .cloned()
        .collect()
}

/// An ssh_config for a host nothing listens on: connection refused.
fn dead_host_config(dir: &Path) -> PathBuf {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    // The listener is closed again: nothing listens on `port` now.
    let config = dir.join("ssh_config");
    std::fs::write(
        &config,
        format!(
            "Host dead\n  HostName 127.0.0.1\n  Port {port}\n  BatchMode yes\n  \
             UserKnownHostsFile {}\n  StrictHostKeyChecking yes\n",
            dir.join("known_hosts").display()
        ),
    )
    .unwrap();
    config
}

#[test]
fn usage_errors_exit_2() {
    let work = tempfile::tempdir().unwrap();
    let a = work.path().join("a");
    write(&a, b"a", 0o644);
    let a = a.to_str().unwrap();
    // Another source of the same name: with --resume they would share one partial file.
    std::fs::create_dir(work.path().join("other")).unwrap();
    write(&work.path().join("other/a"), b"other a", 0o644);
    let cases: &[&[&str]] = &[
        &["--resume", a, "other/a", "b/"],
        &["--no-such-flag", a, "b"],
        &[a],
        &["-l", "100", "--bwlimit", "1M", a, "b"],
        &["--bwlimit", "10 parsecs", a, "b"],
        &["-P", "notaport", a, "b"],
        &["--cipher", "rot13", a, "b"],
        &["--transport", "carrier-pigeon", a, "b"],
        &["completions", "cmd.exe"],
        // Between two remote hosts, what the relay does not do is said before connecting.
        &["-n", "hosta:x", "hostb:y"],
        &["--sftp", "hosta:x", "hostb:y"],
        &["--shard", "1/2", "hosta:x", "hostb:y"],
        &["--shard", "1/2", "--delete", a, "b"],
        &["--exclude", "[unclosed", a, "b"],
        &["--exclude-from", "no-such-rules", a, "b"],
        &["--files-from", "no-such-list", a, "b"],
    ];
    for args in cases {
        fastcp()
            .args(*args)
            .current_dir(work.path())
            .assert()
            .code(2)
            .stderr(predicate::str::is_empty().not());
        // With --json, the usage error's object comes too, found by clap or later.
        if args[0] != "completions" {
            let out = fastcp()
                .arg("--json")
                .args(*args)
                .current_dir(work.path())
                .assert()
                .code(2);
            let v = json_of(out.get_output());
            assert_eq!(
                (&v["exit_code"], &v["error_kind"], &v["fault"]),
                (&2.into(), &"usage".into(), &"user".into()),
                "{args:?}: {v}"
            );
            // Nothing was copied: no counts, whether clap, the command or the library
            // found the error.
            let usage_keys = ["version", "exit_code", "error", "error_kind", "fault"];
            assert_eq!(
                keys(&v),
                usage_keys.iter().map(|k| k.to_string()).collect(),
                "{args:?}: {v}"
            );
        }
    }
    assert!(!work.path().join("b").exists());
    // One operand: said plainly.
    fastcp()
        .arg(a)
        .assert()
        .code(2)
        .stderr(predicate::str::contains("a source and a target are needed"));
    // Options may come between the operands.
    fastcp()
        .args([a, "-q", "b"])
        .current_dir(work.path())
        .assert()
        .success();
    assert_eq!(std::fs::read(work.path().join("b")).unwrap(), b"a");
    std::fs::remove_file(work.path().join("b")).unwrap();
    // `--json` after `--` is an operand (a file of that name), and asks for no JSON.
    fastcp()
        .args(["--no-such-flag", a, "--", "--json"])
        .current_dir(work.path())
        .assert()
        .code(2)
        .stdout(predicate::str::is_empty());
}

/// Several sources onto a target that is not there: refused before anything is written, as
/// by `cp` and `scp -O`, with an error that says why a folder was needed, whichever way the
/// copy goes (SFTP's says so too).
#[test]
fn several_sources_onto_a_missing_target_say_why_a_folder_is_needed() {
    let work = tempfile::tempdir().unwrap();
    write(&work.path().join("a"), b"a", 0o644);
    write(&work.path().join("b"), b"b", 0o644);
    fastcp()
        .args(["a", "b", "missing"])
        .current_dir(work.path())
        .assert()
        .code(2)
        .stderr(predicate::str::contains(
            "missing: not a directory (several sources, or a trailing '/', need one)",
        ));
    assert!(!work.path().join("missing").exists());
}

/// The same refusal from the other end (a push onto a remote target that is not there)
/// says why, and adds no "see fastcp --help": the command's options were not the fault.
#[test]
fn several_sources_onto_a_missing_remote_target_say_why_without_the_help_hint() {
    let sshd = Sshd::start().unwrap();
    let work = tempfile::tempdir().unwrap();
    write(&work.path().join("a"), b"a", 0o644);
    write(&work.path().join("b"), b"b", 0o644);
    let missing = work.path().join("missing");
    for transport in ["ssh", "tcp"] {
        let out = remote_fastcp(&sshd)
            .args(["--transport", transport, "a", "b"])
            .arg(remote(&sshd, &missing))
            .current_dir(work.path())
            .output()
            .unwrap();
        let said = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{transport}: {said}");
        assert!(said.contains("need one)"), "{transport}: {said}");
        assert!(!said.contains("--help"), "{transport}: {said}");
        assert!(!missing.exists(), "{transport}");
    }
}

/// rsync's `-h` (`--human-readable`), as in `-avh`, is taken beside operands: the copy is
/// made (fastcp's sizes are human-readable already). Alone, `-h` is the help, as with rsync.
#[test]
fn dash_h_with_operands_copies_and_alone_is_the_help() {
    let work = tempfile::tempdir().unwrap();
    std::fs::create_dir(work.path().join("src")).unwrap();
    write(&work.path().join("src/a"), b"a", 0o644);
    fastcp()
        .args(["-avh", "src/.", "dest"])
        .current_dir(work.path())
        .assert()
        .success()
        .stdout(predicate::str::contains("Usage").not());
    assert_eq!(std::fs::read(work.path().join("dest/a")).unwrap(), b"a");
    fastcp()
        .args(["-h", "src", "dest2"])
        .arg("-r")
        .current_dir(work.path())
        .assert()
        .success();
    assert_eq!(std::fs::read(work.path().join("dest2/a")).unwrap(), b"a");
    fastcp()
        .arg("-h")
        .assert()
        .success()
        .stdout(predicate::str::contains("Usage: fastcp"));
    fastcp()
        .arg("--help")
        .assert()
        .success()
        .stdout(predicate::str::contains("Usage: fastcp"));
    // The commands keep their -h.
    fastcp()
        .args(["doctor", "-h"])
        .assert()
        .success()
        .stdout(predicate::str::contains("Usage: fastcp doctor"));
}

/// The rsync and scp flags fastcp does not take are refused with a usage error that names
/// what to use instead, and no misleading look-alike (`--inplace` is not `--include`).
#[test]
fn rsync_and_scp_flags_fastcp_lacks_name_the_alternative() {
    let work = tempfile::tempdir().unwrap();
    std::fs::create_dir(work.path().join("src")).unwrap();
    write(&work.path().join("src/a"), b"a", 0o644);
    let cases: &[(&[&str], &str)] = &[
        (&["-avz"], "-C"),
        (&["--compress"], "-C"),
        (&["-e", "ssh -p 2222"], "-S PROGRAM"),
        (&["--rsh=ssh"], "-S PROGRAM"),
        (&["--partial"], "--resume"),
        (&["--append-verify"], "--resume"),
        (&["--inplace"], "renamed"),
        (&["--rsync-path=/opt/bin/rsync"], "--remote-path"),
        (&["-R"], "-3"),
        (&["-avP"], "--resume --progress"),
    ];
    for (flags, alternative) in cases {
        fastcp()
            .args(*flags)
            .args(["src/.", "dest"])
            .current_dir(work.path())
            .assert()
            .code(2)
            .stderr(predicate::str::contains(*alternative))
            .stderr(predicate::str::contains("similar argument").not());
    }
    // rsync's -c is --checksum; scp's takes the next operand for a cipher.
    fastcp()
        .args(["-avc", "src/.", "dest"])
        .current_dir(work.path())
        .assert()
        .code(2)
        .stderr(predicate::str::contains("--checksum"));
    assert!(!work.path().join("dest").exists());
}

/// As scp's, `-P` takes a TCP service name (`ssh`) as well as a number, and refuses others.
#[test]
fn dash_p_takes_a_service_name() {
    if !std::fs::read_to_string("/etc/services").is_ok_and(|s| s.contains("22/tcp")) {
        eprintln!("/etc/services does not name ssh; skipping");
        return;
    }
    let work = tempfile::tempdir().unwrap();
    write(&work.path().join("a"), b"a", 0o644);
    fastcp()
        .args(["-P", "ssh", "a", "b"])
        .current_dir(work.path())
        .assert()
        .success();
    fastcp()
        .args(["-P", "no-such-service-here", "a", "c"])
        .current_dir(work.path())
        .assert()
        .code(2)
        .stderr(predicate::str::contains("bad port"));
}

/// A malformed `scp://` operand is refused as a usage error naming it, as scp refuses it
/// ("invalid uri"), and not read as a path on a host named `scp`.
#[test]
fn malformed_scp_uri_is_a_usage_error() {
    let work = tempfile::tempdir().unwrap();
    write(&work.path().join("a"), b"a", 0o644);
    for uri in [
        "scp://h/%zz",
        "scp://h:99999/x",
        "scp://h:abc/x",
        "scp:///x",
    ] {
        for args in [vec!["a", uri], vec![uri, "b"], vec!["doctor", uri]] {
            fastcp()
                .args(&args)
                .args(["-F", "none"])
                .current_dir(work.path())
                .assert()
                .code(2)
                .stderr(predicate::str::contains(format!(
                    "{uri}: invalid scp:// URI"
                )));
        }
    }
}

/// A file named like a command (`man`) is taken for the command, which scp has not: the
/// usage error says how to copy the file, and `./man` copies it.
/// `fastcp -r dir new/` makes `new` as a copy of `dir` when it does not exist, as scp and
/// `cp -r` do, on every path: local, push and pull between two fastcp ends, and over SFTP;
/// a file sent to a new `new/` fails and makes nothing.
#[test]
fn a_trailing_slash_destination_is_made_by_one_folder() {
    let sshd = Sshd::start().unwrap();
    let work = tempfile::tempdir().unwrap();
    let dir = work.path().join("dir");
    std::fs::create_dir_all(dir.join("sub")).unwrap();
    write(&dir.join("sub/f"), b"f", 0o644);
    write(&work.path().join("file"), b"x", 0o644);
    let slashed = |name: &str| format!("{}/", work.path().join(name).display());
    let remote_slashed = |name: &str| format!("{}:{}", sshd.alias(), slashed(name));
    let cases: [(&str, Vec<String>); 5] = [
        ("local", vec![dir.display().to_string(), slashed("local")]),
        (
            "push",
            vec![dir.display().to_string(), remote_slashed("push")],
        ),
        ("pull", vec![remote(&sshd, &dir), slashed("pull")]),
        (
            "sftp-push",
            vec![
                "--sftp".into(),
                dir.display().to_string(),
                remote_slashed("sftp-push"),
            ],
        ),
        (
            "sftp-pull",
            vec!["--sftp".into(), remote(&sshd, &dir), slashed("sftp-pull")],
        ),
    ];
    for (name, args) in cases {
        remote_fastcp(&sshd)
            .arg("-r")
            .args(&args)
            .assert()
            .success();
        let f = work.path().join(name).join("sub/f");
        assert_eq!(std::fs::read(&f).unwrap(), b"f", "{name}");
    }
    // A dry run says what the copy would do, and makes nothing.
    let out = remote_fastcp(&sshd)
        .args(["-r", "-n"])
        .arg(&dir)
        .arg(remote_slashed("dry"))
        .assert()
        .success();
    assert!(String::from_utf8_lossy(&out.get_output().stdout).contains("dir/sub/f"));
    assert!(!work.path().join("dry").exists());
    for dry_run in [false, true] {
        let mut cmd = remote_fastcp(&sshd);
        if dry_run {
            cmd.arg("-n");
        }
        cmd.arg(work.path().join("file"))
            .arg(remote_slashed("nofile"))
            .assert()
            .code(2)
            .stdout("")
            .stderr(predicate::str::contains("nofile/: not a directory"));
        assert!(!work.path().join("nofile").exists());
    }
}

/// `-F` given twice takes the last, as ssh and scp do (an alias that names one, then the
/// user's own).
#[test]
fn the_last_dash_f_wins() {
    let sshd = Sshd::start().unwrap();
    let work = tempfile::tempdir().unwrap();
    write(&work.path().join("a"), b"hello", 0o644);
    fastcp()
        .args(["-F", "/nonexistent/ssh_config", "-F"])
        .arg(sshd.ssh_config())
        .arg("--remote-path")
        .arg(BIN)
        .arg(work.path().join("a"))
        .arg(remote(&sshd, &work.path().join("b")))
        .assert()
        .success();
    assert_eq!(std::fs::read(work.path().join("b")).unwrap(), b"hello");
}

#[test]
fn a_file_named_like_a_command_is_copied_as_dot_slash_name() {
    let work = tempfile::tempdir().unwrap();
    write(&work.path().join("man"), b"a file", 0o644);
    fastcp()
        .args(["man", "copy"])
        .current_dir(work.path())
        .assert()
        .code(2)
        .stderr(predicate::str::contains("write ./man"));
    fastcp()
        .args(["./man", "copy"])
        .current_dir(work.path())
        .assert()
        .success();
    assert_eq!(std::fs::read(work.path().join("copy")).unwrap(), b"a file");
    // With no such file, nothing is said of one.
    let empty = tempfile::tempdir().unwrap();
    fastcp()
        .args(["man", "copy"])
        .current_dir(empty.path())
        .assert()
        .code(2)
        .stderr(predicate::str::contains("./man").not());
}

/// A stderr nobody reads any more (`fastcp -v a b 2>&1 | head -1`) loses the lines, not the
/// copy: the file is copied and the exit code is the copy's, not a panic's.
#[test]
fn a_closed_stderr_does_not_stop_the_copy() {
    let work = tempfile::tempdir().unwrap();
    let src = work.path().join("a");
    write(&src, b"kept", 0o644);
    for flag in ["-v", "--progress"] {
        let dst = work.path().join(format!("b{flag}"));
        let (reader, writer) = std::io::pipe().unwrap();
        drop(reader);
        let status = std::process::Command::new(BIN)
            .arg(flag)
            .arg(&src)
            .arg(&dst)
            .stdout(std::process::Stdio::null())
            .stderr(writer)
            .status()
            .unwrap();
        assert_eq!(status.code(), Some(0), "{flag}");
        assert_eq!(std::fs::read(&dst).unwrap(), b"kept", "{flag}");
    }
}

#[test]
fn help_names_every_flag_and_the_exit_codes() {
    let out = fastcp().arg("--help").assert().success();
    let help = String::from_utf8_lossy(&out.get_output().stdout).into_owned();
    for flag in [
        "-r",
        "-p",
        "-P <PORT>",
        "-i <IDENTITY>",
        "-J <JUMP>",
        "-F <SSH_CONFIG>",
        "-o <OPTION>",
        "-l <LIMIT>",
        "-q",
        "-v",
        "-C",
        "-n, --dry-run",
        "--bwlimit <RATE>",
        "--cipher",
        "--transport",
        "-j, --streams",
        "--json",
        "--progress",
        "doctor",
        "completions",
        "man",
    ] {
        assert!(help.contains(flag), "--help lacks {flag}:\n{help}");
    }
    for line in [
        "0    success",
        "1    some files failed",
        "2    usage error",
        "3    connection or authentication failure",
        "4    integrity failure",
        "5    some source files changed or vanished",
        "130  stopped by Ctrl-C",
    ] {
        assert!(help.contains(line), "--help lacks exit code {line:?}");
    }
}

#[test]
fn version_lists_the_crypto_providers() {
    fastcp()
        .arg("--version")
        .assert()
        .success()
        .stdout(predicate::str::contains(env!("CARGO_PKG_VERSION")))
        .stdout(predicate::str::contains(
            "crypto providers: ring, rustcrypto",
        ));
}

#[test]
fn completions_for_each_shell() {
    for (shell, marker) in [
        ("bash", "complete -F"),
        ("zsh", "#compdef fastcp"),
        ("fish", "complete -c fastcp"),
    ] {
        let out = fastcp().args(["completions", shell]).assert().success();
        let script = String::from_utf8_lossy(&out.get_output().stdout).into_owned();
        assert!(script.contains(marker), "{shell}: {script}");
        assert!(
            script.contains("bwlimit"),
            "{shell} completion lacks --bwlimit"
        );
        assert!(script.contains("doctor"), "{shell} completion lacks doctor");
    }
}

#[test]
fn man_page_is_generated_from_the_cli() {
    let out = fastcp().arg("man").assert().success();
    let page = String::from_utf8_lossy(&out.get_output().stdout).into_owned();
    assert!(
        page.starts_with(".ie") || page.contains(".TH fastcp"),
        "{page}"
    );
    for text in ["bwlimit", "dry\\-run", "doctor", "Exit codes", "SSH_CONFIG"] {
        assert!(page.contains(text), "the man page lacks {text:?}");
    }
    // The header names the version on its one line (`--version`'s provider lines are not
    // part of it).
    let header = page.lines().find(|l| l.starts_with(".TH")).unwrap();
    assert!(
        header.contains(concat!("fastcp ", env!("CARGO_PKG_VERSION"), "\"")),
        "{header}"
    );
    assert!(!page.contains("crypto providers"), "{page}");
}

/// `-C` on a copy within this machine says it is ignored (nothing goes over a network), and
/// the copy goes on.
#[test]
fn compress_on_a_local_copy_is_said_to_be_ignored() {
    let work = tempfile::tempdir().unwrap();
    let src = work.path().join("tree");
    build_mixed(&src);
    let dst = work.path().join("copy");
    let out = fastcp()
        .args(["-r", "-C"])
        .arg(&src)
        .arg(&dst)
        .assert()
        .success();
    let err = String::from_utf8_lossy(&out.get_output().stderr).into_owned();
    assert!(err.contains("warning: -C is ignored"), "{err}");
    assert_same_tree(&src, &dst, false);
}

#[test]
fn json_summary_of_a_local_copy() {
    let work = tempfile::tempdir().unwrap();
    let src = work.path().join("tree");
    build_mixed(&src);
    let dst = work.path().join("copy");
    let out = fastcp()
        .args(["-r", "-p", "--json"])
        .arg(&src)
        .arg(&dst)
        .assert()
        .success();
    let v = json_of(out.get_output());
    assert_same_tree(&src, &dst, true);
    let expected_bytes: u64 = walkdir_sizes(&src);
    assert_eq!(v["version"], 1);
    assert_eq!(v["exit_code"], 0);
    assert_eq!(v["dry_run"], false);
    assert_eq!(v["bytes"], expected_bytes);
    assert!(v["files"].as_u64().unwrap() > 0);
    assert!(v["seconds"].as_f64().unwrap() > 0.0);
    assert!(v["throughput_bytes_per_sec"].as_f64().unwrap() > 0.0);
    assert_eq!(v["transport"], "local");
    assert!(v["streams"].as_u64().unwrap() >= 1);
    assert_eq!(v["cipher"], Value::Null);
    assert_eq!(v["errors"], Value::Array(vec![]));
    assert_eq!(v["error_count"], 0);
    // The keys are the ones README.md documents, and in its order in the text.
    assert_eq!(keys(&v), keys(&readme_json_example()));
    let stdout = String::from_utf8_lossy(&out.get_output().stdout).into_owned();
    assert_eq!(
        top_level_keys(&stdout),
        top_level_keys(&readme_json_block())
    );
}

/// A copy of a tree of many folders, one of them deeper than the smallest cache, its rerun
/// (whose quick check runs on threads with folders of their own open), and a copy with
/// `--fsync` (which holds the folders written into) succeed under a low limit on open files
/// that the copy cannot raise: the directory caches are sized to the limit.
#[test]
fn many_folders_copy_under_a_low_open_file_limit() {
    let work = tempfile::tempdir().unwrap();
    let src = work.path().join("tree");
    for a in 0..30 {
        for b in 0..40 {
            let dir = src.join(format!("a{a:02}/b{b:02}"));
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(dir.join("f"), format!("{a} {b}")).unwrap();
        }
    }
    // Deeper than the smallest folder cache.
    let deep: PathBuf = (0..12).map(|i| format!("d{i}")).collect();
    std::fs::create_dir_all(src.join(&deep)).unwrap();
    std::fs::write(src.join(&deep).join("f"), b"deep").unwrap();
    let dst = work.path().join("copy");
    std::fs::create_dir(&dst).unwrap();
    let run = |extra: &[&str]| {
        // Soft and hard limit alike: the copy cannot raise it.
        let mut cmd = std::process::Command::new("sh");
        cmd.args(["-c", "ulimit -n 128 && exec \"$0\" \"$@\"", BIN])
            .args(["-r", "-p", "--json"])
            .args(extra)
            .arg(&src)
            .arg(&dst);
        let out = cmd.output().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        json_of(&out)
    };
    let first = run(&[]);
    assert_eq!(first["files"], 1201, "{first}");
    assert_same_tree(&src, &dst.join("tree"), true);
    let again = run(&["--skip-unchanged"]);
    assert_eq!(again["files_skipped"], 1201, "{again}");
    // A few folders, here and there, no longer as they were copied: a rerun, which checks
    // the folders on several threads, sets just those again.
    let there = dst.join("tree");
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::Permissions::from_mode(0o700);
    std::fs::set_permissions(there.join("a03/b07"), mode.clone()).unwrap();
    std::fs::set_permissions(there.join(&deep).parent().unwrap(), mode).unwrap();
    for folder in ["a17", "a29/b39", "a00/b00"] {
        set_mtime(&there.join(folder), 1_500_000_000, 0);
    }
    let fixed = run(&["--skip-unchanged"]);
    assert_eq!(fixed["files_skipped"], 1201, "{fixed}");
    assert_same_tree(&src, &there, true);
    // With --fsync, a writer holds the folders it wrote into until it flushes them.
    std::fs::remove_dir_all(dst.join("tree")).unwrap();
    let synced = run(&["--fsync"]);
    assert_eq!(synced["files"], 1201, "{synced}");
    assert_same_tree(&src, &dst.join("tree"), true);
}

/// A `--delete` refused because a source could not be read is said once, and the last line
/// counts the entries that failed, not the refusal beside them.
#[test]
fn a_refused_delete_is_not_counted_as_a_failed_entry() {
    let work = tempfile::tempdir().unwrap();
    let src = work.path().join("src");
    let dst = work.path().join("dst");
    std::fs::create_dir_all(&src).unwrap();
    std::fs::create_dir_all(dst.join("src")).unwrap();
    write(&src.join("a"), b"a", 0o644);
    write(&dst.join("src/extra"), b"extra", 0o644);
    fastcp()
        .args(["-r", "--delete"])
        .arg(&src)
        .arg(work.path().join("missing"))
        .arg(&dst)
        .assert()
        .code(1)
        .stderr(predicate::str::contains("nothing was deleted"))
        .stderr(predicate::str::contains(
            "fastcp: 1 of the entries could not be copied; the others were copied",
        ));
    assert!(dst.join("src/extra").exists());
    assert_eq!(std::fs::read(dst.join("src/a")).unwrap(), b"a");
}

/// `--delete` removes an extra folder nested deeper than 256 levels, as deep as a tree a
/// copy can make, and so does a file of the source that takes the place of such a folder.
#[test]
fn delete_removes_folders_nested_hundreds_of_levels_deep() {
    let work = tempfile::tempdir().unwrap();
    let src = work.path().join("src");
    std::fs::create_dir(&src).unwrap();
    write(&src.join("kept"), b"kept", 0o644);
    write(&src.join("was-a-folder"), b"now a file", 0o644);
    let dst = work.path().join("dst");
    for top in ["extra", "was-a-folder"] {
        let deep: PathBuf = std::iter::once(top.to_string())
            .chain((0..300).map(|_| "d".to_string()))
            .collect();
        std::fs::create_dir_all(dst.join(&deep)).unwrap();
        std::fs::write(dst.join(&deep).join("f"), b"deep").unwrap();
    }
    let out = fastcp()
        .args(["-r", "--delete", "--json"])
        .arg(src.join("."))
        .arg(&dst)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Each folder: itself, 300 levels and the file at the bottom.
    assert_eq!(json_of(&out)["files_deleted"], 2 * 302, "{}", json_of(&out));
    assert_same_tree(&src, &dst, false);
}

/// The top-level keys of pretty-printed JSON, in the order the text has them.
fn top_level_keys(text: &str) -> Vec<String> {
    text.lines()
        .filter_map(|l| l.strip_prefix("  \""))
        .filter_map(|l| l.split_once('"').map(|(k, _)| k.to_owned()))
        .collect()
}

/// Total size of the regular files under `root`.
fn walkdir_sizes(root: &Path) -> u64 {
    let mut total = 0;
    for entry in std::fs::read_dir(root).unwrap() {
        let entry = entry.unwrap();
        let meta = std::fs::symlink_metadata(entry.path()).unwrap();
        if meta.is_dir() {
            total += walkdir_sizes(&entry.path());
        } else if meta.is_file() {
            total += meta.len();
        }
    }
    total
}

/// The JSON example under README.md's "JSON summary" heading.
fn readme_json_example() -> Value {
    serde_json::from_str(&readme_json_block()).expect("the README example is valid JSON")
}

/// The text of that example.
fn readme_json_block() -> String {
    let readme =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md")).unwrap();
    let section = readme
        .split("### JSON summary")
        .nth(1)
        .expect("README.md has a \"### JSON summary\" section");
    let block = section
        .split("```json\n")
        .nth(1)
        .and_then(|b| b.split("```").next())
        .expect("a ```json block in that section");
    block.to_owned()
}

#[test]
fn some_files_failing_exits_1_and_names_them() {
    let work = tempfile::tempdir().unwrap();
    let good = work.path().join("good.txt");
    write(&good, b"fine", 0o644);
    let missing = work.path().join("missing.txt");
    let into = work.path().join("into");
    std::fs::create_dir(&into).unwrap();
    let out = fastcp()
        .arg("--json")
        .arg(&good)
        .arg(&missing)
        .arg(format!("{}/", into.display()))
        .assert()
        .code(1)
        .stderr(predicate::str::contains(
            "missing.txt: no such file or directory",
        ));
    assert_eq!(std::fs::read(into.join("good.txt")).unwrap(), b"fine");
    assert!(!into.join("missing.txt").exists());
    let v = json_of(out.get_output());
    assert_eq!(v["exit_code"], 1);
    assert_eq!(v["files"], 1);
    assert_eq!(v["error_count"], 1);
    let error = &v["errors"][0];
    assert_eq!(error["code"], "not_found");
    assert_eq!(error["side"], "sender");
    assert!(error["message"].as_str().unwrap().contains("missing.txt"));
    // The failure is printed once, and the last line counts what was done.
    let err = String::from_utf8_lossy(&out.get_output().stderr);
    assert_eq!(err.matches("no such file").count(), 1, "{err}");
    assert!(err.contains("1 of the entries could not be copied; the others were copied"));
    // When every entry failed, it does not say that others were copied.
    fastcp()
        .arg(&missing)
        .arg(format!("{}/", into.display()))
        .assert()
        .code(1)
        .stderr(predicate::str::contains(
            "nothing was copied: 1 entry failed",
        ))
        .stderr(predicate::str::contains("the others").not());
}

#[test]
fn dry_run_lists_and_writes_nothing() {
    let work = tempfile::tempdir().unwrap();
    let src = work.path().join("src");
    std::fs::create_dir_all(src.join("sub")).unwrap();
    write(&src.join("a.txt"), b"aaaa", 0o644);
    write(&src.join("sub/b.bin"), &[1u8; 1000], 0o644);
    std::os::unix::fs::symlink("a.txt", src.join("link")).unwrap();
    let dst = work.path().join("dst");
    let out = fastcp()
        .args(["-r", "-n"])
        .arg(&src)
        .arg(&dst)
        .assert()
        .success();
    assert_eq!(
        String::from_utf8_lossy(&out.get_output().stdout),
        "src/\nsrc/a.txt\nsrc/link -> a.txt\nsrc/sub/\nsrc/sub/b.bin\n"
    );
    assert!(!dst.exists());

    let out = fastcp()
        .args(["-r", "--dry-run", "--json"])
        .arg(&src)
        .arg(&dst)
        .assert()
        .success();
    let v = json_of(out.get_output());
    assert_eq!(v["dry_run"], true);
    assert_eq!(v["files"], 2);
    assert_eq!(v["bytes"], 1004);
    let entries = v["entries"].as_array().unwrap();
    assert_eq!(entries.len(), 5);
    assert_eq!(entries[4]["path"], "src/sub/b.bin");
    assert_eq!(entries[4]["kind"], "file");
    assert_eq!(entries[4]["size"], 1000);
    assert!(!dst.exists());
}

#[test]
fn connection_refused_exits_3() {
    let work = tempfile::tempdir().unwrap();
    let config = dead_host_config(work.path());
    let a = work.path().join("a");
    write(&a, b"x", 0o644);
    fastcp()
        .arg("-F")
        .arg(&config)
        .arg(&a)
        .arg("dead:/tmp/never")
        .assert()
        .code(3)
        .stderr(predicate::str::contains("Connection refused"))
        .stderr(predicate::str::contains("fastcp -v shows"));
    // Given -v already, it is not suggested again.
    fastcp()
        .args(["-v", "-F"])
        .arg(&config)
        .arg(&a)
        .arg("dead:/tmp/never")
        .assert()
        .code(3)
        .stderr(predicate::str::contains("Connection refused"))
        .stderr(predicate::str::contains("fastcp -v shows").not());
    let out = fastcp()
        .arg("-F")
        .arg(&config)
        .arg("--json")
        .arg("dead:x")
        .arg(work.path().join("b"))
        .assert()
        .code(3);
    let v = json_of(out.get_output());
    assert_eq!(v["exit_code"], 3);
    assert!(v["error"].as_str().unwrap().contains("Connection refused"));
    assert_eq!(
        (&v["error_kind"], &v["fault"]),
        (&"connect".into(), &"network".into())
    );
    // Nothing was done, and the object says so.
    assert_eq!((&v["files"], &v["bytes"]), (&0.into(), &0.into()), "{v}");
    assert!(!work.path().join("b").exists());
}

/// Rate limits are checked from below only: the copy cannot beat the limit.
fn assert_took_at_least(started: Instant, bytes: u64, rate: u64) {
    // The bucket lets one write (a tenth of a second's worth) through ahead of time.
    let floor = Duration::from_secs_f64(bytes as f64 / rate as f64 * 0.85);
    let took = started.elapsed();
    assert!(
        took >= floor,
        "{bytes} bytes at {rate} B/s took {took:?}, less than {floor:?}"
    );
}

#[test]
fn bwlimit_and_scp_l_limit_a_local_copy() {
    let work = tempfile::tempdir().unwrap();
    let src = work.path().join("data");
    let size = 768 * 1024;
    write(&src, &pseudo_random(size, 1), 0o644);
    // --bwlimit 256K: 256 KiB/s, rsync's meaning.
    let started = Instant::now();
    fastcp()
        .args(["--bwlimit", "256K"])
        .arg(&src)
        .arg(work.path().join("a"))
        .assert()
        .success();
    assert_took_at_least(started, size as u64, 256 * 1024);
    assert_eq!(std::fs::read(work.path().join("a")).unwrap().len(), size);
    // -l 2048: 2048 Kbit/s = 256 KiB/s, scp's meaning.
    let started = Instant::now();
    fastcp()
        .args(["-l", "2048"])
        .arg(&src)
        .arg(work.path().join("b"))
        .assert()
        .success();
    assert_took_at_least(started, size as u64, 256 * 1024);
    assert_eq!(std::fs::read(work.path().join("b")).unwrap().len(), size);
}

#[test]
fn progress_lines_off_a_terminal_and_quiet() {
    let work = tempfile::tempdir().unwrap();
    let src = work.path().join("data");
    write(&src, &pseudo_random(1536 * 1024, 2), 0o644);
    // Off a terminal (the test captures stderr), --progress prints plain lines.
    let out = fastcp()
        .args(["--progress", "--bwlimit", "512K"])
        .arg(&src)
        .arg(work.path().join("a"))
        .assert()
        .success();
    let err = String::from_utf8_lossy(&out.get_output().stderr).into_owned();
    let lines: Vec<&str> = err.lines().collect();
    assert!(
        lines.len() >= 2,
        "expected periodic lines and a last one:\n{err}"
    );
    assert!(lines.iter().all(|l| l.starts_with("fastcp: ")), "{err}");
    // The rate and the total (known once the walk is done; the file is alone).
    assert!(
        lines[0].contains("/s") && lines[0].contains("of 1.50 MiB"),
        "{err}"
    );
    assert!(
        lines
            .last()
            .unwrap()
            .starts_with("fastcp: 100% 1.50 MiB in 1 files"),
        "{err}"
    );
    // Without --progress nothing, and -q is silent even with it.
    for args in [&[][..], &["-q", "--progress"][..]] {
        fastcp()
            .args(args)
            .arg(&src)
            .arg(work.path().join("b"))
            .assert()
            .success()
            .stderr("")
            .stdout("");
    }
}

#[test]
fn compression_round_trip_over_sshd() {
    let sshd = Sshd::start().unwrap();
    let work = tempfile::tempdir().unwrap();
    let src = work.path().join("tree");
    build_mixed(&src);
    // Something that compresses, and something that does not.
    write(
        &src.join("text.log"),
        &b"a line of text that repeats\n".repeat(100_000),
        0o644,
    );
    write(&src.join("noise.bin"), &pseudo_random(3 << 20, 9), 0o644);
    for transport in ["ssh", "tcp"] {
        let pushed = work.path().join(format!("pushed-{transport}"));
        let out = remote_fastcp(&sshd)
            .args(["-C", "-r", "-p", "--json", "--transport", transport])
            .arg(&src)
            .arg(remote(&sshd, &pushed))
            .assert()
            .success();
        let v = json_of(out.get_output());
        assert_eq!(v["compression"], "zstd");
        assert_eq!(v["transport"], transport);
        assert_same_tree(&src, &pushed, true);

        let pulled = work.path().join(format!("pulled-{transport}"));
        let out = remote_fastcp(&sshd)
            .args([
                "-C",
                "-r",
                "-p",
                "--json",
                "--transport",
                transport,
                "-j",
                "2",
            ])
            .arg(remote(&sshd, &pushed))
            .arg(&pulled)
            .assert()
            .success();
        assert_eq!(json_of(out.get_output())["compression"], "zstd");
        assert_same_tree(&src, &pulled, true);
    }
    // Without -C nothing is compressed.
    let plain = work.path().join("plain");
    let out = remote_fastcp(&sshd)
        .args(["-r", "--json"])
        .arg(&src)
        .arg(remote(&sshd, &plain))
        .assert()
        .success();
    assert_eq!(json_of(out.get_output())["compression"], Value::Null);
}

#[test]
fn remote_json_names_transport_cipher_and_provider() {
    let sshd = Sshd::start().unwrap();
    let work = tempfile::tempdir().unwrap();
    let a = work.path().join("a.bin");
    write(&a, &pseudo_random(100_000, 3), 0o644);
    let out = remote_fastcp(&sshd)
        .args([
            "--json",
            "--transport",
            "tcp",
            "--cipher",
            "chacha20-poly1305",
            "-j",
            "3",
        ])
        .arg(&a)
        .arg(remote(&sshd, &work.path().join("b.bin")))
        .assert()
        .success();
    let v = json_of(out.get_output());
    assert_eq!(v["transport"], "tcp");
    assert_eq!(v["cipher"], "chacha20-poly1305");
    assert!(v["provider"].is_string());
    assert_eq!(v["streams"], 3);
    assert_eq!(v["remote"], format!("fastcp {}", env!("CARGO_PKG_VERSION")));
    assert_eq!(v["bytes"], 100_000);
    assert_eq!(keys(&v), keys(&readme_json_example()));
}

/// A push whose one file cannot take its name on the remote (a folder with entries is in its
/// way) counts in `--json` only what arrived there, over sealed TCP and over SSH alike: the
/// failed file was read and sent, but it was not copied.
#[test]
fn a_push_counts_only_the_files_that_arrived() {
    let sshd = Sshd::start().unwrap();
    let work = tempfile::tempdir().unwrap();
    let src = work.path().join("src");
    std::fs::create_dir(&src).unwrap();
    write(&src.join("a"), &pseudo_random(1000, 1), 0o644);
    write(&src.join("b"), &pseudo_random(3 << 20, 2), 0o644);
    write(&src.join("c"), &pseudo_random(5000, 3), 0o644);
    for transport in ["tcp", "ssh"] {
        let dst = work.path().join(format!("dst-{transport}"));
        std::fs::create_dir_all(dst.join("src/b/inner")).unwrap();
        std::fs::write(dst.join("src/b/inner/x"), b"x").unwrap();
        let out = remote_fastcp(&sshd)
            .args(["-r", "--json", "--transport", transport])
            .arg(&src)
            .arg(remote(&sshd, &dst))
            .assert()
            .code(1);
        let v = json_of(out.get_output());
        assert_eq!(v["error_count"], 1, "{transport}: {v}");
        assert_eq!(v["errors"][0]["path"], "src/b", "{transport}: {v}");
        assert_eq!(v["files"], 2, "{transport}: {v}");
        assert_eq!(v["bytes"], 6000, "{transport}: {v}");
        assert_eq!(v["dirs"], 1, "{transport}: {v}");
        assert_eq!(
            std::fs::read(dst.join("src/c")).unwrap(),
            pseudo_random(5000, 3)
        );
    }
}

#[test]
fn dry_run_over_sshd_writes_nothing() {
    let sshd = Sshd::start().unwrap();
    let work = tempfile::tempdir().unwrap();
    let src = work.path().join("src");
    std::fs::create_dir_all(src.join("deep")).unwrap();
    write(&src.join("one"), b"1", 0o644);
    write(&src.join("deep/two"), b"22", 0o644);
    // Pull: the server lists.
    let dst = work.path().join("dst");
    let out = remote_fastcp(&sshd)
        .args(["-r", "-n"])
        .arg(remote(&sshd, &src))
        .arg(&dst)
        .assert()
        .success();
    assert_eq!(
        String::from_utf8_lossy(&out.get_output().stdout),
        "src/\nsrc/deep/\nsrc/deep/two\nsrc/one\n"
    );
    assert!(!dst.exists());
    // A missing remote source is listed as a failure.
    remote_fastcp(&sshd)
        .args(["-r", "-n"])
        .arg(remote(&sshd, &work.path().join("nope")))
        .arg(&dst)
        .assert()
        .code(1)
        .stderr(predicate::str::contains("nope: no such file or directory"));
    // Push: the client lists, the server only checks the target.
    let out = remote_fastcp(&sshd)
        .args(["-r", "-n"])
        .arg(&src)
        .arg(remote(&sshd, &dst))
        .assert()
        .success();
    assert!(String::from_utf8_lossy(&out.get_output().stdout).contains("src/deep/two\n"));
    assert!(!dst.exists());
    // A trailing '/' names a folder the copy would make: listed, still not made.
    remote_fastcp(&sshd)
        .args(["-r", "-n"])
        .arg(&src)
        .arg(format!("{}/", remote(&sshd, &dst)))
        .assert()
        .success();
    assert!(!dst.exists());
    // Where a file has that name, the target is refused.
    write(&dst, b"a file", 0o644);
    remote_fastcp(&sshd)
        .args(["-r", "-n"])
        .arg(&src)
        .arg(format!("{}/", remote(&sshd, &dst)))
        .assert()
        .code(1)
        .stderr(predicate::str::contains("not a directory"));
    assert_eq!(std::fs::read(&dst).unwrap(), b"a file");
}

/// `--bwlimit` holds both ways over both transports, and a rate so low that one chunk takes
/// longer than `--timeout` to cross is progress, not a stall: the bytes count as they move.
#[test]
fn bwlimit_limits_copies_over_sshd_without_tripping_the_timeout() {
    let sshd = Sshd::start().unwrap();
    let work = tempfile::tempdir().unwrap();
    let src = work.path().join("data");
    let size = 1 << 20;
    write(&src, &pseudo_random(size, 4), 0o644);
    for transport in ["ssh", "tcp"] {
        let pushed = work.path().join(format!("pushed-{transport}"));
        let pulled = work.path().join(format!("pulled-{transport}"));
        for (from, to, copy) in [
            (src.display().to_string(), remote(&sshd, &pushed), &pushed),
            (remote(&sshd, &src), pulled.display().to_string(), &pulled),
        ] {
            let started = Instant::now();
            // A 1 MiB chunk takes 4 s at this rate, twice the timeout.
            remote_fastcp(&sshd)
                .args([
                    "--bwlimit",
                    "256K",
                    "--timeout",
                    "2",
                    "--transport",
                    transport,
                ])
                .arg(&from)
                .arg(&to)
                .assert()
                .success();
            assert_took_at_least(started, size as u64, 256 * 1024);
            assert_eq!(std::fs::read(copy).unwrap(), std::fs::read(&src).unwrap());
        }
    }
}

/// With `-C` the bytes count on the wire, beneath the compression: a compressed block of
/// random data takes longer than `--timeout` to cross at this rate, and still is progress.
#[test]
fn bwlimit_with_compression_does_not_trip_the_timeout() {
    let sshd = Sshd::start().unwrap();
    let work = tempfile::tempdir().unwrap();
    let src = work.path().join("data");
    let size = 256 << 10;
    write(&src, &pseudo_random(size, 5), 0o644);
    let (pushed, pulled) = (work.path().join("pushed"), work.path().join("pulled"));
    for (from, to, copy) in [
        (src.display().to_string(), remote(&sshd, &pushed), &pushed),
        (remote(&sshd, &src), pulled.display().to_string(), &pulled),
    ] {
        // 128 KiB, one block of zstd's, takes 4 s at this rate: twice the timeout.
        remote_fastcp(&sshd)
            .args([
                "-C",
                "--bwlimit",
                "32K",
                "--timeout",
                "2",
                "--transport",
                "tcp",
            ])
            .arg(&from)
            .arg(&to)
            .assert()
            .success();
        assert_eq!(std::fs::read(copy).unwrap(), std::fs::read(&src).unwrap());
    }
}

#[test]
fn verbose_tells_the_steps_and_choices() {
    let sshd = Sshd::start().unwrap();
    let work = tempfile::tempdir().unwrap();
    let a = work.path().join("a");
    write(&a, b"hello", 0o644);
    let out = remote_fastcp(&sshd)
        .args(["-v", "--transport", "tcp"])
        .arg(&a)
        .arg(remote(&sshd, &work.path().join("b")))
        .assert()
        .success();
    let err = String::from_utf8_lossy(&out.get_output().stderr).into_owned();
    for step in [
        "connecting to host",
        "authenticated to 127.0.0.1",
        "transport: sealed TCP",
        "remote: fastcp",
        "cipher: ",
    ] {
        assert!(err.contains(step), "-v lacks {step:?}:\n{err}");
    }
    // Without -v: nothing on stderr.
    remote_fastcp(&sshd)
        .arg(&a)
        .arg(remote(&sshd, &work.path().join("c")))
        .assert()
        .success()
        .stderr("");
}

/// As scp: flags given twice are taken once, and `-P` given twice connects to the last port.
#[test]
fn repeated_flags_are_taken_as_scp_takes_them() {
    let sshd = Sshd::start().unwrap();
    let work = tempfile::tempdir().unwrap();
    let dead = dead_host_config(work.path());
    let dead_port = std::fs::read_to_string(&dead)
        .unwrap()
        .lines()
        .find_map(|l| l.trim().strip_prefix("Port ").map(str::to_owned))
        .unwrap();
    let src = work.path().join("src");
    std::fs::create_dir(&src).unwrap();
    write(&src.join("f"), b"x", 0o644);
    let port = sshd.port().to_string();
    remote_fastcp(&sshd)
        .args(["-q", "-q", "-r", "-r", "-p", "-p", "-C", "-C"])
        .args(["-P", &dead_port, "-P", &port])
        .arg(&src)
        .arg(remote(&sshd, &work.path().join("dst")))
        .assert()
        .success()
        .stderr("");
    assert_eq!(std::fs::read(work.path().join("dst/f")).unwrap(), b"x");
    // The last port is the one: the first alone would fail.
    remote_fastcp(&sshd)
        .args(["-P", &port, "-P", &dead_port])
        .arg(src.join("f"))
        .arg(remote(&sshd, &work.path().join("g")))
        .assert()
        .code(3)
        .stderr(predicate::str::contains(format!("port {dead_port}")));
}

#[test]
fn ssh_o_option_is_applied() {
    let sshd = Sshd::start().unwrap();
    let work = tempfile::tempdir().unwrap();
    let dead = dead_host_config(work.path());
    let dead_port = std::fs::read_to_string(&dead)
        .unwrap()
        .lines()
        .find_map(|l| l.trim().strip_prefix("Port ").map(str::to_owned))
        .unwrap();
    let a = work.path().join("a");
    write(&a, b"x", 0o644);
    // The config's port works; -o Port= overrides it.
    remote_fastcp(&sshd)
        .args(["-o", &format!("Port={dead_port}")])
        .arg(&a)
        .arg(remote(&sshd, &work.path().join("b")))
        .assert()
        .code(3)
        .stderr(predicate::str::contains(format!("port {dead_port}")));
    assert!(!work.path().join("b").exists());
    remote_fastcp(&sshd)
        .args(["-o", "ConnectTimeout=20"])
        .arg(&a)
        .arg(remote(&sshd, &work.path().join("b")))
        .assert()
        .success();
}

#[test]
fn doctor_reports_versions_cpus_choices_and_throughput() {
    let sshd = Sshd::start().unwrap();
    let doctor = || {
        let mut cmd = fastcp();
        cmd.arg("doctor")
            .arg("-F")
            .arg(sshd.ssh_config())
            .arg("--remote-path")
            .arg(BIN);
        cmd
    };
    let out = doctor()
        .args(["--seconds", "1", "--json"])
        .arg(sshd.alias())
        .assert()
        .success()
        // The server takes a client that leaves after the hellos as a clean goodbye.
        .stderr("");
    let v = json_of(out.get_output());
    let version = format!("fastcp {}", env!("CARGO_PKG_VERSION"));
    assert_eq!(v["remote"]["software"], version);
    assert_eq!(v["local"]["software"], version);
    assert!(v["remote"]["cpu_features"].is_array());
    assert!(v["local"]["cpu_features"].is_array());
    assert!(
        v["remote"]["compression"]
            .as_array()
            .unwrap()
            .contains(&Value::from("zstd"))
    );
    assert!(v["cipher"].is_string() && v["provider"].is_string());
    assert_eq!(v["transport"], "tcp");
    let t = &v["throughput"];
    assert_eq!(t["transport"], "tcp");
    assert!(t["bytes"].as_u64().unwrap() > 0);
    assert!(t["seconds"].as_f64().unwrap() >= 1.0);
    assert!(t["bytes_per_sec"].as_f64().unwrap() > 0.0);

    // The text report, over SSH channels this time.
    let out = doctor()
        .args(["--seconds", "0.5", "--transport", "ssh"])
        .arg(sshd.alias())
        .assert()
        .success()
        .stderr("");
    let text = String::from_utf8_lossy(&out.get_output().stdout).into_owned();
    for line in [
        "remote:",
        "cipher:",
        "transport:   SSH channels",
        "throughput:",
        "over ssh",
    ] {
        assert!(text.contains(line), "doctor lacks {line:?}:\n{text}");
    }
    assert!(text.contains(&version), "{text}");

    // A host nothing listens on: exit 3.
    let work = tempfile::tempdir().unwrap();
    fastcp()
        .arg("doctor")
        .arg("-F")
        .arg(dead_host_config(work.path()))
        .arg("dead")
        .assert()
        .code(3);
}

#[test]
fn integrity_failure_exits_4_and_keeps_nothing() {
    let sshd = Sshd::start().unwrap();
    let work = tempfile::tempdir().unwrap();
    let src = work.path().join("data");
    write(&src, &vec![0u8; 2 << 20], 0o644);
    // A remote "fastcp" whose output flips one byte deep inside the file's data (the frames
    // around it stay intact), as a faulty link or a broken disk would.
    let corrupt = work.path().join("corrupting-fastcp");
    std::fs::write(
        &corrupt,
        format!(
            "#!/bin/sh\n'{BIN}' \"$@\" | perl -e '\
             my ($off, $at) = (0, 1500000);\
             while (my $n = sysread(STDIN, my $buf, 65536)) {{\
               if ($at >= $off && $at < $off + $n) {{\
                 substr($buf, $at - $off, 1) = chr(ord(substr($buf, $at - $off, 1)) ^ 0xff) }}\
               $off += $n; my $w = 0;\
               while ($w < $n) {{ $w += syswrite(STDOUT, $buf, $n - $w, $w) }} }}'\n"
        ),
    )
    .unwrap();
    std::fs::set_permissions(
        &corrupt,
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let copy = work.path().join("copy");
    fastcp()
        .arg("-F")
        .arg(sshd.ssh_config())
        .arg("--remote-path")
        .arg(&corrupt)
        .args(["--transport", "ssh", "-j", "1"])
        .arg(remote(&sshd, &src))
        .arg(&copy)
        .assert()
        .code(4)
        .stderr(predicate::str::contains("checksum mismatch"));
    assert!(!copy.exists());
}

#[test]
fn compression_falls_back_with_a_note_when_the_server_lacks_zstd() {
    let sshd = Sshd::start().unwrap();
    let work = tempfile::tempdir().unwrap();
    // A remote "fastcp" whose hello offers compression ids [0, 0] instead of [0, 1], as a
    // build without zstd would: the length-prefixed list is rewritten in place.
    let old = work.path().join("fastcp-without-zstd");
    std::fs::write(
        &old,
        format!(
            "#!/bin/sh\n'{BIN}' \"$@\" | perl -e '\
             my $first = 1;\
             while (my $n = sysread(STDIN, my $buf, 65536)) {{\
               if ($first) {{ $buf =~ s/\\x00\\x00\\x00\\x02\\x00\\x01/\\x00\\x00\\x00\\x02\\x00\\x00/; $first = 0 }}\
               my $w = 0; while ($w < $n) {{ $w += syswrite(STDOUT, $buf, $n - $w, $w) }} }}'\n"
        ),
    )
    .unwrap();
    std::fs::set_permissions(&old, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let doctor = fastcp()
        .arg("doctor")
        .arg("-F")
        .arg(sshd.ssh_config())
        .arg("--remote-path")
        .arg(&old)
        .args(["--seconds", "0", "--json"])
        .arg(sshd.alias())
        .assert()
        .success();
    assert_eq!(
        json_of(doctor.get_output())["remote"]["compression"],
        serde_json::json!(["none", "none"])
    );
    let a = work.path().join("a.txt");
    write(&a, &b"compressible ".repeat(10_000), 0o644);
    let b = work.path().join("b.txt");
    let out = fastcp()
        .arg("-F")
        .arg(sshd.ssh_config())
        .arg("--remote-path")
        .arg(&old)
        .args(["-C", "--json", "--transport", "ssh", "-j", "1"])
        .arg(&a)
        .arg(remote(&sshd, &b))
        .assert()
        .success()
        .stderr(predicate::str::contains(
            "does not offer zstd compression; copying uncompressed",
        ));
    assert_eq!(json_of(out.get_output())["compression"], Value::Null);
    assert_eq!(std::fs::read(&a).unwrap(), std::fs::read(&b).unwrap());
}

/// A source that changes while it is read is reported with its own exit code (5, as rsync's
/// 24) and code `source_changed`, locally and when a remote sender reads it; it is not kept.
#[test]
fn a_source_changed_while_read_exits_5() {
    // A procfs file says it has 0 bytes, then reads as many: it "grew" while being read.
    let work = tempfile::tempdir().unwrap();
    let dst = work.path().join("stat");
    let out = fastcp()
        .args(["--json", "/proc/self/stat"])
        .arg(&dst)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(5), "{out:?}");
    let v = json_of(&out);
    assert_eq!(v["errors"][0]["code"], "source_changed", "{v}");
    assert!(!dst.exists());

    let sshd = Sshd::start().unwrap();
    let out = remote_fastcp(&sshd)
        .arg(format!("{}:/proc/self/stat", sshd.alias()))
        .arg(&dst)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(5), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("changed while being read"),
        "{out:?}"
    );
    assert!(!dst.exists());
}

/// A failed entry's name is escaped once in its line: a newline in it shows as `\n`, not
/// `\\n`.
#[test]
fn a_failure_line_escapes_a_name_once() {
    let work = tempfile::tempdir().unwrap();
    let src = work.path().join("src");
    std::fs::create_dir(&src).unwrap();
    write(&src.join("new\nline"), b"x", 0o644);
    // A folder, not empty, where the file would go: that entry fails.
    let dst = work.path().join("dst");
    std::fs::create_dir_all(dst.join("src/new\nline")).unwrap();
    write(&dst.join("src/new\nline/inside"), b"in the way", 0o644);
    let out = fastcp().arg("-r").arg(&src).arg(&dst).assert().code(1);
    let err = String::from_utf8_lossy(&out.get_output().stderr).into_owned();
    assert!(err.contains("src/new\\nline"), "{err}");
    assert!(!err.contains("new\\\\nline"), "{err}");
}

/// A path on the command line need not be UTF-8, as with scp and cp: a local one is copied
/// by its bytes; a remote one, which travels as text, is refused with a usage error.
#[test]
fn operands_that_are_not_utf8() {
    use std::ffi::OsStr;
    use std::os::unix::ffi::OsStrExt;
    let work = tempfile::tempdir().unwrap();
    let odd = work.path().join(OsStr::from_bytes(b"caf\xe9.txt"));
    write(&odd, b"latin-1 name", 0o644);
    let copy = work.path().join(OsStr::from_bytes(b"copy-\xff"));
    fastcp().arg(&odd).arg(&copy).assert().success();
    assert_eq!(std::fs::read(&copy).unwrap(), b"latin-1 name");
    fastcp()
        .arg(&odd)
        .arg(OsStr::from_bytes(b"somehost:caf\xe9"))
        .assert()
        .code(2)
        .stderr(predicate::str::contains("must be UTF-8"));

    // Nor need the name of a rules file, nor the names a --files-from list gives.
    let tree = work.path().join("tree");
    std::fs::create_dir(&tree).unwrap();
    write(&tree.join(OsStr::from_bytes(b"na\xefve")), b"listed", 0o644);
    write(&tree.join("other.log"), b"excluded", 0o644);
    write(&tree.join("plain"), b"unlisted", 0o644);
    let rules = work.path().join(OsStr::from_bytes(b"r\xe8gles"));
    std::fs::write(&rules, "- *.log\n").unwrap();
    let list = work.path().join("list");
    std::fs::write(&list, b"na\xefve\nother.log\n").unwrap();
    let out_dir = work.path().join("out");
    fastcp()
        .arg("-r")
        .arg("--exclude-from")
        .arg(&rules)
        .arg("--files-from")
        .arg(&list)
        .arg(&tree)
        .arg(&out_dir)
        .assert()
        .success();
    assert_eq!(
        std::fs::read(out_dir.join(OsStr::from_bytes(b"na\xefve"))).unwrap(),
        b"listed"
    );
    assert!(!out_dir.join("other.log").exists());
    assert!(!out_dir.join("plain").exists());
}

/// `--files-from` without `-r` and a folder source: the folder is refused (copy it with -r),
/// and the paths listed beneath it, which were never looked for, are not said to be missing.
#[test]
fn files_from_without_r_refuses_the_folder_and_nothing_more() {
    let sshd = Sshd::start().unwrap();
    let work = tempfile::tempdir().unwrap();
    let src = work.path().join("a");
    std::fs::create_dir(&src).unwrap();
    write(&src.join("f"), b"f", 0o644);
    // A local copy, a pull (the server's walk) and an SFTP pull (a listing of its own).
    for how in ["local", "pull", "sftp"] {
        let mut cmd = match how {
            "local" => fastcp(),
            _ => remote_fastcp(&sshd),
        };
        if how == "sftp" {
            cmd.arg("--sftp");
        }
        let source = match how {
            "local" => src.display().to_string(),
            _ => remote(&sshd, &src),
        };
        let out = cmd
            .args(["-p", "--files-from", "-"])
            .arg(source)
            .arg(work.path().join(format!("D-{how}")))
            .write_stdin("f\n")
            .assert()
            .code(1);
        let said = String::from_utf8_lossy(&out.get_output().stderr).into_owned();
        assert!(said.contains("-r"), "{how}: {said}");
        assert!(!said.contains("not in the source"), "{how}: {said}");
        assert!(said.contains("1 entry failed"), "{how}: {said}");
    }
}

/// `-r dir file`, the file existing: refused with one line, as `cp -r` refuses it, exit 1,
/// nothing written; locally (and by a dry run, as the copy would be), pushed and pulled. A
/// symlink to nothing in the file's place is refused alike, and left as it is.
#[test]
fn a_folder_onto_an_existing_file_is_refused_with_one_line() {
    let sshd = Sshd::start().unwrap();
    let work = tempfile::tempdir().unwrap();
    let src = work.path().join("dir");
    std::fs::create_dir_all(src.join("sub")).unwrap();
    write(&src.join("a"), b"a", 0o644);
    write(&src.join("sub/big"), &pseudo_random(4 << 20, 6), 0o644);
    let out_dir = work.path().join("out");
    std::fs::create_dir(&out_dir).unwrap();
    write(&out_dir.join("afile"), b"a file", 0o644);
    std::os::unix::fs::symlink(work.path().join("nowhere"), out_dir.join("dangling")).unwrap();
    for name in ["afile", "dangling"] {
        let target = out_dir.join(name);
        for how in ["local", "dry run", "push", "pull"] {
            let mut cmd = match how {
                "local" | "dry run" => fastcp(),
                _ => remote_fastcp(&sshd),
            };
            cmd.arg("-r");
            if how == "dry run" {
                cmd.arg("-n");
            }
            match how {
                "local" | "dry run" => cmd.arg(&src).arg(&target),
                "push" => cmd.arg(&src).arg(remote(&sshd, &target)),
                _ => cmd.arg(remote(&sshd, &src)).arg(&target),
            };
            let out = cmd.assert().code(1);
            let said = String::from_utf8_lossy(&out.get_output().stderr).into_owned();
            assert_eq!(said.lines().count(), 1, "{name} {how}: {said}");
            assert!(
                said.contains("exists and is not a directory"),
                "{name} {how}: {said}"
            );
            assert_eq!(std::fs::read(out_dir.join("afile")).unwrap(), b"a file");
            assert_eq!(
                std::fs::read_link(out_dir.join("dangling")).unwrap(),
                work.path().join("nowhere")
            );
            let mut written: Vec<_> = std::fs::read_dir(&out_dir)
                .unwrap()
                .map(|e| e.unwrap().file_name())
                .collect();
            written.sort();
            assert_eq!(written, ["afile", "dangling"], "{name} {how}");
            assert!(!work.path().join("nowhere").exists(), "{name} {how}");
        }
    }
}

/// A pull whose local target is refused once the server runs (`file/` names a file) says
/// why once, and the server, whose client went away, adds nothing to it.
#[test]
fn a_pull_refused_by_its_target_says_why_and_nothing_more() {
    let sshd = Sshd::start().unwrap();
    let work = tempfile::tempdir().unwrap();
    let src = work.path().join("f");
    write(&src, b"f", 0o644);
    let target = work.path().join("afile");
    write(&target, b"a file", 0o644);
    for transport in ["tcp", "ssh", "tcp", "ssh", "tcp", "ssh", "tcp", "ssh"] {
        let out = remote_fastcp(&sshd)
            .args(["--transport", transport])
            .arg(remote(&sshd, &src))
            .arg(format!("{}/", target.display()))
            .output()
            .unwrap();
        let said = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{said}");
        assert!(said.contains("not a directory"), "{said}");
        assert!(!said.contains("fastcp server"), "{transport}: {said}");
    }
    assert_eq!(std::fs::read(&target).unwrap(), b"a file");
}
