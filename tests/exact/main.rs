//! Exact-count integration tests: child processes whose footprint the test created, counted
//! against /proc, pagemap and peer tools. They run in this binary, never beside the tests
//! in `tests/host` and `tests/trace` that disturb the whole host (cargo runs test binaries one at a time).

#[path = "../common/mod.rs"]
mod common;

mod dupes;
mod holders;
mod live;
mod readonly;
mod record;
mod runtimes;
mod serve;
mod top;
mod truth;
