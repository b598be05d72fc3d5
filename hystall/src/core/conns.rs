//! QUIC connections, grouped from UDP flows the way a passive observer must
//! (docs/DETECTOR.md, "What a starved connection looks like"):
//! - client → server short headers carry the server-chosen DCID; its length is
//!   learned from the server's long-header SCIDs (quic-go picks 4 bytes), or,
//!   when we attached after the handshake, from the prefix that consecutive
//!   packets of a path share (the protected packet number after it is random);
//! - server → client packets usually carry a zero-length DCID: they belong to
//!   the connection of their 5-tuple;
//! - a client that hops ports or is NAT-rebound keeps its DCID, so a new
//!   5-tuple whose packets start with a known DCID joins that connection;
//! - obfuscated traffic (Salamander) has no readable header: it is grouped by
//!   5-tuple and marked so, never merged by guesswork.

use std::cmp::Reverse;
use std::collections::{BTreeSet, BinaryHeap};
use std::time::Duration;

use foldhash::{HashMap, HashSet};
use serde::Serialize;

use super::activity::Digest;
use super::flows::{Dir, DirCounters, FlowCounters, FlowId, HeaderSample, Reply};
use super::quic::{ConnectionId, Peek, common_prefix};
use super::time::Mono;

/// Consecutive short-header samples of a flow that must share a prefix before
/// it is taken for the DCID (only the last ones are kept).
const PREFIX_MIN: usize = 3;
/// Rates are averaged over this long.
const RATE_WINDOW: Duration = Duration::from_secs(5);
/// Spacing of the points kept for the rates.
const HISTORY_STEP: Duration = Duration::from_secs(1);
/// A connection whose grouping is still open is reported after this long.
const OPEN_AFTER: Duration = Duration::from_secs(2);
/// At most this many stale flows wait for the next sweep (each poll re-finds
/// the ones left over).
const MAX_STALE: usize = 4096;

/// How a connection's packets were tied together.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Grouping {
    /// By the server-chosen connection ID (survives port hops).
    Dcid,
    /// By 5-tuple: the header is obfuscated (e.g. Salamander).
    Obfuscated,
    /// By 5-tuple: no connection ID could be read (yet).
    FiveTuple,
}

#[derive(Clone, Debug)]
pub struct Conn {
    pub id: u64,
    pub dcid: Option<ConnectionId>,
    pub grouping: Grouping,
    /// Client 5-tuples, in the order seen (more than one = port hops).
    pub flows: Vec<FlowId>,
    pub first_seen: Mono,
    pub last_seen: Mono,
    /// Sums over the connection's flows.
    pub c2s: DirCounters,
    pub s2c: DirCounters,
    pub opened_reported: bool,
    pub closed: Option<Mono>,
    /// What decrypted frames show (captures with a key log; live with `--decrypt`).
    pub frames: Option<Box<super::frames::FrameState>>,
    /// Counters of the paths this connection left (a port-hopping client's
    /// old 5-tuples, idle past the timeout): folded in so their flows can go.
    /// Boxed: only port-hopping clients have any.
    folded: Option<Box<(DirCounters, DirCounters)>>,
    /// Client addresses of those paths that no remaining flow has.
    folded_clients: usize,
    /// Length of the server's connection IDs for this connection: from its
    /// handshake SCIDs, else estimated once from the client's short headers.
    /// Kept here, not only per server address: with DNAT before TC the server's
    /// packets show the hop port and the client's the real one, and a client
    /// that moves to a new DCID must be read with the length already known.
    cid_len: Option<usize>,
    /// (time, c2s, s2c) sums when they changed (one point a second at most),
    /// for rates over a few seconds: the newest point at or before the
    /// window's start, and those after it.
    history: std::collections::VecDeque<Point>,
}

/// Packets and bytes per size class, both ways, at one time: a rate point
/// (without the times a `DirCounters` keeps: a node keeps tens of thousands
/// of connections, each with a few points).
#[derive(Clone, Copy, Debug)]
struct Point {
    at: Mono,
    /// c2s packets, c2s bytes, s2c packets, s2c bytes.
    n: [[u64; 3]; 4],
}

impl Point {
    fn of(at: Mono, c2s: &DirCounters, s2c: &DirCounters) -> Point {
        Point { at, n: [c2s.packets, c2s.bytes, s2c.packets, s2c.bytes] }
    }
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct Rates {
    pub c2s_pps: [f64; 3],
    pub c2s_bps: [f64; 3],
    pub s2c_pps: [f64; 3],
    pub s2c_bps: [f64; 3],
}

impl Conn {
    pub fn client(&self) -> Option<std::net::SocketAddr> {
        self.flows.last().map(|f| f.client)
    }

    pub fn server(&self) -> Option<std::net::SocketAddr> {
        self.flows.last().map(|f| f.server)
    }

    pub fn server_ports(&self) -> BTreeSet<u16> {
        self.flows.iter().map(|f| f.server.port()).collect()
    }

    /// Port hops (or NAT rebinds) seen: client addresses after the first.
    pub fn hops(&self) -> usize {
        let clients = self.flows.iter().map(|f| f.client).collect::<BTreeSet<_>>().len();
        (clients + self.folded_clients).saturating_sub(1)
    }

    /// Packets both ways within `window` before `now`.
    pub fn alive(&self, now: Mono, window: Duration) -> bool {
        let recent = |d: &DirCounters| d.last_any().is_some_and(|t| now.since(t) <= window);
        recent(&self.c2s) && recent(&self.s2c)
    }

    /// Length of the server's connection IDs, once known.
    pub fn cid_len(&self) -> Option<usize> {
        self.cid_len
    }

    /// Last time full-size packets (bulk stream data) flowed in `dir`.
    pub fn last_bulk(&self, dir: Dir) -> Option<Mono> {
        match dir {
            Dir::C2s => self.c2s.last[2],
            Dir::S2c => self.s2c.last[2],
        }
    }

    pub fn dcid_hex(&self) -> Option<String> {
        self.dcid.as_ref().map(|c| c.to_string())
    }

    /// Per second, per size class, over the last `RATE_WINDOW` before `now`
    /// (computed when asked: the sums change only when a poll brings new
    /// counters, and a quiet connection's rate falls as time passes).
    pub fn rates(&self, now: Mono) -> Rates {
        let from = Mono(now.0.saturating_sub(RATE_WINDOW.as_nanos() as u64));
        // The sums at the window's start: the last point at or before it
        // (nothing changed between it and the start); a younger connection
        // counts from its first point.
        let (t0, old) = match self.history.iter().rev().find(|p| p.at <= from) {
            Some(p) => (from, p),
            None => match self.history.front() {
                Some(p) => (p.at, p),
                None => return Rates::default(),
            },
        };
        let secs = now.since(t0).as_secs_f64();
        if secs <= 0.0 {
            return Rates::default();
        }
        rates(old, &Point::of(now, &self.c2s, &self.s2c), secs)
    }

