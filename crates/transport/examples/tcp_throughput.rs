//! Throughput of sealed TCP data streams over loopback, for tuning the record size, the
//! socket buffers and the number of streams.
//!
//! ```text
//! cargo run --release -p fastcp-transport --example tcp_throughput -- \
//!     [--bytes 2G] [--streams 1,2,4] [--suites aes128-gcm,chacha20-poly1305,plain] \
//!     [--records 64K,256K,1M] [--sndbuf 4M] [--rcvbuf 4M] [--samples 3] \
//!     [--providers ring,aws-lc-rs] [--wan-delay-ms 25 --wan-link-rate 125M --wan-window 4M]
//! ```
//!
//! `--providers` defaults to the fastest built in; aws-lc-rs needs
//! `--features fastcp-crypto/aws-lc-rs` on the build command.
//!
//! Client and server run in this one process on a 2-worker Tokio runtime; the client's
//! streams write `--bytes` in total (split evenly), the server's read them to the sealed end.
//! `plain` is unsealed TCP with the same task layout, for reference. Each line prints the
//! median and the best of the samples, in GB/s (10^9 bytes per second), and the CPU time
//! the process spent per byte moved (both ends, user + system, from /proc/self/stat), which
//! other load on the machine disturbs much less than the wall-clock rate.
//!
//! With `--wan-delay-ms`, the streams go through a `fastcp_testsupport::wan::WanRelay` (on
//! its own thread) with that one-way delay, `--wan-link-rate` bytes/s shared by all streams
//! and `--wan-window` bytes in flight per stream.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

use fastcp_crypto::{CipherSuite, KeyConfig, Provider, SessionSecret};
use fastcp_testsupport::wan::{WanConfig, WanRelay};
use fastcp_transport::tcp::{self, TcpConfig, TcpRendezvous};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const LOCALHOST: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);
const WRITE: usize = 1 << 20;

struct Args {
    bytes: u64,
    streams: Vec<u16>,
    suites: Vec<Option<CipherSuite>>,
    providers: Vec<Option<Provider>>,
    records: Vec<usize>,
    sndbuf: Option<u32>,
    rcvbuf: Option<u32>,
    samples: usize,
    wan: Option<WanConfig>,
}

fn size(s: &str) -> u64 {
    let (num, mult) = match s.chars().last() {
        Some('K' | 'k') => (&s[..s.len() - 1], 1u64 << 10),
        Some('M' | 'm') => (&s[..s.len() - 1], 1 << 20),
        Some('G' | 'g') => (&s[..s.len() - 1], 1 << 30),
        _ => (s, 1),
    };
    num.parse::<u64>().expect("a size such as 64K, 2G or 1000") * mult
}

fn parse() -> Args {
    let mut a = Args {
        bytes: 2 << 30,
        streams: vec![1, 2, 4],
        suites: vec![
            Some(CipherSuite::Aes128Gcm),
            Some(CipherSuite::ChaCha20Poly1305),
            None,
        ],
        records: vec![64 << 10, 256 << 10, 1 << 20],
        providers: vec![None],
        sndbuf: None,
        rcvbuf: None,
        samples: 3,
        wan: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let value = it.next().unwrap_or_else(|| panic!("{flag} needs a value"));
        let list = || value.split(',').map(str::to_owned).collect::<Vec<_>>();
        match flag.as_str() {
            "--bytes" => a.bytes = size(&value),
            "--streams" => a.streams = list().iter().map(|s| s.parse().unwrap()).collect(),
            "--suites" => {
                a.suites = list()
                    .iter()
                    .map(|s| (s != "plain").then(|| s.parse().unwrap()))
                    .collect()
            }
            "--providers" => {
                a.providers = list().iter().map(|s| Some(s.parse().unwrap())).collect()
            }
            "--records" => a.records = list().iter().map(|s| size(s) as usize).collect(),
            "--sndbuf" => a.sndbuf = Some(size(&value) as u32),
            "--rcvbuf" => a.rcvbuf = Some(size(&value) as u32),
            "--samples" => a.samples = value.parse().unwrap(),
            "--wan-delay-ms" => {
                let delay = Duration::from_millis(value.parse().unwrap());
                a.wan = Some(WanConfig::delay(delay));
            }
            "--wan-link-rate" => {
                let wan = a.wan.take().expect("--wan-delay-ms first");
                a.wan = Some(wan.with_link_rate(size(&value)));
            }
            "--wan-window" => {
                let wan = a.wan.take().expect("--wan-delay-ms first");
                a.wan = Some(wan.with_max_in_flight(size(&value) as usize));
            }
            other => panic!("unknown option {other}"),
        }
    }
    a
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let args = parse();
    println!(
        "{} per run, {} samples, sndbuf {:?}, rcvbuf {:?}, wan {:?}",
        args.bytes, args.samples, args.sndbuf, args.rcvbuf, args.wan
    );
    println!(
        "{:<30} {:>8} {:>7} {:>10} {:>10} {:>10}",
        "suite", "record", "streams", "median", "best", "CPU ns/B"
    );
    let pattern: Vec<u8> = (0..WRITE).map(|i| (i * 31 + i / 977) as u8).collect();
    let mut cells = Vec::new();
    for &suite in &args.suites {
        match suite {
            Some(suite) => {
                for &p in &args.providers {
                    cells.push(Some(KeyConfig::new(
                        suite,
                        p.unwrap_or(Provider::fastest_for(suite)),
                    )));
                }
            }
            None => cells.push(None),
        }
    }
    for &keys in &cells {
        let records = if keys.is_some() {
            args.records.clone()
        } else {
            vec![0]
        };
        for &record in &records {
            for &streams in &args.streams {
                let mut rates = Vec::new();
                let mut cpu = Vec::new();
                for _ in 0..args.samples {
                    let before = cpu_seconds();
                    let elapsed = run(&args, keys, record, streams, &pattern).await;
                    cpu.push((cpu_seconds() - before) * 1e9 / args.bytes as f64);
                    rates.push(args.bytes as f64 / elapsed.as_secs_f64() / 1e9);
                }
                rates.sort_by(|a, b| a.total_cmp(b));
                cpu.sort_by(|a, b| a.total_cmp(b));
                let name = keys.map_or("plain".to_string(), |k| {
                    format!("{} {}", k.suite, k.provider)
                });
                let record = if record == 0 {
                    "-".to_string()
                } else {
                    format!("{}K", record >> 10)
                };
                println!(
                    "{name:<30} {record:>8} {streams:>7} {:>6.3} GB/s {:>5.3} GB/s {:>10.2}",
                    rates[rates.len() / 2],
                    rates[rates.len() - 1],
                    cpu[cpu.len() / 2],
                );
            }
        }
    }
}

