//! Each cipher's core: every provider built in x every suite x record size, sealing and
//! opening in place on one core, plus the two file checksums (BLAKE3 for peers of protocol
//! version 1 and 2, XXH3-128 from version 3) for comparison.
//!
//! Run with `cargo bench --bench ciphers` (add `--features aws-lc-rs` if the default build
//! leaves it out). Throughput is reported in decimal bytes per second (GB/s, as
//! `openssl speed` does). Names read `seal/<suite>/<provider>/<bytes>`,
//! `open/<suite>/<provider>/<bytes>`, `blake3/<bytes>` and `xxh3-128/<bytes>`; pass a filter such as
//! `cargo bench --bench ciphers -- seal/aes128` to run a subset.

use std::hint::black_box;
use std::time::Duration;

use criterion::{BatchSize, BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use fastcp_crypto::{CipherSuite, Provider, new_aead};

/// Record sizes: a small frame, a typical chunk piece, the transport's record, a big chunk.
const SIZES: [usize; 4] = [1024, 16 * 1024, 64 * 1024, 1024 * 1024];

/// A frame header's worth of associated data.
const AAD: &[u8] = b"fastcp frame hdr";

fn ciphers(c: &mut Criterion) {
    for suite in CipherSuite::ALL {
        for (op, opening) in [("seal", false), ("open", true)] {
            let mut group = c.benchmark_group(format!("{op}/{suite}"));
            for &provider in Provider::available() {
                for size in SIZES {
                    let aead = new_aead(provider, suite, &vec![0x42; suite.key_len()], &[7; 12])
                        .expect("every built-in provider offers every suite");
                    group.throughput(Throughput::BytesDecimal(size as u64));
                    let id = BenchmarkId::new(provider.name(), size);
                    if opening {
                        let mut record = vec![0x5a; size];
                        let tag = aead.seal_in_place(1, AAD, &mut record).unwrap();
                        group.bench_with_input(id, &size, |b, _| {
                            b.iter_batched_ref(
                                || record.clone(),
                                |buf| aead.open_in_place(1, AAD, black_box(buf), &tag).unwrap(),
                                BatchSize::LargeInput,
                            )
                        });
                    } else {
                        let mut buf = vec![0x5a; size];
                        group.bench_with_input(id, &size, |b, _| {
                            b.iter(|| aead.seal_in_place(1, AAD, black_box(&mut buf)).unwrap())
                        });
                    }
                }
            }
            group.finish();
        }
    }
}

/// The two file checksums: BLAKE3 (protocol versions 1 and 2) and XXH3-128 (version 3).
fn checksums(c: &mut Criterion) {
    hash(c, "blake3", blake3::hash);
    hash(c, "xxh3-128", twox_hash::XxHash3_128::oneshot);
}

fn hash<T>(c: &mut Criterion, name: &str, f: impl Fn(&[u8]) -> T) {
    let mut group = c.benchmark_group(name);
    for size in SIZES {
        let data = vec![0x5a; size];
        group.throughput(Throughput::BytesDecimal(size as u64));
        group.bench_with_input(BenchmarkId::from_parameter(size), &data, |b, data| {
            b.iter(|| f(black_box(data)))
        });
    }
    group.finish();
}

fn config() -> Criterion {
    // About 1.5 s per cell keeps the whole run (80 cells) near two minutes.
    Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(1))
        .sample_size(50)
}

criterion_group! {
    name = benches;
    config = config();
    targets = ciphers, checksums
}
criterion_main!(benches);
