//! The SFTP path, against the test sshd's own `sftp-server`: `--sftp`, the fallback when the
//! remote has no fastcp and none may be uploaded (`--no-deploy`), big files split over
//! sessions, `-p`, the quick check, and what a push must never do on the remote (write
//! through a symlink, leave a temp file).

mod common;

use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt, symlink};
use std::path::Path;
use std::process::Command;

use common::*;
use fastcp_stream::SHA256_RANGE;
use fastcp_testsupport::Sshd;
use fastcp_testsupport::tree::{
    assert_no_temp, assert_same_tree, pseudo_random, set_mtime, set_times, write,
};

/// A `fastcp` command for `sshd` naming no remote program, so none is found there.
fn plain(sshd: &Sshd) -> Command {
    let mut cmd = Command::new(BIN);
    cmd.arg("-F")
        .arg(sshd.ssh_config())
        .env_remove("SSH_AUTH_SOCK");
    cmd
}

/// Files of many sizes (one split into ranges across sessions), folders, links and modes (a
/// sticky folder among them), with whole-second times (SFTP carries no finer).
fn build(root: &Path) {
    fs::create_dir_all(root.join("sub/deeper")).unwrap();
    fs::create_dir_all(root.join("empty")).unwrap();
    write(&root.join("empty-file"), b"", 0o644);
    write(&root.join("exec.sh"), b"#!/bin/sh\necho hi\n", 0o755);
    write(&root.join("private"), b"k", 0o600);
    write(&root.join("ünïcödé name"), b"u", 0o644);
    // A shared folder's sticky bit, kept with -p as the local receiver keeps it.
    fs::create_dir(root.join("shared")).unwrap();
    write(&root.join("shared/note"), b"n", 0o644);
    fs::set_permissions(root.join("shared"), fs::Permissions::from_mode(0o1777)).unwrap();
    for (i, size) in [1usize, 4095, 65_536, 300_000, (1 << 20) + 1]
        .iter()
        .enumerate()
    {
        write(
            &root.join(format!("sub/f{i}")),
            &pseudo_random(*size, i as u64),
            0o640,
        );
    }
    // Bigger than one range (32 MiB): read or written by every session at once.
    write(
        &root.join("sub/deeper/big"),
        &pseudo_random((70 << 20) + 12_345, 99),
        0o644,
    );
    symlink("../private", root.join("sub/link")).unwrap();
    symlink("/nonexistent/target", root.join("dangling")).unwrap();
    let mut all = vec![root.to_path_buf()];
    for e in walk(root) {
        all.push(e);
    }
    all.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    for (i, p) in all.iter().enumerate() {
        if !p.is_symlink() {
            set_mtime(p, 1_600_000_000 + i as i64 * 3_600, 0);
        }
    }
}

/// Gives every entry beneath `root` (and `root`) the whole second of its time, as SFTP
/// carries no finer.
fn whole_seconds(root: &Path) {
    for p in walk(root).iter().chain([&root.to_path_buf()]) {
        if !p.is_symlink() {
            let t = fs::metadata(p).unwrap().modified().unwrap();
            let secs = t.duration_since(std::time::UNIX_EPOCH).unwrap().as_secs();
            set_mtime(p, secs as i64, 0);
        }
    }
}

fn walk(root: &Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for e in fs::read_dir(root).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() && !p.is_symlink() {
            out.extend(walk(&p));
        }
        out.push(p);
    }
    out
}

#[test]
fn sftp_pushes_and_pulls_a_tree_with_modes_times_links_and_a_split_file() {
    let work = tempfile::tempdir().unwrap();
    let sshd = Sshd::start().unwrap();
    let src = work.path().join("src");
    build(&src);

    let pushed = work.path().join("pushed");
    let out = run(plain(&sshd)
        .args(["--sftp", "-r", "-p", "-j", "3", "--json", "-v"])
        .arg(&src)
        .arg(remote(&sshd, &pushed)));
    assert!(out.status.success(), "{}", stderr(&out));
    let summary = json(&out);
    assert_eq!(summary["transport"], "sftp", "{summary}");
    assert_same_tree(&src, &pushed, true);
    assert_no_temp(&pushed);

    // Links of the remote tree with times of their own, which a pull with -p keeps.
    let links: Vec<_> = walk(&pushed)
        .into_iter()
        .filter(|p| p.is_symlink())
        .collect();
    assert!(!links.is_empty());
    for (i, link) in links.iter().enumerate() {
        set_times(link, 1_500_000_000 + i as i64, 1_400_000_000 + i as i64);
    }
    let pulled = work.path().join("pulled");
    let out = run(plain(&sshd)
        .args(["--sftp", "-r", "-p", "-j", "3", "--json"])
        .arg(remote(&sshd, &pushed))
        .arg(&pulled));
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(json(&out)["transport"], "sftp");
    // (Access times are not compared: reading a link may set it.)
    for (i, link) in links.iter().enumerate() {
        let copy = pulled.join(link.strip_prefix(&pushed).unwrap());
        let m = fs::symlink_metadata(&copy).unwrap();
        assert_eq!(m.mtime(), 1_400_000_000 + i as i64, "{}", copy.display());
    }
    assert_same_tree(&src, &pulled, true);
    assert_no_temp(&pulled);

    // Without -p, as scp: modes through the umask, no times; into an existing folder.
    let into = work.path().join("into");
    fs::create_dir(&into).unwrap();
    let out = run(plain(&sshd)
        .args(["--sftp", "-r"])
        .arg(&src)
        .arg(remote(&sshd, &into)));
    assert!(out.status.success(), "{}", stderr(&out));
    assert_same_tree(&src, &into.join("src"), false);
}

/// SFTP sessions: one for a push or a pull (without -r) of small files only, where another
/// login would cost more than it saves; four (the default) for a folder; what `-j` says
/// when it says; through either SSH client.
#[test]
fn a_small_copy_over_sftp_takes_one_session_and_a_folder_four() {
    let work = tempfile::tempdir().unwrap();
    let sshd = Sshd::start().unwrap();
    let src = work.path().join("src");
    fs::create_dir(&src).unwrap();
    for i in 0..3 {
        write(&src.join(format!("f{i}")), &pseudo_random(10_000, i), 0o644);
    }
    for program in [None, Some("ssh")] {
        let copy = |pull: bool, extra: &[&str], from: &Path, to: &Path| {
            let mut cmd = plain(&sshd);
            cmd.args(["--sftp", "--json"]).args(extra);
            if let Some(program) = program {
                cmd.args(["--ssh-program", program]);
            }
            let out = match pull {
                false => run(cmd.arg(from).arg(remote(&sshd, to))),
                true => run(cmd.arg(remote(&sshd, from)).arg(to)),
            };
            assert!(out.status.success(), "{program:?}: {}", stderr(&out));
            json(&out)["streams"].clone()
        };
        let name = program.unwrap_or("builtin");
        let dst = work.path().join(format!("dst-{name}"));
        fs::create_dir(&dst).unwrap();
        assert_eq!(copy(false, &[], &src.join("f0"), &dst), 1, "{program:?}");
        assert_eq!(
            fs::read(dst.join("f0")).unwrap(),
            fs::read(src.join("f0")).unwrap()
        );
        assert_eq!(copy(false, &["-r"], &src, &dst), 4, "{program:?}");
        assert_same_tree(&src, &dst.join("src"), false);
        assert_eq!(copy(false, &["-j", "3"], &src.join("f1"), &dst), 3);
        let back = work.path().join(format!("back-{name}"));
        fs::create_dir(&back).unwrap();
        assert_eq!(copy(true, &[], &src.join("f1"), &back), 1, "{program:?}");
        assert_eq!(
            fs::read(back.join("f1")).unwrap(),
            fs::read(src.join("f1")).unwrap()
        );
        assert_eq!(copy(true, &["-r"], &src, &back), 4, "{program:?}");
        assert_same_tree(&src, &back.join("src"), false);
        assert_eq!(copy(true, &["-j", "2"], &src.join("f2"), &back), 2);
    }
}

/// A file the quick check skips on an SFTP push still takes the source's mode: a key made
/// private since the last run is private in the copy too.
#[test]
fn a_skipped_file_takes_its_new_mode_over_an_sftp_push() {
    let work = tempfile::tempdir().unwrap();
    let sshd = Sshd::start().unwrap();
    let src = work.path().join("src");
    fs::create_dir(&src).unwrap();
    write(&src.join("key"), b"secret", 0o644);
    let dst = work.path().join("dst");
    fs::create_dir(&dst).unwrap();
    let push = || {
        let out = run(plain(&sshd)
            .args(["--sftp", "--json", "-r", "-p", "--skip-unchanged"])
            .arg(&src)
            .arg(remote(&sshd, &dst)));
        assert!(out.status.success(), "{}", stderr(&out));
        json(&out)
    };
    push();
    fs::set_permissions(src.join("key"), fs::Permissions::from_mode(0o600)).unwrap();
    let v = push();
    assert_eq!(v["files_skipped"], 1, "{v}");
    let mode = fs::metadata(dst.join("src/key"))
        .unwrap()
        .permissions()
        .mode()
        & 0o777;
    assert_eq!(mode, 0o600);
}

/// Without `-p`, a file pushed over SFTP onto an existing one keeps the old file's mode, as
/// scp, cp and fastcp's own receiver keep it (a private file stays private); a new file takes
/// the source's, and with `-p` every file does.
#[test]
fn a_file_pushed_over_sftp_onto_another_keeps_its_mode_unless_p() {
    let work = tempfile::tempdir().unwrap();
    let sshd = Sshd::start().unwrap();
    let src = work.path().join("src");
    fs::create_dir(&src).unwrap();
    write(&src.join("old"), b"new content", 0o644);
    write(&src.join("new"), b"new file", 0o640);
    let mode = |p: &Path| fs::metadata(p).unwrap().permissions().mode() & 0o777;
    for (preserve, want_old) in [(false, 0o600), (true, 0o644)] {
        let dst = work.path().join(format!("dst-{preserve}"));
        fs::create_dir(&dst).unwrap();
        write(&dst.join("old"), b"private", 0o600);
        let mut cmd = plain(&sshd);
        cmd.args(["--sftp", "-r"]);
        if preserve {
            cmd.arg("-p");
        }
        let out = run(cmd
            .arg(format!("{}/.", src.display()))
            .arg(remote(&sshd, &dst)));
        assert!(out.status.success(), "{}", stderr(&out));
        assert_eq!(fs::read(dst.join("old")).unwrap(), b"new content");
        assert_eq!(mode(&dst.join("old")), want_old, "-p {preserve}");
        assert_eq!(mode(&dst.join("new")), 0o640, "-p {preserve}");
    }
}

/// A folder pushed over SFTP onto an existing file stops before anything is sent, with one
/// error (exit 1), as over fastcp and as `cp -r dir file`; the file is left as it was. A dry
/// run says the same.
#[test]
fn a_folder_pushed_over_sftp_onto_a_file_is_refused_with_one_error() {
    let work = tempfile::tempdir().unwrap();
    let sshd = Sshd::start().unwrap();
    let src = work.path().join("src");
    build(&src);
    let file = work.path().join("file");
    write(&file, b"kept", 0o644);
    // A symlink to nothing is in the way too (the SFTP stat follows it).
    let dangling = work.path().join("dangling");
    std::os::unix::fs::symlink("nothing", &dangling).unwrap();
    for target in [&file, &dangling] {
        for dry in [false, true] {
            let mut cmd = plain(&sshd);
            cmd.args(["--sftp", "-r"]);
            if dry {
                cmd.arg("-n");
            }
            let out = run(cmd.arg(&src).arg(remote(&sshd, target)));
            assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
            let err = stderr(&out);
            assert_eq!(err.lines().count(), 1, "{err}");
            assert!(err.contains("a folder does not replace a file"), "{err}");
        }
    }
    assert_eq!(fs::read(&file).unwrap(), b"kept");
    assert_eq!(fs::read_link(&dangling).unwrap(), Path::new("nothing"));
    assert!(!work.path().join("nothing").exists());
    // A file replaces the link, as over fastcp.
    let one = src.join("exec.sh");
    let out = run(plain(&sshd)
        .arg("--sftp")
        .arg(&one)
        .arg(remote(&sshd, &dangling)));
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(fs::read(&dangling).unwrap(), fs::read(&one).unwrap());
    assert!(!fs::symlink_metadata(&dangling).unwrap().is_symlink());
    assert_no_temp(work.path());
}

