//! twofold's data model: raw [`sample`] types (values exactly as the kernel reported
//! them) and the [`model`] built from them (footprints, representation counts, findings,
//! the reports of `dupes`, `residency`, `inspect`, `probe` and `trace`).
//!
//! Pure: no I/O, no clock, no system calls. It may import serde, `twofold-formats` (the
//! parsers' tensor-table types) and `twofold-probe-types` (the GPU probes' report types),
//! and nothing that reads the machine: not libc, nix, procfs, aya, NVML, ratatui, nor the
//! main `twofold` crate (whose `collect`, `dupes` and `engine` fill these types in). The
//! main crate re-exports both modules at their old paths (`twofold::sample`,
//! `twofold::model`).

pub mod model;
pub mod sample;
pub mod units;
