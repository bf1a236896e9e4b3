//! Fuzz target `handshake`: see `fastcp_fuzz_harness::handshake` for what it checks.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| fastcp_fuzz_harness::handshake(data));
