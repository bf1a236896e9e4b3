//! End to end: the sealed TCP transport, its fallback to SSH, and a man in the middle.
//!
//! The SSH side is a real OpenSSH sshd on 127.0.0.1 (`fastcp-testsupport`). To put a proxy
//! between client and server, the remote `fastcp server` is started through a wrapper that
//! makes it listen on 127.0.0.2 at a fixed port, while the client connects to the SSH host's
//! address, 127.0.0.1, at that port, where the test's proxy waits.

mod common;

use std::net::TcpListener as StdListener;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use common::*;
use fastcp_testsupport::Sshd;
use fastcp_testsupport::tree::{
    Node, assert_no_temp, assert_same_tree, build_mixed, build_tiny, pseudo_random, scan, write,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// A port free on both 127.0.0.1 and 127.0.0.2.
fn free_port() -> u16 {
    loop {
        let l = StdListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        if StdListener::bind(("127.0.0.2", port)).is_ok() {
            return port;
        }
    }
}

fn source_tree(root: &Path) {
    build_mixed(root);
    build_tiny(&root.join("tiny"), 500);
    write(&root.join("big.bin"), &pseudo_random(24 << 20, 7), 0o644);
}

#[test]
fn push_and_pull_over_sealed_tcp() {
    let sshd = Sshd::start().unwrap();
    let work = tempfile::tempdir().unwrap();
    let src = work.path().join("tree");
    source_tree(&src);
    let pushed = work.path().join("pushed");
    let out = run(fastcp(&sshd, bin())
        .args(["-r", "-p", "-j", "3", "--transport", "tcp", "--json"])
        .arg(&src)
        .arg(remote(&sshd, &pushed)));
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(json(&out)["transport"], "tcp");
    assert_eq!(json(&out)["streams"], 3);
    assert_same_tree(&src, &pushed, true);

    let pulled = work.path().join("pulled");
    let out = run(fastcp(&sshd, bin())
        .args(["-r", "-p", "--transport", "tcp", "--json"])
        .arg(remote(&sshd, &pushed))
        .arg(&pulled));
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(json(&out)["transport"], "tcp");
    assert_same_tree(&src, &pulled, true);
}

#[test]
fn chacha20_poly1305_end_to_end() {
    let sshd = Sshd::start().unwrap();
    let work = tempfile::tempdir().unwrap();
    let src = work.path().join("tree");
    source_tree(&src);

    // Forced on the command line.
    let dst = work.path().join("forced");
    let out = run(fastcp(&sshd, bin())
        .args([
            "-r",
            "--transport",
            "tcp",
            "--cipher",
            "chacha20-poly1305",
            "--json",
        ])
        .arg(&src)
        .arg(remote(&sshd, &dst)));
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(json(&out)["cipher"], "chacha20-poly1305");
    assert_same_tree(&src, &dst, false);

    // Chosen because this end behaves as if it had no AES hardware.
    let dst = work.path().join("no-aes");
    let out = run(fastcp(&sshd, bin())
        .env("FASTCP_NO_HW_AES", "1")
        .args(["-r", "--transport", "tcp", "--json"])
        .arg(&src)
        .arg(remote(&sshd, &dst)));
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(json(&out)["cipher"], "chacha20-poly1305");
    assert_same_tree(&src, &dst, false);
}

#[test]
fn blocked_port_falls_back_to_ssh_under_auto_and_fails_under_tcp() {
    let sshd = Sshd::start().unwrap();
    let work = tempfile::tempdir().unwrap();
    // The server listens where the client cannot reach it: 127.0.0.2, while the client dials
    // the SSH host's address, 127.0.0.1, where nothing listens on that port.
    let blocked = wrapper(
        work.path(),
        &format!("FASTCP_TCP_BIND=127.0.0.2 FASTCP_TCP_PORTS={}", free_port()),
    );
    let src = work.path().join("tree");
    build_tiny(&src, 200);

    let dst = work.path().join("auto");
    let out = run(fastcp(&sshd, &blocked)
        .args(["-r", "--json"])
        .arg(&src)
        .arg(remote(&sshd, &dst)));
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(json(&out)["transport"], "ssh");
    let err = stderr(&out);
    assert_eq!(err.matches("falling back to SSH").count(), 1, "{err}");
    assert_same_tree(&src, &dst, false);

    let dst = work.path().join("forced-tcp");
    let out = run(fastcp(&sshd, &blocked)
        .args(["-r", "--transport", "tcp"])
        .arg(&src)
        .arg(remote(&sshd, &dst)));
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    assert!(!dst.exists());
}

/// What the man in the middle does.
#[derive(Clone, Copy, Debug)]
enum Attack {
    /// Flip one bit of the client-to-server bytes of the first connection, well into it.
    Flip,
    /// Send one whole sealed record of the first connection a second time.
    Replay,
    /// Open a connection of its own to the server's data port and try to join.
    Inject,
}

/// Which way the attacked bytes flow: from the client (a push's data) or to it (a pull's).
#[derive(Debug, Clone, Copy, PartialEq)]
enum Way {
    Push,
    Pull,
}

/// Relays 127.0.0.1:`port` to 127.0.0.2:`port`, attacking the data flowing `way` as told.
async fn mitm(port: u16, way: Way, attack: Attack, attacked: Arc<AtomicBool>) {
    let listener = TcpListener::bind(("127.0.0.1", port)).await.unwrap();
    let mut first = true;
    loop {
        let Ok((client, _)) = listener.accept().await else {
            return;
        };
        let target = std::mem::replace(&mut first, false);
        if target && matches!(attack, Attack::Inject) {
            // Join the session first, with a proof made up without the secret.
            let mut foreign = TcpStream::connect(("127.0.0.2", port)).await.unwrap();
            let mut challenge = [0u8; 5 + 32];
            foreign.read_exact(&mut challenge).await.unwrap();
            let mut join = vec![0x05, 0, 0, 0, 34, 0, 1];
            join.extend_from_slice(&[0x42; 32]);
            attacked.store(true, Ordering::SeqCst);
            foreign.write_all(&join).await.unwrap();
            tokio::spawn(async move {
                let mut sink = Vec::new();
                let _ = foreign.read_to_end(&mut sink).await;
            });
        }
        let Ok(server) = TcpStream::connect(("127.0.0.2", port)).await else {
            continue;
        };
        let (mut cr, mut cw) = client.into_split();
        let (mut sr, mut sw) = server.into_split();
        let attack = (target && !matches!(attack, Attack::Inject)).then_some(attack);
        let flagged = attacked.clone();
        tokio::spawn(async move {
            if let (Some(attack), Way::Pull) = (attack, way) {
                // The server's challenge travels in the clear: 5-byte header, 32 bytes.
                let _ = tamper(&mut sr, &mut cw, 5 + 32, attack, &flagged).await;
            }
            let _ = tokio::io::copy(&mut sr, &mut cw).await;
            let _ = cw.shutdown().await;
        });
        let attacked = attacked.clone();
        tokio::spawn(async move {
            if let (Some(attack), Way::Push) = (attack, way) {
                // The Join frame travels in the clear: 5-byte header, index, 32-byte proof.
                let _ = tamper(&mut cr, &mut sw, 5 + 2 + 32, attack, &attacked).await;
            }
            let _ = tokio::io::copy(&mut cr, &mut sw).await;
            let _ = sw.shutdown().await;
        });
    }
}

/// Relays `clear` bytes as they are, then record by record, and attacks the fourth record.
async fn tamper(
    from: &mut tokio::net::tcp::OwnedReadHalf,
    to: &mut tokio::net::tcp::OwnedWriteHalf,
    clear: usize,
    attack: Attack,
    attacked: &AtomicBool,
) -> std::io::Result<()> {
    let mut clear = vec![0u8; clear];
    from.read_exact(&mut clear).await?;
    to.write_all(&clear).await?;
    let mut previous: Vec<u8> = Vec::new();
    for n in 0.. {
        let mut header = [0u8; 4];
        from.read_exact(&mut header).await?;
        let len = (u32::from_be_bytes(header) & 0x7fff_ffff) as usize + 16;
        let mut record = header.to_vec();
        record.resize(4 + len, 0);
        from.read_exact(&mut record[4..]).await?;
        if n == 3 {
            // Set before the attack goes out: the copy can fail, and the test read this flag,
            // before this task is scheduled again after the write.
            attacked.store(true, Ordering::SeqCst);
            match attack {
                Attack::Flip => {
                    let at = record.len() / 2;
                    record[at] ^= 0x01;
                }
                Attack::Replay => to.write_all(&previous).await?,
                Attack::Inject => {}
            }
            to.write_all(&record).await?;
            return Ok(());
        }
        to.write_all(&record).await?;
        previous = record;
    }
    Ok(())
}

/// Every file that exists under `dst` under its final name is complete and correct.
fn assert_nothing_corrupt(src: &Path, dst: &Path) {
    if !dst.exists() {
        return;
    }
    assert_no_temp(dst);
    let originals = scan(src);
    for (rel, node) in scan(dst) {
        let name = String::from_utf8_lossy(&rel).into_owned();
        let orig = originals
            .get(&rel)
            .unwrap_or_else(|| panic!("unexpected entry {name}"));
        if let (Node::File { hash, .. }, Node::File { hash: want, .. }) = (&node, orig) {
            assert_eq!(hash, want, "{name} is corrupt");
        }
    }
}

/// Copies a tree `way` over sealed TCP through a proxy that attacks one data stream; the
/// copy must fail with the integrity exit code (or go on, for an injected connection), and
/// leave nothing corrupt behind.
fn attack(way: Way, attack: Attack) {
    let sshd = Sshd::start().unwrap();
    let work = tempfile::tempdir().unwrap();
    let port = free_port();
    let server = wrapper(
        work.path(),
        &format!("FASTCP_TCP_BIND=127.0.0.2 FASTCP_TCP_PORTS={port}"),
    );
    let src = work.path().join("tree");
    build_tiny(&src, 300);
    write(&src.join("big.bin"), &pseudo_random(32 << 20, 1), 0o644);
    let dst = work.path().join("dst");

    let attacked = Arc::new(AtomicBool::new(false));
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.spawn(mitm(port, way, attack, attacked.clone()));
    let mut cmd = fastcp(&sshd, &server);
    cmd.args(["-r", "-j", "2", "--transport", "tcp"]);
    match way {
        Way::Push => cmd.arg(&src).arg(remote(&sshd, &dst)),
        Way::Pull => cmd.arg(remote(&sshd, &src)).arg(&dst),
    };
    let out = run(&mut cmd);
    assert!(attacked.load(Ordering::SeqCst), "the proxy never attacked");
    let err = stderr(&out);
    if let Attack::Inject = attack {
        // A stranger who cannot join is dropped, and the copy goes on.
        assert!(out.status.success(), "{err}");
        assert!(
            err.contains("refused a connection to the data port from"),
            "{err}"
        );
        assert_same_tree(&src, &dst, false);
        return;
    }
    assert!(
        err.contains("authentication failed"),
        "{way:?} {attack:?}: {err}"
    );
    assert_eq!(
        out.status.code(),
        Some(4),
        "{way:?} {attack:?}: a record that fails its tag is an integrity failure: {err}"
    );
    assert_nothing_corrupt(&src, &dst);
}

#[test]
fn mitm_flipped_byte_fails_cleanly() {
    attack(Way::Push, Attack::Flip);
}

#[test]
fn mitm_replayed_record_fails_cleanly() {
    attack(Way::Push, Attack::Replay);
}

#[test]
fn mitm_flipped_byte_in_a_pull_fails_cleanly() {
    attack(Way::Pull, Attack::Flip);
}

#[test]
fn mitm_replayed_record_in_a_pull_fails_cleanly() {
    attack(Way::Pull, Attack::Replay);
}

#[test]
fn mitm_injected_connection_is_dropped_and_the_copy_goes_on() {
    attack(Way::Push, Attack::Inject);
}
