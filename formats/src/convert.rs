//! Dtype conversions between F32, F16 and BF16, in every direction, bit for bit as the
//! runtimes make them: the layouts a tensor's bytes take in memory when a framework
//! converts it on load (`.astype(np.float16)`, `.half()`, `.to(torch.bfloat16)`,
//! `.float()`).
//!
//! Each [`Conversion`] names its source and target dtype, the bytes in memory per byte of
//! the file ([`Conversion::ratio`]) and a pure [`Conversion::convert`] of little-endian
//! elements.
//!
//! - Widening (F16/BF16 → F32) is exact.
//! - Narrowing (F32 → F16/BF16) rounds to nearest, ties to even, as NumPy's
//!   `astype(np.float16)`, PyTorch's `.half()` and `.to(torch.bfloat16)` and the F16C and
//!   AVX-512 BF16 instructions do: values past the largest finite value round to ±inf,
//!   F16 results below 2⁻¹⁴ are subnormal (or ±0), and ±0, ±inf keep their sign.
//! - F16 ↔ BF16 goes through F32, as PyTorch does (`bf16.half()` is bf16 → f32 → f16,
//!   rounded once; the widening step is exact).
//! - NaN: the runtimes disagree. To F16 these functions do what F16C, NumPy (for quiet
//!   NaNs) and PyTorch do: the sign and the payload's top bits kept, the quiet bit set. To
//!   BF16 they write `0xFFFF`, as PyTorch's CPU kernels do (measured with torch 2.15 on
//!   x86-64, scalar and vector alike; ml_dtypes writes `0x7FC0`, CUDA `0x7FFF`). A page
//!   holding a NaN some runtime wrote otherwise is not confirmed (its copy is then
//!   partial), never a false copy.

use serde::{Deserialize, Serialize};

use crate::repack::amx::{AmxLayout, TILE_ROWS};
use crate::repack::Layout;
use crate::Dtype;

/// One dtype conversion of a tensor's elements.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Conversion {
    /// F16 widened to F32 (exact).
    F16ToF32,
    /// BF16 widened to F32 (exact).
    Bf16ToF32,
    /// F32 narrowed to F16 (round to nearest even).
    F32ToF16,
    /// F32 narrowed to BF16 (round to nearest even).
    F32ToBf16,
    /// BF16 to F16 through F32 (round to nearest even; large values become ±inf).
    Bf16ToF16,
    /// F16 to BF16 through F32 (round to nearest even).
    F16ToBf16,
    /// A quantised weight repacked by llama.cpp's CPU backend into `Layout` (rows
    /// interleaved, [`crate::repack`]): the same size, other byte order. Serialized as
    /// `{"repack": "q4_0_8x8"}`.
    Repack(Layout),
    /// A quantised weight packed into 16-row tiles by llama.cpp's AMX backend
    /// ([`crate::repack::amx`]); some types grow (`Q8_0` 38/34). `{"amx": "amx_q4_1"}`.
    Amx(AmxLayout),
}

impl Conversion {
    /// Every conversion, in a fixed order.
    pub const ALL: [Conversion; 6] = [
        Conversion::F16ToF32,
        Conversion::Bf16ToF32,
        Conversion::F32ToF16,
        Conversion::F32ToBf16,
        Conversion::Bf16ToF16,
        Conversion::F16ToBf16,
    ];

    /// The dtype of the file's elements.
    pub fn from_dtype(self) -> Dtype {
        match self {
            Conversion::Repack(l) => Dtype::Quant(l.spec().source_type.to_string()),
            Conversion::Amx(l) => Dtype::Quant(l.spec().source_type.to_string()),
            Conversion::F16ToF32 | Conversion::F16ToBf16 => Dtype::F16,
            Conversion::Bf16ToF32 | Conversion::Bf16ToF16 => Dtype::BF16,
            Conversion::F32ToF16 | Conversion::F32ToBf16 => Dtype::F32,
        }
    }

