//! A WAN emulator for loopback tests and benchmarks: a TCP relay that delays, rate-limits and
//! window-limits every connection through it.
//!
//! This machine's kernel has no netem, so [`WanRelay`] does in user space what a long fat
//! link does to TCP. For each connection, in each direction independently:
//!
//! - **latency**: every byte is delivered [`WanConfig::delay`] after it was read (one way;
//!   a round trip through the relay takes twice that);
//! - **rate**: bytes leave at most at [`WanConfig::rate`] bytes per second, queueing behind
//!   each other like packets behind a bottleneck link;
//! - **bytes in flight**: at most [`WanConfig::max_in_flight`] bytes are between "read from
//!   the sender" and "acknowledged". A byte counts until one more `delay` after its delivery,
//!   the time an ACK would take to come back, so a single connection gets at most
//!   `max_in_flight / (2 * delay)` bytes per second, as a TCP connection with that window
//!   would. The relay stops reading while the window is full, and the sender's own socket
//!   buffer fills up behind it.
//!
//! Optionally, [`WanConfig::link_rate`] caps all connections of the relay together, as one
//! bottleneck link would; a relay can listen on several ports ([`WanRelay::spawn_routes`]),
//! all on that one link.
//!
//! Memory is bounded by `max_in_flight` per connection and direction, and by
//! [`WanConfig::max_connections`]. The relay stops by itself: when its [`WanRelay`] is dropped,
//! or after [`WanConfig::lifetime`]; every relayed connection is closed then.
//!
//! Relaying a fastcp session: give one relay a route in front of sshd and one per port of
//! the server's data port range. The client dials the data port at the address it reached
//! the server at, so let the relay listen on another loopback address, say 127.0.0.2, each
//! route forwarding to the same port on 127.0.0.1.
//!
//! ```
//! use std::time::Duration;
//! use fastcp_testsupport::wan::{WanConfig, WanRelay};
//!
//! // An echo server, and a 20 ms (one-way) relay in front of it.
//! let server = std::net::TcpListener::bind("127.0.0.1:0")?;
//! let upstream = server.local_addr()?;
//! std::thread::spawn(move || {
//!     let (mut c, _) = server.accept().unwrap();
//!     let mut r = c.try_clone().unwrap();
//!     std::io::copy(&mut r, &mut c).unwrap();
//! });
//! let relay = WanRelay::spawn("127.0.0.1:0".parse()?, upstream, WanConfig::delay(Duration::from_millis(20)))?;
//!
//! use std::io::{Read, Write};
//! let started = std::time::Instant::now();
//! let mut c = std::net::TcpStream::connect(relay.local_addr())?;
//! c.write_all(b"ping")?;
//! let mut back = [0u8; 4];
//! c.read_exact(&mut back)?;
//! assert_eq!(&back, b"ping");
//! assert!(started.elapsed() >= Duration::from_millis(40));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc, oneshot};
use tokio::task::JoinSet;
use tokio::time::Instant;

/// Bytes read from a sender at once (less when the window is smaller).
const CHUNK: usize = 64 << 10;

/// Window the relay waits for before reading (less when the window is smaller).
const MIN_GRAB: usize = 4 << 10;

/// What the relay does to the connections through it. Except for
/// [`WanConfig::link_rate`], every limit applies to each connection and each direction
/// separately.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct WanConfig {
    /// One-way latency. Default zero.
    pub delay: Duration,
    /// Bytes per second for each connection; `None` (the default) for no cap.
    pub rate: Option<u64>,
    /// Bytes per second for the relay as a whole, in each direction: one bottleneck link
    /// that all its connections (on all its ports) share. `None` (the default) for none.
    pub link_rate: Option<u64>,
    /// Bytes in flight, standing in for the TCP window (see the [module docs](self)).
    /// Default 64 MiB, which is above any window Linux grants by default.
    pub max_in_flight: usize,
    /// Connections relayed at once; more are closed as soon as they arrive. Default 256.
    pub max_connections: usize,
    /// The relay closes everything after this long; `None` (the default) to run until
    /// dropped.
    pub lifetime: Option<Duration>,
}

impl Default for WanConfig {
    fn default() -> Self {
        WanConfig {
            delay: Duration::ZERO,
            rate: None,
            link_rate: None,
            max_in_flight: 64 << 20,
            max_connections: 256,
            lifetime: None,
        }
    }
}

impl WanConfig {
    /// The default configuration with a one-way `delay`.
    pub fn delay(delay: Duration) -> WanConfig {
        WanConfig {
            delay,
            ..WanConfig::default()
        }
    }

