//! Host resolution: ssh_config (via `ssh2-config`) plus command-line overrides.
//!
//! `ssh2-config` parses the file, handles `Host` patterns (wildcards, negation, first value
//! wins), `Include`, and the keys HostName, Port, User, IdentityFile, ProxyJump and
//! ConnectTimeout. The keys it does not model (IdentitiesOnly, StrictHostKeyChecking,
//! UserKnownHostsFile, GlobalKnownHostsFile, HashKnownHosts, BatchMode, HostKeyAlias,
//! IdentityAgent, ProxyCommand, PasswordAuthentication, KbdInteractiveAuthentication,
//! NumberOfPasswordPrompts, ServerAliveCountMax) are read here from its "unsupported fields"
//! map.
//!
//! `CertificateFile` is read here too (from `-o` and the file), and so are its lines: ssh
//! offers every one, `ssh2-config` keeps only one.
//!
//! What only the system ssh does is not guessed at: a `Match` block (which could connect
//! somewhere else, or as someone else, than `ssh` would), more than one `CertificateFile`
//! line, GSSAPI, a connection master (ControlMaster, ControlPath), a PKCS#11 or
//! security-key provider, KnownHostsCommand, a host certificate authority in known_hosts,
//! or an `-o` option the built-in client lacks all fail with [`Error::NeedsSystemSsh`], and
//! the `fastcp` command then runs the system ssh.

use std::io::BufReader;
use std::path::{Path, PathBuf};
use std::time::Duration;

use ssh2_config::{ParseRule, SshConfig};

use super::Error;
use super::client::SshClientConfig;

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

/// Everything needed to reach a destination: which ssh_config to read, the settings that
/// override it (as ssh's command-line flags do), and fastcp's own knobs.
#[derive(Clone, Debug, Default)]
pub struct SshOptions {
    /// ssh_config to read (`-F`); `None` reads `~/.ssh/config` if it exists.
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

/// One host's settings after ssh_config and overrides are applied.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostConfig {
    /// The name as given (alias or host name).
    pub alias: String,
    /// Where to connect (HostName, or the alias).
    pub host_name: String,
    /// TCP port.
    pub port: u16,
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

/// Where each line whose keyword is `keyword` (lowercase) is, in `text` and the files it
/// `Include`s (at most 16 deep), as ssh reads them: a relative `Include` path is beneath
/// `~/.ssh`, and may hold wildcards.
fn keyword_lines(text: &str, keyword: &str, home: Option<&Path>, depth: usize) -> Vec<String> {
    let mut found = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let mut words = line
            .trim_start()
            .split(|c: char| c.is_whitespace() || c == '=')
            .filter(|w| !w.is_empty());
        let kw = words.next().unwrap_or("");
        if kw.eq_ignore_ascii_case(keyword) {
            found.push(format!("line {}", i + 1));
        }
        if !kw.eq_ignore_ascii_case("include") || depth >= 16 {
            continue;
        }
        for arg in words {
            let arg = arg.trim_matches('"');
            let path = match (arg.strip_prefix("~/"), home) {
                (Some(rest), Some(h)) => h.join(rest),
                _ if Path::new(arg).is_absolute() => PathBuf::from(arg),
                (None, Some(h)) => h.join(".ssh").join(arg),
                (_, None) => continue,
            };
            let Ok(paths) = glob::glob(&path.to_string_lossy()) else {
                continue;
            };
            for p in paths.flatten() {
                if let Ok(included) = std::fs::read_to_string(&p) {
                    for at in keyword_lines(&included, keyword, home, depth + 1) {
                        found.push(format!("{} {at}", p.display()));
                    }
                }
            }
        }
    }
    found
}

/// A parsed ssh_config file.
#[derive(Debug, Clone)]
pub struct SshConfigFile {
    parsed: SshConfig,
    home: Option<PathBuf>,
    /// Where the file's `CertificateFile` lines are: ssh offers each, `ssh2-config` keeps
    /// one, so a host given more than one goes to the system ssh.
    certificate_lines: Vec<String>,
}

