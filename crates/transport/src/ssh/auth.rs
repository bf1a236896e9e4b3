//! Authentication: ssh-agent first, then identity files, then keyboard-interactive and
//! password, in OpenSSH's order.
//!
//! Encrypted identity files ask for their passphrase on `/dev/tty`, and so do passwords and
//! keyboard-interactive prompts, unless the program gave a [`Prompt`] to answer them. Without a terminal, or with `BatchMode yes`, nothing is
//! asked: such methods are skipped and listed in the final error, as ssh does. What was
//! typed is kept in memory only ([`AuthUsed`]), so that more connections to the same host
//! log in without asking again.

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::sync::Arc;

use russh::MethodKind;
use russh::client::{AuthResult, Handle, KeyboardInteractiveAuthResponse};
use russh::keys::agent::AgentIdentity;
use russh::keys::agent::client::AgentClient;
use russh::keys::{PrivateKey, PrivateKeyWithHashAlg, PublicKey};
use zeroize::Zeroizing;

use super::Error;
use super::config::HostConfig;
use super::known_hosts::{fingerprint, key_type_name};

/// The method that logged in, kept so that more connections to the same host
/// ([`SshSession::reconnect`](super::SshSession::reconnect)) need no new prompt.
#[derive(Clone, Debug)]
pub(crate) enum AuthUsed {
    Agent(PublicKey),
    Key(Arc<PrivateKey>),
    /// The password typed for the first connection.
    Password(Arc<Zeroizing<String>>),
    /// The answers typed to keyboard-interactive prompts, with the prompts they answered.
    Interactive(Arc<Answers>),
    /// The server let us in without any credential.
    None,
}

/// What answers the login's questions (a key's passphrase, a password, keyboard-interactive
/// prompts, an unknown host key under `StrictHostKeyChecking ask`) in place of the terminal,
/// for a program with none. It is given each [`Question`] and returns the answer, or `None`
/// to leave it unanswered: the method is then skipped (the host key refused), as ssh skips
/// it without a terminal. A trailing newline is dropped from an answer. Called on a blocking
/// thread, one question at a time (connections that log in at once take turns), and never
/// under `BatchMode yes`, where nothing is asked.
///
/// The built-in client only: the system ssh, named by `ssh_program` or run because
/// ssh_config asks for what only it does (a `Match` block, a ControlPath, a user
/// certificate: [`Error::NeedsSystemSsh`](super::Error::NeedsSystemSsh)), asks for itself.
///
/// ```
/// use fastcp_transport::ssh::{Prompt, QuestionKind, SshClientConfig};
///
/// let client = SshClientConfig {
///     prompt: Some(Prompt::new(|q| {
///         (q.kind == QuestionKind::Passphrase).then(|| "from the vault".to_string())
///     })),
///     ..SshClientConfig::default()
/// };
/// assert!(client.prompt.is_some());
/// ```
#[derive(Clone)]
pub struct Prompt(Arc<PromptFn>);

type PromptFn = dyn Fn(&Question<'_>) -> Option<String> + Send + Sync;

/// One question of the login, for a [`Prompt`].
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub struct Question<'a> {
    /// What is asked.
    pub kind: QuestionKind,
    /// The question as the terminal would show it (the server's text, its control
    /// characters escaped, for a keyboard-interactive prompt).
    pub text: &'a str,
    /// Whether the answer may be shown as it is typed (not for a secret).
    pub echo: bool,
}

/// What a [`Question`] asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum QuestionKind {
    /// The passphrase of an encrypted identity file.
    Passphrase,
    /// The user's password on the server.
    Password,
    /// An answer to one of the server's keyboard-interactive prompts.
    KeyboardInteractive,
    /// Whether to trust an unknown host key: "yes", or its fingerprint, trusts it; any other
    /// answer refuses it.
    HostKey,
}

impl Prompt {
    /// A prompt that answers each question with `answer(question)`.
    pub fn new(answer: impl Fn(&Question<'_>) -> Option<String> + Send + Sync + 'static) -> Prompt {
        Prompt(Arc::new(answer))
    }
}

impl std::fmt::Debug for Prompt {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Prompt")
    }
}

