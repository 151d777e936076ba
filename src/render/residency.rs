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

/// A column of the fincore-compatible table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Column {
    Res,
    Pages,
    Size,
    File,
}

/// A size as util-linux prints it (`fincore` without `--bytes`): powers of 1024, one
/// letter (B, K, M, …), at most one decimal (rounded half up, a trailing `.0` dropped).
pub fn fincore_size(bytes: u64) -> String {
    const LETTERS: [char; 7] = ['B', 'K', 'M', 'G', 'T', 'P', 'E'];
    let mut exp = 0u32;
    while exp < 60 && bytes >= 1u64 << (exp + 10) {
        exp += 10;
    }
    let letter = LETTERS[(exp / 10) as usize];
    if exp == 0 {
        return format!("{bytes}{letter}");
    }
    let mut whole = bytes >> exp;
    let rest = bytes & ((1u64 << exp) - 1);
    // Thousandths of the unit, then tenths rounded half up.
    let thousandths = ((u128::from(rest) * 1000) >> exp) as u64;
    let mut tenths = (thousandths + 50) / 100;
    if tenths == 10 {
        whole += 1;
        tenths = 0;
    }
    if tenths == 0 {
        format!("{whole}{letter}")
    } else {
        format!("{whole}.{tenths}{letter}")
    }
}

/// The table `fincore` prints: the columns asked for, single-space separated, right
/// aligned but FILE (left, never padded last), each at least as wide as its name, sizes as util-linux writes them or in
/// bytes; a residency that is unknown is `n/a`, never 0.
pub fn fincore(files: &[FileResidency], columns: &[Column], bytes: bool, headings: bool) -> String {
    let size = |v: Option<u64>| match v {
        Some(b) if bytes => b.to_string(),
        Some(b) => fincore_size(b),
        None => "n/a".to_string(),
    };
    // A column is at least as wide as its name, printed or not (as fincore does).
    let mut rows: Vec<Vec<String>> = vec![columns
        .iter()
        .map(|c| format!("{c:?}").to_uppercase())
        .collect()];
    for f in files {
        rows.push(
            columns
                .iter()
                .map(|c| match c {
                    Column::Res => size(f.resident_bytes),
                    Column::Pages => f
                        .resident_pages
                        .map(|p| p.to_string())
                        .unwrap_or_else(|| "n/a".into()),
                    Column::Size => size(f.size_bytes),
                    Column::File => shown(&f.path, f.path_bytes.as_deref()),
                })
                .collect(),
        );
    }
    let mut widths = vec![0; columns.len()];
    for r in &rows {
        for (i, c) in r.iter().enumerate() {
            widths[i] = widths[i].max(super::safe::width(c));
        }
    }
    let mut out = String::new();
    for r in rows.iter().skip(usize::from(!headings)) {
        let mut line = String::new();
        for (i, c) in r.iter().enumerate() {
            let pad = " ".repeat(widths[i].saturating_sub(super::safe::width(c)));
            if i > 0 {
                line.push(' ');
            }
            if columns[i] == Column::File {
                line.push_str(c);
                if i + 1 < r.len() {
                    line.push_str(&pad);
                }
            } else {
                line.push_str(&pad);
                line.push_str(c);
            }
        }
        out.push_str(&line);
        out.push('\n');
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

#[cfg(test)]
mod fincore_tests {
    use super::*;

    #[test]
    fn sizes_read_as_util_linux_writes_them() {
        let m = 1u64 << 20;
        assert_eq!(fincore_size(0), "0B");
        assert_eq!(fincore_size(1023), "1023B");
        assert_eq!(fincore_size(4096), "4K");
        assert_eq!(fincore_size(3 * m), "3M");
        assert_eq!(fincore_size(1_536_000), "1.5M");
        assert_eq!(fincore_size(30_068_736), "28.7M");
        // 0.96 of a unit rounds up to the next whole one; 0.04 down to none.
        assert_eq!(fincore_size(m + m * 96 / 100), "2M");
        assert_eq!(fincore_size(m + m * 4 / 100), "1M");
        assert_eq!(fincore_size(u64::MAX), "16E");
    }
}
