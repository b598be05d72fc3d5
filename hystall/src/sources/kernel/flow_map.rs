//! The kernel's flow map as user space last read it: each flow's kernel key
//! (to delete it once its connection closes) and the time of its last packet.
//! A read then hands on only the flows that moved since the one before, and
//! names those the kernel dropped. At node scale most flows are quiet between
//! two reads (10,000 connections, a keep-alive every few seconds each): the
//! connection table sees the others only, and nothing is rebuilt per read.

use hystall_common::{FlowKey, FlowStats};

use super::quic::{flow_counters, flow_id};
use crate::core::flows::{FlowCounters, FlowId};

struct Known {
    key: FlowKey,
    /// The flow's last packet, either way (ns): a packet moves it.
    last: u64,
    /// The read that last saw it.
    read: u32,
}

/// What one read of the map found.
#[derive(Debug, Default, PartialEq)]
pub struct Read {
    /// Flows new or with packets since the last read, with their counters.
    pub moved: Vec<(FlowId, FlowCounters)>,
    /// Flows of the last read that are gone (not deleted by us: the LRU map
    /// dropped them for room, or their port is no longer a server's).
    pub gone: Vec<FlowId>,
}

#[derive(Default)]
pub struct FlowMap {
    known: foldhash::HashMap<FlowId, Known>,
    reads: u32,
}

/// The flow's last packet, either way (ns since boot).
pub fn last_packet(s: &FlowStats) -> u64 {
    s.dir.iter().flat_map(|d| d.last_ns).max().unwrap_or(0)
}

impl FlowMap {
    /// One whole read of the map (the server ports' flows).
    pub fn read(&mut self, entries: impl IntoIterator<Item = (FlowKey, FlowStats)>) -> Read {
        let mut whole = self.whole();
        for (key, st) in entries {
            whole.entry(key, &st);
        }
        whole.end()
    }

    /// A whole read fed an entry at a time (as the kernel's batches come,
    /// with no copy of the map), then ended.
    pub fn whole(&mut self) -> Whole<'_> {
        self.reads = self.reads.wrapping_add(1);
        Whole { map: self, out: Read::default(), seen: 0 }
    }

    /// A read of the flows the kernel named as moved (`probes::moved`):
    /// `entries` found in the map, `missing` named but not there any more.
    /// Quiet flows are not in it, so nothing is gone for being absent; the
    /// whole reads between find what the LRU map dropped unnamed.
    pub fn read_moved(&mut self, entries: impl IntoIterator<Item = (FlowKey, FlowStats)>, missing: &[FlowKey]) -> Read {
        let mut out = Read::default();
        for (key, st) in entries {
            out.moved.extend(self.see(key, &st));
        }
        for key in missing {
            let id = flow_id(key);
            if self.known.get(&id).is_some_and(|k| k.key == *key) {
                self.known.remove(&id);
                out.gone.push(id);
            }
        }
        out
    }

    /// One entry of a read (marked seen by the current one): its counters
    /// when it is new or had packets since it was last seen.
    fn see(&mut self, key: FlowKey, st: &FlowStats) -> Option<(FlowId, FlowCounters)> {
        let (id, last, read) = (flow_id(&key), last_packet(st), self.reads);
        match self.known.get_mut(&id) {
            Some(k) if k.last == last && k.key == key => {
                k.read = read;
                return None;
            }
            Some(k) => *k = Known { key, last, read },
            None => {
                self.known.insert(id, Known { key, last, read });
            }
        }
        Some((id, flow_counters(st)))
    }

    /// The kernel key of a flow of the last read.
    pub fn key(&self, flow: &FlowId) -> Option<FlowKey> {
        self.known.get(flow).map(|k| k.key)
    }

    /// Forgets a flow (its kernel entry is being deleted): not `gone` later.
    pub fn remove(&mut self, flow: &FlowId) -> Option<FlowKey> {
        self.known.remove(flow).map(|k| k.key)
    }

    pub fn len(&self) -> usize {
        self.known.len()
    }

    pub fn is_empty(&self) -> bool {
        self.known.is_empty()
    }
}

