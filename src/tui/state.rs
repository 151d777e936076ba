//! The pure state of `twofold top`: which view, which row, how rows are sorted and
//! filtered, pause, help, the drill-down into one file. [`State::handle`] turns a key into a
//! state change and an [`Action`] for the event loop; nothing here touches a terminal, so
//! key sequences are tested as plain values. Rows are picked from a [`Report`] by
//! [`State::file_rows`] and its siblings: the views draw exactly those.

use std::collections::BTreeSet;
use std::sync::Arc;

pub use super::filter::{Cmp, Filter};
use super::history::History;
pub use super::keys::{command_of, Action, Command, Key, View};
use super::mouse::Hit;
pub use super::mouse::Hits;
use super::rows::Query;
pub use super::rows::{holder_rows, process_holds, HolderRow};
use crate::engine::Progress;
use crate::model::fields::Field;
use crate::model::residency::MapModel;
use crate::model::{CgroupModel, FileModel, ProcessModel, Report};
use crate::sample::FileKey;

/// The state of the screen.
#[derive(Debug, Clone)]
pub struct State {
    pub view: View,
    /// Selected row of each view (index into its filtered, sorted rows).
    pub selected: [usize; 3],
    /// Sort column of each view (index into [`View::sort_columns`]) and its direction.
    pub sort: [usize; 3],
    pub reverse: [bool; 3],
    /// The filter text (applies to every view).
    pub filter: String,
    /// The filter line is being edited.
    pub editing: bool,
    pub paused: bool,
    pub help: bool,
    /// The file drilled into (Enter on the files view).
    pub open: Option<FileKey>,
    /// Colours (off under `NO_COLOR`).
    pub color: bool,
    /// Collection interval, shown in the header.
    pub interval_secs: f64,
    /// Memory pressure (`/proc/pressure/memory` some/full avg10) of the report shown, when
    /// known.
    pub psi: Option<Psi>,
    /// twofold's own CPU (percent of one core) and RSS, when known.
    pub own_cpu_percent: Option<f64>,
    pub own_rss_bytes: Option<u64>,
    /// Where the report comes from: `live`, or the replay position.
    pub source: String,
    /// Warnings of the last collection (shown as a count and the first line).
    pub warnings: Vec<crate::sample::Warning>,
    /// Row counts seen at the last draw, to clamp the selection.
    pub rows_seen: [usize; 3],
    /// Each file's residency, refaults and held bytes over the session (sparklines).
    pub history: History,
    /// The page-cache map of the open file, as the collector last sent it.
    pub map: Option<(FileKey, Result<MapModel, String>)>,
    /// Selected row of the open file's holders table.
    pub file_row: usize,
    pub file_rows_seen: usize,
    /// A line for the status bar (a proof's outcome, damage of a recording).
    pub status: Option<String>,
    /// The proof started with `p`, while it runs.
    pub proving: Option<Proving>,
    /// eBPF tracing is on (the collector said so after `t`).
    pub tracing: bool,
    /// Where the last draw put its tables (for the mouse).
    pub hits: Hits,
    /// Cgroups whose processes are shown under them (Enter / → on a cgroup).
    pub expanded: BTreeSet<String>,
    /// The cgroups view's "by workload" rollup (`w`).
    pub workload: Workload,
    /// The reports come from a recording (`--replay`): no live memory to map or prove.
    pub replay: bool,
}

/// What `p` says in a replay.
pub const REPLAY_NO_PROOF: &str =
    "recordings hold no memory to prove: the copies shown are those proven when it was recorded";

/// How the cgroups view groups processes: the cgroup tree, or a rollup by comm or cgroup.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Workload {
    Off,
    ByComm,
    ByCgroup,
}

/// A proof running in the background.
#[derive(Debug, Clone)]
pub struct Proving {
    pub pid: i32,
    pub comm: String,
    pub progress: Arc<Progress>,
}

/// `some` and `full` avg10 of `/proc/pressure/memory`, percent, as the system sample
/// carries it.
pub use crate::sample::PressureSample as Psi;

