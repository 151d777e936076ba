//! llama.cpp's CPU **repack** layouts (ggml-cpu's `CPU_REPACK` "extra" buffer), as pure
//! functions: which layout ggml picks for a tensor, and the bytes it writes, recomputed from
//! the tensor's bytes in the GGUF file.
//!
//! When llama.cpp loads a quantised weight into the CPU backend with repacking on (the
//! default; `--no-repack` turns it off), `ggml_backend_cpu_repack_buffer_set_tensor` does not
//! keep the file's bytes: it allocates a buffer of the tensor's size and writes the rows
//! interleaved, `R` rows (4 or 8) at a time, so that one SIMD load feeds `R` output columns.
//! The mapped source pages stay resident (llama.cpp #12149, #16761), so the process holds a
//! second, transformed copy of every repacked weight. Its longest runs equal to file bytes are
//! 8 bytes (a chunk of quants), so searching for file bytes cannot find it: a proof recomputes
//! whole output blocks with [`out_block`] and compares them.
//!
//! # Byte order
//!
//! For a tensor of `rows` rows of `blocks_per_row` source blocks each, output block `i` is
//! built from block `x` of rows `R·g .. R·g + R`, where `g = i / blocks_per_row` and
//! `x = i % blocks_per_row` (ggml's `repack_*_to_*_bl`): the output is the row groups in
//! order, each group its blocks in column order. Every layout here keeps the size: one output
//! block is `R` source blocks ([`Spec::out_block_bytes`]), so the repacked tensor has exactly
//! the file tensor's size, and output byte `o` lies in output block `o / out_block_bytes`
//! ([`origin`]).
//!
//! Inside an output block ([`Layout`] lists each):
//! - **simple layouts** (`Q4_0`, `IQ4_NL`, `MXFP4`, `Q8_0`): the `R` blocks' headers (their
//!   fp16 scale `d`, or `MXFP4`'s e8m0 exponent byte `e`) in row order, then the `R` blocks'
//!   quants in chunks of `C` bytes (the "interleave", 4 or 8) taken from the rows in turn:
//!   chunk `k` of the output is chunk `k / R` of row `k % R`. `Q4_0` XORs every quant byte
//!   with `0x88` (the nibbles become signed); the others copy quants unchanged.
//! - **`Q4_K`** (`block_q4_Kx8`, 1152 bytes): the 8 rows' `d`, then the 8 rows' `dmin`, then
//!   96 bytes of scales (below), then the quants (128 bytes a row) in chunks of `C` bytes taken
//!   from the rows in turn, unchanged. Each `Q4_K` block packs 8 (scale, min) pairs of 6 bits
//!   into 12 bytes; the repack unpacks them and, for each sub-block `j`, packs the 8 rows'
//!   pairs of sub-block `j` into 12 bytes with the same packing, at `j · 12`.
//!
//! # Where this comes from, and how it is checked
//!
//! Learned from `ggml/src/ggml-cpu/repack.cpp` and `repack.h` of llama.cpp as vendored by
//! `llama-cpp-python` 0.3.36 (llama.cpp commit `0c1e570`): the `block_*` structs in
//! `repack.h`, `make_block_*` (one output block) and `repack_*_to_*_bl` (the order of blocks)
//! in `repack.cpp`, and `ggml_repack_get_optimal_repack_type` (which layout; see
//! [`choose`]). The code here is written from that description, not copied.
//!
//! Every layout is tested against bytes that ggml itself wrote, from an x86 AVX2 build
//! without AMX or AVX-512 (`scripts/llama-cache.sh`), through `tests/runtimes/repack_dump.cpp`;
//! the golden vectors are in `formats/tests/fixtures/repack/` (made by
//! `scripts/repack-golden.sh`, which `--check`s fresh random ones against this code):
//! - `q4_0_8x8`, `q4_K_8x8`, `iq4_nl_8x8`, `mxfp4_8x8`, the layouts that build chooses,
//!   through the path llama.cpp takes: a tensor in ggml's `CPU_REPACK` buffer, repacked by
//!   `ggml_backend_tensor_set`, with ggml's log naming the layout it chose;
//! - the ARM layouts (`*_4x4`, `*_4x8`, `q4_K_8x4`), by calling ggml's repack
//!   function of each layout directly (an exported template specialisation of `repack.cpp`,
//!   compiled on every architecture). Which layout an ARM build chooses ([`choose`]) is read
//!   from the source only: no ARM build ran here.
//!
//! Not modelled (a caller gets [`Choice::Unmodelled`]): `q2_K_8x8` (x86 AVX-512), `q5_K`,
//! `q6_K` and `q1_0` (ARM), the RISC-V `*_16x1` layouts, and KleidiAI's extra buffer on ARM.
//!
//! # The AMX buffer
//!
//! A ggml-cpu built with AMX (`GGML_AMX_INT8`, the `sapphirerapids` variant) lists its `AMX`
//! buffer before `CPU_REPACK`: a weight it takes ([`amx::choose`]) is packed into 16-row VNNI
//! tiles instead, and that copy can be larger than the file's (up to 38/34 for `Q8_0`). See
//! [`amx`]; [`AnyLayout`] names the layouts of both buffers for reports.

