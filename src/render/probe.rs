//! Text for `twofold probe`: capabilities, import outcomes, endpoint rates and the
//! verdict with its reasons.

use std::fmt::Write;

use twofold_probes::types::{BackendCaps, Caps, CudaDeviceCaps, ImportStatus, VulkanDeviceCaps};

use super::table::{Align, Table};
use crate::model::probe::{BackendReport, Decision, ProbeReport};
use crate::units::{iec, iec_opt};

fn yes(b: bool) -> &'static str {
    if b {
        "yes"
    } else {
        "no"
    }
}

fn vulkan_device(s: &mut String, d: &VulkanDeviceCaps) {
    let _ = writeln!(
        s,
        "  [{}] {} ({}; driver {}; Vulkan {})",
        d.index,
        d.name,
        d.device_type,
        [d.driver_name.as_deref(), d.driver_info.as_deref()]
            .iter()
            .flatten()
            .copied()
            .collect::<Vec<_>>()
            .join(" ")
            .trim(),
        d.api_version
    );
    let _ = writeln!(s, "      topology: {}", d.topology.describe());
    let _ = writeln!(
        s,
        "      VK_EXT_external_memory_host: {}{}",
        yes(d.external_memory_host),
        d.min_imported_host_pointer_alignment
            .map(|a| format!(", minImportedHostPointerAlignment {}", iec(a)))
            .unwrap_or_default()
    );
    let _ = writeln!(
        s,
        "      maxMemoryAllocationSize {}, maxStorageBufferRange {}, maxBufferSize {}",
        iec_opt(d.max_memory_allocation_size),
        iec(d.max_storage_buffer_range),
        iec_opt(d.max_buffer_size)
    );
    for (i, h) in d.heaps.iter().enumerate() {
        let _ = writeln!(
            s,
            "      heap {i}: {}{}{}",
            iec(h.size_bytes),
            if h.device_local { " device-local" } else { "" },
            h.budget_bytes
                .map(|b| format!(", budget {}", iec(b)))
                .unwrap_or_default()
        );
    }
    for (i, t) in d.memory_types.iter().enumerate() {
        let flags = if t.flags.is_empty() {
            "no property flags".to_string()
        } else {
            t.flags.join(" ")
        };
        let _ = writeln!(s, "      type {i}: heap {}, {flags}", t.heap);
    }
}

fn cuda_device(s: &mut String, d: &CudaDeviceCaps) {
    let _ = writeln!(
        s,
        "  [{}] {} (compute {}; {} multiprocessors; {}; driver CUDA {})",
        d.ordinal,
        d.name,
        d.compute_capability,
        d.multiprocessors,
        iec(d.memory_bytes),
        d.driver_version.as_deref().unwrap_or("n/a")
    );
    let _ = writeln!(s, "      topology: {}", d.topology.describe());
    let _ = writeln!(
        s,
        "      integrated {}, canMapHostMemory {}, pageableMemoryAccess {}, pageableMemoryAccessUsesHostPageTables {}",
        yes(d.integrated),
        yes(d.can_map_host_memory),
        yes(d.pageable_memory_access),
        yes(d.pageable_memory_access_uses_host_page_tables)
    );
    let _ = writeln!(
        s,
        "      hostRegisterSupported {}, hostRegisterReadOnlySupported {}",
        yes(d.host_register_supported),
        yes(d.host_register_read_only_supported)
    );
    let link = d.pcie_link.as_ref().map(|l| {
        format!(
            "{} x{} (max {} x{})",
            l.current_speed.as_deref().unwrap_or("n/a"),
            l.current_width.map_or("n/a".into(), |w| w.to_string()),
            l.max_speed.as_deref().unwrap_or("n/a"),
            l.max_width.map_or("n/a".into(), |w| w.to_string())
        )
    });
    let _ = writeln!(
        s,
        "      PCI {}, link {}",
        d.pci_bus_id.as_deref().unwrap_or("n/a"),
        link.as_deref().unwrap_or("n/a (not in sysfs)")
    );
}

fn backend<D>(s: &mut String, name: &str, c: &BackendCaps<D>, one: fn(&mut String, &D)) {
    match &c.not_available {
        Some(why) => {
            let _ = writeln!(s, "{name}: not available ({why})");
        }
        None => {
            let n = c.devices.len();
            let _ = writeln!(s, "{name}: {n} device{}", if n == 1 { "" } else { "s" });
            for d in &c.devices {
                one(s, d);
            }
        }
    }
}

/// The capability listing.
pub fn caps(c: &Caps) -> String {
    let mut s = String::new();
    backend(&mut s, "Vulkan", &c.vulkan, vulkan_device);
    backend(&mut s, "CUDA", &c.cuda, cuda_device);
    s
}

fn signed(v: i64) -> String {
    format!("{}{}", if v < 0 { "-" } else { "+" }, iec(v.unsigned_abs()))
}

fn gbps(v: Option<f64>) -> String {
    v.map_or("n/a".into(), |b| format!("{b:.1}"))
}

