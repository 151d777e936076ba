//! Candidate copy holders: processes whose private (or shared) memory could hold a copy
//! of a file of interest, and a way they could have made it (they map or hold the file,
//! name it on their command line, or read() enough bytes). The proof searches only these.

use std::collections::{HashMap, HashSet};

use super::process::ProcReader;
use crate::model::SUSPECT_FRACTION as COPY_FRACTION;
use crate::sample::{CandidateSample, CandidateWhy, FileKey, ProcessSample, Sample, Unreadable};

fn big_enough(anon: u64, size: u64) -> bool {
    anon as f64 >= COPY_FRACTION * size as f64
}

/// Before the detail phase: could a process that holds nothing hold a copy of one of the
/// files (by its `RssAnon`, `RssShmem` and `HugetlbPages`, its command line, and `rchar`)? Reads `rchar`
/// when needed. Shared memory large enough holds a copy whoever filled it.
pub(super) fn could_hold_any(
    procs: &ProcReader,
    p: &mut ProcessSample,
    sizes: &[(FileKey, u64)],
    named: &HashSet<(i32, FileKey)>,
) -> bool {
    let Some(anon) = p.status.rss_anon_bytes else {
        return false;
    };
    let shmem = p.status.rss_shmem_bytes.unwrap_or(0);
    // Huge pages of the hugetlbfs pool are in neither `RssAnon` nor `RssShmem`.
    let anon = anon + shmem + p.status.hugetlb_bytes.unwrap_or(0);
    if p.pid == procs.own_pid() || anon == 0 {
        return false;
    }
    if sizes.iter().any(|(_, s)| big_enough(shmem, *s)) {
        return true;
    }
    // The few (process, file) pairs a command line names, not a lookup per file: such a
    // process may keep any part of the file.
    if named
        .iter()
        .any(|(pid, k)| *pid == p.pid && sizes.iter().any(|(k2, _)| k2 == k))
    {
        return true;
    }
    if !sizes.iter().any(|(_, s)| big_enough(anon, *s)) {
        return false;
    }
    if p.rchar_bytes.is_none() {
        p.rchar_bytes = procs.rchar(p.pid).ok().flatten();
    }
    match p.rchar_bytes {
        Some(r) => sizes
            .iter()
            .any(|(_, s)| big_enough(anon, *s) && big_enough(r, *s)),
        None => true,
    }
}

