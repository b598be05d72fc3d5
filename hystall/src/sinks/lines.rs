//! `watch` output: one line per event, human-readable or JSON (docs/EVENTS.md).

use std::io::Write;

use serde::Serialize;

use crate::core::event::{ConnInfo, Event, SCHEMA_VERSION, SocketInfo, Stamped, StarvedInfo};
use crate::core::time::WallClock;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    Text,
    Json,
}

pub struct Lines<W: Write> {
    out: W,
    format: Format,
    clock: WallClock,
    /// The lines of one call, written with one write: at node scale a tick
    /// brings hundreds of connection events, and a write (with the wake-up
    /// of the reader of a pipe) each was most of their cost.
    buf: Vec<u8>,
}

#[derive(Serialize)]
struct JsonLine<'a> {
    v: u32,
    ts: String,
    #[serde(flatten)]
    event: &'a Event,
}

impl<W: Write> Lines<W> {
    pub fn new(out: W, format: Format, clock: WallClock) -> Self {
        Lines { out, format, clock, buf: Vec::new() }
    }

    /// Writes one event and flushes (a reader of a pipe sees it at once).
    pub fn emit(&mut self, e: &Stamped) -> std::io::Result<()> {
        self.emit_all(std::slice::from_ref(e))
    }

    /// Writes events, a line each, then flushes once: the events of one tick
    /// reach a reader together, as they were judged.
    pub fn emit_all(&mut self, events: &[Stamped]) -> std::io::Result<()> {
        if events.is_empty() {
            return Ok(());
        }
        self.buf.clear();
        for e in events {
            match self.format {
                Format::Json => {
                    let j = JsonLine { v: SCHEMA_VERSION, ts: self.clock.rfc3339(e.at), event: &e.event };
                    serde_json::to_writer(&mut self.buf, &j).map_err(std::io::Error::other)?;
                    self.buf.push(b'\n');
                }
                Format::Text => writeln!(self.buf, "{} {}", &self.clock.rfc3339(e.at)[11..23], text(&e.event))?,
            }
        }
        self.out.write_all(&self.buf)?;
        // A burst (a node's first tick) must not keep its buffer for the run.
        if self.buf.capacity() > 1 << 20 {
            self.buf = Vec::new();
        }
        self.out.flush()
    }
}

fn sock_line(tag: &str, s: &SocketInfo) -> String {
    let unsent = s.unsent_bytes.map_or_else(|| "?".to_string(), human_bytes);
    format!(
        "{tag:<9} {comm}[{pid}] {local} -> {remote} {state} blocked {blocked:.1}s, no progress {quiet:.1}s, unsent {unsent}, peer window {win}, failed sends {failed}{sys} cookie={cookie}",
        comm = s.comm,
        pid = s.pid,
        local = s.local.as_deref().unwrap_or("?"),
        remote = s.remote.as_deref().unwrap_or("?"),
        state = s.state,
        blocked = s.blocked_ms as f64 / 1000.0,
        quiet = s.no_progress_ms as f64 / 1000.0,
        win = s.peer_window,
        failed = s.failed_sends,
        sys = if s.in_syscall { ", writer parked in send()" } else { "" },
        cookie = s.cookie,
    )
}

/// What decrypted frames add to a starved line.
fn frames_part(f: &crate::core::frames::FrameEvidence) -> String {
    let streams: Vec<String> =
        f.blocked_streams.iter().map(|b| format!("{}@{}", b.id, human_bytes(b.offset))).collect();
    format!(
        "; frames: client sent {} of {} allowed{}, streams held {}",
        human_bytes(f.client_consumed),
        human_bytes(f.max_data.max(f.data_blocked_limit.unwrap_or(0))),
        f.data_blocked_limit.map(|l| format!(", DATA_BLOCKED at {}", human_bytes(l))).unwrap_or_default(),
        if streams.is_empty() { "unknown".to_string() } else { streams.join(" ") }
    )
}

