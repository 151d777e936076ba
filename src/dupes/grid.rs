//! The grid index: fingerprints at fixed points of every tensor of one or more files, so
//! that a *sparse* sample of a process's memory still finds their copies.
//!
//! A *piece* is one (tensor, copy kind) pair: the tensor's bytes as they would lie in
//! memory if copied identically, or converted to another dtype ([`Layouts`]: F16/BF16 →
//! F32, F32 → F16/BF16, F16 ↔ BF16, each only from a tensor of its source dtype). Its
//! *points* are the 16-byte windows at memory offsets `k × 2048` with `k mod 2M ∈ {0, 1}`:
//! every 2048 bytes for `M = 1`, and a pair of points every `4096 × M` bytes when the file
//! is too large to index densely (at most [`MAX_POINTS`] points in all).
//!
//! Memory is sampled one page in `S` (the *stride*), and in each sampled page the 16-byte
//! windows starting in its first 2048 bytes at the allowed byte *residues* (positions mod
//! 16, from the tensors' file offsets and the allocation alignment) are looked up. A copy
//! covering a sampled page always puts a point there when `M = 1`; for `M > 1` the sampled
//! pages step through the copy's `M` page classes (`S` odd, `M` a power of two, so `S` and
//! `M` are coprime), so any copy run of at least `M × S + 1` pages is hit: no probability
//! involved. [`plan`] picks `S` so that the tensors holding 99% of a file's bytes are at
//! least that long; smaller tensors are found when a neighbour in the same copy is (run
//! extension in `sweep`), or with `S = 1` (`dupes`, `--exact`).
//!
//! *Small* pieces (under [`SMALL`] bytes in memory, down to [`SMALL_MIN`]) may lie wholly
//! in the second half of a page. They are indexed like the others (a point at 0, and at
//! 2048 when they reach it), and with `S = 1` every window of a sampled page at the
//! allocation alignment is looked up, not only those of its first half: a runtime that
//! keeps each small tensor in an allocation of its own (onnxruntime's initializers) has
//! each of them found. A file whose small pieces hold [`SMALL_SHARE`] of its bytes or more
//! is sampled at every page.
//!
//! *Runs*: bytes of a file's data that no parsed tensor covers are searched as blocks at
//! any byte alignment ([`super::runs`]).

use super::filebytes::FileBytes;
use super::index::{is_point, periodic, Convert, CopyKind, FileContext, Slot, Unsearchable};
pub use super::index::{Layouts, Piece};
use super::pointcache::{kept_points, merge_points, PointCache};
use super::runs::searchable_tensors;
use super::transform::{grouped_from, Grouped};
use crate::container::{Format, Tensor};

pub const WIN: usize = 16;
/// Spacing of points, and the part of each sampled page whose windows are looked up.
pub const HALF: u64 = 2048;
/// Bytes read per sampled page: every window starting in its first half.
pub const SAMPLE_LEN: usize = HALF as usize + WIN;
/// The sampled page (4 KiB whatever the system's page size).
pub use crate::sample::PAGE_BYTES as PAGE;
/// Most points indexed over all files (the table takes 32 bytes per point).
pub const MAX_POINTS: u64 = 1 << 20;
/// Largest stride (pages). For a given guaranteed run `M × S` is fixed, so a larger `S`
/// reads fewer samples and indexes more points (at most [`MAX_POINTS`]): at 127 a search
/// reads one present page in 127. Confirmation does not follow it past
/// [`super::compare::CONFIRM_STRIDE`].
pub const MAX_STRIDE: u64 = 127;

/// Smallest piece searched for, in memory: fewer bytes could match by coincidence.
pub const SMALL_MIN: u64 = 256;
/// Pieces shorter than this (in memory) can lie wholly in the second half of a page: with
/// stride 1 they are looked up over whole pages.
pub const SMALL: u64 = HALF + WIN as u64;
/// A file whose pieces under a page hold this share of its indexed bytes or more is
/// sampled at every page (its small tensors have no guaranteed run).
pub const SMALL_SHARE: f64 = 0.1;

