//! `cargo xtask bench wan`: fastcp against scp and rsync over an emulated long fat link.
//!
//! Everything stays on this machine. The benchmark sshd listens on 127.0.0.1:P; a
//! [`WanRelay`] listens on 127.0.0.2 and forwards to 127.0.0.1 with the link's latency, rate
//! and window:
//!
//! ```text
//! client ──▶ 127.0.0.2:P'   ──relay──▶ 127.0.0.1:P    sshd (control channel, scp, rsync)
//! client ──▶ 127.0.0.2:Q+i  ──relay──▶ 127.0.0.1:Q+i  fastcp server's TCP data port
//! ```
//!
//! - **RTT** ([`RTT`] unless `--rtt` says otherwise): half of it each way, on every connection;
//! - **link** [`LINK_RATE`] bytes per second in each direction, one bottleneck shared by all
//!   connections of all routes, as one 1 Gbit/s path would be;
//! - **window** ([`DEFAULT_WINDOW`], `--window`): the bytes one connection may have in flight,
//!   standing in for its TCP window. 4 MiB is what a Linux sender gets by default: `tcp_wmem`
//!   caps its socket buffer, hence its unacknowledged bytes, at 4 MiB, and the usual
//!   `tcp_rmem` maximum of 6 MiB gives the receiver a window of about the same size. One
//!   such connection carries at most 4 MiB / 50 ms = 84 MB/s.
//!
//! The benchmark's `ssh_config` points the host alias at the relay, so scp, rsync and fastcp's
//! control connection all cross it. fastcp's server runs through a wrapper script
//! (`--remote-path`) that sets `FASTCP_TCP_BIND=127.0.0.1` and `FASTCP_TCP_PORTS=Q-Q+7`; the
//! client dials the data port at the address it reached the SSH server at, 127.0.0.2, which is
//! the relay's route to that port.

use std::fs;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener};
use std::ops::RangeInclusive;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use fastcp_testsupport::wan::{WanConfig, WanRelay};

use crate::bench::{Contender, sq};
use crate::report::human_size;
use crate::sshd::{ALIAS, Sshd};

/// The default round-trip time of the emulated path (`--rtt`).
pub const RTT: Duration = Duration::from_millis(50);

/// Rate of the emulated link in each direction, in bytes per second (1 Gbit/s).
pub const LINK_RATE: u64 = 125_000_000;

/// Default bytes in flight per connection (see the [module docs](self)).
pub const DEFAULT_WINDOW: usize = 4 << 20;

/// Default size of the file copied.
pub const DEFAULT_SIZE: &str = "512MiB";

/// Ports in fastcp's data port range (one per concurrent session is enough; a few spare).
const DATA_PORTS: u16 = 8;

/// The address the relay listens on; sshd and fastcp's server listen on 127.0.0.1.
const RELAY_IP: IpAddr = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2));
const SERVER_IP: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);

/// The scp cipher, also forced on rsync's ssh: the fastest OpenSSH offers here.
pub const SSH_CIPHER: &str = "aes128-gcm@openssh.com";

/// A running WAN relay in front of the benchmark sshd and fastcp's data ports, with the
/// client files that route through it. Dropping it stops the relay.
pub struct Wan {
    _relay: WanRelay,
    ssh_addr: SocketAddr,
    data_ports: RangeInclusive<u16>,
    window: usize,
    rtt: Duration,
    ssh_config: PathBuf,
    wrapper: PathBuf,
}

