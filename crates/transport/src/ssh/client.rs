//! The built-in SSH client (russh): connect (through ProxyJump hops), check the host key,
//! authenticate, run commands and open forwarded streams.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use russh::client::{Handle, Msg, Session};
use russh::keys::{PublicKey, PublicKeyOrCertificate};
use russh::{Channel, ChannelId, ChannelMsg, Sig};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, oneshot};

use super::Error;
use super::auth::{self, AuthUsed};
use super::config::{self, AddressFamily, HostConfig, SshOptions, StrictHostKeyChecking};
use super::error::HostKeyRefusal;
use super::known_hosts::{self, HostKeyStatus, fingerprint, key_type_name};
use super::remote::{ExitStatus, ExitWaiter, RemoteProcess, Stderr, launch_command};
use super::stream::SshStream;

/// Tuning of the built-in SSH client.
///
/// The defaults come from measurements on loopback (see BENCHMARKS.md, "SSH transport
/// tuning"). Note that for data *we send*, the peer's window and packet size govern
/// (OpenSSH's sshd advertises 2 MiB / 32 KiB per channel); ours govern data we receive.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SshClientConfig {
    /// Largest receive window per channel, in bytes: how much the peer may send before we
    /// acknowledge. Each connection's channels get the window its round trip needs at
    /// 2 Gbit/s, within this and [`min_window_size`](Self::min_window_size). The round trip
    /// is seen while connecting: from the TCP connection's start to the server's first
    /// bytes (awaited no longer than this window covers), or through a ProxyJump host the
    /// time the forwarded channel took to open; behind a ProxyCommand, where it is not
    /// seen, the window takes this size. Default 8 MiB: room for a bandwidth-delay product
    /// of 1 Gbit/s x 67 ms.
    pub window_size: u32,
    /// Smallest receive window per channel, in bytes. Default 2 MiB, OpenSSH's own: on a
    /// short round trip a larger window only lets the sshd queue more, and a pull through a
    /// loopback sshd measured 10-20% slower with 8 MiB than with 2 to 4 MiB.
    pub min_window_size: u32,
    /// Largest packet the peer may send us, in bytes. Default 32 KiB, OpenSSH's own: 64 KiB
    /// measured no faster.
    pub max_packet_size: u32,
    /// Packets queued per channel before the whole connection waits for that channel's
    /// reader. Default 16 (at most 512 KiB queued per channel with 32 KiB packets); 64
    /// measured no faster.
    pub channel_buffer_size: usize,
    /// Disable Nagle's algorithm on the TCP socket. Default `true`: SSH frames its own
    /// packets, and delaying small ones (handshake, window adjustments) only adds latency.
    pub nodelay: bool,
    /// Cipher preference, most preferred first (`aes128-gcm@openssh.com`,
    /// `aes256-gcm@openssh.com`, `chacha20-poly1305@openssh.com`, `aes*-ctr`). Pass the
    /// order from fastcp-crypto's CPU probe. Default: AES-GCM first, then ChaCha20-Poly1305,
    /// then AES-CTR (for servers that allow nothing else).
    pub ciphers: Vec<String>,
    /// Send a keepalive after this much silence from the server. Default: none.
    pub keepalive_interval: Option<Duration>,
    /// When ssh_config sets no ConnectTimeout: how long to wait for the TCP connection and
    /// the server's host key. A server that accepts the connection and never speaks (a
    /// stalled relay, a wedged sshd) then ends in [`Error::Timeout`] instead of a hang.
    /// Default: none (wait, as ssh does).
    pub default_connect_timeout: Option<Duration>,
    /// What answers the login's questions (passphrases, passwords, an unknown host key)
    /// in place of the terminal. Default: none (the terminal, as ssh asks).
    pub prompt: Option<auth::Prompt>,
}

/// The rate, in bytes per second, a channel's receive window is sized for: 2 Gbit/s, so
/// that a round trip seen as half the path's (a proxy near this end takes the TCP
/// connection, the server's first bytes cross the path once) still gives 1 Gbit/s.
const WINDOW_RATE: f64 = 250e6;

impl Default for SshClientConfig {
    fn default() -> Self {
        SshClientConfig {
            window_size: 8 << 20,
            min_window_size: 2 << 20,
            max_packet_size: 32 << 10,
            channel_buffer_size: 16,
            nodelay: true,
            ciphers: vec![
                "aes128-gcm@openssh.com".into(),
                "aes256-gcm@openssh.com".into(),
                "chacha20-poly1305@openssh.com".into(),
                // Last, for servers restricted to them (ssh offers them too).
                "aes256-ctr".into(),
                "aes192-ctr".into(),
                "aes128-ctr".into(),
            ],
            keepalive_interval: None,
            default_connect_timeout: None,
            prompt: None,
        }
    }
}

impl SshClientConfig {
    /// The receive window for a connection whose round trip measured `rtt` (`None`: not
    /// known): the bandwidth-delay product at [`WINDOW_RATE`], within the configured bounds.
    fn window_for(&self, rtt: Option<Duration>) -> u32 {
        let Some(rtt) = rtt else {
            return self.window_size;
        };
        let product = (rtt.as_secs_f64() * WINDOW_RATE).min(f64::from(u32::MAX)) as u32;
        product.max(self.min_window_size).min(self.window_size)
    }

    /// The round trip that `window` covers at [`WINDOW_RATE`].
    fn round_trip_for(&self, window: u32) -> Duration {
        Duration::from_secs_f64(f64::from(window) / WINDOW_RATE)
    }

