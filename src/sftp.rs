//! The SFTP path: copies to and from a host where fastcp cannot run, through the remote's
//! stock SFTP subsystem (OpenSSH's `sftp-server`), with nothing installed there.
//!
//! It is taken when the remote has no fastcp and none can be deployed (another OS or
//! architecture, a home folder mounted `noexec`, `--no-deploy`), or when asked with
//! `--sftp`. It is fast the way mscp is: several SSH connections, each with an SFTP session
//! of its own (sshd runs one process per connection), many requests in flight on each, and
//! big files split into ranges spread over all the sessions.
//!
//! fastcp's own engine still runs on this side, bridged to SFTP through in-memory pipes
//! that carry fastcp's frames:
//!
//! - a **push** runs the local sender ([`fastcp_stream::send`]); `Apply` reads its frames
//!   and applies them remotely: directories made, each file written through a handle per
//!   session to a temporary name created exclusively beside its target, its attributes set,
//!   then renamed over the target (`posix-rename@openssh.com` where offered: atomic); with
//!   `--delete`, the copy's folders listed and their extras removed (`Apply::mirror`).
//! - a **pull** lists the remote tree and reads it (`Emit`), turning what it reads into
//!   frames for the local receiver ([`fastcp_stream::receive`]), which checks every name,
//!   resolves every path beneath the destination without following symlinks, writes temp
//!   files and renames them only once complete: a hostile SFTP server meets the same
//!   receiver as a hostile fastcp server. The listing leaves out what the filter excludes;
//!   with the quick check each file is first a `Probe` to the receiver, and only those it
//!   answers "send" for are read (`Probing`); `--delete` is the receiver's own.
//!
//! What SFTP cannot give: a check of what landed on the remote disk (the sender's checksum
//! is computed, but only SSH's MAC covers the bytes in transit; nothing on the remote reads
//! them back), names that are not UTF-8 (the SFTP crate carries names as strings: such
//! entries fail, each with an error), times finer than a second, and the features that
//! need fastcp on both ends (`-H`, owners, extended attributes). A push's `--resume` reads
//! the remote partial file back and hashes it here (`Apply::partial_offer`); a pull's keeps
//! what its local partial file's record holds. `--checksum` has the remote's files hashed
//! on the remote by its own tools (`remote_hash.rs`). A dry
//! run (`-n`) lists the local walk on a push, and the remote listing on a pull
//! (`list_remote`).

use std::collections::{HashMap, HashSet};
use std::hash::Hash;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use fastcp_proto::{
    Answer, DirEntry, ErrorCode, ErrorFrame, FileEnd, FileEntry, Frame, Hole, Keep, LinkTimes,
    Meta, Partial, Probe, Summary, SymlinkEntry, Totals,
};
use fastcp_stream::{FileChecksum, Progress, Report, SAFE_MODE_BITS};
use fastcp_stream::{PipeWriter, WriteFrom};
use fastcp_transport::{AnyTransport, BoxStream, SshSession};
use futures_util::TryStreamExt;
use futures_util::stream::{FuturesOrdered, FuturesUnordered, StreamExt};
use russh_sftp::client::RawSftpSession;
use russh_sftp::client::error::Error as SftpError;
use russh_sftp::protocol::{FileAttributes, OpenFlags, Packet, StatusCode};
use tokio::io::{AsyncWriteExt, DuplexStream};
use tokio::sync::{Notify, OnceCell, Semaphore, SetOnce};

use crate::client::{Plan, SessionDone, top_level_name, within_idle_limit};
use crate::location::Location;
use crate::remote::{FailedLogins, LOGIN_WAIT, fewer_logins, login_refused, login_too_slow};
use crate::remote_hash::{Hasher, alongside};
use crate::{Error, Log};

mod listings;
use listings::{Folder, LISTINGS_AT_ONCE, Listings, Seen};

/// SFTP sessions (each on an SSH connection of its own) unless `-j` says otherwise.
pub const DEFAULT_SFTP_SESSIONS: u16 = 4;

/// The largest read or write request: OpenSSH's `sftp-server` takes up to 256 KiB packets.
const MAX_IO: u32 = 255 << 10;
/// Read or write requests in flight on one file range.
const IO_IN_FLIGHT: usize = 8;
/// Files read at once on each session (each holds a handle: fewer than 128 in all).
const FILES_IN_FLIGHT: usize = 32;
/// Read or write requests in flight on one session, all its files together: what bounds
/// the memory a copy holds (a request is at most 255 KiB).
const SESSION_REQUESTS: usize = 16;
/// Files bigger than this are split into ranges of this size, read by all sessions.
const RANGE: u64 = 32 << 20;
/// Bytes of file data a push holds in flight, waiting for the remote's acknowledgement.
const PUSH_IN_FLIGHT: usize = 8 << 20;
/// Small files a push has open at once on each session. The SFTP library carries handles as
/// strings, and `sftp-server`'s handles are 4-byte numbers: from 128 on, one is not valid
/// UTF-8 and comes back mangled (the server then refuses it). So each session keeps its
/// open handles below 128: these, a few big files', and the listings of the quick check
/// and of the sweeps ([`LISTINGS_AT_ONCE`] in all).
const PUSH_FILES_IN_FLIGHT: usize = 96;

/// One SFTP session and what its server allows.
struct Sftp {
    raw: RawSftpSession,
    io: u32,
    posix_rename: bool,
    /// The server flushes a file to disk on request (`fsync@openssh.com`).
    fsync: bool,
    /// The server expands `~user` (`expand-path@openssh.com`, as scp asks it since OpenSSH
    /// 8.7).
    expand_path: bool,
    /// The server tells a file system's free space (`statvfs@openssh.com`).
    statvfs: bool,
    /// Places for requests in flight (see [`SESSION_REQUESTS`]).
    requests: Arc<Semaphore>,
    /// Places for the quick check's listings (see [`LISTINGS_AT_ONCE`]).
    listing_places: Semaphore,
}

/// A limit in the whole seconds russh-sftp takes, rounded up: never shorter than asked.
fn whole_secs(limit: Duration) -> u64 {
    limit.as_secs() + u64::from(limit.subsec_nanos() > 0)
}

impl Sftp {
    async fn open(stream: BoxStream, timeout: Option<Duration>) -> Result<Sftp, Error> {
        let config = russh_sftp::client::Config {
            max_packet_len: MAX_IO + (16 << 10),
            request_timeout_secs: timeout
                .filter(|t| !t.is_zero())
                .map_or(WATCHED_REQUEST_LIMIT.as_secs(), whole_secs),
            ..Default::default()
        };
        let limit = config.request_timeout_secs;
        let heard = Arc::new(Mutex::new(Vec::new()));
        let stream = FirstBytes {
            inner: stream,
            heard: heard.clone(),
            ahead: BytesMut::new(),
        };
        let mut raw = RawSftpSession::new_with_config(stream, config);
        let version = raw.init().await.map_err(|e| match e {
            // What a login shell that prints (an `echo` in ~/.bashrc) said, where the
            // server's first reply belongs.
            SftpError::IO(_) | SftpError::UnexpectedBehavior(_) if !lock(&heard).is_empty() => {
                Error::RemoteCommand(format!(
                    "the remote's SFTP server began with \"{}\", which is not SFTP: {}",
                    crate::stream::escape(&lock(&heard)),
                    crate::client::SHELL_PRINTS
                ))
            }
            // The system ssh's `-s` on a host without the subsystem: the stream just ends.
            SftpError::IO(_) | SftpError::UnexpectedBehavior(_) => serves_no_sftp(e),
            // Slow, not absent: a login script that takes its time, a loaded host.
            SftpError::Timeout => Error::Timeout(format!(
                "starting SFTP: the remote's SFTP server did not answer within {limit} s"
            )),
            e => fatal("starting SFTP", e),
        })?;
        let posix_rename = version.extensions.contains_key("posix-rename@openssh.com");
        let fsync = version.extensions.contains_key("fsync@openssh.com");
        let expand_path = version.extensions.contains_key("expand-path@openssh.com");
        let statvfs = version.extensions.contains_key("statvfs@openssh.com");
        let mut io = 32 << 10;
        if version.extensions.contains_key("limits@openssh.com")
            && let Ok(limits) = raw.limits().await
        {
            let allowed = limits
                .max_read_len
                .min(limits.max_write_len)
                .min(u64::from(MAX_IO));
            if allowed >= 4096 {
                io = allowed as u32;
            }
            raw.set_limits(limits.into());
        }
        Ok(Sftp {
            raw,
            io,
            posix_rename,
            fsync,
            expand_path,
            statvfs,
            requests: Arc::new(Semaphore::new(SESSION_REQUESTS)),
            listing_places: Semaphore::new(LISTINGS_AT_ONCE),
        })
    }

    /// A place for one more request in flight: waited for when `wait`, else only if free.
    async fn place(&self, wait: bool) -> Option<tokio::sync::OwnedSemaphorePermit> {
        if wait {
            self.requests.clone().acquire_owned().await.ok()
        } else {
            self.requests.clone().try_acquire_owned().ok()
        }
    }

    /// Renames `from` over `to`: atomically with `posix-rename@openssh.com`; else with the
    /// plain rename, which fails on an existing target, removed first.
    async fn replace(&self, from: &str, to: &str) -> Result<(), SftpError> {
        if self.posix_rename {
            let mut data = Vec::with_capacity(8 + from.len() + to.len());
            for s in [from, to] {
                data.extend_from_slice(&(s.len() as u32).to_be_bytes());
                data.extend_from_slice(s.as_bytes());
            }
            return match self.raw.extended("posix-rename@openssh.com", data).await? {
                Packet::Status(s) if s.status_code == StatusCode::Ok => Ok(()),
                Packet::Status(s) => Err(SftpError::Status(s)),
                _ => Err(SftpError::UnexpectedPacket),
            };
        }
        if self.raw.rename(from, to).await.is_ok() {
            return Ok(());
        }
        // The target goes only while what replaces it is still there.
        self.raw.lstat(from).await?;
        let _ = self.raw.remove(to).await;
        self.raw.rename(from, to).await.map(|_| ())
    }
}

/// SSH logins at most under way at once: OpenSSH's sshd starts refusing connections beyond
/// 10 unauthenticated ones (`MaxStartups 10:30:100`), counting other users' too.
const LOGINS_AT_ONCE: usize = 4;

/// Runs `opens`, [`LOGINS_AT_ONCE`] at a time; their outcomes in order, or the first error.
async fn at_once<T>(opens: Vec<impl Future<Output = Result<T, Error>>>) -> Result<Vec<T>, Error> {
    futures_util::stream::iter(opens)
        .buffered(LOGINS_AT_ONCE)
        .try_collect()
        .await
}

/// `n` SFTP sessions on `peer`'s connection and more to the same host, each on an SSH
/// connection of its own; with `limit` (`--bwlimit`), all of their bytes count against it.
/// Every byte they move counts in `progress` as it moves, for the idle limit. Returns the
/// extra connections too, to keep open while the sessions run.
///
/// The built-in client's extra logins that fail (an sshd that drops logins beyond
/// `MaxStartups`, a one-time password, a limit of one login per user) or are not done
/// within [`LOGIN_WAIT`] (unless the first was typed: a prompt) leave fewer sessions, with
/// one warning, and mark the session (`logins_failed`); those not yet started are not tried.
async fn sessions(
    peer: &AnyTransport,
    n: usize,
    small_pull: Option<&[String]>,
    timeout: Option<Duration>,
    limit: Option<Arc<crate::limit::RateLimit>>,
    progress: &Arc<Progress>,
    (logins_failed, log): (&FailedLogins, &Log),
) -> Result<(Vec<SshSession>, Vec<Arc<Sftp>>), Error> {
    let limited = |s: BoxStream| -> BoxStream {
        let s: BoxStream = match &limit {
            Some(l) => Box::new(crate::limit::Limited::new(s, l.clone())),
            None => s,
        };
        Box::new(fastcp_stream::Counted::new(s, progress.clone()))
    };
    // How many more than the first: for a pull of single files, asked of the first session
    // once it is up (a pull of small files needs no more).
    let more = async |first: &Sftp| match small_pull {
        Some(paths) if files_within(first, paths, RANGE).await => 0,
        _ => n - 1,
    };
    // The sessions start together, up to LOGINS_AT_ONCE logins at a time.
    match peer {
        AnyTransport::Builtin(first) => {
            let patience = (!first.login_was_typed()).then_some(LOGIN_WAIT);
            // Why the first extra login that failed did.
            let refused = Mutex::new(None);
            let extra = |k: usize| -> Vec<_> {
                (0..k)
                    .map(|_| async {
                        if lock(&refused).is_some() {
                            return Ok(None);
                        }
                        let login = first.reconnect();
                        let ended = match patience {
                            Some(p) => tokio::time::timeout(p, login).await.ok(),
                            None => Some(login.await),
                        };
                        let ssh = match ended {
                            Some(Ok(ssh)) => ssh,
                            Some(Err(e)) => {
                                lock(&refused).get_or_insert_with(|| login_refused(&e));
                                return Ok(None);
                            }
                            None => {
                                lock(&refused).get_or_insert_with(login_too_slow);
                                return Ok(None);
                            }
                        };
                        let stream = ssh.open_subsystem("sftp").await.map_err(serves_no_sftp)?;
                        let sftp = match Sftp::open(limited(Box::new(stream)), timeout).await {
                            Ok(sftp) => sftp,
                            Err(e) => return Err(connection_lost_or(e, &ssh).await),
                        };
                        Ok::<_, Error>(Some((ssh, Arc::new(sftp))))
                    })
                    .collect()
            };
            let first = async {
                let stream = first.open_subsystem("sftp").await.map_err(serves_no_sftp)?;
                match Sftp::open(limited(Box::new(stream)), timeout).await {
                    Ok(sftp) => Ok(Arc::new(sftp)),
                    Err(e) => Err(connection_lost_or(e, first).await),
                }
            };
            let (first, extra) = match small_pull {
                None => tokio::try_join!(first, at_once(extra(n - 1)))?,
                Some(_) => {
                    let first = first.await?;
                    let k = more(&first).await;
                    (first, at_once(extra(k)).await?)
                }
            };
            let (connections, extra): (Vec<_>, Vec<_>) = extra.into_iter().flatten().unzip();
            let sessions: Vec<_> = std::iter::once(first).chain(extra).collect();
            if let Some(why) = lock(&refused).take() {
                let over = format!("{} SFTP session(s)", sessions.len());
                fewer_logins(logins_failed, log, &why, &over);
            }
            Ok((connections, sessions))
        }
        AnyTransport::Program(program) => {
            let first = program
                .open_subsystem("sftp")
                .await
                .map_err(serves_no_sftp)?;
            let opened = Sftp::open(limited(Box::new(first.stream)), timeout).await;
            let mut sftp = vec![Arc::new(with_ssh_words(opened, first.stderr).await?)];
            // After the first, which logs in (asking for a passphrase, if need be) and starts
            // the connection master the others may ride; then one alone, which finds out
            // whether they must; then the rest.
            // An extra session, or why it did not start (ssh's words, if it said any).
            let open = || async {
                let mut own = program
                    .open_extra_subsystem("sftp")
                    .await
                    .map_err(|e| e.to_string())?;
                match Sftp::open(limited(Box::new(own.stream)), timeout).await {
                    Ok(session) => Ok(Arc::new(session)),
                    // Its own login would need a prompt: ride the first one's connection.
                    Err(_) if program.has_master() && !program.streams_through_master() => {
                        program.set_streams_through_master(true);
                        let mut shared = program
                            .open_extra_subsystem("sftp")
                            .await
                            .map_err(|e| e.to_string())?;
                        match Sftp::open(limited(Box::new(shared.stream)), timeout).await {
                            Ok(session) => Ok(Arc::new(session)),
                            Err(e) => Err(last_words(&mut shared.stderr)
                                .await
                                .map_or_else(|| e.to_string(), |said| format!("ssh: {said}"))),
                        }
                    }
                    Err(e) => Err(last_words(&mut own.stderr)
                        .await
                        .map_or_else(|| e.to_string(), |said| format!("ssh: {said}"))),
                }
            };
            // The first session is up: one that does not start is a login the server
            // refused (MaxStartups, one login per user), and the copy goes over fewer.
            let refused = Mutex::new(None);
            let extra = || async {
                if lock(&refused).is_some() {
                    return Ok(None);
                }
                match open().await {
                    Ok(session) => Ok(Some(session)),
                    Err(said) => {
                        lock(&refused).get_or_insert_with(|| {
                            format!(
                                "an extra SFTP session did not start (the remote sshd refused \
                                 the login? MaxStartups/PerSourceMaxStartups): {said}"
                            )
                        });
                        Ok::<_, Error>(None)
                    }
                }
            };
            let k = more(&sftp[0]).await;
            if k > 0 {
                sftp.extend(extra().await?);
                sftp.extend(
                    at_once((1..k).map(|_| extra()).collect())
                        .await?
                        .into_iter()
                        .flatten(),
                );
            }
            if let Some(why) = lock(&refused).take() {
                let over = format!("{} SFTP session(s)", sftp.len());
                fewer_logins(logins_failed, log, &why, &over);
            }
            Ok((Vec::new(), sftp))
        }
    }
}

/// A stream that keeps the first bytes read from it ([`FIRST_BYTES`] at most), to show what
/// came where an SFTP server's first reply belongs. It reads them in reads of its own, as
/// many as have come, since the SFTP client reads the first 4 alone.
struct FirstBytes {
    inner: BoxStream,
    heard: Arc<Mutex<Vec<u8>>>,
    /// Bytes read ahead and not yet handed on.
    ahead: BytesMut,
}

/// Whether `first`, the first bytes of a stream, can begin an SFTP `VERSION` packet: a
/// length under 1 MiB, then type 2. Fewer than five bytes cannot tell.
fn starts_like_version(first: &[u8]) -> bool {
    match first {
        [a, b, c, d, kind, ..] => u32::from_be_bytes([*a, *b, *c, *d]) < 1 << 20 && *kind == 2,
        _ => true,
    }
}

/// How many of a stream's first bytes [`FirstBytes`] keeps.
const FIRST_BYTES: usize = 64;

impl tokio::io::AsyncRead for FirstBytes {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        let room = FIRST_BYTES.saturating_sub(lock(&self.heard).len());
        if self.ahead.is_empty() && room > 0 {
            let mut first = [0; FIRST_BYTES];
            let mut into = tokio::io::ReadBuf::new(&mut first[..room]);
            std::task::ready!(std::pin::Pin::new(&mut self.inner).poll_read(cx, &mut into))?;
            let got = into.filled();
            lock(&self.heard).extend_from_slice(got);
            self.ahead.extend_from_slice(got);
            if got.is_empty() {
                return std::task::Poll::Ready(Ok(()));
            }
            // Not the start of an SFTP `VERSION` reply (a length, then type 2): say so now,
            // rather than wait for as many bytes as the text's first four would count.
            if !starts_like_version(&lock(&self.heard)) {
                return std::task::Poll::Ready(Err(std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    "not an SFTP reply",
                )));
            }
        }
        if self.ahead.is_empty() {
            return std::pin::Pin::new(&mut self.inner).poll_read(cx, buf);
        }
        let n = self.ahead.len().min(buf.remaining());
        buf.put_slice(&self.ahead.split_to(n));
        std::task::Poll::Ready(Ok(()))
    }
}

