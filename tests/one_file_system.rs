//! `-x` (`--one-file-system`, as rsync's): a walk does not descend into a directory on
//! another file system than its source, which arrives as an empty directory.
//!
//! The other file system is a tmpfs mounted on `tree/mnt` in a private mount namespace
//! (`unshare --mount --map-root-user`, as root or as a user allowed user namespaces), so
//! nothing outside the test sees it: the walking side runs inside it (the local copy, the
//! pushing client, or the remote `fastcp server` of a pull through `--remote-path`). Each
//! copy without `-x` is the control: the mount's file arrives then, so the boundary is real.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::*;
use fastcp_testsupport::Sshd;
use fastcp_testsupport::tree::write;

/// Shell code that mounts a tmpfs on `$MNT` and puts a file in it, or exits 99.
const MOUNT: &str = r#"mount -t tmpfs -o size=1m tmpfs "$MNT" || exit 99
echo beneath the mount > "$MNT/inner.txt" || exit 99"#;

/// `dir/tree` with a file, a folder and the empty folder `mnt` the tmpfs goes on.
fn tree(dir: &Path) -> PathBuf {
    let tree = dir.join("tree");
    std::fs::create_dir_all(tree.join("sub")).unwrap();
    write(&tree.join("top.txt"), b"top\n", 0o644);
    write(&tree.join("sub/deep.txt"), b"deep\n", 0o644);
    std::fs::create_dir(tree.join("mnt")).unwrap();
    tree
}

/// Runs fastcp with `args` in a mount namespace where `mnt` is the tmpfs.
fn fastcp_in_namespace(mnt: &Path, args: &[&str]) -> std::process::Output {
    run(Command::new(fastcp_testsupport::tools::require("unshare"))
        .args(["--mount", "--map-root-user", "sh", "-c"])
        .arg(format!("{MOUNT}\nexec \"$BIN\" \"$@\""))
        .arg("sh")
        .args(args)
        .env("MNT", mnt)
        .env("BIN", BIN)
        .env_remove("SSH_AUTH_SOCK"))
}

/// A remote program in `dir`: fastcp (as `fastcp server`, through `--remote-path`) in a mount
/// namespace where `src/mnt` is the tmpfs, so that a pull's walk meets the mount.
fn mounted_server(dir: &Path, src: &Path) -> PathBuf {
    script(
        dir,
        "fastcp-mounted",
        &format!(
            "export MNT='{}'\nexec unshare --mount --map-root-user sh -c '{MOUNT}\n\
             exec \"{BIN}\" \"$@\"' fastcp \"$@\"",
            src.join("mnt").display()
        ),
    )
}

/// Checks what `dst` (a copy of [`tree`]) holds: everything, and beneath `mnt` the mount's
/// file unless `one_file_system`.
fn assert_copied(dst: &Path, one_file_system: bool, what: &str) {
    assert_eq!(
        std::fs::read(dst.join("top.txt")).unwrap(),
        b"top\n",
        "{what}"
    );
    assert_eq!(
        std::fs::read(dst.join("sub/deep.txt")).unwrap(),
        b"deep\n",
        "{what}"
    );
    let beneath: Vec<_> = std::fs::read_dir(dst.join("mnt"))
        .unwrap_or_else(|e| panic!("{what}: mnt: {e}"))
        .map(|e| e.unwrap().file_name())
        .collect();
    if one_file_system {
        assert!(beneath.is_empty(), "{what}: {beneath:?}");
    } else {
        assert_eq!(beneath, ["inner.txt"], "{what}");
    }
}

#[test]
fn a_local_copy_and_a_push_stay_on_the_sources_file_system() {
    let sshd = Sshd::start().unwrap();
    let work = tempfile::tempdir().unwrap();
    let src = tree(work.path());
    let mnt = src.join("mnt");
    let config = sshd.ssh_config();
    let config = config.to_str().unwrap();
    let from = format!("{}/.", src.display());
    for (way, extra) in [
        ("local", &[][..]),
        ("tcp", &["--transport", "tcp"][..]),
        ("ssh", &["--transport", "ssh"][..]),
        ("sftp", &["--sftp"][..]),
    ] {
        for x in [true, false] {
            let dst = work.path().join(format!("{way}-{x}"));
            let to = match way {
                "local" => dst.display().to_string(),
                _ => remote(&sshd, &dst),
            };
            let mut args = vec!["-r", "-F", config, "--remote-path", BIN];
            args.extend(extra);
            if x {
                args.push("-x");
            }
            args.extend([from.as_str(), to.as_str()]);
            let out = fastcp_in_namespace(&mnt, &args);
            assert!(out.status.success(), "{way} -x {x}: {}", stderr(&out));
            assert_copied(&dst, x, &format!("{way} -x {x}"));
        }
    }
}