    /// russh's configuration, with `window` as every channel's receive window.
    fn to_russh(&self, window: u32) -> Result<russh::client::Config, Error> {
        let mut preferred = russh::Preferred::default();
        if !self.ciphers.is_empty() {
            let names = self
                .ciphers
                .iter()
                .map(|c| {
                    russh::cipher::Name::try_from(c.as_str()).map_err(|()| {
                        Error::Config(format!(
                            "cipher {c:?} is not supported by the built-in client"
                        ))
                    })
                })
                .collect::<Result<Vec<_>, _>>()?;
            preferred.cipher = names.into();
        }
        // As ssh since 8.8: no host key signed with SHA-1 (`ssh-rsa`) unless ssh_config's
        // HostKeyAlgorithms adds it.
        preferred.key = preferred
            .key
            .iter()
            .filter(|k| !matches!(k, russh::keys::Algorithm::Rsa { hash: None }))
            .cloned()
            .collect::<Vec<_>>()
            .into();
        // The NIST curves last, as ssh offers them, for servers restricted to them.
        let mut kex = preferred.kex.to_vec();
        kex.extend([
            russh::kex::ECDH_SHA2_NISTP256,
            russh::kex::ECDH_SHA2_NISTP384,
            russh::kex::ECDH_SHA2_NISTP521,
        ]);
        preferred.kex = kex.into();
        Ok(russh::client::Config {
            client_id: russh::SshId::Standard(
                concat!("SSH-2.0-fastcp_", env!("CARGO_PKG_VERSION")).into(),
            ),
            window_size: window,
            maximum_packet_size: self.max_packet_size,
            channel_buffer_size: self.channel_buffer_size,
            nodelay: self.nodelay,
            preferred,
            keepalive_interval: self.keepalive_interval,
            ..Default::default()
        })
    }
}

struct ExecSinks {
    stderr: mpsc::UnboundedSender<Bytes>,
    exit: Option<oneshot::Sender<ExitStatus>>,
}

type ExecMap = Arc<Mutex<HashMap<ChannelId, ExecSinks>>>;

/// Keeps of `preferred` what ssh_config's algorithm lists allow. A list that leaves none of
/// the built-in client's algorithms hands the connection to the system ssh, which has more.
fn restrict_algorithms(
    preferred: &mut russh::Preferred,
    lists: &config::AlgorithmLists,
) -> Result<(), Error> {
    let none_left = |key: &str, list: &Option<String>| {
        Error::NeedsSystemSsh(format!(
            "{key} {}: none of the built-in client's algorithms",
            list.as_deref().unwrap_or_default()
        ))
    };
    let ciphers = config::allowed(lists.ciphers.as_deref(), false, &preferred.cipher, |c| {
        c.as_ref()
    });
    // What the client tells the server through the key exchange list (extensions, strict
    // key exchange) is no algorithm; ssh sends it whatever KexAlgorithms says.
    let signal = |k: &russh::kex::Name| {
        let k: &str = k.as_ref();
        k.starts_with("ext-info-") || k.starts_with("kex-strict-")
    };
    let (signals, algorithms): (Vec<_>, Vec<_>) = preferred.kex.iter().cloned().partition(signal);
    let mut kex = config::allowed(lists.kex.as_deref(), false, &algorithms, |k| k.as_ref());
    let macs = config::allowed(lists.macs.as_deref(), false, &preferred.mac, |m| m.as_ref());
    let mut keys = config::allowed(lists.host_keys.as_deref(), true, &preferred.key, |k| {
        k.as_str()
    });
    // `ssh-rsa` (SHA-1), left out by default, where the list names it.
    if let Some(list) = lists.host_keys.as_deref()
        && !list.starts_with('-')
        && list
            .trim_start_matches(['+', '^'])
            .split(',')
            .any(|a| a.trim() == "ssh-rsa")
    {
        keys.push(russh::keys::Algorithm::Rsa { hash: None });
    }
    if ciphers.is_empty() {
        return Err(none_left("Ciphers", &lists.ciphers));
    }
    if kex.is_empty() {
        return Err(none_left("KexAlgorithms", &lists.kex));
    }
    // Only ciphers without their own integrity need a MAC.
    let aead = |c: &russh::cipher::Name| {
        matches!(
            c.as_ref(),
            "aes128-gcm@openssh.com" | "aes256-gcm@openssh.com" | "chacha20-poly1305@openssh.com"
        )
    };
    if macs.is_empty() && !ciphers.iter().all(aead) {
        let aead: Vec<_> = ciphers.iter().filter(|c| aead(c)).cloned().collect();
        if aead.is_empty() {
            return Err(none_left("MACs", &lists.macs));
        }
        preferred.cipher = aead.into();
    } else {
        preferred.cipher = ciphers.into();
    }
    if keys.is_empty() {
        return Err(none_left("HostKeyAlgorithms", &lists.host_keys));
    }
    kex.extend(signals);
    preferred.kex = kex.into();
    if !macs.is_empty() {
        preferred.mac = macs.into();
    }
    preferred.key = keys.into();
    Ok(())
}

/// russh's callbacks for one connection: host key check, stderr and exit status.
pub(crate) struct ClientHandler {
    host: Arc<HostConfig>,
    /// Set once the server has sent its host key: ConnectTimeout no longer applies (it
    /// must not cut a host key prompt short).
    key_received: Arc<AtomicBool>,
    /// Set when the host key had changed and StrictHostKeyChecking no let the connection go
    /// on anyway: passwords and keyboard-interactive answers must not go to it then.
    key_changed: Arc<AtomicBool>,
    warnings: Arc<Mutex<Vec<String>>>,
    exec: ExecMap,
    /// What answers a host key question in place of the terminal.
    prompt: Option<auth::Prompt>,
    /// Set when the connection ended because the server did not answer SSH keepalives.
    stopped_answering: Arc<AtomicBool>,
}

impl russh::client::Handler for ClientHandler {
    type Error = Error;

    async fn check_server_key(&mut self, key: &PublicKeyOrCertificate) -> Result<bool, Error> {
        self.key_received.store(true, Ordering::SeqCst);
        match key {
            PublicKeyOrCertificate::PublicKey { key, .. } => {
                verify_host_key(
                    &self.host,
                    key,
                    &self.warnings,
                    &self.key_changed,
                    self.prompt.as_ref(),
                )
                .await?;
                Ok(true)
            }
            PublicKeyOrCertificate::Certificate(_) => Err(Error::HostKeyRejected {
                host: self.host.known_hosts_name(),
                reason: "the server presented a host certificate, which fastcp does not verify"
                    .into(),
            }),
        }
    }

