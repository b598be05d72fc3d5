//! Dashboard state and key handling (no terminal, no model: unit-tested).

use ratatui::crossterm::event::{
    KeyCode, KeyEvent, KeyEventKind, KeyModifiers, MouseButton, MouseEvent, MouseEventKind,
};
use ratatui::layout::{Position, Rect};

use super::view::{ConnSort, SockSort};

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Pane {
    #[default]
    Conns = 0,
    Socks = 1,
    Events = 2,
}

impl Pane {
    fn next(self) -> Pane {
        match self {
            Pane::Conns => Pane::Socks,
            Pane::Socks => Pane::Events,
            Pane::Events => Pane::Conns,
        }
    }

    fn prev(self) -> Pane {
        self.next().next()
    }
}

#[derive(Debug, Default)]
pub struct App {
    pub focus: Pane,
    /// Selected row (connections, sockets); lines scrolled up from the newest (events).
    pub sel: [usize; 3],
    /// The id (connection id, socket cookie) of the selection: it follows its
    /// row across re-sorts unless the user moved by index since the last draw.
    pub sel_id: [Option<u64>; 2],
    pub by_index: [bool; 2],
    /// First visible row of each table.
    pub offset: [usize; 2],
    /// Rows after filtering (from the last draw).
    pub len: [usize; 3],
    /// Visible rows of each pane (from the last draw).
    pub page: [usize; 3],
    /// Ids of the visible rows of each table (from the last draw).
    pub visible: [Vec<u64>; 2],
    /// Where the panes were drawn (for mouse clicks).
    pub areas: [Rect; 3],
    pub conn_sort: ConnSort,
    pub sock_sort: SockSort,
    /// Lower-case filter applied to every pane.
    pub filter: String,
    /// Typing into the filter.
    pub editing: bool,
    pub paused: bool,
    pub help: bool,
    /// Showing the detail of the selection of `focus`.
    pub detail: bool,
    /// `D` pressed on this socket: waiting for `y`.
    pub confirm: Option<u64>,
    /// Confirmed: the socket to destroy by hand (taken by the caller).
    pub request: Option<u64>,
}

impl App {
    /// Handles one key; false when the user asked to quit.
    pub fn key(&mut self, k: KeyEvent) -> bool {
        if k.kind == KeyEventKind::Release {
            return true;
        }
        if self.editing {
            match k.code {
                KeyCode::Esc => {
                    self.filter.clear();
                    self.editing = false;
                }
                KeyCode::Enter => self.editing = false,
                KeyCode::Backspace => {
                    self.filter.pop();
                }
                KeyCode::Char(c) if !k.modifiers.contains(KeyModifiers::CONTROL) => {
                    self.filter.extend(c.to_lowercase());
                }
                _ => return true,
            }
            self.reset_selection();
            return true;
        }
        if self.help {
            match k.code {
                KeyCode::Char('q') => return false,
                _ => self.help = false,
            }
            return true;
        }
        // A destroy asks first: `y` confirms, any other key cancels.
        if let Some(cookie) = self.confirm.take() {
            if k.code == KeyCode::Char('y') {
                self.request = Some(cookie);
            }
            return true;
        }
        match k.code {
            KeyCode::Char('q') => return false,
            KeyCode::Esc if self.detail => self.detail = false,
            KeyCode::Esc if !self.filter.is_empty() => {
                self.filter.clear();
                self.reset_selection();
            }
            KeyCode::Esc => return false,
            KeyCode::Char('?') | KeyCode::F(1) => self.help = true,
            KeyCode::Char('p') | KeyCode::Char(' ') => self.paused = !self.paused,
            KeyCode::Up | KeyCode::Char('k') => self.move_by(-1),
            KeyCode::Down | KeyCode::Char('j') => self.move_by(1),
            KeyCode::PageUp => self.move_by(-(self.page[self.focus as usize].max(1) as isize)),
            KeyCode::PageDown => self.move_by(self.page[self.focus as usize].max(1) as isize),
            KeyCode::Home | KeyCode::Char('g') => self.move_by(isize::MIN / 2),
            KeyCode::End | KeyCode::Char('G') => self.move_by(isize::MAX / 2),
            KeyCode::Tab if !self.detail => self.focus = self.focus.next(),
            KeyCode::BackTab if !self.detail => self.focus = self.focus.prev(),
            KeyCode::Enter if self.detail => self.detail = false,
            KeyCode::Enter => self.detail = self.focus != Pane::Events && self.len[self.focus as usize] > 0,
            KeyCode::Char('s') => match self.focus {
                Pane::Conns => self.conn_sort = self.conn_sort.next(),
                Pane::Socks => self.sock_sort = self.sock_sort.next(),
                Pane::Events => {}
            },
            KeyCode::Char('/') => {
                self.editing = true;
                self.detail = false;
            }
            KeyCode::Char('D') if self.focus == Pane::Socks => self.confirm = self.selected_socket(),
            _ => {}
        }
        true
    }

