//! Host resolution: ssh_config (via `ssh2-config`) plus command-line overrides.
//!
//! The lines in effect for a host are found here, as ssh finds them (`Host` patterns with
//! wildcards and negation, `Include`), and the first value of each key is kept, as ssh
//! keeps it; `ssh2-config` reads the values of HostName, Port, User, IdentityFile and
//! ConnectTimeout. Keys only interactive ssh uses (AddKeysToAgent, ForwardAgent, ...) are
//! passed over, whatever their value.
//! The keys it does not model (IdentitiesOnly, StrictHostKeyChecking, UserKnownHostsFile,
//! GlobalKnownHostsFile, HashKnownHosts, BatchMode, HostKeyAlias, IdentityAgent,
//! PasswordAuthentication, KbdInteractiveAuthentication, NumberOfPasswordPrompts,
//! ServerAliveCountMax) are read here from its "unsupported fields" map. ProxyCommand and
//! ProxyJump are one setting whose first value wins, whichever key gives it: their lines are
//! read here, in order, from the text itself.
//!
//! Paths and commands take ssh's `%` tokens and `${VAR}` where ssh_config's TOKENS and
//! ENVIRONMENT VARIABLES sections say; `~`, `%d` and `%u` come from the password database,
//! as with ssh.
//!
//! `CertificateFile` is read here too (from `-o` and the file), and so are its lines: ssh
//! offers every one, `ssh2-config` keeps only one.
//!
//! As with ssh, `-F` names the only file read; without it `~/.ssh/config` is read, then the
//! system-wide [`SYSTEM_CONFIG`], the first value obtained winning.
//!
//! What only the system ssh does is not guessed at: a `Match` block other than `Match all` at
//! the top of its file (which could connect somewhere else, or as someone else, than `ssh`
//! would), a relative `Include` nested in the system-wide file's, a line of the system-wide
//! files this reader does not take, more than one
//! `CertificateFile` line, GSSAPI when the user holds a Kerberos ticket, CanonicalizeHostname
//! (ssh reads the files again for the canonical name), BindAddress and BindInterface, a
//! connection master (ControlMaster, or one running at ControlPath), a PKCS#11 or
//! security-key provider, KnownHostsCommand, a host certificate authority in known_hosts, a
//! key revocation list in OpenSSH's binary format, a keyword only the system ssh honours or
//! one the built-in client does not know (see the `keywords` module), or an `-o` option the
//! built-in client lacks all fail with [`Error::NeedsSystemSsh`], and the `fastcp` command
//! then runs the system ssh. Keywords a copy needs nothing of are passed over and listed in
//! [`HostConfig::passed_over`].

use std::io::BufReader;
use std::path::{Path, PathBuf};
use std::time::Duration;

use ssh2_config::{HostClause, HostParams, ParseRule, SshConfig};

use super::Error;
use super::client::SshClientConfig;
use super::keywords::{KeywordUse, keyword_use};

/// How unknown host keys are treated (ssh_config `StrictHostKeyChecking`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum StrictHostKeyChecking {
    /// Refuse any host whose key is not already recorded.
    Yes,
    /// Record unknown keys (like `accept-new`) and report a warning; changed keys are still
    /// refused.
    No,
    /// Record unknown keys; refuse changed keys.
    AcceptNew,
    /// Ask on the terminal; without a terminal, behave like `Yes`. OpenSSH's default.
    #[default]
    Ask,
}

impl StrictHostKeyChecking {
    fn parse(v: &str) -> Result<Self, Error> {
        match v.to_ascii_lowercase().as_str() {
            "yes" | "true" => Ok(Self::Yes),
            "no" | "off" | "false" => Ok(Self::No),
            "accept-new" => Ok(Self::AcceptNew),
            "ask" => Ok(Self::Ask),
            _ => Err(Error::Config(format!(
                "StrictHostKeyChecking {v:?}: expected yes, no, accept-new or ask"
            ))),
        }
    }
}

/// Which addresses of a host name are connected to (ssh_config `AddressFamily`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum AddressFamily {
    /// IPv4 and IPv6 addresses alike.
    #[default]
    Any,
    /// IPv4 addresses only.
    Inet,
    /// IPv6 addresses only.
    Inet6,
}

impl AddressFamily {
    fn parse(v: &str) -> Result<Self, Error> {
        match v.to_ascii_lowercase().as_str() {
            "any" => Ok(Self::Any),
            "inet" => Ok(Self::Inet),
            "inet6" => Ok(Self::Inet6),
            _ => Err(Error::Config(format!(
                "AddressFamily {v:?}: expected any, inet or inet6"
            ))),
        }
    }

    /// Whether `addr` is of this family.
    pub fn allows(self, addr: &std::net::SocketAddr) -> bool {
        match self {
            Self::Any => true,
            Self::Inet => addr.is_ipv4(),
            Self::Inet6 => addr.is_ipv6(),
        }
    }
}

/// Everything needed to reach a destination: which ssh_config to read, the settings that
/// override it (as ssh's command-line flags do), and fastcp's own knobs.
///
/// Build it from [`SshOptions::default`] (ssh_config alone decides, as a bare `ssh host`)
/// with its builder methods, one per field, each named as the field it sets; new options
/// arrive as new fields and methods, so the type is `#[non_exhaustive]`.
///
/// ```
/// use fastcp_transport::SshOptions;
///
/// let ssh = SshOptions::default()
///     .port(2222)
///     .identity_files(["/etc/backup/id_ed25519"])
///     .options(["BatchMode=yes", "ConnectTimeout=10"]);
/// assert_eq!(ssh.port, Some(2222));
/// assert_eq!(ssh.options, ["BatchMode=yes", "ConnectTimeout=10"]);
/// ```
///
/// A struct expression does not compile outside this crate, even with `..Default::default()`:
///
/// ```compile_fail,E0639
/// let ssh = fastcp_transport::SshOptions { port: Some(2222), ..Default::default() };
/// ```
#[non_exhaustive]
#[derive(Clone, Debug, Default)]
pub struct SshOptions {
    /// ssh_config to read (`-F`); `None` reads `~/.ssh/config` and then
    /// [`SYSTEM_CONFIG`], each if it exists, as ssh does.
    pub config_file: Option<PathBuf>,
    /// Port (`-P`/`-p`); overrides ssh_config.
    pub port: Option<u16>,
    /// Remote user (`-l`); overrides `user@` in the destination and ssh_config.
    pub user: Option<String>,
    /// Identity files (`-i`), tried before those from ssh_config.
    pub identity_files: Vec<PathBuf>,
    /// ProxyJump hops (`-J host1,user@host2:port`); overrides ssh_config.
    pub jump: Option<String>,
    /// `-o Key=Value` options; override ssh_config and apply to the destination only (not
    /// to jump hosts), as with ssh.
    pub options: Vec<String>,
    /// The program to run on the peer instead of `fastcp` (like rsync's `--rsync-path`).
    /// It is a program path, quoted for the remote shell; `server` is always its argument.
    pub remote_path: Option<String>,
    /// Run this OpenSSH client program instead of the built-in one (`--ssh-program ssh`).
    pub ssh_program: Option<PathBuf>,
    /// The built-in client's tuning (window, packet size, ciphers).
    pub client: SshClientConfig,
}

/// Builder methods, one per field.
impl SshOptions {
    /// Sets [`config_file`](SshOptions::config_file).
    pub fn config_file(mut self, value: impl Into<PathBuf>) -> SshOptions {
        self.config_file = Some(value.into());
        self
    }

    /// Sets [`port`](SshOptions::port).
    pub fn port(mut self, value: u16) -> SshOptions {
        self.port = Some(value);
        self
    }

    /// Sets [`user`](SshOptions::user).
    pub fn user(mut self, value: impl Into<String>) -> SshOptions {
        self.user = Some(value.into());
        self
    }

    /// Sets [`identity_files`](SshOptions::identity_files).
    pub fn identity_files<I>(mut self, value: I) -> SshOptions
    where
        I: IntoIterator,
        I::Item: Into<PathBuf>,
    {
        self.identity_files = value.into_iter().map(Into::into).collect();
        self
    }

    /// Sets [`jump`](SshOptions::jump).
    pub fn jump(mut self, value: impl Into<String>) -> SshOptions {
        self.jump = Some(value.into());
        self
    }

    /// Sets [`options`](SshOptions::options).
    pub fn options<I>(mut self, value: I) -> SshOptions
    where
        I: IntoIterator,
        I::Item: Into<String>,
    {
        self.options = value.into_iter().map(Into::into).collect();
        self
    }

    /// Sets [`remote_path`](SshOptions::remote_path).
    pub fn remote_path(mut self, value: impl Into<String>) -> SshOptions {
        self.remote_path = Some(value.into());
        self
    }

    /// Sets [`ssh_program`](SshOptions::ssh_program).
    pub fn ssh_program(mut self, value: impl Into<PathBuf>) -> SshOptions {
        self.ssh_program = Some(value.into());
        self
    }

    /// Sets [`client`](SshOptions::client).
    pub fn client(mut self, value: SshClientConfig) -> SshOptions {
        self.client = value;
        self
    }
}

/// One host's settings after ssh_config and overrides are applied.
#[non_exhaustive]
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostConfig {
    /// The name as given (alias or host name).
    pub alias: String,
    /// Where to connect (HostName, or the alias).
    pub host_name: String,
    /// TCP port.
    pub port: u16,
    /// Which of the host name's addresses are connected to.
    pub address_family: AddressFamily,
    /// Remote user.
    pub user: String,
    /// Identity files to try, in order (only existing ones are tried).
    pub identity_files: Vec<PathBuf>,
    /// Whether identity files were named explicitly (`-i` or IdentityFile), rather than
    /// OpenSSH's default list.
    pub explicit_identities: bool,
    /// Offer only the identity files (and agent keys matching them).
    pub identities_only: bool,
    /// User certificates to offer (CertificateFile), first, each signed by the agent's or an
    /// identity file's copy of the key it certifies. When there are none, each identity
    /// file's `<file>-cert.pub` beside it is offered after its key, as ssh does.
    pub certificate_files: Vec<PathBuf>,
    /// ProxyJump hops, as written (`[user@]host[:port]`), first hop first.
    pub proxy_jump: Vec<String>,
    /// Host key policy.
    pub strict_host_key_checking: StrictHostKeyChecking,
    /// known_hosts files that are read and written (the first one gets new keys).
    pub user_known_hosts_files: Vec<PathBuf>,
    /// known_hosts files that are only read.
    pub global_known_hosts_files: Vec<PathBuf>,
    /// Write new known_hosts entries hashed.
    pub hash_known_hosts: bool,
    /// TCP connect + SSH handshake time limit.
    pub connect_timeout: Option<Duration>,
    /// Never prompt (passphrases, host keys).
    pub batch_mode: bool,
    /// Name to look host keys up under instead of the host name.
    pub host_key_alias: Option<String>,
    /// Agent socket: `None` disables the agent; default is `$SSH_AUTH_SOCK`.
    pub identity_agent: Option<PathBuf>,
    /// Try password authentication, asked on the terminal (PasswordAuthentication).
    pub password_authentication: bool,
    /// Offer keys and certificates (PubkeyAuthentication; `unbound` and `host-bound` are
    /// yes).
    pub pubkey_authentication: bool,
    /// Try keyboard-interactive authentication (KbdInteractiveAuthentication).
    pub kbd_interactive_authentication: bool,
    /// How many times a password is asked before giving up (NumberOfPasswordPrompts).
    pub number_of_password_prompts: u32,
    /// Send a keepalive after this much silence from the server (ServerAliveInterval).
    pub server_alive_interval: Option<Duration>,
    /// Keepalives left unanswered before the connection is dropped (ServerAliveCountMax,
    /// default 3).
    pub server_alive_count_max: u32,
    /// A command whose stdin and stdout carry the SSH connection instead of a TCP connection
    /// (ProxyCommand), with `%h %p %r %n %%` already expanded; run with `sh -c`.
    pub proxy_command: Option<String>,
    /// The algorithm lists ssh_config sets for the host: the built-in client offers only
    /// what they allow.
    pub algorithms: AlgorithmLists,
    /// Files of revoked host keys, one public key a line (RevokedHostKeys, one or more):
    /// a host that presents one is refused. A key revocation list in OpenSSH's binary
    /// format is left to the system ssh.
    pub revoked_host_keys: Vec<PathBuf>,
    /// The smallest RSA key accepted, in bits, from the host and among the user's keys
    /// (RequiredRSASize, default 1024).
    pub required_rsa_size: u32,
    /// The ssh_config keywords in effect that the built-in client passes over, as written
    /// (`SendEnv`, `ForwardAgent`, ...): a copy needs nothing of them.
    pub passed_over: Vec<String>,
}

/// The algorithm lists of ssh_config (`Ciphers`, `KexAlgorithms`, `MACs`,
/// `HostKeyAlgorithms`, `PubkeyAcceptedAlgorithms`), as written; `None` where it sets none. A system-wide policy (such as
/// Fedora's crypto-policies) says here which algorithms a connection may use.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AlgorithmLists {
    /// `Ciphers`.
    pub ciphers: Option<String>,
    /// `KexAlgorithms`.
    pub kex: Option<String>,
    /// `MACs`.
    pub macs: Option<String>,
    /// `HostKeyAlgorithms`.
    pub host_keys: Option<String>,
    /// `PubkeyAcceptedAlgorithms` (or its old name `PubkeyAcceptedKeyTypes`): the keys and
    /// certificates offered in a login.
    pub pubkey: Option<String>,
}

/// Of `ours` (most preferred first, named by `name`), those an ssh_config algorithm list
/// `list` allows, in our order: a plain list names the only ones allowed (by patterns with
/// `*` and `?` when `plain_patterns`, as ssh takes them in `HostKeyAlgorithms`); `-` removes
/// those its patterns match; `+` adds and `^` puts first algorithms ssh has beside its
/// defaults, which leaves ours as they are.
pub(crate) fn allowed<T: Clone>(
    list: Option<&str>,
    plain_patterns: bool,
    ours: &[T],
    name: impl Fn(&T) -> &str,
) -> Vec<T> {
    let Some(list) = list else {
        return ours.to_vec();
    };
    let matches = |patterns: &str, n: &str| {
        patterns
            .split(',')
            .map(str::trim)
            .any(|p| HostClause::new(p.to_owned(), false).intersects(n))
    };
    match list.chars().next() {
        Some('+' | '^') => ours.to_vec(),
        Some('-') => ours
            .iter()
            .filter(|a| !matches(&list[1..], name(a)))
            .cloned()
            .collect(),
        _ if plain_patterns => ours
            .iter()
            .filter(|a| matches(list, name(a)))
            .cloned()
            .collect(),
        _ => ours
            .iter()
            .filter(|a| list.split(',').map(str::trim).any(|l| l == name(a)))
            .cloned()
            .collect(),
    }
}

impl HostConfig {
    /// The name host keys are recorded under: `host` or `[host]:port`.
    pub fn known_hosts_name(&self) -> String {
        match &self.host_key_alias {
            Some(a) => super::known_hosts::host_port_name(a, 22),
            None => super::known_hosts::host_port_name(&self.host_name, self.port),
        }
    }
}

/// Splits a line of ssh_config into its keyword and the rest, as ssh reads it: the keyword
/// ends at whitespace or `=`, whitespace and `=` before the value are passed over, and a
/// comment or an empty line has none.
fn keyword_and_rest(line: &str) -> Option<(&str, &str)> {
    let line = line.trim();
    if line.is_empty() || line.starts_with('#') {
        return None;
    }
    let end = line
        .find(|c: char| c.is_whitespace() || c == '=')
        .unwrap_or(line.len());
    let (keyword, rest) = line.split_at(end);
    Some((
        keyword,
        rest.trim_start_matches(|c: char| c.is_whitespace() || c == '='),
    ))
}

