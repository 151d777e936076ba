//! The exporter's metrics: a pure function from a [`Report`] to metric families, and their
//! encoding (OpenMetrics through the official `prometheus-client` crate, and Prometheus
//! text 0.0.4). No I/O here; `twofold serve` ([`crate::cmd::serve`]) collects and serves.
//!
//! Names, labels and units are listed in `docs/serve.md`. Base units only (`_bytes`,
//! `_seconds`, `_ratio`), counters end in `_total` (the encoder appends it), paths appear
//! only in `twofold_file_info`, and every file series carries `file_id` =
//! `major:minor:inode` (as `twofold dump`). Cardinality is bounded by `max_files`: the
//! files holding the most bytes are exported one by one, the rest are folded into
//! `file_id="other"` and the series that folding saved are counted.

pub mod encode;
pub mod kube;

use std::collections::BTreeMap;

use crate::model::fields::{file_id, CgroupField, FileField, FILE_HELD_BYTES};
use crate::model::{FileModel, Report};

pub use encode::{openmetrics, openmetrics_with, prometheus_text};
pub use selfm::{scrape_time, Histogram, SelfStats, ERROR_KINDS};

/// The `file_id` of the files folded together past `max_files`.
pub const OTHER: &str = "other";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Gauge,
    /// A cumulative count; registered without `_total`, which the encoder appends.
    Counter,
    /// Classic buckets, `_sum` and `_count`: the family's [`Family::histogram`].
    Histogram,
}

/// One labelled value.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    pub labels: Vec<(String, String)>,
    pub value: f64,
}

/// One metric family: name (counters without `_total`), help (no final period: the
/// encoder adds one), type and samples.
#[derive(Debug, Clone, PartialEq)]
pub struct Family {
    pub name: &'static str,
    pub help: &'static str,
    pub kind: Kind,
    pub samples: Vec<Sample>,
    /// The value of a [`Kind::Histogram`] family (unlabelled); `None` for the others.
    pub histogram: Option<Histogram>,
}

#[derive(Debug, Clone, Copy)]
pub struct Options {
    /// Files exported one by one; the rest are folded into `file_id="other"`.
    pub max_files: usize,
    /// Add a `pid` label to the workload series (high cardinality: off by default).
    pub per_pid: bool,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            max_files: 50,
            per_pid: false,
        }
    }
}

/// The families of one report, and how many series folding saved in it.
#[derive(Debug, Clone, PartialEq)]
pub struct Exposition {
    pub families: Vec<Family>,
    pub dropped_series: u64,
}

/// The held-bytes kinds of a file, in exposition order.
pub const KINDS: [&str; 5] = [
    "page_cache",
    "private_copy_proven",
    "private_copy_suspected",
    "cow",
    "device",
];

/// A file's bytes in memory by kind (`None`: unknown, not exported), as the model
/// derives them; the private copies' are their physical shares unrounded (`dump` writes
/// whole bytes per copy: [`FileField::ProvenCopy`]).
pub fn held_bytes(f: &FileModel) -> [Option<f64>; 5] {
    let n = |v: Option<u64>| v.map(|v| v as f64);
    [
        n(f.resident_bytes),
        Some(f.proven_copy_bytes()),
        Some(f.suspected_copy_bytes() as f64),
        n(f.counted_cow_bytes()),
        n(f.counted_device_bytes()),
    ]
}

fn total_held(f: &FileModel) -> f64 {
    held_bytes(f).iter().flatten().sum()
}

/// The model format a file's name says, if any (`safetensors`, `gguf`, …).
pub fn format_of(path: &str) -> Option<String> {
    crate::collect::has_model_extension(path).then(|| {
        let p = path.strip_suffix(" (deleted)").unwrap_or(path);
        std::path::Path::new(p)
            .extension()
            .map(|e| e.to_string_lossy().to_lowercase())
            .unwrap_or_default()
    })
}

