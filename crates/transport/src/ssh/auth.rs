//! Public-key authentication: ssh-agent first, then identity files.
//!
//! Encrypted identity files ask for their passphrase on `/dev/tty`. Without a terminal, or
//! with `BatchMode yes`, such files are skipped and listed in the final error, as ssh does.

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::sync::Arc;

use russh::client::Handle;
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
}

pub(crate) async fn authenticate<H: russh::client::Handler>(
    handle: &mut Handle<H>,
    host: &HostConfig,
    previous: Option<&AuthUsed>,
) -> Result<AuthUsed, Error> {
    let user = host.user.clone();
    let mut tried = Vec::new();
    let rsa_hash = handle.best_supported_rsa_hash().await?.flatten();

    if let Some(AuthUsed::Key(key)) = previous {
        let res = handle
            .authenticate_publickey(&user, PrivateKeyWithHashAlg::new(key.clone(), rsa_hash))
            .await?;
        if res.success() {
            return Ok(AuthUsed::Key(key.clone()));
        }
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
                    match handle
                        .authenticate_publickey_with(&user, key.clone(), rsa_hash, &mut agent)
                        .await
                    {
                        Ok(r) if r.success() => return Ok(AuthUsed::Agent(key.clone())),
                        Ok(_) => {}
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
        let key = match load_key(file, host.batch_mode).await {
            Ok(k) => k,
            Err(why) => {
                tried.push(format!("{} ({why})", file.display()));
                continue;
            }
        };
        tried.push(file.display().to_string());
        let key = Arc::new(key);
        let res = handle
            .authenticate_publickey(&user, PrivateKeyWithHashAlg::new(key.clone(), rsa_hash))
            .await?;
        if res.success() {
            return Ok(AuthUsed::Key(key));
        }
    }

    Err(Error::Auth {
        user,
        host: host.alias.clone(),
        tried,
    })
}

/// The public key next to an identity file (`<file>.pub`), or from an unencrypted file.
fn public_half(file: &Path) -> Option<PublicKey> {
    let mut pubfile = file.as_os_str().to_owned();
    pubfile.push(".pub");
    if let Ok(k) = russh::keys::load_public_key(&pubfile) {
        return Some(k);
    }
    russh::keys::load_secret_key(file, None)
        .ok()
        .map(|k| k.public_key().clone())
}

/// Loads an identity file, asking for its passphrase on the terminal if it is encrypted.
/// The error is a short reason for the "Tried:" list.
async fn load_key(file: &Path, batch: bool) -> Result<PrivateKey, String> {
    match russh::keys::load_secret_key(file, None) {
        Ok(k) => return Ok(k),
        Err(russh::keys::Error::KeyIsEncrypted) => {}
        Err(e) => return Err(format!("unreadable: {e}")),
    }
    if batch {
        return Err("encrypted; BatchMode forbids asking for its passphrase".into());
    }
    let file = file.to_path_buf();
    tokio::task::spawn_blocking(move || {
        for _ in 0..3 {
            let prompt = format!("Enter passphrase for key '{}': ", file.display());
            let pass = match read_passphrase(&prompt) {
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

/// Reads a line from `/dev/tty` with echo off. `Ok(None)` when there is no terminal.
pub(crate) fn read_passphrase(prompt: &str) -> std::io::Result<Option<Zeroizing<String>>> {
    read_tty_line(prompt, false)
}

/// Reads one line from `/dev/tty`, echoing it or not. `Ok(None)` when there is no terminal.
pub(crate) fn read_tty_line(
    prompt: &str,
    echo: bool,
) -> std::io::Result<Option<Zeroizing<String>>> {
    use rustix::termios::{LocalModes, OptionalActions, tcgetattr, tcsetattr};
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
