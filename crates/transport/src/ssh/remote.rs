//! A command started on the peer: its stdio stream, its stderr and its exit status.

use std::fmt;

use bytes::Bytes;
use tokio::io::{AsyncWrite, AsyncWriteExt};
use tokio::sync::{mpsc, oneshot};

use super::Error;
use crate::BoxStream;

/// How a remote command ended.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ExitStatus {
    /// It exited with this code.
    Code(u32),
    /// It was killed by a signal.
    Signal {
        /// Signal name without `SIG` (`TERM`, `KILL`...).
        name: String,
        /// Whether it dumped core.
        core_dumped: bool,
        /// Message from the server, often empty.
        message: String,
    },
}

impl ExitStatus {
    /// Exit code 0.
    pub fn success(&self) -> bool {
        matches!(self, ExitStatus::Code(0))
    }

    /// The exit code, if it exited normally.
    pub fn code(&self) -> Option<u32> {
        match self {
            ExitStatus::Code(c) => Some(*c),
            ExitStatus::Signal { .. } => None,
        }
    }

    /// Exit code 127: the remote shell did not find the program (fastcp is not installed
    /// there, or not on the non-interactive `PATH`; see `--remote-path`).
    pub fn is_command_not_found(&self) -> bool {
        matches!(self, ExitStatus::Code(127))
    }
}

impl fmt::Display for ExitStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ExitStatus::Code(c) => write!(f, "exit code {c}"),
            ExitStatus::Signal {
                name, core_dumped, ..
            } => write!(
                f,
                "killed by signal {name}{}",
                if *core_dumped { " (core dumped)" } else { "" }
            ),
        }
    }
}

/// The remote command's stderr, chunk by chunk, until the command's channel closes.
#[derive(Debug)]
pub struct Stderr(pub(crate) mpsc::UnboundedReceiver<Bytes>);

impl Stderr {
    /// The next chunk, or `None` once the remote side is done.
    pub async fn recv(&mut self) -> Option<Bytes> {
        self.0.recv().await
    }

    /// Copies everything to `out` (for example `tokio::io::stderr()`) until the end.
    pub async fn copy_to<W: AsyncWrite + Unpin>(mut self, mut out: W) -> std::io::Result<()> {
        while let Some(chunk) = self.0.recv().await {
            out.write_all(&chunk).await?;
            out.flush().await?;
        }
        Ok(())
    }

    /// Spawns a task that copies everything to this process's stderr.
    pub fn forward_to_stderr(self) -> tokio::task::JoinHandle<std::io::Result<()>> {
        tokio::spawn(self.copy_to(tokio::io::stderr()))
    }
}

/// Resolves to the remote command's exit status.
#[derive(Debug)]
pub struct ExitWaiter {
    status: oneshot::Receiver<ExitStatus>,
    /// Kills the local process that runs the command (the system ssh), if there is one.
    kill: Option<oneshot::Sender<()>>,
}

impl ExitWaiter {
    /// A command run over a channel: nothing local to kill.
    pub(crate) fn new(status: oneshot::Receiver<ExitStatus>) -> ExitWaiter {
        ExitWaiter { status, kill: None }
    }

    /// A command run by a local process (the system ssh), which `kill` kills.
    pub(crate) fn local(
        status: oneshot::Receiver<ExitStatus>,
        kill: oneshot::Sender<()>,
    ) -> ExitWaiter {
        ExitWaiter {
            status,
            kill: Some(kill),
        }
    }

    /// Waits for the command to end. [`Error::NoExitStatus`] if the channel closed without
    /// a status (connection lost).
    pub async fn wait(self) -> Result<ExitStatus, Error> {
        self.status.await.map_err(|_| Error::NoExitStatus)
    }

    /// Waits at most `limit` for the command to end. Once `limit` has passed, the local
    /// process that runs it (the system ssh, stopped or stuck) is killed, so none is left
    /// behind, and the error is an [`Error::Io`] of kind `TimedOut` that says whether one
    /// was; a command run over a channel of the built-in client goes with its channel.
    pub async fn wait_or_kill(mut self, limit: std::time::Duration) -> Result<ExitStatus, Error> {
        match tokio::time::timeout(limit, &mut self.status).await {
            Ok(status) => status.map_err(|_| Error::NoExitStatus),
            Err(_) => {
                let killed = self.kill.take().is_some_and(|kill| kill.send(()).is_ok());
                Err(Error::Io {
                    context: if killed {
                        format!(
                            "the ssh program did not exit within {} s, and was killed",
                            limit.as_secs_f32()
                        )
                    } else {
                        "waiting for the remote command's exit status".into()
                    },
                    source: std::io::ErrorKind::TimedOut.into(),
                })
            }
        }
    }
}

/// A command running on the peer.
#[derive(Debug)]
pub struct RemoteProcess<S = BoxStream> {
    /// Its stdin (write) and stdout (read). Shut it down to send EOF to its stdin.
    pub stream: S,
    /// Its stderr.
    pub stderr: Stderr,
    /// Its exit status.
    pub exit: ExitWaiter,
}

impl RemoteProcess {
    /// A server reached by a stream of its own (an in-process `fastcp::server::serve`, a
    /// socket, a channel of a caller's own SSH session): no stderr, and an exit status of
    /// success, since there is no process whose status could say otherwise. Its errors
    /// come through the protocol.
    pub fn from_stream(stream: impl crate::Duplex + 'static) -> RemoteProcess {
        let (_, stderr) = mpsc::unbounded_channel();
        let (exit, waiter) = oneshot::channel();
        let _ = exit.send(ExitStatus::Code(0));
        RemoteProcess {
            stream: Box::new(stream),
            stderr: Stderr(stderr),
            exit: ExitWaiter::new(waiter),
        }
    }
}

