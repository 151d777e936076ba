//! What moved in a process's memory since its last full search, from signals that cost
//! the target nothing: its present ranges (`PAGEMAP_SCAN`) and the physical frames of one
//! page in every 2 MiB of them (pagemap PFNs). No page is read, no soft-dirty bit is
//! cleared, nothing is write-protected.
//!
//! A copy of a model needs memory to hold it: newly faulted pages (the present ranges
//! grow) or pages freed and faulted again (same addresses, other frames). When neither
//! happened, the memory the last search saw is where it was, rewritten in place at most
//! (a KV cache, a batch buffer, allocator churn within resident pages), and that search
//! stands: the count stays exact between full searches. What this cannot see is a copy
//! written over pages the process already had resident at the same frames; the next full
//! search (within the cadence) finds it.

use crate::collect::memory::RegionKind;
use crate::collect::memory::{ProcMemory, PM_PFN};
use crate::collect::Roots;
use crate::sample::PAGE_BYTES as PAGE;

use super::pagemap::PageMap;

/// One frame sampled every this many bytes of present memory.
const FRAME_EVERY: u64 = 2 << 20;

/// Where a process's searchable memory is: its present ranges and sampled frames (the
/// first page of each range and every 2 MiB-aligned page, so that two placements sample
/// the same addresses where their ranges agree).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placement {
    ranges: Vec<(u64, u64)>,
    /// (address, frame) of one page in every [`FRAME_EVERY`] bytes of the ranges.
    frames: Vec<(u64, u64)>,
}

/// The parts of `present` (sorted, disjoint) inside `regions` (sorted, disjoint).
fn clip(present: &[(u64, u64)], regions: impl Iterator<Item = (u64, u64)>) -> Vec<(u64, u64)> {
    let mut out = Vec::new();
    let mut i = 0;
    for (lo, hi) in regions {
        i += present[i..].partition_point(|p| p.1 <= lo);
        for &(a, b) in &present[i..] {
            if a >= hi {
                break;
            }
            out.push((a.max(lo), b.min(hi)));
        }
    }
    out
}

impl Placement {
    /// The placement of `pid`'s searchable memory now; `None` when it cannot be known
    /// (no `PAGEMAP_SCAN`, frame numbers hidden without `CAP_SYS_ADMIN`, the process gone).
    pub fn of(roots: &Roots, pid: i32) -> Option<Placement> {
        let target = ProcMemory::open(&roots.proc, pid).ok()?;
        let maps = roots.proc.join(pid.to_string()).join("maps");
        let text = std::fs::read_to_string(&maps).ok()?;
        let regions = ProcMemory::regions(&maps, &text).ok()?;
        // Private memory (anonymous regions, and the copy-on-write pages of private file
        // mappings) in one `PAGEMAP_SCAN` of its whole span, anonymous pages only, clipped
        // to those regions: a CUDA process has a thousand or more small mappings, and one
        // ioctl each was most of the cost of knowing where its memory is (the walk skips
        // what has no page tables: reservations, device memory). The rest (shared memory,
        // huge pages, driver memory: their pages may be file-backed) region by region.
        let private = |r: &&crate::collect::memory::Region| {
            matches!(r.kind, RegionKind::Anon | RegionKind::PrivateFile)
        };
        let mut ranges = Vec::new();
        let span: Vec<_> = regions.iter().filter(private).collect();
        if let (Some(first), Some(last)) = (span.first(), span.last()) {
            let pm =
                PageMap::scan(&target, first.start, last.end, RegionKind::PrivateFile).ok()??;
            ranges.extend(clip(pm.ranges()?, span.iter().map(|r| (r.start, r.end))));
        }
        for r in regions.iter().filter(|r| !private(r)) {
            let pm = PageMap::scan(&target, r.start, r.end, r.kind).ok()??;
            ranges.extend(pm.ranges()?.iter().copied());
        }
        ranges.sort_unstable();
        let mut frames = Vec::new();
        let mut one = Vec::new();
        for &(a, b) in &ranges {
            let mut at = a;
            while at < b {
                target.pagemap(at, at + PAGE, &mut one).ok()?;
                frames.push((at, one.first().map_or(0, |e| e & PM_PFN)));
                at = (at / FRAME_EVERY + 1) * FRAME_EVERY;
            }
        }
        // Without CAP_SYS_ADMIN the kernel reports every frame as 0: placement unknown.
        if !frames.is_empty() && frames.iter().all(|f| f.1 == 0) {
            return None;
        }
        Some(Placement { ranges, frames })
    }

