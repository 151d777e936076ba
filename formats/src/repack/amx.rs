//! llama.cpp's **AMX** weight packing (ggml-cpu's `AMX` "extra" buffer, `ggml-cpu/amx/`), as
//! pure functions: which tensors that buffer takes, how big the packed copy is, and its bytes,
//! recomputed from the tensor's bytes in the GGUF file.
//!
//! A ggml-cpu built with `GGML_AMX_INT8` and AVX512-VNNI (the `sapphirerapids` variant of the
//! release packages, or `-march=native` on such a host) lists an `AMX` buffer type **before**
//! `CPU_REPACK`, where the kernel grants the process AMX tile state (`ggml_amx_init`:
//! `arch_prctl(ARCH_REQ_XCOMP_PERM)`). llama.cpp places a weight there when its `MUL_MAT`
//! passes the buffer's `supports_op` ([`choose`]). `ggml_backend_amx_buffer_set_tensor` then
//! writes the weight packed into the VNNI tiles the AMX kernels load
//! (`ggml_backend_amx_convert_weight` → `convert_B_packed_format` → `pack_B`), while the
//! mapped file pages stay resident: a second, transformed copy of the weight.
//!
//! # The unit of independence: a tile
//!
//! ggml packs a tensor of `N` rows (`ne[1]`) of `KB` blocks (`ne[0] / block_elements`) as
//! `N / 16 × KB` tiles. Tile `t` is built from block `k = t % KB` of the 16 rows
//! `16·(t / KB) .. 16·(t / KB) + 16`, and nothing else; it is the output bytes
//! `t·tile_bytes .. (t + 1)·tile_bytes` (ggml's `PACKED_INDEX(n, k, KB, TILE_SIZE)`). [`tile`]
//! and [`tile_at`] give a tile's output range and its 16 source byte ranges (one block of each
//! row, relative to the tensor's first byte in the file); [`pack_tile`] computes one tile from
//! those 16 blocks; [`pack`] does a whole tensor. A proof reads the 16 blocks of a tile and
//! compares [`pack_tile`]'s bytes with process memory: the packed bytes share no run longer
//! than a few bytes with the file (the quants are transposed 4 bytes at a time and re-paired
//! into nibbles), so searching for file bytes cannot find them.
//!
//! # The size changes
//!
//! Unlike `CPU_REPACK`, a packed tile can be larger than its 16 source blocks: the size is
//! `ggml_backend_amx_get_alloc_size` = `N × KB × packed_block_bytes` ([`packed_size`]), where
//! a block gains [`AmxSpec::extra_bytes`] (ggml's `get_row_size`):
//!
//! | layout | source block | packed block | tile | packed / file |
//! |---|---|---|---|---|
//! | `amx_q4_0` | 18 | 18 | 288 | 1 |
//! | `amx_q4_1` | 20 | 20 | 320 | 1 |
//! | `amx_q8_0` | 34 | 38 (+ int32 compensation) | 608 | 38/34 ≈ 1.118 |
//! | `amx_q4_K` | 144 | 148 (scales and mins as bytes) | 2368 | 148/144 ≈ 1.028 |
//! | `amx_q5_K` | 176 | 180 (scales and mins as bytes) | 2880 | 180/176 ≈ 1.023 |
//! | `amx_q6_K` | 210 | 210 | 3360 | 1 |
//! | `amx_iq4_xs` | 136 | 138 (scales as bytes) | 2208 | 138/136 ≈ 1.015 |
//!
//! `F16` weights also go to the AMX buffer (for its AVX-512 kernel), copied unchanged
//! ([`AmxChoice::Copied`]): a byte-identical copy, found by searching rather than recomputing.
//! The buffer's total relative to the file depends on the model's mix of types and on which
//! tensors qualify (norms, `GET_ROWS` lookups, `MUL_MAT_ID` experts and rows not a multiple
//! of 32 stay out; a tied `token_embd` goes in once more as the output).
//!
//! # Inside a tile
//!
//! Each source block is first read as its `block_elements` quantised values `e[n][i]` (row
//! `n` of the 16, element `i` in ggml's order; unsigned: 4 bits, 5 for `Q5_K`, 6 for `Q6_K`,
//! `Q8_0`'s signed bytes as they are; no `- 8`, no codebook for `IQ4_XS`). Then, all offsets
//! within the tile, `n` in `0..16`, `j` in `0..4`:
//! - **4-bit quants** (every type but `Q8_0`; the low 4 bits for `Q5_K` and `Q6_K`): byte
//!   `64·p + 4·n + j` is `e[n][8p + j] & 15 | (e[n][8p + 4 + j] & 15) << 4`, for each group
//!   `p` of 8 elements: the VNNI layout (4 consecutive elements of one row, the 16 rows in
//!   turn) with two such words paired into one byte. `16 × elements / 2` bytes.
//! - **`Q8_0`**: byte `64·w + 4·n + j` is `e[n][4w + j]` (512 bytes).
//! - **`Q5_K` high bits** at 2048: byte `64·g + 4·n + j` holds, in bit `i`, bit 4 of
//!   `e[n][32g + 4i + j]` (8 groups of 32: 512 bytes).
//! - **`Q6_K` high bits** at 2048: byte `64·g + 4·n + j` holds, in bits `2i, 2i+1`, bits 4–5
//!   of `e[n][16g + 4i + j]` (16 groups of 16: 1024 bytes).
//! - then the per-row values, each an array over the 16 rows:
//!   - `Q4_0`: `d[16]` (fp16, copied). `Q4_1`: `d[16]`, `m[16]`.
//!   - `Q8_0`: `d[16]`, then `comp[16]`: `128 × Σ e[n][i]` (signed bytes) as little-endian
//!     int32, the "s8s8 compensation" ggml computes with `_mm512_dpbusd_epi32`.
//!   - `Q4_K`, `Q5_K`: the 6-bit scales and mins unpacked to bytes: `scales[8][16]` (sub-block
//!     `s` of row `n` at `16·s + n`), `mins` with the pairs of sub-blocks interleaved (`min_s`
//!     of row `n` at `32·(s / 2) + 2·n + s % 2`), then `d[16]`, `dmin[16]`.
//!   - `Q6_K`: `scales[16][16]` (scale `s` of row `n` at `16·s + n`, copied), `d[16]`.
//!   - `IQ4_XS`: `scales[8][16]`, each the 6-bit scale less 32 as a signed byte, `d[16]`.
//!
//! # Where this comes from, and how it is checked
//!
//! Learned from `ggml/src/ggml-cpu/amx/` of llama.cpp as vendored by `llama-cpp-python`
//! 0.3.36 (llama.cpp commit `0c1e570`): `amx.cpp` (the buffer type, `supports_op`,
//! `set_tensor`), `common.h` (`qtype_has_amx_kernels`, `TILE_N` = 16) and `mmq.cpp`
//! (`get_tile_size`, `get_row_size`, `ggml_backend_amx_get_alloc_size`,
//! `convert_B_packed_format`, `pack_qs`, `pack_B`, `s8s8_compensation`,
//! `unpack_mins_and_scales`). The code here is written from that description, not copied.
//!
//! Every layout is tested byte for byte against bytes ggml's own packing wrote
//! (`formats/tests/fixtures/repack/amx_*`, made by `scripts/amx-golden.sh` through
//! `tests/runtimes/amx_dump.cpp`, from a ggml-cpu built with `GGML_AMX_INT8=ON` and AVX-512).
//! The machines here advertise AVX-512 but raise SIGILL on AMX instructions and their kernel
//! grants no AMX state, so ggml lists no `AMX` buffer type there: the golden vectors come
//! from calling the two functions that buffer type calls (`ggml_backend_amx_get_alloc_size`
//! and `ggml_backend_amx_convert_weight`), which pack with AVX2/AVX-512 only. The path through
//! `ggml_backend_tensor_set` and the choice of tensors ([`choose`], from `supports_op` and
//! llama.cpp's `weight_buft_supported`) are read from the source, not run.
//!
//! Not modelled: tensors whose packed offsets overflow ggml's `int` arithmetic (a packed tensor
//! past 2 GiB: [`RepackError::IndexOverflow`]); ggml's behaviour there is undefined.