impl State {
    pub fn new(view: View) -> State {
        State {
            view,
            selected: [0; 3],
            sort: [0; 3],
            reverse: [false; 3],
            filter: String::new(),
            editing: false,
            paused: false,
            help: false,
            open: None,
            color: true,
            interval_secs: 2.0,
            psi: None,
            own_cpu_percent: None,
            own_rss_bytes: None,
            source: "live".into(),
            warnings: Vec::new(),
            rows_seen: [0; 3],
            history: History::default(),
            map: None,
            file_row: 0,
            file_rows_seen: 0,
            status: None,
            proving: None,
            tracing: false,
            hits: Hits::default(),
            expanded: BTreeSet::new(),
            workload: Workload::Off,
            replay: false,
        }
    }

    /// Sorts by the column named `name` in whichever view has it (the current one
    /// first); `false` if no view does.
    pub fn set_sort(&mut self, name: &str) -> bool {
        let order = std::iter::once(self.view).chain(View::ALL);
        for v in order {
            if let Some(i) = v.sort_fields().iter().position(|c| c.name() == name) {
                self.sort[v.index()] = i;
                return true;
            }
        }
        false
    }

    pub fn sort_column(&self, view: View) -> &'static str {
        self.sort_field(view).name()
    }

    pub fn sort_field(&self, view: View) -> Field {
        view.sort_fields()[self.sort[view.index()]]
    }

    pub fn is_reversed(&self, view: View) -> bool {
        self.reverse[view.index()]
    }

    pub fn selected(&self, view: View) -> usize {
        self.selected[view.index()]
    }

    /// The parsed filter; `None` when there is none, or it is not valid (then
    /// [`State::filter_error`] says why, and nothing is filtered).
    pub fn parsed_filter(&self) -> Option<Filter> {
        (!self.filter.trim().is_empty())
            .then(|| Filter::parse(&self.filter).ok())
            .flatten()
    }

    /// Why the filter is not applied, when it is not valid.
    pub fn filter_error(&self) -> Option<String> {
        (!self.filter.trim().is_empty())
            .then(|| Filter::parse(&self.filter).err())
            .flatten()
    }

    /// Handles one key: the filter line and the help take every key while they are up;
    /// otherwise the key's [`Command`] in the key table ([`super::keys::BINDINGS`]).
    pub fn handle(&mut self, key: Key) -> Action {
        if key == Key::Interrupt {
            return Action::Quit;
        }
        if key == Key::Resize {
            return Action::Redraw;
        }
        if self.editing {
            return self.edit(key);
        }
        if self.help {
            // Any key closes the help; q still quits.
            self.help = false;
            return match key {
                Key::Char('q') => Action::Quit,
                _ => Action::Redraw,
            };
        }
        match command_of(key) {
            Some(Command::Click) => match key {
                Key::Click(x, y) => self.click(x, y),
                _ => Action::None,
            },
            Some(c) => self.command(c),
            None => Action::None,
        }
    }

    fn command(&mut self, c: Command) -> Action {
        let v = self.view.index();
        let cgroups = self.view == View::Cgroups;
        match c {
            Command::Quit => Action::Quit,
            Command::Back if self.proving.is_some() => Action::CancelProve,
            Command::Back if self.open.is_some() => {
                self.open = None;
                Action::Redraw
            }
            Command::Back if self.workload != Workload::Off && cgroups => {
                self.workload = Workload::Off;
                Action::Redraw
            }
            Command::Back if !self.filter.is_empty() => {
                self.filter.clear();
                Action::Redraw
            }
            Command::Back => Action::Quit,
            Command::Help => {
                self.help = true;
                Action::Redraw
            }
            Command::NextView => self.switch(View::ALL[(v + 1) % 3]),
            Command::PrevView => self.switch(View::ALL[(v + 2) % 3]),
            Command::Show(view) => self.switch(view),
            Command::Wheel(d) | Command::Move(d) => self.move_by(d),
            Command::Prove if self.proving.is_some() => {
                self.status = Some("a proof is running (Esc cancels it)".into());
                Action::Redraw
            }
            Command::Prove if self.replay => {
                self.status = Some(REPLAY_NO_PROOF.into());
                Action::Redraw
            }
            Command::Prove if self.view == View::Files => Action::Prove,
            Command::Prove => Action::None,
            Command::Trace => Action::ToggleTrace,
            Command::Workload => {
                self.view = View::Cgroups;
                self.workload = match self.workload {
                    Workload::Off => Workload::ByComm,
                    Workload::ByComm => Workload::ByCgroup,
                    Workload::ByCgroup => Workload::Off,
                };
                self.selected[View::Cgroups.index()] = 0;
                Action::Redraw
            }
            Command::Open | Command::Expand if cgroups => Action::Open,
            Command::Open if self.view == View::Files && self.open.is_none() => Action::Open,
            Command::Fold if cgroups => Action::Fold,
            Command::Open | Command::Expand | Command::Fold => Action::None,
            Command::NextSort => {
                let n = self.view.sort_fields().len();
                self.sort[v] = (self.sort[v] + 1) % n;
                Action::Redraw
            }
            Command::ReverseSort => {
                self.reverse[v] = !self.reverse[v];
                Action::Redraw
            }
            Command::EditFilter => {
                self.editing = true;
                Action::Redraw
            }
            Command::Pause => {
                self.paused = !self.paused;
                Action::Redraw
            }
            Command::Step(d) => Action::Step(d),
            Command::Click => Action::None,
        }
    }

    /// Enter on the files view: opens the selected file of `report`. On the cgroups
    /// view, Enter / → expand the selected cgroup's processes and ← folds them.
    pub fn open_selected(&mut self, report: &Report) -> bool {
        if self.view == View::Cgroups {
            return self.toggle_cgroup(report);
        }
        if self.view != View::Files || self.open.is_some() {
            return false;
        }
        let rows = self.file_rows(report);
        match rows.get(self.selected(View::Files)) {
            Some(f) => {
                self.open = Some(f.key);
                self.file_row = 0;
                true
            }
            None => false,
        }
    }

    fn edit(&mut self, key: Key) -> Action {
        match key {
            Key::Enter => self.editing = false,
            Key::Esc => {
                self.editing = false;
                self.filter.clear();
            }
            Key::Backspace => {
                self.filter.pop();
            }
            Key::Char(c) => self.filter.push(c),
            _ => return Action::None,
        }
        self.selected = [0; 3];
        Action::Redraw
    }

    pub(super) fn index_of(view: View) -> usize {
        view.index()
    }

    /// A left click at (`x`, `y`), on what the last draw put there.
    fn click(&mut self, x: u16, y: u16) -> Action {
        let v = self.view.index();
        match self.hits.at(x, y) {
            None | Some(Hit::Nothing) => Action::None,
            Some(Hit::Tab(view)) => {
                self.view = view;
                self.open = None;
                Action::Redraw
            }
            Some(Hit::Header(name)) => {
                if self.sort_column(self.view) == name {
                    self.reverse[v] = !self.reverse[v];
                } else if let Some(i) = self
                    .view
                    .sort_fields()
                    .iter()
                    .position(|c| c.name() == name)
                {
                    self.sort[v] = i;
                    self.reverse[v] = false;
                }
                Action::Redraw
            }
            Some(Hit::Row(row)) if self.view == View::Files && self.open.is_some() => {
                if row < self.file_rows_seen {
                    self.file_row = row;
                    return Action::Redraw;
                }
                Action::None
            }
            Some(Hit::Row(row)) if row >= self.rows_seen[v] => Action::None,
            Some(Hit::Row(row))
                if self.selected[v] == row && matches!(self.view, View::Files | View::Cgroups) =>
            {
                Action::Open
            }
            Some(Hit::Row(row)) => {
                self.selected[v] = row;
                Action::Redraw
            }
        }
    }

    fn switch(&mut self, view: View) -> Action {
        self.view = view;
        self.open = None;
        Action::Redraw
    }

    pub(super) fn move_by(&mut self, delta: i64) -> Action {
        if self.view == View::Files && self.open.is_some() {
            let max = self.file_rows_seen.saturating_sub(1) as i64;
            self.file_row = (self.file_row as i64).saturating_add(delta).clamp(0, max) as usize;
            return Action::Redraw;
        }
        let v = self.view.index();
        let max = self.rows_seen[v].saturating_sub(1) as i64;
        let new = (self.selected[v] as i64)
            .saturating_add(delta)
            .clamp(0, max);
        self.selected[v] = new as usize;
        Action::Redraw
    }

    /// Records how many rows each view has now (selection stays inside them).
    pub fn clamp_to(&mut self, report: &Report) {
        // Counted, not sorted: the screen sorts the view it draws.
        let (files, processes) = super::rows::counts(report, self.parsed_filter().as_ref());
        self.rows_seen = [files, processes, self.cgroup_view_len(report)];
        for (sel, n) in self.selected.iter_mut().zip(self.rows_seen) {
            *sel = (*sel).min(n.saturating_sub(1));
        }
        self.file_rows_seen = self
            .open
            .and_then(|k| report.files.iter().find(|f| f.key == k))
            .map_or(0, |f| holder_rows(f).len());
        self.file_row = self.file_row.min(self.file_rows_seen.saturating_sub(1));
    }

    /// What picks the rows of `view` now.
    fn query(&self, view: View) -> Query {
        Query {
            filter: self.parsed_filter(),
            sort: self.sort_field(view),
            reverse: self.is_reversed(view),
        }
    }

    /// The files view's rows: filtered, then sorted.
    pub fn file_rows<'r>(&self, report: &'r Report) -> Vec<&'r FileModel> {
        super::rows::files(report, &self.query(View::Files))
    }

    pub fn process_rows<'r>(&self, report: &'r Report) -> Vec<&'r ProcessModel> {
        super::rows::processes(report, &self.query(View::Processes))
    }

    /// The findings pane's findings: those the filter keeps.
    pub fn findings<'r>(&self, report: &'r Report) -> Vec<&'r crate::model::Finding> {
        super::rows::findings(report, self.parsed_filter().as_ref())
    }

    pub fn cgroup_rows<'r>(&self, report: &'r Report) -> Vec<&'r CgroupModel> {
        super::rows::cgroups(report, &self.query(View::Cgroups))
    }

    /// What `p` proves: in the open file, the selected row's process when it holds a
    /// suspected copy, else the file's first suspected copy; on the files view, the
    /// selected file's first suspected copy. `(pid, comm)`, or why there is none.
    pub fn prove_target(&self, report: &Report) -> Result<(i32, String), String> {
        let file = match self.open {
            Some(k) => report.files.iter().find(|f| f.key == k),
            None => self
                .file_rows(report)
                .get(self.selected(View::Files))
                .copied(),
        };
        let Some(f) = file else {
            return Err("no file selected".into());
        };
        let selected_pid = self
            .open
            .and_then(|_| holder_rows(f).get(self.file_row).map(|r| r.pid()));
        let suspect = selected_pid
            .and_then(|pid| f.suspected_copies.iter().find(|c| c.pid == pid))
            .or_else(|| f.suspected_copies.first());
        match suspect {
            Some(c) => Ok((c.pid, c.comm.clone())),
            None => {
                // Another file's suspicion (the count line of the screen may be about it).
                let name = |f: &crate::model::FileModel| {
                    crate::render::safe::safe(f.path.rsplit('/').next().unwrap_or(&f.path))
                        .into_owned()
                };
                match report
                    .files
                    .iter()
                    .find(|g| g.key != f.key && !g.suspected_copies.is_empty())
                {
                    Some(g) => Err(format!(
                        "no suspected copy of '{}' to prove; '{}' has one (pid {}): select it",
                        name(f),
                        name(g),
                        g.suspected_copies[0].pid
                    )),
                    None => Err(format!("no suspected copy of '{}' to prove", name(f))),
                }
            }
        }
    }
}

#[cfg(test)]
#[path = "state_tests.rs"]
mod tests;
