//! The pure state of `twofold top`: which view, which row, how rows are sorted and
//! filtered, pause, help, the drill-down into one file. [`State::handle`] turns a key into a
//! state change and an [`Action`] for the event loop; nothing here touches a terminal, so
//! key sequences are tested as plain values. Rows are picked from a [`Report`] by
//! [`State::file_rows`] and its siblings: the views draw exactly those.

use std::collections::BTreeSet;
use std::sync::Arc;

use super::history::History;
pub use super::mouse::Hits;
use crate::dupes::prove::Progress;
use crate::model::fields::{CgroupField, FileField, ProcessField, Unit, Value};
use crate::model::residency::MapModel;
use crate::model::{CgroupModel, FileModel, ProcessModel, Report};
use crate::sample::FileKey;

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

    fn index(self) -> usize {
        match self {
            View::Files => 0,
            View::Processes => 1,
            View::Cgroups => 2,
        }
    }

    /// The sortable fields, in the order `s` cycles through them; the first is the default.
    pub fn sort_fields(self) -> &'static [Field] {
        match self {
            View::Files => &FILE_SORT,
            View::Processes => &PROCESS_SORT,
            View::Cgroups => &CGROUP_SORT,
        }
    }

    /// The names of [`View::sort_fields`] (what `--sort` and a click on a header take).
    pub fn sort_columns(self) -> Vec<&'static str> {
        self.sort_fields().iter().map(|f| f.name()).collect()
    }
}

/// A field of one of the views' rows, from the registry ([`crate::model::fields`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Field {
    File(FileField),
    Process(ProcessField),
    Cgroup(CgroupField),
}

impl Field {
    /// The name `top` sorts and filters by.
    pub const fn name(self) -> &'static str {
        match self {
            Field::File(f) => match f.name() {
                Some(n) => n,
                None => "",
            },
            Field::Process(f) => f.name(),
            Field::Cgroup(f) => f.name(),
        }
    }
}

const FILE_SORT: [Field; 9] = {
    use FileField as F;
    [
        Field::File(F::Count),
        Field::File(F::Size),
        Field::File(F::Cache),
        Field::File(F::Cow),
        Field::File(F::Private),
        Field::File(F::Suspected),
        Field::File(F::Resident),
        Field::File(F::Holders),
        Field::File(F::Path),
    ]
};

const PROCESS_SORT: [Field; 14] = {
    use ProcessField as P;
    [
        Field::Process(P::Rss),
        Field::Process(P::Anon),
        Field::Process(P::File),
        Field::Process(P::Pss),
        Field::Process(P::Growth),
        Field::Process(P::Files),
        Field::Process(P::Pid),
        Field::Process(P::Comm),
        Field::Process(P::Shmem),
        Field::Process(P::Cow),
        Field::Process(P::Uss),
        Field::Process(P::Dirty),
        Field::Process(P::Swap),
        Field::Process(P::Gpu),
    ]
};

const CGROUP_SORT: [Field; 10] = {
    use CgroupField as C;
    [
        Field::Cgroup(C::Usage),
        Field::Cgroup(C::Limit),
        Field::Cgroup(C::Anon),
        Field::Cgroup(C::File),
        Field::Cgroup(C::OomKills),
        Field::Cgroup(C::Path),
        Field::Cgroup(C::Peak),
        Field::Cgroup(C::High),
        Field::Cgroup(C::Refaults),
        Field::Cgroup(C::Psi),
    ]
};

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

/// One comparison of a `field>value` filter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cmp {
    Gt,
    Ge,
    Lt,
    Le,
    Eq,
}

/// A parsed filter: a substring of names, or a comparison on a column.
#[derive(Debug, Clone, PartialEq)]
pub enum Filter {
    Substring(String),
    Compare { field: String, cmp: Cmp, value: f64 },
}