#[test]
fn a_pull_stays_on_the_sources_file_system_and_sftp_refuses_it() {
    let sshd = Sshd::start().unwrap();
    let work = tempfile::tempdir().unwrap();
    let src = tree(work.path());
    let server = mounted_server(work.path(), &src);
    for transport in ["tcp", "ssh"] {
        for x in [true, false] {
            let dst = work.path().join(format!("{transport}-{x}"));
            let mut cmd = fastcp(&sshd, &server);
            cmd.args(["-r", "--transport", transport]);
            if x {
                cmd.arg("-x");
            }
            let out = run(cmd
                .arg(format!("{}:{}/.", sshd.alias(), src.display()))
                .arg(&dst));
            assert!(out.status.success(), "{transport} -x {x}: {}", stderr(&out));
            assert_copied(&dst, x, &format!("pull {transport} -x {x}"));
        }
    }
    // SFTP's listings carry no device numbers: refused before anything is copied.
    let dst = work.path().join("sftp");
    let out = run(fastcp(&sshd, bin())
        .args(["-r", "-x", "--sftp"])
        .arg(format!("{}:{}/.", sshd.alias(), src.display()))
        .arg(&dst));
    assert!(!out.status.success());
    assert!(stderr(&out).contains("-x on a pull"), "{}", stderr(&out));
    assert!(!dst.exists());
}

/// With `--delete`, what the destination holds beneath a mount point the walk did not enter
/// is left alone, as rsync leaves it, while the extras elsewhere go; `-n` lists the same.
#[test]
fn delete_leaves_what_lies_beneath_a_mount_point() {
    let sshd = Sshd::start().unwrap();
    let work = tempfile::tempdir().unwrap();
    let src = tree(work.path());
    let config = sshd.ssh_config();
    let config = config.to_str().unwrap();
    let from = format!("{}/.", src.display());
    // Each destination holds an extra beneath mnt and one beside it.
    let seed = |dst: &Path| {
        let _ = std::fs::remove_dir_all(dst);
        std::fs::create_dir_all(dst.join("mnt")).unwrap();
        write(&dst.join("mnt/kept.txt"), b"kept\n", 0o644);
        write(&dst.join("extra.txt"), b"extra\n", 0o644);
    };
    let server = mounted_server(work.path(), &src);
    let server = server.to_str().unwrap();
    let remote_src = format!("{}:{}/.", sshd.alias(), src.display());
    for way in [
        "local",
        "push tcp",
        "push ssh",
        "push sftp",
        "pull tcp",
        "pull ssh",
    ] {
        // An SFTP push refuses -n with --delete.
        for dry_run in [true, false]
            .into_iter()
            .filter(|&n| !n || way != "push sftp")
        {
            let dst = work.path().join("dst");
            seed(&dst);
            let to = remote(&sshd, &dst);
            let dst_text = dst.display().to_string();
            let mut args = vec!["-r", "-x", "--delete", "-F", config];
            if dry_run {
                args.push("-n");
            }
            let (from, to) = match way {
                "local" => (from.as_str(), dst_text.as_str()),
                w if w.starts_with("push") => (from.as_str(), to.as_str()),
                _ => (remote_src.as_str(), dst_text.as_str()),
            };
            match way {
                "push sftp" => args.push("--sftp"),
                "local" => {}
                w => args.extend(["--transport", &w[5..]]),
            }
            // A pull's walk is the server's, in its namespace; the others walk here.
            let out = if way.starts_with("pull") {
                args.extend(["--remote-path", server, from, to]);
                run(Command::new(BIN).args(&args).env_remove("SSH_AUTH_SOCK"))
            } else {
                args.extend(["--remote-path", BIN, from, to]);
                fastcp_in_namespace(&src.join("mnt"), &args)
            };
            let what = format!("{way} -n {dry_run}");
            assert!(out.status.success(), "{what}: {}", stderr(&out));
            assert_eq!(
                std::fs::read(dst.join("mnt/kept.txt")).unwrap(),
                b"kept\n",
                "{what}"
            );
            if dry_run {
                let said = String::from_utf8_lossy(&out.stdout);
                let deleting = |name: &str| {
                    said.lines()
                        .any(|l| l.starts_with("deleting") && l.ends_with(name))
                };
                assert!(deleting("extra.txt"), "{what}: {said}");
                assert!(!said.contains("kept.txt"), "{what}: {said}");
                assert!(dst.join("extra.txt").exists(), "{what}");
            } else {
                assert!(!dst.join("extra.txt").exists(), "{what}");
                assert_eq!(
                    std::fs::read(dst.join("top.txt")).unwrap(),
                    b"top\n",
                    "{what}"
                );
                assert!(!dst.join("mnt/inner.txt").exists(), "{what}");
            }
        }
    }
}