use std::ops::Range;

use super::RepackError;

mod choose;
#[cfg(test)]
mod tests;

pub use choose::{choose, AmxChoice};

/// Rows packed into one tile (ggml's `TILE_N`).
pub const TILE_ROWS: usize = 16;

/// A weight type ggml's AMX buffer packs (`qtype_has_amx_kernels`), named `amx_TYPE`.
#[allow(non_camel_case_types)] // ggml's type names read better than CamelCase here
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum AmxLayout {
    /// `Q4_0`: nibbles and `d`; the size is kept.
    Q4_0,
    /// `Q4_1`: nibbles, `d` and `m`; the size is kept.
    Q4_1,
    /// `Q8_0`: bytes, `d` and an int32 compensation per row (38/34 of the file).
    Q8_0,
    /// `Q4_K`: nibbles, byte scales and mins, `d`, `dmin` (148/144).
    Q4_K,
    /// `Q5_K`: nibbles, high bits, byte scales and mins, `d`, `dmin` (180/176).
    Q5_K,
    /// `Q6_K`: nibbles, 2 high bits, scales, `d`; the size is kept.
    Q6_K,
    /// `IQ4_XS`: codebook indices as nibbles, byte scales, `d` (138/136).
    IQ4_XS,
}

/// What an [`AmxLayout`] is made of.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AmxSpec {
    /// The name used in reports (`amx_q4_1`); ggml logs `amx repack tensor NAME of type q4_1`.
    pub name: &'static str,
    /// The source type as [`crate::gguf::ggml_type`] names it (`Q4_1`).
    pub source_type: &'static str,
    /// Elements in one source block (32, or 256 for the K-quants and `IQ4_XS`).
    pub block_elements: usize,
    /// Bytes of one source block.
    pub source_block_bytes: usize,
    /// Bytes the packing adds per source block (ggml's `get_row_size` less `sizeof(block)`).
    pub extra_bytes: usize,
}

