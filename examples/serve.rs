//! The server side in-process: `fastcp::server::serve` on one end of an in-memory pipe, the
//! client's session on the other, pushing SRC into DST. Any stream pair works the same way:
//! a socket of your own, a channel of your own SSH session.
//!
//! ```sh
//! cargo run --example serve -- SRC DST
//! ```

use std::sync::Arc;

use fastcp::server::{ServerConfig, serve};
use fastcp::{CopyOptions, Location, Plan, Progress};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [src, dst] = &args[..] else {
        return Err("usage: serve SRC DST".into());
    };
    let (client_end, server_end) = tokio::io::duplex(1 << 20);
    let server = tokio::spawn(async move { serve(server_end, &ServerConfig::default()).await });
    // The host name only labels the remote side; the pipe is the connection.
    let plan = Plan::new(
        vec![Location::parse(src)],
        Location::parse(&format!("in-process:{dst}")),
        CopyOptions::default().recursive(true),
    )?;
    let done = fastcp::run_session_inline(&plan, client_end, Arc::new(Progress::default())).await?;
    let served = server.await??;
    println!(
        "sent {} files ({} bytes); the server wrote {} files",
        done.report.local.files, done.report.local.bytes, served.local.files
    );
    Ok(())
}
