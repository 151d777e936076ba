//! GPU adoption probes for twofold.
//!
//! Can a GPU read a model file's page-cache pages in place, and is that the fastest way
//! to reach them? This crate answers with measurements behind one [`backend::Backend`]
//! trait:
//!
//! - [`vulkan`]: `VK_EXT_external_memory_host` import of a read-only shared file mapping
//!   and a WGSL compute kernel (naga → SPIR-V at run time);
//! - [`cuda`]: `cuMemHostRegister` of the mapping (default and read-only flags) and a
//!   CUDA C kernel compiled by NVRTC at run time;
//! - [`backend::Fake`]: the same interface computed on the CPU, for tests.
//!
//! Drivers are opened at run time (`libvulkan.so.1`, `libcuda.so`, `libnvrtc.so`):
//! nothing links them at build time, and their absence is "not available".
//!
//! The three endpoints measured over a working set are those of the seed paper's §8:
//! map (read the imported pages in place), resident (one-time copy into device memory,
//! then the same kernel) and per-use copy (stage and read every pass). Every pass
//! computes a [`types::Checksum`] on the device that must equal the CPU's.

pub mod backend;
pub mod checksum;
pub mod cuda;
pub mod job;
pub mod mapping;
/// The report types, in a crate of their own (`twofold-probe-types`) so the model reads them
/// without the GPU stacks; re-exported here at their old path.
pub use twofold_probe_types as types;
pub mod vulkan;
