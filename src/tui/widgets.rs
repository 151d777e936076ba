//! The file drill-down (count line, live page-cache map, sparklines of the session, the
//! table of mappers and copy holders) and the gauge of a proof running in the background.

use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Color, Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{
    Block, Cell, Clear, Gauge, Paragraph, Row, Sparkline, Table, TableState, Wrap,
};
use ratatui::Frame;

use super::history::{FileHistory, Ring};
use super::state::{self, HolderRow, Proving, State};
use super::table::{pct, tail, Theme};
use crate::model::{FileModel, Report};
use crate::render::safe::{safe, shown};
use crate::render::scan::{copy_note, count_line, map_kind};
use crate::units::{iec, iec_opt};

/// One labelled sparkline row: `label value` then the ring's points (absent: unknown).
fn spark_row(
    frame: &mut Frame,
    area: Rect,
    label: String,
    ring: Option<&Ring>,
    max: Option<u64>,
    t: &Theme,
) {
    let [l, r] = Layout::horizontal([Constraint::Length(30), Constraint::Min(1)]).areas(area);
    frame.render_widget(Paragraph::new(label), l);
    let Some(ring) = ring.filter(|r| r.any_known()) else {
        return;
    };
    // The newest points, as many as fit, right-aligned.
    let n = r.width as usize;
    let pts: Vec<Option<u64>> = ring.values().collect();
    let pts = &pts[pts.len().saturating_sub(n)..];
    let mut s = Sparkline::default()
        .data(pts.iter().copied())
        .style(t.fg(Color::Cyan))
        .absent_value_symbol("·");
    if let Some(m) = max.or_else(|| ring.max()) {
        s = s.max(m.max(1));
    }
    frame.render_widget(s, r);
}

fn draw_sparklines(frame: &mut Frame, area: Rect, h: Option<&FileHistory>, t: &Theme) {
    let [a, b, c] = Layout::vertical([Constraint::Length(1); 3]).areas(area);
    let points = h.map_or(0, |h| h.held_bytes.len());
    let res = h.and_then(|h| h.residency_permille.last());
    spark_row(
        frame,
        a,
        format!(
            "residency  {:>7}",
            res.map(|v| format!("{:.1}%", v as f64 / 10.0))
                .unwrap_or_else(|| "n/a".into())
        ),
        h.map(|h| &h.residency_permille),
        Some(1000),
        t,
    );
    let refaults = h.map(|h| &h.refaults_per_sec);
    let label = match refaults.filter(|r| r.any_known()) {
        Some(r) => format!(
            "refaults/s {:>7}",
            r.last().map_or("n/a".into(), |v| v.to_string())
        ),
        None => "refaults/s  n/a (no tracing)".into(),
    };
    spark_row(frame, b, label, refaults, None, t);
    spark_row(
        frame,
        c,
        format!(
            "held       {:>9}  ({points} pt)",
            iec_opt(h.and_then(|h| h.held_bytes.last()))
        ),
        h.map(|h| &h.held_bytes),
        None,
        t,
    );
}

/// The map lines: `O` every page of the cell cached, `o` some, `·` none.
fn map_lines(st: &State, f: &FileModel, cols: usize) -> Vec<Line<'static>> {
    let cols = cols.max(8);
    if st.replay {
        return vec![Line::from(
            "page cache map: not in a recording (it keeps resident bytes, not which pages)",
        )];
    }
    match st.map.as_ref().filter(|(k, _)| *k == f.key) {
        None => vec![Line::from("page cache map: reading…")],
        Some((_, Err(why))) => vec![Line::from(format!("page cache map: n/a ({})", safe(why)))],
        Some((_, Ok(m))) => {
            let cells: Vec<char> = m
                .cells
                .chars()
                .map(|c| if c == ' ' { '·' } else { c })
                .collect();
            let mut out = vec![Line::from(format!(
                "page cache map (1 cell = {} pages; O all, o some, · none):",
                m.pages_per_cell
            ))];
            out.extend(
                cells
                    .chunks(cols)
                    .map(|c| Line::from(c.iter().collect::<String>())),
            );
            out
        }
    }
}