    /// What a target's connect asks of it (`attribution::connect`).
    pub fn digest(&self) -> Digest {
        let port = self.flows.first().map_or(0, |f| f.server.port());
        Digest {
            id: self.id,
            last: self.c2s.last_any(),
            began: self.c2s.first.unwrap_or(self.first_seen).min(self.first_seen),
            port: if self.flows.iter().all(|f| f.server.port() == port) { port } else { 0 },
        }
    }

    /// Records the new sums (points a second apart at most; the last one is
    /// always the newest sums, or a connection that went quiet would keep an
    /// old rate), and forgets the points no rate window needs.
    fn set_sums(&mut self, now: Mono, c2s: DirCounters, s2c: DirCounters) {
        let n = self.history.len();
        // The last point is provisional while it is less than a step after
        // the one before: it moves to the newest sums.
        let point = Point::of(now, &c2s, &s2c);
        if n >= 2 && self.history[n - 1].at.since(self.history[n - 2].at) < HISTORY_STEP {
            self.history[n - 1] = point;
        } else {
            self.history.push_back(point);
        }
        let from = Mono(now.0.saturating_sub(RATE_WINDOW.as_nanos() as u64));
        while self.history.get(1).is_some_and(|p| p.at <= from) {
            self.history.pop_front();
        }
        self.c2s = c2s;
        self.s2c = s2c;
        if let Some(t) = c2s.last_any().max(s2c.last_any()) {
            self.last_seen = self.last_seen.max(t);
        }
    }
}

/// What is known of one flow.
#[derive(Clone, Debug, Default)]
struct FlowState {
    conn: u64,
    /// Short-header client→server payloads after the first byte.
    prefixes: Vec<Vec<u8>>,
    obfuscated: bool,
    counters: FlowCounters,
    /// Cumulative kernel counters when this flow joined its connection (a
    /// 5-tuple reused after an earlier connection on it closed). Boxed: rare,
    /// and a node keeps tens of thousands of flows.
    base: Option<Box<FlowCounters>>,
}

/// A change the table reports.
#[derive(Clone, Debug, PartialEq)]
pub enum ConnChange {
    Opened(u64),
    Closed(u64),
}

pub struct ConnTable {
    /// Boxed values (as `flows`): the tables churn at hundreds of
    /// connections a second, and the hash table's in-place rehash moves
    /// every value it holds (memmove was 8 % of hystall's time at node scale).
    conns: HashMap<u64, Box<Conn>>,
    flows: HashMap<FlowId, Box<FlowState>>,
    by_dcid: HashMap<ConnectionId, u64>,
    /// Client address:port → connection. Server → client packets carry no
    /// useful DCID; and with DNAT done before TC (locally generated traffic),
    /// they show a hop port where the client's packets show the real one.
    by_client: HashMap<std::net::SocketAddr, u64>,
    /// Flows of closed connections, with their final cumulative counters: a
    /// later poll showing the same counters is not a new connection.
    retired: HashMap<FlowId, FlowCounters>,
    /// Retired flows a poll showed unchanged: the next sweep offers them for
    /// deletion from the kernel map too (their connection closed before the
    /// source knew their kernel key).
    stale: Vec<FlowId>,
    /// DCID length per server endpoint, learned from its long-header SCIDs.
    cid_len: HashMap<std::net::SocketAddr, usize>,
    next_id: u64,
    /// Connections whose flows' counters or membership changed since the
    /// last tick: only their sums are recomputed (a node's poll brings every
    /// flow, most of them unchanged).
    dirty: HashSet<u64>,
    /// Connections with more than one path: the only ones with paths to fold.
    multipath: HashSet<u64>,
    /// Connections closed by the last tick, for the sweep.
    closing: Vec<u64>,
    /// When idle paths and idle connections were last looked for.
    last_fold: Mono,
    /// Each open connection once, by its last packet when put here, the
    /// oldest first: the idle look pops only those whose time may be up
    /// (and puts back those that had a packet since), not the whole table
    /// (20,000 connections at node scale, each a cache miss).
    idle_queue: BinaryHeap<Reverse<(Mono, u64)>>,
    /// Open connections not reported yet (their grouping may still settle).
    unreported: HashSet<u64>,
    /// Connections with decrypted-frame figures.
    framed: HashSet<u64>,
    /// Which connections the last few seconds of ticks changed.
    activity: super::activity::Activity,
    /// The last tick's instant.
    last_tick: Mono,
    /// No packet either way for this long: the connection is closed.
    pub idle_timeout: Duration,
}

impl Default for ConnTable {
    fn default() -> Self {
        ConnTable::new(Duration::from_secs(30))
    }
}

impl ConnTable {
    pub fn new(idle_timeout: Duration) -> Self {
        ConnTable {
            conns: HashMap::default(),
            flows: HashMap::default(),
            by_dcid: HashMap::default(),
            by_client: HashMap::default(),
            retired: HashMap::default(),
            stale: Vec::new(),
            cid_len: HashMap::default(),
            next_id: 1,
            dirty: HashSet::default(),
            multipath: HashSet::default(),
            closing: Vec::new(),
            last_fold: Mono::ZERO,
            idle_queue: BinaryHeap::new(),
            unreported: HashSet::default(),
            framed: HashSet::default(),
            activity: Default::default(),
            last_tick: Mono::ZERO,
            idle_timeout,
        }
    }

    pub fn get(&self, id: u64) -> Option<&Conn> {
        self.conns.get(&id).map(|c| &**c)
    }

    pub fn iter(&self) -> impl Iterator<Item = &Conn> {
        self.conns.values().map(|c| &**c)
    }

    /// The open connections with a client packet since `from`, as digests:
    /// from the digests the ticks since then took (`activity`; a
    /// connection's newest is its state now), or from the whole table when
    /// `from` is older than those records.
    pub fn active_since(&self, from: Mono) -> Vec<Digest> {
        let recent = |d: &Digest| d.last.is_some_and(|t| t >= from);
        match self.activity.since(from) {
            Some(records) => {
                let mut seen = HashSet::default();
                records.rev().filter(|d| seen.insert(d.id)).filter(|d| recent(d) && self.open(d)).copied().collect()
            }
            None => self.iter().filter(|c| c.closed.is_none()).map(Conn::digest).filter(recent).collect(),
        }
    }

