//! `hystall top`: the terminal UI, without the terminal. `commands/top.rs`
//! owns the terminal and the live loop; this module turns the core model into
//! frames (ratatui) and keys into actions, and is tested on a `TestBackend`.
//!
//! Layout: a header (node, processes, probes, events/s, lost events, mode,
//! counts), the QUIC connections table (starved first), the target sockets
//! table (STALLED first), the event log; Enter shows the detail view of the
//! selection (timelines and evidence), `?` the help overlay.
//!
//! Cost: connection rows are built for every connection (there are few), but
//! sockets are sorted on small keys and full rows are built only for the
//! visible window, so 100k sockets draw in milliseconds.

pub mod app;
pub mod conns;
pub mod detail;
pub mod events;
pub mod header;
pub mod help;
pub mod history;
pub mod sockets;
pub mod theme;
pub mod view;

#[cfg(test)]
mod tests;

use std::collections::{HashMap, VecDeque};

use ratatui::Frame;
use ratatui::crossterm::event::{KeyEvent, MouseEvent};
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::text::{Line, Span};
use ratatui::widgets::Paragraph;

use crate::core::event::Stamped;
use crate::core::model::Model;
use crate::core::time::{Mono, WallClock};

use app::{App, Pane};
use conns::Pane as TablePane;
use detail::Detail;
use events::LogLine;
use history::History;
use theme::Theme;
use view::{ConnRow, Frozen, Params, SockKey, SockRow};

/// Smallest terminal the full layout needs.
pub const MIN_WIDTH: u16 = 60;
pub const MIN_HEIGHT: u16 = 14;

/// What the header says about the run (set by the live loop).
#[derive(Clone, Debug, PartialEq)]
pub struct Header {
    pub node: String,
    pub processes: Vec<(u32, String)>,
    pub probes_attached: Vec<String>,
    /// (probe, why it is missing or what it degrades to): real faults.
    pub probes_degraded: Vec<(String, String)>,
    /// Programs left detached until needed (the syscall probes): not faults.
    pub probes_on_demand: Vec<String>,
    /// How blocked writers are seen (`tracepoint`, `fexit`, `zero_window`).
    pub send_path: String,
    /// The QUIC server ports watched ("40000, 443"), empty for none.
    pub quic_ports: String,
    /// Set when no QUIC server port is watched: why, and what to do.
    pub quic_note: Option<String>,
    pub events_per_sec: f64,
    pub events_lost: u64,
    /// Kernel map entries lost (full maps, LRU evictions).
    pub evicted: u64,
    /// "observe", "enforce 10s", "dry-run 10s"
    pub mode: String,
    pub refresh_ms: u64,
    /// `--decrypt`: one line of what is read (None without it).
    pub decrypt: Option<String>,
}

impl Default for Header {
    fn default() -> Self {
        Header {
            node: String::new(),
            processes: Vec::new(),
            probes_attached: Vec::new(),
            probes_degraded: Vec::new(),
            probes_on_demand: Vec::new(),
            send_path: String::new(),
            quic_ports: String::new(),
            quic_note: None,
            events_per_sec: 0.0,
            events_lost: 0,
            evicted: 0,
            mode: "observe".into(),
            refresh_ms: 1000,
            decrypt: None,
        }
    }
}

pub struct Tui {
    app: App,
    theme: Theme,
    header: Header,
    history: History,
    log: VecDeque<LogLine>,
    /// Action taken on a socket (by the enforcer), shown in its row.
    actions: HashMap<u64, String>,
    frozen: Option<Frozen>,
}

impl Tui {
    pub fn new(no_color: bool) -> Tui {
        Tui {
            app: App::default(),
            theme: Theme::new(no_color),
            header: Header::default(),
            history: History::default(),
            log: VecDeque::new(),
            actions: HashMap::new(),
            frozen: None,
        }
    }

    /// After each model tick: record history (per-second buckets) and new events.
    /// Goes on while paused (only the display is frozen).
    pub fn observe(&mut self, model: &Model, now: Mono, events: &[Stamped], clock: &WallClock) {
        self.history.observe(model, now);
        for e in events {
            if self.log.len() == events::MAX_LINES {
                self.log.pop_front();
            }
            self.log.push_back(LogLine::of(e, clock));
            // A scrolled-back log stays on the lines the user is reading.
            if self.app.sel[Pane::Events as usize] > 0 {
                self.app.sel[Pane::Events as usize] += 1;
            }
        }
        if !self.actions.is_empty() {
            self.actions.retain(|c, _| model.sockets.get(*c).is_some());
        }
    }

    pub fn set_header(&mut self, h: Header) {
        self.header = h;
    }

    /// Records what was done to a socket (e.g. "destroyed", "would destroy").
    pub fn set_action(&mut self, cookie: u64, action: impl Into<String>) {
        self.actions.insert(cookie, action.into());
    }

    /// Returns false when the user asked to quit.
    pub fn key(&mut self, key: KeyEvent) -> bool {
        self.app.key(key)
    }

