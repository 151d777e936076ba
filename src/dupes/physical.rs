//! One physical copy counts once: the pages under the copies a search proved are weighed
//! by how many copies map them.
//!
//! After `fork()` (gunicorn `--preload`, multiprocessing `fork`, DataLoader workers), a
//! copy the parent made is mapped copy-on-write by every child: each child's search proves
//! "a copy", but there is one in DRAM. Shared memory (a memfd or `/dev/shm` file mapped by
//! several processes) is the same. `/proc/PID/pagemap`
//! (<https://docs.kernel.org/admin-guide/mm/pagemap.html>) tells, per present page:
//! - bits 0–54, the page frame number (with `CAP_SYS_ADMIN`, else zero): a page mapped by
//!   `k` of the proven copies of a file counts `1/k` in each, so the shares of all the
//!   processes sum to the physical pages (like PSS, but among the copies);
//! - bit 56, mapped by one process only: without frame numbers, such a page counts 1 and a
//!   shared one by its mapping's `Pss`/`Rss` (smaps), and the result is marked estimated.
//!
//! Only the page map is read: no memory, nothing that faults or copies a page.

use std::collections::{BTreeMap, BTreeSet};
use std::os::unix::fs::FileExt;
use std::path::Path;

use super::prove::Found;
use crate::collect::memory::{MappingSizes, ProcMemory, RegionKind, PAGE, PM_EXCLUSIVE, PM_PFN};
use crate::sample::{FileKey, PhysicalSample, ProofSample};

/// The memory ranges of one proof's copies (`[lo, hi)`, with the kind of region): what
/// [`weigh`] needs of the copies found.
#[derive(Debug, Clone, Default)]
pub struct CopyRanges {
    pub ranges: Vec<(u64, u64, RegionKind)>,
}

impl CopyRanges {
    /// The copies of `found` that count as copies (not the process's own copy-on-write
    /// pages of its private mapping of the file), clipped to their regions.
    pub fn of<'a>(file: FileKey, found: impl IntoIterator<Item = &'a Found>) -> CopyRanges {
        let ranges = found
            .into_iter()
            .filter(|f| f.region.key != Some(file))
            .map(|f| {
                (
                    f.addr.max(f.region.start),
                    (f.addr + f.mem_len).min(f.region.end),
                    f.region.kind,
                )
            })
            .filter(|(lo, hi, _)| hi > lo)
            .collect();
        CopyRanges { ranges }
    }
}

/// What one proof's pages say before they are compared with the other proofs': pages
/// counted whole or estimated here, and the frames of the shared ones (bit 63: shmem).
#[derive(Default)]
struct Read {
    w: PhysicalSample,
    shared: Vec<u64>,
}

/// Marks a shared frame as shared memory (frame numbers use bits 0–54).
const SHMEM_BIT: u64 = 1 << 63;
/// Marks a shared frame as merged by KSM.
const KSM_BIT: u64 = 1 << 62;
/// `KPF_KSM`: the frame's flag in `/proc/kpageflags` for a page KSM merged.
const KPF_KSM: u64 = 1 << 21;

/// Reads the page map of each proof's copies and sets `physical` on every proof that
/// found a copy. `ranges[i]` belongs to `proofs[i]`. A process whose page map cannot be
/// read (it exited) keeps `physical` as it was (`None`: its copies count as its own).
/// Memory: 16 bytes per shared page of the copies, nothing per exclusive one.
pub fn weigh(proc_root: &Path, proofs: &mut [ProofSample], ranges: &[CopyRanges]) {
    let mut read: Vec<Option<Read>> = Vec::with_capacity(proofs.len());
    for (p, r) in proofs.iter().zip(ranges) {
        read.push(if r.ranges.is_empty() || p.copy_memory_bytes == 0 {
            None
        } else {
            read_pages(proc_root, p.pid, r)
        });
    }
    mark_ksm(proc_root, &mut read);
    // Every shared frame with the proof that maps it, grouped by (file, frame).
    let files: Vec<FileKey> = proofs.iter().map(|p| p.file).collect();
    let total = read.iter().flatten().map(|r| r.shared.len()).sum();
    let mut occurrences: Vec<(u32, u64, u32)> = Vec::with_capacity(total);
    for (i, r) in read.iter().enumerate() {
        let Some(r) = r else { continue };
        let file = files.iter().position(|f| *f == files[i]).unwrap_or(i) as u32;
        occurrences.extend(r.shared.iter().map(|&pfn| (file, pfn, i as u32)));
    }
    occurrences.sort_unstable_by_key(|o| (o.0, o.1 & PM_PFN, o.2));
    let pids: Vec<i32> = proofs.iter().map(|p| p.pid).collect();
    let mut with: Vec<BTreeSet<i32>> = vec![BTreeSet::new(); proofs.len()];
    // The processes mapping a frame; consecutive frames are mostly mapped by the same
    // ones (a forked pool shares its whole copy), so each proof's sharers are added only
    // when they differ from the last frame's.
    let mut distinct: Vec<i32> = Vec::new();
    let mut last: Vec<Vec<i32>> = vec![Vec::new(); proofs.len()];
    let frame = |o: &(u32, u64, u32)| (o.0, o.1 & PM_PFN);
    for run in occurrences.chunk_by(|a, b| frame(a) == frame(b)) {
        distinct.clear();
        distinct.extend(run.iter().map(|o| pids[o.2 as usize]));
        distinct.sort_unstable();
        distinct.dedup();
        for o in run {
            let i = o.2 as usize;
            let Some(r) = read[i].as_mut() else { continue };
            r.w.share_pages += 1.0 / run.len() as f64;
            r.w.shared_by = r.w.shared_by.max(distinct.len() as u32);
            r.w.shmem |= o.1 & SHMEM_BIT != 0 && distinct.len() > 1;
            r.w.ksm |= o.1 & KSM_BIT != 0 && distinct.len() > 1;
            if last[i] != distinct {
                with[i].extend(distinct.iter().filter(|p| **p != pids[i]));
                last[i].clone_from(&distinct);
            }
        }
    }
    for (i, r) in read.into_iter().enumerate() {
        let Some(mut r) = r else { continue };
        r.w.shared_with = std::mem::take(&mut with[i]).into_iter().collect();
        proofs[i].physical = Some(r.w);
    }
}

