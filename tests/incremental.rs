//! Nightly copies: `--skip-unchanged` sends only what changed, locally and in both directions
//! over SSH and the TCP transport, against a real sshd.

mod common;

use std::path::Path;
use std::process::Command;

use common::*;
use fastcp_testsupport::Sshd;
use fastcp_testsupport::tree::{
    assert_same_tree, build_tiny, pseudo_random, scan, set_mtime, set_times, write,
};

/// The paths a dry run's `--json` summary lists as deleted.
fn deleting(summary: &serde_json::Value) -> Vec<&str> {
    summary["entries"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["action"] == "delete")
        .map(|e| e["path"].as_str().unwrap())
        .collect()
}

/// The `--json` summary of a run that must succeed.
fn ok_json(cmd: &mut Command) -> serde_json::Value {
    let out = run(cmd);
    assert!(out.status.success(), "{}", stderr(&out));
    json(&out)
}

/// Copies `src` to `dst` three times with `--skip-unchanged` through `copy` (which adds the
/// operands): everything, then nothing, then the one file changed in between.
fn three_runs(src: &Path, dst: &Path, copy: &dyn Fn(&Path, &Path) -> Command) {
    let all = ok_json(copy(src, dst).args(["--json", "-r", "--skip-unchanged"]));
    assert_eq!(all["files_skipped"], 0, "{all}");
    let files = all["files"].as_u64().unwrap();
    assert!(files > 50, "{all}");
    let top = dst.join(src.file_name().unwrap());
    assert_same_tree(src, &top, true);

    let none = ok_json(copy(src, dst).args(["--json", "-r", "--skip-unchanged"]));
    assert_eq!(none["files"], 0, "{none}");
    assert_eq!(none["bytes"], 0, "{none}");
    assert_eq!(none["files_skipped"], files, "{none}");

    write(&src.join("big.bin"), &pseudo_random(3 << 20, 7), 0o644);
    let one = ok_json(copy(src, dst).args(["--json", "-r", "--skip-unchanged"]));
    assert_eq!(one["files"], 1, "{one}");
    assert_eq!(one["bytes"], 3 << 20, "{one}");
    assert_eq!(one["files_skipped"], files - 1, "{one}");
    assert_same_tree(src, &top, true);
}

fn source(work: &Path) -> std::path::PathBuf {
    let src = work.join("src");
    build_tiny(&src, 60);
    write(&src.join("big.bin"), &pseudo_random(2 << 20, 1), 0o644);
    src
}

#[test]
fn local_rerun_sends_only_what_changed() {
    let work = tempfile::tempdir().unwrap();
    let src = source(work.path());
    let dst = work.path().join("dst");
    std::fs::create_dir(&dst).unwrap();
    three_runs(&src, &dst, &|s, d| {
        let mut cmd = Command::new(BIN);
        cmd.arg(s).arg(d);
        cmd
    });
}

/// A tree whose files became folders and folders files (or links) is mirrored in one run,
/// locally, pushed (to fastcp, and over SFTP) and pulled: a folder takes the place of a file or link, and with
/// `--delete` a file takes the place of a folder, with what it held (an empty folder goes
/// without it, as with rsync; one with entries is then reported, and kept).
#[test]
fn files_and_folders_that_swapped_are_mirrored_in_one_run() {
    use std::os::unix::fs::symlink;
    let sshd = Sshd::start().unwrap();
    let work = tempfile::tempdir().unwrap();
    let src = work.path().join("src");
    let build = |second: bool| {
        let _ = std::fs::remove_dir_all(&src);
        std::fs::create_dir_all(src.join("c")).unwrap();
        let c = src.join("c");
        if !second {
            write(&c.join("todir"), b"file", 0o644);
            std::fs::create_dir_all(c.join("tofile")).unwrap();
            write(&c.join("tofile/inner"), b"inner", 0o644);
            std::fs::create_dir(c.join("empty")).unwrap();
            symlink("elsewhere", c.join("linktodir")).unwrap();
        } else {
            std::fs::create_dir(c.join("todir")).unwrap();
            write(&c.join("todir/new"), b"new", 0o644);
            write(&c.join("tofile"), b"now a file", 0o644);
            write(&c.join("empty"), b"was an empty folder", 0o644);
            std::fs::create_dir(c.join("linktodir")).unwrap();
            write(&c.join("linktodir/x"), b"x", 0o644);
        }
    };
    for (name, how) in [("local", 0), ("pushed", 1), ("pulled", 2), ("sftp", 3)] {
        let dst = work.path().join(name);
        std::fs::create_dir(&dst).unwrap();
        let copy = |extra: &[&str]| {
            let mut cmd = match how {
                0 => Command::new(BIN),
                _ => fastcp(&sshd, bin()),
            };
            cmd.args(["-r", "-p", "--json"]).args(extra);
            match how {
                3 => cmd.arg("--sftp").arg(&src).arg(remote(&sshd, &dst)),
                2 => cmd.arg(remote(&sshd, &src)).arg(&dst),
                1 => cmd.arg(&src).arg(remote(&sshd, &dst)),
                _ => cmd.arg(&src).arg(&dst),
            };
            run(&mut cmd)
        };
        build(false);
        let out = copy(&[]);
        assert!(out.status.success(), "{name}: {}", stderr(&out));
        build(true);
        // Without --delete: the folders take the files' and the link's places, and the
        // empty folder goes; the folder with entries stays, reported.
        let out = copy(&[]);
        assert_eq!(out.status.code(), Some(1), "{name}: {}", stderr(&out));
        assert!(
            stderr(&out).contains("--delete replaces it"),
            "{}",
            stderr(&out)
        );
        let top = dst.join("src/c");
        assert_eq!(std::fs::read(top.join("todir/new")).unwrap(), b"new");
        assert_eq!(std::fs::read(top.join("linktodir/x")).unwrap(), b"x");
        assert_eq!(
            std::fs::read(top.join("empty")).unwrap(),
            b"was an empty folder"
        );
        assert!(top.join("tofile/inner").exists(), "{name}");
        // With it, the rest.
        let out = copy(&["--delete"]);
        assert!(out.status.success(), "{name}: {}", stderr(&out));
        assert_same_tree(&src, &dst.join("src"), false);
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(v["files_deleted"], 2, "{name}: {v}");
    }
}

/// A rerun leaves alone a directory whose mode and times already match (its change time
/// stays), and sets them again on one whose time was changed since.
#[test]
fn a_rerun_leaves_directories_in_line_alone_and_mends_the_others() {
    use std::os::unix::fs::MetadataExt;
    let work = tempfile::tempdir().unwrap();
    let src = source(work.path());
    let dst = work.path().join("dst");
    std::fs::create_dir(&dst).unwrap();
    let copy = || {
        ok_json(
            Command::new(BIN)
                .args(["--json", "-r", "-p", "--skip-unchanged"])
                .arg(&src)
                .arg(&dst),
        )
    };
    // A walk reads each source directory after its times were taken, and that read moves an
    // access time not later than the directory's change time (relatime): each copy would
    // then carry a new one. An access time a day ahead stays where it is (on relatime and
    // noatime mounts; a strictatime mount moves it on every read).
    let ahead = std::time::SystemTime::now() + std::time::Duration::from_secs(86_400);
    for d in walkdir_dirs(&src) {
        let times = std::fs::FileTimes::new().set_accessed(ahead);
        std::fs::File::open(&d).unwrap().set_times(times).unwrap();
    }
    copy();
    let top = dst.join("src");
    // Listed from the source: listing the copy would change its access times.
    let dirs: Vec<_> = walkdir_dirs(&src)
        .iter()
        .map(|d| top.join(d.strip_prefix(&src).unwrap()))
        .collect();
    assert!(dirs.len() > 3, "{dirs:?}");
    let (touched, kept) = (&dirs[1], &dirs[2]);
    // Change times move on in whole clock ticks: let one pass.
    std::thread::sleep(std::time::Duration::from_millis(20));
    let ctime = |d: &Path| {
        let m = std::fs::symlink_metadata(d).unwrap();
        (m.ctime(), m.ctime_nsec())
    };
    let before = ctime(kept);
    let f = std::fs::File::open(touched).unwrap();
    f.set_modified(std::time::SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1000))
        .unwrap();
    std::thread::sleep(std::time::Duration::from_millis(20));
    let again = copy();
    assert_eq!(again["files"], 0, "{again}");
    assert_eq!(ctime(kept), before, "{} was set again", kept.display());
    assert_same_tree(&src, &top, true);
}

/// A rerun leaves alone a symbolic link that already says the same, as rsync does (the same
/// inode), over SSH (with its time, `-p`) and over SFTP (which sets no time on a link); one
/// whose target (or, over SSH, time) changed is made again.
#[test]
fn a_rerun_leaves_links_in_line_alone_and_mends_the_others() {
    use std::os::unix::fs::{MetadataExt, symlink};
    let sshd = Sshd::start().unwrap();
    for path in [&["--transport", "ssh"][..], &["--sftp"][..]] {
        let work = tempfile::tempdir().unwrap();
        let src = work.path().join("src");
        std::fs::create_dir(&src).unwrap();
        write(&src.join("a"), b"a", 0o644);
        for link in ["same", "retargeted", "retimed"] {
            symlink("a", src.join(link)).unwrap();
            set_times(&src.join(link), 1_600_000_000, 1_600_000_000);
        }
        let dst = work.path().join("dst");
        std::fs::create_dir(&dst).unwrap();
        let copy = || {
            ok_json(
                fastcp(&sshd, Path::new(BIN))
                    .args(["--json", "-r", "-p", "--skip-unchanged"])
                    .args(path)
                    .arg(&src)
                    .arg(remote(&sshd, &dst)),
            )
        };
        copy();
        let top = dst.join("src");
        let inode = |name: &str| std::fs::symlink_metadata(top.join(name)).unwrap().ino();
        let before = ["same", "retargeted", "retimed"].map(inode);
        std::fs::remove_file(src.join("retargeted")).unwrap();
        symlink("elsewhere", src.join("retargeted")).unwrap();
        set_times(&src.join("retimed"), 1_700_000_000, 1_700_000_000);
        copy();
        assert_eq!(
            inode("same"),
            before[0],
            "{path:?}: an unchanged link made again"
        );
        assert_ne!(inode("retargeted"), before[1], "{path:?}");
        assert_eq!(
            std::fs::read_link(top.join("retargeted")).unwrap(),
            Path::new("elsewhere"),
            "{path:?}"
        );
        if path == ["--sftp"] {
            continue;
        }
        assert_ne!(inode("retimed"), before[2]);
        let retimed = std::fs::symlink_metadata(top.join("retimed")).unwrap();
        assert_eq!(retimed.mtime(), 1_700_000_000);
    }
}

/// The directories under `root`, `root` first, in walk order.
fn walkdir_dirs(root: &Path) -> Vec<std::path::PathBuf> {
    let mut out = vec![root.to_path_buf()];
    let mut i = 0;
    while i < out.len() {
        let mut subs: Vec<_> = std::fs::read_dir(&out[i])
            .unwrap()
            .map(|e| e.unwrap())
            .filter(|e| e.file_type().unwrap().is_dir())
            .map(|e| e.path())
            .collect();
        subs.sort();
        out.extend(subs);
        i += 1;
    }
    out
}

#[test]
fn push_and_pull_reruns_send_only_what_changed_over_ssh_and_tcp() {
    let sshd = Sshd::start().unwrap();
    for transport in ["ssh", "tcp"] {
        let work = tempfile::tempdir().unwrap();
        let src = source(work.path());
        let pushed = work.path().join("pushed");
        std::fs::create_dir(&pushed).unwrap();
        three_runs(&src, &pushed, &|s, d| {
            let mut cmd = fastcp(&sshd, bin());
            cmd.args(["--transport", transport, "-j", "2"])
                .arg(s)
                .arg(remote(&sshd, d));
            cmd
        });
        let work = tempfile::tempdir().unwrap();
        let src = source(work.path());
        let pulled = work.path().join("pulled");
        std::fs::create_dir(&pulled).unwrap();
        three_runs(&src, &pulled, &|s, d| {
            let mut cmd = fastcp(&sshd, bin());
            cmd.args(["--transport", transport, "-j", "2"])
                .arg(remote(&sshd, s))
                .arg(d);
            cmd
        });
    }
}

/// `--delete` mirrors in both directions over SSH: extras go, a symlink in the destination
/// that points outside is removed as a link and its target is untouched, and `--json`
/// counts what went.
#[test]
fn delete_mirrors_push_and_pull_without_following_symlinks_out() {
    let sshd = Sshd::start().unwrap();
    for pull in [false, true] {
        let work = tempfile::tempdir().unwrap();
        let src = source(work.path());
        let dst = work.path().join("dst");
        std::fs::create_dir(&dst).unwrap();
        let outside = work.path().join("outside");
        std::fs::create_dir(&outside).unwrap();
        write(&outside.join("precious"), b"keep me", 0o644);
        let copy = || {
            let mut cmd = fastcp(&sshd, bin());
            cmd.args(["--json", "-r", "--delete", "--transport", "ssh"]);
            if pull {
                cmd.arg(remote(&sshd, &src)).arg(&dst);
            } else {
                cmd.arg(&src).arg(remote(&sshd, &dst));
            }
            cmd
        };
        let first = ok_json(&mut copy());
        assert_eq!(first["files_deleted"], 0, "{first}");
        let top = dst.join("src");
        write(&top.join("extra"), b"x", 0o644);
        std::fs::create_dir_all(top.join("extra-dir/sub")).unwrap();
        std::os::unix::fs::symlink(&outside, top.join("escape")).unwrap();
        let second = ok_json(&mut copy());
        assert_eq!(second["files_deleted"], 4, "{second}");
        assert_same_tree(&src, &top, false);
        assert_eq!(std::fs::read(outside.join("precious")).unwrap(), b"keep me");
    }
}

