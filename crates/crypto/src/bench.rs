//! A quick speed table for users (`fastcp bench ciphers`), in the spirit of `openssl speed`.
//!
//! Each provider built in is timed on each suite at 64 KiB and 1 MiB records, sealing and
//! opening in place on one core. The table marks the pick [`crate::choose`] would make if
//! the peer had this machine's CPU, and says why. Cells are measured in interleaved slices
//! and each keeps its best slice (see [`bench_table`]). For per-size statistics use the
//! criterion bench (`cargo bench --bench ciphers`).

use std::fmt;
use std::time::{Duration, Instant};

use crate::aead::{Aead, Tag, new_aead};
use crate::{Choice, CipherSuite, CpuFeatures, Provider, Result, choose};

/// Record sizes the table measures.
pub const BENCH_SIZES: [usize; 2] = [64 * 1024, 1024 * 1024];

/// One provider and suite at one record size.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BenchRow {
    /// Suite measured.
    pub suite: CipherSuite,
    /// Provider measured.
    pub provider: Provider,
    /// Record size in bytes.
    pub size: usize,
    /// Sealing speed, 10^9 plaintext bytes per second.
    pub seal_gbps: f64,
    /// Opening speed, 10^9 plaintext bytes per second.
    pub open_gbps: f64,
}

/// The whole table: rows, this CPU, and the pick.
#[derive(Debug, Clone)]
pub struct BenchTable {
    /// One row per suite, provider and size.
    pub rows: Vec<BenchRow>,
    /// This machine's features as [`CpuFeatures::probe`] reports them.
    pub cpu: CpuFeatures,
    /// What fastcp picks against a peer with the same features.
    pub choice: Choice,
}

impl BenchTable {
    /// The row fastcp's pick runs at `size`.
    pub fn chosen_row(&self, size: usize) -> Option<&BenchRow> {
        self.rows.iter().find(|r| {
            r.size == size && r.suite == self.choice.suite && r.provider == self.choice.provider
        })
    }

    /// The fastest row (by the slower of seal and open) for `suite` at `size`.
    pub fn fastest_row(&self, suite: CipherSuite, size: usize) -> Option<&BenchRow> {
        self.rows
            .iter()
            .filter(|r| r.size == size && r.suite == suite)
            .max_by(|a, b| a.min_gbps().total_cmp(&b.min_gbps()))
    }
}

impl BenchRow {
    /// The slower of the two directions: what a stream that both seals and opens would see.
    pub fn min_gbps(&self) -> f64 {
        self.seal_gbps.min(self.open_gbps)
    }
}

/// Measures every built-in provider on every suite at each of [`BENCH_SIZES`], spending about
/// `duration_per_cell` on each (seal and open together).
///
/// The time goes in up to [`BENCH_ROUNDS`] slices of at least 10 ms per cell, taken
/// round-robin over all cells, and each cell reports its best slice. Other work on the machine can only slow a slice down,
/// and interleaving spreads any slowdown over every cell alike, so the figures stay
/// comparable with each other on a busy machine.
pub fn bench_table(duration_per_cell: Duration) -> Result<BenchTable> {
    let mut cells = Vec::new();
    for suite in CipherSuite::ALL {
        for &provider in Provider::available() {
            for size in BENCH_SIZES {
                cells.push(Cell::new(provider, suite, size)?);
            }
        }
    }
    let rounds = (duration_per_cell.as_millis() / 10).clamp(1, u128::from(BENCH_ROUNDS)) as u32;
    let slice = duration_per_cell / rounds;
    for _ in 0..rounds {
        for cell in &mut cells {
            cell.run(slice)?;
        }
    }
    let rows = cells
        .iter()
        .map(|c| BenchRow {
            suite: c.aead.suite(),
            provider: c.aead.provider(),
            size: c.buf.len(),
            seal_gbps: c.best_seal,
            open_gbps: c.best_open,
        })
        .collect();
    let cpu = CpuFeatures::probe();
    Ok(BenchTable {
        rows,
        cpu,
        choice: choose(cpu, cpu, None),
    })
}

/// Most slices per cell in [`bench_table`].
pub const BENCH_ROUNDS: u32 = 10;

/// One provider, suite and size under measurement: a sealed record and the best rates seen.
struct Cell {
    aead: Box<dyn Aead>,
    buf: Vec<u8>,
    tag: Tag,
    best_seal: f64,
    best_open: f64,
}