    /// Selection by click, movement by the wheel.
    pub fn mouse(&mut self, ev: MouseEvent) {
        self.app.mouse(ev);
    }

    pub fn paused(&self) -> bool {
        self.app.paused
    }

    /// A socket the user confirmed destroying by hand (`D`, then `y`), once.
    pub fn take_destroy_request(&mut self) -> Option<u64> {
        self.app.request.take()
    }

    pub fn draw(&mut self, frame: &mut Frame, model: &Model, now: Mono) {
        let area = frame.area();
        if area.width < MIN_WIDTH || area.height < MIN_HEIGHT {
            self.app.areas = [Rect::default(); 3];
            let msg = vec![
                Line::styled("hystall top", self.theme.title()),
                Line::raw(format!("terminal too small: {}x{}", area.width, area.height)),
                Line::raw(format!("needs {MIN_WIDTH}x{MIN_HEIGHT}")),
                Line::raw("q: quit"),
            ];
            frame.render_widget(Paragraph::new(msg).wrap(ratatui::widgets::Wrap { trim: true }), area);
            return;
        }
        if !self.app.paused {
            self.frozen = None;
        } else if self.frozen.is_none() {
            let log = self.log.iter().cloned().collect();
            self.frozen = Some(Frozen::take(model, now, log, self.history.clone(), &self.actions));
        }

        let [head, body, foot] =
            Layout::vertical([Constraint::Length(header::HEIGHT), Constraint::Min(5), Constraint::Length(1)])
                .areas(area);
        let (at, params, counts) = match &self.frozen {
            Some(f) => (f.at, f.params, f.counts),
            None => {
                let p = Params::of(model);
                (now, p, view::counts(model, now, &p))
            }
        };
        header::draw(frame, head, &self.header, &counts, self.app.paused, &self.theme);

        let [c_area, s_area, e_area] =
            Layout::vertical([Constraint::Percentage(38), Constraint::Percentage(37), Constraint::Min(4)]).areas(body);
        self.app.areas = [c_area, s_area, e_area];
        let table_h = |a: Rect| a.height.saturating_sub(3) as usize;
        let filter = self.app.filter.clone();

        // Connections: every row, filtered and sorted.
        let mut conn_rows: Vec<ConnRow> = match &self.frozen {
            Some(f) => f.conns.iter().filter(|r| r.matches(&filter)).cloned().collect(),
            None => model
                .conns
                .iter()
                .map(|c| ConnRow::build(c, model, now, &params))
                .filter(|r| r.matches(&filter))
                .collect(),
        };
        view::sort_conns(&mut conn_rows, self.app.conn_sort);
        let ids: Vec<u64> = conn_rows.iter().map(|r| r.id).collect();
        let c_off = self.app.resolve(Pane::Conns, &ids, table_h(c_area));
        let c_window = &conn_rows[c_off..(c_off + table_h(c_area)).min(conn_rows.len())];

        // Sockets: keys, then rows for the visible window only.
        let (sock_ids, s_all): (Vec<u64>, usize) = match &self.frozen {
            Some(f) => {
                let mut keys: Vec<SockKey> = f.socks.iter().filter(|r| r.matches(&filter)).map(|r| r.key()).collect();
                view::sort_keys(&mut keys, self.app.sock_sort, |k| *k);
                (keys.iter().map(|k| k.cookie).collect(), f.socks.len())
            }
            None => {
                let mut keys: Vec<SockKey> = model
                    .sockets
                    .iter()
                    .filter(|s| SockKey::socket_matches(s, &filter))
                    .map(|s| SockKey::of(s, now))
                    .collect();
                view::sort_keys(&mut keys, self.app.sock_sort, |k| *k);
                (keys.iter().map(|k| k.cookie).collect(), model.sockets.len())
            }
        };
        let s_off = self.app.resolve(Pane::Socks, &sock_ids, table_h(s_area));
        let sock_rows: Vec<SockRow> = match &self.frozen {
            Some(f) => {
                let by: HashMap<u64, &SockRow> = self.app.visible[1]
                    .iter()
                    .filter_map(|c| f.socks.iter().find(|r| r.info.cookie == *c))
                    .map(|r| (r.info.cookie, r))
                    .collect();
                self.app.visible[1].iter().filter_map(|c| by.get(c).map(|r| (*r).clone())).collect()
            }
            None => {
                let conn_of = view::conn_of(model);
                self.app.visible[1]
                    .iter()
                    .filter_map(|c| model.sockets.get(*c))
                    .map(|s| SockRow::build(s, now, &conn_of, &self.actions))
                    .collect()
            }
        };

        let log: Vec<&LogLine> = match &self.frozen {
            Some(f) => f.events.iter().filter(|l| l.matches(&filter)).collect(),
            None => self.log.iter().filter(|l| l.matches(&filter)).collect(),
        };
        let ev_i = Pane::Events as usize;
        self.app.len[ev_i] = log.len();
        self.app.page[ev_i] = e_area.height.saturating_sub(2) as usize;
        self.app.sel[ev_i] = self.app.sel[ev_i].min(log.len().saturating_sub(1));

        if self.app.detail {
            let d = self.detail(model, now, &conn_rows);
            let h = self.frozen.as_ref().map_or(&self.history, |f| &f.history);
            detail::draw(frame, body, &d, h, at, &params, &self.theme);
        } else {
            let focus = self.app.focus;
            let cp = TablePane {
                rows: c_window,
                offset: c_off,
                total: conn_rows.len(),
                selected: self.app.sel[0],
                focused: focus == Pane::Conns,
                sort: self.app.conn_sort.name(),
                filter: &filter,
            };
            conns::draw(frame, c_area, &cp, counts.conns, &self.theme);
            let sp = TablePane {
                rows: &sock_rows,
                offset: s_off,
                total: sock_ids.len(),
                selected: self.app.sel[1],
                focused: focus == Pane::Socks,
                sort: self.app.sock_sort.name(),
                filter: &filter,
            };
            sockets::draw(frame, s_area, &sp, s_all, &self.theme);
            events::draw(frame, e_area, &log, self.app.sel[ev_i], focus == Pane::Events, &self.theme);
        }
        self.footer(frame, foot);
        if self.app.help {
            help::draw(frame, area, &self.header, &self.theme);
        }
    }