    async fn extended_data(
        &mut self,
        channel: ChannelId,
        ext: u32,
        data: &[u8],
        _session: &mut Session,
    ) -> Result<(), Error> {
        if ext == 1
            && let Some(s) = self.exec.lock().expect("exec map").get(&channel)
        {
            let _ = s.stderr.send(Bytes::copy_from_slice(data));
        }
        Ok(())
    }

    async fn exit_status(
        &mut self,
        channel: ChannelId,
        exit_status: u32,
        _session: &mut Session,
    ) -> Result<(), Error> {
        self.report_exit(channel, ExitStatus::Code(exit_status));
        Ok(())
    }

    async fn exit_signal(
        &mut self,
        channel: ChannelId,
        signal_name: Sig,
        core_dumped: bool,
        error_message: &str,
        _lang_tag: &str,
        _session: &mut Session,
    ) -> Result<(), Error> {
        let name = format!("{signal_name:?}");
        let name = name
            .strip_prefix("Custom(\"")
            .and_then(|n| n.strip_suffix("\")"))
            .unwrap_or(&name)
            .to_owned();
        self.report_exit(
            channel,
            ExitStatus::Signal {
                name,
                core_dumped,
                message: error_message.to_owned(),
            },
        );
        Ok(())
    }

    async fn disconnected(
        &mut self,
        reason: russh::client::DisconnectReason<Error>,
    ) -> Result<(), Error> {
        match reason {
            russh::client::DisconnectReason::ReceivedDisconnect(_) => Ok(()),
            russh::client::DisconnectReason::Error(e) => {
                if matches!(e, Error::Protocol(russh::Error::KeepaliveTimeout)) {
                    self.stopped_answering.store(true, Ordering::SeqCst);
                }
                Err(e)
            }
        }
    }

    async fn channel_close(
        &mut self,
        channel: ChannelId,
        _session: &mut Session,
    ) -> Result<(), Error> {
        // Dropping the sinks ends the stderr stream; a missing exit status becomes
        // `Error::NoExitStatus`.
        self.exec.lock().expect("exec map").remove(&channel);
        Ok(())
    }
}

/// The connection is gone (russh drops its handler when the connection ends, however it
/// ended): every command's stderr ends, and an exit status that never came becomes
/// `Error::NoExitStatus`, as when its channel closes.
impl Drop for ClientHandler {
    fn drop(&mut self) {
        self.exec.lock().unwrap_or_else(|p| p.into_inner()).clear();
    }
}

impl ClientHandler {
    fn report_exit(&self, channel: ChannelId, status: ExitStatus) {
        if let Some(s) = self.exec.lock().expect("exec map").get_mut(&channel)
            && let Some(tx) = s.exit.take()
        {
            let _ = tx.send(status);
        }
    }
}

/// The host's known_hosts files, the user's first.
fn known_hosts_files(host: &HostConfig) -> Vec<std::path::PathBuf> {
    host.user_known_hosts_files
        .iter()
        .chain(&host.global_known_hosts_files)
        .cloned()
        .collect()
}

