//! End to end: the `fastcp` command against a real OpenSSH sshd on 127.0.0.1.
//!
//! Each test starts its own sshd (temp host key, temp authorized_keys, free port) through
//! `fastcp-testsupport`, and runs the built `fastcp` binary as both the client and, through
//! `--remote-path`, the remote `fastcp server`. Nothing touches ~/.ssh.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use common::*;
use fastcp_testsupport::Sshd;
use fastcp_testsupport::tree::{
    assert_no_temp, assert_same_tree, build_mixed, build_tiny, now_secs, pseudo_random, set_times,
    times_of, write,
};

fn mixed_tree(root: &Path) {
    build_mixed(root);
    build_tiny(&root.join("tiny"), 2_000);
}

#[test]
fn push_tree_over_one_two_and_four_streams() {
    let sshd = Sshd::start().unwrap();
    let work = tempfile::tempdir().unwrap();
    let src = work.path().join("tree");
    mixed_tree(&src);
    for streams in ["1", "2", "4"] {
        let dst = work.path().join(format!("pushed-{streams}"));
        let out = run(fastcp(&sshd, bin())
            .args(["-r", "-p", "-j", streams, "--transport", "ssh"])
            .arg(&src)
            .arg(remote(&sshd, &dst)));
        assert!(out.status.success(), "{}", stderr(&out));
        assert_same_tree(&src, &dst, true);
        assert_no_temp(&dst);
    }
}

#[test]
fn pull_tree_over_one_and_four_streams() {
    let sshd = Sshd::start().unwrap();
    let work = tempfile::tempdir().unwrap();
    let src = work.path().join("tree");
    mixed_tree(&src);
    for streams in ["1", "4"] {
        let dst = work.path().join(format!("pulled-{streams}"));
        let out = run(fastcp(&sshd, bin())
            .args(["-r", "-p", "-j", streams, "--transport", "ssh"])
            .arg(remote(&sshd, &src))
            .arg(&dst));
        assert!(out.status.success(), "{}", stderr(&out));
        assert_same_tree(&src, &dst, true);
        assert_no_temp(&dst);
    }
}

#[test]
fn pull_with_remote_wildcards_like_scp() {
    let sshd = Sshd::start().unwrap();
    let work = tempfile::tempdir().unwrap();
    let src = work.path().join("src");
    for dir in ["sub1", "sub2", "other"] {
        std::fs::create_dir_all(src.join(dir)).unwrap();
        write(&src.join(dir).join("x"), dir.as_bytes(), 0o644);
    }
    for name in ["a.txt", "b.txt", "c.log", ".hidden.txt"] {
        write(&src.join(name), name.as_bytes(), 0o644);
    }

    let files = work.path().join("files");
    std::fs::create_dir(&files).unwrap();
    let out = run(fastcp(&sshd, bin())
        .arg(remote(&sshd, &src.join("*.txt")))
        .arg(&files));
    assert!(out.status.success(), "{}", stderr(&out));
    let mut got: Vec<_> = std::fs::read_dir(&files)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    got.sort();
    assert_eq!(got, ["a.txt", "b.txt"]);
    assert_eq!(std::fs::read(files.join("b.txt")).unwrap(), b"b.txt");

    let dirs = work.path().join("dirs");
    std::fs::create_dir(&dirs).unwrap();
    let out = run(fastcp(&sshd, bin())
        .arg("-r")
        .arg(remote(&sshd, &src.join("sub?")))
        .arg(&dirs));
    assert!(out.status.success(), "{}", stderr(&out));
    assert_same_tree(&src.join("sub1"), &dirs.join("sub1"), false);
    assert_same_tree(&src.join("sub2"), &dirs.join("sub2"), false);
    assert!(!dirs.join("other").exists());

    // A dry run lists the same matches.
    let out = run(fastcp(&sshd, bin())
        .arg("-n")
        .arg(remote(&sshd, &src.join("*.txt")))
        .arg(&files));
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "a.txt\nb.txt\n");

    // A pattern may match several names: the destination must be a directory, checked
    // before anything is written (operands that make no sense: a usage error).
    let out = run(fastcp(&sshd, bin())
        .arg(remote(&sshd, &src.join("a.*")))
        .arg(work.path().join("new-name")));
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("not a directory"), "{}", stderr(&out));
    assert!(!work.path().join("new-name").exists());

    // No match: an error naming the pattern, as for a missing file.
    let out = run(fastcp(&sshd, bin())
        .arg(remote(&sshd, &src.join("*.none")))
        .arg(&files));
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("*.none"), "{}", stderr(&out));
}

/// A remote wildcard drops no match whose name is not UTF-8: the server carries the name's
/// bytes, the client accepts them as a match, and `?` matches one such byte, as the shell's
/// glob does.
#[test]
fn a_remote_wildcard_carries_names_that_are_not_utf8() {
    use std::ffi::OsStr;
    use std::os::unix::ffi::OsStrExt;
    let sshd = Sshd::start().unwrap();
    let work = tempfile::tempdir().unwrap();
    let src = work.path().join("src");
    std::fs::create_dir(&src).unwrap();
    for name in [&b"a.txt"[..], b"b\xff.txt", b"c.log"] {
        write(&src.join(OsStr::from_bytes(name)), name, 0o644);
    }
    let landed = |dir: &Path| {
        let mut got: Vec<Vec<u8>> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().as_bytes().to_vec())
            .collect();
        got.sort();
        got
    };
    for (i, (pattern, want)) in [
        ("*.txt", vec![&b"a.txt"[..], b"b\xff.txt"]),
        ("b?.txt", vec![b"b\xff.txt"]),
        ("[ab]*", vec![b"a.txt", b"b\xff.txt"]),
    ]
    .into_iter()
    .enumerate()
    {
        let into = work.path().join(format!("into-{i}"));
        std::fs::create_dir(&into).unwrap();
        let out = run(fastcp(&sshd, bin())
            .arg(remote(&sshd, &src.join(pattern)))
            .arg(&into));
        assert!(out.status.success(), "{pattern}: {}", stderr(&out));
        assert_eq!(landed(&into), want, "{pattern}");
        let bad = into.join(OsStr::from_bytes(b"b\xff.txt"));
        assert_eq!(std::fs::read(bad).unwrap(), b"b\xff.txt", "{pattern}");
    }
}

/// A backslash in a remote source quotes the character after it, as scp has it (`scp
/// 'host:my\ file.txt' .`, the habit from scp's remote shell): it names one file, which may
/// take a new name, and a quoted wildcard matches only itself.
#[test]
fn pull_with_backslash_quoting_like_scp() {
    let sshd = Sshd::start().unwrap();
    let work = tempfile::tempdir().unwrap();
    let src = work.path().join("my dir");
    std::fs::create_dir(&src).unwrap();
    for name in ["my file.txt", "star*", "starry"] {
        write(&src.join(name), name.as_bytes(), 0o644);
    }
    let quoted = format!("{}/my\\ dir", work.path().display());
    let copy = work.path().join("copy");
    let out = run(fastcp(&sshd, bin())
        .arg(format!("{}:{quoted}/my\\ file.txt", sshd.alias()))
        .arg(&copy));
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(std::fs::read(&copy).unwrap(), b"my file.txt");

    let into = work.path().join("into");
    std::fs::create_dir(&into).unwrap();
    let out = run(fastcp(&sshd, bin())
        .arg(format!("{}:{quoted}/star\\*", sshd.alias()))
        .arg(&into));
    assert!(out.status.success(), "{}", stderr(&out));
    let got: Vec<_> = std::fs::read_dir(&into)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert_eq!(got, ["star*"]);
}

#[test]
fn push_and_pull_single_files_like_scp() {
    let sshd = Sshd::start().unwrap();
    let work = tempfile::tempdir().unwrap();
    let a = work.path().join("a.txt");
    write(&a, b"alpha", 0o640);
    let b = work.path().join("b.txt");
    write(&b, b"bravo", 0o644);
    let into = work.path().join("into");
    std::fs::create_dir(&into).unwrap();

    // Several sources into an existing directory.
    let out = run(fastcp(&sshd, bin())
        .arg(&a)
        .arg(&b)
        .arg(remote(&sshd, &into)));
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(std::fs::read(into.join("a.txt")).unwrap(), b"alpha");
    assert_eq!(std::fs::read(into.join("b.txt")).unwrap(), b"bravo");

    // One source to a new name.
    let renamed = work.path().join("renamed.txt");
    let out = run(fastcp(&sshd, bin()).arg(&a).arg(remote(&sshd, &renamed)));
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(std::fs::read(&renamed).unwrap(), b"alpha");

    // Pull back to a new local name.
    let back = work.path().join("back.txt");
    let out = run(fastcp(&sshd, bin()).arg(remote(&sshd, &renamed)).arg(&back));
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(std::fs::read(&back).unwrap(), b"alpha");

    // Several sources to a target that is not a directory: an error, nothing written.
    let missing = work.path().join("not-a-dir");
    let out = run(fastcp(&sshd, bin())
        .arg(&a)
        .arg(&b)
        .arg(remote(&sshd, &missing)));
    assert!(!out.status.success());
    assert!(!missing.exists());
}