/// --include and --exclude, with rsync's meaning and order, locally and on a pull (where the
/// remote side walks by the rules); with --delete, what the rules exclude is kept.
#[test]
fn include_and_exclude_rules_locally_and_on_a_pull() {
    let sshd = Sshd::start().unwrap();
    let work = tempfile::tempdir().unwrap();
    let src = work.path().join("src");
    std::fs::create_dir_all(src.join("target/debug")).unwrap();
    std::fs::create_dir_all(src.join("lib/target")).unwrap();
    for f in [
        "a.o",
        "keep.o",
        "main.c",
        "target/debug/x",
        "lib/target/y",
        "lib/z.o",
    ] {
        write(&src.join(f), f.as_bytes(), 0o644);
    }
    let rules = [
        "--include",
        "keep.o",
        "--exclude=*.o",
        "--exclude",
        "/src/target/",
    ];
    let want = ["keep.o", "lib", "lib/target", "lib/target/y", "main.c"];
    let listing = |root: &Path| {
        let mut v: Vec<String> = walk_names(root);
        v.sort();
        v
    };
    let local = work.path().join("local");
    std::fs::create_dir(&local).unwrap();
    let out = run(Command::new(BIN)
        .arg("-r")
        .args(rules)
        .arg(&src)
        .arg(&local));
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(listing(&local.join("src")), want);

    let pulled = work.path().join("pulled");
    std::fs::create_dir(&pulled).unwrap();
    // An excluded file already at the destination survives --delete.
    std::fs::create_dir_all(pulled.join("src")).unwrap();
    write(&pulled.join("src/old.o"), b"kept", 0o644);
    write(&pulled.join("src/stale.c"), b"goes", 0o644);
    let out = run(fastcp(&sshd, bin())
        .args(["-r", "--delete"])
        .args(rules)
        .arg(remote(&sshd, &src))
        .arg(&pulled));
    assert!(out.status.success(), "{}", stderr(&out));
    let mut with_old: Vec<String> = want.iter().map(|s| s.to_string()).collect();
    with_old.push("old.o".into());
    with_old.sort();
    assert_eq!(listing(&pulled.join("src")), with_old);
}

/// The rules read as rsync reads them for `rsync -r src/ dest` when the source is a folder's
/// contents (`src/.`), whichever side walks: locally, pushed and pulled, through fastcp and
/// over SFTP. `/build/` is the folder at the top of `src` (not one beneath it), a backslash
/// quotes a wildcard, `[^...]` is negated, `dir/***` is `dir` and all beneath it; with
/// `--delete`, what the rules exclude stays at the destination and the rest is mirrored.
#[test]
fn rules_on_a_folders_contents_read_as_rsyncs_on_src_slash() {
    let sshd = Sshd::start().unwrap();
    let work = tempfile::tempdir().unwrap();
    let src = work.path().join("src");
    for d in ["build", "a/build", "st*r", "x/foo", "xy"] {
        std::fs::create_dir_all(src.join(d)).unwrap();
    }
    for f in [
        "build/out.o",
        "a/build/keep",
        "file?",
        "filex",
        "st*r/f",
        "b[a]d",
        "bad",
        "Makefile",
        "top.c",
        "x/foo/bar",
        "xy/z",
    ] {
        write(&src.join(f), f.as_bytes(), 0o644);
    }
    let rules = [
        "--exclude=/build/",
        "--exclude=file\\?",
        "--exclude=st\\*r/",
        "--exclude=[^a-z]*",
        "--include=/x/***",
        "--exclude=/x*",
    ];
    let want = [
        "a",
        "a/build",
        "a/build/keep",
        "b[a]d",
        "bad",
        "build",
        "build/old",
        "filex",
        "top.c",
        "x",
        "x/foo",
        "x/foo/bar",
    ];
    let contents = |p: &Path| format!("{}/.", p.display());
    let remote_contents = |p: &Path| format!("{}/.", remote(&sshd, p));
    type Copy<'a> = Box<dyn Fn(&Path) -> Command + 'a>;
    let ways: [(&str, Copy); 5] = [
        (
            "local",
            Box::new(|dst: &Path| {
                let mut cmd = Command::new(bin());
                cmd.args(["-r", "--delete"]).args(rules);
                cmd.arg(contents(&src)).arg(dst);
                cmd
            }),
        ),
        (
            "push",
            Box::new(|dst: &Path| {
                let mut cmd = fastcp(&sshd, bin());
                cmd.args(["-r", "--delete"]).args(rules);
                cmd.arg(contents(&src)).arg(remote(&sshd, dst));
                cmd
            }),
        ),
        (
            "pull",
            Box::new(|dst: &Path| {
                let mut cmd = fastcp(&sshd, bin());
                cmd.args(["-r", "--delete"]).args(rules);
                cmd.arg(remote_contents(&src)).arg(dst);
                cmd
            }),
        ),
        (
            "push over SFTP",
            Box::new(|dst: &Path| {
                let mut cmd = fastcp(&sshd, bin());
                cmd.args(["-r", "--delete"]).args(rules);
                cmd.arg("--sftp")
                    .arg(contents(&src))
                    .arg(remote(&sshd, dst));
                cmd
            }),
        ),
        (
            "pull over SFTP",
            Box::new(|dst: &Path| {
                let mut cmd = fastcp(&sshd, bin());
                cmd.args(["-r", "--delete"]).args(rules);
                cmd.arg("--sftp").arg(remote_contents(&src)).arg(dst);
                cmd
            }),
        ),
    ];
    for (i, (way, copy)) in ways.iter().enumerate() {
        let dst = work.path().join(format!("dst{i}"));
        // What the destination holds beneath an excluded folder stays; the rest mirrors.
        std::fs::create_dir_all(dst.join("build")).unwrap();
        write(&dst.join("build/old"), b"kept", 0o644);
        write(&dst.join("stale"), b"goes", 0o644);
        let out = run(&mut copy(&dst));
        assert!(out.status.success(), "{way}: {}", stderr(&out));
        let mut got = walk_names(&dst);
        got.sort();
        assert_eq!(got, want, "{way}");
    }
}

/// `--include-from` reads rsync's include list (a bare pattern includes, `- ` excludes,
/// comments and CRLF line ends), and a `--files-from` list skips comment lines as rsync's does.
#[test]
fn include_from_and_files_from_read_as_rsyncs() {
    let work = tempfile::tempdir().unwrap();
    let src = work.path().join("src");
    for f in ["a/b/one", "a/two", "c/three", "top"] {
        std::fs::create_dir_all(src.join(f).parent().unwrap()).unwrap();
        write(&src.join(f), f.as_bytes(), 0o644);
    }
    let includes = work.path().join("includes");
    std::fs::write(
        &includes,
        "# keep a\r\na/***\r\n; and nothing else\r\n- *\r\n",
    )
    .unwrap();
    let dst = work.path().join("dst");
    let out = run(Command::new(bin())
        .args(["-r", "--include-from"])
        .arg(&includes)
        .arg(format!("{}/.", src.display()))
        .arg(&dst));
    assert!(out.status.success(), "{}", stderr(&out));
    let mut got = walk_names(&dst);
    got.sort();
    assert_eq!(got, ["a", "a/b", "a/b/one", "a/two"]);

    let list = work.path().join("list");
    std::fs::write(&list, "# the nightly list\n; two paths\nc/three\ntop\n").unwrap();
    let listed = work.path().join("listed");
    let out = run(Command::new(bin())
        .args(["-r", "--files-from"])
        .arg(&list)
        .arg(format!("{}/.", src.display()))
        .arg(&listed));
    assert!(out.status.success(), "{}", stderr(&out));
    let mut got = walk_names(&listed);
    got.sort();
    assert_eq!(got, ["c", "c/three", "top"]);
}

/// `--files-from`: only the listed paths (and the folders leading to them, and what is
/// beneath a listed folder) are copied, locally, on a push and on a pull (the list travels),
/// and `--delete` removes only what lies where the list reaches. A listed path the source
/// lacks is reported as not found, and the copy ends with exit code 1, as rsync's does.
#[test]
fn files_from_copies_only_the_listed_paths() {
    let sshd = Sshd::start().unwrap();
    let work = tempfile::tempdir().unwrap();
    let src = work.path().join("src");
    for d in ["a/b", "c/d", "e"] {
        std::fs::create_dir_all(src.join(d)).unwrap();
    }
    for f in [
        "a/b/one", "a/b/two", "a/three", "c/d/four", "c/five", "e/six", "top",
    ] {
        write(&src.join(f), f.as_bytes(), 0o644);
    }
    let list = work.path().join("list");
    std::fs::write(
        &list,
        "a/b/one
./c/

top
missing/file
",
    )
    .unwrap();
    let want = [
        "a", "a/b", "a/b/one", "c", "c/d", "c/d/four", "c/five", "top",
    ];
    let listing = |root: &Path| {
        let mut v = walk_names(root);
        v.sort();
        v
    };
    for push in [false, true] {
        let dst = work.path().join(format!("dst-{push}"));
        std::fs::create_dir(&dst).unwrap();
        let mut cmd = if push {
            let mut c = fastcp(&sshd, bin());
            c.arg("-r").arg("--files-from").arg(&list).arg(&src);
            c.arg(remote(&sshd, &dst));
            c
        } else {
            let mut c = Command::new(BIN);
            c.arg("-r")
                .arg("--files-from")
                .arg(&list)
                .arg(&src)
                .arg(&dst);
            c
        };
        let out = run(&mut cmd);
        assert_missing_reported(&out);
        assert_eq!(listing(&dst.join("src")), want, "push={push}");
    }
    // The list travels: a pull copies the same paths, over SSH and over TCP; over SFTP the
    // listing applies it. A push over SFTP walks as any push.
    for transport in ["--transport=ssh", "--transport=tcp", "--sftp"] {
        let pulled = work.path().join(format!("pulled{transport}"));
        std::fs::create_dir(&pulled).unwrap();
        let out = run(fastcp(&sshd, bin())
            .args(["-r", transport, "--files-from"])
            .arg(&list)
            .arg(remote(&sshd, &src))
            .arg(&pulled));
        assert_missing_reported(&out);
        assert_eq!(listing(&pulled.join("src")), want, "{transport}");
    }
    let pushed = work.path().join("pushed-sftp");
    std::fs::create_dir(&pushed).unwrap();
    let out = run(fastcp(&sshd, bin())
        .args(["-r", "--sftp", "--files-from"])
        .arg(&list)
        .arg(&src)
        .arg(remote(&sshd, &pushed)));
    assert_missing_reported(&out);
    assert_eq!(listing(&pushed.join("src")), want, "SFTP push");
    // With --delete the remote side knows the list too: an extra beneath a listed folder
    // goes, what the list leaves out stays. (A path the source lacks would stop the
    // deletions: what the sender could not read would look deleted.)
    std::fs::write(&list, "a/b/one\n./c/\ntop\n").unwrap();
    let dst = work.path().join("dst-true");
    write(&dst.join("src/c/extra"), b"x", 0o644);
    std::fs::create_dir_all(dst.join("src/e")).unwrap();
    write(&dst.join("src/e/unlisted"), b"u", 0o644);
    let out = run(fastcp(&sshd, bin())
        .args(["-r", "--delete", "--files-from"])
        .arg(&list)
        .arg(&src)
        .arg(remote(&sshd, &dst)));
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(!dst.join("src/c/extra").exists());
    assert!(dst.join("src/e/unlisted").exists());
    assert!(dst.join("src/top").exists());

    // A listed path that the rules leave out is not missing, and no folder is made that
    // would only lead to it: `c`, `c/d` and `e` are not made, as rsync makes none. As rsync's
    // implied folders, a folder that leads to listed paths is not asked of the rules
    // itself: `--exclude b/` does not keep `a/b/one` out. Alike locally, pushed and pulled
    // (the list and the rules travel; over SFTP the listing applies them).
    std::fs::write(&list, "a/b/one\nc/d/four\ne/six\ntop\n").unwrap();
    let rules = [
        "--exclude",
        "top",
        "--exclude",
        "c/***",
        "--exclude",
        "b/",
        "--exclude",
        "six",
    ];
    let ruled = work.path().join("ruled");
    std::fs::create_dir(&ruled).unwrap();
    let with_rules = |mut cmd: Command| {
        cmd.arg("-r").args(rules).arg("--files-from").arg(&list);
        cmd
    };
    let mut copies = Vec::new();
    let mut local = with_rules(Command::new(BIN));
    local.arg(&src).arg(ruled.join("local"));
    copies.push(("local", local));
    let mut push = with_rules(fastcp(&sshd, bin()));
    push.arg(&src).arg(remote(&sshd, &ruled.join("push")));
    copies.push(("push", push));
    for transport in ["--transport=ssh", "--transport=tcp", "--sftp"] {
        let mut pull = with_rules(fastcp(&sshd, bin()));
        pull.arg(transport)
            .arg(remote(&sshd, &src))
            .arg(ruled.join(transport));
        copies.push((transport, pull));
    }
    for (how, mut cmd) in copies {
        let out = run(&mut cmd);
        assert!(out.status.success(), "{how}: {}", stderr(&out));
        assert_eq!(listing(&ruled.join(how)), ["a", "a/b", "a/b/one"], "{how}");
    }
}

/// The copy reported the listed path its source lacks, and ended with exit code 1.
fn assert_missing_reported(out: &std::process::Output) {
    let err = stderr(out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("missing/file: listed by --files-from, but not in the source"),
        "{err}"
    );
}

/// Relative paths of everything beneath `root`.
fn walk_names(root: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            out.push(p.strip_prefix(root).unwrap().to_string_lossy().into_owned());
            if p.is_dir() {
                stack.push(p);
            }
        }
    }
    out
}