/// Checks `key` against the host's known_hosts files and its StrictHostKeyChecking policy.
async fn verify_host_key(
    host: &HostConfig,
    key: &PublicKey,
    warnings: &Mutex<Vec<String>>,
    key_changed: &AtomicBool,
    answers: Option<&auth::Prompt>,
) -> Result<(), Error> {
    let name = host.known_hosts_name();
    let files = known_hosts_files(host);
    let read_error = |e: std::io::Error| Error::HostKeyRejected {
        host: name.clone(),
        reason: format!("cannot read known_hosts: {e}"),
    };
    // As ssh, before known_hosts: RequiredRSASize, then RevokedHostKeys.
    let required = host.required_rsa_size.max(known_hosts::RSA_MIN_BITS);
    if let Some(bits) = known_hosts::rsa_bits(key.key_data())
        && bits < required
    {
        return Err(Error::HostKeyRejected {
            host: name,
            reason: format!("its RSA key has {bits} bits, fewer than RequiredRSASize {required}"),
        });
    }
    for revoked in &host.revoked_host_keys {
        let listed = known_hosts::revoked_in(revoked, key).map_err(|e| Error::HostKeyRejected {
            host: name.clone(),
            reason: format!("cannot check RevokedHostKeys {}: {e}", revoked.display()),
        })?;
        if let Some(line) = listed {
            return Err(Error::HostKeyRejected {
                host: name,
                reason: format!(
                    "its {} key {} is revoked by RevokedHostKeys {}:{line}",
                    key_type_name(key),
                    fingerprint(key),
                    revoked.display()
                ),
            });
        }
    }
    let mut status = known_hosts::check(&files, &name, key).map_err(read_error)?;
    // As ssh: a host on another port than 22 with no entry as `[host]:port` is also looked
    // up by its bare name, and its key there is trusted (a key recorded for it on port 22
    // before it moved, or behind a port forward). Only a match counts: another key under
    // the bare name leaves the host unknown, never changed.
    if status == HostKeyStatus::Unknown && host.host_key_alias.is_none() && host.port != 22 {
        let bare = known_hosts::host_port_name(&host.host_name, 22);
        match known_hosts::check(&files, &bare, key).map_err(read_error)? {
            found @ (HostKeyStatus::Known { .. } | HostKeyStatus::Revoked { .. }) => {
                status = found;
            }
            HostKeyStatus::Unknown | HostKeyStatus::Changed { .. } => {}
        }
    }
    let key_type = key_type_name(key);
    let fp = fingerprint(key);
    let first_file = host.user_known_hosts_files.first().cloned();
    match status {
        HostKeyStatus::Known { .. } => Ok(()),
        HostKeyStatus::Revoked { file, line } => Err(Error::HostKeyRejected {
            host: name,
            reason: format!(
                "its {key_type} key {fp} is marked as revoked in {}:{line}",
                file.display()
            ),
        }),
        // As ssh with StrictHostKeyChecking no: a changed key is announced loudly, and the
        // connection goes on with public keys only, so that no password reaches a server that
        // may be someone else's.
        HostKeyStatus::Changed { file, line }
            if host.strict_host_key_checking == StrictHostKeyChecking::No =>
        {
            key_changed.store(true, Ordering::SeqCst);
            warnings.lock().expect("warnings").push(format!(
                "WARNING: REMOTE HOST IDENTIFICATION HAS CHANGED for '{name}': its {key_type} \
                 key is now {fp}, not the one in {}:{line}. StrictHostKeyChecking no lets the \
                 connection go on; password and keyboard-interactive authentication are \
                 disabled to avoid man-in-the-middle attacks.",
                file.display()
            ));
            Ok(())
        }
        HostKeyStatus::Changed { file, line } => Err(Error::HostKeyChanged {
            host: name,
            key_type,
            fingerprint: fp,
            file,
            line,
        }),
        HostKeyStatus::Unknown => {
            let unknown = |refusal| Error::HostKeyUnknown {
                host: name.clone(),
                key_type: key_type.clone(),
                fingerprint: fp.clone(),
                known_hosts: first_file
                    .clone()
                    .unwrap_or_else(|| "~/.ssh/known_hosts".into()),
                refusal,
                aliased: host.host_key_alias.is_some(),
            };
            let refusal = match host.strict_host_key_checking {
                StrictHostKeyChecking::Yes => Some(HostKeyRefusal::Strict),
                StrictHostKeyChecking::AcceptNew | StrictHostKeyChecking::No => None,
                StrictHostKeyChecking::Ask if host.batch_mode => Some(HostKeyRefusal::BatchMode),
                StrictHostKeyChecking::Ask => {
                    let mut prompt = format!(
                        "The authenticity of host '{name}' can't be established.\n\
                         {key_type} key fingerprint is {fp}.\n\
                         Are you sure you want to continue connecting (yes/no/[fingerprint])? "
                    );
                    let fp2 = fp.clone();
                    let custom = answers.cloned();
                    tokio::task::spawn_blocking(move || {
                        let kind = auth::QuestionKind::HostKey;
                        loop {
                            match auth::answer(custom.as_ref(), kind, &prompt, true) {
                                Ok(Some(a)) => {
                                    let a = a.trim();
                                    if a.eq_ignore_ascii_case("yes") || a == fp2 {
                                        return None;
                                    }
                                    // As ssh: an empty answer refuses, and so does the
                                    // end of input (Ctrl-D), which reads as one. A program
                                    // is asked once: any other answer refuses.
                                    if a.is_empty()
                                        || a.eq_ignore_ascii_case("no")
                                        || custom.is_some()
                                    {
                                        return Some(HostKeyRefusal::Declined);
                                    }
                                    // As ssh: asked again, shortly.
                                    prompt = "Please type 'yes', 'no' or the fingerprint: ".into();
                                }
                                // A program that gives no answer refuses.
                                Ok(None) if custom.is_some() => {
                                    return Some(HostKeyRefusal::Declined);
                                }
                                // No terminal to ask on: as `no`.
                                Ok(None) | Err(_) => return Some(HostKeyRefusal::NoTerminal),
                            }
                        }
                    })
                    .await
                    .unwrap_or(Some(HostKeyRefusal::NoTerminal))
                }
            };
            if let Some(refusal) = refusal {
                return Err(unknown(refusal));
            }
            let Some(file) = first_file else {
                // `UserKnownHostsFile none`: accepted, nowhere to record it.
                return Ok(());
            };
            known_hosts::record(&file, &name, key, host.hash_known_hosts).map_err(|e| {
                Error::io(format!("cannot record host key in {}", file.display()), e)
            })?;
            warnings.lock().expect("warnings").push(format!(
                "Permanently added '{name}' ({key_type}) to the list of known hosts."
            ));
            Ok(())
        }
    }
}

/// One authenticated SSH connection (possibly through ProxyJump hops).
///
/// Open as many channels as needed on it ([`exec`](SshSession::exec),
/// [`open_streamlocal`](SshSession::open_streamlocal),
/// [`open_direct_tcpip`](SshSession::open_direct_tcpip)); open more connections to the same
/// host, each served by its own sshd process, with [`reconnect`](SshSession::reconnect).
pub struct SshSession {
    handle: Handle<ClientHandler>,
    exec: ExecMap,
    host: Arc<HostConfig>,
    client: SshClientConfig,
    auth: AuthUsed,
    via: Option<Arc<SshSession>>,
    warnings: Vec<String>,
    remote_path: std::sync::Mutex<Option<String>>,
    launcher: std::sync::Mutex<Option<String>>,
    peer_addr: Option<SocketAddr>,
    /// Set when the connection ended because the server did not answer SSH keepalives.
    stopped_answering: Arc<AtomicBool>,
    /// The keepalives' interval and how many may go unanswered, and whether they were
    /// ssh_config's ServerAliveInterval.
    keepalives: Option<(Duration, usize, bool)>,
    /// The ProxyCommand process carrying the connection, killed with the session.
    _proxy: Option<Box<tokio::process::Child>>,
}

impl std::fmt::Debug for SshSession {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SshSession")
            .field("host", &self.host.alias)
            .field("user", &self.host.user)
            .field("via", &self.via.as_ref().map(|v| &v.host.alias))
            .finish()
    }
}

impl SshSession {
    /// Resolves `destination` (`[user@]host`) through ssh_config and `options`, then
    /// connects, through each ProxyJump hop in turn, checks host keys and authenticates.
    pub async fn connect(destination: &str, options: &SshOptions) -> Result<SshSession, Error> {
        let chain = config::resolve_chain(destination, options)?;
        let s = SshSession::connect_chain(chain, &options.client).await?;
        s.set_remote_path(options.remote_path.clone());
        Ok(s)
    }

