//! Types shared by every container parser: the tensor table.

use serde::{Deserialize, Serialize};

/// Element type of a tensor, as the container names it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Dtype {
    F64,
    F32,
    F16,
    BF16,
    F8E4M3,
    F8E5M2,
    I64,
    I32,
    I16,
    I8,
    U64,
    U32,
    U16,
    U8,
    Bool,
    /// A GGML block-quantised type (`Q4_K`, `Q8_0`, `IQ2_XXS`, ...), by its GGUF name.
    Quant(String),
    /// Anything else, by the container's own name.
    Other(String),
}

impl Dtype {
    /// Bits per element for plain (non-block) types.
    pub fn bits(&self) -> Option<u32> {
        Some(match self {
            Dtype::F64 | Dtype::I64 | Dtype::U64 => 64,
            Dtype::F32 | Dtype::I32 | Dtype::U32 => 32,
            Dtype::F16 | Dtype::BF16 | Dtype::I16 | Dtype::U16 => 16,
            Dtype::F8E4M3 | Dtype::F8E5M2 | Dtype::I8 | Dtype::U8 | Dtype::Bool => 8,
            Dtype::Quant(_) | Dtype::Other(_) => return None,
        })
    }

    pub fn name(&self) -> String {
        match self {
            Dtype::Quant(s) | Dtype::Other(s) => s.clone(),
            other => format!("{other:?}"),
        }
    }
}

/// One tensor's bytes in the file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Tensor {
    pub name: String,
    pub dtype: Dtype,
    pub shape: Vec<u64>,
    /// Absolute byte offset of the first byte in the file.
    pub offset: u64,
    /// Length in bytes.
    pub len: u64,
}

/// Container format, with its version where it has one.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Format {
    Safetensors,
    Gguf {
        version: u32,
    },
    Npy {
        major: u8,
        minor: u8,
    },
    Npz,
    Torch,
    /// ONNX: a protobuf `ModelProto` whose graph initializers are the tensors.
    Onnx,
    /// Unknown format: the whole file is one region.
    Opaque,
}

/// A parsed container: its tensor table.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Container {
    pub format: Format,
    pub file_size: u64,
    /// Byte offset where tensor data begins (end of headers), where the format has one.
    pub data_offset: Option<u64>,
    /// Alignment the format promises for tensor data (GGUF `general.alignment`, 32 by
    /// default), where it has one.
    pub alignment: Option<u64>,
    /// Tensors sorted by offset.
    pub tensors: Vec<Tensor>,
    /// Tensors whose bytes live in another file (ONNX external data), in file order.
    /// Empty for every other format.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub external: Vec<ExternalTensor>,
    /// Tensors the container holds in a form that is no contiguous byte range equal to
    /// their in-memory values (ONNX `int64_data` varints, `string_data`...), in file
    /// order. They are not in `tensors`. Empty for every other format.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unmapped: Vec<UnmappedTensor>,
}

/// A tensor whose bytes lie in another file (ONNX `data_location: EXTERNAL`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExternalTensor {
    pub name: String,
    pub dtype: Dtype,
    pub shape: Vec<u64>,
    /// The data file as the model names it: a path relative to the model's directory,
    /// not resolved or checked by the parser.
    pub location: String,
    /// Absolute byte offset in the data file.
    pub offset: u64,
    /// Length in bytes.
    pub len: u64,
}

/// A tensor stored in a way that maps to no byte range of the file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UnmappedTensor {
    pub name: String,
    pub dtype: Dtype,
    pub shape: Vec<u64>,
    /// How it is stored, e.g. `int64_data (varints)`.
    pub storage: String,
}