/// With -H and --skip-unchanged, a dry run lists a hard link the copy makes again: one the
/// destination broke (its name is a file of its own there, alike in size and time), or one
/// the source moved to another file; and nothing once the links are in place.
/// Locally, pulled and pushed (judged on the receiving side); the counts are the copy's.
#[test]
fn hard_link_dry_runs_list_the_links_a_rerun_makes_again() {
    let sshd = Sshd::start().unwrap();
    let work = tempfile::tempdir().unwrap();
    let src = work.path().join("src");
    std::fs::create_dir(&src).unwrap();
    write(&src.join("f"), b"one", 0o644);
    std::fs::hard_link(src.join("f"), src.join("g")).unwrap();
    write(&src.join("h"), b"two", 0o644);
    // `h` alike in size and time to `f`: the quick check cannot tell them apart.
    same_mtime(&src.join("f"), &src.join("h"));
    let dst = work.path().join("dst");
    let flags = ["-r", "-p", "-H", "--skip-unchanged"];
    let out = run(Command::new(BIN).args(flags).arg(src.join(".")).arg(&dst));
    assert!(out.status.success(), "{}", stderr(&out));
    let copies = |dry: bool| {
        let mut local = Command::new(BIN);
        local.arg(src.join(".")).arg(&dst);
        let mut pull = fastcp(&sshd, bin());
        pull.arg("--transport=tcp")
            .arg(remote(&sshd, &src.join(".")))
            .arg(&dst);
        let mut push = fastcp(&sshd, bin());
        push.arg("--transport=tcp")
            .arg(src.join("."))
            .arg(remote(&sshd, &dst));
        let mut cmds = [("local", local), ("pull", pull), ("push", push)];
        for (_, cmd) in &mut cmds {
            cmd.args(flags).arg("--json");
            if dry {
                cmd.arg("-n");
            }
        }
        // A copy itself runs once.
        let cmds = match dry {
            true => &mut cmds[..],
            false => &mut cmds[..1],
        };
        cmds.iter_mut()
            .map(|(how, cmd)| (*how, ok_json(cmd)))
            .collect::<Vec<_>>()
    };
    let listed = |v: &serde_json::Value| -> Vec<String> {
        v["entries"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["path"].as_str().unwrap().to_owned())
            .collect()
    };
    let counts = |v: &serde_json::Value| {
        (
            v["files"].as_u64(),
            v["files_skipped"].as_u64(),
            v["bytes"].as_u64(),
        )
    };
    for (how, v) in copies(true) {
        assert_eq!(listed(&v), Vec::<String>::new(), "{how}: in place");
    }
    // The destination's link broken: `g` a copy of its own, alike in size and time.
    std::fs::copy(dst.join("g"), work.path().join("g")).unwrap();
    same_mtime(&dst.join("g"), &work.path().join("g"));
    std::fs::rename(work.path().join("g"), dst.join("g")).unwrap();
    for (how, v) in copies(true) {
        assert_eq!(listed(&v), ["g"], "{how}: broken");
        assert_eq!(counts(&v), (Some(1), Some(3), Some(0)), "{how}");
    }
    let copied = copies(false);
    assert_eq!(
        counts(&copied[0].1),
        (Some(1), Some(3), Some(0)),
        "the copy's counts"
    );
    let ino = |p: &Path| std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(p).unwrap());
    assert_eq!(ino(&dst.join("g")), ino(&dst.join("f")));
    // The source's link moved: `h` is now another name of `g` (which the quick check
    // skips, alike to the destination's `g`), so `h` is linked to `g` again.
    std::fs::remove_file(src.join("g")).unwrap();
    std::fs::hard_link(src.join("h"), src.join("g")).unwrap();
    for (how, v) in copies(true) {
        assert_eq!(listed(&v), ["h"], "{how}: moved");
    }
    copies(false);
    assert_eq!(ino(&dst.join("h")), ino(&dst.join("g")));
    for (how, v) in copies(true) {
        assert_eq!(listed(&v), Vec::<String>::new(), "{how}: in place again");
    }
}

/// Gives `to` the modification time of `from`.
fn same_mtime(from: &Path, to: &Path) {
    let t = std::fs::metadata(from).unwrap().modified().unwrap();
    let file = std::fs::File::options().write(true).open(to).unwrap();
    file.set_modified(t).unwrap();
}

/// With -H, a dry run counts a file's bytes once, as the copy then sends them, whatever its
/// other names: locally, pushed and pulled, and on a rerun that makes a name again.
#[test]
fn hard_link_dry_runs_count_bytes_as_the_copy() {
    let sshd = Sshd::start().unwrap();
    let work = tempfile::tempdir().unwrap();
    let src = work.path().join("src");
    std::fs::create_dir_all(src.join("sub")).unwrap();
    write(&src.join("a"), &pseudo_random(100_000, 5), 0o644);
    std::fs::hard_link(src.join("a"), src.join("sub/b")).unwrap();
    std::fs::hard_link(src.join("a"), src.join("c")).unwrap();
    write(&src.join("lone"), b"one name", 0o644);
    let counts = |v: &serde_json::Value| {
        let n = |k: &str| v[k].as_u64().unwrap();
        (n("files"), n("bytes"))
    };
    for how in ["local", "pushed", "pulled"] {
        let dst = work.path().join(how);
        std::fs::create_dir(&dst).unwrap();
        let copy = |extra: &[&str]| {
            let mut cmd = match how {
                "local" => Command::new(BIN),
                _ => fastcp(&sshd, bin()),
            };
            cmd.args(["-r", "-H", "-p", "--json"]).args(extra);
            match how {
                "pulled" => cmd.arg(remote(&sshd, &src)).arg(&dst),
                "pushed" => cmd.arg(&src).arg(remote(&sshd, &dst)),
                _ => cmd.arg(&src).arg(&dst),
            };
            ok_json(&mut cmd)
        };
        let dry = copy(&["-n"]);
        let real = copy(&[]);
        assert_eq!(counts(&real), (4, 100_008), "{how}: {real}");
        assert_eq!(counts(&dry), counts(&real), "{how} -n: {dry}");
        // A further name gone: made again, with no bytes.
        std::fs::remove_file(dst.join("src/c")).unwrap();
        let dry = copy(&["-n", "--skip-unchanged"]);
        let real = copy(&["--skip-unchanged"]);
        assert_eq!(counts(&real), (1, 0), "{how}: {real}");
        assert_eq!(counts(&dry), counts(&real), "{how} -n: {dry}");
    }
}

/// -H keeps hard links: names of one file arrive as names of one file (one inode), locally
/// and in both directions over SSH; without -H they are separate copies.
#[test]
fn hard_links_arrive_as_one_inode() {
    use std::os::unix::fs::MetadataExt;
    let sshd = Sshd::start().unwrap();
    let work = tempfile::tempdir().unwrap();
    let src = work.path().join("src");
    std::fs::create_dir_all(src.join("sub")).unwrap();
    write(&src.join("a"), &pseudo_random(3 << 20, 4), 0o644);
    std::fs::hard_link(src.join("a"), src.join("sub/b")).unwrap();
    std::fs::hard_link(src.join("a"), src.join("c")).unwrap();
    write(&src.join("lone"), b"one name", 0o644);
    let ino = |p: &Path| std::fs::metadata(p).unwrap().ino();
    let check = |top: &Path, linked: bool| {
        assert_same_tree(&src, top, false);
        let same = ino(&top.join("a")) == ino(&top.join("sub/b"))
            && ino(&top.join("a")) == ino(&top.join("c"));
        assert_eq!(same, linked, "{}", top.display());
        assert_eq!(
            std::fs::metadata(top.join("a")).unwrap().nlink(),
            if linked { 3 } else { 1 }
        );
    };
    for (name, pull) in [("pushed", false), ("pulled", true)] {
        let dst = work.path().join(name);
        std::fs::create_dir(&dst).unwrap();
        let mut cmd = fastcp(&sshd, bin());
        cmd.args(["-r", "-H", "--json"]);
        if pull {
            cmd.arg(remote(&sshd, &src)).arg(&dst);
        } else {
            cmd.arg(&src).arg(remote(&sshd, &dst));
        }
        let v = ok_json(&mut cmd);
        // The file's bytes travel once.
        assert_eq!(v["bytes"].as_u64().unwrap(), (3 << 20) + 8, "{v}");
        check(&dst.join("src"), true);
        // Run again, as a nightly mirror does: the second time, nothing is written nor
        // deleted, and no name is left behind beside the links.
        for night in 0..2 {
            let mut cmd = fastcp(&sshd, bin());
            cmd.args(["-r", "-H", "-p", "--skip-unchanged", "--delete", "--json"]);
            if pull {
                cmd.arg(remote(&sshd, &src)).arg(&dst);
            } else {
                cmd.arg(&src).arg(remote(&sshd, &dst));
            }
            let v = ok_json(&mut cmd);
            // Nothing arrives, and every name is skipped, pushed or pulled: the file and its
            // further names (their `HardLink` entries go every time, and the receiver finds
            // the links in place), and the lone file.
            if night == 1 {
                assert_eq!(v["files"], 0, "{name}: {v}");
                assert_eq!(v["files_skipped"], 4, "{name}: {v}");
            }
            assert_eq!(v["files_deleted"], 0, "{v}");
            check(&dst.join("src"), true);
            let stray = walk_names(&dst).into_iter().find(|n| n.contains(".fastcp"));
            assert_eq!(stray, None);
        }
        // A further name gone from the target is made again: a file written, and skipped
        // as the other names of the unchanged file are (its bytes do not travel).
        std::fs::remove_file(dst.join("src/c")).unwrap();
        let mut cmd = fastcp(&sshd, bin());
        cmd.args(["-r", "-H", "-p", "--skip-unchanged", "--json"]);
        if pull {
            cmd.arg(remote(&sshd, &src)).arg(&dst);
        } else {
            cmd.arg(&src).arg(remote(&sshd, &dst));
        }
        let v = ok_json(&mut cmd);
        assert_eq!(
            (&v["files"], &v["files_skipped"]),
            (&1.into(), &4.into()),
            "{name}: {v}"
        );
        check(&dst.join("src"), true);
    }
    let local = work.path().join("local");
    std::fs::create_dir(&local).unwrap();
    let out = run(Command::new(BIN).args(["-r", "-H"]).arg(&src).arg(&local));
    assert!(out.status.success(), "{}", stderr(&out));
    check(&local.join("src"), true);
    let again = || {
        let mut cmd = Command::new(BIN);
        cmd.args(["-r", "-H", "-p", "--skip-unchanged", "--json"])
            .arg(&src)
            .arg(&local);
        ok_json(&mut cmd)
    };
    // With -p, the times the quick check compares.
    again();
    std::fs::remove_file(local.join("src/c")).unwrap();
    let v = again();
    assert_eq!(
        (&v["files"], &v["files_skipped"]),
        (&1.into(), &4.into()),
        "local: {v}"
    );
    check(&local.join("src"), true);
    let plain = work.path().join("plain");
    std::fs::create_dir(&plain).unwrap();
    let out = run(Command::new(BIN).arg("-r").arg(&src).arg(&plain));
    assert!(out.status.success(), "{}", stderr(&out));
    check(&plain.join("src"), false);
}

/// A sparse file stays sparse in both directions, over SSH, TCP and SFTP: its holes are not
/// read nor sent (but over an SFTP pull, which reads the remote file through SFTP), and the
/// copy takes about what its data takes on disk.
#[test]
fn sparse_files_keep_their_holes_and_their_zeros_stay_home() {
    use std::os::unix::fs::{FileExt, MetadataExt};
    let sshd = Sshd::start().unwrap();
    let work = tempfile::tempdir().unwrap();
    let src = work.path().join("disk.img");
    let f = std::fs::File::create(&src).unwrap();
    f.set_len(64 << 20).unwrap();
    f.write_all_at(&pseudo_random(1 << 20, 5), 8 << 20).unwrap();
    f.write_all_at(&pseudo_random(1 << 20, 6), 40 << 20)
        .unwrap();
    drop(f);
    let content = std::fs::read(&src).unwrap();
    let cases: [(&str, &[&str], bool); 6] = [
        ("ssh push", &["--transport", "ssh"], false),
        ("ssh pull", &["--transport", "ssh"], true),
        ("tcp push", &["--transport", "tcp"], false),
        ("tcp pull", &["--transport", "tcp"], true),
        ("sftp push", &["--sftp"], false),
        ("sftp pull", &["--sftp"], true),
    ];
    for (name, args, pull) in cases {
        let dst = work.path().join(name.replace(' ', "-"));
        std::fs::create_dir(&dst).unwrap();
        let mut cmd = fastcp(&sshd, bin());
        cmd.arg("--json").args(args);
        if pull {
            cmd.arg(remote(&sshd, &src)).arg(&dst);
        } else {
            cmd.arg(&src).arg(remote(&sshd, &dst));
        }
        let v = ok_json(&mut cmd);
        let copy = dst.join("disk.img");
        assert!(std::fs::read(&copy).unwrap() == content, "{name}");
        if name != "sftp pull" {
            assert_eq!(v["bytes_sent"].as_u64(), Some(2 << 20), "{name}: {v}");
        }
        // The file's bytes copied, holes included.
        assert_eq!(v["bytes"].as_u64(), Some(64 << 20), "{name}: {v}");
        let allocated = std::fs::metadata(&copy).unwrap().blocks() * 512;
        assert!(allocated <= 4 << 20, "{name}: {allocated} bytes allocated");
    }
    // `--resume` over a partial file with other bytes where the source has holes: they
    // read as zeros in the copy.
    for (name, args) in [("ssh", "--transport=ssh"), ("sftp", "--sftp")] {
        let dst = work.path().join(format!("resumed-{name}"));
        std::fs::create_dir(&dst).unwrap();
        let mut partial = vec![0xaa; 48 << 20];
        partial[8 << 20..9 << 20].copy_from_slice(&content[8 << 20..9 << 20]);
        std::fs::write(dst.join(".disk.img.fastcp-partial"), &partial).unwrap();
        let mut cmd = fastcp(&sshd, bin());
        cmd.args(["--json", "--resume", args])
            .arg(&src)
            .arg(remote(&sshd, &dst));
        let v = ok_json(&mut cmd);
        assert!(
            std::fs::read(dst.join("disk.img")).unwrap() == content,
            "{name} resume: {v}"
        );
        assert!(!dst.join(".disk.img.fastcp-partial").exists(), "{name}");
    }
    // A partial file that holds the source's first 48 MiB, zeros where it has holes: the
    // blocks of zeros are kept, and neither travel nor are written again.
    for (name, args) in [("ssh", "--transport=ssh"), ("sftp", "--sftp")] {
        let dst = work.path().join(format!("kept-{name}"));
        std::fs::create_dir(&dst).unwrap();
        std::fs::write(dst.join(".disk.img.fastcp-partial"), &content[..48 << 20]).unwrap();
        let mut cmd = fastcp(&sshd, bin());
        cmd.args(["--json", "--resume", args])
            .arg(&src)
            .arg(remote(&sshd, &dst));
        let v = ok_json(&mut cmd);
        assert!(
            std::fs::read(dst.join("disk.img")).unwrap() == content,
            "{name}: {v}"
        );
        assert_eq!(v["bytes_resumed"].as_u64(), Some(48 << 20), "{name}: {v}");
        assert_eq!(v["bytes_sent"].as_u64(), Some(0), "{name}: {v}");
    }
}

