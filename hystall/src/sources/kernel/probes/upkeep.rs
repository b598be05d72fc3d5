//! Upkeep of the kernel maps for long runs: how full each one is (for the
//! `hystall_kernel_map_entries` gauge and the soak test), which sockets the
//! kernel still tracks (so the user-side table can forget sockets whose
//! destroy event was lost), and deleting the flows of closed QUIC connections
//! (so the flow map holds the live connections, not the last 65 536 5-tuples).

use std::collections::HashSet;

use aya::maps::HashMap as BpfHashMap;
use hystall_common::{FlowKey, FlowStats, InflightSend, MAX_FLOWS, MAX_INFLIGHT, MAX_PIDS, MAX_SOCKS, SockStats};

use super::Probes;

/// Entries in one kernel map and its capacity.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MapFill {
    /// The name the metric's `map` label uses.
    pub map: &'static str,
    pub entries: u64,
    pub capacity: u64,
}

impl Probes {
    /// Entries of the maps that grow with traffic: counted by walking their
    /// keys (one syscall per key, so callers do it every few seconds, not every
    /// tick). A map not created yet (the QUIC maps before a port is known)
    /// shows 0. `flows`: the flow map's count from the caller's last whole
    /// read of it (tens of thousands of entries at node scale: not read
    /// again only to count them), if it made one.
    pub fn map_fill(&self, flows: Option<u64>) -> Vec<MapFill> {
        let count = |name: &str, f: &dyn Fn(&aya::maps::Map) -> Option<u64>| self.ebpf.map(name).and_then(f);
        let socks = count("SOCKS", &|m| Some(BpfHashMap::<_, u64, SockStats>::try_from(m).ok()?.keys().count() as u64));
        let flows = flows.or_else(|| {
            count("FLOWS", &|m| match super::batch::for_each::<FlowKey, FlowStats>(m, |_, _| {}) {
                Ok(n) => Some(n as u64),
                Err(_) => Some(BpfHashMap::<_, FlowKey, FlowStats>::try_from(m).ok()?.keys().count() as u64),
            })
        });
        let inflight =
            count("INFLIGHT", &|m| Some(BpfHashMap::<_, u32, InflightSend>::try_from(m).ok()?.keys().count() as u64));
        let pids = count("PIDS", &|m| Some(BpfHashMap::<_, u32, u8>::try_from(m).ok()?.keys().count() as u64));
        // A key deleted during the walk restarts it, so a count can overshoot
        // a little under churn: never report more than the map can hold.
        let fill = |map, entries: Option<u64>, capacity: u32| MapFill {
            map,
            entries: entries.unwrap_or(0).min(u64::from(capacity)),
            capacity: capacity.into(),
        };
        vec![
            fill("socks", socks, MAX_SOCKS),
            fill("flows", flows, MAX_FLOWS),
            fill("inflight", inflight, MAX_INFLIGHT),
            fill("pids", pids, MAX_PIDS),
        ]
    }

    /// Cookies of the sockets the kernel tracks now (None if the map cannot be read).
    pub fn sock_cookies(&self) -> Option<HashSet<u64>> {
        let m = BpfHashMap::<_, u64, SockStats>::try_from(self.ebpf.map("SOCKS")?).ok()?;
        Some(m.keys().filter_map(Result::ok).collect())
    }

    /// Deletes a flow from the classifier's map; true when it is not there
    /// any more (deleted, or gone already). A packet that comes later simply
    /// starts a fresh entry.
    pub fn forget_flow(&mut self, key: &FlowKey) -> bool {
        let Some(map) = self.ebpf.map_mut("FLOWS") else { return false };
        let Ok(mut m) = BpfHashMap::<_, FlowKey, FlowStats>::try_from(map) else { return false };
        match m.remove(key) {
            Ok(()) | Err(aya::maps::MapError::KeyNotFound) => true,
            Err(aya::maps::MapError::SyscallError(e)) => e.io_error.raw_os_error() == Some(libc::ENOENT),
            Err(_) => false,
        }
    }
}
