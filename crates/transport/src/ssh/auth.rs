//! Authentication: ssh-agent first, then identity files, then keyboard-interactive and
//! password, in OpenSSH's order.
//!
//! User certificates are offered as ssh offers them: those `CertificateFile` names first;
//! without any, each identity file's `<file>-cert.pub` beside it, right after its key; and
//! the agent's own, beside its keys. A certificate is signed by the agent when it holds the
//! key (or the certificate), else by the identity file's key; an RSA one with SHA-2, as its
//! key is.
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
use russh::keys::ssh_key::certificate::CertType;
use russh::keys::ssh_key::public::KeyData;
use russh::keys::{Certificate, HashAlg, PrivateKey, PrivateKeyWithHashAlg, PublicKey};
use zeroize::Zeroizing;

use super::Error;
use super::config::HostConfig;
use super::known_hosts::{fingerprint, key_type_name};

/// The method that logged in, kept so that more connections to the same host
/// ([`SshSession::reconnect`](super::SshSession::reconnect)) need no new prompt.
#[derive(Clone, Debug)]
pub(crate) enum AuthUsed {
    Agent(PublicKey),
    /// A certificate the agent signed for.
    AgentCert(Arc<Certificate>),
    Key(Arc<PrivateKey>),
    /// A certificate signed by an identity file's key.
    KeyCert(Arc<PrivateKey>, Arc<Certificate>),
    /// The password typed for the first connection.
    Password(Arc<Zeroizing<String>>),
    /// The answers typed to keyboard-interactive prompts, with the prompts they answered.
    Interactive(Arc<Answers>),
    /// The server let us in without any credential.
    None,
}