/// `--link-dest` over SFTP: a pull links on this side what the reference folder holds
/// alike; a push, whose receiver is the remote's sftp-server, refuses it before it connects.
#[test]
fn link_dest_links_on_an_sftp_pull_and_is_refused_on_a_push() {
    use std::os::unix::fs::MetadataExt;
    let work = tempfile::tempdir().unwrap();
    let sshd = Sshd::start().unwrap();
    let src = work.path().join("src");
    build(&src);
    let pull = |to: &str, extra: &[&str]| {
        let out = run(plain(&sshd)
            .args(["--sftp", "--json", "-r", "-p"])
            .args(extra)
            .arg(remote(&sshd, &src))
            .arg(work.path().join(to)));
        assert!(out.status.success(), "{}", stderr(&out));
        json(&out)
    };
    let first = pull("day1", &[]);
    let second = pull("day2", &["--link-dest", "../day1"]);
    assert_eq!(second["files_skipped"], first["files"], "{second}");
    assert_eq!(second["bytes_sent"], 0, "{second}");
    assert_same_tree(&src, &work.path().join("day2"), true);
    let ino = |day: &str| {
        fs::metadata(work.path().join(day).join("exec.sh"))
            .unwrap()
            .ino()
    };
    assert_eq!(ino("day1"), ino("day2"));
    let out = run(plain(&sshd)
        .args(["--sftp", "-r", "--link-dest", "../day1"])
        .arg(&src)
        .arg(remote(&sshd, &work.path().join("day3"))));
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("--link-dest on a push"),
        "{}",
        stderr(&out)
    );
    assert!(!work.path().join("day3").exists());
}

/// An account that may only use SFTP (`ForceCommand internal-sftp`) is copied to and from
/// over SFTP, saying why, through either SSH client.
#[test]
fn an_sftp_only_account_is_copied_over_sftp() {
    let work = tempfile::tempdir().unwrap();
    let sshd = Sshd::start_with_options("ForceCommand internal-sftp").unwrap();
    let src = work.path().join("src");
    write(&src, b"payload", 0o644);
    for program in [None, Some("ssh")] {
        for pull in [false, true] {
            let mut cmd = plain(&sshd);
            if let Some(p) = program {
                cmd.args(["--ssh-program", p]);
            }
            let to = work.path().join(format!("to-{program:?}-{pull}"));
            let out = match pull {
                false => run(cmd.arg(&src).arg(remote(&sshd, &to))),
                true => run(cmd.arg(remote(&sshd, &src)).arg(&to)),
            };
            assert!(out.status.success(), "{program:?} {pull}: {}", stderr(&out));
            assert!(
                stderr(&out).contains("may only use SFTP"),
                "{}",
                stderr(&out)
            );
            assert_eq!(fs::read(&to).unwrap(), b"payload");
        }
    }
}

/// A pull with `-L` reports a symlink loop in the tree as too many levels of symbolic links
/// and copies nothing for it, over SFTP as through the remote fastcp, while a dangling link
/// arrives as the link it is.
#[test]
fn a_pull_with_copy_links_reports_a_symlink_loop() {
    use std::os::unix::fs::symlink;
    let work = tempfile::tempdir().unwrap();
    let sshd = Sshd::start().unwrap();
    let src = work.path().join("src");
    fs::create_dir(&src).unwrap();
    write(&src.join("file"), b"payload", 0o644);
    symlink("self", src.join("self")).unwrap();
    symlink("two", src.join("one")).unwrap();
    symlink("one", src.join("two")).unwrap();
    symlink("nowhere", src.join("dangling")).unwrap();
    for sftp in [true, false] {
        let dst = work.path().join(format!("dst-{sftp}"));
        let mut cmd = fastcp(&sshd, Path::new(BIN));
        cmd.args(["-r", "-L"]);
        if sftp {
            cmd.arg("--sftp");
        }
        let out = run(cmd.arg(remote(&sshd, &src)).arg(&dst));
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(1), "sftp {sftp}: {err}");
        assert_eq!(
            err.matches("too many levels of symbolic links").count(),
            3,
            "sftp {sftp}: {err}"
        );
        let mut names: Vec<_> = fs::read_dir(&dst)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        assert_eq!(names, ["dangling", "file"], "sftp {sftp}");
        assert_eq!(
            fs::read_link(dst.join("dangling")).unwrap(),
            Path::new("nowhere")
        );
    }
}

/// A named pipe in a tree pushed over SFTP is skipped with a warning that names no option
/// SFTP refuses (`--specials`), in a dry run too; through the remote fastcp the warning
/// names it.
#[test]
fn a_pipe_skipped_over_sftp_suggests_no_option_sftp_refuses() {
    let work = tempfile::tempdir().unwrap();
    let sshd = Sshd::start().unwrap();
    let src = work.path().join("src");
    fs::create_dir(&src).unwrap();
    write(&src.join("file"), b"payload", 0o644);
    rustix::fs::mknodat(
        rustix::fs::CWD,
        src.join("pipe"),
        rustix::fs::FileType::Fifo,
        rustix::fs::Mode::from_raw_mode(0o644),
        0,
    )
    .unwrap();
    for (sftp, dry_run) in [(true, false), (true, true), (false, false)] {
        let dst = work.path().join(format!("dst-{sftp}-{dry_run}"));
        let mut cmd = fastcp(&sshd, Path::new(BIN));
        cmd.arg("-r");
        if sftp {
            cmd.arg("--sftp");
        }
        if dry_run {
            cmd.arg("-n");
        }
        let out = run(cmd.arg(&src).arg(remote(&sshd, &dst)));
        let case = format!("sftp {sftp}, dry run {dry_run}");
        assert_eq!(out.status.code(), Some(1), "{case}: {}", stderr(&out));
        assert!(
            stderr(&out).contains("a named pipe"),
            "{case}: {}",
            stderr(&out)
        );
        assert_eq!(
            stderr(&out).contains("--specials"),
            !sftp,
            "{case}: {}",
            stderr(&out)
        );
        if !dry_run {
            assert_eq!(fs::read(dst.join("file")).unwrap(), b"payload", "{case}");
        }
    }
}

/// A named pipe (or a device, such as `/dev/null`) named as the destination is refused and
/// left as it is, pushed or pulled, over SFTP and through the remote fastcp alike.
#[test]
fn a_pipe_as_the_destination_is_left_as_it_is() {
    use std::os::unix::fs::FileTypeExt;
    let work = tempfile::tempdir().unwrap();
    let sshd = Sshd::start().unwrap();
    let src = work.path().join("src");
    write(&src, b"payload", 0o644);
    let fifo = work.path().join("fifo");
    rustix::fs::mknodat(
        rustix::fs::CWD,
        &fifo,
        rustix::fs::FileType::Fifo,
        rustix::fs::Mode::from_raw_mode(0o644),
        0,
    )
    .unwrap();
    for sftp in [true, false] {
        for pull in [false, true] {
            let mut cmd = fastcp(&sshd, Path::new(BIN));
            if sftp {
                cmd.arg("--sftp");
            }
            let out = match pull {
                false => run(cmd.arg(&src).arg(remote(&sshd, &fifo))),
                true => run(cmd.arg(remote(&sshd, &src)).arg(&fifo)),
            };
            assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
            assert!(
                stderr(&out).contains("left it as it is"),
                "{}",
                stderr(&out)
            );
            assert!(fs::symlink_metadata(&fifo).unwrap().file_type().is_fifo());
        }
    }
    assert_eq!(fs::read_dir(work.path()).unwrap().count(), 2);
}

/// A target that must be a folder (a trailing '/', or several sources) and is none is a
/// usage error (exit code 2) over SFTP as over fastcp, push and pull, and locally, and
/// nothing is made; a dry run (`-n`) fails the same way, listing nothing.
#[test]
fn a_target_that_must_be_a_folder_and_is_none_is_a_usage_error() {
    let work = tempfile::tempdir().unwrap();
    let sshd = Sshd::start().unwrap();
    let a = work.path().join("a");
    let b = work.path().join("b");
    write(&a, b"alpha", 0o644);
    write(&b, b"beta", 0o644);
    let missing = work.path().join("missing");
    let slash = format!("{}/", missing.display());
    // Over SFTP or fastcp, then locally (neither side remote).
    let paths = [
        (Some(true), false),
        (Some(true), true),
        (Some(false), false),
    ];
    let paths = paths
        .into_iter()
        .chain([(Some(false), true), (None, false)]);
    for dry_run in [false, true] {
        for (sftp, pull) in paths.clone() {
            for sources in [&[&a][..], &[&a, &b][..]] {
                let mut cmd = fastcp(&sshd, Path::new(BIN));
                if sftp == Some(true) {
                    cmd.arg("--sftp");
                }
                if dry_run {
                    cmd.arg("-n");
                }
                for source in sources {
                    match pull {
                        false => cmd.arg(source),
                        true => cmd.arg(remote(&sshd, source)),
                    };
                }
                let dest = match sources.len() {
                    1 => Path::new(&slash),
                    _ => missing.as_path(),
                };
                match pull || sftp.is_none() {
                    false => cmd.arg(remote(&sshd, dest)),
                    true => cmd.arg(dest),
                };
                let out = run(&mut cmd);
                let case = format!(
                    "dry run {dry_run}, sftp {sftp:?}, pull {pull}, {} sources",
                    sources.len()
                );
                assert_eq!(out.status.code(), Some(2), "{case}: {}", stderr(&out));
                assert!(
                    stderr(&out).contains("not a directory"),
                    "{case}: {}",
                    stderr(&out)
                );
                assert!(out.stdout.is_empty(), "{case}: {:?}", out.stdout);
                assert!(!missing.exists(), "{case}");
            }
        }
    }
}

/// Sixteen SFTP sessions (`-j 16`) against an sshd with OpenSSH's default `MaxStartups
/// 10:30:100`, which drops connections beyond ten still logging in: the logins go a few at
/// a time, so none is refused, through either SSH client.
#[test]
fn sixteen_sftp_sessions_log_in_under_a_default_max_startups() {
    let work = tempfile::tempdir().unwrap();
    let sshd = Sshd::start_with_options("MaxStartups 10:30:100").unwrap();
    let src = work.path().join("src");
    fs::create_dir(&src).unwrap();
    for i in 0..20 {
        write(&src.join(format!("f{i}")), &pseudo_random(5_000, i), 0o644);
    }
    for program in [None, Some("ssh")] {
        let dst = work
            .path()
            .join(format!("dst-{}", program.unwrap_or("builtin")));
        let mut cmd = plain(&sshd);
        cmd.args(["--sftp", "-r", "-j", "16", "--json"]);
        if let Some(program) = program {
            cmd.args(["--ssh-program", program]);
        }
        let out = run(cmd.arg(&src).arg(remote(&sshd, &dst)));
        assert!(out.status.success(), "{program:?}: {}", stderr(&out));
        assert_eq!(json(&out)["streams"], 16, "{program:?}");
        assert_same_tree(&src, &dst, false);
    }
}

/// An sshd that drops connections beyond one logging in at a time from an address
/// (`PerSourceMaxStartups 1`) refuses some of the extra logins of four SFTP sessions, which
/// start together: a push and a pull of a tree still complete, over the sessions that did
/// log in, with one warning that says why; so does a copy that falls back to SFTP on a host
/// without fastcp, and one through the system ssh.
#[test]
fn a_server_that_refuses_extra_logins_gets_the_sftp_copy_over_fewer_sessions() {
    let work = tempfile::tempdir().unwrap();
    let sshd = Sshd::start_with_options("PerSourceMaxStartups 1").unwrap();
    let src = work.path().join("src");
    build(&src);
    let builtin = "the remote sshd refused extra logins (MaxStartups/PerSourceMaxStartups?): ";
    let system = "an extra SFTP session did not start (the remote sshd refused the login? \
                  MaxStartups/PerSourceMaxStartups): ssh: ";
    for (name, pull, how, refused) in [
        ("pushed", false, "--sftp", builtin),
        ("pulled", true, "--sftp", builtin),
        ("fallen-back", false, "--no-deploy", builtin),
        ("system-pushed", false, "--ssh-program=ssh", system),
        ("system-pulled", true, "--ssh-program=ssh", system),
    ] {
        let to = work.path().join(name);
        let mut cmd = plain(&sshd);
        cmd.args([how, "-r", "-p", "-j", "4", "--json", "--transport", "ssh"]);
        if how.starts_with("--ssh-program") {
            cmd.arg("--sftp");
        }
        let out = match pull {
            false => run(cmd.arg(&src).arg(remote(&sshd, &to))),
            true => run(cmd.arg(remote(&sshd, &src)).arg(&to)),
        };
        assert!(out.status.success(), "{name}: {}", stderr(&out));
        let said = stderr(&out);
        let warnings: Vec<_> = said
            .lines()
            .filter(|l| l.starts_with("fastcp: warning: ") && !l.ends_with("copying over SFTP"))
            .collect();
        assert_eq!(warnings.len(), 1, "{name}: {said}");
        assert!(warnings[0].contains(refused), "{name}: {said}");
        let summary = json(&out);
        assert_eq!(summary["transport"], "sftp", "{name}: {summary}");
        let sessions = summary["streams"].as_u64().unwrap();
        assert!(
            warnings[0].ends_with(&format!("; copying over {sessions} SFTP session(s)")),
            "{name}: {said}"
        );
        assert!((1..4).contains(&sessions), "{name}: {summary}");
        assert_same_tree(&src, &to, true);
        assert_no_temp(&to);
    }
    assert!(sshd.log().contains("past MaxStartups"), "{}", sshd.log());
}