    /// Whether memory moved since `old`: a page is present now outside `old`'s ranges
    /// (faulted in), or a page sampled both times sits in another frame (freed and
    /// faulted again). Pages freed since (ranges that shrank) move nothing: a copy cannot
    /// appear by freeing memory.
    pub fn moved_since(&self, old: &Placement) -> bool {
        let covered = |a: u64, b: u64| {
            let i = old.ranges.partition_point(|r| r.1 <= a);
            let mut at = a;
            for r in &old.ranges[i..] {
                if r.0 > at {
                    return false;
                }
                at = at.max(r.1);
                if at >= b {
                    return true;
                }
            }
            false
        };
        if self.ranges.iter().any(|&(a, b)| !covered(a, b)) {
            return true;
        }
        // Both are in address order ([`Placement::of`] walks the ranges upwards): one
        // pass over the two, no table.
        let sorted = |v: &[(u64, u64)]| v.is_sorted_by_key(|f| f.0);
        if !sorted(&self.frames) || !sorted(&old.frames) {
            let before: std::collections::HashMap<u64, u64> = old.frames.iter().copied().collect();
            return self
                .frames
                .iter()
                .any(|(a, f)| before.get(a).is_some_and(|g| g != f));
        }
        let mut j = 0;
        self.frames.iter().any(|&(a, f)| {
            j += old.frames[j..].partition_point(|g| g.0 < a);
            old.frames.get(j).is_some_and(|g| g.0 == a && g.1 != f)
        })
    }

    /// The memory present now that is where `old` saw it: present both times, outside
    /// the blocks whose sampled frame changed. What is not in it moved (faulted in since,
    /// or freed and faulted again) and is all a search needs to look at again.
    pub fn unmoved_since(&self, old: &Placement) -> Vec<(u64, u64)> {
        // Present both times (both lists sorted, disjoint).
        let mut both = Vec::new();
        let (mut i, mut j) = (0, 0);
        while i < self.ranges.len() && j < old.ranges.len() {
            let (a, b) = (self.ranges[i], old.ranges[j]);
            let (lo, hi) = (a.0.max(b.0), a.1.min(b.1));
            if lo < hi {
                both.push((lo, hi));
            }
            if a.1 < b.1 {
                i += 1;
            } else {
                j += 1;
            }
        }
        let before: std::collections::HashMap<u64, u64> = old.frames.iter().copied().collect();
        let mut changed: Vec<(u64, u64)> = self
            .frames
            .iter()
            .filter(|(a, f)| before.get(a).is_some_and(|g| g != f))
            .map(|&(a, _)| (a, (a / FRAME_EVERY + 1) * FRAME_EVERY))
            .collect();
        changed.sort_unstable();
        both.into_iter()
            .flat_map(|(lo, hi)| super::sweep_parts::uncovered(lo, hi, &changed))
            .collect()
    }

