//! Which QUIC connection fed each target socket: the link the detector needs to
//! flag the right users on a node where many clients share one server (pure;
//! time is an input).
//!
//! Evidence, gathered over each target socket's whole life and kept once clear:
//! - **connect**: a proxy dials the target right after the request arrives on
//!   the connection that opened the stream. Connections that sent nothing in
//!   the moments before the connect are ruled out; when one alone is left, that
//!   is the link.
//! - **bytes**: a stream's bytes reach its target only after they arrived on
//!   the connection, and what a connection carries goes into its targets
//!   (plus a few per cent of framing and at most its receive window of unread
//!   bytes). Both series are known at the kernel's timestamps (byte marks), so
//!   connections that cannot have carried a target's bytes — together with
//!   the targets already tied to them — are ruled out, and a connection whose
//!   bytes only some targets can explain gets them (`fit.rs`, `solve.rs`).
//! - **reply**: a Hysteria2 server answers each request once its target is
//!   dialled; connections the server did not answer right after the
//!   target's connect completed are ruled out (`reply.rs`), once the
//!   process showed it answers.
//! - **api**: the server's own table (the Clash API of sing-box and mihomo)
//!   names the client of each relayed connection: exact.
//!
//! A target that no evidence ties clearly to one connection stays
//! *unattributed*: it counts for no connection, and its candidates are listed.
//! A link never moves once made (only exact evidence overrides it), and a
//! target counts for one connection at most.

pub mod api;
mod connect;
mod fit;
mod floors;
mod reply;
pub mod series;
mod solve;
#[cfg(test)]
mod tests;

use std::collections::{BTreeSet, HashMap};
use std::time::Duration;

use serde::Serialize;

use super::activity::Digest;
use super::conns::{Conn, ConnTable};
use super::flows::{Dir, FlowId, Reply};
use super::observation::ByteMark;
use super::sockets::SocketTable;
use super::time::Mono;
use super::verdict::Verdict;
use api::RelayRecord;
use series::ByteSeries;

pub use floors::Shared;

/// The tables kept here are keyed by cookies and connection ids: foldhash,
/// not SipHash (its hashing showed in profiles of a node's ticks).
pub(crate) type Map<K, V> = foldhash::HashMap<K, V>;

/// Points kept per connection series (~512 MiB of client bytes at 128 KiB a mark).
const CONN_POINTS: usize = 4096;
/// Points kept per target series.
const TARGET_POINTS: usize = 512;
/// Connection series older than this are dropped (no target looks further back).
const CONN_HORIZON: Duration = Duration::from_secs(30);
/// A closed target linked to a connection still explains its bytes for this
/// long (the horizon); an unlinked one is forgotten when it closes.
const CLOSED_KEEP: Duration = CONN_HORIZON;
/// The deduction runs at least this often (and whenever marks arrived).
const SOLVE_EVERY: Duration = Duration::from_secs(1);
/// Beyond this many targets followed, the passes over all of them (the
/// deduction, forgetting closed sockets) run once per `SOLVE_EVERY`, not at
/// every tick: their cost grows with the targets (3,000 at 500 new
/// connections a second, most of them closed ones kept for the horizon), and
/// a link made a second later changes nothing a stall timeout of seconds
/// decides. What must be taken at the first poll after a connect (who was
/// active, who was answered) still is, at every tick.
const BUSY_TARGETS: usize = 256;
/// A group of targets whose search ran out of budget is searched again
/// after this (new marks may prune it by then; a changed group at once).
const SEARCH_BACKOFF: Duration = Duration::from_secs(2);
/// Flow marks waiting for their flow's connection, at most (flows) and for how long.
const MAX_ORPHAN_FLOWS: usize = 1024;
const ORPHAN_FOR: Duration = Duration::from_secs(5);

#[derive(Clone, Copy, Debug)]
pub struct Config {
    /// How long before a target's connect the opening request may have arrived.
    pub connect_window: Duration,
    /// Connections kept as candidates of one target at most.
    pub max_candidates: usize,
    /// Byte marks a target needs before its bytes alone tie it.
    pub min_marks: usize,
    /// The connection window: unread bytes a connection can hold at most.
    pub conn_window: u64,
    /// The stream window: unread bytes one stream can hold at most.
    pub stream_window: u64,
    /// Nodes one group's search may visit (`solve.rs`).
    pub search_nodes: usize,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            connect_window: Duration::from_millis(300),
            max_candidates: 64,
            min_marks: 4,
            conn_window: 20 << 20,
            stream_window: 8 << 20,
            search_nodes: 50_000,
        }
    }
}

