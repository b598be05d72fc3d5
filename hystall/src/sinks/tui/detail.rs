//! The detail view of one connection or socket: per-second timelines (so the
//! moment stream data stopped shows) and the evidence behind the verdict, in
//! plain words.

use ratatui::Frame;
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Borders, Paragraph, Sparkline, Wrap};

use crate::core::time::Mono;
use crate::core::verdict::Verdict;
use crate::sinks::lines::human_bytes;

use super::history::{C2S_BULK, C2S_SMALL, History, S2C_BULK, S2C_SMALL};
use super::theme::Theme;
use super::view::{ConnRow, LinkView, Params, SockRow};
use super::{fmt_age, fmt_secs};

/// What the detail view shows.
#[derive(Clone, Debug, PartialEq)]
pub enum Detail {
    Conn(ConnRow),
    Sock(SockRow),
    /// The connection or socket is gone.
    Gone(String),
}

struct Series {
    label: String,
    data: Vec<u64>,
    unit: fn(u64) -> String,
}

fn pkts(v: u64) -> String {
    format!("{v} pkt/s")
}

fn bytes_s(v: u64) -> String {
    format!("{}/s", human_bytes(v))
}

fn bytes(v: u64) -> String {
    human_bytes(v)
}

/// One line of what a connection's decrypted frames show.
pub fn frames_summary(f: &crate::core::frames::FrameState, now: crate::core::time::Mono) -> String {
    let limit = match (f.server_max_data, f.data_blocked) {
        (_, Some((l, _, _))) => format!("DATA_BLOCKED at {}", bytes(l)),
        (Some(m), None) => format!("MAX_DATA {}", bytes(m)),
        (None, None) => "no limit read".into(),
    };
    let quiet = f.last_stream[0]
        .map_or_else(|| "none read".into(), |t| format!("{} ago", fmt_secs(now.since(t).as_secs_f64())));
    let held: Vec<String> =
        f.held_streams(now).iter().take(6).map(|s| format!("{} ({})", s.id, bytes(s.offset))).collect();
    format!(
        "Frames (decrypted): the client sent {} ({limit}); last new STREAM data {quiet}; {} ACK, {} DATAGRAM up; open streams: {}.",
        bytes(f.client_consumed),
        f.acks[0],
        f.datagrams[0],
        if held.is_empty() { "none read".to_string() } else { held.join(", ") }
    )
}

pub fn conn_evidence(r: &ConnRow, p: &Params) -> Vec<String> {
    let mut out = Vec::new();
    let w = p.windows;
    match &r.starved {
        Some(s) => {
            out.push(format!(
                "STARVED ({}): client stream data stopped {} ago (no full-size client packets) while ACKs/datagrams keep flowing ({:.0} pkt/s up, {:.0} pkt/s down).",
                s.confidence,
                fmt_secs(s.since_s),
                r.small_up_pps,
                r.down_pps
            ));
            let need = w.streams_to_exhaust();
            if s.targets.is_empty() && s.frames.is_some() {
                out.push(
                    "Its own frames prove it (below); no stalled target is tied to it yet (a target counts once its sends made no progress for the stall timeout).".into(),
                );
            } else {
                out.push(format!(
                "{} stalled target{} hold it: it takes {need} × {} MiB to fill the {} MiB connection window{}.",
                s.targets.len(),
                if s.targets.len() == 1 { "" } else { "s" },
                w.stream >> 20,
                w.conn >> 20,
                if s.targets.len() < need { " (one more stalled stream starves it for sure)" } else { "" }
                ));
            }
            if !s.targets.is_empty() {
                let t: Vec<String> = s
                    .targets
                    .iter()
                    .map(|t| {
                        format!(
                            "{} (by {}, no progress {}, {} unsent)",
                            t.remote,
                            t.evidence,
                            fmt_secs(t.no_progress_s),
                            t.unsent.map_or_else(|| "?".into(), human_bytes)
                        )
                    })
                    .collect();
                out.push(format!("Targets: {}.", t.join(", ")));
            }
            if let Some(f) = &s.frames {
                out.push(f.clone());
            }
            if let Some(pid) = s.pid {
                out.push(format!("Server process: pid {pid}."));
            }
        }
        None if !r.alive => out.push(format!(
            "Idle: no packets both ways within the last {}; not starved.",
            fmt_secs(p.alive_window.as_secs_f64())
        )),
        None => match r.bulk_quiet_s {
            Some(q) if q < p.bulk_quiet.as_secs_f64() => out.push(format!(
                "OK: client stream data flows (last full-size client packet {} ago, {:.0} pkt/s).",
                fmt_secs(q),
                r.bulk_up_pps
            )),
            quiet => out.push(format!(
                "OK: no client bulk {}, but not enough stalled targets are attributed to it ({} needed): a quiet connection, not a starved one.",
                quiet.map_or_else(|| "seen since hystall attached".to_string(), |q| format!("for {}", fmt_secs(q))),
                w.streams_to_exhaust()
            )),
        },
    }
    out.push(format!(
        "Server {} (ports {}), DCID {} (grouped by {}){}, age {}; now {:.0} pkt/s up ({:.0} full-size), {:.0} pkt/s down.",
        r.server,
        r.ports,
        r.dcid,
        r.grouping,
        if r.hops > 0 { format!(", {} port hops", r.hops) } else { String::new() },
        fmt_age(r.age_s),
        r.up_pps,
        r.bulk_up_pps,
        r.down_pps
    ));
    out
}

