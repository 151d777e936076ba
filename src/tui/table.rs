//! The pieces every table of `twofold top` is drawn with: the [`Theme`] (colours, or none
//! under `NO_COLOR`), a [`Col`]umn as the field registry ([`crate::model::fields`])
//! describes it, [`cell`] (a value as `top` shows it), and [`table`], which fits the columns
//! a screen has room for, draws the rows and says where its headers and rows went (for the
//! mouse). Only drawing: no state.

use ratatui::layout::{Constraint, Rect};
use ratatui::style::{Color, Modifier, Style};
use ratatui::text::Line;
use ratatui::widgets::{Cell, Paragraph, Row, Table, TableState};
use ratatui::Frame;

use super::mouse::Hits;
use crate::model::fields::{CgroupField, Field, FileField, ProcessField, Unit, Value};
use crate::render::safe::{safe, width};
use crate::units::{iec, iec_opt};

/// Styles, or none of them under `NO_COLOR` (bold and reverse still show).
pub struct Theme {
    pub color: bool,
}

impl Theme {
    pub fn fg(&self, c: Color) -> Style {
        if self.color {
            Style::default().fg(c)
        } else {
            Style::default()
        }
    }
    pub fn bold(&self) -> Style {
        Style::default().add_modifier(Modifier::BOLD)
    }
    pub fn selected(&self) -> Style {
        Style::default().add_modifier(Modifier::REVERSED)
    }
}

pub fn pct(f: Option<f64>) -> String {
    f.map(|v| format!("{:.1}%", v * 100.0))
        .unwrap_or_else(|| "n/a".into())
}

pub fn opt_num<T: ToString>(v: Option<T>) -> String {
    v.map(|v| v.to_string()).unwrap_or_else(|| "n/a".into())
}

