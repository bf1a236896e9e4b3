//! Helpers shared by the engine tests: the tree builders and comparison from
//! `fastcp-testsupport`, and a runner over in-memory streams.
#![allow(dead_code, unused_imports)]

use std::path::{Path, PathBuf};
use std::sync::Arc;

use fastcp_stream::{Progress, ReceiveConfig, Report, SendConfig};
pub use fastcp_testsupport::tree::*;

/// Runs a sender and a receiver over `n` in-memory pipes of `pipe` bytes each.
pub async fn run_pair(
    sources: &[PathBuf],
    dest: &Path,
    send: &SendConfig,
    receive: &ReceiveConfig,
    n: usize,
) -> (
    Result<Report, fastcp_stream::Error>,
    Result<Report, fastcp_stream::Error>,
) {
    let (a, b): (Vec<_>, Vec<_>) = (0..n).map(|_| tokio::io::duplex(256 << 10)).unzip();
    let progress = Arc::new(Progress::default());
    tokio::join!(
        fastcp_stream::send(sources, a, send, progress.clone()),
        fastcp_stream::receive(dest, b, receive, progress),
    )
}
