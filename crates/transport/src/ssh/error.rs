//! The transport's error type.

use std::io;
use std::path::PathBuf;
use std::time::Duration;

/// Everything that can go wrong while reaching a peer or talking to it.
///
/// Each message says what happened in OpenSSH's words where OpenSSH has them, and what to do
/// about it.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The ssh_config file or an option could not be used.
    #[error("ssh_config: {0}")]
    Config(String),

    /// The configuration asks for what only the system ssh does (a `Match` block, several
    /// `CertificateFile` lines, GSSAPI with a Kerberos ticket, a host certificate authority, a
    /// connection master...): run the
    /// system ssh instead ([`crate::SshOptions::ssh_program`]), as the `fastcp` command does by
    /// itself.
    #[error(
        "{0}: fastcp's built-in SSH client does not do this; the system ssh does (--ssh-program ssh)"
    )]
    NeedsSystemSsh(String),

    /// The TCP connection (or a ProxyJump hop's channel) could not be made.
    #[error(
        "ssh: connect to host {host} port {port}: {source}\n\
         Check the host name and port (ssh_config HostName/Port), and that sshd runs there."
    )]
    Connect {
        /// Host name or address tried.
        host: String,
        /// Port tried.
        port: u16,
        /// What the OS said.
        #[source]
        source: io::Error,
    },

    /// The connection, or the start of the SSH handshake up to the server's host key, took
    /// longer than `timeout`: ssh_config's ConnectTimeout when it sets one, else
    /// [`SshClientConfig::default_connect_timeout`](crate::SshClientConfig::default_connect_timeout).
    #[error("{}", timeout_text(host, *port, *timeout, *connect_timeout, *connected))]
    Timeout {
        /// Host name or address tried.
        host: String,
        /// Port tried.
        port: u16,
        /// The timeout that expired.
        timeout: Duration,
        /// Whether the limit was ssh_config's (or `-o`'s) ConnectTimeout; false: the
        /// client's default, for a host with none.
        connect_timeout: bool,
        /// Whether the connection was made (the server, or something in its place, took it)
        /// and only the server's SSH banner or host key never came.
        connected: bool,
    },

    /// The server stopped answering during the login, after its host key: nothing came back
    /// for ServerAliveInterval x ServerAliveCountMax (or [`crate::SshClientConfig`]'s
    /// keepalives), as ssh gives up on it.
    #[error(
        "ssh: {host} port {port}: the server did not answer for {}s during the login \
         (ServerAliveInterval x ServerAliveCountMax).\n\
         The server may be overloaded or stuck; try again, or raise ServerAliveInterval.",
        timeout.as_secs_f32()
    )]
    LoginTimeout {
        /// Host name or address.
        host: String,
        /// Port.
        port: u16,
        /// How long it was waited for.
        timeout: Duration,
    },

    /// The server stopped answering once logged in: nothing came back for `waited`, as many
    /// SSH keepalives as allowed went unanswered, and the connection was closed.
    #[error(
        "ssh: {host} port {port}: the server stopped answering: nothing came back for {}s \
         ({})",
        waited.as_secs_f32(),
        if *server_alive {
            "ServerAliveInterval x ServerAliveCountMax"
        } else {
            "SSH keepalives"
        }
    )]
    StoppedAnswering {
        /// Host name or address.
        host: String,
        /// Port.
        port: u16,
        /// How long nothing came back: the keepalive interval times the keepalives allowed.
        waited: Duration,
        /// Whether the keepalives were ssh_config's (or `-o`'s) ServerAliveInterval; false:
        /// [`crate::SshClientConfig::keepalive_interval`].
        server_alive: bool,
    },

    /// The server's host key is not in any known_hosts file, and was not trusted: `refusal`
    /// says why.
    #[error("{}", unknown_key_text(self))]
    HostKeyUnknown {
        /// `host` or `[host]:port`, as looked up in known_hosts.
        host: String,
        /// OpenSSH's name of the key type (`ED25519`, `RSA`, `ECDSA`...).
        key_type: String,
        /// `SHA256:...` fingerprint of the key the server sent.
        fingerprint: String,
        /// The known_hosts file a new key would be recorded in.
        known_hosts: PathBuf,
        /// Why the key was not trusted.
        refusal: HostKeyRefusal,
        /// Whether `host` is ssh_config's HostKeyAlias rather than the host's address.
        aliased: bool,
    },

    /// The server's host key differs from the one recorded for this host.
    #[error(
        "@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@\n\
         @    WARNING: REMOTE HOST IDENTIFICATION HAS CHANGED!     @\n\
         @@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@\n\
         IT IS POSSIBLE THAT SOMEONE IS DOING SOMETHING NASTY!\n\
         Someone could be eavesdropping on you right now (man-in-the-middle attack)!\n\
         It is also possible that a host key has just been changed.\n\
         The fingerprint for the {key_type} key sent by the remote host is\n\
         {fingerprint}.\n\
         Please contact your system administrator.\n\
         Add correct host key in {} to get rid of this message.\n\
         Offending {key_type} key in {}:{line}\n\
         Host key for {host} has changed and you have requested strict checking.\n\
         Host key verification failed.",
        file.display(),
        file.display()
    )]
    HostKeyChanged {
        /// `host` or `[host]:port`, as looked up in known_hosts.
        host: String,
        /// OpenSSH's name of the key type.
        key_type: String,
        /// `SHA256:...` fingerprint of the key the server sent.
        fingerprint: String,
        /// The known_hosts file holding the other key.
        file: PathBuf,
        /// Its line number (1-based).
        line: usize,
    },

    /// The server's host key is marked `@revoked`, or is of a kind fastcp cannot verify.
    #[error("Host key verification failed for {host}: {reason}")]
    HostKeyRejected {
        /// `host` or `[host]:port`.
        host: String,
        /// Why.
        reason: String,
    },

    /// No authentication method worked.
    #[error(
        "{user}@{host}: Permission denied (publickey).\nTried: {}.\n\
         Check that one of these keys is in the remote user's authorized_keys, load a key into \
         ssh-agent (ssh-add), or name one with -i / IdentityFile.",
        if tried.is_empty() { "no key at all (no agent, no identity file found)".to_owned() } else { tried.join(", ") }
    )]
    Auth {
        /// Remote user name.
        user: String,
        /// Host as typed.
        host: String,
        /// What was offered, in order.
        tried: Vec<String>,
    },

    /// The server ended the login after too many offers, as sshd does after `MaxAuthTries`
    /// (6 by default) failed ones: ssh's "Too many authentication failures".
    #[error(
        "{user}@{host}: the server closed the connection during the login, after {} offers \
         (sshd does so after MaxAuthTries failed ones, 6 by default: too many authentication \
         failures).\nTried: {}.\n\
         Offer the right key first: name it with -i / IdentityFile and set IdentitiesOnly yes, \
         or hold fewer keys in ssh-agent.",
        tried.len(), tried.join(", ")
    )]
    TooManyAuthFailures {
        /// Remote user name.
        user: String,
        /// Host as typed.
        host: String,
        /// What was offered before the server closed the connection, in order.
        tried: Vec<String>,
    },

    /// A channel could not be opened or was refused by the server.
    #[error("ssh: {what}: {reason}")]
    Channel {
        /// What was being opened, e.g. `direct-streamlocal to /run/x.sock`.
        what: String,
        /// Why it failed, and what to do.
        reason: String,
    },

    /// The operation needs more than one stream, and this transport has only one.
    #[error("{0} cannot open this kind of extra stream")]
    SingleStream(&'static str),

    /// The remote command ended without reporting an exit status (connection lost?).
    #[error("the remote command ended without an exit status (the connection was probably lost)")]
    NoExitStatus,

    /// The SSH protocol layer failed (key exchange, disconnect, broken packet...).
    #[error("ssh: {0}")]
    Protocol(#[from] russh::Error),

    /// A local I/O error (reading a key file, starting the ssh program...).
    #[error("{context}: {source}")]
    Io {
        /// What was being done.
        context: String,
        /// The OS error.
        #[source]
        source: io::Error,
    },
}

/// How to record a host's key with ssh-keyscan (`args` name the host).
fn scan_advice(args: &str, file: &impl std::fmt::Display) -> String {
    format!("add it with `ssh-keyscan {args} >> {file}` (compare the fingerprint first), ")
}

/// Why an unknown host key was not trusted (see [`Error::HostKeyUnknown`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum HostKeyRefusal {
    /// `StrictHostKeyChecking yes`: only recorded keys are trusted.
    Strict,
    /// `StrictHostKeyChecking ask` (ssh's default) with `BatchMode yes`: nothing may be asked.
    BatchMode,
    /// `StrictHostKeyChecking ask` (ssh's default), and no terminal to ask on.
    NoTerminal,
    /// Asked, and the answer was not yes.
    Declined,
}