/// The candidate copy holders of each file: private anonymous memory (`RssAnon` less the
/// CoW pages of mapped files of interest, plus `HugetlbPages`) of at least [`COPY_FRACTION`] of the file, and a
/// way to have made the copy: it maps or holds the file, names it on its command line,
/// read() enough bytes (`rchar`), or its `rchar` is unknown.
pub fn candidates(
    processes: &[ProcessSample],
    sizes: &[(FileKey, u64)],
    named: &HashSet<(i32, FileKey)>,
) -> Vec<CandidateSample> {
    let me = std::process::id() as i32;
    let mut out = Vec::new();
    // The smallest file: a process without room for most of it is a candidate only for
    // the files it is tied to (a host of 600 processes and 200 files: no 120,000 pairs
    // to look at).
    let smallest = sizes.iter().map(|s| s.1).min().unwrap_or(0);
    let fast = foldhash::fast::RandomState::default();
    let mut at: HashMap<FileKey, usize, _> = HashMap::with_capacity_and_hasher(sizes.len(), fast);
    for (i, (k, _)) in sizes.iter().enumerate() {
        at.entry(*k).or_insert(i);
    }
    let mut by_pid: HashMap<i32, Vec<FileKey>> = HashMap::new();
    for (pid, k) in named {
        by_pid.entry(*pid).or_default().push(*k);
    }
    let mut ties: Vec<FileKey> = Vec::new();
    let mut which: Vec<usize> = Vec::new();
    for p in processes.iter().filter(|p| !p.kernel_thread && p.pid != me) {
        let Some(anon) = p.status.rss_anon_bytes else {
            continue;
        };
        let cow: u64 = p.mappings.iter().filter_map(|m| m.anonymous_bytes).sum();
        // Huge pages from the hugetlbfs pool (`MAP_HUGETLB`) are private memory too.
        let private = anon.saturating_sub(cow) + p.status.hugetlb_bytes.unwrap_or(0);
        // Shared memory (shmem, memfd, /dev/shm files) can hold a copy too.
        let shmem = p.status.rss_shmem_bytes.unwrap_or(0);
        // The files it maps or holds, and those its command line names.
        ties.clear();
        ties.extend(p.mappings.iter().map(|m| m.key()));
        ties.extend(p.open_files.iter().map(|o| o.key));
        ties.sort_unstable();
        ties.dedup();
        let names: &[FileKey] = by_pid.get(&p.pid).map_or(&[], |v| v.as_slice());
        // The files to look at, in the order of `sizes`.
        which.clear();
        if big_enough(private + shmem, smallest) {
            which.extend(0..sizes.len());
        } else {
            which.extend(ties.iter().chain(names).filter_map(|k| at.get(k).copied()));
            which.sort_unstable();
            which.dedup();
        }
        for &(key, size) in which.iter().map(|i| &sizes[*i]) {
            let holder = ties.binary_search(&key).is_ok();
            // A model file in shared memory that it maps is its own page cache there.
            let own: u64 = if holder {
                p.mappings
                    .iter()
                    .filter(|m| m.key() == key && m.major == 0)
                    .filter_map(|m| m.rss_bytes)
                    .sum()
            } else {
                0
            };
            let room = private + shmem.saturating_sub(own);
            let tied = holder || names.contains(&key);
            // A process tied to the file may keep part of it (a runtime's pinned buffer of
            // one tensor, a repacked few): any private memory of it is searched. Others
            // need room for most of the file.
            if room == 0 || (!tied && !big_enough(room, size)) {
                continue;
            }
            let why = if holder {
                CandidateWhy::Holder
            } else if tied {
                CandidateWhy::Named
            } else {
                match p.rchar_bytes {
                    Some(r) if big_enough(r, size) => CandidateWhy::Read,
                    // Another process may have filled the shared memory it maps (`cp` to
                    // /dev/shm, a loader's memfd).
                    Some(_) if big_enough(shmem.saturating_sub(own), size) => {
                        CandidateWhy::SharedMemory
                    }
                    Some(_) => continue,
                    None => CandidateWhy::Unknown,
                }
            };
            out.push(CandidateSample {
                pid: p.pid,
                file: key,
                why,
                private_anon_bytes: room,
            });
        }
    }
    out
}

/// The candidates of a gathered sample: `rchar` read where phase 1 did not, the
/// candidates of each file of interest (`sizes`), and, under a policy that refuses even
/// root, no candidate without evidence.
pub(super) fn add_to(
    procs: &ProcReader,
    sample: &mut Sample,
    sizes: &[(FileKey, u64)],
    named: &HashSet<(i32, FileKey)>,
    policy: bool,
    mut io: Option<&mut super::statfiles::KeptFiles>,
    tasks: Option<&super::bpf::tasks::TaskStamps>,
) {
    for p in &mut sample.processes {
        if p.rchar_bytes.is_none() && !p.kernel_thread {
            // A long-lived engine takes them from the task iterator's stamps (the same
            // sum of the threads' counters), or reads them through descriptors it keeps.
            let stamped = tasks
                .filter(|_| p.unreadable.is_none())
                .and_then(|t| t.get(p.pid));
            if let Some(t) = stamped {
                p.rchar_bytes = Some(t.rchar);
                continue;
            }
            p.rchar_bytes = match io.as_deref_mut() {
                Some(io) => io
                    .read_keep(procs.root(), p.pid, |t| {
                        Some(super::process::parse_rchar(t))
                    })
                    .flatten(),
                None => procs.rchar(p.pid).ok().flatten(),
            };
        }
    }
    sample.candidates = candidates(&sample.processes, sizes, named);
    if policy {
        // Refused even to root: what it maps, holds and read() is unknown, and its
        // memory cannot be searched. Without evidence (it does not name the file)
        // it is no candidate: it would make every small file's count a lower bound.
        let refused: HashSet<i32> = sample
            .processes
            .iter()
            .filter(|p| p.unreadable == Some(Unreadable::Denied))
            .map(|p| p.pid)
            .collect();
        sample
            .candidates
            .retain(|c| !(refused.contains(&c.pid) && c.why == CandidateWhy::Unknown));
    }
}
