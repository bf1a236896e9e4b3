//! Cut and stalled connections: a copy ends, with the connection exit code (3) and a clear
//! error, and leaves no partial file under its final name and no temp file.
//!
//! A relay on 127.0.0.1 stands between fastcp and the harness's sshd: it forwards, then
//! closes both sides after a given number of bytes (a cut), or stops forwarding while
//! keeping both connections open (a stall, like a dropped link without a reset).

mod common;

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use common::*;
use fastcp_testsupport::Sshd;
use fastcp_testsupport::tree::{
    assert_no_temp, assert_same_tree, now_secs, pseudo_random, set_mtime, set_times, write,
};

/// What the relay does once `limit` bytes went from the client to the server (or, for
/// [`relay_both`], in either direction).
#[derive(Clone, Copy, Debug)]
enum Fault {
    /// Close both connections.
    Cut,
    /// Stop forwarding in both directions, keeping the connections open.
    Stall,
}

/// A relay from a free port on 127.0.0.1 to `to`, for its first connection only, counting
/// the bytes the client sends. Returns the port.
fn relay(to: u16, limit: u64, fault: Fault) -> u16 {
    relay_counting(to, limit, fault, false)
}

/// [`relay`], counting the bytes of both directions: a pull's data flows to the client.
fn relay_both(to: u16, limit: u64, fault: Fault) -> u16 {
    relay_counting(to, limit, fault, true)
}

fn relay_counting(to: u16, limit: u64, fault: Fault, both: bool) -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        let Ok((client, _)) = listener.accept() else {
            return;
        };
        let server = TcpStream::connect(("127.0.0.1", to)).unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let sent = Arc::new(AtomicU64::new(0));
        let pump = |mut from: TcpStream, mut to: TcpStream, count: bool| {
            let (stop, sent) = (stop.clone(), sent.clone());
            std::thread::spawn(move || {
                let mut buf = [0u8; 16 << 10];
                loop {
                    let n = match from.read(&mut buf) {
                        Ok(0) | Err(_) => break,
                        Ok(n) => n,
                    };
                    if count && sent.fetch_add(n as u64, Ordering::SeqCst) + n as u64 >= limit {
                        stop.store(true, Ordering::SeqCst);
                    }
                    if stop.load(Ordering::SeqCst) {
                        match fault {
                            Fault::Cut => {
                                let _ = from.shutdown(Shutdown::Both);
                                let _ = to.shutdown(Shutdown::Both);
                                return;
                            }
                            // Hold the sockets open, forwarding nothing, for longer than any
                            // test runs.
                            Fault::Stall => {
                                std::thread::sleep(Duration::from_secs(600));
                                return;
                            }
                        }
                    }
                    if to.write_all(&buf[..n]).is_err() {
                        break;
                    }
                }
                let _ = to.shutdown(Shutdown::Write);
            })
        };
        let a = pump(
            client.try_clone().unwrap(),
            server.try_clone().unwrap(),
            true,
        );
        let b = pump(server, client, both);
        let _ = a.join();
        let _ = b.join();
    });
    port
}

/// A relay from a free port on 127.0.0.1 to `to` for every connection, where the first
/// stops forwarding (both ways, sockets held open) once `limit` bytes crossed it either way,
/// and the others forward everything. Returns the port.
fn relay_first_stalls(to: u16, limit: u64) -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for (n, client) in listener.incoming().enumerate() {
            let Ok(client) = client else { return };
            let server = TcpStream::connect(("127.0.0.1", to)).unwrap();
            let crossed = Arc::new(AtomicU64::new(0));
            let limit = if n == 0 { limit } else { u64::MAX };
            for (mut from, mut to) in [
                (client.try_clone().unwrap(), server.try_clone().unwrap()),
                (server, client),
            ] {
                let crossed = crossed.clone();
                std::thread::spawn(move || {
                    let mut buf = [0u8; 16 << 10];
                    while let Ok(n @ 1..) = from.read(&mut buf) {
                        if crossed.fetch_add(n as u64, Ordering::SeqCst) + n as u64 >= limit {
                            std::thread::sleep(Duration::from_secs(600));
                            return;
                        }
                        if to.write_all(&buf[..n]).is_err() {
                            break;
                        }
                    }
                    let _ = to.shutdown(Shutdown::Write);
                });
            }
        }
    });
    port
}

/// A relay from a free port on 127.0.0.1 to `to` that forwards its first connection and
/// closes every later one at once, as a host that lets one login in and no more would.
/// Returns the port.
fn relay_first_only(to: u16) -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for (n, client) in listener.incoming().enumerate() {
            let Ok(client) = client else { return };
            if n > 0 {
                drop(client);
                continue;
            }
            let server = TcpStream::connect(("127.0.0.1", to)).unwrap();
            for (mut from, mut to) in [
                (client.try_clone().unwrap(), server.try_clone().unwrap()),
                (server, client.try_clone().unwrap()),
            ] {
                std::thread::spawn(move || {
                    let _ = std::io::copy(&mut from, &mut to);
                    let _ = to.shutdown(Shutdown::Write);
                });
            }
        }
    });
    port
}

/// An ssh_config for `sshd` reached through the relay on `port`.
fn through(sshd: &Sshd, dir: &Path, port: u16) -> std::path::PathBuf {
    let cfg = dir.join("relay_config");
    let known = dir.join("relay_known_hosts");
    std::fs::write(
        &known,
        format!("[127.0.0.1]:{port} {}\n", sshd.host_public_key()),
    )
    .unwrap();
    let block = sshd
        .host_block(sshd.alias())
        .replace(&format!("Port {}", sshd.port()), &format!("Port {port}"))
        .replace(
            &sshd.known_hosts().display().to_string(),
            &known.display().to_string(),
        );
    std::fs::write(&cfg, block).unwrap();
    cfg
}

/// Runs fastcp with `args`, killing it if it has not ended within `limit`; returns its exit
/// code (None if it had to be killed) and stderr.
fn run_bounded(args: &[&std::ffi::OsStr], limit: Duration) -> (Option<i32>, String) {
    let mut child = Command::new(BIN)
        .args(args)
        .env_remove("SSH_AUTH_SOCK")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let started = Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            let mut err = String::new();
            child
                .stderr
                .take()
                .unwrap()
                .read_to_string(&mut err)
                .unwrap();
            return (status.code(), err);
        }
        if started.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            let mut err = String::new();
            child
                .stderr
                .take()
                .unwrap()
                .read_to_string(&mut err)
                .unwrap();
            return (None, err);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn cut_push(fault: Fault, at: u64, extra: &[&str], says: &str) -> String {
    cut_copy(fault, at, "ssh", extra, says)
}

