//! The library as an embedding program uses it: blocking calls, cancellation through a
//! token, and typed errors.

use std::sync::Arc;
use std::time::{Duration, Instant};

mod common;

use fastcp::{
    CancellationToken, CopyOptions, ErrorKind, Fault, Location, Plan, Progress, Session,
    TransportChoice, TransportUsed,
};
use fastcp_testsupport::Sshd;
use fastcp_testsupport::tree::{
    assert_no_temp, assert_same_tree, build_tiny, pseudo_random, write,
};

#[test]
fn a_blocking_copy_copies_a_tree() {
    let work = tempfile::tempdir().unwrap();
    let src = work.path().join("src");
    build_tiny(&src, 50);
    let plan = Plan::new(
        vec![Location::Local(src.clone())],
        Location::Local(work.path().join("dst")),
        CopyOptions::default().recursive(true).preserve(true),
    )
    .unwrap();
    let outcome = fastcp::blocking::copy_local(&plan, Arc::new(Progress::default())).unwrap();
    assert!(outcome.report.is_complete());
    assert_same_tree(&src, &work.path().join("dst"), true);
}

/// A token cancels a copy in flight: the call returns `Cancelled` at once, and the temp
/// files go.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_copy_returns_cancelled_and_leaves_no_temp_file() {
    let work = tempfile::tempdir().unwrap();
    let src = work.path().join("big");
    write(&src, &pseudo_random(32 << 20, 9), 0o644);
    let dst = work.path().join("dst");
    std::fs::create_dir(&dst).unwrap();
    let token = CancellationToken::new();
    let plan = Plan::new(vec![Location::Local(src)], Location::Local(dst.clone()), {
        // Slow enough to be cancelled mid-file.
        CopyOptions::default()
            .bwlimit(4 << 20)
            .cancel(token.clone())
    })
    .unwrap();
    let (progress, seen) = recording();
    let copy = tokio::spawn({
        let progress = progress.clone();
        async move { fastcp::copy_local(&plan, progress).await }
    });
    let deadline = Instant::now() + Duration::from_secs(30);
    while progress.snapshot().bytes_done == 0 {
        assert!(Instant::now() < deadline, "the copy never started");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    token.cancel();
    let cancelled_at = Instant::now();
    let err = tokio::time::timeout(Duration::from_secs(10), copy)
        .await
        .expect("cancel did not stop the copy")
        .unwrap()
        .unwrap_err();
    assert!(cancelled_at.elapsed() < Duration::from_secs(10));
    assert_eq!(
        (err.kind(), err.fault()),
        (ErrorKind::Cancelled, Fault::User),
        "{err}"
    );
    // The last event says so, with what had been done.
    match seen.lock().unwrap().last() {
        Some(fastcp::Event::Aborted { message, progress }) => {
            assert_eq!(message, &err.to_string());
            assert!(progress.bytes_done > 0, "{progress:?}");
        }
        other => panic!("the last event is {other:?}"),
    }
    // The engine's writers removed their temp files before it returned.
    assert_eq!(
        std::fs::read_dir(&dst).unwrap().count(),
        0,
        "a temp file is left"
    );
    assert_no_temp(&dst);
}

/// A host nobody answers on: the error says it is the network's, not a file's.
#[test]
fn an_unreachable_host_is_a_connect_error_on_the_network() {
    let work = tempfile::tempdir().unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let cfg = work.path().join("config");
    std::fs::write(
        &cfg,
        format!(
            "Host dead\n  HostName 127.0.0.1\n  Port {port}\n  IdentityFile {}/none\n  \
             IdentityAgent none\n  BatchMode yes\n",
            work.path().display()
        ),
    )
    .unwrap();
    let src = work.path().join("f");
    std::fs::write(&src, b"x").unwrap();
    let plan = Plan::new(
        vec![Location::Local(src)],
        Location::parse("dead:/tmp/x"),
        CopyOptions::default(),
    )
    .unwrap();
    let ssh = fastcp::transport::SshOptions::default().config_file(cfg);
    let (progress, seen) = recording();
    let err = fastcp::blocking::copy_remote(&plan, &ssh, progress).unwrap_err();
    assert_eq!(
        (err.kind(), err.fault()),
        (ErrorKind::Connect, Fault::Network),
        "{err}"
    );
    // A copy that never got going ends its events too, with nothing done.
    let seen = seen.lock().unwrap();
    match &seen[..] {
        [fastcp::Event::Aborted { message, progress }] => {
            assert_eq!(message, &err.to_string());
            assert_eq!(*progress, fastcp::stream::Snapshot::default());
        }
        other => panic!("events: {other:?}"),
    }
}

