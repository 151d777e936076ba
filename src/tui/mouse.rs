//! The mouse: a click on a tab switches view, on a column header sorts by that column (a
//! second click reverses it), on a row selects it (a click on the selected row opens it,
//! as Enter); the wheel moves the selection. Where things are comes from the last draw
//! ([`Hits`], filled by the view), so this stays pure and is tested without a terminal.

use super::state::{Action, State, View};

/// A clickable span of one screen row: `[x0, x1)` and what it stands for.
pub type Span<T> = (u16, u16, T);

/// Where the last draw put the clickable parts of the screen.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Hits {
    /// The tabs row and each tab's columns `[x0, x1)`.
    pub tabs: Option<(u16, Vec<Span<View>>)>,
    /// The table header row and each sortable column: `[x0, x1)` and its sort name.
    pub header: Option<(u16, Vec<Span<&'static str>>)>,
    /// The table body: first screen row, rows shown, index of the first row shown.
    pub body: Option<(u16, u16, usize)>,
}

impl State {
    pub(super) fn click(&mut self, x: u16, y: u16) -> Action {
        if let Some((ty, tabs)) = &self.hits.tabs {
            if *ty == y {
                return match tabs.iter().find(|(a, b, _)| (*a..*b).contains(&x)) {
                    Some((_, _, v)) => {
                        self.view = *v;
                        self.open = None;
                        Action::Redraw
                    }
                    None => Action::None,
                };
            }
        }
        if let Some((hy, cols)) = &self.hits.header {
            if *hy == y {
                let Some(name) = cols
                    .iter()
                    .find(|(a, b, _)| (*a..*b).contains(&x))
                    .map(|c| c.2)
                else {
                    return Action::None;
                };
                let v = State::index_of(self.view);
                if self.sort_column(self.view) == name {
                    self.reverse[v] = !self.reverse[v];
                } else if let Some(i) = self.view.sort_columns().iter().position(|c| *c == name) {
                    self.sort[v] = i;
                    self.reverse[v] = false;
                }
                return Action::Redraw;
            }
        }
        if let Some((by, n, offset)) = self.hits.body {
            if y >= by && y < by + n {
                let row = offset + usize::from(y - by);
                if self.view == View::Files && self.open.is_some() {
                    if row < self.file_rows_seen {
                        self.file_row = row;
                        return Action::Redraw;
                    }
                    return Action::None;
                }
                let v = State::index_of(self.view);
                if row >= self.rows_seen[v] {
                    return Action::None;
                }
                if self.selected[v] == row && matches!(self.view, View::Files | View::Cgroups) {
                    return Action::Open;
                }
                self.selected[v] = row;
                return Action::Redraw;
            }
        }
        Action::None
    }
}
