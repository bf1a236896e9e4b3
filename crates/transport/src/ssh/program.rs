//! The escape hatch: run the system OpenSSH client (`--ssh-program ssh`).
//!
//! It serves configs the built-in client cannot (Match, ProxyCommand, GSSAPI, ...). The
//! server's control stream is the remote command's stdio over ssh's stdio; extra streams are
//! `ssh -W 127.0.0.1:PORT` forwardings to the server's loopback
//! ([`forward_to_loopback`](SshProgram::forward_to_loopback)), an ssh each.
//!
//! The argv is built from [`SshOptions`] only: `ssh -T -x -a [-F cfg] [-p port] [-l user]
//! [-i id]... [-J jump] [-o opt]... [-c ciphers] -- destination '<remote program>' server`.
//! No path or other user data goes on the remote command line.

use std::ffi::OsString;
use std::path::PathBuf;
use std::pin::Pin;
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use bytes::Bytes;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, ReadBuf};
use tokio::process::{ChildStdin, ChildStdout, Command};
use tokio::sync::{mpsc, oneshot};

use super::Error;
use super::config::SshOptions;
use super::remote::{
    ExitStatus, ExitWaiter, RemoteProcess, Stderr, launch_command, server_command,
};

/// Runs `fastcp server` on the peer through the system `ssh` program.
#[derive(Debug)]
pub struct SshProgram {
    program: PathBuf,
    destination: String,
    options: SshOptions,
    /// The remote program, `options.remote_path` until [`set_remote_path`] changes it (after
    /// a self-deploy).
    ///
    /// [`set_remote_path`]: SshProgram::set_remote_path
    remote_path: Mutex<Option<String>>,
    /// What runs in place of `fastcp server` when no remote path is named.
    launcher: Mutex<Option<String>>,
    /// The connection master this copy's ssh processes share, when ssh may prompt (see
    /// [`connect`](SshProgram::connect)).
    master: Option<Arc<Master>>,
    /// Whether extra streams go through the master rather than connections of their own.
    streams_through_master: Arc<AtomicBool>,
    /// How the ssh processes that log in by themselves end (see
    /// [`last_login_ended`](SshProgram::last_login_ended)).
    logins: Arc<Logins>,
    /// What `ssh -G` said, asked once: each run of it runs ssh_config's `Match exec`
    /// commands again.
    resolved: tokio::sync::OnceCell<Option<String>>,
}

/// The ssh processes of an [`SshProgram`] that log in by themselves (the server's, a
/// command's, a subsystem's first session; not the extra streams'): how many started, and
/// how the newest that ended did.
#[derive(Debug, Default)]
struct Logins {
    started: std::sync::atomic::AtomicU64,
    /// The number of the newest that ended (from 1), its exit status and what it said.
    ended: tokio::sync::watch::Sender<Option<(u64, ExitStatus, String)>>,
}

/// How much of what an ssh process says on stderr [`Logins`] keeps.
const WORDS_KEPT: usize = 4096;

impl Clone for SshProgram {
    fn clone(&self) -> Self {
        SshProgram {
            program: self.program.clone(),
            destination: self.destination.clone(),
            options: self.options.clone(),
            remote_path: Mutex::new(self.remote_path()),
            launcher: Mutex::new(self.launcher()),
            master: self.master.clone(),
            streams_through_master: self.streams_through_master.clone(),
            logins: self.logins.clone(),
            resolved: self.resolved.clone(),
        }
    }
}

/// A connection master (OpenSSH's `ControlMaster`) in a private folder of its own: the first
/// ssh of a copy logs in, and the others ride its connection. Stopped (`ssh -O exit`) and
/// removed when the last [`SshProgram`] sharing it is dropped.
#[derive(Debug)]
struct Master {
    /// A 0700 folder holding the socket.
    dir: PathBuf,
    /// The program and options, to send `-O exit`.
    argv: Vec<OsString>,
    destination: String,
}

