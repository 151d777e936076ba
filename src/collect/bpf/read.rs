//! Reading the maps of the loaded objects into a [`TraceSample`]: pinned and LRU maps
//! of the same key are summed (a key may have been counted in the LRU map before it was
//! pinned).

use std::collections::BTreeMap;

use aya::maps::{Array, HashMap as BpfHashMap, MapData, PerCpuArray};
use aya::Ebpf;

use super::layout::{
    self, FaultCache, FileCache, FileFaults, FileKeyC, OomVictim, PidFaults, PidFileIo,
    PidFileKeyC, PidReclaim,
};
use crate::sample::trace::{FileCounters, IoCounters, OomKill, PidCounters, TraceSample};

/// Every entry of a hash map (entries that vanish while iterating are skipped).
fn entries<K: aya::Pod, V: aya::Pod>(ebpf: &Ebpf, name: &str) -> Vec<(K, V)> {
    let Some(map) = ebpf.map(name) else {
        return Vec::new();
    };
    let Ok(h) = BpfHashMap::<&MapData, K, V>::try_from(map) else {
        return Vec::new();
    };
    h.iter().filter_map(Result::ok).collect()
}

fn total(ebpf: &Ebpf, index: u32) -> u64 {
    let Some(map) = ebpf.map("totals") else {
        return 0;
    };
    Array::<&MapData, u64>::try_from(map)
        .and_then(|a| a.get(&index, 0))
        .unwrap_or(0)
}

/// The `fault_cache` entry of every CPU.
fn fault_caches(ebpf: &Ebpf) -> Vec<FaultCache> {
    let Some(map) = ebpf.map("fault_cache") else {
        return Vec::new();
    };
    let Ok(a) = PerCpuArray::<&MapData, FaultCache>::try_from(map) else {
        return Vec::new();
    };
    a.get(&0, 0)
        .map(|v| v.iter().copied().collect())
        .unwrap_or_default()
}

/// The hash entries of one process (pinned plus LRU), looked up now.
fn pid_faults_now(ebpf: &Ebpf, pid: u32) -> PidFaults {
    let mut sum = PidFaults::default();
    for map in ["pid_faults_pinned", "pid_faults"] {
        let Some(m) = ebpf.map(map) else { continue };
        let Ok(h) = BpfHashMap::<&MapData, u32, PidFaults>::try_from(m) else {
            continue;
        };
        if let Ok(v) = h.get(&pid, 0) {
            add_faults(&mut sum, &v);
        }
    }
    sum
}

fn add_faults(a: &mut PidFaults, b: &PidFaults) {
    for (x, y) in a.by_code.iter_mut().zip(b.by_code) {
        *x += y;
    }
    a.filemap_faults += b.filemap_faults;
    a.map_pages_events += b.map_pages_events;
    a.map_pages_pages += b.map_pages_pages;
    a.kernel += b.kernel;
}

/// Faults per process: the hashes plus what each CPU's `fault_cache` holds.
///
/// The BPF side moves a CPU's pending counts into the hash when another process faults
/// there, possibly while this reads the hash. So the caches are read before (`c0`) and
/// after (`c1`) the hash; a process whose pending counts were moved in between (its
/// CPU's `gen` changed) has its hash entry looked up again after `c1`. A process that
/// is idle while it is read is thus counted exactly; one that faults meanwhile is
/// counted as of some moment of the read.
fn pid_faults(ebpf: &Ebpf) -> BTreeMap<u32, PidFaults> {
    let c0 = fault_caches(ebpf);
    let mut out: BTreeMap<u32, PidFaults> = BTreeMap::new();
    for map in ["pid_faults_pinned", "pid_faults"] {
        for (pid, v) in entries::<u32, PidFaults>(ebpf, map) {
            add_faults(out.entry(pid).or_default(), &v);
        }
    }
    let c1 = fault_caches(ebpf);
    for (before, after) in c0.iter().zip(&c1) {
        if before.pid != 0 && before.gen != after.gen {
            out.insert(before.pid, pid_faults_now(ebpf, before.pid));
        }
    }
    for c in c1.iter().filter(|c| c.pid != 0) {
        let e = out.entry(c.pid).or_default();
        for (x, y) in e.by_code.iter_mut().zip(c.by_code) {
            *x += y;
        }
        e.kernel += c.kernel;
    }
    out
}

fn add_pid_faults(c: &mut PidCounters, v: &PidFaults) {
    for (a, b) in c.faults_by_code.iter_mut().zip(v.by_code) {
        *a += b;
    }
    c.file_faults += v.filemap_faults;
    c.fault_around_events += v.map_pages_events;
    c.fault_around_pages += v.map_pages_pages;
    c.kernel_faults += v.kernel;
}