impl AmxSpec {
    /// Bytes a source block takes once packed.
    pub const fn packed_block_bytes(&self) -> usize {
        self.source_block_bytes + self.extra_bytes
    }

    /// Bytes of one tile: 16 packed blocks (ggml's `get_tile_size`).
    pub const fn tile_bytes(&self) -> usize {
        TILE_ROWS * self.packed_block_bytes()
    }

    /// Packed bytes per file byte of a packed tensor (`1.0` where the size is kept).
    pub fn ratio(&self) -> f64 {
        self.packed_block_bytes() as f64 / self.source_block_bytes as f64
    }
}

const fn amx(
    name: &'static str,
    source_type: &'static str,
    block_elements: usize,
    source_block_bytes: usize,
    extra_bytes: usize,
) -> AmxSpec {
    AmxSpec {
        name,
        source_type,
        block_elements,
        source_block_bytes,
        extra_bytes,
    }
}

impl AmxLayout {
    /// Every layout, in declaration order.
    pub const ALL: [AmxLayout; 7] = [
        AmxLayout::Q4_0,
        AmxLayout::Q4_1,
        AmxLayout::Q8_0,
        AmxLayout::Q4_K,
        AmxLayout::Q5_K,
        AmxLayout::Q6_K,
        AmxLayout::IQ4_XS,
    ];

    /// The registry: what this layout is made of.
    pub const fn spec(self) -> AmxSpec {
        match self {
            AmxLayout::Q4_0 => amx("amx_q4_0", "Q4_0", 32, 18, 0),
            AmxLayout::Q4_1 => amx("amx_q4_1", "Q4_1", 32, 20, 0),
            AmxLayout::Q8_0 => amx("amx_q8_0", "Q8_0", 32, 34, 4),
            AmxLayout::Q4_K => amx("amx_q4_K", "Q4_K", 256, 144, 4),
            AmxLayout::Q5_K => amx("amx_q5_K", "Q5_K", 256, 176, 4),
            AmxLayout::Q6_K => amx("amx_q6_K", "Q6_K", 256, 210, 0),
            AmxLayout::IQ4_XS => amx("amx_iq4_xs", "IQ4_XS", 256, 136, 2),
        }
    }

