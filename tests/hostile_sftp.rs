//! A hostile SFTP server, which OpenSSH's `sftp-server` cannot play: it lists names that
//! climb out of the folder, and sends more bytes than a file has. A pull over SFTP must
//! write nothing outside its destination and keep nothing the server made up. It also lists
//! a file and a folder that are gone when opened, and ends the connection, or only the
//! channel, just as it grants the SFTP subsystem.
//!
//! The server is an in-process russh server with a russh-sftp handler serving a made-up
//! tree; the client is the library, as the `fastcp` command uses it.

use std::collections::HashMap;
use std::fs;
use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use fastcp::{CopyOptions, Location, Plan, RemotePath};
use fastcp_testsupport::tree::scan;
use russh::keys::PrivateKey;
use russh::server::{Auth, ChannelOpenHandle, Msg, Session};
use russh::{Channel, ChannelId};
use russh_sftp::protocol::{
    Attrs, Data, File, FileAttributes, Handle, Name, OpenFlags, Status, StatusCode, Version,
};
use tokio::sync::Mutex;

/// The made-up tree: folder path to entries (name, attributes).
fn listing(path: &str) -> Option<Vec<(&'static str, FileAttributes)>> {
    let file = |size| FileAttributes {
        size: Some(size),
        permissions: Some(0o100644),
        mtime: Some(1_700_000_000),
        atime: Some(1_700_000_000),
        ..FileAttributes::empty()
    };
    let folder = || FileAttributes {
        permissions: Some(0o040755),
        mtime: Some(1_700_000_000),
        ..FileAttributes::empty()
    };
    match path {
        "climb" => Some(vec![("good", file(4)), ("../../escape", file(4))]),
        "liar" => Some(vec![("short", file(4))]),
        "ghost" => Some(vec![("gone", file(4)), ("gonedir", folder())]),
        _ => None,
    }
}

fn attrs_of(path: &str) -> Option<FileAttributes> {
    if listing(path).is_some() {
        return Some(FileAttributes {
            permissions: Some(0o040755),
            mtime: Some(1_700_000_000),
            ..FileAttributes::empty()
        });
    }
    let (dir, name) = path.rsplit_once('/')?;
    listing(dir)?
        .into_iter()
        .find(|(n, _)| *n == name)
        .map(|(_, a)| a)
}

fn ok(id: u32) -> Status {
    Status {
        id,
        status_code: StatusCode::Ok,
        error_message: "Ok".into(),
        language_tag: "en".into(),
    }
}

#[derive(Default)]
struct Hostile {
    listed: HashMap<String, bool>,
}

impl russh_sftp::server::Handler for Hostile {
    type Error = StatusCode;

    fn unimplemented(&self) -> StatusCode {
        StatusCode::OpUnsupported
    }

    async fn init(&mut self, _v: u32, _e: HashMap<String, String>) -> Result<Version, StatusCode> {
        Ok(Version::new())
    }

    async fn stat(&mut self, id: u32, path: String) -> Result<Attrs, StatusCode> {
        let attrs = attrs_of(&path).ok_or(StatusCode::NoSuchFile)?;
        Ok(Attrs { id, attrs })
    }

    async fn lstat(&mut self, id: u32, path: String) -> Result<Attrs, StatusCode> {
        self.stat(id, path).await
    }

    async fn opendir(&mut self, id: u32, path: String) -> Result<Handle, StatusCode> {
        listing(&path).ok_or(StatusCode::NoSuchFile)?;
        self.listed.insert(path.clone(), false);
        Ok(Handle { id, handle: path })
    }

    async fn readdir(&mut self, id: u32, handle: String) -> Result<Name, StatusCode> {
        let done = self.listed.get_mut(&handle).ok_or(StatusCode::Failure)?;
        if *done {
            return Err(StatusCode::Eof);
        }
        *done = true;
        let files = listing(&handle)
            .unwrap()
            .into_iter()
            .map(|(n, a)| File::new(n, a))
            .collect();
        Ok(Name { id, files })
    }

    async fn open(
        &mut self,
        id: u32,
        path: String,
        _flags: OpenFlags,
        _attrs: FileAttributes,
    ) -> Result<Handle, StatusCode> {
        // A file listed, and gone by the time it is opened.
        if path.ends_with("ghost/gone") {
            return Err(StatusCode::NoSuchFile);
        }
        attrs_of(&path).ok_or(StatusCode::NoSuchFile)?;
        Ok(Handle { id, handle: path })
    }