/// A file as the grid sees it.
pub struct GridFile {
    pub bytes: FileBytes,
    pub tensors: Vec<Tensor>,
    /// Tensors from this index on are runs of the file's bytes (see the module docs).
    pub runs_from: usize,
    pub format: Format,
    /// Pieces of this file that could not be indexed, with the reason.
    pub unsearchable: Vec<(usize, CopyKind, Unsearchable)>,
    /// Guaranteed run length in pages (see the module docs).
    pub run_pages: u64,
    /// Why the file could not be indexed (it shrank or vanished while being read): its
    /// copies are then unknown, and no other file is affected.
    pub error: Option<String>,
}

pub struct Grid {
    pub files: Vec<GridFile>,
    pub pieces: Vec<Piece>,
    table: Vec<Slot>,
    /// Points in `table` (counted once, when it is built: a profile line must not walk it).
    point_count: u64,
    mask: usize,
    filter: Vec<u64>,
    filter_mask: u64,
    /// `M`: a pair of points every `M` pages.
    pub every: u64,
    /// `S`: pages between samples, planned with `M` (1 when built exact).
    pub stride: u64,
    /// Bit `r` set: windows at positions `≡ r (mod 16)` are looked up.
    pub residues: u16,
    /// Positions in a sampled page to look up.
    pub positions: Vec<u16>,
    /// Positions in a whole sampled page to look up when every page is sampled and the
    /// grid has small pieces: [`Grid::positions`], then the second half at the allocation
    /// alignment.
    pub page_positions: Vec<u16>,
    /// Some piece is shorter than [`SMALL`] in memory.
    pub small: bool,
    /// A file's small pieces hold [`SMALL_SHARE`] of its bytes or more: every page is
    /// sampled for them (at [`Grid::small_positions`]), and one in `stride` in full.
    pub dense_small: bool,
    /// Positions over a whole page at the allocation alignment (small pieces).
    pub small_positions: Vec<u16>,
    /// Per piece: the previous and next identical pieces of its file with information, in
    /// file order (a small copy extends to the whole file's only when a neighbour is there).
    pub prev: Vec<Option<usize>>,
    pub next: Vec<Option<usize>>,
    /// Per piece: some point of it carries information (it is not [`Unsearchable::LowEntropy`]).
    pub informative: Vec<bool>,
}

/// Bits of the table's filter per point. With three bits set per key in one word the
/// filter passes about 0.6% of windows that hold no point at 16 bits (one bit per key
/// passed 6%), at one cache line per window either way.
pub const FILTER_BITS_PER_POINT: u64 = 16;

/// The word of the filter (`mask`: words - 1) and the three bits of `key` in it. The word
/// comes from the key's high half, the bits from a second mix, so neither follows the
/// table's slot (the key's low bits).
#[inline]
fn filter_probe(key: u64, mask: u64) -> (usize, u64) {
    let g = key.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    let bits = (1u64 << (g >> 58)) | (1u64 << ((g >> 52) & 63)) | (1u64 << ((g >> 46) & 63));
    (((key >> 32) & mask) as usize, bits)
}

/// Hash of a 16-byte window (never 0: 0 marks an empty slot). Collisions only cost a
/// comparison: every candidate is confirmed against the file.
#[inline]
pub fn hash(w: &[u8]) -> u64 {
    let mut a = [0u8; 8];
    let mut b = [0u8; 8];
    a.copy_from_slice(&w[..8]);
    b.copy_from_slice(&w[8..16]);
    let (a, b) = (u64::from_le_bytes(a), u64::from_le_bytes(b));
    let mut h = (a.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ b.rotate_left(31))
        .wrapping_mul(0xC2B2_AE3D_27D4_EB4F);
    h ^= h >> 29;
    h | 1
}

