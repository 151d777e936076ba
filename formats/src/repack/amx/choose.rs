//! Which weights ggml's AMX buffer takes, and how a layout is written in reports.

use super::{AmxLayout, TILE_ROWS};
use crate::repack::{CpuFeatures, WeightUse};

/// What ggml's AMX buffer does with a weight it takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AmxChoice {
    /// Packed into this layout ([`pack`]).
    Packed(AmxLayout),
    /// Copied unchanged (`F16`, which has an AVX-512 kernel there): identical bytes.
    Copied,
}

/// Whether ggml's `AMX` buffer takes a weight of `tensor_type` with `ne0` columns and `ne1`
/// rows that llama.cpp uses as `use_`, on a build and host with `cpu`; `None` where it does
/// not (then `CPU_REPACK`, listed after it, may: [`super::choose`]).
///
/// `supports_op` of `amx.cpp`: a `MUL_MAT` weight (llama.cpp's `weight_buft_supported` asks
/// with a 2-D F32 input), `ne1` (the op's `ne[0]`) a multiple of 32, `ne0` a multiple of 32
/// (`Q4_0`, `Q4_1`, `Q8_0`), 256 (`Q4_K`, `Q5_K`, `Q6_K`, `IQ4_XS`) or 16 (`F16`).
/// `MUL_MAT_ID` experts are never taken.
pub fn choose(
    tensor_type: &str,
    ne0: u64,
    ne1: u64,
    use_: WeightUse,
    cpu: &CpuFeatures,
) -> Option<AmxChoice> {
    if !cpu.amx || !matches!(use_, WeightUse::MulMat | WeightUse::TiedOutput) {
        return None;
    }
    if ne1 % (2 * TILE_ROWS as u64) != 0 {
        return None;
    }
    let (choice, alignment) = match tensor_type {
        "F16" => (AmxChoice::Copied, 16),
        t => {
            let l = AmxLayout::from_source_type(t)?;
            (AmxChoice::Packed(l), l.spec().block_elements as u64)
        }
    };
    (ne0 % alignment == 0).then_some(choice)
}

/// A layout is written by its name (`"amx_q4_1"`).
impl serde::Serialize for AmxLayout {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.spec().name)
    }
}

impl<'de> serde::Deserialize<'de> for AmxLayout {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<AmxLayout, D::Error> {
        let name = String::deserialize(d)?;
        AmxLayout::from_name(&name)
            .ok_or_else(|| serde::de::Error::custom(format!("unknown AMX layout '{name}'")))
    }
}