fn add_pid_reclaim(c: &mut PidCounters, v: &PidReclaim) {
    c.direct_reclaims += v.direct_count;
    c.memcg_reclaims += v.memcg_count;
    c.reclaim_ns += v.total_ns;
    c.reclaim_max_ns = c.reclaim_max_ns.max(v.max_ns);
    c.reclaimed_pages += v.reclaimed_pages;
    for (a, b) in c.reclaim_hist_us_log2.iter_mut().zip(v.hist) {
        *a += b;
    }
}

fn add_io(c: &mut IoCounters, v: &PidFileIo) {
    c.read_bytes += v.read_bytes;
    c.read_calls += v.read_calls;
    c.mmap_shared += v.mmap_shared;
    c.mmap_shared_write += v.mmap_shared_write;
    c.mmap_private += v.mmap_private;
    c.mmap_private_write += v.mmap_private_write;
    c.mmap_bytes += v.mmap_bytes;
    if c.comm.is_empty() {
        c.comm = comm(&v.comm);
    }
}

fn comm(raw: &[u8; 16]) -> String {
    let end = raw.iter().position(|b| *b == 0).unwrap_or(raw.len());
    String::from_utf8_lossy(&raw[..end]).into_owned()
}

fn oom_kill(v: &OomVictim) -> OomKill {
    OomKill {
        pid: v.pid as i32,
        comm: comm(&v.comm),
        uid: v.uid,
        killer_pid: v.killer_pid as i32,
        total_vm_bytes: v.total_vm_kb * 1024,
        anon_rss_bytes: v.anon_rss_kb * 1024,
        file_rss_bytes: v.file_rss_kb * 1024,
        shmem_rss_bytes: v.shmem_rss_kb * 1024,
        // Boot-time nanoseconds; made relative by the caller if needed.
        at_secs: v.ts_ns as f64 / 1e9,
    }
}

/// Reads the maps of each `(family name, object)`.
pub fn sample<'a>(loaded: impl Iterator<Item = (&'static str, &'a Ebpf)>) -> TraceSample {
    let mut s = TraceSample::default();
    let mut pids: BTreeMap<i32, PidCounters> = BTreeMap::new();
    let mut files: BTreeMap<_, FileCounters> = BTreeMap::new();
    for (name, ebpf) in loaded {
        s.lost_updates += total(ebpf, layout::TOTAL_MAP_FULL);
        if name == "pagecache" {
            s.added_pages_all = total(ebpf, layout::TOTAL_ADDED_PAGES);
            s.evicted_pages_all = total(ebpf, layout::TOTAL_EVICTED_PAGES);
        }
        match name {
            "faults" => {
                for (pid, c) in pid_faults(ebpf) {
                    add_pid_faults(pids.entry(pid as i32).or_default(), &c);
                }
                for map in ["file_faults_pinned", "file_faults"] {
                    for (k, v) in entries::<FileKeyC, FileFaults>(ebpf, map) {
                        let c = files.entry(k.key()).or_default();
                        c.file_faults += v.filemap_faults;
                        c.fault_around_events += v.map_pages_events;
                        c.fault_around_pages += v.map_pages_pages;
                    }
                }
            }
            "pagecache" => {
                for map in ["file_cache_pinned", "file_cache"] {
                    for (k, v) in entries::<FileKeyC, FileCache>(ebpf, map) {
                        let c = files.entry(k.key()).or_default();
                        c.added_pages += v.added_pages;
                        c.evicted_pages += v.evicted_pages;
                        c.refault_pages += v.refault_pages;
                        c.add_events += v.add_events;
                        c.evict_events += v.evict_events;
                    }
                }
            }
            "reclaim" => {
                for map in ["pid_reclaim_pinned", "pid_reclaim"] {
                    for (pid, v) in entries::<u32, PidReclaim>(ebpf, map) {
                        add_pid_reclaim(pids.entry(pid as i32).or_default(), &v);
                    }
                }
                let mut kills: Vec<OomKill> = entries::<u32, OomVictim>(ebpf, "oom_victims")
                    .iter()
                    .map(|(_, v)| oom_kill(v))
                    .collect();
                kills.sort_by(|a, b| a.at_secs.total_cmp(&b.at_secs));
                s.oom_kills = kills;
            }
            "syscalls" => {
                for map in ["io_pinned", "io"] {
                    for (k, v) in entries::<PidFileKeyC, PidFileIo>(ebpf, map) {
                        add_io(s.io.entry(k.key()).or_default(), &v);
                    }
                }
            }
            _ => {}
        }
    }
    // Pinned entries that never saw an event stay out of the sample.
    pids.retain(|_, c| *c != PidCounters::default());
    files.retain(|_, c| *c != FileCounters::default());
    s.pids = pids;
    s.files = files;
    s
}