/// What ties a target to its connection.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Evidence {
    /// The server's own table says so.
    pub api: bool,
    /// The only connection that sent anything just before the connect.
    pub connect: bool,
    /// Its bytes moved with this connection's and no other's.
    pub bytes: bool,
    /// Others active at the connect got no answer from the server right
    /// after it completed: ruled out (the connect or the bytes decided
    /// among those left).
    pub reply: bool,
    /// Neither its connect nor its bytes were seen (it predates us, or its
    /// process was found after it dialled), and its process serves this one
    /// QUIC connection alone.
    pub only: bool,
}

impl Evidence {
    /// Whether the link stands for good (else the bytes check it again as
    /// they come): the server's table, the bytes, or no other possible.
    pub fn settled(&self) -> bool {
        self.api || self.bytes || self.only
    }

    /// The names of the kinds present, strongest first (`api`, `connect`, `reply`, `bytes`, `only`).
    pub fn names(&self) -> Vec<&'static str> {
        [
            (self.api, "api"),
            (self.connect, "connect"),
            (self.reply, "reply"),
            (self.bytes, "bytes"),
            (self.only, "only"),
        ]
        .into_iter()
        .filter_map(|(on, n)| on.then_some(n))
        .collect()
    }
}

/// A target's connection, and why.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Link {
    pub conn: u64,
    pub evidence: Evidence,
    /// 1 when exact (api); else 1 / the connections it could have had.
    pub score: f64,
    pub since: Mono,
}

/// What is known of one target socket.
#[derive(Clone, Debug)]
pub struct Target {
    pub pid: u32,
    /// Its connect (CLOSE → SYN_SENT), when seen.
    pub connect: Option<Mono>,
    /// When its connect completed (SYN_SENT → ESTABLISHED), when seen.
    established: Option<Mono>,
    /// Whether the server answered each of `at_connect` right after
    /// `established` (None until a flow poll after the window).
    replies: Option<Vec<(u64, Reply)>>,
    /// Since when its bytes count (its connect, else just before its first mark).
    start: Mono,
    /// Its send count then.
    start_bytes: u64,
    series: ByteSeries,
    /// Connections that may have sent the opening request (None until the
    /// first flow poll after the connect).
    at_connect: Option<Vec<u64>>,
    /// More connections were active at the connect than are kept.
    crowded: bool,
    pub link: Option<Link>,
    /// The connections it could have had at the last deduction (unattributed).
    pub candidates: Vec<u64>,
    /// The server's table says it belongs to another inbound (not QUIC).
    pub other_inbound: bool,
    /// When its socket closed (its bytes still explain its connection's).
    closed: Option<Mono>,
    /// When it was first heard of.
    born: Mono,
}

impl Target {
    fn new(pid: u32, born: Mono) -> Target {
        Target {
            pid,
            connect: None,
            established: None,
            replies: None,
            start: born,
            start_bytes: 0,
            series: ByteSeries::new(TARGET_POINTS),
            at_connect: None,
            crowded: false,
            link: None,
            candidates: Vec::new(),
            other_inbound: false,
            closed: None,
            born,
        }
    }

    /// Connections that could have sent the opening request, if the connect was seen.
    pub fn at_connect(&self) -> Option<&[u64]> {
        self.at_connect.as_deref().filter(|_| !self.crowded)
    }

    pub fn marks(&self) -> usize {
        self.series.len()
    }

    /// The connections an unattributed target may belong to.
    pub fn maybe(&self) -> &[u64] {
        &self.candidates
    }
}

