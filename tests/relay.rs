//! Copies between two remote hosts through this machine (`fastcp hosta:src hostb:dst`, scp's
//! `-3`), against two real sshds on 127.0.0.1, and one with the same host on both sides.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::{BIN, json, run, script, stderr};
use fastcp_testsupport::Sshd;
use fastcp_testsupport::tree::{
    assert_no_temp, assert_same_tree, build_mixed, pseudo_random, scan, write,
};

/// Two sshds, `hosta` and `hostb`, in one ssh_config; each runs the remote program through a
/// wrapper that notes its process id in the host's own folder (`pids` there).
struct Hosts {
    a: Sshd,
    _b: Sshd,
    config: PathBuf,
    remote_path: PathBuf,
    work: tempfile::TempDir,
}

impl Hosts {
    fn start() -> Hosts {
        let work = tempfile::tempdir().unwrap();
        let (pids_a, pids_b) = (work.path().join("pids-a"), work.path().join("pids-b"));
        std::fs::create_dir(&pids_a).unwrap();
        std::fs::create_dir(&pids_b).unwrap();
        let a = Sshd::start_with_env(&[("FASTCP_TEST_PIDS", &pids_a)]).unwrap();
        let b = Sshd::start_with_env(&[("FASTCP_TEST_PIDS", &pids_b)]).unwrap();
        let config = work.path().join("ssh_config");
        std::fs::write(
            &config,
            format!("{}{}", a.host_block("hosta"), b.host_block("hostb")),
        )
        .unwrap();
        let remote_path = script(
            work.path(),
            "fastcp-noting-its-pid",
            &format!("echo $$ > \"$FASTCP_TEST_PIDS/$$\"\nexec '{BIN}' \"$@\""),
        );
        Hosts {
            a,
            _b: b,
            config,
            remote_path,
            work,
        }
    }

    /// A fresh folder for a test's trees.
    fn dir(&self, name: &str) -> PathBuf {
        let dir = self.work.path().join(name);
        std::fs::create_dir(&dir).unwrap();
        dir
    }

    fn fastcp(&self) -> Command {
        self.fastcp_running(&self.remote_path)
    }

    /// fastcp, with `remote_path` as the program both hosts run.
    fn fastcp_running(&self, remote_path: &Path) -> Command {
        let mut cmd = Command::new(BIN);
        cmd.arg("-F")
            .arg(&self.config)
            .arg("--remote-path")
            .arg(remote_path)
            .env_remove("SSH_AUTH_SOCK");
        cmd
    }

    /// The process ids of the remote programs `host` ("a" or "b") started so far.
    fn pids(&self, host: &str) -> Vec<i32> {
        std::fs::read_dir(self.work.path().join(format!("pids-{host}")))
            .unwrap()
            .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
            .collect()
    }
}

fn on(host: &str, path: &Path) -> String {
    format!("{host}:{}", path.display())
}

/// Nothing written in the folder the command ran in.
fn ran_in_empty(cwd: &Path) {
    assert!(
        std::fs::read_dir(cwd).unwrap().next().is_none(),
        "written locally: {:?}",
        scan(cwd).keys().collect::<Vec<_>>()
    );
}

#[test]
fn a_tree_is_relayed_whole_and_the_source_left_as_it_was() {
    let hosts = Hosts::start();
    let (src_dir, dst_dir, cwd) = (hosts.dir("a"), hosts.dir("b"), hosts.dir("cwd"));
    let src = src_dir.join("tree");
    build_mixed(&src);
    let before = scan(&src);
    for transport in ["auto", "ssh"] {
        let dst = dst_dir.join(transport);
        let out = run(hosts
            .fastcp()
            .args(["-r", "-p", "--json", "--transport", transport])
            .arg(on("hosta", &src))
            .arg(on("hostb", &dst))
            .current_dir(&cwd));
        assert!(out.status.success(), "{}", stderr(&out));
        assert_same_tree(&src, &dst, true);
        assert_no_temp(&dst);
        let v = json(&out);
        assert_eq!(v["exit_code"], 0, "{v}");
        assert!(v["files"].as_u64().unwrap() > 0, "{v}");
        assert_eq!(v["bytes_sent"], v["bytes"], "{v}");
    }
    assert_eq!(scan(&src), before, "the source changed");
    ran_in_empty(&cwd);
    // scp's -3 is accepted, and means the same.
    let dst = dst_dir.join("three");
    let out = run(hosts
        .fastcp()
        .args(["-3", "-r", "-p"])
        .arg(on("hosta", &src))
        .arg(on("hostb", &dst))
        .current_dir(&cwd));
    assert!(out.status.success(), "{}", stderr(&out));
    assert_same_tree(&src, &dst, true);
}

