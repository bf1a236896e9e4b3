//! A copy from synchronous code: `fastcp::blocking` runs it on a runtime of its own.
//!
//! ```sh
//! cargo run --example blocking -- SRC DST
//! ```

use std::sync::Arc;

use fastcp::{CopyOptions, Location, Plan, Progress};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [src, dst] = &args[..] else {
        return Err("usage: blocking SRC DST".into());
    };
    let options = CopyOptions::default().recursive(true).preserve(true);
    let plan = Plan::new(vec![Location::parse(src)], Location::parse(dst), options)?;
    let progress = Arc::new(Progress::default());
    let outcome = match plan.remote() {
        Some(_) => fastcp::blocking::copy_remote(&plan, &Default::default(), progress)?,
        None => fastcp::blocking::copy_local(&plan, progress)?,
    };
    // What arrived: on a push, the receiver's count (`local` is what was sent).
    let arrived = outcome.arrived();
    println!(
        "{} files, {} bytes in {:.2} s",
        arrived.files,
        arrived.bytes,
        outcome.elapsed.as_secs_f64()
    );
    Ok(())
}
