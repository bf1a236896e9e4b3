//! Self-deploy: a remote host without fastcp gets one uploaded into a private per-user cache,
//! checked by SHA-256 before it runs, and reused by later copies.
//!
//! The harness's sshd gives its sessions `XDG_CACHE_HOME` in a temporary folder, so nothing
//! is written under the real home; its sessions' PATH has no fastcp. The copies run without
//! `--remote-path`.

mod common;

use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;

use common::*;
use fastcp_testsupport::Sshd;
use fastcp_testsupport::tree::{assert_same_tree, build_tiny};

/// A `fastcp` command for `sshd` that names no remote program.
fn fastcp_plain(sshd: &Sshd) -> Command {
    let mut cmd = Command::new(BIN);
    cmd.arg("-F")
        .arg(sshd.ssh_config())
        .arg("-v")
        .env_remove("SSH_AUTH_SOCK");
    cmd
}

/// The one cached binary under `cache`.
fn cached(cache: &Path) -> PathBuf {
    let dir = cache.join("fastcp");
    let mut found: Vec<PathBuf> = fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path().join("fastcp"))
        .filter(|p| p.exists())
        .collect();
    assert_eq!(found.len(), 1, "{found:?}");
    found.pop().unwrap()
}

#[test]
fn a_remote_without_fastcp_gets_it_deployed_then_reuses_it() {
    let work = tempfile::tempdir().unwrap();
    let cache = work.path().join("cache");
    let sshd = Sshd::start_with_env(&[("XDG_CACHE_HOME", &cache)]).unwrap();
    let src = work.path().join("src");
    build_tiny(&src, 20);

    let dst = work.path().join("pushed");
    let out = run(fastcp_plain(&sshd)
        .args(["-r", "--transport", "ssh"])
        .arg(&src)
        .arg(remote(&sshd, &dst)));
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stderr(&out).contains("uploading"), "{}", stderr(&out));
    // The remote shell's complaint about the missing program is not shown: fastcp handles it.
    assert!(!stderr(&out).contains("not found"), "{}", stderr(&out));
    assert_same_tree(&src, &dst, false);
    let binary = cached(&cache);
    let first = fs::metadata(&binary).unwrap();
    assert_eq!(first.permissions().mode() & 0o777, 0o700);
    assert_eq!(
        fs::metadata(binary.parent().unwrap())
            .unwrap()
            .permissions()
            .mode()
            & 0o077,
        0,
        "the cache folder must be private"
    );
    assert_eq!(fs::read(&binary).unwrap(), fs::read(BIN).unwrap());

    // A second copy, a pull over TCP, reuses it: nothing uploaded, the file untouched.
    let pulled = work.path().join("pulled");
    let out = run(fastcp_plain(&sshd)
        .args(["-r", "--transport", "tcp"])
        .arg(remote(&sshd, &src))
        .arg(&pulled));
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(!stderr(&out).contains("uploading"), "{}", stderr(&out));
    assert!(!stderr(&out).contains("not found"), "{}", stderr(&out));
    // Found by the first command, in one round trip: no inspection, no second start.
    assert!(
        stderr(&out).contains("self-deploy cached there"),
        "{}",
        stderr(&out)
    );
    assert!(!stderr(&out).contains("deploying it"), "{}", stderr(&out));
    assert_same_tree(&src, &pulled, false);
    let again = fs::metadata(&binary).unwrap();
    assert_eq!((again.ino(), again.mtime()), (first.ino(), first.mtime()));
}

/// Through the system ssh too: the binary goes up through `ssh host 'exec sh -c …'`, and the
/// forwarded streams (`--transport ssh`, `ssh -W`) run the deployed server.
#[test]
fn the_system_ssh_deploys_too() {
    let work = tempfile::tempdir().unwrap();
    let cache = work.path().join("cache");
    let sshd = Sshd::start_with_env(&[("XDG_CACHE_HOME", &cache)]).unwrap();
    let src = work.path().join("src");
    build_tiny(&src, 20);

    let dst = work.path().join("pushed");
    let out = run(fastcp_plain(&sshd)
        .args(["-r", "--json", "--ssh-program", "ssh"])
        .arg(&src)
        .arg(remote(&sshd, &dst)));
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stderr(&out).contains("uploading"), "{}", stderr(&out));
    assert_same_tree(&src, &dst, false);
    assert_eq!(json(&out)["transport"], "tcp");
    assert_eq!(fs::read(cached(&cache)).unwrap(), fs::read(BIN).unwrap());

    let pulled = work.path().join("pulled");
    let out = run(fastcp_plain(&sshd)
        .args([
            "-r",
            "--json",
            "-j",
            "2",
            "--ssh-program",
            "ssh",
            "--transport",
            "ssh",
        ])
        .arg(remote(&sshd, &src))
        .arg(&pulled));
    assert!(out.status.success(), "{}", stderr(&out));
    // Found by the first command, in one round trip: no inspection, no second start.
    assert!(
        stderr(&out).contains("self-deploy cached there"),
        "{}",
        stderr(&out)
    );
    assert!(!stderr(&out).contains("deploying it"), "{}", stderr(&out));
    assert_same_tree(&src, &pulled, false);
    let summary = json(&out);
    assert_eq!(summary["transport"], "ssh", "{summary}");
    assert_eq!(summary["streams"], 2, "{summary}");
}