/// One transfer of `args.bytes` over `streams` streams; returns the time from the first
/// write to the last byte read.
async fn run(
    args: &Args,
    keys: Option<KeyConfig>,
    record: usize,
    streams: u16,
    pattern: &[u8],
) -> Duration {
    let per = args.bytes / u64::from(streams);
    let mut config = TcpConfig::default();
    config.record_len = record.max(1);
    config.send_buffer = args.sndbuf;
    config.recv_buffer = args.rcvbuf;
    match keys {
        Some(keys) => {
            let secret = SessionSecret::generate().unwrap();
            let r = TcpRendezvous::bind(LOCALHOST, None, config.clone()).unwrap();
            let (addr, _relay) = through_wan(args, SocketAddr::new(LOCALHOST, r.port()));
            let server = {
                let secret = secret.clone();
                tokio::spawn(async move {
                    r.accept(streams, &secret, &keys, Duration::from_secs(10))
                        .await
                        .unwrap()
                        .streams
                })
            };
            let client = tcp::connect(addr, streams, &secret, &keys, &config)
                .await
                .unwrap();
            let server = server.await.unwrap();
            transfer(client, server, per, pattern).await
        }
        None => {
            let l = TcpListener::bind((LOCALHOST, 0)).await.unwrap();
            let (addr, _relay) = through_wan(args, l.local_addr().unwrap());
            let mut client = Vec::new();
            let mut server = Vec::new();
            for _ in 0..streams {
                let c = TcpStream::connect(addr).await.unwrap();
                c.set_nodelay(true).unwrap();
                client.push(c);
                server.push(l.accept().await.unwrap().0);
            }
            transfer(client, server, per, pattern).await
        }
    }
}

/// User + system CPU time of this process so far, in seconds (clock ticks of 10 ms).
fn cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // Fields after the command name (which ends with ')'): utime is the 12th, stime the 13th.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|f| f.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    (ticks(11) + ticks(12)) / 100.0
}

/// The address to dial for `upstream`: a WAN relay in front of it when asked for.
fn through_wan(args: &Args, upstream: SocketAddr) -> (SocketAddr, Option<WanRelay>) {
    match &args.wan {
        None => (upstream, None),
        Some(wan) => {
            let relay =
                WanRelay::spawn(SocketAddr::new(LOCALHOST, 0), upstream, wan.clone()).unwrap();
            (relay.local_addr(), Some(relay))
        }
    }
}

async fn transfer<C, S>(client: Vec<C>, server: Vec<S>, per: u64, pattern: &[u8]) -> Duration
where
    C: AsyncWrite + Unpin + Send + 'static,
    S: AsyncRead + Unpin + Send + 'static,
{
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for mut c in client {
        let pattern = pattern.to_vec();
        tasks.spawn(async move {
            let mut left = per;
            while left > 0 {
                let n = left.min(pattern.len() as u64) as usize;
                c.write_all(&pattern[..n]).await.unwrap();
                left -= n as u64;
            }
            c.shutdown().await.unwrap();
        });
    }
    for mut s in server {
        tasks.spawn(async move {
            let mut buf = vec![0u8; WRITE];
            let mut got = 0u64;
            loop {
                match s.read(&mut buf).await.unwrap() {
                    0 => break,
                    n => got += n as u64,
                }
            }
            assert_eq!(got, per);
        });
    }
    while let Some(t) = tasks.join_next().await {
        t.unwrap();
    }
    started.elapsed()
}
