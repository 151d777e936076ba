//! Findings: small rules over the model, each a one-line explanation and a remedy.

use serde::{Deserialize, Serialize};

use super::{CgroupModel, CopyHow, FileModel, MapKind};
use crate::units::{iec, iec_opt};

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Severity {
    Warning,
    Notice,
    Info,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Finding {
    pub severity: Severity,
    /// Stable identifier of the rule (`suspected-private-copy`, ...).
    pub code: String,
    /// The file path or cgroup it concerns.
    pub subject: String,
    pub message: String,
    pub remedy: Option<String>,
}

/// Below this page-cache fraction a mapped file's reads go to storage.
pub const LOW_RESIDENCY: f64 = 0.9;
/// A cgroup using this fraction of its limit is near it.
pub const NEAR_LIMIT: f64 = 0.9;

fn name(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or(path)
}

fn finding(
    sev: Severity,
    code: &str,
    subject: &str,
    message: String,
    remedy: Option<&str>,
) -> Finding {
    Finding {
        severity: sev,
        code: code.to_string(),
        subject: subject.to_string(),
        message,
        remedy: remedy.map(str::to_string),
    }
}

pub fn evaluate(files: &[FileModel], cgroups: &[CgroupModel]) -> Vec<Finding> {
    let mut out = Vec::new();
    for f in files {
        file_findings(f, &mut out);
    }
    for c in cgroups {
        cgroup_findings(c, &mut out);
    }
    out.sort_by_key(|f| f.severity);
    out
}

fn file_findings(f: &FileModel, out: &mut Vec<Finding>) {
    let n = name(&f.path);
    let size = iec_opt(f.size_bytes);
    for c in &f.proven_copies {
        let (how, remedy) = match c.how {
            CopyHow::Read => (
                "copied with read()",
                "load it with mmap (llama.cpp's default, np.load(mmap_mode='r'), torch.load(mmap=True)) to share the page cache instead of copying it",
            ),
            CopyHow::CopiedFromMapping => (
                "copied out of its mapping of the file",
                "use the mapped tensors in place instead of copying them (no .clone()/.copy() or dtype conversion of weights at load)",
            ),
            CopyHow::Copied => (
                "copied",
                "load it with mmap to share the page cache instead of copying it",
            ),
        };
        let traced = match (c.traced_read_bytes, f.size_bytes) {
            (Some(r), Some(size)) if size > 0 => format!(
                "; it read() {:.0}% of the file during the trace",
                r as f64 * 100.0 / size as f64
            ),
            _ => String::new(),
        };
        let widened = if c.widened_bytes > 0 {
            format!(" ({} of it widened to F32)", iec(c.widened_bytes))
        } else {
            String::new()
        };
        out.push(finding(
            Severity::Warning,
            "proven-private-copy",
            &f.path,
            format!(
                "pid {} ({}) holds a private copy of '{n}' {how}: {:.0}% of the file found byte by byte in its private memory{widened}{traced}",
                c.pid, c.comm, c.fraction * 100.0
            ),
            Some(remedy),
        ));
    }
    for s in &f.suspected_copies {
        out.push(finding(
            Severity::Notice,
            "suspected-private-copy",
            &f.path,
            format!(
                "pid {} ({}) could hold a copy of '{n}' (private memory {}, {size} file) but was not searched: {}",
                s.pid, s.comm, iec(s.anon_bytes), s.unsearched
            ),
            Some("run as root (or with CAP_SYS_PTRACE) and without --no-prove, or raise --prove-budget, to prove or rule it out"),
        ));
    }
    device_findings(f, n, out);
    for m in &f.mappers {
        let cow = m.cow_anon_bytes.unwrap_or(0);
        if m.kind != MapKind::Shared && m.writable && cow > 0 {
            out.push(finding(
                Severity::Warning,
                "cow-in-private-mapping",
                &f.path,
                format!(
                    "'{n}' is mapped MAP_PRIVATE writable by pid {} ({}), then written in place: {} of it are copy-on-write private pages, a second copy of those bytes",
                    m.pid, m.comm, iec(cow)
                ),
                Some("map it read-only, or do not write tensors in place: each written page becomes a private copy"),
            ));
        }
        if m.beyond_eof_bytes > 0 {
            out.push(finding(
                Severity::Warning,
                "mapping-beyond-eof",
                &f.path,
                format!(
                    "pid {} ({}) maps {} of '{n}' past its end: the file shrank while mapped, touching those pages raises SIGBUS",
                    m.pid, m.comm, iec(m.beyond_eof_bytes)
                ),
                Some("never truncate or rewrite a model file in place while it is mapped; write a new file and rename it"),
            ));
        }
        if m.thp_bytes.unwrap_or(0) > 0 {
            out.push(finding(
                Severity::Info,
                "file-thp",
                &f.path,
                format!(
                    "pid {} ({}) maps {} of '{n}' with 2 MiB huge pages (FilePmdMapped)",
                    m.pid,
                    m.comm,
                    iec(m.thp_bytes.unwrap_or(0))
                ),
                None,
            ));
        }
    }
    let sharers = f
        .mappers
        .iter()
        .filter(|m| !m.writable || m.kind == MapKind::Shared)
        .count();
    if sharers >= 2 {
        out.push(finding(
            Severity::Info,
            "shared-mapping",
            &f.path,
            format!(
                "{} share one mapped copy of '{n}' ({size}): PSS splits it between them",
                crate::units::count(sharers as u64, "process", "processes")
            ),
            None,
        ));
    }
    let held = !f.mappers.is_empty() || !f.holders.is_empty();
    match (f.resident_fraction, &f.residency_unknown_reason) {
        (Some(r), _) if held && !f.mappers.is_empty() && r < LOW_RESIDENCY => out.push(finding(
            Severity::Notice,
            "low-residency",
            &f.path,
            format!("'{n}' is {:.0}% resident in the page cache: reads will hit storage", r * 100.0),
            Some("leave room for the page cache (memory limit, competing processes) or prefetch it (vmtouch -t)"),
        )),
        (None, Some(reason)) => out.push(finding(
            Severity::Notice,
            "residency-unknown",
            &f.path,
            format!("page-cache residency of '{n}' is unknown: {reason}"),
            Some("run as root, or as the file's owner"),
        )),
        _ => {}
    }
    let r = &f.representations;
    if let Some(total) = r.proven {
        if total >= 1.8 {
            let mut parts = vec![format!(
                "page cache {:.0}%",
                r.page_cache.unwrap_or(0.0) * 100.0
            )];
            if let Some(cow) = r.cow.filter(|c| *c > 0.0) {
                parts.push(format!("CoW {:.0}%", cow * 100.0));
            }
            if !f.proven_copies.is_empty() {
                parts.push(format!(
                    "{} private cop{} ({:.0}%)",
                    f.proven_copies.len(),
                    if f.proven_copies.len() == 1 {
                        "y"
                    } else {
                        "ies"
                    },
                    r.private_copies * 100.0
                ));
            }
            let at_least = if r.lower_bound { "at least " } else { "" };
            out.push(finding(
                Severity::Warning,
                "multiple-representations",
                &f.path,
                format!(
                    "'{n}' is in memory {at_least}{total:.2} times, proven: {}",
                    parts.join(" + ")
                ),
                Some("on unified memory the GPU can read the page cache in place: the copies are waste; on a discrete GPU only the device copy is needed"),
            ));
        }
    }
    if r.unsearched > 0 {
        out.push(finding(
            Severity::Info,
            "count-is-lower-bound",
            &f.path,
            format!(
                "the count of '{n}' is a lower bound: {} of {} that could hold a copy {} not searched",
                r.unsearched,
                crate::units::count(f.candidates.could_hold as u64, "process", "processes"),
                if r.unsearched == 1 { "was" } else { "were" }
            ),
            None,
        ));
    }
}

fn cgroup_findings(c: &CgroupModel, out: &mut Vec<Finding>) {
    if let Some(k) = c.oom_kills.filter(|k| *k > 0) {
        out.push(finding(
            Severity::Warning,
            "cgroup-oom-kills",
            &c.path,
            format!("cgroup '{}' has had {k} OOM kill(s)", c.path),
            Some("a private model copy counts against the limit twice with its page cache; map the model instead, or raise the limit"),
        ));
    }
    if let (Some(u), Some(l)) = (c.usage_bytes, c.limit_bytes) {
        if l > 0 && u as f64 >= NEAR_LIMIT * l as f64 {
            out.push(finding(
                Severity::Warning,
                "cgroup-near-limit",
                &c.path,
                format!(
                    "cgroup '{}' uses {} of its {} limit ({:.0}%)",
                    c.path,
                    iec(u),
                    iec(l),
                    u as f64 * 100.0 / l as f64
                ),
                Some("page cache of mapped weights is reclaimable, anonymous copies are not: prefer mapping"),
            ));
        }
    }
}

/// Device copies: proven ones (twofold's loaders) and suspected ones (NVML sizes), with the
/// placement verdict of the seed paper: on a discrete GPU the device copy is the right one
/// and host copies are the waste; on an integrated GPU the device could read the page
/// cache in place.
fn device_findings(f: &FileModel, n: &str, out: &mut Vec<Finding>) {
    for d in &f.device_copies {
        let gpu = crate::render::scan::gpu_label(d.gpu, d.gpu_name.as_deref(), d.integrated);
        let (verdict, remedy) = match d.integrated {
            Some(false) => (
                "on a discrete GPU the device copy is the right one: host copies of it (page cache, private copies) are the waste once it is uploaded",
                "after upload, free host copies (drop read() buffers; load with mmap so the page cache stays reclaimable)",
            ),
            Some(true) => (
                "on an integrated GPU (unified memory) the device could read the page cache in place: this copy doubles the model in the same DRAM",
                "import the file's pages instead of copying them; `twofold probe` measures map, resident and per-use-copy on this machine",
            ),
            None => (
                "whether the GPU shares host memory is not known (no libcuda)",
                "`twofold probe --caps` says whether the GPU is integrated",
            ),
        };
        if d.proven {
            out.push(finding(
                Severity::Info,
                "proven-device-copy",
                &f.path,
                format!(
                    "pid {} ({}) holds a device copy of '{n}' on {gpu}: {} of device memory, read back identical to the file; {verdict}",
                    d.pid, d.comm, iec(d.device_bytes)
                ),
                Some(remedy),
            ));
        } else {
            out.push(finding(
                Severity::Notice,
                "suspected-device-copy",
                &f.path,
                format!(
                    "pid {} ({}) {} '{n}' and holds {} of device memory on {gpu}: a suspected device copy (NVML gives sizes, not contents); {verdict}",
                    d.pid,
                    d.comm,
                    match d.via.as_str() {
                        "mapped" => "maps",
                        "open" => "holds open",
                        "copied" => "copied",
                        "read" => "read()",
                        _ => "names",
                    },
                    iec(d.device_bytes)
                ),
                Some(remedy),
            ));
        }
    }
}