/// The open file; returns the table body's place (first row, rows, offset) for the mouse.
/// The file's eBPF rates over the last interval, or why there are none.
fn trace_line(st: &State, report: &Report, f: &FileModel) -> String {
    let Some(tr) = &report.trace else {
        return if st.replay {
            "trace: not in this recording (recorded without --trace)".into()
        } else if st.tracing {
            "trace: on, rates from the next collection".into()
        } else {
            "trace: off (t turns eBPF tracing on)".into()
        };
    };
    let Some(ft) = tr.files.iter().find(|t| t.key == f.key) else {
        return "trace: nothing recorded for this file yet".into();
    };
    let r = |v: Option<f64>| v.map_or_else(|| "n/a".to_string(), |v| format!("{v:.0}"));
    format!(
        "trace, pages/s: faults {}  added {}  evicted {}  refaulted {} · read() {}/s",
        r(ft.file_faults_per_sec),
        r(ft.added_pages_per_sec),
        r(ft.evicted_pages_per_sec),
        r(ft.refault_pages_per_sec),
        ft.read_bytes_per_sec
            .map_or_else(|| "n/a".to_string(), |b| crate::units::iec(b as u64)),
    )
}

/// The device part of the count and the uploads traced, or nothing when the file has
/// neither a device copy nor a traced upload.
fn device_line(f: &FileModel) -> Option<String> {
    use crate::model::device::clock;
    if f.device_copies.is_empty() && f.uploads.is_empty() {
        return None;
    }
    let part = match (f.representations.device, f.counted_device_bytes()) {
        (Some(d), Some(b)) => format!("{d:.2} ({})", crate::units::iec(b)),
        _ => "n/a".into(),
    };
    let copies: Vec<String> = f
        .device_copies
        .iter()
        .map(|d| {
            let gpu = d.gpu.map_or("GPU ?".into(), |g| format!("GPU {g}"));
            let how = match (d.proven, d.proven_at_unix_ns) {
                (true, Some(at)) if d.via == "clone" => {
                    format!("cloned on the device {}", clock(at))
                }
                (true, Some(at)) => format!("proven at upload {}", clock(at)),
                (true, None) => "proven".into(),
                (false, _) => "suspected".into(),
            };
            format!("pid {} {gpu} {how}", d.pid)
        })
        .collect();
    let mut out = format!("device part of the count {part}");
    if !copies.is_empty() {
        out.push_str(&format!(": {}", copies.join(", ")));
    }
    if !f.uploads.is_empty() {
        let calls: u64 = f.uploads.iter().map(|u| u.copies).sum();
        let last = f.uploads.iter().map(|u| u.last_unix_ns).max().unwrap_or(0);
        out.push_str(&format!(
            " · uploads: {} in {calls} copies by {} process(es), last {}",
            crate::units::iec(f.uploaded_bytes().unwrap_or(0)),
            f.uploads
                .iter()
                .map(|u| u.pid)
                .collect::<std::collections::BTreeSet<_>>()
                .len(),
            clock(last)
        ));
    }
    Some(safe(&out).into_owned())
}