/// --checksum compares content: a file whose bytes changed but whose size and mtime did not
/// is sent (where --skip-unchanged would miss it), and one touched but unchanged is not.
#[test]
fn checksum_compares_content_not_times() {
    let sshd = Sshd::start().unwrap();
    for pull in [false, true] {
        let work = tempfile::tempdir().unwrap();
        let src = work.path().join("src");
        std::fs::create_dir(&src).unwrap();
        write(&src.join("same"), &pseudo_random(2 << 20, 1), 0o644);
        write(&src.join("sneaky"), &pseudo_random(2 << 20, 2), 0o644);
        write(&src.join("touched"), b"content", 0o644);
        let dst = work.path().join("dst");
        std::fs::create_dir(&dst).unwrap();
        let copy = |extra: &[&str]| {
            let mut cmd = fastcp(&sshd, bin());
            cmd.args(["-r", "-p", "--json"]).args(extra);
            if pull {
                cmd.arg(remote(&sshd, &src)).arg(&dst);
            } else {
                cmd.arg(&src).arg(remote(&sshd, &dst));
            }
            ok_json(&mut cmd)
        };
        copy(&[]);
        let top = dst.join("src");
        // Same size, same mtime, other bytes at the destination.
        let sneaky = top.join("sneaky");
        let mtime = std::fs::metadata(&sneaky).unwrap().modified().unwrap();
        write(&sneaky, &pseudo_random(2 << 20, 3), 0o644);
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(&sneaky)
            .unwrap();
        f.set_modified(mtime).unwrap();
        drop(f);
        // Other mtime, same bytes.
        let touched = std::fs::OpenOptions::new()
            .write(true)
            .open(src.join("touched"))
            .unwrap();
        touched
            .set_modified(std::time::SystemTime::now() + std::time::Duration::from_secs(7))
            .unwrap();
        drop(touched);
        let quick = copy(&["--skip-unchanged"]);
        assert_eq!(quick["files"], 1, "the touched file, by time: {quick}");
        // The quick check by times sent "touched" again (new mtime now matches) and missed
        // "sneaky"; the content check finds it.
        let v = copy(&["--checksum"]);
        assert_eq!(v["files"], 1, "{v}");
        assert_eq!(v["files_skipped"], 2, "{v}");
        assert_same_tree(&src, &top, true);
    }
}

/// With `-p`, `--checksum` keeps access times: the hash pass reads every file, and neither
/// the time the copy gets (sent whole, as it differs) nor the time a skipped file keeps is
/// the time of that read. Locally, pushed and pulled.
#[test]
fn checksum_with_p_keeps_the_access_times_from_before_its_hash_pass() {
    use std::os::unix::fs::MetadataExt;
    const ATIME: i64 = -616_377_600; // 1950
    const MTIME: i64 = 978_307_200; // 2001
    let sshd = Sshd::start().unwrap();
    for how in ["local", "push", "pull"] {
        let work = tempfile::tempdir().unwrap();
        let src = work.path().join("src");
        std::fs::create_dir(&src).unwrap();
        write(&src.join("differs"), b"source bytes", 0o644);
        write(&src.join("same"), b"same bytes", 0o644);
        let dst = work.path().join("dst");
        let top = dst.join("src");
        std::fs::create_dir_all(&top).unwrap();
        write(&top.join("differs"), b"other bytes!", 0o644);
        write(&top.join("same"), b"same bytes", 0o644);
        for name in ["differs", "same"] {
            set_times(&src.join(name), ATIME, MTIME);
            set_times(&top.join(name), ATIME, MTIME);
        }
        let mut cmd = match how {
            "local" => Command::new(bin()),
            _ => fastcp(&sshd, bin()),
        };
        cmd.args(["-r", "-p", "--checksum", "--json"]);
        match how {
            "local" => cmd.arg(&src).arg(&dst),
            "push" => cmd.arg(&src).arg(remote(&sshd, &dst)),
            _ => cmd.arg(remote(&sshd, &src)).arg(&dst),
        };
        let v = ok_json(&mut cmd);
        assert_eq!(
            (v["files"].as_u64(), v["files_skipped"].as_u64()),
            (Some(1), Some(1)),
            "{how}: {v}"
        );
        for name in ["differs", "same"] {
            let m = std::fs::metadata(top.join(name)).unwrap();
            assert_eq!((m.atime(), m.mtime()), (ATIME, MTIME), "{how}: {name}");
        }
        // Read last: the read moves the access time.
        assert_eq!(std::fs::read(top.join("differs")).unwrap(), b"source bytes");
    }
}

/// A push's dry run ends with the server's reason, whatever it is doing: `--checksum` alone
/// judges nothing (no content is hashed for a preview), and a target the server refuses is
/// reported even when the listing is longer than the connection's buffers.
#[test]
fn a_dry_run_push_ends_with_the_servers_word() {
    let sshd = Sshd::start().unwrap();
    let work = tempfile::tempdir().unwrap();
    let (src, dst) = many_empty_files(work.path(), 20_000);
    let out = run(fastcp(&sshd, bin())
        .args(["-n", "-r", "--checksum", "--json", "--timeout", "20"])
        .arg(&src)
        .arg(remote(&sshd, &dst)));
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(json(&out)["files"], 20_000);
    // A file where a folder is named (`afile/`): the server refuses it.
    let afile = work.path().join("afile");
    std::fs::write(&afile, b"a file").unwrap();
    let out = run(fastcp(&sshd, bin())
        .args(["-n", "-r", "--delete", "--timeout", "20"])
        .arg(&src)
        .arg(format!("{}/", remote(&sshd, &afile))));
    assert!(!out.status.success());
    assert!(stderr(&out).contains("not a directory"), "{}", stderr(&out));
    assert_eq!(std::fs::read(&afile).unwrap(), b"a file");
}

/// A push's dry run under a low `--bwlimit`: its listing takes longer than `--timeout` to
/// send, 64 KiB at a time, and that is progress, not a stall.
#[test]
fn a_slow_dry_run_push_is_not_a_stall() {
    let sshd = Sshd::start().unwrap();
    let work = tempfile::tempdir().unwrap();
    let (src, dst) = many_empty_files(work.path(), 1_500);
    std::fs::create_dir(dst.join("src")).unwrap();
    std::fs::write(dst.join("src/stale"), b"x").unwrap();
    // 64 KiB of listing takes 4 s at this rate, twice the timeout.
    let out = run(fastcp(&sshd, bin())
        .args(["-n", "-r", "--delete", "--bwlimit", "16K", "--timeout", "2"])
        .arg(&src)
        .arg(remote(&sshd, &dst)));
    assert!(out.status.success(), "{}", stderr(&out));
    let listing = String::from_utf8_lossy(&out.stdout).into_owned();
    let names = listing
        .lines()
        .filter(|l| l.contains("longish-name"))
        .count();
    assert_eq!(names, 1_500, "{listing:.300}");
    assert!(
        listing.lines().any(|l| l == "deleting src/stale"),
        "{listing:.300}"
    );
    assert!(dst.join("src/stale").exists());
}

/// A push's dry run, judged on the server, never looks through a symlink in the
/// destination: the folder it stands for is not listed, nor what lies beyond it.
#[test]
fn a_dry_run_push_never_judges_through_a_symlink_in_the_destination() {
    let sshd = Sshd::start().unwrap();
    let work = tempfile::tempdir().unwrap();
    let src = work.path().join("src");
    std::fs::create_dir_all(src.join("sub/deeper")).unwrap();
    write(&src.join("sub/deeper/f"), b"f", 0o644);
    let outside = work.path().join("outside");
    std::fs::create_dir_all(outside.join("deeper")).unwrap();
    write(&outside.join("deeper/secret"), b"s", 0o644);
    write(&outside.join("deeper/f"), b"f", 0o644);
    let dst = work.path().join("dst");
    std::fs::create_dir_all(dst.join("src")).unwrap();
    std::os::unix::fs::symlink(&outside, dst.join("src/sub")).unwrap();
    let out = run(fastcp(&sshd, bin())
        .args(["-n", "-r", "--delete", "--skip-unchanged"])
        .arg(&src)
        .arg(remote(&sshd, &dst)));
    assert!(out.status.success(), "{}", stderr(&out));
    let listed = String::from_utf8(out.stdout).unwrap();
    assert!(!listed.contains("secret"), "{listed}");
    assert!(
        listed.contains("src/sub/deeper/f"),
        "not judged unchanged: {listed}"
    );
}

/// A dry run of a rerun lists only what the rerun would make: with nothing changed,
/// nothing; not the folders and links already in place. A link whose target changed is
/// listed. Alike for a local copy, a pull, and a push judged on the server.
#[test]
fn a_dry_run_of_a_rerun_lists_only_what_would_change() {
    let sshd = Sshd::start().unwrap();
    let work = tempfile::tempdir().unwrap();
    let src = work.path().join("src");
    std::fs::create_dir_all(src.join("a/b")).unwrap();
    write(&src.join("a/b/f"), b"f", 0o644);
    write(&src.join("g"), b"g", 0o644);
    std::os::unix::fs::symlink("a/b/f", src.join("same")).unwrap();
    std::os::unix::fs::symlink("g", src.join("moved")).unwrap();
    let dst = work.path().join("dst");
    std::fs::create_dir(&dst).unwrap();
    let out = run(Command::new(BIN).arg("-rp").arg(&src).arg(&dst));
    assert!(out.status.success(), "{}", stderr(&out));
    let listed = |cmd: &mut Command| {
        let out = run(cmd.args(["-n", "-r", "-p", "--skip-unchanged"]));
        assert!(out.status.success(), "{}", stderr(&out));
        String::from_utf8(out.stdout).unwrap()
    };
    let everywhere = |want: &str| {
        let local = listed(Command::new(BIN).arg(&src).arg(&dst));
        assert_eq!(local, want, "local");
        let pulled = listed(fastcp(&sshd, bin()).arg(remote(&sshd, &src)).arg(&dst));
        assert_eq!(pulled, want, "pull");
        for transport in ["ssh", "tcp"] {
            let pushed = listed(
                fastcp(&sshd, bin())
                    .args(["--transport", transport])
                    .arg(&src)
                    .arg(remote(&sshd, &dst)),
            );
            assert_eq!(pushed, want, "push over {transport}");
        }
    };
    everywhere("");
    // The folders are still counted, as the rerun itself counts them.
    for cmd in [
        Command::new(BIN).arg(&src).arg(&dst),
        fastcp(&sshd, bin()).arg(&src).arg(remote(&sshd, &dst)),
    ]
    .iter_mut()
    {
        let out = run(cmd.args(["-n", "-r", "-p", "--skip-unchanged", "--json"]));
        let v = json(&out);
        assert_eq!(
            (v["dirs"].as_u64(), v["files"].as_u64()),
            (Some(3), Some(0)),
            "{v}"
        );
    }
    std::fs::remove_file(src.join("moved")).unwrap();
    std::os::unix::fs::symlink("a/b/f", src.join("moved")).unwrap();
    everywhere("src/moved -> a/b/f\n");
}

/// A dry run of a folder's contents (`src/.`) names each entry where it lands, beneath the
/// destination, as `rsync -n src/ dst` does: `a/y` and `deleting a/x` for `dst/a/y` and
/// `dst/a/x`, the top itself `./`, not `src/a/x`. Alike for a local copy, a pull and a push,
/// in the lines and in `--json`.
#[test]
fn a_dry_run_of_a_folders_contents_names_paths_as_they_land() {
    let sshd = Sshd::start().unwrap();
    let work = tempfile::tempdir().unwrap();
    let src = work.path().join("src");
    std::fs::create_dir_all(src.join("a")).unwrap();
    write(&src.join("a/y"), b"y", 0o644);
    let dst = work.path().join("dst");
    std::fs::create_dir_all(dst.join("a/sub")).unwrap();
    write(&dst.join("a/x"), b"x", 0o644);
    write(&dst.join("a/sub/z"), b"z", 0o644);
    write(&dst.join("k"), b"k", 0o644);
    let contents = src.join(".");
    let want = "./\na/\na/y\ndeleting k\ndeleting a/sub/z\ndeleting a/sub/\ndeleting a/x\n";
    let check = |mut cmd: Command, how: &str| {
        let mut json_cmd = Command::new(cmd.get_program());
        json_cmd.args(cmd.get_args()).arg("--json");
        for (k, v) in cmd.get_envs() {
            match v {
                Some(v) => json_cmd.env(k, v),
                None => json_cmd.env_remove(k),
            };
        }
        let out = run(&mut cmd);
        assert!(out.status.success(), "{how}: {}", stderr(&out));
        assert_eq!(String::from_utf8(out.stdout).unwrap(), want, "{how}");
        let v = json(&run(&mut json_cmd));
        let paths: Vec<&str> = v["entries"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["path"].as_str().unwrap())
            .collect();
        assert_eq!(
            paths,
            [".", "a", "a/y", "k", "a/sub/z", "a/sub", "a/x"],
            "{how}"
        );
    };
    let local = || {
        let mut cmd = Command::new(BIN);
        cmd.args(["-n", "-r", "--delete"]).arg(&contents).arg(&dst);
        cmd
    };
    check(local(), "local");
    let mut pull = fastcp(&sshd, bin());
    pull.args(["-n", "-r", "--delete"])
        .arg(remote(&sshd, &contents))
        .arg(&dst);
    check(pull, "pull");
    for transport in ["ssh", "tcp"] {
        let mut push = fastcp(&sshd, bin());
        push.args(["-n", "-r", "--delete", "--transport", transport])
            .arg(&contents)
            .arg(remote(&sshd, &dst));
        check(push, transport);
    }
}

/// A destination named on the command line that is a symlink to a folder is followed by the
/// copy, and by its dry run: `-n --delete` into it lists the extras at its top as well as
/// those below, locally, pulled and pushed, and the copy then removes just those.
#[test]
fn dry_run_into_a_symlinked_destination_lists_what_the_copy_deletes() {
    let sshd = Sshd::start().unwrap();
    let work = tempfile::tempdir().unwrap();
    let src = work.path().join("src");
    std::fs::create_dir_all(src.join("sub")).unwrap();
    std::fs::create_dir_all(src.join("sub")).unwrap();
    write(&src.join("a"), b"a", 0o644);
    write(&src.join("sub/b"), b"b", 0o644);
    let real = work.path().join("real");
    std::fs::create_dir_all(real.join("sub")).unwrap();
    write(&real.join("top-extra"), b"x", 0o644);
    write(&real.join("sub/extra"), b"y", 0o644);
    let link = work.path().join("link");
    std::os::unix::fs::symlink("real", &link).unwrap();
    let contents = src.join(".");
    let deleting = |cmd: &mut Command| {
        let out = run(cmd.args(["-n", "-r", "--delete"]));
        assert!(out.status.success(), "{}", stderr(&out));
        let mut v: Vec<String> = String::from_utf8(out.stdout)
            .unwrap()
            .lines()
            .filter(|l| l.starts_with("deleting "))
            .map(str::to_owned)
            .collect();
        v.sort();
        v
    };
    let want = ["deleting sub/extra", "deleting top-extra"];
    let local = deleting(Command::new(BIN).arg(&contents).arg(&link));
    assert_eq!(local, want, "local");
    let pulled = deleting(
        fastcp(&sshd, bin())
            .arg(remote(&sshd, &contents))
            .arg(&link),
    );
    assert_eq!(pulled, want, "pull");
    let pushed = deleting(
        fastcp(&sshd, bin())
            .arg(&contents)
            .arg(remote(&sshd, &link)),
    );
    assert_eq!(pushed, want, "push");

    let v = ok_json(
        Command::new(BIN)
            .args(["-r", "--delete", "--json"])
            .arg(&contents)
            .arg(&link),
    );
    assert_eq!(v["files_deleted"], 2, "{v}");
    assert!(!real.join("top-extra").exists() && !real.join("sub/extra").exists());
    assert_same_tree(&src, &real, false);
}

