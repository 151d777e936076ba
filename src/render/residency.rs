//! Human output of `twofold residency`, in the manner of `fincore` (and `vmtouch -v`).

use std::fmt::Write as _;

use super::safe::{safe, shown};
use super::table::{Align, Table};
use crate::model::residency::{FileResidency, Totals};
use crate::units::{iec, iec_opt};

/// Cells per line of a residency map.
const MAP_WIDTH: usize = 64;

pub fn human(files: &[FileResidency]) -> String {
    let mut t = Table::new(&[
        ("resident", Align::Right),
        ("pages", Align::Right),
        ("of pages", Align::Right),
        ("%", Align::Right),
        ("size", Align::Right),
        ("dirty", Align::Right),
        ("file", Align::Left),
    ]);
    for f in files {
        t.row(vec![
            iec_opt(f.resident_bytes),
            f.resident_pages
                .map(|p| p.to_string())
                .unwrap_or_else(|| "n/a".into()),
            f.pages
                .map(|p| p.to_string())
                .unwrap_or_else(|| "n/a".into()),
            f.resident_fraction
                .map(|v| format!("{:.1}", v * 100.0))
                .unwrap_or_else(|| "n/a".into()),
            iec_opt(f.size_bytes),
            iec_opt(f.dirty_bytes),
            shown(&f.path, f.path_bytes.as_deref()),
        ]);
    }
    let mut out = t.render(0);
    for f in files {
        if let Some(reason) = &f.unknown_reason {
            let _ = writeln!(
                out,
                "'{}': residency unknown: {}",
                shown(&f.path, f.path_bytes.as_deref()),
                safe(reason)
            );
        }
        if let Some(m) = &f.map {
            let _ = writeln!(
                out,
                "\n{}  ({} page{} per cell; O all resident, o some, blank none)",
                shown(&f.path, f.path_bytes.as_deref()),
                m.pages_per_cell,
                if m.pages_per_cell == 1 { "" } else { "s" }
            );
            let cells: Vec<char> = m.cells.chars().collect();
            for line in cells.chunks(MAP_WIDTH) {
                let s: String = line.iter().collect();
                let _ = writeln!(out, "[{s:<MAP_WIDTH$}]");
            }
        }
    }
    if files.len() > 1 {
        let _ = writeln!(out, "{}", summary_line(&Totals::of(files)));
    }
    out
}

/// "N files: X of Y resident", with the files whose residency is unknown apart (never
/// counted as 0 B).
pub fn summary_line(t: &Totals) -> String {
    let files = |n: usize| format!("{n} file{}", if n == 1 { "" } else { "s" });
    let mut s = format!("{}: ", files(t.files));
    let known = t.files - t.unknown_files;
    if known > 0 {
        let _ = write!(
            s,
            "{} of {} resident",
            iec(t.resident_bytes),
            iec(t.known_size_bytes)
        );
    }
    if t.unknown_files > 0 {
        if known > 0 {
            let _ = write!(s, " ({} known); ", files(known));
        }
        let _ = write!(
            s,
            "residency unknown for {} ({})",
            if known > 0 {
                files(t.unknown_files)
            } else {
                "all".into()
            },
            t.unknown_size_bytes.map_or("size n/a".into(), iec)
        );
    }
    s
}