/// Whether pieces under a page hold [`SMALL_SHARE`] of these bytes or more.
fn small_heavy(lens: &[u64]) -> bool {
    let all: u64 = lens.iter().sum();
    let small: u64 = lens.iter().filter(|l| **l < PAGE).sum();
    all > 0 && small as f64 >= SMALL_SHARE * all as f64
}

/// The guaranteed run of a file, in pages: tensors of a page or more at least this long
/// hold 99% of their bytes (smaller ones: see [`Grid::dense_small`]).
fn run_pages(mut lens: Vec<u64>) -> u64 {
    lens.retain(|l| *l >= PAGE);
    lens.sort_unstable_by(|a, b| b.cmp(a));
    let total: u64 = lens.iter().sum();
    let mut acc = 0u64;
    for l in lens {
        acc += l;
        if acc as f64 >= 0.99 * total as f64 {
            return l / PAGE;
        }
    }
    0
}

/// Stride `S` and pair spacing `M` for a guaranteed run of `run` pages: every copy of at
/// least `M × S + 1` pages is hit. `S` as large as it may be (fewest samples), then `M` as
/// large as `S` allows (fewest points), never below `min_every` (the cap on points). `M` is
/// a power of two and `S` odd when `M > 1`, so they are coprime.
pub fn plan(run: u64, min_every: u64) -> (u64, u64) {
    let budget = run.saturating_sub(1).max(1);
    let mut s = (budget / min_every).clamp(1, MAX_STRIDE);
    let mut m = min_every;
    while m * 2 * s <= budget {
        m *= 2;
    }
    if m > 1 && s % 2 == 0 {
        s -= 1;
    }
    (s.max(1), m)
}

/// Which pages a sweep samples, and which windows of each it looks up.
pub struct Sampling<'a> {
    /// Pages between samples.
    pub step: u64,
    /// Pages between samples looked up at `full` (the others at `between`).
    pub stride: u64,
    pub full: &'a [u16],
    pub between: &'a [u16],
    /// Bytes read per sampled page.
    pub len: usize,
}

impl Sampling<'_> {
    /// Positions to look up in the page at `addr`.
    pub fn positions(&self, addr: u64) -> &[u16] {
        if (addr / PAGE) % self.stride == 0 {
            self.full
        } else {
            self.between
        }
    }
}

/// Per piece, the previous and next identical informative pieces of the same file by file
/// offset.
type Links = Vec<Option<usize>>;
fn neighbours(pieces: &[Piece], informative: &[bool]) -> (Links, Links) {
    let mut order: Vec<usize> = (0..pieces.len())
        .filter(|&i| pieces[i].kind == CopyKind::Identical && informative[i])
        .collect();
    order.sort_by_key(|&i| (pieces[i].file, pieces[i].file_offset));
    let mut prev = vec![None; pieces.len()];
    let mut next = vec![None; pieces.len()];
    for w in order.windows(2) {
        if pieces[w[0]].file == pieces[w[1]].file {
            next[w[0]] = Some(w[1]);
            prev[w[1]] = Some(w[0]);
        }
    }
    (prev, next)
}

impl Grid {
    /// Indexes `files` (their tensor tables). `align`: allocation alignment of copies
    /// (16 for malloc'd buffers); `layouts`: the conversions indexed too; `exact`:
    /// every tensor of 4 KiB or more must be found with every page sampled (`dupes`),
    /// else the stride and the point spacing are planned together (see [`Grid::stride`]).
    pub fn build(
        files: Vec<(FileBytes, Vec<Tensor>, Format)>,
        align: u64,
        layouts: Layouts,
        exact: bool,
    ) -> std::io::Result<Grid> {
        Grid::build_cached(files, align, layouts, exact, None)
    }

