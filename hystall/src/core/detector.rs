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

use super::attribution::{Attribution, Link, Shared, owner};
use super::conns::{Conn, ConnTable};
use super::event::{Event, Stamped, StarvedInfo, StarvedTarget};
use super::flows::Dir;
use super::frames::{BlockedStream, FrameEvidence, FrameState};
use super::model::conn_info;
use super::observation::ServerStream;
use super::sockets::SocketTable;
use super::time::Mono;
use super::verdict::Verdict;

mod proof;
use proof::StalledByProcess;
pub use proof::frame_proof;

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
    /// Of those, the ones it holds at least so many of whatever the split.
    pub shared: Option<Shared>,
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
        // What decrypted frames need beside them (`proof.rs`); only read
        // when some connection has frames.
        let framed = conns.framed().next().is_some();
        let mut by_process = StalledByProcess::default();
        if framed {
            for s in socks.iter().filter(|s| s.k.outbound) {
                by_process.seen(s.k.pid);
            }
        }
        for s in socks.iter().filter(|s| stalled(s.k.cookie)) {
            let Some(t) = links.target(s.k.cookie) else {
                if framed {
                    by_process.open(s.k.pid, &[]);
                }
                continue;
            };
            match &t.link {
                Some(l) => {
                    candidates.insert(l.conn);
                }
                None if !t.other_inbound => {
                    for &c in t.maybe() {
                        *maybe.entry(c).or_default() += 1;
                    }
                    if framed {
                        by_process.open(s.k.pid, t.maybe());
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
        // And those that may hold unattributed ones: they may hold enough
        // whatever the split (`Attribution::shared`).
        candidates.extend(maybe.keys());
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
            // Decrypted frames (a capture with keys, or --decrypt) prove it
            // when the limit held for the stall timeout and a stalled target
            // may be what holds it (`proof.rs`: slow targets never are).
            let pid = owner(c, owners);
            let hold = cfg.stall_timeout.max(cfg.bulk_quiet);
            let proof = c
                .frames
                .as_ref()
                .and_then(|f| frame_proof(f, now, hold, c.last_bulk(Dir::C2s)))
                .filter(|_| by_process.backs(pid, c.id, k));
            // Stalled targets it holds whatever the split, when clients that
            // started together leave open which is whose (`floors.rs`).
            let shared = links.shared(c.id).filter(|s| s.at_least > 0);
            let held = shared.as_ref().map_or(0, |s| s.at_least);
            // Its requests still reach the server: a target dialled for it
            // after its bulk stopped (tied by more than the connect's timing).
            let asks = links.linked_to(c.id).any(|t| {
                let fresh = links.target(t).and_then(|t| t.connect).is_some_and(|at| at > bulk);
                fresh && links.link(t).is_some_and(|l| l.evidence.api || l.evidence.reply || l.evidence.bytes)
            });
            if asks && proof.is_none() {
                continue;
            }
            let confidence = if proof.is_some() || exact >= need {
                Confidence::Confirmed
            } else if k + held >= need {
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
            now_starved.insert(
                c.id,
                Starved { conn: c.id, since, confidence, targets, pid, api, unattributed: unsure, shared },
            );
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
            shared_targets: st.shared.as_ref().map(|s| super::event::SharedTargets {
                at_least: s.at_least,
                targets: s.targets.clone(),
                with_conns: s.with.clone(),
            }),
            server_streams: st.api.clone(),
            frames: c.frames.as_ref().map(|f| frame_evidence(f, now)),
            targets,
        },
        reason,
    }
}

#[cfg(test)]
mod tests;
