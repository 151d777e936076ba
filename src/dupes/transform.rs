//! The bytes of a copy in another form, made from the file's: a dtype conversion element by
//! element, a llama.cpp repack ([`crate::container::repack`]) or AMX tiles
//! ([`crate::container::repack::amx`]) group of rows by group of rows. What the index
//! ([`super::grid`]) hashes and comparisons ([`super::compare`]) check.

use super::filebytes::FileBytes;
use super::index::{Convert, CopyKind};
use crate::container::repack::amx::{pack_tile, AmxLayout, TILE_ROWS};
use crate::container::repack::{interleave, origin, Layout, MAX_ROWS};

/// Bytes `[m, m + out.len())` of a piece's memory (`m` from the start of its copy) as
/// `kind` makes them from the file's bytes at `file_offset` (`mem_len` long in memory):
/// the whole units ([`CopyKind::granule`]) around them are read and converted, and the
/// part asked for is cut out. For a repack only the output blocks asked for are made,
/// each from its `R` source blocks (a few dozen bytes each, where a group of rows is
/// kilobytes).
pub fn expected(
    kind: CopyKind,
    bytes: &FileBytes,
    file_offset: u64,
    m: u64,
    src: &mut Vec<u8>,
    out: &mut [u8],
) -> std::io::Result<()> {
    if kind.grouped() {
        let (fg, mg) = kind.granule();
        let (u0, u1) = (m / mg, (m + out.len() as u64).div_ceil(mg));
        src.resize(((u1 - u0) * fg) as usize, 0);
        bytes.read_exact_at(src, file_offset + u0 * fg)?;
        return grouped_from(kind, src, u0 * mg, m, out);
    }
    let (fg, mg) = kind.granule();
    let n = out.len() as u64;
    let (u0, u1) = (m / mg, (m + n).div_ceil(mg));
    src.resize(((u1 - u0) * fg) as usize, 0);
    bytes.read_exact_at(src, file_offset + u0 * fg)?;
    let mut conv = Vec::new();
    kind.convert(src, &mut conv);
    let from = (m - u0 * mg) as usize;
    out.copy_from_slice(&conv[from..from + out.len()]);
    Ok(())
}

/// Whether a kind's bytes are made from groups of rows ([`grouped_from`]): a llama.cpp
/// repack of a tensor whose row length is known.
pub trait Grouped {
    fn grouped(self) -> bool;
}

impl Grouped for CopyKind {
    fn grouped(self) -> bool {
        matches!(
            self,
            CopyKind::Repacked { row_bytes, .. } | CopyKind::AmxPacked { row_bytes, .. }
                if row_bytes > 0
        )
    }
}

/// Bytes `[m, m + out.len())` of a piece of a grouped kind ([`Grouped`]), made from
/// `groups`: the file bytes of the whole groups from memory offset `base` (a multiple of
/// the kind's memory granule) on, covering the range.
pub fn grouped_from(
    kind: CopyKind,
    groups: &[u8],
    base: u64,
    m: u64,
    out: &mut [u8],
) -> std::io::Result<()> {
    match kind {
        CopyKind::Repacked { layout, row_bytes } => {
            repacked_from(layout, u64::from(row_bytes), groups, base, m, out)
        }
        CopyKind::AmxPacked { layout, row_bytes } => {
            let (_, mg) = kind.granule();
            amx_from(layout, u64::from(row_bytes), groups, base / mg, m, out)
        }
        _ => Err(std::io::Error::other("not a grouped kind")),
    }
}

/// [`grouped_from`] for AMX tiles: `groups` starts at group `first_group` (16 rows each).
fn amx_from(
    layout: AmxLayout,
    row_bytes: u64,
    groups: &[u8],
    first_group: u64,
    m: u64,
    out: &mut [u8],
) -> std::io::Result<()> {
    let s = layout.spec();
    let (tb, sb) = (s.tile_bytes() as u64, s.source_block_bytes as u64);
    let per_row = row_bytes / sb;
    let n = out.len() as u64;
    let first_row = first_group * TILE_ROWS as u64;
    let mut made = vec![0u8; tb as usize];
    let short = || std::io::Error::other("the groups read do not cover the range");
    for t in m / tb..(m + n).div_ceil(tb) {
        let (row, k) = ((t / per_row) * TILE_ROWS as u64, t % per_row);
        let row = row.checked_sub(first_row).ok_or_else(short)?;
        let mut picked: [&[u8]; TILE_ROWS] = [&[]; TILE_ROWS];
        for (r, p) in picked.iter_mut().enumerate() {
            let at = ((row + r as u64) * row_bytes + k * sb) as usize;
            *p = groups.get(at..at + sb as usize).ok_or_else(short)?;
        }
        pack_tile(layout, &picked, &mut made).map_err(std::io::Error::other)?;
        let (lo, hi) = ((t * tb).max(m), ((t + 1) * tb).min(m + n));
        out[(lo - m) as usize..(hi - m) as usize]
            .copy_from_slice(&made[(lo - t * tb) as usize..(hi - t * tb) as usize]);
    }
    Ok(())
}

