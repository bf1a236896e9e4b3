//! `cargo xtask bench rerun`: the nightly backup's next night, when nothing changed. fastcp's
//! reruns (`--skip-unchanged`, TCP and SSH, push and pull) are timed beside rsync's reruns,
//! beside the login alone (`ssh HOST true`, which every remote tool pays once) and beside
//! fastcp's own full copies over TCP, the contenders alternated round by round.
//!
//! A rerun contender's warm-up run seeds its destination, which is then checked against the
//! source; every timed run reruns into it, and it is checked again after the last round.
//! fastcp's TCP and SSH reruns share a destination per direction (a rerun leaves it as it
//! was). Before the rounds, each fastcp rerun runs once with `--json`, which must report
//! every file skipped and no bytes sent. A full copy goes into an empty destination each run,
//! checked and removed after the clock stops.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{Context, Result, bail};

use crate::bench::{self, BenchOptions, Common, Contender, Data, Outcome, p, sq};
use crate::sshd::ALIAS;
use crate::verify::{self, Kind};

/// What a contender leaves behind, and so what the harness does around its runs.
enum Dest {
    /// Nothing (`ssh true`).
    None,
    /// A destination the warm-up run seeds and every timed run reruns into. `check` is the
    /// same command with `--json`, run once after the warm-up (fastcp only).
    Kept { dst: PathBuf, check: Option<String> },
    /// A destination made afresh by every run, removed after it.
    Fresh(PathBuf),
}

/// The folder holding every destination, removed with them when dropped. Its lock file is
/// held while the bench runs, so that a later bench can tell a folder left by one that was
/// killed.
struct Work {
    dir: PathBuf,
    _lock: fs::File,
}

/// The lock file in a work folder.
const LOCK: &str = ".lock";

impl Work {
    /// Makes `root/rerun-PID`, first removing what benches that were killed left in `root`.
    fn new(root: &Path) -> Result<Work> {
        remove_stale(root);
        let dir = root.join(format!("rerun-{}", std::process::id()));
        if dir.exists() {
            fs::remove_dir_all(&dir)?;
        }
        fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        let lock = fs::File::create(dir.join(LOCK))?;
        lock.lock()?;
        Ok(Work { dir, _lock: lock })
    }
}

impl Drop for Work {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.dir);
    }
}

/// The user and group ids of the local account `user`.
pub fn account(user: &str) -> Result<(u32, u32)> {
    let id = |flag: &str| -> Result<u32> {
        let out = Command::new("id")
            .args([flag, user])
            .stderr(Stdio::null())
            .output()
            .context("running id")?;
        if !out.status.success() {
            bail!("--login {user}: there is no such account on this machine");
        }
        String::from_utf8_lossy(&out.stdout)
            .trim()
            .parse()
            .with_context(|| format!("id {flag} {user}: not a number"))
    };
    Ok((id("-u")?, id("-g")?))
}

/// Seeds the destinations, checks that a fastcp rerun sends nothing, then times every
/// contender in alternated rounds.
pub fn measure(
    opts: &BenchOptions,
    fastcp: &Result<PathBuf, String>,
    data: &Data,
    root: &Path,
    logs: &Path,
    cfg: &Path,
) -> Result<Vec<(Contender, Outcome)>> {
    let work = Work::new(root)?;
    let (push, pull) = (work.dir.join("push"), work.dir.join("pull"));
    fs::create_dir_all(&push)?;
    fs::create_dir_all(&pull)?;
    if let Some(user) = &opts.login {
        // Pushes write as the login: their destinations live in a folder it owns.
        let (uid, gid) = account(user)?;
        std::os::unix::fs::chown(&push, Some(uid), Some(gid))
            .with_context(|| format!("--login {user}: cannot give {} to {user}", push.display()))?;
    }
    let mut all = contenders(opts, fastcp, data, &push, &pull);
    let listed: Vec<Contender> = all.iter().map(|(c, _)| c.clone()).collect();
    bench::check_wanted(opts, &listed)?;
    all.retain(|(c, _)| opts.wants(c));
    let (list, dests): (Vec<Contender>, Vec<Dest>) = all.into_iter().unzip();

    let files = data.manifest.count(&Kind::File) as u64;
    let check = |dst: &Path| verify::compare_tree_to(&data.src, &data.manifest, dst);
    let outcomes = bench::alternate("rerun/tree", opts.runs, &list, |c, i, round| {
        let log = logs.join(format!("rerun-tree-{i}.log"));
        let timed = |c: &Contender| bench::time_command(c, &log, Some(cfg), opts.timeout);
        match &dests[i] {
            Dest::None => timed(c),
            Dest::Fresh(dst) => {
                remove(dst)?;
                let t = match timed(c)? {
                    Ok(t) => t,
                    Err(why) => return Ok(Err(why)),
                };
                let result = bench::check_result(check(dst), t);
                remove(dst)?;
                Ok(result)
            }
            Dest::Kept { dst, check: json } => {
                let t = match timed(c)? {
                    Ok(t) => t,
                    Err(why) => return Ok(Err(why)),
                };
                if round == 0 || round == opts.runs {
                    let result = bench::check_result(check(dst), t);
                    if result.is_err() {
                        return Ok(result);
                    }
                }
                if round == 0
                    && let Some(json) = json
                {
                    sends_nothing(json, cfg, files, &log, opts.timeout)?;
                    eprintln!(
                        "[rerun/tree] {}: --json: {files} files skipped, 0 bytes sent",
                        c.name
                    );
                }
                Ok(Ok(t))
            }
        }
    })?;
    drop(work);
    Ok(list.into_iter().zip(outcomes).collect())
}

