//! `--checksum` over SFTP: the remote's files hashed where they are, by the remote's own
//! tools, so that none of their bytes cross the network to be compared.
//!
//! SFTP (OpenSSH's `sftp-server`) has no request that hashes a file. So a copy that goes
//! over SFTP with `--checksum` starts POSIX shells on the remote host (`exec sh -s`), feeds
//! each a script on its stdin (no path is ever in a command line the login shell parses),
//! and has them hash with the first tool found of `openssl dgst -sha256`, `sha256sum` and
//! `shasum -a 256`. The hash is [`ContentHash::Sha256`](fastcp_stream::ContentHash::Sha256):
//! files of up to [`SHA256_RANGE`] bytes are hashed many to a command, a bigger one range by
//! range (`dd | openssl`), and the shells (one per SFTP session, up to [`MAX_SHELLS`], but no
//! more than the host has cores) run at once, each taking the next batch or range as it
//! finishes one. The first starts with the first file wanted, so a copy that compares
//! nothing runs none. The shells get absolute paths, made from the SFTP server's own folder,
//! which need not be where a login shell starts (an `sftp-server -d`, a profile that changes
//! folder).
//!
//! Where no such shell runs (a `ForceCommand internal-sftp` account, a host without these
//! tools) or one stops answering, the remote hash of the files it had is unknown, and they
//! are sent, as rsync sends a file whose checksum it could not compute: the copy is still
//! right, only not cheaper. A warning says so, once.

use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use fastcp_stream::{Progress, SHA256_RANGE, sha256_of_ranges};
use fastcp_transport::{AnyTransport, BoxStream};
use futures_util::stream::{FuturesUnordered, StreamExt};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader, ReadHalf, WriteHalf};
use tokio::sync::{mpsc, oneshot};

use crate::Log;

/// Shells at most: channels on the copy's first SSH connection, beside its SFTP session,
/// well under OpenSSH's default `MaxSessions` of 10.
pub(crate) const MAX_SHELLS: usize = 4;
/// The most a shell may take to say which tool it hashes with, or, while it hashes, to say
/// anything: a digest or [`BUSY`], at least once every [`BUSY_BYTES`] bytes read. Under an
/// idle limit (`--timeout`), half of it: a shell that stops answering costs the files it
/// had being sent, not the copy.
const MAX_WAIT: Duration = Duration::from_secs(60);
/// The line a shell says after each [`BUSY_BYTES`] it hashed of a batch or range: a batch
/// or range takes as long as reading up to [`SHA256_RANGE`] bytes there, longer than a short
/// idle limit on a loaded host, and these lines, which count as data moving, tell such a
/// wait from a shell that stopped.
const BUSY: &str = ":busy";
/// The bytes hashed between two [`BUSY`] lines at most (fewer where a batch's files end).
const BUSY_BYTES: u64 = 4 << 20;
/// Lines a login may print before the shell's first answer.
const MAX_GREETING: usize = 1000;
/// Files hashed by one command at most.
const BATCH_FILES: usize = 1000;
/// The most bytes of paths in one command.
const BATCH_NAMES: usize = 64 << 10;
/// The longest line a shell may answer with: a digest and a path.
const MAX_LINE: usize = 64 << 10;
/// The line that ends each answer.
const END: &str = ":fastcp-end:";

