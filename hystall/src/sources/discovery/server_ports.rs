//! Which UDP ports of the watched processes are QUIC *servers*, decided from
//! their traffic.
//!
//! Every unconnected UDP socket of a watched process is a candidate: the
//! kernel's PORTS array marks it, so the classifier counts and samples its
//! flows like a server port's, but nothing of it reaches the model until the
//! port is shown to be a server. The proof is a client's first Initial
//! *received* on the port (a long-header Initial with a DCID of at least 8
//! bytes, RFC 9000 §7.2) on a flow where the port had not spoken first. A
//! proxy's own outbound QUIC client sockets (hysteria2 outbounds, the lab's
//! quinn client) are the opposite: they send the first Initial and receive the
//! server's; such a socket is dropped from the candidates for as long as it lives.
//!
//! Ports bound outside the kernel's ephemeral range are servers at once (a
//! client socket is never given one by the kernel), as are `--port` ones. A
//! port promoted by an Initial stays a server while a watched process has a
//! socket on it; when the socket goes (server stopped or moved), so does the port.
//!
//! Port-hopping ranges come from the firewall (`nft.rs`): ports that a DNAT or
//! redirect rule sends to a server port are watched with it (a client's
//! packets reach the TC ingress hook before the DNAT, still on the hop port).

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use hystall_common::{DIR_C2S, FlowSample};

use super::nft::Redirect;
use crate::core::event::{QuicPortInfo, QuicPortsInfo};
use crate::core::flows::FlowId;
use crate::core::quic::{Peek, VERSION_1, VERSION_2, VERSION_DRAFT_29};

/// Samples held per candidate port until it is decided (the handshake of the
/// connection that proves it, and a few of the flows before it).
const HELD_PER_PORT: usize = 64;
/// And only those of the last few seconds: a node's proxy has thousands of
/// UDP sockets that stay candidates (relays, its own client sockets opened
/// before we came), and what a connection sends keeps being sampled after
/// its port is proven.
const HELD_FOR_NS: u64 = 10_000_000_000;
/// Flows remembered per candidate port (who spoke first).
const FLOWS_PER_PORT: usize = 4096;
/// How long a port named by the config of a proxy that just started stays a
/// server port with no socket on it (it binds within milliseconds; a config
/// port it never serves is not watched for longer).
pub const STARTING_GRACE: Duration = Duration::from_secs(5);

/// An unconnected UDP socket of a watched process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UdpSock {
    pub port: u16,
    pub pid: u32,
    pub inode: u32,
}

/// Why a port is watched as a QUIC server port.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Why {
    /// `--port` (or the lab's port).
    Explicit,
    /// Bound outside the ephemeral range: only a server binds such a port.
    Fixed,
    /// The proxy's own config file names it as a QUIC inbound's port.
    Config(String),
    /// It received a client's first Initial from this address.
    ClientInitial(SocketAddr),
}

impl Why {
    fn text(&self) -> String {
        match self {
            Why::Explicit => "given with --port".into(),
            Why::Fixed => "unconnected UDP socket bound outside the ephemeral port range".into(),
            Why::Config(f) => format!("a QUIC inbound of the proxy's config {f}"),
            Why::ClientInitial(a) => format!("received a client's Initial from {a}"),
        }
    }
}

#[derive(Default)]
struct Candidate {
    pid: u32,
    inode: u32,
    held: VecDeque<FlowSample>,
    /// Flows on which this port sent before it received anything (foldhash:
    /// looked up for every sample of a candidate port).
    spoke_first: foldhash::HashSet<FlowId>,
    /// Flows on which this port received something.
    heard: foldhash::HashSet<FlowId>,
}

