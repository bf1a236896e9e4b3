//! `--checksum` over SFTP: the remote's files hashed where they are, by the remote's own
//! tools, so that none of their bytes cross the network to be compared.
//!
//! SFTP (OpenSSH's `sftp-server`) has no request that hashes a file. So a copy that goes
//! over SFTP with `--checksum` starts POSIX shells on the remote host (`exec sh -s`), feeds
//! each a script on its stdin (no path is ever in a command line the login shell parses),
//! and has them hash with the first tool found of `openssl dgst -sha256`, `sha256sum` and
//! `shasum -a 256`. The hash is [`ContentHash::Sha256`](fastcp_stream::ContentHash::Sha256):
//! files of up to [`SHA256_RANGE`] bytes are hashed many to a command, a bigger one range by
//! range (`dd | openssl`), and the shells, [`Hasher::start`]'s `shells` of them, run at
//! once, each taking the next batch or range as it finishes one.
//!
//! Where no such shell runs (a `ForceCommand internal-sftp` account, a host without these
//! tools) or one stops answering, the remote hash of the files it had is unknown, and they
//! are sent, as rsync sends a file whose checksum it could not compute: the copy is still
//! right, only not cheaper. A warning says so, once.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use fastcp_stream::{Progress, SHA256_RANGE, sha256_of_ranges};
use fastcp_transport::{AnyTransport, BoxStream};
use futures_util::stream::{FuturesUnordered, StreamExt};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader, ReadHalf, WriteHalf};
use tokio::sync::{mpsc, oneshot};

use crate::Log;

/// How long a shell may take to say which tool it hashes with.
const READY_WAIT: Duration = Duration::from_secs(20);
/// How long one batch or range may take to hash (at most [`SHA256_RANGE`] bytes: more than a
/// minute only on a machine that hashes under 4 MB/s, or one that stopped).
const UNIT_WAIT: Duration = Duration::from_secs(60);
/// Files hashed by one command at most.
const BATCH_FILES: usize = 1000;
/// The most bytes of paths in one command.
const BATCH_NAMES: usize = 64 << 10;
/// The longest line a shell may answer with: a digest and a path.
const MAX_LINE: usize = 64 << 10;
/// The line that ends each answer.
const END: &str = ":fastcp-end:";

