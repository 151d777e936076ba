//! How a copy relates to the file's bytes (identical, or converted to another dtype:
//! `twofold_formats::convert`), which layouts an index holds, and why a tensor cannot be
//! searched for. The index itself is [`super::grid`].

use crate::container::convert::Conversion;
use crate::container::repack::amx::{self, AmxChoice};
use crate::container::repack::{layouts_for, weight_use, CpuFeatures};
use crate::container::{Dtype, Format, Tensor};
pub use crate::model::dupes::{CopyKind, Unsearchable};

/// The in-memory form of a [`CopyKind`] (the kind itself is the model's, the conversion
/// the formats crate's).
pub trait Convert {
    /// Converts source bytes (a whole number of elements) into their in-memory form.
    fn convert(self, src: &[u8], out: &mut Vec<u8>);
}

impl Convert for CopyKind {
    /// For a repack `src` is whole groups of rows (a trailing part is ignored).
    fn convert(self, src: &[u8], out: &mut Vec<u8>) {
        match (self, self.conversion()) {
            (_, None) => {
                out.clear();
                out.extend_from_slice(src);
            }
            (
                CopyKind::Repacked { row_bytes, .. } | CopyKind::AmxPacked { row_bytes, .. },
                Some(c),
            ) if row_bytes > 0 => {
                out.clear();
                let (g, _) = self.granule();
                let mut group = Vec::new();
                for src in src.chunks_exact(g as usize) {
                    c.convert(src, &mut group);
                    out.extend_from_slice(&group);
                }
            }
            (_, Some(c)) => c.convert(src, out),
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
    /// The dtype conversions of [`Layouts::Converted`] without llama.cpp's CPU repacks:
    /// what a runtime may upload to a device (`.to("cuda", torch.bfloat16)`).
    Dtypes,
}

/// What decides the layouts a runtime may give a file's tensors besides their dtype.
#[derive(Debug, Clone, Copy)]
pub struct FileContext {
    /// A GGUF file (llama.cpp's repacks apply).
    pub gguf: bool,
    /// It has an `output.weight` (else `token_embd` is loaded a second time as the tied
    /// output, and repacked).
    pub has_output_weight: bool,
    /// The features of the llama.cpp build whose repack layouts are looked for: a build
    /// for this host's CPU ([`host_features`]).
    pub cpu: CpuFeatures,
}

impl FileContext {
    pub fn of(format: &Format, tensors: &[Tensor]) -> FileContext {
        FileContext {
            gguf: matches!(format, Format::Gguf { .. }),
            has_output_weight: tensors.iter().any(|t| t.name == "output.weight"),
            cpu: host_features(),
        }
    }
}

/// The CPU features of the llama.cpp build whose layouts are looked for: the ggml CPU
/// variant named by `TWOFOLD_LLAMA_CPU` (`haswell`, `sapphirerapids`, `armv8.6_1`...: the
/// `libggml-cpu-VARIANT.so` a runtime loads, or what a build was compiled for), else a build
/// for this host ([`detected_features`]).
pub fn host_features() -> CpuFeatures {
    std::env::var("TWOFOLD_LLAMA_CPU")
        .ok()
        .and_then(|v| CpuFeatures::from_variant(v.trim(), 0))
        .unwrap_or_else(detected_features)
}

/// Whether the kernel lets processes use AMX tiles (`ARCH_GET_XCOMP_SUPP` has
/// `XFEATURE_XTILEDATA`), which ggml's AMX buffer needs: without it ggml says "AMX is not
/// ready to be used!" and lists no AMX buffer.
#[cfg(target_arch = "x86_64")]
fn amx_granted() -> bool {
    const ARCH_GET_XCOMP_SUPP: libc::c_long = 0x1021;
    const XFEATURE_XTILEDATA: u32 = 18;
    let mut bits: u64 = 0;
    // SAFETY: arch_prctl writes one u64 through the pointer, which is ours and live.
    let rc = unsafe { libc::syscall(libc::SYS_arch_prctl, ARCH_GET_XCOMP_SUPP, &mut bits) };
    rc == 0 && bits & (1 << XFEATURE_XTILEDATA) != 0
}

/// The CPU features a llama.cpp built for this host has (x86: AVX2, AVX-512F, and AMX where
/// the kernel grants it; ARM: dot product and i8mm; the SVE length is not read, so
/// SVE-only choices are not made).
pub fn detected_features() -> CpuFeatures {
    #[cfg(target_arch = "x86_64")]
    {
        CpuFeatures {
            avx2: std::arch::is_x86_feature_detected!("avx2"),
            avx512: std::arch::is_x86_feature_detected!("avx512f"),
            amx: amx_granted(),
            ..CpuFeatures::default()
        }
    }
    #[cfg(target_arch = "aarch64")]
    {
        CpuFeatures {
            neon: true,
            dotprod: std::arch::is_aarch64_feature_detected!("dotprod"),
            i8mm: std::arch::is_aarch64_feature_detected!("i8mm"),
            ..CpuFeatures::default()
        }
    }
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    {
        CpuFeatures::default()
    }
}

/// The repacked layout llama.cpp's CPU backend gives tensor `t` of a GGUF file, if any
/// (a matrix weight of a type and row count it repacks on a build for `ctx.cpu`).
pub fn repacked_kind(t: &Tensor, ctx: &FileContext) -> Option<CopyKind> {
    let Dtype::Quant(ty) = &t.dtype else {
        return None;
    };
    if !ctx.gguf
        || t.shape.len() < 2
        || !weight_use(&t.name, t.shape.len(), ctx.has_output_weight).may_repack()
    {
        return None;
    }
    let (cols, rows) = (t.shape[0], t.shape[1]);
    let all_rows: u64 = t.shape[1..].iter().product();
    let row_bytes = u32::try_from(t.len.checked_div(all_rows)?).ok()?;
    if row_bytes == 0 || u64::from(row_bytes) * all_rows != t.len {
        return None;
    }
    // ggml lists the AMX buffer before CPU_REPACK: a weight it takes is not repacked.
    let use_ = weight_use(&t.name, t.shape.len(), ctx.has_output_weight);
    match amx::choose(ty, cols, rows, use_, &ctx.cpu) {
        Some(AmxChoice::Packed(layout)) => return Some(CopyKind::AmxPacked { layout, row_bytes }),
        Some(AmxChoice::Copied) => return None,
        None => {}
    }
    let layout = *layouts_for(ty, rows, cols, &ctx.cpu).first()?;
    Some(CopyKind::Repacked { layout, row_bytes })
}

impl Layouts {
    /// The kinds of copy indexed for tensor `t` of a file: identical bytes first, then the
    /// dtype conversions [`Layouts::kinds`] gives, then (with [`Layouts::Converted`]) the
    /// layout llama.cpp repacks it into ([`repacked_kind`]).
    pub fn kinds_of(self, t: &Tensor, ctx: &FileContext) -> Vec<CopyKind> {
        let mut v = self.kinds(&t.dtype);
        if self == Layouts::Converted {
            v.extend(repacked_kind(t, ctx));
        }
        v
    }

    /// The kinds of copy indexed for a tensor of `dtype`, [`CopyKind::Identical`] first.
    pub fn kinds(self, dtype: &Dtype) -> Vec<CopyKind> {
        let mut v = vec![CopyKind::Identical];
        let widening = |c: &Conversion| c.to_dtype() == Dtype::F32;
        match self {
            Layouts::Identical => {}
            Layouts::Widened => {
                v.extend(Conversion::of(dtype).filter(widening).map(CopyKind::from))
            }
            Layouts::Converted | Layouts::Dtypes => {
                v.extend(Conversion::of(dtype).map(CopyKind::from))
            }
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
    use crate::container::repack::amx::AmxLayout;
    use crate::container::repack::Layout;

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
    fn repacked_kinds_follow_llama_cpp_choice() {
        let t = |name: &str, ty: &str, shape: &[u64], len: u64| Tensor {
            name: name.into(),
            dtype: Dtype::Quant(ty.into()),
            shape: shape.to_vec(),
            offset: 0,
            len,
        };
        let ctx = FileContext {
            gguf: true,
            has_output_weight: true,
            cpu: CpuFeatures::X86_AVX2,
        };
        let up = t(
            "blk.0.ffn_up.weight",
            "Q4_0",
            &[4096, 64],
            4096 / 32 * 18 * 64,
        );
        assert_eq!(
            repacked_kind(&up, &ctx),
            Some(CopyKind::Repacked {
                layout: Layout::Q4_0_8x8,
                row_bytes: 2304
            })
        );
        // Looked up by token, never repacked; tied, it is (its second copy is the output).
        let embd = t(
            "token_embd.weight",
            "Q4_0",
            &[4096, 64],
            4096 / 32 * 18 * 64,
        );
        assert_eq!(repacked_kind(&embd, &ctx), None);
        let tied = FileContext {
            has_output_weight: false,
            ..ctx
        };
        assert!(repacked_kind(&embd, &tied).is_some());
        // Rows not a multiple of 8, a type the build does not repack, a safetensors file.
        let odd = t(
            "blk.0.ffn_up.weight",
            "Q4_0",
            &[4096, 60],
            4096 / 32 * 18 * 60,
        );
        assert_eq!(repacked_kind(&odd, &ctx), None);
        let q8 = t(
            "blk.0.ffn_up.weight",
            "Q8_0",
            &[4096, 64],
            4096 / 32 * 34 * 64,
        );
        assert_eq!(repacked_kind(&q8, &ctx), None);
        let st = FileContext { gguf: false, ..ctx };
        assert_eq!(repacked_kind(&up, &st), None);
        // A build with the AMX buffer packs what it takes (rows of 32) and leaves the rest
        // to CPU_REPACK.
        let amx_cpu = FileContext {
            cpu: CpuFeatures::from_variant("sapphirerapids", 0).unwrap(),
            ..ctx
        };
        assert!(matches!(
            repacked_kind(&up, &amx_cpu),
            Some(CopyKind::AmxPacked {
                layout: AmxLayout::Q4_0,
                ..
            })
        ));
        let rows8 = t(
            "blk.0.ffn_up.weight",
            "Q4_0",
            &[4096, 8],
            4096 / 32 * 18 * 8,
        );
        assert!(matches!(
            repacked_kind(&rows8, &amx_cpu),
            Some(CopyKind::Repacked { .. })
        ));
        // Only Converted indexes it, after the identical bytes.
        assert_eq!(
            Layouts::Identical.kinds_of(&up, &ctx),
            [CopyKind::Identical]
        );
        assert_eq!(Layouts::Converted.kinds_of(&up, &ctx).len(), 2);
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