/// The decision, kept across rescans.
pub struct ServerPorts {
    ephemeral: (u16, u16),
    explicit: HashSet<u16>,
    /// Discovering at all (not with every process watched: then only --port).
    discover: bool,
    servers: BTreeMap<u16, (Option<u32>, Why)>,
    candidates: BTreeMap<u16, Candidate>,
    /// Inodes of QUIC client sockets: seen sending a first Initial, or
    /// talking to one of our server ports on this host.
    clients: HashSet<u32>,
    /// QUIC inbound ports the watched proxies' configs name → the file.
    configured: HashMap<u16, String>,
    /// Firewall redirects of UDP port ranges (as last read).
    redirects: Vec<Redirect>,
    /// Hop ports watched: port → the server port a rule sends it to.
    hops: BTreeMap<u16, u16>,
    /// Why the server ports changed since the last `take_change`.
    change: Option<String>,
    /// Ports of proxies that just started, not bound by them yet: servers
    /// until then (the process, the end of its grace).
    starting: HashMap<u16, (u32, Instant)>,
}

impl ServerPorts {
    pub fn new(explicit: HashSet<u16>, ephemeral: (u16, u16), discover: bool) -> ServerPorts {
        let servers = explicit.iter().map(|p| (*p, (None, Why::Explicit))).collect();
        ServerPorts {
            ephemeral,
            explicit,
            discover,
            servers,
            candidates: BTreeMap::new(),
            clients: HashSet::new(),
            configured: HashMap::new(),
            redirects: Vec::new(),
            hops: BTreeMap::new(),
            change: None,
            starting: HashMap::new(),
        }
    }

    /// A watched proxy has just started (its exec): the QUIC ports its config
    /// names are server ports now, before it binds them. Its clients dial
    /// within milliseconds (a restart under load), and a connection is
    /// counted from its first packet only if its port is watched by then.
    /// Each stays one until that process binds it, for `STARTING_GRACE` at
    /// most. A port already served (a restart whose old process has not
    /// let go yet, a `sing-box check` of the running config) keeps its
    /// owner while `alive` says it runs, and is not reported again.
    pub fn started(&mut self, pid: u32, configured: &[(u16, String)], alive: impl Fn(u32) -> bool) {
        let until = Instant::now() + STARTING_GRACE;
        let mut found = Vec::new();
        for (port, file) in configured {
            self.candidates.remove(port);
            match self.servers.get_mut(port) {
                Some((owner, _)) => {
                    if !owner.is_some_and(&alive) {
                        *owner = Some(pid);
                    }
                }
                None => {
                    self.servers.insert(*port, (Some(pid), Why::Config(file.clone())));
                    found.push(*port);
                }
            }
            self.starting.insert(*port, (pid, until));
        }
        if !found.is_empty() {
            self.note_change(format!("found {} (named by the config of pid {pid}, which just started)", list(&found)));
            self.apply_redirects();
        }
    }