    /// The cookie of the selected row of the sockets table.
    pub fn selected_socket(&self) -> Option<u64> {
        self.visible[1].get(self.sel[1].checked_sub(self.offset[1])?).copied()
    }

    fn reset_selection(&mut self) {
        self.sel = [0; 3];
        self.offset = [0; 2];
        self.by_index = [true; 2];
    }

    /// Moves the selection of the focused pane by `d` rows, clamped.
    pub fn move_by(&mut self, d: isize) {
        let p = self.focus as usize;
        let len = self.len[p];
        if self.focus == Pane::Events {
            // Up (negative) scrolls to older lines.
            self.sel[p] = (self.sel[p] as isize - d).clamp(0, len.saturating_sub(1) as isize) as usize;
            return;
        }
        self.sel[p] = (self.sel[p] as isize + d).clamp(0, len.saturating_sub(1) as isize) as usize;
        self.by_index[p] = true;
    }

    /// Resolves the selection of table `p` against its sorted ids and the
    /// visible height; returns the first visible row.
    pub fn resolve(&mut self, p: Pane, ids: &[u64], height: usize) -> usize {
        let i = p as usize;
        self.len[i] = ids.len();
        self.page[i] = height;
        if !self.by_index[i]
            && let Some(id) = self.sel_id[i]
            && let Some(pos) = ids.iter().position(|&x| x == id)
        {
            self.sel[i] = pos;
        }
        self.by_index[i] = false;
        self.sel[i] = self.sel[i].min(ids.len().saturating_sub(1));
        self.sel_id[i] = ids.get(self.sel[i]).copied();
        let h = height.max(1);
        if self.sel[i] < self.offset[i] {
            self.offset[i] = self.sel[i];
        } else if self.sel[i] >= self.offset[i] + h {
            self.offset[i] = self.sel[i] + 1 - h;
        }
        self.offset[i] = self.offset[i].min(ids.len().saturating_sub(h));
        let end = (self.offset[i] + h).min(ids.len());
        self.visible[i] = ids[self.offset[i]..end].to_vec();
        self.offset[i]
    }