/// `-n` judges as the copy would: it leaves out what the rules exclude (locally and on a
/// pull, where the server walks), what the quick check would skip, and lists what `--delete`
/// would remove, all without writing or removing anything: on this side for a local copy or
/// a pull, on the server for a push (protocol version 6).
#[test]
fn dry_run_previews_rules_quick_check_and_delete() {
    let sshd = Sshd::start().unwrap();
    let work = tempfile::tempdir().unwrap();
    let src = work.path().join("src");
    std::fs::create_dir_all(src.join("sub")).unwrap();
    write(&src.join("a.txt"), b"a", 0o644);
    write(&src.join("b.o"), b"b", 0o644);
    write(&src.join("sub/c"), b"c", 0o644);
    let dst = work.path().join("dst");
    std::fs::create_dir(&dst).unwrap();
    let out = run(Command::new(BIN).arg("-rp").arg(&src).arg(&dst));
    assert!(out.status.success(), "{}", stderr(&out));
    write(&src.join("sub/new"), b"n", 0o644);
    write(&dst.join("src/extra"), b"x", 0o644);
    std::fs::create_dir(dst.join("src/sub/old")).unwrap();
    write(&dst.join("src/kept.o"), b"k", 0o644);
    let names = |d: &Path| {
        let mut v = walk_names(d);
        v.sort();
        v
    };
    let before = names(&dst);

    let lines = |cmd: &mut Command| {
        let out = run(cmd);
        assert!(out.status.success(), "{}", stderr(&out));
        let mut v: Vec<String> = String::from_utf8(out.stdout)
            .unwrap()
            .lines()
            .map(str::to_owned)
            .collect();
        v.sort();
        v
    };
    let args = [
        "-n",
        "-r",
        "--skip-unchanged",
        "--delete",
        "--exclude",
        "*.o",
    ];
    // The folders are there already: nothing new is made of them, so they are not listed.
    let want = ["deleting src/extra", "deleting src/sub/old/", "src/sub/new"];
    let local = lines(Command::new(BIN).args(args).arg(&src).arg(&dst));
    assert_eq!(local, want);
    let pulled = lines(
        fastcp(&sshd, bin())
            .args(args)
            .arg(remote(&sshd, &src))
            .arg(&dst),
    );
    assert_eq!(pulled, want);
    // The rules alone, on a pull: the server's walk leaves out what they exclude.
    let plain = lines(
        fastcp(&sshd, bin())
            .args(["-n", "-r", "--exclude", "*.o"])
            .arg(remote(&sshd, &src))
            .arg(&dst),
    );
    assert_eq!(
        plain,
        ["src/", "src/a.txt", "src/sub/", "src/sub/c", "src/sub/new"]
    );
    assert_eq!(names(&dst), before, "a dry run changed the destination");

    // A push: judged on the server, over either transport, alike.
    for transport in ["ssh", "tcp"] {
        let pushed = lines(
            fastcp(&sshd, bin())
                .args(args)
                .args(["--transport", transport])
                .arg(&src)
                .arg(remote(&sshd, &dst)),
        );
        assert_eq!(pushed, want, "{transport}");
    }
    assert_eq!(names(&dst), before, "a dry run changed the destination");
    // JSON counts what would go.
    let out = run(fastcp(&sshd, bin())
        .args(args)
        .arg("--json")
        .arg(&src)
        .arg(remote(&sshd, &dst)));
    let v = json(&out);
    assert_eq!(
        (v["files"].as_u64(), v["files_deleted"].as_u64()),
        (Some(1), Some(2)),
        "{v}"
    );
    assert_eq!(v["files_skipped"], 2, "{v}");
}

/// `--link-dest DIR` (rsync's): each night's backup is a full tree in a folder of its own,
/// and what last night's holds alike becomes a hard link to it instead of being sent. A
/// file that changed, or whose mode differs (a link would change last night's too), is
/// sent; the reference is never reached through a symlink in it; last night's tree is left
/// as it was. Locally, pushed and pulled; relative and absolute references; a dry run lists
/// only what would be sent.
#[test]
fn link_dest_links_what_the_reference_holds_alike_and_sends_the_rest() {
    use std::os::unix::fs::MetadataExt;
    const MTIME: i64 = 1_700_000_000;
    let sshd = Sshd::start().unwrap();
    for how in ["local", "push", "pull"] {
        let work = tempfile::tempdir().unwrap();
        let w = work.path();
        let (src, day1, outside) = (w.join("src"), w.join("b/day1"), w.join("outside"));
        for dir in [
            &src.join("sub"),
            &src.join("via"),
            &day1.join("sub"),
            &outside,
        ] {
            std::fs::create_dir_all(dir).unwrap();
        }
        let big = pseudo_random(300_000, 3);
        for (name, src_bytes, day1_bytes, src_mode, day1_mode) in [
            ("same", &big[..], &big[..], 0o644, 0o644),
            ("sub/deep", b"deep", b"deep", 0o644, 0o644),
            ("changed", b"new bytes!", b"old bytes", 0o644, 0o644),
            ("mode", b"mode", b"mode", 0o600, 0o644),
        ] {
            write(&src.join(name), src_bytes, src_mode);
            write(&day1.join(name), day1_bytes, day1_mode);
            set_times(&src.join(name), MTIME, MTIME);
            set_times(&day1.join(name), MTIME, MTIME);
        }
        write(&src.join("new"), b"only in the source", 0o644);
        // Alike, but only through a symlink in the reference: sent.
        write(&src.join("via/x"), b"through a link", 0o644);
        write(&outside.join("x"), b"through a link", 0o644);
        set_times(&src.join("via/x"), MTIME, MTIME);
        set_times(&outside.join("x"), MTIME, MTIME);
        std::os::unix::fs::symlink(&outside, day1.join("via")).unwrap();
        // What the reference holds: its bytes and modes, which no copy may change.
        let reference_state = || -> Vec<_> {
            ["same", "sub/deep", "changed", "mode"]
                .iter()
                .map(|n| {
                    (
                        std::fs::read(day1.join(n)).unwrap(),
                        std::fs::metadata(day1.join(n)).unwrap().mode(),
                    )
                })
                .collect()
        };
        let before = reference_state();

        let day2 = w.join("b/day2");
        let reference = match how {
            "push" => day1.clone(),
            _ => std::path::PathBuf::from("../day1"),
        };
        let copy = |extra: &[&str]| {
            let mut cmd = match how {
                "local" => Command::new(bin()),
                _ => fastcp(&sshd, bin()),
            };
            cmd.args(["-r", "-p", "--json", "--link-dest"])
                .arg(&reference)
                .args(extra);
            match how {
                "local" => cmd.arg(&src).arg(&day2),
                "push" => cmd.arg(&src).arg(remote(&sshd, &day2)),
                _ => cmd.arg(remote(&sshd, &src)).arg(&day2),
            };
            cmd
        };
        // The dry run, judged where the files would land, leaves out what would be linked.
        let out = run(&mut copy(&["-n"]));
        assert!(out.status.success(), "{how}: {}", stderr(&out));
        let v = json(&out);
        assert_eq!(v["files_skipped"], 2, "{how}: {v}");
        assert!(!day2.exists());
        let v = ok_json(&mut copy(&[]));
        assert_eq!(
            (v["files"].as_u64(), v["files_skipped"].as_u64()),
            (Some(4), Some(2)),
            "{how}: {v}"
        );
        let sent = b"new bytes!".len()
            + b"mode".len()
            + b"only in the source".len()
            + b"through a link".len();
        assert_eq!(v["bytes"].as_u64(), Some(sent as u64), "{how}: {v}");
        let ino = |p: &Path| std::fs::symlink_metadata(p).unwrap().ino();
        for name in ["same", "sub/deep"] {
            assert_eq!(
                ino(&day2.join(name)),
                ino(&day1.join(name)),
                "{how}: {name}"
            );
        }
        for (name, other) in [
            ("changed", day1.join("changed")),
            ("mode", day1.join("mode")),
            ("via/x", outside.join("x")),
        ] {
            assert_ne!(ino(&day2.join(name)), ino(&other), "{how}: {name}");
        }
        assert_same_tree(&src, &day2, true);
        assert_eq!(before, reference_state(), "{how}: the reference changed");
    }
}

/// A `--link-dest` folder that is not there stops the copy before anything is written, with
/// the option, the path as given and where it was looked for; with `--checksum` it is
/// refused at once.
#[test]
fn link_dest_that_is_missing_or_with_checksum_is_refused() {
    let work = tempfile::tempdir().unwrap();
    let src = work.path().join("src");
    build_tiny(&src, 3);
    let dst = work.path().join("day2");
    let out = run(Command::new(bin())
        .args(["-r", "--link-dest", "../nope"])
        .arg(&src)
        .arg(&dst));
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    // A dry run says the same.
    let dry = run(Command::new(bin())
        .args(["-r", "-n", "--link-dest", "../nope"])
        .arg(&src)
        .arg(&dst));
    assert_eq!(dry.status.code(), Some(1), "{}", stderr(&dry));
    // Where it was looked for: beside `day2`, which the copy makes.
    let looked = format!(
        "--link-dest ../nope ({}): no such file or directory",
        work.path().join("nope").display()
    );
    assert!(stderr(&out).contains(&looked), "{}", stderr(&out));
    assert!(stderr(&dry).contains(&looked), "{}", stderr(&dry));
    assert!(!dst.exists());
    // A reference on another file system, which no hard link reaches, is refused alike
    // (where /dev/shm is another file system than the temporary folder).
    use std::os::unix::fs::MetadataExt;
    let shm = std::path::Path::new("/dev/shm");
    if shm.is_dir() && shm.metadata().unwrap().dev() != work.path().metadata().unwrap().dev() {
        for dry in [false, true] {
            let mut cmd = Command::new(bin());
            cmd.args(["-r", "--link-dest", "/dev/shm"])
                .arg(&src)
                .arg(&dst);
            if dry {
                cmd.arg("-n");
            }
            let out = run(&mut cmd);
            assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
            assert!(
                stderr(&out).contains("--link-dest /dev/shm: on another file system"),
                "{}",
                stderr(&out)
            );
            assert!(!stderr(&out).contains("--help"), "{}", stderr(&out));
        }
        assert!(!dst.exists());
    }
    let out = run(Command::new(bin())
        .args(["-r", "--checksum", "--link-dest", "/"])
        .arg(&src)
        .arg(&dst));
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("--link-dest"), "{}", stderr(&out));
}

/// A rerun into the same night after the source's mode changed sends the file, a file of
/// its own, rather than change the mode of the one it shares with last night's backup; and
/// a reference whose times have whole seconds only (made over SFTP) links a source whose
/// times have nanoseconds, as rsync links them.
#[test]
fn link_dest_never_changes_the_reference_and_compares_whole_seconds_with_sftp_times() {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    const MTIME: i64 = 1_700_000_000;
    let work = tempfile::tempdir().unwrap();
    let w = work.path();
    let (src, day1, day2) = (w.join("src"), w.join("day1"), w.join("day2"));
    std::fs::create_dir_all(&src).unwrap();
    std::fs::create_dir_all(&day1).unwrap();
    for name in ["f", "g"] {
        write(&src.join(name), name.as_bytes(), 0o644);
        write(&day1.join(name), name.as_bytes(), 0o644);
        set_times(&day1.join(name), MTIME, MTIME);
    }
    set_times(&src.join("f"), MTIME, MTIME);
    // `g` has nanoseconds in the source, none in the reference.
    let ns = rustix::fs::Timespec {
        tv_sec: MTIME,
        tv_nsec: 500_000_000,
    };
    rustix::fs::utimensat(
        rustix::fs::CWD,
        src.join("g"),
        &rustix::fs::Timestamps {
            last_access: ns,
            last_modification: ns,
        },
        rustix::fs::AtFlags::empty(),
    )
    .unwrap();
    let copy = || {
        ok_json(
            Command::new(bin())
                .args(["-r", "-p", "--json", "--link-dest"])
                .arg(&day1)
                .arg(format!("{}/.", src.display()))
                .arg(&day2),
        )
    };
    let v = copy();
    assert_eq!(v["files_skipped"], 2, "{v}");
    let ino = |p: &Path| std::fs::metadata(p).unwrap().ino();
    for name in ["f", "g"] {
        assert_eq!(ino(&day1.join(name)), ino(&day2.join(name)), "{name}");
    }
    std::fs::set_permissions(src.join("f"), std::fs::Permissions::from_mode(0o600)).unwrap();
    // A dry run lists the file the copy then sends.
    let dry = ok_json(
        Command::new(bin())
            .args(["-r", "-p", "-n", "--json", "--link-dest"])
            .arg(&day1)
            .arg(format!("{}/.", src.display()))
            .arg(&day2),
    );
    assert_eq!(
        (dry["files"].as_u64(), dry["files_skipped"].as_u64()),
        (Some(1), Some(1)),
        "-n: {dry:#}"
    );
    assert_eq!(dry["entries"][0]["path"], "f", "-n: {dry:#}");
    let v = copy();
    assert_eq!(
        (v["files"].as_u64(), v["files_skipped"].as_u64()),
        (Some(1), Some(1)),
        "{v}"
    );
    let mode = |p: &Path| std::fs::metadata(p).unwrap().mode() & 0o7777;
    assert_eq!(mode(&day1.join("f")), 0o644, "the reference changed");
    assert_eq!(mode(&day2.join("f")), 0o600);
    assert_ne!(ino(&day1.join("f")), ino(&day2.join("f")));
    assert_eq!(std::fs::read(day2.join("f")).unwrap(), b"f");
    // Once more, nothing changed: `g`, whose times differ below the second, is linked
    // again in place, still a name of the reference's file, and no temporary name is left
    // beside it.
    let v = copy();
    assert_eq!(v["files_skipped"], 2, "{v}");
    assert_eq!(ino(&day1.join("g")), ino(&day2.join("g")));
    fastcp_testsupport::tree::assert_no_temp(&day2);
}

