//! Running a test under a real pseudo-terminal, to answer a prompt the way a person would.
//!
//! [`run_ignored_test_in_tty`] runs one `#[ignore]`d test of the current test binary under
//! `script(1)`, types an answer once a prompt shows on the terminal, and returns what the
//! terminal showed. Every wait has a deadline.

use std::ffi::OsStr;
use std::io::{Read, Write};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How long the prompt, and then the end of the child, may take.
pub const TTY_DEADLINE: Duration = Duration::from_secs(60);

thread_local! {
    static LAST_WAIT: std::cell::RefCell<String> = const { std::cell::RefCell::new(String::new()) };
}

/// What the terminal showed while the last [`run_ignored_test_in_tty`] on this thread waited
/// to answer: its prompt, and whatever was drawn after it before the answer.
pub fn last_wait() -> String {
    LAST_WAIT.with(|w| w.borrow().clone())
}

/// How long a person takes to type an answer once the prompt shows.
pub const THINK_TIME: Duration = Duration::from_millis(600);

/// Runs the ignored test `name` of this test binary under `script` with `env`, types `answer`
/// and Enter once `prompt` has been on the terminal for [`THINK_TIME`], and returns whether
/// the test passed and all the terminal showed; what it showed from the prompt until the
/// answer was typed is in [`last_wait`]. Panics (killing the child) when the prompt or the
/// end does not come within [`TTY_DEADLINE`].
pub fn run_ignored_test_in_tty(
    name: &str,
    env: &[(&str, &OsStr)],
    prompt: &str,
    answer: &str,
) -> (bool, String) {
    run_ignored_test_in_tty_typing(name, env, prompt, &format!("{answer}\n"))
}

/// [`run_ignored_test_in_tty`], typing `keys` as they are (no Enter after them): `"\x04"` is
/// Ctrl-D, the end of input on the terminal.
pub fn run_ignored_test_in_tty_typing(
    name: &str,
    env: &[(&str, &OsStr)],
    prompt: &str,
    keys: &str,
) -> (bool, String) {
    let exe = std::env::current_exe().expect("the test binary");
    let cmd = format!("{} --ignored --exact {name} --nocapture", exe.display());
    let mut command = Command::new(crate::tools::require("script"));
    command
        .args(["-qec", &cmd, "/dev/null"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped());
    for (k, v) in env {
        command.env(k, v);
    }
    let mut child = command.spawn().expect("script(1)");
    let seen = Arc::new(Mutex::new(Vec::new()));
    let mut stdout = child.stdout.take().expect("piped");
    let reader = {
        let seen = seen.clone();
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while let Ok(n) = stdout.read(&mut buf) {
                if n == 0 {
                    break;
                }
                seen.lock().expect("screen").extend_from_slice(&buf[..n]);
            }
        })
    };
    let text = || String::from_utf8_lossy(&seen.lock().expect("screen")).into_owned();
    let started = Instant::now();
    while !text().contains(prompt) {
        if started.elapsed() > TTY_DEADLINE || reader.is_finished() {
            let _ = child.kill();
            let _ = child.wait();
            panic!("no prompt {prompt:?} on the terminal:\n{}", text());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(THINK_TIME);
    let shown = text();
    let from = shown.find(prompt).unwrap_or(0);
    LAST_WAIT.with(|w| *w.borrow_mut() = shown[from..].to_owned());
    let mut stdin = child.stdin.take().expect("piped");
    stdin.write_all(keys.as_bytes()).expect("typing the answer");
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().expect("waiting for script") {
            break status;
        }
        if started.elapsed() > TTY_DEADLINE {
            let _ = child.kill();
            let _ = child.wait();
            panic!("the child did not finish after the answer:\n{}", text());
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    drop(stdin);
    let _ = reader.join();
    (status.success(), text())
}