/// A symlink named on the command line is followed, as scp follows it: a link to a file
/// arrives as that file, a link to a folder as that folder (with `-r`), on a push, a pull
/// (over fastcp and over SFTP) and a local copy. The links inside a tree stay links unless
/// `-L` asks to follow them too; a dangling link named at the top arrives as the link it is.
#[test]
fn a_symlink_named_on_the_command_line_is_followed_like_scp() {
    let sshd = Sshd::start().unwrap();
    let work = tempfile::tempdir().unwrap();
    let w = work.path();
    write(&w.join("target.txt"), b"the data", 0o644);
    std::os::unix::fs::symlink("target.txt", w.join("file-link")).unwrap();
    std::fs::create_dir(w.join("dir")).unwrap();
    write(&w.join("dir/inside"), b"inside", 0o644);
    std::os::unix::fs::symlink("inside", w.join("dir/inner-link")).unwrap();
    std::os::unix::fs::symlink("dir", w.join("dir-link")).unwrap();
    std::os::unix::fs::symlink("nowhere", w.join("dangling")).unwrap();
    let is_link = |p: &Path| p.symlink_metadata().unwrap().file_type().is_symlink();
    let ways: [(&str, &[&str]); 4] = [
        ("push", &[]),
        ("pull", &[]),
        ("pull", &["--sftp"]),
        ("local", &[]),
    ];
    for (n, (way, extra)) in ways.iter().enumerate() {
        let out_dir = w.join(format!("out-{n}"));
        std::fs::create_dir(&out_dir).unwrap();
        let operands = |name: &str| -> (String, String) {
            let from = w.join(name).display().to_string();
            let to = out_dir.display().to_string() + "/";
            match *way {
                "push" => (from, remote(&sshd, Path::new(&to))),
                "pull" => (remote(&sshd, Path::new(&from)), to),
                _ => (from, to),
            }
        };
        for name in ["file-link", "dir-link", "dangling"] {
            let (from, to) = operands(name);
            let out = run(fastcp(&sshd, bin())
                .arg("-r")
                .args(*extra)
                .arg(from)
                .arg(to));
            assert!(
                out.status.success(),
                "{way} {extra:?} {name}: {}",
                stderr(&out)
            );
        }
        let what = format!("{way} {extra:?}");
        assert!(!is_link(&out_dir.join("file-link")), "{what}");
        assert_eq!(
            std::fs::read(out_dir.join("file-link")).unwrap(),
            b"the data",
            "{what}"
        );
        assert!(
            out_dir
                .join("dir-link")
                .symlink_metadata()
                .unwrap()
                .is_dir(),
            "{what}"
        );
        assert_eq!(
            std::fs::read(out_dir.join("dir-link/inside")).unwrap(),
            b"inside"
        );
        assert!(is_link(&out_dir.join("dir-link/inner-link")), "{what}");
        assert!(is_link(&out_dir.join("dangling")), "{what}");
    }
    // -L follows the links inside the tree as well.
    let followed = w.join("followed");
    let out = run(fastcp(&sshd, bin())
        .args(["-r", "-L"])
        .arg(w.join("dir-link"))
        .arg(remote(&sshd, &followed)));
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(!is_link(&followed.join("inner-link")));
    assert_eq!(
        std::fs::read(followed.join("inner-link")).unwrap(),
        b"inside"
    );
}

/// `DIR/.` names a folder's contents, as `cp -r DIR/. DEST` and scp take it: they go
/// straight into an existing DEST, beside what it holds, rather than into DEST/DIR; on a
/// push, a pull (over fastcp and over SFTP), a push over SFTP and a local copy. `--delete`
/// then mirrors DEST itself.
#[test]
fn a_folder_named_with_a_trailing_dot_copies_its_contents_like_cp() {
    let sshd = Sshd::start().unwrap();
    let work = tempfile::tempdir().unwrap();
    let w = work.path();
    let src = w.join("src");
    build_tiny(&src, 30);
    let ways: [(&str, &[&str]); 5] = [
        ("push", &[]),
        ("pull", &[]),
        ("pull", &["--sftp"]),
        ("push", &["--sftp"]),
        ("local", &[]),
    ];
    for (n, (way, extra)) in ways.iter().enumerate() {
        let what = format!("{way} {extra:?}");
        let dest = w.join(format!("dest-{n}"));
        std::fs::create_dir(&dest).unwrap();
        write(&dest.join("kept.txt"), b"already here", 0o644);
        let from = format!("{}/.", src.display());
        let to = dest.display().to_string();
        let (from, to) = match *way {
            "push" => (from, remote(&sshd, Path::new(&to))),
            "pull" => (remote(&sshd, Path::new(&from)), to),
            _ => (from, to),
        };
        let out = run(fastcp(&sshd, bin())
            .arg("-r")
            .args(*extra)
            .arg(&from)
            .arg(&to));
        assert!(out.status.success(), "{what}: {}", stderr(&out));
        assert!(
            !dest.join("src").exists(),
            "{what}: nested in a folder of its name"
        );
        assert_eq!(
            std::fs::read(dest.join("kept.txt")).unwrap(),
            b"already here"
        );
        std::fs::remove_file(dest.join("kept.txt")).unwrap();
        assert_same_tree(&src, &dest, false);

        // A mirror of the contents removes what DEST holds beyond them.
        write(&dest.join("extra.txt"), b"not in src", 0o644);
        let out = run(fastcp(&sshd, bin())
            .args(["-r", "--delete"])
            .args(*extra)
            .arg(&from)
            .arg(&to));
        assert!(out.status.success(), "{what} --delete: {}", stderr(&out));
        assert!(!dest.join("extra.txt").exists(), "{what}");
        assert_same_tree(&src, &dest, false);
    }
    // With other sources, where the contents should go is unclear: refused.
    let out = run(fastcp(&sshd, bin())
        .arg("-r")
        .arg(format!("{}/.", src.display()))
        .arg(w.join("dest-0"))
        .arg(remote(&sshd, &w.join("dest-0"))));
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
}

/// Two sources of one name would land in one place, where the streams' order would pick
/// the survivor: the first is copied, every time, and the later one fails, saying why.
#[test]
fn two_sources_of_one_name_copy_the_first_and_fail_the_other() {
    let sshd = Sshd::start().unwrap();
    let work = tempfile::tempdir().unwrap();
    let w = work.path();
    std::fs::create_dir(w.join("one")).unwrap();
    std::fs::create_dir(w.join("two")).unwrap();
    write(&w.join("one/same"), b"first", 0o644);
    write(&w.join("two/same"), b"second", 0o644);
    for way in ["push", "pull", "local"] {
        let dest = w.join(format!("into-{way}"));
        std::fs::create_dir(&dest).unwrap();
        let (a, b) = (w.join("one/same"), w.join("two/same"));
        let mut cmd = fastcp(&sshd, bin());
        match way {
            "push" => cmd.arg(&a).arg(&b).arg(remote(&sshd, &dest)),
            "pull" => cmd.arg(remote(&sshd, &a)).arg(remote(&sshd, &b)).arg(&dest),
            _ => cmd.arg(&a).arg(&b).arg(&dest),
        };
        let out = run(&mut cmd);
        assert_eq!(out.status.code(), Some(1), "{way}: {}", stderr(&out));
        assert!(
            stderr(&out).contains("same name"),
            "{way}: {}",
            stderr(&out)
        );
        assert_eq!(std::fs::read(dest.join("same")).unwrap(), b"first", "{way}");
    }
}

/// The last line of a push that failed counts what landed on the far side: files pushed
/// where folders with entries hold their names (which a copy without `--delete` does not
/// replace) copy nothing, and say so.
#[test]
fn a_push_that_lands_nothing_says_nothing_was_copied() {
    let sshd = Sshd::start().unwrap();
    let work = tempfile::tempdir().unwrap();
    let dest = work.path().join("dest");
    let mut files = Vec::new();
    for name in ["f1", "f2"] {
        let file = work.path().join(name);
        write(&file, name.as_bytes(), 0o644);
        files.push(file);
        std::fs::create_dir_all(dest.join(name)).unwrap();
        write(&dest.join(name).join("inside"), b"kept", 0o644);
    }
    let out = run(fastcp(&sshd, bin()).args(&files).arg(remote(&sshd, &dest)));
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("nothing was copied: 2 entries failed"),
        "{}",
        stderr(&out)
    );
    assert!(
        !stderr(&out).contains("the others were copied"),
        "{}",
        stderr(&out)
    );
    for name in ["f1", "f2"] {
        assert_eq!(
            std::fs::read(dest.join(name).join("inside")).unwrap(),
            b"kept"
        );
    }
}

/// Pushes a one-byte file `a` to `b` in a fresh temp dir with `remote_path` as the remote
/// program.
fn push_running(sshd: &Sshd, remote_path: &str) -> (Output, tempfile::TempDir) {
    let work = tempfile::tempdir().unwrap();
    let a = work.path().join("a");
    write(&a, b"x", 0o644);
    let out = Command::new(BIN)
        .arg("-F")
        .arg(sshd.ssh_config())
        .args(["--remote-path", remote_path])
        .arg(&a)
        .arg(remote(sshd, &work.path().join("b")))
        .output()
        .unwrap();
    (out, work)
}

#[test]
fn missing_remote_binary_says_how_to_fix_it() {
    let sshd = Sshd::start().unwrap();
    let (out, work) = push_running(&sshd, "/nonexistent/fastcp");
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(err.contains("--remote-path"), "{err}");
    assert!(!work.path().join("b").exists());
}

/// A remote program that ends before it speaks, saying nothing: how it ended is named.
#[test]
fn a_remote_program_that_exits_before_the_handshake_is_named_with_its_status() {
    let sshd = Sshd::start().unwrap();
    let (out, work) = push_running(&sshd, "false");
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.contains("the remote command `false server` exited with status 1"),
        "{err}"
    );
    assert!(!work.path().join("b").exists());
}

/// A remote program that ends before it speaks is the remote program's failure, not the
/// network's: a program that retries on a network fault would only meet it again.
#[test]
fn a_remote_program_that_exits_before_the_handshake_is_no_network_fault() {
    let sshd = Sshd::start().unwrap();
    let work = tempfile::tempdir().unwrap();
    let a = work.path().join("a");
    write(&a, b"x", 0o644);
    let out = run(Command::new(BIN)
        .arg("-F")
        .arg(sshd.ssh_config())
        .args(["--remote-path", "false", "--json"])
        .arg(&a)
        .arg(remote(&sshd, &work.path().join("b"))));
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    let summary = json(&out);
    assert_eq!(summary["error_kind"], "remote_program_missing", "{summary}");
    assert_eq!(summary["fault"], "remote", "{summary}");
    assert!(!work.path().join("b").exists());
}

/// Pushes a one-byte file `a` to `b` in a fresh temp dir, for the tests that expect a refusal.
fn push_one_file(sshd: &Sshd) -> (Output, tempfile::TempDir) {
    let work = tempfile::tempdir().unwrap();
    let a = work.path().join("a");
    write(&a, b"x", 0o644);
    let out = run(fastcp(sshd, bin())
        .arg(&a)
        .arg(remote(sshd, &work.path().join("b"))));
    (out, work)
}

#[test]
fn unknown_host_key_is_refused() {
    let sshd = Sshd::start().unwrap();
    std::fs::write(sshd.known_hosts(), "").unwrap();
    let (out, work) = push_one_file(&sshd);
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("Host key verification failed"),
        "{}",
        stderr(&out)
    );
    assert!(!work.path().join("b").exists());
}

