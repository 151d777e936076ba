//! Building the report: [`build`] (one snapshot in, one report out) and its parts.

use std::collections::BTreeMap;

use super::*;
use crate::sample::snapshot::Snapshot;
use crate::sample::trace::TraceSample;
use crate::sample::Sample;

/// The report of a snapshot: one snapshot in, one report out, the one entry every view
/// uses (scan, top, serve, record, replay, dump, campaigns). With the snapshot before it,
/// the report carries rates over the interval between the two, and the trace model's
/// rates when both come from one attachment of the tracer. Pure: the same snapshots always
/// give the same report.
pub fn build(snap: &Snapshot, prev: Option<&Snapshot>) -> Report {
    let trace = snap.trace.as_ref().map(|cur| TraceInput {
        cur,
        prev: prev
            .and_then(|p| p.trace.as_ref())
            .filter(|p| crate::sample::trace::same_attachment(p, cur)),
    });
    let mut r = build_with(&snap.sample, trace);
    r.at_unix_ns = Some(snap.at_unix_ns);
    if let Some(p) = prev {
        use std::time::Duration;
        let secs = Duration::from_nanos(snap.at_mono_ns.saturating_sub(p.at_mono_ns)).as_secs_f64();
        // A previous snapshot from another boot (monotonic clock went back): wall clock.
        let secs = if secs > 0.0 {
            secs
        } else {
            Duration::from_nanos(snap.at_unix_ns.saturating_sub(p.at_unix_ns)).as_secs_f64()
        };
        r.rates = rates::between(&p.sample, &snap.sample, secs);
    }
    r
}

/// The report of a bare sample (no timestamps, no counters, no snapshot before it): what
/// [`build`] gives for a snapshot holding only `sample`, less `at_unix_ns`.
pub fn from_sample(sample: &Sample) -> Report {
    build_with(sample, None)
}

/// At most this many rows of other files and processes (not of interest) in a report's
/// trace section.
pub const TRACE_TOP: usize = 10;

/// The eBPF counters of a snapshot, and those of the snapshot before it when both come
/// from one attachment (rates are then over the interval between them, else since attach).
#[derive(Debug, Clone, Copy)]
struct TraceInput<'a> {
    cur: &'a TraceSample,
    prev: Option<&'a TraceSample>,
}

/// The context of a report's trace model: the report's files are the files of interest;
/// paths come from the sample and from the names resolved when the counters were read.
pub fn trace_context(sample: &Sample, files: &[FileModel], t: &TraceSample) -> trace::TraceContext {
    let mut paths: BTreeMap<FileKey, String> = sample
        .files
        .iter()
        .map(|f| (f.key, f.path.clone()))
        .collect();
    for (k, p) in &t.names.paths {
        paths.entry(*k).or_insert_with(|| p.clone());
    }
    trace::TraceContext {
        paths,
        interest: files.iter().map(|f| f.key).collect(),
        sizes: files
            .iter()
            .filter_map(|f| Some((f.key, f.size_bytes?)))
            .collect(),
        comms: t.names.comms.clone(),
        pids: t.pinned_pids.clone(),
        files: Vec::new(),
        top: TRACE_TOP,
        page_bytes: sample.system.page_bytes(),
    }
}

