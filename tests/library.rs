//! The library as an embedding program uses it: blocking calls, cancellation through a
//! token, and typed errors.

use std::sync::Arc;
use std::time::{Duration, Instant};

use fastcp::{CancellationToken, CopyOptions, ErrorKind, Fault, Location, Plan, Progress};
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
        CopyOptions {
            recursive: true,
            preserve: true,
            ..CopyOptions::default()
        },
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
    let plan = Plan::new(
        vec![Location::Local(src)],
        Location::Local(dst.clone()),
        CopyOptions {
            // Slow enough to be cancelled mid-file.
            bwlimit: Some(4 << 20),
            cancel: Some(token.clone()),
            ..CopyOptions::default()
        },
    )
    .unwrap();
    let progress = Arc::new(Progress::default());
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
    // The engine's writers remove their temp files right after.
    let deadline = Instant::now() + Duration::from_secs(5);
    while std::fs::read_dir(&dst).unwrap().count() > 0 {
        assert!(Instant::now() < deadline, "a temp file was left");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
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
    let ssh = fastcp::transport::SshOptions {
        config_file: Some(cfg),
        ..Default::default()
    };
    let err =
        fastcp::blocking::copy_remote(&plan, &ssh, Arc::new(Progress::default())).unwrap_err();
    assert_eq!(
        (err.kind(), err.fault()),
        (ErrorKind::Connect, Fault::Network),
        "{err}"
    );
}
