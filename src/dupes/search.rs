//! Searching a process's memory for the indexed tensors, and confirming every candidate
//! byte by byte against the file.

use std::collections::HashSet;
use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;

use super::index::{key, periodic, Index, WIN};
use crate::collect::memory::{Region, Target, IOV_MAX, PAGE};

/// A confirmed copy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Found {
    /// Index into `Index::targets`.
    pub target: usize,
    pub addr: u64,
    /// Index into the searched regions.
    pub region: usize,
}

/// Work done, for the report and the benchmark.
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize, PartialEq)]
pub struct Stats {
    pub regions: usize,
    /// Bytes of the searched regions' address space.
    pub mapped_bytes: u64,
    /// Present (eligible) bytes sampled.
    pub present_bytes: u64,
    pub samples: u64,
    pub candidates: u64,
    /// Candidates whose full comparison failed (hash collisions, partial copies).
    pub rejected: u64,
    /// Bytes compared with the file to confirm copies.
    pub confirmed_bytes: u64,
}

/// Chunk of a confirmation comparison.
const CONFIRM_CHUNK: usize = 1 << 20;

struct Searcher<'a> {
    index: &'a Index,
    file: &'a File,
    target: &'a Target,
    src: Vec<u8>,
    conv: Vec<u8>,
    mem: Vec<u8>,
    stats: Stats,
}

impl Searcher<'_> {
    /// Compares target memory at `addr` with the file bytes of `t` (converted as the kind
    /// says). Stops at the first difference.
    fn confirm(&mut self, t: usize, addr: u64) -> io::Result<bool> {
        let s = &self.index.targets[t];
        let factor = s.kind.factor();
        let mut done = 0u64;
        while done < s.mem_len {
            let n = (s.mem_len - done).min(CONFIRM_CHUNK as u64) as usize;
            self.src.resize(n / factor as usize, 0);
            self.file
                .read_exact_at(&mut self.src, s.file_offset + done / factor)?;
            s.kind.convert(&self.src, &mut self.conv);
            self.mem.resize(n, 0);
            let got = match self.target.read(addr + done, &mut self.mem) {
                Ok(g) => g,
                Err(e) if e.raw_os_error() == Some(libc::EFAULT) => 0,
                Err(e) => return Err(e),
            };
            self.stats.confirmed_bytes += got as u64;
            if got != n || self.mem != self.conv {
                return Ok(false);
            }
            done += n as u64;
        }
        Ok(true)
    }
}

/// Byte shifts to try at each sampled page: every multiple of `align` below 16 (copies
/// allocated on their own start at such addresses), plus each tensor's file offset modulo
/// 16 (a copy of the whole file into a 16-byte-aligned buffer puts every tensor at its
/// file offset's residue: safetensors data, for one, is only 8-byte aligned).
pub fn probes(index: &Index, align: u64) -> Vec<usize> {
    let align = align.clamp(1, WIN as u64) as usize;
    let mut p: Vec<usize> = (0..WIN).step_by(align).collect();
    for t in &index.targets {
        if t.kind == super::index::CopyKind::Identical {
            p.push((t.file_offset % WIN as u64) as usize);
        }
    }
    p.sort_unstable();
    p.dedup();
    p
}

/// Searches `regions` of `target` for copies of the indexed tensors, trying the byte
/// shifts of [`probes`] at each sampled page.
pub fn search(
    index: &Index,
    file: &File,
    target: &Target,
    regions: &[Region],
    align: u64,
) -> crate::collect::error::Result<(Vec<Found>, Stats)> {
    let probes = probes(index, align);
    let sample_len = WIN + probes.last().copied().unwrap_or(0);
    let mut s = Searcher {
        index,
        file,
        target,
        src: Vec::new(),
        conv: Vec::new(),
        mem: Vec::new(),
        stats: Stats {
            regions: regions.len(),
            ..Stats::default()
        },
    };
    let mut found = Vec::new();
    let mut seen: HashSet<(usize, u64)> = HashSet::new();
    let mut pagemap = Vec::new();
    let mut addrs = Vec::with_capacity(IOV_MAX);
    let mut buf = vec![0u8; IOV_MAX * sample_len];
    let io = |e: io::Error| {
        crate::collect::error::CollectError::io(
            std::path::Path::new(&format!("/proc/{}/mem", target.pid)),
            e,
        )
    };
    for (ri, r) in regions.iter().enumerate() {
        s.stats.mapped_bytes += r.end - r.start;
        target.pagemap(r.start, r.end, &mut pagemap)?;
        let eligible = |addr: u64, pm: &[u64]| -> bool {
            Target::eligible(pm[((addr - r.start) / PAGE) as usize], r.kind)
        };
        let pages: Vec<u64> = (0..pagemap.len())
            .filter(|i| Target::eligible(pagemap[*i], r.kind))
            .map(|i| r.start + i as u64 * PAGE)
            .collect();
        s.stats.present_bytes += pages.len() as u64 * PAGE;
        let mut skip_until = 0u64;
        for batch in pages.chunks(IOV_MAX) {
            addrs.clear();
            addrs.extend(batch.iter().copied().filter(|a| *a >= skip_until));
            if addrs.is_empty() {
                continue;
            }
            let read = match target.gather(&addrs, sample_len, &mut buf) {
                Ok(n) => n,
                // The target unmapped something meanwhile: take the pages one by one.
                Err(e) if e.raw_os_error() == Some(libc::EFAULT) => 0,
                Err(e) if e.raw_os_error() == Some(libc::ESRCH) => return Err(io(e)),
                Err(e) => return Err(io(e)),
            };
            for (k, &page) in addrs.iter().enumerate().take(read) {
                if page < skip_until {
                    continue;
                }
                s.stats.samples += 1;
                let sample = &buf[k * sample_len..(k + 1) * sample_len];
                let mut candidates: Vec<(usize, u64)> = Vec::new();
                for &d in &probes {
                    let w = &sample[d..d + WIN];
                    if periodic(w) {
                        continue;
                    }
                    index.lookup(key(w), |t, off| {
                        let at = page + d as u64;
                        if at >= off {
                            candidates.push((t, at - off));
                        }
                    });
                }
                for (t, a) in candidates {
                    let len = index.targets[t].mem_len;
                    if a < r.start || a + len > r.end || seen.contains(&(t, a)) {
                        continue;
                    }
                    // Inside file mappings, every page of the copy must be anonymous.
                    let first = a / PAGE * PAGE;
                    if (first..a + len)
                        .step_by(PAGE as usize)
                        .any(|p| !eligible(p, &pagemap))
                    {
                        continue;
                    }
                    s.stats.candidates += 1;
                    seen.insert((t, a));
                    if s.confirm(t, a).map_err(io)? {
                        found.push(Found {
                            target: t,
                            addr: a,
                            region: ri,
                        });
                        skip_until = skip_until.max(a + len);
                    } else {
                        s.stats.rejected += 1;
                    }
                }
            }
        }
    }
    Ok((found, s.stats))
}