/// The arguments of an ssh_config line after its keyword, as ssh splits them (OpenSSH's
/// `argv_split`): at whitespace outside quotes (`"` or `'`, which are taken away), `\\`
/// before a quote, a backslash or (outside quotes) a space standing for it, and nothing
/// from a word that starts with `#` on (a comment); a `#` inside a word is part of it.
fn words(rest: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut chars = rest.chars().peekable();
    loop {
        while chars.next_if(|c| c.is_whitespace()).is_some() {}
        if chars.peek().is_none_or(|&c| c == '#') {
            return out;
        }
        let mut word = String::new();
        let mut quote = None;
        while let Some(c) = chars.next() {
            match (c, quote) {
                ('\\', _) => match chars.peek() {
                    Some(&e @ ('"' | '\'' | '\\')) => {
                        word.push(e);
                        chars.next();
                    }
                    Some(' ') if quote.is_none() => {
                        word.push(' ');
                        chars.next();
                    }
                    _ => word.push(c),
                },
                (c, None) if c.is_whitespace() => break,
                ('"' | '\'', None) => quote = Some(c),
                (c, Some(q)) if c == q => quote = None,
                (c, _) => word.push(c),
            }
        }
        out.push(word);
    }
}

/// The files an `Include` line names, as ssh finds them: a relative path is beneath
/// `~/.ssh`, and each may hold wildcards (matches in name order).
fn included_files(args: &str, home: Option<&Path>) -> Vec<PathBuf> {
    let mut files = Vec::new();
    for arg in words(args) {
        let arg = arg.as_str();
        let path = match (arg.strip_prefix("~/"), home) {
            (Some(rest), Some(h)) => h.join(rest),
            _ if Path::new(arg).is_absolute() => PathBuf::from(arg),
            (None, Some(h)) => h.join(".ssh").join(arg),
            (_, None) => continue,
        };
        if let Ok(paths) = glob::glob(&path.to_string_lossy()) {
            files.extend(paths.flatten());
        }
    }
    files
}

/// A line [`keyword_lines`] finds: its value, whether no `Host` or `Match` line comes before
/// it in its file, and how deep in `Include`s its file is (0: the file itself).
struct Found<'a> {
    rest: &'a str,
    top: bool,
    depth: usize,
}

/// Where each line whose keyword is `keyword` and that `keep` keeps is, in `text` and the
/// files it `Include`s (at most 16 deep), in the order ssh reads them.
fn keyword_lines(
    text: &str,
    keyword: &str,
    home: Option<&Path>,
    depth: usize,
    keep: &dyn Fn(Found) -> bool,
) -> Vec<String> {
    let mut found = Vec::new();
    let mut top = true;
    for (i, line) in text.lines().enumerate() {
        let Some((kw, rest)) = keyword_and_rest(line) else {
            continue;
        };
        if kw.eq_ignore_ascii_case(keyword) && keep(Found { rest, top, depth }) {
            found.push(format!("line {}", i + 1));
        }
        if kw.eq_ignore_ascii_case("host") || kw.eq_ignore_ascii_case("match") {
            top = false;
        }
        if !kw.eq_ignore_ascii_case("include") || depth >= 16 {
            continue;
        }
        for p in included_files(rest, home) {
            if let Ok(included) = std::fs::read_to_string(&p) {
                for at in keyword_lines(&included, keyword, home, depth + 1, keep) {
                    found.push(format!("{} {at}", p.display()));
                }
            }
        }
    }
    found
}

/// A ProxyCommand or ProxyJump line in effect for a host, its value as written.
#[derive(Clone, Debug, PartialEq, Eq)]
enum ProxyLine {
    Command(String),
    Jump(String),
}

/// Whether `host` matches a `Host` line's patterns, as ssh matches them: one pattern
/// matches, and no negated one (`!pattern`) does.
fn host_line_matches(patterns: &str, host: &str) -> bool {
    let mut matched = false;
    for p in words(patterns) {
        let p = p.as_str();
        let (pattern, negated) = match p.strip_prefix('!') {
            Some(p) => (p, true),
            None => (p, false),
        };
        if !pattern.is_empty() && HostClause::new(pattern.to_owned(), negated).intersects(host) {
            if negated {
                return false;
            }
            matched = true;
        }
    }
    matched
}

/// The lines in effect for `host` (every line when `host` is `None`), as `(keyword in lower
/// case, value, line)`, in the order ssh reads them, through `Include`s (at most 16 deep).
/// `active` says whether the lines before the first `Host` line apply: an `Include` in a
/// block for other hosts reads nothing that applies. `Host`, `Match` and `Include` lines are
/// left out.
fn lines_in_effect(
    text: &str,
    home: Option<&Path>,
    host: Option<&str>,
    active: bool,
    depth: usize,
    out: &mut Vec<(String, String, String)>,
) {
    let outer = active;
    let mut active = active;
    for line in text.lines() {
        let Some((kw, rest)) = keyword_and_rest(line) else {
            continue;
        };
        let kw = kw.to_ascii_lowercase();
        match kw.as_str() {
            "host" => active = outer && host.is_none_or(|h| host_line_matches(rest, h)),
            "include" if depth < 16 => {
                for p in included_files(rest, home) {
                    if let Ok(included) = std::fs::read_to_string(&p) {
                        lines_in_effect(&included, home, host, active, depth + 1, out);
                    }
                }
            }
            "include" | "match" => {}
            _ if active => out.push((kw, rest.to_owned(), line.trim().to_owned())),
            _ => {}
        }
    }
}

/// The ProxyCommand and ProxyJump lines among `lines` (from [`lines_in_effect`]), in order.
fn proxy_lines(lines: &[(String, String, String)]) -> Vec<ProxyLine> {
    let mut out = Vec::new();
    for (kw, rest, _) in lines {
        match kw.as_str() {
            "proxycommand" => out.push(ProxyLine::Command(rest.clone())),
            "proxyjump" => {
                let value = rest.split('#').next().unwrap_or_default().trim_end();
                out.push(ProxyLine::Jump(value.to_owned()));
            }
            _ => {}
        }
    }
    out
}

/// Keys whose lines add up, rather than the first value winning.
const ADDITIVE_KEYS: &[&str] = &[
    "identityfile",
    "certificatefile",
    "localforward",
    "remoteforward",
    "dynamicforward",
    "sendenv",
    "setenv",
];

/// Keys `ssh2-config` checks the value of more narrowly than ssh does, kept from it: only
/// interactive ssh uses them (`AddKeysToAgent confirm`, `ForwardAgent $SSH_AUTH_SOCK` are
/// ssh's), or they are read here from the lines themselves (`PubkeyAuthentication unbound`).
const UNREAD_KEYS: &[&str] = &[
    "addkeystoagent",
    "forwardagent",
    "compression",
    "pubkeyauthentication",
    "tcpkeepalive",
    "connectionattempts",
    "usekeychain",
];

/// The text `ssh2-config` parses for `lines` (from [`lines_in_effect`]): with `first_wins`,
/// a key given again is left out, as ssh keeps the first value; keys in [`UNREAD_KEYS`] are
/// left out; times (`ConnectTimeout 1m`, `ServerAliveInterval 30s`, `none`) are written in
/// seconds, a port's service name (`Port ssh`) as its number, and a line with a `#` in it as
/// [`parser_line`] writes it.
fn parser_text(lines: &[(String, String, String)], first_wins: bool) -> String {
    let mut seen: Vec<&str> = Vec::new();
    let mut out = String::new();
    for (kw, rest, line) in lines {
        if UNREAD_KEYS.contains(&kw.as_str()) {
            continue;
        }
        if first_wins && !ADDITIVE_KEYS.contains(&kw.as_str()) {
            if seen.contains(&kw.as_str()) {
                continue;
            }
            seen.push(kw);
        }
        let first = words(rest).into_iter().next().unwrap_or_default();
        let number = match kw.as_str() {
            "connecttimeout" | "serveraliveinterval" => seconds(&first),
            "port" => parse_port(&first).map(u64::from),
            _ => None,
        };
        match number {
            Some(n) => out.push_str(&format!("{kw} {n}")),
            None => out.push_str(&parser_line(kw, rest, line)),
        }
        out.push('\n');
    }
    out
}

/// Keys whose value ssh takes whole, as written, `#` and all: a command for `sh -c`.
const COMMAND_KEYS: &[&str] = &[
    "proxycommand",
    "localcommand",
    "remotecommand",
    "knownhostscommand",
];

/// `line` (keyword `kw`, value `rest`) as `ssh2-config` is to read it. That parser ends a
/// line at any `#` outside double quotes, where ssh ends it only at a word that starts with
/// `#` ([`words`]), so a line with a `#` in it is written again: its arguments as ssh splits
/// them (a command's value as one), each holding a `#`, a quote, a backslash or whitespace
/// in double quotes, which `ssh2-config` takes away again (a lone argument unescaped too).
fn parser_line(kw: &str, rest: &str, line: &str) -> String {
    if !line.contains('#') {
        return line.to_owned();
    }
    let args = if COMMAND_KEYS.contains(&kw) {
        vec![rest.to_owned()]
    } else {
        words(rest)
    };
    let mut out = kw.to_owned();
    for arg in args {
        out.push(' ');
        if arg.is_empty() || arg.contains(|c: char| "#\"'\\".contains(c) || c.is_whitespace()) {
            out.push('"');
            out.push_str(&arg.replace('\\', "\\\\").replace('"', "\\\""));
            out.push('"');
        } else {
            out.push_str(&arg);
        }
    }
    out
}

/// Where TCP services are named, as `getservbyname` reads them.
const SERVICES: &str = "/etc/services";

/// A port as ssh reads one (its `a2port`): a number from 1 to 65535, or the name of a TCP
/// service in `/etc/services` (`ssh` is 22).
///
/// ```
/// use fastcp_transport::ssh::config::parse_port;
///
/// assert_eq!(parse_port("2222"), Some(2222));
/// assert_eq!(parse_port("0"), None);
/// assert_eq!(parse_port("no-such-service"), None);
/// ```
pub fn parse_port(s: &str) -> Option<u16> {
    match s.parse() {
        Ok(0) => None,
        Ok(port) => Some(port),
        Err(_) => service_port(&std::fs::read_to_string(SERVICES).ok()?, s),
    }
}

/// The TCP port of the service `name` (or of one it is an alias of) in `services`, the text
/// of an `/etc/services`: `name port/protocol [alias...] [# comment]` a line.
fn service_port(services: &str, name: &str) -> Option<u16> {
    services.lines().find_map(|line| {
        let mut words = line.split('#').next()?.split_whitespace();
        let (service, port) = (words.next()?, words.next()?);
        let (port, protocol) = port.split_once('/')?;
        if protocol != "tcp" || (service != name && !words.any(|alias| alias == name)) {
            return None;
        }
        port.parse().ok().filter(|&port| port != 0)
    })
}

/// A time as ssh_config writes it (`30`, `1m`, `1h30m`, `2W`), in seconds; `none` is 0.
fn seconds(v: &str) -> Option<u64> {
    if v.is_empty() {
        return None;
    }
    if v.eq_ignore_ascii_case("none") {
        return Some(0);
    }
    let mut total: u64 = 0;
    let mut rest = v;
    while !rest.is_empty() {
        let digits = rest
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(rest.len());
        let n: u64 = rest[..digits].parse().ok()?;
        rest = &rest[digits..];
        let unit = match rest.chars().next() {
            None => 1,
            Some(c) => {
                rest = &rest[1..];
                match c.to_ascii_lowercase() {
                    's' => 1,
                    'm' => 60,
                    'h' => 3600,
                    'd' => 86400,
                    'w' => 604800,
                    _ => return None,
                }
            }
        };
        total = total.checked_add(n.checked_mul(unit)?)?;
    }
    Some(total)
}

/// How ssh reaches a host, from its ProxyCommand and ProxyJump lines in the order it reads
/// them (command line first): the two are one setting, and the first value obtained wins.
/// A ProxyJump takes both (a later ProxyCommand is passed over), as does a ProxyCommand
/// (`none` too: a later ProxyJump is passed over); `ProxyJump none` only passes over later
/// ProxyJumps. Returns the jump hosts and the command, at most one of them set.
fn choose_proxy(lines: impl IntoIterator<Item = ProxyLine>) -> (Vec<String>, Option<String>) {
    let mut jump: Option<String> = None;
    let mut command: Option<String> = None;
    for line in lines {
        match line {
            ProxyLine::Command(c) => {
                if command.is_none() {
                    command = Some(c);
                }
            }
            ProxyLine::Jump(j) if j.eq_ignore_ascii_case("none") => {
                if jump.is_none() {
                    jump = Some(j);
                }
            }
            ProxyLine::Jump(j) => {
                if jump.is_none() && command.is_none() {
                    jump = Some(j);
                    command = Some("none".to_owned());
                }
            }
        }
    }
    let jumps = jump
        .filter(|j| !j.eq_ignore_ascii_case("none"))
        .map(|j| split_jumps(&j))
        .unwrap_or_default();
    let command = command.filter(|c| !c.eq_ignore_ascii_case("none"));
    (jumps, command)
}

/// The system-wide ssh_config, read after the user's as ssh reads it (unless `-F` names the
/// only file to read).
pub const SYSTEM_CONFIG: &str = "/etc/ssh/ssh_config";

/// The ssh_config files ssh reads for a connection, parsed: the user's (or `-F`'s), then the
/// system-wide one. For each setting, the first value obtained wins, so the user's file
/// comes first.
#[derive(Debug, Clone)]
pub struct SshConfigFile {
    files: Vec<OneFile>,
    home: Option<PathBuf>,
}

/// What [`SshConfigFile::query`] finds for a host.
struct Queried {
    params: HostParams,
    proxy: Vec<ProxyLine>,
    algorithms: AlgorithmLists,
    /// PubkeyAuthentication's value, as written.
    pubkey: Option<String>,
    /// The keywords passed over, as written.
    passed_over: Vec<String>,
    /// The first value of each keyword in effect (in lower case), its arguments as ssh
    /// splits them: for the keywords the parser does not know.
    first_values: std::collections::HashMap<String, Vec<String>>,
}

/// One ssh_config file, its values checked.
#[derive(Debug, Clone)]
struct OneFile {
    /// The file's text, read again for each host: the lines in effect for it are given to
    /// `ssh2-config`, the first value of each key only.
    text: String,
    /// Where the file's `CertificateFile` lines are: ssh offers each, `ssh2-config` keeps
    /// one, so a host given more than one goes to the system ssh.
    certificate_lines: Vec<String>,
}

impl SshConfigFile {
    /// Reads the files ssh reads: `path` alone (`-F`; `none` reads no file at all), or when
    /// `path` is `None`, `~/.ssh/config` and [`SYSTEM_CONFIG`], each if it exists.
    pub fn load(path: Option<&Path>) -> Result<Self, Error> {
        match path {
            // As ssh's `-F none`: no configuration file at all.
            Some(p) if p.as_os_str() == "none" => Self::parse_str(""),
            Some(p) => Self::load_files(Some(p), None),
            None => {
                let user = home_dir().map(|h| h.join(".ssh/config"));
                let user = user.filter(|p| p.exists());
                let system = Path::new(SYSTEM_CONFIG);
                Self::load_files(user.as_deref(), system.exists().then_some(system))
            }
        }
    }