/// A program with no terminal answers the login's questions itself (`SshClientConfig::
/// prompt`): a passphrase-protected key logs in with the passphrase it gives, every question
/// reaches it with its text, and without an answer the key is skipped, as without a terminal.
#[test]
fn a_prompt_answers_the_passphrase_in_place_of_the_terminal() {
    const PASSPHRASE: &str = "correct horse";
    let sshd = Sshd::start().unwrap();
    let work = tempfile::tempdir().unwrap();
    let key = work.path().join("locked");
    let st = std::process::Command::new(fastcp_testsupport::tools::require("ssh-keygen"))
        .args(["-q", "-t", "ed25519", "-N", PASSPHRASE, "-f"])
        .arg(&key)
        .status()
        .unwrap();
    assert!(st.success());
    std::fs::copy(key.with_extension("pub"), sshd.authorized_keys()).unwrap();
    let cfg = work.path().join("config");
    let block = sshd
        .host_block(sshd.alias())
        .replace(
            &sshd.client_key().display().to_string(),
            &key.display().to_string(),
        )
        .replace("BatchMode yes", "BatchMode no");
    std::fs::write(&cfg, block).unwrap();
    let src = work.path().join("f");
    std::fs::write(&src, b"unlocked").unwrap();
    let copy = |answer: Option<&'static str>, name: &str| {
        let asked = Arc::new(std::sync::Mutex::new(Vec::new()));
        let prompt = fastcp::transport::Prompt::new({
            let asked = asked.clone();
            move |q: &fastcp::transport::Question<'_>| {
                asked
                    .lock()
                    .unwrap()
                    .push((q.kind, q.text.to_owned(), q.echo));
                answer.map(|a| format!("{a}\n"))
            }
        });
        let ssh = fastcp::transport::SshOptions::default()
            .config_file(cfg.clone())
            .remote_path(common::BIN)
            .client(fastcp::transport::SshClientConfig {
                prompt: Some(prompt),
                ..Default::default()
            });
        let plan = Plan::new(
            vec![Location::Local(src.clone())],
            on(&sshd, &work.path().join(name)),
            CopyOptions::default(),
        )
        .unwrap();
        let result = fastcp::blocking::copy_remote(&plan, &ssh, Arc::new(Progress::default()));
        let asked = asked.lock().unwrap().clone();
        (result, asked)
    };
    let (result, asked) = copy(Some(PASSPHRASE), "copied");
    result.unwrap();
    assert_eq!(
        std::fs::read(work.path().join("copied")).unwrap(),
        b"unlocked"
    );
    // Asked as a passphrase, never echoed; the newline after the answer is dropped.
    assert!(
        !asked.is_empty()
            && asked.iter().all(|(kind, q, echo)| {
                *kind == fastcp::transport::QuestionKind::Passphrase
                    && q.starts_with("Enter passphrase for key")
                    && !echo
            }),
        "{asked:?}"
    );
    let (result, asked) = copy(None, "refused");
    let err = result.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Auth, "{err}");
    assert!(!asked.is_empty());
    assert!(!work.path().join("refused").exists());

    // An unknown host key under `StrictHostKeyChecking ask`: asked once; "yes" trusts it
    // (and records it), any other answer refuses it.
    let known = work.path().join("known_hosts");
    let block = sshd
        .host_block(sshd.alias())
        .replace(
            &sshd.client_key().display().to_string(),
            &key.display().to_string(),
        )
        .replace(
            &sshd.known_hosts().display().to_string(),
            &known.display().to_string(),
        )
        .replace("StrictHostKeyChecking yes", "StrictHostKeyChecking ask")
        .replace("BatchMode yes", "BatchMode no");
    std::fs::write(&cfg, block).unwrap();
    for (answer, trusted) in [("maybe", false), ("yes", true)] {
        let asked = Arc::new(std::sync::Mutex::new(Vec::new()));
        let prompt = fastcp::transport::Prompt::new({
            let asked = asked.clone();
            move |q: &fastcp::transport::Question<'_>| {
                if q.kind == fastcp::transport::QuestionKind::Passphrase {
                    return Some(PASSPHRASE.to_owned());
                }
                asked.lock().unwrap().push((q.kind, q.echo));
                Some(answer.to_owned())
            }
        });
        let ssh = fastcp::transport::SshOptions::default()
            .config_file(cfg.clone())
            .remote_path(common::BIN)
            .client(fastcp::transport::SshClientConfig {
                prompt: Some(prompt),
                ..Default::default()
            });
        let target = work.path().join(format!("host-{answer}"));
        let plan = Plan::new(
            vec![Location::Local(src.clone())],
            on(&sshd, &target),
            CopyOptions::default(),
        )
        .unwrap();
        let result = fastcp::blocking::copy_remote(&plan, &ssh, Arc::new(Progress::default()));
        assert_eq!(result.is_ok(), trusted, "{answer}: {:?}", result.err());
        assert_eq!(target.exists(), trusted);
        let asked = asked.lock().unwrap().clone();
        assert_eq!(
            asked,
            [(fastcp::transport::QuestionKind::HostKey, true)],
            "{answer}"
        );
    }
}

/// A local copy under a bandwidth limit runs its sender and receiver over paced pipes: its
/// events come once per file, as an unpaced copy's do, a deletion once, and a sparse file's
/// holes do not count against the limit.
#[test]
fn a_paced_local_copy_reports_each_event_once_and_skips_holes() {
    use std::os::unix::fs::FileExt;
    let work = tempfile::tempdir().unwrap();
    let src = work.path().join("src");
    build_tiny(&src, 6);
    let sparse = std::fs::File::create(src.join("sparse")).unwrap();
    sparse.set_len(256 << 20).unwrap();
    sparse.write_all_at(b"data", 100 << 20).unwrap();
    drop(sparse);
    let dst = work.path().join("dst");
    std::fs::create_dir_all(dst.join("src")).unwrap();
    std::fs::write(dst.join("src/extra"), b"goes").unwrap();
    let (progress, seen) = recording();
    let plan = Plan::new(
        vec![Location::Local(src.clone())],
        Location::Local(dst.clone()),
        CopyOptions::default()
            .recursive(true)
            .delete(true)
            .bwlimit(64 << 20),
    )
    .unwrap();
    let outcome = fastcp::blocking::copy_local(&plan, progress).unwrap();
    assert!(outcome.report.is_complete());
    assert_eq!(
        std::fs::read(dst.join("src/sparse")).unwrap(),
        std::fs::read(src.join("sparse")).unwrap()
    );
    // 256 MiB at 64 MiB/s would take four seconds; the chunk with data and the small
    // files, no time.
    assert!(outcome.report.bytes_sent < 2 << 20, "{:?}", outcome.report);
    let seen = seen.lock().unwrap();
    let count = |f: fn(&fastcp::Event) -> bool| seen.iter().filter(|e| f(e)).count();
    let files = outcome.report.local.files as usize;
    assert!(files >= 7);
    assert_eq!(count(|e| matches!(e, fastcp::Event::Started { .. })), files);
    assert_eq!(count(|e| matches!(e, fastcp::Event::Done { .. })), files);
    assert_eq!(count(|e| matches!(e, fastcp::Event::Deleted { .. })), 1);
    assert!(!dst.join("src/extra").exists());
}

/// A dry run walks its sources off the runtime's threads: on a runtime of one thread, a
/// task still runs while the walk is under way (here, the task that lets each entry
/// through the filter; on the runtime's thread the walk would wait for it in vain).
#[test]
fn a_dry_run_walks_off_the_runtime_thread() {
    let work = tempfile::tempdir().unwrap();
    let src = work.path().join("src");
    build_tiny(&src, 5);
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    let rx = std::sync::Mutex::new(rx);
    let filter = fastcp::stream::Filter::default().with_predicate(Arc::new(move |_, _| {
        let rx = rx.lock().unwrap();
        rx.recv_timeout(Duration::from_secs(5)).is_ok()
    }));
    let plan = Plan::new(
        vec![Location::Local(src.clone())],
        Location::Local(work.path().join("dst")),
        CopyOptions::default()
            .recursive(true)
            .dry_run(true)
            .filter(filter),
    )
    .unwrap();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let outcome = runtime.block_on(async {
        tokio::spawn(async move {
            while tx.send(()).is_ok() {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        });
        fastcp::copy_local(&plan, Arc::new(Progress::default()))
            .await
            .unwrap()
    });
    let mut walked = 0;
    let mut stack = vec![src.clone()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            walked += 1;
            if p.is_dir() && !p.is_symlink() {
                stack.push(p);
            }
        }
    }
    // Every entry, and the top.
    assert_eq!(outcome.listing.len(), walked + 1, "{:?}", outcome.listing);

    // A predicate that panics stops the walk, and the listing says it is not complete.
    let filter = fastcp::stream::Filter::default()
        .with_predicate(Arc::new(|_, is_dir| is_dir || panic!("a predicate")));
    let plan = Plan::new(
        vec![Location::Local(src.clone())],
        Location::Local(work.path().join("dst")),
        CopyOptions::default()
            .recursive(true)
            .dry_run(true)
            .filter(filter),
    )
    .unwrap();
    let outcome = fastcp::blocking::copy_local(&plan, Arc::new(Progress::default())).unwrap();
    assert!(!outcome.report.is_complete());
    assert!(
        outcome.report.failures[0]
            .message
            .contains("stopped before its end"),
        "{:?}",
        outcome.report
    );
}

