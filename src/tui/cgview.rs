//! The cgroups view: the cgroup tree with usage against `memory.min`/`low`/`high`/`max`
//! and peak, file vs anon, refaults, OOM kills and PSI, processes under an expanded
//! cgroup; or the "by workload" rollup (`w`).

use ratatui::layout::Rect;
use ratatui::style::Style;
use ratatui::Frame;

use super::groups::CgRow;
use super::state::{Hits, State, View};
use super::table::{cell, table, Col, Flex, Theme};
use crate::model::fields::{CgroupField, Field};
use crate::model::{CgroupModel, Report};
use crate::render::safe::safe;
use crate::units::{iec, iec_opt};

const fn col(title: &'static str, width: u16, prio: u8) -> Col {
    Col {
        title,
        width,
        prio,
        left: false,
        field: None,
        sorts: false,
    }
}

/// The cgroups view's columns (after the cgroup), each with its priority: usage is
/// shown against the limit, min beside low.
const CGROUP_COLS: [Col; 9] = {
    use CgroupField as C;
    [
        Col::cgroup(C::Usage, 0),
        Col::cgroup(C::High, 5),
        Col::cgroup(C::Min, 7).unsorted(),
        Col::cgroup(C::Peak, 4),
        Col::cgroup(C::Anon, 1),
        Col::cgroup(C::File, 2),
        Col::cgroup(C::Refaults, 6),
        Col::cgroup(C::OomKills, 3),
        Col::cgroup(C::Psi, 8),
    ]
};

fn limit(v: Option<u64>, unlimited: bool) -> String {
    if unlimited {
        "max".into()
    } else {
        iec_opt(v)
    }
}

fn cgroup_cell(c: &CgroupModel, field: CgroupField) -> String {
    let v2 = c.version == Some(crate::sample::CgroupVersion::V2);
    match field {
        CgroupField::Usage => format!(
            "{} / {}",
            iec_opt(c.usage_bytes),
            limit(c.limit_bytes, c.unlimited)
        ),
        CgroupField::High => limit(c.high_bytes, c.high_unlimited),
        CgroupField::Min => format!("{} / {}", iec_opt(c.min_bytes), iec_opt(c.low_bytes)),
        CgroupField::Psi => match c.pressure {
            Some(p) => format!(
                "{:.2}/{}",
                p.some_avg10,
                p.full_avg10.map_or("n/a".into(), |v| format!("{v:.2}"))
            ),
            None if v2 => "n/a".into(),
            None => "n/a (v1)".into(),
        },
        k => cell(k.value(c), k.unit()),
    }
}

fn field_of(col: &Col) -> Option<CgroupField> {
    match col.field {
        Some(Field::Cgroup(k)) => Some(k),
        _ => None,
    }
}

fn cgroup_cells(c: &CgroupModel) -> Vec<String> {
    CGROUP_COLS
        .iter()
        .map(|col| field_of(col).map_or_else(String::new, |k| cgroup_cell(c, k)))
        .collect()
}

/// A process under its expanded cgroup: its RSS under the usage, its anon and file.
fn process_cells(p: &crate::model::ProcessModel) -> Vec<String> {
    CGROUP_COLS
        .iter()
        .map(|col| match field_of(col) {
            Some(CgroupField::Usage) => format!("rss {}", iec_opt(p.rss_bytes)),
            Some(CgroupField::Anon) => iec_opt(p.anon_bytes),
            Some(CgroupField::File) => iec_opt(p.file_bytes),
            _ => String::new(),
        })
        .collect()
}

/// A cgroup's name in the tree: its path below its parent's, indented.
fn tree_name(
    c: &CgroupModel,
    depth: usize,
    expanded: bool,
    procs: usize,
    rows: &[CgRow],
) -> String {
    let parent = rows.iter().rev().find_map(|r| match r {
        CgRow::Cgroup { cg, depth: d, .. } if *d + 1 == depth && cg.path != c.path => {
            Some(cg.path.as_str())
        }
        _ => None,
    });
    let shown = match parent {
        Some(p) if depth > 0 => c.path.strip_prefix(p).unwrap_or(&c.path),
        _ => c.path.as_str(),
    };
    let sign = match (procs, expanded) {
        (0, _) => ' ',
        (_, true) => '▾',
        (_, false) => '▸',
    };
    format!("{}{sign} {} ({procs})", "  ".repeat(depth), safe(shown))
}

pub(super) fn draw_cgroups(
    frame: &mut Frame,
    area: Rect,
    st: &State,
    r: &Report,
    t: &Theme,
    hits: &mut Hits,
) {
    let tree = st.cgroup_tree(r);
    let mut rows = Vec::new();
    for (i, row) in tree.iter().enumerate() {
        rows.push(match row {
            CgRow::Cgroup {
                cg,
                depth,
                expanded,
                procs,
            } => (
                tree_name(cg, *depth, *expanded, *procs, &tree[..i]),
                cgroup_cells(cg),
                Style::default(),
            ),
            CgRow::Process { p, depth } => {
                let cells = process_cells(p);
                (
                    format!("{}{} {}", "  ".repeat(*depth), p.pid, safe(&p.comm)),
                    cells,
                    t.fg(ratatui::style::Color::Cyan),
                )
            }
        });
    }
    table(
        frame,
        area,
        Flex::first(
            "cgroup (Enter: processes)",
            CgroupField::Path.width(),
            Some(Field::Cgroup(CgroupField::Path)),
        ),
        &CGROUP_COLS,
        rows,
        Some(st.selected(View::Cgroups)),
        t,
        hits,
    );
}

const WORKLOAD_COLS: [Col; 7] = [
    col("procs", 5, 0),
    col("pss", 9, 1),
    col("uss", 9, 3),
    col("anon", 9, 2),
    col("swap", 9, 5),
    col("copies", 9, 4),
    col("files", 5, 6),
];

pub(super) fn draw_workloads(
    frame: &mut Frame,
    area: Rect,
    st: &State,
    r: &Report,
    t: &Theme,
    hits: &mut Hits,
) {
    let rows = st
        .workloads(r)
        .into_iter()
        .map(|w| {
            (
                safe(&w.name).into_owned(),
                vec![
                    w.procs.to_string(),
                    iec_opt(w.pss_bytes),
                    iec_opt(w.uss_bytes),
                    iec_opt(w.anon_bytes),
                    iec_opt(w.swap_bytes),
                    iec(w.copies_bytes),
                    w.files.to_string(),
                ],
                Style::default(),
            )
        })
        .collect();
    let first = match st.workload {
        super::state::Workload::ByCgroup => "workload (cgroup)",
        _ => "workload (comm)",
    };
    table(
        frame,
        area,
        Flex::first(first, 16, None),
        &WORKLOAD_COLS,
        rows,
        Some(st.selected(View::Cgroups)),
        t,
        hits,
    );
}