    /// Whether the connection of a digest is still open. Only the idle
    /// look closes one, a timeout after its last packet: with a client
    /// packet less than that before the last tick it cannot have closed,
    /// and the connection is not read.
    fn open(&self, d: &Digest) -> bool {
        d.last.is_some_and(|t| self.last_tick.since(t) < self.idle_timeout)
            || self.conns.get(&d.id).is_some_and(|c| c.closed.is_none())
    }

    /// The connections with decrypted-frame figures.
    pub fn framed(&self) -> impl Iterator<Item = &Conn> {
        self.framed.iter().filter_map(|id| self.get(*id))
    }

    /// Decrypted-frame figures for the connection of `sample.flow` (offline).
    pub fn frames(&mut self, sample: super::frames::FrameSample) {
        // No packet opened (no secrets: a server that is not Go, e.g. shoes on
        // quinn/rustls, or a handshake before the uprobe): the figures are all
        // zero and prove nothing; kept, they showed as evidence ("client sent
        // 0 B of 0 B allowed").
        if sample.state.opened.iter().all(|&n| n == 0) {
            return;
        }
        if let Some(id) = self.conn_of(&sample.flow)
            && let Some(c) = self.conns.get_mut(&id)
        {
            c.frames = Some(Box::new(sample.state));
            self.framed.insert(id);
        }
    }

    pub fn len(&self) -> usize {
        self.conns.len()
    }

    pub fn is_empty(&self) -> bool {
        self.conns.is_empty()
    }

    /// The open connection whose client (now or on an earlier path) is `addr`.
    pub fn conn_by_client(&self, addr: &std::net::SocketAddr) -> Option<u64> {
        self.by_client.get(addr).copied().filter(|id| self.conns.get(id).is_some_and(|c| c.closed.is_none()))
    }

    /// Whether the server answered `conn` in `[from, to]`, over all its
    /// paths (`Replies`).
    pub fn reply(&self, conn: u64, from: Mono, to: Mono) -> Reply {
        let Some(c) = self.conns.get(&conn) else { return Reply::Unknown };
        Reply::any(
            c.flows.iter().map(|f| self.flows.get(f).map_or(Reply::Unknown, |st| st.counters.replies.within(from, to))),
        )
    }

    /// The connection a flow belongs to.
    pub fn conn_of(&self, flow: &FlowId) -> Option<u64> {
        self.flows.get(flow).map(|f| f.conn)
    }

    fn new_conn(&mut self, flow: FlowId, at: Mono) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        self.unreported.insert(id);
        self.idle_queue.push(Reverse((at, id)));
        self.conns.insert(
            id,
            Box::new(Conn {
                id,
                dcid: None,
                grouping: Grouping::FiveTuple,
                flows: vec![flow],
                first_seen: at,
                last_seen: at,
                c2s: DirCounters::default(),
                s2c: DirCounters::default(),
                opened_reported: false,
                closed: None,
                frames: None,
                folded: Default::default(),
                folded_clients: 0,
                cid_len: None,
                history: Default::default(),
            }),
        );
        id
    }

    /// A header sample: learns CIDs, ties the flow to a connection.
    pub fn sample(&mut self, at: Mono, s: &HeaderSample) {
        // A server's late 1-RTT packet (a retransmitted close) on the path of a
        // closed connection opens nothing: only clients open connections.
        if s.dir == Dir::S2c
            && !self.flows.contains_key(&s.flow)
            && (self.retired.contains_key(&s.flow) || !self.client_has_open_conn(&s.flow))
            && !matches!(Peek::of(&s.bytes), Peek::Long { .. })
        {
            return;
        }
        let peek = Peek::of(&s.bytes);
        if !self.flows.contains_key(&s.flow) {
            // A known DCID at the start of a new client path = a port hop.
            let hop = match (s.dir, &peek) {
                (Dir::C2s, Peek::Short { .. }) => self.match_dcid(&s.bytes[1.min(s.bytes.len())..]),
                (Dir::C2s, Peek::Long { dcid, .. }) => self.by_dcid.get(dcid).copied(),
                _ => None,
            };
            self.attach_flow(s.flow, hop, at);
        }
        let st = self.flows.get_mut(&s.flow).expect("inserted above");
        let conn_id = st.conn;
        if peek.looks_obfuscated() {
            st.obfuscated = true;
        }
        let obfuscated = st.obfuscated;
        let conn_cid_len = self.conns.get(&conn_id).and_then(|c| c.cid_len);
        let mut learned_dcid = None;
        let mut learned_len = None;
        match (&peek, s.dir) {
            // The server's SCID is what clients put in short headers.
            (Peek::Long { scid, .. }, Dir::S2c) if !obfuscated && !scid.is_empty() => {
                self.cid_len.insert(s.flow.server, scid.len());
                learned_len = Some(scid.len());
                learned_dcid = Some(*scid);
            }
            (Peek::Short { .. }, Dir::C2s) if !obfuscated && s.bytes.len() > 1 => {
                let rest = &s.bytes[1..];
                if let Some(len) = conn_cid_len.or_else(|| self.cid_len.get(&s.flow.server).copied()) {
                    learned_len = Some(len);
                    learned_dcid = rest.get(..len).and_then(ConnectionId::new).filter(|c| !c.is_empty());
                } else {
                    // The last few samples only: a client that moved to a new
                    // DCID between two of them spoils the estimate for a while,
                    // not for good.
                    if st.prefixes.len() == PREFIX_MIN {
                        st.prefixes.remove(0);
                    }
                    st.prefixes.push(rest.to_vec());
                    if st.prefixes.len() == PREFIX_MIN {
                        let len = st.prefixes.windows(2).map(|w| common_prefix(&w[0], &w[1])).min().unwrap_or(0);
                        let len = len.min(super::quic::MAX_CID_LEN);
                        if len > 0 {
                            learned_len = Some(len);
                            learned_dcid = rest.get(..len).and_then(ConnectionId::new);
                        }
                    }
                }
            }
            _ => {}
        }
        let Some(c) = self.conns.get_mut(&conn_id) else { return };
        c.last_seen = c.last_seen.max(at);
        if obfuscated {
            c.grouping = Grouping::Obfuscated;
            return;
        }
        if learned_len.is_some() {
            c.cid_len = learned_len;
        }
        if let Some(d) = learned_dcid
            && c.dcid != Some(d)
        {
            // The client retired the old ID: only the current one names the
            // connection (and the index stays one entry per connection).
            if let Some(old) = c.dcid.replace(d)
                && self.by_dcid.get(&old) == Some(&conn_id)
            {
                self.by_dcid.remove(&old);
            }
            c.grouping = Grouping::Dcid;
            self.by_dcid.insert(d, conn_id);
        }
    }

