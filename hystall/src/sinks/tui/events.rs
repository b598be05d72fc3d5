//! The event log pane: the events `watch` prints, one compact line each.

use ratatui::Frame;
use ratatui::layout::Rect;
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Borders, Paragraph};

use crate::core::event::{Event, SocketInfo, Stamped};
use crate::core::time::{Mono, WallClock};
use crate::sinks::lines::human_bytes;

use super::theme::Theme;

/// Lines kept in the log.
pub const MAX_LINES: usize = 2_000;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Severity {
    Info,
    Warn,
    Bad,
    Good,
}

#[derive(Clone, Debug, PartialEq)]
pub struct LogLine {
    pub at: Mono,
    /// `HH:MM:SS.mmm` (UTC).
    pub time: String,
    pub tag: &'static str,
    pub text: String,
    pub severity: Severity,
}

impl LogLine {
    pub fn of(e: &Stamped, clock: &WallClock) -> LogLine {
        let (tag, text, severity) = describe(&e.event);
        let ts = clock.rfc3339(e.at);
        LogLine { at: e.at, time: ts.get(11..23).unwrap_or(&ts).to_owned(), tag, text, severity }
    }

    pub fn matches(&self, filter: &str) -> bool {
        filter.is_empty() || format!("{} {}", self.tag, self.text).to_lowercase().contains(filter)
    }
}

fn sock(s: &SocketInfo) -> String {
    format!(
        "{}[{}] {} -> {} {}, blocked {:.1}s, no progress {:.1}s, unsent {}, peer window {}, failed sends {}{}",
        s.comm,
        s.pid,
        s.local.as_deref().unwrap_or("?"),
        s.remote.as_deref().unwrap_or("?"),
        s.state,
        s.blocked_ms as f64 / 1000.0,
        s.no_progress_ms as f64 / 1000.0,
        s.unsent_bytes.map_or_else(|| "?".into(), human_bytes),
        s.peer_window,
        s.failed_sends,
        if s.in_syscall { ", parked in send()" } else { "" },
    )
}

fn describe(e: &Event) -> (&'static str, String, Severity) {
    match e {
        Event::WatchStarted(i) => {
            let who = if i.all_processes {
                "every process".to_string()
            } else {
                let mut p: Vec<String> = i.pids.iter().map(|p| p.to_string()).collect();
                p.extend(i.comms.iter().map(|c| format!("comm={c}")));
                p.join(", ")
            };
            let degraded =
                i.probes.iter().filter(|p| !p.attached && !crate::sources::kernel::probes::is_waiting(p)).count();
            let on_demand = i.probes.iter().filter(|p| crate::sources::kernel::probes::is_waiting(p)).count();
            let mut text = format!(
                "{who}; stall timeout {:.1}s; {} probes attached{}{}",
                i.stall_timeout_ms as f64 / 1000.0,
                i.probes.iter().filter(|p| p.attached).count(),
                if on_demand > 0 { format!(", {on_demand} on demand") } else { String::new() },
                if degraded > 0 { format!(", {degraded} degraded") } else { String::new() }
            );
            if let Some(q) = &i.quic {
                text.push_str(&format!("; {}", q.summary()));
            }
            for w in &i.warnings {
                text.push_str(&format!("; {w}"));
            }
            let sev = if i.quic.as_ref().is_some_and(|q| q.note.is_some()) { Severity::Bad } else { Severity::Info };
            ("WATCHING", text, sev)
        }
        Event::QuicPortsChanged(q) => {
            let sev = if q.note.is_some() { Severity::Bad } else { Severity::Good };
            ("QUIC PORTS", format!("{} ({})", q.summary(), q.reason), sev)
        }
        Event::DecryptChanged(d) => {
            let sev = if d.note.is_some() { Severity::Bad } else { Severity::Good };
            ("DECRYPT", d.summary(), sev)
        }
        Event::SocketStalled(s) => ("STALLED", sock(s), Severity::Bad),
        Event::SocketRecovered(s) => ("RECOVERED", sock(s), Severity::Good),
        Event::SocketClosed(s) => ("CLOSED", sock(s), Severity::Info),
        Event::QuicConnOpened(c) | Event::QuicConnClosed(c) => {
            let text = format!(
                "conn {} {} -> {} dcid {} ({}) up {} down {}{}",
                c.conn,
                c.client.as_deref().unwrap_or("?"),
                c.server.as_deref().unwrap_or("?"),
                c.dcid.as_deref().unwrap_or("-"),
                c.grouping,
                human_bytes(c.c2s_bytes),
                human_bytes(c.s2c_bytes),
                c.reason.map(|r| format!(", closed: {r}")).unwrap_or_default()
            );
            let tag = if matches!(e, Event::QuicConnOpened(_)) { "QUIC+" } else { "QUIC-" };
            (tag, text, Severity::Info)
        }
        Event::QuicStarved(s) | Event::QuicRecovered(s) => {
            let ev = &s.evidence;
            let mut text = format!(
                "conn {} {} -> {} [{}] no client stream data for {:.1}s; {} stalled target(s) of {} needed, {} unsent",
                s.conn,
                s.client.as_deref().unwrap_or("?"),
                s.server.as_deref().unwrap_or("?"),
                s.confidence,
                ev.client_bulk_quiet_ms as f64 / 1000.0,
                ev.stalled_targets,
                ev.streams_to_exhaust,
                human_bytes(ev.unsent_bytes),
            );
            if let Some(r) = s.reason {
                text.push_str(&format!("; recovered: {r}"));
                ("UNSTARVED", text, Severity::Good)
            } else {
                ("STARVED", text, Severity::Bad)
            }
        }
        Event::Enforced(x) => {
            let what = if x.dry_run { "would destroy (dry-run)" } else { x.action };
            (
                if x.dry_run { "DRY-RUN" } else { "ENFORCE" },
                format!("{what}: {} -> {}", sock(&x.socket), x.result),
                Severity::Bad,
            )
        }
    }
}

/// Draws the newest lines that fit, `scroll` lines up from the newest.
pub fn draw(f: &mut Frame, area: Rect, lines: &[&LogLine], scroll: usize, focused: bool, theme: &Theme) {
    let inner_h = area.height.saturating_sub(2) as usize;
    let scroll = scroll.min(lines.len().saturating_sub(inner_h));
    let end = lines.len() - scroll;
    let start = end.saturating_sub(inner_h);
    let text: Vec<Line> = lines[start..end]
        .iter()
        .map(|l| {
            let style = match l.severity {
                Severity::Info => theme.label(),
                Severity::Warn => theme.warn(),
                Severity::Bad => theme.bad(),
                Severity::Good => theme.good(),
            };
            Line::from(vec![
                Span::styled(l.time.clone(), theme.dim()),
                Span::raw(" "),
                Span::styled(format!("{:<9}", l.tag), style),
                Span::raw(" "),
                Span::raw(l.text.clone()),
            ])
        })
        .collect();
    let title = if scroll > 0 {
        format!(" Events ({}, {scroll} newer below) ", lines.len())
    } else {
        format!(" Events ({}) ", lines.len())
    };
    let block = Block::default().borders(Borders::ALL).border_style(theme.border(focused)).title(title);
    f.render_widget(Paragraph::new(text).block(block), area);
}