impl AuthUsed {
    /// Whether a key or a certificate logged in.
    fn is_key(&self) -> bool {
        matches!(
            self,
            AuthUsed::Agent(_) | AuthUsed::AgentCert(_) | AuthUsed::Key(_) | AuthUsed::KeyCert(..)
        )
    }
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
/// ssh_config asks for what only it does (a `Match` block, a master at ControlPath, a host
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

/// How long the agent is given to take the connection and list its keys: a stalled agent (a
/// forwarded socket whose far end stopped) would otherwise hold the login for good. Past it,
/// the login goes on without the agent.
const AGENT_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

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

/// The agent, as this client reaches it.
type Agent = AgentClient<tokio::net::UnixStream>;

/// One key or certificate to offer, and what signs for it.
enum Offer {
    /// A key the agent holds.
    AgentKey(PublicKey),
    /// A certificate the agent signs for: one it holds, or one of ours whose key it holds
    /// (`by_key`: asked by that key, since the agent may not hold the certificate).
    AgentCert {
        cert: Certificate,
        name: String,
        by_key: bool,
    },
    /// The key of the identity file at this index.
    File(usize),
    /// A certificate signed by the key of the identity file at `file`.
    FileCert {
        cert: Certificate,
        name: String,
        file: usize,
    },
}

/// The signature an RSA key signs with, as ssh picks it: of those the server takes (`best`,
/// the best its `server-sig-algs` names; a server that takes `rsa-sha2-512` takes
/// `rsa-sha2-256` too), the first PubkeyAcceptedAlgorithms allows. `None`: none is allowed.
fn rsa_signature(host: &HostConfig, best: Option<HashAlg>) -> Option<Option<HashAlg>> {
    let taken: &[Option<HashAlg>] = match best {
        Some(HashAlg::Sha512) => &[Some(HashAlg::Sha512), Some(HashAlg::Sha256)],
        _ => &[best],
    };
    let names: Vec<(Option<HashAlg>, String)> = taken
        .iter()
        .map(|&hash| (hash, russh::keys::Algorithm::Rsa { hash }.to_string()))
        .collect();
    let list = host.algorithms.pubkey.as_deref();
    super::config::allowed(list, true, &names, |(_, n)| n)
        .first()
        .map(|(hash, _)| *hash)
}

/// Why ssh_config keeps `key` (certified, when `cert`) out of the login, if it does: an RSA
/// key below RequiredRSASize, or an algorithm PubkeyAcceptedAlgorithms does not name. An
/// RSA key is named by the signature it signs with (`rsa`, from [`rsa_signature`]; `None`:
/// no signature the server takes is allowed), a certificate by its certificate algorithm
/// (`ssh-ed25519-cert-v01@openssh.com`).
fn kept_out(
    host: &HostConfig,
    key: &KeyData,
    cert: bool,
    rsa: Option<Option<HashAlg>>,
) -> Option<String> {
    let required = host.required_rsa_size.max(super::known_hosts::RSA_MIN_BITS);
    if let Some(bits) = super::known_hosts::rsa_bits(key)
        && bits < required
    {
        return Some(format!(
            "{bits} bits, fewer than RequiredRSASize {required}"
        ));
    }
    let algorithm = match key.algorithm() {
        russh::keys::Algorithm::Rsa { .. } => match rsa {
            Some(hash) => russh::keys::Algorithm::Rsa { hash },
            None => {
                return Some(
                    "no RSA signature the server takes is in PubkeyAcceptedAlgorithms".into(),
                );
            }
        },
        other => other,
    };
    let mut name = algorithm.as_str().to_owned();
    if cert {
        name = match name.strip_suffix("@openssh.com") {
            Some(base) => format!("{base}-cert-v01@openssh.com"),
            None => format!("{name}-cert-v01@openssh.com"),
        };
    }
    let list = host.algorithms.pubkey.as_deref();
    let allowed = super::config::allowed(list, true, std::slice::from_ref(&name), |n| n);
    allowed
        .is_empty()
        .then(|| format!("{name} is not in PubkeyAcceptedAlgorithms"))
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
    let best_rsa = wait.on(handle.best_supported_rsa_hash()).await?.flatten();
    let rsa = rsa_signature(host, best_rsa);
    let rsa_hash = rsa.unwrap_or(best_rsa);

    // What logged in the first connection logs in this one, without asking again.
    match previous.filter(|used| host.pubkey_authentication || !used.is_key()) {
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
        Some(AuthUsed::KeyCert(key, cert)) => {
            let mut signer = CertSigner::Key(key);
            let signed = handle.authenticate_certificate_with(
                &user,
                (**cert).clone(),
                rsa_hash,
                &mut signer,
            );
            if let Ok(r) = wait.raw(signed).await?
                && r.success()
            {
                return Ok(AuthUsed::KeyCert(key.clone(), cert.clone()));
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
        Some(AuthUsed::Agent(_) | AuthUsed::AgentCert(_) | AuthUsed::None) | None => {}
    }

    // The public halves of the identity files, to honour IdentitiesOnly with the agent and
    // to avoid offering the same key twice.
    let file_pubs: Vec<Option<PublicKey>> =
        host.identity_files.iter().map(|f| public_half(f)).collect();
    let file_of = |key: &KeyData| {
        file_pubs
            .iter()
            .position(|p| p.as_ref().is_some_and(|p| p.key_data() == key))
    };
    // The certificates named by CertificateFile; without any, as ssh, the `<file>-cert.pub`
    // beside each identity file.
    let mut named_certs = Vec::new();
    for f in &host.certificate_files {
        match user_certificate(f) {
            Ok(cert) => named_certs.push((f.display().to_string(), cert)),
            Err(why) => tried.push(format!("{} ({why})", f.display())),
        }
    }
    let beside_certs: Vec<Option<(String, Certificate)>> = host
        .identity_files
        .iter()
        .map(|f| {
            if !host.certificate_files.is_empty() {
                return None;
            }
            let mut path = f.as_os_str().to_owned();
            path.push("-cert.pub");
            let path = std::path::PathBuf::from(path);
            let cert = user_certificate(&path).ok()?;
            Some((path.display().to_string(), cert))
        })
        .collect();

    let mut agent: Option<Agent> = None;
    let mut agent_ids = Vec::new();
    if let Some(sock) = &host.identity_agent {
        let listed = tokio::time::timeout(AGENT_WAIT, async {
            let mut a = AgentClient::connect_uds(sock).await?;
            let ids = a.request_identities().await.unwrap_or_default();
            Ok::<_, russh::keys::Error>((a, ids))
        });
        match listed.await {
            Ok(Ok((a, ids))) => {
                agent_ids = ids;
                agent = Some(a);
            }
            Ok(Err(e)) => tried.push(format!("agent at {} (unreachable: {e})", sock.display())),
            Err(_) => tried.push(format!(
                "agent at {} (no answer in {} s)",
                sock.display(),
                AGENT_WAIT.as_secs()
            )),
        }
    }
    let agent_has_key = |key: &KeyData| {
        agent_ids
            .iter()
            .any(|id| matches!(id, AgentIdentity::PublicKey { key: k, .. } if k.key_data() == key))
    };
    let agent_has_cert = |cert: &Certificate| {
        agent_ids.iter().any(
            |id| matches!(id, AgentIdentity::Certificate { certificate, .. } if same_cert(certificate, cert)),
        )
    };

    // In ssh's order: the certificates CertificateFile names; the agent's keys and
    // certificates, those of the identity files first (a server's MaxAuthTries may end the
    // login before the others), a key before its certificate; then the identity files' own
    // keys and certificates that the agent does not hold, each key before its certificate.
    let mut offers = Vec::new();
    for (name, cert) in &named_certs {
        let key = cert.public_key();
        if agent_has_key(key) || agent_has_cert(cert) {
            offers.push(Offer::AgentCert {
                cert: cert.clone(),
                name: name.clone(),
                by_key: agent_has_key(key),
            });
        } else if let Some(file) = file_of(key) {
            offers.push(Offer::FileCert {
                cert: cert.clone(),
                name: name.clone(),
                file,
            });
        } else {
            tried.push(format!(
                "{name} (its key is in no identity file and not in the agent)"
            ));
        }
    }
    let mut from_agent = Vec::new();
    for id in &agent_ids {
        match id {
            AgentIdentity::PublicKey { key, .. } => {
                let listed = file_of(key.key_data());
                if !host.identities_only || listed.is_some() {
                    from_agent.push((listed.map(|i| 2 * i), Offer::AgentKey(key.clone())));
                }
            }
            AgentIdentity::Certificate { certificate, .. } => {
                if certificate.cert_type() != CertType::User
                    || named_certs.iter().any(|(_, c)| same_cert(c, certificate))
                {
                    continue;
                }
                let listed = beside_certs
                    .iter()
                    .position(|c| c.as_ref().is_some_and(|(_, c)| same_cert(c, certificate)));
                if !host.identities_only || listed.is_some() {
                    let offer = Offer::AgentCert {
                        cert: certificate.clone(),
                        name: format!("agent {}", cert_label(certificate)),
                        by_key: agent_has_key(certificate.public_key()),
                    };
                    from_agent.push((listed.map(|i| 2 * i + 1), offer));
                }
            }
        }
    }
    from_agent.sort_by_key(|(at, _)| at.unwrap_or(usize::MAX));
    if agent.is_some()
        && from_agent.is_empty()
        && let Some(sock) = &host.identity_agent
    {
        tried.push(format!("agent at {} (no usable key)", sock.display()));
    }
    offers.extend(from_agent.into_iter().map(|(_, o)| o));
    for (i, (pubkey, cert)) in file_pubs.iter().zip(&beside_certs).enumerate() {
        // Those the agent holds were offered through it.
        if !pubkey.as_ref().is_some_and(|p| agent_has_key(p.key_data())) {
            offers.push(Offer::File(i));
        }
        if let Some((name, cert)) = cert
            && !agent_has_cert(cert)
        {
            let by_key = agent_has_key(cert.public_key());
            if by_key {
                offers.push(Offer::AgentCert {
                    cert: cert.clone(),
                    name: name.clone(),
                    by_key,
                });
            } else if host.identity_files[i].exists() {
                offers.push(Offer::FileCert {
                    cert: cert.clone(),
                    name: name.clone(),
                    file: i,
                });
            }
        }
    }
    // What worked through the agent on an earlier connection goes first.
    let first = offers.iter().position(|o| match (o, previous) {
        (Offer::AgentKey(k), Some(AuthUsed::Agent(prev))) => k.key_data() == prev.key_data(),
        (Offer::AgentCert { cert, .. }, Some(AuthUsed::AgentCert(prev))) => same_cert(cert, prev),
        _ => false,
    });
    if let Some(i) = first {
        let o = offers.remove(i);
        offers.insert(0, o);
    }

    // PubkeyAuthentication no: no key and no certificate is offered.
    if !host.pubkey_authentication {
        offers.clear();
    }
    // Each identity file's key, once loaded (or why it could not be).
    let mut loaded: Vec<Option<Result<Arc<PrivateKey>, String>>> =
        vec![None; host.identity_files.len()];
    for offer in offers {
        if handle.is_closed() {
            return Err(too_many_failures(host, tried));
        }
        match offer {
            Offer::AgentKey(key) => {
                let Some(agent) = agent.as_mut() else {
                    continue;
                };
                if let Some(why) = kept_out(host, key.key_data(), false, rsa) {
                    tried.push(format!("agent key {} ({why})", fingerprint(&key)));
                    continue;
                }
                tried.push(format!(
                    "agent key {} {}",
                    key_type_name(&key),
                    fingerprint(&key)
                ));
                let signed =
                    handle.authenticate_publickey_with(&user, key.clone(), rsa_hash, agent);
                match wait.raw(signed).await? {
                    Ok(r) if r.success() => return Ok(AuthUsed::Agent(key)),
                    Ok(r) => note(&mut methods, &r),
                    Err(_) if handle.is_closed() => {
                        tried.pop();
                        return Err(too_many_failures(host, tried));
                    }
                    Err(e) => sign_failed(&mut tried, "agent", &e),
                }
            }
            Offer::AgentCert { cert, name, by_key } => {
                let Some(agent) = agent.as_mut() else {
                    continue;
                };
                if let Some(why) = kept_out(host, cert.public_key(), true, rsa) {
                    tried.push(format!("{name} ({why})"));
                    continue;
                }
                tried.push(format!("{name} ({})", cert_details(&cert)));
                let mut signer = CertSigner::Agent { agent, by_key };
                let signed = handle.authenticate_certificate_with(
                    &user,
                    cert.clone(),
                    rsa_hash,
                    &mut signer,
                );
                match wait.raw(signed).await? {
                    Ok(r) if r.success() => return Ok(AuthUsed::AgentCert(Arc::new(cert))),
                    Ok(r) => note(&mut methods, &r),
                    Err(_) if handle.is_closed() => {
                        tried.pop();
                        return Err(too_many_failures(host, tried));
                    }
                    Err(e) => sign_failed(&mut tried, "agent", &e),
                }
            }
            Offer::File(i) => {
                let file = &host.identity_files[i];
                if !file.exists() {
                    if host.explicit_identities {
                        tried.push(format!("{} (no such file)", file.display()));
                    }
                    continue;
                }
                // Before its passphrase is asked for, when its public half is beside it.
                let public = file_pubs[i].as_ref().map(PublicKey::key_data);
                if let Some(why) = public.and_then(|k| kept_out(host, k, false, rsa)) {
                    tried.push(format!("{} ({why})", file.display()));
                    continue;
                }
                let key = match identity_key(&mut loaded[i], file, host.batch_mode, prompt).await {
                    Ok(k) => k,
                    Err(why) => {
                        tried.push(format!("{} ({why})", file.display()));
                        continue;
                    }
                };
                if let Some(why) = kept_out(host, key.public_key().key_data(), false, rsa) {
                    tried.push(format!("{} ({why})", file.display()));
                    continue;
                }
                tried.push(file.display().to_string());
                let res = wait
                    .raw(handle.authenticate_publickey(
                        &user,
                        PrivateKeyWithHashAlg::new(key.clone(), rsa_hash),
                    ))
                    .await?;
                let res = match res {
                    Err(_) if handle.is_closed() => {
                        tried.pop();
                        return Err(too_many_failures(host, tried));
                    }
                    res => res?,
                };
                if res.success() {
                    return Ok(AuthUsed::Key(key));
                }
                note(&mut methods, &res);
            }
            Offer::FileCert { cert, name, file } => {
                let path = &host.identity_files[file];
                if let Some(why) = kept_out(host, cert.public_key(), true, rsa) {
                    tried.push(format!("{name} ({why})"));
                    continue;
                }
                let key = match identity_key(&mut loaded[file], path, host.batch_mode, prompt).await
                {
                    Ok(k) => k,
                    Err(why) => {
                        tried.push(format!("{name} (its key {}: {why})", path.display()));
                        continue;
                    }
                };
                // As ssh: never a signature by another key than the one certified.
                if key.public_key().key_data() != cert.public_key() {
                    tried.push(format!(
                        "{name} (certifies another key than {})",
                        path.display()
                    ));
                    continue;
                }
                tried.push(format!("{name} ({})", cert_details(&cert)));
                let mut signer = CertSigner::Key(&key);
                let signed = handle.authenticate_certificate_with(
                    &user,
                    cert.clone(),
                    rsa_hash,
                    &mut signer,
                );
                match wait.raw(signed).await? {
                    Ok(r) if r.success() => return Ok(AuthUsed::KeyCert(key, Arc::new(cert))),
                    Ok(r) => note(&mut methods, &r),
                    Err(_) if handle.is_closed() => {
                        tried.pop();
                        return Err(too_many_failures(host, tried));
                    }
                    Err(e) => sign_failed(&mut tried, "key", &e),
                }
            }
        }
    }

    if handle.is_closed() {
        return Err(too_many_failures(host, tried));
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

/// The server closed the connection during the login, after the offers in `tried`: sshd
/// does so once `MaxAuthTries` offers have failed.
fn too_many_failures(host: &HostConfig, tried: Vec<String>) -> Error {
    Error::TooManyAuthFailures {
        user: host.user.clone(),
        host: host.alias.clone(),
        tried,
    }
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

/// The user certificate in `file` (an OpenSSH `*-cert.pub`). The error is a short reason
/// for the "Tried:" list.
fn user_certificate(file: &Path) -> Result<Certificate, String> {
    let text = std::fs::read_to_string(file).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => "no such file".to_string(),
        _ => format!("unreadable: {e}"),
    })?;
    let cert =
        Certificate::from_openssh(text.trim()).map_err(|e| format!("not a certificate: {e}"))?;
    if cert.cert_type() != CertType::User {
        return Err("a host certificate, not a user's".into());
    }
    Ok(cert)
}

/// Whether `a` and `b` are the same certificate. Their comments, which are no part of it,
/// are left aside: the agent's copy has none, the file's has one.
fn same_cert(a: &Certificate, b: &Certificate) -> bool {
    a.to_bytes()
        .is_ok_and(|a| b.to_bytes().is_ok_and(|b| a == b))
}

/// An agent's certificate as the "Tried:" list names it: its key's type and fingerprint.
fn cert_label(cert: &Certificate) -> String {
    let key = PublicKey::from(cert.public_key().clone());
    format!("key {} {}", key_type_name(&key), fingerprint(&key))
}

/// What a certificate says of whom it lets in, for the "Tried:" list: its principals, and
/// whether it has expired.
fn cert_details(cert: &Certificate) -> String {
    let principals = cert.valid_principals();
    let mut details = if principals.is_empty() {
        "certificate for any user".to_string()
    } else {
        format!("certificate for {}", principals.join(","))
    };
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    if cert.valid_before() <= now {
        details.push_str(", expired");
    } else if cert.valid_after() > now {
        details.push_str(", not yet valid");
    }
    details
}

/// Notes on the last "Tried:" entry that `who` could not sign for it.
fn sign_failed(tried: &mut [String], who: &str, e: &impl std::fmt::Display) {
    if let Some(t) = tried.last_mut() {
        t.push_str(&format!(" ({who} failed to sign: {e})"));
    }
}

/// The key of an identity file, loaded once for its key and its certificate: `slot` keeps it,
/// or why it could not be loaded.
async fn identity_key(
    slot: &mut Option<Result<Arc<PrivateKey>, String>>,
    file: &Path,
    batch: bool,
    prompt: Option<&Prompt>,
) -> Result<Arc<PrivateKey>, String> {
    if let Some(loaded) = slot {
        return loaded.clone();
    }
    let loaded = load_key(file, batch, prompt).await.map(Arc::new);
    *slot = Some(loaded.clone());
    loaded
}

/// What signs a certificate's login: the private key it certifies, or the agent.
enum CertSigner<'a> {
    Key(&'a PrivateKey),
    /// The agent, asked by the certified key itself (`by_key`: it may hold that key without
    /// the certificate, and finds a key by its certificate only if it holds that), or else
    /// by the certificate.
    Agent {
        agent: &'a mut Agent,
        by_key: bool,
    },
}

impl russh::Signer for CertSigner<'_> {
    type Error = russh::AgentAuthError;

    async fn auth_sign(
        &mut self,
        id: &AgentIdentity,
        hash_alg: Option<HashAlg>,
        to_sign: Vec<u8>,
    ) -> Result<Vec<u8>, Self::Error> {
        match self {
            CertSigner::Key(key) => Ok(sign(key, hash_alg, to_sign)?),
            CertSigner::Agent { agent, by_key } => {
                let id = match id {
                    AgentIdentity::Certificate { certificate, .. } if *by_key => {
                        AgentIdentity::from(PublicKey::from(certificate.public_key().clone()))
                    }
                    id => id.clone(),
                };
                Ok(agent.sign_request(&id, hash_alg, to_sign).await?)
            }
        }
    }
}

/// `data` followed by its signature with `key` (an RSA key's with `hash_alg`), as the login
/// request carries it.
fn sign(
    key: &PrivateKey,
    hash_alg: Option<HashAlg>,
    mut data: Vec<u8>,
) -> Result<Vec<u8>, russh::keys::Error> {
    use russh::keys::signature::Signer as _;
    use russh::keys::ssh_encoding::Encode as _;
    use russh::keys::ssh_key::private::KeypairData;
    let signature = match key.key_data() {
        KeypairData::Rsa(rsa) => (rsa, hash_alg).try_sign(&data)?,
        other => other.try_sign(&data)?,
    };
    let mut blob = Vec::new();
    signature.encode(&mut blob)?;
    blob.encode(&mut data)?;
    Ok(data)
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