impl Wan {
    /// Starts the relay in front of `sshd` and writes, under `dir`, an `ssh_config` whose
    /// host [`ALIAS`] points at it and the wrapper that runs `fastcp` as the server.
    pub fn start(
        sshd: &Sshd,
        dir: &Path,
        fastcp: &Path,
        window: usize,
        rtt: Duration,
    ) -> Result<Wan> {
        if window == 0 {
            bail!("--window must be at least one byte");
        }
        fs::create_dir_all(dir)?;
        let config = WanConfig::delay(rtt / 2)
            .with_link_rate(LINK_RATE)
            .with_max_in_flight(window);
        let upstream_ssh = SocketAddr::new(SERVER_IP, sshd.port());
        let mut last_err = None;
        let mut relay = None;
        for attempt in 0..20 {
            let base = candidate_base(attempt);
            let ports = base..=base + DATA_PORTS - 1;
            if !ports
                .clone()
                .all(|p| TcpListener::bind((SERVER_IP, p)).is_ok())
            {
                continue;
            }
            let mut routes = vec![(SocketAddr::new(RELAY_IP, 0), upstream_ssh)];
            routes.extend(
                ports
                    .clone()
                    .map(|p| (SocketAddr::new(RELAY_IP, p), SocketAddr::new(SERVER_IP, p))),
            );
            match WanRelay::spawn_routes(&routes, config.clone()) {
                Ok(r) => {
                    relay = Some((r, ports));
                    break;
                }
                Err(e) => last_err = Some(e),
            }
        }
        let Some((relay, data_ports)) = relay else {
            return Err(match last_err {
                Some(e) => anyhow::Error::new(e),
                None => anyhow::anyhow!("no free range of {DATA_PORTS} ports"),
            })
            .context("starting the WAN relay on 127.0.0.2");
        };
        let ssh_addr = relay.local_addr();

        // The sshd's client files, re-pointed at the relay.
        let known_hosts = dir.join("known_hosts");
        let host_key = fs::read_to_string(sshd.known_hosts())?;
        let key = host_key
            .split_once(' ')
            .map(|(_, key)| key.trim())
            .context("empty known_hosts")?;
        fs::write(
            &known_hosts,
            format!("[{}]:{} {key}\n", ssh_addr.ip(), ssh_addr.port()),
        )?;
        let ssh_config = dir.join("ssh_config");
        let text = fs::read_to_string(sshd.ssh_config())?;
        fs::write(
            &ssh_config,
            repoint(&text, ssh_addr, &known_hosts).context("rewriting the ssh_config")?,
        )?;

        let wrapper = dir.join("fastcp-server");
        fs::write(
            &wrapper,
            format!(
                "#!/bin/sh\nFASTCP_TCP_BIND={SERVER_IP} FASTCP_TCP_PORTS={}-{} exec {} \"$@\"\n",
                data_ports.start(),
                data_ports.end(),
                sq(&fastcp.to_string_lossy())
            ),
        )?;
        fs::set_permissions(&wrapper, fs::Permissions::from_mode(0o755))?;
        Ok(Wan {
            _relay: relay,
            ssh_addr,
            data_ports,
            window,
            rtt,
            ssh_config,
            wrapper,
        })
    }

    /// The `ssh_config` whose host [`ALIAS`] goes through the relay.
    pub fn ssh_config(&self) -> &Path {
        &self.ssh_config
    }

    /// The script to pass as fastcp's `--remote-path`.
    pub fn wrapper(&self) -> &Path {
        &self.wrapper
    }

    /// Report lines describing the emulated path (and what it allows for `bytes` of data).
    pub fn notes(&self, sshd_port: u16, bytes: Option<u64>) -> Vec<String> {
        let per_conn = self.window as f64 / self.rtt.as_secs_f64() / 1e6;
        let mut notes = vec![
            format!(
                "WAN: `fastcp_testsupport::wan::WanRelay` on {} forwarding to 127.0.0.1:{sshd_port} \
                 (sshd) and {ip}:{lo}-{hi} → 127.0.0.1:{lo}-{hi} (fastcp's data ports); `$CFG`'s \
                 host alias `{ALIAS}` points at the relay",
                self.ssh_addr,
                ip = RELAY_IP,
                lo = self.data_ports.start(),
                hi = self.data_ports.end(),
            ),
            format!(
                "WAN parameters: {} ms RTT ({} ms each way), {} MB/s (1 Gbit/s) in each direction \
                 shared by every connection, at most {} in flight per connection and direction \
                 (a TCP window: {per_conn:.0} MB/s per connection at most)",
                self.rtt.as_millis(),
                self.rtt.as_millis() / 2,
                LINK_RATE / 1_000_000,
                human_size(self.window as u64),
            ),
            format!(
                "fastcp's server runs as `--remote-path {}`, a script that runs `FASTCP_TCP_BIND=127.0.0.1 \
                 FASTCP_TCP_PORTS={}-{} exec fastcp \"$@\"`",
                self.wrapper.display(),
                self.data_ports.start(),
                self.data_ports.end(),
            ),
            "scp (SFTP since OpenSSH 9) and rsync's ssh use aes128-gcm@openssh.com; both are held \
             back by the SSH channel window (2 MiB in OpenSSH), fastcp's TCP streams only by the \
             emulated TCP window and the link"
                .to_owned(),
        ];
        if let Some(bytes) = bytes {
            notes.push(format!(
                "Floors for this file: {:.2} s at the link rate, {:.2} s for one connection with \
                 this window, {:.2} s for one 2 MiB SSH channel window ({:.0} MB/s)",
                bytes as f64 / LINK_RATE as f64,
                bytes as f64 / (per_conn * 1e6),
                bytes as f64 / f64::from(2u32 << 20) * self.rtt.as_secs_f64(),
                f64::from(2u32 << 20) / self.rtt.as_secs_f64() / 1e6,
            ));
        }
        notes
    }
}

/// A base port below the kernel's ephemeral range, so no outgoing connection takes it.
fn candidate_base(attempt: u32) -> u16 {
    let low = fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|t| t.split_whitespace().next().and_then(|p| p.parse().ok()))
        .unwrap_or(32768u16);
    let (from, to) = (20_000u16, low.saturating_sub(DATA_PORTS).max(20_100));
    let span = u32::from(to - from);
    let seed = std::process::id().wrapping_mul(2_654_435_761) ^ attempt.wrapping_mul(40_503);
    from + (seed % span) as u16 / DATA_PORTS * DATA_PORTS
}

