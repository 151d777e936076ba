//! Copies found converted to another dtype, per conversion: what a proof adds up.

use serde::{Deserialize, Serialize};
pub use twofold_formats::convert::Conversion;

/// The bytes of one conversion a proof found (a private copy of the file's tensors in
/// another dtype: `.half()`, `.astype(np.float16)`, `.float()`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Converted {
    pub conversion: Conversion,
    /// File bytes the copies cover.
    pub file_bytes: u64,
    /// Memory bytes they occupy (`file_bytes` × the conversion's ratio).
    pub memory_bytes: u64,
}

/// Adds `file_bytes` and `memory_bytes` of `conversion` to `list` (one entry each).
pub fn add(list: &mut Vec<Converted>, conversion: Conversion, file_bytes: u64, memory_bytes: u64) {
    match list.iter_mut().find(|c| c.conversion == conversion) {
        Some(c) => {
            c.file_bytes += file_bytes;
            c.memory_bytes += memory_bytes;
        }
        None => {
            list.push(Converted {
                conversion,
                file_bytes,
                memory_bytes,
            });
            list.sort_by_key(|c| c.conversion);
        }
    }
}

/// How a transformed copy came to be, in words: `converted F32→F16`, or `repacked by
/// llama.cpp (Q4_0 → q4_0_8x8)`.
pub fn words(c: Conversion) -> String {
    match c {
        Conversion::Repack(l) => format!(
            "repacked by llama.cpp ({} → {})",
            l.spec().source_type,
            l.spec().name
        ),
        Conversion::Amx(l) => l.describe(),
        other => format!("converted {}", other.name()),
    }
}

/// The conversion that holds the most memory of `list`.
pub fn dominant(list: &[Converted]) -> Option<Conversion> {
    list.iter()
        .max_by_key(|c| (c.memory_bytes, std::cmp::Reverse(c.conversion)))
        .map(|c| c.conversion)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conversions_add_up_one_entry_each() {
        let mut l = Vec::new();
        add(&mut l, Conversion::F32ToF16, 8, 4);
        add(&mut l, Conversion::F16ToF32, 2, 4);
        add(&mut l, Conversion::F32ToF16, 8, 4);
        assert_eq!(l.len(), 2);
        assert_eq!(l[1].conversion, Conversion::F32ToF16);
        assert_eq!((l[1].file_bytes, l[1].memory_bytes), (16, 8));
        assert_eq!(dominant(&l), Some(Conversion::F32ToF16));
        assert_eq!(dominant(&[]), None);
        assert_eq!(words(Conversion::F32ToF16), "converted F32→F16");
        let r = Conversion::Repack(twofold_formats::repack::Layout::Q4_K_8x8);
        assert_eq!(words(r), "repacked by llama.cpp (Q4_K → q4_K_8x8)");
    }
}
