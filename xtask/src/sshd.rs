//! A benchmark OpenSSH sshd on 127.0.0.1, with its own host key, client key, authorized_keys,
//! known_hosts and client `ssh_config`, all in one temporary directory. Nothing in `~/.ssh` is
//! read or written.
//!
//! Unlike a test fixture it serves the `sftp` subsystem (OpenSSH 9's scp speaks SFTP) and logs
//! only errors, so logging costs nothing during timed runs.

use std::fs;
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

/// Host alias that the generated `ssh_config` defines.
pub const ALIAS: &str = "fastcp-bench";

/// A running benchmark sshd, killed (and its directory removed) on drop.
pub struct Sshd {
    dir: PathBuf,
    child: Child,
    port: u16,
}

impl Sshd {
    /// Starts sshd with every file under `dir` (created; removed on drop).
    pub fn start(dir: &Path) -> Result<Sshd> {
        if dir.exists() {
            fs::remove_dir_all(dir)?;
        }
        fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        keygen(&dir.join("host_ed25519"))?;
        keygen(&dir.join("id_ed25519"))?;
        fs::copy(dir.join("id_ed25519.pub"), dir.join("authorized_keys"))?;
        if is_root() && !Path::new("/run/sshd").exists() {
            fs::create_dir_all("/run/sshd")
                .context("creating /run/sshd (sshd's privilege separation dir)")?;
        }
        let sftp = [
            "/usr/lib/openssh/sftp-server",
            "/usr/libexec/sftp-server",
            "/usr/lib/ssh/sftp-server",
        ]
        .into_iter()
        .find(|p| Path::new(p).exists())
        .unwrap_or("internal-sftp");

        let mut last_err = None;
        for _ in 0..5 {
            let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
            fs::write(
                dir.join("sshd_config"),
                format!(
                    "Port {port}\nListenAddress 127.0.0.1\nHostKey {}\nPidFile none\n\
                     AuthorizedKeysFile {}\nStrictModes no\nUsePAM no\nPubkeyAuthentication yes\n\
                     PasswordAuthentication no\nKbdInteractiveAuthentication no\n\
                     PermitRootLogin prohibit-password\nX11Forwarding no\nPrintMotd no\n\
                     MaxSessions 64\nMaxStartups 64\nSubsystem sftp {sftp}\nLogLevel ERROR\n",
                    dir.join("host_ed25519").display(),
                    dir.join("authorized_keys").display(),
                ),
            )?;
            match spawn(dir, port) {
                Ok(child) => {
                    let sshd = Sshd {
                        dir: dir.to_owned(),
                        child,
                        port,
                    };
                    sshd.write_client_files()?;
                    return Ok(sshd);
                }
                Err(e) => last_err = Some(e),
            }
        }
        Err(last_err.unwrap_or_else(|| anyhow::anyhow!("sshd did not start")))
    }

    fn write_client_files(&self) -> Result<()> {
        let host_key = fs::read_to_string(self.dir.join("host_ed25519.pub"))?;
        let host_key: Vec<&str> = host_key.split_whitespace().take(2).collect();
        fs::write(
            self.known_hosts(),
            format!("[127.0.0.1]:{} {}\n", self.port, host_key.join(" ")),
        )?;
        fs::write(
            self.ssh_config(),
            format!(
                "Host {ALIAS}\n  HostName 127.0.0.1\n  Port {}\n  User {}\n  IdentityFile {}\n  \
                 IdentitiesOnly yes\n  UserKnownHostsFile {}\n  GlobalKnownHostsFile /dev/null\n  \
                 StrictHostKeyChecking yes\n  BatchMode yes\n  Compression no\n",
                self.port,
                current_user()?,
                self.dir.join("id_ed25519").display(),
                self.known_hosts().display(),
            ),
        )?;
        // For tools that take an ssh program but no ssh_config (EScp).
        let wrapper = self.dir.join("ssh-direct");
        fs::write(
            &wrapper,
            format!(
                "#!/bin/sh\nexec ssh -i {} -o IdentitiesOnly=yes -o UserKnownHostsFile={} \
                 -o GlobalKnownHostsFile=/dev/null -o StrictHostKeyChecking=yes -o BatchMode=yes \"$@\"\n",
                self.dir.join("id_ed25519").display(),
                self.known_hosts().display(),
            ),
        )?;
        fs::set_permissions(
            &wrapper,
            std::os::unix::fs::PermissionsExt::from_mode(0o755),
        )?;
        Ok(())
    }

    /// The port sshd listens on (on 127.0.0.1).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The client `ssh_config` (pass with `-F`); it defines the host [`ALIAS`].
    pub fn ssh_config(&self) -> PathBuf {
        self.dir.join("ssh_config")
    }

    /// The client `known_hosts`, holding this server's host key.
    pub fn known_hosts(&self) -> PathBuf {
        self.dir.join("known_hosts")
    }

    /// What sshd logged (errors only).
    pub fn log(&self) -> String {
        fs::read_to_string(self.dir.join("sshd.log")).unwrap_or_default()
    }
}

impl Drop for Sshd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = fs::remove_dir_all(&self.dir);
    }
}

fn spawn(dir: &Path, port: u16) -> Result<Child> {
    let log = fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join("sshd.log"))?;
    let sshd = fastcp_testsupport::tools::locate("sshd")?;
    let mut child = Command::new(&sshd)
        .args(["-D", "-e", "-f"])
        .arg(dir.join("sshd_config"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .with_context(|| format!("starting {}", sshd.display()))?;
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(status) = child.try_wait()? {
            bail!(
                "sshd exited with {status}: {}",
                fs::read_to_string(dir.join("sshd.log"))
                    .unwrap_or_default()
                    .trim()
            );
        }
        if TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return Ok(child);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            bail!("sshd did not listen on port {port} within 10 s");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn keygen(path: &Path) -> Result<()> {
    let out = Command::new("ssh-keygen")
        .args(["-q", "-t", "ed25519", "-N", "", "-C", "fastcp-bench", "-f"])
        .arg(path)
        .stdin(Stdio::null())
        .output()
        .context("running ssh-keygen")?;
    if !out.status.success() {
        bail!(
            "ssh-keygen failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

fn current_user() -> Result<String> {
    let out = Command::new("id")
        .arg("-un")
        .output()
        .context("running id -un")?;
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .map(|o| o.stdout.trim_ascii() == b"0")
        .unwrap_or(false)
}
