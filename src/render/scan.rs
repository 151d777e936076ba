//! Human output of a scan [`Report`].

use std::fmt::Write as _;

use super::safe::shown;
use super::table::{Align, Table};
use crate::model::{CopyHow, FileModel, MapKind, Report, Severity};
use crate::units::{iec, iec_opt};

fn pct(f: Option<f64>) -> String {
    f.map(|v| format!("{:.1}%", v * 100.0))
        .unwrap_or_else(|| "n/a".into())
}

/// At most `max` characters, with an ellipsis when cut.
fn short(s: &str, max: usize) -> String {
    if s.chars().count() <= max {
        return s.to_string();
    }
    let mut out: String = s.chars().take(max - 1).collect();
    out.push('…');
    out
}

/// How the copy was made, with the conversion when it holds converted tensors.
fn how(c: &crate::model::ProvenCopy) -> String {
    let conversion = c.conversion().map(crate::sample::converted::words);
    let base = match c.how {
        CopyHow::Read => "read()",
        CopyHow::CopiedFromMapping => "copied from its mapping",
        CopyHow::Converted => {
            let x = conversion
                .as_deref()
                .unwrap_or("converted to another dtype");
            return format!("{x} from its mapping");
        }
        CopyHow::Copied => "copied",
        CopyHow::SharedMemory => "in shared memory",
        CopyHow::Pinned => "pinned host memory",
    };
    match conversion {
        Some(x) => format!("{base}, {x}"),
        None => base.to_string(),
    }
}

/// How one physical copy is shared: merged by KSM, shared memory, or fork.
fn sharing(s: &crate::model::SharedCopy) -> &'static str {
    if s.ksm {
        "merged by KSM"
    } else if s.shmem {
        "shared memory"
    } else {
        "fork"
    }
}

/// The note for a process that holds, or may hold, a copy.
pub(crate) fn copy_note(f: &FileModel, pid: i32, plus: bool) -> String {
    let plus = if plus { "+ " } else { "" };
    if let Some(c) = f.proven_copies.iter().find(|c| c.pid == pid) {
        let kind = match c.how {
            CopyHow::Pinned => "pinned host copy",
            _ if c.huge_pages => "private copy in huge pages (hugetlbfs)",
            _ => "private copy",
        };
        if let Some(s) = &c.shared {
            return format!(
                "{plus}{kind}, {:.0}% of the file ({}, proven), shared by {} processes ({}{}): {:.0}% counted here",
                c.fraction / c.share.max(1e-9) * 100.0,
                how(c),
                s.by,
                sharing(s),
                if s.estimated { ", estimated" } else { "" },
                c.fraction * 100.0
            );
        }
        if c.how == CopyHow::SharedMemory {
            return format!(
                "{plus}copy in shared memory, {} of the file (proven)",
                crate::units::percent(c.fraction)
            );
        }
        if c.fraction > 1.005 {
            // Several copies in one process (a heap that holds each tensor more than once).
            let kinds = kind.replace("copy", "copies");
            return format!(
                "{plus}{kinds}: {:.2} of the file ({}, proven)",
                c.fraction,
                how(c)
            );
        }
        return format!(
            "{plus}{kind}, {} of the file ({}, proven)",
            crate::units::percent(c.fraction),
            how(c)
        );
    }
    if let Some(s) = f.suspected_copies.iter().find(|s| s.pid == pid) {
        return format!(
            "{plus}suspected copy: private anon {}, not searched",
            iec(s.anon_bytes)
        );
    }
    String::new()
}

/// The count alone, as [`count_line`] writes it: `2.00`, `≥ 1.00`, `n/a` (residency
/// unknown). For table cells (`top`).
pub fn count_cell(f: &FileModel) -> String {
    let r = &f.representations;
    match r.proven {
        None => "n/a".to_string(),
        Some(p) => format!("{}{p:.2}", if r.lower_bound { "≥ " } else { "" }),
    }
}