    /// Ties a new flow to a connection: the one its DCID names (`by_dcid`), else
    /// the one of its client address and port, else a new one.
    fn attach_flow(&mut self, flow: FlowId, by_dcid: Option<u64>, at: Mono) -> u64 {
        let open = |id: &u64| self.conns.get(id).is_some_and(|c| c.closed.is_none());
        let existing = by_dcid.filter(open).or_else(|| self.by_client.get(&flow.client).copied().filter(open));
        let conn = match existing {
            Some(id) => {
                if let Some(c) = self.conns.get_mut(&id) {
                    c.flows.push(flow);
                    self.multipath.insert(id);
                }
                id
            }
            None => self.new_conn(flow, at),
        };
        self.by_client.insert(flow.client, conn);
        self.flows.insert(flow, Box::new(FlowState { conn, ..Default::default() }));
        self.dirty.insert(conn);
        conn
    }

    /// The connection whose DCID starts `rest` (a short header after byte 0).
    fn match_dcid(&self, rest: &[u8]) -> Option<u64> {
        self.conns
            .values()
            .filter(|c| c.closed.is_none())
            .find(|c| c.dcid.as_ref().is_some_and(|d| !d.is_empty() && rest.starts_with(d.as_bytes())))
            .map(|c| c.id)
    }

    /// Fresh counters of every flow (cumulative, as the kernel keeps them).
    pub fn poll(&mut self, at: Mono, flows: Vec<(FlowId, FlowCounters)>) {
        let present: HashSet<FlowId> = flows.iter().map(|(f, _)| *f).collect();
        self.retired.retain(|f, _| present.contains(f));
        self.moved(at, flows);
    }

    /// Fresh counters of the flows that moved (the others did not change).
    pub fn moved(&mut self, at: Mono, flows: Vec<(FlowId, FlowCounters)>) {
        for (flow, c) in flows {
            self.counters(at, flow, c);
        }
    }

    /// Whether the flow's client address belongs to an open connection.
    fn client_has_open_conn(&self, flow: &FlowId) -> bool {
        self.by_client.get(&flow.client).is_some_and(|id| self.conns.get(id).is_some_and(|c| c.closed.is_none()))
    }

    /// Fresh counters of one flow (cumulative, as the kernel keeps them).
    pub fn counters(&mut self, at: Mono, flow: FlowId, counters: FlowCounters) {
        // A known flow (nearly every one of a poll): one lookup.
        if let Some(st) = self.flows.get_mut(&flow) {
            let now = since(&counters, st.base.as_deref());
            if st.counters != now {
                st.counters = now;
                self.dirty.insert(st.conn);
            }
            return;
        }
        // Server packets alone on an unknown path (a closed connection's late
        // close, its kernel entry already deleted) are no connection.
        if counters.c2s.total_packets() == 0 && !self.client_has_open_conn(&flow) {
            return;
        }
        let mut base = None;
        if let Some(old) = self.retired.get_mut(&flow) {
            // Nothing new from the client: the closed connection's last
            // figures, or a server's late packets (a retransmitted close, a
            // PTO probe) — only a client opens a connection.
            if old.c2s.total_packets() == counters.c2s.total_packets() {
                *old = counters;
                if self.stale.len() < MAX_STALE {
                    self.stale.push(flow);
                }
                return;
            }
            base = Some(Box::new(old.clone()));
            self.retired.remove(&flow);
        }
        // Counted before any sample reached us.
        let conn = self.attach_flow(flow, None, at);
        let st = self.flows.get_mut(&flow).expect("attached");
        st.counters = since(&counters, base.as_deref());
        st.base = base;
        self.dirty.insert(conn);
    }

    /// Folds the idle old paths of open connections into them: a client that
    /// hops ports every 30 s would otherwise grow its connection's flows (and
    /// the kernel's flow map) for as long as it lives. The flow's figures stay
    /// in the sums; its kernel entry is offered for deletion by the next sweep.
    fn fold_idle_paths(&mut self, now: Mono) {
        let mut idle: Vec<FlowId> = Vec::new();
        for id in &self.multipath {
            let Some(c) = self.conns.get(id).filter(|c| c.closed.is_none()) else { continue };
            let Some((_, old)) = c.flows.split_last() else { continue };
            for f in old {
                let last = self.flows.get(f).and_then(|st| st.counters.c2s.last_any().max(st.counters.s2c.last_any()));
                if last.is_some_and(|t| now.since(t) >= self.idle_timeout) {
                    idle.push(*f);
                }
            }
        }
        for f in idle {
            let Some(st) = self.flows.remove(&f) else { continue };
            let Some(c) = self.conns.get_mut(&st.conn) else { continue };
            self.dirty.insert(c.id);
            let folded = c.folded.get_or_insert_default();
            folded.0.add(&st.counters.c2s);
            folded.1.add(&st.counters.s2c);
            c.flows.retain(|x| *x != f);
            if c.flows.len() < 2 {
                self.multipath.remove(&c.id);
            }
            if !c.flows.iter().any(|x| x.client == f.client) {
                c.folded_clients += 1;
                if self.by_client.get(&f.client) == Some(&c.id) {
                    self.by_client.remove(&f.client);
                }
            }
            let mut total = st.counters.clone();
            if let Some(base) = &st.base {
                total.c2s.add(&base.c2s);
                total.s2c.add(&base.s2c);
            }
            self.retired.insert(f, total);
            if self.stale.len() < MAX_STALE {
                self.stale.push(f);
            }
        }
    }

