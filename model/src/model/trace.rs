//! Rates from eBPF counters: pure functions from the current [`TraceSample`], the
//! previous one (if any) and the names the collectors resolved, to a [`TraceModel`].
//! No I/O here.
//!
//! Every rate is a difference of cumulative counters divided by the seconds between the
//! two samples (or since attach, without a previous sample). A counter that went down
//! (its LRU entry was evicted and started again) counts from zero. A counter whose
//! tracepoint is unavailable is `None` (`null` in JSON, `n/a` for people), never 0.
//! Pages are the system's pages ([`TraceContext::page_bytes`], 4 KiB on x86-64); a large
//! folio counts `1 << order` pages. See `docs/trace.md`.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use crate::sample::trace::{Counter, FileCounters, IoCounters, OomKill, PidCounters, TraceSample};
use crate::sample::FileKey;

/// What the collectors know beside the counters: paths, comms and what was asked for.
#[derive(Debug, Clone)]
pub struct TraceContext {
    /// Paths of files, by (dev, inode).
    pub paths: BTreeMap<FileKey, String>,
    /// Files of interest (always listed, even when idle).
    pub interest: BTreeSet<FileKey>,
    /// Sizes of files, when known (for findings).
    pub sizes: BTreeMap<FileKey, u64>,
    /// Comms of processes, by pid.
    pub comms: BTreeMap<i32, String>,
    /// Only these processes (all when empty).
    pub pids: Vec<i32>,
    /// Only these files (all when empty).
    pub files: Vec<FileKey>,
    /// At most this many rows of other (not of interest) files and processes.
    pub top: usize,
    /// Bytes of a page the counters count (the system's page size).
    pub page_bytes: u64,
}