#[test]
fn changed_host_key_is_refused() {
    let mut sshd = Sshd::start().unwrap();
    sshd.change_host_key().unwrap();
    let (out, work) = push_one_file(&sshd);
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("REMOTE HOST IDENTIFICATION HAS CHANGED"),
        "{}",
        stderr(&out)
    );
    assert!(!work.path().join("b").exists());
}

/// As ssh ("found matching key w/out port"): a host on another port than 22 with no
/// `[host]:port` entry is trusted by its key under the bare host name; another key under the
/// bare name leaves it unknown (refused under `StrictHostKeyChecking yes`).
#[test]
fn a_key_recorded_without_the_port_is_trusted() {
    let sshd = Sshd::start().unwrap();
    std::fs::write(
        sshd.known_hosts(),
        format!("127.0.0.1 {}\n", sshd.host_public_key()),
    )
    .unwrap();
    let (out, work) = push_one_file(&sshd);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(work.path().join("b").exists());

    let other = tempfile::tempdir().unwrap();
    keygen("ed25519", &other.path().join("k"));
    let other_key = std::fs::read_to_string(other.path().join("k.pub")).unwrap();
    let other_key: Vec<&str> = other_key.split_whitespace().take(2).collect();
    std::fs::write(
        sshd.known_hosts(),
        format!("127.0.0.1 {}\n", other_key.join(" ")),
    )
    .unwrap();
    let (out, work) = push_one_file(&sshd);
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("No ED25519 host key is known"),
        "{}",
        stderr(&out)
    );
    assert!(!work.path().join("b").exists());
}