fn l(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

type Labels = Vec<(String, String)>;
/// A family being accumulated: help, type and value by label set.
type FamilyAcc = (&'static str, Kind, BTreeMap<Labels, f64>);

/// Accumulates samples by family and label set (summing repeated label sets).
#[derive(Default)]
struct Acc {
    /// name → (help, kind, labels → value), families in first-use order.
    order: Vec<&'static str>,
    fams: BTreeMap<&'static str, FamilyAcc>,
    hists: BTreeMap<&'static str, (&'static str, Histogram)>,
}

impl Acc {
    fn add(
        &mut self,
        name: &'static str,
        help: &'static str,
        kind: Kind,
        labels: Vec<(String, String)>,
        v: f64,
    ) {
        // OpenMetrics allows `"`, `\` and newlines in HELP only escaped, and the 0.0.4 text
        // format knows no `\"` escape: help texts use none of them.
        debug_assert!(!help.contains(['"', '\\', '\n']), "{name}: help text");
        if !v.is_finite() {
            return;
        }
        let fam = self.fams.entry(name).or_insert_with(|| {
            self.order.push(name);
            (help, kind, BTreeMap::new())
        });
        *fam.2.entry(labels).or_insert(0.0) += v;
    }

    fn gauge(
        &mut self,
        name: &'static str,
        help: &'static str,
        labels: Vec<(String, String)>,
        v: f64,
    ) {
        self.add(name, help, Kind::Gauge, labels, v);
    }

    fn histogram(&mut self, name: &'static str, help: &'static str, h: Histogram) {
        debug_assert!(!help.contains(['"', '\\', '\n']), "{name}: help text");
        if !self.hists.contains_key(name) && !self.fams.contains_key(name) {
            self.order.push(name);
        }
        self.hists.insert(name, (help, h));
    }

    fn finish(mut self) -> Vec<Family> {
        self.order
            .iter()
            .filter_map(|name| {
                if let Some((help, h)) = self.hists.remove(name) {
                    return Some(Family {
                        name,
                        help,
                        kind: Kind::Histogram,
                        samples: Vec::new(),
                        histogram: Some(h),
                    });
                }
                let (help, kind, samples) = self.fams.remove(name)?;
                Some(Family {
                    name,
                    help,
                    kind,
                    samples: samples
                        .into_iter()
                        .map(|(labels, value)| Sample { labels, value })
                        .collect(),
                    histogram: None,
                })
            })
            .collect()
    }
}

/// Series of one file, exported under `id`.
fn file_series(acc: &mut Acc, f: &FileModel, id: &str) {
    let idl = || l(&[("file_id", id)]);
    let mut info = l(&[("file_id", id), ("path", &f.path)]);
    if let Some(fmt) = format_of(&f.path) {
        info.push(("format".into(), fmt));
    }
    acc.gauge(
        "twofold_file_info",
        "A model file in memory: its path and format (1 while it is seen)",
        info,
        1.0,
    );
    for alias in &f.seen_as {
        acc.gauge(
            "twofold_file_alias_info",
            "Another name of a model file (a hard link, a symlink, another mount namespace's name, an overlay's path over it); twofold_file_info has its one path",
            l(&[("file_id", id), ("path", alias)]),
            1.0,
        );
    }
    for twin in &f.same_bytes {
        let k = twin.key;
        let twin_id = format!("{}:{}:{}", k.major, k.minor, k.inode);
        acc.gauge(
            "twofold_file_same_bytes_info",
            "Another model file of the same bytes (same size and fingerprint), with its own page cache: what both have cached is in memory twice",
            l(&[("file_id", id), ("twin_file_id", &twin_id)]),
            1.0,
        );
    }
    gauge(acc, FileField::Size, f, idl());
    for (kind, v) in KINDS.iter().zip(held_bytes(f)) {
        if let Some(v) = v {
            acc.gauge(
                FILE_HELD_BYTES,
                HELD_HELP,
                l(&[("file_id", id), ("kind", kind)]),
                v,
            );
        }
    }
    // Proven copies in another form, by transform: the cause beside the count.
    let mut transformed: Vec<(String, f64)> = Vec::new();
    for c in &f.proven_copies {
        for t in &c.conversions {
            let name = transform_label(t.conversion);
            let bytes = t.memory_bytes as f64 * c.share;
            match transformed.iter_mut().find(|(n, _)| *n == name) {
                Some(e) => e.1 += bytes,
                None => transformed.push((name, bytes)),
            }
        }
    }
    for (name, bytes) in transformed {
        acc.gauge(
            "twofold_file_transformed_bytes",
            "Bytes of the file's proven private copies held in another dtype or layout, by transform (f32_to_f16, repack_q4_0_8x8, amx_q4_1...): part of private_copy_proven",
            l(&[("file_id", id), ("transform", &name)]),
            bytes,
        );
    }
    if f.representations.proven.is_some() {
        gauge(acc, FileField::Count, f, idl());
        gauge(acc, FileField::Excess, f, idl());
    }
    gauge(acc, FileField::LowerBound, f, idl());
    gauge(acc, FileField::Resident, f, idl());
    acc.gauge(
        "twofold_file_unexplained_bytes",
        "Private memory of processes related to the file that is distributed like its bytes but is no form of it twofold knows (estimated from sampled pages; shown from 25% of the file): beside the count, never in it",
        idl(),
        f.unexplained.iter().map(|u| u.estimated_bytes).sum::<u64>() as f64,
    );
}

/// A transform's label value: the conversion's JSON name (`f32_to_f16`), `repack_` and the
/// layout (`repack_q4_0_8x8`), or the AMX layout (`amx_q4_1`).
fn transform_label(c: crate::sample::converted::Conversion) -> String {
    use crate::sample::converted::Conversion;
    match c {
        Conversion::Repack(l) => format!("repack_{}", l.spec().name),
        Conversion::Amx(l) => l.spec().name.to_string(),
        other => serde_json::to_value(other)
            .ok()
            .and_then(|v| v.as_str().map(str::to_string))
            .unwrap_or_default(),
    }
}

/// The help of [`FILE_HELD_BYTES`].
const HELD_HELP: &str = "Bytes of the file held in memory, by kind (page_cache, private_copy_proven, private_copy_suspected, cow, device)";

/// The field's family (a gauge), when the file has a value for it.
fn gauge(acc: &mut Acc, k: FileField, f: &FileModel, labels: Labels) {
    if let (Some(m), Some(v)) = (k.metric(), k.value(f).number()) {
        acc.gauge(m.name, m.help, labels, v);
    }
}

/// Folded files: sums of what adds up (size, held bytes, excess).
fn other_series(acc: &mut Acc, folded: &[&FileModel]) {
    if folded.is_empty() {
        return;
    }
    let id = || l(&[("file_id", OTHER)]);
    acc.gauge(
        "twofold_file_info",
        "A model file in memory: its path and format (1 while it is seen)",
        l(&[("file_id", OTHER), ("path", OTHER)]),
        1.0,
    );
    for f in folded {
        gauge(acc, FileField::Size, f, id());
        gauge(acc, FileField::Excess, f, id());
        for (kind, v) in KINDS.iter().zip(held_bytes(f)) {
            if let Some(v) = v {
                acc.gauge(
                    FILE_HELD_BYTES,
                    HELD_HELP,
                    l(&[("file_id", OTHER), ("kind", kind)]),
                    v,
                );
            }
        }
    }
}

fn series_count(acc: &Acc) -> u64 {
    acc.fams.values().map(|f| f.2.len() as u64).sum()
}

/// Private copies and CoW pages of a file by the cgroup and the workload of the holding
/// process. Page cache is not attributed (the kernel charges it to whichever cgroup first
/// touched a page).
fn holder_series(acc: &mut Acc, r: &Report, f: &FileModel, id: &str, opts: Options) {
    let proc_of = |pid: i32| r.processes.iter().find(|p| p.pid == pid);
    let mut held: Vec<(i32, &str, &'static str, f64)> = Vec::new();
    for m in &f.mappers {
        if let Some(c) = m.cow_anon_bytes.filter(|c| *c > 0) {
            held.push((m.pid, &m.comm, "cow", c as f64));
        }
    }
    for c in &f.proven_copies {
        // Its physical share: a copy shared after fork sums to one copy over its holders.
        let b = c.physical_bytes();
        if b > 0.0 {
            held.push((c.pid, &c.comm, "private_copy_proven", b));
        }
    }
    for s in &f.suspected_copies {
        if s.attributed_bytes > 0 {
            held.push((
                s.pid,
                &s.comm,
                "private_copy_suspected",
                s.attributed_bytes as f64,
            ));
        }
    }
    for (pid, comm, kind, v) in held {
        let cgroup = proc_of(pid)
            .and_then(|p| p.cgroup.clone())
            .unwrap_or_else(|| "unknown".to_string());
        let mut cl = l(&[("cgroup", &cgroup), ("file_id", id), ("kind", kind)]);
        cl.extend(kube::labels(&cgroup));
        acc.gauge(
            "twofold_cgroup_file_held_bytes",
            "Bytes of a file held privately (proven or suspected copies, CoW pages) by the processes of a cgroup",
            cl,
            v,
        );
        let mut wl = l(&[("workload", comm), ("file_id", id), ("kind", kind)]);
        if opts.per_pid {
            wl.push(("pid".into(), pid.to_string()));
        }
        acc.gauge(
            "twofold_workload_file_held_bytes",
            "Bytes of a file held privately (proven or suspected copies, CoW pages) by the processes of a workload (comm)",
            wl,
            v,
        );
    }
}

fn cgroup_series(acc: &mut Acc, r: &Report) {
    for c in &r.cgroups {
        let mut lab = l(&[("cgroup", &c.path)]);
        lab.extend(kube::labels(&c.path));
        for k in [CgroupField::Usage, CgroupField::Limit, CgroupField::Peak] {
            if let (Some(m), Some(v)) = (k.metric(), k.value(c).number()) {
                acc.gauge(m.name, m.help, lab.clone(), v);
            }
        }
        let oom = CgroupField::OomKills;
        if let (Some(m), Some(k)) = (oom.metric(), oom.value(c).number()) {
            acc.add(m.name, m.help, Kind::Counter, lab, k);
        }
    }
}

/// Every family of one report. Pure.
pub fn families(r: &Report, opts: Options, stats: &SelfStats) -> Exposition {
    let mut acc = Acc::default();
    acc.gauge(
        "twofold_build_info",
        "The twofold that exports these series",
        l(&[("version", env!("CARGO_PKG_VERSION"))]),
        1.0,
    );
    let mut files: Vec<&FileModel> = r.files.iter().collect();
    files.sort_by(|a, b| {
        total_held(b)
            .total_cmp(&total_held(a))
            .then(file_id(a).cmp(&file_id(b)))
    });
    let keep = files.len().min(opts.max_files);
    let (kept, folded) = files.split_at(keep);
    for f in kept {
        let id = file_id(f);
        file_series(&mut acc, f, &id);
        holder_series(&mut acc, r, f, &id, opts);
        gpu::file_series(&mut acc, f, &id, r.gpus.not_available.is_none());
        trace::file_series(&mut acc, r, f, &id);
    }
    // What the folded files would have cost, one by one, less what `other` costs.
    let mut alone = Acc::default();
    for f in folded {
        let id = file_id(f);
        file_series(&mut alone, f, &id);
        holder_series(&mut alone, r, f, &id, opts);
    }
    let mut folded_acc = Acc::default();
    other_series(&mut folded_acc, folded);
    for f in folded {
        holder_series(&mut folded_acc, r, f, OTHER, opts);
    }
    let dropped_series = series_count(&alone).saturating_sub(series_count(&folded_acc));
    other_series(&mut acc, folded);
    for f in folded {
        holder_series(&mut acc, r, f, OTHER, opts);
    }
    cgroup_series(&mut acc, r);
    gpu::series(&mut acc, r, opts);

    selfm::series(&mut acc, stats, dropped_series);
    Exposition {
        families: acc.finish(),
        dropped_series,
    }
}

mod gpu;
pub mod names;
pub mod selfm;
#[cfg(test)]
mod tests;
mod trace;