    /// Takes in the watched processes' unconnected UDP sockets (every rescan).
    pub fn update(&mut self, socks: &[UdpSock]) {
        let waiting_before = self.waiting();
        let (lo, hi) = self.ephemeral;
        let by_port: HashMap<u16, UdpSock> = socks.iter().map(|s| (s.port, *s)).collect();
        let live_inodes: HashSet<u32> = socks.iter().map(|s| s.inode).collect();
        self.clients.retain(|i| live_inodes.contains(i));
        let mut gone = Vec::new();
        // A started proxy's port waits for its socket a while; once bound,
        // it is an ordinary server port.
        let now = Instant::now();
        self.starting
            .retain(|port, (pid, until)| now < *until && !socks.iter().any(|s| s.port == *port && s.pid == *pid));
        let starting = &self.starting;
        self.servers.retain(|port, (_, why)| {
            let keep = *why == Why::Explicit || by_port.contains_key(port) || starting.contains_key(port);
            if !keep {
                gone.push(*port);
            }
            keep
        });
        self.candidates.retain(|port, c| by_port.get(port).is_some_and(|s| s.inode == c.inode));
        let mut fixed = Vec::new();
        let mut configured = Vec::new();
        for s in socks {
            if let Some((pid, _)) = self.servers.get_mut(&s.port) {
                // The process that holds it now (a restart is a new pid).
                *pid = Some(s.pid);
                continue;
            }
            if self.clients.contains(&s.inode) {
                continue;
            }
            // Named by the proxy's config: a server port even with connections
            // that were open before we came (no Initial to wait for).
            if let Some(file) = self.configured.get(&s.port) {
                self.candidates.remove(&s.port);
                self.servers.insert(s.port, (Some(s.pid), Why::Config(file.clone())));
                configured.push(s.port);
                continue;
            }
            if !(lo..=hi).contains(&s.port) {
                self.servers.insert(s.port, (Some(s.pid), Why::Fixed));
                fixed.push(s.port);
                continue;
            }
            self.candidates.entry(s.port).or_insert_with(|| Candidate {
                pid: s.pid,
                inode: s.inode,
                ..Default::default()
            });
        }
        let mut why = Vec::new();
        if !configured.is_empty() {
            why.push(format!("found {} (named by the proxy's config)", list(&configured)));
        }
        if !fixed.is_empty() {
            why.push(format!("found {} (bound outside the ephemeral range)", list(&fixed)));
        }
        if !gone.is_empty() {
            why.push(format!("{} gone (no watched process has a socket on it)", list(&gone)));
        }
        // While no server port is known, the user is told when candidates
        // appear (a UDP socket to watch for Initials) or all go.
        let waiting = self.waiting();
        if waiting != waiting_before && self.servers.is_empty() {
            why.push(if waiting {
                format!(
                    "UDP port(s) {} wait for a client's Initial",
                    list(&self.candidates.keys().copied().collect::<Vec<_>>())
                )
            } else {
                "no candidate UDP port left".into()
            });
        }
        if !why.is_empty() {
            self.note_change(why.join("; "));
        }
        self.apply_redirects();
    }

    /// Takes in the QUIC ports the watched proxies' configs name (port → file);
    /// applied at the next `update`.
    pub fn set_configured(&mut self, configured: HashMap<u16, String>) {
        self.configured = configured;
    }

    /// Takes in the firewall's redirects of UDP port ranges (read every few seconds).
    pub fn set_redirects(&mut self, redirects: Vec<Redirect>) {
        self.redirects = redirects;
        self.apply_redirects();
    }

    /// Hop ports: those the redirects send to a server port (never a server
    /// port itself).
    fn apply_redirects(&mut self) {
        let mut hops = BTreeMap::new();
        for r in self.redirects.iter().filter(|r| self.servers.contains_key(&r.to)) {
            for p in r.lo..=r.hi {
                if !self.servers.contains_key(&p) {
                    hops.insert(p, r.to);
                }
            }
        }
        if hops != self.hops {
            let ranges = hop_ranges(&hops);
            let why = if ranges.is_empty() {
                "no port-hopping range any more".to_owned()
            } else {
                format!(
                    "port-hopping range(s) from the firewall: {}",
                    ranges
                        .iter()
                        .map(|(lo, hi, to)| format!("{} -> {to}", span(*lo, *hi)))
                        .collect::<Vec<_>>()
                        .join(", ")
                )
            };
            self.hops = hops;
            self.note_change(why);
        }
    }

    /// Candidates exist, no server port does.
    fn waiting(&self) -> bool {
        self.servers.is_empty() && !self.candidates.is_empty()
    }

    fn note_change(&mut self, why: String) {
        self.change = Some(match self.change.take() {
            Some(old) => format!("{old}; {why}"),
            None => why,
        });
    }

    /// Ports the kernel should count: servers and candidates.
    pub fn kernel_ports(&self) -> HashSet<u16> {
        self.servers.keys().chain(self.candidates.keys()).chain(self.hops.keys()).copied().collect()
    }

    /// (server ports, candidate ports).
    pub fn counts(&self) -> (usize, usize) {
        (self.servers.len() + self.hops.len(), self.candidates.len())
    }

