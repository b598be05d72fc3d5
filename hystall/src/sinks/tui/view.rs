//! Plain row data built from the core model, only for what is shown: every
//! connection row (there are few), but for sockets a small sort key each and
//! full rows only for the visible window. A paused dashboard keeps a `Frozen`
//! copy of everything instead of reading the model.

use std::collections::HashMap;
use std::time::Duration;

use crate::core::conns::{Conn, Grouping};
use crate::core::detector::Windows;
use crate::core::event::SocketInfo;
use crate::core::flows::Dir;
use crate::core::model::Model;
use crate::core::sockets::Socket;
use crate::core::time::Mono;
use crate::core::verdict::Verdict;

use super::events::LogLine;
use super::history::History;

/// Sort orders of the connections table (`s` cycles them).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ConnSort {
    /// Starved first (highest confidence, longest starved), then alive, then id.
    #[default]
    Verdict,
    Age,
    Up,
    Down,
    Id,
}

impl ConnSort {
    pub fn next(self) -> Self {
        match self {
            ConnSort::Verdict => ConnSort::Age,
            ConnSort::Age => ConnSort::Up,
            ConnSort::Up => ConnSort::Down,
            ConnSort::Down => ConnSort::Id,
            ConnSort::Id => ConnSort::Verdict,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            ConnSort::Verdict => "verdict",
            ConnSort::Age => "age",
            ConnSort::Up => "up",
            ConnSort::Down => "down",
            ConnSort::Id => "id",
        }
    }
}

/// Sort orders of the sockets table.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SockSort {
    /// STALLED first, then SLOW, each longest blocked first.
    #[default]
    Verdict,
    Blocked,
    Unsent,
    Owner,
    Cookie,
}

impl SockSort {
    pub fn next(self) -> Self {
        match self {
            SockSort::Verdict => SockSort::Blocked,
            SockSort::Blocked => SockSort::Unsent,
            SockSort::Unsent => SockSort::Owner,
            SockSort::Owner => SockSort::Cookie,
            SockSort::Cookie => SockSort::Verdict,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            SockSort::Verdict => "verdict",
            SockSort::Blocked => "blocked",
            SockSort::Unsent => "unsent",
            SockSort::Owner => "owner",
            SockSort::Cookie => "cookie",
        }
    }
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    pub conns: usize,
    pub alive: usize,
    pub starved: usize,
    pub sockets: usize,
    pub slow: usize,
    pub stalled: usize,
}

/// Settings of the model the views explain.
#[derive(Clone, Copy, Debug)]
pub struct Params {
    pub stall_timeout: Duration,
    pub windows: Windows,
    pub alive_window: Duration,
    pub bulk_quiet: Duration,
}