impl<S: crate::Duplex> RemoteProcess<S> {
    /// The same process with its stream boxed.
    pub fn boxed(self) -> RemoteProcess<BoxStream> {
        RemoteProcess {
            stream: Box::new(self.stream),
            stderr: self.stderr,
            exit: self.exit,
        }
    }
}

/// The remote command line for `fastcp server`: the program (default `fastcp`, or
/// `remote_path`) quoted for a POSIX shell, then the fixed argument `server`.
///
/// No other input ever reaches the remote command line. A leading `~/` is left unquoted so
/// the remote shell expands it. Control characters are refused.
pub fn server_command(remote_path: Option<&str>) -> Result<String, Error> {
    let program = remote_path.unwrap_or("fastcp");
    if program.is_empty() || program.chars().any(char::is_control) {
        return Err(Error::Config(format!(
            "remote path {program:?} is empty or has control characters"
        )));
    }
    let quoted = match program.strip_prefix("~/") {
        Some(rest) if !rest.is_empty() => format!("~/{}", shell_quote(rest)),
        _ => shell_quote(program),
    };
    Ok(format!("{quoted} server"))
}

/// What starts the server: `remote_path`'s `server` when a path is named, else `launcher`
/// (a fixed command line the caller built, such as one that also tries a self-deployed
/// binary), else `fastcp server`.
pub(crate) fn launch_command(
    remote_path: Option<&str>,
    launcher: Option<String>,
) -> Result<String, Error> {
    match (remote_path, launcher) {
        (None, Some(launcher)) => Ok(launcher),
        (path, _) => server_command(path),
    }
}

/// Quotes `s` as one word for the remote login shell, a POSIX shell or a csh-like one (plain
/// when it is made of safe characters): single quotes, with `'` and `!` (which csh expands
/// even inside single quotes) escaped between them. It cannot quote a newline for csh:
/// callers refuse control characters.
pub fn shell_quote(s: &str) -> String {
    let safe = !s.is_empty()
        && !s.starts_with('-')
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"/._-+,:@%=".contains(&b));
    if safe {
        s.to_owned()
    } else {
        format!("'{}'", s.replace('\'', r"'\''").replace('!', r"'\!'"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn server_command_is_fixed_and_quoted() {
        assert_eq!(server_command(None).unwrap(), "fastcp server");
        assert_eq!(
            server_command(Some("/opt/fastcp/bin/fastcp")).unwrap(),
            "/opt/fastcp/bin/fastcp server"
        );
        assert_eq!(
            server_command(Some("/a b/it's; rm -rf ~")).unwrap(),
            r"'/a b/it'\''s; rm -rf ~' server"
        );
        assert_eq!(
            server_command(Some("~/bin/fastcp")).unwrap(),
            "~/bin/fastcp server"
        );
        assert_eq!(server_command(Some("~/x y")).unwrap(), "~/'x y' server");
        assert_eq!(server_command(Some("$(id)")).unwrap(), "'$(id)' server");
        assert_eq!(server_command(Some("-x")).unwrap(), "'-x' server");
        assert!(server_command(Some("a\nb")).is_err());
        assert!(server_command(Some("")).is_err());
        assert_eq!(server_command(Some("x!y")).unwrap(), r"'x'\!'y' server");
    }

    /// sshd hands the command line to the remote user's login shell as `SHELL -c LINE`: a
    /// remote program named with `;`, `$(...)`, backticks, quotes, `!`, spaces or a leading
    /// `-` must run as itself, with the one argument `server`, under bash, dash and tcsh.
    #[test]
    fn server_command_means_the_same_under_every_login_shell() {
        use std::os::unix::fs::PermissionsExt;
        let names = [
            "plain",
            "a b",
            "semi;colon",
            "$(touch pwned)",
            "`touch pwned`",
            "it's",
            "\"dq\"",
            "-lead",
            "x!y",
            "!!",
            "back\\slash",
            "star*",
            "amp&pipe|gt>",
            "dollar$HOME",
            "{brace}[x]",
            "hash#tilde~",
        ];
        for shell in ["bash", "dash", "tcsh"] {
            let shell = fastcp_testsupport::tools::require(shell);
            for name in names {
                let dir = tempfile::tempdir().unwrap();
                let program = dir.path().join(name);
                std::fs::write(
                    &program,
                    "#!/bin/sh\nprintf '%s\\n' \"$0\" \"$@\" > \"$FASTCP_QUOTE_OUT\"\n",
                )
                .unwrap();
                std::fs::set_permissions(&program, std::fs::Permissions::from_mode(0o755)).unwrap();
                let out = dir.path().join("out");
                let cwd = tempfile::tempdir().unwrap();
                for path in [program.display().to_string(), format!("~/{name}")] {
                    let line = server_command(Some(&path)).unwrap();
                    let run = std::process::Command::new(&shell)
                        .arg("-c")
                        .arg(&line)
                        .current_dir(cwd.path())
                        .env("HOME", dir.path())
                        .env("FASTCP_QUOTE_OUT", &out)
                        .output()
                        .unwrap();
                    let what = format!("{} -c {line:?}", shell.display());
                    assert!(
                        run.status.success(),
                        "{what}: {}",
                        String::from_utf8_lossy(&run.stderr)
                    );
                    let args = std::fs::read_to_string(&out).unwrap();
                    assert_eq!(args, format!("{}\nserver\n", program.display()), "{what}");
                    std::fs::remove_file(&out).unwrap();
                    assert!(
                        std::fs::read_dir(cwd.path()).unwrap().next().is_none(),
                        "{what} ran something else"
                    );
                }
            }
        }
    }
}