    /// Reads a user's ssh_config and a system-wide one, as ssh reads `~/.ssh/config` and
    /// [`SYSTEM_CONFIG`]: the user's values win, and a relative `Include` in the system
    /// file is beneath the system file's folder (`/etc/ssh`), not `~/.ssh`.
    ///
    /// ```no_run
    /// use std::path::Path;
    /// use fastcp_transport::ssh::SshConfigFile;
    ///
    /// let files = SshConfigFile::load_files(
    ///     Some(Path::new("/home/me/.ssh/config")),
    ///     Some(Path::new("/etc/ssh/ssh_config")),
    /// )?;
    /// let host = files.resolve("build")?;
    /// println!("{}@{}:{}", host.user, host.host_name, host.port);
    /// # Ok::<(), fastcp_transport::ssh::Error>(())
    /// ```
    pub fn load_files(user: Option<&Path>, system: Option<&Path>) -> Result<Self, Error> {
        let home = home_dir();
        let read = |p: &Path| {
            std::fs::read_to_string(p)
                .map_err(|e| Error::Config(format!("cannot read {}: {e}", p.display())))
        };
        let named = |p: &Path, e: Error| match e {
            Error::Config(m) => Error::Config(format!("{}: {m}", p.display())),
            Error::NeedsSystemSsh(m) => Error::NeedsSystemSsh(format!("{}: {m}", p.display())),
            e => e,
        };
        let mut files = Vec::new();
        for (p, system) in [(user, false), (system, true)] {
            let Some(p) = p else { continue };
            let mut text = read(p)?;
            let parsed = if system {
                text = absolute_includes(&text, p.parent().unwrap_or(Path::new("/")));
                if let Some(at) = nested_relative_include(&text, home.as_deref()) {
                    return Err(Error::NeedsSystemSsh(format!(
                        "{}: a relative Include in {at}, which ssh reads beneath {}",
                        p.display(),
                        p.parent().unwrap_or(Path::new("/")).display()
                    )));
                }
                // What ssh takes there and this reader does not is not the user's to mend.
                OneFile::parse(&text, home.as_deref()).map_err(|e| match e {
                    Error::Config(m) => Error::NeedsSystemSsh(m),
                    e => e,
                })
            } else {
                OneFile::parse(&text, home.as_deref())
            };
            let mut file = parsed.map_err(|e| named(p, e))?;
            for line in &mut file.certificate_lines {
                *line = format!("{} {line}", p.display());
            }
            files.push(file);
        }
        Ok(SshConfigFile { files, home })
    }

    /// Parses ssh_config text (`~` is the home directory the password database gives).
    pub fn parse_str(text: &str) -> Result<Self, Error> {
        Self::parse_with_home(text, home_dir())
    }

    fn parse_with_home(text: &str, home: Option<PathBuf>) -> Result<Self, Error> {
        let file = OneFile::parse(text, home.as_deref())?;
        Ok(SshConfigFile {
            files: vec![file],
            home,
        })
    }

    /// The settings for `host` from every file, the first value obtained winning, the
    /// ProxyCommand and ProxyJump lines in effect, in order, and the keywords passed over.
    /// A keyword only the system ssh honours is [`Error::NeedsSystemSsh`] (see
    /// [`keyword_use`]).
    fn query(&self, host: &str) -> Result<Queried, Error> {
        let mut q = Queried {
            params: SshConfig::default().query(host),
            proxy: Vec::new(),
            algorithms: AlgorithmLists::default(),
            pubkey: None,
            passed_over: Vec::new(),
            first_values: Default::default(),
        };
        let mut in_effect = Vec::new();
        for f in &self.files {
            let mut lines = Vec::new();
            lines_in_effect(
                &f.text,
                self.home.as_deref(),
                Some(host),
                true,
                0,
                &mut lines,
            );
            q.proxy.extend(proxy_lines(&lines));
            for (kw, rest, _) in &lines {
                let slot = match kw.as_str() {
                    "ciphers" => &mut q.algorithms.ciphers,
                    "kexalgorithms" => &mut q.algorithms.kex,
                    "macs" => &mut q.algorithms.macs,
                    "hostkeyalgorithms" => &mut q.algorithms.host_keys,
                    "pubkeyacceptedalgorithms" | "pubkeyacceptedkeytypes" => {
                        &mut q.algorithms.pubkey
                    }
                    // Read here: the parser takes fewer of its values than ssh does.
                    "pubkeyauthentication" => &mut q.pubkey,
                    _ => continue,
                };
                if slot.is_none() {
                    *slot = words(rest).into_iter().next();
                }
            }
            let parsed = parse_lines(&parser_text(&lines, true), self.home.as_deref())?;
            q.params.overwrite_if_none(&parsed.query(host));
            in_effect.extend(lines);
        }
        // The first value of each keyword is the one in effect, as ssh keeps it.
        let ignore_unknown = in_effect
            .iter()
            .find(|(kw, _, _)| kw == "ignoreunknown")
            .map(|(_, rest, _)| rest.clone());
        let mut seen: Vec<&str> = Vec::new();
        for (kw, rest, line) in &in_effect {
            if seen.contains(&kw.as_str()) {
                continue;
            }
            seen.push(kw);
            // A keyword's old name and its new one are one setting: the first line wins.
            let setting = match kw.as_str() {
                "challengeresponseauthentication" => "kbdinteractiveauthentication",
                kw => kw,
            };
            q.first_values
                .entry(setting.to_owned())
                .or_insert_with(|| words(rest));
            let written = line.split(|c: char| c.is_whitespace() || c == '=').next();
            let written = written.unwrap_or(kw).to_owned();
            match keyword_use(kw, rest) {
                KeywordUse::Read => {}
                KeywordUse::PassedOver => q.passed_over.push(written),
                KeywordUse::Unknown
                    if ignore_unknown.as_deref().is_some_and(|patterns| {
                        super::known_hosts::match_pattern_list(&words(patterns).join(","), kw)
                    }) =>
                {
                    q.passed_over.push(written)
                }
                KeywordUse::SystemSsh | KeywordUse::Unknown => {
                    return Err(Error::NeedsSystemSsh(format!(
                        "ssh_config's `{line}` for {host}"
                    )));
                }
            }
        }
        Ok(q)
    }

    /// Resolves `host` (an alias or a name, no `user@`) through these files only.
    pub fn resolve(&self, host: &str) -> Result<HostConfig, Error> {
        self.resolve_with(host, None, &Overrides::default())
    }

    fn resolve_with(
        &self,
        host: &str,
        dest_user: Option<&str>,
        ov: &Overrides,
    ) -> Result<HostConfig, Error> {
        let Queried {
            params: p,
            proxy: proxy_lines,
            algorithms,
            pubkey,
            passed_over,
            first_values,
        } = self.query(host)?;
        let first_value = |key: &str| first_values.get(key).map(|w| w.join(" "));
        let extra_args = |key: &str| -> Option<Vec<String>> {
            p.unsupported_fields
                .get(key)
                .map(|args| args.iter().map(|a| unquote(a)).collect())
        };
        let extra = |key: &str| -> Option<String> { extra_args(key).map(|a| a.join(" ")) };
        // Keys ssh2-config leaves to us, whether it knows them (unsupported) or not (ignored).
        let any = |key: &str| -> Option<String> {
            // The parser keeps a keyword it does not know as written.
            let ignored = p.ignored_fields.iter();
            extra(key).or_else(|| {
                ignored
                    .filter(|(k, _)| k.eq_ignore_ascii_case(key))
                    .map(|(_, args)| args.join(" "))
                    .next()
            })
        };
        // HostName takes `%h`; the name as given takes no tokens.
        let mut host_name = match ov.host_name.clone().or(p.host_name.clone()) {
            Some(h) => expand("HostName", &h, |c| (c == 'h').then(|| host.to_owned()))?,
            None => host.to_owned(),
        };
        // As ssh: the name connected to (and looked up in known_hosts) is lowercased, an
        // IPv6 address (whose zone may be an interface's name) excepted.
        if !host_name.contains(':') {
            host_name.make_ascii_lowercase();
        }
        let port = ov.port.or(p.port).unwrap_or(22);
        if port == 0 {
            // As ssh: "Bad port '0'".
            return Err(Error::Config(format!("{host}: Port 0: bad port")));
        }
        let address_family = match ov.address_family {
            Some(f) => f,
            None => extra("addressfamily")
                .map(|v| AddressFamily::parse(&v))
                .transpose()?
                .unwrap_or_default(),
        };
        let user = ov
            .user
            .clone()
            .or(dest_user.map(str::to_owned))
            .or(p.user.clone())
            .unwrap_or_else(local_user);
        let host_key_alias = ov.host_key_alias.clone().or(extra("hostkeyalias"));
        let tokens = Tokens {
            home: self.home.as_deref(),
            host: &host_name,
            alias: host,
            port,
            user: &user,
            key_alias: host_key_alias.as_deref().unwrap_or(host),
        };

        let mut identity_files: Vec<PathBuf> = ov.identity_files.clone();
        identity_files.extend(p.identity_file.clone().unwrap_or_default());
        let explicit_identities = !identity_files.is_empty();
        let identity_files: Vec<PathBuf> = if explicit_identities {
            identity_files
                .iter()
                .map(|f| tokens.path("IdentityFile", f))
                .collect::<Result<_, _>>()?
        } else {
            default_identity_files(self.home.as_deref())
        };

        let bool_opt = |key: &str, ovv: Option<bool>| -> Result<Option<bool>, Error> {
            if ovv.is_some() {
                return Ok(ovv);
            }
            extra(key).map(|v| parse_yes_no(key, &v)).transpose()
        };
        let identities_only = bool_opt("identitiesonly", ov.identities_only)?.unwrap_or(false);
        let batch_mode = bool_opt("batchmode", ov.batch_mode)?.unwrap_or(false);
        let mut password_authentication =
            bool_opt("passwordauthentication", ov.password_authentication)?.unwrap_or(true);
        let mut pubkey_authentication = match ov.pubkey_authentication {
            Some(v) => v,
            None => pubkey
                .map(|v| parse_pubkey_authentication(&v))
                .transpose()?
                .unwrap_or(true),
        };
        let mut kbd_interactive_authentication = match ov.kbd_interactive_authentication {
            Some(v) => v,
            None => first_value("kbdinteractiveauthentication")
                .map(|v| parse_yes_no("KbdInteractiveAuthentication", &v))
                .transpose()?
                .unwrap_or(true),
        };
        // PreferredAuthentications: the methods it leaves out are not tried (those the
        // built-in client has, in its own order).
        let preferred = ov.preferred_authentications.clone();
        if let Some(list) = preferred.or(first_value("preferredauthentications")) {
            let named = |m: &str| list.split(',').any(|l| l.trim().eq_ignore_ascii_case(m));
            if !["publickey", "keyboard-interactive", "password"]
                .iter()
                .any(|m| named(m))
            {
                return Err(Error::NeedsSystemSsh(format!(
                    "PreferredAuthentications {list} for {host}"
                )));
            }
            pubkey_authentication &= named("publickey");
            password_authentication &= named("password");
            kbd_interactive_authentication &= named("keyboard-interactive");
        }
        let required_rsa_size = match ov.required_rsa_size {
            Some(n) => n,
            None => first_value("requiredrsasize")
                .map(|v| parse_number("RequiredRSASize", &v))
                .transpose()?
                .unwrap_or(1024),
        };
        let number_of_password_prompts = match ov.number_of_password_prompts {
            Some(n) => n,
            None => extra("numberofpasswordprompts")
                .map(|v| parse_number("NumberOfPasswordPrompts", &v))
                .transpose()?
                .unwrap_or(3),
        };
        let hash_known_hosts = bool_opt("hashknownhosts", ov.hash_known_hosts)?.unwrap_or(false);
        // One file or more (as newer OpenSSH takes them); `none` is none.
        let revoked_files = match &ov.revoked_host_keys {
            Some(v) => words(v),
            None => first_values
                .get("revokedhostkeys")
                .cloned()
                .unwrap_or_default(),
        };
        let mut revoked_host_keys = Vec::new();
        for file in revoked_files {
            if file.eq_ignore_ascii_case("none") {
                continue;
            }
            let file = tokens.path("RevokedHostKeys", Path::new(&file))?;
            if super::known_hosts::is_key_revocation_list(&file) {
                return Err(Error::NeedsSystemSsh(format!(
                    "RevokedHostKeys {}, a key revocation list, for {host}",
                    file.display()
                )));
            }
            revoked_host_keys.push(file);
        }
        let strict_host_key_checking = match &ov.strict {
            Some(s) => *s,
            None => extra("stricthostkeychecking")
                .map(|v| StrictHostKeyChecking::parse(&v))
                .transpose()?
                .unwrap_or_default(),
        };
        // Each file an argument of its own: a quoted one may hold a space.
        let user_known_hosts_files = match ov
            .user_known_hosts
            .as_deref()
            .map(words)
            .or(extra_args("userknownhostsfile"))
        {
            Some(v) => v
                .iter()
                .filter(|f| !f.eq_ignore_ascii_case("none"))
                .map(|f| tokens.path("UserKnownHostsFile", Path::new(f)))
                .collect::<Result<_, _>>()?,
            None => match &self.home {
                Some(h) => vec![h.join(".ssh/known_hosts"), h.join(".ssh/known_hosts2")],
                None => vec![],
            },
        };
        let global_known_hosts_files = match ov
            .global_known_hosts
            .as_deref()
            .map(words)
            .or(extra_args("globalknownhostsfile"))
        {
            // No tokens here, as ssh has it.
            Some(v) => v
                .iter()
                .filter(|f| !f.eq_ignore_ascii_case("none"))
                .map(|f| tilde("GlobalKnownHostsFile", f, self.home.as_deref()).map(PathBuf::from))
                .collect::<Result<_, _>>()?,
            None => vec![
                PathBuf::from("/etc/ssh/ssh_known_hosts"),
                PathBuf::from("/etc/ssh/ssh_known_hosts2"),
            ],
        };
        let mut proxy = ov.proxy.clone();
        proxy.extend(proxy_lines);
        let (proxy_jump, proxy_command) = choose_proxy(proxy);
        let connect_timeout = ov
            .connect_timeout
            .or(p.connect_timeout)
            .filter(|d| !d.is_zero());
        // As ssh: CertificateFile from `-o` first, then ssh_config's.
        let mut certificate_files = ov.certificate_files.clone();
        if let Some(f) = &p.certificate_file {
            let lines: Vec<&str> = self
                .files
                .iter()
                .flat_map(|f| &f.certificate_lines)
                .map(String::as_str)
                .collect();
            if lines.len() > 1 {
                return Err(Error::NeedsSystemSsh(format!(
                    "several CertificateFile lines in ssh_config ({}) for {host}",
                    lines.join(", ")
                )));
            }
            certificate_files.push(f.clone());
        }
        let certificate_files: Vec<PathBuf> = certificate_files
            .iter()
            .map(|f| tokens.path("CertificateFile", f))
            .collect::<Result<_, _>>()?;
        for key in ["pkcs11provider", "securitykeyprovider", "knownhostscommand"] {
            if any(key).is_some_and(|v| !v.eq_ignore_ascii_case("none")) {
                return Err(Error::NeedsSystemSsh(format!("{key} for {host}")));
            }
        }
        // The connection's source address: a firewall may let only that one through.
        if let Some(a) = p.bind_address.as_ref().or(p.bind_interface.as_ref()) {
            return Err(Error::NeedsSystemSsh(format!(
                "BindAddress or BindInterface {a} for {host}"
            )));
        }
        // ssh then reads the files again for the canonical name, or the HostName, whose
        // `Host` blocks may name another user, port or key.
        if any("canonicalizehostname")
            .is_some_and(|v| !v.eq_ignore_ascii_case("no") && !v.eq_ignore_ascii_case("false"))
        {
            return Err(Error::NeedsSystemSsh(format!(
                "canonicalizehostname for {host}"
            )));
        }
        if any("controlmaster").is_some_and(|v| !v.eq_ignore_ascii_case("no")) {
            return Err(Error::NeedsSystemSsh(format!("controlmaster for {host}")));
        }
        // With a ControlPath and no ControlMaster, ssh goes through a master already running
        // there (one started by hand with `ssh -M`), which may hold the only login.
        if let Some(v) = any("controlpath").filter(|v| !v.eq_ignore_ascii_case("none")) {
            // A token only a newer ssh knows: it may name a running master all the same.
            let socket = tokens
                .path("ControlPath", Path::new(&v))
                .map_err(|e| Error::NeedsSystemSsh(format!("{e} for {host}")))?;
            if is_socket(&socket) {
                return Err(Error::NeedsSystemSsh(format!(
                    "a connection master at ControlPath {} for {host}",
                    socket.display()
                )));
            }
        }
        // ssh tries GSSAPI first, and without a Kerberos ticket it fails there and goes on to
        // the other methods, as the built-in client does. Debian's and Fedora's system-wide
        // files set it for every host.
        if any("gssapiauthentication").is_some_and(|v| !v.eq_ignore_ascii_case("no"))
            && has_kerberos_ticket()
        {
            return Err(Error::NeedsSystemSsh(format!(
                "gssapiauthentication for {host}, with a Kerberos ticket"
            )));
        }
        let identity_agent = match ov.identity_agent.clone().or(extra("identityagent")) {
            Some(v) if v.eq_ignore_ascii_case("none") => None,
            Some(v) if v == "SSH_AUTH_SOCK" => std::env::var_os("SSH_AUTH_SOCK").map(PathBuf::from),
            // `$NAME` (not `${NAME}`): the variable holds the socket's path.
            Some(v) if v.starts_with('$') && !v.starts_with("${") => {
                std::env::var_os(&v[1..]).map(PathBuf::from)
            }
            Some(v) => Some(tokens.path("IdentityAgent", Path::new(&v))?),
            None => std::env::var_os("SSH_AUTH_SOCK")
                .filter(|s| !s.is_empty())
                .map(PathBuf::from),
        };
        // ProxyCommand: its tokens expanded now, run through `sh -c` when connecting.
        let proxy_command = proxy_command
            .map(|pc| {
                expand("ProxyCommand", &pc, |c| match c {
                    'h' => Some(host_name.clone()),
                    'n' => Some(host.to_owned()),
                    'p' => Some(port.to_string()),
                    'r' => Some(user.clone()),
                    _ => None,
                })
            })
            .transpose()?;
        let server_alive_interval = ov
            .server_alive_interval
            .or(p.server_alive_interval)
            .filter(|d| !d.is_zero());
        let server_alive_count_max = match ov.server_alive_count_max {
            Some(n) => n,
            None => extra("serveralivecountmax")
                .map(|v| parse_number("ServerAliveCountMax", &v))
                .transpose()?
                .unwrap_or(3),
        };
        let config = HostConfig {
            alias: host.to_owned(),
            host_name,
            port,
            address_family,
            user,
            identity_files,
            explicit_identities,
            identities_only,
            certificate_files,
            proxy_jump,
            strict_host_key_checking,
            user_known_hosts_files,
            global_known_hosts_files,
            hash_known_hosts,
            connect_timeout,
            batch_mode,
            host_key_alias,
            identity_agent,
            password_authentication,
            pubkey_authentication,
            kbd_interactive_authentication,
            number_of_password_prompts,
            server_alive_interval,
            server_alive_count_max,
            proxy_command,
            algorithms: AlgorithmLists {
                pubkey: ov.pubkey_accepted_algorithms.clone().or(algorithms.pubkey),
                ..algorithms
            },
            revoked_host_keys,
            required_rsa_size,
            passed_over: ov.passed_over.iter().chain(&passed_over).cloned().collect(),
        };
        let known_hosts: Vec<PathBuf> = config
            .user_known_hosts_files
            .iter()
            .chain(&config.global_known_hosts_files)
            .cloned()
            .collect();
        if super::known_hosts::has_cert_authority(&known_hosts, &config.known_hosts_name()) {
            return Err(Error::NeedsSystemSsh(format!(
                "a @cert-authority in known_hosts for {host}"
            )));
        }
        Ok(config)
    }
}