#[test]
fn a_file_is_relayed_to_a_new_name_and_into_a_folder() {
    let hosts = Hosts::start();
    let (src, dst) = (hosts.dir("a"), hosts.dir("b"));
    let data = pseudo_random(3 << 20, 7);
    write(&src.join("f.bin"), &data, 0o640);
    write(&src.join("g.txt"), b"g", 0o600);
    // To a new name.
    let out = run(hosts
        .fastcp()
        .arg(on("hosta", &src.join("f.bin")))
        .arg(on("hostb", &dst.join("renamed.bin"))));
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(std::fs::read(dst.join("renamed.bin")).unwrap(), data);
    // Into an existing folder, two at once; `user@` and `scp://` operands name the logins.
    let folder = dst.join("folder");
    std::fs::create_dir(&folder).unwrap();
    let user = hosts.a.user().to_owned();
    let out = run(hosts
        .fastcp()
        .arg(format!("{user}@hosta:{}", src.join("f.bin").display()))
        .arg(format!("{user}@hosta:{}", src.join("g.txt").display()))
        .arg(format!("scp://hostb/{}", folder.display())));
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(std::fs::read(folder.join("f.bin")).unwrap(), data);
    assert_eq!(std::fs::read(folder.join("g.txt")).unwrap(), b"g");
    assert_no_temp(&dst);
}

/// A source that names a folder's contents (`dir/.`), which arrives under a name only its
/// host knows, is relayed as a pull would take it: its contents land in the target.
#[test]
fn a_folders_contents_are_relayed_into_the_target() {
    let hosts = Hosts::start();
    let (src, dst) = (hosts.dir("a"), hosts.dir("b"));
    write(&src.join("x.txt"), b"x", 0o644);
    std::fs::create_dir(src.join("sub")).unwrap();
    write(&src.join("sub/y.txt"), b"y", 0o644);
    let out = run(hosts
        .fastcp()
        .arg("-r")
        .arg(format!("hosta:{}/.", src.display()))
        .arg(on("hostb", &dst)));
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(std::fs::read(dst.join("x.txt")).unwrap(), b"x");
    assert_eq!(std::fs::read(dst.join("sub/y.txt")).unwrap(), b"y");
}

#[test]
fn a_rerun_with_skip_unchanged_relays_no_file_data() {
    let hosts = Hosts::start();
    let (src_dir, dst) = (hosts.dir("a"), hosts.dir("b"));
    let src = src_dir.join("tree");
    build_mixed(&src);
    let copy = || {
        run(hosts
            .fastcp()
            .args(["-r", "--skip-unchanged", "--json"])
            .arg(on("hosta", &src))
            .arg(on("hostb", &dst)))
    };
    let first = json(&copy());
    assert_eq!(first["exit_code"], 0, "{first}");
    let files = first["files"].as_u64().unwrap();
    assert!(
        files > 0 && first["bytes_sent"].as_u64().unwrap() > 0,
        "{first}"
    );
    assert_same_tree(&src, &dst.join("tree"), true);
    let again = json(&copy());
    assert_eq!(again["exit_code"], 0, "{again}");
    assert_eq!(again["bytes_sent"], 0, "{again}");
    assert_eq!(again["files_skipped"], files, "{again}");
}

/// `--link-dest` on a relay: the receiving host links what its reference folder holds
/// alike, and no file data crosses.
#[test]
fn link_dest_links_on_the_receiving_host() {
    use std::os::unix::fs::MetadataExt;
    let hosts = Hosts::start();
    let (src_dir, dst) = (hosts.dir("a"), hosts.dir("b"));
    let src = src_dir.join("tree");
    build_mixed(&src);
    let copy = |to: &str, extra: &[&str]| {
        json(&run(hosts
            .fastcp()
            .args(["-r", "-p", "--json"])
            .args(extra)
            .arg(on("hosta", &src))
            .arg(on("hostb", &dst.join(to)))))
    };
    let first = copy("day1", &[]);
    assert_eq!(first["exit_code"], 0, "{first}");
    let files = first["files"].as_u64().unwrap();
    let second = copy("day2", &["--link-dest", "../day1"]);
    assert_eq!(second["exit_code"], 0, "{second}");
    assert_eq!(second["bytes_sent"], 0, "{second}");
    assert_eq!(second["files_skipped"], files, "{second}");
    assert_same_tree(&src, &dst.join("day2"), true);
    let linked = walk_files(&dst.join("day2"));
    assert!(!linked.is_empty());
    for rel in linked {
        let ino = |day: &str| std::fs::metadata(dst.join(day).join(&rel)).unwrap().ino();
        assert_eq!(ino("day1"), ino("day2"), "{}", rel.display());
    }
}

