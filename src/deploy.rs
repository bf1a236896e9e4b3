//! Self-deploy: running fastcp on a host that does not have it.
//!
//! When `fastcp server` is not found on the remote host, or the one found there speaks a
//! protocol version that cannot serve the copy (too old for an option it asks for, or with
//! no version in common: [`Error::PeerTooOld`], a
//! [`HandshakeError::Incompatible`](crate::proto::HandshakeError::Incompatible)), the client
//! uploads a fastcp binary into a per-user cache there,
//! `${XDG_CACHE_HOME:-$HOME/.cache}/fastcp/<version>-<sha256 prefix>/fastcp` (a relative
//! `XDG_CACHE_HOME` is ignored, as the XDG spec says), and runs that one. A later copy finds
//! it and uploads nothing: its first command ([`launcher`]) tries that cached binary (after
//! the same folder checks, and with its hash checked, or the stamp that stands for it), then
//! `fastcp` on the remote PATH, so it costs no extra round trip.
//!
//! - **What goes**: the binary that runs here when it is a fastcp server (the `fastcp`
//!   command, or a program that says so with [`this_binary_serves`]) and it can run there (a
//!   static build always can on its architecture; a glibc build only when the remote glibc is
//!   at least the newest one it was linked against), else the static binary `cargo xtask dist` made for the
//!   remote's architecture (looked for in [`DeployOptions::dist_dir`]), else nothing:
//!   [`deploy`] fails with [`Error::Unsupported`] saying why, and the copy goes over SFTP
//!   (see [`crate::sftp`]). So does an upload that did not land whole (a full disk): its
//!   temporary file is removed. So does a cache folder refused (below), or one that cannot
//!   be entered: nothing is run from it. Other failures are [`Error::Deploy`].
//! - **Checked first**: the remote's `uname -sm` must be Linux on x86_64 or aarch64.
//! - **Safely**: the cache folders are made private (umask 077), and refused when someone
//!   else owns them or others can write to them, or when a folder above them could be
//!   changed by someone else (see [`launcher`]) (a symlink to the cache is judged by the
//!   folder it leads to, and that folder, named without links, is the one used and run from,
//!   so that a link changed after the checks leads nothing astray; a symlink inside the cache,
//!   for its `fastcp` folder or the version's, is refused). The upload goes to a temporary
//!   name, its SHA-256 is checked on the remote against the local file's before it is renamed
//!   into place, and a cached binary whose hash does not match, or that someone else owns or
//!   others may write (or a symlink in its place), is replaced, with a warning, never run.
//! - **No path from the user** reaches the remote shell: the scripts are fixed, POSIX `sh`,
//!   started with `exec sh -c '…'` so that any login shell (bash, dash, csh, fish) hands them
//!   to `sh` unchanged; what they interpolate is the version and a hex hash.
//!
//! ```no_run
//! # async fn demo(peer: &fastcp::transport::AnyTransport) -> Result<(), fastcp::Error> {
//! let deployed = fastcp::deploy::deploy(peer, &fastcp::deploy::DeployOptions::default(), &fastcp::Log::default()).await?;
//! println!("remote fastcp at {} (uploaded: {})", deployed.path, deployed.uploaded);
//! # Ok(()) }
//! ```

use std::path::{Path, PathBuf};
use std::time::Duration;

use fastcp_transport::AnyTransport;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::{Error, Log};

/// How long the remote inspection and the upload may take.
const STEP_TIMEOUT: Duration = Duration::from_secs(120);

/// Where self-deploy finds binaries.
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub struct DeployOptions {
    /// A folder of `cargo xtask dist` output (`fastcp-<version>-<target>` files and their
    /// `SHA256SUMS`), for remotes this binary cannot run on. Default: `$FASTCP_DIST_DIR`, or
    /// `dist/` next to this program.
    pub dist_dir: Option<PathBuf>,
}

impl DeployOptions {
    /// Options that look for `cargo xtask dist` output in `dir`.
    pub fn with_dist_dir(dir: impl Into<PathBuf>) -> DeployOptions {
        DeployOptions {
            dist_dir: Some(dir.into()),
        }
    }

    /// The options a copy's [`CopyOptions::deploy_from`](crate::CopyOptions::deploy_from)
    /// gives.
    pub(crate) fn of(options: &crate::CopyOptions) -> DeployOptions {
        DeployOptions {
            dist_dir: options.deploy_from.clone(),
        }
    }
}

/// Whether self-deploy may put this fastcp in place of the remote program on `peer`: not
/// with `--no-deploy`, nor when the remote program is named (`--remote-path`, or one that
/// an earlier deploy set on the connection).
pub(crate) fn allowed(
    ssh: &fastcp_transport::SshOptions,
    options: &crate::CopyOptions,
    peer: &AnyTransport,
) -> bool {
    ssh.remote_path.is_none() && !options.no_deploy && peer.remote_path().is_none()
}

/// A fastcp binary ready on the remote host.
#[non_exhaustive]
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Deployed {
    /// Its absolute path there.
    pub path: String,
    /// Whether this call uploaded it (false: it was in the cache already).
    pub uploaded: bool,
}

/// What the remote host told about itself.
#[derive(Debug)]
struct Remote {
    os: String,
    arch: String,
    /// The cache folder for this binary.
    dir: String,
    /// The SHA-256 of the binary cached there, if any.
    cached: Option<String>,
    /// Owner uid and octal mode of that binary (of a symlink itself, if it is one).
    binary: Option<(u32, u32)>,
    /// `glibc 2.36` from `getconf GNU_LIBC_VERSION`, as (2, 36).
    glibc: Option<(u32, u32)>,
    uid: u32,
    /// Owner uid and octal mode of each existing cache folder.
    folders: Vec<(u32, u32, String)>,
}

/// Makes sure a fastcp binary that can run is in the remote's cache, uploading one if
/// needed; returns its path.
pub async fn deploy(
    session: &AnyTransport,
    options: &DeployOptions,
    log: &Log,
) -> Result<Deployed, Error> {
    let local = LocalBinary::find(options)?;
    let name = local.cache_name();
    let mut remote = inspect(session, &name).await?;
    log.info(|| {
        format!(
            "remote host: {} {}, {}",
            remote.os,
            remote.arch,
            remote
                .glibc
                .map_or("no glibc".into(), |(a, b)| format!("glibc {a}.{b}"))
        )
    });
    refuse_unsafe_folders(&remote)?;
    let binary = local.for_remote(&remote, options)?;
    if binary.cache_name() != name {
        // A dist binary has a cache folder of its own: what is cached there is what counts.
        remote = inspect(session, &binary.cache_name()).await?;
        refuse_unsafe_folders(&remote)?;
    }
    let path = format!("{}/fastcp", remote.dir);
    // Only the user may change what is run: a binary someone else owns or may write (or a
    // symlink) could be swapped between any check and its start.
    let safe = remote
        .binary
        .is_some_and(|(owner, mode)| owner == remote.uid && mode & 0o022 == 0);
    match &remote.cached {
        Some(hash) if *hash == binary.sha256 && !safe => log.warn(|| {
            format!(
                "replacing {path} on the remote host: it must be the user's own and writable \
                 by nobody else (owner and mode: {})",
                remote
                    .binary
                    .map_or("unknown".into(), |(o, m)| format!("uid {o}, {m:03o}"))
            )
        }),
        Some(hash) if *hash == binary.sha256 => {
            log.info(|| format!("using the fastcp cached at {path} on the remote host"));
            return Ok(Deployed {
                path,
                uploaded: false,
            });
        }
        Some(other) => log.warn(|| {
            format!(
                "replacing {path} on the remote host: its SHA-256 {other} is not the expected {}",
                binary.sha256
            )
        }),
        None => {}
    }
    log.info(|| {
        format!(
            "uploading {} ({} bytes) to {path} on the remote host",
            binary.path.display(),
            binary.bytes.len()
        )
    });
    // A failed upload (a full disk, say) leaves nothing behind; SFTP may still serve.
    let dir = upload(session, &binary).await.map_err(|e| match e {
        Error::Deploy(why) => Error::Unsupported(format!("fastcp could not be uploaded: {why}")),
        other => other,
    })?;
    Ok(Deployed {
        path: format!("{dir}/fastcp"),
        uploaded: true,
    })
}

