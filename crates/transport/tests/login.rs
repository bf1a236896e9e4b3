//! Password and keyboard-interactive logins are asked once and reused for more connections,
//! and a server that goes silent during a login is given up on.
//!
//! The harness's OpenSSH sshd only does public keys (a password login needs an account with a
//! password, which tests must not set on the machine), so these tests run an in-process
//! russh server on 127.0.0.1 that takes a password or keyboard-interactive answers and counts
//! the logins. The client runs in a child process under `script(1)`, a real pseudo-terminal,
//! where the test types the answer once.

use std::borrow::Cow;
use std::fs;
use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use fastcp_transport::{Error, SshOptions, SshSession};
use russh::keys::PrivateKey;
use russh::server::{Auth, Response};
use russh::{MethodKind, MethodSet};

const PASSWORD: &str = "correct horse";
const CODE_PROMPT: &str = "Verification code: ";
const CODE: &str = "424242";

/// A server that accepts `PASSWORD` by password, or `CODE` by keyboard-interactive.
#[derive(Clone)]
struct LoginServer {
    method: MethodKind,
    logins: Arc<AtomicUsize>,
}

impl russh::server::Handler for LoginServer {
    type Error = russh::Error;

    async fn auth_password(&mut self, _user: &str, password: &str) -> Result<Auth, Self::Error> {
        if self.method == MethodKind::Password && password == PASSWORD {
            self.logins.fetch_add(1, Ordering::SeqCst);
            Ok(Auth::Accept)
        } else {
            Ok(Auth::reject())
        }
    }

    async fn auth_keyboard_interactive<'a>(
        &'a mut self,
        _user: &str,
        _submethods: &str,
        response: Option<Response<'a>>,
    ) -> Result<Auth, Self::Error> {
        if self.method != MethodKind::KeyboardInteractive {
            return Ok(Auth::reject());
        }
        match response {
            None => Ok(Auth::Partial {
                name: Cow::Borrowed(""),
                instructions: Cow::Borrowed(""),
                prompts: Cow::Owned(vec![(Cow::Borrowed(CODE_PROMPT), false)]),
            }),
            Some(mut answers) => {
                if answers.next().as_deref() == Some(CODE.as_bytes()) {
                    self.logins.fetch_add(1, Ordering::SeqCst);
                    Ok(Auth::Accept)
                } else {
                    Ok(Auth::reject())
                }
            }
        }
    }
}

/// A fresh ed25519 host key, and its public half as a known_hosts line wants it.
fn host_key() -> (PrivateKey, String) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("host_key");
    let st = Command::new(fastcp_testsupport::tools::require("ssh-keygen"))
        .args(["-q", "-t", "ed25519", "-N", "", "-f"])
        .arg(&path)
        .status()
        .unwrap();
    assert!(st.success());
    let key: PrivateKey = russh::keys::load_secret_key(&path, None).unwrap();
    let known = key.public_key().to_openssh().unwrap();
    (key, known)
}

/// Serves `handler` on a free loopback port, a copy of it for each connection; returns the
/// port.
async fn serve<H>(config: Arc<russh::server::Config>, handler: H) -> u16
where
    H: russh::server::Handler + Clone + Send + 'static,
{
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((socket, _)) = listener.accept().await {
            let (config, handler) = (config.clone(), handler.clone());
            tokio::spawn(async move {
                if let Ok(session) = russh::server::run_stream(config, socket, handler).await {
                    let _ = session.await;
                }
            });
        }
    });
    port
}

/// Starts the server on a free loopback port, offering only `method`; returns the port, the
/// `known_hosts` line for it and the login counter.
async fn start_server(method: MethodKind) -> (u16, String, Arc<AtomicUsize>) {
    let (key, known) = host_key();
    let config = Arc::new(russh::server::Config {
        methods: MethodSet::from(&[method][..]),
        keys: vec![key],
        auth_rejection_time: Duration::from_millis(10),
        auth_rejection_time_initial: Some(Duration::ZERO),
        ..Default::default()
    });
    let logins = Arc::new(AtomicUsize::new(0));
    let server = LoginServer {
        method,
        logins: logins.clone(),
    };
    let port = serve(config, server).await;
    (port, format!("[127.0.0.1]:{port} {known}"), logins)
}

/// A client config for the server: no keys, no agent.
fn config(dir: &Path, port: u16, known: &str, extra: &str) -> std::path::PathBuf {
    let kh = dir.join("known_hosts");
    fs::write(&kh, format!("{known}\n")).unwrap();
    let cfg = dir.join("config");
    fs::write(
        &cfg,
        format!(
            "Host t\n  HostName 127.0.0.1\n  Port {port}\n  User tester\n  \
             IdentityFile {}/none\n  IdentityAgent none\n  UserKnownHostsFile {}\n  \
             GlobalKnownHostsFile /dev/null\n  StrictHostKeyChecking yes\n{extra}",
            dir.display(),
            kh.display()
        ),
    )
    .unwrap();
    cfg
}

/// Runs under a pseudo-terminal: logs in once, then three more times, answering only once.
#[tokio::test]
#[ignore = "run by the login tests inside `script`"]
async fn tty_child_logs_in_four_times() {
    let Ok(cfg) = std::env::var("FASTCP_TEST_TTY_CONFIG") else {
        return;
    };
    let o = SshOptions::default().config_file(cfg);
    let first = SshSession::connect("t", &o).await.unwrap();
    // What was typed may be asked for again (a one-time code): fastcp then logs the extra
    // connections in before it starts the server.
    assert!(first.login_was_typed());
    for _ in 0..3 {
        assert!(first.reconnect().await.unwrap().login_was_typed());
    }
    println!("FOUR LOGINS OK");
}