impl Params {
    pub fn of(model: &Model) -> Params {
        Params {
            stall_timeout: model.sockets.th.stall_timeout,
            windows: model.detector.cfg.windows,
            alive_window: model.detector.cfg.alive_window,
            bulk_quiet: model.detector.cfg.bulk_quiet,
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct TargetRow {
    pub cookie: u64,
    pub remote: String,
    /// What links it to the connection (`connect+bytes`, `api`...).
    pub evidence: String,
    pub no_progress_s: f64,
    pub unsent: Option<u32>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct StarvedRow {
    pub since_s: f64,
    pub confidence: &'static str,
    pub rank: u8,
    pub pid: Option<u32>,
    pub targets: Vec<TargetRow>,
    /// What the decrypted frames show (`--decrypt`, a capture with a key log).
    pub frames: Option<String>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct ConnRow {
    pub id: u64,
    pub client: String,
    pub server: String,
    pub ports: String,
    pub dcid: String,
    pub grouping: &'static str,
    pub hops: usize,
    pub age_s: f64,
    pub up_bps: f64,
    pub down_bps: f64,
    pub up_pps: f64,
    pub down_pps: f64,
    /// Client packets/s that are not full-size (ACKs, datagrams, pings).
    pub small_up_pps: f64,
    /// Client full-size packets/s (bulk stream data).
    pub bulk_up_pps: f64,
    pub alive: bool,
    /// Seconds since the last full-size client packet (None: never seen).
    pub bulk_quiet_s: Option<f64>,
    pub starved: Option<StarvedRow>,
}

impl ConnRow {
    pub fn build(c: &Conn, model: &Model, now: Mono, p: &Params) -> ConnRow {
        let ports: Vec<String> = c.server_ports().iter().map(|p| p.to_string()).collect();
        let ports = if ports.len() > 3 {
            format!("{}…{} ({})", ports[0], ports[ports.len() - 1], ports.len())
        } else {
            ports.join(",")
        };
        let r = c.rates(now);
        let starved = model.detector.get(c.id).map(|st| StarvedRow {
            since_s: now.since(st.since).as_secs_f64(),
            confidence: st.confidence.as_str(),
            rank: st.confidence as u8 + 1,
            pid: st.pid,
            targets: st
                .targets
                .iter()
                .map(|&(cookie, _)| {
                    let s = model.sockets.get(cookie);
                    TargetRow {
                        cookie,
                        remote: s.and_then(|s| s.remote()).map_or_else(|| "?".into(), |a| a.to_string()),
                        evidence: model
                            .attribution
                            .link(cookie)
                            .map(|l| l.evidence.names().join("+"))
                            .unwrap_or_default(),
                        no_progress_s: s
                            .and_then(|s| s.progress().no_progress_since())
                            .map_or(0.0, |q| now.since(q).as_secs_f64()),
                        unsent: s.and_then(|s| s.diag.as_ref().map(|d| d.notsent)),
                    }
                })
                .collect(),
            frames: c.frames.as_ref().map(|f| super::detail::frames_summary(f, now)),
        });
        let starved = starved.map(|mut s| {
            // The detector's order is a hash map's.
            s.targets.sort_by_key(|t| t.cookie);
            s
        });
        ConnRow {
            id: c.id,
            client: c.client().map_or_else(|| "?".into(), |a| a.to_string()),
            server: c.server().map_or_else(|| "?".into(), |a| a.to_string()),
            ports,
            dcid: c.dcid_hex().unwrap_or_else(|| "-".into()),
            grouping: match c.grouping {
                Grouping::Dcid => "dcid",
                Grouping::Obfuscated => "obfuscated",
                Grouping::FiveTuple => "5-tuple",
            },
            hops: c.hops(),
            age_s: now.since(c.first_seen).as_secs_f64(),
            up_bps: r.c2s_bps.iter().sum(),
            down_bps: r.s2c_bps.iter().sum(),
            up_pps: r.c2s_pps.iter().sum(),
            down_pps: r.s2c_pps.iter().sum(),
            small_up_pps: r.c2s_pps[0] + r.c2s_pps[1],
            bulk_up_pps: r.c2s_pps[2],
            alive: c.closed.is_none() && c.alive(now, p.alive_window),
            bulk_quiet_s: c.last_bulk(Dir::C2s).map(|b| now.since(b).as_secs_f64()),
            starved,
        }
    }

    pub fn matches(&self, filter: &str) -> bool {
        filter.is_empty() || {
            let hay = format!("{} {} {} {} {}", self.id, self.client, self.server, self.dcid, self.ports);
            hay.to_lowercase().contains(filter)
        }
    }
}

pub fn sort_conns(rows: &mut [ConnRow], sort: ConnSort) {
    let desc = |a: f64, b: f64| b.total_cmp(&a);
    rows.sort_unstable_by(|a, b| match sort {
        ConnSort::Verdict => {
            let ka = a.starved.as_ref().map_or((0, 0.0), |s| (s.rank, s.since_s));
            let kb = b.starved.as_ref().map_or((0, 0.0), |s| (s.rank, s.since_s));
            kb.0.cmp(&ka.0).then(desc(ka.1, kb.1)).then(b.alive.cmp(&a.alive)).then(a.id.cmp(&b.id))
        }
        ConnSort::Age => desc(a.age_s, b.age_s).then(a.id.cmp(&b.id)),
        ConnSort::Up => desc(a.up_bps, b.up_bps).then(a.id.cmp(&b.id)),
        ConnSort::Down => desc(a.down_bps, b.down_bps).then(a.id.cmp(&b.id)),
        ConnSort::Id => a.id.cmp(&b.id),
    });
}

#[derive(Clone, Debug, PartialEq)]
pub struct SockRow {
    pub info: SocketInfo,
    pub verdict: Verdict,
    /// The QUIC connection this target is linked to, or its candidates.
    pub conn: Option<LinkView>,
    pub action: String,
}

impl SockRow {
    pub fn build(s: &Socket, now: Mono, conn_of: &HashMap<u64, LinkView>, actions: &HashMap<u64, String>) -> Self {
        SockRow {
            info: s.info(now),
            verdict: s.verdict,
            conn: conn_of.get(&s.k.cookie).cloned(),
            action: actions.get(&s.k.cookie).cloned().unwrap_or_default(),
        }
    }

    pub fn key(&self) -> SockKey {
        SockKey {
            cookie: self.info.cookie,
            verdict: self.verdict,
            blocked_ms: self.info.blocked_ms,
            unsent: self.info.unsent_bytes.unwrap_or(0),
            pid: self.info.pid,
        }
    }

    pub fn matches(&self, filter: &str) -> bool {
        filter.is_empty() || {
            let i = &self.info;
            let hay = format!(
                "{} {} {} {} {} {} {}",
                i.comm,
                i.pid,
                i.local.as_deref().unwrap_or(""),
                i.remote.as_deref().unwrap_or(""),
                i.state,
                i.verdict,
                i.cookie
            );
            hay.to_lowercase().contains(filter)
        }
    }
}

/// What sockets are sorted by: no strings, cheap for 100k sockets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SockKey {
    pub cookie: u64,
    pub verdict: Verdict,
    pub blocked_ms: u64,
    pub unsent: u32,
    pub pid: u32,
}

impl SockKey {
    pub fn of(s: &Socket, now: Mono) -> SockKey {
        let end = s.closed.unwrap_or(now);
        SockKey {
            cookie: s.k.cookie,
            verdict: s.verdict,
            blocked_ms: s.progress().blocked_since.map_or(0, |b| end.since(b).as_millis() as u64),
            unsent: s.diag.as_ref().map_or(0, |d| d.notsent),
            pid: s.k.pid,
        }
    }

    /// Whether socket `s` matches a (lower-case) filter.
    pub fn socket_matches(s: &Socket, filter: &str) -> bool {
        if filter.is_empty() {
            return true;
        }
        let hay = format!(
            "{} {} {} {} {} {}",
            s.k.comm,
            s.k.pid,
            s.local().map(|a| a.to_string()).unwrap_or_default(),
            s.remote().map(|a| a.to_string()).unwrap_or_default(),
            s.verdict.as_str(),
            s.k.cookie
        );
        hay.to_lowercase().contains(filter)
    }
}

pub fn sort_keys<T>(items: &mut [T], sort: SockSort, key: impl Fn(&T) -> SockKey) {
    items.sort_unstable_by(|a, b| {
        let (a, b) = (key(a), key(b));
        match sort {
            SockSort::Verdict => b.verdict.cmp(&a.verdict).then(b.blocked_ms.cmp(&a.blocked_ms)),
            SockSort::Blocked => b.blocked_ms.cmp(&a.blocked_ms),
            SockSort::Unsent => b.unsent.cmp(&a.unsent),
            SockSort::Owner => a.pid.cmp(&b.pid),
            SockSort::Cookie => a.cookie.cmp(&b.cookie),
        }
        .then(a.cookie.cmp(&b.cookie))
    });
}

/// What the attribution says of a target socket.
#[derive(Clone, Debug, PartialEq)]
pub enum LinkView {
    /// Its QUIC connection, and the evidence that links it (`connect+bytes`).
    Linked(u64, String),
    /// No evidence tells which of these connections fed it.
    Unattributed(Vec<u64>),
}

/// Target socket → its link, for the targets the attribution follows.
pub fn conn_of(model: &Model) -> HashMap<u64, LinkView> {
    model
        .sockets
        .iter()
        .filter_map(|s| {
            let t = model.attribution.target(s.k.cookie)?;
            let v = match &t.link {
                Some(l) => LinkView::Linked(l.conn, l.evidence.names().join("+")),
                None if !t.maybe().is_empty() => LinkView::Unattributed(t.maybe().to_vec()),
                None => return None,
            };
            Some((s.k.cookie, v))
        })
        .collect()
}

pub fn counts(model: &Model, now: Mono, p: &Params) -> Counts {
    let [_, slow, stalled] = model.sockets.counts();
    Counts {
        conns: model.conns.len(),
        alive: model.conns.iter().filter(|c| c.closed.is_none() && c.alive(now, p.alive_window)).count(),
        starved: model.detector.starved().count(),
        sockets: model.sockets.len(),
        slow,
        stalled,
    }
}

/// Everything a paused dashboard shows, copied once when it was paused.
pub struct Frozen {
    pub at: Mono,
    pub params: Params,
    pub counts: Counts,
    pub conns: Vec<ConnRow>,
    pub socks: Vec<SockRow>,
    pub events: Vec<LogLine>,
    pub history: History,
}

impl Frozen {
    pub fn take(
        model: &Model,
        now: Mono,
        events: Vec<LogLine>,
        history: History,
        actions: &HashMap<u64, String>,
    ) -> Frozen {
        let params = Params::of(model);
        let conn_of = conn_of(model);
        Frozen {
            at: now,
            params,
            counts: counts(model, now, &params),
            conns: model.conns.iter().map(|c| ConnRow::build(c, model, now, &params)).collect(),
            socks: model.sockets.iter().map(|s| SockRow::build(s, now, &conn_of, actions)).collect(),
            events,
            history,
        }
    }
}