/// The regular files beneath `root`, relative to it.
fn walk_files(root: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut dirs = vec![root.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for e in std::fs::read_dir(&dir).unwrap() {
            let e = e.unwrap();
            let kind = e.file_type().unwrap();
            if kind.is_dir() {
                dirs.push(e.path());
            } else if kind.is_file() {
                out.push(e.path().strip_prefix(root).unwrap().to_path_buf());
            }
        }
    }
    out
}

#[test]
fn delete_removes_extras_beneath_the_target_only() {
    let hosts = Hosts::start();
    let (src_dir, dst) = (hosts.dir("a"), hosts.dir("b"));
    let src = src_dir.join("tree");
    build_mixed(&src);
    let target = dst.join("tree");
    std::fs::create_dir_all(target.join("extra-dir/deeper")).unwrap();
    write(&target.join("extra-dir/deeper/x"), b"x", 0o644);
    write(&target.join("extra-file"), b"y", 0o644);
    write(&dst.join("beside"), b"beside", 0o644);
    let out = run(hosts
        .fastcp()
        .args(["-r", "-p", "--delete", "--json"])
        .arg(on("hosta", &src))
        .arg(on("hostb", &dst)));
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(json(&out)["files_deleted"], 4, "{}", json(&out));
    assert_same_tree(&src, &target, true);
    assert_eq!(std::fs::read(dst.join("beside")).unwrap(), b"beside");
}

#[test]
fn a_file_that_cannot_land_is_reported_and_the_rest_arrives() {
    let hosts = Hosts::start();
    let (src_dir, dst) = (hosts.dir("a"), hosts.dir("b"));
    let src = src_dir.join("tree");
    std::fs::create_dir(&src).unwrap();
    write(&src.join("blocked"), b"a file", 0o644);
    write(&src.join("fine"), b"fine", 0o644);
    // A folder that is not empty where the file must go.
    std::fs::create_dir_all(dst.join("tree/blocked")).unwrap();
    write(&dst.join("tree/blocked/inside"), b"kept", 0o644);
    let out = run(hosts
        .fastcp()
        .args(["-r", "--json"])
        .arg(on("hosta", &src))
        .arg(on("hostb", &dst)));
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let v = json(&out);
    assert_eq!(
        (&v["exit_code"], &v["error_count"]),
        (&1.into(), &1.into()),
        "{v}"
    );
    assert_eq!(v["errors"][0]["side"], "receiver", "{v}");
    // The line names the host where it failed, as both hosts' paths may read alike.
    let said = stderr(&out);
    assert!(
        said.lines()
            .any(|l| l.starts_with("fastcp: hostb: ") && l.contains("blocked")),
        "{said}"
    );
    assert_eq!(std::fs::read(dst.join("tree/fine")).unwrap(), b"fine");
    assert_eq!(
        std::fs::read(dst.join("tree/blocked/inside")).unwrap(),
        b"kept"
    );
    assert_no_temp(&dst);
}

/// A source its host lacks is named with that host; the others arrive.
#[test]
fn a_missing_source_is_named_with_its_host() {
    let hosts = Hosts::start();
    let (src, dst) = (hosts.dir("a"), hosts.dir("b"));
    write(&src.join("here"), b"here", 0o644);
    let missing = src.join("missing");
    let out = run(hosts
        .fastcp()
        .arg(on("hosta", &missing))
        .arg(on("hosta", &src.join("here")))
        .arg(format!("{}/", on("hostb", &dst))));
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let said = stderr(&out);
    let line = format!("fastcp: hosta: {}: no such file", missing.display());
    assert!(said.lines().any(|l| l.starts_with(&line)), "{said}");
    assert_eq!(std::fs::read(dst.join("here")).unwrap(), b"here");
}