    /// The layout named `name` (`amx_q4_1`).
    pub fn from_name(name: &str) -> Option<AmxLayout> {
        AmxLayout::ALL.into_iter().find(|l| l.spec().name == name)
    }

    /// The layout of source type `tensor_type` (`Q4_1`), if ggml's AMX buffer packs it.
    pub fn from_source_type(tensor_type: &str) -> Option<AmxLayout> {
        AmxLayout::ALL
            .into_iter()
            .find(|l| l.spec().source_type == tensor_type)
    }

    /// For reports: `repacked by llama.cpp's AMX backend (Q4_1 → amx_q4_1)`.
    pub fn describe(self) -> String {
        let s = self.spec();
        format!(
            "repacked by llama.cpp's AMX backend ({} → {})",
            s.source_type, s.name
        )
    }
}

/// Bytes of a `rows` × `cols` tensor packed into `layout` (`ggml_backend_amx_get_alloc_size`:
/// `rows × cols / block_elements × packed_block_bytes`). `None` if `cols` is no whole number
/// of blocks or the size overflows a `u64`.
pub fn packed_size(layout: AmxLayout, rows: u64, cols: u64) -> Option<u64> {
    let s = layout.spec();
    let elems = s.block_elements as u64;
    if cols % elems != 0 {
        return None;
    }
    rows.checked_mul(cols / elems)?
        .checked_mul(s.packed_block_bytes() as u64)
}

/// One tile of a packed tensor: where its bytes go and the file bytes it is made of.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Tile {
    /// The tile's index `t` (ggml's `n · KB + k`).
    pub index: usize,
    /// The first of the 16 source rows (`16 · (t / KB)`).
    pub first_row: usize,
    /// The block column `k` (`t % KB`).
    pub block: usize,
    /// The tile's bytes in the packed tensor.
    pub out: Range<usize>,
    row_bytes: usize,
    block_bytes: usize,
}

impl Tile {
    /// The file bytes (relative to the tensor's first byte) of row `first_row + r`'s block,
    /// for `r` in `0..16`: what [`pack_tile`] takes as `blocks[r]`.
    pub fn source(&self, r: usize) -> Range<usize> {
        let at = (self.first_row + r) * self.row_bytes + self.block * self.block_bytes;
        at..at + self.block_bytes
    }

    /// The 16 source ranges, in row order.
    pub fn sources(&self) -> impl Iterator<Item = Range<usize>> + '_ {
        (0..TILE_ROWS).map(|r| self.source(r))
    }
}

/// Tile `t` of a packed `rows` × `row_bytes` tensor (`row_bytes` as the GGUF stores a row),
/// or `None` past the last tile or for a shape ggml cannot pack ([`check_shape`]).
pub fn tile(layout: AmxLayout, rows: usize, row_bytes: usize, t: usize) -> Option<Tile> {
    let s = layout.spec();
    let tiles = check_shape(layout, rows, row_bytes).ok()?;
    if t >= tiles {
        return None;
    }
    let per_row = row_bytes / s.source_block_bytes;
    Some(Tile {
        index: t,
        first_row: (t / per_row) * TILE_ROWS,
        block: t % per_row,
        out: t * s.tile_bytes()..(t + 1) * s.tile_bytes(),
        row_bytes,
        block_bytes: s.source_block_bytes,
    })
}

/// The tile holding byte `offset` of the packed tensor, and the offset within it.
pub fn tile_at(
    layout: AmxLayout,
    rows: usize,
    row_bytes: usize,
    offset: usize,
) -> Option<(Tile, usize)> {
    let tb = layout.spec().tile_bytes();
    tile(layout, rows, row_bytes, offset / tb).map(|t| (t, offset % tb))
}

