//! Integration tests with host-wide effects (cgroups and the OOM killer, eviction, huge
//! sparse files, full disks, kill storms, the demo): a binary of their own, so that they
//! never run beside the exact counts in `tests/exact`.
//!
//! Each test takes its module's [`common::group`] guard: tests of one file run beside each
//! other, never beside another file's.

#[path = "../common/mod.rs"]
mod common;

mod bounded;
mod campaign;
mod cli;
mod hardening;
mod image;
mod leftovers;
mod units;