pub mod amx;
mod q4_k;
mod select;
#[cfg(test)]
mod tests;

pub use amx::AmxLayout;
pub use select::{choose, layouts_for, weight_use, Choice, CpuFeatures, WeightUse};

/// A repack layout of ggml's CPU backend, named as ggml logs it
/// (`repack tensor NAME with q4_0_8x8`): the source type, then `R`x`C`, `R` rows interleaved
/// and `C` bytes a chunk (ggml's template arguments `NB_COLS` and `INTER_SIZE`).
#[allow(non_camel_case_types)] // ggml's own names read better than CamelCase here
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Layout {
    /// `block_q4_0x4` from `Q4_0`, 4-byte chunks (ARM dotprod).
    Q4_0_4x4,
    /// `block_q4_0x4` from `Q4_0`, 8-byte chunks (ARM i8mm).
    Q4_0_4x8,
    /// `block_q4_0x8` from `Q4_0`, 8-byte chunks (x86 AVX2; ARM SVE-256 with i8mm).
    Q4_0_8x8,
    /// `block_q4_Kx8` from `Q4_K`, 4-byte chunks (ARM dotprod).
    Q4_K_8x4,
    /// `block_q4_Kx8` from `Q4_K`, 8-byte chunks (x86 AVX2; ARM i8mm).
    Q4_K_8x8,
    /// `block_iq4_nlx4` from `IQ4_NL`, 4-byte chunks (ARM dotprod).
    IQ4_NL_4x4,
    /// `block_iq4_nlx8` from `IQ4_NL`, 8-byte chunks (x86 AVX2).
    IQ4_NL_8x8,
    /// `block_mxfp4x4` from `MXFP4`, 4-byte chunks (ARM dotprod).
    MXFP4_4x4,
    /// `block_mxfp4x8` from `MXFP4`, 8-byte chunks (x86 AVX2).
    MXFP4_8x8,
    /// `block_q8_0x4` from `Q8_0`, 4-byte chunks (ARM dotprod).
    Q8_0_4x4,
    /// `block_q8_0x4` from `Q8_0`, 8-byte chunks (ARM i8mm).
    Q8_0_4x8,
}

/// What a [`Layout`] is made of.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Spec {
    /// ggml's name, as in its debug log (`q4_0_8x8`).
    pub name: &'static str,
    /// The C struct of one output block in `repack.h` (`block_q4_0x8`).
    pub block_struct: &'static str,
    /// The source type as [`crate::gguf::ggml_type`] names it (`Q4_0`).
    pub source_type: &'static str,
    /// Elements in one source block (32, or 256 for `Q4_K`).
    pub block_elements: usize,
    /// Bytes of one source block.
    pub source_block_bytes: usize,
    /// Rows interleaved into one output block (`R`, ggml's `NB_COLS`).
    pub rows: usize,
    /// Bytes of quants taken from one row at a time (`C`, ggml's `INTER_SIZE`).
    pub chunk_bytes: usize,
    /// Bytes at the start of a source block copied into the output's header (`d` or `e`);
    /// 4 for `Q4_K` (`d` and `dmin`, copied into two arrays).
    pub header_bytes: usize,
    /// XORed into every quant byte (`0x88` for `Q4_0`, else 0).
    pub xor: u8,
}

impl Spec {
    /// Bytes of one output block: `rows` source blocks (the repack keeps the size).
    pub const fn out_block_bytes(&self) -> usize {
        self.rows * self.source_block_bytes
    }
}