/// Two prompts are equal when they are the same one.
impl PartialEq for Prompt {
    fn eq(&self, other: &Prompt) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for Prompt {}

/// One question at a time, on the terminal or the program's [`Prompt`].
static ASKING: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Asks a question of the program's [`Prompt`], or on the terminal without one (`Ok(None)`
/// when there is none). Blocking.
pub(crate) fn answer(
    custom: Option<&Prompt>,
    kind: QuestionKind,
    text: &str,
    echo: bool,
) -> std::io::Result<Option<Zeroizing<String>>> {
    let Some(p) = custom else {
        return read_tty_line(text, echo);
    };
    let _turn = ASKING.lock().unwrap_or_else(|e| e.into_inner());
    let question = Question { kind, text, echo };
    Ok((p.0)(&question).map(|a| {
        let mut a = Zeroizing::new(a);
        while a.ends_with('\n') || a.ends_with('\r') {
            a.pop();
        }
        a
    }))
}

/// Keyboard-interactive answers, each with the prompt it answered.
pub(crate) type Answers = Vec<(String, Zeroizing<String>)>;

/// The methods the server said can continue, from its last refusal (`None`: not known yet).
type Methods = Option<Vec<MethodKind>>;

/// How long each of the server's answers during the login is waited for (ServerAliveInterval
/// x ServerAliveCountMax, as ssh does; `None`: as long as it takes). A prompt on the terminal
/// is not counted: only the waits for the server are.
#[derive(Clone, Copy)]
struct AnswerWait<'a> {
    limit: Option<std::time::Duration>,
    host: &'a HostConfig,
    /// What answers questions in place of the terminal.
    prompt: Option<&'a Prompt>,
}

impl AnswerWait<'_> {
    /// `f`'s output, or [`Error::LoginTimeout`] once the server has not answered in time.
    async fn raw<T>(&self, f: impl std::future::Future<Output = T>) -> Result<T, Error> {
        let Some(limit) = self.limit else {
            return Ok(f.await);
        };
        tokio::time::timeout(limit, f)
            .await
            .map_err(|_| Error::LoginTimeout {
                host: self.host.host_name.clone(),
                port: self.host.port,
                timeout: limit,
            })
    }

    /// The server's answer to a request of the login.
    async fn on<T>(
        &self,
        f: impl std::future::Future<Output = Result<T, russh::Error>>,
    ) -> Result<T, Error> {
        Ok(self.raw(f).await??)
    }
}

fn note(methods: &mut Methods, res: &AuthResult) {
    if let AuthResult::Failure {
        remaining_methods, ..
    } = res
    {
        *methods = Some(remaining_methods.to_vec());
    }
}

fn offered(methods: &Methods, kind: MethodKind) -> bool {
    methods.as_ref().is_none_or(|m| m.contains(&kind))
}

