//! `fastcp server --restrict-to DIR` and its other policy flags, as a forced command in
//! authorized_keys would run it: a confined client reads and writes inside its folder and
//! nowhere else, and what the policy refuses fails before anything is read or written.

mod common;

use std::path::Path;

use common::*;
use fastcp_testsupport::Sshd;
use fastcp_testsupport::tree::{pseudo_random, write};

/// A remote program that is `fastcp server` with `flags`, as a forced command sets it.
fn restricted(dir: &Path, name: &str, flags: &str) -> std::path::PathBuf {
    script(dir, name, &format!("exec '{BIN}' \"$@\" {flags}"))
}

/// `host:path` for a path the client names to the server as typed (not made absolute).
fn named(sshd: &Sshd, path: &str) -> String {
    format!("{}:{path}", sshd.alias())
}

fn refused(out: &std::process::Output, says: &str) {
    assert!(!out.status.success(), "the server allowed it");
    assert!(stderr(out).contains(says), "{}", stderr(out));
}

#[test]
fn a_confined_client_copies_inside_its_folder_and_nowhere_else() {
    let sshd = Sshd::start().unwrap();
    let work = tempfile::tempdir().unwrap();
    let root = work.path().join("root");
    let outside = work.path().join("outside");
    std::fs::create_dir_all(root.join("in")).unwrap();
    std::fs::create_dir_all(&outside).unwrap();
    write(&outside.join("secret"), b"not yours", 0o644);
    std::os::unix::fs::symlink(&outside, root.join("link")).unwrap();
    let src = work.path().join("file");
    write(&src, &pseudo_random(300_000, 1), 0o644);
    let server = restricted(
        work.path(),
        "confined",
        &format!("--restrict-to '{}'", root.display()),
    );

    // Inside: relative, absolute (taken from the folder) and `~/` paths all land beneath it.
    for (typed, lands) in [("in/a", "in/a"), ("/in/b", "in/b"), ("~/c", "c")] {
        let out = run(fastcp(&sshd, &server).arg(&src).arg(named(&sshd, typed)));
        assert!(out.status.success(), "{typed}: {}", stderr(&out));
        assert_eq!(
            std::fs::read(root.join(lands)).unwrap(),
            std::fs::read(&src).unwrap()
        );
    }
    let back = work.path().join("back");
    let out = run(fastcp(&sshd, &server).arg(named(&sshd, "in/a")).arg(&back));
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(std::fs::read(&back).unwrap(), std::fs::read(&src).unwrap());

    // Out: `..`, a symlink out of the folder, an absolute path of the outside folder.
    let outside_abs = outside.join("x").display().to_string();
    for typed in ["../outside/x", "link/x", "in/../../outside/x"] {
        let out = run(fastcp(&sshd, &server).arg(&src).arg(named(&sshd, typed)));
        refused(&out, "outside the folder this server is confined to");
    }
    for typed in ["../outside/secret", "link/secret", "link/*"] {
        let got = work.path().join("got");
        let out = run(fastcp(&sshd, &server).arg(named(&sshd, typed)).arg(&got));
        refused(&out, "outside the folder");
        assert!(!got.exists());
    }
    // An absolute path names a place inside the folder, which does not exist there.
    let out = run(fastcp(&sshd, &server)
        .arg(&src)
        .arg(named(&sshd, &outside_abs)));
    assert!(!out.status.success());
    assert_eq!(
        std::fs::read_dir(&outside).unwrap().count(),
        1,
        "nothing written outside"
    );
    // A pull may not ask to follow symlinks (the library's `follow_links`).
    let plan = fastcp::Plan::new(
        vec![fastcp::Location::parse(&named(&sshd, "in"))],
        fastcp::Location::Local(work.path().join("followed")),
        fastcp::CopyOptions::default()
            .recursive(true)
            .follow_links(true),
    )
    .unwrap();
    let ssh = fastcp::transport::SshOptions::default()
        .config_file(sshd.ssh_config())
        .remote_path(server.display().to_string());
    let progress = std::sync::Arc::new(fastcp::Progress::default());
    let err = fastcp::blocking::copy_remote(&plan, &ssh, progress).unwrap_err();
    assert!(
        err.to_string().contains("does not follow symlinks"),
        "{err}"
    );
    assert_eq!(err.kind(), fastcp::ErrorKind::PermissionDenied, "{err}");
    assert!(!work.path().join("followed").exists());

    // A folder's contents may go into a folder beneath it, not into the folder itself: its
    // top-level entry would be named in the folder's parent, outside.
    let tree = work.path().join("tree");
    std::fs::create_dir(&tree).unwrap();
    write(&tree.join("t.txt"), b"contents", 0o644);
    let contents = format!("{}/.", tree.display());
    for typed in ["~", "/", "in/.."] {
        let out = run(fastcp(&sshd, &server)
            .arg("-r")
            .arg(&contents)
            .arg(named(&sshd, typed)));
        refused(&out, "cannot go into the folder this server is confined to");
    }
    assert!(!root.join("t.txt").exists());
    let out = run(fastcp(&sshd, &server)
        .arg("-r")
        .arg(&contents)
        .arg(named(&sshd, "in")));
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(std::fs::read(root.join("in/t.txt")).unwrap(), b"contents");
}

#[test]
fn read_only_write_only_and_no_delete_refuse_what_they_say() {
    let sshd = Sshd::start().unwrap();
    let work = tempfile::tempdir().unwrap();
    let tree = work.path().join("tree");
    std::fs::create_dir(&tree).unwrap();
    write(&tree.join("a"), b"a", 0o644);
    let dst = work.path().join("dst");
    std::fs::create_dir(&dst).unwrap();
    let to = remote(&sshd, &dst);
    let from = remote(&sshd, &tree);

    let read_only = restricted(work.path(), "ro", "--read-only");
    let out = run(fastcp(&sshd, &read_only).arg("-r").arg(&tree).arg(&to));
    refused(&out, "read-only");
    assert_eq!(std::fs::read_dir(&dst).unwrap().count(), 0);
    let out = run(fastcp(&sshd, &read_only)
        .arg("-r")
        .arg(&from)
        .arg(work.path().join("pulled")));
    assert!(out.status.success(), "{}", stderr(&out));

    let write_only = restricted(work.path(), "wo", "--write-only");
    let out = run(fastcp(&sshd, &write_only)
        .arg("-r")
        .arg(&from)
        .arg(work.path().join("pulled2")));
    refused(&out, "write-only");
    assert!(!work.path().join("pulled2").exists());
    // A dry run's --delete would list the destination back.
    let out = run(fastcp(&sshd, &write_only)
        .args(["-n", "-r", "--delete"])
        .arg(&tree)
        .arg(&to));
    refused(&out, "write-only");

    let no_delete = restricted(work.path(), "nd", "--no-delete");
    std::fs::create_dir(dst.join("tree")).unwrap();
    write(&dst.join("tree/keep"), b"keep", 0o644);
    let out = run(fastcp(&sshd, &no_delete)
        .args(["-r", "--delete"])
        .arg(&tree)
        .arg(&to));
    refused(&out, "does not allow --delete");
    assert!(dst.join("tree/keep").exists());
    let out = run(fastcp(&sshd, &no_delete).arg("-r").arg(&tree).arg(&to));
    assert!(out.status.success(), "{}", stderr(&out));
}
