//! The help overlay (`?`).

use ratatui::Frame;
use ratatui::layout::Rect;
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Borders, Clear, Paragraph};

use super::Header;
use super::theme::Theme;

const KEYS: &[(&str, &str)] = &[
    ("q, Esc", "quit (Esc first closes help, filter or details)"),
    ("↑ ↓, j k", "move the selection"),
    ("PgUp PgDn, g G", "page up / down, first / last"),
    ("Tab, Shift-Tab", "switch pane: connections, sockets, events"),
    ("Enter", "details of the selected connection or socket"),
    ("s", "cycle the sort order of the pane"),
    ("/", "filter rows (Enter keeps it, Esc clears it)"),
    ("p", "pause / resume (the view is frozen)"),
    ("D", "destroy the selected STALLED socket (asks y/n)"),
    ("?", "this help"),
    ("mouse", "click a row to select it, wheel to move"),
];

const LEGEND: &[&str] = &[
    "STARVED: alive, client bulk stopped, stalled targets pin the window",
    "  (suspected: one target short of exhausting it; likely: enough)",
    "STALLED: writer blocked and nothing moved for the stall timeout",
    "SLOW: blocked ≥ 1 s but still progressing;  OK: not blocked",
];

/// What the header only names, in full: why each degraded probe is missing,
/// why no QUIC port is watched, which programs wait until needed.
fn reasons(h: &Header) -> Vec<String> {
    let mut out = Vec::new();
    if let Some(n) = &h.quic_note {
        out.push(format!("QUIC: {n}"));
    }
    for (name, why) in &h.probes_degraded {
        out.push(format!("degraded {name}: {why}"));
    }
    if !h.probes_on_demand.is_empty() {
        out.push(format!(
            "on demand (attached when a watched process has a blocking TCP socket): {}",
            h.probes_on_demand.join(" ")
        ));
    }
    out
}

pub fn draw(f: &mut Frame, area: Rect, header: &Header, theme: &Theme) {
    let reasons = reasons(header);
    let w = area.width.min(100);
    // Reasons wrap: count their lines at this width.
    let inner = w.saturating_sub(2).max(1) as usize;
    let reason_lines: usize = reasons.iter().map(|r| r.chars().count().div_ceil(inner).max(1)).sum();
    let extra = if reasons.is_empty() { 0 } else { reason_lines + 1 };
    let h = area.height.min((KEYS.len() + LEGEND.len() + 5 + extra) as u16);
    let r = Rect { x: area.x + (area.width - w) / 2, y: area.y + (area.height - h) / 2, width: w, height: h };
    let mut lines: Vec<Line> = KEYS
        .iter()
        .map(|(k, what)| Line::from(vec![Span::styled(format!("{k:>16}  "), theme.title()), Span::raw(*what)]))
        .collect();
    lines.push(Line::raw(""));
    lines.extend(LEGEND.iter().map(|l| Line::styled(*l, theme.label())));
    if !reasons.is_empty() {
        lines.push(Line::raw(""));
        lines.extend(reasons.into_iter().map(|r| Line::styled(r, theme.warn())));
    }
    let block = Block::default().borders(Borders::ALL).border_style(theme.border(true)).title(" Help: hystall top ");
    f.render_widget(Clear, r);
    f.render_widget(Paragraph::new(lines).wrap(ratatui::widgets::Wrap { trim: false }).block(block), r);
}
