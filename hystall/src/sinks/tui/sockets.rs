//! The target sockets table: STALLED ones on top.

use ratatui::Frame;
use ratatui::layout::{Constraint, Rect};
use ratatui::text::Span;
use ratatui::widgets::{Block, Borders, Cell, Row, Table};

use crate::sinks::lines::human_bytes;

use super::conns::Pane;
use super::fmt_age;
use super::theme::Theme;
use super::view::{LinkView, SockRow};

pub fn draw(f: &mut Frame, area: Rect, p: &Pane<SockRow>, all: usize, theme: &Theme) {
    let header = Row::new([
        "OWNER",
        "LOCAL → REMOTE",
        "STATE",
        "UNSENT",
        "PEER WIN",
        "BLOCKED",
        "FAILED",
        "VERDICT",
        "CONN",
        "ACTION",
    ])
    .style(theme.header_row());
    let rows = p.rows.iter().enumerate().map(|(i, r)| {
        let s = &r.info;
        let selected = p.offset + i == p.selected;
        let verdict =
            Span::styled(s.verdict, if selected { theme.selected(p.focused) } else { theme.verdict(r.verdict) });
        let row = Row::new(vec![
            Cell::from(format!("{}[{}]", s.comm, s.pid)),
            Cell::from(format!("{} → {}", s.local.as_deref().unwrap_or("?"), s.remote.as_deref().unwrap_or("?"))),
            Cell::from(s.state),
            Cell::from(s.unsent_bytes.map_or_else(|| "?".into(), human_bytes)),
            Cell::from(s.peer_window.to_string()),
            Cell::from(if s.blocked_ms > 0 { fmt_age(s.blocked_ms as f64 / 1000.0) } else { "-".into() }),
            Cell::from(s.failed_sends.to_string()),
            Cell::from(verdict),
            Cell::from(match &r.conn {
                Some(LinkView::Linked(c, _)) => c.to_string(),
                Some(LinkView::Unattributed(_)) => "?".into(),
                None => "-".into(),
            }),
            Cell::from(if r.action.is_empty() { "-".to_string() } else { r.action.clone() }),
        ]);
        if selected {
            row.style(theme.selected(p.focused))
        } else if r.verdict == crate::core::verdict::Verdict::Ok && s.blocked_ms == 0 {
            row.style(theme.dim())
        } else {
            row
        }
    });
    let widths = [
        Constraint::Length(16),
        Constraint::Length(45),
        Constraint::Length(11),
        Constraint::Length(10),
        Constraint::Length(8),
        Constraint::Length(7),
        Constraint::Length(6),
        Constraint::Length(7),
        Constraint::Length(5),
        Constraint::Min(6),
    ];
    let block = Block::default()
        .borders(Borders::ALL)
        .border_style(theme.border(p.focused))
        .title(p.title("Target sockets", all));
    f.render_widget(Table::new(rows, widths).header(header).block(block).column_spacing(1), area);
}