pub(crate) async fn authenticate<H: russh::client::Handler>(
    handle: &mut Handle<H>,
    host: &HostConfig,
    previous: Option<&AuthUsed>,
    limit: Option<std::time::Duration>,
    prompt: Option<&Prompt>,
) -> Result<AuthUsed, Error> {
    let wait = AnswerWait {
        limit,
        host,
        prompt,
    };
    let user = host.user.clone();
    let mut tried = Vec::new();
    let mut methods: Methods = None;
    let rsa_hash = wait.on(handle.best_supported_rsa_hash()).await?.flatten();

    // What logged in the first connection logs in this one, without asking again.
    match previous {
        Some(AuthUsed::Key(key)) => {
            let res = wait
                .on(handle.authenticate_publickey(
                    &user,
                    PrivateKeyWithHashAlg::new(key.clone(), rsa_hash),
                ))
                .await?;
            if res.success() {
                return Ok(AuthUsed::Key(key.clone()));
            }
        }
        Some(AuthUsed::Password(password)) => {
            let res = wait
                .on(handle.authenticate_password(&user, password.as_str()))
                .await?;
            if res.success() {
                return Ok(AuthUsed::Password(password.clone()));
            }
        }
        Some(AuthUsed::Interactive(answers)) => {
            if let Some(used) = interactive(handle, wait, Some(answers), &mut tried).await? {
                return Ok(used);
            }
        }
        Some(AuthUsed::Agent(_) | AuthUsed::None) | None => {}
    }

    // The public halves of the identity files, to honour IdentitiesOnly with the agent and
    // to avoid offering the same key twice.
    let file_pubs: Vec<Option<PublicKey>> =
        host.identity_files.iter().map(|f| public_half(f)).collect();

    let mut agent_keys = Vec::new();
    if let Some(sock) = &host.identity_agent {
        match AgentClient::connect_uds(sock).await {
            Ok(mut agent) => {
                let ids = agent.request_identities().await.unwrap_or_default();
                for id in ids {
                    let AgentIdentity::PublicKey { key, .. } = id else {
                        continue; // certificates are not offered
                    };
                    let listed = file_pubs
                        .iter()
                        .flatten()
                        .any(|p| p.key_data() == key.key_data());
                    if !host.identities_only || listed {
                        agent_keys.push(key);
                    }
                }
                // As ssh: the agent's copies of the identity files' keys go first, in their
                // order (a server's MaxAuthTries may end the login before the others).
                agent_keys.sort_by_key(|k| {
                    file_pubs
                        .iter()
                        .position(|p| p.as_ref().is_some_and(|p| p.key_data() == k.key_data()))
                        .unwrap_or(usize::MAX)
                });
                // The key that worked on an earlier connection goes first.
                if let Some(AuthUsed::Agent(prev)) = previous
                    && let Some(i) = agent_keys
                        .iter()
                        .position(|k| k.key_data() == prev.key_data())
                {
                    let k = agent_keys.remove(i);
                    agent_keys.insert(0, k);
                }
                if agent_keys.is_empty() {
                    tried.push(format!("agent at {} (no usable key)", sock.display()));
                }
                for key in &agent_keys {
                    tried.push(format!(
                        "agent key {} {}",
                        key_type_name(key),
                        fingerprint(key)
                    ));
                    let signed = handle.authenticate_publickey_with(
                        &user,
                        key.clone(),
                        rsa_hash,
                        &mut agent,
                    );
                    match wait.raw(signed).await? {
                        Ok(r) if r.success() => return Ok(AuthUsed::Agent(key.clone())),
                        Ok(r) => note(&mut methods, &r),
                        Err(e) => {
                            if let Some(t) = tried.last_mut() {
                                t.push_str(&format!(" (agent failed to sign: {e})"));
                            }
                        }
                    }
                }
            }
            Err(e) => tried.push(format!("agent at {} (unreachable: {e})", sock.display())),
        }
    }

    for (file, pubkey) in host.identity_files.iter().zip(&file_pubs) {
        if !file.exists() {
            if host.explicit_identities {
                tried.push(format!("{} (no such file)", file.display()));
            }
            continue;
        }
        if let Some(p) = pubkey
            && agent_keys.iter().any(|a| a.key_data() == p.key_data())
        {
            continue; // already offered through the agent
        }
        let key = match load_key(file, host.batch_mode, prompt).await {
            Ok(k) => k,
            Err(why) => {
                tried.push(format!("{} ({why})", file.display()));
                continue;
            }
        };
        tried.push(file.display().to_string());
        let key = Arc::new(key);
        let res = wait
            .on(handle
                .authenticate_publickey(&user, PrivateKeyWithHashAlg::new(key.clone(), rsa_hash)))
            .await?;
        if res.success() {
            return Ok(AuthUsed::Key(key));
        }
        note(&mut methods, &res);
    }

    let interactive_allowed = host.kbd_interactive_authentication || host.password_authentication;
    if interactive_allowed && methods.is_none() {
        // No key was offered, so the server has not said what it takes yet: ask, as ssh
        // does with the "none" method, before prompting for anything.
        let res = wait.on(handle.authenticate_none(&user)).await?;
        if res.success() {
            return Ok(AuthUsed::None);
        }
        note(&mut methods, &res);
    }
    if host.kbd_interactive_authentication && offered(&methods, MethodKind::KeyboardInteractive) {
        if host.batch_mode {
            tried.push("keyboard-interactive (BatchMode forbids asking)".into());
        } else if let Some(used) = interactive(handle, wait, None, &mut tried).await? {
            return Ok(used);
        }
    }
    if host.password_authentication && offered(&methods, MethodKind::Password) {
        if host.batch_mode {
            tried.push("password (BatchMode forbids asking)".into());
        } else if let Some(used) = password(handle, wait, &mut tried).await? {
            return Ok(used);
        }
    }

    Err(Error::Auth {
        user,
        host: host.alias.clone(),
        tried,
    })
}