/// Fails with [`Error::Unsupported`] when a cache folder that `remote` told of is someone
/// else's or others can write to it: nothing is run from it (SFTP runs nothing of fastcp's
/// there).
fn refuse_unsafe_folders(remote: &Remote) -> Result<(), Error> {
    for (owner, mode, folder) in &remote.folders {
        if *owner != remote.uid || mode & 0o022 != 0 {
            return Err(Error::Unsupported(format!(
                "refusing the cache folder {folder} on the remote host: it is owned by uid \
                 {owner} with mode {mode:03o}, and must be the user's own and writable by \
                 nobody else"
            )));
        }
    }
    Ok(())
}

/// Whether this program's own binary serves as `fastcp server`: see [`this_binary_serves`].
static SERVES: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Declares that this program's own binary, run on a remote host with `server` as its first
/// argument, serves as `fastcp server` does, so that self-deploy may upload it. The `fastcp`
/// command says so when it starts. A program that embeds fastcp is another program: without
/// this call, self-deploy never uploads it, only the static binaries of `cargo xtask dist`
/// ([`DeployOptions::dist_dir`], [`CopyOptions::deploy_from`](crate::CopyOptions::deploy_from)),
/// and where there are none the copy goes over SFTP (or fails, with
/// [`CopyOptions::no_sftp_fallback`](crate::CopyOptions::no_sftp_fallback)). Call it only
/// when the program hands `server` to [`server::serve`](crate::server::serve) over its
/// [`stdio`](crate::stdio).
pub fn this_binary_serves() {
    SERVES.store(true, std::sync::atomic::Ordering::Relaxed);
}

/// Whether [`this_binary_serves`] was called.
fn serves() -> bool {
    SERVES.load(std::sync::atomic::Ordering::Relaxed)
}

/// The command that starts the server on a host in one round trip, in place of `fastcp
/// server`: a binary an earlier self-deploy cached there, when the cache folders pass the
/// checks [`deploy`] makes (the user's own, writable by nobody else) and the binary's
/// SHA-256 is the one expected (hashed once, then known by a stamp of its inode, size and
/// times written beside it), else `fastcp` from the remote PATH; else it exits with 127, as
/// a missing program does, and [`deploy`] takes over. The binaries looked for are those
/// [`deploy`] would upload: this very binary (when it is a fastcp server:
/// [`this_binary_serves`]) and the static binaries of `cargo xtask dist` found through
/// `options` (for a host of another architecture, or for a program that embeds fastcp),
/// each known by the hash `SHA256SUMS` gives it (or its own, where the file has none). A
/// cached binary comes first because it is there only when an earlier copy found no fastcp
/// on the PATH that could serve it (none, or one of a protocol version too old or too new).
/// `None` when there is no such binary.
pub fn launcher(options: &DeployOptions) -> Option<String> {
    let mut binaries: Vec<(String, String)> = this_binary().into_iter().collect();
    for known in dist_binaries(options) {
        if !binaries.contains(&known) {
            binaries.push(known);
        }
    }
    (!binaries.is_empty()).then(|| remote_command(&launch_script(&binaries)))
}

/// This binary's cache name and SHA-256, once a process.
static THIS_BINARY: std::sync::OnceLock<Option<(String, String)>> = std::sync::OnceLock::new();

/// This binary's cache name and SHA-256 when it serves (see [`this_binary_serves`]): what
/// [`launcher`] looks for in the remote cache first.
fn this_binary() -> Option<(String, String)> {
    if !serves() {
        return None;
    }
    THIS_BINARY
        .get_or_init(|| {
            let exe = std::env::current_exe().ok()?;
            let binary = Binary::load(&exe).ok()?;
            Some((binary.cache_name(), binary.sha256))
        })
        .clone()
}

/// Starts hashing this binary for [`launcher`] on a thread of its own, so that a login
/// (which takes longer than hashing a 20 MB binary) hides the time it takes.
pub(crate) fn hash_this_binary_soon() {
    if serves() && THIS_BINARY.get().is_none() {
        std::thread::spawn(this_binary);
    }
}

/// The folder of `cargo xtask dist` output that `options` name: theirs,
/// `$FASTCP_DIST_DIR`, or `dist/` beside this program.
fn dist_dir(options: &DeployOptions) -> Option<PathBuf> {
    options
        .dist_dir
        .clone()
        .or_else(|| std::env::var_os("FASTCP_DIST_DIR").map(PathBuf::from))
        .or_else(|| {
            std::env::current_exe()
                .ok()
                .and_then(|e| e.parent().map(|p| p.join("dist")))
        })
}

/// The name of the static binary `cargo xtask dist` builds for `arch`.
fn dist_name(arch: &str) -> String {
    format!(
        "fastcp-{}-{arch}-unknown-linux-musl",
        env!("CARGO_PKG_VERSION")
    )
}

/// The cache name and SHA-256 of each static binary in the dist folder (see [`launcher`]).
fn dist_binaries(options: &DeployOptions) -> Vec<(String, String)> {
    let Some(dir) = dist_dir(options) else {
        return Vec::new();
    };
    let sums = std::fs::read_to_string(dir.join("SHA256SUMS")).unwrap_or_default();
    ["x86_64", "aarch64"]
        .into_iter()
        .filter_map(|arch| {
            let name = dist_name(arch);
            let path = dir.join(&name);
            if !path.is_file() {
                return None;
            }
            // Only hex digits go into the remote command line.
            let listed = listed_sha256(&sums, &name)
                .filter(|h| h.len() == 64 && h.bytes().all(|b| b.is_ascii_hexdigit()));
            let sha256 = match listed {
                Some(h) => h.to_ascii_lowercase(),
                None => Binary::load(&path).ok()?.sha256,
            };
            Some((cache_name(&sha256), sha256))
        })
        .collect()
}

/// The start of every deploy script: `c` is the cache, `$XDG_CACHE_HOME` when it is an
/// absolute path (the XDG spec says to ignore a relative one), else `$HOME/.cache`. When it
/// is there, `c` is its path without symlinks, so that what is judged is what is used: a
/// link changed after the checks (another user's link that `~/.cache` leads through) cannot
/// lead the `exec` of a checked binary elsewhere. A cache that is there but cannot be
/// entered leaves `c` empty, and `n` names it. `u` is the user's uid, and `above` fails
/// when a folder above the cache (`p`) could be changed by someone else, who could then put
/// another folder in the cache's place: one owned by neither root nor the user, or writable
/// by others without the sticky bit (as OpenSSH's StrictModes judges the folders above
/// `authorized_keys`).
const CACHE: &str = "c=\"$XDG_CACHE_HOME\"; case \"$c\" in /*) ;; *) c=\"$HOME/.cache\";; esac; n=\"$c\"; \
     if [ -d \"$c\" ]; then c=$(cd -P -- \"$c\" 2>/dev/null && pwd -P) || c=; fi; u=$(id -u); \
     above() { p=\"$c\"; case \"$p\" in /*) ;; *) return 1;; esac; until [ \"$p\" = / ]; do p=\"${p%/*}\"; [ -n \"$p\" ] || p=/; \
     set -- $(stat -L -c \"%u %a\" \"$p\"); case \"$1\" in 0|\"$u\") ;; *) return 1;; esac; \
     case \"$2\" in [1357]???) ;; *[2367]?|*[2367]) return 1;; esac; done; };";