/// The message of [`Error::Timeout`]: which limit expired, and at which step.
fn timeout_text(
    host: &str,
    port: u16,
    timeout: Duration,
    connect_timeout: bool,
    connected: bool,
) -> String {
    let secs = timeout.as_secs_f32();
    let what = if connected {
        format!(
            "Connection timed out during banner exchange: the server took the connection, but \
             its SSH banner and host key did not come within {secs}s"
        )
    } else {
        format!("Connection timed out after {secs}s")
    };
    let (limit, advice) = if connect_timeout {
        ("ConnectTimeout", "raise ConnectTimeout")
    } else {
        (
            "the client's default limit, as ssh_config sets no ConnectTimeout",
            "set ConnectTimeout",
        )
    };
    format!(
        "ssh: connect to host {host} port {port}: {what} ({limit}).\n\
         Check that the host is up and the port is an SSH server's, or {advice}."
    )
}

/// The message of [`Error::HostKeyUnknown`]: why the key was not trusted, in OpenSSH's words
/// where they fit, and how to trust it.
fn unknown_key_text(e: &Error) -> String {
    let Error::HostKeyUnknown {
        host,
        key_type,
        fingerprint,
        known_hosts,
        refusal,
        aliased,
    } = e
    else {
        unreachable!("only for HostKeyUnknown")
    };
    let why = match refusal {
        // OpenSSH's words.
        HostKeyRefusal::Strict => format!(
            "No {key_type} host key is known for {host} and you have requested strict checking."
        ),
        HostKeyRefusal::BatchMode => format!(
            "No {key_type} host key is known for {host}, and BatchMode yes forbids asking \
             whether to trust it (StrictHostKeyChecking ask, ssh's default)."
        ),
        HostKeyRefusal::NoTerminal => format!(
            "No {key_type} host key is known for {host}, and there is no terminal to ask on \
             whether to trust it (StrictHostKeyChecking ask, ssh's default)."
        ),
        HostKeyRefusal::Declined => {
            format!("The {key_type} host key of {host} is not known, and was not accepted.")
        }
    };
    let file = known_hosts.display();
    // ssh-keyscan names the host as known_hosts does (`[host]:port` off port 22), unless
    // a HostKeyAlias renames it.
    let scan = match host.strip_prefix('[').and_then(|h| h.split_once("]:")) {
        _ if *aliased => format!("add it to {file}, "),
        Some((name, port)) => scan_advice(&format!("-p {port} {name}"), &file),
        None => scan_advice(host, &file),
    };
    format!(
        "{why}\nHost key verification failed.\n\
         The server's {key_type} key fingerprint is {fingerprint}. If you trust it, {scan}\
         connect once with `ssh` on a terminal and answer yes, or connect with \
         -o StrictHostKeyChecking=accept-new to record a host's key the first time."
    )
}

impl Error {
    /// An I/O error while doing `context` (for a [`Transport`](crate::Transport) of one's
    /// own, too).
    pub fn io(context: impl Into<String>, source: io::Error) -> Error {
        Error::Io {
            context: context.into(),
            source,
        }
    }

    /// True for host key failures (unknown, changed or rejected key).
    pub fn is_host_key(&self) -> bool {
        matches!(
            self,
            Error::HostKeyUnknown { .. }
                | Error::HostKeyChanged { .. }
                | Error::HostKeyRejected { .. }
        )
    }
}

impl From<russh::keys::Error> for Error {
    fn from(e: russh::keys::Error) -> Self {
        Error::Protocol(russh::Error::from(e))
    }
}
