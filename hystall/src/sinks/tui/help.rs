//! The help overlay (`?`).

use ratatui::Frame;
use ratatui::layout::Rect;
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Borders, Clear, Paragraph};

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

pub fn draw(f: &mut Frame, area: Rect, theme: &Theme) {
    let w = area.width.min(74);
    let h = area.height.min((KEYS.len() + LEGEND.len() + 5) as u16);
    let r = Rect { x: area.x + (area.width - w) / 2, y: area.y + (area.height - h) / 2, width: w, height: h };
    let mut lines: Vec<Line> = KEYS
        .iter()
        .map(|(k, what)| Line::from(vec![Span::styled(format!("{k:>16}  "), theme.title()), Span::raw(*what)]))
        .collect();
    lines.push(Line::raw(""));
    lines.extend(LEGEND.iter().map(|l| Line::styled(*l, theme.label())));
    let block = Block::default().borders(Borders::ALL).border_style(theme.border(true)).title(" Help: hystall top ");
    f.render_widget(Clear, r);
    f.render_widget(Paragraph::new(lines).block(block), r);
}