/// See [`launcher`]. Fixed text but for each binary's cache name and hash (the version and
/// hex digits): `cached NAME HASH` checks one, and leaves its folder in `d`.
///
/// The binary, the three cache folders and the folders above them (judged as `above` judges
/// them) take one `stat`: each process started costs a start a few milliseconds. The cache
/// is named without links, so a symlink shows only inside it, and is refused. The binary's
/// SHA-256 is checked the first time; then a stamp beside it (`stamp`: the binary's device,
/// inode, size, modification and change times, and the hash) stands for the hash while
/// those are unchanged, so that a start reads no 20 MB. Only the user (or root) can change
/// the binary or the stamp in those folders, and any change to the binary's bytes moves its
/// change time, which nobody can set back. A binary not the user's own, or one others may
/// write (or a symlink), is refused: it could be swapped between any check and its start;
/// [`deploy`] replaces it. A stamp is written (private: in a subshell whose umask is 077,
/// leaving the server's as the login gave it) only when the binary's change time was more
/// than a second past when the hash began (the clock is read before the binary is), so that
/// a change after the hash read the binary has a later change time, even one a clock tick
/// behind.
fn launch_script(binaries: &[(String, String)]) -> String {
    let tries: String = binaries
        .iter()
        .map(|(name, hash)| {
            format!("if cached {name} {hash}; then exec \"$d/fastcp\" server; fi; ")
        })
        .collect();
    format!(
        "{CACHE} \
         cached() {{ d=\"$c/fastcp/$1\"; e=\"$2\"; case \"$c\" in /*) ;; *) return 1;; esac; [ -f \"$d/fastcp\" ] || return 1; \
         set -- \"$d/fastcp\" \"$c\" \"$c/fastcp\" \"$d\"; p=\"$c\"; \
         until [ \"$p\" = / ]; do p=\"${{p%/*}}\"; [ -n \"$p\" ] || p=/; set -- \"$@\" \"$p\"; done; \
         n=$#; set -- $(stat -c \"%u %a %d %i %s %Y %Z\" \"$@\" 2>/dev/null); [ $# = $((n * 7)) ] || return 1; \
         [ \"$1\" = \"$u\" ] || return 1; case \"$2\" in *[2367]?|*[2367]) return 1;; esac; s=\"$3 $4 $5 $6 $7 $e\"; z=\"$7\"; shift 7; \
         for f in 1 2 3; do [ \"$1\" = \"$u\" ] || return 1; case \"$2\" in *[2367]?|*[2367]) return 1;; esac; shift 7; done; \
         while [ $# -gt 0 ]; do case \"$1\" in 0|\"$u\") ;; *) return 1;; esac; \
         case \"$2\" in [1357]???) ;; *[2367]?|*[2367]) return 1;; esac; shift 7; done; \
         if {{ read -r t < \"$d/stamp\"; }} 2>/dev/null && [ \"$t\" = \"$s\" ]; then return 0; fi; \
         w=$(date +%s); [ \"$w\" -gt 1 ] 2>/dev/null || w=1; \
         h=$( (openssl dgst -sha256 -r \"$d/fastcp\" || sha256sum \"$d/fastcp\" || shasum -a 256 \"$d/fastcp\") 2>/dev/null | cut -c1-64); \
         [ \"$h\" = \"$e\" ] || return 1; \
         if [ \"$z\" -lt $((w - 1)) ]; then \
         (umask 077; echo \"$s\" > \"$d/.stamp.$$\" && mv -f \"$d/.stamp.$$\" \"$d/stamp\") 2>/dev/null || rm -f \"$d/.stamp.$$\"; fi; }}; \
         {tries}\
         command -v fastcp >/dev/null 2>&1 && exec fastcp server; exit 127"
    )
}

/// Runs one fixed script on the remote through `sh`, feeding it `input`; returns stdout, or
/// the error with what it printed on stderr.
async fn run_script(
    session: &AnyTransport,
    script: &str,
    input: &[u8],
    what: &str,
) -> Result<String, Error> {
    let command = remote_command(script);
    let work = async {
        let mut p = session.exec(&command).await?;
        let stderr = tokio::spawn(async move {
            let mut text = Vec::new();
            while let Some(chunk) = p.stderr.recv().await {
                text.extend_from_slice(&chunk);
            }
            text
        });
        let mut out = Vec::new();
        let (mut read, mut write) = tokio::io::split(p.stream);
        let feed = async {
            write.write_all(input).await?;
            write.shutdown().await
        };
        // A script that stops reading (its disk is full) ends its output: then stop feeding
        // it, as nothing more would be taken (the channel's window never opens again).
        let mut feed = std::pin::pin!(feed);
        let mut reading = std::pin::pin!(read.read_to_end(&mut out));
        let mut fed = None;
        let got = loop {
            tokio::select! {
                done = &mut feed, if fed.is_none() => fed = Some(done),
                got = &mut reading => break got,
            }
        };
        let status = p.exit.wait().await?;
        let err = String::from_utf8_lossy(&stderr.await.unwrap_or_default()).into_owned();
        if !status.success() || matches!(fed, Some(Err(_))) || got.is_err() {
            return Err(Error::Deploy(format!(
                "{what} failed on the remote host ({status}): {}",
                crate::stream::escape(err.trim().as_bytes())
            )));
        }
        Ok(String::from_utf8_lossy(&out).into_owned())
    };
    tokio::time::timeout(STEP_TIMEOUT, work)
        .await
        .map_err(|_| Error::Deploy(format!("{what} took more than {STEP_TIMEOUT:?}")))?
}

/// The remote's OS, architecture, glibc, uid, cache folder and what is cached in it, in one
/// round trip.
async fn inspect(session: &AnyTransport, name: &str) -> Result<Remote, Error> {
    let script = inspect_script(name);
    let out = run_script(session, &script, b"", "inspecting the remote host").await?;
    parse_inspection(&out)
}

/// The line the remote login shell runs for `script`: `exec sh -c '<script>'`, the same under
/// a POSIX shell and a csh-like one, since the script holds no `'`, `!` or newline.
fn remote_command(script: &str) -> String {
    assert!(
        !script.contains('\'') && !script.contains('!') && !script.contains('\n'),
        "a deploy script must hold no quote, ! or newline"
    );
    format!("exec sh -c '{script}'")
}

