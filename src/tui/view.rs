//! The widgets of `twofold top`: they only draw a [`State`] and a [`Report`] into a
//! [`Frame`]. Every number comes from the report (the count is the model's
//! `representations.proven`, rendered as `scan` renders it); unknown values are `n/a`;
//! outside text (paths, `comm`, cgroup paths, findings) is escaped as in `scan`.

use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Color, Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Clear, Paragraph, Wrap};
use ratatui::Frame;

use super::state::{self, Hits, State, View, Workload};
use super::table::{cell, cut_words, table, Col, Flex, Theme};
use crate::model::fields::{Field, FileField, ProcessField};
use crate::model::{FileModel, ProcessModel, Report, Severity};
use crate::render::safe::{safe, shown, width};
use crate::render::scan::count_cell;
use crate::units::{iec, iec_opt};

/// Draws the whole screen; returns where its clickable parts went.
pub fn draw(frame: &mut Frame, st: &State, report: Option<&Report>) -> Hits {
    let mut hits = Hits::default();
    let theme = Theme { color: st.color };
    let n_findings = report.map_or(0, |r| st.findings(r).len());
    let findings_h = (n_findings.clamp(1, 3) + 2) as u16;
    let [header, tabs, body, findings, footer] = Layout::vertical([
        Constraint::Length(3 + gpu_lines(report).len() as u16),
        Constraint::Length(1),
        Constraint::Min(3),
        Constraint::Length(findings_h),
        Constraint::Length(1),
    ])
    .areas(frame.area());
    draw_header(frame, header, st, report, &theme);
    hits.tabs = Some(draw_tabs(frame, tabs, st, &theme));
    match report {
        None => frame.render_widget(Paragraph::new("  collecting the first snapshot…"), body),
        Some(r) => match (st.view, st.open) {
            (View::Files, Some(key)) => match r.files.iter().find(|f| f.key == key) {
                Some(f) => {
                    hits.body = Some(super::widgets::draw_file(frame, body, st, r, f, &theme))
                }
                None => frame.render_widget(
                    Paragraph::new("  Files › the file is no longer in the report (Esc: back)"),
                    body,
                ),
            },
            (View::Files, None) => draw_files(frame, body, st, r, &theme, &mut hits),
            (View::Processes, _) => draw_processes(frame, body, st, r, &theme, &mut hits),
            (View::Cgroups, _) if st.workload != Workload::Off => {
                super::cgview::draw_workloads(frame, body, st, r, &theme, &mut hits)
            }
            (View::Cgroups, _) => {
                super::cgview::draw_cgroups(frame, body, st, r, &theme, &mut hits)
            }
        },
    }
    draw_findings(frame, findings, st, report, &theme);
    draw_footer(frame, footer, st, &theme);
    if let Some(p) = &st.proving {
        super::widgets::draw_proving(frame, body, p, &theme);
    }
    if st.help {
        draw_help(frame, &theme);
    }
    hits
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
    if st.tracing {
        top.push(Span::styled(" · TRACING", t.fg(Color::Cyan)));
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
            let (model, excess) = (r.model_bytes(), r.excess_bytes());
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
    let excess_style = match report.map(Report::excess_bytes) {
        Some(e) if e > 0 => t.fg(Color::Yellow).add_modifier(Modifier::BOLD),
        _ => Style::default(),
    };
    let mut lines = vec![
        Line::from(top),
        Line::from(mem),
        Line::from(Span::styled(model, excess_style)),
    ];
    lines.extend(gpu_lines(report).into_iter().map(Line::from));
    frame.render_widget(Paragraph::new(lines), area);
}

/// One header line per GPU (at most 4), or one saying why GPUs are not known; none for a
/// report without GPU information (recorded before it existed).
fn gpu_lines(report: Option<&Report>) -> Vec<String> {
    let Some(r) = report else {
        return Vec::new();
    };
    if let Some(why) = &r.gpus.not_available {
        return vec![format!("gpu n/a ({})", safe(why))];
    }
    r.gpus
        .devices
        .iter()
        .take(4)
        .map(|d| {
            format!(
                "gpu{} {} · {} · used {} of {} · processes {}",
                d.info.index,
                safe(d.info.name.as_deref().unwrap_or("n/a")),
                match d.info.integrated {
                    Some(true) => "integrated",
                    Some(false) => "discrete",
                    None => "type n/a",
                },
                iec_opt(d.info.memory_used_bytes),
                iec_opt(d.info.memory_total_bytes),
                iec_opt(d.process_memory_bytes),
            )
        })
        .collect()
}

fn draw_tabs(
    frame: &mut Frame,
    area: Rect,
    st: &State,
    t: &Theme,
) -> (u16, Vec<super::mouse::Span<View>>) {
    let mut spans = Vec::new();
    let mut tabs = Vec::new();
    let mut x = area.x;
    for (i, v) in View::ALL.iter().enumerate() {
        let label = format!(" {} {} ", i + 1, v.title());
        let w = width(&label) as u16;
        tabs.push((x, x + w, *v));
        x += w + 1;
        let style = if *v == st.view {
            t.selected().add_modifier(Modifier::BOLD)
        } else {
            Style::default()
        };
        spans.push(Span::styled(label, style));
        spans.push(Span::raw(" "));
    }
    if st.view == View::Cgroups && st.workload != Workload::Off {
        spans.push(Span::raw(match st.workload {
            Workload::ByComm => " by workload: comm (w: by cgroup)",
            _ => " by workload: cgroup (w: tree)",
        }));
    } else {
        spans.push(Span::raw(format!(
            " sort {} {}",
            st.sort_column(st.view),
            if st.is_reversed(st.view) {
                "↑"
            } else {
                "↓"
            }
        )));
    }
    frame.render_widget(Paragraph::new(Line::from(spans)), area);
    (area.y, tabs)
}

/// The files view's columns (after the path), each with its priority.
const FILE_COLS: [Col; 9] = {
    use FileField as F;
    [
        Col::file(F::Size, 1),
        Col::file(F::Count, 0),
        Col::file(F::Cache, 2),
        Col::file(F::Cow, 6),
        Col::file(F::Private, 3),
        Col::file(F::Suspected, 7),
        Col::file(F::Resident, 4),
        Col::file(F::Holders, 5),
        Col::file(F::Uploaded, 8),
    ]
};

fn file_cell(f: &FileModel, col: &Col) -> String {
    match col.field {
        Some(Field::File(FileField::Count)) => count_cell(f),
        // Blank, not n/a, where no upload was traced: most files are never uploaded.
        Some(Field::File(FileField::Uploaded)) if f.uploads.is_empty() => String::new(),
        Some(Field::File(k)) => cell(k.value(f), k.unit()),
        _ => String::new(),
    }
}

fn draw_files(frame: &mut Frame, area: Rect, st: &State, r: &Report, t: &Theme, hits: &mut Hits) {
    let rows = st
        .file_rows(r)
        .into_iter()
        .map(|f| {
            let style = match f.representations.proven {
                Some(c) if c >= 1.995 => t.fg(Color::Yellow),
                _ => Style::default(),
            };
            let name = shown(&f.path, f.path_bytes.as_deref());
            let cells = FILE_COLS.iter().map(|c| file_cell(f, c)).collect();
            (name, cells, style)
        })
        .collect();
    table(
        frame,
        area,
        Flex::first("file", 22, Some(Field::File(FileField::Path))),
        &FILE_COLS,
        rows,
        Some(st.selected(View::Files)),
        t,
        hits,
    );
}

/// The processes view's columns before `holds (how)`, each with its priority (lower is
/// kept first on a narrow screen). `holds (how)`, which says how the process holds each
/// model file, is the flexible last column ([`PROC_HOLDS`]): never dropped, it takes the
/// room the kept columns leave.
pub(super) const PROC_COLS: [Col; 13] = {
    use ProcessField as P;
    [
        Col::process(P::Pid, 0),
        Col::process(P::Comm, 0),
        Col::process(P::Rss, 1),
        Col::process(P::Anon, 2),
        Col::process(P::File, 4),
        Col::process(P::Shmem, 8),
        Col::process(P::Cow, 7),
        Col::process(P::Pss, 5),
        Col::process(P::Uss, 9),
        Col::process(P::Dirty, 10),
        Col::process(P::Growth, 3),
        Col::process(P::Files, 6),
        Col::process(P::Gpu, 11),
    ]
};

/// `holds (how)`: at least 20 columns wide, the rest of the line where there is room.
pub(super) const PROC_HOLDS: Flex = Flex::last("holds (how)", 20, None);

fn process_cell(r: &Report, p: &ProcessModel, col: &Col) -> String {
    match col.field {
        // At most 15 characters, as the kernel keeps it.
        Some(Field::Process(ProcessField::Comm)) => safe(&p.comm).chars().take(15).collect(),
        Some(Field::Process(k)) => cell(k.value(r, p), k.unit()),
        _ => String::new(),
    }
}

fn draw_processes(
    frame: &mut Frame,
    area: Rect,
    st: &State,
    r: &Report,
    t: &Theme,
    hits: &mut Hits,
) {
    let rows = st
        .process_rows(r)
        .into_iter()
        .map(|p| {
            let cells = PROC_COLS.iter().map(|c| process_cell(r, p, c)).collect();
            let holds = safe(&state::process_holds(r, p.pid)).into_owned();
            (holds, cells, Style::default())
        })
        .collect();
    table(
        frame,
        area,
        PROC_HOLDS,
        &PROC_COLS,
        rows,
        Some(st.selected(View::Processes)),
        t,
        hits,
    );
}

fn draw_findings(frame: &mut Frame, area: Rect, st: &State, report: Option<&Report>, t: &Theme) {
    let all = report.map_or(0, |r| r.findings.len());
    let mut findings: Vec<_> = report.map(|r| st.findings(r)).unwrap_or_default();
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
        lines.push(Line::from(match report {
            None => "n/a",
            Some(_) if all > 0 => "none that the filter keeps",
            Some(_) => "none",
        }));
    }
    let mut title = format!("Findings ({}", findings.len());
    if findings.len() < all {
        title += &format!(" of {all}, filtered");
    }
    if findings.len() > shown_n {
        title += &format!(", {} more", findings.len() - shown_n);
    }
    title.push(')');
    frame.render_widget(
        Paragraph::new(lines).block(Block::bordered().title(title)),
        area,
    );
}