impl SshConfigFile {
    /// Reads `path`, or `~/.ssh/config` (if it exists) when `path` is `None`.
    pub fn load(path: Option<&Path>) -> Result<Self, Error> {
        let home = home_dir();
        let path = match path {
            // As ssh's `-F none`: no configuration file at all.
            Some(p) if p.as_os_str() == "none" => None,
            Some(p) => Some(p.to_path_buf()),
            None => home
                .as_ref()
                .map(|h| h.join(".ssh/config"))
                .filter(|p| p.exists()),
        };
        match path {
            None => Self::parse_str(""),
            Some(p) => {
                let text = std::fs::read_to_string(&p)
                    .map_err(|e| Error::Config(format!("cannot read {}: {e}", p.display())))?;
                Self::parse_with_home(&text, home).map_err(|e| match e {
                    Error::Config(m) => Error::Config(format!("{}: {m}", p.display())),
                    e => e,
                })
            }
        }
    }

    /// Parses ssh_config text (`~` expands to `$HOME`).
    pub fn parse_str(text: &str) -> Result<Self, Error> {
        Self::parse_with_home(text, home_dir())
    }

    fn parse_with_home(text: &str, home: Option<PathBuf>) -> Result<Self, Error> {
        if let Some(at) = keyword_lines(text, "match", home.as_deref(), 0).first() {
            return Err(Error::NeedsSystemSsh(format!(
                "ssh_config {at}: a `Match` block"
            )));
        }
        let certificate_lines = keyword_lines(text, "certificatefile", home.as_deref(), 0);
        let mut cfg = SshConfig::default();
        if let Some(h) = &home {
            cfg = cfg.home_dir(h);
        }
        let parsed = cfg
            .parse(
                &mut BufReader::new(text.as_bytes()),
                ParseRule::ALLOW_UNKNOWN_FIELDS | ParseRule::ALLOW_UNSUPPORTED_FIELDS,
            )
            .map_err(|e| Error::Config(e.to_string()))?;
        Ok(SshConfigFile {
            parsed,
            home,
            certificate_lines,
        })
    }

    /// Resolves `host` (an alias or a name, no `user@`) through this file only.
    pub fn resolve(&self, host: &str) -> Result<HostConfig, Error> {
        self.resolve_with(host, None, &Overrides::default())
    }