/// `-H` with `--link-dest` where the reference's file is one link short of its file
/// system's limit: the first name takes the last link, and the second, which cannot be
/// linked to it, gets both names a file of their own (a copy; rsync 3.5 fails that name);
/// the copy succeeds and the reference is left as it was. Skipped on a file system without
/// a link limit within reach (tmpfs).
#[test]
fn hard_links_onto_a_reference_at_its_link_limit_get_a_file_of_their_own() {
    use std::os::unix::fs::MetadataExt;
    const MTIME: i64 = 1_700_000_000;
    let work = tempfile::tempdir().unwrap();
    let w = work.path();
    let (src, reference, day2) = (w.join("src"), w.join("ref"), w.join("day2"));
    std::fs::create_dir_all(&src).unwrap();
    std::fs::create_dir_all(reference.join(".links")).unwrap();
    write(&src.join("full"), b"shared bytes", 0o644);
    std::fs::hard_link(src.join("full"), src.join("full2")).unwrap();
    write(&reference.join("full"), b"shared bytes", 0o644);
    set_times(&src.join("full"), MTIME, MTIME);
    set_times(&reference.join("full"), MTIME, MTIME);
    // Links until the file system refuses one, then one fewer.
    let mut n = 0;
    let limited = loop {
        match std::fs::hard_link(
            reference.join("full"),
            reference.join(format!(".links/{n}")),
        ) {
            Ok(()) => n += 1,
            Err(e) if e.raw_os_error() == Some(rustix::io::Errno::MLINK.raw_os_error()) => {
                break true;
            }
            Err(e) => panic!("{e}"),
        }
        if n > 200_000 {
            break false;
        }
    };
    if !limited {
        eprintln!("skipped: {} has no link limit within reach", w.display());
        return;
    }
    std::fs::remove_file(reference.join(format!(".links/{}", n - 1))).unwrap();
    let before = std::fs::metadata(reference.join("full")).unwrap();
    let out = run(Command::new(bin())
        .args(["-r", "-p", "-H", "--json", "--link-dest"])
        .arg(&reference)
        .arg(format!("{}/.", src.display()))
        .arg(&day2));
    assert!(out.status.success(), "{}", stderr(&out));
    let ino = |p: &Path| std::fs::metadata(p).unwrap().ino();
    assert_eq!(ino(&day2.join("full")), ino(&day2.join("full2")));
    assert_ne!(ino(&day2.join("full")), ino(&reference.join("full")));
    for name in ["full", "full2"] {
        let m = std::fs::metadata(day2.join(name)).unwrap();
        assert_eq!(std::fs::read(day2.join(name)).unwrap(), b"shared bytes");
        assert_eq!((m.mtime(), m.mode() & 0o7777), (MTIME, 0o644), "{name}");
    }
    let after = std::fs::metadata(reference.join("full")).unwrap();
    assert_eq!(
        (after.nlink(), after.mtime(), after.mode()),
        (before.nlink(), before.mtime(), before.mode())
    );
    assert_eq!(
        std::fs::read(reference.join("full")).unwrap(),
        b"shared bytes"
    );
}

/// A dry run with `--link-dest` judges as the copy does: with `-X` nothing is linked, and a
/// relative reference is found through a symlinked folder above the destination as the
/// receiver finds it (the kernel's `..`, not the text's).
#[test]
fn link_dest_dry_runs_agree_with_the_copy() {
    const MTIME: i64 = 1_700_000_000;
    let work = tempfile::tempdir().unwrap();
    let w = work.path();
    let (src, day1) = (w.join("src"), w.join("real/day1"));
    std::fs::create_dir_all(&src).unwrap();
    std::fs::create_dir_all(&day1).unwrap();
    std::fs::create_dir_all(w.join("real/x")).unwrap();
    std::os::unix::fs::symlink(w.join("real/x"), w.join("lnk")).unwrap();
    for dir in [&src, &day1] {
        write(&dir.join("f"), b"f", 0o644);
        set_times(&dir.join("f"), MTIME, MTIME);
    }
    let skipped = |extra: &[&str], to: &str| {
        let v = ok_json(
            Command::new(bin())
                .args(["-r", "-p", "--json"])
                .args(extra)
                .arg(format!("{}/.", src.display()))
                .arg(w.join(to)),
        );
        v["files_skipped"].as_u64().unwrap()
    };
    let reference = day1.display().to_string();
    for (extra, to, want) in [
        (vec!["-X", "--link-dest", &reference], "a", 0),
        (vec!["--link-dest", "../../day1"], "lnk/b", 1),
    ] {
        let mut dry = extra.clone();
        dry.push("-n");
        assert_eq!(skipped(&dry, to), want, "-n {extra:?}");
        assert_eq!(skipped(&extra, to), want, "{extra:?}");
    }
}

/// rsync's `--size-only`, `--ignore-existing` and `--update`, on every path where fastcp
/// judges on the receiving side (a local copy, a push and a pull over TCP and SSH, a pull
/// over SFTP); a push over SFTP refuses them. The control, `--skip-unchanged` alone, sends
/// every file whose time differs.
#[test]
fn size_only_ignore_existing_and_update_leave_what_rsync_leaves() {
    const T: i64 = 1_700_000_000;
    let sshd = Sshd::start().unwrap();
    let work = tempfile::tempdir().unwrap();
    let src = work.path().join("src");
    std::fs::create_dir(&src).unwrap();
    // Name, source bytes and time, destination bytes and time (None: not there).
    type Case<'a> = (&'a str, &'a [u8], i64, Option<(&'a [u8], i64)>);
    let files: [Case; 4] = [
        ("newer.txt", b"source", T, Some((b"theirs", T + 100))),
        ("older.txt", b"source", T, Some((b"theirs", T - 100))),
        (
            "resized.txt",
            b"source",
            T,
            Some((b"theirs, longer", T - 100)),
        ),
        ("absent.txt", b"source", T, None),
    ];
    for (name, bytes, time, _) in &files {
        write(&src.join(name), bytes, 0o644);
        set_times(&src.join(name), *time, *time);
    }
    let seed = |dst: &Path| {
        let _ = std::fs::remove_dir_all(dst);
        std::fs::create_dir(dst).unwrap();
        for (name, _, _, there) in &files {
            if let Some((bytes, time)) = there {
                write(&dst.join(name), bytes, 0o644);
                set_times(&dst.join(name), *time, *time);
            }
        }
    };
    // The files each option sends; the others keep the destination's bytes.
    let cases: [(&str, &[&str]); 4] = [
        (
            "--skip-unchanged",
            &["newer.txt", "older.txt", "resized.txt", "absent.txt"],
        ),
        ("--size-only", &["resized.txt", "absent.txt"]),
        ("--ignore-existing", &["absent.txt"]),
        ("--update", &["older.txt", "resized.txt", "absent.txt"]),
    ];
    let from_src = format!("{}/.", src.display());
    let remote_src = format!("{}:{}/.", sshd.alias(), src.display());
    for way in [
        "local",
        "push tcp",
        "push ssh",
        "pull tcp",
        "pull ssh",
        "pull sftp",
    ] {
        for (option, sent) in cases {
            let dst = work.path().join("dst");
            seed(&dst);
            let mut cmd = fastcp(&sshd, bin());
            cmd.args(["-r", "--json", option]);
            match way {
                "local" => cmd.arg(&from_src).arg(&dst),
                "push tcp" | "push ssh" => cmd
                    .args(["--transport", &way[5..]])
                    .arg(&from_src)
                    .arg(remote(&sshd, &dst)),
                "pull sftp" => cmd.arg("--sftp").arg(&remote_src).arg(&dst),
                _ => cmd
                    .args(["--transport", &way[5..]])
                    .arg(&remote_src)
                    .arg(&dst),
            };
            let summary = ok_json(&mut cmd);
            let what = format!("{way} {option}");
            for (name, _, time, there) in &files {
                let got = std::fs::read(dst.join(name)).unwrap();
                if sent.contains(name) {
                    assert_eq!(got, b"source", "{what}: {name}");
                } else {
                    let (bytes, their_time) = there.unwrap();
                    assert_eq!(got, bytes, "{what}: {name}");
                    let mtime = std::fs::metadata(dst.join(name)).unwrap();
                    let mtime = std::os::unix::fs::MetadataExt::mtime(&mtime);
                    // --size-only brings a skipped file in line, as the quick check does;
                    // the other two leave it untouched.
                    let want = if option == "--size-only" {
                        *time
                    } else {
                        their_time
                    };
                    assert_eq!(mtime, want, "{what}: {name}");
                }
            }
            assert_eq!(
                summary["files_skipped"],
                (files.len() - sent.len()) as u64,
                "{what}"
            );
        }
    }
    // `-n` lists what each would send: judged here for a local copy, by the server for a
    // push.
    for way in ["local", "push tcp"] {
        for (option, sent) in cases {
            let dst = work.path().join("dst");
            seed(&dst);
            let mut cmd = fastcp(&sshd, bin());
            cmd.args(["-r", "-n", option]).arg(&from_src);
            match way {
                "local" => cmd.arg(&dst),
                _ => cmd.arg(remote(&sshd, &dst)),
            };
            let out = run(&mut cmd);
            assert!(out.status.success(), "{}", stderr(&out));
            let mut listed: Vec<String> = String::from_utf8_lossy(&out.stdout)
                .lines()
                .filter_map(|l| l.rsplit('/').next().map(str::to_owned))
                .filter(|l| l.ends_with(".txt"))
                .collect();
            listed.sort();
            let mut want: Vec<&str> = sent.to_vec();
            want.sort();
            assert_eq!(listed, want, "-n {way} {option}");
        }
    }
    // A push over SFTP judges on this side, from the remote's attributes: refused.
    let dst = work.path().join("sftp-push");
    seed(&dst);
    let out = run(fastcp(&sshd, bin())
        .args(["-r", "--sftp", "--update"])
        .arg(&from_src)
        .arg(remote(&sshd, &dst)));
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("--update on a push"),
        "{}",
        stderr(&out)
    );
    assert_eq!(std::fs::read(dst.join("older.txt")).unwrap(), b"theirs");
}

/// The ways the mirror tests copy a folder's contents: locally, and pushed and pulled over
/// TCP, SSH and SFTP.
const WAYS: [(&str, &[&str]); 7] = [
    ("local", &[]),
    ("push tcp", &["--transport", "tcp"]),
    ("push ssh", &["--transport", "ssh"]),
    ("push sftp", &["--sftp"]),
    ("pull tcp", &["--transport", "tcp"]),
    ("pull ssh", &["--transport", "ssh"]),
    ("pull sftp", &["--sftp"]),
];

/// The source and destination arguments that copy the contents of `src` to `dst` the way
/// `way` goes (see [`WAYS`]): a push to `dst` on the sshd's side, a pull from `src` there.
fn ends(sshd: &Sshd, way: &str, src: &Path, dst: &Path) -> (String, String) {
    let here = format!("{}/.", src.display());
    match way {
        "local" => (here, dst.display().to_string()),
        w if w.starts_with("push") => (here, remote(sshd, dst)),
        _ => (
            format!("{}:{here}", sshd.alias()),
            dst.display().to_string(),
        ),
    }
}

/// The command that copies the contents of `src` to `dst` the way `way` goes (see [`WAYS`]),
/// with `extra` (the way's own options) and `args`.
fn copy_way(
    sshd: &Sshd,
    (way, extra): (&str, &[&str]),
    args: &[&str],
    src: &Path,
    dst: &Path,
) -> Command {
    let (from, to) = ends(sshd, way, src, dst);
    let mut cmd = fastcp(sshd, bin());
    cmd.args(args).args(extra).arg(from).arg(to);
    cmd
}

/// Empties `dst` and fills it with `files` (paths beneath it), each holding "old".
fn seed_old(dst: &Path, files: &[&str]) {
    let _ = std::fs::remove_dir_all(dst);
    for f in files {
        std::fs::create_dir_all(dst.join(f).parent().unwrap()).unwrap();
        write(&dst.join(f), b"old", 0o644);
    }
}

/// `--max-delete N` (rsync's): extras go whole, in name order, while the entries removed
/// stay within N (a folder counts with what it holds); the rest stay, the copy says how many
/// and ends with exit code 6. The same locally, on a push and a pull over TCP, SSH and SFTP,
/// and in a dry run, which lists only what would go. Without `--delete` it is refused.
#[test]
fn max_delete_stops_the_mirror_at_its_limit() {
    let sshd = Sshd::start().unwrap();
    let work = tempfile::tempdir().unwrap();
    let src = work.path().join("src");
    std::fs::create_dir_all(src.join("sub")).unwrap();
    write(&src.join("a"), b"a", 0o644);
    write(&src.join("sub/b"), b"b", 0o644);
    // Extras in name order: x1, x2, xdir (3 entries), z1.
    let seed = |dst: &Path| {
        seed_old(dst, &["a", "sub/b", "x1", "x2", "xdir/p", "xdir/q", "z1"]);
    };
    let names = |dst: &Path| {
        let mut v: Vec<String> = walk_names(dst);
        v.sort();
        v
    };
    for (way, extra) in WAYS {
        for (limit, dry_run) in [("3", false), ("3", true), ("0", false), ("8", false)] {
            // An SFTP push refuses -n with --delete.
            if dry_run && way == "push sftp" {
                continue;
            }
            let what = format!("{way} --max-delete {limit} -n {dry_run}");
            let dst = work.path().join("dst");
            seed(&dst);
            let (from, to) = ends(&sshd, way, &src, &dst);
            let mut cmd = fastcp(&sshd, bin());
            cmd.args(["-r", "--json", "--delete", "--max-delete", limit])
                .args(extra);
            if dry_run {
                cmd.arg("-n");
            }
            let out = run(cmd.arg(from).arg(to));
            let said = stderr(&out);
            let summary = json(&out);
            let left = match limit {
                "3" => ["xdir", "xdir/p", "xdir/q", "z1"].as_slice(),
                "0" => &["x1", "x2", "xdir", "xdir/p", "xdir/q", "z1"],
                _ => &[],
            };
            let (deleted, not_deleted) = match limit {
                "3" => (2, 4),
                "0" => (0, 6),
                _ => (6, 0),
            };
            if not_deleted == 0 {
                assert_eq!(out.status.code(), Some(0), "{what}: {said}");
            } else {
                assert_eq!(out.status.code(), Some(6), "{what}: {said}");
                assert!(
                    said.contains(&format!(
                        "--max-delete {limit} stopped the mirror: {not_deleted} entries"
                    )),
                    "{what}: {said}"
                );
                assert_eq!(
                    summary["errors"][0]["code"], "delete_limit",
                    "{what}: {summary}"
                );
                // The limit is no failed entry.
                assert!(!said.contains("could not be"), "{what}: {said}");
            }
            let mut want: Vec<String> = ["a", "sub", "sub/b"]
                .iter()
                .chain(if dry_run {
                    &["x1", "x2", "xdir", "xdir/p", "xdir/q", "z1"]
                } else {
                    left
                })
                .map(|s| s.to_string())
                .collect();
            want.sort();
            assert_eq!(names(&dst), want, "{what}");
            assert_eq!(summary["files_deleted"], deleted, "{what}: {summary}");
            if dry_run {
                let deleting = deleting(&summary);
                assert_eq!(deleting.len(), 2, "{what}: {summary}");
                assert!(
                    deleting
                        .iter()
                        .all(|p| p.ends_with("x1") || p.ends_with("x2")),
                    "{what}: {summary}"
                );
            }
        }
    }
    let out = run(Command::new(BIN)
        .args(["-r", "--max-delete", "1"])
        .arg(&src)
        .arg(work.path().join("plain")));
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("needs --delete"), "{}", stderr(&out));
}

