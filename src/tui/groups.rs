//! The cgroups view's rows: the tree of the report's cgroups (each under its nearest
//! listed ancestor, siblings in the sort order), with the processes of an expanded cgroup
//! under it; or the "by workload" rollup, processes grouped by comm or by cgroup. Pure.

use std::collections::BTreeMap;

use super::state::{Filter, State, View, Workload};
use crate::model::{CgroupModel, ProcessModel, Report};

/// One row of the cgroup tree.
#[derive(Debug, Clone, Copy)]
pub enum CgRow<'r> {
    Cgroup {
        cg: &'r CgroupModel,
        depth: usize,
        expanded: bool,
        /// Processes of the report in this cgroup.
        procs: usize,
    },
    Process {
        p: &'r ProcessModel,
        depth: usize,
    },
}

/// One workload of the rollup: its members' sums (`None` when a member's value is unknown).
#[derive(Debug, Clone, PartialEq)]
pub struct WorkloadRow {
    pub name: String,
    pub procs: usize,
    pub pss_bytes: Option<u64>,
    pub uss_bytes: Option<u64>,
    pub anon_bytes: Option<u64>,
    pub swap_bytes: Option<u64>,
    /// Memory of the proven private copies its members hold.
    pub copies_bytes: u64,
    /// Distinct model files its members map, hold open or hold a copy of.
    pub files: usize,
}

fn sum(values: impl Iterator<Item = Option<u64>>) -> Option<u64> {
    values.into_iter().try_fold(0u64, |a, v| Some(a + v?))
}

/// `parent` is an ancestor of `child` in cgroup paths.
fn is_ancestor(parent: &str, child: &str) -> bool {
    parent == "/" && child != "/"
        || child.len() > parent.len()
            && child.starts_with(parent)
            && child.as_bytes()[parent.len()] == b'/'
}

impl State {
    fn cgroup_passes(&self, c: &CgroupModel) -> bool {
        match self.parsed_filter() {
            None => true,
            Some(Filter::Substring(s)) => c.path.to_lowercase().contains(s.as_str()),
            Some(Filter::Compare { field, cmp, value }) => {
                Filter::compare(cmp, super::rows::cgroup_value(c, &field), value)
            }
        }
    }

