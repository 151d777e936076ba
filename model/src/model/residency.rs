//! Residency of files for `twofold residency` (pure: from samples and bitmaps).

use serde::{Deserialize, Serialize};

use crate::sample::ResidencySample;

/// Per-page residency bitmap.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResidencyMap {
    pub page_size: u64,
    pub pages: u64,
    bits: Vec<u64>,
}

impl ResidencyMap {
    pub fn is_resident(&self, page: u64) -> bool {
        page < self.pages && self.bits[(page / 64) as usize] & (1 << (page % 64)) != 0
    }

    pub fn resident_pages(&self) -> u64 {
        self.bits.iter().map(|w| u64::from(w.count_ones())).sum()
    }

    /// Resident pages in `[first, last)`.
    pub fn resident_in(&self, first: u64, last: u64) -> u64 {
        let last = last.min(self.pages);
        if first >= last {
            return 0;
        }
        // Whole words counted at once: a 1 TiB file is 2^28 pages.
        let (w0, w1) = ((first / 64) as usize, ((last - 1) / 64) as usize);
        let mut n = 0u64;
        for (w, word) in self.bits[w0..=w1].iter().enumerate() {
            let base = (w0 + w) as u64 * 64;
            let lo = first.saturating_sub(base).min(64);
            let hi = (last - base).min(64);
            let mask = if hi - lo == 64 {
                u64::MAX
            } else {
                ((1u64 << (hi - lo)) - 1) << lo
            };
            n += u64::from((word & mask).count_ones());
        }
        n
    }

    /// A map of `pages` pages from its words: bit `i % 64` of word `i / 64` is page `i`.
    pub fn from_bits(page_size: u64, pages: u64, bits: Vec<u64>) -> Self {
        debug_assert_eq!(bits.len() as u64, pages.div_ceil(64));
        ResidencyMap {
            page_size,
            pages,
            bits,
        }
    }

    pub fn from_bools(page_size: u64, pages: &[bool]) -> Self {
        let mut bits = vec![0u64; pages.len().div_ceil(64)];
        for (i, r) in pages.iter().enumerate() {
            if *r {
                bits[i / 64] |= 1 << (i % 64);
            }
        }
        ResidencyMap {
            page_size,
            pages: pages.len() as u64,
            bits,
        }
    }
}

/// Most cells a residency map draws; a cell covers `pages_per_cell` pages.
pub const MAX_CELLS: u64 = 256;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FileResidency {
    pub path: String,
    /// The name's bytes, only when they are not UTF-8 (`path` is then lossy): people
    /// see them escaped (`\xff`) rather than as U+FFFD.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path_bytes: Option<Vec<u8>>,
    /// From `stat(2)`, which needs no permission on the file: `None` only when even that
    /// failed (see `unknown_reason`).
    pub size_bytes: Option<u64>,
    pub pages: Option<u64>,
    pub resident_pages: Option<u64>,
    pub resident_bytes: Option<u64>,
    pub resident_fraction: Option<f64>,
    pub dirty_bytes: Option<u64>,
    pub writeback_bytes: Option<u64>,
    pub evicted_bytes: Option<u64>,
    pub recently_evicted_bytes: Option<u64>,
    pub source: Option<String>,
    pub unknown_reason: Option<String>,
    pub map: Option<MapModel>,
}

/// A compact drawing of which pages are resident: `O` every page of the cell, `o` some,
/// ` ` none (as `vmtouch -v`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MapModel {
    pub pages_per_cell: u64,
    pub cells: String,
}

/// One file's record; `size` is `None` when not even `stat` worked, and a residency
/// `Err` carries the reason it is unknown.
pub fn build(
    path: &str,
    size: Option<u64>,
    page_size: u64,
    sample: Result<&ResidencySample, String>,
    map: Option<&ResidencyMap>,
) -> FileResidency {
    let pages = size.map(|s| s.div_ceil(page_size.max(1)));
    let mut r = FileResidency {
        path: path.to_string(),
        path_bytes: None,
        size_bytes: size,
        pages,
        resident_pages: None,
        resident_bytes: None,
        resident_fraction: None,
        dirty_bytes: None,
        writeback_bytes: None,
        evicted_bytes: None,
        recently_evicted_bytes: None,
        source: None,
        unknown_reason: None,
        map: map.map(draw),
    };
    match (sample, size) {
        (Ok(_), None) => r.unknown_reason = Some("its size is unknown".into()),
        (Ok(s), Some(size)) => {
            // cachestat counts whole pages; the last, partial page is cached whole.
            let page = page_size.max(1);
            let resident_pages = s.cached_bytes / page;
            r.resident_pages = Some(resident_pages);
            r.resident_bytes = Some((resident_pages * page_size).min(size));
            r.resident_fraction = Some(super::page_cache_fraction(
                resident_pages * page,
                size,
                page,
            ));
            r.dirty_bytes = s.dirty_bytes;
            r.writeback_bytes = s.writeback_bytes;
            r.evicted_bytes = s.evicted_bytes;
            r.recently_evicted_bytes = s.recently_evicted_bytes;
            r.source = Some(format!("{:?}", s.source).to_lowercase());
        }
        (Err(reason), _) => r.unknown_reason = Some(reason),
    }
    r
}

