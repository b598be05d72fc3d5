//! `--decrypt`: the live path to a connection's frames, with the server's own
//! secrets. A uprobe on Go's crypto/tls key-log function ([`uprobes`]) hands
//! over every TLS 1.3 secret of the watched servers' handshakes ([`keys`]).
//! The classifier keeps, for every flow, the client's last short large
//! packets and its small ones (`hystall_common::Snips`: where a blocked client
//! says DATA_BLOCKED), and passes whole packets of the flows selected here.
//! Both are opened with the code the pcap path uses
//! (`offline::quic::Decryptors`), and their frame figures go to the model as
//! `Observation::Frames`, as they do offline.
//!
//! Which connections are read, and how closely, the model says
//! (`core::suspects`). Secrets stay in memory unless `--keylog-out` is given.

/// Functions of (stripped) Go binaries from their pc-line table, for uprobes.
pub mod gosym;

pub mod keys;
pub mod uprobes;

use std::collections::{HashMap, HashSet, VecDeque};
use std::path::PathBuf;
use std::sync::Arc;

use aya::maps::{MapData, RingBuf};
use hystall_common::{DIR_C2S, FlowKey, FlowPacket, SNIP_BYTES, SNIPS, TAIL_BYTES, TAILS, TlsSecret};

use crate::core::flows::{Dir, FlowId};
use crate::core::frames::FrameSample;
use crate::core::observation::Observation;
use crate::core::quic::ClientRandom;
use crate::core::suspects::Suspect;
use crate::core::time::Mono;
use crate::sources::captures::offline::quic::Decryptors;
use crate::sources::kernel::probes::{ProbeError, Probes};

/// `--decrypt` and `--keylog-out FILE`.
#[derive(Clone, Debug, Default)]
pub struct DecryptOptions {
    pub keylog_out: Option<PathBuf>,
}

pub use crate::core::event::DecryptInfo;

/// Connections whose ClientHello random is remembered, at most (a node's
/// live connections; the oldest are forgotten first).
const MAX_RANDOMS: usize = 100_000;

struct Reading {
    key: FlowKey,
    seen: u64,
    passed: bool,
}

pub struct LiveDecrypt {
    secrets: RingBuf<MapData>,
    packets: RingBuf<MapData>,
    keys: keys::Keys,
    uprobes: uprobes::Uprobes,
    decryptors: Decryptors,
    /// Flows read: their kernel keys, the time of the last snip read, and
    /// whether the kernel passes their packets.
    selected: HashMap<FlowId, Reading>,
    /// The key generation the decryptors have.
    pushed: u64,
    /// The ClientHello random of each connection's first flow, oldest first
    /// dropped past `MAX_RANDOMS`: ties secrets to connections without
    /// trial decryption, and drops them when the connection closes.
    randoms: HashMap<FlowId, ClientRandom>,
    random_order: VecDeque<FlowId>,
    /// Packets passed and frames figures handed to the model.
    pub packets_read: u64,
}

impl LiveDecrypt {
    pub fn start(probes: &mut Probes, opts: &DecryptOptions) -> Result<LiveDecrypt, ProbeError> {
        if !cfg!(target_arch = "x86_64") {
            return Err(ProbeError::Load("--decrypt reads Go's register ABI on x86_64 only".into()));
        }
        let keys = keys::Keys::new(opts.keylog_out.as_deref()).map_err(|e| {
            ProbeError::Load(format!(
                "--keylog-out {}: {e}",
                opts.keylog_out.as_deref().map(|p| p.display().to_string()).unwrap_or_default()
            ))
        })?;
        Ok(LiveDecrypt {
            secrets: probes.take_secrets()?,
            packets: probes.take_packets()?,
            keys,
            uprobes: Default::default(),
            decryptors: Decryptors::new(Default::default()),
            selected: HashMap::new(),
            pushed: 0,
            randoms: HashMap::new(),
            random_order: VecDeque::new(),
            packets_read: 0,
        })
    }