/// A whole read under way (`FlowMap::whole`).
pub struct Whole<'a> {
    map: &'a mut FlowMap,
    out: Read,
    seen: usize,
}

impl Whole<'_> {
    /// One entry of the map.
    pub fn entry(&mut self, key: FlowKey, st: &FlowStats) {
        self.seen += 1;
        self.out.moved.extend(self.map.see(key, st));
    }

    /// The read's result: what moved, and what the map no longer holds.
    pub fn end(self) -> Read {
        let Whole { map, mut out, seen } = self;
        let read = map.reads;
        if map.known.len() > seen {
            map.known.retain(|id, k| {
                let seen = k.read == read;
                if !seen {
                    out.gone.push(*id);
                }
                seen
            });
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(port: u16, last: u64) -> (FlowKey, FlowStats) {
        let mut k =
            FlowKey { family: hystall_common::AF_INET, client_port: port, server_port: 443, ..Default::default() };
        k.client[..4].copy_from_slice(&[10, 0, 0, 1]);
        k.server[..4].copy_from_slice(&[10, 0, 0, 2]);
        let mut s = FlowStats::default();
        s.dir[0].packets[0] = last;
        s.dir[0].last_ns[0] = last;
        (k, s)
    }

    fn ports(r: &[(FlowId, FlowCounters)]) -> Vec<u16> {
        let mut v: Vec<u16> = r.iter().map(|(f, _)| f.client.port()).collect();
        v.sort();
        v
    }

    #[test]
    fn a_read_hands_on_only_what_moved_and_names_what_went() {
        let mut m = FlowMap::default();
        let first = m.read([entry(1, 10), entry(2, 10), entry(3, 10)]);
        assert_eq!(ports(&first.moved), [1, 2, 3], "every flow is new");
        assert!(first.gone.is_empty());
        // 1 quiet, 2 moved, 3 dropped by the kernel, 4 new.
        let second = m.read([entry(1, 10), entry(2, 20), entry(4, 20)]);
        assert_eq!(ports(&second.moved), [2, 4]);
        assert_eq!(second.gone.iter().map(|f| f.client.port()).collect::<Vec<_>>(), [3]);
        assert_eq!(m.len(), 3);
        // A flow we delete ourselves is not reported gone.
        assert!(m.remove(&second.moved[0].0).is_some());
        let third = m.read([entry(1, 10)]);
        assert!(third.moved.is_empty());
        assert_eq!(third.gone.len(), 1, "{third:?}");
        assert_eq!(m.key(&first.moved[0].0).map(|k| k.client_port), Some(1));
    }

    #[test]
    fn a_flow_dropped_and_made_again_between_reads_moves() {
        let mut m = FlowMap::default();
        m.read([entry(1, 10)]);
        // Same 5-tuple, counters from zero, a later packet.
        let again = m.read([entry(1, 11)]);
        assert_eq!(again.moved.len(), 1);
    }

    #[test]
    fn a_read_of_the_named_flows_hands_on_those_that_moved_and_leaves_the_quiet_ones() {
        let mut m = FlowMap::default();
        m.read([entry(1, 10), entry(2, 10), entry(3, 10)]);
        // 2 moved, 4 is new, 3 was named but is gone from the map; 1 was not
        // named (quiet): it stays, and is not gone for being absent.
        let (k3, _) = entry(3, 10);
        let r = m.read_moved([entry(2, 20), entry(4, 20)], &[k3]);
        assert_eq!(ports(&r.moved), [2, 4]);
        assert_eq!(r.gone.iter().map(|f| f.client.port()).collect::<Vec<_>>(), [3]);
        assert_eq!(m.len(), 3, "1, 2 and 4");
        // Named twice with no new packet (two CPUs named it): nothing moved.
        assert!(m.read_moved([entry(2, 20)], &[]).moved.is_empty());
        // The next whole read still finds what the map dropped unnamed.
        let whole = m.read([entry(2, 20), entry(4, 20)]);
        assert!(whole.moved.is_empty());
        assert_eq!(whole.gone.iter().map(|f| f.client.port()).collect::<Vec<_>>(), [1]);
    }
}