/// Pushes a 24 MiB file over `transport` with the SSH connection going through a relay
/// that misbehaves at `at` bytes; checks the exit code and what is left. Returns what
/// fastcp said.
fn cut_copy(fault: Fault, at: u64, transport: &str, extra: &[&str], says: &str) -> String {
    let sshd = Sshd::start().unwrap();
    let work = tempfile::tempdir().unwrap();
    let src = work.path().join("big");
    write(&src, &pseudo_random(24 << 20, 3), 0o644);
    let dst = work.path().join("dst");
    std::fs::create_dir(&dst).unwrap();
    let port = relay(sshd.port(), at, fault);
    let cfg = through(&sshd, work.path(), port);
    let target = remote(&sshd, &dst);
    let mut args: Vec<&std::ffi::OsStr> = vec![
        "-F".as_ref(),
        cfg.as_os_str(),
        "--remote-path".as_ref(),
        BIN.as_ref(),
        "--transport".as_ref(),
        transport.as_ref(),
        "-j".as_ref(),
        "1".as_ref(),
        "-vv".as_ref(),
    ];
    args.extend(extra.iter().map(std::ffi::OsStr::new));
    args.push(src.as_os_str());
    args.push(target.as_ref());
    let (code, err) = run_bounded(&args, Duration::from_secs(60));
    if transport == "tcp" && code == Some(0) {
        assert_eq!(
            std::fs::read(dst.join("big")).unwrap(),
            std::fs::read(&src).unwrap()
        );
        return err;
    }
    assert_eq!(code, Some(3), "{fault:?} at {at} over {transport}: {err}");
    assert!(err.contains(says), "{fault:?} at {at}: {err}");
    assert!(
        !dst.join("big").exists(),
        "a partial file under its final name"
    );
    // The server notices too, and removes its temp file: at once after a cut, within its
    // own idle limit (a minute) after a stall.
    wait_until(
        Duration::from_secs(90),
        "the server left its temp file",
        || std::fs::read_dir(&dst).unwrap().count() == 0,
    );
    assert_no_temp(&dst);
    err
}

#[test]
fn a_cut_ssh_connection_ends_the_copy_at_once() {
    for at in [300_000, 5_000_000] {
        cut_push(Fault::Cut, at, &[], "closed");
    }
}

/// The connections for more data streams log in while the server starts: when their logins
/// fail (a host that lets one connection in and no more), the copy runs over the connection
/// there is, with one warning, and leaves nothing behind.
#[test]
fn a_failed_login_for_another_stream_leaves_the_copy_one_stream() {
    let sshd = Sshd::start().unwrap();
    let work = tempfile::tempdir().unwrap();
    let src = work.path().join("tree");
    std::fs::create_dir(&src).unwrap();
    for i in 0..20 {
        write(
            &src.join(format!("f{i}")),
            &pseudo_random(100_000, i),
            0o644,
        );
    }
    let dst = work.path().join("dst");
    std::fs::create_dir(&dst).unwrap();
    let cfg = through(&sshd, work.path(), relay_first_only(sshd.port()));
    let target = remote(&sshd, &dst);
    let args = ssh_args(&cfg, &["-j", "3", "-r"], src.as_os_str(), target.as_ref());
    let (code, err) = run_bounded(&args, Duration::from_secs(60));
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(
        err.matches("copying over 1 stream(s)").count(),
        1,
        "one warning: {err}"
    );
    assert_same_tree(&src, &dst.join("tree"), false);
    assert_no_temp(&dst);
}

/// An agent that takes the connection and never answers (a forwarded agent socket whose far
/// end stopped) is passed over after a few seconds, and the login goes on with the identity
/// file.
#[test]
fn a_silent_agent_is_passed_over() {
    let sshd = Sshd::start().unwrap();
    let work = tempfile::tempdir().unwrap();
    let sock = work.path().join("agent.sock");
    let listener = std::os::unix::net::UnixListener::bind(&sock).unwrap();
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for conn in listener.incoming() {
            let Ok(conn) = conn else { return };
            held.push(conn);
        }
    });
    let cfg = work.path().join("agent_config");
    std::fs::write(
        &cfg,
        format!(
            "{}  IdentityAgent {}\n",
            sshd.host_block(sshd.alias()),
            sock.display()
        ),
    )
    .unwrap();
    let src = work.path().join("a");
    write(&src, b"past a silent agent", 0o644);
    let to = work.path().join("b");
    let target = remote(&sshd, &to);
    let args = ssh_args(&cfg, &[], src.as_os_str(), target.as_ref());
    let (code, err) = run_bounded(&args, Duration::from_secs(60));
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(std::fs::read(&to).unwrap(), b"past a silent agent");
}

#[test]
fn a_stalled_ssh_connection_ends_the_copy_within_the_timeout() {
    cut_push(
        Fault::Stall,
        2_000_000,
        &["--timeout", "3"],
        "no data moved for 3 s",
    );
}

/// Copies a 24 MiB file over SFTP, pulled or pushed (`pull`), with `extra` options, through
/// a relay that stalls after 4 MB; returns the exit code, what fastcp said, and the
/// destination folder (in `work`).
fn stalled_sftp_copy(work: &Path, pull: bool, extra: &[&str]) -> (Option<i32>, String, PathBuf) {
    let sshd = Sshd::start().unwrap();
    let src = work.join("big");
    write(&src, &pseudo_random(24 << 20, 6), 0o644);
    let dst = work.join("dst");
    std::fs::create_dir(&dst).unwrap();
    let port = if pull {
        relay_both(sshd.port(), 4_000_000, Fault::Stall)
    } else {
        relay(sshd.port(), 4_000_000, Fault::Stall)
    };
    let cfg = through(&sshd, work, port);
    let (from, to) = if pull {
        (remote(&sshd, &src), dst.display().to_string())
    } else {
        (src.display().to_string(), remote(&sshd, &dst))
    };
    let args = sftp_args(&cfg, extra, &from, &to);
    let (code, err) = run_bounded(&args, Duration::from_secs(60));
    (code, err, dst)
}

/// Over SFTP too a stalled connection ends the copy within `--timeout`, both ways: the
/// copy's idle limit notices, however long each SFTP request may wait behind a slow link.
/// A pull leaves nothing on this side; a push nothing under the final name.
#[test]
fn a_stalled_sftp_copy_ends_within_the_timeout() {
    for pull in [false, true] {
        let work = tempfile::tempdir().unwrap();
        let (code, err, dst) = stalled_sftp_copy(work.path(), pull, &["-j", "1", "--timeout", "3"]);
        assert_eq!(code, Some(3), "pull {pull}: {err}");
        assert!(err.contains("no data moved for 3 s"), "pull {pull}: {err}");
        assert!(
            !dst.join("big").exists(),
            "a partial file under its final name"
        );
        if pull {
            assert_no_temp(&dst);
        }
    }
}

/// Over SFTP too, a stall that SSH keepalives notice (the copy's own timeout off) is
/// reported as a stall naming them, push and pull.
#[test]
fn a_stalled_sftp_copy_noticed_by_keepalives_is_a_stall() {
    for pull in [false, true] {
        let work = tempfile::tempdir().unwrap();
        let extra = [
            "-j",
            "1",
            "--timeout",
            "0",
            "-o",
            "ServerAliveInterval=1",
            "-o",
            "ServerAliveCountMax=2",
        ];
        let (code, err, dst) = stalled_sftp_copy(work.path(), pull, &extra);
        assert_eq!(code, Some(3), "pull {pull}: {err}");
        assert!(
            err.contains(
                "stopped answering: no reply to SSH keepalives for 2 s (ServerAliveInterval x \
                 ServerAliveCountMax)"
            ),
            "pull {pull}: {err}"
        );
        assert!(
            !dst.join("big").exists(),
            "a partial file under its final name"
        );
    }
}