    /// Present bytes.
    pub fn present_bytes(&self) -> u64 {
        crate::collect::pagescan::bytes(&self.ranges)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn present_pages_are_clipped_to_the_regions() {
        let present = [(0x1000, 0x5000), (0x8000, 0x9000), (0xa000, 0xc000)];
        let regions = [(0x0, 0x2000), (0x3000, 0x8800), (0xb000, 0xf000)];
        assert_eq!(
            clip(&present, regions.into_iter()),
            vec![
                (0x1000, 0x2000),
                (0x3000, 0x5000),
                (0x8000, 0x8800),
                (0xb000, 0xc000)
            ]
        );
        assert!(clip(&[], regions.into_iter()).is_empty());
    }

    /// One scan of the private span finds what a scan of each region finds: the written
    /// (copy-on-write) page of a private file mapping, none of its file pages, and the
    /// pages of an anonymous buffer.
    #[test]
    fn one_scan_of_the_private_span_sees_what_each_region_does() {
        use std::os::fd::AsRawFd;
        let roots = Roots::live();
        let me = std::process::id() as i32;
        let page = PAGE as usize;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("weights.bin");
        std::fs::write(&path, vec![7u8; 8 * page]).unwrap();
        let f = std::fs::File::open(&path).unwrap();
        // SAFETY: a private mapping of a file of 8 pages, read and one page written.
        let (file, anon) = unsafe {
            let file = libc::mmap(
                std::ptr::null_mut(),
                8 * page,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE,
                f.as_raw_fd(),
                0,
            );
            assert_ne!(file, libc::MAP_FAILED);
            let anon = libc::mmap(
                std::ptr::null_mut(),
                4 * page,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            );
            assert_ne!(anon, libc::MAP_FAILED);
            let mut sum = 0u8;
            for i in 0..8 {
                sum = sum.wrapping_add(std::ptr::read_volatile((file as *const u8).add(i * page)));
            }
            assert_eq!(sum, 56);
            *(file as *mut u8).add(3 * page) = 1;
            std::ptr::write_bytes(anon as *mut u8, 5, 4 * page);
            (file as u64, anon as u64)
        };
        let Some(pl) = Placement::of(&roots, me) else {
            println!("SKIPPED: PAGEMAP_SCAN needs Linux 6.7");
            return;
        };
        let within =
            |a: u64, b: u64| -> Vec<(u64, u64)> { clip(&pl.ranges, std::iter::once((a, b))) };
        let p = PAGE;
        assert_eq!(
            within(file, file + 8 * p),
            vec![(file + 3 * p, file + 4 * p)]
        );
        assert_eq!(within(anon, anon + 4 * p), vec![(anon, anon + 4 * p)]);
        assert!(pl.ranges.is_sorted(), "{:?}", pl.ranges);
        // SAFETY: the mappings made above.
        unsafe {
            libc::munmap(file as *mut libc::c_void, 8 * page);
            libc::munmap(anon as *mut libc::c_void, 4 * page);
        }
    }

    /// `pl` less the pages of `[p, p + len)`: as if that buffer had been freed.
    fn again_without(pl: &Placement, p: *mut libc::c_void, len: usize) -> Placement {
        let (a, b) = (p as u64, p as u64 + len as u64);
        let mut ranges = Vec::new();
        for &(x, y) in &pl.ranges {
            if x < a {
                ranges.push((x, y.min(a)));
            }
            if y > b {
                ranges.push((x.max(b), y));
            }
        }
        let frames = pl
            .frames
            .iter()
            .filter(|f| !(a..b).contains(&f.0))
            .copied()
            .collect();
        Placement { ranges, frames }
    }

    /// In this process: unchanged while a buffer is rewritten in place; moved when it
    /// grows, and when it is freed and allocated again at the same size.
    #[test]
    fn rewriting_in_place_does_not_move_growing_or_reallocating_does() {
        if !nix::unistd::geteuid().is_root() {
            println!("SKIPPED: frame numbers need root (CAP_SYS_ADMIN)");
            return;
        }
        let roots = Roots::live();
        let me = std::process::id() as i32;
        let len = 8 << 20;
        let map = |fill: u8| {
            // SAFETY: an anonymous private mapping this test owns and unmaps below.
            let p = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    len,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                    -1,
                    0,
                )
            };
            assert_ne!(p, libc::MAP_FAILED);
            // SAFETY: within the mapping.
            unsafe { std::ptr::write_bytes(p as *mut u8, fill, len) };
            p
        };
        let p = map(1);
        let Some(before) = Placement::of(&roots, me) else {
            println!("SKIPPED: PAGEMAP_SCAN needs Linux 6.7");
            // SAFETY: the mapping made above.
            unsafe { libc::munmap(p, len) };
            return;
        };
        // SAFETY: within the mapping.
        unsafe { std::ptr::write_bytes(p as *mut u8, 2, len) };
        let same = Placement::of(&roots, me);
        // Freed and mapped again (the kernel often gives the same addresses back).
        // SAFETY: the mapping made above.
        unsafe { libc::munmap(p, len) };
        let q = map(3);
        let again = Placement::of(&roots, me);
        let r = map(4);
        let grown = Placement::of(&roots, me);
        let grown = grown.unwrap_or_else(|| panic!("placement known"));
        // SAFETY: the mappings made above.
        unsafe {
            libc::munmap(q, len);
            libc::munmap(r, len);
        }
        // Other threads of the test binary allocate too: compare the test's own ranges.
        let (a, b) = (p as u64, p as u64 + len as u64);
        let within = |pl: &Placement| {
            let r: Vec<_> = pl
                .ranges
                .iter()
                .filter(|r| r.0 < b && r.1 > a)
                .copied()
                .collect();
            let f: Vec<_> = pl
                .frames
                .iter()
                .filter(|f| (a..b).contains(&f.0))
                .copied()
                .collect();
            (r, f)
        };
        let same = same.unwrap_or_else(|| panic!("placement known"));
        assert!(!within(&before).1.is_empty());
        assert_eq!(
            within(&before),
            within(&same),
            "rewritten in place: not moved"
        );
        let again = again.unwrap_or_else(|| panic!("placement known"));
        assert_ne!(
            within(&before),
            within(&again),
            "freed and faulted again: moved"
        );
        assert!(again.moved_since(&before), "freed and faulted again: moved");
        let grown = grown.clone();
        assert!(grown.moved_since(&again), "grown: moved");
        // Shrinking moves nothing: the placement with the new buffer, against without.
        assert!(!again_without(&grown, r, len).moved_since(&grown));
        assert!(grown.present_bytes() >= again.present_bytes() + len as u64 / 2);
    }
}
