//! How a copy relates to the file's bytes (identical, or converted to another dtype:
//! `twofold_formats::convert`), which layouts an index holds, and why a tensor cannot be
//! searched for. The index itself is [`super::grid`].

use crate::container::convert::Conversion;
use crate::container::Dtype;
pub use crate::model::dupes::{CopyKind, Unsearchable};

/// The in-memory form of a [`CopyKind`] (the kind itself is the model's, the conversion
/// the formats crate's).
pub trait Convert {
    /// Converts source bytes (a whole number of elements) into their in-memory form.
    fn convert(self, src: &[u8], out: &mut Vec<u8>);
}

impl Convert for CopyKind {
    fn convert(self, src: &[u8], out: &mut Vec<u8>) {
        match self.conversion() {
            None => {
                out.clear();
                out.extend_from_slice(src);
            }
            Some(c) => c.convert(src, out),
        }
    }
}

/// Which in-memory layouts of each tensor an index holds besides its bytes as they are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layouts {
    /// The bytes as they are only.
    Identical,
    /// And F16/BF16 tensors widened to F32 (what uploads are matched against).
    Widened,
    /// And every conversion the tensor's dtype can be made into (F32 → F16/BF16,
    /// F16/BF16 → F32, F16 ↔ BF16): only those whose source dtype the tensor has.
    Converted,
}

impl Layouts {
    /// The kinds of copy indexed for a tensor of `dtype`, [`CopyKind::Identical`] first.
    pub fn kinds(self, dtype: &Dtype) -> Vec<CopyKind> {
        let mut v = vec![CopyKind::Identical];
        let widening = |c: &Conversion| c.to_dtype() == Dtype::F32;
        match self {
            Layouts::Identical => {}
            Layouts::Widened => {
                v.extend(Conversion::of(dtype).filter(widening).map(CopyKind::from))
            }
            Layouts::Converted => v.extend(Conversion::of(dtype).map(CopyKind::from)),
        }
        v
    }
}

/// A window whose bytes repeat with a period dividing 8: matches constant runs.
pub fn periodic(window: &[u8]) -> bool {
    window[..8] == window[8..16]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn widening_is_value_exact() {
        let mut out = Vec::new();
        // 1.0, -2.0, 65504 (max f16), smallest subnormal.
        let src: Vec<u8> = [0x3c00u16, 0xc000, 0x7bff, 0x0001]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        CopyKind::WidenedF16.convert(&src, &mut out);
        let f: Vec<f32> = out
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        assert_eq!(f, [1.0, -2.0, 65504.0, 5.960_464_5e-8]);
        CopyKind::WidenedBf16.convert(&[0x80, 0x3f], &mut out);
        assert_eq!(f32::from_le_bytes([out[0], out[1], out[2], out[3]]), 1.0);
        CopyKind::F32ToF16.convert(&1.0f32.to_le_bytes(), &mut out);
        assert_eq!(out, [0x00, 0x3c]);
        CopyKind::Identical.convert(&[1, 2], &mut out);
        assert_eq!(out, [1, 2]);
    }

    #[test]
    fn layouts_index_only_what_a_dtype_can_produce() {
        use CopyKind::*;
        assert_eq!(
            Layouts::Converted.kinds(&Dtype::F32),
            [Identical, F32ToF16, F32ToBf16]
        );
        assert_eq!(
            Layouts::Converted.kinds(&Dtype::BF16),
            [Identical, WidenedBf16, Bf16ToF16]
        );
        assert_eq!(
            Layouts::Converted.kinds(&Dtype::F16),
            [Identical, WidenedF16, F16ToBf16]
        );
        assert_eq!(Layouts::Widened.kinds(&Dtype::F16), [Identical, WidenedF16]);
        assert_eq!(Layouts::Widened.kinds(&Dtype::F32), [Identical]);
        assert_eq!(Layouts::Converted.kinds(&Dtype::I8), [Identical]);
        assert_eq!(Layouts::Identical.kinds(&Dtype::BF16), [Identical]);
    }

    #[test]
    fn constant_windows_are_periodic() {
        assert!(periodic(&[0u8; 16]));
        let ones: Vec<u8> = (0..8).flat_map(|_| 0x3c00u16.to_le_bytes()).collect();
        assert!(periodic(&ones));
        let ramp: Vec<u8> = (0..16).collect();
        assert!(!periodic(&ramp));
    }
}

/// One (tensor, kind) to find.
#[derive(Debug, Clone)]
pub struct Piece {
    /// Index into the grid's files.
    pub file: usize,
    /// Index into that file's tensors.
    pub tensor: usize,
    pub kind: CopyKind,
    pub file_offset: u64,
    pub mem_len: u64,
}

/// A point of the index: its key, the piece and the point's number in it.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Slot {
    pub key: u64,
    pub piece: u32,
    pub k: u32,
}

/// Whether point `k` (at `k × 2048`) is indexed when pairs are `every` pages apart.
pub fn is_point(k: u64, every: u64) -> bool {
    every <= 1 || k % (2 * every) < 2
}