fn draw_footer(frame: &mut Frame, area: Rect, st: &State, t: &Theme) {
    let spans: Vec<(String, Style)> = if st.editing || !st.filter.is_empty() {
        let (note, note_style) = match (st.filter_error(), st.parsed_filter()) {
            (Some(e), _) => (
                format!("  not applied: {}", safe(&e)),
                t.fg(Color::Red).add_modifier(Modifier::BOLD),
            ),
            (None, Some(state::Filter::Compare { .. })) => {
                ("  (field compare)".into(), Style::default())
            }
            _ => (String::new(), Style::default()),
        };
        let mut spans = vec![
            ("filter /".into(), t.bold()),
            (safe(&st.filter).into_owned(), Style::default()),
            (
                if st.editing {
                    "▏  Enter: keep  Esc: clear"
                } else {
                    "  Esc: clear"
                }
                .into(),
                Style::default(),
            ),
            (note, note_style),
        ];
        // A kept filter leaves room for the status (a proof's outcome).
        if let Some(s) = st.status.as_ref().filter(|_| !st.editing) {
            spans.push(("  ·  ".into(), Style::default()));
            spans.push((safe(s).into_owned(), t.fg(Color::Cyan)));
        }
        spans
    } else if let Some(s) = &st.status {
        vec![(safe(s).into_owned(), t.fg(Color::Cyan))]
    } else if let Some(w) = st.warnings.first() {
        vec![(
            format!("{} warning(s): {}", st.warnings.len(), safe(&w.text)),
            t.fg(Color::Yellow),
        )]
    } else {
        // Whole hints, as many as fit (`?` first: it lists the rest).
        let step = if st.replay { "[ ] step" } else { "p prove" };
        let hints = [
            "? help",
            "q quit",
            "Tab view",
            "↑↓ move",
            "Enter open",
            "s/S sort",
            "/ filter",
            step,
            "w workload",
        ];
        let mut line = String::new();
        for h in hints {
            let sep = if line.is_empty() { "" } else { "  " };
            if width(&line) + sep.len() + width(h) > area.width as usize {
                break;
            }
            line = format!("{line}{sep}{h}");
        }
        vec![(line, Style::default())]
    };
    frame.render_widget(Paragraph::new(fit_line(spans, area.width as usize)), area);
}

