//! Copies sources into a destination through the engine over in-memory pipes, with every
//! tuning knob on the command line, and prints the time taken and the peak memory.
//!
//! ```text
//! cargo run --release -p fastcp-stream --example local_copy -- \
//!     [-r] [-p] [--streams N] [--chunk BYTES] [--pipe BYTES] [--writers N] SRC... DEST
//! ```

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use fastcp_stream::{Progress, ReceiveConfig, SendConfig};

fn main() {
    let mut send = SendConfig::default();
    let mut receive = ReceiveConfig::default();
    let mut streams = 4usize;
    let mut pipe = fastcp_stream::LOCAL_PIPE_BUFFER;
    let mut threads = 2usize;
    let mut paths = Vec::new();
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut num = || -> usize { args.next().and_then(|v| v.parse().ok()).expect("a number") };
        match a.as_str() {
            "-r" => {
                send.recursive = true;
                receive.recursive = true;
            }
            "-p" => {
                send.preserve = true;
                receive.preserve = true;
            }
            "--streams" => streams = num(),
            "--chunk" => send.chunk_size = num(),
            "--pipe" => pipe = num(),
            "--writers" => receive.writer_threads = num(),
            "--runtime-threads" => threads = num(),
            "--send-in-flight" => send.max_in_flight = num(),
            "--receive-in-flight" => receive.max_in_flight = num(),
            _ => paths.push(PathBuf::from(a)),
        }
    }
    let dest = paths
        .pop()
        .expect("usage: local_copy [options] SRC... DEST");
    receive.max_frame = receive.max_frame.max(send.chunk_size as u32 + 64);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads)
        .enable_all()
        .build()
        .unwrap();
    let start = Instant::now();
    let (sent, received) = rt.block_on(async {
        let (a, b): (Vec<_>, Vec<_>) = (0..streams).map(|_| tokio::io::duplex(pipe)).unzip();
        let progress = Arc::new(Progress::default());
        tokio::join!(
            fastcp_stream::send(&paths, a, &send, progress.clone()),
            fastcp_stream::receive(&dest, b, &receive, progress),
        )
    });
    let elapsed = start.elapsed();
    if std::env::var_os("LOCAL_COPY_THREADS").is_some() {
        // CPU seconds per thread, busiest first: which stage limits the pipeline.
        let mut per_thread = Vec::new();
        for t in std::fs::read_dir("/proc/self/task").unwrap() {
            let stat = std::fs::read_to_string(t.unwrap().path().join("stat")).unwrap();
            let fields: Vec<&str> = stat
                .rsplit(')')
                .next()
                .unwrap()
                .split_whitespace()
                .collect();
            let ticks: f64 =
                fields[11].parse::<f64>().unwrap() + fields[12].parse::<f64>().unwrap();
            per_thread.push(ticks / 100.0);
        }
        per_thread.sort_by(|a, b| b.total_cmp(a));
        eprintln!("cpu per thread: {per_thread:?}");
    }
    let received = received.expect("receive");
    sent.expect("send");
    let hwm = std::fs::read_to_string("/proc/self/status")
        .unwrap()
        .lines()
        .find(|l| l.starts_with("VmHWM"))
        .unwrap_or("")
        .to_string();
    println!(
        "{:.3} s  {} files {} bytes  {} failures  {}",
        elapsed.as_secs_f64(),
        received.local.files,
        received.local.bytes,
        received.failure_count,
        hwm.split_whitespace().skip(1).collect::<Vec<_>>().join(" ")
    );
}