/// A source file that cannot be read would look deleted: `--delete` removes nothing, and a
/// dry run says so rather than list what the copy would then leave (nor a limit reached).
/// Locally, on a pull and on a push (judged on the server). As root, the copying side runs
/// as nobody (`setpriv`), who cannot read the file.
#[test]
fn a_dry_run_deletes_nothing_when_a_source_file_cannot_be_read() {
    use std::os::unix::fs::PermissionsExt;
    let sshd = Sshd::start().unwrap();
    let work = tempfile::tempdir().unwrap();
    let perms = |p: &Path, mode| std::fs::set_permissions(p, PermissionsExt::from_mode(mode));
    perms(work.path(), 0o755).unwrap();
    let src = work.path().join("src");
    std::fs::create_dir(&src).unwrap();
    write(&src.join("a"), b"a", 0o644);
    write(&src.join("locked"), b"l", 0o600);
    // Nobody's own copy of the client's key and known_hosts, for the push.
    let keys = work.path().join("keys");
    std::fs::create_dir(&keys).unwrap();
    std::fs::copy(sshd.client_key(), keys.join("id")).unwrap();
    std::fs::copy(sshd.known_hosts(), keys.join("known_hosts")).unwrap();
    let config = keys.join("ssh_config");
    let block = sshd
        .host_block(sshd.alias())
        .replace(
            &sshd.client_key().display().to_string(),
            &keys.join("id").display().to_string(),
        )
        .replace(
            &sshd.known_hosts().display().to_string(),
            &keys.join("known_hosts").display().to_string(),
        );
    std::fs::write(&config, block).unwrap();
    let as_other = rustix::process::geteuid().is_root();
    let unreadable = if as_other {
        const NOBODY: u32 = 65534;
        for p in [
            &src,
            &src.join("a"),
            &keys,
            &keys.join("id"),
            &keys.join("known_hosts"),
        ] {
            std::os::unix::fs::chown(p, Some(NOBODY), Some(NOBODY)).unwrap();
        }
        let setpriv = fastcp_testsupport::tools::require("setpriv");
        format!(
            "'{}' --reuid={NOBODY} --regid={NOBODY} --clear-groups ",
            setpriv.display()
        )
    } else {
        perms(&src.join("locked"), 0o000).unwrap();
        String::new()
    };
    // fastcp on the side that reads the source.
    let reader = script(
        work.path(),
        "fastcp-reader",
        &format!(
            "HOME='{}' exec {unreadable}'{BIN}' \"$@\"",
            work.path().display()
        ),
    );
    let dst = work.path().join("dst");
    for way in ["local", "pull", "push"] {
        for dry_run in [true, false] {
            let what = format!("{way} -n {dry_run}");
            let _ = std::fs::remove_dir_all(&dst);
            std::fs::create_dir(&dst).unwrap();
            write(&dst.join("x"), b"extra", 0o644);
            let mut cmd = match way {
                "local" => Command::new(&reader),
                "pull" => fastcp(&sshd, &reader),
                _ => {
                    let mut cmd = Command::new(&reader);
                    cmd.arg("-F").arg(&config).arg("--remote-path").arg(BIN);
                    cmd.env_remove("SSH_AUTH_SOCK");
                    cmd
                }
            };
            cmd.args([
                "-r",
                "--json",
                "--delete",
                "--max-delete",
                "0",
                "--transport",
                "tcp",
            ]);
            if dry_run {
                cmd.arg("-n");
            }
            let from = match way {
                "pull" => format!("{}:{}/.", sshd.alias(), src.display()),
                _ => format!("{}/.", src.display()),
            };
            let to = match way {
                "push" => remote(&sshd, &dst),
                _ => dst.display().to_string(),
            };
            let out = run(cmd.arg(from).arg(to));
            let said = stderr(&out);
            assert_eq!(out.status.code(), Some(1), "{what}: {said}");
            assert!(said.contains("permission denied"), "{what}: {said}");
            assert!(said.contains("nothing was deleted"), "{what}: {said}");
            assert!(!said.contains("--max-delete"), "{what}: {said}");
            let summary = json(&out);
            assert_eq!(summary["files_deleted"], 0, "{what}: {summary}");
            if dry_run {
                let listed: Vec<&str> = summary["entries"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|e| e["path"].as_str().unwrap())
                    .collect();
                assert_eq!(listed, [".", "a"], "{what}: {summary}");
            }
            assert!(dst.join("x").exists(), "{what}");
        }
    }
}

/// `--delete` keeps what the rules exclude, also inside a folder the source does not have:
/// that folder stays, whole, and counts for nothing against `--max-delete`. The same locally,
/// on a push and a pull over TCP, SSH and SFTP, and in a dry run, which does not list it.
#[test]
fn delete_keeps_a_folder_holding_what_the_rules_exclude() {
    let sshd = Sshd::start().unwrap();
    let work = tempfile::tempdir().unwrap();
    let src = work.path().join("src");
    std::fs::create_dir_all(&src).unwrap();
    write(&src.join("a"), b"a", 0o644);
    let dst = work.path().join("dst");
    for (way, extra) in WAYS {
        for (dry_run, limit) in [(true, true), (false, true), (true, false), (false, false)] {
            if dry_run && way == "push sftp" {
                continue;
            }
            let what = format!("{way} -n {dry_run} --max-delete {limit}");
            seed_old(&dst, &["x", "xd/keep.o", "xd/deep/f"]);
            let (from, to) = ends(&sshd, way, &src, &dst);
            let mut cmd = fastcp(&sshd, bin());
            cmd.args(["-r", "--json", "--delete", "--exclude", "*.o"]);
            if limit {
                cmd.args(["--max-delete", "1"]);
            }
            cmd.args(extra);
            if dry_run {
                cmd.arg("-n");
            }
            let summary = ok_json(cmd.arg(from).arg(to));
            assert_eq!(summary["files_deleted"], 1, "{what}: {summary}");
            assert!(dst.join("xd/keep.o").exists(), "{what}");
            assert!(dst.join("xd/deep/f").exists(), "{what}");
            if dry_run {
                let deleting = deleting(&summary);
                assert_eq!(deleting, ["x"], "{what}: {summary}");
            } else {
                assert!(!dst.join("x").exists(), "{what}");
            }
        }
    }
}

/// `--delete-excluded` (which implies `--delete`) removes what the rules exclude too: a
/// file the source has but the rules leave out, an excluded folder with what it holds, and a
/// folder the source does not have that holds only excluded names. The rules still decide
/// what is sent. The same locally, on a push and a pull over TCP, SSH and SFTP, and in a dry
/// run, which lists each of them. What lies outside a `--files-from` list is still kept.
#[test]
fn delete_excluded_removes_what_the_rules_exclude() {
    let sshd = Sshd::start().unwrap();
    let work = tempfile::tempdir().unwrap();
    let src = work.path().join("src");
    for f in ["a", "skip.o", "cache/f"] {
        std::fs::create_dir_all(src.join(f).parent().unwrap()).unwrap();
        write(&src.join(f), b"new", 0o644);
    }
    let dst = work.path().join("dst");
    let seed = || seed_old(&dst, &["x", "xd/keep.o", "skip.o", "cache/old"]);
    for (way, extra) in WAYS {
        for dry_run in [true, false] {
            if dry_run && way == "push sftp" {
                continue;
            }
            let what = format!("{way} -n {dry_run}");
            seed();
            let (from, to) = ends(&sshd, way, &src, &dst);
            let mut cmd = fastcp(&sshd, bin());
            cmd.args(["-r", "--json", "--delete-excluded"])
                .args(["--exclude", "*.o", "--exclude", "cache/"])
                .args(extra);
            if dry_run {
                cmd.arg("-n");
            }
            let summary = ok_json(cmd.arg(from).arg(to));
            // x; xd, xd/keep.o; skip.o; cache, cache/old: the dry run counts them as the
            // copy does, and lists what a folder holds before it.
            assert_eq!(summary["files_deleted"], 6, "{what}: {summary}");
            if dry_run {
                let deleting = deleting(&summary);
                assert_eq!(
                    deleting,
                    ["cache/old", "cache", "skip.o", "x", "xd/keep.o", "xd"],
                    "{what}: {summary}"
                );
                assert!(dst.join("xd/keep.o").exists(), "{what}");
            } else {
                assert_eq!(
                    scan(&dst).into_keys().collect::<Vec<_>>(),
                    [b"a".to_vec()],
                    "{what}"
                );
            }
        }
    }
    // Outside a --files-from list: kept, with --delete-excluded as with --delete.
    let list = work.path().join("list");
    std::fs::write(&list, "a\n").unwrap();
    for (way, extra) in [WAYS[0], WAYS[1], WAYS[4]] {
        seed();
        let (from, to) = ends(&sshd, way, &src, &dst);
        let mut cmd = fastcp(&sshd, bin());
        cmd.args([
            "-r",
            "--delete-excluded",
            "--exclude",
            "*.o",
            "--files-from",
        ])
        .arg(&list)
        .args(extra);
        let out = run(cmd.arg(from).arg(to));
        assert!(out.status.success(), "{way}: {}", stderr(&out));
        assert!(dst.join("a").exists() && dst.join("x").exists(), "{way}");
        assert!(dst.join("skip.o").exists(), "{way}");
    }
}

/// `--max-delete` takes the folders in one order, each before what it holds, names in byte
/// order, whatever order the sources are named in and their entries arrive in over several
/// streams: the same extras go in every run and every way, and a dry run lists those.
#[test]
fn max_delete_takes_the_same_extras_in_every_run_and_its_dry_run() {
    let sshd = Sshd::start().unwrap();
    let work = tempfile::tempdir().unwrap();
    let src = work.path().join("src");
    for f in ["z/f", "a/f", "a/sub/g"] {
        std::fs::create_dir_all(src.join(f).parent().unwrap()).unwrap();
        write(&src.join(f), b"new", 0o644);
    }
    let here: Vec<String> = ["z", "a"]
        .iter()
        .map(|s| src.join(s).display().to_string())
        .collect();
    let there: Vec<String> = here
        .iter()
        .map(|s| format!("{}:{s}", sshd.alias()))
        .collect();
    let dst = work.path().join("dst");
    // Taken as a, a/sub, z: the limit lets a/x go only.
    let seed = || seed_old(&dst, &["a/x", "a/sub/x", "z/x"]);
    let ways: [(&str, &[&str]); 6] = [
        ("local", &[]),
        ("push tcp", &["--transport", "tcp", "-j", "4"]),
        ("push ssh", &["--transport", "ssh", "-j", "4"]),
        ("push sftp", &["--sftp"]),
        ("pull tcp", &["--transport", "tcp", "-j", "4"]),
        ("pull sftp", &["--sftp"]),
    ];
    for (way, extra) in ways {
        for dry_run in [true, false] {
            // An SFTP push refuses -n with --delete.
            if dry_run && way == "push sftp" {
                continue;
            }
            let what = format!("{way} -n {dry_run}");
            seed();
            let to = remote(&sshd, &dst);
            let dst_text = dst.display().to_string();
            let (from, to) = match way {
                "local" => (&here, dst_text.as_str()),
                w if w.starts_with("push") => (&here, to.as_str()),
                _ => (&there, dst_text.as_str()),
            };
            let mut cmd = fastcp(&sshd, bin());
            cmd.args(["-r", "--json", "--delete", "--max-delete", "1"])
                .args(extra);
            if dry_run {
                cmd.arg("-n");
            }
            let out = run(cmd.args(from).arg(to));
            assert_eq!(out.status.code(), Some(6), "{what}: {}", stderr(&out));
            let summary = json(&out);
            assert_eq!(summary["files_deleted"], 1, "{what}: {summary}");
            if dry_run {
                let deleting = deleting(&summary);
                assert_eq!(deleting, ["a/x"], "{what}: {summary}");
            } else {
                assert!(!dst.join("a/x").exists(), "{what}");
                assert!(dst.join("a/sub/x").exists(), "{what}");
                assert!(dst.join("z/x").exists(), "{what}");
            }
        }
    }
}

/// A folder with entries where the source now has a file is removed by `--delete`, with what
/// it holds, to make way for the file: that counts against `--max-delete` as the mirror's
/// extras do (`0` keeps the folder, and the file is not copied), and a dry run lists it,
/// with the copy's count. Locally, pushed and pulled over TCP, SSH and SFTP (a push over
/// SFTP refuses `-n` with `--delete`).
#[test]
fn a_folder_a_file_replaces_counts_against_max_delete_and_in_a_dry_run() {
    let sshd = Sshd::start().unwrap();
    let work = tempfile::tempdir().unwrap();
    let src = work.path().join("src");
    std::fs::create_dir(&src).unwrap();
    write(&src.join("c"), b"now a file", 0o644);
    write(&src.join("keep"), b"keep", 0o644);
    let cases: [(&[&str], bool); 4] = [
        (&["--max-delete", "0"], false),
        (&[], true),
        (&["--max-delete", "2"], true),
        (&[], false),
    ];
    for (way, extra) in WAYS {
        for (limit, dry_run) in cases {
            if dry_run && way == "push sftp" {
                continue;
            }
            let what = format!("{way} {limit:?} -n {dry_run}");
            let dst = work.path().join("dst");
            seed_old(&dst, &["c/a", "c/b", "keep"]);
            let dry: &[&str] = if dry_run { &["-n"] } else { &[] };
            let args = [&["-r", "--json", "--delete"][..], limit, dry].concat();
            let out = run(&mut copy_way(&sshd, (way, extra), &args, &src, &dst));
            let said = stderr(&out);
            let summary = json(&out);
            let limited = !limit.is_empty();
            let removed = if limited { 0 } else { 3 };
            assert_eq!(summary["files_deleted"], removed, "{what}: {summary}");
            if dry_run {
                let mut deleting = deleting(&summary);
                deleting.sort();
                let want: &[&str] = if limited { &[] } else { &["c", "c/a", "c/b"] };
                assert_eq!(deleting, want, "{what}: {summary}");
            }
            if limited {
                assert_ne!(out.status.code(), Some(0), "{what}: {said}");
                assert!(
                    said.contains(&format!(
                        "--max-delete {} stopped the mirror: 3 entries",
                        limit[1]
                    )),
                    "{what}: {said}"
                );
            } else {
                assert_eq!(out.status.code(), Some(0), "{what}: {said}");
            }
            let c = std::fs::symlink_metadata(dst.join("c")).unwrap();
            if dry_run || limited {
                assert!(c.is_dir(), "{what}");
                assert_eq!(std::fs::read(dst.join("c/a")).unwrap(), b"old", "{what}");
            } else {
                assert_eq!(
                    std::fs::read(dst.join("c")).unwrap(),
                    b"now a file",
                    "{what}"
                );
            }
        }
    }
}