    fn resolve_with(
        &self,
        host: &str,
        dest_user: Option<&str>,
        ov: &Overrides,
    ) -> Result<HostConfig, Error> {
        let p = self.parsed.query(host);
        let extra = |key: &str| -> Option<String> {
            p.unsupported_fields.get(key).map(|args| {
                args.iter()
                    .map(|a| unquote(a))
                    .collect::<Vec<_>>()
                    .join(" ")
            })
        };
        let host_name = ov
            .host_name
            .clone()
            .or(p.host_name.clone())
            .unwrap_or_else(|| host.to_owned());
        let host_name = host_name.replace("%h", host).replace("%%", "%");
        let port = ov.port.or(p.port).unwrap_or(22);
        let user = ov
            .user
            .clone()
            .or(dest_user.map(str::to_owned))
            .or(p.user.clone())
            .unwrap_or_else(local_user);
        let tokens = Tokens {
            home: self.home.clone(),
            host: &host_name,
            alias: host,
            port,
            user: &user,
        };

        let mut identity_files: Vec<PathBuf> = ov.identity_files.clone();
        identity_files.extend(p.identity_file.clone().unwrap_or_default());
        let explicit_identities = !identity_files.is_empty();
        let identity_files: Vec<PathBuf> = if explicit_identities {
            identity_files
                .iter()
                .map(|f| tokens.expand_path(f))
                .collect()
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
        let password_authentication =
            bool_opt("passwordauthentication", ov.password_authentication)?.unwrap_or(true);
        let kbd_interactive_authentication = match ov.kbd_interactive_authentication {
            Some(v) => v,
            None => bool_opt("kbdinteractiveauthentication", None)?
                .or(bool_opt("challengeresponseauthentication", None)?)
                .unwrap_or(true),
        };
        let number_of_password_prompts = match ov.number_of_password_prompts {
            Some(n) => n,
            None => extra("numberofpasswordprompts")
                .map(|v| {
                    v.parse().map_err(|_| {
                        Error::Config(format!("NumberOfPasswordPrompts {v:?}: expected a number"))
                    })
                })
                .transpose()?
                .unwrap_or(3),
        };
        let hash_known_hosts = bool_opt("hashknownhosts", ov.hash_known_hosts)?.unwrap_or(false);
        let strict_host_key_checking = match &ov.strict {
            Some(s) => *s,
            None => extra("stricthostkeychecking")
                .map(|v| StrictHostKeyChecking::parse(&v))
                .transpose()?
                .unwrap_or_default(),
        };
        let files = |v: String| -> Vec<PathBuf> {
            v.split_whitespace()
                .filter(|f| !f.eq_ignore_ascii_case("none"))
                .map(|f| tokens.expand_path(Path::new(f)))
                .collect()
        };
        let user_known_hosts_files =
            match ov.user_known_hosts.clone().or(extra("userknownhostsfile")) {
                Some(v) => files(v),
                None => match &self.home {
                    Some(h) => vec![h.join(".ssh/known_hosts"), h.join(".ssh/known_hosts2")],
                    None => vec![],
                },
            };
        let global_known_hosts_files = match ov
            .global_known_hosts
            .clone()
            .or(extra("globalknownhostsfile"))
        {
            Some(v) => files(v),
            None => vec![
                PathBuf::from("/etc/ssh/ssh_known_hosts"),
                PathBuf::from("/etc/ssh/ssh_known_hosts2"),
            ],
        };
        let proxy_jump = match &ov.jump {
            Some(j) => split_jumps(j),
            None => p.proxy_jump.clone().unwrap_or_default(),
        };
        let proxy_jump = if proxy_jump.len() == 1 && proxy_jump[0].eq_ignore_ascii_case("none") {
            vec![]
        } else {
            proxy_jump
        };
        let connect_timeout = ov
            .connect_timeout
            .or(p.connect_timeout)
            .filter(|d| !d.is_zero());
        let host_key_alias = ov.host_key_alias.clone().or(extra("hostkeyalias"));
        // Keys ssh2-config leaves to us, whether it knows them (unsupported) or not (ignored).
        let any = |key: &str| -> Option<String> {
            extra(key).or_else(|| p.ignored_fields.get(key).map(|args| args.join(" ")))
        };
        // As ssh: CertificateFile from `-o` first, then ssh_config's.
        let mut certificate_files = ov.certificate_files.clone();
        if let Some(f) = &p.certificate_file {
            if self.certificate_lines.len() > 1 {
                return Err(Error::NeedsSystemSsh(format!(
                    "several CertificateFile lines in ssh_config ({}) for {host}",
                    self.certificate_lines.join(", ")
                )));
            }
            certificate_files.push(f.clone());
        }
        let certificate_files: Vec<PathBuf> = certificate_files
            .iter()
            .map(|f| tokens.expand_path(f))
            .collect();
        for key in ["pkcs11provider", "securitykeyprovider", "knownhostscommand"] {
            if any(key).is_some_and(|v| !v.eq_ignore_ascii_case("none")) {
                return Err(Error::NeedsSystemSsh(format!("{key} for {host}")));
            }
        }
        for key in ["gssapiauthentication", "controlmaster"] {
            if any(key).is_some_and(|v| !v.eq_ignore_ascii_case("no")) {
                return Err(Error::NeedsSystemSsh(format!("{key} for {host}")));
            }
        }
        let identity_agent = match ov.identity_agent.clone().or(extra("identityagent")) {
            Some(v) if v.eq_ignore_ascii_case("none") => None,
            Some(v) if v == "SSH_AUTH_SOCK" => std::env::var_os("SSH_AUTH_SOCK").map(PathBuf::from),
            Some(v) => match v.strip_prefix('$') {
                Some(var) => std::env::var_os(var).map(PathBuf::from),
                None => Some(tokens.expand_path(Path::new(&v))),
            },
            None => std::env::var_os("SSH_AUTH_SOCK")
                .filter(|s| !s.is_empty())
                .map(PathBuf::from),
        };
        // ProxyCommand: its tokens expanded now, run through `sh -c` when connecting.
        let proxy_command = ov
            .proxy_command
            .clone()
            .or_else(|| extra("proxycommand"))
            .filter(|pc| !pc.eq_ignore_ascii_case("none"))
            .map(|pc| expand_proxy_tokens(&pc, &host_name, host, port, &user));
        let server_alive_interval = ov
            .server_alive_interval
            .or(p.server_alive_interval)
            .filter(|d| !d.is_zero());
        let server_alive_count_max = match ov.server_alive_count_max {
            Some(n) => n,
            None => extra("serveralivecountmax")
                .map(|v| {
                    v.parse().map_err(|_| {
                        Error::Config(format!("ServerAliveCountMax {v:?}: expected a number"))
                    })
                })
                .transpose()?
                .unwrap_or(3),
        };
        let config = HostConfig {
            alias: host.to_owned(),
            host_name,
            port,
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
            kbd_interactive_authentication,
            number_of_password_prompts,
            server_alive_interval,
            server_alive_count_max,
            proxy_command,
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
            Some(p) => (h, Some(p.parse().map_err(|_| bad())?)),
            None if after.is_empty() => (h, None),
            None => return Err(bad()),
        }
    } else {
        match rest.rsplit_once(':') {
            Some((h, p)) if !h.contains(':') => (h, Some(p.parse().map_err(|_| bad())?)),
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
    user: Option<String>,
    identity_files: Vec<PathBuf>,
    identities_only: Option<bool>,
    certificate_files: Vec<PathBuf>,
    jump: Option<String>,
    strict: Option<StrictHostKeyChecking>,
    user_known_hosts: Option<String>,
    global_known_hosts: Option<String>,
    hash_known_hosts: Option<bool>,
    connect_timeout: Option<Duration>,
    batch_mode: Option<bool>,
    host_key_alias: Option<String>,
    identity_agent: Option<String>,
    password_authentication: Option<bool>,
    kbd_interactive_authentication: Option<bool>,
    number_of_password_prompts: Option<u32>,
    server_alive_interval: Option<Duration>,
    server_alive_count_max: Option<u32>,
    proxy_command: Option<String>,
}

impl Overrides {
    fn from_options(o: &SshOptions) -> Result<Self, Error> {
        let mut ov = Overrides {
            port: o.port,
            user: o.user.clone(),
            identity_files: o.identity_files.clone(),
            jump: o.jump.clone(),
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
                    v.parse()
                        .map_err(|_| Error::Config(format!("-o {opt}: bad port")))?,
                ),
                "user" => set_once(&mut ov.user, v),
                "identityfile" => ov.identity_files.push(PathBuf::from(v)),
                "identitiesonly" => set_once(&mut ov.identities_only, parse_yes_no(key, &v)?),
                "certificatefile" => ov.certificate_files.push(PathBuf::from(v)),
                "proxyjump" => set_once(&mut ov.jump, v),
                "stricthostkeychecking" => {
                    set_once(&mut ov.strict, StrictHostKeyChecking::parse(&v)?)
                }
                "userknownhostsfile" => set_once(&mut ov.user_known_hosts, v),
                "globalknownhostsfile" => set_once(&mut ov.global_known_hosts, v),
                "hashknownhosts" => set_once(&mut ov.hash_known_hosts, parse_yes_no(key, &v)?),
                "connecttimeout" => set_once(
                    &mut ov.connect_timeout,
                    Duration::from_secs(v.parse().map_err(|_| {
                        Error::Config(format!("-o {opt}: ConnectTimeout takes whole seconds"))
                    })?),
                ),
                "batchmode" => set_once(&mut ov.batch_mode, parse_yes_no(key, &v)?),
                "hostkeyalias" => set_once(&mut ov.host_key_alias, v),
                "identityagent" => set_once(&mut ov.identity_agent, v),
                "passwordauthentication" => {
                    set_once(&mut ov.password_authentication, parse_yes_no(key, &v)?)
                }
                "kbdinteractiveauthentication" | "challengeresponseauthentication" => set_once(
                    &mut ov.kbd_interactive_authentication,
                    parse_yes_no(key, &v)?,
                ),
                "proxycommand" => set_once(&mut ov.proxy_command, v),
                "serveraliveinterval" => set_once(
                    &mut ov.server_alive_interval,
                    Duration::from_secs(v.parse().map_err(|_| {
                        Error::Config(format!("-o {opt}: ServerAliveInterval takes whole seconds"))
                    })?),
                ),
                "serveralivecountmax" => set_once(
                    &mut ov.server_alive_count_max,
                    v.parse().map_err(|_| {
                        Error::Config(format!("-o {opt}: ServerAliveCountMax takes a number"))
                    })?,
                ),
                "numberofpasswordprompts" => set_once(
                    &mut ov.number_of_password_prompts,
                    v.parse().map_err(|_| {
                        Error::Config(format!("-o {opt}: NumberOfPasswordPrompts takes a number"))
                    })?,
                ),
                _ => return Err(Error::NeedsSystemSsh(format!("-o {opt}"))),
            }
        }
        Ok(ov)
    }
}

/// Expands ProxyCommand's tokens as ssh does: `%h` the host name, `%n` the name as given,
/// `%p` the port, `%r` the user, `%%` a percent sign.
fn expand_proxy_tokens(pc: &str, host_name: &str, alias: &str, port: u16, user: &str) -> String {
    let mut out = String::with_capacity(pc.len());
    let mut chars = pc.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('h') => out.push_str(host_name),
            Some('n') => out.push_str(alias),
            Some('p') => out.push_str(&port.to_string()),
            Some('r') => out.push_str(user),
            Some('%') => out.push('%'),
            Some(other) => {
                out.push('%');
                out.push(other);
            }
            None => out.push('%'),
        }
    }
    out
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