/// The script that picks the hashing tool, as `h`, and says so with `:ready`, followed by
/// the number of the host's cores online, where it can tell.
const SETUP: &str = "\
if openssl dgst -sha256 -r /dev/null >/dev/null 2>&1; then h() { openssl dgst -sha256 -r \"$@\"; }
elif sha256sum /dev/null >/dev/null 2>&1; then h() { sha256sum \"$@\"; }
elif shasum -a 256 /dev/null >/dev/null 2>&1; then h() { shasum -a 256 \"$@\"; }
else echo :none; exit 0; fi
echo \":ready $(nproc 2>/dev/null || getconf _NPROCESSORS_ONLN 2>/dev/null || sysctl -n hw.ncpu 2>/dev/null)\"
";

/// Asks for remote files' [`ContentHash::Sha256`](fastcp_stream::ContentHash::Sha256);
/// cheap to clone. The hashing runs in the future [`Hasher::start`] returns with it.
#[derive(Clone)]
pub(crate) struct Hasher {
    requests: mpsc::UnboundedSender<Wanted>,
    /// The SFTP server's folder, which relative paths start from.
    base: Arc<str>,
}

/// A remote file whose hash is wanted.
struct Wanted {
    /// Absolute.
    path: String,
    size: u64,
    reply: oneshot::Sender<u128>,
}

impl Hasher {
    /// A hasher of the files at SFTP paths (relative ones start from `base`, the SFTP
    /// server's folder, absolute), and the future that hashes them with up to `shells`
    /// shells on `peer`, started as they are needed: run it beside the copy, and drop it when
    /// the copy is over. `idle_limit` is the copy's `--timeout`.
    pub(crate) fn start<'a>(
        peer: &'a AnyTransport,
        shells: usize,
        base: &str,
        idle_limit: Option<Duration>,
        progress: Arc<Progress>,
        log: &'a Log,
    ) -> (Hasher, impl Future<Output = ()> + 'a) {
        let (requests, wanted) = mpsc::unbounded_channel();
        let wait = shell_wait(idle_limit);
        let shells = shells.clamp(1, MAX_SHELLS);
        let work = run(peer, shells, wait, wanted, progress, log);
        let base = base.trim_end_matches('/').into();
        (Hasher { requests, base }, work)
    }

    /// The hash of the file at SFTP path `path`, hashed as `size` bytes long; `None` when it
    /// cannot be known (see the module's documentation).
    pub(crate) async fn hash(&self, path: &str, size: u64) -> Option<u128> {
        self.request(path, size).wait().await
    }

    /// Asks for [`hash`](Self::hash) now, to wait for it later. Dropped before it is
    /// hashed, the request is not.
    pub(crate) fn request(&self, path: &str, size: u64) -> Pending {
        let (reply, answer) = oneshot::channel();
        let path = match path.starts_with('/') {
            true => path.to_string(),
            false => format!("{}/{path}", self.base),
        };
        // Gone, the hashing says "unknown": the sender is dropped with the request.
        let _ = self.requests.send(Wanted { path, size, reply });
        Pending(answer)
    }
}

/// How long a shell may stay silent under the copy's idle limit: half of it, so that a
/// shell that stopped answering is given up (and its files sent) before the copy as a
/// whole is taken for stalled; without one, [`MAX_WAIT`].
fn shell_wait(idle_limit: Option<Duration>) -> Duration {
    match idle_limit.filter(|l| !l.is_zero()) {
        Some(limit) => (limit / 2).min(MAX_WAIT),
        None => MAX_WAIT,
    }
}

/// A hash asked for with [`Hasher::request`].
pub(crate) struct Pending(oneshot::Receiver<u128>);

impl Pending {
    /// The hash, or `None` when it cannot be known.
    pub(crate) async fn wait(self) -> Option<u128> {
        self.0.await.ok()
    }
}

/// Runs `work` with `helper`, if any, beside it until `work` is done.
pub(crate) async fn alongside<T>(
    work: impl Future<Output = T>,
    helper: Option<impl Future<Output = ()>>,
) -> T {
    let helper = async move {
        match helper {
            Some(helper) => helper.await,
            None => std::future::pending().await,
        }
    };
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
                // A command of its own each time the files so far hold `BUSY_BYTES`.
                let mut s = String::from("h");
                let mut bytes = 0;
                for f in files {
                    if bytes >= BUSY_BYTES {
                        s.push_str(" </dev/null 2>/dev/null; echo ");
                        s.push_str(BUSY);
                        s.push_str("; h");
                        bytes = 0;
                    }
                    s.push(' ');
                    s.push_str(&quote(&f.path));
                    bytes += f.size;
                }
                s.push_str(" </dev/null 2>/dev/null");
                s
            }
            Unit::Range {
                path, index, last, ..
            } => {
                // Blocks of 64 KiB: as fast through the pipe as any, on the hosts tried. Read
                // by `BUSY_BYTES` into one hash, each piece followed by a `BUSY` line on the
                // shell's own output (3); the last range on to the end of the file.
                let (blocks, piece) = (SHA256_RANGE >> 16, BUSY_BYTES >> 16);
                let (path, skip) = (quote(path), *index as u64 * blocks);
                let rest = match last {
                    true => format!(" dd if={path} bs=65536 skip={} 2>/dev/null;", skip + blocks),
                    false => String::new(),
                };
                format!(
                    "{{ {{ i=0; while [ $i -lt {pieces} ]; do dd if={path} bs=65536 \
                     skip=$(({skip} + i * {piece})) count={piece} 2>/dev/null; echo {BUSY} >&3; \
                     i=$((i + 1)); done;{rest} }} | h 2>/dev/null; }} 3>&1",
                    pieces = blocks / piece,
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
                let mut file = file.lock().unwrap_or_else(|p| p.into_inner());
                let Some((digest, _)) = lines.first().and_then(|l| parse(l)) else {
                    // Unknown, and so the whole file: its other ranges are not hashed.
                    file.reply = None;
                    return;
                };
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
    /// The host's cores online, as the shell counted them, if it could.
    cores: Option<usize>,
}

/// Why a shell did not start.
enum NotStarted {
    /// It runs, but has no tool: no other shell there will have one.
    NoTool,
    /// It could not start, or did not answer.
    Failed(String),
}

/// What a shell's first answer says: `Some(cores)` when it has a tool (`cores` is `None`
/// where the host did not say), `None` when it has none (`:none`); not an answer at all (a
/// line a login script printed) is `Err`.
fn ready(line: &[u8]) -> Result<Option<Option<usize>>, ()> {
    if line == b":none" {
        return Ok(None);
    }
    let cores = match line.strip_prefix(b":ready") {
        Some(b"") => None,
        Some(rest) if rest.starts_with(b" ") => std::str::from_utf8(rest)
            .ok()
            .and_then(|c| c.trim().parse().ok())
            .filter(|&c| c > 0),
        _ => return Err(()),
    };
    Ok(Some(cores))
}

impl Shell {
    /// A shell on `peer`, its tool picked, within `wait` (its channel's opening included).
    async fn start(
        peer: &AnyTransport,
        wait: Duration,
        progress: Arc<Progress>,
    ) -> Result<Shell, NotStarted> {
        match tokio::time::timeout(wait, Shell::start_unbounded(peer, progress)).await {
            Ok(started) => started,
            Err(_) => Err(NotStarted::Failed(format!(
                "its shell did not answer within {} s",
                wait.as_secs_f32()
            ))),
        }
    }

    async fn start_unbounded(
        peer: &AnyTransport,
        progress: Arc<Progress>,
    ) -> Result<Shell, NotStarted> {
        let process = peer
            .exec("exec sh -s")
            .await
            .map_err(|e| NotStarted::Failed(format!("cannot run a shell there: {e}")))?;
        // Its answers count as data moving, for the idle limit.
        let stream: BoxStream = Box::new(fastcp_stream::Counted::new(process.stream, progress));
        let (read, write) = tokio::io::split(stream);
        let mut shell = Shell {
            write,
            read: BufReader::new(read),
            cores: None,
        };
        let answer = async {
            shell.write.write_all(SETUP.as_bytes()).await?;
            // What a login script printed comes first.
            for _ in 0..MAX_GREETING {
                match shell.line().await? {
                    Some(line) => {
                        if let Ok(cores) = ready(&line) {
                            return Ok(Some(cores));
                        }
                    }
                    None => return Ok(None),
                }
            }
            Ok::<_, std::io::Error>(None)
        };
        match answer.await {
            Ok(Some(Some(cores))) => {
                shell.cores = cores;
                Ok(shell)
            }
            Ok(Some(None)) => Err(NotStarted::NoTool),
            Ok(None) | Err(_) => Err(NotStarted::Failed(
                "it runs no shell commands (an SFTP-only account?)".into(),
            )),
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

    /// Hashes `unit`, answering its requests; on failure, says why (and a big file's other
    /// ranges are not hashed: its hash is unknown).
    async fn hash(&mut self, unit: Unit, wait: Duration) -> Result<(), String> {
        let script = unit.script();
        let abandon = |unit: Unit| {
            if let Unit::Range { file, .. } = unit {
                file.lock().unwrap_or_else(|p| p.into_inner()).reply = None;
            }
        };
        // Each step within `wait`, not the whole: a big range takes as long as it takes,
        // while the shell says it is getting on.
        let work = async {
            within(wait, self.write.write_all(script.as_bytes())).await?;
            let mut lines = Vec::new();
            loop {
                match within(wait, self.line()).await? {
                    Some(line) if line == END.as_bytes() => return Ok::<_, std::io::Error>(lines),
                    Some(line) if line == BUSY.as_bytes() => {}
                    Some(line) => lines.push(line),
                    None => return Err(std::io::ErrorKind::UnexpectedEof.into()),
                }
            }
        };
        let lines = match work.await {
            Ok(lines) => lines,
            Err(e) if e.kind() == std::io::ErrorKind::TimedOut => {
                abandon(unit);
                return Err(format!(
                    "a remote shell hashed nothing for {} s",
                    wait.as_secs_f32()
                ));
            }
            Err(e) => {
                abandon(unit);
                return Err(format!("a remote shell stopped: {e}"));
            }
        };
        unit.answer(lines);
        Ok(())
    }
}

/// `step`, or `TimedOut` when it takes longer than `wait`.
async fn within<T>(
    wait: Duration,
    step: impl Future<Output = std::io::Result<T>>,
) -> std::io::Result<T> {
    tokio::time::timeout(wait, step)
        .await
        .unwrap_or_else(|_| Err(std::io::ErrorKind::TimedOut.into()))
}

/// What became of a unit handed to a shell.
enum Outcome {
    /// A shell started for it: it is hashed there next.
    Started(Shell, Unit),
    /// Hashed; the shell is free for another.
    Hashed(Shell),
    /// No shell started for it: the unit comes back.
    NotStarted(Unit, NotStarted),
    /// The shell stopped during it: its files are sent.
    Lost(String),
}

/// A shell's work on `unit`, as [`run`] keeps it.
type Running<'a> = Pin<Box<dyn Future<Output = Outcome> + Send + 'a>>;

/// `shell` hashing `unit`.
fn hash<'a>(mut shell: Shell, unit: Unit, wait: Duration) -> Running<'a> {
    Box::pin(async move {
        match shell.hash(unit, wait).await {
            Ok(()) => Outcome::Hashed(shell),
            Err(why) => Outcome::Lost(why),
        }
    })
}

/// Hands the wanted files, as batches and ranges, to up to `shells` shells until no more
/// can come. The first shell starts with the first file wanted; the others, once it has
/// said how many cores the host has, and only as many as that: each shell is a login (a
/// login shell's start can cost more than hashing a batch), and more hashing at once than
/// the host has cores gains nothing. A shell that does not start (a server that allows
/// fewer channels) leaves the work to those that did; only when none does, or one has no
/// tool, is the host taken for one that cannot hash, and every file then said unknown. A
/// shell that stops answering is not replaced, so that a host whose tools hang costs one
/// wait per shell at most; with the last one gone, what is left is said unknown.
async fn run(
    peer: &AnyTransport,
    shells: usize,
    wait: Duration,
    mut wanted: mpsc::UnboundedReceiver<Wanted>,
    progress: Arc<Progress>,
    log: &Log,
) {
    let mut queue = Queue::default();
    let mut idle: Vec<Shell> = Vec::new();
    let mut running: FuturesUnordered<Running<'_>> = FuturesUnordered::new();
    let mut open = true;
    let mut unavailable = false;
    let mut lost = false;
    // One shell until the first has started, then as many as the host has cores.
    let mut limit = 1;
    let mut counted = false;
    loop {
        while !unavailable && running.len() < limit {
            let Some(unit) = queue.next() else { break };
            match idle.pop() {
                Some(shell) => running.push(hash(shell, unit, wait)),
                None => {
                    let progress = progress.clone();
                    running.push(Box::pin(async move {
                        match Shell::start(peer, wait, progress).await {
                            Ok(shell) => Outcome::Started(shell, unit),
                            Err(why) => Outcome::NotStarted(unit, why),
                        }
                    }));
                }
            }
        }
        if unavailable {
            // Dropped: each says "unknown".
            queue = Queue::default();
        }
        if !open && running.is_empty() && queue.is_empty() {
            return;
        }
        tokio::select! {
            w = wanted.recv(), if open => match w {
                Some(w) if !unavailable => queue.add(w),
                Some(_) => {}
                None => open = false,
            },
            Some(done) = running.next() => match done {
                Outcome::Hashed(shell) => idle.push(shell),
                Outcome::Started(shell, unit) => {
                    if !counted {
                        counted = true;
                        limit = shells.min(shell.cores.unwrap_or(shells));
                    }
                    running.push(hash(shell, unit, wait));
                }
                Outcome::NotStarted(unit, why) => {
                    // The shells that run (or are starting) go on with it.
                    let others = running.len() + idle.len();
                    match why {
                        NotStarted::Failed(_) if others > 0 => {
                            limit = others;
                            queue.put_back(unit);
                        }
                        why => {
                            let why = match why {
                                NotStarted::NoTool => {
                                    "it has none of openssl, sha256sum and shasum".into()
                                }
                                NotStarted::Failed(why) => why,
                            };
                            if !unavailable {
                                log.warn(|| format!(
                                    "--checksum: the remote host cannot hash its files \
                                     ({why}): files of the same size as their source's are \
                                     sent"
                                ));
                            }
                            unavailable = true;
                        }
                    }
                }
                Outcome::Lost(why) => {
                    if !lost {
                        log.warn(|| format!(
                            "--checksum: {why}; the files it had are sent (said once)"
                        ));
                    }
                    lost = true;
                    // Not replaced: where one shell stopped answering, the next would likely
                    // stop too, each costing a whole wait. The others go on; once none is
                    // left, the files still waiting are sent.
                    limit = limit.saturating_sub(1);
                    unavailable |= limit == 0;
                }
            },
        }
    }
}

/// The work waiting for a shell: files to hash by name, and ranges.
#[derive(Default)]
struct Queue {
    small: VecDeque<Wanted>,
    ranges: VecDeque<Unit>,
}

impl Queue {
    fn add(&mut self, w: Wanted) {
        // A name a line could not carry is hashed as a range of its own.
        let odd_name = w.path.contains(['\n', '\r', '\\']);
        if w.size <= SHA256_RANGE && !odd_name {
            self.small.push_back(w);
            return;
        }
        let n = w.size.div_ceil(SHA256_RANGE).max(1) as usize;
        let file = Arc::new(Mutex::new(BigFile {
            digests: vec![None; n],
            reply: Some(w.reply),
        }));
        self.ranges.extend((0..n).map(|index| Unit::Range {
            path: w.path.clone(),
            index,
            last: index + 1 == n,
            file: file.clone(),
        }));
    }

    /// The next unit to hash, passing over what is no longer wanted.
    fn next(&mut self) -> Option<Unit> {
        while let Some(range) = self.ranges.pop_front() {
            if let Unit::Range { file, .. } = &range {
                let file = file.lock().unwrap_or_else(|p| p.into_inner());
                if file.reply.as_ref().is_none_or(|r| r.is_closed()) {
                    continue;
                }
            }
            return Some(range);
        }
        self.small.retain(|w| !w.reply.is_closed());
        batch(&mut self.small)
    }

    fn put_back(&mut self, unit: Unit) {
        match unit {
            Unit::Files(files) => {
                for w in files.into_iter().rev() {
                    self.small.push_front(w);
                }
            }
            range => self.ranges.push_front(range),
        }
    }

    fn is_empty(&self) -> bool {
        self.small.is_empty() && self.ranges.is_empty()
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
    fn a_shells_first_answer_says_its_tool_and_cores() {
        assert_eq!(ready(b":ready 8"), Ok(Some(Some(8))));
        // A host that cannot count its cores, or says nonsense, did not say.
        assert_eq!(ready(b":ready "), Ok(Some(None)));
        assert_eq!(ready(b":ready"), Ok(Some(None)));
        assert_eq!(ready(b":ready 0"), Ok(Some(None)));
        assert_eq!(ready(b":ready x"), Ok(Some(None)));
        assert_eq!(ready(b":none"), Ok(None));
        // Not the shell's answer: what a login script printed.
        assert_eq!(ready(b"Welcome, :ready 8"), Err(()));
        assert_eq!(ready(b":readyX"), Err(()));
    }

    /// What nobody waits for any more (a file the receiver turned out to lack) is not
    /// hashed: neither a small file nor any range of a big one.
    #[test]
    fn the_queue_passes_over_requests_no_longer_wanted() {
        let mut queue = Queue::default();
        let mut kept = Vec::new();
        for (size, keep) in [(10, false), (SHA256_RANGE * 2, false), (20, true)] {
            let (reply, answer) = oneshot::channel();
            queue.add(Wanted {
                path: "/f".into(),
                size,
                reply,
            });
            if keep {
                kept.push(answer);
            }
        }
        match queue.next() {
            Some(Unit::Files(files)) => {
                assert_eq!(files.iter().map(|f| f.size).collect::<Vec<_>>(), [20]);
            }
            _ => panic!("the small file still wanted"),
        }
        assert!(queue.next().is_none());
        assert!(queue.is_empty());
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

    /// Under any idle limit, even a second, a silent shell is given up before the limit
    /// ends the copy: its files are sent, and the copy goes on.
    #[test]
    fn a_silent_shell_is_given_up_before_the_idle_limit() {
        for ms in [200, 1000, 1500, 2000, 4000, 600_000] {
            let limit = Duration::from_millis(ms);
            let wait = shell_wait(Some(limit));
            assert!(wait < limit && !wait.is_zero(), "{limit:?}: {wait:?}");
        }
        assert_eq!(shell_wait(None), MAX_WAIT);
        assert_eq!(shell_wait(Some(Duration::ZERO)), MAX_WAIT);
    }

    /// A range of one file, and its reply.
    fn one_range(path: &str) -> (Unit, oneshot::Receiver<u128>) {
        let (reply, answer) = oneshot::channel();
        let file = Arc::new(Mutex::new(BigFile {
            digests: vec![None],
            reply: Some(reply),
        }));
        let unit = Unit::Range {
            path: path.into(),
            index: 0,
            last: true,
            file,
        };
        (unit, answer)
    }

    /// A shell on one end of a pipe; the other end plays the remote.
    fn piped() -> (Shell, tokio::io::DuplexStream) {
        let (ours, theirs) = tokio::io::duplex(64 << 10);
        let (read, write) = tokio::io::split(Box::new(ours) as BoxStream);
        let shell = Shell {
            write,
            read: BufReader::new(read),
            cores: None,
        };
        (shell, theirs)
    }

    /// A range that takes many times the wait to hash is hashed, not given up, as long as
    /// the shell says it is getting on; one that goes silent for the wait is given up.
    #[tokio::test(start_paused = true)]
    async fn a_slow_hash_that_says_it_is_busy_is_not_a_stall() {
        let wait = Duration::from_secs(1);
        let hex = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad";
        for (pause, hashed) in [(wait / 2, true), (wait * 2, false)] {
            let (mut shell, remote) = piped();
            let remote = tokio::spawn(async move {
                let (read, mut write) = tokio::io::split(remote);
                let mut script = String::new();
                BufReader::new(read).read_line(&mut script).await.unwrap();
                for _ in 0..10 {
                    tokio::time::sleep(pause).await;
                    write.write_all(format!("{BUSY}\n").as_bytes()).await?;
                }
                write
                    .write_all(format!("{hex} *stdin\n{END}\n").as_bytes())
                    .await?;
                Ok::<_, std::io::Error>(script)
            });
            let (unit, answer) = one_range("/big");
            let outcome = shell.hash(unit, wait).await;
            assert_eq!(outcome.is_ok(), hashed, "{outcome:?}");
            assert_eq!(
                answer.await.ok(),
                hashed.then(|| {
                    let (digest, _) = parse(hex.as_bytes()).unwrap();
                    sha256_of_ranges(&[digest])
                })
            );
            drop(shell);
            if hashed {
                assert!(remote.await.unwrap().unwrap().contains(BUSY));
            }
        }
    }

    /// The range script reads its range piece by piece into one hash: the digest is the
    /// range's, here a whole file of several pieces read to its end.
    #[test]
    fn a_range_read_in_pieces_hashes_as_one() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("big file");
        let content: Vec<u8> = (0..BUSY_BYTES * 2 + 12345)
            .map(|i| (i * 7 % 251) as u8)
            .collect();
        std::fs::write(&path, &content).unwrap();
        let (unit, _answer) = one_range(path.to_str().unwrap());
        let out = std::process::Command::new("sh")
            .args(["-c", &format!("{SETUP}{}", unit.script())])
            .output()
            .unwrap();
        let out = String::from_utf8_lossy(&out.stdout);
        let lines: Vec<&str> = out.lines().collect();
        assert!(lines[0].starts_with(":ready"), "{out}");
        let busy = lines.iter().filter(|l| **l == BUSY).count() as u64;
        assert_eq!(busy, SHA256_RANGE / BUSY_BYTES, "{out}");
        let digest = lines
            .iter()
            .find_map(|l| parse(l.as_bytes()))
            .expect("a digest");
        let want = ring::digest::digest(&ring::digest::SHA256, &content);
        assert_eq!(digest.0[..], *want.as_ref(), "{out}");
        assert_eq!(lines.last(), Some(&END), "{out}");
    }
}