/// A connection's client bytes, from the byte marks of its flows.
#[derive(Clone, Debug)]
struct ConnSeries {
    series: ByteSeries,
    /// The last count of each (flow, CPU): one CPU (0) per flow since the
    /// kernel's flow map is shared; recordings of the per-CPU map have several.
    per_cpu: Map<(FlowId, u32), u64>,
    total: u64,
    last_mark: Mono,
    /// Since when the byte rules count its bytes: its first packet when that
    /// came after we attached, else our first tick (a connection older than
    /// hystall: every target that takes its bytes from then on makes marks
    /// from then on), the horizon back at most. None before the first tick.
    known_from: Option<Mono>,
    /// Since when every target it ever fed is known (its first packet when
    /// that came after we attached, else a horizon back once we have
    /// watched that long): `window_used_up` counts what its linked targets
    /// leave unexplained, and an older connection's may predate us.
    whole_from: Option<Mono>,
    /// Client bytes in packets that are not full-size (datagrams, mostly):
    /// not explained by targets.
    datagrams: u64,
}

impl ConnSeries {
    fn new() -> ConnSeries {
        ConnSeries {
            series: ByteSeries::new(CONN_POINTS),
            per_cpu: Map::default(),
            total: 0,
            last_mark: Mono::ZERO,
            known_from: None,
            whole_from: None,
            datagrams: 0,
        }
    }

    fn mark(&mut self, flow: FlowId, cpu: u32, at: Mono, bytes: u64) {
        // A (flow, CPU) seen for the first time: one mark's worth (its count
        // may include bytes from before we attached).
        let prev = self.per_cpu.insert((flow, cpu), bytes);
        let step = match prev {
            Some(p) => bytes.saturating_sub(p),
            None => bytes.min(hystall_common::MARK_BYTES),
        };
        if self.series.is_empty() {
            self.series.push(Mono(at.0.saturating_sub(1)), self.total);
        }
        self.total += step;
        self.series.push(at, self.total);
        self.last_mark = self.last_mark.max(at);
    }
}

/// Flow marks waiting for their flow's connection: when the first came, and
/// each (CPU, time, count).
type Orphans = (Mono, Vec<(u32, Mono, u64)>);

#[derive(Default)]
pub struct Attribution {
    pub cfg: Config,
    conns: Map<u64, ConnSeries>,
    targets: Map<u64, Target>,
    /// Targets linked to each connection.
    by_conn: Map<u64, BTreeSet<u64>>,
    orphans: Map<FlowId, Orphans>,
    /// The last flow poll (the connections' last-packet times are as of then).
    last_poll: Option<Mono>,
    /// The server's relay table, when an API gives it (replaced each time).
    relays: Option<Vec<RelayRecord>>,
    relays_new: bool,
    /// The first tick (connections first seen after it are seen whole).
    started: Option<Mono>,
    /// Marks or connects since the last deduction.
    dirty: bool,
    last_solve: Mono,
    /// The last pass over every target (`BUSY_TARGETS`).
    last_pass: Option<Mono>,
    /// What each process's targets showed of its answers (`reply.rs`).
    gates: Map<u32, reply::Gate>,
    /// Groups whose search ran out of budget, and when (`SEARCH_BACKOFF`).
    aborted: Map<Vec<u64>, Mono>,
    /// Group searches run (for the tests of the back-off).
    searches: u64,
    /// Stalled targets connections hold whatever the split (`floors.rs`).
    floors: floors::Floors,
    /// The stalled open targets at the last pass (counted by the floors).
    stalled: std::collections::HashSet<u64>,
    /// Groups whose floors were looked for, and when: looked for again
    /// after `SEARCH_BACKOFF`, or at once when the stalled targets change
    /// (at node scale marks make every tick a deduction).
    floored: Map<Vec<u64>, Mono>,
}

impl Attribution {
    pub fn new(cfg: Config) -> Attribution {
        Attribution { cfg, ..Default::default() }
    }

    pub fn target(&self, cookie: u64) -> Option<&Target> {
        self.targets.get(&cookie)
    }

    pub fn link(&self, cookie: u64) -> Option<&Link> {
        self.targets.get(&cookie).and_then(|t| t.link.as_ref())
    }