    /// The dtype of the elements in memory (a repacked layout's own name: `q4_0_8x8`).
    pub fn to_dtype(self) -> Dtype {
        match self {
            Conversion::Repack(l) => Dtype::Other(l.spec().name.to_string()),
            Conversion::Amx(l) => Dtype::Other(l.spec().name.to_string()),
            Conversion::F16ToF32 | Conversion::Bf16ToF32 => Dtype::F32,
            Conversion::F32ToF16 | Conversion::Bf16ToF16 => Dtype::F16,
            Conversion::F32ToBf16 | Conversion::F16ToBf16 => Dtype::BF16,
        }
    }

    /// Bytes of one element: (in the file, in memory); (1, 1) for a repack, which keeps
    /// the size (its unit is a group of rows, see [`crate::repack`]).
    pub fn elements(self) -> (u64, u64) {
        match self {
            Conversion::Repack(_) => return (1, 1),
            // 16 source blocks make one tile.
            Conversion::Amx(l) => {
                let s = l.spec();
                return (
                    (TILE_ROWS * s.source_block_bytes) as u64,
                    s.tile_bytes() as u64,
                );
            }
            _ => {}
        }
        let size = |d: Dtype| u64::from(d.bits().unwrap_or(8) / 8);
        (size(self.from_dtype()), size(self.to_dtype()))
    }

    /// Bytes in memory per byte of the file, as (numerator, denominator) in lowest terms:
    /// (2, 1) for a widening, (1, 2) for F32 → F16, (1, 1) for F16 ↔ BF16.
    pub fn ratio(self) -> (u64, u64) {
        let (file, mem) = self.elements();
        let g = file.min(mem);
        (mem / g, file / g)
    }

    /// The conversions a tensor of `dtype` can be made into.
    pub fn of(dtype: &Dtype) -> impl Iterator<Item = Conversion> + '_ {
        Conversion::ALL
            .into_iter()
            .filter(move |c| c.from_dtype() == *dtype)
    }

    /// Whether it is a llama.cpp repack (a layout of its CPU or AMX buffer), not a dtype
    /// conversion.
    pub fn is_repack(self) -> bool {
        matches!(self, Conversion::Repack(_) | Conversion::Amx(_))
    }

    /// Its name for people: `F32→F16`, `Q4_0→q4_0_8x8`.
    pub fn name(self) -> String {
        format!("{}→{}", self.from_dtype().name(), self.to_dtype().name())
    }

    /// Converts `src` (whole elements, little-endian; a trailing part is ignored) into
    /// `out`, which is cleared first. For a repack `src` is one group of the layout's `R`
    /// rows (so a row is `src.len() / R` bytes); bytes that are no such group (rows not
    /// whole blocks) give an empty `out`.
    pub fn convert(self, src: &[u8], out: &mut Vec<u8>) {
        out.clear();
        if let Conversion::Repack(l) = self {
            let rows = l.spec().rows;
            if src.len() % rows == 0 {
                if let Ok(v) = crate::repack::repack(l, rows, src.len() / rows, src) {
                    *out = v;
                }
            }
            return;
        }
        if let Conversion::Amx(l) = self {
            // `src`: 16 rows.
            if src.len() % TILE_ROWS == 0 {
                if let Ok(v) = crate::repack::amx::pack(l, TILE_ROWS, src.len() / TILE_ROWS, src) {
                    *out = v;
                }
            }
            return;
        }
        let (file, mem) = self.elements();
        out.reserve(src.len() / file as usize * mem as usize);
        match self {
            Conversion::F16ToF32 => each16(src, out, |h| f16_to_f32(h).to_le_bytes()),
            Conversion::Bf16ToF32 => each16(src, out, |h| bf16_to_f32(h).to_le_bytes()),
            Conversion::Bf16ToF16 => each16(src, out, |h| f32_to_f16(bf16_to_f32(h)).to_le_bytes()),
            Conversion::F16ToBf16 => each16(src, out, |h| f32_to_bf16(f16_to_f32(h)).to_le_bytes()),
            Conversion::F32ToF16 => each32(src, out, |w| f32_to_f16(w).to_le_bytes()),
            Conversion::F32ToBf16 => each32(src, out, |w| f32_to_bf16(w).to_le_bytes()),
            Conversion::Repack(_) | Conversion::Amx(_) => {}
        }
    }
}