#[test]
fn a_tampered_cached_binary_is_replaced_and_never_run() {
    let work = tempfile::tempdir().unwrap();
    let cache = work.path().join("cache");
    let sshd = Sshd::start_with_env(&[("XDG_CACHE_HOME", &cache)]).unwrap();
    let src = work.path().join("file");
    fs::write(&src, b"payload").unwrap();
    let out = run(fastcp_plain(&sshd)
        .arg(&src)
        .arg(remote(&sshd, &work.path().join("one"))));
    assert!(out.status.success(), "{}", stderr(&out));
    let binary = cached(&cache);
    // Someone swaps the cached binary for a program that leaves a mark when it runs.
    let canary = work.path().join("ran");
    fs::write(
        &binary,
        format!("#!/bin/sh\ntouch '{}'\nexit 1\n", canary.display()),
    )
    .unwrap();
    let out = run(fastcp_plain(&sshd)
        .arg(&src)
        .arg(remote(&sshd, &work.path().join("two"))));
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stderr(&out).contains("replacing"), "{}", stderr(&out));
    assert!(!canary.exists(), "the tampered binary ran");
    assert_eq!(fs::read(&binary).unwrap(), fs::read(BIN).unwrap());
    assert_eq!(fs::read(work.path().join("two")).unwrap(), b"payload");
}

/// A cached binary with the right hash that others may write is not run: anyone who may
/// write it could swap it between any check and its start. The copy replaces it, with a
/// warning, and runs the new one.
#[test]
fn a_cached_binary_others_may_write_is_replaced_not_run() {
    let work = tempfile::tempdir().unwrap();
    let cache = work.path().join("cache");
    let sshd = Sshd::start_with_env(&[("XDG_CACHE_HOME", &cache)]).unwrap();
    let src = work.path().join("file");
    fs::write(&src, b"payload").unwrap();
    let copy = |to: &str| {
        run(fastcp_plain(&sshd)
            .arg(&src)
            .arg(remote(&sshd, &work.path().join(to))))
    };
    let out = copy("one");
    assert!(out.status.success(), "{}", stderr(&out));
    let binary = cached(&cache);
    let first = fs::metadata(&binary).unwrap().ino();
    fs::set_permissions(&binary, fs::Permissions::from_mode(0o722)).unwrap();
    let out = copy("two");
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stderr(&out).contains("replacing"), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("writable by nobody else"),
        "{}",
        stderr(&out)
    );
    let now = fs::metadata(&binary).unwrap();
    assert_ne!(now.ino(), first, "not replaced");
    assert_eq!(now.permissions().mode() & 0o777, 0o700);
    assert_eq!(fs::read(&binary).unwrap(), fs::read(BIN).unwrap());
    assert_eq!(fs::read(work.path().join("two")).unwrap(), b"payload");
}

