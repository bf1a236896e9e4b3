//! Prints the `fastcp bench ciphers` table without the CLI:
//! `cargo run --release -p fastcp-crypto --features aws-lc-rs --example bench_table [millis]`.

use std::time::Duration;

fn main() -> Result<(), fastcp_crypto::Error> {
    let millis = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(300);
    let table = fastcp_crypto::bench_table(Duration::from_millis(millis))?;
    print!("{table}");
    Ok(())
}