impl Filter {
    /// `anon>1G`, `count>=2`, `resident<50` (percent), or any other text as a substring.
    pub fn parse(text: &str) -> Filter {
        let t = text.trim();
        for (op, cmp) in [
            (">=", Cmp::Ge),
            ("<=", Cmp::Le),
            (">", Cmp::Gt),
            ("<", Cmp::Lt),
            ("=", Cmp::Eq),
        ] {
            if let Some((field, value)) = t.split_once(op) {
                let field = field.trim().to_ascii_lowercase();
                let value = value.trim();
                let num = value
                    .trim_end_matches('%')
                    .parse::<f64>()
                    .ok()
                    .filter(|_| !value.chars().any(|c| c.is_ascii_alphabetic()))
                    .or_else(|| crate::units::parse_size(value).ok().map(|b| b as f64));
                if let (false, Some(value)) = (field.is_empty(), num) {
                    return Filter::Compare { field, cmp, value };
                }
            }
        }
        Filter::Substring(t.to_lowercase())
    }

    pub(super) fn compare(cmp: Cmp, have: Option<f64>, want: f64) -> bool {
        // An unknown value never passes a comparison.
        let Some(have) = have else { return false };
        match cmp {
            Cmp::Gt => have > want,
            Cmp::Ge => have >= want,
            Cmp::Lt => have < want,
            Cmp::Le => have <= want,
            Cmp::Eq => (have - want).abs() < 1e-9_f64.max(want.abs() * 1e-9),
        }
    }
}

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
    /// Memory pressure (`/proc/pressure/memory` some/full avg10), when known.
    pub psi: Option<Psi>,
    /// twofold's own CPU (percent of one core) and RSS, when known.
    pub own_cpu_percent: Option<f64>,
    pub own_rss_bytes: Option<u64>,
    /// Where the report comes from: `live`, or the replay position.
    pub source: String,
    /// Warnings of the last collection (shown as a count and the first line).
    pub warnings: Vec<String>,
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
}

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