#[test]
fn a_cache_folder_others_can_write_is_refused_and_sftp_copies() {
    let work = tempfile::tempdir().unwrap();
    let cache = work.path().join("cache");
    fs::create_dir_all(cache.join("fastcp")).unwrap();
    fs::set_permissions(cache.join("fastcp"), fs::Permissions::from_mode(0o777)).unwrap();
    let sshd = Sshd::start_with_env(&[("XDG_CACHE_HOME", &cache)]).unwrap();
    let src = work.path().join("file");
    fs::write(&src, b"payload").unwrap();
    let out = run(fastcp_plain(&sshd)
        .arg(&src)
        .arg(remote(&sshd, &work.path().join("copy"))));
    // Nothing is uploaded to it nor run from it; the copy goes over SFTP, saying why.
    assert!(out.status.success(), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(err.contains("refusing the cache folder"), "{err}");
    assert!(err.contains("copying over SFTP"), "{err}");
    assert_eq!(fs::read(work.path().join("copy")).unwrap(), b"payload");
    assert_eq!(fs::read_dir(cache.join("fastcp")).unwrap().count(), 0);
}

/// A cache folder reached through a symlink (`~/.cache` linked to a private folder on another
/// disk) is judged by the folder it leads to, the user's own: fastcp is uploaded there, and
/// the next copy runs it at once.
#[test]
fn a_cache_folder_behind_a_symlink_is_used() {
    let work = tempfile::tempdir().unwrap();
    let real = work.path().join("real-cache");
    fs::create_dir(&real).unwrap();
    fs::set_permissions(&real, fs::Permissions::from_mode(0o700)).unwrap();
    let cache = work.path().join("cache");
    std::os::unix::fs::symlink(&real, &cache).unwrap();
    let sshd = Sshd::start_with_env(&[("XDG_CACHE_HOME", &cache)]).unwrap();
    let src = work.path().join("file");
    fs::write(&src, b"payload").unwrap();
    let out = run(fastcp_plain(&sshd)
        .arg(&src)
        .arg(remote(&sshd, &work.path().join("one"))));
    assert!(out.status.success(), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(!err.contains("refusing"), "{err}");
    assert!(err.contains("uploading"), "{err}");
    assert_eq!(fs::read(cached(&real)).unwrap(), fs::read(BIN).unwrap());
    let out = run(fastcp_plain(&sshd)
        .arg(&src)
        .arg(remote(&sshd, &work.path().join("two"))));
    assert!(out.status.success(), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(err.contains("self-deploy cached there"), "{err}");
    assert!(!err.contains("deploying it"), "{err}");
    assert_eq!(fs::read(work.path().join("two")).unwrap(), b"payload");
}

/// A relative `XDG_CACHE_HOME` is not a place (the XDG spec says to ignore it): the cache is
/// `~/.cache`, as without it, and the copy runs fastcp from there.
#[test]
fn a_relative_xdg_cache_home_is_ignored() {
    if !rustix::process::geteuid().is_root() {
        eprintln!("skipped: giving sshd's user a home of its own needs root");
        return;
    }
    let work = tempfile::tempdir().unwrap();
    let sshd = Sshd::start_with_login_shell(
        Path::new("/bin/sh"),
        &[("XDG_CACHE_HOME", Path::new("relative-cache"))],
    )
    .unwrap();
    let src = work.path().join("file");
    fs::write(&src, b"payload").unwrap();
    for name in ["one", "two"] {
        let out = run(fastcp_plain(&sshd)
            .arg(&src)
            .arg(remote(&sshd, &work.path().join(name))));
        assert!(out.status.success(), "{}", stderr(&out));
        assert!(!stderr(&out).contains("SFTP"), "{}", stderr(&out));
        assert_eq!(fs::read(work.path().join(name)).unwrap(), b"payload");
    }
    assert_eq!(
        fs::read(cached(&sshd.home().join(".cache"))).unwrap(),
        fs::read(BIN).unwrap()
    );
    assert!(!sshd.home().join("relative-cache").exists());
}

#[test]
fn no_deploy_and_no_sftp_fail_with_a_clear_error() {
    let work = tempfile::tempdir().unwrap();
    let cache = work.path().join("cache");
    let sshd = Sshd::start_without_sftp(&[("XDG_CACHE_HOME", &cache)]).unwrap();
    let src = work.path().join("file");
    fs::write(&src, b"payload").unwrap();
    let out = run(fastcp_plain(&sshd)
        .arg("--no-deploy")
        .arg(&src)
        .arg(remote(&sshd, &work.path().join("copy"))));
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    let said = stderr(&out);
    assert!(said.contains("--no-deploy"), "{said}");
    assert!(said.contains("no SFTP"), "{said}");
    assert!(!cache.exists());
    assert!(!work.path().join("copy").exists());
    // Through the system ssh, the error says what ssh said of the refused subsystem.
    let out = run(fastcp_plain(&sshd)
        .args(["--no-deploy", "--ssh-program", "ssh"])
        .arg(&src)
        .arg(remote(&sshd, &work.path().join("copy"))));
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    let said = stderr(&out);
    assert!(
        said.contains("no SFTP either (ssh: subsystem request failed"),
        "{said}"
    );
    assert!(!work.path().join("copy").exists());
}

/// A tmpfs mounted at a path for as long as it lives.
struct Tmpfs(PathBuf);

impl Tmpfs {
    /// Mounts a tmpfs with `options` at `path`; `None` (and a note) where this process may
    /// not mount, as when it is not root.
    fn mount(path: &Path, options: &str) -> Option<Tmpfs> {
        fs::create_dir_all(path).unwrap();
        let mounted = Command::new("mount")
            .args(["-t", "tmpfs", "-o", options, "tmpfs"])
            .arg(path)
            .status()
            .is_ok_and(|s| s.success());
        if !mounted {
            eprintln!("skipped: cannot mount a tmpfs here (the test needs root)");
            return None;
        }
        Some(Tmpfs(path.to_owned()))
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

/// Pushes a small tree with `--json` to a host without fastcp whose cache is a tmpfs mounted
/// with `options`, checks that it succeeded over SFTP with the tree whole, then hands its
/// stderr and the cache folder to `check` while the mount lasts. Does nothing (and says so)
/// where this process may not mount.
fn push_with_the_cache_mounted(options: &str, check: impl FnOnce(&str, &Path)) {
    let work = tempfile::tempdir().unwrap();
    let cache = work.path().join("cache");
    let Some(_mount) = Tmpfs::mount(&cache, options) else {
        return;
    };
    let sshd = Sshd::start_with_env(&[("XDG_CACHE_HOME", &cache)]).unwrap();
    let src = work.path().join("src");
    build_tiny(&src, 20);
    let dst = work.path().join("pushed");
    let out = run(fastcp_plain(&sshd)
        .args(["-r", "--json"])
        .arg(&src)
        .arg(remote(&sshd, &dst)));
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(json(&out)["transport"], "sftp");
    assert_same_tree(&src, &dst, false);
    check(&stderr(&out), &cache);
}

/// A cache on a noexec mount: the upload lands, but the binary cannot run (exit 126), and
/// the copy goes over SFTP instead.
#[test]
fn a_noexec_cache_falls_back_to_sftp() {
    push_with_the_cache_mounted("noexec,mode=0700", |err, _| {
        assert!(err.contains("uploading"), "{err}");
        assert!(err.contains("cannot run on the remote host"), "{err}");
    });
}

/// A remote disk that fills up during the upload: the partial upload is removed, nothing
/// is cached under the binary's name, and the copy goes over SFTP.
#[test]
fn a_full_remote_disk_during_the_upload_leaves_nothing_and_falls_back_to_sftp() {
    push_with_the_cache_mounted("size=1m,mode=0700", |err, cache| {
        assert!(err.contains("did not arrive whole"), "{err}");
        let left: Vec<PathBuf> = walkdir(cache);
        assert!(
            left.iter().all(|p| p.is_dir()),
            "only folders may remain: {left:?}"
        );
    });
}

/// Everything beneath `dir`.
fn walkdir(dir: &Path) -> Vec<PathBuf> {
    let mut all = Vec::new();
    for entry in fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            all.extend(walkdir(&path));
        }
        all.push(path);
    }
    all
}

/// A program that embeds fastcp is not fastcp: self-deploy does not upload it (it would run
/// it with `server` on the remote host). Without `cargo xtask dist` binaries, the library's
/// copy goes over SFTP, and nothing is put in the remote cache.
#[test]
fn a_program_that_embeds_fastcp_is_never_uploaded() {
    let work = tempfile::tempdir().unwrap();
    let cache = work.path().join("cache");
    let sshd = Sshd::start_with_env(&[("XDG_CACHE_HOME", &cache)]).unwrap();
    let src = work.path().join("f");
    fs::write(&src, b"embedded").unwrap();
    let dst = work.path().join("g");
    let plan = fastcp::Plan::new(
        vec![fastcp::Location::Local(src)],
        fastcp::Location::parse(&remote(&sshd, &dst)),
        fastcp::CopyOptions::default().deploy_from(work.path().join("no-dist")),
    )
    .unwrap();
    let ssh = fastcp::transport::SshOptions::default().config_file(sshd.ssh_config());
    let outcome =
        fastcp::blocking::copy_remote(&plan, &ssh, std::sync::Arc::new(Default::default()))
            .unwrap();
    assert_eq!(outcome.transport, fastcp::TransportUsed::Sftp);
    assert_eq!(fs::read(&dst).unwrap(), b"embedded");
    let cached = if cache.exists() {
        walkdir(&cache)
    } else {
        vec![]
    };
    assert!(cached.iter().all(|p| !p.ends_with("fastcp")), "{cached:?}");
}

/// A remote login shell whose startup file prints on stdout (an `echo` in `~/.bashrc`) garbles
/// what fastcp and SFTP read alike, as it does scp's: every copy fails with exit code 3 and
/// an error that quotes the shell's words and names their cause, the first one (which uploads
/// fastcp) as the next, and one over `--sftp`, through either SSH client; none says that the
/// host lacks SFTP or that fastcp may not be uploaded.
#[test]
fn a_login_shell_that_prints_fails_with_an_error_that_says_so() {
    if !rustix::process::geteuid().is_root() {
        eprintln!("skipped: giving sshd's user a home of its own needs root");
        return;
    }
    let work = tempfile::tempdir().unwrap();
    let sshd = Sshd::start_with_login_shell(Path::new("/bin/bash"), &[]).unwrap();
    fs::write(sshd.home().join(".bashrc"), "echo hello from bashrc\n").unwrap();
    let src = work.path().join("file");
    fs::write(&src, b"payload").unwrap();
    let dst = work.path().join("copy");
    let runs: [&[&str]; 5] = [
        &[],
        &[],
        &["--sftp"],
        &["--ssh-program", "ssh"],
        &["--ssh-program", "ssh", "--sftp"],
    ];
    for extra in runs {
        let out = run(fastcp_plain(&sshd)
            .args(extra)
            .arg(&src)
            .arg(remote(&sshd, &dst)));
        assert_eq!(out.status.code(), Some(3), "{extra:?}: {}", stderr(&out));
        let err = stderr(&out);
        assert!(err.contains("hello from bashrc"), "{extra:?}: {err}");
        assert!(err.contains("~/.bashrc"), "{extra:?}: {err}");
        assert!(!err.contains("serves no SFTP"), "{extra:?}: {err}");
        assert!(!err.contains("--no-deploy"), "{extra:?}: {err}");
        assert!(!dst.exists());
    }
}

/// A program that embeds fastcp deploys the `cargo xtask dist` binary it is given
/// (`CopyOptions::deploy_from`): it is uploaded into its own cache folder and run from there,
/// and the next copy starts it from there at once, with no inspection of the host, and
/// uploads nothing.
#[test]
fn a_program_that_embeds_fastcp_deploys_a_dist_binary_and_reuses_it() {
    let work = tempfile::tempdir().unwrap();
    let cache = work.path().join("cache");
    // The inspection runs `uname`; each run of it is counted.
    let tools = work.path().join("tools");
    fs::create_dir(&tools).unwrap();
    let counted = tools.join("uname-runs");
    script(
        &tools,
        "uname",
        &format!(
            "echo run >> '{}'; exec /usr/bin/uname \"$@\"",
            counted.display()
        ),
    );
    let path = PathBuf::from(format!("{}:/usr/local/bin:/usr/bin:/bin", tools.display()));
    let sshd = Sshd::start_with_env(&[("XDG_CACHE_HOME", &*cache), ("PATH", &path)]).unwrap();
    let inspections = || {
        fs::read_to_string(&counted)
            .map(|s| s.lines().count())
            .unwrap_or(0)
    };
    // The fastcp command stands in for the static build: the remote host is this one.
    let dist = work.path().join("dist");
    fs::create_dir(&dist).unwrap();
    let name = format!(
        "fastcp-{}-{}-unknown-linux-musl",
        env!("CARGO_PKG_VERSION"),
        std::env::consts::ARCH
    );
    fs::copy(BIN, dist.join(name)).unwrap();
    let src = work.path().join("f");
    fs::write(&src, b"embedded").unwrap();
    let ssh = fastcp::transport::SshOptions::default().config_file(sshd.ssh_config());
    let mut inode = None;
    let mut inspected_before = None;
    for dst in ["one", "two"] {
        let dst = work.path().join(dst);
        let plan = fastcp::Plan::new(
            vec![fastcp::Location::Local(src.clone())],
            fastcp::Location::parse(&remote(&sshd, &dst)),
            fastcp::CopyOptions::default().deploy_from(&dist),
        )
        .unwrap();
        let outcome =
            fastcp::blocking::copy_remote(&plan, &ssh, std::sync::Arc::new(Default::default()))
                .unwrap();
        assert_ne!(outcome.transport, fastcp::TransportUsed::Sftp, "{dst:?}");
        assert_eq!(fs::read(&dst).unwrap(), b"embedded");
        let binary = cached(&cache);
        assert_eq!(fs::read(&binary).unwrap(), fs::read(BIN).unwrap());
        let now = fs::metadata(&binary).unwrap().ino();
        assert_eq!(*inode.get_or_insert(now), now, "{dst:?}: uploaded again");
        let inspected = inspections();
        match inspected_before {
            None => assert!(inspected > 0, "{dst:?}: the first copy inspects the host"),
            Some(before) => assert_eq!(inspected, before, "{dst:?}: inspected again"),
        }
        inspected_before = Some(inspected);
    }
}

/// A folder holding a `fastcp` that speaks protocol versions `min..=max` and nothing more
/// (its hello, then it reads until the client goes), as an older or newer fastcp installed
/// on the remote PATH would start; each run adds a line to `runs` in the folder.
fn fastcp_of_versions(dir: &Path, min: u16, max: u16) -> PathBuf {
    use fastcp::proto::{Frame, Hello, encode};
    let bin = dir.join("remote-bin");
    fs::create_dir_all(&bin).unwrap();
    let mut wire = bytes::BytesMut::new();
    encode(
        &Frame::Hello(Hello {
            version: max,
            min_version: min,
            cpu_features: 0,
            ciphers: vec![1, 2, 3],
            compression: vec![0],
            max_frame: fastcp::proto::DEFAULT_MAX_FRAME,
            software: format!("fastcp 0.0.{max}"),
        }),
        &mut wire,
    );
    fs::write(bin.join("hello.bin"), &wire).unwrap();
    script(
        &bin,
        "fastcp",
        &format!(
            "echo run >> '{0}/runs'; cat '{0}/hello.bin'; cat > /dev/null",
            bin.display()
        ),
    );
    bin
}

/// How many times the `fastcp` of [`fastcp_of_versions`] ran.
fn runs(bin: &Path) -> usize {
    fs::read_to_string(bin.join("runs"))
        .map(|s| s.lines().count())
        .unwrap_or(0)
}

/// An sshd whose sessions find `bin` first on their PATH, and cache in `cache`.
fn sshd_with_path(bin: &Path, cache: &Path) -> Sshd {
    let path = PathBuf::from(format!("{}:/usr/local/bin:/usr/bin:/bin", bin.display()));
    Sshd::start_with_env(&[("XDG_CACHE_HOME", cache), ("PATH", &path)]).unwrap()
}

/// A fastcp on the remote PATH too old for what the copy asks (`--skip-unchanged` needs
/// protocol version 4; it speaks 3) does not fail the copy: this fastcp is uploaded into the
/// cache, with a warning that says why, and runs there. A later copy runs the cached one
/// first, in one round trip, and never starts the old one again. With `--no-deploy`, or a
/// remote program named with `--remote-path`, the copy fails as before: upgrade it there.
#[test]
fn an_older_fastcp_on_the_remote_path_is_passed_over_for_this_one() {
    let work = tempfile::tempdir().unwrap();
    let cache = work.path().join("cache");
    let bin = fastcp_of_versions(work.path(), 1, 3);
    let sshd = sshd_with_path(&bin, &cache);
    let src = work.path().join("src");
    build_tiny(&src, 20);

    // Refused where this program may not run there instead.
    let dst = work.path().join("pushed");
    for extra in [
        vec!["--no-deploy".to_owned()],
        vec![
            "--remote-path".to_owned(),
            bin.join("fastcp").display().to_string(),
        ],
    ] {
        let out = run(fastcp_plain(&sshd)
            .args(["-r", "--skip-unchanged"])
            .args(&extra)
            .arg(&src)
            .arg(remote(&sshd, &dst)));
        assert_eq!(out.status.code(), Some(2), "{extra:?}: {}", stderr(&out));
        let said = stderr(&out);
        assert!(
            said.contains("needs protocol version 4 on the remote side, and the remote fastcp 0.0.3 speaks 3: upgrade fastcp there"),
            "{extra:?}: {said}"
        );
        assert!(!said.contains("uploading"), "{extra:?}: {said}");
        assert!(!dst.exists());
    }
    assert_eq!(runs(&bin), 2);

    for transport in ["ssh", "tcp"] {
        let out = run(fastcp_plain(&sshd)
            .args(["-r", "--skip-unchanged", "--json", "--transport", transport])
            .arg(src.join("."))
            .arg(remote(&sshd, &dst)));
        assert!(out.status.success(), "{}", stderr(&out));
        let said = stderr(&out);
        assert_same_tree(&src, &dst, false);
        if transport == "ssh" {
            // The first: the old one speaks, then this one is uploaded and runs.
            assert!(said.contains("the remote fastcp 0.0.3 speaks 3"), "{said}");
            assert!(said.contains("meanwhile this fastcp runs there"), "{said}");
            assert!(said.contains("uploading"), "{said}");
            assert_eq!(runs(&bin), 3);
            assert_eq!(fs::read(cached(&cache)).unwrap(), fs::read(BIN).unwrap());
        } else {
            // The second: the cached one first; the old one is not started.
            assert!(!said.contains("0.0.3"), "{said}");
            assert!(!said.contains("uploading"), "{said}");
            assert!(!said.contains("deploying it"), "{said}");
            assert_eq!(runs(&bin), 3);
            assert_eq!(json(&out)["files_skipped"], 20, "{said}");
        }
    }
}

/// A copy between two remote hosts, one of them with a fastcp on its PATH too old for
/// `--skip-unchanged` (it speaks protocol version 3), the other with this fastcp: on the old
/// one's host (the sources' when `old_is_source`), this fastcp is uploaded into the cache,
/// with a warning that says why, and the relay is tried again and arrives whole. A later relay
/// runs the cached one there first and uploads nothing. With `--no-deploy`, or the remote
/// program named with `--remote-path` (which starts each host's own), the copy fails, naming
/// the old host, as a copy with that host alone does.
/// Two hosts for a relay under `work`: `oldhost`, whose PATH has `old_bin`'s fastcp, and
/// `newhost`, whose PATH has this build's; each with a cache of its own (the old host's is
/// returned) and both in the returned ssh_config. The sshds stop when dropped.
fn relay_hosts(work: &Path, old_bin: &Path) -> (Sshd, PathBuf, Sshd, PathBuf) {
    let new_bin = work.join("new-bin");
    fs::create_dir(&new_bin).unwrap();
    script(&new_bin, "fastcp", &format!("exec '{BIN}' \"$@\""));
    let host = |bin: &Path, cache: &str| {
        let path = PathBuf::from(format!("{}:/usr/local/bin:/usr/bin:/bin", bin.display()));
        let cache = work.join(cache);
        let vars = [
            ("XDG_CACHE_HOME", &*cache),
            ("PATH", &path),
            ("BIN_DIR", bin),
        ];
        (Sshd::start_with_env(&vars).unwrap(), cache)
    };
    let (old, old_cache) = host(old_bin, "old-cache");
    let (new, _) = host(&new_bin, "new-cache");
    let config = work.join("ssh_config");
    fs::write(
        &config,
        format!("{}{}", old.host_block("oldhost"), new.host_block("newhost")),
    )
    .unwrap();
    (old, old_cache, new, config)
}

/// The command that relays the contents of `src` on host `from` to `dst` on host `to`
/// (aliases in `config`), with `args`, and no agent.
fn relay_command(
    config: &Path,
    args: &[&str],
    (from, src): (&str, &Path),
    (to, dst): (&str, &Path),
) -> Command {
    let mut cmd = Command::new(BIN);
    cmd.arg("-F")
        .arg(config)
        .args(args)
        .arg(format!("{from}:{}/.", src.display()))
        .arg(format!("{to}:{}", dst.display()))
        .env_remove("SSH_AUTH_SOCK");
    cmd
}

fn a_relay_passes_over_an_older_fastcp(old_is_source: bool) {
    let work = tempfile::tempdir().unwrap();
    let old_bin = fastcp_of_versions(&work.path().join("old"), 1, 3);
    // Each host's PATH has its own fastcp, and so does the program `--remote-path` names.
    let per_host = script(
        work.path(),
        "fastcp-of-the-host",
        "exec \"$BIN_DIR/fastcp\" \"$@\"",
    );
    let (_old, old_cache, _new, config) = relay_hosts(work.path(), &old_bin);
    let (from, to) = if old_is_source {
        ("oldhost", "newhost")
    } else {
        ("newhost", "oldhost")
    };
    let src = work.path().join("src");
    build_tiny(&src, 20);
    let dst = work.path().join("dst");
    let relay = |extra: &[&str]| {
        let args = [&["-v", "-r", "--skip-unchanged", "--json"][..], extra].concat();
        run(&mut relay_command(&config, &args, (from, &src), (to, &dst)))
    };

    let per_host = per_host.display().to_string();
    for extra in [&["--no-deploy"][..], &["--remote-path", &per_host]] {
        let out = relay(extra);
        assert_eq!(out.status.code(), Some(2), "{extra:?}: {}", stderr(&out));
        let said = stderr(&out);
        // Said by either host's session: by the old one's, or by the other's, naming it.
        let named = said.lines().any(|line| {
            line.contains("needs protocol version 4 on the remote side")
                && (line.starts_with("fastcp: oldhost: ")
                    && line.contains("the remote fastcp 0.0.3 speaks 3: upgrade fastcp there")
                    || line.contains("the remote fastcp on oldhost speaks 3: upgrade fastcp there"))
        });
        assert!(named, "{extra:?}: {said}");
        assert!(!said.contains("uploading"), "{extra:?}: {said}");
        assert!(!dst.exists() && !old_cache.join("fastcp").exists());
    }
    assert_eq!(runs(&old_bin), 2);

    let out = relay(&[]);
    assert!(out.status.success(), "{}", stderr(&out));
    let said = stderr(&out);
    assert!(said.contains("speaks 3: upgrade fastcp there"), "{said}");
    assert!(
        said.contains("meanwhile this fastcp is to run on oldhost, from self-deploy's cache"),
        "{said}"
    );
    assert!(said.contains("oldhost: uploading"), "{said}");
    assert!(!said.contains("newhost: uploading"), "{said}");
    assert_same_tree(&src, &dst, false);
    assert_eq!(runs(&old_bin), 3);
    assert_eq!(
        fs::read(cached(&old_cache)).unwrap(),
        fs::read(BIN).unwrap()
    );

    // The cached one runs first: the old one is not started, nothing is uploaded.
    let out = relay(&[]);
    assert!(out.status.success(), "{}", stderr(&out));
    let said = stderr(&out);
    assert!(!said.contains("0.0.3"), "{said}");
    assert!(!said.contains("uploading"), "{said}");
    assert_eq!(json(&out)["files_skipped"], 20, "{said}");
    assert_eq!(runs(&old_bin), 3);
}

#[test]
fn a_relay_from_a_host_with_an_older_fastcp_deploys_this_one_there() {
    a_relay_passes_over_an_older_fastcp(true);
}

#[test]
fn a_relay_to_a_host_with_an_older_fastcp_deploys_this_one_there() {
    a_relay_passes_over_an_older_fastcp(false);
}

/// A relay to a host whose fastcp is newer and shares no protocol version with this one:
/// this fastcp runs there instead, and the copy is whole.
#[test]
fn a_relay_to_a_host_with_no_version_in_common_deploys_this_one_there() {
    let work = tempfile::tempdir().unwrap();
    let newest = fastcp::proto::PROTOCOL_VERSION;
    let far_bin = fastcp_of_versions(&work.path().join("far"), newest + 50, newest + 60);
    let (_far, far_cache, _new, config) = relay_hosts(work.path(), &far_bin);
    let src = work.path().join("src");
    build_tiny(&src, 20);
    let dst = work.path().join("dst");
    let out = run(&mut relay_command(
        &config,
        &["-v", "-r"],
        ("newhost", &src),
        ("oldhost", &dst),
    ));
    assert!(out.status.success(), "{}", stderr(&out));
    let said = stderr(&out);
    assert!(said.contains("this side is older"), "{said}");
    assert!(
        said.contains("meanwhile this fastcp is to run on oldhost"),
        "{said}"
    );
    assert!(said.contains("oldhost: uploading"), "{said}");
    assert_same_tree(&src, &dst, false);
    assert_eq!(runs(&far_bin), 1);
    assert_eq!(
        fs::read(cached(&far_cache)).unwrap(),
        fs::read(BIN).unwrap()
    );
}

/// A newer fastcp on the remote PATH that no longer speaks any of this one's protocol
/// versions: this fastcp runs there instead, and the copy is whole.
#[test]
fn a_newer_fastcp_with_no_version_in_common_is_passed_over_for_this_one() {
    let work = tempfile::tempdir().unwrap();
    let cache = work.path().join("cache");
    let newest = fastcp::proto::PROTOCOL_VERSION;
    let bin = fastcp_of_versions(work.path(), newest + 50, newest + 60);
    let sshd = sshd_with_path(&bin, &cache);
    let src = work.path().join("src");
    build_tiny(&src, 20);

    // Through the system ssh, which also carries the upload.
    let pulled = work.path().join("pulled");
    let out = run(fastcp_plain(&sshd)
        .args(["-r", "--ssh-program", "ssh"])
        .arg(remote(&sshd, &src))
        .arg(&pulled));
    assert!(out.status.success(), "{}", stderr(&out));
    let said = stderr(&out);
    assert!(said.contains("this side is older"), "{said}");
    assert!(said.contains("meanwhile this fastcp runs there"), "{said}");
    assert_same_tree(&src, &pulled, false);
    assert_eq!(runs(&bin), 1);

    // The built-in client then finds this fastcp in the cache first.
    let pushed = work.path().join("pushed");
    let out = run(fastcp_plain(&sshd)
        .args(["-r"])
        .arg(&src)
        .arg(remote(&sshd, &pushed)));
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(!stderr(&out).contains("older"), "{}", stderr(&out));
    assert_same_tree(&src, &pushed, false);
    assert_eq!(runs(&bin), 1);
}

/// A program that embeds fastcp meets an older fastcp on the remote PATH: with no binary of
/// its own to upload (none in its dist folder), the copy goes over SFTP, as it does where the
/// remote has no fastcp at all, rather than fail.
#[test]
fn a_program_that_embeds_fastcp_passes_over_an_older_remote_fastcp_for_sftp() {
    let work = tempfile::tempdir().unwrap();
    let cache = work.path().join("cache");
    let bin = fastcp_of_versions(work.path(), 1, 3);
    let sshd = sshd_with_path(&bin, &cache);
    let src = work.path().join("f");
    fs::write(&src, b"embedded").unwrap();
    let dst = work.path().join("g");
    let plan = fastcp::Plan::new(
        vec![fastcp::Location::Local(src)],
        fastcp::Location::parse(&remote(&sshd, &dst)),
        fastcp::CopyOptions::default()
            .skip_unchanged(true)
            .deploy_from(work.path().join("no-dist")),
    )
    .unwrap();
    let ssh = fastcp::transport::SshOptions::default().config_file(sshd.ssh_config());
    let outcome =
        fastcp::blocking::copy_remote(&plan, &ssh, std::sync::Arc::new(Default::default()))
            .unwrap();
    assert_eq!(outcome.transport, fastcp::TransportUsed::Sftp);
    assert_eq!(fs::read(&dst).unwrap(), b"embedded");
    assert_eq!(runs(&bin), 1);
}