    /// [`Grid::build`], taking the points of files `points` keeps instead of reading them
    /// (and keeping those it reads there).
    pub fn build_cached(
        files: Vec<(FileBytes, Vec<Tensor>, Format)>,
        align: u64,
        layouts: Layouts,
        exact: bool,
        points: Option<&PointCache>,
    ) -> std::io::Result<Grid> {
        let mut pieces = Vec::new();
        let mut grid_files = Vec::new();
        let mut residues: u16 = 0;
        let align = align.clamp(1, WIN as u64);
        for r in (0..WIN as u64).step_by(align as usize) {
            residues |= 1 << r;
        }
        // Small pieces are looked up in the second half of pages at the alignment only: on
        // their own they lie in allocations; within a copy of the file, run extension
        // finds them from a neighbour.
        let aligned = residues;
        let mut small = false;
        for (fi, (bytes, tensors, format)) in files.into_iter().enumerate() {
            let (tensors, runs_from) = searchable_tensors(&format, tensors, bytes.size);
            let mut unsearchable = Vec::new();
            let ctx = FileContext::of(&format, &tensors);
            for (ti, t) in tensors.iter().enumerate() {
                for kind in layouts.kinds_of(t, &ctx) {
                    let mem_len = kind.mem_bytes(t.len);
                    if mem_len < SMALL_MIN {
                        unsearchable.push((ti, kind, Unsearchable::TooSmall));
                        continue;
                    }
                    small |= mem_len < SMALL;
                    if kind == CopyKind::Identical {
                        if ti >= runs_from {
                            // A run of bytes of unknown structure, at any byte alignment.
                            residues = u16::MAX;
                        }
                        residues |= 1 << (t.offset % WIN as u64);
                    }
                    pieces.push(Piece {
                        file: fi,
                        tensor: ti,
                        kind,
                        file_offset: t.offset,
                        mem_len,
                    });
                }
            }
            grid_files.push(GridFile {
                bytes,
                tensors,
                runs_from,
                format,
                unsearchable,
                run_pages: 0,
                error: None,
            });
        }
        // Guaranteed run per file: the length above which the tensors hold 99% of its
        // bytes; the smallest over the files bounds stride × spacing.
        let mut dense_small = false;
        for (fi, gf) in grid_files.iter_mut().enumerate() {
            let lens: Vec<u64> = pieces
                .iter()
                .filter(|p| p.file == fi)
                .map(|p| p.mem_len)
                .collect();
            dense_small |= small_heavy(&lens);
            gf.run_pages = run_pages(lens);
        }
        let run = grid_files
            .iter()
            .map(|f| f.run_pages)
            .filter(|r| *r > 0)
            .min()
            .unwrap_or(1);
        let all_points: u64 = pieces.iter().map(|p| p.mem_len / HALF + 1).sum();
        let mut cap_every = 1u64;
        while all_points / cap_every > MAX_POINTS {
            cap_every *= 2;
        }
        let (stride, every) = if exact {
            (1, cap_every)
        } else {
            plan(run, cap_every)
        };
        // The points, read in parts of pieces side by side (a part starts a pair of
        // points, so parts read exactly what one pass would), kept in the order of one pass.
        // Files whose points are kept (read earlier in this run, or on disk) are not read.
        let handles: Vec<&std::fs::File> = grid_files.iter().map(|f| f.bytes.file()).collect();
        let kept = kept_points(&handles, &pieces, every, points);
        let part_k = 2 * every * 1024;
        let parts: Vec<(usize, u64)> = pieces
            .iter()
            .enumerate()
            .filter(|(_, p)| kept.got[p.file].is_none())
            .flat_map(|(pi, p)| {
                let ks = (p.mem_len / HALF).div_ceil(part_k).max(1);
                (0..ks).map(move |i| (pi, i * part_k))
            })
            .collect();
        let files_ref = &grid_files;
        let pieces_ref = &pieces;
        let read = crate::collect::par_map_on(
            crate::collect::proof_threads(),
            &parts,
            |&(pi, k0)| -> Result<(Vec<Slot>, bool), String> {
                // A stop asked (SIGTERM to serve or record) ends the index here.
                if crate::collect::stop::stopping() {
                    return Err("not indexed: twofold is stopping".into());
                }
                let p = &pieces_ref[pi];
                let (mut keys, mut span, mut mem) = (Vec::new(), Vec::new(), Vec::new());
                let mut all_periodic = true;
                // The memory range whose groups of rows `span` holds (repacked pieces).
                let mut have: Option<(u64, u64)> = None;
                // Points come in pairs 2048 bytes apart: one read per pair.
                let mut k = k0;
                while k < k0 + part_k && k * HALF + WIN as u64 <= p.mem_len {
                    if !is_point(k, every) {
                        // Straight to the next pair (one by one took minutes on 15 TiB).
                        k = k.next_multiple_of(2 * every);
                        continue;
                    }
                    let m = k * HALF;
                    let span_mem = (HALF + WIN as u64).min(p.mem_len - m);
                    let grouped = p.kind.grouped();
                    if grouped {
                        // Made from the groups of rows under the windows, read once for the
                        // whole part where its points are dense enough to need every group
                        // (else for each pair).
                        let (fg, g) = p.kind.granule();
                        let need = (m + HALF + WIN as u64).min(p.mem_len);
                        if !have.is_some_and(|(a, b)| a <= m && need <= b) {
                            let to = if g <= 2 * PAGE * every {
                                ((k0 + part_k) * HALF + WIN as u64).min(p.mem_len)
                            } else {
                                need
                            };
                            let (a, b) = (m / g, to.div_ceil(g).min(p.mem_len.div_ceil(g)));
                            span.resize(((b - a) * fg) as usize, 0);
                            files_ref[p.file]
                                .bytes
                                .read_exact_at(&mut span, p.file_offset + a * fg)
                                .map_err(|e| format!("the file could not be read: {e}"))?;
                            have = Some((a * g, b * g));
                        }
                    } else {
                        span.resize(p.kind.file_bytes(span_mem) as usize, 0);
                        files_ref[p.file]
                            .bytes
                            .read_exact_at(&mut span, p.file_offset + p.kind.file_bytes(m))
                            .map_err(|e| format!("the file could not be read: {e}"))?;
                    }
                    for (j, at) in [(k, 0u64), (k + 1, HALF)] {
                        if at + WIN as u64 > span_mem || !is_point(j, every) {
                            continue;
                        }
                        if grouped {
                            mem.resize(WIN, 0);
                            let base = have.map_or(0, |h| h.0);
                            grouped_from(p.kind, &span, base, m + at, &mut mem)
                                .map_err(|e| format!("the file could not be read: {e}"))?;
                        } else {
                            let from = p.kind.file_bytes(at) as usize;
                            let to = from + p.kind.file_bytes(WIN as u64) as usize;
                            p.kind.convert(&span[from..to], &mut mem);
                        }
                        if !periodic(&mem) {
                            all_periodic = false;
                            keys.push(Slot {
                                key: hash(&mem),
                                piece: pi as u32,
                                k: j as u32,
                            });
                        }
                    }
                    k += 2;
                }
                Ok((keys, all_periodic))
            },
        );
        let mut by_file: Vec<Vec<Slot>> = vec![Vec::new(); grid_files.len()];
        let mut low_entropy = vec![true; pieces.len()];
        for (&(pi, _), r) in parts.iter().zip(read) {
            match r {
                Ok((k, all_periodic)) => {
                    low_entropy[pi] &= all_periodic;
                    by_file[pieces[pi].file].extend(k);
                }
                Err(e) => {
                    let f = &mut grid_files[pieces[pi].file];
                    f.error.get_or_insert(e);
                }
            }
        }
        // The index is read: no block or mapped page of the files stays in twofold's memory.
        for f in &grid_files {
            f.bytes.release();
        }
        let failed: Vec<bool> = grid_files.iter().map(|f| f.error.is_some()).collect();
        let keys = merge_points(&failed, &kept, by_file, every, points, &mut low_entropy);
        for (pi, p) in pieces.iter().enumerate() {
            if grid_files[p.file].error.is_some() {
                continue;
            }
            if low_entropy[pi] {
                grid_files[p.file]
                    .unsearchable
                    .push((p.tensor, p.kind, Unsearchable::LowEntropy));
            }
        }
        let cap = (keys.len() * 2).next_power_of_two().max(16);
        let mask = cap - 1;
        let mut table = vec![Slot::default(); cap];
        let fbits = (keys.len() as u64 * FILTER_BITS_PER_POINT)
            .next_power_of_two()
            .max(4096);
        let mut filter = vec![0u64; (fbits / 64) as usize];
        let filter_mask = fbits / 64 - 1;
        let point_count = keys.iter().filter(|s| s.key != 0).count() as u64;
        for s in keys {
            let mut i = s.key as usize & mask;
            while table[i].key != 0 {
                i = (i + 1) & mask;
            }
            table[i] = s;
            let (w, bits) = filter_probe(s.key, filter_mask);
            filter[w] |= bits;
        }
        let positions: Vec<u16> = (0..HALF as u16)
            .filter(|d| residues & (1 << (d % WIN as u16)) != 0)
            .collect();
        let at_alignment = |d: &u16| aligned & (1 << (d % WIN as u16)) != 0;
        let (page_positions, small_positions) = if small {
            let second = (HALF as u16..=(PAGE - WIN as u64) as u16).filter(at_alignment);
            (
                positions.iter().copied().chain(second).collect(),
                (0..=(PAGE - WIN as u64) as u16)
                    .filter(at_alignment)
                    .collect(),
            )
        } else {
            (Vec::new(), Vec::new())
        };
        let informative: Vec<bool> = low_entropy.iter().map(|l| !l).collect();
        let (prev, next) = neighbours(&pieces, &informative);
        Ok(Grid {
            files: grid_files,
            pieces,
            table,
            point_count,
            mask,
            filter,
            filter_mask,
            every,
            stride,
            residues,
            positions,
            page_positions,
            small,
            dense_small: dense_small && small,
            small_positions,
            prev,
            next,
            informative,
        })
    }