fn starved_line(tag: &str, s: &StarvedInfo) -> String {
    let e = &s.evidence;
    let targets: Vec<String> = e
        .targets
        .iter()
        .map(|t| format!("{} (by {})", t.remote.as_deref().unwrap_or("?"), t.evidence.join("+")))
        .collect();
    format!(
        concat!(
            "{tag:<9} conn {id} {client} -> {server} [{conf}] {owner}: no client stream data for {quiet:.1}s ",
            "while {small:.0} small pkt/s up and {down:.0} pkt/s down still flow; {k} stalled target(s) hold it ",
            "(it takes {need} of {sw} MiB to fill {cw} MiB): {targets}{shared}, {unsent} unsent{frames}{reason}"
        ),
        frames = e.frames.as_ref().map(frames_part).unwrap_or_default(),
        // Targets it holds some of, not its own: "at least 4 of these 8, with conn 2".
        shared = e
            .shared_targets
            .as_ref()
            .map(|sh| {
                let with: Vec<String> = sh.with_conns.iter().map(|c| c.to_string()).collect();
                format!(
                    "; and at least {} of these {} shared with conn {}: {:?}",
                    sh.at_least,
                    sh.targets.len(),
                    with.join(", "),
                    sh.targets
                )
            })
            .unwrap_or_default(),
        tag = tag,
        targets = targets.join(", "),
        id = s.conn,
        client = s.client.as_deref().unwrap_or("?"),
        server = s.server.as_deref().unwrap_or("?"),
        conf = s.confidence,
        owner = s.pid.map_or_else(|| "owner unknown".to_string(), |p| format!("{}[{p}]", s.comm)),
        quiet = e.client_bulk_quiet_ms as f64 / 1000.0,
        small = e.client_small_pps,
        down = e.server_pps,
        k = e.stalled_targets,
        need = e.streams_to_exhaust,
        sw = e.stream_window >> 20,
        cw = e.conn_window >> 20,
        unsent = human_bytes(e.unsent_bytes),
        reason = s.reason.map(|r| format!("; recovered: {r}")).unwrap_or_default(),
    )
}

fn conn_line(tag: &str, c: &ConnInfo) -> String {
    format!(
        "{tag:<9} conn {id} {client} -> {server} dcid {dcid} ({grouping}{hops}) up {up} in {upp} pkts, down {down} in {downp} pkts{reason}",
        id = c.conn,
        client = c.client.as_deref().unwrap_or("?"),
        server = c.server.as_deref().unwrap_or("?"),
        dcid = c.dcid.as_deref().unwrap_or("-"),
        grouping = if c.obfuscated { "obfuscated: grouped by 5-tuple" } else { c.grouping },
        hops = if c.hops > 0 { format!(", {} port hops", c.hops) } else { String::new() },
        up = human_bytes(c.c2s_bytes),
        upp = c.c2s_packets,
        down = human_bytes(c.s2c_bytes),
        downp = c.s2c_packets,
        reason = c.reason.map(|r| format!(", closed: {r}")).unwrap_or_default(),
    )
}

fn text(e: &Event) -> String {
    match e {
        Event::WatchStarted(i) => {
            let who = if i.all_processes {
                "every process (no --pid/--comm given and no known proxy running)".to_string()
            } else {
                let mut parts: Vec<String> = i.pids.iter().map(|p| p.to_string()).collect();
                parts.extend(i.comms.iter().map(|c| format!("comm={c}")));
                parts.join(", ")
            };
            let attached: Vec<&str> = i.probes.iter().filter(|p| p.attached).map(|p| p.name.as_str()).collect();
            let mut s = format!(
                "WATCHING  {who}; stall timeout {:.1}s; probes: {}",
                i.stall_timeout_ms as f64 / 1000.0,
                attached.join(" ")
            );
            if let Some(sp) = &i.send_path {
                s.push_str(&format!("\n          SENDS {}: {}", sp.path, sp.note));
            }
            for p in i.probes.iter().filter(|p| !p.attached) {
                let tag = if crate::sources::kernel::probes::is_waiting(p) { "ON DEMAND" } else { "DEGRADED" };
                s.push_str(&format!("\n          {tag} {}: {}", p.name, p.note.as_deref().unwrap_or("not attached")));
            }
            if let Some(q) = &i.quic {
                s.push_str(&format!("\n          {}", q.summary()));
            }
            if let Some(d) = &i.decrypt {
                s.push_str(&format!("\n          DECRYPT {}", d.summary()));
            }
            for w in &i.warnings {
                s.push_str(&format!("\n          WARNING {w}"));
            }
            s
        }
        Event::QuicPortsChanged(q) => format!("QUIC PORTS  {} ({})", q.summary(), q.reason),
        Event::DecryptChanged(d) => format!("DECRYPT     {}", d.summary()),
        Event::SocketStalled(s) => sock_line("STALLED", s),
        Event::SocketRecovered(s) => sock_line("RECOVERED", s),
        Event::SocketClosed(s) => sock_line("CLOSED", s),
        Event::QuicConnOpened(c) => conn_line("QUIC+", c),
        Event::QuicConnClosed(c) => conn_line("QUIC-", c),
        Event::QuicStarved(s) => starved_line("STARVED", s),
        Event::QuicRecovered(s) => starved_line("UNSTARVED", s),
        Event::Enforced(e) => {
            let what = if e.dry_run { "would destroy (dry-run)" } else { e.action };
            format!("{} -> {}", sock_line(&format!("ENFORCE {what}:"), &e.socket), e.result)
        }
    }
}

