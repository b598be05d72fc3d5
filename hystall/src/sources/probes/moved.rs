//! Reads of the flow map that look up only the flows that moved. User space
//! moves a read epoch on (`FLOW_EPOCH`) before each read; the classifier names
//! a flow in the `MOVED` ring at its first packet of each epoch. A read
//! drains the names, moves the epoch on, then looks up those flows, instead
//! of copying the whole map: at node scale most flows are quiet between two
//! reads (10,000 connections, a keep-alive every few seconds each), and the
//! whole copy every 500 ms was a quarter of hystall's own CPU.
//!
//! The order matters: names drained, then the epoch moved on, then the
//! look-ups. A packet before the look-up is in what they return; a packet
//! after it is the first of the new epoch for its flow, which names it for
//! the next read.

use foldhash::HashSet;

use aya::maps::{Array, HashMap as BpfHashMap, MapData, RingBuf};
use hystall_common::{FlowKey, FlowStats};

use super::{ProbeError, Probes};

/// The ring of names and the epoch they are for.
pub struct Moved {
    ring: RingBuf<MapData>,
    epoch: u32,
}

/// What the look-ups of one read found.
#[derive(Default)]
pub struct Looked {
    pub found: Vec<(FlowKey, FlowStats)>,
    /// Named, but not in the map any more (deleted or evicted since).
    pub missing: Vec<FlowKey>,
}

impl Probes {
    /// The ring of moved-flow names (can be taken once).
    pub fn take_moved(&mut self) -> Result<Moved, ProbeError> {
        let map = self.ebpf.take_map("MOVED").ok_or_else(|| ProbeError::Map("MOVED", "missing".into()))?;
        let ring = RingBuf::try_from(map).map_err(|e| ProbeError::Map("MOVED", e.to_string()))?;
        Ok(Moved { ring, epoch: 0 })
    }

    fn set_flow_epoch(&mut self, epoch: u32) -> Result<(), ProbeError> {
        let map = self.ebpf.map_mut("FLOW_EPOCH").ok_or_else(|| ProbeError::Map("FLOW_EPOCH", "missing".into()))?;
        let mut a: Array<_, u32> = Array::try_from(map).map_err(|e| ProbeError::Map("FLOW_EPOCH", e.to_string()))?;
        a.set(0, epoch, 0).map_err(|e| ProbeError::Map("FLOW_EPOCH", e.to_string()))
    }

    /// The entries of `keys` (one look-up each).
    pub fn lookup_flows(&self, keys: impl IntoIterator<Item = FlowKey>) -> Looked {
        let mut out = Looked::default();
        let Some(map) = self.ebpf.map("FLOWS") else { return out };
        let Ok(m) = BpfHashMap::<_, FlowKey, FlowStats>::try_from(map) else { return out };
        for k in keys {
            match m.get(&k, 0) {
                Ok(st) => out.found.push((k, st)),
                Err(_) => out.missing.push(k),
            }
        }
        out
    }
}

impl Moved {
    /// Drains the names of the flows that moved since the last call and moves
    /// the epoch on (never to 0, which names nothing).
    pub fn next_epoch(&mut self, probes: &mut Probes) -> Result<HashSet<FlowKey>, ProbeError> {
        let mut names = HashSet::default();
        while let Some(item) = self.ring.next() {
            if item.len() >= size_of::<FlowKey>() {
                // SAFETY: the classifier writes one FlowKey per record; read
                // unaligned from the ring's bytes.
                names.insert(unsafe { std::ptr::read_unaligned(item.as_ptr().cast::<FlowKey>()) });
            }
        }
        self.epoch = self.epoch.wrapping_add(1).max(1);
        probes.set_flow_epoch(self.epoch)?;
        Ok(names)
    }
}
