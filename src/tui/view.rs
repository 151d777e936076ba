//! The widgets of `twofold top`: they only draw a [`State`] and a [`Report`] into a
//! [`Frame`]. Every number comes from the report (the count is the model's
//! `representations.proven`, rendered as `scan` renders it); unknown values are `n/a`;
//! outside text (paths, `comm`, cgroup paths, findings) is escaped as in `scan`.

use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Color, Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Cell, Clear, Paragraph, Row, Table, TableState, Wrap};
use ratatui::Frame;

use super::state::{self, State, View};
use crate::model::{FileModel, Report, Severity};
use crate::render::safe::{safe, shown, width};
use crate::render::scan::{copy_note, count_cell, count_line, map_kind};
use crate::units::{iec, iec_opt};

/// Styles, or none of them under `NO_COLOR` (bold and reverse still show).
struct Theme {
    color: bool,
}

impl Theme {
    fn fg(&self, c: Color) -> Style {
        if self.color {
            Style::default().fg(c)
        } else {
            Style::default()
        }
    }
    fn bold(&self) -> Style {
        Style::default().add_modifier(Modifier::BOLD)
    }
    fn selected(&self) -> Style {
        Style::default().add_modifier(Modifier::REVERSED)
    }
}

fn pct(f: Option<f64>) -> String {
    f.map(|v| format!("{:.1}%", v * 100.0))
        .unwrap_or_else(|| "n/a".into())
}

fn opt_num<T: ToString>(v: Option<T>) -> String {
    v.map(|v| v.to_string()).unwrap_or_else(|| "n/a".into())
}

/// `+1.0 MiB/s`, `-4.0 KiB/s`, `0 B/s`, `n/a`.
fn rate(v: Option<f64>) -> String {
    match v {
        None => "n/a".into(),
        Some(v) if v.abs() < 0.5 => "0 B/s".into(),
        Some(v) => format!(
            "{}{}/s",
            if v < 0.0 { "-" } else { "+" },
            iec(v.abs().round() as u64)
        ),
    }
}

/// At most `max` columns of `s`, cut at the start (`…/models/m.gguf`).
fn tail(s: &str, max: usize) -> String {
    if width(s) <= max {
        return s.to_string();
    }
    let mut out: Vec<char> = Vec::new();
    let mut w = 1;
    for c in s.chars().rev() {
        let cw = width(c.encode_utf8(&mut [0; 4]));
        if w + cw > max {
            break;
        }
        w += cw;
        out.push(c);
    }
    out.push('…');
    out.iter().rev().collect()
}

/// Draws the whole screen.
pub fn draw(frame: &mut Frame, st: &State, report: Option<&Report>) {
    let theme = Theme { color: st.color };
    let n_findings = report.map_or(0, |r| r.findings.len());
    let findings_h = (n_findings.clamp(1, 3) + 2) as u16;
    let [header, tabs, body, findings, footer] = Layout::vertical([
        Constraint::Length(3),
        Constraint::Length(1),
        Constraint::Min(3),
        Constraint::Length(findings_h),
        Constraint::Length(1),
    ])
    .areas(frame.area());
    draw_header(frame, header, st, report, &theme);
    draw_tabs(frame, tabs, st, &theme);
    match report {
        None => frame.render_widget(Paragraph::new("  collecting the first snapshot…"), body),
        Some(r) => match (st.view, st.open) {
            (View::Files, Some(key)) => match r.files.iter().find(|f| f.key == key) {
                Some(f) => draw_file(frame, body, f, &theme),
                None => frame.render_widget(
                    Paragraph::new("  Files › the file is no longer in the report (Esc: back)"),
                    body,
                ),
            },
            (View::Files, None) => draw_files(frame, body, st, r, &theme),
            (View::Processes, _) => draw_processes(frame, body, st, r, &theme),
            (View::Cgroups, _) => draw_cgroups(frame, body, st, r, &theme),
        },
    }
    draw_findings(frame, findings, report, &theme);
    draw_footer(frame, footer, st, &theme);
    if st.help {
        draw_help(frame, &theme);
    }
}

