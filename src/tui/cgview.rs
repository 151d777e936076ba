//! The cgroups view: the cgroup tree with usage against `memory.min`/`low`/`high`/`max`
//! and peak, file vs anon, refaults, OOM kills and PSI, processes under an expanded
//! cgroup; or the "by workload" rollup (`w`).

use ratatui::layout::Rect;
use ratatui::style::Style;
use ratatui::Frame;

use super::groups::CgRow;
use super::state::{Hits, State, View};
use super::view::{table, Col, Theme};
use crate::model::{CgroupModel, Report};
use crate::render::safe::safe;
use crate::units::{iec, iec_opt};

const fn col(title: &'static str, width: u16, prio: u8, sort: Option<&'static str>) -> Col {
    Col {
        title,
        width,
        prio,
        left: false,
        sort,
    }
}

const CGROUP_COLS: [Col; 9] = [
    col("usage / max", 21, 0, Some("usage")),
    col("high", 9, 5, Some("high")),
    col("min / low", 19, 7, None),
    col("peak", 9, 4, Some("peak")),
    col("anon", 9, 1, Some("anon")),
    col("file", 9, 2, Some("file")),
    col("refaults", 9, 6, Some("refaults")),
    col("oom kills", 9, 3, Some("oom")),
    col("psi some/full", 13, 8, Some("psi")),
];

fn limit(v: Option<u64>, unlimited: bool) -> String {
    if unlimited {
        "max".into()
    } else {
        iec_opt(v)
    }
}

fn cgroup_cells(c: &CgroupModel) -> Vec<String> {
    let v2 = c.version == Some(crate::sample::CgroupVersion::V2);
    vec![
        format!(
            "{} / {}",
            iec_opt(c.usage_bytes),
            limit(c.limit_bytes, c.unlimited)
        ),
        limit(c.high_bytes, c.high_unlimited),
        format!("{} / {}", iec_opt(c.min_bytes), iec_opt(c.low_bytes)),
        iec_opt(c.peak_bytes),
        iec_opt(c.anon_bytes),
        iec_opt(c.file_bytes),
        super::view::opt_num(c.refaults_file),
        super::view::opt_num(c.oom_kills),
        match c.pressure {
            Some(p) => format!(
                "{:.2}/{}",
                p.some_avg10,
                p.full_avg10.map_or("n/a".into(), |v| format!("{v:.2}"))
            ),
            None if v2 => "n/a".into(),
            None => "n/a (v1)".into(),
        },
    ]
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
                let mut cells = vec![String::new(); CGROUP_COLS.len()];
                cells[0] = format!("rss {}", iec_opt(p.rss_bytes));
                cells[4] = iec_opt(p.anon_bytes);
                cells[5] = iec_opt(p.file_bytes);
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
        ("cgroup (Enter: processes)", 20, Some("path")),
        &CGROUP_COLS,
        rows,
        Some(st.selected(View::Cgroups)),
        t,
        hits,
    );
}

const WORKLOAD_COLS: [Col; 7] = [
    col("procs", 5, 0, None),
    col("pss", 9, 1, None),
    col("uss", 9, 3, None),
    col("anon", 9, 2, None),
    col("swap", 9, 5, None),
    col("copies", 9, 4, None),
    col("files", 5, 6, None),
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
        (first, 16, None),
        &WORKLOAD_COLS,
        rows,
        Some(st.selected(View::Cgroups)),
        t,
        hits,
    );
}