/// The script that picks the hashing tool, as `h`, and says so with `:ready`.
const SETUP: &str = "\
if openssl dgst -sha256 -r /dev/null >/dev/null 2>&1; then h() { openssl dgst -sha256 -r \"$@\"; }
elif sha256sum /dev/null >/dev/null 2>&1; then h() { sha256sum \"$@\"; }
elif shasum -a 256 /dev/null >/dev/null 2>&1; then h() { shasum -a 256 \"$@\"; }
else echo :none; exit 0; fi
echo :ready
";

/// Asks for remote files' [`ContentHash::Sha256`](fastcp_stream::ContentHash::Sha256);
/// cheap to clone. The hashing runs in the future [`Hasher::start`] returns with it.
#[derive(Clone)]
pub(crate) struct Hasher {
    requests: mpsc::UnboundedSender<Wanted>,
}

/// A remote file whose hash is wanted.
struct Wanted {
    /// As the remote shell reaches it: relative to the login folder, or absolute.
    path: String,
    size: u64,
    reply: oneshot::Sender<u128>,
}

impl Hasher {
    /// A hasher, and the future that hashes with up to `shells` shells on `peer` (started
    /// as they are needed): run it beside the copy, and drop it when the copy is over.
    pub(crate) fn start<'a>(
        peer: &'a AnyTransport,
        shells: usize,
        progress: Arc<Progress>,
        log: &'a Log,
    ) -> (Hasher, impl Future<Output = ()> + 'a) {
        let (requests, wanted) = mpsc::unbounded_channel();
        let work = run(peer, shells.max(1), wanted, progress, log);
        (Hasher { requests }, work)
    }

    /// The remote file `path`'s hash, hashed as `size` bytes long; `None` when it cannot be
    /// known (see the module's documentation).
    pub(crate) async fn hash(&self, path: &str, size: u64) -> Option<u128> {
        let (reply, answer) = oneshot::channel();
        let path = match path.starts_with('-') {
            // Never taken for an option.
            true => format!("./{path}"),
            false => path.to_string(),
        };
        self.requests.send(Wanted { path, size, reply }).ok()?;
        answer.await.ok()
    }
}

/// Runs `work` with `helper` beside it until `work` is done.
pub(crate) async fn alongside<T>(
    work: impl Future<Output = T>,
    helper: impl Future<Output = ()>,
) -> T {
    tokio::pin!(work, helper);
    let mut helping = true;
    loop {
        tokio::select! {
            done = &mut work => return done,
            () = &mut helper, if helping => helping = false,
        }
    }
}

/// What one command hashes: files whole, by name, or one range of a big file.
enum Unit {
    Files(Vec<Wanted>),
    Range {
        path: String,
        index: usize,
        /// The range's last: hashed to the end of the file, so that a file grown since it
        /// was listed does not hash as its old self.
        last: bool,
        file: Arc<Mutex<BigFile>>,
    },
}

/// A file hashed range by range: the digests so far. Its reply goes once every range has a
/// digest; a range that gets none drops its handle, and with the last handle the reply,
/// which then says "unknown".
struct BigFile {
    digests: Vec<Option<[u8; 32]>>,
    reply: Option<oneshot::Sender<u128>>,
}

impl Unit {
    /// The script that hashes it, ending its answer with [`END`].
    fn script(&self) -> String {
        let quote = fastcp_transport::ssh::shell_quote;
        let mut s = match self {
            Unit::Files(files) => {
                let mut s = String::from("h");
                for f in files {
                    s.push(' ');
                    s.push_str(&quote(&f.path));
                }
                s.push_str(" </dev/null 2>/dev/null");
                s
            }
            Unit::Range {
                path, index, last, ..
            } => {
                let blocks = SHA256_RANGE >> 20;
                let count = match last {
                    true => String::new(),
                    false => format!(" count={blocks}"),
                };
                format!(
                    "dd if={} bs=1048576 skip={}{count} 2>/dev/null | h 2>/dev/null",
                    quote(path),
                    *index as u64 * blocks
                )
            }
        };
        s.push_str("; echo ");
        s.push_str(END);
        s.push('\n');
        s
    }

    /// Takes the answer's lines: a digest and a name for each file hashed (none for one
    /// that could not be read), or one digest for a range.
    fn answer(self, lines: Vec<Vec<u8>>) {
        match self {
            Unit::Files(files) => {
                let mut files = files.into_iter();
                for line in &lines {
                    let Some((digest, name)) = parse(line) else {
                        continue;
                    };
                    let Some(name) = name else { continue };
                    // In the order asked: the files before this one got no line.
                    for f in files.by_ref() {
                        if f.path.as_bytes() == name {
                            let _ = f.reply.send(sha256_of_ranges(&[digest]));
                            break;
                        }
                    }
                }
            }
            Unit::Range { index, file, .. } => {
                let Some((digest, _)) = lines.first().and_then(|l| parse(l)) else {
                    return;
                };
                let mut file = file.lock().unwrap_or_else(|p| p.into_inner());
                file.digests[index] = Some(digest);
                if let Some(all) = file.digests.iter().copied().collect::<Option<Vec<_>>>()
                    && let Some(reply) = file.reply.take()
                {
                    let _ = reply.send(sha256_of_ranges(&all));
                }
            }
        }
    }
}

/// A line of a hashing tool's answer: the digest, and the name it was given, if any.
/// `openssl dgst -r` writes `HEX *NAME`, `sha256sum` and `shasum` `HEX  NAME`; for their
/// standard input, `*stdin` or `-`.
fn parse(line: &[u8]) -> Option<([u8; 32], Option<&[u8]>)> {
    let hex = line.get(..64)?;
    let mut digest = [0u8; 32];
    for (i, pair) in hex.chunks(2).enumerate() {
        let pair = std::str::from_utf8(pair).ok()?;
        digest[i] = u8::from_str_radix(pair, 16).ok()?;
    }
    let name = line.get(64..).and_then(|rest| {
        rest.strip_prefix(b" *")
            .or_else(|| rest.strip_prefix(b"  "))
    });
    Some((digest, name))
}

/// A remote shell that hashes, its tool picked.
struct Shell {
    write: WriteHalf<BoxStream>,
    read: BufReader<ReadHalf<BoxStream>>,
}

/// Why a unit got no answer.
enum Lost {
    /// No shell could start, or none has a tool: none will.
    Unavailable(String),
    /// This shell stopped answering: another may still.
    Shell(String),
}

impl Shell {
    async fn start(peer: &AnyTransport, progress: Arc<Progress>) -> Result<Shell, Lost> {
        let process = peer
            .exec("exec sh -s")
            .await
            .map_err(|e| Lost::Unavailable(format!("cannot run a shell there: {e}")))?;
        // Its answers count as data moving, for the idle limit.
        let stream: BoxStream = Box::new(fastcp_stream::Counted::new(process.stream, progress));
        let (read, write) = tokio::io::split(stream);
        let mut shell = Shell {
            write,
            read: BufReader::new(read),
        };
        let ready = async {
            shell.write.write_all(SETUP.as_bytes()).await?;
            shell.line().await
        };
        match tokio::time::timeout(READY_WAIT, ready).await {
            Ok(Ok(Some(line))) if line == b":ready" => Ok(shell),
            Ok(Ok(Some(line))) if line == b":none" => Err(Lost::Unavailable(
                "it has none of openssl, sha256sum and shasum".into(),
            )),
            Ok(Ok(_)) | Ok(Err(_)) => Err(Lost::Unavailable(
                "it runs no shell commands (an SFTP-only account?)".into(),
            )),
            Err(_) => Err(Lost::Unavailable(format!(
                "its shell did not start within {} s",
                READY_WAIT.as_secs()
            ))),
        }
    }

    /// The next line, without its newline; `None` at the end.
    async fn line(&mut self) -> std::io::Result<Option<Vec<u8>>> {
        let mut line = Vec::new();
        let n = (&mut self.read)
            .take(MAX_LINE as u64 + 1)
            .read_until(b'\n', &mut line)
            .await?;
        if n == 0 {
            return Ok(None);
        }
        if line.pop() != Some(b'\n') {
            return Err(std::io::Error::other("an answer line too long, or cut"));
        }
        Ok(Some(line))
    }

    /// Hashes `unit`, answering its requests.
    async fn hash(&mut self, unit: Unit) -> Result<(), Lost> {
        let script = unit.script();
        let work = async {
            self.write.write_all(script.as_bytes()).await?;
            let mut lines = Vec::new();
            loop {
                match self.line().await? {
                    Some(line) if line == END.as_bytes() => return Ok::<_, std::io::Error>(lines),
                    Some(line) => lines.push(line),
                    None => return Err(std::io::ErrorKind::UnexpectedEof.into()),
                }
            }
        };
        let lines = match tokio::time::timeout(UNIT_WAIT, work).await {
            Ok(Ok(lines)) => lines,
            Ok(Err(e)) => return Err(Lost::Shell(format!("a remote shell stopped: {e}"))),
            Err(_) => {
                return Err(Lost::Shell(format!(
                    "a remote shell hashed nothing for {} s",
                    UNIT_WAIT.as_secs()
                )));
            }
        };
        unit.answer(lines);
        Ok(())
    }
}

/// Hands the wanted files, as batches and ranges, to up to `shells` shells until no more
/// can come.
async fn run(
    peer: &AnyTransport,
    shells: usize,
    mut wanted: mpsc::UnboundedReceiver<Wanted>,
    progress: Arc<Progress>,
    log: &Log,
) {
    let mut small: VecDeque<Wanted> = VecDeque::new();
    let mut ranges: VecDeque<Unit> = VecDeque::new();
    let mut idle: Vec<Shell> = Vec::new();
    let mut running = FuturesUnordered::new();
    let mut open = true;
    let mut unavailable = false;
    loop {
        while !unavailable && running.len() < shells {
            let Some(unit) = ranges.pop_front().or_else(|| batch(&mut small)) else {
                break;
            };
            let shell = idle.pop();
            let progress = progress.clone();
            running.push(async move {
                let mut shell = match shell {
                    Some(shell) => shell,
                    None => Shell::start(peer, progress).await?,
                };
                shell.hash(unit).await.map(|()| shell)
            });
        }
        if unavailable {
            // Dropped: each says "unknown".
            small.clear();
            ranges.clear();
        }
        if !open && running.is_empty() && small.is_empty() && ranges.is_empty() {
            return;
        }
        tokio::select! {
            w = wanted.recv(), if open => match w {
                Some(w) if w.size > SHA256_RANGE && !unavailable => {
                    let n = w.size.div_ceil(SHA256_RANGE) as usize;
                    let file = Arc::new(Mutex::new(BigFile {
                        digests: vec![None; n],
                        reply: Some(w.reply),
                    }));
                    ranges.extend((0..n).map(|index| Unit::Range {
                        path: w.path.clone(),
                        index,
                        last: index + 1 == n,
                        file: file.clone(),
                    }));
                }
                // A name a line could not carry is hashed as a range of its own.
                Some(w) if w.path.contains(['\n', '\r', '\\']) && !unavailable => {
                    let file = Arc::new(Mutex::new(BigFile {
                        digests: vec![None],
                        reply: Some(w.reply),
                    }));
                    ranges.push_back(Unit::Range { path: w.path, index: 0, last: true, file });
                }
                Some(w) if !unavailable => small.push_back(w),
                Some(_) => {}
                None => open = false,
            },
            Some(done) = running.next() => match done {
                Ok(shell) => idle.push(shell),
                Err(Lost::Unavailable(why)) => {
                    if !unavailable {
                        log.warn(|| format!(
                            "--checksum: the remote host cannot hash its files ({why}): files \
                             of the same size as their source's are sent"
                        ));
                    }
                    unavailable = true;
                }
                Err(Lost::Shell(why)) => log.warn(|| format!(
                    "--checksum: {why}; the files it had are sent"
                )),
            },
        }
    }
}

/// The next files to hash by name, up to [`BATCH_FILES`] of them, [`SHA256_RANGE`] bytes and
/// [`BATCH_NAMES`] bytes of names.
fn batch(small: &mut VecDeque<Wanted>) -> Option<Unit> {
    let mut files = Vec::new();
    let (mut bytes, mut names) = (0, 0);
    while let Some(next) = small.front() {
        let full = files.len() == BATCH_FILES
            || bytes + next.size > SHA256_RANGE
            || names + next.path.len() > BATCH_NAMES;
        if full && !files.is_empty() {
            break;
        }
        bytes += next.size;
        names += next.path.len();
        files.push(small.pop_front().expect("a front"));
    }
    (!files.is_empty()).then_some(Unit::Files(files))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_three_tools_answer_lines_parse() {
        let hex = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad";
        for (line, name) in [
            (format!("{hex} *a b"), Some(&b"a b"[..])),
            (format!("{hex}  ./-x"), Some(&b"./-x"[..])),
            (hex.to_string(), None),
        ] {
            let (digest, got) = parse(line.as_bytes()).unwrap();
            assert_eq!(digest[..4], [0xba, 0x78, 0x16, 0xbf]);
            assert_eq!(got, name);
        }
        assert!(parse(format!("{}g", &hex[..63]).as_bytes()).is_none());
        assert!(parse(b"sha256sum: a: No such file").is_none());
    }

    #[test]
    fn a_batch_stops_at_its_bytes_but_takes_at_least_one_file() {
        let mut small: VecDeque<Wanted> = [SHA256_RANGE, 1, SHA256_RANGE - 1, 2]
            .into_iter()
            .map(|size| Wanted {
                path: "f".into(),
                size,
                reply: oneshot::channel().0,
            })
            .collect();
        let sizes = |u: Unit| match u {
            Unit::Files(f) => f.iter().map(|w| w.size).collect::<Vec<_>>(),
            Unit::Range { .. } => unreachable!(),
        };
        assert_eq!(sizes(batch(&mut small).unwrap()), [SHA256_RANGE]);
        assert_eq!(sizes(batch(&mut small).unwrap()), [1, SHA256_RANGE - 1]);
        assert_eq!(sizes(batch(&mut small).unwrap()), [2]);
        assert!(batch(&mut small).is_none());
    }
}
