//! What per-file events cost: a local copy of SRC's tree into OUT (removed after each run),
//! without and with an event sink, alternated, four rounds each. BENCHMARKS.md has figures.
//!
//! ```sh
//! cargo run --release --example events_cost -- SRC OUT
//! ```

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use fastcp::{CopyOptions, Event, EventSink, Location, Plan, Progress};

#[tokio::main]
async fn main() {
    let src = std::env::args().nth(1).unwrap();
    let out = std::path::PathBuf::from(std::env::args().nth(2).unwrap());
    for round in 0..4 {
        for with in [false, true] {
            let dst = out.join(format!("r{round}-{with}"));
            let plan = Plan::new(
                vec![Location::parse(&src)],
                Location::Local(dst.clone()),
                CopyOptions::default().recursive(true),
            )
            .unwrap();
            let n = Arc::new(AtomicU64::new(0));
            let progress = if with {
                let n = n.clone();
                Progress::with_events(EventSink::new(move |e: &Event| {
                    if matches!(e, Event::Done { .. }) {
                        n.fetch_add(1, Ordering::Relaxed);
                    }
                }))
            } else {
                Progress::default()
            };
            let t = Instant::now();
            fastcp::copy_local(&plan, Arc::new(progress)).await.unwrap();
            let el = t.elapsed();
            println!(
                "round {round} events={with}: {:.3} s ({} done events)",
                el.as_secs_f64(),
                n.load(Ordering::Relaxed)
            );
            std::fs::remove_dir_all(&dst).unwrap();
        }
    }
}