fn each16<const N: usize>(src: &[u8], out: &mut Vec<u8>, f: impl Fn(u16) -> [u8; N]) {
    for h in src.chunks_exact(2) {
        out.extend_from_slice(&f(u16::from_le_bytes([h[0], h[1]])));
    }
}

fn each32<const N: usize>(src: &[u8], out: &mut Vec<u8>, f: impl Fn(u32) -> [u8; N]) {
    for w in src.chunks_exact(4) {
        out.extend_from_slice(&f(u32::from_le_bytes([w[0], w[1], w[2], w[3]])));
    }
}

/// F16 bits to F32 bits, exactly (a NaN keeps its sign and payload, made quiet).
pub fn f16_to_f32(h: u16) -> u32 {
    let sign = u32::from(h & 0x8000) << 16;
    let exp = u32::from((h >> 10) & 0x1f);
    let man = u32::from(h & 0x3ff);
    match exp {
        0 if man == 0 => sign,
        0 => {
            // Subnormal: normalise (man × 2⁻²⁴).
            let shift = man.leading_zeros() - 21;
            let man = (man << shift) & 0x3ff;
            sign | ((113 - shift) << 23) | (man << 13)
        }
        0x1f if man == 0 => sign | 0x7f80_0000,
        0x1f => sign | 0x7fc0_0000 | (man << 13),
        _ => sign | ((exp + 112) << 23) | (man << 13),
    }
}

/// BF16 bits to F32 bits, exactly (BF16 is the top half of an F32).
pub fn bf16_to_f32(h: u16) -> u32 {
    u32::from(h) << 16
}

/// F32 bits to F16 bits, rounded to nearest, ties to even.
pub fn f32_to_f16(x: u32) -> u16 {
    let sign = (x >> 16) & 0x8000;
    let exp = (x >> 23) & 0xff;
    let man = x & 0x007f_ffff;
    if exp == 0xff {
        let quiet = if man == 0 { 0 } else { 0x0200 };
        return (sign | 0x7c00 | quiet | (man >> 13)) as u16;
    }
    let half_exp = exp as i32 - 127 + 15;
    if half_exp >= 0x1f {
        return (sign | 0x7c00) as u16;
    }
    // Round half to even: the bit below the kept ones, then the kept lowest bit or any
    // bit below it.
    let round = |kept: u32, full: u32, shift: u32| -> u32 {
        let half = 1u32 << (shift - 1);
        if full & half != 0 && full & (3 * half - 1) != 0 {
            kept + 1
        } else {
            kept
        }
    };
    if half_exp <= 0 {
        let shift = (14 - half_exp) as u32;
        if shift > 24 {
            return sign as u16;
        }
        let full = man | 0x0080_0000;
        return (sign | round(full >> shift, full, shift)) as u16;
    }
    // A carry out of the mantissa steps the exponent (to inf past 65504).
    (sign | round(((half_exp as u32) << 10) | (man >> 13), man, 13)) as u16
}

/// F32 bits to BF16 bits, rounded to nearest, ties to even.
pub fn f32_to_bf16(x: u32) -> u16 {
    if x & 0x7fff_ffff > 0x7f80_0000 {
        return 0xffff;
    }
    let bias = 0x7fff + ((x >> 16) & 1);
    (x.wrapping_add(bias) >> 16) as u16
}

#[cfg(test)]
#[path = "convert_tests.rs"]
mod tests;
