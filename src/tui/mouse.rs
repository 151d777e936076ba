//! The mouse: where the last draw put the clickable parts of the screen ([`Hits`], filled
//! by the view) and what a click at a cell hits ([`Hits::at`]): a tab, a column header
//! (its sort field's name) or a table row. What a hit does is the state's
//! ([`super::state::State::handle`]): a tab switches view, a header sorts by its column
//! (a second click reverses it), a row is selected (a click on the selected row opens
//! it, as Enter); the wheel moves the selection. Pure, tested without a terminal.

use super::keys::View;

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

/// What a click hit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hit {
    /// A tab.
    Tab(View),
    /// The tabs row or the header row, but nothing there.
    Nothing,
    /// A sortable column header, by its sort name.
    Header(&'static str),
    /// A row of the table body (an index into its rows).
    Row(usize),
}

/// The span of `spans` that holds column `x`.
fn find<T>(spans: &[Span<T>], x: u16) -> Option<usize> {
    spans.iter().position(|(a, b, _)| (*a..*b).contains(&x))
}

impl Hits {
    /// What the cell (`x`, `y`) is; `None` outside the tabs, the header and the body.
    pub fn at(&self, x: u16, y: u16) -> Option<Hit> {
        if let Some((ty, tabs)) = &self.tabs {
            if *ty == y {
                return Some(find(tabs, x).map_or(Hit::Nothing, |i| Hit::Tab(tabs[i].2)));
            }
        }
        if let Some((hy, cols)) = &self.header {
            if *hy == y {
                return Some(find(cols, x).map_or(Hit::Nothing, |i| Hit::Header(cols[i].2)));
            }
        }
        let (by, n, offset) = self.body?;
        (y >= by && y < by + n).then(|| Hit::Row(offset + usize::from(y - by)))
    }
}