/// Processes holding a proven or suspected copy that neither map nor hold the file open
/// (they read it, then closed it), by pid.
pub fn unlisted_copy_holders(f: &FileModel) -> Vec<(i32, &str)> {
    let listed =
        |pid: i32| f.mappers.iter().any(|m| m.pid == pid) || f.holders.iter().any(|h| h.pid == pid);
    let mut others: Vec<(i32, &str)> = f
        .proven_copies
        .iter()
        .map(|c| (c.pid, c.comm.as_str()))
        .chain(f.suspected_copies.iter().map(|s| (s.pid, s.comm.as_str())))
        .filter(|(pid, _)| !listed(*pid))
        .collect();
    others.sort_unstable();
    others.dedup();
    others
}

/// "2.00 times" or "≥ 1.00 times", with the parts and what is only suspected.
pub fn count_line(f: &FileModel) -> String {
    let r = &f.representations;
    let Some(proven) = r.proven else {
        return "in memory: unknown times (page-cache residency unknown)".to_string();
    };
    let ge = if r.lower_bound { "≥ " } else { "" };
    let opt = |v: Option<f64>| v.map(|v| format!("{v:.2}")).unwrap_or_else(|| "n/a".into());
    let mut s = format!(
        "in memory {ge}{proven:.2} times: page cache {} + CoW {} + private copies {:.2}",
        opt(r.page_cache),
        opt(r.cow),
        r.private_copies
    );
    if let Some(d) = r.device {
        let _ = write!(s, " + device {d:.2}");
    }
    let mut beside = Vec::new();
    if !f.suspected_copies.is_empty() {
        let pids: Vec<String> = f
            .suspected_copies
            .iter()
            .map(|c| c.pid.to_string())
            .collect();
        beside.push(format!(
            "the suspected cop{} in pid {}",
            if pids.len() == 1 { "y" } else { "ies" },
            pids.join(", "),
        ));
    }
    let dev: Vec<String> = f
        .device_copies
        .iter()
        .filter(|c| !c.proven)
        .map(|c| match c.gpu {
            Some(g) => format!("{} on GPU {g}", c.pid),
            None => c.pid.to_string(),
        })
        .collect();
    if !dev.is_empty() {
        beside.push(format!(
            "the suspected device cop{} in pid {}",
            if dev.len() == 1 { "y" } else { "ies" },
            dev.join(", "),
        ));
    }
    if !beside.is_empty() {
        let many = beside.len() > 1 || f.suspected_copies.len() + dev.len() > 1;
        let _ = write!(
            s,
            "; up to {:.2} if {} {} real",
            proven + r.suspected + r.suspected_device,
            beside.join(" and "),
            if many { "are" } else { "is" }
        );
    }
    s
}

pub use crate::model::findings::text::gpu_label;

pub(crate) fn map_kind(k: MapKind) -> &'static str {
    match k {
        MapKind::Shared => "MAP_SHARED",
        MapKind::Private => "MAP_PRIVATE",
        MapKind::Mixed => "shared+private",
    }
}