#[test]
fn wrong_user_key_is_refused() {
    let sshd = Sshd::start().unwrap();
    std::fs::write(sshd.authorized_keys(), "").unwrap();
    let (out, _work) = push_one_file(&sshd);
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("Permission denied"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn agent_authentication() {
    let sshd = Sshd::start().unwrap();
    let agent = sshd.start_agent().unwrap();
    // A config without identity files (and without IdentitiesOnly, which would restrict the
    // agent to them): the agent must do the work.
    let config = sshd.dir().join("agent_config");
    let text = std::fs::read_to_string(sshd.ssh_config()).unwrap();
    let text: String = text
        .lines()
        .filter(|l| {
            let l = l.trim_start();
            !l.starts_with("IdentityFile") && !l.starts_with("IdentitiesOnly")
        })
        .map(|l| format!("{l}\n"))
        .collect();
    std::fs::write(&config, text).unwrap();
    let work = tempfile::tempdir().unwrap();
    let a = work.path().join("a");
    write(&a, b"via agent", 0o644);
    copy_through_agent(&sshd, &agent, &config, &a, &work.path().join("b"));
}

/// Copies `file` (holding "via agent") to `to` with ssh_config `config` and the agent's
/// keys, and checks the copy.
fn copy_through_agent(
    sshd: &Sshd,
    agent: &fastcp_testsupport::Agent,
    config: &Path,
    file: &Path,
    to: &Path,
) {
    let out = run(fastcp_with_config(config)
        .env("SSH_AUTH_SOCK", agent.socket())
        .arg(file)
        .arg(remote(sshd, to)));
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(std::fs::read(to).unwrap(), b"via agent");
}

/// With many keys in the agent, the one the IdentityFile names goes first, as ssh offers
/// it: a server's MaxAuthTries would end the login before the agent's other keys ran out.
#[test]
fn the_agent_offers_the_identity_files_key_first() {
    let sshd = Sshd::start_with_options("MaxAuthTries 2").unwrap();
    let agent = sshd.start_agent().unwrap();
    let work = tempfile::tempdir().unwrap();
    let add = |args: &[&std::ffi::OsStr]| {
        let out = Command::new(fastcp_testsupport::tools::require("ssh-add"))
            .args(args)
            .env("SSH_AUTH_SOCK", agent.socket())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    // Three other keys, then the right one last.
    for i in 0..3 {
        let key = work.path().join(format!("other{i}"));
        keygen("ed25519", &key);
        add(&[key.as_os_str()]);
    }
    add(&["-d".as_ref(), sshd.client_key().as_os_str()]);
    add(&[sshd.client_key().as_os_str()]);
    // IdentityFile names the key; without IdentitiesOnly, every agent key may be offered.
    let config = work.path().join("config");
    let text: String = std::fs::read_to_string(sshd.ssh_config())
        .unwrap()
        .lines()
        .filter(|l| !l.trim_start().starts_with("IdentitiesOnly"))
        .map(|l| format!("{l}\n"))
        .collect();
    std::fs::write(&config, text).unwrap();
    let a = work.path().join("a");
    write(&a, b"via agent", 0o644);
    copy_through_agent(&sshd, &agent, &config, &a, &work.path().join("b"));
    // An IdentityFile that names the public key (the agent holds the private half), with
    // IdentitiesOnly: that agent key, and only it, is offered.
    let key = sshd.client_key().display().to_string();
    let text = std::fs::read_to_string(sshd.ssh_config())
        .unwrap()
        .replace(&key, &format!("{key}.pub"));
    std::fs::write(&config, text).unwrap();
    copy_through_agent(&sshd, &agent, &config, &a, &work.path().join("c"));
}

/// A server that ends the login after too many offers (`MaxAuthTries`) gets an error that
/// says so, as ssh's "Too many authentication failures" does, with what was offered up to
/// then; the offers after it are not listed as failed signatures.
#[test]
fn a_login_ended_by_max_auth_tries_says_so() {
    let sshd = Sshd::start_with_options("MaxAuthTries 2").unwrap();
    let agent = sshd.start_agent().unwrap();
    let work = tempfile::tempdir().unwrap();
    let add = |key: &Path| {
        let added = Command::new(fastcp_testsupport::tools::require("ssh-add"))
            .arg(key)
            .env("SSH_AUTH_SOCK", agent.socket())
            .output()
            .unwrap();
        assert!(added.status.success());
    };
    add(Path::new("-D"));
    for i in 0..4 {
        let key = work.path().join(format!("other{i}"));
        keygen("ed25519", &key);
        add(&key);
    }
    // Only the agent's keys, none of which the server takes.
    let config = config_without(
        &sshd,
        work.path(),
        "max_auth_tries",
        &["IdentityFile", "IdentitiesOnly"],
        "  IdentityFile /nonexistent/key\n",
    );
    let a = work.path().join("a");
    write(&a, b"x", 0o644);
    let out = run(fastcp_with_config(&config)
        .env("SSH_AUTH_SOCK", agent.socket())
        .arg(&a)
        .arg(remote(&sshd, &work.path().join("b"))));
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    let said = stderr(&out);
    assert!(said.contains("MaxAuthTries"), "{said}");
    assert!(!said.contains("failed to sign"), "{said}");
    assert!(!work.path().join("b").exists());
}

/// A key pair of `kind` at `path`, without a passphrase.
fn keygen(kind: &str, path: &Path) {
    let made = Command::new(fastcp_testsupport::tools::require("ssh-keygen"))
        .args(["-q", "-t", kind, "-N", "", "-f"])
        .arg(path)
        .status()
        .unwrap();
    assert!(made.success(), "ssh-keygen -t {kind}");
}

#[test]
fn proxy_jump_through_a_second_sshd() {
    let sshd = Sshd::start().unwrap();
    let jump = sshd.start_jump().unwrap();
    let work = tempfile::tempdir().unwrap();
    let src = work.path().join("t");
    build_tiny(&src, 50);
    let dst = work.path().join("through-jump");
    let out = run(fastcp(&sshd, bin())
        .args(["-r", "-J", jump.alias()])
        .arg(&src)
        .arg(remote(&sshd, &dst)));
    assert!(out.status.success(), "{}", stderr(&out));
    assert_same_tree(&src, &dst, false);
}

#[test]
fn system_ssh_program_escape_hatch() {
    let sshd = Sshd::start().unwrap();
    let work = tempfile::tempdir().unwrap();
    let src = work.path().join("tree");
    mixed_tree(&src);
    // The system ssh reaches the host directly (`ssh -G` names no proxy): the data takes
    // sealed TCP streams, keys exchanged over the ssh program's stdio.
    let dst = work.path().join("via-ssh");
    let out = run(fastcp(&sshd, bin())
        .args(["-r", "-p", "--json", "--ssh-program", "ssh"])
        .arg(&src)
        .arg(remote(&sshd, &dst)));
    assert!(out.status.success(), "{}", stderr(&out));
    assert_same_tree(&src, &dst, true);
    let summary = json(&out);
    assert_eq!(summary["transport"], "tcp", "{summary}");
    assert_eq!(summary["streams"], 4, "{summary}");

    // Pulled back the same way, then over the ssh program's own stream.
    for transport in ["tcp", "ssh"] {
        let back = work.path().join(format!("back-{transport}"));
        let out = run(fastcp(&sshd, bin())
            .args([
                "-r",
                "-p",
                "--json",
                "--ssh-program",
                "ssh",
                "--transport",
                transport,
            ])
            .arg(remote(&sshd, &dst))
            .arg(&back));
        assert!(out.status.success(), "{}", stderr(&out));
        assert_same_tree(&src, &back, true);
        assert_eq!(json(&out)["transport"], transport);
    }

    // Through a ProxyCommand the host is not reached directly: the streams are forwarded by
    // ssh itself (`ssh -W 127.0.0.1:PORT`), one ssh each, sealed as TCP streams are.
    let config = proxied_config(&sshd, work.path());
    let proxied = work.path().join("proxied");
    let out = run(fastcp_with_config(&config)
        .args(["-r", "-p", "--json", "-j", "4"])
        .args(["--ssh-program", "ssh", "-v"])
        .arg(&src)
        .arg(remote(&sshd, &proxied)));
    assert!(out.status.success(), "{}", stderr(&out));
    assert_same_tree(&src, &proxied, true);
    let summary = json(&out);
    assert_eq!(summary["transport"], "ssh", "{summary}");
    assert_eq!(summary["streams"], 4, "{summary}");
    assert!(
        stderr(&out).contains("forwarded by the system ssh"),
        "{}",
        stderr(&out)
    );
    let back = work.path().join("proxied-back");
    let out = run(fastcp_with_config(&config)
        .args(["-r", "-p", "--json", "-j", "3"])
        .args(["--ssh-program", "ssh"])
        .arg(remote(&sshd, &proxied))
        .arg(&back));
    assert!(out.status.success(), "{}", stderr(&out));
    assert_same_tree(&src, &back, true);
    assert_eq!(json(&out)["streams"], 3);
}

/// ssh_config lines that would keep ssh from running a command on the host with its stdin
/// (`SessionType none`, as `-N`; `StdinNull yes`, as `-n`) do not apply to fastcp's own
/// sessions, as scp's `-s` overrides the first: a push and a pull through the system ssh,
/// over its stdio alone and with extra streams (`ssh -W`, through a ProxyCommand), and with
/// the built-in client, which ignores them. `ForkAfterAuthentication yes` (`-f`) leaves
/// ssh's stdio to the process that goes on in the background, and the copy with it.
#[test]
fn ssh_config_that_asks_for_no_session_is_overridden() {
    let sshd = Sshd::start().unwrap();
    let work = tempfile::tempdir().unwrap();
    let src = work.path().join("tree");
    mixed_tree(&src);
    let lines = "  SessionType none\n  StdinNull yes\n  ForkAfterAuthentication yes\n";
    let direct = work.path().join("direct_config");
    let block = sshd.host_block(sshd.alias());
    let proxied = proxied_config(&sshd, work.path());
    let text = std::fs::read_to_string(&proxied).unwrap();
    std::fs::write(&proxied, format!("{text}{lines}")).unwrap();
    std::fs::write(&direct, format!("{block}{lines}")).unwrap();
    let cases: [(&str, &Path, &[&str]); 4] = [
        (
            "system ssh, its stdio",
            &direct,
            &["--ssh-program", "ssh", "--transport", "ssh", "-j", "1"],
        ),
        ("system ssh, tcp", &direct, &["--ssh-program", "ssh"]),
        (
            "system ssh, ssh -W",
            &proxied,
            &["--ssh-program", "ssh", "-j", "2"],
        ),
        ("built-in client", &direct, &[]),
    ];
    for (name, config, flags) in cases {
        let copy = |from: &std::ffi::OsStr, to: &std::ffi::OsStr| {
            let out = run(fastcp_with_config(config)
                .arg("-r")
                .args(flags)
                .arg(from)
                .arg(to));
            assert!(out.status.success(), "{name}: {}", stderr(&out));
        };
        let dst = work.path().join(format!("pushed {name}"));
        let there = remote(&sshd, &dst);
        copy(src.as_os_str(), there.as_ref());
        assert_same_tree(&src, &dst, false);
        let back = work.path().join(format!("pulled {name}"));
        copy(there.as_ref(), back.as_os_str());
        assert_same_tree(&src, &back, false);
    }
}

/// An ssh_config that reaches `sshd` through a ProxyCommand, written into `dir`.
fn proxied_config(sshd: &Sshd, dir: &Path) -> PathBuf {
    let config = dir.join("proxied_config");
    let proxied_block = sshd.host_block(sshd.alias()).replace(
        "BatchMode yes\n",
        &format!(
            "BatchMode yes\n  ProxyCommand ssh -F {} -W %h:%p {}\n",
            sshd.ssh_config().display(),
            sshd.alias()
        ),
    );
    std::fs::write(&config, proxied_block).unwrap();
    config
}

/// A remote sshd that forwards no TCP port: the system ssh's extra streams cannot be made,
/// and the copy goes over one stream, saying why.
#[test]
fn without_tcp_forwarding_the_system_ssh_copies_over_one_stream() {
    let sshd = Sshd::start_with_options("AllowTcpForwarding no\n").unwrap();
    // Reached through a jump host that does forward.
    let jump = sshd.start_jump().unwrap();
    let work = tempfile::tempdir().unwrap();
    let src = work.path().join("tree");
    mixed_tree(&src);
    let dst = work.path().join("copy");
    let out = run(fastcp(&sshd, bin())
        .args([
            "-r",
            "--json",
            "-j",
            "4",
            "--ssh-program",
            "ssh",
            "-J",
            jump.alias(),
        ])
        .arg(&src)
        .arg(remote(&sshd, &dst)));
    assert!(out.status.success(), "{}", stderr(&out));
    assert_same_tree(&src, &dst, false);
    let summary = json(&out);
    assert_eq!(summary["streams"], 1, "{summary}");
    assert!(
        stderr(&out).contains("copying over one stream"),
        "{}",
        stderr(&out)
    );
}

/// Regression: with several channels on one SSH connection, a pull could stall when the
/// receiver left one channel unread while it waited for an entry on another. Every stream
/// now has a connection of its own; a stall here shows up as the watchdog's exit 124.
#[test]
fn pull_with_many_streams_never_stalls() {
    let sshd = Sshd::start().unwrap();
    let work = tempfile::tempdir().unwrap();
    let src = work.path().join("tree");
    mixed_tree(&src);
    for (round, streams) in ["3", "3", "3", "5", "5", "8"].iter().enumerate() {
        let dst = work.path().join(format!("pulled-{round}"));
        let mut cmd = Command::new(fastcp_testsupport::tools::require("timeout"));
        cmd.arg("120").arg(BIN).arg("-F").arg(sshd.ssh_config());
        cmd.args([
            "--remote-path",
            BIN,
            "-r",
            "-j",
            streams,
            "--transport",
            "ssh",
        ])
        .env_remove("SSH_AUTH_SOCK")
        .arg(remote(&sshd, &src))
        .arg(&dst);
        let out = run(&mut cmd);
        assert!(out.status.success(), "-j {streams}: {}", stderr(&out));
        assert_same_tree(&src, &dst, false);
    }
}

#[test]
fn pull_progress_shows_the_total_and_an_eta() {
    let sshd = Sshd::start().unwrap();
    let work = tempfile::tempdir().unwrap();
    let src = work.path().join("dir");
    std::fs::create_dir(&src).unwrap();
    for (i, name) in ["a", "b", "c"].iter().enumerate() {
        write(
            &src.join(name),
            &pseudo_random(1024 * 1024, i as u64),
            0o644,
        );
    }
    // The files arrive from the server's walk; its Totals frame gives the client the total.
    // It travels behind the data already queued, limited to 512 KiB/s: the copy lasts about
    // 6 s, so that a progress line comes after it whatever the load.
    let out = run(fastcp(&sshd, bin())
        .args([
            "-r",
            "--progress",
            "--bwlimit",
            "512K",
            "--transport",
            "ssh",
        ])
        .arg(remote(&sshd, &src))
        .arg(work.path().join("pulled")));
    assert!(out.status.success(), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.lines().any(|line| line.contains(" of 3.00 MiB, ")
            && line.contains(", ETA ")
            && line.contains("/3 files")),
        "{err}"
    );
    assert_same_tree(&src, &work.path().join("pulled"), false);
}

#[test]
fn preserve_carries_access_times_and_symlink_times_both_ways() {
    let sshd = Sshd::start().unwrap();
    let work = tempfile::tempdir().unwrap();
    let src = work.path().join("d");
    std::fs::create_dir(&src).unwrap();
    write(&src.join("f"), b"timed", 0o640);
    std::os::unix::fs::symlink("f", src.join("l")).unwrap();
    let now = now_secs();
    let want = [
        ("f", (now - 1000, 1_000_000_000)),
        ("l", (now - 2000, 1_100_000_000)),
        ("", (now - 3000, 1_200_000_000)),
    ];
    let pushed = work.path().join("pushed");
    let pulled = work.path().join("pulled");
    for (from, to, copy) in [
        (src.display().to_string(), remote(&sshd, &pushed), &pushed),
        (remote(&sshd, &src), pulled.display().to_string(), &pulled),
    ] {
        // Reading the source may move its access times (strictatime): set them before each copy.
        for (name, (atime, mtime)) in want {
            set_times(&src.join(name), atime, mtime);
        }
        let out = run(fastcp(&sshd, bin()).args(["-r", "-p"]).arg(&from).arg(&to));
        assert!(out.status.success(), "{}", stderr(&out));
        for (name, times) in want {
            assert_eq!(times_of(&copy.join(name)), times, "{from} -> {to}: {name}");
        }
    }
}

#[test]
fn a_small_push_over_ssh_logs_in_once() {
    let sshd = Sshd::start().unwrap();
    let work = tempfile::tempdir().unwrap();
    let small = work.path().join("small");
    let big = work.path().join("big");
    write(&small, &pseudo_random(64 << 10, 1), 0o644);
    write(&big, &pseudo_random(3 << 20, 2), 0o644);
    // What fits in one chunk travels whole on one stream: no second SSH connection for it,
    // unless -j asks; a bigger file gets the default two.
    for (src, args, want) in [
        (&small, &[][..], "1 stream(s) over 1 connection(s)"),
        (&small, &["-j", "2"][..], "2 stream(s) over 2 connection(s)"),
        (&big, &[][..], "2 stream(s) over 2 connection(s)"),
    ] {
        let dst = work.path().join("out");
        let out = run(fastcp(&sshd, bin())
            .args(["-v", "--transport", "ssh"])
            .args(args)
            .arg(src)
            .arg(remote(&sshd, &dst)));
        assert!(out.status.success(), "{}", stderr(&out));
        assert!(stderr(&out).contains(want), "{args:?}: {}", stderr(&out));
        assert_eq!(std::fs::read(&dst).unwrap(), std::fs::read(src).unwrap());
    }
}

/// The idiom of CI scripts and throwaway VMs, `-o UserKnownHostsFile=/dev/null -o
/// StrictHostKeyChecking=no`, works as with ssh: the key is accepted and nothing recorded.
#[test]
fn dev_null_known_hosts_with_strict_checking_off_works_both_ways() {
    let sshd = Sshd::start().unwrap();
    let work = tempfile::tempdir().unwrap();
    let src = work.path().join("tree");
    build_tiny(&src, 10);
    let idiom = [
        "-o",
        "UserKnownHostsFile=/dev/null",
        "-o",
        "StrictHostKeyChecking=no",
    ];
    let pushed = work.path().join("pushed");
    let out = run(fastcp(&sshd, bin())
        .args(idiom)
        .arg("-r")
        .arg(&src)
        .arg(remote(&sshd, &pushed)));
    assert!(out.status.success(), "{}", stderr(&out));
    assert_same_tree(&src, &pushed, false);
    let pulled = work.path().join("pulled");
    let out = run(fastcp(&sshd, bin())
        .args(idiom)
        .arg("-r")
        .arg(remote(&sshd, &src))
        .arg(&pulled));
    assert!(out.status.success(), "{}", stderr(&out));
    assert_same_tree(&src, &pulled, false);
    assert_eq!(std::fs::metadata("/dev/null").unwrap().len(), 0);
}

/// With StrictHostKeyChecking no, a changed host key is announced and the copy goes on with
/// public keys only, as with ssh; with the default it is refused.
#[test]
fn a_changed_host_key_is_refused_unless_strict_checking_is_off() {
    let mut sshd = Sshd::start().unwrap();
    sshd.change_host_key().unwrap();
    let work = tempfile::tempdir().unwrap();
    let src = work.path().join("f");
    std::fs::write(&src, b"x").unwrap();
    let out = run(fastcp(&sshd, bin())
        .arg(&src)
        .arg(remote(&sshd, &work.path().join("refused"))));
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    let out = run(fastcp(&sshd, bin())
        .args(["-o", "StrictHostKeyChecking=no"])
        .arg(&src)
        .arg(remote(&sshd, &work.path().join("accepted"))));
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("REMOTE HOST IDENTIFICATION HAS CHANGED"),
        "{}",
        stderr(&out)
    );
    assert!(
        stderr(&out).contains("password and keyboard-interactive authentication are disabled"),
        "{}",
        stderr(&out)
    );
    assert!(work.path().join("accepted").exists());
}

/// Host keys of several types, as ssh treats them: a host known by its RSA key that also has
/// an ED25519 one is asked for the RSA key (and passes `StrictHostKeyChecking yes`); a host
/// known by an RSA key that now shows only an ED25519 one has changed, even under
/// `accept-new`, and known_hosts is left as it was.
#[test]
fn a_host_is_checked_against_the_key_types_it_is_known_by() {
    let work = tempfile::tempdir().unwrap();
    let rsa = work.path().join("host_rsa");
    let ed = work.path().join("host_ed25519");
    keygen("rsa", &rsa);
    keygen("ed25519", &ed);
    let rsa_pub = std::fs::read_to_string(work.path().join("host_rsa.pub")).unwrap();
    let rsa_line = |sshd: &Sshd| {
        let name = sshd.known_hosts_line();
        let host = name.split_whitespace().next().unwrap().to_owned();
        let mut parts = rsa_pub.split_whitespace();
        format!(
            "{host} {} {}\n",
            parts.next().unwrap(),
            parts.next().unwrap()
        )
    };
    let src = work.path().join("f");
    std::fs::write(&src, b"x").unwrap();

    // Both keys (the ED25519 one listed first); known by the RSA one only.
    let both = Sshd::start_with_options(&format!(
        "HostKey {}\nHostKey {}",
        ed.display(),
        rsa.display()
    ))
    .unwrap();
    std::fs::write(both.known_hosts(), rsa_line(&both)).unwrap();
    let out = run(fastcp(&both, bin())
        .arg(&src)
        .arg(remote(&both, &work.path().join("both"))));
    assert!(out.status.success(), "{}", stderr(&out));

    // Only the ED25519 key now; known by the RSA one.
    let other = Sshd::start().unwrap();
    std::fs::write(other.known_hosts(), rsa_line(&other)).unwrap();
    let out = run(fastcp(&other, bin())
        .args(["-o", "StrictHostKeyChecking=accept-new"])
        .arg(&src)
        .arg(remote(&other, &work.path().join("other"))));
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("HAS CHANGED") || stderr(&out).contains("changed"),
        "{}",
        stderr(&out)
    );
    assert!(!work.path().join("other").exists());
    assert_eq!(
        std::fs::read_to_string(other.known_hosts()).unwrap(),
        rsa_line(&other)
    );
}

/// A server that refuses forwarded streams (`AllowStreamLocalForwarding no`, as hardened
/// servers set it) still gets the copy, over the session's own channel, with a warning.
#[test]
fn a_server_without_forwarding_gets_the_copy_over_one_stream() {
    let sshd = Sshd::start_with_options("AllowStreamLocalForwarding no").unwrap();
    let work = tempfile::tempdir().unwrap();
    let src = work.path().join("big");
    std::fs::write(&src, pseudo_random(5 << 20, 7)).unwrap();
    for (name, pull) in [("pushed", false), ("pulled", true)] {
        let to = work.path().join(name);
        let mut cmd = fastcp(&sshd, bin());
        cmd.args(["--transport", "ssh", "-j", "2"]);
        let out = match pull {
            false => run(cmd.arg(&src).arg(remote(&sshd, &to))),
            true => run(cmd.arg(remote(&sshd, &src)).arg(&to)),
        };
        assert!(out.status.success(), "{name}: {}", stderr(&out));
        assert!(stderr(&out).contains("one stream"), "{}", stderr(&out));
        assert_eq!(std::fs::read(&to).unwrap(), std::fs::read(&src).unwrap());
    }
}

/// An sshd that drops connections beyond one logging in at a time from an address
/// (`PerSourceMaxStartups 1`) refuses the extra logins of a copy over four streams, which
/// start together: the copy still completes, over the connections that did log in, with one
/// warning that says why.
#[test]
fn a_server_that_refuses_extra_logins_gets_the_copy_over_fewer_streams() {
    let sshd = Sshd::start_with_options("PerSourceMaxStartups 1").unwrap();
    let work = tempfile::tempdir().unwrap();
    let src = work.path().join("tree");
    mixed_tree(&src);
    for (name, pull) in [("pushed", false), ("pulled", true)] {
        let to = work.path().join(name);
        let mut cmd = fastcp(&sshd, bin());
        cmd.args(["-r", "-p", "--transport", "ssh", "-j", "4"]);
        let out = match pull {
            false => run(cmd.arg(&src).arg(remote(&sshd, &to))),
            true => run(cmd.arg(remote(&sshd, &src)).arg(&to)),
        };
        assert!(out.status.success(), "{name}: {}", stderr(&out));
        let warnings = stderr(&out).matches("fastcp: warning: ").count();
        assert_eq!(warnings, 1, "{name}: {}", stderr(&out));
        assert!(
            stderr(&out).contains("refused extra logins (MaxStartups/PerSourceMaxStartups?)"),
            "{name}: {}",
            stderr(&out)
        );
        assert_same_tree(&src, &to, true);
        assert_no_temp(&to);
    }
    assert!(sshd.log().contains("past MaxStartups"), "{}", sshd.log());
}

/// A remote `$TMPDIR` that does not exist does not stop the SSH channels' extra streams:
/// their socket goes to /tmp instead.
#[test]
fn a_remote_tmpdir_that_is_missing_is_passed_over() {
    let sshd =
        Sshd::start_with_env(&[("TMPDIR", Path::new("/nonexistent-tmpdir-fastcp"))]).unwrap();
    let work = tempfile::tempdir().unwrap();
    let src = work.path().join("big");
    std::fs::write(&src, pseudo_random(5 << 20, 8)).unwrap();
    let to = work.path().join("copy");
    let out = run(fastcp(&sshd, bin())
        .args(["--transport", "ssh", "-j", "2", "-v"])
        .arg(&src)
        .arg(remote(&sshd, &to)));
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stderr(&out).contains("2 stream(s)"), "{}", stderr(&out));
    assert_eq!(std::fs::read(&to).unwrap(), std::fs::read(&src).unwrap());
}