    /// Follows the watched processes; true when the probed set changed.
    pub fn sync(&mut self, probes: &mut Probes, pids: &HashSet<u32>) -> bool {
        let changed = self.uprobes.sync(probes, pids);
        if changed {
            for p in self.uprobes.procs() {
                match &p.note {
                    None => tracing::info!(
                        "--decrypt: reading TLS secrets of pid {} ({}) at {}",
                        p.pid,
                        p.binary,
                        p.functions.join(", ")
                    ),
                    Some(n) if p.functions.is_empty() => {
                        tracing::info!("--decrypt: pid {} ({}) not probed: {n}", p.pid, p.binary)
                    }
                    Some(n) => tracing::info!("--decrypt: pid {} ({}): {n}", p.pid, p.binary),
                }
            }
        }
        changed
    }

    pub fn info(&self) -> DecryptInfo {
        let processes = self.uprobes.procs();
        let note = (!processes.iter().any(|p| !p.functions.is_empty())).then(|| {
            if processes.is_empty() {
                "no watched process yet: secrets are read from the watched Go servers".to_owned()
            } else {
                "no watched process is a Go server with crypto/tls: nothing can be decrypted (see each process's note)"
                    .to_owned()
            }
        });
        DecryptInfo {
            processes,
            keylog_out: self.keys.keylog_out().map(|p| p.display().to_string()),
            handshakes: self.keys.handshakes,
            tied: self.randoms.len(),
            selected: self.selected.values().filter(|r| r.passed).count(),
            note,
        }
    }

    /// Reads the secrets and packets the kernel passed; the frame figures
    /// that changed go to `out`.
    pub fn drain(&mut self, now: Mono, out: &mut Vec<Observation>) {
        while let Some(item) = self.secrets.next() {
            if item.len() >= std::mem::size_of::<TlsSecret>() {
                // SAFETY: the kernel wrote a TlsSecret (repr(C), Pod) of this size.
                let s: TlsSecret = unsafe { std::ptr::read_unaligned(item.as_ptr() as *const TlsSecret) };
                self.keys.add(Mono(s.ts_ns), &s);
            }
        }
        if self.decryptors.waiting_for_keys() {
            self.push_keys();
        }
        let mut packets = Vec::new();
        while let Some(item) = self.packets.next() {
            if item.len() >= std::mem::size_of::<FlowPacket>() {
                // SAFETY: as above, a FlowPacket.
                let p: FlowPacket = unsafe { std::ptr::read_unaligned(item.as_ptr() as *const FlowPacket) };
                packets.push(p);
            }
        }
        for p in packets {
            let flow = crate::sources::kernel::quic::flow_id(&p.key);
            let dir = if p.dir as usize == DIR_C2S { Dir::C2s } else { Dir::S2c };
            let len = (p.caplen as usize).min(p.bytes.len());
            if !self.selected.get(&flow).is_some_and(|r| r.passed) {
                // A client's Initial (the classifier passes every one):
                // its ClientHello random names the handshake's secrets.
                // (Initial keys come from the DCID: no secret is needed.)
                if dir == Dir::C2s {
                    let mut hello = Decryptors::new(Default::default());
                    hello.datagram(Mono(p.ts_ns), 0, flow, dir, &p.bytes[..len]);
                    if let Some(r) = hello.hello_random_of(&flow) {
                        self.learn(flow, r);
                    }
                }
                continue;
            }
            self.packets_read += 1;
            self.decryptors.datagram(Mono(p.ts_ns), 0, flow, dir, &p.bytes[..len]);
        }
        for (flow, state) in self.decryptors.changed() {
            out.push(Observation::Frames { at: now, sample: Box::new(FrameSample { flow, state }) });
        }
    }

    fn learn(&mut self, flow: FlowId, random: ClientRandom) {
        if self.randoms.insert(flow, random).is_none() {
            self.random_order.push_back(flow);
        }
        while self.random_order.len() > MAX_RANDOMS {
            if let Some(old) = self.random_order.pop_front() {
                self.randoms.remove(&old);
            }
        }
    }

    /// Hands the decryptors the secrets read so far, if they lack some. (A
    /// copy: the decryptors' log is shared by their connections; this runs
    /// only while a selected connection waits for its secrets.)
    fn push_keys(&mut self) {
        if self.keys.generation != self.pushed {
            self.pushed = self.keys.generation;
            self.decryptors.set_keys(Arc::new(self.keys.log().clone()));
        }
    }