    /// Caps each connection's rate at `bytes_per_second`.
    pub fn with_rate(mut self, bytes_per_second: u64) -> WanConfig {
        self.rate = Some(bytes_per_second);
        self
    }

    /// Caps the rate of all connections together at `bytes_per_second`.
    pub fn with_link_rate(mut self, bytes_per_second: u64) -> WanConfig {
        self.link_rate = Some(bytes_per_second);
        self
    }

    /// Caps each connection's bytes in flight at `bytes`.
    pub fn with_max_in_flight(mut self, bytes: usize) -> WanConfig {
        self.max_in_flight = bytes;
        self
    }

    /// Stops the relay after `lifetime`.
    pub fn with_lifetime(mut self, lifetime: Duration) -> WanConfig {
        self.lifetime = Some(lifetime);
        self
    }
}

/// A running relay; dropping it stops it and closes every connection through it.
#[derive(Debug)]
pub struct WanRelay {
    local: Vec<SocketAddr>,
    runner: Runner,
}

#[derive(Debug)]
enum Runner {
    Task(tokio::task::JoinHandle<()>),
    Thread {
        stop: Option<oneshot::Sender<()>>,
        thread: Option<std::thread::JoinHandle<()>>,
    },
}

impl WanRelay {
    /// Starts a relay on the current Tokio runtime, listening on `listen` (port 0 for any)
    /// and forwarding every connection to `upstream`.
    pub async fn start(
        listen: SocketAddr,
        upstream: SocketAddr,
        config: WanConfig,
    ) -> io::Result<WanRelay> {
        WanRelay::start_routes(&[(listen, upstream)], config).await
    }

    /// Like [`WanRelay::start`] with several `(listen, upstream)` routes, all on one
    /// emulated link.
    pub async fn start_routes(
        routes: &[(SocketAddr, SocketAddr)],
        config: WanConfig,
    ) -> io::Result<WanRelay> {
        let mut listeners = Vec::new();
        let mut local = Vec::new();
        for &(listen, upstream) in routes {
            let l = TcpListener::bind(listen).await?;
            local.push(l.local_addr()?);
            listeners.push((l, upstream));
        }
        let task = tokio::spawn(serve(listeners, Shared::new(config)));
        Ok(WanRelay {
            local,
            runner: Runner::Task(task),
        })
    }

    /// Starts a relay on a thread of its own, for callers without a Tokio runtime
    /// (synchronous tests, benchmark harnesses). Dropping it stops the thread.
    pub fn spawn(
        listen: SocketAddr,
        upstream: SocketAddr,
        config: WanConfig,
    ) -> io::Result<WanRelay> {
        WanRelay::spawn_routes(&[(listen, upstream)], config)
    }

    /// Like [`WanRelay::spawn`] with several `(listen, upstream)` routes, all on one
    /// emulated link: an SSH port and a data port range, for example.
    pub fn spawn_routes(
        routes: &[(SocketAddr, SocketAddr)],
        config: WanConfig,
    ) -> io::Result<WanRelay> {
        let mut listeners = Vec::new();
        let mut local = Vec::new();
        for &(listen, upstream) in routes {
            let l = std::net::TcpListener::bind(listen)?;
            l.set_nonblocking(true)?;
            local.push(l.local_addr()?);
            listeners.push((l, upstream));
        }
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let (stop, stopped) = oneshot::channel();
        let thread = std::thread::Builder::new()
            .name("wan-relay".into())
            .spawn(move || {
                runtime.block_on(async move {
                    let Ok(listeners) = listeners
                        .into_iter()
                        .map(|(l, up)| Ok((TcpListener::from_std(l)?, up)))
                        .collect::<io::Result<Vec<_>>>()
                    else {
                        return;
                    };
                    tokio::select! {
                        () = serve(listeners, Shared::new(config)) => {}
                        _ = stopped => {}
                    }
                });
            })?;
        Ok(WanRelay {
            local,
            runner: Runner::Thread {
                stop: Some(stop),
                thread: Some(thread),
            },
        })
    }

    /// Where clients connect (the first route's address).
    pub fn local_addr(&self) -> SocketAddr {
        self.local[0]
    }

    /// Every route's listening address, in the order given.
    pub fn local_addrs(&self) -> &[SocketAddr] {
        &self.local
    }

    /// The port clients connect to (the first route's).
    pub fn port(&self) -> u16 {
        self.local[0].port()
    }
}