/// A server that allows only AES-CTR is reached by the built-in client and by the system
/// ssh; and the system ssh, as scp runs it, ignores the user's RemoteCommand and
/// LocalCommand, which would otherwise take the server's place or write into its pipe.
#[test]
fn ctr_only_servers_and_remote_commands_in_ssh_config() {
    let sshd = Sshd::start_with_options("Ciphers aes256-ctr,aes128-ctr").unwrap();
    let work = tempfile::tempdir().unwrap();
    let src = work.path().join("f");
    std::fs::write(&src, b"payload").unwrap();
    for (name, program) in [("builtin", None), ("ssh", Some("ssh"))] {
        let mut cmd = fastcp(&sshd, bin());
        if let Some(p) = program {
            cmd.args(["--ssh-program", p]);
        }
        let to = work.path().join(name);
        let out = run(cmd.arg(&src).arg(remote(&sshd, &to)));
        assert!(out.status.success(), "{name}: {}", stderr(&out));
        assert_eq!(std::fs::read(&to).unwrap(), b"payload");
    }
    // scp's flags: -c names the SSH cipher; -B, -4, -T, -O and -s are taken as scp takes them.
    let to = work.path().join("scp-flags");
    let out = run(fastcp(&sshd, bin())
        .args(["-c", "aes128-ctr", "-B", "-4", "-T", "-O", "-s"])
        .arg(&src)
        .arg(remote(&sshd, &to)));
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(std::fs::read(&to).unwrap(), b"payload");
    let cfg = work.path().join("config");
    let base = std::fs::read_to_string(sshd.ssh_config()).unwrap();
    let commands = sshd.host_block("with-commands").replace(
        "BatchMode yes\n",
        "BatchMode yes\n  RemoteCommand echo not-fastcp\n  PermitLocalCommand yes\n  \
         LocalCommand echo local-output\n",
    );
    std::fs::write(&cfg, format!("{commands}\n{base}")).unwrap();
    for (name, program) in [("builtin", None), ("ssh", Some("ssh"))] {
        let mut cmd = Command::new(BIN);
        if let Some(p) = program {
            cmd.args(["--ssh-program", p]);
        }
        let to = work.path().join(format!("commands-{name}"));
        let out = run(cmd
            .arg("-F")
            .arg(&cfg)
            .arg("--remote-path")
            .arg(bin())
            .arg(&src)
            .arg(format!("with-commands:{}", to.display())));
        assert!(out.status.success(), "{name}: {}", stderr(&out));
        assert_eq!(std::fs::read(&to).unwrap(), b"payload");
    }
}