impl Cell {
    fn new(provider: Provider, suite: CipherSuite, size: usize) -> Result<Cell> {
        let key = vec![0x42; suite.key_len()];
        let aead = new_aead(provider, suite, &key, &[0x24; 12])?;
        let mut buf = vec![0x5a; size];
        let tag = aead.seal_in_place(0, b"", &mut buf)?;
        Ok(Cell {
            aead,
            buf,
            tag,
            best_seal: 0.0,
            best_open: 0.0,
        })
    }

    /// Opens and reseals the record back and forth for about `budget`. Opening a record and
    /// sealing its plaintext again under the same number gives the same record back, so the
    /// two operations are timed alternately on one buffer without copies.
    fn run(&mut self, budget: Duration) -> Result<()> {
        let (mut seal, mut open, mut n) = (Duration::ZERO, Duration::ZERO, 0u64);
        let start = Instant::now();
        while n < 2 || start.elapsed() < budget {
            let t = Instant::now();
            self.aead.open_in_place(0, b"", &mut self.buf, &self.tag)?;
            let t2 = Instant::now();
            self.tag = self.aead.seal_in_place(0, b"", &mut self.buf)?;
            seal += t2.elapsed();
            open += t2 - t;
            n += 1;
        }
        let bytes = (self.buf.len() as u64 * n) as f64;
        self.best_seal = self.best_seal.max(bytes / seal.as_secs_f64() / 1e9);
        self.best_open = self.best_open.max(bytes / open.as_secs_f64() / 1e9);
        Ok(())
    }
}

fn size_name(size: usize) -> String {
    if size >= 1 << 20 {
        format!("{} MiB", size >> 20)
    } else {
        format!("{} KiB", size >> 10)
    }
}

impl fmt::Display for BenchTable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "CPU features: {}", self.cpu)?;
        writeln!(
            f,
            "{:<18} {:<11} {:>8} {:>10} {:>10}",
            "cipher", "provider", "record", "seal GB/s", "open GB/s"
        )?;
        for r in &self.rows {
            let mark = if r.suite == self.choice.suite && r.provider == self.choice.provider {
                "  <- fastcp's pick"
            } else {
                ""
            };
            writeln!(
                f,
                "{:<18} {:<11} {:>8} {:>10.2} {:>10.2}{mark}",
                r.suite.name(),
                r.provider.name(),
                size_name(r.size),
                r.seal_gbps,
                r.open_gbps,
            )?;
        }
        writeln!(
            f,
            "fastcp picks {} (against a peer with the same CPU features)",
            self.choice
        )?;
        for size in BENCH_SIZES {
            if let (Some(pick), Some(best)) = (
                self.chosen_row(size),
                self.fastest_row(self.choice.suite, size),
            ) {
                writeln!(
                    f,
                    "at {}: the pick runs at {:.0}% of the fastest {} provider here ({})",
                    size_name(size),
                    100.0 * pick.min_gbps() / best.min_gbps(),
                    self.choice.suite,
                    best.provider,
                )?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_has_every_cell_and_marks_the_pick() {
        let t = bench_table(Duration::from_millis(1)).unwrap();
        assert_eq!(
            t.rows.len(),
            CipherSuite::ALL.len() * Provider::available().len() * BENCH_SIZES.len()
        );
        for r in &t.rows {
            assert!(r.seal_gbps.is_finite() && r.seal_gbps > 0.0, "{r:?}");
            assert!(r.open_gbps.is_finite() && r.open_gbps > 0.0, "{r:?}");
        }
        assert!(t.chosen_row(64 * 1024).is_some());
        let text = t.to_string();
        assert_eq!(text.matches("<- fastcp's pick").count(), BENCH_SIZES.len());
        assert!(text.contains(&t.choice.reason.to_string()), "{text}");
    }

    #[test]
    fn fastest_row_uses_the_slower_direction() {
        let row = |provider, seal_gbps, open_gbps| BenchRow {
            suite: CipherSuite::Aes128Gcm,
            provider,
            size: 1024,
            seal_gbps,
            open_gbps,
        };
        let t = BenchTable {
            rows: vec![
                row(Provider::Ring, 9.0, 1.0),
                row(Provider::RustCrypto, 3.0, 3.0),
            ],
            cpu: CpuFeatures::NONE,
            choice: choose(CpuFeatures::NONE, CpuFeatures::NONE, None),
        };
        let best = t.fastest_row(CipherSuite::Aes128Gcm, 1024).unwrap();
        assert_eq!(best.provider, Provider::RustCrypto);
    }
}