/// Asks for the password on the terminal, up to NumberOfPasswordPrompts times.
async fn password<H: russh::client::Handler>(
    handle: &mut Handle<H>,
    wait: AnswerWait<'_>,
    tried: &mut Vec<String>,
) -> Result<Option<AuthUsed>, Error> {
    let host = wait.host;
    let prompt = format!("{}@{}'s password: ", host.user, host.host_name);
    for _ in 0..host.number_of_password_prompts {
        let Some(answer) = ask(QuestionKind::Password, &prompt, false, wait.prompt).await else {
            tried.push("password (no terminal to ask for it)".into());
            return Ok(None);
        };
        let res = wait
            .on(handle.authenticate_password(&host.user, answer.as_str()))
            .await?;
        if res.success() {
            return Ok(Some(AuthUsed::Password(Arc::new(answer))));
        }
        let again = matches!(&res, AuthResult::Failure { remaining_methods, .. }
            if remaining_methods.contains(&MethodKind::Password));
        if !again {
            break;
        }
        if wait.prompt.is_none() {
            eprintln!("Permission denied, please try again.");
        }
    }
    tried.push("password (refused)".into());
    Ok(None)
}

/// Runs keyboard-interactive authentication: each prompt is answered from `cached` (the
/// answers of an earlier connection, for the same prompt text, on the first round only) or
/// asked on the terminal.
async fn interactive<H: russh::client::Handler>(
    handle: &mut Handle<H>,
    wait: AnswerWait<'_>,
    cached: Option<&Arc<Answers>>,
    tried: &mut Vec<String>,
) -> Result<Option<AuthUsed>, Error> {
    let host = wait.host;
    let mut answers: Answers = Vec::new();
    let mut reply = wait
        .on(handle.authenticate_keyboard_interactive_start(&host.user, None))
        .await?;
    // A server asks one round after another; the bound keeps a hostile one from asking
    // forever.
    for round in 0..16 {
        match reply {
            KeyboardInteractiveAuthResponse::Success => {
                return Ok(Some(AuthUsed::Interactive(Arc::new(answers))));
            }
            KeyboardInteractiveAuthResponse::Failure { .. } => break,
            KeyboardInteractiveAuthResponse::InfoRequest {
                name,
                instructions,
                prompts,
            } => {
                let mut responses = Vec::with_capacity(prompts.len());
                for (i, p) in prompts.iter().enumerate() {
                    let reuse = cached
                        .filter(|_| round == 0)
                        .and_then(|c| c.iter().find(|(q, _)| *q == p.prompt));
                    let answer = match reuse {
                        Some((_, a)) => a.clone(),
                        None => {
                            let mut text = String::new();
                            if i == 0 {
                                for line in [&name, &instructions] {
                                    if !line.is_empty() {
                                        text.push_str(&printable(line));
                                        text.push('\n');
                                    }
                                }
                            }
                            text.push_str(&printable(&p.prompt));
                            let kind = QuestionKind::KeyboardInteractive;
                            match ask(kind, &text, p.echo, wait.prompt).await {
                                Some(a) => a,
                                None => {
                                    tried.push(
                                        "keyboard-interactive (no terminal to answer)".into(),
                                    );
                                    return Ok(None);
                                }
                            }
                        }
                    };
                    responses.push(answer.to_string());
                    answers.push((p.prompt.clone(), answer));
                }
                reply = wait
                    .on(handle.authenticate_keyboard_interactive_respond(responses))
                    .await?;
            }
        }
    }
    tried.push("keyboard-interactive (refused)".into());
    Ok(None)
}

/// `s` with its control characters escaped: prompt texts come from the server, and must not
/// drive the terminal.
fn printable(s: &str) -> String {
    s.chars()
        .map(|c| {
            if c.is_control() {
                c.escape_default().to_string()
            } else {
                c.to_string()
            }
        })
        .collect()
}

