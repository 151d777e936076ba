//! `block_q4_Kx8`'s header: the 8 rows' `d`, their `dmin`, and their 6-bit scales and mins
//! regrouped by sub-block (ggml's `make_block_q4_Kx8` in `ggml-cpu/repack.cpp`).
//!
//! A `Q4_K` block (`block_q4_K` in `ggml-common.h`, 144 bytes) is `d` (fp16), `dmin`
//! (fp16), 12 bytes of scales, 128 bytes of quants. The 12 bytes hold 8 (scale, min) pairs of
//! 6 bits, one per sub-block of 32 elements, packed as ggml's `get_scale_min_k4` reads them:
//! for `j < 4` the low 6 bits of byte `j` (scale) and `j + 4` (min); for `j ≥ 4` the low
//! nibble (scale) and high nibble (min) of byte `j + 4`, with their top 2 bits in the top 2
//! bits of bytes `j - 4` (scale) and `j` (min).

/// Bytes of quants in a `Q4_K` block.
pub(super) const QS_BYTES: usize = 128;
/// Offset of the 12 bytes of scales in a `Q4_K` block.
const SCALES_AT: usize = 4;
/// Bytes of packed scales and mins in a `Q4_K` block.
const SCALES_BYTES: usize = 12;
/// Sub-blocks (pairs) in a `Q4_K` block.
const SUB_BLOCKS: usize = 8;

/// The (scale, min) pair of sub-block `j` from a block's 12 bytes of scales
/// (`get_scale_min_k4`).
pub(super) fn unpack(q: &[u8; SCALES_BYTES], j: usize) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        (
            (q[j + 4] & 0x0f) | ((q[j - 4] >> 6) << 4),
            (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
        )
    }
}

/// Packs 8 (scale, min) pairs of 6 bits into 12 bytes, the inverse of [`unpack`].
pub(super) fn pack(pairs: &[(u8, u8); SUB_BLOCKS]) -> [u8; SCALES_BYTES] {
    let mut q = [0u8; SCALES_BYTES];
    for k in 0..4 {
        let (s_lo, m_lo) = pairs[k];
        let (s_hi, m_hi) = pairs[k + 4];
        q[k] = (s_lo & 63) | ((s_hi & 48) << 2);
        q[k + 4] = (m_lo & 63) | ((m_hi & 48) << 2);
        q[k + 8] = (s_hi & 15) | ((m_hi & 15) << 4);
    }
    q
}

/// Writes the 8 blocks' `d`, `dmin` and regrouped scales at the start of `out` (already
/// checked: 8 blocks of 144 bytes, `out` 1152 bytes); returns where the quants start (128).
pub(super) fn headers_and_scales(blocks: &[&[u8]], out: &mut [u8]) -> usize {
    let n = blocks.len();
    let mut scales = [[0u8; SCALES_BYTES]; SUB_BLOCKS];
    for (r, b) in blocks.iter().enumerate() {
        out[2 * r..2 * r + 2].copy_from_slice(&b[0..2]);
        out[2 * n + 2 * r..2 * n + 2 * r + 2].copy_from_slice(&b[2..4]);
        if let Some(s) = scales.get_mut(r) {
            s.copy_from_slice(&b[SCALES_AT..SCALES_AT + SCALES_BYTES]);
        }
    }
    let at = 4 * n;
    for j in 0..SUB_BLOCKS {
        // the 8 rows' pairs of sub-block j, packed as if they were one block's 8 sub-blocks
        let mut pairs = [(0u8, 0u8); SUB_BLOCKS];
        for (p, s) in pairs.iter_mut().zip(&scales) {
            *p = unpack(s, j);
        }
        out[at + j * SCALES_BYTES..at + (j + 1) * SCALES_BYTES].copy_from_slice(&pack(&pairs));
    }
    at + SUB_BLOCKS * SCALES_BYTES
}
