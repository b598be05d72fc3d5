//! `hystall pcap`: the readable report of a capture — per QUIC connection its
//! verdict, when stream data stopped, what kept flowing, the frame evidence
//! when decrypted, the stalled targets, and a one-line timeline.

use std::fmt::Write as _;

use serde::Serialize;

use crate::core::event::{Event, Stamped};
use crate::core::frames::FrameState;
use crate::core::series::Series;
use crate::core::time::{Mono, WallClock};
use crate::sinks::lines::human_bytes;

/// Everything the report (and the picture) shows of one capture.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Report {
    pub file: String,
    pub start: Mono,
    pub end: Mono,
    pub packets: u64,
    pub udp: u64,
    pub tcp: u64,
    pub skipped: Vec<(String, u64)>,
    /// UDP datagrams not on a QUIC server's flow (no handshake seen, no --port).
    pub unplaced_udp: u64,
    pub gso_split: u64,
    /// Records whose timestamp jumped a day or more ahead (taken at the last time).
    pub time_jumps: u64,
    pub servers: Vec<String>,
    pub keylog_entries: usize,
    pub keylog_skipped: usize,
    pub error: Option<String>,
    /// Seconds per bucket in the series.
    pub bucket_secs: f64,
    pub conns: Vec<ConnReport>,
    #[serde(skip)]
    pub events: Vec<Stamped>,
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct ConnReport {
    pub conn: u64,
    pub client: String,
    pub server: String,
    pub dcid: Option<String>,
    pub grouping: String,
    pub hops: usize,
    pub first: Mono,
    pub last: Mono,
    pub c2s_bytes: u64,
    pub s2c_bytes: u64,
    pub verdict: Option<Verdict>,
    /// Bytes per bucket: [c2s full-size, c2s other, s2c full-size, s2c other].
    #[serde(skip)]
    pub series: Series<[u32; 4]>,
    /// Decrypted new stream bytes per bucket: [c2s, s2c].
    #[serde(skip)]
    pub stream_series: Option<Series<[u32; 2]>>,
    pub frames: Option<FrameState>,
    pub decrypt: Option<DecryptFigures>,
    /// Gaps of a second or more with no packet either way: (start, seconds).
    pub gaps: Vec<(Mono, f64)>,
    /// What headers alone suggest when there is no verdict (no keys, no targets).
    pub note: Option<String>,
}

impl ConnReport {
    /// `starved`, `not_starved`, or `cannot_tell`: no verdict, but the client's
    /// bulk stopped while the connection lived on, and nothing in the capture
    /// (frames, targets) says whether it was starved or idle (`note` says
    /// what would tell).
    pub fn verdict_word(&self) -> &'static str {
        match (&self.verdict, &self.note) {
            (Some(_), _) => "starved",
            (None, Some(_)) => "cannot_tell",
            (None, None) => "not_starved",
        }
    }
}

#[derive(Clone, Debug, Serialize)]
pub struct Verdict {
    pub confidence: String,
    /// When client stream data stopped.
    pub since: Mono,
    pub recovered: Option<(Mono, String)>,
    pub targets: Vec<String>,
}

#[derive(Clone, Debug, Serialize)]
pub struct DecryptFigures {
    pub opened: u64,
    pub auth_failed: u64,
    pub no_keys: u64,
    pub secrets_found: bool,
    pub key_updates: [u32; 2],
}

fn secs(r: &Report, t: Mono) -> f64 {
    t.since(r.start).as_secs_f64()
}

