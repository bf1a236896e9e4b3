//! Fuzz target `path`: see `fastcp_fuzz_harness::path` for what it checks.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| fastcp_fuzz_harness::path(data));