/// Bytes `[m, m + out.len())` of a tensor repacked into `layout` (rows of `row_bytes`),
/// made from `groups`: the tensor's file bytes from offset `base` (a multiple of the
/// layout's group of rows) on, covering the groups under the range.
pub fn repacked_from(
    layout: Layout,
    row_bytes: u64,
    groups: &[u8],
    base: u64,
    m: u64,
    out: &mut [u8],
) -> std::io::Result<()> {
    let s = layout.spec();
    let (ob, sb) = (s.out_block_bytes() as u64, s.source_block_bytes as u64);
    let n = out.len() as u64;
    let first_row = base / row_bytes;
    let mut made = [0u8; MAX_ROWS * MAX_BLOCK];
    let made = &mut made[..ob as usize];
    let short = || std::io::Error::other("the groups read do not cover the range");
    for i in m / ob..(m + n).div_ceil(ob) {
        let Some((row, x, _)) = origin(layout, row_bytes as usize, (i * ob) as usize) else {
            return Err(std::io::Error::other("a row is no whole number of blocks"));
        };
        let row = (row as u64).checked_sub(first_row).ok_or_else(short)?;
        let mut picked: [&[u8]; MAX_ROWS] = [&[]; MAX_ROWS];
        for (r, p) in picked.iter_mut().enumerate().take(s.rows) {
            let at = ((row + r as u64) * row_bytes + x as u64 * sb) as usize;
            *p = groups.get(at..at + sb as usize).ok_or_else(short)?;
        }
        interleave(layout, &picked[..s.rows], made).map_err(std::io::Error::other)?;
        // The part of this block inside [m, m + n).
        let (lo, hi) = ((i * ob).max(m), ((i + 1) * ob).min(m + n));
        out[(lo - m) as usize..(hi - m) as usize]
            .copy_from_slice(&made[(lo - i * ob) as usize..(hi - i * ob) as usize]);
    }
    Ok(())
}

/// Largest source block of a repack layout (`Q4_K`: 144 bytes).
const MAX_BLOCK: usize = 144;

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::container::repack::amx;

    #[test]
    fn expected_bytes_of_a_repack_are_the_whole_repack_cut() {
        use crate::container::repack::repack;
        use std::io::Write;
        // 16 rows of 4 Q4_K blocks (576 bytes a row) after 100 bytes of something else.
        let (rows, row_bytes, at) = (16usize, 576usize, 100u64);
        let data: Vec<u8> = (0..rows * row_bytes + at as usize)
            .map(|i| ((i * 2_654_435_761usize) >> 7) as u8)
            .collect();
        let mut f = tempfile::NamedTempFile::new().unwrap();
        f.write_all(&data).unwrap();
        let bytes = FileBytes::open(f.path()).unwrap();
        let layout = Layout::Q4_K_8x8;
        let want = repack(layout, rows, row_bytes, &data[at as usize..]).unwrap();
        let kind = CopyKind::Repacked {
            layout,
            row_bytes: row_bytes as u32,
        };
        let mut src = Vec::new();
        for (m, n) in [(0, 16), (1150, 16), (1152, 1152), (4000, 4096), (9200, 16)] {
            let mut out = vec![0u8; n];
            expected(kind, &bytes, at, m as u64, &mut src, &mut out).unwrap();
            assert_eq!(out, want[m..m + n], "[{m}, +{n})");
        }
        // Whole groups through `convert` too; a group cut short is left out.
        let mut out = Vec::new();
        kind.convert(&data[at as usize..], &mut out);
        assert_eq!(out, want);
        kind.convert(
            &data[at as usize..at as usize + 8 * row_bytes + 10],
            &mut out,
        );
        assert_eq!(out, want[..8 * row_bytes]);
        // A dtype conversion through `expected`: the elements around the bytes asked for.
        let mut out = vec![0u8; 6];
        expected(CopyKind::WidenedF16, &bytes, 0, 3, &mut src, &mut out).unwrap();
        let mut all = Vec::new();
        CopyKind::WidenedF16.convert(&data[..8], &mut all);
        assert_eq!(out, all[3..9]);
    }

    #[test]
    fn expected_bytes_of_amx_tiles_are_the_whole_pack_cut() {
        use std::io::Write;
        // 32 rows of 3 Q8_0 blocks (102 bytes a row; a tile of 16 blocks grows 544 → 608).
        let (rows, row_bytes, at) = (32usize, 102usize, 7u64);
        let data: Vec<u8> = (0..rows * row_bytes + at as usize)
            .map(|i| ((i * 2_654_435_761usize) >> 9) as u8)
            .collect();
        let mut f = tempfile::NamedTempFile::new().unwrap();
        f.write_all(&data).unwrap();
        let bytes = FileBytes::open(f.path()).unwrap();
        let layout = AmxLayout::Q8_0;
        let want = amx::pack(layout, rows, row_bytes, &data[at as usize..]).unwrap();
        let kind = CopyKind::AmxPacked {
            layout,
            row_bytes: row_bytes as u32,
        };
        assert_eq!(kind.mem_bytes((rows * row_bytes) as u64), want.len() as u64);
        assert_eq!(kind.granule(), (16 * 102, 3 * 608));
        let mut src = Vec::new();
        for (m, n) in [(0, 16), (600, 16), (1800, 100), (2000, 1648)] {
            let mut out = vec![0u8; n];
            expected(kind, &bytes, at, m as u64, &mut src, &mut out).unwrap();
            assert_eq!(out, want[m..m + n], "[{m}, +{n})");
        }
        let mut out = Vec::new();
        kind.convert(&data[at as usize..], &mut out);
        assert_eq!(out, want);
    }
}