    pub fn is_server(&self, port: u16) -> bool {
        self.servers.contains_key(&port) || self.hops.contains_key(&port)
    }

    /// Discovered server ports → the process serving on them.
    pub fn owners(&self) -> HashMap<u16, u32> {
        self.servers.iter().filter_map(|(p, (pid, _))| pid.map(|pid| (*p, pid))).collect()
    }

    /// A header sample from the classifier: what to hand on to the model
    /// goes into `out` (the sample itself for a server port, nearly every
    /// one; for a candidate, nothing, or all it held when this sample proves
    /// it a server).
    pub fn take_sample(&mut self, s: FlowSample, flow: FlowId, out: &mut Vec<FlowSample>) {
        let port = s.key.server_port;
        if self.is_server(port) {
            out.push(s);
            return;
        }
        // Its peer is one of our server ports on this host: a QUIC client of
        // the watched server itself (a local health check, the lab's
        // clients), not a server. Left a candidate, its flows would be
        // counted and sampled as a server's: on loopback, every packet of
        // that connection twice.
        if self.is_server(flow.client.port()) && same_host(&flow) {
            self.drop_client(port);
            return;
        }
        let Some(c) = self.candidates.get_mut(&port) else { return };
        let n = (s.caplen as usize).min(s.bytes.len());
        let initial = first_initial(&s.bytes[..n]);
        if s.dir as usize != DIR_C2S {
            if !c.heard.contains(&flow) {
                if initial {
                    // It opened a QUIC connection itself: a client socket.
                    self.drop_client(port);
                    return;
                }
                bounded_insert(&mut c.spoke_first, flow);
            }
            hold(&mut c.held, s);
            return;
        }
        bounded_insert(&mut c.heard, flow);
        if initial && !c.spoke_first.contains(&flow) {
            let c = self.candidates.remove(&port).expect("candidate");
            self.servers.insert(port, (Some(c.pid), Why::ClientInitial(flow.client)));
            self.note_change(format!(
                "{port} is a QUIC server port (received a client's Initial from {})",
                flow.client
            ));
            self.apply_redirects();
            out.extend(c.held);
            out.push(s);
            return;
        }
        hold(&mut c.held, s);
    }

    /// Candidate `port` is a QUIC client socket: dropped for its lifetime.
    fn drop_client(&mut self, port: u16) {
        if let Some(c) = self.candidates.remove(&port) {
            self.clients.insert(c.inode);
        }
    }

    /// `take_sample` into a list of its own.
    #[cfg(test)]
    pub fn on_sample(&mut self, s: FlowSample, flow: FlowId) -> Vec<FlowSample> {
        let mut out = Vec::new();
        self.take_sample(s, flow, &mut out);
        out
    }

    /// What changed in the server ports since the last call, and why.
    pub fn take_change(&mut self) -> Option<String> {
        self.change.take()
    }

    /// The server ports, the candidates and, when nothing QUIC is watched,
    /// why and what to do.
    pub fn info(&self, reason: String) -> QuicPortsInfo {
        let mut ports = Vec::new();
        let mut explicit: Vec<u16> = self.explicit.iter().copied().collect();
        explicit.sort_unstable();
        for (lo, hi) in ranges(&explicit) {
            let port = span(lo, hi);
            let pid = self.servers.get(&lo).and_then(|(p, _)| *p);
            ports.push(QuicPortInfo { port, pid, why: Why::Explicit.text() });
        }
        for (p, (pid, why)) in self.servers.iter().filter(|(_, (_, w))| *w != Why::Explicit) {
            ports.push(QuicPortInfo { port: p.to_string(), pid: *pid, why: why.text() });
        }
        for (lo, hi, to) in hop_ranges(&self.hops) {
            let pid = self.servers.get(&to).and_then(|(p, _)| *p);
            ports.push(QuicPortInfo {
                port: span(lo, hi),
                pid,
                why: format!("port hopping: a firewall rule sends it to {to}"),
            });
        }
        let candidates: Vec<u16> = self.candidates.keys().copied().collect();
        QuicPortsInfo { note: self.note(), ports, candidates, reason }
    }