const fn spec(
    name: &'static str,
    block_struct: &'static str,
    source: (&'static str, usize, usize, usize),
    rows: usize,
    chunk_bytes: usize,
    xor: u8,
) -> Spec {
    Spec {
        name,
        block_struct,
        source_type: source.0,
        block_elements: source.1,
        source_block_bytes: source.2,
        header_bytes: source.3,
        rows,
        chunk_bytes,
        xor,
    }
}

/// (type, elements a block, bytes a block, header bytes) of the source types.
const Q4_0: (&str, usize, usize, usize) = ("Q4_0", 32, 18, 2);
const Q4_K: (&str, usize, usize, usize) = ("Q4_K", 256, 144, 4);
const IQ4_NL: (&str, usize, usize, usize) = ("IQ4_NL", 32, 18, 2);
const MXFP4: (&str, usize, usize, usize) = ("MXFP4", 32, 17, 1);
const Q8_0: (&str, usize, usize, usize) = ("Q8_0", 32, 34, 2);

impl Layout {
    /// Every layout, in declaration order.
    pub const ALL: [Layout; 11] = [
        Layout::Q4_0_4x4,
        Layout::Q4_0_4x8,
        Layout::Q4_0_8x8,
        Layout::Q4_K_8x4,
        Layout::Q4_K_8x8,
        Layout::IQ4_NL_4x4,
        Layout::IQ4_NL_8x8,
        Layout::MXFP4_4x4,
        Layout::MXFP4_8x8,
        Layout::Q8_0_4x4,
        Layout::Q8_0_4x8,
    ];

    /// The registry: what this layout is made of.
    pub const fn spec(self) -> Spec {
        match self {
            Layout::Q4_0_4x4 => spec("q4_0_4x4", "block_q4_0x4", Q4_0, 4, 4, 0x88),
            Layout::Q4_0_4x8 => spec("q4_0_4x8", "block_q4_0x4", Q4_0, 4, 8, 0x88),
            Layout::Q4_0_8x8 => spec("q4_0_8x8", "block_q4_0x8", Q4_0, 8, 8, 0x88),
            Layout::Q4_K_8x4 => spec("q4_K_8x4", "block_q4_Kx8", Q4_K, 8, 4, 0),
            Layout::Q4_K_8x8 => spec("q4_K_8x8", "block_q4_Kx8", Q4_K, 8, 8, 0),
            Layout::IQ4_NL_4x4 => spec("iq4_nl_4x4", "block_iq4_nlx4", IQ4_NL, 4, 4, 0),
            Layout::IQ4_NL_8x8 => spec("iq4_nl_8x8", "block_iq4_nlx8", IQ4_NL, 8, 8, 0),
            Layout::MXFP4_4x4 => spec("mxfp4_4x4", "block_mxfp4x4", MXFP4, 4, 4, 0),
            Layout::MXFP4_8x8 => spec("mxfp4_8x8", "block_mxfp4x8", MXFP4, 8, 8, 0),
            Layout::Q8_0_4x4 => spec("q8_0_4x4", "block_q8_0x4", Q8_0, 4, 4, 0),
            Layout::Q8_0_4x8 => spec("q8_0_4x8", "block_q8_0x4", Q8_0, 4, 8, 0),
        }
    }

    /// The layout ggml logs as `name` (`q4_0_8x8`).
    pub fn from_name(name: &str) -> Option<Layout> {
        Layout::ALL.into_iter().find(|l| l.spec().name == name)
    }

    /// Bytes of one group of rows interleaved together (`R` rows of `row_bytes`): the unit
    /// a repacked tensor is recomputed in, file and memory alike.
    pub const fn group_bytes(self, row_bytes: u64) -> u64 {
        self.spec().rows as u64 * row_bytes
    }
}

/// A layout is written by its name (`"q4_0_8x8"`), as ggml logs it.
impl serde::Serialize for Layout {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.spec().name)
    }
}

impl<'de> serde::Deserialize<'de> for Layout {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Layout, D::Error> {
        let name = String::deserialize(d)?;
        Layout::from_name(&name)
            .ok_or_else(|| serde::de::Error::custom(format!("unknown repack layout '{name}'")))
    }
}

/// Any layout modelled here, by the name reports use: a `CPU_REPACK` [`Layout`]
/// (`q4_0_8x8`) or an AMX one ([`AmxLayout`], `amx_q4_1`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum AnyLayout {
    /// ggml-cpu's `CPU_REPACK` buffer: rows interleaved, the size kept.
    Repack(Layout),
    /// ggml-cpu's `AMX` buffer: 16-row VNNI tiles, the size kept or grown ([`amx`]).
    Amx(AmxLayout),
}