/// A local copy's sender and receiver share one `Progress`: what the quick check skipped
/// and what `--resume` kept are counted once, as the report counts them.
#[test]
fn a_local_copy_counts_skipped_and_kept_bytes_once() {
    let work = tempfile::tempdir().unwrap();
    let src = work.path().join("src");
    build_tiny(&src, 6);
    write(&src.join("big"), &pseudo_random(12 << 20, 3), 0o644);
    let dst = work.path().join("dst");
    std::fs::create_dir(&dst).unwrap();
    let copy = |options: CopyOptions| {
        let plan = Plan::new(
            vec![Location::Local(src.clone())],
            Location::Local(dst.clone()),
            options,
        )
        .unwrap();
        let progress = Arc::new(Progress::default());
        let outcome = fastcp::blocking::copy_local(&plan, progress.clone()).unwrap();
        (outcome.report, progress.snapshot())
    };
    let options = CopyOptions::default().recursive(true).skip_unchanged(true);
    copy(options.clone());
    let (report, seen) = copy(options.clone());
    assert!(report.files_skipped > 6, "{report:?}");
    assert_eq!(
        (seen.files_skipped, seen.bytes_skipped),
        (report.files_skipped, report.bytes_skipped)
    );
    // A partial file of the first 8 MiB of the big file, which changed since.
    std::fs::remove_file(dst.join("src/big")).unwrap();
    let content = std::fs::read(src.join("big")).unwrap();
    std::fs::write(dst.join("src/.big.fastcp-partial"), &content[..8 << 20]).unwrap();
    let (report, seen) = copy(options.resume(true));
    assert_eq!(report.bytes_resumed, 8 << 20, "{report:?}");
    assert_eq!(seen.bytes_resumed, report.bytes_resumed);
}

type Seen = Arc<std::sync::Mutex<Vec<fastcp::Event>>>;

/// Counters whose events are kept, in order.
fn recording() -> (Arc<Progress>, Seen) {
    let seen = Seen::default();
    let sink = fastcp::EventSink::new({
        let seen = seen.clone();
        move |e: &fastcp::Event| seen.lock().unwrap().push(e.clone())
    });
    (Arc::new(Progress::with_events(sink)), seen)
}

/// SSH options for the test sshd, with the fastcp under test as the remote program.
fn ssh_options(sshd: &Sshd) -> fastcp::transport::SshOptions {
    fastcp::transport::SshOptions::default()
        .config_file(sshd.ssh_config())
        .remote_path(common::BIN)
}

/// `path` on the test sshd's host.
fn on(sshd: &Sshd, path: &std::path::Path) -> Location {
    Location::parse(&common::remote(sshd, path))
}

/// One `Session`, many copies: pushes and a pull one after another, two pushes at the same
/// time, all over one SSH login; copies over SSH channels open one more connection once and
/// keep it; a copy to another host is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_session_runs_many_copies_over_one_login() {
    let sshd = Sshd::start().unwrap();
    let work = tempfile::tempdir().unwrap();
    let srcs: Vec<_> = (0..4)
        .map(|i| {
            let src = work.path().join(format!("src{i}"));
            build_tiny(&src, 20 + i);
            src
        })
        .collect();
    let ssh = ssh_options(&sshd);
    let remote = |p: &std::path::Path| on(&sshd, p);
    let options = CopyOptions::default().recursive(true);
    let target = remote(work.path());
    let session = Session::connect(target.remote().unwrap(), &ssh, &options)
        .await
        .unwrap();
    let copy = |from: Location, to: Location, options: CopyOptions| {
        let plan = Plan::new(vec![from], to, options).unwrap();
        let session = &session;
        async move {
            let outcome = session
                .copy(&plan, Arc::new(Progress::default()))
                .await
                .unwrap();
            assert!(outcome.report.is_complete());
            outcome
        }
    };
    let logins = || sshd.log().matches("Accepted publickey").count();

    // One after another: a push, then a pull of what it wrote.
    let pushed = work.path().join("pushed0");
    copy(
        Location::Local(srcs[0].clone()),
        remote(&pushed),
        options.clone(),
    )
    .await;
    let back = work.path().join("back0");
    copy(
        remote(&pushed),
        Location::Local(back.clone()),
        options.clone(),
    )
    .await;
    assert_same_tree(&srcs[0], &back, false);
    // At the same time.
    let (a, b) = tokio::join!(
        copy(
            Location::Local(srcs[1].clone()),
            remote(&work.path().join("pushed1")),
            options.clone()
        ),
        copy(
            Location::Local(srcs[2].clone()),
            remote(&work.path().join("pushed2")),
            options.clone()
        ),
    );
    assert_eq!(
        (a.transport, b.transport),
        (TransportUsed::Tcp, TransportUsed::Tcp)
    );
    assert_same_tree(&srcs[1], &work.path().join("pushed1"), false);
    assert_same_tree(&srcs[2], &work.path().join("pushed2"), false);
    assert_eq!(logins(), 1, "four copies, one login");

    // Two streams over SSH channels: one more connection, opened once; the second copy
    // compressed.
    let over_ssh = options.clone().transport(TransportChoice::Ssh).streams(2);
    for (name, compress) in [("pushed3", false), ("pushed4", true)] {
        let outcome = copy(
            Location::Local(srcs[3].clone()),
            remote(&work.path().join(name)),
            over_ssh.clone().compress(compress),
        )
        .await;
        assert_eq!(
            (outcome.transport, outcome.streams),
            (TransportUsed::Ssh, 2)
        );
        let zstd = compress.then_some(fastcp::compress::Compression::Zstd);
        assert_eq!(outcome.compression, zstd);
        assert_same_tree(&srcs[3], &work.path().join(name), false);
    }
    assert_eq!(logins(), 2);

    // Another host is not this session's.
    let plan = Plan::new(
        vec![Location::Local(srcs[0].clone())],
        Location::parse("elsewhere:/tmp/x"),
        options.clone(),
    )
    .unwrap();
    let err = session
        .copy(&plan, Arc::new(Progress::default()))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Usage, "{err}");
    session.close().await;
    assert_eq!(logins(), 2);
}

/// A session whose extra logins are refused (`PerSourceMaxStartups 1` drops the ones that
/// start together) copies over the connections that logged in, warns once, and does not
/// log in for more streams again in the copies after.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_whose_extra_logins_are_refused_copies_over_fewer_streams() {
    let options = CopyOptions::default().transport(TransportChoice::Ssh);
    let streams = three_copies_with_extra_logins_refused(options).await;
    assert!(streams[0] < 4, "{streams:?}");
    assert!(streams.iter().all(|&n| n == streams[0]), "{streams:?}");
}