    async fn fstat(&mut self, id: u32, handle: String) -> Result<Attrs, StatusCode> {
        self.stat(id, handle).await
    }

    /// Every read gets ten bytes, whatever the file's size and the offset.
    async fn read(
        &mut self,
        id: u32,
        handle: String,
        _offset: u64,
        _len: u32,
    ) -> Result<Data, StatusCode> {
        let byte = if handle.starts_with("liar") {
            b'L'
        } else {
            b'G'
        };
        Ok(Data {
            id,
            data: vec![byte; 10],
        })
    }

    async fn close(&mut self, id: u32, _handle: String) -> Result<Status, StatusCode> {
        Ok(ok(id))
    }
}

#[derive(Clone, Default)]
struct Server {
    channels: Arc<Mutex<HashMap<ChannelId, Channel<Msg>>>>,
    /// The login name, which picks a fault: `cut` ends the connection once the SFTP
    /// subsystem is granted, `quit` ends only its channel; any other serves the made-up tree.
    user: String,
}

impl russh::server::Handler for Server {
    type Error = russh::Error;

    async fn auth_publickey(
        &mut self,
        user: &str,
        _key: russh::server::VerifiedPublicKey<'_>,
    ) -> Result<Auth, Self::Error> {
        self.user = user.to_owned();
        Ok(Auth::Accept)
    }

    async fn channel_open_session(
        &mut self,
        channel: Channel<Msg>,
        reply: ChannelOpenHandle,
        _session: &mut Session,
    ) -> Result<(), Self::Error> {
        self.channels.lock().await.insert(channel.id(), channel);
        reply.accept().await;
        Ok(())
    }

    async fn subsystem_request(
        &mut self,
        id: ChannelId,
        name: &str,
        session: &mut Session,
    ) -> Result<(), Self::Error> {
        let channel = self.channels.lock().await.remove(&id);
        match channel {
            Some(channel) if name == "sftp" => {
                session.channel_success(id)?;
                match self.user.as_str() {
                    "cut" => session.disconnect(russh::Disconnect::ByApplication, "cut", "")?,
                    "quit" => {
                        session.eof(id)?;
                        session.close(id)?;
                    }
                    _ => russh_sftp::server::run(channel.into_stream(), Hostile::default()).await,
                }
            }
            _ => session.channel_failure(id)?,
        }
        Ok(())
    }
}

fn keygen(path: &Path) {
    let st = Command::new(fastcp_testsupport::tools::require("ssh-keygen"))
        .args(["-q", "-t", "ed25519", "-N", "", "-f"])
        .arg(path)
        .status()
        .unwrap();
    assert!(st.success());
}

/// Starts the server; returns an ssh_config for it (host alias `hostile`).
async fn start(dir: &Path) -> std::path::PathBuf {
    keygen(&dir.join("host_key"));
    keygen(&dir.join("id"));
    let key: PrivateKey = russh::keys::load_secret_key(dir.join("host_key"), None).unwrap();
    let known = key.public_key().to_openssh().unwrap();
    let config = Arc::new(russh::server::Config {
        keys: vec![key],
        auth_rejection_time: Duration::from_millis(10),
        auth_rejection_time_initial: Some(Duration::ZERO),
        ..Default::default()
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((socket, _)) = listener.accept().await {
            let config = config.clone();
            tokio::spawn(async move {
                if let Ok(session) =
                    russh::server::run_stream(config, socket, Server::default()).await
                {
                    let _ = session.await;
                }
            });
        }
    });
    fs::write(
        dir.join("known_hosts"),
        format!("[127.0.0.1]:{port} {known}\n"),
    )
    .unwrap();
    let cfg = dir.join("config");
    fs::write(
        &cfg,
        format!(
            "Host hostile\n  HostName 127.0.0.1\n  Port {port}\n  User tester\n  \
             IdentityFile {}\n  IdentitiesOnly yes\n  IdentityAgent none\n  \
             UserKnownHostsFile {}\n  GlobalKnownHostsFile /dev/null\n  \
             StrictHostKeyChecking yes\n  BatchMode yes\n",
            dir.join("id").display(),
            dir.join("known_hosts").display()
        ),
    )
    .unwrap();
    cfg
}