pub fn human_bytes(n: impl Into<u64>) -> String {
    let n = n.into() as f64;
    if n >= 1024.0 * 1024.0 * 1024.0 {
        format!("{:.1} GiB", n / 1024.0 / 1024.0 / 1024.0)
    } else if n >= 1024.0 * 1024.0 {
        format!("{:.1} MiB", n / 1024.0 / 1024.0)
    } else if n >= 1024.0 {
        format!("{:.1} KiB", n / 1024.0)
    } else {
        format!("{n} B")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::time::Mono;

    fn stalled() -> Stamped {
        Stamped {
            at: Mono(1_000_000_000),
            event: Event::SocketStalled(SocketInfo {
                pid: 42,
                comm: "sing-box".into(),
                cookie: 7,
                local: Some("127.0.0.1:40000".into()),
                remote: Some("127.0.0.1:9000".into()),
                state: "ESTABLISHED",
                verdict: "STALLED",
                outbound: true,
                blocked_ms: 10_250,
                no_progress_ms: 10_000,
                unsent_bytes: Some(3_900_000),
                send_q: Some(4_000_000),
                peer_window: 0,
                failed_sends: 1,
                send_bytes: 8_000_000,
                acked_bytes: 4_000_000,
                in_syscall: false,
            }),
        }
    }

    #[test]
    fn json_line_has_version_time_and_event_name() {
        let mut buf = Vec::new();
        Lines::new(&mut buf, Format::Json, WallClock::fixed(1_764_680_644_000_000_000)).emit(&stalled()).unwrap();
        let v: serde_json::Value = serde_json::from_slice(&buf).unwrap();
        assert_eq!(v["v"], 1);
        assert_eq!(v["ts"], "2025-12-02T13:04:05.000Z");
        assert_eq!(v["event"], "socket_stalled");
        for key in ["pid", "comm", "cookie", "local", "remote", "blocked_ms", "unsent_bytes", "peer_window"] {
            assert!(v.get(key).is_some(), "missing {key}: {v}");
        }
        assert_eq!(v["unsent_bytes"], 3_900_000);
    }

    /// A writer that counts the writes it gets.
    #[derive(Default)]
    struct Writes {
        n: usize,
        bytes: Vec<u8>,
    }

    impl Write for Writes {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.n += 1;
            self.bytes.extend_from_slice(b);
            Ok(b.len())
        }

        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_tick_of_events_is_one_write_of_a_line_each() {
        let events: Vec<Stamped> = (0..300).map(|_| stalled()).collect();
        for format in [Format::Json, Format::Text] {
            let mut w = Writes::default();
            Lines::new(&mut w, format, WallClock::fixed(0)).emit_all(&events).unwrap();
            assert_eq!(w.n, 1, "{format:?}");
            let lines: Vec<&[u8]> = w.bytes.split(|b| *b == b'\n').filter(|l| !l.is_empty()).collect();
            assert_eq!(lines.len(), 300, "{format:?}");
            if format == Format::Json {
                for l in lines {
                    let v: serde_json::Value = serde_json::from_slice(l).unwrap();
                    assert_eq!(v["event"], "socket_stalled");
                }
            }
        }
    }

    #[test]
    fn text_line_says_what_and_where() {
        let mut buf = Vec::new();
        Lines::new(&mut buf, Format::Text, WallClock::fixed(0)).emit(&stalled()).unwrap();
        let s = String::from_utf8(buf).unwrap();
        assert!(s.starts_with("00:00:01.000 STALLED   sing-box[42] 127.0.0.1:40000 -> 127.0.0.1:9000"), "{s}");
        assert!(s.contains("unsent 3.7 MiB"), "{s}");
    }
}