/// The same over SFTP (`--sftp`, four sessions): the first copy goes over the sessions that
/// logged in, with one warning; the copies after it (within ten minutes) take one session and log in no more.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_whose_extra_sftp_logins_are_refused_copies_over_fewer_sessions() {
    let sessions = three_copies_with_extra_logins_refused(CopyOptions::default().sftp(true)).await;
    assert!(sessions[0] < 4, "{sessions:?}");
    assert_eq!(sessions[1..], [1, 1], "{sessions:?}");
}

/// Three recursive pushes with four streams and `options` over one `Session` to an sshd
/// that drops logins starting together (`PerSourceMaxStartups 1`): each copy is complete
/// and leaves no temp file, one warning in all names MaxStartups, and no login is tried
/// after the first copy. Returns each copy's stream (or SFTP session) count.
async fn three_copies_with_extra_logins_refused(options: CopyOptions) -> Vec<usize> {
    let sshd = Sshd::start_with_options("PerSourceMaxStartups 1").unwrap();
    let work = tempfile::tempdir().unwrap();
    let src = work.path().join("src");
    build_tiny(&src, 50);
    let warnings = Arc::new(std::sync::Mutex::new(Vec::new()));
    let log = fastcp::Log::new({
        let warnings = warnings.clone();
        move |level, line| {
            if level == fastcp::LogLevel::Warn {
                warnings.lock().unwrap().push(line.to_owned());
            }
        }
    });
    let options = options.recursive(true).streams(4).log(log);
    let target = on(&sshd, work.path());
    let session = Session::connect(target.remote().unwrap(), &ssh_options(&sshd), &options)
        .await
        .unwrap();
    let tries = || {
        let log = sshd.log();
        log.matches("Accepted publickey").count() + log.matches("past MaxStartups").count()
    };
    let mut streams = Vec::new();
    let mut after_first = None;
    for name in ["pushed0", "pushed1", "pushed2"] {
        let to = work.path().join(name);
        let plan = Plan::new(
            vec![Location::Local(src.clone())],
            on(&sshd, &to),
            options.clone(),
        )
        .unwrap();
        let outcome = session
            .copy(&plan, Arc::new(Progress::default()))
            .await
            .unwrap();
        assert!(outcome.report.is_complete());
        assert_same_tree(&src, &to, false);
        assert_no_temp(&to);
        streams.push(outcome.streams);
        after_first.get_or_insert_with(tries);
    }
    let warnings = warnings.lock().unwrap();
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert!(warnings[0].contains("MaxStartups"), "{warnings:?}");
    assert_eq!(
        Some(tries()),
        after_first,
        "no more logins after the first copy"
    );
    streams
}

/// `fastcp::blocking::Session`: two copies from two threads over one login.
#[test]
fn a_blocking_session_copies_from_two_threads() {
    let sshd = Sshd::start().unwrap();
    let work = tempfile::tempdir().unwrap();
    let src = work.path().join("src");
    build_tiny(&src, 30);
    let ssh = ssh_options(&sshd);
    let remote = |p: &std::path::Path| on(&sshd, p);
    let options = CopyOptions::default().recursive(true);
    let target = remote(work.path());
    let session =
        fastcp::blocking::Session::connect(target.remote().unwrap(), &ssh, &options).unwrap();
    std::thread::scope(|scope| {
        for name in ["copy0", "copy1"] {
            let plan = Plan::new(
                vec![Location::Local(src.clone())],
                remote(&work.path().join(name)),
                options.clone(),
            )
            .unwrap();
            let session = &session;
            scope.spawn(move || {
                let outcome = session.copy(&plan, Arc::new(Progress::default())).unwrap();
                assert!(outcome.report.is_complete());
            });
        }
    });
    session.close().unwrap();
    for name in ["copy0", "copy1"] {
        assert_same_tree(&src, &work.path().join(name), false);
    }
    assert_eq!(sshd.log().matches("Accepted publickey").count(), 1);
}