impl OneFile {
    fn parse(text: &str, home: Option<&Path>) -> Result<Self, Error> {
        if let Some(at) = match_lines(text, home).first() {
            return Err(Error::NeedsSystemSsh(format!(
                "ssh_config {at}: a `Match` block"
            )));
        }
        let certificate_lines = keyword_lines(text, "certificatefile", home, 0, &|_| true);
        // Every value is checked now, in whichever block it is, as ssh checks them.
        let mut lines = Vec::new();
        lines_in_effect(text, home, None, true, 0, &mut lines);
        if let Err(e) = parse_lines(&parser_text(&lines, false), home) {
            return Err(bad_line(text, home, &lines).unwrap_or(e));
        }
        Ok(OneFile {
            text: text.to_owned(),
            certificate_lines,
        })
    }
}

/// The first of `lines` (from [`lines_in_effect`] over `text`) that the parser refuses on its
/// own, as ssh names a bad line: where it is (`line 3`, or `/path line 3` in an included
/// file), the line, and why.
fn bad_line(text: &str, home: Option<&Path>, lines: &[(String, String, String)]) -> Option<Error> {
    lines.iter().find_map(|one| {
        let Err(Error::Config(why)) =
            parse_lines(&parser_text(std::slice::from_ref(one), false), home)
        else {
            return None;
        };
        let (kw, rest, line) = one;
        let at = keyword_lines(text, kw, home, 0, &|f| f.rest == rest.as_str());
        let at = at.first().map_or(String::new(), |at| format!("{at}: "));
        Some(Error::Config(format!("{at}{line}: {why}")))
    })
}

/// Parses `text` (from [`parser_text`]) with `ssh2-config`.
fn parse_lines(text: &str, home: Option<&Path>) -> Result<SshConfig, Error> {
    let mut cfg = SshConfig::default();
    if let Some(h) = home {
        cfg = cfg.home_dir(h);
    }
    cfg.parse(
        &mut BufReader::new(text.as_bytes()),
        ParseRule::ALLOW_UNKNOWN_FIELDS | ParseRule::ALLOW_UNSUPPORTED_FIELDS,
    )
    .map_err(|e| Error::Config(e.to_string()))
}

/// `text` with each relative path of its `Include` lines made absolute beneath `dir`, as ssh
/// reads a relative `Include` in the system-wide file (beneath `/etc/ssh`).
fn absolute_includes(text: &str, dir: &Path) -> String {
    let mut out = String::with_capacity(text.len());
    for line in text.lines() {
        match keyword_and_rest(line) {
            Some((kw, rest)) if kw.eq_ignore_ascii_case("include") => {
                out.push_str(kw);
                for arg in words(rest) {
                    let path = if arg.starts_with('/') || arg.starts_with('~') {
                        arg
                    } else {
                        dir.join(arg).to_string_lossy().into_owned()
                    };
                    out.push_str(" \"");
                    out.push_str(&path.replace('\\', "\\\\").replace('"', "\\\""));
                    out.push('"');
                }
            }
            _ => out.push_str(line),
        }
        out.push('\n');
    }
    out
}

/// Where a file that the system-wide file `text` includes has an `Include` of a relative
/// path (ssh reads it beneath `/etc/ssh`, the reader here beneath `~/.ssh`), if one has.
fn nested_relative_include(text: &str, home: Option<&Path>) -> Option<String> {
    let relative = |l: Found| {
        l.depth > 0
            && words(l.rest)
                .iter()
                .any(|a| !a.starts_with('/') && !a.starts_with('~'))
    };
    keyword_lines(text, "include", home, 0, &relative)
        .into_iter()
        .next()
}

/// Where the `Match` lines the built-in client does not follow are, in `text` and the files
/// it `Include`s (at most 16 deep). `Match all` before any `Host` or other `Match` line of
/// its file applies to every host, as the lines before the first `Host` line do, and is
/// followed. Any other `Match` could connect somewhere else, or as someone else, than ssh
/// would; `Match final all` and `Match canonical all` (Fedora's system-wide file has the
/// first) apply in ssh's second reading of the files, which matches `Host` lines against the
/// host name as well as the name given.
fn match_lines(text: &str, home: Option<&Path>) -> Vec<String> {
    let followed = |l: Found| {
        let criteria = words(l.rest);
        l.top && criteria.len() == 1 && criteria[0].eq_ignore_ascii_case("all")
    };
    keyword_lines(text, "match", home, 0, &|l| !followed(l))
}

/// Resolves `destination` (`[user@]host`) into the chain of hosts to connect through:
/// ProxyJump hops first (each resolved through the same ssh_config), the destination last.
///
/// `options` override ssh_config for the destination only, as ssh's flags do.
pub fn resolve_chain(destination: &str, options: &SshOptions) -> Result<Vec<HostConfig>, Error> {
    let file = SshConfigFile::load(options.config_file.as_deref())?;
    resolve_chain_in(&file, destination, options)
}

/// [`resolve_chain`] against an already parsed config.
pub fn resolve_chain_in(
    file: &SshConfigFile,
    destination: &str,
    options: &SshOptions,
) -> Result<Vec<HostConfig>, Error> {
    let ov = Overrides::from_options(options)?;
    let (user, host) = split_user_host(destination);
    if host.is_empty() || host.starts_with('-') {
        return Err(Error::Config(format!(
            "invalid destination {destination:?}"
        )));
    }
    let target = file.resolve_with(host, user, &ov)?;
    let mut chain = Vec::new();
    push_jumps(file, &target.proxy_jump, &mut chain, 0)?;
    chain.push(target);
    Ok(chain)
}

fn push_jumps(
    file: &SshConfigFile,
    jumps: &[String],
    chain: &mut Vec<HostConfig>,
    depth: usize,
) -> Result<(), Error> {
    if depth > 8 {
        return Err(Error::Config(
            "ProxyJump nests more than 8 levels (a loop?)".into(),
        ));
    }
    for (i, spec) in jumps.iter().enumerate() {
        let (user, host, port) = parse_hop(spec)?;
        let ov = Overrides {
            port,
            ..Overrides::default()
        };
        let hop = file.resolve_with(host, user, &ov)?;
        // As with ssh, the first hop may itself be reached through its own ProxyJump;
        // later hops are reached through the earlier ones.
        if i == 0 && !hop.proxy_jump.is_empty() {
            push_jumps(file, &hop.proxy_jump.clone(), chain, depth + 1)?;
        }
        chain.push(hop);
    }
    Ok(())
}

/// Splits `user@host` at the last `@`.
fn split_user_host(dest: &str) -> (Option<&str>, &str) {
    match dest.rsplit_once('@') {
        Some((u, h)) if !u.is_empty() => (Some(u), h),
        _ => (None, dest),
    }
}

/// Parses a ProxyJump hop: `[user@]host[:port]`, `[user@][v6addr]:port`, or
/// `ssh://[user@]host[:port]`.
fn parse_hop(spec: &str) -> Result<(Option<&str>, &str, Option<u16>), Error> {
    let s = spec.strip_prefix("ssh://").unwrap_or(spec);
    let (user, rest) = split_user_host(s);
    let bad = || Error::Config(format!("invalid ProxyJump hop {spec:?}"));
    let (host, port) = if let Some(r) = rest.strip_prefix('[') {
        let (h, after) = r.split_once(']').ok_or_else(bad)?;
        match after.strip_prefix(':') {
            Some(p) => (h, Some(parse_port(p).ok_or_else(bad)?)),
            None if after.is_empty() => (h, None),
            None => return Err(bad()),
        }
    } else {
        match rest.rsplit_once(':') {
            Some((h, p)) if !h.contains(':') => (h, Some(parse_port(p).ok_or_else(bad)?)),
            _ => (rest, None),
        }
    };
    if host.is_empty() || host.starts_with('-') {
        return Err(bad());
    }
    Ok((user, host, port))
}

fn split_jumps(v: &str) -> Vec<String> {
    v.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
        .collect()
}

/// Values from [`SshOptions`] that override ssh_config for the destination.
#[derive(Default, Debug)]
struct Overrides {
    host_name: Option<String>,
    port: Option<u16>,
    address_family: Option<AddressFamily>,
    user: Option<String>,
    identity_files: Vec<PathBuf>,
    identities_only: Option<bool>,
    certificate_files: Vec<PathBuf>,
    /// `-J`, then `-o ProxyJump` and `-o ProxyCommand` in their order: they come before
    /// ssh_config's lines of the same keys.
    proxy: Vec<ProxyLine>,
    strict: Option<StrictHostKeyChecking>,
    user_known_hosts: Option<String>,
    global_known_hosts: Option<String>,
    hash_known_hosts: Option<bool>,
    connect_timeout: Option<Duration>,
    batch_mode: Option<bool>,
    host_key_alias: Option<String>,
    identity_agent: Option<String>,
    password_authentication: Option<bool>,
    pubkey_authentication: Option<bool>,
    kbd_interactive_authentication: Option<bool>,
    number_of_password_prompts: Option<u32>,
    server_alive_interval: Option<Duration>,
    server_alive_count_max: Option<u32>,
    preferred_authentications: Option<String>,
    required_rsa_size: Option<u32>,
    revoked_host_keys: Option<String>,
    pubkey_accepted_algorithms: Option<String>,
    passed_over: Vec<String>,
}

impl Overrides {
    fn from_options(o: &SshOptions) -> Result<Self, Error> {
        let mut ov = Overrides {
            port: o.port,
            user: o.user.clone(),
            identity_files: o.identity_files.clone(),
            proxy: o.jump.iter().cloned().map(ProxyLine::Jump).collect(),
            ..Overrides::default()
        };
        // As in ssh, the first value given wins; flags (-p, -l, -J) beat -o.
        for opt in &o.options {
            let (key, value) = split_option(opt)?;
            let v = value.to_owned();
            match key.to_ascii_lowercase().as_str() {
                "hostname" => set_once(&mut ov.host_name, v),
                "port" => set_once(
                    &mut ov.port,
                    parse_port(&v).ok_or_else(|| Error::Config(format!("-o {opt}: bad port")))?,
                ),
                "addressfamily" => set_once(&mut ov.address_family, AddressFamily::parse(&v)?),
                "user" => set_once(&mut ov.user, v),
                "identityfile" => ov.identity_files.push(PathBuf::from(v)),
                "identitiesonly" => set_once(&mut ov.identities_only, parse_yes_no(key, &v)?),
                "certificatefile" => ov.certificate_files.push(PathBuf::from(v)),
                "proxyjump" => ov.proxy.push(ProxyLine::Jump(v)),
                "stricthostkeychecking" => {
                    set_once(&mut ov.strict, StrictHostKeyChecking::parse(&v)?)
                }
                "userknownhostsfile" => set_once(&mut ov.user_known_hosts, v),
                "globalknownhostsfile" => set_once(&mut ov.global_known_hosts, v),
                "hashknownhosts" => set_once(&mut ov.hash_known_hosts, parse_yes_no(key, &v)?),
                "connecttimeout" => set_once(
                    &mut ov.connect_timeout,
                    Duration::from_secs(seconds(&v).ok_or_else(|| {
                        Error::Config(format!("-o {opt}: ConnectTimeout takes a time"))
                    })?),
                ),
                "batchmode" => set_once(&mut ov.batch_mode, parse_yes_no(key, &v)?),
                "hostkeyalias" => set_once(&mut ov.host_key_alias, v),
                "identityagent" => set_once(&mut ov.identity_agent, v),
                "pubkeyauthentication" => set_once(
                    &mut ov.pubkey_authentication,
                    parse_pubkey_authentication(&v)?,
                ),
                "passwordauthentication" => {
                    set_once(&mut ov.password_authentication, parse_yes_no(key, &v)?)
                }
                "kbdinteractiveauthentication" | "challengeresponseauthentication" => set_once(
                    &mut ov.kbd_interactive_authentication,
                    parse_yes_no(key, &v)?,
                ),
                "proxycommand" => ov.proxy.push(ProxyLine::Command(v)),
                "serveraliveinterval" => set_once(
                    &mut ov.server_alive_interval,
                    Duration::from_secs(seconds(&v).ok_or_else(|| {
                        Error::Config(format!("-o {opt}: ServerAliveInterval takes a time"))
                    })?),
                ),
                "serveralivecountmax" => set_once(
                    &mut ov.server_alive_count_max,
                    parse_number("ServerAliveCountMax", &v)?,
                ),
                "numberofpasswordprompts" => set_once(
                    &mut ov.number_of_password_prompts,
                    parse_number("NumberOfPasswordPrompts", &v)?,
                ),
                "preferredauthentications" => set_once(&mut ov.preferred_authentications, v),
                "requiredrsasize" => set_once(
                    &mut ov.required_rsa_size,
                    parse_number("RequiredRSASize", &v)?,
                ),
                "revokedhostkeys" => set_once(&mut ov.revoked_host_keys, v),
                "pubkeyacceptedalgorithms" | "pubkeyacceptedkeytypes" => {
                    set_once(&mut ov.pubkey_accepted_algorithms, v)
                }
                _ if keyword_use(key, &v) == KeywordUse::PassedOver => {
                    ov.passed_over.push(key.to_owned())
                }
                _ => return Err(Error::NeedsSystemSsh(format!("-o {opt}"))),
            }
        }
        Ok(ov)
    }
}

