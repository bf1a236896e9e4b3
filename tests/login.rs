//! One login for many streams: a passphrase typed once serves every SSH connection of a copy.
//!
//! A copy over `-j 4` SSH streams makes four SSH connections. With a passphrase-protected key
//! and no agent, the passphrase is asked once, on the terminal, and the key it unlocked is
//! kept in memory for the other three. The copy runs under `script(1)`, a real
//! pseudo-terminal, against the harness's OpenSSH sshd.

mod common;

use std::fs;
use std::process::Command;

use common::*;
use fastcp_testsupport::Sshd;
use fastcp_testsupport::tree::{assert_same_tree, pseudo_random, write};

const PASSPHRASE: &str = "open sesame";

/// Runs under a pseudo-terminal: the copy named by the outer test, with the terminal as its
/// stdin, stdout and stderr.
#[test]
#[ignore = "run by the tests of this file inside `script`"]
fn tty_child_copies() {
    let Ok(args) = std::env::var("FASTCP_TEST_TTY_ARGS") else {
        return;
    };
    let args: Vec<&str> = args.split('\n').collect();
    let status = Command::new(BIN)
        .args(&args)
        .env_remove("SSH_AUTH_SOCK")
        .status()
        .unwrap();
    println!("COPY EXIT={}", status.code().unwrap_or(-1));
}

/// Copies with `-j 4` over SSH under a terminal, with a passphrase-protected key, no agent
/// and the extra arguments `extra`; checks that the passphrase was asked once and the copy
/// is whole, and returns what the terminal showed.
fn copy_with_a_locked_key(extra: &[&str]) -> String {
    let sshd = Sshd::start().unwrap();
    let work = tempfile::tempdir().unwrap();
    let key = work.path().join("locked");
    let st = Command::new(fastcp_testsupport::tools::require("ssh-keygen"))
        .args(["-q", "-t", "ed25519", "-N", PASSPHRASE, "-f"])
        .arg(&key)
        .status()
        .unwrap();
    assert!(st.success());
    fs::copy(key.with_extension("pub"), sshd.authorized_keys()).unwrap();
    let cfg = work.path().join("config");
    let block = sshd
        .host_block(sshd.alias())
        .replace(
            &sshd.client_key().display().to_string(),
            &key.display().to_string(),
        )
        .replace("BatchMode yes", "BatchMode no");
    fs::write(&cfg, block).unwrap();

    let src = work.path().join("src");
    fs::create_dir(&src).unwrap();
    for i in 0..8 {
        write(
            &src.join(format!("f{i}")),
            &pseudo_random(3 << 20, i),
            0o644,
        );
    }
    let dst = work.path().join("dst");
    let args = [
        "-F".to_owned(),
        cfg.display().to_string(),
        "--remote-path".to_owned(),
        BIN.to_owned(),
        "--transport".to_owned(),
        "ssh".to_owned(),
        "-j".to_owned(),
        "4".to_owned(),
        "-v".to_owned(),
    ]
    .into_iter()
    .chain(extra.iter().map(|a| a.to_string()))
    .chain([
        "-r".to_owned(),
        src.display().to_string(),
        remote(&sshd, &dst),
    ])
    .collect::<Vec<_>>()
    .join("\n");
    let (ok, text) = fastcp_testsupport::tty::run_ignored_test_in_tty(
        "tty_child_copies",
        &[("FASTCP_TEST_TTY_ARGS", args.as_ref())],
        "Enter passphrase for key",
        PASSPHRASE,
    );
    eprintln!("{text}");
    assert!(ok, "{text}");
    // Nothing was drawn over the prompt while it waited for the answer (the progress bar
    // waits for the copy).
    let waited = fastcp_testsupport::tty::last_wait();
    assert!(!waited.contains("B/s"), "drawn over the prompt: {waited:?}");
    assert!(text.contains("COPY EXIT=0"), "{text}");
    assert_eq!(text.matches("Enter passphrase").count(), 1, "{text}");
    assert!(!text.contains(PASSPHRASE), "the passphrase was echoed");
    assert_same_tree(&src, &dst, false);
    text
}

#[test]
fn passphrase_is_asked_once_for_four_streams() {
    let text = copy_with_a_locked_key(&[]);
    assert!(text.contains("4 stream(s) over 4 connection(s)"), "{text}");
}

/// The system ssh asks for the passphrase itself: its processes share a connection master
/// of the copy's own, so the four streams cost one prompt.
#[test]
fn the_system_ssh_asks_once_for_four_streams() {
    let text = copy_with_a_locked_key(&["--ssh-program", "ssh"]);
    assert!(text.contains("4 sealed stream(s) forwarded"), "{text}");
    assert!(text.contains("they share the first connection"), "{text}");
}

/// Over SFTP through the system ssh (no fastcp on the remote side is used): the extra SFTP
/// sessions cannot log in without the passphrase, and ride the first one's connection.
#[test]
fn the_system_ssh_asks_once_for_four_sftp_sessions() {
    let text = copy_with_a_locked_key(&["--ssh-program", "ssh", "--sftp"]);
    assert!(text.contains("SFTP, 4 session(s)"), "{text}");
}

/// At the question whether to trust an unknown host key, the end of input (Ctrl-D) refuses
/// the key, as ssh does, and so does Enter alone: it is not asked again, and the copy ends
/// with the host-key refusal and its exit code. Nothing is recorded or copied.
#[test]
fn end_of_input_at_the_host_key_question_refuses_the_key() {
    let sshd = Sshd::start().unwrap();
    let work = tempfile::tempdir().unwrap();
    let known_hosts = work.path().join("known_hosts");
    let cfg = work.path().join("config");
    let block = sshd
        .host_block(sshd.alias())
        .replace(
            &sshd.known_hosts().display().to_string(),
            &known_hosts.display().to_string(),
        )
        .replace("StrictHostKeyChecking yes", "StrictHostKeyChecking ask")
        .replace("BatchMode yes", "BatchMode no");
    fs::write(&cfg, block).unwrap();
    let src = work.path().join("a");
    write(&src, b"x", 0o644);
    let dst = work.path().join("b");
    let args = [
        "-F".to_owned(),
        cfg.display().to_string(),
        "--remote-path".to_owned(),
        BIN.to_owned(),
        src.display().to_string(),
        remote(&sshd, &dst),
    ]
    .join("\n");
    let question = "Are you sure you want to continue connecting (yes/no/[fingerprint])?";
    // Ctrl-D, then Enter alone.
    for keys in ["\x04", "\n"] {
        let (ok, text) = fastcp_testsupport::tty::run_ignored_test_in_tty_typing(
            "tty_child_copies",
            &[("FASTCP_TEST_TTY_ARGS", args.as_ref())],
            question,
            keys,
        );
        assert!(ok, "{keys:?}: {text}");
        assert_eq!(text.matches(question).count(), 1, "{keys:?}: {text}");
        assert!(text.contains("was not accepted"), "{keys:?}: {text}");
        assert!(
            text.contains("Host key verification failed."),
            "{keys:?}: {text}"
        );
        assert!(text.contains("COPY EXIT=3"), "{keys:?}: {text}");
        assert!(
            !known_hosts.exists() || fs::read_to_string(&known_hosts).unwrap().is_empty(),
            "{keys:?}"
        );
        assert!(!dst.exists(), "{keys:?}");
    }
}