/// The events a copy reports, file by file: from the sending side on a push (sent, then
/// skipped on the rerun), from the receiving side on a pull (verified, deleted, failed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_tell_what_happened_to_each_file() {
    use fastcp::{Event, EventSink, SkipReason};
    use std::sync::Mutex;

    let sshd = Sshd::start().unwrap();
    let work = tempfile::tempdir().unwrap();
    let src = work.path().join("src");
    build_tiny(&src, 12);
    let ssh = ssh_options(&sshd);
    let remote = |p: &std::path::Path| on(&sshd, p);
    let run = |from: Location, to: Location, options: CopyOptions| {
        let ssh = ssh.clone();
        async move {
            let seen = Arc::new(Mutex::new(Vec::new()));
            let sink = EventSink::new({
                let seen = seen.clone();
                move |e: &Event| seen.lock().unwrap().push(e.clone())
            });
            let plan = Plan::new(vec![from], to, options).unwrap();
            let outcome = fastcp::copy_remote(&plan, &ssh, Arc::new(Progress::with_events(sink)))
                .await
                .unwrap();
            let seen = seen.lock().unwrap().clone();
            (outcome, seen)
        }
    };
    let count = |seen: &[Event], f: fn(&Event) -> bool| seen.iter().filter(|e| f(e)).count();
    let options = CopyOptions::default().recursive(true).skip_unchanged(true);
    let pushed = work.path().join("pushed");
    std::fs::create_dir(&pushed).unwrap();
    let (outcome, seen) = run(
        Location::Local(src.clone()),
        remote(&pushed),
        options.clone(),
    )
    .await;
    // The last event is the summary the call returns.
    match seen.last() {
        Some(Event::Finished(report)) => assert_eq!(**report, outcome.report),
        other => panic!("the last event is {other:?}"),
    }
    assert_eq!(count(&seen, |e| matches!(e, Event::Finished(_))), 1);
    assert_eq!(count(&seen, |e| matches!(e, Event::Started { .. })), 12);
    assert_eq!(
        count(&seen, |e| matches!(
            e,
            Event::Done {
                verified: false,
                ..
            }
        )),
        12,
        "a push reports files sent: {seen:?}"
    );
    let (_, seen) = run(
        Location::Local(src.clone()),
        remote(&pushed),
        options.clone(),
    )
    .await;
    assert_eq!(
        count(&seen, |e| matches!(
            e,
            Event::Skipped {
                reason: SkipReason::Unchanged,
                ..
            }
        )),
        12,
        "{seen:?}"
    );
    assert_eq!(count(&seen, |e| matches!(e, Event::Started { .. })), 0);

    // A pull mirrors into a folder with an extra file, after one file changed.
    let pulled = work.path().join("pulled");
    std::fs::create_dir(&pulled).unwrap();
    let from = remote(&pushed.join("src"));
    run(
        from.clone(),
        Location::Local(pulled.clone()),
        options.clone(),
    )
    .await;
    std::fs::write(pulled.join("src/extra"), b"x").unwrap();
    std::fs::write(pushed.join("src/d00/f00000"), b"changed").unwrap();
    let (outcome, seen) = run(
        from,
        Location::Local(pulled.clone()),
        options.clone().delete(true),
    )
    .await;
    assert!(outcome.report.is_complete());
    let done: Vec<_> = seen
        .iter()
        .filter_map(|e| match e {
            Event::Done {
                path,
                verified: true,
                ..
            } => Some(path.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(done, [&b"src/d00/f00000"[..]], "{seen:?}");
    assert_eq!(
        count(
            &seen,
            |e| matches!(e, Event::Deleted { path } if &path[..] == b"src/extra")
        ),
        1,
        "{seen:?}"
    );
    assert_eq!(count(&seen, |e| matches!(e, Event::Skipped { .. })), 11);

    // A pull into a new folder with `link_dest`: every file is linked from the last one.
    let (outcome, seen) = run(
        remote(&pushed.join("src")),
        Location::Local(work.path().join("pulled2")),
        options.clone().link_dest(pulled.join("src")),
    )
    .await;
    assert!(outcome.report.is_complete());
    assert_eq!(
        count(&seen, |e| matches!(
            e,
            Event::Skipped {
                reason: SkipReason::Linked,
                ..
            }
        )),
        12,
        "{seen:?}"
    );
}

/// `server::serve` over any stream: a client that connects and says nothing does not hold
/// the server past its setup timeout.
#[tokio::test]
async fn a_server_gives_up_on_a_client_that_never_says_hello() {
    let (_client, server_end) = tokio::io::duplex(1 << 16);
    let config = fastcp::server::ServerConfig::default().setup_timeout(Duration::from_millis(300));
    let err = tokio::time::timeout(
        Duration::from_secs(10),
        fastcp::server::serve(server_end, &config),
    )
    .await
    .expect("the server waited past its setup timeout")
    .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Timeout, "{err}");
}

/// Cancelled at pseudo-random moments, from before the first byte to near the end, pushes
/// and pulls over TCP and SSH streams on one `Session`: each copy returns `Cancelled` (or
/// finished first), no temp file stays on either side, every file under its final name is
/// whole, and the session still copies afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_copy_cancelled_at_random_moments_leaves_nothing_partial() {
    let sshd = Sshd::start().unwrap();
    let work = tempfile::tempdir().unwrap();
    let src = work.path().join("src");
    build_tiny(&src, 300);
    write(&src.join("big"), &pseudo_random(24 << 20, 4), 0o644);
    let ssh = ssh_options(&sshd);
    let remote = |p: &std::path::Path| on(&sshd, p);
    // About 1.5 s a copy, so that the moments below fall all along it.
    let options = CopyOptions::default().recursive(true).bwlimit(16 << 20);
    let session = Session::connect(remote(work.path()).remote().unwrap(), &ssh, &options)
        .await
        .unwrap();
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    for round in 0..8 {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        let delay = Duration::from_millis(seed % 1_800);
        let dst = work.path().join(format!("dst{round}"));
        let (from, to) = if round % 2 == 0 {
            (Location::Local(src.clone()), remote(&dst))
        } else {
            (remote(&src), Location::Local(dst.clone()))
        };
        let transport = if round % 4 < 2 {
            TransportChoice::Tcp
        } else {
            TransportChoice::Ssh
        };
        let token = CancellationToken::new();
        let options = options
            .clone()
            .transport(transport)
            .streams(2)
            .cancel(token.clone());
        let plan = Plan::new(vec![from], to, options).unwrap();
        let copy = session.copy(&plan, Arc::new(Progress::default()));
        let cancel = async {
            tokio::time::sleep(delay).await;
            token.cancel();
        };
        let (outcome, ()) = tokio::time::timeout(Duration::from_secs(60), async {
            tokio::join!(copy, cancel)
        })
        .await
        .expect("the copy neither finished nor stopped");
        let what = format!("round {round}, cancelled after {delay:?}");
        eprintln!("{what}: {:?}", outcome.as_ref().map(|_| "finished"));
        match outcome {
            Err(e) => assert_eq!(e.kind(), ErrorKind::Cancelled, "{what}: {e}"),
            Ok(done) => assert!(done.report.is_complete(), "{what}"),
        }
        // The far side notices the closed channel and removes its temp files too.
        let deadline = Instant::now() + Duration::from_secs(20);
        while has_temp(&dst) {
            assert!(Instant::now() < deadline, "{what}: a temp file stayed");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_whole(&src, &dst, &what);
    }
    // The login survives its cancelled copies.
    let dst = work.path().join("after");
    let plan = Plan::new(
        vec![Location::Local(src.clone())],
        remote(&dst),
        CopyOptions::default().recursive(true),
    )
    .unwrap();
    let done = session
        .copy(&plan, Arc::new(Progress::default()))
        .await
        .unwrap();
    assert!(done.report.is_complete());
    assert_same_tree(&src, &dst, false);
    session.close().await;
}

/// Whether a fastcp temp file (`.NAME.fastcp-*`) is anywhere beneath `dir`.
fn has_temp(dir: &std::path::Path) -> bool {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return false;
    };
    entries.filter_map(Result::ok).any(|e| {
        e.file_name().to_string_lossy().contains(".fastcp-")
            || (e.file_type().is_ok_and(|t| t.is_dir()) && has_temp(&e.path()))
    })
}

/// Every file beneath `dst` has the bytes of the file of the same name beneath `src`.
fn assert_whole(src: &std::path::Path, dst: &std::path::Path, what: &str) {
    let mut stack = vec![dst.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
                continue;
            }
            let rel = path.strip_prefix(dst).unwrap();
            let expected = std::fs::read(src.join(rel)).unwrap();
            assert!(
                std::fs::read(&path).unwrap() == expected,
                "{what}: {} is not whole",
                rel.display()
            );
        }
    }
}

/// A transport of the embedder's own, all in memory: the server runs in this process, and
/// every stream, the control stream and the data streams alike, is a `tokio::io::duplex`
/// pipe handed to it through its inbox.
struct InMemory {
    config: fastcp::server::ServerConfig,
    streams: fastcp::server::StreamSender,
    peer: Peer,
    /// With [`Peer::Flipping`]: whether the byte was changed yet.
    flipped: Arc<std::sync::atomic::AtomicBool>,
}

/// How an [`InMemory`] transport hands streams over.
#[derive(PartialEq)]
enum Peer {
    /// Each stream the client opens.
    Honest,
    /// First a stranger's, whose `Join` does not prove the secret.
    Stranger,
    /// None: the client's streams lead nowhere.
    Silent,
    /// Each stream the client opens, and the server's own, with the first run of 16 `A`s
    /// the client sends on any of them changed to start with a `B`; the transport says it
    /// authenticates its bytes when `claims_auth`.
    Flipping { claims_auth: bool },
}