impl Default for TraceContext {
    fn default() -> Self {
        TraceContext {
            paths: BTreeMap::new(),
            interest: BTreeSet::new(),
            sizes: BTreeMap::new(),
            comms: BTreeMap::new(),
            pids: Vec::new(),
            files: Vec::new(),
            top: 0,
            page_bytes: crate::sample::PAGE_BYTES,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TraceModel {
    /// Seconds since the programs were attached.
    pub at_secs: f64,
    /// Seconds the rates are computed over.
    pub interval_secs: f64,
    pub files: Vec<FileTrace>,
    pub processes: Vec<ProcessTrace>,
    /// OOM kills seen in this interval.
    pub oom_kills: Vec<OomKill>,
    /// Counters that are unknown, with the reason.
    pub unavailable: BTreeMap<Counter, String>,
    /// Updates lost to full maps since attach (0 unless something is badly wrong).
    pub lost_updates: u64,
    /// Page-cache pages added and evicted per second, all files together.
    pub cache_added_pages_per_sec: Option<f64>,
    pub cache_evicted_pages_per_sec: Option<f64>,
    /// Page-cache pages added and evicted since attach, all files together.
    #[serde(default)]
    pub cache_added_pages: Option<u64>,
    #[serde(default)]
    pub cache_evicted_pages: Option<u64>,
    /// Model-file bytes uploaded to GPUs, per file and process (upload tracing).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub uploads: Vec<uploads::FileUploadTrace>,
    /// Host-to-device copies per process, model bytes or not.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub upload_processes: Vec<uploads::ProcessUploadTrace>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FileTrace {
    pub path: Option<String>,
    /// The file's identity (`device` and `inode` are the same, for people).
    #[serde(default)]
    pub key: FileKey,
    pub device: String,
    pub inode: u64,
    pub of_interest: bool,
    /// `filemap:mm_filemap_fault` per second.
    pub file_faults_per_sec: Option<f64>,
    /// Pages offered to fault-around (`mm_filemap_map_pages`) per second.
    pub fault_around_pages_per_sec: Option<f64>,
    pub added_pages_per_sec: Option<f64>,
    pub evicted_pages_per_sec: Option<f64>,
    pub refault_pages_per_sec: Option<f64>,
    /// Bytes read from it by read(), pread64(), readv() and preadv(), per second.
    pub read_bytes_per_sec: Option<f64>,
    /// Counts in this interval.
    pub delta: FileTotals,
    /// Counts since attach.
    pub total: FileTotals,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct FileTotals {
    pub file_faults: Option<u64>,
    pub fault_around_pages: Option<u64>,
    pub added_pages: Option<u64>,
    pub evicted_pages: Option<u64>,
    pub refault_pages: Option<u64>,
    pub read_bytes: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProcessTrace {
    pub pid: i32,
    pub comm: Option<String>,
    /// All user-mode page faults per second.
    pub faults_per_sec: Option<f64>,
    /// Write faults (not-present and protection) per second.
    pub write_faults_per_sec: Option<f64>,
    pub file_faults_per_sec: Option<f64>,
    pub read_bytes_per_sec: Option<f64>,
    /// Milliseconds spent in direct reclaim (global and memory cgroup) per second.
    pub reclaim_ms_per_sec: Option<f64>,
    pub delta: ProcessTotals,
    pub total: ProcessTotals,
    /// Files it read or mapped since attach.
    pub files: Vec<ProcessFile>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct FaultsByCode {
    pub read_not_present: u64,
    pub read_protection: u64,
    pub write_not_present: u64,
    pub write_protection: u64,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ProcessTotals {
    /// Page faults, user mode and kernel mode at user addresses.
    pub faults: Option<u64>,
    /// The part of `faults` taken in kernel mode (read() into untouched memory...).
    pub kernel_faults: Option<u64>,
    pub faults_by_code: Option<FaultsByCode>,
    pub file_faults: Option<u64>,
    pub fault_around_pages: Option<u64>,
    pub read_bytes: Option<u64>,
    pub direct_reclaims: Option<u64>,
    pub memcg_reclaims: Option<u64>,
    pub reclaim_ns: Option<u64>,
    pub reclaim_max_ns: Option<u64>,
    pub reclaimed_pages: Option<u64>,
    /// Reclaims by latency: entry k counts `[2^k, 2^(k+1))` µs.
    pub reclaim_hist_us_log2: Option<Vec<u64>>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProcessFile {
    pub path: Option<String>,
    #[serde(default)]
    pub key: FileKey,
    pub device: String,
    pub inode: u64,
    pub read_bytes: u64,
    pub read_calls: u64,
    pub mmap_shared: u64,
    pub mmap_shared_write: u64,
    pub mmap_private: u64,
    pub mmap_private_write: u64,
    pub mmap_bytes: u64,
}

/// `cur - prev`, or `cur` if the counter started again.
fn delta(cur: u64, prev: u64) -> u64 {
    if cur >= prev {
        cur - prev
    } else {
        cur
    }
}

fn avail(s: &TraceSample, counters: &[Counter], v: u64) -> Option<u64> {
    counters
        .iter()
        .all(|c| !s.unavailable.contains_key(c))
        .then_some(v)
}

fn rate(v: Option<u64>, secs: f64) -> Option<f64> {
    v.map(|v| if secs > 0.0 { v as f64 / secs } else { 0.0 })
}

fn device(k: FileKey) -> String {
    format!("{}:{}", k.major, k.minor)
}

/// Bytes read per file, summed over processes (those that exited and were folded too).
fn reads_by_file(s: &TraceSample) -> BTreeMap<FileKey, u64> {
    let mut out: BTreeMap<FileKey, u64> = s.exited_read_bytes.clone();
    for ((_, k), v) in &s.io {
        let e = out.entry(*k).or_default();
        *e = e.saturating_add(v.read_bytes);
    }
    out
}

fn reads_by_pid(s: &TraceSample) -> BTreeMap<i32, u64> {
    let mut out: BTreeMap<i32, u64> = BTreeMap::new();
    for ((pid, _), v) in &s.io {
        let e = out.entry(*pid).or_default();
        *e = e.saturating_add(v.read_bytes);
    }
    out
}

fn file_totals(s: &TraceSample, c: &FileCounters, read: u64) -> FileTotals {
    use Counter as C;
    FileTotals {
        file_faults: avail(s, &[C::FileFaults], c.file_faults),
        fault_around_pages: avail(s, &[C::FaultAround], c.fault_around_pages),
        added_pages: avail(s, &[C::PageCacheAdds], c.added_pages),
        evicted_pages: avail(s, &[C::PageCacheEvictions], c.evicted_pages),
        refault_pages: avail(
            s,
            &[C::PageCacheAdds, C::PageCacheEvictions],
            c.refault_pages,
        ),
        read_bytes: avail(s, &[C::Reads], read),
    }
}

fn file_delta(cur: &FileTotals, prev: &FileTotals) -> FileTotals {
    let d = |a: Option<u64>, b: Option<u64>| a.map(|a| delta(a, b.unwrap_or(0)));
    FileTotals {
        file_faults: d(cur.file_faults, prev.file_faults),
        fault_around_pages: d(cur.fault_around_pages, prev.fault_around_pages),
        added_pages: d(cur.added_pages, prev.added_pages),
        evicted_pages: d(cur.evicted_pages, prev.evicted_pages),
        refault_pages: d(cur.refault_pages, prev.refault_pages),
        read_bytes: d(cur.read_bytes, prev.read_bytes),
    }
}

fn process_totals(s: &TraceSample, c: &PidCounters, read: u64) -> ProcessTotals {
    use Counter as C;
    let [rn, rp, wn, wp] = c.faults_by_code;
    let reclaim = [C::DirectReclaim, C::MemcgReclaim];
    ProcessTotals {
        faults: avail(s, &[C::PageFaults], c.faults()),
        kernel_faults: avail(s, &[C::PageFaults], c.kernel_faults),
        faults_by_code: avail(s, &[C::PageFaults], 0).map(|_| FaultsByCode {
            read_not_present: rn,
            read_protection: rp,
            write_not_present: wn,
            write_protection: wp,
        }),
        file_faults: avail(s, &[C::FileFaults], c.file_faults),
        fault_around_pages: avail(s, &[C::FaultAround], c.fault_around_pages),
        read_bytes: avail(s, &[C::Reads], read),
        direct_reclaims: avail(s, &[C::DirectReclaim], c.direct_reclaims),
        memcg_reclaims: avail(s, &[C::MemcgReclaim], c.memcg_reclaims),
        reclaim_ns: avail(s, &reclaim, c.reclaim_ns),
        reclaim_max_ns: avail(s, &reclaim, c.reclaim_max_ns),
        reclaimed_pages: avail(s, &reclaim, c.reclaimed_pages),
        reclaim_hist_us_log2: avail(s, &reclaim, 0).map(|_| c.reclaim_hist_us_log2.to_vec()),
    }
}

fn process_delta(cur: &ProcessTotals, prev: &ProcessTotals) -> ProcessTotals {
    let d = |a: Option<u64>, b: Option<u64>| a.map(|a| delta(a, b.unwrap_or(0)));
    let by_code = match (&cur.faults_by_code, &prev.faults_by_code) {
        (Some(c), p) => {
            let p = p.clone().unwrap_or_default();
            Some(FaultsByCode {
                read_not_present: delta(c.read_not_present, p.read_not_present),
                read_protection: delta(c.read_protection, p.read_protection),
                write_not_present: delta(c.write_not_present, p.write_not_present),
                write_protection: delta(c.write_protection, p.write_protection),
            })
        }
        (None, _) => None,
    };
    let hist = cur.reclaim_hist_us_log2.as_ref().map(|c| {
        let p = prev.reclaim_hist_us_log2.clone().unwrap_or_default();
        c.iter()
            .enumerate()
            .map(|(i, v)| delta(*v, p.get(i).copied().unwrap_or(0)))
            .collect()
    });
    ProcessTotals {
        faults: d(cur.faults, prev.faults),
        kernel_faults: d(cur.kernel_faults, prev.kernel_faults),
        faults_by_code: by_code,
        file_faults: d(cur.file_faults, prev.file_faults),
        fault_around_pages: d(cur.fault_around_pages, prev.fault_around_pages),
        read_bytes: d(cur.read_bytes, prev.read_bytes),
        direct_reclaims: d(cur.direct_reclaims, prev.direct_reclaims),
        memcg_reclaims: d(cur.memcg_reclaims, prev.memcg_reclaims),
        reclaim_ns: d(cur.reclaim_ns, prev.reclaim_ns),
        // A maximum over the session, not a difference.
        reclaim_max_ns: cur.reclaim_max_ns,
        reclaimed_pages: d(cur.reclaimed_pages, prev.reclaimed_pages),
        reclaim_hist_us_log2: hist,
    }
}

/// Activity of a delta, to rank rows: events, and bytes read in pages.
fn file_activity(d: &FileTotals, page: u64) -> u64 {
    [
        d.file_faults.unwrap_or(0),
        d.added_pages.unwrap_or(0),
        d.evicted_pages.unwrap_or(0),
        d.refault_pages.unwrap_or(0),
        d.read_bytes.unwrap_or(0) / page.max(1),
    ]
    .into_iter()
    .fold(0, u64::saturating_add)
}

fn process_activity(d: &ProcessTotals, page: u64) -> u64 {
    [
        d.faults.unwrap_or(0),
        d.read_bytes.unwrap_or(0) / page.max(1),
        d.reclaim_ns.unwrap_or(0) / 1000,
        d.direct_reclaims.unwrap_or(0),
        d.memcg_reclaims.unwrap_or(0),
    ]
    .into_iter()
    .fold(0, u64::saturating_add)
}

fn process_files(s: &TraceSample, ctx: &TraceContext, pid: i32) -> Vec<ProcessFile> {
    let mut out: Vec<ProcessFile> =
        s.io.range((pid, FileKey::from_dev(0, 0))..)
            .take_while(|((p, _), _)| *p == pid)
            .map(|((_, k), v)| process_file(ctx, *k, v))
            .collect();
    out.sort_by(|a, b| b.read_bytes.cmp(&a.read_bytes).then(a.inode.cmp(&b.inode)));
    out
}

fn process_file(ctx: &TraceContext, k: FileKey, v: &IoCounters) -> ProcessFile {
    ProcessFile {
        path: ctx.paths.get(&k).cloned(),
        key: k,
        device: device(k),
        inode: k.inode,
        read_bytes: v.read_bytes,
        read_calls: v.read_calls,
        mmap_shared: v.mmap_shared,
        mmap_shared_write: v.mmap_shared_write,
        mmap_private: v.mmap_private,
        mmap_private_write: v.mmap_private_write,
        mmap_bytes: v.mmap_bytes,
    }
}

impl TraceModel {
    /// The model of `cur`, with rates over the time since `prev` (or since attach).
    pub fn new(cur: &TraceSample, prev: Option<&TraceSample>, ctx: &TraceContext) -> Self {
        let empty = TraceSample::default();
        let p = prev.unwrap_or(&empty);
        let secs = (cur.at_secs - prev.map_or(0.0, |p| p.at_secs)).max(0.0);
        TraceModel {
            at_secs: cur.at_secs,
            interval_secs: secs,
            files: files(cur, p, ctx, secs),
            processes: processes(cur, p, ctx, secs),
            oom_kills: cur
                .oom_kills
                .iter()
                .filter(|k| !p.oom_kills.contains(k))
                .cloned()
                .collect(),
            unavailable: cur.unavailable.clone(),
            lost_updates: cur.lost_updates,
            cache_added_pages_per_sec: rate(
                avail(
                    cur,
                    &[Counter::PageCacheAdds],
                    delta(cur.added_pages_all, p.added_pages_all),
                ),
                secs,
            ),
            cache_evicted_pages_per_sec: rate(
                avail(
                    cur,
                    &[Counter::PageCacheEvictions],
                    delta(cur.evicted_pages_all, p.evicted_pages_all),
                ),
                secs,
            ),
            cache_added_pages: avail(cur, &[Counter::PageCacheAdds], cur.added_pages_all),
            cache_evicted_pages: avail(cur, &[Counter::PageCacheEvictions], cur.evicted_pages_all),
            uploads: uploads::file_uploads(cur, prev, ctx, secs),
            upload_processes: uploads::process_uploads(cur, prev, ctx, secs),
        }
    }
}

/// The files that get a row, ranked and cut as the model shows them: (key, totals, delta).
fn ranked_files(
    cur: &TraceSample,
    p: &TraceSample,
    ctx: &TraceContext,
) -> Vec<(FileKey, FileTotals, FileTotals)> {
    let (rc, rp) = (reads_by_file(cur), reads_by_file(p));
    let mut keys: BTreeSet<FileKey> = cur.files.keys().copied().collect();
    keys.extend(rc.keys().copied());
    keys.extend(ctx.interest.iter().copied());
    if !ctx.files.is_empty() {
        keys.retain(|k| ctx.files.contains(k));
    }
    let zero = FileCounters::default();
    let mut rows: Vec<(FileKey, FileTotals, FileTotals)> = keys
        .into_iter()
        .map(|k| {
            let read = |m: &BTreeMap<FileKey, u64>| m.get(&k).copied().unwrap_or(0);
            let total = file_totals(cur, cur.files.get(&k).unwrap_or(&zero), read(&rc));
            let before = file_totals(p, p.files.get(&k).unwrap_or(&zero), read(&rp));
            let d = file_delta(&total, &before);
            (k, total, d)
        })
        .collect();
    let interest = |k: &FileKey| ctx.interest.contains(k);
    rows.sort_by(|a, b| {
        interest(&b.0)
            .cmp(&interest(&a.0))
            .then(file_activity(&b.2, ctx.page_bytes).cmp(&file_activity(&a.2, ctx.page_bytes)))
            .then(a.0.inode.cmp(&b.0.inode))
    });
    let mut others = 0;
    rows.retain(|r| {
        if interest(&r.0) || !ctx.files.is_empty() {
            return true;
        }
        others += 1;
        file_activity(&r.2, ctx.page_bytes) > 0 && others <= ctx.top
    });
    rows
}

fn files(cur: &TraceSample, p: &TraceSample, ctx: &TraceContext, secs: f64) -> Vec<FileTrace> {
    ranked_files(cur, p, ctx)
        .into_iter()
        .map(|(k, total, d)| FileTrace {
            path: ctx.paths.get(&k).cloned(),
            key: k,
            device: device(k),
            inode: k.inode,
            of_interest: ctx.interest.contains(&k),
            file_faults_per_sec: rate(d.file_faults, secs),
            fault_around_pages_per_sec: rate(d.fault_around_pages, secs),
            added_pages_per_sec: rate(d.added_pages, secs),
            evicted_pages_per_sec: rate(d.evicted_pages, secs),
            refault_pages_per_sec: rate(d.refault_pages, secs),
            read_bytes_per_sec: rate(d.read_bytes, secs),
            delta: d,
            total,
        })
        .collect()
}

/// The processes that get a row, ranked and cut as the model shows them: (pid, totals,
/// delta).
fn ranked_processes(
    cur: &TraceSample,
    p: &TraceSample,
    ctx: &TraceContext,
) -> Vec<(i32, ProcessTotals, ProcessTotals)> {
    let (rc, rp) = (reads_by_pid(cur), reads_by_pid(p));
    let mut pids: BTreeSet<i32> = cur.pids.keys().copied().collect();
    pids.extend(rc.keys().copied());
    pids.extend(ctx.pids.iter().copied());
    if !ctx.pids.is_empty() {
        pids.retain(|pid| ctx.pids.contains(pid));
    }
    // Readers and mappers of files of interest are always listed.
    let keep: BTreeSet<i32> = cur
        .io
        .keys()
        .filter(|(_, k)| ctx.interest.contains(k))
        .map(|(pid, _)| *pid)
        .collect();
    let zero = PidCounters::default();
    let mut rows: Vec<(i32, ProcessTotals, ProcessTotals)> = pids
        .into_iter()
        .map(|pid| {
            let read = |m: &BTreeMap<i32, u64>| m.get(&pid).copied().unwrap_or(0);
            let total = process_totals(cur, cur.pids.get(&pid).unwrap_or(&zero), read(&rc));
            let before = process_totals(p, p.pids.get(&pid).unwrap_or(&zero), read(&rp));
            let d = process_delta(&total, &before);
            (pid, total, d)
        })
        .collect();
    rows.sort_by(|a, b| {
        process_activity(&b.2, ctx.page_bytes)
            .cmp(&process_activity(&a.2, ctx.page_bytes))
            .then(a.0.cmp(&b.0))
    });
    if ctx.pids.is_empty() {
        let mut others = 0;
        rows.retain(|r| {
            if keep.contains(&r.0) {
                return true;
            }
            others += 1;
            process_activity(&r.2, ctx.page_bytes) > 0 && others <= ctx.top
        });
    }
    rows
}

fn processes(
    cur: &TraceSample,
    p: &TraceSample,
    ctx: &TraceContext,
    secs: f64,
) -> Vec<ProcessTrace> {
    ranked_processes(cur, p, ctx)
        .into_iter()
        .map(|(pid, total, d)| {
            let writes = d
                .faults_by_code
                .as_ref()
                .map(|c| c.write_not_present.saturating_add(c.write_protection));
            let comm = ctx.comms.get(&pid).cloned().or_else(|| {
                cur.io
                    .range((pid, FileKey::from_dev(0, 0))..)
                    .take_while(|((p, _), _)| *p == pid)
                    .map(|(_, v)| v.comm.clone())
                    .find(|c| !c.is_empty())
            });
            ProcessTrace {
                pid,
                comm,
                faults_per_sec: rate(d.faults, secs),
                write_faults_per_sec: rate(writes, secs),
                file_faults_per_sec: rate(d.file_faults, secs),
                read_bytes_per_sec: rate(d.read_bytes, secs),
                reclaim_ms_per_sec: rate(d.reclaim_ns, secs).map(|ns| ns / 1e6),
                files: process_files(cur, ctx, pid),
                delta: d,
                total,
            }
        })
        .collect()
}

/// What a collector must name for the rows a trace model of `cur` can show, over the
/// window since `prev` and since the attach: their files (of the file rows and of the
/// process rows) and their processes. Ranks and cuts as [`TraceModel::new`] does, without
/// building rows.
pub fn shown(
    cur: &TraceSample,
    prev: Option<&TraceSample>,
    ctx: &TraceContext,
) -> (BTreeSet<FileKey>, BTreeSet<i32>) {
    let empty = TraceSample::default();
    let mut keys = BTreeSet::new();
    let mut pids = BTreeSet::new();
    for p in [prev.unwrap_or(&empty), &empty] {
        keys.extend(ranked_files(cur, p, ctx).into_iter().map(|r| r.0));
        for (pid, _, _) in ranked_processes(cur, p, ctx) {
            keys.extend(
                cur.io
                    .range((pid, FileKey::from_dev(0, 0))..)
                    .take_while(|((q, _), _)| *q == pid)
                    .map(|((_, k), _)| *k),
            );
            pids.insert(pid);
        }
    }
    (keys, pids)
}

pub mod findings;
#[cfg(test)]
mod tests;
pub mod uploads;
