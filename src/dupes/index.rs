//! Fingerprint index of a model file's tensors.
//!
//! Target memory is sampled once per page (16 bytes at the start of each present page).
//! A copy of a tensor that starts at a 16-byte-aligned address `A` and spans at least one
//! page then puts exactly one sample at a copy-relative offset inside any 4 KiB window
//! `[a0, a0 + 4096)` of it, at a multiple of 16. So each tensor is indexed by the 256
//!16-byte windows of one *anchor region* of 4 KiB: every window's hash maps to (tensor,
//! slot). The anchor is the first 4 KiB-aligned region of the tensor whose windows all carry
//! information: windows that repeat with a period dividing 8 bytes (all zeros, a constant
//! F16 or F32 value) would match any run of that constant and are never used.
//!
//! Widened copies (F16 → F32, BF16 → F32, value-exact) are indexed the same way in the
//! widened byte space: the anchor's source bytes are converted before hashing.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;

use serde::{Deserialize, Serialize};

use crate::container::{Dtype, Tensor};

/// Bytes per fingerprint window.
pub const WIN: usize = 16;
/// Anchor region length = memory sampling stride = page size.
pub const STRIDE: u64 = 4096;
const SLOTS: usize = STRIDE as usize / WIN;
/// How many 4 KiB regions of a tensor are tried as anchor before giving up.
const ANCHOR_TRIES: u64 = 16;

/// How a copy relates to the file's bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CopyKind {
    Identical,
    /// F16 widened to F32.
    WidenedF16,
    /// BF16 widened to F32.
    WidenedBf16,
}

impl CopyKind {
    /// Bytes in memory per byte of the file.
    pub fn factor(self) -> u64 {
        match self {
            CopyKind::Identical => 1,
            CopyKind::WidenedF16 | CopyKind::WidenedBf16 => 2,
        }
    }

    /// Converts source bytes (a whole number of elements) into their in-memory form.
    pub fn convert(self, src: &[u8], out: &mut Vec<u8>) {
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

/// Why a tensor cannot be searched for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Unsearchable {
    /// Shorter than one anchor region (4 KiB in memory).
    TooSmall,
    /// No 4 KiB region of it without constant runs (all zeros, one repeated value).
    LowEntropy,
}

/// One (tensor, kind) pair the index can find.
#[derive(Debug, Clone)]
pub struct Searchable {
    /// Index into the container's tensor table.
    pub tensor: usize,
    pub kind: CopyKind,
    /// Offset of the tensor's bytes in the file.
    pub file_offset: u64,
    /// Length of the copy in memory (source length × kind factor).
    pub mem_len: u64,
    /// Offset of the anchor region in memory coordinates.
    pub anchor: u64,
}

#[derive(Debug, Clone, Copy, Default)]
struct Entry {
    key: u64,
    target: u32,
    slot: u16,
}

/// The fingerprint table.
pub struct Index {
    table: Vec<Entry>,
    mask: usize,
    pub targets: Vec<Searchable>,
    /// (tensor index, kind, reason).
    pub unsearchable: Vec<(usize, CopyKind, Unsearchable)>,
}

/// Hash of a 16-byte window; never 0 (0 marks an empty slot).
pub fn key(window: &[u8]) -> u64 {
    xxhash_rust::xxh3::xxh3_64(window) | 1
}

/// A window whose bytes repeat with a period dividing 8: matches constant runs.
pub fn periodic(window: &[u8]) -> bool {
    window[..8] == window[8..16]
}

fn kinds_for(dtype: &Dtype, widen: bool) -> Vec<CopyKind> {
    let mut k = vec![CopyKind::Identical];
    if widen {
        match dtype {
            Dtype::F16 => k.push(CopyKind::WidenedF16),
            Dtype::BF16 => k.push(CopyKind::WidenedBf16),
            _ => {}
        }
    }
    k
}

impl Index {
    /// Builds the index from the file's bytes (only the anchor regions are read).
    pub fn build(file: &File, tensors: &[Tensor], widen: bool) -> io::Result<Index> {
        let mut targets = Vec::new();
        let mut unsearchable = Vec::new();
        let mut windows: Vec<(u64, u32, u16)> = Vec::new();
        let mut src = Vec::new();
        let mut mem = Vec::new();
        for (ti, t) in tensors.iter().enumerate() {
            for kind in kinds_for(&t.dtype, widen) {
                let mem_len = t.len * kind.factor();
                if mem_len < STRIDE {
                    unsearchable.push((ti, kind, Unsearchable::TooSmall));
                    continue;
                }
                let mut found = None;
                let mut a0 = 0;
                while a0 + STRIDE <= mem_len && a0 / STRIDE < ANCHOR_TRIES {
                    let src_len = (STRIDE / kind.factor()) as usize;
                    src.resize(src_len, 0);
                    file.read_exact_at(&mut src, t.offset + a0 / kind.factor())?;
                    kind.convert(&src, &mut mem);
                    if mem.chunks_exact(WIN).all(|w| !periodic(w)) {
                        found = Some(a0);
                        break;
                    }
                    a0 += STRIDE;
                }
                let Some(anchor) = found else {
                    unsearchable.push((ti, kind, Unsearchable::LowEntropy));
                    continue;
                };
                let id = targets.len() as u32;
                for (slot, w) in mem.chunks_exact(WIN).enumerate() {
                    windows.push((key(w), id, slot as u16));
                }
                targets.push(Searchable {
                    tensor: ti,
                    kind,
                    file_offset: t.offset,
                    mem_len,
                    anchor,
                });
            }
        }
        let cap = (windows.len() * 2).next_power_of_two().max(16);
        let mask = cap - 1;
        let mut table = vec![Entry::default(); cap];
        for (key, target, slot) in windows {
            let mut i = key as usize & mask;
            while table[i].key != 0 {
                i = (i + 1) & mask;
            }
            table[i] = Entry { key, target, slot };
        }
        Ok(Index {
            table,
            mask,
            targets,
            unsearchable,
        })
    }

    /// Calls `hit(target, copy_offset_of_window)` for every window with this key.
    pub fn lookup(&self, key: u64, mut hit: impl FnMut(usize, u64)) {
        let mut i = key as usize & self.mask;
        loop {
            let e = self.table[i];
            if e.key == 0 {
                return;
            }
            if e.key == key {
                let t = &self.targets[e.target as usize];
                hit(e.target as usize, t.anchor + e.slot as u64 * WIN as u64);
            }
            i = (i + 1) & self.mask;
        }
    }

    /// Number of windows indexed.
    pub fn windows(&self) -> usize {
        self.targets.len() * SLOTS
    }

    /// Bytes the index occupies.
    pub fn bytes(&self) -> usize {
        self.table.len() * std::mem::size_of::<Entry>()
            + self.targets.len() * std::mem::size_of::<Searchable>()
    }
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