/// The script that tells the remote's OS, architecture, glibc, uid and cache (see
/// [`parse_inspection`]). Fixed text but for `name`, which is the version and a hex hash.
fn inspect_script(name: &str) -> String {
    format!(
        "{CACHE} if [ -z \"$c\" ]; then echo \"unentered $n\"; exit 0; fi; \
         above || {{ echo \"above $(stat -L -c \"%u %a\" \"$p\" || echo ? ?) $p\"; exit 0; }}; d=\"$c/fastcp/{name}\"; \
         echo \"os $(uname -s)\"; echo \"arch $(uname -m)\"; echo \"uid $(id -u)\"; \
         echo \"dir $d\"; echo \"libc $(getconf GNU_LIBC_VERSION 2>/dev/null)\"; \
         for f in \"$c\" \"$c/fastcp\" \"$d\"; do \
         if [ -d \"$f\" ]; then echo \"folder $(stat -c \"%u %a\" \"$f\") $f\"; fi; done; \
         if [ -f \"$d/fastcp\" ]; then echo \"binary $(stat -c \"%u %a\" \"$d/fastcp\")\"; \
         echo \"cached $( (openssl dgst -sha256 -r \"$d/fastcp\" || sha256sum \"$d/fastcp\" || shasum -a 256 \"$d/fastcp\") 2>/dev/null | cut -c1-64)\"; \
         fi"
    )
}

fn parse_inspection(out: &str) -> Result<Remote, Error> {
    let mut r = Remote {
        os: String::new(),
        arch: String::new(),
        dir: String::new(),
        cached: None,
        binary: None,
        glibc: None,
        uid: u32::MAX,
        folders: Vec::new(),
    };
    for line in out.lines() {
        let (key, value) = line.split_once(' ').unwrap_or((line, ""));
        match key {
            "above" => {
                // `UID MODE PATH`, or `? ? PATH` where it could not be read.
                let mut it = value.splitn(3, ' ');
                let (owner, mode, path) = (it.next(), it.next(), it.next());
                return Err(Error::Unsupported(format!(
                    "refusing the cache folder on the remote host: the folder {} above it \
                     (owned by uid {}, mode {}) could be changed by other users, who could put \
                     another folder in its place; it must be owned by root or the user, and \
                     writable by nobody else unless sticky",
                    crate::stream::escape(path.unwrap_or("").as_bytes()),
                    owner.unwrap_or("?"),
                    mode.unwrap_or("?"),
                )));
            }
            "unentered" => {
                return Err(Error::Unsupported(format!(
                    "the cache folder {} on the remote host cannot be entered: nothing is \
                     uploaded there",
                    crate::stream::escape(value.as_bytes())
                )));
            }
            "os" => r.os = value.trim().to_owned(),
            "arch" => r.arch = value.trim().to_owned(),
            "uid" => r.uid = value.trim().parse().unwrap_or(u32::MAX),
            "dir" => r.dir = value.to_owned(),
            "libc" => r.glibc = parse_glibc(value),
            "cached" => {
                let h = value.trim();
                if h.len() == 64 && h.bytes().all(|b| b.is_ascii_hexdigit()) {
                    r.cached = Some(h.to_ascii_lowercase());
                } else {
                    r.cached = Some("(unreadable)".into());
                }
            }
            "binary" => {
                let mut it = value.split(' ');
                let owner = it.next().and_then(|v| v.parse().ok());
                let mode = it.next().and_then(|v| u32::from_str_radix(v, 8).ok());
                r.binary = Some(owner.zip(mode).unwrap_or((u32::MAX, 0o777)));
            }
            "folder" => {
                let mut it = value.splitn(3, ' ');
                let owner = it.next().and_then(|v| v.parse().ok());
                let mode = it.next().and_then(|v| u32::from_str_radix(v, 8).ok());
                let path = it.next().unwrap_or("").to_owned();
                match (owner, mode) {
                    (Some(o), Some(m)) => r.folders.push((o, m, path)),
                    _ => r.folders.push((u32::MAX, 0o777, path)),
                }
            }
            _ => {}
        }
    }
    if r.dir.is_empty() || !r.dir.starts_with('/') || r.uid == u32::MAX {
        return Err(Error::Deploy(format!(
            "the remote host did not say where its cache is: {}",
            crate::stream::escape(out.as_bytes())
        )));
    }
    Ok(r)
}

/// `glibc 2.36` as (2, 36).
fn parse_glibc(s: &str) -> Option<(u32, u32)> {
    let v = s.trim().strip_prefix("glibc ")?;
    let (major, minor) = v.split_once('.')?;
    let minor: String = minor.chars().take_while(char::is_ascii_digit).collect();
    Some((major.parse().ok()?, minor.parse().ok()?))
}

/// Uploads `binary` into its cache folder on the remote: a private temp name, the hash
/// checked there, then renamed into place. Returns the folder, named without links.
async fn upload(session: &AnyTransport, binary: &Binary) -> Result<String, Error> {
    let script = upload_script(&binary.cache_name(), &binary.sha256);
    let out = run_script(session, &script, &binary.bytes, "uploading fastcp").await?;
    // What a login shell that prints (an `echo` in ~/.bashrc) said comes first: the upload
    // stands, and starting the server then fails, quoting it.
    match out.lines().last().and_then(|l| l.strip_prefix("uploaded ")) {
        Some(dir) if dir.starts_with('/') => Ok(dir.to_owned()),
        _ => Err(Error::Deploy(format!(
            "the upload was not confirmed: {}",
            crate::stream::escape(out.as_bytes())
        ))),
    }
}

/// The script that takes a binary on stdin into the cache folder `name`: the folders made
/// private, then judged as the launcher judges them (they may have come since the
/// inspection), a private temp name, its SHA-256 checked against `hash`, then renamed into
/// place; prints `uploaded` and the folder, named without links.
fn upload_script(name: &str, hash: &str) -> String {
    format!(
        "umask 077; {CACHE} [ -n \"$c\" ] || exit 1; \
         safe_above() {{ above || {{ echo \"refusing the cache folder $c: the folder $p above it could be changed by other users\" >&2; exit 1; }}; }}; \
         safe_above; d=\"$c/fastcp/{name}\"; mkdir -p \"$d\" || exit 1; \
         c=$(cd -P -- \"$c\" && pwd -P) || exit 1; d=\"$c/fastcp/{name}\"; safe_above; \
         refuse() {{ echo \"refusing the cache folder $f: it must be owned by uid $u and writable by nobody else\" >&2; exit 1; }}; \
         for f in \"$c\" \"$c/fastcp\" \"$d\"; do set -- $(stat -c \"%u %a\" \"$f\"); \
         [ \"$1\" = \"$u\" ] || refuse; case \"$2\" in *[2367]?|*[2367]) refuse;; esac; done; \
         t=\"$d/.fastcp.$$.tmp\"; \
         if cat > \"$t\" && [ \"$( (openssl dgst -sha256 -r \"$t\" || sha256sum \"$t\" || shasum -a 256 \"$t\") 2>/dev/null | cut -c1-64)\" = {hash} ] \
         && chmod 700 \"$t\" && mv -f \"$t\" \"$d/fastcp\"; then echo \"uploaded $d\"; \
         else rm -f \"$t\"; echo \"the upload did not arrive whole (full disk, or no sha256sum)\" >&2; exit 1; fi"
    )
}

/// A binary that can go to the remote.
struct Binary {
    path: PathBuf,
    bytes: Vec<u8>,
    sha256: String,
}

impl Binary {
    fn load(path: &Path) -> Result<Binary, Error> {
        let bytes = std::fs::read(path).map_err(|e| {
            Error::Deploy(format!("cannot read the binary {}: {e}", path.display()))
        })?;
        let sha256 = sha256_hex(&bytes);
        Ok(Binary {
            path: path.to_owned(),
            bytes,
            sha256,
        })
    }