#[test]
fn the_same_host_on_both_sides() {
    let sshd = Sshd::start().unwrap();
    let work = tempfile::tempdir().unwrap();
    let src = work.path().join("tree");
    build_mixed(&src);
    let dst = work.path().join("copy");
    let out = run(common::fastcp(&sshd, common::bin())
        .args(["-r", "-p"])
        .arg(common::remote(&sshd, &src))
        .arg(common::remote(&sshd, &dst)));
    assert!(out.status.success(), "{}", stderr(&out));
    assert_same_tree(&src, &dst, true);
}

/// The same host on both sides over SSH channels, one stream and two: the receiving half's
/// channels are not on the sending half's connections, where a receiver slower than the
/// sender would stop the connection both read from (the copy would end at --timeout).
#[test]
fn the_same_host_on_both_sides_over_ssh_channels() {
    let sshd = Sshd::start().unwrap();
    let work = tempfile::tempdir().unwrap();
    let src = work.path().join("big");
    write(&src, &pseudo_random(32 << 20, 5), 0o644);
    for streams in ["1", "2"] {
        let dst = work.path().join(format!("copy-{streams}"));
        let out = run(common::fastcp(&sshd, common::bin())
            .args(["--transport", "ssh", "-j", streams, "--json"])
            .arg(common::remote(&sshd, &src))
            .arg(common::remote(&sshd, &dst)));
        assert!(out.status.success(), "-j {streams}: {}", stderr(&out));
        assert_eq!(json(&out)["transport"], "ssh", "{}", json(&out));
        assert_eq!(std::fs::read(&dst).unwrap(), std::fs::read(&src).unwrap());
    }
    assert_no_temp(work.path());
}

/// The same host on both sides through the system ssh, which may ask (a connection master
/// of the copy's own): both servers ride one login, and ssh says nothing of a second one
/// ("ControlSocket ... already exists, disabling multiplexing").
#[test]
fn the_same_host_on_both_sides_through_the_system_ssh_logs_in_once() {
    let sshd = Sshd::start().unwrap();
    let work = tempfile::tempdir().unwrap();
    let src = work.path().join("tree");
    build_mixed(&src);
    let dst = work.path().join("copy");
    let out = run(common::fastcp(&sshd, common::bin())
        .args(["-S", "ssh", "-o", "BatchMode=no", "-r"])
        .arg(common::remote(&sshd, &src))
        .arg(common::remote(&sshd, &dst)));
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(!stderr(&out).contains("ControlSocket"), "{}", stderr(&out));
    assert_same_tree(&src, &dst, false);
}

/// Runs a relay of a big file, slowed down, and kills `host`'s server ("a" or "b") once
/// data is flowing; returns what fastcp said. The copy must end within a minute.
fn cut(host: &str) -> (Output, PathBuf) {
    signalled(host, "-9", "120")
}