impl AnyLayout {
    /// The name (`q4_0_8x8`, `amx_q4_1`).
    pub const fn name(self) -> &'static str {
        match self {
            AnyLayout::Repack(l) => l.spec().name,
            AnyLayout::Amx(l) => l.spec().name,
        }
    }

    /// The source type as [`crate::gguf::ggml_type`] names it (`Q4_1`).
    pub const fn source_type(self) -> &'static str {
        match self {
            AnyLayout::Repack(l) => l.spec().source_type,
            AnyLayout::Amx(l) => l.spec().source_type,
        }
    }

    /// The layout named `name`, of either kind.
    pub fn from_name(name: &str) -> Option<AnyLayout> {
        Layout::from_name(name)
            .map(AnyLayout::Repack)
            .or_else(|| AmxLayout::from_name(name).map(AnyLayout::Amx))
    }

    /// Bytes of a `rows` × `cols` tensor in this layout (`None` for a shape it cannot have):
    /// the file's size for `CPU_REPACK`, [`amx::packed_size`] for AMX.
    pub fn out_bytes(self, rows: u64, cols: u64) -> Option<u64> {
        match self {
            AnyLayout::Repack(l) => {
                let s = l.spec();
                let elems = s.block_elements as u64;
                if cols % elems != 0 {
                    return None;
                }
                rows.checked_mul(cols / elems)?
                    .checked_mul(s.source_block_bytes as u64)
            }
            AnyLayout::Amx(l) => amx::packed_size(l, rows, cols),
        }
    }

    /// For reports: `repacked by llama.cpp's CPU backend (Q4_0 → q4_0_8x8)`,
    /// `repacked by llama.cpp's AMX backend (Q4_1 → amx_q4_1)`.
    pub fn describe(self) -> String {
        match self {
            AnyLayout::Repack(l) => format!(
                "repacked by llama.cpp's CPU backend ({} → {})",
                l.spec().source_type,
                l.spec().name
            ),
            AnyLayout::Amx(l) => l.describe(),
        }
    }
}

/// Why a repack could not be computed. Messages are lower-case and quote values.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RepackError {
    /// The layout interleaves `expected` rows but `got` were given.
    #[error("layout '{layout}' interleaves '{expected}' rows, got '{got}'")]
    RowCount {
        layout: &'static str,
        expected: usize,
        got: usize,
    },
    /// A row's length is no whole number of source blocks, or rows differ in length.
    #[error("a row of '{len}' bytes is not '{blocks}' blocks of '{block_bytes}' bytes for layout '{layout}'")]
    RowBytes {
        layout: &'static str,
        len: usize,
        blocks: usize,
        block_bytes: usize,
    },
    /// Block `x` is past the end of the rows.
    #[error("block '{x}' is past the '{blocks}' blocks of a row")]
    BlockIndex { x: usize, blocks: usize },
    /// The output slice is not one output block long.
    #[error("an output block of layout '{layout}' has '{expected}' bytes, the buffer '{got}'")]
    OutBytes {
        layout: &'static str,
        expected: usize,
        got: usize,
    },
    /// The tensor's row count is not a multiple of the interleave (ggml does not repack it).
    #[error("'{rows}' rows are not a multiple of '{interleave}' (layout '{layout}')")]
    Rows {
        layout: &'static str,
        rows: usize,
        interleave: usize,
    },
    /// The packed tensor's offsets overflow ggml's `int` arithmetic (AMX's `PACKED_INDEX`:
    /// a packed tensor past 2 GiB), where what ggml writes is undefined.
    #[error(
        "'{rows}' rows of '{row_bytes}' bytes overflow ggml's int offsets in layout '{layout}'"
    )]
    IndexOverflow {
        layout: &'static str,
        rows: usize,
        row_bytes: usize,
    },
    /// The tensor's bytes are not `rows × row_bytes`.
    #[error(
        "the tensor has '{got}' bytes, '{rows}' rows of '{row_bytes}' bytes need '{expected}'"
    )]
    TensorBytes {
        rows: usize,
        row_bytes: usize,
        expected: usize,
        got: usize,
    },
}

