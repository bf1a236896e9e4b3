//! Bandwidth limits (`-l`, `--bwlimit`): one token bucket shared by all of a session's streams.
//!
//! [`RateLimit`] counts the bytes every [`Limited`] stream reads or writes against one budget
//! that refills at a fixed rate. A stream may overdraw the bucket by one read or one write
//! (writes are cut to [`RateLimit::burst`] bytes), and then waits until the debt is paid back,
//! so over any period the streams together move at most `rate × period + burst` bytes.
//!
//! The limit applies to the bytes on the wire: wrap the raw stream, and put compression inside
//! it.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> std::io::Result<()> {
//! use std::time::{Duration, Instant};
//! use tokio::io::{AsyncReadExt, AsyncWriteExt};
//! use fastcp::limit::{Limited, RateLimit};
//!
//! let limit = RateLimit::new(100_000); // bytes per second
//! let (a, mut b) = tokio::io::duplex(1 << 20);
//! let mut a = Limited::new(a, limit.clone());
//! let started = Instant::now();
//! a.write_all(&[0u8; 30_000]).await?;
//! a.write_all(&[0u8; 1]).await?; // waits until the first 30 kB are paid for
//! assert!(started.elapsed() >= Duration::from_millis(250));
//! # let mut buf = vec![0; 30_001]; b.read_exact(&mut buf).await?;
//! # Ok(()) }
//! ```

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, ready};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::{Instant, Sleep};

/// A token bucket: `bytes_per_sec` bytes a second, shared by every stream that holds it.
#[derive(Debug)]
pub struct RateLimit {
    bytes_per_sec: u64,
    state: Mutex<Bucket>,
    /// Set by [`lift`](RateLimit::lift): nothing waits any more.
    lifted: std::sync::atomic::AtomicBool,
}

#[derive(Debug)]
struct Bucket {
    /// Bytes that may go now; negative when a stream overdrew.
    tokens: f64,
    refilled: Instant,
}

impl RateLimit {
    /// A limit of `bytes_per_sec` (at least 1) bytes a second. The bucket starts empty.
    pub fn new(bytes_per_sec: u64) -> Arc<RateLimit> {
        Arc::new(RateLimit {
            bytes_per_sec: bytes_per_sec.max(1),
            state: Mutex::new(Bucket {
                tokens: 0.0,
                refilled: Instant::now(),
            }),
            lifted: std::sync::atomic::AtomicBool::new(false),
        })
    }

    /// Lets every stream go at full speed from now on: a copy that stops drains what it has
    /// queued at once, and its last requests (removing its temp files) wait behind nothing.
    pub(crate) fn lift(&self) {
        self.lifted
            .store(true, std::sync::atomic::Ordering::Relaxed);
    }

    /// The rate, in bytes a second.
    pub fn bytes_per_sec(&self) -> u64 {
        self.bytes_per_sec
    }

    /// The most bytes one write moves at once, and the most the bucket saves up while the
    /// streams are idle: a tenth of a second's worth, between 1 KiB and 1 MiB.
    pub fn burst(&self) -> usize {
        (self.bytes_per_sec / 10).clamp(1024, 1 << 20) as usize
    }

    fn bucket(&self) -> std::sync::MutexGuard<'_, Bucket> {
        let mut b = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        let earned = now.duration_since(b.refilled).as_secs_f64() * self.bytes_per_sec as f64;
        b.tokens = (b.tokens + earned).min(self.burst() as f64);
        b.refilled = now;
        b
    }

    /// How long to wait before the next read or write, if the bucket is overdrawn.
    fn wait(&self) -> Option<Duration> {
        let b = self.bucket();
        // Less than a byte of debt is rounding; waits shorter than a millisecond would spin.
        (b.tokens <= -1.0).then(|| {
            Duration::from_secs_f64(-b.tokens / self.bytes_per_sec as f64)
                .max(Duration::from_millis(1))
        })
    }

    /// Counts `n` bytes that went through.
    fn spend(&self, n: usize) {
        if n > 0 {
            self.bucket().tokens -= n as f64;
        }
    }
}

