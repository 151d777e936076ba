//! Which pages of a region the search may read: present, and inside a private file mapping
//! anonymous (a copy-on-write copy, never the file's own page-cache pages). From
//! `PAGEMAP_SCAN` where the kernel has it ([`crate::collect::pagescan`]: a few calls per
//! region, whatever its size), else from pagemap's 8 bytes per page.

use std::sync::atomic::{AtomicBool, Ordering};

use crate::collect::memory::{ProcMemory, Region, RegionKind};
use crate::collect::pagescan;
use crate::sample::PAGE_BYTES as PAGE;

/// Set once the kernel answered that it has no `PAGEMAP_SCAN`: pagemap from then on.
static NO_SCAN: AtomicBool = AtomicBool::new(false);

/// The readable pages of `[start, end)`, one of two ways.
#[derive(Debug, Default)]
pub struct PageMap {
    start: u64,
    end: u64,
    how: How,
}

#[derive(Debug)]
enum How {
    /// Pagemap entries, one per 4 KiB page from `start` (eligibility by region kind).
    Entries(Vec<u64>),
    /// Ranges of eligible pages (for the kind of region they were scanned for).
    Ranges(Vec<(u64, u64)>),
}

impl Default for How {
    fn default() -> Self {
        How::Entries(Vec::new())
    }
}

impl PageMap {
    /// Pagemap entries of the pages from `start` on.
    pub fn from_entries(start: u64, entries: Vec<u64>) -> PageMap {
        PageMap {
            start,
            end: start + entries.len() as u64 * PAGE,
            how: How::Entries(entries),
        }
    }

    /// Reads pagemap entries of `[start, end)` (page-aligned start).
    pub fn read_entries(target: &ProcMemory, start: u64, end: u64) -> std::io::Result<PageMap> {
        let mut entries = Vec::new();
        target
            .pagemap(start, end.next_multiple_of(PAGE), &mut entries)
            .map_err(|e| std::io::Error::other(format!("{e:#}")))?;
        Ok(PageMap::from_entries(start, entries))
    }

    /// The eligible pages of `[start, end)` for a region of `kind` from `PAGEMAP_SCAN`;
    /// `None` where the kernel has none (before Linux 6.7), or `TWOFOLD_NO_PAGEMAP_SCAN`
    /// asks for pagemap (the benchmarks compare the two).
    pub fn scan(
        target: &ProcMemory,
        start: u64,
        end: u64,
        kind: RegionKind,
    ) -> std::io::Result<Option<PageMap>> {
        if NO_SCAN.load(Ordering::Relaxed) || std::env::var_os("TWOFOLD_NO_PAGEMAP_SCAN").is_some()
        {
            return Ok(None);
        }
        let anon_only = kind == RegionKind::PrivateFile;
        match target.present_ranges(start, end, anon_only)? {
            Some(ranges) => Ok(Some(PageMap {
                start,
                end,
                how: How::Ranges(ranges),
            })),
            None => {
                NO_SCAN.store(true, Ordering::Relaxed);
                Ok(None)
            }
        }
    }

    /// The eligible ranges, when this map came from `PAGEMAP_SCAN`.
    pub fn ranges(&self) -> Option<&[(u64, u64)]> {
        match &self.how {
            How::Ranges(v) => Some(v),
            How::Entries(_) => None,
        }
    }

    /// Whether the page at `addr` may be read for region `r`.
    pub fn eligible(&self, r: &Region, addr: u64) -> bool {
        if addr < self.start || addr >= self.end {
            return false;
        }
        match &self.how {
            How::Entries(e) => {
                let i = ((addr - self.start) / PAGE) as usize;
                i < e.len() && ProcMemory::eligible(e[i], r.kind)
            }
            How::Ranges(v) => pagescan::contains(v, addr),
        }
    }

    /// Whether every page touching `[lo, hi)` may be read for region `r`: for ranges,
    /// one walk of the sorted ranges (no per-page lookup).
    pub fn all_eligible(&self, r: &Region, lo: u64, hi: u64) -> bool {
        if lo >= hi {
            return true;
        }
        let first = lo / PAGE * PAGE;
        match &self.how {
            How::Entries(_) => (first..hi)
                .step_by(PAGE as usize)
                .all(|a| self.eligible(r, a)),
            How::Ranges(v) => {
                if first < self.start || hi > self.end {
                    return false;
                }
                let mut at = first;
                let i = v.partition_point(|x| x.1 <= at);
                for &(a, b) in &v[i..] {
                    if a > at {
                        return false;
                    }
                    at = b;
                    if at >= hi {
                        return true;
                    }
                }
                false
            }
        }
    }