fn file_section(f: &FileModel, out: &mut String) {
    let _ = writeln!(out, "  {}", shown(&f.path, f.path_bytes.as_deref()));
    if let Some(of) = &f.shmem_copy_of {
        let _ = writeln!(
            out,
            "    shmem copy of {} (proven byte by byte; counted as a copy of it)",
            shown(&of.path, None)
        );
    }
    for p in &f.shmem_places {
        let by = if p.pids.is_empty() {
            "mapped by no process".to_string()
        } else {
            let pids: Vec<String> = p.pids.iter().map(i32::to_string).collect();
            format!("mapped by pid {}", pids.join(", "))
        };
        let _ = writeln!(
            out,
            "    copy in shared memory: {} ({} resident, {by}; counted in the private copies)",
            shown(&p.path, None),
            iec_opt(p.resident_bytes),
        );
    }
    for twin in &f.same_bytes {
        let _ = writeln!(
            out,
            "    same bytes as {} (another file with its own page cache: see the findings)",
            shown(&twin.path, None)
        );
    }
    for other in &f.seen_as {
        let _ = writeln!(
            out,
            "    seen as {} (another name of the same inode: another mount namespace's, or an overlay's over it)",
            shown(other, None)
        );
    }
    let _ = writeln!(
        out,
        "    size {}  resident {} ({}{})",
        iec_opt(f.size_bytes),
        iec_opt(f.resident_bytes),
        pct(f.resident_fraction),
        f.residency_source
            .as_ref()
            .map(|s| format!(", {s}"))
            .unwrap_or_default(),
    );
    let _ = writeln!(out, "    {}", count_line(f));
    for u in &f.unexplained {
        let _ = writeln!(
            out,
            "    beside it: {}",
            super::safe::safe(&crate::model::unexplained::beside_line(u))
        );
    }
    if let Some(l) = super::findings::searched_line(f) {
        let _ = writeln!(out, "    {l}");
    }
    let mut t = Table::new(&[
        ("pid", Align::Right),
        ("comm", Align::Left),
        ("how", Align::Left),
        ("prot", Align::Left),
        ("mapped", Align::Right),
        ("resident", Align::Right),
        ("pss", Align::Right),
        ("cow anon", Align::Right),
        ("thp", Align::Right),
        ("note", Align::Left),
    ]);
    for m in &f.mappers {
        t.row(vec![
            m.pid.to_string(),
            m.comm.clone(),
            map_kind(m.kind).into(),
            m.prot.clone(),
            iec(m.mapped_bytes),
            iec_opt(m.resident_bytes),
            iec_opt(m.pss_bytes),
            iec_opt(m.cow_anon_bytes),
            iec_opt(m.thp_bytes),
            copy_note(f, m.pid, true),
        ]);
    }
    for h in f.holders.iter().filter(|h| !h.mapped) {
        let fds: Vec<String> = h.fds.iter().map(|d| d.to_string()).collect();
        t.row(vec![
            h.pid.to_string(),
            h.comm.clone(),
            format!("open fd {}, not mapped", fds.join(",")),
            "-".into(),
            "-".into(),
            "-".into(),
            "-".into(),
            "-".into(),
            "-".into(),
            copy_note(f, h.pid, false),
        ]);
    }
    // Copy holders that neither map nor hold the file: read it, then closed it.
    for (pid, comm) in unlisted_copy_holders(f) {
        t.row(vec![
            pid.to_string(),
            comm.to_string(),
            "not open, not mapped".into(),
            "-".into(),
            "-".into(),
            "-".into(),
            "-".into(),
            "-".into(),
            "-".into(),
            copy_note(f, pid, false),
        ]);
    }
    if !t.is_empty() {
        out.push_str(&t.render(4));
    }
    super::uploads::file_lines(f, out);
    if let Some(reason) = &f.residency_unknown_reason {
        let _ = writeln!(out, "    residency unknown: {reason}");
    }
}