    /// Connects through an already resolved chain: hops first, destination last.
    pub async fn connect_chain(
        chain: Vec<HostConfig>,
        client: &SshClientConfig,
    ) -> Result<SshSession, Error> {
        let mut via: Option<Arc<SshSession>> = None;
        let n = chain.len();
        if n == 0 {
            return Err(Error::Config("nothing to connect to".into()));
        }
        let mut warnings = Vec::new();
        for (i, host) in chain.into_iter().enumerate() {
            let mut s = connect_one(Arc::new(host), via.take(), client, None).await?;
            warnings.append(&mut s.warnings);
            if i + 1 == n {
                s.warnings = warnings;
                return Ok(s);
            }
            via = Some(Arc::new(s));
        }
        unreachable!("the loop returns on the last host")
    }

    /// Whether the SSH connection has ended (closed by either side, cut, or stopped
    /// answering its keepalives).
    pub fn is_closed(&self) -> bool {
        self.handle.is_closed()
    }

    /// Opens another connection to the same host (through the same jump connection, if
    /// any), authenticating as this one did without asking again for a passphrase.
    pub async fn reconnect(&self) -> Result<SshSession, Error> {
        let s = connect_one(
            self.host.clone(),
            self.via.clone(),
            &self.client,
            Some(&self.auth),
        )
        .await?;
        s.set_remote_path(self.remote_path());
        s.set_launcher(self.launcher());
        Ok(s)
    }

    /// The destination's resolved settings.
    pub fn host(&self) -> &HostConfig {
        &self.host
    }

    /// Whether this login was typed (a password, keyboard-interactive answers): a
    /// [`reconnect`](Self::reconnect) replays it, but a one-time code would be asked for
    /// again, and a prompt can take longer than any peer waits.
    pub fn login_was_typed(&self) -> bool {
        matches!(self.auth, AuthUsed::Password(_) | AuthUsed::Interactive(_))
    }

    /// The address the TCP connection went to; `None` when reached through ProxyJump.
    pub fn peer_addr(&self) -> Option<SocketAddr> {
        self.peer_addr
    }

    /// [`Error::StoppedAnswering`] once the connection has ended because the server
    /// answered none of the SSH keepalives allowed (ServerAliveInterval x
    /// ServerAliveCountMax, or [`SshClientConfig::keepalive_interval`] and three); `None`
    /// while it is up, or when it ended otherwise.
    pub(crate) fn stopped_answering(&self) -> Option<Error> {
        if !self.stopped_answering.load(Ordering::SeqCst) {
            return None;
        }
        let (interval, count, server_alive) = self.keepalives?;
        Some(Error::StoppedAnswering {
            host: self.host.host_name.clone(),
            port: self.host.port,
            waited: interval.saturating_mul(u32::try_from(count.max(1)).unwrap_or(u32::MAX)),
            server_alive,
        })
    }

    /// Warnings to show the user (for example a host key just recorded in known_hosts).
    pub fn warnings(&self) -> &[String] {
        &self.warnings
    }

    /// Runs `command` through the remote user's shell. The stream is the command's stdin
    /// and stdout; shut it down to send EOF.
    ///
    /// Callers of fastcp use [`start_server`](crate::Transport::start_server), whose
    /// command line is fixed; this method is for tests and tools.
    pub async fn exec(&self, command: &str) -> Result<RemoteProcess<SshStream>, Error> {
        let mut ch = self
            .handle
            .channel_open_session()
            .await
            .map_err(|e| channel_error("session channel", e, ""))?;
        let (etx, erx) = mpsc::unbounded_channel();
        let (xtx, xrx) = oneshot::channel();
        self.exec.lock().expect("exec map").insert(
            ch.id(),
            ExecSinks {
                stderr: etx,
                exit: Some(xtx),
            },
        );
        ch.exec(true, command).await?;
        let early = wait_request_reply(&mut ch)
            .await
            .map_err(|reason| Error::Channel {
                what: "exec".into(),
                reason,
            })?;
        let mut stream = SshStream::new(ch, false);
        stream.prepend(early);
        Ok(RemoteProcess {
            stream,
            stderr: Stderr(erx),
            exit: ExitWaiter::new(xrx),
        })
    }

    /// Starts the subsystem `name` (such as `sftp`) on a new session channel and returns its
    /// stream. Fails with [`Error::Channel`] when the server refuses it (no such subsystem).
    pub async fn open_subsystem(&self, name: &str) -> Result<SshStream, Error> {
        let mut ch = self
            .handle
            .channel_open_session()
            .await
            .map_err(|e| channel_error("session channel", e, ""))?;
        ch.request_subsystem(true, name).await?;
        let early = wait_request_reply(&mut ch)
            .await
            .map_err(|reason| Error::Channel {
                what: format!("subsystem {name}"),
                reason,
            })?;
        let mut stream = SshStream::new(ch, true);
        stream.prepend(early);
        Ok(stream)
    }

    /// Opens a `direct-streamlocal@openssh.com` channel: a stream to the unix socket at
    /// `socket_path` on the remote host, connected by sshd as the remote user.
    pub async fn open_streamlocal(&self, socket_path: &str) -> Result<SshStream, Error> {
        let ch = self
            .handle
            .channel_open_direct_streamlocal(socket_path)
            .await
            .map_err(|e| {
                channel_error(
                    &format!("direct-streamlocal to {socket_path}"),
                    e,
                    "check that the socket exists and that sshd allows it \
                     (AllowStreamLocalForwarding yes or local, DisableForwarding no, and no \
                     no-port-forwarding or restrict on the key)",
                )
            })?;
        Ok(SshStream::new(ch, true))
    }