    /// Whether `[lo, hi)` lies inside what this map describes.
    pub fn covers(&self, lo: u64, hi: u64) -> bool {
        let known = match &self.how {
            How::Entries(e) => !e.is_empty(),
            How::Ranges(_) => true,
        };
        known && lo >= self.start && hi <= self.end
    }

    /// Bytes of eligible pages for region `r`.
    pub fn eligible_bytes(&self, r: &Region) -> u64 {
        match &self.how {
            How::Entries(e) => {
                e.iter()
                    .filter(|x| ProcMemory::eligible(**x, r.kind))
                    .count() as u64
                    * PAGE
            }
            How::Ranges(v) => pagescan::bytes(v),
        }
    }

    /// The eligible pages of `[first, end)` at `step` bytes apart on the grid of `first`
    /// (a multiple of `step`): for ranges, only the pages inside them are visited.
    pub fn sampled(&self, r: &Region, first: u64, end: u64, step: u64) -> Vec<u64> {
        match &self.how {
            How::Entries(_) => (first..end)
                .step_by(step as usize)
                .filter(|a| self.eligible(r, *a))
                .collect(),
            How::Ranges(v) => {
                let mut out = Vec::new();
                for &(a, b) in v {
                    let lo = a.max(first).next_multiple_of(step);
                    out.extend((lo..b.min(end)).step_by(step as usize));
                }
                out
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Both forms agree on whether every page of a range may be read, against this
    /// process's own pagemap: a buffer with every fourth page left untouched.
    #[test]
    fn all_eligible_agrees_between_scan_and_entries() {
        let me = ProcMemory::open(std::path::Path::new("/proc"), std::process::id() as i32)
            .unwrap_or_else(|e| panic!("{e:#}"));
        let n = 64u64;
        let mut buf = vec![0u8; ((n + 1) * PAGE) as usize];
        let base = (buf.as_ptr() as u64).next_multiple_of(PAGE);
        let off = (base - buf.as_ptr() as u64) as usize;
        // Give the untouched pages back (the allocator may have zeroed them all).
        // SAFETY: the range lies inside `buf`, which we own; its bytes are zero anyway.
        unsafe {
            libc::madvise(
                base as *mut libc::c_void,
                (n * PAGE) as usize,
                libc::MADV_DONTNEED,
            )
        };
        for i in 0..n {
            if i % 4 != 3 {
                buf[off + (i * PAGE) as usize] = 1;
            }
        }
        let r = Region {
            start: base,
            end: base + n * PAGE,
            kind: crate::collect::memory::RegionKind::Anon,
            label: String::new(),
            key: None,
        };
        let entries = PageMap::read_entries(&me, r.start, r.end).unwrap();
        let Some(scanned) = PageMap::scan(&me, r.start, r.end, r.kind).unwrap() else {
            eprintln!("skipped: this kernel has no PAGEMAP_SCAN (Linux 6.7+)");
            return;
        };
        let mut checked = 0;
        // Ranges wholly present and ranges with a hole (large folios may fill some).
        let mut mixed = [0; 2];
        for lo in (0..n * PAGE).step_by(1000) {
            for len in [1, 100, PAGE, 3 * PAGE, 2 * PAGE + 17, 9 * PAGE] {
                let (a, b) = (base + lo, (base + lo + len).min(r.end));
                // Ground truth: pagemap's entry of every page, one by one.
                let want = (a / PAGE..b.div_ceil(PAGE)).all(|p| entries.eligible(&r, p * PAGE));
                assert_eq!(
                    entries.all_eligible(&r, a, b),
                    want,
                    "entries {a:#x}..{b:#x}"
                );
                assert_eq!(scanned.all_eligible(&r, a, b), want, "scan {a:#x}..{b:#x}");
                checked += 1;
                mixed[usize::from(want)] += 1;
            }
        }
        assert!(checked > 100 && mixed[0] > 0 && mixed[1] > 0, "{mixed:?}");
        // Outside what the map describes: never.
        assert!(!scanned.all_eligible(&r, base - PAGE, base + 1));
        std::hint::black_box(&buf);
    }
}