/// Removes the work folders (`rerun-PID`, several copies of the tree) that benches which
/// were killed left in `root`: those whose lock file nobody holds.
fn remove_stale(root: &Path) {
    let Ok(entries) = fs::read_dir(root) else {
        return;
    };
    for entry in entries.flatten() {
        if !entry.file_name().to_string_lossy().starts_with("rerun-") {
            continue;
        }
        let Ok(lock) = fs::File::open(entry.path().join(LOCK)) else {
            continue;
        };
        if lock.try_lock().is_ok() {
            eprintln!(
                "removing {}, left by a bench that was stopped",
                entry.path().display()
            );
            let _ = fs::remove_dir_all(entry.path());
        }
    }
}

/// Removes `dst` if it is there.
fn remove(dst: &Path) -> Result<()> {
    match fs::remove_dir_all(dst) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            Err(e).with_context(|| format!("removing {}", dst.display()))
        }
        _ => Ok(()),
    }
}

/// Runs the `--json` rerun `command` and fails unless it skipped all `files` and sent no
/// bytes: a rerun that resends is not a rerun, and its times would say nothing.
fn sends_nothing(
    command: &str,
    cfg: &Path,
    files: u64,
    log: &Path,
    timeout: std::time::Duration,
) -> Result<()> {
    let json = log.with_extension("json");
    let mut cmd = Command::new("bash");
    cmd.arg("-c")
        .arg(command)
        .env("CFG", cfg)
        .env_remove("SSH_AUTH_SOCK")
        .stdin(Stdio::null())
        .stdout(fs::File::create(&json)?)
        .stderr(fs::File::create(log)?);
    std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
    let (status, timed_out) = bench::wait_with_timeout(cmd.spawn()?, timeout)?;
    let text = fs::read_to_string(&json).unwrap_or_default();
    let skipped = json_number(&text, "files_skipped");
    let sent = json_number(&text, "bytes_sent");
    if timed_out || !status.success() || skipped != Some(files) || sent != Some(0) {
        let shown = |n: Option<u64>| n.map_or("nothing".to_owned(), |n| n.to_string());
        bail!(
            "the rerun check `{command}` {} and reported files_skipped {} (the tree has {files} \
             files) and bytes_sent {} (expected 0): a rerun that resends is not a rerun; its \
             output is in {} and {}",
            if timed_out {
                format!("was killed after {} s", timeout.as_secs())
            } else {
                format!("exited with {status}")
            },
            shown(skipped),
            shown(sent),
            json.display(),
            log.display()
        );
    }
    Ok(())
}

/// The unsigned number after `"key":` in fastcp's `--json` output.
fn json_number(text: &str, key: &str) -> Option<u64> {
    let rest = text.split(&format!("\"{key}\":")).nth(1)?.trim_start();
    let digits = rest
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(rest.len());
    rest[..digits].parse().ok()
}

/// The rsync rerun and the fastcp full copy that a contender's median is compared with (the
/// same direction), or `None` for the login and the full copies themselves.
pub fn baselines(name: &str) -> Option<[String; 2]> {
    let direction = name.rsplit(' ').next()?;
    let rerun =
        name.starts_with("rsync ") || name.starts_with("fastcp ") && !name.contains(" full ");
    (rerun && ["push", "pull"].contains(&direction)).then(|| {
        [
            format!("rsync {direction}"),
            format!("fastcp full tcp {direction}"),
        ]
    })
}

