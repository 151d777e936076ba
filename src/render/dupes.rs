//! Human output of `twofold dupes`.

use std::fmt::Write as _;

use super::table::{Align, Table};
use crate::model::dupes::DupesReport;
use crate::units::{count, iec};

pub fn human(r: &DupesReport) -> String {
    let mut out = String::new();
    for p in &r.processes {
        let _ = writeln!(out, "pid {} ({})", p.pid, p.comm);
        if let Some(e) = &p.error {
            let _ = writeln!(out, "  not searched: {e}");
            continue;
        }
        match (&p.host_files, p.files.is_empty()) {
            (Some(h), true) if h.considered > 0 => {
                let _ = writeln!(
                    out,
                    "  maps or holds no model file, and could hold a copy of none of the host's {} (its private memory or its reads are smaller); for a file it read and closed that no process maps, name it: twofold dupes --pid {} FILE",
                    count(h.considered, "model file", "model files"),
                    p.pid
                );
            }
            (_, true) => {
                let _ = writeln!(
                    out,
                    "  maps or holds no model file, and no process of the host maps, holds or names one; for a file it read and closed, name it: twofold dupes --pid {} FILE",
                    p.pid
                );
            }
            (Some(h), false) if h.considered > 0 => {
                let _ = writeln!(
                    out,
                    "  searched for {} of the host's {} (those it maps or holds, and those it could hold a copy of)",
                    p.files.len(),
                    count(h.considered, "model file", "model files"),
                );
            }
            _ => {}
        }
        for f in &p.files {
            let _ = writeln!(
                out,
                "  {}  ({}, {}, {})",
                f.path,
                iec(f.size_bytes),
                count(f.tensors as u64, "tensor", "tensors"),
                format!("{:?}", f.format).to_lowercase()
            );
            let _ = writeln!(
                out,
                "    identical copies: {} of {}, {}   converted or repacked: {}, {} (from {} of the file)",
                f.identical.tensors,
                count(f.tensors as u64, "tensor", "tensors"),
                iec(f.identical.memory_bytes),
                count(f.converted.tensors as u64, "tensor", "tensors"),
                iec(f.converted.memory_bytes),
                iec(f.converted.file_bytes)
            );
            let twice = if f.stats.compared_bytes > f.stats.present_bytes {
                "; more than searched: the pages of a partial copy are compared to confirm it, then again to credit the ones that match"
            } else {
                ""
            };
            let _ = writeln!(
                out,
                "    private copies of the file: {}   (searched {} of private memory, {} compared byte by byte{twice})",
                f.private_copies
                    .map(|v| format!("{v:.2}"))
                    .unwrap_or_else(|| "unknown (nothing in the file can be searched for)".into()),
                iec(f.stats.present_bytes),
                iec(f.stats.compared_bytes)
            );
            if f.shared_by > 1 {
                let _ = writeln!(
                    out,
                    "    its copy's pages are shared by {} of the processes searched (fork or shared memory): {:.0}% of them counted here",
                    f.shared_by,
                    f.share * 100.0
                );
            }
            if f.cow_bytes > 0 {
                let _ = writeln!(
                    out,
                    "    copy-on-write pages of its own private mapping of the file: {} (CoW, not a private copy)",
                    iec(f.cow_bytes)
                );
            }
            if f.too_small.tensors + f.low_entropy.tensors > 0 {
                let _ = writeln!(
                    out,
                    "    not searchable: {} under 256 bytes ({}), {} constant/low-entropy ({})",
                    count(f.too_small.tensors as u64, "tensor", "tensors"),
                    iec(f.too_small.file_bytes),
                    f.low_entropy.tensors,
                    iec(f.low_entropy.file_bytes)
                );
            }
            if !f.regions.is_empty() {
                let mut t = Table::new(&[
                    ("mapping", Align::Left),
                    ("kind", Align::Left),
                    ("identical", Align::Right),
                    ("converted", Align::Right),
                    ("where", Align::Left),
                ]);
                for g in &f.regions {
                    t.row(vec![
                        format!("{:x}-{:x}", g.start, g.end),
                        format!("{:?}", g.kind).to_lowercase(),
                        iec(g.identical_bytes),
                        iec(g.converted_bytes),
                        g.label.clone(),
                    ]);
                }
                out.push_str(&t.render(4));
            }
        }
    }
    if !r.files.is_empty() {
        let searched: Vec<String> = r
            .processes
            .iter()
            .filter(|p| p.error.is_none())
            .map(|p| p.pid.to_string())
            .collect();
        let _ = writeln!(
            out,
            "\nREPRESENTATIONS (page cache + CoW + proven private copies in the {} searched: {}; a copy shared by several counts once; other processes' copies are not in it, `twofold scan FILE` searches the host)",
            count(searched.len() as u64, "process", "processes"),
            if searched.is_empty() {
                "none".to_string()
            } else {
                format!("pid {}", searched.join(", "))
            }
        );
        let mut t = Table::new(&[
            ("file", Align::Left),
            ("size", Align::Right),
            ("page cache", Align::Right),
            ("cow", Align::Right),
            ("copies", Align::Right),
            ("total", Align::Right),
        ]);
        for f in &r.files {
            t.row(vec![
                f.path.clone(),
                iec(f.size_bytes),
                f.page_cache
                    .map(|v| format!("{v:.2}"))
                    .unwrap_or_else(|| "n/a".into()),
                format!("{:.2}", f.cow),
                f.private_copies
                    .map(|v| format!("{v:.2}"))
                    .unwrap_or_else(|| "unknown".into()),
                f.representations
                    .map(|v| format!("{v:.2}"))
                    .unwrap_or_else(|| "n/a".into()),
            ]);
        }
        out.push_str(&t.render(2));
    }
    out
}
