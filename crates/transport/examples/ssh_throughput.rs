//! Throughput of the built-in SSH client against a throwaway loopback sshd.
//!
//! Pushes (or pulls) a number of bytes through `cat > /dev/null` (or `head -c N /dev/zero`)
//! over C channels on each of K connections, and prints MiB/s.
//!
//! `--openssh yes` runs the same transfer with the system `ssh` (one channel) instead.
//!
//! ```text
//! cargo run --release -p fastcp-transport --example ssh_throughput -- \
//!     --bytes 2G --channels 4 --connections 1 --window 8M --packet 32K --buffer 16 \
//!     --cipher aes128-gcm@openssh.com --direction push --runs 3
//! ```

use std::sync::Arc;
use std::time::Instant;

use fastcp_testsupport::Sshd;
use fastcp_transport::{SshClientConfig, SshOptions, SshSession};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn parse_size(s: &str) -> u64 {
    let (num, mult) = match s.chars().last() {
        Some('K' | 'k') => (&s[..s.len() - 1], 1 << 10),
        Some('M' | 'm') => (&s[..s.len() - 1], 1 << 20),
        Some('G' | 'g') => (&s[..s.len() - 1], 1 << 30),
        _ => (s, 1),
    };
    num.parse::<u64>().expect("size") * mult
}

#[tokio::main]
async fn main() {
    let mut bytes = 1u64 << 30;
    let mut channels = 1usize;
    let mut connections = 1usize;
    let mut runs = 3usize;
    let mut push = true;
    let mut openssh = false;
    let mut client = SshClientConfig::default();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let v = it.next().expect("every flag takes a value");
        match a.as_str() {
            "--bytes" => bytes = parse_size(v),
            "--channels" => channels = v.parse().unwrap(),
            "--connections" => connections = v.parse().unwrap(),
            "--runs" => runs = v.parse().unwrap(),
            "--window" => {
                // A fixed window: the round trip does not size it.
                client.window_size = parse_size(v) as u32;
                client.min_window_size = client.window_size;
            }
            "--packet" => client.max_packet_size = parse_size(v) as u32,
            "--buffer" => client.channel_buffer_size = v.parse().unwrap(),
            "--nodelay" => client.nodelay = v == "yes",
            "--cipher" => client.ciphers = vec![v.clone()],
            "--direction" => push = v == "push",
            "--openssh" => openssh = v == "yes",
            other => panic!("unknown flag {other}"),
        }
    }

    let sshd = Sshd::start().expect("start sshd");
    let options = SshOptions::default()
        .config_file(sshd.ssh_config())
        .options(["IdentityAgent=none"])
        .client(client.clone());
    if openssh {
        openssh_baseline(&sshd, bytes, &client.ciphers[0], push, runs);
        return;
    }
    let first = SshSession::connect(sshd.alias(), &options)
        .await
        .expect("connect");
    let mut sessions = vec![Arc::new(first)];
    for _ in 1..connections {
        sessions.push(Arc::new(sessions[0].reconnect().await.expect("reconnect")));
    }
    let streams = channels * connections;
    let per_stream = bytes / streams as u64;
    let block: Arc<Vec<u8>> = Arc::new((0..1 << 20).map(|i| (i * 7 + 3) as u8).collect());

    let mut rates = Vec::new();
    for _ in 0..runs {
        let start = Instant::now();
        let mut tasks = Vec::new();
        for s in &sessions {
            for _ in 0..channels {
                let s = s.clone();
                let block = block.clone();
                tasks.push(tokio::spawn(async move {
                    if push {
                        let mut p = s.exec("cat > /dev/null").await.expect("exec");
                        let mut left = per_stream;
                        while left > 0 {
                            let n = left.min(block.len() as u64) as usize;
                            p.stream.write_all(&block[..n]).await.expect("write");
                            left -= n as u64;
                        }
                        p.stream.shutdown().await.expect("shutdown");
                        let mut sink = Vec::new();
                        p.stream.read_to_end(&mut sink).await.expect("read");
                        assert!(p.exit.wait().await.expect("exit").success());
                    } else {
                        let mut p = s
                            .exec(&format!("head -c {per_stream} /dev/zero"))
                            .await
                            .expect("exec");
                        let mut buf = vec![0u8; 1 << 20];
                        let mut got = 0u64;
                        loop {
                            let n = p.stream.read(&mut buf).await.expect("read");
                            if n == 0 {
                                break;
                            }
                            got += n as u64;
                        }
                        assert_eq!(got, per_stream, "short read");
                        assert!(p.exit.wait().await.expect("exit").success());
                    }
                }));
            }
        }
        for t in tasks {
            t.await.expect("task");
        }
        let secs = start.elapsed().as_secs_f64();
        rates.push((per_stream * streams as u64) as f64 / secs / (1u64 << 20) as f64);
    }
    rates.sort_by(|a, b| a.partial_cmp(b).unwrap());
    println!(
        "{} {} MiB ch={channels} conn={connections} cipher={} window={} packet={} buffer={}: \
         median {:.0} MiB/s (runs: {})",
        if push { "push" } else { "pull" },
        bytes >> 20,
        client.ciphers.join(","),
        client.window_size,
        client.max_packet_size,
        client.channel_buffer_size,
        rates[rates.len() / 2],
        rates
            .iter()
            .map(|r| format!("{r:.0}"))
            .collect::<Vec<_>>()
            .join(" ")
    );
}

/// The same transfer with the system OpenSSH client, one channel, for comparison.
fn openssh_baseline(sshd: &Sshd, bytes: u64, cipher: &str, push: bool, runs: usize) {
    let cfg = sshd.ssh_config();
    let script = if push {
        format!(
            "head -c {bytes} /dev/zero | ssh -F {} -c {cipher} {} 'cat > /dev/null'",
            cfg.display(),
            sshd.alias()
        )
    } else {
        format!(
            "ssh -F {} -c {cipher} {} 'head -c {bytes} /dev/zero' > /dev/null",
            cfg.display(),
            sshd.alias()
        )
    };
    let mut rates = Vec::new();
    for _ in 0..runs {
        let start = Instant::now();
        let st = std::process::Command::new("sh")
            .arg("-c")
            .arg(&script)
            .status()
            .expect("sh");
        assert!(st.success());
        rates.push(bytes as f64 / start.elapsed().as_secs_f64() / (1u64 << 20) as f64);
    }
    rates.sort_by(|a, b| a.partial_cmp(b).unwrap());
    println!(
        "openssh {} {} MiB cipher={cipher}: median {:.0} MiB/s (runs: {})",
        if push { "push" } else { "pull" },
        bytes >> 20,
        rates[rates.len() / 2],
        rates
            .iter()
            .map(|r| format!("{r:.0}"))
            .collect::<Vec<_>>()
            .join(" ")
    );
}
