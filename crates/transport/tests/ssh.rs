//! The SSH transport against a real OpenSSH sshd on 127.0.0.1.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use fastcp_testsupport::Sshd;
use fastcp_transport::{
    Error, ExitStatus, Rendezvous, SshOptions, SshProgram, SshSession, Transport,
};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// Options for the fixture's host: its ssh_config, and no agent unless a test asks.
fn opts(sshd: &Sshd) -> SshOptions {
    SshOptions::default()
        .config_file(sshd.ssh_config())
        .options(["IdentityAgent=none"])
}

/// A config for the fixture's host without an IdentityFile line, plus `extra` lines.
fn config_with(sshd: &Sshd, dir: &Path, extra: &str) -> PathBuf {
    // `extra` first: as with ssh, the first value of a key wins.
    let text = format!(
        "Host t\n{extra}  HostName 127.0.0.1\n  Port {}\n  User {}\n  UserKnownHostsFile {}\n  \
         GlobalKnownHostsFile /dev/null\n  StrictHostKeyChecking yes\n  BatchMode yes\n",
        sshd.port(),
        sshd.user(),
        sshd.known_hosts().display()
    );
    let p = dir.join("config");
    fs::write(&p, text).unwrap();
    p
}

async fn connect(sshd: &Sshd) -> SshSession {
    match SshSession::connect(sshd.alias(), &opts(sshd)).await {
        // A key logs in again without a prompt: more connections may log in at any time.
        Ok(s) if !s.login_was_typed() => s,
        Ok(_) => panic!("a key login taken for a typed one"),
        Err(e) => panic!("connect failed: {e}\nsshd log:\n{}", sshd.log()),
    }
}

/// Writes `data` and closes, while reading everything back.
async fn round_trip<S: AsyncRead + AsyncWrite + Send + Unpin + 'static>(
    stream: S,
    data: Vec<u8>,
) -> Vec<u8> {
    let (mut r, mut w) = tokio::io::split(stream);
    let writer = tokio::spawn(async move {
        for chunk in data.chunks(256 << 10) {
            w.write_all(chunk).await.unwrap();
        }
        w.shutdown().await.unwrap();
        w
    });
    let mut out = Vec::new();
    r.read_to_end(&mut out).await.unwrap();
    let _keep_open_until_read = writer.await.unwrap();
    out
}

fn payload(len: usize, seed: u8) -> Vec<u8> {
    let mut out = Vec::with_capacity(len + 32);
    let mut block = *blake3::hash(&[seed]).as_bytes();
    while out.len() < len {
        block = *blake3::hash(&block).as_bytes();
        out.extend_from_slice(&block);
    }
    out.truncate(len);
    out
}

async fn stderr_text(mut p: fastcp_transport::Stderr) -> String {
    let mut all = Vec::new();
    while let Some(c) = p.recv().await {
        all.extend_from_slice(&c);
    }
    String::from_utf8_lossy(&all).into_owned()
}

#[tokio::test]
async fn exec_cat_round_trip_with_eof_and_exit_status() {
    let sshd = Sshd::start().unwrap();
    let s = connect(&sshd).await;
    assert_eq!(
        s.peer_addr(),
        Some(std::net::SocketAddr::from(([127, 0, 0, 1], sshd.port())))
    );
    let p = s.exec("cat").await.unwrap();
    let out = round_trip(p.stream, b"hello through sshd\n".to_vec()).await;
    assert_eq!(out, b"hello through sshd\n");
    assert_eq!(p.exit.wait().await.unwrap(), ExitStatus::Code(0));
}

#[tokio::test]
async fn exec_forwards_stdout_stderr_and_exit_code() {
    let sshd = Sshd::start().unwrap();
    let s = connect(&sshd).await;
    let mut p = s.exec("echo out; echo err >&2; exit 3").await.unwrap();
    let mut out = String::new();
    p.stream.read_to_string(&mut out).await.unwrap();
    assert_eq!(out, "out\n");
    assert_eq!(stderr_text(p.stderr).await, "err\n");
    let status = p.exit.wait().await.unwrap();
    assert_eq!(status, ExitStatus::Code(3));
    assert!(!status.success());
}

#[tokio::test]
async fn exit_status_arrives_even_if_stdout_is_dropped() {
    let sshd = Sshd::start().unwrap();
    let s = connect(&sshd).await;
    let p = s.exec("exit 7").await.unwrap();
    drop(p.stream);
    assert_eq!(p.exit.wait().await.unwrap(), ExitStatus::Code(7));
}

