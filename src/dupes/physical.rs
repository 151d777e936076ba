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

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::Path;

use super::prove::Found;
use crate::collect::memory::{MappingSizes, RegionKind, Target, PAGE, PM_EXCLUSIVE, PM_PFN};
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

/// One present page under a copy.
struct Page {
    pfn: u64,
    exclusive: bool,
    shmem: bool,
    /// `Pss / Rss` of its mapping (the estimate without frame numbers).
    pss_ratio: f64,
}

/// Reads the page map of each proof's copies and sets `physical` on every proof that
/// found a copy. `ranges[i]` belongs to `proofs[i]`. A process whose page map cannot be
/// read (it exited) keeps `physical: None`: its copies count as its own.
pub fn weigh(proc_root: &Path, proofs: &mut [ProofSample], ranges: &[CopyRanges]) {
    let mut pages: Vec<Option<Vec<Page>>> = Vec::with_capacity(proofs.len());
    for (p, r) in proofs.iter().zip(ranges) {
        pages.push(if r.ranges.is_empty() || p.copy_memory_bytes == 0 {
            None
        } else {
            read_pages(proc_root, p.pid, r)
        });
    }
    // Shared pages (not exclusive, with a frame number): which proofs map each, per file.
    let mut mappers: HashMap<(FileKey, u64), Vec<usize>> = HashMap::new();
    for (i, pg) in pages.iter().enumerate() {
        for page in pg.iter().flatten() {
            if page.pfn != 0 && !page.exclusive {
                mappers
                    .entry((proofs[i].file, page.pfn))
                    .or_default()
                    .push(i);
            }
        }
    }
    let pids: Vec<i32> = proofs.iter().map(|p| p.pid).collect();
    for (i, pg) in pages.into_iter().enumerate() {
        let Some(pg) = pg else { continue };
        let file = proofs[i].file;
        let mut w = PhysicalSample {
            pages: pg.len() as u64,
            shared_by: 1,
            ..PhysicalSample::default()
        };
        let mut with: BTreeSet<i32> = BTreeSet::new();
        for page in &pg {
            if page.exclusive {
                w.share_pages += 1.0;
                continue;
            }
            if page.pfn == 0 {
                // No frame number: the mapping's Pss/Rss says how shared it is.
                w.estimated = true;
                w.share_pages += page.pss_ratio;
                let by = (1.0 / page.pss_ratio.max(1e-9)).round() as u32;
                w.shared_by = w.shared_by.max(by.max(1));
                w.shmem |= page.shmem && by > 1;
                continue;
            }
            let m = mappers.get(&(file, page.pfn)).map_or(&[][..], |v| v);
            w.share_pages += 1.0 / m.len().max(1) as f64;
            let distinct: BTreeSet<i32> = m.iter().map(|&j| pids[j]).collect();
            w.shared_by = w.shared_by.max(distinct.len().max(1) as u32);
            with.extend(distinct.iter().filter(|p| **p != pids[i]));
            w.shmem |= page.shmem && distinct.len() > 1;
        }
        w.shared_with = with.into_iter().collect();
        proofs[i].physical = Some(w);
    }
}

/// The present pages under `r` in `pid`, each 4 KiB page once.
fn read_pages(proc_root: &Path, pid: i32, r: &CopyRanges) -> Option<Vec<Page>> {
    let target = Target::open(proc_root, pid).ok()?;
    // Page addresses, each once (two tensors' copies may share a boundary page).
    let mut spans: BTreeMap<u64, (u64, RegionKind)> = BTreeMap::new();
    for &(lo, hi, kind) in &r.ranges {
        let (a, b) = (lo / PAGE * PAGE, hi.next_multiple_of(PAGE));
        let e = spans.entry(a).or_insert((b, kind));
        e.0 = e.0.max(b);
    }
    let mut sizes: Option<Vec<MappingSizes>> = None;
    let mut out = Vec::new();
    let mut entries = Vec::new();
    let mut next = 0u64;
    for (&a, &(b, kind)) in &spans {
        let a = a.max(next);
        if a >= b {
            continue;
        }
        next = b;
        target.pagemap(a, b, &mut entries).ok()?;
        for (k, &e) in entries.iter().enumerate() {
            if !Target::eligible(e, kind) {
                continue;
            }
            let pfn = e & PM_PFN;
            let exclusive = e & PM_EXCLUSIVE != 0;
            let pss_ratio = if exclusive || pfn != 0 {
                1.0
            } else {
                let s = sizes.get_or_insert_with(|| target.smaps_sizes().unwrap_or_default());
                let addr = a + k as u64 * PAGE;
                s.iter()
                    .find(|m| m.start <= addr && addr < m.end)
                    .filter(|m| m.rss_bytes > 0 && m.rss_bytes != u64::MAX)
                    .map_or(1.0, |m| {
                        (m.pss_bytes as f64 / m.rss_bytes as f64).clamp(0.0, 1.0)
                    })
            };
            out.push(Page {
                pfn,
                exclusive,
                shmem: kind == RegionKind::SharedAnon,
                pss_ratio,
            });
        }
    }
    Some(out)
}

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