impl Drop for WanRelay {
    fn drop(&mut self) {
        match &mut self.runner {
            Runner::Task(task) => task.abort(),
            Runner::Thread { stop, thread } => {
                if let Some(stop) = stop.take() {
                    let _ = stop.send(());
                }
                if let Some(thread) = thread.take() {
                    let _ = thread.join();
                }
            }
        }
    }
}

/// What all connections of one relay share.
struct Shared {
    config: WanConfig,
    /// The bottleneck from clients to upstream.
    up: Link,
    /// The bottleneck from upstream back to clients.
    down: Link,
}

impl Shared {
    fn new(config: WanConfig) -> Arc<Shared> {
        Arc::new(Shared {
            up: Link::new(config.link_rate),
            down: Link::new(config.link_rate),
            config,
        })
    }
}

/// A serializing link: each chunk leaves after the ones before it, at `rate`.
struct Link {
    rate: Option<u64>,
    free: std::sync::Mutex<Option<Instant>>,
}

impl Link {
    fn new(rate: Option<u64>) -> Link {
        Link {
            rate,
            free: std::sync::Mutex::new(None),
        }
    }

    /// When a chunk of `n` bytes that reaches the link at `at` has left it.
    fn pass(&self, at: Instant, n: usize) -> Instant {
        let Some(rate) = self.rate.filter(|&r| r > 0) else {
            return at;
        };
        let mut free = self.free.lock().unwrap_or_else(|e| e.into_inner());
        let start = free.map_or(at, |f| f.max(at));
        let done = start + Duration::from_secs_f64(n as f64 / rate as f64);
        *free = Some(done);
        done
    }
}

/// Accepts and relays connections on every listener until the lifetime ends (or the caller
/// drops this future, which aborts everything it started).
async fn serve(listeners: Vec<(TcpListener, SocketAddr)>, shared: Arc<Shared>) {
    let deadline = shared.config.lifetime.map(|l| Instant::now() + l);
    let (tx, mut arrivals) = mpsc::channel(16);
    let mut tasks = JoinSet::new();
    for (listener, upstream) in listeners {
        let tx = tx.clone();
        tasks.spawn(async move {
            loop {
                match listener.accept().await {
                    Ok((conn, _)) => {
                        if tx.send((conn, upstream)).await.is_err() {
                            return;
                        }
                    }
                    // Out of file descriptors, say: let the relayed connections finish.
                    Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
                }
            }
        });
    }
    drop(tx);
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            Some((conn, upstream)) = arrivals.recv() => {
                if connections.len() >= shared.config.max_connections {
                    drop(conn);
                    continue;
                }
                connections.spawn(relay(conn, upstream, shared.clone()));
            }
            Some(_) = connections.join_next() => {}
            () = sleep_until(deadline) => return,
        }
    }
}

async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}

/// Relays one connection both ways until both directions have ended, or either fails.
async fn relay(client: TcpStream, upstream: SocketAddr, shared: Arc<Shared>) -> io::Result<()> {
    let server = TcpStream::connect(upstream).await?;
    client.set_nodelay(true)?;
    server.set_nodelay(true)?;
    let (client_r, client_w) = client.into_split();
    let (server_r, server_w) = server.into_split();
    tokio::try_join!(
        pipe(client_r, server_w, &shared.config, &shared.up),
        pipe(server_r, client_w, &shared.config, &shared.down),
    )?;
    Ok(())
}

/// One chunk on its way through the emulated link.
enum Segment {
    Data {
        bytes: Vec<u8>,
        deliver_at: Instant,
        window: OwnedSemaphorePermit,
    },
    End {
        deliver_at: Instant,
    },
}