fn draw_header(frame: &mut Frame, area: Rect, st: &State, report: Option<&Report>, t: &Theme) {
    let mut top = vec![
        Span::styled("twofold top", t.bold()),
        Span::raw(format!(
            " · {} · every {:.1} s",
            safe(&st.source),
            st.interval_secs
        )),
    ];
    if st.paused {
        top.push(Span::styled(
            " · PAUSED",
            t.fg(Color::Yellow).add_modifier(Modifier::BOLD),
        ));
    }
    top.push(Span::raw(format!(
        " · self cpu {} rss {}",
        st.own_cpu_percent
            .map(|c| format!("{c:.1}%"))
            .unwrap_or_else(|| "n/a".into()),
        iec_opt(st.own_rss_bytes)
    )));
    let psi = match st.psi {
        Some(p) => format!(
            "psi some/full {:.2}/{}",
            p.some_avg10,
            p.full_avg10
                .map(|v| format!("{v:.2}"))
                .unwrap_or_else(|| "n/a".into())
        ),
        None => "psi n/a".into(),
    };
    let (mem, model) = match report {
        Some(r) => {
            let s = &r.system;
            let (model, excess) = state::totals(r);
            (
                format!(
                    "mem {}  avail {}  cache {}  anon {}",
                    iec_opt(s.mem_total_bytes),
                    iec_opt(s.mem_available_bytes),
                    iec_opt(s.page_cache_bytes),
                    iec_opt(s.anon_bytes)
                ),
                format!(
                    "models {} · {}  held beyond one copy {}  {psi}",
                    r.files.len(),
                    iec(model),
                    iec(excess)
                ),
            )
        }
        None => ("mem n/a".into(), format!("models n/a  {psi}")),
    };
    let excess_style = match report.map(state::totals) {
        Some((_, e)) if e > 0 => t.fg(Color::Yellow).add_modifier(Modifier::BOLD),
        _ => Style::default(),
    };
    let lines = vec![
        Line::from(top),
        Line::from(mem),
        Line::from(Span::styled(model, excess_style)),
    ];
    frame.render_widget(Paragraph::new(lines), area);
}

fn draw_tabs(frame: &mut Frame, area: Rect, st: &State, t: &Theme) {
    let mut spans = Vec::new();
    for (i, v) in View::ALL.iter().enumerate() {
        let label = format!(" {} {} ", i + 1, v.title());
        let style = if *v == st.view {
            t.selected().add_modifier(Modifier::BOLD)
        } else {
            Style::default()
        };
        spans.push(Span::styled(label, style));
        spans.push(Span::raw(" "));
    }
    spans.push(Span::raw(format!(
        " sort {} {}",
        st.sort_column(st.view),
        if st.is_reversed(st.view) {
            "↑"
        } else {
            "↓"
        }
    )));
    frame.render_widget(Paragraph::new(Line::from(spans)), area);
}

/// A column: title, width, priority (lower is kept first when the screen is narrow).
struct Col {
    title: &'static str,
    width: u16,
    prio: u8,
    left: bool,
}

