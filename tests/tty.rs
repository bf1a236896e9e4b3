//! The progress bar in a real terminal: `fastcp` runs inside tmux (its own server on its own
//! socket), and the test reads the screen with `tmux capture-pane` while the copy runs.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use fastcp_testsupport::Sshd;
use fastcp_testsupport::tree::{pseudo_random, write};

const BIN: &str = env!("CARGO_BIN_EXE_fastcp");

/// A tmux server of our own, killed on drop.
struct Tmux {
    socket: String,
}

impl Tmux {
    fn start(name: &str, command: &str) -> Tmux {
        let tmux = Tmux {
            socket: format!("fastcp-tty-{name}-{}", std::process::id()),
        };
        let status = tmux
            .cmd()
            .args(["new-session", "-d", "-x", "120", "-y", "20", command])
            .env_remove("TMUX")
            .status()
            .expect("tmux is needed for this test (apt-get install tmux)");
        assert!(status.success(), "tmux new-session failed");
        tmux
    }

    fn cmd(&self) -> Command {
        let mut cmd = Command::new(fastcp_testsupport::tools::require("tmux"));
        cmd.args(["-L", &self.socket, "-f", "/dev/null"]);
        cmd
    }

    /// The visible screen, trailing blank lines dropped.
    fn screen(&self) -> String {
        let out = self
            .cmd()
            .args(["capture-pane", "-p"])
            .output()
            .expect("tmux capture-pane");
        String::from_utf8_lossy(&out.stdout).trim_end().to_owned()
    }

    /// Captures the screen every 200 ms until `done` appears on it; returns every capture.
    fn watch_until(&self, done: &str, limit: Duration) -> Vec<String> {
        let started = Instant::now();
        let mut screens = Vec::new();
        loop {
            let screen = self.screen();
            let finished = screen.contains(done);
            screens.push(screen);
            if finished {
                return screens;
            }
            assert!(
                started.elapsed() < limit,
                "no {done:?} after {limit:?}; last screen:\n{}",
                screens.last().unwrap()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = self.cmd().arg("kill-server").status();
    }
}

fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// Runs `args` in tmux, watches the screen to the end and checks the bar: it shows the
/// bytes, the rate and the files while the copy runs, the file's name with its control
/// characters escaped, and ends at 100%.
fn check_bar(name: &str, args: &[String], escaped_name: &str) {
    let command = format!(
        "{} {}; echo EXIT=$?; sleep 60",
        shell_quote(BIN),
        args.iter()
            .map(|a| shell_quote(a))
            .collect::<Vec<_>>()
            .join(" ")
    );
    let tmux = Tmux::start(name, &command);
    let screens = tmux.watch_until("EXIT=", Duration::from_secs(120));
    let last = screens.last().unwrap();
    eprintln!("{name}:\n{}", screens.join("\n----\n"));
    assert!(last.contains("EXIT=0"), "fastcp failed:\n{last}");
    let running: Vec<&String> = screens[..screens.len() - 1]
        .iter()
        .filter(|s| s.contains("files"))
        .collect();
    assert!(
        running.len() >= 3,
        "the bar should have been on screen while the copy ran; screens:\n{}",
        screens.join("\n----\n")
    );
    assert!(
        running
            .iter()
            .any(|s| s.contains("/s") && s.contains(escaped_name)),
        "the bar should show the rate and the escaped name {escaped_name:?}; screens:\n{}",
        screens.join("\n----\n")
    );
    // The raw escape sequence never reached the terminal (it would have cleared the screen).
    assert!(running.iter().all(|s| !s.contains('\x1b')));
    let bar_line = last
        .lines()
        .find(|l| l.contains("files"))
        .unwrap_or_else(|| panic!("no bar on the last screen:\n{last}"));
    assert!(
        bar_line
            .trim_start()
            .starts_with("100% [===================="),
        "the bar should end full:\n{last}"
    );
}

/// A 2.5 MiB file named with an escape sequence, copied at 1 MiB/s: about 2.5 s of bar. Its
/// name is shown escaped (scp's CVE-2019-6109: a name that rewrites the terminal).
fn evil_source(dir: &Path) -> std::path::PathBuf {
    let src = dir.join("src");
    std::fs::create_dir(&src).unwrap();
    write(
        &src.join("evil\x1b[2Jname"),
        &pseudo_random(5 << 19, 7),
        0o644,
    );
    src
}

#[test]
fn progress_bar_in_a_terminal_local_copy() {
    let work = tempfile::tempdir().unwrap();
    let src = evil_source(work.path());
    let dst = work.path().join("dst");
    let args = vec![
        "-r".into(),
        "--bwlimit".into(),
        "1M".into(),
        src.display().to_string(),
        dst.display().to_string(),
    ];
    check_bar("local", &args, r"evil\x1b[2Jname");
    assert_eq!(std::fs::read_dir(&dst).unwrap().count(), 1);
}

#[test]
fn progress_bar_in_a_terminal_push_and_pull() {
    let sshd = Sshd::start().unwrap();
    let work = tempfile::tempdir().unwrap();
    let src = evil_source(work.path());
    for (name, from, to) in [
        (
            "push",
            src.display().to_string(),
            format!("{}:{}", sshd.alias(), work.path().join("pushed").display()),
        ),
        (
            "pull",
            format!("{}:{}", sshd.alias(), src.display()),
            work.path().join("pulled").display().to_string(),
        ),
    ] {
        let args = vec![
            "-F".into(),
            sshd.ssh_config().display().to_string(),
            "--remote-path".into(),
            BIN.into(),
            "-r".into(),
            "--bwlimit".into(),
            "1M".into(),
            from,
            to,
        ];
        check_bar(name, &args, r"evil\x1b[2Jname");
    }
    assert!(work.path().join("pushed").is_dir());
    assert!(work.path().join("pulled").is_dir());
}