fn unquote(s: &str) -> String {
    s.strip_prefix('"')
        .and_then(|s| s.strip_suffix('"'))
        .unwrap_or(s)
        .to_owned()
}

struct Tokens<'a> {
    home: Option<PathBuf>,
    host: &'a str,
    alias: &'a str,
    port: u16,
    user: &'a str,
}

impl Tokens<'_> {
    /// Expands `~/` and the `%d %h %n %p %r %u %%` tokens of ssh_config paths.
    fn expand_path(&self, p: &Path) -> PathBuf {
        let s = p.to_string_lossy();
        let home = self
            .home
            .as_ref()
            .map(|h| h.to_string_lossy().into_owned())
            .unwrap_or_default();
        let s = match s.strip_prefix("~/") {
            Some(rest) if !home.is_empty() => format!("{home}/{rest}"),
            _ => s.into_owned(),
        };
        if !s.contains('%') {
            return PathBuf::from(s);
        }
        let mut out = String::new();
        let mut chars = s.chars();
        while let Some(c) = chars.next() {
            if c != '%' {
                out.push(c);
                continue;
            }
            match chars.next() {
                Some('%') => out.push('%'),
                Some('d') => out.push_str(&home),
                Some('h') => out.push_str(self.host),
                Some('n') => out.push_str(self.alias),
                Some('p') => out.push_str(&self.port.to_string()),
                Some('r') => out.push_str(self.user),
                Some('u') => out.push_str(&local_user()),
                Some(o) => {
                    out.push('%');
                    out.push(o);
                }
                None => out.push('%'),
            }
        }
        PathBuf::from(out)
    }
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