#[tokio::test]
async fn exec_signal_is_reported() {
    let sshd = Sshd::start().unwrap();
    let s = connect(&sshd).await;
    let p = s.exec("kill -TERM $$").await.unwrap();
    match p.exit.wait().await.unwrap() {
        ExitStatus::Signal { name, .. } => assert_eq!(name, "TERM"),
        other => panic!("expected a signal, got {other}"),
    }
}

#[tokio::test]
async fn multi_mib_payload_through_cat_keeps_its_hash() {
    let sshd = Sshd::start().unwrap();
    let s = connect(&sshd).await;
    let data = payload(24 << 20, 1);
    let want = blake3::hash(&data);
    let p = s.exec("cat").await.unwrap();
    let out = round_trip(p.stream, data).await;
    assert_eq!(out.len(), 24 << 20);
    assert_eq!(blake3::hash(&out), want);
    assert!(p.exit.wait().await.unwrap().success());
}

#[tokio::test]
async fn several_channels_in_parallel_on_one_connection() {
    let sshd = Sshd::start().unwrap();
    let s = std::sync::Arc::new(connect(&sshd).await);
    let mut tasks = Vec::new();
    for i in 0..6u8 {
        let s = s.clone();
        tasks.push(tokio::spawn(async move {
            let data = payload(3 << 20, i);
            let p = s.exec("cat").await.unwrap();
            let out = round_trip(p.stream, data.clone()).await;
            assert!(out == data, "channel {i} corrupted");
            assert!(p.exit.wait().await.unwrap().success());
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
}

#[tokio::test]
async fn direct_streamlocal_reaches_a_unix_socket() {
    let sshd = Sshd::start().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("rendezvous.sock");
    let listener = tokio::net::UnixListener::bind(&sock).unwrap();
    let server = tokio::spawn(async move {
        // Two connections: each echoes what it gets, prefixed.
        for _ in 0..2 {
            let (mut c, _) = listener.accept().await.unwrap();
            tokio::spawn(async move {
                let mut buf = Vec::new();
                c.read_to_end(&mut buf).await.unwrap();
                c.write_all(b"got:").await.unwrap();
                c.write_all(&buf).await.unwrap();
                c.shutdown().await.unwrap();
            });
        }
    });
    let s = connect(&sshd).await;
    let a = s.open_streamlocal(sock.to_str().unwrap()).await.unwrap();
    let b = Transport::open_stream(&s, &Rendezvous::UnixSocket(sock.to_str().unwrap().into()))
        .await
        .unwrap();
    let big = payload(5 << 20, 9);
    let (ra, rb) = tokio::join!(round_trip(a, b"one".to_vec()), round_trip(b, big.clone()));
    assert_eq!(ra, b"got:one");
    assert_eq!(&rb[..4], b"got:");
    assert!(rb[4..] == big[..]);
    server.await.unwrap();

    let e = s
        .open_streamlocal("/nonexistent/dir/sock")
        .await
        .unwrap_err();
    assert!(matches!(e, Error::Channel { .. }), "{e}");
}

#[tokio::test]
async fn direct_tcpip_reaches_a_loopback_port() {
    let sshd = Sshd::start().unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        let (mut c, _) = listener.accept().await.unwrap();
        let mut buf = Vec::new();
        c.read_to_end(&mut buf).await.unwrap();
        buf.reverse();
        c.write_all(&buf).await.unwrap();
    });
    let s = connect(&sshd).await;
    let st = Transport::open_stream(&s, &Rendezvous::TcpPort(port))
        .await
        .unwrap();
    assert_eq!(round_trip(st, b"abc".to_vec()).await, b"cba");
}

#[tokio::test]
async fn agent_authentication() {
    let sshd = Sshd::start().unwrap();
    let agent = sshd.start_agent().unwrap();
    let dir = tempfile::tempdir().unwrap();
    // The only identity file named does not exist: only the agent can log us in.
    let cfg = config_with(
        &sshd,
        dir.path(),
        &format!(
            "  IdentityFile {}/missing_key\n  IdentityAgent {}\n",
            dir.path().display(),
            agent.socket().display()
        ),
    );
    let o = SshOptions::default().config_file(cfg.clone());
    let s = SshSession::connect("t", &o).await.unwrap();
    let mut p = s.exec("echo agent-ok").await.unwrap();
    let mut out = String::new();
    p.stream.read_to_string(&mut out).await.unwrap();
    assert_eq!(out, "agent-ok\n");

    // Same config without the agent: refused, and the error says what was tried.
    let o = SshOptions::default()
        .config_file(cfg)
        .options(["IdentityAgent=none"]);
    let e = SshSession::connect("t", &o).await.unwrap_err();
    assert!(matches!(e, Error::Auth { .. }), "{e}");
    assert!(e.to_string().contains("missing_key (no such file)"), "{e}");
}

#[tokio::test]
async fn wrong_user_key_is_refused() {
    let sshd = Sshd::start().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let key = dir.path().join("other_key");
    let st = Command::new(fastcp_testsupport::tools::require("ssh-keygen"))
        .args(["-q", "-t", "ed25519", "-N", "", "-f"])
        .arg(&key)
        .status()
        .unwrap();
    assert!(st.success());
    let cfg = config_with(
        &sshd,
        dir.path(),
        &format!("  IdentityFile {}\n", key.display()),
    );
    let o = SshOptions::default()
        .config_file(cfg)
        .options(["IdentityAgent=none"]);
    let e = SshSession::connect("t", &o).await.unwrap_err();
    let msg = e.to_string();
    assert!(matches!(e, Error::Auth { .. }), "{msg}");
    assert!(msg.contains("Permission denied (publickey)"), "{msg}");
    assert!(msg.contains(&key.display().to_string()), "{msg}");
}

#[tokio::test]
async fn encrypted_key_without_a_terminal_fails_cleanly() {
    let sshd = Sshd::start().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let key = dir.path().join("locked");
    let st = Command::new(fastcp_testsupport::tools::require("ssh-keygen"))
        .args(["-q", "-t", "ed25519", "-N", "secret phrase", "-f"])
        .arg(&key)
        .status()
        .unwrap();
    assert!(st.success());
    // BatchMode yes (in the config): never prompt, as without a terminal.
    let cfg = config_with(
        &sshd,
        dir.path(),
        &format!("  IdentityFile {}\n", key.display()),
    );
    let o = SshOptions::default()
        .config_file(cfg)
        .options(["IdentityAgent=none"]);
    let e = SshSession::connect("t", &o).await.unwrap_err();
    assert!(e.to_string().contains("encrypted"), "{e}");
}

#[tokio::test]
async fn unknown_host_key_is_refused() {
    let sshd = Sshd::start().unwrap();
    fs::write(sshd.known_hosts(), "").unwrap();
    let e = SshSession::connect(sshd.alias(), &opts(&sshd))
        .await
        .unwrap_err();
    let msg = e.to_string();
    assert!(matches!(e, Error::HostKeyUnknown { .. }), "{msg}");
    assert!(
        msg.contains(&format!(
            "No ED25519 host key is known for [127.0.0.1]:{} and you have requested strict checking.\nHost key verification failed.",
            sshd.port()
        )),
        "{msg}"
    );
    // Nothing was recorded.
    assert_eq!(fs::read_to_string(sshd.known_hosts()).unwrap(), "");
}

#[tokio::test]
async fn changed_host_key_is_refused() {
    let mut sshd = Sshd::start().unwrap();
    let kh = sshd.known_hosts();
    sshd.change_host_key().unwrap();
    let e = SshSession::connect(sshd.alias(), &opts(&sshd))
        .await
        .unwrap_err();
    let msg = e.to_string();
    assert!(matches!(e, Error::HostKeyChanged { line: 1, .. }), "{msg}");
    assert!(
        msg.contains("REMOTE HOST IDENTIFICATION HAS CHANGED"),
        "{msg}"
    );
    assert!(
        msg.contains(&format!("Offending ED25519 key in {}:1", kh.display())),
        "{msg}"
    );
    // accept-new does not accept a changed key either.
    let mut o = opts(&sshd);
    o.options.push("StrictHostKeyChecking=accept-new".into());
    let e = SshSession::connect(sshd.alias(), &o).await.unwrap_err();
    assert!(matches!(e, Error::HostKeyChanged { .. }), "{e}");
}

#[tokio::test]
async fn accept_new_records_the_key() {
    let sshd = Sshd::start().unwrap();
    for hashed in [false, true] {
        fs::write(sshd.known_hosts(), "").unwrap();
        let mut o = opts(&sshd);
        o.options.push("StrictHostKeyChecking=accept-new".into());
        o.options.push(format!(
            "HashKnownHosts={}",
            if hashed { "yes" } else { "no" }
        ));
        let s = SshSession::connect(sshd.alias(), &o).await.unwrap();
        assert_eq!(s.warnings().len(), 1, "{:?}", s.warnings());
        assert!(
            s.warnings()[0].starts_with("Permanently added"),
            "{:?}",
            s.warnings()
        );
        let recorded = fs::read_to_string(sshd.known_hosts()).unwrap();
        if hashed {
            assert!(recorded.starts_with("|1|"), "{recorded}");
            assert!(!recorded.contains("127.0.0.1"), "{recorded}");
        } else {
            assert_eq!(recorded, format!("{}\n", sshd.known_hosts_line()));
        }
        // Now known: strict checking passes and OpenSSH's ssh agrees with what we wrote.
        let s = SshSession::connect(sshd.alias(), &opts(&sshd))
            .await
            .unwrap();
        assert!(s.warnings().is_empty());
        let out = Command::new(fastcp_testsupport::tools::require("ssh"))
            .arg("-F")
            .arg(sshd.ssh_config())
            .arg(sshd.alias())
            .arg("true")
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

#[tokio::test]
async fn hashed_known_hosts_entry_from_ssh_keygen_is_accepted() {
    let sshd = Sshd::start().unwrap();
    let st = Command::new(fastcp_testsupport::tools::require("ssh-keygen"))
        .arg("-H")
        .arg("-f")
        .arg(sshd.known_hosts())
        .output()
        .unwrap();
    assert!(st.status.success());
    let text = fs::read_to_string(sshd.known_hosts()).unwrap();
    assert!(
        text.starts_with("|1|") && !text.contains("127.0.0.1"),
        "{text}"
    );
    let s = connect(&sshd).await;
    assert!(
        s.exec("true")
            .await
            .unwrap()
            .exit
            .wait()
            .await
            .unwrap()
            .success()
    );
}

#[tokio::test]
async fn proxy_jump_through_a_second_sshd() {
    let sshd = Sshd::start().unwrap();
    let jump = sshd.start_jump().unwrap();
    let mut o = opts(&sshd);
    o.jump = Some(jump.alias().to_owned());
    let s = SshSession::connect(sshd.alias(), &o).await.unwrap();
    assert_eq!(s.peer_addr(), None);
    let mut p = s.exec("echo via-jump").await.unwrap();
    let mut out = String::new();
    p.stream.read_to_string(&mut out).await.unwrap();
    assert_eq!(out, "via-jump\n");
    let log = jump.log();
    assert!(
        log.contains(&format!("target 127.0.0.1 port {}", sshd.port())),
        "the jump host did not forward: {log}"
    );

    // The same through ssh_config's ProxyJump, and a second connection through the jump.
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("config");
    fs::write(
        &cfg,
        format!(
            "Host via\n  ProxyJump {}\n{}\n{}",
            jump.alias(),
            sshd.host_block("via").replacen("Host via\n", "", 1),
            fs::read_to_string(sshd.ssh_config()).unwrap()
        ),
    )
    .unwrap();
    let o = SshOptions::default()
        .config_file(cfg)
        .options(["IdentityAgent=none"]);
    let s = SshSession::connect("via", &o).await.unwrap();
    let s2 = s.reconnect().await.unwrap();
    assert!(
        s2.exec("true")
            .await
            .unwrap()
            .exit
            .wait()
            .await
            .unwrap()
            .success()
    );
}

#[tokio::test]
async fn connect_timeout_against_a_port_that_never_answers() {
    // A listener that never accepts: the TCP handshake completes in the kernel, but no SSH
    // banner ever comes.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("config");
    fs::write(
        &cfg,
        format!(
            "Host silent\n  HostName 127.0.0.1\n  Port {port}\n  ConnectTimeout 1\n  \
             UserKnownHostsFile {}/kh\n  IdentityFile {}/none\n",
            dir.path().display(),
            dir.path().display()
        ),
    )
    .unwrap();
    let o = SshOptions::default()
        .config_file(cfg)
        .options(["IdentityAgent=none"]);
    let res = tokio::time::timeout(Duration::from_secs(60), SshSession::connect("silent", &o))
        .await
        .expect("ConnectTimeout was not honoured");
    let e = res.unwrap_err();
    assert!(matches!(e, Error::Timeout { .. }), "{e}");
    assert!(e.to_string().contains("ConnectTimeout"), "{e}");
    drop(listener);
}

#[tokio::test]
async fn reconnect_gives_a_separate_sshd_process() {
    let sshd = Sshd::start().unwrap();
    let a = connect(&sshd).await;
    let b = a.reconnect().await.unwrap();
    async fn ppid(s: &SshSession) -> String {
        let mut p = s.exec("echo $PPID").await.unwrap();
        let mut out = String::new();
        p.stream.read_to_string(&mut out).await.unwrap();
        out
    }
    let (a1, a2, b1) = (ppid(&a).await, ppid(&a).await, ppid(&b).await);
    assert_eq!(a1, a2, "channels of one connection share an sshd process");
    assert_ne!(a1, b1, "a second connection has its own sshd process");
}

/// A stand-in for `fastcp server`: echoes its stdin, and checks its only argument.
fn fake_server(dir: &Path) -> PathBuf {
    let p = dir.join("fake fastcp");
    fs::write(
        &p,
        "#!/bin/sh\n[ \"$#\" = 1 ] && [ \"$1\" = server ] || { echo \"bad args: $*\" >&2; exit 2; }\n\
         echo started >&2\nexec cat\n",
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    fs::set_permissions(&p, fs::Permissions::from_mode(0o755)).unwrap();
    p
}

#[tokio::test]
async fn start_server_runs_the_fixed_command_with_remote_path() {
    let sshd = Sshd::start().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut o = opts(&sshd);
    o.remote_path = Some(fake_server(dir.path()).to_str().unwrap().to_owned());
    let s = SshSession::connect(sshd.alias(), &o).await.unwrap();
    let p = s.start_server().await.unwrap();
    let out = round_trip(p.stream, b"ping".to_vec()).await;
    assert_eq!(out, b"ping");
    assert_eq!(stderr_text(p.stderr).await, "started\n");
    assert!(p.exit.wait().await.unwrap().success());
}

#[tokio::test]
async fn missing_remote_binary_gives_exit_127_and_the_shell_message() {
    let sshd = Sshd::start().unwrap();
    let mut o = opts(&sshd);
    o.remote_path = Some("/nonexistent/fastcp".into());
    let s = SshSession::connect(sshd.alias(), &o).await.unwrap();
    let mut p = s.start_server().await.unwrap();
    let mut out = Vec::new();
    p.stream.read_to_end(&mut out).await.unwrap();
    let status = p.exit.wait().await.unwrap();
    assert!(status.is_command_not_found(), "{status}");
    assert!(stderr_text(p.stderr).await.contains("/nonexistent/fastcp"));
}

#[tokio::test]
async fn system_ssh_program_runs_the_server_and_forwards_tcp_ports() {
    let sshd = Sshd::start().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut o = opts(&sshd);
    o.options.clear();
    o.remote_path = Some(fake_server(dir.path()).to_str().unwrap().to_owned());
    o.ssh_program = Some("ssh".into());
    let t = SshProgram::connect(sshd.alias(), &o).await.unwrap();
    assert!(t.supports_extra_streams());
    let p = t.start_server().await.unwrap();
    let data = payload(2 << 20, 3);
    let out = round_trip(p.stream, data.clone()).await;
    assert!(out == data);
    assert!(stderr_text(p.stderr).await.contains("started"));
    assert!(p.exit.wait().await.unwrap().success());
    // Extra streams: `ssh -W` to a port on the peer's loopback (here, this machine's).
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let echo = tokio::spawn(async move {
        let (conn, _) = listener.accept().await.unwrap();
        let (mut r, mut w) = tokio::io::split(conn);
        tokio::io::copy(&mut r, &mut w).await.unwrap();
    });
    let forwarded = t.open_stream(&Rendezvous::TcpPort(port)).await.unwrap();
    let data = payload(1 << 20, 5);
    assert!(round_trip(forwarded, data.clone()).await == data);
    echo.await.unwrap();
    // A unix socket it cannot reach.
    let e = t
        .open_stream(&Rendezvous::UnixSocket("/tmp/x/s".into()))
        .await
        .err()
        .expect("no unix sockets");
    assert!(matches!(e, Error::SingleStream(_)));
}

/// Runs under a pseudo-terminal (see `passphrase_is_asked_on_the_terminal`): connects with
/// an encrypted key whose passphrase is typed on the terminal.
#[tokio::test]
#[ignore = "run by passphrase_is_asked_on_the_terminal inside `script`"]
async fn tty_child_connects_with_encrypted_key() {
    let Ok(cfg) = std::env::var("FASTCP_TEST_TTY_CONFIG") else {
        return;
    };
    let o = SshOptions::default()
        .config_file(cfg)
        .options(["IdentityAgent=none"]);
    let s = SshSession::connect("t", &o).await.unwrap();
    let mut p = s.exec("echo tty-key-ok").await.unwrap();
    let mut out = String::new();
    p.stream.read_to_string(&mut out).await.unwrap();
    assert_eq!(out, "tty-key-ok\n");
}

#[tokio::test]
async fn passphrase_is_asked_on_the_terminal() {
    let sshd = Sshd::start().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let key = dir.path().join("locked");
    let st = Command::new(fastcp_testsupport::tools::require("ssh-keygen"))
        .args(["-q", "-t", "ed25519", "-N", "secret phrase", "-f"])
        .arg(&key)
        .status()
        .unwrap();
    assert!(st.success());
    let pubkey = fs::read_to_string(key.with_extension("pub")).unwrap();
    fs::write(sshd.authorized_keys(), pubkey).unwrap();
    let cfg = config_with(
        &sshd,
        dir.path(),
        &format!("  IdentityFile {}\n  BatchMode no\n", key.display()),
    );
    let (ok, text) = run_in_tty(
        "tty_child_connects_with_encrypted_key",
        &cfg,
        "Enter passphrase for key",
        "secret phrase",
    );
    assert!(ok, "{text}");
    assert!(text.contains("1 passed"), "{text}");
    assert!(
        !text.contains("secret phrase"),
        "the passphrase was echoed: {text}"
    );
}

/// Runs the ignored test `name` of this binary under `script(1)` (a pseudo-terminal) with
/// `FASTCP_TEST_TTY_CONFIG=config`, types `answer` once `prompt` shows, and returns whether
/// it succeeded and what the terminal showed.
fn run_in_tty(name: &str, config: &Path, prompt: &str, answer: &str) -> (bool, String) {
    use std::io::{Read, Write};
    let exe = std::env::current_exe().unwrap();
    let cmd = format!("{} --ignored --exact {name} --nocapture", exe.display());
    let mut child = Command::new(fastcp_testsupport::tools::require("script"))
        .args(["-qec", &cmd, "/dev/null"])
        .env("FASTCP_TEST_TTY_CONFIG", config)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("script(1) from util-linux");
    // Type the answer only once the prompt is up (echo is off by then for passphrases).
    let mut stdout = child.stdout.take().unwrap();
    let mut seen = Vec::new();
    let mut buf = [0u8; 4096];
    while !String::from_utf8_lossy(&seen).contains(prompt) {
        let n = stdout.read(&mut buf).unwrap();
        assert!(n > 0, "no prompt: {}", String::from_utf8_lossy(&seen));
        seen.extend_from_slice(&buf[..n]);
    }
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(format!("{answer}\n").as_bytes()).unwrap();
    stdout.read_to_end(&mut seen).unwrap();
    let ok = child.wait().unwrap().success();
    (ok, String::from_utf8_lossy(&seen).into_owned())
}

/// Runs under a pseudo-terminal: connects to a host whose key is unknown, with
/// StrictHostKeyChecking ask.
#[tokio::test]
#[ignore = "run by unknown_host_key_is_asked_on_the_terminal inside `script`"]
async fn tty_child_connects_to_unknown_host() {
    let Ok(cfg) = std::env::var("FASTCP_TEST_TTY_CONFIG") else {
        return;
    };
    let o = SshOptions::default()
        .config_file(cfg)
        .options(["IdentityAgent=none"]);
    SshSession::connect("t", &o).await.unwrap();
}

#[tokio::test]
async fn unknown_host_key_is_asked_on_the_terminal() {
    let sshd = Sshd::start().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let kh = dir.path().join("known_hosts");
    let cfg = dir.path().join("config");
    let block = sshd
        .host_block("t")
        .replace(
            &sshd.known_hosts().display().to_string(),
            &kh.display().to_string(),
        )
        .replace("StrictHostKeyChecking yes", "StrictHostKeyChecking ask")
        .replace("BatchMode yes", "BatchMode no");
    fs::write(&cfg, block).unwrap();
    let prompt = "Are you sure you want to continue connecting (yes/no/[fingerprint])?";
    let (ok, text) = run_in_tty("tty_child_connects_to_unknown_host", &cfg, prompt, "no");
    assert!(!ok, "answering no must refuse: {text}");
    assert!(
        text.contains("ED25519 key fingerprint is SHA256:"),
        "{text}"
    );
    assert!(!kh.exists() || fs::read_to_string(&kh).unwrap().is_empty());
    // An answer it does not know asks again, the short way, as ssh does.
    let (ok, text) = run_in_tty(
        "tty_child_connects_to_unknown_host",
        &cfg,
        prompt,
        "maybe\nyes",
    );
    assert!(ok, "{text}");
    assert_eq!(
        text.matches("Are you sure you want to continue connecting")
            .count(),
        1,
        "{text}"
    );
    assert!(
        text.contains("Please type 'yes', 'no' or the fingerprint: "),
        "{text}"
    );
    assert_eq!(
        fs::read_to_string(&kh).unwrap(),
        format!("{}\n", sshd.known_hosts_line())
    );
}

#[tokio::test]
async fn proxy_jump_through_two_hops() {
    let sshd = Sshd::start().unwrap();
    let j1 = sshd.start_jump().unwrap();
    let j2 = j1.start_jump().unwrap();
    // One client key for all three servers, one known_hosts, one config.
    fs::copy(sshd.authorized_keys(), j2.authorized_keys()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let kh = dir.path().join("known_hosts");
    fs::write(
        &kh,
        format!(
            "{}\n{}\n{}\n",
            sshd.known_hosts_line(),
            j1.known_hosts_line(),
            j2.known_hosts_line()
        ),
    )
    .unwrap();
    let block = |alias: &str, port: u16| {
        format!(
            "Host {alias}\n  HostName 127.0.0.1\n  Port {port}\n  User {}\n  IdentityFile {}\n  \
             IdentitiesOnly yes\n  UserKnownHostsFile {}\n  StrictHostKeyChecking yes\n",
            sshd.user(),
            sshd.client_key().display(),
            kh.display()
        )
    };
    let cfg = dir.path().join("config");
    fs::write(
        &cfg,
        format!(
            "{}{}{}",
            block("target", sshd.port()),
            block("hop1", j1.port()),
            block("hop2", j2.port())
        ),
    )
    .unwrap();
    let o = SshOptions::default()
        .config_file(cfg)
        .jump("hop1,hop2")
        .options(["IdentityAgent=none"]);
    let s = SshSession::connect("target", &o).await.unwrap();
    let mut p = s.exec("echo two-hops").await.unwrap();
    let mut out = String::new();
    p.stream.read_to_string(&mut out).await.unwrap();
    assert_eq!(out, "two-hops\n");
    // hop1 forwarded to hop2, and hop2 to the target.
    assert!(
        j1.log()
            .contains(&format!("target 127.0.0.1 port {}", j2.port()))
    );
    assert!(
        j2.log()
            .contains(&format!("target 127.0.0.1 port {}", sshd.port()))
    );
}

#[tokio::test]
async fn a_port_that_waits_for_the_client_to_speak_first_still_connects() {
    // As sslh does: the port says nothing until the client has spoken, then hands the
    // connection to sshd. The client's wait for the server's first bytes (which sizes the
    // receive window) must end on its own, not at ConnectTimeout.
    let sshd = Sshd::start().unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let upstream = sshd.port();
    tokio::spawn(async move {
        while let Ok((mut client, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut first = [0u8; 1];
                if client.read_exact(&mut first).await.is_err() {
                    return;
                }
                let mut server = tokio::net::TcpStream::connect(("127.0.0.1", upstream))
                    .await
                    .unwrap();
                server.write_all(&first).await.unwrap();
                let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
            });
        }
    });
    let dir = tempfile::tempdir().unwrap();
    let cfg = config_with(
        &sshd,
        dir.path(),
        &format!(
            "  IdentityFile {}\n  ConnectTimeout 20\n",
            sshd.client_key().display()
        ),
    );
    // The proxy's port, and the host key known under it.
    let kh = dir.path().join("known_hosts");
    fs::write(
        &kh,
        format!("[127.0.0.1]:{port} {}\n", sshd.host_public_key()),
    )
    .unwrap();
    let text = fs::read_to_string(&cfg).unwrap();
    let text = text
        .replace(&format!("Port {}", sshd.port()), &format!("Port {port}"))
        .replace(
            &sshd.known_hosts().display().to_string(),
            &kh.display().to_string(),
        );
    fs::write(&cfg, text).unwrap();
    let o = SshOptions::default()
        .config_file(cfg)
        .options(["IdentityAgent=none"]);
    // Bounded by the test, not by ConnectTimeout: a hang until then fails it too.
    let session = tokio::time::timeout(Duration::from_secs(10), SshSession::connect("t", &o))
        .await
        .expect("the connect waited for a banner that comes only after the client speaks")
        .unwrap();
    let mut p = session.exec("echo through").await.unwrap();
    let mut out = String::new();
    p.stream.read_to_string(&mut out).await.unwrap();
    assert_eq!(out, "through\n");
}

/// ssh_config's algorithm lists bind the built-in client as they bind ssh: against a server
/// that takes only AES-128-GCM, `Ciphers aes256-gcm@openssh.com` (a policy without it) fails
/// to agree on a cipher, where the client's own list would have connected; a policy that
/// allows it, or removes something else, connects.
#[tokio::test]
async fn ssh_config_algorithm_lists_are_kept() {
    let sshd = Sshd::start_with_options("Ciphers aes128-gcm@openssh.com").unwrap();
    let dir = tempfile::tempdir().unwrap();
    let key = sshd.client_key().display().to_string();
    let connect = async |line: &str| {
        let extra = format!("  IdentityFile {key}\n  {line}\n");
        let o = SshOptions::default().config_file(config_with(&sshd, dir.path(), &extra));
        SshSession::connect("t", &o).await
    };
    for (line, connects) in [
        ("Ciphers aes256-gcm@openssh.com", false),
        ("Ciphers -aes128-*", false),
        ("Ciphers aes256-ctr,aes128-gcm@openssh.com", true),
        ("Ciphers -chacha20*", true),
        (
            "KexAlgorithms curve25519-sha256,diffie-hellman-group14-sha256",
            true,
        ),
    ] {
        let got = connect(line).await;
        assert_eq!(got.is_ok(), connects, "{line}: {:?}", got.err());
    }
    // A list that leaves none of the client's own goes to the system ssh, which has more.
    for line in ["Ciphers aes128-cbc", "KexAlgorithms -*"] {
        let got = connect(line).await;
        assert!(
            matches!(got, Err(Error::NeedsSystemSsh(_))),
            "{line}: {:?}",
            got.err()
        );
    }
}

/// `PubkeyAuthentication no` offers no key, as with ssh: the fixture's key, which the server
/// takes, is not tried, and the login fails (BatchMode asks for no password); `unbound`
/// offers it, as `yes` does.
#[tokio::test]
async fn pubkey_authentication_no_offers_no_key() {
    let sshd = Sshd::start().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let key = sshd.client_key().display().to_string();
    for (value, logs_in) in [("no", false), ("unbound", true)] {
        let extra = format!("  IdentityFile {key}\n  PubkeyAuthentication {value}\n");
        let o = SshOptions::default()
            .config_file(config_with(&sshd, dir.path(), &extra))
            .options(["IdentityAgent=none"]);
        match SshSession::connect("t", &o).await {
            Ok(_) => assert!(logs_in, "{value}: logged in"),
            Err(Error::Auth { tried, .. }) => {
                assert!(!logs_in, "{value}: {tried:?}");
                assert!(!tried.iter().any(|t| t.contains(&key)), "{tried:?}");
            }
            Err(e) => panic!("{value}: {e}"),
        }
    }
}

/// A connection lost while a remote command runs (the link cut, sshd's child killed): the
/// command's exit status and stderr end with it, as `ExitWaiter::wait` documents, rather than
/// being waited for forever. A copy waits for them after its session ends, to tell how the
/// server ended.
#[tokio::test]
async fn a_lost_connection_ends_the_exit_status_and_stderr_wait() {
    use fastcp_testsupport::wan::{WanConfig, WanRelay};
    let sshd = Sshd::start().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let upstream = std::net::SocketAddr::from(([127, 0, 0, 1], sshd.port()));
    let relay = WanRelay::spawn(
        "127.0.0.1:0".parse().unwrap(),
        upstream,
        WanConfig::default(),
    )
    .unwrap();
    let known = dir.path().join("known_hosts");
    fs::write(
        &known,
        format!("[127.0.0.1]:{} {}\n", relay.port(), sshd.host_public_key()),
    )
    .unwrap();
    let block = sshd
        .host_block(sshd.alias())
        .replace(
            &format!("Port {}", sshd.port()),
            &format!("Port {}", relay.port()),
        )
        .replace(
            &sshd.known_hosts().display().to_string(),
            &known.display().to_string(),
        );
    let cfg = dir.path().join("config");
    fs::write(&cfg, block).unwrap();
    let options = SshOptions::default()
        .config_file(cfg)
        .options(["IdentityAgent=none"]);
    let s = SshSession::connect(sshd.alias(), &options).await.unwrap();
    let mut p = s.exec("echo started; exec sleep 600").await.unwrap();
    let mut started = [0u8; 8];
    p.stream.read_exact(&mut started).await.unwrap();
    // The cut: the relay closes both sides of the connection.
    drop(relay);
    // Bounds on a wait that, before, never ended: no timing is asserted.
    let bound = Duration::from_secs(60);
    let stderr = tokio::time::timeout(bound, stderr_text(p.stderr)).await;
    assert_eq!(stderr.expect("stderr never ended"), "");
    let status = tokio::time::timeout(bound, p.exit.wait()).await;
    assert!(matches!(status, Ok(Err(Error::NoExitStatus))), "{status:?}");
}
