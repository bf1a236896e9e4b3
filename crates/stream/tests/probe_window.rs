//! The quick check's probe window: 4,096 probes outstanding until the first answer, then
//! as many as that answer's round trip needs, at most 16,384.

use std::fs;
use std::sync::Arc;
use std::time::Duration;

use bytes::BytesMut;
use fastcp_proto::{Answer, Decoder, Frame, Summary, encode};
use fastcp_stream::{Progress, SendConfig};
use tokio::io::{AsyncReadExt, AsyncWriteExt, ReadHalf, WriteHalf};

const FILES: usize = 17_000;

/// The receiver's side of one stream, by hand: frames read, probes counted.
struct Receiver {
    r: ReadHalf<tokio::io::DuplexStream>,
    w: WriteHalf<tokio::io::DuplexStream>,
    decoder: Decoder,
    buf: BytesMut,
    probes: Vec<u64>,
    done: bool,
}

impl Receiver {
    /// Reads what comes next, and takes in its frames; `false` once nothing more came for
    /// `quiet`.
    async fn read(&mut self, quiet: Duration) -> bool {
        let more = match tokio::time::timeout(quiet, self.r.read_buf(&mut self.buf)).await {
            Ok(n) => n.unwrap() > 0,
            Err(_) => false,
        };
        while let Some(frame) = self.decoder.decode(&mut self.buf).unwrap() {
            match frame {
                Frame::Probe(p) => self.probes.push(p.id),
                Frame::Done(_) => self.done = true,
                _ => {}
            }
        }
        more
    }

    /// Reads until `n` probes have come, failing after half a minute.
    async fn until(&mut self, n: usize) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        while self.probes.len() < n {
            assert!(
                tokio::time::Instant::now() < deadline,
                "only {} probes of {n} came",
                self.probes.len()
            );
            self.read(Duration::from_secs(1)).await;
        }
    }

    /// Reads until nothing more comes for half a second.
    async fn settle(&mut self) {
        while self.read(Duration::from_millis(500)).await {}
    }

    /// Answers probes: the file is already there.
    async fn answer(&mut self, ids: &[u64]) {
        let mut out = BytesMut::new();
        for &id in ids {
            let answer = Answer {
                id,
                send: false,
                hash: None,
            };
            encode(&Frame::Answer(answer), &mut out);
        }
        self.w.write_all(&out).await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_probe_window_starts_small_and_grows_with_a_long_first_answer() {
    let work = tempfile::tempdir().unwrap();
    let src = work.path().join("src");
    fs::create_dir(&src).unwrap();
    for i in 0..FILES {
        fs::write(src.join(format!("f{i:05}")), b"").unwrap();
    }
    let config = SendConfig {
        recursive: true,
        skip_unchanged: true,
        ..SendConfig::default()
    };
    let (ours, theirs) = tokio::io::duplex(16 << 20);
    let sender = tokio::spawn(async move {
        let progress = Arc::new(Progress::default());
        fastcp_stream::send(&[src], vec![theirs], &config, progress).await
    });
    let (r, w) = tokio::io::split(ours);
    let mut rx = Receiver {
        r,
        w,
        decoder: Decoder::new(64 << 20),
        buf: BytesMut::new(),
        probes: Vec::new(),
        done: false,
    };

    // No answer yet: the sender stops at 4,096 outstanding.
    rx.until(4096).await;
    rx.settle().await;
    assert_eq!(rx.probes.len(), 4096, "before any answer");

    // The first answer comes back 30 ms after the probes left: a long round trip, so the
    // window grows to its cap of 16,384 outstanding (ids 1 to 16,384).
    tokio::time::sleep(Duration::from_millis(30)).await;
    rx.answer(&[0]).await;
    rx.until(16_385).await;
    rx.settle().await;
    assert_eq!(rx.probes.len(), 16_385, "after an answer 30 ms late");

    // Every file answered: the sender finishes.
    let mut answered = 1;
    while !rx.done {
        let ids = rx.probes[answered..].to_vec();
        answered = rx.probes.len();
        rx.answer(&ids).await;
        rx.read(Duration::from_secs(30)).await;
    }
    assert_eq!(rx.probes.len(), FILES, "a probe per file");
    let mut out = BytesMut::new();
    encode(&Frame::Done(Summary::default()), &mut out);
    rx.w.write_all(&out).await.unwrap();
    let report = tokio::time::timeout(Duration::from_secs(30), sender)
        .await
        .expect("the sender finishes")
        .unwrap()
        .unwrap();
    assert_eq!(report.files_skipped, FILES as u64);
}