    /// The tree: filtered cgroups, each under its nearest kept ancestor, siblings sorted.
    pub fn cgroup_tree<'r>(&self, report: &'r Report) -> Vec<CgRow<'r>> {
        let sorted = self.cgroup_rows(report);
        let kept: Vec<&CgroupModel> = sorted
            .into_iter()
            .filter(|c| self.cgroup_passes(c))
            .collect();
        // Each kept cgroup's nearest kept ancestor (an index into `kept`).
        let parent: Vec<Option<usize>> = kept
            .iter()
            .map(|c| {
                (0..kept.len())
                    .filter(|&i| is_ancestor(&kept[i].path, &c.path))
                    .max_by_key(|&i| kept[i].path.len())
            })
            .collect();
        let procs = self.process_rows_unfiltered(report);
        let mut out = Vec::new();
        // Depth-first, children in the sort order: push in reverse.
        let children = |under: Option<usize>| -> Vec<usize> {
            (0..kept.len()).filter(|&i| parent[i] == under).collect()
        };
        let mut todo: Vec<(usize, usize)> =
            children(None).into_iter().rev().map(|i| (i, 0)).collect();
        while let Some((i, depth)) = todo.pop() {
            let c = kept[i];
            let mine: Vec<&ProcessModel> = procs
                .iter()
                .copied()
                .filter(|p| p.cgroup.as_deref() == Some(c.path.as_str()))
                .collect();
            let expanded = self.expanded.contains(&c.path);
            out.push(CgRow::Cgroup {
                cg: c,
                depth,
                expanded,
                procs: mine.len(),
            });
            if expanded {
                out.extend(mine.into_iter().map(|p| CgRow::Process {
                    p,
                    depth: depth + 1,
                }));
            }
            todo.extend(children(Some(i)).into_iter().rev().map(|k| (k, depth + 1)));
        }
        out
    }

    /// The processes in the processes view's sort order, ignoring the filter (the
    /// filter of the cgroups view picks cgroups).
    fn process_rows_unfiltered<'r>(&self, report: &'r Report) -> Vec<&'r ProcessModel> {
        let mut st = self.clone();
        st.filter.clear();
        st.process_rows(report)
    }

    /// The rollup by comm or cgroup, largest PSS first (unknown last).
    pub fn workloads(&self, report: &Report) -> Vec<WorkloadRow> {
        let mut groups: BTreeMap<String, Vec<&ProcessModel>> = BTreeMap::new();
        for p in &report.processes {
            let key = match self.workload {
                Workload::ByCgroup => p.cgroup.clone().unwrap_or_else(|| "n/a".into()),
                _ => p.comm.clone(),
            };
            groups.entry(key).or_default().push(p);
        }
        let mut out: Vec<WorkloadRow> = groups
            .into_iter()
            .map(|(name, ps)| {
                let pids: Vec<i32> = ps.iter().map(|p| p.pid).collect();
                let mut files = 0;
                let mut copies_bytes = 0;
                for f in &report.files {
                    let of = |pid: &i32| pids.contains(pid);
                    files += usize::from(f.is_held_by(of));
                    copies_bytes += f.proven_copy_memory_of(of);
                }
                WorkloadRow {
                    name,
                    procs: ps.len(),
                    pss_bytes: sum(ps.iter().map(|p| p.pss_bytes)),
                    uss_bytes: sum(ps.iter().map(|p| p.uss_bytes)),
                    anon_bytes: sum(ps.iter().map(|p| p.anon_bytes)),
                    swap_bytes: sum(ps.iter().map(|p| p.swap_bytes)),
                    copies_bytes,
                    files,
                }
            })
            .filter(|w| match self.parsed_filter() {
                None => true,
                Some(Filter::Substring(s)) => w.name.to_lowercase().contains(s.as_str()),
                Some(Filter::Compare { field, cmp, value }) => {
                    Filter::compare(cmp, workload_value(w, &field), value)
                }
            })
            .collect();
        out.sort_by(|a, b| match (a.pss_bytes, b.pss_bytes) {
            (Some(x), Some(y)) => y.cmp(&x),
            (Some(_), None) => std::cmp::Ordering::Less,
            (None, Some(_)) => std::cmp::Ordering::Greater,
            (None, None) => std::cmp::Ordering::Equal,
        });
        out
    }

    /// Rows of the cgroups view now (tree or rollup).
    pub fn cgroup_view_len(&self, report: &Report) -> usize {
        match self.workload {
            Workload::Off => self.cgroup_tree_len(report),
            _ => self.workloads(report).len(),
        }
    }

    /// Rows of [`State::cgroup_tree`], counted, not built (every kept cgroup is a row,
    /// and each expanded one's processes).
    fn cgroup_tree_len(&self, report: &Report) -> usize {
        let filter = self.parsed_filter();
        let kept: Vec<&str> = report
            .cgroups
            .iter()
            .filter(|c| super::rows::cgroup_kept(c, filter.as_ref()) && self.cgroup_passes(c))
            .map(|c| c.path.as_str())
            .collect();
        let open: std::collections::HashSet<&str> = kept
            .iter()
            .copied()
            .filter(|p| self.expanded.contains(*p))
            .collect();
        kept.len()
            + report
                .processes
                .iter()
                .filter(|p| p.cgroup.as_deref().is_some_and(|c| open.contains(c)))
                .count()
    }

    /// Enter / →: expands or folds the selected cgroup.
    pub fn toggle_cgroup(&mut self, report: &Report) -> bool {
        if self.workload != Workload::Off {
            return false;
        }
        let sel = self.selected(View::Cgroups);
        match self.cgroup_tree(report).get(sel) {
            Some(CgRow::Cgroup { cg, .. }) => {
                let path = cg.path.clone();
                if !self.expanded.remove(&path) {
                    self.expanded.insert(path);
                }
                true
            }
            _ => false,
        }
    }

    /// ←: folds the selected cgroup, or the cgroup of the selected process (and selects it).
    pub fn fold_selected(&mut self, report: &Report) -> bool {
        if self.workload != Workload::Off {
            return false;
        }
        let tree = self.cgroup_tree(report);
        let sel = self.selected(View::Cgroups);
        let path = match tree.get(sel) {
            Some(CgRow::Cgroup { cg, .. }) => cg.path.clone(),
            Some(CgRow::Process { p, .. }) => match &p.cgroup {
                Some(c) => c.clone(),
                None => return false,
            },
            None => return false,
        };
        let at = tree
            .iter()
            .position(|r| matches!(r, CgRow::Cgroup { cg, .. } if cg.path == path));
        drop(tree);
        if let Some(i) = at {
            self.selected[State::index_of(View::Cgroups)] = i;
        }
        self.expanded.remove(&path)
    }
}

