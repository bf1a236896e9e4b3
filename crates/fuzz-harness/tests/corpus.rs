//! Replays every saved fuzz input (`fuzz/corpus/<target>/`) through its target's checks, so
//! what the fuzzers found once stays fixed without a nightly toolchain.

use std::path::Path;

#[test]
fn every_saved_input_passes_its_target() {
    let corpus = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/corpus");
    let mut total = 0;
    for (name, check) in fastcp_fuzz_harness::TARGETS {
        let dir = corpus.join(name);
        let entries = std::fs::read_dir(&dir)
            .unwrap_or_else(|e| panic!("no corpus for {name} at {}: {e}", dir.display()));
        let mut count = 0;
        for entry in entries {
            let path = entry.unwrap().path();
            let data = std::fs::read(&path).unwrap();
            let outcome = std::panic::catch_unwind(|| check(&data));
            assert!(outcome.is_ok(), "{name}: {} fails", path.display());
            count += 1;
        }
        assert!(count > 0, "the corpus of {name} is empty");
        total += count;
    }
    eprintln!("{total} saved inputs replayed");
}