/// The spans of a one-line status, cut at a word boundary (with `…`) where the line is
/// wider than `max`: never inside a word.
fn fit_line(spans: Vec<(String, Style)>, max: usize) -> Line<'static> {
    let mut left = max;
    let mut out = Vec::new();
    for (text, style) in spans {
        let w = width(&text);
        if w <= left {
            left -= w;
            out.push(Span::styled(text, style));
            continue;
        }
        let cut = cut_words(&text, left);
        if cut.trim_end_matches('…').trim().is_empty() {
            // Not one word of it fits: the line ends after the span before.
            if left > 0 {
                out.push(Span::styled("…", style));
            }
        } else {
            out.push(Span::styled(cut, style));
        }
        break;
    }
    Line::from(out)
}

/// The help: every line of the key table ([`super::keys::BINDINGS`]), which the key
/// handler reads too, so it cannot leave a key out.
fn draw_help(frame: &mut Frame, t: &Theme) {
    let bindings = super::keys::BINDINGS;
    let labels: Vec<String> = bindings.iter().map(|b| b.label()).collect();
    let key_w = labels.iter().map(|l| width(l)).max().unwrap_or(0) + 1;
    let area = frame.area();
    let w = area.width.min(80);
    let h = (bindings.len() as u16 + 4).min(area.height);
    let popup = Rect {
        x: area.x + (area.width - w) / 2,
        y: area.y + (area.height - h) / 2,
        width: w,
        height: h,
    };
    let mut lines: Vec<Line> = bindings
        .iter()
        .zip(&labels)
        .map(|(b, k)| {
            Line::from(vec![
                Span::styled(format!("{k:<key_w$}"), t.bold()),
                Span::raw(b.help),
            ])
        })
        .collect();
    lines.push(Line::from(""));
    lines.push(Line::from("columns, filters and keys: docs/top.md"));
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