/// As [`cut`], with `signal` for the server and `--timeout` `timeout`.
fn signalled(host: &str, signal: &str, timeout: &str) -> (Output, PathBuf) {
    let hosts = Hosts::start();
    let (src, dst) = (hosts.dir("a"), hosts.dir("b"));
    write(&src.join("big"), &pseudo_random(32 << 20, 3), 0o644);
    let mut child = hosts
        .fastcp()
        .args(["--bwlimit", "2M", "--json", "--timeout", timeout])
        .arg(on("hosta", &src.join("big")))
        .arg(on("hostb", &dst.join("big")))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_for_data(&mut child, &dst);
    for pid in hosts.pids(host) {
        let _ = Command::new("kill")
            .args([signal, &pid.to_string()])
            .status();
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("the copy went on after its {host} server was killed");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().unwrap();
    eprintln!("stderr: {}", stderr(&out));
    // A stopped server goes with its sshd's session.
    for pid in hosts.pids(host) {
        let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
    }
    assert!(
        !dst.join("big").exists(),
        "a partial file under its final name"
    );
    let _keep = hosts;
    (out, dst)
}

#[test]
fn a_cut_on_the_sending_host_ends_the_copy_naming_it() {
    let (out, _) = cut("a");
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    let v = json(&out);
    assert!(v["error"].as_str().unwrap().starts_with("hosta:"), "{v}");
}

#[test]
fn a_cut_on_the_receiving_host_ends_the_copy_naming_it() {
    let (out, _) = cut("b");
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    let v = json(&out);
    assert!(v["error"].as_str().unwrap().starts_with("hostb:"), "{v}");
}

/// Runs a relay of a big file with `args`, slowed down, and sends `signal` to the sshd
/// process that carries `host`'s ("a" or "b") login (the server's parent) once data is
/// flowing. Returns what fastcp said, and whether the file arrived whole. The copy must end
/// within a minute.
fn signal_login(host: &str, signal: &str, args: &[&str]) -> (Output, bool) {
    let hosts = Hosts::start();
    let (src, dst) = (hosts.dir("a"), hosts.dir("b"));
    write(&src.join("big"), &pseudo_random(16 << 20, 8), 0o644);
    let mut child = hosts
        .fastcp()
        .args(["--bwlimit", "4M"])
        .args(args)
        .arg(on("hosta", &src.join("big")))
        .arg(on("hostb", &dst.join("big")))
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_for_data(&mut child, &dst);
    let mut logins = Vec::new();
    for pid in hosts.pids(host) {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
        let ppid = stat.rsplit(") ").next().unwrap().split(' ').nth(1).unwrap();
        let comm = std::fs::read_to_string(format!("/proc/{ppid}/comm")).unwrap();
        assert!(comm.starts_with("sshd"), "the server's parent is {comm}");
        assert!(
            Command::new("kill")
                .args([signal, ppid])
                .status()
                .unwrap()
                .success()
        );
        logins.push(ppid.to_owned());
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("the copy never ended after host{host}'s login got {signal}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().unwrap();
    // A stopped login goes with its sshd.
    for pid in logins {
        let _ = Command::new("kill").args(["-9", &pid]).status();
    }
    let whole = std::fs::read(dst.join("big")).ok() == std::fs::read(src.join("big")).ok();
    (out, whole)
}

/// With sealed TCP data on both sides, the data does not go through either SSH login: a
/// login cut mid-copy (its sshd killed; its server lives on) ends neither the data nor the
/// copy, which arrives whole, verified, with exit code 0, as a push over TCP does.
#[test]
fn a_cut_login_leaves_a_copy_over_sealed_tcp_going() {
    for host in ["a", "b"] {
        let (out, whole) = signal_login(host, "-9", &["--transport", "tcp"]);
        assert_eq!(out.status.code(), Some(0), "host{host}: {}", stderr(&out));
        assert!(whole, "host{host}");
    }
}

/// A login stopped mid-copy (its sshd stopped) over SSH channels, noticed by SSH keepalives
/// alone: a stall of that host, naming ServerAliveInterval x ServerAliveCountMax, exit code
/// 3, not a connection that closed.
#[test]
fn a_stalled_login_noticed_by_keepalives_is_a_stall_of_its_host() {
    let (out, whole) = signal_login(
        "b",
        "-STOP",
        &[
            "--transport",
            "ssh",
            "--timeout",
            "0",
            "-o",
            "ServerAliveInterval=1",
            "-o",
            "ServerAliveCountMax=2",
        ],
    );
    let said = stderr(&out);
    assert_eq!(out.status.code(), Some(3), "{said}");
    assert!(!whole);
    assert!(said.starts_with("fastcp: hostb: "), "{said}");
    assert!(
        said.contains(
            "the other side or the network stopped answering: no reply to SSH keepalives for \
             2 s (ServerAliveInterval x ServerAliveCountMax)"
        ),
        "{said}"
    );
}

/// Either host's server stopped by SIGTERM: what it says is shown as that host's.
#[test]
fn a_servers_own_words_are_shown_as_its_hosts() {
    for host in ["a", "b"] {
        let (out, _) = signalled(host, "-TERM", "120");
        assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
        let said = stderr(&out);
        let server = format!("host{host}: fastcp server: interrupted by SIGTERM");
        assert!(said.contains(&server), "{said}");
        assert!(
            said.lines().all(|l| !l.starts_with("fastcp: interrupted")),
            "{said}"
        );
    }
}

/// A receiving host that stops taking data (its server stopped) ends the copy at --timeout,
/// named: this side was waiting to write to it.
#[test]
fn a_stall_on_the_receiving_host_times_out_naming_it() {
    let (out, _) = signalled("b", "-STOP", "3");
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    let v = json(&out);
    assert_eq!(v["error_kind"], "timeout", "{v}");
    assert!(v["error"].as_str().unwrap().starts_with("hostb:"), "{v}");
}

/// A sending host that goes quiet (its server stopped) leaves the receiver waiting as it
/// would for a slow sender: which one stopped cannot be told, and the error names both.
#[test]
fn a_stall_on_the_sending_host_times_out_naming_both() {
    let (out, _) = signalled("a", "-STOP", "3");
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    let v = json(&out);
    assert_eq!(v["error_kind"], "timeout", "{v}");
    let error = v["error"].as_str().unwrap();
    assert!(error.contains("between hosta and hostb"), "{v}");
}

/// The library: [`fastcp::Session::relay`] between two sessions a program holds, and a
/// plan with both operands on one host through that host's [`fastcp::Session::copy`].
#[test]
fn the_library_relays_between_two_sessions_and_within_one() {
    use fastcp::{CopyOptions, Location, Plan, Progress, Session};
    use std::sync::Arc;
    let hosts = Hosts::start();
    let (src_dir, dst) = (hosts.dir("a"), hosts.dir("b"));
    let src = src_dir.join("tree");
    build_mixed(&src);
    let ssh = fastcp::transport::SshOptions::default()
        .config_file(hosts.config.clone())
        .remote_path(BIN);
    let options = CopyOptions::default().recursive(true).preserve(true);
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let from = Location::parse(&on("hosta", &src));
        let to = Location::parse(&on("hostb", &dst.join("between")));
        let a = Session::connect(from.remote().unwrap(), &ssh, &options)
            .await
            .unwrap();
        let b = Session::connect(to.remote().unwrap(), &ssh, &options)
            .await
            .unwrap();
        let plan = Plan::new(vec![from.clone()], to, options.clone()).unwrap();
        assert!(plan.is_relay());
        let outcome = a
            .relay(&b, &plan, Arc::new(Progress::default()))
            .await
            .unwrap();
        assert!(outcome.report.is_complete());
        assert_eq!(outcome.report.local.files, outcome.report.peer.files);
        assert_same_tree(&src, &dst.join("between"), true);
        // Both operands on hosta: its own session copies between them.
        let within = src_dir.join("within");
        let plan = Plan::new(
            vec![from],
            Location::parse(&on("hosta", &within)),
            options.clone(),
        )
        .unwrap();
        a.copy(&plan, Arc::new(Progress::default())).await.unwrap();
        assert_same_tree(&src, &within, true);
    });
}

/// `--checksum` through the relay: a file of the same size and time but other bytes on the
/// target is sent, and counted as sent, not as skipped; the unchanged ones are skipped.
#[test]
fn checksum_sends_a_same_size_file_that_differs_and_skips_the_rest() {
    let hosts = Hosts::start();
    let (src_dir, dst) = (hosts.dir("a"), hosts.dir("b"));
    let src = src_dir.join("tree");
    std::fs::create_dir(&src).unwrap();
    for name in ["same1", "same2", "differs"] {
        write(&src.join(name), &pseudo_random(10_000, 7), 0o644);
    }
    let copy = || {
        run(hosts
            .fastcp()
            .args(["-r", "-p", "--checksum", "--json"])
            .arg(on("hosta", &src))
            .arg(on("hostb", &dst)))
    };
    assert!(copy().status.success());
    // Same size, same time, other bytes.
    let target = dst.join("tree/differs");
    let mtime = std::fs::metadata(&target).unwrap().modified().unwrap();
    write(&target, &pseudo_random(10_000, 8), 0o644);
    std::fs::File::options()
        .write(true)
        .open(&target)
        .unwrap()
        .set_modified(mtime)
        .unwrap();
    let out = copy();
    let v = json(&out);
    assert_eq!(v["exit_code"], 0, "{v}");
    assert_same_tree(&src, &dst.join("tree"), true);
    assert_eq!(v["files_skipped"], 2, "{v}");
    assert_eq!(v["bytes_skipped"], 20_000, "{v}");
    assert!(v["bytes_sent"].as_u64().unwrap() >= 10_000, "{v}");
}

/// A receiving host whose disk fills: the copy stops, and says why (the host's own reason,
/// not the broken pipe that follows it), naming the host.
#[test]
fn a_full_disk_on_the_receiving_host_is_named_as_the_reason() {
    let hosts = Hosts::start();
    let (src, dst) = (hosts.dir("a"), hosts.dir("b"));
    write(&src.join("big"), &pseudo_random(8 << 20, 5), 0o644);
    // Host b's fastcp runs where `dst` is a 1 MiB disk of its own, and lists what the disk
    // holds when it ends (only it sees that disk).
    let listing = hosts.work.path().join("b-disk");
    let unshare = fastcp_testsupport::tools::require("unshare");
    let remote_path = script(
        hosts.work.path(),
        "fastcp-small-disk-on-b",
        &format!(
            r#"case "$FASTCP_TEST_PIDS" in
*pids-b) exec '{unshare}' --mount --map-root-user sh -c 'mount -t tmpfs -o size=1m tmpfs "{dst}" || exit 99; "{BIN}" "$@"; rc=$?; ls -A "{dst}" > "{listing}.part"; mv "{listing}.part" "{listing}"; exit $rc' fastcp "$@" ;;
*) exec "{BIN}" "$@" ;;
esac"#,
            unshare = unshare.display(),
            dst = dst.display(),
            listing = listing.display(),
        ),
    );
    let out = run(hosts
        .fastcp_running(&remote_path)
        .args(["--json"])
        .arg(on("hosta", &src.join("big")))
        .arg(on("hostb", &dst.join("big"))));
    let v = json(&out);
    assert_ne!(v["exit_code"], 0, "{v}");
    let error = v["error"].as_str().unwrap_or_default().to_owned()
        + v["errors"][0]["message"].as_str().unwrap_or_default();
    assert!(error.contains("no space left"), "{v}");
    // The server may still be cleaning up as fastcp returns.
    let deadline = Instant::now() + Duration::from_secs(30);
    while !listing.exists() {
        assert!(Instant::now() < deadline, "host b's server did not end");
        std::thread::sleep(Duration::from_millis(20));
    }
    let disk = std::fs::read_to_string(&listing).unwrap();
    assert!(
        disk.lines().all(|l| l != "big" && !l.contains(".fastcp-")),
        "left on the full disk: {disk}"
    );
}