    /// Recomputes the sums of the connections whose flows changed, closes
    /// idle connections; returns changes.
    pub fn tick(&mut self, now: Mono) -> Vec<ConnChange> {
        // Paths go idle over tens of seconds: a look a second is enough.
        let idle_look = now.since(self.last_fold) >= HISTORY_STEP;
        if idle_look {
            self.last_fold = now;
            self.fold_idle_paths(now);
        }
        self.last_tick = now;
        let dirty = std::mem::take(&mut self.dirty);
        let mut changed = Vec::with_capacity(dirty.len());
        for &id in &dirty {
            let Some(c) = self.conns.get_mut(&id) else { continue };
            let (mut c2s, mut s2c) = c.folded.as_deref().copied().unwrap_or_default();
            for f in &c.flows {
                if let Some(st) = self.flows.get(f) {
                    c2s.add(&st.counters.c2s);
                    s2c.add(&st.counters.s2c);
                }
            }
            c.set_sums(now, c2s, s2c);
            changed.push(c.digest());
        }
        self.activity.record(now, changed);
        let mut out = Vec::new();
        // Report once the grouping is settled (a DCID, or obfuscation seen),
        // or after two seconds: a port hop must not look new.
        let mut reported = Vec::new();
        for id in &self.unreported {
            let Some(c) = self.conns.get_mut(id) else { continue };
            if c.closed.is_none() && (c.grouping != Grouping::FiveTuple || now.since(c.first_seen) >= OPEN_AFTER) {
                c.opened_reported = true;
                reported.push(*id);
            }
        }
        // In the order they came (the table's order is random).
        reported.sort_unstable();
        for id in reported {
            self.unreported.remove(&id);
            out.push(ConnChange::Opened(id));
        }
        // Idle connections close to the second (the timeout is tens of
        // seconds): one look a second over the table, not one a tick.
        if idle_look {
            while let Some(&Reverse((seen, id))) = self.idle_queue.peek()
                && now.since(seen) >= self.idle_timeout
            {
                self.idle_queue.pop();
                // Gone (swept) or closed already: its entry just goes.
                let Some(c) = self.conns.get_mut(&id).filter(|c| c.closed.is_none()) else { continue };
                if now.since(c.last_seen) < self.idle_timeout {
                    // A packet since it was put here: back, by that packet.
                    self.idle_queue.push(Reverse((c.last_seen, id)));
                    continue;
                }
                c.closed = Some(now);
                self.closing.push(c.id);
                if c.opened_reported {
                    out.push(ConnChange::Closed(c.id));
                }
            }
        }
        out
    }

    /// Forgets closed connections (after their events were emitted). Returns
    /// their flows, and retired flows polled unchanged since: the live source
    /// deletes them from the kernel map and says so with [`Self::forgotten`].
    pub fn sweep(&mut self) -> Vec<FlowId> {
        let mut out = std::mem::take(&mut self.stale);
        for id in std::mem::take(&mut self.closing) {
            let Some(c) = self.conns.remove(&id) else { continue };
            self.multipath.remove(&id);
            self.dirty.remove(&id);
            self.unreported.remove(&id);
            self.framed.remove(&id);
            for flow in &c.flows {
                if let Some(st) = self.flows.remove(flow) {
                    let mut total = st.counters.clone();
                    if let Some(base) = &st.base {
                        total.c2s.add(&base.c2s);
                        total.s2c.add(&base.s2c);
                    }
                    self.retired.insert(*flow, total);
                    out.push(*flow);
                }
                if self.by_client.get(&flow.client) == Some(&id) {
                    self.by_client.remove(&flow.client);
                }
            }
            if let Some(d) = c.dcid
                && self.by_dcid.get(&d) == Some(&id)
            {
                self.by_dcid.remove(&d);
            }
        }
        out
    }

    /// These flows are gone from the kernel map: a packet on one of them later
    /// starts from zero, so their last figures need not be remembered.
    pub fn forgotten(&mut self, flows: &[FlowId]) {
        for f in flows {
            self.retired.remove(f);
        }
    }

    /// Client 5-tuples of the connections in the table.
    pub fn flows_len(&self) -> usize {
        self.flows.len()
    }

    /// Flows whose final figures are remembered (for the soak test and metrics).
    pub fn retired_len(&self) -> usize {
        self.retired.len()
    }
}

/// `now - base`, per class (times are kept from `now`).
fn since(now: &FlowCounters, base: Option<&FlowCounters>) -> FlowCounters {
    let Some(base) = base else { return now.clone() };
    let d = |n: &DirCounters, b: &DirCounters| {
        let mut out = *n;
        for i in 0..3 {
            out.packets[i] = n.packets[i].saturating_sub(b.packets[i]);
            out.bytes[i] = n.bytes[i].saturating_sub(b.bytes[i]);
        }
        out
    };
    FlowCounters { c2s: d(&now.c2s, &base.c2s), s2c: d(&now.s2c, &base.s2c), replies: now.replies }
}