/// A ProxyCommand in ssh_config carries the built-in client's connection, with its tokens
/// expanded: here `ssh -W %h:%p` through a second sshd, which logs the forwarding.
#[test]
fn proxy_command_carries_the_connection() {
    let sshd = Sshd::start().unwrap();
    let jump = sshd.start_jump().unwrap();
    let work = tempfile::tempdir().unwrap();
    let cfg = work.path().join("config");
    let base = std::fs::read_to_string(sshd.ssh_config()).unwrap();
    let proxied = sshd.host_block("via-proxy").replace(
        "BatchMode yes\n",
        &format!(
            "BatchMode yes\n  ProxyCommand ssh -F {} -W %h:%p {}\n",
            sshd.ssh_config().display(),
            jump.alias()
        ),
    );
    std::fs::write(&cfg, format!("{proxied}\n{base}")).unwrap();
    let src = work.path().join("tree");
    build_tiny(&src, 10);
    let dst = work.path().join("copy");
    let out = run(fastcp_with_config(&cfg)
        .args(["-r", "-v"])
        .arg(&src)
        .arg(format!("via-proxy:{}", dst.display())));
    assert!(out.status.success(), "{}", stderr(&out));
    assert_same_tree(&src, &dst, false);
    assert!(jump.log().contains("direct-tcpip"), "{}", jump.log());
}

/// A ProxyCommand that exits before the handshake is named in the error, beside what it
/// said itself, rather than a bare "Disconnected".
#[test]
fn a_proxy_command_that_exits_is_named() {
    let sshd = Sshd::start().unwrap();
    let work = tempfile::tempdir().unwrap();
    let cfg = work.path().join("config");
    let proxied = sshd.host_block("via-proxy").replace(
        "BatchMode yes\n",
        "BatchMode yes\n  ProxyCommand sh -c 'echo no route from here >&2; exit 3'\n",
    );
    std::fs::write(&cfg, proxied).unwrap();
    std::fs::write(work.path().join("a"), b"a").unwrap();
    let out = run(fastcp_with_config(&cfg)
        .arg(work.path().join("a"))
        .arg(format!("via-proxy:{}", work.path().join("b").display())));
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    let said = stderr(&out);
    assert!(said.contains("no route from here"), "{said}");
    assert!(
        said.contains("the ProxyCommand exited (exit status: 3)"),
        "{said}"
    );
    assert!(!work.path().join("b").exists());
}

/// ssh_config that only OpenSSH's client serves (a `Match` block, a host known by its
/// certificate authority) hands the connection to the system ssh, which fastcp runs by
/// itself, saying so; the data still takes the TCP transport, or SFTP when asked.
#[test]
fn configs_only_the_system_ssh_serves_are_handed_to_it() {
    let sshd = Sshd::start_with_host_certificate().unwrap();
    let work = tempfile::tempdir().unwrap();
    let src = work.path().join("tree");
    build_tiny(&src, 30);
    let block = sshd.host_block(sshd.alias());

    let with_match = work.path().join("match_config");
    std::fs::write(
        &with_match,
        format!("{block}Match host 127.0.0.1\n  ServerAliveInterval 15\n"),
    )
    .unwrap();
    // Only the host CA is known, not the host's own key.
    let ca_known = work.path().join("ca_known_hosts");
    std::fs::write(
        &ca_known,
        format!("{}\n", sshd.cert_authority_line().unwrap()),
    )
    .unwrap();
    let with_ca = work.path().join("ca_config");
    std::fs::write(
        &with_ca,
        block.replace(
            &sshd.known_hosts().display().to_string(),
            &ca_known.display().to_string(),
        ),
    )
    .unwrap();

    for (config, why, extra, transport) in [
        (&with_match, "Match", None, "tcp"),
        (&with_ca, "@cert-authority", None, "tcp"),
        (&with_ca, "@cert-authority", Some("--sftp"), "sftp"),
    ] {
        let dst = work.path().join(format!("copy-{transport}-{}", why.len()));
        let out = run(fastcp_with_config(config)
            .args(["-r", "-v", "--json"])
            .args(extra)
            .arg(&src)
            .arg(remote(&sshd, &dst)));
        assert!(out.status.success(), "{why}: {}", stderr(&out));
        let said = stderr(&out);
        assert!(said.contains(why), "{said}");
        assert!(said.contains("running the system ssh"), "{said}");
        assert_eq!(json(&out)["transport"], transport);
        assert_same_tree(&src, &dst, false);
    }
}

/// An sshd that lets in only keys certified by a user CA of the test's own (sshd's
/// `TrustedUserCAKeys`, no authorized_keys at all), and that CA's private key, made in `dir`.
fn user_ca_sshd(dir: &Path) -> (Sshd, PathBuf) {
    let ca = dir.join("user_ca");
    keygen("ed25519", &ca);
    let sshd = Sshd::start_with_options(&format!(
        "TrustedUserCAKeys {}.pub\nAuthorizedKeysFile none\n",
        ca.display()
    ))
    .unwrap();
    (sshd, ca)
}

/// Certifies `key`'s public half with `ca` for `principal`, for an hour: `<key>-cert.pub`.
fn certify(ca: &Path, key: &Path, principal: &str) -> PathBuf {
    let made = Command::new(fastcp_testsupport::tools::require("ssh-keygen"))
        .args(["-q", "-s"])
        .arg(ca)
        .args(["-I", "fastcp-test-user", "-n", principal, "-V", "+1h"])
        .arg(format!("{}.pub", key.display()))
        .status()
        .unwrap();
    assert!(made.success(), "ssh-keygen -s");
    PathBuf::from(format!("{}-cert.pub", key.display()))
}

/// The fixture's ssh_config for `sshd` without the lines starting with any of `drop`, plus
/// `add`, written to `dir/name`.
fn config_without(sshd: &Sshd, dir: &Path, name: &str, drop: &[&str], add: &str) -> PathBuf {
    let text: String = std::fs::read_to_string(sshd.ssh_config())
        .unwrap()
        .lines()
        .filter(|l| !drop.iter().any(|d| l.trim_start().starts_with(d)))
        .map(|l| format!("{l}\n"))
        .collect();
    let config = dir.join(name);
    std::fs::write(&config, format!("{text}{add}")).unwrap();
    config
}

/// Copies a small file (written in `dir`) to `sshd` with `-F config`, `extra` arguments and
/// the agent `agent` (none if `None`), with `-v`; returns the output and checks that the
/// built-in client made the copy.
fn copy_with_certificate(
    sshd: &Sshd,
    config: &Path,
    dir: &Path,
    agent: Option<&Path>,
    extra: &[&std::ffi::OsStr],
    to: &Path,
) -> Output {
    let src = dir.join("cert-src");
    write(&src, b"certified", 0o644);
    let mut cmd = Command::new(BIN);
    cmd.arg("-F")
        .arg(config)
        .args(["--remote-path", BIN, "-v"])
        .args(extra)
        .env_remove("SSH_AUTH_SOCK");
    if let Some(sock) = agent {
        cmd.env("SSH_AUTH_SOCK", sock);
    }
    let out = run(cmd.arg(&src).arg(remote(sshd, to)));
    if out.status.success() {
        assert_eq!(std::fs::read(to).unwrap(), b"certified");
        assert!(
            !stderr(&out).contains("running the system ssh"),
            "{}",
            stderr(&out)
        );
    }
    out
}

/// A server that trusts only a user CA lets in a key whose certificate lies beside it
/// (`<key>-cert.pub`), as ssh offers it: named with `-i` (ed25519 and RSA, signed with
/// SHA-2). A default identity (`~/.ssh/id_ed25519`) is one as these are, beneath the
/// password database's home, which the test leaves alone.
#[test]
fn a_certificate_beside_the_identity_file_logs_in() {
    let work = tempfile::tempdir().unwrap();
    let (sshd, ca) = user_ca_sshd(work.path());
    for kind in ["ed25519", "rsa"] {
        let key = work.path().join(format!("id_{kind}"));
        keygen(kind, &key);
        certify(&ca, &key, sshd.user());
        let to = work.path().join(format!("with-{kind}"));
        let out = copy_with_certificate(
            &sshd,
            &sshd.ssh_config(),
            work.path(),
            None,
            &["-i".as_ref(), key.as_os_str()],
            &to,
        );
        assert!(out.status.success(), "{kind}: {}", stderr(&out));
    }
    assert!(sshd.log().contains("ED25519-CERT"), "{}", sshd.log());
}

/// The agent's certificates are offered: `ssh-add` adds the key's certificate beside it,
/// which is then taken away from the disk, and no identity file is named.
#[test]
fn a_certificate_in_the_agent_logs_in() {
    let work = tempfile::tempdir().unwrap();
    let (sshd, ca) = user_ca_sshd(work.path());
    let cert = certify(&ca, &sshd.client_key(), sshd.user());
    let agent = sshd.start_agent().unwrap();
    std::fs::remove_file(&cert).unwrap();
    let config = config_without(
        &sshd,
        work.path(),
        "agent_config",
        &["IdentityFile", "IdentitiesOnly"],
        "",
    );
    let to = work.path().join("b");
    let out = copy_with_certificate(&sshd, &config, work.path(), Some(agent.socket()), &[], &to);
    assert!(out.status.success(), "{}", stderr(&out));
}

/// `CertificateFile` (in ssh_config or `-o`) is served by the built-in client: the
/// certificate, kept away from its key, is signed by the identity file's key, or by the
/// agent's copy of that key when the agent holds the key alone.
#[test]
fn certificate_file_is_served_by_the_built_in_client() {
    let work = tempfile::tempdir().unwrap();
    let (sshd, ca) = user_ca_sshd(work.path());
    let key = work.path().join("id_ed25519");
    keygen("ed25519", &key);
    let beside = certify(&ca, &key, sshd.user());
    let elsewhere = work.path().join("certs/mine.pub");
    std::fs::create_dir(work.path().join("certs")).unwrap();
    std::fs::rename(&beside, &elsewhere).unwrap();
    let config = config_without(
        &sshd,
        work.path(),
        "cert_config",
        &["IdentityFile"],
        &format!(
            "  IdentityFile {}\n  CertificateFile {}\n",
            key.display(),
            elsewhere.display()
        ),
    );
    let to = work.path().join("from-file");
    let out = copy_with_certificate(&sshd, &config, work.path(), None, &[], &to);
    assert!(out.status.success(), "{}", stderr(&out));

    let agent = sshd.start_agent().unwrap();
    let added = Command::new(fastcp_testsupport::tools::require("ssh-add"))
        .arg(&key)
        .env("SSH_AUTH_SOCK", agent.socket())
        .output()
        .unwrap();
    assert!(added.status.success());
    let option = format!("CertificateFile={}", elsewhere.display());
    let config = config_without(
        &sshd,
        work.path(),
        "agent_cert_config",
        &["IdentityFile", "IdentitiesOnly"],
        "",
    );
    let to = work.path().join("from-agent");
    let out = copy_with_certificate(
        &sshd,
        &config,
        work.path(),
        Some(agent.socket()),
        &["-o".as_ref(), option.as_ref()],
        &to,
    );
    assert!(out.status.success(), "{}", stderr(&out));
}

