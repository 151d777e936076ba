//! Model containers: safetensors, GGUF, NumPy, PyTorch zip; anything else is opaque.
//!
//! Parsers are pure functions over bytes or a reader, never panic on any input, and bound
//! their allocations by the file size whatever a header claims.

mod types;

pub use types::{Container, Dtype, Format, Tensor};