/// A stream whose reads and writes are paced by a shared [`RateLimit`], each at most a
/// [`burst`](RateLimit::burst) long.
#[derive(Debug)]
pub struct Limited<S> {
    inner: S,
    limit: Arc<RateLimit>,
    read_sleep: Option<Pin<Box<Sleep>>>,
    write_sleep: Option<Pin<Box<Sleep>>>,
    /// Where a read larger than [`RateLimit::burst`] lands before it is copied out.
    scratch: Vec<u8>,
}

impl<S> Limited<S> {
    /// Wraps `inner`.
    pub fn new(inner: S, limit: Arc<RateLimit>) -> Limited<S> {
        Limited {
            inner,
            limit,
            read_sleep: None,
            write_sleep: None,
            scratch: Vec::new(),
        }
    }
}

/// The longest a stream sleeps on the bucket before it looks again (see [`RateLimit::lift`]).
const LIFT_SEEN_WITHIN: Duration = Duration::from_millis(100);

/// Waits until `limit` is out of debt, keeping the timer in `slot` between polls.
fn poll_ready(
    limit: &RateLimit,
    slot: &mut Option<Pin<Box<Sleep>>>,
    cx: &mut Context<'_>,
) -> Poll<()> {
    loop {
        if limit.lifted.load(std::sync::atomic::Ordering::Relaxed) {
            *slot = None;
            return Poll::Ready(());
        }
        if let Some(sleep) = slot.as_mut() {
            ready!(sleep.as_mut().poll(cx));
            *slot = None;
        }
        match limit.wait() {
            None => return Poll::Ready(()),
            // In slices of at most 100 ms (waits that long come only below 10 KiB/s), so
            // that a lift is seen soon.
            Some(d) => *slot = Some(Box::pin(tokio::time::sleep(d.min(LIFT_SEEN_WITHIN)))),
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Limited<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        ready!(poll_ready(&this.limit, &mut this.read_sleep, cx));
        let burst = this.limit.burst();
        if buf.remaining() <= burst {
            let before = buf.filled().len();
            ready!(Pin::new(&mut this.inner).poll_read(cx, buf))?;
            this.limit.spend(buf.filled().len() - before);
            return Poll::Ready(Ok(()));
        }
        // Reads, as writes, move at most a burst at once: a stream that hands out big pieces
        // (a sealed record) would otherwise overdraw the bucket by seconds at a low rate,
        // and nothing would move meanwhile.
        this.scratch.resize(burst, 0);
        let mut small = ReadBuf::new(&mut this.scratch);
        ready!(Pin::new(&mut this.inner).poll_read(cx, &mut small))?;
        let n = small.filled().len();
        buf.put_slice(small.filled());
        this.limit.spend(n);
        Poll::Ready(Ok(()))
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Limited<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        ready!(poll_ready(&this.limit, &mut this.write_sleep, cx));
        let n = data.len().min(this.limit.burst());
        let n = ready!(Pin::new(&mut this.inner).poll_write(cx, &data[..n]))?;
        this.limit.spend(n);
        Poll::Ready(Ok(n))
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// Parses a rate the way rsync's `--bwlimit` does: a number, in KiB/s unless a suffix says
/// otherwise. `K`/`KiB`, `M`/`MiB`, `G`/`GiB` are powers of 1024, `KB`/`MB`/`GB` powers of
/// 1000, `B` is bytes; a trailing `/s` is allowed and fractions work. Returns bytes a second;
/// `0` means no limit.
///
/// ```
/// use fastcp::limit::parse_rate;
///
/// assert_eq!(parse_rate("500"), Ok(500 * 1024));
/// assert_eq!(parse_rate("1.5M"), Ok(1_572_864));
/// assert_eq!(parse_rate("10MB/s"), Ok(10_000_000));
/// assert_eq!(parse_rate("4096b"), Ok(4096));
/// assert!(parse_rate("fast").is_err());
/// ```
pub fn parse_rate(text: &str) -> Result<u64, String> {
    let s = text.trim();
    let s = s.strip_suffix("/s").unwrap_or(s);
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (number, unit) = s.split_at(split);
    let number: f64 = number
        .parse()
        .map_err(|_| format!("bad rate {text:?}: want a number such as 500, 10M or 1.5MB"))?;
    let factor: f64 = match unit.to_ascii_lowercase().as_str() {
        "" | "k" | "kib" => 1024.0,
        "b" => 1.0,
        "kb" => 1e3,
        "m" | "mib" => 1024.0 * 1024.0,
        "mb" => 1e6,
        "g" | "gib" => 1024.0 * 1024.0 * 1024.0,
        "gb" => 1e9,
        _ => {
            return Err(format!(
                "bad rate unit in {text:?}: use B, K, M, G (powers of 1024) or KB, MB, GB"
            ));
        }
    };
    let rate = number * factor;
    if !rate.is_finite() || rate >= u64::MAX as f64 {
        return Err(format!("rate {text:?} is too large"));
    }
    Ok(rate.round() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[test]
    fn rates() {
        assert_eq!(parse_rate("0"), Ok(0));
        assert_eq!(parse_rate("1k"), Ok(1024));
        assert_eq!(parse_rate("2KiB/s"), Ok(2048));
        assert_eq!(parse_rate("1G"), Ok(1 << 30));
        assert_eq!(parse_rate("3gb"), Ok(3_000_000_000));
        assert!(parse_rate("").is_err());
        assert!(parse_rate("1x").is_err());
        assert!(parse_rate("-1").is_err());
    }

    #[tokio::test(start_paused = true)]
    async fn streams_share_the_rate() {
        let limit = RateLimit::new(10_000);
        let (a, mut a_peer) = tokio::io::duplex(1 << 20);
        let (b, mut b_peer) = tokio::io::duplex(1 << 20);
        let mut a = Limited::new(a, limit.clone());
        let mut b = Limited::new(b, limit.clone());
        let started = Instant::now();
        let data = vec![7u8; 20_000];
        let (ra, rb) = tokio::join!(a.write_all(&data), b.write_all(&data));
        ra.unwrap();
        rb.unwrap();
        // 40 kB at 10 kB/s, less the last write's overdraft (one burst, 1 kB here).
        assert!(started.elapsed() >= Duration::from_millis(3_800));
        let mut got = vec![0; 20_000];
        a_peer.read_exact(&mut got).await.unwrap();
        b_peer.read_exact(&mut got).await.unwrap();
        assert_eq!(got, data);
    }

    #[tokio::test(start_paused = true)]
    async fn reads_are_paced() {
        let limit = RateLimit::new(50_000);
        let (a, mut peer) = tokio::io::duplex(1 << 20);
        let mut a = Limited::new(a, limit);
        peer.write_all(&vec![1u8; 200_000]).await.unwrap();
        drop(peer);
        let started = Instant::now();
        let mut got = Vec::new();
        a.read_to_end(&mut got).await.unwrap();
        assert_eq!(got.len(), 200_000);
        assert!(
            started.elapsed() >= Duration::from_millis(2_000),
            "{:?}",
            started.elapsed()
        );
    }

    /// A read takes at most a burst, however much the stream has ready, so that a low rate
    /// moves bytes often rather than a big piece after a long wait.
    #[tokio::test(start_paused = true)]
    async fn reads_move_at_most_a_burst() {
        let limit = RateLimit::new(20_000);
        let (a, mut peer) = tokio::io::duplex(1 << 20);
        let mut a = Limited::new(a, limit.clone());
        peer.write_all(&vec![1u8; 100_000]).await.unwrap();
        let mut buf = vec![0u8; 100_000];
        let n = a.read(&mut buf).await.unwrap();
        assert!(n > 0 && n <= limit.burst(), "{n} bytes in one read");
    }
}
