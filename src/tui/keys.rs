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

/// What a key asks for, before the state decides what it means where (Enter opens a file
/// on the files view and shows a cgroup's processes on the cgroups view).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Command {
    Quit,
    /// Esc: cancel a proof, else close the file, else leave the rollup, else clear the
    /// filter, else quit.
    Back,
    NextView,
    PrevView,
    Show(View),
    Move(i64),
    Open,
    Expand,
    Fold,
    Prove,
    Trace,
    Workload,
    NextSort,
    ReverseSort,
    EditFilter,
    Pause,
    Step(i32),
    Help,
    Click,
    Wheel(i64),
}

/// One line of the help: keys, what each asks for, and what the line says.
pub struct Binding {
    pub keys: &'static [(Key, Command)],
    pub help: &'static str,
}

/// Every key `top` acts on (outside the filter line), once: the key handler
/// ([`command_of`]) and the help overlay both read this table.
pub const BINDINGS: &[Binding] = &[
    Binding {
        keys: &[
            (Key::Char('q'), Command::Quit),
            (Key::Interrupt, Command::Quit),
        ],
        help: "quit",
    },
    Binding {
        keys: &[(Key::Esc, Command::Back)],
        help: "cancel proof, close file or rollup, clear filter, quit",
    },
    Binding {
        keys: &[
            (Key::Tab, Command::NextView),
            (Key::BackTab, Command::PrevView),
        ],
        help: "next, previous view",
    },
    Binding {
        keys: &[
            (Key::Char('1'), Command::Show(View::Files)),
            (Key::Char('2'), Command::Show(View::Processes)),
            (Key::Char('3'), Command::Show(View::Cgroups)),
        ],
        help: "files, processes, cgroups",
    },
    Binding {
        keys: &[
            (Key::Up, Command::Move(-1)),
            (Key::Down, Command::Move(1)),
            (Key::Char('k'), Command::Move(-1)),
            (Key::Char('j'), Command::Move(1)),
        ],
        help: "move the selection",
    },
    Binding {
        keys: &[
            (Key::PageUp, Command::Move(-10)),
            (Key::PageDown, Command::Move(10)),
            (Key::Home, Command::Move(i64::MIN / 2)),
            (Key::End, Command::Move(i64::MAX / 2)),
            (Key::Char('g'), Command::Move(i64::MIN / 2)),
            (Key::Char('G'), Command::Move(i64::MAX / 2)),
        ],
        help: "page up, down; top, bottom",
    },
    Binding {
        keys: &[(Key::Enter, Command::Open)],
        help: "open the file; cgroups: show its processes",
    },
    Binding {
        keys: &[(Key::Right, Command::Expand), (Key::Left, Command::Fold)],
        help: "cgroups: show, hide the processes of a cgroup",
    },
    Binding {
        keys: &[(Key::Char('p'), Command::Prove)],
        help: "prove a suspected copy byte by byte (live; Esc cancels)",
    },
    Binding {
        keys: &[(Key::Char('t'), Command::Trace)],
        help: "eBPF tracing on, off (live, root): refaults, reads",
    },
    Binding {
        keys: &[(Key::Char('w'), Command::Workload)],
        help: "cgroups by workload: by comm, by cgroup, tree",
    },
    Binding {
        keys: &[
            (Key::Char('s'), Command::NextSort),
            (Key::Char('S'), Command::ReverseSort),
        ],
        help: "next sort column, reverse the sort",
    },
    Binding {
        keys: &[(Key::Char('/'), Command::EditFilter)],
        help: "filter: text or field>value (anon>1G); Enter keeps",
    },
    Binding {
        keys: &[(Key::Char(' '), Command::Pause)],
        help: "pause (collection goes on, the screen holds)",
    },
    Binding {
        keys: &[
            (Key::Char('['), Command::Step(-1)),
            (Key::Char(']'), Command::Step(1)),
        ],
        help: "replay: previous, next snapshot",
    },
    Binding {
        keys: &[(Key::Char('?'), Command::Help)],
        help: "this help (any key closes it)",
    },
    Binding {
        keys: &[
            (Key::Click(0, 0), Command::Click),
            (Key::WheelUp, Command::Wheel(-3)),
            (Key::WheelDown, Command::Wheel(3)),
        ],
        help: "select, open, sort by a header, switch tab; move",
    },
];

/// What `key` asks for, from [`BINDINGS`] (a click wherever it is).
pub fn command_of(key: Key) -> Option<Command> {
    let same = |k: &Key| {
        std::mem::discriminant(k) == std::mem::discriminant(&key) && {
            !matches!(key, Key::Char(_)) || *k == key
        }
    };
    BINDINGS
        .iter()
        .flat_map(|b| b.keys.iter())
        .find(|(k, _)| same(k))
        .map(|(_, c)| *c)
}

/// A key as the help writes it.
pub fn key_name(key: Key) -> String {
    match key {
        Key::Char(' ') => "space".into(),
        Key::Char(c) => c.to_string(),
        Key::Enter => "Enter".into(),
        Key::Esc => "Esc".into(),
        Key::Tab => "Tab".into(),
        Key::BackTab => "Shift-Tab".into(),
        Key::Up => "↑".into(),
        Key::Down => "↓".into(),
        Key::PageUp => "PgUp".into(),
        Key::PageDown => "PgDn".into(),
        Key::Home => "Home".into(),
        Key::End => "End".into(),
        Key::Backspace => "Backspace".into(),
        Key::Resize => "resize".into(),
        Key::Interrupt => "Ctrl-C".into(),
        Key::Left => "←".into(),
        Key::Right => "→".into(),
        Key::Click(..) => "click".into(),
        Key::WheelUp | Key::WheelDown => "wheel".into(),
    }
}

impl Binding {
    /// Its keys as the help writes them (`PgUp PgDn Home End g G`).
    pub fn label(&self) -> String {
        let mut names: Vec<String> = Vec::new();
        for (k, _) in self.keys {
            let n = key_name(*k);
            if !names.contains(&n) {
                names.push(n);
            }
        }
        names.join(" ")
    }
}