/// A certificate for another user is refused as any unknown key is (exit code 3), and the
/// error says which certificate was tried and whom it names.
#[test]
fn a_certificate_for_another_user_is_refused() {
    let work = tempfile::tempdir().unwrap();
    let (sshd, ca) = user_ca_sshd(work.path());
    let key = work.path().join("id_ed25519");
    keygen("ed25519", &key);
    let cert = certify(&ca, &key, "someone-else");
    let to = work.path().join("b");
    let out = copy_with_certificate(
        &sshd,
        &sshd.ssh_config(),
        work.path(),
        None,
        &["-i".as_ref(), key.as_os_str()],
        &to,
    );
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    let said = stderr(&out);
    assert!(said.contains("Permission denied"), "{said}");
    assert!(
        said.contains(&format!(
            "{} (certificate for someone-else)",
            cert.display()
        )),
        "{said}"
    );
    assert!(!to.exists());
}

/// `-i` naming a file that is not there: a warning in ssh's words, once, and the copy goes on
/// with ssh_config's identity, through the built-in client and the system ssh alike.
#[test]
fn a_missing_identity_file_is_warned_about_and_passed_over() {
    let sshd = Sshd::start().unwrap();
    let work = tempfile::tempdir().unwrap();
    let a = work.path().join("a");
    write(&a, b"key", 0o644);
    let missing = work.path().join("no-such-key");
    let warning = format!(
        "Identity file {} not accessible: No such file or directory.",
        missing.display()
    );
    for program in [None, Some("ssh")] {
        let to = work
            .path()
            .join(format!("b-{}", program.unwrap_or("builtin")));
        let mut cmd = fastcp(&sshd, bin());
        cmd.arg("-i").arg(&missing);
        if let Some(p) = program {
            cmd.args(["--ssh-program", p]);
        }
        let out = run(cmd.arg(&a).arg(remote(&sshd, &to)));
        assert!(out.status.success(), "{program:?}: {}", stderr(&out));
        assert_eq!(
            stderr(&out).matches(&warning).count(),
            1,
            "{program:?}: {}",
            stderr(&out)
        );
        assert_eq!(std::fs::read(&to).unwrap(), b"key");
    }
}

/// Remote sources with and without `user@`, as scp takes them: `me@host:a host:b` is one
/// login when ssh_config (or the local user) makes `me` the user of `host:`; another user is
/// another login, and refused.
#[test]
fn sources_with_and_without_the_same_user_are_one_login() {
    let sshd = Sshd::start().unwrap();
    let work = tempfile::tempdir().unwrap();
    let (a, b) = (work.path().join("a"), work.path().join("b"));
    write(&a, b"first", 0o644);
    write(&b, b"second", 0o644);
    let with_user = |path: &Path, user: &str| format!("{user}@{}", remote(&sshd, path));
    let dst = work.path().join("dst");
    std::fs::create_dir(&dst).unwrap();
    let out = run(fastcp(&sshd, bin())
        .arg(with_user(&a, sshd.user()))
        .arg(remote(&sshd, &b))
        .arg(&dst));
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(std::fs::read(dst.join("a")).unwrap(), b"first");
    assert_eq!(std::fs::read(dst.join("b")).unwrap(), b"second");

    let other = work.path().join("other");
    std::fs::create_dir(&other).unwrap();
    for operands in [
        [remote(&sshd, &a), with_user(&b, "nobody-else")],
        [with_user(&a, "nobody-else"), remote(&sshd, &b)],
    ] {
        let out = run(fastcp(&sshd, bin()).args(&operands).arg(&other));
        assert_eq!(out.status.code(), Some(2), "{operands:?}: {}", stderr(&out));
        assert!(std::fs::read_dir(&other).unwrap().next().is_none());
    }
}

/// The agent's copy of an identity file's certificate (`ssh-add` adds it beside the key) is
/// offered right after that key, as ssh offers it, and once, not after the agent's other
/// keys: a server's `MaxAuthTries` counts every offer.
#[test]
fn the_agents_copy_of_a_certificate_is_offered_beside_its_key() {
    let work = tempfile::tempdir().unwrap();
    let ca = work.path().join("user_ca");
    keygen("ed25519", &ca);
    let sshd = Sshd::start_with_options(&format!(
        "TrustedUserCAKeys {}.pub\nAuthorizedKeysFile none\nMaxAuthTries 3\n",
        ca.display()
    ))
    .unwrap();
    // The agent holds the fixture's key and two others, none of which this server takes,
    // before the certified key.
    let agent = sshd.start_agent().unwrap();
    let key = work.path().join("id_ed25519");
    for name in ["other1", "other2", "id_ed25519"] {
        let path = work.path().join(name);
        keygen("ed25519", &path);
        if path == key {
            certify(&ca, &key, sshd.user());
        }
        let added = Command::new(fastcp_testsupport::tools::require("ssh-add"))
            .arg(&path)
            .env("SSH_AUTH_SOCK", agent.socket())
            .output()
            .unwrap();
        assert!(added.status.success());
    }
    let config = config_without(
        &sshd,
        work.path(),
        "agent_cert_beside",
        &["IdentityFile", "IdentitiesOnly"],
        &format!("  IdentityFile {}\n", key.display()),
    );
    let to = work.path().join("b");
    let out = copy_with_certificate(&sshd, &config, work.path(), Some(agent.socket()), &[], &to);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(!sshd.log().contains("Too many authentication failures"));
}

/// A certificate beside an identity file that certifies another key is not signed with
/// that file's key, which the server could only refuse: the error says why it was left.
#[test]
fn a_certificate_of_another_key_is_not_signed_with_the_identity_file() {
    let work = tempfile::tempdir().unwrap();
    let (sshd, ca) = user_ca_sshd(work.path());
    let key = work.path().join("id_ed25519");
    keygen("ed25519", &key);
    let other = work.path().join("other");
    keygen("ed25519", &other);
    let cert = certify(&ca, &other, sshd.user());
    let beside = PathBuf::from(format!("{}-cert.pub", key.display()));
    std::fs::rename(&cert, &beside).unwrap();
    let to = work.path().join("b");
    let out = copy_with_certificate(
        &sshd,
        &sshd.ssh_config(),
        work.path(),
        None,
        &["-i".as_ref(), key.as_os_str()],
        &to,
    );
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    let said = stderr(&out);
    assert!(
        said.contains(&format!(
            "{} (certifies another key than {})",
            beside.display(),
            key.display()
        )),
        "{said}"
    );
    assert!(!sshd.log().contains("ED25519-CERT"), "{}", sshd.log());
}

/// RevokedHostKeys in the user's ssh_config refuses a host whose key it lists, as ssh does:
/// a list of public keys is read by the built-in client, a key revocation list in OpenSSH's
/// binary format (`ssh-keygen -k`) is handed to the system ssh, which reads it. A list that
/// names another key lets the copy through.
#[test]
fn a_host_key_listed_in_revoked_host_keys_is_refused() {
    let sshd = Sshd::start().unwrap();
    let work = tempfile::tempdir().unwrap();
    let src = work.path().join("a");
    write(&src, b"x", 0o644);
    let listed = work.path().join("revoked");
    std::fs::write(&listed, format!("{} revoked\n", sshd.host_public_key())).unwrap();
    let krl = work.path().join("revoked.krl");
    let made = Command::new(fastcp_testsupport::tools::require("ssh-keygen"))
        .args(["-q", "-k", "-f"])
        .arg(&krl)
        .arg(&listed)
        .status()
        .unwrap();
    assert!(made.success(), "ssh-keygen -k");
    let other = work.path().join("other");
    keygen("ed25519", &other);
    let other_listed = work.path().join("other.pub");

    for (list, refused, by_system_ssh) in [
        (&listed, true, false),
        (&krl, true, true),
        (&other_listed, false, false),
    ] {
        let name = list.file_name().unwrap().to_str().unwrap();
        let add = format!("  RevokedHostKeys {}\n", list.display());
        let config = config_without(&sshd, work.path(), &format!("{name}.config"), &[], &add);
        let dst = work.path().join(format!("copy-{name}"));
        let out = run(fastcp_with_config(&config)
            .arg("-v")
            .arg(&src)
            .arg(remote(&sshd, &dst)));
        let said = stderr(&out);
        assert_eq!(
            said.contains("running the system ssh"),
            by_system_ssh,
            "{said}"
        );
        if refused {
            assert_eq!(out.status.code(), Some(3), "{name}: {said}");
            assert!(said.contains("revoked"), "{name}: {said}");
            assert!(!dst.exists(), "{name}");
        } else {
            assert!(out.status.success(), "{name}: {said}");
            assert_eq!(std::fs::read(&dst).unwrap(), b"x");
        }
    }
}