fn one_backend(s: &mut String, b: &BackendReport) {
    let _ = writeln!(
        s,
        "\n{} on {} ({}):",
        b.backend.name(),
        b.device,
        b.topology.describe()
    );
    for i in &b.imports {
        let o = &i.outcome;
        let status = match o.status {
            ImportStatus::Ok => format!("ok in {:.3} s", o.seconds),
            ImportStatus::Failed => "failed".into(),
            ImportStatus::Hang => "HANG".into(),
            ImportStatus::Crashed => "crashed".into(),
        };
        let rss = match (o.anon_bytes_delta, o.file_bytes_delta) {
            (Some(a), Some(f)) if o.status == ImportStatus::Ok => {
                format!(" (RssAnon {}, RssFile {})", signed(a), signed(f))
            }
            _ => String::new(),
        };
        let _ = writeln!(
            s,
            "  import {} of {} ({}): {status}{rss}{}",
            iec(o.bytes),
            o.mapping,
            o.method.describe(),
            o.error
                .as_ref()
                .map(|e| format!(": {e}"))
                .unwrap_or_default()
        );
        if let Some(c) = &i.ceiling {
            let tried: Vec<String> = c
                .tried
                .iter()
                .map(|(n, st)| format!("{} {}", iec(*n), format!("{st:?}").to_lowercase()))
                .collect();
            let found = match (c.largest_ok, c.smallest_failed) {
                (Some(ok), Some(bad)) => format!("{} (fails at {})", iec(ok), iec(bad)),
                (Some(ok), None) => format!("at least {}", iec(ok)),
                (None, Some(bad)) => format!("none, down to {}", iec(bad)),
                (None, None) => "n/a".into(),
            };
            let _ = writeln!(
                s,
                "    largest single import: {found}; tried {}",
                tried.join(", ")
            );
        }
    }
    for e in &b.process_errors {
        let _ = writeln!(s, "  {e}");
    }
    let mut t = Table::new(&[
        ("endpoint", Align::Left),
        ("GB/s", Align::Right),
        ("min", Align::Right),
        ("max", Align::Right),
        ("W/B ms", Align::Right),
        ("ranges", Align::Right),
        ("checksum", Align::Left),
        ("how", Align::Left),
    ]);
    for e in &b.endpoints {
        let first = b
            .processes
            .iter()
            .find_map(|p| p.runs.iter().find(|r| r.arm == e.arm));
        t.row(vec![
            e.arm.name().into(),
            gbps(e.gbps),
            gbps(e.min_gbps),
            gbps(e.max_gbps),
            e.path_seconds
                .map_or("n/a".into(), |x| format!("{:.2}", x * 1e3)),
            first.filter(|r| r.ranges > 0).map_or("n/a".into(), |r| {
                format!("{} ≤ {}", r.ranges, iec(r.max_range_bytes))
            }),
            if e.valid { "= CPU" } else { "invalid" }.into(),
            first.and_then(|r| r.detail.clone()).unwrap_or_default(),
        ]);
    }
    let _ = write!(s, "{}", t.render(2));
    for e in b.endpoints.iter().filter(|e| !e.valid) {
        let _ = writeln!(
            s,
            "  {} invalid: {}",
            e.arm.name(),
            e.invalid_reason.as_deref().unwrap_or("no rate")
        );
    }
    if let Some(p) = b.processes.first() {
        let _ = writeln!(s, "  kernel: {}", p.kernel);
        for r in &p.references {
            let _ = writeln!(
                s,
                "  reference: {} {:.1} GB/s over {}",
                r.what,
                r.gbps,
                iec(r.bytes)
            );
        }
    }
    for l in &b.limits {
        let _ = writeln!(
            s,
            "  {} kernel at {:.0}% of {} ({:.1} of {:.1} GB/s){}",
            l.arm.name(),
            l.fraction * 100.0,
            l.reference,
            l.arm_gbps,
            l.reference_gbps,
            if l.met { "" } else { ", below the 85% target" }
        );
    }
    let v = &b.verdict;
    let _ = writeln!(
        s,
        "  verdict: {}{}",
        describe(v.decision),
        if v.tie { " [tie]" } else { "" }
    );
    for r in &v.reasons {
        let _ = writeln!(s, "    - {r}");
    }
    for (a, why) in &v.excluded {
        let _ = writeln!(s, "    - {} excluded: {why}", a.name());
    }
}

fn pct_opt(x: Option<f64>) -> String {
    x.map_or("n/a".into(), |x| format!("{:.1}%", x * 100.0))
}

/// The whole report.
pub fn human(doc: &ProbeReport) -> String {
    let mut s = caps(&doc.caps);
    if let Some(f) = &doc.file {
        let _ = writeln!(
            s,
            "\nfile '{}'{}: {}, working set {}, {} in the page cache at start ({} after the checksum pass), CPU checksum {}",
            f.path,
            if f.generated { " (generated)" } else { "" },
            iec(f.size_bytes),
            iec(f.working_set_bytes),
            pct_opt(f.resident_fraction_at_start),
            pct_opt(f.resident_fraction_after),
            f.cpu_checksum
        );
    }
    for b in &doc.backends {
        one_backend(&mut s, b);
    }
    s
}

/// What a decision means, for people.
pub fn describe(d: Decision) -> &'static str {
    match d {
        Decision::Map => "map (read the file pages in place)",
        Decision::Resident => "resident (keep a one-time copy in device memory)",
        Decision::PerUseCopy => "per-use copy (stage the bytes for every use)",
        Decision::StorageBound => "storage-bound (no in-memory path applies)",
        Decision::Undecided => "undecided (no valid endpoint)",
    }
}