async fn asked_once(method: MethodKind, prompt: &str, answer: &str) {
    let (port, known, logins) = start_server(method).await;
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path(), port, &known, "  BatchMode no\n");
    let prompt = prompt.to_owned();
    let answer = answer.to_owned();
    let (ok, text) = tokio::task::spawn_blocking(move || {
        fastcp_testsupport::tty::run_ignored_test_in_tty(
            "tty_child_logs_in_four_times",
            &[("FASTCP_TEST_TTY_CONFIG", cfg.as_os_str())],
            &prompt,
            &answer,
        )
    })
    .await
    .unwrap();
    assert!(ok, "{text}");
    assert!(text.contains("FOUR LOGINS OK"), "{text}");
    let prompt = text.matches(CODE_PROMPT.trim()).count() + text.matches("password:").count();
    assert_eq!(prompt, 1, "asked more than once:\n{text}");
    assert!(!text.contains(PASSWORD), "the password was echoed: {text}");
    assert_eq!(logins.load(Ordering::SeqCst), 4);
}

#[tokio::test(flavor = "multi_thread")]
async fn password_is_asked_once_for_four_connections() {
    asked_once(
        MethodKind::Password,
        "tester@127.0.0.1's password:",
        PASSWORD,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn keyboard_interactive_is_answered_once_for_four_connections() {
    asked_once(MethodKind::KeyboardInteractive, CODE_PROMPT.trim(), CODE).await;
}

#[tokio::test]
async fn batch_mode_never_asks_for_a_password() {
    let (port, known, logins) = start_server(MethodKind::Password).await;
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path(), port, &known, "  BatchMode yes\n");
    let o = SshOptions::default().config_file(cfg);
    let e = SshSession::connect("t", &o).await.unwrap_err();
    assert!(matches!(e, Error::Auth { .. }), "{e}");
    assert!(
        e.to_string()
            .contains("password (BatchMode forbids asking)"),
        "{e}"
    );
    assert_eq!(logins.load(Ordering::SeqCst), 0);

    // PasswordAuthentication no: not even listed.
    let o = SshOptions::default()
        .config_file(dir.path().join("config"))
        .options(["PasswordAuthentication=no"]);
    let e = SshSession::connect("t", &o).await.unwrap_err();
    assert!(!e.to_string().contains("password"), "{e}");
}

#[test]
fn a_missing_terminal_is_an_error_not_a_hang() {
    // Without a controlling terminal (setsid), the child cannot be asked: it must fail at
    // once with the reason, not wait.
    let rt = tokio::runtime::Runtime::new().unwrap();
    let (port, known, _logins) = rt.block_on(start_server(MethodKind::Password));
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path(), port, &known, "  BatchMode no\n");
    let exe = std::env::current_exe().unwrap();
    let out = Command::new(fastcp_testsupport::tools::require("setsid"))
        .arg("-w")
        .arg(exe)
        .args([
            "--ignored",
            "--exact",
            "tty_child_logs_in_four_times",
            "--nocapture",
        ])
        .env("FASTCP_TEST_TTY_CONFIG", &cfg)
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{text}");
    assert!(
        text.contains("password (no terminal to ask for it)"),
        "{text}"
    );
}

/// A server that takes the connection, shows its host key, then never answers a login.
#[derive(Clone)]
struct SilentLogin;

impl russh::server::Handler for SilentLogin {
    type Error = russh::Error;

    async fn auth_none(&mut self, _user: &str) -> Result<Auth, Self::Error> {
        std::future::pending().await
    }
}

/// A server that goes silent once the login has started (after its host key, so past
/// ConnectTimeout) is given up on by the keepalives (ServerAliveInterval), not waited for.
#[tokio::test]
async fn a_server_silent_during_the_login_is_given_up_on() {
    let dir = tempfile::tempdir().unwrap();
    let (key, known) = host_key();
    let server_config = Arc::new(russh::server::Config {
        methods: MethodSet::from(&[MethodKind::Password][..]),
        keys: vec![key],
        ..Default::default()
    });
    let port = serve(server_config, SilentLogin).await;
    let known = format!("[127.0.0.1]:{port} {known}");
    let login = |o: SshOptions| async move {
        let res = tokio::time::timeout(Duration::from_secs(60), SshSession::connect("t", &o));
        match res.await {
            Ok(Ok(_)) => panic!("logged in to a server that never answered"),
            Ok(Err(e)) => e,
            Err(_) => panic!("still waiting for the login after a minute"),
        }
    };

    // ServerAliveInterval and ServerAliveCountMax from ssh_config.
    let extra = "  BatchMode no\n  ServerAliveInterval 1\n  ServerAliveCountMax 2\n";
    let o = SshOptions::default().config_file(config(dir.path(), port, &known, extra));
    let e = login(o).await;
    assert!(
        matches!(e, Error::LoginTimeout { timeout, .. } if timeout == Duration::from_secs(2)),
        "{e:?}"
    );
    assert!(
        e.to_string()
            .contains("did not answer for 2s during the login"),
        "{e}"
    );

    // The program's own keepalives (the fastcp command sets them from --timeout).
    let mut o =
        SshOptions::default().config_file(config(dir.path(), port, &known, "  BatchMode no\n"));
    o.client.keepalive_interval = Some(Duration::from_secs(1));
    let e = login(o).await;
    assert!(matches!(e, Error::LoginTimeout { .. }), "{e:?}");
}