    /// The connections of `flows` closed: the secrets of those read go now
    /// (the others' go by age and count: their handshakes were never tied
    /// to a connection).
    pub fn closed(&mut self, flows: &[FlowId]) {
        let before = self.keys.dropped;
        for f in flows {
            let random = self.randoms.remove(f).or_else(|| self.decryptors.client_random_of(f));
            if let Some(random) = random {
                self.keys.forget(&random);
            }
            self.selected.remove(f);
        }
        if self.random_order.len() > 2 * self.randoms.len() + 1024 {
            let randoms = &self.randoms;
            self.random_order.retain(|f| randoms.contains_key(f));
        }
        self.decryptors.forget(flows);
        if self.keys.dropped != before {
            // The decryptors' copy of the secrets goes too.
            self.push_keys();
        }
    }

    /// Reads the suspects' flows: the snips of all, the packets of those to
    /// pass (`Suspect::pass`; the kernel passes exactly those).
    pub fn select(
        &mut self,
        probes: &mut Probes,
        suspects: &[Suspect],
        keys: &crate::sources::kernel::flow_map::FlowMap,
    ) {
        let mut want: HashMap<FlowId, (FlowKey, Option<usize>, bool, Option<ClientRandom>)> = HashMap::new();
        for s in suspects {
            // Its handshake's random, from the Initial of its first flow.
            let random = s.flows.iter().find_map(|f| self.randoms.get(f)).copied();
            for f in &s.flows {
                if let Some(k) = keys.key(f) {
                    want.insert(*f, (k, s.cid_len, s.pass, random));
                    // Every flow of a connection goes to one decryptor: a
                    // port hop's new flow joins what the connection's frames
                    // say so far (its DATA_BLOCKED too) before the old go.
                    self.decryptors.same_conn(*f, s.conn);
                }
            }
        }
        let gone: Vec<FlowId> = self.selected.keys().filter(|f| !want.contains_key(f)).copied().collect();
        self.decryptors.forget(&gone);
        let mut added = false;
        for (flow, (key, cid_len, pass, random)) in want {
            let r = match self.selected.get_mut(&flow) {
                Some(r) => r,
                None => {
                    added = true;
                    tracing::debug!(
                        "--decrypt: reading {flow:?} (server CID length {cid_len:?}, passed: {pass}, handshake known: {})",
                        random.is_some()
                    );
                    if let Some(l) = cid_len.and_then(|l| u8::try_from(l).ok()) {
                        self.decryptors.set_server_cid_len(flow.server, l);
                    }
                    if let Some(random) = random {
                        self.decryptors.set_client_random(flow, random);
                    }
                    self.selected.entry(flow).or_insert(Reading { key, seen: 0, passed: false })
                }
            };
            if r.passed != pass {
                let done = if pass {
                    probes.select_flow(&r.key).map_err(|e| e.to_string())
                } else {
                    probes.deselect_flow(&r.key);
                    Ok(())
                };
                match done {
                    Ok(()) => r.passed = pass,
                    Err(e) => tracing::debug!("--decrypt: cannot pass {flow:?}: {e}"),
                }
            }
        }
        if added || self.decryptors.waiting_for_keys() {
            self.push_keys();
        }
        // Snips kept since the last look (a flow selected before its client
        // ran out of credit gets its DATA_BLOCKED here: the classifier passes
        // only the first segment of a batch, the DATA_BLOCKED is its last).
        for (flow, Reading { key, seen, .. }) in self.selected.iter_mut() {
            let Some(snips) = probes.snips(key) else { continue };
            let small =
                (0..SNIPS).map(|i| (snips.ts_ns[i], &snips.bytes[i][..(snips.len[i] as usize).min(SNIP_BYTES)]));
            let tails = (0..TAILS)
                .map(|i| (snips.tail_ts_ns[i], &snips.tails[i][..(snips.tail_len[i] as usize).min(TAIL_BYTES)]));
            let mut fresh: Vec<(u64, &[u8])> =
                small.chain(tails).filter(|(ts, b)| !b.is_empty() && *ts > *seen).collect();
            fresh.sort_by_key(|(ts, _)| *ts);
            for (ts, bytes) in fresh {
                tracing::debug!("--decrypt: {flow:?}: a {}-byte snip from {ts}", bytes.len());
                *seen = ts;
                self.packets_read += 1;
                self.decryptors.datagram(Mono(ts), 0, *flow, Dir::C2s, bytes);
            }
        }
    }
}