/// fastcp's arguments for a copy over SFTP from `from` to `to`, with ssh_config `cfg` and
/// `extra` options.
/// Arguments for a copy over SSH channels with `cfg`, this build as the remote program,
/// `extra`, then the operands.
fn ssh_args<'a>(
    cfg: &'a Path,
    extra: &'a [&'a str],
    from: &'a std::ffi::OsStr,
    to: &'a std::ffi::OsStr,
) -> Vec<&'a std::ffi::OsStr> {
    let mut args: Vec<&std::ffi::OsStr> = vec![
        "-F".as_ref(),
        cfg.as_os_str(),
        "--remote-path".as_ref(),
        BIN.as_ref(),
        "--transport".as_ref(),
        "ssh".as_ref(),
    ];
    args.extend(extra.iter().map(std::ffi::OsStr::new));
    args.extend([from, to]);
    args
}

fn sftp_args<'a>(
    cfg: &'a Path,
    extra: &'a [&'a str],
    from: &'a str,
    to: &'a str,
) -> Vec<&'a std::ffi::OsStr> {
    let mut args: Vec<&std::ffi::OsStr> = vec!["-F".as_ref(), cfg.as_os_str(), "--sftp".as_ref()];
    args.extend(extra.iter().map(std::ffi::OsStr::new));
    args.extend([std::ffi::OsStr::new(from), std::ffi::OsStr::new(to)]);
    args
}

/// One SFTP session whose connection stalls, beside another whose connection works: the
/// files are shared out over both sessions, so the working one brings its files in whole,
/// and the stalled one ends the copy with the idle limit's error, leaving no temp file.
#[test]
fn one_stalled_sftp_session_ends_the_copy() {
    let sshd = Sshd::start().unwrap();
    let work = tempfile::tempdir().unwrap();
    let src = work.path().join("src");
    std::fs::create_dir(&src).unwrap();
    for i in 0..8 {
        write(
            &src.join(format!("f{i}")),
            &pseudo_random(2 << 20, 10 + i),
            0o644,
        );
    }
    let dst = work.path().join("dst");
    std::fs::create_dir(&dst).unwrap();
    let port = relay_first_stalls(sshd.port(), 1_000_000);
    let cfg = through(&sshd, work.path(), port);
    let from = remote(&sshd, &src);
    let extra = ["-r", "-j", "2", "--timeout", "2"];
    let to = dst.display().to_string();
    let args = sftp_args(&cfg, &extra, &from, &to);
    let (code, err) = run_bounded(&args, Duration::from_secs(60));
    assert_eq!(code, Some(3), "{err}");
    assert!(err.contains("no data moved for 2 s"), "{err}");
    let arrived: Vec<_> = std::fs::read_dir(dst.join("src"))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert!(!arrived.is_empty(), "the working session brought nothing");
    for name in &arrived {
        let got = std::fs::read(dst.join("src").join(name)).unwrap();
        assert_eq!(got, std::fs::read(src.join(name)).unwrap(), "{name:?}");
    }
    assert_no_temp(&dst.join("src"));
}

/// A push over SFTP with `--resume` whose remote goes silent while the partial file there is
/// read back ends within `--timeout`, with the connection exit code; the partial file stays
/// as it was, and nothing takes the final name.
#[test]
fn a_remote_silent_while_a_partial_file_is_read_back_times_out() {
    let sshd = Sshd::start().unwrap();
    let work = tempfile::tempdir().unwrap();
    let content = pseudo_random(48 << 20, 41);
    let src = work.path().join("big");
    write(&src, &content, 0o644);
    let dst = work.path().join("dst");
    std::fs::create_dir(&dst).unwrap();
    let partial = dst.join(".big.fastcp-partial");
    std::fs::write(&partial, &content[..40 << 20]).unwrap();
    // The read-back is 40 MiB coming back; the relay stops forwarding after 4 MB of it.
    let port = relay_both(sshd.port(), 4_000_000, Fault::Stall);
    let cfg = through(&sshd, work.path(), port);
    let (from, to) = (src.display().to_string(), remote(&sshd, &dst));
    let extra = ["-j", "1", "--resume", "--timeout", "2"];
    let args = sftp_args(&cfg, &extra, &from, &to);
    let (code, err) = run_bounded(&args, Duration::from_secs(60));
    assert_eq!(code, Some(3), "{err}");
    assert!(err.contains("no data moved for 2 s"), "{err}");
    assert!(!dst.join("big").exists(), "a file under its final name");
    assert!(
        std::fs::read(&partial).unwrap() == content[..40 << 20],
        "the partial file changed"
    );
}

/// A push's dry run whose server goes silent while its listing is on the way (judged on the
/// server, with `--delete`) ends within `--timeout`, with the connection exit code.
#[test]
fn a_server_silent_while_judging_a_dry_run_times_out() {
    let sshd = Sshd::start().unwrap();
    let work = tempfile::tempdir().unwrap();
    let (src, dst) = many_empty_files(work.path(), 20_000);
    // The listing is over a megabyte; the relay stops forwarding after 300 kB of it.
    let port = relay(sshd.port(), 300_000, Fault::Stall);
    let cfg = through(&sshd, work.path(), port);
    let target = remote(&sshd, &dst);
    let extra = ["-n", "-r", "--delete", "--timeout", "3"];
    let args = ssh_args(&cfg, &extra, src.as_os_str(), target.as_ref());
    let (code, err) = run_bounded(&args, Duration::from_secs(60));
    assert_eq!(code, Some(3), "{err}");
    // Sending the listing or waiting for the answers, whichever the stall caught.
    assert!(
        err.contains("no data moved for 3 s")
            || err.contains("during a dry run, waiting on the peer (--timeout): nothing for 3 s"),
        "{err}"
    );
    assert_eq!(std::fs::read_dir(&dst).unwrap().count(), 0);
}

/// A server that accepts the connection and never speaks: without a ConnectTimeout in
/// ssh_config, the copy's own timeout bounds the SSH handshake, and the message names it.
#[test]
fn a_server_that_never_speaks_times_out() {
    cut_push(
        Fault::Stall,
        1,
        &["--timeout", "3"],
        "its SSH banner and host key did not come within 3 s (--timeout 3,",
    );
}

/// With the TCP transport the data goes around the SSH connection: losing that connection
/// (the control stream) mid-copy ends the copy with the connection exit code, or, when the
/// data had all arrived, in success, but never hangs.
#[test]
fn a_cut_control_connection_never_leaves_a_tcp_copy_hanging() {
    // Cut where the SSH connection is in its handshake, its request and after it: the copy
    // fails with the connection code or, when the data streams already carry it, succeeds.
    for at in [2_000, 4_000, 6_000] {
        cut_copy(Fault::Cut, at, "tcp", &[], "");
    }
}

/// A copy cut mid-way still says, with `--json`, what went wrong (kind and fault) and how far
/// it had got: a backup tool logs that much of a failed night.
#[test]
fn a_cut_copy_reports_how_far_it_got_in_json() {
    let sshd = Sshd::start().unwrap();
    let work = tempfile::tempdir().unwrap();
    let src = work.path().join("big");
    write(&src, &pseudo_random(24 << 20, 5), 0o644);
    let dst = work.path().join("dst");
    std::fs::create_dir(&dst).unwrap();
    let port = relay(sshd.port(), 5_000_000, Fault::Cut);
    let cfg = through(&sshd, work.path(), port);
    // `timeout` bounds the wait: a hang fails the test rather than the run.
    let out = Command::new("timeout")
        .arg("60")
        .arg(BIN)
        .arg("-F")
        .arg(&cfg)
        .args([
            "--remote-path",
            BIN,
            "--transport",
            "ssh",
            "-j",
            "1",
            "--json",
        ])
        .arg(&src)
        .arg(remote(&sshd, &dst))
        .env_remove("SSH_AUTH_SOCK")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{err}");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["exit_code"], 3);
    assert_eq!(v["error_kind"], "connect", "{v}");
    assert_eq!(v["fault"], "network", "{v}");
    // Some of the file had been handed to the stream before the cut, not all of it.
    let bytes = v["bytes"].as_u64().unwrap();
    assert!(bytes > 0 && bytes < 24 << 20, "{v}");
    assert_eq!(v["files"], 0, "{v}");
    assert_eq!(v["error_count"], 0, "{v}");
}

