//! `reserve_fds` in a process of its own: no other test grows the table first, or holds
//! descriptors while it looks.

use fastcp_stream::reserve_fds;

/// The kernel's file-descriptor table size for this process.
fn fd_table_size() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status
        .lines()
        .find_map(|l| l.strip_prefix("FDSize:"))
        .unwrap();
    line.trim().parse().unwrap()
}

/// The descriptors this process has open.
fn open_fds() -> Vec<u64> {
    std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect()
}

#[test]
fn the_fd_table_is_grown_once_to_what_a_copy_may_use() {
    let limit = rustix::process::getrlimit(rustix::process::Resource::Nofile).current;
    let want = limit.unwrap_or(8192).min(8192);
    let before = open_fds();
    reserve_fds();
    assert!(fd_table_size() >= want, "{} < {want}", fd_table_size());
    // Nothing is left open: not at the top, not below.
    assert_eq!(open_fds().len(), before.len(), "{:?}", open_fds());
    assert!(open_fds().iter().all(|&fd| fd < want - 1));
}