/// The user's ssh_config is honoured or handed to the system ssh, never dropped: keys that
/// PubkeyAcceptedAlgorithms leaves out are not offered, an RSA key below RequiredRSASize is
/// not offered, and what a copy needs nothing of (SendEnv) is named under `-v`.
#[test]
fn pubkey_algorithms_and_rsa_size_in_ssh_config_are_honoured() {
    let sshd = Sshd::start().unwrap();
    let work = tempfile::tempdir().unwrap();
    let src = work.path().join("a");
    write(&src, b"x", 0o644);
    // A 1024-bit RSA key, which sshd takes (its RequiredRSASize is 1024).
    let rsa = work.path().join("id_rsa");
    let made = Command::new(fastcp_testsupport::tools::require("ssh-keygen"))
        .args(["-q", "-t", "rsa", "-b", "1024", "-N", "", "-f"])
        .arg(&rsa)
        .status()
        .unwrap();
    assert!(made.success(), "ssh-keygen -t rsa");
    let authorized = std::fs::read_to_string(sshd.authorized_keys()).unwrap();
    let rsa_pub = std::fs::read_to_string(rsa.with_extension("pub")).unwrap();
    std::fs::write(sshd.authorized_keys(), format!("{authorized}{rsa_pub}")).unwrap();

    let cases = [
        (
            "ed25519 not accepted",
            "  PubkeyAcceptedAlgorithms rsa-sha2-*\n",
            false,
            "is not in PubkeyAcceptedAlgorithms",
        ),
        (
            "ed25519 accepted",
            "  PubkeyAcceptedAlgorithms ssh-ed25519,rsa-sha2-*\n  SendEnv LANG\n",
            true,
            "passed over, as a copy needs nothing of them: SendEnv",
        ),
        (
            "small rsa",
            &format!("  IdentityFile {}\n  RequiredRSASize 2048\n", rsa.display()),
            false,
            "fewer than RequiredRSASize 2048",
        ),
        (
            "rsa",
            &format!("  IdentityFile {}\n", rsa.display()),
            true,
            "authenticated",
        ),
        // sshd takes rsa-sha2-512 first; ssh signs with the one the list allows.
        (
            "rsa with sha-256 signatures only",
            &format!(
                "  IdentityFile {}\n  PubkeyAcceptedAlgorithms rsa-sha2-256\n",
                rsa.display()
            ),
            true,
            "authenticated",
        ),
        (
            "rsa with sha-1 signatures only",
            &format!(
                "  IdentityFile {}\n  PubkeyAcceptedAlgorithms ssh-rsa\n",
                rsa.display()
            ),
            false,
            "no RSA signature the server takes is in PubkeyAcceptedAlgorithms",
        ),
    ];
    for (i, (case, add, copied, says)) in cases.iter().enumerate() {
        // The rsa cases offer the RSA key alone.
        let drop: &[&str] = if case.contains("rsa") {
            &["IdentityFile"]
        } else {
            &[]
        };
        let config = config_without(&sshd, work.path(), &format!("config{i}"), drop, add);
        let dst = work.path().join(format!("copy{i}"));
        let out = run(fastcp_with_config(&config)
            .arg("-v")
            .arg(&src)
            .arg(remote(&sshd, &dst)));
        let said = stderr(&out);
        assert!(said.contains(says), "{case}: {said}");
        assert!(!said.contains("running the system ssh"), "{case}: {said}");
        if *copied {
            assert!(out.status.success(), "{case}: {said}");
            assert_eq!(std::fs::read(&dst).unwrap(), b"x", "{case}");
        } else {
            assert_eq!(out.status.code(), Some(3), "{case}: {said}");
            assert!(!dst.exists(), "{case}");
        }
    }
}

/// An unknown host key, refused for each reason in words of its own: only
/// `StrictHostKeyChecking yes` is "strict checking"; under ssh's default (`ask`) with no
/// terminal, or with BatchMode, the message says so, and how to trust the key.
#[test]
fn an_unknown_host_key_is_refused_for_the_reason_that_applied() {
    let sshd = Sshd::start().unwrap();
    std::fs::write(sshd.known_hosts(), "").unwrap();
    let work = tempfile::tempdir().unwrap();
    let a = work.path().join("a");
    write(&a, b"x", 0o644);
    let target = remote(&sshd, &work.path().join("b"));
    let keyscan = format!("ssh-keyscan -p {} 127.0.0.1 >> ", sshd.port());
    // `-o` comes before the ssh_config's `StrictHostKeyChecking yes` and `BatchMode yes`.
    for (options, says) in [
        (
            &["StrictHostKeyChecking=yes"][..],
            "you have requested strict checking",
        ),
        (
            &["StrictHostKeyChecking=ask", "BatchMode=no"][..],
            "there is no terminal to ask on",
        ),
        (
            &["StrictHostKeyChecking=ask", "BatchMode=yes"][..],
            "BatchMode yes forbids asking",
        ),
    ] {
        // Without a controlling terminal, as in cron or CI.
        let mut cmd = Command::new(fastcp_testsupport::tools::require("setsid"));
        cmd.arg("-w")
            .arg(BIN)
            .arg("-F")
            .arg(sshd.ssh_config())
            .args(["--remote-path", BIN])
            .env_remove("SSH_AUTH_SOCK")
            .stdin(std::process::Stdio::null());
        for option in options {
            cmd.args(["-o", option]);
        }
        let out = run(cmd.arg(&a).arg(&target));
        let said = stderr(&out);
        assert_eq!(out.status.code(), Some(3), "{options:?}: {said}");
        assert!(said.contains(says), "{options:?}: {said}");
        assert!(said.contains("Host key verification failed"), "{said}");
        assert!(said.contains(&keyscan), "{options:?}: {said}");
        assert!(said.contains("StrictHostKeyChecking=accept-new"), "{said}");
        if options[0] != "StrictHostKeyChecking=yes" {
            assert!(!said.contains("strict checking"), "{options:?}: {said}");
        }
        assert!(!work.path().join("b").exists());
    }
}

/// `--sftp` through the system ssh with a key the server does not take: the login failed, in
/// ssh's words; the host is not said to lack SFTP. A host that does lack it is still named so.
#[test]
fn a_failed_login_of_the_system_ssh_over_sftp_is_named_as_such() {
    let sshd = Sshd::start().unwrap();
    let work = tempfile::tempdir().unwrap();
    let key = work.path().join("stranger");
    let st = Command::new(fastcp_testsupport::tools::require("ssh-keygen"))
        .args(["-q", "-t", "ed25519", "-N", "", "-f"])
        .arg(&key)
        .status()
        .unwrap();
    assert!(st.success());
    let cfg = work.path().join("config");
    let block = sshd.host_block(sshd.alias()).replace(
        &sshd.client_key().display().to_string(),
        &key.display().to_string(),
    );
    std::fs::write(&cfg, block).unwrap();
    let a = work.path().join("a");
    write(&a, b"x", 0o644);
    let out = run(Command::new(BIN)
        .arg("-F")
        .arg(&cfg)
        .args(["--sftp", "--ssh-program", "ssh"])
        .env_remove("SSH_AUTH_SOCK")
        .arg(&a)
        .arg(remote(&sshd, &work.path().join("b"))));
    let said = stderr(&out);
    assert_eq!(out.status.code(), Some(3), "{said}");
    assert!(said.contains("Permission denied (publickey)"), "{said}");
    assert!(!said.contains("SFTP"), "{said}");
    assert!(!work.path().join("b").exists());

    let bare = Sshd::start_without_sftp(&[]).unwrap();
    let out = run(fastcp(&bare, bin())
        .args(["--sftp", "--ssh-program", "ssh"])
        .arg(&a)
        .arg(remote(&bare, &work.path().join("b"))));
    let said = stderr(&out);
    assert_eq!(out.status.code(), Some(3), "{said}");
    assert!(
        said.contains("no SFTP either (ssh: subsystem request failed"),
        "{said}"
    );
}

/// An ssh program that exits at once (`-S /bin/false`) is named, with its status: the remote
/// host is not blamed for it (over SFTP, it is not said to lack SFTP).
#[test]
fn an_ssh_program_that_exits_at_once_is_named_with_its_status() {
    let sshd = Sshd::start().unwrap();
    let work = tempfile::tempdir().unwrap();
    let a = work.path().join("a");
    write(&a, b"x", 0o644);
    for extra in [&[][..], &["--sftp"][..]] {
        let out = run(fastcp(&sshd, bin())
            .args(["-S", "/bin/false"])
            .args(extra)
            .arg(&a)
            .arg(remote(&sshd, &work.path().join("b"))));
        let said = stderr(&out);
        assert_eq!(out.status.code(), Some(3), "{extra:?}: {said}");
        let before = if extra.is_empty() {
            "before the remote command"
        } else {
            "before any SFTP reply"
        };
        assert!(
            said.contains(&format!(
                "the ssh program /bin/false exited with status 1 {before}"
            )),
            "{extra:?}: {said}"
        );
        assert!(!said.contains("serves no SFTP"), "{extra:?}: {said}");
        assert!(!work.path().join("b").exists());
    }
}

/// As scp: -4 and -6 together are no error, and the last one given wins (the test sshd
/// listens on 127.0.0.1 only, so IPv6 cannot reach it), with the built-in client and with
/// the system ssh.
#[test]
fn the_last_of_4_and_6_wins() {
    let sshd = Sshd::start().unwrap();
    let work = tempfile::tempdir().unwrap();
    let a = work.path().join("a");
    write(&a, b"x", 0o644);
    for program in [&[][..], &["-S", "ssh"][..]] {
        let b = work.path().join("b");
        let out = run(fastcp(&sshd, bin())
            .args(program)
            .args(["-6", "-4"])
            .arg(&a)
            .arg(remote(&sshd, &b)));
        assert!(out.status.success(), "{program:?}: {}", stderr(&out));
        assert_eq!(std::fs::read(&b).unwrap(), b"x");
        std::fs::remove_file(&b).unwrap();
        let out = run(fastcp(&sshd, bin())
            .args(program)
            .args(["-4", "-6"])
            .arg(&a)
            .arg(remote(&sshd, &b)));
        let said = stderr(&out);
        assert_eq!(out.status.code(), Some(3), "{program:?}: {said}");
        assert!(
            said.to_lowercase().contains("family"),
            "{program:?}: {said}"
        );
        assert!(!b.exists(), "{program:?}");
    }
}

/// ssh_config's `Match exec` commands run each time ssh reads the configuration: fastcp asks
/// `ssh -G` once per connection, however many times it needs the resolved configuration
/// (whether ssh may prompt, where the TCP data streams connect), so a TCP copy runs them
/// twice, as `ssh -G` then the login do, not once more for each question.
#[test]
fn match_exec_commands_run_once_per_reading_of_the_config() {
    let sshd = Sshd::start().unwrap();
    let work = tempfile::tempdir().unwrap();
    let ran = work.path().join("ran");
    let config = work.path().join("config");
    std::fs::write(
        &config,
        format!(
            "{}Match exec \"echo x >> {}\"\n  ServerAliveInterval 15\n",
            sshd.host_block(sshd.alias()),
            ran.display()
        ),
    )
    .unwrap();
    std::fs::write(work.path().join("a"), b"matched").unwrap();
    let out = run(fastcp_with_config(&config)
        .args(["--transport", "tcp"])
        .arg(work.path().join("a"))
        .arg(remote(&sshd, &work.path().join("b"))));
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(std::fs::read(work.path().join("b")).unwrap(), b"matched");
    let runs = std::fs::read_to_string(&ran).unwrap().lines().count();
    assert_eq!(runs, 2, "`Match exec` ran {runs} times");
}