/// One direction: read, queue on the emulated link, deliver after the delay, release the
/// window one more delay later.
async fn pipe(
    mut src: OwnedReadHalf,
    mut dst: OwnedWriteHalf,
    config: &WanConfig,
    link: &Link,
) -> io::Result<()> {
    let window_bytes = config.max_in_flight.clamp(1, Semaphore::MAX_PERMITS);
    let chunk = CHUNK.min(window_bytes);
    let min_grab = MIN_GRAB.min(chunk);
    let window = Arc::new(Semaphore::new(window_bytes));
    let delay = config.delay;
    let rate = config.rate;
    // Unbounded channels, but bounded by the window: every queued chunk holds its permits.
    let (queue, mut arrivals) = mpsc::unbounded_channel::<Segment>();
    let (acks, mut acked) = mpsc::unbounded_channel::<(Instant, OwnedSemaphorePermit)>();

    let read = async move {
        let mut own_free = Instant::now();
        loop {
            // Wait for a little window (a segment's worth, as TCP avoids tiny segments), then
            // take whatever else is free, up to a chunk. This task is the only taker, so
            // the free permits cannot shrink in between.
            let mut permit = window
                .clone()
                .acquire_many_owned(min_grab as u32)
                .await
                .expect("the window semaphore is never closed");
            let more = window.available_permits().min(chunk - min_grab);
            if more > 0
                && let Ok(extra) = window.clone().try_acquire_many_owned(more as u32)
            {
                permit.merge(extra);
            }
            let grab = permit.num_permits();
            let mut bytes = vec![0u8; grab];
            let n = src.read(&mut bytes).await?;
            let now = Instant::now();
            if n == 0 {
                let _ = queue.send(Segment::End {
                    deliver_at: own_free.max(now) + delay,
                });
                return Ok::<(), io::Error>(());
            }
            bytes.truncate(n);
            // Keep permits for the bytes read; hand back the rest.
            let used = permit.split(n).expect("n <= grabbed permits");
            drop(permit);
            // This connection's own cap first, then the shared bottleneck.
            let start = own_free.max(now);
            own_free = match rate {
                Some(rate) if rate > 0 => start + Duration::from_secs_f64(n as f64 / rate as f64),
                _ => start,
            };
            let departed = link.pass(own_free, n);
            let segment = Segment::Data {
                bytes,
                deliver_at: departed + delay,
                window: used,
            };
            if queue.send(segment).is_err() {
                return Ok(());
            }
        }
    };
    let write = async move {
        while let Some(segment) = arrivals.recv().await {
            match segment {
                Segment::Data {
                    bytes,
                    deliver_at,
                    window,
                } => {
                    tokio::time::sleep_until(deliver_at).await;
                    dst.write_all(&bytes).await?;
                    let _ = acks.send((Instant::now() + delay, window));
                }
                Segment::End { deliver_at } => {
                    tokio::time::sleep_until(deliver_at).await;
                    dst.shutdown().await?;
                    break;
                }
            }
        }
        Ok::<(), io::Error>(())
    };
    let release = async move {
        while let Some((at, permit)) = acked.recv().await {
            tokio::time::sleep_until(at).await;
            drop(permit);
        }
        Ok::<(), io::Error>(())
    };
    tokio::try_join!(read, write, release)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    //! Elapsed times are checked only from below, where the relay's sleeps guarantee them:
    //! these tests check that the relay really delays and caps, not how fast anything is.

    use super::*;

    /// An echo server on 127.0.0.1.
    async fn echo() -> SocketAddr {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((c, _)) = l.accept().await {
                tokio::spawn(async move {
                    let (mut r, mut w) = c.into_split();
                    let _ = tokio::io::copy(&mut r, &mut w).await;
                    let _ = w.shutdown().await;
                });
            }
        });
        addr
    }

    fn any() -> SocketAddr {
        "127.0.0.1:0".parse().unwrap()
    }

    fn pattern(n: usize) -> Vec<u8> {
        (0..n).map(|i| (i * 7 + i / 251) as u8).collect()
    }

    /// Sends `data` through `relay` to the echo server and reads it all back.
    async fn round_trip(relay: &WanRelay, data: &[u8]) -> (Vec<u8>, Duration) {
        let started = Instant::now();
        let c = TcpStream::connect(relay.local_addr()).await.unwrap();
        let (mut r, mut w) = c.into_split();
        let sent = data.to_vec();
        let writer = tokio::spawn(async move {
            w.write_all(&sent).await.unwrap();
            w.shutdown().await.unwrap();
        });
        let mut back = Vec::new();
        r.read_to_end(&mut back).await.unwrap();
        writer.await.unwrap();
        (back, started.elapsed())
    }

    #[tokio::test]
    async fn delays_each_direction() {
        let relay = WanRelay::start(
            any(),
            echo().await,
            WanConfig::delay(Duration::from_millis(50)),
        )
        .await
        .unwrap();
        let (back, elapsed) = round_trip(&relay, b"x").await;
        assert_eq!(back, b"x");
        assert!(elapsed >= Duration::from_millis(100), "{elapsed:?}");
    }

    #[tokio::test]
    async fn caps_the_rate() {
        // 256 KiB at 1 MiB/s: at least 250 ms each way, queued behind each other.
        let config = WanConfig::default().with_rate(1 << 20);
        let relay = WanRelay::start(any(), echo().await, config).await.unwrap();
        let data = pattern(256 << 10);
        let (back, elapsed) = round_trip(&relay, &data).await;
        assert!(back == data);
        assert!(elapsed >= Duration::from_millis(250), "{elapsed:?}");
    }

    #[tokio::test]
    async fn caps_the_bytes_in_flight() {
        // 32 KiB in flight, 20 ms each way: one window per 40 ms round trip, so 320 KiB
        // needs at least 9 round trips (360 ms) to cross one way, whatever the rate.
        let config = WanConfig::delay(Duration::from_millis(20)).with_max_in_flight(32 << 10);
        let relay = WanRelay::start(any(), echo().await, config).await.unwrap();
        let data = pattern(320 << 10);
        let (back, elapsed) = round_trip(&relay, &data).await;
        assert!(back == data);
        assert!(elapsed >= Duration::from_millis(360), "{elapsed:?}");
    }

    #[tokio::test]
    async fn carries_many_connections_and_half_closes() {
        let relay = WanRelay::start(
            any(),
            echo().await,
            WanConfig::delay(Duration::from_millis(5)),
        )
        .await
        .unwrap();
        let mut tasks = JoinSet::new();
        for i in 0..8 {
            let addr = relay.local_addr();
            tasks.spawn(async move {
                let data = pattern(100_000 + i);
                let c = TcpStream::connect(addr).await.unwrap();
                let (mut r, mut w) = c.into_split();
                let sent = data.clone();
                tokio::spawn(async move {
                    w.write_all(&sent).await.unwrap();
                    w.shutdown().await.unwrap();
                });
                let mut back = Vec::new();
                r.read_to_end(&mut back).await.unwrap();
                assert!(back == data);
            });
        }
        while let Some(t) = tasks.join_next().await {
            t.unwrap();
        }
    }

    #[tokio::test]
    async fn refuses_connections_beyond_the_cap() {
        let config = WanConfig {
            max_connections: 1,
            ..WanConfig::default()
        };
        let relay = WanRelay::start(any(), echo().await, config).await.unwrap();
        let mut first = TcpStream::connect(relay.local_addr()).await.unwrap();
        first.write_all(b"a").await.unwrap();
        let mut b = [0u8; 1];
        first.read_exact(&mut b).await.unwrap();
        let mut second = TcpStream::connect(relay.local_addr()).await.unwrap();
        let mut rest = Vec::new();
        let n = second.read_to_end(&mut rest).await.unwrap_or(0);
        assert_eq!(n, 0);
    }

    /// Two connections on two routes share one link: together they take twice as long as
    /// one would alone.
    #[tokio::test]
    async fn shares_the_link_between_routes() {
        let upstream = echo().await;
        let config = WanConfig::default().with_link_rate(1 << 20);
        let relay = WanRelay::start_routes(&[(any(), upstream), (any(), upstream)], config)
            .await
            .unwrap();
        assert_eq!(relay.local_addrs().len(), 2);
        let started = Instant::now();
        let mut tasks = JoinSet::new();
        for &addr in relay.local_addrs() {
            tasks.spawn(async move {
                // 128 KiB each way per connection: 256 KiB per direction on the link.
                let data = pattern(128 << 10);
                let c = TcpStream::connect(addr).await.unwrap();
                let (mut r, mut w) = c.into_split();
                let sent = data.clone();
                tokio::spawn(async move {
                    w.write_all(&sent).await.unwrap();
                    w.shutdown().await.unwrap();
                });
                let mut back = Vec::new();
                r.read_to_end(&mut back).await.unwrap();
                assert!(back == data);
            });
        }
        while let Some(t) = tasks.join_next().await {
            t.unwrap();
        }
        let elapsed = started.elapsed();
        assert!(elapsed >= Duration::from_millis(250), "{elapsed:?}");
    }

    #[test]
    fn threaded_relay_stops_when_dropped() {
        let upstream = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let relay =
            WanRelay::spawn(any(), upstream.local_addr().unwrap(), WanConfig::default()).unwrap();
        let addr = relay.local_addr();
        let _held = std::net::TcpStream::connect(addr).unwrap();
        drop(relay);
        let err = std::net::TcpStream::connect(addr).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::ConnectionRefused);
    }

    #[tokio::test]
    async fn stops_after_its_lifetime() {
        let config = WanConfig::default().with_lifetime(Duration::from_millis(100));
        let relay = WanRelay::start(any(), echo().await, config).await.unwrap();
        let mut c = TcpStream::connect(relay.local_addr()).await.unwrap();
        // The connection is closed when the relay stops, without a byte.
        let mut rest = Vec::new();
        let n = c.read_to_end(&mut rest).await.unwrap_or(0);
        assert_eq!(n, 0);
        let err = TcpStream::connect(relay.local_addr()).await.unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::ConnectionRefused);
    }
}
