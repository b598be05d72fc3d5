//! Run-time statistics of our kernel programs (`run_time_ns`, `run_cnt` in
//! `bpf_prog_info`), for the metrics exporter.
//!
//! The kernel keeps them only while BPF statistics are enabled, machine-wide:
//! either someone holds a `BPF_ENABLE_STATS` fd, or the sysctl
//! `kernel.bpf_stats_enabled` is 1. Collecting them costs two clock reads per
//! program run for every BPF program of the machine, so hystall enables them
//! only when asked for metrics, and only for as long as it runs (the fd).

use std::os::fd::OwnedFd;
use std::time::Duration;

use aya::Ebpf;

/// The sysctl that also turns the statistics on (by an administrator).
const SYSCTL: &str = "/proc/sys/kernel/bpf_stats_enabled";

/// Keeps BPF run-time statistics enabled while it lives.
#[derive(Debug)]
pub struct StatsGuard {
    /// Statistics stay on while this fd is open (None: we could not enable them).
    fd: Option<OwnedFd>,
    /// Why enabling failed, for the log.
    pub error: Option<String>,
}

impl StatsGuard {
    /// Asks the kernel to collect run-time statistics (needs CAP_SYS_ADMIN,
    /// Linux 5.8+). Failure is not fatal: the counters then stay at zero
    /// unless the sysctl is on, and `enabled()` says so.
    pub fn enable() -> StatsGuard {
        match aya::sys::enable_stats(aya::sys::Stats::RunTime) {
            Ok(fd) => StatsGuard { fd: Some(fd), error: None },
            Err(e) => StatsGuard { fd: None, error: Some(e.to_string()) },
        }
    }

    /// Whether run times are being collected now (our fd, or the sysctl).
    pub fn enabled(&self) -> bool {
        self.fd.is_some() || sysctl_enabled()
    }
}

fn sysctl_enabled() -> bool {
    std::fs::read_to_string(SYSCTL).is_ok_and(|s| s.trim() == "1")
}

/// One loaded program's accumulated run time and run count.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProgStats {
    pub program: String,
    pub run_time: Duration,
    pub run_count: u64,
}

/// Stats of every loaded program of the object (programs never loaded, such
/// as the TC classifiers before a QUIC port is known, are left out).
pub fn prog_stats(ebpf: &Ebpf) -> Vec<ProgStats> {
    let mut out: Vec<ProgStats> = ebpf
        .programs()
        .filter_map(|(name, p)| {
            let info = p.info().ok()?;
            Some(ProgStats { program: name.to_owned(), run_time: info.run_time(), run_count: info.run_count() })
        })
        .collect();
    out.sort_by(|a, b| a.program.cmp(&b.program));
    out
}
