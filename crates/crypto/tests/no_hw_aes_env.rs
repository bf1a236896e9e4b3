//! The `FASTCP_NO_HW_AES=1` switch, end to end: this test binary runs itself again in a child
//! process with the variable set, and the child checks what `CpuFeatures::probe` reports.

use std::process::Command;

use fastcp_crypto::{CipherSuite, CpuFeatures, NO_HW_AES_ENV, choose};

/// Runs only as the child (when `FASTCP_TEST_CHILD` is set); checks the probe under the switch.
#[test]
fn child_probe_under_switch() {
    let Some(expect) = std::env::var_os("FASTCP_TEST_CHILD") else {
        return;
    };
    let f = CpuFeatures::probe();
    if expect == "hidden" {
        assert!(!f.has_hw_aes(), "{f}");
        assert_eq!(f, CpuFeatures::detect().without_hw_aes());
        let c = choose(f, CpuFeatures::from_bits(CpuFeatures::KNOWN), None);
        assert_eq!(c.suite, CipherSuite::ChaCha20Poly1305);
    } else {
        assert_eq!(f, CpuFeatures::detect());
    }
}

fn run_child(env_value: &str, expect: &str) {
    let exe = std::env::current_exe().unwrap();
    let out = Command::new(exe)
        .args(["--exact", "child_probe_under_switch", "--nocapture"])
        .env(NO_HW_AES_ENV, env_value)
        .env("FASTCP_TEST_CHILD", expect)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "child failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("1 passed"),
        "child did not run the check:\n{stdout}"
    );
}

#[test]
fn switch_hides_hw_aes_from_probe() {
    run_child("1", "hidden");
}

#[test]
fn other_values_leave_the_probe_alone() {
    run_child("0", "hardware");
}