/// `--resume` through the relay: the target host's partial file is continued, only what it
/// lacks crosses, and the file is whole; `-H`: hard links arrive as one inode.
#[test]
fn resume_continues_the_target_hosts_partial_file_and_hard_links_stay_one() {
    use std::os::unix::fs::MetadataExt;
    let hosts = Hosts::start();
    let (src, dst) = (hosts.dir("a"), hosts.dir("b"));
    const MIB: usize = 1 << 20;
    let content = pseudo_random(12 * MIB + 777, 9);
    write(&src.join("big"), &content, 0o644);
    std::fs::write(dst.join(".big.fastcp-partial"), &content[..8 * MIB + 100]).unwrap();
    let out = run(hosts
        .fastcp()
        .args(["--resume", "--json"])
        .arg(on("hosta", &src.join("big")))
        .arg(on("hostb", &dst.join("big"))));
    let v = json(&out);
    assert_eq!(v["exit_code"], 0, "{v}");
    assert!(
        std::fs::read(dst.join("big")).unwrap() == content,
        "not identical"
    );
    let resumed = v["bytes_resumed"].as_u64().unwrap();
    assert!(resumed >= 7 * MIB as u64, "{v}");
    assert_eq!(
        v["bytes_sent"].as_u64().unwrap(),
        content.len() as u64 - resumed,
        "{v}"
    );
    assert_no_temp(&dst);

    let tree = src.join("linked");
    std::fs::create_dir(&tree).unwrap();
    write(&tree.join("one"), b"shared", 0o644);
    std::fs::hard_link(tree.join("one"), tree.join("two")).unwrap();
    let out = run(hosts
        .fastcp()
        .args(["-r", "-H"])
        .arg(on("hosta", &tree))
        .arg(on("hostb", &dst)));
    assert!(out.status.success(), "{}", stderr(&out));
    let ino = |name: &str| {
        std::fs::metadata(dst.join("linked").join(name))
            .unwrap()
            .ino()
    };
    assert_eq!(ino("one"), ino("two"));
}