/// Renders the whole report for a terminal.
pub fn human(report: &Report) -> String {
    let mut out = String::new();
    super::head::head(report, &mut out);
    if !report.files.is_empty() {
        out.push_str("\nMODEL FILES\n");
        for f in &report.files {
            file_section(f, &mut out);
        }
    }
    if !report.processes.is_empty() {
        out.push_str("\nPROCESSES\n");
        let mut t = Table::new(&[
            ("pid", Align::Right),
            ("comm", Align::Left),
            ("rss", Align::Right),
            ("anon", Align::Right),
            ("file", Align::Right),
            ("shmem", Align::Right),
            ("pss", Align::Right),
            ("uss", Align::Right),
            ("private dirty", Align::Right),
            ("swap", Align::Right),
            ("gpu", Align::Right),
            ("cgroup", Align::Left),
            ("command", Align::Left),
        ]);
        for p in &report.processes {
            t.row(vec![
                p.pid.to_string(),
                p.comm.clone(),
                iec_opt(p.rss_bytes),
                iec_opt(p.anon_bytes),
                iec_opt(p.file_bytes),
                iec_opt(p.shmem_bytes),
                iec_opt(p.pss_bytes),
                iec_opt(p.uss_bytes),
                iec_opt(p.private_dirty_bytes),
                iec_opt(p.swap_bytes),
                iec_opt(p.gpu_memory_bytes),
                p.cgroup.clone().unwrap_or_else(|| "n/a".into()),
                short(&p.cmdline, 60),
            ]);
        }
        out.push_str(&t.render(2));
    }
    gpu_section(report, &mut out);
    if !report.cgroups.is_empty() {
        out.push_str("\nCGROUPS\n");
        let mut t = Table::new(&[
            ("cgroup", Align::Left),
            ("ver", Align::Left),
            ("usage", Align::Right),
            ("limit", Align::Right),
            ("peak", Align::Right),
            ("anon", Align::Right),
            ("file", Align::Right),
            ("file mapped", Align::Right),
            ("shmem", Align::Right),
            ("refaults", Align::Right),
            ("oom kills", Align::Right),
        ]);
        for c in &report.cgroups {
            t.row(vec![
                c.path.clone(),
                c.version
                    .map(|v| format!("{v:?}").to_lowercase())
                    .unwrap_or_else(|| "n/a".into()),
                iec_opt(c.usage_bytes),
                if c.unlimited {
                    "max".into()
                } else {
                    iec_opt(c.limit_bytes)
                },
                iec_opt(c.peak_bytes),
                iec_opt(c.anon_bytes),
                iec_opt(c.file_bytes),
                iec_opt(c.file_mapped_bytes),
                iec_opt(c.shmem_bytes),
                c.refaults_file
                    .map(|v| v.to_string())
                    .unwrap_or_else(|| "n/a".into()),
                c.oom_kills
                    .map(|v| v.to_string())
                    .unwrap_or_else(|| "n/a".into()),
            ]);
        }
        out.push_str(&t.render(2));
    }
    if let Some(t) = &report.trace {
        out.push_str(&super::trace::scan_section(t));
    }
    out.push_str("\nFINDINGS\n");
    if report.findings.is_empty() {
        out.push_str("  none\n");
    }
    for f in &report.findings {
        let tag = match f.severity {
            Severity::Warning => "warning",
            Severity::Notice => "notice ",
            Severity::Info => "info   ",
        };
        let t = f.text();
        let _ = writeln!(out, "  {tag}  {}", t.message);
        if let Some(r) = &t.remedy {
            let _ = writeln!(out, "           → {r}");
        }
    }
    let policy = report.privilege.is_some_and(|p| p.reads_any());
    if report.skipped.denied > 0 && policy {
        let _ = writeln!(
            out,
            "\n{} could not be read: {}; whether {} the files is unknown",
            crate::units::count(report.skipped.denied, "process", "processes"),
            crate::collect::access::POLICY,
            if report.skipped.denied == 1 {
                "it maps or holds"
            } else {
                "they map or hold"
            }
        );
    } else if report.skipped.denied > 0 {
        let _ = writeln!(
            out,
            "\n{} process{} could not be read (root or CAP_SYS_PTRACE needed): whether {} the files is unknown",
            report.skipped.denied,
            if report.skipped.denied == 1 { "" } else { "es" },
            if report.skipped.denied == 1 {
                "it maps or holds"
            } else {
                "they map or hold"
            }
        );
    }
    if report.skipped.gone > 0 {
        let _ = writeln!(
            out,
            "\n{} exited during the scan and {} skipped",
            crate::units::count(report.skipped.gone, "process", "processes"),
            if report.skipped.gone == 1 {
                "was"
            } else {
                "were"
            }
        );
    }
    out
}

fn gpu_section(report: &Report, out: &mut String) {
    gpus(report, out);
    super::uploads::section(report, out);
}

fn gpus(report: &Report, out: &mut String) {
    let g = &report.gpus;
    if let Some(why) = &g.not_available {
        let _ = writeln!(out, "\nGPUS: n/a ({why})");
        return;
    }
    out.push_str("\nGPUS\n");
    let mut t = Table::new(&[
        ("gpu", Align::Right),
        ("name", Align::Left),
        ("kind", Align::Left),
        ("pcie", Align::Left),
        ("total", Align::Right),
        ("used", Align::Right),
        ("free", Align::Right),
        ("processes", Align::Right),
    ]);
    for d in &g.devices {
        t.row(vec![
            d.info.index.to_string(),
            d.info.name.clone().unwrap_or_else(|| "n/a".into()),
            match d.info.integrated {
                Some(true) => "integrated".into(),
                Some(false) => "discrete".into(),
                None => "n/a".into(),
            },
            match (d.info.pcie_link_gen, d.info.pcie_link_width) {
                (Some(gen), Some(w)) => format!("gen{gen} x{w}"),
                _ => "n/a".into(),
            },
            iec_opt(d.info.memory_total_bytes),
            iec_opt(d.info.memory_used_bytes),
            iec_opt(d.info.memory_free_bytes),
            iec_opt(d.process_memory_bytes),
        ]);
    }
    out.push_str(&t.render(2));
}
