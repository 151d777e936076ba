//! Model containers: safetensors, GGUF, NumPy, PyTorch zip; anything else is opaque.
//!
//! Parsers are pure functions over bytes or a reader, never panic on any input, and bound
//! their allocations by the file size whatever a header claims.

mod types;

pub use types::{Container, Dtype, Format, Tensor};

/// Placeholder until the format parsers land: every file is opaque.
pub fn open(path: &std::path::Path) -> std::io::Result<Container> {
    let size = std::fs::metadata(path)?.len();
    Ok(Container {
        format: Format::Opaque,
        file_size: size,
        data_offset: None,
        alignment: None,
        tensors: vec![Tensor {
            name: "file".into(),
            dtype: Dtype::U8,
            shape: vec![size],
            offset: 0,
            len: size,
        }],
    })
}