/// An SFTP server that never answers its start (a login script stuck, a loaded host): the
/// copy ends after the idle limit with the connection's exit code, saying the server did
/// not answer, not that the host has no SFTP.
#[test]
fn an_sftp_server_that_never_answers_is_a_timeout() {
    let work = tempfile::tempdir().unwrap();
    let options = format!(
        "Subsystem sftp while [ -d '{}' ]; do sleep 1; done",
        work.path().display()
    );
    let sshd = Sshd::start_with_options(&options).unwrap();
    let src = work.path().join("f");
    write(&src, b"x", 0o644);
    let out = run_within(
        plain(&sshd)
            .args(["--sftp", "--timeout", "2"])
            .arg(&src)
            .arg(remote(&sshd, &work.path().join("g"))),
        std::time::Duration::from_secs(120),
    );
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("the remote's SFTP server did not answer within 2 s"),
        "{}",
        stderr(&out)
    );
    assert!(!work.path().join("g").exists());
}

#[test]
fn a_remote_without_fastcp_and_no_deploy_is_served_over_sftp() {
    let work = tempfile::tempdir().unwrap();
    let cache = work.path().join("cache");
    let sshd = Sshd::start_with_env(&[("XDG_CACHE_HOME", &cache)]).unwrap();
    let src = work.path().join("one-file");
    write(&src, &pseudo_random(100_000, 1), 0o644);

    let dst = work.path().join("copy");
    let out = run(plain(&sshd)
        .args(["--no-deploy", "--json"])
        .arg(&src)
        .arg(remote(&sshd, &dst)));
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("copying over SFTP"),
        "the fallback is said: {}",
        stderr(&out)
    );
    assert_eq!(json(&out)["transport"], "sftp");
    assert_eq!(fs::read(&dst).unwrap(), fs::read(&src).unwrap());
    assert!(!cache.exists(), "nothing uploaded with --no-deploy");

    let back = work.path().join("back");
    let out = run(plain(&sshd)
        .arg("--no-deploy")
        .arg(remote(&sshd, &dst))
        .arg(&back));
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(fs::read(&back).unwrap(), fs::read(&src).unwrap());

    // Told not to fall back, it fails instead, saying why, and copies nothing.
    let never = work.path().join("never");
    let out = run(plain(&sshd)
        .args(["--no-deploy", "--no-sftp-fallback", "--json"])
        .arg(&src)
        .arg(remote(&sshd, &never)));
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("--no-sftp-fallback"),
        "{}",
        stderr(&out)
    );
    assert_eq!(json(&out)["error_kind"], "remote_program_missing");
    // The connection was fine: no advice to look at its steps.
    assert!(
        !stderr(&out).contains("fastcp -v shows"),
        "{}",
        stderr(&out)
    );
    assert!(!never.exists());
}

#[test]
fn a_push_over_sftp_replaces_a_symlink_at_the_target_and_never_writes_through_it() {
    let work = tempfile::tempdir().unwrap();
    let sshd = Sshd::start().unwrap();
    let victim = work.path().join("victim");
    fs::write(&victim, b"untouched").unwrap();
    let dest = work.path().join("dest");
    fs::create_dir(&dest).unwrap();
    symlink(&victim, dest.join("file")).unwrap();
    // A planted link at the name a temp file could take is no help either: temp names are
    // random and made exclusively.
    let src = work.path().join("file");
    fs::write(&src, b"new content").unwrap();

    let out = run(plain(&sshd)
        .arg("--sftp")
        .arg(&src)
        .arg(remote(&sshd, &dest)));
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(fs::read(&victim).unwrap(), b"untouched");
    let landed = dest.join("file");
    assert!(!landed.is_symlink(), "the link was replaced");
    assert_eq!(fs::read(&landed).unwrap(), b"new content");
    assert_no_temp(&dest);
}

#[test]
fn a_pull_over_sftp_keeps_links_as_links_and_writes_nothing_outside() {
    let work = tempfile::tempdir().unwrap();
    let sshd = Sshd::start().unwrap();
    let src = work.path().join("tree");
    fs::create_dir(&src).unwrap();
    let outside = work.path().join("outside");
    fs::create_dir(&outside).unwrap();
    symlink(&outside, src.join("escape")).unwrap();
    write(&src.join("plain"), b"p", 0o644);

    let dest = work.path().join("dest");
    let out = run(plain(&sshd)
        .args(["--sftp", "-r"])
        .arg(remote(&sshd, &src))
        .arg(&dest));
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(dest.join("escape").is_symlink());
    assert_eq!(fs::read_dir(&outside).unwrap().count(), 0);
    assert_eq!(fs::read(dest.join("plain")).unwrap(), b"p");
}