/// `some` and `full` avg10 of `/proc/pressure/memory`, percent.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Psi {
    pub some_avg10: f64,
    pub full_avg10: Option<f64>,
}

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

    /// The parsed filter; `None` when there is none.
    pub fn parsed_filter(&self) -> Option<Filter> {
        (!self.filter.trim().is_empty()).then(|| Filter::parse(&self.filter))
    }

    /// Handles one key.
    pub fn handle(&mut self, key: Key) -> Action {
        if key == Key::Interrupt {
            return Action::Quit;
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
        let v = self.view.index();
        match key {
            Key::Char('q') => Action::Quit,
            Key::Esc if self.proving.is_some() => Action::CancelProve,
            Key::Esc if self.open.is_some() => {
                self.open = None;
                Action::Redraw
            }
            Key::Esc if self.workload != Workload::Off && self.view == View::Cgroups => {
                self.workload = Workload::Off;
                Action::Redraw
            }
            Key::Esc if !self.filter.is_empty() => {
                self.filter.clear();
                Action::Redraw
            }
            Key::Esc => Action::Quit,
            Key::Char('?') => {
                self.help = true;
                Action::Redraw
            }
            Key::Tab => self.switch(View::ALL[(v + 1) % 3]),
            Key::BackTab => self.switch(View::ALL[(v + 2) % 3]),
            Key::Char('1') => self.switch(View::Files),
            Key::Char('2') => self.switch(View::Processes),
            Key::Char('3') => self.switch(View::Cgroups),
            Key::Click(x, y) => self.click(x, y),
            Key::WheelUp => self.move_by(-3),
            Key::WheelDown => self.move_by(3),
            Key::Char('p') if self.proving.is_some() => {
                self.status = Some("a proof is running (Esc cancels it)".into());
                Action::Redraw
            }
            Key::Char('p') if self.view == View::Files => Action::Prove,
            Key::Char('t') => Action::ToggleTrace,
            Key::Char('w') => {
                self.view = View::Cgroups;
                self.workload = match self.workload {
                    Workload::Off => Workload::ByComm,
                    Workload::ByComm => Workload::ByCgroup,
                    Workload::ByCgroup => Workload::Off,
                };
                self.selected[View::Cgroups.index()] = 0;
                Action::Redraw
            }
            Key::Enter | Key::Right if self.view == View::Cgroups => Action::Open,
            Key::Left if self.view == View::Cgroups => Action::Fold,
            Key::Up | Key::Char('k') => self.move_by(-1),
            Key::Down | Key::Char('j') => self.move_by(1),
            Key::PageUp => self.move_by(-10),
            Key::PageDown => self.move_by(10),
            Key::Home | Key::Char('g') => self.move_by(i64::MIN / 2),
            Key::End | Key::Char('G') => self.move_by(i64::MAX / 2),
            Key::Char('s') => {
                let n = self.view.sort_fields().len();
                self.sort[v] = (self.sort[v] + 1) % n;
                Action::Redraw
            }
            Key::Char('S') => {
                self.reverse[v] = !self.reverse[v];
                Action::Redraw
            }
            Key::Char('/') => {
                self.editing = true;
                Action::Redraw
            }
            Key::Char(' ') => {
                self.paused = !self.paused;
                Action::Redraw
            }
            Key::Char('[') => Action::Step(-1),
            Key::Char(']') => Action::Step(1),
            Key::Enter if self.view == View::Files && self.open.is_none() => Action::Open,
            Key::Resize => Action::Redraw,
            _ => Action::None,
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
        self.rows_seen = [
            self.file_rows(report).len(),
            self.process_rows(report).len(),
            self.cgroup_view_len(report),
        ];
        for (sel, n) in self.selected.iter_mut().zip(self.rows_seen) {
            *sel = (*sel).min(n.saturating_sub(1));
        }
        self.file_rows_seen = self
            .open
            .and_then(|k| report.files.iter().find(|f| f.key == k))
            .map_or(0, |f| holder_rows(f).len());
        self.file_row = self.file_row.min(self.file_rows_seen.saturating_sub(1));
    }

    /// The files view's rows: filtered, then sorted.
    pub fn file_rows<'r>(&self, report: &'r Report) -> Vec<&'r FileModel> {
        let filter = self.parsed_filter();
        let mut rows: Vec<&FileModel> = report
            .files
            .iter()
            .filter(|f| match &filter {
                None => true,
                Some(Filter::Substring(s)) => f.path.to_lowercase().contains(s.as_str()),
                Some(Filter::Compare { field, cmp, value }) => Filter::compare(
                    *cmp,
                    FileField::named(field).and_then(|k| k.ordinal(f)),
                    *value,
                ),
            })
            .collect();
        if let Field::File(col) = self.sort_field(View::Files) {
            sort_rows(&mut rows, self.is_reversed(View::Files), |f| {
                Sortable::of(col.unit(), || col.value(f), || col.ordinal(f))
            });
        }
        rows
    }

    pub fn process_rows<'r>(&self, report: &'r Report) -> Vec<&'r ProcessModel> {
        let filter = self.parsed_filter();
        let mut rows: Vec<&ProcessModel> = report
            .processes
            .iter()
            .filter(|p| match &filter {
                None => true,
                Some(Filter::Substring(s)) => {
                    p.comm.to_lowercase().contains(s.as_str())
                        || p.cmdline.to_lowercase().contains(s.as_str())
                        || p.pid.to_string() == *s
                }
                Some(Filter::Compare { field, cmp, value }) => Filter::compare(
                    *cmp,
                    ProcessField::named(field).and_then(|k| k.ordinal(report, p)),
                    *value,
                ),
            })
            .collect();
        if let Field::Process(col) = self.sort_field(View::Processes) {
            sort_rows(&mut rows, self.is_reversed(View::Processes), |p| {
                Sortable::of(
                    col.unit(),
                    || col.value(report, p),
                    || col.ordinal(report, p),
                )
            });
        }
        rows
    }

    pub fn cgroup_rows<'r>(&self, report: &'r Report) -> Vec<&'r CgroupModel> {
        let filter = self.parsed_filter();
        let mut rows: Vec<&CgroupModel> = report
            .cgroups
            .iter()
            .filter(|c| match &filter {
                None => true,
                Some(Filter::Substring(s)) => c.path.to_lowercase().contains(s.as_str()),
                Some(Filter::Compare { field, cmp, value }) => {
                    Filter::compare(*cmp, cgroup_value(c, field), *value)
                }
            })
            .collect();
        if let Field::Cgroup(col) = self.sort_field(View::Cgroups) {
            sort_rows(&mut rows, self.is_reversed(View::Cgroups), |c| {
                Sortable::of(col.unit(), || col.value(c), || col.ordinal(c))
            });
        }
        rows
    }
}

/// The value of the cgroup field named `field`, as `top` compares it.
pub(super) fn cgroup_value(c: &CgroupModel, field: &str) -> Option<f64> {
    CgroupField::named(field).and_then(|k| k.ordinal(c))
}