    /// Selection by click, moves by the wheel.
    pub fn mouse(&mut self, ev: MouseEvent) {
        let pos = Position { x: ev.column, y: ev.row };
        let under =
            [Pane::Conns, Pane::Socks, Pane::Events].into_iter().find(|p| self.areas[*p as usize].contains(pos));
        match ev.kind {
            MouseEventKind::Down(MouseButton::Left) => {
                let Some(p) = under else { return };
                if self.detail || self.help {
                    return;
                }
                self.focus = p;
                if p != Pane::Events {
                    let i = p as usize;
                    // Border and header row above the first data row.
                    let row = ev.row.saturating_sub(self.areas[i].y + 2) as usize;
                    if ev.row >= self.areas[i].y + 2 && row < self.visible[i].len() {
                        self.sel[i] = self.offset[i] + row;
                        self.by_index[i] = true;
                    }
                }
            }
            MouseEventKind::ScrollUp | MouseEventKind::ScrollDown => {
                if let Some(p) = under
                    && !self.detail
                {
                    self.focus = p;
                }
                self.move_by(if ev.kind == MouseEventKind::ScrollUp { -3 } else { 3 });
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(app: &mut App, code: KeyCode) -> bool {
        app.key(KeyEvent::new(code, KeyModifiers::NONE))
    }

    #[test]
    fn destroying_by_hand_asks_first_and_only_y_confirms() {
        let mut a = App { focus: Pane::Socks, visible: [vec![], vec![11, 12, 13]], sel: [0, 1, 0], ..App::default() };
        assert!(key(&mut a, KeyCode::Char('D')));
        assert_eq!(a.confirm, Some(12));
        assert!(key(&mut a, KeyCode::Char('n')), "no quits nothing");
        assert_eq!((a.confirm, a.request), (None, None));
        key(&mut a, KeyCode::Char('D'));
        assert!(key(&mut a, KeyCode::Char('q')), "q while asked cancels, it does not quit");
        assert_eq!(a.request, None);
        key(&mut a, KeyCode::Char('D'));
        key(&mut a, KeyCode::Char('y'));
        assert_eq!(a.request, Some(12));
        a.focus = Pane::Conns;
        a.request = None;
        key(&mut a, KeyCode::Char('D'));
        assert_eq!(a.confirm, None, "only in the sockets pane");
    }

    fn app(conns: usize, socks: usize) -> App {
        App { len: [conns, socks, 50], page: [5, 5, 5], ..Default::default() }
    }

    #[test]
    fn j_k_and_arrows_move_and_clamp() {
        let mut a = app(3, 10);
        for c in [KeyCode::Char('j'), KeyCode::Down, KeyCode::Char('j'), KeyCode::Char('j'), KeyCode::Down] {
            assert!(key(&mut a, c));
        }
        assert_eq!(a.sel[0], 2, "clamped at the last row");
        key(&mut a, KeyCode::Char('k'));
        assert_eq!(a.sel[0], 1);
        for _ in 0..5 {
            key(&mut a, KeyCode::Up);
        }
        assert_eq!(a.sel[0], 0, "clamped at the first row");
        key(&mut a, KeyCode::End);
        assert_eq!(a.sel[0], 2);
        key(&mut a, KeyCode::Char('g'));
        assert_eq!(a.sel[0], 0);
    }

    #[test]
    fn an_empty_table_keeps_row_zero() {
        let mut a = app(0, 0);
        key(&mut a, KeyCode::Char('j'));
        key(&mut a, KeyCode::Char('k'));
        assert_eq!(a.sel[0], 0);
        key(&mut a, KeyCode::Enter);
        assert!(!a.detail, "no details of nothing");
    }

    #[test]
    fn tab_switches_pane_and_moves_only_the_focused_one() {
        let mut a = app(3, 10);
        key(&mut a, KeyCode::Tab);
        assert_eq!(a.focus, Pane::Socks);
        key(&mut a, KeyCode::Char('j'));
        assert_eq!(a.sel, [0, 1, 0]);
        key(&mut a, KeyCode::Tab);
        assert_eq!(a.focus, Pane::Events);
        key(&mut a, KeyCode::Char('k'));
        assert_eq!(a.sel[2], 1, "up scrolls the log to older lines");
        key(&mut a, KeyCode::Tab);
        assert_eq!(a.focus, Pane::Conns);
        key(&mut a, KeyCode::BackTab);
        assert_eq!(a.focus, Pane::Events);
    }

    #[test]
    fn s_cycles_the_sort_of_the_focused_pane() {
        let mut a = app(3, 10);
        let mut seen = vec![a.conn_sort];
        for _ in 0..5 {
            key(&mut a, KeyCode::Char('s'));
            seen.push(a.conn_sort);
        }
        assert_eq!(seen.first(), seen.last(), "back to the start after a full cycle");
        assert_eq!(seen[..5], [ConnSort::Verdict, ConnSort::Age, ConnSort::Up, ConnSort::Down, ConnSort::Id]);
        assert_eq!(a.sock_sort, SockSort::Verdict);
        key(&mut a, KeyCode::Tab);
        key(&mut a, KeyCode::Char('s'));
        assert_eq!(a.sock_sort, SockSort::Blocked);
    }

    #[test]
    fn slash_edits_the_filter_enter_keeps_it_esc_clears_it() {
        let mut a = app(3, 10);
        key(&mut a, KeyCode::Char('/'));
        assert!(a.editing);
        for c in "Sing-q".chars() {
            assert!(key(&mut a, KeyCode::Char(c)), "q is text while editing");
        }
        key(&mut a, KeyCode::Backspace);
        assert_eq!(a.filter, "sing-");
        key(&mut a, KeyCode::Enter);
        assert!(!a.editing);
        assert_eq!(a.filter, "sing-");
        // Esc clears a kept filter before it quits.
        assert!(key(&mut a, KeyCode::Esc));
        assert!(a.filter.is_empty());
        key(&mut a, KeyCode::Char('/'));
        key(&mut a, KeyCode::Char('x'));
        key(&mut a, KeyCode::Esc);
        assert!(!a.editing && a.filter.is_empty());
    }

    #[test]
    fn p_pauses_and_resumes() {
        let mut a = app(3, 10);
        key(&mut a, KeyCode::Char('p'));
        assert!(a.paused);
        key(&mut a, KeyCode::Char('p'));
        assert!(!a.paused);
    }

    #[test]
    fn question_mark_toggles_help_and_esc_closes_it_first() {
        let mut a = app(3, 10);
        key(&mut a, KeyCode::Char('?'));
        assert!(a.help);
        key(&mut a, KeyCode::Char('?'));
        assert!(!a.help);
        key(&mut a, KeyCode::Char('?'));
        assert!(key(&mut a, KeyCode::Esc), "Esc closes the overlay, does not quit");
        assert!(!a.help);
    }

    #[test]
    fn enter_opens_details_and_esc_closes_them_before_quitting() {
        let mut a = app(3, 10);
        key(&mut a, KeyCode::Enter);
        assert!(a.detail);
        assert!(key(&mut a, KeyCode::Esc));
        assert!(!a.detail);
        assert!(!key(&mut a, KeyCode::Esc), "then Esc quits");
    }

    #[test]
    fn q_quits() {
        let mut a = app(3, 10);
        assert!(!key(&mut a, KeyCode::Char('q')));
        let mut a = app(3, 10);
        key(&mut a, KeyCode::Char('?'));
        assert!(!key(&mut a, KeyCode::Char('q')), "even with help open");
    }

    #[test]
    fn selection_follows_its_id_across_resorts_and_scrolls_into_view() {
        let mut a = app(0, 0);
        a.resolve(Pane::Conns, &[1, 2, 3, 4, 5, 6, 7, 8], 3);
        for _ in 0..5 {
            key(&mut a, KeyCode::Char('j'));
        }
        let off = a.resolve(Pane::Conns, &[1, 2, 3, 4, 5, 6, 7, 8], 3);
        assert_eq!((a.sel[0], off, a.sel_id[0]), (5, 3, Some(6)));
        assert_eq!(a.visible[0], vec![4, 5, 6]);
        // A re-sort: id 6 is now first.
        let off = a.resolve(Pane::Conns, &[6, 1, 2, 3, 4, 5, 7, 8], 3);
        assert_eq!((a.sel[0], off), (0, 0));
        // It vanished: the index is kept, clamped.
        a.resolve(Pane::Conns, &[1, 2], 3);
        assert_eq!(a.sel[0], 0);
    }
}