    /// How a sweep with one page in `stride` sampled in full samples memory.
    pub fn sampling(&self, stride: u64) -> Sampling<'_> {
        let stride = stride.max(1);
        if self.small && (stride == 1 || self.dense_small) {
            Sampling {
                step: 1,
                stride,
                full: &self.page_positions,
                between: &self.small_positions,
                len: PAGE as usize,
            }
        } else {
            Sampling {
                step: stride,
                stride,
                full: &self.positions,
                between: &[],
                len: SAMPLE_LEN,
            }
        }
    }

    /// Bytes its table and filter take (what keeping it costs).
    pub fn table_bytes(&self) -> u64 {
        (self.table.len() * std::mem::size_of::<Slot>() + self.filter.len() * 8) as u64
    }

    /// Number of points indexed.
    pub fn points(&self) -> u64 {
        self.point_count
    }

    /// Whether `key` may be in the table: a blocked Bloom filter (three bits in one
    /// 64-bit word per key, [`FILTER_BITS_PER_POINT`] bits per point) that fits in a
    /// core's cache, so that most windows of memory that hold no point never touch the
    /// table.
    #[inline]
    pub fn maybe(&self, key: u64) -> bool {
        let (w, bits) = filter_probe(key, self.filter_mask);
        self.filter[w] & bits == bits
    }

    /// Calls `hit(piece, memory offset of the point in the piece)` for every point with
    /// this key.
    #[inline]
    pub fn lookup(&self, key: u64, mut hit: impl FnMut(usize, u64)) {
        let mut i = key as usize & self.mask;
        loop {
            let s = self.table[i];
            if s.key == 0 {
                return;
            }
            if s.key == key {
                hit(s.piece as usize, u64::from(s.k) * HALF);
            }
            i = (i + 1) & self.mask;
        }
    }

    /// Bytes the index occupies.
    pub fn bytes(&self) -> usize {
        self.table.len() * std::mem::size_of::<Slot>()
            + self.filter.len() * 8
            + self.pieces.len() * std::mem::size_of::<Piece>()
    }
}

#[cfg(test)]
#[path = "grid_tests.rs"]
mod tests;