/// A row of the open file's table: a mapper, a holder of an open fd that does not map
/// it, or a copy holder that neither maps nor holds it.
#[derive(Debug, Clone, Copy)]
pub enum HolderRow<'r> {
    Mapper(&'r crate::model::Mapper),
    OpenFd(i32, &'r str),
    NotOpen(i32, &'r str),
}

impl HolderRow<'_> {
    pub fn pid(&self) -> i32 {
        match self {
            HolderRow::Mapper(m) => m.pid,
            HolderRow::OpenFd(p, _) | HolderRow::NotOpen(p, _) => *p,
        }
    }
}

/// The open file's table, in the order it is drawn.
pub fn holder_rows(f: &FileModel) -> Vec<HolderRow<'_>> {
    let mut rows: Vec<HolderRow> = f.mappers.iter().map(HolderRow::Mapper).collect();
    rows.extend(
        f.holders
            .iter()
            .filter(|h| !h.mapped)
            .map(|h| HolderRow::OpenFd(h.pid, &h.comm)),
    );
    rows.extend(
        crate::render::scan::unlisted_copy_holders(f)
            .into_iter()
            .map(|(pid, comm)| HolderRow::NotOpen(pid, comm)),
    );
    rows
}

impl State {
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
            None => Err("no suspected copy of this file to prove".into()),
        }
    }
}

enum Sortable {
    Num(Option<f64>),
    Text(String),
}

impl Sortable {
    /// Text sorts as text; anything else by its number as `top` compares it.
    fn of<'a>(
        unit: Unit,
        value: impl FnOnce() -> Value<'a>,
        ordinal: impl FnOnce() -> Option<f64>,
    ) -> Sortable {
        match unit {
            Unit::Text => Sortable::Text(value().text().unwrap_or_default().to_string()),
            _ => Sortable::Num(ordinal()),
        }
    }
}

/// Numbers largest first, text A→Z; unknown values last either way; stable, so equal
/// rows keep the report's order. Each row's key is computed once (a key may scan the
/// report: the growth rate, the CoW bytes).
fn sort_rows<T: Copy>(rows: &mut Vec<T>, reverse: bool, key: impl Fn(&T) -> Sortable) {
    use std::cmp::Ordering;
    let mut keyed: Vec<(Sortable, T)> = rows.drain(..).map(|r| (key(&r), r)).collect();
    keyed.sort_by(|(a, _), (b, _)| match (a, b) {
        (Sortable::Num(x), Sortable::Num(y)) => match (x, y) {
            (Some(x), Some(y)) => {
                let o = y.total_cmp(x);
                if reverse {
                    o.reverse()
                } else {
                    o
                }
            }
            (Some(_), None) => Ordering::Less,
            (None, Some(_)) => Ordering::Greater,
            (None, None) => Ordering::Equal,
        },
        (Sortable::Text(x), Sortable::Text(y)) => {
            let o = x.cmp(y);
            if reverse {
                o.reverse()
            } else {
                o
            }
        }
        _ => Ordering::Equal,
    });
    rows.extend(keyed.into_iter().map(|(_, r)| r));
}

/// How the process holds each model file: `map` (MAP_SHARED), `priv` (MAP_PRIVATE),
/// `fd` (open, not mapped), `copy` (a proven private copy), `copy?` (suspected), with the
/// file's name: `map llama.gguf, copy qwen.safetensors`.
pub fn process_holds(report: &Report, pid: i32) -> String {
    let mut out: Vec<String> = Vec::new();
    for f in &report.files {
        let name = f.path.rsplit('/').next().unwrap_or(&f.path);
        let mut how: Vec<&str> = Vec::new();
        if let Some(m) = f.mappers.iter().find(|m| m.pid == pid) {
            how.push(match m.kind {
                crate::model::MapKind::Shared => "map",
                crate::model::MapKind::Private => "priv",
                _ => "map+priv",
            });
        } else if f.holders.iter().any(|h| h.pid == pid) {
            how.push("fd");
        }
        if f.proven_copies.iter().any(|c| c.pid == pid) {
            how.push("copy");
        } else if f.suspected_copies.iter().any(|c| c.pid == pid) {
            how.push("copy?");
        }
        if !how.is_empty() {
            out.push(format!("{} {name}", how.join("+")));
        }
    }
    out.join(", ")
}

#[cfg(test)]
#[path = "state_tests.rs"]
mod tests;