/// `inner` behind a relay that changes the first run of 16 `A`s written into it, once in
/// all the streams that share `flipped`.
fn flipping(
    inner: tokio::io::DuplexStream,
    flipped: Arc<std::sync::atomic::AtomicBool>,
) -> tokio::io::DuplexStream {
    use std::sync::atomic::Ordering;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (outer, relay) = tokio::io::duplex(1 << 20);
    let (mut from_client, mut to_client) = tokio::io::split(relay);
    let (mut from_server, mut to_server) = tokio::io::split(inner);
    tokio::spawn(async move {
        let mut buf = vec![0u8; 64 << 10];
        while let Ok(n) = from_client.read(&mut buf).await {
            if n == 0 {
                break;
            }
            let run = buf[..n].windows(16).position(|w| w == [b'A'; 16]);
            if let Some(i) = run
                && !flipped.swap(true, Ordering::SeqCst)
            {
                buf[i] = b'B';
            }
            if to_server.write_all(&buf[..n]).await.is_err() {
                break;
            }
        }
        let _ = to_server.shutdown().await;
    });
    tokio::spawn(async move {
        let _ = tokio::io::copy(&mut from_server, &mut to_client).await;
        let _ = to_client.shutdown().await;
    });
    outer
}

impl InMemory {
    fn new(peer: Peer) -> InMemory {
        let (streams, inbox) = fastcp::server::stream_channel();
        let config = fastcp::server::ServerConfig::default()
            .inbox(inbox)
            .join_timeout(Duration::from_secs(if peer == Peer::Silent {
                2
            } else {
                10
            }));
        InMemory {
            config,
            streams,
            peer,
            flipped: Arc::default(),
        }
    }
}

impl fastcp::transport::Transport for InMemory {
    async fn start_server(
        &self,
    ) -> Result<fastcp::transport::RemoteProcess, fastcp::transport::Error> {
        let (client_end, server_end) = tokio::io::duplex(1 << 20);
        let config = self.config.clone();
        tokio::spawn(async move { fastcp::server::serve(server_end, &config).await });
        let client_end = match self.peer {
            Peer::Flipping { .. } => flipping(client_end, self.flipped.clone()),
            _ => client_end,
        };
        Ok(fastcp::transport::RemoteProcess::from_stream(client_end))
    }

    async fn open_stream(
        &self,
        at: &fastcp::transport::Rendezvous,
    ) -> Result<fastcp::BoxStream, fastcp::transport::Error> {
        use fastcp::proto::{Frame, Join};
        use tokio::io::AsyncWriteExt;
        assert_eq!(at, &fastcp::transport::Rendezvous::Caller);
        let deliver = async |stream: fastcp::BoxStream| {
            self.streams
                .deliver(stream)
                .await
                .map_err(|e| fastcp::transport::Error::io("handing a stream over", e))
        };
        if self.peer == Peer::Stranger {
            let (mut theirs, server_end) = tokio::io::duplex(1 << 16);
            let mut frame = bytes::BytesMut::new();
            let join = Join {
                index: 1,
                proof: [7; 32],
            };
            fastcp::proto::encode(&Frame::Join(join), &mut frame);
            theirs.write_all(&frame).await.unwrap();
            deliver(Box::new(server_end)).await?;
            std::mem::forget(theirs);
        }
        let (client_end, server_end) = tokio::io::duplex(1 << 20);
        if self.peer == Peer::Silent {
            std::mem::forget(server_end);
        } else {
            deliver(Box::new(server_end)).await?;
        }
        Ok(match self.peer {
            Peer::Flipping { .. } => Box::new(flipping(client_end, self.flipped.clone())),
            _ => Box::new(client_end),
        })
    }

    fn supports_extra_streams(&self) -> bool {
        true
    }

    fn authenticates(&self) -> bool {
        matches!(self.peer, Peer::Flipping { claims_auth: true })
    }
}

/// A transport that does not say it authenticates its bytes gets the files' content hashed
/// on both ends, and a byte changed on the way is caught: the file is not kept. One that
/// says so gets none hashed (only the ranges are checked), so the same change goes
/// through: which is why [`Transport::authenticates`] is false unless a transport says
/// otherwise.
///
/// [`Transport::authenticates`]: fastcp::transport::Transport::authenticates
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn content_is_hashed_unless_the_transport_authenticates() {
    for claims_auth in [false, true] {
        let work = tempfile::tempdir().unwrap();
        let content = vec![b'A'; 300_000];
        write(&work.path().join("a"), &content, 0o644);
        let plan = Plan::new(
            vec![Location::Local(work.path().join("a"))],
            Location::parse(&format!("mem:{}", work.path().join("b").display())),
            CopyOptions::default(),
        )
        .unwrap();
        let peer = Peer::Flipping { claims_auth };
        let outcome = in_memory(&plan, peer, 30, Arc::new(Progress::default())).await;
        let landed = std::fs::read(work.path().join("b")).ok();
        if claims_auth {
            let done = outcome.expect("the copy ends well");
            assert!(done.report.is_complete(), "{:?}", done.report);
            let landed = landed.expect("b was written");
            let changed = landed.iter().zip(&content).filter(|(a, b)| a != b).count();
            assert_eq!(changed, 1, "one byte was changed on the way");
        } else {
            assert!(
                outcome.is_err() || !outcome.as_ref().unwrap().report.is_complete(),
                "a changed byte went unnoticed"
            );
            assert_eq!(landed, None, "a damaged file was kept");
            assert_no_temp(work.path());
        }
    }
}

/// A whole tree pushed and pulled over four in-memory streams, through the library's
/// `Mode::Caller`: no socket, port or SSH anywhere.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tree_moves_both_ways_over_in_memory_streams() {
    use fastcp::transport::Transport;
    let work = tempfile::tempdir().unwrap();
    let src = work.path().join("src");
    build_tiny(&src, 200);
    write(&src.join("big"), &pseudo_random(8 << 20, 3), 0o644);
    let remote = |p: &std::path::Path| Location::parse(&format!("mem:{}", p.display()));
    let options = CopyOptions::default().recursive(true).preserve(true);
    for (sources, dest, copied) in [
        (
            vec![Location::Local(src.clone())],
            remote(&work.path().join("pushed")),
            work.path().join("pushed"),
        ),
        (
            vec![remote(&src)],
            Location::Local(work.path().join("pulled")),
            work.path().join("pulled"),
        ),
    ] {
        let plan = Plan::new(sources, dest, options.clone()).unwrap();
        let peer = InMemory::new(Peer::Honest);
        let server = peer.start_server().await.unwrap();
        let done = fastcp::run_session(
            &plan,
            server.stream,
            fastcp::Mode::Caller { streams: 4 },
            &[peer],
            Arc::new(Progress::default()),
        )
        .await
        .unwrap();
        assert_eq!(done.streams, 4);
        assert!(done.report.is_complete(), "{:?}", done.report);
        assert_same_tree(&src, &copied, true);
    }
}

