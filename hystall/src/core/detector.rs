//! The starvation detector (pure; time is an input): flags the QUIC connection
//! that is alive but starved of stream data, ties it to the stalled target
//! sockets that starved it, and grades what the evidence allows
//! (docs/DETECTOR.md).
//!
//! From headers alone a starved connection looks like this: packets still flow
//! both ways (ACKs, pings, DATAGRAM frames are not flow-controlled), but the
//! client's full-size packets — bulk stream data — have stopped; meanwhile the
//! server process holds target sockets whose sends made no progress for the
//! stall timeout. Each such target pins up to one stream window of unread bytes
//! in the connection's window, so it takes ceil(connection window / stream
//! window) of them (3 with Hysteria's 8 MiB / 20 MiB) to exhaust it:
//! - `likely`: at least that many stalled targets attributed to the connection;
//! - `suspected`: one fewer (one more stalled stream starves it);
//! - `confirmed`: only where the evidence is exact (the server's own stream
//!   table, or decrypted frames offline) — never from headers and timing alone.
//!
//! Attribution: the server's process ties its targets to its connections only
//! loosely, so each stalled target is given to the connection that carried
//! client bulk data when bytes last moved into the target (a stream's bytes
//! reach its target right after they arrive on the connection). Its share of the
//! score against the other candidates is reported as the strength.

use std::collections::{BTreeSet, HashMap};
use std::time::Duration;

use serde::Serialize;

use super::attribution::{Attribution, Link, owner};
use super::conns::{Conn, ConnTable};
use super::event::{Event, Stamped, StarvedInfo, StarvedTarget};
use super::flows::Dir;
use super::frames::{BlockedStream, FrameEvidence, FrameState};
use super::model::conn_info;
use super::observation::ServerStream;
use super::sockets::SocketTable;
use super::time::Mono;
use super::verdict::Verdict;

/// QUIC flow-control windows of the server (options; Hysteria's by default).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Windows {
    pub stream: u64,
    pub conn: u64,
}

impl Default for Windows {
    fn default() -> Self {
        Windows { stream: 8 << 20, conn: 20 << 20 }
    }
}

impl Windows {
    /// Stalled streams it takes to exhaust the connection window.
    pub fn streams_to_exhaust(&self) -> usize {
        self.conn.div_ceil(self.stream.max(1)).max(1) as usize
    }
}

#[derive(Clone, Copy, Debug)]
pub struct DetectorConfig {
    pub windows: Windows,
    /// Packets both ways within this window: alive. Long enough for keepalives
    /// (Hysteria clients ping every 10 s).
    pub alive_window: Duration,
    /// Client bulk quiet this long (and stalled targets): a candidate.
    pub bulk_quiet: Duration,
    /// The sockets' stall timeout: a server stream idle this long is frozen.
    pub stall_timeout: Duration,
}

impl Default for DetectorConfig {
    fn default() -> Self {
        DetectorConfig {
            windows: Windows::default(),
            alive_window: Duration::from_secs(15),
            bulk_quiet: Duration::from_secs(2),
            stall_timeout: Duration::from_secs(10),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Confidence {
    Suspected,
    Likely,
    Confirmed,
}

impl Confidence {
    pub fn as_str(self) -> &'static str {
        match self {
            Confidence::Suspected => "suspected",
            Confidence::Likely => "likely",
            Confidence::Confirmed => "confirmed",
        }
    }
}

/// A connection judged starved.
#[derive(Clone, Debug, PartialEq)]
pub struct Starved {
    pub conn: u64,
    /// When client stream data stopped (the connection's last client bulk).
    pub since: Mono,
    pub confidence: Confidence,
    /// Attributed stalled targets: (cookie, strength 0..=1).
    pub targets: Vec<(u64, f64)>,
    pub pid: Option<u32>,
    /// What the server's own stream table says, when it is available.
    pub api: Option<ApiEvidence>,
    /// Stalled targets that may be its but that no evidence ties to it.
    pub unattributed: usize,
}

/// The server's stream table, matched against the attributed targets.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ApiEvidence {
    /// The server's id of the connection whose streams match.
    pub connection: u32,
    /// Its established streams idle for the stall timeout.
    pub frozen_streams: usize,
    /// Of those, the ones going where the stalled targets go.
    pub matching: usize,
}

/// The server connection (by its own id) whose established, frozen streams go
/// to the attributed targets' addresses; `None` when none does.
fn confirm(
    targets: &[(u64, f64)],
    socks: &SocketTable,
    streams: &[ServerStream],
    now: Mono,
    stall_timeout: Duration,
) -> Option<ApiEvidence> {
    let remotes: BTreeSet<String> =
        targets.iter().filter_map(|(c, _)| socks.get(*c)?.remote()).map(|a| a.to_string()).collect();
    let mut by_conn: HashMap<u32, (usize, usize)> = HashMap::new();
    for s in streams.iter().filter(|s| s.state == "estab" && now.since(s.last_active) >= stall_timeout) {
        let e = by_conn.entry(s.connection).or_default();
        e.0 += 1;
        if remotes.contains(&s.hooked_req_addr) || remotes.contains(&s.req_addr) {
            e.1 += 1;
        }
    }
    by_conn
        .into_iter()
        .filter(|(_, (_, m))| *m > 0)
        .max_by_key(|(_, (_, m))| *m)
        .map(|(connection, (frozen_streams, matching))| ApiEvidence { connection, frozen_streams, matching })
}

#[derive(Default)]
pub struct Detector {
    pub cfg: DetectorConfig,
    starved: HashMap<u64, Starved>,
}

impl Detector {
    pub fn new(cfg: DetectorConfig) -> Self {
        Detector { cfg, starved: HashMap::new() }
    }