/// Checks a `rows` × `row_bytes` tensor can be packed as ggml does and returns its number
/// of tiles: rows a multiple of 16 (ggml packs `rows / 16` tiles and leaves the rest
/// unwritten; llama.cpp only places multiples of 32), rows a whole number of blocks, and
/// packed offsets within ggml's `int` arithmetic.
pub fn check_shape(layout: AmxLayout, rows: usize, row_bytes: usize) -> Result<usize, RepackError> {
    let s = layout.spec();
    if rows % TILE_ROWS != 0 {
        return Err(RepackError::Rows {
            layout: s.name,
            rows,
            interleave: TILE_ROWS,
        });
    }
    if row_bytes % s.source_block_bytes != 0 {
        return Err(RepackError::RowBytes {
            layout: s.name,
            len: row_bytes,
            blocks: row_bytes / s.source_block_bytes,
            block_bytes: s.source_block_bytes,
        });
    }
    let tiles = (rows / TILE_ROWS).checked_mul(row_bytes / s.source_block_bytes);
    // ggml's PACKED_INDEX is `int`: the last tile's offset must fit in an i32
    let last = tiles.and_then(|t| t.saturating_sub(1).checked_mul(s.tile_bytes()));
    match (tiles, last) {
        (Some(t), Some(l)) if l <= i32::MAX as usize => Ok(t),
        _ => Err(RepackError::IndexOverflow {
            layout: s.name,
            rows,
            row_bytes,
        }),
    }
}

/// Builds one tile from the 16 source blocks it packs (`blocks[r]` is block `k` of row
/// `first_row + r`, each [`AmxSpec::source_block_bytes`] long: [`Tile::sources`]) into
/// `out`, which must be [`AmxSpec::tile_bytes`] long. ggml's `pack_B`.
pub fn pack_tile(layout: AmxLayout, blocks: &[&[u8]], out: &mut [u8]) -> Result<(), RepackError> {
    let s = layout.spec();
    if blocks.len() != TILE_ROWS {
        return Err(RepackError::RowCount {
            layout: s.name,
            expected: TILE_ROWS,
            got: blocks.len(),
        });
    }
    if let Some(b) = blocks.iter().find(|b| b.len() != s.source_block_bytes) {
        return Err(RepackError::RowBytes {
            layout: s.name,
            len: b.len(),
            blocks: 1,
            block_bytes: s.source_block_bytes,
        });
    }
    if out.len() != s.tile_bytes() {
        return Err(RepackError::OutBytes {
            layout: s.name,
            expected: s.tile_bytes(),
            got: out.len(),
        });
    }
    let mut e = [[0u8; 256]; TILE_ROWS];
    for (row, b) in e.iter_mut().zip(blocks) {
        elements(layout, b, &mut row[..s.block_elements]);
    }
    let at = quants(layout, &e, s.block_elements, out);
    trailer(layout, blocks, &mut out[at..]);
    Ok(())
}

/// Builds tile `k` of the 16 rows `src_rows` (each a whole row as the GGUF stores it) into
/// `out`: the counterpart of [`super::out_block`].
pub fn out_tile(
    layout: AmxLayout,
    src_rows: &[&[u8]],
    k: usize,
    out: &mut [u8],
) -> Result<(), RepackError> {
    let s = layout.spec();
    if src_rows.len() != TILE_ROWS {
        return Err(RepackError::RowCount {
            layout: s.name,
            expected: TILE_ROWS,
            got: src_rows.len(),
        });
    }
    let len = src_rows[0].len();
    let blocks = len / s.source_block_bytes;
    if let Some(r) = src_rows
        .iter()
        .find(|r| r.len() != len || r.len() % s.source_block_bytes != 0)
    {
        return Err(RepackError::RowBytes {
            layout: s.name,
            len: r.len(),
            blocks,
            block_bytes: s.source_block_bytes,
        });
    }
    if k >= blocks {
        return Err(RepackError::BlockIndex { x: k, blocks });
    }
    let at = k * s.source_block_bytes;
    let mut picked: [&[u8]; TILE_ROWS] = [&[]; TILE_ROWS];
    for (p, r) in picked.iter_mut().zip(src_rows) {
        *p = &r[at..at + s.source_block_bytes];
    }
    pack_tile(layout, &picked, out)
}