    /// The detail of the selection of the focused table.
    fn detail(&self, model: &Model, now: Mono, conn_rows: &[ConnRow]) -> Detail {
        match self.app.focus {
            Pane::Socks => {
                let Some(cookie) = self.app.sel_id[1] else { return Detail::Gone("the socket".into()) };
                let row = match &self.frozen {
                    Some(f) => f.socks.iter().find(|r| r.info.cookie == cookie).cloned(),
                    None => {
                        model.sockets.get(cookie).map(|s| SockRow::build(s, now, &view::conn_of(model), &self.actions))
                    }
                };
                row.map_or_else(|| Detail::Gone(format!("socket {cookie}")), Detail::Sock)
            }
            _ => {
                let Some(id) = self.app.sel_id[0] else { return Detail::Gone("the connection".into()) };
                conn_rows
                    .iter()
                    .find(|r| r.id == id)
                    .cloned()
                    .map_or_else(|| Detail::Gone(format!("connection {id}")), Detail::Conn)
            }
        }
    }

    fn footer(&self, f: &mut Frame, area: Rect) {
        let t = &self.theme;
        let line = if let Some(cookie) = self.app.confirm {
            Line::from(vec![Span::styled(
                format!("Destroy socket {cookie} (SOCK_DESTROY)? y: yes, any other key: no"),
                t.warn(),
            )])
        } else if self.app.editing {
            Line::from(vec![
                Span::styled("/", t.title()),
                Span::raw(format!("{}▏", self.app.filter)),
                Span::styled("  Enter: keep  Esc: clear", t.dim()),
            ])
        } else {
            let mut spans = Vec::new();
            for (k, what) in [
                ("q", "quit"),
                ("↑↓", "move"),
                ("Tab", "pane"),
                ("Enter", if self.app.detail { "back" } else { "details" }),
                ("s", "sort"),
                ("/", "filter"),
                ("p", if self.app.paused { "resume" } else { "pause" }),
                ("?", "help"),
            ] {
                spans.push(Span::styled(k, t.title()));
                spans.push(Span::styled(format!(" {what}  "), t.dim()));
            }
            if !self.app.filter.is_empty() {
                spans.push(Span::styled(format!("filter: {}", self.app.filter), t.warn()));
            }
            Line::from(spans)
        };
        f.render_widget(Paragraph::new(line), area);
    }
}

/// A duration for tables: `12.3s`, `3m05s`, `1h02m`, `2d03h`.
pub fn fmt_age(secs: f64) -> String {
    let s = secs.max(0.0);
    if s < 60.0 {
        format!("{s:.1}s")
    } else if s < 3600.0 {
        format!("{}m{:02}s", (s / 60.0) as u64, (s % 60.0) as u64)
    } else if s < 86_400.0 {
        format!("{}h{:02}m", (s / 3600.0) as u64, ((s % 3600.0) / 60.0) as u64)
    } else {
        format!("{}d{:02}h", (s / 86_400.0) as u64, ((s % 86_400.0) / 3600.0) as u64)
    }
}

/// A duration for prose: `12.3 s`, or `fmt_age` beyond a minute.
pub fn fmt_secs(secs: f64) -> String {
    if secs < 60.0 { format!("{:.1} s", secs.max(0.0)) } else { fmt_age(secs) }
}

/// Bytes per second, compact: `950B/s`, `12.3K/s`, `1.5M/s`.
pub fn fmt_rate(bps: f64) -> String {
    const K: f64 = 1024.0;
    if bps < K {
        format!("{bps:.0}B/s")
    } else if bps < K * K {
        format!("{:.1}K/s", bps / K)
    } else if bps < K * K * K {
        format!("{:.1}M/s", bps / K / K)
    } else {
        format!("{:.1}G/s", bps / K / K / K)
    }
}
