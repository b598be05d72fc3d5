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
use aya::programs::{ProgramError, SchedClassifier, TestRun as _, TestRunOptions};
use hystall_common::{COPY_BATCH, FlowKey, FlowStats};

use super::{ProbeError, Probes};

/// The classifier that copies named flows (`hystall-ebpf` `flow_copy.rs`).
pub const COPY_PROG: &str = "flow_copy";

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

    /// The entries of `keys`: copied in the kernel `COPY_BATCH` at a time
    /// (`flow_copy`), else one look-up syscall each.
    pub fn lookup_flows(&mut self, keys: impl IntoIterator<Item = FlowKey>) -> Looked {
        let keys: Vec<FlowKey> = keys.into_iter().collect();
        let mut out = Looked::default();
        let mut done = 0;
        if self.flow_copy {
            for chunk in keys.chunks(COPY_BATCH as usize) {
                match self.copy_flows(chunk) {
                    Ok(copies) => {
                        for (k, st) in chunk.iter().zip(copies) {
                            // `ifindex` 0: not in the map (`flow_copy`).
                            if st.ifindex != 0 {
                                out.found.push((*k, st));
                            } else {
                                out.missing.push(*k);
                            }
                        }
                        done += chunk.len();
                    }
                    Err(e) => {
                        tracing::warn!("flow reads: the in-kernel copy failed ({e}); reading one flow at a time");
                        self.flow_copy = false;
                        break;
                    }
                }
            }
        }
        let Some(map) = self.ebpf.map("FLOWS") else { return out };
        let Ok(m) = BpfHashMap::<_, FlowKey, FlowStats>::try_from(map) else { return out };
        for k in &keys[done..] {
            match m.get(k, 0) {
                Ok(st) => out.found.push((*k, st)),
                Err(_) => out.missing.push(*k),
            }
        }
        out
    }

    /// One run of `flow_copy` over `keys` (at most `COPY_BATCH`).
    fn copy_flows(&self, keys: &[FlowKey]) -> Result<Vec<FlowStats>, String> {
        let map = |name| self.ebpf.map(name).ok_or_else(|| format!("{name} missing"));
        super::batch::set_array(map("COPY_KEYS")?, keys).map_err(|e| format!("COPY_KEYS: {e}"))?;
        let prog: &SchedClassifier = self
            .ebpf
            .program(COPY_PROG)
            .ok_or("flow_copy missing")?
            .try_into()
            .map_err(|e: ProgramError| e.to_string())?;
        // An Ethernet header's room, then the count.
        let mut frame = [0u8; 18];
        frame[14..].copy_from_slice(&(keys.len() as u32).to_ne_bytes());
        let run = prog
            .test_run(TestRunOptions { data_in: Some(&frame), ..TestRunOptions::new() })
            .map_err(|e| format!("run: {e}"))?;
        if run.return_value as usize != keys.len() {
            return Err(format!("copied {} of {}", run.return_value, keys.len()));
        }
        super::batch::get_array(map("COPY_OUT")?, keys.len()).map_err(|e| format!("COPY_OUT: {e}"))
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

#[cfg(test)]
mod tests {
    use std::collections::HashSet;
    use std::net::UdpSocket;

    use super::*;
    use crate::sources::kernel::probes::{ProbeConfig, tc::Iface};

    /// The in-kernel copy reads what one look-up per flow reads, over more
    /// flows than one run copies, and says which are missing.
    #[test]
    fn flows_copied_in_the_kernel_are_the_flows_looked_up_one_by_one() {
        // SAFETY: geteuid has no preconditions and cannot fail.
        if unsafe { libc::geteuid() } != 0 {
            println!("skipped: needs root");
            return;
        }
        let server = UdpSocket::bind("127.0.0.1:0").expect("bind");
        let port = server.local_addr().expect("addr").port();
        let mut probes = Probes::load(&ProbeConfig::default()).expect("probes load");
        let lo = Iface::by_name("lo").expect("lo");
        probes.attach_quic(&[lo], &HashSet::from([port])).expect("attach on lo");
        assert!(probes.flow_copy, "flow_copy loads");
        // More clients than one run copies, each with its own counts.
        let n = COPY_BATCH as usize + 88;
        let clients: Vec<UdpSocket> = (0..n).map(|_| UdpSocket::bind("127.0.0.1:0").expect("client")).collect();
        for (i, c) in clients.iter().enumerate() {
            for _ in 0..=i % 3 {
                c.send_to(&vec![0x40; 30 + i], ("127.0.0.1", port)).expect("send");
            }
        }
        let mut whole = Vec::new();
        probes.each_flow(|k, st| {
            if k.server_port == port {
                whole.push((k, st));
            }
        });
        assert_eq!(whole.len(), n, "one flow per client");
        let absent = FlowKey { client_port: 1, ..whole[0].0 };
        let keys: Vec<FlowKey> = whole.iter().map(|(k, _)| *k).chain([absent]).collect();

        let copied = probes.lookup_flows(keys.iter().copied());
        assert!(probes.flow_copy, "the copy kept working");
        probes.flow_copy = false;
        let one_by_one = probes.lookup_flows(keys.iter().copied());
        assert_eq!(copied.found.len(), n);
        assert_eq!(copied.found, one_by_one.found);
        assert_eq!(copied.found, whole);
        assert_eq!(copied.missing, vec![absent]);
        assert_eq!(one_by_one.missing, vec![absent]);
        for (i, c) in clients.iter().enumerate() {
            let port = c.local_addr().expect("addr").port();
            let (_, st) = copied.found.iter().find(|(k, _)| k.client_port == port).expect("its flow");
            assert_eq!(st.dir[hystall_common::DIR_C2S].packets.iter().sum::<u64>(), i as u64 % 3 + 1, "client {i}");
        }
    }
}