/// The whole packed tensor, as ggml's `AMX` buffer holds it ([`packed_size`] bytes), from its
/// `rows` rows of `row_bytes` bytes as the GGUF stores them.
pub fn pack(
    layout: AmxLayout,
    rows: usize,
    row_bytes: usize,
    src: &[u8],
) -> Result<Vec<u8>, RepackError> {
    let s = layout.spec();
    let expected = rows.saturating_mul(row_bytes);
    if src.len() != expected {
        return Err(RepackError::TensorBytes {
            rows,
            row_bytes,
            expected,
            got: src.len(),
        });
    }
    let tiles = check_shape(layout, rows, row_bytes)?;
    let mut out = vec![0u8; tiles * s.tile_bytes()];
    if tiles == 0 {
        return Ok(out);
    }
    let per_row = row_bytes / s.source_block_bytes;
    for (g, group) in src.chunks_exact(TILE_ROWS * row_bytes).enumerate() {
        let rows: Vec<&[u8]> = group.chunks_exact(row_bytes).collect();
        let dst = &mut out[g * per_row * s.tile_bytes()..(g + 1) * per_row * s.tile_bytes()];
        for (k, o) in dst.chunks_exact_mut(s.tile_bytes()).enumerate() {
            out_tile(layout, &rows, k, o)?;
        }
    }
    Ok(out)
}

/// The low nibble of `b` then its high nibble: ggml's `bytes_from_nibbles_32` order.
fn nibble(qs: &[u8], i: usize, half: usize) -> u8 {
    if i < half {
        qs[i] & 15
    } else {
        qs[i - half] >> 4
    }
}

/// Writes the block's quantised values in ggml's element order into `e`
/// (`block_elements` long; the block's length already checked).
fn elements(layout: AmxLayout, b: &[u8], e: &mut [u8]) {
    match layout {
        AmxLayout::Q4_0 | AmxLayout::Q4_1 => {
            let qs = &b[b.len() - 16..];
            for (i, v) in e.iter_mut().enumerate() {
                *v = nibble(qs, i, 16);
            }
        }
        AmxLayout::Q8_0 => e.copy_from_slice(&b[2..34]),
        AmxLayout::Q4_K | AmxLayout::IQ4_XS => {
            // Q4_K: 64 elements per 32 bytes; IQ4_XS: 32 per 16 bytes
            let (qs, span) = if layout == AmxLayout::Q4_K {
                (&b[16..144], 64)
            } else {
                (&b[8..136], 32)
            };
            for (i, v) in e.iter_mut().enumerate() {
                let (c, r) = (i / span, i % span);
                *v = nibble(&qs[c * span / 2..(c + 1) * span / 2], r, span / 2);
            }
        }
        AmxLayout::Q5_K => {
            let (qh, qs) = (&b[16..48], &b[48..176]);
            for (i, v) in e.iter_mut().enumerate() {
                let (c, r) = (i / 64, i % 64);
                let lo = nibble(&qs[c * 32..c * 32 + 32], r, 32);
                let hi = (qh[r % 32] >> (2 * c + r / 32)) & 1;
                *v = lo | hi << 4;
            }
        }
        AmxLayout::Q6_K => {
            let (ql, qh) = (&b[0..128], &b[128..192]);
            for (i, v) in e.iter_mut().enumerate() {
                let (h, r) = (i / 128, i % 128);
                let (q, l) = (r / 32, r % 32);
                let byte = ql[64 * h + l + 32 * (q & 1)];
                let lo = if q < 2 { byte & 15 } else { byte >> 4 };
                let hi = (qh[32 * h + l] >> (2 * q)) & 3;
                *v = lo | hi << 4;
            }
        }
    }
}