/// `+1.0 MiB/s`, `-4.0 KiB/s`, `0 B/s`, `n/a`.
pub fn rate(v: Option<f64>) -> String {
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
pub fn tail(s: &str, max: usize) -> String {
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

/// A column: title, width, priority (lower is kept first when the screen is narrow),
/// alignment, the field it shows (if it is one) and whether a click on its title sorts
/// by that field.
pub struct Col {
    pub title: &'static str,
    pub width: u16,
    pub prio: u8,
    pub left: bool,
    pub field: Option<Field>,
    pub sorts: bool,
}

impl Col {
    /// The column of `field` as the registry describes it, sorting by it.
    const fn of(field: Field, title: &'static str, width: u16, unit: Unit, prio: u8) -> Col {
        Col {
            title,
            width,
            prio,
            left: matches!(unit, Unit::Text),
            field: Some(field),
            sorts: true,
        }
    }

    pub const fn file(f: FileField, prio: u8) -> Col {
        Col::of(Field::File(f), f.title(), f.width(), f.unit(), prio)
    }

    pub const fn process(f: ProcessField, prio: u8) -> Col {
        Col::of(Field::Process(f), f.title(), f.width(), f.unit(), prio)
    }

    pub const fn cgroup(f: CgroupField, prio: u8) -> Col {
        Col::of(Field::Cgroup(f), f.title(), f.width(), f.unit(), prio)
    }

    /// The same column, not sortable from its title.
    pub const fn unsorted(self) -> Col {
        Col {
            sorts: false,
            ..self
        }
    }
}

/// A value as `top` shows it: bytes in IEC units, ratios in percent, unknown as `n/a`.
pub fn cell(v: Value, unit: Unit) -> String {
    match (unit, v) {
        (Unit::Ratio, v) => pct(v.number()),
        (Unit::BytesPerSecond, v) => rate(v.number()),
        (Unit::Bytes, Value::Uint(b)) => iec_opt(b),
        (_, Value::Text(t)) => safe(&t).into_owned(),
        (_, Value::Uint(n)) => opt_num(n),
        (_, Value::Int(n)) => n.to_string(),
        (_, Value::Real(x)) => opt_num(x),
        (_, Value::Flag(b)) => b.to_string(),
    }
}

fn align(line: Line<'_>, left: bool) -> Line<'_> {
    if left {
        line
    } else {
        line.right_aligned()
    }
}

/// The columns (of widths `widths`) that fit next to a flexible first column of at least
/// `flex_min`, in their original order.
fn fit(cols: &[Col], widths: &[u16], total: u16, flex_min: u16) -> Vec<usize> {
    let mut order: Vec<usize> = (0..cols.len()).collect();
    order.sort_by_key(|&i| cols[i].prio);
    let mut used = flex_min;
    let mut keep = Vec::new();
    for i in order {
        let w = widths[i] + 1;
        if used + w <= total {
            used += w;
            keep.push(i);
        }
    }
    keep.sort_unstable();
    keep
}

/// The flexible column: its title, its least width, its sort field and where it is.
/// It is never dropped: it takes what the kept columns leave.
#[derive(Debug, Clone, Copy)]
pub struct Flex {
    pub title: &'static str,
    pub min: u16,
    pub sort: Option<Field>,
    /// After the other columns (cut at the end), rather than before them (cut at the
    /// start, as a path is).
    pub last: bool,
}

impl Flex {
    /// A first column (a path: cut at its start).
    pub const fn first(title: &'static str, min: u16, sort: Option<Field>) -> Flex {
        Flex {
            title,
            min,
            sort,
            last: false,
        }
    }

    /// A last column (a list: cut at its end).
    pub const fn last(title: &'static str, min: u16, sort: Option<Field>) -> Flex {
        Flex {
            title,
            min,
            sort,
            last: true,
        }
    }
}

/// The flexible column `flex` and the columns `cols` that fit beside it, by priority.
/// Each row is (the flexible column's text, the cells of `cols`, its style). Fills `hits`
/// with the header's sortable columns and the body's rows.
#[allow(clippy::too_many_arguments)]
pub fn table(
    frame: &mut Frame,
    area: Rect,
    flex_col: Flex,
    cols: &[Col],
    rows: Vec<(String, Vec<String>, Style)>,
    selected: Option<usize>,
    t: &Theme,
    hits: &mut Hits,
) {
    // A column is as wide as its widest cell (a value is never cut: `1016.7 MiB` in a
    // column planned for 9 characters widens it).
    let col_w: Vec<u16> = cols
        .iter()
        .enumerate()
        .map(|(i, c)| {
            rows.iter()
                .filter_map(|r| r.1.get(i))
                .map(|v| width(v) as u16)
                .fold(c.width, u16::max)
        })
        .collect();
    let keep = fit(cols, &col_w, area.width, flex_col.min);
    let flex = area
        .width
        .saturating_sub(keep.iter().map(|&i| col_w[i] + 1).sum::<u16>());
    // Where each drawn column is: `None` for the flexible one, else its index in `cols`.
    let order: Vec<Option<usize>> = if flex_col.last {
        keep.iter().copied().map(Some).chain([None]).collect()
    } else {
        [None]
            .into_iter()
            .chain(keep.iter().copied().map(Some))
            .collect()
    };
    let widths: Vec<Constraint> = order
        .iter()
        .map(|c| Constraint::Length(c.map_or(flex, |i| col_w[i])))
        .collect();
    let header: Vec<Cell> = order
        .iter()
        .map(|c| match c {
            None => Cell::from(flex_col.title),
            Some(i) => Cell::from(align(Line::from(cols[*i].title), cols[*i].left)),
        })
        .collect();
    // Only the rows that can show are built (a host with thousands of files or processes
    // draws a screenful): the window ratatui would scroll to, with the selection in view.
    let room = usize::from(area.height.saturating_sub(1)).max(1);
    let empty = rows.is_empty();
    let selected = selected.map(|s| s.min(rows.len().saturating_sub(1)));
    let skip = selected.map_or(0, |s| (s + 1).saturating_sub(room));
    let body: Vec<Row> = rows
        .into_iter()
        .skip(skip)
        .take(room)
        .map(|(name, cells, style)| {
            let row: Vec<Cell> = order
                .iter()
                .map(|c| match c {
                    None if flex_col.last => Cell::from(tail_right(&name, flex as usize)),
                    None => Cell::from(tail(&name, flex as usize)),
                    Some(i) => Cell::from(align(Line::from(cells[*i].clone()), cols[*i].left)),
                })
                .collect();
            Row::new(row).style(style)
        })
        .collect();
    let table = Table::new(body, widths)
        .header(Row::new(header).style(t.bold().add_modifier(Modifier::UNDERLINED)))
        .column_spacing(1)
        .row_highlight_style(t.selected());
    let mut ts = TableState::default().with_selected(selected.filter(|_| !empty).map(|s| s - skip));
    frame.render_stateful_widget(table, area, &mut ts);
    let mut x = area.x;
    let mut sortable = Vec::new();
    for c in &order {
        let (w, sort) = match c {
            None => (flex, flex_col.sort),
            Some(i) => (col_w[*i], cols[*i].field.filter(|_| cols[*i].sorts)),
        };
        if let Some(s) = sort {
            sortable.push((x, x + w, s.name()));
        }
        x += w + 1;
    }
    hits.header = Some((area.y, sortable));
    hits.body = Some((
        area.y + 1,
        area.height.saturating_sub(1),
        skip + ts.offset(),
    ));
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

/// At most `max` columns of `s`, cut at the end (`map llama.gguf, co…`).
pub fn tail_right(s: &str, max: usize) -> String {
    if width(s) <= max {
        return s.to_string();
    }
    let mut out = String::new();
    let mut w = 1;
    for c in s.chars() {
        let cw = width(c.encode_utf8(&mut [0; 4]));
        if w + cw > max {
            break;
        }
        w += cw;
        out.push(c);
    }
    out.push('…');
    out
}

/// At most `max` columns of `s`, cut after a whole word with `…` (never inside a word;
/// a first word longer than the line is cut at `max`).
pub fn cut_words(s: &str, max: usize) -> String {
    if width(s) <= max {
        return s.to_string();
    }
    let cut = tail_right(s, max);
    let kept = cut.trim_end_matches('…');
    // The text goes on inside a word: go back to the last space.
    match kept.rfind(' ') {
        Some(i) if i > 0 => format!("{}…", kept[..i].trim_end()),
        _ => cut,
    }
}