    /// Connections judged starved now.
    pub fn starved(&self) -> impl Iterator<Item = &Starved> {
        self.starved.values()
    }

    pub fn get(&self, conn: u64) -> Option<&Starved> {
        self.starved.get(&conn)
    }

    /// Re-judges every connection at `now`; returns `quic_starved` (on entry
    /// and when the confidence rises) and `quic_recovered` events. A
    /// connection is flagged only for the stalled targets the attribution ties
    /// to it (or the frames it sent, in a decrypted capture).
    pub fn tick(
        &mut self,
        now: Mono,
        conns: &ConnTable,
        socks: &SocketTable,
        links: &Attribution,
        owners: &HashMap<u16, u32>,
        streams: Option<&[ServerStream]>,
    ) -> Vec<Stamped> {
        let cfg = self.cfg;
        let stalled = |cookie: u64| {
            socks.get(cookie).is_some_and(|s| s.closed.is_none() && s.verdict == Verdict::Stalled && s.k.outbound)
        };
        // Stalled targets no evidence ties to one connection, by the
        // connections they may belong to (once a tick: O(targets)).
        let mut maybe: HashMap<u64, usize> = HashMap::new();
        // Connections with a stalled target linked: with those with
        // decrypted frames, the only ones that can be starved (need ≥ 1).
        let mut candidates: BTreeSet<u64> = BTreeSet::new();
        for s in socks.iter().filter(|s| stalled(s.k.cookie)) {
            let Some(t) = links.target(s.k.cookie) else { continue };
            match &t.link {
                Some(l) => {
                    candidates.insert(l.conn);
                }
                None if !t.other_inbound => {
                    for &c in t.maybe() {
                        *maybe.entry(c).or_default() += 1;
                    }
                }
                None => {}
            }
        }

        let need = cfg.windows.streams_to_exhaust();
        let mut out = Vec::new();
        let mut now_starved: HashMap<u64, Starved> = HashMap::new();
        // Only those can be starved: the others are not looked at (a node
        // has tens of thousands of connections, a few with stalled targets).
        candidates.extend(conns.framed().map(|c| c.id));
        let alive = candidates
            .iter()
            .filter_map(|id| conns.get(*id))
            .filter(|c| c.closed.is_none() && c.opened_reported && c.alive(now, cfg.alive_window));
        for c in alive {
            // Never saw client bulk since we attached: it stopped before that.
            let bulk = c.last_bulk(Dir::C2s).unwrap_or(c.first_seen);
            let quiet = now.since(bulk) >= cfg.bulk_quiet;
            let targets: Vec<(u64, Link)> =
                links.linked_to(c.id).filter(|t| stalled(*t)).filter_map(|t| links.link(t).map(|l| (t, *l))).collect();
            let k = targets.len();
            let exact = targets.iter().filter(|(_, l)| l.evidence.api).count();
            let unsure = maybe.get(&c.id).copied().unwrap_or(0);
            // Decrypted frames (a capture with keys, or --decrypt) prove it or
            // not, whatever the targets.
            let proof = c.frames.as_ref().and_then(|f| frame_proof(f, now, cfg.bulk_quiet, c.last_bulk(Dir::C2s)));
            let confidence = if proof.is_some() || exact >= need {
                Confidence::Confirmed
            } else if k >= need {
                Confidence::Likely
            } else if k + 1 >= need && k >= 1 && links.window_used_up(c.id, now) {
                // Its own stalled streams fall one short, but its bytes say
                // its window is used up all the same (a stalled stream of its
                // that no evidence tied to it).
                Confidence::Suspected
            } else {
                continue;
            };
            let prev = self.starved.get(&c.id);
            // Hysteresis: a starved connection stays so until client bulk flows
            // again (the quiet test) or its stalled targets are gone (k above).
            if proof.is_none() && !quiet && prev.is_none_or(|p| bulk > p.since) && c.last_bulk(Dir::C2s).is_some() {
                continue;
            }
            let since = prev.map_or(proof.unwrap_or(bulk), |p| p.since);
            let targets: Vec<(u64, f64)> = targets.iter().map(|(t, l)| (*t, l.score)).collect();
            let api = streams.and_then(|s| confirm(&targets, socks, s, now, cfg.stall_timeout));
            let confidence = match &api {
                Some(a) if a.matching >= need => Confidence::Confirmed,
                _ => confidence,
            };
            let pid = owner(c, owners);
            now_starved
                .insert(c.id, Starved { conn: c.id, since, confidence, targets, pid, api, unattributed: unsure });
        }

        for (id, st) in &now_starved {
            let rose = self.starved.get(id).is_none_or(|p| st.confidence > p.confidence);
            if rose && let Some(c) = conns.get(*id) {
                out.push(Stamped {
                    at: now,
                    event: Event::QuicStarved(info(c, st, socks, links, now, None, cfg.windows)),
                });
            }
        }
        for (id, old) in &self.starved {
            if !now_starved.contains_key(id) {
                let reason = match conns.get(*id) {
                    None => "connection closed",
                    Some(c) if c.closed.is_some() => "connection closed",
                    Some(c) if c.last_bulk(Dir::C2s).is_some_and(|b| b > old.since) => "client stream data flows again",
                    Some(_) => "its stalled targets are gone",
                };
                if let Some(c) = conns.get(*id) {
                    out.push(Stamped {
                        at: now,
                        event: Event::QuicRecovered(info(c, old, socks, links, now, Some(reason), cfg.windows)),
                    });
                }
            }
        }
        self.starved = now_starved;
        out.sort_by_key(|e| e.at);
        out
    }
}

/// When the client's stream data stopped, if decrypted frames prove the
/// connection starved: the client used up the server's connection limit, sent
/// no new stream data for `quiet`, the server never raised the limit since, and
/// the client still sends ACK or DATAGRAM frames (it is alive, only blocked).
///
/// Live (`--decrypt`), a connection is read only once it is suspect: its last
/// STREAM frames were never passed, only the DATA_BLOCKED the classifier kept
/// after them. Then the stop is the DATA_BLOCKED, provided the kernel's counts
/// (`last_bulk`: the last full-size client packet) saw no bulk after it.
pub fn frame_proof(f: &FrameState, now: Mono, quiet: Duration, last_bulk: Option<Mono>) -> Option<Mono> {
    f.client_blocked_at_limit()?;
    let stop = match (f.last_stream[0], f.data_blocked) {
        (Some(s), _) => s,
        (None, Some((_, at, _))) if last_bulk.is_none_or(|b| b <= at) => at,
        _ => return None,
    };
    (now.since(stop) >= quiet && f.max_data_raised.is_none_or(|r| r <= stop) && f.client_alive_after(stop))
        .then_some(stop)
}

/// Blocked streams an event lists at most.
const MAX_BLOCKED_LISTED: usize = 16;

fn frame_evidence(f: &FrameState, now: Mono) -> FrameEvidence {
    FrameEvidence {
        max_data: f.server_max_data.unwrap_or_default(),
        client_consumed: f.client_consumed,
        data_blocked_limit: f.data_blocked.map(|(l, _, _)| l),
        data_blocked_frames: f.data_blocked_frames,
        stream_data_blocked_frames: f.stream_data_blocked,
        client_stream_quiet_ms: f.last_stream[0].map_or(0, |t| now.since(t).as_millis() as u64),
        max_data_raised_ms_ago: f.max_data_raised.map(|t| now.since(t).as_millis() as u64),
        client_acks: f.acks[0],
        client_datagrams: f.datagrams[0],
        server_datagrams: f.datagrams[1],
        reset_stream: f.reset_stream.iter().sum(),
        stop_sending: f.stop_sending.iter().sum(),
        blocked_streams: f
            .held_streams(now)
            .into_iter()
            .take(MAX_BLOCKED_LISTED)
            .map(|s| BlockedStream { id: s.id, offset: s.offset, stream_limit: s.blocked_at })
            .collect(),
    }
}

fn info(
    c: &Conn,
    st: &Starved,
    socks: &SocketTable,
    links: &Attribution,
    now: Mono,
    reason: Option<&'static str>,
    w: Windows,
) -> StarvedInfo {
    let base = conn_info(c);
    let targets: Vec<StarvedTarget> = st
        .targets
        .iter()
        .map(|&(cookie, strength)| {
            let s = socks.get(cookie);
            StarvedTarget {
                cookie,
                local: s.and_then(|s| s.local()).map(|a| a.to_string()),
                remote: s.and_then(|s| s.remote()).map(|a| a.to_string()),
                strength: (strength * 100.0).round() / 100.0,
                evidence: links.link(cookie).map(|l| l.evidence.names()).unwrap_or_default(),
                no_progress_ms: s
                    .and_then(|s| s.progress().no_progress_since())
                    .map_or(0, |q| now.since(q).as_millis() as u64),
                unsent_bytes: s.and_then(|s| s.diag.as_ref().map(|d| d.notsent)),
            }
        })
        .collect();
    // From its targets; frames may prove it before any target stalled: then
    // from another socket of the server's process.
    let comm = st
        .targets
        .iter()
        .find_map(|(c, _)| socks.get(*c))
        .or_else(|| st.pid.and_then(|pid| socks.iter().find(|s| s.k.pid == pid && !s.k.comm.is_empty())))
        .map(|s| s.k.comm.clone())
        .unwrap_or_default();
    let rate = c.rates(now);
    StarvedInfo {
        conn: c.id,
        client: base.client,
        server: base.server,
        dcid: base.dcid,
        obfuscated: base.obfuscated,
        pid: st.pid,
        comm,
        since_ms: now.since(st.since).as_millis() as u64,
        confidence: st.confidence.as_str(),
        stalled: st.targets.iter().map(|(c, _)| *c).collect(),
        evidence: super::event::StarvedEvidence {
            client_bulk_quiet_ms: now.since(c.last_bulk(Dir::C2s).unwrap_or(c.first_seen)).as_millis() as u64,
            client_small_pps: (rate.c2s_pps[0] + rate.c2s_pps[1]).round(),
            server_pps: rate.s2c_pps.iter().sum::<f64>().round(),
            stalled_targets: targets.len(),
            streams_to_exhaust: w.streams_to_exhaust(),
            stream_window: w.stream,
            conn_window: w.conn,
            unsent_bytes: targets.iter().filter_map(|t| t.unsent_bytes.map(u64::from)).sum(),
            unattributed_targets: st.unattributed,
            server_streams: st.api.clone(),
            frames: c.frames.as_ref().map(|f| frame_evidence(f, now)),
            targets,
        },
        reason,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::flows::{DirCounters, FlowCounters, FlowId, HeaderSample};
    use crate::core::observation::{ByteMark, Observation, SockChange, SockSample};
    use crate::core::verdict::Thresholds;

    fn s(secs: f64) -> Mono {
        Mono::from_secs_f64(secs)
    }

    const PID: u32 = 42;
    const SERVER_PORT: u16 = 443;

    /// A synthetic node: one server process, its connections and targets.
    struct Node {
        conns: ConnTable,
        socks: SocketTable,
        det: Detector,
        owners: HashMap<u16, u32>,
        /// Per client: cumulative counters (c2s full, c2s small, s2c small).
        flows: HashMap<u16, (u64, u64, u64, Option<Mono>, Mono)>,
        streams: Option<Vec<ServerStream>>,
        links: crate::core::attribution::Attribution,
    }

    impl Node {
        fn new() -> Node {
            let th = Thresholds { stall_timeout: Duration::from_secs(10), slow_after: Duration::from_secs(1) };
            Node {
                conns: ConnTable::new(Duration::from_secs(30)),
                socks: SocketTable::new(th),
                det: Detector::default(),
                owners: HashMap::from([(SERVER_PORT, PID)]),
                flows: HashMap::new(),
                streams: None,
                links: Default::default(),
            }
        }

        fn flow(client_port: u16) -> FlowId {
            FlowId {
                client: format!("10.0.0.{}:{client_port}", client_port % 200).parse().unwrap(),
                server: format!("10.0.0.1:{SERVER_PORT}").parse().unwrap(),
            }
        }

        /// A client connects (its server Handshake teaches the DCID).
        fn connect(&mut self, client: u16, at: f64) {
            let dcid = [client as u8, 1, 2, 3];
            let mut long = vec![0xe0, 0, 0, 0, 1, 0, 4];
            long.extend_from_slice(&dcid);
            long.extend_from_slice(&[0x40, 0x20]);
            let f = Node::flow(client);
            self.conns
                .sample(s(at), &HeaderSample { flow: f, dir: Dir::S2c, payload_len: 60, segs: 1, bytes: long.into() });
            self.flows.insert(client, (0, 0, 0, None, s(at)));
        }

        /// One second of traffic for `client`: bulk up or not; small packets both ways.
        fn second(&mut self, client: u16, at: f64, bulk: bool) {
            let e = self.flows.get_mut(&client).unwrap();
            if bulk {
                e.0 += 8000;
                e.3 = Some(s(at));
            }
            e.1 += 5;
            e.2 += 5;
            let (full, small, down, last_full, first) = *e;
            let c2s = DirCounters {
                packets: [small, 0, full],
                bytes: [small * 50, 0, full * 1200],
                last: [Some(s(at)), None, last_full],
                first: Some(first),
            };
            let s2c = DirCounters {
                packets: [down, 0, 0],
                bytes: [down * 50, 0, 0],
                last: [Some(s(at)), None, None],
                first: Some(first),
            };
            self.conns.counters(s(at), Node::flow(client), FlowCounters { c2s, s2c, ..Default::default() });
            self.links.polled(s(at));
            if bulk {
                // The kernel's byte marks of the second's client bytes, one
                // each MARK_BYTES, spread over the second.
                let (from, to) = ((full - 8000) * 1200, full * 1200);
                let step = hystall_common::MARK_BYTES;
                let marks: Vec<ByteMark> = (from / step + 1..=to / step)
                    .map(|k| {
                        let frac = (k * step - from) as f64 / (to - from) as f64;
                        ByteMark::Flow { flow: Node::flow(client), cpu: 0, at: s(at - 1.0 + frac), bytes: k * step }
                    })
                    .collect();
                self.links.marks(&marks, &self.conns);
            }
        }

        /// A target socket of the server that got bytes until `fed_until`, then
        /// blocked for good (a never-reading target).
        fn stall_target(&mut self, cookie: u64, fed_until: f64) {
            // Dialled two seconds before, fed 1 MiB a second until then.
            self.links.connect(cookie, PID, s(fed_until - 2.0));
            let marks: Vec<ByteMark> = [1.5, 0.5]
                .iter()
                .enumerate()
                .map(|(i, back)| ByteMark::Send { cookie, at: s(fed_until - back), bytes: (i as u64 + 1) << 20 })
                .collect();
            self.links.marks(&marks, &self.conns);
            let k = SockSample {
                cookie,
                pid: PID,
                comm: "sing-box".into(),
                local: Some(format!("10.0.0.1:{}", 40000 + cookie).parse().unwrap()),
                remote: Some("93.184.216.34:443".parse().unwrap()),
                outbound: true,
                state: 1,
                last_send: Some(s(fed_until)),
                blocked_since: Some(s(fed_until)),
                first_seen: Some(s(0.0)),
                ..Default::default()
            };
            self.socks.apply(Observation::Sock { at: s(fed_until), change: SockChange::Blocked, sample: k });
        }

        fn tick(&mut self, at: f64) -> Vec<Stamped> {
            let mut out = self.socks.tick(s(at));
            self.conns.tick(s(at));
            self.links.tick(s(at), &self.conns, &self.socks, &self.owners);
            out.extend(self.det.tick(
                s(at),
                &self.conns,
                &self.socks,
                &self.links,
                &self.owners,
                self.streams.as_deref(),
            ));
            out.into_iter().filter(|e| matches!(e.event, Event::QuicStarved(_) | Event::QuicRecovered(_))).collect()
        }
    }

    fn starved(events: &[Stamped]) -> Vec<(u64, &'static str, usize)> {
        events
            .iter()
            .filter_map(|e| match &e.event {
                Event::QuicStarved(i) => Some((i.conn, i.confidence, i.stalled.len())),
                _ => None,
            })
            .collect()
    }

    /// One client uploads for 5 s into three targets that stop reading at
    /// 3, 4 and 5 s.
    fn fed_then_three_stalled() -> (Node, Vec<Stamped>) {
        let mut n = Node::new();
        n.connect(1000, 0.0);
        let mut events = Vec::new();
        for t in 1..=5 {
            n.second(1000, t as f64, true);
            events.extend(n.tick(t as f64));
        }
        for (cookie, fed) in [(1, 3.0), (2, 4.0), (3, 5.0)] {
            n.stall_target(cookie, fed);
        }
        (n, events)
    }

    #[test]
    fn three_stalled_streams_starve_the_connection_that_fed_them() {
        let (mut n, mut events) = fed_then_three_stalled();
        for t in 6..=16 {
            n.second(1000, t as f64, false);
            events.extend(n.tick(t as f64));
        }
        // The targets reach the stall timeout one after the other; two are
        // not enough (its bytes since before we attached are not all known,
        // so they cannot say its window is used up).
        assert_eq!(starved(&events), vec![(1, "likely", 3)]);
        let st = n.det.get(1).unwrap();
        assert_eq!(st.since, s(5.0), "client bulk stopped at 5 s");
        assert!(st.targets.iter().all(|(_, strength)| *strength == 1.0));
    }

    /// Frames of a client that used up the 20 MiB connection credit at 5 s.
    fn blocked_frames(last_stream: f64, acks_until: f64) -> crate::core::frames::FrameState {
        crate::core::frames::FrameState {
            opened: [500, 400],
            stream_bytes: [20 << 20, 0],
            last_stream: [Some(s(last_stream)), None],
            acks: [100, 80],
            last_ack: [Some(s(acks_until)), Some(s(acks_until))],
            datagrams: [10, 10],
            last_datagram: [Some(s(acks_until)), Some(s(acks_until))],
            client_consumed: 20 << 20,
            server_max_data: Some(20 << 20),
            data_blocked: Some((20 << 20, s(last_stream), s(acks_until))),
            data_blocked_frames: 1,
            ..Default::default()
        }
    }

    #[test]
    fn decrypted_frames_confirm_it_without_any_target() {
        use crate::core::frames::FrameSample;
        let mut n = Node::new();
        n.connect(1000, 0.0);
        let mut events = Vec::new();
        for t in 1..=5 {
            n.second(1000, t as f64, true);
            events.extend(n.tick(t as f64));
        }
        for t in 6..=12 {
            n.second(1000, t as f64, false);
            let state = blocked_frames(5.0, t as f64);
            n.conns.frames(FrameSample { flow: Node::flow(1000), state });
            events.extend(n.tick(t as f64));
        }
        assert_eq!(starved(&events), vec![(1, "confirmed", 0)]);
        let st = n.det.get(1).unwrap();
        assert_eq!(st.since, s(5.0), "the client's last STREAM frame");
        let Some(Event::QuicStarved(info)) = events.first().map(|e| &e.event) else { panic!() };
        let f = info.evidence.frames.as_ref().expect("frame evidence");
        assert_eq!((f.max_data, f.client_consumed, f.data_blocked_limit), (20 << 20, 20 << 20, Some(20 << 20)));

        // The server raises MAX_DATA and the client sends again: recovered.
        let mut state = blocked_frames(13.0, 13.0);
        state.server_max_data = Some(40 << 20);
        state.max_data_raised = Some(s(12.5));
        n.second(1000, 13.0, true);
        n.conns.frames(FrameSample { flow: Node::flow(1000), state });
        let after = n.tick(13.0);
        assert!(after.iter().any(|e| matches!(e.event, Event::QuicRecovered(_))), "{after:?}");
    }

    #[test]
    fn frames_of_an_idle_client_with_credit_left_prove_nothing() {
        use crate::core::frames::FrameSample;
        let mut n = Node::new();
        n.connect(1000, 0.0);
        let mut events = Vec::new();
        for t in 1..=12 {
            n.second(1000, t as f64, t <= 5);
            let mut state = blocked_frames(5.0, t as f64);
            state.client_consumed = 3 << 20;
            state.data_blocked = None;
            n.conns.frames(FrameSample { flow: Node::flow(1000), state });
            events.extend(n.tick(t as f64));
        }
        assert!(starved(&events).is_empty(), "{events:?}");
    }

    #[test]
    fn frames_of_a_connection_none_of_whose_packets_opened_are_no_evidence() {
        use crate::core::frames::{FrameSample, FrameState};
        let (mut n, mut events) = fed_then_three_stalled();
        for t in 6..=16 {
            n.second(1000, t as f64, false);
            // --decrypt without secrets (shoes: rustls): packets passed, none opened.
            let state = FrameState { unopened: [40 * t, 10 * t], ..Default::default() };
            n.conns.frames(FrameSample { flow: Node::flow(1000), state });
            events.extend(n.tick(t as f64));
        }
        assert_eq!(starved(&events), vec![(1, "likely", 3)]);
        let Some(Event::QuicStarved(info)) =
            events.iter().map(|e| &e.event).find(|e| matches!(e, Event::QuicStarved(_)))
        else {
            panic!()
        };
        assert!(info.evidence.frames.is_none(), "{:?}", info.evidence.frames);
    }

    #[test]
    fn the_servers_own_stream_table_confirms_it() {
        let mut n = Node::new();
        n.connect(1000, 0.0);
        for t in 1..=5 {
            n.second(1000, t as f64, true);
            n.tick(t as f64);
        }
        for c in 1..=3 {
            n.stall_target(c, 5.0);
        }
        // Hysteria's /dump/streams: three established streams of connection 7
        // to the targets' address, idle since 5 s; one healthy stream elsewhere.
        let stream = |id: u64, addr: &str, idle_since: f64| ServerStream {
            connection: 7,
            stream: id,
            state: "estab".into(),
            req_addr: "example.com:443".into(),
            hooked_req_addr: addr.into(),
            tx: 0,
            rx: 8 << 20,
            last_active: s(idle_since),
        };
        n.streams = Some(vec![
            stream(0, "93.184.216.34:443", 5.0),
            stream(4, "93.184.216.34:443", 5.0),
            stream(8, "93.184.216.34:443", 5.0),
            stream(12, "1.1.1.1:53", 15.5),
        ]);
        let mut events = Vec::new();
        for t in 6..=16 {
            n.second(1000, t as f64, false);
            events.extend(n.tick(t as f64));
        }
        assert_eq!(starved(&events).last(), Some(&(1, "confirmed", 3)));
        let api = n.det.get(1).unwrap().api.clone().unwrap();
        assert_eq!((api.connection, api.frozen_streams, api.matching), (7, 3, 3));
    }

    #[test]
    fn one_stalled_stream_stalls_its_target_but_does_not_starve_the_connection() {
        let mut n = Node::new();
        n.connect(1000, 0.0);
        for t in 1..=3 {
            n.second(1000, t as f64, true);
            n.tick(t as f64);
        }
        n.stall_target(1, 3.0);
        let mut events = Vec::new();
        for t in 4..=30 {
            n.second(1000, t as f64, false);
            events.extend(n.tick(t as f64));
        }
        assert!(events.is_empty(), "{:?}", starved(&events));
        assert_eq!(n.socks.counts()[2], 1, "the target itself is STALLED");
    }

    /// A client first seen after we attached, 38 MB up in 4 s, then quiet.
    fn whole_upload(n: &mut Node, secs: u64) {
        n.tick(0.0);
        n.connect(1000, 1.5);
        for t in 2..2 + secs {
            n.second(1000, t as f64, true);
            n.tick(t as f64);
        }
    }

    #[test]
    fn two_stalled_streams_are_suspected_when_its_bytes_fill_the_window_and_a_third_makes_it_likely() {
        let mut n = Node::new();
        whole_upload(&mut n, 4);
        n.stall_target(1, 4.0);
        n.stall_target(2, 5.0);
        let mut events = Vec::new();
        for t in 6..=16 {
            n.second(1000, t as f64, false);
            events.extend(n.tick(t as f64));
        }
        // 38 MB carried, 4 MB of it into the two targets: more than the
        // 20 MiB window is pinned by something, one stream short of likely.
        assert_eq!(starved(&events), vec![(1, "suspected", 2)]);
        n.stall_target(3, 5.0);
        let mut more = Vec::new();
        for t in 17..=21 {
            n.second(1000, t as f64, false);
            more.extend(n.tick(t as f64));
        }
        assert_eq!(starved(&more), vec![(1, "likely", 3)], "emitted again when the confidence rises");
    }

    #[test]
    fn two_stalled_streams_whose_bytes_fit_in_the_window_are_not_flagged() {
        let mut n = Node::new();
        // 19 MB carried, 4 MB of it into the targets: 15 MB pinned, less
        // than the connection window: new streams still get credit.
        whole_upload(&mut n, 2);
        n.stall_target(1, 3.0);
        n.stall_target(2, 3.0);
        let mut events = Vec::new();
        for t in 4..=20 {
            n.second(1000, t as f64, false);
            events.extend(n.tick(t as f64));
        }
        assert!(starved(&events).is_empty(), "{:?}", starved(&events));
    }

    #[test]
    fn a_starved_connection_recovers_when_its_targets_go_and_bulk_flows() {
        let mut n = Node::new();
        n.connect(1000, 0.0);
        for t in 1..=3 {
            n.second(1000, t as f64, true);
            n.tick(t as f64);
        }
        for c in 1..=3 {
            n.stall_target(c, 3.0);
        }
        let mut events = Vec::new();
        for t in 4..=14 {
            n.second(1000, t as f64, false);
            events.extend(n.tick(t as f64));
        }
        assert_eq!(starved(&events).len(), 1);
        // --enforce (or the upstream fix) closes the targets; uploads resume.
        for c in 1..=3 {
            let mut k = n.socks.get(c).unwrap().k.clone();
            k.state = 7;
            n.socks.apply(Observation::Sock { at: s(14.5), change: SockChange::Destroyed, sample: k });
        }
        let mut after = Vec::new();
        for t in 15..=20 {
            n.second(1000, t as f64, true);
            after.extend(n.tick(t as f64));
        }
        let recovered: Vec<&Stamped> = after.iter().filter(|e| matches!(e.event, Event::QuicRecovered(_))).collect();
        assert_eq!(recovered.len(), 1, "exactly once, no flapping");
        assert!(starved(&after).is_empty());
    }

    #[test]
    fn with_two_clients_only_the_one_that_fed_the_stalled_targets_is_starved() {
        let mut n = Node::new();
        n.connect(1000, 0.0);
        n.connect(1001, 0.0);
        // Client 1001 uploaded early and went quiet long before; 1000 uploads
        // until its targets stall.
        for t in 1..=10 {
            n.second(1000, t as f64, true);
            n.second(1001, t as f64, t <= 2);
            n.tick(t as f64);
        }
        for c in 1..=3 {
            n.stall_target(c, 9.0 + c as f64 * 0.3);
        }
        let mut events = Vec::new();
        for t in 11..=25 {
            n.second(1000, t as f64, false);
            n.second(1001, t as f64, false);
            events.extend(n.tick(t as f64));
        }
        assert_eq!(starved(&events), vec![(1, "likely", 3)]);
    }

    #[test]
    fn many_slow_targets_are_not_stalled_so_nothing_is_starved() {
        let mut n = Node::new();
        n.connect(1000, 0.0);
        let mut events = Vec::new();
        for t in 1..=40 {
            n.second(1000, t as f64, t % 7 == 0);
            // Slow readers: blocked writers whose peers keep acknowledging.
            for c in 1..=5u64 {
                let k = SockSample {
                    cookie: c,
                    pid: PID,
                    outbound: true,
                    state: 1,
                    blocked_since: Some(s(1.0)),
                    last_ack: Some(s(t as f64)),
                    ..Default::default()
                };
                n.socks.apply(Observation::Sock { at: s(t as f64), change: SockChange::Poll, sample: k });
            }
            events.extend(n.tick(t as f64));
        }
        assert!(events.is_empty());
        assert_eq!(n.socks.counts(), [0, 5, 0], "all SLOW, none STALLED");
    }
}