#[test]
fn the_quick_check_skips_unchanged_files_on_a_push_over_sftp() {
    let work = tempfile::tempdir().unwrap();
    let sshd = Sshd::start().unwrap();
    let src = work.path().join("src");
    fs::create_dir(&src).unwrap();
    for i in 0..10 {
        write(&src.join(format!("f{i}")), &pseudo_random(5_000, i), 0o644);
        set_mtime(&src.join(format!("f{i}")), 1_700_000_000 + i as i64, 0);
    }
    let dst = work.path().join("dst");
    fs::create_dir(&dst).unwrap();
    let copy = |extra: &[&str]| {
        run(plain(&sshd)
            .args(["--sftp", "-r", "--skip-unchanged", "--json"])
            .args(extra)
            .arg(&src)
            .arg(remote(&sshd, &dst)))
    };
    let out = copy(&[]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(json(&out)["files_skipped"], 0);

    write(&src.join("f3"), &pseudo_random(5_001, 77), 0o644);
    set_mtime(&src.join("f3"), 1_750_000_000, 0);
    let out = copy(&[]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(json(&out)["files_skipped"], 9, "{}", json(&out));
    assert_same_tree(&src, &dst.join("src"), true);
}

/// SFTP carries whole seconds from 1970 to 2106: a source time outside them arrives clamped
/// to the nearest end, and a rerun's quick check compares the clamped time, so it skips the
/// file rather than sending it again every night.
#[test]
fn a_time_sftp_cannot_carry_arrives_clamped_and_is_skipped_on_a_rerun() {
    let work = tempfile::tempdir().unwrap();
    let sshd = Sshd::start().unwrap();
    let src = work.path().join("src");
    fs::create_dir(&src).unwrap();
    // 1960, and 2500.
    let times = [
        ("old", -315_619_200_i64, 0_i64),
        ("far", 16_725_225_600, i64::from(u32::MAX)),
    ];
    for (name, t, _) in times {
        write(&src.join(name), name.as_bytes(), 0o644);
        set_mtime(&src.join(name), t, 0);
    }
    let dst = work.path().join("dst");
    fs::create_dir(&dst).unwrap();
    let copy = || {
        run(plain(&sshd)
            .args(["--sftp", "-r", "--skip-unchanged", "--json"])
            .arg(&src)
            .arg(remote(&sshd, &dst)))
    };
    let out = copy();
    assert!(out.status.success(), "{}", stderr(&out));
    for (name, _, landed) in times {
        let m = fs::symlink_metadata(dst.join("src").join(name)).unwrap();
        assert_eq!(m.mtime(), landed, "{name}");
    }
    let out = copy();
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(json(&out)["files_skipped"], 2, "{}", json(&out));
    assert_eq!(json(&out)["files"], 0, "{}", json(&out));
}

/// A push's rerun over many folders, each listed once rather than a stat per file: what
/// changed in any way is sent and the rest skipped; a folder still there is used, one gone is
/// made again, and a file (or a link) in a folder's way gives way to the folder, as between
/// two fastcp ends, with nothing written through the link. A rerun with nothing changed
/// changes nothing there, and each folder ends with its source's time, whether a rerun
/// changed something in it or not.
#[test]
fn a_push_rerun_over_sftp_across_many_folders_sends_just_what_changed() {
    let work = tempfile::tempdir().unwrap();
    let sshd = Sshd::start().unwrap();
    let src = work.path().join("src");
    let mut n = 0u64;
    for d in 0..30 {
        for e in 0..3 {
            let dir = src.join(format!("d{d}/e{e}"));
            fs::create_dir_all(&dir).unwrap();
            for f in 0..5 {
                n += 1;
                write(
                    &dir.join(format!("f{f}")),
                    &pseudo_random(100 + f, n),
                    0o644,
                );
            }
        }
        n += 1;
        write(&src.join(format!("d{d}/top")), &pseudo_random(50, n), 0o644);
    }
    symlink("top", src.join("d5/link")).unwrap();
    whole_seconds(&src);
    let dst = work.path().join("dst");
    fs::create_dir(&dst).unwrap();
    let copy = || {
        run(plain(&sshd)
            .args(["--sftp", "-r", "--skip-unchanged", "--delete", "--json"])
            .arg(&src)
            .arg(remote(&sshd, &dst)))
    };
    let out = copy();
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(json(&out)["files"], 480, "{}", json(&out));
    let there = dst.join("src");
    // A rerun with nothing changed changes nothing there: not a folder's attributes either.
    let ctimes = || -> Vec<(std::path::PathBuf, i64, i64)> {
        let mut all = walk(&there);
        all.push(there.clone());
        all.into_iter()
            .map(|p| {
                let m = fs::symlink_metadata(&p).unwrap();
                (p, m.ctime(), m.ctime_nsec())
            })
            .collect()
    };
    let before = ctimes();
    let out = copy();
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(json(&out)["files_skipped"], 480, "{}", json(&out));
    let changed: Vec<_> = ctimes()
        .into_iter()
        .filter(|c| !before.contains(c))
        .collect();
    assert!(
        changed.is_empty(),
        "{} changed, as {:?}",
        changed.len(),
        changed.first()
    );

    // Changed on the source: its size; its content and time, at the same size.
    write(&src.join("d1/e1/f1"), &pseudo_random(7, 1), 0o644);
    let same_size = src.join("d2/e0/f0");
    write(&same_size, &pseudo_random(100, 12_345), 0o644);
    set_mtime(&same_size, 1_750_000_000, 0);
    // Changed on the destination: a file gone, a folder gone, a folder now a file.
    fs::remove_file(there.join("d3/e2/f3")).unwrap();
    fs::remove_dir_all(there.join("d4/e1")).unwrap();
    // A link retargeted on the source; an extra file on the destination, for --delete.
    fs::remove_file(src.join("d5/link")).unwrap();
    symlink("e0/f0", src.join("d5/link")).unwrap();
    write(&there.join("d9/e0/extra"), b"x", 0o644);
    // As they were, but for what they hold: so only what the rerun does there changes them.
    for folder in ["d3/e2", "d4", "d5", "d9/e0"] {
        let was = fs::metadata(src.join(folder)).unwrap().modified().unwrap();
        let secs = was.duration_since(std::time::UNIX_EPOCH).unwrap().as_secs();
        set_mtime(&there.join(folder), secs as i64, 0);
    }
    fs::remove_dir_all(there.join("d6/e2")).unwrap();
    write(&there.join("d6/e2"), b"in the way", 0o644);
    // A folder swapped for a link to one outside the destination: nothing is written there.
    let outside = work.path().join("outside");
    fs::create_dir(&outside).unwrap();
    fs::remove_dir_all(there.join("d10/e0")).unwrap();
    symlink(&outside, there.join("d10/e0")).unwrap();
    // Only a folder's time differs: on the destination, on the source.
    set_mtime(&there.join("d7/e0"), 1_500_000_000, 0);
    set_mtime(&src.join("d8"), 1_500_000_000, 0);
    whole_seconds(&src);

    let out = copy();
    assert!(out.status.success(), "{}", stderr(&out));
    let summary = json(&out);
    // Sent: 1 + 1 + 1, the 5 in the folder made again, and the 5 beneath the file and the 5
    // beneath the link, whose folders take their places.
    assert_eq!(summary["files"], 18, "{summary}");
    assert_eq!(summary["error_count"], 0, "{summary}");
    assert_eq!(summary["files_skipped"], 480 - 18, "{summary}");
    assert_eq!(fs::read_dir(&outside).unwrap().count(), 0);
    assert_eq!(summary["symlinks"], 1, "{summary}");
    assert_eq!(summary["files_deleted"], 1, "{summary}");
    for folder in ["d6/e2", "d10/e0"] {
        assert!(
            fs::symlink_metadata(there.join(folder)).unwrap().is_dir(),
            "{folder}"
        );
    }
    // The folders this rerun wrote in, and those whose time alone differed, have their
    // source's time.
    let mtime = |p: &Path| fs::metadata(p).unwrap().modified().unwrap();
    for folder in [
        "d1/e1", "d2/e0", "d3/e2", "d4", "d4/e1", "d5", "d7/e0", "d8", "d9/e0",
    ] {
        assert_eq!(
            mtime(&there.join(folder)),
            mtime(&src.join(folder)),
            "{folder}"
        );
    }

    assert_same_tree(&src, &there, true);
    let out = copy();
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(json(&out)["files"], 0, "{}", json(&out));
    assert_eq!(json(&out)["files_skipped"], 480, "{}", json(&out));
    assert_same_tree(&src, &there, true);
    assert_no_temp(&dst);
}

/// A nightly pull from a host where only SFTP serves: the second run reads only what
/// changed (the quick check, with the probes streamed ahead of the answers), `--delete`
/// mirrors, and `--exclude` rules leave out what they match on the remote and keep it on
/// this side.
#[test]
fn a_nightly_pull_over_sftp_skips_unchanged_files_excludes_and_mirrors() {
    let work = tempfile::tempdir().unwrap();
    let sshd = Sshd::start().unwrap();
    let src = work.path().join("src");
    for d in 0..7 {
        fs::create_dir_all(src.join(format!("d{d}"))).unwrap();
    }
    for i in 0..200 {
        let f = src.join(format!("d{}/f{i}", i % 7));
        write(&f, &pseudo_random(3_000 + i, i as u64), 0o644);
        set_mtime(&f, 1_700_000_000 + i as i64, 0);
    }
    // Split into ranges read by every session: announced only once the receiver asks.
    let big = src.join("big");
    write(&big, &pseudo_random((40 << 20) + 7, 1), 0o644);
    set_mtime(&big, 1_700_100_000, 0);
    write(&src.join("noise.log"), b"log", 0o644);
    let dst = work.path().join("dst");
    fs::create_dir(&dst).unwrap();
    let pull = |extra: &[&str]| {
        run(plain(&sshd)
            .args([
                "--sftp",
                "-r",
                "--skip-unchanged",
                "--json",
                "--exclude",
                "*.log",
            ])
            .args(extra)
            .arg(remote(&sshd, &src))
            .arg(&dst))
    };
    let out = pull(&[]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(json(&out)["files_skipped"], 0);
    assert_eq!(json(&out)["files"], 201, "{}", json(&out));
    let copy = dst.join("src");
    assert!(
        !copy.join("noise.log").exists(),
        "an excluded file was pulled"
    );
    assert_eq!(fs::read(copy.join("big")).unwrap(), fs::read(&big).unwrap());

    // A night later: one small file and the big one changed, one file is gone on the
    // remote, and this side holds an extra file and an excluded one.
    write(&src.join("d3/f3"), b"changed", 0o644);
    set_mtime(&src.join("d3/f3"), 1_750_000_000, 0);
    let mut bytes = fs::read(&big).unwrap();
    bytes[(33 << 20) + 5] ^= 0xff;
    write(&big, &bytes, 0o644);
    set_mtime(&big, 1_750_000_001, 0);
    fs::remove_file(src.join("d0/f0")).unwrap();
    write(&copy.join("d1/extra"), b"extra", 0o644);
    write(&copy.join("d1/kept.log"), b"mine", 0o644);
    let out = pull(&["--delete", "-j", "1"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let v = json(&out);
    assert_eq!(v["files_skipped"], 198, "{v}");
    assert_eq!(v["files"], 2, "{v}");
    assert_eq!(v["bytes"], (40 << 20) + 7 + 7, "{v}");
    // The extra file and the one gone on the remote; the excluded one stays.
    assert_eq!(v["files_deleted"], 2, "{v}");
    assert!(!copy.join("d1/extra").exists() && !copy.join("d0/f0").exists());
    assert_eq!(fs::read(copy.join("d1/kept.log")).unwrap(), b"mine");
    assert_eq!(fs::read(copy.join("d3/f3")).unwrap(), b"changed");
    assert_eq!(fs::read(copy.join("big")).unwrap(), bytes);
    fs::remove_file(src.join("noise.log")).unwrap();
    fs::remove_file(copy.join("d1/kept.log")).unwrap();
    // (The folders' times changed below a second on the remote, finer than SFTP carries.)
    assert_same_tree(&src, &copy, false);
    assert_no_temp(&copy);
}

/// `-n` over SFTP lists what a copy would do and writes nothing: a push lists its walk, a
/// pull the remote listing, judged on this side (the quick check, `--delete`).
#[test]
fn a_dry_run_over_sftp_lists_and_writes_nothing() {
    let work = tempfile::tempdir().unwrap();
    let sshd = Sshd::start().unwrap();
    let src = work.path().join("src");
    fs::create_dir_all(src.join("deep")).unwrap();
    write(&src.join("one"), b"1", 0o644);
    write(&src.join("deep/two"), b"22", 0o644);
    symlink("one", src.join("link")).unwrap();
    for f in ["one", "deep/two", "deep", ""] {
        set_mtime(&src.join(f), 1_700_000_000, 0);
    }
    let listing = |out: &std::process::Output| String::from_utf8_lossy(&out.stdout).into_owned();
    // Push.
    let pushed = work.path().join("pushed");
    let out = run(plain(&sshd)
        .args(["--sftp", "-r", "-n"])
        .arg(&src)
        .arg(remote(&sshd, &pushed)));
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(
        listing(&out),
        "src/\nsrc/deep/\nsrc/deep/two\nsrc/link -> one\nsrc/one\n"
    );
    assert!(!pushed.exists());
    // Pull.
    let dst = work.path().join("dst");
    let pull = |extra: &[&str]| {
        run(plain(&sshd)
            .args(["--sftp", "-r", "-n"])
            .args(extra)
            .arg(remote(&sshd, &src))
            .arg(&dst))
    };
    let out = pull(&[]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(
        listing(&out),
        "src/\nsrc/deep/\nsrc/deep/two\nsrc/link -> one\nsrc/one\n"
    );
    assert!(!dst.exists());
    // After a real pull, a change here and an extra file: only those are listed.
    fs::create_dir(&dst).unwrap();
    let out = run(plain(&sshd)
        .args(["--sftp", "-r", "-p"])
        .arg(remote(&sshd, &src))
        .arg(&dst));
    assert!(out.status.success(), "{}", stderr(&out));
    write(&dst.join("src/one"), b"changed here", 0o644);
    write(&dst.join("src/deep/extra"), b"x", 0o644);
    let out = pull(&["--skip-unchanged", "--delete", "--json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let v = json(&out);
    let entries: Vec<(String, String)> = v["entries"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["kind"] != "dir")
        .map(|e| {
            (
                e["path"].as_str().unwrap().to_owned(),
                e["action"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    assert!(entries.contains(&("src/one".into(), "copy".into())), "{v}");
    assert!(
        entries.contains(&("src/deep/extra".into(), "delete".into())),
        "{v}"
    );
    assert!(!entries.iter().any(|(p, _)| p == "src/deep/two"), "{v}");
    assert_eq!(fs::read(dst.join("src/one")).unwrap(), b"changed here");
    assert!(dst.join("src/deep/extra").exists());
}

/// A nightly push to a host where only SFTP serves, with `--delete`: the extras go, a
/// folder with all it holds; a symlink among them goes as a link, never followed out of
/// the destination; what the rules exclude, and fastcp's work files, stay, but for the
/// partial files of files the source no longer has (none there, or a folder in its place).
/// A sender that cannot read a file deletes nothing.
#[test]
fn a_push_over_sftp_with_delete_mirrors_beneath_the_destination_only() {
    let work = tempfile::tempdir().unwrap();
    let sshd = Sshd::start().unwrap();
    let src = work.path().join("src");
    fs::create_dir_all(src.join("keep/sub")).unwrap();
    write(&src.join("keep/a"), b"a", 0o644);
    write(&src.join("keep/sub/b"), b"b", 0o644);
    let dst = work.path().join("dst");
    let copy = |extra: &[&str]| {
        run(plain(&sshd)
            .args(["--sftp", "-r", "--json"])
            .args(extra)
            .arg(&src)
            .arg(remote(&sshd, &dst)))
    };
    fs::create_dir(&dst).unwrap();
    let out = copy(&[]);
    assert!(out.status.success(), "{}", stderr(&out));

    // The extras, and what must survive them.
    let outside = work.path().join("outside");
    fs::create_dir(&outside).unwrap();
    write(&outside.join("precious"), b"precious", 0o644);
    let copied = dst.join("src");
    write(&copied.join("keep/gone"), b"x", 0o644);
    fs::create_dir_all(copied.join("old/deeper")).unwrap();
    write(&copied.join("old/deeper/f"), b"x", 0o644);
    symlink(&outside, copied.join("keep/sub/escape")).unwrap();
    symlink(&outside, copied.join("old/deeper/escape")).unwrap();
    write(&copied.join("keep/notes.log"), b"excluded", 0o644);
    write(&copied.join("keep/.a.fastcp-partial"), b"work", 0o644);
    write(&copied.join("keep/.gone.fastcp-partial"), b"orphan", 0o644);
    write(&copied.join("keep/.sub.fastcp-partial"), b"orphan", 0o644);

    let out = copy(&["--delete", "--exclude", "*.log"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let v = json(&out);
    // keep/gone, keep/sub/escape, and old with the three entries beneath it.
    assert_eq!(v["files_deleted"], 6, "{v}");
    assert!(!copied.join("keep/gone").exists() && !copied.join("old").exists());
    assert!(fs::symlink_metadata(copied.join("keep/sub/escape")).is_err());
    assert_eq!(fs::read(outside.join("precious")).unwrap(), b"precious");
    assert!(copied.join("keep/notes.log").exists(), "excluded: kept");
    assert!(
        copied.join("keep/.a.fastcp-partial").exists(),
        "a work file: kept"
    );
    for orphan in ["keep/.gone.fastcp-partial", "keep/.sub.fastcp-partial"] {
        assert!(!copied.join(orphan).exists(), "{orphan}: kept");
    }
    assert_eq!(fs::read(copied.join("keep/sub/b")).unwrap(), b"b");

    // A source file that cannot be read would look deleted: nothing goes.
    write(&copied.join("keep/extra"), b"x", 0o644);
    write(&src.join("keep/locked"), b"l", 0o000);
    write(&copied.join("keep/locked"), b"old", 0o644);
    if fs::read(src.join("keep/locked")).is_err() {
        let out = copy(&["--delete"]);
        assert!(!out.status.success());
        assert!(
            stderr(&out).contains("nothing was deleted"),
            "{}",
            stderr(&out)
        );
        assert!(copied.join("keep/extra").exists() && copied.join("keep/locked").exists());
    }
}

/// A source file named like a partial file (`.notes.fastcp-partial`, with no `notes` beside
/// it) or a temp file is the user's: a push over SFTP with `--delete` copies it and keeps
/// it, as fastcp's own receiver does, and a rerun finds it in place.
#[test]
fn a_push_over_sftp_with_delete_keeps_a_source_file_named_like_a_work_file() {
    let work = tempfile::tempdir().unwrap();
    let sshd = Sshd::start().unwrap();
    let src = work.path().join("src");
    fs::create_dir_all(src.join("sub")).unwrap();
    write(&src.join("sub/.notes.fastcp-partial"), b"mine", 0o644);
    write(&src.join("sub/.notes.fastcp-0badc0de"), b"mine too", 0o644);
    write(&src.join("sub/plain"), b"plain", 0o644);
    whole_seconds(&src);
    let dst = work.path().join("dst");
    fs::create_dir(&dst).unwrap();
    let copy = || {
        run(plain(&sshd)
            .args([
                "--sftp",
                "-r",
                "-p",
                "--delete",
                "--skip-unchanged",
                "--json",
            ])
            .arg(format!("{}/.", src.display()))
            .arg(remote(&sshd, &dst)))
    };
    for night in ["first", "second"] {
        let out = copy();
        assert!(out.status.success(), "{night}: {}", stderr(&out));
        let v = json(&out);
        assert_eq!(v["files_deleted"], 0, "{night}: {v}");
        assert_eq!(
            fs::read(dst.join("sub/.notes.fastcp-partial"))
                .ok()
                .as_deref(),
            Some(&b"mine"[..]),
            "{night}: {v}"
        );
        assert_same_tree(&src, &dst, true);
    }
    assert_eq!(json(&copy())["files_skipped"], 3);
}

/// A folder of the copy swapped for a symlink while the push runs: `--delete` finds that it
/// no longer resolves to itself and deletes nothing through it.
#[test]
fn a_push_over_sftp_with_delete_never_follows_a_folder_swapped_for_a_symlink() {
    let work = tempfile::tempdir().unwrap();
    let sshd = Sshd::start().unwrap();
    let src = work.path().join("src");
    fs::create_dir_all(src.join("a")).unwrap();
    fs::create_dir_all(src.join("z")).unwrap();
    write(&src.join("a/small"), b"s", 0o644);
    // Long enough to copy that the swap below happens before the push ends.
    write(&src.join("z/big"), &pseudo_random(64 << 20, 3), 0o644);
    let outside = work.path().join("outside");
    fs::create_dir(&outside).unwrap();
    write(&outside.join("precious"), b"precious", 0o644);
    let dst = work.path().join("dst");
    fs::create_dir(&dst).unwrap();
    let child = plain(&sshd)
        .args(["--sftp", "-r", "--delete", "-j", "1"])
        .arg(&src)
        .arg(remote(&sshd, &dst))
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let a = dst.join("src/a");
    let give_up = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while !a.join("small").exists() {
        assert!(std::time::Instant::now() < give_up, "a/small never arrived");
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
    fs::rename(&a, dst.join("src/a.real")).unwrap();
    symlink(&outside, &a).unwrap();
    let out = child.wait_with_output().unwrap();
    assert_eq!(fs::read(outside.join("precious")).unwrap(), b"precious");
    // What the swap left in the copy's folder is an extra there, and goes.
    assert!(!dst.join("src/a.real").exists());
    if !out.status.success() {
        assert!(
            stderr(&out).contains("changed during the copy"),
            "{}",
            stderr(&out)
        );
    }
}

/// The same with the copy's top folder, made by the push itself (the destination did not
/// exist): swapped for a symlink, it is not followed either.
#[test]
fn a_push_over_sftp_with_delete_never_follows_its_top_folder_swapped_for_a_symlink() {
    let work = tempfile::tempdir().unwrap();
    let sshd = Sshd::start().unwrap();
    let src = work.path().join("src");
    fs::create_dir_all(&src).unwrap();
    write(&src.join("a"), b"s", 0o644);
    write(&src.join("z"), &pseudo_random(64 << 20, 3), 0o644);
    let outside = work.path().join("outside");
    fs::create_dir(&outside).unwrap();
    write(&outside.join("precious"), b"precious", 0o644);
    let dst = work.path().join("dst");
    fs::create_dir(&dst).unwrap();
    let top = dst.join("new");
    let child = plain(&sshd)
        .args(["--sftp", "-r", "--delete", "-j", "1"])
        .arg(&src)
        .arg(remote(&sshd, &top))
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let give_up = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while !top.join("a").exists() {
        assert!(std::time::Instant::now() < give_up, "a never arrived");
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
    fs::rename(&top, dst.join("moved")).unwrap();
    symlink(&outside, &top).unwrap();
    let out = child.wait_with_output().unwrap();
    assert_eq!(fs::read(outside.join("precious")).unwrap(), b"precious");
    assert!(!out.status.success() || !outside.join("z").exists());
}

/// Removing a big stale folder moves no data, yet it is progress: `--timeout` does not take
/// it for a stall.
#[test]
fn a_long_delete_over_sftp_is_not_a_stall() {
    let work = tempfile::tempdir().unwrap();
    let sshd = Sshd::start().unwrap();
    let src = work.path().join("src");
    fs::create_dir_all(&src).unwrap();
    write(&src.join("keep"), b"k", 0o644);
    let dst = work.path().join("dst");
    let old = dst.join("src/old");
    fs::create_dir_all(&old).unwrap();
    // About 4 s of removals here, twice the limit; the limit leaves the login and the
    // SFTP start 2 s on a loaded machine.
    for i in 0..10_000 {
        fs::write(old.join(format!("f{i}")), b"").unwrap();
    }
    let out = run(plain(&sshd)
        .args(["--sftp", "-r", "--json", "--delete", "--timeout", "2"])
        .arg(&src)
        .arg(remote(&sshd, &dst)));
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(json(&out)["files_deleted"], 10_001);
    assert!(!old.exists());
}

/// `--bwlimit` holds over SFTP too, both ways: the copy takes at least as long as the limit
/// allows (a floor, not a timing of the copy). The requests queued behind the limit wait
/// longer than `--timeout` for their answers, which is not a stall while bytes move.
#[test]
fn bwlimit_holds_over_sftp() {
    let work = tempfile::tempdir().unwrap();
    let sshd = Sshd::start().unwrap();
    let size = 768 * 1024;
    let src = work.path().join("data");
    write(&src, &pseudo_random(size, 4), 0o644);
    let pushed = work.path().join("pushed");
    let pulled = work.path().join("pulled");
    let rate = 256 * 1024;
    for (from, to) in [
        (src.display().to_string(), remote(&sshd, &pushed)),
        (remote(&sshd, &src), pulled.display().to_string()),
    ] {
        let started = std::time::Instant::now();
        let out = run(plain(&sshd)
            .args(["--sftp", "--bwlimit", "256K", "--timeout", "2"])
            .arg(&from)
            .arg(&to));
        assert!(out.status.success(), "{}", stderr(&out));
        // The bucket lets one write (a tenth of a second's worth) through ahead of time.
        let floor = std::time::Duration::from_secs_f64(size as f64 / rate as f64 * 0.85);
        assert!(
            started.elapsed() >= floor,
            "{from} -> {to}: {:?}",
            started.elapsed()
        );
    }
    assert_eq!(fs::read(&pushed).unwrap(), fs::read(&src).unwrap());
    assert_eq!(fs::read(&pulled).unwrap(), fs::read(&src).unwrap());
}

#[test]
fn what_needs_fastcp_on_both_ends_is_refused_over_sftp() {
    let work = tempfile::tempdir().unwrap();
    let sshd = Sshd::start().unwrap();
    let src = work.path().join("src");
    fs::create_dir(&src).unwrap();
    write(&src.join("f"), b"f", 0o644);
    let dst = work.path().join("dst");
    for (flag, pull) in [("-H", false), ("-H", true)] {
        let (from, to) = match pull {
            false => (src.clone().into_os_string(), remote(&sshd, &dst).into()),
            true => (remote(&sshd, &src).into(), dst.clone().into_os_string()),
        };
        let out = run(plain(&sshd).args(["--sftp", "-r", flag]).arg(from).arg(to));
        // A usage error: nothing was copied.
        assert_eq!(out.status.code(), Some(2), "{flag}: {}", stderr(&out));
        assert!(
            stderr(&out).contains("needs fastcp on the remote host"),
            "{flag}: {}",
            stderr(&out)
        );
    }
    assert!(!dst.exists());
}

/// Files whose content differs from the source's at the same size and time, which only
/// `--checksum` tells from the others: a byte in a small file, a byte in the second
/// [`SHA256_RANGE`] of a big one, and files whose names no hashing tool's line carries as
/// they are.
fn alter_same_size_and_time(root: &Path) -> usize {
    let names = ["f3", "big", "new\nline", "back\\slash"];
    for name in names {
        let path = root.join(name);
        let at = if name == "big" { SHA256_RANGE + 17 } else { 1 };
        let mtime = fs::metadata(&path).unwrap().modified().unwrap();
        let f = fs::OpenOptions::new().write(true).open(&path).unwrap();
        std::os::unix::fs::FileExt::write_all_at(&f, b"\xff", at).unwrap();
        f.set_modified(mtime).unwrap();
    }
    names.len()
}

/// The tree `--checksum` is tried on: small files, a name that starts with `-`, names with
/// a newline and a backslash, and a sparse file bigger than one [`SHA256_RANGE`], hashed by
/// ranges.
fn checksum_tree(root: &Path) -> usize {
    fs::create_dir_all(root).unwrap();
    let mut n = 0;
    for i in 0..20 {
        write(&root.join(format!("f{i}")), &pseudo_random(5_000, i), 0o644);
        n += 1;
    }
    for name in ["-dash", "new\nline", "back\\slash", "it's"] {
        write(&root.join(name), &pseudo_random(300, 7), 0o644);
        n += 1;
    }
    let big = fs::File::create(root.join("big")).unwrap();
    big.set_len(SHA256_RANGE + 4096).unwrap();
    std::os::unix::fs::FileExt::write_all_at(&big, b"head", 0).unwrap();
    std::os::unix::fs::FileExt::write_all_at(&big, b"tail", SHA256_RANGE + 100).unwrap();
    // Whole seconds: SFTP carries no finer.
    for (i, e) in fs::read_dir(root).unwrap().enumerate() {
        set_mtime(&e.unwrap().path(), 1_700_000_000 + i as i64, 0);
    }
    n + 1
}

/// `--checksum` over SFTP, both ways: the remote's files are hashed there by its own tools
/// (no byte of them travels), and only the files whose content differs are sent, however
/// their sizes and times agree; a rerun sends nothing.
#[test]
fn checksum_over_sftp_sends_only_the_files_whose_content_differs() {
    let work = tempfile::tempdir().unwrap();
    let sshd = Sshd::start().unwrap();
    let src = work.path().join("src");
    let files = checksum_tree(&src);
    for pull in [false, true] {
        let dst = work.path().join(format!("dst-{pull}"));
        fs::create_dir(&dst).unwrap();
        let copy = |extra: &[&str]| {
            let (from, to) = match pull {
                false => (src.clone().into_os_string(), remote(&sshd, &dst).into()),
                true => (remote(&sshd, &src).into(), dst.clone().into_os_string()),
            };
            run(plain(&sshd)
                .args(["--sftp", "-r", "-p", "--json"])
                .args(extra)
                .arg(from)
                .arg(to))
        };
        let out = copy(&[]);
        assert!(out.status.success(), "{}", stderr(&out));
        let changed = alter_same_size_and_time(&dst.join("src"));
        // The same content with another time: skipped, and given the source's time (-p).
        set_mtime(&dst.join("src/f5"), 1_234_567_890, 0);

        let out = copy(&["--checksum"]);
        assert!(out.status.success(), "pull {pull}: {}", stderr(&out));
        let report = json(&out);
        assert_eq!(
            report["files_skipped"],
            files - changed,
            "pull {pull}: {report}"
        );
        assert_eq!(report["error_count"], 0, "{report}");
        assert_same_tree(&src, &dst.join("src"), true);
        assert_no_temp(&dst);
        let out = copy(&["--checksum"]);
        assert_eq!(
            json(&out)["files_skipped"],
            files,
            "pull {pull}: {}",
            json(&out)
        );
        assert_eq!(json(&out)["bytes_sent"], 0, "pull {pull}: {}", json(&out));
    }
}

/// `--checksum` over SFTP where the SFTP server starts in a folder of its own
/// (`sftp-server -d`), not the login shell's: the remote shell hashes the files SFTP wrote,
/// at the absolute paths the SFTP server gives, so a rerun skips them all and a changed one
/// is still sent. And a server that allows few channels on a connection (`MaxSessions 3`,
/// fewer than the shells asked for with `-j 8`) still gets its files hashed, by the shells
/// it allowed.
#[test]
fn checksum_over_sftp_hashes_what_sftp_sees_with_the_channels_the_server_allows() {
    let work = tempfile::tempdir().unwrap();
    let start = work.path().join("sftp-start");
    fs::create_dir(&start).unwrap();
    let sftp_server = fastcp_testsupport::tools::locate("sftp-server").unwrap();
    let options = format!(
        "Subsystem sftp {} -d {}\nMaxSessions 3",
        sftp_server.display(),
        start.display()
    );
    let sshd = Sshd::start_with_options(&options).unwrap();
    let src = work.path().join("src");
    fs::create_dir(&src).unwrap();
    for i in 0..30 {
        write(&src.join(format!("f{i}")), &pseudo_random(2_000, i), 0o644);
        set_mtime(&src.join(format!("f{i}")), 1_700_000_000 + i as i64, 0);
    }
    // A path relative to the SFTP server's folder.
    let dst = format!("{}:dst", sshd.alias());
    fs::create_dir(start.join("dst")).unwrap();
    // A generous idle limit: eight logins at once can be slow on a loaded machine, and
    // what this test checks is not how soon.
    let copy = |extra: &[&str]| {
        run(plain(&sshd)
            .args([
                "--sftp",
                "-r",
                "-p",
                "-j",
                "8",
                "--json",
                "--timeout",
                "120",
            ])
            .args(extra)
            .arg(&src)
            .arg(&dst))
    };
    assert!(copy(&[]).status.success());
    assert_same_tree(&src, &start.join("dst/src"), true);
    let landed = start.join("dst/src/f4");
    let mtime = fs::metadata(&landed).unwrap().modified().unwrap();
    write(&landed, &pseudo_random(2_000, 99), 0o644);
    fs::File::open(&landed)
        .unwrap()
        .set_modified(mtime)
        .unwrap();
    let out = copy(&["--checksum"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(!stderr(&out).contains("warning"), "{}", stderr(&out));
    assert_eq!(json(&out)["files_skipped"], 29, "{}", json(&out));
    assert_same_tree(&src, &start.join("dst/src"), true);
}

/// `--checksum` over SFTP to an account that runs no shell commands (`ForceCommand
/// internal-sftp`): no remote file can be hashed there, so the files of the same size are
/// sent, with a warning that says why, and the copy is still right.
#[test]
fn checksum_over_sftp_to_a_host_that_cannot_hash_sends_the_files() {
    let work = tempfile::tempdir().unwrap();
    let sshd = Sshd::start_with_options("ForceCommand internal-sftp").unwrap();
    let src = work.path().join("src");
    fs::create_dir(&src).unwrap();
    for i in 0..5 {
        write(&src.join(format!("f{i}")), &pseudo_random(1_000, i), 0o644);
    }
    let dst = work.path().join("dst");
    fs::create_dir_all(dst.join("back")).unwrap();
    for pull in [false, true] {
        let (from, to) = match pull {
            false => (src.clone().into_os_string(), remote(&sshd, &dst).into()),
            true => (
                remote(&sshd, &src).into(),
                dst.join("back").into_os_string(),
            ),
        };
        let copy = |extra: &[&str]| {
            run(plain(&sshd)
                .args(["--sftp", "-r", "--json"])
                .args(extra)
                .arg(&from)
                .arg(&to))
        };
        // Without --checksum no shell is tried, so no word of one.
        let out = copy(&[]);
        assert!(out.status.success(), "pull {pull}: {}", stderr(&out));
        assert!(!stderr(&out).contains("--checksum"), "{}", stderr(&out));
        let out = copy(&["--checksum"]);
        assert!(out.status.success(), "pull {pull}: {}", stderr(&out));
        assert_eq!(
            json(&out)["files_skipped"],
            0,
            "pull {pull}: {}",
            json(&out)
        );
        assert!(
            stderr(&out).contains("cannot hash its files"),
            "pull {pull}: {}",
            stderr(&out)
        );
    }
    assert_same_tree(&src, &dst.join("src"), false);
    assert_same_tree(&src, &dst.join("back/src"), false);
}

/// Runs `cmd` as [`run`] does, but kills it and fails the test if it is still running after
/// `limit`: for a copy that only a bound of its own keeps from waiting forever.
fn run_within(cmd: &mut Command, limit: std::time::Duration) -> std::process::Output {
    use std::io::{Read, Seek};
    // Files, not pipes: nothing the child writes can fill a pipe nobody reads yet.
    let mut out = tempfile::tempfile().unwrap();
    let mut err = tempfile::tempfile().unwrap();
    let mut child = cmd
        .stdin(std::process::Stdio::null())
        .stdout(out.try_clone().unwrap())
        .stderr(err.try_clone().unwrap())
        .spawn()
        .expect("run fastcp");
    let started = std::time::Instant::now();
    let give_up = started + limit;
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if std::time::Instant::now() > give_up {
            let _ = child.kill();
            let _ = child.wait();
            let mut said = String::new();
            err.rewind().unwrap();
            err.read_to_string(&mut said).unwrap();
            panic!("fastcp still ran after {limit:?}, and was killed; stderr: {said}");
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    let (mut stdout, mut stderr) = (Vec::new(), Vec::new());
    out.rewind().unwrap();
    out.read_to_end(&mut stdout).unwrap();
    err.rewind().unwrap();
    err.read_to_end(&mut stderr).unwrap();
    let out = std::process::Output {
        status,
        stdout,
        stderr,
    };
    eprintln!(
        "fastcp exited {:?} after {:?}\nstdout: {}\nstderr: {}",
        out.status,
        started.elapsed(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// A shell command that waits as long as the folder `dir` exists: a remote program that
/// never answers, yet is gone once the test's folder is, passed or failed.
fn hang_while(dir: &Path) -> String {
    format!("while [ -d '{}' ]; do sleep 1; done; exit 1", dir.display())
}

/// Pushes and pulls, over SFTP, a tree of ten small files (hashed by name, in batches) and
/// one whose name no hashing tool's line carries as it is (hashed alone, from the tool's
/// stdin); alters `f3` of each copy in place, keeping its size and time; and copies again
/// with `--checksum --timeout 4`, which gives each wait on a remote shell half the idle
/// limit, 2 s (a wait as long as the idle limit would end the copy as stalled, exit code 3).
/// Every run is killed, and the test failed, if it has not ended after two minutes. The
/// altered file is sent, with one warning, `warning`, and `skipped` files are skipped.
fn checksum_against_a_silent_remote(sshd: &Sshd, work: &Path, warning: &str, skipped: u64) {
    let limit = std::time::Duration::from_secs(120);
    let src = work.join("src");
    fs::create_dir(&src).unwrap();
    for i in 0..10 {
        write(&src.join(format!("f{i}")), &pseudo_random(3_000, i), 0o644);
    }
    write(&src.join("back\\slash"), &pseudo_random(3_000, 10), 0o644);
    for (i, e) in fs::read_dir(&src).unwrap().enumerate() {
        set_mtime(&e.unwrap().path(), 1_700_000_000 + i as i64, 0);
    }
    for pull in [false, true] {
        let dst = work.join(format!("dst-{pull}"));
        fs::create_dir(&dst).unwrap();
        let copy = |extra: &[&str]| {
            let (from, to) = match pull {
                false => (src.clone().into_os_string(), remote(sshd, &dst).into()),
                true => (remote(sshd, &src).into(), dst.clone().into_os_string()),
            };
            run_within(
                plain(sshd)
                    .args(["--sftp", "-r", "-p", "--json"])
                    .args(extra)
                    .arg(from)
                    .arg(to),
                limit,
            )
        };
        let out = copy(&[]);
        assert!(out.status.success(), "pull {pull}: {}", stderr(&out));
        assert_same_tree(&src, &dst.join("src"), true);
        let altered = dst.join("src/f3");
        let mtime = fs::metadata(&altered).unwrap().modified().unwrap();
        let f = fs::OpenOptions::new().write(true).open(&altered).unwrap();
        std::os::unix::fs::FileExt::write_all_at(&f, b"\xff", 1).unwrap();
        f.set_modified(mtime).unwrap();
        drop(f);

        let out = copy(&["--checksum", "--timeout", "4"]);
        let said = stderr(&out);
        assert!(out.status.success(), "pull {pull}: {said}");
        assert!(said.contains(warning), "pull {pull}: {said}");
        assert_eq!(
            said.matches("--checksum:").count(),
            1,
            "pull {pull}: {said}"
        );
        let report = json(&out);
        assert_eq!(report["files_skipped"], skipped, "pull {pull}: {report}");
        assert_eq!(report["error_count"], 0, "pull {pull}: {report}");
        assert_same_tree(&src, &dst.join("src"), true);
        assert_no_temp(&dst);
    }
}

/// `--checksum` over SFTP to a host whose `exec sh -s` never answers (a login shell that
/// waits on its own for that command, and runs any other, such as the SFTP server): the
/// shell is given up after half the idle limit, the host taken for one that cannot hash,
/// and every file of the same size sent; the copy ends, right, both ways.
#[test]
fn checksum_over_sftp_gives_up_on_a_remote_shell_that_never_starts() {
    if !rustix::process::geteuid().is_root() {
        eprintln!("skipped: giving sshd's user another login shell needs root");
        return;
    }
    let work = tempfile::tempdir().unwrap();
    // sshd runs each session's command, the SFTP subsystem's too, as `SHELL -c COMMAND`.
    let shell = script(
        work.path(),
        "login-shell",
        &format!(
            "if [ \"$2\" = 'exec sh -s' ]; then {}; fi\nexec /bin/sh -c \"$2\"",
            hang_while(work.path())
        ),
    );
    let sshd = Sshd::start_with_login_shell(&shell, &[]).unwrap();
    checksum_against_a_silent_remote(
        &sshd,
        work.path(),
        "--checksum: the remote host cannot hash its files (its shell did not answer \
         within 2 s): files of the same size as their source's are sent",
        0,
    );
}

/// `--checksum` over SFTP to a host whose hashing tools answer the shell's probe (on
/// `/dev/null`) and what they read from their stdin, but never a file named to them: each
/// shell given a batch of files is given up after half the idle limit and its files are
/// sent, with one warning; the file hashed from stdin is still hashed there, by another
/// shell, and skipped. Both ways.
#[test]
fn checksum_over_sftp_gives_up_on_a_remote_shell_that_hashes_nothing() {
    let work = tempfile::tempdir().unwrap();
    let fake = work.path().join("fake-bin");
    fs::create_dir(&fake).unwrap();
    for tool in ["openssl", "sha256sum", "shasum"] {
        // First on the session's PATH; the real tool is found on the rest of it.
        let body = format!(
            "for a; do case $a in /dev/null) ;; /*) {};; esac; done\n\
             PATH=${{PATH#*:}} exec {tool} \"$@\"",
            hang_while(work.path())
        );
        script(&fake, tool, &body);
    }
    let path = format!("{}:/usr/local/bin:/usr/bin:/bin", fake.display());
    let sshd = Sshd::start_with_env(&[("PATH", Path::new(&path))]).unwrap();
    checksum_against_a_silent_remote(
        &sshd,
        work.path(),
        "--checksum: a remote shell hashed nothing for 2 s; the files it had are sent \
         (said once)",
        1,
    );
}

/// A remote shell that stops answering is not replaced by another, which would stop too:
/// with one shell (`-j 1`) and more files than one command hashes (1,000), the copy waits
/// on one hung tool, not on one for each batch, and sends every file of the same size.
#[test]
fn checksum_over_sftp_does_not_replace_a_shell_that_stopped_answering() {
    let work = tempfile::tempdir().unwrap();
    let fake = work.path().join("fake-bin");
    fs::create_dir(&fake).unwrap();
    let hung = work.path().join("hung");
    for tool in ["openssl", "sha256sum", "shasum"] {
        let body = format!(
            "for a; do case $a in /dev/null) ;; /*) echo >> '{}'; {};; esac; done\n\
             PATH=${{PATH#*:}} exec {tool} \"$@\"",
            hung.display(),
            hang_while(work.path())
        );
        script(&fake, tool, &body);
    }
    let path = format!("{}:/usr/local/bin:/usr/bin:/bin", fake.display());
    let sshd = Sshd::start_with_env(&[("PATH", Path::new(&path))]).unwrap();
    let src = work.path().join("src");
    fs::create_dir(&src).unwrap();
    for i in 0..1_001 {
        write(&src.join(format!("f{i}")), &[i as u8; 10], 0o644);
        set_mtime(&src.join(format!("f{i}")), 1_700_000_000, 0);
    }
    let dst = work.path().join("dst");
    fs::create_dir(&dst).unwrap();
    let copy = |extra: &[&str]| {
        run_within(
            plain(&sshd)
                .args(["--sftp", "-r", "-p", "-j", "1", "--json"])
                .args(extra)
                .arg(&src)
                .arg(remote(&sshd, &dst)),
            std::time::Duration::from_secs(120),
        )
    };
    assert!(copy(&[]).status.success());
    let out = copy(&["--checksum", "--timeout", "4"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("a remote shell hashed nothing for 2 s"),
        "{}",
        stderr(&out)
    );
    assert_eq!(json(&out)["files_skipped"], 0, "{}", json(&out));
    assert_eq!(
        fs::read(&hung).unwrap(),
        b"\n",
        "one hashing command hung, not one per batch"
    );
    assert_same_tree(&src, &dst.join("src"), true);
}

/// `--resume` on a push over SFTP: the partial file a stopped copy left on the remote is
/// read back and hashed by blocks, and only the blocks that differ from the source travel.
/// A damaged block is sent again; a partial file longer than the source is cut to its size;
/// the file is whole, under its own name, and the partial file is gone. A symlink in the
/// partial file's place is never written through.
#[test]
fn a_push_over_sftp_resumes_from_the_partial_file_on_the_remote() {
    let work = tempfile::tempdir().unwrap();
    let sshd = Sshd::start().unwrap();
    let content = pseudo_random((24 << 20) + 4321, 7);
    let src = work.path().join("big");
    write(&src, &content, 0o644);
    let dst = work.path().join("dst");
    fs::create_dir(&dst).unwrap();
    let partial = dst.join(".big.fastcp-partial");
    const MIB: usize = 1 << 20;
    // Ten MiB and a little more, one byte damaged.
    let mut held = content[..10 * MIB + 5000].to_vec();
    held[3 * MIB + 17] ^= 1;
    fs::write(&partial, &held).unwrap();
    // The whole source, then more: a longer partial file (the source shrank).
    let mut longer = content.clone();
    longer.extend_from_slice(&pseudo_random(3 * MIB, 8));
    // Read back in blocks of 64 KiB: the damaged one travels again.
    for (have, kept) in [(held, 10 * MIB - (64 << 10)), (longer, content.len())] {
        fs::write(&partial, &have).unwrap();
        let out = run(plain(&sshd)
            .args(["--sftp", "--resume", "--json"])
            .arg(&src)
            .arg(remote(&sshd, &dst)));
        assert!(out.status.success(), "{}", stderr(&out));
        let summary = json(&out);
        assert_eq!(summary["bytes_resumed"].as_u64(), Some(kept as u64));
        assert_eq!(
            summary["bytes_sent"].as_u64(),
            Some((content.len() - kept) as u64)
        );
        assert!(
            fs::read(dst.join("big")).unwrap() == content,
            "not identical"
        );
        assert!(!partial.exists(), "the partial file is gone once complete");
        assert_no_temp(&dst);
        fs::remove_file(dst.join("big")).unwrap();
    }
    // A symlink in the partial file's place is neither offered nor written through.
    let outside = work.path().join("outside");
    fs::write(&outside, &content[..MIB]).unwrap();
    symlink(&outside, &partial).unwrap();
    let out = run(plain(&sshd)
        .args(["--sftp", "--resume", "--json"])
        .arg(&src)
        .arg(remote(&sshd, &dst)));
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(json(&out)["bytes_resumed"].as_u64(), Some(0));
    assert!(
        fs::read(dst.join("big")).unwrap() == content,
        "not identical"
    );
    assert_eq!(fs::read(&outside).unwrap(), &content[..MIB]);
    assert!(fs::symlink_metadata(&partial).is_err());
}

/// The temp files a stopped push left on the remote (a cut, kill -9: nothing could remove
/// them then) go with the next push into their folder, once stale; a fresh one (a live
/// copy's, maybe), a `--resume` partial file, and folders the push does not write to are
/// left alone.
#[test]
fn a_push_over_sftp_removes_the_stale_temp_files_a_stopped_push_left() {
    let work = tempfile::tempdir().unwrap();
    let sshd = Sshd::start().unwrap();
    let src = work.path().join("src");
    fs::create_dir_all(src.join("sub")).unwrap();
    write(&src.join("top"), b"top", 0o644);
    write(&src.join("sub/f"), b"f", 0o644);
    let dst = work.path().join("dst");
    fs::create_dir_all(dst.join("src/sub")).unwrap();
    fs::create_dir_all(dst.join("src/other")).unwrap();
    let hour_ago = fastcp_testsupport::tree::now_secs() - 3600;
    let stale = [
        dst.join("src/.top.fastcp-0123abcd"),
        dst.join("src/sub/.f.fastcp-89abcdef"),
    ];
    let kept = [
        dst.join("src/other/.x.fastcp-0badc0de"),
        dst.join("src/.big.fastcp-partial"),
    ];
    for p in stale.iter().chain(&kept) {
        write(p, b"left", 0o600);
        set_mtime(p, hour_ago, 0);
    }
    // A link's temp name, left the same way.
    let stale_link = dst.join("src/.link.fastcp-0a0b0c0d");
    // It points at a file that must stay: removing the link is not removing what it names.
    symlink(&kept[0], &stale_link).unwrap();
    set_mtime(&stale_link, hour_ago, 0);
    let fresh = dst.join("src/sub/.g.fastcp-fedcba98");
    write(&fresh, b"live", 0o600);
    let out = run(plain(&sshd)
        .args(["--sftp", "-r"])
        .arg(&src)
        .arg(remote(&sshd, &dst)));
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(fs::read(dst.join("src/sub/f")).unwrap(), b"f");
    for p in stale.iter().chain([&stale_link]) {
        assert!(fs::symlink_metadata(p).is_err(), "{} stayed", p.display());
    }
    for p in kept.iter().chain([&fresh]) {
        assert!(p.exists(), "{} was removed", p.display());
    }
}

/// A file of the user's named like a temp file is copied like any other: no sweep of a
/// push over SFTP takes it, the copy the destination held or the one just written.
#[test]
fn a_push_over_sftp_keeps_the_users_files_named_like_temp_files() {
    let work = tempfile::tempdir().unwrap();
    let sshd = Sshd::start().unwrap();
    let src = work.path().join("m");
    fs::create_dir(&src).unwrap();
    let notes = ".notes.fastcp-deadbeef";
    write(&src.join(notes), b"notes", 0o644);
    let dst = work.path().join("dst");
    fs::create_dir_all(dst.join("m")).unwrap();
    write(&dst.join("m").join(notes), b"old", 0o644);
    let hour_ago = fastcp_testsupport::tree::now_secs() - 3600;
    set_mtime(&dst.join("m").join(notes), hour_ago, 0);
    set_mtime(&src.join(notes), hour_ago, 0);
    for round in 0..3 {
        let out = run(plain(&sshd)
            .args(["--sftp", "-r", "-p", "--delete"])
            .arg(&src)
            .arg(remote(&sshd, &dst)));
        assert!(out.status.success(), "{}", stderr(&out));
        assert_eq!(
            fs::read(dst.join("m").join(notes)).ok().as_deref(),
            Some(&b"notes"[..]),
            "round {round}"
        );
    }
}

#[test]
fn a_missing_remote_file_fails_alone_over_sftp() {
    let work = tempfile::tempdir().unwrap();
    let sshd = Sshd::start().unwrap();
    let there = work.path().join("there");
    fs::write(&there, b"t").unwrap();
    let dest = work.path().join("dest");
    fs::create_dir(&dest).unwrap();
    let out = run(plain(&sshd)
        .arg("--sftp")
        .arg(remote(&sshd, &work.path().join("missing")))
        .arg(remote(&sshd, &there))
        .arg(format!("{}/", dest.display())));
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    // Said once, as the other paths say it.
    assert!(
        stderr(&out).contains("missing: no such file or directory\n"),
        "{}",
        stderr(&out)
    );
    assert_eq!(fs::read(dest.join("there")).unwrap(), b"t");
    assert_eq!(fs::read_dir(&dest).unwrap().count(), 1);
}

#[test]
fn a_remote_fastcp_cannot_run_on_gets_its_copy_over_sftp() {
    let work = tempfile::tempdir().unwrap();
    let cache = work.path().join("cache");
    // The remote says it is FreeBSD: no fastcp binary is ever uploaded there.
    let bin = work.path().join("fake-bin");
    fs::create_dir(&bin).unwrap();
    script(&bin, "uname", "echo FreeBSD amd64");
    let path = std::ffi::OsString::from(format!("{}:/usr/bin:/bin", bin.display()));
    let sshd =
        Sshd::start_with_env(&[("XDG_CACHE_HOME", &cache), ("PATH", Path::new(&path))]).unwrap();
    let src = work.path().join("src");
    fs::create_dir(&src).unwrap();
    write(&src.join("a"), &pseudo_random(10_000, 3), 0o644);

    let dst = work.path().join("dst");
    let out = run(plain(&sshd)
        .args(["-r", "-v", "--json"])
        .arg(&src)
        .arg(remote(&sshd, &dst)));
    assert!(out.status.success(), "{}", stderr(&out));
    let said = stderr(&out);
    assert!(said.contains("FreeBSD"), "{said}");
    assert!(said.contains("copying over SFTP"), "{said}");
    assert_eq!(json(&out)["transport"], "sftp");
    assert_same_tree(&src, &dst, false);
    assert!(
        !cache.join("fastcp").exists() || fs::read_dir(cache.join("fastcp")).unwrap().count() == 0
    );
}

#[test]
fn a_remote_file_that_grows_while_read_over_sftp_is_not_kept() {
    // A procfs file says it has 0 bytes, then reads as many: it "grew" while being read.
    let work = tempfile::tempdir().unwrap();
    let sshd = Sshd::start().unwrap();
    let dst = work.path().join("stat");
    let out = run(plain(&sshd)
        .args(["--sftp", "--json"])
        .arg(format!("{}:/proc/self/stat", sshd.alias()))
        .arg(&dst));
    assert_eq!(out.status.code(), Some(5), "{}", stderr(&out));
    assert_eq!(json(&out)["errors"][0]["code"], "source_changed");
    assert!(stderr(&out).contains("changed while being read"));
    assert!(!dst.exists());
}

/// Hundreds of small files at once: the push keeps fewer than 128 handles open on each
/// session (the SFTP library mangles `sftp-server`'s handles from 128 on).
#[test]
fn many_small_files_over_sftp_both_ways() {
    let work = tempfile::tempdir().unwrap();
    let sshd = Sshd::start().unwrap();
    let src = work.path().join("src");
    fastcp_testsupport::tree::build_tiny(&src, 2_000);
    for j in ["1", "3"] {
        let pushed = work.path().join(format!("pushed-{j}"));
        let out = run(plain(&sshd)
            .args(["--sftp", "-r", "-j", j])
            .arg(&src)
            .arg(remote(&sshd, &pushed)));
        assert!(out.status.success(), "-j {j}: {}", stderr(&out));
        assert_same_tree(&src, &pushed, false);
        let pulled = work.path().join(format!("pulled-{j}"));
        let out = run(plain(&sshd)
            .args(["--sftp", "-r", "-j", j])
            .arg(remote(&sshd, &pushed))
            .arg(&pulled));
        assert!(out.status.success(), "-j {j}: {}", stderr(&out));
        assert_same_tree(&src, &pulled, false);
    }
}

/// A wildcard in a remote source expands on the remote over SFTP too, as scp (which speaks
/// SFTP) expands it, by the same rules as a fastcp server: `*` matches no leading `.`; a
/// pattern that matches nothing fails as a missing file would, naming it.
#[test]
fn remote_wildcards_expand_over_sftp_as_with_scp() {
    let sshd = Sshd::start().unwrap();
    let work = tempfile::tempdir().unwrap();
    let src = work.path().join("src");
    fs::create_dir(&src).unwrap();
    for name in ["a.txt", "b.txt", "c.log", ".hidden.txt"] {
        write(&src.join(name), name.as_bytes(), 0o644);
    }
    fs::create_dir(src.join("sub1")).unwrap();
    write(&src.join("sub1/inner"), b"inner", 0o644);
    let into = work.path().join("into");
    fs::create_dir(&into).unwrap();
    let out = run(plain(&sshd)
        .arg("--sftp")
        .arg(remote(&sshd, &src.join("*.txt")))
        .arg(&into));
    assert!(out.status.success(), "{}", stderr(&out));
    let mut got: Vec<String> = fs::read_dir(&into)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    got.sort();
    assert_eq!(got, ["a.txt", "b.txt"]);
    assert_eq!(fs::read(into.join("b.txt")).unwrap(), b"b.txt");

    let dirs = work.path().join("dirs");
    fs::create_dir(&dirs).unwrap();
    let out = run(plain(&sshd)
        .args(["--sftp", "-r"])
        .arg(remote(&sshd, &src.join("sub?")))
        .arg(&dirs));
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(fs::read(dirs.join("sub1/inner")).unwrap(), b"inner");

    let out = run(plain(&sshd)
        .arg("--sftp")
        .arg(remote(&sshd, &src.join("*.none")))
        .arg(&into));
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(stderr(&out).contains("*.none"), "{}", stderr(&out));
}

/// A backslash quotes the character after it in a remote source over SFTP too, as scp has
/// it: `my\ file.txt` names `my file.txt`, and `star\*` only `star*`.
#[test]
fn a_backslash_quotes_in_remote_sources_over_sftp() {
    let sshd = Sshd::start().unwrap();
    let work = tempfile::tempdir().unwrap();
    let src = work.path().join("src");
    fs::create_dir(&src).unwrap();
    for name in ["my file.txt", "star*", "starry"] {
        write(&src.join(name), name.as_bytes(), 0o644);
    }
    let copy = work.path().join("copy");
    let out = run(plain(&sshd)
        .arg("--sftp")
        .arg(format!("{}:{}/my\\ file.txt", sshd.alias(), src.display()))
        .arg(&copy));
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(fs::read(&copy).unwrap(), b"my file.txt");

    let into = work.path().join("into");
    fs::create_dir(&into).unwrap();
    let out = run(plain(&sshd)
        .arg("--sftp")
        .arg(format!("{}:{}/star\\*", sshd.alias(), src.display()))
        .arg(&into));
    assert!(out.status.success(), "{}", stderr(&out));
    let got: Vec<String> = fs::read_dir(&into)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert_eq!(got, ["star*"]);
}

/// A name SFTP cannot carry as it is (not UTF-8: russh-sftp takes names as text) fails
/// alone: over SFTP, a pull copies the rest of its folder, and a mirroring push says it
/// could not remove such an extra; both end with exit code 1, naming it.
#[test]
fn a_name_sftp_cannot_carry_fails_alone() {
    use std::os::unix::ffi::OsStrExt;
    let sshd = Sshd::start().unwrap();
    let work = tempfile::tempdir().unwrap();
    let src = work.path().join("src");
    fs::create_dir(&src).unwrap();
    write(&src.join("good.txt"), b"good", 0o644);
    write(&src.join("also-good"), b"also", 0o644);
    let odd = std::ffi::OsStr::from_bytes(b"bad\xff");
    write(&src.join(odd), b"bad", 0o644);

    let pulled = work.path().join("pulled");
    let out = run(plain(&sshd)
        .args(["--sftp", "-r"])
        .arg(remote(&sshd, &src))
        .arg(&pulled));
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(stderr(&out).contains("cannot carry"), "{}", stderr(&out));
    assert_eq!(fs::read(pulled.join("good.txt")).unwrap(), b"good");
    assert_eq!(fs::read(pulled.join("also-good")).unwrap(), b"also");
    assert!(!pulled.join(odd).exists());

    // Listed by --files-from, it fails as a name SFTP cannot carry, and only so: it is no
    // missing path.
    let list = work.path().join("list");
    fs::write(&list, b"bad\xff\ngood.txt\n").unwrap();
    let listed = work.path().join("listed");
    let out = run(plain(&sshd)
        .args(["--sftp", "-r", "--files-from"])
        .arg(&list)
        .arg(remote(&sshd, &src))
        .arg(&listed));
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(stderr(&out).contains("cannot carry"), "{}", stderr(&out));
    assert!(
        !stderr(&out).contains("listed by --files-from"),
        "{}",
        stderr(&out)
    );
    assert_eq!(fs::read(listed.join("good.txt")).unwrap(), b"good");

    // A mirroring pull keeps the copy an earlier copy made of it (the source still has it),
    // and deletes the rest of what the source lacks; `-n` lists just that, and the counts
    // agree.
    let local = work.path().join("local");
    fs::create_dir_all(local.join("src")).unwrap();
    write(&local.join("src").join(odd), b"bad", 0o644);
    write(&local.join("src/gone.txt"), b"gone", 0o644);
    let pull = |extra: &[&str]| {
        run(plain(&sshd)
            .args(["--sftp", "-r", "--delete", "--json"])
            .args(extra)
            .arg(remote(&sshd, &src))
            .arg(&local))
    };
    let dry = pull(&["-n"]);
    let v = json(&dry);
    let deletions: Vec<_> = v["entries"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["action"] == "delete")
        .map(|e| e["path"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(deletions, ["src/gone.txt"], "{v}");
    assert_eq!(
        (&v["files_deleted"], &v["error_count"]),
        (&1.into(), &1.into()),
        "{v}"
    );
    let out = pull(&[]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(
        !stderr(&out).contains("nothing was deleted"),
        "{}",
        stderr(&out)
    );
    assert!(
        stderr(&out).contains("1 of the entries"),
        "{}",
        stderr(&out)
    );
    let v = json(&out);
    assert_eq!(
        (&v["files_deleted"], &v["error_count"]),
        (&1.into(), &1.into()),
        "{v}"
    );
    assert_eq!(fs::read(local.join("src").join(odd)).unwrap(), b"bad");
    assert_eq!(fs::read(local.join("src/good.txt")).unwrap(), b"good");
    assert!(!local.join("src/gone.txt").exists());

    // A mirror over SFTP of a tree without it, into a copy that has it.
    fs::remove_file(src.join(odd)).unwrap();
    let mirror = work.path().join("mirror");
    fs::create_dir_all(mirror.join("src")).unwrap();
    write(&mirror.join("src").join(odd), b"extra", 0o644);
    write(&mirror.join("src/extra.txt"), b"extra", 0o644);
    let out = run(plain(&sshd)
        .args(["--sftp", "-r", "--delete"])
        .arg(&src)
        .arg(remote(&sshd, &mirror)));
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    // Said of the remote path, as a fastcp server's receiver says it.
    let shown = format!("{}: not deleted", mirror.join("src/bad\u{FFFD}").display());
    assert!(stderr(&out).contains(&shown), "{}", stderr(&out));
    assert!(!mirror.join("src/extra.txt").exists());
    assert_eq!(fs::read(mirror.join("src/good.txt")).unwrap(), b"good");
}

/// A push over SFTP whose one file cannot take its name (a folder with entries is in its
/// way) counts in `--json` only what arrived: the failed file's bytes, read and handed over,
/// never reached the remote.
#[test]
fn an_sftp_push_counts_only_the_files_that_arrived() {
    let sshd = Sshd::start().unwrap();
    let work = tempfile::tempdir().unwrap();
    let src = work.path().join("src");
    fs::create_dir(&src).unwrap();
    write(&src.join("a"), &pseudo_random(1000, 1), 0o644);
    write(&src.join("b"), &pseudo_random(3 << 20, 2), 0o644);
    write(&src.join("c"), &pseudo_random(5000, 3), 0o644);
    let dst = work.path().join("dst");
    fs::create_dir_all(dst.join("src/b/inner")).unwrap();
    fs::write(dst.join("src/b/inner/x"), b"x").unwrap();
    let out = run(plain(&sshd)
        .args(["--sftp", "-r", "--json"])
        .arg(&src)
        .arg(remote(&sshd, &dst)));
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let v = json(&out);
    assert_eq!(v["error_count"], 1, "{v}");
    assert_eq!(v["errors"][0]["path"], "src/b", "{v}");
    assert_eq!(v["files"], 2, "{v}");
    assert_eq!(v["bytes"], 6000, "{v}");
    assert_eq!(v["bytes_sent"], 6000, "{v}");
    assert_eq!(v["dirs"], 1, "{v}");
    assert_eq!(fs::read(dst.join("src/c")).unwrap(), pseudo_random(5000, 3));
}

/// A push into a folder that does not exist says which file could not be made, as scp
/// does, not the name of fastcp's own temp file.
#[test]
fn a_push_into_a_missing_folder_names_the_target_over_sftp() {
    let work = tempfile::tempdir().unwrap();
    let sshd = Sshd::start().unwrap();
    let src = work.path().join("f");
    fs::write(&src, b"f").unwrap();
    let target = work.path().join("missing/f");
    let out = run(plain(&sshd)
        .arg("--sftp")
        .arg(&src)
        .arg(remote(&sshd, &target)));
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let said = stderr(&out);
    assert!(
        said.contains(&format!(
            "{}: cannot create it: no such file",
            target.display()
        )),
        "{said}"
    );
    assert!(!said.contains(".fastcp-"), "{said}");
}

/// `~user/` over SFTP starts from that user's home folder, which the server tells
/// (`expand-path@openssh.com`), as scp does; `~nosuch/` names nothing. The paths go up
/// from the home into the test's folder: nothing is written in the home itself.
#[test]
fn a_users_home_is_expanded_over_sftp() {
    let work = tempfile::tempdir().unwrap();
    let sshd = Sshd::start().unwrap();
    let user = String::from_utf8(Command::new("id").arg("-un").output().unwrap().stdout)
        .unwrap()
        .trim()
        .to_owned();
    let passwd = Command::new("getent")
        .args(["passwd", &user])
        .output()
        .unwrap();
    let passwd = String::from_utf8(passwd.stdout).unwrap();
    let home = passwd.trim().split(':').nth(5).unwrap().to_owned();
    // From the home up to `/`, then down to the test's folder.
    let up = Path::new(&home).components().count() - 1;
    let there = |p: &Path| format!("~{user}/{}{}", "../".repeat(up), p.display());
    let src = work.path().join("f");
    fs::write(&src, b"from here").unwrap();
    let dst = work.path().join("dst");
    fs::create_dir(&dst).unwrap();
    let host = |p: &Path| format!("{}:{}", sshd.alias(), there(p));
    let out = run(plain(&sshd)
        .arg("--sftp")
        .arg(&src)
        .arg(host(&dst.join("pushed"))));
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(fs::read(dst.join("pushed")).unwrap(), b"from here");
    let out = run(plain(&sshd)
        .arg("--sftp")
        .arg(host(&dst.join("pushed")))
        .arg(dst.join("pulled")));
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(fs::read(dst.join("pulled")).unwrap(), b"from here");
    let nobody = format!("{}:~nosuch-user-here/{}", sshd.alias(), src.display());
    let out = run(plain(&sshd)
        .arg("--sftp")
        .arg(&nobody)
        .arg(dst.join("none")));
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(!dst.join("none").exists());
}

/// `host:`, `host:~`, `host:~/` and `host:./` as the source of a recursive pull name the
/// remote home folder, over SFTP as from a fastcp server: the same tree lands, under the
/// home's own name.
#[test]
fn a_pull_of_the_remote_home_over_sftp_lands_as_from_a_fastcp_server() {
    if !rustix::process::geteuid().is_root() {
        eprintln!("skipped: giving sshd's user a home of its own needs root");
        return;
    }
    let work = tempfile::tempdir().unwrap();
    let sshd = Sshd::start_with_login_shell(Path::new("/bin/sh"), &[]).unwrap();
    let home = sshd.home();
    fs::create_dir_all(home.join("sub")).unwrap();
    write(&home.join("a"), b"a", 0o644);
    write(&home.join("sub/b"), b"b", 0o600);
    for (i, spec) in ["", "~", "~/", "./"].into_iter().enumerate() {
        let from = format!("{}:{spec}", sshd.alias());
        let by_server = work.path().join(format!("server-{i}"));
        let by_sftp = work.path().join(format!("sftp-{i}"));
        fs::create_dir(&by_server).unwrap();
        fs::create_dir(&by_sftp).unwrap();
        let out = run(fastcp(&sshd, bin()).arg("-r").arg(&from).arg(&by_server));
        assert!(out.status.success(), "{spec:?}: {}", stderr(&out));
        let out = run(plain(&sshd).args(["--sftp", "-r"]).arg(&from).arg(&by_sftp));
        assert!(out.status.success(), "{spec:?}: {}", stderr(&out));
        assert_same_tree(&by_server, &by_sftp, false);
        assert_eq!(
            fs::read(by_sftp.join("home/sub/b")).unwrap(),
            b"b",
            "{spec:?}"
        );
    }
}

/// A remote wildcard over SFTP drops no name silently: a match whose name SFTP cannot carry
/// (not UTF-8) fails alone, named, and the copy ends with exit code 1.
#[test]
fn a_remote_wildcard_over_sftp_reports_the_names_it_cannot_carry() {
    use std::os::unix::ffi::OsStrExt;
    let work = tempfile::tempdir().unwrap();
    let sshd = Sshd::start().unwrap();
    let dir = work.path().join("dir");
    fs::create_dir(&dir).unwrap();
    for name in [&b"a.txt"[..], b"b\xff.txt", b"c.log"] {
        fs::write(dir.join(std::ffi::OsStr::from_bytes(name)), name).unwrap();
    }
    let dst = work.path().join("dst");
    fs::create_dir(&dst).unwrap();
    let out = run(plain(&sshd)
        .args(["--sftp", "--json"])
        .arg(format!("{}/*.txt", remote(&sshd, &dir)))
        .arg(&dst));
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let shown = format!("{}: ", dir.join("b\u{FFFD}.txt").display());
    let said = stderr(&out);
    assert!(
        said.contains(&shown) && said.contains("cannot carry"),
        "{said}"
    );
    assert_eq!(json(&out)["error_count"], 1);
    let landed: Vec<_> = fs::read_dir(&dst)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(landed, ["a.txt"]);
}

/// A file pushed to `host:file/`, where `file` is a file, fails with "not a directory" and
/// exit code 1 (a file error, as with cp and scp), over SFTP as over fastcp; the file is
/// left as it was.
#[test]
fn a_trailing_slash_on_a_remote_file_is_not_a_directory_on_both_paths() {
    let work = tempfile::tempdir().unwrap();
    let sshd = Sshd::start().unwrap();
    let src = work.path().join("a.txt");
    fs::write(&src, b"new").unwrap();
    let existing = work.path().join("existing");
    fs::write(&existing, b"old").unwrap();
    let to = format!("{}/", remote(&sshd, &existing));
    for sftp in [false, true] {
        let mut cmd = match sftp {
            true => plain(&sshd),
            false => fastcp(&sshd, bin()),
        };
        if sftp {
            cmd.arg("--sftp");
        }
        let out = run(cmd.arg(&src).arg(&to));
        assert_eq!(out.status.code(), Some(1), "sftp {sftp}: {}", stderr(&out));
        let shown = format!("{}/: not a directory", existing.display());
        assert!(
            stderr(&out).contains(&shown),
            "sftp {sftp}: {}",
            stderr(&out)
        );
        assert_eq!(fs::read(&existing).unwrap(), b"old");
    }
}

/// A pull's failures of entries inside a folder name them by their whole remote path, over
/// SFTP as from a fastcp server: a source that is missing in its folder, and a named pipe
/// met in a folder of the tree.
#[test]
fn sftp_pull_failures_name_the_remote_path_as_a_fastcp_server_does() {
    let work = tempfile::tempdir().unwrap();
    let sshd = Sshd::start().unwrap();
    let src = work.path().join("src");
    fs::create_dir_all(src.join("sub")).unwrap();
    fs::write(src.join("sub/f"), b"f").unwrap();
    rustix::fs::mknodat(
        rustix::fs::CWD,
        src.join("sub/pipe"),
        rustix::fs::FileType::Fifo,
        rustix::fs::Mode::from_raw_mode(0o644),
        0,
    )
    .unwrap();
    for sftp in [false, true] {
        let cmd = || match sftp {
            true => {
                let mut cmd = plain(&sshd);
                cmd.arg("--sftp");
                cmd
            }
            false => fastcp(&sshd, bin()),
        };
        let dst = work.path().join(format!("dst-{sftp}"));
        let out = run(cmd().arg(remote(&sshd, &src.join("sub/missing"))).arg(&dst));
        assert_eq!(out.status.code(), Some(1), "sftp {sftp}: {}", stderr(&out));
        let shown = format!("{}: no such file", src.join("sub/missing").display());
        assert!(
            stderr(&out).contains(&shown),
            "sftp {sftp}: {}",
            stderr(&out)
        );

        let out = run(cmd().arg("-r").arg(remote(&sshd, &src)).arg(&dst));
        assert_eq!(out.status.code(), Some(1), "sftp {sftp}: {}", stderr(&out));
        let shown = format!("{}: ", src.join("sub/pipe").display());
        assert!(
            stderr(&out).contains(&shown),
            "sftp {sftp}: {}",
            stderr(&out)
        );
        assert_eq!(fs::read(dst.join("sub/f")).unwrap(), b"f");
    }
}