    /// The cache folder's name: see [`cache_name`].
    fn cache_name(&self) -> String {
        cache_name(&self.sha256)
    }
}

/// The binary running here, and what it needs.
struct LocalBinary {
    binary: Binary,
    arch: &'static str,
    /// The newest glibc symbol version it needs; `None` for a static binary.
    glibc: Option<(u32, u32)>,
}

impl LocalBinary {
    fn find(_options: &DeployOptions) -> Result<LocalBinary, Error> {
        let exe = std::env::current_exe()
            .map_err(|e| Error::Deploy(format!("cannot find this program's binary: {e}")))?;
        let binary = Binary::load(&exe)?;
        let glibc = if is_static(&binary.bytes) {
            None
        } else {
            Some(newest_glibc(&binary.bytes).unwrap_or((2, 17)))
        };
        Ok(LocalBinary {
            binary,
            arch: std::env::consts::ARCH,
            glibc,
        })
    }

    /// The cache name of the binary this host would send first.
    fn cache_name(&self) -> String {
        self.binary.cache_name()
    }

    /// The binary for `remote`: this one if it can run there, else one from the dist
    /// folder.
    fn for_remote(self, remote: &Remote, options: &DeployOptions) -> Result<Binary, Error> {
        if remote.os != "Linux" || !matches!(remote.arch.as_str(), "x86_64" | "aarch64") {
            return Err(Error::Unsupported(format!(
                "the remote host runs {} on {}; fastcp ships binaries for Linux on x86_64 and \
                 aarch64 only",
                remote.os, remote.arch
            )));
        }
        let runs_there = remote.arch == self.arch
            && match (self.glibc, remote.glibc) {
                (None, _) => true,
                (Some(need), Some(have)) => have >= need,
                (Some(_), None) => false,
            };
        if runs_there && serves() {
            return Ok(self.binary);
        }
        let name = dist_name(&remote.arch);
        let Some(path) = dist_dir(options)
            .map(|d| d.join(&name))
            .filter(|p| p.is_file())
        else {
            return Err(Error::Unsupported(format!(
                "{} ({} {}{}), and no {name} was found to upload: build it with `cargo xtask \
                 dist` and name its folder with --deploy-from DIR or FASTCP_DIST_DIR",
                if runs_there {
                    "this program is not fastcp, and is not uploaded as its server"
                } else {
                    "this fastcp cannot run on the remote host"
                },
                remote.os,
                remote.arch,
                remote
                    .glibc
                    .map_or(String::new(), |(a, b)| format!(", glibc {a}.{b}")),
            )));
        };
        let binary = Binary::load(&path)?;
        check_listed(&path, &binary.sha256)?;
        Ok(binary)
    }
}

/// Checks `path` against the `SHA256SUMS` beside it, when there is one.
fn check_listed(path: &Path, sha256: &str) -> Result<(), Error> {
    let Some(sums) = path
        .parent()
        .and_then(|d| std::fs::read_to_string(d.join("SHA256SUMS")).ok())
    else {
        return Ok(());
    };
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
    match listed_sha256(&sums, name) {
        Some(h) if h.eq_ignore_ascii_case(sha256) => Ok(()),
        Some(h) => Err(Error::Deploy(format!(
            "{} does not match its SHA256SUMS entry ({h}); rebuild it with `cargo xtask dist`",
            path.display()
        ))),
        None => Ok(()),
    }
}

/// The hash a `SHA256SUMS` file's text (`HASH  NAME` lines) gives `name`.
fn listed_sha256<'a>(sums: &'a str, name: &str) -> Option<&'a str> {
    sums.lines().find_map(|l| {
        let (h, n) = l.split_once("  ")?;
        (n.trim() == name).then_some(h.trim())
    })
}

/// The cache folder's name for a binary of this version with this SHA-256 (hex): the
/// version and the hash's first 16 digits.
fn cache_name(sha256: &str) -> String {
    format!("{}-{}", env!("CARGO_PKG_VERSION"), &sha256[..16])
}

/// Whether an ELF file has no program interpreter (statically linked, static-pie included).
fn is_static(elf: &[u8]) -> bool {
    // 64-bit little-endian ELF: e_phoff at 32, e_phentsize at 54, e_phnum at 56.
    if elf.len() < 64 || &elf[..4] != b"\x7fELF" || elf[4] != 2 || elf[5] != 1 {
        return false;
    }
    let u16_at = |o: usize| u16::from_le_bytes([elf[o], elf[o + 1]]) as usize;
    let phoff = u64::from_le_bytes(elf[32..40].try_into().expect("8 bytes")) as usize;
    let (size, count) = (u16_at(54), u16_at(56));
    (0..count).all(|i| {
        let at = phoff + i * size;
        // PT_INTERP = 3.
        elf.get(at..at + 4)
            .is_none_or(|t| u32::from_le_bytes(t.try_into().expect("4 bytes")) != 3)
    })
}

/// The newest `GLIBC_x.y` version a dynamically linked binary names.
fn newest_glibc(elf: &[u8]) -> Option<(u32, u32)> {
    let pat = b"GLIBC_";
    let mut best = None;
    let mut i = 0;
    while let Some(pos) = elf[i..].windows(pat.len()).position(|w| w == pat) {
        let start = i + pos + pat.len();
        let digits: String = elf[start..]
            .iter()
            .take(8)
            .take_while(|b| b.is_ascii_digit() || **b == b'.')
            .map(|&b| b as char)
            .collect();
        if let Some((a, b)) = digits.split_once('.')
            && let (Ok(a), Ok(b)) = (a.parse::<u32>(), b.split('.').next().unwrap_or("").parse())
        {
            best = best.max(Some((a, b)));
        }
        i = start;
    }
    best
}