pub(super) fn draw_file(
    frame: &mut Frame,
    area: Rect,
    st: &State,
    report: &Report,
    f: &FileModel,
    t: &Theme,
) -> (u16, u16, usize) {
    let name = shown(&f.path, f.path_bytes.as_deref());
    let crumb = format!(
        "Files › {}",
        tail(&name, (area.width as usize).saturating_sub(20))
    );
    let mut lines = vec![
        Line::from(vec![
            Span::styled(crumb, t.bold()),
            Span::raw(if st.replay {
                "  (Esc: back)"
            } else {
                "  (Esc: back, p: prove)"
            }),
        ]),
        Line::from(format!(
            "size {}  resident {} ({})  held beyond one copy {}",
            iec_opt(f.size_bytes),
            iec_opt(f.resident_bytes),
            pct(f.resident_fraction),
            iec_opt(f.excess_bytes())
        )),
        Line::from(Span::styled(count_line(f), t.fg(Color::Yellow))),
    ];
    if let Some(l) = crate::render::findings::searched_line(f) {
        lines.push(Line::from(l));
    }
    if st.replay {
        lines.push(Line::from(
            "recorded: the count, residency, mappers and proven copies as collected then; \
             not recorded: the page map, memory to prove (p)",
        ));
    }
    if let Some(reason) = &f.residency_unknown_reason {
        lines.push(Line::from(format!("residency unknown: {}", safe(reason))));
    }
    for u in &f.unexplained {
        lines.push(Line::from(
            safe(&crate::model::unexplained::beside_line(u)).into_owned(),
        ));
    }
    lines.push(Line::from(trace_line(st, report, f)));
    if let Some(l) = device_line(f) {
        lines.push(Line::from(l));
    }
    let map = map_lines(st, f, area.width as usize);
    // Small screens keep one map line, the sparklines and a few rows of the table.
    let map_h = if area.height < 20 {
        map.len().min(2)
    } else {
        map.len().min(5)
    } as u16;
    // Wrapped lines (a long count line) take more than one row each.
    let cols = usize::from(area.width.max(1));
    let head_h: usize = lines.iter().map(|l| l.width().max(1).div_ceil(cols)).sum();
    let [head, map_area, sparks, rest] = Layout::vertical([
        Constraint::Length(head_h as u16),
        Constraint::Length(map_h),
        Constraint::Length(3),
        Constraint::Min(2),
    ])
    .areas(area);
    frame.render_widget(Paragraph::new(lines).wrap(Wrap { trim: false }), head);
    frame.render_widget(Paragraph::new(map), map_area);
    draw_sparklines(frame, sparks, st.history.of(f.key), t);

    // Narrow screens keep the note (what the copy is) over PSS and CoW.
    let wide = area.width >= 110;
    let keep = |i: usize| wide || !matches!(i, 4 | 5);
    let rows: Vec<Row> = state::holder_rows(f)
        .into_iter()
        .map(|h| {
            let (pid, comm, how, res, pss, cow, mapped) = match h {
                HolderRow::Mapper(m) => (
                    m.pid,
                    m.comm.as_str(),
                    map_kind(m.kind).to_string(),
                    iec_opt(m.resident_bytes),
                    iec_opt(m.pss_bytes),
                    iec_opt(m.cow_anon_bytes),
                    true,
                ),
                HolderRow::OpenFd(pid, comm) => (
                    pid,
                    comm,
                    "open fd".into(),
                    "-".into(),
                    "-".into(),
                    "-".into(),
                    false,
                ),
                HolderRow::NotOpen(pid, comm) => (
                    pid,
                    comm,
                    "not open".into(),
                    "-".into(),
                    "-".into(),
                    "-".into(),
                    false,
                ),
            };
            let cells = [
                Cell::from(Line::from(pid.to_string()).right_aligned()),
                Cell::from(safe(comm).into_owned()),
                Cell::from(how),
                Cell::from(Line::from(res).right_aligned()),
                Cell::from(Line::from(pss).right_aligned()),
                Cell::from(Line::from(cow).right_aligned()),
                Cell::from(copy_note(f, pid, mapped)),
            ];
            Row::new(
                cells
                    .into_iter()
                    .enumerate()
                    .filter(|(i, _)| keep(*i))
                    .map(|(_, c)| c)
                    .collect::<Vec<_>>(),
            )
        })
        .collect();
    let widths: Vec<Constraint> = [7, 15, 11, 9, 9, 9]
        .into_iter()
        .enumerate()
        .filter(|(i, _)| keep(*i))
        .map(|(_, w)| Constraint::Length(w))
        .chain([Constraint::Min(10)])
        .collect();
    let titles: Vec<&str> = ["pid", "comm", "how", "resident", "pss", "cow anon", "note"]
        .into_iter()
        .enumerate()
        .filter(|(i, _)| keep(*i))
        .map(|(_, t)| t)
        .collect();
    let empty = rows.is_empty();
    let header = Row::new(titles).style(t.bold().add_modifier(Modifier::UNDERLINED));
    let table = Table::new(rows, widths)
        .header(header)
        .column_spacing(1)
        .row_highlight_style(t.selected())
        .block(Block::default().title("mappers and copy holders"));
    let mut ts = TableState::default().with_selected((!empty).then_some(st.file_row));
    frame.render_stateful_widget(table, rest, &mut ts);
    let _ = report;
    (rest.y + 2, rest.height.saturating_sub(2), ts.offset())
}

/// The gauge of the proof `p` started, over the bottom of `area`.
pub(super) fn draw_proving(frame: &mut Frame, area: Rect, p: &Proving, t: &Theme) {
    let (done, total) = p.progress.bytes();
    let ratio = if total == 0 {
        0.0
    } else {
        (done as f64 / total as f64).clamp(0.0, 1.0)
    };
    let label = if total == 0 {
        "reading its memory map…".to_string()
    } else {
        format!(
            "{} of {} mapped ({:.0}%)",
            iec(done),
            iec(total),
            ratio * 100.0
        )
    };
    let h = 3.min(area.height);
    let popup = Rect {
        y: area.y + area.height.saturating_sub(h),
        height: h,
        ..area
    };
    frame.render_widget(Clear, popup);
    frame.render_widget(
        Gauge::default()
            .block(Block::bordered().title(format!(
                "proving pid {} ({}) byte by byte · Esc cancels",
                p.pid,
                safe(&p.comm)
            )))
            .gauge_style(t.fg(Color::Green).add_modifier(Modifier::BOLD))
            .style(Style::default())
            .ratio(ratio)
            .label(label),
        popup,
    );
}
