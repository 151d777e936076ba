//! The words the event loop and the state speak: the three views (with the fields each
//! sorts by, in the order `s` cycles through them), the keys the loop hands over and the
//! actions it gets back. Plain values, no dependencies on the rest of the TUI.

use crate::model::fields::{sort, Field};

/// The three tables.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum View {
    Files,
    Processes,
    Cgroups,
}

impl View {
    pub const ALL: [View; 3] = [View::Files, View::Processes, View::Cgroups];

    pub fn title(self) -> &'static str {
        match self {
            View::Files => "Files",
            View::Processes => "Processes",
            View::Cgroups => "Cgroups",
        }
    }

    pub(super) fn index(self) -> usize {
        match self {
            View::Files => 0,
            View::Processes => 1,
            View::Cgroups => 2,
        }
    }

    /// The sortable fields, in the order `s` cycles through them; the first is the default.
    pub fn sort_fields(self) -> &'static [Field] {
        match self {
            View::Files => &sort::FILES,
            View::Processes => &sort::PROCESSES,
            View::Cgroups => &sort::CGROUPS,
        }
    }

    /// The names of [`View::sort_fields`] (what `--sort` and a click on a header take).
    pub fn sort_columns(self) -> Vec<&'static str> {
        self.sort_fields().iter().map(|f| f.name()).collect()
    }
}

/// A key, as the event loop hands it over (crossterm's keys mapped onto these).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Key {
    Char(char),
    Enter,
    Esc,
    Tab,
    BackTab,
    Up,
    Down,
    PageUp,
    PageDown,
    Home,
    End,
    Backspace,
    /// The terminal was resized.
    Resize,
    /// Ctrl-C (raw mode delivers it as a key, not as SIGINT).
    Interrupt,
    Left,
    Right,
    /// A left click at a screen cell (column, row).
    Click(u16, u16),
    /// The mouse wheel, up or down.
    WheelUp,
    WheelDown,
}

/// What the event loop does after a key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Nothing changed.
    None,
    /// The state changed: draw again.
    Redraw,
    Quit,
    /// Open the selected file ([`State::open_selected`] with the current report).
    Open,
    /// Replay: show the snapshot before (-1) or after (+1) the current one.
    Step(i32),
    /// `p`: prove the process of the selected suspected copy ([`State::prove_target`]).
    Prove,
    /// Esc while a proof runs: cancel it.
    CancelProve,
    /// `t`: turn eBPF tracing on or off.
    ToggleTrace,
    /// ← on the cgroups view: fold the selected cgroup ([`State::fold_selected`]).
    Fold,
}