/// Writes the tile's quants (and high bits) at the start of `out`; returns their length.
fn quants(layout: AmxLayout, e: &[[u8; 256]; TILE_ROWS], elems: usize, out: &mut [u8]) -> usize {
    if layout == AmxLayout::Q8_0 {
        for w in 0..elems / 4 {
            for (n, row) in e.iter().enumerate() {
                out[64 * w + 4 * n..64 * w + 4 * n + 4].copy_from_slice(&row[4 * w..4 * w + 4]);
            }
        }
        return TILE_ROWS * elems;
    }
    for p in 0..elems / 8 {
        for (n, row) in e.iter().enumerate() {
            for j in 0..4 {
                out[64 * p + 4 * n + j] = (row[8 * p + j] & 15) | (row[8 * p + 4 + j] & 15) << 4;
            }
        }
    }
    let mut at = TILE_ROWS * elems / 2;
    // the high bits: `per` elements of a row per byte, `bits` bits each
    let (per, bits) = match layout {
        AmxLayout::Q5_K => (8, 1),
        AmxLayout::Q6_K => (4, 2),
        _ => return at,
    };
    let mask = (1u8 << bits) - 1;
    for g in 0..elems / (4 * per) {
        for (n, row) in e.iter().enumerate() {
            for j in 0..4 {
                out[at + 64 * g + 4 * n + j] = (0..per).fold(0u8, |acc, i| {
                    acc | ((row[4 * per * g + 4 * i + j] >> 4) & mask) << (bits * i)
                });
            }
        }
    }
    at += TILE_ROWS * elems * bits / 8;
    at
}

/// Writes the per-row values after the quants (`out` is the rest of the tile).
fn trailer(layout: AmxLayout, blocks: &[&[u8]], out: &mut [u8]) {
    match layout {
        AmxLayout::Q4_0 => copy_column(blocks, out, 0, 0),
        AmxLayout::Q4_1 => {
            copy_column(blocks, out, 0, 0);
            copy_column(blocks, out, 32, 2);
        }
        AmxLayout::Q8_0 => {
            copy_column(blocks, out, 0, 0);
            for (n, b) in blocks.iter().enumerate() {
                let sum: i32 = b[2..34].iter().map(|&q| i32::from(q as i8)).sum();
                out[32 + 4 * n..36 + 4 * n].copy_from_slice(&(128 * sum).to_le_bytes());
            }
        }
        AmxLayout::Q4_K | AmxLayout::Q5_K => {
            for (n, b) in blocks.iter().enumerate() {
                let mut q = [0u8; 12];
                q.copy_from_slice(&b[4..16]);
                for s in 0..8 {
                    let (scale, min) = super::q4_k::unpack(&q, s);
                    out[16 * s + n] = scale;
                    out[128 + 32 * (s / 2) + 2 * n + s % 2] = min;
                }
            }
            copy_column(blocks, out, 256, 0);
            copy_column(blocks, out, 288, 2);
        }
        AmxLayout::Q6_K => {
            for (n, b) in blocks.iter().enumerate() {
                for s in 0..16 {
                    out[16 * s + n] = b[192 + s];
                }
            }
            copy_column(blocks, out, 256, 208);
        }
        AmxLayout::IQ4_XS => {
            for (n, b) in blocks.iter().enumerate() {
                let high = u16::from_le_bytes([b[2], b[3]]);
                for s in 0..8 {
                    let low = (b[4 + s / 2] >> (4 * (s % 2))) & 15;
                    let ls = low | (((high >> (2 * s)) & 3) as u8) << 4;
                    out[16 * s + n] = ls.wrapping_sub(32);
                }
            }
            copy_column(blocks, out, 128, 0);
        }
    }
}

/// Copies the 2 bytes at `from` of each block (an fp16 `d`, `m` or `dmin`) into an array of
/// 16 at `to`.
fn copy_column(blocks: &[&[u8]], out: &mut [u8], to: usize, from: usize) {
    for (n, b) in blocks.iter().enumerate() {
        out[to + 2 * n..to + 2 * n + 2].copy_from_slice(&b[from..from + 2]);
    }
}