/// The present pages under `r` in `pid`, each 4 KiB page once: exclusive ones and, without
/// frame numbers, estimated ones are counted; shared frames are returned.
fn read_pages(proc_root: &Path, pid: i32, r: &CopyRanges) -> Option<Read> {
    let target = ProcMemory::open(proc_root, pid).ok()?;
    // Page addresses, each once (two tensors' copies may share a boundary page).
    let mut spans: BTreeMap<u64, (u64, RegionKind)> = BTreeMap::new();
    for &(lo, hi, kind) in &r.ranges {
        let (a, b) = (lo / PAGE * PAGE, hi.next_multiple_of(PAGE));
        let e = spans.entry(a).or_insert((b, kind));
        e.0 = e.0.max(b);
    }
    let mut sizes: Option<Vec<MappingSizes>> = None;
    let mut out = Read {
        w: PhysicalSample {
            shared_by: 1,
            ..PhysicalSample::default()
        },
        shared: Vec::new(),
    };
    let mut entries = Vec::new();
    let mut next = 0u64;
    for (&a, &(b, kind)) in &spans {
        let a = a.max(next);
        if a >= b {
            continue;
        }
        next = b;
        // A window at a time: the page map of a huge copy is never held whole.
        let mut w0 = a;
        while w0 < b {
            let w1 = (w0 + WINDOW).min(b);
            target.pagemap(w0, w1, &mut entries).ok()?;
            for (k, &e) in entries.iter().enumerate() {
                if !ProcMemory::eligible(e, kind) {
                    continue;
                }
                out.w.pages += 1;
                let pfn = e & PM_PFN;
                if e & PM_EXCLUSIVE != 0 {
                    out.w.share_pages += 1.0;
                } else if pfn != 0 {
                    let shmem = if shared_memory(kind) { SHMEM_BIT } else { 0 };
                    out.shared.push(pfn | shmem);
                } else {
                    // No frame number: the mapping's Pss/Rss says how shared it is.
                    let s = sizes.get_or_insert_with(|| target.smaps_sizes().unwrap_or_default());
                    let addr = w0 + k as u64 * PAGE;
                    let mapping = s
                        .iter()
                        .find(|m| m.start <= addr && addr < m.end)
                        .filter(|m| m.rss_bytes > 0 && m.rss_bytes != u64::MAX);
                    let ratio = mapping.map_or(1.0, |m| {
                        (m.pss_bytes as f64 / m.rss_bytes as f64).clamp(1e-9, 1.0)
                    });
                    out.w.estimated = true;
                    out.w.share_pages += ratio;
                    let by = (1.0 / ratio).round().max(1.0) as u32;
                    out.w.shared_by = out.w.shared_by.max(by);
                    out.w.shmem |= shared_memory(kind) && by > 1;
                    // Its mapping's pages KSM merged (smaps `KSM:`): merged, not forked.
                    out.w.ksm |= by > 1 && mapping.is_some_and(|m| m.ksm_bytes > 0);
                }
            }
            w0 = w1;
        }
    }
    Some(out)
}

/// Memory processes share by mapping it (shmem, memfd, driver memory), not by fork.
fn shared_memory(kind: RegionKind) -> bool {
    matches!(kind, RegionKind::SharedAnon | RegionKind::Pinned)
}