pub fn text(r: &Report, clock: &WallClock) -> String {
    let mut o = String::new();
    let dur = r.end.since(r.start).as_secs_f64();
    let _ = writeln!(
        o,
        "{}: {:.1} s from {}, {} packets (UDP {}, TCP {}), {} skipped",
        r.file,
        dur,
        clock.rfc3339(r.start),
        r.packets,
        r.udp,
        r.tcp,
        r.skipped.iter().map(|(_, n)| n).sum::<u64>()
    );
    for (why, n) in &r.skipped {
        let _ = writeln!(o, "  skipped {n}: {why}");
    }
    if let Some(e) = &r.error {
        let _ = writeln!(o, "  the file is damaged: {e}; the report covers what came before");
    }
    if r.unplaced_udp > 0 {
        let _ = writeln!(
            o,
            "  {} UDP datagrams not on a QUIC server flow (no handshake in the capture: give --port to include them)",
            r.unplaced_udp
        );
    }
    if r.time_jumps > 0 {
        let _ = writeln!(
            o,
            "  {} records with a timestamp a day or more ahead of the one before: taken at that time",
            r.time_jumps
        );
    }
    if r.gso_split > 0 {
        let _ = writeln!(o, "  {} GSO super-packets split into datagrams", r.gso_split);
    }
    match (r.keylog_entries, r.keylog_skipped) {
        (0, 0) => {
            let _ = writeln!(o, "  no key log: verdicts from headers, timing and TCP (give --keylog to confirm)");
        }
        (0, s) => {
            let _ = writeln!(o, "  key log: no usable secrets ({s} lines skipped)");
        }
        (n, s) => {
            let _ = writeln!(
                o,
                "  key log: {n} TLS connection(s){}",
                if s > 0 { format!(", {s} lines skipped") } else { String::new() }
            );
        }
    }
    let _ =
        writeln!(o, "QUIC servers: {}", if r.servers.is_empty() { "none found".into() } else { r.servers.join(", ") });
    if r.conns.is_empty() {
        let _ = writeln!(o, "\nno QUIC connection in this capture");
    }
    for c in &r.conns {
        let _ = writeln!(o);
        let _ = writeln!(
            o,
            "connection {} {} -> {}{}{}",
            c.conn,
            c.client,
            c.server,
            c.dcid.as_ref().map(|d| format!(" dcid {d}")).unwrap_or_default(),
            if c.hops > 0 { format!(", {} port hop(s)", c.hops) } else { String::new() }
        );
        let _ = writeln!(
            o,
            "  seen +{:.1}s .. +{:.1}s; up {}, down {} ({} grouping)",
            secs(r, c.first),
            secs(r, c.last),
            human_bytes(c.c2s_bytes),
            human_bytes(c.s2c_bytes),
            c.grouping
        );
        match &c.verdict {
            Some(v) => {
                let _ = writeln!(
                    o,
                    "  verdict: STARVED ({}) — client stream data stopped at {} (+{:.2}s){}",
                    v.confidence,
                    &clock.rfc3339(v.since)[11..23],
                    secs(r, v.since),
                    match &v.recovered {
                        Some((t, why)) => format!("; recovered at +{:.2}s: {why}", secs(r, *t)),
                        None => format!(", still starved at the end ({:.1} s)", r.end.since(v.since).as_secs_f64()),
                    }
                );
                if !v.targets.is_empty() {
                    let _ = writeln!(o, "  stalled targets: {}", v.targets.join(", "));
                }
            }
            None => match &c.note {
                Some(n) => {
                    let _ = writeln!(o, "  verdict: cannot tell without keys");
                    let _ = writeln!(o, "  note: {n}");
                }
                None => {
                    let _ = writeln!(o, "  verdict: not starved");
                }
            },
        }
        if let Some(f) = &c.frames {
            evidence(&mut o, r, f);
        }
        if let Some(d) = &c.decrypt {
            let _ = writeln!(
                o,
                "  decryption: {} packets opened, {} failed, {} without keys{}{}",
                d.opened,
                d.auth_failed,
                d.no_keys,
                if d.secrets_found { "" } else { " (no matching secrets in the key log)" },
                if d.key_updates != [0, 0] { format!(", key updates {:?}", d.key_updates) } else { String::new() }
            );
        }
        for (at, len) in c.gaps.iter().take(5) {
            let _ = writeln!(o, "  idle gap: {len:.1} s from +{:.1}s", secs(r, *at));
        }
        let _ = writeln!(o, "  up   {}", spark(&c.series, c.stream_series.as_ref(), 0));
        let _ = writeln!(o, "  down {}", spark(&c.series, c.stream_series.as_ref(), 1));
    }
    o
}