fn home_dir() -> Option<PathBuf> {
    std::env::var_os("HOME")
        .filter(|h| !h.is_empty())
        .map(PathBuf::from)
}

/// The local user name: `$USER`, `$LOGNAME`, or the passwd entry of the current uid.
pub(crate) fn local_user() -> String {
    for var in ["USER", "LOGNAME"] {
        if let Some(u) = std::env::var_os(var).filter(|u| !u.is_empty()) {
            return u.to_string_lossy().into_owned();
        }
    }
    let uid = rustix::process::getuid().as_raw().to_string();
    std::fs::read_to_string("/etc/passwd")
        .ok()
        .and_then(|t| {
            t.lines().find_map(|l| {
                let f: Vec<&str> = l.split(':').collect();
                (f.len() > 2 && f[2] == uid).then(|| f[0].to_owned())
            })
        })
        .unwrap_or_else(|| "root".to_owned())
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
        for directive in ["GSSAPIAuthentication yes", "ControlMaster auto"] {
            let c = SshConfigFile::parse_str(&format!("Host p\n  {directive}\n")).unwrap();
            let e = c.resolve("p").expect_err(directive);
            assert!(matches!(e, Error::NeedsSystemSsh(_)), "{directive}: {e}");
        }
        let c = SshConfigFile::parse_str("Host p\n  GSSAPIAuthentication no\n").unwrap();
        assert!(c.resolve("p").is_ok());
        assert!(resolve_chain_in(&c, "-oProxyCommand=x", &SshOptions::default()).is_err());
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
}
