//! Test fixtures for fastcp: a throwaway OpenSSH `sshd` on 127.0.0.1.
//!
//! [`Sshd::start`] runs `sshd -D -e -f <temp sshd_config>` (found by [`tools::find`]) on a free loopback port
//! with its own host key, its own `authorized_keys` and a fresh client key pair, all in a
//! temporary directory. It writes a client `ssh_config` for the host alias
//! (`HostName 127.0.0.1`, `Port`, `User` = the current user, `IdentityFile`,
//! `IdentitiesOnly yes`, `UserKnownHostsFile` with the host key already recorded,
//! `StrictHostKeyChecking yes`), so both the system `ssh -F <config> <alias>` and fastcp's
//! own client can log in without touching `~/.ssh`.
//!
//! [`Sshd::start_agent`] starts an `ssh-agent` on a temp socket holding the client key, and
//! [`Sshd::start_jump`] starts a second sshd to use as a `ProxyJump` hop. Every process is
//! killed when its guard is dropped.
//!
//! Works as root (it creates `/run/sshd`, which Debian's sshd needs) and as a normal user
//! (sshd then only lets that user in, which is who the fixture logs in as). The user needs a
//! real login shell: sshd refuses accounts like `nobody` whose shell is `nologin`.
//!
//! ```no_run
//! let sshd = fastcp_testsupport::Sshd::start().unwrap();
//! let status = std::process::Command::new(fastcp_testsupport::tools::require("ssh"))
//!     .arg("-F").arg(sshd.ssh_config())
//!     .arg(sshd.alias())
//!     .arg("true")
//!     .status()
//!     .unwrap();
//! assert!(status.success());
//! ```

pub mod tools;
pub mod tree;
pub mod tty;
pub mod wan;

