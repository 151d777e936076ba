//! The upload tracer's lines in `scan`'s text: per file, what each process uploaded of it
//! (and whether that proves a device copy) and who reads it in place; and the UPLOADS
//! section, per traced process.

use std::fmt::Write as _;

use crate::model::device::{clock, UploadModel};
use crate::model::{FileModel, Report};
use crate::units::{iec, iec_opt};

/// `[o, o+n)` of the first ranges, and how many more.
pub fn ranges(u: &UploadModel) -> String {
    let mut s: Vec<String> = u
        .ranges
        .iter()
        .take(3)
        .map(|(a, b)| format!("[{a}, {b})"))
        .collect();
    if u.ranges.len() > 3 {
        s.push(format!("and {} more ranges", u.ranges.len() - 3));
    }
    s.join(" ")
}

/// The per-file lines.
pub fn file_lines(f: &FileModel, out: &mut String) {
    let name = f.path.rsplit('/').next().unwrap_or(&f.path);
    for u in &f.uploads {
        let _ = writeln!(
            out,
            "    upload: pid {} ({}) uploaded {} of {name} ({}{}) to {} in {} cop{}, last at {}: {}",
            u.pid,
            u.comm,
            iec(u.file_bytes),
            ranges(u),
            if u.widened { ", widened F16/BF16 to F32" } else { "" },
            u.gpu.map_or("a GPU".to_string(), |g| format!("GPU {g}")),
            u.copies,
            if u.copies == 1 { "y" } else { "ies" },
            clock(u.last_unix_ns),
            match &u.not_proven {
                None => format!("proven at upload, {}", clock(u.last_unix_ns)),
                Some(why) => format!("not counted: {why}"),
            }
        );
    }
    for p in &f.in_place {
        let _ = writeln!(
            out,
            "    in place: pid {} ({}) registered its mapping of {name} ({} from offset {}) for device access (read in place, no device copy)",
            p.pid,
            p.comm,
            iec(p.bytes),
            p.file_offset
        );
    }
}

/// The UPLOADS section (only when uploads were traced).
pub fn section(report: &Report, out: &mut String) {
    let Some(u) = &report.gpus.uploads else {
        return;
    };
    if let Some(why) = &u.unavailable {
        let _ = writeln!(out, "\nUPLOADS: none traced ({why})");
        return;
    }
    let _ = writeln!(
        out,
        "\nUPLOADS (traced since {} through {})",
        clock(u.since_unix_ns),
        u.libraries.join(", ")
    );
    if u.lost_events > 0 {
        let _ = writeln!(out, "  {} calls lost (ring buffer full)", u.lost_events);
    }
    for p in &u.processes {
        let what = match p.verdict.as_str() {
            "not model bytes" => format!(
                "not model bytes (traced since {})",
                clock(p.seen.traced_since_unix_ns)
            ),
            "traced after its load" => format!(
                "upload tracing started after its load ({}): what it uploaded before is not known",
                clock(p.seen.traced_since_unix_ns)
            ),
            _ => format!("{} of model bytes uploaded", iec(p.seen.model_bytes)),
        };
        let _ = writeln!(
            out,
            "  pid {} ({}): {} copies, {} uploaded, {} device memory allocated (traced), {} on GPUs (NVML): {what}",
            p.seen.pid,
            p.seen.comm,
            p.seen.copies,
            iec(p.seen.copy_bytes),
            iec(p.seen.device_alloc_bytes),
            iec_opt(p.gpu_memory_bytes),
        );
    }
}