fn set_once<T>(slot: &mut Option<T>, v: T) {
    if slot.is_none() {
        *slot = Some(v);
    }
}

fn split_option(opt: &str) -> Result<(&str, &str), Error> {
    let opt = opt.trim();
    let idx = opt
        .find(|c: char| c == '=' || c.is_whitespace())
        .ok_or_else(|| Error::Config(format!("-o {opt:?}: expected Key=Value")))?;
    let (k, v) = opt.split_at(idx);
    let v = v
        .trim_start_matches(|c: char| c == '=' || c.is_whitespace())
        .trim();
    if k.is_empty() || v.is_empty() {
        return Err(Error::Config(format!("-o {opt:?}: expected Key=Value")));
    }
    Ok((k, v))
}

fn parse_yes_no(key: &str, v: &str) -> Result<bool, Error> {
    match v.to_ascii_lowercase().as_str() {
        "yes" | "true" => Ok(true),
        "no" | "false" => Ok(false),
        _ => Err(Error::Config(format!("{key} {v:?}: expected yes or no"))),
    }
}

fn parse_number<T: std::str::FromStr>(key: &str, v: &str) -> Result<T, Error> {
    v.parse()
        .map_err(|_| Error::Config(format!("{key} {v:?}: expected a number")))
}

fn unquote(s: &str) -> String {
    s.strip_prefix('"')
        .and_then(|s| s.strip_suffix('"'))
        .unwrap_or(s)
        .to_owned()
}

/// What ssh's `%` tokens stand for when reaching one host (ssh_config TOKENS).
struct Tokens<'a> {
    /// `%d`: the local user's home.
    home: Option<&'a Path>,
    /// `%h`: the host name (HostName).
    host: &'a str,
    /// `%n`: the name as given.
    alias: &'a str,
    /// `%p`: the port.
    port: u16,
    /// `%r`: the remote user.
    user: &'a str,
    /// `%k`: HostKeyAlias, or the name as given.
    key_alias: &'a str,
}

impl Tokens<'_> {
    /// Expands a path of the keys that take every connection token and `${VAR}`
    /// (IdentityFile, CertificateFile, UserKnownHostsFile, IdentityAgent, ...): `~` first, then
    /// `%C %d %h %i %k %L %l %n %p %r %u %%`, as ssh does.
    fn path(&self, key: &str, p: &Path) -> Result<PathBuf, Error> {
        let bytes = p.as_os_str().as_encoded_bytes();
        if !bytes.starts_with(b"~")
            && !bytes.contains(&b'%')
            && !bytes.windows(2).any(|w| w == b"${")
        {
            return Ok(p.to_path_buf());
        }
        let s = tilde(key, &p.to_string_lossy(), self.home)?;
        let local = local_host_name();
        let expanded = expand_with_env(key, &s, |c| {
            Some(match c {
                'C' => connection_hash(&local, self.host, self.port, self.user),
                'd' => self
                    .home
                    .map(|h| h.to_string_lossy().into_owned())
                    .unwrap_or_default(),
                'h' => self.host.to_owned(),
                'i' => rustix::process::getuid().as_raw().to_string(),
                'k' => self.key_alias.to_owned(),
                'L' => local.split('.').next().unwrap_or_default().to_owned(),
                'l' => local.clone(),
                'n' => self.alias.to_owned(),
                'p' => self.port.to_string(),
                'r' => self.user.to_owned(),
                'u' => local_user(),
                _ => return None,
            })
        })?;
        Ok(PathBuf::from(expanded))
    }
}

/// A `PubkeyAuthentication` value, as ssh takes it: `yes`, `unbound` and `host-bound` offer
/// keys, `no` does not.
fn parse_pubkey_authentication(v: &str) -> Result<bool, Error> {
    match v.to_ascii_lowercase().as_str() {
        "yes" | "unbound" | "host-bound" => Ok(true),
        "no" => Ok(false),
        _ => Err(Error::Config(format!(
            "PubkeyAuthentication {v:?}: expected yes, no, unbound or host-bound"
        ))),
    }
}

/// Whether `path` is a unix socket (a connection master listening there).
fn is_socket(path: &Path) -> bool {
    use std::os::unix::fs::FileTypeExt;
    std::fs::metadata(path).is_ok_and(|m| m.file_type().is_socket())
}

/// How long `klist -s` may take to say whether there is a Kerberos ticket.
const KLIST_WAIT: Duration = Duration::from_secs(2);

/// How long an answer of `klist -s` is kept: a copy's logins ask once, a long-lived program
/// sees a ticket `kinit` got later.
const KLIST_KEPT: Duration = Duration::from_secs(60);

/// Whether the user holds a Kerberos ticket, as `klist -s` says (asked again after
/// [`KLIST_KEPT`]). Without `klist` there is no Kerberos, and a `klist` that does not answer
/// within [`KLIST_WAIT`] counts as no ticket.
fn has_kerberos_ticket() -> bool {
    static ASKED: std::sync::Mutex<Option<(std::time::Instant, bool)>> =
        std::sync::Mutex::new(None);
    let mut asked = ASKED.lock().unwrap_or_else(|e| e.into_inner());
    match *asked {
        Some((at, ticket)) if at.elapsed() < KLIST_KEPT => ticket,
        _ => {
            let ticket = exits_zero("klist", &["-s"], KLIST_WAIT);
            *asked = Some((std::time::Instant::now(), ticket));
            ticket
        }
    }
}

/// Whether `program args` exits with status 0 within `wait` (it is killed after that).
fn exits_zero(program: &str, args: &[&str], wait: Duration) -> bool {
    use std::process::{Command, Stdio};
    let child = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn();
    let Ok(mut child) = child else {
        return false;
    };
    let deadline = std::time::Instant::now() + wait;
    loop {
        match child.try_wait() {
            Ok(Some(status)) => return status.success(),
            Ok(None) if std::time::Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(5));
            }
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                return false;
            }
        }
    }
}

/// ssh's `%C`: the SHA-1 of the local host name, host name, port and remote user, in hex.
fn connection_hash(local: &str, host: &str, port: u16, user: &str) -> String {
    use sha1::Digest;
    let mut hash = sha1::Sha1::new();
    for part in [local, host, &port.to_string(), user] {
        hash.update(part.as_bytes());
    }
    data_encoding::HEXLOWER.encode(&hash.finalize())
}