/// Whether `dir` holds a fastcp temp file (`.NAME.fastcp-*`).
fn has_temp(dir: &Path) -> bool {
    std::fs::read_dir(dir)
        .map(|d| {
            d.filter_map(Result::ok)
                .any(|e| e.file_name().to_string_lossy().contains(".fastcp-"))
        })
        .unwrap_or(false)
}

/// All a child's piped output says.
fn read_text(pipe: &mut Option<impl Read>) -> String {
    let mut text = String::new();
    pipe.take().unwrap().read_to_string(&mut text).unwrap();
    text
}

/// The size of the fastcp temp file in `dir`, or 0.
fn temp_len(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .filter_map(Result::ok)
        .filter(|e| e.file_name().to_string_lossy().contains(".fastcp-"))
        .filter_map(|e| e.metadata().ok())
        .map(|m| m.len())
        .max()
        .unwrap_or(0)
}

/// fastcp for `sshd` with `args`, copying `src` to `dst`: a pull (the source is on the
/// remote) or a push (the target is).
fn transfer(sshd: &Sshd, args: &[&str], src: &Path, dst: &Path, pull: bool) -> Command {
    let mut cmd = fastcp(sshd, bin());
    cmd.args(args);
    if pull {
        cmd.arg(remote(sshd, src)).arg(dst);
    } else {
        cmd.arg(src).arg(remote(sshd, dst));
    }
    cmd
}

