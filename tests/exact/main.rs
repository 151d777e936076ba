//! Exact-count integration tests: child processes whose footprint the test created, counted
//! against /proc, pagemap and peer tools. They run in this binary, never beside the tests
//! in `tests/host` and `tests/trace` that disturb the whole host (cargo runs test binaries one at a time).
//!
//! Each test takes its module's [`common::group`] guard: tests of one file run beside each
//! other, as they did when each file was a binary of its own, never beside another file's.

#[path = "../common/mod.rs"]
mod common;
#[path = "../writers/mod.rs"]
mod writers;

mod convert;
mod dupes;
mod engine_live;
mod fincore;
mod fuse;
mod gate;
mod held;
mod holders;
mod live;
mod llama;
mod moving;
mod overlay;
mod page_state;
mod partial_copy;
mod pidscan;
mod places;
mod readonly;
mod record;
mod repack;
mod runtimes;
mod serve;
mod shared_tensors;
mod stops;
mod tasks;
mod top;
mod truth;
mod twins;
mod unexplained;
mod untouched;