/// `-H` with `--skip-unchanged` or `--checksum`: a rerun skips every name, the further names
/// of an unchanged file too, as a push or a pull counts them; a further name made again is
/// a file written and, its bytes not travelling, skipped too.
#[test]
fn a_rerun_with_hard_links_skips_every_name_as_a_push_does() {
    let hosts = Hosts::start();
    let (src_dir, dst) = (hosts.dir("a"), hosts.dir("b"));
    let src = src_dir.join("hs");
    std::fs::create_dir_all(src.join("d")).unwrap();
    write(&src.join("f"), b"a", 0o644);
    std::fs::hard_link(src.join("f"), src.join("d/g")).unwrap();
    std::fs::hard_link(src.join("f"), src.join("h")).unwrap();
    write(&src.join("big"), &pseudo_random(5 << 20, 5), 0o644);
    std::fs::hard_link(src.join("big"), src.join("d/big2")).unwrap();
    let copy = |how: &str| {
        let out = run(hosts
            .fastcp()
            .args(["-r", "-p", "-H", "--json", how])
            .arg(on("hosta", &src))
            .arg(on("hostb", &dst)));
        assert!(out.status.success(), "{}", stderr(&out));
        let v = json(&out);
        (
            v["files"].as_u64().unwrap(),
            v["files_skipped"].as_u64().unwrap(),
        )
    };
    assert_eq!(copy("-v").0, 5);
    assert_eq!(copy("--skip-unchanged"), (0, 5));
    assert_eq!(copy("--checksum"), (0, 5));
    std::fs::remove_file(dst.join("hs/h")).unwrap();
    assert_eq!(copy("--skip-unchanged"), (1, 5));
    // `d/g` is the first name of `f`: the walk goes in name order (big, d/big2, d/g, f, h).
    std::fs::remove_file(dst.join("hs/f")).unwrap();
    assert_eq!(copy("--checksum"), (1, 5));
}