fn rates(old: &Point, new: &Point, secs: f64) -> Rates {
    let per = |new: u64, old: u64| new.saturating_sub(old) as f64 / secs.max(1e-3);
    let mut r = Rates::default();
    for i in 0..3 {
        r.c2s_pps[i] = per(new.n[0][i], old.n[0][i]);
        r.c2s_bps[i] = per(new.n[1][i], old.n[1][i]);
        r.s2c_pps[i] = per(new.n[2][i], old.n[2][i]);
        r.s2c_bps[i] = per(new.n[3][i], old.n[3][i]);
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(secs: f64) -> Mono {
        Mono::from_secs_f64(secs)
    }

    fn flow(client_port: u16, server_port: u16) -> FlowId {
        FlowId {
            client: format!("10.0.0.2:{client_port}").parse().unwrap(),
            server: format!("10.0.0.1:{server_port}").parse().unwrap(),
        }
    }

    /// A short header with this DCID and a random-looking packet number.
    fn short(dcid: &[u8], pn: u8) -> Vec<u8> {
        let mut b = vec![0x41];
        b.extend_from_slice(dcid);
        b.extend_from_slice(&[pn, pn.wrapping_mul(31), 0x55 ^ pn, 7]);
        b
    }

    /// A server Handshake packet announcing `scid`.
    fn server_long(scid: &[u8]) -> Vec<u8> {
        let mut b = vec![0xe0, 0, 0, 0, 1, 0, scid.len() as u8];
        b.extend_from_slice(scid);
        b.extend_from_slice(&[0x40, 0x20, 1, 2, 3]);
        b
    }

    fn sample(flow: FlowId, dir: Dir, bytes: Vec<u8>) -> HeaderSample {
        HeaderSample { flow, dir, payload_len: bytes.len() as u32, segs: 1, bytes: bytes.into() }
    }

    /// A repeatable pseudo-random sequence (xorshift64) for the randomized tests.
    fn xorshift(mut state: u64) -> impl FnMut() -> u64 {
        move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        }
    }

    /// Counters of `packets` full-size client packets of 1,000 bytes, the last at `at`.
    fn bulk(packets: u64, at: f64) -> FlowCounters {
        let mut c = FlowCounters::default();
        c.c2s.packets[2] = packets;
        c.c2s.bytes[2] = packets * 1000;
        c.c2s.last[2] = Some(s(at));
        c.c2s.first = Some(s(0.0));
        c
    }

    #[test]
    fn rates_follow_the_polls_and_fall_to_zero_when_a_connection_goes_quiet() {
        let mut t = ConnTable::default();
        let a = flow(50000, 443);
        // 100 packets a second for 10 s, polled every 500 ms.
        for i in 0..=20 {
            let at = i as f64 * 0.5;
            t.counters(s(at), a, bulk(50 * i, at));
            t.tick(s(at));
        }
        let c = t.get(t.conn_of(&a).unwrap()).unwrap();
        let r = c.rates(s(10.0));
        assert!((r.c2s_pps[2] - 100.0).abs() <= 10.0, "{r:?}");
        assert!((r.c2s_bps[2] - 100_000.0).abs() <= 10_000.0, "{r:?}");
        // Then nothing new: polls bring the same counters (no work for the
        // tick), and the rate falls as time passes.
        for i in 21..=40 {
            let at = i as f64 * 0.5;
            t.counters(s(at), a, bulk(1000, 10.0));
            assert!(t.dirty.is_empty(), "unchanged counters make nothing to recount");
            t.tick(s(at));
        }
        let c = t.get(t.conn_of(&a).unwrap()).unwrap();
        assert!(c.rates(s(12.5)).c2s_pps[2] > 0.0);
        assert_eq!(c.rates(s(16.0)).c2s_pps[2], 0.0);
        assert!(c.history.len() <= 8, "bounded: {}", c.history.len());
    }

    #[test]
    fn dcid_learned_from_the_handshake_keeps_a_port_hop_in_one_connection() {
        let mut t = ConnTable::default();
        let dcid = [0xde, 0xad, 0xbe, 0xef];
        let a = flow(50000, 443);
        t.sample(s(0.0), &sample(a, Dir::S2c, server_long(&dcid)));
        t.sample(s(0.1), &sample(a, Dir::C2s, short(&dcid, 1)));
        let id = t.conn_of(&a).unwrap();
        assert_eq!(t.get(id).unwrap().dcid.unwrap().as_bytes(), &dcid);
        assert_eq!(t.get(id).unwrap().grouping, Grouping::Dcid);

        // The client hops: new source port, new server port of the range.
        let b = flow(50123, 20005);
        t.sample(s(30.0), &sample(b, Dir::C2s, short(&dcid, 77)));
        assert_eq!(t.conn_of(&b), Some(id));
        assert_eq!(t.get(id).unwrap().hops(), 1);
        assert_eq!(t.len(), 1);
        assert_eq!(t.get(id).unwrap().server_ports().into_iter().collect::<Vec<_>>(), vec![443, 20005]);
    }

    #[test]
    fn dcid_length_is_estimated_when_we_missed_the_handshake() {
        let mut t = ConnTable::default();
        let dcid = [1, 2, 3, 4, 5, 6, 7, 8];
        let a = flow(40000, 443);
        for pn in 1..=4 {
            t.sample(s(pn as f64), &sample(a, Dir::C2s, short(&dcid, pn * 17)));
        }
        let id = t.conn_of(&a).unwrap();
        assert_eq!(t.get(id).unwrap().dcid.unwrap().as_bytes(), &dcid);
        let b = flow(40001, 443);
        t.sample(s(5.0), &sample(b, Dir::C2s, short(&dcid, 99)));
        assert_eq!(t.conn_of(&b), Some(id), "rebinding joins by DCID");
    }

    #[test]
    fn a_client_that_moves_to_a_new_dcid_after_the_handshake_still_hops_into_its_connection() {
        // quic-go moves to a fresh server-issued DCID right after the handshake.
        // With DNAT before TC (the test lab's port hopping), the server's
        // packets show the hop port the client dialled and the client's the
        // real one: the CID length learned from the handshake must serve both.
        let mut t = ConnTable::default();
        let (first, next) = ([0x5f, 0x5f, 0x08, 0x34], [0xe7, 0xf8, 0x67, 0x02]);
        let c2s = flow(36536, 20000);
        let s2c = flow(36536, 20010);
        t.sample(s(0.0), &sample(c2s, Dir::C2s, vec![0xc0, 0, 0, 0, 1, 8, 1, 2, 3, 4, 5, 6, 7, 8, 0]));
        t.sample(s(0.01), &sample(s2c, Dir::S2c, server_long(&first)));
        let id = t.conn_of(&c2s).unwrap();
        assert_eq!(t.conn_of(&s2c), Some(id));
        t.sample(s(0.02), &sample(c2s, Dir::C2s, short(&first, 1)));
        t.sample(s(0.03), &sample(c2s, Dir::C2s, short(&next, 2)));
        assert_eq!(t.get(id).unwrap().dcid.unwrap().as_bytes(), &next);
        // The hop five seconds later carries the new ID.
        let hop = flow(47895, 20000);
        t.sample(s(5.0), &sample(hop, Dir::C2s, short(&next, 3)));
        assert_eq!(t.conn_of(&hop), Some(id));
        assert_eq!(t.len(), 1);
        assert_eq!(t.by_dcid.len(), 1, "the retired ID names nothing");
    }

    #[test]
    fn a_dcid_change_between_prefix_samples_delays_the_estimate_but_does_not_spoil_it() {
        let mut t = ConnTable::default();
        let (old, new) = ([1u8, 2, 3, 4, 5, 6, 7, 8], [9u8, 10, 11, 12, 13, 14, 15, 16]);
        let a = flow(40000, 443);
        t.sample(s(0.0), &sample(a, Dir::C2s, short(&old, 17)));
        for pn in 1..=3 {
            t.sample(s(pn as f64), &sample(a, Dir::C2s, short(&new, pn * 29)));
        }
        let id = t.conn_of(&a).unwrap();
        assert_eq!(t.get(id).unwrap().dcid.unwrap().as_bytes(), &new);
        // The length is now the connection's: a later move is read at once.
        let newer = [0xaa; 8];
        t.sample(s(4.0), &sample(a, Dir::C2s, short(&newer, 5)));
        assert_eq!(t.get(id).unwrap().dcid.unwrap().as_bytes(), &newer);
    }

    #[test]
    fn server_packets_join_by_client_address_even_from_a_hop_port() {
        let mut t = ConnTable::default();
        let dcid = [7, 7, 7, 7];
        let c2s = flow(5000, 443);
        t.sample(s(0.0), &sample(c2s, Dir::S2c, server_long(&dcid)));
        t.sample(s(0.1), &sample(c2s, Dir::C2s, short(&dcid, 1)));
        // Replies leave through reverse NAT: same client, the hop port as source.
        let s2c = flow(5000, 20003);
        t.sample(s(0.2), &sample(s2c, Dir::S2c, vec![0x40, 1, 2, 3]));
        assert_eq!(t.conn_of(&s2c), t.conn_of(&c2s));
        assert_eq!(t.len(), 1);
        assert_eq!(t.get(1).unwrap().hops(), 0, "same client address: not a hop");
    }

    #[test]
    fn a_closed_connection_is_not_resurrected_by_later_polls_of_its_flow() {
        let mut t = ConnTable::new(Duration::from_secs(2));
        let a = flow(9, 443);
        let dc = |pk: u64| DirCounters {
            packets: [pk, 0, 0],
            bytes: [pk * 50, 0, 0],
            last: [Some(s(1.0)), None, None],
            first: Some(s(0.0)),
        };
        t.poll(s(1.0), vec![(a, FlowCounters { c2s: dc(10), s2c: dc(10), ..Default::default() })]);
        t.tick(s(1.0));
        assert_eq!(t.tick(s(3.5)), vec![ConnChange::Opened(1), ConnChange::Closed(1)]);
        t.sweep();
        // The kernel's LRU map still holds the flow with the same figures.
        t.poll(s(4.0), vec![(a, FlowCounters { c2s: dc(10), s2c: dc(10), ..Default::default() })]);
        assert!(t.is_empty());
        // The server's late packets (a retransmitted close) open nothing either.
        t.sample(s(4.2), &sample(a, Dir::S2c, vec![0x40, 1, 2, 3]));
        t.poll(s(4.5), vec![(a, FlowCounters { c2s: dc(10), s2c: dc(12), ..Default::default() })]);
        t.tick(s(4.5));
        assert!(t.is_empty());
        // A new connection on the same 5-tuple counts from where the old one ended.
        t.poll(s(5.0), vec![(a, FlowCounters { c2s: dc(15), s2c: dc(14), ..Default::default() })]);
        t.tick(s(5.0));
        let c = t.iter().next().unwrap();
        assert_eq!((c.c2s.total_packets(), c.s2c.total_packets()), (5, 2));
    }

    #[test]
    fn two_clients_are_two_connections() {
        let mut t = ConnTable::default();
        for (port, dcid) in [(1000u16, [9u8, 9, 9, 9]), (1001, [8, 8, 8, 8])] {
            let f = flow(port, 443);
            t.sample(s(0.0), &sample(f, Dir::S2c, server_long(&dcid)));
            t.sample(s(0.1), &sample(f, Dir::C2s, short(&dcid, 3)));
        }
        assert_eq!(t.len(), 2);
        assert_ne!(t.conn_of(&flow(1000, 443)), t.conn_of(&flow(1001, 443)));
    }

    #[test]
    fn obfuscated_flows_are_grouped_by_five_tuple_and_marked() {
        let mut t = ConnTable::default();
        let a = flow(3000, 443);
        // Salamander: random bytes, here a long header with a random version.
        t.sample(s(0.0), &sample(a, Dir::C2s, vec![0xc3, 0x91, 0x22, 0x7a, 0x05, 4, 1, 2, 3, 4, 0]));
        let id = t.conn_of(&a).unwrap();
        assert_eq!(t.get(id).unwrap().grouping, Grouping::Obfuscated);
        // Another 5-tuple whose bytes happen to start like that is not merged.
        let b = flow(3001, 443);
        t.sample(s(1.0), &sample(b, Dir::C2s, vec![0x41, 1, 2, 3, 4, 5]));
        assert_ne!(t.conn_of(&b), Some(id));
    }

    #[test]
    fn counters_sum_over_hops_and_idle_connections_close() {
        let mut t = ConnTable::new(Duration::from_secs(30));
        let dcid = [5, 5, 5, 5];
        let (a, b) = (flow(1, 443), flow(2, 443));
        t.sample(s(0.0), &sample(a, Dir::S2c, server_long(&dcid)));
        t.sample(s(0.0), &sample(a, Dir::C2s, short(&dcid, 1)));
        t.sample(s(10.0), &sample(b, Dir::C2s, short(&dcid, 2)));
        let dc = |pk: u64, at: f64| DirCounters {
            packets: [0, 0, pk],
            bytes: [0, 0, pk * 1200],
            last: [None, None, Some(s(at))],
            first: Some(s(0.0)),
        };
        t.counters(s(10.0), a, FlowCounters { c2s: dc(100, 9.0), s2c: dc(10, 9.0), ..Default::default() });
        t.counters(s(10.0), b, FlowCounters { c2s: dc(50, 10.0), s2c: dc(5, 10.0), ..Default::default() });
        assert_eq!(t.tick(s(10.0)), vec![ConnChange::Opened(1)]);
        let c = t.get(1).unwrap();
        assert_eq!(c.c2s.total_packets(), 150);
        assert_eq!(c.c2s.total_bytes(), 150 * 1200);
        assert!(c.alive(s(12.0), Duration::from_secs(5)));
        assert!(t.tick(s(39.0)).is_empty());
        assert_eq!(t.tick(s(40.0)), vec![ConnChange::Closed(1)]);
        t.sweep();
        assert!(t.is_empty());
    }

    /// The idle look pops connections from a queue ordered by their last
    /// packet when queued (and puts back those active since): it closes
    /// exactly the connections a look over the whole table would, at the
    /// same ticks, whatever their activity.
    #[test]
    fn idle_connections_close_when_a_look_over_the_whole_table_would_close_them() {
        let timeout = 5.0;
        let mut t = ConnTable::new(Duration::from_secs_f64(timeout));
        let mut next = xorshift(0x2545_f491_4f6c_dd1du64);
        // Flow i: packets so far and its last packet; None once closed.
        let mut flows: Vec<Option<(u64, f64)>> = vec![None; 60];
        let mut closed = 0;
        for sec in 0..80u32 {
            let now = sec as f64;
            for (i, f) in flows.iter_mut().enumerate() {
                // Flows start staggered; each is active at its own rate.
                let starts = i as u32 / 2 == sec;
                let active = f.is_some() && next().is_multiple_of(i as u64 % 7 + 2);
                if starts || active {
                    let (n, _) = f.unwrap_or((0, 0.0));
                    let last = now - (next() % 900) as f64 / 1000.0;
                    *f = Some((n + 1, last));
                    t.counters(s(now), flow(1000 + i as u16, 443), bulk(n + 1, last));
                }
            }
            let mut expected: Vec<u64> = flows
                .iter()
                .enumerate()
                .filter(|(_, f)| f.is_some_and(|(_, last)| now - last >= timeout))
                .map(|(i, _)| t.conn_of(&flow(1000 + i as u16, 443)).expect("open"))
                .collect();
            expected.sort_unstable();
            let mut got: Vec<u64> = t
                .tick(s(now))
                .into_iter()
                .filter_map(|c| match c {
                    ConnChange::Closed(id) => Some(id),
                    ConnChange::Opened(_) => None,
                })
                .collect();
            got.sort_unstable();
            assert_eq!(got, expected, "at {now} s");
            closed += got.len();
            for f in flows.iter_mut() {
                if f.is_some_and(|(_, last)| now - last >= timeout) {
                    *f = None;
                }
            }
            t.sweep();
        }
        assert!(closed > 20, "the run closes connections: {closed}");
    }

    /// The connections active since an instant come from the digests the
    /// ticks took, newest first, without reading the table: the same ones,
    /// with the same digests, as a look over the whole table, whatever
    /// their activity, closes (an idle timeout shorter than the records)
    /// and port hops (a connection on two server ports).
    #[test]
    fn active_connections_from_the_digests_are_those_a_look_over_the_whole_table_finds() {
        let timeout = 3.0;
        let mut t = ConnTable::new(Duration::from_secs_f64(timeout));
        let mut next = xorshift(0x9e37_79b9_7f4a_7c15u64);
        let whole = |t: &ConnTable, from: Mono| -> Vec<Digest> {
            let mut v: Vec<Digest> = t
                .iter()
                .filter(|c| c.closed.is_none() && c.c2s.last_any().is_some_and(|l| l >= from))
                .map(Conn::digest)
                .collect();
            v.sort_unstable_by_key(|d| d.id);
            v
        };
        let dcid = [7, 7, 7, 7];
        let mut packets = vec![0u64; 40];
        let (mut found, mut multiport, mut closed) = (0, 0, 0);
        for step in 0..200u32 {
            let now = f64::from(step) * 0.2;
            for (i, n) in packets.iter_mut().enumerate() {
                // Each flow at its own rate; half of them to a second server port.
                if next().is_multiple_of(i as u64 % 9 + 2) && (i as u32) < step {
                    *n += 1;
                    let last = now - (next() % 150) as f64 / 1000.0;
                    t.counters(s(now), flow(2000 + i as u16, 443 + (i % 2) as u16), bulk(*n, last));
                }
            }
            // One client hops between two server ports every few seconds.
            if step % 10 == 0 {
                let f = flow(3000 + step as u16, 443 + (step / 10 % 2) as u16);
                if step == 0 {
                    t.sample(s(now), &sample(f, Dir::S2c, server_long(&dcid)));
                }
                t.sample(s(now), &sample(f, Dir::C2s, short(&dcid, step as u8)));
                t.counters(s(now), f, bulk(u64::from(step) + 1, now));
            }
            closed += t.tick(s(now)).iter().filter(|c| matches!(c, ConnChange::Closed(_))).count();
            for back in 0..30u32 {
                let from = s((now - f64::from(back) * 0.25).max(0.0));
                let mut got = t.active_since(from);
                got.sort_unstable_by_key(|d| d.id);
                let want = whole(&t, from);
                assert_eq!(got, want, "at {now} s, since {from:?}");
                found += got.len();
                multiport += got.iter().filter(|d| d.port == 0).count();
            }
            t.sweep();
        }
        assert!(
            found > 10_000 && multiport > 0 && closed > 20,
            "{found} found, {multiport} on two ports, {closed} closed"
        );
    }

    #[test]
    fn swept_flows_are_offered_for_deletion_and_forgotten_once_deleted() {
        let mut t = ConnTable::new(Duration::from_secs(2));
        let a = flow(9, 443);
        let dc = DirCounters { packets: [3, 0, 0], bytes: [150, 0, 0], last: [Some(s(1.0)), None, None], first: None };
        t.poll(s(1.0), vec![(a, FlowCounters { c2s: dc, s2c: dc, ..Default::default() })]);
        t.tick(s(1.0));
        t.tick(s(3.5));
        assert_eq!(t.sweep(), vec![a]);
        assert_eq!(t.retired_len(), 1);
        // The source could not delete it yet: a poll showing it unchanged offers it again.
        t.poll(s(4.0), vec![(a, FlowCounters { c2s: dc, s2c: dc, ..Default::default() })]);
        assert_eq!(t.sweep(), vec![a]);
        t.forgotten(&[a]);
        assert_eq!((t.retired_len(), t.flows_len(), t.len()), (0, 0, 0));
        assert!(t.sweep().is_empty());
    }

    #[test]
    fn a_client_hopping_ports_for_hours_keeps_its_flows_bounded_and_its_sums() {
        let mut t = ConnTable::new(Duration::from_secs(30));
        let dcid = [4, 3, 2, 1];
        t.sample(s(0.0), &sample(flow(1, 443), Dir::S2c, server_long(&dcid)));
        let dc = |at: f64| DirCounters {
            packets: [0, 0, 10],
            bytes: [0, 0, 12_000],
            last: [None, None, Some(s(at))],
            first: Some(s(at)),
        };
        // A hop every 30 s for two hours: each path carries 10 packets each way.
        let hops = 240u16;
        for h in 0..hops {
            let at = f64::from(h) * 30.0;
            let f = flow(1 + h, 443);
            t.sample(s(at), &sample(f, Dir::C2s, short(&dcid, h as u8)));
            t.counters(s(at), f, FlowCounters { c2s: dc(at), s2c: dc(at), ..Default::default() });
            t.tick(s(at + 1.0));
            let swept = t.sweep();
            t.forgotten(&swept);
        }
        assert_eq!(t.len(), 1);
        assert!(t.flows_len() <= 3, "{} flows kept", t.flows_len());
        assert_eq!(t.retired_len(), 0);
        let c = t.iter().next().unwrap();
        assert_eq!(c.c2s.total_packets(), 10 * u64::from(hops));
        assert_eq!(c.hops(), usize::from(hops) - 1);
    }
}