/// Pushes a small file `a` to `b` in `dir` over two in-memory streams of `peer`, within
/// `secs` seconds (the session must end by then).
async fn push_in_memory(
    dir: &std::path::Path,
    peer: Peer,
    secs: u64,
) -> Result<fastcp::SessionDone, fastcp::Error> {
    write(&dir.join("a"), b"hello", 0o644);
    let plan = Plan::new(
        vec![Location::Local(dir.join("a"))],
        Location::parse(&format!("mem:{}", dir.join("b").display())),
        CopyOptions::default(),
    )
    .unwrap();
    in_memory(&plan, peer, secs, Arc::new(Progress::default())).await
}

/// Runs `plan` in one session over two in-memory streams of `peer`, within `secs` seconds
/// (the session must end by then).
async fn in_memory(
    plan: &Plan,
    peer: Peer,
    secs: u64,
    progress: Arc<Progress>,
) -> Result<fastcp::SessionDone, fastcp::Error> {
    use fastcp::transport::Transport;
    let peer = InMemory::new(peer);
    let server = peer.start_server().await.unwrap();
    tokio::time::timeout(
        Duration::from_secs(secs),
        fastcp::run_session(
            plan,
            server.stream,
            fastcp::Mode::Caller { streams: 2 },
            &[peer],
            progress,
        ),
    )
    .await
    .expect("the session ends")
}

/// A stream handed to the server that does not prove the session's secret is refused, and
/// the session fails rather than take it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_in_memory_stream_without_the_secret_is_refused() {
    let work = tempfile::tempdir().unwrap();
    let outcome = push_in_memory(work.path(), Peer::Stranger, 30).await;
    let err = outcome.expect_err("a stranger's stream was taken");
    assert!(err.to_string().contains("failed to authenticate"), "{err}");
    assert!(!work.path().join("b").exists());
}

/// A transport that never hands the server its data streams: the server gives up at its join
/// timeout and says so, and the session ends with that error rather than waiting.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_memory_streams_that_never_arrive_time_out() {
    let work = tempfile::tempdir().unwrap();
    let outcome = push_in_memory(work.path(), Peer::Silent, 60).await;
    let err = outcome.expect_err("a session without its data streams succeeded");
    assert!(err.to_string().contains("data streams to connect"), "{err}");
    assert!(!work.path().join("b").exists());
}

/// The extras a mirror removes on the far side reach the sender's events one by one, with
/// the count, on a push as on a pull.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_push_reports_each_entry_the_far_side_deleted() {
    use fastcp::{Event, EventSink};
    use std::sync::Mutex;
    let work = tempfile::tempdir().unwrap();
    let src = work.path().join("src");
    build_tiny(&src, 20);
    let dst = work.path().join("dst");
    let extras = ["gone-1", "gone-2", "gone-dir"];
    std::fs::create_dir_all(dst.join("src/gone-dir")).unwrap();
    write(&dst.join("src/gone-1"), b"1", 0o644);
    write(&dst.join("src/gone-2"), b"2", 0o644);
    write(&dst.join("src/gone-dir/inner"), b"3", 0o644);
    let deleted = Arc::new(Mutex::new(Vec::new()));
    let sink = EventSink::new({
        let deleted = deleted.clone();
        move |e| {
            if let Event::Deleted { path } = e {
                deleted.lock().unwrap().push(path.clone());
            }
        }
    });
    let progress = Arc::new(Progress::with_events(sink));
    let plan = Plan::new(
        vec![Location::Local(src.clone())],
        Location::parse(&format!("mem:{}", dst.display())),
        CopyOptions::default().recursive(true).delete(true),
    )
    .unwrap();
    let done = in_memory(&plan, Peer::Honest, 60, progress.clone())
        .await
        .unwrap();
    assert!(done.report.is_complete(), "{:?}", done.report);
    assert_same_tree(&src, &dst.join("src"), false);
    let mut deleted: Vec<String> = deleted
        .lock()
        .unwrap()
        .iter()
        .map(|p| String::from_utf8_lossy(p).into_owned())
        .collect();
    deleted.sort();
    let want: Vec<String> = extras.iter().map(|e| format!("src/{e}")).collect();
    assert_eq!(deleted, want);
    // A folder counts with what it held.
    assert_eq!(progress.snapshot().deleted, 4);
    assert_eq!(done.report.peer.deleted, 4);
}

/// A receiver still at work after the last entry (here a `--delete` pass that its filter
/// keeps slow, a second an extra) tells the sender so: a sender whose stall limit is shorter
/// than the pass waits for it and ends well, rather than give up on a healthy copy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sender_waits_for_a_receiver_still_deleting() {
    let work = tempfile::tempdir().unwrap();
    let src = work.path().join("src");
    build_tiny(&src, 20);
    let dst = work.path().join("dst");
    std::fs::create_dir_all(dst.join("src")).unwrap();
    for i in 0..4 {
        write(&dst.join(format!("src/slow-extra-{i}")), b"x", 0o644);
    }
    let slow = fastcp::stream::Filter::default().with_predicate(Arc::new(|wire: &[u8], _| {
        if wire.windows(10).any(|w| w == b"slow-extra") {
            std::thread::sleep(Duration::from_secs(1));
        }
        true
    }));
    let plan = Plan::new(
        vec![Location::parse(&format!("mem:{}", src.display()))],
        Location::Local(dst.clone()),
        CopyOptions::default()
            .recursive(true)
            .delete(true)
            .filter(slow),
    )
    .unwrap();
    let peer = InMemory::new(Peer::Honest);
    let stall_limit = Duration::from_secs(2);
    let config = peer.config.clone().idle_timeout(stall_limit);
    let (client_end, server_end) = tokio::io::duplex(1 << 20);
    let server = tokio::spawn(async move { fastcp::server::serve(server_end, &config).await });
    let started = Instant::now();
    let done = tokio::time::timeout(
        Duration::from_secs(60),
        fastcp::run_session(
            &plan,
            client_end,
            fastcp::Mode::Caller { streams: 2 },
            &[peer],
            Arc::new(Progress::default()),
        ),
    )
    .await
    .expect("the session ends");
    let pass = started.elapsed();
    let served = tokio::time::timeout(Duration::from_secs(30), server)
        .await
        .expect("the server ends")
        .unwrap();
    assert!(pass > stall_limit, "the pass was not slow: {pass:?}");
    let report = served.expect("the sender gave up on a receiver still at work");
    assert!(report.is_complete(), "{report:?}");
    let done = done.unwrap();
    assert!(done.report.is_complete(), "{:?}", done.report);
    assert_eq!(done.report.local.deleted, 4);
    assert_same_tree(&src, &dst.join("src"), false);
}