fn evidence(o: &mut String, r: &Report, f: &FrameState) {
    let when = |t: Option<Mono>| t.map_or("never".to_owned(), |t| format!("+{:.2}s", secs(r, t)));
    let _ = writeln!(
        o,
        "  frames up: {} of stream data in {} STREAM frames (last new data {}), {} ACK (last {}), {} DATAGRAM (last {})",
        human_bytes(f.stream_bytes[0]),
        f.stream_frames[0],
        when(f.last_stream[0]),
        f.acks[0],
        when(f.last_ack[0]),
        f.datagrams[0],
        when(f.last_datagram[0])
    );
    let _ = writeln!(
        o,
        "  frames down: {} of stream data, {} ACK (last {}), {} DATAGRAM (last {})",
        human_bytes(f.stream_bytes[1]),
        f.acks[1],
        when(f.last_ack[1]),
        f.datagrams[1],
        when(f.last_datagram[1])
    );
    let _ = writeln!(
        o,
        "  flow control: the client sent {} against the server's MAX_DATA {} (last raised {}); DATA_BLOCKED x{}{}; STREAM_DATA_BLOCKED x{}; MAX_STREAM_DATA x{}",
        human_bytes(f.client_consumed),
        f.server_max_data.map_or("unknown".into(), human_bytes),
        when(f.max_data_raised),
        f.data_blocked_frames,
        f.data_blocked
            .map(|(l, first, _)| format!(" at {} from {}", human_bytes(l), when(Some(first))))
            .unwrap_or_default(),
        f.stream_data_blocked,
        f.max_stream_data
    );
    let held = f.held_streams(crate::core::time::Mono(u64::MAX));
    if !held.is_empty() {
        let shown: Vec<String> = held
            .iter()
            .take(8)
            .map(|s| {
                let at = s.blocked_at.map(|l| format!(", blocked at {}", human_bytes(l))).unwrap_or_default();
                format!("{} ({}{at})", s.id, human_bytes(s.offset))
            })
            .collect();
        let more = held.len().saturating_sub(shown.len());
        let more = if more > 0 { format!(" and {more} more") } else { String::new() };
        let _ = writeln!(o, "  client streams open at the end: {}{more}", shown.join(", "));
    }
    let _ = writeln!(
        o,
        "  RESET_STREAM {} up / {} down, STOP_SENDING {} / {}, CONNECTION_CLOSE {} / {}{}",
        f.reset_stream[0],
        f.reset_stream[1],
        f.stop_sending[0],
        f.stop_sending[1],
        f.connection_close[0],
        f.connection_close[1],
        f.suite.as_ref().map(|s| format!("; cipher {s}")).unwrap_or_default()
    );
}

/// One character per group of buckets: '#' stream (or full-size) data, '.'
/// only other packets, ' ' nothing; at most 100 characters.
fn spark(series: &Series<[u32; 4]>, stream: Option<&Series<[u32; 2]>>, dir: usize) -> String {
    let n = series.end().max(stream.map_or(0, Series::end));
    let per = n.div_ceil(100).max(1);
    (0..n.div_ceil(per))
        .map(|g| {
            let range = g * per..((g + 1) * per).min(n);
            let data: u64 = match stream {
                Some(s) => range.clone().map(|i| u64::from(s.get(i)[dir])).sum(),
                None => range.clone().map(|i| u64::from(series.get(i)[dir * 2])).sum(),
            };
            let any: u64 =
                range.map(|i| series.get(i)).map(|b| u64::from(b[dir * 2]) + u64::from(b[dir * 2 + 1])).sum();
            if data > 0 {
                '#'
            } else if any > 0 {
                '.'
            } else {
                ' '
            }
        })
        .collect::<String>()
        + "|"
}

/// The verdicts of a capture, from its events (the last word per connection).
pub fn verdicts(events: &[Stamped]) -> std::collections::HashMap<u64, Verdict> {
    let mut out: std::collections::HashMap<u64, Verdict> = std::collections::HashMap::new();
    for e in events {
        match &e.event {
            Event::QuicStarved(i) => {
                let since = Mono(e.at.0.saturating_sub(i.since_ms * 1_000_000));
                let v = out.entry(i.conn).or_insert(Verdict {
                    confidence: String::new(),
                    since,
                    recovered: None,
                    targets: Vec::new(),
                });
                // Starved again after a recovery: a new episode, from its own start.
                if v.recovered.is_some() {
                    v.since = since;
                }
                v.confidence = i.confidence.to_owned();
                v.recovered = None;
                v.targets = i
                    .evidence
                    .targets
                    .iter()
                    .map(|t| format!("{} -> {}", t.local.as_deref().unwrap_or("?"), t.remote.as_deref().unwrap_or("?")))
                    .collect();
            }
            Event::QuicRecovered(i) => {
                if let Some(v) = out.get_mut(&i.conn) {
                    v.recovered = Some((e.at, i.reason.unwrap_or("recovered").to_owned()));
                }
            }
            _ => {}
        }
    }
    out
}