    /// Why nothing QUIC is watched, when nothing is.
    pub fn note(&self) -> Option<String> {
        if !self.servers.is_empty() {
            return None;
        }
        Some(if !self.discover {
            "no QUIC server port watched: every process is watched, so server ports are not discovered; give --port P (or select the proxy with --pid/--comm/--unit)".into()
        } else if self.candidates.is_empty() {
            "no QUIC server port watched: the watched processes have no unconnected UDP socket (no QUIC server running?); give --port P if it serves elsewhere".into()
        } else {
            format!(
                "no QUIC server port yet: UDP port(s) {} of the watched processes wait for a client's Initial to show they serve QUIC (connections opened before hystall started are seen only once a client connects anew); --port P watches a port at once",
                list(&self.candidates.keys().copied().collect::<Vec<_>>())
            )
        })
    }
}

/// A long-header Initial with a DCID of at least 8 bytes: what a client's first
/// packet is (RFC 9000 §7.2; a server's Initials carry the client's SCID,
/// which quic-go clients keep at 4 bytes).
fn first_initial(bytes: &[u8]) -> bool {
    let Peek::Long { version, dcid, .. } = Peek::of(bytes) else { return false };
    let ty = (bytes[0] >> 4) & 0x03;
    let initial = match version {
        VERSION_1 | VERSION_DRAFT_29 => ty == 0,
        VERSION_2 => ty == 1,
        _ => false,
    };
    initial && dcid.len() >= 8
}

/// Whether both ends of `flow` are on this host (loopback, or one address).
fn same_host(flow: &FlowId) -> bool {
    let (a, b) = (flow.client.ip(), flow.server.ip());
    a == b || (a.is_loopback() && b.is_loopback())
}

fn hold(held: &mut VecDeque<FlowSample>, s: FlowSample) {
    while held.len() == HELD_PER_PORT || held.front().is_some_and(|h| s.ts_ns.saturating_sub(h.ts_ns) > HELD_FOR_NS) {
        held.pop_front();
    }
    held.push_back(s);
}

fn bounded_insert(set: &mut foldhash::HashSet<FlowId>, f: FlowId) {
    if set.len() >= FLOWS_PER_PORT {
        set.clear();
    }
    set.insert(f);
}

fn list(ports: &[u16]) -> String {
    let v: Vec<String> = ports.iter().map(u16::to_string).collect();
    if v.len() > 8 { format!("{}… ({} ports)", v[..8].join(","), v.len()) } else { v.join(",") }
}

fn span(lo: u16, hi: u16) -> String {
    if lo == hi { lo.to_string() } else { format!("{lo}-{hi}") }
}

/// Runs of consecutive hop ports sent to the same server port: (lo, hi, to).
fn hop_ranges(hops: &BTreeMap<u16, u16>) -> Vec<(u16, u16, u16)> {
    let mut out: Vec<(u16, u16, u16)> = Vec::new();
    for (&p, &to) in hops {
        match out.last_mut() {
            Some((_, hi, t)) if *t == to && u32::from(*hi) + 1 == u32::from(p) => *hi = p,
            _ => out.push((p, p, to)),
        }
    }
    out
}

/// Consecutive runs of sorted ports.
fn ranges(sorted: &[u16]) -> Vec<(u16, u16)> {
    let mut out: Vec<(u16, u16)> = Vec::new();
    for &p in sorted {
        match out.last_mut() {
            Some((_, hi)) if u32::from(*hi) + 1 == u32::from(p) => *hi = p,
            _ => out.push((p, p)),
        }
    }
    out
}

#[cfg(test)]
mod tests;