    /// Targets linked to `conn`.
    pub fn linked_to(&self, conn: u64) -> impl Iterator<Item = u64> + '_ {
        self.by_conn.get(&conn).into_iter().flatten().copied()
    }

    /// The stalled targets `conn` holds whatever the split, when no
    /// evidence says which (`floors.rs`): how many at least, of which.
    pub fn shared(&self, conn: u64) -> Option<Shared> {
        let link = |t: u64| self.link(t).copied();
        self.floors.of(conn, &|t| self.stalled.contains(&t), &link)
    }

    /// Whether the client bytes `conn` carried that none of its linked
    /// targets took fill its connection window (beyond framing and
    /// datagrams): its window is used up whatever the count of its known
    /// stalled streams. False when its targets are not all known.
    pub fn window_used_up(&self, conn: u64, now: Mono) -> bool {
        let Some(cs) = self.conns.get(&conn) else { return false };
        let Some(from) = cs.whole_from else { return false };
        let set: Vec<&Target> = self.linked_to(conn).filter_map(|t| self.targets.get(&t)).collect();
        let carried = cs.series.at(now).saturating_sub(cs.series.at(from));
        let into: u64 = set.iter().map(|t| fit::took(t, now).saturating_sub(fit::took(t, from))).sum();
        let framing = (carried as f64 * fit::FRAMING_MAX) as u64;
        carried.saturating_sub(into).saturating_sub(framing + cs.datagrams) >= self.cfg.conn_window
    }

    /// Targets followed, and connection series kept (for the tables' gauges).
    pub fn sizes(&self) -> (usize, usize) {
        (self.targets.len(), self.conns.len())
    }

    /// Byte marks from the kernel (or a capture).
    pub fn marks(&mut self, marks: &[ByteMark], conns: &ConnTable) {
        for m in marks {
            match *m {
                ByteMark::Flow { flow, cpu, at, bytes } => match conns.conn_of(&flow) {
                    Some(id) => {
                        let cs = self.conns.entry(id).or_insert_with(ConnSeries::new);
                        cs.mark(flow, cpu, at, bytes);
                        self.dirty = true;
                        tracing::trace!(conn = id, at = at.0, total = cs.total, cpu, "mark");
                    }
                    None => {
                        if self.orphans.len() < MAX_ORPHAN_FLOWS || self.orphans.contains_key(&flow) {
                            let e = self.orphans.entry(flow).or_insert_with(|| (at, Vec::new()));
                            if e.1.len() < 256 {
                                e.1.push((cpu, at, bytes));
                            }
                        }
                    }
                },
                ByteMark::Send { cookie, at, bytes } => {
                    let t = self.targets.entry(cookie).or_insert_with(|| Target::new(0, at));
                    if t.series.is_empty() {
                        if t.connect.is_none() {
                            // Connect not seen: its count before this mark is
                            // unknown; start one mark back.
                            t.start = Mono(at.0.saturating_sub(50_000_000));
                            t.start_bytes = bytes.saturating_sub(hystall_common::MARK_BYTES);
                        }
                        t.series.push(t.start, t.start_bytes);
                    }
                    t.series.push(at, bytes);
                    self.dirty = true;
                    tracing::trace!(target_cookie = cookie, at = at.0, total = bytes, "mark");
                }
            }
        }
    }

    /// A target socket was connected by `pid` at `at`.
    pub fn connect(&mut self, cookie: u64, pid: u32, at: Mono) {
        tracing::trace!(target_cookie = cookie, at = at.0, pid, "connect");
        let t = self.targets.entry(cookie).or_insert_with(|| Target::new(pid, at));
        t.pid = pid;
        t.connect = Some(at);
        // The kernel's count starts at the connect.
        t.start = at;
        t.start_bytes = 0;
        t.at_connect = None;
        self.dirty = true;
    }

    /// A target's connect completed at `at` (its connection's answer follows).
    pub fn established(&mut self, cookie: u64, at: Mono) {
        if let Some(t) = self.targets.get_mut(&cookie)
            && t.connect.is_some()
            && t.established.is_none()
        {
            t.established = Some(at);
        }
    }

    /// Whether the reply rule is used for `pid` (for the tests and the log).
    pub fn answers(&self, pid: u32) -> bool {
        self.gates.get(&pid).is_some_and(|g| g.open())
    }

    /// The candidates of a target at its connect, less those the server did
    /// not answer when the process is known to answer; and whether any were
    /// struck.
    fn at_connect_answered(&self, t: &Target) -> Option<(Vec<u64>, bool)> {
        let cands = t.at_connect()?;
        let open = self.gates.get(&t.pid).is_some_and(|g| g.open());
        match t.replies.as_deref().filter(|_| open).and_then(|a| reply::strike(cands, a)) {
            Some(left) => Some((left, true)),
            None => Some((cands.to_vec(), false)),
        }
    }

    /// A flow poll arrived (the connections' last-packet times are as of `at`).
    pub fn polled(&mut self, at: Mono) {
        self.last_poll = Some(at);
    }

    /// The server's relay table (Clash API), replacing the previous one.
    /// The processes whose configs say they answer each request (the
    /// reply rule holds for them from the start); replaces the last set.
    pub fn answering(&mut self, pids: Vec<u32>) {
        for (pid, g) in self.gates.iter_mut() {
            g.known = pids.contains(pid);
        }
        for pid in pids {
            self.gates.entry(pid).or_default().known = true;
        }
        self.dirty = true;
    }

    pub fn relays(&mut self, records: Vec<RelayRecord>) {
        self.relays = Some(records);
        self.relays_new = true;
    }

    /// Brings every target up to date at `now`: candidates at its connect,
    /// links from the server's table, and what the byte rules force when
    /// something new came; forgets closed sockets and connections.
    pub fn tick(&mut self, now: Mono, conns: &ConnTable, socks: &SocketTable, owners: &HashMap<u16, u32>) {
        let started = *self.started.get_or_insert(now);
        let pass = self.targets.len() <= BUSY_TARGETS || self.last_pass.is_none_or(|at| now.since(at) >= SOLVE_EVERY);
        if pass {
            self.last_pass = Some(now);
            // Stalled targets whose connect and bytes we never saw (they
            // predate us, or their process was found later) are followed too.
            let mut stalled = std::collections::HashSet::with_capacity(self.stalled.len());
            for s in socks.iter().filter(|s| s.closed.is_none() && s.k.outbound && s.verdict == Verdict::Stalled) {
                if let std::collections::hash_map::Entry::Vacant(e) = self.targets.entry(s.k.cookie) {
                    e.insert(Target::new(s.k.pid, s.k.first_seen.unwrap_or(now)));
                    self.dirty = true;
                }
                stalled.insert(s.k.cookie);
            }
            // Which targets count for the floors changed: search again.
            if stalled != self.stalled {
                self.stalled = stalled;
                self.floored.clear();
                self.dirty = true;
            }
            self.forget(now, conns, socks);
        }
        self.adopt_orphans(now, conns);
        for (id, cs) in self.conns.iter_mut() {
            if let Some(c) = conns.get(*id) {
                let horizon = Mono(now.0.saturating_sub(CONN_HORIZON.as_nanos() as u64));
                let seen_whole = c.first_seen.since(started) > Duration::from_secs(1);
                cs.whole_from = if seen_whole {
                    Some(c.first_seen.max(horizon))
                } else {
                    (now.since(started) >= CONN_HORIZON).then_some(horizon)
                };
                cs.known_from = Some(if seen_whole { c.first_seen } else { started }.max(horizon));
                cs.datagrams = c.c2s.bytes[0] + c.c2s.bytes[1];
            }
        }
        let sole = sole_owner(owners);
        let owner_of = |c: &Conn| owner_or(c, owners, sole);
        if let Some(poll) = self.last_poll {
            let window = self.cfg.connect_window;
            let max = self.cfg.max_candidates;
            let pending = |t: &Target| t.at_connect.is_none() && t.connect.is_some_and(|at| at <= poll);
            let earliest = self.targets.values().filter(|t| pending(t)).filter_map(|t| t.connect).min();
            let recent = match earliest {
                Some(at) => {
                    let owner = |d: &Digest| digest_owner(d, conns, owners, sole);
                    connect::recent(conns, Mono(at.0.saturating_sub(window.as_nanos() as u64)), &owner)
                }
                None => Vec::new(),
            };
            for (cookie, t) in self.targets.iter_mut().filter(|(_, t)| pending(t)) {
                let Some(at) = t.connect else { continue };
                let (cands, crowded) = connect::candidates(at, t.pid, window, max, &recent);
                tracing::debug!(cookie, at = at.0, pid = t.pid, ?cands, crowded, "attribution: at connect");
                t.at_connect = Some(cands);
                t.crowded = crowded;
                self.dirty = true;
            }
            // The server's answers, once the poll covers the window after
            // each completed connect.
            // Not for a crowded connect: its list is not used (and at node
            // scale it is 64 connections long, for hundreds of connects a second).
            let due = |t: &Target| {
                t.replies.is_none()
                    && !t.crowded
                    && t.at_connect.is_some()
                    && t.established.is_some_and(|e| Mono(e.0 + reply::WINDOW.as_nanos() as u64) <= poll)
            };
            for (cookie, t) in self.targets.iter_mut().filter(|(_, t)| due(t)) {
                let (Some(e), Some(cands)) = (t.established, t.at_connect.as_deref()) else { continue };
                let answers = reply::check(e, cands, conns);
                let gate = self.gates.entry(t.pid).or_default();
                match answers.as_slice() {
                    [(_, r)] => gate.learn(*r),
                    a if reply::all_silent(a) => gate.learn(Reply::None),
                    _ => {}
                }
                tracing::debug!(cookie, ?answers, "attribution: answers after the connect");
                t.replies = Some(answers);
                self.dirty = true;
            }
        }
        if self.relays_new {
            self.relays_new = false;
            if let Some(records) = self.relays.take() {
                let links = api::match_relays(&records, conns, socks, &self.targets);
                for (cookie, conn) in links {
                    let pid = socks.get(cookie).map_or(0, |s| s.k.pid);
                    self.set_api(cookie, conn, now, pid);
                }
                self.relays = Some(records);
            }
        }
        if (self.dirty && pass) || now.since(self.last_solve) >= SOLVE_EVERY {
            self.dirty = false;
            self.last_solve = now;
            self.solve(now, conns, &owner_of);
        }
    }

    /// Connections a request of which reached the server after their
    /// client stream data stopped: a target dialled for them (tied by its
    /// connect, the server's answer or its table) after their last bulk.
    /// Such a connection had credit then, and the stalled targets it holds
    /// now held it then too (their unread bytes only shrink once its bulk
    /// stopped): they cannot be enough to exhaust its window. So it holds
    /// fewer stalled targets than that, whatever the split — which says
    /// how many the others hold. (Clients keep trying new requests: that is
    /// how their users notice; a starved one's never reach the server.)
    /// Not set where its own links already reach that many.
    fn caps(&self, conns: &ConnTable) -> Map<u64, usize> {
        let need = self.cfg.conn_window.div_ceil(self.cfg.stream_window.max(1)).max(1) as usize;
        let mut caps = Map::default();
        for t in self.targets.values() {
            let (Some(at), Some(l)) = (t.connect, t.link) else { continue };
            if !(l.evidence.connect || l.evidence.reply || l.evidence.api) || caps.contains_key(&l.conn) {
                continue;
            }
            let Some(bulk) = conns.get(l.conn).and_then(|c| c.last_bulk(Dir::C2s)) else { continue };
            if at <= bulk {
                continue;
            }
            let held = self.by_conn.get(&l.conn).map_or(0, |s| s.iter().filter(|c| self.stalled.contains(c)).count());
            if held < need {
                caps.insert(l.conn, need - 1);
            }
        }
        caps
    }

    /// Runs the deduction over every target not tied for good.
    fn solve(&mut self, now: Mono, conns: &ConnTable, owner_of: &dyn Fn(&Conn) -> Option<u32>) {
        let mut open = std::collections::BTreeMap::new();
        // Targets whose candidates the server's answers narrowed.
        let mut narrowed = std::collections::HashSet::new();
        let mut linked = self.by_conn.clone();
        for (cookie, t) in &self.targets {
            if t.closed.is_some() || t.other_inbound || t.link.is_some_and(|l| l.evidence.settled()) {
                continue;
            }
            // Wait for the poll that says who could have opened it.
            if t.connect.is_some() && t.at_connect.is_none() {
                continue;
            }
            let cands: Vec<u64> = match self.at_connect_answered(t) {
                Some((c, struck)) => {
                    if struck {
                        narrowed.insert(*cookie);
                    }
                    c
                }
                None if t.series.len() > self.cfg.min_marks => self
                    .conns
                    .iter()
                    .filter(|(_, cs)| cs.last_mark >= t.start)
                    .filter(|(id, _)| {
                        conns.get(**id).is_some_and(|c| owner_of(c).is_none_or(|p| p == t.pid || t.pid == 0))
                    })
                    .map(|(id, _)| *id)
                    .collect(),
                // No evidence of its own: its process's one open connection
                // is the only one it can be, if it has one only.
                None if t.connect.is_none() => {
                    let mut mine = conns
                        .iter()
                        .filter(|c| c.closed.is_none() && owner_of(c).is_none_or(|p| p == t.pid))
                        .map(|c| c.id);
                    match (mine.next(), mine.next()) {
                        (Some(only), None) => vec![only],
                        _ => continue,
                    }
                }
                None => continue,
            };
            // A link the connect alone made is checked again by the bytes.
            if let Some(l) = t.link
                && let Some(set) = linked.get_mut(&l.conn)
            {
                set.remove(cookie);
            }
            open.insert(*cookie, cands);
        }
        if open.is_empty() {
            return;
        }
        self.aborted.retain(|_, at| now.since(*at) < SEARCH_BACKOFF);
        self.floored.retain(|_, at| now.since(*at) < SEARCH_BACKOFF);
        let problem = solve::Problem {
            conns: &self.conns,
            targets: &self.targets,
            linked,
            open: open.clone(),
            now,
            windows: fit::Windows { stream: self.cfg.stream_window, conn: self.cfg.conn_window },
            skip: &self.aborted,
            budget: self.cfg.search_nodes,
            counted: &self.stalled,
            floored: &self.floored,
            caps: &self.caps(conns),
        };
        let solved = problem.solve();
        self.searches += solved.searched;
        self.aborted.extend(solved.aborted.into_iter().map(|g| (g, now)));
        self.floored.extend(solved.floored.into_iter().map(|g| (g, now)));
        let tied: HashMap<u64, (u64, bool)> = solved.deduced.into_iter().map(|(t, c, s)| (t, (c, s))).collect();
        for (cookie, cands) in open {
            let Some(t) = self.targets.get_mut(&cookie) else { continue };
            if let Some(old) = t.link.take()
                && let Some(set) = self.by_conn.get_mut(&old.conn)
            {
                set.remove(&cookie);
            }
            match tied.get(&cookie) {
                Some(&(conn, searched)) => {
                    // `cands` are those left at its connect, when it was seen.
                    let by_connect = t.at_connect().is_some() && cands == [conn];
                    // The answers narrowed who could have asked.
                    let by_reply = narrowed.contains(&cookie) && cands.contains(&conn);
                    let by_bytes = searched || t.series.len() > self.cfg.min_marks;
                    let only = t.connect.is_none() && !by_bytes;
                    let link = Link {
                        conn,
                        evidence: Evidence {
                            api: false,
                            connect: by_connect,
                            reply: by_reply,
                            bytes: by_bytes || (!by_connect && !only),
                            only,
                        },
                        score: 1.0 / cands.len().max(1) as f64,
                        since: now,
                    };
                    tracing::debug!(cookie, conn, ?cands, evidence = ?link.evidence.names(), "attribution: tied");
                    t.link = Some(link);
                    t.candidates.clear();
                    self.by_conn.entry(conn).or_default().insert(cookie);
                }
                None => t.candidates = cands,
            }
        }
        let targets = &self.targets;
        let link = |t: u64| targets.get(&t).and_then(|t| t.link);
        let stalled = &self.stalled;
        self.floors.update(solved.floors, &|t| stalled.contains(&t), &link);
    }

    fn set_api(&mut self, cookie: u64, conn: Option<u64>, now: Mono, pid: u32) {
        let t = self.targets.entry(cookie).or_insert_with(|| Target::new(pid, now));
        let old = t.link.take();
        if let Some(old) = old
            && let Some(set) = self.by_conn.get_mut(&old.conn)
        {
            set.remove(&cookie);
        }
        match conn {
            Some(conn) => {
                // What else showed the same link stays shown.
                let prev = old.filter(|l| l.conn == conn).map(|l| l.evidence).unwrap_or_default();
                if !prev.api
                    && let Some((_, r)) = t.replies.iter().flatten().find(|(c, _)| *c == conn)
                {
                    // An exact tie: did the server answer its connection?
                    self.gates.entry(t.pid).or_default().learn(*r);
                }
                t.link = Some(Link { conn, evidence: Evidence { api: true, ..prev }, score: 1.0, since: now });
                t.other_inbound = false;
                self.by_conn.entry(conn).or_default().insert(cookie);
            }
            None => t.other_inbound = true,
        }
    }

    /// Flow marks that arrived before their flow joined a connection.
    fn adopt_orphans(&mut self, now: Mono, conns: &ConnTable) {
        if self.orphans.is_empty() {
            return;
        }
        let flows: Vec<FlowId> = self.orphans.keys().copied().collect();
        for flow in flows {
            if let Some(id) = conns.conn_of(&flow) {
                let (_, marks) = self.orphans.remove(&flow).unwrap_or_default();
                let cs = self.conns.entry(id).or_insert_with(ConnSeries::new);
                for (cpu, at, bytes) in marks {
                    cs.mark(flow, cpu, at, bytes);
                }
            }
        }
        self.orphans.retain(|_, (first, _)| now.since(*first) < ORPHAN_FOR);
    }

    /// Forgets targets closed for a while (their bytes explain their
    /// connection's until then), swept connections and old points.
    fn forget(&mut self, now: Mono, conns: &ConnTable, socks: &SocketTable) {
        // One pass. Closed targets (most of them on a busy node: those linked
        // stay for the horizon) cost no socket look-up.
        let mut unlinked = Vec::new();
        self.targets.retain(|cookie, t| {
            if t.closed.is_none() || t.pid == 0 {
                let sock = socks.get(*cookie);
                let open = match sock {
                    Some(s) => s.closed.is_none() && s.k.outbound,
                    // Marks can come before the connect's event is applied.
                    None => now.since(t.born) < Duration::from_secs(5) && t.closed.is_none(),
                };
                if !open && t.closed.is_none() {
                    t.closed = Some(now);
                    // What it could have been no longer matters.
                    t.at_connect = Some(Vec::new());
                    t.candidates = Vec::new();
                }
                if t.pid == 0
                    && let Some(s) = sock
                {
                    t.pid = s.k.pid;
                }
            }
            let gone = t.closed.is_some_and(|at| t.link.is_none() || now.since(at) >= CLOSED_KEEP);
            if gone && let Some(l) = t.link {
                unlinked.push((l.conn, *cookie));
            }
            !gone
        });
        for (conn, cookie) in unlinked {
            if let Some(set) = self.by_conn.get_mut(&conn) {
                set.remove(&cookie);
            }
        }
        let targets = &self.targets;
        let link = |t: u64| targets.get(&t).and_then(|t| t.link);
        let stalled = &self.stalled;
        self.floors.retain(|c| conns.get(c).is_some_and(|c| c.closed.is_none()), &|t| stalled.contains(&t), &link);
        self.conns.retain(|id, _| conns.get(*id).is_some());
        self.by_conn.retain(|id, set| !set.is_empty() && conns.get(*id).is_some());
        let horizon = Mono(now.0.saturating_sub(CONN_HORIZON.as_nanos() as u64));
        for cs in self.conns.values_mut() {
            cs.series.forget_before(horizon);
        }
    }
}

