//! Colours of the dashboard. With NO_COLOR (https://no-color.org) no colour is
//! used at all: only bold, reverse and dim tell rows apart.

use ratatui::style::{Color, Modifier, Style};

use crate::core::verdict::Verdict;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Theme {
    pub color: bool,
}

impl Theme {
    pub fn new(no_color: bool) -> Theme {
        Theme { color: !no_color }
    }

    fn fg(&self, c: Color) -> Style {
        if self.color { Style::new().fg(c) } else { Style::new() }
    }

    pub fn title(&self) -> Style {
        self.fg(Color::Cyan).add_modifier(Modifier::BOLD)
    }

    pub fn label(&self) -> Style {
        self.fg(Color::Gray)
    }

    pub fn dim(&self) -> Style {
        if self.color { Style::new().fg(Color::DarkGray) } else { Style::new().add_modifier(Modifier::DIM) }
    }

    /// A starved connection, a stalled socket, lost events: what must be seen.
    pub fn bad(&self) -> Style {
        self.fg(Color::Red).add_modifier(Modifier::BOLD)
    }

    pub fn warn(&self) -> Style {
        self.fg(Color::Yellow)
    }

    pub fn good(&self) -> Style {
        self.fg(Color::Green)
    }

    pub fn paused(&self) -> Style {
        if self.color {
            Style::new().fg(Color::Black).bg(Color::Yellow).add_modifier(Modifier::BOLD)
        } else {
            Style::new().add_modifier(Modifier::REVERSED | Modifier::BOLD)
        }
    }

    pub fn selected(&self, focused: bool) -> Style {
        match (self.color, focused) {
            (true, true) => Style::new().bg(Color::Blue).fg(Color::White).add_modifier(Modifier::BOLD),
            (true, false) => Style::new().bg(Color::DarkGray),
            (false, true) => Style::new().add_modifier(Modifier::REVERSED),
            (false, false) => Style::new().add_modifier(Modifier::UNDERLINED),
        }
    }

    pub fn header_row(&self) -> Style {
        self.fg(Color::Yellow).add_modifier(Modifier::BOLD)
    }

    pub fn border(&self, focused: bool) -> Style {
        match (self.color, focused) {
            (true, true) => Style::new().fg(Color::Cyan),
            (true, false) => Style::new().fg(Color::DarkGray),
            (false, true) => Style::new().add_modifier(Modifier::BOLD),
            (false, false) => Style::new(),
        }
    }

    pub fn verdict(&self, v: Verdict) -> Style {
        match v {
            Verdict::Ok => self.good(),
            Verdict::Slow => self.warn(),
            Verdict::Stalled => self.bad(),
        }
    }

    pub fn spark(&self, i: usize) -> Style {
        const C: [Color; 4] = [Color::Green, Color::Cyan, Color::Magenta, Color::Yellow];
        self.fg(C[i % C.len()])
    }
}