    /// Opens a `direct-tcpip` channel: a stream to `host:port` as seen from the remote
    /// host (use `127.0.0.1` for the remote loopback).
    pub async fn open_direct_tcpip(&self, host: &str, port: u16) -> Result<SshStream, Error> {
        let ch = self
            .handle
            .channel_open_direct_tcpip(host, u32::from(port), "127.0.0.1", 0)
            .await
            .map_err(|e| {
                channel_error(
                    &format!("direct-tcpip to {host}:{port}"),
                    e,
                    "check that something listens there and that sshd allows it \
                     (AllowTcpForwarding yes or local, DisableForwarding no)",
                )
            })?;
        Ok(SshStream::new(ch, true))
    }

    /// Ends the connection politely.
    pub async fn close(self) -> Result<(), Error> {
        self.handle
            .disconnect(russh::Disconnect::ByApplication, "", "en")
            .await?;
        Ok(())
    }

    /// The program [`start_server`](crate::Transport::start_server) runs on the peer:
    /// `None` for `fastcp` on its `PATH`.
    pub fn remote_path(&self) -> Option<String> {
        self.remote_path
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Names the program [`start_server`](crate::Transport::start_server) runs on the peer
    /// from now on (as `--remote-path` does), such as a binary just deployed there.
    pub fn set_remote_path(&self, path: Option<String>) {
        *self.remote_path.lock().unwrap_or_else(|p| p.into_inner()) = path;
    }

    /// The command line [`start_server`](crate::Transport::start_server) runs when no
    /// remote path is named, in place of `fastcp server` (see [`crate::ssh::server_command`]).
    pub fn launcher(&self) -> Option<String> {
        self.launcher
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Sets [`launcher`](SshSession::launcher).
    pub fn set_launcher(&self, command: Option<String>) {
        *self.launcher.lock().unwrap_or_else(|p| p.into_inner()) = command;
    }

    /// The fixed command line that starts `fastcp server`.
    pub(crate) fn server_command(&self) -> Result<String, Error> {
        launch_command(self.remote_path().as_deref(), self.launcher())
    }
}

/// Waits for the reply to a `want_reply` channel request, keeping any data that arrives
/// before it.
async fn wait_request_reply(ch: &mut Channel<Msg>) -> Result<Vec<Bytes>, String> {
    let mut early = Vec::new();
    loop {
        match ch.wait().await {
            Some(ChannelMsg::Success) => return Ok(early),
            Some(ChannelMsg::Failure) => return Err("the server refused to run the command".into()),
            Some(ChannelMsg::Data { data }) => early.push(data),
            Some(ChannelMsg::Close) | None => {
                return Err("the server closed the channel before running the command".into());
            }
            Some(_) => {}
        }
    }
}

fn channel_error(what: &str, e: russh::Error, hint: &str) -> Error {
    let reason = match e {
        russh::Error::ChannelOpenFailure(f) => {
            let mut r = format!("refused by the server ({f:?})");
            if !hint.is_empty() {
                r.push_str("; ");
                r.push_str(hint);
            }
            r
        }
        other => other.to_string(),
    };
    Error::Channel {
        what: what.to_owned(),
        reason,
    }
}

/// Connects to one host, directly or through `via`, and authenticates.
async fn connect_one(
    host: Arc<HostConfig>,
    via: Option<Arc<SshSession>>,
    client: &SshClientConfig,
    previous: Option<&AuthUsed>,
) -> Result<SshSession, Error> {
    // As ssh does: the host key types known_hosts records for the host are asked for first,
    // so that a host with several keys shows one it is known by (any other would be a
    // changed key).
    let known_types =
        known_hosts::known_algorithms(&known_hosts_files(&host), &host.known_hosts_name());
    // The channels' receive window, from the round trip seen while connecting (`None`:
    // not seen, behind a ProxyCommand).
    let config = |rtt: Option<Duration>| {
        let mut config = client.to_russh(client.window_for(rtt))?;
        if !known_types.is_empty() {
            let known = |a: &russh::keys::Algorithm| {
                known_types.iter().any(|k| {
                    k == a
                        || matches!(
                            (k, a),
                            (
                                russh::keys::Algorithm::Rsa { .. },
                                russh::keys::Algorithm::Rsa { .. }
                            )
                        )
                })
            };
            let (mut first, rest): (Vec<_>, Vec<_>) =
                config.preferred.key.iter().cloned().partition(|a| known(a));
            first.extend(rest);
            config.preferred.key = first.into();
        }
        restrict_algorithms(&mut config.preferred, &host.algorithms)?;
        // ServerAliveInterval from ssh_config or -o wins over the program's default.
        if let Some(interval) = host.server_alive_interval {
            config.keepalive_interval = Some(interval);
            config.keepalive_max = host.server_alive_count_max as usize;
        }
        Ok::<_, Error>(Arc::new(config))
    };
    // A cipher the client lacks fails here, before connecting.
    let checked = config(None)?;
    // As ssh does, a server silent during the login is given up on after
    // ServerAliveInterval x ServerAliveCountMax.
    let login_wait = checked
        .keepalive_interval
        .map(|i| i.saturating_mul(u32::try_from(checked.keepalive_max.max(1)).unwrap_or(u32::MAX)));
    let exec: ExecMap = Arc::default();
    let warnings = Arc::new(Mutex::new(Vec::new()));
    let key_received = Arc::new(AtomicBool::new(false));
    let key_changed = Arc::new(AtomicBool::new(false));
    let peer_addr = Mutex::new(None);
    let keepalives = checked.keepalive_interval.map(|i| {
        (
            i,
            checked.keepalive_max,
            host.server_alive_interval.is_some(),
        )
    });
    let stopped_answering = Arc::new(AtomicBool::new(false));
    let handler = ClientHandler {
        host: host.clone(),
        key_received: key_received.clone(),
        key_changed: key_changed.clone(),
        warnings: warnings.clone(),
        exec: exec.clone(),
        prompt: client.prompt.clone(),
        stopped_answering: stopped_answering.clone(),
    };
    let timeout = host.connect_timeout.or(client.default_connect_timeout);
    let timed_out = |connected| Error::Timeout {
        host: host.host_name.clone(),
        port: host.port,
        timeout: timeout.unwrap_or_default(),
        connect_timeout: host.connect_timeout.is_some(),
        connected,
    };
    // Set once the TCP connection (or the ProxyCommand, or the jump host's channel) is made.
    let connected = AtomicBool::new(false);
    let mut proxy = None;
    let handshake = async {
        match &via {
            None if host.proxy_command.is_some() => {
                let command = host.proxy_command.as_deref().unwrap_or_default();
                let mut child = tokio::process::Command::new("sh")
                    .arg("-c")
                    .arg(command)
                    .stdin(std::process::Stdio::piped())
                    .stdout(std::process::Stdio::piped())
                    .kill_on_drop(true)
                    .spawn()
                    .map_err(|e| Error::Connect {
                        host: host.host_name.clone(),
                        port: host.port,
                        source: std::io::Error::other(format!("ProxyCommand {command:?}: {e}")),
                    })?;
                let (Some(out), Some(inp)) = (child.stdout.take(), child.stdin.take()) else {
                    unreachable!("both piped");
                };
                proxy = Some(Box::new(child));
                let config = config(None)?;
                connected.store(true, Ordering::SeqCst);
                russh::client::connect_stream(config, tokio::io::join(out, inp), handler).await
            }
            None => {
                // A longer wait for the banner would give the largest window anyway.
                let banner_wait = client.round_trip_for(client.window_size);
                let (tcp, rtt) = tcp_connect(&host, timeout, banner_wait).await?;
                connected.store(true, Ordering::SeqCst);
                *peer_addr.lock().expect("peer addr") = tcp.peer_addr().ok();
                if client.nodelay {
                    let _ = tcp.set_nodelay(true);
                }
                let tcp = super::quickack::QuickAck::new(tcp);
                russh::client::connect_stream(config(rtt)?, tcp, handler).await
            }
            Some(jump) => {
                // The channel opens once the jump host has connected onwards: a round trip
                // to the jump host, then one from it to this host.
                let started = Instant::now();
                let stream = jump
                    .open_direct_tcpip(&host.host_name, host.port)
                    .await
                    .map_err(|e| Error::Connect {
                        host: host.host_name.clone(),
                        port: host.port,
                        source: std::io::Error::other(format!("through {}: {e}", jump.host.alias)),
                    })?;
                let config = config(Some(started.elapsed()))?;
                connected.store(true, Ordering::SeqCst);
                russh::client::connect_stream(config, stream, handler).await
            }
        }
    };
    // As with ssh, ConnectTimeout covers the TCP connection and the start of the SSH
    // handshake, up to the server's host key; not a host key prompt.
    let handshook = {
        let mut handshake = std::pin::pin!(handshake);
        match timeout {
            Some(t) => tokio::select! {
                res = &mut handshake => res,
                () = tokio::time::sleep(t) => {
                    if !key_received.load(Ordering::SeqCst) {
                        return Err(timed_out(connected.load(Ordering::SeqCst)));
                    }
                    handshake.await
                }
            },
            None => handshake.await,
        }
    };
    let mut handle = match handshook {
        Ok(handle) => handle,
        Err(e) => return Err(proxy_exited(proxy.as_deref_mut(), &host).await.unwrap_or(e)),
    };
    let auth = if key_changed.load(Ordering::SeqCst) {
        let keys_only = HostConfig {
            password_authentication: false,
            kbd_interactive_authentication: false,
            ..(*host).clone()
        };
        auth::authenticate(
            &mut handle,
            &keys_only,
            previous,
            login_wait,
            client.prompt.as_ref(),
        )
        .await?
    } else {
        auth::authenticate(
            &mut handle,
            &host,
            previous,
            login_wait,
            client.prompt.as_ref(),
        )
        .await?
    };
    let warnings = std::mem::take(&mut *warnings.lock().expect("warnings"));
    Ok(SshSession {
        handle,
        exec,
        host,
        client: client.clone(),
        auth,
        via,
        warnings,
        remote_path: std::sync::Mutex::new(None),
        launcher: std::sync::Mutex::new(None),
        peer_addr: peer_addr.into_inner().expect("peer addr"),
        stopped_answering,
        keepalives,
        _proxy: proxy,
    })
}

/// Connects to each address of `host:port` in turn, each attempt limited by `timeout`.
/// Returns the connection and the round trip it shows: the time from its attempt's start to
/// the server's first bytes (its SSH banner, sent unasked), left unread. A proxy that takes
/// the TCP connection near this end, and only then reaches out, answers the connection
/// quickly, but not with the server's banner. The banner is awaited for `banner_wait` at
/// most (a server that waits for the client to speak first); then the round trip is
/// `None`.
/// Why a connection through a ProxyCommand ended before its handshake did, when the command
/// had exited (it says why itself, on stderr, as it does under ssh): "Disconnected" alone
/// would not say that the connection never reached the host.
async fn proxy_exited(
    proxy: Option<&mut tokio::process::Child>,
    host: &HostConfig,
) -> Option<Error> {
    let child = proxy?;
    let status = tokio::time::timeout(Duration::from_millis(500), child.wait())
        .await
        .ok()?
        .ok()?;
    Some(Error::Connect {
        host: host.host_name.clone(),
        port: host.port,
        source: std::io::Error::other(format!(
            "the ProxyCommand exited ({status}) before the SSH handshake ended"
        )),
    })
}

async fn tcp_connect(
    config: &HostConfig,
    timeout: Option<Duration>,
    banner_wait: Duration,
) -> Result<(TcpStream, Option<Duration>), Error> {
    let (host, port) = (config.host_name.as_str(), config.port);
    let err = |source| Error::Connect {
        host: host.to_owned(),
        port,
        source,
    };
    let addrs: Vec<_> = tokio::net::lookup_host((host, port))
        .await
        .map_err(|e| {
            err(std::io::Error::new(
                e.kind(),
                format!("could not resolve hostname {host}: {e}"),
            ))
        })?
        .filter(|a| config.address_family.allows(a))
        .collect();
    let none = match config.address_family {
        AddressFamily::Any => "no address",
        AddressFamily::Inet => "no IPv4 address (AddressFamily inet)",
        AddressFamily::Inet6 => "no IPv6 address (AddressFamily inet6)",
    };
    let mut last = std::io::Error::new(std::io::ErrorKind::NotFound, none);
    for addr in addrs {
        let started = Instant::now();
        let attempt = TcpStream::connect(addr);
        let res = match timeout {
            Some(t) => match tokio::time::timeout(t, attempt).await {
                Ok(r) => r,
                Err(_) => Err(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    "Connection timed out",
                )),
            },
            None => attempt.await,
        };
        match res {
            Ok(s) => {
                // A failure here fails the handshake that follows, with its own message.
                let rtt = match tokio::time::timeout(banner_wait, s.peek(&mut [0; 1])).await {
                    Ok(_) => Some(started.elapsed()),
                    Err(_) => None,
                };
                return Ok((s, rtt));
            }
            Err(e) => last = e,
        }
    }
    if last.kind() == std::io::ErrorKind::TimedOut {
        return Err(Error::Timeout {
            host: host.to_owned(),
            port,
            timeout: timeout.unwrap_or_default(),
            connect_timeout: config.connect_timeout.is_some(),
            connected: false,
        });
    }
    Err(err(last))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// ssh_config's algorithm lists narrow the client's offers; `ssh-rsa` host keys (SHA-1)
    /// only where a list names them; a list that leaves nothing goes to the system ssh.
    #[test]
    fn algorithm_lists_narrow_the_offers() {
        let base = SshClientConfig::default()
            .to_russh(1 << 20)
            .unwrap()
            .preferred;
        let sha1 = russh::keys::Algorithm::Rsa { hash: None };
        assert!(!base.key.contains(&sha1), "no ssh-rsa by default");
        let with = |lists: config::AlgorithmLists| {
            let mut p = base.clone();
            restrict_algorithms(&mut p, &lists).map(|()| p)
        };
        let p = with(config::AlgorithmLists {
            host_keys: Some("+ssh-rsa".into()),
            ..Default::default()
        })
        .unwrap();
        assert!(p.key.contains(&sha1));
        let p = with(config::AlgorithmLists {
            host_keys: Some("ssh-ed25519*".into()),
            ciphers: Some("aes256-ctr,aes256-gcm@openssh.com".into()),
            macs: Some("hmac-sha2-512".into()),
            ..Default::default()
        })
        .unwrap();
        assert_eq!(&p.key[..], [russh::keys::Algorithm::Ed25519]);
        let names =
            |c: &[russh::cipher::Name]| c.iter().map(|c| c.as_ref().to_owned()).collect::<Vec<_>>();
        assert_eq!(names(&p.cipher), ["aes256-gcm@openssh.com", "aes256-ctr"]);
        assert!(
            p.kex
                .iter()
                .any(|k| AsRef::<str>::as_ref(k).starts_with("kex-strict-"))
        );
        // No MAC left: the AEAD ciphers only; none of those either: the system ssh.
        let p = with(config::AlgorithmLists {
            macs: Some("-*".into()),
            ..Default::default()
        })
        .unwrap();
        assert!(p.cipher.iter().all(|c| !c.as_ref().ends_with("-ctr")));
        let e = with(config::AlgorithmLists {
            ciphers: Some("aes128-ctr".into()),
            macs: Some("-*".into()),
            ..Default::default()
        })
        .unwrap_err();
        assert!(matches!(e, Error::NeedsSystemSsh(_)), "{e}");
    }

    /// `AddressFamily` keeps the addresses of its family only.
    #[tokio::test]
    async fn only_addresses_of_the_address_family_are_connected_to() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let mut host = config::SshConfigFile::parse_str("")
            .unwrap()
            .resolve("127.0.0.1")
            .unwrap();
        host.port = port;
        let wait = Duration::from_millis(1);
        for family in [AddressFamily::Any, AddressFamily::Inet] {
            host.address_family = family;
            assert!(tcp_connect(&host, None, wait).await.is_ok(), "{family:?}");
        }
        host.address_family = AddressFamily::Inet6;
        let e = tcp_connect(&host, None, wait).await.unwrap_err();
        assert!(e.to_string().contains("no IPv6 address"), "{e}");
    }

