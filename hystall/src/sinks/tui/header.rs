//! The header: node, processes, probes, event rates and losses (never
//! hidden), the enforcement mode, and what is starved or stalled right now.

use ratatui::Frame;
use ratatui::layout::Rect;
use ratatui::text::{Line, Span};
use ratatui::widgets::Paragraph;

use super::Header;
use super::theme::Theme;
use super::view::Counts;

/// Lines the header takes.
pub const HEIGHT: u16 = 3;

pub fn draw(f: &mut Frame, area: Rect, h: &Header, c: &Counts, paused: bool, theme: &Theme) {
    let procs = if h.processes.is_empty() {
        "every process".to_string()
    } else {
        let mut v: Vec<String> = h.processes.iter().take(4).map(|(pid, comm)| format!("{comm}[{pid}]")).collect();
        if h.processes.len() > 4 {
            v.push(format!("+{}", h.processes.len() - 4));
        }
        v.join(" ")
    };
    let mut l1 = vec![
        Span::styled("hystall top", theme.title()),
        Span::styled("  node ", theme.label()),
        Span::raw(h.node.clone()),
        Span::styled("  mode ", theme.label()),
        Span::styled(h.mode.clone(), if h.mode.starts_with("enforce") { theme.warn() } else { theme.good() }),
        Span::styled("  watching ", theme.label()),
        Span::raw(procs),
    ];
    if paused {
        l1.insert(1, Span::raw(" "));
        l1.insert(2, Span::styled(" PAUSED ", theme.paused()));
    }

    let mut l2 =
        vec![Span::styled("probes ", theme.label()), Span::raw(format!("{} attached", h.probes_attached.len()))];
    if !h.probes_on_demand.is_empty() {
        l2.push(Span::raw(format!(", {} on demand", h.probes_on_demand.len())));
    }
    if !h.probes_degraded.is_empty() {
        let names: Vec<&str> = h.probes_degraded.iter().map(|(n, _)| n.as_str()).collect();
        l2.push(Span::raw(", "));
        l2.push(Span::styled(format!("{} degraded: {} (? why)", names.len(), names.join(" ")), theme.warn()));
    }
    if !h.send_path.is_empty() {
        // Which path sees blocked writers: exact send results (tracepoint,
        // fexit), or the zero-window fallback, marked.
        l2.push(Span::styled("  sends ", theme.label()));
        let style = if h.send_path == "tracepoint" || h.send_path == "fexit" { theme.good() } else { theme.warn() };
        l2.push(Span::styled(h.send_path.clone(), style));
    }
    l2.push(Span::styled("  events ", theme.label()));
    l2.push(Span::raw(format!("{:.1}/s", h.events_per_sec)));
    l2.push(Span::styled("  lost ", theme.label()));
    l2.push(Span::styled(h.events_lost.to_string(), if h.events_lost > 0 { theme.bad() } else { theme.good() }));
    if h.evicted > 0 {
        l2.push(Span::styled("  evicted ", theme.label()));
        l2.push(Span::styled(h.evicted.to_string(), theme.bad()));
    }
    if let Some(d) = &h.decrypt {
        l2.push(Span::styled("  decrypt ", theme.label()));
        l2.push(Span::raw(d.clone()));
    }
    l2.push(Span::styled(format!("  refresh {}ms", h.refresh_ms), theme.dim()));

    let mut l3 = vec![Span::styled("QUIC ", theme.label())];
    if h.quic_note.is_some() {
        l3.push(Span::styled("no server port watched (? why) ", theme.warn()));
    } else if !h.quic_ports.is_empty() {
        l3.push(Span::raw(format!("ports {}: ", h.quic_ports)));
    }
    l3.extend([
        Span::raw(format!("{} conns, {} alive, ", c.conns, c.alive)),
        Span::styled(format!("{} STARVED", c.starved), if c.starved > 0 { theme.bad() } else { theme.good() }),
        Span::styled("   targets ", theme.label()),
        Span::raw(format!("{} sockets, ", c.sockets)),
        Span::styled(format!("{} STALLED", c.stalled), if c.stalled > 0 { theme.bad() } else { theme.good() }),
        Span::raw(", "),
        Span::styled(format!("{} SLOW", c.slow), if c.slow > 0 { theme.warn() } else { theme.good() }),
    ]);
    let text = vec![Line::from(l1), Line::from(l2), Line::from(l3)];
    f.render_widget(Paragraph::new(text), area);
}