/// A session run over a transport of one's own answers to the copy's cancel token as the
/// library's own copies do, and ends its events the same way: `Aborted` when cancelled,
/// `Finished` otherwise.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_of_ones_own_is_cancelled_by_its_token_and_ends_its_events() {
    use fastcp::{Event, EventSink};
    use std::sync::Mutex;
    let work = tempfile::tempdir().unwrap();
    let src = work.path().join("src");
    build_tiny(&src, 20);
    for cancelled in [true, false] {
        let last = Arc::new(Mutex::new(None));
        let sink = EventSink::new({
            let last = last.clone();
            move |e| *last.lock().unwrap() = Some(e.clone())
        });
        let cancel = CancellationToken::new();
        if cancelled {
            cancel.cancel();
        }
        let dest = work.path().join(format!("dst-{cancelled}"));
        let plan = Plan::new(
            vec![Location::Local(src.clone())],
            Location::parse(&format!("mem:{}", dest.display())),
            CopyOptions::default().recursive(true).cancel(cancel),
        )
        .unwrap();
        let progress = Arc::new(Progress::with_events(sink));
        let done = in_memory(&plan, Peer::Honest, 60, progress).await;
        let last = last.lock().unwrap().take();
        if cancelled {
            assert!(matches!(done, Err(fastcp::Error::Cancelled)), "{done:?}");
            assert!(matches!(last, Some(Event::Aborted { .. })), "{last:?}");
        } else {
            assert!(done.unwrap().report.is_complete());
            assert!(matches!(last, Some(Event::Finished(_))), "{last:?}");
            assert_same_tree(&src, &dest, false);
        }
    }
}

/// A local copy under a bandwidth limit runs a sender and a receiver on one `Progress`: each
/// entry its mirror removes counts once, and is reported once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_limited_local_mirror_counts_each_deletion_once() {
    use fastcp::{Event, EventSink};
    use std::sync::atomic::{AtomicU64, Ordering};
    let work = tempfile::tempdir().unwrap();
    let src = work.path().join("src");
    build_tiny(&src, 10);
    let dst = work.path().join("dst");
    std::fs::create_dir_all(dst.join("src")).unwrap();
    for i in 0..3 {
        write(&dst.join(format!("src/extra-{i}")), b"x", 0o644);
    }
    let events = Arc::new(AtomicU64::new(0));
    let sink = EventSink::new({
        let events = events.clone();
        move |e| {
            if let Event::Deleted { .. } = e {
                events.fetch_add(1, Ordering::SeqCst);
            }
        }
    });
    let progress = Arc::new(Progress::with_events(sink));
    let plan = Plan::new(
        vec![Location::Local(src.clone())],
        Location::Local(dst.clone()),
        CopyOptions::default()
            .recursive(true)
            .delete(true)
            .bwlimit(1 << 30),
    )
    .unwrap();
    let outcome = fastcp::copy_local(&plan, progress.clone()).await.unwrap();
    assert_eq!(outcome.report.local.deleted, 3);
    assert_eq!(progress.snapshot().deleted, 3);
    assert_eq!(events.load(Ordering::SeqCst), 3);
    assert_same_tree(&src, &dst.join("src"), false);
}

/// The system ssh giving up before the server speaks (a host key it will not trust, a
/// refused login) ends the copy with its own words and the error's kind read from them,
/// rather than a bare connection closed before the handshake with the reason on stderr.
#[test]
fn the_system_ssh_giving_up_is_a_typed_error_in_its_words() {
    let sshd = Sshd::start().unwrap();
    let work = tempfile::tempdir().unwrap();
    let src = work.path().join("f");
    std::fs::write(&src, b"x").unwrap();
    let target = work.path().join("g");
    let plan = Plan::new(
        vec![Location::Local(src)],
        on(&sshd, &target),
        CopyOptions::default(),
    )
    .unwrap();
    let ssh = ssh_options(&sshd).ssh_program(fastcp_testsupport::tools::require("ssh"));
    let copy = |ssh: &fastcp::transport::SshOptions| {
        fastcp::blocking::copy_remote(&plan, ssh, Arc::new(Progress::default())).unwrap_err()
    };

    let refused = ssh.clone().options(["PubkeyAuthentication=no"]);
    let err = copy(&refused);
    assert_eq!(
        (err.kind(), err.fault(), err.exit_code()),
        (ErrorKind::Auth, Fault::User, fastcp::exit::CONNECTION),
        "{err}"
    );
    assert!(err.to_string().contains("Permission denied"), "{err}");

    let known = std::fs::read(sshd.known_hosts()).unwrap();
    std::fs::write(sshd.known_hosts(), "").unwrap();
    let err = copy(&ssh);
    std::fs::write(sshd.known_hosts(), known).unwrap();
    assert_eq!(
        (err.kind(), err.fault(), err.exit_code()),
        (ErrorKind::HostKey, Fault::User, fastcp::exit::CONNECTION),
        "{err}"
    );
    assert!(
        err.to_string().contains("Host key verification failed"),
        "{err}"
    );
    assert!(!target.exists());
}

/// `Outcome::arrived` is what the destination's side wrote: on a push, the far side's count,
/// which leaves out a file it could not write (here one whose place holds a folder with
/// entries, which a copy without `--delete` does not replace); on a pull, this side's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_arrived_is_counted_by_the_side_that_wrote_it() {
    let sshd = Sshd::start().unwrap();
    let work = tempfile::tempdir().unwrap();
    let src = work.path().join("src");
    std::fs::create_dir(&src).unwrap();
    write(&src.join("fine"), b"fine", 0o644);
    write(&src.join("blocked"), b"blocked", 0o644);
    for pull in [false, true] {
        let dst = work.path().join(format!("dst-{pull}"));
        std::fs::create_dir_all(dst.join("src/blocked")).unwrap();
        write(&dst.join("src/blocked/inside"), b"in the way", 0o644);
        let (from, to) = match pull {
            false => (Location::Local(src.clone()), on(&sshd, &dst)),
            true => (on(&sshd, &src), Location::Local(dst.clone())),
        };
        let plan = Plan::new(vec![from], to, CopyOptions::default().recursive(true)).unwrap();
        let outcome = fastcp::copy_remote(&plan, &ssh_options(&sshd), Arc::default())
            .await
            .unwrap();
        assert_eq!(
            outcome.report.failure_count, 1,
            "pull {pull}: {:?}",
            outcome.report
        );
        let arrived = outcome.arrived();
        assert_eq!(
            (arrived.files, arrived.bytes),
            (1, 4),
            "pull {pull}: {:?}",
            outcome.report
        );
        assert_eq!(std::fs::read(dst.join("src/fine")).unwrap(), b"fine");
    }
}
