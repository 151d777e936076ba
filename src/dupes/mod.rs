//! Byte-level proof that a process holds a private (or widened) copy of a model file.
//!
//! [`index`] fingerprints the file's tensors; [`search`] samples the target's anonymous
//! memory once per page, looks the samples up, and confirms each candidate by comparing
//! the whole tensor with the file. Only a confirmed match is reported as a copy.

pub mod filebytes;
pub mod grid;
pub mod index;
pub mod physical;
pub mod prove;
pub mod sweep;