/// The process serving `c` (owner of one of its server ports), when known.
pub fn owner(c: &Conn, owners: &HashMap<u16, u32>) -> Option<u32> {
    owner_or(c, owners, sole_owner(owners))
}

/// The one process that owns every port, if one does (then it owns every
/// connection). Computed once per tick: a proxy may hold thousands of UDP
/// sockets, and this is asked per connection and connect.
pub fn sole_owner(owners: &HashMap<u16, u32>) -> Option<u32> {
    let mut pids = owners.values().copied();
    let first = pids.next()?;
    pids.all(|p| p == first).then_some(first)
}

/// `owner_or` from a connection's digest: its connection is read only when
/// its paths have more than one server port (a client hopping ports).
fn digest_owner(d: &Digest, conns: &ConnTable, owners: &HashMap<u16, u32>, sole: Option<u32>) -> Option<u32> {
    match (sole, d.port) {
        (Some(_), _) => sole,
        (None, 0) => conns.get(d.id).and_then(|c| owner_or(c, owners, None)),
        (None, port) => owners.get(&port).copied(),
    }
}

/// `owner` with the sole owner already known.
pub fn owner_or(c: &Conn, owners: &HashMap<u16, u32>, sole: Option<u32>) -> Option<u32> {
    if sole.is_some() {
        // Every port is its: no need to read the connection's flows.
        return sole;
    }
    c.flows.iter().find_map(|f| owners.get(&f.server.port()).copied())
}