fn sha256_hex(bytes: &[u8]) -> String {
    ring::digest::digest(&ring::digest::SHA256, bytes)
        .as_ref()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs `script` as sshd would under the login shell `shell` (`SHELL -c LINE`), with
    /// `home` as HOME and `input` on stdin.
    fn run_under(shell: &Path, script: &str, home: &Path, input: &[u8]) -> std::process::Output {
        run_with_path(shell, script, home, input, "/usr/bin:/bin")
    }

    /// [`run_under`] with `path` as PATH.
    fn run_with_path(
        shell: &Path,
        script: &str,
        home: &Path,
        input: &[u8],
        path: &str,
    ) -> std::process::Output {
        use std::io::Write;
        let mut child = std::process::Command::new(shell)
            .arg("-c")
            .arg(remote_command(script))
            .env("HOME", home)
            .env("PATH", path)
            .env_remove("XDG_CACHE_HOME")
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut stdin = child.stdin.take().unwrap();
        let _ = stdin.write_all(input);
        drop(stdin);
        child.wait_with_output().unwrap()
    }

    /// The deploy scripts mean the same under bash, dash and tcsh login shells: the
    /// inspection finds the cache under HOME, an upload lands whole and private, and one
    /// whose bytes do not match the hash leaves nothing.
    #[test]
    fn deploy_scripts_mean_the_same_under_every_login_shell() {
        use std::os::unix::fs::PermissionsExt;
        let bytes = b"#!/bin/sh\necho not really fastcp\n".repeat(100);
        let hash = sha256_hex(&bytes);
        let name = format!("0.0.0-{}", &hash[..16]);
        for shell in ["bash", "dash", "tcsh"] {
            let shell = fastcp_testsupport::tools::require(shell);
            let home = tempfile::tempdir().unwrap();
            let what = shell.display();
            let out = run_under(&shell, &inspect_script(&name), home.path(), b"");
            assert!(out.status.success(), "{what}: {out:?}");
            let remote = parse_inspection(&String::from_utf8_lossy(&out.stdout)).unwrap();
            let dir = home.path().join(".cache/fastcp").join(&name);
            assert_eq!(remote.dir, dir.display().to_string(), "{what}");
            assert_eq!(remote.cached, None, "{what}");

            let bad = run_under(&shell, &upload_script(&name, &hash), home.path(), b"torn");
            assert!(!bad.status.success(), "{what}: {bad:?}");
            assert!(
                std::fs::read_dir(&dir).unwrap().next().is_none(),
                "{what}: a failed upload left something"
            );

            let good = run_under(&shell, &upload_script(&name, &hash), home.path(), &bytes);
            assert!(good.status.success(), "{what}: {good:?}");
            let said = format!("uploaded {}", dir.display());
            assert_eq!(String::from_utf8_lossy(&good.stdout).trim(), said, "{what}");
            let landed = dir.join("fastcp");
            assert_eq!(std::fs::read(&landed).unwrap(), bytes, "{what}");
            let mode = std::fs::metadata(&landed).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o700, "{what}");

            let out = run_under(&shell, &inspect_script(&name), home.path(), b"");
            let remote = parse_inspection(&String::from_utf8_lossy(&out.stdout)).unwrap();
            assert_eq!(remote.cached.as_deref(), Some(hash.as_str()), "{what}");

            // The launcher runs the cached binary before a `fastcp` on the PATH (there only
            // when an earlier copy found none there that could serve it), and nothing from a
            // cache it must refuse: then the one on the PATH, else it exits 127.
            let bin = tempfile::tempdir().unwrap();
            let on_path = bin.path().join("fastcp");
            std::fs::write(&on_path, "#!/bin/sh\necho \"from the PATH $1\"\n").unwrap();
            std::fs::set_permissions(&on_path, std::fs::Permissions::from_mode(0o755)).unwrap();
            let with_path = format!("{}:/usr/bin:/bin", bin.path().display());
            let launch = || {
                run_under(
                    &shell,
                    &launch_script(&[(name.clone(), hash.clone())]),
                    home.path(),
                    b"",
                )
            };
            let launch_with_path = || {
                let script = launch_script(&[(name.clone(), hash.clone())]);
                run_with_path(&shell, &script, home.path(), b"", &with_path)
            };
            // Another binary looked for first (a dist binary not cached here) is passed by.
            let absent = ("0.0.0-0000000000000000".to_owned(), "0".repeat(64));
            let launch_second = || {
                let script = launch_script(&[absent.clone(), (name.clone(), hash.clone())]);
                run_under(&shell, &script, home.path(), b"")
            };
            for ran in [launch(), launch_with_path(), launch_second()] {
                assert!(ran.status.success(), "{what}: {ran:?}");
                assert!(String::from_utf8_lossy(&ran.stdout).contains("not really fastcp"));
            }
            let set_mode = |p: &Path, m| {
                std::fs::set_permissions(p, std::fs::Permissions::from_mode(m)).unwrap()
            };
            let from_path = |ran: std::process::Output| {
                assert!(ran.status.success(), "{what}: {ran:?}");
                assert_eq!(ran.stdout, b"from the PATH server\n", "{what}: {ran:?}");
            };
            set_mode(&dir, 0o770);
            let refused = launch();
            assert_eq!(refused.status.code(), Some(127), "{what}: {refused:?}");
            assert!(refused.stdout.is_empty(), "{what}: {refused:?}");
            from_path(launch_with_path());
            set_mode(&dir, 0o700);
            std::fs::write(&landed, b"#!/bin/sh\necho tampered\n").unwrap();
            let tampered = launch();
            assert_eq!(tampered.status.code(), Some(127), "{what}: {tampered:?}");
            assert!(tampered.stdout.is_empty(), "{what}: {tampered:?}");
            from_path(launch_with_path());
            std::fs::remove_dir_all(home.path().join(".cache")).unwrap();
            assert_eq!(launch().status.code(), Some(127), "{what}");
            from_path(launch_with_path());
        }
    }

    /// A cache folder reached through a symlink is judged, and used, by the folder it led to
    /// when it was judged: whoever can change the link (another user's link in /tmp that
    /// `~/.cache` leads through) cannot have a binary run that was not checked, neither by
    /// changing it between the launcher's hash check and its `exec` nor between the
    /// inspection and the command that runs the binary the inspection found.
    #[test]
    fn a_symlink_changed_after_the_checks_runs_nothing_unchecked() {
        use std::os::unix::fs::PermissionsExt;
        let bytes = b"#!/bin/sh\necho checked\n".to_vec();
        let hash = sha256_hex(&bytes);
        let name = format!("0.0.0-{}", &hash[..16]);
        for shell in ["bash", "dash", "tcsh"] {
            let shell = fastcp_testsupport::tools::require(shell);
            let what = shell.display();
            let home = tempfile::tempdir().unwrap();
            let home = home.path().canonicalize().unwrap();
            let (real, evil) = (home.join("real"), home.join("evil"));
            let private = |p: &Path| {
                std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o700)).unwrap()
            };
            // Two caches that pass every check: the link leads to the first, then the second.
            let other = b"#!/bin/sh\necho unchecked\n";
            for (cache, script) in [(&real, &bytes[..]), (&evil, &other[..])] {
                let dir = cache.join("fastcp").join(&name);
                std::fs::create_dir_all(&dir).unwrap();
                for d in [cache, &cache.join("fastcp"), &dir] {
                    private(d);
                }
                std::fs::write(dir.join("fastcp"), script).unwrap();
                private(&dir.join("fastcp"));
            }
            let link = home.join(".cache");
            std::os::unix::fs::symlink(&real, &link).unwrap();

            let out = run_under(&shell, &inspect_script(&name), &home, b"");
            let remote = parse_inspection(&String::from_utf8_lossy(&out.stdout)).unwrap();
            let dir = real.join("fastcp").join(&name);
            assert_eq!(remote.dir, dir.display().to_string(), "{what}: {out:?}");
            assert_eq!(remote.cached.as_deref(), Some(hash.as_str()), "{what}");

            // The hash tool turns the link to the other folder once it has hashed the file.
            let tools = home.join("tools");
            std::fs::create_dir(&tools).unwrap();
            std::fs::write(
                tools.join("openssl"),
                format!(
                    "#!/bin/sh\nh=$(sha256sum \"$4\")\nln -sfn {} {}\necho \"$h\"\n",
                    evil.display(),
                    link.display()
                ),
            )
            .unwrap();
            std::fs::set_permissions(
                tools.join("openssl"),
                std::fs::Permissions::from_mode(0o755),
            )
            .unwrap();
            let path = format!("{}:/usr/bin:/bin", tools.display());
            let ran = run_with_path(
                &shell,
                &launch_script(&[(name.clone(), hash.clone())]),
                &home,
                b"",
                &path,
            );
            let said = String::from_utf8_lossy(&ran.stdout);
            assert_eq!(said, "checked\n", "{what}: {ran:?}");
        }
    }

    /// A cache folder that others can write to, made after the inspection found none (the
    /// cache in /tmp, say), gets no upload: the upload checks the folders it writes into, as
    /// the inspection and the launcher do, and nothing lands.
    #[test]
    fn an_upload_into_a_folder_others_can_write_is_refused() {
        use std::os::unix::fs::PermissionsExt;
        let bytes = b"#!/bin/sh\necho not really fastcp\n".to_vec();
        let hash = sha256_hex(&bytes);
        let name = format!("0.0.0-{}", &hash[..16]);
        for shell in ["bash", "dash", "tcsh"] {
            let shell = fastcp_testsupport::tools::require(shell);
            let what = shell.display();
            let home = tempfile::tempdir().unwrap();
            let cache = home.path().join(".cache");
            std::fs::create_dir(&cache).unwrap();
            std::fs::set_permissions(&cache, std::fs::Permissions::from_mode(0o777)).unwrap();
            let out = run_under(&shell, &upload_script(&name, &hash), home.path(), &bytes);
            assert!(!out.status.success(), "{what}: {out:?}");
            assert!(
                String::from_utf8_lossy(&out.stderr).contains("refusing the cache folder"),
                "{what}: {out:?}"
            );
            assert!(!cache.join("fastcp").join(&name).join("fastcp").exists());
        }
    }

    /// A folder above the cache that someone else could change (writable by others, not
    /// sticky) could have another folder put in the cache's place between the checks and the
    /// `exec`: the inspection says so (the copy goes over SFTP), the upload refuses, and the
    /// launcher runs nothing from that cache. A sticky one (/tmp) is fine, as for OpenSSH.
    #[test]
    fn a_folder_above_the_cache_that_others_can_change_is_refused() {
        use std::os::unix::fs::PermissionsExt;
        let bytes = b"#!/bin/sh\necho not really fastcp\n".to_vec();
        let hash = sha256_hex(&bytes);
        let name = format!("0.0.0-{}", &hash[..16]);
        let set_mode =
            |p: &Path, m| std::fs::set_permissions(p, std::fs::Permissions::from_mode(m)).unwrap();
        for shell in ["bash", "dash", "tcsh"] {
            let shell = fastcp_testsupport::tools::require(shell);
            let what = shell.display();
            let top = tempfile::tempdir().unwrap();
            let shared = top.path().join("shared");
            let home = shared.join("home");
            std::fs::create_dir_all(&home).unwrap();
            set_mode(&shared, 0o1777);
            let inspect = || {
                let out = run_under(&shell, &inspect_script(&name), &home, b"");
                parse_inspection(&String::from_utf8_lossy(&out.stdout))
            };
            assert!(inspect().is_ok(), "{what}");
            let good = run_under(&shell, &upload_script(&name, &hash), &home, &bytes);
            assert!(good.status.success(), "{what}: {good:?}");
            let launch = || {
                run_under(
                    &shell,
                    &launch_script(&[(name.clone(), hash.clone())]),
                    &home,
                    b"",
                )
            };
            assert!(launch().status.success(), "{what}");

            // One owned by someone else (where the test may give it away: as root).
            set_mode(&shared, 0o755);
            if std::os::unix::fs::chown(&shared, Some(65534), None).is_ok() {
                assert!(inspect().is_err(), "{what}");
                let refused = launch();
                assert_eq!(refused.status.code(), Some(127), "{what}: {refused:?}");
                std::os::unix::fs::chown(&shared, Some(0), None).unwrap();
                assert!(launch().status.success(), "{what}");
            }
            set_mode(&shared, 0o777);
            let err = inspect().unwrap_err();
            let said = err.to_string();
            assert!(matches!(err, Error::Unsupported(_)), "{what}: {said}");
            let named = format!("the folder {} above it", shared.display());
            assert!(said.contains(&named), "{what}: {said}");
            let refused = launch();
            assert_eq!(refused.status.code(), Some(127), "{what}: {refused:?}");
            assert!(refused.stdout.is_empty(), "{what}: {refused:?}");
            let cached = home.join(".cache/fastcp").join(&name).join("fastcp");
            std::fs::remove_file(&cached).unwrap();
            let out = run_under(&shell, &upload_script(&name, &hash), &home, &bytes);
            assert!(!out.status.success(), "{what}: {out:?}");
            assert!(
                String::from_utf8_lossy(&out.stderr).contains("above it could be changed"),
                "{what}: {out:?}"
            );
            assert!(!cached.exists(), "{what}");
        }
    }

    /// A home of its own with `bytes` uploaded into its cache, as the upload script puts a
    /// binary there: (the home, the cache name, the hash, the binary's path).
    fn uploaded(bytes: &[u8]) -> (tempfile::TempDir, String, String, PathBuf) {
        let hash = sha256_hex(bytes);
        let name = format!("0.0.0-{}", &hash[..16]);
        let home = tempfile::tempdir().unwrap();
        let sh = fastcp_testsupport::tools::require("sh");
        let up = run_under(&sh, &upload_script(&name, &hash), home.path(), bytes);
        assert!(up.status.success(), "{up:?}");
        let binary = home.path().join(".cache/fastcp").join(&name).join("fastcp");
        (home, name, hash, binary)
    }

    /// The launcher hashes a cached binary once, then trusts the stamp it wrote beside it
    /// while the binary's inode, size and times are unchanged: a change in place that keeps
    /// the size and sets the modification time back still moves the change time, and the
    /// binary is hashed again and refused. A binary others may write, or another's, or a
    /// symlink, is refused, as is a symlink for its folder.
    #[test]
    fn a_stamp_stands_for_the_hash_until_the_binary_changes() {
        use std::os::unix::fs::{MetadataExt, PermissionsExt};
        let bytes = b"#!/bin/sh\necho stamped $(umask)\n".repeat(100);
        let (home, name, hash, binary) = uploaded(&bytes);
        let sh = fastcp_testsupport::tools::require("sh");
        let stamp = binary.with_file_name("stamp");
        // Each run of a hash tool leaves a line.
        let tools = tempfile::tempdir().unwrap();
        let hashed = tools.path().join("runs");
        for tool in ["openssl", "sha256sum", "shasum"] {
            let wrapper = tools.path().join(tool);
            std::fs::write(
                &wrapper,
                format!(
                    "#!/bin/sh\necho {tool} >> '{}'\nexec /usr/bin/{tool} \"$@\"\n",
                    hashed.display()
                ),
            )
            .unwrap();
            std::fs::set_permissions(&wrapper, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
        let hashes = || {
            std::fs::read_to_string(&hashed)
                .map(|s| s.lines().count())
                .unwrap_or(0)
        };
        let path = format!("{}:/usr/bin:/bin", tools.path().display());
        let launch = || {
            let script = launch_script(&[(name.clone(), hash.clone())]);
            run_with_path(&sh, &script, home.path(), b"", &path)
        };
        let runs = |out: std::process::Output| {
            assert!(out.status.success(), "{out:?}");
            assert!(String::from_utf8_lossy(&out.stdout).starts_with("stamped"));
        };
        // No stamp is written within the second the binary last changed, nor the next.
        let past_its_second = || {
            let changed = std::fs::metadata(&binary).unwrap().ctime();
            for _ in 0..80 {
                let now = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap()
                    .as_secs() as i64;
                if now > changed + 1 {
                    return;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            panic!("the clock did not pass the binary's change time");
        };
        past_its_second();
        let stamping = launch();
        let first = hashes();
        assert!(first > 0, "the first start hashes the binary");
        assert!(stamp.exists(), "and stamps it");
        let later = launch();
        runs(launch());
        assert_eq!(hashes(), first, "a stamped binary is not hashed again");
        // The start that wrote the stamp runs the binary with the umask the login gave it.
        assert_eq!(stamping.stdout, later.stdout, "{stamping:?} {later:?}");
        runs(stamping);

        // Changed in place: same inode and size, the modification time set back.
        let mtime = std::fs::metadata(&binary).unwrap().modified().unwrap();
        let mut tampered = bytes.clone();
        tampered[10..17].copy_from_slice(b"tamper ");
        {
            use std::io::{Seek, Write};
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .open(&binary)
                .unwrap();
            f.seek(std::io::SeekFrom::Start(0)).unwrap();
            f.write_all(&tampered).unwrap();
            f.set_modified(mtime).unwrap();
        }
        let refused = launch();
        assert_eq!(refused.status.code(), Some(127), "{refused:?}");
        assert!(refused.stdout.is_empty(), "{refused:?}");
        assert!(hashes() > first, "a changed binary is hashed again");

        // Put back (a new change time), stamped again; then one others may write, one that
        // is not the user's own (where the test may give it away: as root), and a symlink
        // in its place are refused, stamp or not: any could be swapped before its start.
        std::fs::write(&binary, &bytes).unwrap();
        past_its_second();
        runs(launch());
        let stamped = hashes();
        runs(launch());
        assert_eq!(hashes(), stamped);
        let refused = |why: &str| {
            let out = launch();
            assert_eq!(out.status.code(), Some(127), "{why}: {out:?}");
            assert!(out.stdout.is_empty(), "{why}: {out:?}");
        };
        std::fs::set_permissions(&binary, std::fs::Permissions::from_mode(0o720)).unwrap();
        refused("writable by the group");
        std::fs::set_permissions(&binary, std::fs::Permissions::from_mode(0o700)).unwrap();
        if std::os::unix::fs::chown(&binary, Some(65534), None).is_ok() {
            refused("another's");
            std::os::unix::fs::chown(&binary, Some(0), None).unwrap();
        }
        let real = binary.with_file_name("real");
        std::fs::rename(&binary, &real).unwrap();
        std::os::unix::fs::symlink(&real, &binary).unwrap();
        refused("a symlink");
        assert_eq!(hashes(), stamped, "each refused before any hash");
        std::fs::rename(&real, &binary).unwrap();
        runs(launch());
        // A symlink for a folder inside the cache is refused too, by the launcher and by
        // the inspection (a link to the whole cache is judged by where it leads).
        let dir = binary.parent().unwrap().to_owned();
        let moved = dir.with_file_name("moved");
        std::fs::rename(&dir, &moved).unwrap();
        std::os::unix::fs::symlink(&moved, &dir).unwrap();
        refused("a symlink for its folder");
        let out = run_under(&sh, &inspect_script(&name), home.path(), b"");
        let remote = parse_inspection(&String::from_utf8_lossy(&out.stdout)).unwrap();
        assert!(refuse_unsafe_folders(&remote).is_err(), "{remote:?}");
    }

    /// No stamp stands for a hash that a change made while it was taken could have missed:
    /// the clock is read before the binary is hashed, and a stamp is written only when the
    /// binary last changed more than a second before that. Here the hash takes ten seconds
    /// (a `date` that says so once a hash tool has run).
    #[test]
    fn a_stamp_is_written_only_when_the_hash_began_after_the_change() {
        use std::os::unix::fs::{MetadataExt, PermissionsExt};
        let bytes = b"#!/bin/sh\necho stamped\n".to_vec();
        let (home, name, hash, binary) = uploaded(&bytes);
        let sh = fastcp_testsupport::tools::require("sh");
        let stamp = binary.with_file_name("stamp");
        let changed = std::fs::metadata(&binary).unwrap().ctime();
        let tools = tempfile::tempdir().unwrap();
        let hashed = tools.path().join("runs");
        let script = |body: &str| format!("#!/bin/sh\n{body}\n");
        for tool in ["openssl", "sha256sum", "shasum"] {
            let body = format!(
                "echo x >> '{}'\nexec /usr/bin/{tool} \"$@\"",
                hashed.display()
            );
            std::fs::write(tools.path().join(tool), script(&body)).unwrap();
        }
        let date = tools.path().join("date");
        let path = format!("{}:/usr/bin:/bin", tools.path().display());
        let launch = |before: i64| {
            let _ = std::fs::remove_file(&hashed);
            let body = format!(
                "[ -s '{}' ] && echo {} || echo {before}",
                hashed.display(),
                before + 10
            );
            std::fs::write(&date, script(&body)).unwrap();
            for tool in ["openssl", "sha256sum", "shasum", "date"] {
                let mode = std::fs::Permissions::from_mode(0o755);
                std::fs::set_permissions(tools.path().join(tool), mode).unwrap();
            }
            let out = run_with_path(
                &sh,
                &launch_script(&[(name.clone(), hash.clone())]),
                home.path(),
                b"",
                &path,
            );
            assert!(out.status.success(), "{out:?}");
        };
        // The hash began in the second of the change, or the next (a change time may be a
        // clock tick behind): no stamp.
        launch(changed);
        assert!(
            !stamp.exists(),
            "a hash begun in the second of the change is stamped"
        );
        launch(changed + 1);
        assert!(
            !stamp.exists(),
            "a hash begun a tick after the change is stamped"
        );
        // Begun later: stamped.
        launch(changed + 2);
        assert!(stamp.exists());
    }

    #[test]
    fn inspection_is_parsed_and_checked() {
        // A cache that is there but cannot be entered: nothing goes there, and the copy goes
        // over SFTP (Unsupported), as for a cache folder refused.
        let err = parse_inspection("unentered /home/u/.cache\n").unwrap_err();
        assert!(
            matches!(&err, Error::Unsupported(why) if why.contains("/home/u/.cache on the remote host cannot be entered")),
            "{err}"
        );
        let out = "os Linux\narch x86_64\nuid 1000\ndir /home/u/.cache/fastcp/0.1.0-ab\n\
                   libc glibc 2.36\nfolder 1000 700 /home/u/.cache\ncached 00\n";
        let r = parse_inspection(out).unwrap();
        assert_eq!(
            (r.os.as_str(), r.arch.as_str(), r.uid),
            ("Linux", "x86_64", 1000)
        );
        assert_eq!(r.glibc, Some((2, 36)));
        assert_eq!(r.folders, [(1000, 0o700, "/home/u/.cache".into())]);
        assert_eq!(r.cached.as_deref(), Some("(unreadable)"));
        assert_eq!(r.binary, None);
        let r = parse_inspection(&format!("{out}binary 1000 700\n")).unwrap();
        assert_eq!(r.binary, Some((1000, 0o700)));
        let r = parse_inspection(&format!("{out}binary ? ?\n")).unwrap();
        assert_eq!(r.binary, Some((u32::MAX, 0o777)));
        assert!(parse_inspection("os Linux\n").is_err());
        assert_eq!(parse_glibc("glibc 2.17"), Some((2, 17)));
        assert_eq!(parse_glibc(""), None);
    }

    #[test]
    fn this_binary_is_read_as_it_is_linked() {
        let exe = std::fs::read(std::env::current_exe().unwrap()).unwrap();
        if is_static(&exe) {
            assert_eq!(newest_glibc(&exe), None);
        } else {
            assert!(newest_glibc(&exe).is_some_and(|v| v >= (2, 2)));
        }
        assert!(!is_static(b"not an elf"));
    }
}