impl Master {
    fn create(argv: Vec<OsString>, destination: &str) -> Option<Master> {
        use std::os::unix::fs::DirBuilderExt;
        let base = std::env::temp_dir();
        for attempt in 0..8u32 {
            let nanos = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.subsec_nanos());
            let dir = base.join(format!(
                "fastcp-ssh-{:x}-{:x}",
                std::process::id(),
                nanos ^ attempt
            ));
            if std::fs::DirBuilder::new().mode(0o700).create(&dir).is_ok() {
                return Some(Master {
                    dir,
                    argv,
                    destination: destination.to_owned(),
                });
            }
        }
        None
    }

    fn socket(&self) -> PathBuf {
        self.dir.join("m")
    }
}

/// How long stopping a master (`ssh -O exit`, a local socket) may take before ssh is killed.
const MASTER_EXIT_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

impl Drop for Master {
    fn drop(&mut self) {
        if self.socket().exists() {
            let child = std::process::Command::new(&self.argv[0])
                .args(&self.argv[1..])
                .arg("-o")
                .arg(control_path(&self.socket()))
                .args(["-O", "exit", "--"])
                .arg(&self.destination)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn();
            if let Ok(mut child) = child {
                let deadline = std::time::Instant::now() + MASTER_EXIT_WAIT;
                while matches!(child.try_wait(), Ok(None)) && std::time::Instant::now() < deadline {
                    std::thread::sleep(std::time::Duration::from_millis(10));
                }
                if matches!(child.try_wait(), Ok(None)) {
                    let _ = child.kill();
                    let _ = child.wait();
                }
            }
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// `ControlPath=PATH`, with the `%` that ssh would expand doubled.
fn control_path(socket: &std::path::Path) -> OsString {
    let mut o = OsString::from("ControlPath=");
    o.push(socket.to_string_lossy().replace('%', "%%"));
    o
}

/// How an ssh process of this copy uses the master, if there is one.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Share {
    /// Log in through the master, or become it.
    Master,
    /// A connection of its own that never prompts (an extra stream's first try).
    OwnConnection,
}

impl SshProgram {
    /// Prepares to run `options.ssh_program` (default `ssh`) to reach `destination`
    /// (`[user@]host`). Nothing runs until [`start`](SshProgram::start).
    pub fn new(destination: &str, options: &SshOptions) -> Result<SshProgram, Error> {
        if destination.is_empty()
            || destination.starts_with('-')
            || destination
                .chars()
                .any(|c| c.is_control() || c.is_whitespace())
        {
            return Err(Error::Config(format!(
                "invalid destination {destination:?}"
            )));
        }
        server_command(options.remote_path.as_deref())?;
        Ok(SshProgram {
            program: options
                .ssh_program
                .clone()
                .unwrap_or_else(|| PathBuf::from("ssh")),
            destination: destination.to_owned(),
            options: options.clone(),
            remote_path: Mutex::new(options.remote_path.clone()),
            launcher: Mutex::new(None),
            master: None,
            streams_through_master: Arc::new(AtomicBool::new(false)),
            logins: Arc::default(),
            resolved: tokio::sync::OnceCell::new(),
        })
    }

    /// [`new`](SshProgram::new), then asks `ssh -G` whether ssh may prompt (BatchMode is not
    /// yes) and whether ssh_config shares connections already (ControlPath). When it may
    /// prompt and does not share, this copy's ssh processes share a connection master of
    /// their own, so that a password, passphrase or 2FA answer is asked once: the first ssh
    /// logs in, the others ride it. Extra data streams still try connections of their own
    /// first (they spread over cores), without prompting; see
    /// [`set_streams_through_master`](SshProgram::set_streams_through_master).
    pub async fn connect(destination: &str, options: &SshOptions) -> Result<SshProgram, Error> {
        let mut program = SshProgram::new(destination, options)?;
        if let Some(resolved) = program.resolved().await {
            let value = |key: &str| {
                resolved
                    .lines()
                    .find_map(|l| l.strip_prefix(key)?.strip_prefix(' '))
                    .unwrap_or("")
                    .trim()
                    .to_ascii_lowercase()
            };
            let prompts = value("batchmode") != "yes";
            let shared = !matches!(value("controlpath").as_str(), "" | "none")
                || !matches!(value("controlmaster").as_str(), "" | "false" | "no");
            if prompts && !shared {
                program.master =
                    Master::create(program.options_argv(None), &program.destination).map(Arc::new);
            }
        }
        Ok(program)
    }

    /// The ssh program this runs (`ssh`, or [`SshOptions::ssh_program`]).
    pub fn program(&self) -> &std::path::Path {
        &self.program
    }

    /// How the newest ssh process that logs in by itself ([`start`](SshProgram::start),
    /// [`exec`](SshProgram::exec), [`open_subsystem`](SshProgram::open_subsystem)) ended:
    /// its exit status, and what it said on stderr (its first 4 KiB, on one line), as its
    /// caller may have taken its [`RemoteProcess`] apart. Waits up to `patience` for it to
    /// end; `None` if it has not, or none started. Status 255 is ssh's own failure
    /// (connecting, the host key, the login); another is the remote command's.
    pub async fn last_login_ended(
        &self,
        patience: std::time::Duration,
    ) -> Option<(ExitStatus, String)> {
        let newest = self.logins.started.load(Ordering::SeqCst);
        if newest == 0 {
            return None;
        }
        let mut ended = self.logins.ended.subscribe();
        let found = tokio::time::timeout(
            patience,
            ended.wait_for(|e| matches!(e, Some((n, ..)) if *n == newest)),
        )
        .await
        .ok()?
        .ok()?
        .clone();
        found.map(|(_, status, said)| (status, said))
    }

    /// Whether this copy's ssh processes share a connection master of their own.
    pub fn has_master(&self) -> bool {
        self.master.is_some()
    }

    /// Logs the copy's connection master in, when there is one and it is not up yet, by
    /// running `true` through it, and waits for that to end. Call it before starting
    /// commands that may run at the same time (two servers on one host): ssh processes
    /// started together before the master is up each log in on their own (asking again
    /// where a login asks) and say that its socket already exists. A failure is left for
    /// those commands to report.
    pub async fn start_master(&self) {
        match &self.master {
            Some(master) if !master.socket().exists() => {}
            _ => return,
        }
        let Ok(mut p) = self.exec("true") else {
            return;
        };
        drop(p.stream);
        while p.stderr.recv().await.is_some() {}
        let _ = p.exit.wait().await;
    }

    /// Sends the extra data streams through the connection master (no login of their own)
    /// from now on: for when their own connections could not log in without a prompt.
    pub fn set_streams_through_master(&self, yes: bool) {
        self.streams_through_master.store(yes, Ordering::SeqCst);
    }

    /// Whether extra data streams go through the connection master.
    pub fn streams_through_master(&self) -> bool {
        self.master.is_some() && self.streams_through_master.load(Ordering::SeqCst)
    }

    /// The program [`start`](SshProgram::start) runs with the argument `server` on the peer
    /// (`None`: `fastcp` from the remote PATH).
    pub fn remote_path(&self) -> Option<String> {
        self.remote_path
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Runs `path` (`None`: `fastcp` from the remote PATH) from now on, as after a
    /// self-deploy.
    pub fn set_remote_path(&self, path: Option<String>) {
        *self.remote_path.lock().unwrap_or_else(|p| p.into_inner()) = path;
    }

    /// The command line [`start`](SshProgram::start) runs when no remote path is named, in
    /// place of `fastcp server` (see [`crate::ssh::server_command`]).
    pub fn launcher(&self) -> Option<String> {
        self.launcher
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Sets [`launcher`](SshProgram::launcher).
    pub fn set_launcher(&self, command: Option<String>) {
        *self.launcher.lock().unwrap_or_else(|p| p.into_inner()) = command;
    }

    /// Runs `command` through the peer's login shell, as `ssh host command` does; a
    /// connection of its own (unless ssh_config's ControlMaster shares one). For fixed
    /// commands only: the caller quotes nothing, and must put no user data in it.
    pub fn exec(&self, command: &str) -> Result<RemoteProcess<ProcessStream>, Error> {
        let mut argv = self.shared_argv(Share::Master, Some("default"));
        argv.extend(["--".into(), (&self.destination).into(), command.into()]);
        self.spawn(&argv, true)
    }

    /// The full command line: program first.
    pub fn argv(&self) -> Result<Vec<OsString>, Error> {
        let mut a = self.shared_argv(Share::Master, Some("default"));
        a.push("--".into());
        a.push((&self.destination).into());
        a.push(launch_command(self.remote_path().as_deref(), self.launcher())?.into());
        Ok(a)
    }

    /// Starts the subsystem `name` (such as `sftp`) on the peer: `ssh -s`, through the
    /// copy's connection master when there is one, else a connection of its own each time
    /// (unless ssh_config shares one with ControlMaster). What ssh says comes on the
    /// returned stderr: why the peer refused the subsystem, say.
    pub async fn open_subsystem(&self, name: &str) -> Result<RemoteProcess<ProcessStream>, Error> {
        self.subsystem(Share::Master, name, true)
    }

    /// [`open_subsystem`](SshProgram::open_subsystem) for a copy's further sessions: like the
    /// extra streams of [`forward_to_loopback`](SshProgram::forward_to_loopback), on a
    /// connection of its own that never prompts, or through the connection master once
    /// [`set_streams_through_master`](SshProgram::set_streams_through_master) says so.
    pub async fn open_extra_subsystem(
        &self,
        name: &str,
    ) -> Result<RemoteProcess<ProcessStream>, Error> {
        self.subsystem(self.extra_share(), name, false)
    }

    /// `ssh -s` for the subsystem `name`, using the master as `share` says; `login` as for
    /// [`spawn`](SshProgram::spawn).
    fn subsystem(
        &self,
        share: Share,
        name: &str,
        login: bool,
    ) -> Result<RemoteProcess<ProcessStream>, Error> {
        let mut argv = self.shared_argv(share, Some("subsystem"));
        argv.extend([
            "-s".into(),
            "--".into(),
            (&self.destination).into(),
            name.into(),
        ]);
        self.spawn(&argv, login)
    }

    /// How an extra stream or session reaches the peer.
    fn extra_share(&self) -> Share {
        if self.streams_through_master() {
            Share::Master
        } else {
            Share::OwnConnection
        }
    }

    /// Opens a stream to `127.0.0.1:port` on the peer: `ssh -W`, through the peer's sshd
    /// (which must allow TCP forwarding), a connection of its own each time (unless
    /// ssh_config shares one with ControlMaster). When the forwarding fails, ssh exits and
    /// the stream ends; what ssh said comes on the returned stderr.
    pub fn forward_to_loopback(&self, port: u16) -> Result<RemoteProcess<ProcessStream>, Error> {
        let mut argv = self.shared_argv(self.extra_share(), None);
        argv.extend([
            "-W".into(),
            format!("127.0.0.1:{port}").into(),
            "--".into(),
            (&self.destination).into(),
        ]);
        self.spawn(&argv, false)
    }

    /// The address the system ssh would connect to, from `ssh -G` (its resolved
    /// configuration): `None` when it would go through a ProxyCommand or ProxyJump, or when
    /// `ssh -G` fails. The TCP transport connects its data streams there.
    pub async fn direct_address(&self) -> Option<std::net::SocketAddr> {
        let text = self.resolved().await?;
        let (host, port) = parse_resolved(&text)?;
        tokio::net::lookup_host((host.as_str(), port))
            .await
            .ok()?
            .next()
    }

    /// ssh's resolved configuration for the destination (`ssh -G`), or `None` when it fails;
    /// asked once.
    async fn resolved(&self) -> Option<String> {
        self.resolved
            .get_or_init(|| self.ask_resolved())
            .await
            .clone()
    }

    /// Runs `ssh -G` for the destination: its output, or `None` when it fails.
    async fn ask_resolved(&self) -> Option<String> {
        let mut argv = self.options_argv(None);
        argv.push("-G".into());
        argv.push("--".into());
        argv.push((&self.destination).into());
        let run = Command::new(&argv[0])
            .args(&argv[1..])
            .stdin(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .output();
        let out = tokio::time::timeout(std::time::Duration::from_secs(10), run)
            .await
            .ok()?
            .ok()
            .filter(|o| o.status.success())?;
        Some(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// [`options_argv`](SshProgram::options_argv), plus how to use the master, if any.
    fn shared_argv(&self, share: Share, session: Option<&str>) -> Vec<OsString> {
        let mut a = self.options_argv(session);
        let Some(master) = &self.master else {
            return a;
        };
        match share {
            Share::Master => {
                // The first becomes the master and stays a minute after the last user, in
                // the background; dropping the last SshProgram stops it.
                a.extend(["-o".into(), "ControlMaster=auto".into(), "-o".into()]);
                a.push(control_path(&master.socket()));
                a.extend(["-o".into(), "ControlPersist=60".into()]);
            }
            Share::OwnConnection => {
                a.extend(["-o", "ControlPath=none", "-o", "BatchMode=yes"].map(OsString::from));
            }
        }
        a
    }

    /// The program and the options from [`SshOptions`], without the destination; `session`
    /// is the `SessionType` the ssh runs (`default` for a command, `subsystem` for `-s`;
    /// `None` for none, or one `-W` sets).
    fn options_argv(&self, session: Option<&str>) -> Vec<OsString> {
        let o = &self.options;
        let mut a: Vec<OsString> = vec![self.program.clone().into()];
        // No pty, no X11, no agent forwarding: a plain byte pipe. As scp: none of the
        // user's RemoteCommand, LocalCommand and forwardings, which would take the place of
        // the server, write into the pipe or fail the connection (ssh takes the first value
        // given, so these come before the user's options).
        a.extend(["-T", "-x", "-a"].map(OsString::from));
        let mut fixed = vec![
            "PermitLocalCommand=no".to_owned(),
            "ClearAllForwardings=yes".to_owned(),
        ];
        // RemoteCommand came with OpenSSH 7.6; an older ssh refuses the option.
        if openssh_since(&self.program, (7, 6)) {
            fixed.insert(0, "RemoteCommand=none".to_owned());
        }
        // Nor a session type or stdin of the user's own (`SessionType none`, `StdinNull yes`:
        // ssh's -N and -n), which would leave the server unstarted or cut from its stdin;
        // both came with OpenSSH 8.7.
        if openssh_since(&self.program, (8, 7)) {
            fixed.extend(session.map(|s| format!("SessionType={s}")));
            fixed.push("StdinNull=no".to_owned());
        }
        for option in fixed {
            a.extend(["-o".into(), option.into()]);
        }
        if let Some(f) = &o.config_file {
            a.push("-F".into());
            a.push(f.into());
        }
        if let Some(p) = o.port {
            a.push("-p".into());
            a.push(p.to_string().into());
        }
        if let Some(u) = &o.user {
            a.push("-l".into());
            a.push(u.into());
        }
        for i in &o.identity_files {
            a.push("-i".into());
            a.push(i.into());
        }
        if let Some(j) = &o.jump {
            a.push("-J".into());
            a.push(j.into());
        }
        for opt in &o.options {
            a.push("-o".into());
            a.push(opt.into());
        }
        // The fastest ciphers first, unless the user chose theirs.
        if !o.client.ciphers.is_empty() && !chooses_ciphers(o) {
            a.push("-c".into());
            a.push(o.client.ciphers.join(",").into());
        }
        a
    }

    /// Starts ssh, which runs `fastcp server` on the peer.
    pub async fn start(&self) -> Result<RemoteProcess<ProcessStream>, Error> {
        let argv = self.argv()?;
        self.spawn(&argv, true)
    }

    /// Runs `argv`; with `login`, as one that logs in by itself, whose end
    /// [`last_login_ended`](SshProgram::last_login_ended) tells.
    fn spawn(&self, argv: &[OsString], login: bool) -> Result<RemoteProcess<ProcessStream>, Error> {
        let mut child = Command::new(&argv[0])
            .args(&argv[1..])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| Error::io(format!("cannot run {}", self.program.display()), e))?;
        let stdin = child.stdin.take().expect("piped stdin");
        let stdout = child.stdout.take().expect("piped stdout");
        let mut stderr = child.stderr.take().expect("piped stderr");

        let (etx, erx) = mpsc::unbounded_channel();
        // The first of what it says is kept too, for `last_login_ended`.
        let (said_tx, said_rx) = oneshot::channel();
        tokio::spawn(async move {
            let mut buf = vec![0u8; 8192];
            let mut kept = Vec::new();
            let mut reader_gone = false;
            while let Ok(n) = stderr.read(&mut buf).await {
                if n == 0 {
                    break;
                }
                let room = WORDS_KEPT.saturating_sub(kept.len());
                kept.extend_from_slice(&buf[..n.min(room)]);
                reader_gone |= etx.send(Bytes::copy_from_slice(&buf[..n])).is_err();
                if reader_gone && kept.len() >= WORDS_KEPT {
                    break;
                }
            }
            let _ = said_tx.send(kept);
        });
        let (xtx, xrx) = oneshot::channel();
        let (kill, mut killed) = oneshot::channel();
        let logins = self.logins.clone();
        let number = login.then(|| logins.started.fetch_add(1, Ordering::SeqCst) + 1);
        tokio::spawn(async move {
            // Killed when asked (`ExitWaiter::wait_or_kill`); an `ExitWaiter` dropped unused
            // leaves it running.
            let status = tokio::select! {
                status = child.wait() => status,
                Ok(()) = &mut killed => {
                    let _ = child.start_kill();
                    child.wait().await
                }
            };
            let Ok(status) = status else {
                return;
            };
            let status = exit_status(status);
            let _ = xtx.send(status.clone());
            let Some(number) = number else { return };
            // Its stderr ends with it, unless something it started holds it (a connection
            // master): then what came so far is not waited for.
            let said = tokio::time::timeout(std::time::Duration::from_secs(2), said_rx)
                .await
                .ok()
                .and_then(Result::ok)
                .unwrap_or_default();
            let said = String::from_utf8_lossy(&said);
            let said = said.split_whitespace().collect::<Vec<_>>().join(" ");
            logins.ended.send_if_modified(|ended| {
                let newer = ended.as_ref().is_none_or(|(n, ..)| *n < number);
                if newer {
                    *ended = Some((number, status, said));
                }
                newer
            });
        });
        Ok(RemoteProcess {
            stream: ProcessStream {
                stdout,
                stdin: Some(stdin),
            },
            stderr: Stderr(erx),
            exit: ExitWaiter::local(xrx, kill),
        })
    }
}

/// The host name and port from `ssh -G` output, unless a proxy carries the connection.
fn parse_resolved(text: &str) -> Option<(String, u16)> {
    let mut host = None;
    let mut port = 22;
    for line in text.lines() {
        let (key, value) = line.split_once(' ')?;
        let value = value.trim();
        match key {
            "hostname" => host = Some(value.to_owned()),
            "port" => port = value.parse().ok()?,
            "proxycommand" | "proxyjump" if value != "none" => return None,
            _ => {}
        }
    }
    Some((host?, port))
}

fn exit_status(status: std::process::ExitStatus) -> ExitStatus {
    use std::os::unix::process::ExitStatusExt;
    if let Some(code) = status.code() {
        return ExitStatus::Code(code as u32);
    }
    let sig = status.signal().unwrap_or(0);
    let name = match sig {
        1 => "HUP".to_owned(),
        2 => "INT".to_owned(),
        6 => "ABRT".to_owned(),
        9 => "KILL".to_owned(),
        13 => "PIPE".to_owned(),
        15 => "TERM".to_owned(),
        n => format!("signal {n}"),
    };
    ExitStatus::Signal {
        name,
        core_dumped: status.core_dumped(),
        message: String::new(),
    }
}

/// The ssh program's stdout (read) and stdin (write) as one duplex stream.
/// `poll_shutdown` closes stdin, which the remote command sees as EOF.
#[derive(Debug)]
pub struct ProcessStream {
    stdout: ChildStdout,
    stdin: Option<ChildStdin>,
}

impl AsyncRead for ProcessStream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.stdout).poll_read(cx, buf)
    }
}

impl AsyncWrite for ProcessStream {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        match self.stdin.as_mut() {
            Some(s) => Pin::new(s).poll_write(cx, buf),
            None => Poll::Ready(Err(std::io::Error::new(
                std::io::ErrorKind::BrokenPipe,
                "write after shutdown",
            ))),
        }
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.stdin.as_mut() {
            Some(s) => Pin::new(s).poll_flush(cx),
            None => Poll::Ready(Ok(())),
        }
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        if let Some(s) = self.stdin.as_mut() {
            std::task::ready!(Pin::new(s).poll_flush(cx))?;
        }
        self.stdin = None; // closing the pipe is the EOF
        Poll::Ready(Ok(()))
    }
}

/// Whether the ssh `program` is OpenSSH `want` or later (or an ssh that does not say its
/// version as OpenSSH does), and so knows the options that came then: its `-V` asked once
/// per program.
fn openssh_since(program: &std::path::Path, want: (u32, u32)) -> bool {
    static KNOWN: Mutex<Vec<(PathBuf, Option<String>)>> = Mutex::new(Vec::new());
    let mut known = KNOWN.lock().unwrap_or_else(|p| p.into_inner());
    let said = match known.iter().find(|(p, _)| p == program) {
        Some((_, said)) => said.clone(),
        None => {
            let said = version_text(program);
            known.push((program.to_path_buf(), said.clone()));
            said
        }
    };
    said.is_none_or(|said| openssh_at_least(&said, want))
}

/// What `program -V` prints on stderr (where ssh says its version), waiting 5 s at most:
/// `None` when it cannot run or does not end by then (it is killed).
fn version_text(program: &std::path::Path) -> Option<String> {
    use std::io::Read;
    let mut child = std::process::Command::new(program)
        .arg("-V")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .ok()?;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while child.try_wait().ok()?.is_none() {
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            return None;
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    let mut said = String::new();
    child.stderr.take()?.read_to_string(&mut said).ok()?;
    Some(said)
}

/// Whether `ssh -V`'s text names an OpenSSH older than `want`; anything else counts as new.
fn openssh_at_least(said: &str, want: (u32, u32)) -> bool {
    let Some(v) = said.split("OpenSSH_").nth(1) else {
        return true;
    };
    let mut parts = v.split(|c: char| !c.is_ascii_digit());
    let major = parts.next().and_then(|p| p.parse().ok());
    let minor = parts.next().and_then(|p| p.parse().ok());
    match (major, minor) {
        (Some(major), Some(minor)) => (major, minor) >= want,
        _ => true,
    }
}

/// Whether the user chose ssh's ciphers: `-o Ciphers=`, or a `Ciphers` line in the ssh_config
/// ssh reads (the `-F` file, else `~/.ssh/config`, and the system-wide one).
fn chooses_ciphers(o: &SshOptions) -> bool {
    let key = |line: &str| {
        let line = line.trim_start().as_bytes();
        line.len() > 7
            && line[..7].eq_ignore_ascii_case(b"ciphers")
            && (line[7] == b'=' || line[7].is_ascii_whitespace())
    };
    if o.options.iter().any(|opt| key(opt)) {
        return true;
    }
    // As ssh: `-F` names the only file read; else the user's and the system's.
    let files: Vec<PathBuf> = match &o.config_file {
        Some(f) => vec![f.clone()],
        None => {
            let mut files: Vec<PathBuf> = super::config::home_dir()
                .map(|h| h.join(".ssh/config"))
                .into_iter()
                .collect();
            files.push("/etc/ssh/ssh_config".into());
            if let Ok(dir) = std::fs::read_dir("/etc/ssh/ssh_config.d") {
                files.extend(dir.flatten().map(|e| e.path()));
            }
            files
        }
    };
    files
        .iter()
        .any(|f| std::fs::read_to_string(f).is_ok_and(|text| text.lines().any(key)))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Stopping a master that does not answer (here a "program" that sleeps) gives up after
    /// [`MASTER_EXIT_WAIT`], kills it and still removes the private folder.
    #[test]
    fn a_master_that_does_not_answer_is_not_waited_for_forever() {
        let argv = ["sh", "-c", "sleep 600"].map(OsString::from).to_vec();
        let master = Master::create(argv, "host").unwrap();
        std::fs::write(master.socket(), b"").unwrap();
        let dir = master.dir.clone();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            drop(master);
            let _ = tx.send(());
        });
        rx.recv_timeout(MASTER_EXIT_WAIT * 6)
            .expect("dropping the master must not hang");
        assert!(!dir.exists(), "{} was left", dir.display());
    }

    #[test]
    fn argv_is_built_from_options_only() {
        let opts = SshOptions {
            config_file: Some("/tmp/cfg".into()),
            port: Some(2222),
            user: Some("u".into()),
            identity_files: vec!["/k/id".into()],
            jump: Some("j1,j2".into()),
            options: vec!["StrictHostKeyChecking=yes".into()],
            remote_path: Some("/opt/my fastcp".into()),
            ssh_program: Some("/usr/bin/ssh".into()),
            client: Default::default(),
        };
        let p = SshProgram::new("host", &opts).unwrap();
        let argv: Vec<String> = p
            .argv()
            .unwrap()
            .into_iter()
            .map(|a| a.into_string().unwrap())
            .collect();
        assert_eq!(
            argv,
            [
                "/usr/bin/ssh",
                "-T",
                "-x",
                "-a",
                "-o",
                "RemoteCommand=none",
                "-o",
                "PermitLocalCommand=no",
                "-o",
                "ClearAllForwardings=yes",
                "-o",
                "SessionType=default",
                "-o",
                "StdinNull=no",
                "-F",
                "/tmp/cfg",
                "-p",
                "2222",
                "-l",
                "u",
                "-i",
                "/k/id",
                "-J",
                "j1,j2",
                "-o",
                "StrictHostKeyChecking=yes",
                "-c",
                "aes128-gcm@openssh.com,aes256-gcm@openssh.com,chacha20-poly1305@openssh.com,\
                 aes256-ctr,aes192-ctr,aes128-ctr",
                "--",
                "host",
                "'/opt/my fastcp' server",
            ]
        );
        assert!(openssh_at_least(
            "OpenSSH_9.2p1 Debian-2, OpenSSL 3.0",
            (7, 6)
        ));
        assert!(openssh_at_least("OpenSSH_7.6p1", (7, 6)));
        assert!(!openssh_at_least(
            "OpenSSH_7.4p1, OpenSSL 1.0.2k-fips",
            (7, 6)
        ));
        assert!(openssh_at_least("some other ssh", (7, 6)));
        // A program that does not end is given up on, killed, within the bound.
        let dir = tempfile::tempdir().unwrap();
        let silent = dir.path().join("silent-ssh");
        std::fs::write(&silent, "#!/bin/sh\nsleep 60\n").unwrap();
        std::fs::set_permissions(&silent, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .unwrap();
        // (Left to run, it would end after a minute with nothing said: `Some("")`.)
        assert_eq!(version_text(&silent), None);
        assert!(version_text(std::path::Path::new("/nonexistent/ssh")).is_none());
        // The user's ciphers are theirs: no -c then.
        let chosen = SshOptions {
            options: vec!["Ciphers=aes256-ctr".into()],
            ..opts.clone()
        };
        let argv = SshProgram::new("host", &chosen).unwrap().argv().unwrap();
        assert!(!argv.iter().any(|a| a == "-c"), "{argv:?}");
        assert!(SshProgram::new("-oProxyCommand=x", &opts).is_err());
        assert!(SshProgram::new("a b", &opts).is_err());
    }
}

#[cfg(test)]
mod resolved_tests {
    use super::parse_resolved;

    #[test]
    fn ssh_g_output_gives_the_address_unless_a_proxy_carries_it() {
        let plain = "user me\nhostname 10.0.0.7\nport 2222\nproxycommand none\n";
        assert_eq!(parse_resolved(plain), Some(("10.0.0.7".into(), 2222)));
        let jumped = "hostname example.org\nport 22\nproxyjump bastion\n";
        assert_eq!(parse_resolved(jumped), None);
        let proxied = "hostname example.org\nproxycommand nc %h %p\n";
        assert_eq!(parse_resolved(proxied), None);
        assert_eq!(parse_resolved("port 22\n"), None);
    }
}
