//! The head of `scan`'s text: what was found, the host's memory, the observers, and for
//! `scan --pid P` which of the host's files P was searched for.

use std::fmt::Write as _;

use crate::model::Report;
use crate::units::{iec, iec_opt};

/// The lines above MODEL FILES.
pub(super) fn head(report: &Report, out: &mut String) {
    let holders = report
        .processes
        .iter()
        .filter(|p| p.holds_files.is_some_and(|n| n > 0))
        .count();
    let _ = writeln!(
        out,
        "twofold scan: {} model file{} held by {} process{}{}",
        report.files.len(),
        if report.files.len() == 1 { "" } else { "s" },
        holders,
        if holders == 1 { "" } else { "es" },
        match report.skipped.denied {
            0 => String::new(),
            n => format!(" (and unknown for {n} unreadable)"),
        }
    );
    if let (Some(total), Some(avail), Some(cache)) = (
        report.system.mem_total_bytes,
        report.system.mem_available_bytes,
        report.system.page_cache_bytes,
    ) {
        let _ = writeln!(
            out,
            "memory: total {}  available {}  page cache {}  anon {}",
            iec(total),
            iec(avail),
            iec(cache),
            iec_opt(report.system.anon_bytes)
        );
    }
    if !report.observers.is_empty() {
        let pids: Vec<String> = report.observers.iter().map(|p| p.to_string()).collect();
        let _ = writeln!(
            out,
            "observers: pid {} (twofold itself: never counted as holders or candidates)",
            pids.join(", ")
        );
    }
    if let Some(h) = &report.host_files {
        host_files_line(report, h, out);
    }
}

/// `scan --pid P` without named files: which of the host's files P was searched for.
fn host_files_line(report: &Report, h: &crate::sample::HostFiles, out: &mut String) {
    let pids: Vec<String> = report.processes.iter().map(|p| p.pid.to_string()).collect();
    let who = format!(
        "pid{} {}",
        if pids.len() == 1 { "" } else { "s" },
        pids.join(", ")
    );
    let named = format!("name it: twofold scan --pid {} FILE", pids.join(" --pid "));
    if h.considered == 0 {
        let _ = writeln!(
            out,
            "searched for: no process of the host maps, holds or names a model file; for a file {who} read and closed, {named}"
        );
        return;
    }
    let _ = writeln!(
        out,
        "searched for: the host's {} (those any process maps, holds or names){}; for a file no process maps or holds, {named}",
        crate::units::count(h.considered, "model file", "model files"),
        match h.left_out {
            0 => String::new(),
            n => format!(
                ", {n} left out: {who} neither map{} nor hold{} {}, nor a copy of {}",
                if pids.len() == 1 { "s" } else { "" },
                if pids.len() == 1 { "s" } else { "" },
                if n == 1 { "it" } else { "them" },
                if n == 1 { "it" } else { "them" },
            ),
        }
    );
}
