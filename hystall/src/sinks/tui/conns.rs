//! The QUIC connections table: starved ones on top, coloured.

use ratatui::Frame;
use ratatui::layout::{Constraint, Rect};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Borders, Cell, Row, Table};

use super::theme::Theme;
use super::view::ConnRow;
use super::{fmt_age, fmt_rate};

pub struct Pane<'a, T> {
    pub rows: &'a [T],
    /// Index of `rows[0]` in the sorted, filtered list.
    pub offset: usize,
    pub total: usize,
    /// Absolute index of the selected row.
    pub selected: usize,
    pub focused: bool,
    pub sort: &'static str,
    pub filter: &'a str,
}

impl<T> Pane<'_, T> {
    pub fn title(&self, name: &str, all: usize) -> String {
        let shown = if self.total == all { format!("{all}") } else { format!("{} of {all}", self.total) };
        let pos = if self.total > 0 { format!(" {}/{}", self.selected + 1, self.total) } else { String::new() };
        let filter = if self.filter.is_empty() { String::new() } else { format!(" filter \"{}\"", self.filter) };
        format!(" {name} ({shown}) sort: {}{filter}{pos} ", self.sort)
    }
}

pub fn verdict_text(r: &ConnRow) -> String {
    match &r.starved {
        Some(s) => format!("STARVED {} {}", s.confidence, fmt_age(s.since_s)),
        None if r.alive => "ok".into(),
        None => "idle".into(),
    }
}

pub fn targets_text(r: &ConnRow) -> String {
    match &r.starved {
        Some(s) if !s.targets.is_empty() => {
            let more = if s.targets.len() > 1 { format!(" +{}", s.targets.len() - 1) } else { String::new() };
            format!("{}: {}{more}", s.targets.len(), s.targets[0].remote)
        }
        _ => "-".into(),
    }
}

pub fn draw(f: &mut Frame, area: Rect, p: &Pane<ConnRow>, all: usize, theme: &Theme) {
    let header = Row::new(["ID", "CLIENT", "PORT", "DCID", "AGE", "UP", "DOWN", "VERDICT", "STALLED TARGETS"])
        .style(theme.header_row());
    let rows = p.rows.iter().enumerate().map(|(i, r)| {
        let base = if r.starved.is_some() {
            theme.bad()
        } else if r.alive {
            ratatui::style::Style::new()
        } else {
            theme.dim()
        };
        let style = if p.offset + i == p.selected { theme.selected(p.focused) } else { base };
        Row::new(vec![
            Cell::from(r.id.to_string()),
            Cell::from(r.client.clone()),
            Cell::from(r.ports.clone()),
            Cell::from(r.dcid.clone()),
            Cell::from(fmt_age(r.age_s)),
            Cell::from(fmt_rate(r.up_bps)),
            Cell::from(fmt_rate(r.down_bps)),
            Cell::from(Line::from(Span::raw(verdict_text(r)))),
            Cell::from(targets_text(r)),
        ])
        .style(style)
    });
    let widths = [
        Constraint::Length(5),
        Constraint::Length(21),
        Constraint::Length(6),
        Constraint::Length(16),
        Constraint::Length(7),
        Constraint::Length(9),
        Constraint::Length(9),
        Constraint::Length(21),
        Constraint::Min(10),
    ];
    let block = Block::default()
        .borders(Borders::ALL)
        .border_style(theme.border(p.focused))
        .title(p.title("QUIC connections", all));
    f.render_widget(Table::new(rows, widths).header(header).block(block).column_spacing(1), area);
}