/// Builds the report of a sample and, when traced, of its eBPF counters: findings of both
/// are computed here, once. Pure.
fn build_with(sample: &Sample, trace: Option<TraceInput>) -> Report {
    let page = sample.system.page_size.max(1);
    // The processes that map or hold each file, in the sample's order: found once, not by
    // going through every process's mappings for each file.
    let refs = crate::sample::referrers(&sample.processes);
    let mut files: Vec<FileModel> = sample
        .files
        .iter()
        .map(|f| {
            let refer = || {
                let at = refs.get(&f.key).map_or(&[][..], Vec::as_slice);
                at.iter().map(|&i| &sample.processes[i])
            };
            let resident = f.residency.as_ref().map(|r| r.cached_bytes);
            FileModel {
                path: f.path.clone(),
                path_bytes: f.path_bytes.clone(),
                key: f.key,
                device: format!("{}:{}", f.key.major, f.key.minor),
                inode: f.key.inode,
                size_bytes: f.size_bytes,
                resident_bytes: resident,
                // In pages: the last, partial page of a file is cached whole.
                resident_fraction: resident
                    .zip(f.size_bytes)
                    .map(|(r, s)| page_cache_fraction(r, s, page)),
                dirty_bytes: f.residency.as_ref().and_then(|r| r.dirty_bytes),
                evicted_bytes: f.residency.as_ref().and_then(|r| r.evicted_bytes),
                recently_evicted_bytes: f.residency.as_ref().and_then(|r| r.recently_evicted_bytes),
                residency_source: f
                    .residency
                    .as_ref()
                    .map(|r| format!("{:?}", r.source).to_lowercase()),
                residency_unknown_reason: f.residency_error.clone(),
                mappers: refer()
                    .filter_map(|p| mapper(p, f.key, f.size_bytes, page))
                    .collect(),
                holders: holders(refer(), f.key),
                proven_copies: Vec::new(),
                suspected_copies: Vec::new(),
                unexplained: Vec::new(),
                device_copies: Vec::new(),
                uploads: Vec::new(),
                uploads_retired: Vec::new(),
                in_place: Vec::new(),
                candidates: CandidateCounts::default(),
                store: f.store,
                deleted: f.deleted,
                now_at_path: f.now_at_path,
                seen_as: f.seen_as.clone(),
                shmem_copy_of: None,
                shmem_places: Vec::new(),
                same_bytes: f
                    .same_bytes
                    .iter()
                    .filter_map(|k| sample.files.iter().find(|o| o.key == *k))
                    .map(|o| super::CopyOf {
                        key: o.key,
                        path: o.path.clone(),
                    })
                    .collect(),
                representations: Representations::default(),
            }
        })
        .collect();
    // The read() ledger: from the counters when traced, else as the sample holds it
    // (recordings of format 1).
    let reads: BTreeMap<(i32, FileKey), u64> = match trace {
        Some(t) => t.cur.io.iter().map(|(k, v)| (*k, v.read_bytes)).collect(),
        None => sample
            .reads
            .iter()
            .map(|r| ((r.pid, r.file), r.read_bytes))
            .collect(),
    };
    copies::attribute(sample, &reads, &mut files);
    super::unexplained::attribute(sample, &mut files);
    copies::shmem_copies(sample, &mut files);
    copies::fold_shmem_copies(&mut files);
    for f in &mut files {
        f.representations = copies::representations(f);
    }
    device::attribute(sample, &reads, &mut files);
    for f in &mut files {
        let r = &mut f.representations;
        if let (Some(p), Some(d)) = (r.proven, r.device) {
            r.proven = Some(copies::round_count(p + d));
        }
    }
    // A store file nothing holds and no process holds a copy of is not news.
    files.retain(|f| {
        !f.store
            || !f.mappers.is_empty()
            || !f.holders.is_empty()
            || !f.proven_copies.is_empty()
            || !f.suspected_copies.is_empty()
            || !f.unexplained.is_empty()
            || !f.device_copies.is_empty()
    });
    files.sort_by(|a, b| {
        let ta = a.representations.proven.unwrap_or(0.0);
        let tb = b.representations.proven.unwrap_or(0.0);
        tb.total_cmp(&ta)
            .then(b.size_bytes.cmp(&a.size_bytes))
            .then(a.path.cmp(&b.path))
    });

    let mut holds: BTreeMap<i32, usize> = BTreeMap::new();
    for f in &files {
        let mut pids: Vec<i32> = f.mappers.iter().map(|m| m.pid).collect();
        pids.extend(f.holders.iter().map(|h| h.pid));
        pids.extend(f.proven_copies.iter().map(|c| c.pid));
        pids.sort_unstable();
        pids.dedup();
        for pid in pids {
            *holds.entry(pid).or_default() += 1;
        }
    }
    let mut processes: Vec<ProcessModel> = sample
        .processes
        .iter()
        .map(|p| {
            let held = holds.get(&p.pid).copied().unwrap_or(0);
            process_model(p, held, device::process_uses(sample, p.pid))
        })
        .collect();
    processes.sort_by(|a, b| {
        b.holds_files
            .unwrap_or(0)
            .min(1)
            .cmp(&a.holds_files.unwrap_or(0).min(1))
            .then(b.rss_bytes.unwrap_or(0).cmp(&a.rss_bytes.unwrap_or(0)))
            .then(a.pid.cmp(&b.pid))
    });
    let cgroups: Vec<CgroupModel> = sample.cgroups.iter().map(cgroup::build).collect();
    let system = system_model(sample);
    let mut findings = findings::evaluate(&files, &cgroups, sample.privilege);
    let trace = trace.map(|t| {
        let ctx = trace_context(sample, &files, t.cur);
        let m = trace::TraceModel::new(t.cur, t.prev, &ctx);
        findings.extend(trace::findings::evaluate(&m, &ctx));
        findings.sort_by_key(|f| f.severity);
        m
    });
    Report {
        schema_version: SCHEMA_VERSION,
        system,
        processes,
        files,
        cgroups,
        findings,
        skipped: sample.skipped.clone(),
        gpus: device::gpus(sample),
        trace,
        at_unix_ns: None,
        rates: None,
        observers: sample.observers.clone(),
        host_files: sample.host_files.clone(),
        privilege: sample.privilege,
    }
}

fn system_model(sample: &Sample) -> SystemModel {
    let mi = &sample.system.meminfo;
    let vm = &sample.system.vmstat;
    SystemModel {
        page_size_bytes: sample.system.page_size,
        mem_total_bytes: mi.get("MemTotal").copied(),
        mem_available_bytes: mi.get("MemAvailable").copied(),
        page_cache_bytes: mi.get("Cached").copied(),
        anon_bytes: mi.get("AnonPages").copied(),
        mapped_bytes: mi.get("Mapped").copied(),
        shmem_bytes: mi.get("Shmem").copied(),
        dirty_bytes: mi.get("Dirty").copied(),
        refaults_file: vm
            .get("workingset_refault_file")
            .or_else(|| vm.get("workingset_refault"))
            .copied(),
        major_faults: vm.get("pgmajfault").copied(),
        pressure: sample.system.pressure,
    }
}