impl tokio::io::AsyncWrite for FirstBytes {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// Whether the remote `paths` (as typed) are all regular files, `most` bytes at most
/// together.
async fn files_within(sftp: &Sftp, paths: &[String], most: u64) -> bool {
    let mut total = 0u64;
    for path in paths {
        match sftp.raw.stat(remote_path(path)).await {
            Ok(a) if file_type(&a.attrs) == S_IFREG => {
                total = total.saturating_add(a.attrs.size.unwrap_or(u64::MAX));
            }
            _ => return false,
        }
    }
    total <= most
}

/// `opened`, or, when the system ssh's SFTP session did not start, the error with what ssh
/// said on its stderr (such as "subsystem request failed") in place of the SFTP library's
/// words, which say only that the stream ended.
async fn with_ssh_words(
    opened: Result<Sftp, Error>,
    mut stderr: fastcp_transport::ssh::Stderr,
) -> Result<Sftp, Error> {
    let Err(Error::RemoteCommand(message)) = opened else {
        return opened;
    };
    // The server said something, just not SFTP: that is the error.
    if !message.starts_with(NO_SFTP) {
        return Err(Error::RemoteCommand(message));
    }
    match last_words(&mut stderr).await {
        Some(said) => Err(serves_no_sftp(format_args!("ssh: {said}"))),
        None => Err(Error::RemoteCommand(message)),
    }
}

/// What an ssh process that has exited, or is about to, said on its stderr, on one line
/// (300 characters at most), if anything.
async fn last_words(stderr: &mut fastcp_transport::ssh::Stderr) -> Option<String> {
    let mut said = Vec::new();
    // Its last words come at once.
    let _ = tokio::time::timeout(Duration::from_secs(2), async {
        while let Some(chunk) = stderr.recv().await {
            said.extend_from_slice(&chunk);
        }
    })
    .await;
    let said = String::from_utf8_lossy(&said);
    let said = said.trim();
    (!said.is_empty()).then(|| {
        let said: String = said.lines().collect::<Vec<_>>().join("; ");
        said.chars().take(300).collect()
    })
}

/// `e`, or, where it says the remote host serves no SFTP but the SSH connection itself has
/// ended (a cut as the session started, not a host without an SFTP server), that.
async fn connection_lost_or(e: Error, ssh: &SshSession) -> Error {
    match &e {
        Error::RemoteCommand(said) if said.starts_with(NO_SFTP) => {}
        _ => return e,
    }
    // The connection's end reaches its handle just after the channel's.
    let closed = tokio::time::timeout(Duration::from_millis(500), async {
        while !ssh.is_closed() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .is_ok();
    if closed {
        Error::ConnectionClosed("the SSH connection closed as the SFTP session started".into())
    } else {
        e
    }
}

/// The error for a remote host where no SFTP session starts, saying `why`.
fn serves_no_sftp(why: impl std::fmt::Display) -> Error {
    Error::RemoteCommand(format!("{NO_SFTP} ({why})"))
}

/// How [`serves_no_sftp`]'s errors begin.
pub(crate) const NO_SFTP: &str = "the remote host serves no SFTP either";

/// Whether an SFTP failure ends the whole copy (the session is gone) rather than one file.
fn is_session_failure(e: &SftpError) -> bool {
    match e {
        SftpError::Status(s) => matches!(
            s.status_code,
            StatusCode::NoConnection | StatusCode::ConnectionLost | StatusCode::BadMessage
        ),
        SftpError::IO(_) | SftpError::Timeout | SftpError::UnexpectedPacket => true,
        SftpError::UnexpectedBehavior(_) | SftpError::Limited(_) => true,
    }
}

/// What an SFTP failure says, with a hint where the server gave no reason: OpenSSH's
/// sftp-server answers a full disk, a read-only file system and a quota alike with the bare
/// "Failure".
fn said(e: &SftpError) -> String {
    match e {
        SftpError::Status(s) if s.status_code == StatusCode::Failure => {
            let message = s.error_message.trim();
            if message.is_empty() || message.eq_ignore_ascii_case("failure") {
                "the server failed without saying why (on a write: a full disk, a read-only \
                 file system or a quota, most often)"
                    .into()
            } else {
                message.into()
            }
        }
        // OpenSSH's sftp-server says only the code's own name ("No such file: No such
        // file" as the library prints it): once is enough.
        SftpError::Status(s) => {
            let message = s.error_message.trim();
            match s.status_code {
                _ if !message.is_empty()
                    && !message.eq_ignore_ascii_case(&s.status_code.to_string()) =>
                {
                    e.to_string()
                }
                StatusCode::NoSuchFile => "no such file or directory".into(),
                StatusCode::PermissionDenied => "permission denied".into(),
                code => code.to_string(),
            }
        }
        e => e.to_string(),
    }
}

/// The error that stops a push whose write to `file` failed with `e` because the remote
/// disk is full, or `None` for another failure: sftp-server answers a full disk with a bare
/// "Failure", so the server is asked for the free space where the file is
/// (`statvfs@openssh.com`, when it offers it), and a disk without room for one more write
/// is full. Every file after it would fail the same way.
async fn no_space_left(sftp: &Sftp, file: &PushFile, e: &SftpError) -> Option<Error> {
    let bare = matches!(e, SftpError::Status(s) if s.status_code == StatusCode::Failure);
    if !bare || !sftp.statvfs {
        return None;
    }
    let fs = sftp.raw.statvfs(file.temp.clone()).await.ok()?;
    let free = fs.blocks_avail.saturating_mul(fs.fragment_size);
    (free < u64::from(sftp.io)).then(|| {
        let name = file
            .target
            .as_ref()
            .map_or(file.temp.as_str(), String::as_str);
        Error::Refused {
            code: ErrorCode::NoSpace,
            message: format!(
                "writing {name} over SFTP: no space left on device on the remote host \
                 ({free} bytes free)"
            ),
        }
    })
}

/// The protocol's error code for an SFTP failure.
fn code(e: &SftpError) -> ErrorCode {
    match e {
        SftpError::Status(s) => match s.status_code {
            StatusCode::NoSuchFile => ErrorCode::NotFound,
            StatusCode::PermissionDenied => ErrorCode::PermissionDenied,
            StatusCode::OpUnsupported => ErrorCode::Unsupported,
            _ => ErrorCode::Io,
        },
        _ => ErrorCode::Io,
    }
}

fn fatal(what: &str, e: SftpError) -> Error {
    match e {
        SftpError::Timeout => {
            Error::Timeout(format!("{what} over SFTP: the server stopped answering"))
        }
        SftpError::IO(m) => Error::ConnectionClosed(format!("{what} over SFTP: {m}")),
        // The session's stream ended, and with it the answers its requests waited for.
        SftpError::UnexpectedBehavior(m)
            if m == "sender dropped"
                || m == "session closed"
                || m.starts_with("SendError")
                || m.starts_with("RecvError") =>
        {
            Error::ConnectionClosed(format!("{what} over SFTP: the connection closed"))
        }
        SftpError::Status(ref s)
            if matches!(
                s.status_code,
                StatusCode::NoConnection | StatusCode::ConnectionLost
            ) =>
        {
            Error::ConnectionClosed(format!("{what} over SFTP: {e}"))
        }
        // The server's answer to a request: it keeps its kind (a path it does not have, one
        // it may not touch).
        SftpError::Status(_) => Error::Refused {
            code: code(&e),
            message: format!("{what} over SFTP: {}", said(&e)),
        },
        e => Error::Remote(format!("{what} over SFTP: {e}")),
    }
}

/// Runs the copy `plan` over SFTP, on `peer`'s connection and more to the same host.
/// When a login for another stream or session failed in the copy's session less than
/// [`LOGIN_RETRY`](crate::remote::LOGIN_RETRY) ago (`logins_failed`), it takes one SFTP
/// session, and logs in no more.
pub(crate) async fn copy(
    plan: &Plan,
    peer: &AnyTransport,
    logins_failed: &FailedLogins,
    progress: Arc<Progress>,
) -> Result<SessionDone, Error> {
    refuse_unsupported(plan)?;
    let log = &plan.options.log;
    let mut n = match plan.options.streams {
        Some(n) => n,
        // Each file travels whole on one session: another session's login would cost more
        // than it saved.
        None if plan.pushes_files_within(RANGE) => 1,
        None => DEFAULT_SFTP_SESSIONS,
    }
    .clamp(1, crate::client::MAX_SSH_STREAMS) as usize;
    let typed = matches!(peer, AnyTransport::Builtin(s) if s.login_was_typed());
    if n > 1 && logins_failed.recent(typed) {
        n = 1;
        log.info(|| {
            format!(
                "copying over 1 SFTP session: logins for more streams failed in this session \
                 less than {} s ago",
                crate::remote::LOGIN_RETRY.as_secs()
            )
        });
    }
    // A pull of single files (no -r) is sized once the first session is up, by the same
    // rule.
    let sources = remote_sources(plan);
    let small_pull = (plan.options.streams.is_none()
        && !plan.options.recursive
        && plan.sources.iter().all(|s| s.remote().is_some()))
    .then_some(&sources[..]);
    let limit = plan.rate_limit();
    let (_connections, sftp) = sessions(
        peer,
        n,
        small_pull,
        plan.options.timeout,
        limit.clone(),
        &progress,
        (logins_failed, log),
    )
    .await?;
    let n = sftp.len();
    log.info(|| {
        format!(
            "transport: SFTP, {n} session(s), {} KiB requests, {}",
            sftp[0].io >> 10,
            if sftp[0].posix_rename {
                "atomic renames"
            } else {
                "no posix-rename: an existing target is removed before the rename"
            }
        )
    });
    let started = std::time::Instant::now();
    // `--checksum`: shells on the remote hash its files (see `crate::remote_hash`). They are
    // given absolute paths: a relative SFTP path starts from the SFTP server's folder.
    let (hasher, hashing) = match plan.options.checksum {
        true => {
            let base = real_path(&sftp[0], ".")
                .await
                .map_err(|e| fatal("resolving the remote's folder", e))?;
            let timeout = plan.options.timeout;
            let (hasher, hashing) = Hasher::start(peer, n, &base, timeout, progress.clone(), log);
            // On the heap: a copy's futures nest deep enough for a thread's stack.
            (Some(hasher), Some(Box::pin(hashing)))
        }
        false => (None, None),
    };
    let mut listing = Vec::new();
    let report = match (&plan.dest, plan.options.dry_run) {
        // A dry run moves no data, so the idle limit does not apply (as on fastcp's own
        // path); SSH's keepalives still notice a peer that stopped answering. A push lists
        // its own walk; the remote is not asked (Plan refuses -n with the options that would
        // need it).
        (Location::Remote(r), true) => {
            push_place(plan, &home_expanded(&sftp[0], &r.path).await?, &sftp[0]).await?;
            let report;
            (listing, report) = crate::dry_run::list_local(plan, true).await;
            report
        }
        (Location::Local(dest), true) => {
            let report;
            (listing, report) = list_remote(plan, dest, sftp).await?;
            report
        }
        (Location::Remote(r), false) => {
            watched(&sftp);
            let work = push(plan, &r.path, sftp, limit, progress.clone(), log, hasher);
            let work = alongside(Box::pin(work), hashing);
            within_idle_limit(&progress, plan.options.timeout, work).await?
        }
        (Location::Local(dest), false) => {
            watched(&sftp);
            let work = pull(plan, dest, sftp, progress.clone(), hasher);
            let work = alongside(Box::pin(work), hashing);
            within_idle_limit(&progress, plan.options.timeout, work).await?
        }
    };
    Ok(SessionDone {
        report,
        streams: n,
        cipher: None,
        provider: None,
        compression: None,
        remote_software: "SFTP version 3".into(),
        listing,
        data_time: started.elapsed(),
    })
}

/// How long one SFTP request may wait for its answer while the idle limit watches the copy,
/// or when there is no `--timeout`.
const WATCHED_REQUEST_LIMIT: Duration = Duration::from_secs(3600);

/// Lets `sftp`'s requests wait up to [`WATCHED_REQUEST_LIMIT`] for their answers, once the
/// copy runs under the idle limit (`--timeout`), which then tells a stall. A request waits
/// behind up to [`SESSION_REQUESTS`] others on its session, and its whole queue behind a slow
/// link or a low `--bwlimit` can take longer than `--timeout` while bytes keep moving.
fn watched(sftp: &[Arc<Sftp>]) {
    for session in sftp {
        session.raw.set_timeout(WATCHED_REQUEST_LIMIT.as_secs());
    }
}

/// A dry run of a pull: the remote tree as a pull would list it (the same listing, filter
/// and checks, reading no file), then judged on this side as any pull's dry run is (the
/// quick check, what `--delete` would remove).
async fn list_remote(
    plan: &Plan,
    dest: &std::path::Path,
    sftp: Vec<Arc<Sftp>>,
) -> Result<(Vec<crate::Listed>, Report), Error> {
    let (write, mut theirs) = fastcp_stream::frame_pipe(fastcp_stream::LOCAL_PIPE_BUFFER);
    let o = &plan.options;
    let emit = Emit {
        sftp,
        outs: vec![tokio::sync::Mutex::new(Out {
            write,
            counts: Summary::default(),
        })],
        preserve: true,
        recursive: o.recursive,
        follow: o.follow_links,
        filter: o.filter.clone(),
        probing: None,
        next_id: AtomicU64::new(1),
        hasher: None,
    };
    let sources = expanded_sources(plan, &emit.sftp[0]).await?;
    let (jobs_tx, mut jobs) = tokio::sync::mpsc::channel::<Job>(1024);
    let mut report = Report::default();
    let mut listing = Vec::new();
    let listed = |path: Bytes, kind, meta: Meta| crate::Listed {
        path,
        kind,
        meta: fastcp_stream::Meta {
            atime: None,
            ..meta
        },
        delete: false,
        unentered: false,
        another_name: false,
        first: None,
    };
    // Files come as read jobs (one per small file, the first of a big one's ranges), the
    // rest as frames on the stream.
    let files = async {
        let mut files = Vec::new();
        while let Some(job) = jobs.recv().await {
            if job.range.0 == 0 {
                let kind = fastcp_stream::EntryKind::File { size: job.size };
                files.push(listed(job.wire, kind, job.meta));
            }
        }
        files
    };
    let frames = async {
        let mut frames = Vec::new();
        while let Ok(Some(frame)) = theirs.next().await {
            frames.push(frame);
        }
        frames
    };
    let listing_done = async {
        let r = emit.list(sources, jobs_tx).await;
        // The end of the pipe ends the frame reader.
        emit.outs[0].lock().await.end().await;
        r
    };
    let (result, files, frames) = tokio::join!(listing_done, files, frames);
    result?;
    for frame in frames {
        match frame {
            Frame::Dir(d) => listing.push(listed(d.path, fastcp_stream::EntryKind::Dir, d.meta)),
            Frame::Symlink(l) => listing.push(listed(
                l.path,
                fastcp_stream::EntryKind::Symlink { target: l.target },
                Meta::default(),
            )),
            Frame::Error(e) => crate::client::push_failure(
                &mut report,
                fastcp_stream::Failure::new(fastcp_stream::Side::Sender, e.path, e.code, e.message),
            ),
            _ => {}
        }
    }
    listing.extend(files);
    // In the order of the paths: a folder before what it holds.
    listing.sort_by(|a, b| a.path.cmp(&b.path));
    for entry in &listing {
        crate::dry_run::count(&mut report.local, &entry.kind);
    }
    let listing = crate::dry_run::apply(plan, dest, listing, &mut report)?;
    Ok((listing, report))
}

/// Options that need fastcp on both ends fail at once, naming the way out.
fn refuse_unsupported(plan: &Plan) -> Result<(), Error> {
    let o = &plan.options;
    let refused = [
        (o.hard_links, "-H"),
        (
            o.link_dest.is_some() && plan.dest.remote().is_some(),
            "--link-dest on a push",
        ),
        (
            o.skip_rules.any() && plan.dest.remote().is_some(),
            "--size-only, --ignore-existing and --update on a push",
        ),
        (o.attrs.any(), "--owner, --group, -X and -A"),
        (o.devices || o.specials, "--devices and --specials"),
        (
            o.one_file_system && plan.dest.remote().is_none(),
            "-x on a pull (SFTP listings carry no device numbers)",
        ),
        (
            o.transport == crate::TransportChoice::Tcp,
            "--transport tcp",
        ),
        (
            plan.has_pieces(),
            "a --shard that splits big files into pieces",
        ),
        (
            o.dry_run && plan.dest.remote().is_some() && (o.delete || o.skip_unchanged || o.resume),
            "-n with --delete or --skip-unchanged on a push",
        ),
    ];
    if let Some((_, what)) = refused.iter().find(|(on, _)| *on) {
        // Why this copy goes over SFTP says what would let it go another way.
        let instead = if o.sftp {
            "drop --sftp"
        } else if o.no_deploy {
            "install fastcp there, or let it be deployed (drop --no-deploy)"
        } else {
            "install fastcp there"
        };
        return Err(Error::Unsupported(format!(
            "{what}: this needs fastcp on the remote host, and this copy goes over SFTP; \
             {instead}"
        )));
    }
    if o.compress {
        o.log.warn(|| "-C is ignored over SFTP".into());
    }
    Ok(())
}

/// A remote path as typed after the colon, made relative to the SFTP server's starting
/// folder (the user's home): `~` and `~/` are dropped, an empty path is `.`.
fn remote_path(typed: &str) -> String {
    let p = typed
        .strip_prefix("~/")
        .or_else(|| (typed == "~").then_some(""))
        .unwrap_or(typed);
    if p.is_empty() { ".".into() } else { p.into() }
}

/// A remote path as typed, with a leading `~user` made that user's home folder, which the
/// server tells (`expand-path@openssh.com`); any other path as it is.
async fn home_expanded(sftp: &Sftp, typed: &str) -> Result<String, Error> {
    let (head, rest) = typed.split_once('/').unwrap_or((typed, ""));
    if !head.starts_with('~') || head == "~" {
        return Ok(typed.into());
    }
    // A server that cannot tell: the path as typed (a name that starts with `~`, maybe).
    if !sftp.expand_path {
        return Ok(typed.into());
    }
    let mut data = Vec::with_capacity(4 + head.len());
    data.extend_from_slice(&(head.len() as u32).to_be_bytes());
    data.extend_from_slice(head.as_bytes());
    // No such user: the path as typed, which then names nothing, as a fastcp server finds.
    let home = match sftp.raw.extended("expand-path@openssh.com", data).await {
        Ok(Packet::Name(name)) => name.files.into_iter().next().map(|f| f.filename),
        Ok(Packet::Status(_)) => return Ok(typed.into()),
        Ok(_) => None,
        Err(e) if is_session_failure(&e) => return Err(fatal("expanding a home folder", e)),
        Err(_) => return Ok(typed.into()),
    };
    let home = home
        .ok_or_else(|| Error::Remote(format!("the SFTP server gave no home folder for {head}")))?;
    Ok(join(&home, rest))
}

/// The remote sources of `plan`, as [`home_expanded`] makes them.
async fn expanded_sources(plan: &Plan, sftp: &Sftp) -> Result<Vec<String>, Error> {
    let mut sources = Vec::new();
    for typed in remote_sources(plan) {
        sources.push(home_expanded(sftp, &typed).await?);
    }
    Ok(sources)
}

fn join(base: &str, rest: &str) -> String {
    if rest.is_empty() {
        base.into()
    } else if base.ends_with('/') {
        format!("{base}{rest}")
    } else {
        format!("{base}/{rest}")
    }
}

/// What a remote wildcard stands for ([`Emit::expand`]).
struct Expansion {
    /// The remote paths of the names that match, sorted.
    matches: Vec<String>,
    /// The names that match but that SFTP cannot carry: each one's remote path, as the
    /// server gave it, and its name in the copy.
    uncarried: Vec<(String, Bytes)>,
}

/// A remote folder's entries, as a pull lists them.
struct Listing {
    /// Names and attributes (with `-L`, a link's are those of what it points to).
    entries: Vec<(String, FileAttributes)>,
    /// With `-L`: the links that loop (or chain further than the kernel follows), which
    /// cannot be copied.
    looped: Vec<String>,
}

/// Whether the link at `path`, which the server could not follow, is one of a loop: it
/// says so only as of a missing file. Followed link by link, as the kernel would, 40 at
/// most; a chain that ends on a missing name (a dangling link) is no loop.
async fn link_loops(sftp: &Sftp, path: &str) -> Result<bool, SftpError> {
    let mut at = path.to_string();
    for _ in 0..40 {
        let target = match sftp.raw.readlink(at.clone()).await {
            Ok(name) if !name.files.is_empty() => name.files[0].filename.clone(),
            Err(e) if is_session_failure(&e) => return Err(e),
            _ => return Ok(false),
        };
        at = match target.starts_with('/') {
            true => target,
            false => format!("{}{target}", split_target(&at).0),
        };
        match sftp.raw.lstat(at.clone()).await {
            Ok(a) if file_type(&a.attrs) == S_IFLNK => {}
            Err(e) if is_session_failure(&e) => return Err(e),
            _ => return Ok(false),
        }
    }
    Ok(true)
}

/// A name that can travel: SFTP carries names as UTF-8 strings.
fn utf8(wire: &[u8]) -> Result<&str, (ErrorCode, String)> {
    std::str::from_utf8(wire).map_err(|_| {
        (
            ErrorCode::Unsupported,
            "the name is not UTF-8, which the SFTP path cannot carry".into(),
        )
    })
}

/// A map whose readers can wait for a key another task has yet to insert.
struct Registry<K, V> {
    map: Mutex<HashMap<K, V>>,
    added: Notify,
}

impl<K: Eq + Hash, V: Clone> Registry<K, V> {
    fn new() -> Self {
        Registry {
            map: Mutex::new(HashMap::new()),
            added: Notify::new(),
        }
    }

    fn insert(&self, k: K, v: V) {
        lock(&self.map).insert(k, v);
        self.added.notify_waiters();
    }

    fn remove(&self, k: &K) {
        lock(&self.map).remove(k);
    }

    /// The value under `k`, once there. The copy's idle limit bounds the wait.
    async fn wait(&self, k: &K) -> V {
        loop {
            let added = self.added.notified();
            if let Some(v) = lock(&self.map).get(k) {
                return v.clone();
            }
            added.await;
        }
    }
}

/// The file type bits of SFTP attributes (`S_IFMT`): the crate's own tests take a link
/// for a regular file, since the link's bits contain the regular file's.
fn file_type(a: &FileAttributes) -> u32 {
    a.permissions.unwrap_or(0) & 0o170000
}

const S_IFDIR: u32 = 0o040000;
const S_IFREG: u32 = 0o100000;
const S_IFLNK: u32 = 0o120000;

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// A remote folder's entries (not `.` and `..`) with their attributes as listed: a
/// symlink's own.
async fn list_dir(sftp: &Sftp, remote: &str) -> Result<Vec<(String, FileAttributes)>, SftpError> {
    list_dir_and_self(sftp, remote)
        .await
        .map(|(_, entries)| entries)
}

/// [`list_dir`], with the folder's own attributes when the server lists `.` (OpenSSH's does).
async fn list_dir_and_self(
    sftp: &Sftp,
    remote: &str,
) -> Result<(Option<FileAttributes>, Vec<(String, FileAttributes)>), SftpError> {
    let handle = sftp.raw.opendir(remote).await?.handle;
    let (mut dot, mut entries) = (None, Vec::new());
    let listed = loop {
        match sftp.raw.readdir(handle.clone()).await {
            Ok(name) => {
                for f in name.files {
                    match f.filename.as_str() {
                        "." => dot = Some(f.attrs),
                        ".." => {}
                        _ => entries.push((f.filename, f.attrs)),
                    }
                }
            }
            Err(SftpError::Status(s)) if s.status_code == StatusCode::Eof => break Ok(()),
            Err(e) => break Err(e),
        }
    };
    let _ = sftp.raw.close(handle).await;
    listed.map(|()| (dot, entries))
}

/// The failure of a folder that something else is in the way of.
fn not_a_dir() -> (ErrorCode, String) {
    (
        ErrorCode::Io,
        "a file that is not a directory is in the way".into(),
    )
}

/// The server's canonical form of `path`, every symlink in it resolved.
async fn real_path(sftp: &Sftp, path: &str) -> Result<String, SftpError> {
    let name = sftp.raw.realpath(path).await?;
    name.files
        .into_iter()
        .next()
        .map(|f| f.filename)
        .ok_or_else(|| SftpError::UnexpectedBehavior("realpath gave no name".into()))
}

/// Fails unless `path`, a path with no symlink in it when it was made, still resolves to
/// itself: a symlink swapped in for it, or for a folder above it, would lead elsewhere.
async fn unmoved(sftp: &Sftp, path: &str) -> Result<(), SftpError> {
    if real_path(sftp, path).await? != path {
        return Err(entry_failure(format!(
            "{path} changed during the copy: it, or a folder above it, is now a symlink; \
             left alone"
        )));
    }
    Ok(())
}

/// A failure of one entry, not of the session: an SFTP status of `FAILURE` with `message`.
fn entry_failure(message: String) -> SftpError {
    SftpError::Status(russh_sftp::protocol::Status {
        id: 0,
        status_code: StatusCode::Failure,
        error_message: message,
        language_tag: "en-US".into(),
    })
}

/// Whether a name a server listed can be one entry of its folder.
fn is_single_name(name: &str) -> bool {
    !(name.is_empty() || name.contains('/') || name.contains('\0') || name.contains('\u{FFFD}'))
}

/// Removes `path`, reached with no symlink on the way: a folder with all it holds (each
/// level checked with [`unmoved`] before it is listed, a symlink in it removed as a link),
/// anything else as itself. Returns how many entries went, each a step of `progress`.
///
/// Over SFTP, which has no handles to folders, a folder swapped for a symlink between its
/// check and the removals in it is not caught; the check makes that window small.
async fn remove_tree(
    sftp: &Sftp,
    path: String,
    is_dir: bool,
    progress: &Progress,
) -> Result<u64, SftpError> {
    // (path, is a folder, its entries already listed): a folder is removed after them.
    let mut stack = vec![(path, is_dir, false)];
    let mut removed = 0;
    while let Some((path, is_dir, listed)) = stack.pop() {
        if is_dir && !listed {
            unmoved(sftp, &path).await?;
            let entries = list_dir(sftp, &path).await?;
            progress.mirror_step();
            stack.push((path.clone(), true, true));
            for (name, attrs) in entries {
                if !is_single_name(&name) {
                    return Err(entry_failure(format!(
                        "the server listed {name:?} in {path}"
                    )));
                }
                stack.push((join(&path, &name), file_type(&attrs) == S_IFDIR, false));
            }
            continue;
        }
        if is_dir {
            sftp.raw.rmdir(path).await?;
        } else {
            sftp.raw.remove(path).await?;
        }
        removed += 1;
        progress.mirror_step();
    }
    Ok(removed)
}

/// How many entries removing `path` over SFTP would remove: 1, and for a folder all it holds
/// (listed level by level, each checked with [`unmoved`]; what cannot be listed counts as
/// nothing).
async fn count_tree(sftp: &Sftp, path: String, is_dir: bool) -> u64 {
    let mut stack = vec![(path, is_dir)];
    let mut count = 0;
    while let Some((path, is_dir)) = stack.pop() {
        count += 1;
        if !is_dir || unmoved(sftp, &path).await.is_err() {
            continue;
        }
        for (name, attrs) in list_dir(sftp, &path).await.unwrap_or_default() {
            if is_single_name(&name) {
                stack.push((join(&path, &name), file_type(&attrs) == S_IFDIR));
            }
        }
    }
    count
}

/// Whether the folder `path` (the entry `wire`) holds, at any depth, what `filter`
/// excludes, which `--delete` keeps, and the folder with it.
async fn holds_excluded(
    sftp: &Sftp,
    path: String,
    wire: &[u8],
    filter: &fastcp_stream::Filter,
) -> Result<bool, SftpError> {
    let excluded = |_: &str, child: &[u8], is_dir: bool| !filter.allows(child, is_dir);
    holds_any(sftp, &path, wire, &excluded).await
}

/// Whether the folder `path` (the entry `wire`) holds, at any depth, an entry `kept` says
/// stays, given its name, its wire path and whether it is a folder. Listed level by level;
/// links are not followed.
async fn holds_any(
    sftp: &Sftp,
    path: &str,
    wire: &[u8],
    kept: &(dyn Fn(&str, &[u8], bool) -> bool + Sync),
) -> Result<bool, SftpError> {
    let mut stack = vec![(path.to_string(), Bytes::copy_from_slice(wire))];
    while let Some((path, wire)) = stack.pop() {
        for (name, attrs) in list_dir(sftp, &path).await? {
            let is_dir = file_type(&attrs) == S_IFDIR;
            let child = Bytes::from([&wire[..], b"/", name.as_bytes()].concat());
            if kept(&name, &child, is_dir) {
                return Ok(true);
            }
            if is_dir {
                stack.push((join(&path, &name), child));
            }
        }
    }
    Ok(false)
}

/// The failure of the entry `wire` (its path in the copy), its message naming it as `shown`:
/// the remote path the user knows it by, as a fastcp server names it.
fn error_frame(code: ErrorCode, wire: &[u8], shown: &str, message: impl Into<String>) -> Frame {
    let message = message.into();
    Frame::Error(ErrorFrame {
        code,
        fatal: false,
        path: Bytes::copy_from_slice(wire),
        // A failure of no one entry (an empty path) is its message alone.
        message: if shown.is_empty() {
            message
        } else {
            format!("{}: {message}", crate::stream::escape(shown.as_bytes()))
        },
    })
}

/// The remote path of the entry `wire` of a pull, beneath its source in `tops` (each
/// source's name in the copy and its remote path), or `wire` itself.
fn shown_in(tops: &[(Bytes, String)], wire: &[u8]) -> String {
    let (first, rest) = match wire.iter().position(|&b| b == b'/') {
        Some(i) => (&wire[..i], &wire[i + 1..]),
        None => (wire, &b""[..]),
    };
    let rest = String::from_utf8_lossy(rest);
    match tops.iter().find(|(name, _)| name[..] == *first) {
        Some((_, remote)) => join(remote, &rest),
        None => String::from_utf8_lossy(wire).into_owned(),
    }
}

/// Why an entry whose name SFTP cannot carry is not copied.
const UNCARRIED: &str = "the server listed a name that SFTP cannot carry as it is (not UTF-8, \
                         or holding '/' or NUL): not copied";

// ---------------------------------------------------------------------------------------
// Push: the local sender's frames, applied over SFTP.

/// Where the sender's top-level entries land.
enum Place {
    /// Beneath this existing remote directory, under their own names.
    Beneath(String),
    /// The single top-level entry takes this name.
    As(String),
}

/// Where a push to `typed` puts the sender's top-level entries, or why it cannot go there
/// (checked before anything is written, and by a dry run).
async fn push_place(plan: &Plan, typed: &str, session: &Sftp) -> Result<Place, Error> {
    let dest = remote_path(typed);
    let folder = plan.options.recursive && plan.local_sources().first().is_some_and(|s| s.is_dir());
    let stat = session.raw.stat(dest.clone()).await;
    // A trailing '/' on what is there and is not a folder (the server fails the stat of
    // `file/`): the copy stops on it, as one whose entries all failed (exit 1), as over
    // fastcp, and as `cp` and scp say it.
    if stat.is_err()
        && typed.ends_with('/')
        && let Ok(a) = session.raw.stat(dest.trim_end_matches('/')).await
        && file_type(&a.attrs) != S_IFDIR
    {
        return Err(Error::Engine(fastcp_stream::Error::Io {
            path: typed.into(),
            source: std::io::Error::new(std::io::ErrorKind::NotADirectory, "not a directory"),
        }));
    }
    // The stat follows a symlink: one to nothing is in a folder's way as a file is (and is
    // no folder to make), while a file replaces it.
    let dangling = folder
        && plan.sources.len() == 1
        && matches!(&stat, Err(e) if code(e) == ErrorCode::NotFound)
        && session.raw.lstat(dest.clone()).await.is_ok();
    Ok(match stat {
        _ if dangling => return Err(folder_onto_file(dest)),
        // A folder's contents (`DIR/.`) go straight into it: its top-level entry is it.
        Ok(a) if file_type(&a.attrs) == S_IFDIR && plan.contents() => {
            let real = real_path(session, &dest)
                .await
                .map_err(|e| fatal(&format!("resolving {typed}"), e))?;
            if real == "/" {
                return Err(Error::Usage(
                    "a folder's contents cannot go into the root directory".into(),
                ));
            }
            Place::As(real)
        }
        Ok(a) if file_type(&a.attrs) == S_IFDIR => Place::Beneath(dest),
        // A trailing '/' after one source that is a folder: the folder makes it, as scp and
        // `cp -r` make it.
        Err(e) if code(&e) == ErrorCode::NotFound && plan.new_target_dir() => {
            Place::As(dest.trim_end_matches('/').to_string())
        }
        // Operands that make no sense: a usage error, as over fastcp.
        Ok(_) | Err(_) if plan.sources.len() > 1 || typed.ends_with('/') => {
            return Err(Error::Usage(format!(
                "{}: not a directory (several sources, or a trailing '/', need one)",
                crate::stream::escape(typed.as_bytes())
            )));
        }
        // A device or a pipe (`/dev/null`, say) is never replaced by a file.
        Ok(a) if ![0, S_IFREG, S_IFLNK].contains(&file_type(&a.attrs)) => {
            return Err(Error::Usage(format!(
                "{}: is a device, a pipe or a socket, not a file nor a folder: fastcp writes \
                 files, not into devices or pipes, and left it as it is",
                crate::stream::escape(typed.as_bytes())
            )));
        }
        // A folder onto an existing file: refused before anything is sent, as fastcp's
        // receiver refuses it (`cp -r dir file` too).
        Ok(_) if folder => return Err(folder_onto_file(dest)),
        Ok(_) => Place::As(dest),
        Err(e) if code(&e) == ErrorCode::NotFound => Place::As(dest),
        Err(e) => return Err(fatal(&format!("checking {typed}"), e)),
    })
}

/// A folder pushed onto a file, or onto a symlink to nothing: refused before anything is
/// sent, as fastcp's receiver refuses it (`cp -r dir file` too).
fn folder_onto_file(dest: String) -> Error {
    Error::Engine(fastcp_stream::Error::Io {
        path: dest.into(),
        source: std::io::Error::new(
            std::io::ErrorKind::NotADirectory,
            "exists and is not a directory: a folder does not replace a file",
        ),
    })
}

/// A file being written: a temp name beside its target, a handle on each session that
/// writes to it, and what has arrived.
struct PushFile {
    id: u64,
    wire: Bytes,
    target: Result<String, (ErrorCode, String)>,
    temp: String,
    kind: TempKind,
    /// With [`TempKind::Offered`], the offer's block size and number of blocks.
    offer: Option<(u64, u64)>,
    size: u64,
    meta: Meta,
    created: OnceCell<()>,
    handles: Vec<OnceCell<String>>,
    written: AtomicU64,
    /// Of `written`: the bytes that came in `Data` frames, and those a `Keep` left in place.
    sent: AtomicU64,
    kept: AtomicU64,
    ended: AtomicBool,
    settled: AtomicBool,
    failure: Mutex<Option<(ErrorCode, String)>>,
    /// Its place among the files open at once, given back once it is settled.
    slot: Mutex<Option<tokio::sync::OwnedSemaphorePermit>>,
    /// Without `-p`: the permission bits of the regular file the target was when the temp
    /// file was made, which the copy keeps (as scp, cp and rsync keep them).
    replaced_mode: Mutex<Option<u32>>,
}

/// What a pushed file is written to before it takes its name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum TempKind {
    /// A new random temp name, removed if the file fails.
    Random,
    /// With `--resume`, a file bigger than [`fastcp_stream::PARTIAL_MIN`]: the partial file
    /// `.NAME.fastcp-partial`, made afresh, and kept if the copy stops.
    Partial,
    /// The same, where a stopped push left one whose blocks were offered to the sender: written
    /// over where the sender's blocks differ, then cut to the file's size.
    Offered,
}

/// The applying side of a push.
struct Apply {
    sftp: Vec<Arc<Sftp>>,
    place: Place,
    preserve: bool,
    /// `--fsync`: each file is flushed to disk before it takes its name, where the server
    /// can (`fsync@openssh.com`).
    fsync: bool,
    /// A rerun (`--skip-unchanged` and what implies it): a link that already says the same
    /// is left alone, a folder already there is not made again (nor set, if it is as it is
    /// to be), and probes are answered from the folders' listings ([`Listings`]).
    skip_unchanged: bool,
    files: Registry<u64, Arc<PushFile>>,
    /// Directories of this copy by wire path, once their entry arrived: made (true) or
    /// failed (false) once that is known.
    dirs: Registry<Bytes, Arc<SetOnce<bool>>>,
    /// The sender's chunk size: a file no bigger travels on one stream.
    chunk_size: u64,
    /// The folders of this copy by wire path, with the attributes a rerun found the folder
    /// with if it was there (see [`Apply::finish_dirs`]).
    dir_meta: Mutex<Vec<(Bytes, Meta, Option<FileAttributes>)>>,
    /// The folders (by wire path) this push added to, removed from or renamed in: their
    /// time changed.
    changed_in: Mutex<HashSet<Bytes>>,
    replies: tokio::sync::mpsc::UnboundedSender<Frame>,
    /// What is in place: the files, folders and links that arrived, and the files' bytes
    /// as a sender counts them (holes included, kept blocks not).
    done: Mutex<Summary>,
    /// The file bytes that went over SFTP for the files that arrived.
    bytes_sent: AtomicU64,
    in_flight: Arc<Semaphore>,
    /// Per session: places for small files' handles (see [`PUSH_FILES_IN_FLIGHT`]).
    open_files: Vec<Arc<Semaphore>>,
    /// With `--delete`, what to mirror by (see [`Apply::mirror`]).
    mirror: Option<Mutex<Mirror>>,
    /// What `--delete` spares (the rules, or with `--delete-excluded` the `--files-from`
    /// list alone): kept in a folder cleared for a file (see
    /// [`Apply::clear_dir_in_the_way`]) and by [`Apply::mirror`].
    filter: Option<Arc<fastcp_stream::Filter>>,
    /// Counts what a folder cleared for a file held.
    progress: Arc<Progress>,
    /// The destination's real path, resolved before the copy began (see
    /// [`Apply::real_target`]).
    root_real: String,
    /// `--resume`: big files are written to partial files, kept when the copy stops, and a
    /// partial file a stopped push left is offered to the sender (see
    /// [`Apply::partial_offer`]).
    resume: bool,
    /// The wire paths whose partial file was offered, until their `File` entry comes, with
    /// the offer's block size and number of blocks.
    offered: Mutex<HashMap<Bytes, (u64, u64)>>,
    /// Held while a probe's `Partial` and `Answer` go out, which must not be split.
    reply_order: Mutex<()>,
    /// Partial files read back at once.
    partial_reads: Semaphore,
    /// The temp files made and not yet renamed or removed (see [`LiveTemps`]).
    live: Arc<LiveTemps>,
    /// Folders looked in for the temp files a stopped push left, or made by this push (so
    /// holding none): see [`Apply::sweep_beside`].
    swept: Mutex<HashSet<String>>,
    /// Entries of this push whose names look like temp names: the user's, which no sweep
    /// may take.
    temp_like: Mutex<HashSet<String>>,
    /// `--checksum`: hashes the remote's files, for the sender to compare with its own.
    hasher: Option<Hasher>,
    /// With `--checksum` and `-p`: the mode and times each file the remote has with the
    /// source's size is to get if it is skipped, by wire path, until its `File` entry comes
    /// (then it is sent after all). What is left once the sender is done is set
    /// ([`Apply::refresh_skipped`]): set earlier, a file whose content differs would carry
    /// the source's time if the copy stopped before it was sent.
    refresh_later: Mutex<HashMap<Bytes, (FileAttributes, FileAttributes)>>,
    /// The quick check's view of the remote's folders (see [`Listings`]).
    listings: Listings,
}

/// A temp file last written this long before a push's own first temp file in its folder was
/// made is taken for one a stopped push left (see [`Apply::sweep_beside`]). A live copy
/// writes its temp files as the data comes, and one that moves nothing for longer than its
/// `--timeout` (30 s unless set) ends itself.
const STALE_TEMP: Duration = Duration::from_secs(120);

/// The temp files a push has made on the remote and not yet renamed or removed, by session.
/// What is left when the push stops early (cancelled by Ctrl-C or SIGTERM, or failed) is
/// removed when the push's own handle on this goes (see [`TempSweeper`]): a stopped push
/// leaves nothing partial on the remote but a `--resume` partial file.
struct LiveTemps {
    sftp: Vec<Arc<Sftp>>,
    /// The copy's `--bwlimit`, lifted for the removals: they would queue behind the writes
    /// already sent.
    limit: Option<Arc<crate::limit::RateLimit>>,
    /// Where a stopped push says which of its temp files it could not remove.
    log: Log,
    /// Temp name -> the session that made it; `None` once the push is stopping and its
    /// guard took them to remove.
    names: Mutex<Option<HashMap<String, usize>>>,
    /// Temp names taken for their rename, until it is done: still this push's, so that
    /// its own sweep of their folder, which may have listed them a moment before, spares
    /// them.
    renaming: Mutex<HashSet<String>>,
}

impl LiveTemps {
    /// Registers `name`, made on session `s`. False once the push is stopping: then nothing
    /// new may be made.
    fn add(&self, name: &str, s: usize) -> bool {
        lock(&self.names)
            .as_mut()
            .map(|names| names.insert(name.to_string(), s))
            .is_some()
    }

    /// Unregisters `name` before its rename (or after its removal). False when the stopping
    /// push's guard took it to remove: then it must not be renamed.
    fn take(&self, name: &str) -> bool {
        lock(&self.names)
            .as_mut()
            .and_then(|names| names.remove(name))
            .is_some()
    }

    /// Takes `name` for its rename, as [`take`](Self::take) does, until
    /// [`renamed`](Self::renamed).
    fn take_for_rename(&self, name: &str) -> bool {
        let taken = self.take(name);
        if taken {
            lock(&self.renaming).insert(name.to_string());
        }
        taken
    }

    /// The rename of `name` is over, whatever its outcome.
    fn renamed(&self, name: &str) {
        lock(&self.renaming).remove(name);
    }

    /// Whether `name` is this push's own (or the push is stopping, and all are its guard's).
    fn holds(&self, name: &str) -> bool {
        lock(&self.renaming).contains(name)
            || lock(&self.names)
                .as_ref()
                .is_none_or(|names| names.contains_key(name))
    }
}

/// A file's failure when the push stopped before it took its name.
const STOPPING: &str = "the copy stopped before it took its name";

/// How long a stopped push waits for its leftover temp files to be removed.
const CLEANUP_LIMIT: Duration = Duration::from_secs(2);

/// Held by the push future alone, so it drops with it: then it removes what [`LiveTemps`]
/// still holds, through the sessions, waiting at most [`CLEANUP_LIMIT`] and a little (this
/// thread blocks: a dropped future cannot wait). A session that is gone fails its removals
/// at once.
struct TempSweeper(Arc<LiveTemps>);

impl Drop for TempSweeper {
    fn drop(&mut self) {
        let left = lock(&self.0.names).take().unwrap_or_default();
        if left.is_empty() {
            return;
        }
        if let Some(limit) = &self.0.limit {
            limit.lift();
        }
        let sftp = self.0.sftp.clone();
        let log = self.0.log.clone();
        let removing = async move {
            let mut names: Vec<String> = left.keys().cloned().collect();
            let removals = left.into_iter().map(|(name, s)| {
                let sftp = sftp[s].clone();
                async move {
                    let removal = sftp.raw.remove(name.clone());
                    match tokio::time::timeout(CLEANUP_LIMIT, removal).await {
                        Ok(Ok(_)) => Some(name),
                        _ => None,
                    }
                }
            });
            let removed = futures_util::future::join_all(removals).await;
            names.retain(|n| !removed.iter().flatten().any(|r| r == n));
            names.sort();
            if let Some(first) = names.first() {
                // Their session is gone (the system ssh ended with this program, by the
                // same Ctrl-C from the terminal, say), or it did not answer in time: the
                // sweep of a later push takes them.
                log.warn(|| {
                    format!(
                        "{} temp file(s) stay on the remote host, such as {first}: they \
                         could not be removed as the push stopped (its connection gone or \
                         not answering); the next push into their folder removes them once \
                         they are {} minutes old",
                        names.len(),
                        STALE_TEMP.as_secs() / 60
                    )
                });
            }
        };
        use tokio::runtime::{Handle, RuntimeFlavor};
        match Handle::try_current() {
            Ok(h) if h.runtime_flavor() == RuntimeFlavor::MultiThread => {
                // On a thread of its own, waited for a little longer than the removals' own
                // limit: a runtime that is shutting down may drive nothing any more.
                let (done, finished) = std::sync::mpsc::channel();
                let removal = std::thread::Builder::new()
                    .name("fastcp-sftp-cleanup".into())
                    .spawn(move || {
                        h.block_on(removing);
                        let _ = done.send(());
                    });
                // Without a thread (none could be started), nothing is removed.
                if removal.is_ok() {
                    let limit = CLEANUP_LIMIT + Duration::from_millis(500);
                    tokio::task::block_in_place(|| finished.recv_timeout(limit).ok());
                }
            }
            // A single-threaded runtime cannot wait here: the removals go on as a task.
            Ok(h) => drop(h.spawn(removing)),
            Err(_) => {}
        }
    }
}

/// What a push with `--delete` gathers to find the extras: every wire path the sender sent
/// or probed, the folders made (wire paths), and whether the sender failed to
/// read something (then nothing is deleted: what it missed would look deleted).
#[derive(Default)]
struct Mirror {
    sent: HashSet<Bytes>,
    dirs: Vec<Bytes>,
    /// The folders sent without their contents (mount points `-x` does not enter), whose
    /// extras are left alone.
    unentered: HashSet<Bytes>,
    /// The sender's entries it skipped on purpose (a FIFO, a device), named by its local
    /// paths: the destination's entries of those names are kept.
    skipped: Vec<fastcp_stream::Failure>,
    /// What `--max-delete` still lets go: the folders cleared out of the way of a file or
    /// link during the copy take from it before the mirror does.
    budget: fastcp_stream::DeleteBudget,
    blocked: bool,
}

async fn push(
    plan: &Plan,
    typed: &str,
    sftp: Vec<Arc<Sftp>>,
    limit: Option<Arc<crate::limit::RateLimit>>,
    progress: Arc<Progress>,
    log: &Log,
    hasher: Option<Hasher>,
) -> Result<Report, Error> {
    if plan.options.fsync && !sftp[0].fsync {
        log.warn(|| {
            "--fsync: this SFTP server cannot flush files to disk (no fsync@openssh.com): \
             the files are copied without it"
                .into()
        });
    }
    let typed = &home_expanded(&sftp[0], typed).await?;
    let place = push_place(plan, typed, &sftp[0]).await?;
    // Where the copy's folders are, resolved now: a symlink swapped in later for the
    // destination, or for any folder beneath it, is then caught by the paths no longer
    // resolving to themselves (`Apply::checked_dir`).
    let resolved = match &place {
        Place::Beneath(dir) => real_path(&sftp[0], dir).await,
        Place::As(name) => {
            let (parent, base) = match name.rsplit_once('/') {
                Some(("", base)) => ("/", base),
                Some(split) => split,
                None => (".", name.as_str()),
            };
            real_path(&sftp[0], parent).await.map(|p| join(&p, base))
        }
    };
    let root_real = resolved.map_err(|e| fatal(&format!("resolving {typed}"), e))?;
    let n = sftp.len();
    // The sender's frames come through frame pipes, its chunks as the buffers it read them
    // into; the replies (answers to probes, the summary) go back on a byte pipe of their own.
    let (writers, readers): (Vec<_>, Vec<_>) = (0..n)
        .map(|_| fastcp_stream::frame_pipe(fastcp_stream::LOCAL_PIPE_BUFFER))
        .unzip();
    let (reply_read, mut reply_half) = tokio::io::duplex(64 << 10);
    let (reply_tx, mut reply_rx) = tokio::sync::mpsc::unbounded_channel();
    let live = Arc::new(LiveTemps {
        sftp: sftp.clone(),
        limit,
        log: log.clone(),
        names: Mutex::new(Some(HashMap::new())),
        renaming: Mutex::new(HashSet::new()),
    });
    let _sweeper = TempSweeper(live.clone());
    let mut send_config = plan_send_config(plan);
    let apply = Arc::new(Apply {
        sftp,
        place,
        preserve: send_config.preserve,
        fsync: plan.options.fsync,
        skip_unchanged: send_config.skip_unchanged,
        files: Registry::new(),
        dirs: Registry::new(),
        chunk_size: send_config.chunk_size as u64,
        dir_meta: Mutex::new(Vec::new()),
        changed_in: Mutex::new(HashSet::new()),
        replies: reply_tx,
        done: Mutex::new(Summary::default()),
        bytes_sent: AtomicU64::new(0),
        in_flight: Arc::new(Semaphore::new(PUSH_IN_FLIGHT)),
        open_files: (0..n)
            .map(|_| Arc::new(Semaphore::new(PUSH_FILES_IN_FLIGHT)))
            .collect(),
        mirror: plan.options.delete.then(|| {
            Mutex::new(Mirror {
                budget: fastcp_stream::DeleteBudget::new(plan.options.max_delete),
                ..Mirror::default()
            })
        }),
        filter: plan.spared(),
        progress: progress.clone(),
        root_real,
        resume: plan.options.resume,
        offered: Mutex::new(HashMap::new()),
        reply_order: Mutex::new(()),
        partial_reads: Semaphore::new(2),
        live,
        swept: Mutex::new(HashSet::new()),
        temp_like: Mutex::new(HashSet::new()),
        hasher,
        refresh_later: Mutex::new(HashMap::new()),
        listings: Listings::default(),
    });
    let mirror_progress = progress.clone();
    let applying = {
        let apply = apply.clone();
        async move {
            // In a set this future owns: dropped (a cancelled copy), it stops them.
            let mut streams = tokio::task::JoinSet::new();
            for (s, r) in readers.into_iter().enumerate() {
                let apply = apply.clone();
                streams.spawn(async move { apply.stream(s, r).await });
            }
            let mut first_error = None;
            while let Some(joined) = streams.join_next().await {
                let result = joined.unwrap_or_else(|e| Err(Error::Io(std::io::Error::other(e))));
                if let Err(e) = result {
                    first_error.get_or_insert(e);
                }
            }
            // Before the folders' times are set: removing from a folder changes its time.
            if first_error.is_none()
                && let Err(e) = apply
                    .mirror(
                        apply.filter.as_deref(),
                        plan.options.max_delete,
                        &mirror_progress,
                    )
                    .await
            {
                first_error = Some(e);
            }
            // The sender learns why, and stops waiting for the applying side's word.
            if let Some(e) = first_error {
                let _ = apply.replies.send(Frame::Error(ErrorFrame {
                    code: ErrorCode::Io,
                    fatal: true,
                    path: Bytes::new(),
                    message: e.to_string(),
                }));
                return Err(e);
            }
            // `--checksum` skipped the files whose partial files were offered and not taken:
            // whole, as their hashes said.
            let whole: Vec<Bytes> = lock(&apply.offered).drain().map(|(wire, _)| wire).collect();
            for wire in whole {
                apply.drop_whole_partial(&wire).await;
            }
            apply.refresh_skipped().await;
            apply.finish_dirs().await;
            let done = *lock(&apply.done);
            let _ = apply.replies.send(Frame::Done(done));
            Ok(())
        }
    };
    let replying = async move {
        while let Some(frame) = reply_rx.recv().await {
            let last =
                matches!(frame, Frame::Done(_)) || matches!(&frame, Frame::Error(e) if e.fatal);
            if crate::wire::write_frame(&mut reply_half, &frame)
                .await
                .is_err()
                || last
            {
                break;
            }
        }
        let _ = reply_half.shutdown().await;
    };
    // Nothing on the remote side could check a file's checksum: none is computed.
    send_config.file_checksums = false;
    let sources = plan.local_sources();
    let sending = fastcp_stream::send_to(&sources, reply_read, writers, &send_config, progress);
    let (sent, applied, ()) = tokio::join!(sending, applying, replying);
    if let Err(e) = &applied {
        log.debug(|| format!("applying over SFTP: {e}"));
    }
    match (sent, applied) {
        // What arrived, not what the sender handed over: a file that failed here was
        // read and sent into the pipe, but never reached the remote.
        (Ok(mut report), Ok(())) => {
            let deleted = report.local.deleted;
            report.local = Summary {
                errors: report.local.errors,
                deleted,
                ..report.peer
            };
            report.bytes_sent = apply.bytes_sent.load(Ordering::SeqCst);
            Ok(report)
        }
        // A sender that saw its streams close was stopped by the applying side, and one that
        // got the applying side's error frame stopped for that error: the applying side's own
        // words (and kind: a lost connection is exit code 3) tell it best.
        (Err(e), Err(a))
            if e.is_disconnect() || matches!(e, fastcp_stream::Error::Remote { .. }) =>
        {
            Err(a)
        }
        (Err(e), _) => Err(e.into()),
        (Ok(_), Err(a)) => Err(a),
    }
}

fn plan_send_config(plan: &Plan) -> fastcp_stream::SendConfig {
    let o = &plan.options;
    // `--resume` implies the quick check, whose times must be kept.
    let mut c = fastcp_stream::SendConfig {
        recursive: o.recursive,
        preserve: o.preserve || o.skip_unchanged || o.resume,
        follow_links: o.follow_links,
        skip_unchanged: o.skip_unchanged || o.resume || o.checksum,
        checksum: o.checksum,
        // What the remote's stock tools can compute (see `crate::remote_hash`).
        content_hash: fastcp_stream::ContentHash::Sha256,
        resume: o.resume,
        filter: o.filter.clone(),
        walk_ahead: plan.walk_ahead(),
        one_file_system: o.one_file_system,
        specials_refused: true,
        ..Default::default()
    };
    if let Some(size) = o.chunk_size {
        c.chunk_size = size;
    }
    c
}

impl Apply {
    /// Reads and applies stream `s`'s frames until its `Done`.
    async fn stream(
        self: &Arc<Self>,
        s: usize,
        mut frames: fastcp_stream::PipeReader,
    ) -> Result<(), Error> {
        let mut tasks = tokio::task::JoinSet::new();
        loop {
            let frame = frames.next().await?.ok_or_else(|| {
                Error::ConnectionClosed("the sender stopped before its Done".into())
            })?;
            match frame {
                // What a frame waits for here always came earlier in the sender's order (a
                // file's folder, a chunk's file), or is freed by work that needs no stream
                // (writes, a small file's own frames right behind it): so no stream waits on
                // one that waits on it.
                Frame::Dir(mut d) => {
                    // What outlives the frame is copied out of the read buffer, which a
                    // slice would keep whole.
                    d.path = Bytes::copy_from_slice(&d.path);
                    self.sent(&d.path);
                    self.registered_parent(&d.path).await;
                    let made = Arc::new(SetOnce::new());
                    self.dirs.insert(d.path.clone(), made.clone());
                    let this = self.clone();
                    tasks.spawn(async move {
                        let ok = this.dir(s, d).await?;
                        let _ = made.set(ok);
                        Ok(())
                    });
                }
                Frame::File(mut f) => {
                    f.path = Bytes::copy_from_slice(&f.path);
                    self.sent(&f.path);
                    self.note_change(&f.path);
                    lock(&self.refresh_later).remove(&f.path);
                    self.registered_parent(&f.path).await;
                    // A small file's frames follow one another on this stream, so it lets go
                    // of its place soon; a big one's come on every stream, and big files in
                    // flight are few: they take no place.
                    let slot = if f.size <= self.chunk_size {
                        let slot = self.open_files[s].clone().acquire_owned().await;
                        Some(slot.expect("never closed"))
                    } else {
                        None
                    };
                    let file = self.announce(f);
                    *lock(&file.slot) = slot;
                    let this = self.clone();
                    tasks.spawn(async move {
                        match file.handle(&this, s).await {
                            Ok(_) => this.sweep_beside(&file, s).await,
                            Err(e) => file.fail(e),
                        }
                        this.settle_if_complete(&file).await
                    });
                }
                Frame::Data(mut d) => {
                    if d.bytes.len() < 64 << 10 {
                        d.bytes = Bytes::copy_from_slice(&d.bytes);
                    }
                    let file = self.files.wait(&d.id).await;
                    let permit = self
                        .in_flight
                        .clone()
                        .acquire_many_owned(d.bytes.len().min(PUSH_IN_FLIGHT) as u32)
                        .await
                        .expect("never closed");
                    let this = self.clone();
                    tasks.spawn(async move {
                        let r = this.write(&file, s, d.offset, d.bytes).await;
                        drop(permit);
                        r
                    });
                }
                Frame::Hole(Hole { id, offset, len }) => {
                    let file = self.files.wait(&id).await;
                    let this = self.clone();
                    tasks.spawn(async move { this.hole(&file, s, offset, len).await });
                }
                Frame::FileEnd(FileEnd { id, .. }) => {
                    let file = self.files.wait(&id).await;
                    let this = self.clone();
                    tasks.spawn(async move {
                        file.ended.store(true, Ordering::SeqCst);
                        this.settle_if_complete(&file).await
                    });
                }
                Frame::Symlink(l) => {
                    self.sent(&l.path);
                    self.registered_parent(&l.path).await;
                    let this = self.clone();
                    tasks.spawn(async move { this.symlink(s, l).await });
                }
                Frame::Probe(mut p) => {
                    p.path = Bytes::copy_from_slice(&p.path);
                    self.sent(&p.path);
                    let this = self.clone();
                    tasks.spawn(async move {
                        // Probes come in thousands at once: spread over the sessions.
                        let sftp = &this.sftp[(p.id % this.sftp.len() as u64) as usize];
                        let (send, hash) = match &this.hasher {
                            Some(hasher) => this.content_hash(sftp, hasher, &p).await,
                            None => this.quick_check(sftp, &p).await,
                        };
                        // With `--checksum`, a file the remote holds at the same size is
                        // sent after all when the hashes differ: its partial file is offered
                        // as for a file it lacks.
                        let offer = match (send || hash.is_some()) && this.resume {
                            true => this.partial_offer(&p).await,
                            false => None,
                        };
                        // The quick check found the file whole: its partial file (only a
                        // file that large has one) is of no more use.
                        if !send
                            && hash.is_none()
                            && this.resume
                            && p.size > fastcp_stream::PARTIAL_MIN
                        {
                            this.drop_whole_partial(&p.path).await;
                        }
                        // The sender takes a `Partial` for the `Answer` right behind it.
                        let _order = lock(&this.reply_order);
                        if let Some(partial) = offer {
                            let offer = (partial.block, partial.hashes.len() as u64);
                            lock(&this.offered).insert(p.path.clone(), offer);
                            let _ = this.replies.send(Frame::Partial(partial));
                        }
                        let _ = this.replies.send(Frame::Answer(Answer {
                            id: p.id,
                            send,
                            hash,
                        }));
                        Ok(())
                    });
                }
                Frame::Keep(Keep { id, offset, len }) => {
                    // A block the remote's partial file holds already: nothing to write.
                    let file = self.files.wait(&id).await;
                    let this = self.clone();
                    tasks.spawn(async move {
                        let offered = file.offer.is_some_and(|(block, blocks)| {
                            offset.is_multiple_of(block)
                                && offset / block < blocks
                                && len == block.min(file.size.saturating_sub(offset))
                        });
                        if !offered {
                            file.fail(Failure::File((
                                ErrorCode::Protocol,
                                "the sender kept a block no partial file offered".into(),
                            )));
                        }
                        file.kept.fetch_add(len, Ordering::SeqCst);
                        file.written.fetch_add(len, Ordering::SeqCst);
                        this.settle_if_complete(&file).await
                    });
                }
                Frame::Totals(_) => {}
                Frame::Unentered(u) => {
                    if let Some(m) = &self.mirror {
                        lock(m).unentered.insert(Bytes::copy_from_slice(&u.path));
                    }
                }
                Frame::Error(e) if !e.fatal => {
                    // A file that failed on the sending side is not brought in line with it.
                    lock(&self.refresh_later).remove(&e.path[..]);
                    // A file skipped on purpose (a FIFO, a device) is kept; anything else the
                    // sender could not read blocks `--delete`.
                    if let Some(m) = &self.mirror {
                        let mut m = lock(m);
                        if e.code == ErrorCode::Unsupported && !e.path.is_empty() {
                            m.skipped.push(fastcp_stream::Failure::new(
                                fastcp_stream::Side::Sender,
                                Bytes::copy_from_slice(&e.path),
                                e.code,
                                String::new(),
                            ));
                        } else {
                            m.blocked = true;
                        }
                    }
                }
                Frame::Error(e) => return Err(Error::Engine(fastcp_stream::Error::from_frame(&e))),
                Frame::Done(_) => break,
                other => {
                    return Err(Error::UnexpectedFrame {
                        expected: "a copy frame",
                        got: other.name(),
                    });
                }
            }
            // Keep the finished tasks from piling up; a session failure ends the copy.
            while let Some(joined) = tasks.try_join_next() {
                joined.map_err(|e| Error::Io(std::io::Error::other(e)))??;
            }
        }
        while let Some(joined) = tasks.join_next().await {
            joined.map_err(|e| Error::Io(std::io::Error::other(e)))??;
        }
        Ok(())
    }

    /// The remote path of an entry: beneath the destination, or renamed as it.
    fn target(&self, wire: &[u8]) -> Result<String, (ErrorCode, String)> {
        fastcp_proto::path::validate(wire)
            .map_err(|e| (ErrorCode::UnsafePath, format!("refused: {e}")))?;
        let target = self.target_of(utf8(wire)?);
        // An entry named like a temp file is the user's: remembered, for the sweep to spare.
        if fastcp_stream::is_temp_name(split_target(&target).1.as_bytes()) {
            lock(&self.temp_like).insert(target.clone());
        }
        Ok(target)
    }

    /// The remote path of the entry `path` (its path in the copy), unchecked.
    fn target_of(&self, path: &str) -> String {
        match &self.place {
            Place::Beneath(dir) => join(dir, path),
            Place::As(name) => match path.split_once('/') {
                Some((_, rest)) => join(name, rest),
                None => name.clone(),
            },
        }
    }

    /// An entry's failure: said of its remote path, as a fastcp server's receiver says it
    /// (of its path in the copy when it has none: a name that is not UTF-8).
    fn failed(&self, wire: &[u8], (code, message): (ErrorCode, String)) {
        lock(&self.done).errors += 1;
        let shown = match std::str::from_utf8(wire) {
            Ok("") => String::new(),
            Ok(path) => self.target_of(path),
            Err(_) => String::from_utf8_lossy(wire).into_owned(),
        };
        let _ = self.replies.send(error_frame(code, wire, &shown, message));
    }

    /// Waits until the `Dir` entry of the folder holding `wire` has arrived.
    async fn registered_parent(&self, wire: &[u8]) -> Arc<SetOnce<bool>> {
        match wire.iter().rposition(|&b| b == b'/') {
            None => {
                let top = Arc::new(SetOnce::new());
                let _ = top.set(true);
                top
            }
            Some(i) => self.dirs.wait(&Bytes::copy_from_slice(&wire[..i])).await,
        }
    }

    /// Waits until the folder holding `wire` is made; false when it failed.
    async fn parent_ready(&self, wire: &[u8]) -> bool {
        *self.registered_parent(wire).await.wait().await
    }

    /// Makes a folder; `Ok(false)` when it failed (and the failure is reported).
    async fn dir(&self, s: usize, d: DirEntry) -> Result<bool, Error> {
        Ok(match self.make_dir(s, &d).await {
            Ok(found) => {
                lock(&self.done).dirs += 1;
                if let Some(m) = &self.mirror {
                    lock(m).dirs.push(d.path.clone());
                }
                lock(&self.dir_meta).push((d.path.clone(), d.meta, found));
                true
            }
            Err(Err(e)) => return Err(e),
            Err(Ok(failure)) => {
                self.failed(&d.path, failure);
                false
            }
        })
    }

    /// Makes one directory, or finds it there (a rerun: with the attributes it has then):
    /// `Err(Ok(..))` for this entry's failure, `Err(Err(..))` for the session's.
    async fn make_dir(
        &self,
        s: usize,
        d: &DirEntry,
    ) -> Result<Option<FileAttributes>, Result<(ErrorCode, String), Error>> {
        let path = self.target(&d.path).map_err(Ok)?;
        if !self.parent_ready(&d.path).await {
            return Err(Ok((ErrorCode::Io, "its parent could not be made".into())));
        }
        let sftp = &self.sftp[s];
        // A rerun finds most folders there: one stat, rather than a mkdir that fails and a
        // stat; not in a folder this push made.
        if self.skip_unchanged && !self.listings.was_made(split_target(&path).0) {
            let place = sftp.place(true).await;
            let found = sftp.raw.lstat(path.clone()).await;
            drop(place);
            match found {
                Ok(a) if file_type(&a.attrs) == S_IFDIR => return Ok(Some(a.attrs)),
                Err(e) if is_session_failure(&e) => {
                    return Err(Err(fatal("looking for a directory", e)));
                }
                // Something else in the way is cleared below.
                Ok(_) | Err(_) => {}
            }
        }
        self.note_change(&d.path);
        let attrs = FileAttributes {
            permissions: Some(d.meta.mode & 0o777 | 0o700),
            ..FileAttributes::empty()
        };
        let mut cleared = false;
        loop {
            match sftp.raw.mkdir(path.clone(), attrs.clone()).await {
                Ok(_) => {
                    // New: no stopped push left anything in it, and nothing is there to probe.
                    lock(&self.swept).insert(path.clone());
                    // Known empty: for the quick check, and for the modes a file without -p
                    // keeps of the one it replaces.
                    if self.skip_unchanged || !self.preserve {
                        self.listings.made(&path);
                    }
                    return Ok(None);
                }
                Err(e) if is_session_failure(&e) => {
                    return Err(Err(fatal("making a directory", e)));
                }
                Err(e) => match sftp.raw.lstat(path.clone()).await {
                    Ok(a) if file_type(&a.attrs) == S_IFDIR => return Ok(None),
                    // A file or a link where the source has a folder: the folder takes its
                    // place, as the receiver does (a link is removed, never followed); not
                    // the destination the user named.
                    Ok(_) if !cleared && !self.is_named_dest(&d.path) => {
                        match sftp.raw.remove(path.clone()).await {
                            Ok(_) => cleared = true,
                            Err(e) if is_session_failure(&e) => {
                                return Err(Err(fatal("removing a file in a folder's way", e)));
                            }
                            Err(e) => {
                                return Err(Ok((
                                    code(&e),
                                    format!(
                                        "a file that is not a directory is in the way, and \
                                         cannot be removed: {}",
                                        said(&e)
                                    ),
                                )));
                            }
                        }
                    }
                    Ok(_) => return Err(Ok(not_a_dir())),
                    Err(_) => {
                        return Err(Ok((
                            code(&e),
                            format!("cannot make the directory: {}", said(&e)),
                        )));
                    }
                },
            }
        }
    }

    /// Whether `wire` lands on the destination the user named (the copy's single top-level
    /// entry, given its name): never removed to make way.
    fn is_named_dest(&self, wire: &[u8]) -> bool {
        matches!(self.place, Place::As(_)) && !wire.contains(&b'/')
    }

    /// Clears the folder at `target` (the entry `wire`) out of the way of a file or link
    /// that takes its name, as the receiver does: an empty one, and with `--delete` one that
    /// holds nothing the copy keeps (what the rules exclude, fastcp's work files), with all
    /// it holds; never the destination the user named. `None` when no folder is there,
    /// else whether it went.
    async fn clear_dir_in_the_way(
        &self,
        sftp: &Sftp,
        target: &str,
        wire: &[u8],
    ) -> Result<Option<bool>, Error> {
        match sftp.raw.lstat(target).await {
            Ok(a) if file_type(&a.attrs) == S_IFDIR => {}
            Err(e) if is_session_failure(&e) => return Err(fatal("looking for a folder", e)),
            Ok(_) | Err(_) => return Ok(None),
        }
        if self.is_named_dest(wire) {
            return Ok(Some(false));
        }
        match sftp.raw.rmdir(target).await {
            Ok(_) => return Ok(Some(true)),
            Err(e) if is_session_failure(&e) => {
                return Err(fatal("removing a folder in the way", e));
            }
            Err(_) if self.mirror.is_none() => return Ok(Some(false)),
            Err(_) => {}
        }
        match self.holds_kept(sftp, target, wire).await {
            Ok(false) => {}
            Ok(true) => return Ok(Some(false)),
            Err(e) if is_session_failure(&e) => return Err(fatal("listing a folder", e)),
            Err(_) => return Ok(Some(false)),
        }
        // It counts against `--max-delete`, as the mirror's extras do.
        if let Some(m) = &self.mirror
            && lock(m).budget.is_limited()
        {
            let held = AtomicU64::new(0);
            let counting = |_: &str, _: &[u8], _: bool| {
                held.fetch_add(1, Ordering::SeqCst);
                false
            };
            match holds_any(sftp, target, wire, &counting).await {
                Ok(_) => {}
                Err(e) if is_session_failure(&e) => return Err(fatal("listing a folder", e)),
                Err(_) => return Ok(Some(false)),
            }
            if !lock(m).budget.take(held.load(Ordering::SeqCst) + 1) {
                return Ok(Some(false));
            }
        }
        match remove_tree(sftp, target.to_string(), true, &self.progress).await {
            Ok(n) => {
                lock(&self.done).deleted += n;
                self.progress.deleted(Bytes::copy_from_slice(wire), n);
                Ok(Some(true))
            }
            Err(e) if is_session_failure(&e) => Err(fatal("deleting", e)),
            Err(_) => Ok(Some(false)),
        }
    }

    /// Whether the folder `path` (the entry `wire`) holds, at any depth, what `--delete`
    /// keeps: what the rules exclude, fastcp's work files, a name SFTP cannot carry.
    async fn holds_kept(&self, sftp: &Sftp, path: &str, wire: &[u8]) -> Result<bool, SftpError> {
        let kept = |name: &str, child: &[u8], is_dir: bool| {
            !is_single_name(name)
                || fastcp_stream::is_work_file(name.as_bytes())
                || self
                    .filter
                    .as_ref()
                    .is_some_and(|f| !f.allows(child, is_dir))
        };
        holds_any(sftp, path, wire, &kept).await
    }

    /// [`Sftp::replace`] of `temp` over `target` (the entry `wire`), clearing a folder out
    /// of the way first when [`Apply::clear_dir_in_the_way`] may; a folder that stays is
    /// this entry's failure, in the receiver's words.
    async fn replace_clearing(
        &self,
        sftp: &Sftp,
        temp: &str,
        target: &str,
        wire: &[u8],
        what: &str,
    ) -> Result<Result<(), (ErrorCode, String)>, Error> {
        let Err(e) = sftp.replace(temp, target).await else {
            return Ok(Ok(()));
        };
        if is_session_failure(&e) {
            return Err(fatal("renaming into place", e));
        }
        let retried = match self.clear_dir_in_the_way(sftp, target, wire).await? {
            Some(true) => sftp.replace(temp, target).await,
            Some(false) => {
                return Ok(Err((
                    ErrorCode::Unsupported,
                    format!(
                        "a folder with entries is in the way (--delete replaces it); {what} not copied"
                    ),
                )));
            }
            None => Err(e),
        };
        match retried {
            Ok(()) => Ok(Ok(())),
            Err(e) if is_session_failure(&e) => Err(fatal("renaming into place", e)),
            Err(e) => Ok(Err((
                code(&e),
                format!("cannot rename it into place: {}", said(&e)),
            ))),
        }
    }

    /// Notes that this push adds, removes or renames an entry beside `wire`, in a folder
    /// that so gets a new time (see [`Apply::finish_dirs`]).
    fn note_change(&self, wire: &[u8]) {
        let folder = match wire.iter().rposition(|&b| b == b'/') {
            Some(i) => &wire[..i],
            None => &wire[..0],
        };
        let mut changed_in = lock(&self.changed_in);
        if !changed_in.contains(folder) {
            changed_in.insert(Bytes::copy_from_slice(folder));
        }
    }

    /// With `--delete`, an entry sent (or probed): not an extra.
    fn sent(&self, wire: &[u8]) {
        if let Some(m) = &self.mirror {
            lock(m).sent.insert(Bytes::copy_from_slice(wire));
        }
    }

    /// `--delete`: removes from each folder this push made or found what the sender did not
    /// send, as rsync's `--delete` and fastcp's own receiver do. Only folders of the copy are
    /// looked into; what the rules exclude and fastcp's work files stay; a symlink goes as a
    /// link (SFTP's remove never follows one), a folder with all it holds. Each failure is
    /// reported on its entry. Nothing goes when the sender could not read everything.
    async fn mirror(
        &self,
        filter: Option<&fastcp_stream::Filter>,
        max_delete: Option<u64>,
        progress: &Progress,
    ) -> Result<(), Error> {
        let Some(m) = &self.mirror else {
            return Ok(());
        };
        let Mirror {
            sent,
            mut dirs,
            unentered,
            skipped,
            budget,
            blocked,
        } = std::mem::take(&mut *lock(m));
        let spared = fastcp_stream::Spared::of(&skipped).unwrap_or_default();
        dirs.retain(|d| !unentered.contains(d));
        dirs.sort_by(|a, b| fastcp_stream::mirror_order(a, b));
        if blocked {
            self.failed(
                b"",
                (ErrorCode::Other, fastcp_stream::NOTHING_DELETED.into()),
            );
            return Ok(());
        }
        // The folders at once, over every session: each removes only what it lists, which
        // holds no folder of the copy. Under `--max-delete`, one at a time, each before what
        // it holds and each in name order, as fastcp's own receiver takes them, so that the
        // limit takes the same.
        let n = self.sftp.len();
        let budget = Mutex::new(budget);
        let at_once = match max_delete {
            Some(_) => 1,
            None => SESSION_REQUESTS * n,
        };
        let (sent, spared, filter, budget) = (&sent, &spared, &filter, &budget);
        let mirrored = futures_util::stream::iter(dirs.into_iter().enumerate().map(Ok))
            .try_for_each_concurrent(at_once, |(i, dir)| async move {
                let sftp = &self.sftp[i % n];
                let checked = match self.checked_dir(sftp, &dir).await {
                    Ok(remote) => list_dir(sftp, &remote).await.map(|e| (remote, e)),
                    Err(e) => Err(e),
                };
                progress.mirror_step();
                let (remote, mut entries) = match checked {
                    Ok(found) => found,
                    Err(e) if is_session_failure(&e) => {
                        return Err(fatal("listing a folder", e));
                    }
                    Err(e) => {
                        self.failed(
                            &dir,
                            (
                                code(&e),
                                format!("cannot list it for --delete: {}", said(&e)),
                            ),
                        );
                        return Ok(());
                    }
                };
                if max_delete.is_some() {
                    entries.sort_by(|a, b| a.0.cmp(&b.0));
                }
                // Names the copy has as folders or links now: no partial file is theirs.
                let not_files: HashSet<String> = entries
                    .iter()
                    .filter(|(_, a)| file_type(a) != S_IFREG)
                    .map(|(n, _)| n.clone())
                    .collect();
                for (name, attrs) in entries {
                    let wire = Bytes::from([&dir[..], b"/", name.as_bytes()].concat());
                    if !is_single_name(&name) {
                        // What SFTP cannot name, it cannot remove: the mirror is not exact,
                        // and the copy says so.
                        let why = "not deleted: SFTP cannot carry this name as it is (not \
                                   UTF-8, or holding '/' or NUL)";
                        self.failed(&wire, (ErrorCode::Unsupported, why.into()));
                        continue;
                    }
                    let is_dir = file_type(&attrs) == S_IFDIR;
                    // What the copy sent stays, whatever its name: a source file may be named
                    // like a work file.
                    if sent.contains(&wire) || spared.spares(&wire) {
                        continue;
                    }
                    if fastcp_stream::is_work_file(name.as_bytes()) {
                        // The partial file of a file the source no longer has (none there, or
                        // a folder or a link in its place) goes, uncounted, as the receiver's
                        // mirror removes it.
                        if let Some(of) = fastcp_stream::partial_target(name.as_bytes())
                            .and_then(|of| std::str::from_utf8(of).ok())
                            && (not_files.contains(of)
                                || !sent.contains(&[&dir[..], b"/", of.as_bytes()].concat()[..]))
                        {
                            self.note_change(&wire);
                            let _ = sftp.raw.remove(join(&remote, &name)).await;
                        }
                        continue;
                    }
                    if filter.is_some_and(|f| !f.allows(&wire, is_dir)) {
                        continue;
                    }
                    // A folder holding what the rules exclude stays, whole.
                    if let Some(filter) = filter
                        && is_dir
                    {
                        match holds_excluded(sftp, join(&remote, &name), &wire, filter).await {
                            Ok(true) => continue,
                            Err(e) if is_session_failure(&e) => {
                                return Err(fatal("listing a folder", e));
                            }
                            Ok(false) | Err(_) => {}
                        }
                    }
                    if max_delete.is_some() {
                        let entries = count_tree(sftp, join(&remote, &name), is_dir).await;
                        if !lock(budget).take(entries) {
                            continue;
                        }
                    }
                    self.note_change(&wire);
                    match remove_tree(sftp, join(&remote, &name), is_dir, progress).await {
                        Ok(n) => {
                            lock(&self.done).deleted += n;
                            progress.deleted(wire, n);
                        }
                        Err(e) if is_session_failure(&e) => return Err(fatal("deleting", e)),
                        Err(e) => self
                            .failed(&wire, (code(&e), format!("cannot delete it: {}", said(&e)))),
                    }
                }
                Ok(())
            })
            .await;
        if let Some(message) = lock(budget).message() {
            self.failed(b"", (ErrorCode::DeleteLimit, message));
        }
        mirrored
    }

    /// The path of the folder `wire` of this copy as reached from the destination's real
    /// path (the symlinks in the destination's own path resolved before the copy), name by
    /// name.
    fn real_target(&self, wire: &[u8]) -> Result<String, SftpError> {
        let top_is_root = matches!(self.place, Place::As(_));
        let rest = match (top_is_root, wire.iter().position(|&b| b == b'/')) {
            (false, _) => wire,
            (true, Some(i)) => &wire[i + 1..],
            (true, None) => b"",
        };
        let rest = std::str::from_utf8(rest)
            .map_err(|_| entry_failure("a name that is not UTF-8".into()))?;
        Ok(join(&self.root_real, rest))
    }

    /// The folder `wire` of this copy, if it still resolves to itself from the destination:
    /// no symlink on the way, such as one swapped in during the copy, which would lead the
    /// path-based SFTP requests outside the destination.
    async fn checked_dir(&self, sftp: &Sftp, wire: &[u8]) -> Result<String, SftpError> {
        let path = self.real_target(wire)?;
        unmoved(sftp, &path).await?;
        Ok(path)
    }

    /// Sets the directories' modes (and times, with `-p`) once everything is in them,
    /// deepest first (a folder made unsearchable must not keep its subfolders from being
    /// set), each only where it still resolves to itself ([`Apply::checked_dir`]). The
    /// folders of one depth are set at once, over all the sessions. A folder a rerun found
    /// with the mode and time it is to get is left alone, unless this push added, removed
    /// or renamed something in it ([`Apply::note_change`]): a rerun that changes nothing
    /// sets nothing.
    async fn finish_dirs(&self) {
        let mut dirs = std::mem::take(&mut *lock(&self.dir_meta));
        let depth = |wire: &[u8]| wire.iter().filter(|&&b| b == b'/').count();
        dirs.sort_by_key(|(wire, _, _)| std::cmp::Reverse(depth(wire)));
        let changed_in = std::mem::take(&mut *lock(&self.changed_in));
        let n = self.sftp.len();
        for level in dirs.chunk_by(|(a, _, _), (b, _, _)| depth(a) == depth(b)) {
            let changed_in = &changed_in;
            futures_util::stream::iter(level.iter().enumerate())
                .for_each_concurrent(
                    SESSION_REQUESTS * n,
                    |(i, (wire, meta, found))| async move {
                        // With -p, a folder's sticky bit too (a shared folder), as fastcp's
                        // own receiver keeps it; never setuid or setgid.
                        let bits = if self.preserve { SAFE_MODE_BITS } else { 0o777 };
                        let mut attrs = FileAttributes {
                            permissions: Some(meta.mode & bits),
                            ..FileAttributes::empty()
                        };
                        if self.preserve {
                            set_times(&mut attrs, meta);
                        } else if meta.mode & 0o700 == 0o700 {
                            return;
                        }
                        // A rerun's folder found as it is to be, and nothing in it changed since.
                        if let Some(have) = found
                            && !changed_in.contains(&wire[..])
                            && have.permissions.map(|m| m & 0o7777) == attrs.permissions
                            && (!self.preserve || have.mtime == attrs.mtime)
                        {
                            return;
                        }
                        let sftp = &self.sftp[i % n];
                        let set = match self.checked_dir(sftp, wire).await {
                            Ok(path) => sftp.raw.setstat(path, attrs).await.map(|_| ()),
                            Err(e) => Err(e),
                        };
                        if let Err(e) = set {
                            self.failed(
                                wire,
                                (code(&e), format!("cannot set its attributes: {}", said(&e))),
                            );
                        }
                    },
                )
                .await;
        }
    }

    fn announce(&self, f: FileEntry) -> Arc<PushFile> {
        let target = self.target(&f.path);
        let offer = lock(&self.offered).remove(&f.path);
        let partial = match &target {
            Ok(t) if self.resume && f.size > fastcp_stream::PARTIAL_MIN => partial_path(t),
            _ => None,
        };
        let (kind, temp) = match (partial, &target) {
            (Some(p), _) if offer.is_some() => (TempKind::Offered, p),
            (Some(p), _) => (TempKind::Partial, p),
            (None, Ok(t)) => (TempKind::Random, temp_name(t)),
            (None, Err(_)) => (TempKind::Random, String::new()),
        };
        let file = Arc::new(PushFile {
            id: f.id,
            wire: f.path,
            target,
            temp,
            kind,
            offer,
            size: f.size,
            meta: f.meta,
            created: OnceCell::new(),
            handles: (0..self.sftp.len()).map(|_| OnceCell::new()).collect(),
            written: AtomicU64::new(0),
            sent: AtomicU64::new(0),
            kept: AtomicU64::new(0),
            ended: AtomicBool::new(false),
            settled: AtomicBool::new(false),
            failure: Mutex::new(None),
            slot: Mutex::new(None),
            replaced_mode: Mutex::new(None),
        });
        self.files.insert(f.id, file.clone());
        file
    }

    /// Writes one chunk of `file` at `offset` through session `s`, many requests in flight.
    async fn write(
        &self,
        file: &Arc<PushFile>,
        s: usize,
        offset: u64,
        bytes: Bytes,
    ) -> Result<(), Error> {
        self.put(file, s, offset, &bytes).await?;
        file.sent.fetch_add(bytes.len() as u64, Ordering::SeqCst);
        file.written.fetch_add(bytes.len() as u64, Ordering::SeqCst);
        self.settle_if_complete(file).await
    }

    /// A hole of the source: `len` bytes at `offset` that read as zeros. A fresh temp file
    /// only needs the hole's last byte written: what lies before a write reads as zeros
    /// (and most file systems keep it a hole). A partial file offered for `--resume` may
    /// hold other data anywhere (its length is not known here), so zeros are written over
    /// all of the hole.
    async fn hole(
        &self,
        file: &Arc<PushFile>,
        s: usize,
        offset: u64,
        len: u64,
    ) -> Result<(), Error> {
        static ZEROS: [u8; 1 << 20] = [0; 1 << 20];
        let end = offset.saturating_add(len);
        let held = match file.kind {
            TempKind::Offered => end,
            TempKind::Random | TempKind::Partial => offset,
        };
        let mut at = offset;
        while at < held {
            let n = (held - at).min(ZEROS.len() as u64);
            self.put(file, s, at, &ZEROS[..n as usize]).await?;
            at += n;
        }
        if at < end {
            self.put(file, s, end - 1, &[0]).await?;
        }
        file.written.fetch_add(len, Ordering::SeqCst);
        self.settle_if_complete(file).await
    }

    /// Writes `bytes` at `offset` of the file's temp file; a failure fails the file alone,
    /// unless the session is lost.
    async fn put(
        &self,
        file: &Arc<PushFile>,
        s: usize,
        offset: u64,
        bytes: &[u8],
    ) -> Result<(), Error> {
        if lock(&file.failure).is_none() {
            let written = async {
                let handle = file.handle(self, s).await?;
                let sftp = &self.sftp[s];
                let mut pending = FuturesOrdered::new();
                let mut at = 0usize;
                while at < bytes.len() || !pending.is_empty() {
                    while at < bytes.len() && pending.len() < IO_IN_FLIGHT {
                        // Wait for a place only with nothing in flight here: requests not yet
                        // polled are not sent, and must not hold places others wait for.
                        let Some(place) = sftp.place(pending.is_empty()).await else {
                            break;
                        };
                        let end = (at + sftp.io as usize).min(bytes.len());
                        let piece = bytes[at..end].to_vec();
                        let write = sftp.raw.write(handle.clone(), offset + at as u64, piece);
                        pending.push_back(async move { (write.await, place) });
                        at = end;
                    }
                    if let Some((Err(e), _place)) = pending.next().await {
                        if let Some(full) = no_space_left(sftp, file, &e).await {
                            return Err(Failure::Session(full));
                        }
                        return Err(Failure::from(e));
                    }
                }
                Ok::<(), Failure>(())
            };
            match written.await {
                Ok(()) => {}
                Err(Failure::Session(e)) => return Err(e),
                Err(Failure::File(f)) => file.fail(Failure::File(f)),
            }
        }
        Ok(())
    }

    /// Once a file has all its bytes and its end (or failed): its attributes, then its
    /// final name; or its temp file removed.
    async fn settle_if_complete(&self, file: &Arc<PushFile>) -> Result<(), Error> {
        let failed = lock(&file.failure).is_some();
        let complete = file.ended.load(Ordering::SeqCst)
            && file.written.load(Ordering::SeqCst) >= file.size
            && file.created.initialized();
        if !(failed || complete) || file.settled.swap(true, Ordering::SeqCst) {
            return Ok(());
        }
        // Its handles are closed below, whatever happens.
        let _slot = lock(&file.slot).take();
        let sftp = &self.sftp;
        // Its name is settled on a session it was written on (a small file's only one), so
        // that renames are spread as writes are.
        let home = &sftp[file
            .handles
            .iter()
            .position(|h| h.initialized())
            .unwrap_or(0)];
        let mut attrs_set = false;
        let mut outcome: Result<(), (ErrorCode, String)> = Ok(());
        for (s, handle) in file.handles.iter().enumerate() {
            let Some(h) = handle.get() else { continue };
            if !failed && !attrs_set {
                let mut attrs = FileAttributes::empty();
                if file.kind == TempKind::Offered {
                    // What a longer partial file holds beyond the source's end goes.
                    attrs.size = Some(file.size);
                }
                if self.preserve {
                    // Not the sticky bit: a BSD server refuses it on a file (EFTYPE).
                    attrs.permissions = Some(file.meta.mode & 0o777);
                    set_times(&mut attrs, &file.meta);
                } else {
                    attrs.permissions = *lock(&file.replaced_mode);
                }
                let set = if attrs.permissions.is_some() || attrs.size.is_some() {
                    sftp[s].raw.fsetstat(h.clone(), attrs).await.map(|_| ())
                } else {
                    Ok(())
                };
                if let Err(e) = set {
                    if is_session_failure(&e) {
                        return Err(fatal("setting a file's attributes", e));
                    }
                    outcome = Err((code(&e), format!("cannot set its attributes: {}", said(&e))));
                }
                attrs_set = true;
            }
            if self.fsync && sftp[s].fsync && outcome.is_ok() && !failed {
                match sftp[s].raw.fsync(h.clone()).await {
                    Err(e) if is_session_failure(&e) => {
                        return Err(fatal("flushing a file to disk", e));
                    }
                    Err(e) => {
                        outcome = Err((
                            code(&e),
                            format!("flushing it to disk failed: {}", said(&e)),
                        ));
                    }
                    Ok(_) => {}
                }
            }
            if let Err(e) = sftp[s].raw.close(h.clone()).await
                && outcome.is_ok()
                && !failed
            {
                outcome = Err((code(&e), format!("closing it failed: {}", said(&e))));
            }
        }
        if failed || outcome.is_err() {
            // A partial file stays for the next `--resume`.
            if file.created.initialized() && file.kind == TempKind::Random {
                let _ = home.raw.remove(file.temp.clone()).await;
                self.live.take(&file.temp);
            }
            let failure = lock(&file.failure).take();
            if let Some(f) = failure.or(outcome.err()) {
                self.failed(&file.wire, f);
            }
            return Ok(());
        }
        let target = file.target.as_ref().expect("a created file has a target");
        // No longer the sweeper's to remove: without posix-rename the target is removed before
        // the rename, and a push stopped in between must not take the only copy with it.
        if file.kind == TempKind::Random && !self.live.take_for_rename(&file.temp) {
            // The push is stopping, and its guard removes the temp file.
            self.failed(&file.wire, (ErrorCode::Io, STOPPING.into()));
            return Ok(());
        }
        let replaced = self
            .replace_clearing(home, &file.temp, target, &file.wire, "file")
            .await;
        self.live.renamed(&file.temp);
        match replaced {
            Ok(Ok(())) => {
                let mut done = lock(&self.done);
                done.files += 1;
                done.bytes += file.size.saturating_sub(file.kept.load(Ordering::SeqCst));
                self.bytes_sent
                    .fetch_add(file.sent.load(Ordering::SeqCst), Ordering::SeqCst);
                // Every frame of the file has arrived: nothing will look it up again.
                self.files.remove(&file.id);
            }
            failed => {
                if file.kind == TempKind::Random {
                    let _ = home.raw.remove(file.temp.clone()).await;
                }
                if let Err(failure) = failed? {
                    self.failed(&file.wire, failure);
                }
            }
        }
        Ok(())
    }

    async fn symlink(&self, s: usize, l: SymlinkEntry) -> Result<(), Error> {
        let result = async {
            let target = self.target(&l.path)?;
            if !self.parent_ready(&l.path).await {
                return Err((ErrorCode::Io, "its parent could not be made".into()));
            }
            let points_to = utf8(&l.target)?.to_string();
            let sftp = &self.sftp[s];
            // As the receiver does: a rerun leaves a link that already says the same alone
            // (SFTP sets no time on a link).
            if self.skip_unchanged
                && let Ok(have) = sftp.raw.readlink(target.clone()).await
                && have.files.first().is_some_and(|f| f.filename == points_to)
            {
                return Ok(false);
            }
            self.note_change(&l.path);
            let temp = temp_name(&target);
            // A stopped push removes it too (see `TempSweeper`), from the request on.
            if !self.live.add(&temp, s) {
                return Err((ErrorCode::Io, STOPPING.into()));
            }
            // OpenSSH's sftp-server takes the link's target first and its own path second
            // (the reverse of the draft), and so does every server it interoperates with.
            let made = sftp.raw.symlink(points_to, temp.clone()).await;
            // No longer the guard's to remove: the rename comes next, as for a file (see
            // `settle_if_complete`).
            if !self.live.take_for_rename(&temp) {
                return Err((ErrorCode::Io, STOPPING.into()));
            }
            if let Err(e) = made {
                self.live.renamed(&temp);
                return Err((code(&e), format!("cannot make the link: {}", said(&e))));
            }
            let replaced = self
                .replace_clearing(sftp, &temp, &target, &l.path, "symbolic link")
                .await;
            self.live.renamed(&temp);
            let failure = match replaced {
                Ok(Ok(())) => return Ok(true),
                Ok(Err(failure)) => failure,
                Err(e) => (ErrorCode::Io, e.to_string()),
            };
            let _ = sftp.raw.remove(temp).await;
            Err(failure)
        }
        .await;
        match result {
            Ok(true) => lock(&self.done).symlinks += 1,
            Ok(false) => {}
            Err(f) => self.failed(&l.path, f),
        }
        Ok(())
    }

    /// The quick check over SFTP, as the answer to probe `p`: "send" unless the remote has
    /// a regular file of its size and modification second. A file skipped whose mode is not
    /// the source's gets it (with `-p`, which the quick check implies) once the sender is
    /// done, as the receiver's refresh of a skipped file does ([`Apply::refresh_skipped`]).
    async fn quick_check(&self, sftp: &Sftp, p: &Probe) -> (bool, Option<u128>) {
        let Some((_, have)) = self.same_size(sftp, &p.path, p.size).await else {
            return (true, None);
        };
        // A source time SFTP cannot carry was set clamped: the same clamp makes it match.
        if have.mtime != Some(sftp_time(p.mtime)) {
            return (true, None);
        }
        if let (true, Some(mode)) = (self.preserve, p.mode)
            && have.permissions.map(|m| m & 0o7777) != Some(mode & 0o777)
        {
            let mut attrs = FileAttributes::empty();
            attrs.permissions = Some(mode & 0o777);
            lock(&self.refresh_later).insert(p.path.clone(), (attrs, have));
        }
        (false, None)
    }

    /// The remote path of the regular file (not a link) of `size` bytes at `wire`'s target,
    /// and its attributes, if there is one.
    async fn same_size(
        &self,
        sftp: &Sftp,
        wire: &[u8],
        size: u64,
    ) -> Option<(String, FileAttributes)> {
        let target = self.target(wire).ok()?;
        let a = match self.listed(sftp, wire, &target).await {
            Some(found) => found?,
            None => {
                let _place = sftp.place(true).await;
                sftp.raw.lstat(target.clone()).await.ok()?.attrs
            }
        };
        (file_type(&a) == S_IFREG && a.size == Some(size)).then_some((target, a))
    }

    /// What the listing of its folder says is at `target`, the entry `wire`'s remote path:
    /// `Some(None)` nothing, `None` not known. The copy's own folders are listed (one
    /// request for all a folder holds); not the destination it goes into, which may hold
    /// much else.
    async fn listed(
        &self,
        sftp: &Sftp,
        wire: &[u8],
        target: &str,
    ) -> Option<Option<FileAttributes>> {
        let (dir, name) = split_target(target);
        let folder = match wire.contains(&b'/') {
            true => self.listings.of(sftp, dir).await,
            false => None,
        };
        match Folder::seen(folder.as_deref(), name) {
            Seen::Listed(a) => Some(Some(a.clone())),
            Seen::Absent => Some(None),
            Seen::Unknown => None,
        }
    }

    /// `--checksum`'s answer to probe `p`: "send" unless the remote has a regular file of its
    /// size, and then that file's hash, for the sender to compare (see
    /// [`crate::remote_hash`]). With `-p`, the mode and time such a file is to get if the
    /// sender skips it are noted ([`Apply::refresh_later`]).
    async fn content_hash(&self, sftp: &Sftp, hasher: &Hasher, p: &Probe) -> (bool, Option<u128>) {
        let Some((target, have)) = self.same_size(sftp, &p.path, p.size).await else {
            return (true, None);
        };
        let Some(hash) = hasher.hash(&target, p.size).await else {
            return (true, None);
        };
        if let (true, Some(mode)) = (self.preserve, p.mode) {
            let mut attrs = FileAttributes::empty();
            if have.permissions.map(|m| m & 0o7777) != Some(mode & 0o777) {
                attrs.permissions = Some(mode & 0o777);
            }
            if have.mtime != Some(sftp_time(p.mtime)) {
                set_times(
                    &mut attrs,
                    &Meta {
                        mtime: p.mtime,
                        ..Meta::default()
                    },
                );
            }
            if attrs.permissions.is_some() || attrs.mtime.is_some() {
                lock(&self.refresh_later).insert(p.path.clone(), (attrs, have));
            }
        }
        (false, Some(hash))
    }

    /// Gives the files `--checksum` found the same their source's mode and time (with `-p`),
    /// once the sender is done and they are known to be skipped, each only where it still
    /// resolves to itself (no symlink swapped in since its check) and is the file it was
    /// (a regular file of the size and time the check saw). Best effort, as the receiver's
    /// refresh of a skipped file: the copy goes on.
    async fn refresh_skipped(&self) {
        let skipped = std::mem::take(&mut *lock(&self.refresh_later));
        let n = self.sftp.len();
        let setting =
            skipped
                .into_iter()
                .enumerate()
                .map(|(i, (wire, (attrs, seen)))| async move {
                    let sftp = &self.sftp[i % n];
                    let Ok(path) = self.real_target(&wire) else {
                        return;
                    };
                    if unmoved(sftp, &path).await.is_err() {
                        return;
                    }
                    let same = match sftp.raw.lstat(path.clone()).await {
                        Ok(now) => {
                            file_type(&now.attrs) == S_IFREG
                                && (now.attrs.size, now.attrs.mtime) == (seen.size, seen.mtime)
                        }
                        Err(_) => false,
                    };
                    if same {
                        let _ = sftp.raw.setstat(path, attrs).await;
                    }
                });
        let mut setting = futures_util::stream::iter(setting).buffer_unordered(SESSION_REQUESTS);
        while setting.next().await.is_some() {}
    }

    /// Removes the temp files a stopped push (a cut, kill -9) left in the folder `file` is
    /// written to, once per folder this push did not make: fastcp's temp names (not
    /// `--resume` partial files) last written more than [`STALE_TEMP`] before now by the
    /// remote's clock (the folder's time, as its listing gives it for `.`: `file`'s own temp
    /// file set it a moment ago), and not this push's own. SFTP has no locks to tell a live
    /// copy's temp file by, so age must. Best effort: what cannot be listed or removed stays.
    async fn sweep_beside(&self, file: &PushFile, s: usize) {
        // The folder as the temp file's own path spells it, and the prefix its neighbours'
        // paths take, so that they compare equal to the names this push registered.
        let (prefix, _) = split_target(&file.temp);
        let dir = match prefix {
            "" => ".",
            "/" => "/",
            _ => &prefix[..prefix.len() - 1],
        };
        if !lock(&self.swept).insert(dir.to_string()) {
            return;
        }
        let sftp = &self.sftp[s];
        // A listing holds a handle, as the quick check's do: it takes one of their places.
        let place = sftp.listing_places.acquire().await;
        let listed = list_dir_and_self(sftp, dir).await;
        drop(place);
        let Ok((Some(dot), entries)) = listed else {
            return;
        };
        let Some(now) = dot.mtime else {
            return;
        };
        for (name, attrs) in entries {
            let stale = attrs
                .mtime
                .is_some_and(|t| u64::from(t) + STALE_TEMP.as_secs() < u64::from(now));
            let kind = file_type(&attrs);
            if !(stale
                && (kind == S_IFREG || kind == S_IFLNK)
                && is_single_name(&name)
                && fastcp_stream::is_temp_name(name.as_bytes()))
            {
                continue;
            }
            let path = format!("{prefix}{name}");
            if !self.live.holds(&path) && !lock(&self.temp_like).contains(&path) {
                self.note_change(&file.wire);
                let _ = sftp.raw.remove(path).await;
            }
        }
    }

    /// With `--resume`: removes the partial file an earlier push kept beside `wire`'s target,
    /// whose file the remote holds whole, as fastcp's receiver removes it. SFTP has no locks
    /// to tell another live push's partial file by, so one last written less than
    /// [`STALE_TEMP`] ago (by this machine's clock) stays. Best effort.
    async fn drop_whole_partial(&self, wire: &[u8]) {
        let Some(partial) = self.target(wire).ok().and_then(|t| partial_path(&t)) else {
            return;
        };
        let sftp = &self.sftp[0];
        let Ok(attrs) = sftp.raw.lstat(partial.clone()).await.map(|a| a.attrs) else {
            return;
        };
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let stale = attrs
            .mtime
            .is_some_and(|t| u64::from(t) + STALE_TEMP.as_secs() < now);
        if stale && file_type(&attrs) == S_IFREG {
            let _ = sftp.raw.remove(partial).await;
        }
    }

    /// `--resume`, for a probed file the remote lacks: the XXH3-128 of each whole block of the
    /// partial file a stopped push left beside its target, read back over SFTP (nothing on
    /// the remote can hash it), for the sender to compare with its own blocks; those that
    /// match are not sent again. Reading back costs what sending would have, but over the
    /// other direction of the link, and it checks what actually landed on the remote disk.
    /// `None` when there is no partial file to offer, or it cannot be read.
    async fn partial_offer(&self, p: &Probe) -> Option<Partial> {
        if p.size <= fastcp_stream::PARTIAL_MIN {
            return None;
        }
        let partial = partial_path(&self.target(&p.path).ok()?)?;
        let sftp = &self.sftp[(p.id % self.sftp.len() as u64) as usize];
        let attrs = sftp.raw.lstat(partial.clone()).await.ok()?.attrs;
        if file_type(&attrs) != S_IFREG {
            return None;
        }
        let block = offer_block(p.size);
        let have = attrs.size?.min(p.size);
        // Whole blocks; the last one may end at the file's end, shorter.
        let blocks = match have == p.size {
            true => p.size.div_ceil(block),
            false => have / block,
        };
        let blocks = blocks.min(fastcp_proto::MAX_PARTIAL_HASHES as u64);
        if blocks == 0 {
            return None;
        }
        let _reading = self.partial_reads.acquire().await.ok()?;
        // Every session reads its share of the blocks, in file order.
        let share = blocks.div_ceil(self.sftp.len() as u64);
        let parts = self.sftp.iter().enumerate().map(|(k, sftp)| {
            let first = (k as u64 * share).min(blocks);
            let last = ((k as u64 + 1) * share).min(blocks);
            let partial = partial.clone();
            async move {
                if first == last {
                    return (0, Vec::new());
                }
                let Ok(opened) = sftp
                    .raw
                    .open(partial, OpenFlags::READ, FileAttributes::empty())
                    .await
                else {
                    return (last - first, Vec::new());
                };
                let (from, to) = (first * block, (last * block).min(p.size));
                let hashes = read_block_hashes(sftp, &opened.handle, from, to, block).await;
                let _ = sftp.raw.close(opened.handle).await;
                (last - first, hashes)
            }
        });
        // The offer is the blocks from the first on, up to the first share cut short.
        let mut hashes = Vec::new();
        for (wanted, got) in futures_util::future::join_all(parts).await {
            let whole = got.len() as u64 == wanted;
            hashes.extend(got);
            if !whole {
                break;
            }
        }
        (!hashes.is_empty()).then_some(Partial {
            id: p.id,
            block,
            hashes,
        })
    }
}

/// The block a partial file is hashed in when read back over SFTP: 64 KiB, or more for a file
/// too big for [`fastcp_proto::MAX_PARTIAL_HASHES`] of them. Small, because a stopped push
/// leaves holes where its requests were in flight, and a block with a hole travels again
/// whole.
fn offer_block(size: u64) -> u64 {
    const MIN: u64 = 64 << 10;
    let fit = size.div_ceil(fastcp_proto::MAX_PARTIAL_HASHES as u64);
    fit.div_ceil(MIN).max(1) * MIN
}

/// The XXH3-128 of each `block` bytes of the open remote file `handle` from `start` (a whole
/// number of blocks) up to `end` (the last block may end there, shorter), read with several
/// requests in flight: as many as were read before a read failed or came back short.
async fn read_block_hashes(
    sftp: &Sftp,
    handle: &str,
    start: u64,
    end: u64,
    block: u64,
) -> Vec<u128> {
    let mut hashes = Vec::new();
    let mut hasher = twox_hash::XxHash3_128::new();
    let mut pending = FuturesOrdered::new();
    let (mut asked, mut hashed) = (start, start);
    loop {
        while asked < end && pending.len() < IO_IN_FLIGHT {
            let Some(place) = sftp.place(pending.is_empty()).await else {
                break;
            };
            let len = u64::from(sftp.io).min(end - asked);
            let read = sftp.raw.read(handle.to_string(), asked, len as u32);
            pending.push_back(async move { (read.await, len, place) });
            asked += len;
        }
        let Some((Ok(data), len, _place)) = pending.next().await else {
            return hashes;
        };
        if data.data.len() as u64 != len {
            return hashes;
        }
        let mut bytes = &data.data[..];
        while !bytes.is_empty() {
            let n = ((block - hashed % block) as usize).min(bytes.len());
            hasher.write(&bytes[..n]);
            (hashed, bytes) = (hashed + n as u64, &bytes[n..]);
            if hashed.is_multiple_of(block) || hashed == end {
                hashes.push(hasher.finish_128());
                hasher = twox_hash::XxHash3_128::new();
            }
        }
    }
}

/// Whether the open `handle` is still the regular file at `path`, as its offer found it: SFTP
/// opens by path, following a symlink, so one swapped in since the offer is caught here (a
/// swap in the moment between the open and this check is not).
async fn still_the_partial(sftp: &Sftp, handle: &str, path: &str) -> bool {
    let (Ok(open), Ok(named)) = tokio::join!(
        sftp.raw.fstat(handle.to_string()),
        sftp.raw.lstat(path.to_string())
    ) else {
        return false;
    };
    let (open, named) = (open.attrs, named.attrs);
    file_type(&open) == S_IFREG
        && file_type(&named) == S_IFREG
        && open.size == named.size
        && open.mtime == named.mtime
}

/// The partial file beside `target` (`--resume`): `.NAME.fastcp-partial`, as the receiver
/// names it. `None` for a name over 200 bytes: the receiver cuts such names short, so two
/// could share a partial file, and over SFTP no lock keeps two copies apart.
fn partial_path(target: &str) -> Option<String> {
    let (dir, name) = split_target(target);
    if name.len() > 200 {
        return None;
    }
    let partial = fastcp_stream::partial_name(name.as_bytes());
    Some(format!("{dir}{}", String::from_utf8_lossy(&partial)))
}

/// A failure while writing a file: the file's own, or the session's.
enum Failure {
    File((ErrorCode, String)),
    Session(Error),
}

impl Failure {
    /// Opening the temp file for a target failed: said of the target, as scp says it (the
    /// temp file's name is fastcp's own; [`Apply::failed`] names the target).
    fn opening(e: SftpError) -> Failure {
        if is_session_failure(&e) {
            Failure::Session(fatal("creating a file", e))
        } else {
            Failure::File((code(&e), format!("cannot create it: {}", said(&e))))
        }
    }
}

impl From<SftpError> for Failure {
    fn from(e: SftpError) -> Failure {
        if is_session_failure(&e) {
            Failure::Session(fatal("writing a file", e))
        } else {
            Failure::File((code(&e), format!("cannot write it: {}", said(&e))))
        }
    }
}

impl PushFile {
    /// This file's handle on session `s`: the first one creates the temp file, exclusively
    /// (never through something already there), once its directory is made.
    async fn handle(&self, apply: &Apply, s: usize) -> Result<String, Failure> {
        // A target that cannot be named fails the file before anything is made.
        self.target.clone().map_err(Failure::File)?;
        let sftp = &apply.sftp[s];
        let handle = self.handles[s]
            .get_or_try_init(|| async {
                let mut mine = None;
                self.created
                    .get_or_try_init(|| async {
                        if !apply.parent_ready(&self.wire).await {
                            return Err(Failure::File((
                                ErrorCode::Io,
                                "its parent could not be made".into(),
                            )));
                        }
                        // As scp: the remote umask applies to a new file's mode.
                        let attrs = FileAttributes {
                            permissions: Some(self.meta.mode & 0o777),
                            ..FileAttributes::empty()
                        };
                        let mut flags = OpenFlags::CREATE | OpenFlags::EXCLUDE | OpenFlags::WRITE;
                        match self.kind {
                            TempKind::Random => {}
                            // A partial file that was not offered is not worth keeping.
                            TempKind::Partial => {
                                let _ = sftp.raw.remove(self.temp.clone()).await;
                            }
                            // Offered, so checked as a regular file a moment ago.
                            TempKind::Offered => flags = OpenFlags::WRITE,
                        }
                        // Known before it exists: a push dropped while the open is on its way
                        // still removes it, on this session, so after the open.
                        if self.kind == TempKind::Random && !apply.live.add(&self.temp, s) {
                            return Err(Failure::File((ErrorCode::Io, STOPPING.into())));
                        }
                        // Without -p, the mode of what it replaces is kept: looked up beside
                        // the open, in its folder's listing (one request a folder; none for a
                        // folder this push made).
                        let replaced = async {
                            let (Ok(target), false) = (&self.target, apply.preserve) else {
                                return None;
                            };
                            match apply.listed(sftp, &self.wire, target).await {
                                Some(found) => found,
                                None => sftp.raw.lstat(target.clone()).await.ok().map(|a| a.attrs),
                            }
                        };
                        let (opened, replaced) =
                            tokio::join!(sftp.raw.open(self.temp.clone(), flags, attrs), replaced);
                        *lock(&self.replaced_mode) = replaced
                            .filter(|a| file_type(a) == S_IFREG)
                            .and_then(|a| a.permissions)
                            .map(|mode| mode & 0o777);
                        let h = match opened {
                            Ok(h) => h,
                            Err(e) => {
                                apply.live.take(&self.temp);
                                return Err(Failure::opening(e));
                            }
                        };
                        if self.kind == TempKind::Offered
                            && !still_the_partial(sftp, &h.handle, &self.temp).await
                        {
                            let _ = sftp.raw.close(h.handle).await;
                            return Err(Failure::File((
                                ErrorCode::UnsafePath,
                                format!("{} changed since it was offered", self.temp),
                            )));
                        }
                        mine = Some(h.handle);
                        Ok(())
                    })
                    .await?;
                match mine {
                    Some(h) => Ok::<String, Failure>(h),
                    None => {
                        let h = sftp
                            .raw
                            .open(self.temp.clone(), OpenFlags::WRITE, FileAttributes::empty())
                            .await
                            .map_err(Failure::opening)?;
                        Ok(h.handle)
                    }
                }
            })
            .await?;
        Ok(handle.clone())
    }

    /// Records this file's first failure; its temp file goes once nothing writes to it.
    fn fail(&self, failure: Failure) {
        match failure {
            Failure::File(f) => {
                lock(&self.failure).get_or_insert(f);
            }
            Failure::Session(e) => {
                lock(&self.failure).get_or_insert((ErrorCode::Io, e.to_string()));
            }
        }
    }
}

fn set_times(attrs: &mut FileAttributes, meta: &Meta) {
    attrs.mtime = Some(sftp_time(meta.mtime));
    attrs.atime = Some(sftp_time(meta.atime.map_or(meta.mtime, |(s, _)| s)));
}

/// A time as SFTP version 3 carries it: whole seconds from 1970 to 2106, an earlier or later
/// one clamped to the nearest end (scp's SFTP mode wraps it around instead).
fn sftp_time(t: i64) -> u32 {
    t.clamp(0, i64::from(u32::MAX)) as u32
}

/// A remote path split after its last `/`: the folder's prefix (`""` for none, `/` kept)
/// and the name.
fn split_target(target: &str) -> (&str, &str) {
    match target.rfind('/') {
        Some(i) => (&target[..=i], &target[i + 1..]),
        None => ("", target),
    }
}

/// A hidden temp name beside `target`, as the receiver makes them (so that
/// [`fastcp_stream::is_temp_name`] knows it: `--delete` leaves it, a later copy's sweep may
/// take it once stale).
fn temp_name(target: &str) -> String {
    let (dir, name) = split_target(target);
    let tag = u32::from_le_bytes(crate::session::random32()[..4].try_into().expect("4 bytes"));
    let mut cut = name.len().min(100);
    while !name.is_char_boundary(cut) {
        cut -= 1;
    }
    format!("{dir}.{}.fastcp-{tag:08x}", &name[..cut])
}

// ---------------------------------------------------------------------------------------
// Pull: the remote tree read over SFTP, as frames for the local receiver.

/// One stream to the local receiver and what was sent on it, for its `Done`.
struct Out {
    write: PipeWriter,
    counts: Summary,
}

impl Out {
    /// Encodes `frame` into the pipe.
    async fn frame(&mut self, frame: &Frame) -> Result<(), Error> {
        let mut buf = BytesMut::new();
        fastcp_proto::encode(frame, &mut buf);
        self.parts([buf.freeze()]).await
    }

    /// Writes `parts` into the pipe and sends them on at once (the receiver may be waiting
    /// for them: a probe's answer holds up the reads): a part of 16 KiB or more travels as
    /// this very buffer, smaller ones are gathered into one.
    async fn parts<const N: usize>(&mut self, parts: [Bytes; N]) -> Result<(), Error> {
        let closed =
            |e: std::io::Error| Error::ConnectionClosed(format!("the local receiver stopped: {e}"));
        for mut part in parts {
            self.write.write_part(&mut part).await.map_err(closed)?;
        }
        self.write.flush().await.map_err(closed)
    }

    /// Ends the pipe.
    async fn end(&mut self) {
        let _ = WriteFrom::shutdown(&mut self.write).await;
    }
}

/// A read job: a whole small file, or one range of a big one.
struct Job {
    id: u64,
    wire: Bytes,
    remote: String,
    size: u64,
    mtime: Option<u32>,
    meta: Meta,
    range: (u64, u64),
    /// For a big file: what its ranges share.
    shared: Option<Arc<Mutex<BigFile>>>,
    /// `--resume`: the blocks the receiver's partial file holds of this very version of the
    /// file, kept rather than read.
    kept: Option<Arc<Partial>>,
}

impl Job {
    /// The job's range in order, as runs to read and blocks the receiver keeps (`true`),
    /// one block a run.
    fn runs(&self) -> Vec<(u64, u64, bool)> {
        let (start, end) = self.range;
        let Some(offer) = &self.kept else {
            return vec![(start, end, false)];
        };
        let block = offer.block.max(1);
        let mut runs: Vec<(u64, u64, bool)> = Vec::new();
        let mut at = start;
        while at < end {
            let next = (at / block + 1).saturating_mul(block).min(end);
            let whole = at.is_multiple_of(block) && next - at == block.min(self.size - at);
            let held = offer
                .hashes
                .get((at / block) as usize)
                .is_some_and(|&h| h != fastcp_proto::NOT_HELD);
            let kept = whole && held;
            match runs.last_mut() {
                Some((_, e, false)) if !kept => *e = next,
                _ => runs.push((at, next, kept)),
            }
            at = next;
        }
        runs
    }
}

/// What the ranges of a big file, read on any session, share.
struct BigFile {
    /// Fed by every range.
    checksum: FileChecksum,
    /// Bytes still to come.
    left: u64,
    /// A range failed, and said so: the file is reported once, and the ranges not yet read
    /// are not.
    failed: bool,
}

/// The reads of a file whose partial file the receiver holds blocks of (`offer`): the
/// ranges moved to end on a block's edge, so that no read splits a block, each with the
/// offer.
fn keeping(reads: Vec<Job>, offer: Arc<Partial>) -> Vec<Job> {
    let block = offer.block.max(1);
    let mut start = 0;
    let mut out = Vec::with_capacity(reads.len());
    for mut job in reads {
        let end = job.range.1.next_multiple_of(block).min(job.size);
        if end <= start {
            continue;
        }
        job.range = (start, end);
        job.kept = Some(offer.clone());
        start = end;
        out.push(job);
    }
    out
}

/// The reading side of a pull.
struct Emit {
    sftp: Vec<Arc<Sftp>>,
    outs: Vec<tokio::sync::Mutex<Out>>,
    preserve: bool,
    recursive: bool,
    follow: bool,
    /// What the rules, the `--files-from` list or the predicate leave out is not listed.
    filter: Option<Arc<fastcp_stream::Filter>>,
    /// Ask the local receiver about each file before reading it (`--skip-unchanged`).
    probing: Option<Probing>,
    next_id: AtomicU64,
    /// `--checksum`: hashes the remote's files, to compare with the receiver's answers.
    hasher: Option<Hasher>,
}

/// Folders a pull lists at once, over all its sessions.
const LISTINGS_IN_FLIGHT: usize = 64;

/// Probes in flight at most: what a pull's quick check holds in memory, and what the
/// receiver's answers may fill of their pipe (an answer is a few dozen bytes).
const PROBES_IN_FLIGHT: usize = 4096;

/// What reading one file takes: the `File` frame that announces a big file on stream 0
/// (a small one's reader sends its own), and its jobs.
type Reads = (Option<Frame>, Vec<Job>);

/// A pull's quick check: the lister sends a `Probe` for each file on stream 0 and parks the
/// file's reads here; the receiver's `Answer`s, in the order of the probes, release or drop
/// them. The probes stream ahead of the answers: no round trip per file.
struct Probing {
    /// The reads of each probed file, by probe id.
    parked: Mutex<HashMap<u64, Reads>>,
    /// Places for probes in flight.
    window: Semaphore,
    /// Probes sent so far.
    sent: AtomicU64,
    /// How many probes the listing sent in all, once it is over.
    listed: SetOnce<u64>,
    /// `--checksum`: the remote hashes of big files, asked for with their probes, so that
    /// both sides hash at once (see [`HASH_AHEAD`]), by probe id.
    hashing: Mutex<HashMap<u64, crate::remote_hash::Pending>>,
    /// The pull's destination, as typed.
    dest: std::path::PathBuf,
}

impl Probing {
    /// Whether the destination seems to hold a regular file of `size` bytes for wire path
    /// `wire`: a guess, only to choose what to hash ahead (the receiver, which resolves
    /// every path safely, answers for the copy).
    fn local_has(&self, wire: &[u8], size: u64) -> bool {
        let Ok(wire) = std::str::from_utf8(wire) else {
            return false;
        };
        let path = match self.dest.is_dir() {
            true => self.dest.join(wire),
            // The top level is renamed as the destination.
            false => match wire.split_once('/') {
                Some((_, rest)) => self.dest.join(rest),
                None => self.dest.clone(),
            },
        };
        std::fs::symlink_metadata(path).is_ok_and(|m| m.is_file() && m.len() == size)
    }
}

/// With `--checksum`, a file of this size or more that the destination seems to have
/// ([`Probing::local_has`]) is hashed on the remote as soon as it is probed, while the
/// receiver hashes its own copy; any other only once the receiver answers that it has one
/// of that size.
const HASH_AHEAD: u64 = 16 << 20;

async fn pull(
    plan: &Plan,
    dest: &std::path::Path,
    sftp: Vec<Arc<Sftp>>,
    progress: Arc<Progress>,
    hasher: Option<Hasher>,
) -> Result<Report, Error> {
    let sources = expanded_sources(plan, &sftp[0]).await?;
    let n = sftp.len();
    // Frames go to the receiver through pipes that pass a file's bytes on as the buffers
    // the SFTP replies arrived in; its replies come back through a byte pipe.
    let (writers, theirs): (Vec<_>, Vec<_>) = (0..n)
        .map(|_| fastcp_stream::receiver_pipe(fastcp_stream::LOCAL_PIPE_BUFFER))
        .unzip();
    let outs = writers
        .into_iter()
        .map(|write| {
            tokio::sync::Mutex::new(Out {
                write,
                counts: Summary::default(),
            })
        })
        .collect();
    let (replies, reply_half) = tokio::io::duplex(64 << 10);
    let o = &plan.options;
    // `--resume` asks about each file, as the quick check does, and keeps times to match;
    // `--checksum` asks too, but compares content.
    // `--link-dest` asks too, to link what the reference holds alike.
    let probing = plan.probing();
    let preserve =
        o.preserve || o.skip_unchanged || o.resume || o.link_dest.is_some() || o.skip_rules.any();
    let emit = Arc::new(Emit {
        sftp,
        outs,
        preserve,
        recursive: o.recursive,
        follow: o.follow_links,
        filter: o.filter.clone(),
        probing: probing.then(|| Probing {
            parked: Mutex::new(HashMap::new()),
            window: Semaphore::new(PROBES_IN_FLIGHT),
            sent: AtomicU64::new(0),
            listed: SetOnce::new(),
            hashing: Mutex::new(HashMap::new()),
            dest: dest.to_path_buf(),
        }),
        next_id: AtomicU64::new(1),
        hasher,
    });
    let mut config = fastcp_stream::ReceiveConfig {
        recursive: o.recursive,
        // The quick check compares times: they must be kept.
        preserve,
        target_must_be_dir: plan.target_is_dir(),
        target_may_be_new_dir: plan.new_target_dir(),
        contents: plan.contents(),
        fsync: o.fsync,
        skip_unchanged: probing,
        checksum: o.checksum,
        // What the remote's stock tools can compute (see `crate::remote_hash`).
        content_hash: fastcp_stream::ContentHash::Sha256,
        resume: o.resume,
        // Hashing the remote's blocks would mean reading them: the partial file's record of
        // what arrived from this version of the source stands in.
        resume_from_record: true,
        delete: o.delete,
        max_delete: o.max_delete,
        filter: plan.spared(),
        link_dest: o.link_dest.clone(),
        skip_rules: o.skip_rules,
        // The bytes come from this process's own SFTP reads: hashing them on both sides of
        // the pipe would check the same memory twice. Each file's ranges are still checked.
        hash_content: false,
        ..Default::default()
    };
    config.expected_top_level = plan
        .sources
        .iter()
        .filter_map(Location::remote)
        .map(|r| top_level_name(&r.path))
        .collect();
    // The receiver's replies are read at once, always, so that it never waits on them; its
    // answers to probes go on to the dispatcher.
    let (answers_tx, answers) = tokio::sync::mpsc::unbounded_channel();
    let reading_replies = read_answers(replies, answers_tx);
    let emitting = emit.clone().run(sources, answers);
    let receiving = fastcp_stream::receive_piped(dest, theirs, reply_half, &config, progress);
    let (emitted, received, ()) = tokio::join!(emitting, receiving, reading_replies);
    match (emitted, received) {
        (Err(e), Err(r)) if r.is_disconnect() => Err(e),
        (_, Err(r)) => Err(r.into()),
        (Err(e), Ok(_)) => Err(e),
        (Ok(()), Ok(report)) => Ok(report),
    }
}

/// A probe's answer, with what the receiver's partial file holds (`--resume`): a `Partial`
/// offered from its record, whose blocks not [`NOT_HELD`](fastcp_proto::NOT_HELD) are kept
/// unread.
type Answered = (Answer, Option<Arc<Partial>>);

/// Reads the local receiver's replies to their end (or their first undecodable byte),
/// passing its answers to probes on, each with the `Partial` sent just before it.
async fn read_answers(
    replies: DuplexStream,
    answers: tokio::sync::mpsc::UnboundedSender<Answered>,
) {
    // Answers are small; a `Partial` holds at most 16,384 hashes of 16 bytes.
    let mut replies = crate::wire::FrameReader::new(replies, 1 << 20);
    let mut partial = None;
    while let Ok(frame) = replies.next("reading the receiver's replies").await {
        match frame {
            Frame::Partial(p) => partial = Some(p),
            Frame::Answer(a) => {
                // With `--checksum`, a file the receiver holds at the same size may be sent
                // after all, with the partial file it offered.
                let offer = partial.take().filter(|p| p.id == a.id);
                let _ = answers.send((a, offer.map(Arc::new)));
            }
            _ => {}
        }
    }
}

/// The paths of `plan`'s remote sources, as typed after the colon.
fn remote_sources(plan: &Plan) -> Vec<String> {
    plan.sources
        .iter()
        .filter_map(Location::remote)
        .map(|r| r.path.clone())
        .collect()
}

fn meta_of(a: &FileAttributes, preserve: bool) -> Meta {
    let mode = a.permissions.unwrap_or(0o644) & 0o7777;
    if !preserve {
        return Meta {
            mode,
            ..Meta::default()
        };
    }
    let mtime = i64::from(a.mtime.unwrap_or(0));
    Meta {
        mode,
        mtime,
        mtime_nsec: 0,
        atime: Some((i64::from(a.atime.unwrap_or(0)), 0)),
    }
}

impl Emit {
    async fn send(&self, s: usize, frame: &Frame) -> Result<(), Error> {
        let mut out = self.outs[s].lock().await;
        match frame {
            Frame::Dir(_) => out.counts.dirs += 1,
            Frame::File(_) => out.counts.files += 1,
            Frame::Symlink(_) => out.counts.symlinks += 1,
            Frame::Data(d) => out.counts.bytes += d.bytes.len() as u64,
            Frame::Error(_) => out.counts.errors += 1,
            _ => {}
        }
        out.frame(frame).await
    }

    /// Lists the sources while every session reads files (those the receiver wants, with
    /// probing: see [`Probing`]); then ends each stream with its `Done`.
    async fn run(
        self: Arc<Self>,
        sources: Vec<String>,
        answers: tokio::sync::mpsc::UnboundedReceiver<Answered>,
    ) -> Result<(), Error> {
        let (jobs_tx, jobs_rx) = tokio::sync::mpsc::channel::<Job>(1024);
        let jobs_rx = Arc::new(tokio::sync::Mutex::new(jobs_rx));
        let mut readers = tokio::task::JoinSet::new();
        // The readers queue for jobs in the order they start, and the queue is served in
        // turn: started session by session, the first session's readers would take the
        // first `FILES_IN_FLIGHT` files, and a copy of a few files would run on one session.
        for _ in 0..FILES_IN_FLIGHT {
            for s in 0..self.sftp.len() {
                let this = self.clone();
                let jobs = jobs_rx.clone();
                readers.spawn(async move {
                    loop {
                        let job = jobs.lock().await.recv().await;
                        let Some(job) = job else { return Ok(()) };
                        this.read(s, job).await?;
                    }
                });
            }
        }
        let dispatching = self.dispatch(answers, jobs_tx.clone());
        let listing = async {
            let (listed, dispatched) = tokio::join!(
                async {
                    let listed = self.list(sources, jobs_tx).await;
                    // However the listing ended, the dispatcher hears how many probes to
                    // wait for.
                    if let Some(p) = &self.probing {
                        let _ = p.listed.set(p.sent.load(Ordering::Relaxed));
                    }
                    listed
                },
                dispatching
            );
            listed.and(dispatched)
        };
        let reading = async {
            while let Some(joined) = readers.join_next().await {
                joined.unwrap_or_else(|e| Err(Error::Io(std::io::Error::other(e))))?;
            }
            Ok(())
        };
        // The first failure (a lost session, say) ends it all: a listing may be waiting for
        // readers that are gone.
        if let Err(e) = tokio::try_join!(listing, reading) {
            readers.abort_all();
            // The receiver stops waiting for frames that will not come.
            for out in &self.outs {
                out.lock().await.end().await;
            }
            return Err(e);
        }
        for s in 0..self.outs.len() {
            let mut out = self.outs[s].lock().await;
            let done = Frame::Done(out.counts);
            out.frame(&done).await?;
            out.end().await;
        }
        Ok(())
    }

    /// With probing: hands on the reads of each file the receiver answers "send" for, until
    /// every probe of the listing is answered (or the receiver is gone). Holds a job sender
    /// until then, so the readers wait for it.
    async fn dispatch(
        &self,
        mut answers: tokio::sync::mpsc::UnboundedReceiver<Answered>,
        jobs: tokio::sync::mpsc::Sender<Job>,
    ) -> Result<(), Error> {
        let Some(probing) = &self.probing else {
            return Ok(());
        };
        let mut answered = 0;
        // `--checksum`: files the receiver has with their size, while the remote hashes its
        // own copy; each keeps its place in the window until then.
        let mut comparing = FuturesUnordered::new();
        loop {
            let all = probing.listed.get().is_some_and(|&sent| answered >= sent);
            if all && comparing.is_empty() {
                return Ok(());
            }
            let (answer, offer) = tokio::select! {
                a = answers.recv(), if !all => match a {
                    Some(a) => a,
                    // The receiver stopped: its error is the copy's. The listing, waiting
                    // for a place in the window, stops too, and the hashes asked ahead are
                    // dropped.
                    None => {
                        probing.window.close();
                        lock(&probing.hashing).clear();
                        return Ok(());
                    }
                },
                _ = probing.listed.wait(), if probing.listed.get().is_none() => continue,
                Some((reads, differs, offer)) = comparing.next() => {
                    probing.window.add_permits(1);
                    if differs {
                        self.release(reads, offer, &jobs).await?;
                    }
                    continue;
                }
            };
            answered += 1;
            let parked = lock(&probing.parked).remove(&answer.id);
            // Dropped unless compared: a hash not yet begun is then not made.
            let pending = lock(&probing.hashing).remove(&answer.id);
            match (parked, answer.send, &self.hasher, answer.hash) {
                (Some(reads), true, _, _) => {
                    probing.window.add_permits(1);
                    self.release(reads, offer, &jobs).await?;
                }
                (Some(reads), false, Some(hasher), Some(theirs)) => {
                    let hasher = hasher.clone();
                    comparing.push(async move {
                        let (remote, size) = match reads.1.first() {
                            Some(job) => (job.remote.clone(), job.size),
                            None => return (reads, true, offer),
                        };
                        let ours = match pending {
                            Some(pending) => pending.wait().await,
                            None => hasher.hash(&remote, size).await,
                        };
                        // Sent after all, it keeps what its partial file holds.
                        (reads, ours != Some(theirs), offer)
                    });
                }
                _ => probing.window.add_permits(1),
            }
        }
    }

    /// Hands on the reads of a file the receiver wants: the frame that announces it, if any,
    /// then its jobs, those of the blocks `offer` says the receiver holds kept.
    async fn release(
        &self,
        (announce, mut reads): Reads,
        offer: Option<Arc<Partial>>,
        jobs: &tokio::sync::mpsc::Sender<Job>,
    ) -> Result<(), Error> {
        // A record is only as good as the time it is tagged with: a server that gives no
        // times gives nothing to trust.
        if let Some(offer) = offer
            && reads.iter().all(|job| job.mtime.is_some())
        {
            reads = keeping(reads, offer);
        }
        if let Some(frame) = announce {
            self.send(0, &frame).await?;
        }
        for job in reads {
            send_job(jobs, job).await?;
        }
        Ok(())
    }

    /// Walks the sources, many folders listed at once over the sessions: directories and
    /// links as frames on stream 0 (a folder's before anything in it), files as read jobs
    /// (parked behind a probe, with probing).
    async fn list(
        &self,
        sources: Vec<String>,
        jobs: tokio::sync::mpsc::Sender<Job>,
    ) -> Result<(), Error> {
        let sftp = &self.sftp[0];
        let mut totals = Totals::default();
        // (remote path, wire path, attributes), to visit.
        let mut stack: Vec<(String, Bytes, FileAttributes)> = Vec::new();
        // (wire name, remote path) of each source found, to name what is beneath it.
        let mut tops: Vec<(Bytes, String)> = Vec::new();
        // A source with a wildcard that names nothing as it is stands for its matches, as
        // scp expands it, in order; one that matches nothing fails as a missing file would.
        let mut typed_sources = Vec::with_capacity(sources.len());
        for typed in &sources {
            match self.expand(typed).await? {
                Some(expansion) => {
                    typed_sources.extend(expansion.matches);
                    // Names SFTP cannot carry fail one by one, as in a folder's listing.
                    for (shown, wire) in expansion.uncarried {
                        let frame = error_frame(ErrorCode::UnsafePath, &wire, &shown, UNCARRIED);
                        self.send(0, &frame).await?;
                    }
                }
                None => typed_sources.push(typed.clone()),
            }
        }
        for typed in typed_sources.iter().rev() {
            let remote = remote_path(typed);
            // A folder's contents (`DIR/.`) travel under the folder's name; a path that
            // names its folder by no name of its own (`.`, `./`, `~`, the empty path of
            // `host:`) under the name the server resolves it to, as from a fastcp server.
            let name = match top_level_name(typed.strip_suffix("/.").unwrap_or(typed)) {
                None => match real_path(sftp, &remote).await {
                    Ok(real) => top_level_name(&real),
                    Err(e) if is_session_failure(&e) => {
                        return Err(fatal("resolving a source", e));
                    }
                    Err(e) => {
                        let frame = error_frame(code(&e), typed.as_bytes(), &remote, said(&e));
                        self.send(0, &frame).await?;
                        continue;
                    }
                },
                name => name,
            }
            .map(Bytes::from);
            // A source named at the top is followed, as scp does; a dangling link is copied
            // as the link it is.
            let stat = match sftp.raw.stat(remote.clone()).await {
                Err(e) if code(&e) == ErrorCode::NotFound => {
                    match sftp.raw.lstat(remote.clone()).await {
                        Ok(a) if file_type(&a.attrs) == S_IFLNK => Ok(a),
                        _ => Err(e),
                    }
                }
                other => other,
            };
            match (name, stat) {
                (Some(name), Ok(a)) => {
                    tops.push((name.clone(), remote.trim_end_matches("/.").to_string()));
                    stack.push((remote, name, a.attrs));
                }
                (None, _) => {
                    return Err(Error::Usage(format!(
                        "{}: the root folder has no name to copy it under: name a folder \
                         in it",
                        crate::stream::escape(typed.as_bytes())
                    )));
                }
                (Some(name), Err(e)) => {
                    if is_session_failure(&e) {
                        return Err(fatal("reading a source", e));
                    }
                    self.send(0, &error_frame(code(&e), &name, &remote, said(&e)))
                        .await?;
                }
            }
        }
        // Folders to list, and listings in flight: several at once, spread over the sessions,
        // since each is a few round trips. A folder's `Dir` frame goes out before its
        // listing is asked for, so its entries always come after it.
        let mut to_list: std::collections::VecDeque<(String, Bytes)> = Default::default();
        // With a `--files-from` list: the paths it lists that no listing has shown yet; those
        // left at the end fail as not found, as the walk of a fastcp sender reports them.
        let mut unfound = self.filter.as_deref().and_then(fastcp_stream::Unfound::of);
        let mut listing = futures_util::stream::FuturesUnordered::new();
        let mut next_session = 0;
        loop {
            let Some((remote, wire, attrs)) = stack.pop() else {
                while listing.len() < LISTINGS_IN_FLIGHT
                    && let Some((remote, wire)) = to_list.pop_front()
                {
                    let s = next_session % self.sftp.len();
                    next_session += 1;
                    listing.push(async move {
                        let entries = self.read_dir(s, &remote).await;
                        (remote, wire, entries)
                    });
                }
                let Some((remote, wire, entries)) = listing.next().await else {
                    break;
                };
                match entries {
                    Ok(Listing {
                        mut entries,
                        looped,
                    }) => {
                        for name in looped {
                            let mut child = BytesMut::from(&wire[..]);
                            child.extend_from_slice(b"/");
                            child.extend_from_slice(name.as_bytes());
                            if let Some(unfound) = &mut unfound {
                                unfound.came_to(&child);
                            }
                            if self.filter.as_ref().is_none_or(|f| f.allows(&child, false)) {
                                let why = "too many levels of symbolic links";
                                let shown = join(&remote, &name);
                                self.send(0, &error_frame(ErrorCode::Io, &child, &shown, why))
                                    .await?;
                            }
                        }
                        entries.sort_by(|a, b| b.0.cmp(&a.0));
                        // A name SFTP cannot carry (not UTF-8, say: the server's bytes came
                        // as text with the odd ones replaced) fails alone; the rest goes on.
                        // Not as a skipped special file: the receiver must not take the file
                        // for gone and delete its copy (`--delete`).
                        let (entries, unnamed): (Vec<_>, Vec<_>) = entries
                            .into_iter()
                            .partition(|(name, _)| is_single_name(name));
                        for (name, _) in unnamed {
                            let mut child = BytesMut::from(&wire[..]);
                            child.extend_from_slice(b"/");
                            child.extend_from_slice(name.as_bytes());
                            // The name came as text with its odd bytes replaced: the
                            // listed paths it may stand for are not missing.
                            if let Some(unfound) = &mut unfound {
                                let rel = child.splitn(2, |&b| b == b'/').nth(1).unwrap_or(&[]);
                                let rel = String::from_utf8_lossy(rel).into_owned();
                                unfound.retain(|p| {
                                    let p = String::from_utf8_lossy(p);
                                    p != rel && !p.starts_with(&format!("{rel}/"))
                                });
                            }
                            let shown = join(&remote, &name);
                            let frame =
                                error_frame(ErrorCode::UnsafePath, &child, &shown, UNCARRIED);
                            self.send(0, &frame).await?;
                        }
                        for (name, a) in entries {
                            let mut child = BytesMut::from(&wire[..]);
                            child.extend_from_slice(b"/");
                            child.extend_from_slice(name.as_bytes());
                            let is_dir = file_type(&a) == S_IFDIR;
                            let allowed = self
                                .filter
                                .as_ref()
                                .is_none_or(|f| f.allows(&child, is_dir));
                            if let Some(unfound) = &mut unfound {
                                unfound.came_to(&child);
                                if !allowed {
                                    unfound.not_looked_into(&child);
                                }
                            }
                            if !allowed {
                                continue;
                            }
                            stack.push((join(&remote, &name), child.freeze(), a));
                        }
                    }
                    Err(Ok((c, m))) => {
                        // Not listed: what the list names beneath it is not known missing.
                        if let Some(unfound) = &mut unfound {
                            unfound.not_looked_into(&wire);
                        }
                        self.send(0, &error_frame(c, &wire, &remote, m)).await?
                    }
                    Err(Err(e)) => return Err(e),
                }
                continue;
            };
            if file_type(&attrs) == S_IFDIR {
                if !self.recursive {
                    // Not looked into: what the list names beneath it is not known missing.
                    if let Some(unfound) = &mut unfound {
                        unfound.not_looked_into(&wire);
                    }
                    let msg = "is a directory (use -r to copy it)".to_string();
                    self.send(0, &error_frame(ErrorCode::Unsupported, &wire, &remote, msg))
                        .await?;
                    continue;
                }
                let frame = Frame::Dir(DirEntry {
                    path: wire.clone(),
                    meta: meta_of(&attrs, self.preserve),
                });
                self.send(0, &frame).await?;
                to_list.push_back((remote, wire));
            } else if file_type(&attrs) == S_IFLNK {
                match sftp.raw.readlink(remote.clone()).await {
                    Ok(name) if !name.files.is_empty() => {
                        let target = Bytes::from(name.files[0].filename.clone().into_bytes());
                        // The link's own times (the listing's attributes are the link's),
                        // in whole seconds as SFTP has them.
                        let times = match (self.preserve, attrs.mtime) {
                            (true, Some(mtime)) => Some(LinkTimes {
                                mtime: i64::from(mtime),
                                mtime_nsec: 0,
                                atime: i64::from(attrs.atime.unwrap_or(mtime)),
                                atime_nsec: 0,
                            }),
                            _ => None,
                        };
                        let frame = Frame::Symlink(SymlinkEntry {
                            path: wire,
                            target,
                            times,
                        });
                        self.send(0, &frame).await?;
                    }
                    Ok(_) => {}
                    Err(e) if is_session_failure(&e) => return Err(fatal("reading a link", e)),
                    Err(e) => {
                        self.send(0, &error_frame(code(&e), &wire, &remote, said(&e)))
                            .await?
                    }
                }
            } else if file_type(&attrs) == S_IFREG {
                let size = attrs.size.unwrap_or(0);
                totals.files += 1;
                totals.bytes += size;
                let id = self.next_id.fetch_add(1, Ordering::Relaxed);
                let meta = meta_of(&attrs, self.preserve);
                let job = |range, shared| Job {
                    id,
                    wire: wire.clone(),
                    remote: remote.clone(),
                    size,
                    mtime: attrs.mtime,
                    meta,
                    range,
                    shared,
                    kept: None,
                };
                let (announce, reads) = if size <= RANGE {
                    (None, vec![job((0, size), None)])
                } else {
                    // Announced on stream 0 before any of its ranges is read.
                    let frame = Frame::File(FileEntry {
                        id,
                        path: wire.clone(),
                        size,
                        meta,
                    });
                    let shared = Arc::new(Mutex::new(BigFile {
                        checksum: FileChecksum::ranges_only(size),
                        left: size,
                        failed: false,
                    }));
                    let mut reads = Vec::new();
                    let mut at = 0;
                    while at < size {
                        let end = (at + RANGE).min(size);
                        reads.push(job((at, end), Some(shared.clone())));
                        at = end;
                    }
                    (Some(frame), reads)
                };
                if let Some(probing) = &self.probing {
                    // A place for one more probe in flight; the dispatcher gives it back.
                    probing
                        .window
                        .acquire()
                        .await
                        .map_err(|_| Error::ConnectionClosed("the pull stopped".into()))?
                        .forget();
                    if let (Some(hasher), true) = (&self.hasher, size >= HASH_AHEAD)
                        && let Some(job) = reads.first()
                        && probing.local_has(&wire, size)
                    {
                        let pending = hasher.request(&job.remote, size);
                        lock(&probing.hashing).insert(id, pending);
                    }
                    lock(&probing.parked).insert(id, (announce, reads));
                    let probe = Frame::Probe(fastcp_proto::Probe {
                        id,
                        path: wire.clone(),
                        size,
                        mtime: meta.mtime,
                        mtime_nsec: 0,
                        mode: Some(meta.mode),
                    });
                    self.send(0, &probe).await?;
                    probing.sent.fetch_add(1, Ordering::Relaxed);
                    continue;
                }
                if let Some(frame) = announce {
                    self.send(0, &frame).await?;
                }
                for read in reads {
                    send_job(&jobs, read).await?;
                }
            } else {
                let msg = "skipped: not a regular file, directory or link".to_string();
                self.send(0, &error_frame(ErrorCode::Unsupported, &wire, &remote, msg))
                    .await?;
            }
        }
        for listed in unfound
            .into_iter()
            .flat_map(fastcp_stream::Unfound::missing)
        {
            let msg = "listed by --files-from, but not in the source".to_string();
            let shown = shown_in(&tops, &listed);
            self.send(0, &error_frame(ErrorCode::NotFound, &listed, &shown, msg))
                .await?;
        }
        self.send(0, &Frame::Totals(totals)).await?;
        Ok(())
    }

    /// A directory's entries with their attributes, listed on session `s`; each name
    /// checked as a single, ordinary, UTF-8 component (the receiver checks again).
    /// The sources `typed` stands for when its name holds a wildcard and names nothing as it
    /// is: the names in its folder that match, sorted (`None`: take it as it is). The same
    /// rules as a fastcp server's ([`fastcp_stream::expand_sources`]): `*` and `?` match
    /// neither `/` nor a leading `.`, and a backslash quotes the character after it. A name
    /// SFTP cannot carry (not UTF-8: it came with each odd byte replaced by U+FFFD, which
    /// `?` and `*` match as they would match the byte) that matches is not a source, but a
    /// failure to report.
    async fn expand(&self, typed: &str) -> Result<Option<Expansion>, Error> {
        // A backslash quotes the character after it, as in a fastcp server's patterns.
        let Some(pattern) = top_level_name(typed).filter(|n| fastcp_stream::is_pattern(n)) else {
            return Ok(None);
        };
        let sftp = &self.sftp[0];
        match sftp.raw.lstat(remote_path(typed)).await {
            Err(e) if code(&e) == ErrorCode::NotFound => {}
            Err(e) if is_session_failure(&e) => return Err(fatal("reading a source", e)),
            _ => return Ok(None),
        }
        let folder = typed.trim_end_matches('/');
        let folder = &folder[..folder.len() - pattern.len()];
        let listed = match list_dir(
            sftp,
            &remote_path(if folder.is_empty() { "." } else { folder }),
        )
        .await
        {
            Ok(listed) => listed,
            Err(e) if is_session_failure(&e) => return Err(fatal("listing a folder", e)),
            Err(_) => return Ok(None),
        };
        let (mut names, mut uncarried): (Vec<String>, Vec<String>) = listed
            .into_iter()
            .map(|(name, _)| name)
            .filter(|n| fastcp_stream::name_matches(&pattern, n.as_bytes()))
            .partition(|n| is_single_name(n));
        if names.is_empty() && uncarried.is_empty() {
            return Ok(None);
        }
        names.sort();
        uncarried.sort();
        Ok(Some(Expansion {
            matches: names.into_iter().map(|n| format!("{folder}{n}")).collect(),
            uncarried: uncarried
                .into_iter()
                .map(|n| (format!("{folder}{n}"), Bytes::from(n)))
                .collect(),
        }))
    }

    /// The entries of the remote folder `remote`, listed on session `s`; with `-L`, links
    /// stand for what they point to, and the names of those that loop come apart (a link
    /// that cannot be followed, to nothing, stays a link).
    async fn read_dir(
        &self,
        s: usize,
        remote: &str,
    ) -> Result<Listing, Result<(ErrorCode, String), Error>> {
        let sftp = &self.sftp[s];
        let to_failure = |e: SftpError| {
            if is_session_failure(&e) {
                Err(fatal("listing a directory", e))
            } else if code(&e) == ErrorCode::NotFound {
                // Seen as a folder, then gone before it was listed: a source that changed.
                let why = "folder vanished before it could be listed; its contents were not copied";
                Ok((ErrorCode::SourceChanged, why.into()))
            } else {
                Ok((code(&e), format!("cannot list it: {}", said(&e))))
            }
        };
        let mut entries = list_dir(sftp, remote).await.map_err(to_failure)?;
        let mut looped = Vec::new();
        if self.follow {
            for (name, attrs) in &mut entries {
                if file_type(attrs) == S_IFLNK {
                    let path = join(remote, name);
                    match sftp.raw.stat(path.clone()).await {
                        Ok(a) => *attrs = a.attrs,
                        Err(e) if is_session_failure(&e) => return Err(to_failure(e)),
                        // sftp-server says a loop is a missing file, as it says of ELOOP.
                        Err(e) if code(&e) == ErrorCode::NotFound => {
                            if link_loops(sftp, &path).await.map_err(to_failure)? {
                                looped.push(std::mem::take(name));
                            }
                        }
                        Err(_) => {}
                    }
                }
            }
            entries.retain(|(name, _)| !name.is_empty());
        }
        Ok(Listing { entries, looped })
    }

    /// Reads one job on session `s` and sends it on stream `s`: `File` first for a small
    /// file, its `Data` frames, then `FileEnd` from whichever range completes the file.
    async fn read(&self, s: usize, job: Job) -> Result<(), Error> {
        let whole = job.shared.is_none();
        if whole {
            let frame = Frame::File(FileEntry {
                id: job.id,
                path: job.wire.clone(),
                size: job.size,
                meta: job.meta,
            });
            self.send(s, &frame).await?;
        }
        if job.shared.as_ref().is_some_and(|big| lock(big).failed) {
            return Ok(());
        }
        let mut own = FileChecksum::ranges_only(job.size);
        let mut completed = false;
        match self.read_range(s, &job, &mut own, &mut completed).await {
            Ok(()) => {}
            Err(Ok((c, m))) => {
                // One failure a file, whichever of its ranges finds it first. A big file's
                // goes on stream 0, behind its `File` entry: the receiver drops a file only
                // once it has it, and this range may have sent nothing yet.
                let (first, stream) = match &job.shared {
                    None => (true, s),
                    Some(big) => (!std::mem::replace(&mut lock(big).failed, true), 0),
                };
                if first {
                    self.send(stream, &error_frame(c, &job.wire, &job.remote, m))
                        .await?;
                }
                return Ok(());
            }
            Err(Err(e)) => return Err(e),
        }
        let hash = match &job.shared {
            None => own.finish(),
            // Only the range whose bytes completed the file sends its end.
            Some(shared) if completed => lock(shared).checksum.finish(),
            Some(_) => return Ok(()),
        };
        if let Some(hash) = hash {
            self.send(s, &Frame::FileEnd(FileEnd { id: job.id, hash }))
                .await?;
        } else if whole {
            let m = "its content did not add up to its size".to_string();
            return self
                .send(
                    s,
                    &error_frame(ErrorCode::Integrity, &job.wire, &job.remote, m),
                )
                .await;
        }
        Ok(())
    }

    async fn read_range(
        &self,
        s: usize,
        job: &Job,
        own: &mut FileChecksum,
        completed: &mut bool,
    ) -> Result<(), Result<(ErrorCode, String), Error>> {
        let sftp = &self.sftp[s];
        let handle = sftp
            .raw
            .open(job.remote.clone(), OpenFlags::READ, FileAttributes::empty())
            .await
            .map_err(|e| {
                if code(&e) == ErrorCode::NotFound {
                    // Listed, then gone before it was opened: a source that changed.
                    let why = "file vanished before it could be read; not copied";
                    Ok((ErrorCode::SourceChanged, why.into()))
                } else {
                    read_failure(e)
                }
            })?
            .handle;
        let result = async {
            let (start, end) = job.range;
            if start == 0 && end == job.size && job.size <= u64::from(sftp.io) {
                return self.read_small(s, job, own, &handle).await;
            }
            for (at, end, kept) in job.runs() {
                *completed |= if kept {
                    self.keep(s, job, own, at, end - at).await.map_err(Err)?
                } else {
                    self.read_bytes(s, job, own, &handle, at, end).await?
                };
            }
            // A file rewritten while it was read shows a new time or size, and one that grew
            // has bytes past its end: never keep either.
            let last = end == job.size;
            let (stat, past_end) = tokio::join!(sftp.raw.fstat(handle.clone()), async {
                if last {
                    sftp.raw.read(handle.clone(), end, 1).await.ok()
                } else {
                    None
                }
            });
            let changed =
                stat.is_ok_and(|a| a.attrs.size != Some(job.size) || a.attrs.mtime != job.mtime);
            if changed || past_end.is_some_and(|d| !d.data.is_empty()) {
                return Err(Ok((
                    ErrorCode::SourceChanged,
                    "the file changed while being read".into(),
                )));
            }
            Ok(())
        }
        .await;
        // Closed in the background: nothing waits on the answer.
        let closing = self.sftp[s].clone();
        tokio::spawn(async move { closing.raw.close(handle).await });
        result
    }

    /// Reads bytes `at..end` of `job`'s file, open as `handle` on session `s`, with requests
    /// in flight, and sends them on; true when they complete the file.
    async fn read_bytes(
        &self,
        s: usize,
        job: &Job,
        own: &mut FileChecksum,
        handle: &str,
        mut at: u64,
        end: u64,
    ) -> Result<bool, Result<(ErrorCode, String), Error>> {
        let sftp = &self.sftp[s];
        let mut completed = false;
        while at < end {
            // Requests in flight from `at`; a short answer restarts from where it ended.
            let mut pending = FuturesOrdered::new();
            let mut asked = at;
            loop {
                while asked < end && pending.len() < IO_IN_FLIGHT {
                    // Wait for a place only with nothing in flight here: requests not yet
                    // polled are not sent, and must not hold places others wait for.
                    let Some(place) = sftp.place(pending.is_empty()).await else {
                        break;
                    };
                    let len = (end - asked).min(u64::from(sftp.io)) as u32;
                    let read = sftp.raw.read(handle, asked, len);
                    pending.push_back(async move { (read.await, place) });
                    asked += u64::from(len);
                }
                let Some((r, _place)) = pending.next().await else {
                    break;
                };
                let mut data = match r {
                    Ok(d) => d.data,
                    Err(SftpError::Status(st)) if st.status_code == StatusCode::Eof => {
                        return Err(Ok((
                            ErrorCode::SourceChanged,
                            "the file shrank while it was read".into(),
                        )));
                    }
                    Err(e) => return Err(read_failure(e)),
                };
                let wanted = (end - at).min(u64::from(sftp.io));
                let got = data.len() as u64;
                if got == 0 {
                    return Err(Ok((
                        ErrorCode::SourceChanged,
                        "the file shrank while it was read".into(),
                    )));
                }
                // Never more than asked for, whatever the server sends.
                data.truncate(wanted as usize);
                let offset = at;
                at += got.min(wanted);
                completed |= self
                    .data(s, job, own, offset, Bytes::from(data))
                    .await
                    .map_err(Err)?;
                if got < wanted {
                    break;
                }
            }
        }
        Ok(completed)
    }

    /// A file that fits in one request: its bytes, one read past its end and its attributes,
    /// asked at once (`sftp-server` answers in order, so the checks see the file as it was
    /// after the read).
    async fn read_small(
        &self,
        s: usize,
        job: &Job,
        own: &mut FileChecksum,
        handle: &str,
    ) -> Result<(), Result<(ErrorCode, String), Error>> {
        let sftp = &self.sftp[s];
        let (data, past_end, stat) = futures_util::future::join3(
            sftp.raw.read(handle, 0, job.size.max(1) as u32),
            sftp.raw.read(handle, job.size, 1),
            sftp.raw.fstat(handle),
        )
        .await;
        let mut data = match data {
            Ok(d) => d.data,
            Err(SftpError::Status(st)) if st.status_code == StatusCode::Eof => Vec::new(),
            Err(e) if is_session_failure(&e) => return Err(Err(fatal("reading a file", e))),
            Err(e) => return Err(Ok((code(&e), format!("cannot read it: {}", said(&e))))),
        };
        let grew = past_end.is_ok_and(|d| !d.data.is_empty());
        let changed =
            stat.is_ok_and(|a| a.attrs.size != Some(job.size) || a.attrs.mtime != job.mtime);
        if grew || changed || (data.len() as u64) < job.size {
            return Err(Ok((
                ErrorCode::SourceChanged,
                "the file changed while being read".into(),
            )));
        }
        data.truncate(job.size as usize);
        if !data.is_empty() {
            self.data(s, job, own, 0, Bytes::from(data))
                .await
                .map_err(Err)?;
        }
        Ok(())
    }

    /// A block the receiver's partial file holds: a `Keep` in place of its bytes, counted as
    /// the receiver counts it. True when it completes the file.
    async fn keep(
        &self,
        s: usize,
        job: &Job,
        own: &mut FileChecksum,
        offset: u64,
        len: u64,
    ) -> Result<bool, Error> {
        let completed = account(job, own, len, |c| c.keep(offset, len, 1));
        let keep = Frame::Keep(Keep {
            id: job.id,
            offset,
            len,
        });
        self.send(s, &keep).await?;
        Ok(completed)
    }

    async fn data(
        &self,
        s: usize,
        job: &Job,
        own: &mut FileChecksum,
        offset: u64,
        bytes: Bytes,
    ) -> Result<bool, Error> {
        let len = bytes.len() as u64;
        let completed = account(job, own, len, |c| c.add(offset, &bytes));
        // The header, then the payload as it came: no copy into a frame buffer.
        let mut header = BytesMut::with_capacity(fastcp_proto::HEADER_LEN + 16);
        fastcp_proto::encode_data_header(job.id, offset, bytes.len(), &mut header);
        let mut out = self.outs[s].lock().await;
        out.counts.bytes += bytes.len() as u64;
        out.parts([header.freeze(), bytes]).await?;
        Ok(completed)
    }
}

/// Counts `len` bytes of `job`'s file into its checksum with `add`; true when they complete
/// the file.
fn account(
    job: &Job,
    own: &mut FileChecksum,
    len: u64,
    add: impl FnOnce(&mut FileChecksum),
) -> bool {
    match &job.shared {
        None => {
            add(own);
            false
        }
        Some(shared) => {
            let mut big = lock(shared);
            add(&mut big.checksum);
            big.left -= len;
            big.left == 0
        }
    }
}

/// A failed read: the file's own failure, or the copy's when the session is gone.
fn read_failure(e: SftpError) -> Result<(ErrorCode, String), Error> {
    if is_session_failure(&e) {
        Err(fatal("reading a file", e))
    } else {
        Ok((code(&e), format!("cannot read it: {}", said(&e))))
    }
}

async fn send_job(jobs: &tokio::sync::mpsc::Sender<Job>, job: Job) -> Result<(), Error> {
    jobs.send(job)
        .await
        .map_err(|_| Error::ConnectionClosed("the SFTP readers stopped".into()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `--timeout 1.9` waits 2 s for an SFTP answer, not 1 s: russh-sftp counts whole
    /// seconds, and a limit is rounded up to them.
    #[test]
    fn a_limit_in_whole_seconds_is_never_shorter_than_asked() {
        assert_eq!(whole_secs(Duration::from_millis(1900)), 2);
        assert_eq!(whole_secs(Duration::from_millis(1)), 1);
        assert_eq!(whole_secs(Duration::from_secs(3)), 3);
    }
}