pub fn sock_evidence(r: &SockRow, p: &Params) -> Vec<String> {
    let s = &r.info;
    let mut out = Vec::new();
    let why = if s.in_syscall {
        "the writer is parked inside send()".to_string()
    } else {
        format!("{} failed sends", s.failed_sends)
    };
    match r.verdict {
        Verdict::Stalled => out.push(format!(
            "STALLED: the writer has been blocked for {} ({why}) and nothing moved for {} (no send accepted bytes, the peer acknowledged nothing new), beyond the {} stall timeout.",
            fmt_secs(s.blocked_ms as f64 / 1000.0),
            fmt_secs(s.no_progress_ms as f64 / 1000.0),
            fmt_secs(p.stall_timeout.as_secs_f64())
        )),
        Verdict::Slow => out.push(format!(
            "SLOW: the writer has been blocked for {} ({why}) but data still moves (last progress {} ago): a slow reader, not a stalled one.",
            fmt_secs(s.blocked_ms as f64 / 1000.0),
            fmt_secs(s.no_progress_ms as f64 / 1000.0)
        )),
        Verdict::Ok if s.blocked_ms > 0 => out.push(format!(
            "OK: the writer is blocked for {} only ({why}).",
            fmt_secs(s.blocked_ms as f64 / 1000.0)
        )),
        Verdict::Ok => out.push("OK: the writer is not blocked; its sends complete.".into()),
    }
    out.push(format!(
        "Peer window {}{}; unsent {}, Send-Q {}; {} sent, {} acknowledged while watched.",
        s.peer_window,
        if s.peer_window == 0 { " (the peer reads nothing)" } else { "" },
        s.unsent_bytes.map_or_else(|| "?".into(), human_bytes),
        s.send_q.map_or_else(|| "?".into(), human_bytes),
        human_bytes(s.send_bytes),
        human_bytes(s.acked_bytes)
    ));
    match &r.conn {
        Some(LinkView::Linked(c, evidence)) => out.push(format!("Fed by QUIC connection {c} (linked by {evidence}).")),
        Some(LinkView::Unattributed(cands)) => {
            let cands: Vec<String> = cands.iter().map(u64::to_string).collect();
            out.push(format!(
                "Unattributed: no evidence tells which QUIC connection fed it (it may be {}); it counts for none.",
                cands.join(", ")
            ))
        }
        None => {}
    }
    if !r.action.is_empty() {
        out.push(format!("Action taken: {}.", r.action));
    }
    out
}