/// `-r dir hostb:file`, the file existing: refused with one line, exit 1, nothing written.
#[test]
fn a_folder_onto_an_existing_file_is_refused_with_one_line() {
    let hosts = Hosts::start();
    let (src_dir, dst) = (hosts.dir("a"), hosts.dir("b"));
    let src = src_dir.join("tree");
    build_mixed(&src);
    write(&dst.join("afile"), b"a file", 0o644);
    let out = run(hosts
        .fastcp()
        .arg("-r")
        .arg(on("hosta", &src))
        .arg(on("hostb", &dst.join("afile"))));
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let said = stderr(&out);
    assert_eq!(said.lines().count(), 1, "{said}");
    assert!(said.contains("exists and is not a directory"), "{said}");
    assert_eq!(std::fs::read(dst.join("afile")).unwrap(), b"a file");
    assert_eq!(scan(&dst).len(), 1, "{:?}", scan(&dst).keys());
}

/// With `-v` and `-vv`, over SSH channels and sealed TCP, each line is about one of the two
/// sessions, and says which host it concerns, as an error from either host does.
#[test]
fn every_verbose_line_names_its_host() {
    let hosts = Hosts::start();
    let (src, dst) = (hosts.dir("a"), hosts.dir("b"));
    write(&src.join("f"), &pseudo_random(100_000, 3), 0o644);
    for (verbose, transport) in [("-v", "ssh"), ("-vv", "ssh"), ("-v", "tcp"), ("-vv", "tcp")] {
        let out = run(hosts
            .fastcp()
            .args([verbose, "--transport", transport])
            .arg(on("hosta", &src.join("f")))
            .arg(on("hostb", &dst.join(format!("f{verbose}-{transport}")))));
        let said = stderr(&out);
        assert!(out.status.success(), "{said}");
        for host in ["hosta", "hostb"] {
            assert!(
                said.contains(&format!("fastcp: {host}: authenticated")),
                "{verbose} {transport}: {said}"
            );
        }
        for line in said.lines() {
            assert!(
                line.starts_with("fastcp: hosta: ") || line.starts_with("fastcp: hostb: "),
                "{verbose} {transport}: a line that names no host: {line}\n{said}"
            );
        }
    }
}

/// Waits (a minute at most) until data flows: the receiver's temp file in `dst` has some of
/// it, while `child` still runs.
fn wait_for_data(child: &mut std::process::Child, dst: &Path) {
    let deadline = Instant::now() + Duration::from_secs(60);
    let flowing = || {
        std::fs::read_dir(dst)
            .unwrap()
            .filter_map(Result::ok)
            .any(|e| e.metadata().is_ok_and(|m| m.len() > 0))
    };
    while !flowing() {
        assert!(Instant::now() < deadline, "no data arrived");
        assert!(child.try_wait().unwrap().is_none(), "fastcp ended early");
        std::thread::sleep(Duration::from_millis(20));
    }
}