/// Reads an answer from the program's [`Prompt`] or the terminal, off the async runtime;
/// `None` without either.
async fn ask(
    kind: QuestionKind,
    prompt: &str,
    echo: bool,
    custom: Option<&Prompt>,
) -> Option<Zeroizing<String>> {
    let prompt = prompt.to_owned();
    let custom = custom.cloned();
    tokio::task::spawn_blocking(move || answer(custom.as_ref(), kind, &prompt, echo))
        .await
        .ok()?
        .ok()?
}

/// The public key of an identity file: the file itself when it is a public key (an agent
/// holds the private half), the `<file>.pub` beside it, or the public half an OpenSSH
/// private key carries in clear (encrypted or not), or an unencrypted file's.
fn public_half(file: &Path) -> Option<PublicKey> {
    if let Ok(k) = russh::keys::load_public_key(file) {
        return Some(k);
    }
    let mut pubfile = file.as_os_str().to_owned();
    pubfile.push(".pub");
    if let Ok(k) = russh::keys::load_public_key(&pubfile) {
        return Some(k);
    }
    if let Ok(text) = std::fs::read_to_string(file)
        && let Ok(k) = russh::keys::PrivateKey::from_openssh(&text)
    {
        return Some(k.public_key().clone());
    }
    russh::keys::load_secret_key(file, None)
        .ok()
        .map(|k| k.public_key().clone())
}

/// Loads an identity file, asking for its passphrase on the terminal if it is encrypted.
/// The error is a short reason for the "Tried:" list.
async fn load_key(file: &Path, batch: bool, prompt: Option<&Prompt>) -> Result<PrivateKey, String> {
    match russh::keys::load_secret_key(file, None) {
        Ok(k) => return Ok(k),
        Err(russh::keys::Error::KeyIsEncrypted) => {}
        Err(e) => return Err(format!("unreadable: {e}")),
    }
    if batch {
        return Err("encrypted; BatchMode forbids asking for its passphrase".into());
    }
    let file = file.to_path_buf();
    let custom = prompt.cloned();
    tokio::task::spawn_blocking(move || {
        for _ in 0..3 {
            let prompt = format!("Enter passphrase for key '{}': ", file.display());
            let pass = match answer(custom.as_ref(), QuestionKind::Passphrase, &prompt, false) {
                Ok(Some(p)) => p,
                Ok(None) => return Err("encrypted; no terminal to ask for its passphrase".into()),
                Err(e) => return Err(format!("encrypted; cannot ask for its passphrase: {e}")),
            };
            if pass.is_empty() {
                return Err("encrypted; no passphrase given".into());
            }
            match russh::keys::load_secret_key(&file, Some(pass.as_str())) {
                Ok(k) => return Ok(k),
                Err(_) => continue,
            }
        }
        Err("encrypted; wrong passphrase".into())
    })
    .await
    .map_err(|e| format!("passphrase prompt failed: {e}"))?
}

/// Reads one line from `/dev/tty`, echoing it or not. `Ok(None)` when there is no terminal.
///
/// One prompt at a time: connections that log in at once each wait for the terminal.
pub(crate) fn read_tty_line(
    prompt: &str,
    echo: bool,
) -> std::io::Result<Option<Zeroizing<String>>> {
    use rustix::termios::{LocalModes, OptionalActions, tcgetattr, tcsetattr};
    let _turn = ASKING.lock().unwrap_or_else(|p| p.into_inner());
    let tty = match std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/tty")
    {
        Ok(t) => t,
        Err(_) => return Ok(None),
    };
    let saved = tcgetattr(&tty).ok();
    if !echo && let Some(t) = &saved {
        let mut quiet = t.clone();
        quiet.local_modes.remove(LocalModes::ECHO);
        tcsetattr(&tty, OptionalActions::Now, &quiet)?;
    }
    (&tty).write_all(prompt.as_bytes())?;
    let mut line = Zeroizing::new(String::new());
    let res = BufReader::new(&tty).read_line(&mut line);
    if !echo {
        if let Some(t) = &saved {
            let _ = tcsetattr(&tty, OptionalActions::Now, t);
        }
        let _ = (&tty).write_all(b"\n");
    }
    res?;
    while line.ends_with('\n') || line.ends_with('\r') {
        line.pop();
    }
    Ok(Some(line))
}
