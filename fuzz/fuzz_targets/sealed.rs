//! Fuzz target `sealed`: see `fastcp_fuzz_harness::sealed` for what it checks.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| fastcp_fuzz_harness::sealed(data));