/// This machine's name (`gethostname`), as ssh's `%l`.
fn local_host_name() -> String {
    nix::unistd::gethostname()
        .map(|h| h.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// Expands `%` tokens in `value` (of ssh_config's `key`) as ssh does: `%%` is a percent
/// sign, `token` gives what a letter stands for, and a letter it does not know is an error,
/// as ssh's "unknown key" is.
fn expand(key: &str, value: &str, token: impl Fn(char) -> Option<String>) -> Result<String, Error> {
    expand_tokens(key, value, false, token)
}

/// [`expand`], and `${VAR}` is the environment variable VAR (an error when it is not set).
fn expand_with_env(
    key: &str,
    value: &str,
    token: impl Fn(char) -> Option<String>,
) -> Result<String, Error> {
    expand_tokens(key, value, true, token)
}

fn expand_tokens(
    key: &str,
    value: &str,
    env: bool,
    token: impl Fn(char) -> Option<String>,
) -> Result<String, Error> {
    let fail = |why: String| Error::Config(format!("{key} {value}: {why}"));
    let mut out = String::with_capacity(value.len());
    let mut rest = value;
    while let Some(c) = rest.chars().next() {
        if env && let Some(after) = rest.strip_prefix("${") {
            let Some((var, after)) = after.split_once('}') else {
                return Err(fail(format!(
                    "environment variable '{after}' missing closing '}}'"
                )));
            };
            if var.is_empty() {
                return Err(fail("zero-length environment variable".into()));
            }
            match std::env::var(var) {
                Ok(v) => out.push_str(&v),
                Err(_) => return Err(fail(format!("env var ${{{var}}} has no value"))),
            }
            rest = after;
            continue;
        }
        rest = &rest[c.len_utf8()..];
        if c != '%' {
            out.push(c);
            continue;
        }
        let Some(t) = rest.chars().next() else {
            return Err(fail("invalid format: a lone % at the end".into()));
        };
        rest = &rest[t.len_utf8()..];
        match t {
            '%' => out.push('%'),
            t => match token(t) {
                Some(v) => out.push_str(&v),
                None => return Err(fail(format!("unknown key %{t}"))),
            },
        }
    }
    Ok(out)
}

/// Expands a leading `~` as ssh does: `~` and `~/path` are beneath `home`, `~user` and
/// `~user/path` beneath that user's home (from the password database).
fn tilde(key: &str, s: &str, home: Option<&Path>) -> Result<String, Error> {
    let Some(rest) = s.strip_prefix('~') else {
        return Ok(s.to_owned());
    };
    let (user, path) = match rest.split_once('/') {
        Some((user, path)) => (user, path.trim_start_matches('/')),
        None => (rest, ""),
    };
    let dir = if user.is_empty() {
        home.map(Path::to_path_buf)
            .ok_or_else(|| Error::Config(format!("{key} {s}: no home directory for ~")))?
    } else {
        match nix::unistd::User::from_name(user) {
            Ok(Some(u)) => u.dir,
            _ => return Err(Error::Config(format!("{key} {s}: No such user {user}"))),
        }
    };
    let dir = dir.to_string_lossy();
    Ok(match path {
        "" => dir.into_owned(),
        path => format!("{}/{path}", dir.trim_end_matches('/')),
    })
}

fn default_identity_files(home: Option<&Path>) -> Vec<PathBuf> {
    let Some(home) = home else { return vec![] };
    [
        "id_rsa",
        "id_ecdsa",
        "id_ecdsa_sk",
        "id_ed25519",
        "id_ed25519_sk",
        "id_xmss",
        "id_dsa",
    ]
    .iter()
    .map(|n| home.join(".ssh").join(n))
    .collect()
}

/// The local user's home, as ssh finds it: the password database's entry for this user, or
/// `$HOME` when there is none.
pub(crate) fn home_dir() -> Option<PathBuf> {
    match passwd_entry() {
        Some(user) => Some(user.dir),
        None => std::env::var_os("HOME")
            .filter(|h| !h.is_empty())
            .map(PathBuf::from),
    }
}

/// The local user name, as ssh finds it: the password database's entry for this user, or
/// `$USER` or `$LOGNAME` when there is none.
pub(crate) fn local_user() -> String {
    if let Some(user) = passwd_entry() {
        return user.name;
    }
    for var in ["USER", "LOGNAME"] {
        if let Some(u) = std::env::var_os(var).filter(|u| !u.is_empty()) {
            return u.to_string_lossy().into_owned();
        }
    }
    "root".to_owned()
}

fn passwd_entry() -> Option<nix::unistd::User> {
    nix::unistd::User::from_uid(nix::unistd::Uid::current())
        .ok()
        .flatten()
}

#[cfg(test)]
mod tests {
    use super::*;

    const CFG: &str = "\
# global options come first
ConnectTimeout 7

Host build
  HostName build.internal.example
  User builder
  Port 2202
  IdentityFile /keys/build_ed25519
  IdentitiesOnly yes
  ProxyJump bastion

Host bastion
  HostName bastion.example
  User jump
  Port 2022
  UserKnownHostsFile /kh/bastion /kh/other
  StrictHostKeyChecking accept-new

Host *.corp !secret.corp
  User corpuser
  HashKnownHosts yes

Host *
  User fallback
  StrictHostKeyChecking yes
  IdentityFile /keys/default
";

    fn cfg() -> SshConfigFile {
        SshConfigFile::parse_str(CFG).unwrap()
    }

    #[test]
    fn alias_resolves_host_name_port_user_identity() {
        let h = cfg().resolve("build").unwrap();
        assert_eq!(h.host_name, "build.internal.example");
        assert_eq!(h.port, 2202);
        assert_eq!(h.user, "builder");
        // IdentityFile accumulates over matching blocks, first block first.
        assert_eq!(
            h.identity_files,
            vec![
                PathBuf::from("/keys/build_ed25519"),
                PathBuf::from("/keys/default")
            ]
        );
        assert!(h.identities_only);
        assert_eq!(h.proxy_jump, vec!["bastion".to_owned()]);
        assert_eq!(h.connect_timeout, Some(Duration::from_secs(7)));
        assert_eq!(h.strict_host_key_checking, StrictHostKeyChecking::Yes);
        assert_eq!(h.known_hosts_name(), "[build.internal.example]:2202");
    }

    #[test]
    fn a_match_in_an_included_file_needs_the_system_ssh() {
        let dir = tempfile::tempdir().unwrap();
        let inc = dir.path().join("inc.conf");
        std::fs::write(&inc, "Match exec \"false\"\n  Port 2\n").unwrap();
        let text = format!(
            "Host a\n  HostName b\nInclude {}\n",
            dir.path().join("*.conf").display()
        );
        let e = SshConfigFile::parse_str(&text).unwrap_err();
        assert!(matches!(e, Error::NeedsSystemSsh(_)), "{e}");
        assert!(e.to_string().contains("inc.conf"), "{e}");
        std::fs::write(&inc, "Host c\n  Port 2\n").unwrap();
        assert!(SshConfigFile::parse_str(&text).is_ok());
    }

    /// A value the parser refuses is named as ssh names it: the file it is in (an included
    /// one too), its line, and the line itself.
    #[test]
    fn a_bad_value_names_its_file_and_line() {
        let dir = tempfile::tempdir().unwrap();
        let inc = dir.path().join("inc.conf");
        std::fs::write(&inc, "Host c\n  ConnectTimeout abc\n").unwrap();
        let text = format!("Host a\n  HostName b\nInclude {}\n", inc.display());
        let e = SshConfigFile::parse_str(&text).unwrap_err();
        assert!(matches!(e, Error::Config(_)), "{e}");
        let said = e.to_string();
        let want = format!("{} line 2: ConnectTimeout abc:", inc.display());
        assert!(said.contains(&want), "{said}");
        let e = SshConfigFile::parse_str("Host a\n  HostName b\n\n  Port x\n").unwrap_err();
        assert!(e.to_string().contains("line 4: Port x:"), "{e}");
    }

    /// As ssh (8.7 and later) splits a line: a `#` is a comment only where a word starts
    /// with it, outside quotes.
    #[test]
    fn words_split_as_ssh_splits_them() {
        let cases: &[(&str, &[&str])] = &[
            ("/keys/a#b", &["/keys/a#b"]),
            ("a#b # a comment", &["a#b"]),
            ("a #b c", &["a"]),
            ("#all of it", &[]),
            ("'#q' \"#r\" s", &["#q", "#r", "s"]),
            ("\"x y\"#z", &["x y#z"]),
            ("a\"b c\"d", &["ab cd"]),
            ("a\\ b \\\"c \\\\d \\e", &["a b", "\"c", "\\d", "\\e"]),
            ("\"\" x", &["", "x"]),
        ];
        for (rest, want) in cases {
            assert_eq!(words(rest), *want, "{rest}");
        }
    }

    /// A `#` inside a word reaches the value, for keys `ssh2-config` reads and keys read
    /// here alike; a comment after the value does not.
    #[test]
    fn a_hash_inside_a_word_is_no_comment() {
        let text = "Host a\n\
                    \x20 IdentityFile /keys/a#b # the key\n\
                    \x20 IdentityFile '/keys/c#d'\n\
                    \x20 User u#1\n\
                    \x20 UserKnownHostsFile /kh/x#1 \"/kh/y z\" # two of them\n\
                    \x20 ConnectTimeout 5 # seconds\n\
                    \x20 ProxyCommand nc %h %p foo#bar # sh's comment\n";
        let h = SshConfigFile::parse_str(text)
            .unwrap()
            .resolve("a")
            .unwrap();
        assert_eq!(
            h.identity_files,
            vec![PathBuf::from("/keys/a#b"), PathBuf::from("/keys/c#d")]
        );
        assert_eq!(h.user, "u#1");
        assert_eq!(
            h.user_known_hosts_files,
            vec![PathBuf::from("/kh/x#1"), PathBuf::from("/kh/y z")]
        );
        assert_eq!(h.connect_timeout, Some(Duration::from_secs(5)));
        assert_eq!(
            h.proxy_command.as_deref(),
            Some("nc a 22 foo#bar # sh's comment")
        );
        // `accept-new#` is no value of StrictHostKeyChecking, as ssh says too.
        let bad = "Host b\n  StrictHostKeyChecking accept-new# x\n";
        assert!(
            SshConfigFile::parse_str(bad)
                .and_then(|f| f.resolve("b"))
                .is_err()
        );
    }

    #[test]
    fn a_port_may_be_a_service_name() {
        let services = "# Network services\n\
                        ssh\t\t22/tcp\t\t\t# SSH Remote Login Protocol\n\
                        nfs\t\t2049/udp\n\
                        domain\t\t53/tcp\t\tdns name\n\
                        zero\t\t0/tcp\n";
        assert_eq!(service_port(services, "ssh"), Some(22));
        assert_eq!(service_port(services, "dns"), Some(53), "an alias");
        assert_eq!(service_port(services, "name"), Some(53));
        assert_eq!(service_port(services, "nfs"), None, "udp only");
        assert_eq!(service_port(services, "zero"), None);
        assert_eq!(service_port(services, "SSH"), None);
        assert_eq!(service_port(services, "Network"), None, "a comment");
        assert_eq!(parse_port("65535"), Some(65535));
        for bad in ["0", "65536", "-1", "", "no-such-service-here"] {
            assert_eq!(parse_port(bad), None, "{bad}");
        }
        // As ssh: `Port 0` in ssh_config is a bad port, not a connection to port 0.
        let file = SshConfigFile::parse_str("Host a\n  Port 0\n").unwrap();
        assert!(
            matches!(file.resolve("a"), Err(Error::Config(m)) if m.contains("Port 0")),
            "{:?}",
            file.resolve("a").map(|h| h.port)
        );
        // As ssh: `Port ssh` in ssh_config, `-o Port=ssh` and a ProxyJump hop's port.
        if service_port(
            &std::fs::read_to_string(SERVICES).unwrap_or_default(),
            "ssh",
        ) != Some(22)
        {
            eprintln!("{SERVICES} does not name ssh; skipping the lookups through it");
            return;
        }
        let file = SshConfigFile::parse_str("Host a\n  Port ssh # the usual\n").unwrap();
        assert_eq!(file.resolve("a").unwrap().port, 22);
        let opts = SshOptions {
            options: vec!["Port=ssh".into()],
            jump: Some("hop:ssh".into()),
            ..SshOptions::default()
        };
        let chain = resolve_chain_in(&cfg(), "elsewhere", &opts).unwrap();
        assert_eq!((chain[0].port, chain[1].port), (22, 22));
        // An unknown name is still refused, saying where.
        let e = SshConfigFile::parse_str("Host a\n  Port no-such-service-here\n").unwrap_err();
        assert!(
            e.to_string().contains("line 2: Port no-such-service-here:"),
            "{e}"
        );
        let opts = SshOptions {
            options: vec!["Port=no-such-service-here".into()],
            ..SshOptions::default()
        };
        assert!(resolve_chain_in(&cfg(), "elsewhere", &opts).is_err());
    }

    #[test]
    fn dash_f_none_reads_no_file() {
        let none = SshConfigFile::load(Some(Path::new("none"))).unwrap();
        let h = none.resolve("build").unwrap();
        assert_eq!(h.host_name, "build");
        assert!(SshConfigFile::load(Some(Path::new("/nonexistent/config"))).is_err());
    }

    #[test]
    fn wildcards_and_negation() {
        let c = cfg();
        let a = c.resolve("db.corp").unwrap();
        assert_eq!(a.user, "corpuser");
        assert_eq!(a.host_name, "db.corp");
        assert_eq!(a.port, 22);
        assert!(a.hash_known_hosts);
        let s = c.resolve("secret.corp").unwrap();
        assert_eq!(s.user, "fallback");
        assert!(!s.hash_known_hosts);
        let o = c.resolve("other").unwrap();
        assert_eq!(o.user, "fallback");
        assert!(!o.identities_only);
    }

    #[test]
    fn known_hosts_files_and_strictness() {
        let b = cfg().resolve("bastion").unwrap();
        assert_eq!(
            b.user_known_hosts_files,
            vec![PathBuf::from("/kh/bastion"), PathBuf::from("/kh/other")]
        );
        assert_eq!(b.strict_host_key_checking, StrictHostKeyChecking::AcceptNew);
    }

    #[test]
    fn chain_resolves_each_hop_through_the_config() {
        let chain = resolve_chain_in(&cfg(), "build", &SshOptions::default()).unwrap();
        assert_eq!(chain.len(), 2);
        assert_eq!(chain[0].host_name, "bastion.example");
        assert_eq!(chain[0].user, "jump");
        assert_eq!(chain[0].port, 2022);
        assert_eq!(chain[1].host_name, "build.internal.example");
    }

    #[test]
    fn multi_hop_jump_override_with_user_and_port() {
        let opts = SshOptions {
            jump: Some("alice@bastion:2300,[::1]:2400".into()),
            ..SshOptions::default()
        };
        let chain = resolve_chain_in(&cfg(), "bob@build", &opts).unwrap();
        assert_eq!(chain.len(), 3);
        assert_eq!((chain[0].user.as_str(), chain[0].port), ("alice", 2300));
        assert_eq!(chain[0].host_name, "bastion.example");
        assert_eq!((chain[1].host_name.as_str(), chain[1].port), ("::1", 2400));
        assert_eq!(chain[2].user, "bob");
    }

    #[test]
    fn overrides_beat_config_and_only_touch_the_destination() {
        let opts = SshOptions {
            port: Some(9),
            user: Some("carol".into()),
            identity_files: vec!["/keys/cli".into()],
            options: vec![
                "StrictHostKeyChecking=accept-new".into(),
                "ConnectTimeout 3".into(),
                "UserKnownHostsFile=/kh/cli".into(),
                "Port=10".into(),
            ],
            ..SshOptions::default()
        };
        let chain = resolve_chain_in(&cfg(), "dave@build", &opts).unwrap();
        let t = &chain[1];
        assert_eq!(t.port, 9, "-p beats -o Port");
        assert_eq!(t.user, "carol", "-l beats user@");
        assert_eq!(t.identity_files[0], PathBuf::from("/keys/cli"));
        assert_eq!(t.strict_host_key_checking, StrictHostKeyChecking::AcceptNew);
        assert_eq!(t.connect_timeout, Some(Duration::from_secs(3)));
        assert_eq!(t.user_known_hosts_files, vec![PathBuf::from("/kh/cli")]);
        // The jump host keeps its own settings.
        assert_eq!(chain[0].port, 2022);
        assert_eq!(
            chain[0].strict_host_key_checking,
            StrictHostKeyChecking::AcceptNew
        );
        assert_eq!(chain[0].user, "jump");
    }

    #[test]
    fn unsupported_constructs_are_refused_clearly() {
        let e = SshConfigFile::parse_str("Host a\n  User x\nMatch host b\n  User y\n").unwrap_err();
        assert!(e.to_string().contains("line 3"), "{e}");
        assert!(e.to_string().contains("--ssh-program ssh"), "{e}");
        // ProxyCommand is run, its tokens expanded.
        let c = SshConfigFile::parse_str("Host p\n  User u\n  ProxyCommand nc %h %p %r %n 100%%\n")
            .unwrap();
        assert_eq!(
            c.resolve("p").unwrap().proxy_command.as_deref(),
            Some("nc p 22 u p 100%")
        );
        assert_eq!(c.resolve("q").unwrap().proxy_command, None);
        let opts = SshOptions {
            options: vec!["ControlMaster=auto".into()],
            ..SshOptions::default()
        };
        assert!(matches!(
            resolve_chain_in(&c, "q", &opts),
            Err(Error::NeedsSystemSsh(_))
        ));
        // What only the system ssh does is named as such, for the command to switch to it.
        let c = SshConfigFile::parse_str("Host p\n  ControlMaster auto\n").unwrap();
        let e = c.resolve("p").unwrap_err();
        assert!(matches!(e, Error::NeedsSystemSsh(_)), "{e}");
        // GSSAPI only with a Kerberos ticket: without one ssh's GSSAPI fails and it goes on.
        let c = SshConfigFile::parse_str("Host p\n  GSSAPIAuthentication yes\n").unwrap();
        match c.resolve("p") {
            Err(Error::NeedsSystemSsh(why)) => assert!(has_kerberos_ticket(), "{why}"),
            other => assert!(other.is_ok() && !has_kerberos_ticket(), "{other:?}"),
        }
        let c = SshConfigFile::parse_str("Host p\n  GSSAPIAuthentication no\n").unwrap();
        assert!(c.resolve("p").is_ok());
        assert!(resolve_chain_in(&c, "-oProxyCommand=x", &SshOptions::default()).is_err());
    }

    /// Each keyword in effect is read, passed over (and named for `-v`), or hands the
    /// connection to the system ssh: none that makes a connection safer is dropped.
    #[test]
    fn keywords_are_read_passed_over_or_left_to_the_system_ssh() {
        let needs_system = |text: &str| {
            let e = SshConfigFile::parse_str(text)
                .unwrap()
                .resolve("p")
                .unwrap_err();
            assert!(matches!(e, Error::NeedsSystemSsh(_)), "{text}: {e}");
            e.to_string()
        };
        let e = needs_system("Host p\n  VerifyHostKeyDNS yes\n");
        assert!(e.contains("`VerifyHostKeyDNS yes` for p"), "{e}");
        needs_system("Host p\n  HostbasedAuthentication yes\n");
        needs_system("Host p\n  SomeFutureKeyword 1\n");
        needs_system("Host p\n  PreferredAuthentications hostbased,gssapi-with-mic\n");
        // What a copy needs nothing of is passed over and named; the first value wins.
        let c = SshConfigFile::parse_str(
            "Host p\n  VerifyHostKeyDNS no\n  SendEnv LANG\n  setenv A=b\n  ForwardAgent yes\n\
             Host *\n  VerifyHostKeyDNS yes\n  IgnoreUnknown Some*\n  SomeFutureKeyword 1\n",
        )
        .unwrap();
        let h = c.resolve("p").unwrap();
        assert_eq!(
            h.passed_over,
            [
                "VerifyHostKeyDNS",
                "SendEnv",
                "setenv",
                "ForwardAgent",
                "SomeFutureKeyword"
            ]
        );
        // Only the lines in effect for the host count.
        let c = SshConfigFile::parse_str("Host q\n  SomeFutureKeyword 1\n").unwrap();
        assert!(c.resolve("p").unwrap().passed_over.is_empty());
        // -o: a keyword passed over is named, one only the system ssh honours hands over.
        let c = SshConfigFile::parse_str("").unwrap();
        let with = |o: &str| SshOptions {
            options: vec![o.into()],
            ..SshOptions::default()
        };
        let chain = resolve_chain_in(&c, "p", &with("SendEnv=LANG")).unwrap();
        assert_eq!(chain[0].passed_over, ["SendEnv"]);
        assert!(matches!(
            resolve_chain_in(&c, "p", &with("VerifyHostKeyDNS=yes")),
            Err(Error::NeedsSystemSsh(_))
        ));
        // PreferredAuthentications leaves out the methods it does not name.
        let c = SshConfigFile::parse_str("Host p\n  PreferredAuthentications publickey\n").unwrap();
        let h = c.resolve("p").unwrap();
        assert!(h.pubkey_authentication);
        assert!(!h.password_authentication && !h.kbd_interactive_authentication);
        let chain = resolve_chain_in(&c, "p", &with("PreferredAuthentications=password")).unwrap();
        assert!(!chain[0].pubkey_authentication && chain[0].password_authentication);
        // ChallengeResponseAuthentication is KbdInteractiveAuthentication's old name: the
        // first of the two wins, as ssh reads them.
        for (text, want) in [
            (
                "Host p\n  ChallengeResponseAuthentication no\n  KbdInteractiveAuthentication yes\n",
                false,
            ),
            (
                "Host p\n  KbdInteractiveAuthentication yes\n  ChallengeResponseAuthentication no\n",
                true,
            ),
            ("Host p\n  ChallengeResponseAuthentication no\n", false),
        ] {
            let c = SshConfigFile::parse_str(text).unwrap();
            let h = c.resolve("p").unwrap();
            assert_eq!(h.kbd_interactive_authentication, want, "{text}");
        }
        // RequiredRSASize, PubkeyAcceptedAlgorithms.
        let c = SshConfigFile::parse_str(
            "Host p\n  RequiredRSASize 3072\n  PubkeyAcceptedAlgorithms ssh-ed25519*\n",
        )
        .unwrap();
        let h = c.resolve("p").unwrap();
        assert_eq!(h.required_rsa_size, 3072);
        assert_eq!(h.algorithms.pubkey.as_deref(), Some("ssh-ed25519*"));
        assert_eq!(
            SshConfigFile::parse_str("")
                .unwrap()
                .resolve("p")
                .unwrap()
                .required_rsa_size,
            1024
        );
        let chain = resolve_chain_in(&c, "p", &with("RequiredRSASize=4096")).unwrap();
        assert_eq!(chain[0].required_rsa_size, 4096);
        // A number that is none is an error that names the keyword and the value.
        for key in [
            "RequiredRSASize",
            "NumberOfPasswordPrompts",
            "ServerAliveCountMax",
        ] {
            let bad = format!("{key} many");
            let err = resolve_chain_in(&c, "p", &with(&format!("{key}=many"))).unwrap_err();
            assert!(
                err.to_string().contains(&format!("{key} \"many\"")),
                "{err}"
            );
            let file = SshConfigFile::parse_str(&format!("Host p\n  {bad}\n")).unwrap();
            let err = file.resolve("p").unwrap_err();
            assert!(
                err.to_string().contains("expected a number"),
                "{key}: {err}"
            );
        }
    }

    /// RevokedHostKeys: a list of public keys is read; a binary key revocation list is the
    /// system ssh's to read.
    #[test]
    fn revoked_host_keys() {
        let dir = tempfile::tempdir().unwrap();
        let list = dir.path().join("revoked");
        std::fs::write(&list, "# none yet\n").unwrap();
        let krl = dir.path().join("krl");
        std::fs::write(&krl, b"SSHKRL\n\0\0\0\0\x01").unwrap();
        let text = |f: &Path| format!("Host p\n  RevokedHostKeys {}\n", f.display());
        let c = SshConfigFile::parse_str(&text(&list)).unwrap();
        assert_eq!(
            c.resolve("p").unwrap().revoked_host_keys,
            vec![list.clone()]
        );
        let c = SshConfigFile::parse_str(&text(&krl)).unwrap();
        let e = c.resolve("p").unwrap_err();
        assert!(matches!(e, Error::NeedsSystemSsh(_)), "{e}");
        let c = SshConfigFile::parse_str("Host p\n  RevokedHostKeys none\n").unwrap();
        assert!(c.resolve("p").unwrap().revoked_host_keys.is_empty());
        // Several files on one line, a quoted one with a space, as newer OpenSSH takes them.
        let spaced = dir.path().join("revoked too");
        std::fs::write(&spaced, "").unwrap();
        let line = format!(
            "Host p\n  RevokedHostKeys {} \"{}\"\n",
            list.display(),
            spaced.display()
        );
        let c = SshConfigFile::parse_str(&line).unwrap();
        assert_eq!(
            c.resolve("p").unwrap().revoked_host_keys,
            vec![list.clone(), spaced.clone()]
        );
        let chain = resolve_chain_in(
            &SshConfigFile::parse_str("").unwrap(),
            "p",
            &SshOptions {
                options: vec![format!(
                    "RevokedHostKeys={} {}",
                    list.display(),
                    krl.display()
                )],
                ..SshOptions::default()
            },
        );
        assert!(matches!(chain, Err(Error::NeedsSystemSsh(_))), "{chain:?}");
    }

    #[test]
    fn certificate_files() {
        let c = SshConfigFile::parse_with_home(
            "Host p\n  CertificateFile ~/.ssh/%r-cert.pub\nHost q\n  User u\n",
            Some(PathBuf::from("/home/u")),
        )
        .unwrap();
        let h = c.resolve("p").unwrap();
        let u = h.user.clone();
        assert_eq!(
            h.certificate_files,
            vec![PathBuf::from(format!("/home/u/.ssh/{u}-cert.pub"))]
        );
        assert!(c.resolve("q").unwrap().certificate_files.is_empty());
        // `-o CertificateFile` comes first, ssh_config's after it.
        let opts = SshOptions {
            options: vec!["CertificateFile=/c/first".into()],
            ..SshOptions::default()
        };
        let chain = resolve_chain_in(&c, "p", &opts).unwrap();
        assert_eq!(chain[0].certificate_files[0], PathBuf::from("/c/first"));
        assert_eq!(chain[0].certificate_files.len(), 2);
        // ssh offers every CertificateFile line; a file with several goes to the system ssh.
        let c =
            SshConfigFile::parse_str("Host p\n  CertificateFile /c/a\n  CertificateFile /c/b\n")
                .unwrap();
        let e = c.resolve("p").unwrap_err();
        assert!(matches!(e, Error::NeedsSystemSsh(_)), "{e}");
        assert!(e.to_string().contains("line 2, line 3"), "{e}");
        // Lines in an included file count too; a commented-out one does not.
        let dir = tempfile::tempdir().unwrap();
        let inc = dir.path().join("inc.conf");
        std::fs::write(&inc, "Host p\n  CertificateFile /c/b\n").unwrap();
        let text = format!(
            "Host p\n  CertificateFile /c/a\n# CertificateFile /c/c\nInclude {}\n",
            inc.display()
        );
        let e = SshConfigFile::parse_str(&text)
            .unwrap()
            .resolve("p")
            .unwrap_err();
        assert!(
            e.to_string()
                .contains(&format!("line 2, {} line 2", inc.display())),
            "{e}"
        );
        let c =
            SshConfigFile::parse_str("Host p\n  CertificateFile /c/a\n# CertificateFile /c/c\n")
                .unwrap();
        assert_eq!(
            c.resolve("p").unwrap().certificate_files,
            vec![PathBuf::from("/c/a")]
        );
    }

    /// CertificateFile takes the tokens and `${VAR}` IdentityFile does (ssh_config TOKENS),
    /// from the file and from `-o`, and an unknown token is an error as there.
    #[test]
    fn certificate_file_tokens() {
        // One CertificateFile line a file (more go to the system ssh).
        let parse = |text: &str| {
            SshConfigFile::parse_with_home(text, Some(PathBuf::from("/home/u"))).unwrap()
        };
        let c = parse(
            "Host t\n  HostName real.%h\n  User remote\n  Port 2200\n  HostKeyAlias ka
  CertificateFile ${PATH}/%i/%k/%n/%h/%p/%r/%C/%d/%%-cert.pub
",
        );
        let h = c.resolve("t").unwrap();
        let uid = rustix::process::getuid().as_raw();
        let hash = connection_hash(&local_host_name(), "real.t", 2200, "remote");
        let path = std::env::var("PATH").unwrap();
        assert_eq!(
            h.certificate_files,
            vec![PathBuf::from(format!(
                "{path}/{uid}/ka/t/real.t/2200/remote/{hash}//home/u/%-cert.pub"
            ))]
        );
        for (line, says) in [
            ("CertificateFile /c/%x", "unknown key %x"),
            (
                "CertificateFile /c/${FASTCP_TEST_UNSET_VARIABLE}",
                "env var ${FASTCP_TEST_UNSET_VARIABLE} has no value",
            ),
        ] {
            let e = parse(&format!("Host p\n  {line}\n"))
                .resolve("p")
                .unwrap_err();
            assert!(matches!(e, Error::Config(_)), "{line}: {e}");
            assert!(e.to_string().contains(says), "{line}: {e}");
        }
        let opts = SshOptions {
            options: vec!["CertificateFile=~/%n/%L-cert.pub".into()],
            ..SshOptions::default()
        };
        let h = resolve_chain_in(&c, "x", &opts).unwrap().pop().unwrap();
        let local = local_host_name();
        let short = local.split('.').next().unwrap();
        assert_eq!(
            h.certificate_files,
            vec![PathBuf::from(format!("/home/u/x/{short}-cert.pub"))]
        );
    }

    #[test]
    fn proxy_jump_none_and_tokens() {
        let c = SshConfigFile::parse_str(
            "Host n\n  ProxyJump none\n  IdentityFile /k/%h-%p-%r\n  HostName real.%h\n",
        )
        .unwrap();
        let h = c.resolve("n").unwrap();
        assert!(h.proxy_jump.is_empty());
        assert_eq!(h.host_name, "real.n");
        let u = h.user.clone();
        assert_eq!(
            h.identity_files,
            vec![PathBuf::from(format!("/k/real.n-22-{u}"))]
        );
    }

    #[test]
    fn proxy_command_and_proxy_jump_first_value_wins() {
        let dir = tempfile::tempdir().unwrap();
        let inc = dir.path().join("inc.conf");
        std::fs::write(&inc, "Host inc\n  ProxyCommand from-include %h\n").unwrap();
        let text = format!(
            "Include {}
Host special
  ProxyCommand nc X %h
Host pj
  ProxyJump none
Host pc
  ProxyCommand none
Host both
  ProxyJump j1
  ProxyCommand c
Host both2
  ProxyCommand=c2 \"%n\"  # kept
  ProxyJump j2
Host lateproxy
  ProxyJump none
Host lateproxy
  ProxyCommand late %h
Host * !lateproxy !bastion
  ProxyJump bastion
",
            inc.display()
        );
        let c = SshConfigFile::parse_str(&text).unwrap();
        let proxy = |host: &str, options: &[&str], jump: Option<&str>| {
            let opts = SshOptions {
                options: options.iter().map(|o| (*o).to_owned()).collect(),
                jump: jump.map(str::to_owned),
                ..SshOptions::default()
            };
            let chain = resolve_chain_in(&c, host, &opts).unwrap();
            let h = chain.last().unwrap();
            (h.proxy_jump.clone(), h.proxy_command.clone())
        };
        let none = (vec![], None);
        let jump = |j: &str| (vec![j.to_owned()], None);
        let command = |c: &str| (vec![], Some(c.to_owned()));
        // What `ssh -G` says of each (OpenSSH 9.2).
        assert_eq!(proxy("special", &[], None), command("nc X special"));
        assert_eq!(
            proxy("pj", &[], None),
            none,
            "ProxyJump none, then a ProxyJump"
        );
        assert_eq!(
            proxy("pc", &[], None),
            none,
            "ProxyCommand none, then a ProxyJump"
        );
        assert_eq!(proxy("both", &[], None), jump("j1"));
        assert_eq!(proxy("both2", &[], None), command("c2 \"both2\"  # kept"));
        assert_eq!(
            proxy("lateproxy", &[], None),
            command("late lateproxy"),
            "ProxyJump none leaves a later ProxyCommand in effect"
        );
        assert_eq!(proxy("inc", &[], None), command("from-include inc"));
        assert_eq!(proxy("other", &[], None), jump("bastion"));
        // The command line comes first: -J, then -o in order.
        assert_eq!(proxy("special", &[], Some("k")), jump("k"));
        assert_eq!(proxy("other", &["ProxyCommand=none"], None), none);
        assert_eq!(
            proxy("special", &["ProxyJump=none"], None),
            command("nc X special")
        );
        assert_eq!(
            proxy("other", &["ProxyCommand=p %p", "ProxyJump=j"], None),
            command("p 22")
        );
        // An Include inside a block for other hosts reads nothing that applies.
        let c = SshConfigFile::parse_str(&format!(
            "Host elsewhere\nInclude {}\nHost *\n  ProxyJump b\n",
            inc.display()
        ))
        .unwrap();
        assert_eq!(c.resolve("inc").unwrap().proxy_jump, vec!["b".to_owned()]);
        assert_eq!(c.resolve("inc").unwrap().proxy_command, None);
    }

    #[test]
    fn tokens_and_environment_variables_in_paths() {
        let c = SshConfigFile::parse_str(
            "Host t\n  HostName real.%h\n  User remote\n  Port 2200\n  HostKeyAlias ka
  IdentityFile /k/%i/%u/%L/%l/%k/%n/%h/%p/%r/%%
  IdentityFile ${PATH}/%C
  UserKnownHostsFile %d/kh ~root/kh2
  IdentityAgent /run/%i/agent
Host unknown
  IdentityFile /k/%x
Host unset
  UserKnownHostsFile /k/${FASTCP_TEST_UNSET_VARIABLE}
Host agentunset
  IdentityAgent ${FASTCP_TEST_UNSET_VARIABLE}/agent
Host proxy
  ProxyCommand nc %h %l
Host name
  HostName %%h.%h
",
        )
        .unwrap();
        let h = c.resolve("t").unwrap();
        let uid = rustix::process::getuid().as_raw();
        let me = passwd_entry().unwrap();
        let local = local_host_name();
        assert!(!local.is_empty());
        let short = local.split('.').next().unwrap();
        assert_eq!(
            h.identity_files[0],
            PathBuf::from(format!(
                "/k/{uid}/{}/{short}/{local}/ka/t/real.t/2200/remote/%",
                me.name
            ))
        );
        let hash = connection_hash(&local, "real.t", 2200, "remote");
        let path = std::env::var("PATH").unwrap();
        assert_eq!(h.identity_files[1], PathBuf::from(format!("{path}/{hash}")));
        assert_eq!(
            h.user_known_hosts_files,
            vec![me.dir.join("kh"), PathBuf::from("/root/kh2")]
        );
        assert_eq!(
            h.identity_agent,
            Some(PathBuf::from(format!("/run/{uid}/agent")))
        );
        // ssh's own %C for this machine "vm", host "h", port 22, user "root".
        assert_eq!(
            connection_hash("vm", "h", 22, "root"),
            "f6c7b5c5686c0e29702f588dbcf31794a61da818"
        );
        for (host, says) in [
            ("unknown", "unknown key %x"),
            (
                "unset",
                "env var ${FASTCP_TEST_UNSET_VARIABLE} has no value",
            ),
            (
                "agentunset",
                "env var ${FASTCP_TEST_UNSET_VARIABLE} has no value",
            ),
            ("proxy", "unknown key %l"),
        ] {
            let e = c.resolve(host).unwrap_err();
            assert!(matches!(e, Error::Config(_)), "{host}: {e}");
            assert!(e.to_string().contains(says), "{host}: {e}");
        }
        assert_eq!(c.resolve("name").unwrap().host_name, "%h.name");
        // `-i` files take the same tokens; a user without an entry is an error.
        let opts = SshOptions {
            identity_files: vec!["/k/%n".into(), "~nosuchuser-fastcp/k".into()],
            ..SshOptions::default()
        };
        let e = resolve_chain_in(&c, "x", &opts).unwrap_err();
        assert!(
            e.to_string().contains("No such user nosuchuser-fastcp"),
            "{e}"
        );
        let opts = SshOptions {
            identity_files: vec!["/k/%n".into(), "~root".into()],
            ..SshOptions::default()
        };
        let h = resolve_chain_in(&c, "x", &opts).unwrap().pop().unwrap();
        assert_eq!(
            &h.identity_files[..2],
            [PathBuf::from("/k/x"), PathBuf::from("/root")]
        );
    }

    /// ssh takes `~`, `%d`, `%u` and the default user from the password database, whatever
    /// `$HOME` and `$USER` say. The check runs in a child process with both set elsewhere.
    #[test]
    fn the_home_and_user_come_from_the_password_database() {
        const CHILD: &str = "FASTCP_TEST_PASSWD_CHILD";
        let name = "ssh::config::tests::the_home_and_user_come_from_the_password_database";
        if std::env::var_os(CHILD).is_some() {
            let me = passwd_entry().unwrap();
            assert_eq!(home_dir(), Some(me.dir.clone()));
            let c = SshConfigFile::parse_str(
                "Host h\n  IdentityFile ~/.ssh/k\n  UserKnownHostsFile ~/kh %d/%u\n",
            )
            .unwrap();
            let h = c.resolve("h").unwrap();
            assert_eq!(h.identity_files, vec![me.dir.join(".ssh/k")]);
            assert_eq!(
                h.user_known_hosts_files,
                vec![me.dir.join("kh"), me.dir.join(&me.name)]
            );
            assert_eq!(h.user, me.name);
            let none = SshConfigFile::parse_str("").unwrap().resolve("h").unwrap();
            assert_eq!(
                none.user_known_hosts_files[0],
                me.dir.join(".ssh/known_hosts")
            );
            assert_eq!(none.identity_files[0], me.dir.join(".ssh/id_rsa"));
            return;
        }
        let elsewhere = tempfile::tempdir().unwrap();
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args(["--exact", name, "--nocapture", "--test-threads=1"])
            .env(CHILD, "1")
            .env("HOME", elsewhere.path())
            .env("USER", "someone-else")
            .env("LOGNAME", "someone-else")
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && stdout.contains("1 passed"),
            "{stdout}{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    #[test]
    fn hop_parsing() {
        assert_eq!(parse_hop("h").unwrap(), (None, "h", None));
        assert_eq!(parse_hop("u@h:22").unwrap(), (Some("u"), "h", Some(22)));
        assert_eq!(
            parse_hop("ssh://u@[::1]:2222").unwrap(),
            (Some("u"), "::1", Some(2222))
        );
        assert_eq!(parse_hop("fe80::1").unwrap(), (None, "fe80::1", None));
        assert!(parse_hop("h:notaport").is_err());
        assert!(parse_hop("-oops").is_err());
    }

    /// The ticket check runs `klist -s`: its exit status decides, and a missing or stalled
    /// program counts as no ticket.
    #[test]
    fn a_kerberos_ticket_is_what_klist_says() {
        assert!(exits_zero("true", &["-s"], KLIST_WAIT));
        assert!(!exits_zero("false", &["-s"], KLIST_WAIT));
        assert!(!exits_zero("/nonexistent/klist", &["-s"], KLIST_WAIT));
        assert!(!exits_zero("sleep", &["30"], Duration::from_millis(50)));
    }

    /// Without `-F`, ssh reads the user's file, then the system-wide one: the user's values
    /// win, IdentityFile lines add up, and a relative `Include` in the system file is
    /// beneath its folder.
    #[test]
    fn the_system_file_is_read_after_the_users() {
        let dir = tempfile::tempdir().unwrap();
        let user = dir.path().join("user_config");
        std::fs::write(&user, "Host build\n  Port 2202\n  IdentityFile /k/user\n").unwrap();
        let etc = dir.path().join("etc");
        std::fs::create_dir_all(etc.join("conf.d")).unwrap();
        let system = etc.join("ssh_config");
        std::fs::write(
            &system,
            "Include conf.d/*.conf\nHost *\n  User sysuser\n  Port 1\n  HostName sys.%h\n",
        )
        .unwrap();
        std::fs::write(
            etc.join("conf.d/10-hop.conf"),
            "Host build\n  IdentityFile /k/sys\n  ProxyJump hop\n",
        )
        .unwrap();
        let files = SshConfigFile::load_files(Some(&user), Some(&system)).unwrap();
        let h = files.resolve("build").unwrap();
        assert_eq!(h.port, 2202);
        assert_eq!(h.user, "sysuser");
        assert_eq!(h.host_name, "sys.build");
        assert_eq!(
            h.identity_files,
            vec![PathBuf::from("/k/user"), PathBuf::from("/k/sys")]
        );
        assert_eq!(h.proxy_jump, vec!["hop".to_owned()]);
        // The system file alone, and `-F` reading only its own file.
        let h = SshConfigFile::load_files(None, Some(&system))
            .unwrap()
            .resolve("other")
            .unwrap();
        assert_eq!((h.port, h.host_name.as_str()), (1, "sys.other"));
        // What the system file holds that the built-in client does not follow goes to the
        // system ssh, named in the error: a `Match`, a relative Include in an included file
        // (beneath /etc/ssh for ssh), a value ssh takes and this reader does not.
        for (name, text, said) in [
            (
                "20-match.conf",
                "Match user x\n  Port 3\n",
                "20-match.conf line 1",
            ),
            ("20-nested.conf", "Include nested.conf\n", "20-nested.conf"),
            (
                "20-value.conf",
                "RemoteForward 8080 localhost:ssh\n",
                "ssh_config",
            ),
        ] {
            std::fs::write(etc.join("conf.d").join(name), text).unwrap();
            let e = SshConfigFile::load_files(Some(&user), Some(&system)).unwrap_err();
            assert!(matches!(e, Error::NeedsSystemSsh(_)), "{name}: {e}");
            assert!(e.to_string().contains(said), "{name}: {e}");
            std::fs::remove_file(etc.join("conf.d").join(name)).unwrap();
        }
        // The same value in the user's own file is the user's to mend.
        std::fs::write(&user, "RemoteForward 8080 localhost:ssh\n").unwrap();
        let e = SshConfigFile::load_files(Some(&user), Some(&system)).unwrap_err();
        assert!(matches!(e, Error::Config(_)), "{e}");
        // A comment after a relative Include of the system file.
        std::fs::write(&user, "").unwrap();
        std::fs::write(
            &system,
            "Include conf.d/*.conf # local policy\nHost *\n  Port 1\n",
        )
        .unwrap();
        let files = SshConfigFile::load_files(Some(&user), Some(&system)).unwrap();
        assert_eq!(files.resolve("build").unwrap().proxy_jump, vec!["hop"]);
    }

    /// As ssh: a key given twice in one block keeps its first value, in an included file
    /// too, whether `ssh2-config` models the key or not.
    #[test]
    fn a_key_given_twice_in_a_block_keeps_its_first_value() {
        let dir = tempfile::tempdir().unwrap();
        let inc = dir.path().join("inc.conf");
        std::fs::write(&inc, "Host b\n  User b1\n  User b2\n").unwrap();
        let text = format!(
            "Include {}\nHost a\n  Port 2222\n  PORT=2223\n  User u1\n  User u2\n  \
             HostName h1\n  HostName h2\n  StrictHostKeyChecking yes\n  \
             StrictHostKeyChecking no\n  IdentityFile /k/1\n  IdentityFile /k/2\n",
            inc.display()
        );
        let c = SshConfigFile::parse_str(&text).unwrap();
        let h = c.resolve("a").unwrap();
        assert_eq!(
            (h.port, h.user.as_str(), h.host_name.as_str()),
            (2222, "u1", "h1")
        );
        assert_eq!(h.strict_host_key_checking, StrictHostKeyChecking::Yes);
        assert_eq!(
            h.identity_files,
            [PathBuf::from("/k/1"), PathBuf::from("/k/2")]
        );
        assert_eq!(c.resolve("b").unwrap().user, "b1");
    }

    /// Values ssh takes and `ssh2-config` does not: those of keys only interactive ssh uses
    /// are passed over, in an included file too, and times take ssh's units.
    #[test]
    fn values_ssh_takes_are_taken() {
        let dir = tempfile::tempdir().unwrap();
        let inc = dir.path().join("inc.conf");
        std::fs::write(
            &inc,
            "Host *\n  AddKeysToAgent confirm\n  ForwardAgent $SSH_AUTH_SOCK\n",
        )
        .unwrap();
        let text = format!(
            "Include {}\nHost a\n  PubkeyAuthentication unbound\n  AddKeysToAgent 1h\n  \
             ConnectTimeout 1m\n  ServerAliveInterval 1h30s\nHost b\n  ConnectTimeout none\n",
            inc.display()
        );
        let c = SshConfigFile::parse_str(&text).unwrap();
        let h = c.resolve("a").unwrap();
        assert_eq!(h.connect_timeout, Some(Duration::from_secs(60)));
        assert_eq!(h.server_alive_interval, Some(Duration::from_secs(3630)));
        assert_eq!(c.resolve("b").unwrap().connect_timeout, None);
        let opts = SshOptions {
            options: vec!["ConnectTimeout=10s".into(), "ServerAliveInterval=2m".into()],
            ..SshOptions::default()
        };
        let h = resolve_chain_in(&c, "x", &opts).unwrap().remove(0);
        assert_eq!(h.connect_timeout, Some(Duration::from_secs(10)));
        assert_eq!(h.server_alive_interval, Some(Duration::from_secs(120)));
        for bad in ["ConnectTimeout 1x", "ServerAliveInterval m"] {
            assert!(SshConfigFile::parse_str(bad).is_err(), "{bad}");
        }
    }

    /// With `CanonicalizeHostname`, ssh reads the files again for the canonical name (or the
    /// HostName), whose blocks may name another user: that is the system ssh's to do.
    #[test]
    fn canonicalize_host_name_needs_the_system_ssh() {
        let text = "Host web\n  HostName web.internal\nHost *.internal\n  User admin\n";
        for (first, refused) in [
            (
                "CanonicalizeHostname yes\nCanonicalDomains example.com\n",
                true,
            ),
            ("CanonicalizeHostname always\n", true),
            ("CanonicalizeHostname no\n", false),
            ("", false),
        ] {
            let c = SshConfigFile::parse_str(&format!("{first}{text}")).unwrap();
            match c.resolve("web") {
                Err(Error::NeedsSystemSsh(m)) if refused => {
                    assert!(m.contains("canonicalizehostname"), "{m}")
                }
                Ok(h) if !refused => assert_eq!(h.user, local_user()),
                r => panic!("{first}: {r:?}"),
            }
        }
    }

    /// `BindAddress` and `BindInterface` choose the source address: the system ssh's to do.
    #[test]
    fn bind_address_needs_the_system_ssh() {
        for text in ["BindAddress 127.0.0.2\n", "Host *\n  BindInterface eth1\n"] {
            let c = SshConfigFile::parse_str(text).unwrap();
            let e = c.resolve("x").unwrap_err();
            assert!(matches!(e, Error::NeedsSystemSsh(_)), "{text}: {e}");
        }
    }

    /// `AddressFamily` from ssh_config, and from `-o` (what `-4` and `-6` give) first.
    #[test]
    fn address_family() {
        let c = SshConfigFile::parse_str("Host v4\n  AddressFamily inet\n").unwrap();
        assert_eq!(c.resolve("v4").unwrap().address_family, AddressFamily::Inet);
        assert_eq!(c.resolve("x").unwrap().address_family, AddressFamily::Any);
        let opts = SshOptions {
            options: vec!["AddressFamily=inet6".into()],
            ..SshOptions::default()
        };
        let chain = resolve_chain_in(&c, "v4", &opts).unwrap();
        assert_eq!(chain[0].address_family, AddressFamily::Inet6);
        let bad = SshConfigFile::parse_str("AddressFamily ipv4\n").unwrap();
        assert!(matches!(bad.resolve("x"), Err(Error::Config(_))));
    }

    /// `Match all` at the top of its file applies to every host, its values first, as ssh
    /// reads it; any other `Match` is refused, `Match final all` (Fedora's system-wide file)
    /// and `Match canonical all` too, which apply in ssh's second reading.
    #[test]
    fn a_match_all_block_applies_to_every_host() {
        let c = SshConfigFile::parse_str(
            "Match all # every host\n  Port 2022\n  SendEnv LANG\nHost a\n  User ua\n  Port 22\n",
        )
        .unwrap();
        assert_eq!(c.resolve("a").unwrap().port, 2022);
        assert_eq!(c.resolve("a").unwrap().user, "ua");
        assert_eq!(c.resolve("b").unwrap().port, 2022);
        for text in [
            "Host a\n  User ua\nMatch all\n  Port 1\n",
            "Match final all\n  Port 1\n",
            "Match canonical all\n  Port 1\n",
            "Match all all\n  Port 1\n",
            "Match final host x\n  Port 1\n",
            "Match all\n  Port 1\nMatch all\n  Port 2\n",
        ] {
            let e = SshConfigFile::parse_str(text).unwrap_err();
            assert!(matches!(e, Error::NeedsSystemSsh(_)), "{text}: {e}");
        }
    }

    /// As ssh: the host name connected to is lowercased (and so are `%h` and the
    /// known_hosts name); the name as given (`%n`) is kept.
    #[test]
    fn the_host_name_is_lowercased() {
        let c = SshConfigFile::parse_str("Host Box\n  HostName Box.Example\n").unwrap();
        let h = c.resolve("Box").unwrap();
        assert_eq!(
            (h.alias.as_str(), h.host_name.as_str()),
            ("Box", "box.example")
        );
        assert_eq!(h.known_hosts_name(), "box.example");
        let h = c.resolve("Other.HOST").unwrap();
        assert_eq!(h.host_name, "other.host");
        // An IPv6 address keeps its zone's case.
        let h = c.resolve("FE80::1%ETH0").unwrap();
        assert_eq!(h.host_name, "FE80::1%ETH0");
    }

    /// A ControlPath where a master listens (ControlMaster unset) goes to the system ssh,
    /// which would use that master; one where nothing listens is passed over, as ssh does.
    #[test]
    fn a_running_connection_master_goes_to_the_system_ssh() {
        let dir = tempfile::tempdir().unwrap();
        let text = format!(
            "Host m\n  User u\n  ControlPath {}/cm-%r@%h:%p\n",
            dir.path().display()
        );
        let c = SshConfigFile::parse_str(&text).unwrap();
        assert!(c.resolve("m").is_ok());
        let socket = dir.path().join("cm-u@m:22");
        let _master = std::os::unix::net::UnixListener::bind(&socket).unwrap();
        let e = c.resolve("m").unwrap_err();
        assert!(matches!(e, Error::NeedsSystemSsh(_)), "{e}");
        assert!(e.to_string().contains("cm-u@m:22"), "{e}");
        assert!(c.resolve("other").is_ok());
        // A token only a newer ssh knows: the system ssh finds out.
        let c = SshConfigFile::parse_str("Host m\n  ControlPath /tmp/cm-%j\n").unwrap();
        let e = c.resolve("m").unwrap_err();
        assert!(matches!(e, Error::NeedsSystemSsh(_)), "{e}");
    }

    /// A comment after a `Host` line's patterns or an `Include`'s files is no pattern and no
    /// file, as ssh reads them; a quoted known_hosts path keeps its space.
    #[test]
    fn comments_end_host_and_include_lines() {
        let dir = tempfile::tempdir().unwrap();
        let old = dir.path().join("old.conf");
        std::fs::write(&old, "User fromold\nPort 2999\n").unwrap();
        let text = format!(
            "Host web # web server\n  HostName web.example\n  User webuser\n\
             Host *.corp !secret.corp # !ok.corp\n  User corpuser\n\
             Host x\n  Include {}/none.conf # was: {}\n  User xu\n\
             Host k\n  UserKnownHostsFile \"{}/kh one\" {}/kh2\n\
             Host *\n  User other\n",
            dir.path().display(),
            old.display(),
            dir.path().display(),
            dir.path().display()
        );
        let c = SshConfigFile::parse_str(&text).unwrap();
        let h = c.resolve("server").unwrap();
        assert_eq!((h.host_name.as_str(), h.user.as_str()), ("server", "other"));
        assert_eq!(c.resolve("web").unwrap().user, "webuser");
        assert_eq!(c.resolve("ok.corp").unwrap().user, "corpuser");
        assert_eq!(c.resolve("secret.corp").unwrap().user, "other");
        let h = c.resolve("x").unwrap();
        assert_eq!((h.user.as_str(), h.port), ("xu", 22));
        assert_eq!(
            c.resolve("k").unwrap().user_known_hosts_files,
            vec![dir.path().join("kh one"), dir.path().join("kh2")]
        );
        assert_eq!(
            words(r#"a "b c"  d # e "f""#),
            vec!["a".to_owned(), "b c".to_owned(), "d".to_owned()]
        );
    }

    /// An ssh_config algorithm list allows what ssh would: a plain list only its names, `-`
    /// all but what its patterns match, `+` and `^` everything of ours.
    #[test]
    fn algorithm_lists_allow_what_ssh_allows() {
        let ours = [
            "aes128-gcm@openssh.com",
            "aes256-gcm@openssh.com",
            "aes128-ctr",
        ];
        let allow = |list| allowed(list, false, &ours, |a| a);
        assert_eq!(allow(None), ours);
        assert_eq!(allow(Some("aes128-ctr,aes192-ctr")), ["aes128-ctr"]);
        assert_eq!(allow(Some("-aes128-*")), ["aes256-gcm@openssh.com"]);
        assert_eq!(allow(Some("+aes128-cbc")), ours);
        assert_eq!(allow(Some("^aes256-ctr")), ours);
        assert!(allow(Some("aes128-cbc")).is_empty());
        assert!(
            allow(Some("aes128-*")).is_empty(),
            "no patterns in a plain cipher list"
        );
        let keys = ["ssh-ed25519", "rsa-sha2-512", "ecdsa-sha2-nistp256"];
        assert_eq!(
            allowed(Some("ssh-ed25519*"), true, &keys, |a| a),
            ["ssh-ed25519"]
        );
        let c = SshConfigFile::parse_str(
            "Host a\n  Ciphers aes256-ctr # policy\nHost *\n  Ciphers aes128-ctr\n  MACs hmac-sha2-256\n",
        )
        .unwrap();
        let h = c.resolve("a").unwrap();
        assert_eq!(h.algorithms.ciphers.as_deref(), Some("aes256-ctr"));
        assert_eq!(h.algorithms.macs.as_deref(), Some("hmac-sha2-256"));
        assert_eq!(h.algorithms.kex, None);
    }

    /// `PubkeyAuthentication` as ssh takes it, first value winning, `-o` first.
    #[test]
    fn pubkey_authentication_values() {
        let c = SshConfigFile::parse_str(
            "Host n\n  PubkeyAuthentication no\nHost u\n  PubkeyAuthentication unbound\n\
             Host *\n  PubkeyAuthentication yes\n",
        )
        .unwrap();
        assert!(!c.resolve("n").unwrap().pubkey_authentication);
        assert!(c.resolve("u").unwrap().pubkey_authentication);
        assert!(c.resolve("x").unwrap().pubkey_authentication);
        let opts = SshOptions {
            options: vec!["PubkeyAuthentication=no".into()],
            ..SshOptions::default()
        };
        assert!(!resolve_chain_in(&c, "x", &opts).unwrap()[0].pubkey_authentication);
        let c = SshConfigFile::parse_str("Host b\n  PubkeyAuthentication maybe\n").unwrap();
        assert!(c.resolve("b").is_err());
    }
}