/// Waits up to `limit` for `done`, failing with `what` when it never comes.
fn wait_until(limit: Duration, what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !done() {
        assert!(Instant::now() < deadline, "{what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Waits up to `limit` for `child` to end, failing with `what` when it does not.
fn wait_exit(child: &mut std::process::Child, limit: Duration, what: &str) -> ExitStatus {
    let mut status = None;
    wait_until(limit, what, || {
        status = child.try_wait().unwrap();
        status.is_some()
    });
    status.unwrap()
}

/// Sends `signal` (`-INT`, `-9`...) to process `pid`.
fn kill(signal: &str, pid: impl std::fmt::Display) {
    let st = Command::new(fastcp_testsupport::tools::require("kill"))
        .arg(signal)
        .arg(pid.to_string())
        .status()
        .unwrap();
    assert!(st.success());
}

/// Ctrl-C (SIGINT), SIGTERM and SIGHUP mid-copy, pull and push, over SSH and SFTP: the
/// client exits 130, and neither side leaves a temp file or a partial file (over SFTP the
/// client removes the remote's own temp files before it exits).
#[test]
fn a_signal_mid_copy_leaves_no_temp_file_on_either_side() {
    let sshd = Sshd::start().unwrap();
    for (signal, pull, path) in [
        ("-INT", true, "ssh"),
        ("-TERM", true, "ssh"),
        ("-HUP", false, "ssh"),
        ("-INT", false, "ssh"),
        ("-TERM", false, "sftp"),
        ("-INT", true, "sftp"),
        ("-INT", true, "tcp"),
    ] {
        let work = tempfile::tempdir().unwrap();
        let src = work.path().join("big");
        write(&src, &pseudo_random(16 << 20, 5), 0o644);
        let dst = work.path().join("dst");
        std::fs::create_dir(&dst).unwrap();
        let over: &[&str] = match path {
            "ssh" => &["--transport", "ssh"],
            "tcp" => &["--transport", "tcp"],
            _ => &["--sftp"],
        };
        let mut child = transfer(&sshd, over, &src, &dst, pull)
            .args(["--bwlimit", "2M"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        // Mid-copy: the receiver's temp file is there.
        wait_until(Duration::from_secs(30), "the copy never started", || {
            has_temp(&dst)
        });
        kill(signal, child.id());
        let status = wait_exit(
            &mut child,
            Duration::from_secs(30),
            &format!("{signal} did not stop the copy"),
        );
        let err = read_text(&mut child.stderr);
        assert_eq!(
            status.code(),
            Some(130),
            "{signal} pull={pull} {path}: {err}"
        );
        assert!(err.contains("interrupted"), "{err}");
        // What the server says of its client going away is not shown: the user stopped it.
        assert!(
            !err.contains("fastcp server:"),
            "{signal} pull={pull} {path}: {err}"
        );
        // The server side (a push) notices its client is gone and cleans up too.
        wait_until(
            Duration::from_secs(30),
            &format!("{signal} pull={pull} {path}: a temp file was left"),
            || !has_temp(&dst),
        );
        assert!(
            !dst.join("big").exists(),
            "a partial file under its final name"
        );
    }
}

/// Ctrl-C typed at a terminal (or SIGTERM from a service manager) reaches the whole process
/// group: an SFTP push through the system ssh loses its ssh with it, so the remote temp file
/// cannot be removed. It is never left silently: the push says it stays, and how it will go.
#[test]
fn a_terminal_ctrl_c_that_ends_the_system_ssh_says_what_stays_on_the_remote() {
    use std::os::unix::process::CommandExt;
    let sshd = Sshd::start().unwrap();
    let work = tempfile::tempdir().unwrap();
    let src = work.path().join("big");
    write(&src, &pseudo_random(16 << 20, 9), 0o644);
    let dst = work.path().join("dst");
    std::fs::create_dir(&dst).unwrap();
    let args = ["--sftp", "--ssh-program", "ssh", "--bwlimit", "2M"];
    let mut child = transfer(&sshd, &args, &src, &dst, false)
        // A group of its own, as a shell gives each job: the signal goes to the group.
        .process_group(0)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_until(Duration::from_secs(30), "the copy never started", || {
        has_temp(&dst)
    });
    // SIGTERM to the group, as a service manager sends it: a terminal's Ctrl-C (SIGINT) does
    // the same, but a program started in the background ignores SIGINT, as ssh would here.
    let group = rustix::process::Pid::from_raw(child.id() as i32).unwrap();
    rustix::process::kill_process_group(group, rustix::process::Signal::TERM).unwrap();
    let status = wait_exit(
        &mut child,
        Duration::from_secs(30),
        "SIGTERM did not stop the copy",
    );
    let err = read_text(&mut child.stderr);
    assert_eq!(status.code(), Some(130), "{err}");
    assert!(
        !dst.join("big").exists(),
        "a partial file under its final name"
    );
    assert_eq!(
        has_temp(&dst),
        err.contains("stay on the remote host"),
        "a temp file left without a word, or a word with none left: {err}"
    );
}

/// With the data over sealed TCP, the system ssh that carries only the control stream may
/// be stopped (SIGSTOP) mid-copy: the copy goes through, and its end does not wait long for
/// that ssh. It exits 0, says the ssh did not exit, and the ssh is killed, not left behind.
#[test]
fn a_stopped_system_ssh_does_not_hold_the_end_of_a_copy_over_tcp() {
    let sshd = Sshd::start().unwrap();
    let work = tempfile::tempdir().unwrap();
    let pids = work.path().join("pids");
    std::fs::create_dir(&pids).unwrap();
    // Notes the process id of the ssh that runs the server (the one with `server` in its
    // command line), then becomes it.
    let ssh = script(
        work.path(),
        "ssh-noting-its-pid",
        &format!(
            "case \"$*\" in *server*) echo $$ > '{}'/$$ ;; esac\nexec ssh \"$@\"",
            pids.display()
        ),
    );
    let src = work.path().join("big");
    write(&src, &pseudo_random(16 << 20, 11), 0o644);
    let dst = work.path().join("dst");
    std::fs::create_dir(&dst).unwrap();
    let args = [
        "--ssh-program",
        ssh.to_str().unwrap(),
        "--transport",
        "tcp",
        "--bwlimit",
        "4M",
    ];
    let mut child = transfer(&sshd, &args, &src, &dst, false)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_until(Duration::from_secs(30), "the copy never started", || {
        has_temp(&dst)
    });
    let stopped: Vec<String> = std::fs::read_dir(&pids)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(!stopped.is_empty(), "no ssh ran the server");
    for pid in &stopped {
        kill("-STOP", pid);
    }
    let status = wait_exit(&mut child, Duration::from_secs(60), "the copy never ended");
    let err = read_text(&mut child.stderr);
    assert_eq!(status.code(), Some(0), "{err}");
    assert!(err.contains("did not exit"), "{err}");
    assert_eq!(
        std::fs::read(dst.join("big")).unwrap(),
        std::fs::read(&src).unwrap()
    );
    // Killed: gone, or a zombie waiting to be reaped, never still stopped.
    for pid in &stopped {
        wait_until(Duration::from_secs(30), "the stopped ssh was left", || {
            std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .map_or(true, |stat| stat.contains(") Z"))
        });
    }
}

/// The remote server stopped by SIGTERM mid-copy, pull and push: what it says is shown as
/// the remote host's (`alias: fastcp server: ...`), never as if this side was interrupted.
#[test]
fn a_remote_servers_own_words_are_shown_as_its_hosts() {
    let work = tempfile::tempdir().unwrap();
    let pids = work.path().join("pids");
    std::fs::create_dir(&pids).unwrap();
    let sshd = Sshd::start_with_env(&[("FASTCP_TEST_PIDS", &pids)]).unwrap();
    let noting = script(
        work.path(),
        "fastcp-noting-its-pid",
        &format!("echo $$ > \"$FASTCP_TEST_PIDS/$$\"\nexec '{BIN}' \"$@\""),
    );
    let src = work.path().join("big");
    write(&src, &pseudo_random(16 << 20, 5), 0o644);
    for pull in [true, false] {
        let dst = work.path().join(format!("dst-{pull}"));
        std::fs::create_dir(&dst).unwrap();
        let mut cmd = fastcp(&sshd, &noting);
        cmd.args(["--bwlimit", "2M"]);
        if pull {
            cmd.arg(remote(&sshd, &src)).arg(&dst);
        } else {
            cmd.arg(&src).arg(remote(&sshd, &dst));
        }
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        wait_until(Duration::from_secs(30), "the copy never started", || {
            has_temp(&dst)
        });
        for pid in std::fs::read_dir(&pids).unwrap() {
            let pid = pid.unwrap().file_name();
            let _ = Command::new("kill").arg("-TERM").arg(&pid).status();
            std::fs::remove_file(pids.join(pid)).unwrap();
        }
        let status = wait_exit(&mut child, Duration::from_secs(30), "the copy went on");
        let err = read_text(&mut child.stderr);
        assert_eq!(status.code(), Some(3), "pull={pull}: {err}");
        let server = format!("{}: fastcp server: interrupted by SIGTERM", sshd.alias());
        assert!(err.contains(&server), "pull={pull}: {err}");
        assert!(
            err.lines().all(|l| !l.starts_with("fastcp: interrupted")),
            "pull={pull}: {err}"
        );
    }
}

/// Ctrl-C stops a copy through its cancellation token, so the copy ends as a cancelled library
/// copy does: with `--json`, stdout says it was cancelled and how far it got, for a push over
/// SSH and a pull over SFTP alike.
#[test]
fn ctrl_c_with_json_reports_a_cancelled_copy_and_how_far_it_got() {
    let sshd = Sshd::start().unwrap();
    for (args, pull) in [
        (&["--transport", "ssh"][..], false),
        (&["--sftp"][..], true),
    ] {
        let work = tempfile::tempdir().unwrap();
        let src = work.path().join("big");
        write(&src, &pseudo_random(16 << 20, 7), 0o644);
        let dst = work.path().join("dst");
        std::fs::create_dir(&dst).unwrap();
        let mut child = transfer(&sshd, args, &src, &dst, pull)
            .args(["--bwlimit", "2M", "--json"])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        // Some data has arrived: a few 1 MiB chunks were handed to the stream.
        wait_until(Duration::from_secs(30), "no data arrived", || {
            temp_len(&dst) >= 3 << 20
        });
        kill("-INT", child.id());
        let status = wait_exit(
            &mut child,
            Duration::from_secs(30),
            "SIGINT did not stop it",
        );
        let (out, err) = (read_text(&mut child.stdout), read_text(&mut child.stderr));
        assert_eq!(status.code(), Some(130), "{args:?}: {err}");
        assert!(err.contains("interrupted by SIGINT"), "{err}");
        let v: serde_json::Value =
            serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out:?}"));
        assert_eq!(v["exit_code"], 130, "{v}");
        assert_eq!(v["error_kind"], "cancelled", "{v}");
        assert_eq!(v["fault"], "user", "{v}");
        let bytes = v["bytes"].as_u64().unwrap();
        assert!(bytes > 0 && bytes < 16 << 20, "{args:?}: {v}");
        assert_eq!(v["files"], 0, "{v}");
        wait_until(Duration::from_secs(30), "a temp file was left", || {
            !has_temp(&dst)
        });
        assert!(
            !dst.join("big").exists(),
            "a partial file under its final name"
        );
    }
}

/// kill -9 leaves a temp file (nothing can clean up after it); the next copy into that folder
/// removes it, and never a temp file a live copy holds.
#[test]
fn a_temp_file_left_by_kill_9_goes_with_the_next_copy() {
    let sshd = Sshd::start().unwrap();
    for pull in [false, true] {
        let work = tempfile::tempdir().unwrap();
        let src = work.path().join("big");
        write(&src, &pseudo_random(16 << 20, 9), 0o644);
        let dst = work.path().join("dst");
        std::fs::create_dir(&dst).unwrap();
        let copy = || {
            let mut cmd = if pull {
                let mut c = fastcp(&sshd, bin());
                c.args(["--transport", "ssh"]).arg(remote(&sshd, &src));
                c
            } else {
                Command::new(BIN)
            };
            if !pull {
                cmd.arg(&src);
            }
            cmd.arg(&dst);
            cmd
        };
        let mut child = copy()
            .args(["--bwlimit", "2M"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        wait_until(Duration::from_secs(30), "the copy never started", || {
            has_temp(&dst)
        });
        child.kill().unwrap();
        child.wait().unwrap();
        assert!(has_temp(&dst), "kill -9 leaves its temp file (pull={pull})");
        // The crash was a while ago: a temp file written in the last seconds may be a live
        // copy's that has not locked it yet, and is left alone.
        let minute_ago = now_secs() - 60;
        for e in std::fs::read_dir(&dst).unwrap() {
            set_times(&e.unwrap().path(), minute_ago, minute_ago);
        }
        // A temp file that a live copy holds stays: here, one this test locks.
        let live = dst.join(".other.fastcp-0badcafe");
        std::fs::write(&live, b"live").unwrap();
        set_times(&live, minute_ago, minute_ago);
        let held = std::fs::File::open(&live).unwrap();
        rustix::fs::flock(&held, rustix::fs::FlockOperation::LockExclusive).unwrap();

        // One just written and not locked yet (another copy, a moment after creating it).
        let fresh = dst.join(".new.fastcp-00c0ffee");
        std::fs::write(&fresh, b"fresh").unwrap();

        let out = run(&mut copy());
        assert!(out.status.success(), "{}", stderr(&out));
        assert_eq!(
            std::fs::read(dst.join("big")).unwrap(),
            std::fs::read(&src).unwrap()
        );
        let left: Vec<_> = std::fs::read_dir(&dst)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(left.len(), 3, "pull={pull}: {left:?}");
        assert!(fresh.exists(), "a temp file written a moment ago stays");
        assert!(live.exists(), "a live copy's temp file stays");
    }
}

/// ServerAliveInterval from ssh_config or `-o` is honoured: with the copy's own timeout off,
/// SSH keepalives alone notice a stalled connection, and it is reported as a stall that
/// names them, not as a connection that closed.
#[test]
fn server_alive_interval_notices_a_stalled_connection() {
    cut_push(
        Fault::Stall,
        2_000_000,
        &[
            "--timeout",
            "0",
            "-o",
            "ServerAliveInterval=1",
            "-o",
            "ServerAliveCountMax=2",
        ],
        "the other side or the network stopped answering: no reply to SSH keepalives for 2 s \
         (ServerAliveInterval x ServerAliveCountMax)",
    );
}

/// Through the system ssh, its own ServerAlive keepalives notice the stall, and ssh gives up
/// ("Timeout, server … not responding.", exit 255): that is reported as a stall too, not as
/// a stream that closed.
#[test]
fn the_system_ssh_noticing_a_stall_by_its_keepalives_is_a_stall() {
    cut_push(
        Fault::Stall,
        2_000_000,
        &[
            "--ssh-program",
            "ssh",
            "--timeout",
            "0",
            "-o",
            "ServerAliveInterval=1",
            "-o",
            "ServerAliveCountMax=2",
        ],
        "the other side or the network stopped answering: no reply to the system ssh's \
         keepalives (ServerAliveInterval x ServerAliveCountMax)",
    );
}

/// Under `--timeout` the copy's idle limit and the SSH keepalives it sets notice a stall at
/// about the same time: whichever does, the error is the stall's, naming `--timeout`. A low
/// `--bwlimit` keeps the copy writing into its buffers for a while after the stall, so the
/// keepalives, which count from the last bytes received, are often first.
#[test]
fn a_stall_under_timeout_is_a_stall_whichever_limit_notices_it() {
    for bwlimit in ["1M", "8M"] {
        let err = cut_push(
            Fault::Stall,
            2_000_000,
            &["--timeout", "3", "--bwlimit", bwlimit],
            "the other side or the network stopped answering",
        );
        assert!(err.contains("--timeout"), "{err}");
    }
}

/// How many bytes of the file at `path` already hold `src`'s bytes at the same offsets,
/// counted in whole 4 KiB pages.
fn bytes_in_place(path: &Path, src: &[u8]) -> u64 {
    let have = std::fs::read(path).unwrap_or_default();
    have.chunks(4096)
        .zip(src.chunks(4096))
        .filter(|(a, b)| a == b)
        .map(|(a, _)| a.len() as u64)
        .sum()
}

/// The process that has `path` open, from /proc.
fn holder_of(path: &Path) -> Option<i32> {
    for proc_entry in std::fs::read_dir("/proc").ok()?.filter_map(Result::ok) {
        let Ok(pid) = proc_entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let Ok(fds) = std::fs::read_dir(proc_entry.path().join("fd")) else {
            continue;
        };
        if fds
            .filter_map(Result::ok)
            .any(|fd| std::fs::read_link(fd.path()).is_ok_and(|l| l == path))
        {
            return Some(pid);
        }
    }
    None
}

/// Waits until no process holds `path` open (the side that wrote it has ended).
fn wait_released(path: &Path) {
    let what = format!("{} is still held", path.display());
    wait_until(Duration::from_secs(60), &what, || holder_of(path).is_none());
}

/// Reruns a copy with `--resume` and checks that the file is whole and that little more
/// than what its partial file lacked travelled: at most a tenth more, or one block (1 MiB)
/// more when that is larger.
fn resume_and_check(sshd: &Sshd, src: &Path, dst: &Path, pull: bool, extra: &[&str]) {
    let content = std::fs::read(src).unwrap();
    let partial = dst.join(".big.fastcp-partial");
    let have = bytes_in_place(&partial, &content);
    let missing = content.len() as u64 - have;
    let args: Vec<&str> = ["--resume", "--json"]
        .iter()
        .chain(extra)
        .copied()
        .collect();
    let out = run(&mut transfer(sshd, &args, src, dst, pull));
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        std::fs::read(dst.join("big")).unwrap() == content,
        "not identical"
    );
    let summary = json(&out);
    let sent = summary["bytes_sent"].as_u64().unwrap();
    let resumed = summary["bytes_resumed"].as_u64().unwrap();
    eprintln!(
        "pull={pull}: the partial file held {have} of {} bytes; resent {sent}, kept {resumed}",
        content.len()
    );
    assert_eq!(sent + resumed, content.len() as u64);
    assert!(
        sent <= missing + (missing / 10).max(1 << 20),
        "sent {sent} for {missing} missing"
    );
    assert!(!partial.exists(), "the partial file is gone once complete");
    assert!(!has_temp(dst));
}

/// A cut of the SSH connection at random offsets, push and pull, then `--resume`: the file
/// is whole, and the rerun sends little more than what was missing.
#[test]
fn a_cut_copy_resumes_with_what_was_missing() {
    let sshd = Sshd::start().unwrap();
    let seed = now_secs() as u64;
    eprintln!("seed {seed}");
    let size = 48u64 << 20;
    for (i, pull) in [false, true, false, true].into_iter().enumerate() {
        let at = 3_000_000
            + pseudo_random(8, seed + i as u64)
                .iter()
                .fold(0u64, |a, &b| a << 8 | u64::from(b))
                % (size - 8_000_000);
        let work = tempfile::tempdir().unwrap();
        let src = work.path().join("big");
        write(
            &src,
            &pseudo_random(size as usize, seed + 100 + i as u64),
            0o644,
        );
        let dst = work.path().join("dst");
        std::fs::create_dir(&dst).unwrap();
        let port = relay_both(sshd.port(), at, Fault::Cut);
        let cfg = through(&sshd, work.path(), port);
        let target = remote(&sshd, &dst);
        let source = remote(&sshd, &src);
        let (from, to) = if pull {
            (source.as_ref(), dst.as_os_str())
        } else {
            (src.as_os_str(), target.as_ref())
        };
        let args = ssh_args(&cfg, &["-j", "1", "--resume"], from, to);
        let (code, err) = run_bounded(&args, Duration::from_secs(60));
        assert_eq!(code, Some(3), "cut at {at}, pull={pull}: {err}");
        assert!(
            !dst.join("big").exists(),
            "a partial file under its final name"
        );
        wait_released(&dst.join(".big.fastcp-partial"));
        eprintln!("cut at {at}");
        resume_and_check(&sshd, &src, &dst, pull, &["--transport", "ssh"]);
    }
}

/// A push and a pull over SFTP cut at random offsets, then `--resume`: on a push the partial
/// file left on the remote is read back, on a pull the local partial file's record of what
/// arrived stands in for reading the remote, and the rerun sends little more than what was
/// missing.
#[test]
fn a_cut_copy_over_sftp_resumes_with_what_was_missing() {
    let sshd = Sshd::start().unwrap();
    let seed = now_secs() as u64;
    eprintln!("seed {seed}");
    let size = 48u64 << 20;
    for i in 0..4u64 {
        let pull = i % 2 == 1;
        let at = 3_000_000
            + pseudo_random(8, seed + 200 + i)
                .iter()
                .fold(0u64, |a, &b| a << 8 | u64::from(b))
                % (size - 8_000_000);
        let work = tempfile::tempdir().unwrap();
        let src = work.path().join("big");
        write(&src, &pseudo_random(size as usize, seed + 300 + i), 0o644);
        // Not written just now: an SFTP pull keeps no record of a source so fresh.
        set_mtime(&src, now_secs() - 3600, 0);
        let dst = work.path().join("dst");
        std::fs::create_dir(&dst).unwrap();
        let port = relay_both(sshd.port(), at, Fault::Cut);
        let cfg = through(&sshd, work.path(), port);
        let (local_src, local_dst) = (src.display().to_string(), dst.display().to_string());
        let (from, to) = match pull {
            false => (local_src, remote(&sshd, &dst)),
            true => (remote(&sshd, &src), local_dst),
        };
        let args = sftp_args(&cfg, &["-j", "1", "--timeout", "0", "--resume"], &from, &to);
        let (code, err) = run_bounded(&args, Duration::from_secs(60));
        assert_eq!(code, Some(3), "cut at {at}, pull={pull}: {err}");
        assert!(
            !dst.join("big").exists(),
            "a partial file under its final name"
        );
        let partial = dst.join(".big.fastcp-partial");
        assert!(partial.exists(), "cut at {at}: no partial file kept");
        wait_released(&partial);
        eprintln!("cut at {at}");
        resume_and_check(&sshd, &src, &dst, pull, &["--sftp"]);
    }
}

/// A pull over SFTP cut mid-copy ends at once (no idle limit needed) with the connection
/// exit code, and leaves neither a partial file under its final name nor a temp file.
#[test]
fn a_cut_pull_over_sftp_ends_with_the_connection_code() {
    let sshd = Sshd::start().unwrap();
    let work = tempfile::tempdir().unwrap();
    let src = work.path().join("big");
    write(&src, &pseudo_random(32 << 20, 5), 0o644);
    let dst = work.path().join("dst");
    std::fs::create_dir(&dst).unwrap();
    let port = relay_both(sshd.port(), 9_000_000, Fault::Cut);
    let cfg = through(&sshd, work.path(), port);
    let source = remote(&sshd, &src);
    let dst_arg = dst.display().to_string();
    // No idle limit: the closed connection alone must end it.
    let args = sftp_args(&cfg, &["-j", "1", "--timeout", "0"], &source, &dst_arg);
    let (code, err) = run_bounded(&args, Duration::from_secs(60));
    assert_eq!(code, Some(3), "{err}");
    assert!(
        !dst.join("big").exists(),
        "a partial file under its final name"
    );
    assert!(!has_temp(&dst), "a temp file stayed");
}

/// Starts a copy of the file `src` into the folder `dst` with `args`, quiet, and waits until
/// its partial or temp file there holds `bytes` written (see [`wait_written`]).
fn copy_until_written(
    sshd: &Sshd,
    args: &[&str],
    src: &Path,
    dst: &Path,
    pull: bool,
    bytes: u64,
) -> std::process::Child {
    let child = transfer(sshd, args, src, dst, pull)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    wait_written(dst, bytes);
    child
}

/// Waits until a file in `dir` (a copy's temp or partial file) holds `bytes` written: not
/// just sized, as a partial file is from the start.
fn wait_written(dir: &Path, bytes: u64) {
    use std::os::unix::fs::MetadataExt;
    wait_until(Duration::from_secs(60), "the copy never got far", || {
        std::fs::read_dir(dir).unwrap().any(|e| {
            e.unwrap()
                .metadata()
                .is_ok_and(|m| m.blocks() * 512 >= bytes)
        })
    });
}

/// kill -9 of the receiving side mid-copy (the server on a push over TCP, the client on a
/// pull over TCP and over SFTP), then `--resume`. An SFTP pull's rerun also resends what
/// arrived after the partial file's record was last saved: up to 4 MiB here.
#[test]
fn kill_9_of_the_receiver_then_resume() {
    let sshd = Sshd::start().unwrap();
    let (tcp, sftp): (&[&str], &[&str]) = (&["--transport", "tcp"], &["--sftp"]);
    for (pull, transport) in [(false, tcp), (true, tcp), (true, sftp)] {
        let work = tempfile::tempdir().unwrap();
        let src = work.path().join("big");
        write(&src, &pseudo_random(64 << 20, 21), 0o644);
        // Not written just now: an SFTP pull keeps no record of a source so fresh.
        set_mtime(&src, now_secs() - 3600, 0);
        let dst = work.path().join("dst");
        std::fs::create_dir(&dst).unwrap();
        let partial = dst.join(".big.fastcp-partial");
        let mut args = transport.to_vec();
        args.extend(["--resume", "--bwlimit", "8M"]);
        let mut child = copy_until_written(&sshd, &args, &src, &dst, pull, 16 << 20);
        if pull {
            child.kill().unwrap();
        } else {
            let pid = holder_of(&partial).expect("the server holds its partial file");
            kill("-9", pid);
        }
        let status = wait_exit(
            &mut child,
            Duration::from_secs(30),
            "the client did not end",
        );
        if !pull {
            assert_eq!(status.code(), Some(3), "the server was killed");
        }
        assert!(
            !dst.join("big").exists(),
            "a partial file under its final name"
        );
        wait_released(&partial);
        resume_and_check(&sshd, &src, &dst, pull, transport);
    }
}

/// Two files whose names share their first 200 bytes share a partial file's name: an SFTP
/// pull's record tells them apart, and keeps nothing of the one for the other. Two sources
/// of one name, which would land on one target, are refused with `--resume` over SFTP.
#[test]
fn a_pull_over_sftp_keeps_nothing_of_another_file_that_shares_its_partial_file() {
    let sshd = Sshd::start().unwrap();
    let work = tempfile::tempdir().unwrap();
    let long = "p".repeat(210);
    let (one, two) = (format!("{long}1"), format!("{long}2"));
    let src = work.path().join("src");
    std::fs::create_dir(&src).unwrap();
    // One size and one time: only the names tell them apart.
    let old = now_secs() - 3600;
    for (name, seed) in [(&one, 51), (&two, 52)] {
        write(&src.join(name), &pseudo_random(32 << 20, seed), 0o644);
        set_mtime(&src.join(name), old, 0);
    }
    let dst = work.path().join("dst");
    std::fs::create_dir(&dst).unwrap();
    let dst_arg = format!("{}/", dst.display());
    let mut child = fastcp(&sshd, bin())
        .args(["--sftp", "--resume", "--bwlimit", "8M"])
        .arg(remote(&sshd, &src.join(&one)))
        .arg(&dst_arg)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let partial = dst.join(format!(".{}.fastcp-partial", &long[..200]));
    wait_written(&dst, 8 << 20);
    kill("-TERM", child.id());
    wait_exit(&mut child, Duration::from_secs(30), "the pull did not end");
    wait_released(&partial);
    let out = run(fastcp(&sshd, bin())
        .args(["--sftp", "--resume", "--json"])
        .arg(remote(&sshd, &src.join(&two)))
        .arg(&dst_arg));
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(json(&out)["bytes_resumed"].as_u64(), Some(0));
    assert!(
        std::fs::read(dst.join(&two)).unwrap() == std::fs::read(src.join(&two)).unwrap(),
        "not identical"
    );

    let other = work.path().join("other");
    std::fs::create_dir(&other).unwrap();
    write(&other.join(&one), b"other", 0o644);
    let out = run(fastcp(&sshd, bin())
        .args(["--sftp", "--resume"])
        .arg(remote(&sshd, &src.join(&one)))
        .arg(remote(&sshd, &other.join(&one)))
        .arg(&dst_arg));
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("two sources of this name"),
        "{}",
        stderr(&out)
    );
}

/// A big file whose time changes while an SFTP pull reads its ranges on several sessions is
/// reported once, with the source-changed exit code, and not kept.
#[test]
fn a_big_file_changed_while_pulled_over_sftp_is_reported_once() {
    let sshd = Sshd::start().unwrap();
    let work = tempfile::tempdir().unwrap();
    let src = work.path().join("big");
    write(&src, &pseudo_random(128 << 20, 61), 0o644);
    set_mtime(&src, now_secs() - 3600, 0);
    let dst = work.path().join("dst");
    std::fs::create_dir(&dst).unwrap();
    // Four ranges of 32 MiB, read at once; the time changes while they are on their way.
    let child = transfer(
        &sshd,
        &["--sftp", "--json", "--bwlimit", "24M"],
        &src,
        &dst,
        true,
    )
    .stdin(Stdio::null())
    .stdout(Stdio::piped())
    .stderr(Stdio::piped())
    .spawn()
    .unwrap();
    wait_written(&dst, 8 << 20);
    set_mtime(&src, now_secs() - 1800, 0);
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(5), "{}", stderr(&out));
    let summary = json(&out);
    assert_eq!(summary["error_count"].as_u64(), Some(1), "{summary}");
    assert!(!dst.join("big").exists());
}

/// An SFTP pull trusts its partial file's record only for the version of the source it was
/// made from: after the source changed (same size, another time), nothing is kept.
#[test]
fn a_pull_over_sftp_keeps_nothing_of_another_version_of_the_source() {
    let sshd = Sshd::start().unwrap();
    let work = tempfile::tempdir().unwrap();
    let src = work.path().join("big");
    write(&src, &pseudo_random(32 << 20, 31), 0o644);
    set_mtime(&src, now_secs() - 3600, 0);
    let dst = work.path().join("dst");
    std::fs::create_dir(&dst).unwrap();
    let partial = dst.join(".big.fastcp-partial");
    let args = ["--sftp", "--resume", "--bwlimit", "8M"];
    let mut child = copy_until_written(&sshd, &args, &src, &dst, true, 8 << 20);
    kill("-TERM", child.id());
    wait_exit(&mut child, Duration::from_secs(30), "the pull did not end");
    wait_released(&partial);
    let content = pseudo_random(32 << 20, 32);
    write(&src, &content, 0o644);
    // Another time.
    set_mtime(&src, now_secs() - 1800, 0);
    let out = run(&mut transfer(
        &sshd,
        &["--sftp", "--resume", "--json"],
        &src,
        &dst,
        true,
    ));
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(json(&out)["bytes_resumed"].as_u64(), Some(0));
    assert!(
        std::fs::read(dst.join("big")).unwrap() == content,
        "not identical"
    );
    assert!(!partial.exists());
}

/// A remote program that starts and never speaks (a wedged install, a wrapper waiting on
/// something) ends the copy within `--timeout`, with the connection exit code.
#[test]
fn a_remote_program_that_never_speaks_times_out() {
    let sshd = Sshd::start().unwrap();
    let work = tempfile::tempdir().unwrap();
    let silent = script(work.path(), "silent", "exec sleep 600");
    let src = work.path().join("f");
    write(&src, b"x", 0o644);
    let started = Instant::now();
    let out = run(fastcp(&sshd, &silent)
        .args(["--timeout", "2", "--no-deploy"])
        .arg(&src)
        .arg(remote(&sshd, &work.path().join("g"))));
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    assert!(stderr(&out).contains("says nothing"), "{}", stderr(&out));
    assert!(started.elapsed() < Duration::from_secs(30));
}

/// `--checksum -p`: a file of the source's size whose content differs keeps its own time
/// until its new content takes its name. A copy stopped before that (here, the client
/// killed mid-file) leaves it as it was, so that a later quick check by times still sends
/// it: on fastcp's own receiver (a push, a pull) and over SFTP (a push, a pull).
#[test]
fn checksum_leaves_a_differing_files_time_alone_until_it_is_replaced() {
    let sshd = Sshd::start().unwrap();
    let (ssh, sftp): (&[&str], &[&str]) = (&["--transport", "ssh"], &["--sftp"]);
    for (pull, transport) in [(false, ssh), (true, ssh), (false, sftp), (true, sftp)] {
        let work = tempfile::tempdir().unwrap();
        let src = work.path().join("big");
        write(&src, &pseudo_random(32 << 20, 5), 0o644);
        set_mtime(&src, now_secs() - 7_200, 0);
        let dst = work.path().join("dst");
        std::fs::create_dir(&dst).unwrap();
        let old = dst.join("big");
        let old_content = pseudo_random(32 << 20, 6);
        write(&old, &old_content, 0o644);
        let old_mtime = now_secs() - 200_000;
        set_mtime(&old, old_mtime, 0);
        let mut args = transport.to_vec();
        args.extend(["--checksum", "-p", "--bwlimit", "4M"]);
        let mut child = transfer(&sshd, &args, &src, &dst, pull)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        // The new content is on its way, into a temp file beside the old.
        wait_until(Duration::from_secs(60), "the copy never started", || {
            use std::os::unix::fs::MetadataExt;
            std::fs::read_dir(&dst).unwrap().any(|e| {
                let e = e.unwrap();
                e.file_name() != "big" && e.metadata().is_ok_and(|m| m.blocks() * 512 >= 4 << 20)
            })
        });
        child.kill().unwrap();
        wait_exit(
            &mut child,
            Duration::from_secs(30),
            "the client did not end",
        );
        // What the receiving side had queued is done by now.
        std::thread::sleep(Duration::from_millis(500));
        let case = format!("pull {pull}, {transport:?}");
        assert_eq!(std::fs::read(&old).unwrap(), old_content, "{case}");
        let mtime = std::fs::metadata(&old).unwrap().modified().unwrap();
        let secs = mtime
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs() as i64;
        assert_eq!(
            secs, old_mtime,
            "{case}: the old content got the source's time"
        );
    }
}