/// The value of a workload field a filter compares (the names are
/// [`super::filter::WORKLOAD_FIELDS`]).
fn workload_value(w: &WorkloadRow, field: &str) -> Option<f64> {
    let b = |v: Option<u64>| v.map(|v| v as f64);
    match field {
        "pss" => b(w.pss_bytes),
        "uss" => b(w.uss_bytes),
        "anon" => b(w.anon_bytes),
        "swap" => b(w.swap_bytes),
        "procs" => Some(w.procs as f64),
        "files" => Some(w.files as f64),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tui::fixture;
    use crate::tui::state::{self, Key};

    fn names(rows: &[CgRow]) -> Vec<String> {
        rows.iter()
            .map(|r| match r {
                CgRow::Cgroup { cg, depth, .. } => format!("{depth}:{}", cg.path),
                CgRow::Process { p, depth } => format!("{depth}:{}", p.pid),
            })
            .collect()
    }

    #[test]
    fn the_tree_nests_and_expands_processes_under_their_cgroup() {
        let r = fixture::report();
        let mut st = State::new(View::Cgroups);
        st.clamp_to(&r);
        assert_eq!(
            names(&st.cgroup_tree(&r)),
            [
                "0:/system.slice",
                "1:/system.slice/llama.service",
                "0:/user.slice"
            ]
        );
        // Down to llama.service, Enter: its two processes (sorted by rss) under it.
        st.handle(Key::Down);
        assert_eq!(st.handle(Key::Enter), state::Action::Open);
        assert!(st.open_selected(&r));
        // Counted as built (the rows every frame sees).
        assert_eq!(st.cgroup_tree_len(&r), 5);
        assert_eq!(
            names(&st.cgroup_tree(&r)),
            [
                "0:/system.slice",
                "1:/system.slice/llama.service",
                "2:5151",
                "2:4242",
                "0:/user.slice"
            ]
        );
        st.clamp_to(&r);
        // ← on a process folds its cgroup and selects it.
        st.handle(Key::Down);
        assert_eq!(st.handle(Key::Left), state::Action::Fold);
        assert!(st.fold_selected(&r));
        assert_eq!(st.selected(View::Cgroups), 1);
        assert_eq!(st.cgroup_tree(&r).len(), 3);
        assert_eq!(st.cgroup_tree_len(&r), 3);
        // A filter keeps the cgroups it names (and their parents' rows go).
        st.filter = "llama".into();
        assert_eq!(st.cgroup_tree_len(&r), st.cgroup_tree(&r).len());
    }

    #[test]
    fn the_rollup_sums_by_comm_and_by_cgroup_and_keeps_unknown() {
        let r = fixture::report();
        let mut st = State::new(View::Files);
        st.handle(Key::Char('w'));
        assert_eq!((st.view, st.workload), (View::Cgroups, Workload::ByComm));
        let w = st.workloads(&r);
        assert_eq!(w.len(), 3);
        let py = w.iter().find(|w| w.name == "python3").unwrap();
        assert_eq!(py.pss_bytes, Some(4 << 30));
        assert_eq!(py.copies_bytes, 4 << 30);
        assert_eq!(py.files, 1);
        let vllm = w.iter().find(|w| w.name == "vllm").unwrap();
        assert_eq!(vllm.pss_bytes, None, "unknown, never 0");
        st.handle(Key::Char('w'));
        assert_eq!(st.workload, Workload::ByCgroup);
        let w = st.workloads(&r);
        let llama = w
            .iter()
            .find(|w| w.name == "/system.slice/llama.service")
            .unwrap();
        assert_eq!(llama.procs, 2);
        assert_eq!(llama.pss_bytes, Some(6 << 30));
        assert_eq!(llama.anon_bytes, Some((4 << 30) + 280 * (1 << 20)));
        st.handle(Key::Char('w'));
        assert_eq!(st.workload, Workload::Off);
    }

    #[test]
    fn a_copy_forked_workers_share_counts_once_in_their_workload() {
        let mut r = fixture::report();
        let f = r
            .files
            .iter_mut()
            .find(|f| !f.proven_copies.is_empty())
            .unwrap();
        let c = f.proven_copies[0].clone();
        // The copy, shared by it and 8 forked children (the shares the count takes).
        f.proven_copies.clear();
        let mut p = r.processes[0].clone();
        for i in 0..9 {
            let mut w = c.clone();
            w.pid = 70_000 + i;
            w.comm = "worker".into();
            w.share = 1.0 / 9.0;
            f.proven_copies.push(w);
            p.pid = 70_000 + i;
            p.comm = "worker".into();
            r.processes.push(p.clone());
        }
        let mut st = State::new(View::Files);
        st.handle(Key::Char('w'));
        let w = st.workloads(&r);
        let workers = w.iter().find(|w| w.name == "worker").unwrap();
        assert_eq!(workers.procs, 9);
        assert!(
            workers.copies_bytes.abs_diff(c.memory_bytes) <= 9,
            "{} for one copy of {}",
            workers.copies_bytes,
            c.memory_bytes
        );
    }
}