/// The contenders, in the order they run within a round, pushing into `push` and pulling
/// into `pull`.
fn contenders(
    opts: &BenchOptions,
    fastcp: &Result<PathBuf, String>,
    data: &Data,
    push: &Path,
    pull: &Path,
) -> Vec<(Contender, Dest)> {
    let src = p(&data.src);
    let Common {
        bin,
        broken,
        extra,
        cipher,
    } = Common::new(opts, fastcp);
    let (l, o) = match &opts.login {
        Some(user) => (
            format!(" -l {}", sq(user)),
            format!(" -o {}", sq(&format!("User={user}"))),
        ),
        None => (String::new(), String::new()),
    };
    // From the source's contents into the destination folder, so that a rerun lands where
    // the seeding run did rather than in a folder inside it.
    let ends = |dir: &str, dst: &Path| match dir {
        "push" => (format!("{src}/."), format!("{ALIAS}:{}", p(dst))),
        _ => (format!("{ALIAS}:{src}/."), p(dst)),
    };
    let fastcp = |name: &str, transport: &str, dir: &str, dst: &Path, skip: &str| {
        let (from, to) = ends(dir, dst);
        let command = |json: &str| {
            format!(
                "{bin} -q -r -p{skip}{json} --transport {transport} -F \"$CFG\"{o} \
                 --remote-path {bin}{extra} {from} {to}"
            )
        };
        (
            Contender {
                name: name.into(),
                command: command(""),
                listener: None,
                broken: broken.clone(),
            },
            command(" --json"),
        )
    };
    let mut v = vec![(
        Contender::new(
            "ssh true",
            format!("ssh -F \"$CFG\"{cipher}{l} {ALIAS} true"),
        ),
        Dest::None,
    )];
    for dir in ["push", "pull"] {
        let dst = if dir == "push" { push } else { pull }.join("rsync");
        let (from, to) = match dir {
            "push" => (format!("{src}/"), format!("{ALIAS}:{}/", p(&dst))),
            _ => (format!("{ALIAS}:{src}/"), format!("{}/", p(&dst))),
        };
        let command = format!("rsync -a -e \"ssh -F $CFG{cipher}{l}\" {from} {to}");
        v.push((
            Contender::new(&format!("rsync {dir}"), command),
            Dest::Kept { dst, check: None },
        ));
    }
    for transport in ["tcp", "ssh"] {
        for dir in ["push", "pull"] {
            let dst = if dir == "push" { push } else { pull }.join("fastcp");
            let name = format!("fastcp {transport} {dir}");
            let (c, json) = fastcp(&name, transport, dir, &dst, " --skip-unchanged");
            v.push((
                c,
                Dest::Kept {
                    dst,
                    check: Some(json),
                },
            ));
        }
    }
    // Last, so that their warm-ups follow the seeding: the memory a full copy takes is then
    // memory the previous full copy gave back, not memory the machine touches for the first
    // time (on a virtual machine, a first touch costs about as much as the copy itself).
    for dir in ["push", "pull"] {
        let dst = if dir == "push" { push } else { pull }.join("full");
        let (c, _) = fastcp(&format!("fastcp full tcp {dir}"), "tcp", dir, &dst, "");
        v.push((c, Dest::Fresh(dst)));
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_work_folders_of_stopped_benches_are_removed() {
        let root = std::env::temp_dir().join(format!("xtask-stale-{}", std::process::id()));
        let _ = fs::remove_dir_all(&root);
        let (stale, other) = (root.join("rerun-1"), root.join("rerun-notes"));
        for dir in [&stale, &other] {
            fs::create_dir_all(dir.join("push")).unwrap();
        }
        fs::write(stale.join(LOCK), "").unwrap();
        let live = Work::new(&root).unwrap();
        assert!(!stale.exists());
        assert!(
            other.exists(),
            "a folder without a lock file is not a work folder"
        );
        // Another bench leaves a live one alone.
        remove_stale(&root);
        assert!(live.dir.join(LOCK).exists());
        let dir = live.dir.clone();
        drop(live);
        assert!(!dir.exists());
        fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn numbers_from_json() {
        let text = "{\n  \"files\": 0,\n  \"files_skipped\": 78579,\n  \"bytes_sent\": 0,\n}";
        assert_eq!(json_number(text, "files_skipped"), Some(78_579));
        assert_eq!(json_number(text, "bytes_sent"), Some(0));
        assert_eq!(json_number(text, "files"), Some(0));
        assert_eq!(json_number(text, "bytes_resumed"), None);
        assert_eq!(json_number("{\"bytes_sent\": null}", "bytes_sent"), None);
    }

    #[test]
    fn a_rerun_that_sends_anything_stops_the_bench() {
        let dir = std::env::temp_dir().join(format!("xtask-rerun-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let log = dir.join("check.log");
        let check = |json: &str, exit: u8| {
            let command = format!("printf '%s\\n' {}; exit {exit}", sq(json));
            sends_nothing(&command, &dir, 5, &log, std::time::Duration::from_secs(20))
        };
        check("{\"files_skipped\": 5,\n\"bytes_sent\": 0}", 0).unwrap();
        let resent = check("{\"files_skipped\": 4,\n\"bytes_sent\": 100}", 0).unwrap_err();
        assert!(format!("{resent}").contains("files_skipped 4"), "{resent}");
        assert!(check("{\"files_skipped\": 5,\n\"bytes_sent\": 7}", 0).is_err());
        assert!(check("{\"files_skipped\": 5,\n\"bytes_sent\": 0}", 1).is_err());
        assert!(check("", 0).is_err());
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn reruns_compare_with_rsync_and_the_full_copy_of_their_direction() {
        let b = |name| baselines(name).map(|[r, f]| format!("{r} / {f}"));
        assert_eq!(
            b("fastcp tcp push").as_deref(),
            Some("rsync push / fastcp full tcp push")
        );
        // The SSH transport's reruns are compared with the TCP full copy too.
        assert_eq!(
            b("fastcp ssh pull").as_deref(),
            Some("rsync pull / fastcp full tcp pull")
        );
        assert_eq!(
            b("rsync pull").as_deref(),
            Some("rsync pull / fastcp full tcp pull")
        );
        assert_eq!(b("fastcp full tcp push"), None);
        assert_eq!(b("ssh true"), None);
    }
}