/// Builds one output block from the `R` source blocks it interleaves (`blocks[r]` is block
/// `x` of row `R·g + r`, each [`Spec::source_block_bytes`] long) into `out`, which must be
/// [`Spec::out_block_bytes`] long. ggml's `make_block_*`.
pub fn interleave(layout: Layout, blocks: &[&[u8]], out: &mut [u8]) -> Result<(), RepackError> {
    let s = layout.spec();
    check_count(s, blocks.len())?;
    if let Some(b) = blocks.iter().find(|b| b.len() != s.source_block_bytes) {
        return Err(RepackError::RowBytes {
            layout: s.name,
            len: b.len(),
            blocks: 1,
            block_bytes: s.source_block_bytes,
        });
    }
    if out.len() != s.out_block_bytes() {
        return Err(RepackError::OutBytes {
            layout: s.name,
            expected: s.out_block_bytes(),
            got: out.len(),
        });
    }
    let quants_at = if s.source_type == "Q4_K" {
        q4_k::headers_and_scales(blocks, out)
    } else {
        for (r, b) in blocks.iter().enumerate() {
            out[r * s.header_bytes..(r + 1) * s.header_bytes].copy_from_slice(&b[..s.header_bytes]);
        }
        s.rows * s.header_bytes
    };
    let quant_off = s.source_block_bytes - quant_bytes(&s);
    let (c, rows) = (s.chunk_bytes, s.rows);
    for (k, dst) in out[quants_at..].chunks_exact_mut(c).enumerate() {
        let from = quant_off + (k / rows) * c;
        let src = &blocks[k % rows][from..from + c];
        for (d, v) in dst.iter_mut().zip(src) {
            *d = v ^ s.xor;
        }
    }
    Ok(())
}

/// Bytes of quants in one source block (the block less its header, and less the 12 bytes
/// of scales for `Q4_K`).
fn quant_bytes(s: &Spec) -> usize {
    if s.source_type == "Q4_K" {
        q4_k::QS_BYTES
    } else {
        s.source_block_bytes - s.header_bytes
    }
}

/// Builds output block `x` of the row group whose `R` rows are `src_rows` (each the whole
/// row's bytes as the GGUF stores them) into `out`: what a proof recomputes from the file to
/// compare with process memory.
pub fn out_block(
    layout: Layout,
    src_rows: &[&[u8]],
    x: usize,
    out: &mut [u8],
) -> Result<(), RepackError> {
    let s = layout.spec();
    check_count(s, src_rows.len())?;
    let len = src_rows.first().map_or(0, |r| r.len());
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
    if x >= blocks {
        return Err(RepackError::BlockIndex { x, blocks });
    }
    let at = x * s.source_block_bytes;
    let mut picked: [&[u8]; MAX_ROWS] = [&[]; MAX_ROWS];
    for (p, r) in picked.iter_mut().zip(src_rows) {
        *p = &r[at..at + s.source_block_bytes];
    }
    interleave(layout, &picked[..s.rows], out)
}

/// The most rows any layout interleaves.
pub const MAX_ROWS: usize = 8;

fn check_count(s: Spec, got: usize) -> Result<(), RepackError> {
    if got == s.rows {
        Ok(())
    } else {
        Err(RepackError::RowCount {
            layout: s.name,
            expected: s.rows,
            got,
        })
    }
}

/// Where output byte `offset` of a repacked tensor comes from: `(first_row, x, within)`, the
/// first of the `R` source rows of its block, the block column `x`, and the offset inside
/// the output block. `None` if `row_bytes` is no whole number of blocks.
pub fn origin(layout: Layout, row_bytes: usize, offset: usize) -> Option<(usize, usize, usize)> {
    let s = layout.spec();
    let per_row = row_bytes.checked_div(s.source_block_bytes)?;
    if per_row == 0 || row_bytes % s.source_block_bytes != 0 {
        return None;
    }
    let i = offset / s.out_block_bytes();
    Some((
        (i / per_row) * s.rows,
        i % per_row,
        offset % s.out_block_bytes(),
    ))
}

/// The whole repacked tensor, as ggml's `CPU_REPACK` buffer holds it, from its `rows` rows
/// of `row_bytes` bytes as the GGUF stores them (for a 3-D tensor of experts, all experts'
/// rows: ggml checks `ne[1]` against the interleave, so groups never straddle experts).
pub fn repack(
    layout: Layout,
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
    if rows % s.rows != 0 {
        return Err(RepackError::Rows {
            layout: s.name,
            rows,
            interleave: s.rows,
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
    let mut out = vec![0u8; src.len()];
    if src.is_empty() {
        // no rows or empty rows (`rows × row_bytes` may not even fit in a usize then)
        return Ok(out);
    }
    let per_row = row_bytes / s.source_block_bytes;
    let ob = s.out_block_bytes();
    for (group, dst) in src
        .chunks_exact(s.rows * row_bytes)
        .zip(out.chunks_exact_mut(s.rows * row_bytes))
    {
        let rows: Vec<&[u8]> = group.chunks_exact(row_bytes).collect();
        for (x, o) in dst.chunks_exact_mut(ob).enumerate().take(per_row) {
            out_block(layout, &rows, x, o)?;
        }
    }
    Ok(out)
}
