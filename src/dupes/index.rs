//! How a copy relates to the file's bytes (identical, or widened F16/BF16 → F32), and why
//! a tensor cannot be searched for. The index itself is [`super::grid`].

pub use crate::model::dupes::{CopyKind, Unsearchable};

/// The in-memory form of a [`CopyKind`] (the kind itself is the model's; the conversion
/// needs `half`, which the model does not import).
pub trait Convert {
    /// Converts source bytes (a whole number of elements) into their in-memory form.
    fn convert(self, src: &[u8], out: &mut Vec<u8>);
}

impl Convert for CopyKind {
    fn convert(self, src: &[u8], out: &mut Vec<u8>) {
        out.clear();
        match self {
            CopyKind::Identical => out.extend_from_slice(src),
            CopyKind::WidenedF16 => {
                for h in src.chunks_exact(2) {
                    let v = half::f16::from_bits(u16::from_le_bytes([h[0], h[1]])).to_f32();
                    out.extend_from_slice(&v.to_le_bytes());
                }
            }
            CopyKind::WidenedBf16 => {
                for h in src.chunks_exact(2) {
                    out.extend_from_slice(&[0, 0, h[0], h[1]]);
                }
            }
        }
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