pub fn draw(f: &mut Frame, area: Rect, d: &Detail, h: &History, now: Mono, p: &Params, theme: &Theme) {
    let width = area.width.saturating_sub(2) as usize;
    let (title, series, evidence) = match d {
        Detail::Gone(what) => {
            let block = Block::default().borders(Borders::ALL).title(" Detail ");
            let text = format!("{what} is gone. Esc or Enter: back.");
            f.render_widget(Paragraph::new(text).block(block), area);
            return;
        }
        Detail::Conn(r) => {
            let bulk = h.conn_series(r.id, C2S_BULK, now, width);
            let small = h.conn_series(r.id, C2S_SMALL, now, width);
            let down: Vec<u64> = h
                .conn_series(r.id, S2C_BULK, now, width)
                .iter()
                .zip(h.conn_series(r.id, S2C_SMALL, now, width))
                .map(|(a, b)| a + b)
                .collect();
            let mut series = vec![
                Series { label: "client bulk (full-size) pkt/s".into(), data: bulk, unit: pkts },
                Series { label: "client small (ACKs, datagrams) pkt/s".into(), data: small, unit: pkts },
                Series { label: "server pkt/s".into(), data: down, unit: pkts },
            ];
            if let Some(s) = &r.starved
                && !s.targets.is_empty()
            {
                let mut acked = vec![0u64; width];
                for t in &s.targets {
                    for (a, v) in acked.iter_mut().zip(h.sock_series(t.cookie, now, width, |b| b.acked as u64)) {
                        *a += v;
                    }
                }
                series.push(Series { label: "stalled targets: bytes acked/s".into(), data: acked, unit: bytes_s });
            }
            let title = format!(" Connection {}: {} → {} ", r.id, r.client, r.server);
            (title, series, conn_evidence(r, p))
        }
        Detail::Sock(r) => {
            let c = r.info.cookie;
            let series = vec![
                Series {
                    label: "bytes acked/s".into(),
                    data: h.sock_series(c, now, width, |b| b.acked as u64),
                    unit: bytes_s,
                },
                Series {
                    label: "bytes sent/s".into(),
                    data: h.sock_series(c, now, width, |b| b.sent as u64),
                    unit: bytes_s,
                },
                Series {
                    label: "unsent bytes".into(),
                    data: h.sock_series(c, now, width, |b| b.unsent as u64),
                    unit: bytes,
                },
            ];
            let i = &r.info;
            let title = format!(
                " Socket {}[{}] {} → {} (cookie {c}) ",
                i.comm,
                i.pid,
                i.local.as_deref().unwrap_or("?"),
                i.remote.as_deref().unwrap_or("?")
            );
            (title, series, sock_evidence(r, p))
        }
    };
    let block = Block::default()
        .borders(Borders::ALL)
        .border_style(theme.border(true))
        .title(title)
        .title_bottom(format!(" one column per second, newest right ({}s shown) · Esc/Enter: back ", width));
    let inner = block.inner(area);
    f.render_widget(block, area);

    // Each series: a label line and a 2-line sparkline; the evidence below.
    let spark_h: u16 = if inner.height >= 20 { 3 } else { 1 };
    let mut constraints: Vec<Constraint> = Vec::new();
    for _ in &series {
        constraints.push(Constraint::Length(1));
        constraints.push(Constraint::Length(spark_h));
    }
    constraints.push(Constraint::Min(2));
    let areas = Layout::vertical(constraints).split(inner);
    for (i, s) in series.iter().enumerate() {
        let cur = s.data.last().copied().unwrap_or(0);
        let max = s.data.iter().copied().max().unwrap_or(0);
        let label = Line::from(vec![
            Span::styled(s.label.clone(), theme.label()),
            Span::raw(format!("  now {}  max {}", (s.unit)(cur), (s.unit)(max))),
        ]);
        f.render_widget(Paragraph::new(label), areas[2 * i]);
        f.render_widget(Sparkline::default().data(&s.data).style(theme.spark(i)), areas[2 * i + 1]);
    }
    let text: Vec<Line> = evidence.into_iter().map(Line::from).collect();
    f.render_widget(Paragraph::new(text).wrap(Wrap { trim: true }), areas[areas.len() - 1]);
}