/// `text` (the benchmark sshd's `ssh_config`) with HostName, Port and UserKnownHostsFile
/// pointing at `addr` and `known_hosts`.
fn repoint(text: &str, addr: SocketAddr, known_hosts: &Path) -> Result<String> {
    let mut out = String::new();
    let mut seen = 0;
    for line in text.lines() {
        let indent = &line[..line.len() - line.trim_start().len()];
        let key = line.split_whitespace().next().unwrap_or("");
        let value = match key {
            "HostName" => Some(addr.ip().to_string()),
            "Port" => Some(addr.port().to_string()),
            "UserKnownHostsFile" => Some(known_hosts.display().to_string()),
            _ => None,
        };
        match value {
            Some(v) => {
                seen += 1;
                out.push_str(&format!("{indent}{key} {v}\n"));
            }
            None => {
                out.push_str(line);
                out.push('\n');
            }
        }
    }
    if seen != 3 {
        bail!("expected HostName, Port and UserKnownHostsFile lines in:\n{text}");
    }
    Ok(out)
}

/// The contenders: fastcp's TCP transport with 1, 4 and 8 streams and its SSH transport
/// (push and pull), then scp and rsync, copying `src` to `dst` on the far side of the relay.
pub fn contenders(
    fastcp: &str,
    broken: Option<String>,
    wrapper: &Path,
    extra: &str,
    src: &str,
    dst: &str,
    cipher: &str,
) -> Vec<Contender> {
    let wrapper = sq(&wrapper.to_string_lossy());
    let fastcp_run = |name: &str, flags: &str| Contender {
        name: name.into(),
        command: format!(
            "{fastcp} {flags} -F \"$CFG\" --remote-path {wrapper}{extra} {src} {ALIAS}:{dst}"
        ),
        listener: None,
        broken: broken.clone(),
    };
    let c = sq(cipher);
    vec![
        fastcp_run("fastcp tcp -j 1", "--transport tcp -j 1"),
        fastcp_run("fastcp tcp -j 4", "--transport tcp -j 4"),
        fastcp_run("fastcp tcp -j 8", "--transport tcp -j 8"),
        fastcp_run("fastcp ssh", "--transport ssh"),
        Contender {
            // The pull's window is fastcp's own (a push's is the sshd's): the same file back.
            name: "fastcp ssh pull".into(),
            command: format!(
                "{fastcp} --transport ssh -F \"$CFG\" --remote-path {wrapper}{extra} \
                 {ALIAS}:{src} {dst}"
            ),
            listener: None,
            broken: broken.clone(),
        },
        Contender {
            name: "scp".into(),
            command: format!("scp -q -F \"$CFG\" -c {c} {src} {ALIAS}:{dst}"),
            listener: None,
            broken: None,
        },
        Contender {
            name: "rsync".into(),
            command: format!("rsync -a -e \"ssh -F $CFG -c {c}\" {src} {ALIAS}:{dst}"),
            listener: None,
            broken: None,
        },
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repoints_the_ssh_config() {
        let text = "Host fastcp-bench\n  HostName 127.0.0.1\n  Port 4022\n  User me\n  \
                    UserKnownHostsFile /tmp/a/known_hosts\n  BatchMode yes\n";
        let out = repoint(
            text,
            "127.0.0.2:5000".parse().unwrap(),
            Path::new("/tmp/b/known_hosts"),
        )
        .unwrap();
        assert_eq!(
            out,
            "Host fastcp-bench\n  HostName 127.0.0.2\n  Port 5000\n  User me\n  \
             UserKnownHostsFile /tmp/b/known_hosts\n  BatchMode yes\n"
        );
        assert!(repoint("Host x\n", "127.0.0.2:1".parse().unwrap(), Path::new("k")).is_err());
    }

    #[test]
    fn data_ports_stay_below_the_ephemeral_range() {
        for attempt in 0..50 {
            let base = candidate_base(attempt);
            assert!(base >= 20_000, "{base}");
            assert!(base.checked_add(DATA_PORTS).is_some());
        }
    }

    #[test]
    fn contender_ids_are_distinct() {
        let v = contenders(
            "fastcp",
            None,
            Path::new("/w/fastcp-server"),
            "",
            "/src",
            "/dst",
            SSH_CIPHER,
        );
        let mut ids: Vec<String> = v.iter().map(Contender::id).collect();
        ids.sort();
        ids.dedup();
        assert_eq!(ids.len(), v.len(), "{ids:?}");
        assert!(v[0].command.contains("--remote-path /w/fastcp-server"));
    }
}