/// A rerun leaves a symbolic link and a named pipe that are already in line as they are (no
/// new inode, nothing counted), with `-X` and `-A` too (neither keeps attributes), and its
/// dry run lists neither. Locally, pushed and pulled over TCP and SSH.
#[test]
fn a_rerun_leaves_links_and_named_pipes_in_line_as_they_are() {
    use std::os::unix::fs::MetadataExt;
    let sshd = Sshd::start().unwrap();
    let work = tempfile::tempdir().unwrap();
    let src = work.path().join("src");
    std::fs::create_dir(&src).unwrap();
    write(&src.join("f"), b"f", 0o644);
    std::os::unix::fs::symlink("f", src.join("link")).unwrap();
    rustix::fs::mknodat(
        rustix::fs::CWD,
        src.join("pipe"),
        rustix::fs::FileType::Fifo,
        rustix::fs::Mode::from_raw_mode(0o640),
        0,
    )
    .unwrap();
    let inodes = |dst: &Path| -> Vec<u64> {
        ["link", "pipe"]
            .iter()
            .map(|n| std::fs::symlink_metadata(dst.join(n)).unwrap().ino())
            .collect()
    };
    for (way, extra) in WAYS {
        if way.ends_with("sftp") {
            continue;
        }
        for flags in [&["-a"][..], &["-a", "-X", "-A"], &["-r", "--specials"]] {
            let what = format!("{way} {flags:?}");
            let dst = work.path().join("dst");
            let _ = std::fs::remove_dir_all(&dst);
            std::fs::create_dir(&dst).unwrap();
            let copy = |more: &[&str]| {
                let args = [&["--json", "--skip-unchanged"][..], flags, more].concat();
                ok_json(&mut copy_way(&sshd, (way, extra), &args, &src, &dst))
            };
            let first = copy(&[]);
            assert_eq!(first["files"], 2, "{what}: {first}");
            let before = inodes(&dst);
            let dry = copy(&["-n"]);
            assert_eq!(dry["entries"], serde_json::json!([]), "{what}: {dry}");
            let again = copy(&[]);
            assert_eq!(again["files"], 0, "{what}: {again}");
            assert_eq!(again["symlinks"], 0, "{what}: {again}");
            assert_eq!(inodes(&dst), before, "{what}");
        }
    }
}

/// `--delete` keeps the destination's entry of the name of what the sender skipped on
/// purpose (a named pipe, without `--specials`), mirrors the rest, and its dry run says the
/// same. Locally, pushed and pulled over TCP, SSH and SFTP (a push over SFTP refuses `-n`
/// with `--delete`).
#[test]
fn delete_keeps_what_the_sender_skipped_on_purpose_and_a_dry_run_agrees() {
    let sshd = Sshd::start().unwrap();
    let work = tempfile::tempdir().unwrap();
    let src = work.path().join("src");
    std::fs::create_dir(&src).unwrap();
    write(&src.join("a"), b"a", 0o644);
    rustix::fs::mknodat(
        rustix::fs::CWD,
        src.join("p"),
        rustix::fs::FileType::Fifo,
        rustix::fs::Mode::from_raw_mode(0o644),
        0,
    )
    .unwrap();
    for (way, extra) in WAYS {
        for dry_run in [true, false] {
            if dry_run && way == "push sftp" {
                continue;
            }
            let what = format!("{way} -n {dry_run}");
            let dst = work.path().join("dst");
            seed_old(&dst, &["a", "p", "extra"]);
            let dry: &[&str] = if dry_run { &["-n"] } else { &[] };
            let args = [&["-r", "--json", "--delete"][..], dry].concat();
            let out = run(&mut copy_way(&sshd, (way, extra), &args, &src, &dst));
            let said = stderr(&out);
            let summary = json(&out);
            assert_eq!(out.status.code(), Some(1), "{what}: {said}");
            assert!(!said.contains("nothing was deleted"), "{what}: {said}");
            assert_eq!(summary["files_deleted"], 1, "{what}: {summary}");
            if dry_run {
                assert_eq!(deleting(&summary), ["extra"], "{what}: {summary}");
                assert!(dst.join("extra").exists(), "{what}");
            } else {
                assert!(!dst.join("extra").exists(), "{what}");
            }
            assert_eq!(std::fs::read(dst.join("p")).unwrap(), b"old", "{what}");
        }
    }
}

/// A destination whose files have the source's times to the second only (as a copy over
/// SFTP leaves them, or a file system without finer ones) is unchanged to `--skip-unchanged`:
/// nothing is sent again, and the times are brought in line to the nanosecond.
#[test]
fn times_to_the_second_at_the_destination_are_unchanged_to_the_quick_check() {
    use std::os::unix::fs::MetadataExt;
    let sshd = Sshd::start().unwrap();
    let work = tempfile::tempdir().unwrap();
    let src = work.path().join("src");
    std::fs::create_dir(&src).unwrap();
    let sec = 1_700_000_000;
    for name in ["a", "b"] {
        write(&src.join(name), name.as_bytes(), 0o644);
        set_mtime(&src.join(name), sec, 123_456_789);
    }
    for (way, extra) in WAYS {
        if way.ends_with("sftp") {
            continue;
        }
        let dst = work.path().join("dst");
        let _ = std::fs::remove_dir_all(&dst);
        let copy = |more: &[&str]| {
            let args = [&["--json", "-r", "-p"][..], more].concat();
            ok_json(&mut copy_way(&sshd, (way, extra), &args, &src, &dst))
        };
        copy(&[]);
        for name in ["a", "b"] {
            set_mtime(&dst.join(name), sec, 0);
        }
        let dry = copy(&["-n", "--skip-unchanged"]);
        assert_eq!(dry["entries"], serde_json::json!([]), "{way}: {dry}");
        let again = copy(&["--skip-unchanged"]);
        assert_eq!(again["files"], 0, "{way}: {again}");
        assert_eq!(again["files_skipped"], 2, "{way}: {again}");
        for name in ["a", "b"] {
            let m = std::fs::metadata(dst.join(name)).unwrap();
            assert_eq!(
                (m.mtime(), m.mtime_nsec()),
                (sec, 123_456_789),
                "{way}: {name}"
            );
        }
    }
}

/// A nightly `--checksum --resume` copy that was cut while it replaced a big file: the next
/// night finds last night's file at the same size and a partial file of the new one beside
/// it. The hashes differ, so the file is sent, and it continues from the partial file as
/// it would with the quick check; a file whose hashes match is skipped and its partial file,
/// of no more use, goes (over SFTP, a push takes only one last written minutes ago).
/// Locally, pushed and pulled over TCP and SSH, and pushed over SFTP (a pull over SFTP keeps
/// a record of what arrived instead, which only a stopped copy writes).
#[test]
fn checksum_with_resume_continues_a_changed_file_from_its_partial_file() {
    const MIB: usize = 1 << 20;
    let sshd = Sshd::start().unwrap();
    let work = tempfile::tempdir().unwrap();
    let src = work.path().join("src");
    std::fs::create_dir(&src).unwrap();
    let new = pseudo_random(6 * MIB, 1);
    let same = pseudo_random(6 * MIB, 2);
    write(&src.join("big"), &new, 0o644);
    write(&src.join("same"), &same, 0o644);
    for way in WAYS.iter().filter(|(w, _)| *w != "pull sftp") {
        let dst = work.path().join(way.0.replace(' ', "-"));
        std::fs::create_dir(&dst).unwrap();
        // Last night's file, the first 3 MiB of tonight's that arrived before the cut, and
        // a stale partial file beside a file that is whole.
        write(&dst.join("big"), &pseudo_random(6 * MIB, 3), 0o644);
        write(&dst.join(".big.fastcp-partial"), &new[..3 * MIB], 0o600);
        write(&dst.join("same"), &same, 0o644);
        write(&dst.join(".same.fastcp-partial"), &same[..2 * MIB], 0o600);
        // From an earlier night: a push over SFTP, which cannot tell another live copy's
        // partial file by a lock, takes only those last written minutes ago.
        set_back(&dst.join(".same.fastcp-partial"), 300);
        let v = ok_json(&mut copy_way(
            &sshd,
            *way,
            &["--json", "-r", "--checksum", "--resume"],
            &src,
            &dst,
        ));
        let name = way.0;
        assert!(
            std::fs::read(dst.join("big")).unwrap() == new,
            "{name}: {v}"
        );
        assert_eq!(v["files_skipped"], 1, "{name}: {v}");
        assert_eq!(v["bytes_resumed"].as_u64(), Some(3 << 20), "{name}: {v}");
        assert_eq!(v["bytes_sent"].as_u64(), Some(3 << 20), "{name}: {v}");
        assert!(!dst.join(".big.fastcp-partial").exists(), "{name}");
        assert!(!dst.join(".same.fastcp-partial").exists(), "{name}");
    }
}

/// Sets `path`'s modification time `secs` seconds back.
fn set_back(path: &Path, secs: u64) {
    let then = std::time::SystemTime::now() - std::time::Duration::from_secs(secs);
    std::fs::File::options()
        .write(true)
        .open(path)
        .unwrap()
        .set_modified(then)
        .unwrap();
}

/// `--resume` without `--checksum`: a partial file an earlier copy kept beside a file the
/// quick check finds whole is of no more use, and goes; every way. Over SFTP a push takes
/// it only when it was last written minutes ago (no lock tells another live copy's), so a
/// fresh one stays there.
#[test]
fn resume_removes_the_partial_file_of_a_file_that_is_whole() {
    const MIB: usize = 1 << 20;
    let sshd = Sshd::start().unwrap();
    let work = tempfile::tempdir().unwrap();
    let src = work.path().join("src");
    std::fs::create_dir(&src).unwrap();
    let same = pseudo_random(6 * MIB, 2);
    write(&src.join("same"), &same, 0o644);
    for way in WAYS.iter() {
        let name = way.0;
        let dst = work.path().join(name.replace(' ', "-"));
        std::fs::create_dir(&dst).unwrap();
        ok_json(&mut copy_way(
            &sshd,
            *way,
            &["--json", "-r", "-p"],
            &src,
            &dst,
        ));
        let partial = dst.join(".same.fastcp-partial");
        write(&partial, &same[..2 * MIB], 0o600);
        set_back(&partial, 300);
        let v = ok_json(&mut copy_way(
            &sshd,
            *way,
            &["--json", "-r", "--resume"],
            &src,
            &dst,
        ));
        assert_eq!(v["files_skipped"], 1, "{name}: {v}");
        assert!(!partial.exists(), "{name}: {v}");
        if name == "push sftp" {
            write(&partial, &same[..2 * MIB], 0o600);
            ok_json(&mut copy_way(
                &sshd,
                *way,
                &["--json", "-r", "--resume"],
                &src,
                &dst,
            ));
            assert!(partial.exists(), "{name}: a fresh partial file stays");
        }
    }
}

/// A symlink or named pipe that a killed copy left under a temp name (killed between making
/// it and renaming it into place; a push over SFTP, with round trips between the two, leaves
/// them most) cannot be locked as a temp file is: the next copy into its folder removes it
/// once it was made 10 s or more before that copy began, as it removes a temp file, by the
/// sweep before it writes there and by `--delete`'s mirror when it writes nothing. Locally,
/// pushed and pulled over fastcp, and pulled over SFTP (fastcp's own receiver).
#[test]
fn a_temp_link_or_pipe_a_killed_copy_left_goes_with_a_later_copy() {
    let sshd = Sshd::start().unwrap();
    let work = tempfile::tempdir().unwrap();
    let src = work.path().join("src");
    std::fs::create_dir(&src).unwrap();
    write(&src.join("f"), b"f", 0o644);
    std::os::unix::fs::symlink("f", src.join("link")).unwrap();
    let ways: Vec<_> = WAYS.iter().filter(|(w, _)| *w != "push sftp").collect();
    let leave = |dst: &Path| {
        std::os::unix::fs::symlink("f", dst.join(".link.fastcp-0badc0de")).unwrap();
        rustix::fs::mknodat(
            rustix::fs::CWD,
            dst.join(".pipe.fastcp-0badcafe"),
            rustix::fs::FileType::Fifo,
            rustix::fs::Mode::from_raw_mode(0o600),
            0,
        )
        .unwrap();
    };
    for way in &ways {
        let name = way.0.replace(' ', "-");
        let swept = work.path().join(format!("swept-{name}"));
        let mirrored = work.path().join(format!("mirrored-{name}"));
        std::fs::create_dir(&swept).unwrap();
        std::fs::create_dir(&mirrored).unwrap();
        ok_json(&mut copy_way(
            &sshd,
            **way,
            &["--json", "-r", "-p"],
            &src,
            &mirrored,
        ));
        leave(&swept);
        leave(&mirrored);
    }
    // Their ctime says when they were made, and nothing sets it back: wait until it is old.
    std::thread::sleep(std::time::Duration::from_secs(11));
    for way in &ways {
        let name = way.0.replace(' ', "-");
        let swept = work.path().join(format!("swept-{name}"));
        let mirrored = work.path().join(format!("mirrored-{name}"));
        ok_json(&mut copy_way(
            &sshd,
            **way,
            &["--json", "-r", "-p"],
            &src,
            &swept,
        ));
        let v = ok_json(&mut copy_way(
            &sshd,
            **way,
            &["--json", "-r", "-p", "--skip-unchanged", "--delete"],
            &src,
            &mirrored,
        ));
        assert_eq!(v["files_skipped"], 1, "{name}: {v}");
        for dst in [&swept, &mirrored] {
            let mut left = walk_names(dst);
            left.sort();
            assert_eq!(left, ["f", "link"], "{name}: {}", dst.display());
        }
    }
}
