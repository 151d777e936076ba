//! The upload tracer's lines in `scan`'s text: per file, what each process uploaded of it
//! (and whether that proves a device copy) and who reads it in place; and the UPLOADS
//! section, per traced process.

use std::fmt::Write as _;

use crate::model::device::{clock, UploadModel};
use crate::model::findings::text::gpu_label;
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

/// `, converted F32→BF16` (or the old `widened` flag), and why the file is this one.
fn form(u: &UploadModel) -> String {
    let mut s = match u.conversion {
        Some(c) => format!(", {}", crate::sample::converted::words(c)),
        None if u.widened => ", widened F16/BF16 to F32".into(),
        None => String::new(),
    };
    if let Some(a) = &u.attribution {
        let _ = write!(s, "; {a}");
    }
    s
}

/// The device-copy lines of a file (proven and suspected).
fn device_lines(f: &FileModel, out: &mut String) {
    for d in &f.device_copies {
        let how = match (d.via.as_str(), d.proven, &d.note) {
            ("upload" | "clone", _, note) => format!(
                ", {} {}{}",
                if d.via == "clone" {
                    "cloned on the device,"
                } else {
                    "proven at upload,"
                },
                clock(d.proven_at_unix_ns.unwrap_or(0)),
                note.as_deref()
                    .map(|n| n.trim_start_matches("cloned on the device"))
                    .map(|n| n.trim_start_matches("; "))
                    .filter(|n| !n.is_empty())
                    .map_or(String::new(), |n| format!(" ({n})"))
            ),
            (_, true, _) => ", read back identical to the file".to_string(),
            (via, false, Some(note)) => {
                format!(" ({via} the file; NVML gives sizes, not contents; {note})")
            }
            (via, false, None) => format!(" ({via} the file; NVML gives sizes, not contents)"),
        };
        let _ = writeln!(
            out,
            "    {} device copy: pid {} ({}) on {}: {} of device memory{how}",
            if d.proven { "proven" } else { "suspected" },
            d.pid,
            d.comm,
            gpu_label(d.gpu, d.gpu_name.as_deref(), d.integrated),
            iec(d.device_bytes),
        );
    }
}

/// The per-file lines: device copies, uploads and clones, reads in place.
pub fn file_lines(f: &FileModel, out: &mut String) {
    device_lines(f, out);
    let name = f.path.rsplit('/').next().unwrap_or(&f.path);
    for u in &f.uploads {
        let _ = writeln!(
            out,
            "    {}: pid {} ({}) {} {} of {name} ({}{}) {} {} in {} cop{}, last at {}: {}",
            if u.cloned { "clone" } else { "upload" },
            u.pid,
            u.comm,
            if u.cloned { "cloned" } else { "uploaded" },
            iec(u.file_bytes),
            ranges(u),
            form(u),
            if u.cloned { "on" } else { "to" },
            u.gpu.map_or("a GPU".to_string(), |g| format!("GPU {g}")),
            u.copies,
            if u.copies == 1 { "y" } else { "ies" },
            clock(u.last_unix_ns),
            match (&u.not_proven, u.cloned) {
                (None, false) => format!("proven at upload, {}", clock(u.last_unix_ns)),
                (None, true) => format!("cloned on the device, {}", clock(u.last_unix_ns)),
                (Some(why), _) => format!("not counted: {why}"),
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
    match &u.tracer {
        Some(t) => {
            let _ = writeln!(
                out,
                "\nUPLOADS (uploads traced by pid {} (twofold {}) since {} through {}; its ledger as of {})",
                t.pid,
                t.command,
                clock(u.since_unix_ns),
                u.libraries.join(", "),
                clock(t.written_unix_ns)
            );
        }
        None => {
            let _ = writeln!(
                out,
                "\nUPLOADS (traced since {} through {})",
                clock(u.since_unix_ns),
                u.libraries.join(", ")
            );
        }
    }
    if let Some(g) = &u.gds {
        let _ = match &g.unavailable {
            Some(why) => writeln!(
                out,
                "  GPUDirect Storage reads (cuFileRead): not traced: {why}"
            ),
            None => writeln!(
                out,
                "  GPUDirect Storage reads (cuFileRead) traced through {}",
                g.libraries.join(", ")
            ),
        };
    }
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