use std::fs;
use std::io::{self, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A running OpenSSH sshd on 127.0.0.1, killed on drop. Its sessions run the user's login
/// shell without the user's startup files (`~/.bashrc`), except under
/// [`Sshd::start_with_login_shell`], whose shell reads those of an empty home of its own.
#[derive(Debug)]
pub struct Sshd {
    dir: tempfile::TempDir,
    child: Child,
    port: u16,
    alias: String,
    user: String,
    host_key_line: String,
    host_ca_line: Option<String>,
}

/// A running `ssh-agent` holding the fixture's client key, killed on drop.
#[derive(Debug)]
pub struct Agent {
    child: Child,
    socket: PathBuf,
}

impl Agent {
    /// The agent's socket: the value for `SSH_AUTH_SOCK`.
    pub fn socket(&self) -> &Path {
        &self.socket
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Sshd {
    /// Starts an sshd reachable as the host alias `fastcp-test`.
    pub fn start() -> io::Result<Sshd> {
        Sshd::start_named("fastcp-test")
    }

    /// Starts an sshd reachable as `alias` through [`Sshd::ssh_config`].
    pub fn start_named(alias: &str) -> io::Result<Sshd> {
        Sshd::start_logging(alias, "VERBOSE", "", true, false)
    }

    /// Starts an sshd whose host key is certified by a host CA of its own, as
    /// [`cert_authority_line`](Sshd::cert_authority_line) gives for known_hosts; its
    /// [`known_hosts`](Sshd::known_hosts) still lists the plain key.
    pub fn start_with_host_certificate() -> io::Result<Sshd> {
        Sshd::start_logging("fastcp-test", "VERBOSE", "", true, true)
    }

    /// Starts an sshd with no `sftp` subsystem, and the session environment `vars` (as
    /// [`start_with_env`](Sshd::start_with_env)): a host where neither fastcp nor SFTP serves.
    pub fn start_without_sftp(vars: &[(&str, &Path)]) -> io::Result<Sshd> {
        Sshd::start_logging("fastcp-test", "VERBOSE", &set_env(vars), false, false)
    }

    /// Starts an sshd whose sessions get the environment `vars` (sshd's `SetEnv`), such as
    /// `XDG_CACHE_HOME` pointing into a temporary folder, so that a test never writes under
    /// the real home.
    pub fn start_with_env(vars: &[(&str, &Path)]) -> io::Result<Sshd> {
        Sshd::start_logging("fastcp-test", "VERBOSE", &set_env(vars), true, false)
    }

    /// Starts an sshd with `options`, lines of sshd_config that replace the harness's
    /// defaults of the same name, such as `AllowTcpForwarding no` (or its `Subsystem sftp`
    /// line).
    pub fn start_with_options(options: &str) -> io::Result<Sshd> {
        Sshd::start_logging("fastcp-test", "VERBOSE", options, true, false)
    }

    /// Starts an sshd (with the session environment `vars`, as
    /// [`start_with_env`](Sshd::start_with_env)) whose sessions run under the login shell
    /// `shell`, as if /etc/passwd named it for the user: sshd runs in a mount namespace of its
    /// own, where a copy of /etc/passwd with that shell is bind-mounted over the real one.
    /// That copy also gives the user an empty home of its own, [`Sshd::home`], where the
    /// sessions start (and the shell reads its startup files): nothing outside the test's
    /// folders changes. Needs root (`unshare`, `mount`).
    pub fn start_with_login_shell(shell: &Path, vars: &[(&str, &Path)]) -> io::Result<Sshd> {
        Sshd::start_full(
            "fastcp-test",
            "VERBOSE",
            &set_env(vars),
            true,
            false,
            Some(shell),
        )
    }

    /// `log_level` DEBUG1 logs forwarding requests, but sshd then also copies debug lines
    /// into each session's stderr; VERBOSE keeps sessions clean.
    fn start_logging(
        alias: &str,
        log_level: &str,
        extra: &str,
        sftp: bool,
        host_cert: bool,
    ) -> io::Result<Sshd> {
        Sshd::start_full(alias, log_level, extra, sftp, host_cert, None)
    }

    fn start_full(
        alias: &str,
        log_level: &str,
        extra: &str,
        sftp: bool,
        host_cert: bool,
        login_shell: Option<&Path>,
    ) -> io::Result<Sshd> {
        // Fail with the package to install, not a bare "No such file or directory".
        tools::locate("sshd")?;
        tools::locate("ssh-keygen")?;
        // `extra` may name an SFTP subsystem of its own (a `-d` start folder, say).
        let own_subsystem = extra.lines().any(|l| {
            l.trim_start()
                .to_ascii_lowercase()
                .starts_with("subsystem ")
        });
        let subsystem = if sftp && !own_subsystem {
            format!(
                "Subsystem sftp {}\n",
                tools::locate("sftp-server")?.display()
            )
        } else {
            String::new()
        };
        let dir = tempfile::Builder::new().prefix("fastcp-sshd-").tempdir()?;
        let d = dir.path();
        keygen(&d.join("host_ed25519"))?;
        keygen(&d.join("id_ed25519"))?;
        fs::copy(d.join("id_ed25519.pub"), d.join("authorized_keys"))?;
        let mut extra = extra.to_owned();
        if login_shell.is_none() {
            quiet_startup_files(&mut extra);
        }
        let host_ca_line = if host_cert {
            keygen(&d.join("host_ca"))?;
            let out = Command::new(tools::locate("ssh-keygen")?)
                .args(["-q", "-s"])
                .arg(d.join("host_ca"))
                .args(["-I", "fastcp-test-host", "-h", "-n", "127.0.0.1"])
                .arg(d.join("host_ed25519.pub"))
                .stdin(Stdio::null())
                .output()?;
            if !out.status.success() {
                return Err(io::Error::other(format!(
                    "ssh-keygen -s failed: {}",
                    String::from_utf8_lossy(&out.stderr)
                )));
            }
            extra.push_str(&format!(
                "HostCertificate {}\n",
                d.join("host_ed25519-cert.pub").display()
            ));
            let ca = fs::read_to_string(d.join("host_ca.pub"))?;
            Some(ca.split_whitespace().take(2).collect::<Vec<_>>().join(" "))
        } else {
            None
        };
        let host_key_line = fs::read_to_string(d.join("host_ed25519.pub"))?
            .split_whitespace()
            .take(2)
            .collect::<Vec<_>>()
            .join(" ");
        let user = current_user()?;
        ensure_privsep_dir()?;
        if let Some(shell) = login_shell {
            fs::create_dir(d.join("home"))?;
            fs::write(
                d.join("passwd"),
                passwd_with_shell(&user, shell, &d.join("home"))?,
            )?;
        }

        // The free port can be taken between probing and sshd's bind; retry a few times.
        let mut last_err = None;
        for _ in 0..5 {
            let port = free_port()?;
            write_sshd_config(d, port, log_level, &format!("{subsystem}{extra}"))?;
            match spawn_sshd(d, port, login_shell.is_some()) {
                Ok(child) => {
                    let sshd = Sshd {
                        dir,
                        child,
                        port,
                        alias: alias.to_owned(),
                        user,
                        host_key_line,
                        host_ca_line,
                    };
                    fs::write(sshd.known_hosts(), format!("{}\n", sshd.known_hosts_line()))?;
                    fs::write(sshd.ssh_config(), sshd.host_block(alias))?;
                    return Ok(sshd);
                }
                Err(e) => last_err = Some(e),
            }
        }
        Err(last_err.unwrap_or_else(|| io::Error::other("sshd did not start")))
    }

    /// Starts a second sshd, trusting the same client key, to use as a `ProxyJump` hop.
    /// It logs at DEBUG1, so [`log`](Sshd::log) shows each `direct-tcpip` it forwards.
    ///
    /// Its alias is `<alias>-jump`; a `Host` block for it is appended to this server's
    /// [`ssh_config`](Sshd::ssh_config) and its host key to this server's
    /// [`known_hosts`](Sshd::known_hosts). Add `ProxyJump <alias>-jump` where you need it.
    pub fn start_jump(&self) -> io::Result<Sshd> {
        let jump = Sshd::start_logging(&format!("{}-jump", self.alias), "DEBUG1", "", true, false)?;
        fs::copy(self.authorized_keys(), jump.authorized_keys())?;
        let mut known = fs::OpenOptions::new()
            .append(true)
            .open(self.known_hosts())?;
        writeln!(known, "{}", jump.known_hosts_line())?;
        let mut cfg = fs::OpenOptions::new()
            .append(true)
            .open(self.ssh_config())?;
        write!(cfg, "\n{}", self.host_block_for(&jump))?;
        Ok(jump)
    }

    /// Starts an `ssh-agent` on a temp socket and adds the client key to it.
    pub fn start_agent(&self) -> io::Result<Agent> {
        let socket = self
            .dir
            .path()
            .join(format!("agent.{}", std::process::id()));
        let _ = fs::remove_file(&socket);
        let child = Command::new(tools::locate("ssh-agent")?)
            .arg("-D")
            .arg("-a")
            .arg(&socket)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()?;
        let agent = Agent { child, socket };
        // Ready when it accepts a connection: the socket file appears before the agent
        // listens on it.
        wait_until(
            || std::os::unix::net::UnixStream::connect(&agent.socket).is_ok(),
            "ssh-agent socket",
        )?;
        let out = Command::new(tools::locate("ssh-add")?)
            .arg(self.client_key())
            .env("SSH_AUTH_SOCK", agent.socket())
            .stdin(Stdio::null())
            .output()?;
        if !out.status.success() {
            return Err(io::Error::other(format!(
                "ssh-add failed: {}",
                String::from_utf8_lossy(&out.stderr)
            )));
        }
        Ok(agent)
    }

    /// The TCP port sshd listens on (on 127.0.0.1).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The host alias defined in [`Sshd::ssh_config`].
    pub fn alias(&self) -> &str {
        &self.alias
    }

    /// The user the client config logs in as (the current user).
    pub fn user(&self) -> &str {
        &self.user
    }

    /// The temporary directory holding every file of this fixture.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The user's home in the sessions of [`Sshd::start_with_login_shell`]'s sshd: an empty
    /// folder of the harness's own.
    pub fn home(&self) -> PathBuf {
        self.dir.path().join("home")
    }

    /// The client `ssh_config` file (use with `ssh -F`).
    pub fn ssh_config(&self) -> PathBuf {
        self.dir.path().join("ssh_config")
    }

    /// The client `known_hosts` file, with this server's host key recorded.
    pub fn known_hosts(&self) -> PathBuf {
        self.dir.path().join("known_hosts")
    }

    /// The `known_hosts` line for this server: `[127.0.0.1]:PORT ssh-ed25519 AAAA...`.
    pub fn known_hosts_line(&self) -> String {
        format!("[127.0.0.1]:{} {}", self.port, self.host_key_line)
    }

    /// The server's public host key as `ssh-ed25519 AAAA...`.
    pub fn host_public_key(&self) -> &str {
        &self.host_key_line
    }

    /// The server's private host key file (tests can replace it to simulate a changed key).
    pub fn host_key(&self) -> PathBuf {
        self.dir.path().join("host_ed25519")
    }

    /// The client's private key (unencrypted ed25519).
    pub fn client_key(&self) -> PathBuf {
        self.dir.path().join("id_ed25519")
    }

    /// The `authorized_keys` file sshd reads for every user.
    pub fn authorized_keys(&self) -> PathBuf {
        self.dir.path().join("authorized_keys")
    }

    /// What sshd printed so far (it runs with `-e`; `LogLevel VERBOSE`, or `DEBUG1` for a
    /// jump host, so that its log shows the forwarding requests).
    pub fn log(&self) -> String {
        fs::read_to_string(self.dir.path().join("sshd.log")).unwrap_or_default()
    }

    /// The `Host` block for this server, under another alias.
    pub fn host_block(&self, alias: &str) -> String {
        format!(
            "Host {alias}\n  HostName 127.0.0.1\n  Port {}\n  User {}\n  IdentityFile {}\n  \
             IdentitiesOnly yes\n  UserKnownHostsFile {}\n  GlobalKnownHostsFile /dev/null\n  \
             StrictHostKeyChecking yes\n  BatchMode yes\n",
            self.port,
            self.user,
            self.client_key().display(),
            self.known_hosts().display(),
        )
    }

    /// A known_hosts line trusting this server's host CA for 127.0.0.1 on its port, for an
    /// sshd from [`start_with_host_certificate`](Sshd::start_with_host_certificate).
    pub fn cert_authority_line(&self) -> Option<String> {
        self.host_ca_line
            .as_ref()
            .map(|ca| format!("@cert-authority [127.0.0.1]:{} {ca}", self.port))
    }

    /// The `Host` block for `other`, reached with this fixture's key and known_hosts.
    fn host_block_for(&self, other: &Sshd) -> String {
        format!(
            "Host {}\n  HostName 127.0.0.1\n  Port {}\n  User {}\n  IdentityFile {}\n  \
             IdentitiesOnly yes\n  UserKnownHostsFile {}\n  GlobalKnownHostsFile /dev/null\n  \
             StrictHostKeyChecking yes\n  BatchMode yes\n",
            other.alias,
            other.port,
            self.user,
            self.client_key().display(),
            self.known_hosts().display(),
        )
    }

    /// Restarts sshd with a new host key (same port), so its key no longer matches
    /// `known_hosts`.
    pub fn change_host_key(&mut self) -> io::Result<()> {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let d = self.dir.path();
        fs::remove_file(d.join("host_ed25519"))?;
        fs::remove_file(d.join("host_ed25519.pub"))?;
        keygen(&d.join("host_ed25519"))?;
        self.host_key_line = fs::read_to_string(d.join("host_ed25519.pub"))?
            .split_whitespace()
            .take(2)
            .collect::<Vec<_>>()
            .join(" ");
        self.child = spawn_sshd(d, self.port, d.join("passwd").exists())?;
        Ok(())
    }
}

impl Drop for Sshd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn keygen(path: &Path) -> io::Result<()> {
    let out = Command::new(tools::locate("ssh-keygen")?)
        .args(["-q", "-t", "ed25519", "-N", "", "-C", "fastcp-test", "-f"])
        .arg(path)
        .stdin(Stdio::null())
        .output()?;
    if out.status.success() {
        Ok(())
    } else {
        Err(io::Error::other(format!(
            "ssh-keygen failed: {}",
            String::from_utf8_lossy(&out.stderr)
        )))
    }
}

fn current_user() -> io::Result<String> {
    let out = Command::new("id").arg("-un").output()?;
    if !out.status.success() {
        return Err(io::Error::other("`id -un` failed"));
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

/// Debian's sshd refuses to start as root without its privilege separation directory.
fn ensure_privsep_dir() -> io::Result<()> {
    let is_root = Command::new("id")
        .arg("-u")
        .output()
        .map(|o| o.stdout.trim_ascii() == b"0")?;
    if is_root && !Path::new("/run/sshd").exists() {
        fs::create_dir_all("/run/sshd")?;
    }
    Ok(())
}

fn free_port() -> io::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// Keeps the user's shell startup files out of the sessions: bash, run by sshd, reads
/// `~/.bashrc` even for a command, unless `SHLVL` says it is nested. Whatever that file
/// prints or breaks (a tool's setup racing between concurrent logins, say) is the machine's,
/// not the copy's. Adds `SHLVL=1` to `extra`'s `SetEnv` line, or adds that line.
fn quiet_startup_files(extra: &mut String) {
    let mut lines: Vec<String> = extra.lines().map(str::to_owned).collect();
    match lines
        .iter_mut()
        .find(|l| l.to_ascii_lowercase().starts_with("setenv "))
    {
        Some(line) => line.push_str(" SHLVL=1"),
        None => lines.push("SetEnv SHLVL=1".to_owned()),
    }
    *extra = lines.iter().map(|l| format!("{l}\n")).collect();
}

/// sshd's `SetEnv` line for `vars`; none for no vars.
fn set_env(vars: &[(&str, &Path)]) -> String {
    if vars.is_empty() {
        return String::new();
    }
    let set: Vec<String> = vars
        .iter()
        .map(|(k, v)| format!("{k}={}", v.display()))
        .collect();
    format!("SetEnv {}\n", set.join(" "))
}

/// Writes sshd_config: the harness's defaults, then `extra`. sshd keeps the first value of
/// a keyword, so a default that `extra` sets again is left out.
fn write_sshd_config(d: &Path, port: u16, log_level: &str, extra: &str) -> io::Result<()> {
    let defaults = format!(
        "Port {port}\n\
         ListenAddress 127.0.0.1\n\
         HostKey {host_key}\n\
         PidFile none\n\
         AuthorizedKeysFile {auth}\n\
         StrictModes no\n\
         UsePAM no\n\
         PubkeyAuthentication yes\n\
         PasswordAuthentication no\n\
         KbdInteractiveAuthentication no\n\
         PermitRootLogin prohibit-password\n\
         AllowTcpForwarding yes\n\
         AllowStreamLocalForwarding yes\n\
         X11Forwarding no\n\
         PrintMotd no\n\
         MaxSessions 64\n\
         MaxStartups 64\n\
         LogLevel {log_level}\n",
        host_key = d.join("host_ed25519").display(),
        auth = d.join("authorized_keys").display(),
    );
    let keyword = |line: &str| {
        line.split_whitespace()
            .next()
            .unwrap_or("")
            .to_ascii_lowercase()
    };
    let overridden: Vec<String> = extra.lines().map(keyword).collect();
    let mut cfg: String = defaults
        .lines()
        .filter(|line| !overridden.contains(&keyword(line)))
        .map(|line| format!("{line}\n"))
        .collect();
    cfg.push_str(extra);
    fs::write(d.join("sshd_config"), cfg)
}

/// /etc/passwd with `user`'s home and login shell replaced by `home` and `shell`.
fn passwd_with_shell(user: &str, shell: &Path, home: &Path) -> io::Result<String> {
    let passwd = fs::read_to_string("/etc/passwd")?;
    let mut found = false;
    let lines: Vec<String> = passwd
        .lines()
        .map(|line| {
            let mut fields: Vec<&str> = line.split(':').collect();
            if fields.len() == 7 && fields[0] == user {
                found = true;
                fields[5] = home.to_str().unwrap_or("/");
                fields[6] = shell.to_str().unwrap_or("/bin/sh");
            }
            fields.join(":")
        })
        .collect();
    if !found {
        return Err(io::Error::other(format!("{user} is not in /etc/passwd")));
    }
    Ok(lines.join("\n") + "\n")
}

/// Starts sshd with `d`'s config; with `own_passwd`, in a mount namespace of its own where
/// `d/passwd` stands for /etc/passwd (`unshare` execs the shell, which execs sshd: the child
/// is sshd itself).
fn spawn_sshd(d: &Path, port: u16, own_passwd: bool) -> io::Result<Child> {
    let log = fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(d.join("sshd.log"))?;
    let logged_before = log.metadata()?.len() as usize;
    let sshd = tools::locate("sshd")?;
    let mut command = if own_passwd {
        let mut c = Command::new(tools::locate("unshare")?);
        c.args(["--mount", "--propagation", "private", "/bin/sh", "-c"])
            .arg("mount --bind \"$1\" /etc/passwd && shift && exec \"$@\"")
            .arg("sh")
            .arg(d.join("passwd"))
            .arg(sshd);
        c
    } else {
        Command::new(sshd)
    };
    let mut child = command
        .arg("-D")
        .arg("-e")
        .arg("-f")
        .arg(d.join("sshd_config"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()?;
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(status) = child.try_wait()? {
            return Err(io::Error::other(format!(
                "sshd exited with {status}: {}",
                fs::read_to_string(d.join("sshd.log")).unwrap_or_default()
            )));
        }
        // sshd says when it listens. A connection to find out would count against a
        // `MaxStartups` of one until its sshd process ended, and drop a test's first login;
        // it is made only when sshd has not said so within a few seconds (a quiet LogLevel).
        let said = fs::read(d.join("sshd.log")).unwrap_or_default();
        let listening = said
            .get(logged_before..)
            .is_some_and(|s| s.windows(19).any(|w| w == b"Server listening on"));
        if listening
            || (deadline - Instant::now() < Duration::from_secs(7)
                && TcpStream::connect(("127.0.0.1", port)).is_ok())
        {
            return Ok(child);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "sshd did not listen within 10 s",
            ));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn wait_until(mut ready: impl FnMut() -> bool, what: &str) -> io::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !ready() {
        if Instant::now() > deadline {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("{what} not ready within 10 s"),
            ));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn system_ssh_logs_in_with_the_generated_config() {
        let sshd = Sshd::start().unwrap();
        let out = Command::new(tools::require("ssh"))
            .arg("-F")
            .arg(sshd.ssh_config())
            .arg(sshd.alias())
            .arg("echo hello")
            .stdin(Stdio::null())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "ssh failed: {}\nsshd log:\n{}",
            String::from_utf8_lossy(&out.stderr),
            sshd.log()
        );
        assert_eq!(out.stdout, b"hello\n");
    }

    #[test]
    fn agent_holds_the_client_key() {
        let sshd = Sshd::start().unwrap();
        let agent = sshd.start_agent().unwrap();
        let out = Command::new(tools::require("ssh-add"))
            .arg("-l")
            .env("SSH_AUTH_SOCK", agent.socket())
            .output()
            .unwrap();
        assert!(out.status.success());
        assert!(String::from_utf8_lossy(&out.stdout).contains("fastcp-test"));
    }

    #[test]
    fn system_ssh_jumps_through_a_second_sshd() {
        let sshd = Sshd::start().unwrap();
        let jump = sshd.start_jump().unwrap();
        let out = Command::new(tools::require("ssh"))
            .arg("-F")
            .arg(sshd.ssh_config())
            .arg("-J")
            .arg(jump.alias())
            .arg(sshd.alias())
            .arg("echo via-jump")
            .stdin(Stdio::null())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "ssh failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(out.stdout, b"via-jump\n");
        assert!(jump.log().contains("direct-tcpip"), "{}", jump.log());
    }
}