async fn pull(cfg: &Path, source: &str, dest: &Path) -> Result<fastcp::Outcome, fastcp::Error> {
    pull_as(cfg, None, source, dest).await
}

async fn pull_as(
    cfg: &Path,
    user: Option<&str>,
    source: &str,
    dest: &Path,
) -> Result<fastcp::Outcome, fastcp::Error> {
    let plan = Plan::new(
        vec![Location::Remote(RemotePath {
            user: user.map(str::to_owned),
            host: "hostile".into(),
            port: None,
            path: source.into(),
        })],
        Location::Local(dest.to_path_buf()),
        CopyOptions::default().recursive(true).sftp(true).streams(2),
    )?;
    let ssh = fastcp::transport::SshOptions::default().config_file(cfg.to_path_buf());
    fastcp::copy_remote(&plan, &ssh, Arc::new(fastcp::Progress::default())).await
}

#[tokio::test(flavor = "multi_thread")]
async fn a_hostile_sftp_server_cannot_write_outside_the_destination_or_make_up_bytes() {
    let work = tempfile::tempdir().unwrap();
    let cfg = start(work.path()).await;
    let area = work.path().join("area");
    let dest = area.join("a/b/dest");
    fs::create_dir_all(&dest).unwrap();

    // Names that climb out: the name is refused, and nothing lands anywhere else.
    let outcome = pull(&cfg, "climb", &dest).await.unwrap();
    assert!(!outcome.report.is_complete(), "{:?}", outcome.report);
    let message = format!("{:?}", outcome.report.failures);
    assert!(message.contains("climb/../../escape"), "{message}");
    assert!(message.contains("SFTP cannot carry"), "{message}");
    let everything: Vec<String> = scan(&area)
        .keys()
        .map(|k| String::from_utf8_lossy(k).into_owned())
        .collect();
    assert!(
        everything.iter().all(|p| !p.contains("escape")),
        "{everything:?}"
    );

    // Ten bytes for a 4-byte file: the extra bytes are never kept, and neither is the file.
    let outcome = pull(&cfg, "liar", &dest).await.unwrap();
    assert!(!outcome.report.is_complete(), "{:?}", outcome.report);
    assert!(!dest.join("liar/short").exists());
    let leftovers: Vec<_> = scan(&dest)
        .keys()
        .filter(|k| k.windows(8).any(|w| w == b".fastcp-"))
        .cloned()
        .collect();
    assert!(leftovers.is_empty(), "temp files left: {leftovers:?}");

    // A file listed and gone before it is opened, and a folder listed and gone before it
    // is listed itself, vanished: sources that changed (exit code 5, as rsync's 24), not
    // failures to read.
    let outcome = pull(&cfg, "ghost", &dest).await.unwrap();
    let failures = &outcome.report.failures;
    assert_eq!(failures.len(), 2, "{failures:?}");
    for failure in failures {
        let code = failure.code;
        assert_eq!(
            code,
            fastcp::proto::ErrorCode::SourceChanged,
            "{failures:?}"
        );
        assert!(failure.message.contains("vanished"), "{failures:?}");
    }
    assert!(!dest.join("ghost/gone").exists());
}

/// An SFTP session that ends as it starts says why: the connection cut then is a lost
/// connection (the connection exit code), not a host without SFTP; a server that granted
/// SFTP and then ended its channel, the connection still up, serves none.
#[tokio::test(flavor = "multi_thread")]
async fn a_connection_cut_as_sftp_starts_is_a_lost_connection_not_a_host_without_sftp() {
    let work = tempfile::tempdir().unwrap();
    let cfg = start(work.path()).await;
    let dest = work.path().join("dest");
    fs::create_dir_all(&dest).unwrap();

    let err = pull_as(&cfg, Some("cut"), "liar", &dest).await.unwrap_err();
    assert_eq!(err.exit_code(), fastcp::exit::CONNECTION, "{err}");
    assert_eq!(err.kind(), fastcp::ErrorKind::Connect, "{err}");
    assert!(!err.to_string().contains("serves no SFTP"), "{err}");

    let err = pull_as(&cfg, Some("quit"), "liar", &dest)
        .await
        .unwrap_err();
    assert!(err.to_string().contains("serves no SFTP"), "{err}");
    assert!(scan(&dest).is_empty(), "{:?}", scan(&dest).keys());
}