/// Totals over files, known parts apart from unknown ones: a file whose residency is
/// unknown adds nothing to `resident_bytes` or `known_size_bytes`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Totals {
    pub files: usize,
    /// Resident bytes of the files whose residency is known.
    pub resident_bytes: u64,
    /// Size of the files whose residency is known.
    pub known_size_bytes: u64,
    /// Files whose residency is unknown, and their size (`None`: a size is unknown too).
    pub unknown_files: usize,
    pub unknown_size_bytes: Option<u64>,
}

impl Default for Totals {
    fn default() -> Self {
        Totals {
            files: 0,
            resident_bytes: 0,
            known_size_bytes: 0,
            unknown_files: 0,
            unknown_size_bytes: Some(0),
        }
    }
}

impl Totals {
    /// Adds one file: its size (if known) and resident bytes (`None`: unknown).
    pub fn add(&mut self, size: Option<u64>, resident: Option<u64>) {
        self.files += 1;
        match (size, resident) {
            (Some(size), Some(resident)) => {
                self.resident_bytes += resident;
                self.known_size_bytes += size;
            }
            _ => {
                self.unknown_size_bytes = self.unknown_size_bytes.zip(size).map(|(a, b)| a + b);
                self.unknown_files += 1;
            }
        }
    }

    pub fn of(files: &[FileResidency]) -> Totals {
        let mut t = Totals::default();
        for f in files {
            t.add(f.size_bytes, f.resident_bytes);
        }
        t
    }

    /// All resident bytes, when every file's residency is known.
    pub fn total_resident_bytes(&self) -> Option<u64> {
        (self.unknown_files == 0).then_some(self.resident_bytes)
    }

    /// All the files' size, when every size is known.
    pub fn total_size_bytes(&self) -> Option<u64> {
        self.unknown_size_bytes.map(|u| u + self.known_size_bytes)
    }
}

pub fn draw(map: &ResidencyMap) -> MapModel {
    let cells = map.pages.clamp(1, MAX_CELLS);
    let per = map.pages.div_ceil(cells).max(1);
    let mut s = String::new();
    let mut first = 0;
    while first < map.pages {
        let last = (first + per).min(map.pages);
        let n = map.resident_in(first, last);
        s.push(if n == 0 {
            ' '
        } else if n == last - first {
            'O'
        } else {
            'o'
        });
        first = last;
    }
    MapModel {
        pages_per_cell: per,
        cells: s,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn draws_full_partial_and_empty_cells() {
        let mut pages = vec![true; 256];
        pages.extend(vec![false; 256]);
        pages.extend((0..256).map(|i| i % 2 == 0));
        let m = ResidencyMap::from_bools(4096, &pages);
        let d = draw(&m);
        assert_eq!(d.pages_per_cell, 3);
        assert_eq!(d.cells.len(), 256);
        assert!(d.cells.starts_with("OOOOO"));
        assert!(d.cells.contains("     "));
        assert!(d.cells.ends_with("ooo"));
    }

    #[test]
    fn partial_last_page_counts_as_page() {
        let s = ResidencySample {
            cached_bytes: 8192,
            ..ResidencySample::default()
        };
        let r = build("f", Some(5000), 4096, Ok(&s), None);
        assert_eq!(r.pages, Some(2));
        assert_eq!(r.resident_pages, Some(2));
        assert_eq!(r.resident_bytes, Some(5000));
        assert_eq!(r.resident_fraction, Some(1.0));
        let u = build("f", Some(5000), 4096, Err("no".into()), None);
        assert_eq!(u.resident_bytes, None);
        assert_eq!((u.size_bytes, u.pages), (Some(5000), Some(2)));
        assert_eq!(u.unknown_reason.as_deref(), Some("no"));
    }

    #[test]
    fn totals_keep_unknown_apart() {
        let mut t = Totals::default();
        t.add(Some(8192), Some(4096));
        assert_eq!(t.total_resident_bytes(), Some(4096));
        t.add(Some(100), None);
        t.add(Some(200), None);
        assert_eq!((t.resident_bytes, t.known_size_bytes), (4096, 8192));
        assert_eq!((t.unknown_files, t.unknown_size_bytes), (2, Some(300)));
        assert_eq!(t.total_resident_bytes(), None, "unknown, not 4096");
        assert_eq!(t.total_size_bytes(), Some(8492));
        t.add(None, None);
        assert_eq!(t.total_size_bytes(), None);
        assert_eq!(t.unknown_size_bytes, None);
    }
}