    #[test]
    fn the_receive_window_covers_the_round_trip_within_its_bounds() {
        let config = SshClientConfig::default();
        let ms = Duration::from_millis;
        // Loopback and a LAN: OpenSSH's 2 MiB.
        assert_eq!(config.window_for(Some(Duration::from_micros(40))), 2 << 20);
        assert_eq!(config.window_for(Some(ms(5))), 2 << 20);
        // 20 ms at 2 Gbit/s: 5 MB.
        assert_eq!(config.window_for(Some(ms(20))), 5_000_000);
        // Longer, or not seen (a ProxyCommand): the largest.
        assert_eq!(config.window_for(Some(ms(50))), 8 << 20);
        assert_eq!(
            config.window_for(Some(Duration::from_secs(u64::MAX))),
            8 << 20
        );
        assert_eq!(config.window_for(None), 8 << 20);
        // Bounds set the wrong way round: the largest wins.
        let crossed = SshClientConfig {
            min_window_size: 16 << 20,
            ..SshClientConfig::default()
        };
        assert_eq!(crossed.window_for(Some(ms(1))), 8 << 20);
        // The banner is awaited no longer than the largest window's round trip: 33.6 ms.
        let wait = config.round_trip_for(config.window_size);
        assert_eq!(wait.as_micros(), 33_554);
        assert_eq!(config.window_for(Some(wait)), 8 << 20);
    }
}