/// Marks the shared frames of every read that KSM merged ([`KSM_BIT`]), from their flags
/// in `/proc/kpageflags` (one u64 per frame, root only; read like the page map, never a
/// page): a copy two processes read into `MADV_MERGEABLE` memory is one physical copy,
/// but not fork's. Each frame's flags are read once however many sharers map it (a pool
/// of 8 forks: one read, not 8), and none where KSM's counters say it merged nothing on
/// the host. Unreadable flags mark nothing.
fn mark_ksm(proc_root: &Path, reads: &mut [Option<Read>]) {
    let total: usize = reads.iter().flatten().map(|r| r.shared.len()).sum();
    if total == 0 || SilentMoves::read().is_some_and(|s| s.merged_none()) {
        return;
    }
    let Ok(flags) = std::fs::File::open(proc_root.join("kpageflags")) else {
        return;
    };
    let mut pfns: Vec<u64> = Vec::with_capacity(total);
    for r in reads.iter().flatten() {
        pfns.extend(r.shared.iter().map(|p| p & PM_PFN));
    }
    pfns.sort_unstable();
    pfns.dedup();
    let mut merged: Vec<u64> = Vec::new();
    let mut buf: Vec<u64> = Vec::new();
    // Runs of consecutive frames, one read each (at most 4096 frames at a time).
    for run in pfns.chunk_by(|a, b| *b == a + 1 && b % 4096 != 0) {
        buf.clear();
        buf.resize(run.len(), 0);
        // SAFETY: u64 has no invalid bit patterns; the byte view covers exactly `buf`.
        let bytes =
            unsafe { std::slice::from_raw_parts_mut(buf.as_mut_ptr().cast::<u8>(), buf.len() * 8) };
        if flags.read_exact_at(bytes, run[0] * 8).is_err() {
            return;
        }
        merged.extend(
            run.iter()
                .zip(&buf)
                .filter(|(_, f)| *f & KPF_KSM != 0)
                .map(|(p, _)| *p),
        );
    }
    if merged.is_empty() {
        return;
    }
    for p in reads.iter_mut().flatten().flat_map(|r| r.shared.iter_mut()) {
        if merged.binary_search(&(*p & PM_PFN)).is_ok() {
            *p |= KSM_BIT;
        }
    }
}

/// The host's counters of what changes how pages are shared without a page fault in any
/// process that maps them: KSM merging pages (`/sys/kernel/mm/ksm/pages_shared`,
/// `pages_sharing`, `ksm_zero_pages` where the kernel has it) and khugepaged collapsing
/// them, which copies shared pages into a new huge page
/// (`/sys/kernel/mm/transparent_hugepage/khugepaged/pages_collapsed`). While they stand
/// still and no sharer faulted, a share-out of the copies' pages cannot have changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SilentMoves([Option<u64>; 4]);

impl SilentMoves {
    /// The counters as given (tests): KSM's three, then khugepaged's.
    #[doc(hidden)]
    pub fn of(counters: [Option<u64>; 4]) -> SilentMoves {
        SilentMoves(counters)
    }

    /// Whether KSM's counters say no page is merged on the host now (all three present
    /// and 0): no frame can carry KSM's flag.
    pub fn merged_none(&self) -> bool {
        self.merges().iter().all(|c| *c == Some(0))
    }

    /// KSM's counters alone: what can make a page that was one process's shared.
    pub fn merges(&self) -> &[Option<u64>] {
        &self.0[..3]
    }

    /// `None` when `/sys/kernel/mm` cannot be read (no sysfs here): nothing is known to
    /// stand still. A counter the kernel does not have (no KSM, no transparent huge pages)
    /// is absent, and stays so: nothing of that kind can move pages.
    pub fn read() -> Option<SilentMoves> {
        if !std::path::Path::new("/sys/kernel/mm").is_dir() {
            return None;
        }
        let num = |p: &str| -> Option<u64> { std::fs::read_to_string(p).ok()?.trim().parse().ok() };
        Some(SilentMoves([
            num("/sys/kernel/mm/ksm/pages_shared"),
            num("/sys/kernel/mm/ksm/pages_sharing"),
            num("/sys/kernel/mm/ksm/ksm_zero_pages"),
            num("/sys/kernel/mm/transparent_hugepage/khugepaged/pages_collapsed"),
        ]))
    }
}

/// The page map is read this much address space at a time (2 MiB of entries).
const WINDOW: u64 = 1 << 30;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ratio_of_a_copy_shared_by_four_is_a_quarter() {
        let w = PhysicalSample {
            pages: 100,
            share_pages: 25.0,
            shared_by: 4,
            ..PhysicalSample::default()
        };
        assert!((w.ratio() - 0.25).abs() < 1e-12);
        assert_eq!(PhysicalSample::default().ratio(), 1.0);
    }
}