fn align(line: Line<'_>, left: bool) -> Line<'_> {
    if left {
        line
    } else {
        line.right_aligned()
    }
}

/// The columns that fit next to a flexible first column of at least `flex_min`, in
/// their original order.
fn fit(cols: &[Col], total: u16, flex_min: u16) -> Vec<usize> {
    let mut order: Vec<usize> = (0..cols.len()).collect();
    order.sort_by_key(|&i| cols[i].prio);
    let mut used = flex_min;
    let mut keep = Vec::new();
    for i in order {
        let w = cols[i].width + 1;
        if used + w <= total {
            used += w;
            keep.push(i);
        }
    }
    keep.sort_unstable();
    keep
}

/// `first`: the flexible first column's title and its least width.
fn table(
    frame: &mut Frame,
    area: Rect,
    (first, flex_min): (&'static str, u16),
    cols: &[Col],
    rows: Vec<(String, Vec<String>, Style)>,
    selected: Option<usize>,
    t: &Theme,
) {
    let keep = fit(cols, area.width, flex_min);
    let flex = area
        .width
        .saturating_sub(keep.iter().map(|&i| cols[i].width + 1).sum::<u16>());
    let mut widths = vec![Constraint::Length(flex)];
    widths.extend(keep.iter().map(|&i| Constraint::Length(cols[i].width)));
    let mut header = vec![Cell::from(first)];
    header.extend(
        keep.iter()
            .map(|&i| Cell::from(align(Line::from(cols[i].title), cols[i].left))),
    );
    let body: Vec<Row> = rows
        .into_iter()
        .map(|(name, cells, style)| {
            let mut row = vec![Cell::from(tail(&name, flex as usize))];
            row.extend(
                keep.iter()
                    .map(|&i| Cell::from(align(Line::from(cells[i].clone()), cols[i].left))),
            );
            Row::new(row).style(style)
        })
        .collect();
    let empty = body.is_empty();
    let table = Table::new(body, widths)
        .header(Row::new(header).style(t.bold().add_modifier(Modifier::UNDERLINED)))
        .column_spacing(1)
        .row_highlight_style(t.selected());
    let mut ts = TableState::default().with_selected(selected.filter(|_| !empty));
    frame.render_stateful_widget(table, area, &mut ts);
    if empty {
        let msg = Rect {
            y: area.y + 1,
            height: 1,
            ..area
        };
        frame.render_widget(
            Paragraph::new("  no rows (none in the report, or the filter hides them)"),
            msg,
        );
    }
}

const FILE_COLS: [Col; 8] = [
    Col {
        title: "size",
        width: 9,
        prio: 1,
        left: false,
    },
    Col {
        title: "count",
        width: 7,
        prio: 0,
        left: false,
    },
    Col {
        title: "cache",
        width: 9,
        prio: 2,
        left: false,
    },
    Col {
        title: "cow",
        width: 9,
        prio: 6,
        left: false,
    },
    Col {
        title: "private",
        width: 9,
        prio: 3,
        left: false,
    },
    Col {
        title: "suspected",
        width: 9,
        prio: 7,
        left: false,
    },
    Col {
        title: "res%",
        width: 6,
        prio: 4,
        left: false,
    },
    Col {
        title: "holders",
        width: 7,
        prio: 5,
        left: false,
    },
];

fn draw_files(frame: &mut Frame, area: Rect, st: &State, r: &Report, t: &Theme) {
    let rows = st
        .file_rows(r)
        .into_iter()
        .map(|f| {
            let style = match f.representations.proven {
                Some(c) if c >= 1.995 => t.fg(Color::Yellow),
                _ => Style::default(),
            };
            let name = shown(&f.path, f.path_bytes.as_deref());
            let cells = vec![
                iec_opt(f.size_bytes),
                count_cell(f),
                iec_opt(f.resident_bytes),
                iec_opt(state::file_cow_bytes(f)),
                iec(state::file_private_bytes(f)),
                iec(state::file_suspected_bytes(f)),
                pct(f.resident_fraction),
                state::file_holders(f).to_string(),
            ];
            (name, cells, style)
        })
        .collect();
    table(
        frame,
        area,
        ("file", 22),
        &FILE_COLS,
        rows,
        Some(st.selected(View::Files)),
        t,
    );
}

const PROC_COLS: [Col; 7] = [
    Col {
        title: "comm",
        width: 15,
        prio: 0,
        left: true,
    },
    Col {
        title: "rss",
        width: 9,
        prio: 1,
        left: false,
    },
    Col {
        title: "anon",
        width: 9,
        prio: 2,
        left: false,
    },
    Col {
        title: "file",
        width: 9,
        prio: 4,
        left: false,
    },
    Col {
        title: "pss",
        width: 9,
        prio: 5,
        left: false,
    },
    Col {
        title: "anon/s",
        width: 12,
        prio: 3,
        left: false,
    },
    Col {
        title: "files",
        width: 5,
        prio: 6,
        left: false,
    },
];

fn draw_processes(frame: &mut Frame, area: Rect, st: &State, r: &Report, t: &Theme) {
    let rows = st
        .process_rows(r)
        .into_iter()
        .map(|p| {
            let cells = vec![
                // The comm is the flexible column's neighbour: cut on the right.
                safe(&p.comm).chars().take(15).collect::<String>(),
                iec_opt(p.rss_bytes),
                iec_opt(p.anon_bytes),
                iec_opt(p.file_bytes),
                iec_opt(p.pss_bytes),
                rate(state::anon_growth(r, p.pid)),
                opt_num(p.holds_files),
            ];
            (p.pid.to_string(), cells, Style::default())
        })
        .collect();
    table(
        frame,
        area,
        ("pid", 7),
        &PROC_COLS,
        rows,
        Some(st.selected(View::Processes)),
        t,
    );
}

const CGROUP_COLS: [Col; 4] = [
    Col {
        title: "usage / limit",
        width: 21,
        prio: 0,
        left: false,
    },
    Col {
        title: "anon",
        width: 9,
        prio: 1,
        left: false,
    },
    Col {
        title: "file",
        width: 9,
        prio: 2,
        left: false,
    },
    Col {
        title: "oom kills",
        width: 9,
        prio: 3,
        left: false,
    },
];

fn draw_cgroups(frame: &mut Frame, area: Rect, st: &State, r: &Report, t: &Theme) {
    let rows = st
        .cgroup_rows(r)
        .into_iter()
        .map(|c| {
            let limit = if c.unlimited {
                "max".into()
            } else {
                iec_opt(c.limit_bytes)
            };
            let cells = vec![
                format!("{} / {limit}", iec_opt(c.usage_bytes)),
                iec_opt(c.anon_bytes),
                iec_opt(c.file_bytes),
                opt_num(c.oom_kills),
            ];
            (safe(&c.path).into_owned(), cells, Style::default())
        })
        .collect();
    table(
        frame,
        area,
        ("cgroup", 16),
        &CGROUP_COLS,
        rows,
        Some(st.selected(View::Cgroups)),
        t,
    );
}

/// `[█████░░░░░] 50.0%`, `n/a` when residency is unknown.
fn bar(fraction: Option<f64>, cols: usize) -> String {
    let Some(f) = fraction else {
        return "n/a".into();
    };
    let n = ((f.clamp(0.0, 1.0) * cols as f64).round() as usize).min(cols);
    format!(
        "[{}{}] {:.1}%",
        "█".repeat(n),
        "░".repeat(cols - n),
        f * 100.0
    )
}

fn draw_file(frame: &mut Frame, area: Rect, f: &FileModel, t: &Theme) {
    let name = shown(&f.path, f.path_bytes.as_deref());
    let crumb = format!(
        "Files › {}",
        tail(&name, (area.width as usize).saturating_sub(20))
    );
    let bar_cols = (area.width as usize).saturating_sub(30).clamp(10, 60);
    let mut lines = vec![
        Line::from(vec![
            Span::styled(crumb, t.bold()),
            Span::raw("  (Esc: back)"),
        ]),
        Line::from(format!(
            "size {}  resident {} ({})  held beyond one copy {}",
            iec_opt(f.size_bytes),
            iec_opt(f.resident_bytes),
            pct(f.resident_fraction),
            iec_opt(state::file_excess_bytes(f))
        )),
        Line::from(format!("page cache {}", bar(f.resident_fraction, bar_cols))),
        Line::from(Span::styled(count_line(f), t.fg(Color::Yellow))),
    ];
    if let Some(reason) = &f.residency_unknown_reason {
        lines.push(Line::from(format!("residency unknown: {}", safe(reason))));
    }
    let head_h = lines.len() as u16 + 1;
    let [head, rest] =
        Layout::vertical([Constraint::Length(head_h), Constraint::Min(1)]).areas(area);
    frame.render_widget(Paragraph::new(lines).wrap(Wrap { trim: false }), head);

    // Narrow screens keep the note (what the copy is) over PSS and CoW.
    let wide = area.width >= 110;
    let mut rows: Vec<Row> = Vec::new();
    let mut push =
        |pid: i32, comm: &str, how: String, res: String, pss: String, cow: String, note: String| {
            rows.push(Row::new(
                vec![
                    Cell::from(Line::from(pid.to_string()).right_aligned()),
                    Cell::from(safe(comm).into_owned()),
                    Cell::from(how),
                    Cell::from(Line::from(res).right_aligned()),
                    Cell::from(Line::from(pss).right_aligned()),
                    Cell::from(Line::from(cow).right_aligned()),
                    Cell::from(note),
                ]
                .into_iter()
                .enumerate()
                .filter(|(i, _)| wide || !matches!(i, 4 | 5))
                .map(|(_, c)| c)
                .collect::<Vec<_>>(),
            ));
        };
    for m in &f.mappers {
        push(
            m.pid,
            &m.comm,
            map_kind(m.kind).into(),
            iec_opt(m.resident_bytes),
            iec_opt(m.pss_bytes),
            iec_opt(m.cow_anon_bytes),
            copy_note(f, m.pid, true),
        );
    }
    for h in f.holders.iter().filter(|h| !h.mapped) {
        push(
            h.pid,
            &h.comm,
            "open fd".into(),
            "-".into(),
            "-".into(),
            "-".into(),
            copy_note(f, h.pid, false),
        );
    }
    for (pid, comm) in crate::render::scan::unlisted_copy_holders(f) {
        push(
            pid,
            comm,
            "not open".into(),
            "-".into(),
            "-".into(),
            "-".into(),
            copy_note(f, pid, false),
        );
    }
    let widths: Vec<Constraint> = [7, 15, 11, 9, 9, 9]
        .into_iter()
        .enumerate()
        .filter(|(i, _)| wide || !matches!(i, 4 | 5))
        .map(|(_, w)| Constraint::Length(w))
        .chain([Constraint::Min(10)])
        .collect();
    let titles: Vec<&str> = ["pid", "comm", "how", "resident", "pss", "cow anon", "note"]
        .into_iter()
        .enumerate()
        .filter(|(i, _)| wide || !matches!(i, 4 | 5))
        .map(|(_, t)| t)
        .collect();
    let header = Row::new(titles).style(t.bold().add_modifier(Modifier::UNDERLINED));
    let table = Table::new(rows, widths)
        .header(header)
        .column_spacing(1)
        .block(Block::default().title("mappers and copy holders"));
    frame.render_widget(table, rest);
}

fn draw_findings(frame: &mut Frame, area: Rect, report: Option<&Report>, t: &Theme) {
    let mut findings: Vec<_> = report
        .map(|r| r.findings.iter().collect())
        .unwrap_or_default();
    // Warnings first (the report sorts them so already; stable either way).
    findings.sort_by_key(|f| f.severity);
    let shown_n = (area.height.saturating_sub(2)) as usize;
    let mut lines: Vec<Line> = findings
        .iter()
        .take(shown_n)
        .map(|f| {
            let (tag, style) = match f.severity {
                Severity::Warning => ("warning", t.fg(Color::Red).add_modifier(Modifier::BOLD)),
                Severity::Notice => ("notice ", t.fg(Color::Yellow)),
                Severity::Info => ("info   ", Style::default()),
            };
            Line::from(vec![
                Span::styled(tag, style),
                Span::raw(format!(" {}", safe(&f.message()))),
            ])
        })
        .collect();
    if findings.is_empty() {
        lines.push(Line::from(if report.is_some() { "none" } else { "n/a" }));
    }
    let title = format!(
        "Findings ({}{})",
        findings.len(),
        if findings.len() > shown_n {
            format!(", {} more", findings.len() - shown_n)
        } else {
            String::new()
        }
    );
    frame.render_widget(
        Paragraph::new(lines).block(Block::bordered().title(title)),
        area,
    );
}

fn draw_footer(frame: &mut Frame, area: Rect, st: &State, t: &Theme) {
    let line = if st.editing || !st.filter.is_empty() {
        let err = match st.parsed_filter() {
            Some(state::Filter::Compare { .. }) => "  (field compare)",
            _ => "",
        };
        Line::from(vec![
            Span::styled("filter /", t.bold()),
            Span::raw(safe(&st.filter).into_owned()),
            Span::raw(if st.editing {
                "▏  Enter: keep  Esc: clear"
            } else {
                "  Esc: clear"
            }),
            Span::raw(err),
        ])
    } else if let Some(w) = st.warnings.first() {
        Line::from(Span::styled(
            format!("{} warning(s): {}", st.warnings.len(), safe(w)),
            t.fg(Color::Yellow),
        ))
    } else {
        Line::from("q quit  Tab view  ↑↓ move  Enter open  s/S sort  / filter  space pause  ? help")
    };
    frame.render_widget(Paragraph::new(line), area);
}

const HELP: &[(&str, &str)] = &[
    (
        "q, Esc",
        "quit (Esc first closes a file or clears the filter)",
    ),
    ("Tab, 1 2 3", "files, processes, cgroups"),
    ("↑ ↓, j k", "move; PgUp PgDn, g G: page, top, bottom"),
    (
        "Enter",
        "open the selected file: mappers, copies, residency",
    ),
    ("s, S", "next sort column, reverse the sort"),
    ("/", "filter: text, or field>value (anon>1G, count>=2)"),
    ("space", "pause (collection goes on, the screen holds)"),
    ("[ ]", "replay: previous, next snapshot"),
    ("?", "this help (any key closes it)"),
];

fn draw_help(frame: &mut Frame, t: &Theme) {
    let area = frame.area();
    let w = area.width.min(70);
    let h = (HELP.len() as u16 + 4).min(area.height);
    let popup = Rect {
        x: area.x + (area.width - w) / 2,
        y: area.y + (area.height - h) / 2,
        width: w,
        height: h,
    };
    let mut lines: Vec<Line> = HELP
        .iter()
        .map(|(k, what)| {
            Line::from(vec![
                Span::styled(format!("{k:<11}"), t.bold()),
                Span::raw(*what),
            ])
        })
        .collect();
    lines.push(Line::from(""));
    lines.push(Line::from("columns and keys: docs/top.md"));
    frame.render_widget(Clear, popup);
    frame.render_widget(
        Paragraph::new(lines)
            .wrap(Wrap { trim: false })
            .block(Block::bordered().title("twofold top: keys")),
        popup,
    );
}

#[cfg(test)]
#[path = "view_tests.rs"]
mod tests;
